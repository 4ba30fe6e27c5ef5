//! Signed plans: `keyplan sign` writes a detached ed25519 signature of a plan file; an agent
//! configured with trusted public keys runs only plans whose signature verifies
//! (docs/fleet.md, "Signed plans").
//!
//! **What is signed.** The message is the header lines below followed by the plan file's bytes,
//! exactly as they are on disk (no parsing, no normalisation):
//!
//! ```text
//! keyplan-signature/v1
//! cluster: <cluster name>
//! signed_at: <Unix seconds>
//! plan_sha256: <SHA-256 of the plan's bytes, lowercase hex>
//!
//! <the plan's bytes>
//! ```
//!
//! so a signature binds the plan's bytes, the cluster the plan is meant for (an agent with
//! `--cluster prod` refuses a plan signed for `staging`) and the time it was signed (an agent
//! refuses a plan signed before the one it runs: an old signed plan cannot be replayed). The
//! signature file ([`Signature`]) is a small JSON document carrying those fields, the
//! signing key's fingerprint and the ed25519 signature (RFC 8032, 64 bytes, base64).
//!
//! **Keys** are the PEM files OpenSSL reads and writes (`openssl genpkey -algorithm ed25519`,
//! `openssl pkey -pubout`): a PKCS#8 private key, a SubjectPublicKeyInfo public key. Signing
//! and verification go through OpenSSL (the `openssl` crate, which keyplan already uses for
//! KMIP's TLS). A private key is read from a file or an environment variable, held in
//! zeroized memory, and never printed: [`SigningKey`]'s `Debug` shows the fingerprint only.
//!
//! **No fail-open.** An agent given trusted keys refuses a plan without a signature file, with
//! an unreadable one, signed for another cluster, by a key it does not trust, whose bytes do
//! not match, or older than the plan it runs ([`Refusal`]); it starts only if it can read at
//! least one trusted key.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use openssl::pkey::{Id, PKey, Private, Public};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::fleet::error::FleetError;
use crate::saved::sha256_hex;
use zeroize::Zeroizing;

/// The signature document's `format`, also the first line of the signed message.
pub const FORMAT: &str = "keyplan-signature/v1";
/// What `keyplan sign` appends to the plan's file name for the signature file (and the
/// ConfigMap key the agent reads beside the plan's key).
pub const SUFFIX: &str = ".sig";
/// The environment variable `keyplan sign` reads the private key's PEM text from when no
/// `--key` file is given.
pub const KEY_ENV: &str = "KEYPLAN_SIGNING_KEY";
/// The environment variable naming the private key file, when no `--key` is given (it comes
/// before [`KEY_ENV`]).
pub const KEY_FILE_ENV: &str = "KEYPLAN_SIGNING_KEY_FILE";
/// Longest signature file read, bytes (a real one is about 400).
pub const MAX_SIGNATURE_BYTES: u64 = 16 * 1024;

/// The signature file of the plan file `plan`: `<plan>.sig`.
pub fn signature_path(plan: &Path) -> PathBuf {
    let mut name = plan.as_os_str().to_os_string();
    name.push(SUFFIX);
    PathBuf::from(name)
}

/// Checks a cluster name: 1 to 253 characters of lowercase letters, digits, `-` and `.`,
/// starting and ending with a letter or digit (a DNS-1123 subdomain, like Kubernetes names).
///
/// Errors: a text saying what a cluster name may hold.
pub fn check_cluster(name: &str) -> Result<(), FleetError> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && l.starts_with(|c: char| c.is_ascii_alphanumeric())
            && l.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    if !name.is_empty() && name.len() <= 253 && name.split('.').all(label_ok) {
        return Ok(());
    }
    let upper = if name.chars().any(|c| c.is_ascii_uppercase()) {
        " (upper-case letters are not allowed)"
    } else {
        ""
    };
    Err(FleetError::Signature(format!(
        "{name:?} is not a cluster name{upper}: a DNS-1123 subdomain, 1 to 253 characters of labels separated by '.', each 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
    )))
}

/// How far in the future (by the agent's clock) a signature's `signed_at` may be: 1 hour,
/// for clock skew between the signer and the nodes. A signature from further ahead would make
/// every later plan look older ([`Refusal::Older`]), so it is refused.
pub const MAX_CLOCK_SKEW_SECONDS: u64 = 3600;

