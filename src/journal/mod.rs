//! The write-ahead journal and the state-directory lock.
//!
//! The journal is `<state_dir>/journal.jsonl`: one JSON object per line (JSON Lines), appended
//! and `fsync`ed before the effect it announces (`step_start`) and after the effect
//! (`step_done`), as journal format 2 ([`crate::format::journal`], which also reads format 1
//! and refuses newer ones). A crash can tear only the last line; [`read`] ignores a torn last
//! line (one that is not JSON), and
//! [`Journal::open`] cuts it off before appending (a whole record missing only its newline is
//! kept and terminated). It never holds key material: steps name
//! keys, versions, devices and keyslots only, and each line is redacted
//! ([`crate::secret::redact::redact_json`]) before it is written, for the error texts of KMSs.
//!
//! The state-directory lock, [`StateLock`], is in `lock.rs`; it shares [`JournalError`].
//!
//! Finished runs do not stay in the journal: [`compact`] moves them to the audit trail
//! `<state_dir>/history.jsonl` (bounded), leaving a [`Event::Checkpoint`] with what observation
//! still needs from them, so reading the journal costs O(unfinished work), not O(all runs).

pub mod compact;
mod convert;
mod lock;

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::format::journal::LineError;
use crate::fsutil;
use crate::graph::Step;

pub use convert::{decode, encode, record_json};
pub use lock::{lock_holder, StateLock, LOCK_FILE};

/// Journal file name inside the state directory.
pub const JOURNAL_FILE: &str = "journal.jsonl";

/// One journal line. Written as journal format 2 and read as format 1 or 2 by
/// [`crate::format::journal`], which converts it to and from its own frozen types: this type
/// may change freely, the journal only by a new format version there.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Time of writing, seconds since the Unix epoch.
    pub ts: u64,
    /// Run id (`<unix seconds>-<pid>`).
    pub run: String,
    /// What happened.
    pub event: Event,
}

/// Journal events (on disk: [`crate::format::journal::EventV1`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A run begins: the whole step graph, so an interrupted run can be finished.
    RunStart {
        /// Steps in index order.
        steps: Vec<Step>,
        /// Dependency edges `(before, after)` by step index.
        deps: Vec<(usize, usize)>,
        /// Plan file path.
        plan_file: String,
        /// Device id -> device path at planning time.
        devices: Vec<(String, String)>,
        /// Process id of the writer.
        pid: u32,
        /// Host name of the writer.
        host: String,
    },
    /// Written before a step's effect.
    StepStart {
        /// Step index.
        step: usize,
    },
    /// Written after a step's effect is durable.
    StepDone {
        /// Step index.
        step: usize,
        /// What was done, e.g. `added keyslot 3` or `already done`.
        outcome: String,
        /// For `stage`: the version staged (or reused).
        staged_version: Option<u64>,
        /// For `verify`: the KDF salt of the keyslot that was verified.
        verified_salt: Option<String>,
    },
    /// A step failed; its effect may or may not have happened (it is idempotent).
    StepFailed {
        /// Step index.
        step: usize,
        /// The error message (never key material).
        error: String,
    },
    /// An interrupted run is being finished by a later process.
    RunResumed {
        /// Process id of the resuming process.
        pid: u32,
    },
    /// A run ended.
    RunEnd {
        /// `success`, `failed` or `interrupted` (signal).
        outcome: String,
        /// Error summary when not successful.
        message: Option<String>,
    },
    /// The first record of a compacted journal ([`compact`]): what the finished runs moved out
    /// of it (to `history.jsonl`, where they are an audit trail only) said that observation
    /// still needs. Its run id is [`compact::CHECKPOINT_RUN`].
    Checkpoint(Checkpoint),
}

