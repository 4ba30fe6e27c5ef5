//! Journal compaction: finished runs leave the write-ahead journal for a bounded audit trail.
//!
//! After a run ends, [`compact`] (called by the apply session, under the state lock) moves every
//! finished run but the last out of `<state_dir>/journal.jsonl`:
//!
//! 1. their records are appended to the audit trail `<state_dir>/history.jsonl` (a run
//!    already there is not added twice), which keeps the runs before the journal's last
//!    finished one, so that both together hold the last
//!    [`crate::spec::JournalRetention::keep_runs`] finished runs; the records of older runs are appended
//!    first, as the same JSON Lines, to the archive file the operator named
//!    ([`crate::spec::JournalRetention::archive`], e.g. a file a log shipper tails), or
//!    dropped when none is named;
//! 2. the journal is rewritten as a [`Checkpoint`] record (what observation still needs of the
//!    runs moved out: staged versions, unfinished adds, keys written, keys committed), then
//!    the last finished run and every unfinished run, in their order.
//!
//! Every file is replaced atomically (temporary file, `fsync`, `rename(2)`, `fsync` of the
//! directory), so a crash at any instant leaves each file old or new. The journal is replaced
//! last: until then it still holds everything, and a compaction after a crash finds the runs it
//! had already copied in the history and does not copy them again. The archive is appended to
//! at least once: a crash after the archive's `fsync` and before the history's rename appends
//! the same records again next time (each record names its run and time, for a pipeline that
//! deduplicates). The last finished run stays in the journal, so `status`, saved plans and
//! `journal` keep seeing it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use super::{Checkpoint, Event, Journal, JournalError, Record, JOURNAL_FILE};
use crate::format::journal::LineError;
use crate::spec::JournalRetention;

/// Audit-trail file name inside the state directory.
pub const HISTORY_FILE: &str = "history.jsonl";
/// Run id of a [`Checkpoint`] record.
pub const CHECKPOINT_RUN: &str = "checkpoint";
/// Staged versions a [`Checkpoint`] keeps per key (the highest): a version a later run of this
/// plan could find pending in its KMS is among the last it staged.
pub const STAGED_PER_KEY: usize = 4;

/// What one compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Compaction {
    /// Runs moved from the journal to the history.
    pub moved: usize,
    /// Runs that left the history (appended to the archive when one is named).
    pub expired: usize,
    /// Whether the expired runs were appended to the archive.
    pub archived: bool,
    /// Bytes of the journal before and after.
    pub journal_bytes: (u64, u64),
}

/// Moves the finished runs of `journal` but the last into the history and rewrites the
/// journal (see the module documentation); `journal` then appends to the new file. Returns
/// `None` when there is nothing to move. The caller holds the state lock.
///
/// Errors: [`JournalError::Io`] and [`JournalError::Corrupt`] from reading the journal or the
/// history, or writing the archive, the history or the journal. Nothing is lost on error: the
/// journal is replaced last, and before that every file that was written holds the old
/// content or the new one.
pub fn compact(
    state_dir: &Path,
    journal: &mut Journal,
    retention: &JournalRetention,
) -> Result<Option<Compaction>, JournalError> {
    let journal_path = state_dir.join(JOURNAL_FILE);
    let before = fs::metadata(&journal_path).map(|m| m.len()).unwrap_or(0);
    let records = super::read(state_dir)?;
    let Some(split) = split(&records) else {
        return Ok(None);
    };

    // 1. The history, with the runs moved out added, cut to the newest `keep_runs`.
    let history_path = state_dir.join(HISTORY_FILE);
    let history = read_history(state_dir)?;
    let known: HashSet<&str> = history.iter().map(|r| r.run.as_str()).collect();
    let mut trail: Vec<&Record> = history.iter().collect();
    trail.extend(
        split
            .moved
            .iter()
            .filter(|r| !known.contains(r.run.as_str())),
    );
    let order = run_order(trail.iter().copied());
    let expired: HashSet<&str> = order
        .iter()
        .take(
            order
                .len()
                .saturating_sub(retention.keep_runs.saturating_sub(1)),
        )
        .copied()
        .collect();
    let (gone, kept): (Vec<&Record>, Vec<&Record>) = trail
        .into_iter()
        .partition(|r| expired.contains(r.run.as_str()));
    let mut archived = false;
    if let (Some(archive), false) = (&retention.archive, gone.is_empty()) {
        append_lines(archive, &gone)?;
        archived = true;
    }
    point("journal.compact.after_archive", &history_path)?;
    write_lines(&history_path, None, &kept)?;
    point("journal.compact.after_history", &history_path)?;

    // 2. The journal: a checkpoint, then what stays.
    let checkpoint = Record {
        ts: crate::clock::now_unix(),
        run: CHECKPOINT_RUN.to_owned(),
        event: Event::Checkpoint(fold(split.checkpoint, &split.moved)),
    };
    let bytes = lines(Some(&checkpoint), &split.kept)
        .map_err(|e| io_err(journal_path.clone(), e.to_string()))?;
    journal.replace(&bytes)?;
    point("journal.compact.after_journal", &journal_path)?;
    let after = fs::metadata(&journal_path).map(|m| m.len()).unwrap_or(0);
    Ok(Some(Compaction {
        moved: run_order(split.moved.iter().copied()).len(),
        expired: expired.len(),
        archived,
        journal_bytes: (before, after),
    }))
}

