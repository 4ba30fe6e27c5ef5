//! Moving a key between KMS instances (a plan changes a key's `kms`): copy, read back, verify
//! on every device, destroy in the old KMS, update the records; a rotation asked for during
//! the migration runs right after it, in the same apply. Two file KMSs here; the vault and
//! kubernetes providers run the same engine path in their own tests.

use crate::common::*;

fn plan(kms: &str) -> String {
    format!(
        r#"version: 1
kms:
  old:
    provider: file
    path: keys-old
  new:
    provider: file
    path: keys-new
keys:
  k:
    kms: {kms}
devices:
  a:
    path: a.img
    keys: [k]
    enroll_with: initial.pass
  b:
    path: b.img
    keys: [k]
    enroll_with: initial.pass
  c:
    path: c.img
    keys: [k]
    enroll_with: initial.pass
{FAST_PBKDF}"#
    )
}

/// Current passphrase of `k` in the file KMS rooted at `dir`, read directly.
fn current_in(s: &Scratch, dir: &str) -> Option<Vec<u8>> {
    let meta = s.path(dir).join("k").join("meta.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(meta).ok()?).ok()?;
    let v = json["current"].as_u64()?;
    std::fs::read(s.path(dir).join("k").join(format!("v{v}.key"))).ok()
}

fn material_files(s: &Scratch, dir: &str) -> usize {
    std::fs::read_dir(s.path(dir).join("k"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".key"))
                .count()
        })
        .unwrap_or(0)
}

fn setup() -> (Scratch, Vec<std::path::PathBuf>) {
    let s = Scratch::new();
    s.initial_pass();
    let devs = vec![
        s.small_image("a.img", "luks2"),
        s.small_image("b.img", "luks2"),
        s.small_image("c.img", "luks1"),
    ];
    s.plan("keyplan.yaml", &plan("old"));
    s.ok(&["apply", "--auto-approve"], 0);
    (s, devs)
}

