//! Node reports (`report.json` of the ConfigMap `keyplan-node-<node>`, src/fleet/report.rs):
//! their own data types, version [`FORMAT_VERSION`]. The observation they carry is
//! [`super::observation`]'s; a shared key's wait is [`CommitWait`]. Converted from the
//! engine's types in src/fleet/published.rs, so a renamed engine field leaves the report as it
//! is. [`parse`] reads a report: one of a newer major version is refused with
//! [`NewerFormat`], never misread (docs/formats.md, "Node report").

use serde::{Deserialize, Serialize};

use crate::format::{check_major, Format, NewerFormat};

/// Version of the report document (`format_version`): `"1"`. Readers read every `1.x` and
/// ignore the fields they do not know.
pub const FORMAT_VERSION: &str = "1";
/// The newest major version this keyplan reads.
pub const MAJOR: u64 = 1;

/// The node report's [`Format`].
pub const FORMAT: Format = Format {
    name: "node-report",
    writes: FORMAT_VERSION,
    reads: "1.x",
    home: "ConfigMap keyplan-node-<node>, key report.json",
};

/// Why a report could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// Written by a newer keyplan: not read.
    #[error(transparent)]
    Newer(#[from] NewerFormat),
    /// Not a report of a version this keyplan reads (not JSON, a field missing or of the
    /// wrong type): the parser's message.
    #[error("{document} is not a valid node report: {detail}")]
    Invalid {
        /// What was read (the ConfigMap).
        document: String,
        /// The parser's message.
        detail: String,
    },
}

/// Reads a `report.json` document; `document` names it in errors (`ConfigMap
/// keyplan-node-worker-1`). Its `format_version` is compared first.
///
/// Errors: [`ReadError::Newer`] for a newer major version, [`ReadError::Invalid`] otherwise.
pub fn parse(document: &str, text: &str) -> Result<NodeReport, ReadError> {
    let invalid = |detail: String| ReadError::Invalid {
        document: document.to_string(),
        detail,
    };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
    let version = value
        .get("format_version")
        .and_then(|v| v.as_str())
        .ok_or_else(|| invalid("no \"format_version\"".to_string()))?;
    check_major(&FORMAT, document, version, MAJOR)?;
    serde_json::from_value(value).map_err(|e| invalid(e.to_string()))
}

/// A shared key's commit that waits for other holders (the engine's `diff::CommitWait`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitWait {
    /// Key id.
    pub key: String,
    /// KMS instance.
    pub kms: String,
    /// The version waiting to be committed.
    pub version: u64,
    /// The key's current version meanwhile.
    pub current: Option<u64>,
    /// The holders (`<node>:<state directory>`) that have not verified `version`.
    pub blocking: Vec<String>,
    /// Whether this node's devices hold and verified `version` already.
    pub verified_here: bool,
}

/// What a node's agent is doing, as of its last report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentState {
    /// Nothing to do: the node matches the plan.
    InSync,
    /// Has changes and waits for a rollout slot, or did its part of a shared key's rotation
    /// and waits for other nodes to verify the new version before it is committed
    /// (`commits_waiting`).
    Waiting,
    /// Applying (holds a rollout slot).
    Running,
    /// Its last run failed (see `failure`).
    Failed,
    /// Has changes but does not start: `max_failed_nodes` node runs failed fleet-wide.
    Halted,
    /// Has changes but does not start: an operator paused the rollout (`keyplan fleet
    /// pause`).
    Paused,
    /// The plan was refused (invalid, or not allowed by the agent's configuration).
    Refused,
    /// Could not observe or plan (a device or KMS could not be read).
    Error,
    /// The agent stopped (SIGTERM).
    Stopped,
}

impl AgentState {
    /// The state's name as in the JSON document.
    pub fn name(self) -> &'static str {
        match self {
            AgentState::InSync => "in_sync",
            AgentState::Waiting => "waiting",
            AgentState::Running => "running",
            AgentState::Failed => "failed",
            AgentState::Halted => "halted",
            AgentState::Paused => "paused",
            AgentState::Refused => "refused",
            AgentState::Error => "error",
            AgentState::Stopped => "stopped",
        }
    }
}

/// One node's report (the `report.json` document).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// Always [`FORMAT_VERSION`].
    pub format_version: String,
    /// The node.
    pub node: String,
    /// keyplan's version on the node.
    pub agent_version: String,
    /// When this report was written, Unix seconds: the agent's heartbeat.
    pub updated_at: u64,
    /// The agent's `--interval` in seconds (a report older than three intervals is lost).
    pub interval_seconds: u64,
    /// SHA-256 (hex) of the plan file the agent last read, if it could read one.
    pub plan_digest: Option<String>,
    /// What the agent is doing.
    pub state: AgentState,
    /// Why (a refused plan, what could not be observed, who holds the slots), if anything.
    pub message: Option<String>,
    /// Changes the last plan had for this node (0: in sync).
    pub changes: usize,
    /// This node's devices.
    pub devices: Vec<DeviceSummary>,
    /// The keys of this node's devices.
    pub keys: Vec<KeySummary>,
    /// Problems `status` found (overdue rotations, drift, unreadable KMS), one line each.
    pub problems: Vec<String>,
    /// What could not be checked, one line each.
    pub unchecked: Vec<String>,
    /// The last run this agent started or finished.
    pub last_run: Option<AgentRun>,
    /// When a run last succeeded, Unix seconds.
    pub last_success_at: Option<u64>,
    /// The failure that counts towards `max_failed_nodes`, until a later run succeeds or an
    /// operator clears it.
    pub failure: Option<Failure>,
    /// Whether the agent saw the rollout halted (`max_failed_nodes` reached) at its last check.
    pub halted: bool,
    /// The plan the agent refuses (its signature did not verify), while it runs the last plan
    /// whose signature did (`plan_digest`), or nothing (state `refused`) when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_plan: Option<RefusedPlan>,
    /// The signature of the plan the agent runs, when the agent requires signed plans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_signature: Option<PlanSignature>,
    /// Shared keys whose new version this node's last plan could not commit yet: other
    /// nodes (holders) have not verified it (docs/fleet.md, "Keys on several nodes").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commits_waiting: Vec<CommitWait>,
    /// When this node began to wait for a rollout slot, Unix seconds, while its state is
    /// `waiting` for one (or `paused` with work to do: the place is kept through a pause): its
    /// place in the queue of waiting nodes (earlier first, then by node name; docs/fleet.md,
    /// "Waiting for a slot").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_since: Option<u64>,
    /// What the agent last observed on its node, for `keyplan fleet plan`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<Observation>,
}

