//! Rollout slots: waiting in the queue for one (unless the rollout is paused or halted),
//! taking it, and running the work while a second thread renews it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::publish::put_report;
use super::work::{change_count, run_engine, Done};
use super::{Agent, Pending};
use crate::clock::now_unix;
use crate::error::Error;
use k8s_openapi::api::coordination::v1::Lease;

use crate::fleet::error::FleetError;
use crate::fleet::events::EventType;
use crate::fleet::pause::Pause;
use crate::fleet::report::{AgentRun, AgentState, Failure, Stored};
use crate::fleet::slots::{Slot, SlotError, Slots};
use crate::fleet::watch::Seen;
use crate::ops::plan::PlanRequest;
use crate::ops::Engine;
use crate::spec::Plan;

/// How long a free slot is left to the nodes ahead in the queue before a node further back
/// takes it (a node ahead may have stopped while waiting; its report says `waiting` until its
/// heartbeat is an interval old).
const FREE_SLOT_GRACE: Duration = Duration::from_secs(1);

impl Agent {
    /// Waits until `until`, or until the fleet watch (while work waits for a slot) shows a
    /// change or this node's turn at a free slot comes; whether to go round now.
    pub(super) fn wait_for_fleet(&self, until: Instant) -> bool {
        let Some(watch) = self.watch.as_ref().filter(|_| self.pending.is_some()) else {
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
            return false;
        };
        let turn = self.free_since.map(|t| t + FREE_SLOT_GRACE);
        if turn.is_some_and(|t| t <= Instant::now()) {
            return true;
        }
        let until = turn.map_or(until, |t| t.min(until));
        watch.wait_change(self.seen_generation, until) || turn.is_some_and(|t| t <= Instant::now())
    }

