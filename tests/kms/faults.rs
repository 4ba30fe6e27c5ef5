//! Signals, concurrency and KMS failures during `apply` (docs/rotation.md "The invariants": I1, I3, I5), against the
//! real cryptsetup. Steps are made slow with a cryptsetup wrapper that sleeps before
//! `luksAddKey`, so a signal or a second run reliably arrives in the middle of a run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

const DEVICES: [&str; 3] = ["a.img", "b.img", "c.img"];

/// Three LUKS2 devices sharing key `k`, enrolled (so a rotation can be interrupted).
fn enrolled(w: &Watched) -> Vec<PathBuf> {
    w.s.initial_pass();
    let devs: Vec<PathBuf> = DEVICES
        .iter()
        .map(|d| w.s.small_image(d, "luks2"))
        .collect();
    w.s.plan(
        "keyplan.yaml",
        &one_key_plan(
            "  a: { path: a.img, keys: [k], enroll_with: initial.pass }\n  b: { path: b.img, keys: [k], enroll_with: initial.pass }\n  c: { path: c.img, keys: [k], enroll_with: initial.pass }",
        )
        .replace("parallelism: 4", "parallelism: 1"),
    );
    w.ok(&["apply", "--auto-approve"], 0);
    devs
}

/// A cryptsetup wrapper that sleeps `secs` before every `luksAddKey` and touches
/// `<marker>` when a sleeping call got to run cryptsetup. Each sleeping call appends its pid
/// to `add-pids` first ([`wait_for_wrappers_gone`]).
fn slow_wrapper(w: &Watched, secs: f32) -> (PathBuf, PathBuf) {
    let marker = w.s.path("add-finished");
    let p = script(
        w.s.dir.path(),
        "slow-cryptsetup",
        &format!(
            "#!/bin/sh\ncase \"$*\" in *luksAddKey*) echo $$ >> '{}'; sleep {secs}; touch '{}';; esac\nexec '{}' \"$@\"\n",
            w.s.path("add-pids").display(),
            marker.display(),
            real_cryptsetup().display()
        ),
    );
    (p, marker)
}

