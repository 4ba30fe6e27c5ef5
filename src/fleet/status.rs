//! `keyplan fleet status` and `keyplan fleet clear`: the fleet as its agents report it, read
//! from a workstation or CI with a kubeconfig ([`super::api::OPERATOR_CALLS`]). Nothing here
//! contacts a node: what a node's agent last wrote is what is shown, and a node whose report
//! stopped being renewed is **lost**.

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::report::{AgentState, NodeReport, Reports, READ_TIMEOUT};
use crate::clock::now_unix;
use crate::fleet::error::FleetError;
use crate::runtime::block_on;

/// Version of the `fleet status --format json` document. 1.2 added the state `newer` and a
/// node's `problem`.
pub const FORMAT_VERSION: &str = "1.2";

/// A report older than this many of its agent's intervals (and at least [`LOST_MIN_SECONDS`])
/// means the node is lost: its agent stopped, or cannot reach the API.
pub const LOST_INTERVALS: u64 = 3;
/// The least age, in seconds, at which a report counts as lost.
pub const LOST_MIN_SECONDS: u64 = 120;

/// The whole fleet.
#[derive(Debug, Clone, Serialize)]
pub struct FleetStatus {
    /// Always [`FORMAT_VERSION`].
    pub format_version: &'static str,
    /// When it was read, Unix seconds.
    pub generated_at: u64,
    /// The fleet namespace.
    pub namespace: String,
    /// One entry per node report, by node name.
    pub nodes: Vec<NodeStatus>,
    /// Counts over the nodes.
    pub totals: Totals,
    /// Whether the rollout is halted: a live node saw `max_failed_nodes` failures.
    pub halted: bool,
    /// The operator's pause (`keyplan fleet pause`), when the rollout is paused: no agent
    /// takes a new slot until `keyplan fleet resume`.
    pub paused: Option<super::pause::Pause>,
    /// The rollout slots and who holds them now.
    pub slots: Vec<SlotStatus>,
    /// Shared keys whose new version waits for nodes to verify it before it is committed, as
    /// the live nodes report them, by key and version.
    pub commits_waiting: Vec<FleetCommitWait>,
}

/// A shared key's commit that waits (docs/fleet.md, "Keys on several nodes"), fleet-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FleetCommitWait {
    /// Key id.
    pub key: String,
    /// KMS instance.
    pub kms: String,
    /// The version waiting to be committed.
    pub version: u64,
    /// The nodes that have not verified it (they block the commit), by name.
    pub waiting_for: Vec<String>,
    /// The nodes that report the wait (they verified it, or are adding it), by name.
    pub reported_by: Vec<String>,
}

/// One node.
#[derive(Debug, Clone, Serialize)]
pub struct NodeStatus {
    /// The node.
    pub node: String,
    /// The report's state, `lost`, `invalid` (the ConfigMap holds no report, or one whose
    /// `node` is not the node its name is for: not what an agent writes), or `newer` (the
    /// report is of a newer format than this keyplan reads: `problem` says which; not read).
    pub state: String,
    /// Whether the report is too old ([`LOST_INTERVALS`]).
    pub lost: bool,
    /// Seconds since the report was written.
    pub report_age_seconds: u64,
    /// Whether the node's failure counts towards `max_failed_nodes` (not cleared).
    pub failure_counts: bool,
    /// The report as written by the node's agent (`None` when the ConfigMap holds none, or
    /// one of a newer format).
    pub report: Option<NodeReport>,
    /// Why the report could not be read, for the state `newer` ([`crate::format::NewerFormat`]'s
    /// message); left out otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// Counts over the nodes.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Totals {
    /// Node reports.
    pub nodes: usize,
    /// Nodes by state (`in_sync`, `waiting`, `running`, `failed`, `halted`, `refused`,
    /// `error`, `stopped`, `lost`).
    pub by_state: std::collections::BTreeMap<String, usize>,
    /// Devices reported.
    pub devices: usize,
    /// Devices that drifted.
    pub drifted_devices: usize,
    /// Keys reported.
    pub keys: usize,
    /// Keys whose rotation is overdue.
    pub overdue_keys: usize,
    /// Failures that count towards `max_failed_nodes`.
    pub failures: usize,
    /// Nodes refusing the plan in their ConfigMap because of its signature (those with a good
    /// signed plan keep running it; the others are `refused`).
    pub refused_plans: usize,
}

