//! The file KMS's `<path>/<key>/meta.json` (src/kms/file.rs; docs/operations.md, "File KMS
//! layout"), version 1:
//!
//! ```text
//! {
//!   "format": 1,
//!   "current": N | null,
//!   "pending": N | null,
//!   "versions": [{"version": N, "created_at": UNIX_SECONDS, "state": "current"}, ...],
//!   "holders": {"<holder id>": SINCE, ...}        (absent when empty)
//! }
//! ```
//!
//! Pretty-printed JSON (two spaces), one newline at the end. Unknown fields are refused
//! (`deny_unknown_fields`), but only after the version: a newer `meta.json` is refused as
//! newer ([`ReadError::Newer`]), not as damaged.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{read_json, ReadError, VersionEntry};
use crate::format::Format;

/// The version of `meta.json` this keyplan writes, and the newest it reads.
pub const VERSION: u64 = 1;

/// The file KMS's `meta.json`.
pub const FORMAT: Format = Format {
    name: "kms-file-meta",
    writes: "1",
    reads: "1",
    home: "<path>/<key>/meta.json (file KMS)",
};

/// `meta.json`, version 1.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileMeta {
    /// Format version: [`VERSION`] when written by this keyplan.
    pub format: u64,
    /// The current version, if any.
    pub current: Option<u64>,
    /// The pending version, if any.
    pub pending: Option<u64>,
    /// Every version known, in the order they were staged.
    pub versions: Vec<VersionEntry>,
    /// The holder and vote records ([`super::holders`]): id -> since (Unix seconds).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub holders: BTreeMap<String, u64>,
}

impl FileMeta {
    /// Reads `meta.json`'s bytes; `document` names it in a refusal (the KMS instance, the key
    /// and the path).
    ///
    /// Errors: [`ReadError::Newer`] for a `format` above [`VERSION`] (whatever else the file
    /// holds); [`ReadError::Invalid`] for anything else that is not version 1.
    pub fn parse(bytes: &[u8], document: &str) -> Result<FileMeta, ReadError> {
        let meta: FileMeta = read_json(&FORMAT, document, bytes, "format", 0, VERSION)?;
        if meta.format == 0 {
            return Err(ReadError::Invalid("`format` is 0".into()));
        }
        Ok(meta)
    }

    /// The bytes this keyplan writes: version [`VERSION`], pretty JSON, a final newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let meta = FileMeta {
            format: VERSION,
            ..self.clone()
        };
        // Numbers, strings and enums only: encoding cannot fail.
        let mut text = serde_json::to_vec_pretty(&meta).unwrap_or_default();
        text.push(b'\n');
        text
    }
}
