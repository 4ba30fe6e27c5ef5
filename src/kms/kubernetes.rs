//! The `kubernetes` KMS provider: key versions in core/v1 Secrets, through the `kube` crate.
//!
//! Operators' documentation (layout, what a third-party reader sees, RBAC, failure
//! behaviour): `docs/kms/kubernetes.md`. API semantics relied on, from the Kubernetes API
//! reference (<https://kubernetes.io/docs/reference/kubernetes-api/config-and-storage-resources/secret-v1/>)
//! and the API concepts page (<https://kubernetes.io/docs/reference/using-api/api-concepts/>):
//!
//! - `PUT` of an object whose `metadata.resourceVersion` is not the stored one fails with
//!   409 `Conflict`: optimistic concurrency, keyplan's compare-and-swap (invariant I5);
//! - `POST` of a name that exists fails with 409 `AlreadyExists`;
//! - `DELETE` with `preconditions.resourceVersion`/`uid` fails with 409 when they differ;
//! - a Secret with `immutable: true` refuses any change of `data` (422 `Invalid`);
//! - the `data` of one Secret may hold at most 1 MiB (1048576 bytes, 422 `Invalid` beyond).
//!
//! # Layout (key KMS name = Secret name, a DNS-1123 subdomain)
//!
//! **Mutable layout** (the default): one Secret `<name>`, so that every change is one
//! conditional write (`PUT` with the `resourceVersion` read just before it):
//!
//! ```text
//! Secret <name>     labels      app.kubernetes.io/managed-by: keyplan
//!                   annotations keyplan.io/versions: {"format":1,"current":N|null,"pending":N|null,
//!                                  "versions":[{"version":N,"created_at":UNIX_SECONDS,"state":S}]}
//!                   data        <data_key>   (default dmcrypt-key): the CURRENT passphrase
//!                               keyplan.v<N>: the pending version and retained previous versions
//! ```
//!
//! A Secret without the annotation but with `data[<data_key>]` (a Rook-created Secret) reads as
//! version 1, current, created at the Secret's `creationTimestamp`.
//!
//! **Secret-per-version layout**, used when Secret `<name>` is immutable (keyplan never tries to
//! change an immutable Secret) or when the index Secret below exists:
//!
//! ```text
//! Secret <name>-keyplan  (mutable index, no material; conditional writes)
//!                   annotations keyplan.io/layout: secret-per-version
//!                               keyplan.io/current-secret: <Secret holding the current version>
//!                               keyplan.io/versions: as above, each version also naming its
//!                                  "secret" and "data_key"
//! Secret <name>-v<N>  (immutable, one per version keyplan stages) data[<data_key>] = material
//! Secret <name>       (the original immutable Secret, adopted as version 1 or per its annotation)
//! ```
//!
//! Key material is never logged, never put in error messages, and keyplan's own copies of it
//! (request and response bodies, decoded `data` values) are zeroized after use; buffers inside
//! the HTTP stack are not under keyplan's control.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use base64::Engine as _;
use bytes::Bytes;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::client::Body;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::core::params::{DeleteParams, GetParams, PostParams, Preconditions};
use kube::core::Status;
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, Zeroizing};

use super::book::{self, show, Commit, Destroy, VersionBook};
use super::{
    block_on, with_retries, Credential, KeyState, Kms, KmsError, VersionInfo, VersionState,
    REQUEST_TIMEOUT,
};
use crate::secret::Passphrase;
use crate::spec::KmsConfig;

/// Data key of the current passphrase when the plan sets no `data_key`: `dmcrypt-key`, the
/// key Rook's OSD encryption Secrets use.
pub const DEFAULT_DATA_KEY: &str = "dmcrypt-key";
/// Annotation holding keyplan's version record (compact JSON, no material).
pub const VERSIONS_ANNOTATION: &str = "keyplan.io/versions";
/// Annotation marking an index Secret of the secret-per-version layout.
pub const LAYOUT_ANNOTATION: &str = "keyplan.io/layout";
/// Value of [`LAYOUT_ANNOTATION`] on an index Secret.
pub const LAYOUT_SECRET_PER_VERSION: &str = "secret-per-version";
/// Annotation of an index Secret naming the Secret that holds the current version (in its
/// `data[<data_key>]`).
pub const CURRENT_SECRET_ANNOTATION: &str = "keyplan.io/current-secret";
/// Label put on every Secret keyplan writes (`app.kubernetes.io/managed-by: keyplan`).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Label on index and version Secrets naming the key they belong to.
pub const KEY_LABEL: &str = "keyplan.io/key";
/// Prefix of the data keys holding non-current versions in the mutable layout (`keyplan.v<N>`).
pub const VERSION_DATA_PREFIX: &str = "keyplan.v";
/// Suffix of the index Secret's name in the secret-per-version layout.
pub const INDEX_SUFFIX: &str = "-keyplan";
/// Most bytes the `data` values of one Secret may hold together (Kubernetes API reference,
/// Secret v1: "total size ... limited to 1MiB"; enforced by the API server with 422 Invalid).
pub const MAX_SECRET_DATA_BYTES: usize = 1 << 20;

/// Opens the `kubernetes` KMS instance `name` configured as `config` (a
/// [`KmsConfig::Kubernetes`]): loads the kubeconfig `context` when one is given, otherwise
/// infers the configuration (`KUBECONFIG` or `~/.kube/config`, else in-cluster service
/// account). Nothing is sent to the cluster.
///
/// Errors: [`KmsError::Config`] for an invalid namespace or data key, or an unusable
/// kubeconfig (named, without its content).
pub fn open(name: &str, config: &KmsConfig) -> Result<Box<dyn Kms>, KmsError> {
    match config {
        KmsConfig::Kubernetes {
            namespace,
            context,
            data_key,
            ..
        } => Ok(Box::new(KubernetesKms::with_timeout(
            name,
            namespace,
            data_key.as_deref(),
            None,
            context.as_deref(),
            super::timeout_of(name, config)?,
        )?)),
        other => Err(KmsError::misrouted(name, other, "kubernetes")),
    }
}

/// How much longer than a call's deadline the kube client's own timeouts are (backstops).
const CLIENT_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// A Kubernetes namespace as a key store (see the module documentation for the layout).
///
/// Safe to share between threads; every call runs on keyplan's shared runtime
/// ([`super::block_on`]) and each request is bounded by what is left of its call's deadline
/// ([`super::deadline`]).
pub struct KubernetesKms {
    name: String,
    namespace: String,
    data_key: String,
    cluster_url: String,
    client: kube::Client,
    auth: AuthSource,
}

/// Where the client's credential comes from, as far as its expiry can be known (never the
/// credential itself).
#[derive(Debug, Clone)]
pub(crate) enum AuthSource {
    /// A client certificate file (read again for each report).
    CertFile(std::path::PathBuf),
    /// A client certificate inline in the kubeconfig (`client-certificate-data`): its
    /// notAfter, read when the kubeconfig was loaded.
    CertData(Result<u64, String>),
    /// A bearer token file (`tokenFile`, or the in-cluster projected service-account token),
    /// read again for each report.
    TokenFile(std::path::PathBuf),
    /// A bearer token inline in the kubeconfig: its `exp` claim when it is a JWT.
    Token(Option<u64>),
    /// Something else (an exec plugin, basic auth, nothing): expiry unknown.
    Other,
}

