//! The JSON Schema of plan format v1 (`schemas/keyplan-plan-v1.schema.json`): generated from
//! the Rust model, kept up to date, accepted by every bundled plan, and strict enough to catch
//! the usual mistakes (so it is not vacuous).
//!
//! Regenerate the committed file with `KEYPLAN_UPDATE_SCHEMA=1 cargo test --test cli schema::`.

use std::path::{Path, PathBuf};

use crate::common::keyplan_in;
use serde_json::Value;

const SCHEMA_FILE: &str = "schemas/keyplan-plan-v1.schema.json";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The schema as generated now, pretty-printed with a final newline (the committed form).
fn generated() -> String {
    let mut text = serde_json::to_string_pretty(&keyplan::spec::model::plan_schema())
        .expect("schema serializes");
    text.push('\n');
    text
}

fn committed() -> Value {
    let text = std::fs::read_to_string(root().join(SCHEMA_FILE)).expect("read committed schema");
    serde_json::from_str(&text).expect("committed schema is JSON")
}

fn validator() -> jsonschema::Validator {
    jsonschema::validator_for(&committed()).expect("the schema compiles")
}

/// A plan file (YAML or TOML, by extension) as a JSON value.
fn plan_value(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("read plan");
    if path.extension().and_then(|e| e.to_str()) == Some("toml") {
        toml::from_str(&text).expect("TOML plan parses")
    } else {
        serde_saphyr::from_str(&text).expect("YAML plan parses")
    }
}

fn yaml_value(text: &str) -> Value {
    serde_saphyr::from_str(text).expect("YAML parses")
}

