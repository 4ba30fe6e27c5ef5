//! What can go wrong in fleet mode, by kind: the agent and `keyplan fleet`/`keyplan sign` act
//! on the kind (`fleet clear` suggests running again after a conflict), and show the message,
//! which says what failed, on which object or file, and what to do.

/// Why a fleet operation failed. Each variant carries the message a person reads; none holds a
/// credential or key material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    /// The Kubernetes API could not be reached, did not answer in time, or failed a call (the
    /// message names the object and the HTTP status); or the async runtime could not start.
    #[error("{0}")]
    Api(String),
    /// An object kept changing under a write (HTTP 409 Conflict again and again): running the
    /// command again is the fix.
    #[error("{0}")]
    Conflict(String),
    /// The kubeconfig or in-cluster configuration cannot be used.
    #[error("{0}")]
    Client(String),
    /// A local file (the plan's ConfigMap volume, the agent's configuration) cannot be read or
    /// is not valid.
    #[error("{0}")]
    File(String),
    /// A signing key, a trusted key, a cluster name or a signature cannot be used.
    #[error("{0}")]
    Signature(String),
    /// The agent's metrics endpoint cannot listen on its address.
    #[error("{0}")]
    Endpoint(String),
}

impl FleetError {
    /// The same kind of error, its message prefixed with `what` (`"<what>: <message>"`).
    pub fn prefixed(self, what: &str) -> FleetError {
        let with = |m: String| format!("{what}: {m}");
        match self {
            FleetError::Api(m) => FleetError::Api(with(m)),
            FleetError::Conflict(m) => FleetError::Conflict(with(m)),
            FleetError::Client(m) => FleetError::Client(with(m)),
            FleetError::File(m) => FleetError::File(with(m)),
            FleetError::Signature(m) => FleetError::Signature(with(m)),
            FleetError::Endpoint(m) => FleetError::Endpoint(with(m)),
        }
    }
}
