//! The `aws_secrets_manager` provider against a real moto server (started by each test on a
//! free loopback port, see `common/moto.rs`): the provider contract, and the keyplan binary
//! end to end, judged by cryptsetup and by boto3 reading the server.

use crate::common::kms_contract;
use crate::common::moto::Moto;

use keyplan::kms::Kms;
use keyplan::spec::KmsConfig;

/// The AWS SDK reads static credentials from the environment; moto accepts any. Set once,
/// before the first client is built (only these tests read the AWS variables).
fn test_credentials() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
            std::env::set_var("AWS_ACCESS_KEY_ID", "test");
            std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
        }
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    });
}

fn open(server: &Moto, prefix: &str) -> Box<dyn Kms> {
    test_credentials();
    let config = KmsConfig::AwsSecretsManager {
        region: "us-east-1".into(),
        endpoint: Some(server.endpoint()),
        prefix: Some(prefix.into()),
        timeout: None,
    };
    keyplan::kms::aws::open("aws", &config).expect("open aws KMS")
}

#[test]
fn provider_contract() {
    let Some(server) = Moto::start() else {
        return;
    };
    let (kms, other) = (open(&server, "keyplan/"), open(&server, "keyplan/"));
    kms_contract::run(kms.as_ref(), other.as_ref(), "contract");
    // What any Secrets Manager reader sees: the current version under AWSCURRENT, keyplan's
    // versions labelled, the staged one gone once committed.
    let a = server
        .get("keyplan/contract-a", None)
        .expect("contract-a exists");
    let st = kms.read("contract-a").expect("read");
    let cur = st.current.expect("current");
    assert_eq!(
        kms.get("contract-a", cur).expect("get").expose(),
        a.as_bytes()
    );
    let versions = server.versions("keyplan/contract-a");
    let current: Vec<_> = versions
        .iter()
        .filter(|(_, l)| l.iter().any(|x| x == "AWSCURRENT"))
        .collect();
    assert_eq!(current.len(), 1, "{versions:?}");
    assert!(
        current[0].1.contains(&format!("keyplan-v{cur}")),
        "{versions:?}"
    );
    assert!(
        !versions
            .iter()
            .any(|(_, l)| l.iter().any(|x| x == "AWSPENDING")),
        "{versions:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The keyplan binary end to end.

use crate::common::*;
use std::path::PathBuf;

/// The passphrase a Rook-style deployment stored before keyplan: the secret's plain value.
const ROOK: &str = "rook-made-passphrase-0123456789abcdef";

/// A plan with key `osd-kek` (`rook/osd-kek` in Secrets Manager) on two LUKS2 devices and a
/// LUKS1 one.
fn aws_plan(server: &Moto) -> String {
    format!(
        "version: 1\nkms:\n{}keys:\n  osd-kek: {{ kms: aws, name: rook/osd-kek }}\ndevices:\n  block: {{ path: block.img, keys: [osd-kek] }}\n  db: {{ path: db.img, keys: [osd-kek] }}\n  legacy: {{ path: legacy.img, keys: [osd-kek] }}\n{FAST_PBKDF}",
        server.kms_yaml("aws", "")
    )
}

/// Runs keyplan (watched) against `server`; asserts the exit code; stdout and stderr.
fn kp_out(w: &Watched, server: &Moto, args: &[&str], code: i32) -> (String, String) {
    let mut cmd = w.command(args);
    for (k, v) in server.env() {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run keyplan");
    w.record(&out);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert_eq!(
        out.status.code(),
        Some(code),
        "keyplan {args:?}:\n{stdout}{stderr}"
    );
    (stdout, stderr)
}

/// [`kp_out`], both streams in one text.
fn kp(w: &Watched, server: &Moto, args: &[&str], code: i32) -> String {
    let (o, e) = kp_out(w, server, args, code);
    format!("{o}{e}")
}

/// The labels of each version of `rook/osd-kek`, by version id.
fn labels(server: &Moto) -> Vec<(String, Vec<String>)> {
    server.versions("rook/osd-kek")
}

#[test]
fn rook_style_adoption_then_rotation_with_any_reader() {
    let Some(server) = Moto::start() else {
        return;
    };
    let w = Watched::new();
    w.add_secret(ROOK.as_bytes());
    server.put("rook/osd-kek", ROOK);
    let devs = rook_devices(&w.s, ROOK.as_bytes());
    w.s.plan("keyplan.yaml", &aws_plan(&server));

    // Adoption: the secret's value opens every device; keyplan records it there (tokens) and
    // changes no keyslot; the secret gets keyplan's label and record.
    let out = kp(&w, &server, &["plan"], 0);
    assert!(!out.contains("+ key osd-kek"), "no new key: {out}");
    let out = kp(&w, &server, &["apply", "--auto-approve"], 0);
    assert!(out.contains("Apply complete!"), "{out}");
    assert_eq!(server.get("rook/osd-kek", None).as_deref(), Some(ROOK));
    for d in &devs {
        assert!(opens(d, ROOK.as_bytes(), None), "{}", d.display());
    }
    let (st, _) = kp_out(&w, &server, &["status", "--format", "json"], 0);
    let j: serde_json::Value = serde_json::from_str(&st).expect("status json");
    assert_eq!(j["keys"][0]["current"]["version"], 1, "{j}");
    assert_eq!(
        j["kms"][0]["credentials"][0]["kind"], "aws_credentials",
        "{j}"
    );

    // Rotation: v2 goes in as AWSPENDING, is added to every device and verified, then
    // AWSCURRENT moves to it; every Secrets Manager reader now gets v2, and the old
    // passphrase opens nothing once retired.
    let out = kp(
        &w,
        &server,
        &["apply", "--auto-approve", "--rotate", "osd-kek"],
        0,
    );
    assert!(out.contains("Apply complete!"), "{out}");
    let v2 = server.get("rook/osd-kek", None).expect("current");
    w.add_secret(v2.as_bytes());
    assert_ne!(v2, ROOK);
    for d in &devs {
        assert!(opens(d, v2.as_bytes(), None), "v2 opens {}", d.display());
    }
    let l = labels(&server);
    let current: Vec<_> = l
        .iter()
        .filter(|(_, x)| x.iter().any(|s| s == "AWSCURRENT"))
        .collect();
    assert_eq!(current.len(), 1, "{l:?}");
    assert_eq!(
        current[0].0, "keyplan-version-00000000000000000002",
        "{l:?}"
    );
    assert!(current[0].1.contains(&"keyplan-v2".to_string()), "{l:?}");
    assert!(
        !l.iter().any(|(_, x)| x.iter().any(|s| s == "AWSPENDING")),
        "{l:?}"
    );

    // A second rotation retires the adopted version: no label keeps it, and the passphrase
    // Rook made opens no device any more.
    kp(
        &w,
        &server,
        &["apply", "--auto-approve", "--rotate", "osd-kek"],
        0,
    );
    let v3 = server.get("rook/osd-kek", None).expect("current");
    w.add_secret(v3.as_bytes());
    for d in &devs {
        assert!(opens(d, v3.as_bytes(), None), "v3 opens {}", d.display());
        assert!(
            !opens(d, ROOK.as_bytes(), None),
            "the adopted passphrase opens {}",
            d.display()
        );
    }
    let l = labels(&server);
    let adopted: Vec<_> = l
        .iter()
        .filter(|(id, _)| !id.starts_with("keyplan-version-"))
        .collect();
    assert!(
        adopted.iter().all(|(_, x)| x
            .iter()
            .all(|s| !s.starts_with("keyplan-v") && s != "AWSCURRENT")),
        "the adopted version keeps a keyplan label: {l:?}"
    );
    let out = kp(&w, &server, &["plan", "--detailed-exitcode"], 0);
    assert!(out.contains("No changes"), "{out}");
    // A retire cut short after keyplan's record said "retired" (the labels come off after,
    // `keyplan-v<N>` last): the version is still labelled, so it reads as previous, not
    // retired, and the next rotation (which retires every older previous version) takes the
    // label off.
    let adopted_vid = adopted[0].0.clone();
    server.label("rook/osd-kek", "keyplan-v1", &adopted_vid);
    // (`key get` prints the material by design: its output is not watched for leaks.)
    let mut get = w.command(&["key", "get", "osd-kek", "--version", "1"]);
    get.envs(server.env());
    let got = get.output().expect("run keyplan");
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert_eq!(
        got.stdout,
        ROOK.as_bytes(),
        "a version still labelled is served, as previous"
    );
    kp(
        &w,
        &server,
        &["apply", "--auto-approve", "--rotate", "osd-kek"],
        0,
    );
    let v4 = server.get("rook/osd-kek", None).expect("current");
    w.add_secret(v4.as_bytes());
    let l = labels(&server);
    assert!(
        l.iter().any(|(id, x)| *id == adopted_vid && x.is_empty()),
        "keyplan-v1 is off again: {l:?}"
    );
    let out = kp(&w, &server, &["plan", "--detailed-exitcode"], 0);
    assert!(out.contains("No changes"), "{out}");
    // The retired version's value is still in Secrets Manager (deprecated, readable by
    // version id until AWS deletes it): keyplan does not serve it, and says so truthfully.
    let (got, err) = kp_out(&w, &server, &["key", "get", "osd-kek", "--version", "1"], 1);
    assert!(got.is_empty(), "material printed for a retired version");
    assert!(err.contains("v1 was retired"), "{err}");
    assert!(
        err.contains("Secrets Manager deletes such a deprecated version"),
        "{err}"
    );
    assert!(!err.contains("destroyed"), "{err}");
    w.assert_no_leaks();
}

/// Names and settings Secrets Manager cannot use are refused by `validate`, before any
/// request: a key name that is another key's record secret, a name with a character secret
/// names may not hold, a mistyped region, an endpoint with a path and credentials (which are
/// never printed).
#[test]
fn unusable_names_and_settings_are_refused_by_validate() {
    let w = Watched::new();
    w.s.plan(
        "keyplan.yaml",
        "version: 1\nkms:\n  aws:\n    provider: aws_secrets_manager\n    region: us-east1\n    endpoint: http://alice:hunter2@127.0.0.1:1/v1\n    prefix: rook/\nkeys:\n  a: { kms: aws, name: osd }\n  b: { kms: aws, name: osd.keyplan }\n  c: { kms: aws, name: osd kek }\ndevices:\n  d: { path: d.img, keys: [a] }\n",
    );
    let out = w.command(&["validate"]).output().expect("run keyplan");
    w.record(&out);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("region \"us-east1\" is not an AWS region code"),
        "{text}"
    );
    assert!(text.contains("holds a user name or password"), "{text}");
    assert!(text.contains("\"http://***@127.0.0.1:1/v1\""), "{text}");
    // The diagnostic quotes the plan file's own line (the user's file, as written); what
    // keyplan says about it never repeats the credentials.
    for line in text.lines().filter(|l| !l.contains(" | ")) {
        assert!(
            !line.contains("hunter2") && !line.contains("alice"),
            "{line}"
        );
    }
    assert!(
        text.contains("it is the record of the secret \"rook/osd\" (the key named \"osd\""),
        "{text}"
    );
    assert!(text.contains("the name contains ' '"), "{text}");

    // Two instances on one region and endpoint whose prefixes make one secret name for two
    // keys, or a key's secret another key's record: refused too.
    let two = |prefix_b: &str, name_b: &str| {
        format!(
            "version: 1\nkms:\n  a:\n    provider: aws_secrets_manager\n    region: us-east-1\n    prefix: prod/\n  b:\n    provider: aws_secrets_manager\n    region: us-east-1\n    prefix: {prefix_b:?}\nkeys:\n  k1: {{ kms: a, name: osd-kek }}\n  k2: {{ kms: b, name: {name_b:?} }}\ndevices:\n  d: {{ path: d.img, keys: [k1, k2] }}\n"
        )
    };
    for (plan, says) in [
        (
            two("prod/osd-kek.", "keyplan"),
            "it is the record of the secret \"prod/osd-kek\"",
        ),
        (two("prod/osd", "-kek"), "the secret \"prod/osd-kek\""),
    ] {
        w.s.plan("keyplan.yaml", &plan);
        let out = w.command(&["validate"]).output().expect("run keyplan");
        w.record(&out);
        let text = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "{text}");
        assert!(text.contains(says), "{text}");
    }
    w.assert_no_leaks();
}

/// No credentials anywhere in the SDK's chain: `plan` says the KMS refused and which
/// variables to set (exit 3, like any KMS that could not be asked), not that it is
/// unreachable; `apply` changes no keyslot.
#[test]
fn no_credentials_in_the_chain_is_refused_not_unavailable() {
    let Some(server) = Moto::start() else {
        return;
    };
    let w = Watched::new();
    let devs = rook_devices(&w.s, ROOK.as_bytes());
    w.s.plan("keyplan.yaml", &aws_plan(&server));
    let before: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    for (args, code) in [(&["plan"][..], 3), (&["apply", "--auto-approve"][..], 1)] {
        let mut cmd = w.command(args);
        for v in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_ROLE_ARN",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        ] {
            cmd.env_remove(v);
        }
        cmd.env("AWS_SHARED_CREDENTIALS_FILE", w.s.path("no-credentials"))
            .env("AWS_CONFIG_FILE", w.s.path("no-config"))
            .env("AWS_EC2_METADATA_DISABLED", "true");
        let out = cmd.output().expect("run keyplan");
        w.record(&out);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(code), "{args:?}: {text}");
        assert!(text.contains("refused"), "{args:?}: {text}");
        assert!(
            text.contains("no usable AWS credentials"),
            "{args:?}: {text}"
        );
        assert!(text.contains("AWS_ACCESS_KEY_ID"), "{args:?}: {text}");
        assert!(!text.contains("is unavailable"), "{args:?}: {text}");
    }
    let after: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    assert_eq!(before, after);
}