/// What an agent observed on its node (the engine's `observe::Observed`, converted in
/// src/fleet/published.rs): the input of the planner,
/// published so that `keyplan fleet plan` can plan another plan file for the node without
/// touching it. No key material: LUKS headers (keyslot numbers, KDF salts and parameters,
/// token ids, types and keyslots; the tokens' contents are left out), keyplan's records (key
/// ids, versions, KDF salts), the keys' KMS version metadata and holders, `enroll_with` file
/// metadata and test outcomes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// When it was observed, Unix seconds.
    pub observed_at: u64,
    /// The agent's state directory (its holder id is `<node>:<state dir>`).
    pub state_dir: String,
    /// SHA-256 of the plan it observed for (its adoption and `enroll_with` tests are that
    /// plan's).
    pub plan_digest: Option<String>,
    /// The observed state.
    pub state: super::observation::Observed,
}

/// A plan the agent refused because of its signature (src/fleet/signature/mod.rs, `Refusal`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedPlan {
    /// SHA-256 (hex) of the refused plan file.
    pub digest: String,
    /// The reason's short name (`unsigned`, `malformed`, `other_cluster`, `untrusted_key`,
    /// `tampered`, `older`).
    pub reason: String,
    /// What is wrong and what to do.
    pub message: String,
    /// Since when this plan is refused, Unix seconds.
    pub since: u64,
}

/// The verified signature of the plan an agent runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanSignature {
    /// Fingerprint of the key that signed it (`SHA256:...`).
    pub key: String,
    /// When it was signed, Unix seconds.
    pub signed_at: u64,
}

/// One device of the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceSummary {
    /// Device id from the plan.
    pub id: String,
    /// Device path on the node.
    pub path: String,
    /// Keyslots in use (LUKS header), ascending; empty when it could not be read.
    pub keyslots: Vec<u32>,
    /// Whether it drifted from the plan (or could not be read).
    pub drifted: bool,
}

/// One key of the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeySummary {
    /// Key id from the plan.
    pub id: String,
    /// Its KMS instance.
    pub kms: String,
    /// Current version, if the KMS could be read and holds one.
    pub current_version: Option<u64>,
    /// Every version the KMS holds material of: the current one and retained ones (numbers
    /// only), ascending.
    pub versions: Vec<u64>,
    /// A staged version awaiting commit.
    pub pending: Option<u64>,
    /// When the current version reaches `rotate_after`, Unix seconds.
    pub rotation_due_at: Option<u64>,
    /// Whether that is past.
    pub overdue: bool,
}

/// A run the agent started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRun {
    /// The journal's run id, when the run got that far.
    pub id: Option<String>,
    /// Unix seconds.
    pub started_at: u64,
    /// Unix seconds; `None` while it runs.
    pub ended_at: Option<u64>,
    /// `running`, `success`, `failed`, `stopped`, or `not_started` (it could not plan because
    /// a KMS could not be asked: nothing changed, and it does not count towards
    /// `max_failed_nodes`).
    pub outcome: String,
    /// Steps this agent ran.
    pub steps: usize,
    /// PBKDF runs (key derivations) of the cycle.
    pub pbkdf_runs: u64,
    /// The error of a failed run (never key material).
    pub error: Option<String>,
}

/// A failed node run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// When it failed, Unix seconds (what `fleet clear` names).
    pub at: u64,
    /// What failed.
    pub message: String,
}

impl NodeReport {
    /// A new agent's report for `node` (its interval in seconds, written at `now`, Unix
    /// seconds): `in_sync`, nothing observed or run yet.
    pub fn fresh(node: &str, interval_seconds: u64, now: u64) -> NodeReport {
        NodeReport {
            format_version: FORMAT_VERSION.to_string(),
            node: node.to_string(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            updated_at: now,
            interval_seconds,
            plan_digest: None,
            state: AgentState::InSync,
            message: None,
            changes: 0,
            devices: Vec::new(),
            keys: Vec::new(),
            problems: Vec::new(),
            unchecked: Vec::new(),
            last_run: None,
            last_success_at: None,
            failure: None,
            halted: false,
            refused_plan: None,
            commits_waiting: Vec::new(),
            plan_signature: None,
            observation: None,
            waiting_since: None,
        }
    }
}
