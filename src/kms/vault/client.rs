//! The `vault` provider's connection to the server: the [`VaultKms`] handle, the login of a
//! login method (once per process, on the first request; the methods are in `auth.rs`), the
//! requests on vaultrs's client with their wire types, and how failures map to [`KmsError`]s.
//! The layout keyplan keeps in KV is `layout.rs`; the provider's rules are `mod.rs`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::{Mutex, OnceLock, PoisonError};

use serde::Deserialize;
use serde_json::Value;
use tracing::instrument::WithSubscriber as _;
use vaultrs::api::kv2::requests::{ReadSecretRequest, SetSecretRequestOptions};
use vaultrs::api::kv2::responses::{ReadSecretMetadataResponse, ReadSecretResponse};
use vaultrs::client::VaultClient;
use vaultrs::error::ClientError;
use zeroize::Zeroizing;

use super::auth::Auth;
use crate::kms::{block_on, Kms, KmsError};

/// A Vault/OpenBao KV v2 key store (see the module documentation for the layout).
///
/// Safe to share between threads; every call is one or a few HTTP requests on the shared
/// runtime. `Debug` shows [`Kms::describe`] only (never the token).
pub struct VaultKms {
    pub(super) instance: String,
    pub(super) address: String,
    pub(super) mount: String,
    /// Where the token comes from.
    pub(super) auth: Auth,
    /// The client with its token: set at construction for a static token, after the login
    /// (on the first request) otherwise.
    pub(super) client: OnceLock<VaultClient>,
    /// Held during a login, so concurrent first requests log in once.
    pub(super) login: Mutex<Login>,
}

/// The login of a login method, before and after it is tried.
pub(super) struct Login {
    /// The client without a token the login is made with; it gets the token and becomes
    /// [`VaultKms::client`] once the login succeeds.
    pub(super) client: Option<VaultClient>,
    /// The error of a login that was refused (or could not read its files): the rest of the
    /// run gets the same error without asking again, as servers lock a role out after a few
    /// failed logins (OpenBao's user lockout: 5 by default).
    pub(super) refused: Option<KmsError>,
}

impl fmt::Debug for VaultKms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VaultKms({})", self.describe())
    }
}

/// How long revoking a login token at the end may take before keyplan gives up (it then
/// expires by its TTL).
const REVOKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for VaultKms {
    /// Revokes the token a login got (`auth/token/revoke-self`), so runs every minute (a
    /// `status` scrape) do not pile up live tokens until their TTL ends. Best effort, at most
    /// [`REVOKE_TIMEOUT`]; a failure is logged at `debug`. A static token is never revoked.
    fn drop(&mut self) {
        if !self.auth.is_login() {
            return;
        }
        let Some(client) = self.client.get() else {
            return;
        };
        // The timer is made inside the runtime (it needs its reactor).
        let revoke = async {
            tokio::time::timeout(REVOKE_TIMEOUT, vaultrs::token::revoke_self(client)).await
        }
        .with_subscriber(tracing::subscriber::NoSubscriber::default());
        match block_on(&self.describe(), revoke) {
            Ok(Ok(Ok(()))) => {
                tracing::debug!(kms = %self.instance, "revoked the login token")
            }
            other => tracing::debug!(
                kms = %self.instance,
                "could not revoke the login token (it expires by its TTL): {}",
                match other {
                    Ok(Ok(Err(e))) => error_chain(&e),
                    Ok(Err(_)) => "timed out".to_string(),
                    Err(e) => e.to_string(),
                    Ok(Ok(Ok(()))) => String::new(),
                }
            ),
        }
    }
}

/// Outcome of one request that may legitimately find nothing or lose a check-and-set race.
pub(super) enum Answer<T> {
    Ok(T),
    /// HTTP 404; `deleted` is the KV version when the server says the version exists but was
    /// deleted or destroyed (its answer then carries the version's metadata).
    NotFound {
        deleted: Option<u64>,
    },
    /// HTTP 400 "check-and-set parameter did not match the current version".
    CasMismatch,
}

/// A read of one KV path.
pub(super) enum Read {
    Found(ReadSecretResponse),
    Absent,
    /// The KV version exists but was deleted or destroyed.
    Deleted(u64),
}

/// `sys/internal/ui/mounts/<mount>`: how the CLI learns a mount's engine and KV version.
/// <https://developer.hashicorp.com/vault/api-docs/system/internal-ui-mounts>
pub(super) struct UiMount {
    pub(super) mount: String,
}

