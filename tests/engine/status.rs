//! `keyplan status`: per-key versions (current, retained) from the KMS, per-device drift from
//! the LUKS headers, the last run; exit 1 when unhealthy; `--format json` and `--format
//! prometheus` (node_exporter textfile, `-o` written atomically); and `journal --json`.

use std::collections::{BTreeMap, BTreeSet};

use crate::common::*;

fn plan_text(after: &str, extra_dev: &str) -> String {
    format!(
        "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local, rotate_after: {after} }}\ndevices:\n  a: {{ path: a.img, keys: [k], enroll_with: initial.pass{extra_dev} }}\n{FAST_PBKDF}"
    )
}

/// Takes the state lock of `state_dir` for the test, as a run would. The test dropped it
/// just before: while another test's thread of this process spawns a child, the child holds a
/// copy of the lock's open file description (flock(2) locks belong to it) from its fork until
/// its exec closes it (close-on-exec), so the lock can outlive the drop by that long. This
/// waits for that event, the lock free (at most 30 s), instead of failing on it.
fn hold_state_lock(state_dir: &std::path::Path) -> keyplan::journal::StateLock {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match keyplan::journal::StateLock::acquire(state_dir) {
            Ok(lock) => return lock,
            Err(keyplan::journal::JournalError::Locked { .. })
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(e) => panic!("take the state lock: {e}"),
        }
    }
}

/// `status --format json`, asserting exit `code`.
fn status_json(s: &Scratch, code: i32) -> serde_json::Value {
    let out = s.keyplan(&["status", "--format", "json"]);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document on stdout")
}

/// Parses Prometheus text exposition format strictly enough for the textfile collector:
/// every sample's family has exactly one `# HELP` and one `# TYPE gauge` line before its
/// first sample, families are contiguous, names and label names are valid, label values are
/// escaped (only `\\`, `\"`, `\n`), values are numbers, and no sample repeats. Returns
/// samples by `name{labels}` as written.
fn parse_prometheus(text: &str) -> BTreeMap<String, f64> {
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars()
                .enumerate()
                .all(|(i, c)| c.is_ascii_alphabetic() || c == '_' || (i > 0 && c.is_ascii_digit()))
    };
    let mut helped = BTreeSet::new();
    let mut typed = BTreeSet::new();
    let mut finished = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut samples = BTreeMap::new();
    assert!(text.ends_with('\n'), "ends with a newline");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(valid_name(name), "{line}");
            assert!(helped.insert(name.to_string()), "one HELP for {name}");
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            let name = it.next().unwrap();
            assert_eq!(it.next(), Some("gauge"), "{line}");
            assert!(typed.insert(name.to_string()), "one TYPE for {name}");
            continue;
        }
        assert!(!line.starts_with('#'), "no other comments: {line}");
        assert!(!line.is_empty(), "no blank lines");
        // name, optional {labels}, space, value
        let name_end = line.find(['{', ' ']).expect("sample line");
        let name = &line[..name_end];
        assert!(valid_name(name), "{line}");
        assert!(typed.contains(name), "TYPE before sample: {line}");
        assert!(helped.contains(name), "HELP before sample: {line}");
        if current.as_deref() != Some(name) {
            if let Some(prev) = current.take() {
                finished.insert(prev);
            }
            assert!(!finished.contains(name), "family {name} is contiguous");
            current = Some(name.to_string());
        }
        let mut rest = &line[name_end..];
        if rest.starts_with('{') {
            let mut chars = rest.char_indices().skip(1).peekable();
            let end = loop {
                let (i, c) = chars.next().expect("closing brace");
                if c == '}' {
                    break i;
                }
                // label name
                let mut lname = String::from(c);
                for (_, c) in chars.by_ref() {
                    if c == '=' {
                        break;
                    }
                    lname.push(c);
                }
                assert!(valid_name(&lname), "label name {lname:?} in {line}");
                assert_eq!(chars.next().map(|x| x.1), Some('"'), "{line}");
                loop {
                    let (_, c) = chars.next().expect("closing quote");
                    match c {
                        '\\' => {
                            let (_, e) = chars.next().expect("escape");
                            assert!(matches!(e, '\\' | '"' | 'n'), "bad escape in {line}");
                        }
                        '"' => break,
                        '\n' => panic!("raw newline in {line}"),
                        _ => {}
                    }
                }
                if let Some((_, ',')) = chars.peek() {
                    chars.next();
                }
            };
            rest = &rest[end + 1..];
        }
        let value = rest.strip_prefix(' ').expect("space before value");
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("number: {line}"));
        let key = line[..line.len() - value.len() - 1].to_string();
        assert!(samples.insert(key, v).is_none(), "sample repeats: {line}");
    }
    samples
}

