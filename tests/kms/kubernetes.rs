//! The `kubernetes` KMS provider against a real Kubernetes control plane (etcd +
//! kube-apiserver of tests/common/kube.rs, real ServiceAccounts, RBAC and TokenRequest
//! tokens), and, opt-in, against a cluster of the user's. Every test works in its own fresh
//! namespace; keyplan talks to the API server through the logging proxy of
//! tests/common/kube_proxy.rs (its request log, and its hook for a concurrent writer between
//! keyplan's read and write). CLI tests drive the keyplan binary with plan files on LUKS image
//! files; every device check goes to cryptsetup directly and every KMS check reads the Secrets
//! from the API server as admin (an independent reader, not keyplan). Skipped when the
//! control plane's binaries are missing (failed with KEYPLAN_REQUIRE_SERVERS=1).

use crate::common::kms_contract;
use crate::common::kube;
use crate::common::kube_proxy;

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::*;
use keyplan::kms::kubernetes::KubernetesKms;
use keyplan::kms::{Kms, KmsError, VersionState};
use keyplan::secret::Passphrase;
use kube::Cluster;
use kube_proxy::{KubeProxy, Request};
use serde_json::{json, Value};

/// The namespace of tests that never reach an API server (silent listeners).
const NS: &str = "rook-ceph";

