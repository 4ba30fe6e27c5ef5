//! The journal formats (src/format/journal.rs, docs/formats.md "Journal and checkpoint"),
//! frozen by the fixtures under tests/fixtures/formats/journal/: real journals, audit trails
//! and archives written by keyplan (tests/fixtures/formats/journal/make.sh), format 1 by the
//! keyplan of commit c322096 and format 2 by this one, read back with their runs, steps and
//! outcomes; format 2 written again byte for byte; and a hand-made format 3 refused by every
//! reader with nothing written.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use keyplan::graph::Step;
use keyplan::journal::{self, compact, Event, Journal, JournalError, Record};

fn fixtures(version: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/formats/journal/{version}"))
}

fn read(path: &Path) -> Vec<Record> {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    journal::parse(&bytes, path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The op name of a step kind (as the journal tags it), by an exhaustive match: a new kind
/// fails to compile here until the fixtures cover it.
fn op(step: &Step) -> &'static str {
    match step {
        Step::Stage { .. } => "stage",
        Step::AddKeyslot { .. } => "add_keyslot",
        Step::Verify { .. } => "verify",
        Step::Commit { .. } => "commit",
        Step::KillKeyslot { .. } => "kill_keyslot",
        Step::ForgetRecord { .. } => "forget_record",
        Step::AdoptKeyslot { .. } => "adopt_keyslot",
        Step::Hold { .. } => "hold",
        Step::Release { .. } => "release",
        Step::ReleaseFormer { .. } => "release_former",
        Step::Vote { .. } => "vote",
        Step::Unvote { .. } => "unvote",
        Step::FindCopies { .. } => "find_copies",
        Step::Retire { .. } => "retire",
        Step::MigrateCopy { .. } => "migrate_copy",
        Step::DestroyOrigin { .. } => "destroy_origin",
        Step::Rerecord { .. } => "rerecord",
    }
}

const ALL_OPS: [&str; 17] = [
    "stage",
    "add_keyslot",
    "verify",
    "commit",
    "kill_keyslot",
    "forget_record",
    "adopt_keyslot",
    "hold",
    "release",
    "release_former",
    "vote",
    "unvote",
    "find_copies",
    "retire",
    "migrate_copy",
    "destroy_origin",
    "rerecord",
];

/// `(run id, outcome)` of every `run_end` in `records`, in order.
fn outcomes(records: &[Record]) -> Vec<(String, String)> {
    records
        .iter()
        .filter_map(|r| match &r.event {
            Event::RunEnd { outcome, .. } => Some((r.run.clone(), outcome.clone())),
            _ => None,
        })
        .collect()
}

/// The steps of run `run` in `records`.
fn steps_of<'a>(records: &'a [Record], run: &str) -> &'a [Step] {
    records
        .iter()
        .find_map(|r| match &r.event {
            Event::RunStart { steps, .. } if r.run == run => Some(steps.as_slice()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no run_start of run {run}"))
}

/// What make.sh's scenarios did, checked in the fixtures of `version` (the same checks for
/// every format: a newer keyplan reads what each wrote as it was meant).
fn check_scenarios(version: &str) {
    let dir = fixtures(version);
    let life = dir.join("lifecycle");
    let (archive, history) = (
        read(&life.join("archive.jsonl")),
        read(&life.join("history.jsonl")),
    );
    let (now, interrupted) = (
        read(&life.join("journal.jsonl")),
        read(&life.join("interrupted.jsonl")),
    );

    // Every run reached one of the three files once; the journal starts with the checkpoint of
    // the runs compacted away, through the one the audit trail keeps.
    let mut ended = outcomes(&archive);
    ended.extend(outcomes(&history));
    ended.extend(outcomes(&now));
    let kinds: Vec<&str> = ended.iter().map(|(_, o)| o.as_str()).collect();
    assert_eq!(
        kinds,
        ["success", "success", "success", "success", "failed", "success", "success", "success"],
        "{version}: {ended:?}"
    );
    let Event::Checkpoint(c) = &now[0].event else {
        panic!(
            "{version}: the journal does not start with its checkpoint: {:?}",
            now[0]
        );
    };
    assert_eq!(now[0].run, compact::CHECKPOINT_RUN);
    assert_eq!(c.compacted_runs, 7, "{version}");
    assert_eq!(
        c.through, ended[6].0,
        "{version}: through the run history.jsonl keeps"
    );
    assert!(c.committed.contains(&"e".to_string()), "{version}: {c:?}");
    assert!(c.kms_keys.contains(&"k".to_string()), "{version}: {c:?}");
    assert_eq!(
        journal::last_success_at(&now),
        Some(now.last().map_or(0, |r| r.ts))
    );

    // The failed run: its stage failed on the KMS write, nothing after it ran.
    let failed = &ended[4].0;
    let failure = archive
        .iter()
        .find_map(|r| match &r.event {
            Event::StepFailed { step, error } if &r.run == failed => Some((*step, error)),
            _ => None,
        })
        .expect("a step_failed record");
    assert!(matches!(
        steps_of(&archive, failed)[failure.0],
        Step::Stage { .. }
    ));
    assert!(failure.1.contains("Is a directory"), "{}", failure.1);

    // The interrupted run, as the signal left it: not ended, its stage done with v4, the rest
    // not; the next apply resumed it (`run_resumed`) and finished it.
    let run = journal::last_run(&interrupted).expect("the interrupted run");
    assert_eq!(run.ended, None, "{version}");
    assert_eq!(run.staged, [("e".to_string(), 4)], "{version}");
    let done = run.done.iter().filter(|d| **d).count();
    assert!(
        done >= 1 && done < run.steps.len(),
        "{version}: {done} of {}",
        run.steps.len()
    );
    assert!(
        archive
            .iter()
            .any(|r| r.run == run.run && matches!(r.event, Event::RunResumed { .. })),
        "{version}: the interrupted run was resumed"
    );
    assert!(ended.iter().any(|(id, o)| *id == run.run && o == "success"));

    // The migration of k moved it from KMS local to other.
    let moved = archive
        .iter()
        .chain(&history)
        .chain(&now)
        .any(|r| match &r.event {
            Event::RunStart { steps, .. } => steps.iter().any(|s| {
                matches!(s, Step::MigrateCopy { key, from_kms, to_kms, .. }
                if key == "k" && from_kms == "local" && to_kms == "other")
            }),
            _ => false,
        });
    assert!(moved, "{version}: no migration of k");

    // Every step kind is in the fixtures, lifecycle and fleet together.
    let mut all = vec![archive, history, now, interrupted];
    for node in ["n1", "n2"] {
        for file in ["journal.jsonl", "history.jsonl"] {
            all.push(read(&dir.join("fleet").join(node).join(file)));
        }
    }
    let seen: BTreeSet<&str> = all
        .iter()
        .flatten()
        .filter_map(|r| match &r.event {
            Event::RunStart { steps, .. } => Some(steps.iter().map(op)),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(seen, ALL_OPS.into_iter().collect(), "{version}");
}

#[test]
fn format_1_fixtures_read_with_their_runs_steps_and_outcomes() {
    check_scenarios("v1");
}

#[test]
fn format_2_fixtures_read_with_their_runs_steps_and_outcomes() {
    check_scenarios("v2");
}

/// Every `.jsonl` file under `dir`.
fn jsonl_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("fixture dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(jsonl_files(&path));
        } else if path.extension().is_some_and(|e| e == "jsonl") {
            out.push(path);
        }
    }
    out.sort();
    out
}

#[test]
fn format_2_is_written_again_byte_for_byte_and_is_format_1_with_its_version() {
    let v2 = jsonl_files(&fixtures("v2"));
    assert_eq!(v2.len(), 8, "{v2:?}");
    for path in v2 {
        let bytes = fs::read(&path).expect("read");
        let mut again = String::new();
        for r in read(&path) {
            again.push_str(&journal::encode(&r).expect("encode"));
            again.push('\n');
        }
        assert!(
            again.as_bytes() == bytes,
            "{} is not written again as it was",
            path.display()
        );
    }
    // A format 1 line becomes format 2 by its version alone: no field renamed, added or lost.
    for path in jsonl_files(&fixtures("v1")) {
        let text = fs::read_to_string(&path).expect("read");
        for (line, r) in text.lines().zip(read(&path)) {
            let written = journal::encode(&r).expect("encode");
            assert_eq!(
                written,
                format!("{{\"format\":2,{}", &line[1..]),
                "{}",
                path.display()
            );
        }
    }
}

/// A scratch state directory holding `journal` (and `history`) as its files.
fn state_dir(journal: &[u8], history: Option<&[u8]>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    fs::write(dir.path().join(journal::JOURNAL_FILE), journal).expect("journal");
    if let Some(h) = history {
        fs::write(dir.path().join(compact::HISTORY_FILE), h).expect("history");
    }
    dir
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// `err` is the refusal of a journal format 3 record at `path` line `line`.
fn assert_newer(err: &JournalError, path: &Path, line: usize) {
    let text = err.to_string();
    assert!(matches!(err, JournalError::Newer(_)), "{err:?}");
    assert!(
        text.starts_with(&format!(
            "{} line {line} is journal format 3, written by a newer keyplan",
            path.display()
        )),
        "{text}"
    );
    assert!(text.contains("reads journal formats up to 2"), "{text}");
    assert!(text.contains("Nothing was changed or written"), "{text}");
}

#[test]
fn a_newer_journal_is_refused_whole_or_without_its_newline_and_left_as_it_was() {
    let v3 = fs::read(fixtures("v3").join("journal.jsonl")).expect("v3 journal");
    let lines = v3.iter().filter(|b| **b == b'\n').count();
    // As written, and as a crash would leave its last record: whole but without its newline
    // (which a torn write would be cut off for).
    for bytes in [
        v3.clone(),
        v3.strip_suffix(b"\n").expect("newline").to_vec(),
    ] {
        let dir = state_dir(&bytes, None);
        let path = dir.path().join(journal::JOURNAL_FILE);
        assert_newer(&journal::read(dir.path()).expect_err("read"), &path, lines);
        assert_newer(&Journal::open(dir.path()).expect_err("open"), &path, lines);
        assert_eq!(
            fs::read(&path).expect("journal"),
            bytes,
            "the journal was changed"
        );
        assert_eq!(names(dir.path()), ["journal.jsonl"]);
    }
}

#[test]
fn compaction_and_the_audit_trail_refuse_newer_records_and_write_nothing() {
    let v2 = fixtures("v2").join("fleet/n2");
    let journal_v2 = fs::read(v2.join("journal.jsonl")).expect("journal");
    let history_v3 = fs::read(fixtures("v3").join("history.jsonl")).expect("v3 history");
    let archive = tempfile::tempdir().expect("tempdir");
    let retention = keyplan::spec::JournalRetention {
        keep_runs: 1,
        archive: Some(archive.path().join("archive.jsonl")),
    };

    // A newer history: not set aside as damaged, not rewritten, nothing archived.
    let dir = state_dir(&journal_v2, Some(&history_v3));
    let history = dir.path().join(compact::HISTORY_FILE);
    let mut j = Journal::open(dir.path()).expect("open");
    // A finished run to move, so that the compaction has work.
    for event in [
        Event::RunStart {
            steps: Vec::new(),
            deps: Vec::new(),
            plan_file: "keyplan.yaml".into(),
            devices: Vec::new(),
            pid: 1,
            host: "h".into(),
        },
        Event::RunEnd {
            outcome: "success".into(),
            message: None,
        },
    ] {
        j.append("late-run", event).expect("append");
    }
    let before = fs::read(dir.path().join(journal::JOURNAL_FILE)).expect("journal");
    let err = compact::compact(dir.path(), &mut j, &retention).expect_err("compact");
    assert_newer(&err, &history, 1);
    assert_newer(
        &compact::read_with_history(dir.path()).expect_err("read"),
        &history,
        1,
    );
    assert_eq!(
        fs::read(dir.path().join(journal::JOURNAL_FILE)).expect("journal"),
        before
    );
    assert_eq!(fs::read(&history).expect("history"), history_v3);
    assert_eq!(
        names(dir.path()),
        ["history.jsonl", "journal.jsonl"],
        "no history set aside"
    );
    assert_eq!(
        names(archive.path()),
        Vec::<String>::new(),
        "nothing archived"
    );

    // A newer record in the journal itself (appended behind an open handle): the compaction
    // refuses before it writes the history or the journal.
    let dir = state_dir(&journal_v2, None);
    let path = dir.path().join(journal::JOURNAL_FILE);
    let mut j = Journal::open(dir.path()).expect("open");
    let mut bytes = fs::read(&path).expect("journal");
    bytes.extend_from_slice(&history_v3);
    fs::write(&path, &bytes).expect("write");
    let line = journal_v2.iter().filter(|b| **b == b'\n').count() + 1;
    assert_newer(
        &compact::compact(dir.path(), &mut j, &retention).expect_err("compact"),
        &path,
        line,
    );
    assert_eq!(fs::read(&path).expect("journal"), bytes);
    assert_eq!(names(dir.path()), ["journal.jsonl"]);
    assert_eq!(names(archive.path()), Vec::<String>::new());
}

#[test]
fn an_archive_holding_newer_records_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let archive = dir.path().join("archive.jsonl");
    let plan = "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local }\ndevices:\n  a: { path: a.img, keys: [k] }\n";
    let mut plan = keyplan::spec::load_str(
        plan,
        "keyplan.yaml",
        keyplan::spec::Format::Yaml,
        dir.path(),
    )
    .expect("plan");
    plan.journal.archive = Some(archive.clone());
    let v3 = fs::read(fixtures("v3").join("history.jsonl")).expect("v3");
    fs::write(&archive, &v3).expect("archive");
    let err = compact::check_archive(&plan).expect_err("a newer archive");
    assert!(
        err.contains(&format!("{} line 1 is journal format 3", archive.display())),
        "{err}"
    );
    assert_eq!(fs::read(&archive).expect("archive"), v3);
    // An archive of format 1 or 2 is one to append to.
    for version in ["v1", "v2"] {
        fs::copy(fixtures(version).join("lifecycle/archive.jsonl"), &archive).expect("copy");
        compact::check_archive(&plan).unwrap_or_else(|e| panic!("{version}: {e}"));
    }
}

#[test]
fn only_a_line_that_is_not_json_is_a_torn_write() {
    let path = Path::new("journal.jsonl");
    let a = br#"{"format":2,"ts":1,"run":"r","event":"run_resumed","pid":1}"#;
    let parse = |parts: &[&[u8]]| journal::parse(&parts.concat(), path);
    // Torn (not JSON): ignored as before.
    assert_eq!(parse(&[a, b"\n", &a[..20]]).expect("torn").len(), 1);
    // Whole JSON of a newer format, with an event this keyplan does not know: refused.
    let newer = br#"{"format":3,"ts":2,"run":"r","event":"run_paused","until":9}"#;
    assert_newer(&parse(&[a, b"\n", newer]).expect_err("newer"), path, 2);
    assert_newer(
        &parse(&[a, b"\n", newer, b"\n"]).expect_err("newer"),
        path,
        2,
    );
    // Whole JSON of a known format that is no record: corrupt, not skipped.
    let odd = br#"{"format":2,"ts":2,"run":"r","event":"run_paused"}"#;
    assert!(matches!(
        parse(&[a, b"\n", odd]),
        Err(JournalError::Corrupt { line: 2, .. })
    ));
}
