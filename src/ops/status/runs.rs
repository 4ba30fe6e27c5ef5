//! The journal part of `status`: the last run, and the devices it was changing.

use std::collections::BTreeMap;

use super::RunReport;
use crate::journal::{Event, Record};

/// The journal's last run, with its outcome; `in_progress` when it has no end record and a
/// run holds the state lock (`holder`, who holds it; only a run takes it), `unfinished` when
/// the lock is free.
pub(super) fn last_run(records: &[Record], holder: Option<String>) -> Option<RunReport> {
    let r = crate::journal::last_run(records)?;
    let ended_at = records.iter().rev().find_map(|x| match &x.event {
        Event::RunEnd { .. } if x.run == r.run => Some(x.ts),
        _ => None,
    });
    let holder = match r.ended {
        Some(_) => None,
        None => holder,
    };
    let outcome = match (&r.ended, &holder) {
        (Some(o), _) => o.clone(),
        (None, Some(_)) => "in_progress".to_string(),
        (None, None) => "unfinished".to_string(),
    };
    Some(RunReport {
        id: r.run.clone(),
        started_at: r.started,
        ended_at,
        outcome,
        holder,
        error: r.last_error.clone(),
    })
}

/// The devices the run in progress (`last`, `in_progress`: it holds the state lock) still has
/// steps on, with its id; empty when no run is in progress.
pub(super) fn devices_being_changed(
    records: &[Record],
    last: Option<&RunReport>,
) -> BTreeMap<String, String> {
    let Some(r) = last.filter(|r| r.outcome == "in_progress") else {
        return BTreeMap::new();
    };
    let Some(run) = crate::journal::last_run(records).filter(|s| s.run == r.id) else {
        return BTreeMap::new();
    };
    run.steps
        .iter()
        .zip(&run.done)
        .filter(|(_, done)| !**done)
        .filter_map(|(step, _)| step.device())
        .map(|d| (d.to_string(), run.run.clone()))
        .collect()
}

/// Whether the last run that is over succeeded: the last run, or the one before it while the
/// last one is in progress.
pub(super) fn last_over_success(records: &[Record], last: Option<&RunReport>) -> Option<bool> {
    match last {
        Some(r) if r.outcome == "in_progress" => records
            .iter()
            .rposition(|x| matches!(x.event, Event::RunStart { .. }))
            .and_then(|start| crate::journal::last_run(&records[..start]))
            .map(|prev| prev.ended.as_deref() == Some("success")),
        Some(r) => Some(r.outcome == "success"),
        None => None,
    }
}
