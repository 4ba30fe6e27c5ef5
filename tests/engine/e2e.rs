//! End-to-end tests: the keyplan binary against real cryptsetup on LUKS image files, with the
//! file KMS. Every assertion is checked with cryptsetup directly.

use crate::common::*;

fn three_device_plan(extra_key: &str) -> String {
    format!(
        r#"version: 1
kms:
  local:
    provider: file
    path: keys
keys:
  osd-kek:
    kms: local
    rotate_after: 30d
{extra_key}devices:
  block:
    path: block.img
    keys: [osd-kek]
    enroll_with: initial.pass
  db:
    path: db.img
    keys: [osd-kek]
    enroll_with: initial.pass
  wal:
    path: wal.img
    keys: [osd-kek]
    enroll_with: initial.pass
{FAST_PBKDF}"#
    )
}

fn setup_three(s: &Scratch) -> Vec<std::path::PathBuf> {
    s.initial_pass();
    s.plan("keyplan.yaml", &three_device_plan(""));
    ["block", "db", "wal"]
        .iter()
        .map(|n| s.image(&format!("{n}.img"), "luks2"))
        .collect()
}

#[test]
fn enroll_then_idempotent() {
    let s = Scratch::new();
    let devs = setup_three(&s);
    let out = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(out.contains("+ key osd-kek v1"), "{out}");
    assert!(out.contains("+ keyslot 1  osd-kek v1"), "{out}");
    assert!(
        out.contains("Plan: 3 to add, 0 to remove, 0 keys to rotate."),
        "{out}"
    );
    // plan wrote nothing: no KMS dir, no state dir
    assert!(!s.path("keys").exists());
    assert!(!s.path(".keyplan").exists());

    let out = s.ok(&["apply", "--auto-approve"], 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let key = s.key_get("osd-kek", None);
    assert_eq!(key.len(), 44, "32 random bytes as base64");
    for d in &devs {
        assert!(
            opens(d, &key, Some(1)),
            "key opens keyslot 1 of {}",
            d.display()
        );
        assert!(bound(d, 1));
        assert!(opens(d, INITIAL, Some(0)), "unmanaged keyslot 0 kept");
        // the token records key, version and salt
        let json = luks2_json(d);
        let tok = json["tokens"]
            .as_object()
            .unwrap()
            .values()
            .next()
            .unwrap()
            .clone();
        assert_eq!(tok["type"], "keyplan");
        assert_eq!(tok["key"], "osd-kek");
        assert_eq!(tok["version"], 1);
        assert_eq!(tok["salt"], json["keyslots"]["1"]["kdf"]["salt"]);
    }
    // No changes; the initial keyslots, kept, are listed as keyplan's to leave alone.
    let shown = s.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(
        shown
            .trim()
            .ends_with("\n\nNo changes. Devices and KMS match the plan."),
        "{shown}"
    );
    assert!(
        shown.starts_with("Keyslots keyplan does not manage (left as they are):\n"),
        "{shown}"
    );
    for d in &devs {
        assert!(
            shown.contains(&format!("({}): keyslot 0 (pbkdf2)\n", d.display())),
            "{shown}"
        );
    }
    let out = s.ok(&["apply", "--auto-approve"], 0);
    assert!(out.contains("No changes."), "{out}");
    let out = s.ok(&["verify"], 0);
    assert_eq!(out.matches("ok ").count(), 3, "{out}");
}

#[test]
fn rotate_shared_key_across_three_devices() {
    let s = Scratch::new();
    let devs = setup_three(&s);
    s.ok(&["apply", "--auto-approve"], 0);
    let old = s.key_get("osd-kek", None);
    let out = s.ok(&["plan", "--rotate", "osd-kek", "--detailed-exitcode"], 2);
    assert!(out.contains("~ key osd-kek v1 -> v2"), "{out}");
    assert!(out.contains("(--rotate)"), "{out}");
    assert!(
        out.contains("Plan: 3 to add, 3 to remove, 1 keys to rotate."),
        "{out}"
    );
    let out = s.ok(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    // 3 devices x (unlock + derive + verify) = 9 PBKDF runs
    assert!(out.contains("9 PBKDF runs"), "{out}");
    let new = s.key_get("osd-kek", None);
    assert_ne!(old, new);
    for d in &devs {
        assert!(opens(d, &new, None), "new key opens {}", d.display());
        assert!(
            !opens(d, &old, None),
            "old key opens nothing on {}",
            d.display()
        );
        assert!(opens(d, INITIAL, Some(0)));
        assert_eq!(keyslots(d), vec![0, 2]);
    }
    // the old version is kept as `previous` (it opens nothing any more), the new one current
    assert_eq!(s.key_get("osd-kek", Some(1)), old);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.path("keys/osd-kek/meta.json")).unwrap()).unwrap();
    assert_eq!(meta["current"], 2);
    assert_eq!(meta["pending"], serde_json::Value::Null);
    assert_eq!(meta["versions"][0]["state"], "previous");
    s.ok(&["plan", "--detailed-exitcode"], 0);
    // rotate again: goes back into keyslot 1; v1 is destroyed, v2 becomes previous
    let out = s.ok(&["plan", "--rotate", "osd-kek"], 0);
    assert!(out.contains("- key osd-kek v1"), "{out}");
    assert!(out.contains("destroyed"), "{out}");
    s.ok(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    let newer = s.key_get("osd-kek", None);
    for d in &devs {
        assert!(opens(d, &newer, Some(1)));
        assert!(!opens(d, &new, None));
    }
    assert!(!s.path("keys/osd-kek/v1.key").exists());
    let out = s.ok(&["key", "get", "osd-kek", "--version", "1"], 1);
    assert!(out.contains("was retired"), "{out}");
    assert_eq!(s.key_get("osd-kek", Some(2)), new);
}

#[test]
fn rotate_after_exceeded_is_planned() {
    let s = Scratch::new();
    setup_three(&s);
    s.ok(&["apply", "--auto-approve"], 0);
    let meta_path = s.path("keys/osd-kek/meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    meta["versions"][0]["created_at"] = serde_json::json!(now - 41 * 86_400);
    std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    let out = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(
        out.contains("rotate_after exceeded: age 41d > 30d"),
        "{out}"
    );
    s.ok(&["apply", "--auto-approve"], 0);
    s.ok(&["plan", "--detailed-exitcode"], 0);
}

#[test]
fn luks1_and_luks2_mixed_with_unmanaged_remove() {
    let s = Scratch::new();
    s.initial_pass();
    let l1 = s.image("old.img", "luks1");
    let l2 = s.image("new.img", "luks2");
    s.plan(
        "keyplan.yaml",
        &format!(
            r#"version: 1
kms:
  local: {{ provider: file, path: keys }}
keys:
  k: {{ kms: local }}
devices:
  old: {{ path: old.img, keys: [k], enroll_with: initial.pass, unmanaged_keyslots: remove }}
  new: {{ path: new.img, keys: [k], enroll_with: initial.pass, unmanaged_keyslots: remove }}
{FAST_PBKDF}"#
        ),
    );
    let out = s.ok(&["plan"], 0);
    assert!(out.contains("- keyslot 0  unmanaged"), "{out}");
    s.ok(&["apply", "--auto-approve"], 0);
    let key = s.key_get("k", None);
    for d in [&l1, &l2] {
        assert!(opens(d, &key, None));
        assert!(
            !opens(d, INITIAL, None),
            "initial keyslot removed on {}",
            d.display()
        );
        assert_eq!(keyslots(d), vec![1]);
    }
    // LUKS1 records live in the state directory
    let recs: Vec<_> = std::fs::read_dir(s.path(".keyplan/luks1"))
        .unwrap()
        .collect();
    assert_eq!(recs.len(), 1);
    s.ok(&["plan", "--detailed-exitcode"], 0);
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let new = s.key_get("k", None);
    for d in [&l1, &l2] {
        assert!(opens(d, &new, None));
        assert!(!opens(d, &key, None));
        assert_eq!(keyslots(d).len(), 1);
    }
    s.ok(&["plan", "--detailed-exitcode"], 0);
}

#[test]
fn yaml_and_toml_give_the_same_plan() {
    let s = Scratch::new();
    setup_three(&s);
    let yaml = s.ok(&["plan", "-f", "keyplan.yaml"], 0);
    s.plan(
        "keyplan.toml",
        r#"version = 1
[kms.local]
provider = "file"
path = "keys"
[keys.osd-kek]
kms = "local"
rotate_after = "30d"
[devices.block]
path = "block.img"
keys = ["osd-kek"]
enroll_with = "initial.pass"
[devices.db]
path = "db.img"
keys = ["osd-kek"]
enroll_with = "initial.pass"
[devices.wal]
path = "wal.img"
keys = ["osd-kek"]
enroll_with = "initial.pass"
[settings]
pbkdf = { type = "pbkdf2", iterations = 1000 }
parallelism = 4
"#,
    );
    let toml = s.ok(&["plan", "-f", "keyplan.toml"], 0);
    assert_eq!(yaml, toml);
}

#[test]
fn apply_without_tty_refuses_and_changes_nothing() {
    let s = Scratch::new();
    let devs = setup_three(&s);
    let out = s.ok(&["apply"], 1);
    assert!(out.contains("refusing to apply"), "{out}");
    assert!(!s.path("keys").exists());
    for d in &devs {
        assert_eq!(keyslots(d), vec![0]);
    }
}

#[test]
fn pinned_keyslot_survives_rotation() {
    let s = Scratch::new();
    s.initial_pass();
    let d = s.image("d.img", "luks2");
    s.plan(
        "keyplan.yaml",
        &one_key_plan("  d:\n    path: d.img\n    keys:\n      - { key: k, keyslot: 5 }\n    enroll_with: initial.pass"),
    );
    s.ok(&["apply", "--auto-approve"], 0);
    let k1 = s.key_get("k", None);
    assert!(opens(&d, &k1, Some(5)));
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let k2 = s.key_get("k", None);
    assert!(
        opens(&d, &k2, Some(5)),
        "new version back in pinned keyslot 5"
    );
    assert!(!opens(&d, &k1, None));
    assert_eq!(keyslots(&d), vec![0, 5]);
    s.ok(&["plan", "--detailed-exitcode"], 0);
}

#[test]
fn drift_keyslot_killed_or_rewritten_outside_keyplan() {
    let s = Scratch::new();
    let devs = setup_three(&s);
    s.ok(&["apply", "--auto-approve"], 0);
    let key = s.key_get("osd-kek", None);
    // kill keyslot 1 of block by hand
    let st = std::process::Command::new("cryptsetup")
        .args(["luksKillSlot", "--batch-mode"])
        .arg(&devs[0])
        .arg("1")
        .status()
        .unwrap();
    assert!(st.success());
    // rewrite keyslot 1 of db by hand (new passphrase, same slot number, new salt)
    let st = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf 'other' > {dir}/o.pass && cryptsetup luksKillSlot --batch-mode {db} 1 && cryptsetup luksAddKey --batch-mode --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-slot 0 --new-key-slot 1 --key-file {dir}/initial.pass --new-keyfile {dir}/o.pass {db}",
            dir = s.dir.path().display(),
            db = devs[1].display()
        ))
        .status()
        .unwrap();
    assert!(st.success());
    let out = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(
        out.contains("drift: keyslot 1 removed outside keyplan"),
        "{out}"
    );
    assert!(
        out.contains("drift: keyslot 1 rewritten outside keyplan"),
        "{out}"
    );
    s.ok(&["apply", "--auto-approve"], 0);
    for d in &devs {
        assert!(opens(d, &key, None), "re-enrolled on {}", d.display());
    }
    s.ok(&["plan", "--detailed-exitcode"], 0);
    // the rewritten keyslot is now unmanaged and kept
    assert!(opens(&devs[1], b"other", Some(1)));
}

