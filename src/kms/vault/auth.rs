//! How the `vault` provider gets its token (the plan's `auth`, docs/kms/vault.md
//! "Authentication"): a static token from an environment variable, or a login done once per
//! process, on the first request, with one of
//!
//! - AppRole: `POST auth/<mount>/login` with `role_id` and `secret_id`
//!   (<https://openbao.org/api-docs/auth/approle/#login-with-approle>);
//! - Kubernetes: `POST auth/<mount>/login` with `role` and the service account's JWT, which
//!   the server checks with a TokenReview (<https://openbao.org/api-docs/auth/kubernetes/#login>);
//! - TLS certificate: `POST auth/<mount>/login` over mutual TLS with the client certificate
//!   (<https://openbao.org/api-docs/auth/cert/#login-with-tls-certificate-method>).
//!
//! Secret IDs, JWTs and tokens are read into zeroized buffers at login and never logged or
//! put in messages; files and variables are named instead.

use std::path::{Path, PathBuf};

use vaultrs::api::AuthInfo;
use vaultrs::client::VaultClient;
use vaultrs::error::ClientError;
use zeroize::Zeroizing;

use super::super::{expiry, Credential};
use crate::spec::VaultAuth;

/// Environment variable holding the token when neither `token_env` nor `auth` names one.
pub const DEFAULT_TOKEN_ENV: &str = "VAULT_TOKEN";
/// The default `jwt_file` of Kubernetes login: the projected service-account token the
/// kubelet mounts into every pod ([`expiry::PROJECTED_TOKEN_FILE`]).
pub const DEFAULT_JWT_FILE: &str = expiry::PROJECTED_TOKEN_FILE;

/// Where a login value comes from.
#[derive(Debug, Clone)]
pub(super) enum Origin {
    /// Written in the plan (only the AppRole role ID, which is not a secret).
    Plan(String),
    /// A file, read at each login; surrounding whitespace is dropped.
    File(PathBuf),
    /// An environment variable, read at each login.
    Env(String),
}

impl Origin {
    /// The value, trimmed. Errors: a text naming the file or variable (never the value) when
    /// it cannot be read, is empty or is not UTF-8.
    fn read(&self, what: &str) -> Result<Zeroizing<String>, String> {
        let value = match self {
            Origin::Plan(v) => Zeroizing::new(v.clone()),
            Origin::File(path) => {
                let bytes =
                    Zeroizing::new(std::fs::read(path).map_err(|e| {
                        format!("cannot read the {what} file {}: {e}", path.display())
                    })?);
                Zeroizing::new(
                    std::str::from_utf8(&bytes)
                        .map_err(|_| {
                            format!("the {what} file {} is not UTF-8 text", path.display())
                        })?
                        .to_string(),
                )
            }
            Origin::Env(var) => Zeroizing::new(std::env::var(var).map_err(|_| {
                format!("the environment variable {var} (the {what}) is not set or not UTF-8")
            })?),
        };
        let trimmed = Zeroizing::new(value.trim().to_string());
        if trimmed.is_empty() {
            return Err(format!("the {what} from {} is empty", self.describe()));
        }
        Ok(trimmed)
    }

    /// `file /x/y`, `$VAR` or `the plan`, for messages.
    fn describe(&self) -> String {
        match self {
            Origin::Plan(_) => "the plan".to_string(),
            Origin::File(p) => format!("file {}", p.display()),
            Origin::Env(v) => format!("${v}"),
        }
    }
}

/// A Vault instance's way of getting its token, resolved from the plan (paths absolute).
#[derive(Debug, Clone)]
pub(super) enum Auth {
    /// A static token from the environment variable `env`.
    Token {
        /// The variable's name.
        env: String,
    },
    /// AppRole login.
    AppRole {
        /// Auth mount path.
        mount: String,
        /// The role ID.
        role_id: Origin,
        /// The secret ID.
        secret_id: Origin,
    },
    /// Kubernetes login.
    Kubernetes {
        /// Auth mount path.
        mount: String,
        /// The Vault role.
        role: String,
        /// The service account token file.
        jwt_file: PathBuf,
    },
    /// TLS certificate login (the client presents `client_cert` on every connection).
    Cert {
        /// Auth mount path.
        mount: String,
        /// The certificate role, if one is named.
        name: Option<String>,
        /// The client certificate (PEM), for its notAfter.
        client_cert: PathBuf,
    },
}

