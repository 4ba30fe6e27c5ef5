//! The `kubernetes` provider's talk with the API server: the [`KubernetesKms`] handle, the
//! requests on Secrets and SelfSubjectAccessReviews (bounded by the call's deadline), the
//! Secret as keyplan reads and writes it on the wire (material in zeroizing buffers), and how
//! failures map to [`KmsError`]s. Where keyplan keeps versions in Secrets is `layout.rs`.

pub(crate) use crate::kube_client::chain;
use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use bytes::Bytes;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::client::Body;
use kube::core::params::{DeleteParams, GetParams, PostParams, Preconditions};
use kube::core::Status;
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, Zeroizing};

use super::auth::AuthSource;
use crate::kms::{block_on, Kms, KmsError};
use crate::secret::Passphrase;

/// Most bytes the `data` values of one Secret may hold together (Kubernetes API reference,
/// Secret v1: "total size ... limited to 1MiB"; enforced by the API server with 422 Invalid).
pub const MAX_SECRET_DATA_BYTES: usize = 1 << 20;

/// A Kubernetes namespace as a key store (see the module documentation for the layout).
///
/// Safe to share between threads; every call runs on keyplan's shared runtime
/// ([`crate::kms::block_on`]) and each request is bounded by what is left of its call's deadline
/// ([`crate::kms::deadline`]).
pub struct KubernetesKms {
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) data_key: String,
    pub(super) cluster_url: String,
    pub(super) client: kube::Client,
    pub(super) auth: AuthSource,
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
    fn secrets_path(&self) -> String {
        format!("/api/v1/namespaces/{}/secrets", self.namespace)
    }

    /// Runs `fut` (one KMS call's requests) on the shared runtime ([`block_on`]).
    pub(super) fn run<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, KmsError>>,
    ) -> Result<T, KmsError> {
        block_on(&self.describe(), fut)?
    }

    /// Sends one request (body `body` replacing the request's own when given), bounded by
    /// what is left of its call's deadline ([`crate::kms::deadline::remaining`]); returns the 2xx
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
        match tokio::time::timeout(crate::kms::deadline::remaining(), call).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout),
        }
    }

    /// `GET` of Secret `name`; `None` when it does not exist (404).
    pub(super) async fn get_secret(&self, name: &str) -> Result<Option<SecretObj>, CallError> {
        let req = kube::core::Request::new(self.secrets_path()).get(name, &GetParams::default());
        match self.send(req, None).await {
            Ok(buf) => decode_secret(&buf).map(Some),
            Err(CallError::Api(st)) if st.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `POST` of a new Secret.
    pub(super) async fn create_secret(&self, obj: &SecretObj) -> Result<SecretObj, CallError> {
        let body = encode_secret(obj)?;
        let req =
            kube::core::Request::new(self.secrets_path()).create(&PostParams::default(), vec![]);
        let buf = self.send(req, Some(body)).await?;
        after_write()?;
        decode_secret(&buf)
    }

    /// `PUT` of `obj`, conditional on its `metadata.resourceVersion`.
    pub(super) async fn replace_secret(&self, obj: &SecretObj) -> Result<SecretObj, CallError> {
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
        let buf = self.send(req, Some(body)).await?;
        after_write()?;
        decode_secret(&buf)
    }

    /// `DELETE` of Secret `name` (with `preconditions`); false when it did not exist.
    pub(super) async fn delete_secret(
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
            Ok(_) => after_write().map(|()| true),
            Err(CallError::Api(st)) if st.code == 404 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// May keyplan's identity do `verb` on Secrets (named `name`) in the namespace? Asked
    /// with a SelfSubjectAccessReview (authorization.k8s.io/v1), which persists nothing.
    pub(super) async fn may(
        &self,
        verb: &str,
        name: Option<&str>,
    ) -> Result<(bool, String), CallError> {
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
    pub(super) fn fail(&self, key: &str, what: &str, e: CallError) -> KmsError {
        let kms = self.describe();
        match e {
            CallError::Timeout => KmsError::Timeout {
                kms,
                detail: format!(
                    "{what}: no answer from {} within {}",
                    self.cluster_url,
                    crate::kms::deadline::limit_text()
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
}

/// Why a call got no usable answer.
pub(super) enum CallError {
    /// The API server answered with an error `Status`.
    Api(Box<Status>),
    /// No answer: connection, TLS or protocol failure (text without material).
    Transport(String),
    /// The answer is not a Secret (text without material).
    Decode(String),
    /// No answer before the call's deadline ([`crate::kms::deadline`]).
    Timeout,
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Api(st) => write!(f, "{} {}: {}", st.code, st.reason, st.message),
            CallError::Transport(t) | CallError::Decode(t) => f.write_str(t),
            CallError::Timeout => {
                write!(f, "no answer within {}", crate::kms::deadline::limit_text())
            }
        }
    }
}

/// A core/v1 Secret as keyplan reads and writes it: every field of the API object, with
/// `data` values in zeroizing buffers (k8s-openapi's `Secret` keeps them in plain vectors and
/// prints them in `Debug`). `stringData` is write-only in the API and never returned.
#[derive(Serialize, Deserialize)]
pub(super) struct SecretObj {
    #[serde(rename = "apiVersion", default = "api_version_v1")]
    api_version: String,
    #[serde(default = "kind_secret")]
    kind: String,
    #[serde(default)]
    pub(super) metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) immutable: Option<bool>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    type_: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) data: BTreeMap<String, Material>,
}

fn api_version_v1() -> String {
    "v1".to_string()
}

fn kind_secret() -> String {
    "Secret".to_string()
}

impl SecretObj {
    /// An empty Opaque Secret `name` in `namespace`, to be created.
    pub(super) fn new(name: &str, namespace: &str) -> SecretObj {
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

    /// Whether the Secret is immutable (`immutable: true`).
    pub(super) fn is_immutable(&self) -> bool {
        self.immutable == Some(true)
    }

    /// The value of annotation `name`, if set.
    pub(super) fn annotation(&self, name: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(name))
            .map(String::as_str)
    }

    /// Sets annotation `name` to `value`, or removes it (`None`).
    pub(super) fn set_annotation(&mut self, name: &str, value: Option<String>) {
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

    /// Sets label `name` to `value`.
    pub(super) fn set_label(&mut self, name: &str, value: &str) {
        self.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(name.to_string(), value.to_string());
    }

    /// Moves `data[data_key]` out as a passphrase (None when absent).
    pub(super) fn take(&mut self, data_key: &str) -> Option<Passphrase> {
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
pub(super) struct Material(pub(super) Zeroizing<Vec<u8>>);

impl Material {
    /// A copy of `bytes` in a zeroizing buffer of exactly their size.
    pub(super) fn copy(bytes: &[u8]) -> Material {
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

/// Evaluates the `kms.after_write` injection point (crate::failpoint): a write request was
/// answered with success; an injected error is a [`CallError::Transport`].
fn after_write() -> Result<(), CallError> {
    crate::failpoint::check("kms.after_write").map_err(CallError::Transport)
}

#[cfg(test)]
mod tests {
    use super::*;

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
