//! `keyplan fleet status`, `plan`, `clear`, `pause` and `resume`: read the node reports (or
//! clear their failures, pause or resume the rollout) from a workstation or CI
//! ([`crate::fleet::status`], [`crate::fleet::pause`]), render, exit status.

use std::path::PathBuf;

use super::*;

/// `keyplan fleet` and its subcommand.
#[derive(Debug, Args)]
pub struct FleetArgs {
    /// The fleet subcommand.
    #[command(subcommand)]
    pub command: FleetCommand,
}

/// Runs `keyplan fleet ...`.
pub(super) fn run(args: &FleetArgs) -> Result<Exit> {
    cmd_fleet(&args.command)
}

/// Where the fleet is: namespace and Kubernetes client configuration.
#[derive(Debug, Clone, Args)]
pub struct FleetTarget {
    /// The fleet namespace (default: the plan's settings.fleet.namespace when a plan is
    /// given, else keyplan).
    #[arg(long, value_name = "NAMESPACE", value_parser = super::agent::parse_namespace)]
    pub namespace: Option<String>,
    /// kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context (default: the current one).
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

/// A [`FleetTarget`] and, optionally, the fleet's plan file whose settings.fleet.namespace
/// names the namespace when `--namespace` is not given (`status`, `clear`, `pause`, `resume`;
/// `fleet plan` takes the plan it plans instead).
#[derive(Debug, Clone, Args)]
pub struct FleetOf {
    #[command(flatten)]
    pub target: FleetTarget,
    /// The fleet's plan file, for its settings.fleet.namespace (when --namespace is not
    /// given).
    #[arg(short = 'f', long = "file", value_name = "PLAN")]
    pub file: Option<PathBuf>,
}

impl FleetOf {
    /// `--namespace`, else the plan file's `settings.fleet.namespace`, else `keyplan`.
    /// Errors: the plan file cannot be loaded.
    fn namespace(&self) -> Result<String> {
        if let Some(ns) = &self.target.namespace {
            return Ok(ns.clone());
        }
        match &self.file {
            Some(p) => Ok(spec::load(p)?.fleet.namespace),
            None => Ok(crate::spec::DEFAULT_FLEET_NAMESPACE.to_string()),
        }
    }
}

/// `keyplan fleet ...`.
#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Per node (devices, keys, versions, last run, drift, rotation due, state: running,
    /// failed, lost, ...) and fleet totals, from the agents' reports. Exit 0 when all is
    /// well, 1 when a node failed, is lost, halted, in error, refused its plan, drifted or
    /// is overdue, 3 when the reports cannot be read.
    Status {
        #[command(flatten)]
        fleet: FleetOf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = StatusFormat::Text)]
        format: StatusFormat,
    },
    /// What every node's agent would do with PLAN (a pull request's plan), computed from the
    /// observations the agents publish, touching no node and no KMS. Exit 0: no node would
    /// change anything; 2 (with --detailed-exitcode): some would; 1: a node is not observed,
    /// its observation is stale, PLAN is refused for it, or PLAN is invalid.
    Plan {
        /// The plan file to plan (not the one the agents run).
        #[arg(short = 'f', long = "file", value_name = "PLAN")]
        file: PathBuf,
        #[command(flatten)]
        target: FleetTarget,
        /// Exit 2 when some node would change something.
        #[arg(long)]
        detailed_exitcode: bool,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// Observations older than this are flagged stale (and exit 1), e.g. `15m`; default:
        /// three of the node agent's intervals, at least 2 minutes.
        #[arg(long, value_parser = super::agent::parse_duration, value_name = "DURATION")]
        max_age: Option<std::time::Duration>,
    },
    /// Clear the failed node runs that halt the rollout (max_failed_nodes), once their cause
    /// is fixed: those nodes retry and the others start again.
    Clear {
        #[command(flatten)]
        fleet: FleetOf,
        /// Clear only this node's failure (default: every node's).
        #[arg(value_name = "NODE")]
        only: Option<String>,
    },
    /// Pause the rollout: no agent takes a new rollout slot until `keyplan fleet resume`; a
    /// node that is applying finishes its current run and gives its slot back. Agents see it
    /// at their next poll. Exit 0 also when it was already paused (that pause is kept).
    Pause {
        #[command(flatten)]
        fleet: FleetOf,
        /// Why (shown by `fleet status` and in the agents' reports).
        #[arg(long, default_value = "", value_name = "TEXT")]
        reason: String,
        /// Who pauses (default: $USER); informative, the API server's audit log has who
        /// really did.
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
    },
    /// Lift the pause of `keyplan fleet pause`: agents take slots again at their next poll.
    /// Exit 0 also when the rollout was not paused.
    Resume {
        #[command(flatten)]
        fleet: FleetOf,
    },
}

