//! `keyplan fleet status` and `keyplan fleet plan` output: text for people, JSON (`format_version`
//! [`super::status::FORMAT_VERSION`], and "1.0" for `fleet plan`) and
//! Prometheus text exposition format (docs/fleet.md documents the fields and metrics).

use std::fmt::Write as _;

use super::report::{AgentState, NodeReport};
use super::status::{FleetStatus, NodeStatus};
use crate::clock::rfc3339;
use crate::render::status::ExtraGauge;

/// The fleet status as pretty-printed JSON, with a newline at the end.
///
/// Errors: serialization failed (it does not for this type).
pub fn json(s: &FleetStatus) -> Result<String, serde_json::Error> {
    let mut out = serde_json::to_string_pretty(s)?;
    out.push('\n');
    Ok(out)
}

/// `text` with control characters (terminal escapes, newlines) replaced by `?`: report texts
/// come from the agents' ConfigMaps, which any holder of an agent's token can write.
fn clean(text: &str) -> String {
    // Control characters, and the bidirectional formatting characters that can make a
    // terminal show text in another order (U+200E/F, U+202A..U+202E, U+2066..U+2069).
    let bidi = |c: char| matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    text.chars()
        .map(|c| if c.is_control() || bidi(c) { '?' } else { c })
        .collect()
}

