//! Upgrades mid-run (issue 47, docs/upgrading.md): runs interrupted by a previous release,
//! finished by this keyplan.
//!
//! tests/fixtures/upgrade/<commit>/ holds, for each scenario (a rotation, an enrollment, a
//! migration between two file KMSs, a PBKDF re-wrap), what the keyplan built from `<commit>`
//! left when it was killed at every journal step boundary and at the instants inside a step
//! (made by scripts/make-upgrade-fixtures.sh; README.md there). For every case this test
//! restores it into a directory of its own, checks I1 (the KMS's current version of each key
//! opens every device), runs this keyplan's `apply` with the scenario's arguments, and checks
//! the end state with the crash matrix's checks (tests/common/invariants.rs): I1 again, `plan`
//! says no changes, one keyslot and token per key and no orphan, no pending version; besides,
//! no version that is not current (a rotated-out one, or a staged one the resume dropped)
//! opens any device, and the journal's last run succeeded with no run left unfinished.
//!
//! The one edit: every run of the generator happened in [`FIXTURE_ROOT`], which the journal,
//! `owner.json`, `devices.json` and the KMS holder records name in absolute paths; restoring
//! replaces it by the case's directory in every file but the images (and sets the modes
//! keyplan gave its files, which git does not keep). The runs were made with
//! `NODE_NAME=fixture-node`, as are this test's.
//!
//! Reports SKIPPED only when tests/fixtures/upgrade/ holds no fixtures. With
//! `KEYPLAN_UPGRADE_FIXTURES=DIR` it finishes the cases under DIR instead (scripts/upgrade-test.sh
//! makes random interruptions of the previous release there).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::invariants::{self, Device};
use crate::common::*;

/// Where the generator ran every scenario (scripts/make-upgrade-fixtures.sh, `ROOT`).
const FIXTURE_ROOT: &str = "/tmp/keyplan-upgrade-fixture.root";

/// The node name the fixtures were made with (`NODE_NAME`).
const NODE: &str = "fixture-node";

/// The file KMS directories a scenario may use.
const KMS_DIRS: &[&str] = &["keys", "keys-old", "keys-new"];

/// `<scenario>/scenario.json`.
#[derive(Debug, serde::Deserialize)]
struct ScenarioFile {
    /// Arguments of the interrupted `apply` (after `apply --auto-approve`).
    args: Vec<String>,
    /// The devices and the keys the interrupted run's plan gives them.
    devices: Vec<Device>,
    /// The devices and the keys they held before the interrupted run (I1 as left is checked
    /// for these: a device being enrolled opens with nothing of its key yet).
    before: Vec<Device>,
    /// The file KMS directory that holds every key once the run is finished.
    kms: String,
}

/// Every release's fixtures directory (`tests/fixtures/upgrade/<commit>/`, with `COMMIT`), or
/// those under `KEYPLAN_UPGRADE_FIXTURES` when it is set (the random interruptions of
/// scripts/upgrade-test.sh, in the same layout).
fn releases() -> Vec<PathBuf> {
    let base = match std::env::var_os("KEYPLAN_UPGRADE_FIXTURES") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/upgrade"),
    };
    let mut out: Vec<PathBuf> = std::fs::read_dir(&base)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.join("COMMIT").is_file())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Decompressed images by SHA-256, each decompressed once per test.
struct Images {
    dir: tempfile::TempDir,
    done: BTreeMap<String, PathBuf>,
}

impl Images {
    fn new() -> Images {
        Images {
            dir: tempfile::tempdir().expect("tempdir"),
            done: BTreeMap::new(),
        }
    }

    /// The image `<release>/images/<sha>.img.xz`, decompressed and checked against its name.
    fn get(&mut self, release: &Path, sha: &str) -> PathBuf {
        if let Some(p) = self.done.get(sha) {
            return p.clone();
        }
        let src = release.join("images").join(format!("{sha}.img.xz"));
        let out = Command::new("xz")
            .arg("-dc")
            .arg(&src)
            .output()
            .expect("run xz");
        assert!(out.status.success(), "xz -dc {}", src.display());
        assert_eq!(
            keyplan::saved::sha256_hex(&out.stdout),
            sha,
            "{} does not hold the image its name says",
            src.display()
        );
        let p = self.dir.path().join(format!("{sha}.img"));
        std::fs::write(&p, &out.stdout).expect("write image");
        self.done.insert(sha.to_string(), p.clone());
        p
    }
}

/// Copies the case `from` into `to` (`state/` as `.keyplan/`), replacing [`FIXTURE_ROOT`] by
/// `to` in every file and giving the state and KMS directories keyplan's modes (0700, files
/// 0600); `root` is the case's directory (`to` or above it). Returns how many files named the
/// fixture root.
fn restore_tree(from: &Path, to: &Path, root: &Path) -> usize {
    let top = to == root;
    let mut named = 0;
    let private = |p: &Path| {
        let s = p.to_string_lossy();
        s.contains("/.keyplan") || s.contains("/keys")
    };
    for e in std::fs::read_dir(from).expect("read fixture dir").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if top && name == "images" {
            continue;
        }
        let dst = to.join(if top && name == "state" {
            ".keyplan"
        } else {
            &name
        });
        if e.path().is_dir() {
            std::fs::create_dir_all(&dst).expect("mkdir");
            named += restore_tree(&e.path(), &dst, root);
            if private(&dst) {
                std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o700))
                    .expect("chmod");
            }
            continue;
        }
        let bytes = std::fs::read(e.path()).expect("read fixture file");
        let marker = FIXTURE_ROOT.as_bytes();
        let bytes = if contains(&bytes, marker) {
            named += 1;
            let text = String::from_utf8(bytes).expect("a file naming the root is text");
            text.replace(FIXTURE_ROOT, &root.display().to_string())
                .into_bytes()
        } else {
            bytes
        };
        std::fs::write(&dst, bytes).expect("write");
        if private(&dst) {
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
    }
    named
}

