//! Opening a `vault` KMS instance from the plan: the settings checked (`address`, `mount`,
//! TLS files), the token found or the login method chosen (`auth.rs`), and the one HTTP client
//! built, so that a bad CA file is reported at open. Contacts nothing.

use std::sync::{Mutex, OnceLock};

use vaultrs::client::{VaultClient, VaultClientSettingsBuilder};
use zeroize::Zeroizing;

use super::auth::{self, Auth};
use super::client::{error_chain, Login, VaultKms};
use crate::kms::{Kms, KmsError};
use crate::spec::KmsConfig;

/// Mount used when the plan names none: `secret`, the KV v2 mount of a Vault/OpenBao dev server.
pub const DEFAULT_MOUNT: &str = "secret";

/// Opens the `vault` KMS instance `name` configured as `config`. With a static token (no
/// `auth`, or `method: token`) it reads the token from the environment variable named by
/// `token_env` (default [`DEFAULT_TOKEN_ENV`](auth::DEFAULT_TOKEN_ENV)); a login method logs
/// in on the first request ([`VaultKms::with_login`]). Contacts nothing.
///
/// Errors: [`KmsError::Config`] when the token variable is unset, empty or not UTF-8, or for
/// the cases of [`VaultKms::new`] and [`VaultKms::with_login`].
pub fn open(name: &str, config: &KmsConfig) -> Result<Box<dyn Kms>, KmsError> {
    let var = match config {
        KmsConfig::Vault {
            token_env, auth, ..
        } => match Auth::from_config(auth.as_ref(), token_env.as_deref()) {
            Auth::Token { env } => env,
            _ => return Ok(Box::new(VaultKms::with_login(name, config)?)),
        },
        other => return Err(KmsError::misrouted(name, other, "vault")),
    };
    let token = match std::env::var(&var) {
        Ok(t) if !t.trim().is_empty() => Zeroizing::new(t),
        Ok(_) | Err(std::env::VarError::NotPresent) => {
            return Err(KmsError::Config {
                kms: describe_config(name, config),
                detail: format!(
                    "the environment variable {var} (the instance's `token_env`) is not set or empty; export the Vault/OpenBao token there, e.g. `export {var}=$(bao print token)`"
                ),
            })
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(KmsError::Config {
                kms: describe_config(name, config),
                detail: format!(
                    "the environment variable {var} (the instance's `token_env`) is not valid UTF-8, so it cannot be a Vault token"
                ),
            })
        }
    };
    Ok(Box::new(VaultKms::new(name, config, &token, &var)?))
}

/// The plan's `address` as a URL: `http(s)://` with a host. Errors: what is wrong and how to
/// write it.
fn parse_address(address: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(address.trim()).map_err(|e| {
        format!(
            "`address` {address:?} is not a URL ({e}); write it like `https://vault.example.com:8200`"
        )
    })?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(format!(
            "`address` {address:?} must start with https:// (or http:// for a local test server)"
        ));
    }
    if url.cannot_be_a_base() || url.host_str().is_none() {
        return Err(format!(
            "`address` {address:?} names no host; write it like `https://vault.example.com:8200`"
        ));
    }
    Ok(url)
}

/// The plan's `mount` (default [`DEFAULT_MOUNT`]) without surrounding `/`. Errors: an empty
/// mount, an empty, `.` or `..` component, control characters.
fn parse_mount(mount: Option<&str>) -> Result<String, String> {
    let mount = mount.unwrap_or(DEFAULT_MOUNT).trim_matches('/').to_string();
    if mount.is_empty()
        || mount
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
        || mount.chars().any(char::is_control)
    {
        return Err(format!(
            "`mount` {mount:?} is not a KV mount path; write the mount's path, e.g. `secret`"
        ));
    }
    Ok(mount)
}

/// How a client reaches the server: the validated address, TLS trust and identity, and the
/// namespace; everything but the token.
#[derive(Clone)]
struct Endpoint {
    url: url::Url,
    namespace: Option<String>,
    ca_cert: Option<String>,
    /// The client certificate of certificate login.
    identity: Option<reqwest::Identity>,
}

/// The vaultrs client for `ep` with `token` (empty: none, for a login request), a backstop
/// timeout of [`crate::kms::deadline::MAX_TIMEOUT`] (requests are bounded by their call's
/// deadline), TLS always verified (trusting `ca_cert`, a PEM file, when given;
/// presenting the client identity when there is one) and `namespace` unless blank. Its
/// construction logs nothing. Errors: the settings or the HTTP client cannot be built (an
/// unreadable CA file, say).
fn build_client(ep: &Endpoint, token: &str) -> Result<VaultClient, String> {
    let (url, namespace, ca_cert) = (&ep.url, ep.namespace.as_deref(), ep.ca_cert.as_deref());
    crate::kms::install_tls_provider();
    let mut builder = VaultClientSettingsBuilder::default();
    builder
        // Already parsed, so vaultrs's own parse (which panics on failure) succeeds.
        .address(url.as_str())
        .token(token)
        // A backstop only: every request is bounded by its call's deadline (`request`).
        .timeout(Some(crate::kms::deadline::MAX_TIMEOUT))
        .ca_certs(ca_cert.iter().map(|c| c.to_string()).collect())
        .identity(ep.identity.clone())
        .verify(true)
        .namespace(
            namespace
                .filter(|n| !n.trim().is_empty())
                .map(str::to_string),
        );
    let settings = builder
        .build()
        .map_err(|e| format!("cannot configure the Vault client: {e}"))?;
    tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
        VaultClient::new(settings)
    })
    .map_err(|e| {
        format!(
            "cannot set up the HTTP client: {}{}",
            error_chain(&e),
            match (ca_cert, ep.identity.is_some()) {
                (Some(c), false) => format!(" (ca_cert {c}: it must be a readable PEM file)"),
                (Some(c), true) => format!(
                    " (check ca_cert {c}, a readable PEM file, and that client_cert and client_key are an X.509 v3 certificate and its own private key)"
                ),
                (None, true) => " (check that client_cert and client_key are an X.509 v3 certificate and its own private key)".to_string(),
                (None, false) => String::new(),
            }
        )
    })
}

