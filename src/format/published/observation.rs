//! The observation a node report publishes (`observation.state` of `report.json`, version 1):
//! its own data types, the shape of what agents wrote since version 1, converted to and from
//! the engine's [`crate::observe`] types in src/fleet/published.rs. A field of the engine's
//! types may be renamed or added without changing the report; a change here is a new version of
//! the node report (docs/formats.md, "Node report").
//!
//! Readers ignore fields they do not know (a newer 1.x report may add some); every field a
//! later 1.x added is optional (`serde(default)`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Everything an agent observed for its plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    /// The plan's devices, by id.
    pub devices: BTreeMap<String, DeviceState>,
    /// The KMS state of each key, by key id.
    pub keys: BTreeMap<String, KeyState>,
    /// Devices of earlier runs no longer in the plan but still present, by their former id.
    pub former: BTreeMap<String, DeviceState>,
    /// Devices of earlier runs that cannot be read now: `[former id, path, why]`.
    pub former_unreadable: Vec<(String, PathBuf, String)>,
    /// Where moved keys' records still point (migration), by key id.
    pub origins: BTreeMap<String, Vec<Origin>>,
    /// Observation time, Unix seconds.
    pub now: u64,
    /// `[key id, version or null]` the plan's own journal says it staged.
    #[serde(default)]
    pub staged_here: BTreeSet<(String, Option<u64>)>,
    /// Devices of the plan that cannot be used now, by id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unavailable: BTreeMap<String, Unavailable>,
    /// Holder ids that are this plan's own former records, with why each is known to be.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub former_holders: BTreeMap<String, String>,
    /// The host's CPUs and memory; `null` when they could not be read.
    #[serde(default)]
    pub host: Option<KdfHost>,
    /// The KMS entries earlier moves kept, each with that KMS's state of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<Kept>,
}

/// One device as observed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceState {
    /// Device id from the plan.
    pub id: String,
    /// Device path.
    pub path: PathBuf,
    /// The LUKS header.
    pub header: Header,
    /// keyplan's records, by keyslot.
    pub records: Vec<RecordObs>,
    /// Why the device cannot be written, `null` when it can.
    pub read_only: Option<String>,
    /// Why the `enroll_with` passphrase cannot enroll a key, when it was tested and failed.
    pub enroll_with_problem: Option<String>,
    /// The keyslot the `enroll_with` passphrase opened, when tested.
    pub enroll_with_keyslot: Option<u32>,
    /// What the `enroll_with` file is, from its metadata.
    pub enroll_with_file: Option<EnrollFile>,
    /// Unrecorded keyslots a listed key's current version opens.
    pub adoptable: Vec<Adoption>,
    /// What a test for adoption would test, when it was not tested.
    pub adoption_untested: Option<Untested>,
    /// Keyslots that still open with a version keyplan retired.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired_copies: Vec<RetiredCopy>,
}

/// LUKS on-disk version: `Luks1` or `Luks2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LuksVersion {
    /// LUKS1.
    Luks1,
    /// LUKS2.
    Luks2,
}

/// LUKS2 keyslot priority: `Ignore`, `Normal` or `Prefer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Priority {
    /// 0.
    Ignore,
    /// 1.
    Normal,
    /// 2.
    Prefer,
}

/// One occupied keyslot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keyslot {
    /// Whether it opens the data (bound to segment 0).
    pub bound: bool,
    /// Its KDF salt as cryptsetup prints it.
    pub salt: String,
    /// Its priority.
    pub priority: Priority,
    /// KDF type, e.g. `argon2id`.
    pub kdf: String,
    /// Argon2 memory cost, KiB; `null` for pbkdf2.
    pub memory_kib: Option<u64>,
    /// PBKDF2 iterations or the argon2 time cost.
    #[serde(default)]
    pub iterations: Option<u64>,
    /// Argon2 threads.
    #[serde(default)]
    pub parallel: Option<u64>,
}

/// One LUKS2 token; its contents (`json`) are published as `null`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Token {
    /// Token id.
    pub id: u32,
    /// The token's `type`.
    pub token_type: String,
    /// Keyslots it is assigned to.
    pub keyslots: Vec<u32>,
    /// The token object (`null` in a report).
    pub json: serde_json::Value,
}

/// Damage and write blockers found in the header; each field left out when unset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    /// Damage, one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub damage: Vec<String>,
    /// The two LUKS2 copies disagree.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub copies_disagree: bool,
    /// The copies differ as in the middle of one header write.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mid_write: bool,
    /// `config.requirements.mandatory`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<String>,
    /// A reencryption is in progress.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reencryption: bool,
}

/// A LUKS header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// LUKS version.
    pub version: LuksVersion,
    /// LUKS UUID.
    pub uuid: String,
    /// Occupied keyslots by number.
    pub keyslots: BTreeMap<u32, Keyslot>,
    /// LUKS2 tokens by id.
    pub tokens: BTreeMap<u32, Token>,
    /// LUKS2 `[json_size, used]` in bytes.
    pub json_area: Option<(u64, u64)>,
    /// LUKS2 metadata epoch.
    pub epoch: Option<u64>,
    /// `[hash, key bits]` a new pbkdf2 keyslot derives with.
    pub pbkdf2_target: (String, Option<u32>),
    /// Damage and write blockers.
    #[serde(default)]
    pub condition: Condition,
}

