//! `keyplan validate --json` (one document: `format_version`, `valid`, counts, and every
//! diagnostic with its range) and the human report of the same errors, both driven through the
//! real binary on plan files in a temp dir.

use crate::common::Scratch;
use serde_json::{json, Value};

/// Runs `validate --json -f NAME` in `s`; returns the exit code and the parsed document, after
/// checking that stderr is empty and the document starts with `format_version`.
fn validate_json(s: &Scratch, name: &str) -> (i32, Value) {
    let out = s.keyplan(&["validate", "--json", "-f", name]);
    let stdout = String::from_utf8(out.stdout).expect("UTF-8 output");
    assert!(
        out.stderr.is_empty(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("{\n  \"format_version\": \"1.0\","),
        "{stdout}"
    );
    let doc: Value = serde_json::from_str(&stdout).expect("one JSON document");
    (out.status.code().expect("exit code"), doc)
}

/// `{line, column, byte}`.
fn pos(line: u64, column: u64, byte: u64) -> Value {
    json!({ "line": line, "column": column, "byte": byte })
}

/// The (code, start, end) of every diagnostic, checking each is an error in `file`.
fn places(doc: &Value, file: &str) -> Vec<(String, Value, Value)> {
    doc["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .map(|d| {
            assert_eq!(d["severity"], "error", "{d:#}");
            assert!(!d["summary"].as_str().unwrap().is_empty(), "{d:#}");
            assert!(!d["detail"].as_str().unwrap().is_empty(), "{d:#}");
            assert_eq!(d["range"]["filename"], file, "{d:#}");
            (
                d["code"].as_str().unwrap().to_owned(),
                d["range"]["start"].clone(),
                d["range"]["end"].clone(),
            )
        })
        .collect()
}

const VALID: &str = "version: 1
kms:
  local: { provider: file, path: keys }
keys:
  k: { kms: local, rotate_after: 90d }
devices:
  d: { path: d.img, keys: [k] }
";

#[test]
fn valid_plan() {
    let s = Scratch::new();
    s.plan("keyplan.yaml", VALID);
    let (code, doc) = validate_json(&s, "keyplan.yaml");
    assert_eq!(code, 0);
    assert_eq!(
        doc,
        json!({"format_version": "1.0", "valid": true, "error_count": 0, "warning_count": 0,
               "diagnostics": []})
    );
    // The human form agrees.
    let text = s.ok(&["validate"], 0);
    assert_eq!(
        text,
        format!(
            "The plan file {} is valid: 1 KMS, 1 keys, 1 devices.\n",
            s.path("keyplan.yaml").display()
        )
    );
}

#[test]
fn yaml_syntax_error() {
    let s = Scratch::new();
    // Line 3: an unclosed flow mapping.
    s.plan(
        "plan.yaml",
        "version: 1\nkms:\n  local: { provider: file, path: keys\nkeys: {}\n",
    );
    let (code, doc) = validate_json(&s, "plan.yaml");
    assert_eq!(code, 1);
    assert_eq!(doc["valid"], false);
    assert_eq!(doc["error_count"], 1);
    assert_eq!(doc["warning_count"], 0);
    let d = &doc["diagnostics"][0];
    assert_eq!(d["code"], "keyplan::plan::syntax", "{d:#}");
    assert!(
        d["summary"].as_str().unwrap().starts_with("invalid YAML: "),
        "{d:#}"
    );
    assert_eq!(
        d["range"],
        json!({"filename": "plan.yaml", "start": pos(4, 5, 58), "end": pos(4, 6, 59)}),
        "{d:#}"
    );
    // The human report points at the same place.
    let text = s.ok(&["validate", "-f", "plan.yaml"], 1);
    assert!(text.contains("[plan.yaml:4:5]"), "{text}");
}

#[test]
fn toml_syntax_error() {
    let s = Scratch::new();
    s.plan(
        "plan.toml",
        "version = 1\n\n[kms.local]\nprovider = \"file\"\npath = keys\n",
    );
    let (code, doc) = validate_json(&s, "plan.toml");
    assert_eq!(code, 1);
    assert_eq!(doc["error_count"], 1);
    let d = &doc["diagnostics"][0];
    assert_eq!(d["code"], "keyplan::plan::syntax", "{d:#}");
    assert!(
        d["summary"].as_str().unwrap().starts_with("invalid TOML: "),
        "{d:#}"
    );
    assert_eq!(
        d["range"],
        json!({"filename": "plan.toml", "start": pos(5, 8, 50), "end": pos(5, 12, 54)}),
        "{d:#}"
    );
    let text = s.ok(&["validate", "-f", "plan.toml"], 1);
    assert!(text.contains("[plan.toml:5:8]"), "{text}");
    assert_eq!(
        &"version = 1\n\n[kms.local]\nprovider = \"file\"\npath = keys\n"[50..54],
        "keys"
    );
}

