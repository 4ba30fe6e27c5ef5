//! Snapshot tests of keyplan's human output (insta; the snapshots live in `tests/snapshots/`):
//! help texts, plan text (enrollment, rotation, no changes), apply's piped output, a validate
//! error and the journal. Runs use NO_COLOR, a fixed COLUMNS, and the real cryptsetup on LUKS
//! image files; temp paths, timestamps, run ids, pids, host names and durations are replaced by
//! placeholders.
//!
//! A changed output fails the test with a diff. Review it, then accept it with `cargo insta
//! review` or by re-running with `INSTA_UPDATE=always`. A missing snapshot also fails: with
//! `CI` set insta writes nothing (`INSTA_UPDATE=no` behaviour), otherwise it writes a
//! `.snap.new` file next to the others and still fails.

use std::process::Output;

use crate::common::*;

/// insta settings for output produced in `s`: its directory becomes `[DIR]`, and the
/// varying parts of runs become placeholders.
fn settings(s: &Scratch) -> insta::Settings {
    let mut st = insta::Settings::clone_current();
    st.set_prepend_module_to_snapshot(false);
    st.set_omit_expression(true);
    let dir = s.dir.path();
    let mut dirs = vec![dir.to_path_buf()];
    if let Ok(c) = dir.canonicalize() {
        if c != dir {
            dirs.push(c);
        }
    }
    for d in dirs {
        st.add_filter(&regex_escape(&d.display().to_string()), "[DIR]");
    }
    // Durations of steps: `(0.2s)`, `(1m03s)`, `after 0.2s:`.
    st.add_filter(r"\((\d+\.\ds|\d+m\d\ds)\)", "([ELAPSED])");
    st.add_filter(r"after (\d+\.\ds|\d+m\d\ds):", "after [ELAPSED]:");
    st.add_filter(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "[TIME]");
    // Run ids: `<unix seconds>-<pid>`.
    st.add_filter(r"\b\d{9,11}-\d+\b", "[RUN]");
    st.add_filter(r"pid \d+ on [^)\s]+", "pid [PID] on [HOST]");
    st
}

/// Escapes a literal for a regex filter.
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Runs keyplan in `s` with a fixed terminal width and no colour; asserts the exit code and
/// returns stdout and stderr.
fn run(s: &Scratch, args: &[&str], code: i32) -> (String, String) {
    let out: Output = assert_cmd::Command::from_std(keyplan_command())
        .current_dir(s.dir.path())
        .env("NO_COLOR", "1")
        .env("COLUMNS", "100")
        .env_remove("KEYPLAN_LOG")
        .args(args)
        .output()
        .expect("run keyplan");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "keyplan {args:?}:\n{stdout}{stderr}"
    );
    (stdout, stderr)
}

fn one_device(s: &Scratch) {
    s.initial_pass();
    s.image("d.img", "luks2");
    s.plan(
        "keyplan.yaml",
        &one_key_plan("  d: { path: d.img, keys: [k], enroll_with: initial.pass }"),
    );
}

#[test]
fn help_texts() {
    let s = Scratch::new();
    let (top, _) = run(&s, &["--help"], 0);
    let (plan, _) = run(&s, &["plan", "--help"], 0);
    let (apply, _) = run(&s, &["apply", "--help"], 0);
    settings(&s).bind(|| {
        insta::assert_snapshot!("help", top);
        insta::assert_snapshot!("help_plan", plan);
        insta::assert_snapshot!("help_apply", apply);
    });
}

/// Enrollment plan, apply's piped output, the rotation plan, "no changes", and the journal,
/// from one device's life.
#[test]
fn plan_apply_and_journal_texts() {
    let s = Scratch::new();
    one_device(&s);
    let (enroll, _) = run(&s, &["plan", "--detailed-exitcode"], 2);
    let (apply, _) = run(&s, &["apply", "--auto-approve"], 0);
    let (nothing, _) = run(&s, &["plan", "--detailed-exitcode"], 0);
    let (rotate, _) = run(&s, &["plan", "--rotate", "k"], 0);
    let (rotated, _) = run(&s, &["apply", "--auto-approve", "--rotate", "k"], 0);
    let (journal, _) = run(&s, &["journal"], 0);
    // The snapshots are checked against what really happened.
    assert!(opens(&s.path("d.img"), &s.key_get("k", None), Some(2)));
    settings(&s).bind(|| {
        insta::assert_snapshot!("plan_enroll", enroll);
        insta::assert_snapshot!("apply_enroll_piped", apply);
        insta::assert_snapshot!("plan_no_changes", nothing);
        insta::assert_snapshot!("plan_rotate", rotate);
        insta::assert_snapshot!("apply_rotate_piped", rotated);
        insta::assert_snapshot!("journal_text", journal);
    });
}

/// A failing step in apply's piped output: the `[FAILED]` line and the error report.
#[test]
fn apply_failure_text() {
    let s = Scratch::new();
    s.initial_pass();
    s.image("d.img", "luks2");
    // The enroll_with passphrase opens the device at planning time, then is gone from the
    // cryptsetup the run uses: a wrapper that fails every luksAddKey.
    let real = real_cryptsetup();
    let wrapper = script(
        s.dir.path(),
        "failing-cryptsetup",
        &format!(
            "#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = luksAddKey ] && {{ echo 'simulated failure' >&2; exit 1; }}; done\nexec '{}' \"$@\"\n",
            real.display()
        ),
    );
    s.plan(
        "keyplan.yaml",
        &one_key_plan("  d: { path: d.img, keys: [k], enroll_with: initial.pass }"),
    );
    let out = assert_cmd::Command::from_std(keyplan_command())
        .current_dir(s.dir.path())
        .env("NO_COLOR", "1")
        .env("COLUMNS", "100")
        .env("KEYPLAN_CRYPTSETUP", &wrapper)
        .env_remove("KEYPLAN_LOG")
        .args(["apply", "--auto-approve"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(keyslots(&s.path("d.img")), vec![0]);
    settings(&s).bind(|| {
        insta::assert_snapshot!("apply_failure_stdout", stdout);
        insta::assert_snapshot!("apply_failure_stderr", stderr);
    });
}

#[test]
fn validate_error_text() {
    let s = Scratch::new();
    s.plan(
        "keyplan.yaml",
        &one_key_plan("  d: { path: d.img, keys: [k, nokey] }"),
    );
    let (out, err) = run(&s, &["validate"], 1);
    settings(&s).bind(|| {
        insta::assert_snapshot!("validate_error", format!("{out}{err}"));
    });
}
