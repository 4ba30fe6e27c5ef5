//! The `vault` KMS provider: HashiCorp Vault / OpenBao, KV secrets engine version 2.
//!
//! Operator documentation (layout, third-party readers, policy, failures): `docs/kms/vault.md`.
//! API reference: <https://developer.hashicorp.com/vault/api-docs/secret/kv/kv-v2> (OpenBao:
//! <https://openbao.org/api-docs/secret/kv/kv-v2/>).
//!
//! Layout, for a key whose KMS name is `<name>` (a path under the mount, e.g. `rook/osd-kek`)
//! on the mount `<mount>`:
//!
//! ```text
//! <mount>/data/<name>                     the CURRENT version: the latest KV version holds
//!     <basename>          the passphrase (field named after the last path component of <name>,
//!                         as Rook stores its KEKs, so `bao kv get -field=<basename>` reads it)
//!     keyplan_version     keyplan's version number, decimal string
//!     keyplan_created_at  creation time of that version, Unix seconds, decimal string
//!     keyplan_history     compact JSON text: [[keyplan_version, kv_version, created_at], ...]
//!                         for every earlier version (their material is in older KV versions)
//!     keyplan_holders     compact JSON text {"<holder>": since, ...}: the plans holding the
//!                         key (Kms::hold; absent: none)
//! <mount>/data/<name>.keyplan-pending     the PENDING version (only during a rotation)
//!     passphrase, keyplan_version, keyplan_created_at,
//!     keyplan_base_kv_version  KV version of the main path it was staged on (0: none)
//!     keyplan_base_version     keyplan version current then (0: none)
//! ```
//!
//! Every write uses check-and-set (`options.cas`): the pending secret is created with `cas=0`
//! (create-only), a commit writes the main path with `cas` = the KV version read just before,
//! which must still be the one the pending version was staged on.
//! A secret written by someone else without the `keyplan_*` fields is adopted: its keyplan
//! version is its KV version. A pending secret whose version is not above the current one is
//! the leftover of a commit whose cleanup was cut short: reads ignore it and `stage` deletes
//! it. `destroy_key` first writes a tombstone version (`keyplan_destroyed_at`) with
//! check-and-set, then deletes the metadata (all versions) of both paths.
//!
//! All HTTP goes through `vaultrs` (with `rustify` for two endpoints vaultrs lacks) on the
//! shared runtime ([`super::block_on`]), each request limited to what is left of its call's
//! deadline ([`super::deadline`]: the instance's `timeout`, default [`super::REQUEST_TIMEOUT`]). The
//! client crates' own tracing is silenced (they log expected 404s as errors); this module logs
//! each request at `debug` with the path only, never a token or passphrase. The HTTP buffers
//! inside `vaultrs`/`reqwest` are not zeroized (the crates offer no hook); keyplan's own copies
//! are.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::{Mutex, OnceLock, PoisonError};

use serde::Deserialize;
use serde_json::Value;
use tracing::instrument::WithSubscriber as _;
use vaultrs::api::kv2::requests::{ReadSecretRequest, SetSecretRequestOptions};
use vaultrs::api::kv2::responses::{ReadSecretMetadataResponse, ReadSecretResponse};
use vaultrs::client::{VaultClient, VaultClientSettingsBuilder};
use vaultrs::error::ClientError;
use zeroize::Zeroizing;

use super::book::{Commit, Destroy, VersionBook};
use super::{
    block_on, with_retries, Credential, KeyState, Kms, KmsError, VersionInfo, VersionState,
};
use crate::secret::Passphrase;
use crate::spec::KmsConfig;

mod auth;

use auth::Auth;
pub use auth::{DEFAULT_JWT_FILE, DEFAULT_TOKEN_ENV};

/// Mount used when the plan names none: `secret`, the KV v2 mount of a Vault/OpenBao dev server.
pub const DEFAULT_MOUNT: &str = "secret";
/// Suffix of the sibling path holding the pending version: `<name>.keyplan-pending`.
pub const PENDING_SUFFIX: &str = ".keyplan-pending";
/// Data field with keyplan's version number (decimal string).
pub const FIELD_VERSION: &str = "keyplan_version";
/// Data field with the version's creation time (Unix seconds, decimal string).
pub const FIELD_CREATED_AT: &str = "keyplan_created_at";
/// Data field with the earlier versions, compact JSON `[[version, kv_version, created_at], ...]`.
pub const FIELD_HISTORY: &str = "keyplan_history";
/// Data field with the plans holding the key ([`Kms::hold`]), compact JSON
/// `{"<holder id>": <since, Unix seconds>, ...}`; absent when there is none.
pub const FIELD_HOLDERS: &str = "keyplan_holders";
/// Data field of the tombstone `destroy_key` writes before deleting the key (Unix seconds).
pub const FIELD_DESTROYED_AT: &str = "keyplan_destroyed_at";
/// Data field of the pending secret holding the passphrase.
pub const FIELD_PASSPHRASE: &str = "passphrase";
/// Data field of the pending secret: the KV version of the main path it was staged on (`0`:
/// none). A commit requires the main path to be still at that KV version.
pub const FIELD_BASE: &str = "keyplan_base_kv_version";
/// Data field of the pending secret: the keyplan version that was current when it was staged
/// (`0`: none). A commit on a main path whose KV version moved on since (a holder record was
/// written, [`FIELD_HOLDERS`]) is still allowed when its current keyplan version and creation
/// time are this version's: the current version did not change.
pub const FIELD_BASE_VERSION: &str = "keyplan_base_version";
/// How many older readable KV versions are searched for a keyplan-written one when the latest
/// version has no keyplan fields (a foreign write on a managed key, or a secret to adopt).
const FOREIGN_SCAN: usize = 20;

/// Opens the `vault` KMS instance `name` configured as `config`. With a static token (no
/// `auth`, or `method: token`) it reads the token from the environment variable named by
/// `token_env` (default [`DEFAULT_TOKEN_ENV`]); a login method logs in on the first request
/// ([`VaultKms::with_login`]). Contacts nothing.
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
/// timeout of [`super::deadline::MAX_TIMEOUT`] (requests are bounded by their call's
/// deadline), TLS always verified (trusting `ca_cert`, a PEM file, when given;
/// presenting the client identity when there is one) and `namespace` unless blank. Its
/// construction logs nothing. Errors: the settings or the HTTP client cannot be built (an
/// unreadable CA file, say).
fn build_client(ep: &Endpoint, token: &str) -> Result<VaultClient, String> {
    let (url, namespace, ca_cert) = (&ep.url, ep.namespace.as_deref(), ep.ca_cert.as_deref());
    super::install_tls_provider();
    let mut builder = VaultClientSettingsBuilder::default();
    builder
        // Already parsed, so vaultrs's own parse (which panics on failure) succeeds.
        .address(url.as_str())
        .token(token)
        // A backstop only: every request is bounded by its call's deadline (`request`).
        .timeout(Some(super::deadline::MAX_TIMEOUT))
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

/// A Vault/OpenBao KV v2 key store (see the module documentation for the layout).
///
/// Safe to share between threads; every call is one or a few HTTP requests on the shared
/// runtime. `Debug` shows [`Kms::describe`] only (never the token).
pub struct VaultKms {
    instance: String,
    address: String,
    mount: String,
    /// Where the token comes from.
    auth: Auth,
    /// The client with its token: set at construction for a static token, after the login
    /// (on the first request) otherwise.
    client: OnceLock<VaultClient>,
    /// Held during a login, so concurrent first requests log in once.
    login: Mutex<Login>,
}

/// The login of a login method, before and after it is tried.
struct Login {
    /// The client without a token the login is made with; it gets the token and becomes
    /// [`VaultKms::client`] once the login succeeds.
    client: Option<VaultClient>,
    /// The error of a login that was refused (or could not read its files): the rest of the
    /// run gets the same error without asking again, as servers lock a role out after a few
    /// failed logins (OpenBao's user lockout: 5 by default).
    refused: Option<KmsError>,
}

impl fmt::Debug for VaultKms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VaultKms({})", self.describe())
    }
}

/// How long revoking a login token at the end may take before keyplan gives up (it then
/// expires by its TTL).
const REVOKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for VaultKms {
    /// Revokes the token a login got (`auth/token/revoke-self`), so runs every minute (a
    /// `status` scrape) do not pile up live tokens until their TTL ends. Best effort, at most
    /// [`REVOKE_TIMEOUT`]; a failure is logged at `debug`. A static token is never revoked.
    fn drop(&mut self) {
        if !self.auth.is_login() {
            return;
        }
        let Some(client) = self.client.get() else {
            return;
        };
        // The timer is made inside the runtime (it needs its reactor).
        let revoke = async {
            tokio::time::timeout(REVOKE_TIMEOUT, vaultrs::token::revoke_self(client)).await
        }
        .with_subscriber(tracing::subscriber::NoSubscriber::default());
        match block_on(&self.describe(), revoke) {
            Ok(Ok(Ok(()))) => {
                tracing::debug!(kms = %self.instance, "revoked the login token")
            }
            other => tracing::debug!(
                kms = %self.instance,
                "could not revoke the login token (it expires by its TTL): {}",
                match other {
                    Ok(Ok(Err(e))) => error_chain(&e),
                    Ok(Err(_)) => "timed out".to_string(),
                    Err(e) => e.to_string(),
                    Ok(Ok(Ok(()))) => String::new(),
                }
            ),
        }
    }
}

