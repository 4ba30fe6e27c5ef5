//! `keyplan status`: per-key versions (current, retained) from the KMS, the last run, and
//! exit 1 when a rotation is overdue.

mod common;

use common::*;

#[test]
fn status_reports_current_retained_and_overdue() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    let plan = |after: &str| {
        format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local, rotate_after: {after} }}\ndevices:\n  a: {{ path: a.img, keys: [k], enroll_with: initial.pass }}\n{FAST_PBKDF}"
        )
    };
    s.plan("keyplan.yaml", &plan("30d"));
    let out = s.ok(&["status"], 0);
    assert!(out.contains("no current version"), "{out}");
    assert!(out.contains("last run: none"), "{out}");
    s.ok(&["apply", "--auto-approve"], 0);
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let out = s.ok(&["status"], 0);
    assert!(out.contains("current  v2"), "{out}");
    assert!(out.contains("retained v1"), "{out}");
    assert!(out.contains("rotation due in"), "{out}");
    assert!(out.contains("(success)"), "{out}");
    // A 1-second limit is overdue two seconds later: exit 1 for monitoring.
    s.plan("keyplan.yaml", &plan("1s"));
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let out = s.ok(&["status"], 1);
    assert!(out.contains("rotation OVERDUE"), "{out}");
    assert!(out.contains("UNHEALTHY"), "{out}");

    // A KMS that lost a key a run committed is unhealthy too (not "not created yet").
    s.plan("keyplan.yaml", &plan("30d"));
    std::fs::remove_dir_all(s.path("keys").join("k")).unwrap();
    let out = s.ok(&["status"], 1);
    assert!(
        out.contains("NO CURRENT VERSION, although a run committed one"),
        "{out}"
    );
}
