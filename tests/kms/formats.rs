//! The KMS layouts' fixtures (tests/fixtures/formats/kms-*/v<N>/, src/format/kms/): each
//! version's document, written by keyplan, is loaded into its store (a file KMS directory, the
//! real OpenBao server, the real Kubernetes control plane, moto) and read by today's keyplan;
//! a rewrite (a holder recorded, then removed) reproduces today's version byte for byte
//! (files) or field for field (server documents); a document of a newer version is refused
//! with `KmsError::NewerFormat`, and the store's document is left as it was.
//!
//! `KEYPLAN_WRITE_FIXTURES=1` writes today's version's fixtures afresh (with today's keyplan,
//! against the same servers) instead of checking them: only for a new version, never over a
//! released one.

use crate::common::kube::Cluster;
use crate::common::moto::Moto;
use crate::common::openbao::OpenBao;
use crate::common::pykmip::PyKmip;

use std::path::{Path, PathBuf};

use keyplan::kms::{Kms, KmsError, VersionState};
use keyplan::secret::Passphrase;
use serde_json::{json, Value};

/// A holder id as plans write them, recorded and removed again to make keyplan rewrite a
/// layout.
const PASSING: &str = "node-z:/var/lib/keyplan";

fn pass(s: &str) -> Passphrase {
    Passphrase::new(s.as_bytes().to_vec())
}

/// `tests/fixtures/formats/<format>/v<version>/<file>`.
fn fixture_path(format: &str, version: u32, file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/formats")
        .join(format)
        .join(format!("v{version}"))
        .join(file)
}

fn fixture(format: &str, version: u32, file: &str) -> Vec<u8> {
    let path = fixture_path(format, version, file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

fn fixture_json(format: &str, version: u32, file: &str) -> Value {
    serde_json::from_slice(&fixture(format, version, file)).expect("fixture JSON")
}

/// Whether this run writes today's fixtures instead of checking them.
fn writing() -> bool {
    std::env::var_os("KEYPLAN_WRITE_FIXTURES").is_some_and(|v| v == "1")
}

fn write_fixture(format: &str, version: u32, file: &str, bytes: &[u8]) {
    let path = fixture_path(format, version, file);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("fixture dir");
    std::fs::write(&path, bytes).expect("write fixture");
    eprintln!("wrote {}", path.display());
}

/// Asserts `e` is the refusal of a newer `format` `found`, saying nothing was changed.
fn assert_newer(e: Result<impl std::fmt::Debug, KmsError>, format: &str, found: &str) {
    match e {
        Err(e @ KmsError::NewerFormat(_)) => {
            let text = e.to_string();
            assert!(text.contains(&format!("{format} format {found}")), "{text}");
            assert!(text.contains("Nothing was changed"), "{text}");
        }
        other => panic!("expected the refusal of {format} {found}, got {other:?}"),
    }
}

/// Records [`PASSING`] as a holder, then removes it: two rewrites of the layout that leave
/// its content as it was.
fn rewrite(kms: &dyn Kms, key: &str) {
    kms.hold(key, PASSING).expect("hold");
    kms.release(key, PASSING).expect("release");
}

// ---- file KMS: meta.json ----------------------------------------------------------------

/// A key directory holding `meta` as `meta.json` and material for versions 2 and 3.
fn file_key(meta: &[u8]) -> (tempfile::TempDir, keyplan::kms::file::FileKms) {
    let dir = tempfile::tempdir().expect("tempdir");
    let k = dir.path().join("k");
    std::fs::create_dir_all(&k).expect("mkdir");
    std::fs::write(k.join("meta.json"), meta).expect("meta.json");
    for v in [2, 3] {
        std::fs::write(k.join(format!("v{v}.key")), format!("passphrase-{v}")).expect("key");
    }
    let kms = keyplan::kms::file::FileKms::new("local", dir.path().to_path_buf());
    (dir, kms)
}

/// Today's `meta.json`, as keyplan writes it: v1 retired, v2 current, v3 pending, a holder
/// and its vote.
fn write_file_meta_fixture() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kms = keyplan::kms::file::FileKms::new("local", dir.path().to_path_buf());
    let mut current = None;
    for p in ["passphrase-1", "passphrase-2"] {
        let v = kms.stage("k", &pass(p), 1).expect("stage");
        kms.commit("k", current, v).expect("commit");
        current = Some(v);
    }
    kms.retire("k", 1).expect("retire");
    kms.stage("k", &pass("passphrase-3"), 1).expect("stage");
    kms.hold("k", "node-a:/var/lib/keyplan").expect("hold");
    kms.hold("k", "node-a:/var/lib/keyplan verified v3")
        .expect("vote");
    let meta = std::fs::read(dir.path().join("k/meta.json")).expect("meta.json");
    write_fixture("kms-file-meta", 1, "meta.json", &meta);
}

#[test]
fn file_meta_v1_reads_and_rewrites_byte_for_byte() {
    if writing() {
        write_file_meta_fixture();
    }
    let v1 = fixture("kms-file-meta", 1, "meta.json");
    let (dir, kms) = file_key(&v1);
    let st = kms.read("k").expect("read version 1");
    assert_eq!((st.current, st.pending), (Some(2), Some(3)));
    assert_eq!(st.versions[&1].state, VersionState::Retired);
    assert_eq!(st.versions[&2].state, VersionState::Current);
    assert_eq!(
        st.holders.keys().collect::<Vec<_>>(),
        [
            "node-a:/var/lib/keyplan",
            "node-a:/var/lib/keyplan verified v3"
        ]
    );
    rewrite(&kms, "k");
    let after = std::fs::read(dir.path().join("k/meta.json")).expect("meta.json");
    assert_eq!(
        String::from_utf8_lossy(&after),
        String::from_utf8_lossy(&v1),
        "today's meta.json differs from the version-1 fixture"
    );
}

#[test]
fn file_meta_of_a_newer_version_is_refused_and_left_alone() {
    let v2 = fixture("kms-file-meta", 2, "meta.json");
    let (dir, kms) = file_key(&v2);
    assert_newer(kms.read("k"), "kms-file-meta", "2");
    assert_newer(kms.stage("k", &pass("new"), 1), "kms-file-meta", "2");
    assert_newer(kms.hold("k", PASSING), "kms-file-meta", "2");
    assert_newer(kms.retire("k", 1), "kms-file-meta", "2");
    let text = kms.read("k").unwrap_err().to_string();
    assert!(text.contains("file KMS \"local\""), "{text}");
    assert!(text.contains("key \"k\""), "{text}");
    assert!(text.contains("meta.json"), "{text}");
    let after = std::fs::read(dir.path().join("k/meta.json")).expect("meta.json");
    assert_eq!(after, v2, "meta.json was changed");
    let mut files: Vec<String> = std::fs::read_dir(dir.path().join("k"))
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".key"))
        .collect();
    files.sort();
    assert_eq!(files, ["v2.key", "v3.key"], "a version was written");
}