/// The fingerprint of an ed25519 public key: `SHA256:` and the unpadded base64 of the SHA-256
/// of its 32 raw bytes (the form OpenSSH prints for its keys).
fn fingerprint(raw: &[u8]) -> String {
    format!(
        "SHA256:{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(Sha256::digest(raw))
    )
}

/// The message an ed25519 signature covers (see the module documentation).
fn message(plan: &[u8], cluster: &str, signed_at: u64) -> Vec<u8> {
    let mut m = format!(
        "{FORMAT}\ncluster: {cluster}\nsigned_at: {signed_at}\nplan_sha256: {}\n\n",
        sha256_hex(plan)
    )
    .into_bytes();
    m.extend_from_slice(plan);
    m
}

/// An ed25519 private key for `keyplan sign`. `Debug` shows its fingerprint, never the key.
pub struct SigningKey {
    key: PKey<Private>,
    fingerprint: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A new random key (OpenSSL's generator).
    ///
    /// Errors: OpenSSL's message when it cannot make one.
    pub fn generate() -> Result<SigningKey, FleetError> {
        let key = PKey::generate_ed25519()
            .map_err(|e| FleetError::Signature(format!("cannot generate an ed25519 key: {e}")))?;
        Self::from_key(key, "a new key")
    }

    /// The key of PEM text `pem` (PKCS#8, `-----BEGIN PRIVATE KEY-----`), read from `origin`
    /// (a path or an environment variable's name, for messages).
    ///
    /// Errors: a text naming `origin` when the text is not a PEM private key or not ed25519
    /// (never the text itself).
    pub fn from_pem(pem: &[u8], origin: &str) -> Result<SigningKey, FleetError> {
        let text = String::from_utf8_lossy(pem);
        if text.contains("ENCRYPTED") {
            return Err(FleetError::Signature(format!(
                "{origin} holds an encrypted private key; keyplan sign reads unencrypted PKCS#8 keys (keep the key in a CI secret instead), e.g. `openssl pkey -in ENCRYPTED.pem -out signing.key`"
            )));
        }
        if text.contains("BEGIN PUBLIC KEY") {
            return Err(FleetError::Signature(format!(
                "{origin} holds a public key: keyplan sign needs the private half (the FILE of `keyplan sign --generate-key FILE`, not FILE.pub)"
            )));
        }
        if text.contains("OPENSSH PRIVATE KEY") {
            return Err(FleetError::Signature(format!(
                "{origin} holds an OpenSSH key: keyplan sign reads PKCS#8 PEM keys (`keyplan sign --generate-key FILE` or `openssl genpkey -algorithm ed25519`)"
            )));
        }
        // Never prompt for a passphrase (OpenSSL's default callback reads the terminal).
        let key = PKey::private_key_from_pem_callback(pem, |_| Ok(0)).map_err(|_| {
            FleetError::Signature(format!("{origin} does not hold a PEM private key (-----BEGIN PRIVATE KEY-----, as `keyplan sign --generate-key` or `openssl genpkey -algorithm ed25519` writes)"))
        })?;
        Self::from_key(key, origin)
    }

    fn from_key(key: PKey<Private>, origin: &str) -> Result<SigningKey, FleetError> {
        if key.id() != Id::ED25519 {
            return Err(FleetError::Signature(format!(
                "{origin} holds a private key that is not ed25519: plan signatures are ed25519 (make one with `keyplan sign --generate-key FILE`)"
            )));
        }
        let raw = key.raw_public_key().map_err(|e| {
            FleetError::Signature(format!("cannot read the public half of {origin}: {e}"))
        })?;
        Ok(SigningKey {
            fingerprint: fingerprint(&raw),
            key,
        })
    }

    /// Reads the key from the file `path`.
    ///
    /// Errors: the file cannot be read, or [`SigningKey::from_pem`]'s.
    pub fn read(path: &Path) -> Result<SigningKey, FleetError> {
        let pem = Zeroizing::new(std::fs::read(path).map_err(|e| {
            FleetError::Signature(format!(
                "cannot read the signing key {}: {e}",
                path.display()
            ))
        })?);
        Self::from_pem(&pem, &format!("the signing key {}", path.display()))
    }

    /// The private key as PKCS#8 PEM text (zeroized when dropped).
    ///
    /// Errors: OpenSSL's message.
    pub fn to_pem(&self) -> Result<Zeroizing<Vec<u8>>, FleetError> {
        self.key
            .private_key_to_pem_pkcs8()
            .map(Zeroizing::new)
            .map_err(|e| FleetError::Signature(format!("cannot write the key as PEM: {e}")))
    }

    /// The public half.
    ///
    /// Errors: OpenSSL's message.
    pub fn public(&self) -> Result<PublicKey, FleetError> {
        let raw = self
            .key
            .raw_public_key()
            .map_err(|e| FleetError::Signature(format!("cannot read the public key: {e}")))?;
        let key = PKey::public_key_from_raw_bytes(&raw, Id::ED25519)
            .map_err(|e| FleetError::Signature(format!("cannot read the public key: {e}")))?;
        Ok(PublicKey {
            key,
            fingerprint: self.fingerprint.clone(),
            origin: "the signing key".into(),
        })
    }

    /// The key's fingerprint (`SHA256:...`).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Signs the plan bytes `plan` for `cluster`, at `signed_at` (Unix seconds).
    ///
    /// Errors: `cluster` is not a cluster name ([`check_cluster`]), or OpenSSL's message.
    pub fn sign(
        &self,
        plan: &[u8],
        cluster: &str,
        signed_at: u64,
    ) -> Result<Signature, FleetError> {
        check_cluster(cluster)?;
        let mut signer = openssl::sign::Signer::new_without_digest(&self.key)
            .map_err(|e| FleetError::Signature(format!("cannot sign: {e}")))?;
        let sig = signer
            .sign_oneshot_to_vec(&message(plan, cluster, signed_at))
            .map_err(|e| FleetError::Signature(format!("cannot sign: {e}")))?;
        Ok(Signature {
            format: FORMAT.to_string(),
            cluster: cluster.to_string(),
            signed_at,
            plan_sha256: sha256_hex(plan),
            key: self.fingerprint.clone(),
            signature: base64::engine::general_purpose::STANDARD.encode(sig),
        })
    }
}

/// An ed25519 public key an agent trusts, with where it was read from.
#[derive(Clone)]
pub struct PublicKey {
    key: PKey<Public>,
    fingerprint: String,
    origin: String,
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublicKey")
            .field("fingerprint", &self.fingerprint)
            .field("origin", &self.origin)
            .finish()
    }
}

