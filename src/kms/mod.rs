//! KMS providers: where key versions live.
//!
//! Every provider implements [`Kms`]: read a key's version metadata, fetch one version's
//! passphrase, stage a new `pending` version, commit it as `current` with compare-and-swap,
//! and retire old versions (docs/rotation.md). Providers: `file` (local directory), `vault`
//! (HashiCorp Vault / OpenBao KV v2), `kubernetes` (core/v1 Secrets), `kmip` (KMIP 1.x over
//! mutual TLS), `aws` (AWS Secrets Manager) and `exec` (an external program speaking a JSON
//! protocol).
//!
//! The version rules every provider applies (next version number, the preconditions of stage,
//! commit, retire and destroy, the conflict messages) live in [`book`].
//!
//! Network providers share [`block_on`] (one small tokio runtime for the async client crates),
//! [`deadline`] (every call ends within its KMS instance's `timeout`, default
//! [`REQUEST_TIMEOUT`]; a KMS that let a call time out is not asked again by the same
//! command) and [`with_retries`], which retries only idempotent operations (reads, gets,
//! retires) with bounded exponential backoff, while the call's deadline leaves room; `stage`
//! and `commit` are never retried blindly: after a failed write keyplan re-reads the key
//! before acting again.

pub mod aws;
pub mod book;
pub mod deadline;
pub mod exec;
pub mod expiry;
pub mod file;
pub mod kmip;
pub mod kubernetes;
pub mod vault;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::secret::Passphrase;
use crate::spec::KmsConfig;

/// Lifecycle of one key version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionState {
    /// Staged by a rotation, not yet committed; devices may already hold it.
    Pending,
    /// The version every managed device must open with.
    Current,
    /// Superseded but still retained (material kept) until no device holds it.
    Previous,
    /// Destroyed: metadata kept for the record, material removed.
    Retired,
}

/// Metadata of one key version (never the material).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// Version number, starting at 1, increasing by 1 per staged version.
    pub version: u64,
    /// Creation time, seconds since the Unix epoch (UTC).
    pub created_at: u64,
    /// Lifecycle state.
    pub state: VersionState,
}

impl From<crate::format::kms::StoredState> for VersionState {
    fn from(s: crate::format::kms::StoredState) -> VersionState {
        use crate::format::kms::StoredState as S;
        match s {
            S::Pending => VersionState::Pending,
            S::Current => VersionState::Current,
            S::Previous => VersionState::Previous,
            S::Retired => VersionState::Retired,
        }
    }
}

impl From<VersionState> for crate::format::kms::StoredState {
    fn from(s: VersionState) -> crate::format::kms::StoredState {
        use crate::format::kms::StoredState as S;
        match s {
            VersionState::Pending => S::Pending,
            VersionState::Current => S::Current,
            VersionState::Previous => S::Previous,
            VersionState::Retired => S::Retired,
        }
    }
}

impl From<crate::format::kms::VersionEntry> for VersionInfo {
    fn from(e: crate::format::kms::VersionEntry) -> VersionInfo {
        VersionInfo {
            version: e.version,
            created_at: e.created_at,
            state: e.state.into(),
        }
    }
}

impl From<VersionInfo> for crate::format::kms::VersionEntry {
    fn from(v: VersionInfo) -> crate::format::kms::VersionEntry {
        crate::format::kms::VersionEntry {
            version: v.version,
            created_at: v.created_at,
            state: v.state.into(),
        }
    }
}

/// What a KMS holds for one key.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyState {
    /// The current version, if the key exists.
    pub current: Option<u64>,
    /// The staged version, if a rotation is under way.
    pub pending: Option<u64>,
    /// All versions known, by number (including retired ones).
    pub versions: BTreeMap<u64, VersionInfo>,
    /// The plans whose devices hold the key ([`Kms::hold`]), by holder id
    /// ([`crate::spec::Plan::holder`], `<node or host>:<state directory>`), with when each
    /// was recorded (Unix seconds). A commit from one holder is refused while another holder
    /// is recorded ([`Kms::commit_as`], invariant I7).
    pub holders: BTreeMap<String, u64>,
}

