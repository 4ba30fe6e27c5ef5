//! The journal (`<state_dir>/journal.jsonl`), its checkpoint and the audit trail
//! (`<state_dir>/history.jsonl` and the operator's `--journal-archive` file): JSON Lines, one
//! record per line, in the same record format (docs/formats.md, "Journal and checkpoint").
//!
//! - **Format 1** is what keyplan wrote up to commit c322096: a record without a version,
//!   `{"ts", "run", "event", ...}`, the event's fields inline ([`RecordV1`], [`EventV1`],
//!   [`CheckpointV1`], and the steps of [`step::StepV1`]).
//! - **Format 2** is format 1 with `"format":2` first on every record. It is what this keyplan
//!   writes ([`encode`]).
//!
//! The engine's `journal::Record` and `graph::Step` are converted to and from [`RecordV1`]
//! and [`step::StepV1`] by the journal (src/journal/convert.rs), which calls [`encode`] and
//! [`decode`]: this module names no engine type, so the imports run one way (the format
//! layer below the engine).
//!
//! [`decode`] reads one line of either: a record without `format` is format 1. A line that is
//! JSON with a `format` above [`WRITES`] (or a string) is refused
//! with [`NewerFormat`] before its fields are looked at: a newer record is never taken for a
//! torn write nor skipped, whatever its events or steps; a `format` of 0, negative,
//! fractional or not a number is an invalid record (refused as well, as corrupt). A journal may mix the two (a run
//! started by an older keyplan and finished by this one); compaction rewrites format 1 records
//! as format 2, which holds the same fields.

pub mod step;

use serde::{Deserialize, Serialize};

use super::{Format, NewerFormat};
use step::StepV1;

/// The journal record format: the journal, its checkpoint, the audit trail and the archive.
pub const JOURNAL: Format = Format {
    name: "journal",
    writes: "2",
    reads: "1-2",
    home: "<state_dir>/journal.jsonl, <state_dir>/history.jsonl, the --journal-archive file",
};

/// The formats of this module ([`super::all`]).
pub const FORMATS: &[Format] = &[JOURNAL];

/// The journal format this keyplan writes, and the newest it reads.
pub const WRITES: u64 = 2;

/// One journal line, format 1 (without `format`) or, behind [`encode`]'s `"format":2`,
/// format 2. Mirrors [`crate::journal::Record`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordV1 {
    /// Unix seconds.
    pub ts: u64,
    /// Run id, or `checkpoint`.
    pub run: String,
    /// The event, tagged by `event`, its fields inline.
    #[serde(flatten)]
    pub event: EventV1,
}

/// A format 2 record as written: `format` first, then the format 1 fields.
#[derive(Serialize)]
struct RecordV2<'a> {
    format: u64,
    #[serde(flatten)]
    record: &'a RecordV1,
}