#[test]
fn second_apply_is_refused_while_locked() {
    let s = Scratch::new();
    setup_three(&s);
    std::fs::create_dir_all(s.path(".keyplan")).unwrap();
    let _lock = keyplan::journal::StateLock::acquire(&s.path(".keyplan")).unwrap();
    let out = s.ok(&["apply", "--auto-approve"], 1);
    assert!(out.contains("another keyplan run holds the lock"), "{out}");
    let out = s.ok(&["plan"], 1);
    assert!(out.contains("a keyplan run is in progress"), "{out}");
    assert!(
        out.contains(&format!("pid {}", std::process::id())),
        "{out}"
    );
    assert!(!s.path("keys").exists());
}

#[test]
fn unmanaged_remove_refuses_without_a_managed_key() {
    let s = Scratch::new();
    let d = s.image("d.img", "luks2");
    s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\ndevices:\n  d: {{ path: d.img, unmanaged_keyslots: remove }}\n{FAST_PBKDF}"
        ),
    );
    let out = s.ok(&["plan"], 1);
    assert!(out.contains("could lock you out"), "{out}");
    assert_eq!(keyslots(&d), vec![0]);
}

#[test]
fn luks1_keyslot_out_of_range_points_at_plan_line() {
    let s = Scratch::new();
    s.initial_pass();
    s.image("old.img", "luks1");
    s.plan(
        "keyplan.yaml",
        &one_key_plan("  old:\n    path: old.img\n    keys:\n      - { key: k, keyslot: 9 }\n    enroll_with: initial.pass"),
    );
    let out = s.ok(&["plan"], 1);
    assert!(out.contains("keyslot 9 is out of range"), "{out}");
    assert!(out.contains("keyplan.yaml:10:"), "{out}");
}

