//! Adoption (issue 14): a device listed with a key whose KMS current version opens one of its
//! unrecorded bound keyslots (a Rook OSD's keyslot 0, a hand-made setup) is recorded as holding
//! that version: no new keyslot, no key file, no `enroll_with`; the next rotation replaces it,
//! so the old key opens nothing afterwards. Checked with cryptsetup itself and, for Rook's
//! layouts, with the KMS's own reader (real OpenBao; for Secrets, the real kube-apiserver of
//! tests/common/kube.rs, in a fresh namespace, read back as admin).

use crate::common::kube;
use crate::common::openbao;

use std::path::Path;

use crate::common::*;

/// A plan listing `k` (kms `local`, file) on the devices `devs` (`(id, extra)`), no enroll_with.
fn plan(devs: &[(&str, &str)]) -> String {
    let mut t = String::from(
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local }\ndevices:\n",
    );
    for (id, keys) in devs {
        t.push_str(&format!("  {id}: {{ path: {id}.img, keys: [{keys}] }}\n"));
    }
    t.push_str(FAST_PBKDF);
    t
}

/// True when the LUKS2 device records keyslot `slot` in a `keyplan` token.
fn token_for(dev: &Path, slot: u32) -> bool {
    let json = luks2_json(dev);
    json["tokens"]
        .as_object()
        .expect("tokens")
        .values()
        .any(|t| t["type"] == "keyplan" && t["slot"] == slot)
}

#[test]
fn a_key_the_kms_already_holds_is_adopted_then_replaced_by_the_next_rotation() {
    let s = Scratch::new();
    let a = s.small_image("a.img", "luks2");
    let b = s.small_image("b.img", "luks2");
    let l = s.small_image("l.img", "luks1");
    file_kms_put(s.dir.path(), "k", INITIAL);
    s.plan("keyplan.yaml", &plan(&[("a", "k"), ("b", "k"), ("l", "k")]));

    let out = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert_eq!(
        out.matches("= keyslot 0  k v1").count(),
        3,
        "three adoptions: {out}"
    );
    assert!(
        out.contains("(adopt: the KMS's current key opens it)"),
        "{out}"
    );
    assert!(
        out.contains("0 to add, 0 to remove, 0 keys to rotate, 3 to adopt"),
        "{out}"
    );
    let j: serde_json::Value =
        serde_json::from_str(&s.ok(&["plan", "--json"], 0)).expect("plan --json");
    assert_eq!(j["summary"]["adopt"], 3);
    for c in j["changes"].as_array().expect("changes") {
        if c["type"] == "holder" {
            // The adopting plan records itself as the key's holder (invariant I7).
            assert_eq!(c["actions"], serde_json::json!(["record"]), "{c}");
            continue;
        }
        assert_eq!(c["actions"], serde_json::json!(["adopt"]), "{c}");
        assert_eq!(c["reason_code"], "adopt", "{c}");
    }
    assert_eq!(j["summary"]["holders"], 1);
    assert!(!token_for(&a, 0), "plan wrote nothing");
    // status runs no PBKDF: it says the devices wait for `plan` to test and adopt them (not
    // that apply could not proceed), and counts them as drifted.
    let out = s.ok(&["status"], 1);
    assert!(!out.contains("could not proceed"), "{out}");
    assert_eq!(
        out.matches(
            "k v1 is recorded in no keyslot, and keyslot 0 (not made by keyplan) may hold it"
        )
        .count(),
        3,
        "{out}"
    );

    let out = s.ok(&["apply", "--auto-approve"], 0);
    assert!(out.contains("3 adopted. (4 steps, 3 PBKDF runs)"), "{out}");
    assert!(token_for(&a, 0) && token_for(&b, 0));
    assert_eq!(keyslots(&a), vec![0], "no keyslot added");
    let luks1_records = std::fs::read_dir(s.path(".keyplan/luks1"))
        .expect("LUKS1 records")
        .count();
    assert_eq!(luks1_records, 1);
    let out = s.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(out.contains("No changes"), "{out}");

    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let (current, _) = file_kms_state(s.dir.path(), "k");
    let current = current.expect("current");
    for dev in [&a, &b, &l] {
        assert!(
            !opens(dev, INITIAL, None),
            "the adopted key opens nothing now"
        );
        assert!(
            opens(dev, &current, None),
            "the current key opens {}",
            dev.display()
        );
        assert_eq!(keyslots(dev).len(), 1);
    }
}

#[test]
fn a_pinned_key_is_adopted_where_it_is_and_moved_into_its_pin() {
    let s = Scratch::new();
    let a = s.small_image("a.img", "luks2");
    file_kms_put(s.dir.path(), "k", INITIAL);
    s.plan("keyplan.yaml", &plan(&[("a", "{ key: k, keyslot: 2 }")]));
    let out = s.ok(&["plan"], 0);
    assert!(out.contains("= keyslot 0  k v1"), "{out}");
    assert!(out.contains("+ keyslot 2  k v1"), "{out}");
    assert!(out.contains("- keyslot 0  k v1"), "{out}");
    s.ok(&["apply", "--auto-approve"], 0);
    assert_eq!(keyslots(&a), vec![2]);
    assert!(
        opens(&a, INITIAL, Some(2)),
        "v1 now lives in the pinned keyslot"
    );
    assert!(token_for(&a, 2));
    assert!(s.ok(&["plan"], 0).contains("No changes"));
}