impl AuthSource {
    /// Sorts the client's `auth` settings (certificate first, as kube presents it).
    fn of(auth: &kube::config::AuthInfo) -> AuthSource {
        use secrecy::ExposeSecret as _;
        if let Some(data) = &auth.client_certificate_data {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|_| "client-certificate-data is not base64".to_string());
            return AuthSource::CertData(pem.and_then(|p| super::expiry::pem_not_after(&p)));
        }
        if let Some(path) = &auth.client_certificate {
            return AuthSource::CertFile(path.into());
        }
        if let Some(path) = &auth.token_file {
            return AuthSource::TokenFile(path.into());
        }
        match &auth.token {
            Some(t) => {
                AuthSource::Token(super::expiry::jwt_expiry(t.expose_secret()).ok().flatten())
            }
            None => AuthSource::Other,
        }
    }

    /// The credential of [`Kms::credentials`]. Errors: a certificate or token file that
    /// cannot be read or parsed (named, never quoted).
    fn credential(&self) -> Result<Option<Credential>, String> {
        let cert = |what: String, expires: u64| Credential {
            kind: "client_certificate",
            what,
            expires_at: Some(expires),
            renewed_by: None,
            renewable_until: None,
        };
        Ok(Some(match self {
            AuthSource::CertFile(p) => cert(
                format!("client certificate {}", p.display()),
                super::expiry::certificate_not_after(p)?,
            ),
            AuthSource::CertData(r) => cert(
                "client certificate of the kubeconfig (client-certificate-data)".to_string(),
                r.clone()
                    .map_err(|e| format!("client-certificate-data: {e}"))?,
            ),
            AuthSource::TokenFile(p) => {
                let token = Zeroizing::new(
                    std::fs::read_to_string(p)
                        .map_err(|e| format!("cannot read token file {}: {e}", p.display()))?,
                );
                let projected = p == Path::new(super::expiry::PROJECTED_TOKEN_FILE);
                Credential {
                    kind: "service_account_token",
                    what: format!("service-account token {}", p.display()),
                    // A token that is not a JWT (a legacy opaque token) has no known expiry.
                    expires_at: super::expiry::jwt_expiry(&token).ok().flatten(),
                    renewed_by: projected
                        .then(|| "the kubelet refreshes the projected token".to_string()),
                    renewable_until: None,
                }
            }
            AuthSource::Token(exp) => Credential {
                kind: "bearer_token",
                what: "bearer token of the kubeconfig".to_string(),
                expires_at: *exp,
                renewed_by: None,
                renewable_until: None,
            },
            AuthSource::Other => return Ok(None),
        }))
    }
}

impl fmt::Debug for KubernetesKms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubernetesKms")
            .field("name", &self.name)
            .field("namespace", &self.namespace)
            .field("data_key", &self.data_key)
            .field("cluster_url", &self.cluster_url)
            .finish_non_exhaustive()
    }
}

impl KubernetesKms {
    /// Connects KMS instance `name` to `namespace`, storing the current passphrase under
    /// `data_key` (default [`DEFAULT_DATA_KEY`]). Connection settings come from the kubeconfig
    /// file `kubeconfig` if given, else from `KUBECONFIG`/`~/.kube/config` (context `context`,
    /// default the current context), else, with neither a file nor a context, from the
    /// in-cluster service account. Client-side retries are off (keyplan retries only
    /// idempotent calls itself) and connect/read/write timeouts are [`REQUEST_TIMEOUT`].
    /// Nothing is sent to the cluster. Installs rustls' `ring` crypto provider as the
    /// process default if none is installed yet (needed for `https://` cluster URLs).
    ///
    /// Errors: [`KmsError::Config`] naming what is unusable (the kubeconfig's content is never
    /// quoted: it may hold credentials).
    pub fn new(
        name: &str,
        namespace: &str,
        data_key: Option<&str>,
        kubeconfig: Option<&Path>,
        context: Option<&str>,
    ) -> Result<KubernetesKms, KmsError> {
        Self::with_timeout(
            name,
            namespace,
            data_key,
            kubeconfig,
            context,
            REQUEST_TIMEOUT,
        )
    }

    /// [`KubernetesKms::new`] for an instance whose calls may take up to `timeout` (its
    /// `timeout` in the plan): the client's own connect, read and write timeouts are a few
    /// seconds longer ([`CLIENT_GRACE`]), backstops only, so the call's own deadline
    /// ([`super::deadline`]) ends a silent request first and says so.
    ///
    /// Errors: as [`KubernetesKms::new`].
    pub fn with_timeout(
        name: &str,
        namespace: &str,
        data_key: Option<&str>,
        kubeconfig: Option<&Path>,
        context: Option<&str>,
        timeout: std::time::Duration,
    ) -> Result<KubernetesKms, KmsError> {
        let pre = format!("kubernetes KMS {name:?} (namespace {namespace})");
        let config_err = |detail: String| KmsError::Config {
            kms: pre.clone(),
            detail,
        };
        if !is_dns1123_label(namespace) {
            return Err(config_err(format!(
                "namespace {namespace:?} is not a valid Kubernetes namespace name (lowercase letters, digits and '-', at most 63 characters); fix `namespace` in the plan"
            )));
        }
        let data_key = data_key.unwrap_or(DEFAULT_DATA_KEY).to_string();
        if !is_data_key(&data_key) || data_key.starts_with(VERSION_DATA_PREFIX) {
            return Err(config_err(format!(
                "data_key {data_key:?} cannot be used: a Secret data key is made of letters, digits, '-', '_' and '.' (at most 253 characters), and keys starting with {VERSION_DATA_PREFIX:?} are keyplan's own; fix `data_key` in the plan"
            )));
        }
        let what = config_source(kubeconfig, context);
        super::install_tls_provider();
        let loaded = block_on(
            &pre,
            load_client(kubeconfig, context, timeout + CLIENT_GRACE),
        )?;
        let (url, client, auth) =
            loaded.map_err(|e| config_err(format!("cannot use {what}: {e}")))?;
        Ok(KubernetesKms {
            name: name.to_string(),
            namespace: namespace.to_string(),
            data_key,
            cluster_url: url.trim_end_matches('/').to_string(),
            client,
            auth,
        })
    }

    fn secrets_path(&self) -> String {
        format!("/api/v1/namespaces/{}/secrets", self.namespace)
    }

