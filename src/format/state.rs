//! The state directory's documents other than the journal, keyplan's LUKS2 token and its LUKS1
//! records (docs/formats.md, "The state directory" and "The LUKS2 header").
//!
//! Each document is a data type of its own here, with its version, apart from the engine's
//! types in src/world/ (which convert to and from these): [`files`] holds `owner.json`,
//! `devices.json`, `copies.json` and `kept.json`; [`records`] the LUKS2 `keyplan` token and
//! the LUKS1 record files; [`signed_plan`] the agent's last good signed plan. Every reader
//! checks the version first and refuses a newer one with [`NewerFormat`] (never "corrupt"), so
//! a read-modify-write of a newer document stops before it writes anything. Writing today's
//! version reproduces the fixtures under `tests/fixtures/formats/<name>/v<N>/` byte for byte
//! (tests/verification/formats_state.rs).

pub mod files;
pub mod records;
pub mod signed_plan;

use super::{Format, NewerFormat};

/// `<state_dir>/owner.json`: the plan that owns the state directory.
pub const OWNER: Format = Format {
    name: "owner-json",
    writes: "1",
    reads: "1",
    home: "<state_dir>/owner.json",
};

/// `<state_dir>/devices.json`: every device a run has touched.
pub const DEVICES: Format = Format {
    name: "devices-json",
    writes: "1",
    reads: "1",
    home: "<state_dir>/devices.json",
};

/// `<state_dir>/copies.json`: keyslots found opening with a retired key version.
pub const COPIES: Format = Format {
    name: "copies-json",
    writes: "1",
    reads: "1",
    home: "<state_dir>/copies.json",
};

/// `<state_dir>/kept.json`: KMS entries a migration kept for devices outside the move.
pub const KEPT: Format = Format {
    name: "kept-json",
    writes: "1",
    reads: "1",
    home: "<state_dir>/kept.json",
};

/// `<state_dir>/luks1/<LUKS UUID>.json`: keyplan's records of a LUKS1 device's keyslots.
/// Version 1 is the file without a `format` field (keyplan before issue 47).
pub const LUKS1_RECORDS: Format = Format {
    name: "luks1-records",
    writes: "2",
    reads: "1-2",
    home: "<state_dir>/luks1/<LUKS UUID>.json",
};

/// The LUKS2 token of type `keyplan`, one per managed keyslot (`keyplan_format`).
pub const LUKS2_TOKEN: Format = Format {
    name: "luks2-token",
    writes: "1",
    reads: "1",
    home: "LUKS2 header tokens of type keyplan",
};

/// `<state_dir>/agent-signed-plan.json`: the agent's last good signed plan. Version 1 is the
/// file without a `format` field (keyplan before issue 47).
pub const SIGNED_PLAN: Format = Format {
    name: "agent-signed-plan",
    writes: "2",
    reads: "1-2",
    home: "<state_dir>/agent-signed-plan.json",
};

/// The formats of this module ([`super::all`]).
pub const FORMATS: &[Format] = &[
    OWNER,
    DEVICES,
    COPIES,
    KEPT,
    LUKS1_RECORDS,
    LUKS2_TOKEN,
    SIGNED_PLAN,
];

/// Why a state document could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// Written by a newer keyplan: refused, nothing written.
    #[error(transparent)]
    Newer(#[from] NewerFormat),
    /// Not a document of a known version of the format: the parser's message (the caller's
    /// error names the file and what to do).
    #[error("{0}")]
    Corrupt(String),
}

/// The version in field `field` of the JSON object `value`: `None` when there is no such
/// field (a document of a version before the field existed).
///
/// Errors: [`ReadError::Corrupt`] when the field is not a positive integer (no keyplan writes
/// 0), or `value` is not an object.
pub fn version_in(value: &serde_json::Value, field: &str) -> Result<Option<u64>, ReadError> {
    let Some(object) = value.as_object() else {
        return Err(ReadError::Corrupt("not a JSON object".into()));
    };
    match object.get(field) {
        None => Ok(None),
        Some(v) => v.as_u64().filter(|n| *n > 0).map(Some).ok_or_else(|| {
            ReadError::Corrupt(format!("`{field}` is {v}, not a format version number"))
        }),
    }
}

/// Parses `bytes` as JSON and checks its integer version (field `field`, `default` when the
/// document has none) against `newest`: the value and its version.
///
/// Errors: [`ReadError::Corrupt`] (not JSON, no object, a bad version field),
/// [`ReadError::Newer`] naming `document`.
pub fn checked(
    format: &Format,
    document: &str,
    bytes: &[u8],
    field: &str,
    default: Option<u64>,
    newest: u64,
) -> Result<(serde_json::Value, u64), ReadError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| ReadError::Corrupt(e.to_string()))?;
    checked_value(format, document, value, field, default, newest)
}

/// [`checked`] of a document already parsed (a LUKS2 token as cryptsetup exported it).
///
/// Errors: as [`checked`], but for the parse.
pub fn checked_value(
    format: &Format,
    document: &str,
    value: serde_json::Value,
    field: &str,
    default: Option<u64>,
    newest: u64,
) -> Result<(serde_json::Value, u64), ReadError> {
    let version = version_in(&value, field)?
        .or(default)
        .ok_or_else(|| ReadError::Corrupt(format!("no `{field}` (format version)")))?;
    super::check_version(format, document, version, newest)?;
    Ok((value, version))
}

/// Deserializes a checked document into its version's type.
///
/// Errors: [`ReadError::Corrupt`] with the parser's message.
pub fn typed<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, ReadError> {
    serde_json::from_value(value).map_err(|e| ReadError::Corrupt(e.to_string()))
}

/// `value` as pretty JSON with a final newline: how every state-directory file is written
/// (the fixtures' bytes).
///
/// Errors: a value that cannot be serialized (a map with non-string keys), as the encoder's
/// message.
pub fn pretty<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, String> {
    let mut text = serde_json::to_vec_pretty(value).map_err(|e| e.to_string())?;
    text.push(b'\n');
    Ok(text)
}

/// The bytes of the state file `path`; `None` when it does not exist.
///
/// Errors: any other I/O error (the caller names the file's role).
pub fn read_file(path: &std::path::Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_checked_before_the_shape() {
        let ok = checked(&OWNER, "o", br#"{"format":1}"#, "format", None, 1);
        assert_eq!(ok.map(|(_, v)| v), Ok(1));
        let newer = checked(&OWNER, "o", br#"{"format":2,"x":[]}"#, "format", None, 1);
        assert!(matches!(newer, Err(ReadError::Newer(_))), "{newer:?}");
        for (text, want) in [
            (&br#"{"format":"2"}"#[..], "not a format version number"),
            (br#"{"plan":"p"}"#, "no `format`"),
            (br#"[1]"#, "not a JSON object"),
            (br#"{"format":"#, "EOF"),
        ] {
            match checked(&OWNER, "o", text, "format", None, 1) {
                Err(ReadError::Corrupt(c)) => assert!(c.contains(want), "{c}"),
                other => panic!("{other:?}"),
            }
        }
        let old = checked(
            &LUKS1_RECORDS,
            "l",
            br#"{"slots":{}}"#,
            "format",
            Some(1),
            2,
        );
        assert_eq!(
            old.map(|(_, v)| v),
            Ok(1),
            "a file without a version is version 1"
        );
    }
}
