//! Azure Key Vault through the `exec` provider: the example helper
//! `examples/azure-key-vault/keyplan-kms-azure` against the stand-in of Key Vault's secrets
//! API (`tests/standins/azure_key_vault.py`, see `common/azure.rs`: no Key Vault emulator can
//! be had here). The provider contract; the helper's answers to what the vault refuses; a
//! race of two writers on keyplan's record; and the keyplan binary end to end (adoption of a
//! Rook-made secret, rotations, a concurrent writer, refused credentials, a stopped vault).
//!
//! Independent witnesses: the stand-in is read directly over HTTP (never through the helper),
//! devices are tested with cryptsetup directly.

use crate::common::azure::{AzureVault, CLIENT_SECRET};
use crate::common::kms_contract;
use crate::common::*;

use std::path::PathBuf;
use std::time::Duration;

use keyplan::kms::exec::ExecKms;
use keyplan::kms::Kms;

/// An exec KMS running the helper (prefix `prefix`) against `vault`, through a script in `dir`.
fn helper_kms(vault: &AzureVault, dir: &std::path::Path, name: &str, prefix: &str) -> ExecKms {
    let script = vault.helper_script(dir, name, prefix, CLIENT_SECRET);
    ExecKms::new(
        "azure",
        vec![script.display().to_string()],
        Duration::from_secs(60),
    )
    .expect("exec kms")
}

#[test]
fn provider_contract() {
    let Some(vault) = AzureVault::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kms = helper_kms(&vault, dir.path(), "one", "kp-");
    let other = helper_kms(&vault, dir.path(), "two", "kp-");
    kms_contract::run(&kms, &other, "contract");

    // What any Key Vault reader sees. Key b: its latest version is the current one, v2.
    assert_eq!(
        vault.get("kp-contract-b", None).as_deref(),
        Ok("held-rotation-EEEE")
    );
    let b = vault.versions("kp-contract-b");
    assert_eq!(b.len(), 2, "{b:?}");
    assert_eq!(b[1].tags["keyplan-version"], "2", "{b:?}");
    assert_eq!(b[1].tags["keyplan-state"], "current", "{b:?}");
    assert_eq!(b[0].tags["keyplan-state"], "previous", "{b:?}");
    // Key a: destroyed once (every version disabled), then created again: only that last
    // version is enabled, and it is the latest.
    let a = vault.versions("kp-contract-a");
    let enabled: Vec<_> = a.iter().filter(|v| v.enabled).collect();
    assert_eq!(enabled.len(), 1, "{a:?}");
    assert_eq!(
        vault.get("kp-contract-a", Some(&enabled[0].id)).as_deref(),
        Ok("back-again-DDDD")
    );
    assert_eq!(
        vault.get("kp-contract-a", None).as_deref(),
        Ok("back-again-DDDD")
    );
    for v in a.iter().filter(|v| !v.enabled) {
        // A disabled version's value cannot be read (403), as on Key Vault.
        assert_eq!(vault.get("kp-contract-a", Some(&v.id)), Err(403), "{v:?}");
        assert_eq!(v.tags["keyplan-state"], "retired", "{v:?}");
    }
    // keyplan's record: an append-only log, read in pages of two by the helper.
    let record = vault.versions("kp-contract-a-keyplan");
    assert!(record.len() > 6, "{record:?}");
    assert!(
        vault.log().contains("skiptoken"),
        "the helper followed nextLink"
    );
    // The log holds no material: it names versions, never values.
    for v in &record {
        let entry = vault
            .get("kp-contract-a-keyplan", Some(&v.id))
            .expect("an entry");
        for m in ["first-passphrase", "second-passphrase", "tenth-passphrase"] {
            assert!(!entry.contains(m), "{entry}");
        }
    }
}