impl PublicKey {
    /// The key of PEM text `pem` (SubjectPublicKeyInfo, `-----BEGIN PUBLIC KEY-----`), read
    /// from `origin` (a path, for messages).
    ///
    /// Errors: a text naming `origin` when the text is not a PEM public key or not ed25519.
    pub fn from_pem(pem: &[u8], origin: &str) -> Result<PublicKey, FleetError> {
        let text = String::from_utf8_lossy(pem);
        if text.contains("PRIVATE KEY") {
            return Err(FleetError::Signature(format!(
                "{origin} holds a private key: trust only the public half (FILE.pub of `keyplan sign --generate-key FILE`, or `openssl pkey -pubout`), and keep the private key out of the cluster"
            )));
        }
        let blocks = text.matches("-----BEGIN ").count();
        if blocks > 1 {
            return Err(FleetError::Signature(format!(
                "{origin} holds {blocks} PEM blocks: put each trusted public key in a file of its own (a directory, such as a Secret with one key per file, may hold several)"
            )));
        }
        let key = PKey::public_key_from_pem(pem).map_err(|_| {
            FleetError::Signature(format!("{origin} does not hold a PEM public key (-----BEGIN PUBLIC KEY-----, as `keyplan sign --generate-key` writes to FILE.pub or `openssl pkey -pubout` prints)"))
        })?;
        if key.id() != Id::ED25519 {
            return Err(FleetError::Signature(format!(
                "{origin} holds a public key that is not ed25519: plan signatures are ed25519"
            )));
        }
        let raw = key.raw_public_key().map_err(|e| {
            FleetError::Signature(format!("cannot read the public key {origin}: {e}"))
        })?;
        Ok(PublicKey {
            key,
            fingerprint: fingerprint(&raw),
            origin: origin.to_string(),
        })
    }

