//! A rotation revokes the old key (issue 29, invariant I8 in docs/verification.md): once a
//! version is retired, no keyslot of a managed device opens with it unnoticed.
//!
//! 1. `cryptsetup luksConvertKey` on a managed keyslot (same passphrase, new salt: a routine KDF
//!    upgrade) does not make keyplan drop the keyslot as "rewritten": the recorded version is
//!    tested (one PBKDF run, only then), the keyslot stays managed, and the next rotation
//!    removes it, so the rotated-out version opens nothing. LUKS2 and LUKS1.
//! 2. A copy of a key version in a keyslot keyplan did not make (added by hand) is found when
//!    the version is retired (the plan states the keyslots it tests and the PBKDF runs), and
//!    is reported by `plan`, `status` (text, JSON, Prometheus) for as long as it stays.

use std::path::Path;
use std::process::Command;

use crate::common::*;

/// `cryptsetup luksConvertKey` of `slot` of `img` opening with `pass` (fast PBKDF2 with another
/// iteration count: a new salt and new KDF parameters, the same passphrase). LUKS1 has no
/// luksConvertKey: `luksChangeKey` to the same passphrase re-salts the keyslot the same way.
fn convert_key(img: &Path, slot: u32, pass: &[u8]) {
    let dir = tempfile::tempdir().expect("tempdir");
    if luks_version(img) == 1 {
        let file = dir.path().join("pass");
        std::fs::write(&file, pass).expect("write");
        let out = Command::new("cryptsetup")
            .env("LC_ALL", "C")
            .args([
                "luksChangeKey",
                "--batch-mode",
                "--pbkdf-force-iterations",
                "1200",
                "--key-slot",
                &slot.to_string(),
                "--key-file",
            ])
            .arg(&file)
            .arg(img)
            .arg(&file)
            .output()
            .expect("luksChangeKey");
        assert!(
            out.status.success(),
            "luksChangeKey: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let mut cmd = Command::new("cryptsetup");
    cmd.env("LC_ALL", "C").args([
        "luksConvertKey",
        "--batch-mode",
        "--key-file=-",
        "--key-slot",
        &slot.to_string(),
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1200",
    ]);
    cmd.arg(img);
    let out = run_with_stdin(cmd, pass);
    assert!(
        out.status.success(),
        "luksConvertKey: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The LUKS version of `img` (1 or 2), from its header's version field (bytes 6-7).
fn luks_version(img: &Path) -> u16 {
    let b = std::fs::read(img).expect("read image");
    u16::from_be_bytes([b[6], b[7]])
}

/// A scratch directory with `d1.img` (`luks`) in a plan of one key `k` (file KMS), enrolled by
/// a first `apply`.
fn enrolled(luks: &str) -> (Scratch, std::path::PathBuf) {
    let s = Scratch::new();
    s.initial_pass();
    let img = s.small_image("d1.img", luks);
    s.plan(
        "keyplan.yaml",
        &one_key_plan(&format!(
            "  d1: {{ path: {}, keys: [k], enroll_with: initial.pass }}",
            img.display()
        )),
    );
    s.ok(&["apply", "--auto-approve"], 0);
    (s, img)
}

/// The one keyslot of `img` that `pass` opens, asked of cryptsetup per keyslot.
fn slots_opening(img: &Path, pass: &[u8]) -> Vec<u32> {
    keyslots(img)
        .into_iter()
        .filter(|s| opens(img, pass, Some(*s)))
        .collect()
}

fn converted_keyslot_stays_managed(luks: &str) {
    let (s, img) = enrolled(luks);
    let v1 = s.key_get("k", None);
    let managed = slots_opening(&img, &v1);
    assert_eq!(
        managed.len(),
        1,
        "{luks}: one keyslot holds v1: {managed:?}"
    );
    let slot = managed[0];

    convert_key(&img, slot, &v1);
    assert!(
        opens(&img, &v1, Some(slot)),
        "{luks}: still opens after the convert"
    );

    // The plan tests the keyslot with the recorded version and keeps managing it.
    let out = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(
        out.contains("re-record") && out.contains("luksConvertKey"),
        "{luks}: {out}"
    );
    assert!(!out.contains("now unmanaged"), "{luks}: {out}");
    s.ok(&["apply", "--auto-approve"], 0);
    s.ok(&["plan", "--detailed-exitcode"], 0);
    s.ok(&["status"], 0);

    // A rotation removes it: v1 opens nothing, v2 opens the device.
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let v2 = s.key_get("k", None);
    assert_ne!(v1, v2);
    assert!(opens(&img, &v2, None), "{luks}: v2 opens d1");
    assert!(
        slots_opening(&img, &v1).is_empty(),
        "{luks}: the rotated-out v1 opens no keyslot of d1 (keyslots {:?})",
        keyslots(&img)
    );
    s.ok(&["status"], 0);
}

#[test]
fn a_converted_keyslot_stays_managed_luks2() {
    converted_keyslot_stays_managed("luks2");
}

#[test]
fn a_converted_keyslot_stays_managed_luks1() {
    converted_keyslot_stays_managed("luks1");
}

/// A keyslot converted to a passphrase keyplan does not know is still dropped as rewritten
/// (the recorded version no longer opens it), as before.
#[test]
fn a_keyslot_rewritten_with_another_passphrase_is_unmanaged() {
    let (s, img) = enrolled("luks2");
    let v1 = s.key_get("k", None);
    let slot = slots_opening(&img, &v1)[0];
    // luksChangeKey: same keyslot number, another passphrase.
    std::fs::write(s.path("old.pass"), &v1).expect("write");
    std::fs::write(s.path("other.pass"), b"another passphrase").expect("write");
    let out = Command::new("cryptsetup")
        .env("LC_ALL", "C")
        .args([
            "luksChangeKey",
            "--batch-mode",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-slot",
            &slot.to_string(),
            "--key-file",
        ])
        .arg(s.path("old.pass"))
        .arg(&img)
        .arg(s.path("other.pass"))
        .output()
        .expect("luksChangeKey");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(out.contains("now unmanaged"), "{out}");
    assert!(!out.contains("re-record"), "{out}");
}

/// Adds `pass` to `img` by hand (as an operator would), into keyslot `slot`, unlocking with
/// `unlock`.
fn add_by_hand(s: &Scratch, img: &Path, slot: u32, unlock: &[u8], pass: &[u8]) {
    std::fs::write(s.path("unlock.pass"), unlock).expect("write");
    std::fs::write(s.path("hand.pass"), pass).expect("write");
    let out = Command::new("cryptsetup")
        .env("LC_ALL", "C")
        .args([
            "luksAddKey",
            "--batch-mode",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--new-key-slot",
            &slot.to_string(),
            "--key-file",
        ])
        .arg(s.path("unlock.pass"))
        .arg(img)
        .arg(s.path("hand.pass"))
        .output()
        .expect("luksAddKey");
    std::fs::remove_file(s.path("hand.pass")).expect("rm");
    std::fs::remove_file(s.path("unlock.pass")).expect("rm");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A run killed right before it retires a version, after it searched for copies; a copy made
/// by hand while no keyplan runs; the resumed run searches again before the version's
/// material is gone (found by the protocol model, docs/verification.md).
#[test]
#[cfg(feature = "failpoints")]
fn a_resumed_retire_searches_for_copies_again() {
    let (s, img) = enrolled("luks2");
    let v1 = s.key_get("k", None);
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let out = assert_cmd::Command::from_std(keyplan_command())
        .current_dir(s.path(""))
        .env("FAILPOINTS", "kms.retire=return")
        .args(["apply", "--auto-approve", "--rotate", "k"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), None, "killed right before the retire");
    assert_eq!(s.key_get("k", Some(1)), v1, "v1 not retired yet");
    add_by_hand(&s, &img, 6, &s.key_get("k", None), &v1);
    let out = s.ok(&["apply", "--auto-approve"], 0);
    assert!(
        out.contains("first searched again for copies: d1: keyslot 6 opens with k v1"),
        "{out}"
    );
    let text = s.ok(&["status"], 1);
    assert!(text.contains("keyslot 6 still opens with k v1"), "{text}");
}

#[test]
fn a_copy_of_a_retired_version_is_found_and_reported() {
    let (s, img) = enrolled("luks2");
    let v1 = s.key_get("k", None);
    // An operator adds v1 into keyslot 5 by hand (a "backup" of the KMS's passphrase).
    add_by_hand(&s, &img, 5, &v1, &v1);

    // First rotation: v1 becomes previous (kept), nothing retired yet.
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    // Second rotation: v1 is retired; the plan says which keyslots are tested first.
    let out = s.ok(&["plan", "--rotate", "k"], 0);
    assert!(
        out.contains("- key k v1")
            && out.contains(
                "first tested for copies of it: d1 keyslot 0, d1 keyslot 5 (2 PBKDF runs"
            ),
        "{out}"
    );
    let out = s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    assert!(out.contains("keyslot 5 opens with k v1"), "{out}");
    assert!(opens(&img, &v1, Some(5)), "keep: the copy stays");

    // status reports it, in every format, and plan notes it; until it is removed.
    let text = s.ok(&["status"], 1);
    assert!(
        text.contains("keyslot 5 still opens with k v1, which keyplan retired")
            && text.contains("luksKillSlot"),
        "{text}"
    );
    let json = s.ok(&["status", "--format", "json"], 1);
    let doc: serde_json::Value = serde_json::from_str(&json).expect("status json");
    assert_eq!(doc["format_version"], "1.4");
    assert_eq!(
        doc["devices"][0]["retired_copies"].as_array().map(Vec::len),
        Some(1),
        "{json}"
    );
    let prom = s.ok(&["status", "--format", "prometheus"], 1);
    assert!(
        prom.contains("keyplan_device_retired_copies{device=\"d1\"} 1"),
        "{prom}"
    );
    let out = s.ok(&["plan"], 0);
    assert!(out.contains("keyslot 5 still opens with k v1"), "{out}");

    let out = Command::new("cryptsetup")
        .env("LC_ALL", "C")
        .args(["luksKillSlot", "--batch-mode"])
        .arg(&img)
        .arg("5")
        .output()
        .expect("luksKillSlot");
    assert!(out.status.success());
    s.ok(&["status"], 0);
    let prom = s.ok(&["status", "--format", "prometheus"], 0);
    assert!(
        prom.contains("keyplan_device_retired_copies{device=\"d1\"} 0"),
        "{prom}"
    );
}

/// A key on two nodes (fleet mode, one state directory each): the node that votes searches its
/// own devices for copies of the previous version before its vote, since the other node's
/// commit retires that version; the plan says so, and the copy is reported.
#[test]
fn a_voting_node_searches_its_devices_for_copies_before_it_votes() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.small_image("a.img", "luks2");
    let b = s.small_image("b.img", "luks2");
    let dev = |id: &str, img: &Path, node: &str| {
        format!(
            "  {id}: {{ path: {}, keys: [k], enroll_with: initial.pass, node: {node} }}",
            img.display()
        )
    };
    s.plan(
        "keyplan.yaml",
        &one_key_plan(&format!("{}\n{}", dev("a", &a, "n1"), dev("b", &b, "n2"))),
    );
    let on = |node: &str, args: &[&str], code: i32| {
        let dir = format!("st-{node}");
        let mut all = vec!["--node", node, "--state-dir", dir.as_str()];
        all.extend_from_slice(args);
        s.ok(&all, code)
    };
    // Both nodes enroll, then one rotation (the last voter commits).
    on("n1", &["apply", "--auto-approve"], 0);
    on("n2", &["apply", "--auto-approve"], 0);
    on("n1", &["apply", "--auto-approve", "--rotate", "k"], 0);
    on("n2", &["apply", "--auto-approve"], 0);
    on("n1", &["apply", "--auto-approve"], 0);
    let v1 = s.key_get_as(&["--node", "n1", "--state-dir", "st-n1"], "k", Some(1));
    let v2 = s.key_get_as(&["--node", "n1", "--state-dir", "st-n1"], "k", None);
    assert_ne!(v1, v2, "rotated once");
    // An operator copies v1 into keyslot 6 of n1's device.
    add_by_hand(&s, &a, 6, &v2, &v1);
    // The second rotation: n1 searches a, then votes and waits for n2, whose commit retires
    // v1 (n2 searches its own device b before that).
    let out = on("n1", &["plan", "--rotate", "k"], 0);
    assert!(
        out.contains("before this node votes, tested for copies of versions the commit may retire: a keyslot 0 (v1), a keyslot 6 (v1) (2 PBKDF runs"),
        "{out}"
    );
    let out = on("n1", &["apply", "--auto-approve", "--rotate", "k"], 0);
    assert!(
        out.contains("its commit waits for n2") && out.contains("keyslot 6 opens with k v1"),
        "{out}"
    );
    let out = on("n2", &["apply", "--auto-approve"], 0);
    assert!(
        out.contains("first tested for copies of it: b keyslot 0"),
        "{out}"
    );
    on("n1", &["apply", "--auto-approve"], 0);
    assert!(
        s.keyplan(&[
            "--node",
            "n1",
            "--state-dir",
            "st-n1",
            "key",
            "get",
            "k",
            "--version",
            "1"
        ])
        .status
        .code()
            == Some(1),
        "v1 is retired"
    );
    let text = on("n1", &["status"], 1);
    assert!(text.contains("keyslot 6 still opens with k v1"), "{text}");
}
