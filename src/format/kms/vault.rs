//! The `vault` KMS's fields in KV version 2 (src/kms/vault/layout.rs; docs/kms/vault.md).
//!
//! Every value is a string (KV data as `bao kv put` writes it). The main path
//! `<mount>/data/<name>` holds, in each KV version keyplan writes:
//!
//! - `<last path component of name>`: the passphrase (where Rook reads it);
//! - [`FIELD_FORMAT`] `"2"` (version 2 on; absent in version 1);
//! - [`FIELD_VERSION`], [`FIELD_CREATED_AT`]: keyplan's version number and its creation time;
//! - [`FIELD_HISTORY`]: the earlier versions, `[[version, kv_version, created_at], ...]`;
//! - [`FIELD_HOLDERS`] (when not empty): the holder and vote records ([`super::holders`]).
//!
//! A tombstone (`destroy_key`) holds [`FIELD_DESTROYED_AT`] (and [`FIELD_FORMAT`]) only. The
//! pending path `<name>.keyplan-pending` holds [`FIELD_PASSPHRASE`], [`FIELD_FORMAT`],
//! [`FIELD_VERSION`], [`FIELD_CREATED_AT`], [`FIELD_BASE`] and [`FIELD_BASE_VERSION`].
//!
//! Versions: **1** is the layout without [`FIELD_FORMAT`] (keyplan up to commit c322096);
//! **2** adds `keyplan_format: "2"` to every KV version keyplan writes, and nothing else. This
//! keyplan reads both and refuses a higher one ([`check`]).

use serde_json::{Map, Value};

use super::ReadError;
use crate::format::Format;

/// The version this keyplan writes, and the newest it reads.
pub const VERSION: u64 = 2;
/// [`VERSION`] as written: a decimal string.
pub const VERSION_TEXT: &str = "2";

/// keyplan's fields in a KV v2 mount.
pub const FORMAT: Format = Format {
    name: "kms-vault",
    writes: "2",
    reads: "1-2",
    home: "KV v2 <mount>/data/<name> and <name>.keyplan-pending (vault KMS)",
};

/// Data field with the layout's version (decimal string); absent: version 1.
pub const FIELD_FORMAT: &str = "keyplan_format";
/// Data field with keyplan's version number (decimal string).
pub const FIELD_VERSION: &str = "keyplan_version";
/// Data field with the version's creation time (Unix seconds, decimal string).
pub const FIELD_CREATED_AT: &str = "keyplan_created_at";
/// Data field with the earlier versions, compact JSON `[[version, kv_version, created_at], ...]`.
pub const FIELD_HISTORY: &str = "keyplan_history";
/// Data field with the holder and vote records, compact JSON `{"<id>": <since>, ...}`; absent
/// when there is none.
pub const FIELD_HOLDERS: &str = "keyplan_holders";
/// Data field of the tombstone `destroy_key` writes before deleting the key (Unix seconds).
pub const FIELD_DESTROYED_AT: &str = "keyplan_destroyed_at";
/// Data field of the pending secret holding the passphrase.
pub const FIELD_PASSPHRASE: &str = "passphrase";
/// Data field of the pending secret: the KV version of the main path it was staged on (`0`:
/// none).
pub const FIELD_BASE: &str = "keyplan_base_kv_version";
/// Data field of the pending secret: the keyplan version that was current when it was staged
/// (`0`: none).
pub const FIELD_BASE_VERSION: &str = "keyplan_base_version";

/// The version of the KV data `data` (one KV version of a main or pending path): 1 when it
/// has no [`FIELD_FORMAT`]; `document` names the KMS instance, key and path in a refusal.
///
/// Errors: [`ReadError::Newer`] above [`VERSION`]; [`ReadError::Invalid`] when the field is
/// not a whole number.
pub fn check(data: &Map<String, Value>, document: &str) -> Result<u64, ReadError> {
    let found = match data.get(FIELD_FORMAT) {
        None | Some(Value::Null) => 1,
        Some(Value::String(s)) => s.trim().parse().map_err(|_| {
            ReadError::Invalid(format!("{FIELD_FORMAT} is {s:?}, not a whole number"))
        })?,
        Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
            ReadError::Invalid(format!("{FIELD_FORMAT} is {n}, not a whole number"))
        })?,
        Some(other) => {
            return Err(ReadError::Invalid(format!(
                "{FIELD_FORMAT} is {other}, not a number"
            )))
        }
    };
    crate::format::check_version(&FORMAT, document, found, VERSION).map_err(ReadError::Newer)?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn versionless_data_is_version_1_and_newer_is_refused() {
        let d = data(serde_json::json!({"k": "p", FIELD_VERSION: "1"}));
        assert_eq!(check(&d, "x"), Ok(1));
        let d = data(serde_json::json!({FIELD_FORMAT: "2"}));
        assert_eq!(check(&d, "x"), Ok(2));
        let d = data(serde_json::json!({FIELD_FORMAT: "3"}));
        assert!(matches!(check(&d, "x"), Err(ReadError::Newer(n)) if n.found == "3"));
        let d = data(serde_json::json!({FIELD_FORMAT: "two"}));
        assert!(matches!(check(&d, "x"), Err(ReadError::Invalid(_))));
    }
}