// ---- Vault / OpenBao KV v2 ----------------------------------------------------------------

/// The key's main path and pending path in the fixtures' server.
const VAULT_KEY: &str = "keyplan/fixture";

fn vault(bao: &OpenBao) -> keyplan::kms::vault::VaultKms {
    let config = keyplan::spec::KmsConfig::Vault {
        address: bao.addr.clone(),
        mount: Some("secret".into()),
        token_env: Some("KEYPLAN_TEST_VAULT_TOKEN".into()),
        auth: None,
        namespace: None,
        ca_cert: None,
        timeout: None,
    };
    keyplan::kms::vault::VaultKms::new(
        "vault",
        &config,
        &bao.root_token,
        "KEYPLAN_TEST_VAULT_TOKEN",
    )
    .expect("open vault")
}

/// Writes `data` (a JSON object of strings) as a new KV version of `path`, as `bao kv put`
/// does.
fn bao_put(bao: &OpenBao, path: &str, data: &Value) {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), data.to_string()).expect("write data");
    let at = format!("@{}", file.path().display());
    bao.cli(&["kv", "put", "-mount=secret", path, &at]);
}

/// Today's layout as keyplan writes it: v1 committed then superseded by v2 (in the history),
/// a holder, v3 pending.
fn write_vault_fixture(bao: &OpenBao) {
    let kms = vault(bao);
    let mut current = None;
    for p in ["passphrase-1", "passphrase-2"] {
        let v = kms.stage(VAULT_KEY, &pass(p), 1).expect("stage");
        kms.commit(VAULT_KEY, current, v).expect("commit");
        current = Some(v);
    }
    kms.hold(VAULT_KEY, "node-a:/var/lib/keyplan")
        .expect("hold");
    kms.stage(VAULT_KEY, &pass("passphrase-3"), 1)
        .expect("stage");
    let main = bao.kv_data(VAULT_KEY, None).expect("main path");
    let pending = bao
        .kv_data(&format!("{VAULT_KEY}.keyplan-pending"), None)
        .expect("pending path");
    let text = |v: &Value| serde_json::to_vec_pretty(v).expect("json");
    write_fixture("kms-vault", 2, "main.json", &text(&main));
    write_fixture("kms-vault", 2, "pending.json", &text(&pending));
}

