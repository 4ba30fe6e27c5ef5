//! The `aws_secrets_manager` KMS provider: AWS Secrets Manager, in its own rotation model.
//!
//! Operator documentation (layout, IAM policy, what the tests' server does not check):
//! `docs/kms/aws-secrets-manager.md`. API reference:
//! <https://docs.aws.amazon.com/secretsmanager/latest/apireference/>.
//!
//! Layout, for a key whose KMS name is `<name>` and a plan `prefix` `<p>`:
//!
//! ```text
//! secret <p><name>            one secret version per keyplan version, its value the passphrase
//!                             (SecretString), its version id `keyplan-version-<20 digits>`
//!                             (the ClientRequestToken: a retried stage is idempotent)
//!     label keyplan-v<N>      keyplan's version number; kept while the version is retained
//!     label AWSCURRENT        the current version: what `get-secret-value` returns
//!     label AWSPENDING        the staged version during a rotation
//!     label AWSPREVIOUS       moved by Secrets Manager to the version AWSCURRENT left
//! secret <p><name>.keyplan    keyplan's record (JSON, no material): holders and votes, retired
//!                             versions, a first version not yet committed (layout::Meta)
//! ```
//!
//! - **stage** puts the new version with the labels `AWSPENDING` and `keyplan-v<N>`. A key's
//!   first version is different: Secrets Manager puts `AWSCURRENT` on a secret's first version
//!   itself, so keyplan first records it as uncommitted in the record, then writes it.
//! - **commit** is two compare-and-swaps: the record is rewritten (a new version, then
//!   `AWSCURRENT` moved to it off the version read, so a holder or vote recorded since the
//!   commit read the holders fails it), then `AWSCURRENT` of the key's secret is moved to the
//!   pending version off the expected current one (`UpdateSecretVersionStage` with
//!   `RemoveFromVersionId`: Secrets Manager refuses it when the label is elsewhere, so a
//!   concurrent writer fails the commit). Then `AWSPENDING` is taken off.
//! - **retire** records the version as retired, then takes every label off it: an unlabelled
//!   version is deprecated, and Secrets Manager deletes it at its own pace (its value stays
//!   readable by version id until then, to whoever may read the secret).
//! - A secret keyplan did not write is adopted: its `AWSCURRENT` version is version 1 (or
//!   the number above every known one), labelled by keyplan's next write.
//!
//! The HTTP buffers inside the AWS SDK are not zeroized (the SDK offers no hook); keyplan's own
//! copies are. Files: this one holds the rules (the [`Kms`] operations); `layout.rs` the
//! layout above; `client.rs` the connection (SDK client, requests, failures). Imports run one
//! way: this file uses both, `layout.rs` uses `client.rs`.

mod client;
mod layout;

use aws_sdk_secretsmanager as sm;
use zeroize::Zeroizing;

use self::client::CallError;
use self::layout::{Meta, View, CURRENT, META_NEXT, META_SUFFIX, PENDING, PREVIOUS};
use super::book::{self, Commit, Destroy};
use super::{block_on, with_retries, Credential, KeyState, Kms, KmsError};
use crate::format::kms::aws::Record;
use crate::secret::Passphrase;
use crate::spec::{aws_names, KmsConfig};

/// One `aws_secrets_manager` KMS instance.
pub struct AwsKms {
    name: String,
    region: String,
    endpoint: Option<String>,
    prefix: String,
    client: sm::Client,
    credentials: Option<sm::config::SharedCredentialsProvider>,
}

impl std::fmt::Debug for AwsKms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsKms")
            .field("name", &self.name)
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// Opens the instance `name` configured as `config` (an [`KmsConfig::AwsSecretsManager`]).
/// Reads the environment and the AWS shared config files for credentials; contacts nothing.
///
/// Errors: [`KmsError::Config`] for a region or endpoint of the wrong shape
/// ([`aws_names::region_problem`], [`aws_names::endpoint_problem`]: an endpoint must be an
/// `http(s)://host[:port]` URL without credentials or path), or when the async runtime cannot
/// start.
pub fn open(name: &str, config: &KmsConfig) -> Result<Box<dyn Kms>, KmsError> {
    let KmsConfig::AwsSecretsManager {
        region,
        endpoint,
        prefix,
        ..
    } = config
    else {
        return Err(KmsError::misrouted(name, config, "aws_secrets_manager"));
    };
    let describe = format!("AWS Secrets Manager KMS {name:?} ({region})");
    let problem = aws_names::region_problem(region)
        .or_else(|| endpoint.as_deref().and_then(aws_names::endpoint_problem))
        .or_else(|| prefix.as_deref().and_then(aws_names::prefix_problem));
    if let Some(detail) = problem {
        return Err(KmsError::Config {
            kms: describe,
            detail,
        });
    }
    crate::runtime::install_tls_provider();
    let (client, credentials) = block_on(&describe, client::build(region, endpoint.as_deref()))?;
    Ok(Box::new(AwsKms {
        name: name.to_string(),
        region: region.clone(),
        endpoint: endpoint.clone(),
        prefix: prefix.clone().unwrap_or_default(),
        client,
        credentials,
    }))
}