impl Auth {
    /// The way the plan's `auth` (or the short form `token_env`) says.
    pub(super) fn from_config(auth: Option<&VaultAuth>, token_env: Option<&str>) -> Auth {
        let mount = |m: &Option<String>, default: &str| {
            m.as_deref()
                .map(|m| m.trim_matches('/').to_string())
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| default.to_string())
        };
        match auth {
            None => Auth::Token {
                env: token_env.unwrap_or(DEFAULT_TOKEN_ENV).to_string(),
            },
            Some(VaultAuth::Token { token_env }) => Auth::Token {
                env: token_env
                    .as_deref()
                    .unwrap_or(DEFAULT_TOKEN_ENV)
                    .to_string(),
            },
            Some(VaultAuth::Approle {
                mount: m,
                role_id,
                role_id_file,
                secret_id_file,
                secret_id_env,
            }) => Auth::AppRole {
                mount: mount(m, "approle"),
                role_id: match (role_id, role_id_file) {
                    (Some(v), _) => Origin::Plan(v.clone()),
                    (None, Some(f)) => Origin::File(f.into()),
                    (None, None) => Origin::Plan(String::new()),
                },
                secret_id: match (secret_id_file, secret_id_env) {
                    (Some(f), _) => Origin::File(f.into()),
                    (None, Some(v)) => Origin::Env(v.clone()),
                    (None, None) => Origin::Env("VAULT_SECRET_ID".to_string()),
                },
            },
            Some(VaultAuth::Kubernetes {
                mount: m,
                role,
                jwt_file,
            }) => Auth::Kubernetes {
                mount: mount(m, "kubernetes"),
                role: role.trim().to_string(),
                jwt_file: jwt_file.as_deref().unwrap_or(DEFAULT_JWT_FILE).into(),
            },
            Some(VaultAuth::Cert {
                mount: m,
                name,
                client_cert,
                ..
            }) => Auth::Cert {
                mount: mount(m, "cert"),
                name: name.clone().filter(|n| !n.trim().is_empty()),
                client_cert: client_cert.into(),
            },
        }
    }

    /// Whether the token comes from a login (rather than a static token).
    pub(super) fn is_login(&self) -> bool {
        !matches!(self, Auth::Token { .. })
    }

    /// Where the token comes from, for messages: `the token from $VAULT_TOKEN`, `the token of
    /// the AppRole login (mount approle)`, ...
    pub(super) fn token_origin(&self) -> String {
        match self {
            Auth::Token { env } => format!("the token from ${env}"),
            Auth::AppRole { mount, .. } => {
                format!("the token of the AppRole login (mount {mount})")
            }
            Auth::Kubernetes { mount, role, .. } => {
                format!("the token of the Kubernetes login (mount {mount}, role {role})")
            }
            Auth::Cert { mount, .. } => {
                format!("the token of the certificate login (mount {mount})")
            }
        }
    }

    /// The login request, for messages, e.g. `logging in with AppRole (POST
    /// auth/approle/login, role_id from file /etc/keyplan/role-id, secret_id from $SECRET_ID)`.
    pub(super) fn login_what(&self) -> String {
        match self {
            Auth::Token { env } => format!("using the token from ${env}"),
            Auth::AppRole {
                mount,
                role_id,
                secret_id,
            } => format!(
                "logging in with AppRole (POST auth/{mount}/login, role_id from {}, secret_id from {})",
                role_id.describe(),
                secret_id.describe()
            ),
            Auth::Kubernetes {
                mount,
                role,
                jwt_file,
            } => format!(
                "logging in with Kubernetes auth (POST auth/{mount}/login, role {role}, service account token from {})",
                jwt_file.display()
            ),
            Auth::Cert {
                mount,
                name,
                client_cert,
            } => format!(
                "logging in with the TLS certificate {} (POST auth/{mount}/login{})",
                client_cert.display(),
                name.as_deref()
                    .map(|n| format!(", certificate role {n}"))
                    .unwrap_or_default()
            ),
        }
    }

    /// What to check when the server refuses the login (HTTP 400/401/403).
    pub(super) fn refused_hint(&self) -> String {
        match self {
            Auth::Token { env } => format!(
                "the token from ${env} is invalid or expired; export a valid one"
            ),
            Auth::AppRole { mount, .. } => format!(
                "check that role_id and secret_id belong to a role of the AppRole mount {mount:?} and that the secret ID has not expired or been used up (`bao write -f auth/{mount}/role/<role>/secret-id` issues a new one)"
            ),
            Auth::Kubernetes {
                mount,
                role,
                jwt_file,
            } => format!(
                "check that role {role:?} exists on the Kubernetes auth mount {mount:?} and is bound to this service account and namespace (`bao read auth/{mount}/role/{role}`), and that {} holds a current service account token",
                jwt_file.display()
            ),
            Auth::Cert {
                mount, client_cert, ..
            } => format!(
                "check that a certificate role of the cert auth mount {mount:?} trusts the client certificate {} and that it has not expired",
                client_cert.display()
            ),
        }
    }

    /// Performs the login on `client` (which carries no token; for certificate login it
    /// presents the client certificate). The outer error: a local file or variable cannot be
    /// read (a text naming it); the inner one: the server's answer.
    pub(super) async fn login(
        &self,
        client: &VaultClient,
    ) -> Result<Result<AuthInfo, ClientError>, String> {
        Ok(match self {
            Auth::Token { .. } => return Err("a static token needs no login".to_string()),
            Auth::AppRole {
                mount,
                role_id,
                secret_id,
            } => {
                let role_id = role_id.read("AppRole role ID")?;
                let secret_id = secret_id.read("AppRole secret ID")?;
                vaultrs::auth::approle::login(client, mount, &role_id, &secret_id).await
            }
            Auth::Kubernetes {
                mount,
                role,
                jwt_file,
            } => {
                let jwt = Origin::File(jwt_file.clone()).read("service account token")?;
                vaultrs::auth::kubernetes::login(client, mount, role, &jwt).await
            }
            Auth::Cert { mount, name, .. } => {
                let endpoint = CertLogin {
                    mount: mount.clone(),
                    name: name.clone(),
                };
                vaultrs::api::auth(client, endpoint).await
            }
        })
    }

    /// Who renews the token (`renewable`: lookup-self says so), for [`Credential::renewed_by`].
    pub(super) fn renewed_by(&self, renewable: bool) -> Option<String> {
        match self {
            Auth::Token { .. } if renewable => Some("keyplan renews it at each apply".to_string()),
            Auth::Token { .. } => None,
            Auth::AppRole { .. } => Some("keyplan logs in again with AppRole at each run".into()),
            Auth::Kubernetes { .. } => {
                Some("keyplan logs in again with the service account token at each run".into())
            }
            Auth::Cert { .. } => {
                Some("keyplan logs in again with the client certificate at each run".into())
            }
        }
    }

    /// The credentials a login method rests on, beyond the token: the service account token's
    /// `exp` (Kubernetes; the kubelet refreshes a projected token, so only a token outside the
    /// projected path counts as unrenewed) or the client certificate's notAfter (certificate
    /// login). Errors: a text naming the file that cannot be read or parsed.
    pub(super) fn login_credentials(&self) -> Result<Vec<Credential>, String> {
        Ok(match self {
            Auth::Token { .. } | Auth::AppRole { .. } => Vec::new(),
            Auth::Kubernetes { jwt_file, .. } => {
                let jwt = Origin::File(jwt_file.clone()).read("service account token")?;
                // As for the kubernetes provider: a token that is not a JWT has no known expiry
                // (the login then fails and says so).
                let exp = expiry::jwt_expiry(&jwt).ok().flatten();
                let projected = jwt_file == Path::new(DEFAULT_JWT_FILE);
                vec![Credential {
                    kind: "service_account_token".into(),
                    what: format!("service-account token {}", jwt_file.display()),
                    expires_at: exp,
                    renewed_by: projected
                        .then(|| "the kubelet refreshes the projected token".to_string()),
                    renewable_until: None,
                }]
            }
            Auth::Cert { client_cert, .. } => vec![Credential {
                kind: "client_certificate".into(),
                what: format!("client certificate {}", client_cert.display()),
                expires_at: Some(expiry::certificate_not_after(client_cert)?),
                renewed_by: None,
                renewable_until: None,
            }],
        })
    }
}

