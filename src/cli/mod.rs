//! The command line (docs/commands.md): clap definitions, and one thin module per command that
//! parses its arguments, asks for confirmation where needed, calls [`crate::ops`], renders
//! with [`crate::render`] and maps the outcome to an [`Exit`] status (`0` success / no
//! changes, `1` error, usage errors included, `2` changes present with `--detailed-exitcode`,
//! `3` status could not check). Engine errors become miette reports here ([`report`]);
//! nothing in this module touches a device, a KMS or the journal.

use std::io::{self, BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use miette::{miette, IntoDiagnostic, Result};

use crate::diff;
use crate::error::Error;
use crate::ops::{self, Engine};
use crate::render;
use crate::spec::{self, Plan};

/// `println!` that never panics: a closed stdout (`keyplan plan | head -1`, a dropped ssh
/// session, a dead `tee`) must not turn a run into a crash. Output is informational; the
/// journal is the record, so write errors are ignored. The text goes through
/// [`crate::secret::redact::redact`]: a KMS error quoted in a plan or status report may quote
/// material back. (`key get` writes its material with `write_all`, not through this.)
macro_rules! outln {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout());
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let text = format!($($arg)*);
        let _ = writeln!(std::io::stdout(), "{}", $crate::secret::redact::redact(&text));
    }};
}

/// `print!` that never panics and redacts (see `outln!`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let text = format!($($arg)*);
        let _ = write!(std::io::stdout(), "{}", $crate::secret::redact::redact(&text));
    }};
}

/// `eprintln!` that never panics and redacts (see `outln!`): errors, warnings and notes on
/// stderr.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let text = format!($($arg)*);
        let _ = writeln!(std::io::stderr(), "{}", $crate::secret::redact::redact(&text));
    }};
}

mod agent;
mod apply;
mod device;
mod docs;
pub mod exit;
mod fleet;
mod interrupts;
mod journal;
mod key;
mod plan;
mod progress;
mod report;
mod show;
mod sign;
mod status;
mod validate;
mod verify;
mod version;

use agent::AgentArgs;
pub use exit::Exit;
use progress::ProgressView;
use report::OrReport as _;
use sign::SignArgs;

/// keyplan: declarative, crash-safe rotation of LUKS keyslots whose passphrases live in a KMS.
#[derive(Debug, Parser)]
#[command(name = "keyplan", version = version::version_line(), about, long_about = None)]
pub struct Cli {
    /// State directory (journal, lock, LUKS1 records); overrides the plan's `state_dir`.
    #[arg(long, global = true, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// More log output on stderr (-v info, -vv debug, -vvv trace).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors on stderr.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// When to colour the plan text (stdout) and error messages and logs (stderr).
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// Format of the log lines on stderr: `text` for people, `json` (one object per line) for
    /// log pipelines.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, value_name = "FORMAT")]
    pub log_format: LogFormat,
    /// The Kubernetes node this host is (default: `$NODE_NAME`, else the host name): with a
    /// plan whose devices name nodes, `plan`, `apply`, `status` and the other commands act only
    /// on this node's devices and the keys they list. `validate` always checks the whole file.
    #[arg(
        long,
        global = true,
        env = "NODE_NAME",
        hide_env_values = true,
        value_name = "NAME"
    )]
    pub node: Option<String>,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// The journal's audit trail options of `apply` and `agent` ([`crate::journal::compact`]).
#[derive(Debug, Clone, Args)]
pub struct RetentionArgs {
    /// Finished runs the audit trail (`<state_dir>/history.jsonl`, shown by `keyplan
    /// journal`) keeps, at least 1; older runs leave it after each run.
    #[arg(
        long,
        env = "KEYPLAN_JOURNAL_KEEP_RUNS",
        value_name = "N",
        default_value_t = spec::DEFAULT_JOURNAL_KEEP_RUNS as u32,
        value_parser = clap::value_parser!(u32).range(1..=100_000)
    )]
    pub journal_keep_runs: u32,
    /// Append the records of runs that leave the audit trail to FILE (JSON Lines, as
    /// `journal.jsonl` holds them; created mode 0600, in a directory that must exist) instead
    /// of dropping them, e.g. for a log shipper to tail. A run's records may reach it twice
    /// after a crash.
    #[arg(long, env = "KEYPLAN_JOURNAL_ARCHIVE", value_name = "FILE")]
    pub journal_archive: Option<PathBuf>,
}

