//! Fuzz harnesses, shared by the `cargo fuzz` targets in `fuzz/` and by `tests/verification/fuzz_corpus.rs`,
//! which replays the committed corpora on stable Rust (see `docs/fuzzing.md`).
//!
//! Each harness takes arbitrary bytes and must never panic: errors are the expected outcome for
//! most inputs and are rendered into text, so the diagnostic code runs too. A harness panics
//! only when a property that keyplan relies on does not hold (a bug). Neither harness writes
//! anything: plans are resolved against [`FUZZ_BASE_DIR`], which does not exist, and the
//! journal is parsed from memory.

use std::path::Path;

use crate::graph::StepGraph;
use crate::journal::{self, Record};
use crate::spec::{self, Format, PathSeg, Plan};

/// Directory fuzzed plans are resolved against. It does not exist and nothing creates it: the
/// loader only resolves paths (and canonicalizes existing ones), it never writes.
pub const FUZZ_BASE_DIR: &str = "/nonexistent/keyplan-fuzz";

/// File name under which fuzzed journals are parsed (shown in errors only).
pub const FUZZ_JOURNAL_PATH: &str = "/nonexistent/keyplan-fuzz/.keyplan/journal.jsonl";

/// The `plan_loader` target: the first byte picks the format (`y`/`Y`: YAML, `t`/`T`: TOML,
/// anything else: both, which covers the format detection of [`spec::load()`] too); the rest is
/// the plan text (invalid UTF-8 replaced, so mutated inputs still reach the parsers).
///
/// Every error report is rendered with miette's graphical and narratable handlers (labels,
/// spans, related errors); every loaded plan is asked for the location of, and an
/// [`Plan::error_at`] report at, each path that names one of its fields.
pub fn plan_loader(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let formats: &[Format] = match selector {
        b'y' | b'Y' => &[Format::Yaml],
        b't' | b'T' => &[Format::Toml],
        _ => &[Format::Yaml, Format::Toml],
    };
    for &format in formats {
        let name = match format {
            Format::Yaml => "plan.yaml",
            Format::Toml => "plan.toml",
        };
        match spec::load_str(&text, name, format, Path::new(FUZZ_BASE_DIR)) {
            Ok(plan) => exercise_plan(&plan),
            Err(report) => {
                render(&report);
            }
        }
    }
}

/// Renders `report` the ways keyplan and its tests do; returns the graphical text.
fn render(report: &miette::Report) -> String {
    let mut out = String::new();
    let graphical =
        miette::GraphicalReportHandler::new_themed(miette::GraphicalTheme::unicode_nocolor())
            .with_width(80);
    // A `fmt::Error` here would be miette's own failure to render, not a panic: keep going.
    let _ = graphical.render_report(&mut out, report.as_ref());
    let mut narrated = String::new();
    let _ = miette::NarratableReportHandler::new().render_report(&mut narrated, report.as_ref());
    let _ = report.to_string();
    out
}

/// Looks up and reports at every place of a loaded plan, as `plan`/`apply` do for errors found
/// after reading the devices.
fn exercise_plan(plan: &Plan) {
    let _ = format!("{plan:?}");
    let _ = plan.format();
    let k = |s: &str| PathSeg::Key(s.to_owned());
    let mut paths: Vec<Vec<PathSeg>> = vec![
        vec![],
        vec![k("version")],
        vec![k("state_dir")],
        vec![k("settings"), k("parallelism")],
        vec![k("settings"), k("pbkdf"), k("iterations")],
    ];
    for name in plan.kms.keys() {
        paths.push(vec![k("kms"), k(name), k("path")]);
    }
    for id in plan.keys.keys() {
        for field in ["kms", "name", "rotate_after", "bytes"] {
            paths.push(vec![k("keys"), k(id), k(field)]);
        }
    }
    for (id, device) in &plan.devices {
        for field in ["path", "uuid", "enroll_with", "unmanaged_keyslots"] {
            paths.push(vec![k("devices"), k(id), k(field)]);
        }
        // One past the end too: the lookup must fall back to the nearest ancestor.
        for i in 0..=device.keys.len() {
            let entry = vec![k("devices"), k(id), k("keys"), PathSeg::Index(i)];
            paths.push([entry.clone(), vec![k("keyslot")]].concat());
            paths.push(entry);
        }
    }
    for path in &paths {
        let _ = plan.location_of(path);
        let report = plan.error_at(path, "fuzz", Some("fuzz help".to_owned()));
        render(&report);
    }
}

/// The `journal_reader` target: `data` is the content of `journal.jsonl`. It is parsed with
/// [`journal::parse`], and the last run summarized with [`journal::last_run`] and rebuilt into
/// a step graph as `apply` does to finish an interrupted run.
///
/// Panics (a bug) when records that parsed do not read back equal after being written the way
/// [`journal::Journal::append`] writes them, or when the summary's per-step vectors do not
/// match its steps.
pub fn journal_reader(data: &[u8]) {
    let path = Path::new(FUZZ_JOURNAL_PATH);
    let records = match journal::parse(data, path) {
        Ok(records) => records,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert_round_trip(&records, path);
    let Some(summary) = journal::last_run(&records) else {
        return;
    };
    let n = summary.steps.len();
    assert!(
        summary.done.len() == n && summary.started_not_done.len() == n,
        "last_run: per-step vectors do not match the {n} steps"
    );
    assert!(
        summary
            .done
            .iter()
            .zip(&summary.started_not_done)
            .all(|(done, started)| !(*done && *started)),
        "last_run: a step is both done and started-not-done"
    );
    for step in &summary.steps {
        let _ = step.to_string();
        let _ = (step.device(), step.kms_key());
    }
    let graph = StepGraph::from_parts(summary.steps.clone(), &summary.deps);
    let _ = graph.is_acyclic();
    let _ = graph.by_device();
    let _ = graph.deps();
    for i in 0..graph.len() {
        let _ = graph.step(i).to_string();
        let _ = graph.predecessors(i);
    }
}

/// Records written as [`journal::Journal::append`] writes them (one JSON object a line) must
/// parse back to the same records.
fn assert_round_trip(records: &[Record], path: &Path) {
    let mut text = Vec::new();
    for r in records {
        match journal::encode(r) {
            Ok(line) => text.extend_from_slice(line.as_bytes()),
            Err(e) => panic!("a parsed journal record cannot be written back: {e}"),
        }
        text.push(b'\n');
    }
    match journal::parse(&text, path) {
        Ok(again) => assert!(
            again == records,
            "journal records changed in a write/read round trip"
        ),
        Err(e) => panic!("written journal records do not read back: {e}"),
    }
}

/// The `luks_header` target: arbitrary bytes as the start of a device, through the in-process
/// LUKS header reader ([`crate::luks::ondisk::parse`]). It must never panic; a header it
/// accepts must be one keyplan can act on: keyslot and token ids below 32, and every token's
/// keyslots among the header's keyslots or below 32.
pub fn luks_header(data: &[u8]) {
    let Ok(h) = crate::luks::ondisk::parse(data) else {
        return;
    };
    let max = h.version.max_keyslots();
    for n in h.keyslots.keys() {
        assert!(*n < 32, "keyslot {n} accepted (max {max})");
    }
    for (id, t) in &h.tokens {
        assert!(*id < 32, "token {id} accepted");
        assert!(
            t.keyslots.iter().all(|k| *k < 32),
            "token {id} names a keyslot above 31"
        );
    }
    let _ = h.condition.write_blocker();
}
