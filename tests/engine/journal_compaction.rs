//! Journal compaction (issue 32, src/journal/compact.rs): after each run, finished runs leave
//! `journal.jsonl` for the bounded audit trail `history.jsonl`, and runs leaving the trail go
//! to the archive named by `--journal-archive`. Judged with the real cryptsetup on LUKS image
//! files and the file KMS: the journal stays the size of one run, `keyplan journal` shows the
//! last `--journal-keep-runs` runs, every run reaches the archive or the trail, and a crash at
//! any instant of a compaction loses no run and no convergence (also in every scenario of the
//! crash matrix, tests/engine/crash.rs, which fires the `journal.compact.*` points too).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::common::*;

const PLAN: &str = "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local }\ndevices:\n  a: { path: a.img, keys: [k], enroll_with: initial.pass }\n  b: { path: b.img, keys: [k], enroll_with: initial.pass }\nsettings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }\n  parallelism: 2\n";

const ROTATE: &[&str] = &[
    "apply",
    "--auto-approve",
    "--rotate",
    "k",
    "--journal-keep-runs",
    "3",
    "--journal-archive",
    "archive/runs.jsonl",
];

/// The JSON Lines records of `path` (none when it does not exist).
fn records(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// Per run id in `records`: how many `run_start` records it has, and its outcome.
fn runs(records: &[serde_json::Value]) -> BTreeMap<String, (usize, Option<String>)> {
    let mut out: BTreeMap<String, (usize, Option<String>)> = BTreeMap::new();
    for r in records {
        let id = r["run"].as_str().unwrap_or_default().to_string();
        match r["event"].as_str() {
            Some("run_start") => out.entry(id).or_default().0 += 1,
            Some("run_end") => {
                out.entry(id).or_default().1 = r["outcome"].as_str().map(str::to_string)
            }
            _ => {}
        }
    }
    out
}

/// The run ids `keyplan journal --json` lists, in order, asserting that none is listed twice.
fn listed(s: &Scratch) -> Vec<String> {
    let doc: serde_json::Value =
        serde_json::from_str(&s.ok(&["journal", "--json"], 0)).expect("journal --json");
    let ids: Vec<String> = doc["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["id"].as_str().expect("id").to_string())
        .collect();
    let unique: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "a run listed twice: {ids:?}");
    ids
}

/// Sets up `a.img` (LUKS2) and `b.img` (LUKS1) with key `k` enrolled.
fn setup(s: &Scratch) {
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.small_image("b.img", "luks1");
    std::fs::create_dir_all(s.path("archive")).expect("mkdir");
    s.plan("keyplan.yaml", PLAN);
    s.ok(&["apply", "--auto-approve"], 0);
}

#[test]
fn finished_runs_leave_the_journal_for_a_bounded_audit_trail() {
    let w = Watched::new();
    let s = &w.s;
    setup(s);
    let journal = s.path(".keyplan/journal.jsonl");
    let one_run = std::fs::metadata(&journal).expect("journal").len();
    for _ in 0..6 {
        w.ok(ROTATE, 0);
    }
    // The journal: a checkpoint, then the last run only.
    let j = records(&journal);
    assert_eq!(j[0]["event"], "checkpoint", "{}", j[0]);
    assert_eq!(j[0]["compacted_runs"], 6, "{}", j[0]);
    let in_journal = runs(&j);
    assert_eq!(in_journal.len(), 1, "{in_journal:?}");
    let size = std::fs::metadata(&journal).expect("journal").len();
    assert!(
        size < 3 * one_run,
        "journal of {size} bytes after 7 runs, {one_run} after one"
    );

    // The audit trail and the journal: the last 3 runs, each once, all successful.
    let trail = listed(s);
    assert_eq!(trail.len(), 3, "{trail:?}");
    let history = runs(&records(&s.path(".keyplan/history.jsonl")));
    assert_eq!(history.len(), 2, "{history:?}");
    // The archive: the 4 older runs, whole (a start and an end), none of the trail's.
    let archive = records(&s.path("archive/runs.jsonl"));
    let archived = runs(&archive);
    assert_eq!(archived.len(), 4, "{archived:?}");
    for (id, (starts, outcome)) in archived.iter().chain(&history).chain(&in_journal) {
        assert_eq!(
            (*starts, outcome.as_deref()),
            (1, Some("success")),
            "run {id}"
        );
    }
    assert!(archived.keys().all(|id| !trail.contains(id)));
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(s.path("archive/runs.jsonl"))
            .expect("archive")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);

    let text = s.ok(&["journal"], 0);
    assert!(
        text.contains("journal compacted: 6 finished runs moved out so far"),
        "{text}"
    );
    // Nothing the journal says about the devices was lost: no change planned, the current
    // version opens both devices.
    assert!(s.ok(&["plan"], 0).contains("No changes"));
    let current = s.key_get("k", None);
    for dev in ["a.img", "b.img"] {
        assert!(opens(&s.path(dev), &current, None), "{dev}");
    }
    w.assert_no_leaks();
}

