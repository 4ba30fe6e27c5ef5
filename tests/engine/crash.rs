//! The deterministic crash matrix (docs/rotation.md "The invariants": I1 never locked out, I3 converge).
//!
//! For each scenario, every crash point of `keyplan::failpoint` is fired at each of its hits in
//! turn (`FAILPOINTS="<point>=<k>*off->return"`): keyplan kills itself with SIGKILL there (no
//! unwinding; its cryptsetup children die with it). After each crash the test checks, with
//! cryptsetup directly, that every key's current KMS version still opens every device the plan
//! gives it (I1); then runs `apply` once and checks the end state: `plan` reports no changes,
//! every keyslot is attributed (no orphan keyslot, no orphan token), no pending version is left,
//! and the previous passphrases open what they should and nothing else. Finally every output,
//! log, cryptsetup argv/environment, the state directory and TMPDIR are scanned for key material.
//!
//! Needs the `failpoints` feature (scripts/test.sh enables it); without it this file reports
//! SKIPPED.

#[cfg(not(feature = "failpoints"))]
#[test]
fn crash_matrix_needs_failpoints_feature() {
    eprintln!("SKIPPED: crash matrix needs `cargo test --features failpoints`");
}

#[cfg(feature = "failpoints")]
pub(crate) mod matrix {
    use std::os::unix::process::ExitStatusExt as _;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use crate::common::*;

