//! Integration tests of the cryptsetup driver (`keyplan::luks`) against the real cryptsetup 2.6
//! on image files, plus the cryptsetup project's own compatibility images from
//! `../shared/testdata/cryptsetup` (or `$KEYPLAN_TESTDATA`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use keyplan::luks::*;
use keyplan::secret::Passphrase;
use keyplan::spec::{PbkdfSettings, PbkdfType};

fn fast() -> PbkdfSettings {
    PbkdfSettings {
        kind: PbkdfType::Pbkdf2,
        iterations: Some(1000),
        memory_kib: None,
        parallel: None,
        iter_time_ms: None,
    }
}

fn pass(s: &str) -> Passphrase {
    Passphrase::new(s.as_bytes().to_vec())
}

/// A fresh image formatted with `first` in keyslot 0.
fn image(
    cs: &Cryptsetup,
    dir: &Path,
    version: LuksVersion,
    first: &str,
    uuid: Option<&str>,
) -> PathBuf {
    let path = dir.join(format!("{version:?}.img"));
    create_image(&path, TEST_IMAGE_BYTES).unwrap();
    cs.format(&path, version, &pass(first), Some(&fast()), uuid)
        .unwrap();
    path
}

fn both() -> [LuksVersion; 2] {
    [LuksVersion::Luks1, LuksVersion::Luks2]
}

#[test]
fn format_and_dump() {
    for version in both() {
        let dir = tempfile::tempdir().unwrap();
        let cs = Cryptsetup::new();
        let uuid = "0a5c3b5e-7d0f-4e55-9b1c-3f5d2c1e0b9a";
        let dev = image(&cs, dir.path(), version, "first-pass", Some(uuid));
        assert_eq!(cs.pbkdf_runs(), 1);
        let h = cs.dump(&dev).unwrap();
        assert_eq!(h.version, version);
        assert_eq!(h.uuid, uuid);
        assert_eq!(h.keyslots.keys().copied().collect::<Vec<_>>(), [0]);
        let k = &h.keyslots[&0];
        assert!(k.bound);
        assert_eq!(k.priority, Priority::Normal);
        assert_eq!(k.kdf, "pbkdf2");
        match version {
            LuksVersion::Luks1 => {
                assert_eq!(k.salt.len(), 64, "{}", k.salt);
                assert!(k.salt.chars().all(|c| c.is_ascii_hexdigit()));
            }
            LuksVersion::Luks2 => assert_eq!(k.salt.len(), 44, "{}", k.salt),
        }
        assert!(h.tokens.is_empty());
        assert_eq!(cs.pbkdf_runs(), 1, "dump derives nothing");
    }
}

#[test]
fn format_without_uuid_gets_a_random_one() {
    let dir = tempfile::tempdir().unwrap();
    let cs = Cryptsetup::new();
    let dev = image(&cs, dir.path(), LuksVersion::Luks2, "p", None);
    let h = cs.dump(&dev).unwrap();
    assert_eq!(h.uuid.len(), 36);
}

#[test]
fn test_passphrase_right_wrong_empty_slot() {
    for version in both() {
        let dir = tempfile::tempdir().unwrap();
        let cs = Cryptsetup::new();
        let dev = image(&cs, dir.path(), version, "right", None);
        assert!(cs.test_passphrase(&dev, 0, &pass("right")).unwrap());
        assert!(!cs.test_passphrase(&dev, 0, &pass("wrong")).unwrap());
        assert!(!cs.test_passphrase(&dev, 0, &pass("right\n")).unwrap());
        // empty keyslot: cryptsetup exits 1, the driver confirms by dump and says "no"
        assert!(!cs.test_passphrase(&dev, 5, &pass("right")).unwrap());
        assert_eq!(cs.pbkdf_runs(), 1 + 4);
        // out of range and empty passphrases are refused without running anything
        let max = version.max_keyslots();
        assert!(matches!(
            cs.test_passphrase(&dev, 40, &pass("right")),
            Err(LuksError::Refused { .. })
        ));
        assert!(matches!(
            cs.test_passphrase(&dev, 0, &Passphrase::new(Vec::new())),
            Err(LuksError::Refused { .. })
        ));
        assert_eq!(cs.pbkdf_runs(), 5);
        if max == 8 {
            // LUKS1 keyslot 8..31: cryptsetup exits 1, the dump shows it is out of range
            let err = cs.test_passphrase(&dev, 12, &pass("right")).unwrap_err();
            assert!(matches!(err, LuksError::Refused { .. }), "{err}");
        }
    }
}

