//! The connection to AWS Secrets Manager: the SDK client (the AWS SDK for Rust's
//! `aws-sdk-secretsmanager` over `aws-smithy-http-client` with rustls and ring, its credentials
//! from `aws-config`'s default chain), one wrapper per API operation keyplan uses, each bounded
//! by what is left of its KMS call's deadline ([`crate::kms::deadline::remaining`]), and the
//! classification of failures ([`CallError`]).
//!
//! API reference: <https://docs.aws.amazon.com/secretsmanager/latest/apireference/>. The SDK's
//! own retries are off: keyplan retries idempotent calls itself ([`crate::kms::with_retries`]).

use aws_sdk_secretsmanager as sm;
use sm::error::{ProvideErrorMetadata, SdkError};
use zeroize::Zeroizing;

/// The code of an error answer that names none (a bare HTTP status).
const UNKNOWN: &str = "UnknownError";

/// A failed request, as keyplan tells failures apart.
#[derive(Debug)]
pub(super) enum CallError {
    /// Secrets Manager answered with an error: its code (`ResourceNotFoundException`,
    /// `InvalidParameterException`, `AccessDeniedException`, ...), message and HTTP status.
    Service {
        /// The error code of the answer (`__type` / `x-amzn-ErrorType`).
        code: String,
        /// Its message (names secrets and versions, never values).
        message: String,
        /// HTTP status, 0 when unknown.
        status: u16,
    },
    /// No answer: connection refused or reset, DNS, TLS, a malformed answer.
    Transport(String),
    /// No request was sent: the SDK's credential chain found no usable credentials (none
    /// configured, an unreadable profile, a web identity token refused by STS).
    Credentials(String),
    /// No answer within the call's deadline.
    Timeout,
    /// Secret `secret` is scheduled for deletion (`DeleteSecret` with a recovery window):
    /// `DescribeSecret` names the date (Unix seconds) it goes, or a request on it was refused
    /// with `InvalidRequestException` "marked for deletion" (`None`: date not known).
    ScheduledForDeletion {
        /// The secret's name.
        secret: String,
        /// When Secrets Manager deletes it for good, Unix seconds, when known.
        at: Option<u64>,
    },
}

impl CallError {
    /// Whether this is the service error `code`.
    pub(super) fn is(&self, code: &str) -> bool {
        matches!(self, CallError::Service { code: c, .. } if c == code)
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Service {
                code,
                message,
                status,
            } if code == UNKNOWN && message.is_empty() => write!(f, "HTTP {status}"),
            CallError::Service {
                code,
                message,
                status,
            } => write!(f, "{code} (HTTP {status}): {message}"),
            CallError::Transport(t) => write!(f, "{t}"),
            CallError::Credentials(t) => write!(f, "no usable AWS credentials: {t}"),
            CallError::Timeout => {
                write!(f, "no answer within {}", crate::kms::deadline::limit_text())
            }
            CallError::ScheduledForDeletion { secret, at } => {
                write!(f, "secret {secret:?} is scheduled for deletion")?;
                match at {
                    Some(t) => write!(f, " on {}", crate::clock::rfc3339(*t)),
                    None => Ok(()),
                }
            }
        }
    }
}

fn classify<E, R>(e: SdkError<E, R>) -> CallError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + HasStatus,
{
    match &e {
        SdkError::ServiceError(se) => {
            let err = se.err();
            CallError::Service {
                code: err.code().unwrap_or(UNKNOWN).to_string(),
                message: crate::secret::redact::redact(err.message().unwrap_or_default())
                    .into_owned(),
                status: se.raw().status_code(),
            }
        }
        SdkError::TimeoutError(_) => CallError::Timeout,
        _ if from_credentials(std::error::Error::source(&e)) => {
            CallError::Credentials(crate::kube_client::chain(&e))
        }
        _ => CallError::Transport(crate::kube_client::chain(&e)),
    }
}

/// `e` (an `InvalidRequestException` on secret `id`), or [`CallError::ScheduledForDeletion`]
/// when `DescribeSecret` shows that the secret is scheduled for deletion: Secrets Manager
/// refuses most requests on such a secret with `InvalidRequestException` (API reference,
/// `GetSecretValue` errors), whose message is not meant for matching.
async fn deletion(c: &sm::Client, id: &str, e: CallError) -> CallError {
    match send(c.describe_secret().secret_id(id).send()).await {
        Ok(d) => match d.deleted_date() {
            Some(at) => CallError::ScheduledForDeletion {
                secret: id.to_string(),
                at: u64::try_from(at.secs()).ok(),
            },
            None => e,
        },
        Err(_) => e,
    }
}