/// The answer of [`UiMount`]: the engine's type and options (`version` for KV).
#[derive(Deserialize)]
pub(super) struct UiMountResponse {
    #[serde(rename = "type", default)]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) options: Option<HashMap<String, String>>,
}

impl rustify::endpoint::Endpoint for UiMount {
    type Response = UiMountResponse;
    const REQUEST_BODY_TYPE: rustify::enums::RequestType = rustify::enums::RequestType::JSON;
    const RESPONSE_BODY_TYPE: rustify::enums::ResponseType = rustify::enums::ResponseType::JSON;
    fn path(&self) -> String {
        format!("sys/internal/ui/mounts/{}", self.mount)
    }
    fn method(&self) -> rustify::enums::RequestMethod {
        rustify::enums::RequestMethod::GET
    }
}

/// `POST sys/capabilities-self {"paths": [...]}`: the token's capabilities on each path.
/// <https://developer.hashicorp.com/vault/api-docs/system/capabilities-self>
pub(super) struct CapabilitiesSelf {
    pub(super) paths: Vec<String>,
}

impl rustify::endpoint::Endpoint for CapabilitiesSelf {
    type Response = HashMap<String, Value>;
    const REQUEST_BODY_TYPE: rustify::enums::RequestType = rustify::enums::RequestType::JSON;
    const RESPONSE_BODY_TYPE: rustify::enums::ResponseType = rustify::enums::ResponseType::JSON;
    fn path(&self) -> String {
        "sys/capabilities-self".to_string()
    }
    fn method(&self) -> rustify::enums::RequestMethod {
        rustify::enums::RequestMethod::POST
    }
    fn body(&self) -> Result<Option<Vec<u8>>, rustify::errors::ClientError> {
        serde_json::to_vec(&serde_json::json!({ "paths": self.paths }))
            .map(Some)
            .map_err(|e| rustify::errors::ClientError::DataParseError { source: e.into() })
    }
}