impl AwsKms {
    /// The secret holding key `key`'s versions.
    fn secret(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The record secret of key `key`.
    fn meta_secret(&self, key: &str) -> String {
        format!("{}{key}{META_SUFFIX}", self.prefix)
    }

    fn run<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, KmsError>>,
    ) -> Result<T, KmsError> {
        block_on(&self.describe(), fut)?
    }

    /// The [`KmsError`] for a failed request `what` on key `key`.
    fn fail(&self, key: &str, what: &str, e: CallError) -> KmsError {
        let kms = self.describe();
        match e {
            CallError::Timeout => KmsError::Timeout {
                kms,
                detail: format!("{what} of key {key:?}: {e}"),
            },
            CallError::Transport(t) => KmsError::Unavailable {
                kms,
                detail: format!(
                    "{what} of key {key:?}: {t} (if the region {:?} is mistyped, or the endpoint names the wrong host, fix it in the plan)",
                    self.region
                ),
            },
            CallError::ScheduledForDeletion { ref secret, .. } => KmsError::Corrupt {
                kms,
                key: key.to_string(),
                detail: format!(
                    "{what}: {e} (DeleteSecret): when Secrets Manager deletes it, the KMS holds no copy of this key's passphrases any more, and the devices open only with passphrases kept elsewhere. keyplan changed nothing. If the deletion was not meant, run `aws secretsmanager restore-secret --secret-id {secret} --region {}` and run keyplan again; if it was (the key moved to another KMS), remove the key from the plan",
                    self.region
                ),
            },
            CallError::Credentials(_) => KmsError::Denied {
                kms,
                detail: format!(
                    "{what} of key {key:?}: {e}. Set credentials for the SDK's default chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or a web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, as IRSA sets them)"
                ),
            },
            CallError::Service {
                ref code, status, ..
            } => {
                let denied = matches!(
                    code.as_str(),
                    "AccessDeniedException"
                        | "UnrecognizedClientException"
                        | "InvalidSignatureException"
                        | "ExpiredTokenException"
                        | "InvalidClientTokenId"
                        | "SignatureDoesNotMatch"
                ) || status == 401
                    || status == 403;
                if denied {
                    KmsError::Denied {
                        kms,
                        detail: format!("{what} of secret {:?}: {e}", self.secret(key)),
                    }
                } else if matches!(
                    code.as_str(),
                    "InvalidParameterException" | "ResourceExistsException"
                ) {
                    KmsError::Conflict {
                        kms,
                        key: key.to_string(),
                        detail: format!("{what}: {e}"),
                    }
                } else {
                    KmsError::Unavailable {
                        kms,
                        detail: format!("{what} of key {key:?}: {e}"),
                    }
                }
            }
        }
    }