/// What a compacted journal keeps of the runs it no longer holds ([`Event::Checkpoint`]).
/// Every field is bounded by the plan's keys and devices, not by the number of runs. On disk:
/// [`crate::format::journal::CheckpointV1`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checkpoint {
    /// Runs moved out of the journal by all compactions so far.
    pub compacted_runs: u64,
    /// Id of the last run moved out.
    pub through: String,
    /// [`staged_versions`] of the runs moved out: `(key id, Some(version))` staged (at most
    /// [`compact::STAGED_PER_KEY`] highest per key), `(key id, None)` for a stage whose reply
    /// was lost and that no later run of the key's stage has since settled.
    pub staged: Vec<(String, Option<u64>)>,
    /// [`unfinished_adds`] of the runs moved out.
    pub unfinished_adds: Vec<UnfinishedAdd>,
    /// Keys whose KMS entry a step of a run moved out wrote or was to write
    /// ([`Step::kms_key`]), for [`planned_kms_keys`].
    pub kms_keys: Vec<String>,
    /// Keys a run moved out committed a version of (or copied to another KMS), for
    /// [`committed_keys`].
    pub committed: Vec<String>,
    /// When the last successful run moved out ended (Unix seconds), for [`last_success_at`].
    pub last_success_at: Option<u64>,
}

/// When the last successful run in `records` ended (its `run_end` record's time, Unix
/// seconds), or what a [`Event::Checkpoint`] says of the runs compacted away.
pub fn last_success_at(records: &[Record]) -> Option<u64> {
    records.iter().rev().find_map(|x| match &x.event {
        Event::RunEnd { outcome, .. } if outcome == "success" => Some(x.ts),
        Event::Checkpoint(c) => c.last_success_at,
        _ => None,
    })
}

/// Errors reading or writing the journal or the lock.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// I/O on the journal or lock file.
    #[error("{what} {path}: {source}")]
    Io {
        /// Operation.
        what: &'static str,
        /// File.
        path: PathBuf,
        /// OS error.
        source: io::Error,
    },
    /// A line other than the last cannot be parsed.
    #[error("journal {path} line {line} is corrupt ({message}); keyplan will not guess: move the file aside to start a fresh journal. A fresh journal forgets the run's unfinished steps: first check `cryptsetup luksDump` of this plan's devices for keyslots without a keyplan token, which a killed add may have left (docs/operations.md, \"Journal, lock and resume\")")]
    Corrupt {
        /// Journal path.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Parser message.
        message: String,
    },
    /// A record was written in a newer journal format (by a newer keyplan): nothing is read
    /// from or written to the file ([`crate::format::journal`]).
    #[error(transparent)]
    Newer(#[from] crate::format::NewerFormat),
    /// Another process holds the state-directory lock.
    #[error("another keyplan run holds the lock on {path}: {holder}; wait for it to finish (a lock of a dead process is released by the kernel)")]
    Locked {
        /// Lock file.
        path: PathBuf,
        /// `pid N on host H since T`, as recorded by the holder.
        holder: String,
    },
}

/// An open journal for appending.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: fs::File,
}

impl Journal {
    /// Opens (creating, mode 0600, in a 0700 state directory) `<state_dir>/journal.jsonl` for
    /// appending; a torn last line left by a crash (no final newline, not JSON) is cut off
    /// first. Every record is read first ([`parse`]): a journal holding a record of a newer
    /// format, or a corrupt one, is refused untouched.
    ///
    /// Errors: [`JournalError::Io`], [`JournalError::Corrupt`], [`JournalError::Newer`].
    pub fn open(state_dir: &Path) -> Result<Journal, JournalError> {
        let (path, mut file) = open_state_file(state_dir, JOURNAL_FILE)?;
        let io_err = |what, source| JournalError::Io {
            what,
            path: path.clone(),
            source,
        };
        let mut bytes = Vec::new();
        file.seek(SeekFrom::Start(0))
            .and_then(|_| io::Read::read_to_end(&mut file, &mut bytes))
            .map_err(|e| io_err("reading", e))?;
        // Nothing is appended to a journal this keyplan does not read whole (a newer record
        // anywhere, the last line included, is refused here, not cut off as torn).
        parse(&bytes, &path)?;
        let keep = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let tail = &bytes[keep..];
        if keep < bytes.len() && serde_json::from_slice::<serde::de::IgnoredAny>(tail).is_ok() {
            // A whole record whose newline was not written (`parse` read it): keep it.
            file.write_all(b"\n")
                .and_then(|()| file.sync_data())
                .map_err(|e| io_err("repairing", e))?;
        } else if keep < bytes.len() {
            // A torn last record: the process died while writing it, so its effect never
            // started (records are written ahead). Cut it off; terminating it with a newline
            // instead would turn it into a corrupt line in the middle of the journal.
            tracing::warn!(
                "journal {}: removing a torn last record ({} bytes) left by a crash",
                path.display(),
                bytes.len() - keep
            );
            file.set_len(keep as u64)
                .and_then(|()| file.sync_data())
                .map_err(|e| io_err("repairing", e))?;
        }
        Ok(Journal { path, file })
    }

