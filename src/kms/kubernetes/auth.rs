//! Where the `kubernetes` provider's client credential comes from, as far as its expiry can be
//! known (never the credential itself): what [`crate::kms::Kms::credentials`] reports.

use std::path::Path;

use base64::Engine as _;
use zeroize::Zeroizing;

use crate::kms::Credential;

/// Where the client's credential comes from, as far as its expiry can be known (never the
/// credential itself).
#[derive(Debug, Clone)]
pub(crate) enum AuthSource {
    /// A client certificate file (read again for each report).
    CertFile(std::path::PathBuf),
    /// A client certificate inline in the kubeconfig (`client-certificate-data`): its
    /// notAfter, read when the kubeconfig was loaded.
    CertData(Result<u64, String>),
    /// A bearer token file (`tokenFile`, or the in-cluster projected service-account token),
    /// read again for each report.
    TokenFile(std::path::PathBuf),
    /// A bearer token inline in the kubeconfig: its `exp` claim when it is a JWT.
    Token(Option<u64>),
    /// Something else (an exec plugin, basic auth, nothing): expiry unknown.
    Other,
}

impl AuthSource {
    /// Sorts the client's `auth` settings (certificate first, as kube presents it).
    pub(super) fn of(auth: &kube::config::AuthInfo) -> AuthSource {
        use secrecy::ExposeSecret as _;
        if let Some(data) = &auth.client_certificate_data {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|_| "client-certificate-data is not base64".to_string());
            return AuthSource::CertData(pem.and_then(|p| crate::kms::expiry::pem_not_after(&p)));
        }
        if let Some(path) = &auth.client_certificate {
            return AuthSource::CertFile(path.into());
        }
        if let Some(path) = &auth.token_file {
            return AuthSource::TokenFile(path.into());
        }
        match &auth.token {
            Some(t) => AuthSource::Token(
                crate::kms::expiry::jwt_expiry(t.expose_secret())
                    .ok()
                    .flatten(),
            ),
            None => AuthSource::Other,
        }
    }

    /// The credential of [`Kms::credentials`](crate::kms::Kms::credentials). Errors: a
    /// certificate or token file that cannot be read or parsed (named, never quoted).
    pub(super) fn credential(&self) -> Result<Option<Credential>, String> {
        let cert = |what: String, expires: u64| Credential {
            kind: "client_certificate".into(),
            what,
            expires_at: Some(expires),
            renewed_by: None,
            renewable_until: None,
        };
        Ok(Some(match self {
            AuthSource::CertFile(p) => cert(
                format!("client certificate {}", p.display()),
                crate::kms::expiry::certificate_not_after(p)?,
            ),
            AuthSource::CertData(r) => cert(
                "client certificate of the kubeconfig (client-certificate-data)".to_string(),
                r.clone()
                    .map_err(|e| format!("client-certificate-data: {e}"))?,
            ),
            AuthSource::TokenFile(p) => {
                let token = Zeroizing::new(
                    std::fs::read_to_string(p)
                        .map_err(|e| format!("cannot read token file {}: {e}", p.display()))?,
                );
                let projected = p == Path::new(crate::kms::expiry::PROJECTED_TOKEN_FILE);
                Credential {
                    kind: "service_account_token".into(),
                    what: format!("service-account token {}", p.display()),
                    // A token that is not a JWT (a legacy opaque token) has no known expiry.
                    expires_at: crate::kms::expiry::jwt_expiry(&token).ok().flatten(),
                    renewed_by: projected
                        .then(|| "the kubelet refreshes the projected token".to_string()),
                    renewable_until: None,
                }
            }
            AuthSource::Token(exp) => Credential {
                kind: "bearer_token".into(),
                what: "bearer token of the kubeconfig".to_string(),
                expires_at: *exp,
                renewed_by: None,
                renewable_until: None,
            },
            AuthSource::Other => return Ok(None),
        }))
    }
}