/// The events of formats 1 and 2, tagged by `event`. The meaning of every field is that of
/// the [`crate::journal::Event`] of the same name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[allow(missing_docs)] // the fields are Event's, documented there
pub enum EventV1 {
    /// [`crate::journal::Event::RunStart`].
    RunStart {
        steps: Vec<StepV1>,
        deps: Vec<(usize, usize)>,
        plan_file: String,
        devices: Vec<(String, String)>,
        pid: u32,
        host: String,
    },
    /// [`crate::journal::Event::StepStart`].
    StepStart { step: usize },
    /// [`crate::journal::Event::StepDone`].
    StepDone {
        step: usize,
        outcome: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        staged_version: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        verified_salt: Option<String>,
    },
    /// [`crate::journal::Event::StepFailed`].
    StepFailed { step: usize, error: String },
    /// [`crate::journal::Event::RunResumed`].
    RunResumed { pid: u32 },
    /// [`crate::journal::Event::RunEnd`].
    RunEnd {
        outcome: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// [`crate::journal::Event::Checkpoint`].
    Checkpoint(CheckpointV1),
}

/// The checkpoint's fields (the `checkpoint` event), formats 1 and 2. Mirrors
/// [`crate::journal::Checkpoint`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the fields are Checkpoint's, documented there
pub struct CheckpointV1 {
    pub compacted_runs: u64,
    pub through: String,
    #[serde(default)]
    pub staged: Vec<(String, Option<u64>)>,
    #[serde(default)]
    pub unfinished_adds: Vec<UnfinishedAddV1>,
    #[serde(default)]
    pub kms_keys: Vec<String>,
    #[serde(default)]
    pub committed: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_at: Option<u64>,
}

/// An unfinished add in a checkpoint, formats 1 and 2. Mirrors
/// [`crate::journal::UnfinishedAdd`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)] // the fields are UnfinishedAdd's, documented there
pub struct UnfinishedAddV1 {
    pub device: String,
    pub path: String,
    pub slot: u32,
    pub key: String,
    pub version: u64,
}

/// Why one line of a journal file is not a record this keyplan reads ([`decode`]).
#[derive(Debug, Clone, PartialEq)]
pub enum LineError {
    /// Not JSON at all: on a file's last line, a write torn by a crash.
    NotJson(String),
    /// JSON, but not a record of journal format 1 or 2 (the parser's message).
    Invalid(String),
    /// A record of a newer journal format.
    Newer(NewerFormat),
}

/// Reads one line (without its newline) of a journal, history or archive file: a record of
/// format 1 or 2. `document` names the line in a [`NewerFormat`] (`<path> line <n>`); it is
/// called only then.
///
/// Errors: [`LineError`]; the `format` is checked before anything else, so a newer record is
/// [`LineError::Newer`] even when its fields mean nothing to this keyplan.
pub fn decode(line: &[u8], document: impl FnOnce() -> String) -> Result<RecordV1, LineError> {
    let mut value: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| LineError::NotJson(e.to_string()))?;
    if let Some(v) = value.as_object_mut().and_then(|m| m.remove("format")) {
        match (v.as_u64(), v.is_string()) {
            (Some(n), _) if (1..=WRITES).contains(&n) => {}
            // Above WRITES, or a version written as a string: no keyplan this one knows writes
            // either, so a newer one did.
            (Some(n), _) if n > WRITES => {
                return Err(LineError::Newer(newer(document, v.to_string())));
            }
            (None, true) => return Err(LineError::Newer(newer(document, v.to_string()))),
            // 0, negative, fractional, null, a boolean...: no keyplan writes that.
            _ => {
                return Err(LineError::Invalid(format!(
                    "\"format\" is {v}, not a journal format version"
                )));
            }
        }
    }
    serde_json::from_value(value).map_err(|e| LineError::Invalid(e.to_string()))
}

/// A [`NewerFormat`] for a journal line whose `format` is `found`.
fn newer(document: impl FnOnce() -> String, found: String) -> NewerFormat {
    NewerFormat {
        document: document(),
        format: JOURNAL.name,
        found,
        newest: WRITES.to_string(),
    }
}

/// `record` as one line of journal format 2 (no newline; not yet redacted: the journal's
/// writers pass it through [`crate::secret::redact::redact_json`]).
///
/// Errors: serialization failed (does not happen for these types).
pub fn encode(record: &RecordV1) -> Result<String, serde_json::Error> {
    serde_json::to_string(&RecordV2 {
        format: WRITES,
        record,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> String {
        "/s/journal.jsonl line 4".into()
    }

    #[test]
    fn format_1_and_2_read_and_newer_is_refused_before_its_fields() {
        let v1 = br#"{"ts":1,"run":"r","event":"run_resumed","pid":7}"#;
        let r = decode(v1, doc).expect("v1");
        assert_eq!(r.event, EventV1::RunResumed { pid: 7 });
        let v2 = encode(&r).expect("encode");
        assert_eq!(
            v2,
            r#"{"format":2,"ts":1,"run":"r","event":"run_resumed","pid":7}"#
        );
        assert_eq!(decode(v2.as_bytes(), doc).expect("v2"), r);
        for newer in [
            br#"{"format":3,"ts":1,"run":"r","event":"run_resumed","pid":7}"#.as_slice(),
            br#"{"format":3,"event":"teleport"}"#,
            br#"{"format":"2.1","ts":1,"run":"r","event":"run_resumed","pid":7}"#,
        ] {
            let Err(LineError::Newer(e)) = decode(newer, doc) else {
                panic!("not refused: {}", String::from_utf8_lossy(newer));
            };
            assert_eq!(e.document, doc());
            assert!(e.to_string().contains("journal format"), "{e}");
        }
        assert!(matches!(
            decode(br#"{"ts":1,"run""#, doc),
            Err(LineError::NotJson(_))
        ));
        assert!(matches!(
            decode(br#"{"format":2,"event":"teleport"}"#, doc),
            Err(LineError::Invalid(_))
        ));
        for odd in ["0", "-1", "1.5", "null", "true", "1e23"] {
            let line =
                format!(r#"{{"format":{odd},"ts":1,"run":"r","event":"run_resumed","pid":7}}"#);
            assert!(
                matches!(decode(line.as_bytes(), doc), Err(LineError::Invalid(_))),
                "{odd}"
            );
        }
    }
}
