//! Commands for what operators did by hand (issue 32): `keyplan device forget` (before:
//! editing devices.json), `keyplan key import` (before: writing the file KMS's meta.json) and
//! `keyplan sign --verify` (before: pushing a plan and reading the agent's refusal). Judged
//! with the real cryptsetup on LUKS image files and the file KMS.

use std::path::Path;

use crate::common::*;

/// Runs keyplan in `dir` with `input` on stdin; stdout and stderr captured.
fn keyplan_stdin(dir: &Path, args: &[&str], input: &[u8]) -> std::process::Output {
    use std::io::Write as _;
    use std::process::Stdio;
    let mut child = keyplan_command()
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn keyplan");
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input).expect("write stdin");
    }
    child.wait_with_output().expect("wait")
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const TWO: &str = "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local }\ndevices:\n  a: { path: a.img, keys: [k], enroll_with: initial.pass }\n  b: { path: b.img, keys: [k], enroll_with: initial.pass }\nsettings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }\n";
const ONE: &str = "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local }\ndevices:\n  a: { path: a.img, keys: [k], enroll_with: initial.pass }\nsettings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }\n";

#[test]
fn a_device_gone_for_good_is_forgotten_and_stops_holding_versions_back() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    let b = s.small_image("b.img", "luks2");
    s.plan("keyplan.yaml", TWO);
    s.ok(&["apply", "--auto-approve"], 0);
    let text = s.ok(&["device", "forget", "b"], 1);
    assert!(
        text.contains("device b") && text.contains("is in the plan file"),
        "{text}"
    );

    // b leaves the plan: it is still present, so it is not forgotten without asking.
    s.plan("keyplan.yaml", ONE);
    s.ok(&["apply", "--auto-approve"], 0);
    let text = s.ok(&["device", "forget", "b"], 1);
    assert!(text.contains("is still present"), "{text}");
    assert!(text.contains("--even-if-present"), "{text}");

    // b is gone: every rotation keeps the old versions, and says how to stop that.
    std::fs::rename(&b, s.path("b.img.gone")).expect("rename");
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let text = s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    assert!(text.contains("k v1 is kept in the KMS"), "{text}");
    assert!(text.contains("run `keyplan device forget ID`"), "{text}");
    let text = s.ok(&["device", "forget", "nosuch"], 1);
    assert!(text.contains("remembers no device \"nosuch\""), "{text}");
    assert!(text.contains("it remembers: a ("), "{text}");
    let text = s.ok(&["device", "forget", "b"], 0);
    assert!(text.contains("Forgot device b"), "{text}");
    let reg = std::fs::read_to_string(s.path(".keyplan/devices.json")).expect("registry");
    assert!(!reg.contains("\"b\""), "{reg}");
    // The next rotation no longer holds versions back for b: it retires them.
    let text = s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    assert!(!text.contains("cannot be read now"), "{text}");
    assert!(text.contains("retire k v1"), "{text}");
    assert!(opens(&s.path("a.img"), &s.key_get("k", None), None));
}

#[test]
fn an_existing_passphrase_is_imported_as_a_keys_first_version() {
    let s = Scratch::new();
    let kek = b"the KEK the devices were formatted with";
    for name in ["a.img", "b.img"] {
        luks_format(&s.path(name), 16 << 20, "luks2", &[], kek);
    }
    let plan = "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local }\ndevices:\n  a: { path: a.img, keys: [k] }\n  b: { path: b.img, keys: [k] }\nsettings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }\n";
    s.plan("keyplan.yaml", plan);
    let refused = s.ok(&["plan"], 1);
    assert!(refused.contains("keyplan key import k < FILE"), "{refused}");

    // A passphrase that opens nothing is not imported: the KMS stays empty.
    let out = keyplan_stdin(s.dir.path(), &["key", "import", "k"], b"a typo");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("it opens no device that lists the key"),
        "{}",
        text(&out)
    );
    assert_eq!(file_kms_state(s.dir.path(), "k").0, None);
    assert!(!contains(&out.stdout, b"a typo") && !contains(&out.stderr, b"a typo"));

    // A device of the key that the passphrase does not open, with no enroll_with: the plan
    // could not enroll it afterwards, so nothing is imported.
    luks_format(&s.path("c.img"), 16 << 20, "luks2", &[], b"another KEK");
    s.plan(
        "keyplan.yaml",
        &plan.replace("devices:\n", "devices:\n  c: { path: c.img, keys: [k] }\n"),
    );
    let out = keyplan_stdin(s.dir.path(), &["key", "import", "k"], kek);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("it opens no bound keyslot of c (which has no enroll_with)"),
        "{}",
        text(&out)
    );
    assert_eq!(file_kms_state(s.dir.path(), "k").0, None);
    s.plan("keyplan.yaml", plan);

    let out = keyplan_stdin(s.dir.path(), &["key", "import", "k"], kek);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains(
            "Imported key k v1 (now current): it opens device a keyslot 0, device b keyslot 0"
        ),
        "{}",
        text(&out)
    );
    assert_eq!(s.key_get("k", None), kek.to_vec());
    // apply adopts the keyslots it opens: nothing added, no enroll_with needed.
    let shown = s.ok(&["apply", "--auto-approve"], 0);
    assert!(
        shown.contains("0 added, 0 removed, 0 keys rotated, 2 adopted"),
        "{shown}"
    );
    assert!(s.ok(&["plan"], 0).contains("No changes"));
    // Imported once only: a key the KMS holds is rotated, not imported over.
    let out = keyplan_stdin(s.dir.path(), &["key", "import", "k"], kek);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("already holds key k (current v1)"),
        "{}",
        text(&out)
    );
}

