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
//!                                   data "created=<unix>;history=1@<unix>,2@<unix>"
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

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};

use kmip_protocol::types::common::{
    ApplicationData, ApplicationNamespace, AttributeName, AttributeValue, KeyFormatType,
    KeyMaterial, Operation, RevocationReasonCode, State, UniqueBatchItemID, UniqueIdentifier,
};
use kmip_protocol::types::request::{
    Attribute, Authentication, BatchCount, BatchItem, MaximumResponseSize, QueryFunction,
    RequestHeader, RequestMessage, RequestPayload, RevocationReason,
};
use kmip_protocol::types::response::{
    ResponseMessage, ResponsePayload, ResultReason, ResultStatus,
};
use openssl::ssl::{HandshakeError, SslConnector, SslMethod, SslStream, SslVersion};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::{X509VerifyResult, X509};
use zeroize::{Zeroize, Zeroizing};

use super::book::{show, Commit, Destroy, VersionBook};
use super::{Credential, KeyState, Kms, KmsError, VersionInfo, VersionState};
use crate::secret::Passphrase;
use crate::spec::KmsConfig;

/// Prefix of the Object Group attribute that gathers the versions of one key.
const GROUP_PREFIX: &str = "keyplan:";
/// Object Group prefix of a key's holder records ([`Kms::hold`]): one small Symmetric Key
/// object per holder, Name `"<key>/holder/<holder id>"`, Application Specific Information
/// `since=<unix>`. Never Activated; destroyed by [`Kms::release`]. Its material is the holder
/// id's bytes (KMIP has no object without material that PyKMIP registers; nothing secret).
const HOLDER_GROUP_PREFIX: &str = "keyplan-holders:";
/// Application Specific Information namespace of keyplan's records.
const APP_NAMESPACE: &str = "keyplan";
/// Field of the Application Specific Information data holding the staging time.
const CREATED_FIELD: &str = "created";
/// Field of the Application Specific Information data listing earlier versions.
const HISTORY_FIELD: &str = "history";
/// Largest KMIP response keyplan accepts (1 MiB): a guard against a misbehaving server.
const MAX_RESPONSE_BYTES: u32 = 1 << 20;
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

/// A KMIP server reached over mutual TLS (see the module documentation for the object layout).
pub struct KmipKms {
    name: String,
    endpoint: String,
    host: String,
    port: u16,
    client_cert: PathBuf,
    connector: SslConnector,
}