    /// With work pending: unless the rollout is halted or paused, takes a slot and runs.
    ///
    /// What it decides on is the fleet watch's copy ([`crate::fleet::watch`], started here the first
    /// time): the reports (failures, the queue), the pause and the slot Leases, so a waiting
    /// agent sends no request until a slot is free for it. Waiting nodes take free slots in
    /// the order they began to wait (their reports' `waiting_since`, then node name): the
    /// node `k` places back takes the `k`-th free slot; a slot left free for
    /// [`FREE_SLOT_GRACE`] (a node ahead stopped while waiting) is taken by any node. Every
    /// write is conditional ([`Slots::take`]); one that loses waits for the watch to show the
    /// winner.
    pub(super) fn try_slot(&mut self) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        let fleet = pending.plan.fleet.clone();
        // A node whose own run just failed tries again after an interval, not at every poll.
        let failed_at = self.report.failure.as_ref().map(|f| f.at).unwrap_or(0);
        if now_unix() < failed_at.saturating_add(self.opts.interval.as_secs()) {
            self.pending = Some(pending);
            return;
        }
        let seen = match self.fleet_seen() {
            Ok(Some(seen)) => seen,
            Ok(None) => {
                // The watch has not listed yet: it wakes the loop when it has.
                self.pending = Some(pending);
                return;
            }
            Err(e) => {
                self.set_state(AgentState::Error, Some(e.to_string()));
                self.publish(false);
                self.pending = Some(pending);
                return;
            }
        };
        // The node's place in the queue: kept through a pause, so that at `fleet resume` the
        // nodes that waited longest take the free slots at once, in order, without racing.
        let since = *self.waiting_since.get_or_insert(now_unix());
        if let Some(pause) = &seen.pause {
            self.report_paused(pause, since);
            self.pending = Some(pending);
            return;
        }
        self.health().paused = false;
        let failed = failed_nodes(seen.reports.values());
        if failed.len() >= fleet.max_failed_nodes as usize {
            self.report_halted(&failed, fleet.max_failed_nodes);
            self.pending = Some(pending);
            return;
        }
        self.report.halted = false;
        self.health().halted = false;
        let slots = Slots::new(
            self.client.clone(),
            &self.namespace,
            fleet.max_concurrent_nodes,
            &self.opts.node,
            self.opts.slot_duration,
        );
        let choice = self.choose_slot(&slots, &seen, since);
        if let Some((i, lease)) = choice {
            match slots.take(i, lease) {
                Ok(Some(slot)) => {
                    self.waiting_since = None;
                    self.free_since = None;
                    self.watch = None;
                    return self.run_with_slot(pending, &slots, slot);
                }
                // Another node's write came first: the watch shows it shortly; until then this
                // node does not try again (its turn restarts).
                Ok(None) => self.free_since = Some(Instant::now()),
                Err(e) => {
                    self.set_state(
                        AgentState::Error,
                        Some(format!("cannot take a rollout slot: {e}")),
                    );
                    self.publish(false);
                    self.pending = Some(pending);
                    return;
                }
            }
        }
        self.set_state(
            AgentState::Waiting,
            Some(format!(
                "{} change(s) wait for one of the {} rollout slot(s), in the order nodes began to wait",
                pending.changes, fleet.max_concurrent_nodes,
            )),
        );
        self.report.waiting_since = Some(since);
        self.publish(false);
        self.pending = Some(pending);
    }

    /// The rollout is paused (`pause`): said in the log when the pause is new, and in the
    /// report, which keeps this node's place in the queue (`since`). For [`Agent::try_slot`].
    fn report_paused(&mut self, pause: &Pause, since: u64) {
        let message = format!(
            "the rollout is {}; nothing is started until an operator runs `keyplan fleet resume`",
            pause.describe()
        );
        if !self.health().paused {
            tracing::info!(node = %self.opts.node, "{message}");
        }
        self.health().paused = true;
        self.free_since = None;
        self.set_state(AgentState::Paused, Some(message));
        self.report.waiting_since = Some(since);
        self.publish(false);
    }

    /// The rollout is halted: `failed` (the nodes whose failures count) reached
    /// `max_failed_nodes`. Said in the log and an Event when the halt is new, and in the
    /// report. For [`Agent::try_slot`].
    fn report_halted(&mut self, failed: &[String], max_failed_nodes: u32) {
        let message = format!(
            "the rollout is halted: {} node run(s) failed ({}), max_failed_nodes is {}; nothing is started until they succeed or an operator runs `keyplan fleet clear`",
            failed.len(),
            failed.join(", "),
            max_failed_nodes
        );
        if !self.report.halted {
            tracing::warn!(node = %self.opts.node, "{message}");
            self.emit(EventType::Warning, "RolloutHalted", &message);
        }
        self.report.halted = true;
        self.health().halted = true;
        self.free_since = None;
        self.set_state(AgentState::Halted, Some(message));
        self.publish(false);
    }

    /// The slot this node takes now (its index, and the Lease it takes over), if any: its own
    /// (a restarted agent's), else the free slot of its place in the queue (waiting since
    /// `since`), or any free slot once one was left free for [`FREE_SLOT_GRACE`]. For
    /// [`Agent::try_slot`].
    fn choose_slot(
        &mut self,
        slots: &Slots,
        seen: &Seen,
        since: u64,
    ) -> Option<(u32, Option<Lease>)> {
        let now = now_unix();
        let view = slots.view(&seen.leases);
        match view.mine {
            // A restarted agent's own slot.
            Some((i, lease)) => Some((i, Some(lease))),
            None if view.free.is_empty() => {
                self.free_since = None;
                None
            }
            None => {
                let free_since = *self.free_since.get_or_insert_with(Instant::now);
                let ahead = queue_ahead(
                    seen.reports.values(),
                    &view.holders,
                    &self.opts.node,
                    since,
                    now,
                );
                if ahead < view.free.len() {
                    view.free.get(ahead).cloned()
                } else if free_since.elapsed() >= FREE_SLOT_GRACE {
                    view.free.get(ahead % view.free.len()).cloned()
                } else {
                    None
                }
            }
        }
    }

    /// The fleet watch's copy of the namespace (the watch is started, or restarted for another
    /// namespace, here); `None` until it has listed. Remembers the generation seen, so that
    /// the loop wakes at the next change.
    ///
    /// Errors: the watch cannot be started, or it fails (denied, unreachable) and has no copy.
    fn fleet_seen(&mut self) -> Result<Option<Seen>, FleetError> {
        if self.watch.as_ref().map(|w| w.namespace.as_str()) != Some(self.namespace.as_str()) {
            let client = self
                .watch_client
                .clone()
                .unwrap_or_else(|| self.client.clone());
            self.watch = Some(crate::fleet::watch::FleetWatch::start(
                client,
                &self.namespace,
            )?);
        }
        let Some(watch) = &self.watch else {
            return Ok(None);
        };
        self.seen_generation = watch.generation();
        match watch.snapshot() {
            Some(seen) => Ok(Some(seen)),
            None => match watch.error() {
                Some(e) => Err(FleetError::Api(format!(
                    "cannot see the rollout slots and reports: {e}"
                ))),
                None => Ok(None),
            },
        }
    }

    /// Runs `pending` holding `slot`, then gives the slot back and reports.
    fn run_with_slot(&mut self, pending: Pending, slots: &Slots, slot: Slot) {
        let slot_name = slot.name.clone();
        self.health().slot_held = true;
        let run_stop = Arc::new(AtomicBool::new(false));
        let renewer = Renewer::start(
            slots.clone(),
            slot,
            self.opts.slot_duration,
            Arc::clone(&run_stop),
            self.stop,
        );
        let started_at = now_unix();
        let message = self.announce_run(pending.changes, &slot_name, started_at);
        let outcome = self.run_beside_announcement(pending.plan, &message, &run_stop);
        // The slot is renewed until it is released, right after the report: after a success
        // the report shows the node as it is now (one observation, no PBKDF), after anything
        // else what is left is observed once the slot is free; Events are written after the
        // release.
        let lost = renewer.lost();
        let mut after: Vec<(EventType, &'static str, String)> = Vec::new();
        let (result, engine, pbkdf_runs) = outcome;
        let ended_at = now_unix();
        let mut run = AgentRun {
            id: None,
            started_at,
            ended_at: Some(ended_at),
            outcome: String::new(),
            steps: 0,
            pbkdf_runs,
            error: None,
        };
        let (label, mut last) =
            self.conclude_run(result, &mut run, ended_at, lost.as_deref(), &mut after);
        *self.health().runs.entry(label).or_default() += 1;
        self.report.last_run = Some(run);
        if label == "success" {
            // What the node is now, before the slot is free: a report that says `in_sync`
            // shows the new versions. The run's last plan is that observation when it made
            // one (a second round); else the devices' headers and the KMS are read once more
            // (no PBKDF: every keyslot is recorded).
            if last.is_none() {
                last = engine
                    .as_ref()
                    .and_then(|e| crate::ops::plan::make(e, &PlanRequest::default()).ok());
            }
            if let (Some(engine), Some(last)) = (&engine, &last) {
                self.report.changes = change_count(&last.diff);
                self.set_waiting(last.diff.waiting.clone());
                self.summarize(engine, Some(&last.observed));
            }
        }
        // The report says the run is over before the slot is free: a sampler never sees more
        // running reports than slots.
        self.publish(true);
        let (slot, _) = renewer.finish();
        if let Some(slot) = slot {
            if let Err(e) = slots.release(slot) {
                tracing::warn!(node = %self.opts.node, "could not release rollout slot {slot_name} (it expires by itself): {e}");
            }
        }
        self.health().slot_held = false;
        for (kind, reason, message) in after {
            self.emit(kind, reason, &message);
        }
        if let (Some(engine), true) = (&engine, label != "success") {
            // A run that did not finish: what is left, observed now the slot is free.
            let observed = crate::ops::plan::make(engine, &PlanRequest::default()).ok();
            if let Some(o) = &observed {
                self.report.changes = change_count(&o.diff);
                self.report.commits_waiting =
                    o.diff.waiting.iter().cloned().map(Into::into).collect();
            }
            self.summarize(engine, observed.as_ref().map(|p| &p.observed));
            self.publish(false);
        }
        if label != "success" {
            // Look again at the next poll, not only after a whole interval.
            self.next_full = Instant::now();
        }
    }

    /// The start of a run of `changes` change(s) holding the slot `slot_name` (since
    /// `started_at`): the report says `running` (not yet written), the log says so; the
    /// message for the `RunStarted` Event. For [`Agent::run_with_slot`].
    fn announce_run(&mut self, changes: usize, slot_name: &str, started_at: u64) -> String {
        self.report.last_run = Some(AgentRun {
            id: None,
            started_at,
            ended_at: None,
            outcome: "running".into(),
            steps: 0,
            pbkdf_runs: 0,
            error: None,
        });
        self.set_state(
            AgentState::Running,
            Some(format!(
                "applying {} change(s), holding {slot_name}",
                changes
            )),
        );
        let message = format!(
            "node {}: applying {} change(s) (rollout slot {slot_name})",
            self.opts.node, changes
        );
        tracing::info!(node = %self.opts.node, lease = %slot_name, event = "run_initiated", "{message}");
        message
    }

    /// Runs `plan` (stopping between steps once `run_stop` is set) while a second thread writes
    /// the `running` report and the `RunStarted` Event (`message`); the run's result, its
    /// engine (when it opened) and the PBKDF runs it made. For [`Agent::run_with_slot`].
    fn run_beside_announcement(
        &mut self,
        plan: Plan,
        message: &str,
        run_stop: &AtomicBool,
    ) -> (Result<Done, Error>, Option<Engine>, u64) {
        // The `running` report and the `RunStarted` Event are written beside the run, not
        // before it: the slot is this node's already, so a hand-over from one node to the next
        // waits for three writes (the releasing node's report and release, this node's take),
        // not five. The report's next write waits for this one (its condition is this one's
        // object); the report still says `running` only after the slot was taken, so no
        // sampler sees more running reports than slots.
        self.report.updated_at = now_unix();
        let announced = self.report.clone();
        let reports = self.reports();
        let prior = self.prior.clone();
        let events = self.take_events();
        let node = self.opts.node.clone();
        let has_devices = self.has_devices;
        let (outcome, written) = std::thread::scope(|s| {
            let announcing = s.spawn(|| {
                let written =
                    has_devices.then(|| put_report(&reports, &node, &announced, prior.as_ref()));
                events.emit(EventType::Normal, "RunStarted", message);
                written
            });
            self.health().running = true;
            let outcome = match Engine::open(plan) {
                Ok(engine) => {
                    let out = run_engine(&engine, &node, run_stop);
                    let pbkdf = engine.pbkdf_runs();
                    (out, Some(engine), pbkdf)
                }
                Err(e) => (Err(e), None, 0),
            };
            self.health().running = false;
            (outcome, announcing.join())
        });
        self.events = Some(events);
        match written {
            Ok(Some(result)) => self.published_as(announced, result),
            Ok(None) => {}
            // The writer panicked: what it wrote is unknown, so the next write reads first.
            Err(_) => self.prior = None,
        }
        outcome
    }

    /// What the run's `result` was: recorded in `run` (which ended at `ended_at`) and the
    /// report, said in the log, with the Event to write once the slot is free pushed on
    /// `after` (`lost`: why the slot was lost, if it was); the outcome's label and, after a
    /// success, the run's last plan. For [`Agent::run_with_slot`].
    fn conclude_run(
        &mut self,
        result: Result<Done, Error>,
        run: &mut AgentRun,
        ended_at: u64,
        lost: Option<&str>,
        after: &mut Vec<(EventType, &'static str, String)>,
    ) -> (&'static str, Option<crate::ops::plan::Planned>) {
        let (started_at, pbkdf_runs) = (run.started_at, run.pbkdf_runs);
        let mut last = None;
        let label = match result {
            Ok(mut done) => {
                last = done.last.take();
                run.id = done.run;
                run.steps = done.steps;
                run.outcome = "success".into();
                self.report.failure = None;
                self.report.last_success_at = Some(ended_at);
                let message = format!(
                    "node {}: run succeeded in {} s: {} step(s), {} PBKDF run(s)",
                    self.opts.node,
                    ended_at.saturating_sub(started_at),
                    done.steps,
                    pbkdf_runs
                );
                tracing::info!(node = %self.opts.node, event = "run_complete", outcome = "success", steps = done.steps, pbkdf_runs, "{message}");
                after.push((EventType::Normal, "RunSucceeded", message));
                self.set_state(AgentState::InSync, None);
                "success"
            }
            Err(Error::Run { failure, .. }) if failure.interrupted => {
                run.id = Some(failure.run.clone());
                run.outcome = "stopped".into();
                let why = match lost {
                    Some(e) => format!("its rollout slot was lost ({e})"),
                    None => "the agent is stopping".to_string(),
                };
                let message = format!(
                    "node {}: run {} stopped between steps because {why}; the journal keeps it open and the next cycle finishes it",
                    self.opts.node, failure.run
                );
                tracing::warn!(node = %self.opts.node, event = "run_complete", outcome = "stopped", "{message}");
                self.set_state(AgentState::Stopped, Some(message));
                "stopped"
            }
            Err(e) if e.could_not_look() => {
                // No step ran (a run that started is `Error::Run`): it could not plan.
                run.outcome = "not_started".into();
                run.error = Some(e.to_string());
                tracing::warn!(node = %self.opts.node, event = "run_complete", outcome = "not_started", "node {}: the run could not plan, nothing was changed: {e}", self.opts.node);
                self.could_not_look(&e, true);
                "not_started"
            }
            Err(e) => {
                if let Error::Run { failure, .. } = &e {
                    run.id = Some(failure.run.clone());
                }
                let text = e.to_string();
                run.outcome = "failed".into();
                run.error = Some(text.clone());
                self.report.failure = Some(Failure {
                    at: ended_at,
                    message: text.clone(),
                });
                let message = format!("node {}: run failed: {text}", self.opts.node);
                tracing::error!(node = %self.opts.node, event = "run_complete", outcome = "failed", "{message}");
                after.push((EventType::Warning, "RunFailed", message));
                self.set_state(AgentState::Failed, Some(text));
                "failed"
            }
        };
        (label, last)
    }
}

/// The nodes whose failures count towards `max_failed_nodes` among `reports`.
fn failed_nodes<'a>(reports: impl Iterator<Item = &'a Stored>) -> Vec<String> {
    reports
        .filter(|s| s.counts_as_failed())
        .map(|s| {
            s.report
                .as_ref()
                .map(|r| r.node.clone())
                .unwrap_or_else(|| s.name.clone())
        })
        .collect()
}

