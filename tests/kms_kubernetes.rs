//! The `kubernetes` KMS provider against the fake API server (tests/common/fake_apiserver.rs,
//! which follows the real API's documented semantics), and, opt-in, against a real cluster.
//! CLI tests drive the keyplan binary with plan files on LUKS image files; every device check
//! goes to cryptsetup directly and every KMS check reads the fake's stored Secrets directly
//! (an independent reader, not keyplan).

mod common;

#[path = "common/fake_apiserver.rs"]
mod fake_apiserver;
#[path = "common/kms_contract.rs"]
mod kms_contract;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;
use fake_apiserver::FakeApiserver;
use keyplan::kms::kubernetes::KubernetesKms;
use keyplan::kms::{Kms, KmsError, VersionState};
use keyplan::secret::Passphrase;
use serde_json::json;

const NS: &str = "rook-ceph";

fn pass(s: &[u8]) -> Passphrase {
    Passphrase::new(s.to_vec())
}

/// A provider handle on the fake with kubeconfig context `context`.
fn kms(fake: &FakeApiserver, context: &str) -> KubernetesKms {
    let kc = fake.kubeconfig(NS, context);
    KubernetesKms::new("k8s", NS, None, Some(&kc), None).expect("open kubernetes KMS")
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// No request was ever refused as invalid (422): keyplan never tried to change an immutable
/// Secret nor to exceed the size limit.
fn assert_no_422(fake: &FakeApiserver) {
    let bad: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.code == 422)
        .collect();
    assert!(bad.is_empty(), "requests refused with 422: {bad:?}");
}

