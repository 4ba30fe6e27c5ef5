//! The `kmip` KMS provider: key versions as KMIP Symmetric Key objects on a KMIP 1.x server
//! (tested against PyKMIP 0.11), spoken over mutual TLS.
//!
//! Layout (operators' view in `docs/kms/kmip.md`): each version of key `K` is one Symmetric
//! Key object whose key material is the passphrase bytes (Key Format Type Raw, Cryptographic
//! Algorithm HMAC-SHA256, Cryptographic Length 8 × byte length: HMAC keys may have any length,
//! [KMIP 1.0 §3.4/§3.5](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581176)),
//! carrying the attributes
//!
//! ```text
//! Name                              "K/v<N>"           which key and version this is
//! Object Group                      "keyplan:K"        Locate finds every version of K by it
//! Application Specific Information  namespace "keyplan",
//!                                   data "format=2;created=<unix>;history=1@<unix>,2@<unix>"
//!                                   (format: the layout's version, src/format/kms/kmip.rs)
//!                                   when keyplan staged this version (seconds since the
//!                                   epoch, keyplan's clock), and every version of K known
//!                                   then, with its creation time
//! ```
//!
//! States ([KMIP 1.0 §3.17](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581189)):
//! Pre-Active = `pending`, Active = `current`, Deactivated (Revoke, reason Superseded) =
//! `previous`, Destroyed (Revoke + Destroy) = `retired`. `commit` is one Activate: the single
//! atomic point. Servers that delete destroyed objects outright (PyKMIP does) leave no trace of
//! a retired version, so its number and creation time live on in the `history` data of every
//! later version; `read` lists them as `Retired`.
//!
//! Transport: one TLS connection (TLS 1.2 or later, server verified against `ca_cert` only,
//! client certificate `client_cert`/`client_key`) per KMS call; connecting, the handshake
//! and every read and write end by the call's deadline ([`super::deadline`]: the instance's
//! `timeout`, default [`super::REQUEST_TIMEOUT`]), however slowly a server trickles bytes.
//! Requests are built from `kmip-protocol`'s request types and serialized with `kmip-ttlv`;
//! only the Register request has its own small serde mirror, because `kmip-protocol` 0.4.3
//! has no HMAC-SHA256 algorithm value and would copy the key material into a buffer that is
//! never zeroized. keyplan does not use
//! `kmip_protocol::client::Client`: with its TLS helpers it logs every request and response
//! (key material included) as hex at `trace` level through the `log` crate, which keyplan's
//! `KEYPLAN_LOG=trace` would print.
//!
//! Files: this one holds the provider's rules (the [`Kms`] operations, retiring and
//! superseding objects); `layout.rs` what keyplan stores in the objects' attributes and how
//! they read back; `session.rs` the connection and the KMIP operations; `ttlv.rs` the
//! messages; `tls.rs` the TLS transport. Imports run one way: this file uses `layout.rs`,
//! `session.rs` and `ttlv.rs`; `layout.rs` uses `session.rs` and `ttlv.rs`; `session.rs`
//! uses `ttlv.rs` and `tls.rs`.

mod layout;
mod session;
#[cfg(test)]
mod tests;
mod tls;
mod ttlv;

use std::path::Path;

use kmip_protocol::types::common::{
    ApplicationData, ApplicationNamespace, Operation, RevocationReasonCode, State,
};
use kmip_protocol::types::request::Attribute;
use kmip_protocol::types::response::ResultReason;

use super::book::{show, Commit, Destroy, VersionBook};
use super::{with_retries, Credential, KeyState, Kms, KmsError, VersionState};
use crate::format::kms::kmip::AppInfo;
use crate::secret::Passphrase;
use crate::spec::KmsConfig;
use layout::{group, state_of, Obj, APP_NAMESPACE, HOLDER_GROUP_PREFIX};
use session::Session;
use ttlv::Fail;

pub use session::KmipKms;

/// Operations keyplan needs, checked against the server's Query answer by [`Kms::check`].
const NEEDED: [Operation; 7] = [
    Operation::Register,
    Operation::Locate,
    Operation::Get,
    Operation::GetAttributes,
    Operation::Activate,
    Operation::Revoke,
    Operation::Destroy,
];

/// Opens the `kmip` KMS instance `name` configured as `config` (paths already absolute).
///
/// Reads and parses `ca_cert`, `client_cert` and `client_key` (PEM) and builds the TLS client
/// configuration; contacts nothing.
///
/// Errors: [`KmsError::Config`] naming the file that is unreadable or not PEM, a private key that
/// does not match the certificate, or an `endpoint` that is not `host:port`.
pub fn open(name: &str, config: &KmsConfig) -> Result<Box<dyn Kms>, KmsError> {
    match config {
        KmsConfig::Kmip {
            endpoint,
            ca_cert,
            client_cert,
            client_key,
            ..
        } => Ok(Box::new(KmipKms::new(
            name,
            endpoint,
            Path::new(ca_cert),
            Path::new(client_cert),
            Path::new(client_key),
        )?)),
        other => Err(KmsError::misrouted(name, other, "kmip")),
    }
}

