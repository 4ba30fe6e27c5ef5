//! The steps of a `run_start` record, journal formats 1 and 2 (the same shape): one JSON object
//! per step, tagged by `op`, frozen here apart from [`crate::graph::Step`] so that the engine's
//! type can change without changing the journal (docs/formats.md, "Journal and checkpoint").
//!
//! Fields marked `default` were added after the first journals were written (a journal without
//! them still reads, as every keyplan since wrote it); `skip_serializing_if` fields are written
//! only when set, so journals that do not use them are byte for byte what earlier keyplans
//! wrote.

use serde::{Deserialize, Serialize};

use crate::graph::{SlotHolder, Step, Unlock, VersionRef};

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
/// the [`Step`] kind of the same name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
#[allow(missing_docs)] // the fields are Step's, documented there
pub enum StepV1 {
    /// [`Step::Stage`].
    Stage {
        key: String,
        at_least: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        planned_current: Option<u64>,
    },
    /// [`Step::AddKeyslot`].
    AddKeyslot {
        device: String,
        key: String,
        version: VersionRefV1,
        slot: u32,
        unlock: UnlockV1,
    },
    /// [`Step::Verify`].
    Verify {
        device: String,
        key: String,
        version: VersionRefV1,
        slot: u32,
    },
    /// [`Step::Commit`].
    Commit {
        key: String,
        expected_current: Option<u64>,
    },
    /// [`Step::KillKeyslot`].
    KillKeyslot {
        device: String,
        slot: u32,
        holder: SlotHolderV1,
        anchor: usize,
    },
    /// [`Step::ForgetRecord`].
    ForgetRecord {
        device: String,
        slot: u32,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        failed_verify: bool,
    },
    /// [`Step::AdoptKeyslot`].
    AdoptKeyslot {
        device: String,
        slot: u32,
        key: String,
        version: u64,
        salt: String,
    },
    /// [`Step::Hold`].
    Hold {
        key: String,
        #[serde(default)]
        current: Option<u64>,
    },
    /// [`Step::Release`].
    Release {
        key: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entry: Option<(String, String)>,
    },
    /// [`Step::ReleaseFormer`].
    ReleaseFormer { key: String, holder: String },
    /// [`Step::Vote`].
    Vote { key: String },
    /// [`Step::Unvote`].
    Unvote { key: String, version: u64 },
    /// [`Step::FindCopies`].
    FindCopies {
        device: String,
        key: String,
        version: u64,
        slots: Vec<u32>,
    },
    /// [`Step::Retire`].
    Retire { key: String, version: u64 },
    /// [`Step::MigrateCopy`].
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
    /// [`Step::DestroyOrigin`].
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
    /// [`Step::Rerecord`].
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

impl From<VersionRef> for VersionRefV1 {
    fn from(v: VersionRef) -> Self {
        match v {
            VersionRef::Version(n) => VersionRefV1::Version(n),
            VersionRef::Staged => VersionRefV1::Staged,
        }
    }
}

impl From<VersionRefV1> for VersionRef {
    fn from(v: VersionRefV1) -> Self {
        match v {
            VersionRefV1::Version(n) => VersionRef::Version(n),
            VersionRefV1::Staged => VersionRef::Staged,
        }
    }
}

impl From<Unlock> for UnlockV1 {
    fn from(u: Unlock) -> Self {
        match u {
            Unlock::Key { key, version, slot } => UnlockV1::Key {
                key,
                version: version.into(),
                slot,
            },
            Unlock::EnrollWith => UnlockV1::EnrollWith,
        }
    }
}

impl From<UnlockV1> for Unlock {
    fn from(u: UnlockV1) -> Self {
        match u {
            UnlockV1::Key { key, version, slot } => Unlock::Key {
                key,
                version: version.into(),
                slot,
            },
            UnlockV1::EnrollWith => Unlock::EnrollWith,
        }
    }
}

impl From<SlotHolder> for SlotHolderV1 {
    fn from(h: SlotHolder) -> Self {
        match h {
            SlotHolder::Record { key, version } => SlotHolderV1::Record {
                key,
                version: version.into(),
            },
            SlotHolder::Unmanaged { salt } => SlotHolderV1::Unmanaged { salt },
        }
    }
}

impl From<SlotHolderV1> for SlotHolder {
    fn from(h: SlotHolderV1) -> Self {
        match h {
            SlotHolderV1::Record { key, version } => SlotHolder::Record {
                key,
                version: version.into(),
            },
            SlotHolderV1::Unmanaged { salt } => SlotHolder::Unmanaged { salt },
        }
    }
}

/// The conversions between [`Step`] and [`StepV1`], field by field: every kind lists all its
/// fields (no `..`), so a field added to a [`Step`] kind does not compile until the format
/// decides what becomes of it (a new journal format, or a default an older journal reads as).
macro_rules! step_kinds {
    ($($kind:ident { $($field:ident),* $(,)? }),* $(,)?) => {
        impl From<&Step> for StepV1 {
            #[allow(clippy::useless_conversion)] // identity conversions of plain fields
            fn from(step: &Step) -> Self {
                match step.clone() {
                    $(Step::$kind { $($field),* } => StepV1::$kind { $($field: $field.into()),* },)*
                }
            }
        }

        impl From<StepV1> for Step {
            #[allow(clippy::useless_conversion)] // identity conversions of plain fields
            fn from(step: StepV1) -> Self {
                match step {
                    $(StepV1::$kind { $($field),* } => Step::$kind { $($field: $field.into()),* },)*
                }
            }
        }
    };
}

step_kinds! {
    Stage { key, at_least, planned_current },
    AddKeyslot { device, key, version, slot, unlock },
    Verify { device, key, version, slot },
    Commit { key, expected_current },
    KillKeyslot { device, slot, holder, anchor },
    ForgetRecord { device, slot, failed_verify },
    AdoptKeyslot { device, slot, key, version, salt },
    Hold { key, current },
    Release { key, entry },
    ReleaseFormer { key, holder },
    Vote { key },
    Unvote { key, version },
    FindCopies { device, key, version, slots },
    Retire { key, version },
    MigrateCopy { key, from_kms, from_name, version, to_kms, to_name },
    DestroyOrigin { key, from_kms, from_name, version, to_kms, to_name, kept },
    Rerecord { device, key, slot, version, to_kms, to_name },
}
