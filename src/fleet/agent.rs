//! `keyplan agent`: one reconcile loop per node (a DaemonSet pod), over the same engine API as
//! the CLI ([`crate::ops`]). docs/fleet.md describes it for operators.
//!
//! Every `poll` the loop reads the plan file ([`super::source`], by path through the
//! ConfigMap volume's `..data` link). A **full cycle** runs when the plan's text changed and
//! at least every `interval`:
//!
//! 1. load and validate the whole plan, cut it to this node ([`crate::spec::Plan::for_node`]),
//!    and hold it to the agent's configuration ([`super::trust`]); a refused plan changes
//!    nothing;
//! 2. open an apply session (state lock, journal on the node) and see whether there is work:
//!    an interrupted run to finish, or a plan with changes;
//! 3. no work: report `in_sync` (no Lease is touched);
//! 4. work: unless `max_failed_nodes` node runs have failed fleet-wide ([`super::report`]),
//!    take a rollout slot ([`super::slots`]); all busy: report `waiting` and try the slots
//!    again at every poll (without observing again);
//! 5. with a slot: plan afresh, finish the interrupted run, run the plan's rounds, renewing the
//!    slot from a second thread until it is released; report the outcome and emit Events,
//!    then release the slot.
//!
//! A lost slot (another node took it after it expired) or SIGTERM stops the run between
//! steps (the running ones finish; the journal keeps the run open, and the next cycle
//! finishes it). The loop never panics on what it reads; every failure becomes the report's
//! state and message.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;

use super::endpoint::Health;
use super::events::{EventType, Events};
use super::report::{
    AgentRun, AgentState, DeviceSummary, Failure, KeySummary, NodeReport, ReportError, Reports,
    Stored,
};
use super::signature::{Refusal, SignaturePolicy, Verified};
use super::slots::{Slot, SlotError, Slots};
use super::source::{PlanSource, PlanText};
use super::trust::AgentConfig;
use crate::apply::StepEvent;
use crate::clock::now_unix;
use crate::error::Error;
use crate::ops::apply::{ApplySession, RunOptions};
use crate::ops::plan::PlanRequest;
use crate::ops::Engine;
use crate::spec::Plan;

/// How the agent runs (`keyplan agent` options).
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// This node's name.
    pub node: String,
    /// The plan file, a key of a ConfigMap volume.
    pub plan: PathBuf,
    /// The agent's configuration (its KMS allow-list and credentials).
    pub config: AgentConfig,
    /// The node's state directory (journal, lock), overriding the plan's `state_dir`.
    pub state_dir: PathBuf,
    /// Time between full cycles.
    pub interval: Duration,
    /// Time between reads of the plan file (and slot attempts while waiting).
    pub poll: Duration,
    /// Lease duration of a rollout slot; renewed every third of it while a run lasts.
    pub slot_duration: Duration,
    /// The fleet namespace, overriding the plan's `settings.fleet.namespace`.
    pub namespace: Option<String>,
    /// kubeconfig file; `None`: in-cluster service account (or `KUBECONFIG`).
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context.
    pub context: Option<String>,
    /// Address of the `/metrics` and `/healthz` endpoint; `None`: none.
    pub listen: Option<SocketAddr>,
    /// The signature check plans must pass (`--trusted-keys`, `--cluster`); `None`: plans
    /// need no signature.
    pub signatures: Option<SignaturePolicy>,
    /// The journal's audit trail (`--journal-keep-runs`, `--journal-archive`): the agent's
    /// own, never the plan's.
    pub journal: crate::spec::JournalRetention,
}

