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
//!
//! The loop and its full cycle are here; their jobs have a file each: admitting a plan
//! (`admission.rs`), finding and doing the work (`work.rs`), taking a rollout slot and running
//! with it (`slot.rs`), and the node's report and Events (`publish.rs`).

mod admission;
mod publish;
mod slot;
mod work;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;

use super::endpoint::Health;
use super::error::FleetError;
use super::events::Events;
use super::report::{AgentState, NodeReport};
use super::signature::{SignaturePolicy, Verified};
use super::source::PlanSource;
use super::trust::AgentConfig;
use crate::clock::now_unix;
use crate::ops::Engine;
use crate::spec::Plan;
use work::{find_work, Work};

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
pub fn run(opts: AgentOptions, stop: &'static AtomicBool) -> Result<(), FleetError> {
    let source = PlanSource::open(&opts.plan)?;
    let client = super::client(opts.kubeconfig.as_deref(), opts.context.as_deref())
        .map_err(|e| e.prefixed("cannot reach the Kubernetes API"))?;
    let watch_client = super::watch_client(opts.kubeconfig.as_deref(), opts.context.as_deref())
        .map_err(|e| e.prefixed("cannot reach the Kubernetes API"))?;
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

/// Work found by a full cycle, waiting for a slot.
struct Pending {
    plan: Plan,
    changes: usize,
}

/// The node agent's state between goes round the loop.
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
    /// [`super::source::PlanText::version`] of the plan file as last read.
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

    /// One go round the loop.
    fn tick(&mut self) {
        self.health().last_tick = Some(Instant::now());
        let text = match self.source.read() {
            Ok(t) => t,
            Err(e) => return self.refuse(Some("unreadable"), e.to_string()),
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