#[test]
fn migrate_between_kms_instances() {
    let (s, devs) = setup();
    let before = current_in(&s, "keys-old").expect("enrolled in old");

    s.plan("keyplan.yaml", &plan("new"));
    let out = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(out.contains("> key k v1 from KMS old"), "{out}");
    assert!(out.contains("1 to move to another KMS"), "{out}");
    // plan wrote nothing
    assert!(current_in(&s, "keys-new").is_none());

    let out = s.ok(&["apply", "--auto-approve"], 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let after = current_in(&s, "keys-new").expect("copied to new");
    assert_eq!(after, before, "the same passphrase moved");
    assert!(current_in(&s, "keys-old").is_none(), "destroyed in old");
    assert_eq!(material_files(&s, "keys-old"), 0, "no material left in old");
    for d in &devs {
        assert!(
            opens(d, &after, None),
            "{} opens with the new KMS's key",
            d.display()
        );
    }
    // LUKS2 tokens now name the new KMS.
    for d in &devs[..2] {
        let json = luks2_json(d);
        let toks: Vec<_> = json["tokens"]
            .as_object()
            .unwrap()
            .values()
            .cloned()
            .collect();
        assert_eq!(toks.len(), 1, "{toks:?}");
        assert_eq!(toks[0]["kms"], "new", "{toks:?}");
    }
    s.ok(&["plan", "--detailed-exitcode"], 0);
    assert_eq!(s.key_get("k", None), after);
}

#[test]
fn migrate_and_rotate_in_one_apply() {
    let (s, devs) = setup();
    let before = current_in(&s, "keys-old").unwrap();
    s.plan("keyplan.yaml", &plan("new"));
    let out = s.ok(&["plan", "--rotate", "k"], 0);
    assert!(out.contains("rotated right after its migration"), "{out}");
    let out = s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    assert!(
        out.contains("The migration is done; planning again"),
        "{out}"
    );
    let now = current_in(&s, "keys-new").unwrap();
    assert_ne!(now, before, "rotated");
    assert!(current_in(&s, "keys-old").is_none());
    for d in &devs {
        assert!(opens(d, &now, None));
        assert!(
            !opens(d, &before, None),
            "old version killed on {}",
            d.display()
        );
    }
    s.ok(&["plan", "--detailed-exitcode"], 0);
}

#[test]
fn old_kms_must_stay_in_the_plan_during_migration() {
    let (s, devs) = setup();
    let snap = Snapshot::take(&devs);
    let text = plan("new").replace("  old:\n    provider: file\n    path: keys-old\n", "");
    s.plan("keyplan.yaml", &text);
    let out = s.keyplan(&["apply", "--auto-approve"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no longer in the plan"), "{err}");
    assert!(err.contains("keep the definition of KMS \"old\""), "{err}");
    snap.assert_unchanged("refused migration");
    assert!(current_in(&s, "keys-old").is_some());
    // Break-glass will not hand out what KMS new holds under that name without knowing it is k.
    file_kms_put_in(&s.path("keys-new"), "k", b"a passphrase another tool keeps");
    let out = s.keyplan(&["key", "get", "k"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty(), "key get handed out the other entry");
    assert!(
        err.contains("Restore the definition of KMS \"old\""),
        "{err}"
    );
}

#[test]
fn interrupted_migration_converges() {
    // Crash before each step's effect in turn; every time the old or the new KMS's current
    // version opens every device, and the next apply finishes.
    let (s, devs) = setup();
    let key = current_in(&s, "keys-old").unwrap();
    s.plan("keyplan.yaml", &plan("new"));
    let out = s.ok(&["plan", "--json"], 0);
    let steps = serde_json::from_str::<serde_json::Value>(&out).unwrap()["steps"]
        .as_array()
        .unwrap()
        .len();
    assert!(steps >= 8, "{out}");
    let base = s.path("");
    let copy = tempfile::tempdir().unwrap();
    // Work on a fresh copy per crash point.
    for n in 0..steps {
        let dir = copy.path().join(format!("crash{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", base.display()))
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success());
        let out = keyplan_command()
            .current_dir(&dir)
            .args(["apply", "--auto-approve"])
            .env("FAILPOINTS", format!("step.before_effect={n}*off->return"))
            .output()
            .unwrap();
        if cfg!(feature = "failpoints") {
            assert!(!out.status.success(), "crash point {n} did not fire");
        }
        // I1: whichever KMS holds the key now, its current version opens every device.
        let holder = [("keys-new"), ("keys-old")]
            .iter()
            .find_map(|d| {
                let meta = dir.join(d).join("k").join("meta.json");
                let json: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(meta).ok()?).ok()?;
                let v = json["current"].as_u64()?;
                std::fs::read(dir.join(d).join("k").join(format!("v{v}.key"))).ok()
            })
            .expect("some KMS holds the key");
        assert_eq!(holder, key);
        for d in &devs {
            let p = dir.join(d.file_name().unwrap());
            assert!(
                opens(&p, &key, None),
                "crash {n}: {} locked out",
                p.display()
            );
        }
        // Break-glass in between reads the key where its versions are, whichever KMS that is.
        let out = keyplan_in(&dir, &["key", "get", "k"]);
        assert!(
            out.status.success(),
            "crash {n}: key get: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            out.stdout, key,
            "crash {n}: key get handed out another passphrase"
        );
        let out = keyplan_in(&dir, &["apply", "--auto-approve"]);
        assert!(
            out.status.success(),
            "crash {n}: resume failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = keyplan_in(&dir, &["plan", "--detailed-exitcode"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "crash {n}: not converged: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let meta = dir.join("keys-old").join("k").join("meta.json");
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(meta).unwrap()).unwrap();
        assert!(
            json["current"].is_null(),
            "crash {n}: old KMS still holds the key"
        );
    }
}

/// Every device opens with `pass` (`cryptsetup open --test-passphrase`).
fn all_open(devs: &[std::path::PathBuf], pass: &[u8], what: &str) {
    for d in devs {
        assert!(
            opens(d, pass, None),
            "{what}: {} does not open",
            d.display()
        );
    }
}

#[test]
fn a_move_into_an_occupied_kms_is_refused_by_plan() {
    // Found by a new-user trial: moving k into a KMS that already holds an entry of that name
    // (another tool's) was planned, failed half-way in apply, and `key get k` printed the
    // other tool's passphrase. Refused up front now; `key get` reads where k's versions are.
    let (s, devs) = setup();
    let ours = current_in(&s, "keys-old").expect("enrolled in old");
    let foreign = b"a passphrase another tool keeps".to_vec();
    file_kms_put_in(&s.path("keys-new"), "k", &foreign);
    s.plan("keyplan.yaml", &plan("new"));
    let snap = Snapshot::take(&devs);
    for cmd in [&["plan"][..], &["apply", "--auto-approve"]] {
        let out = s.keyplan(cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd:?} must refuse: {err}");
        assert!(err.contains("already holds an entry \"k\""), "{err}");
        assert!(err.contains("Nothing was changed"), "{err}");
        assert!(err.contains("`name:`"), "{err}");
        assert!(err.contains("remove or rename that entry"), "{err}");
        assert!(
            !err.contains("another tool keeps"),
            "material in a message: {err}"
        );
    }
    snap.assert_unchanged("refused move");
    assert_eq!(
        current_in(&s, "keys-new"),
        Some(foreign.clone()),
        "foreign entry touched"
    );
    assert_eq!(
        current_in(&s, "keys-old"),
        Some(ours.clone()),
        "origin touched"
    );
    all_open(&devs, &ours, "after the refusal");

    // Between editing `kms:` and applying, break-glass reads k where its versions are.
    for version in [None, Some(1)] {
        let got = s.key_get("k", version);
        assert_ne!(
            got, foreign,
            "key get {version:?} handed out the foreign entry"
        );
        assert_eq!(got, ours, "key get {version:?}");
        all_open(&devs, &got, "key get's output");
    }

    // The way on the refusal names: another name in that KMS.
    let renamed = plan("new").replace("    kms: new\n", "    kms: new\n    name: k-moved\n");
    s.plan("keyplan.yaml", &renamed);
    let out = s.ok(&["apply", "--auto-approve"], 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let moved = std::fs::read(s.path("keys-new").join("k-moved").join("v1.key"))
        .expect("k moved as k-moved");
    assert_eq!(moved, ours);
    assert_eq!(
        current_in(&s, "keys-new"),
        Some(foreign.clone()),
        "foreign entry touched"
    );
    all_open(&devs, &ours, "after the move");
    assert_eq!(s.key_get("k", None), ours);
    s.ok(&["plan", "--detailed-exitcode"], 0);
}

#[test]
fn key_get_reads_the_origin_until_the_move_is_applied() {
    let (s, devs) = setup();
    let ours = current_in(&s, "keys-old").expect("enrolled in old");
    s.plan("keyplan.yaml", &plan("new"));
    let got = s.key_get("k", None);
    assert_eq!(got, ours);
    assert_eq!(s.key_get("k", Some(1)), ours);
    all_open(&devs, &got, "key get's output");
    assert!(
        current_in(&s, "keys-new").is_none(),
        "key get wrote nothing"
    );
}

#[cfg(feature = "failpoints")]
#[test]
fn resume_refuses_a_plan_that_changed_the_destination() {
    // Found by a new-user trial: a migration interrupted after its copy, then the plan put
    // back to the old KMS. Resuming towards the plan's KMS would "copy" the key onto itself and
    // destroy the only copy. The journaled destination wins: resume is refused.
    let (s, devs) = setup();
    let key = current_in(&s, "keys-old").unwrap();
    s.plan("keyplan.yaml", &plan("new"));
    let out = keyplan_command()
        .current_dir(s.path(""))
        .args(["apply", "--auto-approve"])
        .env("FAILPOINTS", "step.before_effect=1*off->return")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(
        current_in(&s, "keys-new").as_deref(),
        Some(&key[..]),
        "copy done"
    );

    s.plan("keyplan.yaml", &plan("old"));
    for args in [&["apply", "--auto-approve"][..], &["plan"][..]] {
        let out = s.keyplan(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if args[0] == "apply" {
            assert_eq!(out.status.code(), Some(1), "{text}");
            assert!(text.contains("refusing to resume"), "{text}");
            assert!(text.contains("moves key k to KMS \"new\""), "{text}");
        }
    }
    assert_eq!(
        current_in(&s, "keys-old").as_deref(),
        Some(&key[..]),
        "old KMS kept"
    );
    for d in &devs {
        assert!(opens(d, &key, None));
    }
    // Putting the destination back finishes the move.
    s.plan("keyplan.yaml", &plan("new"));
    s.ok(&["apply", "--auto-approve"], 0);
    assert!(current_in(&s, "keys-old").is_none());
    assert_eq!(current_in(&s, "keys-new").as_deref(), Some(&key[..]));
    s.ok(&["plan", "--detailed-exitcode"], 0);
}

/// Issue 32: a key renamed in the plan (its id changes, its KMS instance and `name` stay) is a
/// rename: the records are rewritten to the new id, with no PBKDF run, no new keyslot and no
/// KMS write (the holder record stays); afterwards the key rotates under its new id.
#[test]
fn a_renamed_key_keeps_its_keyslots_records_and_holder_record() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.small_image("a.img", "luks2");
    let b = s.small_image("b.img", "luks1");
    let plan = |id: &str, entry: &str| {
        format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  {id}: {entry}\ndevices:\n  a:\n    path: a.img\n    keys: [{id}]\n    enroll_with: initial.pass\n  b:\n    path: b.img\n    keys: [{id}]\n    enroll_with: initial.pass\n{FAST_PBKDF}"
        )
    };
    s.plan("keyplan.yaml", &plan("osd", "{ kms: local }"));
    s.ok(&["apply", "--auto-approve"], 0);
    let (slots_a, slots_b) = (keyslots(&a), keyslots(&b));
    let kms_files = || -> Vec<(std::path::PathBuf, Vec<u8>)> {
        walk(&s.path("keys"))
            .into_iter()
            .filter(|p| p.is_file())
            .map(|p| {
                let bytes = std::fs::read(&p).expect("read KMS file");
                (p, bytes)
            })
            .collect()
    };
    let before = kms_files();
    let meta = String::from_utf8(
        before
            .iter()
            .find(|(p, _)| p.ends_with("meta.json"))
            .expect("meta.json")
            .1
            .clone(),
    )
    .expect("utf-8");
    assert!(meta.contains("holders"), "this plan holds the key: {meta}");

    s.plan(
        "keyplan.yaml",
        &plan("osd-data", "{ kms: local, name: osd }"),
    );
    let shown = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert_eq!(
        shown
            .matches("(renamed: key osd is osd-data in the plan now (the same key \"osd\" in KMS local); the record is rewritten, no PBKDF)")
            .count(),
        2,
        "{shown}"
    );
    assert!(
        shown.contains("Plan: 0 to add, 0 to remove, 0 keys to rotate, 2 records to rename."),
        "{shown}"
    );
    assert!(
        !shown.contains("holder record"),
        "the holder record stays: {shown}"
    );
    let status = s.ok(&["status"], 1);
    assert_eq!(
        status
            .matches("key_renamed: `keyplan apply` would rewrite the record of keyslot")
            .count(),
        2,
        "{status}"
    );

    let applied = s.ok(&["apply", "--auto-approve"], 0);
    assert!(applied.contains("0 PBKDF runs"), "{applied}");
    assert_eq!(
        (keyslots(&a), keyslots(&b)),
        (slots_a, slots_b),
        "no keyslot added or killed"
    );
    assert_eq!(kms_files(), before, "no KMS write");
    let tokens = luks2_json(&a)["tokens"].clone();
    assert!(
        tokens
            .as_object()
            .expect("tokens")
            .values()
            .any(|t| t["type"] == "keyplan" && t["key"] == "osd-data"),
        "{tokens}"
    );
    let luks1: Vec<String> = walk(&s.path(".keyplan"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("luks1") && p.is_file())
        .map(|p| std::fs::read_to_string(p).expect("read"))
        .collect();
    assert!(luks1.iter().any(|r| r.contains("osd-data")), "{luks1:?}");
    let again = s.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(again.contains("No changes"), "{again}");
    s.ok(&["status"], 0);

    let v1 = s.key_get("osd-data", None);
    s.ok(&["apply", "--auto-approve", "--rotate", "osd-data"], 0);
    let v2 = s.key_get("osd-data", None);
    assert_ne!(v1, v2);
    assert!(opens(&a, &v2, None) && opens(&b, &v2, None));
    assert!(
        !opens(&a, &v1, None) && !opens(&b, &v1, None),
        "v1 rotated out"
    );
}

/// A renamed key keeps its KMS entry's holder record even when another device drops the key
/// (its record there names the old id), and an old id reused for a new key is a new key: the
/// records follow the KMS entry they name, so nothing is moved or destroyed (found by a trial
/// as a new user: before, the first released the renamed key's holder record and the second
/// destroyed the renamed key's KMS entry as a "migration").
#[test]
fn a_rename_follows_the_kms_entry_not_the_id() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.small_image("a.img", "luks2");
    let b = s.small_image("b.img", "luks2");
    let plan = |keys: &str, a_keys: &str, b_keys: &str| {
        format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n{keys}devices:\n  a:\n    path: a.img\n    keys: [{a_keys}]\n    enroll_with: initial.pass\n  b:\n    path: b.img\n    keys: [{b_keys}]\n    enroll_with: initial.pass\n{FAST_PBKDF}"
        )
    };
    s.plan(
        "keyplan.yaml",
        &plan(
            "  osd: { kms: local }\n  db: { kms: local }\n",
            "osd, db",
            "osd",
        ),
    );
    s.ok(&["apply", "--auto-approve"], 0);
    let v1 = s.key_get("osd", None);
    let meta = || std::fs::read_to_string(s.path("keys/osd/meta.json")).expect("meta.json");
    assert!(meta().contains("holders"), "{}", meta());

    // Renamed on a; b drops it.
    s.plan(
        "keyplan.yaml",
        &plan(
            "  osd-data: { kms: local, name: osd }\n  db: { kms: local }\n",
            "osd-data, db",
            "db",
        ),
    );
    let shown = s.ok(&["plan"], 0);
    assert!(!shown.contains("holder record"), "{shown}");
    assert!(shown.contains("renamed: key osd is osd-data"), "{shown}");
    s.ok(&["apply", "--auto-approve"], 0);
    assert!(
        meta().contains(".keyplan"),
        "the holder record stays: {}",
        meta()
    );
    let again = s.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(again.contains("No changes"), "{again}");
    assert!(opens(&a, &v1, None) && !opens(&b, &v1, None));

    // The old id comes back for a new key with another name: a new key, nothing moved.
    s.plan(
        "keyplan.yaml",
        &plan(
            "  osd-data: { kms: local, name: osd }\n  osd: { kms: local, name: osd-meta }\n  db: { kms: local }\n",
            "osd-data, osd, db",
            "db, osd",
        ),
    );
    let shown = s.ok(&["plan"], 0);
    assert!(
        !shown.contains("destroy") && !shown.contains("moved"),
        "{shown}"
    );
    s.ok(&["apply", "--auto-approve"], 0);
    assert_eq!(
        s.key_get("osd-data", None),
        v1,
        "the renamed key is untouched"
    );
    let meta_key = s.key_get("osd", None);
    assert_ne!(meta_key, v1);
    assert!(opens(&a, &v1, None) && opens(&a, &meta_key, None) && opens(&b, &meta_key, None));
    let again = s.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(again.contains("No changes"), "{again}");
}

/// Two keys that swap their KMS names are two renames: each keyslot's record follows the
/// entry it holds a version of, nothing is moved, destroyed or derived.
#[test]
fn swapped_key_names_are_two_renames() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.small_image("a.img", "luks2");
    let plan = |osd: &str, db: &str| {
        format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  osd: {osd}\n  db: {db}\ndevices:\n  a:\n    path: a.img\n    keys: [osd, db]\n    enroll_with: initial.pass\n{FAST_PBKDF}"
        )
    };
    s.plan("keyplan.yaml", &plan("{ kms: local }", "{ kms: local }"));
    s.ok(&["apply", "--auto-approve"], 0);
    let (osd, db) = (s.key_get("osd", None), s.key_get("db", None));
    s.plan(
        "keyplan.yaml",
        &plan("{ kms: local, name: db }", "{ kms: local, name: osd }"),
    );
    let shown = s.ok(&["plan"], 0);
    assert_eq!(shown.matches("(renamed: key ").count(), 2, "{shown}");
    assert!(!shown.contains("destroy"), "{shown}");
    let applied = s.ok(&["apply", "--auto-approve"], 0);
    assert!(applied.contains("0 PBKDF runs"), "{applied}");
    assert_eq!(
        (s.key_get("osd", None), s.key_get("db", None)),
        (db.clone(), osd.clone())
    );
    assert!(opens(&a, &osd, None) && opens(&a, &db, None));
    let again = s.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(again.contains("No changes"), "{again}");
}