/// `vault KMS "<instance>" (<address>, mount <mount>)` for a configuration not yet validated.
fn describe_config(name: &str, config: &KmsConfig) -> String {
    match config {
        KmsConfig::Vault { address, mount, .. } => format!(
            "vault KMS {name:?} ({address}, mount {})",
            mount.as_deref().unwrap_or(DEFAULT_MOUNT)
        ),
        _ => format!("KMS {name:?}"),
    }
}

impl VaultKms {
    /// A client for the `vault` configuration `config` of instance `instance`, authenticating
    /// with `token` (taken from the variable `token_env`, named in messages; the plan's `auth`
    /// is not used). Contacts nothing; reads the `ca_cert` file (PEM) when the address is
    /// `https://`.
    ///
    /// The client ignores the ambient `VAULT_ADDR`, `VAULT_CACERT`, `VAULT_CAPATH`,
    /// `VAULT_CLIENT_CERT`/`KEY` and `VAULT_SKIP_VERIFY` variables: the plan is the whole
    /// configuration, and TLS is always verified.
    ///
    /// Errors: [`KmsError::Config`] for a `config` that is not `vault`, an address that is not
    /// an `http(s)://` URL, an empty or odd mount, an unreadable CA file.
    pub fn new(
        instance: &str,
        config: &KmsConfig,
        token: &str,
        token_env: &str,
    ) -> Result<VaultKms, KmsError> {
        let auth = Auth::Token {
            env: token_env.to_string(),
        };
        Self::build(instance, config, auth, token)
    }

    /// A client for the `vault` configuration `config` whose `auth` is a login method
    /// (AppRole, Kubernetes, certificate): it logs in on the first request, once per process,
    /// and uses the token it gets. Contacts nothing; reads the `ca_cert` file and, for
    /// certificate login, `client_cert` and `client_key`. The secret ID and the service
    /// account token are read at the login.
    ///
    /// Errors: as [`VaultKms::new`]; [`KmsError::Config`] naming the file when a certificate
    /// or key cannot be read.
    pub fn with_login(instance: &str, config: &KmsConfig) -> Result<VaultKms, KmsError> {
        let KmsConfig::Vault {
            token_env, auth, ..
        } = config
        else {
            return Err(KmsError::misrouted(instance, config, "vault"));
        };
        Self::build(
            instance,
            config,
            Auth::from_config(auth.as_ref(), token_env.as_deref()),
            "",
        )
    }

    /// The parts of [`VaultKms::new`] and [`VaultKms::with_login`] common to both: settings
    /// checked and the one HTTP client built (now, so that a bad CA file is reported at open),
    /// with `token` for a static token, without one for a login method.
    fn build(
        instance: &str,
        config: &KmsConfig,
        auth: Auth,
        token: &str,
    ) -> Result<VaultKms, KmsError> {
        let desc = describe_config(instance, config);
        let config_err = |detail: String| KmsError::Config {
            kms: desc.clone(),
            detail,
        };
        let KmsConfig::Vault {
            address,
            mount,
            namespace,
            ca_cert,
            auth: auth_config,
            ..
        } = config
        else {
            return Err(KmsError::misrouted(instance, config, "vault"));
        };
        let url = parse_address(address).map_err(&config_err)?;
        let mount = parse_mount(mount.as_deref()).map_err(&config_err)?;
        if ca_cert.is_some() && url.scheme() == "http" {
            tracing::warn!(
                kms = %desc,
                "`ca_cert` is set but `address` uses plain http://, so the certificate is not used"
            );
        }
        if matches!(auth, Auth::Cert { .. }) && url.scheme() != "https" {
            return Err(config_err(
                "certificate login needs an https:// `address`".to_string(),
            ));
        }
        let identity = match &auth {
            Auth::Cert { .. } => auth::identity(auth_config.as_ref()).map_err(&config_err)?,
            _ => None,
        };
        let endpoint = Endpoint {
            url,
            namespace: namespace.clone(),
            ca_cert: ca_cert.clone(),
            identity,
        };
        let built = build_client(&endpoint, token).map_err(&config_err)?;
        let (client, pending) = if auth.is_login() {
            (OnceLock::new(), Some(built))
        } else {
            (OnceLock::from(built), None)
        };
        Ok(VaultKms {
            instance: instance.to_string(),
            address: address.trim().to_string(),
            mount,
            auth,
            client,
            login: Mutex::new(Login {
                client: pending,
                refused: None,
            }),
        })
    }
}