/// Outcome of one request that may legitimately find nothing or lose a check-and-set race.
enum Answer<T> {
    Ok(T),
    /// HTTP 404; `deleted` is the KV version when the server says the version exists but was
    /// deleted or destroyed (its answer then carries the version's metadata).
    NotFound {
        deleted: Option<u64>,
    },
    /// HTTP 400 "check-and-set parameter did not match the current version".
    CasMismatch,
}

/// A read of one KV path.
enum Read {
    Found(ReadSecretResponse),
    Absent,
    /// The KV version exists but was deleted or destroyed.
    Deleted(u64),
}

/// One earlier version, as recorded in `keyplan_history`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hist {
    version: u64,
    kv_version: u64,
    created_at: u64,
}

/// The latest KV version of the main path.
struct Main {
    kv_version: u64,
    /// `None` for a tombstone left by an interrupted `destroy_key`.
    live: Option<Live>,
    /// The latest version carries no keyplan fields: written by another tool (taken over as
    /// "keyplan version = KV version" unless [`Main::foreign`] or a pending secret says
    /// otherwise).
    adopted: bool,
    /// Set when the latest version carries no keyplan fields but an older one does: another
    /// tool overwrote a key keyplan manages (see [`Foreign`]).
    foreign: Option<Foreign>,
}

/// A foreign write on top of keyplan's versions: the newest older KV version written by
/// keyplan. Adopting the foreign value as "keyplan version = KV version" could give a number
/// keyplan already used (a pending or earlier version) to different material, which the engine
/// would trust; so every operation stops instead.
#[derive(Debug, Clone, Copy)]
struct Foreign {
    /// KV version written by keyplan.
    kv_version: u64,
    /// keyplan version it holds.
    version: u64,
}

/// The current version held by the main path.
struct Live {
    version: u64,
    created_at: u64,
    history: Vec<Hist>,
    /// [`FIELD_HOLDERS`]: the plans holding the key, holder id -> since.
    holders: BTreeMap<String, u64>,
    /// The data has fields keyplan does not write (another writer's `kv patch`).
    extra_fields: bool,
    passphrase: Zeroizing<String>,
}

/// The pending path's latest version.
struct Pending {
    version: u64,
    created_at: u64,
    /// KV version of the main path when this version was staged (`None`: not recorded).
    base: Option<u64>,
    /// The keyplan version current when this version was staged (`None`: not recorded).
    base_version: Option<u64>,
    passphrase: Zeroizing<String>,
}

/// What the pending path holds.
enum PendingRead {
    Absent,
    /// Metadata without a readable latest version (deleted by someone): only in the way.
    Leftover,
    Found(Pending),
}

/// `sys/internal/ui/mounts/<mount>`: how the CLI learns a mount's engine and KV version.
/// <https://developer.hashicorp.com/vault/api-docs/system/internal-ui-mounts>
struct UiMount {
    mount: String,
}

#[derive(Deserialize)]
struct UiMountResponse {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    options: Option<HashMap<String, String>>,
}

impl rustify::endpoint::Endpoint for UiMount {
    type Response = UiMountResponse;
    const REQUEST_BODY_TYPE: rustify::enums::RequestType = rustify::enums::RequestType::JSON;
    const RESPONSE_BODY_TYPE: rustify::enums::ResponseType = rustify::enums::ResponseType::JSON;
    fn path(&self) -> String {
        format!("sys/internal/ui/mounts/{}", self.mount)
    }
    fn method(&self) -> rustify::enums::RequestMethod {
        rustify::enums::RequestMethod::GET
    }
}

/// `POST sys/capabilities-self {"paths": [...]}`: the token's capabilities on each path.
/// <https://developer.hashicorp.com/vault/api-docs/system/capabilities-self>
struct CapabilitiesSelf {
    paths: Vec<String>,
}