    fn run<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, KmsError>>,
    ) -> Result<T, KmsError> {
        block_on(&self.describe(), fut)?
    }

    /// Sends one request (body `body` replacing the request's own when given), bounded by
    /// what is left of its call's deadline ([`super::deadline::remaining`]); returns the 2xx
    /// answer's body in a zeroizing buffer.
    async fn send(
        &self,
        req: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
        body: Option<Zeroizing<Vec<u8>>>,
    ) -> Result<Zeroizing<Vec<u8>>, CallError> {
        let req =
            req.map_err(|e| CallError::Transport(format!("cannot build the request: {e}")))?;
        let req = req.map(move |own| match body {
            Some(b) => Body::from(Bytes::from_owner(b)),
            None => Body::from(own),
        });
        let call = async {
            let res = self
                .client
                .send(req)
                .await
                .map_err(|e| CallError::Transport(chain(&e)))?;
            let status = res.status();
            let bytes = res
                .into_body()
                .collect_bytes()
                .await
                .map_err(|e| CallError::Transport(chain(&e)))?;
            let buf = take_zeroizing(bytes);
            if status.is_success() {
                Ok(buf)
            } else {
                let st = serde_json::from_slice::<Status>(&buf).unwrap_or_else(|_| {
                    Status::failure(
                        String::from_utf8_lossy(&buf).trim(),
                        status.canonical_reason().unwrap_or("error"),
                    )
                    .with_code(status.as_u16())
                });
                Err(CallError::Api(Box::new(st)))
            }
        };
        match tokio::time::timeout(super::deadline::remaining(), call).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout),
        }
    }

    /// `GET` of Secret `name`; `None` when it does not exist (404).
    async fn get_secret(&self, name: &str) -> Result<Option<SecretObj>, CallError> {
        let req = kube::core::Request::new(self.secrets_path()).get(name, &GetParams::default());
        match self.send(req, None).await {
            Ok(buf) => decode_secret(&buf).map(Some),
            Err(CallError::Api(st)) if st.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `POST` of a new Secret.
    async fn create_secret(&self, obj: &SecretObj) -> Result<SecretObj, CallError> {
        let body = encode_secret(obj)?;
        let req =
            kube::core::Request::new(self.secrets_path()).create(&PostParams::default(), vec![]);
        decode_secret(&self.send(req, Some(body)).await?)
    }

    /// `PUT` of `obj`, conditional on its `metadata.resourceVersion`.
    async fn replace_secret(&self, obj: &SecretObj) -> Result<SecretObj, CallError> {
        let name = obj.metadata.name.clone().unwrap_or_default();
        if obj.metadata.resource_version.is_none() {
            return Err(CallError::Transport(format!(
                "internal error: unconditional update of Secret {name} refused"
            )));
        }
        let body = encode_secret(obj)?;
        let req = kube::core::Request::new(self.secrets_path()).replace(
            &name,
            &PostParams::default(),
            vec![],
        );
        decode_secret(&self.send(req, Some(body)).await?)
    }

    /// `DELETE` of Secret `name` (with `preconditions`); false when it did not exist.
    async fn delete_secret(
        &self,
        name: &str,
        preconditions: Option<Preconditions>,
    ) -> Result<bool, CallError> {
        let dp = DeleteParams {
            preconditions,
            ..DeleteParams::default()
        };
        let req = kube::core::Request::new(self.secrets_path()).delete(name, &dp);
        match self.send(req, None).await {
            Ok(_) => Ok(true),
            Err(CallError::Api(st)) if st.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// May keyplan's identity do `verb` on Secrets (named `name`) in the namespace? Asked
    /// with a SelfSubjectAccessReview (authorization.k8s.io/v1), which persists nothing.
    async fn may(&self, verb: &str, name: Option<&str>) -> Result<(bool, String), CallError> {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(self.namespace.clone()),
                    verb: Some(verb.to_string()),
                    group: Some(String::new()),
                    version: Some("v1".to_string()),
                    resource: Some("secrets".to_string()),
                    name: name.map(str::to_string),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let mut value = serde_json::to_value(&review)
            .map_err(|e| CallError::Transport(format!("cannot encode the access review: {e}")))?;
        if let Some(obj) = value.as_object_mut() {
            obj.insert("apiVersion".into(), "authorization.k8s.io/v1".into());
            obj.insert("kind".into(), "SelfSubjectAccessReview".into());
        }
        let body = serde_json::to_vec(&value)
            .map_err(|e| CallError::Transport(format!("cannot encode the access review: {e}")))?;
        let req =
            kube::core::Request::new("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
                .create(&PostParams::default(), body);
        let buf = self.send(req, None).await?;
        let answer: SelfSubjectAccessReview = serde_json::from_slice(&buf).map_err(|e| {
            CallError::Transport(format!("the access review answer is not valid JSON: {e}"))
        })?;
        let status = answer.status.unwrap_or_default();
        let why = [status.reason, status.evaluation_error]
            .into_iter()
            .flatten()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        Ok((status.allowed && !status.denied.unwrap_or(false), why))
    }

    /// Maps a failed call (what: the operation, key and version) to a [`KmsError`].
    fn fail(&self, key: &str, what: &str, e: CallError) -> KmsError {
        let kms = self.describe();
        match e {
            CallError::Timeout => KmsError::Timeout {
                kms,
                detail: format!(
                    "{what}: no answer from {} within {}",
                    self.cluster_url,
                    super::deadline::limit_text()
                ),
            },
            CallError::Transport(t) => KmsError::Unavailable {
                kms,
                detail: format!("{what}: cannot reach {}: {t}", self.cluster_url),
            },
            CallError::Decode(d) => KmsError::Corrupt {
                kms,
                key: key.to_string(),
                detail: format!("{what}: the API server's answer is not a valid Secret: {d}"),
            },
            CallError::Api(st) => {
                let msg = if st.message.is_empty() {
                    st.reason.clone()
                } else {
                    st.message.clone()
                };
                match st.code {
                    401 => KmsError::Denied {
                        kms,
                        detail: format!(
                            "{what}: the API server did not accept keyplan's credentials (401 {msg}); the token or client certificate of the kubeconfig is missing, expired or wrong"
                        ),
                    },
                    403 => KmsError::Denied {
                        kms,
                        detail: format!("{what}: 403 Forbidden: {msg}"),
                    },
                    409 => KmsError::Conflict {
                        kms,
                        key: key.to_string(),
                        detail: format!("{what}: 409 {}: {msg}", st.reason),
                    },
                    422 => {
                        let hint = if msg.contains("Too long") || msg.contains("too long") {
                            format!(
                                "; the Secret's data would exceed the API server's limit of {MAX_SECRET_DATA_BYTES} bytes (1 MiB). Nothing was changed: remove data keys the Secret no longer needs, or let keyplan retire old versions (keyplan.v<N> keys) first"
                            )
                        } else if msg.contains("immutable") {
                            "; the Secret is immutable. Nothing was changed: keyplan never modifies immutable Secrets, so run `keyplan plan` again (it then uses one Secret per version)".to_string()
                        } else {
                            "; nothing was changed".to_string()
                        };
                        KmsError::Config {
                            kms,
                            detail: format!(
                                "{what}: the API server refused it as invalid (422): {msg}{hint}"
                            ),
                        }
                    }
                    404 => KmsError::Config {
                        kms,
                        detail: format!(
                            "{what}: 404 Not Found: {msg}; check that namespace {} exists",
                            self.namespace
                        ),
                    },
                    429 | 500..=599 => KmsError::Unavailable {
                        kms,
                        detail: format!("{what}: {} {}: {msg}", st.code, st.reason),
                    },
                    code => KmsError::Config {
                        kms,
                        detail: format!("{what}: the API server answered {code} {}: {msg}", st.reason),
                    },
                }
            }
        }
    }

    fn check_name(&self, key: &str) -> Result<(), KmsError> {
        if is_dns1123_subdomain(key) {
            Ok(())
        } else {
            Err(KmsError::Config {
                kms: self.describe(),
                detail: format!(
                    "key name {key:?} cannot be a Secret name: Secret names are DNS-1123 subdomains (lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters). Nothing was changed; set the key's `name:` in the plan to such a name"
                ),
            })
        }
    }

    fn label(&self, key: &str) -> String {
        format!("Secret {}/{key}", self.namespace)
    }

    /// Reads the key's Secrets and decides the layout.
    async fn load(&self, key: &str) -> Result<View, KmsError> {
        self.check_name(key)?;
        let main = self
            .get_secret(key)
            .await
            .map_err(|e| self.fail(key, &format!("reading {}", self.label(key)), e))?;
        if let Some(obj) = main {
            if !obj.is_immutable() {
                let meta = self.parse_single(key, &obj)?;
                return Ok(View::Single {
                    obj: Some(obj),
                    meta,
                });
            }
            return self.load_index(key, Some(obj)).await;
        }
        self.load_index(key, None).await
    }

    async fn load_index(&self, key: &str, original: Option<SecretObj>) -> Result<View, KmsError> {
        let index_name = format!("{key}{INDEX_SUFFIX}");
        let index = self
            .get_secret(&index_name)
            .await
            .map_err(|e| self.fail(key, &format!("reading {}", self.label(&index_name)), e))?;
        match (index, original) {
            (Some(ix), _) => {
                if ix.annotation(LAYOUT_ANNOTATION) != Some(LAYOUT_SECRET_PER_VERSION) {
                    return Err(KmsError::corrupt(
                        self,
                        key,
                        format!(
                            "{} exists but is not a keyplan index (annotation {LAYOUT_ANNOTATION}: {LAYOUT_SECRET_PER_VERSION} missing); nothing was changed. Rename or delete that Secret, or give the key another `name:`",
                            self.label(&index_name)
                        ),
                    ));
                }
                let meta = match ix.annotation(VERSIONS_ANNOTATION) {
                    Some(text) => self.parse_meta(key, &index_name, text)?,
                    None => Meta::empty(),
                };
                for v in &meta.versions {
                    if v.secret.is_none() {
                        return Err(KmsError::corrupt(
                            self,
                            key,
                            format!(
                                "{}: annotation {VERSIONS_ANNOTATION} names no Secret for v{}; nothing was changed. Fix the annotation by hand (docs/kms/kubernetes.md)",
                                self.label(&index_name),
                                v.version
                            ),
                        ));
                    }
                }
                Ok(View::Index {
                    index: Some(ix),
                    meta,
                })
            }
            (None, Some(orig)) => {
                // An immutable Secret keyplan has not indexed yet: adopt its versions.
                let mut meta = self.parse_single(key, &orig)?;
                let current = meta.current;
                for v in &mut meta.versions {
                    v.secret = Some(key.to_string());
                    v.data_key = Some(if Some(v.version) == current {
                        self.data_key.clone()
                    } else {
                        format!("{VERSION_DATA_PREFIX}{}", v.version)
                    });
                }
                Ok(View::Index { index: None, meta })
            }
            (None, None) => Ok(View::Single {
                obj: None,
                meta: Meta::empty(),
            }),
        }
    }

    fn parse_meta(&self, key: &str, secret: &str, text: &str) -> Result<Meta, KmsError> {
        let meta: Meta = serde_json::from_str(text).map_err(|e| {
            KmsError::corrupt(
                self,
                key,
                format!(
                    "{}: annotation {VERSIONS_ANNOTATION} is not valid: {e}; nothing was changed. Restore the annotation from a backup or fix it by hand (docs/kms/kubernetes.md)",
                    self.label(secret)
                ),
            )
        })?;
        if meta.format != 1 {
            return Err(KmsError::corrupt(
                self,
                key,
                format!(
                    "{}: annotation {VERSIONS_ANNOTATION} has format {}, this keyplan reads format 1; nothing was changed. Use a keyplan release that knows it",
                    self.label(secret),
                    meta.format
                ),
            ));
        }
        let consistent = |v: Option<u64>, state: VersionState| {
            v.is_none_or(|n| {
                meta.versions
                    .iter()
                    .any(|x| x.version == n && x.state == state)
            })
        };
        if !consistent(meta.current, VersionState::Current)
            || !consistent(meta.pending, VersionState::Pending)
        {
            return Err(KmsError::corrupt(
                self,
                key,
                format!(
                    "{}: annotation {VERSIONS_ANNOTATION} names current {} and pending {} but its version list disagrees; nothing was changed. Fix the annotation by hand (docs/kms/kubernetes.md)",
                    self.label(secret),
                    show(meta.current),
                    show(meta.pending)
                ),
            ));
        }
        Ok(meta)
    }

    /// The versions a Secret of the mutable layout holds (annotation, or Rook adoption).
    fn parse_single(&self, key: &str, obj: &SecretObj) -> Result<Meta, KmsError> {
        match obj.annotation(VERSIONS_ANNOTATION) {
            Some(text) => {
                let meta = self.parse_meta(key, key, text)?;
                let missing = |data_key: String| {
                    obj.data
                        .get(&data_key)
                        .is_none_or(|m| m.0.is_empty())
                        .then_some(data_key)
                };
                let gone = meta
                    .current
                    .and_then(|_| missing(self.data_key.clone()))
                    .or_else(|| {
                        meta.pending
                            .and_then(|p| missing(format!("{VERSION_DATA_PREFIX}{p}")))
                    });
                if let Some(data_key) = gone {
                    return Err(KmsError::corrupt(
                        self,
                        key,
                        format!(
                            "{} names current {} and pending {}, but data[{data_key}] is missing or empty; nothing was changed. Restore it from a backup",
                            self.label(key),
                            show(meta.current),
                            show(meta.pending)
                        ),
                    ));
                }
                Ok(meta)
            }
            None if obj.data.contains_key(&self.data_key) => {
                let created_at = obj
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .and_then(|t| u64::try_from(t.0.as_second()).ok())
                    .unwrap_or(0);
                Ok(Meta {
                    format: 1,
                    current: Some(1),
                    pending: None,
                    versions: vec![VersionMeta {
                        version: 1,
                        created_at,
                        state: VersionState::Current,
                        secret: None,
                        data_key: None,
                    }],
                    holders: BTreeMap::new(),
                })
            }
            None => Ok(Meta::empty()),
        }
    }

    /// Writes the index Secret of the secret-per-version layout (conditional `PUT`, or `POST`
    /// when it does not exist yet).
    async fn write_index(
        &self,
        key: &str,
        index: Option<SecretObj>,
        meta: &Meta,
        what: &str,
    ) -> Result<(), KmsError> {
        let index_name = format!("{key}{INDEX_SUFFIX}");
        let text = meta.to_json();
        let current_secret = meta
            .current
            .and_then(|c| meta.find(c))
            .and_then(|v| v.secret.clone());
        let exists = index.is_some();
        let mut ix = index.unwrap_or_else(|| SecretObj::new(&index_name, &self.namespace));
        ix.set_label(MANAGED_BY_LABEL, "keyplan");
        ix.set_label(KEY_LABEL, key);
        ix.set_annotation(
            LAYOUT_ANNOTATION,
            Some(LAYOUT_SECRET_PER_VERSION.to_string()),
        );
        ix.set_annotation(VERSIONS_ANNOTATION, Some(text));
        ix.set_annotation(CURRENT_SECRET_ANNOTATION, current_secret);
        let r = if exists {
            self.replace_secret(&ix).await
        } else {
            self.create_secret(&ix).await
        };
        r.map(|_| ())
            .map_err(|e| self.fail(key, &format!("{what} ({})", self.label(&index_name)), e))
    }

    /// Writes `meta` as the versions annotation of `obj`, the Secret of the mutable layout
    /// (conditional `PUT` with its `resourceVersion`); `what` names the change for errors.
    async fn write_single(
        &self,
        key: &str,
        mut obj: SecretObj,
        meta: &Meta,
        what: &str,
    ) -> Result<(), KmsError> {
        obj.set_annotation(VERSIONS_ANNOTATION, Some(meta.to_json()));
        self.replace_secret(&obj)
            .await
            .map_err(|e| self.fail(key, &format!("{what} in {}", self.label(key)), e))?;
        Ok(())
    }

    fn read_now(&self, key: &str) -> Result<KeyState, KmsError> {
        self.run(async {
            let view = self.load(key).await?;
            if let View::Index { meta, .. } = &view {
                // Like every layout: current and pending must have their material.
                for v in meta.current.iter().chain(meta.pending.iter()) {
                    let m = self.fetch_indexed(key, meta, *v).await?;
                    if m.is_none() {
                        let loc = meta.find(*v).and_then(|x| x.secret.clone()).unwrap_or_default();
                        return Err(KmsError::corrupt(
                            self,
                            key,
                            format!(
                                "the index names {} as the Secret of v{v} (current or pending), but it is missing or has no data[{}]; nothing was changed. Restore it from a backup",
                                self.label(&loc),
                                self.data_key
                            ),
                        ));
                    }
                }
            }
            Ok(view.meta().to_state())
        })
    }

    /// The material of indexed version `v` (None: its Secret or data key is gone).
    async fn fetch_indexed(
        &self,
        key: &str,
        meta: &Meta,
        v: u64,
    ) -> Result<Option<Passphrase>, KmsError> {
        let Some(entry) = meta.find(v) else {
            return Ok(None);
        };
        let (Some(secret), Some(data_key)) = (&entry.secret, &entry.data_key) else {
            return Ok(None);
        };
        let obj = self
            .get_secret(secret)
            .await
            .map_err(|e| self.fail(key, &format!("reading v{v} from {}", self.label(secret)), e))?;
        Ok(obj.and_then(|mut o| o.take(data_key)))
    }

    fn get_now(&self, key: &str, version: u64) -> Result<Passphrase, KmsError> {
        let missing = || KmsError::NoSuchVersion {
            kms: self.describe(),
            key: key.to_string(),
            version,
        };
        let p = self.run(async {
            match self.load(key).await? {
                View::Single { obj, meta } => {
                    let known = meta
                        .find(version)
                        .is_some_and(|v| v.state != VersionState::Retired);
                    let Some(mut obj) = obj.filter(|_| known) else {
                        return Ok(None);
                    };
                    let data_key = if meta.current == Some(version) {
                        self.data_key.clone()
                    } else {
                        format!("{VERSION_DATA_PREFIX}{version}")
                    };
                    Ok(obj.take(&data_key))
                }
                View::Index { meta, .. } => {
                    if meta
                        .find(version)
                        .is_none_or(|v| v.state == VersionState::Retired)
                    {
                        return Ok(None);
                    }
                    self.fetch_indexed(key, &meta, version).await
                }
            }
        })?;
        match p {
            Some(p) if p.is_empty() => Err(KmsError::corrupt(
                self,
                key,
                format!("v{version} is stored empty in namespace {}", self.namespace),
            )),
            Some(p) => Ok(p),
            None => Err(missing()),
        }
    }

    fn stage_now(&self, key: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        self.run(async {
            let view = self.load(key).await?;
            let v = view
                .meta()
                .book()
                .stage(at_least)
                .map_err(|r| r.conflict(self, key))?;
            match view {
                View::Single { obj, mut meta } => {
                    meta.pending = Some(v);
                    meta.versions
                        .push(VersionMeta::new(v, VersionState::Pending));
                    let exists = obj.is_some();
                    let mut obj = obj.unwrap_or_else(|| SecretObj::new(key, &self.namespace));
                    obj.data.insert(
                        format!("{VERSION_DATA_PREFIX}{v}"),
                        Material::copy(material.expose()),
                    );
                    obj.set_label(MANAGED_BY_LABEL, "keyplan");
                    obj.set_annotation(VERSIONS_ANNOTATION, Some(meta.to_json()));
                    let what = format!("staging v{v} of key {key:?} in {}", self.label(key));
                    let r = if exists {
                        self.replace_secret(&obj).await
                    } else {
                        self.create_secret(&obj).await
                    };
                    r.map_err(|e| self.fail(key, &what, e))?;
                    Ok(v)
                }
                View::Index { index, mut meta } => {
                    self.stage_indexed(key, material, v, index, &mut meta).await
                }
            }
        })
    }

    /// Stage in the secret-per-version layout: a new immutable Secret `<key>-v<N>` (`N` from
    /// `first` up), then the index. A `<key>-v<N>` the index does not name (left by an interrupted stage) is skipped
    /// and deleted once the index names the new version (any other writer that made it then
    /// fails its own conditional index write).
    async fn stage_indexed(
        &self,
        key: &str,
        material: &Passphrase,
        first: u64,
        index: Option<SecretObj>,
        meta: &mut Meta,
    ) -> Result<u64, KmsError> {
        let mut v = first;
        let mut orphans = Vec::new();
        let version_secret = loop {
            let secret_name = format!("{key}-v{v}");
            let mut obj = SecretObj::new(&secret_name, &self.namespace);
            obj.immutable = Some(true);
            obj.set_label(MANAGED_BY_LABEL, "keyplan");
            obj.set_label(KEY_LABEL, key);
            obj.set_annotation("keyplan.io/version", Some(v.to_string()));
            obj.data
                .insert(self.data_key.clone(), Material::copy(material.expose()));
            match self.create_secret(&obj).await {
                Ok(_) => break secret_name,
                Err(CallError::Api(st)) if st.code == 409 && orphans.len() < 8 => {
                    tracing::warn!(
                        kms = %self.describe(),
                        secret = %secret_name,
                        "a Secret left by an interrupted stage exists; staging the next version number"
                    );
                    orphans.push(secret_name);
                    v += 1;
                }
                Err(e) => {
                    return Err(self.fail(
                        key,
                        &format!(
                            "staging v{v} of key {key:?} in {}",
                            self.label(&secret_name)
                        ),
                        e,
                    ))
                }
            }
        };
        meta.pending = Some(v);
        let mut entry = VersionMeta::new(v, VersionState::Pending);
        entry.secret = Some(version_secret.clone());
        entry.data_key = Some(self.data_key.clone());
        meta.versions.push(entry);
        let what = format!("recording pending v{v} of key {key:?}");
        if let Err(e) = self.write_index(key, index, meta, &what).await {
            if matches!(e, KmsError::Conflict { .. }) {
                // Refused, so nothing names our version Secret: remove it.
                if let Err(d) = self.delete_secret(&version_secret, None).await {
                    tracing::warn!(kms = %self.describe(), secret = %version_secret, error = %d, "cannot remove the unused version Secret");
                }
            }
            return Err(e);
        }
        for orphan in orphans {
            if let Err(e) = self.delete_secret(&orphan, None).await {
                tracing::warn!(kms = %self.describe(), secret = %orphan, error = %e, "cannot remove a Secret left by an interrupted stage");
            }
        }
        Ok(v)
    }

    fn commit_now(
        &self,
        key: &str,
        expected: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        self.run(async {
            let view = self.load(key).await?;
            if view.meta().current != Some(pending) {
                book::check_holders(self, key, &view.meta().holders, holder, pending)?;
            }
            let decision = view.meta().book().commit(expected, pending);
            let Commit::Go { previous } = decision.map_err(|r| r.conflict(self, key))? else {
                return Ok(());
            };
            let what = format!("committing v{pending} of key {key:?}");
            match view {
                View::Single { obj, mut meta } => {
                    let Some(mut obj) = obj else {
                        return Err(KmsError::conflict(self, key, format!("{} disappeared", self.label(key))));
                    };
                    let Some(new) = obj.data.remove(&format!("{VERSION_DATA_PREFIX}{pending}")) else {
                        return Err(KmsError::corrupt(self, key, format!("{}: data[{VERSION_DATA_PREFIX}{pending}] is missing; nothing was changed", self.label(key))));
                    };
                    if let Some(old) = previous {
                        let Some(old_material) = obj.data.remove(&self.data_key) else {
                            return Err(KmsError::corrupt(self, key, format!("{}: data[{}] is missing; nothing was changed", self.label(key), self.data_key)));
                        };
                        obj.data
                            .insert(format!("{VERSION_DATA_PREFIX}{old}"), old_material);
                    }
                    obj.data.insert(self.data_key.clone(), new);
                    (meta.current, meta.pending) =
                        book::commit_states(&mut meta.versions, previous, pending);
                    obj.set_label(MANAGED_BY_LABEL, "keyplan");
                    self.write_single(key, obj, &meta, &what).await
                }
                View::Index { index, mut meta } => {
                    (meta.current, meta.pending) =
                        book::commit_states(&mut meta.versions, previous, pending);
                    self.write_index(key, index, &meta, &what).await
                }
            }
        })
    }

    /// Adds (`Some`) or removes (`None`) the holder record of `holder`, a conditional write of
    /// the annotation where the versions are (the Secret, or the index Secret).
    fn holder_now(&self, key: &str, holder: &str, add: bool) -> Result<(), KmsError> {
        self.run(async {
            let view = self.load(key).await?;
            let meta = view.meta();
            if add && meta.current.is_none() {
                return Err(KmsError::conflict(
                    self,
                    key,
                    format!(
                        "{holder} cannot be recorded as a holder: the key has no current version"
                    ),
                ));
            }
            if meta.holders.contains_key(holder) == add {
                return Ok(());
            }
            let what = format!(
                "{} holder {holder} of key {key:?}",
                if add { "recording" } else { "removing" }
            );
            let edit = |meta: &mut Meta| {
                if add {
                    meta.holders
                        .insert(holder.to_string(), crate::clock::now_unix());
                } else {
                    meta.holders.remove(holder);
                }
            };
            match view {
                View::Single { obj, mut meta } => {
                    let Some(mut obj) = obj else {
                        return Ok(());
                    };
                    edit(&mut meta);
                    obj.set_label(MANAGED_BY_LABEL, "keyplan");
                    self.write_single(key, obj, &meta, &what).await
                }
                View::Index { index, mut meta } => {
                    edit(&mut meta);
                    self.write_index(key, index, &meta, &what).await
                }
            }
        })
    }

    fn retire_now(&self, key: &str, version: u64) -> Result<(), KmsError> {
        self.run(async {
            let view = self.load(key).await?;
            view.meta()
                .book()
                .retire(version)
                .map_err(|r| r.conflict(self, key))?;
            let what = format!("retiring v{version} of key {key:?}");
            match view {
                View::Single { obj, mut meta } => {
                    let Some(mut obj) = obj else {
                        return Ok(());
                    };
                    let had = obj
                        .data
                        .remove(&format!("{VERSION_DATA_PREFIX}{version}"))
                        .is_some();
                    let marked = meta
                        .find(version)
                        .is_none_or(|v| v.state == VersionState::Retired);
                    if !had && marked {
                        return Ok(());
                    }
                    book::retire_state(&mut meta.versions, version);
                    self.write_single(key, obj, &meta, &what).await
                }
                View::Index { index, mut meta } => {
                    let Some(entry) = meta.find(version).cloned() else {
                        return Ok(());
                    };
                    if entry.state != VersionState::Retired {
                        book::retire_state(&mut meta.versions, version);
                        self.write_index(key, index, &meta, &what).await?;
                    }
                    self.delete_unused(key, &meta, entry.secret.as_deref(), &what)
                        .await
                }
            }
        })
    }

    /// Deletes version Secret `secret` unless a version that is not retired still lives in it.
    async fn delete_unused(
        &self,
        key: &str,
        meta: &Meta,
        secret: Option<&str>,
        what: &str,
    ) -> Result<(), KmsError> {
        let Some(secret) = secret else {
            return Ok(());
        };
        let in_use = meta
            .versions
            .iter()
            .any(|v| v.state != VersionState::Retired && v.secret.as_deref() == Some(secret));
        if in_use {
            return Ok(());
        }
        self.delete_secret(secret, None)
            .await
            .map(|_| ())
            .map_err(|e| self.fail(key, &format!("{what}: deleting {}", self.label(secret)), e))
    }

    fn destroy_now(&self, key: &str, expected: u64) -> Result<(), KmsError> {
        self.run(async {
            let view = self.load(key).await?;
            let decision = view.meta().book().destroy(expected);
            let decision = decision.map_err(|r| r.conflict(self, key))?;
            let what = format!("destroying key {key:?}");
            match view {
                View::Single { .. } if decision == Destroy::NothingLeft => Ok(()),
                View::Single { obj, .. } => {
                    let Some(mut obj) = obj else {
                        return Ok(());
                    };
                    let ours =
                        |k: &String| k == &self.data_key || k.starts_with(VERSION_DATA_PREFIX);
                    if obj.data.keys().all(ours) {
                        let pre = Preconditions {
                            resource_version: obj.metadata.resource_version.clone(),
                            uid: obj.metadata.uid.clone(),
                        };
                        self.delete_secret(key, Some(pre)).await.map_err(|e| {
                            self.fail(key, &format!("{what}: deleting {}", self.label(key)), e)
                        })?;
                    } else {
                        // Other data lives in this Secret: remove only keyplan's part.
                        obj.data.retain(|k, _| !ours(k));
                        obj.set_annotation(VERSIONS_ANNOTATION, None);
                        self.replace_secret(&obj).await.map_err(|e| {
                            self.fail(key, &format!("{what} in {}", self.label(key)), e)
                        })?;
                    }
                    Ok(())
                }
                View::Index { index, mut meta } => {
                    if decision == Destroy::Go {
                        (meta.current, meta.pending) = book::destroy_states(&mut meta.versions);
                        self.write_index(key, index, &meta, &what).await?;
                    }
                    // Also finishes an interrupted destroy: no version is left in use.
                    let mut secrets: Vec<&str> = meta
                        .versions
                        .iter()
                        .filter_map(|v| v.secret.as_deref())
                        .collect();
                    secrets.sort_unstable();
                    secrets.dedup();
                    for s in secrets {
                        self.delete_unused(key, &meta, Some(s), &what).await?;
                    }
                    Ok(())
                }
            }
        })
    }

    fn check_now(&self, names: &[String]) -> Result<(), KmsError> {
        let mut targets = Vec::new();
        for key in names {
            let view = self.run(self.load(key))?;
            targets.push(match view {
                View::Single { .. } => key.clone(),
                View::Index { .. } => format!("{key}{INDEX_SUFFIX}"),
            });
        }
        self.run(async {
            let mut missing = Vec::new();
            let mut asks: Vec<(&str, Option<&str>)> = vec![("create", None)];
            for t in &targets {
                for verb in ["get", "update", "delete"] {
                    asks.push((verb, Some(t.as_str())));
                }
            }
            for (verb, name) in asks {
                let (ok, why) = self.may(verb, name).await.map_err(|e| {
                    self.fail(
                        name.unwrap_or_default(),
                        &format!("asking the API server whether keyplan may {verb} Secrets (SelfSubjectAccessReview)"),
                        e,
                    )
                })?;
                if !ok {
                    let what = match name {
                        Some(n) => format!("{verb} Secret {n}"),
                        None => format!("{verb} Secrets"),
                    };
                    missing.push(if why.is_empty() { what } else { format!("{what} ({why})") });
                }
            }
            if missing.is_empty() {
                Ok(())
            } else {
                Err(KmsError::Denied {
                    kms: self.describe(),
                    detail: format!(
                        "keyplan's identity may not {} in namespace {} (SelfSubjectAccessReview); keyplan needs get, create, update and delete on Secrets there",
                        missing.join(", "),
                        self.namespace
                    ),
                })
            }
        })
    }
}

impl Kms for KubernetesKms {
    fn describe(&self) -> String {
        format!(
            "kubernetes KMS {:?} ({}, namespace {})",
            self.name, self.cluster_url, self.namespace
        )
    }

    fn read(&self, name: &str) -> Result<KeyState, KmsError> {
        with_retries(&format!("read {name}"), || self.read_now(name))
    }

    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        with_retries(&format!("get {name} v{version}"), || {
            self.get_now(name, version)
        })
    }

    fn stage(&self, name: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        self.stage_now(name, material, at_least)
    }

    fn commit_as(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        self.commit_now(name, expected_current, pending, holder)
    }

    /// Records the holder in the `keyplan.io/versions` annotation (conditional `PUT`).
    fn hold(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        self.holder_now(name, holder, true)
    }

    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        with_retries(&format!("release {name}"), || {
            self.holder_now(name, holder, false)
        })
    }

    fn retire(&self, name: &str, version: u64) -> Result<(), KmsError> {
        with_retries(&format!("retire {name} v{version}"), || {
            self.retire_now(name, version)
        })
    }

    /// Reads each key, then asks the API server with SelfSubjectAccessReviews (which persist
    /// nothing) whether keyplan may `create` Secrets in the namespace and `get`, `update` and
    /// `delete` the Secret it writes for each key (`<name>`, or the index `<name>-keyplan`).
    fn check(&self, names: &[String]) -> Result<(), KmsError> {
        with_retries("check", || self.check_now(names))
    }

    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError> {
        with_retries(&format!("destroy {name}"), || {
            self.destroy_now(name, expected_current)
        })
    }

    /// The kubeconfig's client certificate (notAfter) or bearer token (`exp` when it is a
    /// JWT; the in-cluster projected token is refreshed by the kubelet). Contacts nothing.
    fn credentials(&self) -> Result<Vec<Credential>, KmsError> {
        self.auth
            .credential()
            .map(|c| c.into_iter().collect())
            .map_err(|detail| KmsError::Config {
                kms: self.describe(),
                detail,
            })
    }
}

/// Where the connection settings come from, for messages.
fn config_source(kubeconfig: Option<&Path>, context: Option<&str>) -> String {
    match (kubeconfig, context) {
        (Some(p), Some(c)) => format!("context {c:?} of kubeconfig {}", p.display()),
        (Some(p), None) => format!("kubeconfig {}", p.display()),
        (None, Some(c)) => {
            format!("context {c:?} of the kubeconfig (KUBECONFIG or ~/.kube/config)")
        }
        (None, None) => {
            "the kubeconfig (KUBECONFIG or ~/.kube/config) or in-cluster service account"
                .to_string()
        }
    }
}

/// Loads the connection settings (see [`KubernetesKms::new`]) and builds a client with
/// client-side retries off and `timeout` for connecting and for each read and write.
/// Returns the cluster URL, the client and where its credential comes from. Errors: why the
/// kubeconfig or the in-cluster configuration cannot be used (never its content).
pub(crate) async fn load_client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    timeout: std::time::Duration,
) -> Result<(String, kube::Client, AuthSource), String> {
    load_client_reading(kubeconfig, context, timeout, timeout).await
}

/// [`load_client`] with its own `read_timeout` (a watch's client waits longer for a read
/// than `timeout`: the API server may send nothing for minutes).
pub(crate) async fn load_client_reading(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    timeout: std::time::Duration,
    read_timeout: std::time::Duration,
) -> Result<(String, kube::Client, AuthSource), String> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let config = match kubeconfig {
        Some(path) => match Kubeconfig::read_from(path) {
            Ok(kc) => kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| kubeconfig_error(&e)),
            Err(e) => Err(kubeconfig_error(&e)),
        },
        None if context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| kubeconfig_error(&e)),
        None => kube::Config::infer().await.map_err(|e| {
            format!(
                "{}; no in-cluster service account either",
                std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<KubeconfigError>())
                    .map(kubeconfig_error)
                    .unwrap_or_else(|| e.to_string())
            )
        }),
    };
    let mut config = config?;
    config.default_retry = false;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(read_timeout);
    config.write_timeout = Some(timeout);
    config.reset_reader_on_write = true;
    let url = config.cluster_url.to_string();
    let auth = AuthSource::of(&config.auth_info);
    let client = kube::Client::try_from(config)
        .map_err(|e| format!("cannot build a client: {}", chain(&e)))?;
    Ok((url, client, auth))
}

