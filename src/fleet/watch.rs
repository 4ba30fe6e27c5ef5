//! What a waiting agent knows of the fleet without asking: a resumable watch of the fleet
//! namespace's Leases (the rollout slots, [`super::slots`]) and of its node reports and the
//! operator's pause ([`super::report`], [`super::pause`]), kept as a local copy.
//!
//! Each watch is kube-runtime's `watcher` (one `list` from the API server's watch cache, then
//! a `watch` from that `resourceVersion`, resumed from the last one seen when the connection
//! ends, listed afresh when the server answers 410 Gone; failures back off exponentially).
//! So an agent waiting for a slot sends no request while nothing changes, and learns of a
//! released slot, a failed run that halts the rollout or an operator's pause within the
//! watch's latency (milliseconds), not at its next poll. docs/fleet.md, "Waiting for a slot".
//!
//! The watches run on keyplan's shared tokio runtime ([`crate::runtime::spawn`]) while the
//! [`FleetWatch`] lives; dropping it stops them. They need `list` and `watch` on Leases and
//! ConfigMaps in the fleet namespace (deploy/kubernetes/rbac.yaml, [`super::api::AGENT_CALLS`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt as _;

use super::pause::Pause;
use super::report::Stored;
use crate::fleet::error::FleetError;

/// The fleet namespace as the watches last saw it.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// The rollout slot Leases (names starting with [`super::slots::SLOT_PREFIX`]), by name.
    pub leases: BTreeMap<String, Lease>,
    /// The node reports, by ConfigMap name.
    pub reports: BTreeMap<String, Stored>,
    /// The operator's pause, if one is in effect.
    pub pause: Option<Pause>,
    /// Bumped at every change a waiting agent acts on ([`acts_on`]): a slot taken, released
    /// or handed on, a report entering or leaving the queue or failing, a pause set or lifted,
    /// a (re)list, an error. Not at a slot's renewal nor a report's heartbeat, which change
    /// the copy only: with 100 nodes waiting, each renewal and heartbeat would wake every one
    /// of them for nothing.
    pub generation: u64,
    /// Why a watch last failed (it retries by itself), until it delivers again.
    pub error: Option<String>,
    leases_synced: bool,
    reports_synced: bool,
}

impl Seen {
    /// Whether both watches have listed once: the copy is complete (as of a moment).
    pub fn synced(&self) -> bool {
        self.leases_synced && self.reports_synced
    }
}

struct Shared {
    seen: Mutex<Seen>,
    changed: Condvar,
}

impl Shared {
    /// Applies `f` to the copy; when it says the change is one a waiting agent acts on (or
    /// the copy had an error, now cleared by `f`), bumps the generation and wakes the waiters.
    fn update(&self, f: impl FnOnce(&mut Seen) -> bool) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let had_error = seen.error.is_some();
        let acted_on = f(&mut seen);
        if acted_on || had_error != seen.error.is_some() {
            seen.generation += 1;
            self.changed.notify_all();
        }
    }
}

/// What of a slot Lease a waiting agent acts on: its holder (a renewal changes only its
/// `renewTime`; an expiry changes nothing on the server, and the agent's poll finds it).
fn lease_key(l: &Lease) -> Option<String> {
    l.spec.as_ref().and_then(|s| s.holder_identity.clone())
}

/// [`report_key`]'s answer: genuine, (node, waits for a slot, waiting since), failure counts.
type ReportKey = (bool, Option<(String, bool, Option<u64>)>, bool);

/// What of a node report a waiting agent acts on ([`super::agent`]'s queue and halt): whether
/// it is a genuine report, its node, whether it waits for a slot (`waiting`, `paused`) and
/// since when, and whether its failure counts. Its heartbeat (`updated_at`) is not: a report
/// whose heartbeat grows old drops out of the queue by the clock, at the agent's next poll.
fn report_key(r: &Stored) -> ReportKey {
    use super::report::AgentState;
    let queue = r.report.as_ref().map(|r| {
        (
            r.node.clone(),
            matches!(r.state, AgentState::Waiting | AgentState::Paused),
            r.waiting_since,
        )
    });
    (r.genuine(), queue, r.counts_as_failed())
}

/// Whether a change from `before` to `after` (by name, `None` for absent) is one a waiting
/// agent acts on.
fn acts_on<T, K: PartialEq>(before: Option<&T>, after: Option<&T>, key: impl Fn(&T) -> K) -> bool {
    before.map(&key) != after.map(&key)
}

/// The two watches of one fleet namespace; they stop when this is dropped.
pub struct FleetWatch {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The namespace watched.
    pub namespace: String,
}

impl FleetWatch {
    /// Starts watching the slots, the reports and the pause in `namespace` with `client`
    /// (whose read timeout must exceed the watch's 290 s server-side timeout:
    /// [`super::watch_client`]). Returns at once; [`FleetWatch::snapshot`] is `None` until
    /// both watches have listed.
    ///
    /// Errors: the shared runtime cannot be started.
    pub fn start(client: kube::Client, namespace: &str) -> Result<FleetWatch, FleetError> {
        let shared = Arc::new(Shared {
            seen: Mutex::new(Seen::default()),
            changed: Condvar::new(),
        });
        let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let reports: Api<ConfigMap> = Api::namespaced(client, namespace);
        let config = watcher::Config::default().any_semantic();
        let lease_task = watch_leases(Arc::clone(&shared), leases, config.clone())?;
        let report_task = watch_reports(Arc::clone(&shared), reports, config)?;
        Ok(FleetWatch {
            shared,
            tasks: vec![lease_task, report_task],
            namespace: namespace.to_string(),
        })
    }