/// One line per node, then the totals and the slots. Texts from the reports are shown with
/// control characters replaced.
pub fn text(s: &FleetStatus) -> String {
    let mut out = String::new();
    if let Some(p) = &s.paused {
        let _ = writeln!(
            out,
            "the rollout is PAUSED ({}): no node takes a new slot until `keyplan fleet resume`",
            clean(&p.describe())
        );
    }
    if s.totals.nodes == 0 {
        let _ = writeln!(
            out,
            "fleet in namespace {}: no node reports (ConfigMaps labelled app.kubernetes.io/component=node-report): the agents are not running, cannot write their reports, or --namespace names another namespace",
            s.namespace
        );
        return out;
    }
    let _ = writeln!(
        out,
        "fleet in namespace {}: {} node(s){}",
        s.namespace,
        s.totals.nodes,
        if s.halted {
            "; the rollout is HALTED (max_failed_nodes reached): fix the failed nodes, then run `keyplan fleet clear`"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "{:<30} {:<9} {:>7} {:>5} {:<18} {:<22} NOTE",
        "NODE", "STATE", "DEVICES", "KEYS", "VERSIONS", "LAST RUN"
    );
    for n in &s.nodes {
        node_row(&mut out, n);
    }
    let states: Vec<String> = s
        .totals
        .by_state
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    let _ = writeln!(
        out,
        "totals: {}; {} device(s) ({} drifted), {} key(s) ({} overdue), {} failure(s) counting towards max_failed_nodes{}",
        if states.is_empty() { "no nodes".to_string() } else { states.join(", ") },
        s.totals.devices,
        s.totals.drifted_devices,
        s.totals.keys,
        s.totals.overdue_keys,
        s.totals.failures,
        match s.totals.refused_plans {
            0 => String::new(),
            n => format!("; {n} node(s) refuse the plan's signature"),
        }
    );
    for w in &s.commits_waiting {
        let _ = writeln!(
            out,
            "key {} v{} (KMS {}): the commit waits for {} to verify it (reported by {}); the current version stays and opens every device",
            clean(&w.key),
            w.version,
            clean(&w.kms),
            clean(&w.waiting_for.join(", ")),
            clean(&w.reported_by.join(", "))
        );
    }
    let held: Vec<String> = s
        .slots
        .iter()
        .map(|l| format!("{} {}", l.lease, l.holder.as_deref().unwrap_or("(free)")))
        .collect();
    let _ = writeln!(
        out,
        "rollout slots: {}",
        if held.is_empty() {
            "none yet".to_string()
        } else {
            held.join(", ")
        }
    );
    out
}

/// One node's row of the `fleet status` table.
fn node_row(out: &mut String, n: &NodeStatus) {
    let Some(r) = &n.report else {
        let _ = writeln!(
            out,
            "{:<30} {:<9} {}",
            clean(&n.node),
            n.state,
            n.problem
                .as_deref()
                .map_or_else(|| "(no readable report)".to_string(), clean)
        );
        return;
    };
    let versions: Vec<String> = r
        .keys
        .iter()
        .map(|k| {
            k.current_version
                .map(|v| format!("v{v}"))
                .unwrap_or_else(|| "-".into())
        })
        .collect();
    let last = r
        .last_run
        .as_ref()
        .map(|l| {
            format!(
                "{} {}",
                l.outcome,
                rfc3339(l.ended_at.unwrap_or(l.started_at))
                    .get(..16)
                    .unwrap_or("")
            )
        })
        .unwrap_or_else(|| "-".into());
    let notes = node_notes(n, r);
    let _ = writeln!(
        out,
        "{:<30} {:<9} {:>7} {:>5} {:<18} {:<22} {}",
        clean(&n.node),
        n.state,
        r.devices.len(),
        r.keys.len(),
        versions.join(","),
        clean(&last),
        clean(&notes.join("; "))
    );
}

/// The NOTE column of a node's row: lost, drift, overdue or next rotation, changes, a refused
/// plan, the failure or the agent's message.
fn node_notes(n: &NodeStatus, r: &NodeReport) -> Vec<String> {
    let mut notes = Vec::new();
    if n.lost {
        notes.push(format!("no report for {} s", n.report_age_seconds));
    }
    let drifted = r.devices.iter().filter(|d| d.drifted).count();
    if drifted > 0 {
        notes.push(format!("{drifted} drifted"));
    }
    let overdue = r.keys.iter().filter(|k| k.overdue).count();
    if overdue > 0 {
        notes.push(format!("{overdue} rotation(s) overdue"));
    }
    if let Some(due) = r.keys.iter().filter_map(|k| k.rotation_due_at).min() {
        if overdue == 0 {
            notes.push(format!(
                "next rotation {}",
                rfc3339(due).get(..10).unwrap_or("")
            ));
        }
    }
    if r.changes > 0 && !n.lost {
        notes.push(format!("{} change(s) to apply", r.changes));
    }
    if let Some(refused) = &r.refused_plan {
        notes.push(format!(
            "plan sha256 {} refused ({}){}",
            refused.digest.get(..12).unwrap_or(&refused.digest),
            refused.reason,
            match (&r.plan_signature, &r.plan_digest) {
                (Some(_), Some(d)) if r.state != AgentState::Refused => format!(
                    ", running the last good signed plan {}",
                    d.get(..12).unwrap_or(d)
                ),
                _ => String::new(),
            }
        ));
    }
    if let Some(f) = &r.failure {
        notes.push(format!(
            "failure{}: {}",
            if n.failure_counts { "" } else { " (cleared)" },
            f.message
        ));
    } else if let Some(m) = &r.message {
        notes.push(m.clone());
    }
    notes
}

/// Fleet metrics (for a CI job or a textfile collector): per-state node counts, per-node
/// state, lost and failure gauges, and totals.
///
/// Errors: the encoder failed (formatting into a `String` does not fail).
pub fn prometheus(s: &FleetStatus) -> Result<String, std::fmt::Error> {
    let b = |x: bool| u64::from(x);
    let mut by_state = ExtraGauge::new(
        "keyplan_fleet_nodes",
        "Node reports by state (lost: not renewed for three agent intervals).",
    );
    for state in [
        "in_sync", "waiting", "running", "failed", "halted", "paused", "refused", "error",
        "stopped", "lost", "invalid", "newer",
    ] {
        by_state.add(
            vec![("state", state.to_string())],
            s.totals.by_state.get(state).copied().unwrap_or(0) as u64,
        );
    }
    let mut node_state = ExtraGauge::new(
        "keyplan_fleet_node_state",
        "1 for each node's state as its report says (or lost).",
    );
    let mut lost = ExtraGauge::new(
        "keyplan_fleet_node_lost",
        "1 when the node's report was not renewed for three agent intervals, else 0.",
    );
    let mut failed = ExtraGauge::new(
        "keyplan_fleet_node_failure",
        "1 when the node's failure counts towards max_failed_nodes, else 0.",
    );
    let mut age = ExtraGauge::new(
        "keyplan_fleet_node_report_age_seconds",
        "Seconds since the node's agent wrote its report.",
    );
    for n in &s.nodes {
        node_state.add(
            vec![("node", n.node.clone()), ("state", n.state.clone())],
            1,
        );
        lost.add(vec![("node", n.node.clone())], b(n.lost));
        failed.add(vec![("node", n.node.clone())], b(n.failure_counts));
        age.add(vec![("node", n.node.clone())], n.report_age_seconds);
    }
    let mut waiting = ExtraGauge::new(
        "keyplan_fleet_commit_waiting_nodes",
        "For a key several nodes share: the nodes that have not verified its new version, so its commit waits (by key and version).",
    );
    for w in &s.commits_waiting {
        waiting.add(
            vec![("key", w.key.clone()), ("version", w.version.to_string())],
            w.waiting_for.len() as u64,
        );
    }
    let families = vec![
        ExtraGauge::single("keyplan_fleet_status_generated_timestamp_seconds", "When keyplan fleet status read the reports (Unix seconds).", s.generated_at),
        ExtraGauge::single("keyplan_fleet_healthy", "1 when no node failed, is lost, refused its plan, is in error or halted, and nothing drifted or is overdue, else 0.", b(s.healthy())),
        ExtraGauge::single("keyplan_fleet_halted", "1 when the rollout is halted by max_failed_nodes, else 0.", b(s.halted)),
        ExtraGauge::single("keyplan_fleet_paused", "1 while an operator has paused the rollout (keyplan fleet pause), else 0.", b(s.paused.is_some())),
        ExtraGauge::single("keyplan_fleet_failures", "Failures counting towards max_failed_nodes.", s.totals.failures as u64),
        ExtraGauge::single("keyplan_fleet_devices", "Devices the nodes report.", s.totals.devices as u64),
        ExtraGauge::single("keyplan_fleet_drifted_devices", "Devices that drifted from the plan.", s.totals.drifted_devices as u64),
        ExtraGauge::single("keyplan_fleet_overdue_keys", "Keys whose rotation is overdue.", s.totals.overdue_keys as u64),
        ExtraGauge::single("keyplan_fleet_refused_plans", "Nodes refusing the plan in their ConfigMap because of its signature.", s.totals.refused_plans as u64),
        by_state,
        node_state,
        lost,
        failed,
        age,
        waiting,
    ];
    crate::render::status::prometheus_plain(families)
}

/// `keyplan fleet plan` as text: a header, one block per node of the plan (its observation's
/// age, then what `keyplan plan` would print on the node, or why it cannot be planned), the
/// nodes with reports the plan does not name, and a summary line.
pub fn plan_text(fp: &crate::fleet::plan::FleetPlan, namespace: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Fleet plan of {} from the observations the agents in namespace {namespace} published ({} node(s)); no node was touched.\n",
        fp.source.display(),
        fp.nodes.len()
    );
    for n in &fp.nodes {
        let age = n
            .age_seconds
            .map(|a| crate::diff::short_duration(std::time::Duration::from_secs(a)))
            .unwrap_or_default();
        match (&n.missing, &n.result) {
            (Some(why), _) => {
                let _ = writeln!(
                    out,
                    "## node {}: NOT OBSERVED: {why}. What it would do is unknown.\n",
                    clean(&n.node)
                );
                continue;
            }
            (None, _) if n.stale => {
                let _ = writeln!(
                    out,
                    "## node {} (observed {age} ago: STALE, older than {}; its agent stopped reporting, so this may not be what the node holds now)\n",
                    clean(&n.node),
                    crate::diff::short_duration(std::time::Duration::from_secs(n.max_age_seconds))
                );
            }
            _ => {
                let _ = writeln!(out, "## node {} (observed {age} ago)\n", clean(&n.node));
            }
        }
        for d in &n.unobserved_devices {
            let _ = writeln!(
                out,
                "Note: device {d} was not observed by the node's agent (new in this plan, or its path changed): it is not planned here; the agent plans it after the change is applied.\n"
            );
        }
        for k in &n.unobserved_keys {
            let _ = writeln!(
                out,
                "Note: key {k} was not read by the node's agent (not in the plan it runs): it is planned as not in the KMS.\n"
            );
        }
        match &n.result {
            Some(Ok(diff)) => out.push_str(&clean_block(&crate::render::plan_text(&n.plan, diff))),
            Some(Err(refusals)) => {
                let _ = writeln!(out, "Refused: the node's agent would change nothing:");
                for r in refusals {
                    let _ = writeln!(out, "  - {}", clean(r));
                }
            }
            None => {}
        }
        out.push('\n');
    }
    if !fp.unplanned.is_empty() {
        let _ = writeln!(
            out,
            "Note: node(s) {} report but have no device in this plan: their agents would have nothing to do.\n",
            fp.unplanned.iter().map(|n| clean(n)).collect::<Vec<_>>().join(", ")
        );
    }
    let count = |f: &dyn Fn(&crate::fleet::plan::NodePlan) -> bool| {
        fp.nodes.iter().filter(|n| f(n)).count()
    };
    let _ = writeln!(
        out,
        "Fleet: {} node(s) to change, {} in sync, {} refused, {} stale, {} not observed.",
        count(&|n| n.changes()),
        count(&|n| matches!(&n.result, Some(Ok(d)) if d.is_empty())),
        count(&|n| matches!(&n.result, Some(Err(_)))),
        count(&|n| n.stale),
        count(&|n| n.missing.is_some()),
    );
    out
}