/// A crash at each instant of a compaction (the archive appended, the history replaced, the
/// journal replaced): the next rotation converges, `journal` lists no run twice, and every run
/// is in the audit trail or the archive (the archive may hold a run twice: it is appended at
/// least once).
#[cfg(feature = "failpoints")]
#[test]
fn a_crash_at_any_instant_of_a_compaction_loses_no_run() {
    use std::os::unix::process::ExitStatusExt as _;
    for point in [
        "journal.compact.after_archive",
        "journal.compact.after_history",
        "journal.compact.after_journal",
    ] {
        let s = Scratch::new();
        setup(&s);
        for _ in 0..3 {
            s.ok(ROTATE, 0);
        }
        let out = assert_cmd::Command::from_std(keyplan_command())
            .current_dir(s.dir.path())
            .env("FAILPOINTS", format!("{point}=return"))
            .args(ROTATE)
            .output()
            .expect("run keyplan");
        assert_eq!(out.status.signal(), Some(9), "{point}: {out:?}");
        let after_crash = listed(&s);
        assert!(s.ok(&["plan"], 0).contains("No changes"), "{point}");
        s.ok(ROTATE, 0);
        assert!(s.ok(&["plan"], 0).contains("No changes"), "{point}");
        let trail = listed(&s);
        assert_eq!(trail.len(), 3, "{point}: {trail:?}");
        assert_eq!(
            trail[..2],
            after_crash[after_crash.len() - 2..],
            "{point}: {after_crash:?} then {trail:?}"
        );
        let archived = runs(&records(&s.path("archive/runs.jsonl")));
        let mut all: BTreeSet<&String> = archived.keys().collect();
        all.extend(&trail);
        // Setup + 3 rotations + the crashed one + one more: 6 runs, each somewhere.
        assert_eq!(all.len(), 6, "{point}: {archived:?} {trail:?}");
        let current = s.key_get("k", None);
        for dev in ["a.img", "b.img"] {
            assert!(opens(&s.path(dev), &current, None), "{point}: {dev}");
        }
    }
}