/// One rollout slot Lease.
#[derive(Debug, Clone, Serialize)]
pub struct SlotStatus {
    /// The Lease name.
    pub lease: String,
    /// Its holder, if any.
    pub holder: Option<String>,
}

impl FleetStatus {
    /// Whether everything is fine: there are reports, and no node failed, is lost, refused
    /// (its plan, or the signature of a newer plan),
    /// in error, halted, drifted or overdue, and no report is invalid or of a newer format (`fleet status` exits 0;
    /// else 1). No report at all is not fine: the agents are not running, or `--namespace`
    /// names another namespace.
    pub fn healthy(&self) -> bool {
        let bad = [
            "failed", "lost", "refused", "error", "halted", "invalid", "newer",
        ];
        self.totals.nodes > 0
            && !self.halted
            && self.totals.failures == 0
            && self.totals.drifted_devices == 0
            && self.totals.overdue_keys == 0
            && self.totals.refused_plans == 0
            && bad
                .iter()
                .all(|s| self.totals.by_state.get(*s).copied().unwrap_or(0) == 0)
    }
}

/// Reads every node report and slot Lease of `namespace` (two `list` requests), both answered
/// within [`READ_TIMEOUT`] of the call.
///
/// Errors: a text saying which list failed and why (one the API server did not answer in
/// time included).
pub fn read(client: &kube::Client, namespace: &str) -> Result<FleetStatus, FleetError> {
    let now = now_unix();
    let until = std::time::Instant::now() + READ_TIMEOUT;
    let (stored, paused) = Reports::new(client.clone(), namespace)
        .until(until)
        .list_with_pause()
        .map_err(|e| FleetError::Api(e.to_string()))?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lp = ListParams::default().labels("app.kubernetes.io/name=keyplan");
    let left = until.saturating_duration_since(std::time::Instant::now());
    let leases = block_on("fleet", async move {
        tokio::time::timeout(left, leases.list(&lp)).await
    })
    .map_err(|e| FleetError::Api(e.to_string()))?
    .map_err(|_| {
        FleetError::Api(format!(
            "listing Leases in namespace {namespace}: the API server did not answer in time (`fleet status` waits {} in all)",
            crate::kms::deadline::seconds(READ_TIMEOUT)
        ))
    })?
        .map_err(|e| {
            FleetError::Api(format!(
                "listing Leases in namespace {namespace}: {}",
                super::api_text(&e)
            ))
        })?;
    let mut nodes: Vec<NodeStatus> = stored.iter().map(|s| node_status(s, now)).collect();
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    let (totals, halted) = totals(&nodes);
    let commits_waiting = commits_waiting(&nodes);
    let mut slots: Vec<SlotStatus> = leases
        .items
        .iter()
        .filter_map(|l| {
            let name = l.metadata.name.clone()?;
            name.starts_with(super::slots::SLOT_PREFIX)
                .then(|| SlotStatus {
                    lease: name,
                    holder: super::slots::live_holder(l, now),
                })
        })
        .collect();
    slots.sort_by(|a, b| a.lease.cmp(&b.lease));
    Ok(FleetStatus {
        format_version: FORMAT_VERSION,
        generated_at: now,
        namespace: namespace.to_string(),
        nodes,
        totals,
        halted,
        paused,
        slots,
        commits_waiting,
    })
}

