//! The `kmip` provider against a real PyKMIP server (started by each test on a free loopback
//! port, see `common/pykmip.rs`): the provider contract, configuration and TLS failures, and
//! the keyplan binary end to end, judged by cryptsetup and by PyKMIP's own client.

use crate::common::kms_contract;
use crate::common::pykmip;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use keyplan::kms::kmip::KmipKms;
use keyplan::kms::{Kms, KmsError, VersionState};
use keyplan::secret::Passphrase;
use pykmip::PyKmip;

fn client(server: &PyKmip) -> KmipKms {
    KmipKms::new(
        "hsm",
        &server.endpoint(),
        &server.file("ca.crt"),
        &server.file("client.crt"),
        &server.file("client.key"),
    )
    .expect("open kmip KMS")
}

fn pass(s: &str) -> Passphrase {
    Passphrase::new(s.as_bytes().to_vec())
}

#[test]
fn provider_contract() {
    let Some(server) = PyKmip::start() else {
        return;
    };
    let (kms, other) = (client(&server), client(&server));
    kms_contract::run(&kms, &other, "contract");
    // What PyKMIP's own client sees: the current version of key a is one Active HMAC-SHA256
    // object named contract-a/v<N> in group keyplan:contract-a, the destroyed ones are gone.
    let objs = server.objects();
    let a: Vec<_> = objs
        .iter()
        .filter(|o| o.groups.iter().any(|g| g == "keyplan:contract-a"))
        .collect();
    assert_eq!(a.len(), 1, "{objs:?}");
    assert_eq!(a[0].state, "ACTIVE");
    assert_eq!(a[0].algorithm, "HMAC_SHA256");
    assert_eq!(a[0].bytes(), b"back-again-DDDD");
    assert_eq!(a[0].length, 8 * 15);
    // Key b was rotated by the holder part of the contract: v1 superseded, v2 current.
    let b = pykmip::named(&objs, "contract-b/v1");
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].state, "DEACTIVATED");
    assert_eq!(b[0].length, 8 * b[0].bytes().len() as u64);
    assert_eq!(pykmip::named(&objs, "contract-b/v2")[0].state, "ACTIVE");
    // The holder records were released: their objects are gone.
    assert!(
        objs.iter()
            .all(|o| o.groups.iter().all(|g| !g.starts_with("keyplan-holders:"))),
        "{objs:?}"
    );
}

#[test]
fn check_writes_nothing_and_retired_versions_stay_listed() {
    let Some(server) = PyKmip::start() else {
        return;
    };
    let kms = client(&server);
    kms.check(&["k".to_string()]).expect("check");
    assert!(server.objects().is_empty(), "check wrote something");
    for (v, p) in [(1, "one-one-one"), (2, "two-two-two"), (3, "three-three")] {
        assert_eq!(kms.stage("k", &pass(p), 0).unwrap(), v);
        kms.commit("k", (v > 1).then_some(v - 1), v).unwrap();
    }
    // Retire v1 and v2: PyKMIP deletes destroyed objects; the history of v3 keeps them listed.
    kms.retire("k", 1).unwrap();
    kms.retire("k", 2).unwrap();
    let objs = server.objects();
    assert_eq!(objs.len(), 1, "{objs:?}");
    assert!(pykmip::named(&objs, "k/v1").is_empty() && pykmip::named(&objs, "k/v2").is_empty());
    let st = kms.read("k").unwrap();
    assert_eq!(st.current, Some(3));
    let states: Vec<_> = st.versions.values().map(|v| (v.version, v.state)).collect();
    assert_eq!(
        states,
        [
            (1, VersionState::Retired),
            (2, VersionState::Retired),
            (3, VersionState::Current)
        ]
    );
    assert!(st.versions[&1].created_at > 1_600_000_000);
    assert!(matches!(
        kms.get("k", 2),
        Err(KmsError::NoSuchVersion { .. })
    ));
}

