//! Node reports: one ConfigMap per node, `keyplan-node-<node>` in the fleet namespace, label
//! `app.kubernetes.io/component=node-report`, holding one JSON document ([`NodeReport`]) under
//! `report.json`. The agent rewrites it at every cycle (its `updated_at` is the heartbeat
//! `keyplan fleet status` tells lost nodes by); it holds what the agent observed and did, never
//! key material (the same fields `keyplan status` shows, cut to a summary; the document is
//! redacted before it is written, for the texts KMSs answered with: `document`).
//!
//! A ConfigMap rather than a custom resource: it needs no CRD installed cluster-wide (so no
//! cluster-admin step to deploy), `kubectl get cm -l app.kubernetes.io/component=node-report`
//! shows them, and RBAC on ConfigMaps in one namespace is all the agents need. The price is no
//! schema on the server side; the document carries `format_version`.
//!
//! **Failures** stop the rollout: a report with a `failure` counts towards
//! `settings.fleet.max_failed_nodes` until the node's next successful run removes it, or an
//! operator clears it (`keyplan fleet clear`: the annotation [`CLEARED_ANNOTATION`] set to the
//! failure's `at`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use sha2::{Digest as _, Sha256};

use crate::runtime::block_on;

/// How long [`super::status::read`] waits for the API server in all (its two lists together): what does not
/// answer by then makes `fleet status` exit 3, naming it (docs/fleet.md). Shorter than the
/// fleet client's own 30 s per-read timeout ([`crate::kms::REQUEST_TIMEOUT`]), a backstop.
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

pub use crate::format::published::node_report::{
    AgentRun, AgentState, CommitWait, DeviceSummary, Failure, KeySummary, NodeReport, Observation,
    PlanSignature, RefusedPlan, FORMAT_VERSION,
};
/// The data key of the report document.
pub const DATA_KEY: &str = "report.json";
/// Label every report carries (with `app.kubernetes.io/name=keyplan`).
pub const COMPONENT_LABEL: (&str, &str) = ("app.kubernetes.io/component", "node-report");
/// Annotation `keyplan fleet clear` sets to the `at` of the failure it clears.
pub const CLEARED_ANNOTATION: &str = "keyplan.io/failure-cleared";

/// A report as read from the cluster, with what the operator set on it.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The document (`None` when the ConfigMap holds no valid one, or one written by a newer
    /// keyplan: `newer`).
    pub report: Option<NodeReport>,
    /// Set when the document is of a newer major version than this keyplan reads: it is not
    /// read (never misread), and this says which version and which keyplan reads it.
    pub newer: Option<crate::format::NewerFormat>,
    /// The ConfigMap's name.
    pub name: String,
    /// The [`CLEARED_ANNOTATION`], if set.
    pub cleared: Option<String>,
    /// The ConfigMap as read (for a conditional update).
    pub object: ConfigMap,
}

impl Stored {
    /// Whether this report's failure counts towards `max_failed_nodes`: it has one and an
    /// operator has not cleared it.
    pub fn counts_as_failed(&self) -> bool {
        self.genuine()
            && self
                .report
                .as_ref()
                .and_then(|r| r.failure.as_ref())
                .is_some_and(|f| self.cleared.as_deref() != Some(f.at.to_string().as_str()))
    }

    /// Whether the document is one an agent writes: its `node` is the node the ConfigMap's name
    /// is for ([`report_name`]).
    pub fn genuine(&self) -> bool {
        self.report
            .as_ref()
            .is_some_and(|r| report_name(&r.node) == self.name)
    }
}

/// The ConfigMap name of `node`'s report: `keyplan-node-<node>`, or for a node name too long
/// for that (over 240 characters) its first 200 characters and a hash.
pub fn report_name(node: &str) -> String {
    if node.len() <= 240 {
        format!("keyplan-node-{node}")
    } else {
        let h = Sha256::digest(node.as_bytes());
        let tag: String = h.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!(
            "keyplan-node-{}-{tag}",
            node.get(..200).unwrap_or(node).trim_end_matches(['.', '-'])
        )
    }
}

/// Why a report operation failed: a text naming the ConfigMap and the namespace, and the HTTP
/// status when there was one.
#[derive(Debug, Clone)]
pub struct ReportError {
    /// What went wrong.
    pub message: String,
    /// 409 for a lost conditional update.
    pub code: Option<u16>,
}

impl std::fmt::Display for ReportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The reports of one fleet namespace.
#[derive(Clone)]
pub struct Reports {
    api: Api<ConfigMap>,
    namespace: String,
    /// When every request must have its answer ([`Reports::until`]); `None`: the client's own
    /// timeouts only.
    until: Option<std::time::Instant>,
}