fn client(t: &FleetTarget) -> Result<kube::Client> {
    crate::fleet::client(t.kubeconfig.as_deref(), t.context.as_deref()).map_err(|e| {
        miette!(
            help = "pass --kubeconfig/--context, or set KUBECONFIG",
            "cannot reach the Kubernetes API: {e}"
        )
    })
}

/// `keyplan fleet ...`.
pub(super) fn cmd_fleet(command: &FleetCommand) -> Result<Exit> {
    match command {
        FleetCommand::Plan {
            file,
            target,
            detailed_exitcode,
            json,
            max_age,
        } => fleet_plan(file, target, *detailed_exitcode, *json, *max_age),
        FleetCommand::Status { fleet, format } => fleet_status(fleet, format),
        FleetCommand::Clear { fleet, only } => fleet_clear(fleet, only),
        FleetCommand::Pause { fleet, reason, by } => fleet_pause(fleet, reason, by),
        FleetCommand::Resume { fleet } => fleet_resume(fleet),
    }
}

/// `keyplan fleet plan`: what the agents would do with a plan file, from their reports.
fn fleet_plan(
    file: &std::path::Path,
    target: &FleetTarget,
    detailed_exitcode: bool,
    json: bool,
    max_age: Option<std::time::Duration>,
) -> Result<Exit> {
    let plan = spec::load(file)?;
    if !plan.devices.is_empty() && !plan.names_nodes() {
        return Err(miette!(
            "no device of {} names its node: a fleet plan needs `node:` on every device (agents refuse it otherwise)",
            file.display()
        ));
    }
    let c = client(target)?;
    let namespace = target
        .namespace
        .clone()
        .unwrap_or_else(|| plan.fleet.namespace.clone());
    let reports = crate::fleet::report::Reports::new(c, &namespace)
        .list()
        .map_err(|e| miette!("cannot read the node reports: {e}"))?;
    let fp = crate::fleet::plan::compute(
        &plan,
        &reports,
        crate::clock::now_unix(),
        max_age.map(|d| d.as_secs()),
    );
    if json {
        outln!(
            "{}",
            crate::fleet::render::plan_json(&fp, &namespace).into_diagnostic()?
        );
    } else {
        out!("{}", crate::fleet::render::plan_text(&fp, &namespace));
    }
    Ok(if fp.doubtful() {
        Exit::Failure
    } else if fp.changes() && detailed_exitcode {
        Exit::Changes
    } else {
        Exit::Success
    })
}

/// `keyplan fleet status`: the agents' reports; exit 3 when they cannot be read.
fn fleet_status(fleet: &FleetOf, format: &StatusFormat) -> Result<Exit> {
    let target = &fleet.target;
    let namespace = match fleet.namespace() {
        Ok(ns) => ns,
        Err(e) => {
            errln!("keyplan fleet status: {e}");
            return Ok(Exit::Unknown);
        }
    };
    let c = match crate::fleet::client(target.kubeconfig.as_deref(), target.context.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            errln!("keyplan fleet status: cannot reach the Kubernetes API: {e}\n  help: pass --kubeconfig/--context, or set KUBECONFIG");
            return Ok(Exit::Unknown);
        }
    };
    let s = match crate::fleet::status::read(&c, &namespace) {
        Ok(s) => s,
        Err(e) => {
            errln!("keyplan fleet status: cannot read the node reports: {e}");
            return Ok(Exit::Unknown);
        }
    };
    let text = match format {
        StatusFormat::Text => crate::fleet::render::text(&s),
        StatusFormat::Json => crate::fleet::render::json(&s).into_diagnostic()?,
        StatusFormat::Prometheus => crate::fleet::render::prometheus(&s).into_diagnostic()?,
    };
    out!("{text}");
    Ok(if s.healthy() {
        Exit::Success
    } else {
        Exit::Failure
    })
}

