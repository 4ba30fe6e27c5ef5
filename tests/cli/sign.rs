//! `keyplan sign` from the command line: what it refuses to sign or overwrite, where the key
//! comes from, and that the signature it writes verifies as an agent checks it.

use crate::common::*;
use keyplan::fleet::signature::{PublicKey, SignaturePolicy};

fn fleet_plan(s: &Scratch, nodes: bool) -> std::path::PathBuf {
    let node = if nodes { ", node: worker-1" } else { "" };
    s.plan(
        "plan.yaml",
        &format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local }}\ndevices:\n  d: {{ path: d.img, keys: [k]{node} }}\n"
        ),
    )
}

#[test]
fn sign_refuses_what_it_must_not_do_and_writes_what_agents_verify() {
    let s = Scratch::new();
    s.ok(&["sign", "--generate-key", "ci.key"], 0);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(s.path("ci.key"))
            .expect("key")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    // Never replaced.
    let out = s.ok(&["sign", "--generate-key", "ci.key"], 1);
    assert!(out.contains("never replaces a key"), "{out}");

    // A plan agents would refuse (no node) is not signed.
    fleet_plan(&s, false);
    let out = s.ok(
        &["sign", "plan.yaml", "--cluster", "prod", "--key", "ci.key"],
        1,
    );
    assert!(
        out.contains("names its node") && !s.path("plan.yaml.sig").exists(),
        "{out}"
    );

    let plan = fleet_plan(&s, true);
    let before = std::fs::read(&plan).expect("plan");
    // -o onto the plan or the key, or any file that is not a signature: refused.
    for target in ["plan.yaml", "ci.key", "ci.key.pub"] {
        let out = s.ok(
            &[
                "sign",
                "plan.yaml",
                "--cluster",
                "prod",
                "--key",
                "ci.key",
                "-o",
                target,
            ],
            1,
        );
        assert!(out.contains("nothing was written"), "{target}: {out}");
    }
    assert_eq!(std::fs::read(&plan).expect("plan"), before);
    // A bad cluster name says why.
    let out = s.ok(
        &["sign", "plan.yaml", "--cluster", "Prod", "--key", "ci.key"],
        1,
    );
    assert!(out.contains("upper-case"), "{out}");
    // A public key is not a signing key.
    let out = s.ok(
        &[
            "sign",
            "plan.yaml",
            "--cluster",
            "prod",
            "--key",
            "ci.key.pub",
        ],
        1,
    );
    assert!(out.contains("holds a public key"), "{out}");

    // The key from KEYPLAN_SIGNING_KEY_FILE, then from the PEM text in KEYPLAN_SIGNING_KEY;
    // the signature (replacing the earlier one) verifies as an agent checks it.
    let key_file = s.path("ci.key");
    s.ok_with_env(
        &["sign", "plan.yaml", "--cluster", "prod"],
        &[("KEYPLAN_SIGNING_KEY_FILE", key_file.as_path())],
        0,
    );
    let pem = std::fs::read_to_string(&key_file).expect("key");
    let out = assert_cmd::Command::from_std(keyplan_command())
        .current_dir(s.path(""))
        .env("KEYPLAN_SIGNING_KEY", &pem)
        .args(["sign", "plan.yaml", "--cluster", "prod"])
        .output()
        .expect("sign");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 device on 1 node"), "{text}");
    assert!(
        !text.contains(pem.lines().nth(1).unwrap_or("-")),
        "key material in the output"
    );
    let public = PublicKey::from_pem(
        &std::fs::read(s.path("ci.key.pub")).expect("pub"),
        "ci.key.pub",
    )
    .expect("public key");
    let policy = SignaturePolicy::new(vec![public], "prod").expect("policy");
    let sig = std::fs::read(s.path("plan.yaml.sig")).expect("sig");
    policy
        .verify(&before, Some(&sig), "plan.yaml.sig", None)
        .expect("the signature verifies");
    // With KEYPLAN_SIGNING_KEY_FILE set, --generate-key still works.
    s.ok_with_env(
        &["sign", "--generate-key", "second.key"],
        &[("KEYPLAN_SIGNING_KEY_FILE", key_file.as_path())],
        0,
    );
}