/// Seven semantic errors at once, each its own diagnostic with its own range, in file order.
/// `é` (two bytes, one character) shows that `column` counts characters.
const SEMANTIC: &str = "version: 1
kms:
  local: { provider: file, path: keys }
keys:
  k: { kms: nowhere, rotate_after: 3 months }
  é: { kms: local, bytes: 8 }
devices:
  d:
    path: d.img
    keys: [k, missing, k]
";

#[test]
fn several_semantic_errors_each_with_its_range() {
    let s = Scratch::new();
    s.plan("plan.yaml", SEMANTIC);
    let (code, doc) = validate_json(&s, "plan.yaml");
    assert_eq!(code, 1);
    assert_eq!(doc["valid"], false);
    assert_eq!(doc["error_count"], 7);
    assert_eq!(doc["warning_count"], 0);
    let got = places(&doc, "plan.yaml");
    let want = vec![
        (
            "keyplan::plan::undefined_kms",
            pos(5, 13, 74),
            pos(5, 20, 81),
        ),
        ("keyplan::plan::duration", pos(5, 36, 97), pos(5, 44, 105)),
        ("keyplan::plan::name", pos(6, 3, 110), pos(6, 4, 112)),
        ("keyplan::plan::key_name", pos(6, 3, 110), pos(6, 4, 112)),
        // Byte column 28 in the human report; character column 27.
        ("keyplan::plan::bytes", pos(6, 27, 135), pos(6, 28, 136)),
        (
            "keyplan::plan::undefined_key",
            pos(10, 15, 183),
            pos(10, 22, 190),
        ),
        (
            "keyplan::plan::duplicate_key",
            pos(10, 24, 192),
            pos(10, 25, 193),
        ),
    ];
    let want: Vec<(String, Value, Value)> = want
        .into_iter()
        .map(|(c, a, b)| (c.to_owned(), a, b))
        .collect();
    assert_eq!(got, want);
    // Every byte offset marks the text it should.
    let marked = |i: usize| {
        let (_, a, b) = &got[i];
        &SEMANTIC[a["byte"].as_u64().unwrap() as usize..b["byte"].as_u64().unwrap() as usize]
    };
    assert_eq!(marked(0), "nowhere");
    assert_eq!(marked(1), "3 months");
    assert_eq!(marked(2), "é");
    assert_eq!(marked(4), "8");
    assert_eq!(marked(5), "missing");
    assert_eq!(
        doc["diagnostics"][0]["summary"],
        "key `k` uses KMS `nowhere`, which is not defined under `kms`"
    );
    assert!(doc["diagnostics"][5]["detail"]
        .as_str()
        .unwrap()
        .contains("define `missing` under `keys`"));
}

