//! The steps of a `run_start` record, journal formats 1 and 2 (the same shape): one JSON object
//! per step, tagged by `op`, frozen here apart from [`crate::graph::Step`] so that the engine's
//! type can change without changing the journal (docs/formats.md, "Journal and checkpoint").
//! The conversions, field by field, are in src/journal/convert.rs.
//!
//! Fields marked `default` were added after the first journals were written (a journal without
//! them still reads, as every keyplan since wrote it); `skip_serializing_if` fields are written
//! only when set, so journals that do not use them are byte for byte what earlier keyplans
//! wrote.

use serde::{Deserialize, Serialize};

/// Which version of a key a step means: `{"version": N}` or `"staged"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionRefV1 {
    /// A version known at planning time.
    Version(u64),
    /// The version the run's `stage` step of the key staged.
    Staged,
}

/// How an add step opens the device: `{"key": {"key", "version", "slot"}}` or
/// `"enroll_with"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnlockV1 {
    /// A key version through the keyslot recorded for it.
    Key {
        /// Key id.
        key: String,
        /// Version.
        version: VersionRefV1,
        /// Keyslot number.
        slot: u32,
    },
    /// The device's `enroll_with` passphrase file.
    EnrollWith,
}

/// What a keyslot about to be killed holds: `{"record": {"key", "version"}}` or
/// `{"unmanaged": {"salt"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotHolderV1 {
    /// A keyslot keyplan recorded for this key version.
    Record {
        /// Key id.
        key: String,
        /// Version.
        version: VersionRefV1,
    },
    /// A keyslot no record names, by its KDF salt.
    Unmanaged {
        /// KDF salt seen at planning time.
        salt: String,
    },
}

/// One step, tagged by `op` (snake case of the kind). The meaning of every field is that of
/// the [`crate::graph::Step`] kind of the same name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
#[allow(missing_docs)] // the fields are Step's, documented there
pub enum StepV1 {
    /// [`crate::graph::Step::Stage`].
    Stage {
        key: String,
        at_least: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        planned_current: Option<u64>,
    },
    /// [`crate::graph::Step::AddKeyslot`].
    AddKeyslot {
        device: String,
        key: String,
        version: VersionRefV1,
        slot: u32,
        unlock: UnlockV1,
    },
    /// [`crate::graph::Step::Verify`].
    Verify {
        device: String,
        key: String,
        version: VersionRefV1,
        slot: u32,
    },
    /// [`crate::graph::Step::Commit`].
    Commit {
        key: String,
        expected_current: Option<u64>,
    },
    /// [`crate::graph::Step::KillKeyslot`].
    KillKeyslot {
        device: String,
        slot: u32,
        holder: SlotHolderV1,
        anchor: usize,
    },
    /// [`crate::graph::Step::ForgetRecord`].
    ForgetRecord {
        device: String,
        slot: u32,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        failed_verify: bool,
    },
    /// [`crate::graph::Step::AdoptKeyslot`].
    AdoptKeyslot {
        device: String,
        slot: u32,
        key: String,
        version: u64,
        salt: String,
    },
    /// [`crate::graph::Step::Hold`].
    Hold {
        key: String,
        #[serde(default)]
        current: Option<u64>,
    },
    /// [`crate::graph::Step::Release`].
    Release {
        key: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entry: Option<(String, String)>,
    },
    /// [`crate::graph::Step::ReleaseFormer`].
    ReleaseFormer { key: String, holder: String },
    /// [`crate::graph::Step::Vote`].
    Vote { key: String },
    /// [`crate::graph::Step::Unvote`].
    Unvote { key: String, version: u64 },
    /// [`crate::graph::Step::FindCopies`].
    FindCopies {
        device: String,
        key: String,
        version: u64,
        slots: Vec<u32>,
    },
    /// [`crate::graph::Step::Retire`].
    Retire { key: String, version: u64 },
    /// [`crate::graph::Step::MigrateCopy`].
    MigrateCopy {
        key: String,
        from_kms: String,
        from_name: String,
        version: u64,
        #[serde(default)]
        to_kms: String,
        #[serde(default)]
        to_name: String,
    },
    /// [`crate::graph::Step::DestroyOrigin`].
    DestroyOrigin {
        key: String,
        from_kms: String,
        from_name: String,
        version: u64,
        #[serde(default)]
        to_kms: String,
        #[serde(default)]
        to_name: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        kept: bool,
    },
    /// [`crate::graph::Step::Rerecord`].
    Rerecord {
        device: String,
        key: String,
        slot: u32,
        version: VersionRefV1,
        #[serde(default)]
        to_kms: String,
        #[serde(default)]
        to_name: String,
    },
}