impl rustify::endpoint::Endpoint for CapabilitiesSelf {
    type Response = HashMap<String, Value>;
    const REQUEST_BODY_TYPE: rustify::enums::RequestType = rustify::enums::RequestType::JSON;
    const RESPONSE_BODY_TYPE: rustify::enums::ResponseType = rustify::enums::ResponseType::JSON;
    fn path(&self) -> String {
        "sys/capabilities-self".to_string()
    }
    fn method(&self) -> rustify::enums::RequestMethod {
        rustify::enums::RequestMethod::POST
    }
    fn body(&self) -> Result<Option<Vec<u8>>, rustify::errors::ClientError> {
        serde_json::to_vec(&serde_json::json!({ "paths": self.paths }))
            .map(Some)
            .map_err(|e| rustify::errors::ClientError::DataParseError { source: e.into() })
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

    /// The client with its token, logging in first if this is the first request of a login
    /// method (once per process: concurrent callers wait for the one login).
    ///
    /// Errors: [`KmsError::Config`] naming the file or variable when a login value cannot be
    /// read; [`KmsError::Denied`] when the server refuses the login (what to check);
    /// [`KmsError::Unavailable`] when it cannot be reached.
    fn client(&self) -> Result<&VaultClient, KmsError> {
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        let mut login = self.login.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = self.client.get() {
            return Ok(c);
        }
        if let Some(e) = login.refused.as_ref() {
            return Err(e.same());
        }
        let Some(mut client) = login.client.take() else {
            return Err(self.unexpected("logging in (no client left to log in with)"));
        };
        match self.log_in(&client) {
            Ok(token) => {
                use vaultrs::client::Client as _;
                client.set_token(&token);
                Ok(self.client.get_or_init(|| client))
            }
            Err(e) => {
                if matches!(e, KmsError::Denied { .. } | KmsError::Config { .. }) {
                    login.refused = Some(e.same());
                }
                login.client = Some(client);
                Err(e)
            }
        }
    }

    /// One login with [`VaultKms::auth`] on `client` (which has no token yet); the token it
    /// gets.
    fn log_in(&self, client: &VaultClient) -> Result<Zeroizing<String>, KmsError> {
        let what = self.auth.login_what();
        tracing::debug!(kms = %self.instance, "vault request: {what}");
        let left = super::deadline::remaining();
        let login = self
            .auth
            .login(client)
            .with_subscriber(tracing::subscriber::NoSubscriber::default());
        let answer = block_on(&self.describe(), async move {
            tokio::time::timeout(left, login).await
        })?
        .map_err(|_| self.timed_out(&what))?
        .map_err(|detail| KmsError::Config {
            kms: self.describe(),
            detail: format!("{what}: {detail}. Nothing was changed"),
        })?;
        match answer {
            Ok(info) => {
                let token = Zeroizing::new(info.client_token);
                tracing::info!(
                    kms = %self.instance,
                    "logged in ({}): token valid for {} s{}",
                    what.trim_start_matches("logging in "),
                    info.lease_duration,
                    if info.renewable { ", renewable" } else { "" }
                );
                Ok(token)
            }
            Err(e) => Err(self.login_refused(&what, &e)),
        }
    }

    /// The error for a failed login request `what`: 400/401/403 is [`KmsError::Denied`] with
    /// what to check for the method; the rest as [`VaultKms::classify`].
    fn login_refused(&self, what: &str, e: &ClientError) -> KmsError {
        let (code, msg) = match e {
            ClientError::APIError { code, errors } => (
                *code,
                errors
                    .iter()
                    .map(|m| squash(m))
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            ClientError::RestClientError {
                source: rustify::errors::ClientError::ServerResponseError { code, .. },
            } => (*code, String::new()),
            _ => (0, String::new()),
        };
        if matches!(code, 400 | 401 | 403) {
            let shown = if msg.is_empty() {
                String::new()
            } else {
                format!(": {msg}")
            };
            return KmsError::Denied {
                kms: self.describe(),
                detail: format!(
                    "{what}: the server refused the login (HTTP {code}{shown}); {}",
                    self.auth.refused_hint()
                ),
            };
        }
        match self.classify::<()>(what, e) {
            Err(err) => err,
            Ok(_) => self.unexpected(what),
        }
    }

    /// The error for request `what` that got no answer before the call's deadline
    /// ([`super::deadline`]).
    fn timed_out(&self, what: &str) -> KmsError {
        tracing::debug!(kms = %self.instance, "vault request timed out: {what}");
        KmsError::Timeout {
            kms: self.describe(),
            detail: format!("{what}: no answer within {}", super::deadline::limit_text()),
        }
    }

    /// `<mount>/data/<path>`, for messages.
    fn data_path(&self, path: &str) -> String {
        format!("{}/data/{path}", self.mount)
    }

    /// Runs one vaultrs request on the shared runtime (client tracing silenced) and sorts its
    /// failure: not found and check-and-set mismatches come back as [`Answer`]s, the rest as
    /// [`KmsError`]s whose detail starts with `what`.
    fn request<T>(
        &self,
        what: &str,
        fut: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<Answer<T>, KmsError> {
        tracing::debug!(kms = %self.instance, "vault request: {what}");
        let left = super::deadline::remaining();
        let fut = fut.with_subscriber(tracing::subscriber::NoSubscriber::default());
        let out = block_on(&self.describe(), async move {
            tokio::time::timeout(left, fut).await
        })?
        .map_err(|_| self.timed_out(what))?;
        match out {
            Ok(v) => Ok(Answer::Ok(v)),
            Err(e) => {
                let answer = self.classify(what, &e);
                if let Err(err) = &answer {
                    tracing::debug!(kms = %self.instance, "vault request failed: {err}");
                }
                answer
            }
        }
    }

    /// The error for HTTP status `code` (with the server's message `msg`, possibly empty) of
    /// request `what`: 401/403 [`KmsError::Denied`], 412/429/5xx [`KmsError::Unavailable`],
    /// anything else [`KmsError::Config`].
    fn http_error(&self, what: &str, code: u16, msg: &str) -> KmsError {
        let kms = self.describe();
        let shown = if msg.is_empty() {
            String::new()
        } else {
            format!(": {msg}")
        };
        match code {
            401 | 403 => KmsError::Denied {
                kms,
                detail: format!(
                    "{what}: HTTP {code}{shown} ({} is invalid or expired, or its policies do not allow this; see docs/kms/vault.md for the policy keyplan needs)",
                    self.auth.token_origin()
                ),
            },
            412 | 429 | 500..=599 => KmsError::Unavailable {
                kms,
                detail: format!("{what}: HTTP {code}{shown}"),
            },
            _ => KmsError::Config {
                kms,
                detail: format!(
                    "{what}: HTTP {code}{shown}; check that `mount` {:?} is a KV version 2 secrets engine and `address` is the server's root URL. Nothing was changed",
                    self.mount
                ),
            },
        }
    }

    /// Sorts a failed request (`what`: the operation, for messages): not found and
    /// check-and-set mismatches are [`Answer`]s, the rest [`KmsError`]s ([`VaultKms::http_error`]
    /// for HTTP status codes; transport failures are [`KmsError::Unavailable`]).
    fn classify<T>(&self, what: &str, e: &ClientError) -> Result<Answer<T>, KmsError> {
        let kms = self.describe();
        let http = |code: u16, msg: &str| -> Result<Answer<T>, KmsError> {
            Err(self.http_error(what, code, msg))
        };
        match e {
            ClientError::APIError { code, errors } => {
                let msg = errors
                    .iter()
                    .map(|m| squash(m))
                    .collect::<Vec<_>>()
                    .join("; ");
                if *code == 404 && errors.is_empty() {
                    Ok(Answer::NotFound { deleted: None })
                } else if *code == 400 && msg.contains("check-and-set parameter did not match") {
                    Ok(Answer::CasMismatch)
                } else {
                    http(*code, &msg)
                }
            }
            ClientError::RestClientError {
                source: rustify::errors::ClientError::ServerResponseError { code, content },
            } => {
                if *code == 404 {
                    // KV v2 answers 404 with the version's metadata for a deleted or destroyed
                    // version (and `data: null`); a missing secret is `{"errors":[]}` (the
                    // APIError arm above). A 404 with neither (an empty body, a web page) is
                    // not Vault's "not found": something else answers at `address` (a wrong
                    // port, a proxy or load balancer), and taking it for "no such key" would
                    // read as a KMS that lost its keys.
                    let body = content
                        .as_deref()
                        .and_then(|c| serde_json::from_str::<Value>(c).ok())
                        .filter(|v| v.get("data").is_some());
                    match body {
                        Some(v) => Ok(Answer::NotFound {
                            deleted: v.pointer("/data/metadata/version").and_then(Value::as_u64),
                        }),
                        None => Err(KmsError::Unavailable {
                            kms,
                            detail: format!(
                                "{what}: HTTP 404 without the answer Vault/OpenBao KV v2 gives for a missing secret; check that `address` points at Vault or OpenBao itself (not another server, proxy or load balancer). Nothing was changed"
                            ),
                        }),
                    }
                } else {
                    http(*code, "")
                }
            }
            ClientError::RestClientError {
                source:
                    rustify::errors::ClientError::ResponseParseError { .. }
                    | rustify::errors::ClientError::ResponseConversionError { .. },
            }
            | ClientError::JsonParseError { .. }
            | ClientError::ResponseEmptyError
            | ClientError::ResponseDataEmptyError => Err(KmsError::Unavailable {
                kms,
                // The parse error's text may quote the answer, so it is not shown.
                detail: format!(
                    "{what}: the server's answer is not what Vault/OpenBao KV v2 sends; check that `address` points at Vault or OpenBao"
                ),
            }),
            ClientError::RestClientError { .. } => Err(KmsError::Unavailable {
                kms,
                detail: format!("{what}: {}", error_chain(e)),
            }),
            _ => Err(KmsError::Config {
                kms,
                detail: format!("{what}: {}", error_chain(e)),
            }),
        }
    }

    /// Reads the latest KV version of `path` (or `version`).
    fn read_secret(&self, path: &str, version: Option<u64>) -> Result<Read, KmsError> {
        let what = match version {
            Some(v) => format!("reading KV version {v} of {}", self.data_path(path)),
            None => format!("reading {}", self.data_path(path)),
        };
        let endpoint = ReadSecretRequest::builder()
            .mount(self.mount.as_str())
            .path(path)
            .version(version)
            .build()
            .map_err(|e| KmsError::Config {
                kms: self.describe(),
                detail: format!("{what}: cannot build the request: {e}"),
            })?;
        match self.request(
            &what,
            vaultrs::api::exec_with_result(self.client()?, endpoint),
        )? {
            Answer::Ok(r) => Ok(Read::Found(r)),
            Answer::NotFound { deleted: Some(v) } => Ok(Read::Deleted(v)),
            Answer::NotFound { deleted: None } => Ok(Read::Absent),
            Answer::CasMismatch => Err(self.unexpected(&what)),
        }
    }

    /// The KV metadata of `path` (all versions' states), if the path exists.
    fn read_metadata(&self, path: &str) -> Result<Option<ReadSecretMetadataResponse>, KmsError> {
        let what = format!("reading {}/metadata/{path}", self.mount);
        match self.request(
            &what,
            vaultrs::kv2::read_metadata(self.client()?, &self.mount, path),
        )? {
            Answer::Ok(m) => Ok(Some(m)),
            Answer::NotFound { .. } => Ok(None),
            Answer::CasMismatch => Err(self.unexpected(&what)),
        }
    }

    /// Writes `data` as a new KV version of `path` with check-and-set `cas`; returns the new
    /// KV version, or `None` when the check-and-set did not match.
    fn write(
        &self,
        path: &str,
        data: &BTreeMap<&str, &str>,
        cas: u64,
    ) -> Result<Option<u64>, KmsError> {
        let what = format!("writing {} (check-and-set {cas})", self.data_path(path));
        let cas32 = u32::try_from(cas).map_err(|_| KmsError::Corrupt {
            kms: self.describe(),
            key: path.to_string(),
            detail: format!("KV version {cas} is beyond what check-and-set accepts"),
        })?;
        let opts = SetSecretRequestOptions { cas: cas32 };
        match self.request(
            &what,
            vaultrs::kv2::set_with_options(self.client()?, &self.mount, path, data, opts),
        )? {
            Answer::Ok(meta) => Ok(Some(meta.version)),
            Answer::CasMismatch => Ok(None),
            Answer::NotFound { .. } => Err(self.unexpected(&what)),
        }
    }

    /// Deletes every version and the metadata of `path` (absent is fine).
    fn delete_metadata(&self, path: &str) -> Result<(), KmsError> {
        let what = format!("deleting {}/metadata/{path}", self.mount);
        match self.request(
            &what,
            vaultrs::kv2::delete_metadata(self.client()?, &self.mount, path),
        )? {
            Answer::Ok(()) | Answer::NotFound { .. } => Ok(()),
            Answer::CasMismatch => Err(self.unexpected(&what)),
        }
    }

    /// Destroys (permanently deletes) KV version `kv_version` of `path`.
    fn destroy_version(&self, path: &str, kv_version: u64) -> Result<(), KmsError> {
        let what = format!(
            "destroying KV version {kv_version} of {}/data/{path} (POST {}/destroy/{path})",
            self.mount, self.mount
        );
        match self.request(
            &what,
            vaultrs::kv2::destroy_versions(self.client()?, &self.mount, path, vec![kv_version]),
        )? {
            Answer::Ok(()) | Answer::NotFound { .. } => Ok(()),
            Answer::CasMismatch => Err(self.unexpected(&what)),
        }
    }

    fn unexpected(&self, what: &str) -> KmsError {
        KmsError::Config {
            kms: self.describe(),
            detail: format!(
                "{what}: unexpected answer; check that `mount` {:?} is a KV version 2 secrets engine",
                self.mount
            ),
        }
    }

    /// Refuses key names that are not usable KV paths or would collide with keyplan's own
    /// pending paths and fields.
    fn check_name(&self, name: &str) -> Result<(), KmsError> {
        let why = if name.is_empty() {
            Some("it is empty")
        } else if name.starts_with('/') || name.ends_with('/') {
            Some("it starts or ends with '/'")
        } else if name
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
        {
            Some("it has an empty, '.' or '..' path component")
        } else if name.chars().any(char::is_control) {
            Some("it contains control characters")
        } else if name.ends_with(PENDING_SUFFIX) {
            Some("it ends with .keyplan-pending, the suffix keyplan uses for staged versions")
        } else if basename(name).starts_with("keyplan_") {
            Some("its last component starts with keyplan_, the prefix of keyplan's metadata fields")
        } else {
            None
        };
        match why {
            None => Ok(()),
            Some(why) => Err(KmsError::Config {
                kms: self.describe(),
                detail: format!(
                    "key name {name:?} cannot be used as a KV v2 path: {why}; set another `name` for the key in the plan. Nothing was changed"
                ),
            }),
        }
    }

    /// The main path's latest version; `None` if the path does not exist.
    fn read_main(&self, name: &str) -> Result<Option<Main>, KmsError> {
        let resp = match self.read_secret(name, None)? {
            Read::Absent => return Ok(None),
            Read::Deleted(v) => {
                return Err(KmsError::corrupt(
                    self,
                    name,
                    format!(
                        "the latest KV version ({v}) of {} is deleted or destroyed, so keyplan cannot tell which passphrase opens the devices; nothing was changed. If it was deleted by mistake, restore it with `bao kv undelete -mount={} -versions={v} {name}` (vault kv undelete works the same); if it was destroyed, write the passphrase that opens the devices back as a new version",
                        self.data_path(name),
                        self.mount
                    ),
                ))
            }
            Read::Found(r) => r,
        };
        let kv_version = resp.metadata.version;
        let Value::Object(data) = resp.data else {
            return Err(KmsError::corrupt(
                self,
                name,
                format!(
                    "KV version {kv_version} of {} has no data",
                    self.data_path(name)
                ),
            ));
        };
        if data.contains_key(FIELD_DESTROYED_AT) {
            return Ok(Some(Main {
                kv_version,
                live: None,
                adopted: false,
                foreign: None,
            }));
        }
        let adopted = !data.contains_key(FIELD_VERSION);
        let live = self.parse_live(name, kv_version, &resp.metadata.created_time, data)?;
        let foreign = if !adopted || kv_version <= 1 {
            None
        } else {
            self.keyplan_version_below(name, kv_version)?
        };
        Ok(Some(Main {
            kv_version,
            live: Some(live),
            adopted,
            foreign,
        }))
    }

    /// The current version held by `data`, the data of KV version `kv_version` of the main path
    /// (created at `created_time`, RFC 3339): the passphrase field, keyplan's fields, or, for a
    /// secret without them, the KV version and its creation time.
    fn parse_live(
        &self,
        name: &str,
        kv_version: u64,
        created_time: &str,
        mut data: serde_json::Map<String, Value>,
    ) -> Result<Live, KmsError> {
        let field = basename(name);
        let Some(passphrase) = take_string(&mut data, field) else {
            return Err(KmsError::corrupt(
                self,
                name,
                format!(
                    "KV version {kv_version} of {} has no string field {field:?}; keyplan (like Rook) keeps the passphrase in the field named after the key's last path component. Nothing was changed; restore the secret (`bao kv rollback`) or fix the key's `name`",
                    self.data_path(name)
                ),
            ));
        };
        let bad = |detail: String| {
            KmsError::corrupt(
                self,
                name,
                format!(
                    "KV version {kv_version} of {}: {detail}; nothing was changed. Restore a good version with `bao kv rollback` (see docs/kms/vault.md)",
                    self.data_path(name)
                ),
            )
        };
        let version = number(&data, FIELD_VERSION)
            .map_err(&bad)?
            .unwrap_or(kv_version);
        if version == 0 {
            return Err(bad(format!("{FIELD_VERSION} is 0")));
        }
        let created_at = match number(&data, FIELD_CREATED_AT).map_err(&bad)? {
            Some(t) => t,
            None => parse_time(created_time).ok_or_else(|| {
                bad(format!(
                    "its created_time {created_time:?} is not an RFC 3339 time"
                ))
            })?,
        };
        let history = match data.get(FIELD_HISTORY) {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => parse_history(v).map_err(|e| bad(format!("{FIELD_HISTORY}: {e}")))?,
        };
        let holders = match data.get(FIELD_HOLDERS) {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
                bad(format!(
                    "{FIELD_HOLDERS} is not a JSON object of holder -> Unix seconds: {e}"
                ))
            })?,
            Some(_) => return Err(bad(format!("{FIELD_HOLDERS} is not a string"))),
        };
        let extra_fields = data.keys().any(|k| {
            ![
                FIELD_VERSION,
                FIELD_CREATED_AT,
                FIELD_HISTORY,
                FIELD_HOLDERS,
            ]
            .contains(&k.as_str())
        });
        Ok(Live {
            version,
            created_at,
            history,
            holders,
            extra_fields,
            passphrase,
        })
    }

    /// The newest KV version of `name` older than `kv_version` that keyplan wrote (it has a
    /// `keyplan_version` or is a tombstone), looking at most at the [`FOREIGN_SCAN`] newest
    /// readable ones. Only called for a latest version without keyplan fields, so a secret
    /// adopted from another tool costs these reads only until keyplan's first commit.
    fn keyplan_version_below(
        &self,
        name: &str,
        kv_version: u64,
    ) -> Result<Option<Foreign>, KmsError> {
        let Some(meta) = self.read_metadata(name)? else {
            return Ok(None);
        };
        let now = crate::clock::now_unix();
        let readable = (1..kv_version)
            .rev()
            .filter(|v| material_kept(Some(&meta), *v, now))
            .take(FOREIGN_SCAN);
        for v in readable {
            let Read::Found(resp) = self.read_secret(name, Some(v))? else {
                continue;
            };
            let Value::Object(mut data) = resp.data else {
                continue;
            };
            // Drop the old passphrase through zeroizing storage.
            drop(take_string(&mut data, basename(name)));
            if data.contains_key(FIELD_DESTROYED_AT) {
                return Ok(Some(Foreign {
                    kv_version: v,
                    version: 0,
                }));
            }
            if let Ok(Some(kp)) = number(&data, FIELD_VERSION) {
                return Ok(Some(Foreign {
                    kv_version: v,
                    version: kp,
                }));
            }
        }
        Ok(None)
    }

    /// The error for an operation on a key another tool overwrote (see [`Foreign`]):
    /// [`KmsError::Conflict`] for writes (`conflict`), [`KmsError::Corrupt`] for reads.
    fn foreign_error(&self, name: &str, kv_version: u64, f: Foreign, conflict: bool) -> KmsError {
        let detail = format!(
            "KV version {kv_version} of {} was written by another tool on top of keyplan's v{} (KV version {}); keyplan stops rather than guess which passphrase the devices hold. The devices still open with v{}; to undo the foreign write run `bao kv rollback -mount={} -version={} {name}` (vault kv rollback works the same)",
            self.data_path(name),
            f.version,
            f.kv_version,
            f.version,
            self.mount,
            f.kv_version
        );
        if conflict {
            KmsError::conflict(self, name, detail)
        } else {
            KmsError::corrupt(self, name, format!("{detail}; nothing was changed"))
        }
    }

    /// The main and the pending path, refusing a foreign write on a key keyplan manages
    /// (`conflict`: as a [`KmsError::Conflict`], for callers about to write; else
    /// [`KmsError::Corrupt`]): a latest version without keyplan fields on top of a keyplan
    /// version, or written after keyplan staged its pending version on another KV version
    /// (taking it over could give it the pending version's number).
    fn read_state(
        &self,
        name: &str,
        conflict: bool,
    ) -> Result<(Option<Main>, PendingRead), KmsError> {
        let main = self.read_main(name)?;
        let pending = self.read_pending(name)?;
        if let Some(m) = &main {
            if let Some(f) = m.foreign {
                return Err(self.foreign_error(name, m.kv_version, f, conflict));
            }
            let staged_elsewhere = match &pending {
                PendingRead::Found(p) => p.base != Some(m.kv_version),
                PendingRead::Absent | PendingRead::Leftover => false,
            };
            if m.adopted && staged_elsewhere {
                let pending_name = pending_path(name);
                let mut detail = format!(
                    "KV version {} of {} has no keyplan fields, yet keyplan's pending secret {} exists: another tool wrote the key during a rotation, and keyplan stops rather than guess which passphrase the devices hold. ",
                    m.kv_version,
                    self.data_path(name),
                    self.data_path(&pending_name)
                );
                if m.kv_version > 1 {
                    detail.push_str(&format!(
                        "To undo the foreign write run `bao kv rollback -mount={} -version={} {name}`; to keep it instead, ",
                        self.mount,
                        m.kv_version - 1
                    ));
                } else {
                    detail.push_str("To keep the other tool's value, ");
                }
                detail.push_str(&format!(
                    "delete keyplan's pending version with `bao kv metadata delete -mount={} {pending_name}` (the devices still open with their previous passphrase)",
                    self.mount
                ));
                return Err(if conflict {
                    KmsError::conflict(self, name, detail)
                } else {
                    KmsError::corrupt(self, name, format!("{detail}; nothing was changed"))
                });
            }
        }
        Ok((main, pending))
    }

    /// The pending path of `name`.
    fn read_pending(&self, name: &str) -> Result<PendingRead, KmsError> {
        let path = pending_path(name);
        let resp = match self.read_secret(&path, None)? {
            Read::Absent => return Ok(PendingRead::Absent),
            Read::Deleted(_) => return Ok(PendingRead::Leftover),
            Read::Found(r) => r,
        };
        let kv_version = resp.metadata.version;
        let bad = |detail: &str| {
            KmsError::corrupt(
                self,
                name,
                format!(
                    "KV version {kv_version} of {} {detail}; keyplan wrote nothing. Delete it with `bao kv metadata delete -mount={} {path}` if no rotation is under way (the devices do not depend on an uncommitted version)",
                    self.data_path(&path),
                    self.mount
                ),
            )
        };
        let mut data = match resp.data {
            Value::Object(m) => m,
            _ => return Err(bad("has no data")),
        };
        let passphrase = take_string(&mut data, FIELD_PASSPHRASE)
            .ok_or_else(|| bad("has no string field \"passphrase\""))?;
        let version = number(&data, FIELD_VERSION)
            .map_err(|e| bad(&e))?
            .filter(|v| *v > 0)
            .ok_or_else(|| bad("has no keyplan_version"))?;
        let created_at = match number(&data, FIELD_CREATED_AT).map_err(|e| bad(&e))? {
            Some(t) => t,
            None => parse_time(&resp.metadata.created_time).unwrap_or_else(crate::clock::now_unix),
        };
        let base = number(&data, FIELD_BASE).map_err(|e| bad(&e))?;
        let base_version = number(&data, FIELD_BASE_VERSION).map_err(|e| bad(&e))?;
        Ok(PendingRead::Found(Pending {
            version,
            created_at,
            base,
            base_version,
            passphrase,
        }))
    }

    /// Reads the main and the pending path (retrying while the server is unavailable).
    /// [`VaultKms::read_state`] for callers about to write (a foreign write is a
    /// [`KmsError::Conflict`]), retrying while the server is unavailable.
    fn read_both(&self, name: &str) -> Result<(Option<Main>, PendingRead), KmsError> {
        with_retries(&format!("read vault key {name}"), || {
            self.read_state(name, true)
        })
    }

    fn read_once(&self, name: &str) -> Result<KeyState, KmsError> {
        let (main, pending) = self.read_state(name, false)?;
        let mut st = KeyState::default();
        let live = main.as_ref().and_then(|m| m.live.as_ref());
        if let Some(live) = live {
            st.current = Some(live.version);
            st.holders = live.holders.clone();
            st.versions.insert(
                live.version,
                VersionInfo {
                    version: live.version,
                    created_at: live.created_at,
                    state: VersionState::Current,
                },
            );
            if !live.history.is_empty() {
                let meta = self.read_metadata(name)?;
                let now = crate::clock::now_unix();
                for h in &live.history {
                    let state = if material_kept(meta.as_ref(), h.kv_version, now) {
                        VersionState::Previous
                    } else {
                        VersionState::Retired
                    };
                    st.versions.entry(h.version).or_insert(VersionInfo {
                        version: h.version,
                        created_at: h.created_at,
                        state,
                    });
                }
            }
        }
        if let Some(p) = live_pending(live, &pending) {
            st.pending = Some(p.version);
            st.versions.insert(
                p.version,
                VersionInfo {
                    version: p.version,
                    created_at: p.created_at,
                    state: VersionState::Pending,
                },
            );
        }
        Ok(st)
    }

    fn get_once(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        let (main, pending) = self.read_state(name, false)?;
        if let Some(m) = &main {
            if let Some(live) = &m.live {
                if live.version == version {
                    return Ok(into_passphrase(&live.passphrase));
                }
                if let Some(h) = live.history.iter().find(|h| h.version == version) {
                    return self.get_old(name, *h);
                }
            }
        }
        let live = main.as_ref().and_then(|m| m.live.as_ref());
        match live_pending(live, &pending) {
            Some(p) if p.version == version => Ok(into_passphrase(&p.passphrase)),
            _ => Err(KmsError::NoSuchVersion {
                kms: self.describe(),
                key: name.to_string(),
                version,
            }),
        }
    }

    /// The material of an earlier version, from its KV version.
    fn get_old(&self, name: &str, h: Hist) -> Result<Passphrase, KmsError> {
        let gone = || KmsError::NoSuchVersion {
            kms: self.describe(),
            key: name.to_string(),
            version: h.version,
        };
        let resp = match self.read_secret(name, Some(h.kv_version))? {
            Read::Found(r) => r,
            Read::Absent | Read::Deleted(_) => return Err(gone()),
        };
        let mut data = match resp.data {
            Value::Object(m) => m,
            _ => return Err(gone()),
        };
        let recorded = number(&data, FIELD_VERSION).ok().flatten();
        if recorded.is_some_and(|v| v != h.version) {
            return Err(KmsError::corrupt(
                self,
                name,
                format!(
                    "{FIELD_HISTORY} maps version {} to KV version {}, but that KV version holds keyplan version {}; nothing was changed",
                    h.version,
                    h.kv_version,
                    recorded.unwrap_or(0)
                ),
            ));
        }
        let field = basename(name);
        match take_string(&mut data, field) {
            Some(p) => Ok(into_passphrase(&p)),
            None => Err(KmsError::corrupt(
                self,
                name,
                format!(
                    "KV version {} of {} has no string field {field:?}",
                    h.kv_version,
                    self.data_path(name)
                ),
            )),
        }
    }

    /// One attempt of [`Kms::check`]: token, mount, capabilities, key settings.
    fn check_once(&self, names: &[String]) -> Result<(), KmsError> {
        self.check_token()?;
        self.check_mount()?;
        let mut wanted: Vec<(String, &'static [&'static str])> = Vec::new();
        for name in names {
            self.check_name(name)?;
            wanted.extend(self.required_capabilities(name));
        }
        if !wanted.is_empty() {
            self.check_capabilities(&wanted)?;
        }
        for name in names {
            self.check_delete_after(name)?;
        }
        Ok(())
    }