/// Why a call got no usable answer.
enum CallError {
    /// The API server answered with an error `Status`.
    Api(Box<Status>),
    /// No answer: connection, TLS or protocol failure (text without material).
    Transport(String),
    /// The answer is not a Secret (text without material).
    Decode(String),
    /// No answer before the call's deadline ([`super::deadline`]).
    Timeout,
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Api(st) => write!(f, "{} {}: {}", st.code, st.reason, st.message),
            CallError::Transport(t) | CallError::Decode(t) => f.write_str(t),
            CallError::Timeout => write!(f, "no answer within {}", super::deadline::limit_text()),
        }
    }
}

/// Which layout a key uses, with what was read.
enum View {
    /// Mutable layout: Secret `<name>` (absent for a new key).
    Single { obj: Option<SecretObj>, meta: Meta },
    /// Secret-per-version layout: the index (absent while an immutable original is adopted).
    Index {
        index: Option<SecretObj>,
        meta: Meta,
    },
}

impl View {
    fn meta(&self) -> &Meta {
        match self {
            View::Single { meta, .. } | View::Index { meta, .. } => meta,
        }
    }
}

/// The `keyplan.io/versions` annotation.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    format: u32,
    current: Option<u64>,
    pending: Option<u64>,
    versions: Vec<VersionMeta>,
    /// The plans holding the key ([`Kms::hold`]): holder id -> since (Unix seconds).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    holders: BTreeMap<String, u64>,
}

