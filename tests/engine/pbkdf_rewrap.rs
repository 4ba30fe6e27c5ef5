//! PBKDF reconciliation (issue 32): a managed keyslot whose PBKDF is not the plan's
//! `settings.pbkdf` is a change. `plan` shows the re-wrap, `status` reports it (text, JSON,
//! Prometheus), `apply` adds the same key version beside it with the plan's PBKDF, verifies it
//! and kills the old keyslot, with no KMS write; afterwards nothing is left to do. Judged with
//! the real cryptsetup on LUKS image files. The crash matrix runs the same re-wrap killed at
//! every point (tests/engine/crash.rs, `crash_matrix_pbkdf_rewrap`).

use crate::common::*;
use std::path::Path;

/// Plan with key `k` on `a.img` (LUKS2) and `b.img` (LUKS1), and `pbkdf` as `settings.pbkdf`.
fn plan(pbkdf: &str) -> String {
    format!(
        "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local }}\ndevices:\n  a:\n    path: a.img\n    keys: [k]\n    enroll_with: initial.pass\n  b:\n    path: b.img\n    keys: [k]\n    enroll_with: initial.pass\nsettings:\n  pbkdf: {pbkdf}\n  parallelism: 2\n"
    )
}

/// The `kdf` object of keyslot `n` of a LUKS2 image, read with cryptsetup.
fn kdf(dev: &Path, n: u32) -> serde_json::Value {
    luks2_json(dev)["keyslots"][n.to_string()]["kdf"].clone()
}

/// The keyslots keyplan's token on a LUKS2 image names.
fn managed(dev: &Path) -> Vec<u32> {
    let json = luks2_json(dev);
    let mut out: Vec<u32> = json["tokens"]
        .as_object()
        .expect("tokens")
        .values()
        .filter(|t| t["type"] == "keyplan")
        .flat_map(|t| t["keyslots"].as_array().cloned().unwrap_or_default())
        .filter_map(|s| s.as_str().and_then(|s| s.parse().ok()))
        .collect();
    out.sort_unstable();
    out
}

/// Every file of the file KMS under `keys/`, with its bytes: the witness that nothing was
/// written there.
fn kms_files(root: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    walk(&root.join("keys"))
        .into_iter()
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).expect("read KMS file");
            (p, bytes)
        })
        .collect()
}