/// A damaged audit trail is set aside (kept, renamed) and a new one started: it is not the
/// write-ahead journal, and must not stop every later compaction.
#[test]
fn a_damaged_audit_trail_is_set_aside() {
    let s = Scratch::new();
    setup(&s);
    for _ in 0..2 {
        s.ok(ROTATE, 0);
    }
    let history = s.path(".keyplan/history.jsonl");
    let mut bytes = b"{not json}\n".to_vec();
    bytes.extend(std::fs::read(&history).expect("history"));
    std::fs::write(&history, &bytes).expect("write");
    let text = s.ok(&["-v", "apply", "--auto-approve", "--rotate", "k"], 0);
    assert!(text.contains("was damaged at line 1"), "{text}");
    let aside: Vec<_> = walk(&s.path(".keyplan"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("history.jsonl.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(&aside[0]).expect("aside"), bytes);
    assert_eq!(listed(&s).len(), 2);
    assert_eq!(
        records(&s.path(".keyplan/journal.jsonl"))[0]["event"],
        "checkpoint"
    );
}

/// `--journal-archive` (or `KEYPLAN_JOURNAL_ARCHIVE`) in a directory that does not exist, or
/// under a file, is refused before anything is changed, naming the path and what to do:
/// accepted, every compaction that expires a run would fail after its run, and `-q` (the
/// systemd example) would hide it (issue 46).
#[test]
fn an_archive_in_a_missing_directory_is_refused_up_front() {
    let s = Scratch::new();
    setup(&s);
    let v1 = s.key_get("k", None);
    let watched = [
        s.path("a.img"),
        s.path("b.img"),
        s.path("keys"),
        s.path(".keyplan/journal.jsonl"),
    ];
    let before = Snapshot::take(&watched);
    let rotate = ["-q", "apply", "--auto-approve", "--rotate", "k"];
    for (archive, why, advice) in [
        ("missing/runs.jsonl", "does not exist", "`mkdir -p "),
        (
            "keyplan.yaml/runs.jsonl",
            "is not a directory",
            "in an existing directory",
        ),
    ] {
        let mut args = rotate.to_vec();
        args.extend(["--journal-archive", archive]);
        let text = s.ok(&args, 1);
        assert!(text.contains("refusing --journal-archive"), "{text}");
        assert!(text.contains(archive), "names the path: {text}");
        assert!(text.contains(why), "{text}");
        assert!(text.contains("nothing was"), "{text}");
        assert!(text.contains(advice), "{text}");
        let text = s.ok_with_env(
            &rotate,
            &[("KEYPLAN_JOURNAL_ARCHIVE", Path::new(archive))],
            1,
        );
        assert!(text.contains(why), "{text}");
    }
    before.assert_unchanged("a refused --journal-archive");
    assert_eq!(s.key_get("k", None), v1);
    assert!(!s.path("missing").exists());

    // With the directory made, the same command runs and rotates the key.
    std::fs::create_dir(s.path("missing")).expect("mkdir");
    let mut args = rotate.to_vec();
    args.extend(["--journal-archive", "missing/runs.jsonl"]);
    s.ok(&args, 0);
    let v2 = s.key_get("k", None);
    assert_ne!(v2, v1);
    assert!(opens(&s.path("a.img"), &v2, None));
}

/// `keyplan journal` sets a damaged audit trail aside with a warning and shows the journal,
/// as a run's compaction does (one code path): the audit trail is not the write-ahead journal,
/// so its damage is no reason to fail, nor to give the advice of a damaged journal (issue 46).
#[test]
fn journal_sets_a_damaged_audit_trail_aside() {
    let s = Scratch::new();
    setup(&s);
    for _ in 0..2 {
        s.ok(ROTATE, 0);
    }
    let history = s.path(".keyplan/history.jsonl");
    let mut bytes = b"{not json}\n".to_vec();
    bytes.extend(std::fs::read(&history).expect("history"));
    std::fs::write(&history, &bytes).expect("write");
    let journal = std::fs::read(s.path(".keyplan/journal.jsonl")).expect("journal");

    let out = s.keyplan(&["journal"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("was damaged at line 1"), "{stderr}");
    assert!(stderr.contains("history.jsonl.corrupt-"), "{stderr}");
    let aside: Vec<_> = walk(&s.path(".keyplan"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("history.jsonl.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(&aside[0]).expect("aside"), bytes);
    // The journal itself is untouched, and its last run is listed.
    assert_eq!(
        std::fs::read(s.path(".keyplan/journal.jsonl")).expect("journal"),
        journal
    );
    let last = records(&s.path(".keyplan/journal.jsonl"))
        .last()
        .and_then(|r| r["run"].as_str().map(str::to_string))
        .expect("a run in the journal");
    assert_eq!(listed(&s), vec![last]);
    // The next run starts a new audit trail.
    s.ok(ROTATE, 0);
    assert_eq!(listed(&s).len(), 2);
}