/// Checks the archive `plan.journal.archive` names, if any, before a run: it must not be one
/// of the plan's own files ([`crate::spec::Plan::protected_path`]: the plan, a device, an
/// `enroll_with` file, the state directory, a file KMS), and a file that exists must be a
/// regular file whose first line is a journal record (an archive written before), so that
/// `--journal-archive keyplan.yaml` or `--journal-archive /dev/sdb` appends to nothing. A file
/// that does not exist yet must be in a directory that does: keyplan creates the file, not
/// its directory, and an archive it cannot create would fail every compaction that expires a
/// run, after the run, where `-q` hides it. An archive whose first record is of a newer
/// journal format ([`crate::format::journal`]) is refused with its [`crate::format::NewerFormat`].
///
/// Errors: a text saying why the file is refused and what to do.
pub fn check_archive(plan: &crate::spec::Plan) -> Result<(), String> {
    let Some(path) = &plan.journal.archive else {
        return Ok(());
    };
    let refuse_with = |why: String, advice: String| {
        Err(format!(
            "refusing --journal-archive {}: {why}; nothing was run. {advice}",
            path.display()
        ))
    };
    let refuse = |why: String| {
        refuse_with(
            why,
            "Name a file of its own (a new one, or an archive keyplan wrote)".into(),
        )
    };
    if let Some(why) = plan.protected_path(path) {
        return refuse(why);
    }
    let Ok(meta) = fs::symlink_metadata(path) else {
        // A new archive: its directory must be there (`parent` of a relative name is "").
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        return match fs::metadata(dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => refuse_with(
                format!("{} is not a directory", dir.display()),
                "Name a file in an existing directory".into(),
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => refuse_with(
                format!("its directory {} does not exist", dir.display()),
                format!(
                    "Create it first (`mkdir -p {}`), or name a file in an existing directory",
                    dir.display()
                ),
            ),
            Err(e) => refuse_with(
                format!("its directory {} cannot be checked ({e})", dir.display()),
                "Name a file in an existing directory keyplan can reach".into(),
            ),
        };
    };
    if !meta.is_file() {
        return refuse("it exists and is not a regular file".into());
    }
    let mut head = Vec::new();
    if fs::File::open(path)
        .and_then(|f| io::Read::read_to_end(&mut io::Read::take(f, 1 << 20), &mut head))
        .is_err()
    {
        return refuse("it exists and cannot be read to check what it is".into());
    }
    // An empty file is no archive (keyplan writes whole records into a new one): a lock file,
    // say.
    let first = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let document = || format!("{} line 1", path.display());
    match super::decode(first, document) {
        Ok(_) => Ok(()),
        // Written by a newer keyplan: this one appends nothing to it.
        Err(LineError::Newer(e)) => Err(format!("refusing --journal-archive: {e}")),
        Err(_) => refuse("it exists and is not a journal archive".into()),
    }
}

/// The records of the audit trail and the journal of `state_dir`, oldest first: the history's
/// runs, then the journal's [`Checkpoint`] record (if it was compacted), then the journal's
/// runs (a run in both files, left by a compaction that crashed, once). A damaged audit trail
/// is set aside with a warning, as a compaction does, when the state lock is free (taken for
/// that moment only); while a run holds it, it is left for that run, and only the journal is
/// returned.
///
/// Errors: [`JournalError::Io`] for either file, [`JournalError::Corrupt`] for the journal.
pub fn read_with_history(state_dir: &Path) -> Result<Vec<Record>, JournalError> {
    let journal = super::read(state_dir)?;
    let history = match super::read_path(&state_dir.join(HISTORY_FILE)) {
        // Set aside under the state lock, so that it cannot race a compaction replacing the
        // file; a run that holds the lock sets it aside itself when it compacts.
        Err(JournalError::Corrupt {
            path,
            line,
            message,
        }) => match super::StateLock::acquire(state_dir) {
            Ok(_lock) => read_history(state_dir)?,
            Err(e) => {
                tracing::warn!(
                    "the audit trail {} is damaged at line {line} ({message}); it was left in place ({e}); showing the journal alone. The next run sets it aside",
                    path.display()
                );
                Vec::new()
            }
        },
        other => other?,
    };
    let in_journal: HashSet<&str> = journal.iter().map(|r| r.run.as_str()).collect();
    let mut out: Vec<Record> = history
        .into_iter()
        .filter(|r| !in_journal.contains(r.run.as_str()))
        .collect();
    let (check, runs): (Vec<Record>, Vec<Record>) = journal
        .into_iter()
        .partition(|r| matches!(r.event, Event::Checkpoint(_)));
    out.extend(check);
    out.extend(runs);
    Ok(out)
}

/// The audit trail `<state_dir>/history.jsonl`, oldest first (none when it does not exist). A
/// damaged one is set aside as `history.jsonl.corrupt-<unix seconds>` (kept for a person to
/// read), with a warning naming both files, and none returned: the audit trail is not the
/// write-ahead log and nothing resumes from it, so its damage stops neither a compaction (the
/// journal would grow for ever) nor `keyplan journal`. The caller holds the state lock.
///
/// Errors: [`JournalError::Io`] reading it or moving it aside.
fn read_history(state_dir: &Path) -> Result<Vec<Record>, JournalError> {
    let history_path = state_dir.join(HISTORY_FILE);
    match super::read_path(&history_path) {
        Err(JournalError::Corrupt { line, message, .. }) => {
            let aside = state_dir.join(format!(
                "{HISTORY_FILE}.corrupt-{}",
                crate::clock::now_unix()
            ));
            fs::rename(&history_path, &aside).map_err(|source| JournalError::Io {
                what: "setting aside the damaged audit trail",
                path: history_path.clone(),
                source,
            })?;
            tracing::warn!(
                "the audit trail {} was damaged at line {line} ({message}); it was moved to {} and a new one is started",
                history_path.display(),
                aside.display()
            );
            Ok(Vec::new())
        }
        other => other,
    }
}

/// The journal's [`Checkpoint`], if it was compacted.
pub fn checkpoint(records: &[Record]) -> Option<&Checkpoint> {
    records.iter().find_map(|r| match &r.event {
        Event::Checkpoint(c) => Some(c),
        _ => None,
    })
}

/// A journal's records sorted for compaction.
struct Split<'a> {
    /// The checkpoint so far (default when the journal was never compacted).
    checkpoint: Checkpoint,
    /// Records of the finished runs to move, in journal order.
    moved: Vec<&'a Record>,
    /// Records that stay: the last finished run and every unfinished run, in journal order.
    kept: Vec<&'a Record>,
}