fn pass(s: &[u8]) -> Passphrase {
    Passphrase::new(s.to_vec())
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// One test's place on the real cluster: a fresh namespace (with the identities of
/// [`Cluster::users`]) and a logging proxy in front of the API server. keyplan talks through
/// the proxy; checks read the cluster directly as admin.
struct Kube {
    c: &'static Cluster,
    ns: String,
    proxy: KubeProxy,
}

impl Kube {
    /// `None` (the test is skipped) when the control plane's binaries are missing.
    fn new(prefix: &str) -> Option<Kube> {
        let c = Cluster::get()?;
        let ns = c.fresh_namespace(prefix);
        Some(Kube {
            c,
            ns,
            proxy: KubeProxy::start(c),
        })
    }

    /// The URL keyplan is given (the proxy's).
    fn url(&self) -> String {
        self.proxy.url().to_string()
    }

    /// A kubeconfig through the proxy, context `context` current, namespace the test's.
    fn kubeconfig(&self, context: &str) -> PathBuf {
        self.proxy.kubeconfig(&self.ns, context)
    }

    /// A provider handle with kubeconfig context `context`.
    fn kms(&self, context: &str) -> KubernetesKms {
        let kc = self.kubeconfig(context);
        KubernetesKms::new("k8s", &self.ns, None, Some(&kc), None).expect("open kubernetes KMS")
    }

    fn secret(&self, name: &str) -> Option<Value> {
        self.c.secret(&self.ns, name)
    }

    fn data(&self, name: &str, key: &str) -> Option<Vec<u8>> {
        self.c.data(&self.ns, name, key)
    }

    fn annotation(&self, name: &str, ann: &str) -> Option<String> {
        self.c.annotation(&self.ns, name, ann)
    }

    fn versions(&self, name: &str) -> Option<Value> {
        self.c.versions(&self.ns, name)
    }

    fn names(&self) -> Vec<String> {
        self.c.names(&self.ns)
    }

    fn put_secret(&self, secret: Value) {
        self.c.put_secret(&self.ns, secret)
    }

    /// Runs `action` (with the cluster and the namespace; it writes as admin, another client)
    /// right before the proxy forwards keyplan's first Secret write `method` of Secret `name`
    /// for which `also` holds.
    fn before_write(
        &self,
        method: &'static str,
        name: &'static str,
        mut also: impl FnMut(&Request<'_>) -> bool + Send + 'static,
        action: impl FnOnce(&Cluster, &str) + Send + 'static,
    ) {
        let (c, ns, ns2) = (self.c, self.ns.clone(), self.ns.clone());
        self.proxy.before_write(
            move |r| r.method == method && r.is_secret_write(&ns, name) && also(r),
            move || action(c, &ns2),
        );
    }

    /// No request was ever refused as invalid (422): keyplan never tried to change an
    /// immutable Secret nor to exceed the size limit.
    fn assert_no_422(&self) {
        let bad: Vec<_> = self
            .proxy
            .requests()
            .into_iter()
            .filter(|r| r.code == 422)
            .collect();
        assert!(bad.is_empty(), "requests refused with 422: {bad:?}");
    }
}

#[test]
fn provider_contract_mutable_layout() {
    let Some(kube) = Kube::new("contract") else {
        return;
    };
    let (a, b) = (kube.kms("full"), kube.kms("full"));
    kms_contract::run(&a, &b, "contract");
    // Independent reader: the current version is data[dmcrypt-key] of the one Secret (key b
    // was rotated by the contract's holder part).
    assert_eq!(
        kube.data("contract-b", "dmcrypt-key").unwrap(),
        b"held-rotation-EEEE"
    );
    let v = kube.versions("contract-b").unwrap();
    assert_eq!(
        (v["current"].clone(), v["pending"].clone()),
        (json!(2), json!(null))
    );
    let s = kube.secret("contract-a").unwrap();
    assert_eq!(
        s["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "keyplan"
    );
    let cur = v["current"].as_u64().unwrap();
    assert!(cur >= 1);
    // one Secret per key in this layout
    assert_eq!(kube.names(), vec!["contract-a", "contract-b"]);
    kube.assert_no_422();
}

/// Pre-creates the index Secret that puts key `name` into the secret-per-version layout.
fn index_secret(kube: &Kube, name: &str) {
    kube.put_secret(json!({"metadata": {"name": format!("{name}-keyplan"),
        "annotations": {"keyplan.io/layout": "secret-per-version"}}}));
}

#[test]
fn provider_contract_secret_per_version_layout() {
    let Some(kube) = Kube::new("imm") else { return };
    index_secret(&kube, "imm-a");
    index_secret(&kube, "imm-b");
    let (a, b) = (kube.kms("full"), kube.kms("full"));
    kms_contract::run(&a, &b, "imm");
    // Each version lives in its own immutable Secret; the index names the current one.
    let ix = kube.versions("imm-a-keyplan").unwrap();
    let cur = ix["current"].as_u64().unwrap();
    let current_secret = kube
        .annotation("imm-a-keyplan", "keyplan.io/current-secret")
        .unwrap();
    assert_eq!(current_secret, format!("imm-a-v{cur}"));
    let s = kube.secret(&current_secret).unwrap();
    assert_eq!(s["immutable"], true);
    assert_eq!(
        kube.data(&current_secret, "dmcrypt-key").unwrap(),
        b"back-again-DDDD"
    );
    // Retired and destroyed versions' Secrets are gone; no material in the index.
    let names = kube.names();
    assert!(!names.contains(&"imm-a-v1".to_string()), "{names:?}");
    assert!(!names.contains(&"imm-a-v10".to_string()), "{names:?}");
    assert!(kube.secret("imm-a-keyplan").unwrap()["data"].is_null());
    kube.assert_no_422();
}

#[test]
fn adopts_an_immutable_secret_without_ever_modifying_it() {
    let Some(kube) = Kube::new("adopt-immutable") else {
        return;
    };
    kube.put_secret(
        json!({"metadata": {"name": "osd-key", "labels": {"pvc_name": "pvc0"}},
        "immutable": true, "type": "kubernetes.io/rook",
        "data": {"dmcrypt-key": b64(b"rook-original-key")}}),
    );
    let before = kube.secret("osd-key").unwrap();
    // The real API server refuses any change of an immutable Secret's data (what keyplan must
    // never try): proven here, so the test below means something.
    let mut change = before.clone();
    change["data"]["dmcrypt-key"] = json!(b64(b"changed"));
    let r = kube.c.put(
        &Cluster::path("secrets", &kube.ns, Some("osd-key")),
        &change,
    );
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(
        r.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("immutable")),
        "{}",
        r.body
    );
    let k = kube.kms("full");
    let st = k.read("osd-key").unwrap();
    assert_eq!((st.current, st.pending), (Some(1), None));
    assert!(st.versions[&1].created_at > 1_600_000_000);
    assert_eq!(k.get("osd-key", 1).unwrap().expose(), b"rook-original-key");
    let v = k.stage("osd-key", &pass(b"second-version-key"), 0).unwrap();
    assert_eq!(v, 2);
    assert_eq!(
        kube.data("osd-key-v2", "dmcrypt-key").unwrap(),
        b"second-version-key"
    );
    assert_eq!(kube.secret("osd-key-v2").unwrap()["immutable"], true);
    // Until the commit, a reader following the index still sees version 1.
    assert_eq!(
        kube.annotation("osd-key-keyplan", "keyplan.io/current-secret")
            .as_deref(),
        Some("osd-key")
    );
    k.commit("osd-key", Some(1), 2).unwrap();
    assert_eq!(
        kube.annotation("osd-key-keyplan", "keyplan.io/current-secret")
            .as_deref(),
        Some("osd-key-v2")
    );
    assert_eq!(
        kube.secret("osd-key").unwrap(),
        before,
        "the immutable Secret is untouched"
    );
    let st = k.read("osd-key").unwrap();
    assert_eq!(st.versions[&1].state, VersionState::Previous);
    assert_eq!(k.get("osd-key", 1).unwrap().expose(), b"rook-original-key");
    // Retiring version 1 deletes the original Secret (deleting is allowed, changing is not).
    k.retire("osd-key", 1).unwrap();
    assert!(kube.secret("osd-key").is_none());
    assert!(matches!(
        k.get("osd-key", 1),
        Err(KmsError::NoSuchVersion { .. })
    ));
    let st = k.read("osd-key").unwrap();
    assert_eq!((st.current, st.pending), (Some(2), None));
    assert_eq!(st.versions[&1].state, VersionState::Retired);
    assert_eq!(k.get("osd-key", 2).unwrap().expose(), b"second-version-key");
    kube.assert_no_422();
}

#[test]
fn interrupted_stage_leaves_no_stuck_version_secret() {
    // A version Secret the index does not name (a stage killed between its two writes) is
    // skipped, then removed once the index names the new version.
    let Some(kube) = Kube::new("interrupted") else {
        return;
    };
    index_secret(&kube, "k");
    kube.put_secret(json!({"metadata": {"name": "k-v1"}, "immutable": true,
        "data": {"dmcrypt-key": b64(b"orphaned-by-a-crash")}}));
    let k = kube.kms("full");
    assert_eq!(k.read("k").unwrap().current, None);
    let v = k.stage("k", &pass(b"fresh-material"), 1).unwrap();
    assert_eq!(v, 2);
    assert!(kube.secret("k-v1").is_none(), "orphan removed");
    assert_eq!(k.get("k", 2).unwrap().expose(), b"fresh-material");
}

/// What the API server enforces on Secrets: `data` values may hold 1 MiB together.
const MAX_SECRET_SIZE: usize = 1 << 20;

#[test]
fn secret_size_limit_is_a_clear_error_and_changes_nothing() {
    let Some(kube) = Kube::new("size-limit") else {
        return;
    };
    // A Secret already close to the 1 MiB limit (other data kept next to the key).
    let filler = vec![b'x'; MAX_SECRET_SIZE - 30];
    kube.put_secret(json!({"metadata": {"name": "big"},
        "data": {"dmcrypt-key": b64(b"current-passphrase"), "other-data": b64(&filler)}}));
    let before = kube.secret("big").unwrap();
    let k = kube.kms("full");
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
    assert_eq!(kube.secret("big").unwrap(), before);
    assert!(!text.contains("pppp"), "no material in the message");
}

#[test]
fn concurrent_writer_between_read_and_write_is_a_conflict() {
    let Some(kube) = Kube::new("conflict") else {
        return;
    };
    let k = kube.kms("full");
    k.stage("key", &pass(b"version-one-key"), 1).unwrap();
    k.commit("key", None, 1).unwrap();
    k.stage("key", &pass(b"version-two-key"), 0).unwrap();
    // Somebody changes the Secret between the commit's read and its write.
    kube.before_write(
        "PUT",
        "key",
        |_| true,
        |c, ns| {
            c.modify_secret(ns, "key", |s| {
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
        kube.annotation("key", "example.com/touched").as_deref(),
        Some("other-writer")
    );
    assert_eq!(kube.data("key", "dmcrypt-key").unwrap(), b"version-one-key");
    let v = kube.versions("key").unwrap();
    assert_eq!(
        (v["current"].clone(), v["pending"].clone()),
        (json!(1), json!(2))
    );
    // A fresh attempt (the engine re-reads) succeeds and keeps the other writer's change.
    k.commit("key", Some(1), 2).unwrap();
    assert_eq!(kube.data("key", "dmcrypt-key").unwrap(), b"version-two-key");
    assert_eq!(
        kube.annotation("key", "example.com/touched").as_deref(),
        Some("other-writer")
    );
    // First creation racing another creator: 409 AlreadyExists is a conflict too.
    kube.before_write(
        "POST",
        "fresh",
        |_| true,
        |c, ns| {
            c.put_secret(
                ns,
                json!({"metadata": {"name": "fresh"}, "data": {"x": "eA=="}}),
            )
        },
    );
    let err = k
        .stage("fresh", &pass(b"abc-def-ghi"), 1)
        .expect_err("must fail");
    assert!(matches!(err, KmsError::Conflict { .. }), "{err:?}");
    assert_eq!(kube.data("fresh", "x").unwrap(), b"x");
}

#[test]
fn check_with_read_only_or_no_access_token_is_denied_naming_the_verbs() {
    let Some(kube) = Kube::new("check") else {
        return;
    };
    let full = kube.kms("full");
    full.check(&["osd".to_string()])
        .expect("full access passes");
    let mark = kube.proxy.mark();
    let ro = kube.kms("read-only");
    let err = ro
        .check(&["osd".to_string()])
        .expect_err("read-only must fail");
    assert!(matches!(err, KmsError::Denied { .. }), "{err:?}");
    let text = err.to_string();
    for verb in ["create Secrets", "update Secret osd", "delete Secret osd"] {
        assert!(text.contains(verb), "{verb}: {text}");
    }
    assert!(!text.contains("get Secret osd"), "{text}");
    assert!(text.contains(&format!("namespace {}", kube.ns)), "{text}");
    // check wrote nothing: only reads and access reviews.
    for r in kube.proxy.requests_since(mark) {
        assert!(!r.is_secret_write(), "check wrote: {r:?}");
    }
    let none = kube.kms("no-access");
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
    let Some(kube) = Kube::new("bad-token") else {
        return;
    };
    let k = kube.kms("bad-token");
    let err = k.read("osd").expect_err("must fail");
    assert!(matches!(err, KmsError::Denied { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("401"), "{text}");
    assert!(text.contains(&kube.url()), "{text}");
    assert!(
        !text.contains("not-a-valid-token"),
        "token in message: {text}"
    );
}

/// A kubeconfig (context `full` of the test's namespace) whose cluster is a loopback port
/// nothing listens on, and that URL: an API server that is down.
fn down_kubeconfig(kube: &Kube) -> (PathBuf, String) {
    let url = format!("http://127.0.0.1:{}", kube::free_port());
    (kube.c.kubeconfig_at(&url, &kube.ns, "full"), url)
}

#[test]
fn server_down_is_unavailable_naming_the_address() {
    let Some(kube) = Kube::new("down") else {
        return;
    };
    let (kc, url) = down_kubeconfig(&kube);
    let k = KubernetesKms::new("k8s", &kube.ns, None, Some(&kc), None).expect("open");
    let t = std::time::Instant::now();
    let err = k.read("osd").expect_err("must fail");
    assert!(matches!(err, KmsError::Unavailable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&url), "{text}");
    assert!(
        text.contains(&format!("reading Secret {}/osd", kube.ns)),
        "{text}"
    );
    assert!(t.elapsed().as_secs() < 20, "bounded retries");
    let err = k
        .stage("osd", &pass(b"material-x"), 1)
        .expect_err("must fail");
    assert!(matches!(err, KmsError::Unavailable { .. }), "{err:?}");
}

#[test]
fn invalid_names_are_config_errors() {
    let Some(kube) = Kube::new("names") else {
        return;
    };
    let k = kube.kms("full");
    let err = k.read("Data_Kek").expect_err("must fail");
    assert!(matches!(err, KmsError::Config { .. }), "{err:?}");
    assert!(err.to_string().contains("DNS-1123"), "{err}");
    let kc = kube.kubeconfig("full");
    let err = KubernetesKms::new("k8s", &kube.ns, Some("keyplan.v3"), Some(&kc), None).unwrap_err();
    assert!(matches!(err, KmsError::Config { .. }), "{err:?}");
    let err = KubernetesKms::new("k8s", "Rook_Ceph", None, Some(&kc), None).unwrap_err();
    assert!(matches!(err, KmsError::Config { .. }), "{err:?}");
    let err = KubernetesKms::new(
        "k8s",
        &kube.ns,
        None,
        Some(Path::new("/nonexistent/kubeconfig")),
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/kubeconfig"), "{err}");
    assert_eq!(
        k.describe(),
        format!(
            "kubernetes KMS \"k8s\" ({}, namespace {})",
            kube.url(),
            kube.ns
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

fn k8s_plan(ns: &str, devices: &str, extra_kms: &str) -> String {
    format!(
        "version: 1\nkms:\n  k8s:\n    provider: kubernetes\n    namespace: {ns}\n{extra_kms}keys:\n  osd-kek:\n    kms: k8s\n    name: {KEY_SECRET}\ndevices:\n{devices}{FAST_PBKDF}"
    )
}

fn device(id: &str, file: &str) -> String {
    format!("  {id}:\n    path: {file}\n    keys: [osd-kek]\n    enroll_with: initial.pass\n")
}

/// Runs keyplan in `dir` with `KUBECONFIG=kubeconfig`.
fn keyplan_k8s(dir: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    assert_cmd::Command::from_std(keyplan_command())
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

/// Runs keyplan watched (`w`) with `KUBECONFIG=kc`, remembers every Secret value the namespace now
/// holds as a secret to look for, and asserts exit status `code`; stdout + stderr.
fn run_watched(w: &Watched, kube: &Kube, kc: &std::path::Path, args: &[&str], code: i32) -> String {
    let out = w
        .command(args)
        .env("KUBECONFIG", kc)
        .output()
        .expect("run keyplan");
    w.record(&out);
    for d in kube.c.all_data(&kube.ns) {
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

/// Three devices (two LUKS2, one LUKS1) sharing key osd-kek in namespace `ns`.
fn setup_devices(s: &Scratch, ns: &str) -> Vec<PathBuf> {
    s.initial_pass();
    let devs = vec![
        s.image("block.img", "luks2"),
        s.image("db.img", "luks2"),
        s.image("legacy.img", "luks1"),
    ];
    let devices =
        device("block", "block.img") + &device("db", "db.img") + &device("legacy", "legacy.img");
    s.plan("keyplan.yaml", &k8s_plan(ns, &devices, ""));
    devs
}

#[test]
fn e2e_enroll_rotate_retire_with_an_independent_reader() {
    let Some(kube) = Kube::new("e2e") else { return };
    let kc = kube.kubeconfig("full");
    let w = Watched::new();
    let devs = setup_devices(&w.s, &kube.ns);
    w.add_secret(kube.c.users(&kube.ns).full_token.as_bytes());
    let run = |args: &[&str], code: i32| run_watched(&w, &kube, &kc, args, code);
    let current = || {
        kube.data(KEY_SECRET, "dmcrypt-key")
            .expect("current in data[dmcrypt-key]")
    };

    // plan writes nothing (I6)
    let mark = kube.proxy.mark();
    let out = run(&["plan", "--detailed-exitcode"], 2);
    assert!(out.contains("+ key osd-kek v1"), "{out}");
    assert!(kube
        .proxy
        .requests_since(mark)
        .iter()
        .all(|r| !r.is_secret_write()));
    assert!(kube.secret(KEY_SECRET).is_none());

    // enroll
    run(&["apply", "--auto-approve"], 0);
    let v1 = current();
    assert_eq!(v1.len(), 44, "32 random bytes as base64");
    let meta = kube.versions(KEY_SECRET).unwrap();
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
    assert_eq!(kube.data(KEY_SECRET, "keyplan.v1").unwrap(), v1);
    for d in &devs {
        assert!(opens(d, &v2, None), "v2 opens {}", d.display());
        assert!(!opens(d, &v1, None), "v1 opens nothing on {}", d.display());
    }

    // rotate again: v3 current, v2 previous, v1 retired (material gone from the Secret)
    run(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    let v3 = current();
    assert!(v3 != v1 && v3 != v2);
    let meta = kube.versions(KEY_SECRET).unwrap();
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
        kube.data(KEY_SECRET, "keyplan.v1").is_none(),
        "v1 material destroyed"
    );
    assert_eq!(kube.data(KEY_SECRET, "keyplan.v2").unwrap(), v2);
    for d in &devs {
        assert!(opens(d, &v3, None), "v3 opens {}", d.display());
        assert!(
            !opens(d, &v2, None) && !opens(d, &v1, None),
            "old versions open nothing"
        );
        assert!(opens(d, INITIAL, Some(0)), "unmanaged keyslot 0 kept");
    }

    let mark = kube.proxy.mark();
    run(&["plan", "--detailed-exitcode"], 0);
    assert!(kube
        .proxy
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

    kube.assert_no_422();
    assert!(w.wrapper_saw_calls());
    w.assert_no_leaks();
}

#[test]
fn adopts_a_rook_secret_and_rotates_it() {
    let Some(kube) = Kube::new("adopt-rook") else {
        return;
    };
    let kc = kube.kubeconfig("full");
    let s = Scratch::new();
    s.initial_pass();
    let dev = s.image("block.img", "luks2");
    // What Rook creates: only data[dmcrypt-key] (the passphrase the device opens with today).
    kube.put_secret(
        json!({"metadata": {"name": KEY_SECRET, "labels": {"pvc_name": "pvc0"},
                "ownerReferences": [{"apiVersion": "ceph.rook.io/v1", "kind": "CephCluster",
                    "name": "rook-ceph", "uid": "c0ffee00-0000-4000-8000-000000000001"}]},
            "type": "kubernetes.io/rook",
            "data": {"dmcrypt-key": b64(INITIAL)}}),
    );
    let dev_yaml = "  block:\n    path: block.img\n    keys: [osd-kek]\n    enroll_with: initial.pass\n    unmanaged_keyslots: remove\n";
    s.plan("keyplan.yaml", &k8s_plan(&kube.ns, dev_yaml, ""));
    let run = |args: &[&str], code: i32| expect(&keyplan_k8s(s.dir.path(), &kc, args), code, args);
    let out = run(&["plan"], 0);
    assert!(
        !out.contains("+ key osd-kek"),
        "the Rook key is adopted as v1: {out}"
    );
    run(&["apply", "--auto-approve"], 0);
    assert_eq!(
        kube.data(KEY_SECRET, "dmcrypt-key").unwrap(),
        INITIAL,
        "v1 = Rook's key"
    );
    run(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    let v2 = kube.data(KEY_SECRET, "dmcrypt-key").unwrap();
    assert_ne!(v2, INITIAL);
    assert_eq!(kube.data(KEY_SECRET, "keyplan.v1").unwrap(), INITIAL);
    assert!(opens(&dev, &v2, None));
    assert!(!opens(&dev, INITIAL, None), "Rook's old key opens nothing");
    // Rook's metadata is kept.
    let sec = kube.secret(KEY_SECRET).unwrap();
    assert_eq!(sec["type"], "kubernetes.io/rook");
    assert_eq!(sec["metadata"]["labels"]["pvc_name"], "pvc0");
    assert_eq!(sec["metadata"]["ownerReferences"][0]["kind"], "CephCluster");
    run(&["plan", "--detailed-exitcode"], 0);
    kube.assert_no_422();
}

#[test]
fn cli_conflict_between_stage_and_commit_then_resume() {
    let Some(kube) = Kube::new("cli-conflict") else {
        return;
    };
    let kc = kube.kubeconfig("full");
    let s = Scratch::new();
    let devs = setup_devices(&s, &kube.ns);
    let run = |args: &[&str], code: i32| expect(&keyplan_k8s(s.dir.path(), &kc, args), code, args);
    run(&["apply", "--auto-approve"], 0);
    let v1 = kube.data(KEY_SECRET, "dmcrypt-key").unwrap();
    // Another writer touches the Secret right before keyplan's commit (the PUT that makes v2
    // current).
    kube.before_write(
        "PUT",
        KEY_SECRET,
        |w| {
            w.body["metadata"]["annotations"]["keyplan.io/versions"]
                .as_str()
                .is_some_and(|t| t.contains("\"current\":2"))
        },
        |c, ns| {
            c.modify_secret(ns, KEY_SECRET, |s| {
                s["metadata"]["annotations"]["example.com/touched"] = json!("other-writer")
            })
        },
    );
    let out = run(&["apply", "--auto-approve", "--rotate", "osd-kek"], 1);
    assert!(out.contains("changed concurrently"), "{out}");
    assert!(out.contains("nothing was overwritten"), "{out}");
    // Nothing overwritten; v1 still current in the KMS and still opens every device (I1).
    assert_eq!(
        kube.annotation(KEY_SECRET, "example.com/touched")
            .as_deref(),
        Some("other-writer")
    );
    assert_eq!(kube.data(KEY_SECRET, "dmcrypt-key").unwrap(), v1);
    let meta = kube.versions(KEY_SECRET).unwrap();
    assert_eq!(
        (meta["current"].clone(), meta["pending"].clone()),
        (json!(1), json!(2))
    );
    for d in &devs {
        assert!(opens(d, &v1, None), "v1 still opens {}", d.display());
    }
    // The next apply finishes the interrupted run (I3).
    run(&["apply", "--auto-approve"], 0);
    let v2 = kube.data(KEY_SECRET, "dmcrypt-key").unwrap();
    assert_ne!(v1, v2);
    for d in &devs {
        assert!(opens(d, &v2, None));
        assert!(!opens(d, &v1, None));
    }
    assert_eq!(
        kube.annotation(KEY_SECRET, "example.com/touched")
            .as_deref(),
        Some("other-writer")
    );
    run(&["plan", "--detailed-exitcode"], 0);
}

#[test]
fn cli_read_only_token_fails_before_touching_devices() {
    let Some(kube) = Kube::new("cli-read-only") else {
        return;
    };
    let kc = kube.kubeconfig("read-only");
    let s = Scratch::new();
    let devs = setup_devices(&s, &kube.ns);
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
    assert!(kube.names().is_empty());
}

#[test]
fn cli_server_down_is_unavailable_and_touches_nothing() {
    let Some(kube) = Kube::new("cli-down") else {
        return;
    };
    let (kc, url) = down_kubeconfig(&kube);
    let s = Scratch::new();
    let devs = setup_devices(&s, &kube.ns);
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
    let Some(kube) = Kube::new("cli-bad-token") else {
        return;
    };
    let kc = kube.kubeconfig("bad-token");
    let s = Scratch::new();
    let devs = setup_devices(&s, &kube.ns);
    let snap = Snapshot::take(&devs);
    let args = ["apply", "--auto-approve"];
    let out = expect(&keyplan_k8s(s.dir.path(), &kc, &args), 1, &args);
    assert!(out.contains("refused"), "{out}");
    assert!(out.contains("401"), "{out}");
    assert!(!out.contains("not-a-valid-token"), "{out}");
    snap.assert_unchanged("apply with bad credentials");
}

#[test]
fn destroy_key_is_compare_and_swap_and_spares_foreign_data() {
    let Some(kube) = Kube::new("destroy") else {
        return;
    };
    let k = kube.kms("full");
    k.stage("gone", &pass(b"material-of-gone"), 1).unwrap();
    k.commit("gone", None, 1).unwrap();
    // A writer changes the Secret between destroy_key's read and its DELETE: the
    // resourceVersion precondition makes the DELETE fail, and nothing is deleted.
    kube.before_write(
        "DELETE",
        "gone",
        |_| true,
        |c, ns| {
            c.modify_secret(ns, "gone", |s| {
                s["metadata"]["labels"]["example.com/touched"] = json!("yes")
            })
        },
    );
    let err = k.destroy_key("gone", 1).expect_err("must fail");
    assert!(matches!(err, KmsError::Conflict { .. }), "{err:?}");
    // Kubernetes 1.37 words it "the ResourceVersion in the precondition (N) does not match
    // the ResourceVersion in record (M)" (the fake said "Precondition failed: ..."); keyplan
    // passes the server's message on.
    let text = err.to_string();
    assert!(text.contains("409 Conflict"), "{text}");
    assert!(
        text.contains("ResourceVersion in the precondition"),
        "{text}"
    );
    assert!(text.contains("nothing was overwritten"), "{text}");
    assert_eq!(
        kube.data("gone", "dmcrypt-key").unwrap(),
        b"material-of-gone"
    );
    k.destroy_key("gone", 1).unwrap();
    assert!(kube.secret("gone").is_none());

    // A Secret that also holds other data keeps it; only keyplan's part goes.
    kube.put_secret(json!({"metadata": {"name": "shared"},
            "data": {"dmcrypt-key": b64(b"rook-key-xyz"), "other": b64(b"keep me")}}));
    k.stage("shared", &pass(b"second-key-xyz"), 0).unwrap();
    k.commit("shared", Some(1), 2).unwrap();
    k.destroy_key("shared", 2).unwrap();
    let s = kube.secret("shared").unwrap();
    assert_eq!(kube.data("shared", "other").unwrap(), b"keep me");
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
    let Some(kube) = Kube::new("sa-token") else {
        return;
    };
    let w = Watched::new();
    let _devs = setup_devices(&w.s, &kube.ns);
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
    // A real token of ServiceAccount `harness-admin` (bound to cluster-admin), minted with the
    // TokenRequest API for a day: its `exp` is what the API server signed.
    let jwt = kube.c.users(&kube.ns).full_token;
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(jwt.split('.').nth(1).expect("a JWT"))
            .expect("JWT claims are base64url"),
    )
    .expect("JWT claims are JSON");
    assert_eq!(
        claims["sub"],
        format!("system:serviceaccount:{}:harness-admin", kube.ns)
    );
    let exp = claims["exp"].as_u64().expect("exp");
    assert!(
        exp > now && exp < now + 30 * 86_400,
        "expires before the next rotation is due: {claims}"
    );
    // Outside the scratch directory, whose files the leak check scans for the token.
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("sa-token");
    std::fs::write(&token_file, &jwt).unwrap();
    let kc = kube.proxy.kubeconfig_with_token_file(&kube.ns, &token_file);
    w.add_secret(jwt.as_bytes());
    let run = |args: &[&str], code: i32| run_watched(&w, &kube, &kc, args, code);

    let out = run(&["apply", "--auto-approve"], 0);
    assert!(
        out.contains("service-account token") && out.contains("expires at"),
        "{out}"
    );
    assert!(
        kube.data(KEY_SECRET, "dmcrypt-key").is_some(),
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

/// Does the body of an index write (`keyplan.io/versions` annotation) record `version` as
/// retired?
fn records_retired(body: &Value, version: u64) -> bool {
    let Some(text) = body["metadata"]["annotations"]["keyplan.io/versions"].as_str() else {
        return false;
    };
    let Ok(record) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    record["versions"].as_array().is_some_and(|vs| {
        vs.iter()
            .any(|v| v["version"] == version && v["state"] == "retired")
    })
}

/// Issue 46, secret-per-version layout: `retire` deletes the version's Secret before the index
/// records the version retired (before: the index first, so a run killed in between left a
/// version recorded retired whose Secret still held its passphrase). A `destroy_key` cut short
/// after its index write leaves version Secrets behind: `lingering` reports them, and
/// `destroy_key` again deletes them.
#[test]
fn retire_and_destroy_leave_no_version_secret_the_index_calls_retired() {
    use std::sync::{Arc, Mutex};
    let Some(kube) = Kube::new("retire-order") else {
        return;
    };
    index_secret(&kube, "k");
    let kms = kube.kms("full");
    kms.stage("k", &pass(b"one-AAAA"), 1).unwrap();
    kms.commit("k", None, 1).unwrap();
    kms.stage("k", &pass(b"two-BBBB"), 0).unwrap();
    kms.commit("k", Some(1), 2).unwrap();
    assert!(kube.secret("k-v1").is_some());

    // What the cluster holds at the moment the index write that retires v1 goes through.
    let v1_there: Arc<Mutex<Option<bool>>> = Arc::default();
    let seen = Arc::clone(&v1_there);
    let (c, ns, ns2) = (kube.c, kube.ns.clone(), kube.ns.clone());
    kube.proxy.before_write(
        move |r: &Request<'_>| r.is_secret_write(&ns, "k-keyplan") && records_retired(r.body, 1),
        move || *seen.lock().unwrap() = Some(c.secret(&ns2, "k-v1").is_some()),
    );
    kms.retire("k", 1).unwrap();
    assert_eq!(
        *v1_there.lock().unwrap(),
        Some(false),
        "the index recorded v1 retired while Secret k-v1 still held it"
    );
    assert!(kube.secret("k-v1").is_none());
    assert_eq!(
        kube.versions("k-keyplan").unwrap()["versions"][0]["state"],
        "retired"
    );
    assert_eq!(kms.lingering("k").unwrap(), Vec::<u64>::new());

    // destroy_key: the index is written, then deleting k-v2 is refused once.
    let ns = kube.ns.clone();
    kube.proxy.inject(
        move |r: &Request<'_>| r.method == "DELETE" && r.is_secret_write(&ns, "k-v2"),
        kube_proxy::Fault::Status(403),
        1,
    );
    assert!(matches!(
        kms.destroy_key("k", 2),
        Err(KmsError::Denied { .. })
    ));
    let st = kms.read("k").unwrap();
    assert_eq!((st.current, st.pending), (None, None), "{st:?}");
    assert_eq!(kube.data("k-v2", "dmcrypt-key").unwrap(), b"two-BBBB");
    assert_eq!(kms.lingering("k").unwrap(), [2]);
    kms.destroy_key("k", 2)
        .expect("destroy_key again finishes it");
    assert!(kube.secret("k-v2").is_none());
    assert_eq!(kms.lingering("k").unwrap(), Vec::<u64>::new());
}