    /// The key as PEM text (SubjectPublicKeyInfo).
    ///
    /// Errors: OpenSSL's message.
    pub fn to_pem(&self) -> Result<Vec<u8>, FleetError> {
        self.key
            .public_key_to_pem()
            .map_err(|e| FleetError::Signature(format!("cannot write the public key as PEM: {e}")))
    }

    /// The key's fingerprint (`SHA256:...`).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Where the key was read from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        openssl::sign::Verifier::new_without_digest(&self.key)
            .and_then(|mut v| v.verify_oneshot(signature, message))
            .unwrap_or(false)
    }
}

/// A signature file (`<plan>.sig`): one JSON document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// Always [`FORMAT`].
    pub format: String,
    /// The cluster the plan is meant for.
    pub cluster: String,
    /// When it was signed, Unix seconds (the signer's clock).
    pub signed_at: u64,
    /// SHA-256 of the plan's bytes, lowercase hex (64 characters): tells a changed plan from a
    /// forged signature in messages; the signature covers it.
    pub plan_sha256: String,
    /// Fingerprint of the signing key (`SHA256:...`).
    pub key: String,
    /// The ed25519 signature (64 bytes), standard base64.
    pub signature: String,
}

impl Signature {
    /// The file's text: pretty JSON and a newline.
    pub fn to_text(&self) -> String {
        // A struct of strings and a number always serializes.
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// Reads a signature file's text. Its `format` is compared first
    /// ([`crate::format::published::SIGNATURE`]): a newer envelope (`keyplan-signature/v2`) is
    /// refused as written by a newer keyplan ([`crate::format::NewerFormat`]'s message), even
    /// when it added fields.
    ///
    /// Errors: a text saying what is wrong (not JSON of this shape, another format, a newer
    /// version).
    pub fn parse(text: &[u8]) -> Result<Signature, FleetError> {
        use crate::format::published::{SIGNATURE, SIGNATURE_PREFIX, SIGNATURE_VERSION};
        let not_ours = |e: String| {
            FleetError::Signature(format!(
                "the signature file is not a keyplan signature: {e}"
            ))
        };
        let value: serde_json::Value =
            serde_json::from_slice(text).map_err(|e| not_ours(e.to_string()))?;
        let format = value.get("format").and_then(|f| f.as_str()).unwrap_or("");
        let version = format
            .strip_prefix(SIGNATURE_PREFIX)
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|v| *v >= SIGNATURE_VERSION)
            .ok_or_else(|| {
                FleetError::Signature(format!(
                    "the signature file has format {format:?}; this keyplan reads {FORMAT:?}"
                ))
            })?;
        crate::format::check_version(&SIGNATURE, "the signature file", version, SIGNATURE_VERSION)
            .map_err(|e| FleetError::Signature(e.to_string()))?;
        serde_json::from_value(value).map_err(|e| not_ours(e.to_string()))
    }
}

/// Why an agent refuses a plan's signature. Each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No signature file beside the plan.
    Unsigned {
        /// The signature file looked for.
        expected: String,
    },
    /// The signature file cannot be read or parsed.
    Malformed {
        /// Why.
        reason: String,
    },
    /// Signed for another cluster.
    OtherCluster {
        /// The signature's cluster.
        signed: String,
        /// The agent's `--cluster`.
        ours: String,
    },
    /// Signed by a key the agent does not trust.
    UntrustedKey {
        /// The signature's key fingerprint.
        key: String,
        /// The trusted fingerprints.
        trusted: Vec<String>,
    },
    /// The signature does not verify over the plan's bytes: the plan or the signature was
    /// changed after signing.
    Tampered {
        /// The plan's SHA-256 per the signature.
        signed_sha256: String,
        /// The plan file's actual SHA-256.
        actual_sha256: String,
    },
    /// A signature from further in the future than [`MAX_CLOCK_SKEW_SECONDS`].
    Future {
        /// This signature's `signed_at`.
        signed_at: u64,
        /// The agent's clock.
        now: u64,
    },
    /// A valid signature older than that of the plan the agent runs (a replay).
    Older {
        /// This signature's `signed_at`.
        signed_at: u64,
        /// The running plan's `signed_at`.
        running_signed_at: u64,
    },
}

