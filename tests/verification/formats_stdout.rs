//! Fixtures of the documents keyplan prints for programs and of saved plans
//! (docs/formats.md, "Documents for programs"), made by the real keyplan on a small example: one
//! LUKS2 image (16 KiB metadata), the file KMS, one key. `validate --json`, `plan --json`,
//! `show --json`, `status --format json`, `journal --json` and `key holders --json` are run
//! again by today's keyplan and, with what varies between runs normalized (the scratch
//! directory, Unix times, run ids, process ids, the host name), must reproduce their fixtures
//! byte for byte. The saved plan (whose digests hash the random LUKS UUID and salts) is read
//! back from its fixture and written again byte for byte; a saved plan of a newer major
//! version is refused by `apply` with `format::NewerFormat`'s message, and nothing is written.

use std::path::Path;

use super::formats_published::{fixture, same_as_fixture, without_help};
use crate::common::*;

/// The scratch directory's path in every fixture.
const EXAMPLE_DIR: &str = "/example";

const PLAN: &str = "version: 1
state_dir: state
kms:
  local: { provider: file, path: keys }
keys:
  k: { kms: local }
devices:
  a: { path: a.img, keys: [k], enroll_with: initial.pass }
settings:
  pbkdf: { type: pbkdf2, iterations: 1000 }
  parallelism: 4
";