/// Sorts `records`; `None` when no run is to move. A run is finished when its `run_start` and
/// a `run_end` are both in the journal; records of a run without a `run_start` here stay.
fn split(records: &[Record]) -> Option<Split<'_>> {
    let mut started = HashSet::new();
    let mut ended = HashSet::new();
    for r in records {
        match r.event {
            Event::RunStart { .. } => {
                started.insert(r.run.as_str());
            }
            Event::RunEnd { .. } => {
                ended.insert(r.run.as_str());
            }
            _ => {}
        }
    }
    let finished: Vec<&str> = run_order(records.iter())
        .into_iter()
        .filter(|id| started.contains(id) && ended.contains(id))
        .collect();
    let last = *finished.last()?;
    let moving: HashSet<&str> = finished.into_iter().filter(|id| *id != last).collect();
    if moving.is_empty() {
        return None;
    }
    let mut out = Split {
        checkpoint: checkpoint(records).cloned().unwrap_or_default(),
        moved: Vec::new(),
        kept: Vec::new(),
    };
    for r in records {
        match &r.event {
            Event::Checkpoint(_) => {}
            _ if moving.contains(r.run.as_str()) => out.moved.push(r),
            _ => out.kept.push(r),
        }
    }
    Some(out)
}

/// Run ids in order of first appearance (checkpoint records left out).
fn run_order<'a>(records: impl Iterator<Item = &'a Record>) -> Vec<&'a str> {
    let mut seen = HashSet::new();
    records
        .filter(|r| !matches!(r.event, Event::Checkpoint(_)))
        .map(|r| r.run.as_str())
        .filter(|id| seen.insert(*id))
        .collect()
}

