//! Conversions between the journal's records ([`Record`], [`Event`], [`Checkpoint`],
//! [`UnfinishedAdd`], and the [`Step`]s of a run) and their frozen on-disk form in
//! [`crate::format::journal`], and the record-level [`encode`] and [`decode`] the journal's
//! readers and writers use. The format layer names no engine type (it sits below them, so
//! the imports run one way): the engine converts.

use super::{Checkpoint, Event, Record, UnfinishedAdd};
use crate::format::journal::step::{SlotHolderV1, StepV1, UnlockV1, VersionRefV1};
use crate::format::journal::{
    self as format, CheckpointV1, EventV1, LineError, RecordV1, UnfinishedAddV1,
};
use crate::graph::{SlotHolder, Step, Unlock, VersionRef};

/// `record` as one line of journal format 2 ([`format::encode`]; no newline, not redacted).
///
/// Errors: serialization failed (does not happen for these types).
pub fn encode(record: &Record) -> Result<String, serde_json::Error> {
    format::encode(&RecordV1::from(record))
}

/// One line of a journal, history or archive file as a record ([`format::decode`]; `document`
/// names the line in a refusal).
///
/// Errors: [`LineError`].
pub fn decode(line: &[u8], document: impl FnOnce() -> String) -> Result<Record, LineError> {
    format::decode(line, document).map(Record::from)
}

/// `record` as a JSON object of journal format 1 (no `format` field): the shape of the
/// `records` of `keyplan journal --json` (docs/monitoring.md).
///
/// Errors: serialization failed (does not happen for these types).
pub fn record_json(record: &Record) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::to_value(RecordV1::from(record))
}

impl From<&Record> for RecordV1 {
    fn from(r: &Record) -> Self {
        RecordV1 {
            ts: r.ts,
            run: r.run.clone(),
            event: (&r.event).into(),
        }
    }
}

impl From<RecordV1> for Record {
    fn from(r: RecordV1) -> Self {
        Record {
            ts: r.ts,
            run: r.run,
            event: r.event.into(),
        }
    }
}

impl From<&Event> for EventV1 {
    fn from(e: &Event) -> Self {
        match e.clone() {
            Event::RunStart {
                steps,
                deps,
                plan_file,
                devices,
                pid,
                host,
            } => EventV1::RunStart {
                steps: steps.iter().map(StepV1::from).collect(),
                deps,
                plan_file,
                devices,
                pid,
                host,
            },
            Event::StepStart { step } => EventV1::StepStart { step },
            Event::StepDone {
                step,
                outcome,
                staged_version,
                verified_salt,
            } => EventV1::StepDone {
                step,
                outcome,
                staged_version,
                verified_salt,
            },
            Event::StepFailed { step, error } => EventV1::StepFailed { step, error },
            Event::RunResumed { pid } => EventV1::RunResumed { pid },
            Event::RunEnd { outcome, message } => EventV1::RunEnd { outcome, message },
            Event::Checkpoint(c) => EventV1::Checkpoint(c.into()),
        }
    }
}

impl From<EventV1> for Event {
    fn from(e: EventV1) -> Self {
        match e {
            EventV1::RunStart {
                steps,
                deps,
                plan_file,
                devices,
                pid,
                host,
            } => Event::RunStart {
                steps: steps.into_iter().map(Into::into).collect(),
                deps,
                plan_file,
                devices,
                pid,
                host,
            },
            EventV1::StepStart { step } => Event::StepStart { step },
            EventV1::StepDone {
                step,
                outcome,
                staged_version,
                verified_salt,
            } => Event::StepDone {
                step,
                outcome,
                staged_version,
                verified_salt,
            },
            EventV1::StepFailed { step, error } => Event::StepFailed { step, error },
            EventV1::RunResumed { pid } => Event::RunResumed { pid },
            EventV1::RunEnd { outcome, message } => Event::RunEnd { outcome, message },
            EventV1::Checkpoint(c) => Event::Checkpoint(c.into()),
        }
    }
}

impl From<Checkpoint> for CheckpointV1 {
    fn from(c: Checkpoint) -> Self {
        let Checkpoint {
            compacted_runs,
            through,
            staged,
            unfinished_adds,
            kms_keys,
            committed,
            last_success_at,
        } = c;
        CheckpointV1 {
            compacted_runs,
            through,
            staged,
            unfinished_adds: unfinished_adds.into_iter().map(Into::into).collect(),
            kms_keys,
            committed,
            last_success_at,
        }
    }
}

impl From<CheckpointV1> for Checkpoint {
    fn from(c: CheckpointV1) -> Self {
        let CheckpointV1 {
            compacted_runs,
            through,
            staged,
            unfinished_adds,
            kms_keys,
            committed,
            last_success_at,
        } = c;
        Checkpoint {
            compacted_runs,
            through,
            staged,
            unfinished_adds: unfinished_adds.into_iter().map(Into::into).collect(),
            kms_keys,
            committed,
            last_success_at,
        }
    }
}

impl From<UnfinishedAdd> for UnfinishedAddV1 {
    fn from(u: UnfinishedAdd) -> Self {
        let UnfinishedAdd {
            device,
            path,
            slot,
            key,
            version,
        } = u;
        UnfinishedAddV1 {
            device,
            path,
            slot,
            key,
            version,
        }
    }
}

impl From<UnfinishedAddV1> for UnfinishedAdd {
    fn from(u: UnfinishedAddV1) -> Self {
        let UnfinishedAddV1 {
            device,
            path,
            slot,
            key,
            version,
        } = u;
        UnfinishedAdd {
            device,
            path,
            slot,
            key,
            version,
        }
    }
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