impl KeyState {
    /// The metadata of the current version.
    pub fn current_info(&self) -> Option<&VersionInfo> {
        self.current.and_then(|v| self.versions.get(&v))
    }
    /// Versions whose material is still held (not retired), other than current and pending.
    pub fn retained_previous(&self) -> Vec<u64> {
        self.versions
            .values()
            .filter(|v| v.state == VersionState::Previous)
            .map(|v| v.version)
            .collect()
    }
}

/// What keyplan knows about one credential it uses to reach a KMS: a Vault token, a TLS
/// client certificate, a service-account token. Never the credential itself.
///
/// Reported by [`Kms::credentials`]; `status` exports it and warns when its
/// [`Credential::deadline`] comes before the next rotation is due plus a margin
/// ([`crate::ops::credentials`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Credential {
    /// Short stable kind, the `credential` label of the metrics: `vault_token`,
    /// `client_certificate`, `service_account_token`, `bearer_token`, `aws_credentials`, or
    /// what an `exec` helper reports (lowercase letters, digits and `_`, at most 40
    /// characters: docs/kms/exec.md, `credentials`).
    pub kind: std::borrow::Cow<'static, str>,
    /// What it is and where it comes from, for people, e.g. `token from $VAULT_TOKEN` or
    /// `client certificate /etc/keyplan/kmip.pem (CN=keyplan)`. No secret.
    pub what: String,
    /// When it stops working unless renewed, Unix seconds (UTC); `None`: it does not expire.
    pub expires_at: Option<u64>,
    /// Who renews it before `expires_at`, if anyone (e.g. `keyplan renews it at each apply`,
    /// `the kubelet refreshes it`); `None`: nobody does, a person must replace it.
    pub renewed_by: Option<String>,
    /// For a renewed credential, the time after which it cannot be renewed any more (a Vault
    /// token's explicit max TTL), Unix seconds; `None`: no such limit is known.
    pub renewable_until: Option<u64>,
}

impl Credential {
    /// The instant after which keyplan loses access unless a person acts, Unix seconds:
    /// `renewable_until` for a renewed credential, `expires_at` otherwise; `None`: no known end.
    pub fn deadline(&self) -> Option<u64> {
        if self.renewed_by.is_some() {
            self.renewable_until
        } else {
            self.expires_at
        }
    }
}

