//! The PBKDF memory budget of `apply` (issue 6): argon2 PBKDF runs at once never need more
//! memory than `settings.memory_budget_kib`, however high `parallelism` is, and a budget that
//! holds several lets them overlap. Measured with a cryptsetup wrapper that logs when each
//! PBKDF-running call (`luksAddKey`, `open --test-passphrase`) starts and ends.

use crate::common::*;
use std::path::Path;

/// argon2id memory cost of the keyslots keyplan adds, in KiB (32 MiB: quick, yet far above
/// the 16 MiB keyplan counts for cryptsetup itself).
const ARGON2_KIB: u64 = 32 * 1024;

/// The plan: 4 LUKS2 devices sharing key `k`, argon2id at [`ARGON2_KIB`], parallelism 4,
/// and the given memory budget.
fn plan(s: &Scratch, budget_kib: u64) {
    let mut devices = String::new();
    for i in 0..4 {
        s.small_image(&format!("d{i}.img"), "luks2");
        devices.push_str(&format!(
            "  d{i}: {{ path: d{i}.img, keys: [k], enroll_with: initial.pass }}\n"
        ));
    }
    s.initial_pass();
    s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local }}\ndevices:\n{devices}settings:\n  pbkdf: {{ type: argon2id, memory_kib: {ARGON2_KIB}, parallel: 1, iterations: 4 }}\n  parallelism: 4\n  memory_budget_kib: {budget_kib}\n"
        ),
    );
}

/// Installs the logging wrapper; returns its path (for `KEYPLAN_CRYPTSETUP`).
fn wrapper(s: &Scratch) -> std::path::PathBuf {
    let log = s.path("pbkdf.log");
    script(
        s.dir.path(),
        "cryptsetup-timed",
        &format!(
            "#!/bin/sh\ncase \"$1\" in luksAddKey|open) ;; *) exec cryptsetup \"$@\";; esac\necho \"start $(date +%s%N)\" >> '{log}'\ncryptsetup \"$@\"\nrc=$?\necho \"end $(date +%s%N)\" >> '{log}'\nexit $rc\n",
            log = log.display()
        ),
    )
}

/// The most PBKDF-running cryptsetup calls that were running at the same time.
fn most_at_once(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).expect("read wrapper log");
    let mut events: Vec<(u128, i32)> = text
        .lines()
        .filter_map(|l| {
            let (what, t) = l.split_once(' ')?;
            let t: u128 = t.trim().parse().ok()?;
            Some((t, if what == "start" { 1 } else { -1 }))
        })
        .collect();
    // Ends before starts at the same instant: touching intervals do not overlap.
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

fn apply(s: &Scratch, wrapper: &Path, args: &[&str]) -> String {
    s.ok_with_env(args, &[("KEYPLAN_CRYPTSETUP", wrapper)], 0)
}

fn all_open_with_current_key(s: &Scratch) {
    let current = s.key_get("k", None);
    for i in 0..4 {
        assert!(
            opens(&s.path(&format!("d{i}.img")), &current, None),
            "d{i} does not open with the current key"
        );
    }
}

/// A budget that holds one argon2 PBKDF run (32 MiB + 16 MiB for cryptsetup < 60,000 KiB):
/// with parallelism 4, PBKDF runs never overlap, keyplan says why, and the enrollment and the
/// rotation still finish with every device opening with the KMS's current key.
#[test]
fn a_small_budget_runs_one_pbkdf_at_a_time() {
    let s = Scratch::new();
    plan(&s, 60_000);
    let w = wrapper(&s);
    let out = apply(&s, &w, &["apply", "--auto-approve"]);
    assert!(
        out.contains("holds 1 PBKDF run(s)") && out.contains("fewer than parallelism 4"),
        "no warning about the memory budget:\n{out}"
    );
    let out2 = apply(&s, &w, &["apply", "--auto-approve", "--rotate", "k"]);
    assert!(out2.contains("1 keys rotated"), "{out2}");
    all_open_with_current_key(&s);
    assert_eq!(most_at_once(&s.path("pbkdf.log")), 1);
}

/// A budget that holds all four: PBKDF runs of different devices overlap (parallelism is not
/// lowered), and no warning is printed.
#[test]
fn a_large_budget_lets_devices_run_at_once() {
    let s = Scratch::new();
    plan(&s, 4 * (ARGON2_KIB + 16 * 1024) + 1024);
    let w = wrapper(&s);
    let out = apply(&s, &w, &["apply", "--auto-approve"]);
    assert!(!out.contains("memory budget"), "{out}");
    apply(&s, &w, &["apply", "--auto-approve", "--rotate", "k"]);
    all_open_with_current_key(&s);
    let most = most_at_once(&s.path("pbkdf.log"));
    assert!(
        (2..=4).contains(&most),
        "{most} PBKDF runs at once with room for 4 and parallelism 4"
    );
}

/// `memory_budget_kib: 0` is refused at its line.
#[test]
fn a_zero_budget_is_refused() {
    let s = Scratch::new();
    plan(&s, 0);
    let out = s.ok(&["validate"], 1);
    assert!(
        out.contains("memory_budget_kib") && out.contains("is 0"),
        "{out}"
    );
    assert!(out.contains("keyplan.yaml:"), "{out}");
}
