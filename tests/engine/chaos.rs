//! Black-box chaos: `kill -9` at random instants during rotations (docs/rotation.md "The invariants": I1, I3).
//!
//! Three devices (two LUKS2, one LUKS1) share key `k`; PBKDF2 with 300,000 iterations makes
//! each keyslot operation take a noticeable time, so the kills land inside cryptsetup calls,
//! between them, and between journal records. After every kill the current KMS version (read
//! from the KMS's files, not through keyplan) must open every device (I1). The next round's
//! `apply --rotate k` first finishes the interrupted run, then rotates again. At the end one
//! undisturbed `apply` must converge: `plan` shows no changes, no pending version, exactly the
//! expected keyslots, and no key material anywhere but the KMS.
//!
//! `KEYPLAN_CHAOS_RUNS` sets the number of killed runs (default 8; e.g. 500 for a soak).
//! `KEYPLAN_CHAOS_SEED` replays a sequence of kill instants.

use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Instant;

use crate::common::*;
use rand::{Rng as _, SeedableRng as _};

const SLOW_PBKDF: &str = "settings:\n  pbkdf: { type: pbkdf2, iterations: 300000 }\n";

#[test]
fn kill_9_at_random_instants_never_locks_out() {
    let runs: usize = std::env::var("KEYPLAN_CHAOS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let seed: u64 = std::env::var("KEYPLAN_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("chaos: {runs} runs, KEYPLAN_CHAOS_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let w = Watched::new();
    let root: PathBuf = w.s.dir.path().to_path_buf();
    w.s.initial_pass();
    let devs = [
        w.s.small_image("a.img", "luks2"),
        w.s.small_image("b.img", "luks2"),
        w.s.small_image("c.img", "luks1"),
    ];
    w.s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local }}\ndevices:\n  a: {{ path: a.img, keys: [k], enroll_with: initial.pass }}\n  b: {{ path: b.img, keys: [k], enroll_with: initial.pass }}\n  c: {{ path: c.img, keys: [k], enroll_with: initial.pass }}\n{SLOW_PBKDF}"
        ),
    );
    w.ok(&["apply", "--auto-approve"], 0);
    // One undisturbed rotation gives the length of the window to aim at.
    let t0 = Instant::now();
    w.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let window = t0.elapsed();
    eprintln!("chaos: an undisturbed rotation takes {window:.2?}");

    let check_i1 = |when: &str| {
        let (cur, _) = file_kms_state(&root, "k");
        let cur = cur.expect("k has a current version");
        for d in &devs {
            assert!(
                opens(d, &cur, None),
                "{when}: I1 broken: current k does not open {}",
                d.display()
            );
        }
    };

    let mut killed = 0;
    let mut completed = 0;
    for round in 0..runs {
        let delay = window.mul_f64(rng.random_range(0.0..1.2));
        let mut child = w
            .command(&["apply", "--auto-approve", "--rotate", "k"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn keyplan");
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL; cryptsetup children die with keyplan (PDEATHSIG)
        let out = child.wait_with_output().expect("wait");
        w.record(&out);
        match out.status.signal() {
            Some(9) => killed += 1,
            _ => {
                assert!(
                    out.status.success(),
                    "round {round}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                completed += 1;
            }
        }
        check_i1(&format!("round {round} (killed after {delay:.2?})"));
    }
    eprintln!("chaos: {killed} runs killed, {completed} completed before the kill");

    // Converge: finish the interrupted run; a further plan shows nothing to do.
    let out = w.ok(&["apply", "--auto-approve"], 0);
    assert!(!out.contains("panicked"), "{out}");
    w.ok(&["plan", "--detailed-exitcode"], 0);
    check_i1("after convergence");
    let (cur, pending) = file_kms_state(&root, "k");
    let cur = cur.expect("current");
    assert!(!pending, "a pending version was left behind");
    for d in &devs {
        assert_eq!(keyslots(d).len(), 2, "initial + k on {}", d.display());
        assert!(opens(d, INITIAL, None));
        assert!(opens(d, &cur, None));
    }
    w.assert_no_leaks();
    assert!(
        killed >= runs / 2,
        "most runs should have been killed mid-way"
    );
}