/// A secret (or keyplan's record of it) scheduled for deletion is the only KMS copy of the
/// key about to go: `plan`, `status` and `apply` say so, with the command that cancels it,
/// and change nothing; once restored, nothing is left to do.
#[test]
fn a_secret_scheduled_for_deletion_is_reported_until_restored() {
    let Some(server) = Moto::start() else {
        return;
    };
    let w = Watched::new();
    w.add_secret(ROOK.as_bytes());
    server.put("rook/osd-kek", ROOK);
    let devs = rook_devices(&w.s, ROOK.as_bytes());
    w.s.plan("keyplan.yaml", &aws_plan(&server));
    kp(&w, &server, &["apply", "--auto-approve"], 0);
    let before: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    for secret in ["rook/osd-kek", "rook/osd-kek.keyplan"] {
        server.schedule_deletion(secret);
        let restore = format!("aws secretsmanager restore-secret --secret-id {secret}");
        for (args, code) in [
            (&["plan"][..], 1),
            (&["status"][..], 1),
            (&["apply", "--auto-approve", "--rotate", "osd-kek"][..], 1),
        ] {
            let out = kp(&w, &server, args, code);
            assert!(out.contains("scheduled for deletion"), "{args:?}: {out}");
            assert!(out.contains(&restore), "{args:?}: {out}");
        }
        assert_eq!(devs.iter().map(|d| keyslots(d)).collect::<Vec<_>>(), before);
        server.restore(secret);
        let out = kp(&w, &server, &["plan", "--detailed-exitcode"], 0);
        assert!(out.contains("No changes"), "{out}");
    }
    for d in &devs {
        assert!(opens(d, ROOK.as_bytes(), None), "{}", d.display());
    }
    w.assert_no_leaks();
}

