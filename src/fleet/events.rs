//! Kubernetes Events about a node's runs (core/v1 `Event`,
//! <https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/>), in the
//! fleet namespace, about the node's report ConfigMap (`involvedObject`; `related` names the
//! Node), so `kubectl get events -n keyplan` and `kubectl describe cm keyplan-node-<node>`
//! show them. Reasons: `RunStarted`, `RunSucceeded`, `RunFailed` (Warning), `PlanRefused`
//! (Warning), `RolloutHalted` (Warning), `AgentStopped`; and the operator's `RolloutPaused`,
//! `RolloutResumed`, about the pause ConfigMap ([`super::pause`]). Messages never hold key material:
//! they are redacted (`event_message`) before they are cut to size.
//!
//! **Repeats are aggregated** as Kubernetes' own recorders do (client-go's event correlator):
//! an Event with the same type, reason and message as one this writer wrote less than
//! [`AGGREGATION_WINDOW`] ago is not a new object: the existing one is patched with its
//! `count` raised, `lastTimestamp` and `series` (`count`, `lastObservedTime`) moved on, so a
//! node that fails the same way at every cycle leaves one Event, `(x12 over 1h)` in `kubectl
//! get events`, not twelve. The window is the API server's default `--event-ttl` (1 h), after
//! which the Event may be gone; a patch that finds it gone (404) creates it afresh.
//!
//! An Event that cannot be written is logged at `warn` and otherwise ignored: Events are a
//! convenience; the report and the journal are the record.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSeries, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::runtime::block_on;

/// `Normal` or `Warning`, the two Event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something needs attention.
    Warning,
}

/// How long a written Event takes repeats: 1 h, kube-apiserver's default `--event-ttl`.
pub const AGGREGATION_WINDOW: Duration = Duration::from_secs(3600);

/// What makes two Events the same: type, reason, message.
type EventKey = (EventType, String, String);

/// An Event this writer wrote, by type, reason and message.
struct Written {
    name: String,
    count: i32,
    first: Instant,
}

/// The Event writer of one node (or of the operator's pause). Clones share what was written
/// (the aggregation).
#[derive(Clone)]
pub struct Events {
    written: Arc<Mutex<HashMap<EventKey, Written>>>,
    api: Api<Event>,
    namespace: String,
    /// `source.host` and `reportingInstance`: the node, or the operator's host.
    host: String,
    /// The Node named as `related` (none for the operator's Events).
    node: Option<String>,
    /// The ConfigMap the Events are about: the node's report, or the pause.
    subject: String,
    /// `source.component` / `reportingComponent`.
    component: (&'static str, &'static str),
}

impl Events {
    /// Events about `node` in `namespace`. Contacts nothing.
    pub fn new(client: kube::Client, namespace: &str, node: &str) -> Events {
        Events {
            written: Arc::default(),
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            host: node.to_string(),
            node: Some(node.to_string()),
            subject: super::report::report_name(node),
            component: ("keyplan-agent", "keyplan.io/agent"),
        }
    }

    /// Events of `keyplan fleet pause`/`resume` about the pause ConfigMap in `namespace` (no
    /// node: `related` is left out, the host is the local host name). Contacts nothing.
    pub fn about_pause(client: kube::Client, namespace: &str) -> Events {
        Events {
            written: Arc::default(),
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            host: gethostname::gethostname().to_string_lossy().into_owned(),
            node: None,
            subject: super::pause::PAUSE_NAME.to_string(),
            component: ("keyplan-cli", "keyplan.io/cli"),
        }
    }

