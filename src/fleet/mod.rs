//! Fleet mode on Kubernetes (docs/fleet.md): the engine on many nodes, with Kubernetes as the
//! distributed engine.
//!
//! - [`agent`]: `keyplan agent`, the per-node reconcile loop over [`crate::ops`];
//! - [`slots`]: the rollout slots, a counting semaphore of `coordination.k8s.io/v1` Leases
//!   that bounds how many nodes apply at once;
//! - [`report`]: the per-node report ConfigMaps, and the fleet-wide failure count that halts
//!   the rollout; [`status`]: `keyplan fleet status` and `fleet clear` over them;
//! - [`pause`]: the operator's brake, `keyplan fleet pause` / `resume`;
//! - [`events`]: Kubernetes Events of runs; `endpoint`: the agent's `/metrics` and `/healthz`;
//! - [`source`]: the plan file of a ConfigMap volume (never a `subPath` mount);
//! - [`trust`]: the agent's configuration, the allow-list a plan is held to;
//! - [`plan`]: `keyplan fleet plan`, every node's diff of a plan from the agents' observations;
//! - [`signature`]: signed plans (`keyplan sign`, the agent's check of a plan's signature);
//! - [`watch`]: a waiting agent's watch of the slots, the reports and the pause;
//! - [`api`]: the API calls each front end makes (what the RBAC manifests grant).

pub mod agent;
pub mod api;
mod endpoint;
pub mod error;
pub mod events;
pub mod pause;
pub mod plan;
mod published;
pub mod render;
pub mod report;
pub mod signature;
pub mod slots;
pub mod source;
pub mod status;
pub mod trust;
pub mod watch;

/// A Kubernetes client for the fleet's objects (Leases, reports, Events): from the kubeconfig
/// file `kubeconfig` (its `context`, or its current one), else the in-cluster service account
/// or `KUBECONFIG`, as the kubernetes KMS provider loads it ([`crate::kube_client`]),
/// with the same 30 s timeouts and no retries of its own.
///
/// Errors: a text saying which configuration could not be used and why (never a token).
pub fn client(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> Result<kube::Client, error::FleetError> {
    crate::runtime::install_tls_provider();
    crate::runtime::block_on(
        "fleet",
        crate::kube_client::load_client(kubeconfig, context, crate::kms::REQUEST_TIMEOUT, |_| ()),
    )
    .map_err(|e| error::FleetError::Api(e.to_string()))?
    .map(|(_, client, _)| client)
    .map_err(error::FleetError::Client)
}

/// The client of the fleet's watches ([`watch`]): as [`client`], but a read may wait
/// [`WATCH_READ_TIMEOUT`] (a watch ends on the server's side after at most 290 s:
/// kube-runtime's `watcher` asks for that, and resumes).
///
/// Errors: as [`client`].
pub fn watch_client(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> Result<kube::Client, error::FleetError> {
    crate::runtime::install_tls_provider();
    crate::runtime::block_on(
        "fleet",
        crate::kube_client::load_client_reading(
            kubeconfig,
            context,
            crate::kms::REQUEST_TIMEOUT,
            WATCH_READ_TIMEOUT,
            |_| (),
        ),
    )
    .map_err(|e| error::FleetError::Api(e.to_string()))?
    .map(|(_, client, _)| client)
    .map_err(error::FleetError::Client)
}

/// How long the watch client waits for a read: 330 s, longer than the 290 s a watch lasts.
pub const WATCH_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(330);

/// A Kubernetes client error for messages: `HTTP <code>: <message>` for an API status, else
/// the error's text (kube's errors name no token).
pub(crate) fn api_text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("HTTP {}: {}", s.code, s.message),
        // kube's transport errors say little at the top ("ServiceError: client error
        // (Connect)"); the cause (connection refused, DNS, TLS) is in the sources.
        e => crate::kube_client::chain(e),
    }
}
