//! The `vault` KMS provider against a real OpenBao server (`bao server -dev`, started per test
//! on a free loopback port, see `common/openbao.rs`): the provider contract, Rook-style readers,
//! adoption, retention, check-and-set against other writers, damaged secrets, permissions,
//! TLS with `ca_cert`, namespaces, and the `keyplan` binary end to end on LUKS image files.
//! Every outcome is judged through the server's own CLI (`bao kv ...`) and cryptsetup, never
//! through keyplan's code.

use crate::common::kms_contract;
use crate::common::openbao;

use std::path::PathBuf;
use std::time::Instant;

use crate::common::*;
use keyplan::kms::vault::VaultKms;
use keyplan::kms::{Kms, KmsError, VersionState};
use keyplan::secret::Passphrase;
use keyplan::spec::KmsConfig;
use openbao::OpenBao;

/// The environment variable the test plans name as `token_env`.
const TOKEN_VAR: &str = "KEYPLAN_TEST_VAULT_TOKEN";

/// The minimal policy of docs/kms/vault.md, for keys under `keyplan/`.
const MINIMAL_POLICY: &str = r#"
path "secret/data/keyplan/*"     { capabilities = ["create", "read", "update"] }
path "secret/metadata/keyplan/*" { capabilities = ["read", "delete"] }
path "secret/destroy/keyplan/*"  { capabilities = ["update"] }
"#;

/// A policy that can read keys under `rook/` but not write them.
const READ_ONLY_POLICY: &str = r#"
path "secret/data/rook/*"     { capabilities = ["read"] }
path "secret/metadata/rook/*" { capabilities = ["read"] }
"#;

fn config(addr: &str, mount: &str) -> KmsConfig {
    KmsConfig::Vault {
        address: addr.to_string(),
        mount: Some(mount.to_string()),
        token_env: Some(TOKEN_VAR.to_string()),
        auth: None,
        namespace: None,
        ca_cert: None,
        timeout: None,
    }
}

fn vault_as(bao: &OpenBao, token: &str) -> VaultKms {
    VaultKms::new("vault", &config(&bao.addr, "secret"), token, TOKEN_VAR).expect("open vault")
}

fn vault(bao: &OpenBao) -> VaultKms {
    vault_as(bao, &bao.root_token)
}

fn pass(s: &str) -> Passphrase {
    Passphrase::new(s.as_bytes().to_vec())
}

fn done(name: &str, t0: Instant) {
    eprintln!("{name}: {:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn provider_contract() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start() else { return };
    // As root, keys nested below a path.
    let (kms, other) = (vault(&bao), vault(&bao));
    kms_contract::run(&kms, &other, "contract/root");
    // With exactly the documented minimal policy: check() passes and the contract holds.
    let token = bao.token_with_policy("keyplan-minimal", MINIMAL_POLICY);
    let (kms, other) = (vault_as(&bao, &token), vault_as(&bao, &token));
    kms.check(&["keyplan/x".to_string(), "keyplan/deep/y".to_string()])
        .expect("check with the minimal policy");
    kms_contract::run(&kms, &other, "keyplan/contract");
    done("provider_contract", t0);
}

#[test]
fn rook_reader_adoption_and_retention() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start() else { return };
    let kms = vault(&bao);
    let key = "rook/osd-a";
    // Rook wrote the KEK and rotated it once: KV versions 1 and 2, field named after the key.
    bao.kv_put(key, "osd-a", b"rook-original");
    bao.kv_put(key, "osd-a", b"rook-rotated");
    let st = kms.read(key).expect("read adopted");
    assert_eq!((st.current, st.pending), (Some(2), None), "{st:?}");
    assert_eq!(st.versions[&2].state, VersionState::Current);
    assert!(st.versions[&2].created_at > 1_600_000_000);
    assert_eq!(kms.get(key, 2).unwrap().expose(), b"rook-rotated");

    // Staged: a Rook-style reader still sees the current version, never the pending one.
    let v = kms
        .stage(key, &pass("keyplan-third-CCCC"), 0)
        .expect("stage");
    assert_eq!(v, 3);
    assert_eq!(bao.kv_field(key, "osd-a").unwrap(), b"rook-rotated");
    let pending = bao
        .kv_data("rook/osd-a.keyplan-pending", None)
        .expect("pending secret");
    assert_eq!(pending["keyplan_version"], "3");
    assert_eq!(pending["passphrase"], "keyplan-third-CCCC");

    kms.commit(key, Some(2), 3).expect("commit");
    assert_eq!(bao.kv_field(key, "osd-a").unwrap(), b"keyplan-third-CCCC");
    let data = bao.kv_data(key, None).unwrap();
    assert_eq!(data["keyplan_version"], "3");
    let history: Vec<[u64; 3]> =
        serde_json::from_str(data["keyplan_history"].as_str().expect("history text")).unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(&history[0][..2], &[2, 2], "v2 lives in KV version 2");
    assert!(
        bao.kv_metadata("rook/osd-a.keyplan-pending").is_none(),
        "the pending secret is deleted after the commit"
    );
    let st = kms.read(key).unwrap();
    assert_eq!(st.versions[&2].state, VersionState::Previous);
    assert_eq!(st.versions[&3].state, VersionState::Current);

    // Retention: retiring v2 destroys KV version 2 only; Rook's first version is not keyplan's.
    kms.retire(key, 2).expect("retire");
    let meta = bao.kv_metadata(key).unwrap();
    assert_eq!(meta["versions"]["2"]["destroyed"], true, "{meta}");
    assert_eq!(meta["versions"]["1"]["destroyed"], false, "{meta}");
    assert_eq!(meta["versions"]["3"]["destroyed"], false, "{meta}");
    assert!(bao.kv_data(key, Some(2)).is_none());
    let st = kms.read(key).unwrap();
    assert_eq!(st.versions[&2].state, VersionState::Retired);
    assert!(matches!(
        kms.get(key, 2),
        Err(KmsError::NoSuchVersion { .. })
    ));

    // A version soft-deleted by someone else reads as retired too.
    let v4 = kms.stage(key, &pass("fourth-DDDD"), 0).unwrap();
    kms.commit(key, Some(3), v4).unwrap();
    bao.cli(&["kv", "delete", "-mount=secret", "-versions=3", key]);
    assert_eq!(
        kms.read(key).unwrap().versions[&3].state,
        VersionState::Retired
    );
    done("rook_reader_adoption_and_retention", t0);
}