impl Reports {
    /// The reports in `namespace`. Contacts nothing.
    pub fn new(client: kube::Client, namespace: &str) -> Reports {
        Reports {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            until: None,
        }
    }

    /// The same reports, every request of which must be answered by `until` (`fleet status`'s
    /// bound); one that is not fails with a message saying so.
    pub fn until(mut self, until: std::time::Instant) -> Reports {
        self.until = Some(until);
        self
    }

    /// Runs one request: `what` names it in the error (with the HTTP status, when there was
    /// one).
    fn call<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ReportError> {
        let Some(until) = self.until else {
            return block_on("fleet", fut)
                .map_err(|e| ReportError {
                    message: format!("{what}: {e}"),
                    code: None,
                })?
                .map_err(|e| self.err(what, e));
        };
        let left = until.saturating_duration_since(std::time::Instant::now());
        block_on(
            "fleet",
            async move { tokio::time::timeout(left, fut).await },
        )
        .map_err(|e| ReportError {
            message: format!("{what}: {e}"),
            code: None,
        })?
        .map_err(|_| ReportError {
            message: format!(
                "{what}: the API server did not answer in time (`fleet status` waits {} in all)",
                crate::kms::deadline::seconds(READ_TIMEOUT)
            ),
            code: None,
        })?
        .map_err(|e| self.err(what, e))
    }

    fn err(&self, what: &str, e: kube::Error) -> ReportError {
        let code = match &e {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        };
        ReportError {
            message: format!(
                "{what} in namespace {}: {}",
                self.namespace,
                super::api_text(&e)
            ),
            code,
        }
    }

    /// Every report in the namespace (one `list` by label).
    ///
    /// Errors: the list failed (denied, unreachable).
    pub fn list(&self) -> Result<Vec<Stored>, ReportError> {
        Ok(self.list_with_pause()?.0)
    }

    /// Every report in the namespace and the operator's pause if there is one
    /// ([`super::pause`]): one `list` with a set-based label selector
    /// (`app.kubernetes.io/component in (node-report,fleet-pause)`), so the agent's check
    /// before a slot costs no request more than the failure count did.
    ///
    /// Errors: the list failed (denied, unreachable).
    pub fn list_with_pause(
        &self,
    ) -> Result<(Vec<Stored>, Option<super::pause::Pause>), ReportError> {
        let lp = ListParams::default().labels(&reports_and_pause_selector());
        let list = self.call("listing node reports", self.api.list(&lp))?;
        let mut pause = None;
        let mut reports = Vec::new();
        for cm in list.items {
            // Only the pause ConfigMap (name and label) is the pause: a report relabelled as
            // one stays a report (it neither vanishes from the failure count nor pauses).
            match super::pause::Pause::of(&cm) {
                Some(p) => pause = Some(p),
                None => reports.push(stored(cm)),
            }
        }
        Ok((reports, pause))
    }

    /// `node`'s report, if it exists.
    ///
    /// Errors: the read failed.
    pub fn get(&self, node: &str) -> Result<Option<Stored>, ReportError> {
        let name = report_name(node);
        let got = self.call(
            &format!("reading ConfigMap {name}"),
            self.api.get_opt(&name),
        )?;
        Ok(got.map(stored))
    }

    /// Writes `report` as `node`'s report: an update conditional on `prior` (the ConfigMap as
    /// last read or written; keeps its annotations), else a create. Returns the ConfigMap as
    /// written, for the next call.
    ///
    /// Errors: the write failed; a 409 (someone else wrote it, e.g. `fleet clear`) has code
    /// 409: read it again and retry.
    pub fn put(
        &self,
        report: &NodeReport,
        prior: Option<&ConfigMap>,
    ) -> Result<ConfigMap, ReportError> {
        let name = report_name(&report.node);
        let doc = document(report)?;
        let mut cm = prior.cloned().unwrap_or_else(|| ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([
                    ("app.kubernetes.io/name".to_string(), "keyplan".to_string()),
                    (COMPONENT_LABEL.0.to_string(), COMPONENT_LABEL.1.to_string()),
                ])),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        });
        cm.data = Some(BTreeMap::from([(DATA_KEY.to_string(), doc)]));
        let pp = PostParams::default();
        let what = format!("writing ConfigMap {name}");
        if prior.is_some() {
            self.call(&what, self.api.replace(&name, &pp, &cm))
        } else {
            self.call(&what, self.api.create(&pp, &cm))
        }
    }

    /// Marks the failure of `stored` as cleared (a conditional update of the annotation).
    ///
    /// Errors: the write failed (409: the agent wrote in between; list again).
    pub fn clear(&self, stored: &Stored) -> Result<(), ReportError> {
        let Some(at) = stored
            .report
            .as_ref()
            .and_then(|r| r.failure.as_ref())
            .map(|f| f.at)
        else {
            return Ok(());
        };
        let mut cm = stored.object.clone();
        cm.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(CLEARED_ANNOTATION.to_string(), at.to_string());
        self.call(
            &format!("clearing the failure in ConfigMap {}", stored.name),
            self.api.replace(&stored.name, &PostParams::default(), &cm),
        )?;
        Ok(())
    }
}

