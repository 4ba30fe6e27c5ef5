//! The `kmip` provider's connection: the [`KmipKms`] handle, one TLS session per KMS call,
//! the KMIP operations keyplan sends on it (Locate, Get Attributes, Get, Register, Activate,
//! Revoke, Destroy, Query), and how failures map to [`KmsError`]s. The messages themselves are
//! `ttlv.rs`, the transport `tls.rs`; what keyplan stores in the attributes is `layout.rs`.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};

use kmip_protocol::types::common::{
    AttributeName, KeyFormatType, KeyMaterial, Operation, RevocationReasonCode, UniqueIdentifier,
};
use kmip_protocol::types::request::{Attribute, QueryFunction, RequestPayload, RevocationReason};
use kmip_protocol::types::response::{
    ResponseMessage, ResponsePayload, ResultReason, ResultStatus,
};
use openssl::ssl::{HandshakeError, SslConnector, SslStream};
use openssl::x509::X509VerifyResult;
use zeroize::Zeroize;

use super::tls::{is_timeout, server_alert, tls_connector, DeadlineStream};
use super::ttlv::{encode, reply, request, wire, Fail, Reply};
use crate::kms::{Kms, KmsError};
use crate::secret::Passphrase;

/// Largest KMIP response keyplan accepts (1 MiB): a guard against a misbehaving server.
const MAX_RESPONSE_BYTES: u32 = 1 << 20;

/// A KMIP server reached over mutual TLS (see the module documentation for the object layout).
pub struct KmipKms {
    pub(super) name: String,
    pub(super) endpoint: String,
    host: String,
    port: u16,
    pub(super) client_cert: PathBuf,
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
    /// call's deadline ([`crate::kms::deadline`]).
    fn timed_out(&self, what: String) -> KmsError {
        KmsError::Timeout {
            kms: self.describe(),
            detail: format!(
                "{what}: no answer within {}",
                crate::kms::deadline::limit_text()
            ),
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
    pub(super) fn connect(&self) -> Result<Session<'_>, KmsError> {
        let addrs: Vec<SocketAddr> = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| self.unavailable(format!("cannot resolve {}: {e}", self.host)))?
            .collect();
        let until = std::time::Instant::now() + crate::kms::deadline::remaining();
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
    pub(super) fn fail(&self, what: &str, f: Fail) -> KmsError {
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

/// `host:port` or `[v6]:port` split.
pub(super) fn split_endpoint(endpoint: &str) -> Option<(String, u16)> {
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

/// One TLS connection to the server.
pub(super) struct Session<'a> {
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

    /// Evaluates the `kms.after_write` injection point (crate::failpoint): a writing
    /// operation was answered with success; an injected error is [`KmsError::Unavailable`].
    fn after_write(&self) -> Result<(), Fail> {
        crate::failpoint::check("kms.after_write")
            .map_err(|detail| Fail::Transport(self.kms.unavailable(detail)))
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
    pub(super) fn locate(&mut self, attrs: Vec<Attribute>) -> Result<Vec<String>, Fail> {
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
    pub(super) fn attributes(
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
    pub(super) fn get(&mut self, uid: &str) -> Result<Option<Passphrase>, Fail> {
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
    pub(super) fn register(
        &mut self,
        attrs: Vec<Attribute>,
        material: &[u8],
        bits: i32,
    ) -> Result<String, Fail> {
        let msg = wire::register(attrs, material, wire::Algorithm::HmacSha256, bits);
        let bytes = encode(&msg)?;
        match self.exchange::<ResponseMessage>(Operation::Register, &bytes)? {
            ResponsePayload::Register(p) => {
                self.after_write()?;
                Ok(p.unique_identifier.0)
            }
            _ => Err(Fail::Protocol("unexpected answer to Register".into())),
        }
    }

    /// Activate ([KMIP 1.0 §4.18](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581226)):
    /// Pre-Active becomes Active.
    pub(super) fn activate(&mut self, uid: &str) -> Result<(), Fail> {
        self.call(RequestPayload::Activate(Some(UniqueIdentifier(
            uid.to_string(),
        ))))?;
        self.after_write()
    }

    /// Revoke ([KMIP 1.0 §4.19](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581227))
    /// with `reason` (never Key Compromise): Active becomes Deactivated.
    pub(super) fn revoke(&mut self, uid: &str, reason: RevocationReasonCode) -> Result<(), Fail> {
        self.call(RequestPayload::Revoke(
            Some(UniqueIdentifier(uid.to_string())),
            RevocationReason(reason, None),
            None,
        ))?;
        self.after_write()
    }

    /// Destroy ([KMIP 1.0 §4.20](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581228)):
    /// the key material is gone (PyKMIP deletes the whole object).
    pub(super) fn destroy(&mut self, uid: &str) -> Result<(), Fail> {
        self.call(RequestPayload::Destroy(Some(UniqueIdentifier(
            uid.to_string(),
        ))))?;
        self.after_write()
    }

    /// Query ([KMIP 1.0 §4.24](https://docs.oasis-open.org/kmip/spec/v1.0/os/kmip-spec-1.0-os.html#_Toc262581232)):
    /// the operations the server offers. Writes nothing.
    pub(super) fn query_operations(&mut self) -> Result<Vec<Operation>, Fail> {
        match self.call(RequestPayload::Query(vec![QueryFunction::QueryOperations]))? {
            ResponsePayload::Query(p) => Ok(p.operations.unwrap_or_default()),
            _ => Err(Fail::Protocol("unexpected answer to Query".into())),
        }
    }
}