#[test]
fn concurrent_writer_between_stage_and_commit_is_a_conflict() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start() else { return };
    let kms = vault(&bao);
    let key = "app/kek";
    kms.stage(key, &pass("one-AAAA"), 1).unwrap();
    kms.commit(key, None, 1).unwrap();
    let v2 = kms.stage(key, &pass("two-BBBB"), 0).unwrap();
    // Another tool writes the main path between stage and commit.
    bao.kv_put(key, "kek", b"other-writer-value");
    match kms.commit(key, Some(1), v2) {
        Err(e @ KmsError::Conflict { .. }) => {
            let text = e.to_string();
            assert!(text.contains("nothing was overwritten"), "{text}");
            assert!(text.contains("secret/data/app/kek"), "{text}");
        }
        other => panic!("expected a Conflict, got {other:?}"),
    }
    // Nothing was overwritten: the other writer's value is current; keyplan's v2 stays pending.
    assert_eq!(bao.kv_field(key, "kek").unwrap(), b"other-writer-value");
    assert_eq!(bao.kv_metadata(key).unwrap()["current_version"], 2);
    assert_eq!(
        bao.kv_data("app/kek.keyplan-pending", None).unwrap()["keyplan_version"],
        "2"
    );
    // Reads refuse to guess which passphrase the devices hold, and say how to undo it.
    match kms.read(key) {
        Err(KmsError::Corrupt { detail, .. }) => {
            assert!(detail.contains("another tool"), "{detail}");
            assert!(detail.contains("kv rollback"), "{detail}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // So does every other write.
    assert!(matches!(
        kms.stage(key, &pass("x-XXXX"), 0),
        Err(KmsError::Conflict { .. })
    ));
    assert!(matches!(kms.retire(key, 1), Err(KmsError::Conflict { .. })));
    assert!(matches!(
        kms.destroy_key(key, 1),
        Err(KmsError::Conflict { .. })
    ));
    assert_eq!(bao.kv_field(key, "kek").unwrap(), b"other-writer-value");

    // A `kv patch` during a rotation keeps keyplan's fields but not the KV version the pending
    // version was staged on: the commit refuses as well.
    let key = "app/patched";
    kms.stage(key, &pass("one-AAAA"), 1).unwrap();
    kms.commit(key, None, 1).unwrap();
    let v2 = kms.stage(key, &pass("two-BBBB"), 0).unwrap();
    bao.cli(&["kv", "patch", "-mount=secret", key, "patched=other-field"]);
    match kms.commit(key, Some(1), v2) {
        Err(KmsError::Conflict { detail, .. }) => {
            assert!(detail.contains("staged on KV version 1"), "{detail}")
        }
        other => panic!("expected a Conflict, got {other:?}"),
    }
    assert_eq!(bao.kv_field(key, "patched").unwrap(), b"other-field");
    assert_eq!(bao.kv_metadata(key).unwrap()["current_version"], 2);

    // A concurrent writer that creates the main path of a new key first also wins, although
    // its KV version 1 would read as "v1", the number of keyplan's pending version.
    let key = "app/new";
    let v1 = kms.stage(key, &pass("new-CCCC"), 1).unwrap();
    bao.kv_put(key, "new", b"created-elsewhere");
    match kms.commit(key, None, v1) {
        Err(KmsError::Conflict { detail, .. }) => {
            assert!(detail.contains("kv metadata delete"), "{detail}")
        }
        other => panic!("expected a Conflict, got {other:?}"),
    }
    assert_eq!(bao.kv_field(key, "new").unwrap(), b"created-elsewhere");
    assert!(matches!(kms.read(key), Err(KmsError::Corrupt { .. })));
    assert!(matches!(kms.get(key, 1), Err(KmsError::Corrupt { .. })));
    // The operator keeps the other value: deleting keyplan's pending version resolves it.
    bao.cli(&[
        "kv",
        "metadata",
        "delete",
        "-mount=secret",
        "app/new.keyplan-pending",
    ]);
    assert_eq!(kms.read(key).unwrap().current, Some(1));
    assert_eq!(kms.get(key, 1).unwrap().expose(), b"created-elsewhere");
    done(
        "concurrent_writer_between_stage_and_commit_is_a_conflict",
        t0,
    );
}

#[test]
fn stale_pending_leftover_is_ignored_and_replaced() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start() else { return };
    let kms = vault(&bao);
    let key = "k";
    kms.stage(key, &pass("one-AAAA"), 1).unwrap();
    kms.commit(key, None, 1).unwrap();
    kms.stage(key, &pass("two-BBBB"), 0).unwrap();
    kms.commit(key, Some(1), 2).unwrap();
    // A commit whose cleanup was cut short leaves the pending secret of the committed version.
    let leftover = |version: &str| {
        let out = bao.cli_as(
            &bao.root_token,
            &[
                "kv",
                "put",
                "-mount=secret",
                "k.keyplan-pending",
                "passphrase=-",
                &format!("keyplan_version={version}"),
                "keyplan_created_at=1700000000",
            ],
            b"two-BBBB",
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    leftover("2");
    let st = kms.read(key).unwrap();
    assert_eq!((st.current, st.pending), (Some(2), None), "{st:?}");
    // A repeated commit (lost reply) is fine and removes the leftover.
    kms.commit(key, Some(1), 2).expect("repeated commit");
    assert!(bao.kv_metadata("k.keyplan-pending").is_none());
    // stage() replaces a leftover with the new pending version.
    leftover("1");
    let v = kms
        .stage(key, &pass("three-CCCC"), 0)
        .expect("stage over a leftover");
    assert_eq!(v, 3);
    let p = bao.kv_data("k.keyplan-pending", None).unwrap();
    assert_eq!(p["keyplan_version"], "3");
    assert_eq!(p["passphrase"], "three-CCCC");
    assert_eq!(bao.kv_field(key, "k").unwrap(), b"two-BBBB");
    kms.commit(key, Some(2), 3).unwrap();
    assert_eq!(bao.kv_field(key, "k").unwrap(), b"three-CCCC");
    done("stale_pending_leftover_is_ignored_and_replaced", t0);
}

#[test]
fn refusals_and_damaged_secrets() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start() else { return };
    let kms = vault(&bao);

    // Material that is not UTF-8 cannot be a KV string: refused, nothing written.
    match kms.stage("bin", &Passphrase::new(vec![0xff, 0xfe, 0x00, 0x41]), 1) {
        Err(KmsError::Config { detail, .. }) => assert!(detail.contains("UTF-8"), "{detail}"),
        other => panic!("expected Config, got {other:?}"),
    }
    assert!(bao.kv_metadata("bin").is_none());
    assert!(bao.kv_metadata("bin.keyplan-pending").is_none());

    // Names that would collide with keyplan's own paths and fields.
    assert!(matches!(
        kms.read("x.keyplan-pending"),
        Err(KmsError::Config { .. })
    ));
    assert!(matches!(
        kms.read("a/keyplan_history"),
        Err(KmsError::Config { .. })
    ));

    // The current version deleted by someone: keyplan cannot tell what opens the devices.
    kms.stage("del", &pass("one-AAAA"), 1).unwrap();
    kms.commit("del", None, 1).unwrap();
    bao.cli(&["kv", "delete", "-mount=secret", "del"]);
    match kms.read("del") {
        Err(KmsError::Corrupt { detail, .. }) => assert!(detail.contains("undelete"), "{detail}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(kms.stage("del", &pass("two-BBBB"), 0).is_err());
    bao.cli(&["kv", "undelete", "-mount=secret", "-versions=1", "del"]);
    assert_eq!(kms.read("del").unwrap().current, Some(1));

    // A secret without the passphrase field is refused, naming the field.
    bao.kv_put("nofield", "other", b"x");
    match kms.read("nofield") {
        Err(KmsError::Corrupt { detail, .. }) => {
            assert!(detail.contains("\"nofield\""), "{detail}")
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }

    // A destroy_key cut short after its tombstone: reads as gone, a second call finishes it.
    kms.stage("gone", &pass("one-AAAA"), 1).unwrap();
    kms.commit("gone", None, 1).unwrap();
    bao.cli(&[
        "kv",
        "put",
        "-mount=secret",
        "gone",
        "keyplan_destroyed_at=1700000000",
    ]);
    let st = kms.read("gone").unwrap();
    assert_eq!((st.current, st.pending), (None, None), "{st:?}");
    kms.destroy_key("gone", 1).expect("finish destroy");
    assert!(bao.kv_metadata("gone").is_none());

    // A mount that is not KV version 2.
    bao.cli(&["secrets", "enable", "-path=kv1", "-version=1", "kv"]);
    let v1 = VaultKms::new(
        "vault",
        &config(&bao.addr, "kv1"),
        &bao.root_token,
        TOKEN_VAR,
    )
    .unwrap();
    match v1.check(&["k".to_string()]) {
        Err(KmsError::Config { detail, .. }) => {
            assert!(detail.contains("not KV version 2"), "{detail}")
        }
        other => panic!("expected Config, got {other:?}"),
    }
    // A mount that does not exist (the server cannot tell it from one without access).
    let none = VaultKms::new(
        "vault",
        &config(&bao.addr, "nosuch"),
        &bao.root_token,
        TOKEN_VAR,
    )
    .unwrap();
    match none.check(&["k".to_string()]) {
        Err(KmsError::Denied { detail, .. }) => {
            assert!(detail.contains("does not exist"), "{detail}")
        }
        other => panic!("expected Denied, got {other:?}"),
    }

    // A key whose settings would soft-delete the current version behind keyplan's back.
    kms.stage("ttl", &pass("one-AAAA"), 1).unwrap();
    kms.commit("ttl", None, 1).unwrap();
    bao.cli(&[
        "kv",
        "metadata",
        "put",
        "-mount=secret",
        "-delete-version-after=1h",
        "ttl",
    ]);
    match kms.check(&["ttl".to_string()]) {
        Err(KmsError::Config { detail, .. }) => {
            assert!(detail.contains("delete_version_after"), "{detail}")
        }
        other => panic!("expected Config, got {other:?}"),
    }
    done("refusals_and_damaged_secrets", t0);
}

#[test]
fn read_only_and_invalid_tokens_are_denied() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start() else { return };
    let root = vault(&bao);
    root.stage("rook/k", &pass("one-AAAA"), 1).unwrap();
    root.commit("rook/k", None, 1).unwrap();

    let token = bao.token_with_policy("read-only", READ_ONLY_POLICY);
    let ro = vault_as(&bao, &token);
    // It can read...
    assert_eq!(ro.read("rook/k").unwrap().current, Some(1));
    // ...but check() names every missing capability and its path, and writes nothing.
    match ro.check(&["rook/k".to_string()]) {
        Err(e @ KmsError::Denied { .. }) => {
            let text = e.to_string();
            for want in [
                "\"create\", \"update\" on secret/data/rook/k",
                "\"delete\" on secret/metadata/rook/k",
                "\"update\" on secret/destroy/rook/k",
                "\"create\" on secret/data/rook/k.keyplan-pending",
                "\"delete\" on secret/metadata/rook/k.keyplan-pending",
                KEY_VAR_MENTION,
            ] {
                assert!(text.contains(want), "missing {want:?} in: {text}");
            }
            assert!(!text.contains(&token), "the token must not appear: {text}");
        }
        other => panic!("expected Denied, got {other:?}"),
    }
    // Writes are refused by the server as well.
    match ro.stage("rook/k", &pass("two-BBBB"), 0) {
        Err(e @ KmsError::Denied { .. }) => {
            assert!(e.to_string().contains("403"), "{e}")
        }
        other => panic!("expected Denied, got {other:?}"),
    }
    assert!(bao.kv_metadata("rook/k.keyplan-pending").is_none());

    // An invalid token: check() and reads are Denied (no retries needed to say so).
    let bad = vault_as(&bao, "s.not-a-real-token");
    assert!(matches!(
        bad.check(&["rook/k".to_string()]),
        Err(KmsError::Denied { .. })
    ));
    match bad.read("rook/k") {
        Err(e @ KmsError::Denied { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&bao.addr), "{text}");
            assert!(!text.contains("not-a-real-token"), "{text}");
        }
        other => panic!("expected Denied, got {other:?}"),
    }
    done("read_only_and_invalid_tokens_are_denied", t0);
}

/// Denied messages name the variable the token came from.
const KEY_VAR_MENTION: &str = "$KEYPLAN_TEST_VAULT_TOKEN";

#[test]
fn unreachable_server_is_unavailable() {
    let t0 = Instant::now();
    // A loopback port nobody listens on: connection refused, as with a stopped server.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("http://127.0.0.1:{port}");
    let kms = VaultKms::new("vault", &config(&addr, "secret"), "t", TOKEN_VAR).unwrap();
    // (Each call retries 3 times first, about 1.5 s.)
    for r in [
        kms.read("k").map(|_| ()),
        kms.stage("k", &pass("one-AAAA"), 1).map(|_| ()),
    ] {
        match r {
            Err(e @ KmsError::Unavailable { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains(&format!("vault KMS \"vault\" ({addr}, mount secret)")),
                    "{text}"
                );
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
    done("unreachable_server_is_unavailable", t0);
}

/// Something other than Vault at `address` (a wrong port, a proxy or load balancer) that
/// answers every request with a bare 404: the provider says it could not ask (Unavailable,
/// which `plan`, `verify` and `status` turn into exit 3), never "no such key", which would
/// read as a KMS that lost its keys (a new user's finding, issue 29).
#[test]
fn a_bare_404_from_another_server_is_unavailable_not_missing() {
    let t0 = Instant::now();
    let server = tiny_http::Server::http("127.0.0.1:0").expect("bind");
    let addr = format!("http://{}", server.server_addr().to_ip().expect("ip"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(Some(req)) = server.recv_timeout(std::time::Duration::from_millis(50)) {
                    let _ = req.respond(tiny_http::Response::empty(404));
                }
            }
        })
    };
    let kms = VaultKms::new("vault", &config(&addr, "secret"), "t", TOKEN_VAR).unwrap();
    match kms.read("k") {
        Err(e @ KmsError::Unavailable { .. }) => {
            let text = e.to_string();
            assert!(text.contains("HTTP 404") && text.contains(&addr), "{text}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = worker.join();
    done(
        "a_bare_404_from_another_server_is_unavailable_not_missing",
        t0,
    );
}

#[test]
fn tls_with_ca_cert_and_namespace() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start_tls() else {
        return;
    };
    let ca = bao.ca_cert.clone().expect("CA");
    bao.cli(&["namespace", "create", "team-a"]);
    bao.cli(&["secrets", "enable", "-ns=team-a", "-path=secret", "kv-v2"]);
    let cfg = KmsConfig::Vault {
        address: bao.addr.clone(),
        mount: None,
        token_env: None,
        auth: None,
        namespace: Some("team-a".to_string()),
        ca_cert: Some(ca.display().to_string()),
        timeout: None,
    };
    let kms = VaultKms::new("tls", &cfg, &bao.root_token, "VAULT_TOKEN").unwrap();
    kms.check(&["k".to_string()]).expect("check over TLS");
    kms.stage("k", &pass("tls-ns-AAAA"), 1).unwrap();
    kms.commit("k", None, 1).unwrap();
    // The secret is inside the namespace (seen by the CLI there), not in the root one.
    let out = bao.cli(&["kv", "get", "-ns=team-a", "-mount=secret", "-field=k", "k"]);
    assert_eq!(out, b"tls-ns-AAAA");
    assert!(bao.kv_metadata("k").is_none());

    // Without the CA the server's certificate is not trusted: unavailable, saying why.
    let untrusted = KmsConfig::Vault {
        address: bao.addr.clone(),
        mount: None,
        token_env: None,
        auth: None,
        namespace: Some("team-a".to_string()),
        ca_cert: None,
        timeout: None,
    };
    let kms = VaultKms::new("tls", &untrusted, &bao.root_token, "VAULT_TOKEN").unwrap();
    match kms.read("k") {
        Err(e @ KmsError::Unavailable { .. }) => {
            assert!(e.to_string().to_lowercase().contains("certificate"), "{e}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // An unreadable CA file is a configuration error at open time.
    let missing_ca = KmsConfig::Vault {
        address: bao.addr.clone(),
        mount: None,
        token_env: None,
        auth: None,
        namespace: None,
        ca_cert: Some("/nonexistent/ca.pem".to_string()),
        timeout: None,
    };
    match VaultKms::new("tls", &missing_ca, &bao.root_token, "VAULT_TOKEN") {
        Err(KmsError::Config { detail, .. }) => {
            assert!(detail.contains("/nonexistent/ca.pem"), "{detail}")
        }
        other => panic!("expected Config, got {other:?}"),
    }
    done("tls_with_ca_cert_and_namespace", t0);
}

// ---------------------------------------------------------------------------------------------
// The keyplan binary end to end.

/// A plan with the vault KMS at `addr` and key `osd-kek` (`rook/osd-kek` in the KMS) shared by
/// two LUKS2 devices and a LUKS1 one.
fn vault_plan(addr: &str) -> String {
    format!(
        r#"version: 1
kms:
  vault:
    provider: vault
    address: {addr}
    mount: secret
    token_env: {TOKEN_VAR}
keys:
  osd-kek:
    kms: vault
    name: rook/osd-kek
devices:
  block: {{ path: block.img, keys: [osd-kek], enroll_with: initial.pass }}
  db: {{ path: db.img, keys: [osd-kek], enroll_with: initial.pass }}
  legacy: {{ path: legacy.img, keys: [osd-kek], enroll_with: initial.pass }}
{FAST_PBKDF}"#
    )
}

fn setup(s: &Scratch, addr: &str) -> Vec<PathBuf> {
    s.initial_pass();
    s.plan("keyplan.yaml", &vault_plan(addr));
    vec![
        s.small_image("block.img", "luks2"),
        s.small_image("db.img", "luks2"),
        s.small_image("legacy.img", "luks1"),
    ]
}

/// Runs keyplan (watched) with `token` in the plan's token variable and `env`; asserts the
/// exit code (`None`: killed by a signal) and that the token never shows in its output.
fn kp_env(
    w: &Watched,
    token: &str,
    env: &[(&str, &str)],
    args: &[&str],
    code: Option<i32>,
) -> String {
    let mut cmd = w.command(args);
    cmd.env(TOKEN_VAR, token);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run keyplan");
    w.record(&out);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), code, "keyplan {args:?}:\n{text}");
    assert!(!text.contains(token), "keyplan {args:?} printed the token");
    text
}

fn kp(w: &Watched, token: &str, args: &[&str], code: i32) -> String {
    kp_env(w, token, &[], args, Some(code))
}

/// The current passphrase of `rook/osd-kek` as a Rook-style reader sees it.
fn rook_reads(bao: &OpenBao) -> Vec<u8> {
    bao.kv_field("rook/osd-kek", "osd-kek")
        .expect("bao kv get -field=osd-kek secret/rook/osd-kek")
}

#[test]
fn cli_enroll_rotate_retire_with_rook_reader() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start() else { return };
    let w = Watched::new();
    let devs = setup(&w.s, &bao.addr);
    let token = bao.root_token.clone();

    let out = kp(&w, &token, &["apply", "--auto-approve"], 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let v1 = rook_reads(&bao);
    w.add_secret(&v1);
    assert_eq!(v1.len(), 44, "32 random bytes as base64");
    let data = bao.kv_data("rook/osd-kek", None).unwrap();
    assert_eq!(data["keyplan_version"], "1", "{data}");
    assert!(bao.kv_metadata("rook/osd-kek.keyplan-pending").is_none());
    for d in &devs {
        assert!(opens(d, &v1, None), "v1 opens {}", d.display());
        assert!(opens(d, INITIAL, None), "unmanaged keyslot kept");
    }

    let out = kp(
        &w,
        &token,
        &["apply", "--auto-approve", "--rotate", "osd-kek"],
        0,
    );
    assert!(out.contains("Apply complete!"), "{out}");
    let v2 = rook_reads(&bao);
    w.add_secret(&v2);
    assert_ne!(v1, v2);
    for d in &devs {
        assert!(opens(d, &v2, None), "v2 opens {}", d.display());
        assert!(!opens(d, &v1, None), "v1 no longer opens {}", d.display());
    }
    // The engine keeps the superseded version as `previous` (docs/rotation.md retention): KV
    // version 2 (v1 written again with its holder record, which destroyed its first copy, KV
    // version 1) still holds v1; keyplan's fields record it.
    let meta = bao.kv_metadata("rook/osd-kek").unwrap();
    assert_eq!(meta["current_version"], 3, "{meta}");
    assert_eq!(meta["versions"]["1"]["destroyed"], true, "{meta}");
    assert_eq!(meta["versions"]["2"]["destroyed"], false, "{meta}");
    let data = bao.kv_data("rook/osd-kek", None).unwrap();
    assert_eq!(data["keyplan_version"], "2");
    assert!(
        data["keyplan_history"]
            .as_str()
            .is_some_and(|h| h.starts_with("[[1,2,")),
        "{data}"
    );
    assert!(bao.kv_metadata("rook/osd-kek.keyplan-pending").is_none());

    // A second rotation retires v1: its KV version is destroyed in the server.
    kp(
        &w,
        &token,
        &["apply", "--auto-approve", "--rotate", "osd-kek"],
        0,
    );
    let v3 = rook_reads(&bao);
    w.add_secret(&v3);
    assert!(v3 != v1 && v3 != v2);
    for d in &devs {
        assert!(opens(d, &v3, None), "v3 opens {}", d.display());
        assert!(!opens(d, &v2, None), "v2 no longer opens {}", d.display());
        assert!(!opens(d, &v1, None), "v1 no longer opens {}", d.display());
    }
    let meta = bao.kv_metadata("rook/osd-kek").unwrap();
    assert_eq!(meta["current_version"], 4, "{meta}");
    assert_eq!(meta["versions"]["1"]["destroyed"], true, "{meta}");
    assert_eq!(meta["versions"]["2"]["destroyed"], true, "{meta}");
    assert_eq!(meta["versions"]["3"]["destroyed"], false, "{meta}");
    assert_eq!(meta["versions"]["4"]["destroyed"], false, "{meta}");
    for kv in [1, 2] {
        assert!(
            bao.kv_data("rook/osd-kek", Some(kv)).is_none(),
            "v1's material is gone (KV version {kv})"
        );
    }
    assert!(bao.kv_metadata("rook/osd-kek.keyplan-pending").is_none());
    let v2 = v3;

    kp(&w, &token, &["plan", "--detailed-exitcode"], 0);
    // Break-glass: `key get` prints the current passphrase (stdout is not a TTY). Not
    // recorded: its output is the secret by design.
    let out = w
        .command(&["key", "get", "osd-kek"])
        .env(TOKEN_VAR, &token)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, v2);

    assert!(w.wrapper_saw_calls());
    // The KMS credential never reaches a cryptsetup child's environment (or argv).
    let log = w.child_log();
    assert!(
        !contains(&log, token.as_bytes()),
        "the Vault token reached cryptsetup"
    );
    assert!(
        !contains(&log, TOKEN_VAR.as_bytes()),
        "the token variable reached cryptsetup"
    );
    w.assert_no_leaks();
    done("cli_enroll_rotate_retire_with_rook_reader", t0);
}

#[test]
fn cli_server_down_is_unavailable_and_devices_untouched() {
    let t0 = Instant::now();
    let Some(mut bao) = OpenBao::start() else {
        return;
    };
    let w = Watched::new();
    let devs = setup(&w.s, &bao.addr);
    let token = bao.root_token.clone();
    kp(&w, &token, &["apply", "--auto-approve"], 0);
    w.add_secret(&rook_reads(&bao));

    bao.stop();
    let snap = Snapshot::take(&devs);
    let named = format!(
        "vault KMS \"vault\" ({}, mount secret) is unavailable",
        bao.addr
    );
    let out = kp(
        &w,
        &token,
        &["apply", "--auto-approve", "--rotate", "osd-kek"],
        1,
    );
    assert!(out.contains(&named), "{out}");
    snap.assert_unchanged("apply with the server down");
    // `plan` could not check: exit 3.
    let out = kp(&w, &token, &["plan", "--rotate", "osd-kek"], 3);
    assert!(out.contains(&named), "{out}");
    snap.assert_unchanged("plan with the server down");
    w.assert_no_leaks();
    done("cli_server_down_is_unavailable_and_devices_untouched", t0);
}

#[test]
fn cli_read_only_token_is_denied_before_touching_devices() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start() else { return };
    let w = Watched::new();
    let devs = setup(&w.s, &bao.addr);
    kp(&w, &bao.root_token, &["apply", "--auto-approve"], 0);
    let v1 = rook_reads(&bao);
    w.add_secret(&v1);

    let ro = bao.token_with_policy("read-only", READ_ONLY_POLICY);
    let snap = Snapshot::take(&devs);
    let out = kp(
        &w,
        &ro,
        &["apply", "--auto-approve", "--rotate", "osd-kek"],
        1,
    );
    assert!(out.contains("refused"), "{out}");
    assert!(
        out.contains("secret/data/rook/osd-kek.keyplan-pending"),
        "{out}"
    );
    snap.assert_unchanged("apply with a read-only token");
    assert_eq!(rook_reads(&bao), v1);
    assert!(bao.kv_metadata("rook/osd-kek.keyplan-pending").is_none());
    w.assert_no_leaks();
    done("cli_read_only_token_is_denied_before_touching_devices", t0);
}

/// `plan` calls `Kms::check` before anything is touched, so a token that cannot write fails
/// at plan time, naming the missing capability.
#[test]
fn cli_plan_with_read_only_token_fails() {
    let Some(bao) = OpenBao::start() else { return };
    let w = Watched::new();
    let devs = setup(&w.s, &bao.addr);
    kp(&w, &bao.root_token, &["apply", "--auto-approve"], 0);
    let ro = bao.token_with_policy("read-only", READ_ONLY_POLICY);
    let snap = Snapshot::take(&devs);
    let out = kp(&w, &ro, &["plan", "--rotate", "osd-kek"], 3);
    assert!(out.contains("\"create\""), "{out}");
    snap.assert_unchanged("plan with a read-only token");
}

/// keyplan is killed just before its commit (devices hold the pending v2); another tool then
/// writes the key. The next apply stops with an error instead of overwriting it, and every
/// device still opens with v1.
#[cfg(feature = "failpoints")]
#[test]
fn cli_foreign_write_after_crash_before_commit_stops_keyplan() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start() else { return };
    let w = Watched::new();
    let devs = setup(&w.s, &bao.addr);
    let token = bao.root_token.clone();
    kp(&w, &token, &["apply", "--auto-approve"], 0);
    let v1 = rook_reads(&bao);
    w.add_secret(&v1);

    kp_env(
        &w,
        &token,
        &[("FAILPOINTS", "kms.commit=return")],
        &["apply", "--auto-approve", "--rotate", "osd-kek"],
        None,
    );
    let pending = bao
        .kv_data("rook/osd-kek.keyplan-pending", None)
        .expect("v2 pending");
    assert_eq!(pending["keyplan_version"], "2");
    let v2 = pending["passphrase"].as_str().unwrap().as_bytes().to_vec();
    w.add_secret(&v2);
    assert_eq!(
        rook_reads(&bao),
        v1,
        "readers never see the pending version"
    );
    for d in &devs {
        assert!(opens(d, &v1, None), "I1: v1 opens {}", d.display());
    }

    bao.kv_put("rook/osd-kek", "osd-kek", b"written-by-another-tool");
    let snap = Snapshot::take(&devs);
    let out = kp(&w, &token, &["apply", "--auto-approve"], 1);
    assert!(out.contains("written by another tool"), "{out}");
    assert_eq!(rook_reads(&bao), b"written-by-another-tool");
    snap.assert_unchanged("apply after a foreign write");
    for d in &devs {
        assert!(opens(d, &v1, None), "v1 still opens {}", d.display());
    }
    w.assert_no_leaks();
    done(
        "cli_foreign_write_after_crash_before_commit_stops_keyplan",
        t0,
    );
}

/// keyplan is killed right after its commit (the reply is lost); the next apply finishes the
/// rotation: every device opens with v2 only, the server holds v2 as current, plan is clean.
#[cfg(feature = "failpoints")]
#[test]
fn cli_lost_commit_reply_converges() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start() else { return };
    let w = Watched::new();
    let devs = setup(&w.s, &bao.addr);
    let token = bao.root_token.clone();
    kp(&w, &token, &["apply", "--auto-approve"], 0);
    let v1 = rook_reads(&bao);
    w.add_secret(&v1);

    kp_env(
        &w,
        &token,
        &[("FAILPOINTS", "kms.commit.lost_reply=return")],
        &["apply", "--auto-approve", "--rotate", "osd-kek"],
        None,
    );
    let v2 = rook_reads(&bao);
    w.add_secret(&v2);
    assert_ne!(v1, v2, "the commit happened");
    for d in &devs {
        assert!(opens(d, &v2, None), "I1: v2 opens {}", d.display());
    }
    kp(&w, &token, &["apply", "--auto-approve"], 0);
    for d in &devs {
        assert!(opens(d, &v2, None), "v2 opens {}", d.display());
        assert!(!opens(d, &v1, None), "v1 no longer opens {}", d.display());
    }
    assert_eq!(rook_reads(&bao), v2);
    assert_eq!(
        bao.kv_metadata("rook/osd-kek").unwrap()["current_version"],
        3
    );
    assert!(bao.kv_metadata("rook/osd-kek.keyplan-pending").is_none());
    kp(&w, &token, &["plan", "--detailed-exitcode"], 0);
    w.assert_no_leaks();
    done("cli_lost_commit_reply_converges", t0);
}

// ---------------------------------------------------------------------------------------------
// A Vault that never answers (issue 29).

/// A plan whose three keys live in a vault KMS at `addr` (with `extra`, e.g. `timeout: 2s`),
/// one of them enrolled on a LUKS2 image.
fn silent_vault_plan(s: &Scratch, addr: &str, extra: &str) {
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  v: {{ provider: vault, address: \"http://{addr}\"{extra} }}\nkeys:\n  a: {{ kms: v }}\n  b: {{ kms: v }}\n  c: {{ kms: v }}\ndevices:\n  d: {{ path: a.img, keys: [a], enroll_with: initial.pass }}\n{FAST_PBKDF}"
        ),
    );
}

/// A Vault that accepts connections and never answers, holding three keys: `status` ends
/// within the KMS's `timeout` (2 s here; the bound asserted leaves generous slack) with exit 3
/// and the KMS and deadline under `unchecked`; `plan` and `verify` end as soon with exit 1 and
/// an error naming both. Before issue 29 the same status took 370 s (every key read four
/// times, 30 s each), and `timeout` was not a plan field.
#[test]
fn a_vault_that_never_answers_is_bounded() {
    let (_silent, addr) = silent_listener();
    let s = Scratch::new();
    silent_vault_plan(&s, &addr, ", timeout: 2s");
    assert_silent_kms_bounded(
        s.dir.path(),
        &[("VAULT_TOKEN", "t")],
        r#"vault KMS "v""#,
        2,
        std::time::Duration::from_secs(12),
    );
}

/// The same without `timeout` in the plan: the default, 30 s, bounds `status` (one silent
/// KMS costs it one timeout, not one per key and retry).
#[test]
fn a_silent_vault_costs_status_one_default_timeout() {
    let (_silent, addr) = silent_listener();
    let s = Scratch::new();
    silent_vault_plan(&s, &addr, "");
    let (out, took) = keyplan_timed(
        s.dir.path(),
        &["status", "--format", "json"],
        &[("VAULT_TOKEN", "t")],
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        took < std::time::Duration::from_secs(45),
        "status took {took:?} with a silent KMS and the default 30 s timeout"
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert!(j["unchecked"].to_string().contains("within 30 s"), "{j}");
}

/// `bao kv put -mount=secret [-cas=N] PATH FIELD=VALUE...` (a `FIELD=-` value on stdin),
/// asserting success: a write keyplan did not make.
fn kv_put_fields(bao: &OpenBao, path: &str, cas: Option<u64>, stdin: &[u8], fields: &[&str]) {
    let cas = cas.map(|c| format!("-cas={c}"));
    let mut args = vec!["kv", "put", "-mount=secret"];
    args.extend(cas.as_deref());
    args.push(path);
    args.extend_from_slice(fields);
    let out = bao.cli_as(&bao.root_token, &args, stdin);
    assert!(
        out.status.success(),
        "bao kv put {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 46: a holder record copies the current version into a new KV version and destroys
/// the one it copied; when that destruction failed (here: the copy is written by hand, the
/// copied KV version left readable), the version's material lives in two KV versions.
/// Retiring the version destroys both, the extra copy first, so no KV version reads the
/// retired passphrase afterwards (before: the older copy stayed readable with `bao kv get
/// -version=1`, and nothing reported it).
#[test]
fn retire_destroys_every_copy_of_the_version() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start() else { return };
    let kms = vault(&bao);
    let key = "k";
    kms.stage(key, &pass("one-AAAA"), 1).unwrap();
    kms.commit(key, None, 1).unwrap();
    // KV version 2: a copy of v1, as a holder record writes it; KV version 1 not destroyed.
    kv_put_fields(
        &bao,
        key,
        Some(1),
        b"one-AAAA",
        &[
            "k=-",
            "keyplan_version=1",
            "keyplan_created_at=1700000000",
            "keyplan_history=[]",
        ],
    );
    kms.stage(key, &pass("two-BBBB"), 0).unwrap();
    kms.commit(key, Some(1), 2).unwrap();
    kms.stage(key, &pass("three-CCCC"), 0).unwrap();
    kms.commit(key, Some(2), 3).unwrap();
    assert_eq!(
        bao.kv_data(key, Some(1)).unwrap()["k"],
        "one-AAAA",
        "the extra copy is readable before the retire"
    );
    // v1 is previous: an extra copy of it lingers nowhere yet.
    assert_eq!(kms.lingering(key).unwrap(), Vec::<u64>::new());

    kms.retire(key, 1).unwrap();
    for kv in [1, 2] {
        assert_eq!(
            bao.kv_data(key, Some(kv)),
            None,
            "KV version {kv} still reads"
        );
    }
    let st = kms.read(key).unwrap();
    assert_eq!(st.versions[&1].state, VersionState::Retired, "{st:?}");
    assert_eq!(kms.lingering(key).unwrap(), Vec::<u64>::new());
    assert!(matches!(
        kms.get(key, 1),
        Err(KmsError::NoSuchVersion { version: 1, .. })
    ));
    assert_eq!(bao.kv_field(key, "k").unwrap(), b"three-CCCC");
    done("retire_destroys_every_copy_of_the_version", t0);
}

/// Issue 46: a `destroy_key` killed after its tombstone (written here by hand, check-and-set
/// on the latest KV version, as keyplan writes it) leaves the earlier KV versions readable:
/// `lingering` reports the versions they hold (before: nothing), the key reads as destroyed,
/// and `destroy_key` again deletes them all, after which nothing lingers.
#[test]
fn lingering_reports_a_destroy_killed_after_its_tombstone_until_it_is_finished() {
    let t0 = Instant::now();
    let Some(bao) = OpenBao::start() else { return };
    let kms = vault(&bao);
    let key = "k";
    kms.stage(key, &pass("one-AAAA"), 1).unwrap();
    kms.commit(key, None, 1).unwrap();
    kms.stage(key, &pass("two-BBBB"), 0).unwrap();
    kms.commit(key, Some(1), 2).unwrap();
    kms.stage(key, &pass("three-CCCC"), 0).unwrap();
    kms.commit(key, Some(2), 3).unwrap();
    kms.retire(key, 1).unwrap();
    assert_eq!(kms.lingering(key).unwrap(), Vec::<u64>::new());
    kv_put_fields(
        &bao,
        key,
        Some(3),
        b"",
        &["keyplan_destroyed_at=1700000000"],
    );
    let st = kms.read(key).unwrap();
    assert_eq!((st.current, st.pending), (None, None), "{st:?}");
    assert_eq!(kms.lingering(key).unwrap(), [2, 3]);
    assert_eq!(bao.kv_data(key, Some(3)).unwrap()["k"], "three-CCCC");

    kms.destroy_key(key, 3)
        .expect("destroy_key again finishes it");
    assert!(bao.kv_metadata(key).is_none(), "the key's versions remain");
    for kv in [2, 3] {
        assert_eq!(
            bao.kv_data(key, Some(kv)),
            None,
            "KV version {kv} still reads"
        );
    }
    assert_eq!(kms.lingering(key).unwrap(), Vec::<u64>::new());
    done(
        "lingering_reports_a_destroy_killed_after_its_tombstone_until_it_is_finished",
        t0,
    );
}