    /// Appends one record as a line and `fsync`s it before returning (write-ahead).
    ///
    /// Errors: [`JournalError::Io`]; the caller must then stop before the step's effect.
    pub fn append(&mut self, run: &str, event: Event) -> Result<(), JournalError> {
        let record = Record {
            ts: crate::clock::now_unix(),
            run: run.to_string(),
            event,
        };
        let text = encode(&record).map_err(|e| JournalError::Io {
            what: "encoding a record for",
            path: self.path.clone(),
            source: io::Error::other(e),
        })?;
        // Error texts come from KMSs and helpers, which may quote material back.
        let mut line = crate::secret::redact::redact_json(&text)
            .into_owned()
            .into_bytes();
        line.push(b'\n');
        if crate::failpoint::fires("journal.torn_append") {
            // A crash in the middle of a write: half a record reaches the disk.
            let _ = self.file.seek(SeekFrom::End(0));
            let _ = self.file.write_all(&line[..line.len() / 2]);
            let _ = self.file.sync_data();
            crate::failpoint::crash("journal.torn_append");
        }
        self.file
            .seek(SeekFrom::End(0))
            .and_then(|_| self.file.write_all(&line))
            .and_then(|()| self.file.sync_data())
            .map_err(|source| JournalError::Io {
                what: "appending to",
                path: self.path.clone(),
                source,
            })?;
        crate::failpoint::check("journal.after_append").map_err(|e| JournalError::Io {
            what: "appending to",
            path: self.path.clone(),
            source: io::Error::other(e),
        })
    }
}

impl Journal {
    /// Replaces the journal's content with `bytes` atomically: a temporary file beside it
    /// (mode 0600) is written and `fsync`ed, renamed over the journal, and the directory
    /// `fsync`ed; appends then go to the new file (the temporary file's descriptor, which the
    /// rename made the journal's). A crash leaves the old journal or the new one.
    ///
    /// Errors: [`JournalError::Io`], with the journal and this handle unchanged.
    pub(crate) fn replace(&mut self, bytes: &[u8]) -> Result<(), JournalError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let tmp = self.path.with_extension("jsonl.tmp");
        let io_err = |what, source| JournalError::Io {
            what,
            path: self.path.clone(),
            source,
        };
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io_err("writing the new content of", e))?;
        file.write_all(bytes)
            .and_then(|()| file.sync_all())
            .map_err(|e| io_err("writing the new content of", e))?;
        fs::rename(&tmp, &self.path).map_err(|e| io_err("replacing", e))?;
        self.file = file;
        if let Some(dir) = self.path.parent() {
            fsutil::sync_dir(dir).map_err(|e| io_err("syncing the directory of", e))?;
        }
        Ok(())
    }
}

/// Reads every record of `<state_dir>/journal.jsonl` (none if the file does not exist), as
/// [`parse`] does: a last line that does not parse is a torn write and is ignored; any other bad
/// line is an error.
///
/// Errors: [`JournalError::Io`], [`JournalError::Corrupt`].
pub fn read(state_dir: &Path) -> Result<Vec<Record>, JournalError> {
    read_path(&state_dir.join(JOURNAL_FILE))
}

/// Reads the JSON Lines file `path` as [`read`] does (none if it does not exist).
///
/// Errors: [`JournalError::Io`], [`JournalError::Corrupt`].
pub(crate) fn read_path(path: &Path) -> Result<Vec<Record>, JournalError> {
    let path = path.to_path_buf();
    let mut file = match fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(JournalError::Io {
                what: "opening",
                path,
                source,
            })
        }
    };
    let mut bytes = Vec::new();
    if let Err(source) = io::Read::read_to_end(&mut file, &mut bytes) {
        return Err(JournalError::Io {
            what: "reading",
            path,
            source,
        });
    }
    parse(&bytes, &path)
}

