//! `keyplan sign`: a detached signature of a plan file for agents that require signed plans
//! ([`crate::fleet::signature`]), and `keyplan sign --generate-key` for a new signing key.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use super::*;
use crate::fleet::signature::{self, SigningKey};

/// `keyplan sign` options.
#[derive(Debug, Clone, Args)]
pub struct SignArgs {
    /// The plan file to sign (checked first: an invalid plan is not signed). Its bytes are
    /// signed exactly as they are.
    #[arg(value_name = "PLAN", required_unless_present = "generate_key")]
    pub plan: Option<PathBuf>,
    /// The cluster the plan is meant for: agents started with another --cluster refuse it.
    #[arg(long, value_name = "NAME", required_unless_present = "generate_key")]
    pub cluster: Option<String>,
    /// The ed25519 private key (PKCS#8 PEM). Without it, the PEM text is read from the
    /// environment variable KEYPLAN_SIGNING_KEY (a CI secret).
    #[arg(long, value_name = "FILE", env = "KEYPLAN_SIGNING_KEY_FILE")]
    pub key: Option<PathBuf>,
    /// Where to write the signature (default: PLAN.sig).
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Make a new signing key instead: the private key to FILE (mode 0600, never
    /// overwritten) and its public key to FILE.pub, for the agents' --trusted-keys.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["plan", "cluster", "key", "out"])]
    pub generate_key: Option<PathBuf>,
}

/// Runs `keyplan sign`. Exit 0 when the signature (or the key) is written, 1 otherwise.
pub(super) fn cmd_sign(args: &SignArgs) -> Result<Exit> {
    if let Some(path) = &args.generate_key {
        return generate(path);
    }
    let (Some(plan_path), Some(cluster)) = (&args.plan, &args.cluster) else {
        // clap enforces both unless --generate-key.
        return Err(miette!("keyplan sign needs PLAN and --cluster"));
    };
    signature::check_cluster(cluster).map_err(|e| miette!("--cluster: {e}"))?;
    let key = match &args.key {
        Some(path) => SigningKey::read(path),
        None => match std::env::var(signature::KEY_ENV) {
            Ok(pem) => {
                let pem = zeroize::Zeroizing::new(pem);
                SigningKey::from_pem(
                    pem.as_bytes(),
                    &format!("the environment variable {}", signature::KEY_ENV),
                )
            }
            Err(_) => Err(format!(
                "no signing key: give --key FILE (or KEYPLAN_SIGNING_KEY_FILE), or put the PEM text into {}",
                signature::KEY_ENV
            )),
        },
    }
    .map_err(|e| miette!("{e}"))?;
    // The bytes that were checked are the bytes that are signed (one read).
    let (plan, bytes) = spec::load_with_bytes(plan_path)
        .map_err(|e| e.wrap_err(format!("{} is not signed", plan_path.display())))?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| signature::signature_path(plan_path));
    let sig = key
        .sign(&bytes, cluster, crate::clock::now_unix())
        .map_err(|e| miette!("{e}"))?;
    crate::fsutil::write_atomic(&out, sig.to_text().as_bytes(), 0o644)
        .map_err(|e| miette!("cannot write the signature {}: {e}", out.display()))?;
    let nodes: std::collections::BTreeSet<&str> = plan
        .devices
        .values()
        .filter_map(|d| d.node.as_deref())
        .collect();
    if !plan.devices.is_empty() && !plan.names_nodes() {
        tracing::warn!(
            "no device of {} names its node: agents refuse such a plan, signed or not (every node's agent would take every device as its own); give each device `node:`",
            plan_path.display()
        );
    }
    outln!(
        "Signed {} ({} devices on {} nodes, sha256 {}) for cluster {cluster:?} with key {}: {}",
        plan_path.display(),
        plan.devices.len(),
        nodes.len(),
        sig.plan_sha256,
        key.fingerprint(),
        out.display()
    );
    Ok(Exit::Success)
}

/// `--generate-key FILE`: a new key to FILE (0600, created, never replaced) and FILE.pub.
fn generate(path: &Path) -> Result<Exit> {
    let key = SigningKey::generate().map_err(|e| miette!("{e}"))?;
    let public = key
        .public()
        .and_then(|p| p.to_pem())
        .map_err(|e| miette!("{e}"))?;
    let mut pub_path = path.as_os_str().to_os_string();
    pub_path.push(".pub");
    let pub_path = PathBuf::from(pub_path);
    if pub_path.exists() {
        return Err(miette!(
            "{} exists: keyplan sign --generate-key never replaces a key; choose another FILE",
            pub_path.display()
        ));
    }
    let pem = key.to_pem().map_err(|e| miette!("{e}"))?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                miette!(
                    "{} exists: keyplan sign --generate-key never replaces a key; choose another FILE",
                    path.display()
                )
            } else {
                miette!("cannot create the private key {}: {e}", path.display())
            }
        })?;
    file.write_all(&pem)
        .and_then(|()| file.sync_all())
        .map_err(|e| miette!("cannot write the private key {}: {e}", path.display()))?;
    crate::fsutil::write_atomic(&pub_path, &public, 0o644)
        .map_err(|e| miette!("cannot write the public key {}: {e}", pub_path.display()))?;
    outln!(
        "Wrote the private key {} (keep it out of the repository: a CI secret) and the public key {} (fingerprint {}), for the agents' --trusted-keys.",
        path.display(),
        pub_path.display(),
        key.fingerprint()
    );
    Ok(Exit::Success)
}