/// The same plan, as a person sees it: a summary, then each error at `file:line:column`.
#[test]
fn several_semantic_errors_human_report() {
    let s = Scratch::new();
    s.plan("plan.yaml", SEMANTIC);
    let out = s.keyplan(&["validate", "-f", "plan.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    insta::assert_snapshot!(String::from_utf8_lossy(&out.stderr));
}

#[test]
fn unknown_field_and_bad_value_in_toml() {
    let s = Scratch::new();
    // An unknown field stops parsing: it is the only diagnostic.
    s.plan(
        "plan.toml",
        "version = 1\n[kms.local]\nprovider = \"file\"\npath = \"keys\"\nmode = \"0700\"\n",
    );
    let (code, doc) = validate_json(&s, "plan.toml");
    assert_eq!(code, 1);
    let got = places(&doc, "plan.toml");
    assert_eq!(
        got,
        vec![(
            "keyplan::plan::unknown_field".to_owned(),
            pos(5, 1, 56),
            pos(5, 5, 60)
        )]
    );
    assert!(
        doc["diagnostics"][0]["summary"]
            .as_str()
            .unwrap()
            .contains("mode"),
        "{doc:#}"
    );
    // A bad enum value.
    s.plan(
        "bad.yaml",
        "version: 1\ndevices:\n  d: { path: d.img, unmanaged_keyslots: kill }\n",
    );
    let (code, doc) = validate_json(&s, "bad.yaml");
    assert_eq!(code, 1);
    let got = places(&doc, "bad.yaml");
    assert_eq!(got.len(), 1, "{doc:#}");
    assert_eq!(got[0].1["line"], 3, "{doc:#}");
    assert_eq!(got[0].0, "keyplan::plan::bad_value");
    assert_eq!(got[0].1, pos(3, 41, 60), "{doc:#}");
    assert_eq!(got[0].2, pos(3, 45, 64), "{doc:#}");
}

#[test]
fn missing_file_has_no_range() {
    let s = Scratch::new();
    let (code, doc) = validate_json(&s, "absent.yaml");
    assert_eq!(code, 1);
    assert_eq!(doc["valid"], false);
    assert_eq!(doc["error_count"], 1);
    let d = &doc["diagnostics"][0];
    assert_eq!(d["severity"], "error");
    assert_eq!(d["code"], "keyplan::plan::read");
    assert!(d["summary"]
        .as_str()
        .unwrap()
        .starts_with("cannot read plan file absent.yaml: "));
    assert!(d.get("range").is_none(), "{d:#}");
    // No plan file in the directory at all, without -f.
    let out = s.keyplan(&["validate", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["diagnostics"][0]["code"], "keyplan::plan::not_found");
    assert!(doc["diagnostics"][0].get("range").is_none());
}

/// A file that is not a plan (e.g. `-f` pointed at a key file) is reported without quoting it,
/// in JSON too.
#[test]
fn not_a_plan_is_not_quoted() {
    let s = Scratch::new();
    s.plan("secret.yaml", "hunter2-very-secret\n");
    let out = s.keyplan(&["validate", "--json", "-f", "secret.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("hunter2"), "{text}");
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["diagnostics"][0]["code"], "keyplan::plan::not_a_plan");
}

/// For each kind of error, the human report's `[file:line:column]` and the JSON range agree
/// (the files are ASCII, so byte and character columns are equal), in YAML and TOML.
#[test]
fn human_and_json_locations_agree_for_every_kind_of_error() {
    let cases: &[(&str, &str, (u64, u64))] = &[
        // YAML syntax: a tab-indented line
        ("syntax.yaml", "version: 1\nkms:\n\tlocal: {}\n", (3, 2)),
        // TOML syntax
        ("syntax.toml", "version = 1\n[kms.local\n", (2, 11)),
        // unknown field
        ("unknown.yaml", "version: 1\nkms:\n  l: { provider: file, path: k, mode: 1 }\n", (3, 33)),
        // missing field
        ("missing.yaml", "version: 1\ndevices:\n  d: { keys: [] }\n", (3, 3)),
        // wrong provider
        ("provider.toml", "version = 1\n[kms.l]\nprovider = \"files\"\npath = \"k\"\n", (3, 12)),
        // bad value
        ("bytes.yaml", "version: 1\nkms:\n  l: { provider: file, path: k }\nkeys:\n  k: { kms: l, bytes: 600 }\n", (5, 23)),
        // dangling KMS reference
        ("kms.toml", "version = 1\n[keys.k]\nkms = \"vault\"\n", (3, 7)),
        // dangling key reference, CRLF line ends
        ("key.yaml", "version: 1\r\nkms:\r\n  l: { provider: file, path: k }\r\nkeys:\r\n  k: { kms: l }\r\ndevices:\r\n  d: { path: d.img, keys: [k, j] }\r\n", (7, 31)),
        // two keys pinned to one keyslot
        ("slot.yaml", "version: 1\nkms:\n  l: { provider: file, path: k }\nkeys:\n  a: { kms: l }\n  b: { kms: l }\ndevices:\n  d:\n    path: d.img\n    keys:\n      - { key: a, keyslot: 2 }\n      - { key: b, keyslot: 2 }\n", (12, 28)),
        // unsupported version
        ("version.yaml", "version: 2\n", (1, 10)),
    ];
    let s = Scratch::new();
    let mut wrong = Vec::new();
    for (name, text, (line, column)) in cases {
        s.plan(name, text);
        let (code, doc) = validate_json(&s, name);
        assert_eq!(code, 1, "{name}: {doc:#}");
        let start = &doc["diagnostics"][0]["range"]["start"];
        let human = s.ok(&["validate", "-f", name], 1);
        let json_at = format!("[{name}:{}:{}]", start["line"], start["column"]);
        if start["line"] != *line || start["column"] != *column || !human.contains(&json_at) {
            wrong.push(format!(
                "{name}: JSON start {start} (expected {line}:{column}), human report:\n{human}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