/// A second Active object (an operator activated one, or a commit was interrupted between
/// Activate and Revoke): the highest is current, and the next commit revokes the lower one.
#[test]
fn two_active_objects_highest_is_current_and_commit_cleans_up() {
    let Some(server) = PyKmip::start() else {
        return;
    };
    let kms = client(&server);
    kms.stage("k", &pass("first-version"), 1).unwrap();
    kms.commit("k", None, 1).unwrap();
    server.operator_register_active("k/v2", "keyplan:k", b"operator-made-v2");
    let st = kms.read("k").unwrap();
    assert_eq!((st.current, st.pending), (Some(2), None));
    assert_eq!(st.versions[&1].state, VersionState::Previous);
    assert_eq!(kms.get("k", 2).unwrap().expose(), b"operator-made-v2");
    // The engine's repeated commit of the current version is a no-op that revokes v1.
    kms.commit("k", Some(1), 2).unwrap();
    let objs = server.objects();
    assert_eq!(pykmip::named(&objs, "k/v1")[0].state, "DEACTIVATED");
    assert_eq!(pykmip::named(&objs, "k/v2")[0].state, "ACTIVE");
    // Staging while another writer's version is pending is a conflict.
    let v3 = kms.stage("k", &pass("third-version"), 0).unwrap();
    assert_eq!(v3, 3);
    assert!(matches!(
        client(&server).stage("k", &pass("rival"), 0),
        Err(KmsError::Conflict { .. })
    ));
    let objs = server.objects();
    assert_eq!(pykmip::named(&objs, "k/v3")[0].bytes(), b"third-version");
    assert_eq!(objs.len(), 3, "the rival registered nothing");
}

/// The engine may commit a pending version below the current one (an operator activated a
/// higher version by hand, and keyplan re-planned from it): the commit supersedes it, exactly
/// as with any other current version.
#[test]
fn commit_below_a_higher_current_supersedes_it() {
    let Some(server) = PyKmip::start() else {
        return;
    };
    let kms = client(&server);
    kms.stage("k", &pass("first-version"), 1).unwrap();
    kms.commit("k", None, 1).unwrap();
    assert_eq!(kms.stage("k", &pass("second-version"), 0).unwrap(), 2);
    server.operator_register_active("k/v9", "keyplan:k", b"operator-made-v9");
    let st = kms.read("k").unwrap();
    assert_eq!((st.current, st.pending), (Some(9), Some(2)));
    assert!(matches!(
        kms.commit("k", Some(1), 2),
        Err(KmsError::Conflict { .. })
    ));
    kms.commit("k", Some(9), 2).unwrap();
    let st = kms.read("k").unwrap();
    assert_eq!((st.current, st.pending), (Some(2), None));
    assert_eq!(st.versions[&9].state, VersionState::Previous);
    assert_eq!(st.versions[&1].state, VersionState::Previous);
    let objs = server.objects();
    assert_eq!(pykmip::named(&objs, "k/v9")[0].state, "DEACTIVATED");
    assert_eq!(pykmip::named(&objs, "k/v2")[0].state, "ACTIVE");
    kms.commit("k", Some(9), 2).unwrap();
}