#[test]
fn add_keyslot_then_new_passphrase_opens_it() {
    for version in both() {
        let dir = tempfile::tempdir().unwrap();
        let cs = Cryptsetup::new();
        let dev = image(&cs, dir.path(), version, "old", None);
        let before = cs.dump(&dev).unwrap();
        let runs = cs.pbkdf_runs();
        cs.add_keyslot(
            &dev,
            version,
            Some(0),
            &pass("old"),
            3,
            &pass("new"),
            Some(&fast()),
        )
        .unwrap();
        assert_eq!(cs.pbkdf_runs(), runs + 2);
        let after = cs.dump(&dev).unwrap();
        assert_eq!(after.keyslots.keys().copied().collect::<Vec<_>>(), [0, 3]);
        assert_eq!(
            after.keyslots[&0], before.keyslots[&0],
            "keyslot 0 untouched"
        );
        let k3 = &after.keyslots[&3];
        assert!(k3.bound);
        assert!(!k3.salt.is_empty());
        assert_ne!(k3.salt, after.keyslots[&0].salt);
        assert!(cs.test_passphrase(&dev, 3, &pass("new")).unwrap());
        assert!(!cs.test_passphrase(&dev, 3, &pass("old")).unwrap());

        // without an unlocking keyslot cryptsetup tries them all; counted as 2 (lower bound)
        let runs = cs.pbkdf_runs();
        cs.add_keyslot(
            &dev,
            version,
            None,
            &pass("new"),
            5,
            &pass("newer"),
            Some(&fast()),
        )
        .unwrap();
        assert_eq!(cs.pbkdf_runs(), runs + 2);
        assert!(cs.test_passphrase(&dev, 5, &pass("newer")).unwrap());
    }
}