#[test]
fn same_device_twice_by_uuid_is_refused() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.image("a.img", "luks2");
    std::fs::copy(&a, s.path("b.img")).unwrap();
    s.plan(
        "keyplan.yaml",
        &one_key_plan("  a: { path: a.img, keys: [k], enroll_with: initial.pass }\n  b: { path: b.img, keys: [k], enroll_with: initial.pass }"),
    );
    let out = s.ok(&["plan"], 1);
    assert!(out.contains("are the same LUKS device"), "{out}");
}

#[test]
fn full_keyslot_table_is_refused() {
    let s = Scratch::new();
    s.initial_pass();
    let d = s.image("full.img", "luks1");
    for slot in 1..8 {
        let st = std::process::Command::new("cryptsetup")
            .args([
                "luksAddKey",
                "--batch-mode",
                "--pbkdf-force-iterations",
                "1000",
                "--key-slot",
                "0",
                "--new-key-slot",
                &slot.to_string(),
                "--key-file",
            ])
            .arg(s.path("initial.pass"))
            .arg(&d)
            .arg(s.path("initial.pass"))
            .status()
            .unwrap();
        assert!(st.success());
    }
    s.plan(
        "keyplan.yaml",
        &one_key_plan("  full: { path: full.img, keys: [k], enroll_with: initial.pass }"),
    );
    let out = s.ok(&["plan"], 1);
    assert!(out.contains("no free keyslot"), "{out}");
    assert_eq!(keyslots(&d).len(), 8);
}

