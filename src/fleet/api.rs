//! The Kubernetes API calls fleet mode makes, per front end: the node agent's are what its
//! Role (`deploy/kubernetes/rbac.yaml`) must grant, no more (tests check the manifests against
//! [`AGENT_CALLS`], and the simulated fleet test checks every request the agents made against
//! it); `keyplan fleet status` and `fleet clear` need [`OPERATOR_CALLS`].
//!
//! Verbs are Kubernetes authorization verbs
//! (<https://kubernetes.io/docs/reference/access-authn-authz/authorization/#determine-the-request-verb>):
//! `GET` of one object is `get`, of a collection `list` (`watch` with `?watch=true`), `POST` is
//! `create`, `PUT` `update`, `PATCH` `patch`.

/// One API resource and the verbs used on it, in the fleet namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiCall {
    /// API group (`""` for core/v1).
    pub group: &'static str,
    /// Resource (plural, lowercase).
    pub resource: &'static str,
    /// Authorization verbs, sorted.
    pub verbs: &'static [&'static str],
    /// Whether the calls name objects the Role lists by `resourceNames`: the rollout slot
    /// Leases (`keyplan-rollout-0` .. `keyplan-rollout-<max_concurrent_nodes - 1>`) and the
    /// node reports (`keyplan-node-<node>` for every node of the plan), so a node's token can
    /// change no other object of the namespace (not the plan's ConfigMap, not the agent's
    /// configuration). `create` and `list` cannot be limited by name (RBAC does not know the
    /// name of an object being created, and a list has none).
    pub by_name: bool,
}

/// What `keyplan agent` calls in the fleet namespace (besides the Secrets of a `kubernetes`
/// KMS, which the plan's KMS instances name: docs/kms/kubernetes.md).
///
/// - Leases: the rollout slots ([`super::slots`]): `list` and `watch` while work waits for a
///   slot ([`super::watch`]), then `create` (absent) or `update` (take over, renew, release).
/// - ConfigMaps: the node reports ([`super::report`]): `get` and `update` of its own (by name),
///   `create` of it the first time, `list` and `watch` of all and of the pause while work
///   waits for a slot (the fleet-wide count of failed nodes, the queue of waiting nodes).
/// - Events: `create` (run started, succeeded, failed; plan refused; rollout halted), `patch`
///   of a repeated one's count ([`super::events`]).
pub const AGENT_CALLS: &[ApiCall] = &[
    ApiCall {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["update"],
        by_name: true,
    },
    ApiCall {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["create", "list", "watch"],
        by_name: false,
    },
    ApiCall {
        group: "",
        resource: "configmaps",
        verbs: &["get", "update"],
        by_name: true,
    },
    ApiCall {
        group: "",
        resource: "configmaps",
        verbs: &["create", "list", "watch"],
        by_name: false,
    },
    ApiCall {
        group: "",
        resource: "events",
        verbs: &["create", "patch"],
        by_name: false,
    },
];

/// What `keyplan fleet status` (`list` of reports and Leases), `keyplan fleet clear`
/// (`update` of the failed nodes' reports), `fleet pause` (`create` of the pause ConfigMap,
/// `get` of it when it exists, `create` of an Event) and `fleet resume` (`get` and `delete`
/// of it, an Event) call in the fleet namespace.
pub const OPERATOR_CALLS: &[ApiCall] = &[
    ApiCall {
        group: "",
        resource: "configmaps",
        verbs: &["create", "delete", "get", "list", "update"],
        by_name: false,
    },
    ApiCall {
        group: "",
        resource: "events",
        verbs: &["create"],
        by_name: false,
    },
    ApiCall {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["list"],
        by_name: false,
    },
];