    /// The fleet namespace the Events go to.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Writes one Event (`reason` in CamelCase, `message` as `event_message` makes it), or,
    /// when this writer wrote the same type, reason and message within
    /// [`AGGREGATION_WINDOW`], raises that Event's count (a `patch`). A failure is logged,
    /// not returned.
    pub fn emit(&self, kind: EventType, reason: &str, message: &str) {
        let now = Timestamp::now();
        let message = event_message(message);
        let key = (kind, reason.to_string(), message.clone());
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        written.retain(|_, w| w.first.elapsed() < AGGREGATION_WINDOW);
        if let Some(w) = written.get_mut(&key) {
            let count = w.count.saturating_add(1);
            let patch = serde_json::json!({
                "count": count,
                "lastTimestamp": Time(now),
                "series": EventSeries {
                    count: Some(count),
                    last_observed_time: Some(MicroTime(now)),
                },
            });
            match block_on(
                "fleet",
                self.api
                    .patch(&w.name, &PatchParams::default(), &Patch::Merge(&patch)),
            ) {
                Ok(Ok(_)) => {
                    w.count = count;
                    return;
                }
                // Gone (the API server's event TTL): written afresh below.
                Ok(Err(kube::Error::Api(s))) if s.code == 404 => {}
                Ok(Err(e)) => {
                    return tracing::warn!(
                        reason,
                        "could not update a Kubernetes Event: {}",
                        super::api_text(&e)
                    )
                }
                Err(e) => {
                    return tracing::warn!(reason, "could not update a Kubernetes Event: {e}")
                }
            }
        }
        let report = self.subject.clone();
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", report.get(..200).unwrap_or(&report))),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("ConfigMap".into()),
                name: Some(report),
                namespace: Some(self.namespace.clone()),
                ..ObjectReference::default()
            },
            related: self.node.as_ref().map(|node| ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.clone()),
                ..ObjectReference::default()
            }),
            reason: Some(reason.to_string()),
            message: Some(message),
            type_: Some(
                match kind {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            source: Some(EventSource {
                component: Some(self.component.0.into()),
                host: Some(self.host.clone()),
            }),
            reporting_component: Some(self.component.1.into()),
            reporting_instance: Some(self.host.clone()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            ..Event::default()
        };
        match block_on("fleet", self.api.create(&PostParams::default(), &ev)) {
            Ok(Ok(created)) => {
                if let Some(name) = created.metadata.name {
                    written.insert(
                        key,
                        Written {
                            name,
                            count: 1,
                            first: Instant::now(),
                        },
                    );
                }
            }
            Ok(Err(e)) => tracing::warn!(
                reason,
                "could not write a Kubernetes Event: {}",
                super::api_text(&e)
            ),
            Err(e) => tracing::warn!(reason, "could not write a Kubernetes Event: {e}"),
        }
    }
}

/// The text of an Event: `message` redacted ([`crate::secret::redact::redact`]: it may quote a
/// KMS error, which may quote material back), then cut to at most 1024 bytes at a character
/// boundary (`...` marks the cut). Redacting first: a form of material cut in two would no
/// longer be recognised.
pub(crate) fn event_message(message: &str) -> String {
    let mut message = crate::secret::redact::redact(message).into_owned();
    if message.len() > 1024 {
        let mut end = 1021;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("...");
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_messages_are_redacted_before_they_are_cut() {
        let m = b"event-material-5b1d0c77e2";
        crate::secret::redact::register(m);
        let hex: String = m.iter().map(|b| format!("{b:02x}")).collect();
        let msg = format!(
            "run failed: KMS said: denied for {hex} (raw {})",
            "event-material-5b1d0c77e2"
        );
        assert_eq!(
            event_message(&msg),
            "run failed: KMS said: denied for <redacted> (raw <redacted>)"
        );
        // A form across the 1024-byte cut is redacted whole, not cut into an unrecognisable
        // half.
        let long = format!("{}{hex}", "x".repeat(1000));
        let text = event_message(&long);
        assert_eq!(text, format!("{}<redacted>", "x".repeat(1000)));
        let cut = event_message(&format!("{}{hex}", "é".repeat(520)));
        assert!(cut.len() <= 1024 && cut.ends_with("..."), "{cut}");
        assert!(!cut.contains(&hex[..8]), "{cut}");
    }
}