/// `old` with the facts of the finished runs in `moved` (whole runs, in journal order) added.
fn fold(old: Checkpoint, moved: &[&Record]) -> Checkpoint {
    let runs = run_order(moved.iter().copied());
    let mut staged: BTreeSet<(String, Option<u64>)> = old.staged.into_iter().collect();
    for id in &runs {
        let own: Vec<Record> = moved
            .iter()
            .filter(|r| r.run == *id)
            .map(|r| (*r).clone())
            .collect();
        let facts = super::staged_versions(&own);
        // A later stage of a key by this plan settles an earlier lost reply: staging takes a
        // pending version over ("staged (or reused)"), so the lost write, if it happened, is
        // the version this run staged.
        for (key, v) in &facts {
            if v.is_some() {
                staged.remove(&(key.clone(), None));
            }
        }
        staged.extend(facts);
    }
    let mut per_key: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (key, v) in &staged {
        if let Some(v) = v {
            per_key.entry(key.clone()).or_default().push(*v);
        }
    }
    staged.retain(|(key, v)| match v {
        None => true,
        Some(v) => per_key
            .get(key)
            .is_some_and(|vs| vs.iter().rev().take(STAGED_PER_KEY).any(|x| x == v)),
    });
    let owned: Vec<Record> = moved.iter().map(|r| (*r).clone()).collect();
    let mut unfinished: BTreeSet<_> = old.unfinished_adds.into_iter().collect();
    unfinished.extend(super::unfinished_adds(&owned));
    let mut kms_keys: BTreeSet<String> = old.kms_keys.into_iter().collect();
    kms_keys.extend(super::planned_kms_keys(&owned));
    let mut committed: BTreeSet<String> = old.committed.into_iter().collect();
    committed.extend(super::committed_keys(&owned));
    Checkpoint {
        compacted_runs: old.compacted_runs + runs.len() as u64,
        through: runs.last().map_or(old.through, |id| (*id).to_owned()),
        staged: staged.into_iter().collect(),
        unfinished_adds: unfinished.into_iter().collect(),
        kms_keys: kms_keys.into_iter().collect(),
        committed: committed.into_iter().collect(),
        last_success_at: super::last_success_at(&owned).or(old.last_success_at),
    }
}

/// One JSON line per record (journal format 2), redacted as [`Journal::append`] writes them.
fn lines(first: Option<&Record>, records: &[&Record]) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::new();
    for r in first.into_iter().chain(records.iter().copied()) {
        let text = super::encode(r)?;
        out.extend_from_slice(crate::secret::redact::redact_json(&text).as_bytes());
        out.push(b'\n');
    }
    Ok(out)
}

/// Replaces `path` atomically (mode 0600) with `first` and `records` as JSON Lines.
fn write_lines(
    path: &Path,
    first: Option<&Record>,
    records: &[&Record],
) -> Result<(), JournalError> {
    let bytes = lines(first, records).map_err(|e| io_err(path.to_path_buf(), e.to_string()))?;
    crate::fsutil::write_atomic(path, &bytes, 0o600).map_err(|source| JournalError::Io {
        what: "rewriting",
        path: path.to_path_buf(),
        source,
    })
}

/// Appends `records` to the archive `path` (created 0600) and `fsync`s it.
fn append_lines(path: &Path, records: &[&Record]) -> Result<(), JournalError> {
    let bytes = lines(None, records).map_err(|e| io_err(path.to_path_buf(), e.to_string()))?;
    let err = |source| JournalError::Io {
        what: "appending expired runs to the journal archive",
        path: path.to_path_buf(),
        source,
    };
    let mut file = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    file.write_all(&bytes)
        .and_then(|()| file.sync_data())
        .map_err(err)
}

/// Evaluates failpoint `name` (a crash, or an injected error naming `path`).
fn point(name: &str, path: &Path) -> Result<(), JournalError> {
    crate::failpoint::check(name).map_err(|e| io_err(path.to_path_buf(), e))
}

