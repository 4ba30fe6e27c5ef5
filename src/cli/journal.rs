//! `keyplan journal`: the journal of runs.

use super::*;

pub(super) fn cmd_journal(cli: &Cli, arg: &PlanArg, json: bool) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    let records = crate::journal::read(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&records).into_diagnostic()?
        );
        return Ok(ExitCode::SUCCESS);
    }
    if records.is_empty() {
        outln!("The journal in {} is empty.", plan.state_dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    let mut steps: Vec<crate::graph::Step> = Vec::new();
    for r in &records {
        let ts = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(r.ts),
        );
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