/// `keyplan fleet clear [NODE]`: clears reported failures so the rollout goes on.
fn fleet_clear(fleet: &FleetOf, only: &Option<String>) -> Result<Exit> {
    let (target, namespace) = (&fleet.target, fleet.namespace()?);
    if let Some(n) = only {
        spec::node::this_node(Some(n)).map_err(|_| {
            miette!("{n:?} is not a Kubernetes node name (lowercase letters, digits, `-` and `.`, as `kubectl get nodes` shows it)")
        })?;
    }
    let c = client(target)?;
    let cleared = crate::fleet::status::clear(&c, &namespace, only.as_deref()).map_err(|e| {
        if matches!(e, crate::fleet::error::FleetError::Conflict(_)) {
            miette!(
                help = "run it again: an agent wrote its report just then",
                "{e}"
            )
        } else {
            miette!("{e}")
        }
    })?;
    if cleared.is_empty() && only.is_some() {
        let st = crate::fleet::status::read(&c, &namespace).map_err(|e| miette!("{e}"))?;
        let node = only.as_deref().unwrap_or_default();
        if !st.nodes.iter().any(|n| n.node == node) {
            return Err(miette!(
                help =
                    "check the node name and --namespace: `keyplan fleet status` lists the nodes",
                "no report of node {node} in namespace {namespace}; nothing was cleared"
            ));
        }
    }
    if cleared.is_empty() {
        outln!(
            "No failure to clear{}.",
            only.as_ref()
                .map(|n| format!(" on node {n}"))
                .unwrap_or_default()
        );
    } else {
        outln!(
            "Cleared the failure of {}: the rollout goes on at the agents' next poll.",
            cleared.join(", ")
        );
    }
    Ok(Exit::Success)
}

/// `keyplan fleet pause`: agents take no new rollout slot until `resume`.
fn fleet_pause(fleet: &FleetOf, reason: &str, by: &Option<String>) -> Result<Exit> {
    let (target, namespace) = (&fleet.target, fleet.namespace()?);
    let by = by
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "unknown".into());
    let c = client(target)?;
    match crate::fleet::pause::pause(&c, &namespace, reason, &by)
        .map_err(|e| miette!(help = "`keyplan fleet pause` needs create of ConfigMaps in the fleet namespace (docs/fleet.md)", "{e}; the rollout was not paused"))?
    {
        crate::fleet::pause::Paused::Now => {
            crate::fleet::events::Events::about_pause(c.clone(), &namespace).emit(
                crate::fleet::events::EventType::Normal,
                "RolloutPaused",
                &format!("rollout paused by {by}{}", if reason.is_empty() { String::new() } else { format!(": {reason}") }),
            );
            outln!("Paused the rollout in namespace {namespace}: agents take no new slot from now on; a node that is applying finishes its run. `keyplan fleet resume` lifts it.");
            let reports = crate::fleet::report::Reports::new(c.clone(), &namespace).list();
            if reports.is_ok_and(|r| r.is_empty()) {
                errln!("warning: namespace {namespace} holds no node report: if the agents run in another namespace, this pause does not reach them (give -f PLAN or --namespace, and `keyplan fleet resume` this one)");
            }
        }
        crate::fleet::pause::Paused::Already(p) => {
            outln!("The rollout in namespace {namespace} was already {}; that pause is kept.", p.describe());
        }
    }
    Ok(Exit::Success)
}

/// `keyplan fleet resume`: lifts a pause.
fn fleet_resume(fleet: &FleetOf) -> Result<Exit> {
    let (target, namespace) = (&fleet.target, fleet.namespace()?);
    let c = client(target)?;
    match crate::fleet::pause::resume(&c, &namespace)
        .map_err(|e| miette!(help = "`keyplan fleet resume` needs get and delete of ConfigMaps in the fleet namespace (docs/fleet.md)", "{e}; the rollout stays paused"))?
    {
        Some(p) => {
            crate::fleet::events::Events::about_pause(c, &namespace).emit(
                crate::fleet::events::EventType::Normal,
                "RolloutResumed",
                &format!("rollout resumed (it was {})", p.describe()),
            );
            outln!("Resumed the rollout in namespace {namespace} (it was {}): agents take slots again from their next poll.", p.describe());
        }
        None => outln!("The rollout in namespace {namespace} is not paused; nothing to resume."),
    }
    Ok(Exit::Success)
}