fn io_err(path: PathBuf, message: String) -> JournalError {
    JournalError::Io {
        what: "compacting",
        path,
        source: io::Error::other(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Step, Unlock, VersionRef};
    use crate::journal::{
        committed_keys, planned_kms_keys, staged_versions, unfinished_adds, UnfinishedAdd,
    };

    fn rec(run: &str, event: Event) -> Record {
        Record {
            ts: 0,
            run: run.into(),
            event,
        }
    }

    fn start(steps: Vec<Step>) -> Event {
        Event::RunStart {
            steps,
            deps: vec![],
            plan_file: "keyplan.yaml".into(),
            devices: vec![("d1".into(), "/dev/d1".into())],
            pid: 1,
            host: "h".into(),
        }
    }

    fn done(step: usize, staged_version: Option<u64>) -> Event {
        Event::StepDone {
            step,
            outcome: "ok".into(),
            staged_version,
            verified_salt: None,
        }
    }

    fn end(outcome: &str) -> Event {
        Event::RunEnd {
            outcome: outcome.into(),
            message: None,
        }
    }

    fn stage(key: &str) -> Step {
        Step::Stage {
            key: key.into(),
            at_least: 1,
            planned_current: None,
        }
    }

    fn commit(key: &str) -> Step {
        Step::Commit {
            key: key.into(),
            expected_current: None,
        }
    }

    /// A run that stages `key` as `v` and commits it.
    fn rotation(id: &str, key: &str, v: u64) -> Vec<Record> {
        vec![
            rec(id, start(vec![stage(key), commit(key)])),
            rec(id, Event::StepStart { step: 0 }),
            rec(id, done(0, Some(v))),
            rec(id, Event::StepStart { step: 1 }),
            rec(id, done(1, None)),
            rec(id, end("success")),
        ]
    }

    /// Writes `records` as the journal of `dir` (as appends would) and opens it.
    fn journal_of(dir: &Path, records: &[Record]) -> Journal {
        let mut j = Journal::open(dir).expect("open");
        for r in records {
            j.append(&r.run, r.event.clone()).expect("append");
        }
        j
    }

    type Facts = (
        BTreeSet<(String, Option<u64>)>,
        Vec<UnfinishedAdd>,
        BTreeSet<String>,
        BTreeSet<String>,
    );

    fn facts(records: &[Record]) -> Facts {
        (
            staged_versions(records),
            unfinished_adds(records),
            planned_kms_keys(records),
            committed_keys(records),
        )
    }

    fn retention(keep_runs: usize, archive: Option<PathBuf>) -> JournalRetention {
        JournalRetention { keep_runs, archive }
    }

    /// What observation reads from the journal (staged versions, unfinished adds, keys
    /// written, keys committed) is the same before and after a compaction that moves every
    /// run but the last out, and after a second one; the journal keeps the last run, appends
    /// go to the new file, and the audit trail and the archive hold the rest.
    #[test]
    fn a_compaction_keeps_what_observation_reads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let add = Step::AddKeyslot {
            device: "d1".into(),
            key: "k".into(),
            version: VersionRef::Version(2),
            slot: 4,
            unlock: Unlock::EnrollWith,
        };
        let mut records = rotation("r1", "k", 2);
        // r2: a stage of k2 whose reply was lost, an add of k v2 that failed after it started.
        records.extend([
            rec("r2", start(vec![stage("k2"), add])),
            rec("r2", Event::StepStart { step: 0 }),
            rec("r2", Event::StepStart { step: 1 }),
            rec(
                "r2",
                Event::StepFailed {
                    step: 1,
                    error: "cryptsetup failed".into(),
                },
            ),
            rec("r2", end("failed")),
        ]);
        records.extend(rotation("r3", "k", 3));
        let mut j = journal_of(&state, &records);
        let before = facts(&records);
        assert_eq!(before.1.len(), 1, "{before:?}");
        assert!(before.0.contains(&("k2".into(), None)), "{before:?}");
        let archive = dir.path().join("archive.jsonl");
        let c = compact(&state, &mut j, &retention(2, Some(archive.clone())))
            .expect("compact")
            .expect("runs to move");
        assert_eq!((c.moved, c.expired, c.archived), (2, 1, true));
        assert!(c.journal_bytes.1 < c.journal_bytes.0, "{c:?}");
        let now = crate::journal::read(&state).expect("read");
        assert_eq!(facts(&now), before);
        let runs: BTreeSet<&str> = now.iter().map(|r| r.run.as_str()).collect();
        assert_eq!(runs, BTreeSet::from([CHECKPOINT_RUN, "r3"]));
        // Nothing more to move until another run ends.
        assert_eq!(
            compact(&state, &mut j, &retention(2, None)).expect("compact"),
            None
        );

        // The handle appends to the new journal.
        for r in rotation("r4", "k2", 1) {
            j.append(&r.run, r.event).expect("append");
        }
        let c = compact(&state, &mut j, &retention(2, Some(archive.clone())))
            .expect("compact")
            .expect("r3 moves");
        assert_eq!((c.moved, c.expired), (1, 1));
        let now = crate::journal::read(&state).expect("read");
        let (staged, adds, kms, committed) = facts(&now);
        // r4 (still in the journal) staged k2 v1; r2's lost reply stays in the checkpoint
        // until r4 moves out too.
        assert_eq!(
            staged,
            BTreeSet::from([
                ("k".into(), Some(2)),
                ("k".into(), Some(3)),
                ("k2".into(), None),
                ("k2".into(), Some(1))
            ])
        );
        assert_eq!((adds, kms.len(), committed.len()), (before.1, 2, 2));
        let cp = checkpoint(&now).expect("checkpoint");
        assert_eq!((cp.compacted_runs, cp.through.as_str()), (3, "r3"));

        // The audit trail keeps r3 (with r4 in the journal: keep_runs 2); the archive got r1
        // and r2, whole; `read_with_history` shows each run once.
        let trail = read_with_history(&state).expect("read");
        let ids = run_order(trail.iter());
        assert_eq!(ids, vec!["r3", "r4"]);
        let archived = crate::journal::read_path(&archive).expect("archive");
        assert_eq!(run_order(archived.iter()), vec!["r1", "r2"]);
        assert_eq!(archived.len(), records.len() - 6);

        // Once r4 moves out, its stage of k2 settles r2's lost reply.
        for r in rotation("r5", "k", 4) {
            j.append(&r.run, r.event).expect("append");
        }
        compact(&state, &mut j, &retention(2, None))
            .expect("compact")
            .expect("r4 moves");
        let staged = staged_versions(&crate::journal::read(&state).expect("read"));
        assert!(!staged.contains(&("k2".into(), None)), "{staged:?}");
        assert!(staged.contains(&("k2".into(), Some(1))), "{staged:?}");
    }

    /// A run already in the audit trail (a compaction that crashed after writing the history
    /// and before replacing the journal) is not copied twice, and shows once.
    #[test]
    fn a_run_copied_before_a_crash_is_not_copied_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let mut records = rotation("r1", "k", 2);
        records.extend(rotation("r2", "k", 3));
        let mut j = journal_of(&state, &records);
        // What the crashed compaction left: r1 in the history, the journal untouched.
        let r1: Vec<&Record> = records.iter().filter(|r| r.run == "r1").collect();
        write_lines(&state.join(HISTORY_FILE), None, &r1).expect("history");
        let shown = read_with_history(&state).expect("read");
        assert_eq!(shown.len(), records.len());
        compact(&state, &mut j, &retention(10, None))
            .expect("compact")
            .expect("r1 moves");
        let history = crate::journal::read_path(&state.join(HISTORY_FILE)).expect("history");
        assert_eq!(history.len(), r1.len());
        assert_eq!(
            read_with_history(&state).expect("read").len(),
            records.len() + 1
        );
    }

    /// The checkpoint keeps the highest [`STAGED_PER_KEY`] staged versions of a key, however
    /// many runs staged it.
    #[test]
    fn the_checkpoint_is_bounded_by_keys_not_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let mut j = Journal::open(&state).expect("open");
        for v in 2..40u64 {
            for r in rotation(&format!("r{v}"), "k", v) {
                j.append(&r.run, r.event).expect("append");
            }
            compact(&state, &mut j, &retention(3, None)).expect("compact");
        }
        let now = crate::journal::read(&state).expect("read");
        let staged: Vec<u64> = staged_versions(&now)
            .into_iter()
            .filter_map(|(_, v)| v)
            .collect();
        assert_eq!(staged, vec![35, 36, 37, 38, 39]);
        assert_eq!(checkpoint(&now).map(|c| c.compacted_runs), Some(37));
        let trail = read_with_history(&state).expect("read");
        assert_eq!(run_order(trail.iter()), vec!["r37", "r38", "r39"]);
    }
}