/// The client identity for certificate login: `client_cert` and `client_key` (PEM files) as
/// one PEM bundle. `Ok(None)` for the other methods. Errors: a text naming the file that
/// cannot be read or is not a PEM certificate / private key.
pub(super) fn identity(auth: Option<&VaultAuth>) -> Result<Option<reqwest::Identity>, String> {
    let Some(VaultAuth::Cert {
        client_cert,
        client_key,
        ..
    }) = auth
    else {
        return Ok(None);
    };
    let read = |field: &str, path: &str| {
        std::fs::read(path)
            .map(Zeroizing::new)
            .map_err(|e| format!("cannot read {field} {path}: {e}"))
    };
    let cert = read("client_cert", client_cert)?;
    let key = read("client_key", client_key)?;
    // Sized once, so no reallocation leaves an unzeroized copy of the key behind.
    let mut pem = Zeroizing::new(Vec::with_capacity(cert.len() + key.len() + 1));
    pem.extend_from_slice(&cert);
    pem.push(b'\n');
    pem.extend_from_slice(&key);
    reqwest::Identity::from_pem(&pem).map(Some).map_err(|_| {
        format!(
            "client_cert {client_cert} and client_key {client_key} are not a PEM certificate and an unencrypted PEM private key"
        )
    })
}

/// `POST auth/<mount>/login` of the TLS certificate method, with the certificate role as
/// `name` (<https://openbao.org/api-docs/auth/cert/#login-with-tls-certificate-method>).
/// vaultrs's own request sends the role as `cert_name`, which the server ignores, so a login
/// would match any role.
struct CertLogin {
    mount: String,
    name: Option<String>,
}

impl rustify::endpoint::Endpoint for CertLogin {
    type Response = ();
    const REQUEST_BODY_TYPE: rustify::enums::RequestType = rustify::enums::RequestType::JSON;
    const RESPONSE_BODY_TYPE: rustify::enums::ResponseType = rustify::enums::ResponseType::JSON;
    fn path(&self) -> String {
        format!("auth/{}/login", self.mount)
    }
    fn method(&self) -> rustify::enums::RequestMethod {
        rustify::enums::RequestMethod::POST
    }
    fn body(&self) -> Result<Option<Vec<u8>>, rustify::errors::ClientError> {
        let body = match &self.name {
            Some(n) => serde_json::json!({ "name": n }),
            None => serde_json::json!({}),
        };
        serde_json::to_vec(&body)
            .map(Some)
            .map_err(|e| rustify::errors::ClientError::DataParseError { source: e.into() })
    }
}