    /// `auth/token/lookup-self` for the client's token, with the token itself (the `id`
    /// field) wiped from the answer.
    /// <https://developer.hashicorp.com/vault/api-docs/auth/token#lookup-a-token-self>
    fn lookup_self(&self) -> Result<vaultrs::api::token::responses::LookupTokenResponse, KmsError> {
        use zeroize::Zeroize as _;
        let what = "looking up the token (GET auth/token/lookup-self)";
        match self.request(what, vaultrs::token::lookup_self(self.client()?))? {
            Answer::Ok(mut info) => {
                info.id.zeroize();
                Ok(info)
            }
            _ => Err(self.unexpected(what)),
        }
    }

    /// Reachability and a valid token.
    /// <https://developer.hashicorp.com/vault/api-docs/auth/token#lookup-a-token-self>
    fn check_token(&self) -> Result<(), KmsError> {
        self.lookup_self().map(drop)
    }

    /// The mount is a KV version 2 engine.
    fn check_mount(&self) -> Result<(), KmsError> {
        let what = format!(
            "reading the engine of mount {:?} (GET sys/internal/ui/mounts/{})",
            self.mount, self.mount
        );
        let endpoint = UiMount {
            mount: self.mount.clone(),
        };
        let answer = self
            .request(
                &what,
                vaultrs::api::exec_with_result(self.client()?, endpoint),
            )
            .map_err(|e| match e {
                // Vault answers 403 ("preflight capability check") both for a mount that does
                // not exist and for one the token may use nothing under, even to root.
                KmsError::Denied { kms, .. } => KmsError::Denied {
                    kms,
                    detail: format!(
                        "{what}: HTTP 403: mount {:?} does not exist, or {} may use nothing under it; set `mount` to a KV version 2 mount, or grant the policy in docs/kms/vault.md",
                        self.mount, self.auth.token_origin()
                    ),
                },
                other => other,
            })?;
        let Answer::Ok(m) = answer else {
            return Err(KmsError::Config {
                kms: self.describe(),
                detail: format!(
                    "{what}: no such mount; set `mount` to a KV version 2 mount. Nothing was changed"
                ),
            });
        };
        let version = m
            .options
            .as_ref()
            .and_then(|o| o.get("version"))
            .map(String::as_str)
            .unwrap_or("1");
        if m.kind == "kv" && version == "2" {
            return Ok(());
        }
        Err(KmsError::Config {
            kms: self.describe(),
            detail: format!(
                "mount {:?} is a {:?} engine (version {version}), not KV version 2; enable one with `bao secrets enable -path={} kv-v2` or set `mount` to a KV v2 mount. Nothing was changed",
                self.mount, m.kind, self.mount
            ),
        })
    }