impl Refusal {
    /// A short name of the reason, for metrics labels and Events: `unsigned`, `malformed`,
    /// `other_cluster`, `untrusted_key`, `tampered`, `future`, `older`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Unsigned { .. } => "unsigned",
            Refusal::Malformed { .. } => "malformed",
            Refusal::OtherCluster { .. } => "other_cluster",
            Refusal::UntrustedKey { .. } => "untrusted_key",
            Refusal::Tampered { .. } => "tampered",
            Refusal::Future { .. } => "future",
            Refusal::Older { .. } => "older",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Unsigned { expected } => write!(
                f,
                "the plan is not signed (no {expected}) and this agent requires signed plans; sign it with `keyplan sign PLAN --cluster CLUSTER --key KEY` and put the signature into the plan's ConfigMap as the key {expected}"
            ),
            Refusal::Malformed { reason } => write!(
                f,
                "the plan's signature cannot be read: {reason}; sign the plan again with `keyplan sign`"
            ),
            Refusal::OtherCluster { signed, ours } => write!(
                f,
                "the plan is signed for cluster {signed:?}, and this agent is in cluster {ours:?}: a plan signed for one cluster is not run in another; sign it for {ours:?}"
            ),
            Refusal::UntrustedKey { key, trusted } => write!(
                f,
                "the plan is signed by key {key}, which this agent does not trust (trusted: {}); sign it with a trusted key, or add the key's public half to the agent's --trusted-keys",
                trusted.join(", ")
            ),
            Refusal::Tampered {
                signed_sha256,
                actual_sha256,
            } => {
                if signed_sha256 == actual_sha256 {
                    write!(
                        f,
                        "the plan's signature does not verify (the signature file was altered or forged); sign the plan again with `keyplan sign`"
                    )
                } else {
                    write!(
                        f,
                        "the plan's signature does not verify: the plan's bytes changed after signing (signed sha256 {signed_sha256}, the plan's is {actual_sha256}); sign the plan as it is now with `keyplan sign`"
                    )
                }
            }
            Refusal::Future { signed_at, now } => write!(
                f,
                "the plan was signed at {} ({signed_at}), {} s ahead of this node's clock ({}): a signature from the future would make every later plan look older. Check the clock of the machine that signed it, then sign it again",
                crate::clock::rfc3339(*signed_at),
                signed_at.saturating_sub(*now),
                crate::clock::rfc3339(*now)
            ),
            Refusal::Older {
                signed_at,
                running_signed_at,
            } => write!(
                f,
                "the plan was signed at {} ({signed_at}), before the plan this agent runs (signed at {} ({running_signed_at})): an older signed plan is not run again; to go back to it, sign it again",
                crate::clock::rfc3339(*signed_at),
                crate::clock::rfc3339(*running_signed_at)
            ),
        }
    }
}

/// A verified plan signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Fingerprint of the key that signed.
    pub key: String,
    /// When it was signed, Unix seconds.
    pub signed_at: u64,
}

/// The agent's signature check: its trusted public keys and its cluster.
#[derive(Debug, Clone)]
pub struct SignaturePolicy {
    keys: Vec<PublicKey>,
    cluster: String,
}

impl SignaturePolicy {
    /// The policy of `keys` (at least one) for `cluster`.
    ///
    /// Errors: no key, or `cluster` is not a cluster name.
    pub fn new(keys: Vec<PublicKey>, cluster: &str) -> Result<SignaturePolicy, FleetError> {
        check_cluster(cluster)?;
        if keys.is_empty() {
            return Err(FleetError::Signature("no trusted public key: an agent that requires signed plans needs at least one (--trusted-keys FILE or DIR)".into()));
        }
        Ok(SignaturePolicy {
            keys,
            cluster: cluster.to_string(),
        })
    }

