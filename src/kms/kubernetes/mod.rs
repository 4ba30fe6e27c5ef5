//! The `kubernetes` KMS provider: key versions in core/v1 Secrets, through the `kube` crate.
//!
//! Operators' documentation (layout, what a third-party reader sees, RBAC, failure
//! behaviour): `docs/kms/kubernetes.md`. API semantics relied on, from the Kubernetes API
//! reference (<https://kubernetes.io/docs/reference/kubernetes-api/config-and-storage-resources/secret-v1/>)
//! and the API concepts page (<https://kubernetes.io/docs/reference/using-api/api-concepts/>):
//!
//! - `PUT` of an object whose `metadata.resourceVersion` is not the stored one fails with
//!   409 `Conflict`: optimistic concurrency, keyplan's compare-and-swap (invariant I5);
//! - `POST` of a name that exists fails with 409 `AlreadyExists`;
//! - `DELETE` with `preconditions.resourceVersion`/`uid` fails with 409 when they differ;
//! - a Secret with `immutable: true` refuses any change of `data` (422 `Invalid`);
//! - the `data` of one Secret may hold at most 1 MiB (1048576 bytes, 422 `Invalid` beyond).
//!
//! # Layout (key KMS name = Secret name, a DNS-1123 subdomain)
//!
//! **Mutable layout** (the default): one Secret `<name>`, so that every change is one
//! conditional write (`PUT` with the `resourceVersion` read just before it):
//!
//! ```text
//! Secret <name>     labels      app.kubernetes.io/managed-by: keyplan
//!                   annotations keyplan.io/versions: {"format":1,"current":N|null,"pending":N|null,
//!                                  "versions":[{"version":N,"created_at":UNIX_SECONDS,"state":S}]}
//!                   data        <data_key>   (default dmcrypt-key): the CURRENT passphrase
//!                               keyplan.v<N>: the pending version and retained previous versions
//! ```
//!
//! A Secret without the annotation but with `data[<data_key>]` (a Rook-created Secret) reads as
//! version 1, current, created at the Secret's `creationTimestamp`.
//!
//! **Secret-per-version layout**, used when Secret `<name>` is immutable (keyplan never tries to
//! change an immutable Secret) or when the index Secret below exists:
//!
//! ```text
//! Secret <name>-keyplan  (mutable index, no material; conditional writes)
//!                   annotations keyplan.io/layout: secret-per-version
//!                               keyplan.io/current-secret: <Secret holding the current version>
//!                               keyplan.io/versions: as above, each version also naming its
//!                                  "secret" and "data_key"
//! Secret <name>-v<N>  (immutable, one per version keyplan stages) data[<data_key>] = material
//! Secret <name>       (the original immutable Secret, adopted as version 1 or per its annotation)
//! ```
//!
//! Key material is never logged, never put in error messages, and keyplan's own copies of it
//! (request and response bodies, decoded `data` values) are zeroized after use; buffers inside
//! the HTTP stack are not under keyplan's control.
//!
//! Files: this one holds the provider's rules (the [`Kms`] operations on either layout);
//! `layout.rs` the layouts above (names, annotations, the versions record, how a key reads
//! back, the conditional writes of the record); `client.rs` the API calls, the Secret on the
//! wire and the error mapping; `setup.rs` opening an instance (kubeconfig, client); `auth.rs`
//! where the client's credential comes from. Imports run one way: this file and `setup.rs`
//! use `layout.rs` and `client.rs`; `layout.rs` uses `client.rs`; `client.rs` uses `auth.rs`.

mod auth;
mod client;
mod layout;
mod setup;

use kube::core::params::Preconditions;

use super::book::{self, Commit, Destroy};
use super::{with_retries, Credential, KeyState, Kms, KmsError, VersionState};
use crate::secret::Passphrase;
use client::{CallError, Material, SecretObj};
use layout::{Meta, VersionMeta, View};

