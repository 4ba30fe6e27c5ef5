//! The `kubernetes` KMS's version record: the annotation `keyplan.io/versions` of a key's
//! Secret (mutable layout) or of its index Secret `<name>-keyplan` (secret-per-version layout),
//! src/kms/kubernetes/layout.rs; docs/kms/kubernetes.md. Version 1, compact JSON:
//!
//! ```text
//! {"format":1,"current":N|null,"pending":N|null,
//!  "versions":[{"version":N,"created_at":UNIX_SECONDS,"state":"current",
//!               "secret":"<name>-v<N>","data_key":"dmcrypt-key"}, ...],
//!  "holders":{"<holder id>":SINCE, ...}}
//! ```
//!
//! `secret` and `data_key` appear in the secret-per-version layout only; `holders` when not
//! empty. Fields a later version 1 adds are kept as they are through every rewrite
//! ([`Versions::extra`], [`VersionRecord::extra`]); a `format` above [`VERSION`] is refused.
//! The other annotations and labels (`keyplan.io/layout`, `keyplan.io/current-secret`,
//! `app.kubernetes.io/managed-by`, `keyplan.io/key`) and data keys (`<data_key>`,
//! `keyplan.v<N>`) belong to the same version.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{read_json, ReadError, StoredState};
use crate::format::Format;

/// The version of the annotation this keyplan writes, and the newest it reads.
pub const VERSION: u64 = 1;

/// The `keyplan.io/versions` annotation and the Secrets it describes.
pub const FORMAT: Format = Format {
    name: "kms-kubernetes",
    writes: "1",
    reads: "1",
    home: "annotation keyplan.io/versions of Secret <name> or <name>-keyplan (kubernetes KMS)",
};

/// The annotation's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Versions {
    /// Format version, [`VERSION`].
    pub format: u64,
    /// The current version, if any.
    pub current: Option<u64>,
    /// The pending version, if any.
    pub pending: Option<u64>,
    /// Every version known.
    pub versions: Vec<VersionRecord>,
    /// The holder and vote records ([`super::holders`]): id -> since (Unix seconds).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub holders: BTreeMap<String, u64>,
    /// Fields this keyplan does not know (added by a later keyplan within version 1): written
    /// back unchanged.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// One version in [`Versions`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionRecord {
    /// Version number, from 1.
    pub version: u64,
    /// Creation time, Unix seconds.
    pub created_at: u64,
    /// Lifecycle state.
    pub state: StoredState,
    /// Secret-per-version layout: the Secret holding the version's material.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Secret-per-version layout: its data key in that Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_key: Option<String>,
    /// Fields this keyplan does not know: written back unchanged.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Versions {
    /// Reads the annotation's text; `document` names the Secret and key in a refusal.
    ///
    /// Errors: [`ReadError::Newer`] for a `format` above [`VERSION`]; [`ReadError::Invalid`]
    /// for text that is not version 1 (a missing or zero `format` among them).
    pub fn parse(text: &str, document: &str) -> Result<Versions, ReadError> {
        let v: Versions = read_json(&FORMAT, document, text.as_bytes(), "format", 0, VERSION)?;
        if v.format == 0 {
            return Err(ReadError::Invalid("`format` is 0".into()));
        }
        Ok(v)
    }

    /// The annotation's text: compact JSON, `format` [`VERSION`], unknown fields kept.
    pub fn to_text(&self) -> String {
        // Numbers, strings, enums and JSON values only: encoding cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}
