//! The operator's brake: `keyplan fleet pause` / `resume`.
//!
//! A pause is the ConfigMap [`PAUSE_NAME`] in the fleet namespace, label
//! `app.kubernetes.io/component=fleet-pause` ([`COMPONENT`]), holding who paused, when and why.
//! It exists while the rollout is paused: `pause` creates it, `resume` deletes it. Agents see it
//! in the one `list` of ConfigMaps they already make before taking a rollout slot
//! ([`super::report::Reports::list_with_pause`], a set-based label selector over reports and
//! the pause), so a waiting agent honours it at its next poll and takes no new slot; a node
//! that holds a slot finishes its current run (every step is crash-safe and the run is short)
//! and gives the slot back. Agents cannot write it: RBAC grants them no update of any
//! ConfigMap but their reports, and deploy/kubernetes/admission-policy.yaml refuses their
//! create of any ConfigMap but their own report; so a node's token can neither pause nor resume
//! the fleet. Like `kubectl rollout pause`, a pause holds a rollout, it does not undo one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};

use crate::fleet::error::FleetError;
use crate::runtime::block_on;

/// The pause ConfigMap's name.
pub const PAUSE_NAME: &str = "keyplan-pause";
/// The pause ConfigMap's `app.kubernetes.io/component` label value.
pub const COMPONENT: &str = "fleet-pause";

/// A pause in effect.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Pause {
    /// Why, as the operator wrote it (may be empty).
    pub reason: String,
    /// Who paused: the `--by` given, else the local user name (informative only: the API
    /// server's audit log has the authenticated user).
    pub by: String,
    /// When, Unix seconds (0 when the ConfigMap holds no valid time).
    pub since: u64,
}

impl Pause {
    /// The pause a ConfigMap holds, if it is the pause ConfigMap: named [`PAUSE_NAME`] and
    /// labelled [`COMPONENT`] (both, as agents list it by label).
    pub fn of(cm: &ConfigMap) -> Option<Pause> {
        let labelled = cm
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/component"))
            .is_some_and(|c| c == COMPONENT);
        if cm.metadata.name.as_deref() != Some(PAUSE_NAME) || !labelled {
            return None;
        }
        let data = cm.data.clone().unwrap_or_default();
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        Some(Pause {
            reason: get("reason"),
            by: get("paused_by"),
            since: get("paused_at").parse().unwrap_or(0),
        })
    }

    /// One line for humans: `paused by <by> at <UTC time>: <reason>`.
    pub fn describe(&self) -> String {
        let when = crate::clock::rfc3339(self.since);
        let reason = if self.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", self.reason)
        };
        format!("paused by {} at {when}{reason}", self.by)
    }
}

/// The pause ConfigMap [`pause`] creates: [`PAUSE_NAME`], labelled `app.kubernetes.io/name=keyplan`
/// and `app.kubernetes.io/component=`[`COMPONENT`], with data `reason`, `paused_by` and
/// `paused_at` (`at`, Unix seconds, as decimal text) — what agents and `fleet status` read
/// ([`Pause::of`]; docs/formats.md, "Pause").
pub fn configmap(reason: &str, by: &str, at: u64) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(PAUSE_NAME.into()),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".to_string(), "keyplan".to_string()),
                (
                    "app.kubernetes.io/component".to_string(),
                    COMPONENT.to_string(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([
            ("reason".to_string(), reason.to_string()),
            ("paused_by".to_string(), by.to_string()),
            ("paused_at".to_string(), at.to_string()),
        ])),
        ..ConfigMap::default()
    }
}

/// What [`pause`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Paused {
    /// The pause was written now.
    Now,
    /// The fleet was already paused (that pause is kept as it is).
    Already(Pause),
}

/// Pauses the rollout in `namespace`: creates [`PAUSE_NAME`] with `reason`, `by` and the
/// time now. Errors: the create failed (denied, unreachable), as a text naming the
/// ConfigMap and the namespace.
pub fn pause(
    client: &kube::Client,
    namespace: &str,
    reason: &str,
    by: &str,
) -> Result<Paused, FleetError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = configmap(reason, by, crate::clock::now_unix());
    let what = format!("creating ConfigMap {PAUSE_NAME} in namespace {namespace}");
    match block_on("fleet", api.create(&PostParams::default(), &cm))
        .map_err(|e| FleetError::Api(format!("{what}: {e}")))?
    {
        Ok(_) => Ok(Paused::Now),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let got = block_on("fleet", api.get_opt(PAUSE_NAME))
                .map_err(|e| FleetError::Api(format!("reading ConfigMap {PAUSE_NAME}: {e}")))?
                .map_err(|e| {
                    FleetError::Api(format!(
                        "reading ConfigMap {PAUSE_NAME}: {}",
                        super::api_text(&e)
                    ))
                })?;
            match got.as_ref().and_then(Pause::of) {
                Some(p) => Ok(Paused::Already(p)),
                // Deleted in between: a resume won; pause again.
                None => pause(client, namespace, reason, by),
            }
        }
        Err(e) => Err(FleetError::Api(format!("{what}: {}", super::api_text(&e)))),
    }
}

/// Resumes the rollout in `namespace`: deletes [`PAUSE_NAME`]. Returns the pause that was in
/// effect, `None` when the fleet was not paused. Errors: the read or delete failed.
pub fn resume(client: &kube::Client, namespace: &str) -> Result<Option<Pause>, FleetError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let got = block_on("fleet", api.get_opt(PAUSE_NAME))
        .map_err(|e| FleetError::Api(format!("reading ConfigMap {PAUSE_NAME}: {e}")))?
        .map_err(|e| {
            FleetError::Api(format!(
                "reading ConfigMap {PAUSE_NAME} in namespace {namespace}: {}",
                super::api_text(&e)
            ))
        })?;
    let Some(p) = got.as_ref().and_then(Pause::of) else {
        return Ok(None);
    };
    let what = format!("deleting ConfigMap {PAUSE_NAME} in namespace {namespace}");
    match block_on("fleet", api.delete(PAUSE_NAME, &DeleteParams::default()))
        .map_err(|e| FleetError::Api(format!("{what}: {e}")))?
    {
        Ok(_) => Ok(Some(p)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(FleetError::Api(format!("{what}: {}", super::api_text(&e)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_reads_back_from_its_configmap_and_no_other() {
        let mut cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(PAUSE_NAME.into()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/component".to_string(),
                    COMPONENT.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([
                ("reason".to_string(), "change freeze".to_string()),
                ("paused_by".to_string(), "alice".to_string()),
                ("paused_at".to_string(), "1700000000".to_string()),
            ])),
            ..ConfigMap::default()
        };
        let p = Pause::of(&cm).expect("a pause");
        assert_eq!(p.since, 1_700_000_000);
        assert_eq!(
            p.describe(),
            "paused by alice at 2023-11-14T22:13:20Z: change freeze"
        );
        cm.metadata.name = Some("keyplan-node-a".into());
        assert_eq!(
            Pause::of(&cm),
            None,
            "a report labelled as the pause is no pause"
        );
        cm.metadata.name = Some(PAUSE_NAME.into());
        cm.metadata.labels = None;
        assert_eq!(Pause::of(&cm), None, "agents would not see it");
    }
}