impl RetentionArgs {
    /// The retention these options ask for (the archive path made absolute).
    ///
    /// Errors: the current directory is unknown.
    pub fn retention(&self) -> Result<spec::JournalRetention> {
        Ok(spec::JournalRetention {
            keep_runs: self.journal_keep_runs as usize,
            archive: match &self.journal_archive {
                Some(p) => Some(std::path::absolute(p).into_diagnostic()?),
                None => None,
            },
        })
    }
}

/// `--color`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ColorChoice {
    /// Colour each stream that is a terminal, unless NO_COLOR is set to a non-empty value.
    Auto,
    /// Colour even pipes and files; overrides NO_COLOR.
    Always,
    /// Never colour.
    Never,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// `LEVEL message key=value` lines (tracing-subscriber's default format), with a timestamp.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `fields` (with `message`), `target`
    /// (tracing-subscriber's JSON format). Never coloured.
    Json,
}

impl ColorChoice {
    /// Whether to colour a stream that is (`is_terminal`) or is not a terminal: `always` yes,
    /// `never` no, `auto` only a terminal and only when NO_COLOR is unset or empty
    /// (<https://no-color.org>). An explicit `--color always` wins over NO_COLOR, as no-color.org
    /// asks of per-invocation options.
    pub fn enabled(self, is_terminal: bool) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
            }
        }
    }
}

/// `status --format`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum StatusFormat {
    /// For people.
    Text,
    /// One JSON document (`format_version` "1.x", docs/formats.md).
    Json,
    /// node_exporter textfile metrics (Prometheus text exposition format).
    Prometheus,
}

/// `-f PLAN`.
#[derive(Debug, Clone, Args)]
pub struct PlanArg {
    /// Plan file (default: keyplan.yaml, keyplan.yml or keyplan.toml in the current directory).
    #[arg(short = 'f', long = "file", value_name = "PLAN")]
    pub file: Option<PathBuf>,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a plan file: syntax, references, values. Touches no device and no KMS.
    Validate(validate::ValidateArgs),
    /// Show what `apply` would change. Writes nothing anywhere.
    Plan(plan::PlanArgs),
    /// Make devices and KMS match the plan (finishing an interrupted run first); or, given a
    /// saved plan, apply exactly its changes, refusing if anything changed since it was made.
    Apply(apply::ApplyArgs),
    /// Render a saved plan; warn (on stderr) when it is stale. Read-only; exit 0 either way.
    Show(show::ShowArgs),
    /// Check that every enrolled key's current version opens a bound keyslot of each device
    /// (one PBKDF run per key and device). Read-only.
    Verify(verify::VerifyArgs),
    /// Key operations.
    Key(key::KeyArgs),
    /// Device operations.
    Device(device::DeviceArgs),
    /// Per key: its KMS, current version and age, next rotation due, pending and retained
    /// versions; per device: drift from the plan; and the last run's outcome. Reads KMSs,
    /// journal and LUKS headers (no PBKDF run), writes nothing but `-o FILE`. Exit 1 when a
    /// rotation is overdue, the last run failed or a device drifted; 3 when something could
    /// not be checked (a KMS unreadable) and nothing wrong was found (docs/monitoring.md).
    Status(status::StatusArgs),
    /// Show the journal of runs.
    Journal(journal::JournalArgs),
    /// Fleet mode: the per-node reconcile loop (a DaemonSet pod). Reads the plan from a
    /// ConfigMap volume at every poll, applies this node's changes while holding one of
    /// `settings.fleet.max_concurrent_nodes` rollout Leases, and publishes a report, Events
    /// and /metrics (docs/fleet.md). Runs until SIGTERM.
    Agent(AgentArgs),
    /// Fleet mode: sign a plan for agents that require signed plans (a detached ed25519
    /// signature binding the plan's bytes and its cluster, written to PLAN.sig), or make a
    /// signing key with --generate-key.
    Sign(SignArgs),
    /// Fleet mode, from a workstation or CI: the agents' reports.
    Fleet(fleet::FleetArgs),
    /// Print a shell completion script to stdout, e.g.
    /// `keyplan completions bash > /etc/bash_completion.d/keyplan`.
    Completions(docs::CompletionsArgs),
    /// Print the man page (roff) to stdout, or write one page per command into a directory.
    Man(docs::ManArgs),
    /// Show the release, the commit it was built from, and the formats it writes and reads.
    ///
    /// Also the target triple, the compiler and the profile; `--json` prints one document for
    /// programs. Each format's versions and compatibility rule: docs/formats.md.
    Version(version::VersionArgs),
}