#[test]
fn key_enrolled_via_another_managed_key() {
    let s = Scratch::new();
    let devs = setup_three(&s);
    s.ok(&["apply", "--auto-approve"], 0);
    // add a second key to the plan; no enroll_with needed: osd-kek opens the devices.
    let plan = three_device_plan("  backup-kek:\n    kms: local\n").replace(
        "keys: [osd-kek]\n    enroll_with: initial.pass",
        "keys: [osd-kek, backup-kek]",
    );
    s.plan("keyplan.yaml", &plan);
    let out = s.ok(&["plan"], 0);
    assert!(out.contains("+ key backup-kek v1"), "{out}");
    s.ok(&["apply", "--auto-approve"], 0);
    let b = s.key_get("backup-kek", None);
    for d in &devs {
        assert!(opens(d, &b, Some(2)));
    }
    s.ok(&["plan", "--detailed-exitcode"], 0);
    // removing backup-kek from the devices removes its keyslots
    s.plan(
        "keyplan.yaml",
        &three_device_plan("  backup-kek:\n    kms: local\n"),
    );
    let out = s.ok(&["plan"], 0);
    assert!(
        out.contains("key backup-kek is no longer listed for this device"),
        "{out}"
    );
    s.ok(&["apply", "--auto-approve"], 0);
    for d in &devs {
        assert!(!opens(d, &b, None));
        assert_eq!(keyslots(d), vec![0, 1]);
    }
}

