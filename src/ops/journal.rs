//! `journal`: the journal's records and a summary per run. Read-only, but for a damaged audit
//! trail, which it sets aside as a run does ([`crate::journal::compact::read_with_history`]).

use std::collections::BTreeSet;

use serde::Serialize;

use crate::error::Error;
use crate::journal::{Event, Record};
use crate::spec::Plan;
use crate::world::OwnerError;

/// One run of the journal, summarized (`journal --json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunInfo {
    /// Run id (`<unix seconds>-<pid>`).
    pub id: String,
    /// Unix seconds of its `run_start` record.
    pub started_at: u64,
    /// Unix seconds of its `run_end` record; `None` when it has none.
    pub ended_at: Option<u64>,
    /// `success`, `failed`, `interrupted` (signal), or `unfinished` (no `run_end` record:
    /// killed, crashed or still running).
    pub outcome: String,
    /// Number of steps in its graph.
    pub steps: usize,
    /// Number of distinct steps with a `step_done` record.
    pub done: usize,
}

/// The records of the audit trail and journal in `plan`'s state directory, oldest first (none
/// when neither exists): [`crate::journal::compact::read_with_history`]; and, when the
/// directory is not this plan's ([`crate::world::owner::check`]), why: the records are then
/// another plan's history, shown all the same (reading changes nothing) with
/// [`OwnerError::read_only_warning`].
///
/// Errors: [`Error::Journal`] when either cannot be read, or the journal is corrupt (a
/// damaged audit trail is set aside with a warning).
pub fn read(plan: &Plan) -> Result<(Vec<Record>, Option<OwnerError>), Error> {
    let foreign = crate::world::owner::check(plan).err();
    let records = crate::journal::compact::read_with_history(&plan.state_dir)?;
    Ok((records, foreign))
}

/// Summarizes every run in `records`, in journal order (resumed runs keep their id, so a
/// resumed run is one entry).
pub fn runs(records: &[Record]) -> Vec<RunInfo> {
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
