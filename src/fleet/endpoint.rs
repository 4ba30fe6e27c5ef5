//! The agent's HTTP endpoint (plain HTTP/1.1, `tiny_http`): `GET /metrics` is the node's
//! `status` metrics with a `node` label plus the agent's own (Prometheus text exposition format
//! 0.0.4, docs/monitoring.md), `GET /healthz` answers 200 `ok` while the loop goes round (or a
//! run is going on) and 503 when it has not gone round for three polls and a minute.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::report::AgentState;
use crate::ops::status::StatusReport;

use crate::fleet::error::FleetError;
use crate::render::status::{prometheus_for_node, ExtraGauge};

/// What the metrics endpoint shows: the last status and the agent's counters.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// When the loop last went round.
    pub last_tick: Option<Instant>,
    /// Whether a run is going on (the loop is busy, not stuck).
    pub running: bool,
    /// The last status report of this node.
    pub status: Option<StatusReport>,
    /// Runs by outcome (`success`, `failed`, `stopped`).
    pub runs: std::collections::BTreeMap<&'static str, u64>,
    /// Whether a slot is held.
    pub slot_held: bool,
    /// Whether the rollout was seen halted.
    pub halted: bool,
    /// Whether the rollout was seen paused by an operator ([`super::pause`]).
    pub paused: bool,
    /// The agent's state.
    pub state: Option<AgentState>,
    /// When the last full cycle ended, Unix seconds.
    pub last_cycle_at: Option<u64>,
    /// Whether the last plan was refused.
    pub plan_refused: bool,
    /// Plans refused, by reason ([`super::signature::Refusal::reason`], `unreadable`, `invalid`), counted once
    /// per refused plan version.
    pub plan_refusals: std::collections::BTreeMap<&'static str, u64>,
    /// Whether the plan the agent runs has a verified signature (`None`: signatures are not
    /// required).
    pub plan_signed: Option<bool>,
    /// Shared keys whose commit waits for other nodes: key id and the number of nodes it
    /// waits for.
    pub commits_waiting: Vec<(String, usize)>,
    /// Cycles and runs that stopped before changing anything because something could not be
    /// looked at (a KMS unreachable, sealed or silent): [`super::agent::Agent::could_not_look`]. They do not
    /// count towards `max_failed_nodes`.
    pub observation_failures: u64,
}

/// Starts serving on `addr` from a background thread.
///
/// Errors: `addr` cannot be bound (a text naming it).
pub(crate) fn serve(
    addr: SocketAddr,
    node: String,
    poll: Duration,
    health: Arc<Mutex<Health>>,
) -> Result<(), FleetError> {
    let server = tiny_http::Server::http(addr).map_err(|e| {
        FleetError::Endpoint(format!(
            "cannot listen on {addr} for /metrics and /healthz: {e}"
        ))
    })?;
    tracing::info!(%addr, "serving /metrics and /healthz");
    std::thread::Builder::new()
        .name("keyplan-metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let path = req.url().split('?').next().unwrap_or("").to_string();
                let (code, ctype, body) = {
                    let h = health.lock().unwrap_or_else(|e| e.into_inner());
                    match path.as_str() {
                        "/metrics" => match metrics(&h, &node) {
                            Ok(text) => (200, "text/plain; version=0.0.4; charset=utf-8", text),
                            Err(_) => (500, "text/plain", "cannot encode the metrics\n".into()),
                        },
                        "/healthz" | "/livez" | "/readyz" => {
                            let alive = h.running
                                || h.last_tick.is_none_or(|t| {
                                    t.elapsed() < poll * 3 + Duration::from_secs(60)
                                });
                            if alive {
                                (200, "text/plain", "ok\n".into())
                            } else {
                                (503, "text/plain", "the agent's loop is stuck\n".into())
                            }
                        }
                        _ => (
                            404,
                            "text/plain",
                            "not found: try /metrics or /healthz\n".into(),
                        ),
                    }
                };
                let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], ctype.as_bytes());
                let mut resp = tiny_http::Response::from_string(body).with_status_code(code);
                if let Ok(h) = header {
                    resp = resp.with_header(h);
                }
                let _ = req.respond(resp);
            }
        })
        .map_err(|e| FleetError::Endpoint(format!("cannot start the metrics thread: {e}")))?;
    Ok(())
}