pub use client::{KubernetesKms, MAX_SECRET_DATA_BYTES};
pub use layout::{
    CURRENT_SECRET_ANNOTATION, DEFAULT_DATA_KEY, INDEX_SUFFIX, KEY_LABEL, LAYOUT_ANNOTATION,
    LAYOUT_SECRET_PER_VERSION, MANAGED_BY_LABEL, VERSIONS_ANNOTATION, VERSION_DATA_PREFIX,
};
pub use setup::open;

/// How many of a key's newest retired versions [`Kms::lingering`] reads back in the
/// secret-per-version layout (one Secret GET each).
const LINGERING_CHECKED: usize = 4;

impl KubernetesKms {
    fn read_now(&self, key: &str) -> Result<KeyState, KmsError> {
        self.run(async {
            let view = self.load(key).await?;
            if let View::Index { meta, .. } = &view {
                // Like every layout: current and pending must have their material.
                for v in meta.current.iter().chain(meta.pending.iter()) {
                    let m = self.fetch_indexed(key, meta, *v).await?;
                    if m.is_none() {
                        let loc = meta.find(*v).and_then(|x| x.secret.clone()).unwrap_or_default();
                        return Err(KmsError::corrupt(
                            self,
                            key,
                            format!(
                                "the index names {} as the Secret of v{v} (current or pending), but it is missing or has no data[{}]; nothing was changed. Restore it from a backup",
                                self.label(&loc),
                                self.data_key
                            ),
                        ));
                    }
                }
            }
            Ok(view.meta().to_state())
        })
    }

    fn get_now(&self, key: &str, version: u64) -> Result<Passphrase, KmsError> {
        let missing = || KmsError::NoSuchVersion {
            kms: self.describe(),
            key: key.to_string(),
            version,
        };
        let p = self.run(async {
            match self.load(key).await? {
                View::Single { obj, meta } => {
                    let known = meta
                        .find(version)
                        .is_some_and(|v| v.state != VersionState::Retired);
                    let Some(mut obj) = obj.filter(|_| known) else {
                        return Ok(None);
                    };
                    let data_key = if meta.current == Some(version) {
                        self.data_key.clone()
                    } else {
                        format!("{VERSION_DATA_PREFIX}{version}")
                    };
                    Ok(obj.take(&data_key))
                }
                View::Index { meta, .. } => {
                    if meta
                        .find(version)
                        .is_none_or(|v| v.state == VersionState::Retired)
                    {
                        return Ok(None);
                    }
                    self.fetch_indexed(key, &meta, version).await
                }
            }
        })?;
        match p {
            Some(p) if p.is_empty() => Err(KmsError::corrupt(
                self,
                key,
                format!("v{version} is stored empty in namespace {}", self.namespace),
            )),
            Some(p) => Ok(p),
            None => Err(missing()),
        }
    }

    fn stage_now(&self, key: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        self.run(async {
            let view = self.load(key).await?;
            let v = view
                .meta()
                .book()
                .stage(at_least)
                .map_err(|r| r.conflict(self, key))?;
            match view {
                View::Single { obj, mut meta } => {
                    meta.pending = Some(v);
                    meta.versions
                        .push(VersionMeta::new(v, VersionState::Pending));
                    let exists = obj.is_some();
                    let mut obj = obj.unwrap_or_else(|| SecretObj::new(key, &self.namespace));
                    obj.data.insert(
                        format!("{VERSION_DATA_PREFIX}{v}"),
                        Material::copy(material.expose()),
                    );
                    obj.set_label(MANAGED_BY_LABEL, "keyplan");
                    obj.set_annotation(VERSIONS_ANNOTATION, Some(meta.to_json()));
                    let what = format!("staging v{v} of key {key:?} in {}", self.label(key));
                    let r = if exists {
                        self.replace_secret(&obj).await
                    } else {
                        self.create_secret(&obj).await
                    };
                    r.map_err(|e| self.fail(key, &what, e))?;
                    Ok(v)
                }
                View::Index { index, mut meta } => {
                    self.stage_indexed(key, material, v, index, &mut meta).await
                }
            }
        })
    }