fn parse_parallelism(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("must be a whole number of at least 1".to_string()),
    }
}

/// Global options each command ignores, hidden from its help and man page: the command still
/// takes them (a script that passes them to every command keeps working), but they mean nothing
/// to it. `fleet` works on the cluster, `sign` on a file; `validate` always checks the whole
/// plan; `completions`, `man` and `version` only print.
const IGNORED_GLOBALS: &[(&str, &[&str])] = &[
    ("validate", &["node"]),
    ("sign", &["state_dir", "node"]),
    ("fleet", &["state_dir", "node"]),
    (
        "completions",
        &["state_dir", "node", "log_format", "verbose", "quiet"],
    ),
    (
        "man",
        &["state_dir", "node", "log_format", "verbose", "quiet"],
    ),
    (
        "version",
        &["state_dir", "node", "log_format", "verbose", "quiet"],
    ),
];

/// The command-line definition: [`Cli`]'s, with each command's ignored global options
/// ([`IGNORED_GLOBALS`]) hidden. A copy of the global option, hidden, in the command stops
/// clap from propagating the visible one to it (and, being global too, reaches its own
/// subcommands).
pub fn command() -> clap::Command {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let globals: Vec<clap::Arg> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .cloned()
        .collect();
    for (name, ids) in IGNORED_GLOBALS {
        cmd = cmd.mut_subcommand(name, |mut sc| {
            for a in globals
                .iter()
                .filter(|a| ids.contains(&a.get_id().as_str()))
            {
                sc = sc.arg(a.clone().hide(true));
            }
            sc
        });
    }
    cmd
}

/// Process entry point: parses arguments, runs the command, maps the outcome to an exit code.
/// A usage error (unknown flag or subcommand, missing or bad value) exits 1 like every other
/// error, never clap's default 2, which means "changes present" to `plan --detailed-exitcode`.
pub fn main() -> ExitCode {
    let _failpoints = crate::failpoint::setup();
    redacting_panic_hook();
    let cli = match command()
        .try_get_matches()
        .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => return usage_exit(&e),
    };
    let color = cli.color.enabled(io::stderr().is_terminal());
    init_logging(&cli, color);
    // Wrap long messages only for a person at a terminal; logs and pipelines get whole lines.
    let wrap = io::stderr().is_terminal();
    let _ = miette::set_hook(Box::new(move |_| {
        Box::new(
            miette::MietteHandlerOpts::new()
                .color(color)
                .unicode(color)
                .wrap_lines(wrap)
                .build(),
        )
    }));
    match run(&cli) {
        Ok(code) => code.into(),
        Err(e) => {
            errln!("{e:?}");
            Exit::Failure.into()
        }
    }
}

/// Panic messages go through the redactor too (the default hook writes them to stderr as they
/// are): `thread '<name>' panicked at <file:line:column>:`, the message, and the backtrace when
/// `RUST_BACKTRACE` asks for one.
fn redacting_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("<unnamed>");
        let at = info.location().map(|l| l.to_string()).unwrap_or_default();
        let payload = info.payload();
        let message = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("Box<dyn Any>");
        let backtrace = std::backtrace::Backtrace::capture();
        let tail = match backtrace.status() {
            std::backtrace::BacktraceStatus::Captured => format!("stack backtrace:\n{backtrace}"),
            _ => "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace"
                .to_string(),
        };
        errln!("\nthread '{name}' panicked at {at}:\n{message}\n{tail}");
    }));
}

/// Prints what clap stopped at (its error message on stderr, or `--help`/`--version` on
/// stdout) and returns the exit code: [`Exit::Success`] for help and version,
/// [`Exit::Failure`] for every usage error (see [`main`]).
fn usage_exit(e: &clap::Error) -> ExitCode {
    // A closed stream is no reason to panic; the exit code still says what happened.
    let _ = e.print();
    if e.use_stderr() {
        Exit::Failure.into()
    } else {
        Exit::Success.into()
    }
}

