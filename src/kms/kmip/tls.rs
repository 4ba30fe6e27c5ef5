//! The `kmip` provider's TLS transport: the client configuration (TLS 1.2 or later, trusting
//! only `ca_cert`, presenting `client_cert` with `client_key`), a TCP stream whose every read
//! and write ends by the call's deadline, and what a TLS failure says.

use std::net::TcpStream;
use std::path::Path;

use openssl::ssl::{SslConnector, SslMethod, SslVersion};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;
use zeroize::Zeroizing;

/// The TLS client configuration: TLS 1.2 or later, trusting only the CA certificate(s) in
/// `ca_cert`, presenting `client_cert` (leaf first, then intermediates) with `client_key`.
/// Errors: what is wrong with which file (unreadable, not PEM, a key that does not match the
/// certificate), or why TLS cannot be set up.
pub(super) fn tls_connector(
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

/// A TCP connection whose every read and write ends by `until` (the KMS call's deadline): the
/// socket's timeout is set to what is left before each one, so a server that trickles its
/// answer a byte at a time cannot stretch a call; past `until` a read or write fails at once
/// with [`std::io::ErrorKind::TimedOut`].
#[derive(Debug)]
pub(super) struct DeadlineStream {
    pub(super) tcp: TcpStream,
    pub(super) until: std::time::Instant,
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

/// Whether `e` is a read or write that ran out of time (a socket timeout).
pub(super) fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// The reason text of a TLS alert the peer sent (OpenSSL reports them as "... alert ..."), if
/// that is what `e` is.
pub(super) fn server_alert(e: &openssl::ssl::Error) -> Option<String> {
    e.ssl_error()?
        .errors()
        .iter()
        .filter_map(|x| x.reason())
        .find(|r| r.contains("alert"))
        .map(str::to_string)
}