#[test]
fn a_concurrent_writer_fails_the_commit_and_a_stopped_server_is_unavailable() {
    let Some(mut server) = Moto::start() else {
        return;
    };
    let w = Watched::new();
    w.add_secret(ROOK.as_bytes());
    server.put("rook/osd-kek", ROOK);
    let devs = rook_devices(&w.s, ROOK.as_bytes());
    w.s.plan("keyplan.yaml", &aws_plan(&server));
    kp(&w, &server, &["apply", "--auto-approve"], 0);

    // Another writer moves AWSCURRENT while keyplan's rotation waits before its commit: the
    // commit's compare-and-swap fails, nothing is committed, the devices still open with
    // the current value, and the next apply converges on the new state.
    let gate = w.s.path("gate");
    std::fs::write(&gate, "").expect("gate");
    let mut cmd = w.command(&["apply", "--auto-approve", "--rotate", "osd-kek"]);
    for (k, v) in server.env() {
        cmd.env(k, v);
    }
    let mut child = cmd
        .env(
            "FAILPOINTS",
            format!("commit.before=return(wait:{})", gate.display()),
        )
        // Into files, not pipes: its trace log would fill a pipe nobody reads while it waits.
        .stdout(std::fs::File::create(w.s.path("apply.out")).expect("apply.out"))
        .stderr(std::fs::File::create(w.s.path("apply.err")).expect("apply.err"))
        .spawn()
        .expect("spawn keyplan");
    let output = |status: std::process::ExitStatus| std::process::Output {
        status,
        stdout: std::fs::read(w.s.path("apply.out")).unwrap_or_default(),
        stderr: std::fs::read(w.s.path("apply.err")).unwrap_or_default(),
    };
    // At the gate (its marker file), or exited early (then its output says why).
    let marker = PathBuf::from(format!("{}.{}", gate.display(), child.id()));
    let t0 = std::time::Instant::now();
    while !marker.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            let out = output(status);
            panic!(
                "keyplan exited before its commit:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            t0.elapsed().as_secs() < 120,
            "keyplan never reached its commit"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let other = "another-writer-passphrase-0123456789";
    w.add_secret(other.as_bytes());
    server.put("rook/osd-kek", other);
    std::fs::remove_file(&gate).expect("open the gate");
    let out = output(child.wait().expect("wait"));
    w.record(&out);
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("changed concurrently"), "{text}");
    assert_eq!(server.get("rook/osd-kek", None).as_deref(), Some(other));
    for d in &devs {
        assert!(opens(d, ROOK.as_bytes(), None), "{}", d.display());
    }

    // The server stopped: plan and apply say the KMS is unavailable, and change nothing.
    server.stop();
    let before: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    let out = kp(&w, &server, &["apply", "--auto-approve"], 1);
    assert!(out.contains("is unavailable"), "{out}");
    let after: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    assert_eq!(before, after);
    w.assert_no_leaks();
}

