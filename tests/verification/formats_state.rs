//! The fixtures of the state directory's documents and keyplan's LUKS records
//! (tests/fixtures/formats/, src/format/state/): every released version is read by this
//! keyplan, today's version is written again byte for byte, and a newer version is refused
//! with the newer-format message while the file is left as it was.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use keyplan::format::state::{self, files, records, signed_plan, ReadError};
use keyplan::luks::{Cryptsetup, Header, LuksVersion};
use keyplan::world::{copies, kept, owner, registry, RecordError, RecordStore};

use crate::common::Scratch;

/// The LUKS UUID of the LUKS1 image the record fixtures were written for.
const LUKS1_UUID: &str = "1f156bc6-416a-4b20-8931-64b0c8e3d497";

/// `tests/fixtures/formats/<name>/v<version>/<file>`.
fn fixture(name: &str, version: u32, file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/formats")
        .join(name)
        .join(format!("v{version}"))
        .join(file)
}

fn bytes(name: &str, version: u32, file: &str) -> Vec<u8> {
    std::fs::read(fixture(name, version, file)).expect("fixture")
}

/// A state directory holding the fixture `name` v`version` as `file` (under `sub`).
fn state_dir_with(name: &str, version: u32, file: &str, sub: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
    std::fs::write(dir.path().join(sub).join(file), bytes(name, version, file)).expect("copy");
    dir
}

/// `err` is the newer-format refusal of `format` version `found` naming `document`.
fn is_newer(err: &dyn std::fmt::Display, document: &str, format: &str, found: u32) {
    let text = err.to_string();
    let want = format!("{document} is {format} format {found}, written by a newer keyplan");
    assert!(text.contains(&want), "{want:?} not in {text}");
    assert!(text.contains("Nothing was changed or written"), "{text}");
}

fn newer(e: ReadError) -> keyplan::format::NewerFormat {
    match e {
        ReadError::Newer(n) => n,
        ReadError::Corrupt(c) => panic!("refused as corrupt, not newer: {c}"),
    }
}

#[test]
fn owner_json() {
    let v1 = bytes("owner-json", 1, "owner.json");
    let doc = files::read_owner("owner.json", &v1).expect("v1");
    assert_eq!(doc.plan, Path::new("/tmp/fs-fix/keyplan.yaml"));
    assert_eq!(doc.node, "vm");
    assert_eq!(doc.state_dir, Path::new("/tmp/fs-fix/.keyplan"));
    assert_eq!(doc.holder, "vm:/tmp/fs-fix/.keyplan");
    assert!(doc.former_holders.is_empty());
    assert_eq!(doc.since, 1796692520);
    let engine = owner::Owner::from(doc);
    let again = state::pretty(&files::OwnerV1::from(&engine)).expect("write");
    assert_eq!(String::from_utf8(again).ok(), String::from_utf8(v1).ok());

    let dir = state_dir_with("owner-json", 2, "owner.json", "");
    let path = dir.path().join("owner.json");
    let err = owner::read(dir.path()).expect_err("newer");
    assert!(matches!(err, owner::OwnerError::Newer(_)), "{err}");
    is_newer(&err, &path.display().to_string(), "owner-json", 2);
    assert_eq!(
        std::fs::read(&path).ok(),
        Some(bytes("owner-json", 2, "owner.json"))
    );
}

