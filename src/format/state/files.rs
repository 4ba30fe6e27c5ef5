//! `owner.json`, `devices.json`, `copies.json` and `kept.json`: pretty JSON objects with an
//! integer `format`, written by src/world/owner.rs, registry.rs, copies.rs and kept.rs.
//!
//! Each type is the document of one version, field for field in the order it is written;
//! `deny_unknown_fields` makes a document that adds a field without a new version unreadable
//! (a change is a new version). The readers check `format` before the shape, so a newer
//! document is refused as newer, not as corrupt.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{checked, typed, ReadError};

/// `owner.json` version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OwnerV1 {
    /// Always 1.
    pub format: u64,
    /// The owning plan file (directory canonical, file name kept).
    pub plan: PathBuf,
    /// The node (or host) the plan acts for.
    pub node: String,
    /// The state directory, canonical, when last claimed (empty in files written before it).
    #[serde(default)]
    pub state_dir: PathBuf,
    /// The plan's KMS holder id when it last claimed the directory.
    pub holder: String,
    /// Holder ids the directory had before, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub former_holders: Vec<String>,
    /// When the directory was first claimed, Unix seconds.
    pub since: u64,
}

/// Reads `owner.json` (`document`: its path, for the refusal).
///
/// Errors: [`ReadError::Newer`] for a `format` above 1; [`ReadError::Corrupt`].
pub fn read_owner(document: &str, bytes: &[u8]) -> Result<OwnerV1, ReadError> {
    let (value, _) = checked(&super::OWNER, document, bytes, "format", None, 1)?;
    typed(value)
}

/// One device of `devices.json` version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceV1 {
    /// Device id in the plan when keyplan last worked on it.
    pub id: String,
    /// Device path then.
    pub path: PathBuf,
}

/// `devices.json` version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicesV1 {
    /// Always 1.
    pub format: u64,
    /// LUKS UUID (lower case) -> device.
    pub devices: BTreeMap<String, DeviceV1>,
}

/// Reads `devices.json`.
///
/// Errors: [`ReadError::Newer`] for a `format` above 1; [`ReadError::Corrupt`].
pub fn read_devices(document: &str, bytes: &[u8]) -> Result<DevicesV1, ReadError> {
    let (value, _) = checked(&super::DEVICES, document, bytes, "format", None, 1)?;
    typed(value)
}

/// One copy of `copies.json` version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyV1 {
    /// The device's LUKS UUID (lower case).
    pub uuid: String,
    /// The device id in the plan when found.
    pub device: String,
    /// The keyslot.
    pub slot: u32,
    /// Its KDF salt when tested.
    pub salt: String,
    /// Key id.
    pub key: String,
    /// The version that opened it.
    pub version: u64,
    /// When it was found, Unix seconds.
    pub found_at: u64,
}

/// `copies.json` version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopiesV1 {
    /// Always 1.
    pub format: u64,
    /// The copies, in the order found.
    pub copies: Vec<CopyV1>,
}

/// Reads `copies.json`.
///
/// Errors: [`ReadError::Newer`] for a `format` above 1; [`ReadError::Corrupt`].
pub fn read_copies(document: &str, bytes: &[u8]) -> Result<CopiesV1, ReadError> {
    let (value, _) = checked(&super::COPIES, document, bytes, "format", None, 1)?;
    typed(value)
}

/// One entry of `kept.json` version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeptCopyV1 {
    /// Key id (in the plan when the copy was kept).
    pub key: String,
    /// The KMS instance the key moved from.
    pub kms: String,
    /// The key's name in that KMS.
    pub name: String,
    /// The versions kept there, ascending.
    pub versions: Vec<u64>,
    /// When the copy was first kept, Unix seconds.
    pub since: u64,
}

/// `kept.json` version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeptV1 {
    /// Always 1.
    pub format: u64,
    /// The kept entries.
    pub copies: Vec<KeptCopyV1>,
}

/// Reads `kept.json`.
///
/// Errors: [`ReadError::Newer`] for a `format` above 1; [`ReadError::Corrupt`].
pub fn read_kept(document: &str, bytes: &[u8]) -> Result<KeptV1, ReadError> {
    let (value, _) = checked(&super::KEPT, document, bytes, "format", None, 1)?;
    typed(value)
}