/// The schema's complaints about `value`, as `instance path: message` lines.
fn errors(value: &Value) -> Vec<String> {
    validator()
        .iter_errors(value)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

fn bundled_plans() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in ["plans", "examples/quickstart"] {
        for e in std::fs::read_dir(root().join(dir)).expect("read dir") {
            let p = e.expect("dir entry").path();
            if matches!(
                p.extension().and_then(|x| x.to_str()),
                Some("yaml" | "yml" | "toml")
            ) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn committed_schema_is_up_to_date() {
    let path = root().join(SCHEMA_FILE);
    let now = generated();
    if std::env::var_os("KEYPLAN_UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &now).expect("write schema");
        return;
    }
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    if old != now {
        let first = old
            .lines()
            .zip(now.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(old.lines().count().min(now.lines().count()));
        panic!(
            "{SCHEMA_FILE} is out of date with src/spec/model.rs (first difference at line {}:\n  committed: {:?}\n  generated: {:?})\nregenerate it with `KEYPLAN_UPDATE_SCHEMA=1 cargo test --test cli schema::` and commit it",
            first + 1,
            old.lines().nth(first).unwrap_or("<end of file>"),
            now.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}

#[test]
fn schema_names_format_version_1() {
    let s = committed();
    assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
    assert_eq!(s["$id"], "urn:keyplan:plan-format:1");
    assert_eq!(s["title"], "keyplan plan file, format version 1");
    assert_eq!(s["additionalProperties"], false);
    assert_eq!(s["properties"]["version"]["const"], 1);
    // Doc comments became descriptions.
    assert!(s["properties"]["state_dir"]["description"]
        .as_str()
        .unwrap()
        .contains("journal"));
}

#[test]
fn every_bundled_plan_matches_the_schema_and_validates() {
    let plans = bundled_plans();
    assert!(plans.len() >= 5, "{plans:?}");
    assert!(plans
        .iter()
        .any(|p| p.ends_with("plans/database-server.toml")));
    for p in &plans {
        let errs = errors(&plan_value(p));
        assert!(errs.is_empty(), "{}: {errs:#?}", p.display());
        let out = keyplan_in(root(), &["validate", "-f", p.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}: {}",
            p.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn yaml_plans_point_yaml_language_server_at_the_schema() {
    for p in bundled_plans() {
        if p.extension().and_then(|e| e.to_str()) == Some("toml") {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let first = text.lines().next().unwrap_or("");
        let dir = p.parent().unwrap();
        let rel = first
            .strip_prefix("# yaml-language-server: $schema=")
            .unwrap_or_else(|| panic!("{}: first line is {first:?}", p.display()));
        assert!(
            dir.join(rel).is_file() && rel.ends_with("schemas/keyplan-plan-v1.schema.json"),
            "{}: $schema={rel} does not name the schema",
            p.display()
        );
    }
}

const GOOD: &str = "version: 1
kms:
  local: { provider: file, path: keys }
keys:
  k: { kms: local, rotate_after: 1w 3d, bytes: 16 }
devices:
  d:
    path: d.img
    keys: [k, { key: k, keyslot: 31 }]
    unmanaged_keyslots: remove
settings:
  pbkdf: { type: pbkdf2, iterations: 1000 }
  parallelism: 1
";

/// `GOOD` with `from` replaced by `to` (which must occur).
fn mutated(from: &str, to: &str) -> Value {
    assert!(GOOD.contains(from), "{from:?}");
    yaml_value(&GOOD.replacen(from, to, 1))
}

#[test]
fn schema_accepts_the_base_plan() {
    assert_eq!(errors(&yaml_value(GOOD)), Vec::<String>::new());
}

/// Each typical mistake is refused by the schema, with the error at the expected place.
#[test]
fn schema_rejects_typical_mistakes() {
    let cases: &[(&str, &str, &str)] = &[
        // unknown fields, at every level
        ("version: 1\n", "version: 1\nstatedir: x\n", ""),
        ("path: keys }", "path: keys, mount: x }", "/kms/local"),
        ("bytes: 16 }", "bytes: 16, rotate: 1d }", "/keys/k"),
        (
            "    path: d.img",
            "    path: d.img\n    luks: 2",
            "/devices/d",
        ),
        (
            "keyslot: 31 }",
            "keyslot: 31, slot: 1 }",
            "/devices/d/keys/1",
        ),
        ("parallelism: 1", "paralellism: 1", "/settings"),
        // wrong provider, and a field of another provider
        ("provider: file", "provider: files", "/kms/local"),
        (
            "provider: file, path: keys",
            "provider: vault, path: keys",
            "/kms/local",
        ),
        // bad values
        ("version: 1", "version: 2", "/version"),
        ("bytes: 16", "bytes: 8", "/keys/k/bytes"),
        ("bytes: 16", "bytes: 1024", "/keys/k/bytes"),
        (
            "rotate_after: 1w 3d",
            "rotate_after: 3 months",
            "/keys/k/rotate_after",
        ),
        (
            "rotate_after: 1w 3d",
            "rotate_after: 90",
            "/keys/k/rotate_after",
        ),
        ("keyslot: 31", "keyslot: 32", "/devices/d/keys/1"),
        (
            "unmanaged_keyslots: remove",
            "unmanaged_keyslots: kill",
            "/devices/d/unmanaged_keyslots",
        ),
        ("parallelism: 1", "parallelism: 0", "/settings/parallelism"),
        ("type: pbkdf2", "type: scrypt", "/settings/pbkdf"),
        ("iterations: 1000", "iterations: 999", "/settings/pbkdf"),
        ("path: d.img", "path: ' '", "/devices/d/path"),
        ("path: keys }", "path: '' }", "/kms/local"),
        ("keys: [k,", "keys: [7.5,", "/devices/d/keys/0"),
        ("  d:\n", "  d/x:\n", "/devices"),
        // missing required fields
        (
            "local: { provider: file, path: keys }",
            "local: { provider: file }",
            "/kms/local",
        ),
        ("k: { kms: local,", "k: {", "/keys/k"),
    ];
    let mut missed = Vec::new();
    for (from, to, at) in cases {
        let errs = errors(&mutated(from, to));
        if !errs.iter().any(|e| e.starts_with(&format!("{at}: "))) {
            missed.push(format!(
                "{to:?}: expected a schema error at {at:?}, got {errs:#?}"
            ));
        }
    }
    assert!(missed.is_empty(), "{}", missed.join("\n"));
    // Argon2 limits differ from PBKDF2's.
    let argon = |pbkdf: &str| mutated("{ type: pbkdf2, iterations: 1000 }", pbkdf);
    assert!(errors(&argon("{ type: argon2id, iterations: 4, memory_kib: 32 }")).is_empty());
    assert!(!errors(&argon("{ type: argon2id, iterations: 3 }")).is_empty());
    assert!(!errors(&argon("{ type: argon2i, memory_kib: 16 }")).is_empty());
    assert!(!errors(&argon("{ type: argon2id, memory_kib: 4194305 }")).is_empty());
    assert!(!errors(&argon("{ type: argon2id, parallel: 0 }")).is_empty());
    assert!(!errors(&argon("{ iterations: 1000 }")).is_empty());
    // Settings that mean nothing, as `keyplan validate` refuses them.
    assert!(!errors(&argon(
        "{ type: pbkdf2, iterations: 1000, memory_kib: 65536 }"
    ))
    .is_empty());
    assert!(!errors(&argon("{ type: pbkdf2, iterations: 1000, parallel: 2 }")).is_empty());
    assert!(!errors(&argon(
        "{ type: argon2id, iterations: 4, iter_time_ms: 2000 }"
    ))
    .is_empty());
    assert!(errors(&argon(
        "{ type: argon2id, memory_kib: 65536, iter_time_ms: 2000 }"
    ))
    .is_empty());
}