    /// The capabilities every operation needs, on every path it touches (`wanted`: path and
    /// capabilities), per `sys/capabilities-self`.
    fn check_capabilities(
        &self,
        wanted: &[(String, &'static [&'static str])],
    ) -> Result<(), KmsError> {
        let what = "checking the token's capabilities (POST sys/capabilities-self)";
        let endpoint = CapabilitiesSelf {
            paths: wanted.iter().map(|(p, _)| p.clone()).collect(),
        };
        let caps = match self.request(
            what,
            vaultrs::api::exec_with_result(self.client()?, endpoint),
        )? {
            Answer::Ok(c) => c,
            _ => return Err(self.unexpected(what)),
        };
        let mut missing = Vec::new();
        for (path, need) in wanted {
            let have: Vec<&str> = caps
                .get(path)
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if have.contains(&"root") {
                continue;
            }
            let lacking: Vec<String> = need
                .iter()
                .filter(|c| !have.contains(*c) || have.contains(&"deny"))
                .map(|c| format!("{c:?}"))
                .collect();
            if !lacking.is_empty() {
                missing.push(format!("{} on {path}", lacking.join(", ")));
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(KmsError::Denied {
            kms: self.describe(),
            detail: format!(
                "{} lacks capabilities keyplan needs (per sys/capabilities-self): {}; see docs/kms/vault.md for the policy",
                self.auth.token_origin(),
                missing.join("; ")
            ),
        })
    }

    /// Key settings that would delete the current passphrase behind keyplan's back.
    fn check_delete_after(&self, name: &str) -> Result<(), KmsError> {
        let Some(meta) = self.read_metadata(name)? else {
            return Ok(());
        };
        let after = meta.delete_version_after.trim();
        if after.is_empty() || after == "0s" || after == "0" {
            return Ok(());
        }
        Err(KmsError::Config {
            kms: self.describe(),
            detail: format!(
                "{}/metadata/{name} has delete_version_after={after}, which would soft-delete the current passphrase; set it to 0s (`bao kv metadata put -mount={} -delete-version-after=0s {name}`). Nothing was changed",
                self.mount, self.mount
            ),
        })
    }

    /// The capabilities keyplan's operations need on each path of key `name` (the minimal
    /// policy; docs/kms/vault.md shows it as HCL).
    fn required_capabilities(&self, name: &str) -> Vec<(String, &'static [&'static str])> {
        let m = &self.mount;
        let p = pending_path(name);
        vec![
            (format!("{m}/data/{name}"), &["create", "read", "update"]),
            (format!("{m}/metadata/{name}"), &["read", "delete"]),
            (format!("{m}/destroy/{name}"), &["update"]),
            (format!("{m}/data/{p}"), &["create", "read"]),
            (format!("{m}/metadata/{p}"), &["delete"]),
        ]
    }
}