/// Loads version `version`'s fixture into a fresh server, reads it with today's keyplan,
/// rewrites it, and returns the main path's data afterwards.
fn vault_round_trip(version: u32) -> Option<Value> {
    let bao = OpenBao::start()?;
    bao_put(
        &bao,
        VAULT_KEY,
        &fixture_json("kms-vault", version, "main.json"),
    );
    bao_put(
        &bao,
        &format!("{VAULT_KEY}.keyplan-pending"),
        &fixture_json("kms-vault", version, "pending.json"),
    );
    let kms = vault(&bao);
    let st = kms.read(VAULT_KEY).expect("read the fixture");
    assert_eq!((st.current, st.pending), (Some(2), Some(3)), "{st:?}");
    assert!(st.holders.contains_key("node-a:/var/lib/keyplan"), "{st:?}");
    assert_eq!(
        kms.get(VAULT_KEY, 2).expect("get v2").expose(),
        b"passphrase-2"
    );
    rewrite(&kms, VAULT_KEY);
    bao.kv_data(VAULT_KEY, None)
}

#[test]
fn vault_layout_v2_reads_and_rewrites_field_for_field() {
    if writing() {
        let Some(bao) = OpenBao::start() else { return };
        write_vault_fixture(&bao);
    }
    let Some(after) = vault_round_trip(2) else {
        return;
    };
    assert_eq!(after, fixture_json("kms-vault", 2, "main.json"));
}

/// Version 1 (keyplan up to commit c322096: no `keyplan_format`) reads, and a rewrite makes it
/// version 2 with the same fields otherwise.
#[test]
fn vault_layout_v1_reads_and_is_rewritten_as_v2() {
    let v1 = fixture_json("kms-vault", 1, "main.json");
    assert!(v1.get("keyplan_format").is_none());
    let Some(after) = vault_round_trip(1) else {
        return;
    };
    assert_eq!(after, fixture_json("kms-vault", 2, "main.json"));
}

#[test]
fn vault_layout_of_a_newer_version_is_refused_and_left_alone() {
    let Some(bao) = OpenBao::start() else { return };
    bao_put(&bao, VAULT_KEY, &fixture_json("kms-vault", 3, "main.json"));
    let kms = vault(&bao);
    let before = bao.kv_metadata(VAULT_KEY).expect("metadata");
    assert_newer(kms.read(VAULT_KEY), "kms-vault", "3");
    assert_newer(kms.stage(VAULT_KEY, &pass("new"), 1), "kms-vault", "3");
    assert_newer(kms.hold(VAULT_KEY, PASSING), "kms-vault", "3");
    assert_newer(kms.destroy_key(VAULT_KEY, 2), "kms-vault", "3");
    let after = bao.kv_metadata(VAULT_KEY).expect("metadata");
    assert_eq!(after["current_version"], before["current_version"]);
    assert_eq!(
        bao.kv_data(VAULT_KEY, None),
        Some(fixture_json("kms-vault", 3, "main.json"))
    );
    assert!(bao
        .kv_data(&format!("{VAULT_KEY}.keyplan-pending"), None)
        .is_none());
}

// ---- Kubernetes Secrets --------------------------------------------------------------------

/// The Secret as a fixture: what the API server returns, without the fields it generates.
fn strip_server_fields(mut secret: Value) -> Value {
    if let Some(meta) = secret["metadata"].as_object_mut() {
        for f in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
            "namespace",
            "generation",
        ] {
            meta.remove(f);
        }
    }
    secret
}

fn kube_kms(c: &Cluster, ns: &str) -> keyplan::kms::kubernetes::KubernetesKms {
    let kc = c.kubeconfig_admin(ns);
    keyplan::kms::kubernetes::KubernetesKms::new("k8s", ns, None, Some(&kc), None)
        .expect("open kubernetes KMS")
}