/// The cryptsetup project's own images (LUKS1 and LUKS2). Both carry the same LUKS UUID, so
/// each gets its own plan (one plan refuses two devices with one UUID).
#[test]
fn cryptsetup_project_images() {
    for (name, extra) in [
        ("compatimage", None),
        ("compatimage2", Some((1, &b"0123456789abcdef"[..]))),
    ] {
        let s = Scratch::new();
        let Some(img) = shared_image(name, s.dir.path()) else {
            return;
        };
        std::fs::write(s.path("compat.pass"), b"compatkey").unwrap();
        s.plan(
            "keyplan.yaml",
            &one_key_plan(&format!(
                "  d: {{ path: {name}.img, keys: [k], enroll_with: compat.pass }}"
            )),
        );
        s.ok(&["apply", "--auto-approve"], 0);
        let k1 = s.key_get("k", None);
        assert!(opens(&img, &k1, None), "{name}");
        assert!(
            opens(&img, b"compatkey", Some(0)),
            "original keyslot kept on {name}"
        );
        if let Some((slot, pass)) = extra {
            assert!(opens(&img, pass, Some(slot)));
        }
        s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
        let k2 = s.key_get("k", None);
        assert!(opens(&img, &k2, None));
        assert!(!opens(&img, &k1, None));
        s.ok(&["verify"], 0);
        s.ok(&["plan", "--detailed-exitcode"], 0);
    }
}

/// A cryptsetup wrapper that kills keyplan (SIGKILL) right after the first luksAddKey
/// succeeded: the keyslot exists but keyplan never recorded it. The next apply must finish
/// the interrupted run, adopt the keyslot after testing it, and converge.
#[test]
fn resume_after_kill_during_add() {
    let s = Scratch::new();
    let devs = setup_three(&s);
    let wrapper = script(
        s.dir.path(),
        "cryptsetup-crash",
        &format!(
            "#!/bin/sh\ncryptsetup \"$@\"\nrc=$?\ncase \" $* \" in *' luksAddKey '*) if [ ! -e {m} ]; then touch {m}; kill -9 $PPID; fi;; esac\nexit $rc\n",
            m = s.path("crashed").display()
        ),
    );
    let out = assert_cmd::Command::from_std(keyplan_command())
        .current_dir(s.dir.path())
        .env("KEYPLAN_CRYPTSETUP", &wrapper)
        .args(["apply", "--auto-approve", "--parallelism", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "killed");
    assert!(s.path("crashed").exists());
    // I1: the KMS has no current version yet; the initial passphrase still opens every device.
    for d in &devs {
        assert!(opens(d, INITIAL, Some(0)));
    }
    let out = s.ok(&["plan"], 0);
    assert!(out.contains("was interrupted"), "{out}");
    // without a terminal and without --auto-approve, even the resume is refused
    let out = s.ok(&["apply"], 1);
    assert!(out.contains("refusing to apply"), "{out}");
    let out = s.ok(&["apply", "--auto-approve"], 0);
    assert!(out.contains("finishes it first"), "{out}");
    assert!(out.contains("(was under way)"), "{out}");
    assert!(out.contains("Interrupted run"), "{out}");
    assert!(out.contains("adopted keyslot 1"), "{out}");
    let key = s.key_get("osd-kek", None);
    for d in &devs {
        assert!(opens(d, &key, Some(1)));
        assert_eq!(
            keyslots(d),
            vec![0, 1],
            "no orphan keyslot on {}",
            d.display()
        );
    }
    s.ok(&["plan", "--detailed-exitcode"], 0);
    let journal = s.ok(&["journal"], 0);
    assert!(journal.contains("run resumed"), "{journal}");
}

#[test]
fn key_get_refuses_unknown_key_and_no_current() {
    let s = Scratch::new();
    setup_three(&s);
    let out = s.ok(&["key", "get", "nope"], 1);
    assert!(out.contains("no key"), "{out}");
    let out = s.ok(&["key", "get", "osd-kek"], 1);
    assert!(out.contains("no current version"), "{out}");
}
