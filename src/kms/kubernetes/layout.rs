//! Where the `kubernetes` provider keeps a key's versions (the layouts of `mod.rs`'s module
//! documentation): the names of the Secrets, annotations, labels and data keys, the versions
//! annotation ([`Meta`]), which layout a key uses ([`View`]) and how it reads back, the
//! conditional writes of the versions record, and the Kubernetes naming rules keyplan checks.

use std::collections::BTreeMap;

use super::client::{KubernetesKms, SecretObj};
use crate::format::kms::kubernetes::{VersionRecord, Versions};
use crate::kms::book::{self, show, VersionBook};
use crate::kms::{KeyState, Kms, KmsError, VersionInfo, VersionState};
use crate::secret::Passphrase;

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

impl KubernetesKms {
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

    /// `Secret <namespace>/<key>`, for messages.
    pub(super) fn label(&self, key: &str) -> String {
        format!("Secret {}/{key}", self.namespace)
    }

    /// Reads the key's Secrets and decides the layout.
    pub(super) async fn load(&self, key: &str) -> Result<View, KmsError> {
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
        let document = KmsError::document(
            self,
            key,
            &format!("annotation {VERSIONS_ANNOTATION} of {}", self.label(secret)),
        );
        let meta: Meta = Versions::parse(text, &document)
            .map(Meta::from)
            .map_err(|e| {
                KmsError::of_read(self, key, e, |why| format!(
                    "{}: annotation {VERSIONS_ANNOTATION} is not valid: {why}; nothing was changed. Restore the annotation from a backup or fix it by hand (docs/kms/kubernetes.md)",
                    self.label(secret)
                ))
            })?;
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
                    current: Some(1),
                    versions: vec![VersionMeta {
                        created_at,
                        ..VersionMeta::new(1, VersionState::Current)
                    }],
                    ..Meta::empty()
                })
            }
            None => Ok(Meta::empty()),
        }
    }

    /// Writes the index Secret of the secret-per-version layout (conditional `PUT`, or `POST`
    /// when it does not exist yet).
    pub(super) async fn write_index(
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
    pub(super) async fn write_single(
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

    /// The material of indexed version `v` (None: its Secret or data key is gone).
    pub(super) async fn fetch_indexed(
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
}

/// Which layout a key uses, with what was read.
pub(super) enum View {
    /// Mutable layout: Secret `<name>` (absent for a new key).
    Single { obj: Option<SecretObj>, meta: Meta },
    /// Secret-per-version layout: the index (absent while an immutable original is adopted).
    Index {
        index: Option<SecretObj>,
        meta: Meta,
    },
}

impl View {
    /// The versions record read, whichever the layout.
    pub(super) fn meta(&self) -> &Meta {
        match self {
            View::Single { meta, .. } | View::Index { meta, .. } => meta,
        }
    }
}

/// The `keyplan.io/versions` annotation as the provider works on it; stored as [`Versions`]
/// (src/format/kms/kubernetes.rs, the layout and its version).
#[derive(Debug, Clone)]
pub(super) struct Meta {
    pub(super) current: Option<u64>,
    pub(super) pending: Option<u64>,
    pub(super) versions: Vec<VersionMeta>,
    /// The plans holding the key ([`Kms::hold`]): holder id -> since (Unix seconds).
    pub(super) holders: BTreeMap<String, u64>,
    /// Fields of the annotation this keyplan does not know, written back as they were.
    extra: BTreeMap<String, serde_json::Value>,
}

/// One version in [`Meta`]; `secret`/`data_key` only in the secret-per-version layout.
#[derive(Debug, Clone)]
pub(super) struct VersionMeta {
    version: u64,
    created_at: u64,
    pub(super) state: VersionState,
    pub(super) secret: Option<String>,
    pub(super) data_key: Option<String>,
    /// Fields of the entry this keyplan does not know, written back as they were.
    extra: BTreeMap<String, serde_json::Value>,
}

impl From<Versions> for Meta {
    fn from(v: Versions) -> Meta {
        Meta {
            current: v.current,
            pending: v.pending,
            versions: v
                .versions
                .into_iter()
                .map(|r| VersionMeta {
                    version: r.version,
                    created_at: r.created_at,
                    state: r.state.into(),
                    secret: r.secret,
                    data_key: r.data_key,
                    extra: r.extra,
                })
                .collect(),
            holders: v.holders,
            extra: v.extra,
        }
    }
}

impl From<&Meta> for Versions {
    fn from(m: &Meta) -> Versions {
        Versions {
            format: crate::format::kms::kubernetes::VERSION,
            current: m.current,
            pending: m.pending,
            versions: m
                .versions
                .iter()
                .map(|v| VersionRecord {
                    version: v.version,
                    created_at: v.created_at,
                    state: v.state.into(),
                    secret: v.secret.clone(),
                    data_key: v.data_key.clone(),
                    extra: v.extra.clone(),
                })
                .collect(),
            holders: m.holders.clone(),
            extra: m.extra.clone(),
        }
    }
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
    /// A version entry created now, in `state`, with no Secret or data key recorded.
    pub(super) fn new(version: u64, state: VersionState) -> VersionMeta {
        VersionMeta {
            version,
            created_at: crate::clock::now_unix(),
            state,
            secret: None,
            data_key: None,
            extra: BTreeMap::new(),
        }
    }
}

impl Meta {
    fn empty() -> Meta {
        Meta {
            current: None,
            pending: None,
            versions: Vec::new(),
            holders: BTreeMap::new(),
            extra: BTreeMap::new(),
        }
    }

    /// The entry of `version`, if recorded.
    pub(super) fn find(&self, version: u64) -> Option<&VersionMeta> {
        self.versions.iter().find(|v| v.version == version)
    }

    /// The version rules' view of this record.
    pub(super) fn book(&self) -> VersionBook {
        VersionBook::of_entries(self.current, self.pending, &self.versions)
    }

    /// The annotation's text: compact JSON ([`Versions::to_text`]), the fields this keyplan
    /// does not know kept.
    pub(super) fn to_json(&self) -> String {
        Versions::from(self).to_text()
    }

    /// The record as a [`KeyState`].
    pub(super) fn to_state(&self) -> KeyState {
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

/// RFC 1123 label: namespace names (lowercase alphanumerics and '-', 1-63 characters,
/// alphanumeric at both ends).
pub(super) fn is_dns1123_label(s: &str) -> bool {
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
pub(super) fn is_data_key(s: &str) -> bool {
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
}
