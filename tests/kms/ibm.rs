//! IBM Key Protect through the exec helper `examples/ibm-key-protect/keyplan-kms-keyprotect`,
//! against a local stand-in of Key Protect and IAM (`tests/standins/ibm_key_protect.py`, started
//! per test; no emulator of Key Protect exists): the provider contract, the keyplan binary end
//! to end (Rook-style adoption, rotations, a concurrent writer, crashes inside the helper,
//! refused credentials, a stopped server), and the contract against a real instance, opt-in.
//!
//! Independent witnesses: the stand-in's keys read over its test hook, and cryptsetup.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::ibm_standin::{KeyProtect, INSTANCE, MANAGER_KEY, READER_KEY, WRITER_KEY};
use crate::common::standin::python;
use crate::common::*;
use keyplan::kms::exec::ExecKms;
use keyplan::kms::Kms;
use keyplan::secret::Passphrase;

/// The helper shipped with keyplan.
const HELPER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/ibm-key-protect/keyplan-kms-keyprotect"
);

/// The passphrase a Rook-style deployment stored before keyplan: a standard key's payload.
const ROOK: &str = "rook-made-passphrase-kp-0123456789abcdef";

/// The helper's argv against `kp` with alias prefix `prefix`; extra arguments after it.
fn helper_argv(kp: &KeyProtect, prefix: &str, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        python(),
        HELPER.to_string(),
        "--instance".into(),
        INSTANCE.into(),
        "--endpoint".into(),
        kp.url(),
        "--iam-endpoint".into(),
        kp.url(),
        "--prefix".into(),
        prefix.into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// An exec KMS running the helper with the Manager API key from the file `key_file`.
fn exec_kms(kp: &KeyProtect, prefix: &str, key_file: &Path) -> ExecKms {
    let file = key_file.display().to_string();
    ExecKms::new(
        "kp",
        helper_argv(kp, prefix, &["--api-key-file", &file]),
        Duration::from_secs(30),
    )
    .expect("exec kms")
}

/// Starts the stand-in, or skips (`None`) without python3.
fn standin(test: &str) -> Option<KeyProtect> {
    KeyProtect::start(test)
}

fn key_file(dir: &Path, key: &str) -> PathBuf {
    let p = dir.join("kp-api-key");
    std::fs::write(&p, key).unwrap();
    p
}

#[test]
fn ibm_provider_contract_against_the_standin() {
    let Some(kp) = standin("ibm_provider_contract_against_the_standin") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = key_file(dir.path(), MANAGER_KEY);
    let (kms, other) = (
        exec_kms(&kp, "keyplan-", &file),
        exec_kms(&kp, "keyplan-", &file),
    );
    crate::common::kms_contract::run(&kms, &other, "contract");

    // What Key Protect holds, read from the stand-in itself: the record names the current
    // version, whose key holds the material; retired versions' keys are deleted.
    let rec = kp.record("keyplan-contract-a").expect("a record");
    let cur = rec["current"].as_u64().expect("current");
    assert_eq!(
        kp.payload(&format!("keyplan-contract-a_v{cur}")).unwrap(),
        kms.get("contract-a", cur).unwrap().expose()
    );
    for v in [1, 2, 10] {
        assert!(
            kp.deleted(&format!("keyplan-contract-a_v{v}")),
            "version {v} of contract-a still has material"
        );
    }
    let b = kp.record("keyplan-contract-b").expect("record of b");
    assert_eq!(b["holders"].as_object().map(|h| h.len()), Some(0), "{b}");
}

#[test]
fn ibm_helper_refuses_bad_names_and_requests() {
    let Some(kp) = standin("ibm_helper_refuses_bad_names_and_requests") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = key_file(dir.path(), MANAGER_KEY);
    let kms = exec_kms(&kp, "keyplan-", &file);
    for name in ["has_underscore", "a b", "-leading", &"x".repeat(80)] {
        match kms.read(name) {
            Err(e @ keyplan::kms::KmsError::Config { .. }) => {
                assert!(e.to_string().contains("Key Protect"), "{e}")
            }
            other => panic!("{name:?}: expected Config, got {other:?}"),
        }
    }
    // A wrong instance: the instance is named, a configuration error.
    let wrong = ExecKms::new(
        "kp",
        {
            let mut a = helper_argv(&kp, "keyplan-", &["--api-key-file"]);
            a.push(file.display().to_string());
            let i = a.iter().position(|x| x == INSTANCE).unwrap();
            a[i] = "no-such-instance".into();
            a
        },
        Duration::from_secs(30),
    )
    .unwrap();
    match wrong.read("k") {
        Err(e @ keyplan::kms::KmsError::Config { .. }) => {
            assert!(e.to_string().contains("no-such-instance"), "{e}")
        }
        other => panic!("expected Config, got {other:?}"),
    }
    // Nothing was written by any of it.
    assert!(kp.keys().is_empty(), "{:?}", kp.keys());
}

// ---------------------------------------------------------------------------------------------
// The keyplan binary end to end.

/// A plan with key `osd-kek` (alias prefix "", so the Rook-era key's alias is `osd-kek`) on two
/// LUKS2 devices and a LUKS1 one; `extra` is added to the KMS entry (e.g. `timeout: 5s`).
fn kp_plan(kp: &KeyProtect, extra: &str) -> String {
    format!(
        "version: 1\nkms:\n  kp:\n    provider: exec\n    command: {}\n{extra}keys:\n  osd-kek: {{ kms: kp, name: osd-kek }}\ndevices:\n  block: {{ path: block.img, keys: [osd-kek] }}\n  db: {{ path: db.img, keys: [osd-kek] }}\n  legacy: {{ path: legacy.img, keys: [osd-kek] }}\n{FAST_PBKDF}",
        serde_json::to_string(&helper_argv(kp, "", &[])).unwrap()
    )
}

/// The KMS `timeout` of the tests whose helper the stand-in hangs: short, so the hung helper
/// is killed soon, yet long enough for a read-only command, which may spend at most this
/// much on the KMS in all (docs/monitoring.md, "Deadlines"): its five or six helper runs
/// took up to 1.4 s each on a loaded 2-core machine, where 5 s did not suffice.
const HANG_LIMIT: &str = "    timeout: 15s\n";

/// Runs keyplan (watched) with `api_key` in IBMCLOUD_API_KEY; asserts the exit code. The
/// helper's own HTTP timeout is 60 s, above [`HANG_LIMIT`], so a request the stand-in hangs
/// is ended by keyplan's limit.
fn kp_run(w: &Watched, api_key: &str, args: &[&str], code: i32) -> String {
    let out = w
        .command(args)
        .env("IBMCLOUD_API_KEY", api_key)
        .env("KP_HTTP_TIMEOUT", "60")
        .output()
        .expect("run keyplan");
    w.record(&out);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(code), "keyplan {args:?}:\n{text}");
    text
}