impl KmipKms {
    /// Revokes (if Active) and destroys `obj`; an object already gone counts as destroyed.
    fn destroy(
        &self,
        s: &mut Session<'_>,
        key: &str,
        obj: &Obj,
        reason: RevocationReasonCode,
    ) -> Result<(), KmsError> {
        let what = format!("destroying {key} v{} (object {})", obj.version, obj.uid);
        if obj.state == State::Active {
            match s.revoke(&obj.uid, reason) {
                Ok(()) => {}
                Err(Fail::Server {
                    reason: Some(ResultReason::ItemNotFound),
                    ..
                }) => return Ok(()),
                Err(f) => return Err(self.fail(&what, f)),
            }
        }
        if matches!(state_of(obj.state), VersionState::Retired) {
            return Ok(());
        }
        match s.destroy(&obj.uid) {
            Ok(())
            | Err(Fail::Server {
                reason: Some(ResultReason::ItemNotFound),
                ..
            }) => Ok(()),
            Err(f) => Err(self.fail(&what, f)),
        }
    }

    /// Revokes (reason Superseded) each of `objs` that is Active: the old current after a
    /// commit, or a lower Active version left by a commit interrupted between Activate and
    /// Revoke. Failures are logged, not returned: the commit point has passed, `read` already
    /// reports the right current version, and the next writer tries again.
    fn supersede<'o>(
        &self,
        s: &mut Session<'_>,
        key: &str,
        objs: impl IntoIterator<Item = &'o Obj>,
    ) {
        for o in objs.into_iter().filter(|o| o.state == State::Active) {
            if let Err(f) = s.revoke(&o.uid, RevocationReasonCode::Superseded) {
                let e = self.fail(&format!("revoking {key} v{}", o.version), f);
                tracing::warn!(error = %e, "superseded version stays Active for now; keyplan revokes it on its next write");
            }
        }
    }
}

impl Kms for KmipKms {
    fn describe(&self) -> String {
        format!("kmip KMS {:?} ({})", self.name, self.endpoint)
    }