/// Creates the Secret `secret` (a fixture) in namespace `ns`.
fn kube_load(c: &Cluster, ns: &str, mut secret: Value) {
    secret["metadata"]["namespace"] = json!(ns);
    c.create(&Cluster::path("secrets", ns, None), &secret);
}

fn write_kube_fixture(c: &Cluster) {
    let ns = c.fresh_namespace("fmt-write");
    let kms = kube_kms(c, &ns);
    let mut current = None;
    for p in ["passphrase-1", "passphrase-2"] {
        let v = kms.stage("osd-key", &pass(p), 1).expect("stage");
        kms.commit("osd-key", current, v).expect("commit");
        current = Some(v);
    }
    kms.retire("osd-key", 1).expect("retire");
    kms.hold("osd-key", "node-a:/var/lib/keyplan")
        .expect("hold");
    kms.stage("osd-key", &pass("passphrase-3"), 1)
        .expect("stage");
    let secret = strip_server_fields(c.secret(&ns, "osd-key").expect("secret"));
    let text = serde_json::to_vec_pretty(&secret).expect("json");
    write_fixture("kms-kubernetes", 1, "secret.json", &text);
}

#[test]
fn kubernetes_layout_v1_reads_and_rewrites_field_for_field() {
    let Some(c) = Cluster::get() else { return };
    if writing() {
        write_kube_fixture(c);
    }
    let v1 = fixture_json("kms-kubernetes", 1, "secret.json");
    let ns = c.fresh_namespace("fmt-v1");
    kube_load(c, &ns, v1.clone());
    let kms = kube_kms(c, &ns);
    let st = kms.read("osd-key").expect("read version 1");
    assert_eq!((st.current, st.pending), (Some(2), Some(3)), "{st:?}");
    assert_eq!(st.versions[&1].state, VersionState::Retired);
    assert!(st.holders.contains_key("node-a:/var/lib/keyplan"));
    assert_eq!(kms.get("osd-key", 3).expect("v3").expose(), b"passphrase-3");
    rewrite(&kms, "osd-key");
    let after = strip_server_fields(c.secret(&ns, "osd-key").expect("secret"));
    assert_eq!(
        after, v1,
        "today's Secret differs from the version-1 fixture"
    );
}

/// Fields a later keyplan adds to the annotation within version 1 survive a rewrite.
#[test]
fn kubernetes_annotation_keeps_fields_it_does_not_know() {
    let Some(c) = Cluster::get() else { return };
    let mut v1 = fixture_json("kms-kubernetes", 1, "secret.json");
    let ann = "keyplan.io/versions";
    let mut meta: Value = serde_json::from_str(
        v1["metadata"]["annotations"][ann]
            .as_str()
            .expect("annotation"),
    )
    .expect("annotation JSON");
    meta["future"] = json!({"kept": true});
    meta["versions"][0]["note"] = json!("from a later keyplan");
    v1["metadata"]["annotations"][ann] = json!(meta.to_string());
    let ns = c.fresh_namespace("fmt-extra");
    kube_load(c, &ns, v1);
    let kms = kube_kms(c, &ns);
    kms.hold("osd-key", PASSING).expect("hold");
    let secret = c.secret(&ns, "osd-key").expect("secret");
    let after: Value = serde_json::from_str(
        secret["metadata"]["annotations"][ann]
            .as_str()
            .expect("annotation"),
    )
    .expect("annotation JSON");
    assert_eq!(after["future"], json!({"kept": true}), "{after}");
    assert_eq!(after["versions"][0]["note"], json!("from a later keyplan"));
    assert!(after["holders"][PASSING].is_u64(), "{after}");
}

#[test]
fn kubernetes_layout_of_a_newer_version_is_refused_and_left_alone() {
    let Some(c) = Cluster::get() else { return };
    let v2 = fixture_json("kms-kubernetes", 2, "secret.json");
    let ns = c.fresh_namespace("fmt-v2");
    kube_load(c, &ns, v2.clone());
    let before = c.secret(&ns, "osd-key").expect("secret");
    let kms = kube_kms(c, &ns);
    assert_newer(kms.read("osd-key"), "kms-kubernetes", "2");
    assert_newer(kms.stage("osd-key", &pass("new"), 1), "kms-kubernetes", "2");
    assert_newer(kms.hold("osd-key", PASSING), "kms-kubernetes", "2");
    assert_newer(kms.commit("osd-key", Some(2), 3), "kms-kubernetes", "2");
    let after = c.secret(&ns, "osd-key").expect("secret");
    assert_eq!(
        after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"],
        "the Secret was written"
    );
    assert_eq!(strip_server_fields(after), v2);
}