/// How many nodes are ahead of `node` (waiting since `since`, Unix seconds) in the queue for
/// a slot at `now`: the other nodes whose reports say they wait for a slot (`waiting`, or
/// `paused` with work) since earlier (or as early, with a smaller name), and whose heartbeat
/// is at most one interval old. A node among `holders` (the live holders of slot Leases) is
/// not waiting any more, whatever its report still says: it took a slot and its `running`
/// report is on its way, so the next free slot is not left to it.
fn queue_ahead<'a>(
    reports: impl Iterator<Item = &'a Stored>,
    holders: &[String],
    node: &str,
    since: u64,
    now: u64,
) -> usize {
    reports
        .filter(|s| s.genuine())
        .filter_map(|s| s.report.as_ref())
        .filter(|r| r.node != node && matches!(r.state, AgentState::Waiting | AgentState::Paused))
        .filter(|r| !holders.contains(&r.node))
        .filter(|r| r.updated_at.saturating_add(r.interval_seconds.max(1)) >= now)
        .filter_map(|r| r.waiting_since.map(|w| (w, r.node.as_str())))
        .filter(|&(w, n)| (w, n) < (since, node))
        .count()
}

/// Renews a slot from its own thread every third of its duration while a run lasts; sets the
/// run's stop flag when the slot is lost or the agent is stopping.
struct Renewer {
    /// Dropped by [`Renewer::finish`]: the thread wakes at once (not at its next 100 ms tick),
    /// so the slot is released without waiting.
    done: std::sync::mpsc::Sender<()>,
    /// Why the slot was lost, once it was.
    lost: Arc<Mutex<Option<String>>>,
    thread: std::thread::JoinHandle<(Option<Slot>, Option<SlotError>)>,
}