/// One version in [`Meta`]; `secret`/`data_key` only in the secret-per-version layout.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct VersionMeta {
    version: u64,
    created_at: u64,
    state: VersionState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    data_key: Option<String>,
}

impl book::Entry for VersionMeta {
    fn number(&self) -> u64 {
        self.version
    }
    fn state_mut(&mut self) -> &mut VersionState {
        &mut self.state
    }
}

impl VersionMeta {
    fn new(version: u64, state: VersionState) -> VersionMeta {
        VersionMeta {
            version,
            created_at: crate::clock::now_unix(),
            state,
            secret: None,
            data_key: None,
        }
    }
}

impl Meta {
    fn empty() -> Meta {
        Meta {
            format: 1,
            current: None,
            pending: None,
            versions: Vec::new(),
            holders: BTreeMap::new(),
        }
    }

    fn find(&self, version: u64) -> Option<&VersionMeta> {
        self.versions.iter().find(|v| v.version == version)
    }

    /// The version rules' view of this record.
    fn book(&self) -> VersionBook {
        VersionBook::of_entries(self.current, self.pending, &self.versions)
    }

    fn to_json(&self) -> String {
        // Plain numbers, strings and enums only: encoding cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    fn to_state(&self) -> KeyState {
        KeyState {
            current: self.current,
            pending: self.pending,
            versions: self
                .versions
                .iter()
                .map(|v| {
                    (
                        v.version,
                        VersionInfo {
                            version: v.version,
                            created_at: v.created_at,
                            state: v.state,
                        },
                    )
                })
                .collect(),
            holders: self.holders.clone(),
        }
    }
}

