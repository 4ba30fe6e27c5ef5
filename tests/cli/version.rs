//! `keyplan version [--json]` and `keyplan --version`, on the real binary: the release, the
//! commit it was built from (the repository's `git rev-parse HEAD`, as build.rs read it), the
//! target, and the formats it writes and reads (`keyplan::format::all()`).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::common::keyplan_command;

/// Runs keyplan with `args`; checks exit 0 and an empty stderr; returns stdout.
fn keyplan_ok(args: &[&str]) -> String {
    let out = keyplan_command()
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run keyplan");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "keyplan {args:?}: {stderr}");
    assert!(stderr.is_empty(), "keyplan {args:?}: stderr: {stderr}");
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// `git ARGS` in the repository the binary was built from; `None` when git is missing or the
/// crate is not a git work tree (a source tarball), where the binary says `unknown`.
fn git(args: &[&str]) -> Option<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The commit and dirty state build.rs should have seen: HEAD, and whether the binary's
/// sources differ from it.
fn expected_build() -> (Option<String>, Option<bool>) {
    let Some(commit) = git(&["rev-parse", "HEAD"]) else {
        return (None, None);
    };
    let status = git(&[
        "status",
        "--porcelain",
        "--untracked-files=no",
        "--",
        "src",
        "build.rs",
        "Cargo.toml",
        "Cargo.lock",
    ]);
    (Some(commit), status.map(|s| !s.is_empty()))
}

#[test]
fn version_json_names_the_release_the_commit_and_the_formats() {
    let stdout = keyplan_ok(&["version", "--json"]);
    assert!(
        stdout.starts_with("{\n  \"format_version\": \"1.0\","),
        "{stdout}"
    );
    let doc: Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(doc["name"], "keyplan");
    assert_eq!(doc["version"], env!("CARGO_PKG_VERSION"));

    let (commit, dirty) = expected_build();
    match &commit {
        Some(commit) => {
            assert_eq!(doc["commit"], commit.as_str(), "{doc:#}");
            assert_eq!(commit.len(), 40, "a full hash: {commit}");
        }
        None => assert!(doc["commit"].is_null(), "{doc:#}"),
    }
    assert_eq!(doc["dirty"].as_bool(), dirty, "{doc:#}");

    // The host triple this test runs on: tests build keyplan for the host.
    let target = doc["target"].as_str().expect("target");
    assert!(target.split('-').count() >= 3, "{target}");
    assert!(target.contains(std::env::consts::ARCH), "{target}");
    assert!(
        doc["rustc"]
            .as_str()
            .unwrap_or_default()
            .starts_with("rustc "),
        "{doc:#}"
    );
    assert!(["debug", "release"].contains(&doc["profile"].as_str().unwrap_or_default()));
    let features = doc["features"].as_array().expect("features");
    assert_eq!(
        features.iter().any(|f| f == "failpoints"),
        cfg!(feature = "failpoints"),
        "{doc:#}"
    );

    // Every format the library lists, in its order, each with a name, the version written,
    // the versions read and its home: nothing else.
    let formats = doc["formats"].as_array().expect("formats");
    let listed = keyplan::format::all();
    assert_eq!(formats.len(), listed.len(), "{doc:#}");
    let mut names = BTreeSet::new();
    for (shown, f) in formats.iter().zip(&listed) {
        let fields: BTreeSet<&str> = shown
            .as_object()
            .expect("a format is an object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            fields,
            BTreeSet::from(["name", "writes", "reads", "home"]),
            "{shown}"
        );
        for field in ["name", "writes", "reads", "home"] {
            let value = shown[field].as_str().unwrap_or_default();
            assert!(!value.is_empty(), "{field} of {shown}");
        }
        assert_eq!(shown["name"], f.name);
        assert_eq!(shown["writes"], f.writes);
        assert_eq!(shown["reads"], f.reads);
        assert_eq!(shown["home"], f.home);
        assert!(names.insert(f.name), "{} listed twice", f.name);
    }
}

#[test]
fn version_text_and_the_version_flag_agree_with_the_json() {
    let doc: Value =
        serde_json::from_str(&keyplan_ok(&["version", "--json"])).expect("one JSON document");
    let version = doc["version"].as_str().expect("version");
    let target = doc["target"].as_str().expect("target");

    let text = keyplan_ok(&["version"]);
    assert!(text.starts_with(&format!("keyplan {version}\n")), "{text}");
    assert!(text.contains(&format!("\ntarget:   {target}\n")), "{text}");
    let short = match doc["commit"].as_str() {
        Some(commit) => {
            assert!(text.contains(&format!("\ncommit:   {commit}")), "{text}");
            let dirty = if doc["dirty"] == true { "-dirty" } else { "" };
            format!("{}{dirty}", &commit[..12])
        }
        None => {
            assert!(text.contains("\ncommit:   unknown"), "{text}");
            "unknown commit".to_string()
        }
    };
    let formats = doc["formats"].as_array().expect("formats");
    if formats.is_empty() {
        assert!(text.contains("Formats: none listed"), "{text}");
    }
    for f in formats {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == f["name"].as_str())
            .unwrap_or_else(|| panic!("no line for {f}: {text}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[1], f["writes"], "{line}");
        assert_eq!(words[2], f["reads"], "{line}");
    }

    // clap's --version and -V: one line, the release, the commit's first 12 digits, the target.
    let line = format!("keyplan {version} ({short}, {target})\n");
    assert_eq!(keyplan_ok(&["--version"]), line);
    assert_eq!(keyplan_ok(&["-V"]), line);
}

/// `version` takes the global options a script passes to every command, and ignores them: its
/// help does not list them, and `--state-dir` of a directory that does not exist changes
/// nothing.
#[test]
fn version_ignores_the_global_options_it_does_not_use() {
    let help = keyplan_ok(&["version", "--help"]);
    assert!(
        !help.contains("--state-dir") && !help.contains("--node") && help.contains("--json"),
        "{help}"
    );
    let plain = keyplan_ok(&["version", "--json"]);
    let with_globals = keyplan_ok(&[
        "version",
        "--json",
        "--state-dir",
        "/nonexistent/keyplan-state",
        "--node",
        "n1",
        "-q",
    ]);
    assert_eq!(plain, with_globals);
}