impl Kms for VaultKms {
    /// `vault KMS "<instance>" (<address>, mount <mount>)`.
    fn describe(&self) -> String {
        format!(
            "vault KMS {:?} ({}, mount {})",
            self.instance, self.address, self.mount
        )
    }

    /// Reads `<mount>/data/<name>` (current version and history), its pending sibling, and,
    /// when there is history, `<mount>/metadata/<name>` (which earlier KV versions still hold
    /// material: destroyed, soft-deleted and pruned ones read as `Retired`).
    fn read(&self, name: &str) -> Result<KeyState, KmsError> {
        self.check_name(name)?;
        with_retries(&format!("read vault key {name}"), || self.read_once(name))
    }

    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        self.check_name(name)?;
        with_retries(&format!("get vault key {name} v{version}"), || {
            self.get_once(name, version)
        })
    }

    /// Creates `<mount>/data/<name>.keyplan-pending` with check-and-set 0 (create-only), after
    /// deleting a stale leftover. Never retried after the write was sent.
    fn stage(&self, name: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        self.check_name(name)?;
        let Ok(text) = std::str::from_utf8(material.expose()) else {
            return Err(KmsError::Config {
                kms: self.describe(),
                detail: format!(
                    "key {name:?}: this passphrase is not valid UTF-8 text, and Vault KV stores strings; nothing was written. keyplan's generated passphrases are base64 text, so keep keys with binary passphrases in another KMS"
                ),
            });
        };
        let (main, pending) = self.read_both(name)?;
        let pending_name = pending_path(name);
        let version = book_of(main.as_ref(), &pending)
            .stage(at_least)
            .map_err(|r| r.conflict_at(self, name, &self.data_path(&pending_name)))?;
        if !matches!(pending, PendingRead::Absent) {
            // A leftover of a commit whose clean-up was cut short (the book counted its
            // version): in the way of the create-only write below.
            self.delete_metadata(&pending_name)?;
        }
        let version_text = version.to_string();
        let created_text = crate::clock::now_unix().to_string();
        let base_text = main.as_ref().map_or(0, |m| m.kv_version).to_string();
        let base_version_text = main
            .as_ref()
            .and_then(|m| m.live.as_ref())
            .map_or(0, |l| l.version)
            .to_string();
        let data = BTreeMap::from([
            (FIELD_PASSPHRASE, text),
            (FIELD_VERSION, version_text.as_str()),
            (FIELD_CREATED_AT, created_text.as_str()),
            (FIELD_BASE, base_text.as_str()),
            (FIELD_BASE_VERSION, base_version_text.as_str()),
        ]);
        match self.write(&pending_name, &data, 0)? {
            Some(_) => Ok(version),
            None => Err(KmsError::conflict(
                self,
                name,
                format!(
                    "another writer created {} at the same moment (check-and-set 0 failed)",
                    self.data_path(&pending_name)
                ),
            )),
        }
    }

    /// Writes the pending material as a new KV version of `<mount>/data/<name>` with
    /// check-and-set = the KV version read just before, reads it back, then deletes the pending
    /// path (a failure there is only logged: the leftover is stale and ignored).
    fn commit_as(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        self.check_name(name)?;
        let (main, staged) = self.read_both(name)?;
        let pending_name = pending_path(name);
        let decision = book_of(main.as_ref(), &staged).commit(expected_current, pending);
        if decision.map_err(|r| r.conflict(self, name))? == Commit::AlreadyCurrent {
            // Committed before (the reply was lost): only the cleanup may be missing.
            let stale = match &staged {
                PendingRead::Found(p) => p.version <= pending,
                PendingRead::Leftover => true,
                PendingRead::Absent => false,
            };
            if stale {
                self.delete_pending_quietly(&pending_name);
            }
            return Ok(());
        }
        let live = main.as_ref().and_then(|m| m.live.as_ref());
        // The holders are read with the KV version the write below checks-and-sets: a holder
        // recorded after this read makes that write fail.
        if let Some(l) = live {
            super::book::check_holders(self, name, &l.holders, holder, pending)?;
        }
        let Some(p) = live_pending(live, &staged).filter(|p| p.version == pending) else {
            // The book found `pending` pending, so this is not reached.
            return Err(KmsError::conflict(
                self,
                name,
                format!("v{pending} is no longer pending"),
            ));
        };
        let cas = main.as_ref().map_or(0, |m| m.kv_version);
        // Holder records write the main path again with the same current version and only
        // keyplan's fields: that is not another writer's version (a `kv put` without keyplan's
        // fields, or a `kv patch` adding one, is).
        let same_current = p
            .base_version
            .is_some_and(|bv| live.map_or(0, |l| l.version) == bv)
            && live.is_some_and(|l| !l.extra_fields)
            && main.as_ref().is_some_and(|m| !m.adopted);
        // ... and the same material as the KV version the pending version was staged on, when
        // that one is still readable (a holder record destroys the version it copied).
        let same_current = same_current
            && match p.base.filter(|b| *b != cas && *b > 0) {
                Some(base) => self.same_material(name, base, live)?,
                None => true,
            };
        if let Some(base) = p.base.filter(|b| *b != cas && !same_current) {
            return Err(KmsError::conflict(
                self,
                name,
                format!(
                    "v{pending} was staged on KV version {base} of {}, which is now at KV version {cas}: another writer changed it meanwhile; v{pending} stays pending",
                    self.data_path(name)
                ),
            ));
        }
        self.write_committed(name, main.as_ref(), p)?;
        self.delete_pending_quietly(&pending_name);
        Ok(())
    }

    /// Writes the current version again as a new KV version of `<mount>/data/<name>` with the
    /// holder added to [`FIELD_HOLDERS`] (check-and-set on the KV version read), then destroys
    /// the KV version it copied, so no second copy of the material outlives a retirement.
    fn hold(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        self.check_name(name)?;
        self.write_holders(name, holder, true)
    }

    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        self.check_name(name)?;
        self.write_holders(name, holder, false)
    }

    /// Destroys (`POST <mount>/destroy/<name>`) the KV version holding `version`, found in
    /// `keyplan_history`. The current and the pending version are refused; an unknown version
    /// is a no-op.
    fn retire(&self, name: &str, version: u64) -> Result<(), KmsError> {
        self.check_name(name)?;
        with_retries(&format!("retire vault key {name} v{version}"), || {
            let (main, pending) = self.read_state(name, true)?;
            book_of(main.as_ref(), &pending)
                .retire(version)
                .map_err(|r| r.conflict(self, name))?;
            let Some((m, live)) = main.as_ref().and_then(|m| Some((m, m.live.as_ref()?))) else {
                return Ok(());
            };
            let Some(h) = live.history.iter().find(|h| h.version == version) else {
                return Ok(());
            };
            if h.kv_version >= m.kv_version {
                return Err(KmsError::corrupt(
                    self,
                    name,
                    format!(
                        "{FIELD_HISTORY} maps v{version} to KV version {}, which is not older than the current KV version {}; nothing was destroyed",
                        h.kv_version, m.kv_version
                    ),
                ));
            }
            self.destroy_version(name, h.kv_version)
        })
    }

    /// Token lookup (reachability, valid token), the mount's engine (`kv` version 2), then
    /// `sys/capabilities-self` on the data, metadata and destroy paths of each key and its
    /// pending sibling; also refuses keys whose `delete_version_after` would delete the current
    /// passphrase. Writes nothing.
    fn check(&self, names: &[String]) -> Result<(), KmsError> {
        with_retries("check vault KMS", || self.check_once(names))
    }

    /// Check-and-set on the current version: writes a tombstone version with check-and-set,
    /// then deletes all versions and metadata of `<name>` and of its pending sibling.
    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError> {
        self.check_name(name)?;
        let pending_name = pending_path(name);
        with_retries(&format!("destroy vault key {name}"), || {
            let (main, pending) = self.read_state(name, true)?;
            let decision = book_of(main.as_ref(), &pending).destroy(expected_current);
            if decision.map_err(|r| r.conflict(self, name))? == Destroy::NothingLeft {
                // Absent, or a tombstone left by an interrupted destroy: finish it.
                if main.is_some() {
                    self.delete_metadata(name)?;
                }
                if !matches!(pending, PendingRead::Absent) {
                    self.delete_metadata(&pending_name)?;
                }
                return Ok(());
            }
            let kv_version = main.as_ref().map_or(0, |m| m.kv_version);
            let at = crate::clock::now_unix().to_string();
            let tombstone = BTreeMap::from([(FIELD_DESTROYED_AT, at.as_str())]);
            if self.write(name, &tombstone, kv_version)?.is_none() {
                return Err(KmsError::conflict(
                    self,
                    name,
                    format!(
                        "{} changed after keyplan read it at KV version {kv_version} (check-and-set failed); nothing was deleted",
                        self.data_path(name),
                    ),
                ));
            }
            self.delete_metadata(name)?;
            self.delete_metadata(&pending_name)
        })
    }

    /// The token, from `auth/token/lookup-self`: its expiry (`expire_time`, or now + `ttl`;
    /// none for a token without TTL, such as root), who renews it (keyplan at each apply for
    /// a renewable static token, a fresh login at each run for the login methods) and, for a
    /// static token, the end of renewals (`issue_time` + `explicit_max_ttl` when one is set).
    /// Login methods add what the login rests on: the service account token's `exp`, the
    /// client certificate's notAfter.
    ///
    /// Errors: those of the request ([`KmsError::Denied`] for an expired or revoked token),
    /// of the login, [`KmsError::Config`] naming an unreadable token or certificate file.
    fn credentials(&self) -> Result<Vec<Credential>, KmsError> {
        let info = self.lookup_self()?;
        let now = crate::clock::now_unix();
        let expires_at = (info.ttl > 0).then(|| {
            info.expire_time
                .as_deref()
                .and_then(parse_time)
                .unwrap_or(now + info.ttl)
        });
        let renewable = info.renewable.unwrap_or(false);
        let renewable_until = (renewable && info.explicit_max_ttl > 0)
            .then(|| {
                info.issue_time
                    .as_deref()
                    .and_then(parse_time)
                    .unwrap_or(info.creation_time)
                    + info.explicit_max_ttl
            })
            .filter(|_| !self.auth.is_login());
        let mut out = vec![Credential {
            kind: "vault_token",
            what: self.auth.token_origin().replacen("the ", "", 1),
            expires_at,
            renewed_by: self.auth.renewed_by(renewable),
            renewable_until,
        }];
        out.extend(
            self.auth
                .login_credentials()
                .map_err(|detail| KmsError::Config {
                    kms: self.describe(),
                    detail,
                })?,
        );
        Ok(out)
    }

    /// Renews a static token (`auth/token/renew-self`, by its creation TTL) when it is
    /// renewable, has a TTL and less than half of its creation TTL is left. Login methods get
    /// a fresh token at each run, so they renew nothing.
    ///
    /// Errors: those of the requests.
    fn renew_credentials(&self) -> Result<(), KmsError> {
        if self.auth.is_login() {
            return Ok(());
        }
        let info = self.lookup_self()?;
        let due = info.renewable.unwrap_or(false)
            && info.ttl > 0
            && info.creation_ttl > 0
            && info.ttl < info.creation_ttl / 2;
        if !due {
            return Ok(());
        }
        let what = "renewing the token (POST auth/token/renew-self)";
        let increment = format!("{}s", info.creation_ttl);
        match self.request(
            what,
            vaultrs::token::renew_self(self.client()?, Some(&increment)),
        )? {
            Answer::Ok(renewed) => {
                drop(Zeroizing::new(renewed.client_token));
                tracing::info!(
                    kms = %self.instance,
                    "renewed {}: {} s were left, now {} s",
                    self.auth.token_origin(),
                    info.ttl,
                    renewed.lease_duration
                );
                Ok(())
            }
            _ => Err(self.unexpected(what)),
        }
    }
}