fn certs_dir() -> Option<tempfile::TempDir> {
    if pykmip::which("openssl").is_none() {
        pykmip::skip_or_fail("openssl not found in PATH");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    pykmip::make_cert(
        d,
        "ca",
        "test CA",
        None,
        &["basicConstraints=critical,CA:TRUE"],
    );
    pykmip::make_cert(
        d,
        "client",
        "keyplan",
        Some("ca"),
        &["extendedKeyUsage=clientAuth"],
    );
    pykmip::make_cert(
        d,
        "other",
        "other",
        Some("ca"),
        &["extendedKeyUsage=clientAuth"],
    );
    Some(dir)
}

fn config_error(r: Result<KmipKms, KmsError>) -> String {
    match r {
        Err(e @ KmsError::Config { .. }) => e.to_string(),
        other => panic!("expected a Config error, got {other:?}"),
    }
}

#[test]
fn unusable_settings_are_config_errors_naming_the_file() {
    let Some(dir) = certs_dir() else {
        return;
    };
    let f = |n: &str| dir.path().join(n);
    let open =
        |ep: &str, ca: &Path, cert: &Path, key: &Path| KmipKms::new("hsm", ep, ca, cert, key);
    let missing = f("missing.crt");
    let text = config_error(open(
        "127.0.0.1:5696",
        &missing,
        &f("client.crt"),
        &f("client.key"),
    ));
    assert!(
        text.contains("ca_cert") && text.contains(&*missing.to_string_lossy()),
        "{text}"
    );
    assert!(text.contains("kmip KMS \"hsm\" (127.0.0.1:5696)"), "{text}");
    std::fs::write(f("garbage.pem"), "not a certificate\n").unwrap();
    let text = config_error(open(
        "127.0.0.1:5696",
        &f("ca.crt"),
        &f("garbage.pem"),
        &f("client.key"),
    ));
    assert!(
        text.contains("client_cert") && text.contains("garbage.pem"),
        "{text}"
    );
    let text = config_error(open(
        "127.0.0.1:5696",
        &f("ca.crt"),
        &f("client.crt"),
        &f("client.crt"),
    ));
    assert!(
        text.contains("client_key") && text.contains("client.crt"),
        "{text}"
    );
    let text = config_error(open(
        "127.0.0.1:5696",
        &f("ca.crt"),
        &f("client.crt"),
        &f("other.key"),
    ));
    assert!(
        text.contains("is not the private key of client_cert"),
        "{text}"
    );
    let text = config_error(open(
        "localhost",
        &f("ca.crt"),
        &f("client.crt"),
        &f("client.key"),
    ));
    assert!(text.contains("not host:port"), "{text}");
    // A private key never appears in a message or in Debug output.
    let key = std::fs::read_to_string(f("client.key")).unwrap();
    let kms = open(
        "127.0.0.1:5696",
        &f("ca.crt"),
        &f("client.crt"),
        &f("client.key"),
    )
    .unwrap();
    let dbg = format!("{kms:?}");
    assert!(!dbg.contains(key.lines().nth(1).unwrap()), "{dbg}");
}

#[test]
fn unreachable_server_is_unavailable_naming_the_endpoint() {
    let Some(dir) = certs_dir() else {
        return;
    };
    let f = |n: &str| dir.path().join(n);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("127.0.0.1:{port}");
    let kms = KmipKms::new(
        "hsm",
        &endpoint,
        &f("ca.crt"),
        &f("client.crt"),
        &f("client.key"),
    )
    .unwrap();
    for r in [
        kms.read("k").map(|_| ()),
        kms.stage("k", &pass("never-stored"), 1).map(|_| ()),
        kms.commit("k", None, 1),
    ] {
        match r {
            Err(e @ KmsError::Unavailable { .. }) => {
                let text = e.to_string();
                assert!(text.contains(&endpoint), "{text}");
                assert!(text.contains("run `keyplan apply` again"), "{text}");
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
}

#[test]
fn tls_failures_are_denied_or_config() {
    let Some(server) = PyKmip::start() else {
        return;
    };
    // A client certificate the server's CA did not sign: the server refuses the handshake.
    let (rogue_crt, rogue_key) = server.rogue_client();
    let kms = KmipKms::new(
        "hsm",
        &server.endpoint(),
        &server.file("ca.crt"),
        &rogue_crt,
        &rogue_key,
    )
    .unwrap();
    match kms.read("k") {
        Err(e @ KmsError::Denied { .. }) => {
            let text = e.to_string();
            assert!(text.contains("client certificate"), "{text}");
            assert!(text.contains(&*rogue_crt.to_string_lossy()), "{text}");
        }
        other => panic!("expected Denied, got {other:?}"),
    }
    // A certificate the CA signed, but without extendedKeyUsage clientAuth: PyKMIP completes
    // the handshake, then answers Authentication Not Successful.
    pykmip::make_cert(
        server.dir.path(),
        "noeku",
        "keyplan",
        Some("ca"),
        &["basicConstraints=CA:FALSE"],
    );
    let kms = KmipKms::new(
        "hsm",
        &server.endpoint(),
        &server.file("ca.crt"),
        &server.file("noeku.crt"),
        &server.file("noeku.key"),
    )
    .unwrap();
    match kms.read("k") {
        Err(e @ KmsError::Denied { .. }) => {
            let text = e.to_string();
            assert!(text.contains("AuthenticationNotSuccessful"), "{text}");
            assert!(text.contains("noeku.crt"), "{text}");
        }
        other => panic!("expected Denied, got {other:?}"),
    }
    // A ca_cert that did not sign the server's certificate: keyplan refuses the server.
    let kms = KmipKms::new(
        "hsm",
        &server.endpoint(),
        &rogue_crt,
        &server.file("client.crt"),
        &server.file("client.key"),
    )
    .unwrap();
    match kms.read("k") {
        Err(e @ KmsError::Config { .. }) => {
            let text = e.to_string();
            assert!(text.contains("not trusted"), "{text}");
        }
        other => panic!("expected Config, got {other:?}"),
    }
    assert!(server.objects().is_empty());
}

// ---------------------------------------------------------------------------------------------
// The keyplan binary end to end.

/// Two LUKS2 devices and one LUKS1 device sharing key `osd-kek` in the kmip KMS `hsm`.
fn e2e_plan(kms_yaml: &str) -> String {
    format!(
        "version: 1\nkms:\n{kms_yaml}keys:\n  osd-kek:\n    kms: hsm\ndevices:\n  block: {{ path: block.img, keys: [osd-kek], enroll_with: initial.pass }}\n  db: {{ path: db.img, keys: [osd-kek], enroll_with: initial.pass }}\n  legacy: {{ path: legacy.img, keys: [osd-kek], enroll_with: initial.pass }}\n{FAST_PBKDF}"
    )
}

fn e2e_devices(s: &Scratch) -> Vec<PathBuf> {
    s.initial_pass();
    vec![
        s.small_image("block.img", "luks2"),
        s.small_image("db.img", "luks2"),
        s.small_image("legacy.img", "luks1"),
    ]
}

/// The versions of `osd-kek` as PyKMIP's own client sees them (one Python run).
struct Seen(Vec<pykmip::PyObject>);

impl Seen {
    /// The key's version objects (not its holder records).
    fn now(server: &PyKmip) -> Seen {
        Seen(
            server
                .objects()
                .into_iter()
                .filter(|o| o.groups.iter().all(|g| !g.starts_with("keyplan-holders:")))
                .collect(),
        )
    }

    /// The single object named `osd-kek/v<v>`: (state, material).
    fn version(&self, v: u64) -> Option<(String, Vec<u8>)> {
        let name = format!("osd-kek/v{v}");
        let found: Vec<_> = self.0.iter().filter(|o| o.names.contains(&name)).collect();
        assert!(found.len() <= 1, "{found:?}");
        found.first().map(|o| (o.state.clone(), o.bytes()))
    }

    fn state(&self, v: u64) -> Option<String> {
        self.version(v).map(|(s, _)| s)
    }
}

#[test]
fn e2e_enroll_rotate_retire_key_get() {
    let Some(server) = PyKmip::start() else {
        return;
    };
    let t0 = Instant::now();
    let w = Watched::new();
    let devs = e2e_devices(&w.s);
    w.s.plan("keyplan.yaml", &e2e_plan(&server.kms_yaml("hsm")));

    let out = w.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(out.contains("+ key osd-kek v1"), "{out}");
    assert!(server.objects().is_empty(), "plan wrote to the KMS");

    w.ok(&["apply", "--auto-approve"], 0);
    let seen = Seen::now(&server);
    assert_eq!(seen.0.len(), 1, "{:?}", seen.0);
    let (state, v1) = seen.version(1).expect("v1 in the KMS");
    assert_eq!(state, "ACTIVE");
    assert_eq!(v1.len(), 44, "32 random bytes as base64");
    w.add_secret(&v1);
    for d in &devs {
        assert!(opens(d, &v1, None), "v1 opens {}", d.display());
    }

    // Rotation 1: v2 current, v1 kept as previous (Deactivated, material still held).
    let out = w.ok(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let seen = Seen::now(&server);
    let (state, v2) = seen.version(2).expect("v2 in the KMS");
    assert_eq!(state, "ACTIVE");
    w.add_secret(&v2);
    assert_eq!(seen.state(1).as_deref(), Some("DEACTIVATED"));
    for d in &devs {
        assert!(opens(d, &v2, None), "v2 opens {}", d.display());
        assert!(!opens(d, &v1, None), "v1 still opens {}", d.display());
    }

    // Rotation 2: v3 current, v2 previous, v1 retired: destroyed in the server.
    w.ok(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    let seen = Seen::now(&server);
    assert_eq!(seen.0.len(), 2, "{:?}", seen.0);
    let (state, v3) = seen.version(3).expect("v3 in the KMS");
    assert_eq!(state, "ACTIVE");
    w.add_secret(&v3);
    assert_eq!(seen.state(2).as_deref(), Some("DEACTIVATED"));
    assert!(seen.version(1).is_none(), "v1 was not destroyed");
    for d in &devs {
        assert!(opens(d, &v3, None), "v3 opens {}", d.display());
        assert!(!opens(d, &v2, None) && !opens(d, &v1, None));
    }

    w.ok(&["plan", "--detailed-exitcode"], 0);
    // (not recorded: its stdout is the key, on purpose)
    let out = w
        .command(&["key", "get", "osd-kek", "-f", "keyplan.yaml"])
        .output()
        .expect("key get");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, v3);
    let out = w.run(&["key", "get", "osd-kek", "--version", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("was retired"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    w.ok(&["verify"], 0);
    w.assert_no_leaks();
    eprintln!("e2e took {:?}", t0.elapsed());
}

/// Enrolls the e2e plan and returns the devices and the current passphrase.
fn enrolled(w: &Watched, server: &PyKmip) -> (Vec<PathBuf>, Vec<u8>) {
    let devs = e2e_devices(&w.s);
    w.s.plan("keyplan.yaml", &e2e_plan(&server.kms_yaml("hsm")));
    w.ok(&["apply", "--auto-approve"], 0);
    let (_, v1) = Seen::now(server).version(1).expect("v1");
    w.add_secret(&v1);
    (devs, v1)
}

/// The devices and keyplan's LUKS1 records, to prove a failed command changed neither.
fn untouched(w: &Watched, devs: &[PathBuf]) -> Snapshot {
    let mut paths = devs.to_vec();
    paths.push(w.s.path(".keyplan/luks1"));
    Snapshot::take(&paths)
}

#[test]
fn e2e_server_down_is_unavailable_and_devices_untouched() {
    let Some(mut server) = PyKmip::start() else {
        return;
    };
    let w = Watched::new();
    let (devs, v1) = enrolled(&w, &server);
    server.stop();
    let snap = untouched(&w, &devs);
    // `plan` could not check (exit 3), `apply` could not run (exit 1).
    for (args, code) in [
        (vec!["plan"], 3),
        (vec!["apply", "--auto-approve", "--rotate", "osd-kek"], 1),
    ] {
        let out = w.ok(&args, code);
        assert!(out.contains("is unavailable"), "{out}");
        assert!(out.contains(&server.endpoint()), "{out}");
        assert!(out.contains("kmip KMS \"hsm\""), "{out}");
    }
    snap.assert_unchanged("KMIP server down");
    for d in &devs {
        assert!(opens(d, &v1, None));
    }
    w.assert_no_leaks();
}

#[test]
fn e2e_wrong_client_cert_is_denied_and_devices_untouched() {
    let Some(server) = PyKmip::start() else {
        return;
    };
    let w = Watched::new();
    let (devs, v1) = enrolled(&w, &server);
    let (crt, key) = server.rogue_client();
    w.s.plan(
        "keyplan.yaml",
        &e2e_plan(&server.kms_yaml_with("hsm", &server.file("ca.crt"), &crt, &key)),
    );
    let snap = untouched(&w, &devs);
    let out = w.ok(&["apply", "--auto-approve", "--rotate", "osd-kek"], 1);
    assert!(out.contains("refused"), "{out}");
    assert!(out.contains("client certificate"), "{out}");
    assert!(out.contains(&server.endpoint()), "{out}");
    snap.assert_unchanged("rogue client certificate");
    let versions = server
        .objects()
        .into_iter()
        .filter(|o| o.groups.iter().any(|g| g == "keyplan:osd-kek"))
        .count();
    assert_eq!(versions, 1, "nothing staged");
    for d in &devs {
        assert!(opens(d, &v1, None));
    }
    w.assert_no_leaks();
}

/// An operator makes another version current between keyplan's stage and commit (keyplan is
/// held before its commit by a failpoint gate): the commit is refused (compare-and-swap),
/// nothing in the KMS is overwritten, no keyslot is killed.
#[test]
fn e2e_concurrent_writer_between_stage_and_commit_is_a_conflict() {
    let Some(server) = PyKmip::start() else {
        return;
    };
    let w = Watched::new();
    let (devs, v1) = enrolled(&w, &server);
    let operator = server.operator_ready("osd-kek/v9", "keyplan:osd-kek");
    // keyplan is held before its commit for as long as the gate exists (src/failpoint.rs).
    let gate = w.s.path("commit.gate");
    std::fs::write(&gate, b"").expect("gate");
    let child = w
        .command(&["apply", "--auto-approve", "--rotate", "osd-kek"])
        .env(
            "FAILPOINTS",
            format!("commit.before=return(wait:{})", gate.display()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // stage, 3 adds, 3 verifies, then the commit step, held at the gate
    wait_at_gate(&gate, child.id());
    let foreign = b"operator's own passphrase".to_vec();
    w.add_secret(&foreign);
    operator.finish(&foreign);
    std::fs::remove_file(&gate).expect("open the gate");
    let out = child.wait_with_output().expect("wait");
    w.record(&out);
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("changed concurrently"), "{text}");
    assert!(text.contains("nothing was overwritten"), "{text}");
    // Nothing overwritten: the operator's v9 is still Active with its material, keyplan's v2
    // is still pending, v1 was not revoked.
    let seen = Seen::now(&server);
    assert_eq!(seen.version(9), Some(("ACTIVE".into(), foreign)));
    let (state, v2) = seen.version(2).expect("v2 staged");
    assert_eq!(state, "PRE_ACTIVE");
    w.add_secret(&v2);
    assert_eq!(seen.version(1), Some(("ACTIVE".into(), v1.clone())));
    for d in &devs {
        assert!(opens(d, &v1, None), "no keyslot was killed");
        assert_eq!(keyslots(d).len(), 3, "initial + v1 + staged v2");
    }
    w.assert_no_leaks();
}

/// keyplan's own access to the KMIP server is its client certificate: `status` reports its
/// notAfter, and one that ends before the next rotation is due plus 14 days is a problem (exit
/// 1, `keyplan_kms_credential_expiring` 1) that `plan` warns about too; a certificate valid
/// long enough is not. The fixture's client certificate is valid for 2 days.
#[test]
fn status_warns_about_a_client_certificate_expiring_before_the_next_rotation() {
    let Some(server) = PyKmip::start() else {
        return;
    };
    let w = Watched::new();
    let _devs = e2e_devices(&w.s);
    let plan = |kms_yaml: &str| {
        e2e_plan(kms_yaml).replace(
            "  osd-kek:\n    kms: hsm\n",
            "  osd-kek:\n    kms: hsm\n    rotate_after: 30d\n",
        )
    };
    w.s.plan("keyplan.yaml", &plan(&server.kms_yaml("hsm")));
    let out = w.ok(&["apply", "--auto-approve"], 0);
    assert!(
        out.contains("client certificate") && out.contains("expires at"),
        "apply warns about the certificate:\n{out}"
    );
    let (_, v1) = Seen::now(&server).version(1).expect("v1");
    w.add_secret(&v1);

    let out = w.run(&["status", "--format", "json"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let cert = &j["kms"][0]["credentials"][0];
    assert_eq!(j["kms"][0]["kms"], "hsm");
    assert_eq!(cert["kind"], "client_certificate");
    assert_eq!(cert["expiring"], true, "{j:#}");
    let expires = cert["expires_at"].as_u64().expect("expires_at");
    let now = j["generated_at"].as_u64().expect("generated_at");
    assert!(
        expires > now + 86_400 && expires <= now + 2 * 86_400 + 60,
        "notAfter about 2 days ahead: {expires} vs {now}"
    );
    let problems = j["problems"].to_string();
    assert!(
        problems.contains("KMS hsm: client certificate") && problems.contains("key osd-kek"),
        "{problems}"
    );
    let prom = w.ok(&["status", "--format", "prometheus"], 1);
    assert!(
        prom.contains(
            r#"keyplan_kms_credential_expiring{kms="hsm",credential="client_certificate"} 1"#
        ),
        "{prom}"
    );
    assert!(prom.contains(&format!(
        r#"keyplan_kms_credential_expiry_timestamp_seconds{{kms="hsm",credential="client_certificate"}} {expires}"#
    )));
    let out = w.ok(&["plan"], 0);
    assert!(
        out.contains("WARN") && out.contains("client certificate"),
        "{out}"
    );

    // A certificate from the same CA valid for 400 days: nothing to warn about.
    pykmip::make_cert_days(
        &server.file(""),
        "long",
        "keyplan",
        Some("ca"),
        &["extendedKeyUsage=clientAuth", "basicConstraints=CA:FALSE"],
        400,
    );
    w.s.plan(
        "keyplan.yaml",
        &plan(&server.kms_yaml_with(
            "hsm",
            &server.file("ca.crt"),
            &server.file("long.crt"),
            &server.file("long.key"),
        )),
    );
    let out = w.run(&["status", "--format", "json"]);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(out.status.code(), Some(0), "{j:#}");
    assert_eq!(j["kms"][0]["credentials"][0]["expiring"], false);
    w.assert_no_leaks();
}

/// A KMIP server that accepts the TCP connection and never answers (not even the TLS
/// handshake), holding three keys (issue 29): `status` ends within the KMS's `timeout` (2 s
/// here, with generous slack) with exit 3 naming the KMS and the deadline, `plan` and `verify`
/// with exit 3 and an error naming both. The handshake and every read and write are bounded
/// by the call's deadline, so a silent server costs one `timeout`.
#[test]
fn a_kmip_server_that_never_answers_is_bounded() {
    let Some(certs) = certs_dir() else {
        return;
    };
    let (_silent, addr) = silent_listener();
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    let f = |n: &str| certs.path().join(n).display().to_string();
    s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  hsm: {{ provider: kmip, endpoint: \"{addr}\", ca_cert: {}, client_cert: {}, client_key: {}, timeout: 2s }}\nkeys:\n  a: {{ kms: hsm }}\n  b: {{ kms: hsm }}\n  c: {{ kms: hsm }}\ndevices:\n  d: {{ path: a.img, keys: [a], enroll_with: initial.pass }}\n{FAST_PBKDF}",
            f("ca.crt"),
            f("client.crt"),
            f("client.key")
        ),
    );
    assert_silent_kms_bounded(
        s.dir.path(),
        &[],
        r#"kmip KMS "hsm""#,
        2,
        Duration::from_secs(12),
    );
}

/// Issue 46: a key with no current version whose objects still hold material (here v2, the
/// current one, revoked by an operator while v1 was still Deactivated, as a destroy cut short
/// by an older keyplan left it) is finished by `destroy_key`: every such object is destroyed,
/// not only the expected current version's (before: v1 stayed Deactivated with its material).
#[test]
fn destroy_key_finishes_every_object_left_with_material() {
    let Some(server) = PyKmip::start() else {
        return;
    };
    let kms = client(&server);
    kms.stage("k", &pass("first-version"), 1).unwrap();
    kms.commit("k", None, 1).unwrap();
    kms.stage("k", &pass("second-version"), 0).unwrap();
    kms.commit("k", Some(1), 2).unwrap();
    let v2 = pykmip::named(&server.objects(), "k/v2")[0].uid.clone();
    server.operator_revoke(&v2);
    let st = kms.read("k").unwrap();
    assert_eq!((st.current, st.pending), (None, None), "{st:?}");

    kms.destroy_key("k", 2).expect("destroy_key finishes it");
    let left: Vec<_> = server
        .objects()
        .into_iter()
        .filter(|o| o.names.iter().any(|n| n.starts_with("k/v")))
        .map(|o| (o.names, o.state))
        .collect();
    assert!(left.is_empty(), "objects left: {left:?}");
    assert!(matches!(
        kms.get("k", 1),
        Err(KmsError::NoSuchVersion { version: 1, .. })
    ));
}