    /// Reads key `key`: its versions and its record.
    ///
    /// Errors: [`KmsError::Config`] for a key name Secrets Manager cannot hold or that names
    /// another key's record ([`aws_names::secret_name_problem`]: `keyplan validate` reports
    /// it too); [`KmsError::Corrupt`] for a secret scheduled for deletion, or with
    /// `AWSCURRENT` on several versions; the request's.
    async fn load(&self, key: &str) -> Result<View, KmsError> {
        if let Some(why) = aws_names::secret_name_problem(&self.prefix, key) {
            return Err(KmsError::Config {
                kms: self.describe(),
                detail: format!("key name {key:?} {why}; nothing was read or written"),
            });
        }
        let listing = client::list_versions(&self.client, &self.secret(key))
            .await
            .map_err(|e| self.fail(key, "listing the versions", e))?;
        let record = client::get_value(&self.client, &self.meta_secret(key), None)
            .await
            .map_err(|e| self.fail(key, "reading keyplan's record", e))?;
        let (meta, meta_vid) = match record {
            None => (Meta::default(), None),
            Some((vid, bytes)) => {
                let document = KmsError::document(
                    self,
                    key,
                    &format!("record secret {:?}", self.meta_secret(key)),
                );
                let record = Record::parse(&bytes, &document).map_err(|e| {
                    KmsError::of_read(self, key, e, |why| format!(
                        "keyplan's record {:?} is not the JSON keyplan writes ({why}); nothing was changed. Restore it from an earlier version (`aws secretsmanager list-secret-version-ids`) or delete it to start the record afresh",
                        self.meta_secret(key)
                    ))
                })?;
                (Meta::from(record), Some(vid))
            }
        };
        let view = View::of(listing, meta, meta_vid);
        if view.current_vids.len() > 1 {
            return Err(KmsError::corrupt(
                self,
                key,
                format!(
                    "secret {:?} has AWSCURRENT on {} versions ({}), which Secrets Manager does not allow, so keyplan cannot tell which passphrase is current; nothing was changed. Take AWSCURRENT off every version but the one that opens the devices: `aws secretsmanager update-secret-version-stage --secret-id {} --region {} --version-stage AWSCURRENT --remove-from-version-id <other version id>`",
                    self.secret(key),
                    view.current_vids.len(),
                    view.current_vids.join(", "),
                    self.secret(key),
                    self.region
                ),
            ));
        }
        Ok(view)
    }

    /// Writes key `key`'s record as `meta`, compare-and-swap against the record `view` read:
    /// creating the record secret when there was none (refused if someone created it since),
    /// or a new version made `AWSCURRENT` off the version read.
    ///
    /// Errors: [`KmsError::Conflict`] when the record changed since `view` was read.
    async fn write_meta(&self, key: &str, view: &View, meta: &Meta) -> Result<(), KmsError> {
        let text = Record::from(meta).to_text();
        let id = self.meta_secret(key);
        let token = format!("keyplan-record-{}", random_hex());
        let conflict = |what: &str, e: CallError| match e {
            CallError::Service { .. }
                if e.is("InvalidParameterException") || e.is("ResourceExistsException") =>
            {
                KmsError::conflict(
                    self,
                    key,
                    format!("keyplan's record {id:?} changed while {what}"),
                )
            }
            e => self.fail(key, what, e),
        };
        match &view.meta_vid {
            None => client::create_with(&self.client, &id, &text, &token)
                .await
                .map_err(|e| conflict("creating keyplan's record", e)),
            Some(old) => {
                client::put_value(&self.client, &id, text.as_bytes(), &token, &[META_NEXT])
                    .await
                    .map_err(|e| self.fail(key, "writing keyplan's record", e))?;
                client::move_label(&self.client, &id, CURRENT, Some(&token), Some(old))
                    .await
                    .map_err(|e| conflict("updating keyplan's record", e))
            }
        }
    }

    /// Labels a current version someone else wrote with its keyplan number (see
    /// [`View::of`]), so that numbers stay put once keyplan writes.
    async fn label_foreign(&self, key: &str, view: &View) -> Result<(), KmsError> {
        let Some(cur) = view.current().filter(|k| !k.labelled) else {
            return Ok(());
        };
        client::move_label(
            &self.client,
            &self.secret(key),
            &layout::version_label(cur.number),
            Some(&cur.vid),
            None,
        )
        .await
        .map_err(|e| self.fail(key, "labelling the adopted current version", e))
    }

    /// Takes `label` off version `vid` of key `key`'s secret, if it carries it.
    async fn unlabel(&self, key: &str, vid: &str, label: &str) -> Result<(), KmsError> {
        client::move_label(&self.client, &self.secret(key), label, None, Some(vid))
            .await
            .map_err(|e| self.fail(key, &format!("taking {label} off version {vid}"), e))
    }