/// Waits until every sleeping `luksAddKey` wrapper [`slow_wrapper`] started has exited (its
/// pid gone, or a zombie nobody reaps): the event after which none of them can still touch
/// the marker. Fails after 30 s.
fn wait_for_wrappers_gone(w: &Watched) {
    let pids = std::fs::read_to_string(w.s.path("add-pids")).unwrap_or_default();
    let t0 = Instant::now();
    for pid in pids.split_whitespace() {
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The state is the field after the parenthesised command name.
            let state = stat.rsplit(") ").next().and_then(|r| r.chars().next());
            if stat.is_empty() || state == Some('Z') {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the cryptsetup wrapper {pid} is still running"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts keyplan in a process group of its own (as a shell's job would be), so a signal to
/// the group models Ctrl-C at a terminal.
fn spawn(w: &Watched, wrapper: &Path, args: &[&str]) -> Child {
    use std::os::unix::process::CommandExt as _;
    w.command(args)
        .env("KEYPLAN_CRYPTSETUP", wrapper)
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keyplan")
}

fn journal_text(w: &Watched) -> String {
    std::fs::read_to_string(w.s.path(".keyplan/journal.jsonl")).unwrap_or_default()
}

/// Waits until the journal shows `n` `step_start` records of a run started after the journal
/// was `from` bytes long.
fn wait_for_step_starts(w: &Watched, from: usize, n: usize) {
    let t0 = Instant::now();
    loop {
        let text = journal_text(w);
        let text = text.get(from..).unwrap_or("");
        let last_run = text
            .rfind("\"run_start\"")
            .map(|i| &text[i..])
            .unwrap_or("");
        if last_run.matches("\"step_start\"").count() >= n {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "run did not start:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The non-empty lines of `from` (a child's piped standard error), as a reader thread sends
/// them; the channel closes at end of file.
fn read_lines(from: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead as _;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(from).lines().map_while(Result::ok) {
            if !line.trim().is_empty() && tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits until `path` exists and holds some text (a wrapper wrote its pid). Fails after 60 s.
fn wait_for_file_text(path: &Path) {
    let t0 = Instant::now();
    while std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{} was not written",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal_group(child: &Child, sig: i32) {
    let pgid = i32::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) with a process group id has no memory-safety preconditions.
    let rc = unsafe { libc::kill(-pgid, sig) };
    assert_eq!(rc, 0, "kill");
}

fn current(w: &Watched) -> Vec<u8> {
    w.s.key_get("k", None)
}

/// The newest run in the journal: (has run_end, step_start count, step_done count).
fn last_run_counts(w: &Watched) -> (bool, usize, usize) {
    let text = journal_text(w);
    let run = text
        .rfind("\"run_start\"")
        .map(|i| &text[i..])
        .unwrap_or("");
    (
        run.contains("\"run_end\""),
        run.matches("\"step_start\"").count(),
        run.matches("\"step_done\"").count(),
    )
}

fn assert_i1(w: &Watched, devs: &[PathBuf]) {
    let cur = current(w);
    for d in devs {
        assert!(
            opens(d, &cur, None),
            "I1: current k does not open {}",
            d.display()
        );
    }
}

fn assert_converges(w: &Watched, devs: &[PathBuf]) {
    let out = w.ok(&["apply", "--auto-approve"], 0);
    assert!(!out.contains("panicked"), "{out}");
    w.ok(&["plan", "--detailed-exitcode"], 0);
    let cur = current(w);
    for d in devs {
        assert!(opens(d, &cur, None));
        assert_eq!(keyslots(d).len(), 2, "initial + k on {}", d.display());
    }
    assert!(
        !w.s.path("keys/k/meta.json").exists() || {
            let meta = std::fs::read_to_string(w.s.path("keys/k/meta.json")).unwrap();
            meta.contains("\"pending\":null") || meta.contains("\"pending\": null")
        }
    );
    w.assert_no_leaks();
}

fn interrupt_once(sig: i32) {
    let w = Watched::new();
    let devs = enrolled(&w);
    let before = current(&w);
    let (wrapper, marker) = slow_wrapper(&w, 1.5);
    let from = journal_text(&w).len();
    let child = spawn(&w, &wrapper, &["apply", "--auto-approve", "--rotate", "k"]);
    wait_for_step_starts(&w, from, 2); // stage done, first add under way
    signal_group(&child, sig);
    let out = child.wait_with_output().expect("wait");
    w.record(&out);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("finishing the running steps"), "{text}");
    assert!(text.contains("was interrupted"), "{text}");
    assert!(text.contains("run `keyplan apply` again"), "{text}");
    // the step under way finished (its cryptsetup was not hit by the group's signal) ...
    assert!(marker.exists(), "the running luksAddKey was cut short");
    // ... and the journal is consistent: every started step is done, the run is open
    let (ended, starts, dones) = last_run_counts(&w);
    assert!(!ended, "interrupted run must stay open for resume");
    assert_eq!(
        starts,
        dones,
        "a started step was left unfinished:\n{}",
        journal_text(&w)
    );
    assert!(
        (2..10).contains(&dones),
        "stopped early: {dones} steps done"
    );
    // nothing committed yet: the old current still opens everything
    assert_eq!(current(&w), before);
    assert_i1(&w, &devs);
    let plan = w.ok(&["plan"], 0);
    assert!(plan.contains("interrupted"), "{plan}");
    assert_converges(&w, &devs);
    assert_ne!(current(&w), before, "the rotation was finished");
}

/// SIGINT to the process group (Ctrl-C): the running step finishes, exit 1, resumable.
#[test]
fn sigint_finishes_the_running_step_then_stops() {
    interrupt_once(libc::SIGINT);
}

/// SIGTERM (systemd stop, kill): same as SIGINT.
#[test]
fn sigterm_finishes_the_running_step_then_stops() {
    interrupt_once(libc::SIGTERM);
}

/// SIGHUP (the terminal or ssh session went away): same as SIGINT.
#[test]
fn sighup_finishes_the_running_step_then_stops() {
    interrupt_once(libc::SIGHUP);
}

/// A second signal exits at once; the cryptsetup child dies with keyplan (no orphan writer);
/// the next apply converges.
#[test]
fn second_signal_exits_at_once() {
    let w = Watched::new();
    let devs = enrolled(&w);
    let (wrapper, marker) = slow_wrapper(&w, 4.0);
    let from = journal_text(&w).len();
    let mut child = spawn(&w, &wrapper, &["apply", "--auto-approve", "--rotate", "k"]);
    let stderr_lines = read_lines(child.stderr.take().expect("stderr piped"));
    wait_for_step_starts(&w, from, 2);
    // The first signal lands while a luksAddKey wrapper sleeps, and the second once keyplan
    // has said it is finishing the running steps: both are events, not guesses.
    wait_for_file_text(&w.s.path("add-pids"));
    signal_group(&child, libc::SIGINT);
    let mut seen = Vec::new();
    while !seen
        .last()
        .is_some_and(|l: &String| l.contains("signal received: finishing"))
    {
        match stderr_lines.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => seen.push(line),
            Err(e) => panic!("keyplan did not answer the first signal ({e}): {seen:?}"),
        }
    }
    let t0 = Instant::now();
    signal_group(&child, libc::SIGINT);
    let mut out = child.wait_with_output().expect("wait");
    let waited = t0.elapsed();
    seen.extend(stderr_lines.iter());
    out.stderr = seen
        .iter()
        .flat_map(|l| format!("{l}\n").into_bytes())
        .collect();
    w.record(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("second signal: exiting now"), "{stderr}");
    assert!(waited < Duration::from_secs(2), "took {waited:?} to exit");
    // the sleeping wrapper was killed with keyplan (PR_SET_PDEATHSIG), never ran luksAddKey
    wait_for_wrappers_gone(&w);
    assert!(
        !marker.exists(),
        "an orphaned cryptsetup child kept running"
    );
    assert_i1(&w, &devs);
    assert_converges(&w, &devs);
}

/// A second `apply` on the same state directory is refused at once, naming the holder's pid,
/// host and start time; `plan` too. Killing the holder (-9) frees the lock for the next run.
#[test]
fn concurrent_apply_is_refused_and_dead_holder_does_not_block() {
    let w = Watched::new();
    let devs = enrolled(&w);
    let (wrapper, _) = slow_wrapper(&w, 3.0);
    let from = journal_text(&w).len();
    let mut first = spawn(&w, &wrapper, &["apply", "--auto-approve", "--rotate", "k"]);
    wait_for_step_starts(&w, from, 2);
    let t0 = Instant::now();
    let out = w.run(&["apply", "--auto-approve", "--rotate", "k"]);
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "the second run waited"
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("another keyplan run holds the lock"),
        "{text}"
    );
    assert!(text.contains(&format!("pid {}", first.id())), "{text}");
    let host = gethostname_text();
    assert!(text.contains(&format!("on host {host}")), "{text}");
    assert!(text.contains("since 20"), "start time: {text}");
    // the holder dies without unwinding: the kernel drops its flock
    first.kill().expect("kill -9");
    let out = first.wait_with_output().expect("wait");
    w.record(&out);
    assert_i1(&w, &devs);
    let t0 = Instant::now();
    assert_converges(&w, &devs);
    assert!(t0.elapsed() < Duration::from_secs(60));
}

fn gethostname_text() -> String {
    let out = Command::new("hostname").output().expect("hostname");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[cfg(feature = "failpoints")]
mod injected {
    use super::*;

    /// Runs `apply --rotate k` with `kms.<op>` failing at its k-th call, for every call, and
    /// checks: exit 1 with a message naming the KMS and saying what to do, I1 held, and the
    /// next apply converges. Returns the number of failures injected.
    fn each_failure(point: &str, rotated_before: bool) -> usize {
        let mut n = 0;
        for k in 0.. {
            let w = Watched::new();
            let devs = enrolled(&w);
            if rotated_before {
                // a version to retire: the rotation under test destroys the one before last
                w.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
            }
            let before = current(&w);
            let out = w
                .command(&["apply", "--auto-approve", "--rotate", "k"])
                .env("FAILPOINTS", format!("{point}={k}*off->return(error)"))
                .output()
                .expect("keyplan");
            w.record(&out);
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if out.status.success() {
                break;
            }
            n += 1;
            assert_eq!(out.status.code(), Some(1), "{point} #{k}: {text}");
            assert!(!text.contains("panicked"), "{text}");
            assert!(text.contains("file KMS \"local\""), "names the KMS: {text}");
            assert!(text.contains("is unavailable"), "{text}");
            assert!(text.contains("keyplan apply"), "says what to do: {text}");
            // I1: whatever the KMS says is current opens every device
            assert_i1(&w, &devs);
            if point == "kms.stage" || point == "kms.commit" {
                assert_eq!(current(&w), before, "{point} #{k}: nothing committed");
            }
            assert_converges(&w, &devs);
        }
        eprintln!("{point}: {n} injected failures, each converged");
        n
    }

    #[test]
    fn kms_read_fails() {
        assert!(each_failure("kms.read", false) >= 2);
    }

    #[test]
    fn kms_get_fails() {
        assert!(each_failure("kms.get", false) >= 4);
    }

    #[test]
    fn kms_stage_fails() {
        assert_eq!(each_failure("kms.stage", false), 1);
    }

    #[test]
    fn kms_commit_fails() {
        assert_eq!(each_failure("kms.commit", false), 1);
    }

    /// The commit happened but its reply was lost: keyplan must not commit blindly again; the
    /// next run sees the new current version and finishes the rotation from there.
    #[test]
    fn kms_commit_reply_lost() {
        assert_eq!(each_failure("kms.commit.lost_reply", false), 1);
    }

    #[test]
    fn kms_retire_fails() {
        assert_eq!(each_failure("kms.retire", true), 1);
    }

    /// Another writer changes the key's current version between stage and commit: the commit
    /// is refused (compare-and-swap), nothing is overwritten, and no keyslot is killed.
    #[test]
    fn commit_conflict_stops_without_overwriting() {
        let w = Watched::new();
        let devs = enrolled(&w);
        let before = current(&w);
        let from = journal_text(&w).len();
        let mut child = w
            .command(&["apply", "--auto-approve", "--rotate", "k"])
            .env("FAILPOINTS", "kms.commit=sleep(3000)")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // wait for the commit step to start (stage, 3 adds, 3 verifies, then commit)
        wait_for_step_starts(&w, from, 8);
        // the concurrent writer: an operator makes a new version current by hand
        let meta_path = w.s.path("keys/k/meta.json");
        let mut meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
        let foreign = b"operator's own passphrase".to_vec();
        std::fs::write(w.s.path("keys/k/v9.key"), &foreign).unwrap();
        let versions = meta["versions"].as_array_mut().unwrap();
        for v in versions.iter_mut() {
            if v["state"] == "current" {
                v["state"] = serde_json::json!("previous");
            }
        }
        versions.push(serde_json::json!({"version": 9, "created_at": 1, "state": "current"}));
        meta["current"] = serde_json::json!(9);
        std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
        let _ = child.stdin.take();
        let out = child.wait_with_output().expect("wait");
        w.record(&out);
        w.add_secret(&foreign);
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains("changed concurrently"), "{text}");
        assert!(text.contains("nothing was overwritten"), "{text}");
        // the foreign version is still current: never overwritten
        assert_eq!(current(&w), foreign);
        // no keyslot was killed: the old version still opens every device
        for d in &devs {
            assert!(opens(d, &before, None));
            assert_eq!(keyslots(d).len(), 3, "initial + old + staged");
        }
        w.assert_no_leaks();
    }
}

/// A closed stdout (`keyplan plan | head -1`, a dead `tee`, a dropped ssh session) neither
/// panics `plan` nor stops `apply`: output is informational, the run goes on to the end.
#[test]
fn closed_stdout_neither_panics_nor_stops_apply() {
    let w = Watched::new();
    let devs = enrolled(&w);
    let before = current(&w);
    for args in [
        vec!["plan"],
        vec!["apply", "--auto-approve", "--rotate", "k"],
    ] {
        let mut child = w
            .command(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        drop(child.stdout.take()); // the reader goes away before keyplan prints anything
        let out = child.wait_with_output().expect("wait");
        w.record(&out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // the rotation ran to the end: a new current version, committed, opening every device
    assert_ne!(current(&w), before);
    w.ok(&["plan", "--detailed-exitcode"], 0);
    assert_converges(&w, &devs);
}