/// Every crash point of keyplan (`src/failpoint.rs`) at every hit during a rotation against
/// Secrets Manager: the crashed apply (`SIGKILL`) leaves the KMS's current value opening the
/// device (I1); the next apply converges (no pending version left, one keyslot of the
/// current value, `plan` empty). Each case starts from where the previous one converged, so
/// the matrix is a chain of rotations on one device.
#[cfg(feature = "failpoints")]
#[test]
fn crash_matrix_of_a_rotation() {
    use std::os::unix::process::ExitStatusExt as _;
    let Some(server) = Moto::start() else {
        return;
    };
    let w = Watched::new();
    server.put("rook/osd-kek", ROOK);
    w.add_secret(ROOK.as_bytes());
    let dev = w.s.path("block.img");
    luks_format(&dev, 16 << 20, "luks2", &[], ROOK.as_bytes());
    w.s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n{}keys:\n  osd-kek: {{ kms: aws, name: rook/osd-kek }}\ndevices:\n  block: {{ path: block.img, keys: [osd-kek] }}\n{FAST_PBKDF}",
            server.kms_yaml("aws", "")
        ),
    );
    kp(&w, &server, &["apply", "--auto-approve"], 0);
    let current = |w: &Watched| {
        let v = server.get("rook/osd-kek", None).expect("a current value");
        w.add_secret(v.as_bytes());
        v
    };
    let points = keyplan::failpoint::POINTS
        .iter()
        .filter(|p| !p.starts_with("kms.file.") && !p.starts_with("status."));
    let (mut cases, mut per_point) = (0, Vec::new());
    for point in points {
        let mut hits = 0;
        for k in 0..60 {
            let when = format!("crash at {point} hit {}", k + 1);
            let mut cmd = w.command(&["apply", "--auto-approve", "--rotate", "osd-kek"]);
            for (name, v) in server.env() {
                cmd.env(name, v);
            }
            let out = cmd
                .env("FAILPOINTS", format!("{point}={k}*off->return"))
                .output()
                .expect("run keyplan");
            w.record(&out);
            if out.status.success() {
                break; // the point has fewer than k+1 hits in a rotation
            }
            assert_eq!(
                out.status.signal(),
                Some(9),
                "{when}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            hits += 1;
            let cur = current(&w);
            assert!(
                opens(&dev, cur.as_bytes(), None),
                "{when}: I1: the current value does not open the device"
            );
            kp(&w, &server, &["apply", "--auto-approve"], 0);
            let cur = current(&w);
            assert!(
                opens(&dev, cur.as_bytes(), None),
                "{when}, after recovery: I1"
            );
            assert_eq!(
                keyslots(&dev).len(),
                1,
                "{when}, after recovery: one keyslot"
            );
            let pending = server
                .versions("rook/osd-kek")
                .into_iter()
                .filter(|(_, l)| l.iter().any(|x| x == "AWSPENDING"))
                .count();
            assert_eq!(pending, 0, "{when}, after recovery: AWSPENDING left");
            let out = kp(&w, &server, &["plan", "--detailed-exitcode"], 0);
            assert!(out.contains("No changes"), "{when}: {out}");
        }
        cases += hits;
        per_point.push((*point, hits));
    }
    eprintln!("aws crash matrix: {cases} crashes: {per_point:?}");
    assert!(cases > 20, "{per_point:?}");
    w.assert_no_leaks();
}