/// Parses the content of a journal file (`bytes`, JSON Lines) into its records; `path` only
/// names the file in errors.
///
/// Same semantics as [`read`]: lines are separated by `\n` (a final `\n` ends the last line,
/// it does not start an empty one); blank lines are skipped; a last line that is not JSON is a
/// torn write and is ignored; any other line that is not a record of journal format 1 or 2
/// ([`crate::format::journal::decode`]) is an error, the last one included. Never panics,
/// whatever the bytes.
///
/// Errors: [`JournalError::Newer`] for the first record of a newer format (`<path> line <n>`),
/// [`JournalError::Corrupt`] with the 1-based line number of the first bad line.
pub fn parse(bytes: &[u8], path: &Path) -> Result<Vec<Record>, JournalError> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let count = body.split(|b| *b == b'\n').count();
    let mut out = Vec::new();
    for (i, line) in body.split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let document = || format!("{} line {}", path.display(), i + 1);
        match decode(line, document) {
            Ok(r) => out.push(r),
            Err(LineError::NotJson(_)) if i + 1 == count => break,
            Err(LineError::Newer(e)) => return Err(e.into()),
            Err(LineError::NotJson(message) | LineError::Invalid(message)) => {
                return Err(JournalError::Corrupt {
                    path: path.to_path_buf(),
                    line: i + 1,
                    message,
                })
            }
        }
    }
    Ok(out)
}

/// The state of the most recent run in a journal.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Run id.
    pub run: String,
    /// When it started (Unix seconds).
    pub started: u64,
    /// The steps.
    pub steps: Vec<Step>,
    /// Dependencies `(before, after)`.
    pub deps: Vec<(usize, usize)>,
    /// Device id -> path at planning time.
    pub devices: Vec<(String, String)>,
    /// Steps with a `step_done` record.
    pub done: Vec<bool>,
    /// Steps with a `step_start` but no `step_done` (their effect may have happened).
    pub started_not_done: Vec<bool>,
    /// Staged version per key id, from `stage` steps' done records.
    pub staged: Vec<(String, u64)>,
    /// `(step index, salt)` from done `verify` steps.
    pub verified: Vec<(usize, String)>,
    /// `Some(outcome)` when a `run_end` record exists.
    pub ended: Option<String>,
    /// Last error message seen for the run.
    pub last_error: Option<String>,
}

/// The versions this state directory's plan staged itself, as its journal shows them:
/// `(key id, Some(version))` for every `stage` (or migration copy) step of any run journaled
/// as done with its staged version, also in runs that failed or ended; and `(key id, None)`
/// for a `stage` step of any run that started but has no done record (its KMS write may have
/// happened with the reply lost, so a pending version may be its own). One pass over the
/// records; a run's records are those after its `run_start` with its id, as for
/// [`last_run`]. A [`Event::Checkpoint`] adds what the runs compacted away staged.
pub fn staged_versions(records: &[Record]) -> BTreeSet<(String, Option<u64>)> {
    let mut out = BTreeSet::new();
    // Per run id: its steps and, per step, (done, started and not done).
    type Run<'a> = (&'a [Step], Vec<(bool, bool)>);
    let mut runs: std::collections::HashMap<&str, Run<'_>> = std::collections::HashMap::new();
    let lost_replies =
        |out: &mut BTreeSet<(String, Option<u64>)>, steps: &[Step], st: &[(bool, bool)]| {
            for (step, (_, started)) in steps.iter().zip(st) {
                if let (Step::Stage { key, .. }, true) = (step, started) {
                    out.insert((key.clone(), None));
                }
            }
        };
    for r in records {
        match &r.event {
            Event::RunStart { steps, .. } => {
                if let Some((old, st)) =
                    runs.insert(&r.run, (steps, vec![(false, false); steps.len()]))
                {
                    lost_replies(&mut out, old, &st);
                }
            }
            Event::StepStart { step } => {
                if let Some(f) = runs
                    .get_mut(r.run.as_str())
                    .and_then(|(_, st)| st.get_mut(*step))
                {
                    f.1 = !f.0;
                }
            }
            Event::StepDone {
                step,
                staged_version,
                ..
            } => {
                if let Some((steps, st)) = runs.get_mut(r.run.as_str()) {
                    if let Some(f) = st.get_mut(*step) {
                        *f = (true, false);
                    }
                    if let (
                        Some(v),
                        Some(Step::Stage { key, .. } | Step::MigrateCopy { key, .. }),
                    ) = (staged_version, steps.get(*step))
                    {
                        out.insert((key.clone(), Some(*v)));
                    }
                }
            }
            Event::Checkpoint(c) => out.extend(c.staged.iter().cloned()),
            _ => {}
        }
    }
    for (steps, st) in runs.values() {
        lost_replies(&mut out, steps, st);
    }
    out
}