/// A core/v1 Secret as keyplan reads and writes it: every field of the API object, with
/// `data` values in zeroizing buffers (k8s-openapi's `Secret` keeps them in plain vectors and
/// prints them in `Debug`). `stringData` is write-only in the API and never returned.
#[derive(Serialize, Deserialize)]
struct SecretObj {
    #[serde(rename = "apiVersion", default = "api_version_v1")]
    api_version: String,
    #[serde(default = "kind_secret")]
    kind: String,
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    immutable: Option<bool>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    type_: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    data: BTreeMap<String, Material>,
}

fn api_version_v1() -> String {
    "v1".to_string()
}

fn kind_secret() -> String {
    "Secret".to_string()
}

impl SecretObj {
    fn new(name: &str, namespace: &str) -> SecretObj {
        SecretObj {
            api_version: api_version_v1(),
            kind: kind_secret(),
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                ..ObjectMeta::default()
            },
            immutable: None,
            type_: Some("Opaque".to_string()),
            data: BTreeMap::new(),
        }
    }

    fn is_immutable(&self) -> bool {
        self.immutable == Some(true)
    }

    fn annotation(&self, name: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(name))
            .map(String::as_str)
    }

    fn set_annotation(&mut self, name: &str, value: Option<String>) {
        let map = self.metadata.annotations.get_or_insert_with(BTreeMap::new);
        match value {
            Some(v) => {
                map.insert(name.to_string(), v);
            }
            None => {
                map.remove(name);
            }
        }
    }

    fn set_label(&mut self, name: &str, value: &str) {
        self.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(name.to_string(), value.to_string());
    }

    /// Moves `data[data_key]` out as a passphrase (None when absent).
    fn take(&mut self, data_key: &str) -> Option<Passphrase> {
        self.data
            .get_mut(data_key)
            .map(|m| Passphrase::new(std::mem::take(&mut *m.0)))
    }
}