/// The metrics text of `h`.
fn metrics(h: &Health, node: &str) -> Result<String, std::fmt::Error> {
    let b = |x: bool| u64::from(x);
    let mut extra = vec![
        ExtraGauge::single("keyplan_agent_up", "1: the keyplan agent is running.", 1),
        ExtraGauge::single(
            "keyplan_agent_slot_held",
            "1 while this node holds a rollout slot (applying), else 0.",
            b(h.slot_held),
        ),
        ExtraGauge::single(
            "keyplan_agent_fleet_halted",
            "1 when this node has changes but the rollout is stopped: max_failed_nodes node runs failed fleet-wide (keyplan fleet clear resumes it), else 0.",
            b(h.halted),
        ),
        ExtraGauge::single(
            "keyplan_agent_fleet_paused",
            "1 when this node has changes but an operator paused the rollout (keyplan fleet pause; keyplan fleet resume lifts it), else 0.",
            b(h.paused),
        ),
        ExtraGauge::single(
            "keyplan_agent_plan_refused",
            "1 when the last plan was refused (invalid, or not allowed by the agent's configuration), else 0.",
            b(h.plan_refused),
        ),
    ];
    let mut refusals = ExtraGauge::counter(
        "keyplan_agent_plan_refusals",
        "Plans this agent process refused, by reason (unreadable, invalid; with signatures required: unsigned, malformed, other_cluster, untrusted_key, tampered, older), once per refused plan version.",
    );
    for (reason, n) in &h.plan_refusals {
        refusals.add(vec![("reason", reason.to_string())], *n);
    }
    extra.push(refusals);
    if let Some(signed) = h.plan_signed {
        extra.push(ExtraGauge::single(
            "keyplan_agent_plan_signature_verified",
            "With signed plans required: 1 when the plan the agent runs has a verified signature, 0 when it runs none.",
            b(signed),
        ));
    }
    let mut waiting = ExtraGauge::new(
        "keyplan_agent_commit_waiting_nodes",
        "For a key several nodes share whose new version this node added (or is adding): the number of other nodes that have not verified it yet, so its commit waits (docs/fleet.md, Keys on several nodes). Absent when nothing waits.",
    );
    for (key, nodes) in &h.commits_waiting {
        waiting.add(vec![("key", key.clone())], *nodes as u64);
    }
    extra.push(waiting);
    if let Some(t) = h.last_cycle_at {
        extra.push(ExtraGauge::single(
            "keyplan_agent_last_cycle_timestamp_seconds",
            "When the agent last finished a full cycle (Unix seconds).",
            t,
        ));
    }
    let mut runs = ExtraGauge::counter(
        "keyplan_agent_runs",
        "Node runs this agent process started, by outcome (success, failed, stopped, not_started: it could not plan because a KMS could not be asked, and changed nothing).",
    );
    for outcome in ["success", "failed", "stopped", "not_started"] {
        runs.add(
            vec![("outcome", outcome.to_string())],
            h.runs.get(outcome).copied().unwrap_or(0),
        );
    }
    extra.push(runs);
    let mut observation = ExtraGauge::counter(
        "keyplan_agent_observation_failures",
        "Cycles and runs of this agent process that stopped before changing anything because something could not be looked at (a KMS unreachable, sealed or not answering in time); they do not count towards max_failed_nodes.",
    );
    observation.add(Vec::new(), h.observation_failures);
    extra.push(observation);
    if let Some(state) = h.state {
        let mut st = ExtraGauge::new(
            "keyplan_agent_state",
            "1 for the agent's current state (in_sync, waiting, running, failed, halted, paused, refused, error, stopped).",
        );
        st.add(vec![("state", state.name().to_string())], 1);
        extra.push(st);
    }
    prometheus_for_node(h.status.as_ref(), node, extra)
}