    /// The crash points fired in every scenario: every point of `keyplan::failpoint::POINTS`
    /// but the `kms.<operation>` error points, which tests/kms/faults.rs fires (a new point is
    /// covered here automatically). `commit.before` is left out too: it is the instant of a
    /// commit step's `step.before_effect`, which every scenario fires.
    pub fn crash_points() -> Vec<&'static str> {
        keyplan::failpoint::POINTS
            .iter()
            .copied()
            .filter(|p| {
                (!p.starts_with("kms.")
                    || p.starts_with("kms.file.")
                    || *p == "kms.commit.lost_reply")
                    && *p != "commit.before"
            })
            .collect()
    }

    /// One device of a scenario: image file, LUKS version, keys of the final plan.
    pub struct Dev {
        pub file: &'static str,
        pub luks: &'static str,
        pub keys: &'static [&'static str],
    }

    /// A scenario: a setup plan applied without faults, then the plan whose `apply` is crashed.
    pub struct Scenario {
        pub name: &'static str,
        pub devices: &'static [Dev],
        /// Plan applied during setup (None: no setup run).
        pub setup_plan: Option<String>,
        /// Extra setup runs after the first (e.g. a rotation, so the crashed run retires a
        /// version).
        pub setup_runs: &'static [&'static [&'static str]],
        /// Plan of the crashed run.
        pub plan: String,
        /// Extra `apply` arguments of the crashed run (e.g. `--rotate k`).
        pub args: &'static [&'static str],
        /// Does the final plan say `unmanaged_keyslots: remove`?
        pub remove: bool,
        /// Keys written into the file KMS before anything runs, as another tool would have
        /// (version 1 = the initial passphrase, which opens keyslot 0 of every device): the
        /// crashed run adopts them.
        pub kms_keys: &'static [&'static str],
    }

    /// Counts of what a matrix run did.
    #[derive(Default, Debug)]
    pub struct Counts {
        pub crashes: usize,
        pub per_point: Vec<(&'static str, usize)>,
    }

    fn plan_text(s: &Scenario, devices: &[(&str, &[&str])], keys: &[&str], remove: bool) -> String {
        let mut t =
            String::from("version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n");
        for k in keys {
            t.push_str(&format!("  {k}: {{ kms: local }}\n"));
        }
        t.push_str("devices:\n");
        for (file, dkeys) in devices {
            let id = file.trim_end_matches(".img");
            t.push_str(&format!(
                "  {id}:\n    path: {file}\n    keys: [{}]\n    enroll_with: initial.pass\n",
                dkeys.join(", ")
            ));
            if remove {
                t.push_str("    unmanaged_keyslots: remove\n");
            }
        }
        let _ = s;
        t.push_str("settings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }\n  parallelism: 1\n");
        t
    }

    /// Builds a plan from device (file, keys) pairs.
    pub fn plan_of(devices: &[(&str, &[&str])], remove: bool) -> String {
        let mut keys: Vec<&str> = devices
            .iter()
            .flat_map(|(_, k)| k.iter().copied())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let dummy = Scenario {
            name: "",
            devices: &[],
            setup_plan: None,
            setup_runs: &[],
            plan: String::new(),
            args: &[],
            remove,
            kms_keys: &[],
        };
        plan_text(&dummy, devices, &keys, remove)
    }

    /// The scenario's devices as tests/common/invariants.rs takes them.
    fn devices(sc: &Scenario) -> Vec<invariants::Device> {
        sc.devices
            .iter()
            .map(|d| invariants::Device {
                file: d.file.into(),
                luks: d.luks.into(),
                keys: d.keys.iter().map(|k| k.to_string()).collect(),
            })
            .collect()
    }

    /// I1 ([`invariants::check_i1`]) with the file KMS `keys`.
    pub fn check_i1(root: &Path, sc: &Scenario, when: &str) {
        invariants::check_i1(root, &["keys"], &devices(sc), when);
    }

    /// The end state after convergence ([`invariants::check_converged`]).
    pub fn check_converged(root: &Path, sc: &Scenario, when: &str) {
        invariants::check_converged(root, &["keys"], &devices(sc), sc.remove, when);
    }

    fn copy_tree(from: &Path, to: &Path) {
        let st = Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(to)
            .status()
            .expect("cp");
        assert!(st.success(), "cp -a {} {}", from.display(), to.display());
    }

    /// Names of the entries of the scenario's working state (restored before each case).
    const STATE: &[&str] = &["keys", ".keyplan", "keyplan.yaml", "initial.pass"];

    fn save(root: &Path, golden: &Path, sc: &Scenario) {
        for name in STATE
            .iter()
            .copied()
            .chain(sc.devices.iter().map(|d| d.file))
        {
            let src = root.join(name);
            if src.exists() {
                copy_tree(&src, &golden.join(name));
            }
        }
    }

    fn restore(root: &Path, golden: &Path, sc: &Scenario) {
        for name in STATE
            .iter()
            .copied()
            .chain(sc.devices.iter().map(|d| d.file))
        {
            let dst = root.join(name);
            if dst.is_dir() {
                std::fs::remove_dir_all(&dst).expect("rm -r");
            } else if dst.exists() {
                std::fs::remove_file(&dst).expect("rm");
            }
            let src = golden.join(name);
            if src.exists() {
                copy_tree(&src, &dst);
            }
        }
    }

    /// Runs the whole matrix for `sc`; returns the counts.
    pub fn run(sc: &Scenario) -> Counts {
        let w = Watched::new();
        let root: PathBuf = w.s.dir.path().to_path_buf();
        w.s.initial_pass();
        for d in sc.devices {
            w.s.small_image(d.file, d.luks);
        }
        for k in sc.kms_keys {
            file_kms_put(&root, k, INITIAL);
        }
        if let Some(p) = &sc.setup_plan {
            w.s.plan("keyplan.yaml", p);
            w.ok(&["apply", "--auto-approve"], 0);
            for args in sc.setup_runs {
                w.ok(args, 0);
            }
        }
        w.s.plan("keyplan.yaml", &sc.plan);
        let golden = tempfile::tempdir().expect("tempdir");
        save(&root, golden.path(), sc);
        let mut apply_args = vec!["apply", "--auto-approve"];
        apply_args.extend_from_slice(sc.args);

        // The reference run, without faults, must converge too.
        w.ok(&apply_args, 0);
        check_converged(&root, sc, &format!("{}: reference run", sc.name));

        let mut counts = Counts::default();
        let started = std::time::Instant::now();
        for point in crash_points() {
            let mut hits = 0;
            for k in 0.. {
                restore(&root, golden.path(), sc);
                let when = format!("{}: crash at {point} hit {}", sc.name, k + 1);
                let out = w
                    .command(&apply_args)
                    .env("FAILPOINTS", format!("{point}={k}*off->return"))
                    .output()
                    .expect("run keyplan");
                w.record(&out);
                let stderr = String::from_utf8_lossy(&out.stderr);
                if out.status.success() {
                    break; // the point has fewer than k+1 hits in this scenario
                }
                assert_eq!(
                    out.status.signal(),
                    Some(9),
                    "{when}: expected an injected SIGKILL, got {:?}:\n{}{stderr}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout)
                );
                assert!(
                    stderr.contains(&format!("injected crash at {point}")),
                    "{when}: {stderr}"
                );
                hits += 1;
                check_i1(&root, sc, &when);
                let text = w.ok(&apply_args, 0);
                assert!(!text.contains("panicked"), "{when}: {text}");
                check_i1(&root, sc, &format!("{when}, after recovery"));
                let plan = w.ok(&["plan", "--detailed-exitcode"], 0);
                assert!(plan.contains("No changes"), "{when}: {plan}");
                check_converged(&root, sc, &format!("{when}, after recovery"));
            }
            counts.crashes += hits;
            counts.per_point.push((point, hits));
        }
        let t_scan = std::time::Instant::now();
        w.assert_no_leaks();
        eprintln!(
            "crash matrix {}: {} crashes in {:.0?} (leak scan {:.1?}): {:?}",
            sc.name,
            counts.crashes,
            started.elapsed(),
            t_scan.elapsed(),
            counts.per_point
        );
        counts
    }
}