impl fmt::Debug for SecretObj {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretObj")
            .field("name", &self.metadata.name)
            .field("resource_version", &self.metadata.resource_version)
            .field("immutable", &self.immutable)
            .field("data_keys", &self.data.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// One `data` value: bytes in a zeroizing buffer, base64 on the wire, redacted in `Debug`.
struct Material(Zeroizing<Vec<u8>>);

impl Material {
    fn copy(bytes: &[u8]) -> Material {
        let mut v = Zeroizing::new(Vec::with_capacity(bytes.len()));
        v.extend_from_slice(bytes);
        Material(v)
    }
}

impl fmt::Debug for Material {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<redacted {} bytes>", self.0.len())
    }
}

impl Serialize for Material {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Streams the base64 text into the output: no intermediate string.
        s.collect_str(&base64::display::Base64Display::new(
            &self.0,
            &base64::engine::general_purpose::STANDARD,
        ))
    }
}

impl<'de> Deserialize<'de> for Material {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Material;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a base64 string")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Material, E> {
                let mut buf =
                    Zeroizing::new(Vec::with_capacity(base64::decoded_len_estimate(s.len())));
                base64::engine::general_purpose::STANDARD
                    .decode_vec(s, &mut buf)
                    .map_err(|_| E::custom("a data value is not valid base64"))?;
                Ok(Material(buf))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Material, E> {
                Ok(Material(Zeroizing::new(Vec::new())))
            }
        }
        d.deserialize_any(V)
    }
}

