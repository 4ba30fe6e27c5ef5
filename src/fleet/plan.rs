//! `keyplan fleet plan -f PLAN`: what every node's agent would do with PLAN, computed from the
//! observations the agents publish in their reports ([`super::report::Observation`]) with the
//! same planner as `keyplan plan` ([`crate::diff::diff`]), touching no node and no KMS: the
//! pull-request view of a change to the fleet's plan (docs/fleet.md, "Fleet plan").
//!
//! What it cannot know, it says: a node without a report or observation is `not_observed`;
//! an observation older than the bound is `stale` (planned, but flagged); a device of PLAN the
//! agent did not observe (new, or renamed, or moved to another path) and a key it did not read
//! are listed per node (a new key is planned as not in the KMS; a new device is not planned).
//! The agent's PBKDF tests (adoption, `enroll_with`) were made for the plan it ran.

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::report::Stored;
use crate::diff::{Diff, DiffOptions};
use crate::observe::Observed;
use crate::spec::Plan;

/// What one node would do.
#[derive(Debug, Clone)]
pub struct NodePlan {
    /// The node.
    pub node: String,
    /// PLAN cut down to the node, with the agent's state directory (so holder ids match).
    pub plan: Plan,
    /// When the node's agent observed, Unix seconds; `None`: no observation.
    pub observed_at: Option<u64>,
    /// Seconds since then.
    pub age_seconds: Option<u64>,
    /// The observation is older than the bound.
    pub stale: bool,
    /// The bound, seconds.
    pub max_age_seconds: u64,
    /// The planner's result: the changes, or the refusals (`None`: not observed).
    pub result: Option<Result<Diff, Vec<String>>>,
    /// Devices of PLAN on this node the agent did not observe (not planned).
    pub unobserved_devices: Vec<String>,
    /// Keys of PLAN on this node the agent did not read (planned as not in the KMS).
    pub unobserved_keys: Vec<String>,
    /// Why the node is not observed, when it is not.
    pub missing: Option<String>,
}

impl NodePlan {
    /// Whether the node would change something: the planner's changes, or a device the agent
    /// has not observed yet (it will be enrolled once observed).
    pub fn changes(&self) -> bool {
        matches!(&self.result, Some(Ok(d)) if !d.is_empty()) || !self.unobserved_devices.is_empty()
    }

    /// Whether the node's result cannot be trusted: not observed, stale, or refused. (Devices
    /// and keys the agent did not observe are listed, not doubted: a new device or key in a
    /// pull request is the common case.)
    pub fn doubtful(&self) -> bool {
        self.missing.is_some() || self.stale || matches!(&self.result, Some(Err(_)))
    }
}

/// The whole fleet's plan.
#[derive(Debug, Clone)]
pub struct FleetPlan {
    /// The plan file.
    pub source: PathBuf,
    /// When computed, Unix seconds.
    pub generated_at: u64,
    /// Per node of PLAN, by name.
    pub nodes: Vec<NodePlan>,
    /// Nodes with a report that PLAN does not name (their agents would have nothing to do).
    pub unplanned: Vec<String>,
}

impl FleetPlan {
    /// Whether any node would change something.
    pub fn changes(&self) -> bool {
        self.nodes.iter().any(NodePlan::changes)
    }

    /// Whether any node's result cannot be trusted as is ([`NodePlan::doubtful`]).
    pub fn doubtful(&self) -> bool {
        self.nodes.iter().any(NodePlan::doubtful)
    }
}