/// One node's line of the status: its report, whether it is lost (no update within
/// [`LOST_INTERVALS`] intervals, at least [`LOST_MIN_SECONDS`]), and whether the report is genuine
/// (stored under its own node's name).
fn node_status(s: &super::report::Stored, now: u64) -> NodeStatus {
    if let Some(newer) = &s.newer {
        // Not read, never misread: the node is shown by its ConfigMap's name, with why.
        return NodeStatus {
            node: s
                .name
                .strip_prefix("keyplan-node-")
                .map_or_else(|| format!("(ConfigMap {})", s.name), str::to_string),
            state: "newer".to_string(),
            lost: false,
            report_age_seconds: 0,
            failure_counts: false,
            report: None,
            problem: Some(newer.to_string()),
        };
    }
    let age = s
        .report
        .as_ref()
        .map(|r| now.saturating_sub(r.updated_at))
        .unwrap_or(u64::MAX);
    let lost = s
        .report
        .as_ref()
        .is_none_or(|r| age > (r.interval_seconds * LOST_INTERVALS).max(LOST_MIN_SECONDS));
    let genuine = s
        .report
        .as_ref()
        .is_some_and(|r| super::report::report_name(&r.node) == s.name);
    let state = match &s.report {
        _ if !genuine => "invalid".to_string(),
        Some(_) if lost => "lost".to_string(),
        Some(r) => r.state.name().to_string(),
        None => "invalid".to_string(),
    };
    NodeStatus {
        node: if genuine {
            s.report
                .as_ref()
                .map(|r| r.node.clone())
                .unwrap_or_default()
        } else {
            format!("(ConfigMap {})", s.name)
        },
        state,
        lost,
        report_age_seconds: if age == u64::MAX { 0 } else { age },
        failure_counts: s.counts_as_failed(),
        report: s.report.clone(),
        problem: None,
    }
}

/// The fleet's totals over `nodes`, and whether a node reports the rollout halted.
fn totals(nodes: &[NodeStatus]) -> (Totals, bool) {
    let mut totals = Totals {
        nodes: nodes.len(),
        ..Totals::default()
    };
    let mut halted = false;
    for n in nodes {
        *totals.by_state.entry(n.state.clone()).or_default() += 1;
        totals.failures += usize::from(n.failure_counts);
        if let Some(r) = n.report.as_ref().filter(|_| n.state != "invalid") {
            totals.devices += r.devices.len();
            totals.drifted_devices += r.devices.iter().filter(|d| d.drifted).count();
            totals.keys += r.keys.len();
            totals.overdue_keys += r.keys.iter().filter(|k| k.overdue).count();
            totals.refused_plans += usize::from(!n.lost && r.refused_plan.is_some());
            halted |= !n.lost && r.halted && r.state == AgentState::Halted;
        }
    }
    (totals, halted)
}

/// Shared keys whose commit waits for other nodes, merged over the live nodes' reports: a node
/// that reports it verified the version is not waited for.
fn commits_waiting(nodes: &[NodeStatus]) -> Vec<FleetCommitWait> {
    let mut waits: std::collections::BTreeMap<(String, u64), FleetCommitWait> = Default::default();
    // Nodes whose report says they verified the version: not waited for, whatever an older
    // report of another node says.
    let mut verified: std::collections::BTreeSet<(String, u64, String)> = Default::default();
    for n in nodes.iter().filter(|n| !n.lost && n.state != "invalid") {
        for w in n.report.iter().flat_map(|r| r.commits_waiting.iter()) {
            let e = waits
                .entry((w.key.clone(), w.version))
                .or_insert_with(|| FleetCommitWait {
                    key: w.key.clone(),
                    kms: w.kms.clone(),
                    version: w.version,
                    waiting_for: Vec::new(),
                    reported_by: Vec::new(),
                });
            e.reported_by.push(n.node.clone());
            if w.verified_here {
                verified.insert((w.key.clone(), w.version, n.node.clone()));
            }
            for b in crate::diff::CommitWait::from(w.clone()).blocking_nodes() {
                if !e.waiting_for.contains(&b) {
                    e.waiting_for.push(b);
                }
            }
        }
    }
    waits
        .into_values()
        .map(|mut w| {
            w.waiting_for
                .retain(|n| !verified.contains(&(w.key.clone(), w.version, n.clone())));
            w.waiting_for.sort();
            w
        })
        .collect()
}

