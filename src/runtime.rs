//! keyplan's one async runtime, the bridge from synchronous engine code to the async client
//! crates (`vaultrs`, `kube`): [`block_on`] for a call, [`spawn`] for a background watch; and
//! the process's one TLS crypto provider. Shared by the KMS providers and fleet mode, so
//! neither reaches into the other for it.

use std::fmt;

/// Installs ring as the process's rustls crypto provider, once. Every TLS client keyplan
/// builds (kube's for the kubernetes KMS and fleet mode, reqwest's under vaultrs for Vault)
/// takes the process default: reqwest is built with `rustls-no-provider` (Cargo.toml), so a
/// Vault client built before this would fail. A provider installed earlier stays.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The runtime could not be started (threads could not be created): `what` is the caller's
/// name for what needed it (a KMS instance, `fleet`).
#[derive(Debug, Clone)]
pub struct RuntimeUnavailable {
    /// What needed the runtime.
    pub what: String,
    /// Why it could not start (the OS error's text).
    pub cause: String,
}

impl fmt::Display for RuntimeUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: cannot start the async runtime for network KMS calls: {}",
            self.what, self.cause
        )
    }
}

impl std::error::Error for RuntimeUnavailable {}

/// Runs `future` to completion on the shared runtime (2 worker threads, started on first use)
/// from synchronous code. Safe to call from several threads at once; must not be called from
/// inside the runtime.
///
/// Errors: [`RuntimeUnavailable`] naming `what` if the runtime cannot be started.
pub fn block_on<F: std::future::Future>(
    what: &str,
    future: F,
) -> Result<F::Output, RuntimeUnavailable> {
    match runtime() {
        Ok(rt) => Ok(rt.block_on(future)),
        Err(e) => Err(RuntimeUnavailable {
            what: what.to_string(),
            cause: e.clone(),
        }),
    }
}

/// Starts `future` as a background task on the shared runtime ([`block_on`]'s); its handle
/// aborts it. Used for the fleet's watches (`src/fleet/watch.rs`).
///
/// Errors: the runtime cannot be started (its text).
pub fn spawn<F>(future: F) -> Result<tokio::task::JoinHandle<F::Output>, String>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    runtime()
        .map(|rt| rt.spawn(future))
        .map_err(|e| e.to_string())
}

/// The shared runtime: 2 worker threads, started on first use.
fn runtime() -> Result<&'static tokio::runtime::Runtime, &'static String> {
    static RUNTIME: std::sync::OnceLock<Result<tokio::runtime::Runtime, String>> =
        std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("keyplan-kms")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
}