/// Keys whose KMS entry a step of some run in `records` writes or was to write
/// ([`Step::kms_key`]: a stage, a holder record, a vote, ...), whether or not the step ran,
/// with those of a [`Event::Checkpoint`]: the keys this state directory's plan may have
/// written to.
pub fn planned_kms_keys(records: &[Record]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for r in records {
        match &r.event {
            Event::RunStart { steps, .. } => {
                out.extend(steps.iter().filter_map(Step::kms_key).map(str::to_owned));
            }
            Event::Checkpoint(c) => out.extend(c.kms_keys.iter().cloned()),
            _ => {}
        }
    }
    out
}

/// Keys of which some run in `records` committed a version (a done `commit` step) or copied
/// one to another KMS (a done migration copy), with those of a [`Event::Checkpoint`].
pub fn committed_keys(records: &[Record]) -> BTreeSet<String> {
    let mut steps: std::collections::HashMap<&str, &Vec<Step>> = std::collections::HashMap::new();
    let mut out = BTreeSet::new();
    for r in records {
        match &r.event {
            Event::RunStart { steps: s, .. } => {
                steps.insert(r.run.as_str(), s);
            }
            Event::StepDone { step, .. } => {
                if let Some(Step::Commit { key, .. } | Step::MigrateCopy { key, .. }) =
                    steps.get(r.run.as_str()).and_then(|s| s.get(*step))
                {
                    out.insert(key.clone());
                }
            }
            Event::Checkpoint(c) => out.extend(c.committed.iter().cloned()),
            _ => {}
        }
    }
    out
}

/// An `add keyslot` step of some run of this state directory that started and never
/// finished: its `luksAddKey` may have written the keyslot before the process died or the run
/// failed, so the keyslot may open with `version` of `key` while no record names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct UnfinishedAdd {
    /// Device id in the run's plan.
    pub device: String,
    /// Device path in the run's plan.
    pub path: String,
    /// Target keyslot.
    pub slot: u32,
    /// Key id.
    pub key: String,
    /// The version the step was adding (a `new version` step: what the run's `stage` step of
    /// the key staged).
    pub version: u64,
}