#[test]
fn devices_json() {
    let v1 = bytes("devices-json", 1, "devices.json");
    let doc = files::read_devices("devices.json", &v1).expect("v1");
    assert_eq!(doc.devices.len(), 2);
    let d2 = &doc.devices[LUKS1_UUID];
    assert_eq!(
        (d2.id.as_str(), d2.path.as_path()),
        ("d2", Path::new("/tmp/fs-fix/d2.img"))
    );
    let engine = registry::Registry::from(doc);
    let again = state::pretty(&files::DevicesV1::from(&engine)).expect("write");
    assert_eq!(again, v1);

    let dir = state_dir_with("devices-json", 2, "devices.json", "");
    let path = dir.path().join("devices.json");
    let err = registry::read(dir.path()).expect_err("newer");
    is_newer(&err, &path.display().to_string(), "devices-json", 2);
    let err = registry::update(dir.path(), [("d3", "abc", Path::new("/dev/sdc"))])
        .expect_err("update of a newer file");
    assert!(matches!(err, registry::RegistryError::Newer(_)), "{err}");
    assert!(registry::remove(dir.path(), &[LUKS1_UUID.to_string()]).is_err());
    assert_eq!(
        std::fs::read(&path).ok(),
        Some(bytes("devices-json", 2, "devices.json"))
    );
}

#[test]
fn copies_json() {
    let v1 = bytes("copies-json", 1, "copies.json");
    let doc = files::read_copies("copies.json", &v1).expect("v1");
    let [c] = doc.copies.as_slice() else {
        panic!("one copy: {doc:?}")
    };
    assert_eq!(
        (c.device.as_str(), c.slot, c.key.as_str(), c.version),
        ("d1", 2, "k", 1)
    );
    assert_eq!(c.salt, "4kDpHFF780ykK8izRyEbms7sh7jr+izFLhn3GKMuqf0=");
    let dir = state_dir_with("copies-json", 1, "copies.json", "");
    let engine = copies::read(dir.path()).expect("engine read");
    assert_eq!(engine.len(), 1);
    let again = files::CopiesV1 {
        format: 1,
        copies: engine.iter().map(files::CopyV1::from).collect(),
    };
    assert_eq!(state::pretty(&again).expect("write"), v1);

    let dir = state_dir_with("copies-json", 2, "copies.json", "");
    let path = dir.path().join("copies.json");
    let err = copies::record(dir.path(), &c.uuid, &Default::default(), &[]).expect_err("newer");
    assert!(matches!(err, copies::CopiesError::Newer(_)), "{err}");
    is_newer(&err, &path.display().to_string(), "copies-json", 2);
    assert_eq!(
        std::fs::read(&path).ok(),
        Some(bytes("copies-json", 2, "copies.json"))
    );
}

#[test]
fn kept_json() {
    let v1 = bytes("kept-json", 1, "kept.json");
    let doc = files::read_kept("kept.json", &v1).expect("v1");
    let [c] = doc.copies.as_slice() else {
        panic!("one entry: {doc:?}")
    };
    assert_eq!(
        (c.kms.as_str(), c.name.as_str(), c.versions.as_slice()),
        ("old", "k-name", &[1, 2][..])
    );
    // Written by keyplan's own writer from nothing: the fixture's bytes.
    let dir = tempfile::tempdir().expect("tempdir");
    kept::update(dir.path(), &[kept::KeptCopy::from(c.clone())], &|_| false).expect("write");
    assert_eq!(std::fs::read(dir.path().join("kept.json")).ok(), Some(v1));

    let dir = state_dir_with("kept-json", 2, "kept.json", "");
    let path = dir.path().join("kept.json");
    let err = kept::update(dir.path(), &[], &|_| true).expect_err("newer");
    assert!(matches!(err, kept::KeptError::Newer(_)), "{err}");
    is_newer(&err, &path.display().to_string(), "kept-json", 2);
    assert_eq!(
        std::fs::read(&path).ok(),
        Some(bytes("kept-json", 2, "kept.json"))
    );
}

/// A LUKS1 header of [`LUKS1_UUID`] with keyslot 2 as the version 2 fixture recorded it.
fn luks1_header() -> Header {
    let mut keyslots = std::collections::BTreeMap::new();
    keyslots.insert(
        2,
        keyplan::luks::Keyslot {
            bound: true,
            salt: "4d3112d99395b1fe9c694c40d44fe889377975303d95d3a037e7cace9aa6e763".into(),
            priority: keyplan::luks::Priority::Normal,
            kdf: "pbkdf2".into(),
            memory_kib: None,
            iterations: Some(1000),
            parallel: None,
        },
    );
    Header {
        version: LuksVersion::Luks1,
        uuid: LUKS1_UUID.into(),
        keyslots,
        tokens: Default::default(),
        json_area: None,
        epoch: None,
        pbkdf2_target: ("sha256".into(), Some(256)),
        condition: Default::default(),
    }
}