impl VaultKms {
    /// The write of a commit: the pending version `p` becomes a new KV version of the main path
    /// (check-and-set on `main`'s KV version, the current version moving into the history),
    /// then is read back and compared.
    ///
    /// Errors: [`KmsError::Conflict`] when the check-and-set fails or the read-back shows
    /// another writer's version; the errors of the requests.
    fn write_committed(
        &self,
        name: &str,
        main: Option<&Main>,
        p: &Pending,
    ) -> Result<(), KmsError> {
        let cas = main.map_or(0, |m| m.kv_version);
        let live = main.and_then(|m| m.live.as_ref());
        let mut history: Vec<Hist> = live.map(|l| l.history.clone()).unwrap_or_default();
        if let (Some(m), Some(l)) = (main, live) {
            history.push(Hist {
                version: l.version,
                kv_version: m.kv_version,
                created_at: l.created_at,
            });
        }
        let history_text = history_json(&history);
        let version_text = p.version.to_string();
        let created_text = p.created_at.to_string();
        let holders_text = live.map(|l| holders_json(&l.holders)).unwrap_or_default();
        let mut data = BTreeMap::from([
            (basename(name), p.passphrase.as_str()),
            (FIELD_VERSION, version_text.as_str()),
            (FIELD_CREATED_AT, created_text.as_str()),
            (FIELD_HISTORY, history_text.as_str()),
        ]);
        if !holders_text.is_empty() {
            data.insert(FIELD_HOLDERS, holders_text.as_str());
        }
        let pending = p.version;
        let Some(written) = self.write(name, &data, cas)? else {
            return Err(KmsError::conflict(
                self,
                name,
                format!(
                    "{} changed after keyplan read it at KV version {cas} (check-and-set failed): another writer was first; v{pending} stays pending",
                    self.data_path(name)
                ),
            ));
        };
        // Read back and compare.
        let back = self.read_main(name)?;
        let ok = back.as_ref().is_some_and(|b| {
            b.kv_version == written
                && b.live.as_ref().is_some_and(|l| {
                    l.version == pending && l.passphrase.as_bytes() == p.passphrase.as_bytes()
                })
        });
        if !ok {
            return Err(KmsError::conflict(
                self,
                name,
                format!(
                    "keyplan wrote v{pending} as KV version {written} of {}, but reading it back shows KV version {} (another writer changed it right after)",
                    self.data_path(name),
                    back.as_ref().map_or_else(|| "none".to_string(), |b| b.kv_version.to_string())
                ),
            ));
        }
        Ok(())
    }

    /// Whether KV version `kv` of `name` holds the same keyplan version and passphrase as
    /// `live`, or is no longer readable (destroyed or deleted).
    fn same_material(&self, name: &str, kv: u64, live: Option<&Live>) -> Result<bool, KmsError> {
        let Some(live) = live else {
            return Ok(false);
        };
        let resp = match self.read_secret(name, Some(kv))? {
            Read::Found(r) => r,
            Read::Absent | Read::Deleted(_) => return Ok(true),
        };
        let Value::Object(data) = resp.data else {
            return Ok(false);
        };
        let then = self.parse_live(name, kv, &resp.metadata.created_time, data)?;
        Ok(
            then.version == live.version
                && then.passphrase.as_bytes() == live.passphrase.as_bytes(),
        )
    }

    /// [`Kms::hold`] (`add`) and [`Kms::release`]: the current version written again with the
    /// holder added or removed, check-and-set on the KV version read; the copied KV version is
    /// destroyed afterwards (a failure there is logged: the copy holds the current material,
    /// which is not retired).
    fn write_holders(&self, name: &str, holder: &str, add: bool) -> Result<(), KmsError> {
        let main = self.read_main(name)?;
        let Some((m, live)) = main.as_ref().and_then(|m| Some((m, m.live.as_ref()?))) else {
            if !add {
                return Ok(());
            }
            return Err(KmsError::conflict(
                self,
                name,
                format!("{holder} cannot be recorded as a holder: the key has no current version"),
            ));
        };
        if live.holders.contains_key(holder) == add {
            return Ok(());
        }
        let mut holders = live.holders.clone();
        if add {
            holders.insert(holder.to_string(), crate::clock::now_unix());
        } else {
            holders.remove(holder);
        }
        let history_text = history_json(&live.history);
        let version_text = live.version.to_string();
        let created_text = live.created_at.to_string();
        let holders_text = holders_json(&holders);
        let mut data = BTreeMap::from([
            (basename(name), live.passphrase.as_str()),
            (FIELD_VERSION, version_text.as_str()),
            (FIELD_CREATED_AT, created_text.as_str()),
            (FIELD_HISTORY, history_text.as_str()),
        ]);
        if !holders_text.is_empty() {
            data.insert(FIELD_HOLDERS, holders_text.as_str());
        }
        if self.write(name, &data, m.kv_version)?.is_none() {
            return Err(KmsError::conflict(
                self,
                name,
                format!(
                    "{} changed after keyplan read it at KV version {} (check-and-set failed) while {} holder {holder}; run keyplan again",
                    self.data_path(name),
                    m.kv_version,
                    if add { "recording" } else { "removing" }
                ),
            ));
        }
        if let Err(e) = self.destroy_version(name, m.kv_version) {
            tracing::warn!(kms = %self.instance, "could not destroy KV version {} of {} (a copy of the current version; destroy it with `bao kv destroy -versions={} {name}`): {e}", m.kv_version, self.data_path(name), m.kv_version);
        }
        Ok(())
    }