/// What keyplan recorded about one keyslot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    /// Key id.
    pub key: String,
    /// KMS version the keyslot holds.
    pub version: u64,
    /// The keyslot's KDF salt when written.
    pub salt: String,
    /// `[KMS instance, name]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<(String, String)>,
    /// The plan's PBKDF in its short form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pbkdf: Option<String>,
}

/// Whether a record still describes its keyslot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordStatus {
    /// Present with the recorded salt.
    Valid,
    /// The keyslot no longer exists.
    KeyslotGone,
    /// The keyslot has another salt.
    Rewritten,
    /// The recorded version does not open it.
    FailedVerify,
}

/// A record as observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordObs {
    /// Keyslot.
    pub slot: u32,
    /// The record.
    pub record: SlotRecord,
    /// LUKS2 token id holding it.
    pub token_id: Option<u32>,
    /// Drift status.
    pub status: RecordStatus,
    /// The key id the record names on disk, when the plan renamed the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renamed_from: Option<String>,
}

/// Lifecycle of a key version: `pending`, `current`, `previous`, `retired`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionState {
    /// Staged.
    Pending,
    /// Current.
    Current,
    /// Retained.
    Previous,
    /// Destroyed.
    Retired,
}

/// One key version's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// Version number.
    pub version: u64,
    /// Creation time, Unix seconds.
    pub created_at: u64,
    /// Lifecycle state.
    pub state: VersionState,
}

/// What a KMS holds for one key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyState {
    /// Current version.
    pub current: Option<u64>,
    /// Staged version.
    pub pending: Option<u64>,
    /// Every version by number.
    pub versions: BTreeMap<u64, VersionInfo>,
    /// Holder ids with when each was recorded, Unix seconds.
    pub holders: BTreeMap<String, u64>,
}

/// A keyslot that opened with a version keyplan retired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredCopy {
    /// LUKS UUID.
    pub uuid: String,
    /// Device id when found.
    pub device: String,
    /// Keyslot.
    pub slot: u32,
    /// Its KDF salt when tested.
    pub salt: String,
    /// Key id.
    pub key: String,
    /// The retired version.
    pub version: u64,
    /// When found, Unix seconds.
    pub found_at: u64,
}

/// A keyslot to record as holding a key's version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adoption {
    /// Keyslot.
    pub slot: u32,
    /// Key id.
    pub key: String,
    /// Version that opened it.
    pub version: u64,
    /// Its KDF salt when tested.
    pub salt: String,
    /// Recorded again after a rewrite with the same passphrase.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resalted: bool,
}

/// A possible adoption not tested.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Untested {
    /// Key id.
    pub key: String,
    /// Its current version.
    pub version: u64,
    /// Keyslots it may open.
    pub slots: Vec<u32>,
}

/// What an `enroll_with` file is (externally tagged: `"Passphrase"`, `{"TooLong":{"bytes":N}}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EnrollFile {
    /// May hold the passphrase.
    Passphrase,
    /// Longer than cryptsetup reads.
    TooLong {
        /// Size in bytes.
        bytes: u64,
    },
    /// Empty.
    Empty,
    /// Not a regular file.
    NotRegular {
        /// What it is.
        kind: String,
    },
    /// Cannot be examined.
    Unreadable {
        /// The OS error.
        error: String,
    },
}

/// A device of the plan that cannot be used now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unavailable {
    /// Device path.
    pub path: PathBuf,
    /// Why.
    pub why: String,
    /// What to do.
    pub help: String,
    /// Where in the plan file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// The host's CPUs and memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdfHost {
    /// CPUs online.
    pub cpus: u64,
    /// Physical memory, KiB.
    pub memory_kib: u64,
}

/// Where a moved key's records say its versions lived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// KMS instance.
    pub kms: String,
    /// Name in that KMS.
    pub name: String,
    /// That KMS's state of the key.
    pub state: Option<KeyState>,
    /// What the destination entry already holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupant: Option<Occupant>,
}

/// The version an entry already holds in the KMS a key moves to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Occupant {
    /// The destination's version.
    pub version: u64,
    /// Whether it is pending there.
    pub pending: bool,
    /// The origin's version with the same material.
    pub copy_of: Option<u64>,
}

/// A KMS entry an earlier move kept, as observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    /// The entry as recorded.
    pub copy: KeptCopy,
    /// That KMS's state of it.
    pub state: Option<KeyState>,
}

/// One kept KMS entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptCopy {
    /// Key id.
    pub key: String,
    /// KMS instance.
    pub kms: String,
    /// Name there.
    pub name: String,
    /// Versions kept, ascending.
    pub versions: Vec<u64>,
    /// Since when, Unix seconds.
    pub since: u64,
}
