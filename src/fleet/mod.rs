//! Fleet mode on Kubernetes (issue 15, docs/fleet.md): what the coming node agent uses to run
//! the engine on many nodes with Kubernetes as the distributed engine. So far: the rollout
//! slots ([`slots`]), a counting semaphore of `coordination.k8s.io/v1` Leases that bounds how
//! many nodes apply at once.

pub mod slots;

/// A Kubernetes client for the fleet's objects (Leases, reports, Events): from the kubeconfig
/// file `kubeconfig` (its `context`, or its current one), else the in-cluster service account
/// or `KUBECONFIG`, as the kubernetes KMS provider loads it ([`crate::kms::kubernetes`]),
/// with the same 30 s timeouts and no retries of its own.
///
/// Errors: a text saying which configuration could not be used and why (never a token).
pub fn client(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> Result<kube::Client, String> {
    // rustls is built with two crypto providers (kube's ring, reqwest's aws-lc-rs) and cannot
    // pick one by itself; as for the kubernetes KMS, use ring. One installed earlier stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
    crate::kms::block_on(
        "fleet",
        crate::kms::kubernetes::load_client(kubeconfig, context),
    )
    .map_err(|e| e.to_string())?
    .map(|(_, client, _)| client)
}