/// Clears the failures that count towards `max_failed_nodes` (of `node` only, or of every
/// node), so the rollout goes on. Returns the nodes cleared.
///
/// Errors: a text naming the report that could not be read or written (a 409 means the agent
/// wrote in between: run it again).
pub fn clear(
    client: &kube::Client,
    namespace: &str,
    node: Option<&str>,
) -> Result<Vec<String>, FleetError> {
    let reports = Reports::new(client.clone(), namespace);
    let mut cleared = Vec::new();
    for s in reports.list().map_err(|e| FleetError::Api(e.to_string()))? {
        let name = s
            .report
            .as_ref()
            .map(|r| r.node.clone())
            .unwrap_or_default();
        let genuine = super::report::report_name(&name) == s.name;
        if !genuine || !s.counts_as_failed() || node.is_some_and(|n| n != name) {
            continue;
        }
        clear_one(&reports, s)?;
        cleared.push(name);
    }
    Ok(cleared)
}

/// Clears `stored`'s failure: a conditional update, read again and tried again when the
/// node's agent wrote its report in between (409), as Kubernetes clients do on a conflict; at
/// most 5 tries.
fn clear_one(reports: &Reports, mut stored: super::report::Stored) -> Result<(), FleetError> {
    for _ in 0..5 {
        match reports.clear(&stored) {
            Ok(()) => return Ok(()),
            Err(e) if e.code == Some(409) => {
                let node = stored
                    .report
                    .as_ref()
                    .map(|r| r.node.clone())
                    .unwrap_or_default();
                match reports
                    .get(&node)
                    .map_err(|e| FleetError::Api(e.to_string()))?
                {
                    Some(fresh) if fresh.counts_as_failed() => stored = fresh,
                    // Its agent cleared it itself (a run succeeded), or it is gone.
                    _ => return Ok(()),
                }
            }
            Err(e) => return Err(FleetError::Api(e.to_string())),
        }
    }
    Err(FleetError::Conflict(format!(
        "the report ConfigMap {} kept changing while its failure was being cleared (409 Conflict five times)",
        stored.name
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn config_map(name: &str, report: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.to_string());
        cm.data = Some(
            [(
                super::super::report::DATA_KEY.to_string(),
                report.to_string(),
            )]
            .into(),
        );
        cm
    }

    #[test]
    fn a_report_of_a_newer_format_shows_its_node_as_newer_and_the_rest_of_the_fleet_still_shows() {
        let v1 = include_str!("../../tests/fixtures/formats/node-report/v1/report.json");
        let v2 = include_str!("../../tests/fixtures/formats/node-report/v2/report.json")
            .replace("worker-1", "worker-2");
        let stored = [
            super::super::report::stored(config_map("keyplan-node-worker-1", v1)),
            super::super::report::stored(config_map("keyplan-node-worker-2", &v2)),
        ];
        assert!(stored[1].newer.is_some() && stored[1].report.is_none());
        // The version-2 report says `failed`: not misread as a failure that counts.
        assert!(!stored[1].counts_as_failed());
        let now = 1_700_200_020;
        let nodes: Vec<NodeStatus> = stored.iter().map(|s| node_status(s, now)).collect();
        assert_eq!(nodes[0].node, "worker-1");
        assert_eq!(nodes[0].state, "waiting");
        assert!(nodes[0].report.is_some());
        assert_eq!(nodes[1].node, "worker-2");
        assert_eq!(nodes[1].state, "newer");
        let problem = nodes[1].problem.as_deref().unwrap_or_default();
        assert!(
            problem.contains(
                "keyplan-node-worker-2 is node-report format 2.0, written by a newer keyplan"
            ),
            "{problem}"
        );
        let (totals, _) = totals(&nodes);
        assert_eq!(totals.by_state.get("newer"), Some(&1));
        assert_eq!(totals.devices, 1);
        let text = crate::fleet::render::text(&FleetStatus {
            format_version: FORMAT_VERSION,
            generated_at: now,
            namespace: "keyplan".into(),
            nodes,
            totals,
            halted: false,
            paused: None,
            slots: Vec::new(),
            commits_waiting: Vec::new(),
        });
        assert!(text.contains("worker-2"), "{text}");
        assert!(text.contains("written by a newer keyplan"), "{text}");
    }
}