/// Credentials Secrets Manager does not accept: `plan` and `apply` say the KMS refused and
/// what to fix, exit 1, and change no keyslot.
#[test]
fn unknown_credentials_are_refused() {
    let Some(server) = Moto::start_checking_credentials() else {
        return;
    };
    let w = Watched::new();
    w.add_secret(ROOK.as_bytes());
    let devs = rook_devices(&w.s, ROOK.as_bytes());
    w.s.plan("keyplan.yaml", &aws_plan(&server));
    let before: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    // `plan` exits 3 when a KMS could not be asked, `apply` 1 (docs/commands.md).
    for (args, code) in [(&["plan"][..], 3), (&["apply", "--auto-approve"][..], 1)] {
        let out = kp(&w, &server, args, code);
        assert!(out.contains("refused"), "{args:?}: {out}");
        assert!(out.contains("credentials"), "{args:?}: {out}");
    }
    let after: Vec<Vec<u32>> = devs.iter().map(|d| keyslots(d)).collect();
    assert_eq!(before, after);
}

/// Opt-in, against a real account: `KEYPLAN_AWS_REAL_REGION=<region>` (and credentials in
/// the usual AWS variables or profile) runs the provider contract on secrets named
/// `keyplan-test/<random>/contract-a` and `-b`, deleted afterwards (docs/kms/aws-secrets-manager.md).
#[test]
fn real_account_contract_opt_in() {
    let Ok(region) = std::env::var("KEYPLAN_AWS_REAL_REGION") else {
        eprintln!(
            "skipped: set KEYPLAN_AWS_REAL_REGION to run the contract against a real AWS account"
        );
        return;
    };
    let prefix = format!("keyplan-test/{}/", std::process::id());
    let config = KmsConfig::AwsSecretsManager {
        region,
        endpoint: None,
        prefix: Some(prefix),
        timeout: None,
    };
    let kms = keyplan::kms::aws::open("aws", &config).expect("open");
    let other = keyplan::kms::aws::open("aws", &config).expect("open");
    kms_contract::run(kms.as_ref(), other.as_ref(), "contract");
}