    /// A copy of what the watches saw, once both have listed; `None` before.
    pub fn snapshot(&self) -> Option<Seen> {
        let seen = self.shared.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.synced().then(|| seen.clone())
    }

    /// The generation now ([`Seen::generation`]).
    pub fn generation(&self) -> u64 {
        self.shared
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .generation
    }

    /// Why a watch last failed, if it has not delivered since.
    pub fn error(&self) -> Option<String> {
        self.shared
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .error
            .clone()
    }

    /// Waits until the generation differs from `since` or `until` passes; whether it changed.
    pub fn wait_change(&self, since: u64, until: Instant) -> bool {
        let mut seen = self.shared.seen.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if seen.generation != since {
                return true;
            }
            let now = Instant::now();
            if now >= until {
                return false;
            }
            seen = self
                .shared
                .changed
                .wait_timeout(seen, (until - now).min(Duration::from_secs(1)))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// Keeps `shared.leases` (the rollout slot Leases) up to date from a watch on `leases`.
///
/// Errors: the async runtime could not be started.
fn watch_leases(
    shared: Arc<Shared>,
    leases: Api<Lease>,
    config: watcher::Config,
) -> Result<tokio::task::JoinHandle<()>, FleetError> {
    let stream = watcher(leases, config).default_backoff();
    crate::runtime::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut fresh: BTreeMap<String, Lease> = BTreeMap::new();
        while let Some(ev) = stream.next().await {
            let slot = |l: &Lease| {
                l.metadata
                    .name
                    .clone()
                    .filter(|n| n.starts_with(super::slots::SLOT_PREFIX))
            };
            match ev {
                Ok(Event::Init) => fresh.clear(),
                Ok(Event::InitApply(l)) => {
                    if let Some(n) = slot(&l) {
                        fresh.insert(n, l);
                    }
                }
                Ok(Event::InitDone) => shared.update(|s| {
                    s.leases = std::mem::take(&mut fresh);
                    s.leases_synced = true;
                    s.error = None;
                    true
                }),
                Ok(Event::Apply(l)) => {
                    if let Some(n) = slot(&l) {
                        shared.update(|s| {
                            let moved = acts_on(s.leases.get(&n), Some(&l), lease_key);
                            s.leases.insert(n, l);
                            s.error = None;
                            moved
                        });
                    }
                }
                Ok(Event::Delete(l)) => {
                    if let Some(n) = slot(&l) {
                        shared.update(|s| s.leases.remove(&n).is_some());
                    }
                }
                Err(e) => shared.update(|s| {
                    s.error = Some(format!("watching the rollout slot Leases: {e}"));
                    true
                }),
            }
        }
    })
    .map_err(FleetError::Api)
}

/// Keeps `shared.reports` and `shared.pause` up to date from a watch on the node report and
/// pause ConfigMaps.
///
/// Errors: the async runtime could not be started.
fn watch_reports(
    shared: Arc<Shared>,
    reports: Api<ConfigMap>,
    config: watcher::Config,
) -> Result<tokio::task::JoinHandle<()>, FleetError> {
    let stream = watcher(
        reports,
        config.labels(&super::report::reports_and_pause_selector()),
    )
    .default_backoff();
    crate::runtime::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut fresh: Vec<ConfigMap> = Vec::new();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Init) => fresh.clear(),
                Ok(Event::InitApply(cm)) => fresh.push(cm),
                Ok(Event::InitDone) => shared.update(|s| {
                    s.reports.clear();
                    s.pause = None;
                    for cm in std::mem::take(&mut fresh) {
                        apply(s, cm);
                    }
                    s.reports_synced = true;
                    s.error = None;
                    true
                }),
                Ok(Event::Apply(cm)) => shared.update(|s| {
                    let acted_on = apply(s, cm);
                    s.error = None;
                    acted_on
                }),
                Ok(Event::Delete(cm)) => shared.update(|s| {
                    if Pause::of(&cm).is_some() {
                        s.pause.take().is_some()
                    } else if let Some(n) = &cm.metadata.name {
                        s.reports.remove(n).is_some()
                    } else {
                        false
                    }
                }),
                Err(e) => shared.update(|s| {
                    s.error = Some(format!("watching the node reports: {e}"));
                    true
                }),
            }
        }
    })
    .map_err(FleetError::Api)
}

impl Drop for FleetWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Files a ConfigMap of the reports' watch: the pause (by name and label, as
/// [`Pause::of`]) or a report. Whether a waiting agent acts on the change ([`acts_on`]).
fn apply(s: &mut Seen, cm: ConfigMap) -> bool {
    match Pause::of(&cm) {
        Some(p) => {
            let new = s.pause.as_ref() != Some(&p);
            s.pause = Some(p);
            new
        }
        None => {
            let stored = super::report::stored(cm);
            let moved = acts_on(s.reports.get(&stored.name), Some(&stored), report_key);
            s.reports.insert(stored.name.clone(), stored);
            moved
        }
    }
}