#[test]
fn luks1_records() {
    let file = format!("{LUKS1_UUID}.json");
    let v2 = bytes("luks1-records", 2, &file);
    // v1 (keyplan before issue 47) recorded keyslot 1 holding v1; v2 (after three rotations)
    // keyslot 2 holding v4.
    for (version, slot, key_version) in [(1, 1, 1), (2, 2, 4)] {
        let doc = records::read_luks1(&file, &bytes("luks1-records", version, &file))
            .expect("known version");
        assert_eq!(doc.format, 2, "v{version} read as today's version");
        let rec = doc
            .slots
            .get(&slot)
            .unwrap_or_else(|| panic!("v{version}: {doc:?}"));
        assert_eq!(
            (rec.key.as_str(), rec.version),
            ("k", key_version),
            "v{version}"
        );
        assert_eq!(rec.entry, Some(("local".into(), "k".into())), "v{version}");
        assert_eq!(
            rec.pbkdf.as_deref(),
            Some("pbkdf2 iterations=1000"),
            "v{version}"
        );
        if version == 2 {
            assert_eq!(state::pretty(&doc).expect("write"), v2);
        }
    }
    // Through the record store: the version 2 record reads as valid for its keyslot.
    let dir = state_dir_with("luks1-records", 2, &file, "luks1");
    let store = RecordStore::new(Arc::new(Cryptsetup::default()), dir.path().join("luks1"));
    let header = luks1_header();
    let read = store.read(&header).expect("read");
    assert!(read[0].holds(2, "k", 4), "{read:?}");
    // Version 1 is rewritten as version 2 (as the rotations did).
    let dir = state_dir_with("luks1-records", 1, &file, "luks1");
    let store = RecordStore::new(Arc::new(Cryptsetup::default()), dir.path().join("luks1"));
    let old = store.read(&header).expect("v1 through the store");
    assert_eq!((old[0].slot, old[0].record.version), (1, 1), "{old:?}");
    let record = read[0].record.clone();
    store
        .write(Path::new("/tmp/fs-fix/d2.img"), &header, 2, &record)
        .expect("add");
    store
        .remove(Path::new("/tmp/fs-fix/d2.img"), &header, 1)
        .expect("remove");
    let path = dir.path().join("luks1").join(&file);
    assert_eq!(
        std::fs::read(&path).ok(),
        Some(v2.clone()),
        "v1 rewritten as v2"
    );

    let dir = state_dir_with("luks1-records", 3, &file, "luks1");
    let store = RecordStore::new(Arc::new(Cryptsetup::default()), dir.path().join("luks1"));
    let path = dir.path().join("luks1").join(&file);
    let err = store.read(&header).expect_err("newer");
    assert!(matches!(err, RecordError::Newer(_)), "{err}");
    is_newer(&err, &path.display().to_string(), "luks1-records", 3);
    assert!(store
        .write(Path::new("/dev/null"), &header, 1, &record)
        .is_err());
    assert!(store.remove(Path::new("/dev/null"), &header, 1).is_err());
    assert_eq!(
        std::fs::read(&path).ok(),
        Some(bytes("luks1-records", 3, &file))
    );
}

