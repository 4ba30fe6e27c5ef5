//! Texts about runs: an interrupted run's remaining steps (text and the `plan --json` shape),
//! the journal's records as lines, the closing line of an apply, `verify`'s check lines.

use std::fmt::Write as _;

use crate::graph::Step;
use crate::journal::{Event, Record, RunSummary};
use crate::ops::apply::Totals;
use crate::ops::verify::{Check, Outcome};

/// Describes an interrupted run and the steps it has left (numbered as journaled; a step that
/// was under way when the process died says so).
pub fn interrupted_text(s: &RunSummary) -> String {
    let done = s.done.iter().filter(|d| **d).count();
    let mut out = format!(
        "Run {} was interrupted ({done} of {} steps done). `keyplan apply` finishes it first; remaining steps:\n",
        s.run,
        s.steps.len()
    );
    for (i, step) in s.steps.iter().enumerate().filter(|(i, _)| !s.done[*i]) {
        let note = if s.started_not_done[i] {
            "  (was under way)"
        } else {
            ""
        };
        let _ = writeln!(out, "  - [{i}] {step}{note}");
    }
    out
}

/// `plan --json` while a run is interrupted: the usual fields present but empty (so readers of
/// `changes` do not break), `changes_present: true`, and the remaining steps under
/// `interrupted_run`.
pub fn interrupted_json(s: &RunSummary) -> serde_json::Value {
    serde_json::json!({
        "format_version": "1.0",
        "changes_present": true,
        "summary": {"add": 0, "remove": 0, "rotate": 0, "migrate": 0},
        "changes": [],
        "keys": [],
        "keyslots": [],
        "notes": [format!("run {} was interrupted: `keyplan apply` finishes it first; plan again afterwards", s.run)],
        "interrupted_run": {
            "run": s.run,
            "steps": s.steps,
            "done": s.done,
        },
    })
}

/// The closing line of an apply: what its runs did and every PBKDF run of the command
/// (planning checks, a finished interrupted run, the runs).
pub fn apply_complete(t: Totals, pbkdf_runs: u64) -> String {
    let adopted = if t.adopted > 0 {
        format!(", {} adopted", t.adopted)
    } else {
        String::new()
    };
    format!(
        "Apply complete! {} added, {} removed, {} keys rotated{adopted}. ({} steps, {pbkdf_runs} PBKDF runs)",
        t.added, t.removed, t.rotated, t.steps
    )
}

/// `verify`'s line for one check (`ok    dev: key v2 opens bound keyslot 1`, `FAIL  ...`).
pub fn verify_line(c: &Check) -> String {
    let (dev, key) = (&c.device, &c.key);
    match c.outcome.clone() {
        Outcome::Opens { version, slot } => {
            format!("ok    {dev}: {key} v{version} opens bound keyslot {slot}")
        }
        Outcome::NoCurrent => format!("FAIL  {dev}: {key} has no current version in the KMS"),
        Outcome::NotEnrolled { version } => {
            format!("FAIL  {dev}: {key} v{version} is not enrolled (no keyslot recorded)")
        }
        Outcome::Unbound { version, slot } => {
            format!("FAIL  {dev}: {key} v{version} opens an UNBOUND keyslot {slot}")
        }
        Outcome::DoesNotOpen { version, slot } => {
            format!("FAIL  {dev}: {key} v{version} does not open keyslot {slot}")
        }
        Outcome::Untestable {
            version,
            slot,
            reason,
        } => {
            format!("FAIL  {dev}: {key} v{version} in keyslot {slot} could not be tested: {reason}")
        }
        Outcome::DeviceUnavailable { reason } => {
            format!("FAIL  {dev}: {key} could not be checked: the device cannot be used: {reason}")
        }
    }
}

/// The journal's records as text lines: `TIME  RUN  what happened`, steps named by the graph of
/// their run.
pub fn journal_lines(records: &[Record]) -> Vec<String> {
    let mut steps: Vec<Step> = Vec::new();
    let mut out = Vec::new();
    for r in records {
        let line = match &r.event {
            Event::RunStart {
                steps: s,
                host,
                pid,
                ..
            } => {
                steps.clone_from(s);
                format!("run started: {} steps (pid {pid} on {host})", s.len())
            }
            Event::StepStart { step } => format!("start  {}", describe(&steps, *step)),
            Event::StepDone { step, outcome, .. } => {
                format!("done   {}: {outcome}", describe(&steps, *step))
            }
            Event::StepFailed { step, error } => {
                format!("FAILED {}: {error}", describe(&steps, *step))
            }
            Event::RunResumed { pid } => format!("run resumed by pid {pid}"),
            Event::RunEnd { outcome, message } => match message {
                Some(m) => format!("run ended: {outcome}: {m}"),
                None => format!("run ended: {outcome}"),
            },
            Event::Checkpoint(c) => format!(
                "journal compacted: {} finished run{} moved out so far, the last {}; the runs above are those the audit trail keeps",
                c.compacted_runs,
                if c.compacted_runs == 1 { "" } else { "s" },
                c.through
            ),
        };
        out.push(format!(
            "{}  {}  {line}",
            crate::clock::rfc3339(r.ts),
            r.run
        ));
    }
    out
}

/// `[i] description` of step `i` of `steps`, or `step i` when the graph does not have it.
fn describe(steps: &[Step], i: usize) -> String {
    steps
        .get(i)
        .map_or_else(|| format!("step {i}"), |s| format!("[{i}] {s}"))
}
