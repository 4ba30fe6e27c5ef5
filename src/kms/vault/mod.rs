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
//!     keyplan_format      the layout's version, "2" (src/format/kms/vault.rs; absent: 1)
//!     keyplan_version     keyplan's version number, decimal string
//!     keyplan_created_at  creation time of that version, Unix seconds, decimal string
//!     keyplan_history     compact JSON text: [[keyplan_version, kv_version, created_at], ...]
//!                         for every earlier version (their material is in older KV versions)
//!     keyplan_holders     compact JSON text {"<holder>": since, ...}: the plans holding the
//!                         key (Kms::hold; absent: none)
//! <mount>/data/<name>.keyplan-pending     the PENDING version (only during a rotation)
//!     passphrase, keyplan_format, keyplan_version, keyplan_created_at,
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
//!
//! Files: this one holds the provider's rules (the [`Kms`] operations and the writes of a
//! commit and of holder records); `layout.rs` the layout above (paths, fields, history, how a
//! key reads back); `client.rs` the connection (login, requests, wire types, error mapping);
//! `setup.rs` opening an instance from the plan; `auth.rs` the login methods; `check.rs` the
//! [`Kms::check`] preflight; `leftover.rs` material the record no longer counts on (copies of
//! retired versions, [`Kms::lingering`]). Imports run one way: this file, `check.rs`,
//! `setup.rs` and `leftover.rs` use `layout.rs` and `client.rs`; `layout.rs` uses `client.rs`;
//! `client.rs` uses `auth.rs`.

mod auth;
mod check;
mod client;
mod layout;
mod leftover;
mod setup;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde_json::Value;
use zeroize::Zeroizing;

use super::book::{Commit, Destroy};
use super::{with_retries, Credential, KeyState, Kms, KmsError};
use crate::secret::Passphrase;
use client::{Answer, Read};
use layout::{
    basename, book_of, history_json, holders_json, live_pending, parse_time, pending_path, Hist,
    Live, Main, Pending, PendingRead,
};

pub use auth::{DEFAULT_JWT_FILE, DEFAULT_TOKEN_ENV};
pub use client::VaultKms;
pub use layout::{
    FIELD_BASE, FIELD_BASE_VERSION, FIELD_CREATED_AT, FIELD_DESTROYED_AT, FIELD_FORMAT,
    FIELD_HISTORY, FIELD_HOLDERS, FIELD_PASSPHRASE, FIELD_VERSION, PENDING_SUFFIX,
};
pub use setup::{open, DEFAULT_MOUNT};

/// The layout version keyplan writes into every KV version, as [`FIELD_FORMAT`]'s value
/// (src/format/kms/vault.rs).
const LAYOUT_VERSION: &str = crate::format::kms::vault::VERSION_TEXT;

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
            (FIELD_FORMAT, LAYOUT_VERSION),
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
    /// is a no-op. Other copies of its material go first (older KV versions a holder record
    /// failed to destroy, a committed pending secret left behind): the destroyed flag of the
    /// KV version the history names is the record that says the version is retired, so it
    /// comes last, and retiring again finishes a retire cut short.
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
            if let PendingRead::Found(p) = &pending {
                if p.version == version {
                    self.delete_metadata(&pending_path(name))?;
                }
            }
            for stray in self.strays(name, m)? {
                if stray.version == version {
                    self.destroy_version(name, stray.kv_version)?;
                }
            }
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

    /// Check-and-set on the current version: deletes a committed pending secret left behind
    /// (a copy of material no read counts on), writes a tombstone version with check-and-set,
    /// then deletes all versions and metadata of `<name>`. The tombstone is the record, and it
    /// comes before the key's KV versions are deleted: Vault offers no other check-and-set,
    /// and destroyed versions cannot be brought back should it fail. A destroy killed after
    /// it leaves the earlier KV versions readable ([`Kms::lingering`] reports them) until the
    /// next `destroy_key`, resuming the run, deletes them.
    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError> {
        self.check_name(name)?;
        let pending_name = pending_path(name);
        with_retries(&format!("destroy vault key {name}"), || {
            let (main, pending) = self.read_state(name, true)?;
            let decision = book_of(main.as_ref(), &pending).destroy(expected_current);
            if decision.map_err(|r| r.conflict(self, name))? == Destroy::NothingLeft {
                // Absent, or a tombstone left by an interrupted destroy: finish it (a
                // leftover pending secret first, the tombstone with the key's versions last).
                if !matches!(pending, PendingRead::Absent) {
                    self.delete_metadata(&pending_name)?;
                }
                if main.is_some() {
                    self.delete_metadata(name)?;
                }
                return Ok(());
            }
            if !matches!(pending, PendingRead::Absent) {
                // Not a pending version (the book let the destroy through): a leftover. Gone
                // before the tombstone, it cannot read as a pending version of a destroyed key.
                self.delete_metadata(&pending_name)?;
            }
            let kv_version = main.as_ref().map_or(0, |m| m.kv_version);
            let at = crate::clock::now_unix().to_string();
            let tombstone = BTreeMap::from([
                (FIELD_FORMAT, LAYOUT_VERSION),
                (FIELD_DESTROYED_AT, at.as_str()),
            ]);
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
            self.delete_metadata(name)
        })
    }

    /// Readable KV versions (and a committed pending secret left behind) holding a version
    /// the record calls retired, or any version of a key whose latest KV version is
    /// `destroy_key`'s tombstone: see `leftover.rs`. Reads the key, its metadata and each
    /// such KV version.
    fn lingering(&self, name: &str) -> Result<Vec<u64>, KmsError> {
        self.check_name(name)?;
        with_retries(
            &format!("look for retired material of vault key {name}"),
            || self.lingering_once(name),
        )
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
            kind: "vault_token".into(),
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
            (FIELD_FORMAT, LAYOUT_VERSION),
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
            return Err(super::book::no_current_to_hold(self, name, holder));
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
            (FIELD_FORMAT, LAYOUT_VERSION),
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