/// A small LUKS2 image with keyslot 3 (the token fixtures' keyslot) and the fixture token
/// `luks2-token` v`version` imported as token 0; its header as keyplan reads it.
fn header_with_token(s: &Scratch, version: u32) -> (PathBuf, Header) {
    let img = s.image_with(
        "t.img",
        "luks2",
        3 << 19,
        &[
            "--key-slot",
            "3",
            "--luks2-metadata-size",
            "16k",
            "--luks2-keyslots-size",
            "512k",
        ],
    );
    let out = std::process::Command::new("cryptsetup")
        .args(["token", "import", "--token-id", "0", "--json-file"])
        .arg(fixture("luks2-token", version, "token.json"))
        .arg(&img)
        .output()
        .expect("cryptsetup token import");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = Cryptsetup::default().dump(&img).expect("luksDump");
    (img, header)
}

#[test]
fn luks2_token() {
    let v1 = bytes("luks2-token", 1, "token.json");
    let json: serde_json::Value = serde_json::from_slice(&v1).expect("JSON");
    let token = records::read_token("token 1", &json).expect("v1");
    assert_eq!((token.slot, token.key.as_str(), token.version), (3, "k", 4));
    assert_eq!(
        (token.kms.as_deref(), token.name.as_deref()),
        (Some("local"), Some("k"))
    );
    assert_eq!(
        token.to_json().to_string().into_bytes(),
        v1,
        "written as cryptsetup exports it"
    );
    let v2: serde_json::Value =
        serde_json::from_slice(&bytes("luks2-token", 2, "token.json")).expect("JSON");
    let n = newer(records::read_token("device d keyslot 3 token 0", &v2).expect_err("newer"));
    is_newer(&n, "device d keyslot 3 token 0", "luks2-token", 2);

    // In a real header: the record reads back; a newer token is refused, not skipped.
    let s = Scratch::new();
    let (img, header) = header_with_token(&s, 1);
    let store = RecordStore::new(Arc::new(Cryptsetup::default()), s.path("luks1"));
    let read = store.read(&header).expect("read");
    assert_eq!((read[0].slot, read[0].token_id), (3, Some(0)), "{read:?}");
    assert_eq!(
        (read[0].record.key.as_str(), read[0].record.version),
        ("k", 4)
    );
    std::fs::remove_file(&img).expect("rm");
    let (_, header) = header_with_token(&s, 2);
    let err = store.read(&header).expect_err("newer").on_device("d1");
    assert!(matches!(err, RecordError::Newer(_)), "{err}");
    is_newer(&err, "device d1 keyslot 3 token 0", "luks2-token", 2);
}

#[test]
fn agent_signed_plan() {
    let v1 = bytes("agent-signed-plan", 1, "agent-signed-plan.json");
    let v2 = bytes("agent-signed-plan", 2, "agent-signed-plan.json");
    // Version 1 is what keyplan before issue 47 wrote: serde_json of `{plan, signature}`.
    let old = signed_plan::read_signed_plan("v1", &v1).expect("v1");
    let as_written = signed_plan::SignedPlanV1 {
        plan: old.plan.clone(),
        signature: old.signature.clone(),
    };
    assert_eq!(serde_json::to_vec(&as_written).ok(), Some(v1.clone()));
    assert!(old.plan.contains("node: node-a"), "{}", old.plan);
    assert!(
        old.signature.contains("keyplan-signature/v1"),
        "{}",
        old.signature
    );
    let today = signed_plan::read_signed_plan("v2", &v2).expect("v2");
    assert_eq!(today, old, "one document in two versions");
    assert_eq!(today.to_bytes().ok(), Some(v2));
    let v3 = bytes("agent-signed-plan", 3, "agent-signed-plan.json");
    let n = newer(signed_plan::read_signed_plan("p", &v3).expect_err("newer"));
    is_newer(&n, "p", "agent-signed-plan", 3);
}

#[test]
fn every_state_format_is_listed_with_fixtures() {
    let names: Vec<&str> = state::FORMATS.iter().map(|f| f.name).collect();
    for name in &names {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/formats")
            .join(name);
        assert!(dir.join("v1").is_dir(), "no fixture of {name} v1");
    }
    assert!(keyplan::format::all()
        .iter()
        .any(|f| f.name == "luks2-token"));
}
