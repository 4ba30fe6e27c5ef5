//! Admitting a plan: its signature (the last good signed plan while a newer one is refused),
//! its loading for this node, and its refusal.

use super::{Agent, GoodPlan};
use crate::clock::now_unix;
use crate::fleet::events::EventType;
use crate::fleet::report::AgentState;
use crate::fleet::signature::Refusal;
use crate::fleet::source::PlanText;
use crate::format::state::{signed_plan, ReadError};
use crate::spec::Plan;

/// The file in the state directory that keeps the last good signed plan across restarts.
const GOOD_PLAN_FILE: &str = "agent-signed-plan.json";

/// [`GOOD_PLAN_FILE`] as written by a newer keyplan (a rolled-back agent image), if it is:
/// then it is neither run nor replaced.
fn newer_good_plan(path: &std::path::Path) -> Option<crate::format::NewerFormat> {
    let bytes = std::fs::read(path).ok()?;
    match signed_plan::read_signed_plan(&path.display().to_string(), &bytes) {
        Err(ReadError::Newer(n)) => Some(n),
        _ => None,
    }
}

impl Agent {
    /// The plan text to run this cycle, and its digest: the plan file's, unless the agent
    /// requires signatures and its signature does not verify; then the last good signed plan
    /// (the refusal is reported), or nothing when there is none (the node reports `refused`).
    pub(super) fn admit(&mut self, text: PlanText) -> Option<(String, String)> {
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
            self.report.refused_plan = Some(crate::fleet::report::RefusedPlan {
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
    pub(super) fn accept_candidate(&mut self) {
        let Some(c) = self.candidate.take() else {
            return;
        };
        self.report.refused_plan = None;
        self.report.plan_signature = Some(crate::fleet::report::PlanSignature {
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
            let stored = signed_plan::SignedPlanV2::new(
                c.text.clone(),
                String::from_utf8_lossy(&c.signature).into_owned(),
            );
            let path = self.opts.state_dir.join(GOOD_PLAN_FILE);
            let written = match newer_good_plan(&path) {
                Some(newer) => Err(newer.to_string()),
                None => stored.to_bytes(),
            };
            let written = written.and_then(|bytes| {
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
    pub(super) fn restore_good(&mut self) {
        let Some(policy) = &self.opts.signatures else {
            return;
        };
        self.health().plan_signed = Some(false);
        let path = self.opts.state_dir.join(GOOD_PLAN_FILE);
        let stored = match std::fs::read(&path) {
            Ok(bytes) => match signed_plan::read_signed_plan(&path.display().to_string(), &bytes) {
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
                self.report.plan_signature = Some(crate::fleet::report::PlanSignature {
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

    /// The plan cannot be read or is refused (`reason`: `unreadable`, `invalid`, or a
    /// signature [`Refusal::reason`]): nothing is changed; said once per reason in the log
    /// and an Event, and always in the report and the metrics.
    /// `reason` is `None` when the refusal was already said ([`Agent::refuse_signature`]).
    pub(super) fn refuse(&mut self, reason: Option<&'static str>, message: String) {
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
    pub(super) fn load(&mut self, text: &str) -> Result<Plan, String> {
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
}