/// Runs this keyplan in `root` as the fixtures' node.
fn keyplan_at(root: &Path, args: &[&str]) -> (bool, String) {
    let out = keyplan_command()
        .current_dir(root)
        .env("NO_COLOR", "1")
        .env("NODE_NAME", NODE)
        .args(args)
        .output()
        .expect("run keyplan");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Restores one case, finishes it with this keyplan and checks the end state.
fn finish_case(release: &Path, case: &Path, sc: &ScenarioFile, images: &mut Images) {
    let when = format!(
        "{} {}",
        release.file_name().unwrap_or_default().to_string_lossy(),
        case.strip_prefix(release).unwrap_or(case).display()
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(tmp.path())
        .expect("canonical tempdir")
        .join("case");
    std::fs::create_dir(&root).expect("mkdir case");
    let named = restore_tree(case, &root, &root);
    assert!(named > 0, "{when}: no file names {FIXTURE_ROOT}");
    let list = std::fs::read_to_string(case.join("images")).expect("the case's images list");
    for line in list.lines() {
        let (file, sha) = line.split_once(' ').expect("`FILE SHA256` lines");
        std::fs::copy(images.get(release, sha), root.join(file)).expect("copy image");
    }
    let before = file_kms_versions(&root);
    invariants::check_i1(&root, KMS_DIRS, &sc.before, &format!("{when}: as left"));

    let mut args = vec!["apply", "--auto-approve"];
    args.extend(sc.args.iter().map(String::as_str));
    let (ok, text) = keyplan_at(&root, &args);
    assert!(ok && !text.contains("panicked"), "{when}: apply:\n{text}");
    let when = format!("{when}, after this keyplan's apply");
    invariants::check_i1(&root, KMS_DIRS, &sc.devices, &when);
    let (_, plan) = keyplan_at(&root, &["plan", "--detailed-exitcode"]);
    assert!(plan.contains("No changes"), "{when}: plan:\n{plan}");
    invariants::check_converged(&root, KMS_DIRS, &sc.devices, false, &when);

    // Every key is in the KMS the run moves it to; no other version opens anything.
    let mut current = Vec::new();
    for d in &sc.devices {
        for k in &d.keys {
            let c = invariants::currents(&root, KMS_DIRS, k);
            assert_eq!(c[0].0, sc.kms, "{when}: {k} is current in {}", c[0].0);
            current.push(c[0].1.clone());
        }
    }
    let mut others = before;
    others.extend(file_kms_versions(&root));
    others.retain(|v| !current.contains(v) && v != INITIAL);
    for d in &sc.devices {
        for v in &others {
            assert!(
                !opens(&root.join(&d.file), v, None),
                "{when}: a version that is not current opens {}",
                d.file
            );
        }
    }

    // The journal: the last run succeeded, none is left unfinished.
    let (ok, text) = keyplan_at(&root, &["journal", "--json"]);
    assert!(ok, "{when}: journal --json:\n{text}");
    let j: serde_json::Value = serde_json::from_str(&text).expect("journal --json");
    let runs = j["runs"].as_array().expect("runs");
    let outcomes: Vec<&str> = runs.iter().filter_map(|r| r["outcome"].as_str()).collect();
    assert_eq!(
        outcomes.last(),
        Some(&"success"),
        "{when}: runs {outcomes:?}"
    );
    assert!(
        !outcomes.contains(&"unfinished"),
        "{when}: a run is left unfinished: {outcomes:?}"
    );
}

/// Every case of `scenario` in every release's fixtures; returns how many were finished.
fn finish_all(scenario: &str) -> usize {
    let releases = releases();
    if releases.is_empty() {
        assert!(
            std::env::var_os("KEYPLAN_UPGRADE_FIXTURES").is_none(),
            "KEYPLAN_UPGRADE_FIXTURES names a directory without fixtures"
        );
        eprintln!("SKIPPED: no upgrade fixtures under tests/fixtures/upgrade/");
        return 0;
    }
    let started = std::time::Instant::now();
    let mut n = 0;
    let mut images = Images::new();
    for release in &releases {
        let dir = release.join(scenario);
        let sc: ScenarioFile = serde_json::from_slice(
            &std::fs::read(dir.join("scenario.json")).expect("scenario.json"),
        )
        .expect("scenario.json parses");
        let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("scenario dir")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        cases.sort();
        assert!(!cases.is_empty(), "{}: no cases", dir.display());
        for case in &cases {
            finish_case(release, case, &sc, &mut images);
            n += 1;
        }
    }
    eprintln!(
        "upgrade {scenario}: {n} interrupted runs of {} release(s) finished in {:.0?}",
        releases.len(),
        started.elapsed()
    );
    n
}

/// A rotation of a key shared by two LUKS2 devices and a LUKS1 one (`apply --rotate k`).
#[test]
fn upgrade_finishes_interrupted_rotation() {
    finish_all("rotation");
}

/// An enrollment: a new key into a device beside another, a new device given a key.
#[test]
fn upgrade_finishes_interrupted_enrollment() {
    finish_all("enrollment");
}

/// A migration: a key moved from one file KMS to another.
#[test]
fn upgrade_finishes_interrupted_migration() {
    finish_all("migration");
}

/// A PBKDF re-wrap: the plan's PBKDF2 iterations changed.
#[test]
fn upgrade_finishes_interrupted_pbkdf_rewrap() {
    finish_all("pbkdf-rewrap");
}
