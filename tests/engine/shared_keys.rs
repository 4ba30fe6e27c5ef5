//! One KMS key, two plans on two "hosts" (two state directories, two node names): the hole of
//! invariant I7 outside fleet mode. For every provider (file, exec through the example
//! helper, vault on a real OpenBao, kubernetes on the real kube-apiserver of
//! tests/common/kube.rs in a fresh namespace, kmip on a real PyKMIP):
//!
//! 1. plan A creates the key and records itself as a holder;
//! 2. plan B enrolls the same key on its device and records itself (its plan says so);
//! 3. a rotation from A (and from B) is refused naming the other holder; nothing is staged,
//!    and both devices still open with the KMS's current version;
//! 4. B takes the key out of its device (keeps another key): its apply kills the keyslot and
//!    removes its record;
//! 5. A's rotation now goes through, and A's device opens with the new current version.

use crate::common::kube;
use crate::common::openbao;
use crate::common::pykmip;

use std::path::{Path, PathBuf};

use crate::common::*;

/// How the test reaches one provider: the `kms:` entry of the plans, the environment keyplan
/// needs, and a reader of the key's current passphrase that does not go through the plans.
struct Provider {
    kms: String,
    env: Vec<(String, String)>,
}

const HOST_A: &str = "host-a";
const HOST_B: &str = "host-b";

fn plan_text(p: &Provider, devices: &str) -> String {
    format!(
        "version: 1\nkms:\n  shared: {}\n  own: {{ provider: file, path: own-keys }}\nkeys:\n  k: {{ kms: shared, name: shared-kek }}\n  mine: {{ kms: own }}\ndevices:\n{devices}\n{FAST_PBKDF}",
        p.kms
    )
}

/// Runs keyplan on `plan` as `host`, in the scratch directory, expecting exit `code`.
fn run(s: &Scratch, p: &Provider, host: &str, plan: &Path, args: &[&str], code: i32) -> String {
    let mut cmd = assert_cmd::Command::from_std(keyplan_command());
    cmd.current_dir(s.path(""))
        .env("NO_COLOR", "1")
        .env_remove("NODE_NAME")
        .args(["--node", host])
        .args(args)
        .arg("-f")
        .arg(plan);
    for (k, v) in &p.env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run keyplan");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        out.status.code(),
        Some(code),
        "keyplan {host} {args:?}:\n{text}"
    );
    text
}