#[test]
fn a_strengthened_pbkdf_re_wraps_every_managed_keyslot_without_a_kms_write() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.small_image("a.img", "luks2");
    let b = s.small_image("b.img", "luks1");
    s.plan("keyplan.yaml", &plan("{ type: pbkdf2, iterations: 1000 }"));
    s.ok(&["apply", "--auto-approve"], 0);
    let [slot_a] = managed(&a)[..] else {
        panic!("one managed keyslot on a.img: {:?}", managed(&a));
    };
    assert_eq!(kdf(&a, slot_a)["type"], "pbkdf2");
    let b_before = keyslots(&b);
    let v1 = s.key_get("k", None);
    let kms = kms_files(s.dir.path());

    // Strengthened: argon2id, 32 MiB, forced time cost 4, 1 thread.
    s.plan(
        "keyplan.yaml",
        &plan("{ type: argon2id, memory_kib: 32768, iterations: 4, parallel: 1 }"),
    );
    let shown = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(
        shown.contains(
            "re-wrap k v1 with argon2id 32 MiB, 4 iterations, 1 thread (was pbkdf2 1000 iterations)"
        ),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("- keyslot {slot_a:<2} k v1"))
            && shown.contains("re-wrap: k v1 moves to keyslot"),
        "{shown}"
    );
    // LUKS1 knows only pbkdf2: an argon2 plan leaves its keyslots as they are.
    assert!(!shown.contains("# device b"), "{shown}");

    let status = s.ok(&["status"], 1);
    assert!(status.contains("pbkdf"), "{status}");
    let json: serde_json::Value =
        serde_json::from_str(&s.ok(&["status", "--format", "json"], 1)).expect("status JSON");
    let drift = json["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["id"] == "a")
        .map(|d| d["drift"].clone())
        .expect("device a");
    assert_eq!(drift.as_array().map(Vec::len), Some(1), "{drift}");
    assert_eq!(drift[0]["kind"], "pbkdf", "{drift}");
    assert_eq!(drift[0]["keyslot"], slot_a, "{drift}");
    let prom = s.ok(&["status", "--format", "prometheus"], 1);
    assert!(
        prom.contains("keyplan_device_pbkdf_rewrap_keyslots{device=\"a\"} 1")
            && prom.contains("keyplan_device_pbkdf_rewrap_keyslots{device=\"b\"} 0"),
        "{prom}"
    );

    let applied = s.ok(&["apply", "--auto-approve"], 0);
    let [new_a] = managed(&a)[..] else {
        panic!(
            "one managed keyslot on a.img after the re-wrap: {:?}",
            managed(&a)
        );
    };
    assert_ne!(new_a, slot_a, "{applied}");
    assert!(
        !keyslots(&a).contains(&slot_a),
        "the old keyslot is killed: {applied}"
    );
    let k = kdf(&a, new_a);
    assert_eq!(
        (&k["type"], &k["memory"], &k["time"], &k["cpus"]),
        (
            &serde_json::json!("argon2id"),
            &serde_json::json!(32768),
            &serde_json::json!(4),
            &serde_json::json!(1)
        ),
        "{k}"
    );
    assert!(
        opens(&a, &v1, Some(new_a)),
        "v1 opens the re-wrapped keyslot"
    );
    assert!(opens(&a, INITIAL, Some(0)), "the unmanaged keyslot is kept");
    assert_eq!(keyslots(&b), b_before, "LUKS1 device untouched");
    assert_eq!(s.key_get("k", None), v1, "the same key version");
    assert_eq!(kms_files(s.dir.path()), kms, "no KMS write");

    let again = s.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(again.contains("No changes"), "{again}");
    s.ok(&["status"], 0);
}

#[test]
fn more_pbkdf2_iterations_re_wrap_luks1_and_luks2_alike() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.small_image("a.img", "luks2");
    let b = s.small_image("b.img", "luks1");
    s.plan("keyplan.yaml", &plan("{ type: pbkdf2, iterations: 1000 }"));
    s.ok(&["apply", "--auto-approve"], 0);
    let v1 = s.key_get("k", None);
    s.plan("keyplan.yaml", &plan("{ type: pbkdf2, iterations: 2000 }"));
    let shown = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert_eq!(
        shown
            .matches("re-wrap k v1 with pbkdf2 2000 iterations (was pbkdf2 1000 iterations)")
            .count(),
        2,
        "{shown}"
    );
    s.ok(&["apply", "--auto-approve"], 0);
    let [new_a] = managed(&a)[..] else {
        panic!("{:?}", managed(&a));
    };
    assert_eq!(kdf(&a, new_a)["iterations"], 2000);
    let dump = std::process::Command::new(real_cryptsetup())
        .args(["luksDump"])
        .arg(&b)
        .output()
        .expect("luksDump");
    let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
    assert_eq!(
        dump.matches("Iterations:").count(),
        2,
        "the initial keyslot and one managed keyslot: {dump}"
    );
    assert!(dump.contains("2000"), "{dump}");
    assert!(opens(&b, &v1, None) && opens(&a, &v1, None));
    let again = s.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(again.contains("No changes"), "{again}");
}