/// An import killed between the KMS's stage and commit leaves the passphrase pending; the
/// same import again commits it.
#[cfg(feature = "failpoints")]
#[test]
fn an_interrupted_import_is_finished_by_importing_again() {
    use std::os::unix::process::ExitStatusExt as _;
    let s = Scratch::new();
    let kek = b"the KEK of an interrupted import";
    luks_format(&s.path("a.img"), 16 << 20, "luks2", &[], kek);
    s.plan(
        "keyplan.yaml",
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local }\ndevices:\n  a: { path: a.img, keys: [k] }\nsettings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }\n",
    );
    let mut cmd = keyplan_command();
    cmd.current_dir(s.dir.path())
        .env("FAILPOINTS", "kms.commit=return")
        .args(["key", "import", "k"]);
    let out = run_with_stdin(cmd, kek);
    assert!(!contains(&out.stderr, kek));
    assert_eq!(out.status.signal(), Some(9), "{}", text(&out));
    let out = keyplan_stdin(s.dir.path(), &["key", "import", "k"], b"another passphrase");
    assert_eq!(out.status.code(), Some(1));
    let out = keyplan_stdin(s.dir.path(), &["key", "import", "k"], kek);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("committed now"), "{}", text(&out));
    assert_eq!(s.key_get("k", None), kek.to_vec());
}

/// After an interrupted import, `status` and `apply` name what finishes it: the same import
/// again, not `keyplan apply` (which refuses a pending version no device of the plan holds) nor
/// removing the version by hand. Followed, the advice commits the passphrase and `apply`
/// adopts the keyslot it opens (issue 46).
#[cfg(feature = "failpoints")]
#[test]
fn status_and_apply_say_an_interrupted_import_is_finished_by_importing_again() {
    use std::os::unix::process::ExitStatusExt as _;
    let s = Scratch::new();
    let kek = b"the KEK of an import killed before its commit";
    luks_format(&s.path("a.img"), 16 << 20, "luks2", &[], kek);
    s.plan(
        "keyplan.yaml",
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local }\ndevices:\n  a: { path: a.img, keys: [k] }\nsettings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }\n",
    );
    let mut cmd = keyplan_command();
    cmd.current_dir(s.dir.path())
        .env("FAILPOINTS", "kms.commit=return")
        .args(["key", "import", "k"]);
    let out = run_with_stdin(cmd, kek);
    assert_eq!(out.status.signal(), Some(9), "{}", text(&out));
    assert_eq!(
        file_kms_state(s.dir.path(), "k").0,
        None,
        "nothing committed"
    );

    let advice = "`keyplan key import k`";
    let status = text(&s.keyplan(&["status"]));
    assert!(status.contains(advice), "{status}");
    assert!(
        !status.contains("a rotation is under way: run `keyplan apply`"),
        "{status}"
    );
    let before = Snapshot::take(&[s.path("a.img"), s.path("keys")]);
    let refused = s.ok(&["apply", "--auto-approve"], 1);
    assert!(refused.contains(advice), "{refused}");
    assert!(refused.contains("with the same passphrase"), "{refused}");
    assert!(refused.contains("Nothing was changed"), "{refused}");
    before.assert_unchanged("apply after an interrupted import");

    // Followed: the import again commits it, and apply adopts the keyslot.
    let out = keyplan_stdin(s.dir.path(), &["key", "import", "k"], kek);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("committed now"), "{}", text(&out));
    let applied = s.ok(&["apply", "--auto-approve"], 0);
    assert!(applied.contains("1 adopted"), "{applied}");
    assert_eq!(s.key_get("k", None), kek.to_vec());
    assert!(opens(&s.path("a.img"), kek, None));
    let status = text(&s.keyplan(&["status"]));
    assert!(!status.contains("pending"), "{status}");
}