    async fn stage_async(
        &self,
        key: &str,
        material: &Passphrase,
        at_least: u64,
    ) -> Result<u64, KmsError> {
        let view = self.load(key).await?;
        let n = view
            .book()
            .stage(at_least)
            .map_err(|r| r.conflict(self, key))?;
        self.label_foreign(key, &view).await?;
        let secret = self.secret(key);
        let first = view.current().is_none();
        if first {
            // Secrets Manager makes a secret's first version AWSCURRENT: say it is only
            // pending before it exists.
            let mut meta = view.meta.clone();
            meta.uncommitted = Some(n);
            self.write_meta(key, &view, &meta).await?;
            if !view.exists {
                match client::create_empty(&self.client, &secret, key).await {
                    Ok(()) => {}
                    Err(e) if e.is("ResourceExistsException") => {}
                    Err(e) => return Err(self.fail(key, "creating the secret", e)),
                }
            }
        }
        let token = layout::token(n);
        let label = layout::version_label(n);
        client::put_value(
            &self.client,
            &secret,
            material.expose(),
            &token,
            &[PENDING, &label],
        )
        .await
        .map_err(|e| match e {
            e if e.is("ResourceExistsException") => KmsError::conflict(
                self,
                key,
                format!("version {n} was staged by another writer with other material"),
            ),
            e => self.fail(key, "staging a version", e),
        })?;
        // A server that does not refuse a token reused with other material (moto) would let
        // a second writer overwrite it: read it back.
        let back = client::get_value(&self.client, &secret, Some(&token))
            .await
            .map_err(|e| self.fail(key, "reading back the staged version", e))?;
        match back {
            Some((_, bytes)) if bytes.as_slice() == material.expose() => Ok(n),
            _ => Err(KmsError::conflict(
                self,
                key,
                format!("version {n} holds other material than keyplan staged: another writer staged it"),
            )),
        }
    }

    async fn commit_async(
        &self,
        key: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        let view = self.load(key).await?;
        let book = view.book();
        if book.current != Some(pending) {
            book::check_holders(self, key, &view.meta.holders, holder, pending)?;
        }
        let decision = book
            .commit(expected_current, pending)
            .map_err(|r| r.conflict(self, key))?;
        let secret = self.secret(key);
        let Some(target) = view.versions.get(&pending).cloned() else {
            return Err(KmsError::NoSuchVersion {
                kms: self.describe(),
                key: key.to_string(),
                version: pending,
            });
        };
        if let Commit::Go { .. } = decision {
            // The serialization point with holders and votes: the record is rewritten with
            // compare-and-swap (and loses its `uncommitted` mark).
            let mut meta = view.meta.clone();
            meta.uncommitted = None;
            self.write_meta(key, &view, &meta).await?;
            if !target.has(CURRENT) {
                let from = view.current().map(|k| k.vid.clone());
                client::move_label(
                    &self.client,
                    &secret,
                    CURRENT,
                    Some(&target.vid),
                    from.as_deref(),
                )
                .await
                .map_err(|e| match e {
                    e if e.is("InvalidParameterException") => KmsError::conflict(
                        self,
                        key,
                        format!(
                            "AWSCURRENT is no longer on version {} (v{}): another writer changed the current version; nothing was committed",
                            from.as_deref().unwrap_or("(none)"),
                            expected_current.map_or("-".into(), |v| v.to_string())
                        ),
                    ),
                    e => self.fail(key, "moving AWSCURRENT to the pending version", e),
                })?;
            }
        }
        if target.has(PENDING) {
            self.unlabel(key, &target.vid, PENDING).await?;
        }
        Ok(())
    }

    async fn change_holders(
        &self,
        key: &str,
        f: impl Fn(&mut Meta, &View) -> Result<bool, KmsError>,
    ) -> Result<(), KmsError> {
        let view = self.load(key).await?;
        let mut meta = view.meta.clone();
        if f(&mut meta, &view)? {
            self.write_meta(key, &view, &meta).await?;
        }
        Ok(())
    }

    async fn retire_async(&self, key: &str, version: u64) -> Result<(), KmsError> {
        let view = self.load(key).await?;
        view.book()
            .retire(version)
            .map_err(|r| r.conflict(self, key))?;
        let Some(k) = view.versions.get(&version).cloned() else {
            return Ok(());
        };
        if !view.meta.retired.contains_key(&version) {
            let mut meta = view.meta.clone();
            meta.retired.insert(version, k.created_at);
            self.write_meta(key, &view, &meta).await?;
        }
        // keyplan's own label last: while it is on, the version reads as not yet retired
        // (`View::live`), so a retire cut short is done again by the next run.
        for label in [PREVIOUS, PENDING, layout::version_label(version).as_str()] {
            if k.has(label) {
                self.unlabel(key, &k.vid, label).await?;
            }
        }
        Ok(())
    }

    async fn destroy_async(&self, key: &str, expected_current: u64) -> Result<(), KmsError> {
        let view = self.load(key).await?;
        match view
            .book()
            .destroy(expected_current)
            .map_err(|r| r.conflict(self, key))?
        {
            Destroy::NothingLeft if !view.exists && view.meta_vid.is_none() => return Ok(()),
            Destroy::NothingLeft | Destroy::Go => {}
        }
        client::delete(&self.client, &self.secret(key))
            .await
            .map_err(|e| self.fail(key, "deleting the secret", e))?;
        client::delete(&self.client, &self.meta_secret(key))
            .await
            .map_err(|e| self.fail(key, "deleting keyplan's record", e))
    }
}