/// The current passphrase of `k`, through `keyplan key get` of `plan`.
fn current(s: &Scratch, p: &Provider, host: &str, plan: &Path) -> Vec<u8> {
    let mut cmd = assert_cmd::Command::from_std(keyplan_command());
    cmd.current_dir(s.path(""))
        .env_remove("NODE_NAME")
        .args(["--node", host, "key", "get", "k", "-f"])
        .arg(plan);
    for (k, v) in &p.env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("key get");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `keyplan status --format json` of `plan` as `host`, whatever its exit code.
fn status_json(s: &Scratch, p: &Provider, host: &str, plan: &Path) -> String {
    let mut cmd = assert_cmd::Command::from_std(keyplan_command());
    cmd.current_dir(s.path(""))
        .env_remove("NODE_NAME")
        .args(["--node", host, "status", "--format", "json", "-f"])
        .arg(plan);
    for (k, v) in &p.env {
        cmd.env(k, v);
    }
    String::from_utf8_lossy(&cmd.output().expect("status").stdout).into_owned()
}

/// Two hosts' directories in one scratch directory: the images `a.img` and `b.img` (LUKS2,
/// `initial.pass` in keyslot 0) and the plan files `a/keyplan.yaml` and `b/keyplan.yaml`, each
/// with one device listing `k`.
struct Hosts {
    s: Scratch,
    a_img: PathBuf,
    b_img: PathBuf,
    plan_a: PathBuf,
    plan_b: PathBuf,
}

impl Hosts {
    fn new(p: &Provider) -> Hosts {
        let s = Scratch::new();
        s.initial_pass();
        let a_img = s.small_image("a.img", "luks2");
        let b_img = s.small_image("b.img", "luks2");
        std::fs::create_dir_all(s.path("a")).expect("mkdir");
        std::fs::create_dir_all(s.path("b")).expect("mkdir");
        let mut h = Hosts {
            plan_a: s.path("a/keyplan.yaml"),
            plan_b: s.path("b/keyplan.yaml"),
            s,
            a_img,
            b_img,
        };
        h.plan_a =
            h.s.plan("a/keyplan.yaml", &plan_text(p, &h.dev("a1", &h.a_img, "k")));
        h.plan_b =
            h.s.plan("b/keyplan.yaml", &plan_text(p, &h.dev("b1", &h.b_img, "k")));
        h
    }

    /// A device line of a plan: `id` at `img` with `keys`, enrolled with `initial.pass`.
    fn dev(&self, id: &str, img: &Path, keys: &str) -> String {
        format!(
            "  {id}: {{ path: {}, keys: [{keys}], enroll_with: {} }}",
            img.display(),
            self.s.path("initial.pass").display()
        )
    }
}

fn scenario(name: &str, p: &Provider) {
    let h = Hosts::new(p);
    let (s, a_img, b_img, plan_a) = (&h.s, &h.a_img, &h.b_img, &h.plan_a);
    let plan_b = h.plan_b.clone();
    let dev = |id: &str, img: &Path, keys: &str| h.dev(id, img, keys);
    let holder_a = format!("{HOST_A}:{}", s.path("a/.keyplan").display());
    let holder_b = format!("{HOST_B}:{}", s.path("b/.keyplan").display());

    // 1. A creates the key.
    run(s, p, HOST_A, plan_a, &["apply", "--auto-approve"], 0);
    let v1 = current(s, p, HOST_A, plan_a);
    assert!(opens(a_img, &v1, None), "{name}: a1 opens with v1");

    // 2. B enrolls the same key; its plan says it records itself as a holder.
    let out = run(s, p, HOST_B, &plan_b, &["plan", "--detailed-exitcode"], 2);
    assert!(
        out.contains("~ key k: record this plan") && out.contains(&holder_b),
        "{name}: {out}"
    );
    run(s, p, HOST_B, &plan_b, &["apply", "--auto-approve"], 0);
    assert!(opens(b_img, &v1, None), "{name}: b1 opens with v1");
    run(s, p, HOST_B, &plan_b, &["plan", "--detailed-exitcode"], 0);

    // 3. A rotation from either host is refused, naming the other; nothing is staged.
    for (host, plan, other) in [(HOST_A, plan_a, &holder_b), (HOST_B, &plan_b, &holder_a)] {
        let out = run(
            s,
            p,
            host,
            plan,
            &["apply", "--auto-approve", "--rotate", "k"],
            1,
        );
        assert!(
            out.contains("is also held by another plan") && out.contains(other.as_str()),
            "{name}: {out}"
        );
        // (exit 0 or 1: PyKMIP's test certificates expire soon, which status reports)
        let json = status_json(s, p, host, plan);
        let doc: serde_json::Value = serde_json::from_str(&json).expect("status json");
        let k = doc["keys"]
            .as_array()
            .and_then(|ks| ks.iter().find(|k| k["id"] == "k"))
            .cloned()
            .unwrap_or_default();
        assert!(k["pending"].is_null(), "{name}: nothing staged: {k}");
    }
    assert_eq!(
        current(s, p, HOST_A, plan_a),
        v1,
        "{name}: v1 still current"
    );
    assert!(opens(a_img, &v1, None) && opens(b_img, &v1, None));

    // 4. B drops the key (keeps its own): the keyslot goes, then B's record.
    let plan_b = s.plan("b/keyplan.yaml", &plan_text(p, &dev("b1", b_img, "mine")));
    let out = run(s, p, HOST_B, &plan_b, &["apply", "--auto-approve"], 0);
    assert!(
        out.contains("remove this plan's holder record"),
        "{name}: {out}"
    );
    assert!(
        !opens(b_img, &v1, None),
        "{name}: k's keyslot on b1 is gone"
    );
    run(s, p, HOST_B, &plan_b, &["plan", "--detailed-exitcode"], 0);

    // 5. A's rotation goes through now.
    run(
        s,
        p,
        HOST_A,
        plan_a,
        &["apply", "--auto-approve", "--rotate", "k"],
        0,
    );
    let v2 = current(s, p, HOST_A, plan_a);
    assert_ne!(v1, v2, "{name}: rotated");
    assert!(opens(a_img, &v2, None), "{name}: a1 opens with v2");
    assert!(
        !opens(a_img, &v1, None),
        "{name}: v1's keyslot on a1 is gone"
    );
}

#[test]
fn file_kms() {
    let s = Scratch::new();
    let keys = s.path("shared-keys");
    scenario(
        "file",
        &Provider {
            kms: format!("{{ provider: file, path: {} }}", keys.display()),
            env: vec![],
        },
    );
}

#[test]
fn exec_kms() {
    let s = Scratch::new();
    let helper =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/exec-kms/keyplan-kms-dir");
    let python = if Path::new("/usr/bin/python3").is_file() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    scenario(
        "exec",
        &Provider {
            kms: format!(
                "{{ provider: exec, command: [{python}, {}, {}] }}",
                helper.display(),
                s.path("helper-keys").display()
            ),
            env: vec![],
        },
    );
}

#[test]
fn vault_kms() {
    let Some(bao) = openbao::OpenBao::start() else {
        return;
    };
    scenario(
        "vault",
        &Provider {
            kms: format!(
                "{{ provider: vault, address: {}, mount: secret }}",
                bao.addr
            ),
            env: vec![("VAULT_TOKEN".into(), bao.root_token.clone())],
        },
    );
}

#[test]
fn kubernetes_kms() {
    let Some(c) = kube::Cluster::get() else {
        return;
    };
    let ns = c.fresh_namespace("shared-keys");
    let kubeconfig = c.kubeconfig(&ns, "full");
    scenario(
        "kubernetes",
        &Provider {
            kms: format!("{{ provider: kubernetes, namespace: {ns} }}"),
            env: vec![("KUBECONFIG".into(), kubeconfig.display().to_string())],
        },
    );
    // The holder records are in the Secret's annotation, where `kubectl` shows them (read
    // as admin, not through keyplan).
    let secret = c.secret(&ns, "shared-kek").expect("the Secret");
    let versions = secret["metadata"]["annotations"]["keyplan.io/versions"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(versions.contains("\"holders\""), "{versions}");
}

#[test]
fn kmip_kms() {
    let Some(server) = pykmip::PyKmip::start() else {
        return;
    };
    scenario(
        "kmip",
        &Provider {
            kms: format!(
                "{{ provider: kmip, endpoint: \"{}\", ca_cert: {}, client_cert: {}, client_key: {} }}",
                server.endpoint(),
                server.file("ca.crt").display(),
                server.file("client.crt").display(),
                server.file("client.key").display()
            ),
            env: vec![],
        },
    );
}

/// The other plan takes the key out of its plan file altogether (not only off its devices):
/// its apply kills the keyslot and removes its record through the KMS instance and name its
/// records named; a plan spelling its state directory differently (`..`) is the same holder.
#[test]
fn file_kms_key_removed_from_the_other_plan() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = Provider {
        kms: format!(
            "{{ provider: file, path: {} }}",
            dir.path().join("shared-keys").display()
        ),
        env: vec![],
    };
    let h = Hosts::new(&p);
    let (s, a_img, b_img, plan_a) = (&h.s, &h.a_img, &h.b_img, &h.plan_a);
    let dev = |id: &str, img: &Path, keys: &str| h.dev(id, img, keys);
    run(s, &p, HOST_A, plan_a, &["apply", "--auto-approve"], 0);
    run(s, &p, HOST_B, &h.plan_b, &["apply", "--auto-approve"], 0);
    // The same plan of A through another spelling of its directory: still this plan's record.
    let dotted = s.path("a/../a/keyplan.yaml");
    run(s, &p, HOST_A, &dotted, &["plan", "--detailed-exitcode"], 0);
    // B drops k from its plan file (keys and device), keeping its own key.
    let text = plan_text(&p, &dev("b1", b_img, "mine"))
        .replace("  k: { kms: shared, name: shared-kek }\n", "");
    let plan_b = s.plan("b/keyplan.yaml", &text);
    let out = run(s, &p, HOST_B, &plan_b, &["apply", "--auto-approve"], 0);
    assert!(out.contains("remove this plan's holder record"), "{out}");
    run(s, &p, HOST_B, &plan_b, &["plan", "--detailed-exitcode"], 0);
    let holders = run(s, &p, HOST_A, plan_a, &["key", "holders", "k", "--json"], 0);
    let doc: serde_json::Value = serde_json::from_str(&holders).expect("json");
    assert_eq!(
        doc["holders"].as_array().map(Vec::len),
        Some(1),
        "{holders}"
    );
    run(
        s,
        &p,
        HOST_A,
        plan_a,
        &["apply", "--auto-approve", "--rotate", "k"],
        0,
    );
    let v2 = current(s, &p, HOST_A, plan_a);
    assert!(opens(a_img, &v2, None));
    // A wrong holder id is refused, naming the recorded ones.
    let out = run(
        s,
        &p,
        HOST_A,
        plan_a,
        &["key", "release", "k", "--holder", "nobody:/x"],
        1,
    );
    assert!(
        out.contains("has no holder") && out.contains(HOST_A),
        "{out}"
    );
}