// ---- AWS Secrets Manager: the record secret ------------------------------------------------

const AWS_PREFIX: &str = "fmt/";

fn aws(server: &Moto) -> Box<dyn Kms> {
    std::env::set_var("AWS_ACCESS_KEY_ID", "test");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    let config = keyplan::spec::KmsConfig::AwsSecretsManager {
        region: "us-east-1".into(),
        endpoint: Some(server.endpoint()),
        prefix: Some(AWS_PREFIX.into()),
        timeout: None,
    };
    keyplan::kms::aws::open("aws", &config).expect("open aws KMS")
}

const AWS_RECORD: &str = "fmt/k.keyplan";

/// Stages and commits v1 of key `k` (keyplan reads and rewrites the record on the way).
/// moto keeps `AWSCURRENT` on two record versions once keyplan's `keyplan-next` version was
/// made current and another writer puts a value, so the fixtures are put first, as the record
/// secret's first version, and keyplan writes on top.
fn aws_key(kms: &dyn Kms) {
    let v = kms.stage("k", &pass("passphrase-1"), 1).expect("stage");
    kms.commit("k", None, v).expect("commit");
}

#[test]
fn aws_record_v1_reads_and_rewrites_byte_for_byte() {
    let Some(server) = Moto::start() else { return };
    let kms = aws(&server);
    if writing() {
        let w = Moto::start().expect("moto");
        let kw = aws(&w);
        aws_key(kw.as_ref());
        kw.hold("k", "node-a:/var/lib/keyplan").expect("hold");
        let text = w.get(AWS_RECORD, None).expect("record");
        write_fixture("kms-aws-record", 1, "record.json", text.as_bytes());
    }
    let v1 = String::from_utf8(fixture("kms-aws-record", 1, "record.json")).expect("utf-8");
    server.put(AWS_RECORD, &v1);
    aws_key(kms.as_ref());
    let st = kms.read("k").expect("read version 1");
    assert_eq!(st.current, Some(1), "{st:?}");
    assert!(st.holders.contains_key("node-a:/var/lib/keyplan"), "{st:?}");
    assert_eq!(server.get(AWS_RECORD, None).as_deref(), Some(v1.as_str()));
    rewrite(kms.as_ref(), "k");
    assert_eq!(server.get(AWS_RECORD, None).as_deref(), Some(v1.as_str()));
}

/// Fields a later keyplan adds to the record within version 1 survive a rewrite.
#[test]
fn aws_record_keeps_fields_it_does_not_know() {
    let Some(server) = Moto::start() else { return };
    let kms = aws(&server);
    let mut v1 = fixture_json("kms-aws-record", 1, "record.json");
    v1["future"] = json!({"kept": true});
    server.put(AWS_RECORD, &v1.to_string());
    aws_key(kms.as_ref());
    kms.hold("k", PASSING).expect("hold");
    let after: Value =
        serde_json::from_str(&server.get(AWS_RECORD, None).expect("record")).expect("json");
    assert_eq!(after["future"], json!({"kept": true}), "{after}");
    assert!(after["holders"][PASSING].is_u64(), "{after}");
}

#[test]
fn aws_record_of_a_newer_version_is_refused_and_left_alone() {
    let Some(server) = Moto::start() else { return };
    let kms = aws(&server);
    let v2 = String::from_utf8(fixture("kms-aws-record", 2, "record.json")).expect("utf-8");
    server.put(AWS_RECORD, &v2);
    let record_versions = server.versions(AWS_RECORD);
    assert_newer(kms.read("k"), "kms-aws-record", "2");
    assert_newer(kms.stage("k", &pass("new"), 1), "kms-aws-record", "2");
    assert_newer(kms.hold("k", PASSING), "kms-aws-record", "2");
    assert_newer(kms.commit("k", None, 1), "kms-aws-record", "2");
    assert_eq!(server.get("fmt/k", None), None, "the key was written");
    assert_eq!(server.versions(AWS_RECORD), record_versions);
    assert_eq!(server.get(AWS_RECORD, None), Some(v2));
}