impl VaultKms {
    /// The client with its token, logging in first if this is the first request of a login
    /// method (once per process: concurrent callers wait for the one login).
    ///
    /// Errors: [`KmsError::Config`] naming the file or variable when a login value cannot be
    /// read; [`KmsError::Denied`] when the server refuses the login (what to check);
    /// [`KmsError::Unavailable`] when it cannot be reached.
    pub(super) fn client(&self) -> Result<&VaultClient, KmsError> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        let mut login = self.login.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        if let Some(e) = login.refused.as_ref() {
            return Err(e.same());
        }
        let Some(mut client) = login.client.take() else {
            return Err(self.unexpected("logging in (no client left to log in with)"));
        };
        match self.log_in(&client) {
            Ok(token) => {
                use vaultrs::client::Client as _;
                client.set_token(&token);
                Ok(self.client.get_or_init(|| client))
            }
            Err(e) => {
                if matches!(e, KmsError::Denied { .. } | KmsError::Config { .. }) {
                    login.refused = Some(e.same());
                }
                login.client = Some(client);
                Err(e)
            }
        }
    }

    /// One login with [`VaultKms::auth`] on `client` (which has no token yet); the token it
    /// gets.
    fn log_in(&self, client: &VaultClient) -> Result<Zeroizing<String>, KmsError> {
        let what = self.auth.login_what();
        tracing::debug!(kms = %self.instance, "vault request: {what}");
        let left = crate::kms::deadline::remaining();
        let login = self
            .auth
            .login(client)
            .with_subscriber(tracing::subscriber::NoSubscriber::default());
        let answer = block_on(&self.describe(), async move {
            tokio::time::timeout(left, login).await
        })?
        .map_err(|_| self.timed_out(&what))?
        .map_err(|detail| KmsError::Config {
            kms: self.describe(),
            detail: format!("{what}: {detail}. Nothing was changed"),
        })?;
        match answer {
            Ok(info) => {
                let token = Zeroizing::new(info.client_token);
                tracing::info!(
                    kms = %self.instance,
                    "logged in ({}): token valid for {} s{}",
                    what.trim_start_matches("logging in "),
                    info.lease_duration,
                    if info.renewable { ", renewable" } else { "" }
                );
                Ok(token)
            }
            Err(e) => Err(self.login_refused(&what, &e)),
        }
    }

    /// The error for a failed login request `what`: 400/401/403 is [`KmsError::Denied`] with
    /// what to check for the method; the rest as [`VaultKms::classify`].
    fn login_refused(&self, what: &str, e: &ClientError) -> KmsError {
        let (code, msg) = match e {
            ClientError::APIError { code, errors } => (
                *code,
                errors
                    .iter()
                    .map(|m| squash(m))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            ClientError::RestClientError {
                source: rustify::errors::ClientError::ServerResponseError { code, .. },
            } => (*code, String::new()),
            _ => (0, String::new()),
        };
        if matches!(code, 400 | 401 | 403) {
            let shown = if msg.is_empty() {
                String::new()
            } else {
                format!(": {msg}")
            };
            return KmsError::Denied {
                kms: self.describe(),
                detail: format!(
                    "{what}: the server refused the login (HTTP {code}{shown}); {}",
                    self.auth.refused_hint()
                ),
            };
        }
        match self.classify::<()>(what, e) {
            Err(err) => err,
            Ok(_) => self.unexpected(what),
        }
    }

    /// The error for request `what` that got no answer before the call's deadline
    /// ([`crate::kms::deadline`]).
    fn timed_out(&self, what: &str) -> KmsError {
        tracing::debug!(kms = %self.instance, "vault request timed out: {what}");
        KmsError::Timeout {
            kms: self.describe(),
            detail: format!(
                "{what}: no answer within {}",
                crate::kms::deadline::limit_text()
            ),
        }
    }

    /// `<mount>/data/<path>`, for messages.
    pub(super) fn data_path(&self, path: &str) -> String {
        format!("{}/data/{path}", self.mount)
    }

    /// Runs one vaultrs request on the shared runtime (client tracing silenced) and sorts its
    /// failure: not found and check-and-set mismatches come back as [`Answer`]s, the rest as
    /// [`KmsError`]s whose detail starts with `what`.
    pub(super) fn request<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<Answer<T>, KmsError> {
        tracing::debug!(kms = %self.instance, "vault request: {what}");
        let left = crate::kms::deadline::remaining();
        let fut = fut.with_subscriber(tracing::subscriber::NoSubscriber::default());
        let out = block_on(&self.describe(), async move {
            tokio::time::timeout(left, fut).await
        })?
        .map_err(|_| self.timed_out(what))?;
        match out {
            Ok(v) => Ok(Answer::Ok(v)),
            Err(e) => {
                let answer = self.classify(what, &e);
                if let Err(err) = &answer {
                    tracing::debug!(kms = %self.instance, "vault request failed: {err}");
                }
                answer
            }
        }
    }

    /// The error for HTTP status `code` (with the server's message `msg`, possibly empty) of
    /// request `what`: 401/403 [`KmsError::Denied`], 412/429/5xx [`KmsError::Unavailable`],
    /// anything else [`KmsError::Config`].
    fn http_error(&self, what: &str, code: u16, msg: &str) -> KmsError {
        let kms = self.describe();
        let shown = if msg.is_empty() {
            String::new()
        } else {
            format!(": {msg}")
        };
        match code {
            401 | 403 => KmsError::Denied {
                kms,
                detail: format!(
                    "{what}: HTTP {code}{shown} ({} is invalid or expired, or its policies do not allow this; see docs/kms/vault.md for the policy keyplan needs)",
                    self.auth.token_origin()
                ),
            },
            412 | 429 | 500..=599 => KmsError::Unavailable {
                kms,
                detail: format!("{what}: HTTP {code}{shown}"),
            },
            _ => KmsError::Config {
                kms,
                detail: format!(
                    "{what}: HTTP {code}{shown}; check that `mount` {:?} is a KV version 2 secrets engine and `address` is the server's root URL. Nothing was changed",
                    self.mount
                ),
            },
        }
    }

    /// Sorts a failed request (`what`: the operation, for messages): not found and
    /// check-and-set mismatches are [`Answer`]s, the rest [`KmsError`]s ([`VaultKms::http_error`]
    /// for HTTP status codes; transport failures are [`KmsError::Unavailable`]).
    fn classify<T>(&self, what: &str, e: &ClientError) -> Result<Answer<T>, KmsError> {
        let kms = self.describe();
        let http = |code: u16, msg: &str| -> Result<Answer<T>, KmsError> {
            Err(self.http_error(what, code, msg))
        };
        match e {
            ClientError::APIError { code, errors } => {
                let msg = errors
                    .iter()
                    .map(|m| squash(m))
                    .collect::<Vec<_>>()
                    .join("; ");
                if *code == 404 && errors.is_empty() {
                    Ok(Answer::NotFound { deleted: None })
                } else if *code == 400 && msg.contains("check-and-set parameter did not match") {
                    Ok(Answer::CasMismatch)
                } else {
                    http(*code, &msg)
                }
            }
            ClientError::RestClientError {
                source: rustify::errors::ClientError::ServerResponseError { code, content },
            } => {
                if *code == 404 {
                    // KV v2 answers 404 with the version's metadata for a deleted or destroyed
                    // version (and `data: null`); a missing secret is `{"errors":[]}` (the
                    // APIError arm above). A 404 with neither (an empty body, a web page) is
                    // not Vault's "not found": something else answers at `address` (a wrong
                    // port, a proxy or load balancer), and taking it for "no such key" would
                    // read as a KMS that lost its keys.
                    let body = content
                        .as_deref()
                        .and_then(|c| serde_json::from_str::<Value>(c).ok())
                        .filter(|v| v.get("data").is_some());
                    match body {
                        Some(v) => Ok(Answer::NotFound {
                            deleted: v.pointer("/data/metadata/version").and_then(Value::as_u64),
                        }),
                        None => Err(KmsError::Unavailable {
                            kms,
                            detail: format!(
                                "{what}: HTTP 404 without the answer Vault/OpenBao KV v2 gives for a missing secret; check that `address` points at Vault or OpenBao itself (not another server, proxy or load balancer). Nothing was changed"
                            ),
                        }),
                    }
                } else {
                    http(*code, "")
                }
            }
            ClientError::RestClientError {
                source:
                    rustify::errors::ClientError::ResponseParseError { .. }
                    | rustify::errors::ClientError::ResponseConversionError { .. },
            }
            | ClientError::JsonParseError { .. }
            | ClientError::ResponseEmptyError
            | ClientError::ResponseDataEmptyError => Err(KmsError::Unavailable {
                kms,
                // The parse error's text may quote the answer, so it is not shown.
                detail: format!(
                    "{what}: the server's answer is not what Vault/OpenBao KV v2 sends; check that `address` points at Vault or OpenBao"
                ),
            }),
            ClientError::RestClientError { .. } => Err(KmsError::Unavailable {
                kms,
                detail: format!("{what}: {}", error_chain(e)),
            }),
            _ => Err(KmsError::Config {
                kms,
                detail: format!("{what}: {}", error_chain(e)),
            }),
        }
    }

    /// Reads the latest KV version of `path` (or `version`).
    pub(super) fn read_secret(&self, path: &str, version: Option<u64>) -> Result<Read, KmsError> {
        let what = match version {
            Some(v) => format!("reading KV version {v} of {}", self.data_path(path)),
            None => format!("reading {}", self.data_path(path)),
        };
        let endpoint = ReadSecretRequest::builder()
            .mount(self.mount.as_str())
            .path(path)
            .version(version)
            .build()
            .map_err(|e| KmsError::Config {
                kms: self.describe(),
                detail: format!("{what}: cannot build the request: {e}"),
            })?;
        match self.request(
            &what,
            vaultrs::api::exec_with_result(self.client()?, endpoint),
        )? {
            Answer::Ok(r) => Ok(Read::Found(r)),
            Answer::NotFound { deleted: Some(v) } => Ok(Read::Deleted(v)),
            Answer::NotFound { deleted: None } => Ok(Read::Absent),
            Answer::CasMismatch => Err(self.unexpected(&what)),
        }
    }

    /// The KV metadata of `path` (all versions' states), if the path exists.
    pub(super) fn read_metadata(
        &self,
        path: &str,
    ) -> Result<Option<ReadSecretMetadataResponse>, KmsError> {
        let what = format!("reading {}/metadata/{path}", self.mount);
        match self.request(
            &what,
            vaultrs::kv2::read_metadata(self.client()?, &self.mount, path),
        )? {
            Answer::Ok(m) => Ok(Some(m)),
            Answer::NotFound { .. } => Ok(None),
            Answer::CasMismatch => Err(self.unexpected(&what)),
        }
    }

    /// Writes `data` as a new KV version of `path` with check-and-set `cas`; returns the new
    /// KV version, or `None` when the check-and-set did not match.
    pub(super) fn write(
        &self,
        path: &str,
        data: &BTreeMap<&str, &str>,
        cas: u64,
    ) -> Result<Option<u64>, KmsError> {
        let what = format!("writing {} (check-and-set {cas})", self.data_path(path));
        let cas32 = u32::try_from(cas).map_err(|_| KmsError::Corrupt {
            kms: self.describe(),
            key: path.to_string(),
            detail: format!("KV version {cas} is beyond what check-and-set accepts"),
        })?;
        let opts = SetSecretRequestOptions { cas: cas32 };
        match self.request(
            &what,
            vaultrs::kv2::set_with_options(self.client()?, &self.mount, path, data, opts),
        )? {
            Answer::Ok(meta) => {
                self.after_write()?;
                Ok(Some(meta.version))
            }
            Answer::CasMismatch => Ok(None),
            Answer::NotFound { .. } => Err(self.unexpected(&what)),
        }
    }

    /// Deletes every version and the metadata of `path` (absent is fine).
    pub(super) fn delete_metadata(&self, path: &str) -> Result<(), KmsError> {
        let what = format!("deleting {}/metadata/{path}", self.mount);
        match self.request(
            &what,
            vaultrs::kv2::delete_metadata(self.client()?, &self.mount, path),
        )? {
            Answer::Ok(()) => self.after_write(),
            Answer::NotFound { .. } => Ok(()),
            Answer::CasMismatch => Err(self.unexpected(&what)),
        }
    }

    /// Destroys (permanently deletes) KV version `kv_version` of `path`.
    pub(super) fn destroy_version(&self, path: &str, kv_version: u64) -> Result<(), KmsError> {
        let what = format!(
            "destroying KV version {kv_version} of {}/data/{path} (POST {}/destroy/{path})",
            self.mount, self.mount
        );
        match self.request(
            &what,
            vaultrs::kv2::destroy_versions(self.client()?, &self.mount, path, vec![kv_version]),
        )? {
            Answer::Ok(()) => self.after_write(),
            Answer::NotFound { .. } => Ok(()),
            Answer::CasMismatch => Err(self.unexpected(&what)),
        }
    }

    /// Evaluates the `kms.after_write` injection point (crate::failpoint): a write request
    /// was answered with success; an injected error is [`KmsError::Unavailable`].
    fn after_write(&self) -> Result<(), KmsError> {
        crate::failpoint::check("kms.after_write").map_err(|detail| KmsError::Unavailable {
            kms: self.describe(),
            detail,
        })
    }

    /// The error for request `what` whose answer makes no sense for a KV version 2 mount.
    pub(super) fn unexpected(&self, what: &str) -> KmsError {
        KmsError::Config {
            kms: self.describe(),
            detail: format!(
                "{what}: unexpected answer; check that `mount` {:?} is a KV version 2 secrets engine",
                self.mount
            ),
        }
    }

    /// `auth/token/lookup-self` for the client's token, with the token itself (the `id`
    /// field) wiped from the answer.
    /// <https://developer.hashicorp.com/vault/api-docs/auth/token#lookup-a-token-self>
    pub(super) fn lookup_self(
        &self,
    ) -> Result<vaultrs::api::token::responses::LookupTokenResponse, KmsError> {
        use zeroize::Zeroize as _;
        let what = "looking up the token (GET auth/token/lookup-self)";
        match self.request(what, vaultrs::token::lookup_self(self.client()?))? {
            Answer::Ok(mut info) => {
                info.id.zeroize();
                Ok(info)
            }
            _ => Err(self.unexpected(what)),
        }
    }
}

/// One line from Vault's multi-line error texts ("1 error occurred:\n\t* permission denied").
pub(super) fn squash(msg: &str) -> String {
    msg.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An error and its sources, `: `-separated, skipping repeats and the client crates' generic
/// wrapper texts (so the message starts at the useful part: the URL and the cause).
pub(super) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    const GENERIC: &[&str] = &[
        "An error occurred with the request",
        "Error sending HTTP request",
        "Error retrieving HTTP response",
        "An error occurred in processing the request",
    ];
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let text = err.to_string();
        if !GENERIC.contains(&text.as_str()) && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = err.source();
    }
    if parts.is_empty() {
        e.to_string()
    } else {
        parts.join(": ")
    }
}
