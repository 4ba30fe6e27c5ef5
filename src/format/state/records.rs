//! keyplan's records of keyslots: the LUKS2 `keyplan` token and the LUKS1 record files,
//! written by src/world/records.rs.
//!
//! A record names the key version a keyslot holds and the keyslot's KDF salt then (nothing
//! secret). LUKS2 keeps one token per managed keyslot in the header; LUKS1 has no tokens, so
//! its records live in `<state_dir>/luks1/<LUKS UUID>.json`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{checked, checked_value, typed, ReadError};

/// The `type` of keyplan's LUKS2 tokens.
pub const TOKEN_TYPE: &str = "keyplan";

/// The `keyplan_format` this keyplan writes and the newest it reads.
pub const TOKEN_FORMAT: u64 = 1;

/// A `keyplan` LUKS2 token, `keyplan_format` 1, as imported with `cryptsetup token import`:
/// `{"type":"keyplan","keyslots":["N"],"keyplan_format":1,"slot":N,"key":…,"version":…,
/// "salt":…}` with the optional `kms`, `name` and `pbkdf`. Fields it does not know are
/// ignored (other tools may look at tokens; keyplan never rewrites one in place).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenV1 {
    /// Always [`TOKEN_TYPE`].
    #[serde(rename = "type")]
    pub token_type: String,
    /// The keyslot, as LUKS2 lists a token's keyslots (cryptsetup empties it when the keyslot
    /// is killed).
    pub keyslots: Vec<String>,
    /// Always 1.
    pub keyplan_format: u64,
    /// The keyslot again, kept when cryptsetup empties `keyslots`.
    pub slot: u32,
    /// Key id from the plan.
    pub key: String,
    /// KMS version held by the keyslot.
    pub version: u64,
    /// The keyslot's KDF salt when keyplan wrote the token.
    pub salt: String,
    /// The KMS instance the version lives in (absent in early tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kms: Option<String>,
    /// The key's name in that KMS (absent in early tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The plan's `settings.pbkdf` the keyslot was added with, in short form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pbkdf: Option<String>,
}

impl TokenV1 {
    /// The token as the JSON value handed to `cryptsetup token import` (object keys in
    /// serde_json's order, sorted).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Reads a `keyplan` token's JSON (`document`: `device <id> keyslot <n> token <t>`).
///
/// Errors: [`ReadError::Newer`] for a `keyplan_format` above [`TOKEN_FORMAT`];
/// [`ReadError::Corrupt`] for a token without `keyplan_format` or without the fields of its
/// version.
pub fn read_token(document: &str, json: &serde_json::Value) -> Result<TokenV1, ReadError> {
    let (value, _) = checked_value(
        &super::LUKS2_TOKEN,
        document,
        json.clone(),
        "keyplan_format",
        None,
        TOKEN_FORMAT,
    )?;
    typed(value)
}

/// One keyslot's record in a LUKS1 record file (versions 1 and 2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Luks1SlotV1 {
    /// Key id from the plan.
    pub key: String,
    /// KMS version held by the keyslot.
    pub version: u64,
    /// The keyslot's KDF salt when keyplan wrote the record.
    pub salt: String,
    /// `[KMS instance, name in the KMS]` (absent in early records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<(String, String)>,
    /// The plan's `settings.pbkdf` the keyslot was added with, in short form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pbkdf: Option<String>,
}

/// A LUKS1 record file, version 1: no `format` field (keyplan before issue 47). Read
/// leniently, as that keyplan did: fields it does not know are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Luks1V1 {
    /// The device path when last written.
    #[serde(default)]
    pub device: String,
    /// Keyslot -> record.
    #[serde(default)]
    pub slots: BTreeMap<u32, Luks1SlotV1>,
}

/// A LUKS1 record file, version 2: version 1 with `"format": 2` first, and no unknown field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Luks1V2 {
    /// Always 2.
    pub format: u64,
    /// The device path when last written.
    pub device: String,
    /// Keyslot -> record (the keyslot number as a JSON object key).
    pub slots: BTreeMap<u32, Luks1SlotV1>,
}

/// The version this keyplan writes LUKS1 record files in.
pub const LUKS1_FORMAT: u64 = 2;

/// Reads a LUKS1 record file of any version this keyplan knows, as version 2 (`document`: its
/// path).
///
/// Errors: [`ReadError::Newer`] for a `format` above [`LUKS1_FORMAT`]; [`ReadError::Corrupt`].
pub fn read_luks1(document: &str, bytes: &[u8]) -> Result<Luks1V2, ReadError> {
    let (value, version) = checked(
        &super::LUKS1_RECORDS,
        document,
        bytes,
        "format",
        Some(1),
        LUKS1_FORMAT,
    )?;
    if version < 2 {
        let old: Luks1V1 = typed(value)?;
        return Ok(Luks1V2 {
            format: LUKS1_FORMAT,
            device: old.device,
            slots: old.slots,
        });
    }
    typed(value)
}