#[test]
fn add_keyslot_failures_leave_header_alone() {
    for version in both() {
        let dir = tempfile::tempdir().unwrap();
        let cs = Cryptsetup::new();
        let dev = image(&cs, dir.path(), version, "old", None);
        let secret = "n3w-secret-value";
        cs.add_keyslot(
            &dev,
            version,
            Some(0),
            &pass("old"),
            1,
            &pass(secret),
            Some(&fast()),
        )
        .unwrap();
        let before = cs.dump(&dev).unwrap();

        // occupied target keyslot: exit 1
        let err = cs
            .add_keyslot(
                &dev,
                version,
                Some(0),
                &pass("old"),
                1,
                &pass("other"),
                Some(&fast()),
            )
            .unwrap_err();
        match &err {
            LuksError::Failed { code, .. } => assert_eq!(*code, 1, "{err}"),
            other => panic!("unexpected {other}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("keyslot 1") && msg.contains(&dev.display().to_string()));
        assert!(msg.contains("untouched"), "{msg}");

        // wrong unlocking passphrase: exit 2; the secrets never appear in the message
        let err = cs
            .add_keyslot(
                &dev,
                version,
                Some(0),
                &pass("wrong-unlock-pass"),
                2,
                &pass(secret),
                Some(&fast()),
            )
            .unwrap_err();
        match &err {
            LuksError::Failed { code, .. } => assert_eq!(*code, 2, "{err}"),
            other => panic!("unexpected {other}"),
        }
        let msg = format!("{err} {err:?}");
        assert!(
            !msg.contains(secret) && !msg.contains("wrong-unlock-pass"),
            "{msg}"
        );

        // empty unlocking keyslot: exit 1
        let err = cs
            .add_keyslot(
                &dev,
                version,
                Some(6),
                &pass("old"),
                2,
                &pass("x"),
                Some(&fast()),
            )
            .unwrap_err();
        assert!(matches!(err, LuksError::Failed { code: 1, .. }), "{err}");

        // refused before running: empty passphrases, keyslot out of range
        let runs = cs.pbkdf_runs();
        let empty = Passphrase::new(Vec::new());
        for (unlock, new, slot) in [
            (&empty, &pass("x"), 2),
            (&pass("old"), &empty, 2),
            (&pass("old"), &pass("x"), version.max_keyslots()),
        ] {
            let err = cs
                .add_keyslot(&dev, version, Some(0), unlock, slot, new, Some(&fast()))
                .unwrap_err();
            assert!(matches!(err, LuksError::Refused { .. }), "{err}");
        }
        assert_eq!(cs.pbkdf_runs(), runs);
        assert_eq!(cs.dump(&dev).unwrap(), before);
    }
}

#[test]
fn kill_keyslot_removes_and_refuses_last_bound() {
    for version in both() {
        let dir = tempfile::tempdir().unwrap();
        let cs = Cryptsetup::new();
        let dev = image(&cs, dir.path(), version, "old", None);
        cs.add_keyslot(
            &dev,
            version,
            Some(0),
            &pass("old"),
            1,
            &pass("new"),
            Some(&fast()),
        )
        .unwrap();
        let runs = cs.pbkdf_runs();
        cs.kill_keyslot(&dev, 0).unwrap();
        assert_eq!(cs.pbkdf_runs(), runs, "kill derives nothing");
        let h = cs.dump(&dev).unwrap();
        assert_eq!(h.keyslots.keys().copied().collect::<Vec<_>>(), [1]);
        assert!(cs.test_passphrase(&dev, 1, &pass("new")).unwrap());

        // keyslot 1 is now the only one: refused, and still there
        let err = cs.kill_keyslot(&dev, 1).unwrap_err();
        assert!(matches!(err, LuksError::Refused { .. }), "{err}");
        assert!(err.to_string().contains("keyslot 1"), "{err}");
        assert!(cs.dump(&dev).unwrap().keyslots.contains_key(&1));

        // empty keyslot and out of range: refused
        assert!(matches!(
            cs.kill_keyslot(&dev, 0),
            Err(LuksError::Refused { .. })
        ));
        assert!(matches!(
            cs.kill_keyslot(&dev, 99),
            Err(LuksError::Refused { .. })
        ));
    }
}

/// `cryptsetup luksAddKey --unbound` into `slot` with the passphrase on stdin (test-only helper).
fn add_unbound(dev: &Path, slot: u32, secret: &str) {
    let mut child = Command::new("cryptsetup")
        .args([
            "luksAddKey",
            "--batch-mode",
            "--unbound",
            "--key-size",
            "256",
            // with --unbound, cryptsetup 2.6.1 takes the target from --key-slot and ignores
            // --new-key-slot
            "--key-slot",
            &slot.to_string(),
            "--new-keyfile=-",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ])
        .arg(dev)
        .env("LC_ALL", "C")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(secret.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn unbound_keyslot_is_reported_and_does_not_count_for_kill() {
    let dir = tempfile::tempdir().unwrap();
    let cs = Cryptsetup::new();
    let dev = image(&cs, dir.path(), LuksVersion::Luks2, "old", None);
    add_unbound(&dev, 2, "unbound-pass");
    let h = cs.dump(&dev).unwrap();
    assert!(h.keyslots[&0].bound);
    assert!(!h.keyslots[&2].bound);
    // the hazard: --test-passphrase succeeds on an unbound keyslot
    assert!(cs.test_passphrase(&dev, 2, &pass("unbound-pass")).unwrap());
    // keyslot 0 is the only BOUND keyslot, although 2 is occupied
    assert!(matches!(
        cs.kill_keyslot(&dev, 0),
        Err(LuksError::Refused { .. })
    ));
    // killing the unbound one is fine
    cs.kill_keyslot(&dev, 2).unwrap();
    assert_eq!(
        cs.dump(&dev)
            .unwrap()
            .keyslots
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        [0]
    );
}

#[test]
fn priority_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let cs = Cryptsetup::new();
    let dev = image(&cs, dir.path(), LuksVersion::Luks2, "old", None);
    for slot in [1, 2] {
        cs.add_keyslot(
            &dev,
            LuksVersion::Luks2,
            Some(0),
            &pass("old"),
            slot,
            &pass("new"),
            Some(&fast()),
        )
        .unwrap();
    }
    for (slot, prio) in [(1, "ignore"), (2, "prefer")] {
        let status = Command::new("cryptsetup")
            .args([
                "config",
                "--priority",
                prio,
                "--key-slot",
                &slot.to_string(),
            ])
            .arg(&dev)
            .env("LC_ALL", "C")
            .status()
            .unwrap();
        assert!(status.success());
    }
    let h = cs.dump(&dev).unwrap();
    assert_eq!(h.keyslots[&0].priority, Priority::Normal);
    assert_eq!(h.keyslots[&1].priority, Priority::Ignore);
    assert_eq!(h.keyslots[&2].priority, Priority::Prefer);
    // an ignored keyslot still opens when named
    assert!(cs.test_passphrase(&dev, 1, &pass("new")).unwrap());
}

#[test]
fn token_import_remove_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let cs = Cryptsetup::new();
    let dev = image(&cs, dir.path(), LuksVersion::Luks2, "old", None);
    cs.add_keyslot(
        &dev,
        LuksVersion::Luks2,
        Some(0),
        &pass("old"),
        1,
        &pass("new"),
        Some(&fast()),
    )
    .unwrap();
    let runs = cs.pbkdf_runs();
    let token = serde_json::json!({"type":"keyplan","keyslots":["1"],"key":"k","version":1});
    let id = cs.token_import(&dev, None, &token).unwrap();
    assert_eq!(id, 0);
    let h = cs.dump(&dev).unwrap();
    let t = &h.tokens[&0];
    assert_eq!((t.id, t.token_type.as_str()), (0, "keyplan"));
    assert_eq!(t.keyslots, [1]);
    assert_eq!(t.json, token);

    // next free id, then an explicit id, then replacing it
    assert_eq!(cs.token_import(&dev, None, &token).unwrap(), 1);
    assert_eq!(cs.token_import(&dev, Some(7), &token).unwrap(), 7);
    let v2 = serde_json::json!({"type":"keyplan","keyslots":["0","1"],"key":"k","version":2});
    assert_eq!(cs.token_import(&dev, Some(7), &v2).unwrap(), 7);
    let h = cs.dump(&dev).unwrap();
    assert_eq!(h.tokens.keys().copied().collect::<Vec<_>>(), [0, 1, 7]);
    assert_eq!(h.tokens[&7].json, v2);
    assert_eq!(h.tokens[&7].keyslots, [0, 1]);

    cs.token_remove(&dev, 0).unwrap();
    cs.token_remove(&dev, 7).unwrap();
    let h = cs.dump(&dev).unwrap();
    assert_eq!(h.tokens.keys().copied().collect::<Vec<_>>(), [1]);
    // removing a token that is not there: exit 1
    assert!(matches!(
        cs.token_remove(&dev, 0),
        Err(LuksError::Failed { code: 1, .. })
    ));
    assert_eq!(cs.pbkdf_runs(), runs, "tokens derive nothing");

    // refused: keyslot not occupied, malformed JSON, id out of range
    for (id, bad) in [
        (None, serde_json::json!({"type":"keyplan","keyslots":["9"]})),
        (None, serde_json::json!({"type":"keyplan","keyslots":[1]})),
        (None, serde_json::json!({"keyslots":["1"]})),
        (Some(32), token.clone()),
    ] {
        let err = cs.token_import(&dev, id, &bad).unwrap_err();
        assert!(matches!(err, LuksError::Refused { .. }), "{err}");
    }
    assert!(matches!(
        cs.token_remove(&dev, 32),
        Err(LuksError::Refused { .. })
    ));

    // killing a keyslot by hand drops it from the token's keyslots (the token stays)
    cs.kill_keyslot(&dev, 1).unwrap();
    let h = cs.dump(&dev).unwrap();
    assert!(h.tokens[&1].keyslots.is_empty());
}

#[test]
fn tokens_refused_on_luks1() {
    let dir = tempfile::tempdir().unwrap();
    let cs = Cryptsetup::new();
    let dev = image(&cs, dir.path(), LuksVersion::Luks1, "old", None);
    let token = serde_json::json!({"type":"keyplan","keyslots":["0"],"key":"k","version":1});
    let err = cs.token_import(&dev, None, &token).unwrap_err();
    assert!(matches!(err, LuksError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("LUKS1"), "{err}");
    assert!(cs.token_remove(&dev, 0).is_err());
}

#[test]
fn not_luks_missing_and_directory() {
    let dir = tempfile::tempdir().unwrap();
    let cs = Cryptsetup::new();
    let plain = dir.path().join("plain.img");
    std::fs::write(&plain, vec![0u8; 1 << 20]).unwrap();
    assert!(matches!(cs.dump(&plain), Err(LuksError::NotLuks { .. })));
    let empty = dir.path().join("empty.img");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(cs.dump(&empty), Err(LuksError::NotLuks { .. })));

    let missing = dir.path().join("missing.img");
    for dev in [missing.as_path(), dir.path()] {
        let err = cs.dump(dev).unwrap_err();
        assert!(matches!(err, LuksError::Device { .. }), "{err}");
        assert!(
            err.to_string().contains(&dev.display().to_string()),
            "{err}"
        );
        let err = cs.test_passphrase(dev, 0, &pass("x")).unwrap_err();
        assert!(matches!(err, LuksError::Device { .. }), "{err}");
        let err = cs.kill_keyslot(dev, 0).unwrap_err();
        assert!(matches!(err, LuksError::Device { .. }), "{err}");
        let err = cs
            .add_keyslot(
                dev,
                LuksVersion::Luks2,
                Some(0),
                &pass("a"),
                1,
                &pass("b"),
                None,
            )
            .unwrap_err();
        assert!(matches!(err, LuksError::Device { .. }), "{err}");
        let err = cs.token_remove(dev, 0).unwrap_err();
        assert!(matches!(err, LuksError::Device { .. }), "{err}");
        let err = cs
            .format(dev, LuksVersion::Luks2, &pass("p"), None, None)
            .unwrap_err();
        assert!(matches!(err, LuksError::Device { .. }), "{err}");
    }
    assert_eq!(cs.pbkdf_runs(), 0);

    // test_passphrase on a non-LUKS file
    let err = cs.test_passphrase(&plain, 0, &pass("x")).unwrap_err();
    assert!(matches!(err, LuksError::NotLuks { .. }), "{err}");

    // create_image never overwrites
    assert!(matches!(
        create_image(&plain, 100),
        Err(LuksError::Device { .. })
    ));
}

#[test]
fn missing_program_is_a_spawn_error() {
    let dir = tempfile::tempdir().unwrap();
    let dev = image(
        &Cryptsetup::new(),
        dir.path(),
        LuksVersion::Luks2,
        "first-pass",
        None,
    );
    let cs = Cryptsetup::with_program(PathBuf::from("/nonexistent/cryptsetup"));
    // Headers are read in process: no program needed.
    assert_eq!(cs.dump(&dev).unwrap().version, LuksVersion::Luks2);
    let err = cs
        .test_passphrase(&dev, 0, &pass("first-pass"))
        .unwrap_err();
    assert!(matches!(err, LuksError::Spawn { .. }), "{err}");
    assert_eq!(cs.pbkdf_runs(), 0);
}

/// A fake cryptsetup that records what it got: argv, LC_ALL/LANG, stdin and fd 3.
#[test]
fn secrets_travel_only_through_pipes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("fake-cryptsetup");
    let log = dir.path().join("log");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nd={}\nprintf '%s\\n' \"$@\" > $d/argv\nenv > $d/env\ncat > $d/stdin\n\
             if [ -e /dev/fd/3 ]; then cat /dev/fd/3 > $d/fd3; fi\nexit 0\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::create_dir(&log).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A real header (read in process before a test), handed to the fake program.
    let dev = image(
        &Cryptsetup::new(),
        dir.path(),
        LuksVersion::Luks2,
        "first-pass",
        None,
    );

    let cs = Cryptsetup::with_program(fake);
    let unlock = Passphrase::new(b"UNLOCK-secret\nwith newline\n".to_vec());
    let big: Vec<u8> = (0..300_000u32).map(|i| b'A' + (i % 26) as u8).collect();
    let new = Passphrase::new(big.clone());
    cs.add_keyslot(
        &dev,
        LuksVersion::Luks2,
        Some(4),
        &unlock,
        9,
        &new,
        Some(&fast()),
    )
    .unwrap();
    let argv = std::fs::read_to_string(log.join("argv")).unwrap();
    let argv: Vec<&str> = argv.lines().collect();
    assert_eq!(
        argv,
        [
            "luksAddKey",
            "--batch-mode",
            "--key-slot",
            "4",
            "--new-key-slot",
            "9",
            "--key-file=/dev/fd/0",
            "--new-keyfile=/dev/fd/3",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            dev.to_str().unwrap(),
        ]
    );
    let env = std::fs::read_to_string(log.join("env")).unwrap();
    assert!(env.lines().any(|l| l == "LC_ALL=C"));
    assert!(env.lines().any(|l| l == "LANG=C"));
    assert!(!env.contains("UNLOCK") && !env.contains("ABCDEFGHIJ"));
    assert_eq!(std::fs::read(log.join("stdin")).unwrap(), unlock.expose());
    assert_eq!(std::fs::read(log.join("fd3")).unwrap(), big);

    // test: the passphrase on stdin, nothing on fd 3
    std::fs::remove_file(log.join("fd3")).unwrap();
    assert!(cs.test_passphrase(&dev, 2, &unlock).unwrap());
    let argv = std::fs::read_to_string(log.join("argv")).unwrap();
    assert_eq!(
        argv.lines().collect::<Vec<_>>(),
        [
            "open",
            "--test-passphrase",
            "--key-slot",
            "2",
            "--key-file=-",
            dev.to_str().unwrap(),
        ]
    );
    assert_eq!(std::fs::read(log.join("stdin")).unwrap(), unlock.expose());
    assert!(!log.join("fd3").exists());

    // token remove: stdin is /dev/null
    cs.token_remove(&dev, 3).unwrap();
    assert!(std::fs::read(log.join("stdin")).unwrap().is_empty());
    assert_eq!(cs.pbkdf_runs(), 3);
}

#[test]
fn counter_is_shared_by_clones() {
    let dir = tempfile::tempdir().unwrap();
    let cs = Cryptsetup::new();
    let clone = cs.clone();
    let counter = cs.counter();
    let dev = image(&clone, dir.path(), LuksVersion::Luks2, "old", None);
    assert!(cs.test_passphrase(&dev, 0, &pass("old")).unwrap());
    assert_eq!(cs.pbkdf_runs(), 2);
    assert_eq!(clone.pbkdf_runs(), 2);
    assert_eq!(counter.get(), 2);
    assert_eq!(Cryptsetup::new().pbkdf_runs(), 0, "new drivers start at 0");
}

// ---- the cryptsetup project's compatibility images ----

fn testdata() -> Option<PathBuf> {
    let dir = std::env::var_os("KEYPLAN_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/testdata/cryptsetup")
        });
    if dir.join("compatimage.img.xz").is_file() {
        Some(dir)
    } else {
        eprintln!("SKIPPED: ../shared/testdata not found");
        None
    }
}