    /// Stage in the secret-per-version layout: a new immutable Secret `<key>-v<N>` (`N` from
    /// `first` up), then the index. A `<key>-v<N>` the index does not name (left by an interrupted stage) is skipped
    /// and deleted once the index names the new version (any other writer that made it then
    /// fails its own conditional index write).
    async fn stage_indexed(
        &self,
        key: &str,
        material: &Passphrase,
        first: u64,
        index: Option<SecretObj>,
        meta: &mut Meta,
    ) -> Result<u64, KmsError> {
        let mut v = first;
        let mut orphans = Vec::new();
        let version_secret = loop {
            let secret_name = format!("{key}-v{v}");
            let mut obj = SecretObj::new(&secret_name, &self.namespace);
            obj.immutable = Some(true);
            obj.set_label(MANAGED_BY_LABEL, "keyplan");
            obj.set_label(KEY_LABEL, key);
            obj.set_annotation("keyplan.io/version", Some(v.to_string()));
            obj.data
                .insert(self.data_key.clone(), Material::copy(material.expose()));
            match self.create_secret(&obj).await {
                Ok(_) => break secret_name,
                Err(CallError::Api(st)) if st.code == 409 && orphans.len() < 8 => {
                    tracing::warn!(
                        kms = %self.describe(),
                        secret = %secret_name,
                        "a Secret left by an interrupted stage exists; staging the next version number"
                    );
                    orphans.push(secret_name);
                    v += 1;
                }
                Err(e) => {
                    return Err(self.fail(
                        key,
                        &format!(
                            "staging v{v} of key {key:?} in {}",
                            self.label(&secret_name)
                        ),
                        e,
                    ))
                }
            }
        };
        meta.pending = Some(v);
        let mut entry = VersionMeta::new(v, VersionState::Pending);
        entry.secret = Some(version_secret.clone());
        entry.data_key = Some(self.data_key.clone());
        meta.versions.push(entry);
        let what = format!("recording pending v{v} of key {key:?}");
        if let Err(e) = self.write_index(key, index, meta, &what).await {
            if matches!(e, KmsError::Conflict { .. }) {
                // Refused, so nothing names our version Secret: remove it.
                if let Err(d) = self.delete_secret(&version_secret, None).await {
                    tracing::warn!(kms = %self.describe(), secret = %version_secret, error = %d, "cannot remove the unused version Secret");
                }
            }
            return Err(e);
        }
        for orphan in orphans {
            if let Err(e) = self.delete_secret(&orphan, None).await {
                tracing::warn!(kms = %self.describe(), secret = %orphan, error = %e, "cannot remove a Secret left by an interrupted stage");
            }
        }
        Ok(v)
    }

    fn commit_now(
        &self,
        key: &str,
        expected: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        self.run(async {
            let view = self.load(key).await?;
            if view.meta().current != Some(pending) {
                book::check_holders(self, key, &view.meta().holders, holder, pending)?;
            }
            let decision = view.meta().book().commit(expected, pending);
            let Commit::Go { previous } = decision.map_err(|r| r.conflict(self, key))? else {
                return Ok(());
            };
            let what = format!("committing v{pending} of key {key:?}");
            match view {
                View::Single { obj, mut meta } => {
                    let Some(mut obj) = obj else {
                        return Err(KmsError::conflict(self, key, format!("{} disappeared", self.label(key))));
                    };
                    let Some(new) = obj.data.remove(&format!("{VERSION_DATA_PREFIX}{pending}")) else {
                        return Err(KmsError::corrupt(self, key, format!("{}: data[{VERSION_DATA_PREFIX}{pending}] is missing; nothing was changed", self.label(key))));
                    };
                    if let Some(old) = previous {
                        let Some(old_material) = obj.data.remove(&self.data_key) else {
                            return Err(KmsError::corrupt(self, key, format!("{}: data[{}] is missing; nothing was changed", self.label(key), self.data_key)));
                        };
                        obj.data
                            .insert(format!("{VERSION_DATA_PREFIX}{old}"), old_material);
                    }
                    obj.data.insert(self.data_key.clone(), new);
                    (meta.current, meta.pending) =
                        book::commit_states(&mut meta.versions, previous, pending);
                    obj.set_label(MANAGED_BY_LABEL, "keyplan");
                    self.write_single(key, obj, &meta, &what).await
                }
                View::Index { index, mut meta } => {
                    (meta.current, meta.pending) =
                        book::commit_states(&mut meta.versions, previous, pending);
                    self.write_index(key, index, &meta, &what).await
                }
            }
        })
    }