/// 32 random hex digits (a record version's token).
fn random_hex() -> String {
    use rand::RngCore as _;
    let mut b = [0u8; 16];
    rand::rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Kms for AwsKms {
    fn describe(&self) -> String {
        match &self.endpoint {
            Some(e) => format!(
                "AWS Secrets Manager KMS {:?} ({}, {e})",
                self.name, self.region
            ),
            None => format!("AWS Secrets Manager KMS {:?} ({})", self.name, self.region),
        }
    }

    fn read(&self, name: &str) -> Result<KeyState, KmsError> {
        with_retries(&format!("read {name}"), || {
            self.run(async { Ok(self.load(name).await?.key_state()) })
        })
    }

    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        with_retries(&format!("get {name} v{version}"), || {
            self.run(async {
                let view = self.load(name).await?;
                let missing = || KmsError::NoSuchVersion {
                    kms: self.describe(),
                    key: name.to_string(),
                    version,
                };
                let k = view.live(version).ok_or_else(missing)?;
                let (_, bytes): (String, Zeroizing<Vec<u8>>) =
                    client::get_value(&self.client, &self.secret(name), Some(&k.vid))
                        .await
                        .map_err(|e| self.fail(name, &format!("reading v{version}"), e))?
                        .ok_or_else(missing)?;
                Ok(Passphrase::new(bytes.to_vec()))
            })
        })
    }

    fn stage(&self, name: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        self.run(self.stage_async(name, material, at_least))
    }

    fn commit_as(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        self.run(self.commit_async(name, expected_current, pending, holder))
    }

    fn hold(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        self.run(self.change_holders(name, |meta, view| {
            if view.current().is_none() {
                return Err(book::no_current_to_hold(self, name, holder));
            }
            if meta.holders.contains_key(holder) {
                return Ok(false);
            }
            meta.holders
                .insert(holder.to_string(), crate::clock::now_unix());
            Ok(true)
        }))
    }

    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        self.run(self.change_holders(name, |meta, _| Ok(meta.holders.remove(holder).is_some())))
    }

    fn retire(&self, name: &str, version: u64) -> Result<(), KmsError> {
        with_retries(&format!("retire {name} v{version}"), || {
            self.run(self.retire_async(name, version))
        })
    }

    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError> {
        self.run(self.destroy_async(name, expected_current))
    }

    fn retired_means(&self) -> String {
        "keyplan took every label off its secret version, and Secrets Manager deletes such a deprecated version at its own pace; until then its value stays readable by version id to whoever may read the secret (docs/kms/aws-secrets-manager.md, \"Retire\")".to_string()
    }

    fn credentials(&self) -> Result<Vec<Credential>, KmsError> {
        let Some(provider) = self.credentials.clone() else {
            return Ok(Vec::new());
        };
        let creds = self.run(async {
            use sm::config::ProvideCredentials as _;
            provider
                .provide_credentials()
                .await
                .map_err(|e| KmsError::Denied {
                    kms: self.describe(),
                    detail: format!("no AWS credentials: {}", crate::kube_client::chain(&e)),
                })
        })?;
        let expires_at = creds
            .expiry()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_secs());
        Ok(vec![Credential {
            kind: "aws_credentials".into(),
            what: credential_source(),
            expires_at,
            renewed_by: expires_at.map(|_| {
                "the AWS SDK, from its source (web identity token, instance or container role)"
                    .to_string()
            }),
            renewable_until: None,
        }])
    }
}

/// Where the AWS SDK's default chain finds credentials here, for people: the first source it
/// tries that is configured (aws-config's `DefaultCredentialsChain` order).
fn credential_source() -> String {
    let set = |v: &str| std::env::var_os(v).is_some_and(|x| !x.is_empty());
    if set("AWS_ACCESS_KEY_ID") {
        "access key from $AWS_ACCESS_KEY_ID".to_string()
    } else if set("AWS_PROFILE") {
        format!(
            "profile {:?} of the AWS shared config",
            std::env::var("AWS_PROFILE").unwrap_or_default()
        )
    } else if set("AWS_WEB_IDENTITY_TOKEN_FILE") {
        format!(
            "web identity token (role {})",
            std::env::var("AWS_ROLE_ARN").unwrap_or_else(|_| "from the profile".into())
        )
    } else {
        "the AWS SDK's default credential chain".to_string()
    }
}
