//! The `exec` KMS provider: the provider contract through the example helper
//! `examples/exec-kms/keyplan-kms-dir` (Python 3), the CLI end to end with LUKS images, and
//! broken helpers (small shell scripts written by each test) mapped onto `KmsError`s.
//!
//! Independent witness: the example helper's directory is read directly (`keys/<key>/meta.json`
//! and `v<N>.key`), never through keyplan, and devices are tested with cryptsetup directly.
//! Python 3 plays the part of the "server": without it these tests print "skipped: ..." (or
//! fail when `KEYPLAN_REQUIRE_SERVERS=1`).

use crate::common::kms_contract;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::common::standin::{python, python_available};
use crate::common::*;
use keyplan::kms::exec::ExecKms;
use keyplan::kms::{Kms, KmsError};
use keyplan::secret::Passphrase;

/// The example helper shipped with keyplan.
const HELPER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/exec-kms/keyplan-kms-dir"
);

/// The example helper's argv for the key directory `keys`.
fn helper_argv(keys: &Path) -> Vec<String> {
    vec![python(), HELPER.into(), keys.display().to_string()]
}

/// An exec KMS running the example helper on `<dir>/keys`.
fn example_kms(dir: &Path) -> ExecKms {
    ExecKms::new(
        "custom",
        helper_argv(&dir.join("keys")),
        Duration::from_secs(30),
    )
    .expect("exec kms")
}

/// Writes `body` as the executable file `<dir>/<name>` (replacing it), and closes it before
/// returning: written, synced and dropped, so no descriptor of ours is open for writing when
/// the script is run.
///
/// That matters because execve(2) refuses, with `ETXTBSY` ("Text file busy"), a file any
/// process holds open for writing. Closing our descriptor is necessary but not enough in a
/// test binary whose tests run on several threads: while it is open, another test's thread may
/// fork (to start a helper or cryptsetup), and the forked child holds a copy of it until its
/// `exec` a moment later (`O_CLOEXEC` closes it only then). keyplan therefore retries a start
/// refused with `ETXTBSY` for a short while (`keyplan::child`), as it must anyway for a helper
/// being replaced in place; this was the cause of a flaky "cannot start the helper: Text file
/// busy (os error 26)" in `broken_helpers_are_unavailable_naming_the_command`.
fn write_script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let p = dir.join(name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(&p)
        .expect("create script");
    file.write_all(body.as_bytes()).expect("write script");
    file.set_permissions(std::fs::Permissions::from_mode(0o755))
        .expect("chmod script");
    file.sync_all().expect("sync script");
    drop(file);
    p
}

/// An exec KMS running the shell script `body` (written as `<dir>/<name>`), 5 s time limit.
fn scripted(dir: &Path, name: &str, body: &str) -> ExecKms {
    let p = write_script(dir, name, &format!("#!/bin/sh\n{body}\n"));
    ExecKms::new(
        "custom",
        vec![p.display().to_string()],
        Duration::from_secs(5),
    )
    .expect("exec")
}

fn pass(s: &str) -> Passphrase {
    Passphrase::new(s.as_bytes().to_vec())
}

/// A helper answering every request with `response` (after reading the request).
fn answering(dir: &Path, name: &str, response: &str) -> ExecKms {
    scripted(
        dir,
        name,
        &format!("cat >/dev/null\nprintf '%s\\n' '{response}'"),
    )
}

#[test]
fn contract_through_the_example_helper() {
    if !python_available("contract_through_the_example_helper") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kms = example_kms(dir.path());
    let other = example_kms(dir.path());
    kms_contract::run(&kms, &other, "contract");

    // The helper's files, read directly: private modes, the layout of docs/kms/exec.md.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let keys = dir.path().join("keys");
    assert_eq!(mode(keys.clone()), 0o700);
    assert_eq!(mode(keys.join("contract-b")), 0o700);
    assert_eq!(mode(keys.join("contract-b/meta.json")), 0o600);
    assert_eq!(mode(keys.join("contract-b/v1.key")), 0o600);
    let long = "p".repeat(300) + "=+/ \t~";
    assert_eq!(
        std::fs::read(keys.join("contract-b/v1.key")).unwrap(),
        long.as_bytes()
    );
    // No temporary file is left behind.
    for f in walk(&keys) {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        assert!(!name.starts_with(".tmp"), "{}", f.display());
    }
}

#[test]
fn example_helper_refuses_other_protocol_versions_and_bad_requests() {
    if !python_available("example_helper_refuses_other_protocol_versions_and_bad_requests") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ask = |request: &str| -> serde_json::Value {
        let mut cmd = Command::new(python());
        cmd.arg(HELPER).arg(dir.path().join("keys"));
        let out = run_with_stdout(cmd, request.as_bytes());
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).expect("one JSON object")
    };
    for (request, kind) in [
        (
            r#"{"protocol_version":2,"operation":"read","kms":"c","key":"k"}"#,
            "config",
        ),
        (
            r#"{"protocol_version":1,"operation":"rotate","kms":"c","key":"k"}"#,
            "config",
        ),
        (
            r#"{"protocol_version":1,"operation":"read","kms":"c","key":"../etc"}"#,
            "config",
        ),
        ("not json", "config"),
        (
            r#"{"protocol_version":1,"operation":"get","kms":"c","key":"k","version":3}"#,
            "no_such_version",
        ),
    ] {
        let v = ask(request);
        assert_eq!(v["protocol_version"], 1, "{request}: {v}");
        assert_eq!(v["ok"], false, "{request}: {v}");
        assert_eq!(v["error"]["kind"], kind, "{request}: {v}");
    }
    let v = ask(r#"{"protocol_version":1,"operation":"read","kms":"c","key":"k"}"#);
    assert_eq!(
        v,
        serde_json::json!({"protocol_version":1,"ok":true,"result":{"current":null,"pending":null,"versions":[],"holders":{}}})
    );
    // The file itself is executable (`#!/usr/bin/env python3`) and takes the directory from
    // KEYPLAN_KMS_DIR when no argument is given.
    let mut cmd = Command::new(HELPER);
    cmd.env("KEYPLAN_KMS_DIR", dir.path().join("keys"));
    let out = run_with_stdout(
        cmd,
        br#"{"protocol_version":1,"operation":"read","kms":"c","key":"k"}"#,
    );
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        v,
        serde_json::json!({"protocol_version":1,"ok":true,"result":{"current":null,"pending":null,"versions":[],"holders":{}}})
    );
    // read, get and check write nothing (keyplan's `plan` must leave no trace).
    assert!(!dir.path().join("keys").exists());
}

/// Runs `cmd` with `input` on stdin and captures stdout and stderr.
fn run_with_stdout(mut cmd: Command, input: &[u8]) -> Output {
    use std::io::Write as _;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().expect("wait")
}

