//! What keyplan keeps in each KMS, and the `exec` KMS protocol (docs/formats.md, "KMS
//! layouts"): one data type per stored document, with its version, and the version check each
//! reader makes before it trusts (or rewrites) what it read.
//!
//! The providers (`crate::kms::*`) convert these types to and from their own; a change to a
//! provider's types changes no layout. Documents a newer keyplan wrote are refused with
//! [`NewerFormat`] naming the KMS instance and key ([`ReadError::Newer`]); the provider writes
//! nothing then. Fixtures of every version are under `tests/fixtures/formats/kms-*/`, read back
//! by tests/kms/formats.rs.
//!
//! - [`file`](mod@file): the file KMS's `meta.json`;
//! - [`vault`]: the Vault / OpenBao KV v2 fields;
//! - [`kubernetes`]: the `keyplan.io/versions` annotation;
//! - [`kmip`]: the Application Specific Information of KMIP objects;
//! - [`aws`]: the AWS Secrets Manager record secret `<prefix><name>.keyplan`;
//! - [`exec`]: the `exec` protocol's version;
//! - [`holders`]: the holder and vote records every layout keeps.

pub mod aws;
pub mod exec;
pub mod file;
pub mod holders;
pub mod kmip;
pub mod kubernetes;
pub mod vault;

use serde::{Deserialize, Serialize};

use super::{Format, NewerFormat};

/// The formats of this module ([`super::all`]).
pub const FORMATS: &[Format] = &[
    file::FORMAT,
    vault::FORMAT,
    kubernetes::FORMAT,
    kmip::FORMAT,
    aws::FORMAT,
    exec::FORMAT,
];

/// Why a stored KMS document could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// It was written in a newer version of its format: refuse, write nothing.
    Newer(NewerFormat),
    /// It is not a document of any version this keyplan knows (the parser's words; never
    /// material: these documents hold none).
    Invalid(String),
}

/// The lifecycle state of one key version, as stored (lowercase names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoredState {
    /// `pending`: staged, not committed.
    Pending,
    /// `current`: the version devices open with.
    Current,
    /// `previous`: superseded, material kept.
    Previous,
    /// `retired`: material destroyed, metadata kept.
    Retired,
}

/// One key version as the file KMS's `meta.json` and the `exec` protocol's `read` result
/// carry it: `{"version":N,"created_at":UNIX_SECONDS,"state":"current"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionEntry {
    /// Version number, from 1.
    pub version: u64,
    /// Creation time, Unix seconds (UTC).
    pub created_at: u64,
    /// Lifecycle state.
    pub state: StoredState,
}

/// The integer version carried by field `field` of the JSON object `bytes`, without reading
/// the rest (so that a newer document whose other fields changed is still recognised as
/// newer). `Ok(None)`: the field is absent; `Err`: not JSON, not an object, or the field is
/// not a whole number.
pub fn probe_version(bytes: &[u8], field: &str) -> Result<Option<u64>, String> {
    let doc: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    match doc.get(field) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("`{field}` is {n}, not a whole number")),
        Some(other) => Err(format!("`{field}` is {other}, not a number")),
    }
}

/// Reads a JSON document of `format` whose version is the integer field `field` (absent:
/// `absent_is`): refuses a version above `newest` with [`ReadError::Newer`] naming `document`,
/// then parses the whole document as `T`.
pub fn read_json<T: serde::de::DeserializeOwned>(
    format: &Format,
    document: &str,
    bytes: &[u8],
    field: &str,
    absent_is: u64,
    newest: u64,
) -> Result<T, ReadError> {
    let found = probe_version(bytes, field)
        .map_err(ReadError::Invalid)?
        .unwrap_or(absent_is);
    super::check_version(format, document, found, newest).map_err(ReadError::Newer)?;
    serde_json::from_slice(bytes).map_err(|e| ReadError::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_reads_the_version_alone() {
        assert_eq!(probe_version(br#"{"format":2,"x":[}"#, "format").ok(), None);
        assert_eq!(
            probe_version(br#"{"format":2,"new":{"a":1}}"#, "format"),
            Ok(Some(2))
        );
        assert_eq!(probe_version(br#"{"other":1}"#, "format"), Ok(None));
        assert!(probe_version(br#"{"format":"2"}"#, "format").is_err());
        assert!(probe_version(br#"[1]"#, "format").is_err());
    }
}
