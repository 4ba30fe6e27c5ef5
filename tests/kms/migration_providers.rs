//! Migration between real KMS providers: file → vault (real OpenBao) and kubernetes (the real
//! kube-apiserver of tests/common/kube.rs, a fresh namespace per test) → vault, each checked
//! with the server's own reader (OpenBao's KV; the Secrets read as admin), not through keyplan;
//! a rotation asked for during the migration runs right after it.

use crate::common::kube;
use crate::common::openbao;

use crate::common::*;

struct Env {
    bao: openbao::OpenBao,
    kube: &'static kube::Cluster,
    /// The test's fresh namespace (the `k8s` KMS's).
    ns: String,
    kubeconfig: std::path::PathBuf,
}

fn env(prefix: &str) -> Option<Env> {
    let bao = openbao::OpenBao::start()?;
    let kube = kube::Cluster::get()?;
    let ns = kube.fresh_namespace(prefix);
    let kubeconfig = kube.kubeconfig(&ns, "full");
    Some(Env {
        bao,
        kube,
        ns,
        kubeconfig,
    })
}

fn plan(e: &Env, kms: &str) -> String {
    format!(
        r#"version: 1
kms:
  local:
    provider: file
    path: keys
  vault:
    provider: vault
    address: {addr}
    mount: secret
  k8s:
    provider: kubernetes
    namespace: {ns}
keys:
  k:
    kms: {kms}
    name: osd-kek
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
{FAST_PBKDF}"#,
        addr = e.bao.addr,
        ns = e.ns
    )
}

/// Runs keyplan in the scratch directory with the servers' credentials.
fn run(s: &Scratch, e: &Env, args: &[&str], code: i32) -> String {
    let out = assert_cmd::Command::from_std(keyplan_command())
        .current_dir(s.path(""))
        .env("NO_COLOR", "1")
        .env("VAULT_TOKEN", &e.bao.root_token)
        .env("KUBECONFIG", &e.kubeconfig)
        .args(args)
        .output()
        .expect("run keyplan");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(code), "keyplan {args:?}:\n{text}");
    text
}

fn devices(s: &Scratch) -> Vec<std::path::PathBuf> {
    s.initial_pass();
    vec![
        s.small_image("a.img", "luks2"),
        s.small_image("b.img", "luks2"),
        s.small_image("c.img", "luks1"),
    ]
}

fn in_vault(e: &Env) -> Option<Vec<u8>> {
    e.bao.kv_field("osd-kek", "osd-kek")
}

#[test]
fn file_to_vault_then_rotate() {
    let Some(e) = env("mig-file-vault") else {
        return;
    };
    let s = Scratch::new();
    let devs = devices(&s);
    s.plan("keyplan.yaml", &plan(&e, "local"));
    run(&s, &e, &["apply", "--auto-approve"], 0);
    let (before, _) = file_kms_state(&s.path(""), "osd-kek");
    let before = before.expect("enrolled in the file KMS");

    s.plan("keyplan.yaml", &plan(&e, "vault"));
    let out = run(&s, &e, &["plan", "--detailed-exitcode"], 2);
    assert!(out.contains("> key k v1 from KMS local"), "{out}");
    assert!(in_vault(&e).is_none(), "plan wrote nothing");
    run(&s, &e, &["apply", "--auto-approve"], 0);
    assert_eq!(
        in_vault(&e).as_deref(),
        Some(&before[..]),
        "copied to OpenBao"
    );
    assert_eq!(
        file_kms_state(&s.path(""), "osd-kek").0,
        None,
        "destroyed in the file KMS"
    );
    for d in &devs {
        assert!(opens(d, &before, None));
    }
    run(&s, &e, &["plan", "--detailed-exitcode"], 0);

    // Rotate in the new KMS: the Rook-style reader sees the new passphrase.
    run(&s, &e, &["apply", "--auto-approve", "--rotate", "k"], 0);
    let after = in_vault(&e).expect("current in OpenBao");
    assert_ne!(after, before);
    for d in &devs {
        assert!(opens(d, &after, None));
        assert!(!opens(d, &before, None));
    }
    run(&s, &e, &["plan", "--detailed-exitcode"], 0);
}

#[test]
fn kubernetes_to_vault_with_rotation_in_the_same_apply() {
    let Some(e) = env("mig-k8s-vault") else {
        return;
    };
    let s = Scratch::new();
    let devs = devices(&s);
    s.plan("keyplan.yaml", &plan(&e, "k8s"));
    run(&s, &e, &["apply", "--auto-approve"], 0);
    let before = e
        .kube
        .data(&e.ns, "osd-kek", "dmcrypt-key")
        .expect("Secret holds the key");
    for d in &devs {
        assert!(opens(d, &before, None));
    }

    s.plan("keyplan.yaml", &plan(&e, "vault"));
    let out = run(&s, &e, &["apply", "--auto-approve", "--rotate", "k"], 0);
    assert!(
        out.contains("The migration is done; planning again"),
        "{out}"
    );
    assert!(
        e.kube.secret(&e.ns, "osd-kek").is_none(),
        "Secret deleted after the move"
    );
    let after = in_vault(&e).expect("current in OpenBao");
    assert_ne!(after, before, "rotated after the move");
    for d in &devs {
        assert!(opens(d, &after, None), "{}", d.display());
        assert!(!opens(d, &before, None), "{}", d.display());
    }
    run(&s, &e, &["plan", "--detailed-exitcode"], 0);
    let got = assert_cmd::Command::from_std(keyplan_command())
        .current_dir(s.path(""))
        .env("VAULT_TOKEN", &e.bao.root_token)
        .env("KUBECONFIG", &e.kubeconfig)
        .args(["key", "get", "k"])
        .output()
        .expect("key get");
    assert!(got.status.success());
    assert_eq!(got.stdout, after, "key get reads the new KMS");
}
