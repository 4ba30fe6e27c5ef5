//! The node's work: whether there is any (an interrupted run, or changes), doing it on the
//! engine, and what the node is, for the report; also the cycle that could not look.

use std::sync::atomic::{AtomicBool, Ordering};

use super::Agent;
use crate::apply::StepEvent;
use crate::error::Error;
use crate::fleet::events::EventType;
use crate::fleet::report::{AgentState, DeviceSummary, KeySummary};
use crate::ops::apply::{ApplySession, RunOptions};
use crate::ops::plan::PlanRequest;
use crate::ops::Engine;

impl Agent {
    /// A cycle (or, `in_run`, a run before its first step) stopped because something could not
    /// be looked at: a KMS unreachable, sealed, refusing or silent ([`Error::could_not_look`]).
    /// Nothing was changed, so it is not a failed rotation and does not count towards
    /// `max_failed_nodes`: a KMS outage every node sees before any change must not halt the
    /// fleet until an operator clears it. It is reported (`error` state, the message), said
    /// in the log and an `ObservationFailed` Event once per message, and counted in
    /// `keyplan_agent_observation_failures`; the node looks again at its next full cycle.
    pub(super) fn could_not_look(&mut self, e: &Error, in_run: bool) {
        let message = format!(
            "could not {} (nothing was changed; this does not count towards max_failed_nodes, and the node looks again at its next cycle): {e}",
            if in_run {
                "plan its run"
            } else {
                "observe or plan"
            }
        );
        self.health().observation_failures += 1;
        let first = self.report.state != AgentState::Error
            || self.report.message.as_deref() != Some(message.as_str());
        if first {
            tracing::error!(node = %self.opts.node, event = "observation_failed", "{message}");
            self.emit(
                EventType::Warning,
                "ObservationFailed",
                &format!("node {}: {message}", self.opts.node),
            );
        }
        self.pending = None;
        self.set_state(AgentState::Error, Some(message));
        self.publish(false);
    }

    /// A cycle could not observe or plan for a reason of the node's own: reported (`error`
    /// state, the message) and logged.
    pub(super) fn cannot_check(&mut self, e: &Error) {
        let message = e.to_string();
        tracing::error!(node = %self.opts.node, "could not observe or plan: {message}");
        self.set_state(AgentState::Error, Some(message));
        self.publish(false);
    }

    /// Puts what `status` finds (and the keyslots `observed` saw) into the report.
    pub(super) fn summarize(
        &mut self,
        engine: &Engine,
        observed: Option<&crate::observe::Observed>,
    ) {
        // The cycle's own observation when it has one: a cycle observes once.
        let status = match observed {
            Some(o) => crate::ops::status::status_observed(engine, o),
            None => crate::ops::status::status(engine),
        };
        let keyslots = |id: &str| -> Vec<u32> {
            observed
                .and_then(|o| o.devices.get(id))
                .map(|d| d.header.keyslots.keys().copied().collect())
                .unwrap_or_default()
        };
        self.report.devices = status
            .devices
            .iter()
            .map(|d| DeviceSummary {
                id: d.id.clone(),
                path: d.path.clone(),
                keyslots: keyslots(&d.id),
                drifted: d.drifted,
            })
            .collect();
        self.report.keys = status
            .keys
            .iter()
            .map(|k| {
                let mut versions: Vec<u64> = k.retained.clone();
                versions.extend(k.current.as_ref().map(|c| c.version));
                versions.sort_unstable();
                versions.dedup();
                KeySummary {
                    id: k.id.clone(),
                    kms: k.kms.clone(),
                    current_version: k.current.as_ref().map(|c| c.version),
                    versions,
                    pending: k.pending,
                    rotation_due_at: k.rotation_due_at,
                    overdue: k.overdue,
                }
            })
            .collect();
        self.report.problems = status.problems.clone();
        self.report.unchecked = status.unchecked.clone();
        if let Some(o) = observed {
            self.report.observation = Some(crate::fleet::report::Observation::of(
                o,
                &self.opts.state_dir,
                self.report.plan_digest.clone(),
            ));
        }
        self.health().status = Some(status);
    }