    /// Adds (`Some`) or removes (`None`) the holder record of `holder`, a conditional write of
    /// the annotation where the versions are (the Secret, or the index Secret).
    fn holder_now(&self, key: &str, holder: &str, add: bool) -> Result<(), KmsError> {
        self.run(async {
            let view = self.load(key).await?;
            let meta = view.meta();
            if add && meta.current.is_none() {
                return Err(super::book::no_current_to_hold(self, key, holder));
            }
            if meta.holders.contains_key(holder) == add {
                return Ok(());
            }
            let what = format!(
                "{} holder {holder} of key {key:?}",
                if add { "recording" } else { "removing" }
            );
            let edit = |meta: &mut Meta| {
                if add {
                    meta.holders
                        .insert(holder.to_string(), crate::clock::now_unix());
                } else {
                    meta.holders.remove(holder);
                }
            };
            match view {
                View::Single { obj, mut meta } => {
                    let Some(mut obj) = obj else {
                        return Ok(());
                    };
                    edit(&mut meta);
                    obj.set_label(MANAGED_BY_LABEL, "keyplan");
                    self.write_single(key, obj, &meta, &what).await
                }
                View::Index { index, mut meta } => {
                    edit(&mut meta);
                    self.write_index(key, index, &meta, &what).await
                }
            }
        })
    }

    fn retire_now(&self, key: &str, version: u64) -> Result<(), KmsError> {
        self.run(async {
            let view = self.load(key).await?;
            view.meta()
                .book()
                .retire(version)
                .map_err(|r| r.conflict(self, key))?;
            let what = format!("retiring v{version} of key {key:?}");
            match view {
                View::Single { obj, mut meta } => {
                    let Some(mut obj) = obj else {
                        return Ok(());
                    };
                    let had = obj
                        .data
                        .remove(&format!("{VERSION_DATA_PREFIX}{version}"))
                        .is_some();
                    let marked = meta
                        .find(version)
                        .is_none_or(|v| v.state == VersionState::Retired);
                    if !had && marked {
                        return Ok(());
                    }
                    book::retire_state(&mut meta.versions, version);
                    self.write_single(key, obj, &meta, &what).await
                }
                View::Index { index, mut meta } => {
                    let Some(entry) = meta.find(version).cloned() else {
                        return Ok(());
                    };
                    // The material first, then the record that says it is gone: killed in
                    // between, the version reads as previous without material (`get`: no
                    // such version) and the next retire records it; never retired with its
                    // Secret still readable. (A version never becomes current again, so
                    // deleting before the conditional index write is safe.)
                    let secret = entry.secret.as_deref();
                    self.delete_unused(key, &meta, secret, Some(version), &what)
                        .await?;
                    if entry.state != VersionState::Retired {
                        book::retire_state(&mut meta.versions, version);
                        self.write_index(key, index, &meta, &what).await?;
                    }
                    Ok(())
                }
            }
        })
    }

    /// Deletes version Secret `secret` unless a version that is not retired (other than
    /// `retiring`, the one being retired) still lives in it.
    async fn delete_unused(
        &self,
        key: &str,
        meta: &Meta,
        secret: Option<&str>,
        retiring: Option<u64>,
        what: &str,
    ) -> Result<(), KmsError> {
        let Some(secret) = secret else {
            return Ok(());
        };
        let in_use = meta.versions.iter().any(|v| {
            v.state != VersionState::Retired
                && Some(book::Entry::number(v)) != retiring
                && v.secret.as_deref() == Some(secret)
        });
        if in_use {
            return Ok(());
        }
        self.delete_secret(secret, None)
            .await
            .map(|_| ())
            .map_err(|e| self.fail(key, &format!("{what}: deleting {}", self.label(secret)), e))
    }