    /// Reads the trusted keys from `paths`: each a PEM public key file, or a directory whose
    /// regular files (not starting with `.`, so a Secret volume's `..data` is skipped; links
    /// are followed) are each one PEM public key.
    ///
    /// Errors: a path cannot be read, a file is not an ed25519 public key (a key file the
    /// operator meant to trust must not be skipped silently), or no key is found.
    pub fn load(paths: &[PathBuf], cluster: &str) -> Result<SignaturePolicy, FleetError> {
        let mut keys = Vec::new();
        for path in paths {
            let meta = std::fs::metadata(path).map_err(|e| {
                FleetError::Signature(format!(
                    "cannot read the trusted keys {}: {e}",
                    path.display()
                ))
            })?;
            let files = if meta.is_dir() {
                let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                    .map_err(|e| {
                        FleetError::Signature(format!(
                            "cannot read the trusted keys {}: {e}",
                            path.display()
                        ))
                    })?
                    .filter_map(|e| e.ok())
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .map(|e| e.path())
                    .filter(|p| p.is_file())
                    .collect();
                files.sort();
                if files.is_empty() {
                    return Err(FleetError::Signature(format!(
                        "the trusted keys directory {} holds no key file (is the Secret empty or not mounted?)",
                        path.display()
                    )));
                }
                files
            } else {
                vec![path.clone()]
            };
            for file in files {
                let pem = std::fs::read(&file).map_err(|e| {
                    FleetError::Signature(format!(
                        "cannot read the trusted key {}: {e}",
                        file.display()
                    ))
                })?;
                keys.push(PublicKey::from_pem(
                    &pem,
                    &format!("the trusted key {}", file.display()),
                )?);
            }
        }
        Self::new(keys, cluster)
    }

    /// The cluster plans must be signed for.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The trusted keys.
    pub fn keys(&self) -> &[PublicKey] {
        &self.keys
    }

    /// Checks the signature file's bytes `signature` (`None`: there is none, looked for at
    /// `expected`) over the plan bytes `plan`; `running_signed_at` is the `signed_at` of the
    /// plan the agent runs, if any (an older signature is refused).
    ///
    /// Errors: the [`Refusal`].
    pub fn verify(
        &self,
        plan: &[u8],
        signature: Option<&[u8]>,
        expected: &str,
        running_signed_at: Option<u64>,
    ) -> Result<Verified, Refusal> {
        let Some(bytes) = signature else {
            return Err(Refusal::Unsigned {
                expected: expected.to_string(),
            });
        };
        let sig = Signature::parse(bytes).map_err(|e| Refusal::Malformed {
            reason: e.to_string(),
        })?;
        if sig.cluster != self.cluster {
            return Err(Refusal::OtherCluster {
                signed: sig.cluster,
                ours: self.cluster.clone(),
            });
        }
        let Some(key) = self.keys.iter().find(|k| k.fingerprint == sig.key) else {
            return Err(Refusal::UntrustedKey {
                key: sig.key,
                trusted: self.keys.iter().map(|k| k.fingerprint.clone()).collect(),
            });
        };
        let actual_sha256 = sha256_hex(plan);
        let tampered = || Refusal::Tampered {
            signed_sha256: sig.plan_sha256.clone(),
            actual_sha256: actual_sha256.clone(),
        };
        // The field is what people read; the signature covers the digest of the plan's bytes.
        // A signature file whose field disagrees was edited: refused like any other change.
        if sig.plan_sha256 != actual_sha256 {
            return Err(tampered());
        }
        let raw = base64::engine::general_purpose::STANDARD
            .decode(sig.signature.as_bytes())
            .map_err(|_| tampered())?;
        if !key.verifies(&message(plan, &sig.cluster, sig.signed_at), &raw) {
            return Err(tampered());
        }
        let now = crate::clock::now_unix();
        if sig.signed_at > now.saturating_add(MAX_CLOCK_SKEW_SECONDS) {
            return Err(Refusal::Future {
                signed_at: sig.signed_at,
                now,
            });
        }
        if let Some(running) = running_signed_at {
            if sig.signed_at < running {
                return Err(Refusal::Older {
                    signed_at: sig.signed_at,
                    running_signed_at: running,
                });
            }
        }
        Ok(Verified {
            key: sig.key,
            signed_at: sig.signed_at,
        })
    }
}

#[cfg(test)]
mod tests;