/// KMS errors. Messages name the KMS instance, the key and the version; never material.
#[derive(Debug, thiserror::Error)]
pub enum KmsError {
    /// The key or version does not exist (or holds no material any more).
    #[error("{kms}: key {key:?} has no version {version}")]
    NoSuchVersion {
        /// KMS description.
        kms: String,
        /// Key name in the KMS.
        key: String,
        /// Requested version.
        version: u64,
    },
    /// Compare-and-swap failed: somebody else changed the key since keyplan read it.
    #[error("{kms}: key {key:?} changed concurrently: {detail}; nothing was overwritten. Run `keyplan plan` again to see the new state")]
    Conflict {
        /// KMS description.
        kms: String,
        /// Key name in the KMS.
        key: String,
        /// What differed (versions only).
        detail: String,
    },
    /// The stored data is unreadable or inconsistent.
    #[error("{kms}: key {key:?}: {detail}")]
    Corrupt {
        /// KMS description.
        kms: String,
        /// Key name in the KMS.
        key: String,
        /// What is wrong and where.
        detail: String,
    },
    /// An I/O error talking to the store.
    #[error("{kms}: {what}: {source}")]
    Io {
        /// KMS description.
        kms: String,
        /// The operation and path.
        what: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The store could not be reached or refused to answer (network, server, permissions).
    /// Whether a write took effect is unknown; keyplan re-reads before acting again.
    #[error("{kms} is unavailable: {detail}. Nothing further was attempted; once the KMS is reachable, run `keyplan apply` again")]
    Unavailable {
        /// KMS description.
        kms: String,
        /// What failed (no material).
        detail: String,
    },
    /// The store did not answer within the call's deadline (its KMS instance's `timeout`,
    /// [`deadline`]), or an earlier call of this command did not and it was not asked again.
    /// Whether a write took effect is unknown; keyplan re-reads before acting again.
    #[error("{kms} did not answer in time: {detail}. keyplan stopped waiting and asks it nothing more in this command (the next run reads the KMS before it writes again); once the KMS answers, run keyplan again, or raise the KMS's `timeout` in the plan (docs/monitoring.md, \"Deadlines\")")]
    Timeout {
        /// KMS description.
        kms: String,
        /// What was asked and the deadline it missed (no material).
        detail: String,
    },
    /// The store answered but refused the operation (authentication or authorization).
    #[error("{kms} refused: {detail}. Fix keyplan's credentials or their permissions, then run keyplan again")]
    Denied {
        /// KMS description.
        kms: String,
        /// What was refused (operation, path or object; no material).
        detail: String,
    },
    /// The KMS configuration cannot be used (missing token variable, unreadable certificate, ...).
    #[error("{kms}: {detail}")]
    Config {
        /// KMS description.
        kms: String,
        /// What is wrong and what to do.
        detail: String,
    },
    /// What the store holds for a key was written in a newer version of its layout than this
    /// keyplan reads (a newer keyplan wrote it: a downgrade, or an older agent in a fleet that
    /// is half upgraded). Nothing was changed or written; the message says which version and
    /// which keyplan reads it ([`crate::format::kms`]).
    #[error(transparent)]
    NewerFormat(#[from] crate::format::NewerFormat),
    /// The provider named in the plan is not available in this build.
    #[error("KMS {name:?}: provider {provider:?} is not implemented yet; use provider \"file\"")]
    Unsupported {
        /// KMS instance name.
        name: String,
        /// Provider name.
        provider: String,
    },
}

impl KmsError {
    /// A copy of a [`KmsError::Denied`] or [`KmsError::Config`] (to give the same answer again
    /// without asking the store again); other kinds are copied as [`KmsError::Config`] with
    /// their text.
    pub fn same(&self) -> KmsError {
        match self {
            KmsError::Denied { kms, detail } => KmsError::Denied {
                kms: kms.clone(),
                detail: detail.clone(),
            },
            KmsError::Config { kms, detail } => KmsError::Config {
                kms: kms.clone(),
                detail: detail.clone(),
            },
            other => KmsError::Config {
                kms: String::new(),
                detail: other.to_string(),
            },
        }
    }

    /// A [`KmsError::Conflict`] on key `key` of `kms`; `detail` says what differed (versions,
    /// paths or object ids only, never material).
    pub fn conflict(kms: &dyn Kms, key: &str, detail: String) -> KmsError {
        KmsError::Conflict {
            kms: kms.describe(),
            key: key.to_string(),
            detail,
        }
    }

    /// The [`KmsError::Config`] for a configuration of another provider handed to
    /// `provider`'s `open` (a keyplan bug: [`open`] dispatches on the configuration).
    pub fn misrouted(name: &str, config: &KmsConfig, provider: &str) -> KmsError {
        KmsError::Config {
            kms: format!("KMS {name:?}"),
            detail: format!(
                "internal error: provider {:?} was handed to the {provider} provider (keyplan bug)",
                config.provider()
            ),
        }
    }

    /// The error for a stored document of key `key` of `kms` that could not be read
    /// ([`crate::format::kms::ReadError`]): [`KmsError::NewerFormat`] for a newer version,
    /// else [`KmsError::Corrupt`] with `invalid` applied to the parser's words (to say where
    /// and what to do).
    pub fn of_read(
        kms: &dyn Kms,
        key: &str,
        e: crate::format::kms::ReadError,
        invalid: impl FnOnce(String) -> String,
    ) -> KmsError {
        match e {
            crate::format::kms::ReadError::Newer(n) => KmsError::NewerFormat(n),
            crate::format::kms::ReadError::Invalid(why) => {
                KmsError::corrupt(kms, key, invalid(why))
            }
        }
    }

    /// How a refusal of a newer layout ([`crate::format::NewerFormat::document`]) names key
    /// `key` of `kms` at `place` (a path, Secret or object): `<kms> key "<key>" (<place>)`.
    pub fn document(kms: &dyn Kms, key: &str, place: &str) -> String {
        format!("{} key {key:?} ({place})", kms.describe())
    }

    /// A [`KmsError::Corrupt`] for key `key` of `kms`; `detail` says what is wrong and where
    /// (never material).
    pub fn corrupt(kms: &dyn Kms, key: &str, detail: String) -> KmsError {
        KmsError::Corrupt {
            kms: kms.describe(),
            key: key.to_string(),
            detail,
        }
    }
}

/// A key store holding passphrase versions (docs/rotation.md, steps stage, commit, retire).
///
/// Implementations are safe to call from several threads; writes are atomic and
/// [`Kms::commit`] is compare-and-swap, so a concurrent writer causes
/// [`KmsError::Conflict`], never an overwrite (invariant I5).
pub trait Kms: Send + Sync {
    /// Human description for messages, e.g. `file KMS "local" (/srv/keys)`.
    fn describe(&self) -> String;
    /// Version metadata of key `name`; an unknown key gives an empty [`KeyState`].
    fn read(&self, name: &str) -> Result<KeyState, KmsError>;
    /// The passphrase of `version` (pending, current or previous).
    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError>;
    /// Stores `material` as a new pending version and returns its number: the highest known
    /// version + 1, or `at_least` if that is higher (so a number a stale device record still
    /// names is never reused). Fails with [`KmsError::Conflict`] when a pending version exists
    /// already (callers reuse it instead: invariant I3).
    fn stage(&self, name: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError>;
    /// Makes `pending` the current version if, and only if, the current version is still
    /// `expected_current` and `pending` is still pending (compare-and-swap); the old current
    /// becomes `Previous`. Committing a version that is already current is a no-op. The same
    /// as [`Kms::commit_as`] without a holder check.
    fn commit(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
    ) -> Result<(), KmsError> {
        self.commit_as(name, expected_current, pending, None)
    }
    /// [`Kms::commit`] on behalf of the plan `holder`: also refused with
    /// [`KmsError::Conflict`] when the key records another holder ([`Kms::hold`]), checked in
    /// the same compare-and-swap as the versions (so a holder recorded concurrently either
    /// comes first and stops the commit, or comes after it and sees the new version). `None`:
    /// no holder check (the provider contract tests).
    fn commit_as(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError>;
    /// Records `holder` (a plan: `<node or host>:<state directory>`) as holding key `name` on
    /// its devices, before that plan adds a keyslot of it; idempotent (an existing record
    /// keeps its time). Where the record lives is each provider's (docs/kms/*.md, "Holders").
    ///
    /// Errors: [`KmsError::Conflict`] when the key has no current version (a key is held once
    /// it exists) or it changed concurrently (run again), and the provider's usual errors.
    fn hold(&self, name: &str, holder: &str) -> Result<(), KmsError>;
    /// Removes `holder`'s record from key `name` (its plan's devices no longer hold the key);
    /// idempotent, also for a key that does not exist.
    ///
    /// Errors: the provider's usual errors.
    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError>;
    /// Destroys the material of a non-current version and marks it `Retired`. Idempotent.
    fn retire(&self, name: &str, version: u64) -> Result<(), KmsError>;
    /// Checks, without writing anything, that the store is reachable and that keyplan's
    /// credentials may stage, commit and retire versions of each key in `names` (I6,
    /// docs/rotation.md: `plan` calls it, so it must leave no trace). The default reads each key.
    ///
    /// Errors: [`KmsError::Unavailable`] (unreachable), [`KmsError::Denied`] (missing
    /// permission), [`KmsError::Config`].
    fn check(&self, names: &[String]) -> Result<(), KmsError> {
        for name in names {
            self.read(name)?;
        }
        Ok(())
    }
    /// Destroys every version of `name`, current included, if and only if the current version
    /// is still `expected_current` and no version is pending (compare-and-swap). Used after a
    /// key moved to another KMS (migration). Afterwards [`Kms::read`] reports no current and
    /// no pending version; versions it still lists are `Retired`. Destroying a key that has no
    /// current version any more is a no-op (idempotent).
    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError>;
    /// The credentials keyplan uses to reach this store, with their expiry where it can be
    /// known (a Vault token's TTL from `auth/token/lookup-self`, a client certificate's
    /// notAfter, a service-account token's `exp` claim). Writes nothing; may contact the
    /// store. The default: none known (the file KMS; an `exec` helper reports its own).
    ///
    /// Errors: [`KmsError::Unavailable`], [`KmsError::Denied`] (the store refuses the
    /// credential, e.g. an expired token), [`KmsError::Config`] (an unreadable certificate).
    fn credentials(&self) -> Result<Vec<Credential>, KmsError> {
        Ok(Vec::new())
    }
    /// What retiring a version did to its material in this store, for messages about a
    /// retired version ("v3 was retired: <this>"). The default: the material was destroyed, as
    /// [`Kms::retire`] asks; a provider whose store cannot destroy a single version says what
    /// it does instead.
    fn retired_means(&self) -> String {
        "its material was destroyed".to_string()
    }
    /// Renews keyplan's credential where the store allows it and it is due (a renewable Vault
    /// token with less than half of its TTL left). `apply` calls it once per run, whatever the
    /// run does, so a timer that runs `apply` keeps the credential alive; `plan` and `status`
    /// never do (they write nothing). The default: nothing to renew.
    ///
    /// Errors: as [`Kms::credentials`]; `apply` logs a failure as a warning and goes on (the
    /// credential may still be valid).
    fn renew_credentials(&self) -> Result<(), KmsError> {
        Ok(())
    }
    /// Versions of `name` that this store records as retired but whose material it can still
    /// hand out: a retire or destroy interrupted after its record (a store that keeps record
    /// and material in separate places), or material restored by hand. `status` reports each
    /// as a problem (once rotated out, a key must open nothing). Reads only. The default: the
    /// store cannot tell apart, so none (providers whose record and material are one object,
    /// or that remove material before the record, answer the default too).
    ///
    /// Errors: the provider's usual read errors.
    fn lingering(&self, name: &str) -> Result<Vec<u64>, KmsError> {
        let _ = name;
        Ok(Vec::new())
    }
}

/// Opens the KMS instance `name` configured as `config` (paths already absolute), its calls
/// limited to the instance's `timeout` ([`timeout_of`]) and budgeted by `policy`
/// ([`deadline::Guarded`]).
///
/// Opening contacts nothing; credentials named in the configuration (token variable,
/// certificate files, kubeconfig) are read here.
///
/// Errors: [`KmsError::Config`] for unusable settings, [`KmsError::Unsupported`] for
/// providers not built yet.
pub fn open(
    name: &str,
    config: &KmsConfig,
    policy: &std::sync::Arc<deadline::WaitPolicy>,
) -> Result<Box<dyn Kms>, KmsError> {
    let kms: Box<dyn Kms> = match config {
        KmsConfig::File { path } => Box::new(file::FileKms::new(name, PathBuf::from(path))),
        KmsConfig::Vault { .. } => vault::open(name, config)?,
        KmsConfig::Kubernetes { .. } => kubernetes::open(name, config)?,
        KmsConfig::Kmip { .. } => kmip::open(name, config)?,
        KmsConfig::AwsSecretsManager { .. } => aws::open(name, config)?,
        KmsConfig::Exec { .. } => exec::open(name, config)?,
    };
    let timeout = match config {
        KmsConfig::Exec { .. } => exec::timeout_of(name, config)?,
        _ => timeout_of(name, config)?,
    };
    Ok(Box::new(deadline::Guarded::new(
        injected(kms),
        timeout,
        std::sync::Arc::clone(policy),
    )))
}

/// Default time limit of one KMS call, all its requests and retries included (connect and
/// answer), for an instance without `timeout` in the plan: 30 seconds.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The `timeout` of KMS instance `name` (validated by `keyplan validate`: 1 s to 1 h), or
/// [`REQUEST_TIMEOUT`] when the plan gives none.
///
/// Errors: [`KmsError::Config`] when the text is not such a duration (a plan that skipped
/// validation).
pub fn timeout_of(name: &str, config: &KmsConfig) -> Result<std::time::Duration, KmsError> {
    match config.timeout() {
        None => Ok(REQUEST_TIMEOUT),
        Some(text) => crate::spec::parse_kms_timeout(text).map_err(|detail| KmsError::Config {
            kms: format!("{} KMS {name:?}", config.provider()),
            detail,
        }),
    }
}

pub use crate::runtime::install_tls_provider;

/// Runs `future` to completion on keyplan's shared tokio runtime ([`crate::runtime`]) from
/// synchronous engine code. Used by the providers built on async client crates (`vaultrs`,
/// `kube`). Safe to call from several threads at once; must not be called from inside the
/// runtime.
///
/// Errors: [`KmsError::Config`] naming `kms` if the runtime cannot be started.
pub fn block_on<F: std::future::Future>(kms: &str, future: F) -> Result<F::Output, KmsError> {
    crate::runtime::block_on(kms, future).map_err(|e| KmsError::Config {
        kms: kms.to_string(),
        detail: format!(
            "cannot start the async runtime for network KMS calls: {}",
            e.cause
        ),
    })
}

/// Runs the idempotent KMS operation `op` (a read, get, retire or destroy; never a stage or
/// commit), retrying it when it fails with [`KmsError::Unavailable`]: at most 3 retries,
/// exponential backoff from 200 ms to 2 s with jitter (the `backon` crate), and only while the
/// call's deadline ([`deadline`]) leaves more than the longest pause. Each retry is logged at
/// `warn` with `what` (operation and key, no material). Other errors (a
/// [`KmsError::Timeout`] among them: the deadline is spent) return at once.
pub fn with_retries<T>(what: &str, op: impl FnMut() -> Result<T, KmsError>) -> Result<T, KmsError> {
    use backon::{BlockingRetryable, ExponentialBuilder};
    let policy = ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(200))
        .with_max_delay(std::time::Duration::from_secs(2))
        .with_max_times(3)
        .with_jitter();
    op.retry(policy)
        .sleep(std::thread::sleep)
        .when(|e| {
            matches!(e, KmsError::Unavailable { .. })
                && deadline::leaves(std::time::Duration::from_secs(2))
        })
        .notify(|e, after| {
            tracing::warn!(operation = what, retry_in = ?after, "KMS unavailable; retrying");
            tracing::debug!(operation = what, error = %e, "KMS error before the retry")
        })
        .call()
}

/// Wraps a provider with the `kms.*` injection points of [`crate::failpoint`] (feature
/// `failpoints`); returns it unchanged otherwise.
fn injected(kms: Box<dyn Kms>) -> Box<dyn Kms> {
    #[cfg(feature = "failpoints")]
    {
        Box::new(Injected(kms))
    }
    #[cfg(not(feature = "failpoints"))]
    {
        kms
    }
}

/// A provider whose every call first evaluates the `kms.<operation>` injection point; an
/// injected error comes back as [`KmsError::Unavailable`].
#[cfg(feature = "failpoints")]
struct Injected(Box<dyn Kms>);

#[cfg(feature = "failpoints")]
impl Injected {
    fn point(&self, name: &str) -> Result<(), KmsError> {
        crate::failpoint::check(name).map_err(|detail| KmsError::Unavailable {
            kms: self.0.describe(),
            detail,
        })
    }
}

#[cfg(feature = "failpoints")]
impl Kms for Injected {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn read(&self, name: &str) -> Result<KeyState, KmsError> {
        self.point("kms.read")?;
        self.0.read(name)
    }
    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        self.point("kms.get")?;
        self.0.get(name, version)
    }
    fn stage(&self, name: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        self.point("kms.stage")?;
        let v = self.0.stage(name, material, at_least)?;
        self.point("kms.stage.lost_reply")?;
        Ok(v)
    }
    fn commit_as(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        self.point("kms.commit")?;
        self.0.commit_as(name, expected_current, pending, holder)?;
        self.point("kms.commit.lost_reply")
    }
    fn hold(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        self.point("kms.hold")?;
        self.0.hold(name, holder)
    }
    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        self.point("kms.release")?;
        self.0.release(name, holder)
    }
    fn retire(&self, name: &str, version: u64) -> Result<(), KmsError> {
        self.point("kms.retire")?;
        self.0.retire(name, version)
    }
    fn check(&self, names: &[String]) -> Result<(), KmsError> {
        self.point("kms.check")?;
        self.0.check(names)
    }
    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError> {
        self.point("kms.destroy_key")?;
        self.0.destroy_key(name, expected_current)
    }
    fn credentials(&self) -> Result<Vec<Credential>, KmsError> {
        self.point("kms.credentials")?;
        self.0.credentials()
    }
    fn retired_means(&self) -> String {
        self.0.retired_means()
    }
    fn renew_credentials(&self) -> Result<(), KmsError> {
        self.point("kms.renew_credentials")?;
        self.0.renew_credentials()
    }
    fn lingering(&self, name: &str) -> Result<Vec<u64>, KmsError> {
        self.0.lingering(name)
    }
}