#[test]
fn a_pinned_keyslot_is_re_wrapped_in_place_through_a_spare_one() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.small_image("a.img", "luks2");
    let pinned = |pbkdf: &str| {
        format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local }}\ndevices:\n  a:\n    path: a.img\n    keys: [{{ key: k, keyslot: 3 }}]\n    enroll_with: initial.pass\nsettings:\n  pbkdf: {pbkdf}\n"
        )
    };
    s.plan(
        "keyplan.yaml",
        &pinned("{ type: pbkdf2, iterations: 1000 }"),
    );
    s.ok(&["apply", "--auto-approve"], 0);
    assert_eq!(managed(&a), [3]);
    let v1 = s.key_get("k", None);
    let kms = kms_files(s.dir.path());
    s.plan(
        "keyplan.yaml",
        &pinned("{ type: argon2id, memory_kib: 32768, iterations: 4, parallel: 1 }"),
    );
    let shown = s.ok(&["plan"], 0);
    assert!(
        shown.contains("temporary keyslot: re-wrap k v1 in its pinned keyslot 3")
            && shown.contains("re-wrap in place with argon2id 32 MiB"),
        "{shown}"
    );
    let status = s.ok(&["status"], 1);
    assert_eq!(
        status
            .matches("pbkdf: `keyplan apply` would re-wrap keyslot 3 (k v1)")
            .count(),
        1,
        "one finding, about the pinned keyslot (the temporary one is none): {status}"
    );
    assert!(
        !status.contains("key_missing") && !status.contains("stale_version"),
        "{status}"
    );
    s.ok(&["apply", "--auto-approve"], 0);
    assert_eq!(managed(&a), [3], "k is back in its pinned keyslot");
    assert_eq!(keyslots(&a), [0, 3], "the spare keyslot is gone");
    assert_eq!(kdf(&a, 3)["type"], "argon2id");
    assert!(opens(&a, &v1, Some(3)));
    assert_eq!(kms_files(s.dir.path()), kms, "no KMS write");
    let again = s.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(again.contains("No changes"), "{again}");
}

#[test]
fn a_time_target_re_wraps_once_and_a_weak_forced_keyslot_is_not_excused() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.small_image("a.img", "luks2");
    let _b = s.small_image("b.img", "luks1");
    // A weak forced keyslot: 32 MiB at the lowest time cost.
    s.plan(
        "keyplan.yaml",
        &plan("{ type: argon2id, memory_kib: 32768, iterations: 4, parallel: 1 }"),
    );
    s.ok(&["apply", "--auto-approve"], 0);
    // A time target with more memory: the benchmark decides the time cost; the keyslot at
    // time cost 4 with less memory is no benchmark's doing, so it is re-wrapped.
    let target = "{ type: argon2id, memory_kib: 65536, iter_time_ms: 200, parallel: 1 }";
    s.plan("keyplan.yaml", &plan(target));
    let shown = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(
        shown.contains("re-wrap k v1 with argon2id 64 MiB, 200 ms, 1 thread (was argon2id 32 MiB, 4 iterations, 1 thread)"),
        "{shown}"
    );
    s.ok(&["apply", "--auto-approve"], 0);
    let [slot] = managed(&a)[..] else {
        panic!("{:?}", managed(&a));
    };
    assert_eq!(kdf(&a, slot)["memory"], 65536);
    let token = luks2_json(&a)["tokens"]
        .as_object()
        .expect("tokens")
        .values()
        .find(|t| t["type"] == "keyplan")
        .cloned()
        .expect("keyplan token");
    assert_eq!(
        token["pbkdf"], "argon2id memory_kib=65536 parallel=1 iter_time_ms=200",
        "the record names the settings it was added with: {token}"
    );
    // Twice "No changes": what the benchmark made of these settings is these settings.
    for _ in 0..2 {
        let again = s.ok(&["plan", "--detailed-exitcode"], 0);
        assert!(again.contains("No changes"), "{again}");
    }
    // Another time target: re-wrapped once (the record names the old one), then settled.
    s.plan(
        "keyplan.yaml",
        &plan("{ type: argon2id, memory_kib: 65536, iter_time_ms: 300, parallel: 1 }"),
    );
    let shown = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(
        shown.contains("re-wrap k v1 with argon2id 64 MiB, 300 ms"),
        "{shown}"
    );
    s.ok(&["apply", "--auto-approve"], 0);
    let again = s.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(again.contains("No changes"), "{again}");
}