fn init_logging(cli: &Cli, color: bool) {
    let level = if cli.quiet {
        "error"
    } else {
        match cli.verbose {
            // The agent logs its runs (initiated, each step, complete) for log pipelines.
            0 if matches!(cli.command, Command::Agent(_)) => "info",
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
    };
    // The kube client logs each failed request as an ERROR of its own, and the AWS SDK's
    // credential chain a WARN with the raw HTTP answer of every source it tried; both only
    // repeat the KMS error keyplan reports (naming the KMS and what to do); shown from `-vv` on.
    let default = if cli.verbose >= 2 {
        level.to_string()
    } else {
        format!("{level},kube_client=off,aws_config=off,aws_smithy_runtime=off")
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("KEYPLAN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Every formatted event is redacted before it reaches stderr, whatever its level, format
    // or origin (keyplan or a library).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(crate::secret::redact::Redacting(io::stderr));
    let _ = match cli.log_format {
        LogFormat::Text => builder.with_ansi(color).with_target(false).try_init(),
        LogFormat::Json => builder
            .json()
            .with_ansi(false)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
}

/// Whether human text on stdout (the plan) is coloured: `--color` and NO_COLOR as for stderr,
/// judged on stdout (see [`ColorChoice::enabled`]).
fn stdout_color(cli: &Cli) -> bool {
    cli.color.enabled(io::stdout().is_terminal())
}

fn load_plan(cli: &Cli, arg: &PlanArg) -> Result<Plan> {
    load_plan_with_bytes(cli, arg).map(|(plan, _)| plan)
}

/// The whole plan file, not cut down to this node (for `validate`), with `--state-dir`
/// applied.
fn load_whole_plan(cli: &Cli, arg: &PlanArg) -> Result<Plan> {
    let (mut plan, _) = spec::load_with_bytes(&plan_path(arg)?)?;
    if let Some(dir) = &cli.state_dir {
        plan.state_dir = std::path::absolute(dir).into_diagnostic()?;
    }
    Ok(plan)
}

/// The plan file `-f` names, or the default one in the current directory.
fn plan_path(arg: &PlanArg) -> Result<PathBuf> {
    match &arg.file {
        Some(p) => Ok(p.clone()),
        None => {
            let cwd = std::env::current_dir().into_diagnostic()?;
            Ok(spec::find_default(&cwd)?)
        }
    }
}

/// The plan file `-f` names (default: `keyplan.yaml`, `keyplan.yml` or `keyplan.toml` in the
/// current directory), cut down to this node's devices ([`spec::Plan::for_node`], `--node`),
/// with `--state-dir` applied, and the exact bytes it was parsed from (one read: a saved
/// plan's digest covers exactly what was planned).
///
/// Errors: no plan file found, unreadable or invalid (see [`spec::load`]).
fn load_plan_with_bytes(cli: &Cli, arg: &PlanArg) -> Result<(Plan, Vec<u8>)> {
    let (plan, bytes) = spec::load_with_bytes(&plan_path(arg)?)?;
    let node = spec::node::this_node(cli.node.as_deref()).map_err(|e| miette::miette!("{e}"))?;
    let mut plan = plan.for_node(&node);
    if let Some(dir) = &cli.state_dir {
        plan.state_dir = std::path::absolute(dir).into_diagnostic()?;
    }
    Ok((plan, bytes))
}

fn run(cli: &Cli) -> Result<Exit> {
    match &cli.command {
        Command::Validate(args) => validate::run(cli, args),
        Command::Plan(args) => plan::run(cli, args),
        Command::Apply(args) => apply::run(cli, args),
        Command::Show(args) => show::run(cli, args),
        Command::Verify(args) => verify::run(cli, args),
        Command::Key(args) => key::run(cli, args),
        Command::Device(args) => device::run(cli, args),
        Command::Status(args) => status::run(cli, args),
        Command::Journal(args) => journal::run(cli, args),
        Command::Agent(args) => agent::cmd_agent(cli, args),
        Command::Sign(args) => sign::cmd_sign(args),
        Command::Fleet(args) => fleet::run(args),
        Command::Completions(args) => docs::cmd_completions(args.shell),
        Command::Man(args) => docs::cmd_man(args.out_dir.as_deref()),
        Command::Version(args) => version::run(args),
    }
}