/// Runs the agent until `stop` is set (SIGTERM), then releases what it holds, reports
/// `stopped` and returns.
///
/// Errors: a text saying why the agent cannot start: the plan file is not a key of a
/// ConfigMap volume, no Kubernetes client can be built, or the listen address is taken.
pub fn run(opts: AgentOptions, stop: &'static AtomicBool) -> Result<(), String> {
    let source = PlanSource::open(&opts.plan)?;
    let client = super::client(opts.kubeconfig.as_deref(), opts.context.as_deref())
        .map_err(|e| format!("cannot reach the Kubernetes API: {e}"))?;
    let watch_client = super::watch_client(opts.kubeconfig.as_deref(), opts.context.as_deref())
        .map_err(|e| format!("cannot reach the Kubernetes API: {e}"))?;
    let health = Arc::new(Mutex::new(Health::default()));
    if let Some(addr) = opts.listen {
        super::endpoint::serve(addr, opts.node.clone(), opts.poll, Arc::clone(&health))?;
    }
    let mut agent = Agent::new(opts, source, client, health, stop);
    agent.watch_client = Some(watch_client);
    agent.start();
    while !stop.load(Ordering::SeqCst) {
        agent.tick();
        let until = Instant::now() + agent.opts.poll;
        // A waiting agent goes round again as soon as its watch shows a change (a slot freed,
        // a halt, a pause) or its turn comes; otherwise at the next poll.
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            let step = (Instant::now() + Duration::from_millis(100)).min(until);
            if agent.wait_for_fleet(step) {
                break;
            }
        }
    }
    agent.stopped();
    Ok(())
}

/// A plan whose signature verified: what the agent runs while a newer plan is refused.
#[derive(Clone)]
struct GoodPlan {
    text: String,
    digest: String,
    signature: Vec<u8>,
    verified: Verified,
}

/// The file in the state directory that keeps the last good signed plan across restarts.
const GOOD_PLAN_FILE: &str = "agent-signed-plan.json";

/// [`GOOD_PLAN_FILE`]'s content: the plan's text and its signature file's text.
#[derive(serde::Serialize, serde::Deserialize)]
struct StoredGoodPlan {
    plan: String,
    signature: String,
}

/// How long a free slot is left to the nodes ahead in the queue before a node further back
/// takes it (a node ahead may have stopped while waiting; its report says `waiting` until its
/// heartbeat is an interval old).
const FREE_SLOT_GRACE: Duration = Duration::from_secs(1);

/// Work found by a full cycle, waiting for a slot.
struct Pending {
    plan: Plan,
    changes: usize,
}

struct Agent {
    opts: AgentOptions,
    source: PlanSource,
    client: kube::Client,
    health: Arc<Mutex<Health>>,
    stop: &'static AtomicBool,
    namespace: String,
    report: NodeReport,
    /// The report ConfigMap as last read or written.
    prior: Option<ConfigMap>,
    /// The report as last published (without `updated_at`), and when.
    published: Option<(NodeReport, Instant)>,
    /// [`PlanText::version`] of the plan file as last read.
    last_version: Option<String>,
    /// The last plan whose signature verified and that loaded (when signatures are required).
    good: Option<GoodPlan>,
    /// A plan whose signature verified in this cycle, until it loads.
    candidate: Option<GoodPlan>,
    next_full: Instant,
    pending: Option<Pending>,
    /// Whether the last plan had devices on this node (a node without any writes no report).
    has_devices: bool,
    /// Whether the previous report was read (after the first plan that loaded).
    adopted: bool,
    /// The client of the fleet watch (longer read timeout: [`super::watch_client`]).
    watch_client: Option<kube::Client>,
    /// The fleet watch, while work waits for a slot ([`super::watch`]).
    watch: Option<super::watch::FleetWatch>,
    /// The watch's generation the last slot attempt saw.
    seen_generation: u64,
    /// When this node began to wait for a slot, Unix seconds (its place in the queue).
    waiting_since: Option<u64>,
    /// When a free slot was first seen that a node ahead in the queue may take.
    free_since: Option<Instant>,
    /// This node's Events (one writer, so that repeats are aggregated).
    events: Option<Events>,
}

impl Agent {
    fn new(
        opts: AgentOptions,
        source: PlanSource,
        client: kube::Client,
        health: Arc<Mutex<Health>>,
        stop: &'static AtomicBool,
    ) -> Agent {
        let namespace = opts
            .namespace
            .clone()
            .unwrap_or_else(|| crate::spec::Fleet::default().namespace);
        let report = NodeReport::fresh(&opts.node, opts.interval.as_secs(), now_unix());
        Agent {
            opts,
            source,
            client,
            health,
            stop,
            namespace,
            report,
            prior: None,
            published: None,
            last_version: None,
            good: None,
            candidate: None,
            next_full: Instant::now(),
            pending: None,
            has_devices: true,
            adopted: false,
            watch_client: None,
            watch: None,
            seen_generation: 0,
            waiting_since: None,
            free_since: None,
            events: None,
        }
    }