/// JSON of `obj` in a zeroizing buffer sized so that encoding does not reallocate (which
/// would leave copies of the material behind).
fn encode_secret(obj: &SecretObj) -> Result<Zeroizing<Vec<u8>>, CallError> {
    let meta_len = serde_json::to_vec(&obj.metadata)
        .map(|v| v.len())
        .unwrap_or(0);
    let data_len: usize = obj
        .data
        .iter()
        .map(|(k, v)| k.len() * 2 + v.0.len() * 4 / 3 + 16)
        .sum();
    let mut buf = Zeroizing::new(Vec::with_capacity(meta_len * 2 + data_len * 2 + 1024));
    serde_json::to_writer(&mut *buf, obj)
        .map_err(|e| CallError::Transport(format!("cannot encode the Secret: {e}")))?;
    Ok(buf)
}

/// Parses an API answer as a Secret. The parser's own messages never quote data values (the
/// base64 decoder's error is replaced), so they are safe to show.
fn decode_secret(buf: &[u8]) -> Result<SecretObj, CallError> {
    serde_json::from_slice(buf).map_err(|e| {
        CallError::Decode(format!(
            "{} at line {} column {}",
            match e.classify() {
                serde_json::error::Category::Data => "unexpected content",
                serde_json::error::Category::Syntax => "invalid JSON",
                serde_json::error::Category::Eof => "truncated JSON",
                serde_json::error::Category::Io => "read error",
            },
            e.line(),
            e.column()
        ))
    })
}

/// Copies `bytes` into a zeroizing buffer and wipes the original when nobody else holds it.
fn take_zeroizing(bytes: Bytes) -> Zeroizing<Vec<u8>> {
    let mut v = Zeroizing::new(Vec::with_capacity(bytes.len()));
    v.extend_from_slice(&bytes);
    if let Ok(mut m) = bytes.try_into_mut() {
        m[..].zeroize();
    }
    v
}

/// An error and its sources, joined by ": " (repeated texts dropped).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = s.source();
    }
    parts.join(": ")
}

/// A kubeconfig error without the file's content (a YAML error may quote a credential).
fn kubeconfig_error(e: &KubeconfigError) -> String {
    match e {
        KubeconfigError::Parse(_) => {
            "the kubeconfig is not valid YAML (details withheld: they could quote a credential)"
                .to_string()
        }
        other => chain(other),
    }
}

/// RFC 1123 label: namespace names (lowercase alphanumerics and '-', 1-63 characters,
/// alphanumeric at both ends).
fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// RFC 1123 subdomain: Secret names (labels joined by '.', at most 253 characters).
fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// A valid Secret data key: `[-._a-zA-Z0-9]+`, at most 253 characters.
fn is_data_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
        && s != "."
        && s != ".."
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_dns1123_subdomain("rook-ceph-osd-encryption-key-pvc0"));
        assert!(is_dns1123_subdomain("a.b-c"));
        assert!(!is_dns1123_subdomain("Data_Kek"));
        assert!(!is_dns1123_subdomain("-a"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
        assert!(is_dns1123_label("rook-ceph"));
        assert!(!is_dns1123_label("rook.ceph"));
        assert!(is_data_key("dmcrypt-key"));
        assert!(!is_data_key("a/b"));
    }

    #[test]
    fn material_is_redacted_and_round_trips() {
        let json = r#"{"metadata":{"name":"k"},"data":{"dmcrypt-key":"c2VjcmV0LXBhc3M="}}"#;
        let obj: SecretObj = serde_json::from_str(json).unwrap();
        assert_eq!(&obj.data["dmcrypt-key"].0[..], b"secret-pass");
        let dbg = format!("{obj:?} {:?}", obj.data["dmcrypt-key"]);
        assert!(
            !dbg.contains("secret-pass") && !dbg.contains("c2VjcmV0"),
            "{dbg}"
        );
        let out = encode_secret(&obj).ok().unwrap();
        let back: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back["data"]["dmcrypt-key"], "c2VjcmV0LXBhc3M=");
        assert_eq!(back["kind"], "Secret");
        let bad = r#"{"data":{"k":"not base64 !!"}}"#;
        let err = decode_secret(bad.as_bytes()).err().map(|e| match e {
            CallError::Decode(d) => d,
            _ => String::new(),
        });
        assert!(err.is_some_and(|d| !d.contains("not base64 !!")));
    }
}