#[test]
fn what_must_not_be_adopted_is_refused_as_before() {
    let refused = "keyplan holds no key that opens it, so it cannot enroll k; nothing was changed";
    // A KMS version that opens no keyslot.
    let s = Scratch::new();
    s.small_image("a.img", "luks2");
    file_kms_put(s.dir.path(), "k", b"not the passphrase of any keyslot");
    s.plan("keyplan.yaml", &plan(&[("a", "k")]));
    let out = s.ok(&["plan"], 1);
    assert!(out.contains(refused), "{out}");
    // A keyslot with priority `ignore`: kept out of normal unlocking on purpose.
    let s = Scratch::new();
    let a = s.small_image("a.img", "luks2");
    let st = std::process::Command::new(real_cryptsetup())
        .args(["config", "--priority", "ignore", "--key-slot", "0"])
        .arg(&a)
        .status()
        .expect("cryptsetup config");
    assert!(st.success());
    file_kms_put(s.dir.path(), "k", INITIAL);
    s.plan("keyplan.yaml", &plan(&[("a", "k")]));
    let out = s.ok(&["plan"], 1);
    assert!(out.contains(refused), "{out}");
    assert!(!out.contains("adopt"), "{out}");
    // An unbound keyslot (opens no data, though `--test-passphrase --key-slot` succeeds).
    let s = Scratch::new();
    let a = s.small_image("a.img", "luks2");
    std::fs::write(s.path("unbound.pass"), b"unbound passphrase").unwrap();
    let st = std::process::Command::new(real_cryptsetup())
        .args([
            "luksAddKey",
            "--batch-mode",
            "--unbound",
            "--key-size",
            "512",
        ])
        .args([
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-slot",
            "3",
        ])
        .arg(&a)
        .arg(s.path("unbound.pass"))
        .status()
        .expect("cryptsetup luksAddKey --unbound");
    assert!(st.success());
    assert!(!bound(&a, 3));
    file_kms_put(s.dir.path(), "k", b"unbound passphrase");
    s.plan("keyplan.yaml", &plan(&[("a", "k")]));
    let out = s.ok(&["plan"], 1);
    assert!(out.contains(refused), "{out}");
}

/// Rook's Vault layout: the KEK in KV v2 at `secret/<name>`, field `<name>`, in keyslot 0 of
/// the OSD. Taken over, rotated; Rook's read path then returns a key that opens the device and
/// the old one opens nothing.
#[test]
fn rooks_vault_layout_is_adopted_and_rotated() {
    let Some(bao) = openbao::OpenBao::start() else {
        return;
    };
    let s = Scratch::new();
    let a = s.small_image("a.img", "luks2");
    let name = "rook-ceph-osd-encryption-key-set1-data-0";
    bao.kv_put(name, name, INITIAL);
    s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  vault: {{ provider: vault, address: {}, mount: secret }}\nkeys:\n  osd: {{ kms: vault, name: {name} }}\ndevices:\n  a: {{ path: a.img, keys: [osd] }}\n{FAST_PBKDF}",
            bao.addr
        ),
    );
    let env = [("VAULT_TOKEN", Path::new(&bao.root_token))];
    let out = s.ok_with_env(&["plan"], &env, 0);
    assert!(out.contains("= keyslot 0  osd v1"), "{out}");
    let out = s.ok_with_env(&["apply", "--auto-approve", "--rotate", "osd"], &env, 0);
    assert!(out.contains("1 adopted"), "{out}");
    let rook_reads = bao.kv_field(name, name).expect("Rook's field");
    assert_ne!(rook_reads, INITIAL);
    assert!(
        opens(&a, &rook_reads, None),
        "Rook's read path opens the OSD"
    );
    assert!(!opens(&a, INITIAL, None), "the old KEK opens nothing");
    assert_eq!(keyslots(&a).len(), 1);
}

/// Rook's Secret layout: `rook-ceph-osd-encryption-key-<pvc>`, `data[dmcrypt-key]`, in
/// keyslot 0; taken over and rotated; the Secret's `dmcrypt-key` then opens the device.
#[test]
fn rooks_secret_layout_is_adopted_and_rotated() {
    let Some(c) = kube::Cluster::get() else {
        return;
    };
    let ns = c.fresh_namespace("adopt-rook");
    let kubeconfig = c.kubeconfig(&ns, "full");
    let s = Scratch::new();
    let a = s.small_image("a.img", "luks2");
    let name = "rook-ceph-osd-encryption-key-set1-data-0-x8k2p";
    use base64::Engine as _;
    c.put_secret(
        &ns,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/rook",
            "metadata": {"name": name, "namespace": ns},
            "data": {"dmcrypt-key": base64::engine::general_purpose::STANDARD.encode(INITIAL)},
        }),
    );
    s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  k8s: {{ provider: kubernetes, namespace: {ns} }}\nkeys:\n  osd: {{ kms: k8s, name: {name} }}\ndevices:\n  a: {{ path: a.img, keys: [osd] }}\n{FAST_PBKDF}"
        ),
    );
    let env = [("KUBECONFIG", kubeconfig.as_path())];
    let out = s.ok_with_env(&["plan"], &env, 0);
    assert!(out.contains("= keyslot 0  osd v1"), "{out}");
    s.ok_with_env(&["apply", "--auto-approve"], &env, 0);
    s.ok_with_env(&["apply", "--auto-approve", "--rotate", "osd"], &env, 0);
    let rook_reads = c.data(&ns, name, "dmcrypt-key").expect("dmcrypt-key");
    assert_ne!(rook_reads, INITIAL);
    assert!(
        opens(&a, &rook_reads, None),
        "the Secret's key opens the OSD"
    );
    assert!(!opens(&a, INITIAL, None), "the old KEK opens nothing");
}