impl std::fmt::Debug for KmipKms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KmipKms")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl KmipKms {
    /// A KMIP KMS named `name` (the plan's KMS instance name) at `endpoint` (`host:port`,
    /// `[v6addr]:port`), trusting only the CA certificate(s) in `ca_cert` and presenting
    /// `client_cert` (PEM, leaf first, then any intermediates) with `client_key` (PEM,
    /// unencrypted PKCS#8 or traditional).
    ///
    /// Errors: [`KmsError::Config`] naming the unusable file or setting.
    pub fn new(
        name: &str,
        endpoint: &str,
        ca_cert: &Path,
        client_cert: &Path,
        client_key: &Path,
    ) -> Result<KmipKms, KmsError> {
        let kms = format!("kmip KMS {name:?} ({endpoint})");
        let config = |detail: String| KmsError::Config {
            kms: kms.clone(),
            detail,
        };
        let (host, port) = split_endpoint(endpoint).ok_or_else(|| {
            config(format!(
                "endpoint {endpoint:?} is not host:port (e.g. kmip.example.net:5696, 10.0.0.5:5696 or [fd00::5]:5696)"
            ))
        })?;
        let connector = tls_connector(ca_cert, client_cert, client_key).map_err(config)?;
        Ok(KmipKms {
            name: name.to_string(),
            endpoint: endpoint.to_string(),
            host,
            port,
            client_cert: client_cert.to_path_buf(),
            connector,
        })
    }

    /// The error for `what` (an exchange with the server) that got no answer before the
    /// call's deadline ([`super::deadline`]).
    fn timed_out(&self, what: String) -> KmsError {
        KmsError::Timeout {
            kms: self.describe(),
            detail: format!("{what}: no answer within {}", super::deadline::limit_text()),
        }
    }

    fn unavailable(&self, detail: String) -> KmsError {
        KmsError::Unavailable {
            kms: self.describe(),
            detail,
        }
    }

    /// Opens a TLS session to the server.
    ///
    /// Errors: [`KmsError::Unavailable`] (name resolution, refused, reset),
    /// [`KmsError::Timeout`] (no connection or handshake before the call's deadline),
    /// [`KmsError::Config`] (the server's certificate is not trusted by `ca_cert` or does not
    /// name the endpoint's host), [`KmsError::Denied`] (the server rejected the handshake:
    /// keyplan's client certificate is not accepted).
    fn connect(&self) -> Result<Session<'_>, KmsError> {
        let addrs: Vec<SocketAddr> = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| self.unavailable(format!("cannot resolve {}: {e}", self.host)))?
            .collect();
        let until = std::time::Instant::now() + super::deadline::remaining();
        let mut last = None;
        let mut tcp = None;
        for addr in &addrs {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(addr, left) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let tcp = match tcp {
            Some(t) => t,
            None => {
                return Err(match last {
                    Some(e)
                        if e.kind() == std::io::ErrorKind::TimedOut
                            || std::time::Instant::now() >= until =>
                    {
                        self.timed_out(format!("connecting to {}", self.endpoint))
                    }
                    Some(e) => {
                        self.unavailable(format!("cannot connect to {}: {e}", self.endpoint))
                    }
                    None if !addrs.is_empty() => {
                        self.timed_out(format!("connecting to {}", self.endpoint))
                    }
                    None => self.unavailable(format!("{} resolves to no address", self.host)),
                })
            }
        };
        if let Err(e) = tcp.set_nodelay(true) {
            return Err(self.unavailable(format!("cannot set up the connection: {e}")));
        }
        match self
            .connector
            .connect(&self.host, DeadlineStream { tcp, until })
        {
            Ok(tls) => Ok(Session { kms: self, tls }),
            Err(HandshakeError::SetupFailure(e)) => Err(KmsError::Config {
                kms: self.describe(),
                detail: format!("cannot start TLS: {e}"),
            }),
            Err(HandshakeError::WouldBlock(_)) => {
                Err(self.timed_out(format!("TLS handshake with {}", self.endpoint)))
            }
            Err(HandshakeError::Failure(mid)) => {
                let verify = mid.ssl().verify_result();
                if verify != X509VerifyResult::OK {
                    return Err(KmsError::Config {
                        kms: self.describe(),
                        detail: format!(
                            "the server's TLS certificate is not trusted: {}. ca_cert must hold the CA that signed the KMIP server's certificate, and that certificate must name {:?}",
                            verify.error_string(),
                            self.host
                        ),
                    });
                }
                Err(self.transport_error("TLS handshake", mid.error()))
            }
        }
    }

    /// Maps a TLS-level failure: an alert sent by the server means it refused keyplan's
    /// client certificate ([`KmsError::Denied`]); anything else is [`KmsError::Unavailable`].
    fn transport_error(&self, what: &str, e: &openssl::ssl::Error) -> KmsError {
        if let Some(alert) = server_alert(e) {
            return KmsError::Denied {
                kms: self.describe(),
                detail: format!(
                    "{what}: the server rejected keyplan's TLS client certificate ({alert}). client_cert {} must be signed by a CA the KMIP server trusts, be valid now and carry extendedKeyUsage clientAuth",
                    self.client_cert.display()
                ),
            };
        }
        let detail = match e.io_error() {
            Some(io) if is_timeout(io) => {
                return self.timed_out(format!("{what} with {}", self.endpoint))
            }
            Some(io) => format!("{what} with {}: {io}", self.endpoint),
            None if e.code() == openssl::ssl::ErrorCode::ZERO_RETURN => {
                format!("{what}: {} closed the connection", self.endpoint)
            }
            None => format!("{what} with {}: {e}", self.endpoint),
        };
        self.unavailable(detail)
    }

    /// Maps a failed KMIP exchange for operation `what`.
    fn fail(&self, what: &str, f: Fail) -> KmsError {
        match f {
            Fail::Transport(e) => e,
            Fail::Server { reason, message } => {
                let said = describe_failure(reason, &message);
                match reason {
                    Some(ResultReason::PermissionDenied)
                    | Some(ResultReason::AuthenticationNotSuccessful) => KmsError::Denied {
                        kms: self.describe(),
                        detail: format!(
                            "{what}: {said}. The server's operation policy must let keyplan's client identity (client_cert {}) use this object",
                            self.client_cert.display()
                        ),
                    },
                    Some(ResultReason::GeneralFailure) | None => {
                        self.unavailable(format!("{what}: the server failed: {said}"))
                    }
                    Some(_) => KmsError::Config {
                        kms: self.describe(),
                        detail: format!(
                            "{what}: the server refused keyplan's request: {said}. keyplan needs KMIP 1.0 Symmetric Key objects with algorithm HMAC-SHA256 and the operations Register, Locate, Get, Get Attributes, Activate, Revoke and Destroy"
                        ),
                    },
                }
            }
            Fail::Protocol(detail) => self.unavailable(format!(
                "{what}: {detail} (is {} a KMIP server?)",
                self.endpoint
            )),
            Fail::Local(detail) => KmsError::Config {
                kms: self.describe(),
                detail: format!("{what}: {detail}"),
            },
        }
    }

    /// Every object of key `key` that the server lists (Locate by Object Group, then Get
    /// Attributes of each).
    /// Every object of Object Group `group_name` with its attributes (Locate, then Get
    /// Attributes of each; an object destroyed in between is skipped). `what` names them for
    /// messages.
    fn group_objects(
        &self,
        s: &mut Session<'_>,
        group_name: String,
        what: &str,
    ) -> Result<Vec<(String, Vec<kmip_protocol::types::response::Attribute>)>, KmsError> {
        let uids = s
            .locate(vec![Attribute::ObjectGroup(group_name)])
            .map_err(|f| self.fail(&format!("locating {what}"), f))?;
        let mut out = Vec::with_capacity(uids.len());
        for uid in uids {
            match s.attributes(&uid) {
                Ok(a) => out.push((uid, a)),
                // Destroyed between Locate and Get Attributes.
                Err(Fail::Server {
                    reason: Some(ResultReason::ItemNotFound),
                    ..
                }) => continue,
                Err(f) => {
                    return Err(self.fail(&format!("reading the attributes of object {uid}"), f))
                }
            }
        }
        Ok(out)
    }

    fn objects(&self, s: &mut Session<'_>, key: &str) -> Result<Vec<Obj>, KmsError> {
        let found = self.group_objects(s, group(key), &format!("the versions of {key:?}"))?;
        let mut out: Vec<Obj> = Vec::with_capacity(found.len());
        for (uid, attrs) in found {
            let mut version = None;
            let mut state = None;
            let mut created_at = 0;
            let mut history = Vec::new();
            for a in attrs {
                match a.value {
                    AttributeValue::Name(n, _) if a.name == *"Name" => {
                        if let Some(v) = parse_name(key, &n.0) {
                            version = Some(v);
                        }
                    }
                    AttributeValue::State(st) => state = Some(st),
                    AttributeValue::ApplicationSpecificInformation(ns, data)
                        if ns.0 == APP_NAMESPACE =>
                    {
                        for (field, value) in data.0.split(';').filter_map(|f| f.split_once('=')) {
                            match field.trim() {
                                CREATED_FIELD => created_at = value.trim().parse().unwrap_or(0),
                                HISTORY_FIELD => history.extend(parse_history(value)),
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
            let (Some(version), Some(state)) = (version, state) else {
                tracing::warn!(
                    kms = %self.describe(),
                    key,
                    object = %uid,
                    "object in keyplan's object group has no \"{key}/v<N>\" name or no state; ignored"
                );
                continue;
            };
            if let Some(twin) = out.iter().find(|o| o.version == version) {
                return Err(KmsError::corrupt(
                    self,
                    key,
                    format!(
                        "objects {} and {uid} both hold version {version} (name \"{key}/v{version}\"); nothing was changed. Destroy the one no device was enrolled with, using the KMIP server's own tools",
                        twin.uid
                    ),
                ));
            }
            out.push(Obj {
                uid,
                version,
                state,
                created_at,
                history,
            });
        }
        Ok(out)
    }

    fn read_on(&self, s: &mut Session<'_>, key: &str) -> Result<(Vec<Obj>, KeyState), KmsError> {
        let objs = self.objects(s, key)?;
        let mut st = key_state(&objs);
        st.holders = self
            .holder_objects(s, key)?
            .into_iter()
            .map(|(_, holder, since)| (holder, since))
            .collect();
        Ok((objs, st))
    }

    /// The holder records of `key`: `(object id, holder id, since)` (Locate by the holder
    /// Object Group, then Get Attributes of each).
    fn holder_objects(
        &self,
        s: &mut Session<'_>,
        key: &str,
    ) -> Result<Vec<(String, String, u64)>, KmsError> {
        let found = self.group_objects(
            s,
            format!("{HOLDER_GROUP_PREFIX}{key}"),
            &format!("the holders of {key:?}"),
        )?;
        let prefix = format!("{key}/holder/");
        let mut out = Vec::new();
        for (uid, attrs) in found {
            let mut holder = None;
            let mut since = 0;
            for a in attrs {
                match a.value {
                    AttributeValue::Name(n, _) if a.name == *"Name" => {
                        if let Some(h) = n.0.strip_prefix(&prefix) {
                            holder = Some(h.to_string());
                        }
                    }
                    AttributeValue::ApplicationSpecificInformation(ns, data)
                        if ns.0 == APP_NAMESPACE =>
                    {
                        for (field, value) in data.0.split(';').filter_map(|f| f.split_once('=')) {
                            if field.trim() == "since" {
                                since = value.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    _ => {}
                }
            }
            if let Some(h) = holder {
                out.push((uid, h, since));
            }
        }
        Ok(out)
    }

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
        super::with_retries(&format!("read {name}"), || {
            let mut s = self.connect()?;
            self.read_on(&mut s, name).map(|(_, st)| st)
        })
    }

    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        super::with_retries(&format!("get {name} v{version}"), || {
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
        let history: Vec<String> = st
            .versions
            .values()
            .map(|v| format!("{}@{}", v.version, v.created_at))
            .collect();
        let attributes = vec![
            Attribute::Name(format!("{name}/v{version}")),
            Attribute::ObjectGroup(group(name)),
            Attribute::ApplicationSpecificInformation(
                ApplicationNamespace(APP_NAMESPACE.into()),
                ApplicationData(format!(
                    "{CREATED_FIELD}={};{HISTORY_FIELD}={}",
                    crate::clock::now_unix(),
                    history.join(",")
                )),
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
            return Err(KmsError::conflict(
                self,
                name,
                format!("{holder} cannot be recorded as a holder: the key has no current version"),
            ));
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
                ApplicationData(format!("since={}", crate::clock::now_unix())),
            ),
        ];
        s.register(attributes, holder.as_bytes(), bits)
            .map_err(|f| self.fail(&format!("recording holder {holder} of {name}"), f))?;
        Ok(())
    }

    /// Destroys the holder's record objects.
    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        super::with_retries(&format!("release {name}"), || {
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
        super::with_retries(&format!("retire {name} v{version}"), || {
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
        super::with_retries("check", || {
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
        super::with_retries(&format!("destroy_key {name}"), || {
            let mut s = self.connect()?;
            let (objs, st) = self.read_on(&mut s, name)?;
            let decision = VersionBook::of(&st).destroy(expected_current);
            if decision.map_err(|r| r.conflict(self, name))? == Destroy::NothingLeft {
                // Finish an interrupted destroy_key: its last version was revoked, not destroyed.
                if let Some(o) = objs.iter().find(|o| {
                    o.version == expected_current && state_of(o.state) != VersionState::Retired
                }) {
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
            kind: "client_certificate",
            what: format!("client certificate {}", self.client_cert.display()),
            expires_at: Some(expires),
            renewed_by: None,
            renewable_until: None,
        }])
    }
}

/// The TLS client configuration: TLS 1.2 or later, trusting only the CA certificate(s) in
/// `ca_cert`, presenting `client_cert` (leaf first, then intermediates) with `client_key`.
/// Errors: what is wrong with which file (unreadable, not PEM, a key that does not match the
/// certificate), or why TLS cannot be set up.
fn tls_connector(
    ca_cert: &Path,
    client_cert: &Path,
    client_key: &Path,
) -> Result<SslConnector, String> {
    let ca_pem = read_pem("ca_cert", ca_cert)?;
    let cert_pem = read_pem("client_cert", client_cert)?;
    let key_pem = read_pem("client_key", client_key)?;
    let cas = parse_certs("ca_cert", ca_cert, &ca_pem)?;
    let chain = parse_certs("client_cert", client_cert, &cert_pem)?;
    let key = openssl::pkey::PKey::private_key_from_pem(&key_pem).map_err(|_| {
        format!(
            "client_key {} is not an unencrypted PEM private key",
            client_key.display()
        )
    })?;
    drop(key_pem);
    let tls = |e: openssl::error::ErrorStack| format!("cannot set up TLS: {e}");
    let mut builder = SslConnector::builder(SslMethod::tls_client()).map_err(tls)?;
    builder
        .set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(tls)?;
    let mut store = X509StoreBuilder::new().map_err(tls)?;
    for ca in cas {
        store.add_cert(ca).map_err(|e| {
            format!(
                "ca_cert {}: cannot use a certificate: {e}",
                ca_cert.display()
            )
        })?;
    }
    builder.set_cert_store(store.build());
    let mut chain = chain.into_iter();
    if let Some(leaf) = chain.next() {
        builder.set_certificate(&leaf).map_err(|e| {
            format!(
                "client_cert {}: cannot use the certificate: {e}",
                client_cert.display()
            )
        })?;
    }
    for extra in chain {
        builder.add_extra_chain_cert(extra).map_err(tls)?;
    }
    let mismatch = |_| {
        format!(
            "client_key {} is not the private key of client_cert {}",
            client_key.display(),
            client_cert.display()
        )
    };
    builder.set_private_key(&key).map_err(mismatch)?;
    builder.check_private_key().map_err(mismatch)?;
    Ok(builder.build())
}

/// The bytes of the PEM file `path` (the plan's setting `what`), in a zeroizing buffer.
fn read_pem(what: &str, path: &Path) -> Result<Zeroizing<Vec<u8>>, String> {
    std::fs::read(path).map(Zeroizing::new).map_err(|e| {
        format!(
            "cannot read {what} {}: {e}; fix the path in the plan file",
            path.display()
        )
    })
}

/// The certificates in `pem`, read from `path` (the plan's setting `what`); at least one.
fn parse_certs(what: &str, path: &Path, pem: &[u8]) -> Result<Vec<X509>, String> {
    match X509::stack_from_pem(pem) {
        Ok(v) if !v.is_empty() => Ok(v),
        Ok(_) => Err(format!(
            "{what} {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        )),
        Err(e) => Err(format!(
            "{what} {} is not a PEM certificate file: {e}",
            path.display()
        )),
    }
}

/// One object of a key, as listed by [`KmipKms::objects`].
struct Obj {
    uid: String,
    version: u64,
    state: State,
    created_at: u64,
    history: Vec<(u64, u64)>,
}

/// keyplan's view of a KMIP object state.
fn state_of(s: State) -> VersionState {
    match s {
        State::PreActive => VersionState::Pending,
        State::Active => VersionState::Current,
        State::Deactivated | State::Compromised => VersionState::Previous,
        State::Destroyed | State::DestroyedCompromised => VersionState::Retired,
        // A state newer than KMIP 1.x: not usable as current, material possibly held.
        _ => VersionState::Previous,
    }
}

/// The key's versions: objects as their states say (the highest Active one is current, lower
/// Active ones previous; the highest Pre-Active one is pending), and versions known only from
/// `history` as retired.
fn key_state(objs: &[Obj]) -> KeyState {
    let mut versions = BTreeMap::new();
    for o in objs {
        for &(version, created_at) in &o.history {
            versions.insert(
                version,
                VersionInfo {
                    version,
                    created_at,
                    state: VersionState::Retired,
                },
            );
        }
    }
    let highest = |want: State| {
        objs.iter()
            .filter(|o| o.state == want)
            .map(|o| o.version)
            .max()
    };
    let current = highest(State::Active);
    let pending = highest(State::PreActive);
    for o in objs {
        let state = match state_of(o.state) {
            VersionState::Current if Some(o.version) != current => VersionState::Previous,
            s => s,
        };
        versions.insert(
            o.version,
            VersionInfo {
                version: o.version,
                created_at: o.created_at,
                state,
            },
        );
    }
    KeyState {
        current,
        pending,
        versions,
        holders: BTreeMap::new(),
    }
}

/// The Object Group of key `key`.
fn group(key: &str) -> String {
    format!("{GROUP_PREFIX}{key}")
}

/// The version number in the Name `"<key>/v<N>"`.
fn parse_name(key: &str, name: &str) -> Option<u64> {
    let n = name.strip_prefix(key)?.strip_prefix("/v")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok().filter(|&v| v > 0)
}

/// `"1@1790000000,2@1795000000"` as (version, created_at) pairs; malformed entries are skipped.
fn parse_history(list: &str) -> Vec<(u64, u64)> {
    list.split(',')
        .filter_map(|e| {
            let (v, t) = e.split_once('@')?;
            Some((v.trim().parse().ok()?, t.trim().parse().ok()?))
        })
        .filter(|&(v, _)| v > 0)
        .collect()
}

/// `host:port` or `[v6]:port` split.
fn split_endpoint(endpoint: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(rest) = endpoint.strip_prefix('[') {
        rest.split_once("]:")?
    } else {
        let (h, p) = endpoint.rsplit_once(':')?;
        if h.contains(':') {
            return None;
        }
        (h, p)
    };
    let port: u16 = port.parse().ok().filter(|&p| p > 0)?;
    if host.is_empty() {
        return None;
    }
    Some((host.to_string(), port))
}

/// A TCP connection whose every read and write ends by `until` (the KMS call's deadline): the
/// socket's timeout is set to what is left before each one, so a server that trickles its
/// answer a byte at a time cannot stretch a call; past `until` a read or write fails at once
/// with [`std::io::ErrorKind::TimedOut`].
#[derive(Debug)]
struct DeadlineStream {
    tcp: TcpStream,
    until: std::time::Instant,
}

impl DeadlineStream {
    /// What is left before the deadline.
    ///
    /// Errors: [`std::io::ErrorKind::TimedOut`] when nothing is.
    fn left(&self) -> std::io::Result<std::time::Duration> {
        let left = self
            .until
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the KMS call's deadline passed",
            ))
        } else {
            Ok(left)
        }
    }
}

impl std::io::Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.left()?;
        self.tcp.set_read_timeout(Some(left))?;
        self.tcp.read(buf)
    }
}

impl std::io::Write for DeadlineStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let left = self.left()?;
        self.tcp.set_write_timeout(Some(left))?;
        self.tcp.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// The reason text of a TLS alert the peer sent (OpenSSL reports them as "... alert ..."), if
/// that is what `e` is.
fn server_alert(e: &openssl::ssl::Error) -> Option<String> {
    e.ssl_error()?
        .errors()
        .iter()
        .filter_map(|x| x.reason())
        .find(|r| r.contains("alert"))
        .map(str::to_string)
}

/// The server's failure reason and message, for error texts.
fn describe_failure(reason: Option<ResultReason>, message: &str) -> String {
    let reason = reason.map_or_else(|| "no reason given".to_string(), |r| r.to_string());
    if message.is_empty() {
        reason
    } else {
        format!("{reason}: {message}")
    }
}

/// Why one KMIP exchange failed.
enum Fail {
    /// Network or TLS failure, already mapped (the request may or may not have been executed).
    Transport(KmsError),
    /// The server answered Operation Failed.
    Server {
        reason: Option<ResultReason>,
        message: String,
    },
    /// The answer was not a KMIP response keyplan understands.
    Protocol(String),
    /// keyplan could not build the request.
    Local(String),
}

/// One TLS connection to the server.
struct Session<'a> {
    kms: &'a KmipKms,
    tls: SslStream<DeadlineStream>,
}

impl Session<'_> {
    /// Sends one request (already TTLV-encoded) and returns the payload of its successful
    /// answer, decoded as `R`. `bytes` is zeroized by its owner; the response buffer is
    /// zeroized here.
    fn exchange<R: Reply>(&mut self, op: Operation, bytes: &[u8]) -> Result<R::Payload, Fail> {
        use std::io::Write as _;
        self.tls.write_all(bytes).map_err(|e| self.io_fail(e))?;
        self.tls.flush().map_err(|e| self.io_fail(e))?;
        let config = kmip_protocol::Config::default()
            .with_max_bytes(MAX_RESPONSE_BYTES)
            .with_read_buf();
        let res: Result<R, _> = kmip_ttlv::from_reader(&mut self.tls, &config);
        if let Some(mut buf) = config.read_buf() {
            buf.zeroize();
        }
        let msg = match res {
            Ok(m) => m,
            Err(e) => {
                return Err(match e.kind() {
                    kmip_ttlv::error::ErrorKind::IoError(io) => {
                        let io = std::io::Error::new(io.kind(), io.to_string());
                        self.io_fail(io)
                    }
                    kmip_ttlv::error::ErrorKind::ResponseSizeExceedsLimit(n) => Fail::Protocol(
                        format!("the answer is {n} bytes, more than keyplan accepts"),
                    ),
                    // The decoder's own message may quote the data (key material): not shown.
                    _ => Fail::Protocol(format!("the answer to {op} could not be decoded")),
                });
            }
        };
        let mut items = msg.into_items();
        if items.len() != 1 {
            return Err(Fail::Protocol(format!(
                "the answer to {op} has {} batch items instead of 1",
                items.len()
            )));
        }
        let item = items.remove(0);
        match item.status {
            ResultStatus::Success => {
                if item.operation.is_some_and(|o| o != op) {
                    return Err(Fail::Protocol(format!(
                        "the answer to {op} is for another operation"
                    )));
                }
                item.payload
                    .ok_or_else(|| Fail::Protocol(format!("the answer to {op} has no payload")))
            }
            ResultStatus::OperationFailed => Err(Fail::Server {
                reason: item.reason,
                message: item.message.unwrap_or_default(),
            }),
            other => Err(Fail::Protocol(format!(
                "the answer to {op} has result status {other}, which keyplan does not support"
            ))),
        }
    }

    /// Sends a request built from `kmip-protocol`'s types (no key material in it) and decodes
    /// the answer with `kmip-protocol`'s response types.
    fn call(&mut self, payload: RequestPayload) -> Result<ResponsePayload, Fail> {
        let (op, bytes) = request(payload)?;
        self.exchange::<ResponseMessage>(op, &bytes)
    }

    fn io_fail(&self, e: std::io::Error) -> Fail {
        let inner = e
            .get_ref()
            .and_then(|x| x.downcast_ref::<openssl::ssl::Error>());
        if let Some(ssl) = inner {
            return Fail::Transport(self.kms.transport_error("KMIP request", ssl));
        }
        let detail = if is_timeout(&e) {
            return Fail::Transport(
                self.kms
                    .timed_out(format!("KMIP request to {}", self.kms.endpoint)),
            );
        } else if e.kind() == std::io::ErrorKind::UnexpectedEof {
            format!(
                "KMIP request: {} closed the connection without answering",
                self.kms.endpoint
            )
        } else {
            format!("KMIP request to {}: {e}", self.kms.endpoint)
        };
        Fail::Transport(self.kms.unavailable(detail))
    }

    /// Locate ([KMIP 1.0 §4.8](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581216)):
    /// the unique identifiers of the objects matching every attribute.
    fn locate(&mut self, attrs: Vec<Attribute>) -> Result<Vec<String>, Fail> {
        match self.call(RequestPayload::Locate(attrs))? {
            ResponsePayload::Locate(p) => {
                Ok(p.unique_identifiers.into_iter().map(|u| u.0).collect())
            }
            _ => Err(Fail::Protocol("unexpected answer to Locate".into())),
        }
    }

    /// Get Attributes ([KMIP 1.0 §4.11](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581219))
    /// of `uid`: Name, State and Application Specific Information. (Not Initial Date:
    /// `kmip-ttlv` 0.3.5 cannot decode a Date-Time attribute value.)
    fn attributes(
        &mut self,
        uid: &str,
    ) -> Result<Vec<kmip_protocol::types::response::Attribute>, Fail> {
        let names = ["Name", "State", "Application Specific Information"]
            .iter()
            .map(|n| AttributeName((*n).to_string()))
            .collect();
        match self.call(RequestPayload::GetAttributes(
            Some(UniqueIdentifier(uid.to_string())),
            Some(names),
        ))? {
            ResponsePayload::GetAttributes(p) => Ok(p.attributes.unwrap_or_default()),
            _ => Err(Fail::Protocol("unexpected answer to Get Attributes".into())),
        }
    }

    /// Get ([KMIP 1.0 §4.10](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581218)):
    /// the raw key material of Symmetric Key `uid` (`None` if it is another kind of object).
    fn get(&mut self, uid: &str) -> Result<Option<Passphrase>, Fail> {
        let (op, bytes) = request(RequestPayload::Get(
            Some(UniqueIdentifier(uid.to_string())),
            None,
            None,
            None,
        ))?;
        let p = self.exchange::<reply::GetMessage>(op, &bytes)?;
        let reply::Object::SymmetricKey(key) = p.object;
        let block = key.key_block;
        let material = match block.key_value.key_material {
            KeyMaterial::Bytes(b) if block.key_format_type == KeyFormatType::Raw => {
                Some(Passphrase::new(b))
            }
            KeyMaterial::TransparentSymmetricKey(k) => Some(Passphrase::new(k.key)),
            KeyMaterial::Bytes(mut b) | KeyMaterial::Structure(mut b) => {
                b.zeroize();
                None
            }
            _ => None,
        };
        if p.unique_identifier.0 != uid {
            return Err(Fail::Protocol(format!(
                "the answer to Get is for object {}, not {uid}",
                p.unique_identifier.0
            )));
        }
        Ok(material)
    }

    /// Register ([KMIP 1.0 §4.3](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581211))
    /// of a Symmetric Key (Raw, HMAC-SHA256, `bits` long) holding `material`, with `attrs`;
    /// returns its unique identifier. The object starts Pre-Active.
    fn register(
        &mut self,
        attrs: Vec<Attribute>,
        material: &[u8],
        bits: i32,
    ) -> Result<String, Fail> {
        let msg = wire::register(attrs, material, wire::Algorithm::HmacSha256, bits);
        let bytes = encode(&msg)?;
        match self.exchange::<ResponseMessage>(Operation::Register, &bytes)? {
            ResponsePayload::Register(p) => Ok(p.unique_identifier.0),
            _ => Err(Fail::Protocol("unexpected answer to Register".into())),
        }
    }

    /// Activate ([KMIP 1.0 §4.18](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581226)):
    /// Pre-Active becomes Active.
    fn activate(&mut self, uid: &str) -> Result<(), Fail> {
        self.call(RequestPayload::Activate(Some(UniqueIdentifier(
            uid.to_string(),
        ))))
        .map(|_| ())
    }

    /// Revoke ([KMIP 1.0 §4.19](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581227))
    /// with `reason` (never Key Compromise): Active becomes Deactivated.
    fn revoke(&mut self, uid: &str, reason: RevocationReasonCode) -> Result<(), Fail> {
        self.call(RequestPayload::Revoke(
            Some(UniqueIdentifier(uid.to_string())),
            RevocationReason(reason, None),
            None,
        ))
        .map(|_| ())
    }

    /// Destroy ([KMIP 1.0 §4.20](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581228)):
    /// the key material is gone (PyKMIP deletes the whole object).
    fn destroy(&mut self, uid: &str) -> Result<(), Fail> {
        self.call(RequestPayload::Destroy(Some(UniqueIdentifier(
            uid.to_string(),
        ))))
        .map(|_| ())
    }

    /// Query ([KMIP 1.0 §4.24](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581232)):
    /// the operations the server offers. Writes nothing.
    fn query_operations(&mut self) -> Result<Vec<Operation>, Fail> {
        match self.call(RequestPayload::Query(vec![QueryFunction::QueryOperations]))? {
            ResponsePayload::Query(p) => Ok(p.operations.unwrap_or_default()),
            _ => Err(Fail::Protocol("unexpected answer to Query".into())),
        }
    }
}

/// The TTLV encoding of a one-item request message carrying `payload`, and its operation.
fn request(payload: RequestPayload) -> Result<(Operation, Zeroizing<Vec<u8>>), Fail> {
    let op = payload.operation();
    let msg = RequestMessage(
        RequestHeader(
            payload.protocol_version(),
            Option::<MaximumResponseSize>::None,
            Option::<Authentication>::None,
            BatchCount(1),
        ),
        vec![BatchItem(op, Option::<UniqueBatchItemID>::None, payload)],
    );
    Ok((op, encode(&msg)?))
}

/// TTLV encoding of a request into a zeroizing buffer.
fn encode<T: serde::Serialize>(msg: &T) -> Result<Zeroizing<Vec<u8>>, Fail> {
    kmip_ttlv::to_vec(msg)
        .map(Zeroizing::new)
        .map_err(|e| Fail::Local(format!("cannot encode the KMIP request: {e}")))
}

/// One batch item of a reply, whatever its payload type.
struct ItemParts<P> {
    operation: Option<Operation>,
    status: ResultStatus,
    reason: Option<ResultReason>,
    message: Option<String>,
    payload: Option<P>,
}

/// A KMIP response message type keyplan decodes.
trait Reply: serde::de::DeserializeOwned {
    /// The payload of a successful batch item.
    type Payload;
    /// The batch items.
    fn into_items(self) -> Vec<ItemParts<Self::Payload>>;
}

impl Reply for ResponseMessage {
    type Payload = ResponsePayload;
    fn into_items(self) -> Vec<ItemParts<ResponsePayload>> {
        self.batch_items
            .into_iter()
            .map(|i| ItemParts {
                operation: i.operation,
                status: i.result_status,
                reason: i.result_reason,
                message: i.result_message,
                payload: i.payload,
            })
            .collect()
    }
}

impl Reply for reply::GetMessage {
    type Payload = reply::GetPayload;
    fn into_items(self) -> Vec<ItemParts<reply::GetPayload>> {
        self.batch_items
            .into_iter()
            .map(|i| ItemParts {
                operation: i.operation,
                status: i.result_status,
                reason: i.result_reason,
                message: i.result_message,
                payload: i.payload,
            })
            .collect()
    }
}

/// The Get response as a serde mirror of `kmip-protocol`'s response types (same tags, same
/// field order), reduced to a Symmetric Key whose Key Block ends after the Key Value: the
/// crate's own Key Block cannot decode the HMAC-SHA256 algorithm value (0x00000009), and the
/// fields after the Key Value (algorithm, length) are skipped by `kmip-ttlv` when absent from
/// the Rust type. Fields keyplan does not read are still declared: `kmip-ttlv` matches the
/// items of a structure to the fields by position.
#[allow(dead_code)]
mod reply {
    use kmip_protocol::types::common::{
        KeyCompressionType, KeyFormatType, KeyMaterial, ObjectType, Operation, UniqueBatchItemID,
        UniqueIdentifier,
    };
    use kmip_protocol::types::response::{
        MessageExtension, ResponseHeader, ResultReason, ResultStatus,
    };
    use serde::Deserialize;

    /// Response Message (tag 0x42007B) of a Get.
    #[derive(Deserialize)]
    #[serde(rename = "0x42007B")]
    pub struct GetMessage {
        #[serde(rename = "0x42007A")]
        pub header: ResponseHeader,
        #[serde(rename = "0x42000F")]
        pub batch_items: Vec<GetItem>,
    }

    /// Batch Item (tag 0x42000F).
    #[derive(Deserialize)]
    #[serde(rename = "0x42000F")]
    pub struct GetItem {
        #[serde(rename = "0x42005C")]
        pub operation: Option<Operation>,
        #[serde(rename = "0x420093")]
        pub unique_batch_item_id: Option<UniqueBatchItemID>,
        #[serde(rename = "0x42007F")]
        pub result_status: ResultStatus,
        #[serde(rename = "0x42007E")]
        pub result_reason: Option<ResultReason>,
        #[serde(rename = "0x42007D")]
        pub result_message: Option<String>,
        #[serde(rename = "0x42007C")]
        pub payload: Option<GetPayload>,
        #[serde(rename = "0x420051")]
        pub message_extension: Option<MessageExtension>,
    }

    /// Get Response Payload (tag 0x42007C).
    #[derive(Deserialize)]
    #[serde(rename = "0x42007C")]
    pub struct GetPayload {
        pub object_type: ObjectType,
        pub unique_identifier: UniqueIdentifier,
        pub object: Object,
    }

    /// The managed object, chosen by the Object Type read before it.
    #[derive(Deserialize)]
    pub enum Object {
        /// Symmetric Key.
        #[serde(rename = "if 0x420057==0x00000002")]
        SymmetricKey(SymmetricKey),
    }

    /// Symmetric Key (tag 0x42008F).
    #[derive(Deserialize)]
    #[serde(rename = "0x42008F")]
    pub struct SymmetricKey {
        pub key_block: KeyBlock,
    }

    /// Key Block (tag 0x420040), up to the Key Value.
    #[derive(Deserialize)]
    #[serde(rename = "0x420040")]
    pub struct KeyBlock {
        #[serde(rename = "0x420042")]
        pub key_format_type: KeyFormatType,
        #[serde(rename = "0x420041")]
        pub key_compression_type: Option<KeyCompressionType>,
        #[serde(rename = "0x420045")]
        pub key_value: KeyValue,
    }

    /// Key Value (tag 0x420045).
    #[derive(Deserialize)]
    #[serde(rename = "0x420045")]
    pub struct KeyValue {
        pub key_material: KeyMaterial,
    }
}

/// The Register request as its own serde mirror of `kmip-protocol`'s types, byte-for-byte the
/// same TTLV (see the unit test), with two differences: the Cryptographic Algorithm may be
/// HMAC-SHA256, which `kmip-protocol` 0.4.3 cannot express, and the key material is borrowed,
/// so the only copy made is the zeroized TTLV buffer.
mod wire {
    use kmip_protocol::types::common::{CryptographicLength, KeyFormatType, ObjectType, Operation};
    use kmip_protocol::types::request::{
        Attribute, BatchCount, ProtocolVersion, ProtocolVersionMajor, ProtocolVersionMinor,
        RequestHeader, TemplateAttribute,
    };
    use serde::{Serialize, Serializer};

    /// Request Message (tag 0x420078).
    #[derive(Serialize)]
    #[serde(rename = "0x420078")]
    pub struct Message<'a, A: Serialize>(pub RequestHeader, pub Vec<Item<'a, A>>);

    /// Batch Item (tag 0x42000F).
    #[derive(Serialize)]
    #[serde(rename = "0x42000F")]
    pub struct Item<'a, A: Serialize>(pub Operation, pub Payload<'a, A>);

    /// Register Request Payload (tag 0x420079).
    #[derive(Serialize)]
    #[serde(rename = "0x420079")]
    pub struct Payload<'a, A: Serialize>(pub ObjectType, pub TemplateAttribute, pub Key<'a, A>);

    /// Symmetric Key (tag 0x42008F).
    #[derive(Serialize)]
    #[serde(rename = "0x42008F")]
    pub struct Key<'a, A: Serialize>(pub Block<'a, A>);

    /// Key Block (tag 0x420040).
    #[derive(Serialize)]
    #[serde(rename = "0x420040")]
    pub struct Block<'a, A: Serialize>(
        pub KeyFormatType,
        pub Value<'a>,
        pub A,
        pub CryptographicLength,
    );

    /// Key Value (tag 0x420045).
    #[derive(Serialize)]
    #[serde(rename = "0x420045")]
    pub struct Value<'a>(pub Material<'a>);

    /// Key Material (tag 0x420043) as a byte string.
    #[derive(Serialize)]
    #[serde(rename = "0x420043")]
    pub enum Material<'a> {
        /// Raw bytes.
        #[serde(rename = "Transparent")]
        Bytes(Borrowed<'a>),
    }

    /// Borrowed bytes serialized as a TTLV Byte String.
    pub struct Borrowed<'a>(pub &'a [u8]);

    impl Serialize for Borrowed<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    /// Cryptographic Algorithm (tag 0x420028), KMIP 1.0 §9.1.3.2.13.
    #[derive(Serialize, Clone, Copy)]
    #[serde(rename = "0x420028")]
    pub enum Algorithm {
        /// HMAC-SHA256 (0x00000009): any key length.
        #[serde(rename = "0x00000009")]
        HmacSha256,
    }

    /// The Register request for a Raw Symmetric Key of `bits` bits holding `material`.
    pub fn register<'a, A: Serialize>(
        attrs: Vec<Attribute>,
        material: &'a [u8],
        algorithm: A,
        bits: i32,
    ) -> Message<'a, A> {
        Message(
            RequestHeader(
                ProtocolVersion(ProtocolVersionMajor(1), ProtocolVersionMinor(0)),
                None,
                None,
                BatchCount(1),
            ),
            vec![Item(
                Operation::Register,
                Payload(
                    ObjectType::SymmetricKey,
                    TemplateAttribute::unnamed(attrs),
                    Key(Block(
                        KeyFormatType::Raw,
                        Value(Material::Bytes(Borrowed(material))),
                        algorithm,
                        CryptographicLength(bits),
                    )),
                ),
            )],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kmip_protocol::types::common::{CryptographicAlgorithm, CryptographicLength, ObjectType};
    use kmip_protocol::types::request as rq;
    use kmip_protocol::types::request::TemplateAttribute;

    #[test]
    fn register_mirror_encodes_like_kmip_protocol() {
        let attrs = || {
            vec![
                Attribute::Name("k/v3".into()),
                Attribute::ObjectGroup(group("k")),
            ]
        };
        let material = b"passphrase bytes".to_vec();
        let theirs = RequestMessage(
            RequestHeader(
                rq::ProtocolVersion(rq::ProtocolVersionMajor(1), rq::ProtocolVersionMinor(0)),
                None,
                None,
                BatchCount(1),
            ),
            vec![BatchItem(
                Operation::Register,
                None,
                RequestPayload::Register(
                    ObjectType::SymmetricKey,
                    TemplateAttribute::unnamed(attrs()),
                    Some(rq::ManagedObject::SymmetricKey(rq::SymmetricKey(
                        rq::KeyBlock(
                            KeyFormatType::Raw,
                            None,
                            Some(rq::KeyValue(KeyMaterial::Bytes(material.clone()), None)),
                            Some(CryptographicAlgorithm::AES),
                            Some(CryptographicLength(128)),
                            None,
                        ),
                    ))),
                ),
            )],
        );
        let ours = wire::register(attrs(), &material, CryptographicAlgorithm::AES, 128);
        assert_eq!(
            kmip_ttlv::to_vec(&ours).unwrap(),
            kmip_ttlv::to_vec(&theirs).unwrap()
        );
        // HMAC-SHA256 differs only in the algorithm's enumeration value.
        let a = kmip_ttlv::to_vec(&ours).unwrap();
        let b = kmip_ttlv::to_vec(&wire::register(
            attrs(),
            &material,
            wire::Algorithm::HmacSha256,
            128,
        ))
        .unwrap();
        let diff: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
        assert_eq!(a.len(), b.len());
        assert_eq!(diff.len(), 1);
        assert_eq!((a[diff[0]], b[diff[0]]), (3, 9));
    }

    #[test]
    fn names_history_endpoints() {
        assert_eq!(parse_name("k", "k/v12"), Some(12));
        assert_eq!(parse_name("k", "k/v0"), None);
        assert_eq!(parse_name("k", "kk/v1"), None);
        assert_eq!(parse_name("a/b", "a/b/v2"), Some(2));
        assert_eq!(parse_name("k", "k/v+1"), None);
        assert_eq!(
            parse_history("1@1790000000, 2@1795000000,x@1,3"),
            vec![(1, 1_790_000_000), (2, 1_795_000_000)]
        );
        assert_eq!(parse_history(""), vec![]);
        assert_eq!(
            split_endpoint("127.0.0.1:5696"),
            Some(("127.0.0.1".into(), 5696))
        );
        assert_eq!(split_endpoint("[::1]:5696"), Some(("::1".into(), 5696)));
        assert_eq!(split_endpoint("::1:5696"), None);
        assert_eq!(split_endpoint("host"), None);
        assert_eq!(split_endpoint("host:0"), None);
        assert_eq!(split_endpoint(":5696"), None);
    }

    #[test]
    fn states_map_to_versions() {
        let obj = |version, state| Obj {
            uid: format!("u{version}"),
            version,
            state,
            created_at: 1_800_000_000 + version,
            history: vec![(1, 1_700_000_000)],
        };
        let st = key_state(&[
            obj(2, State::Active),
            obj(3, State::Active),
            obj(4, State::PreActive),
        ]);
        assert_eq!((st.current, st.pending), (Some(3), Some(4)));
        assert_eq!(st.versions[&1].state, VersionState::Retired);
        assert_eq!(st.versions[&1].created_at, 1_700_000_000);
        assert_eq!(st.versions[&2].state, VersionState::Previous);
        assert_eq!(st.versions[&3].state, VersionState::Current);
        assert_eq!(st.versions[&4].state, VersionState::Pending);
        assert_eq!(key_state(&[]), KeyState::default());
    }
}