impl Renewer {
    fn start(
        slots: Slots,
        mut slot: Slot,
        duration: Duration,
        run_stop: Arc<AtomicBool>,
        agent_stop: &'static AtomicBool,
    ) -> Renewer {
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let lost = Arc::new(Mutex::new(None));
        let lost_in = Arc::clone(&lost);
        let every = (duration / 3).max(Duration::from_millis(500));
        let thread = std::thread::spawn(move || {
            let mut renewed = Instant::now();
            // Every 100 ms the agent's stop flag (set by SIGTERM) is looked at.
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                finished.recv_timeout(Duration::from_millis(100))
            {
                if agent_stop.load(Ordering::SeqCst) {
                    run_stop.store(true, Ordering::SeqCst);
                }
                if renewed.elapsed() < every {
                    continue;
                }
                match slots.renew(&mut slot) {
                    Ok(()) => renewed = Instant::now(),
                    Err(e @ SlotError::Lost { .. }) => {
                        tracing::error!("{e}; stopping the run between steps");
                        run_stop.store(true, Ordering::SeqCst);
                        *lost_in.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                        return (None, Some(e));
                    }
                    Err(e) => {
                        tracing::warn!("could not renew the rollout slot: {e}");
                        // Stop before the Lease can expire under us: another node may take it.
                        if renewed.elapsed() > duration * 2 / 3 {
                            run_stop.store(true, Ordering::SeqCst);
                        }
                    }
                }
            }
            (Some(slot), None)
        });
        Renewer { done, lost, thread }
    }