/// `credentials` (docs/kms/exec.md): a helper's report becomes keyplan's, shown as keyplan
/// shows helper text (redacted, one line); a helper that does not know the operation
/// (`config`) reports none; a kind that cannot be a metrics label or a refusal is an error.
#[test]
fn helper_credentials_answers() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ok = |result: &str| format!(r#"{{"protocol_version":1,"ok":true,"result":{result}}}"#);

    let kms = answering(
        d,
        "reports",
        &ok(
            r#"{"credentials":[{"kind":"ibm_api_key","what":"API key from\nthe file /etc/kp.key","expires_at":1900000000},{"kind":"wi_token","what":"token","renewed_by":"the kubelet","renewable_until":1950000000,"unknown":1}]}"#,
        ),
    );
    let list = kms.credentials().expect("credentials");
    assert_eq!(list.len(), 2, "{list:?}");
    assert_eq!(list[0].kind, "ibm_api_key");
    assert_eq!(list[0].what, "API key from; the file /etc/kp.key");
    assert_eq!(list[0].expires_at, Some(1900000000));
    assert_eq!(list[0].renewed_by, None);
    assert_eq!(list[0].deadline(), Some(1900000000));
    assert_eq!(list[1].renewed_by.as_deref(), Some("the kubelet"));
    assert_eq!(list[1].deadline(), Some(1950000000));

    let kms = answering(d, "none", &ok(r#"{"credentials":[]}"#));
    assert!(kms.credentials().expect("credentials").is_empty());

    // A helper written before `credentials`: "unknown operation" is `config`, taken as none.
    let kms = answering(
        d,
        "older",
        r#"{"protocol_version":1,"ok":false,"error":{"kind":"config","message":"unknown operation 'credentials'"}}"#,
    );
    assert!(kms.credentials().expect("credentials").is_empty());
    // The keyplan-kms-dir example needs no credential.
    let example = example_kms(d);
    assert!(example.credentials().expect("credentials").is_empty());

    let kms = answering(
        d,
        "refused",
        r#"{"protocol_version":1,"ok":false,"error":{"kind":"denied","message":"IAM refused the API key"}}"#,
    );
    match kms.credentials() {
        Err(KmsError::Denied { detail, .. }) => assert!(detail.contains("IAM refused"), "{detail}"),
        other => panic!("expected Denied, got {other:?}"),
    }
    let long = format!(
        r#"{{"credentials":[{{"kind":"{}","what":"x"}}]}}"#,
        "k".repeat(41)
    );
    for (name, bad) in [
        (
            "upper",
            r#"{"credentials":[{"kind":"Bad Kind","what":"x"}]}"#,
        ),
        ("long", long.as_str()),
        ("empty", r#"{"credentials":[{"kind":"k","what":" \n "}]}"#),
        ("missing", r#"{"credentials":[{"what":"x"}]}"#),
        (
            "twice",
            r#"{"credentials":[{"kind":"k","what":"a"},{"kind":"k","what":"b"}]}"#,
        ),
    ] {
        let kms = answering(d, name, &ok(bad));
        match kms.credentials() {
            Err(KmsError::Unavailable { detail, .. }) => {
                assert!(detail.contains("does not follow"), "{name}: {detail}")
            }
            other => panic!("{name}: expected Unavailable, got {other:?}"),
        }
    }
}

#[test]
fn helper_answers_map_onto_kms_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let err = |kind: &str, message: &str| {
        format!(
            r#"{{"protocol_version":1,"ok":false,"error":{{"kind":"{kind}","message":"{message}"}}}}"#
        )
    };

    let kms = answering(
        d,
        "denied",
        &err("denied", "token lacks kms:write on key k"),
    );
    match kms.commit("k", Some(1), 2) {
        Err(e @ KmsError::Denied { .. }) => {
            let text = e.to_string();
            assert!(text.contains("token lacks kms:write on key k"), "{text}");
            assert!(text.contains("denied"), "{text}");
            assert!(
                text.contains(&d.join("denied").display().to_string()),
                "{text}"
            );
        }
        other => panic!("expected Denied, got {other:?}"),
    }
    let kms = answering(d, "conflict", &err("conflict", "current is v5"));
    match kms.commit("k", Some(1), 2) {
        Err(e @ KmsError::Conflict { .. }) => {
            let text = e.to_string();
            assert!(text.contains("current is v5"), "{text}");
            assert!(text.contains("nothing was overwritten"), "{text}");
        }
        other => panic!("expected Conflict, got {other:?}"),
    }
    let kms = answering(d, "nsv", &err("no_such_version", "gone"));
    assert!(matches!(
        kms.get("k", 7),
        Err(KmsError::NoSuchVersion { version: 7, .. })
    ));
    let kms = answering(d, "corrupt", &err("corrupt", "bad record"));
    assert!(matches!(kms.read("k"), Err(KmsError::Corrupt { .. })));
    let kms = answering(d, "config", &err("config", "no region set"));
    match kms.commit("k", None, 1) {
        Err(e @ KmsError::Config { .. }) => assert!(e.to_string().contains("no region set")),
        other => panic!("expected Config, got {other:?}"),
    }
    let kms = answering(d, "unavail", &err("unavailable", "503 from upstream"));
    match kms.commit("k", None, 1) {
        Err(e @ KmsError::Unavailable { .. }) => {
            assert!(e.to_string().contains("503 from upstream"))
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // An error kind keyplan does not know: the helper is broken, the outcome unknown.
    let kms = answering(d, "weird", &err("weird", "?"));
    assert!(matches!(
        kms.commit("k", None, 1),
        Err(KmsError::Unavailable { .. })
    ));
    // A newer protocol version is refused as a newer format (src/format/kms/exec.rs), an
    // older one as a configuration problem.
    let kms = answering(d, "v2", r#"{"protocol_version":2,"ok":true,"result":{}}"#);
    match kms.commit("k", None, 1) {
        Err(e @ KmsError::NewerFormat(_)) => {
            let text = e.to_string();
            assert!(text.contains("kms-exec-protocol format 2"), "{text}");
            assert!(text.contains("up to 1"), "{text}");
            assert!(text.contains("Nothing was changed"), "{text}");
        }
        other => panic!("expected NewerFormat, got {other:?}"),
    }
    let kms = answering(d, "v0", r#"{"protocol_version":0,"ok":true,"result":{}}"#);
    match kms.commit("k", None, 1) {
        Err(e @ KmsError::Config { .. }) => {
            let text = e.to_string();
            assert!(text.contains("protocol_version 0"), "{text}");
        }
        other => panic!("expected Config, got {other:?}"),
    }
    // Successful answers of the wrong shape or inconsistent content.
    let kms = answering(
        d,
        "inconsistent",
        r#"{"protocol_version":1,"ok":true,"result":{"current":2,"pending":null,"versions":[{"version":1,"created_at":1700000000,"state":"current"}]}}"#,
    );
    assert!(matches!(kms.read("k"), Err(KmsError::Corrupt { .. })));
    let kms = answering(
        d,
        "low",
        r#"{"protocol_version":1,"ok":true,"result":{"version":3}}"#,
    );
    assert!(matches!(
        kms.stage("k", &pass("material-XYZ"), 5),
        Err(KmsError::Corrupt { .. })
    ));
    let kms = answering(
        d,
        "badb64",
        r#"{"protocol_version":1,"ok":true,"result":{"material_base64":"***"}}"#,
    );
    assert!(matches!(kms.get("k", 1), Err(KmsError::Corrupt { .. })));
    let kms = answering(
        d,
        "empty",
        r#"{"protocol_version":1,"ok":true,"result":{"material_base64":""}}"#,
    );
    assert!(matches!(kms.get("k", 1), Err(KmsError::Corrupt { .. })));
    // Unknown response fields are ignored (forward compatibility within protocol 1).
    let kms = answering(
        d,
        "extra",
        r#"{"protocol_version":1,"ok":true,"result":{"material_base64":"c2VjcmV0","etag":"x"},"took_ms":3}"#,
    );
    assert_eq!(kms.get("k", 1).unwrap().expose(), b"secret");
}

#[test]
fn broken_helpers_are_unavailable_naming_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // `commit` is never retried, so each case runs the helper once.
    let unavailable = |kms: &ExecKms, wanted: &[&str]| match kms.commit("k", Some(1), 2) {
        Err(e @ KmsError::Unavailable { .. }) => {
            let text = e.to_string();
            assert!(text.contains("exec KMS \"custom\""), "{text}");
            assert!(text.contains(&kms.describe()), "{text}");
            assert!(text.contains("`commit` of key \"k\""), "{text}");
            for w in wanted {
                assert!(text.contains(w), "{w:?} not in: {text}");
            }
        }
        other => panic!("expected Unavailable, got {other:?}"),
    };
    let kms = scripted(
        d,
        "exit1",
        "cat >/dev/null\necho 'dial tcp kms.example:443: connection refused' >&2\nexit 1",
    );
    unavailable(
        &kms,
        &[
            "exited with code 1",
            "dial tcp kms.example:443: connection refused",
            "exit1",
        ],
    );
    // Exit 1 with a well-formed answer: still unavailable (only exit 0 answers).
    let kms = scripted(
        d,
        "exit1json",
        "cat >/dev/null\necho '{\"protocol_version\":1,\"ok\":true,\"result\":{}}'\nexit 1",
    );
    unavailable(&kms, &["exited with code 1"]);
    let kms = scripted(d, "silent", "cat >/dev/null\nexit 0");
    unavailable(&kms, &["printed nothing"]);
    let kms = scripted(d, "notjson", "cat >/dev/null\necho 'Traceback: oops'");
    unavailable(&kms, &["not one JSON object"]);
    let kms = scripted(
        d,
        "twice",
        "cat >/dev/null\necho '{\"protocol_version\":1,\"ok\":true}{\"protocol_version\":1,\"ok\":true}'",
    );
    unavailable(&kms, &["not one JSON object"]);
    let kms = scripted(
        d,
        "noversion",
        "cat >/dev/null\necho '{\"ok\":true,\"result\":{}}'",
    );
    unavailable(&kms, &["protocol_version", "missing"]);
    let kms = scripted(
        d,
        "noerror",
        "cat >/dev/null\necho '{\"protocol_version\":1,\"ok\":false}'",
    );
    unavailable(&kms, &["`error` is missing"]);
    let kms = scripted(d, "killed", "kill -9 $$");
    unavailable(&kms, &["killed by signal 9"]);
    let kms = scripted(
        d,
        "huge",
        "cat >/dev/null\nhead -c 1100000 /dev/zero | tr '\\0' ' '\necho '{}'",
    );
    unavailable(&kms, &["more than 1048576 bytes"]);
    // A long standard error: only its end is quoted, bounded.
    let kms = scripted(
        d,
        "chatty",
        "cat >/dev/null\ni=0\nwhile [ $i -lt 3000 ]; do echo \"noise line $i\" >&2; i=$((i+1)); done\necho 'LAST: token expired' >&2\nexit 3",
    );
    match kms.commit("k", Some(1), 2) {
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("LAST: token expired"), "{text}");
            assert!(!text.contains("noise line 1\""), "{text}");
            assert!(text.len() < 2000, "{} bytes: {text}", text.len());
        }
        Ok(()) => panic!("a failing helper succeeded"),
    }

    // A helper that cannot be started is a configuration problem.
    let missing = ExecKms::new(
        "custom",
        vec![d.join("no-such-helper").display().to_string()],
        Duration::from_secs(5),
    )
    .unwrap();
    match missing.read("k") {
        Err(e @ KmsError::Config { .. }) => {
            assert!(e.to_string().contains("no-such-helper"), "{e}")
        }
        other => panic!("expected Config, got {other:?}"),
    }
    let plain = d.join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    let kms = ExecKms::new(
        "custom",
        vec![plain.display().to_string()],
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(matches!(kms.read("k"), Err(KmsError::Config { .. })));
    assert!(matches!(
        ExecKms::new("custom", vec![], Duration::from_secs(5)),
        Err(KmsError::Config { .. })
    ));
}

/// A helper script written while other threads fork starts anyway: a forked child may hold
/// a copy of the script's write descriptor for a moment, which makes execve(2) fail with
/// `ETXTBSY`, and keyplan retries such a start briefly (see [`write_script`]). The forking
/// thread here keeps each child for 2 ms before its `exec`, so that the race, rare between
/// ordinary tests, happens within a few dozen scripts.
#[test]
fn scripts_written_while_other_threads_fork_can_be_started() {
    use std::os::unix::process::CommandExt as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let stop = Arc::new(AtomicBool::new(false));
    let forker = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let mut cmd = Command::new("true");
                // SAFETY: nanosleep(2) is async-signal-safe; the closure allocates nothing.
                unsafe {
                    cmd.pre_exec(|| {
                        let pause = libc::timespec {
                            tv_sec: 0,
                            tv_nsec: 2_000_000,
                        };
                        libc::nanosleep(&pause, std::ptr::null_mut());
                        Ok(())
                    });
                }
                let _ = cmd.status();
            }
        })
    };
    let ok = r#"{"protocol_version":1,"ok":true,"result":{}}"#;
    let outcome = (0..150).try_for_each(|i| {
        answering(d, &format!("h{i}"), ok)
            .commit("k", None, 1)
            .map_err(|e| format!("helper {i}: {e}"))
    });
    stop.store(true, Ordering::Relaxed);
    forker.join().unwrap();
    outcome.unwrap();
}

/// Is process `pid` gone (or a zombie waiting to be reaped)?
fn dead(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn hung_helpers_are_killed_with_their_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pidfile = d.join("grandchild.pid");
    let kms = ExecKms::new(
        "custom",
        vec![write_script(
            d,
            "hang",
            &format!(
                "#!/bin/sh\nsleep 60 &\necho $! > '{}'\nsleep 60\n",
                pidfile.display()
            ),
        )
        .display()
        .to_string()],
        Duration::from_secs(1),
    )
    .unwrap();
    let started = Instant::now();
    match kms.stage("k", &pass("hung-material-1234"), 1) {
        Err(e @ KmsError::Timeout { .. }) => {
            let text = e.to_string();
            assert!(text.contains("no answer within 1 s"), "{text}");
            assert!(text.contains("KEYPLAN_EXEC_TIMEOUT_SECS"), "{text}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "took {took:?}");
    let grandchild = std::fs::read_to_string(&pidfile).unwrap();
    let grandchild = grandchild.trim();
    let until = Instant::now() + Duration::from_secs(2);
    while !dead(grandchild) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(dead(grandchild), "the helper's child {grandchild} survived");

    // A helper that answers but leaves a process holding its standard output open.
    let kms = ExecKms::new(
        "custom",
        vec![write_script(
            d,
            "linger",
            "#!/bin/sh\ncat >/dev/null\necho '{\"protocol_version\":1,\"ok\":true,\"result\":{}}'\nsleep 60 &\nexit 0\n",
        )
        .display()
        .to_string()],
        Duration::from_secs(1),
    )
    .unwrap();
    let started = Instant::now();
    match kms.commit("k", None, 1) {
        Err(e @ KmsError::Timeout { .. }) => {
            assert!(e.to_string().contains("still held its output open"), "{e}")
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[test]
fn material_never_reaches_errors_argv_or_environment() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let log = d.join("seen.log");
    let secret = "s3cret-material-QQQQ-0123456789";
    let b64 = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(secret)
    };
    // A careless helper: logs its argv and environment, echoes the request on stderr, fails.
    let kms = scripted(
        d,
        "careless",
        &format!(
            "{{ echo \"ARGV: $0 $*\"; env; }} >> '{}'\ncat >&2\nexit 1",
            log.display()
        ),
    );
    let e = kms.stage("k", &pass(secret), 1).unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(text.contains("<redacted>"), "{text}");
    // ... or quotes the material in its error message.
    let kms = scripted(
        d,
        "quoting",
        "req=$(cat)\nprintf '{\"protocol_version\":1,\"ok\":false,\"error\":{\"kind\":\"denied\",\"message\":\"%s\"}}' \"$(printf '%s' \"$req\" | tr -d '\"{}')\"",
    );
    let e = kms.stage("k", &pass(secret), 1).unwrap_err();
    let text2 = format!("{e} {e:?}");
    assert!(matches!(e, KmsError::Denied { .. }), "{text2}");
    assert!(text2.contains("<redacted>"), "{text2}");
    let seen = std::fs::read(&log).unwrap();
    assert!(contains(&seen, b"ARGV:"), "the helper ran");
    for form in leak_forms(secret.as_bytes()) {
        assert!(!contains(text.as_bytes(), &form), "material in: {text}");
        assert!(!contains(text2.as_bytes(), &form), "material in: {text2}");
        assert!(!contains(&seen, &form), "material in the helper's argv/env");
    }
    assert!(!text.contains(&b64));
}

// ------------------------------------------------------------------------------ CLI

/// A plan file with the exec KMS `custom` running `command`, key `k`, and one device per
/// `(id, image path)`, each enrolled with `initial.pass` (relative to the plan).
fn exec_plan(command: &[String], devices: &[(&str, &str)], initial: &str) -> String {
    let mut text = format!(
        "version: 1\nkms:\n  custom:\n    provider: exec\n    command: {}\nkeys:\n  k: {{ kms: custom }}\ndevices:\n",
        serde_json::to_string(command).unwrap()
    );
    for (id, path) in devices {
        text.push_str(&format!(
            "  {id}: {{ path: {path}, keys: [k], enroll_with: {initial} }}\n"
        ));
    }
    text.push_str(FAST_PBKDF);
    text
}

/// The example helper's `meta.json` of `key` under `<root>/keys`, read directly.
fn stored_meta(root: &Path, key: &str) -> serde_json::Value {
    let bytes = std::fs::read(root.join("keys").join(key).join("meta.json")).expect("meta.json");
    serde_json::from_slice(&bytes).expect("meta.json is JSON")
}

/// The state of `version` in `meta`.
fn state_of(meta: &serde_json::Value, version: u64) -> String {
    meta["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["version"] == version)
        .map(|v| v["state"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

/// A script that logs its argv and environment to `log`, then runs its arguments (the real
/// helper), passing the request through.
fn spy(dir: &Path, log: &Path) -> PathBuf {
    write_script(
        dir,
        "spy",
        &format!(
            "#!/bin/sh\n{{ echo \"ARGV: $0 $*\"; env; }} >> '{}'\nexec \"$@\"\n",
            log.display()
        ),
    )
}

#[test]
fn cli_enroll_rotate_retire_with_the_example_helper() {
    if !python_available("cli_enroll_rotate_retire_with_the_example_helper") {
        return;
    }
    let started = Instant::now();
    let w = Watched::new();
    let root = w.s.dir.path().to_path_buf();
    // The plan lives in `conf/`; keyplan runs in the scratch root, so the relative program
    // path `./spy` only works if it is resolved against the plan file's directory.
    let conf = root.join("conf");
    std::fs::create_dir(&conf).unwrap();
    w.s.initial_pass();
    let log = conf.join("helper-argv-env.log");
    spy(&conf, &log);
    let devs = [
        w.s.small_image("conf/d1.img", "luks2"),
        w.s.small_image("conf/d2.img", "luks2"),
        w.s.small_image("conf/d3.img", "luks1"),
    ];
    let mut command = vec!["./spy".to_string()];
    command.extend(helper_argv(&root.join("keys")));
    std::fs::write(
        conf.join("keyplan.yaml"),
        exec_plan(
            &command,
            &[("d1", "d1.img"), ("d2", "d2.img"), ("d3", "d3.img")],
            "../initial.pass",
        ),
    )
    .unwrap();
    let f = ["-f", "conf/keyplan.yaml"];
    let with = |args: &[&'static str]| -> Vec<&'static str> {
        let mut v = args.to_vec();
        v.extend_from_slice(&["-f", "conf/keyplan.yaml"]);
        v
    };

    // plan writes nothing, in the helper's directory either.
    w.ok(&with(&["plan", "--detailed-exitcode"]), 2);
    assert!(!root.join("keys").exists());

    // Enroll: v1 is current in the helper's store and opens every device.
    let out = w.ok(&with(&["apply", "--auto-approve"]), 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let meta = stored_meta(&root, "k");
    assert_eq!(meta["current"], 1, "{meta}");
    assert!(meta["pending"].is_null(), "{meta}");
    let (v1, pending) = file_kms_state(&root, "k");
    let v1 = v1.expect("v1 in the helper's store");
    assert!(!pending);
    assert_eq!(v1.len(), 44, "32 random bytes as base64");
    for d in &devs {
        assert!(opens(d, &v1, None), "v1 opens {}", d.display());
    }

    // Rotate: v2 current, v1 kept as previous, and only v2 opens the devices.
    let out = w.ok(&with(&["apply", "--auto-approve", "--rotate", "k"]), 0);
    assert!(out.contains("Apply complete!"), "{out}");
    let meta = stored_meta(&root, "k");
    assert_eq!(meta["current"], 2, "{meta}");
    assert_eq!(state_of(&meta, 1), "previous", "{meta}");
    let v2 = file_kms_state(&root, "k").0.expect("v2");
    assert_ne!(v1, v2);
    for d in &devs {
        assert!(opens(d, &v2, None), "v2 opens {}", d.display());
        assert!(!opens(d, &v1, None), "v1 still opens {}", d.display());
    }

    // Rotate again: v1 is retired in the store (state and material), v2 is previous.
    w.ok(&with(&["apply", "--auto-approve", "--rotate", "k"]), 0);
    let meta = stored_meta(&root, "k");
    assert_eq!(meta["current"], 3, "{meta}");
    assert_eq!(state_of(&meta, 1), "retired", "{meta}");
    assert_eq!(state_of(&meta, 2), "previous", "{meta}");
    assert!(
        !root.join("keys/k/v1.key").exists(),
        "v1's material destroyed"
    );
    let v3 = file_kms_state(&root, "k").0.expect("v3");
    for d in &devs {
        assert!(opens(d, &v3, None), "v3 opens {}", d.display());
        assert!(!opens(d, &v1, None), "v1 still opens {}", d.display());
        assert!(!opens(d, &v2, None), "v2 still opens {}", d.display());
    }

    // Converged; `key get` prints the current passphrase (stdout is a pipe, not a TTY).
    w.ok(&with(&["plan", "--detailed-exitcode"]), 0);
    // (Not recorded for the leak scan: printing the passphrase is its purpose.)
    let out = w
        .command(&["key", "get", "k", f[0], f[1]])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, v3);

    // The helper ran through the spy, never with material in argv or environment; the leak
    // scan covers the spy's log, keyplan's trace logs, cryptsetup's argv/env and all files.
    let seen = std::fs::read(&log).unwrap();
    let ran = format!("ARGV: {}", conf.join("spy").display());
    assert!(contains(&seen, ran.as_bytes()), "the spy saw no helper run");
    assert!(w.wrapper_saw_calls());
    w.assert_no_leaks();
    eprintln!(
        "cli_enroll_rotate_retire_with_the_example_helper: {:?}",
        started.elapsed()
    );
}

/// A scratch dir with two LUKS2 devices enrolled through the example helper (v1 current).
/// Returns the scratch, the device paths and the helper's command line as a plan would have it.
fn enrolled(helper_script: Option<&str>) -> (Scratch, Vec<PathBuf>) {
    let s = Scratch::new();
    s.initial_pass();
    let devs = vec![
        s.small_image("d1.img", "luks2"),
        s.small_image("d2.img", "luks2"),
    ];
    let helper = helper_argv(&s.path("keys"))
        .iter()
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    // The wrapper every plan of these tests runs: `./helper`, by default the example helper.
    let body = helper_script.map_or_else(
        || format!("#!/bin/sh\nexec {helper}\n"),
        |b| b.replace("HELPER", &helper),
    );
    write_script(s.dir.path(), "helper", &body);
    s.plan(
        "keyplan.yaml",
        &exec_plan(
            &["./helper".to_string()],
            &[("d1", "d1.img"), ("d2", "d2.img")],
            "initial.pass",
        ),
    );
    s.ok(&["apply", "--auto-approve"], 0);
    let v1 = file_kms_state(s.dir.path(), "k").0.expect("v1");
    for d in &devs {
        assert!(opens(d, &v1, None));
    }
    (s, devs)
}

/// Runs keyplan in `s` with extra environment variables.
fn keyplan_env(s: &Scratch, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = assert_cmd::Command::from_std(keyplan_command());
    cmd.current_dir(s.dir.path())
        .env("NO_COLOR", "1")
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn cli_unreachable_or_denied_kms_changes_nothing() {
    if !python_available("cli_unreachable_or_denied_kms_changes_nothing") {
        return;
    }
    let (s, devs) = enrolled(None);
    // (The state lock file records its holder, so the journal stands for the state dir.)
    let watch: Vec<PathBuf> = devs
        .iter()
        .cloned()
        .chain([s.path("keys"), s.path(".keyplan/journal.jsonl")])
        .collect();
    let snap = Snapshot::take(&watch);

    // The KMS behind the helper is down: the helper says so on stderr and exits 1.
    write_script(
        s.dir.path(),
        "helper",
        "#!/bin/sh\ncat >/dev/null\necho 'dial tcp 10.0.0.7:443: connect: connection refused' >&2\nexit 1\n",
    );
    let out = s.ok(&["apply", "--auto-approve", "--rotate", "k"], 1);
    assert!(out.contains("is unavailable"), "{out}");
    assert!(out.contains("connection refused"), "{out}");
    assert!(
        out.contains(&format!(
            "exec KMS \"custom\" ({})",
            s.path("helper").display()
        )),
        "names the command: {out}"
    );
    snap.assert_unchanged("apply with an unavailable helper");

    // The helper answers `denied`.
    write_script(
        s.dir.path(),
        "helper",
        "#!/bin/sh\ncat >/dev/null\necho '{\"protocol_version\":1,\"ok\":false,\"error\":{\"kind\":\"denied\",\"message\":\"role keyplan may not read k\"}}'\n",
    );
    // `plan` could not check (exit 3), `apply` could not run (exit 1).
    for (args, code) in [
        (&["plan"][..], 3),
        (&["apply", "--auto-approve", "--rotate", "k"][..], 1),
    ] {
        let out = s.ok(args, code);
        assert!(out.contains("refused"), "{out}");
        assert!(out.contains("role keyplan may not read k"), "{out}");
    }
    snap.assert_unchanged("commands with a denying helper");

    // An unusable timeout setting is a configuration error before anything runs.
    let (code, out) = keyplan_env(&s, &["plan"], &[("KEYPLAN_EXEC_TIMEOUT_SECS", "soon")]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("KEYPLAN_EXEC_TIMEOUT_SECS"), "{out}");
    snap.assert_unchanged("plan with a bad timeout");

    // A helper that cannot be started is a configuration error, not an outage: `plan` and
    // `status` exit 1 (a problem to fix), not 3 ("could not check"), as docs/kms/exec.md §5
    // says.
    std::fs::remove_file(s.path("helper")).unwrap();
    for args in [&["plan"][..], &["status"][..]] {
        let out = s.ok(args, 1);
        assert!(out.contains("cannot start the helper"), "{args:?}: {out}");
    }
    snap.assert_unchanged("commands with a missing helper");
}

#[test]
fn cli_hung_stage_times_out_then_apply_converges() {
    if !python_available("cli_hung_stage_times_out_then_apply_converges") {
        return;
    }
    // The wrapper hangs on `stage` while the file HANG exists; the request stays in a shell
    // variable (memory) and reaches the real helper through a pipe from the `printf` builtin.
    let (s, devs) = enrolled(Some(
        "#!/bin/sh\nreq=$(cat)\ncase \"$req\" in *'\"operation\":\"stage\"'*) [ -e HANG ] && sleep 60;; esac\nprintf '%s' \"$req\" | exec HELPER\n",
    ));
    let v1 = file_kms_state(s.dir.path(), "k").0.unwrap();
    std::fs::write(s.path("HANG"), b"").unwrap();
    let snap = Snapshot::take(&[devs[0].clone(), devs[1].clone(), s.path("keys")]);
    let started = Instant::now();
    let (code, out) = keyplan_env(
        &s,
        &["apply", "--auto-approve", "--rotate", "k"],
        &[("KEYPLAN_EXEC_TIMEOUT_SECS", "1")],
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("no answer within 1 s"), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    snap.assert_unchanged("apply whose stage timed out");
    for d in &devs {
        assert!(opens(d, &v1, None));
    }

    // The KMS answers again: the failed run is not resumed (nothing was staged), and the
    // rotation asked for again goes through and converges.
    std::fs::remove_file(s.path("HANG")).unwrap();
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let meta = stored_meta(s.dir.path(), "k");
    assert_eq!(meta["current"], 2, "{meta}");
    let v2 = file_kms_state(s.dir.path(), "k").0.unwrap();
    for d in &devs {
        assert!(opens(d, &v2, None));
        assert!(!opens(d, &v1, None));
    }
    s.ok(&["plan", "--detailed-exitcode"], 0);
}

/// A helper whose optional `credentials` lookup never answers: the lookup times out, and the
/// rotation goes on (the store's other operations are still asked); `status` reads the key
/// and says it could not look at the credentials (not checked, exit 3).
#[test]
fn cli_a_hung_credentials_lookup_does_not_stop_a_rotation() {
    if !python_available("cli_a_hung_credentials_lookup_does_not_stop_a_rotation") {
        return;
    }
    let (s, devs) = enrolled(Some(
        "#!/bin/sh\nreq=$(cat)\ncase \"$req\" in *'\"operation\":\"credentials\"'*) [ -e HANG ] && sleep 60;; esac\nprintf '%s' \"$req\" | exec HELPER\n",
    ));
    let v1 = file_kms_state(s.dir.path(), "k").0.unwrap();
    std::fs::write(s.path("HANG"), b"").unwrap();
    // Long enough for every other helper run on a loaded machine (up to 1.4 s seen).
    let timeout = [("KEYPLAN_EXEC_TIMEOUT_SECS", "10")];
    let (code, out) = keyplan_env(&s, &["apply", "--auto-approve", "--rotate", "k"], &timeout);
    assert_eq!(code, Some(0), "{out}");
    let meta = stored_meta(s.dir.path(), "k");
    assert_eq!(meta["current"], 2, "{meta}");
    let v2 = file_kms_state(s.dir.path(), "k").0.unwrap();
    for d in &devs {
        assert!(opens(d, &v2, None));
        assert!(!opens(d, &v1, None));
    }
    let (code, out) = keyplan_env(&s, &["status"], &timeout);
    assert!(out.contains("cannot look at them"), "{out}");
    assert!(out.contains("no answer within 10 s"), "{out}");
    // Not a problem, but not checked either (docs/monitoring.md: a KMS that does not answer
    // within its `timeout` is "not checked", exit 3).
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains("current  v2"), "{out}");
}

#[test]
fn cli_concurrent_writer_between_stage_and_commit_is_a_conflict() {
    if !python_available("cli_concurrent_writer_between_stage_and_commit_is_a_conflict") {
        return;
    }
    use base64::Engine as _;
    let rival = b"rival-writer-passphrase-0000";
    let rival_b64 = base64::engine::general_purpose::STANDARD.encode(rival);
    // Once armed, the first `commit` keyplan sends is preceded by a rival writer that commits
    // keyplan's pending v2 and then rotates to its own v3 (straight through the helper).
    let wrapper = format!(
        "#!/bin/sh\nreq=$(cat)\ncase \"$req\" in *'\"operation\":\"commit\"'*)\n  if [ -e ARMED ] && [ ! -e RIVAL_DONE ]; then\n    : > RIVAL_DONE\n    \
         printf '%s' '{{\"protocol_version\":1,\"operation\":\"commit\",\"kms\":\"rival\",\"key\":\"k\",\"expected_current\":1,\"pending\":2}}' | HELPER >/dev/null\n    \
         printf '%s' '{{\"protocol_version\":1,\"operation\":\"stage\",\"kms\":\"rival\",\"key\":\"k\",\"material_base64\":\"{rival_b64}\",\"at_least\":0}}' | HELPER >/dev/null\n    \
         printf '%s' '{{\"protocol_version\":1,\"operation\":\"commit\",\"kms\":\"rival\",\"key\":\"k\",\"expected_current\":2,\"pending\":3}}' | HELPER >/dev/null\n  fi;;\nesac\nprintf '%s' \"$req\" | exec HELPER\n"
    );
    let (s, devs) = enrolled(Some(&wrapper));
    let v1 = file_kms_state(s.dir.path(), "k").0.unwrap();
    std::fs::write(s.path("ARMED"), b"").unwrap();

    let out = s.ok(&["apply", "--auto-approve", "--rotate", "k"], 1);
    assert!(s.path("RIVAL_DONE").exists(), "the rival never ran: {out}");
    assert!(out.contains("changed concurrently"), "{out}");
    assert!(out.contains("nothing was overwritten"), "{out}");

    // The rival's version stands, untouched; keyplan's v1 keyslots were not killed.
    let meta = stored_meta(s.dir.path(), "k");
    assert_eq!(meta["current"], 3, "{meta}");
    assert!(meta["pending"].is_null(), "{meta}");
    assert_eq!(file_kms_state(s.dir.path(), "k").0.unwrap(), rival.to_vec());
    for d in &devs {
        assert!(
            opens(d, &v1, None),
            "v1 keyslot of {} was killed",
            d.display()
        );
    }
}

#[test]
fn plan_resolves_a_relative_helper_program_against_the_plan_file() {
    use keyplan::spec::{load_str, Format, KmsConfig};
    let command = |program: &str| -> Vec<String> {
        let text = format!(
            "version: 1\nkms:\n  custom: {{ provider: exec, command: [{program}, ./arg, x] }}\nkeys:\n  k: {{ kms: custom }}\n"
        );
        let plan = load_str(&text, "plan.yaml", Format::Yaml, Path::new("/plans"))
            .unwrap_or_else(|e| panic!("{e:?}"));
        match &plan.kms["custom"] {
            KmsConfig::Exec { command, .. } => command.clone(),
            other => panic!("{other:?}"),
        }
    };
    // A path is relative to the plan's directory; a bare name is left for the PATH lookup;
    // arguments are passed unchanged.
    assert_eq!(command("./bin/helper"), ["/plans/bin/helper", "./arg", "x"]);
    assert_eq!(command("bin/helper"), ["/plans/bin/helper", "./arg", "x"]);
    assert_eq!(command("my-helper"), ["my-helper", "./arg", "x"]);
    assert_eq!(
        command("/usr/bin/helper"),
        ["/usr/bin/helper", "./arg", "x"]
    );
}

/// A plan whose three keys are held by an exec helper that never answers (it sleeps without
/// reading its request), one of them enrolled on a LUKS2 image; `extra` is added to the KMS
/// (e.g. `, timeout: 1s`).
fn silent_helper_plan(s: &Scratch, extra: &str) {
    s.initial_pass();
    s.small_image("a.img", "luks2");
    let helper = write_script(s.dir.path(), "silent-helper", "#!/bin/sh\nexec sleep 60\n");
    s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  custom: {{ provider: exec, command: [{}]{extra} }}\nkeys:\n  a: {{ kms: custom }}\n  b: {{ kms: custom }}\n  c: {{ kms: custom }}\ndevices:\n  d: {{ path: a.img, keys: [a], enroll_with: initial.pass }}\n{FAST_PBKDF}",
            helper.display()
        ),
    );
}

/// An exec helper that never answers (issue 29), its limit from `KEYPLAN_EXEC_TIMEOUT_SECS`
/// (1 s): `status` ends within about one limit with exit 3 naming the KMS and the deadline,
/// `plan` and `verify` with exit 3 and an error naming both. Before issue 29 each key's read
/// ran the helper four times (retries) and `status` read every key twice: about 30 s here,
/// and 370 s with the default limit and a network KMS.
#[test]
fn an_exec_helper_that_never_answers_is_bounded() {
    let s = Scratch::new();
    silent_helper_plan(&s, "");
    assert_silent_kms_bounded(
        s.dir.path(),
        &[("KEYPLAN_EXEC_TIMEOUT_SECS", "1")],
        r#"exec KMS "custom""#,
        1,
        Duration::from_secs(8),
    );
    // `timeout` in the plan sets the limit too, and wins over the variable.
    let s = Scratch::new();
    silent_helper_plan(&s, ", timeout: 2s");
    assert_silent_kms_bounded(
        s.dir.path(),
        &[("KEYPLAN_EXEC_TIMEOUT_SECS", "60")],
        r#"exec KMS "custom""#,
        2,
        Duration::from_secs(10),
    );
}

/// A hostile `exec` helper (Python) in front of the example helper: it remembers, per keyplan
/// process (its parent), every material that process sent it (`stage`) or got from it
/// (`get`), in `<state>/seen-<pid>`, and fails the operations `<state>/FAIL` names, echoing
/// every material it remembers for that process in every form (raw, standard and URL-safe
/// base64 with and without padding, hex in both cases, and for base64 material the bytes it
/// encodes as hex, spaced and colon-separated hex, and URL-safe base64), either in its error message
/// (`op:message:N`: a `denied` answer) or on standard error with exit code 1
/// (`op:stderr:N`), from the process's N+1st call of `op` on. Otherwise it passes the
/// request to the real helper.
const HOSTILE: &str = r#"
import base64, json, os, subprocess, sys

def forms(m):
    b = base64.b64encode(m).decode()
    u = base64.urlsafe_b64encode(m).decode()
    return "raw=%s std=%s std_nopad=%s url=%s url_nopad=%s hex=%s HEX=%s" % (
        m.decode("utf-8", "replace"), b, b.rstrip("="), u, u.rstrip("="), m.hex(), m.hex().upper()) + decoded_forms(m)

def decoded_forms(m):
    # A generated passphrase is base64 of random bytes: a helper that decodes it may quote
    # the bytes (hex plain, spaced, colon-separated; base64 in the other alphabet).
    try:
        d = base64.b64decode(m, validate=True)
    except Exception:
        return ""
    if len(d) < 4:
        return ""
    return " dhex=%s dspaced=%s dcolon=%s durl=%s" % (
        d.hex(), " ".join("%02x" % x for x in d), ":".join("%02X" % x for x in d),
        base64.urlsafe_b64encode(d).decode())

def main():
    state, helper = sys.argv[1], sys.argv[2:]
    os.makedirs(state, exist_ok=True)
    request = sys.stdin.buffer.read()
    op = json.loads(request).get("operation")
    me = os.getppid()
    seen_path = os.path.join(state, "seen-%d" % me)
    seen = []
    if os.path.exists(seen_path):
        with open(seen_path) as f:
            seen = [base64.b64decode(l) for l in f.read().split()]
    def remember(material):
        if material not in seen:
            seen.append(material)
            with open(seen_path, "a") as f:
                f.write(base64.b64encode(material).decode() + "\n")
    req = json.loads(request)
    if "material_base64" in req:
        remember(base64.b64decode(req["material_base64"]))
    count_path = os.path.join(state, "count-%d-%s" % (me, op))
    count = 0
    if os.path.exists(count_path):
        with open(count_path) as f:
            count = int(f.read())
    with open(count_path, "w") as f:
        f.write(str(count + 1))
    rule = None
    fail_path = os.path.join(state, "FAIL")
    if os.path.exists(fail_path):
        with open(fail_path) as f:
            for line in f.read().split():
                f_op, style, skip = line.split(":")
                if f_op == op and count >= int(skip):
                    rule = style
    if rule is not None:
        echo = "echo: " + (" | ".join(forms(m) for m in seen) or "nothing seen")
        if rule == "message":
            print(json.dumps({"protocol_version": 1, "ok": False,
                              "error": {"kind": "denied", "message": echo}}))
            return 0
        sys.stderr.write(echo + "\n")
        return 1
    out = subprocess.run(helper, input=request, stdout=subprocess.PIPE).stdout
    if op == "get":
        resp = json.loads(out)
        if resp.get("ok"):
            remember(base64.b64decode(resp["result"]["material_base64"]))
    sys.stdout.buffer.write(out)
    return 0

sys.exit(main())
"#;

/// Issue 29: a helper that echoes material in its errors, in every form keyplan can compute,
/// through `apply` (the stage request's material in the error message; every material of the
/// run on standard error), `plan --verify`, `verify` and `status` (text and JSON), with `-vvv`
/// and with `--log-format json`: no form of any key version (the ones the KMS stores, and
/// the ones it only saw) reaches stdout, stderr, the journal, the state directory or any other
/// file (the leak scan of [`Watched`], whose `leak_forms` covers every form); each echo shows
/// as `<redacted>`.
#[test]
fn cli_echoing_helper_never_leaks_material_in_any_form() {
    if !python_available("cli_echoing_helper_never_leaks_material_in_any_form") {
        return;
    }
    let w = Watched::new();
    let root = w.s.dir.path().to_path_buf();
    w.s.initial_pass();
    w.s.small_image("d1.img", "luks2");
    w.s.small_image("d2.img", "luks2");
    let hostile = write_script(&root, "hostile.py", HOSTILE);
    // The helper's own records live under keys/ (the KMS, which the leak scan leaves out).
    let state = root.join("keys/.hostile");
    let mut command = vec![
        python(),
        hostile.display().to_string(),
        state.display().to_string(),
    ];
    command.extend(helper_argv(&root.join("keys")));
    w.s.plan(
        "keyplan.yaml",
        &exec_plan(
            &command,
            &[("d1", "d1.img"), ("d2", "d2.img")],
            "initial.pass",
        ),
    );
    let fail = |rules: &str| std::fs::write(state.join("FAIL"), rules).unwrap();
    let run = |args: &[&str], code: i32| -> String {
        let out = w.run(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(code), "keyplan {args:?}:\n{text}");
        text
    };
    let all_forms_redacted = |text: &str, what: &str| {
        for label in ["raw", "std", "std_nopad", "url", "url_nopad", "hex", "HEX"] {
            assert!(
                text.contains(&format!(" {label}=<redacted>")),
                "{what}: no {label}=<redacted>:\n{text}"
            );
        }
    };

    run(&["apply", "--auto-approve"], 0);
    let v1 = file_kms_state(&root, "k").0.expect("v1");

    // The stage request's material, echoed in the helper's error message.
    fail("stage:message:0");
    let out = run(&["-vvv", "apply", "--auto-approve", "--rotate", "k"], 1);
    assert!(out.contains("echo: raw=<redacted>"), "{out}");
    all_forms_redacted(&out, "stage");

    // Every material of the run (v1, read to unlock; v2, staged), echoed on standard error
    // when `commit` fails; JSON logs.
    fail("commit:stderr:0");
    let out = run(
        &[
            "-vvv",
            "--log-format",
            "json",
            "apply",
            "--auto-approve",
            "--rotate",
            "k",
        ],
        1,
    );
    assert!(out.contains("standard error ends with"), "{out}");
    assert!(out.contains("HEX=<redacted>"), "{out}");
    fail("");
    run(&["apply", "--auto-approve"], 0);
    let v2 = file_kms_state(&root, "k").0.expect("v2");
    assert_ne!(v1, v2);

    // plan --verify reads the current version of each device's record, then the KMS check
    // (which carries no material) is answered with an echo of it.
    fail("check:message:0");
    let out = run(
        &[
            "-vvv",
            "--log-format",
            "json",
            "plan",
            "--verify",
            "--rotate",
            "k",
        ],
        3,
    );
    all_forms_redacted(&out, "plan --verify");

    // verify: the second `get` is answered with an echo of what the first returned.
    fail("get:message:1");
    // (A `denied` answer: the KMS could not be asked, so verify exits 3.)
    let out = run(&["-vvv", "verify"], 3);
    all_forms_redacted(&out, "verify");
    let out = run(&["--log-format", "json", "verify"], 3);
    all_forms_redacted(&out, "verify, JSON logs");

    // status reads no material, so the helper has nothing of this process to echo; what it
    // says still goes through the same sinks.
    fail("read:message:0");
    for args in [
        &["-vvv", "status"][..],
        &["-vvv", "--log-format", "json", "status", "--format", "json"][..],
    ] {
        let out = w.run(args);
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("echo: nothing seen"), "{text}");
    }

    // The journal recorded the failures, redacted (the runs compacted away are in the audit
    // trail beside it).
    let journal = ["history.jsonl", "journal.jsonl"]
        .iter()
        .map(|f| std::fs::read_to_string(root.join(".keyplan").join(f)).unwrap_or_default())
        .collect::<String>();
    assert!(journal.contains("echo: raw=<redacted>"), "{journal}");
    assert!(journal.contains("HEX=<redacted>"), "{journal}");

    // Every material the helper saw, stored or not (the first rotation's staged version
    // never was), is looked for; the scan covers every output, the journal and every file.
    let mut seen = 0;
    for f in walk(&state) {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("seen-") {
            use base64::Engine as _;
            for line in std::fs::read_to_string(&f).unwrap().split_whitespace() {
                w.add_secret(
                    &base64::engine::general_purpose::STANDARD
                        .decode(line)
                        .unwrap(),
                );
                seen += 1;
            }
        }
    }
    assert!(seen >= 6, "the helper saw only {seen} materials");
    assert!(w.wrapper_saw_calls());
    w.assert_no_leaks();
}

/// A URL argument of the helper's command that holds a user name and password (which helpers
/// should refuse) is never repeated by keyplan: messages name the command with `***`.
#[test]
fn credentials_in_the_helper_command_are_not_quoted() {
    let kms = ExecKms::new(
        "custom",
        vec![
            "/nonexistent/helper".into(),
            "--endpoint".into(),
            "https://alice:hunter2@kms.example:443".into(),
            "--iam=https://bob:s3cret@iam.example".into(),
        ],
        Duration::from_secs(5),
    )
    .expect("exec kms");
    let text = format!("{} {}", kms.describe(), kms.read("k").unwrap_err());
    assert!(text.contains("https://***@kms.example"), "{text}");
    assert!(text.contains("--iam=https://***@iam.example"), "{text}");
    for word in ["hunter2", "alice", "s3cret", "bob"] {
        assert!(!text.contains(word), "{text}");
    }
}

/// A Python wrapper around the example helper with one kill point (issue 46): when the file
/// `KILL_AT` in the working directory (keyplan's) names the operation asked for (`retire` or
/// `destroy_key`), the first `meta.json` that operation writes is written in full, then
/// keyplan (the helper's parent) and the helper are killed with SIGKILL, `KILL_AT` having been
/// removed first (one shot): a power cut right after the helper recorded a retirement or a
/// destruction. Its arguments are the example helper's command line ([`helper_argv`]); it
/// loads the helper as a module and runs its `main` on the request.
const KILL_AFTER_RECORD: &str = r#"
import importlib.machinery, importlib.util, io, json, os, signal, sys

path = sys.argv[2]
sys.argv = [path] + sys.argv[3:]
loader = importlib.machinery.SourceFileLoader("keyplan_kms_dir", path)
helper = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
loader.exec_module(helper)
request = sys.stdin.read()
try:
    op = json.loads(request).get("operation")
except ValueError:
    op = None
armed = False
if os.path.exists("KILL_AT"):
    with open("KILL_AT") as f:
        armed = f.read().strip() == op
if armed:
    real_save = helper.save_meta

    def save_then_die(kdir, meta):
        real_save(kdir, meta)
        os.unlink("KILL_AT")
        os.kill(os.getppid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    helper.save_meta = save_then_die
sys.stdin = io.StringIO(request)
sys.exit(helper.main())
"#;

/// Two LUKS2 devices enrolled through the example helper behind [`KILL_AFTER_RECORD`] (v1
/// current); the scratch's `KILL_AT` arms it.
fn enrolled_killable() -> (Scratch, Vec<PathBuf>, tempfile::TempDir) {
    let tools = tempfile::tempdir().unwrap();
    let killer = write_script(tools.path(), "kill-after-record.py", KILL_AFTER_RECORD);
    let (s, devs) = enrolled(Some(&format!(
        "#!/bin/sh\nexec '{}' '{}' HELPER\n",
        python(),
        killer.display()
    )));
    (s, devs, tools)
}

/// Runs keyplan in `s` with `KILL_AT` naming `op`: the run must be killed by the helper.
fn apply_killed_at(s: &Scratch, args: &[&str], op: &str) {
    std::fs::write(s.path("KILL_AT"), op).unwrap();
    let (code, out) = keyplan_env(s, args, &[]);
    assert!(!s.path("KILL_AT").exists(), "no {op} was asked for: {out}");
    assert_eq!(code, None, "keyplan was not killed: {out}");
}

/// The versions `meta` records as retired whose `.key` file is still in `<root>/keys/<key>`.
fn retired_with_material(root: &Path, key: &str) -> Vec<u64> {
    let meta = stored_meta(root, key);
    meta["versions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["state"] == "retired")
        .map(|v| v["version"].as_u64().unwrap())
        .filter(|v| {
            root.join("keys")
                .join(key)
                .join(format!("v{v}.key"))
                .exists()
        })
        .collect()
}

/// Issue 46: the example helper's `retire` removes the material before `meta.json` says the
/// version is retired. Killed right after that record (keyplan with it), no version recorded
/// retired has a `.key` file; the next `apply` finishes the rotation.
#[test]
fn cli_a_retire_killed_after_its_record_leaves_no_retired_material() {
    if !python_available("cli_a_retire_killed_after_its_record_leaves_no_retired_material") {
        return;
    }
    let (s, devs, _tools) = enrolled_killable();
    let root = s.dir.path();
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    // The second rotation retires v1: killed right after the helper recorded it.
    apply_killed_at(&s, &["apply", "--auto-approve", "--rotate", "k"], "retire");
    assert_eq!(
        retired_with_material(root, "k"),
        Vec::<u64>::new(),
        "{}",
        stored_meta(root, "k")
    );
    s.ok(&["apply", "--auto-approve"], 0);
    let meta = stored_meta(root, "k");
    assert_eq!(meta["current"], 3, "{meta}");
    assert_eq!(state_of(&meta, 1), "retired", "{meta}");
    assert!(!root.join("keys/k/v1.key").exists());
    let v3 = file_kms_state(root, "k").0.expect("v3");
    for d in &devs {
        assert!(opens(d, &v3, None), "{}", d.display());
    }
    s.ok(&["plan", "--detailed-exitcode"], 0);
}

/// Issue 46: a migration out of the example helper's store whose `destroy_key` is killed
/// right after the helper recorded the key destroyed (keyplan with it): the other versions'
/// material is gone already, and the next `apply`, resuming, finishes the destroy (before the
/// fix the helper saw "destroyed already", returned early and left every `.key` file).
#[test]
fn cli_a_destroy_killed_after_its_record_is_finished_by_the_next_apply() {
    if !python_available("cli_a_destroy_killed_after_its_record_is_finished_by_the_next_apply") {
        return;
    }
    let (s, devs, _tools) = enrolled_killable();
    let root = s.dir.path();
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let material = file_kms_state(root, "k").0.expect("v2");
    assert_eq!(state_of(&stored_meta(root, "k"), 1), "previous");
    // The key moves to a file KMS (`filekms/`): the helper's store is destroyed.
    let plan = exec_plan(
        &["./helper".to_string()],
        &[("d1", "d1.img"), ("d2", "d2.img")],
        "initial.pass",
    )
    .replacen(
        "keys:\n",
        "  local:\n    provider: file\n    path: filekms\nkeys:\n",
        1,
    )
    .replacen("k: { kms: custom }", "k: { kms: local }", 1);
    s.plan("keyplan.yaml", &plan);
    apply_killed_at(&s, &["apply", "--auto-approve"], "destroy_key");
    let meta = stored_meta(root, "k");
    assert!(meta["current"].is_null(), "{meta}");
    assert!(
        !root.join("keys/k/v1.key").exists(),
        "v1, not current, was removed before the record: {meta}"
    );

    s.ok(&["apply", "--auto-approve"], 0);
    let left: Vec<_> = walk(&root.join("keys/k"))
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "key"))
        .collect();
    assert!(
        left.is_empty(),
        "material left in the helper's store: {left:?}"
    );
    let meta = stored_meta(root, "k");
    assert!(meta["current"].is_null(), "{meta}");
    assert!(meta["pending"].is_null(), "{meta}");
    for v in [1, 2] {
        assert_eq!(state_of(&meta, v), "retired", "{meta}");
    }
    let moved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("filekms/k/meta.json")).unwrap()).unwrap();
    let moved = std::fs::read(root.join(format!(
        "filekms/k/v{}.key",
        moved["current"].as_u64().expect("current in the file KMS")
    )))
    .unwrap();
    assert_eq!(moved, material);
    for d in &devs {
        assert!(opens(d, &material, None), "{}", d.display());
    }
    s.ok(&["plan", "--detailed-exitcode"], 0);
}

/// `lingering` (docs/kms/exec.md): the versions a helper reports become keyplan's, sorted
/// and without duplicates; a helper that does not know the operation (`config`) cannot tell
/// (none); more than the protocol allows is an error.
#[test]
fn helper_lingering_answers() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ok = |result: &str| format!(r#"{{"protocol_version":1,"ok":true,"result":{result}}}"#);
    let kms = answering(d, "reports", &ok(r#"{"versions":[3,1,3]}"#));
    assert_eq!(kms.lingering("k").expect("lingering"), [1, 3]);
    let kms = answering(d, "none", &ok(r#"{"versions":[]}"#));
    assert!(kms.lingering("k").expect("lingering").is_empty());
    let kms = answering(
        d,
        "older",
        r#"{"protocol_version":1,"ok":false,"error":{"kind":"config","message":"unknown operation 'lingering'"}}"#,
    );
    assert!(kms.lingering("k").expect("lingering").is_empty());
    let many: Vec<String> = (0..=keyplan::kms::exec::MAX_LINGERING)
        .map(|v| v.to_string())
        .collect();
    let kms = answering(
        d,
        "many",
        &ok(&format!(r#"{{"versions":[{}]}}"#, many.join(","))),
    );
    match kms.lingering("k") {
        Err(KmsError::Unavailable { detail, .. }) => {
            assert!(detail.contains("at most"), "{detail}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// Issue 46: material of a retired version restored by hand in the example helper's store is
/// reported by `keyplan status` as a problem (exit 1) naming the version (before: the exec
/// protocol had no way to tell, and `status` exited 0); once it is removed, `status` is clean.
#[test]
fn cli_status_reports_retired_material_the_example_helper_still_holds() {
    if !python_available("cli_status_reports_retired_material_the_example_helper_still_holds") {
        return;
    }
    let (s, _devs) = enrolled(None);
    let root = s.dir.path();
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    assert_eq!(state_of(&stored_meta(root, "k"), 1), "retired");
    s.ok(&["status"], 0);
    let restored = root.join("keys/k/v1.key");
    std::fs::write(&restored, b"bytes-from-the-backup-tape").unwrap();
    let (code, out) = keyplan_env(&s, &["status"], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("KMS custom records v1"), "{out}");
    assert!(out.contains("retired"), "{out}");
    assert!(!out.contains("backup-tape"), "{out}");
    std::fs::remove_file(&restored).unwrap();
    s.ok(&["status"], 0);
}
