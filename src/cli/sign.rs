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
    /// The ed25519 private key (PKCS#8 PEM, unencrypted). Without it: the file named by the
    /// environment variable KEYPLAN_SIGNING_KEY_FILE, else the PEM text in
    /// KEYPLAN_SIGNING_KEY (a CI secret), in this order.
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Where to write the signature (default: PLAN.sig). An existing file is replaced only if
    /// it is a keyplan signature.
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Make a new signing key instead: the private key to FILE (mode 0600, never
    /// overwritten) and its public key to FILE.pub, for the agents' --trusted-keys.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["plan", "cluster", "key", "out"])]
    pub generate_key: Option<PathBuf>,
    /// Check PLAN's signature instead of signing, as an agent started with --trusted-keys and
    /// --cluster checks it (and the plan as the agent loads it): exit 0 when such an agent
    /// would run the plan, 1 with the reason when it would refuse it. Writes nothing.
    #[arg(long, requires_all = ["plan", "cluster", "trusted_keys"], conflicts_with_all = ["key", "out", "generate_key"])]
    pub verify: bool,
    /// With --verify: the public keys (PEM) to trust, each a file or a directory of files,
    /// as `keyplan agent --trusted-keys` takes them (repeatable).
    #[arg(long, value_name = "FILE|DIR", requires = "verify")]
    pub trusted_keys: Vec<PathBuf>,
    /// With --verify: the signature file (default: PLAN.sig).
    #[arg(long, value_name = "FILE", requires = "verify")]
    pub signature: Option<PathBuf>,
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
    if args.verify {
        return verify(args, plan_path, cluster);
    }
    let key_file = args.key.clone().or_else(|| {
        std::env::var_os(signature::KEY_FILE_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let key = match &key_file {
        Some(path) => SigningKey::read(path),
        None => match std::env::var(signature::KEY_ENV) {
            Ok(pem) => {
                let pem = zeroize::Zeroizing::new(pem);
                SigningKey::from_pem(
                    pem.as_bytes(),
                    &format!("the environment variable {}", signature::KEY_ENV),
                )
            }
            Err(_) => Err(crate::fleet::error::FleetError::Signature(format!(
                "no signing key: give --key FILE (or {}=FILE), or put the PEM text into {}",
                signature::KEY_FILE_ENV,
                signature::KEY_ENV
            ))),
        },
    }
    .map_err(|e| miette!("{e}"))?;
    // The bytes that were checked are the bytes that are signed (one read).
    let (plan, bytes) = spec::load_with_bytes(plan_path)
        .map_err(|e| e.wrap_err(format!("{} is not signed", plan_path.display())))?;
    if !plan.devices.is_empty() && !plan.names_nodes() {
        return Err(miette!(
            "no device of {} names its node, and agents refuse such a plan (every node's agent would take every device as its own): give each device `node: <node name>`; nothing was signed",
            plan_path.display()
        ));
    }
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| signature::signature_path(plan_path));
    check_out(&out, plan_path, key_file.as_deref())?;
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
    let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    outln!(
        "Signed {} ({} on {}, sha256 {}) for cluster {cluster:?} with key {}: {}",
        plan_path.display(),
        count(plan.devices.len(), "device"),
        count(nodes.len(), "node"),
        sig.plan_sha256,
        key.fingerprint(),
        out.display()
    );
    Ok(Exit::Success)
}

/// `keyplan sign --verify`: the agent's signature check ([`signature::SignaturePolicy`])
/// and plan load, run locally on the files an operator is about to push.
fn verify(args: &SignArgs, plan_path: &Path, cluster: &str) -> Result<Exit> {
    let policy = signature::SignaturePolicy::load(&args.trusted_keys, cluster)
        .map_err(|e| miette!("--trusted-keys: {e}"))?;
    let sig_path = args
        .signature
        .clone()
        .unwrap_or_else(|| signature::signature_path(plan_path));
    let bytes = std::fs::read(plan_path)
        .map_err(|e| miette!("cannot read the plan {}: {e}", plan_path.display()))?;
    let sig = match std::fs::File::open(&sig_path) {
        Ok(f) => {
            let mut buf = Vec::new();
            std::io::Read::read_to_end(
                &mut std::io::Read::take(f, signature::MAX_SIGNATURE_BYTES + 1),
                &mut buf,
            )
            .map_err(|e| miette!("cannot read the signature {}: {e}", sig_path.display()))?;
            Some(buf)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(miette!(
                "cannot read the signature {}: {e}",
                sig_path.display()
            ))
        }
    };
    let verified = match policy.verify(
        &bytes,
        sig.as_deref(),
        &sig_path.display().to_string(),
        None,
    ) {
        Ok(v) => v,
        Err(refusal) => {
            errln!(
                "An agent with these trusted keys and --cluster {cluster:?} would refuse {} ({}): {refusal}",
                plan_path.display(),
                refusal.reason()
            );
            return Ok(Exit::Failure);
        }
    };
    // What the agent does next with the bytes it verified.
    let (plan, checked) = spec::load_with_bytes(plan_path).map_err(|e| {
        e.wrap_err(format!(
            "the signature of {} verifies, but an agent would refuse the plan itself",
            plan_path.display()
        ))
    })?;
    if checked != bytes {
        return Err(miette!(
            "{} changed while it was checked; run the check again",
            plan_path.display()
        ));
    }
    if !plan.devices.is_empty() && !plan.names_nodes() {
        return Err(miette!(
            "the signature of {} verifies, but no device of the plan names its node, and agents refuse such a plan: give each device `node: <node name>`",
            plan_path.display()
        ));
    }
    outln!(
        "{} verifies: signed for cluster {cluster:?} by key {} at {}; an agent with these trusted keys and --cluster {cluster:?} runs this plan",
        sig_path.display(),
        verified.key,
        crate::clock::rfc3339(verified.signed_at)
    );
    Ok(Exit::Success)
}

/// Refuses an output path that is the plan or the key, or an existing file that is not a
/// keyplan signature (so `-o` never destroys a plan or a key).
fn check_out(out: &Path, plan: &Path, key: Option<&Path>) -> Result<()> {
    let same = |other: &Path| match (std::fs::canonicalize(out), std::fs::canonicalize(other)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(plan) || key.is_some_and(same) {
        return Err(miette!(
            "{} is the plan or the signing key: the signature goes into a file of its own (default PLAN.sig); nothing was written",
            out.display()
        ));
    }
    match std::fs::symlink_metadata(out) {
        Err(_) => Ok(()),
        Ok(m) if !m.is_file() => Err(miette!(
            "{} exists and is not a regular file; nothing was written",
            out.display()
        )),
        Ok(_) => {
            let existing = std::fs::read(out).unwrap_or_default();
            if signature::Signature::parse(&existing).is_ok() {
                Ok(())
            } else {
                Err(miette!(
                    "{} exists and is not a keyplan signature: keyplan sign replaces only an earlier signature; choose another -o FILE or remove it; nothing was written",
                    out.display()
                ))
            }
        }
    }
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
    if std::fs::symlink_metadata(&pub_path).is_ok() {
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