/// [`clean`] on every line of a block, keeping its line breaks.
fn clean_block(text: &str) -> String {
    text.lines().map(|l| format!("{}\n", clean(l))).collect()
}

/// `keyplan fleet plan --json`: `{format_version, generated_at, namespace, plan_file,
/// changes_present, doubtful, nodes: [{node, observed, observed_at, age_seconds, stale,
/// max_age_seconds, missing, unobserved_devices, unobserved_keys, refused, refusals, plan}],
/// unplanned_nodes, summary}`; `plan` is the `keyplan plan --json` document of the node.
///
/// Errors: encoding failed (it does not for these values).
pub fn plan_json(
    fp: &crate::fleet::plan::FleetPlan,
    namespace: &str,
) -> Result<String, serde_json::Error> {
    let nodes: Vec<serde_json::Value> = fp
        .nodes
        .iter()
        .map(|n| {
            serde_json::json!({
                "node": n.node,
                "observed": n.missing.is_none(),
                "observed_at": n.observed_at,
                "age_seconds": n.age_seconds,
                "stale": n.stale,
                "max_age_seconds": n.max_age_seconds,
                "missing": n.missing,
                "unobserved_devices": n.unobserved_devices,
                "unobserved_keys": n.unobserved_keys,
                "changes_present": n.changes(),
                "refused": matches!(&n.result, Some(Err(_))),
                "refusals": match &n.result { Some(Err(r)) => r.clone(), _ => Vec::new() },
                "plan": match &n.result {
                    Some(Ok(d)) => crate::diff::json::plan_json(d),
                    _ => serde_json::Value::Null,
                },
            })
        })
        .collect();
    let doc = serde_json::json!({
        "format_version": "1.0",
        "generated_at": fp.generated_at,
        "namespace": namespace,
        "plan_file": fp.source.display().to_string(),
        "changes_present": fp.changes(),
        "doubtful": fp.doubtful(),
        "nodes": nodes,
        "unplanned_nodes": fp.unplanned,
        "summary": {
            "nodes": fp.nodes.len(),
            "with_changes": fp.nodes.iter().filter(|n| n.changes()).count(),
            "stale": fp.nodes.iter().filter(|n| n.stale).count(),
            "not_observed": fp.nodes.iter().filter(|n| n.missing.is_some()).count(),
            "refused": fp.nodes.iter().filter(|n| matches!(&n.result, Some(Err(_)))).count(),
        },
    });
    crate::render::json_text(&doc)
}