/// Decompresses `name`.xz from the test data into `into` (never touching the original).
fn unpack(data: &Path, name: &str, into: &Path) -> PathBuf {
    let out = into.join(name);
    let file = std::fs::File::create(&out).unwrap();
    let status = Command::new("xz")
        .arg("-dc")
        .arg(data.join(format!("{name}.xz")))
        .stdout(file)
        .status()
        .unwrap();
    assert!(status.success());
    out
}

#[test]
fn compat_image_luks1() {
    let Some(data) = testdata() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dev = unpack(&data, "compatimage.img", dir.path());
    let cs = Cryptsetup::new();
    let h = cs.dump(&dev).unwrap();
    assert_eq!(h.version, LuksVersion::Luks1);
    assert_eq!(h.uuid, "28632274-8c8a-493f-835b-da802e1c576b");
    assert_eq!(h.keyslots.keys().copied().collect::<Vec<_>>(), [0]);
    assert_eq!(
        h.keyslots[&0].salt,
        "143b5264d02a845e5b652d8e6637bde9daffcab5bf9df5aa88cfa36ab22b98b8"
    );
    assert!(h.keyslots[&0].bound);
    assert!(h.tokens.is_empty());
    assert!(cs.test_passphrase(&dev, 0, &pass("compatkey")).unwrap());
    assert!(!cs.test_passphrase(&dev, 0, &pass("compatkez")).unwrap());
    assert!(!cs.test_passphrase(&dev, 1, &pass("compatkey")).unwrap());

    // argon2 settings are dropped for LUKS1; pbkdf2 ones apply
    cs.add_keyslot(
        &dev,
        LuksVersion::Luks1,
        Some(0),
        &pass("compatkey"),
        1,
        &pass("rotated"),
        Some(&fast()),
    )
    .unwrap();
    assert!(cs.test_passphrase(&dev, 1, &pass("rotated")).unwrap());
    let after = cs.dump(&dev).unwrap();
    assert_eq!(after.keyslots[&0], h.keyslots[&0]);
    assert!(after.keyslots[&1].bound);
    cs.kill_keyslot(&dev, 0).unwrap();
    assert!(!cs.test_passphrase(&dev, 0, &pass("compatkey")).unwrap());
    assert_eq!(cs.pbkdf_runs(), 3 + 2 + 1 + 1);
}

