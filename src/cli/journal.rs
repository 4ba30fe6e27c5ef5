//! `keyplan journal`: the journal of runs.

use super::*;

/// `keyplan journal`: the journal's records as text lines, or with `--json` one document
/// `{format_version, state_dir, records, runs}` (docs/monitoring.md).
///
/// Errors: the plan cannot be loaded or the journal cannot be read.
pub(super) fn cmd_journal(cli: &Cli, arg: &PlanArg, json: bool) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    let records = crate::journal::read(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    if json {
        let doc = serde_json::json!({
            "format_version": "1.0",
            "state_dir": plan.state_dir.display().to_string(),
            "records": records,
            "runs": runs(&records),
        });
        outln!("{}", serde_json::to_string_pretty(&doc).into_diagnostic()?);
        return Ok(ExitCode::SUCCESS);
    }
    if records.is_empty() {
        outln!("The journal in {} is empty.", plan.state_dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    let mut steps: Vec<crate::graph::Step> = Vec::new();
    for r in &records {
        let ts = crate::clock::rfc3339(r.ts);
        let line = match &r.event {
            crate::journal::Event::RunStart {
                steps: s,
                host,
                pid,
                ..
            } => {
                steps.clone_from(s);
                format!("run started: {} steps (pid {pid} on {host})", s.len())
            }
            crate::journal::Event::StepStart { step } => {
                format!("start  {}", describe(&steps, *step))
            }
            crate::journal::Event::StepDone { step, outcome, .. } => {
                format!("done   {}: {outcome}", describe(&steps, *step))
            }
            crate::journal::Event::StepFailed { step, error } => {
                format!("FAILED {}: {error}", describe(&steps, *step))
            }
            crate::journal::Event::RunResumed { pid } => format!("run resumed by pid {pid}"),
            crate::journal::Event::RunEnd { outcome, message } => match message {
                Some(m) => format!("run ended: {outcome}: {m}"),
                None => format!("run ended: {outcome}"),
            },
        };
        outln!("{ts}  {}  {line}", r.run);
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) fn describe(steps: &[crate::graph::Step], i: usize) -> String {
    steps
        .get(i)
        .map_or_else(|| format!("step {i}"), |s| format!("[{i}] {s}"))
}

/// One run of the journal, summarized for `journal --json`.
#[derive(Debug, serde::Serialize)]
struct RunInfo {
    /// Run id (`<unix seconds>-<pid>`).
    id: String,
    /// Unix seconds of its `run_start` record.
    started_at: u64,
    /// Unix seconds of its `run_end` record; `None` when it has none.
    ended_at: Option<u64>,
    /// `success`, `failed`, `interrupted` (signal), or `unfinished` (no `run_end` record:
    /// killed, crashed or still running).
    outcome: String,
    /// Number of steps in its graph.
    steps: usize,
    /// Number of distinct steps with a `step_done` record.
    done: usize,
}

/// Summarizes every run in `records`, in journal order (resumed runs keep their id, so a
/// resumed run is one entry).
fn runs(records: &[crate::journal::Record]) -> Vec<RunInfo> {
    use crate::journal::Event;
    let mut out: Vec<(RunInfo, BTreeSet<usize>)> = Vec::new();
    for r in records {
        let idx = out.iter().position(|(x, _)| x.id == r.run);
        match (&r.event, idx) {
            (Event::RunStart { steps, .. }, None) => out.push((
                RunInfo {
                    id: r.run.clone(),
                    started_at: r.ts,
                    ended_at: None,
                    outcome: "unfinished".into(),
                    steps: steps.len(),
                    done: 0,
                },
                BTreeSet::new(),
            )),
            (Event::StepDone { step, .. }, Some(i)) => {
                if let Some((info, done)) = out.get_mut(i) {
                    if *step < info.steps {
                        done.insert(*step);
                    }
                }
            }
            (Event::RunEnd { outcome, .. }, Some(i)) => {
                if let Some((info, _)) = out.get_mut(i) {
                    info.ended_at = Some(r.ts);
                    info.outcome.clone_from(outcome);
                }
            }
            _ => {}
        }
    }
    out.into_iter()
        .map(|(mut info, done)| {
            info.done = done.len();
            info
        })
        .collect()
}
