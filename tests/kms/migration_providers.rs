//! Migration between real KMS providers: file → vault (real OpenBao) and kubernetes (the real
//! kube-apiserver of tests/common/kube.rs, a fresh namespace per test) → vault, each checked
//! with the server's own reader (OpenBao's KV; the Secrets read as admin), not through keyplan;
//! a rotation asked for during the migration runs right after it; and a key travelling file →
//! AWS Secrets Manager (moto) → Azure Key Vault → IBM Key Protect (both through their exec
//! helpers, against the stand-ins of tests/standins/) → file, checked with each store's reader.

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

/// Runs keyplan in the scratch directory with OpenBao's root token; stdout and stderr.
fn run_bao(s: &Scratch, bao: &openbao::OpenBao, args: &[&str]) -> std::process::Output {
    assert_cmd::Command::from_std(keyplan_command())
        .current_dir(s.path(""))
        .env("NO_COLOR", "1")
        .env("VAULT_TOKEN", &bao.root_token)
        .args(args)
        .output()
        .expect("run keyplan")
}

#[test]
fn file_to_an_occupied_vault_entry_is_refused() {
    // Another tool already keeps a secret `osd-kek` in OpenBao: moving k there is refused by
    // `plan` and `apply` before anything is touched, the secret stays as it was, and `key get`
    // reads k from the file KMS its devices' records name.
    let Some(bao) = openbao::OpenBao::start() else {
        return;
    };
    let s = Scratch::new();
    let devs = devices(&s);
    let plan = |kms: &str| {
        format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\n  vault: {{ provider: vault, address: \"{}\", mount: secret }}\nkeys:\n  k: {{ kms: {kms}, name: osd-kek }}\ndevices:\n  a: {{ path: a.img, keys: [k], enroll_with: initial.pass }}\n  b: {{ path: b.img, keys: [k], enroll_with: initial.pass }}\n  c: {{ path: c.img, keys: [k], enroll_with: initial.pass }}\n{FAST_PBKDF}",
            bao.addr
        )
    };
    s.plan("keyplan.yaml", &plan("local"));
    let out = run_bao(&s, &bao, &["apply", "--auto-approve"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours = file_kms_state(&s.path(""), "osd-kek")
        .0
        .expect("enrolled in the file KMS");
    let foreign = b"the KEK another tool keeps".to_vec();
    bao.kv_put("osd-kek", "osd-kek", &foreign);
    let meta = bao.kv_metadata("osd-kek");

    s.plan("keyplan.yaml", &plan("vault"));
    let snap = Snapshot::take(&devs);
    for args in [&["plan"][..], &["apply", "--auto-approve"]] {
        let out = run_bao(&s, &bao, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?} must refuse: {err}");
        assert!(err.contains("already holds an entry \"osd-kek\""), "{err}");
        assert!(err.contains("Nothing was changed"), "{err}");
        assert!(
            !err.contains("another tool keeps"),
            "material in a message: {err}"
        );
    }
    snap.assert_unchanged("refused move");
    assert_eq!(
        bao.kv_field("osd-kek", "osd-kek"),
        Some(foreign.clone()),
        "the secret was touched"
    );
    assert_eq!(bao.kv_metadata("osd-kek"), meta, "the secret was touched");
    let out = run_bao(&s, &bao, &["key", "get", "k"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, ours, "key get handed out another passphrase");
    for d in &devs {
        assert!(opens(d, &out.stdout, None), "{} does not open", d.display());
    }
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

/// A key moves through every provider added for Rook's clouds and back, each step checked with
/// that store's own reader (boto3 against moto, the Azure stand-in over HTTP, the Key Protect
/// stand-in's keys), never through keyplan: file → AWS Secrets Manager → Azure Key Vault
/// (exec helper) → IBM Key Protect (exec helper) → file, then a rotation. After each `apply`
/// the new store holds the same passphrase, the old one holds none that reads as current, the
/// devices open with it, and `plan` is empty; no material leaks anywhere.
#[test]
fn file_to_aws_to_azure_to_ibm_and_back_to_file() {
    use crate::common::azure::{AzureVault, CLIENT_SECRET};
    use crate::common::ibm_standin::{KeyProtect, INSTANCE, MANAGER_KEY};
    use crate::common::moto::Moto;
    let Some(moto) = Moto::start() else {
        return;
    };
    let Some(vault) = AzureVault::start() else {
        return;
    };
    let Some(kp) = KeyProtect::start("file_to_aws_to_azure_to_ibm_and_back_to_file") else {
        return;
    };
    let w = Watched::new();
    let devs = devices(&w.s);
    vault.helper_script(w.s.dir.path(), "kms-azure", "", CLIENT_SECRET);
    let kp_argv = serde_json::to_string(&[
        crate::common::standin::python(),
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/ibm-key-protect/keyplan-kms-keyprotect"
        )
        .to_string(),
        "--instance".into(),
        INSTANCE.into(),
        "--endpoint".into(),
        kp.url(),
        "--iam-endpoint".into(),
        kp.url(),
        "--prefix".into(),
        String::new(),
    ])
    .unwrap();
    let plan = |kms: &str| {
        format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\n{aws}  azure: {{ provider: exec, command: [./kms-azure] }}\n  kp: {{ provider: exec, command: {kp_argv} }}\nkeys:\n  k: {{ kms: {kms}, name: osd-kek }}\ndevices:\n  a: {{ path: a.img, keys: [k], enroll_with: initial.pass }}\n  b: {{ path: b.img, keys: [k], enroll_with: initial.pass }}\n  c: {{ path: c.img, keys: [k], enroll_with: initial.pass }}\n{FAST_PBKDF}",
            aws = moto.kms_yaml("aws", ""),
        )
    };
    let run = |args: &[&str], code: i32| {
        let mut cmd = w.command(args);
        cmd.envs(moto.env()).env("IBMCLOUD_API_KEY", MANAGER_KEY);
        let out = cmd.output().expect("run keyplan");
        w.record(&out);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(code), "keyplan {args:?}:\n{text}");
        text
    };
    // What each store's own reader says is current: the passphrase, or None.
    let in_aws = || moto.get("osd-kek", None).map(String::into_bytes);
    let in_azure = || vault.get("osd-kek", None).ok().map(String::into_bytes);
    let in_kp = || kp.current("osd-kek").map(|(_, material)| material);
    let in_file = || file_kms_state(&w.s.path(""), "osd-kek").0;

    w.s.plan("keyplan.yaml", &plan("local"));
    run(&["apply", "--auto-approve"], 0);
    let material = in_file().expect("created in the file KMS");
    w.add_secret(&material);

    type Reader<'a> = &'a dyn Fn() -> Option<Vec<u8>>;
    let steps: [(&str, &str, Reader<'_>, Reader<'_>); 4] = [
        ("local", "aws", &in_file, &in_aws),
        ("aws", "azure", &in_aws, &in_azure),
        ("azure", "kp", &in_azure, &in_kp),
        ("kp", "local", &in_kp, &in_file),
    ];
    for (from, to, old, new) in steps {
        w.s.plan("keyplan.yaml", &plan(to));
        let out = run(&["plan", "--detailed-exitcode"], 2);
        assert!(
            out.contains(&format!("from KMS {from}")),
            "{from} -> {to}: {out}"
        );
        assert_eq!(new(), None, "{from} -> {to}: plan wrote nothing");
        run(&["apply", "--auto-approve"], 0);
        assert_eq!(
            new().as_deref(),
            Some(&material[..]),
            "{from} -> {to}: copied"
        );
        assert_eq!(
            old(),
            None,
            "{from} -> {to}: nothing current left in {from}"
        );
        for d in &devs {
            assert!(opens(d, &material, None), "{from} -> {to}: {}", d.display());
        }
        let out = run(&["plan", "--detailed-exitcode"], 0);
        assert!(out.contains("No changes"), "{from} -> {to}: {out}");
    }
    // Nothing readable is left behind in the clouds' stores.
    assert_eq!(moto.get("osd-kek", None), None);
    assert!(
        vault.versions("osd-kek").iter().all(|v| !v.enabled),
        "{:?}",
        vault.versions("osd-kek")
    );
    let leftover: Vec<_> = kp
        .keys()
        .into_iter()
        .filter(|k| {
            k["deleted"] != true
                && k["aliases"][0]
                    .as_str()
                    .is_some_and(|a| a.starts_with("osd-kek_v"))
        })
        .collect();
    assert!(leftover.is_empty(), "{leftover:?}");

    // Rotate back home: the new passphrase opens every device, the travelled one none.
    run(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let rotated = in_file().expect("current in the file KMS");
    w.add_secret(&rotated);
    assert_ne!(rotated, material);
    for d in &devs {
        assert!(opens(d, &rotated, None));
        assert!(!opens(d, &material, None));
    }
    w.assert_no_leaks();
}