#[test]
fn compat_image_luks2() {
    let Some(data) = testdata() else { return };
    let dir = tempfile::tempdir().unwrap();
    let dev = unpack(&data, "compatimage2.img", dir.path());
    let cs = Cryptsetup::new();
    let h = cs.dump(&dev).unwrap();
    assert_eq!(h.version, LuksVersion::Luks2);
    assert_eq!(h.uuid, "28632274-8c8a-493f-835b-da802e1c576b");
    assert_eq!(h.keyslots.keys().copied().collect::<Vec<_>>(), [0, 1]);
    assert_eq!(h.keyslots[&0].kdf, "pbkdf2");
    assert_eq!(h.keyslots[&1].kdf, "argon2id");
    assert_eq!(
        h.keyslots[&0].salt,
        "Orln7DlfbPAkRqguyEbvCn8L7Lk1icFqlF9n8i+e+Fo="
    );
    assert_eq!(
        h.keyslots[&1].salt,
        "c7vifSPdouqnRNRSteAJRheERfgQw5XFElBkQmOjwvs="
    );
    assert!(h
        .keyslots
        .values()
        .all(|k| k.bound && k.priority == Priority::Normal));
    assert!(h.tokens.is_empty());
    assert!(cs.test_passphrase(&dev, 0, &pass("compatkey")).unwrap());
    assert!(cs
        .test_passphrase(&dev, 1, &pass("0123456789abcdef"))
        .unwrap());
    assert!(!cs.test_passphrase(&dev, 1, &pass("compatkey")).unwrap());

    cs.add_keyslot(
        &dev,
        LuksVersion::Luks2,
        Some(0),
        &pass("compatkey"),
        2,
        &pass("rotated"),
        Some(&fast()),
    )
    .unwrap();
    let after = cs.dump(&dev).unwrap();
    assert_eq!(after.keyslots[&0], h.keyslots[&0]);
    assert_eq!(after.keyslots[&1], h.keyslots[&1]);
    assert!(after.keyslots[&2].bound);
    assert!(cs.test_passphrase(&dev, 2, &pass("rotated")).unwrap());
    let id = cs
        .token_import(
            &dev,
            None,
            &serde_json::json!({"type":"keyplan","keyslots":["2"],"key":"k","version":1}),
        )
        .unwrap();
    assert_eq!(id, 0);
    assert_eq!(cs.pbkdf_runs(), 3 + 2 + 1);
}