/// The current version's material of `osd-kek`, read from the stand-in (record, then the
/// version's key), remembered as a secret of the watch.
fn current(w: &Watched, kp: &KeyProtect) -> (u64, Vec<u8>) {
    let (v, material) = kp
        .current("osd-kek")
        .expect("a current version with its payload");
    w.add_secret(&material);
    (v, material)
}

/// A Rook-era standard key and three devices formatted with it, adopted by `apply`.
fn adopted(kp: &KeyProtect, extra: &str) -> (Watched, Vec<PathBuf>) {
    let w = Watched::new();
    w.add_secret(ROOK.as_bytes());
    kp.put_standard_key("osd-kek", "osd-kek", ROOK.as_bytes());
    let devs = rook_devices(&w.s, ROOK.as_bytes());
    w.s.plan("keyplan.yaml", &kp_plan(kp, extra));
    let before: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    let out = kp_run(&w, MANAGER_KEY, &["plan"], 0);
    assert!(!out.contains("+ key osd-kek"), "no new key: {out}");
    let out = kp_run(&w, MANAGER_KEY, &["apply", "--auto-approve"], 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let after: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    assert_eq!(before, after, "adoption changed keyslots");
    (w, devs)
}

#[test]
fn ibm_rook_style_adoption_then_rotations() {
    let Some(kp) = standin("ibm_rook_style_adoption_then_rotations") else {
        return;
    };
    let (w, devs) = adopted(&kp, "");
    // The Rook-era key is unchanged, and is version 1, current.
    let rook = kp.by_alias("osd-kek").expect("the adopted key");
    assert_eq!(kp.payload("osd-kek").unwrap(), ROOK.as_bytes());
    assert_eq!(current(&w, &kp), (1, ROOK.as_bytes().to_vec()));
    let rec = kp.record("osd-kek").unwrap();
    assert_eq!(rec["versions"][0]["id"], rook["id"], "{rec}");
    for d in &devs {
        assert!(opens(d, ROOK.as_bytes(), None), "{}", d.display());
    }
    let st = w
        .command(&["status", "--format", "json"])
        .env("IBMCLOUD_API_KEY", MANAGER_KEY)
        .output()
        .unwrap();
    w.record(&st);
    let j: serde_json::Value = serde_json::from_slice(&st.stdout).expect("status json");
    assert_eq!(j["keys"][0]["current"]["version"], 1, "{j}");
    // The helper's `credentials`: the API key IAM accepted, no expiry known.
    let c = &j["kms"][0]["credentials"][0];
    assert_eq!(c["kind"], "ibm_api_key", "{j}");
    assert!(
        c["what"].as_str().unwrap().contains("IBMCLOUD_API_KEY"),
        "{j}"
    );
    assert_eq!(c["expires_at"], serde_json::Value::Null, "{j}");

    // Rotation: v2 is its own standard key; the record makes it current; every device opens
    // with it.
    let out = kp_run(
        &w,
        MANAGER_KEY,
        &["apply", "--auto-approve", "--rotate", "osd-kek"],
        0,
    );
    assert!(out.contains("Apply complete!"), "{out}");
    let (v, v2) = current(&w, &kp);
    assert_eq!(v, 2);
    assert_ne!(v2, ROOK.as_bytes());
    assert_eq!(kp.payload("osd-kek_v2").unwrap(), v2);
    for d in &devs {
        assert!(opens(d, &v2, None), "v2 opens {}", d.display());
    }

    // A second rotation retires the adopted version: its key is deleted in Key Protect, and
    // the passphrase Rook made opens no device any more.
    kp_run(
        &w,
        MANAGER_KEY,
        &["apply", "--auto-approve", "--rotate", "osd-kek"],
        0,
    );
    let (v, v3) = current(&w, &kp);
    assert_eq!(v, 3);
    assert!(kp.deleted("osd-kek"), "the adopted key was not deleted");
    for d in &devs {
        assert!(opens(d, &v3, None), "v3 opens {}", d.display());
        assert!(
            !opens(d, ROOK.as_bytes(), None),
            "ROOK opens {}",
            d.display()
        );
    }
    let rec = kp.record("osd-kek").unwrap();
    assert_eq!(rec["versions"][0]["state"], "retired", "{rec}");
    let out = kp_run(&w, MANAGER_KEY, &["plan", "--detailed-exitcode"], 0);
    assert!(out.contains("No changes"), "{out}");
    w.assert_no_leaks();
}

/// Another writer commits between keyplan's stage and commit (keyplan waits at the
/// `commit.before` failpoint): keyplan's commit is refused, "changed concurrently", and the
/// other writer's version stands; then a stopped stand-in is "unavailable" and changes nothing.
#[cfg(feature = "failpoints")]
#[test]
fn ibm_concurrent_writer_then_stopped_server() {
    let Some(mut kp) = standin("ibm_concurrent_writer_then_stopped_server") else {
        return;
    };
    let (w, devs) = adopted(&kp, "");
    let gate = w.s.path("gate");
    std::fs::write(&gate, "").unwrap();
    let mut child = w
        .command(&["apply", "--auto-approve", "--rotate", "osd-kek"])
        .env("IBMCLOUD_API_KEY", MANAGER_KEY)
        .env(
            "FAILPOINTS",
            format!("commit.before=return(wait:{})", gate.display()),
        )
        .stdout(std::fs::File::create(w.s.path("apply.out")).unwrap())
        .stderr(std::fs::File::create(w.s.path("apply.err")).unwrap())
        .spawn()
        .expect("spawn keyplan");
    wait_at_gate(&gate, child.id());

    // The rival: commits keyplan's pending v2, then stages and commits its own v3, through
    // the helper like any other writer.
    let file = key_file(w.s.dir.path(), MANAGER_KEY);
    let rival = exec_kms(&kp, "", &file);
    let rec = kp.record("osd-kek").unwrap();
    assert_eq!(rec["pending"], 2, "{rec}");
    rival
        .commit("osd-kek", Some(1), 2)
        .expect("rival commit v2");
    let material = b"rival-writer-passphrase-kp-000000".to_vec();
    w.add_secret(&material);
    let v3 = rival
        .stage("osd-kek", &Passphrase::new(material.clone()), 0)
        .expect("rival stage");
    assert_eq!(v3, 3);
    rival
        .commit("osd-kek", Some(2), 3)
        .expect("rival commit v3");

    std::fs::remove_file(&gate).unwrap();
    let status = child.wait().unwrap();
    let out = std::process::Output {
        status,
        stdout: std::fs::read(w.s.path("apply.out")).unwrap(),
        stderr: std::fs::read(w.s.path("apply.err")).unwrap(),
    };
    w.record(&out);
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("changed concurrently"), "{text}");
    assert!(text.contains("nothing was overwritten"), "{text}");
    // The rival's version stands, untouched; v1 still opens every device.
    assert_eq!(current(&w, &kp), (3, material));
    let rec = kp.record("osd-kek").unwrap();
    assert!(rec["pending"].is_null(), "{rec}");
    for d in &devs {
        assert!(opens(d, ROOK.as_bytes(), None), "{}", d.display());
    }

    // The stand-in stopped: unavailable, nothing changed.
    kp.standin.stop();
    let before: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    let out = kp_run(&w, MANAGER_KEY, &["apply", "--auto-approve"], 1);
    assert!(out.contains("is unavailable"), "{out}");
    let out = kp_run(&w, MANAGER_KEY, &["plan"], 3);
    assert!(
        out.contains("unavailable") || out.contains("Connection refused"),
        "{out}"
    );
    let after: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    assert_eq!(before, after);
    w.assert_no_leaks();
}