    fn read(&self, name: &str) -> Result<KeyState, KmsError> {
        with_retries(&format!("read {name}"), || {
            let mut s = self.connect()?;
            self.read_on(&mut s, name).map(|(_, st)| st)
        })
    }

    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        with_retries(&format!("get {name} v{version}"), || {
            let mut s = self.connect()?;
            let none = || KmsError::NoSuchVersion {
                kms: self.describe(),
                key: name.to_string(),
                version,
            };
            let objs = self.objects(&mut s, name)?;
            let obj = objs
                .iter()
                .find(|o| o.version == version)
                .ok_or_else(none)?;
            if state_of(obj.state) == VersionState::Retired {
                return Err(none());
            }
            match s.get(&obj.uid) {
                Ok(Some(p)) if !p.is_empty() => Ok(p),
                Ok(_) => Err(KmsError::corrupt(
                    self,
                    name,
                    format!(
                        "object {} (v{version}) holds no raw key material; it was not written by keyplan",
                        obj.uid
                    ),
                )),
                Err(Fail::Server {
                    reason: Some(ResultReason::ItemNotFound),
                    ..
                }) => Err(none()),
                Err(f) => Err(self.fail(&format!("getting {name} v{version}"), f)),
            }
        })
    }

    fn stage(&self, name: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        let mut s = self.connect()?;
        let (objs, st) = self.read_on(&mut s, name)?;
        let version = VersionBook::of(&st).stage(at_least).map_err(|r| {
            match objs.iter().find(|o| Some(o.version) == st.pending) {
                Some(p) => r.conflict_at(self, name, &format!("object {}, Pre-Active", p.uid)),
                None => r.conflict(self, name),
            }
        })?;
        let bits = i32::try_from(material.len())
            .ok()
            .and_then(|n| n.checked_mul(8))
            .filter(|&b| b > 0)
            .ok_or_else(|| KmsError::Config {
                kms: self.describe(),
                detail: format!(
                    "a passphrase of {} bytes cannot be stored as a KMIP key",
                    material.len()
                ),
            })?;
        let history: Vec<(u64, u64)> = st
            .versions
            .values()
            .map(|v| (v.version, v.created_at))
            .collect();
        let attributes = vec![
            Attribute::Name(format!("{name}/v{version}")),
            Attribute::ObjectGroup(group(name)),
            Attribute::ApplicationSpecificInformation(
                ApplicationNamespace(APP_NAMESPACE.into()),
                ApplicationData(AppInfo::version_text(crate::clock::now_unix(), &history)),
            ),
        ];
        let uid = s
            .register(attributes, material.expose(), bits)
            .map_err(|f| self.fail(&format!("registering {name} v{version}"), f))?;
        tracing::debug!(kms = %self.describe(), key = name, version, object = %uid, "staged");
        if let Some(c) = st.current {
            self.supersede(&mut s, name, objs.iter().filter(|o| o.version < c));
        }
        // Another writer may have staged at the same time (between our Locate and Register):
        // then ours is withdrawn and the caller re-reads.
        let after = self.objects(&mut s, name)?;
        let rival = after
            .iter()
            .find(|o| o.uid != uid && (o.state == State::PreActive || o.version == version));
        if let Some(r) = rival {
            let detail = format!(
                "another writer staged v{} (object {}) at the same time; keyplan withdrew its own v{version} (object {uid})",
                r.version, r.uid
            );
            if let Err(f) = s.destroy(&uid) {
                let e = self.fail(&format!("withdrawing {name} v{version}"), f);
                return Err(KmsError::conflict(
                    self,
                    name,
                    format!(
                        "{detail}, but destroying it failed: {e}; destroy object {uid} by hand"
                    ),
                ));
            }
            return Err(KmsError::conflict(self, name, detail));
        }
        Ok(version)
    }

    /// The holder check and the Activate are two requests, like the version check: KMIP 1.x
    /// has no conditional Activate, so a holder recorded in between is not seen (docs/kms/kmip.md).
    fn commit_as(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        let mut s = self.connect()?;
        let (objs, st) = self.read_on(&mut s, name)?;
        if st.current != Some(pending) {
            super::book::check_holders(self, name, &st.holders, holder, pending)?;
        }
        let decision = VersionBook::of(&st).commit(expected_current, pending);
        if decision == Ok(Commit::AlreadyCurrent) {
            // Already committed (a lost reply): only the clean-up may be missing.
            self.supersede(&mut s, name, objs.iter().filter(|o| o.version < pending));
            return Ok(());
        }
        let target = objs.iter().find(|o| o.version == pending);
        if let Some(obj) = target {
            if obj.state == State::Active && st.current == expected_current {
                // A commit of a version below the old current, interrupted after Activate:
                // the old current is still the highest Active one. Finish it.
                self.supersede(&mut s, name, objs.iter().filter(|o| o.uid != obj.uid));
                return Ok(());
            }
        }
        decision.map_err(|r| r.conflict(self, name))?;
        let Some(obj) = target else {
            return Err(KmsError::conflict(
                self,
                name,
                format!("v{pending} vanished"),
            ));
        };
        // The compare-and-swap above and this Activate are two requests: a writer acting in
        // between is caught by the read-back below (KMIP 1.x has no conditional Activate).
        if let Err(f) = s.activate(&obj.uid) {
            // PyKMIP answers Permission Denied when the object is no longer Pre-Active: find
            // out whether somebody else moved it.
            let e = self.fail(
                &format!("activating {name} v{pending} (object {})", obj.uid),
                f,
            );
            if matches!(e, KmsError::Unavailable { .. }) {
                return Err(e);
            }
            let now = self.objects(&mut s, name)?;
            return match now.iter().find(|o| o.uid == obj.uid) {
                Some(o) if o.state == State::PreActive => Err(e),
                _ => Err(KmsError::conflict(
                    self,
                    name,
                    format!(
                        "v{pending} (object {}) was changed by another writer while keyplan committed it",
                        obj.uid
                    ),
                )),
            };
        }
        tracing::debug!(kms = %self.describe(), key = name, version = pending, object = %obj.uid, "committed");
        // The versions that were Active when keyplan read the key are superseded; one another
        // writer activated since then is not touched.
        self.supersede(&mut s, name, objs.iter().filter(|o| o.uid != obj.uid));
        match self.read_on(&mut s, name) {
            Ok((_, after)) if after.current != Some(pending) => Err(KmsError::conflict(
                self,
                name,
                format!(
                    "v{pending} was activated, but another writer made {} current meanwhile",
                    show(after.current)
                ),
            )),
            Ok(_) => Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read back after commit; the commit itself succeeded");
                Ok(())
            }
        }
    }

    /// Registers the holder's record object (see [`HOLDER_GROUP_PREFIX`]), unless one exists.
    fn hold(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        let mut s = self.connect()?;
        let (_, st) = self.read_on(&mut s, name)?;
        if st.current.is_none() {
            return Err(super::book::no_current_to_hold(self, name, holder));
        }
        if st.holders.contains_key(holder) {
            return Ok(());
        }
        let bits = i32::try_from(holder.len() * 8).map_err(|_| KmsError::Config {
            kms: self.describe(),
            detail: format!("holder id {holder:?} is too long"),
        })?;
        let attributes = vec![
            Attribute::Name(format!("{name}/holder/{holder}")),
            Attribute::ObjectGroup(format!("{HOLDER_GROUP_PREFIX}{name}")),
            Attribute::ApplicationSpecificInformation(
                ApplicationNamespace(APP_NAMESPACE.into()),
                ApplicationData(AppInfo::holder_text(crate::clock::now_unix())),
            ),
        ];
        s.register(attributes, holder.as_bytes(), bits)
            .map_err(|f| self.fail(&format!("recording holder {holder} of {name}"), f))?;
        Ok(())
    }

    /// Destroys the holder's record objects.
    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        with_retries(&format!("release {name}"), || {
            let mut s = self.connect()?;
            for (uid, h, _) in self.holder_objects(&mut s, name)? {
                if h != holder {
                    continue;
                }
                match s.destroy(&uid) {
                    Ok(())
                    | Err(Fail::Server {
                        reason: Some(ResultReason::ItemNotFound),
                        ..
                    }) => {}
                    Err(f) => {
                        return Err(self.fail(&format!("removing holder {holder} of {name}"), f))
                    }
                }
            }
            Ok(())
        })
    }

    fn retire(&self, name: &str, version: u64) -> Result<(), KmsError> {
        with_retries(&format!("retire {name} v{version}"), || {
            let mut s = self.connect()?;
            let (objs, st) = self.read_on(&mut s, name)?;
            VersionBook::of(&st)
                .retire(version)
                .map_err(|r| r.conflict(self, name))?;
            match objs.iter().find(|o| o.version == version) {
                Some(o) => self.destroy(&mut s, name, o, RevocationReasonCode::Superseded),
                None => Ok(()),
            }
        })
    }

    fn check(&self, names: &[String]) -> Result<(), KmsError> {
        with_retries("check", || {
            let mut s = self.connect()?;
            let offered = s
                .query_operations()
                .map_err(|f| self.fail("asking the server which operations it offers", f))?;
            let missing: Vec<String> = NEEDED
                .iter()
                .filter(|op| !offered.contains(op))
                .map(|op| op.to_string())
                .collect();
            if !missing.is_empty() {
                return Err(KmsError::Config {
                    kms: self.describe(),
                    detail: format!(
                        "the KMIP server does not offer the operation(s) {}, which keyplan needs",
                        missing.join(", ")
                    ),
                });
            }
            for name in names {
                self.read_on(&mut s, name)?;
            }
            Ok(())
        })
    }

    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError> {
        with_retries(&format!("destroy_key {name}"), || {
            let mut s = self.connect()?;
            let (objs, st) = self.read_on(&mut s, name)?;
            let decision = VersionBook::of(&st).destroy(expected_current);
            if decision.map_err(|r| r.conflict(self, name))? == Destroy::NothingLeft {
                // Finish an interrupted destroy_key (its last version was revoked, not
                // destroyed): no object of a key without a current version may keep material,
                // whichever version the caller expected.
                for o in objs
                    .iter()
                    .filter(|o| state_of(o.state) != VersionState::Retired)
                {
                    self.destroy(&mut s, name, o, RevocationReasonCode::CessationOfOperation)?;
                }
                return Ok(());
            }
            // Older versions first, the current last: an interruption leaves the key current.
            let mut order: Vec<&Obj> = objs.iter().collect();
            order.sort_by_key(|o| (o.version == expected_current, o.version));
            for o in order {
                self.destroy(&mut s, name, o, RevocationReasonCode::CessationOfOperation)?;
            }
            Ok(())
        })
    }

    /// The client certificate's notAfter (read from `client_cert` again, so a certificate
    /// replaced on disk since the plan was loaded is the one reported). Contacts nothing.
    fn credentials(&self) -> Result<Vec<Credential>, KmsError> {
        let expires = super::expiry::certificate_not_after(&self.client_cert).map_err(|e| {
            KmsError::Config {
                kms: self.describe(),
                detail: format!("client_cert: {e}"),
            }
        })?;
        Ok(vec![Credential {
            kind: "client_certificate".into(),
            what: format!("client certificate {}", self.client_cert.display()),
            expires_at: Some(expires),
            renewed_by: None,
            renewable_until: None,
        }])
    }
}