/// Whether the SDK failed before sending because its credential chain failed: a
/// `CredentialsError` among the error's causes (`source`: the first) (the SDK reports a failed identity
/// resolution as a dispatch failure: aws-smithy-runtime's orchestrator).
fn from_credentials(source: Option<&(dyn std::error::Error + 'static)>) -> bool {
    use aws_credential_types::provider::error::CredentialsError;
    let mut cur = source;
    while let Some(err) = cur {
        if err.downcast_ref::<CredentialsError>().is_some() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The HTTP status of a raw answer.
pub(super) trait HasStatus {
    /// Its status code.
    fn status_code(&self) -> u16;
}

impl HasStatus for sm::config::http::HttpResponse {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}

/// Sends one request future, bounded by what is left of the call's deadline.
async fn send<T, E, R>(
    fut: impl std::future::Future<Output = Result<T, SdkError<E, R>>>,
) -> Result<T, CallError>
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + HasStatus,
{
    match tokio::time::timeout(crate::kms::deadline::remaining(), fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(classify(e)),
        Err(_) => Err(CallError::Timeout),
    }
}

/// Builds the client for `region` (and `endpoint` when given: a VPC endpoint or a test
/// server), with the SDK's default credential chain and without the SDK's retries. Reads the
/// environment and the shared config files; contacts nothing.
pub(super) async fn build(
    region: &str,
    endpoint: Option<&str>,
) -> (sm::Client, Option<sm::config::SharedCredentialsProvider>) {
    use aws_smithy_http_client::tls;
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(region.to_string()))
        .http_client(http)
        .retry_config(aws_config::retry::RetryConfig::disabled())
        .load()
        .await;
    let mut b = sm::config::Builder::from(&conf);
    if let Some(e) = endpoint {
        b = b.endpoint_url(e);
    }
    (
        sm::Client::from_conf(b.build()),
        conf.credentials_provider(),
    )
}

/// One version as `ListSecretVersionIds` lists it.
#[derive(Debug, Clone)]
pub(super) struct Listed {
    /// The version id (keyplan's versions: their `ClientRequestToken`).
    pub vid: String,
    /// Its staging labels.
    pub labels: Vec<String>,
    /// Creation time, Unix seconds (0 when not given).
    pub created_at: u64,
}

/// The versions of secret `id` that carry a staging label (deprecated ones are left out);
/// `None` when the secret does not exist (or is being deleted without recovery window).
/// [`CallError::ScheduledForDeletion`] when it is scheduled for deletion. `DescribeSecret` first, for existence: moto answers
/// `ListSecretVersionIds` of a missing secret with HTTP 500 instead of
/// `ResourceNotFoundException`.
pub(super) async fn list_versions(
    c: &sm::Client,
    id: &str,
) -> Result<Option<Vec<Listed>>, CallError> {
    match send(c.describe_secret().secret_id(id).send()).await {
        Ok(d) => {
            if let Some(at) = d.deleted_date() {
                let at = u64::try_from(at.secs()).unwrap_or(0);
                // A date within the hour is a deletion without recovery window
                // (keyplan's own, after a migration) still in progress: the secret is gone.
                // A recovery window is at least 7 days (DeleteSecret).
                if at <= crate::clock::now_unix() + 3600 {
                    return Ok(None);
                }
                return Err(CallError::ScheduledForDeletion {
                    secret: id.to_string(),
                    at: Some(at),
                });
            }
        }
        Err(e) if e.is("ResourceNotFoundException") => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let r = send(
            c.list_secret_version_ids()
                .secret_id(id)
                .include_deprecated(false)
                .max_results(100)
                .set_next_token(token.clone())
                .send(),
        )
        .await;
        let page = match r {
            Ok(p) => p,
            Err(e) if e.is("ResourceNotFoundException") => return Ok(None),
            Err(e) => return Err(e),
        };
        for v in page.versions() {
            let Some(vid) = v.version_id() else { continue };
            if v.version_stages().is_empty() {
                continue;
            }
            out.push(Listed {
                vid: vid.to_string(),
                labels: v.version_stages().to_vec(),
                created_at: v
                    .created_date()
                    .map_or(0, |d| u64::try_from(d.secs()).unwrap_or(0)),
            });
        }
        // moto answers an empty `NextToken` on the last page; a token that does not change
        // would loop forever.
        let next = page
            .next_token()
            .filter(|t| !t.is_empty())
            .map(str::to_string);
        if next.is_none() || next == token {
            return Ok(Some(out));
        }
        token = next;
    }
}

/// The value of version `vid` of secret `id` (its `SecretString`, or `SecretBinary`), or of
/// the version labelled `AWSCURRENT` when `vid` is `None`, with that version's id; `None`
/// when the secret or the version does not exist.
pub(super) async fn get_value(
    c: &sm::Client,
    id: &str,
    vid: Option<&str>,
) -> Result<Option<(String, Zeroizing<Vec<u8>>)>, CallError> {
    // The label named explicitly: moto answers a request without one from the version that
    // was current when the secret was created, whatever `AWSCURRENT` was moved to since.
    let req = c.get_secret_value().secret_id(id);
    let req = match vid {
        Some(v) => req.version_id(v),
        None => req.version_stage("AWSCURRENT"),
    };
    let r = send(req.send()).await;
    let out = match r {
        Ok(o) => o,
        Err(e) if e.is("ResourceNotFoundException") => return Ok(None),
        Err(e) if e.is("InvalidRequestException") => return Err(deletion(c, id, e).await),
        Err(e) => return Err(e),
    };
    let bytes = match (out.secret_string(), out.secret_binary()) {
        (Some(s), _) => Zeroizing::new(s.as_bytes().to_vec()),
        (None, Some(b)) => Zeroizing::new(b.as_ref().to_vec()),
        (None, None) => Zeroizing::new(Vec::new()),
    };
    Ok(Some((
        out.version_id().unwrap_or_default().to_string(),
        bytes,
    )))
}

/// `CreateSecret` of `id` with no value (a secret without versions).
pub(super) async fn create_empty(c: &sm::Client, id: &str, tag: &str) -> Result<(), CallError> {
    send(
        c.create_secret()
            .name(id)
            .description(format!("keyplan key {tag} (https://keyplan.io)"))
            .send(),
    )
    .await?;
    after_write()
}

/// `CreateSecret` of `id` with the text `value` as its first version (`AWSCURRENT`), version
/// id `token`.
pub(super) async fn create_with(
    c: &sm::Client,
    id: &str,
    value: &str,
    token: &str,
) -> Result<(), CallError> {
    send(
        c.create_secret()
            .name(id)
            .secret_string(value)
            .client_request_token(token)
            .send(),
    )
    .await?;
    after_write()
}

/// `PutSecretValue`: a new version of `id` holding `value`, version id `token` (a retry with
/// the same token and value is a no-op), with the staging labels `labels` (moved from any
/// version that carries them; the first version of a secret also gets `AWSCURRENT`).
pub(super) async fn put_value(
    c: &sm::Client,
    id: &str,
    value: &[u8],
    token: &str,
    labels: &[&str],
) -> Result<(), CallError> {
    let text = std::str::from_utf8(value).map_err(|_| {
        CallError::Transport("the value is not UTF-8 text (keyplan writes SecretString)".into())
    })?;
    let mut req = c
        .put_secret_value()
        .secret_id(id)
        .secret_string(text)
        .client_request_token(token);
    for l in labels {
        req = req.version_stages(*l);
    }
    send(req.send()).await?;
    after_write()
}

/// `UpdateSecretVersionStage`: moves `label` to version `to` (when given) and off version
/// `from` (when given). Secrets Manager refuses the move, with `InvalidParameterException`,
/// when `label` is attached to a version other than `from` (the compare-and-swap keyplan's
/// commits rely on), and refuses to move a label that is attached somewhere without `from`.
pub(super) async fn move_label(
    c: &sm::Client,
    id: &str,
    label: &str,
    to: Option<&str>,
    from: Option<&str>,
) -> Result<(), CallError> {
    send(
        c.update_secret_version_stage()
            .secret_id(id)
            .version_stage(label)
            .set_move_to_version_id(to.map(str::to_string))
            .set_remove_from_version_id(from.map(str::to_string))
            .send(),
    )
    .await?;
    after_write()
}

/// `DeleteSecret` of `id` without a recovery window; a secret that does not exist is fine.
pub(super) async fn delete(c: &sm::Client, id: &str) -> Result<(), CallError> {
    match send(
        c.delete_secret()
            .secret_id(id)
            .force_delete_without_recovery(true)
            .send(),
    )
    .await
    {
        Ok(_) => after_write(),
        Err(e) if e.is("ResourceNotFoundException") => Ok(()),
        Err(e) => Err(e),
    }
}

/// Evaluates the `kms.after_write` injection point (crate::failpoint): a write request was
/// answered with success; an injected error is a [`CallError::Transport`].
fn after_write() -> Result<(), CallError> {
    crate::failpoint::check("kms.after_write").map_err(CallError::Transport)
}