/// The `report.json` document of `report`: pretty JSON, redacted
/// ([`crate::secret::redact::redact_json`]; its messages and errors quote KMSs, which may
/// quote material back).
///
/// Errors: the report cannot be encoded.
pub fn document(report: &NodeReport) -> Result<String, ReportError> {
    let doc = serde_json::to_string_pretty(report).map_err(|e| ReportError {
        message: format!("cannot encode the report: {e}"),
        code: None,
    })?;
    Ok(crate::secret::redact::redact_json(&doc).into_owned())
}

/// The label selector of the reports and the pause:
/// `app.kubernetes.io/component in (node-report,fleet-pause)`.
pub(crate) fn reports_and_pause_selector() -> String {
    format!(
        "{} in ({},{})",
        COMPONENT_LABEL.0,
        COMPONENT_LABEL.1,
        super::pause::COMPONENT
    )
}

/// The report a ConfigMap holds, as [`Stored`]: read with
/// [`crate::format::published::node_report::parse`], so a report of a newer major version is
/// not read but kept as [`Stored::newer`].
pub(crate) fn stored(cm: ConfigMap) -> Stored {
    use crate::format::published::node_report::{parse, ReadError};
    let name = cm.metadata.name.clone().unwrap_or_default();
    let parsed = cm
        .data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .map(|s| parse(&format!("node report ConfigMap {name}"), s));
    let (report, newer) = match parsed {
        Some(Ok(r)) => (Some(r), None),
        Some(Err(ReadError::Newer(n))) => (None, Some(n)),
        Some(Err(ReadError::Invalid { .. })) | None => (None, None),
    };
    Stored {
        report,
        newer,
        name,
        cleared: cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CLEARED_ANNOTATION))
            .cloned(),
        object: cm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_documents_are_redacted_and_stay_valid() {
        use base64::Engine as _;
        let m = b"report-material-\"quoted\"-41d2";
        crate::secret::redact::register(m);
        let raw = String::from_utf8_lossy(m).into_owned();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(m);
        let hex: String = m.iter().map(|b| format!("{b:02X}")).collect();
        let report = NodeReport {
            format_version: FORMAT_VERSION.to_string(),
            node: "worker-1".into(),
            agent_version: "0".into(),
            updated_at: 1,
            interval_seconds: 300,
            plan_digest: None,
            state: AgentState::Failed,
            message: Some(format!("KMS said {raw}")),
            changes: 1,
            devices: Vec::new(),
            keys: Vec::new(),
            problems: vec![format!("key k: the KMS answered {b64}")],
            unchecked: vec![format!("{hex} could not be read")],
            last_run: Some(AgentRun {
                id: Some("1-2".into()),
                started_at: 1,
                ended_at: Some(2),
                outcome: "failed".into(),
                steps: 1,
                pbkdf_runs: 0,
                error: Some(format!("stage: {raw:?}")),
            }),
            last_success_at: None,
            failure: Some(Failure {
                at: 2,
                message: format!("denied: {raw}"),
            }),
            halted: false,
            refused_plan: None,
            plan_signature: None,
            commits_waiting: Vec::new(),
            observation: None,
            waiting_since: None,
        };
        let doc = document(&report).expect("document");
        for form in [raw.as_str(), &b64, &hex, "report-material"] {
            assert!(!doc.contains(form), "{form} in {doc}");
        }
        let back: NodeReport = serde_json::from_str(&doc).expect("still a report");
        assert_eq!(back.message.as_deref(), Some("KMS said <redacted>"));
        assert_eq!(
            back.failure.map(|f| f.message).as_deref(),
            Some("denied: <redacted>")
        );
        assert_eq!(back.problems, ["key k: the KMS answered <redacted>"]);
        assert_eq!(back.unchecked, ["<redacted> could not be read"]);
        assert_eq!(back.node, "worker-1");
    }
}