/// Every `add keyslot` step of any run in `records` with a `step_start` and no `step_done`
/// (interrupted, failed, or never resumed), deduplicated and sorted. A step adding the run's
/// staged version whose run has no done `stage` (or migration copy) of its key is left out:
/// it cannot have started. One pass over the records; a run's records are those after its
/// `run_start` with its id, as for [`last_run`]. A [`Event::Checkpoint`] adds those of the runs
/// compacted away.
pub fn unfinished_adds(records: &[Record]) -> Vec<UnfinishedAdd> {
    struct Run<'a> {
        steps: &'a [Step],
        devices: &'a [(String, String)],
        done: Vec<bool>,
        started: Vec<bool>,
        staged: std::collections::HashMap<&'a str, u64>,
    }
    fn finish(run: &Run<'_>, out: &mut BTreeSet<UnfinishedAdd>) {
        for (i, step) in run.steps.iter().enumerate() {
            let Step::AddKeyslot {
                device,
                key,
                version,
                slot,
                ..
            } = step
            else {
                continue;
            };
            if !run.started.get(i).copied().unwrap_or(false)
                || run.done.get(i).copied().unwrap_or(true)
            {
                continue;
            }
            let version = match version {
                crate::graph::VersionRef::Version(v) => Some(*v),
                crate::graph::VersionRef::Staged => run.staged.get(key.as_str()).copied(),
            };
            let path = run
                .devices
                .iter()
                .find(|(id, _)| id == device)
                .map(|(_, p)| p.clone());
            if let (Some(version), Some(path)) = (version, path) {
                out.insert(UnfinishedAdd {
                    device: device.clone(),
                    path,
                    slot: *slot,
                    key: key.clone(),
                    version,
                });
            }
        }
    }
    let mut out = BTreeSet::new();
    let mut runs: std::collections::HashMap<&str, Run<'_>> = std::collections::HashMap::new();
    for r in records {
        match &r.event {
            Event::RunStart { steps, devices, .. } => {
                let run = Run {
                    steps,
                    devices,
                    done: vec![false; steps.len()],
                    started: vec![false; steps.len()],
                    staged: std::collections::HashMap::new(),
                };
                if let Some(old) = runs.insert(&r.run, run) {
                    finish(&old, &mut out);
                }
            }
            Event::StepStart { step } => {
                if let Some(f) = runs
                    .get_mut(r.run.as_str())
                    .and_then(|run| run.started.get_mut(*step))
                {
                    *f = true;
                }
            }
            Event::StepDone {
                step,
                staged_version,
                ..
            } => {
                let Some(run) = runs.get_mut(r.run.as_str()) else {
                    continue;
                };
                if let Some(f) = run.done.get_mut(*step) {
                    *f = true;
                }
                if let (Some(v), Some(Step::Stage { key, .. } | Step::MigrateCopy { key, .. })) =
                    (staged_version, run.steps.get(*step))
                {
                    run.staged.insert(key.as_str(), *v);
                }
            }
            Event::Checkpoint(c) => out.extend(c.unfinished_adds.iter().cloned()),
            _ => {}
        }
    }
    for run in runs.values() {
        finish(run, &mut out);
    }
    out.into_iter().collect()
}

/// Summarizes the last run found in `records`, if any.
pub fn last_run(records: &[Record]) -> Option<RunSummary> {
    let start = records
        .iter()
        .rposition(|r| matches!(r.event, Event::RunStart { .. }))?;
    let first = &records[start];
    let Event::RunStart {
        steps,
        deps,
        devices,
        ..
    } = &first.event
    else {
        return None;
    };
    let mut s = RunSummary {
        run: first.run.clone(),
        started: first.ts,
        steps: steps.clone(),
        deps: deps.clone(),
        devices: devices.clone(),
        done: vec![false; steps.len()],
        started_not_done: vec![false; steps.len()],
        staged: Vec::new(),
        verified: Vec::new(),
        ended: None,
        last_error: None,
    };
    for r in records[start + 1..].iter().filter(|r| r.run == s.run) {
        match &r.event {
            Event::StepStart { step } if *step < s.steps.len() && !s.done[*step] => {
                s.started_not_done[*step] = true;
            }
            Event::StepDone {
                step,
                staged_version,
                verified_salt,
                ..
            } if *step < s.steps.len() => {
                s.done[*step] = true;
                s.started_not_done[*step] = false;
                if let (Some(v), Step::Stage { key, .. } | Step::MigrateCopy { key, .. }) =
                    (staged_version, &s.steps[*step])
                {
                    s.staged.push((key.clone(), *v));
                }
                if let Some(salt) = verified_salt {
                    s.verified.push((*step, salt.clone()));
                }
            }
            Event::StepFailed { error, .. } => s.last_error = Some(error.clone()),
            Event::RunEnd { outcome, message } => {
                s.ended = Some(outcome.clone());
                if message.is_some() {
                    s.last_error = message.clone();
                }
            }
            _ => {}
        }
    }
    Some(s)
}

/// Creates the state directory (0700) if needed and opens `<state_dir>/<name>` (created 0600)
/// for reading and writing.
fn open_state_file(state_dir: &Path, name: &str) -> Result<(PathBuf, fs::File), JournalError> {
    let path = state_dir.join(name);
    let io_err = |what, source| JournalError::Io {
        what,
        path: path.clone(),
        source,
    };
    fsutil::ensure_private_dir(state_dir).map_err(|e| io_err("creating directory of", e))?;
    let file = fsutil::open_lock_file(&path).map_err(|e| io_err("opening", e))?;
    Ok((path, file))
}

#[cfg(test)]
mod tests;
