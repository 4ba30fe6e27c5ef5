//! Kubernetes clients with keyplan's settings (client-side retries off, its timeouts), from a
//! kubeconfig or the in-cluster service account, and error texts that never quote a
//! credential. Shared by the `kubernetes` KMS provider (`src/kms/kubernetes/`) and fleet mode
//! (`src/fleet/mod.rs`), so neither reaches into the other.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

/// Loads the connection settings (the kubeconfig file `kubeconfig` and its `context`, or its
/// current one; without a file, `KUBECONFIG` or `~/.kube/config`, else the in-cluster service
/// account) and builds a client with
/// client-side retries off and `timeout` for connecting and for each read and write.
/// Returns the cluster URL, the client, and what `auth` made of the client's credential
/// settings (e.g. where it comes from, for its expiry; never the credential itself). Errors: why the
/// kubeconfig or the in-cluster configuration cannot be used (never its content).
pub async fn load_client<A>(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    timeout: std::time::Duration,
    auth: impl FnOnce(&kube::config::AuthInfo) -> A,
) -> Result<(String, kube::Client, A), String> {
    load_client_reading(kubeconfig, context, timeout, timeout, auth).await
}

/// [`load_client`] with its own `read_timeout` (a watch's client waits longer for a read
/// than `timeout`: the API server may send nothing for minutes).
pub async fn load_client_reading<A>(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    timeout: std::time::Duration,
    read_timeout: std::time::Duration,
    auth: impl FnOnce(&kube::config::AuthInfo) -> A,
) -> Result<(String, kube::Client, A), String> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let config = match kubeconfig {
        Some(path) => match Kubeconfig::read_from(path) {
            Ok(kc) => kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| kubeconfig_error(&e)),
            Err(e) => Err(kubeconfig_error(&e)),
        },
        None if context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| kubeconfig_error(&e)),
        None => kube::Config::infer().await.map_err(|e| {
            format!(
                "{}; no in-cluster service account either",
                std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<KubeconfigError>())
                    .map(kubeconfig_error)
                    .unwrap_or_else(|| e.to_string())
            )
        }),
    };
    let mut config = config?;
    config.default_retry = false;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(read_timeout);
    config.write_timeout = Some(timeout);
    config.reset_reader_on_write = true;
    let url = config.cluster_url.to_string();
    let auth = auth(&config.auth_info);
    let client = kube::Client::try_from(config)
        .map_err(|e| format!("cannot build a client: {}", chain(&e)))?;
    Ok((url, client, auth))
}

/// A kubeconfig error without the file's content (a YAML error may quote a credential).
fn kubeconfig_error(e: &KubeconfigError) -> String {
    match e {
        KubeconfigError::Parse(_) => {
            "the kubeconfig is not valid YAML (details withheld: they could quote a credential)"
                .to_string()
        }
        other => chain(other),
    }
}

/// An error and its sources, joined by ": " (repeated texts dropped).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(s) = cur {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        cur = s.source();
    }
    parts.join(": ")
}