#[cfg(feature = "failpoints")]
use matrix::{plan_of, run, Dev, Scenario};

#[cfg(feature = "failpoints")]
const THREE: &[Dev] = &[
    Dev {
        file: "a.img",
        luks: "luks2",
        keys: &["k"],
    },
    Dev {
        file: "b.img",
        luks: "luks2",
        keys: &["k"],
    },
    Dev {
        file: "c.img",
        luks: "luks1",
        keys: &["k"],
    },
];

#[cfg(feature = "failpoints")]
fn three(keys: &'static [&'static str]) -> Vec<(&'static str, &'static [&'static str])> {
    vec![("a.img", keys), ("b.img", keys), ("c.img", keys)]
}

/// Enrollment of a new key into 3 devices (2 LUKS2, 1 LUKS1) through `enroll_with`.
#[cfg(feature = "failpoints")]
#[test]
fn crash_matrix_enroll_three_devices() {
    let c = run(&Scenario {
        name: "enroll",
        devices: THREE,
        setup_plan: None,
        setup_runs: &[],
        plan: plan_of(&three(&["k"]), false),
        args: &[],
        remove: false,
        kms_keys: &[],
    });
    assert!(c.crashes >= 40, "{c:?}");
}

/// Adoption and rotation in one run: the KMS already holds k (Rook's layout: the initial
/// passphrase, in keyslot 0 of every device, no keyplan record); the run adopts keyslot 0 of
/// each device, stages, adds and verifies v2, commits, and kills the adopted keyslots.
#[cfg(feature = "failpoints")]
#[test]
fn crash_matrix_adopt_and_rotate() {
    let c = run(&Scenario {
        name: "adopt+rotate",
        devices: THREE,
        setup_plan: None,
        setup_runs: &[],
        plan: plan_of(&three(&["k"]), true),
        args: &["--rotate", "k"],
        remove: true,
        kms_keys: &["k"],
    });
    assert!(c.crashes >= 40, "{c:?}");
}

/// Rotation of a key shared by 3 devices.
#[cfg(feature = "failpoints")]
#[test]
fn crash_matrix_rotate_shared_key() {
    let plan = plan_of(&three(&["k"]), false);
    let c = run(&Scenario {
        name: "rotate",
        devices: THREE,
        setup_plan: Some(plan.clone()),
        setup_runs: &[&["apply", "--auto-approve", "--rotate", "k"]],
        plan,
        args: &["--rotate", "k"],
        remove: false,
        kms_keys: &[],
    });
    assert!(c.crashes >= 40, "{c:?}");
}

/// Rotation under `unmanaged_keyslots: remove`: the run rotates k and also kills the initial
/// (unmanaged) keyslot of every device once the new version is committed.
#[cfg(feature = "failpoints")]
#[test]
fn crash_matrix_rotate_with_unmanaged_remove() {
    let c = run(&Scenario {
        name: "rotate+remove",
        devices: THREE,
        setup_plan: Some(plan_of(&three(&["k"]), false)),
        setup_runs: &[],
        plan: plan_of(&three(&["k"]), true),
        args: &["--rotate", "k"],
        remove: true,
        kms_keys: &[],
    });
    assert!(c.crashes >= 40, "{c:?}");
}

/// A run mixing two keys: k1 (on a and b) is rotated while k2 is enrolled into b and c.
#[cfg(feature = "failpoints")]
#[test]
fn crash_matrix_two_keys() {
    const DEVS: &[Dev] = &[
        Dev {
            file: "a.img",
            luks: "luks2",
            keys: &["k1"],
        },
        Dev {
            file: "b.img",
            luks: "luks2",
            keys: &["k1", "k2"],
        },
        Dev {
            file: "c.img",
            luks: "luks1",
            keys: &["k2"],
        },
    ];
    let c = run(&Scenario {
        name: "two keys",
        devices: DEVS,
        setup_plan: Some(plan_of(&[("a.img", &["k1"]), ("b.img", &["k1"])], false)),
        setup_runs: &[],
        plan: plan_of(
            &[
                ("a.img", &["k1"]),
                ("b.img", &["k1", "k2"]),
                ("c.img", &["k2"]),
            ],
            false,
        ),
        args: &["--rotate", "k1"],
        remove: false,
        kms_keys: &[],
    });
    assert!(c.crashes >= 40, "{c:?}");
}

/// A PBKDF re-wrap (issue 32): the plan's PBKDF2 iterations go from 1000 to 2000, so the run
/// adds k's current version beside each managed keyslot with the new PBKDF, verifies it and
/// kills the old keyslot; no KMS write. Killed at any point, the next run converges.
#[cfg(feature = "failpoints")]
#[test]
fn crash_matrix_pbkdf_rewrap() {
    let before = plan_of(&three(&["k"]), false);
    let after = before.replace("iterations: 1000", "iterations: 2000");
    assert_ne!(before, after);
    let c = run(&Scenario {
        name: "pbkdf re-wrap",
        devices: THREE,
        setup_plan: Some(before),
        setup_runs: &[],
        plan: after,
        args: &[],
        remove: false,
        kms_keys: &[],
    });
    assert!(c.crashes >= 30, "{c:?}");
}

/// A key renamed in the plan (issue 32) and rotated in the same run: the records are rewritten
/// to the new id before the old keyslots are killed. Killed at any point, the next run
/// converges.
#[cfg(feature = "failpoints")]
#[test]
fn crash_matrix_rename_and_rotate() {
    let before = plan_of(&three(&["k"]), false);
    let after = plan_of(&three(&["data"]), false)
        .replace("  data: { kms: local }", "  data: { kms: local, name: k }");
    assert!(after.contains("name: k"), "{after}");
    let c = run(&Scenario {
        name: "rename+rotate",
        // The checks read the KMS by the key's name there, `k`.
        devices: THREE,
        setup_plan: Some(before),
        setup_runs: &[],
        plan: after,
        args: &["--rotate", "data"],
        remove: false,
        kms_keys: &[],
    });
    assert!(c.crashes >= 40, "{c:?}");
}