/// `Epoch:` and `UUID:` as `cryptsetup luksDump` prints them.
fn text_ids(dev: &Path) -> (String, u64) {
    let out = Command::new("cryptsetup")
        .arg("luksDump")
        .arg(dev)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap()
    };
    (field("UUID:"), field("Epoch:").parse().unwrap())
}

/// A cryptsetup wrapper that logs its argv (one line per call) to `log`, then runs cryptsetup.
fn logging_cryptsetup(dir: &Path, log: &Path) -> Cryptsetup {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("cryptsetup-logged");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\nexec cryptsetup \"$@\"\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    Cryptsetup::with_program(script)
}

/// A LUKS2 header is read in process, with no cryptsetup process at all, and matches what
/// `luksDump` prints (UUID, epoch, keyslots). When the two copies disagree (here: the
/// secondary's seqid changed, so its checksum no longer holds), it is still read without a
/// process, from the intact primary, the damage is reported, and no byte changes.
#[test]
fn luks2_headers_are_read_without_a_process_even_when_the_copies_differ() {
    let dir = tempfile::tempdir().unwrap();
    let plain = Cryptsetup::new();
    let dev = image(&plain, dir.path(), LuksVersion::Luks2, "first-pass", None);
    plain
        .add_keyslot(
            &dev,
            LuksVersion::Luks2,
            Some(0),
            &pass("first-pass"),
            3,
            &pass("second"),
            Some(&fast()),
        )
        .unwrap();
    let log = dir.path().join("calls.log");
    let cs = logging_cryptsetup(dir.path(), &log);
    let calls = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        std::fs::write(&log, "").unwrap();
        text.lines().map(str::to_owned).collect::<Vec<_>>()
    };

    let header = cs.dump(&dev).unwrap();
    let (uuid, epoch) = text_ids(&dev);
    assert_eq!(header.uuid, uuid);
    assert_eq!(header.epoch, Some(epoch));
    assert_eq!(header.keyslots.keys().copied().collect::<Vec<_>>(), [0, 3]);
    assert!(header.condition.damage.is_empty(), "{:?}", header.condition);
    assert_eq!(calls(), Vec::<String>::new());

    // Damage the secondary header's seqid (u64 at hdr_size + 16; hdr_size is the u64 at 8).
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev)
        .unwrap();
    let mut size = [0u8; 8];
    f.read_exact_at(&mut size, 8).unwrap();
    let hdr_size = u64::from_be_bytes(size);
    f.write_all_at(&(epoch + 100).to_be_bytes(), hdr_size + 16)
        .unwrap();
    drop(f);
    let before = std::fs::read(&dev).unwrap();
    let damaged = cs.dump(&dev).unwrap();
    assert_eq!(calls(), Vec::<String>::new());
    assert!(damaged.condition.copies_disagree);
    assert!(
        damaged.condition.damage[0].contains("secondary")
            && damaged.condition.damage[0].contains("checksum"),
        "{:?}",
        damaged.condition
    );
    assert_eq!(damaged.keyslots, header.keyslots);
    assert_eq!(damaged.epoch, Some(epoch));
    assert!(
        std::fs::read(&dev).unwrap() == before,
        "reading changed the device"
    );
}

/// LUKS1 and non-LUKS files are judged in process too, with no process: the same verdicts
/// as `cryptsetup isLuks`.
#[test]
fn luks1_and_not_luks_need_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let plain = Cryptsetup::new();
    let dev = image(&plain, dir.path(), LuksVersion::Luks1, "first-pass", None);
    let log = dir.path().join("calls.log");
    let cs = logging_cryptsetup(dir.path(), &log);
    let h = cs.dump(&dev).unwrap();
    assert_eq!(h.version, LuksVersion::Luks1);
    assert_eq!(h.uuid, text_ids_luks1(&dev));
    let zeros = dir.path().join("zeros.img");
    std::fs::write(&zeros, vec![0u8; 1 << 20]).unwrap();
    assert!(matches!(cs.dump(&zeros), Err(LuksError::NotLuks { .. })));
    assert_eq!(std::fs::read_to_string(&log).unwrap_or_default(), "");
}

fn text_ids_luks1(dev: &Path) -> String {
    let out = Command::new("cryptsetup")
        .arg("luksUUID")
        .arg(dev)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}