    fn destroy_now(&self, key: &str, expected: u64) -> Result<(), KmsError> {
        self.run(async {
            let view = self.load(key).await?;
            let decision = view.meta().book().destroy(expected);
            let decision = decision.map_err(|r| r.conflict(self, key))?;
            let what = format!("destroying key {key:?}");
            match view {
                View::Single { .. } if decision == Destroy::NothingLeft => Ok(()),
                View::Single { obj, .. } => {
                    let Some(mut obj) = obj else {
                        return Ok(());
                    };
                    let ours =
                        |k: &String| k == &self.data_key || k.starts_with(VERSION_DATA_PREFIX);
                    if obj.data.keys().all(ours) {
                        let pre = Preconditions {
                            resource_version: obj.metadata.resource_version.clone(),
                            uid: obj.metadata.uid.clone(),
                        };
                        self.delete_secret(key, Some(pre)).await.map_err(|e| {
                            self.fail(key, &format!("{what}: deleting {}", self.label(key)), e)
                        })?;
                    } else {
                        // Other data lives in this Secret: remove only keyplan's part.
                        obj.data.retain(|k, _| !ours(k));
                        obj.set_annotation(VERSIONS_ANNOTATION, None);
                        self.replace_secret(&obj).await.map_err(|e| {
                            self.fail(key, &format!("{what} in {}", self.label(key)), e)
                        })?;
                    }
                    Ok(())
                }
                View::Index { index, mut meta } => {
                    // The record first here: the conditional index write is the
                    // compare-and-swap, and a version Secret deleted before it could not be
                    // brought back if it lost. Killed in between, the versions read as
                    // retired with their Secrets left: `lingering` reports them, and the next
                    // destroy_key (resuming the run) deletes them below.
                    if decision == Destroy::Go {
                        (meta.current, meta.pending) = book::destroy_states(&mut meta.versions);
                        self.write_index(key, index, &meta, &what).await?;
                    }
                    // Also finishes an interrupted destroy: no version is left in use.
                    let mut secrets: Vec<&str> = meta
                        .versions
                        .iter()
                        .filter_map(|v| v.secret.as_deref())
                        .collect();
                    secrets.sort_unstable();
                    secrets.dedup();
                    for s in secrets {
                        self.delete_unused(key, &meta, Some(s), None, &what).await?;
                    }
                    Ok(())
                }
            }
        })
    }

    fn check_now(&self, names: &[String]) -> Result<(), KmsError> {
        let mut targets = Vec::new();
        for key in names {
            let view = self.run(self.load(key))?;
            targets.push(match view {
                View::Single { .. } => key.clone(),
                View::Index { .. } => format!("{key}{INDEX_SUFFIX}"),
            });
        }
        self.run(async {
            let mut missing = Vec::new();
            let mut asks: Vec<(&str, Option<&str>)> = vec![("create", None)];
            for t in &targets {
                for verb in ["get", "update", "delete"] {
                    asks.push((verb, Some(t.as_str())));
                }
            }
            for (verb, name) in asks {
                let (ok, why) = self.may(verb, name).await.map_err(|e| {
                    self.fail(
                        name.unwrap_or_default(),
                        &format!("asking the API server whether keyplan may {verb} Secrets (SelfSubjectAccessReview)"),
                        e,
                    )
                })?;
                if !ok {
                    let what = match name {
                        Some(n) => format!("{verb} Secret {n}"),
                        None => format!("{verb} Secrets"),
                    };
                    missing.push(if why.is_empty() { what } else { format!("{what} ({why})") });
                }
            }
            if missing.is_empty() {
                Ok(())
            } else {
                Err(KmsError::Denied {
                    kms: self.describe(),
                    detail: format!(
                        "keyplan's identity may not {} in namespace {} (SelfSubjectAccessReview); keyplan needs get, create, update and delete on Secrets there",
                        missing.join(", "),
                        self.namespace
                    ),
                })
            }
        })
    }
}