#[test]
fn provider_contract_mutable_layout() {
    let fake = FakeApiserver::start();
    let (a, b) = (kms(&fake, "full"), kms(&fake, "full"));
    kms_contract::run(&a, &b, "contract");
    // Independent reader: the current version is data[dmcrypt-key] of the one Secret (key b
    // was rotated by the contract's holder part).
    assert_eq!(
        fake.data(NS, "contract-b", "dmcrypt-key").unwrap(),
        b"held-rotation-EEEE"
    );
    let v = fake.versions(NS, "contract-b").unwrap();
    assert_eq!(
        (v["current"].clone(), v["pending"].clone()),
        (json!(2), json!(null))
    );
    let s = fake.secret(NS, "contract-a").unwrap();
    assert_eq!(
        s["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "keyplan"
    );
    let cur = v["current"].as_u64().unwrap();
    assert!(cur >= 1);
    // one Secret per key in this layout
    assert_eq!(fake.names(NS), vec!["contract-a", "contract-b"]);
    assert_no_422(&fake);
}

/// Pre-creates the index Secret that puts key `name` into the secret-per-version layout.
fn index_secret(fake: &FakeApiserver, name: &str) {
    fake.put_secret(
        NS,
        json!({"metadata": {"name": format!("{name}-keyplan"),
            "annotations": {"keyplan.io/layout": "secret-per-version"}}}),
    );
}

#[test]
fn provider_contract_secret_per_version_layout() {
    let fake = FakeApiserver::start();
    index_secret(&fake, "imm-a");
    index_secret(&fake, "imm-b");
    let (a, b) = (kms(&fake, "full"), kms(&fake, "full"));
    kms_contract::run(&a, &b, "imm");
    // Each version lives in its own immutable Secret; the index names the current one.
    let ix = fake.versions(NS, "imm-a-keyplan").unwrap();
    let cur = ix["current"].as_u64().unwrap();
    let current_secret = fake
        .annotation(NS, "imm-a-keyplan", "keyplan.io/current-secret")
        .unwrap();
    assert_eq!(current_secret, format!("imm-a-v{cur}"));
    let s = fake.secret(NS, &current_secret).unwrap();
    assert_eq!(s["immutable"], true);
    assert_eq!(
        fake.data(NS, &current_secret, "dmcrypt-key").unwrap(),
        b"back-again-DDDD"
    );
    // Retired and destroyed versions' Secrets are gone; no material in the index.
    let names = fake.names(NS);
    assert!(!names.contains(&"imm-a-v1".to_string()), "{names:?}");
    assert!(!names.contains(&"imm-a-v10".to_string()), "{names:?}");
    assert!(fake.secret(NS, "imm-a-keyplan").unwrap()["data"].is_null());
    assert_no_422(&fake);
}

#[test]
fn adopts_an_immutable_secret_without_ever_modifying_it() {
    let fake = FakeApiserver::start();
    fake.put_secret(
        NS,
        json!({"metadata": {"name": "osd-key", "labels": {"pvc_name": "pvc0"}},
            "immutable": true, "type": "kubernetes.io/rook",
            "data": {"dmcrypt-key": b64(b"rook-original-key")}}),
    );
    let before = fake.secret(NS, "osd-key").unwrap();
    let k = kms(&fake, "full");
    let st = k.read("osd-key").unwrap();
    assert_eq!((st.current, st.pending), (Some(1), None));
    assert!(st.versions[&1].created_at > 1_600_000_000);
    assert_eq!(k.get("osd-key", 1).unwrap().expose(), b"rook-original-key");
    let v = k.stage("osd-key", &pass(b"second-version-key"), 0).unwrap();
    assert_eq!(v, 2);
    assert_eq!(
        fake.data(NS, "osd-key-v2", "dmcrypt-key").unwrap(),
        b"second-version-key"
    );
    assert_eq!(fake.secret(NS, "osd-key-v2").unwrap()["immutable"], true);
    // Until the commit, a reader following the index still sees version 1.
    assert_eq!(
        fake.annotation(NS, "osd-key-keyplan", "keyplan.io/current-secret")
            .as_deref(),
        Some("osd-key")
    );
    k.commit("osd-key", Some(1), 2).unwrap();
    assert_eq!(
        fake.annotation(NS, "osd-key-keyplan", "keyplan.io/current-secret")
            .as_deref(),
        Some("osd-key-v2")
    );
    assert_eq!(
        fake.secret(NS, "osd-key").unwrap(),
        before,
        "the immutable Secret is untouched"
    );
    let st = k.read("osd-key").unwrap();
    assert_eq!(st.versions[&1].state, VersionState::Previous);
    assert_eq!(k.get("osd-key", 1).unwrap().expose(), b"rook-original-key");
    // Retiring version 1 deletes the original Secret (deleting is allowed, changing is not).
    k.retire("osd-key", 1).unwrap();
    assert!(fake.secret(NS, "osd-key").is_none());
    assert!(matches!(
        k.get("osd-key", 1),
        Err(KmsError::NoSuchVersion { .. })
    ));
    let st = k.read("osd-key").unwrap();
    assert_eq!((st.current, st.pending), (Some(2), None));
    assert_eq!(st.versions[&1].state, VersionState::Retired);
    assert_eq!(k.get("osd-key", 2).unwrap().expose(), b"second-version-key");
    assert_no_422(&fake);
}

#[test]
fn interrupted_stage_leaves_no_stuck_version_secret() {
    // A version Secret the index does not name (a stage killed between its two writes) is
    // skipped, then removed once the index names the new version.
    let fake = FakeApiserver::start();
    index_secret(&fake, "k");
    fake.put_secret(
        NS,
        json!({"metadata": {"name": "k-v1"}, "immutable": true,
            "data": {"dmcrypt-key": b64(b"orphaned-by-a-crash")}}),
    );
    let k = kms(&fake, "full");
    assert_eq!(k.read("k").unwrap().current, None);
    let v = k.stage("k", &pass(b"fresh-material"), 1).unwrap();
    assert_eq!(v, 2);
    assert!(fake.secret(NS, "k-v1").is_none(), "orphan removed");
    assert_eq!(k.get("k", 2).unwrap().expose(), b"fresh-material");
}

#[test]
fn secret_size_limit_is_a_clear_error_and_changes_nothing() {
    let fake = FakeApiserver::start();
    // A Secret already close to the 1 MiB limit (other data kept next to the key).
    let filler = vec![b'x'; fake_apiserver::MAX_SECRET_SIZE - 30];
    fake.put_secret(
        NS,
        json!({"metadata": {"name": "big"},
            "data": {"dmcrypt-key": b64(b"current-passphrase"), "other-data": b64(&filler)}}),
    );
    let before = fake.secret(NS, "big").unwrap();
    let k = kms(&fake, "full");
    let err = k
        .stage("big", &pass(&[b'p'; 44]), 0)
        .expect_err("stage beyond 1 MiB must fail");
    let text = err.to_string();
    assert!(matches!(err, KmsError::Config { .. }), "{err:?}");
    assert!(text.contains("1048576"), "{text}");
    assert!(text.contains("1 MiB"), "{text}");
    assert!(text.contains("Secret \"big\" is invalid"), "{text}");
    assert!(text.contains("Nothing was changed"), "{text}");
    assert!(text.contains("staging v2 of key \"big\""), "{text}");
    assert_eq!(fake.secret(NS, "big").unwrap(), before);
    assert!(!text.contains("pppp"), "no material in the message");
}

#[test]
fn concurrent_writer_between_read_and_write_is_a_conflict() {
    let fake = FakeApiserver::start();
    let k = kms(&fake, "full");
    k.stage("key", &pass(b"version-one-key"), 1).unwrap();
    k.commit("key", None, 1).unwrap();
    k.stage("key", &pass(b"version-two-key"), 0).unwrap();
    // Somebody changes the Secret between the commit's read and its write.
    fake.before_write(
        |w| w.method == "PUT" && w.name == "key",
        |store| {
            store.modify(NS, "key", |s| {
                s["metadata"]["annotations"]["example.com/touched"] = json!("other-writer")
            })
        },
    );
    let err = k.commit("key", Some(1), 2).expect_err("commit must fail");
    assert!(matches!(err, KmsError::Conflict { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("nothing was overwritten"), "{text}");
    assert!(text.contains("409"), "{text}");
    // Nothing overwritten: the other writer's change stays, v1 is still current.
    assert_eq!(
        fake.annotation(NS, "key", "example.com/touched").as_deref(),
        Some("other-writer")
    );
    assert_eq!(
        fake.data(NS, "key", "dmcrypt-key").unwrap(),
        b"version-one-key"
    );
    let v = fake.versions(NS, "key").unwrap();
    assert_eq!(
        (v["current"].clone(), v["pending"].clone()),
        (json!(1), json!(2))
    );
    // A fresh attempt (the engine re-reads) succeeds and keeps the other writer's change.
    k.commit("key", Some(1), 2).unwrap();
    assert_eq!(
        fake.data(NS, "key", "dmcrypt-key").unwrap(),
        b"version-two-key"
    );
    assert_eq!(
        fake.annotation(NS, "key", "example.com/touched").as_deref(),
        Some("other-writer")
    );
    // First creation racing another creator: 409 AlreadyExists is a conflict too.
    fake.before_write(
        |w| w.method == "POST" && w.name == "fresh",
        |store| {
            store.put(
                NS,
                json!({"metadata": {"name": "fresh"}, "data": {"x": "eA=="}}),
            )
        },
    );
    let err = k
        .stage("fresh", &pass(b"abc-def-ghi"), 1)
        .expect_err("must fail");
    assert!(matches!(err, KmsError::Conflict { .. }), "{err:?}");
    assert_eq!(fake.data(NS, "fresh", "x").unwrap(), b"x");
}

#[test]
fn check_with_read_only_or_no_access_token_is_denied_naming_the_verbs() {
    let fake = FakeApiserver::start();
    let full = kms(&fake, "full");
    full.check(&["osd".to_string()])
        .expect("full access passes");
    let mark = fake.mark();
    let ro = kms(&fake, "read-only");
    let err = ro
        .check(&["osd".to_string()])
        .expect_err("read-only must fail");
    assert!(matches!(err, KmsError::Denied { .. }), "{err:?}");
    let text = err.to_string();
    for verb in ["create Secrets", "update Secret osd", "delete Secret osd"] {
        assert!(text.contains(verb), "{verb}: {text}");
    }
    assert!(!text.contains("get Secret osd"), "{text}");
    assert!(text.contains("namespace rook-ceph"), "{text}");
    // check wrote nothing: only reads and access reviews.
    for r in fake.requests_since(mark) {
        assert!(!r.is_secret_write(), "check wrote: {r:?}");
    }
    let none = kms(&fake, "no-access");
    let err = none
        .check(&["osd".to_string()])
        .expect_err("no access must fail");
    assert!(matches!(err, KmsError::Denied { .. }), "{err:?}");
    assert!(err.to_string().contains("403 Forbidden"), "{err}");
    assert!(err.to_string().contains("cannot get resource"), "{err}");
    // A write with the read-only token is Denied with the server's message.
    let err = ro
        .stage("osd", &pass(b"some-material"), 1)
        .expect_err("must fail");
    assert!(matches!(err, KmsError::Denied { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("cannot create resource \"secrets\""),
        "{err}"
    );
}

#[test]
fn bad_credentials_are_denied() {
    let fake = FakeApiserver::start();
    let k = kms(&fake, "bad-token");
    let err = k.read("osd").expect_err("must fail");
    assert!(matches!(err, KmsError::Denied { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("401"), "{text}");
    assert!(text.contains(&fake.url()), "{text}");
    assert!(
        !text.contains("kp-not-a-valid-token"),
        "token in message: {text}"
    );
}

#[test]
fn server_down_is_unavailable_naming_the_address() {
    let mut fake = FakeApiserver::start();
    let k = kms(&fake, "full");
    let url = fake.url();
    fake.stop();
    let t = std::time::Instant::now();
    let err = k.read("osd").expect_err("must fail");
    assert!(matches!(err, KmsError::Unavailable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&url), "{text}");
    assert!(text.contains("reading Secret rook-ceph/osd"), "{text}");
    assert!(t.elapsed().as_secs() < 20, "bounded retries");
    let err = k
        .stage("osd", &pass(b"material-x"), 1)
        .expect_err("must fail");
    assert!(matches!(err, KmsError::Unavailable { .. }), "{err:?}");
}

#[test]
fn invalid_names_are_config_errors() {
    let fake = FakeApiserver::start();
    let k = kms(&fake, "full");
    let err = k.read("Data_Kek").expect_err("must fail");
    assert!(matches!(err, KmsError::Config { .. }), "{err:?}");
    assert!(err.to_string().contains("DNS-1123"), "{err}");
    let kc = fake.kubeconfig(NS, "full");
    let err = KubernetesKms::new("k8s", NS, Some("keyplan.v3"), Some(&kc), None).unwrap_err();
    assert!(matches!(err, KmsError::Config { .. }), "{err:?}");
    let err = KubernetesKms::new("k8s", "Rook_Ceph", None, Some(&kc), None).unwrap_err();
    assert!(matches!(err, KmsError::Config { .. }), "{err:?}");
    let err = KubernetesKms::new(
        "k8s",
        NS,
        None,
        Some(Path::new("/nonexistent/kubeconfig")),
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/kubeconfig"), "{err}");
    assert_eq!(
        k.describe(),
        format!(
            "kubernetes KMS \"k8s\" ({}, namespace rook-ceph)",
            fake.url()
        )
    );
}

/// Opt-in: the contract against a real cluster (`KUBECONFIG` and
/// `KEYPLAN_K8S_REAL_NAMESPACE`, a namespace where the credentials may get, create, update
/// and delete Secrets). The Secrets it creates are deleted at the end.
#[test]
fn provider_contract_real_cluster() {
    let (Some(ns), Some(_)) = (
        std::env::var_os("KEYPLAN_K8S_REAL_NAMESPACE"),
        std::env::var_os("KUBECONFIG"),
    ) else {
        eprintln!("skipped: set KUBECONFIG and KEYPLAN_K8S_REAL_NAMESPACE to run the contract against a real cluster");
        return;
    };
    let ns = ns.to_string_lossy().into_owned();
    let a = KubernetesKms::new("real", &ns, None, None, None).expect("open");
    let b = KubernetesKms::new("real", &ns, None, None, None).expect("open");
    let prefix = format!(
        "keyplan-contract-{}-{}",
        std::process::id(),
        keyplan::clock::now_unix()
    );
    kms_contract::run(&a, &b, &prefix);
    for key in [format!("{prefix}-a"), format!("{prefix}-b")] {
        if let Some(cur) = a.read(&key).ok().and_then(|s| s.current) {
            a.destroy_key(&key, cur).expect("cleanup");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CLI tests

const KEY_SECRET: &str = "rook-ceph-osd-encryption-key-pvc0";

fn k8s_plan(devices: &str, extra_kms: &str) -> String {
    format!(
        "version: 1\nkms:\n  k8s:\n    provider: kubernetes\n    namespace: {NS}\n{extra_kms}keys:\n  osd-kek:\n    kms: k8s\n    name: {KEY_SECRET}\ndevices:\n{devices}{FAST_PBKDF}"
    )
}

fn device(id: &str, file: &str) -> String {
    format!("  {id}:\n    path: {file}\n    keys: [osd-kek]\n    enroll_with: initial.pass\n")
}

/// Runs keyplan in `dir` with `KUBECONFIG=kubeconfig`.
fn keyplan_k8s(dir: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    assert_cmd::Command::cargo_bin("keyplan")
        .expect("binary")
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()
        .expect("run keyplan")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs keyplan watched (`w`) with `KUBECONFIG=kc`, remembers every Secret value the fake now
/// holds as a secret to look for, and asserts exit status `code`; stdout + stderr.
fn run_watched(
    w: &Watched,
    fake: &FakeApiserver,
    kc: &std::path::Path,
    args: &[&str],
    code: i32,
) -> String {
    let out = w
        .command(args)
        .env("KUBECONFIG", kc)
        .output()
        .expect("run keyplan");
    w.record(&out);
    for d in fake.all_data() {
        w.add_secret(&d);
    }
    expect(&out, code, args)
}

fn expect(out: &Output, code: i32, args: &[&str]) -> String {
    let t = text(out);
    eprintln!("--- keyplan {args:?} (exit {:?})\n{t}", out.status.code());
    assert_eq!(out.status.code(), Some(code), "keyplan {args:?}:\n{t}");
    t
}

/// Three devices (two LUKS2, one LUKS1) sharing key osd-kek in the fake.
fn setup_devices(s: &Scratch) -> Vec<PathBuf> {
    s.initial_pass();
    let devs = vec![
        s.image("block.img", "luks2"),
        s.image("db.img", "luks2"),
        s.image("legacy.img", "luks1"),
    ];
    let devices =
        device("block", "block.img") + &device("db", "db.img") + &device("legacy", "legacy.img");
    s.plan("keyplan.yaml", &k8s_plan(&devices, ""));
    devs
}

#[test]
fn e2e_enroll_rotate_retire_with_an_independent_reader() {
    let fake = FakeApiserver::start();
    let kc = fake.kubeconfig(NS, "full");
    let w = Watched::new();
    let devs = setup_devices(&w.s);
    w.add_secret(fake.full_token.as_bytes());
    let run = |args: &[&str], code: i32| run_watched(&w, &fake, &kc, args, code);
    let current = || {
        fake.data(NS, KEY_SECRET, "dmcrypt-key")
            .expect("current in data[dmcrypt-key]")
    };

    // plan writes nothing (I6)
    let mark = fake.mark();
    let out = run(&["plan", "--detailed-exitcode"], 2);
    assert!(out.contains("+ key osd-kek v1"), "{out}");
    assert!(fake
        .requests_since(mark)
        .iter()
        .all(|r| !r.is_secret_write()));
    assert!(fake.secret(NS, KEY_SECRET).is_none());

    // enroll
    run(&["apply", "--auto-approve"], 0);
    let v1 = current();
    assert_eq!(v1.len(), 44, "32 random bytes as base64");
    let meta = fake.versions(NS, KEY_SECRET).unwrap();
    assert_eq!(
        (meta["current"].clone(), meta["pending"].clone()),
        (json!(1), json!(null))
    );
    for d in &devs {
        assert!(opens(d, &v1, None), "v1 opens {}", d.display());
    }

    // rotate: v2 current, v1 kept as previous (retention keeps one previous version)
    run(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    let v2 = current();
    assert_ne!(v1, v2);
    assert_eq!(fake.data(NS, KEY_SECRET, "keyplan.v1").unwrap(), v1);
    for d in &devs {
        assert!(opens(d, &v2, None), "v2 opens {}", d.display());
        assert!(!opens(d, &v1, None), "v1 opens nothing on {}", d.display());
    }

    // rotate again: v3 current, v2 previous, v1 retired (material gone from the Secret)
    run(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    let v3 = current();
    assert!(v3 != v1 && v3 != v2);
    let meta = fake.versions(NS, KEY_SECRET).unwrap();
    assert_eq!(
        (meta["current"].clone(), meta["pending"].clone()),
        (json!(3), json!(null))
    );
    let states: Vec<(u64, String)> = meta["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["version"].as_u64().unwrap(),
                v["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        states,
        vec![
            (1, "retired".into()),
            (2, "previous".into()),
            (3, "current".into())
        ]
    );
    assert!(
        fake.data(NS, KEY_SECRET, "keyplan.v1").is_none(),
        "v1 material destroyed"
    );
    assert_eq!(fake.data(NS, KEY_SECRET, "keyplan.v2").unwrap(), v2);
    for d in &devs {
        assert!(opens(d, &v3, None), "v3 opens {}", d.display());
        assert!(
            !opens(d, &v2, None) && !opens(d, &v1, None),
            "old versions open nothing"
        );
        assert!(opens(d, INITIAL, Some(0)), "unmanaged keyslot 0 kept");
    }

    let mark = fake.mark();
    run(&["plan", "--detailed-exitcode"], 0);
    assert!(fake
        .requests_since(mark)
        .iter()
        .all(|r| !r.is_secret_write()));

    // break-glass read through keyplan matches the independent reader
    let out = w
        .command(&["key", "get", "osd-kek"])
        .env("KUBECONFIG", &kc)
        .output()
        .expect("key get");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(out.stdout, v3);
    // (not recorded: its stdout is the key by design)

    assert_no_422(&fake);
    assert!(w.wrapper_saw_calls());
    w.assert_no_leaks();
}

#[test]
fn adopts_a_rook_secret_and_rotates_it() {
    let fake = FakeApiserver::start();
    let kc = fake.kubeconfig(NS, "full");
    let s = Scratch::new();
    s.initial_pass();
    let dev = s.image("block.img", "luks2");
    // What Rook creates: only data[dmcrypt-key] (the passphrase the device opens with today).
    fake.put_secret(
        NS,
        json!({"metadata": {"name": KEY_SECRET, "labels": {"pvc_name": "pvc0"},
                "ownerReferences": [{"apiVersion": "ceph.rook.io/v1", "kind": "CephCluster",
                    "name": "rook-ceph", "uid": "c0ffee00-0000-4000-8000-000000000001"}]},
            "type": "kubernetes.io/rook",
            "data": {"dmcrypt-key": b64(INITIAL)}}),
    );
    let dev_yaml = "  block:\n    path: block.img\n    keys: [osd-kek]\n    enroll_with: initial.pass\n    unmanaged_keyslots: remove\n";
    s.plan("keyplan.yaml", &k8s_plan(dev_yaml, ""));
    let run = |args: &[&str], code: i32| expect(&keyplan_k8s(s.dir.path(), &kc, args), code, args);
    let out = run(&["plan"], 0);
    assert!(
        !out.contains("+ key osd-kek"),
        "the Rook key is adopted as v1: {out}"
    );
    run(&["apply", "--auto-approve"], 0);
    assert_eq!(
        fake.data(NS, KEY_SECRET, "dmcrypt-key").unwrap(),
        INITIAL,
        "v1 = Rook's key"
    );
    run(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    let v2 = fake.data(NS, KEY_SECRET, "dmcrypt-key").unwrap();
    assert_ne!(v2, INITIAL);
    assert_eq!(fake.data(NS, KEY_SECRET, "keyplan.v1").unwrap(), INITIAL);
    assert!(opens(&dev, &v2, None));
    assert!(!opens(&dev, INITIAL, None), "Rook's old key opens nothing");
    // Rook's metadata is kept.
    let sec = fake.secret(NS, KEY_SECRET).unwrap();
    assert_eq!(sec["type"], "kubernetes.io/rook");
    assert_eq!(sec["metadata"]["labels"]["pvc_name"], "pvc0");
    assert_eq!(sec["metadata"]["ownerReferences"][0]["kind"], "CephCluster");
    run(&["plan", "--detailed-exitcode"], 0);
    assert_no_422(&fake);
}

#[test]
fn cli_conflict_between_stage_and_commit_then_resume() {
    let fake = FakeApiserver::start();
    let kc = fake.kubeconfig(NS, "full");
    let s = Scratch::new();
    let devs = setup_devices(&s);
    let run = |args: &[&str], code: i32| expect(&keyplan_k8s(s.dir.path(), &kc, args), code, args);
    run(&["apply", "--auto-approve"], 0);
    let v1 = fake.data(NS, KEY_SECRET, "dmcrypt-key").unwrap();
    // Another writer touches the Secret right before keyplan's commit (the PUT that makes v2
    // current).
    fake.before_write(
        |w| {
            w.method == "PUT"
                && w.name == KEY_SECRET
                && w.body["metadata"]["annotations"]["keyplan.io/versions"]
                    .as_str()
                    .is_some_and(|t| t.contains("\"current\":2"))
        },
        |store| {
            store.modify(NS, KEY_SECRET, |s| {
                s["metadata"]["annotations"]["example.com/touched"] = json!("other-writer")
            })
        },
    );
    let out = run(&["apply", "--auto-approve", "--rotate", "osd-kek"], 1);
    assert!(out.contains("changed concurrently"), "{out}");
    assert!(out.contains("nothing was overwritten"), "{out}");
    // Nothing overwritten; v1 still current in the KMS and still opens every device (I1).
    assert_eq!(
        fake.annotation(NS, KEY_SECRET, "example.com/touched")
            .as_deref(),
        Some("other-writer")
    );
    assert_eq!(fake.data(NS, KEY_SECRET, "dmcrypt-key").unwrap(), v1);
    let meta = fake.versions(NS, KEY_SECRET).unwrap();
    assert_eq!(
        (meta["current"].clone(), meta["pending"].clone()),
        (json!(1), json!(2))
    );
    for d in &devs {
        assert!(opens(d, &v1, None), "v1 still opens {}", d.display());
    }
    // The next apply finishes the interrupted run (I3).
    run(&["apply", "--auto-approve"], 0);
    let v2 = fake.data(NS, KEY_SECRET, "dmcrypt-key").unwrap();
    assert_ne!(v1, v2);
    for d in &devs {
        assert!(opens(d, &v2, None));
        assert!(!opens(d, &v1, None));
    }
    assert_eq!(
        fake.annotation(NS, KEY_SECRET, "example.com/touched")
            .as_deref(),
        Some("other-writer")
    );
    run(&["plan", "--detailed-exitcode"], 0);
}

#[test]
fn cli_read_only_token_fails_before_touching_devices() {
    let fake = FakeApiserver::start();
    let kc = fake.kubeconfig(NS, "read-only");
    let s = Scratch::new();
    let devs = setup_devices(&s);
    let snap = Snapshot::take(&devs);
    let args = ["apply", "--auto-approve"];
    let out = expect(&keyplan_k8s(s.dir.path(), &kc, &args), 1, &args);
    // `plan` checks the KMS (a SelfSubjectAccessReview) before anything is staged.
    assert!(
        out.contains("failed its check; no device was touched"),
        "{out}"
    );
    assert!(out.contains("may not create Secrets"), "{out}");
    snap.assert_unchanged("apply with a read-only token");
    assert!(fake.names(NS).is_empty());
}

#[test]
fn cli_server_down_is_unavailable_and_touches_nothing() {
    let mut fake = FakeApiserver::start();
    let kc = fake.kubeconfig(NS, "full");
    let url = fake.url();
    fake.stop();
    let s = Scratch::new();
    let devs = setup_devices(&s);
    let snap = Snapshot::take(&devs);
    // `plan` could not check (exit 3), `apply` could not run (exit 1).
    for (args, code) in [(&["plan"][..], 3), (&["apply", "--auto-approve"][..], 1)] {
        let out = expect(&keyplan_k8s(s.dir.path(), &kc, args), code, args);
        assert!(out.contains("unavailable"), "{out}");
        assert!(out.contains(&url), "names the address: {out}");
    }
    snap.assert_unchanged("apply with the API server down");
}

#[test]
fn cli_bad_credentials_are_denied() {
    let fake = FakeApiserver::start();
    let kc = fake.kubeconfig(NS, "bad-token");
    let s = Scratch::new();
    let devs = setup_devices(&s);
    let snap = Snapshot::take(&devs);
    let args = ["apply", "--auto-approve"];
    let out = expect(&keyplan_k8s(s.dir.path(), &kc, &args), 1, &args);
    assert!(out.contains("refused"), "{out}");
    assert!(out.contains("401"), "{out}");
    assert!(!out.contains("kp-not-a-valid-token"), "{out}");
    snap.assert_unchanged("apply with bad credentials");
}

#[test]
fn destroy_key_is_compare_and_swap_and_spares_foreign_data() {
    let fake = FakeApiserver::start();
    let k = kms(&fake, "full");
    k.stage("gone", &pass(b"material-of-gone"), 1).unwrap();
    k.commit("gone", None, 1).unwrap();
    // A writer changes the Secret between destroy_key's read and its DELETE: the
    // resourceVersion precondition makes the DELETE fail, and nothing is deleted.
    fake.before_write(
        |w| w.method == "DELETE" && w.name == "gone",
        |store| {
            store.modify(NS, "gone", |s| {
                s["metadata"]["labels"]["example.com/touched"] = json!("yes")
            })
        },
    );
    let err = k.destroy_key("gone", 1).expect_err("must fail");
    assert!(matches!(err, KmsError::Conflict { .. }), "{err:?}");
    assert!(err.to_string().contains("Precondition failed"), "{err}");
    assert_eq!(
        fake.data(NS, "gone", "dmcrypt-key").unwrap(),
        b"material-of-gone"
    );
    k.destroy_key("gone", 1).unwrap();
    assert!(fake.secret(NS, "gone").is_none());

    // A Secret that also holds other data keeps it; only keyplan's part goes.
    fake.put_secret(
        NS,
        json!({"metadata": {"name": "shared"},
            "data": {"dmcrypt-key": b64(b"rook-key-xyz"), "other": b64(b"keep me")}}),
    );
    k.stage("shared", &pass(b"second-key-xyz"), 0).unwrap();
    k.commit("shared", Some(1), 2).unwrap();
    k.destroy_key("shared", 2).unwrap();
    let s = fake.secret(NS, "shared").unwrap();
    assert_eq!(fake.data(NS, "shared", "other").unwrap(), b"keep me");
    assert_eq!(s["data"].as_object().unwrap().len(), 1, "{s}");
    assert!(s["metadata"]["annotations"]["keyplan.io/versions"].is_null());
    let st = k.read("shared").unwrap();
    assert_eq!((st.current, st.pending), (None, None));
}

/// A service-account token (a JWT) that expires before the next rotation is due plus 14 days:
/// `status` reports its `exp` as the credential's expiry, calls it a problem (exit 1) and
/// exports it; `plan` warns. A token file outside the pod's projected path is nobody's to
/// refresh, so its `exp` is the deadline.
#[test]
fn status_warns_about_a_service_account_token_that_expires_before_the_next_rotation() {
    use base64::Engine as _;
    let fake = FakeApiserver::start();
    let w = Watched::new();
    let _devs = setup_devices(&w.s);
    w.s.plan(
        "keyplan.yaml",
        &std::fs::read_to_string(w.s.path("keyplan.yaml"))
            .unwrap()
            .replace("    kms: k8s\n", "    kms: k8s\n    rotate_after: 30d\n"),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let exp = now + 3 * 86_400;
    let b64 = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let jwt = format!(
        "{}.{}.c2lnbmF0dXJl",
        b64.encode(r#"{"alg":"RS256","kid":"k"}"#),
        b64.encode(format!(
            r#"{{"iss":"https://kubernetes.default.svc","sub":"system:serviceaccount:{NS}:keyplan","exp":{exp}}}"#
        ))
    );
    fake.add_token(
        &jwt,
        &format!("system:serviceaccount:{NS}:keyplan"),
        fake_apiserver::Access::Full,
    );
    // Outside the scratch directory, whose files the leak check scans for the token.
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("sa-token");
    std::fs::write(&token_file, &jwt).unwrap();
    let kc = fake.kubeconfig_with_token_file(NS, &token_file);
    w.add_secret(jwt.as_bytes());
    let run = |args: &[&str], code: i32| run_watched(&w, &fake, &kc, args, code);

    let out = run(&["apply", "--auto-approve"], 0);
    assert!(
        out.contains("service-account token") && out.contains("expires at"),
        "{out}"
    );
    assert!(
        fake.data(NS, KEY_SECRET, "dmcrypt-key").is_some(),
        "the token works"
    );
    let out = w
        .command(&["status", "--format", "json"])
        .env("KUBECONFIG", &kc)
        .output()
        .unwrap();
    w.record(&out);
    assert_eq!(out.status.code(), Some(1));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let c = &j["kms"][0]["credentials"][0];
    assert_eq!(c["kind"], "service_account_token", "{j:#}");
    assert_eq!(c["expires_at"], exp);
    assert_eq!(c["deadline"], exp);
    assert_eq!(c["renewed_by"], serde_json::Value::Null);
    assert_eq!(c["expiring"], true);
    assert!(
        j["problems"]
            .to_string()
            .contains("KMS k8s: service-account token"),
        "{j:#}"
    );
    let prom = run(&["status", "--format", "prometheus"], 1);
    assert!(prom.contains(&format!(
        r#"keyplan_kms_credential_deadline_timestamp_seconds{{kms="k8s",credential="service_account_token"}} {exp}"#
    )));
    let out = run(&["plan"], 0);
    assert!(
        out.contains("WARN") && out.contains("service-account token"),
        "{out}"
    );
    w.assert_no_leaks();
}

/// A kubeconfig (outside the scratch directory's scans: beside it) whose cluster is `addr`, an
/// API server that accepts connections and never answers.
fn silent_kubeconfig(dir: &Path, addr: &str) -> PathBuf {
    let path = dir.join("silent-kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: silent\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: silent\n  context:\n    cluster: silent\n    user: u\n    namespace: {NS}\nusers:\n- name: u\n  user:\n    token: kp-silent-token\ncurrent-context: silent\n"
        ),
    )
    .expect("write kubeconfig");
    path
}

/// An API server that accepts connections and never answers, holding three keys (issue 29):
/// `status` ends within the KMS's `timeout` (2 s here, with generous slack) with exit 3 naming
/// the KMS and the deadline, `plan` and `verify` with exit 3 and an error naming both.
#[test]
fn a_kubernetes_kms_that_never_answers_is_bounded() {
    let (_silent, addr) = silent_listener();
    let kube_dir = tempfile::tempdir().expect("tempdir");
    let kc = silent_kubeconfig(kube_dir.path(), &addr);
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  k8s: {{ provider: kubernetes, namespace: {NS}, timeout: 2s }}\nkeys:\n  a: {{ kms: k8s }}\n  b: {{ kms: k8s }}\n  c: {{ kms: k8s }}\ndevices:\n  d: {{ path: a.img, keys: [a], enroll_with: initial.pass }}\n{FAST_PBKDF}"
        ),
    );
    let kc_text = kc.display().to_string();
    assert_silent_kms_bounded(
        s.dir.path(),
        &[("KUBECONFIG", kc_text.as_str())],
        r#"kubernetes KMS "k8s""#,
        2,
        std::time::Duration::from_secs(12),
    );
}

/// `keyplan fleet status` against an API server that never answers ends within its bound
/// (`fleet::status::READ_TIMEOUT`, 20 s, with slack) with exit 3, saying the API server did
/// not answer in time, instead of waiting for the client's per-read timeouts list after list.
#[test]
fn fleet_status_against_a_silent_api_server_is_bounded() {
    let (_silent, addr) = silent_listener();
    let kube_dir = tempfile::tempdir().expect("tempdir");
    let kc = silent_kubeconfig(kube_dir.path(), &addr);
    let (out, took) = keyplan_timed(
        kube_dir.path(),
        &[
            "fleet",
            "status",
            "--namespace",
            NS,
            "--kubeconfig",
            &kc.display().to_string(),
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(took < std::time::Duration::from_secs(45), "took {took:?}");
    assert!(err.contains("did not answer in time"), "{err}");
}