    fn delete_pending_quietly(&self, pending_name: &str) {
        if let Err(e) = self.delete_metadata(pending_name) {
            tracing::warn!(
                kms = %self.instance,
                "could not delete the committed pending secret {}/metadata/{pending_name} (harmless: it is ignored and replaced at the next rotation): {e}",
                self.mount
            );
        }
    }
}

/// The pending version that counts: one above the current version (a lower one is the
/// leftover of a commit whose cleanup was cut short).
fn live_pending<'a>(live: Option<&Live>, pending: &'a PendingRead) -> Option<&'a Pending> {
    match pending {
        PendingRead::Found(p) if p.version > live.map_or(0, |l| l.version) => Some(p),
        _ => None,
    }
}

/// The version rules' view of what [`VaultKms::read_state`] returned: the current version,
/// the pending version that counts ([`live_pending`]), and every other version number known
/// (the history, and a pending leftover, whose number is not to be reused either).
fn book_of(main: Option<&Main>, pending: &PendingRead) -> VersionBook {
    let live = main.and_then(|m| m.live.as_ref());
    let history = live
        .into_iter()
        .flat_map(|l| l.history.iter().map(|h| h.version));
    let leftover = match pending {
        PendingRead::Found(p) => Some(p.version),
        PendingRead::Absent | PendingRead::Leftover => None,
    };
    VersionBook::new(
        live.map(|l| l.version),
        live_pending(live, pending).map(|p| p.version),
        history.chain(leftover),
    )
}

/// Does KV version `kv` still hold material (not destroyed, not soft-deleted, not pruned)?
fn material_kept(meta: Option<&ReadSecretMetadataResponse>, kv: u64, now: u64) -> bool {
    let Some(v) = meta.and_then(|m| m.versions.get(&kv.to_string())) else {
        return false;
    };
    if v.destroyed {
        return false;
    }
    // `delete_version_after` sets a deletion time in the future; it counts once passed.
    let t = v.deletion_time.trim();
    t.is_empty() || parse_time(t).is_some_and(|at| at > now)
}

/// Last path component of a key name: the data field holding the passphrase (Rook's layout).
fn basename(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

fn pending_path(name: &str) -> String {
    format!("{name}{PENDING_SUFFIX}")
}

/// Moves a string field out of `data` into zeroizing storage (no copy of the bytes).
fn take_string(
    data: &mut serde_json::Map<String, Value>,
    field: &str,
) -> Option<Zeroizing<String>> {
    match data.remove(field) {
        Some(Value::String(s)) => Some(Zeroizing::new(s)),
        _ => None,
    }
}

/// A `u64` field written as a decimal string (keyplan's form) or a JSON number.
fn number(data: &serde_json::Map<String, Value>, field: &str) -> Result<Option<u64>, String> {
    match data.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{field} is {s:?}, not a number")),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{field} is {n}, not a whole number")),
        Some(_) => Err(format!("{field} is not a number")),
    }
}

fn parse_history(v: &Value) -> Result<Vec<Hist>, String> {
    let rows: Vec<[u64; 3]> = match v {
        Value::String(s) => serde_json::from_str(s),
        other => serde_json::from_value(other.clone()),
    }
    .map_err(|e| format!("not a JSON list of [version, kv_version, created_at] ({e})"))?;
    Ok(rows
        .into_iter()
        .map(|[version, kv_version, created_at]| Hist {
            version,
            kv_version,
            created_at,
        })
        .collect())
}

/// [`FIELD_HOLDERS`]'s text for `holders`; empty for none.
fn holders_json(holders: &BTreeMap<String, u64>) -> String {
    if holders.is_empty() {
        String::new()
    } else {
        serde_json::to_string(holders).unwrap_or_default()
    }
}

fn history_json(history: &[Hist]) -> String {
    let rows: Vec<[u64; 3]> = history
        .iter()
        .map(|h| [h.version, h.kv_version, h.created_at])
        .collect();
    serde_json::Value::from(
        rows.iter()
            .map(|r| serde_json::Value::from(r.to_vec()))
            .collect::<Vec<_>>(),
    )
    .to_string()
}

/// Vault's RFC 3339 timestamps (`2024-05-01T12:00:00.123456789Z`) as Unix seconds.
fn parse_time(t: &str) -> Option<u64> {
    crate::clock::parse_rfc3339(t)
}

fn into_passphrase(p: &Zeroizing<String>) -> Passphrase {
    Passphrase::new(p.as_bytes().to_vec())
}

/// One line from Vault's multi-line error texts ("1 error occurred:\n\t* permission denied").
fn squash(msg: &str) -> String {
    msg.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An error and its sources, `: `-separated, skipping repeats and the client crates' generic
/// wrapper texts (so the message starts at the useful part: the URL and the cause).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    const GENERIC: &[&str] = &[
        "An error occurred with the request",
        "Error sending HTTP request",
        "Error retrieving HTTP response",
        "An error occurred in processing the request",
    ];
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let text = err.to_string();
        if !GENERIC.contains(&text.as_str()) && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = err.source();
    }
    if parts.is_empty() {
        e.to_string()
    } else {
        parts.join(": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(address: &str, mount: Option<&str>) -> KmsConfig {
        KmsConfig::Vault {
            address: address.to_string(),
            mount: mount.map(str::to_string),
            token_env: None,
            auth: None,
            namespace: None,
            ca_cert: None,
            timeout: None,
        }
    }

    #[test]
    fn describe_names_instance_address_and_mount() {
        let k = VaultKms::new("v", &cfg("http://127.0.0.1:8200", None), "t", "VAULT_TOKEN")
            .expect("open");
        assert_eq!(
            k.describe(),
            "vault KMS \"v\" (http://127.0.0.1:8200, mount secret)"
        );
        assert!(!format!("{k:?}").contains("\"t\""));
    }

    #[test]
    fn bad_settings_are_config_errors() {
        for (addr, mount) in [
            ("not a url", None),
            ("ftp://x:1", None),
            ("http://127.0.0.1:8200", Some("/")),
            ("http://127.0.0.1:8200", Some("a/../b")),
        ] {
            match VaultKms::new("v", &cfg(addr, mount), "t", "VAULT_TOKEN") {
                Err(KmsError::Config { detail, .. }) => assert!(!detail.is_empty()),
                other => panic!("{addr} {mount:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn missing_token_variable_is_named() {
        let c = KmsConfig::Vault {
            address: "http://127.0.0.1:8200".into(),
            mount: None,
            token_env: Some("KEYPLAN_UNIT_TEST_SURELY_UNSET_TOKEN".into()),
            auth: None,
            namespace: None,
            ca_cert: None,
            timeout: None,
        };
        match open("v", &c) {
            Err(KmsError::Config { detail, .. }) => {
                assert!(
                    detail.contains("KEYPLAN_UNIT_TEST_SURELY_UNSET_TOKEN"),
                    "{detail}"
                )
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("opened without a token"),
        }
    }

    #[test]
    fn names_that_collide_are_refused() {
        let k = VaultKms::new("v", &cfg("http://127.0.0.1:8200", None), "t", "VAULT_TOKEN")
            .expect("open");
        for bad in [
            "",
            "/a",
            "a/",
            "a//b",
            "a/../b",
            "k.keyplan-pending",
            "x/keyplan_version",
        ] {
            assert!(
                matches!(k.check_name(bad), Err(KmsError::Config { .. })),
                "{bad:?}"
            );
        }
        for good in ["a", "rook/osd-kek", "a.b/c-d_e"] {
            assert!(k.check_name(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn history_round_trips_and_times_parse() {
        let h = vec![
            Hist {
                version: 1,
                kv_version: 1,
                created_at: 10,
            },
            Hist {
                version: 3,
                kv_version: 2,
                created_at: 20,
            },
        ];
        let text = history_json(&h);
        assert_eq!(text, "[[1,1,10],[3,2,20]]");
        assert_eq!(parse_history(&Value::String(text)).unwrap(), h);
        assert!(parse_history(&Value::String("[1,2]".into())).is_err());
        assert_eq!(parse_time("1970-01-01T00:01:40.123456789Z"), Some(100));
        assert_eq!(basename("a/b/c"), "c");
        assert_eq!(basename("c"), "c");
        assert_eq!(
            squash("1 error occurred:\n\t* permission denied\n\n"),
            "1 error occurred: * permission denied"
        );
    }
}