/// Replaces what changes from run to run in `status` text: RFC 3339 times, run ids
/// (`<secs>-<pid>`), ages and day counts (`12s`, `29d`).
fn normalize(text: &str) -> String {
    let word = |w: &str| -> String {
        let core = w.trim_matches(|c| c == '(' || c == ')' || c == ',');
        let digits = |x: &str| !x.is_empty() && x.chars().all(|c| c.is_ascii_digit());
        let new = if core.len() == 20 && core.ends_with('Z') && core.as_bytes()[10] == b'T' {
            "[TIME]"
        } else if core
            .split_once('-')
            .is_some_and(|(a, b)| digits(a) && digits(b))
        {
            "[RUN]"
        } else if core.len() > 1
            && digits(&core[..core.len() - 1])
            && matches!(core.chars().last(), Some('s' | 'm' | 'h' | 'd'))
        {
            "[DURATION]"
        } else {
            return w.to_string();
        };
        w.replace(core, new)
    };
    text.lines()
        .map(|l| l.split(' ').map(word).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

fn prometheus(s: &Scratch, code: i32) -> BTreeMap<String, f64> {
    let out = s.keyplan(&["status", "--format", "prometheus"]);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_prometheus(&String::from_utf8(out.stdout).expect("utf-8"))
}

/// The metric families exported per KMS credential (none for the file KMS).
const CREDENTIAL_FAMILIES: [&str; 3] = [
    "keyplan_kms_credential_expiry_timestamp_seconds",
    "keyplan_kms_credential_deadline_timestamp_seconds",
    "keyplan_kms_credential_expiring",
];

#[test]
fn status_reports_current_retained_and_overdue() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    let out = s.ok(&["status"], 0);
    assert!(out.contains("no current version"), "{out}");
    assert!(out.contains("last run: none"), "{out}");
    s.ok(&["apply", "--auto-approve"], 0);
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let out = s.ok(&["status"], 0);
    assert!(out.contains("current  v2"), "{out}");
    assert!(out.contains("retained v1"), "{out}");
    assert!(out.contains("rotation due in"), "{out}");
    assert!(out.contains("(success)"), "{out}");
    // A 1-second limit is overdue two seconds later: exit 1 for monitoring. (The version is
    // made two seconds older in the file KMS instead of waiting for them to pass.)
    s.plan("keyplan.yaml", &plan_text("1s", ""));
    file_kms_age_current(s.dir.path(), "k", 2);
    let out = s.ok(&["status"], 1);
    assert!(out.contains("rotation OVERDUE"), "{out}");
    assert!(out.contains("UNHEALTHY"), "{out}");
    let j = status_json(&s, 1);
    let k = &j["keys"][0];
    assert_eq!(k["overdue"], true);
    assert_eq!(k["rotate_after_seconds"], 1);
    let due = k["rotation_due_at"].as_u64().unwrap();
    assert_eq!(due, k["current"]["created_at"].as_u64().unwrap() + 1);
    assert!(due < j["generated_at"].as_u64().unwrap(), "due in the past");
    assert_eq!(j["healthy"], false);
    // overdue is not drift: the device is as the plan wants it
    assert_eq!(j["devices"][0]["drifted"], false, "{j}");
    let m = prometheus(&s, 1);
    assert_eq!(
        m[r#"keyplan_key_rotation_overdue{key="k",kms="local"}"#],
        1.0
    );
    assert_eq!(m["keyplan_status_healthy"], 0.0);
    assert_eq!(m["keyplan_drift_devices"], 0.0);

    // A KMS that lost a key a run committed is unhealthy too (not "not created yet").
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    std::fs::remove_dir_all(s.path("keys").join("k")).unwrap();
    let out = s.ok(&["status"], 1);
    assert!(
        out.contains("NO CURRENT VERSION, although a run committed one"),
        "{out}"
    );
    assert_eq!(status_json(&s, 1)["keys"][0]["missing"], true);
}

/// After apply: exit 0, JSON fields and Prometheus values match the KMS and journal, `-o`
/// replaces the textfile atomically, and status runs no PBKDF and no cryptsetup process (the
/// headers are read in process).
#[test]
fn healthy_after_apply_json_prometheus_and_textfile() {
    let w = Watched::new();
    let s = &w.s;
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    w.ok(&["apply", "--auto-approve"], 0);
    w.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);

    let logged = w.child_log().len();
    let out = w.run(&["status", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0));
    let log = w.child_log();
    let calls: Vec<&str> = std::str::from_utf8(&log[logged..])
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("ARGV:"))
        .collect();
    // Headers are read in process (issue 17): status runs no cryptsetup process at all.
    assert!(
        calls.is_empty(),
        "status runs no cryptsetup process: {calls:?}"
    );

    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["format_version"], "1.4");
    assert_eq!(j["healthy"], true);
    assert_eq!(j["problems"], serde_json::json!([]));
    let k = &j["keys"][0];
    assert_eq!(k["id"], "k");
    assert_eq!(k["kms"], "local");
    assert_eq!(k["provider"], "file");
    assert_eq!(k["name"], "k");
    assert_eq!(k["current"]["version"], 2);
    assert_eq!(k["retained"], serde_json::json!([1]));
    assert_eq!(k["pending"], serde_json::Value::Null);
    assert_eq!(k["overdue"], false);
    assert_eq!(k["rotate_after_seconds"], 30 * 86400);
    assert_eq!(
        k["rotation_due_at"].as_u64().unwrap(),
        k["current"]["created_at"].as_u64().unwrap() + 30 * 86400
    );
    let d = &j["devices"][0];
    assert_eq!(d["id"], "a");
    assert_eq!(d["checked"], true);
    assert_eq!(d["drifted"], false);
    assert_eq!(d["drift"], serde_json::json!([]));
    assert_eq!(j["last_run"]["outcome"], "success");
    assert!(
        j["last_run"]["ended_at"].as_u64().unwrap()
            >= j["last_run"]["started_at"].as_u64().unwrap()
    );
    assert_eq!(j["last_success_at"], j["last_run"]["ended_at"]);

    let m = prometheus(s, 0);
    assert_eq!(m["keyplan_status_healthy"], 1.0);
    assert_eq!(m["keyplan_last_run_success"], 1.0);
    assert_eq!(
        m[r#"keyplan_key_current_version{key="k",kms="local"}"#],
        2.0
    );
    assert_eq!(
        m[r#"keyplan_key_retained_versions{key="k",kms="local"}"#],
        1.0
    );
    assert_eq!(
        m[r#"keyplan_key_rotation_overdue{key="k",kms="local"}"#],
        0.0
    );
    assert_eq!(
        m[r#"keyplan_key_rotation_due_timestamp_seconds{key="k",kms="local"}"#],
        k["rotation_due_at"].as_f64().unwrap()
    );
    assert!(m[r#"keyplan_key_age_seconds{key="k",kms="local"}"#] < 600.0);
    assert_eq!(m[r#"keyplan_device_drift{device="a"}"#], 0.0);
    assert_eq!(m["keyplan_drift_devices"], 0.0);

    // Every family is documented, and every metric the sample alert rules use exists.
    let families: BTreeSet<&str> = m.keys().map(|k| k.split('{').next().unwrap()).collect();
    assert_eq!(families.len(), 24, "{families:?}");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/monitoring.md")).unwrap();
    for f in families.iter().chain(&CREDENTIAL_FAMILIES) {
        assert!(doc.contains(&format!("`{f}`")), "{f} documented");
    }
    let rules: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(root.join("examples/monitoring/keyplan.rules.yml")).unwrap(),
    )
    .unwrap();
    let rules = rules["groups"][0]["rules"].as_array().unwrap();
    assert!(rules.len() >= 5);
    for r in rules {
        let expr = r["expr"].as_str().unwrap();
        assert!(r["alert"].is_string() && r["annotations"]["summary"].is_string());
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            // The credential families have series only for a KMS with credentials (not the
            // file KMS here); tests/kms/kmip.rs and tests/kms/vault_auth.rs see them exported.
            if word.starts_with("keyplan_") && !CREDENTIAL_FAMILIES.contains(&word) {
                assert!(families.contains(word), "rule uses unknown metric {word}");
            }
        }
    }

    // -o: written atomically into the collector directory, replacing the old file, nothing on
    // stdout, no temporary file left behind.
    let dir = s.path("textfile");
    std::fs::create_dir(&dir).unwrap();
    let prom = dir.join("keyplan.prom");
    // An earlier (stale) status of keyplan's: replaced. A file keyplan did not write is
    // refused (tests/engine/day2_commands.rs).
    std::fs::write(&prom, "# HELP keyplan_last_run_success stale\n").unwrap();
    let out = s.keyplan(&[
        "status",
        "--format",
        "prometheus",
        "-o",
        prom.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty(), "nothing on stdout with -o");
    let written = std::fs::read_to_string(&prom).unwrap();
    let m = parse_prometheus(&written);
    assert_eq!(m["keyplan_last_run_success"], 1.0);
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("keyplan.prom")]);
    // a directory that does not exist: exit 1 naming the file
    let out = s.ok(
        &[
            "status",
            "--format",
            "prometheus",
            "-o",
            "no/such/dir/k.prom",
        ],
        1,
    );
    assert!(
        out.contains("cannot write the status to no/such/dir/k.prom"),
        "{out}"
    );
    w.assert_no_leaks();
}

/// A managed keyslot killed behind keyplan's back is drift: exit 1, the device named, the
/// metric 1; `apply` repairs it and status is healthy again. An unreadable device is drift too.
#[test]
fn drift_after_keyslot_killed_outside_keyplan() {
    let w = Watched::new();
    let s = &w.s;
    s.initial_pass();
    let img = s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    w.ok(&["apply", "--auto-approve"], 0);
    let slot = *keyslots(&img)
        .iter()
        .find(|n| **n != 0)
        .expect("keyplan's keyslot");
    let out = std::process::Command::new("cryptsetup")
        .args(["luksKillSlot", "--batch-mode"])
        .arg(&img)
        .arg(slot.to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let logged = w.child_log().len();
    let text = w.ok(&["status"], 1);
    let log = w.child_log();
    let tested = std::str::from_utf8(&log[logged..])
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("ARGV:"))
        .filter(|l| !l.contains(" luksDump ") && !l.contains(" isLuks "))
        .count();
    assert_eq!(
        tested, 0,
        "status tests no passphrase (enroll_with is not tried)"
    );
    assert!(text.contains("device a ("), "{text}");
    assert!(text.contains("DRIFT"), "{text}");
    assert!(
        text.contains(&format!(
            "keyslot_gone: keyslot {slot} was removed outside keyplan; it held k v1"
        )),
        "{text}"
    );
    assert!(text.contains("key_missing"), "{text}");
    assert!(
        text.contains("UNHEALTHY: device a drifted (key_missing, keyslot_gone; `keyplan plan` shows the repair)"),
        "{text}"
    );

    // the whole text, with times, paths and the run id normalized
    assert!(
        text.contains("pbkdf_runs=0"),
        "the driver counted no PBKDF run: {text}"
    );
    let plain = String::from_utf8(s.keyplan(&["status"]).stdout).unwrap();
    let norm = normalize(&plain.replace(&s.dir.path().display().to_string(), "[DIR]"));
    insta::assert_snapshot!(norm.replace(&format!("keyslot {slot}"), "keyslot [N]"));

    let j = status_json(s, 1);
    let d = &j["devices"][0];
    assert_eq!(d["drifted"], true);
    let kinds: Vec<&str> = d["drift"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, vec!["keyslot_gone", "key_missing"]);
    assert_eq!(d["drift"][0]["keyslot"], slot);
    let m = prometheus(s, 1);
    assert_eq!(m[r#"keyplan_device_drift{device="a"}"#], 1.0);
    assert_eq!(m[r#"keyplan_device_drift_findings{device="a"}"#], 2.0);
    assert_eq!(m["keyplan_drift_devices"], 1.0);
    assert_eq!(m["keyplan_status_healthy"], 0.0);
    // The last run itself was fine: drift is its own signal.
    assert_eq!(m["keyplan_last_run_success"], 1.0);

    // apply repairs the device; the current version opens it again; status is healthy
    w.ok(&["apply", "--auto-approve"], 0);
    assert!(opens(&img, &s.key_get("k", None), None));
    let j = status_json(s, 0);
    assert_eq!(j["devices"][0]["drifted"], false);

    // an unreadable device (moved away) is drift of kind `unreadable`; keys are still reported
    std::fs::rename(&img, s.path("moved.img")).unwrap();
    let j = status_json(s, 1);
    assert_eq!(j["devices"][0]["drift"][0]["kind"], "unreadable");
    assert!(
        j["devices"][0]["drift"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{j}"
    );
    assert_eq!(j["keys"][0]["current"]["version"], 1);
    let m = prometheus(s, 1);
    assert_eq!(m[r#"keyplan_device_drift{device="a"}"#], 1.0);
    std::fs::rename(s.path("moved.img"), &img).unwrap();

    // under `unmanaged_keyslots: remove`, the initial keyslot 0 is drift (apply would remove it)
    s.plan(
        "keyplan.yaml",
        &plan_text("30d", ", unmanaged_keyslots: remove"),
    );
    let j = status_json(s, 1);
    let f = &j["devices"][0]["drift"][0];
    assert_eq!(f["kind"], "unmanaged_keyslot", "{j}");
    assert_eq!(f["keyslot"], 0);
    w.assert_no_leaks();
}

/// A header restored from a backup taken before a rotation: with LUKS2 the tokens travel
/// with the header, so the device holds a stale version; with LUKS1 the records live in the
/// state directory, which names a keyslot the old header lacks. Then a keyslot killed by hand
/// is drift on LUKS1 too.
#[test]
fn restored_header_and_luks1_drift() {
    for luks in ["luks2", "luks1"] {
        let s = Scratch::new();
        s.initial_pass();
        let img = s.small_image("a.img", luks);
        s.plan("keyplan.yaml", &plan_text("30d", ""));
        s.ok(&["apply", "--auto-approve"], 0);
        let backup = std::fs::read(&img).unwrap();
        s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
        assert_eq!(status_json(&s, 0)["devices"][0]["drifted"], false);

        let rotated = std::fs::read(&img).unwrap();
        std::fs::write(&img, &backup).unwrap();
        let j = status_json(&s, 1);
        let kinds: Vec<&str> = j["devices"][0]["drift"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["kind"].as_str().unwrap())
            .collect();
        let want = if luks == "luks2" {
            "stale_version"
        } else {
            "keyslot_gone"
        };
        assert!(kinds.contains(&want), "{luks}: {j}");
        std::fs::write(&img, &rotated).unwrap();
        assert_eq!(status_json(&s, 0)["devices"][0]["drifted"], false);

        if luks == "luks1" {
            let slot = *keyslots(&img).iter().find(|n| **n != 0).unwrap();
            let out = std::process::Command::new("cryptsetup")
                .args(["luksKillSlot", "--batch-mode"])
                .arg(&img)
                .arg(slot.to_string())
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            assert!(out.status.success());
            let j = status_json(&s, 1);
            assert_eq!(j["devices"][0]["drift"][0]["kind"], "keyslot_gone", "{j}");
            assert_eq!(j["devices"][0]["drift"][0]["keyslot"], slot);
        }
    }
}

/// `journal --json`: one document with format_version, state_dir, the records and a summary
/// per run.
#[test]
fn journal_json_document() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    let out = s.keyplan(&["journal", "--json"]);
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["format_version"], "1.0");
    assert_eq!(j["records"], serde_json::json!([]));
    assert_eq!(j["runs"], serde_json::json!([]));
    s.ok(&["apply", "--auto-approve"], 0);
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let out = s.keyplan(&["journal", "--json"]);
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["format_version"], "1.0");
    let state_dir = std::path::PathBuf::from(j["state_dir"].as_str().unwrap());
    assert!(state_dir.join("journal.jsonl").is_file(), "{j}");
    let runs = j["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{j}");
    for r in runs {
        assert_eq!(r["outcome"], "success");
        assert!(r["steps"].as_u64().unwrap() > 0);
        assert_eq!(r["done"], r["steps"], "every step done: {r}");
        assert!(r["ended_at"].as_u64().unwrap() >= r["started_at"].as_u64().unwrap());
    }
    let records = j["records"].as_array().unwrap();
    assert_eq!(records[0]["event"], "run_start");
    assert_eq!(records[0]["run"], runs[0]["id"]);
    let last_status = status_json(&s, 0);
    assert_eq!(last_status["last_run"]["id"], runs[1]["id"]);
}

/// A failed last run: `keyplan_last_run_success 0`, exit 1, outcome `failed` with its error.
#[cfg(feature = "failpoints")]
#[test]
fn failed_last_run_is_unhealthy() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    s.ok(&["apply", "--auto-approve"], 0);
    let out = assert_cmd::Command::from_std(keyplan_command())
        .current_dir(s.dir.path())
        .env("NO_COLOR", "1")
        .env("FAILPOINTS", "kms.commit=return(error)")
        .args(["apply", "--auto-approve", "--rotate", "k"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let m = prometheus(&s, 1);
    assert_eq!(m["keyplan_last_run_success"], 0.0);
    assert_eq!(m["keyplan_status_healthy"], 0.0);
    assert!(
        m.contains_key("keyplan_last_success_timestamp_seconds"),
        "the first run succeeded"
    );
    let j = status_json(&s, 1);
    assert_eq!(j["last_run"]["outcome"], "failed", "{j}");
    assert!(
        j["last_run"]["error"]
            .as_str()
            .unwrap()
            .contains("injected"),
        "{j}"
    );
    assert!(
        j["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().contains("failed")),
        "{j}"
    );
    // The text says when the last success was (the first run, compacted out of the journal
    // by the failed one: the checkpoint keeps its time).
    let text = s.ok(&["status"], 1);
    let when = j["last_success_at"].as_u64().expect("last_success_at");
    assert!(
        text.contains(&format!(
            "  last success: {}",
            keyplan::clock::rfc3339(when)
        )),
        "{text}"
    );
    // the next apply finishes the rotation: healthy again
    s.ok(&["apply", "--auto-approve"], 0);
    let m = prometheus(&s, 0);
    assert_eq!(m["keyplan_last_run_success"], 1.0);
    assert_eq!(
        m[r#"keyplan_key_current_version{key="k",kms="local"}"#],
        2.0
    );

    // A KMS that cannot be read: nothing wrong was found, but the key and the devices could
    // not be checked: exit 3 (not 1), readable 0, the key's other metrics absent, drift not
    // checked (absent, not 0), `keyplan_status_complete 0`, the error named under `unchecked`.
    let status_with_kms_down = |format: &str| {
        assert_cmd::Command::from_std(keyplan_command())
            .current_dir(s.dir.path())
            .env("NO_COLOR", "1")
            .env("FAILPOINTS", "kms.read=return(error)")
            .args(["status", "--format", format])
            .output()
            .unwrap()
    };
    let out = status_with_kms_down("prometheus");
    assert_eq!(out.status.code(), Some(3));
    let m = parse_prometheus(&String::from_utf8(out.stdout).unwrap());
    assert_eq!(m[r#"keyplan_key_kms_readable{key="k",kms="local"}"#], 0.0);
    assert!(!m.contains_key(r#"keyplan_key_age_seconds{key="k",kms="local"}"#));
    assert!(!m.contains_key(r#"keyplan_device_drift{device="a"}"#));
    assert_eq!(m["keyplan_status_healthy"], 0.0);
    assert_eq!(m["keyplan_status_complete"], 0.0);
    assert_eq!(m["keyplan_status_problems"], 0.0);
    let out = status_with_kms_down("json");
    assert_eq!(out.status.code(), Some(3));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["verdict"], "unknown");
    assert_eq!(j["problems"], serde_json::json!([]));
    // One statement per fact: the KMS's error once (the observation's, which asked it
    // first), the key's own read not asked again.
    let unchecked = j["unchecked"].as_array().unwrap();
    let kms_lines: Vec<&str> = unchecked
        .iter()
        .filter_map(|u| u.as_str())
        .filter(|u| u.contains("injected"))
        .collect();
    assert_eq!(kms_lines.len(), 1, "{j}");
    assert!(
        kms_lines[0].starts_with("KMS local unreadable (key k): "),
        "{j}"
    );
    assert_eq!(j["keys"][0]["readable"], false);
    assert!(
        j["keys"][0]["error"]
            .as_str()
            .unwrap()
            .contains("not asked: it was unavailable earlier in this command"),
        "{j}"
    );
    assert_eq!(j["devices"][0]["checked"], false);
}

/// Spawns `keyplan ARGS` in `s` with `FAILPOINTS` set to `failpoints`, stdout and stderr
/// piped.
#[cfg(feature = "failpoints")]
fn spawn_keyplan(s: &Scratch, failpoints: &str, args: &[&str]) -> std::process::Child {
    keyplan_command()
        .current_dir(s.dir.path())
        .env("NO_COLOR", "1")
        .env("FAILPOINTS", failpoints)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn keyplan")
}

/// Starts `apply --rotate k` in `s`, held just before its KMS commit (holding the state lock)
/// for as long as the returned gate file exists; returns once it is there.
#[cfg(feature = "failpoints")]
fn rotation_held_at_commit(s: &Scratch) -> (std::path::PathBuf, std::process::Child) {
    let gate = s.path("commit.gate");
    std::fs::write(&gate, b"").unwrap();
    let child = spawn_keyplan(
        s,
        &format!("commit.before=return(wait:{})", gate.display()),
        &["apply", "--auto-approve", "--rotate", "k"],
    );
    wait_at_gate(&gate, child.id());
    (gate, child)
}

/// A run going on right now (a real `apply --rotate` held just before its KMS commit by a
/// failpoint gate, holding the state lock) is `in_progress`, not a problem: exit 0, the holder
/// named, `keyplan_run_in_progress 1`, and `keyplan_last_run_success` still describing the run
/// before it. Once it ends, it is the last run and `keyplan_run_in_progress` is 0.
#[cfg(feature = "failpoints")]
#[test]
fn apply_in_progress_is_not_unhealthy() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    s.ok(&["apply", "--auto-approve"], 0);
    let first = status_json(&s, 0);
    let first_run = first["last_run"]["id"].clone();

    // The run is held at its commit for as long as the gate file exists (it was held by a
    // fixed sleep once, and a slow machine's status calls outlasted it).
    let (gate, child) = rotation_held_at_commit(&s);

    let j = status_json(&s, 0);
    assert_eq!(j["healthy"], true, "{j}");
    assert_eq!(j["last_run"]["outcome"], "in_progress", "{j}");
    assert_ne!(j["last_run"]["id"], first_run);
    assert_eq!(j["last_run"]["ended_at"], serde_json::Value::Null);
    let holder = j["last_run"]["holder"].as_str().unwrap().to_string();
    assert!(
        holder.starts_with(&format!("pid {} on host ", child.id())),
        "{holder}"
    );
    let text = s.ok(&["status"], 0);
    assert!(
        text.contains(&format!("(in progress ({holder})), started ")),
        "{text}"
    );
    assert!(!text.contains("UNHEALTHY"), "{text}");
    let m = prometheus(&s, 0);
    assert_eq!(m["keyplan_run_in_progress"], 1.0);
    assert_eq!(
        m["keyplan_last_run_success"], 1.0,
        "the first run succeeded"
    );
    assert_eq!(m["keyplan_status_healthy"], 1.0);

    std::fs::remove_file(&gate).unwrap();
    let out = child.wait_with_output().expect("wait for apply");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = status_json(&s, 0);
    assert_eq!(j["last_run"]["outcome"], "success", "{j}");
    assert!(j["last_run"].get("holder").is_none(), "{j}");
    let m = prometheus(&s, 0);
    assert_eq!(m["keyplan_run_in_progress"], 0.0);
    assert_eq!(m["keyplan_last_run_success"], 1.0);
    assert_eq!(
        m[r#"keyplan_key_current_version{key="k",kms="local"}"#],
        2.0
    );
}

/// A run that ends while `status` looks (after status read the journal and observed the
/// device mid-rotation, before it looked at the state lock) is not reported `unfinished` nor
/// its device drifted: status sees the journal moved and looks again, and reports the run's
/// success with the device as the run left it. Once, a status call that outlasted a run's end
/// reported "last run ... unfinished" (exit 1) for a run that had succeeded.
#[cfg(feature = "failpoints")]
#[test]
fn a_run_ending_while_status_looks_is_not_unfinished() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    s.ok(&["apply", "--auto-approve"], 0);

    let (commit, apply) = rotation_held_at_commit(&s);
    let look = s.path("status.gate");
    std::fs::write(&look, b"").unwrap();
    let status = spawn_keyplan(
        &s,
        &format!("status.after_observe=return(wait:{})", look.display()),
        &["status", "--format", "json"],
    );
    // status has read the journal (the run in progress) and observed the device (v1 and the
    // staged v2 both in keyslots); now the run ends, then status goes on.
    wait_at_gate(&look, status.id());
    std::fs::remove_file(&commit).unwrap();
    let out = apply.wait_with_output().expect("wait for apply");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(&look).unwrap();
    let out = status.wait_with_output().expect("wait for status");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(out.status.code(), Some(0), "{j}");
    assert_eq!(j["verdict"], "healthy", "{j}");
    assert_eq!(j["last_run"]["outcome"], "success", "{j}");
    assert_eq!(j["problems"], serde_json::json!([]), "{j}");
    assert_eq!(j["unchecked"], serde_json::json!([]), "{j}");
    assert_eq!(j["devices"][0]["drifted"], false, "{j}");
    assert_eq!(j["keys"][0]["current"]["version"], 2, "{j}");
}

/// A run killed before its end record (SIGKILL at a failpoint) leaves the lock free: it is
/// `unfinished`, unhealthy (exit 1), `keyplan_last_run_success 0`, not in progress.
#[cfg(feature = "failpoints")]
#[test]
fn killed_run_is_unfinished() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    s.ok(&["apply", "--auto-approve"], 0);
    let out = keyplan_command()
        .current_dir(s.dir.path())
        .env("NO_COLOR", "1")
        .env("FAILPOINTS", "step.before_effect=1*off->return")
        .args(["apply", "--auto-approve", "--rotate", "k"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0), "the failpoint killed it");
    let j = status_json(&s, 1);
    assert_eq!(j["last_run"]["outcome"], "unfinished", "{j}");
    assert!(j["last_run"].get("holder").is_none(), "{j}");
    let m = prometheus(&s, 1);
    assert_eq!(m["keyplan_run_in_progress"], 0.0);
    assert_eq!(m["keyplan_last_run_success"], 0.0);
}

#[test]
fn prometheus_parser_rejects_bad_text() {
    let bad = [
        "keyplan_x 1\n",                                 // no TYPE
        "# HELP a h\n# TYPE a gauge\na{l=\"x\ny\"} 1\n", // raw newline (split line)
        "# HELP a h\n# TYPE a gauge\na{l=\"\\q\"} 1\n",  // bad escape
        "# HELP a h\n# TYPE a gauge\na 1\na 2\n",        // repeated sample
    ];
    for b in bad {
        assert!(
            std::panic::catch_unwind(|| parse_prometheus(b)).is_err(),
            "accepted {b:?}"
        );
    }
    let ok = parse_prometheus("# HELP a h\n# TYPE a gauge\na{l=\"x\\\"y\\\\\\n\",m=\"\"} 1\n");
    assert_eq!(ok.len(), 1);
}

/// The exit status tells what monitoring must tell apart (docs/monitoring.md, "Healthy, and
/// the exit code"): 1 when `status` found a problem, 3 when it found none but could not check
/// everything (a journal it cannot read, a plan that does not load), and 1 again when it found
/// a problem even though something else could not be checked. A report that cannot be written
/// is an error of the command: 1.
#[test]
fn exit_status_tells_a_problem_from_what_could_not_be_checked() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    s.ok(&["apply", "--auto-approve"], 0);
    status_json(&s, 0);

    // A journal that cannot be read: nothing wrong found, but the last run is unknown.
    let journal = s.path(".keyplan/journal.jsonl");
    let good = std::fs::read(&journal).unwrap();
    let mut bad = b"{not json}\n".to_vec();
    bad.extend_from_slice(&good);
    std::fs::write(&journal, &bad).unwrap();
    let j = status_json(&s, 3);
    assert_eq!(j["verdict"], "unknown");
    assert_eq!(j["healthy"], false);
    assert_eq!(j["problems"], serde_json::json!([]));
    assert!(
        j["unchecked"][0]
            .as_str()
            .unwrap()
            .contains("journal unreadable"),
        "{j}"
    );
    let text = s.ok(&["status"], 3);
    assert!(text.contains("NOT CHECKED: journal unreadable"), "{text}");
    assert!(!text.contains("UNHEALTHY"), "{text}");

    // ... and a device that is gone as well: a problem found, exit 1.
    std::fs::rename(s.path("a.img"), s.path("a.moved")).unwrap();
    let j = status_json(&s, 1);
    assert_eq!(j["verdict"], "problem");
    assert_eq!(j["devices"][0]["drift"][0]["kind"], "unreadable", "{j}");
    assert!(!j["unchecked"].as_array().unwrap().is_empty(), "{j}");
    std::fs::rename(s.path("a.moved"), s.path("a.img")).unwrap();
    std::fs::write(&journal, &good).unwrap();
    status_json(&s, 0);

    // The report cannot be written: an error of the command, 1.
    let out = s.keyplan(&[
        "status",
        "--format",
        "prometheus",
        "-o",
        "no/such/dir/k.prom",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot write the status to"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A plan that does not load: 3, nothing on stdout.
    s.plan("keyplan.yaml", "version: 1\nkeys: {k: {kms: nowhere}}\n");
    let out = s.keyplan(&["status", "--format", "json"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nowhere"));
}

/// What stops the observation is a problem when something is wrong (a keyslot pinned beyond a
/// LUKS1 device's eight, two plan devices that are one LUKS device): exit 1, not 3.
#[test]
fn an_observation_stopped_by_a_wrong_plan_is_a_problem() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks1");
    s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local }}\ndevices:\n  a: {{ path: a.img, keys: [{{ key: k, keyslot: 9 }}], enroll_with: initial.pass }}\n{FAST_PBKDF}"
        ),
    );
    let j = status_json(&s, 1);
    assert_eq!(j["verdict"], "problem");
    assert!(
        j["problems"][0]
            .as_str()
            .unwrap()
            .contains("keyslot 9 is out of range"),
        "{j}"
    );
    assert_eq!(j["devices"][0]["checked"], false);
}

/// A KMS that answers with damaged data (a corrupt `meta.json`) lost the key: a problem (1),
/// not something that could not be checked.
#[test]
fn a_kms_with_damaged_data_is_a_problem() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    s.ok(&["apply", "--auto-approve"], 0);
    std::fs::write(s.path("keys/k/meta.json"), b"{ not json").unwrap();
    let j = status_json(&s, 1);
    assert_eq!(j["verdict"], "problem");
    assert_eq!(j["keys"][0]["readable"], false);
    assert!(
        j["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().contains("meta.json is not valid")),
        "{j}"
    );
}

/// The bytes of `img` from `offset`, `len` of them.
fn bytes_at(img: &std::path::Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(img).expect("open image");
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, offset).expect("read image");
    b
}

/// Writes `bytes` at `offset` of `img`.
fn put_at(img: &std::path::Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(img)
        .expect("open image for writing");
    f.write_all_at(bytes, offset).expect("write image");
}

/// `status` during a run that is writing a LUKS2 header (issue 29): cryptsetup writes the
/// primary copy, then the secondary, each first without its checksum, so a read between its
/// writes sees copies that disagree. The in-between states are built directly from two real
/// header states (before and after a `cryptsetup config --label` write) while the test holds
/// the state lock as a run does: the primary one seqid ahead of the secondary, the secondary
/// written without its checksum yet, the primary written without its checksum yet. Each is a
/// write in progress (exit 0, `header_write_in_progress` naming the lock holder, no
/// `header_damage`); the same images without the lock held are damage (exit 1). Copies that
/// no write leaves (the secondary ahead of the primary, a flipped byte) are damage even under
/// the lock.
#[test]
fn a_header_write_in_progress_is_not_damage() {
    let s = Scratch::new();
    s.initial_pass();
    let img = s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    s.ok(&["apply", "--auto-approve"], 0);
    status_json(&s, 0);
    let hdr_size = u64::from_be_bytes(bytes_at(&img, 8, 8).try_into().expect("8 bytes"));
    let len = hdr_size as usize;
    let before = std::fs::read(&img).expect("read image");
    let out = std::process::Command::new("cryptsetup")
        .args(["config", "--label", "being-written"])
        .arg(&img)
        .output()
        .expect("cryptsetup config");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = std::fs::read(&img).expect("read image");
    let (old_primary, old_secondary) = (&before[..len], &before[len..2 * len]);
    let (new_primary, new_secondary) = (&after[..len], &after[len..2 * len]);
    let unsummed = |copy: &[u8]| {
        let mut c = copy.to_vec();
        c[448..512].fill(0);
        c
    };
    let writes: [(&str, Vec<u8>, Vec<u8>); 3] = [
        (
            "between the two copies",
            new_primary.to_vec(),
            old_secondary.to_vec(),
        ),
        (
            "writing the secondary",
            new_primary.to_vec(),
            unsummed(new_secondary),
        ),
        (
            "writing the primary",
            unsummed(new_primary),
            old_secondary.to_vec(),
        ),
    ];
    let state_dir = s.path(".keyplan");
    for (name, primary, secondary) in &writes {
        put_at(&img, 0, primary);
        put_at(&img, hdr_size, secondary);
        let lock = hold_state_lock(&state_dir);
        let j = status_json(&s, 0);
        assert!(
            j["devices"][0].get("header_damage").is_none(),
            "{name}: {j}"
        );
        let w = j["devices"][0]["header_write_in_progress"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no write in progress reported: {j}"));
        assert!(
            w.contains(&format!("pid {} on host", std::process::id())),
            "{name}: {w}"
        );
        let text = s.ok(&["status"], 0);
        assert!(
            text.contains("header: the LUKS2 header copies differ"),
            "{name}: {text}"
        );
        let m = prometheus(&s, 0);
        assert_eq!(
            m[r#"keyplan_device_header_damage{device="a"}"#], 0.0,
            "{name}"
        );
        drop(lock);
        let j = status_json(&s, 1);
        assert!(
            j["devices"][0]["header_damage"]
                .as_array()
                .is_some_and(|a| !a.is_empty()),
            "{name} without the lock: {j}"
        );
        assert!(
            j["devices"][0].get("header_write_in_progress").is_none(),
            "{j}"
        );
    }
    // Shapes no write leaves: damage, lock or not.
    let mut flipped = new_secondary.to_vec();
    flipped[4096 + 10] ^= 0x20;
    let damaged: [(&str, &[u8], &[u8]); 2] = [
        ("secondary ahead of the primary", old_primary, new_secondary),
        (
            "a flipped byte in the secondary's JSON",
            new_primary,
            &flipped,
        ),
    ];
    for (name, primary, secondary) in damaged {
        put_at(&img, 0, primary);
        put_at(&img, hdr_size, secondary);
        let _lock = hold_state_lock(&state_dir);
        let j = status_json(&s, 1);
        assert!(
            j["devices"][0]["header_damage"]
                .as_array()
                .is_some_and(|a| !a.is_empty()),
            "{name}: {j}"
        );
    }
    // The header as the write left it: healthy.
    std::fs::write(&img, &after).expect("restore the image");
    status_json(&s, 0);
}

/// A run at work has changed a device halfway (after its commit, before its kill: the device
/// holds two versions): while that run holds the state lock, the device's drift is listed as
/// `being_changed` and is not a problem (exit 0); once no run holds the lock, the same state is
/// a problem (the unfinished run, the drift). The in-between state is made by killing an apply
/// right before its kill step, the live run by the test holding the state lock.
#[test]
#[cfg(feature = "failpoints")]
fn drift_of_a_run_at_work_is_not_a_problem() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan_text("30d", ""));
    s.ok(&["apply", "--auto-approve"], 0);
    // A one-device rotation runs stage, add, verify, commit, kill: die before the fifth.
    let out = keyplan_command()
        .current_dir(s.dir.path())
        .env("FAILPOINTS", "step.before_effect=4*off->return")
        .args(["apply", "--auto-approve", "--rotate", "k"])
        .output()
        .expect("run apply");
    assert_eq!(out.status.code(), None, "killed before the kill step");
    let j = status_json(&s, 1);
    let kinds: Vec<&str> = j["devices"][0]["drift"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["stale_version"], "{j}");
    assert_eq!(j["last_run"]["outcome"], "unfinished", "{j}");

    let lock = keyplan::journal::StateLock::acquire(&s.path(".keyplan")).expect("the state lock");
    let j = status_json(&s, 0);
    assert_eq!(j["last_run"]["outcome"], "in_progress", "{j}");
    assert_eq!(j["devices"][0]["drifted"], false, "{j}");
    assert!(
        j["devices"][0]["being_changed"]
            .as_str()
            .is_some_and(|t| t.contains("in progress")),
        "{j}"
    );
    drop(lock);
    status_json(&s, 1);
    s.ok(&["apply", "--auto-approve"], 0);
    status_json(&s, 0);
}