    /// Why the slot was lost, if it was.
    fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Stops renewing; the slot (unless it was lost) and the loss.
    fn finish(self) -> (Option<Slot>, Option<SlotError>) {
        drop(self.done);
        self.thread.join().unwrap_or((None, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::report::{report_name, NodeReport};
    use k8s_openapi::api::core::v1::ConfigMap;

    fn waiting(node: &str, since: u64, now: u64) -> Stored {
        let mut report = NodeReport::fresh(node, 300, now);
        report.state = AgentState::Waiting;
        report.changes = 1;
        report.waiting_since = Some(since);
        Stored {
            report: Some(report),
            newer: None,
            name: report_name(node),
            cleared: None,
            object: ConfigMap::default(),
        }
    }

    #[test]
    fn the_queue_counts_waiting_nodes_ahead_but_not_slot_holders() {
        let now = 1_000;
        let reports = [
            waiting("a", 10, now),
            waiting("b", 10, now),
            waiting("c", 20, now),
            // A heartbeat more than an interval old: a node that stopped while waiting.
            waiting("old", 5, now - 301),
        ];
        assert_eq!(queue_ahead(reports.iter(), &[], "c", 20, now), 2);
        assert_eq!(queue_ahead(reports.iter(), &[], "b", 10, now), 1);
        assert_eq!(queue_ahead(reports.iter(), &[], "a", 10, now), 0);
        // "a" took a slot; its report still says `waiting` until its `running` report lands.
        let holders = ["a".to_string()];
        assert_eq!(queue_ahead(reports.iter(), &holders, "c", 20, now), 1);
        assert_eq!(queue_ahead(reports.iter(), &holders, "b", 10, now), 0);
    }
}