/// Runs an apply that the stand-in makes hang inside one helper operation (its request hangs,
/// the plan's limit, [`HANG_LIMIT`], kills the helper): the run fails, and the stand-in is
/// released.
fn apply_killed_in_the_helper(w: &Watched, kp: &KeyProtect, args: &[&str]) -> String {
    let out = kp_run(w, MANAGER_KEY, args, 1);
    assert!(out.contains("no answer within 15 s"), "{out}");
    kp.release();
    out
}

/// A crash inside the helper between its requests: (1) `stage` killed after creating the
/// version's key and before recording it (an unrecorded key is left); the next rotation
/// steps over it, records it as retired and deletes it. (2) `commit` killed after its record
/// was written but before it answered; the next apply recognises the commit and converges.
#[test]
fn ibm_crash_inside_the_helper_is_harmless() {
    let Some(kp) = standin("ibm_crash_inside_the_helper_is_harmless") else {
        return;
    };
    let (w, devs) = adopted(&kp, HANG_LIMIT);
    let rotate = ["apply", "--auto-approve", "--rotate", "osd-kek"];

    // (1) The stage's record (the first with "pending":2) hangs before it is written.
    kp.hang("osd-kek_s", "\"pending\":2", "before");
    apply_killed_in_the_helper(&w, &kp, &rotate);
    let orphan = kp
        .by_alias("osd-kek_v2")
        .expect("the unrecorded version key");
    assert_eq!(orphan["deleted"], false);
    let rec = kp.record("osd-kek").unwrap();
    assert!(rec["pending"].is_null(), "nothing recorded: {rec}");
    assert_eq!(rec["current"], 1, "{rec}");
    for d in &devs {
        assert!(opens(d, ROOK.as_bytes(), None), "{}", d.display());
    }
    let out = kp_run(&w, MANAGER_KEY, &rotate, 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let (v, v3) = current(&w, &kp);
    assert_eq!(v, 3, "v2 was stepped over");
    assert!(
        kp.deleted("osd-kek_v2"),
        "the unrecorded key kept its material"
    );
    let rec = kp.record("osd-kek").unwrap();
    let v2 = rec["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["version"] == 2)
        .cloned()
        .unwrap();
    assert_eq!(v2["state"], "retired", "{rec}");
    for d in &devs {
        assert!(opens(d, &v3, None), "{}", d.display());
    }

    // (2) The commit's record (the next with "pending":null and current 4) hangs after it was
    // written: the commit happened, the helper never said so.
    kp.hang("osd-kek_s", "\"current\":4", "after");
    apply_killed_in_the_helper(&w, &kp, &rotate);
    let (v, v4) = current(&w, &kp);
    assert_eq!(v, 4, "the commit was written");
    let out = kp_run(&w, MANAGER_KEY, &["apply", "--auto-approve"], 0);
    assert!(
        out.contains("Apply complete!") || out.contains("No changes"),
        "{out}"
    );
    for d in &devs {
        assert!(opens(d, &v4, None), "{}", d.display());
    }
    let out = kp_run(&w, MANAGER_KEY, &["plan", "--detailed-exitcode"], 0);
    assert!(out.contains("No changes"), "{out}");
    w.assert_no_leaks();
}

/// An API key IAM does not know, and one with the Reader role only: `plan` exits 3 and
/// `apply` 1, naming the credentials (and the missing role), and no keyslot changes.
#[test]
fn ibm_refused_credentials_change_nothing() {
    let Some(kp) = standin("ibm_refused_credentials_change_nothing") else {
        return;
    };
    let w = Watched::new();
    w.add_secret(ROOK.as_bytes());
    kp.put_standard_key("osd-kek", "osd-kek", ROOK.as_bytes());
    let devs = rook_devices(&w.s, ROOK.as_bytes());
    w.s.plan("keyplan.yaml", &kp_plan(&kp, ""));
    let before: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    for (args, code) in [(&["plan"][..], 3), (&["apply", "--auto-approve"][..], 1)] {
        let out = kp_run(&w, "not-a-known-api-key", args, code);
        assert!(out.contains("refused the API key"), "{args:?}: {out}");
        assert!(out.contains("IBMCLOUD_API_KEY"), "{args:?}: {out}");
        assert!(
            !out.contains("not-a-known-api-key"),
            "the API key is quoted: {out}"
        );
    }
    // `status` says the credential was refused: a problem (exit 1), and the reason.
    let st = w
        .command(&["status", "--format", "json"])
        .env("IBMCLOUD_API_KEY", "not-a-known-api-key")
        .output()
        .unwrap();
    w.record(&st);
    let j: serde_json::Value = serde_json::from_slice(&st.stdout).expect("status json");
    let error = j["kms"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("refused the API key"), "{j}");
    assert_ne!(st.status.code(), Some(0), "{j}");
    // Reader may look, not write: the adoption's first record needs Writer.
    let out = kp_run(&w, READER_KEY, &["apply", "--auto-approve"], 1);
    assert!(out.contains("Writer"), "{out}");
    assert!(!out.contains(READER_KEY), "the API key is quoted: {out}");
    let after: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    assert_eq!(before, after);
    assert!(
        kp.record("osd-kek").is_none(),
        "a record was written: {:?}",
        kp.keys()
    );
    w.assert_no_leaks();
}

/// The state of version `v` of `osd-kek` in the newest record, read from the stand-in.
fn state_of(kp: &KeyProtect, v: u64) -> String {
    let rec = kp.record("osd-kek").expect("a record of osd-kek");
    rec["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["version"] == v)
        .and_then(|e| e["state"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no version {v}: {rec}"))
}

/// `keyplan key get osd-kek --version <v>` with the Manager key (stdout piped, not recorded:
/// it is material): the exit code and stdout, stderr.
fn key_get(w: &Watched, v: u64) -> (Option<i32>, Vec<u8>, String) {
    let out = w
        .command(&["key", "get", "osd-kek", "--version", &v.to_string()])
        .env("IBMCLOUD_API_KEY", MANAGER_KEY)
        .output()
        .expect("run keyplan key get");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    (out.status.code(), out.stdout, err)
}

/// A retire whose deletion fails (an API key with Writer but not Manager: the DELETE answers
/// 403 after the commit) leaves the version readable as `previous`, with its material (keyplan
/// retires previous versions at a rotation: the next one retires it for real); and a helper
/// killed between the deletion and the record saying "retired" converges the same way.
#[test]
fn ibm_retire_that_fails_is_finished_by_the_next_run() {
    let Some(kp) = standin("ibm_retire_that_fails_is_finished_by_the_next_run") else {
        return;
    };
    let (w, devs) = adopted(&kp, HANG_LIMIT);
    let rook_id = kp.by_alias("osd-kek").expect("the adopted key")["id"]
        .as_str()
        .unwrap()
        .to_string();
    let rotate = ["apply", "--auto-approve", "--rotate", "osd-kek"];
    kp_run(&w, MANAGER_KEY, &rotate, 0);
    assert_eq!(current(&w, &kp).0, 2);

    // Writer only: v3 is committed, v1's retire (DELETE) is refused.
    let out = kp_run(&w, WRITER_KEY, &rotate, 1);
    assert!(out.contains("Manager"), "{out}");
    assert!(!out.contains(WRITER_KEY), "the API key is quoted: {out}");
    let (v, v3) = current(&w, &kp);
    assert_eq!(v, 3);
    assert_eq!(
        kp.payload("osd-kek").as_deref(),
        Some(ROOK.as_bytes()),
        "v1's key must still exist"
    );
    assert_ne!(state_of(&kp, 1), "retired", "v1 is recorded as retired");
    // keyplan still sees v1's material (it does not claim it was destroyed).
    let (code, material, err) = key_get(&w, 1);
    assert_eq!(code, Some(0), "{err}");
    assert!(material == ROOK.as_bytes(), "key get --version 1 is not v1");
    for d in &devs {
        assert!(opens(d, &v3, None), "v3 opens {}", d.display());
    }

    // The next rotation, with a Manager key, retires v1 again: its key is deleted; the helper
    // is killed between that deletion and the record saying "retired" (which hangs).
    kp.hang(
        "osd-kek_s",
        &format!("\"id\":\"{rook_id}\",\"state\":\"retired\""),
        "before",
    );
    apply_killed_in_the_helper(&w, &kp, &rotate);
    let v = current(&w, &kp).0;
    assert_eq!(v, 4);
    assert!(kp.deleted("osd-kek"), "v1's key still has material");
    assert_eq!(state_of(&kp, 1), "retiring", "v1's deletion was recorded");
    let (code, material, err) = key_get(&w, 1);
    assert_ne!(code, Some(0), "key get of a deleted version succeeded");
    assert!(material.is_empty());
    assert!(!err.contains("corrupt"), "{err}");

    // The rotation after: v1 is finished (its DELETE answers 410: done), and the versions
    // before v4 are retired and deleted.
    let out = kp_run(&w, MANAGER_KEY, &rotate, 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let (v, v5) = current(&w, &kp);
    assert_eq!(v, 5);
    for n in [1, 2, 3] {
        assert_eq!(state_of(&kp, n), "retired", "v{n}");
    }
    for alias in ["osd-kek", "osd-kek_v2", "osd-kek_v3"] {
        assert!(kp.deleted(alias), "{alias} still has material");
    }
    assert!(!kp.deleted("osd-kek_v4"), "v4 (previous) lost its material");
    let (code, material, _) = key_get(&w, 1);
    assert_ne!(code, Some(0));
    assert!(material.is_empty());
    for d in &devs {
        assert!(opens(d, &v5, None), "v5 opens {}", d.display());
    }
    let out = kp_run(&w, MANAGER_KEY, &["plan", "--detailed-exitcode"], 0);
    assert!(out.contains("No changes"), "{out}");
    w.assert_no_leaks();
}

/// An alias prefix with '_' could make one key's version alias another key's adoption alias
/// (prefix `keyplan-osd-kek_`, key `v2` is alias `keyplan-osd-kek_v2`, version 2 of key
/// `osd-kek`): refused as a configuration error naming the '_', before any request.
#[test]
fn ibm_prefix_with_underscore_is_refused() {
    let Some(kp) = standin("ibm_prefix_with_underscore_is_refused") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = key_file(dir.path(), MANAGER_KEY);
    let kms = exec_kms(&kp, "keyplan-", &file);
    let secret = b"osd-kek-v2-material-0123456789abcdef".to_vec();
    assert_eq!(
        kms.stage(
            "osd-kek",
            &Passphrase::new(b"v1-material-0123456789".to_vec()),
            0
        )
        .unwrap(),
        1
    );
    kms.commit("osd-kek", None, 1).unwrap();
    assert_eq!(
        kms.stage("osd-kek", &Passphrase::new(secret.clone()), 0)
            .unwrap(),
        2
    );
    kms.commit("osd-kek", Some(1), 2).unwrap();
    let before = kp.keys();

    let other = exec_kms(&kp, "keyplan-osd-kek_", &file);
    let res = other.read("v2");
    match &res {
        Err(e @ keyplan::kms::KmsError::Config { .. }) => {
            let m = e.to_string();
            assert!(m.contains("'_'"), "{m}");
        }
        other => panic!(
            "expected Config, got {:?}",
            other.as_ref().map(|s| s.current)
        ),
    }
    for op in [
        other.hold("v2", "h1").err(),
        other.retire("v2", 1).err(),
        other.destroy_key("v2", 1).err(),
    ] {
        assert!(
            matches!(op, Some(keyplan::kms::KmsError::Config { .. })),
            "{op:?}"
        );
    }
    // Nothing changed: osd-kek's v2 key keeps its material, no record was added.
    assert_eq!(kp.payload("keyplan-osd-kek_v2"), Some(secret));
    assert_eq!(kp.keys().len(), before.len());
    assert!(kp.record("keyplan-osd-kek_v2").is_none());
}

/// Endpoints: plain http only to a loopback host, for Key Protect and IAM alike; no
/// user:password (never quoted back); no path. All refused as configuration errors before
/// any request reaches anything.
#[test]
fn ibm_endpoints_are_checked() {
    let Some(kp) = standin("ibm_endpoints_are_checked") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = key_file(dir.path(), MANAGER_KEY).display().to_string();
    let port = kp.standin.port();
    let good = kp.url();
    let run = |endpoint: &str, iam: &str| {
        let argv = vec![
            python(),
            HELPER.to_string(),
            "--instance".into(),
            INSTANCE.into(),
            "--endpoint".into(),
            endpoint.into(),
            "--iam-endpoint".into(),
            iam.into(),
            "--api-key-file".into(),
            file.clone(),
            "--http-timeout".into(),
            "2".into(),
        ];
        ExecKms::new("kp", argv, Duration::from_secs(30))
            .unwrap()
            .read("osd-kek")
    };
    let cred = format!("http://user:pw-s3cret-x@127.0.0.1:{port}");
    let cases: Vec<(String, String, &str)> = vec![
        ("http://10.9.9.9:80".into(), good.clone(), "https"),
        (good.clone(), "http://10.9.9.9:80".into(), "https"),
        ("http://kms.example.com".into(), good.clone(), "loopback"),
        (cred.clone(), good.clone(), "scheme://host[:port]"),
        (good.clone(), cred.clone(), "scheme://host[:port]"),
        (format!("{good}/api"), good.clone(), "scheme://host[:port]"),
        (
            good.clone(),
            format!("{good}/identity"),
            "scheme://host[:port]",
        ),
        (
            "ftp://127.0.0.1".into(),
            good.clone(),
            "scheme://host[:port]",
        ),
    ];
    for (endpoint, iam, says) in &cases {
        match run(endpoint, iam) {
            Err(e @ keyplan::kms::KmsError::Config { .. }) => {
                // The helper's own message (keyplan quotes the argv before it).
                let full = e.to_string();
                let m = full.split("with \"config\": ").nth(1).unwrap_or(&full);
                assert!(m.contains(says), "{endpoint} / {iam}: {m}");
                assert!(!m.contains("pw-s3cret-x"), "the password is quoted: {m}");
                assert!(!m.contains("user:pw"), "the user is quoted: {m}");
            }
            other => panic!("{endpoint} / {iam}: expected Config, got {other:?}"),
        }
    }
    // No request reached the stand-in; then loopback http works (127.0.0.1 and localhost).
    assert_eq!(kp.standin.log(), "", "a refused endpoint was used");
    let localhost = format!("http://localhost:{port}/");
    for (endpoint, iam) in [(&good, &good), (&localhost, &localhost)] {
        let s = run(endpoint, iam).expect("a loopback endpoint");
        assert!(s.current.is_none());
    }
    assert_ne!(kp.standin.log(), "");
}

/// Opt-in, against a real instance: `KEYPLAN_KP_REAL_INSTANCE_ID=<GUID>`, with
/// `IBMCLOUD_API_KEY` (Manager on the instance) and `KP_ENDPOINT` (the region's endpoint)
/// set, runs the provider contract on keys with the alias prefix `keyplan-test-<pid>-`
/// (docs/kms/ibm-key-protect.md, "Testing against a real instance").
#[test]
fn ibm_real_instance_contract_opt_in() {
    let Ok(instance) = std::env::var("KEYPLAN_KP_REAL_INSTANCE_ID") else {
        eprintln!("skipped: set KEYPLAN_KP_REAL_INSTANCE_ID (with IBMCLOUD_API_KEY and KP_ENDPOINT) to run the contract against a real Key Protect instance");
        return;
    };
    assert!(
        std::env::var("IBMCLOUD_API_KEY").is_ok() && std::env::var("KP_ENDPOINT").is_ok(),
        "KEYPLAN_KP_REAL_INSTANCE_ID needs IBMCLOUD_API_KEY and KP_ENDPOINT too"
    );
    let argv = vec![
        python(),
        HELPER.to_string(),
        "--instance".into(),
        instance,
        "--prefix".into(),
        format!("keyplan-test-{}-", std::process::id()),
    ];
    let kms = ExecKms::new("kp", argv.clone(), Duration::from_secs(120)).unwrap();
    let other = ExecKms::new("kp", argv, Duration::from_secs(120)).unwrap();
    crate::common::kms_contract::run(&kms, &other, "contract");
}