#[test]
fn a_plan_signature_is_verified_locally_as_an_agent_would() {
    let s = Scratch::new();
    s.ok(&["sign", "--generate-key", "signing.pem"], 0);
    s.ok(&["sign", "--generate-key", "other.pem"], 0);
    s.plan(
        "plan.yaml",
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local }\ndevices:\n  a: { path: /dev/sdx, keys: [k], node: worker-1 }\n",
    );
    s.ok(
        &[
            "sign",
            "plan.yaml",
            "--cluster",
            "prod",
            "--key",
            "signing.pem",
        ],
        0,
    );
    let check = |cluster: &str, key: &str| {
        s.keyplan(&[
            "sign",
            "--verify",
            "plan.yaml",
            "--cluster",
            cluster,
            "--trusted-keys",
            key,
        ])
    };
    let out = check("prod", "signing.pem.pub");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("plan.yaml.sig verifies: signed for cluster \"prod\""));
    for (cluster, key, reason) in [
        ("staging", "signing.pem.pub", "(other_cluster)"),
        ("prod", "other.pem.pub", "(untrusted_key)"),
    ] {
        let out = check(cluster, key);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(text(&out).contains(reason), "{}", text(&out));
    }
    let mut bytes = std::fs::read(s.path("plan.yaml")).expect("plan");
    bytes.extend_from_slice(b"# edited after signing\n");
    std::fs::write(s.path("plan.yaml"), &bytes).expect("write");
    let out = check("prod", "signing.pem.pub");
    assert!(text(&out).contains("(tampered)"), "{}", text(&out));
    std::fs::remove_file(s.path("plan.yaml.sig")).expect("rm");
    let out = check("prod", "signing.pem.pub");
    assert!(text(&out).contains("(unsigned)"), "{}", text(&out));
    assert!(
        !s.path("plan.yaml.sig").exists(),
        "--verify wrote a signature"
    );
}

/// `status -o` and `--journal-archive` never write the plan's own files: the plan, a device, an
/// `enroll_with` file, the state directory, the file KMS, or a file that is not theirs.
#[test]
fn output_files_never_replace_the_plans_own_files() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", ONE);
    s.ok(&["apply", "--auto-approve"], 0);
    std::fs::write(s.path("notes.txt"), b"an operator's notes\n").expect("write");
    std::fs::write(s.path("empty.lock"), b"").expect("write");
    // Another plan's state directory beside this one.
    let other = s.path("other");
    std::fs::create_dir_all(other.join("state")).expect("mkdir");
    std::fs::copy(
        s.path(".keyplan/journal.jsonl"),
        other.join("state/journal.jsonl"),
    )
    .expect("copy");
    std::fs::write(other.join("state/history.jsonl"), b"").expect("write");
    let protected = [
        "keyplan.yaml",
        "a.img",
        "initial.pass",
        ".keyplan/owner.json",
        "keys/k/meta.json",
        "notes.txt",
        "empty.lock",
        "other/state/journal.jsonl",
        "other/state/history.jsonl",
    ];
    let before: Vec<Vec<u8>> = protected
        .iter()
        .map(|f| std::fs::read(s.path(f)).expect("read"))
        .collect();
    for f in protected {
        let text = s.ok(&["status", "--format", "json", "-o", f], 1);
        assert!(
            text.contains("refusing to write the status to"),
            "{f}: {text}"
        );
        let text = s.ok(
            &[
                "apply",
                "--auto-approve",
                "--rotate",
                "k",
                "--journal-archive",
                f,
            ],
            1,
        );
        assert!(text.contains("refusing --journal-archive"), "{f}: {text}");
    }
    for (f, b) in protected.iter().zip(&before) {
        assert_eq!(
            &std::fs::read(s.path(f)).expect("read"),
            b,
            "{f} was written"
        );
    }
    assert!(opens(&a, &s.key_get("k", None), None));
    // Their own files are written again.
    s.ok(
        &["status", "--format", "prometheus", "-o", "metrics.prom"],
        0,
    );
    s.ok(
        &["status", "--format", "prometheus", "-o", "metrics.prom"],
        0,
    );
    for _ in 0..3 {
        s.ok(
            &[
                "apply",
                "--auto-approve",
                "--rotate",
                "k",
                "--journal-keep-runs",
                "1",
                "--journal-archive",
                "archive.jsonl",
            ],
            0,
        );
    }
    assert!(
        std::fs::metadata(s.path("archive.jsonl"))
            .expect("archive")
            .len()
            > 0
    );
}