// ---- KMIP: object attributes ---------------------------------------------------------------

fn kmip(server: &PyKmip) -> keyplan::kms::kmip::KmipKms {
    keyplan::kms::kmip::KmipKms::new(
        "hsm",
        &server.endpoint(),
        &server.file("ca.crt"),
        &server.file("client.crt"),
        &server.file("client.key"),
    )
    .expect("open kmip KMS")
}

/// Today's objects as keyplan writes them: v1 deactivated (previous), v2 active (current), v3
/// pre-active (pending), a holder record.
fn write_kmip_fixture(server: &PyKmip) {
    let kms = kmip(server);
    let mut current = None;
    for p in ["passphrase-1", "passphrase-2"] {
        let v = kms.stage("k", &pass(p), 1).expect("stage");
        kms.commit("k", current, v).expect("commit");
        current = Some(v);
    }
    kms.hold("k", "node-a:/var/lib/keyplan").expect("hold");
    kms.stage("k", &pass("passphrase-3"), 1).expect("stage");
    let objs = server.layout_dump();
    let text = serde_json::to_vec_pretty(&objs).expect("json");
    write_fixture("kms-kmip", 2, "objects.json", &text);
}

/// Loads version `version`'s objects into a fresh server and reads them with today's keyplan.
fn kmip_read(version: u32) -> Option<(PyKmip, keyplan::kms::kmip::KmipKms)> {
    let server = PyKmip::start()?;
    server.layout_load(&fixture_json("kms-kmip", version, "objects.json"));
    let kms = kmip(&server);
    let st = kms.read("k").expect("read the fixture");
    assert_eq!((st.current, st.pending), (Some(2), Some(3)), "{st:?}");
    assert_eq!(st.versions[&1].state, VersionState::Previous);
    assert!(st.holders.contains_key("node-a:/var/lib/keyplan"), "{st:?}");
    assert_eq!(kms.get("k", 3).expect("v3").expose(), b"passphrase-3");
    Some((server, kms))
}

#[test]
fn kmip_layout_v2_reads_and_writes_today_s_attributes() {
    if writing() {
        let Some(server) = PyKmip::start() else {
            return;
        };
        write_kmip_fixture(&server);
    }
    let Some((server, kms)) = kmip_read(2) else {
        return;
    };
    // A new holder record and a new version are written with today's attributes.
    kms.hold("k", PASSING).expect("hold");
    let objs = server.layout_dump();
    let by_name = |n: &str| {
        objs.as_array()
            .expect("objects")
            .iter()
            .find(|o| o["name"] == n)
            .unwrap_or_else(|| panic!("no object {n}: {objs}"))
            .clone()
    };
    let holder = by_name(&format!("k/holder/{PASSING}"));
    let info = holder["info"].as_str().expect("info");
    assert!(info.starts_with("format=2;since="), "{info}");
    // The fixture's own objects are as the server keeps them, attribute for attribute.
    let want = fixture_json("kms-kmip", 2, "objects.json");
    for o in want.as_array().expect("objects") {
        assert_eq!(&by_name(o["name"].as_str().expect("name")), o);
    }
}

/// Version 1 (keyplan up to commit c322096: no `format=` pair) reads.
#[test]
fn kmip_layout_v1_reads() {
    let v1 = fixture_json("kms-kmip", 1, "objects.json");
    assert!(v1.to_string().contains("created=") && !v1.to_string().contains("format="));
    let _ = kmip_read(1);
}

#[test]
fn kmip_layout_of_a_newer_version_is_refused_and_left_alone() {
    let Some(server) = PyKmip::start() else {
        return;
    };
    server.layout_load(&fixture_json("kms-kmip", 3, "objects.json"));
    let before = server.layout_dump();
    let kms = kmip(&server);
    assert_newer(kms.read("k"), "kms-kmip", "3");
    assert_newer(kms.stage("k", &pass("new"), 1), "kms-kmip", "3");
    assert_newer(kms.commit("k", Some(2), 3), "kms-kmip", "3");
    assert_newer(kms.hold("k", PASSING), "kms-kmip", "3");
    assert_newer(kms.retire("k", 1), "kms-kmip", "3");
    assert_eq!(server.layout_dump(), before, "an object was written");
}
