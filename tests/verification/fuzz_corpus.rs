//! Replays the committed fuzz corpora (`fuzz/corpus/plan_loader/`, `fuzz/corpus/journal_reader/`,
//! `fuzz/corpus/luks_header/`)
//! through the same harnesses as the `cargo fuzz` targets, on stable Rust and without
//! cargo-fuzz: every input that once reached new code (or crashed) must still load, fail
//! cleanly, or parse without a panic. See docs/fuzzing.md.

use std::path::{Path, PathBuf};

use keyplan::fuzzing;

/// Every file of `fuzz/corpus/<target>/`, sorted by name.
fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Runs `harness` on every file of the corpus of `target`, naming the input that panics.
fn replay(target: &str, min_files: usize, harness: fn(&[u8])) {
    let files = corpus(target);
    assert!(
        files.len() >= min_files,
        "fuzz/corpus/{target} has {} files, expected at least {min_files}",
        files.len()
    );
    let mut failures = Vec::new();
    for file in &files {
        let data = std::fs::read(file).expect("reading a corpus file");
        if std::panic::catch_unwind(|| harness(&data)).is_err() {
            failures.push(file.display().to_string());
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} inputs of fuzz/corpus/{target} panicked (reproduce one with `cargo fuzz run {target} FILE` or this test):\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn plan_loader_corpus_does_not_panic() {
    replay("plan_loader", 20, fuzzing::plan_loader);
}

#[test]
fn journal_reader_corpus_does_not_panic() {
    replay("journal_reader", 10, fuzzing::journal_reader);
}

#[test]
fn luks_header_corpus_does_not_panic() {
    replay("luks_header", 6, fuzzing::luks_header);
}

#[test]
fn corpora_cover_both_plan_formats_and_real_journals() {
    let plans: Vec<Vec<u8>> = corpus("plan_loader")
        .iter()
        .map(|f| std::fs::read(f).expect("reading a corpus file"))
        .collect();
    for selector in [b'y', b't'] {
        assert!(
            plans.iter().any(|p| p.first() == Some(&selector)),
            "no plan_loader input starts with `{}`",
            selector as char
        );
    }
    let journals: Vec<Vec<u8>> = corpus("journal_reader")
        .iter()
        .map(|f| std::fs::read(f).expect("reading a corpus file"))
        .collect();
    let parsed = journals
        .iter()
        .filter_map(|j| keyplan::journal::parse(j, Path::new("journal.jsonl")).ok())
        .filter_map(|records| keyplan::journal::last_run(&records))
        .count();
    assert!(parsed > 0, "no journal_reader input holds a whole run");
}

/// `journal::parse` (which `journal::read` uses) keeps the file reader's line rules.
#[test]
fn journal_parse_line_rules() {
    use keyplan::journal::{parse, JournalError};
    let path = Path::new("journal.jsonl");
    let a = br#"{"ts":1,"run":"r","event":"run_resumed","pid":1}"#;
    let b = br#"{"ts":2,"run":"r","event":"run_end","outcome":"success"}"#;
    let lines = |parts: &[&[u8]]| parts.concat();
    let count = |bytes: &[u8]| parse(bytes, path).map(|r| r.len());

    assert_eq!(count(b"").ok(), Some(0));
    assert_eq!(count(b"\n\n  \n").ok(), Some(0));
    assert_eq!(count(&lines(&[a, b"\n", b, b"\n"])).ok(), Some(2));
    assert_eq!(
        count(&lines(&[a, b"\n", b])).ok(),
        Some(2),
        "no final newline"
    );
    // A torn last line is ignored, with or without its newline.
    assert_eq!(count(&lines(&[a, b"\n", &b[..10]])).ok(), Some(1));
    assert_eq!(count(&lines(&[a, b"\n", &b[..10], b"\n"])).ok(), Some(1));
    // Anything else that does not parse is corrupt, with its 1-based line.
    for bad in [
        lines(&[a, b"\n", &b[..10], b"\n", b, b"\n"]),
        lines(&[a, b"\n", &b[..10], b"\n\n"]),
        lines(&[a, b"\n", b"\xff\xfe", b"\n", a]),
    ] {
        match parse(&bad, path) {
            Err(JournalError::Corrupt { line, path: p, .. }) => {
                assert_eq!(line, 2);
                assert_eq!(p, path);
            }
            other => panic!("expected line 2 to be corrupt, got {other:?}"),
        }
    }
}