impl Kms for KubernetesKms {
    fn describe(&self) -> String {
        format!(
            "kubernetes KMS {:?} ({}, namespace {})",
            self.name, self.cluster_url, self.namespace
        )
    }

    fn read(&self, name: &str) -> Result<KeyState, KmsError> {
        with_retries(&format!("read {name}"), || self.read_now(name))
    }

    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        with_retries(&format!("get {name} v{version}"), || {
            self.get_now(name, version)
        })
    }

    fn stage(&self, name: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        self.stage_now(name, material, at_least)
    }

    fn commit_as(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        self.commit_now(name, expected_current, pending, holder)
    }

    /// Records the holder in the `keyplan.io/versions` annotation (conditional `PUT`).
    fn hold(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        self.holder_now(name, holder, true)
    }

    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        with_retries(&format!("release {name}"), || {
            self.holder_now(name, holder, false)
        })
    }

    fn retire(&self, name: &str, version: u64) -> Result<(), KmsError> {
        with_retries(&format!("retire {name} v{version}"), || {
            self.retire_now(name, version)
        })
    }

    /// Reads each key, then asks the API server with SelfSubjectAccessReviews (which persist
    /// nothing) whether keyplan may `create` Secrets in the namespace and `get`, `update` and
    /// `delete` the Secret it writes for each key (`<name>`, or the index `<name>-keyplan`).
    fn check(&self, names: &[String]) -> Result<(), KmsError> {
        with_retries("check", || self.check_now(names))
    }

    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError> {
        with_retries(&format!("destroy {name}"), || {
            self.destroy_now(name, expected_current)
        })
    }

    /// Versions the record calls retired whose material is still there (in the
    /// secret-per-version layout, among the [`LINGERING_CHECKED`] newest retired ones): a `keyplan.v<N>`
    /// entry in the Secret (mutable layout), or a version Secret that still holds its data
    /// (secret-per-version layout: a destroy_key interrupted between the index and the
    /// deletions, or a version sharing an immutable Secret with a version still in use).
    fn lingering(&self, name: &str) -> Result<Vec<u64>, KmsError> {
        self.run(async {
            let view = self.load(name).await?;
            let meta = view.meta();
            let retired = meta
                .versions
                .iter()
                .filter(|v| v.state == VersionState::Retired)
                .map(book::Entry::number);
            let mut out = Vec::new();
            match &view {
                View::Single { obj, .. } => {
                    let Some(obj) = obj else {
                        return Ok(out);
                    };
                    out.extend(
                        retired.filter(|n| {
                            obj.data.contains_key(&format!("{VERSION_DATA_PREFIX}{n}"))
                        }),
                    );
                }
                View::Index { .. } => {
                    // One GET per version Secret: only the newest retired versions, which an
                    // interrupted retire or destroy leaves (bounded requests per `status`,
                    // which the fleet agent runs every cycle).
                    let mut newest: Vec<u64> = retired.collect();
                    newest.sort_unstable_by(|a, b| b.cmp(a));
                    newest.truncate(LINGERING_CHECKED);
                    for n in newest {
                        if self.fetch_indexed(name, meta, n).await?.is_some() {
                            out.push(n);
                        }
                    }
                }
            }
            Ok(out)
        })
    }

    /// The kubeconfig's client certificate (notAfter) or bearer token (`exp` when it is a
    /// JWT; the in-cluster projected token is refreshed by the kubelet). Contacts nothing.
    fn credentials(&self) -> Result<Vec<Credential>, KmsError> {
        self.auth
            .credential()
            .map(|c| c.into_iter().collect())
            .map_err(|detail| KmsError::Config {
                kms: self.describe(),
                detail,
            })
    }
}