/// `text` with what varies between runs replaced: the scratch directory by [`EXAMPLE_DIR`],
/// Unix times (ten digits from 1600000000) by 1700000000, run ids by `1700000000-1`, `"pid"`
/// values by 1, the host name by `host`, this keyplan's version by `X.Y.Z`, KDF salts by `c2FsdA==`, ages by 0, and the first `"digest"` (the saved plan's digest of
/// the state in `show --json`) by zeros.
fn normalize(text: &str, dir: &Path) -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let text = text
        .replace(&dir.display().to_string(), EXAMPLE_DIR)
        .replace(&format!("\"{host}:"), "\"host:")
        .replace(&format!("\"host\": \"{host}\""), "\"host\": \"host\"")
        .replace(
            &format!("\"keyplan_version\": \"{}\"", env!("CARGO_PKG_VERSION")),
            "\"keyplan_version\": \"X.Y.Z\"",
        );
    // The saved plan's digest of the state (`show --json`): it hashes the random LUKS UUID.
    let text = match text.split_once("\"digest\": \"") {
        Some((before, after)) if after.len() > 64 => {
            format!("{before}\"digest\": \"{}{}", "0".repeat(64), &after[64..])
        }
        _ => text,
    };
    // KDF salts (random per keyslot) and ages (a second may pass between two commands).
    let text = values(&text, "salt\": \"", '"', "c2FsdA==");
    let text = values(&text, "age_seconds\": ", ',', "0");
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find(|c: char| c.is_ascii_digit()) {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        let len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(len);
        let unix_time =
            len == 10 && (b'6'..=b'9').contains(&number.as_bytes()[1]) && number.starts_with('1');
        if out.ends_with("\"pid\": ") {
            out.push('1');
        } else if unix_time {
            out.push_str("1700000000");
            // A run id: `<time>-<pid>`.
            if let Some(pid) = after
                .strip_prefix('-')
                .filter(|a| a.starts_with(|c: char| c.is_ascii_digit()))
            {
                let n = pid.find(|c: char| !c.is_ascii_digit()).unwrap_or(pid.len());
                out.push_str("-1");
                rest = &pid[n..];
                continue;
            }
        } else {
            out.push_str(number);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `text` with every value after `key` (up to `end` or the end of the line) replaced by `with`.
fn values(text: &str, key: &str, end: char, with: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(key) {
        out.push_str(&rest[..at + key.len()]);
        rest = &rest[at + key.len()..];
        let len = rest.find([end, '\n']).unwrap_or(rest.len());
        out.push_str(with);
        rest = &rest[len..];
    }
    out.push_str(rest);
    out
}

fn stdout(out: &std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "keyplan {what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// The example: the plan, the initial passphrase and one small LUKS2 image.
fn example() -> Scratch {
    let s = Scratch::new();
    s.initial_pass();
    s.plan("keyplan.yaml", PLAN);
    s.small_image("a.img", "luks2");
    s
}

#[test]
fn stdout_documents_of_a_small_example_are_reproduced_byte_for_byte() {
    let s = example();
    let dir = s.dir.path().to_path_buf();
    let run = |args: &[&str]| normalize(&stdout(&s.keyplan(args), &args.join(" ")), &dir);
    let validate = run(&["validate", "--json", "-f", "keyplan.yaml"]);
    same_as_fixture("validate-json/v1/valid-1.0.json", &validate);
    let plan = run(&["plan", "--json", "-f", "keyplan.yaml", "-o", "saved.json"]);
    same_as_fixture("plan-json/v1/plan-1.0.json", &plan);
    let saved = normalize(
        &std::fs::read_to_string(s.path("saved.json")).unwrap(),
        &dir,
    );
    // The saved plan's digests differ in every run (LUKS UUID, salts): only a first one is
    // kept (KEYPLAN_WRITE_FIXTURES=1), and read back below.
    if !fixture("saved-plan/v1/saved-1.0.json").exists() {
        same_as_fixture("saved-plan/v1/saved-1.0.json", &saved);
    }
    let show = run(&["show", "--json", "saved.json"]);
    same_as_fixture("plan-json/v1/show-1.0.json", &show);
    stdout(
        &s.keyplan(&["apply", "-f", "keyplan.yaml", "saved.json"]),
        "apply",
    );
    let status = run(&["status", "--format", "json", "-f", "keyplan.yaml"]);
    same_as_fixture("status-json/v1/status-1.4.json", &status);
    let metrics = run(&["status", "--format", "prometheus", "-f", "keyplan.yaml"]);
    // A key's age: a second may pass between two commands.
    let metrics: String = without_help(&metrics)
        .lines()
        .map(|l| match l.rsplit_once(' ') {
            Some((name, _)) if l.starts_with("keyplan_key_age_seconds") => format!("{name} 0\n"),
            _ => format!("{l}\n"),
        })
        .collect();
    same_as_fixture("status-metrics/v1/metrics.prom", &metrics);
    assert!(
        metrics.contains("keyplan_key_current_version{key=\"k\",kms=\"local\"} 1"),
        "{metrics}"
    );
    let journal = run(&["journal", "--json", "-f", "keyplan.yaml"]);
    same_as_fixture("journal-json/v1/journal-1.0.json", &journal);
    let holders = run(&["key", "holders", "k", "--json", "-f", "keyplan.yaml"]);
    same_as_fixture("holders-json/v1/holders-1.0.json", &holders);

    // What programs read from them, as docs/commands.md and docs/monitoring.md describe.
    let doc = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
    assert_eq!(doc(&validate)["valid"], true);
    let plan = doc(&plan);
    assert_eq!(plan["changes_present"], true);
    assert_eq!(plan["changes"][1]["address"], "device.a.keyslot[1]");
    assert_eq!(plan["steps"][2]["op"], "add_keyslot");
    assert_eq!(doc(&show)["stale"], false);
    let status = doc(&status);
    assert_eq!(status["verdict"], "healthy");
    assert_eq!(status["keys"][0]["current"]["version"], 1);
    assert_eq!(doc(&journal)["runs"][0]["outcome"], "success");
    assert_eq!(
        doc(&holders)["holders"][0]["holder"],
        format!("host:{EXAMPLE_DIR}/state")
    );
}

#[test]
fn an_invalid_plan_s_validate_document_is_reproduced() {
    let s = Scratch::new();
    s.plan("keyplan.yaml", &PLAN.replace("keys: [k]", "keys: [nope]"));
    let out = s.keyplan(&["validate", "--json", "-f", "keyplan.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let text = normalize(&String::from_utf8(out.stdout).unwrap(), s.dir.path());
    same_as_fixture("validate-json/v1/invalid-1.0.json", &text);
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["valid"], false);
    assert_eq!(doc["diagnostics"][0]["severity"], "error");
    assert_eq!(doc["diagnostics"][0]["range"]["filename"], "keyplan.yaml");
}

#[test]
fn saved_plan_v1_is_read_and_written_byte_for_byte() {
    let path = fixture("saved-plan/v1/saved-1.0.json");
    let saved = keyplan::saved::read(&path).unwrap();
    assert_eq!(saved.kind, keyplan::saved::KIND);
    assert_eq!(saved.format_version, "1.0");
    assert_eq!(
        saved.plan_file.path,
        Path::new(EXAMPLE_DIR).join("keyplan.yaml")
    );
    assert_eq!(
        saved.plan_file.sha256,
        keyplan::saved::sha256_hex(PLAN.as_bytes())
    );
    assert_eq!(saved.steps.len(), 4);
    let diff = saved.diff().unwrap();
    assert_eq!(diff.keys.len(), 1);
    assert_eq!(diff.slots.len(), 1);
    assert_eq!(diff.graph.len(), 4);
    let out = tempfile::tempdir().unwrap();
    let again = out.path().join("saved.json");
    keyplan::saved::write(&again, &saved).unwrap();
    same_as_fixture(
        "saved-plan/v1/saved-1.0.json",
        &std::fs::read_to_string(&again).unwrap(),
    );
}

#[test]
fn a_saved_plan_of_a_newer_major_version_is_refused_and_nothing_is_written() {
    let s = example();
    std::fs::copy(
        fixture("saved-plan/v2/saved-2.0.json"),
        s.path("newer.json"),
    )
    .unwrap();
    let before = walk(s.dir.path());
    let header = luks2_json(&s.path("a.img"));
    let out = s.keyplan(&["apply", "-f", "keyplan.yaml", "newer.json"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(out.status.code(), Some(0), "{text}");
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("is saved-plan format 2.0, written by a newer keyplan"),
        "{text}"
    );
    assert!(
        flat.contains("reads saved-plan formats up to 1.x"),
        "{text}"
    );
    assert_eq!(walk(s.dir.path()), before, "nothing is written");
    assert!(!s.path("state").exists() && !s.path("keys").exists());
    assert_eq!(luks2_json(&s.path("a.img")), header);
    // `show` refuses it the same way.
    let out = s.keyplan(&["show", "newer.json"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("written by a newer keyplan"));
}
