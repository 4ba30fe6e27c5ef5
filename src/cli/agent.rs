//! `keyplan agent`: parses its options, installs the signal handlers and hands over to the
//! reconcile loop ([`crate::fleet::agent`]), which holds all of the agent's policy.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::fleet::agent::AgentOptions;
use crate::fleet::trust::AgentConfig;

/// The state directory of an agent when `--state-dir` is not given (a hostPath in the
/// DaemonSet).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/keyplan";

/// `keyplan agent` options (besides the global `--node`, `--state-dir`, `--log-format`).
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// The plan file: a key of a ConfigMap mounted as a directory (read by path at every
    /// poll; a subPath mount or a plain file is refused, as it never sees updates).
    #[arg(long, value_name = "FILE")]
    pub plan: PathBuf,
    /// The agent's configuration (YAML): the KMS instances plans may use, with the agent's
    /// credentials for them (docs/fleet.md, "The plan is untrusted input"). Without it a plan
    /// may use no KMS at all.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Time between full cycles (observe, plan, apply when there are changes), e.g. `5m`.
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub interval: Duration,
    /// Time between reads of the plan file, and between tries for a rollout slot while
    /// waiting for one.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub poll: Duration,
    /// Lease duration of a rollout slot (renewed every third of it while a run lasts; a
    /// node gone for good frees its slot after this long).
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub slot_duration: Duration,
    /// Namespace of the Leases, reports and Events (default: the plan's
    /// settings.fleet.namespace).
    #[arg(long, value_name = "NAMESPACE", value_parser = parse_namespace)]
    pub namespace: Option<String>,
    /// kubeconfig file (default: the in-cluster service account, else $KUBECONFIG).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// Serve /metrics and /healthz on this address, e.g. `0.0.0.0:9808`.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Require signed plans: the public keys (PEM) plans may be signed with, as a file or a
    /// directory of files (a Secret volume the plan's writers cannot write); repeatable, so
    /// the old and the new key can be trusted while the signing key is rotated. The agent
    /// then runs only plans whose `<plan key>.sig` verifies (`keyplan sign`), and refuses to
    /// start when no key can be read.
    #[arg(long, value_name = "FILE|DIR", requires = "cluster")]
    pub trusted_keys: Vec<PathBuf>,
    /// The cluster this agent runs in: a signed plan must be signed for it (`keyplan sign
    /// --cluster`), so a plan signed for one cluster is refused by another.
    #[arg(long, value_name = "NAME", requires = "trusted_keys")]
    pub cluster: Option<String>,
    #[command(flatten)]
    pub journal: RetentionArgs,
}

/// A duration as `humantime` reads it (`30s`, `5m`, `1h 30m`), from one second to 30 days.
pub(super) fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d < Duration::from_secs(1) => Err("must be at least 1s".into()),
        Ok(d) if d > Duration::from_secs(30 * 86400) => Err("must be at most 30 days".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(format!("{e} (e.g. 30s, 5m, 1h)")),
    }
}

/// A Kubernetes namespace name: a DNS-1123 label (at most 63 lowercase letters, digits and
/// `-`, starting and ending with a letter or digit).
pub(super) fn parse_namespace(s: &str) -> std::result::Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(s.to_string())
    } else {
        Err("not a Kubernetes namespace name (at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit)".into())
    }
}

/// `keyplan agent`: runs until SIGTERM; exit 0 after a clean stop, 1 when it cannot start.
pub(super) fn cmd_agent(cli: &Cli, args: &AgentArgs) -> Result<Exit> {
    let node = spec::node::this_node(cli.node.as_deref()).map_err(|e| miette!("{e}"))?;
    let config = match &args.config {
        Some(path) => AgentConfig::load(path).map_err(|e| miette!("{e}"))?,
        None => AgentConfig::default(),
    };
    let state_dir = std::path::absolute(
        cli.state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
    )
    .into_diagnostic()?;
    if args.poll > args.interval {
        tracing::warn!(
            "--poll {} is longer than --interval {}: full cycles run only at each poll",
            humantime::format_duration(args.poll),
            humantime::format_duration(args.interval)
        );
    }
    let signatures = match &args.cluster {
        Some(cluster) => Some(
            crate::fleet::signature::SignaturePolicy::load(&args.trusted_keys, cluster)
                .map_err(|e| miette!("keyplan agent cannot start: {e}"))?,
        ),
        None => None,
    };
    let stop = interrupts::install_agent()?;
    let opts = AgentOptions {
        node,
        plan: args.plan.clone(),
        config,
        state_dir,
        interval: args.interval,
        poll: args.poll,
        slot_duration: args.slot_duration,
        namespace: args.namespace.clone(),
        kubeconfig: args.kubeconfig.clone(),
        context: args.context.clone(),
        listen: args.listen,
        signatures,
        journal: args.journal.retention()?,
    };
    crate::fleet::agent::run(opts, stop).map_err(|e| miette!("keyplan agent cannot start: {e}"))?;
    Ok(Exit::Success)
}