    /// In sync, or (with `waiting`) waiting for other nodes to verify a shared key's new
    /// version; a new wait is said once in the log and an Event (`CommitWaiting`), naming the
    /// nodes it waits for.
    pub(super) fn set_waiting(&mut self, waiting: Vec<crate::diff::CommitWait>) {
        self.health().commits_waiting = waiting
            .iter()
            .map(|w| (w.key.clone(), w.blocking_nodes().len()))
            .collect();
        if waiting.is_empty() {
            self.report.commits_waiting.clear();
            self.set_state(AgentState::InSync, None);
            return;
        }
        let text: Vec<String> = waiting.iter().map(|w| w.describe()).collect();
        let message = format!("node {}: {}", self.opts.node, text.join("; "));
        let waiting: Vec<crate::fleet::report::CommitWait> =
            waiting.into_iter().map(Into::into).collect();
        if self.report.commits_waiting != waiting {
            tracing::info!(node = %self.opts.node, event = "commit_waiting", "{message}");
            self.emit(EventType::Normal, "CommitWaiting", &message);
        }
        self.report.commits_waiting = waiting;
        self.set_state(AgentState::Waiting, Some(text.join("; ")));
    }
}

/// What a full cycle found.
pub(super) enum Work {
    /// The node matches the plan, or did all it can and waits for other nodes' votes on a
    /// shared key (`waiting`).
    None {
        /// What the cycle observed.
        observed: crate::observe::Observed,
        /// The shared keys' new versions that wait for other nodes.
        waiting: Vec<crate::diff::CommitWait>,
    },
    /// An interrupted run to finish (`observed` is then `None`) or changes.
    Some {
        /// The number of changes (the interrupted run's steps, or the plan's changes).
        changes: usize,
        /// What the cycle observed, when it planned.
        observed: Option<crate::observe::Observed>,
    },
}

/// Whether `engine`'s plan has work on this node: an interrupted run, or changes. Holds the
/// state lock only while it looks.
pub(super) fn find_work(engine: &Engine) -> Result<Work, Error> {
    let mut session = ApplySession::open(engine)?;
    if let Some(s) = session.interrupted() {
        return Ok(Work::Some {
            changes: s.steps.len(),
            observed: None,
        });
    }
    match session.next_plan(&PlanRequest::default())? {
        Some(p) if !p.diff.is_empty() => Ok(Work::Some {
            changes: change_count(&p.diff),
            observed: Some(p.observed),
        }),
        Some(p) => Ok(Work::None {
            observed: p.observed,
            waiting: p.diff.waiting,
        }),
        None => Err(Error::request("the apply session planned nothing", None)),
    }
}

/// The number of changes of `diff` (key-level and keyslot-level), as the plan text lists them.
pub(super) fn change_count(diff: &crate::diff::Diff) -> usize {
    diff.keys.len() + diff.slots.len()
}

/// What [`run_engine`] did.
pub(super) struct Done {
    /// The id of the last run it ran or finished, if any.
    pub(super) run: Option<String>,
    /// The number of steps it ran, over all its runs.
    pub(super) steps: usize,
    /// The last plan, which found nothing left to do (`None` when the run stopped early).
    pub(super) last: Option<crate::ops::plan::Planned>,
}

/// Finishes the interrupted run, if any, then plans and runs the rounds, logging each step.
pub(super) fn run_engine(engine: &Engine, node: &str, stop: &AtomicBool) -> Result<Done, Error> {
    let mut session = ApplySession::open(engine)?;
    let opts = RunOptions {
        parallelism: None,
        stop: Some(stop),
    };
    let mut steps = 0;
    let mut run = None;
    let mut log = |ev: StepEvent<'_>| match ev {
        StepEvent::Started {
            step,
            total,
            desc,
            device,
        } => {
            tracing::info!(
                node,
                event = "step_started",
                step,
                total,
                device = device.unwrap_or(""),
                "{desc}"
            );
        }
        StepEvent::Finished {
            step,
            total,
            done,
            desc,
            device,
            ..
        } => {
            tracing::info!(
                node,
                event = "step_finished",
                step,
                total,
                done,
                device = device.unwrap_or(""),
                "{desc}"
            );
        }
        #[allow(unreachable_patterns)]
        _ => {}
    };
    if let Some(s) = session.interrupted().cloned() {
        session.check_resumable()?;
        tracing::info!(node, run = %s.run, event = "run_resumed", "finishing interrupted run {}", s.run);
        let r = session.resume(opts, &mut log)?;
        steps += r.steps_run;
        run = Some(r.run);
    }
    let req = PlanRequest::default();
    let mut last = None;
    while let Some(planned) = session.next_plan(&req)? {
        if planned.diff.is_empty() {
            last = Some(planned);
            break;
        }
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let r = session.run(&planned, opts, &mut log)?;
        steps += r.steps_run;
        run = Some(r.run);
    }
    Ok(Done { run, steps, last })
}