    fn reports(&self) -> Reports {
        Reports::new(self.client.clone(), &self.namespace)
    }

    /// Writes an Event about this node with its one writer for the fleet namespace (kept, so
    /// that a repeated Event updates its count: [`Events::emit`]).
    fn emit(&mut self, kind: EventType, reason: &str, message: &str) {
        let events = self.take_events();
        events.emit(kind, reason, message);
        self.events = Some(events);
    }

    /// This node's Event writer for the fleet namespace, taken out (put it back in
    /// `self.events`, so that repeats are aggregated); a new one after a namespace change.
    fn take_events(&mut self) -> Events {
        match self.events.take() {
            Some(e) if e.namespace() == self.namespace => e,
            _ => Events::new(self.client.clone(), &self.namespace, &self.opts.node),
        }
    }

    /// Waits until `until`, or until the fleet watch (while work waits for a slot) shows a
    /// change or this node's turn at a free slot comes; whether to go round now.
    fn wait_for_fleet(&self, until: Instant) -> bool {
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

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn start(&mut self) {
        tracing::info!(node = %self.opts.node, plan = %self.source.path().display(), "keyplan agent starting");
        if let Some(p) = &self.opts.signatures {
            let keys: Vec<&str> = p.keys().iter().map(|k| k.fingerprint()).collect();
            tracing::info!(node = %self.opts.node, cluster = %p.cluster(), "plans must be signed for cluster {:?} by one of: {}", p.cluster(), keys.join(", "));
        }
        self.restore_good();
    }

    /// Picks up this node's previous report (a restarted agent keeps its failure, last run and
    /// last success), once the fleet namespace is known.
    fn adopt_previous(&mut self) {
        match self.reports().get(&self.opts.node) {
            Ok(Some(stored)) => self.adopt(stored),
            Ok(None) => {}
            Err(e) => tracing::warn!("could not read this node's previous report: {e}"),
        }
    }

    fn adopt(&mut self, stored: Stored) {
        if let Some(old) = stored.report {
            self.report.last_run = old.last_run;
            self.report.last_success_at = old.last_success_at;
            self.report.failure = old.failure;
        }
        self.prior = Some(stored.object);
    }

    /// One go round the loop.
    fn tick(&mut self) {
        self.health().last_tick = Some(Instant::now());
        let text = match self.source.read() {
            Ok(t) => t,
            Err(e) => return self.refuse(Some("unreadable"), e),
        };
        let version = text.version();
        let changed = self.last_version.as_deref() != Some(version.as_str());
        if changed || Instant::now() >= self.next_full {
            if changed && self.last_version.is_some() {
                tracing::info!(digest = %text.digest, "the plan changed");
            }
            self.last_version = Some(version);
            self.next_full = Instant::now() + self.opts.interval;
            if let Some(run) = self.admit(text) {
                self.report.plan_digest = Some(run.1);
                self.full_cycle(&run.0);
            }
            self.health().last_cycle_at = Some(now_unix());
        } else if self.pending.is_some() {
            self.try_slot();
        }
        if self.pending.is_none() {
            // Nothing waits for a slot: no watch, no place in the queue.
            self.watch = None;
            self.waiting_since = None;
            self.free_since = None;
        }
    }

    /// The plan text to run this cycle, and its digest: the plan file's, unless the agent
    /// requires signatures and its signature does not verify; then the last good signed plan
    /// (the refusal is reported), or nothing when there is none (the node reports `refused`).
    fn admit(&mut self, text: PlanText) -> Option<(String, String)> {
        let Some(policy) = &self.opts.signatures else {
            return Some((text.text, text.digest));
        };
        let running = self.good.as_ref().map(|g| g.verified.signed_at);
        let verdict = policy.verify(
            text.text.as_bytes(),
            text.signature.as_deref(),
            &self.source.signature_name(),
            running,
        );
        match verdict {
            Ok(verified) => {
                self.candidate = Some(GoodPlan {
                    text: text.text.clone(),
                    digest: text.digest.clone(),
                    signature: text.signature.unwrap_or_default(),
                    verified,
                });
                Some((text.text, text.digest))
            }
            Err(refusal) => {
                self.candidate = None;
                self.refuse_signature(&text.digest, &refusal);
                match &self.good {
                    Some(g) => Some((g.text.clone(), g.digest.clone())),
                    None => {
                        self.refuse(None, refusal.to_string());
                        None
                    }
                }
            }
        }
    }

    /// A plan whose signature does not verify: said once per plan version and reason (log,
    /// Event, counter), and in the report (`refused_plan`) for as long as it stays.
    fn refuse_signature(&mut self, digest: &str, refusal: &Refusal) {
        let message = refusal.to_string();
        let same = self
            .report
            .refused_plan
            .as_ref()
            .is_some_and(|r| r.digest == digest && r.message == message);
        if !same {
            let running = match &self.good {
                Some(g) => format!(
                    "it keeps running the last good plan (sha256 {}, signed at {} by {})",
                    g.digest,
                    crate::clock::rfc3339(g.verified.signed_at),
                    g.verified.key
                ),
                None => "it has no good signed plan to run, so it does nothing".to_string(),
            };
            tracing::error!(node = %self.opts.node, digest = %digest, reason = refusal.reason(), "plan refused, nothing of it is applied: {message}; {running}");
            self.emit(
                EventType::Warning,
                "PlanRefused",
                &format!(
                    "node {}: plan sha256 {digest} refused ({}): {message}; {running}",
                    self.opts.node,
                    refusal.reason()
                ),
            );
            *self
                .health()
                .plan_refusals
                .entry(refusal.reason())
                .or_default() += 1;
            self.report.refused_plan = Some(super::report::RefusedPlan {
                digest: digest.to_string(),
                reason: refusal.reason().to_string(),
                message,
                since: now_unix(),
            });
        }
        self.health().plan_refused = true;
    }

    /// A plan whose signature verified has loaded: it is the good plan now (kept in the state
    /// directory, so a restarted agent runs it while the ConfigMap holds a refused plan).
    fn accept_candidate(&mut self) {
        let Some(c) = self.candidate.take() else {
            return;
        };
        self.report.refused_plan = None;
        self.report.plan_signature = Some(super::report::PlanSignature {
            key: c.verified.key.clone(),
            signed_at: c.verified.signed_at,
        });
        self.health().plan_signed = Some(true);
        let new = self
            .good
            .as_ref()
            .is_none_or(|g| g.digest != c.digest || g.signature != c.signature);
        if new {
            tracing::info!(node = %self.opts.node, digest = %c.digest, key = %c.verified.key, signed_at = c.verified.signed_at, "signed plan accepted");
            let stored = StoredGoodPlan {
                plan: c.text.clone(),
                signature: String::from_utf8_lossy(&c.signature).into_owned(),
            };
            let path = self.opts.state_dir.join(GOOD_PLAN_FILE);
            let written = serde_json::to_vec(&stored)
                .map_err(|e| e.to_string())
                .and_then(|bytes| {
                    crate::fsutil::ensure_private_dir(&self.opts.state_dir)
                        .and_then(|()| crate::fsutil::write_atomic(&path, &bytes, 0o600))
                        .map_err(|e| e.to_string())
                });
            if let Err(e) = written {
                tracing::warn!(node = %self.opts.node, "could not keep the signed plan in {} (a restarted agent then runs only a plan whose signature verifies): {e}", path.display());
            }
        }
        self.good = Some(c);
    }

    /// At start, with signatures required: the last good signed plan kept in the state
    /// directory, if its signature still verifies (the trusted keys or the cluster may have
    /// changed since).
    fn restore_good(&mut self) {
        let Some(policy) = &self.opts.signatures else {
            return;
        };
        self.health().plan_signed = Some(false);
        let path = self.opts.state_dir.join(GOOD_PLAN_FILE);
        let stored: StoredGoodPlan = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(node = %self.opts.node, "ignoring {}: {e}", path.display());
                    return;
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                tracing::warn!(node = %self.opts.node, "cannot read {}: {e}", path.display());
                return;
            }
        };
        match policy.verify(
            stored.plan.as_bytes(),
            Some(stored.signature.as_bytes()),
            GOOD_PLAN_FILE,
            None,
        ) {
            Ok(verified) => {
                let digest = crate::saved::sha256_hex(stored.plan.as_bytes());
                tracing::info!(node = %self.opts.node, digest = %digest, "the last good signed plan is kept in {}: it runs while the ConfigMap's plan is refused", path.display());
                self.report.plan_signature = Some(super::report::PlanSignature {
                    key: verified.key.clone(),
                    signed_at: verified.signed_at,
                });
                self.good = Some(GoodPlan {
                    text: stored.plan,
                    digest,
                    signature: stored.signature.into_bytes(),
                    verified,
                });
            }
            Err(refusal) => {
                tracing::warn!(node = %self.opts.node, "the signed plan kept in {} is not run: {refusal}", path.display());
            }
        }
    }

    /// Loads the plan, finds whether there is work, and starts on it.
    fn full_cycle(&mut self, text: &str) {
        // Work known from an earlier cycle stays known when this cycle cannot observe for a
        // reason of the node's own (a device gone): the node still takes its turn, and a run
        // that fails counts towards max_failed_nodes. When it cannot observe because a KMS
        // cannot be asked (an outage), it waits for its next full cycle instead: taking a slot
        // could only fail before changing anything (docs/fleet.md, "A KMS outage").
        let known = self.pending.take().map(|p| p.changes);
        let plan = match self.load(text) {
            Ok(p) => p,
            Err(message) => {
                self.candidate = None;
                return self.refuse(Some("invalid"), message);
            }
        };
        self.accept_candidate();
        let refused = self.report.refused_plan.is_some();
        self.health().plan_refused = refused;
        let here = !plan.devices.is_empty();
        if here != self.has_devices {
            if !here {
                let note = plan
                    .scope
                    .as_ref()
                    .and_then(|sc| sc.note())
                    .unwrap_or_default();
                tracing::info!(node = %self.opts.node, "no device of the plan is on this node: nothing to do, and no report is written (the Role names only the plan's nodes' reports). {note}");
            }
            self.has_devices = here;
        }
        if !here {
            self.set_state(
                AgentState::InSync,
                Some("no device of the plan is on this node".into()),
            );
            return;
        }
        let engine = match Engine::open(plan.clone()) {
            Ok(e) => e,
            Err(e) => {
                self.cannot_check(&e);
                self.pending = known.map(|changes| Pending { plan, changes });
                return;
            }
        };
        let work = match find_work(&engine) {
            Ok(w) => w,
            Err(e) if e.could_not_look() => {
                self.summarize(&engine, None);
                drop(engine);
                self.could_not_look(&e, false);
                return;
            }
            Err(e) => {
                self.summarize(&engine, None);
                self.cannot_check(&e);
                drop(engine);
                self.pending = known.map(|changes| Pending { plan, changes });
                return;
            }
        };
        match work {
            Work::None { observed, waiting } => {
                self.report.changes = 0;
                // The node matches the plan: a failure of an earlier run no longer counts.
                self.report.failure = None;
                self.summarize(&engine, Some(&observed));
                self.set_waiting(waiting);
                self.publish(false);
            }
            Work::Some { changes, observed } => {
                self.report.changes = changes;
                self.summarize(&engine, observed.as_ref());
                drop(engine);
                self.pending = Some(Pending { plan, changes });
                self.try_slot();
            }
        }
    }

    /// The plan cannot be read or is refused (`reason`: `unreadable`, `invalid`, or a
    /// signature [`Refusal::reason`]): nothing is changed; said once per reason in the log
    /// and an Event, and always in the report and the metrics.
    /// `reason` is `None` when the refusal was already said ([`Agent::refuse_signature`]).
    fn refuse(&mut self, reason: Option<&'static str>, message: String) {
        let first = reason.is_some()
            && (self.report.state != AgentState::Refused
                || self.report.message.as_deref() != Some(message.as_str()));
        self.health().plan_refused = true;
        if first {
            if let Some(reason) = reason {
                *self.health().plan_refusals.entry(reason).or_default() += 1;
            }
            tracing::error!(node = %self.opts.node, "plan refused, nothing changed: {message}");
            self.emit(
                EventType::Warning,
                "PlanRefused",
                &format!(
                    "node {}: plan refused, nothing changed: {message}",
                    self.opts.node
                ),
            );
        }
        self.pending = None;
        self.set_state(AgentState::Refused, Some(message));
        self.publish(false);
    }

    /// The plan of `text`, for this node, held to the agent's configuration.
    fn load(&mut self, text: &str) -> Result<Plan, String> {
        let plan = crate::spec::load_text(text, self.source.path()).map_err(|e| {
            format!(
                "{e}{}",
                e.help().map(|h| format!(" ({h})")).unwrap_or_default()
            )
        })?;
        if !plan.devices.is_empty() && !plan.names_nodes() {
            // Every node's agent would take every device as its own: each would rotate the
            // same KMS entries alone.
            return Err(format!(
                "no device of the plan names its node: in fleet mode every device needs `node: <node name>`, or every node's agent would act on it ({} device(s) without one)",
                plan.devices.len()
            ));
        }
        let mut plan = plan.for_node(&self.opts.node);
        plan.state_dir = self.opts.state_dir.clone();
        plan.journal = self.opts.journal.clone();
        self.opts
            .config
            .restrict(&mut plan)
            .map_err(|refused| refused.join("; "))?;
        self.namespace = self
            .opts
            .namespace
            .clone()
            .unwrap_or_else(|| plan.fleet.namespace.clone());
        if !self.adopted {
            // Only now is the fleet namespace known (the plan's settings.fleet.namespace).
            self.adopted = true;
            self.adopt_previous();
        }
        Ok(plan)
    }

    /// A cycle (or, `in_run`, a run before its first step) stopped because something could not
    /// be looked at: a KMS unreachable, sealed, refusing or silent ([`Error::could_not_look`]).
    /// Nothing was changed, so it is not a failed rotation and does not count towards
    /// `max_failed_nodes`: a KMS outage every node sees before any change must not halt the
    /// fleet until an operator clears it. It is reported (`error` state, the message), said
    /// in the log and an `ObservationFailed` Event once per message, and counted in
    /// `keyplan_agent_observation_failures`; the node looks again at its next full cycle.
    fn could_not_look(&mut self, e: &Error, in_run: bool) {
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

    fn cannot_check(&mut self, e: &Error) {
        let message = e.to_string();
        tracing::error!(node = %self.opts.node, "could not observe or plan: {message}");
        self.set_state(AgentState::Error, Some(message));
        self.publish(false);
    }

    /// With work pending: unless the rollout is halted or paused, takes a slot and runs.
    ///
    /// What it decides on is the fleet watch's copy ([`super::watch`], started here the first
    /// time): the reports (failures, the queue), the pause and the slot Leases, so a waiting
    /// agent sends no request until a slot is free for it. Waiting nodes take free slots in
    /// the order they began to wait (their reports' `waiting_since`, then node name): the
    /// node `k` places back takes the `k`-th free slot; a slot left free for
    /// [`FREE_SLOT_GRACE`] (a node ahead stopped while waiting) is taken by any node. Every
    /// write is conditional ([`Slots::take`]); one that loses waits for the watch to show the
    /// winner.
    fn try_slot(&mut self) {
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
                self.set_state(AgentState::Error, Some(e));
                self.publish(false);
                self.pending = Some(pending);
                return;
            }
        };
        // The node's place in the queue: kept through a pause, so that at `fleet resume` the
        // nodes that waited longest take the free slots at once, in order, without racing.
        let since = *self.waiting_since.get_or_insert(now_unix());
        if let Some(pause) = &seen.pause {
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
            self.pending = Some(pending);
            return;
        }
        self.health().paused = false;
        let failed = failed_nodes(seen.reports.values());
        if failed.len() >= fleet.max_failed_nodes as usize {
            let message = format!(
                "the rollout is halted: {} node run(s) failed ({}), max_failed_nodes is {}; nothing is started until they succeed or an operator runs `keyplan fleet clear`",
                failed.len(),
                failed.join(", "),
                fleet.max_failed_nodes
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
        let now = now_unix();
        let view = slots.view(&seen.leases);
        let choice = match view.mine {
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
        };
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

    /// The fleet watch's copy of the namespace (the watch is started, or restarted for another
    /// namespace, here); `None` until it has listed. Remembers the generation seen, so that
    /// the loop wakes at the next change.
    ///
    /// Errors: the watch cannot be started, or it fails (denied, unreachable) and has no copy.
    fn fleet_seen(&mut self) -> Result<Option<super::watch::Seen>, String> {
        if self.watch.as_ref().map(|w| w.namespace.as_str()) != Some(self.namespace.as_str()) {
            let client = self
                .watch_client
                .clone()
                .unwrap_or_else(|| self.client.clone());
            self.watch = Some(super::watch::FleetWatch::start(client, &self.namespace)?);
        }
        let Some(watch) = &self.watch else {
            return Ok(None);
        };
        self.seen_generation = watch.generation();
        match watch.snapshot() {
            Some(seen) => Ok(Some(seen)),
            None => match watch.error() {
                Some(e) => Err(format!("cannot see the rollout slots and reports: {e}")),
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
                pending.changes
            )),
        );
        let message = format!(
            "node {}: applying {} change(s) (rollout slot {slot_name})",
            self.opts.node, pending.changes
        );
        tracing::info!(node = %self.opts.node, lease = %slot_name, event = "run_initiated", "{message}");
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
                events.emit(EventType::Normal, "RunStarted", &message);
                written
            });
            self.health().running = true;
            let outcome = match Engine::open(pending.plan) {
                Ok(engine) => {
                    let out = run_engine(&engine, &node, &run_stop);
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
        // The slot is renewed until it is released, right after the report: after a success
        // the report shows the node as it is now (one observation, no PBKDF), after anything
        // else what is left is observed once the slot is free; Events are written after the
        // release.
        let lost = renewer.lost();
        let mut after: Vec<(EventType, &'static str, String)> = Vec::new();
        let mut last = None;
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
                let why = match &lost {
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
                self.report.commits_waiting = o.diff.waiting.clone();
            }
            self.summarize(engine, observed.as_ref().map(|p| &p.observed));
            self.publish(false);
        }
        if label != "success" {
            // Look again at the next poll, not only after a whole interval.
            self.next_full = Instant::now();
        }
    }

    /// Puts what `status` finds (and the keyslots `observed` saw) into the report.
    fn summarize(&mut self, engine: &Engine, observed: Option<&crate::observe::Observed>) {
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
            self.report.observation = Some(super::report::Observation::of(
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
    fn set_waiting(&mut self, waiting: Vec<crate::diff::CommitWait>) {
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
        if self.report.commits_waiting != waiting {
            tracing::info!(node = %self.opts.node, event = "commit_waiting", "{message}");
            self.emit(EventType::Normal, "CommitWaiting", &message);
        }
        self.report.commits_waiting = waiting;
        self.set_state(AgentState::Waiting, Some(text.join("; ")));
    }

    fn set_state(&mut self, state: AgentState, message: Option<String>) {
        self.report.state = state;
        // Only a node waiting for a slot has a place in the queue (try_slot sets it again).
        self.report.waiting_since = None;
        self.report.message = message;
        self.health().state = Some(state);
    }

    /// Writes the report when it changed, or `force`, or when the last write is half an
    /// interval old (so every full cycle writes it: the heartbeat). A write that loses to another writer (409: `fleet clear`) reads the report
    /// again, keeps its annotations and retries once.
    fn publish(&mut self, force: bool) {
        if !self.has_devices {
            return;
        }
        let mut unchanged = self.report.clone();
        let same = self.published.as_ref().is_some_and(|(last, at)| {
            unchanged.updated_at = last.updated_at;
            // Half an interval: every full cycle rewrites it, so the heartbeat is one interval.
            *last == unchanged && at.elapsed() < self.opts.interval / 2
        });
        if same && !force {
            return;
        }
        self.report.updated_at = now_unix();
        let result = put_report(
            &self.reports(),
            &self.opts.node,
            &self.report,
            self.prior.as_ref(),
        );
        let written = self.report.clone();
        self.published_as(written, result);
    }

    /// Keeps what a write of the report `written` left: the object written (the next write's
    /// condition) or, after a refusal, no prior (read it again next time).
    fn published_as(&mut self, written: NodeReport, result: Result<ConfigMap, ReportError>) {
        match result {
            Ok(cm) => {
                self.prior = Some(cm);
                self.published = Some((written, Instant::now()));
            }
            Err(e) => {
                // A prior that may be stale: read it again next time.
                if e.code.is_some() {
                    self.prior = None;
                }
                tracing::warn!(node = %self.opts.node, "could not write this node's report: {e}");
            }
        }
    }

    /// SIGTERM: nothing runs any more (a run in progress stopped between steps and gave its
    /// slot back); say so.
    fn stopped(&mut self) {
        tracing::info!(node = %self.opts.node, "keyplan agent stopping");
        self.set_state(
            AgentState::Stopped,
            Some("the agent stopped (SIGTERM)".into()),
        );
        self.publish(true);
    }
}

/// Writes `report` over `prior` (a conditional update; a create when there is none). A write
/// that loses to another writer (409: `fleet clear` annotated the report) or finds the report
/// gone (404) reads it again and retries once. The ConfigMap written.
///
/// Errors: [`Reports::put`]'s and [`Reports::get`]'s (denied, unreachable, a second conflict).
fn put_report(
    reports: &Reports,
    node: &str,
    report: &NodeReport,
    prior: Option<&ConfigMap>,
) -> Result<ConfigMap, ReportError> {
    match reports.put(report, prior) {
        Err(e) if matches!(e.code, Some(409) | Some(404)) => {
            let fresh = reports.get(node)?;
            reports.put(report, fresh.as_ref().map(|s| &s.object))
        }
        written => written,
    }
}

/// The nodes whose failures count towards `max_failed_nodes` among `reports`.
fn failed_nodes<'a>(reports: impl Iterator<Item = &'a super::report::Stored>) -> Vec<String> {
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
    reports: impl Iterator<Item = &'a super::report::Stored>,
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

/// What a full cycle found.
enum Work {
    /// The node matches the plan, or did all it can and waits for other nodes' votes on a
    /// shared key (`waiting`).
    None {
        observed: crate::observe::Observed,
        waiting: Vec<crate::diff::CommitWait>,
    },
    /// An interrupted run to finish (`observed` is then `None`) or changes.
    Some {
        changes: usize,
        observed: Option<crate::observe::Observed>,
    },
}

/// Whether `engine`'s plan has work on this node: an interrupted run, or changes. Holds the
/// state lock only while it looks.
fn find_work(engine: &Engine) -> Result<Work, Error> {
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
fn change_count(diff: &crate::diff::Diff) -> usize {
    diff.keys.len() + diff.slots.len()
}

/// What [`run_engine`] did.
struct Done {
    run: Option<String>,
    steps: usize,
    /// The last plan, which found nothing left to do (`None` when the run stopped early).
    last: Option<crate::ops::plan::Planned>,
}

/// Finishes the interrupted run, if any, then plans and runs the rounds, logging each step.
fn run_engine(engine: &Engine, node: &str, stop: &AtomicBool) -> Result<Done, Error> {
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
    use crate::fleet::report::report_name;

    fn waiting(node: &str, since: u64, now: u64) -> Stored {
        let mut report = NodeReport::fresh(node, 300, now);
        report.state = AgentState::Waiting;
        report.changes = 1;
        report.waiting_since = Some(since);
        Stored {
            report: Some(report),
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