/// What the helper answers to names Key Vault cannot hold, to a soft-deleted secret, to a
/// vault that refuses writes, and to another protocol version.
#[test]
fn helper_refusals_name_the_cause() {
    let Some(vault) = AzureVault::start() else {
        return;
    };
    let ask = |req: &str| vault.helper("kp-", 0, req);
    let error = |v: &serde_json::Value, kind: &str, words: &[&str]| {
        assert_eq!(v["protocol_version"], 1, "{v}");
        assert_eq!(v["ok"], false, "{v}");
        assert_eq!(v["error"]["kind"], kind, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        for w in words {
            assert!(message.contains(w), "{w:?} not in {message}");
        }
    };
    let v = ask(r#"{"protocol_version":1,"operation":"read","kms":"a","key":"osd_kek.1"}"#);
    error(&v, "config", &["'.'", "'_'", "letters, digits and '-'"]);
    let v = ask(r#"{"protocol_version":1,"operation":"read","kms":"a","key":"x-keyplan"}"#);
    error(&v, "config", &["-keyplan"]);
    let long = "k".repeat(120);
    let v = ask(&format!(
        r#"{{"protocol_version":1,"operation":"read","kms":"a","key":"{long}"}}"#
    ));
    error(&v, "config", &["127 characters"]);
    let v = ask(r#"{"protocol_version":2,"operation":"read","kms":"a","key":"k"}"#);
    error(&v, "config", &["protocol version 1"]);
    let v = ask(r#"{"protocol_version":1,"operation":"rotate","kms":"a","key":"k"}"#);
    error(&v, "config", &["unknown operation"]);
    let v = ask(r#"{"protocol_version":1,"operation":"get","kms":"a","key":"k","version":3}"#);
    error(&v, "no_such_version", &["version 3"]);

    // A soft-deleted secret: it reads as absent (as on Key Vault), and storing a version
    // says how to recover it.
    vault.put("kp-gone", "old-value-0123456789");
    vault.delete("kp-gone");
    let v = ask(
        r#"{"protocol_version":1,"operation":"stage","kms":"a","key":"gone","material_base64":"bmV3LXZhbHVl","at_least":1}"#,
    );
    error(
        &v,
        "config",
        &["soft-deleted", "az keyvault secret recover"],
    );

    // Nothing was written by `read`, `get` or `check` (keyplan's `plan` leaves no trace).
    let v = ask(r#"{"protocol_version":1,"operation":"check","kms":"a","names":["k","gone"]}"#);
    assert_eq!(v["ok"], true, "{v}");
    assert!(vault.versions("kp-k").is_empty());
    assert!(vault.versions("kp-k-keyplan").is_empty());

    // Another tool writes a new value into a secret keyplan manages: keyplan cannot know
    // which devices it opens, so the key is refused (conflict) until someone disables it.
    for req in [
        r#"{"protocol_version":1,"operation":"stage","kms":"a","key":"k2","material_base64":"c2VjcmV0LXZhbHVlLTE=","at_least":1}"#,
        r#"{"protocol_version":1,"operation":"commit","kms":"a","key":"k2","expected_current":null,"pending":1}"#,
    ] {
        let v = ask(req);
        assert_eq!(v["ok"], true, "{req}: {v}");
    }
    let foreign = vault.put("kp-k2", "foreign-value-0123456789");
    let v = ask(r#"{"protocol_version":1,"operation":"read","kms":"a","key":"k2"}"#);
    error(&v, "conflict", &["written by another tool", &foreign]);

    // A vault that refuses writes: `check` cannot tell (it writes nothing), `stage` names the
    // permission it lacks.
    let Some(ro) = AzureVault::start_denying_writes() else {
        return;
    };
    let v = ro.helper(
        "kp-",
        0,
        r#"{"protocol_version":1,"operation":"stage","kms":"a","key":"k","material_base64":"bmV3LXZhbHVl","at_least":1}"#,
    );
    error(
        &v,
        "denied",
        &[
            "secrets/set",
            "Key Vault Secrets Officer",
            "ForbiddenByRbac",
        ],
    );
}

/// Workload identity (a Kubernetes service account federated with an Entra ID app): the
/// token in `AZURE_FEDERATED_TOKEN_FILE` is sent as the client assertion; no client secret.
/// `credentials` reports it with the token's `exp` claim, renewed by the kubelet.
#[test]
fn workload_identity_federated_token() {
    use base64::Engine as _;
    // A projected service-account token's shape (header.claims.signature); the stand-in
    // compares it whole, as Entra ID would verify it.
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(br#"{"sub":"system:serviceaccount:rook-ceph:rook-ceph-osd","exp":1999999999}"#);
    let token = format!("eyJhbGciOiJSUzI1NiJ9.{claims}.c2lnbmF0dXJl");
    let Some(vault) = AzureVault::start_with(&["--federated-token", &token]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let run = |token_file: &std::path::Path, request: &str| {
        let out = std::process::Command::new(crate::common::standin::python())
            .args([crate::common::azure::HELPER, &vault.url()])
            .envs(
                vault
                    .helper_env("", 0)
                    .into_iter()
                    .filter(|(k, _)| k != "AZURE_CLIENT_SECRET"),
            )
            .env_remove("AZURE_CLIENT_SECRET")
            .env("AZURE_FEDERATED_TOKEN_FILE", token_file)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write as _;
                c.stdin.take().unwrap().write_all(request.as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let check = r#"{"protocol_version":1,"operation":"check","kms":"a","names":["k"]}"#;
    let credentials = r#"{"protocol_version":1,"operation":"credentials","kms":"a"}"#;
    let v = run(&file, check);
    assert_eq!(v["ok"], true, "{v}");
    let v = run(&file, credentials);
    assert_eq!(v["ok"], true, "{v}");
    let c = &v["result"]["credentials"][0];
    assert_eq!(c["kind"], "azure_federated_token", "{v}");
    assert_eq!(c["expires_at"], 1999999999, "{v}");
    assert!(c["renewed_by"].as_str().unwrap().contains("kubelet"), "{v}");
    assert!(
        c["what"]
            .as_str()
            .unwrap()
            .contains(crate::common::azure::CLIENT_ID),
        "{v}"
    );
    assert!(
        !v.to_string().contains(&claims),
        "the token itself is never reported: {v}"
    );

    std::fs::write(&file, "another-token").unwrap();
    for request in [check, credentials] {
        let v = run(&file, request);
        assert_eq!(v["error"]["kind"], "denied", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("AZURE_FEDERATED_TOKEN_FILE"), "{message}");
        assert!(!message.contains("another-token"), "{message}");
    }
}

/// Two writers stage the same key at the same time (margin 1 s): exactly one wins, whatever
/// the interleaving; the record names the winner's material; the loser's version is disabled.
#[test]
fn two_concurrent_stages_one_wins() {
    let Some(vault) = AzureVault::start() else {
        return;
    };
    let stage = |material: &'static str| {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(material);
        let req = format!(
            r#"{{"protocol_version":1,"operation":"stage","kms":"a","key":"race","material_base64":"{b64}","at_least":1}}"#
        );
        move |vault: &AzureVault| vault.helper("kp-", 1, &req)
    };
    let (a, b) = (
        stage("racer-A-material-0000"),
        stage("racer-B-material-1111"),
    );
    let (ra, rb) = std::thread::scope(|s| {
        let ta = s.spawn(|| a(&vault));
        let tb = s.spawn(|| b(&vault));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    let oks = [&ra, &rb].iter().filter(|r| r["ok"] == true).count();
    assert_eq!(oks, 1, "{ra}\n{rb}");
    let (winner, loser) = if ra["ok"] == true {
        ("racer-A-material-0000", &rb)
    } else {
        ("racer-B-material-1111", &ra)
    };
    assert_eq!(loser["error"]["kind"], "conflict", "{loser}");
    let read = vault.helper(
        "kp-",
        1,
        r#"{"protocol_version":1,"operation":"read","kms":"a","key":"race"}"#,
    );
    assert_eq!(read["result"]["pending"], 1, "{read}");
    let got = vault.helper(
        "kp-",
        1,
        r#"{"protocol_version":1,"operation":"get","kms":"a","key":"race","version":1}"#,
    );
    use base64::Engine as _;
    let material = base64::engine::general_purpose::STANDARD
        .decode(got["result"]["material_base64"].as_str().unwrap())
        .unwrap();
    assert_eq!(material, winner.as_bytes());
    // Directly in the vault: both versions were stored; only the winner's is readable when
    // both raced to the record (if one saw the other's pending version first, it stored none).
    let versions = vault.versions("kp-race");
    let enabled: Vec<_> = versions.iter().filter(|v| v.enabled).collect();
    assert_eq!(enabled.len(), 1, "{versions:?}");
    assert_eq!(
        vault.get("kp-race", Some(&enabled[0].id)).as_deref(),
        Ok(winner)
    );
}

// ---------------------------------------------------------------------------------------------
// The keyplan binary end to end.

/// The passphrase a Rook-style deployment stored before keyplan: the secret's plain value.
const ROOK: &str = "rook-made-passphrase-0123456789abcdef";
/// The secret Rook made for the OSD (no prefix).
const SECRET: &str = "rook-ceph-osd-encryption-key-set1-data-0";

/// A plan with key `osd-kek` (the secret [`SECRET`]) on two LUKS2 devices and a LUKS1 one,
/// held in the exec KMS `azure` running `./kms-azure` (written by [`setup`]).
fn azure_plan() -> String {
    format!(
        "version: 1\nkms:\n  azure: {{ provider: exec, command: [./kms-azure] }}\nkeys:\n  osd-kek: {{ kms: azure, name: {SECRET} }}\ndevices:\n  block: {{ path: block.img, keys: [osd-kek] }}\n  db: {{ path: db.img, keys: [osd-kek] }}\n  legacy: {{ path: legacy.img, keys: [osd-kek] }}\n{FAST_PBKDF}"
    )
}

/// A watched scratch dir with the Rook-made secret in `vault` (written directly, not through
/// keyplan), three devices formatted with it, the helper script (client secret
/// `client_secret`) and the plan. Returns the devices and the adopted version's id.
fn setup(w: &Watched, vault: &AzureVault, client_secret: &str) -> (Vec<PathBuf>, String) {
    w.add_secret(ROOK.as_bytes());
    let id = vault.put(SECRET, ROOK);
    let devs = rook_devices(&w.s, ROOK.as_bytes());
    vault.helper_script(w.s.dir.path(), "kms-azure", "", client_secret);
    w.s.plan("keyplan.yaml", &azure_plan());
    (devs, id)
}

fn slots(devs: &[PathBuf]) -> Vec<Vec<u32>> {
    devs.iter().map(|d| keyslots(d)).collect()
}

/// The current value of the secret, read directly; remembered for the leak scan.
fn latest(w: &Watched, vault: &AzureVault) -> String {
    let v = vault.get(SECRET, None).expect("the latest version");
    w.add_secret(v.as_bytes());
    v
}

#[test]
fn rook_style_adoption_then_rotations() {
    let Some(vault) = AzureVault::start() else {
        return;
    };
    let w = Watched::new();
    let (devs, adopted) = setup(&w, &vault, CLIENT_SECRET);
    let before = slots(&devs);

    // Adoption: the secret's value opens every device; keyplan records it there (tokens) and
    // changes no keyslot, and leaves the secret's value as it was (no new version).
    let out = w.ok(&["plan"], 0);
    assert!(!out.contains("+ key osd-kek"), "no new key: {out}");
    let out = w.ok(&["apply", "--auto-approve"], 0);
    assert!(out.contains("Apply complete!"), "{out}");
    assert_eq!(slots(&devs), before, "adoption changed a keyslot");
    let versions = vault.versions(SECRET);
    assert_eq!(versions.len(), 1, "{versions:?}");
    assert_eq!(vault.get(SECRET, None).as_deref(), Ok(ROOK));
    for d in &devs {
        assert!(opens(d, ROOK.as_bytes(), None), "{}", d.display());
    }
    // keyplan's record began (the plan recorded as holder), naming the adopted version.
    let record = vault.versions(&format!("{SECRET}-keyplan"));
    let last = vault
        .get(
            &format!("{SECRET}-keyplan"),
            Some(&record.last().unwrap().id),
        )
        .unwrap();
    assert!(last.contains(&adopted), "{last}");
    let st = w.run(&["status", "--format", "json"]);
    assert!(st.status.success(), "{st:?}");
    let j: serde_json::Value = serde_json::from_slice(&st.stdout).expect("status json");
    assert_eq!(j["keys"][0]["current"]["version"], 1, "{j}");
    // The helper's `credentials`: a client secret Entra ID accepted, its end date unknown.
    let c = &j["kms"][0]["credentials"][0];
    assert_eq!(c["kind"], "azure_client_secret", "{j}");
    assert_eq!(c["expires_at"], serde_json::Value::Null, "{j}");
    assert!(
        c["what"]
            .as_str()
            .unwrap()
            .contains(crate::common::azure::CLIENT_ID),
        "{j}"
    );

    // Rotation: v2 is the secret's latest version, tagged current, and opens every device.
    let out = w.ok(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let v2 = latest(&w, &vault);
    assert_ne!(v2, ROOK);
    for d in &devs {
        assert!(opens(d, v2.as_bytes(), None), "v2 opens {}", d.display());
    }
    let versions = vault.versions(SECRET);
    assert_eq!(versions.len(), 2, "{versions:?}");
    let newest = versions.iter().find(|v| v.id != adopted).unwrap();
    assert_eq!(newest.tags["keyplan-version"], "2", "{versions:?}");
    assert_eq!(newest.tags["keyplan-state"], "current", "{versions:?}");
    assert!(versions.iter().all(|v| v.enabled), "{versions:?}");

    // A second rotation retires the adopted version: disabled in the vault (its value can no
    // longer be read), and the passphrase Rook made opens no device any more.
    w.ok(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    let v3 = latest(&w, &vault);
    for d in &devs {
        assert!(opens(d, v3.as_bytes(), None), "v3 opens {}", d.display());
        assert!(
            !opens(d, ROOK.as_bytes(), None),
            "the adopted passphrase opens {}",
            d.display()
        );
        assert!(!opens(d, v2.as_bytes(), None), "v2 opens {}", d.display());
    }
    let versions = vault.versions(SECRET);
    let old = versions.iter().find(|v| v.id == adopted).unwrap();
    assert!(!old.enabled, "{versions:?}");
    assert_eq!(old.tags["keyplan-state"], "retired", "{versions:?}");
    assert_eq!(vault.get(SECRET, Some(&adopted)), Err(403));
    let out = w.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(out.contains("No changes"), "{out}");
    w.assert_no_leaks();
}

/// Another writer (a second keyplan, through the same helper) commits and rotates the key while
/// keyplan's rotation waits before its commit: keyplan's commit is refused, nothing is
/// overwritten, the devices still open with the adopted passphrase.
#[cfg(feature = "failpoints")]
#[test]
fn a_concurrent_writer_between_stage_and_commit_is_a_conflict() {
    let Some(vault) = AzureVault::start() else {
        return;
    };
    let w = Watched::new();
    let (devs, _) = setup(&w, &vault, CLIENT_SECRET);
    w.ok(&["apply", "--auto-approve"], 0);

    let gate = w.s.path("gate");
    std::fs::write(&gate, "").expect("gate");
    let mut child = w
        .command(&["apply", "--auto-approve", "--rotate", "osd-kek"])
        .env(
            "FAILPOINTS",
            format!("commit.before=return(wait:{})", gate.display()),
        )
        // Into files, not pipes: its trace log would fill a pipe nobody reads while it waits.
        .stdout(std::fs::File::create(w.s.path("apply.out")).expect("apply.out"))
        .stderr(std::fs::File::create(w.s.path("apply.err")).expect("apply.err"))
        .spawn()
        .expect("spawn keyplan");
    wait_at_gate(&gate, child.id());

    // The rival: commits keyplan's pending v2, then stages and commits its own v3.
    let rival = "rival-writer-passphrase-0123456789";
    w.add_secret(rival.as_bytes());
    let ask = |req: String| {
        let v = vault.helper("", 0, &req);
        assert_eq!(v["ok"], true, "{req}: {v}");
        v
    };
    ask(format!(
        r#"{{"protocol_version":1,"operation":"commit","kms":"rival","key":"{SECRET}","expected_current":1,"pending":2}}"#
    ));
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(rival);
    let staged = ask(format!(
        r#"{{"protocol_version":1,"operation":"stage","kms":"rival","key":"{SECRET}","material_base64":"{b64}","at_least":0}}"#
    ));
    assert_eq!(staged["result"]["version"], 3, "{staged}");
    ask(format!(
        r#"{{"protocol_version":1,"operation":"commit","kms":"rival","key":"{SECRET}","expected_current":2,"pending":3}}"#
    ));

    std::fs::remove_file(&gate).expect("open the gate");
    let status = child.wait().expect("wait");
    let out = std::process::Output {
        status,
        stdout: std::fs::read(w.s.path("apply.out")).unwrap_or_default(),
        stderr: std::fs::read(w.s.path("apply.err")).unwrap_or_default(),
    };
    w.record(&out);
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("changed concurrently"), "{text}");
    assert!(text.contains("nothing was overwritten"), "{text}");
    // The rival's version stands as the secret's latest; every version is still there.
    assert_eq!(vault.get(SECRET, None).as_deref(), Ok(rival));
    assert_eq!(vault.versions(SECRET).len(), 3);
    for d in &devs {
        assert!(opens(d, ROOK.as_bytes(), None), "{}", d.display());
    }
    w.assert_no_leaks();
}

/// Credentials Entra ID refuses: `plan` exits 3 and `apply` 1, naming the credentials, and
/// no keyslot changes. A stopped vault: unavailable, nothing changes.
#[test]
fn refused_credentials_and_a_stopped_vault_change_nothing() {
    let Some(mut vault) = AzureVault::start() else {
        return;
    };
    let w = Watched::new();
    let (devs, _) = setup(&w, &vault, "a-wrong-client-secret");
    let before = slots(&devs);
    for (args, code) in [(&["plan"][..], 3), (&["apply", "--auto-approve"][..], 1)] {
        let out = w.ok(args, code);
        assert!(out.contains("refused"), "{args:?}: {out}");
        assert!(out.contains("AZURE_CLIENT_SECRET"), "{args:?}: {out}");
        assert!(out.contains("invalid_client"), "{args:?}: {out}");
        assert!(!out.contains("a-wrong-client-secret"), "{args:?}: {out}");
    }
    // `status` says the credential was refused: a problem (exit 1), and the reason.
    let st = w.run(&["status", "--format", "json"]);
    let j: serde_json::Value = serde_json::from_slice(&st.stdout).expect("status json");
    let error = j["kms"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("invalid_client"), "{j}");
    assert!(!error.contains("a-wrong-client-secret"), "{j}");
    assert_ne!(st.status.code(), Some(0), "{j}");
    assert_eq!(slots(&devs), before);
    assert!(vault.versions(&format!("{SECRET}-keyplan")).is_empty());

    // The right credentials, then the vault stops.
    vault.helper_script(w.s.dir.path(), "kms-azure", "", CLIENT_SECRET);
    w.ok(&["apply", "--auto-approve"], 0);
    vault.standin.stop();
    let before = slots(&devs);
    let out = w.ok(&["apply", "--auto-approve", "--rotate", "osd-kek"], 1);
    assert!(out.contains("is unavailable"), "{out}");
    assert!(out.contains("cannot reach"), "{out}");
    let out = w.ok(&["plan"], 3);
    assert!(out.contains("cannot reach"), "{out}");
    assert_eq!(slots(&devs), before);
    for d in &devs {
        assert!(opens(d, ROOK.as_bytes(), None), "{}", d.display());
    }
    w.assert_no_leaks();
}

/// Opt-in, against a real vault: `KEYPLAN_AZURE_REAL_VAULT_URL=https://NAME.vault.azure.net`
/// with credentials in the usual Azure variables runs the provider contract on secrets named
/// `keyplan-test-<pid>-contract-a` and `-b` (docs/kms/azure-key-vault.md). They stay in the
/// vault, disabled or not: delete and purge them afterwards.
#[test]
fn real_vault_contract_opt_in() {
    let Ok(url) = std::env::var("KEYPLAN_AZURE_REAL_VAULT_URL") else {
        eprintln!(
            "skipped: set KEYPLAN_AZURE_REAL_VAULT_URL (and AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET) to run the contract against a real Azure Key Vault"
        );
        return;
    };
    let prefix = format!("keyplan-test-{}-", std::process::id());
    let argv = vec![
        crate::common::standin::python(),
        crate::common::azure::HELPER.to_string(),
        url,
        "--prefix".to_string(),
        prefix,
    ];
    let kms = ExecKms::new("azure", argv.clone(), Duration::from_secs(120)).expect("exec kms");
    let other = ExecKms::new("azure", argv, Duration::from_secs(120)).expect("exec kms");
    kms_contract::run(&kms, &other, "contract");
    let _ = kms.read("contract-a");
}

/// Key Vault names ignore case: `OSD-KEK-KEYPLAN` is the secret `osd-kek-keyplan`, the record
/// of key `osd-kek`, and `OSD-KEK` is `osd-kek` itself. The helper refuses both (`config`)
/// whatever the operation, and the managed key's secret and record stay as they were.
#[test]
fn names_differing_only_in_case_are_refused() {
    let Some(vault) = AzureVault::start() else {
        return;
    };
    let ask = |req: String| vault.helper("", 0, &req);
    for req in [
        r#"{"protocol_version":1,"operation":"stage","kms":"a","key":"osd-kek","material_base64":"b3NkLWtlay1wYXNzcGhyYXNlLTAxMjM=","at_least":1}"#,
        r#"{"protocol_version":1,"operation":"commit","kms":"a","key":"osd-kek","expected_current":null,"pending":1}"#,
    ] {
        let v = ask(req.to_string());
        assert_eq!(v["ok"], true, "{req}: {v}");
    }
    let record_before = vault.versions("osd-kek-keyplan");
    let material_before = vault.versions("osd-kek");
    assert_eq!(material_before.len(), 1, "{material_before:?}");

    for (key, words) in [
        ("OSD-KEK-KEYPLAN", &["-keyplan"][..]),
        ("Osd-Kek-KeyPlan", &["-keyplan"][..]),
        ("OSD-KEK", &["ignore case", "'osd-kek'"][..]),
    ] {
        for req in [
            format!(r#"{{"protocol_version":1,"operation":"read","kms":"a","key":"{key}"}}"#),
            format!(r#"{{"protocol_version":1,"operation":"check","kms":"a","names":["{key}"]}}"#),
            format!(
                r#"{{"protocol_version":1,"operation":"get","kms":"a","key":"{key}","version":1}}"#
            ),
            format!(
                r#"{{"protocol_version":1,"operation":"stage","kms":"a","key":"{key}","material_base64":"c2hhZG93LXBhc3NwaHJhc2UtOTk5OQ==","at_least":1}}"#
            ),
            format!(
                r#"{{"protocol_version":1,"operation":"hold","kms":"a","key":"{key}","holder":"shadow-plan"}}"#
            ),
        ] {
            let v = ask(req.clone());
            assert_eq!(v["ok"], false, "{req}: {v}");
            assert_eq!(v["error"]["kind"], "config", "{req}: {v}");
            let message = v["error"]["message"].as_str().unwrap();
            for w in words {
                assert!(message.contains(w), "{w:?} not in {message}");
            }
        }
    }

    // Read directly from the stand-in: nothing was added to osd-kek's secret or record, and
    // its record still names v1 current.
    let record = vault.versions("osd-kek-keyplan");
    assert_eq!(record.len(), record_before.len(), "{record:?}");
    let material = vault.versions("osd-kek");
    assert_eq!(material.len(), 1, "{material:?}");
    assert!(material[0].enabled, "{material:?}");
    let last = vault
        .get("osd-kek-keyplan", Some(&record.last().unwrap().id))
        .unwrap();
    let state: serde_json::Value = serde_json::from_str(&last).expect("a record");
    assert_eq!(state["current"], 1, "{state}");
    assert_eq!(state["pending"], serde_json::Value::Null, "{state}");
    assert_eq!(
        vault.get("osd-kek", None).as_deref(),
        Ok("osd-kek-passphrase-0123")
    );
}

/// The keyplan binary with a second key whose name is the first key's record in upper case:
/// `plan` stops on the configuration error, and `apply` changes no keyslot and writes
/// nothing to the vault.
#[test]
fn keyplan_refuses_a_key_named_like_another_keys_record_in_another_case() {
    let Some(vault) = AzureVault::start() else {
        return;
    };
    let w = Watched::new();
    let (devs, adopted) = setup(&w, &vault, CLIENT_SECRET);
    w.ok(&["apply", "--auto-approve"], 0);
    let record_before = vault.versions(&format!("{SECRET}-keyplan"));
    let shadow = format!("{}-KEYPLAN", SECRET.to_uppercase());
    w.s.plan(
        "keyplan.yaml",
        &azure_plan()
            .replace(
                "devices:\n",
                &format!("  shadow: {{ kms: azure, name: {shadow} }}\ndevices:\n"),
            )
            .replace("keys: [osd-kek] }", "keys: [osd-kek, shadow] }"),
    );
    let before = slots(&devs);
    // `plan` stops on the helper's `config` answer: a configuration problem, exit 1 (not 3,
    // "could not check": the store answered, and the fix is in the plan).
    let out = w.run(&["plan"]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("-keyplan"), "{text}");
    assert!(text.contains("config"), "{text}");
    let out = w.ok(&["apply", "--auto-approve"], 1);
    assert!(out.contains("-keyplan"), "{out}");
    assert_eq!(slots(&devs), before);
    assert_eq!(
        vault.versions(&format!("{SECRET}-keyplan")).len(),
        record_before.len()
    );
    let versions = vault.versions(SECRET);
    assert_eq!(versions.len(), 1, "{versions:?}");
    assert_eq!(versions[0].id, adopted);
    for d in &devs {
        assert!(opens(d, ROOK.as_bytes(), None), "{}", d.display());
    }
    w.assert_no_leaks();
}

/// Runs the helper (`check`, which gets a token first) with vault URL `url` and `env` over
/// the stand-in's credentials; its answer.
fn helper_with_url(vault: &AzureVault, url: &str, env: &[(&str, &str)]) -> serde_json::Value {
    use std::io::Write as _;
    let mut child = std::process::Command::new(crate::common::standin::python())
        .args([crate::common::azure::HELPER, url])
        .envs(vault.helper_env(CLIENT_SECRET, 0))
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the helper");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"protocol_version":1,"operation":"check","kms":"a","names":["k"]}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("one JSON answer")
}

/// The vault URL decides where the access token goes: a host that is not on a Key Vault
/// domain is refused before any token is asked for (the stand-in, acting as Entra ID, sees
/// no request); so are plain http off loopback, a user name or password (never repeated),
/// and a path or query. A host named exactly by KEYPLAN_AZURE_ALLOW_VAULT_HOST passes the
/// check (then fails to resolve here).
#[test]
fn vault_url_is_checked_before_any_token_is_sent() {
    let Some(vault) = AzureVault::start() else {
        return;
    };
    let port = vault.url().rsplit(':').next().unwrap().to_string();
    let cases = [
        ("https://evil.example.com".to_string(), "Key Vault domain"),
        ("https://evil.example.com/".to_string(), "Key Vault domain"),
        (
            "https://myvault.vault.azure.net.evil.example.com".to_string(),
            "Key Vault domain",
        ),
        ("https://vault.azure.net".to_string(), "Key Vault domain"),
        ("http://myvault.vault.azure.net".to_string(), "plain http"),
        ("http://10.0.0.1:8080".to_string(), "plain http"),
        (
            format!("http://alice:s3cretpw@127.0.0.1:{port}"),
            "user name or password",
        ),
        (
            format!("http://alice@127.0.0.1:{port}"),
            "user name or password",
        ),
        (
            "https://alice:s3cretpw@myvault.vault.azure.net".to_string(),
            "user name or password",
        ),
        (
            format!("http://127.0.0.1:{port}/secrets?x=s3cretpw"),
            "path, query",
        ),
        (
            "https://myvault.vault.azure.net/?sig=s3cretpw".to_string(),
            "path, query",
        ),
    ];
    for (url, words) in &cases {
        let v = helper_with_url(&vault, url, &[]);
        assert_eq!(v["ok"], false, "{url}: {v}");
        assert_eq!(v["error"]["kind"], "config", "{url}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{url}: {words:?} not in {message}");
        assert!(!message.contains("s3cretpw"), "{url}: {message}");
        assert!(!message.contains("alice"), "{url}: {message}");
    }
    assert!(
        !vault.log().contains("oauth2"),
        "a token was asked for: {}",
        vault.log()
    );
    assert!(
        !vault.log().contains("/secrets"),
        "a vault call was made: {}",
        vault.log()
    );

    // The stand-in itself (http on loopback), and loopback by another address of 127/8.
    let v = helper_with_url(&vault, &vault.url(), &[]);
    assert_eq!(v["ok"], true, "{v}");
    let v = helper_with_url(&vault, &format!("http://localhost:{port}"), &[]);
    assert_eq!(v["ok"], true, "{v}");

    // The override names one host exactly, and only over https; no other host gets through.
    let allow = [("KEYPLAN_AZURE_ALLOW_VAULT_HOST", "kv.internal.example")];
    let v = helper_with_url(&vault, "https://evil.example.com", &allow);
    assert_eq!(v["error"]["kind"], "config", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Key Vault domain"),
        "{v}"
    );
    let v = helper_with_url(&vault, "http://kv.internal.example", &allow);
    assert_eq!(v["error"]["kind"], "config", "{v}");
    let v = helper_with_url(&vault, "https://kv.internal.example.invalid", &allow);
    assert_eq!(v["error"]["kind"], "config", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Key Vault domain"),
        "{v}"
    );
}

/// AZURE_AUTHORITY_HOST is where the client secret goes: https, or plain http on loopback
/// only; no user name or password (never repeated), no query. Nothing is sent when refused.
#[test]
fn authority_host_is_checked_before_the_client_secret_is_sent() {
    let Some(vault) = AzureVault::start() else {
        return;
    };
    let port = vault.url().rsplit(':').next().unwrap().to_string();
    for (authority, words) in [
        ("http://login.example.com/".to_string(), "plain http"),
        ("ftp://login.example.com/".to_string(), "https"),
        (
            format!("http://alice:s3cretpw@127.0.0.1:{port}/"),
            "user name or password",
        ),
        (
            "https://alice:s3cretpw@login.microsoftonline.com/".to_string(),
            "user name or password",
        ),
        (format!("http://127.0.0.1:{port}/?x=s3cretpw"), "query"),
    ] {
        let v = helper_with_url(
            &vault,
            &vault.url(),
            &[("AZURE_AUTHORITY_HOST", authority.as_str())],
        );
        assert_eq!(v["ok"], false, "{authority}: {v}");
        assert_eq!(v["error"]["kind"], "config", "{authority}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(words),
            "{authority}: {words:?} not in {message}"
        );
        assert!(message.contains("AZURE_AUTHORITY_HOST"), "{message}");
        assert!(!message.contains("s3cretpw"), "{authority}: {message}");
        assert!(!message.contains("alice"), "{authority}: {message}");
    }
    assert!(
        !vault.log().contains("oauth2"),
        "the token endpoint was called: {}",
        vault.log()
    );
    // On loopback by name: accepted.
    let v = helper_with_url(
        &vault,
        &vault.url(),
        &[("AZURE_AUTHORITY_HOST", &format!("http://localhost:{port}"))],
    );
    assert_eq!(v["ok"], true, "{v}");
}

/// A Python wrapper around the helper (its path and arguments follow) that is killed with
/// SIGKILL at its record entry: `before` it is appended (the first argument `before`), or right
/// after it (`after`), as in a power cut; it loads the helper as a module and runs its `main`.
const KILLED_AT_RECORD: &str = r#"
import importlib.machinery, importlib.util, os, signal, sys

when, path = sys.argv[1], sys.argv[2]
sys.argv = [path] + sys.argv[3:]
loader = importlib.machinery.SourceFileLoader("keyplan_kms_azure", path)
helper = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
loader.exec_module(helper)
real = helper.View.propose

def propose_and_die(self, new_state, op):
    if when == "after":
        real(self, new_state, op)
    os.kill(os.getpid(), signal.SIGKILL)

helper.View.propose = propose_and_die
sys.exit(helper.main())
"#;

/// Runs `request` through the helper (prefix `t-`) wrapped in [`KILLED_AT_RECORD`]; asserts it
/// was killed.
fn killed_at_record(vault: &AzureVault, dir: &std::path::Path, when: &str, request: &str) {
    use std::io::Write as _;
    use std::os::unix::process::ExitStatusExt as _;
    let killer = dir.join("killed-at-record.py");
    std::fs::write(&killer, KILLED_AT_RECORD).unwrap();
    let mut child = std::process::Command::new(crate::common::standin::python())
        .arg(&killer)
        .args([
            when,
            crate::common::azure::HELPER,
            &vault.url(),
            "--prefix",
            "t-",
        ])
        .envs(vault.helper_env(CLIENT_SECRET, 0))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.signal(), Some(9), "{out:?}");
}

/// Is the Key Vault version holding keyplan version `n` of secret `secret` enabled?
fn enabled(vault: &AzureVault, secret: &str, n: u64) -> bool {
    let all = vault.versions(secret);
    all.iter()
        .find(|v| v.tags.get("keyplan-version").and_then(|t| t.as_str()) == Some(&n.to_string()))
        .unwrap_or_else(|| panic!("no version tagged {n}: {all:?}"))
        .enabled
}

/// Issue 46: the helper disables a version's material before its record says retired. A
/// retire killed before its record entry leaves the version recorded previous with its
/// material disabled (`get`: no such version, which keyplan takes as retired), and the next
/// retire records it; a `destroy_key` killed right after its record entry has disabled every
/// version but the current one already, and the next `destroy_key` disables the rest (before:
/// the record came first, so a kill after it left versions recorded retired still readable).
#[test]
fn retire_and_destroy_disable_the_material_before_the_record_says_so() {
    let Some(vault) = AzureVault::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kms = helper_kms(&vault, dir.path(), "h", "t-");
    let p = |s: &str| keyplan::secret::Passphrase::new(s.as_bytes().to_vec());
    kms.stage("k", &p("one-AAAA"), 1).unwrap();
    kms.commit("k", None, 1).unwrap();
    kms.stage("k", &p("two-BBBB"), 0).unwrap();
    kms.commit("k", Some(1), 2).unwrap();
    kms.stage("k", &p("three-CCCC"), 0).unwrap();
    kms.commit("k", Some(2), 3).unwrap();

    killed_at_record(
        &vault,
        dir.path(),
        "before",
        r#"{"protocol_version":1,"operation":"retire","kms":"azure","key":"k","version":1}"#,
    );
    assert!(!enabled(&vault, "t-k", 1), "v1 is not disabled");
    assert_eq!(
        kms.read("k").unwrap().versions[&1].state,
        keyplan::kms::VersionState::Previous
    );
    assert!(matches!(
        kms.get("k", 1),
        Err(keyplan::kms::KmsError::NoSuchVersion { version: 1, .. })
    ));
    kms.retire("k", 1).unwrap();
    assert_eq!(
        kms.read("k").unwrap().versions[&1].state,
        keyplan::kms::VersionState::Retired
    );

    killed_at_record(
        &vault,
        dir.path(),
        "after",
        r#"{"protocol_version":1,"operation":"destroy_key","kms":"azure","key":"k","expected_current":3}"#,
    );
    let st = kms.read("k").unwrap();
    assert_eq!((st.current, st.pending), (None, None), "{st:?}");
    assert!(
        !enabled(&vault, "t-k", 2),
        "v2, recorded retired, still reads"
    );
    assert!(
        enabled(&vault, "t-k", 3),
        "v3 is disabled right after the record"
    );
    kms.destroy_key("k", 3)
        .expect("destroy_key again finishes it");
    let left: Vec<_> = vault
        .versions("t-k")
        .into_iter()
        .filter(|v| v.enabled)
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
