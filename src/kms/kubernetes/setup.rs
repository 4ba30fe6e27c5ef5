//! Opening a `kubernetes` KMS instance: the plan's namespace and data key checked, the
//! kubeconfig (or the in-cluster service account) loaded into a client with keyplan's
//! timeouts. Nothing is sent to the cluster.

use std::path::Path;

use super::auth::AuthSource;
use super::client::KubernetesKms;
use super::layout::{is_data_key, is_dns1123_label, DEFAULT_DATA_KEY, VERSION_DATA_PREFIX};
use crate::kms::{block_on, Kms, KmsError, REQUEST_TIMEOUT};
use crate::spec::KmsConfig;

/// Opens the `kubernetes` KMS instance `name` configured as `config` (a
/// [`KmsConfig::Kubernetes`]): loads the kubeconfig `context` when one is given, otherwise
/// infers the configuration (`KUBECONFIG` or `~/.kube/config`, else in-cluster service
/// account). Nothing is sent to the cluster.
///
/// Errors: [`KmsError::Config`] for an invalid namespace or data key, or an unusable
/// kubeconfig (named, without its content).
pub fn open(name: &str, config: &KmsConfig) -> Result<Box<dyn Kms>, KmsError> {
    match config {
        KmsConfig::Kubernetes {
            namespace,
            context,
            data_key,
            ..
        } => Ok(Box::new(KubernetesKms::with_timeout(
            name,
            namespace,
            data_key.as_deref(),
            None,
            context.as_deref(),
            crate::kms::timeout_of(name, config)?,
        )?)),
        other => Err(KmsError::misrouted(name, other, "kubernetes")),
    }
}

/// How much longer than a call's deadline the kube client's own timeouts are (backstops).
const CLIENT_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

impl KubernetesKms {
    /// Connects KMS instance `name` to `namespace`, storing the current passphrase under
    /// `data_key` (default [`DEFAULT_DATA_KEY`]). Connection settings come from the kubeconfig
    /// file `kubeconfig` if given, else from `KUBECONFIG`/`~/.kube/config` (context `context`,
    /// default the current context), else, with neither a file nor a context, from the
    /// in-cluster service account. Client-side retries are off (keyplan retries only
    /// idempotent calls itself) and connect/read/write timeouts are [`REQUEST_TIMEOUT`].
    /// Nothing is sent to the cluster. Installs rustls' `ring` crypto provider as the
    /// process default if none is installed yet (needed for `https://` cluster URLs).
    ///
    /// Errors: [`KmsError::Config`] naming what is unusable (the kubeconfig's content is never
    /// quoted: it may hold credentials).
    pub fn new(
        name: &str,
        namespace: &str,
        data_key: Option<&str>,
        kubeconfig: Option<&Path>,
        context: Option<&str>,
    ) -> Result<KubernetesKms, KmsError> {
        Self::with_timeout(
            name,
            namespace,
            data_key,
            kubeconfig,
            context,
            REQUEST_TIMEOUT,
        )
    }

    /// [`KubernetesKms::new`] for an instance whose calls may take up to `timeout` (its
    /// `timeout` in the plan): the client's own connect, read and write timeouts are a few
    /// seconds longer ([`CLIENT_GRACE`]), backstops only, so the call's own deadline
    /// ([`crate::kms::deadline`]) ends a silent request first and says so.
    ///
    /// Errors: as [`KubernetesKms::new`].
    pub fn with_timeout(
        name: &str,
        namespace: &str,
        data_key: Option<&str>,
        kubeconfig: Option<&Path>,
        context: Option<&str>,
        timeout: std::time::Duration,
    ) -> Result<KubernetesKms, KmsError> {
        let pre = format!("kubernetes KMS {name:?} (namespace {namespace})");
        let config_err = |detail: String| KmsError::Config {
            kms: pre.clone(),
            detail,
        };
        if !is_dns1123_label(namespace) {
            return Err(config_err(format!(
                "namespace {namespace:?} is not a valid Kubernetes namespace name (lowercase letters, digits and '-', at most 63 characters); fix `namespace` in the plan"
            )));
        }
        let data_key = data_key.unwrap_or(DEFAULT_DATA_KEY).to_string();
        if !is_data_key(&data_key) || data_key.starts_with(VERSION_DATA_PREFIX) {
            return Err(config_err(format!(
                "data_key {data_key:?} cannot be used: a Secret data key is made of letters, digits, '-', '_' and '.' (at most 253 characters), and keys starting with {VERSION_DATA_PREFIX:?} are keyplan's own; fix `data_key` in the plan"
            )));
        }
        let what = config_source(kubeconfig, context);
        crate::kms::install_tls_provider();
        let loaded = block_on(
            &pre,
            crate::kube_client::load_client(
                kubeconfig,
                context,
                timeout + CLIENT_GRACE,
                AuthSource::of,
            ),
        )?;
        let (url, client, auth) =
            loaded.map_err(|e| config_err(format!("cannot use {what}: {e}")))?;
        Ok(KubernetesKms {
            name: name.to_string(),
            namespace: namespace.to_string(),
            data_key,
            cluster_url: url.trim_end_matches('/').to_string(),
            client,
            auth,
        })
    }
}

/// Where the connection settings come from, for messages.
fn config_source(kubeconfig: Option<&Path>, context: Option<&str>) -> String {
    match (kubeconfig, context) {
        (Some(p), Some(c)) => format!("context {c:?} of kubeconfig {}", p.display()),
        (Some(p), None) => format!("kubeconfig {}", p.display()),
        (None, Some(c)) => {
            format!("context {c:?} of the kubeconfig (KUBECONFIG or ~/.kube/config)")
        }
        (None, None) => {
            "the kubeconfig (KUBECONFIG or ~/.kube/config) or in-cluster service account"
                .to_string()
        }
    }
}