/// Plans `plan` (the whole plan file) for every node it names, from `reports` (as read from
/// the fleet namespace), at `now`. `max_age`: the bound on an observation's age in seconds;
/// `None`: three of the node agent's intervals, at least [`super::status::LOST_MIN_SECONDS`].
pub fn compute(plan: &Plan, reports: &[Stored], now: u64, max_age: Option<u64>) -> FleetPlan {
    let nodes: BTreeSet<String> = plan
        .devices
        .values()
        .filter_map(|d| d.node.clone())
        .collect();
    let genuine = |s: &&Stored| {
        s.report
            .as_ref()
            .is_some_and(|r| super::report::report_name(&r.node) == s.name)
    };
    let by_node = |node: &str| {
        reports
            .iter()
            .filter(genuine)
            .find(|s| s.report.as_ref().is_some_and(|r| r.node == node))
            .and_then(|s| s.report.clone())
    };
    // A report of a newer format than this keyplan reads: not read, and said so.
    let newer = |node: &str| {
        reports
            .iter()
            .find(|s| s.name == super::report::report_name(node))
            .and_then(|s| s.newer.clone())
    };
    let mut out = Vec::new();
    for node in &nodes {
        let mut cut = plan.clone().for_node(node);
        let report = by_node(node);
        let bound = max_age.unwrap_or_else(|| {
            report
                .as_ref()
                .map(|r| r.interval_seconds * super::status::LOST_INTERVALS)
                .unwrap_or(0)
                .max(super::status::LOST_MIN_SECONDS)
        });
        let Some(obs) = report.as_ref().and_then(|r| r.observation.clone()) else {
            out.push(NodePlan {
                node: node.clone(),
                plan: cut,
                observed_at: None,
                age_seconds: None,
                stale: false,
                max_age_seconds: bound,
                result: None,
                unobserved_devices: Vec::new(),
                unobserved_keys: Vec::new(),
                missing: Some(match report {
                    None => match newer(node) {
                        Some(n) => n.to_string(),
                        None => "no report from its agent (not running, or not yet)".into(),
                    },
                    Some(_) => "its agent has not published an observation yet (it could not observe, or runs an older keyplan)".into(),
                }),
            });
            continue;
        };
        cut.state_dir = PathBuf::from(&obs.state_dir);
        let age = now.saturating_sub(obs.observed_at);
        let (observed, unobserved_devices, unobserved_keys) = align(&cut, obs.state.into());
        let result = crate::diff::diff(&cut, &observed, &DiffOptions::default())
            .map_err(|refusals| refusals.into_iter().map(|r| r.message).collect());
        out.push(NodePlan {
            node: node.clone(),
            plan: cut,
            observed_at: Some(obs.observed_at),
            age_seconds: Some(age),
            stale: age > bound,
            max_age_seconds: bound,
            result: Some(result),
            unobserved_devices,
            unobserved_keys,
            missing: None,
        });
    }
    let unplanned = reports
        .iter()
        .filter(genuine)
        .filter_map(|s| s.report.as_ref().map(|r| r.node.clone()))
        .filter(|n| !nodes.contains(n))
        .collect();
    FleetPlan {
        source: plan.source_path.clone(),
        generated_at: now,
        nodes: out,
        unplanned,
    }
}

/// The observation as the planner of `plan` needs it: devices of `plan` observed under the
/// same id and path; observed devices `plan` no longer lists become former devices (as the
/// agent's next observation would see them); keys `plan` lists that were not read are added
/// as not in the KMS. Returns it with the devices and keys not observed.
fn align(plan: &Plan, mut obs: Observed) -> (Observed, Vec<String>, Vec<String>) {
    let mut unobserved_devices = Vec::new();
    for (id, d) in &plan.devices {
        match obs.devices.get(id) {
            Some(st) if st.path == d.path => {}
            _ => unobserved_devices.push(id.clone()),
        }
    }
    let gone: Vec<String> = obs
        .devices
        .iter()
        .filter(|(id, st)| plan.devices.get(*id).is_none_or(|d| d.path != st.path))
        .map(|(id, _)| id.clone())
        .collect();
    for id in gone {
        if let Some(st) = obs.devices.remove(&id) {
            obs.former.insert(id, st);
        }
    }
    let mut unobserved_keys = Vec::new();
    for id in plan.keys.keys() {
        if !obs.keys.contains_key(id) {
            unobserved_keys.push(id.clone());
            obs.keys.insert(id.clone(), crate::kms::KeyState::default());
        }
    }
    obs.keys.retain(|id, _| plan.keys.contains_key(id));
    (obs, unobserved_devices, unobserved_keys)
}
