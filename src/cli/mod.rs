//! The command line (DESIGN.md §4): clap definitions, one function per command, and the
//! mapping of outcomes to exit codes (`0` success / no changes, `1` error, `2` changes present
//! with `--detailed-exitcode`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use miette::{miette, IntoDiagnostic, Result};

use crate::apply::RunFailure;
use crate::diff::{self, DiffOptions};
use crate::journal::{Journal, StateLock};
use crate::observe::{self, World};
use crate::render;
use crate::spec::{self, Plan};

/// `println!` that never panics: a closed stdout (`keyplan plan | head -1`, a dropped ssh
/// session, a dead `tee`) must not turn a run into a crash. Output is informational; the
/// journal is the record, so write errors are ignored.
macro_rules! outln {
    () => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout());
    }};
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `print!` that never panics (see `outln!`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

mod apply;
mod journal;
mod key;
mod plan;
mod show;
mod status;
mod validate;
mod verify;

use apply::{cmd_apply, cmd_apply_saved};
use journal::cmd_journal;
use key::cmd_key_get;
use plan::cmd_plan;
use plan::{check_kms, interrupted_run, interrupted_text, make_diff};
use show::cmd_show;
use status::cmd_status;
use validate::cmd_validate;
use verify::cmd_verify;

/// keyplan: declarative, crash-safe rotation of LUKS keyslots whose passphrases live in a KMS.
#[derive(Debug, Parser)]
#[command(name = "keyplan", version, about, long_about = None)]
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
    /// Colour output (honours NO_COLOR when `auto`).
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// `--color`.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ColorChoice {
    /// Colour when stderr is a terminal and NO_COLOR is unset.
    Auto,
    /// Always colour.
    Always,
    /// Never colour.
    Never,
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
    Validate {
        #[command(flatten)]
        plan: PlanArg,
        /// Print a JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show what `apply` would change. Writes nothing anywhere.
    Plan {
        #[command(flatten)]
        plan: PlanArg,
        /// Exit 0 when there are no changes, 2 when there are, 1 on error.
        #[arg(long)]
        detailed_exitcode: bool,
        /// Rotate KEY now, whatever its age (repeatable).
        #[arg(long, value_name = "KEY")]
        rotate: Vec<String>,
        /// Also test every managed keyslot with its KMS version (one PBKDF run each).
        #[arg(long)]
        verify: bool,
        /// Print a JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// Also save the plan to SAVED (with a digest of the state it was made from), for
        /// `keyplan apply SAVED`.
        #[arg(short = 'o', long = "out", value_name = "SAVED")]
        out: Option<PathBuf>,
    },
    /// Make devices and KMS match the plan (finishing an interrupted run first); or, given a
    /// saved plan, apply exactly its changes, refusing if anything changed since it was made.
    Apply {
        /// A plan saved by `keyplan plan -o SAVED`: applied without a prompt.
        #[arg(value_name = "SAVED", conflicts_with_all = ["file", "rotate", "verify"])]
        saved: Option<PathBuf>,
        #[command(flatten)]
        plan: PlanArg,
        /// Do not ask for confirmation.
        #[arg(long)]
        auto_approve: bool,
        /// Rotate KEY now, whatever its age (repeatable).
        #[arg(long, value_name = "KEY")]
        rotate: Vec<String>,
        /// Also test every recorded keyslot first (one PBKDF run each) and repair those whose
        /// recorded version does not open them.
        #[arg(long)]
        verify: bool,
        /// Steps (devices) worked on at once, at least 1 (overrides settings.parallelism).
        #[arg(long, value_name = "N", value_parser = parse_parallelism)]
        parallelism: Option<usize>,
    },
    /// Render a saved plan; warn (on stderr) when it is stale. Read-only; exit 0 either way.
    Show {
        /// The saved plan file.
        #[arg(value_name = "SAVED")]
        saved: PathBuf,
        /// Print the saved plan as JSON (the `plan --json` shape plus `stale`).
        #[arg(long)]
        json: bool,
    },
    /// Check that every enrolled key's current version opens a bound keyslot of each device
    /// (one PBKDF run per key and device). Read-only.
    Verify {
        #[command(flatten)]
        plan: PlanArg,
    },
    /// Key operations.
    Key {
        /// The key subcommand.
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Per key: its KMS, current version and age, next rotation due, pending and retained
    /// versions; and the last run's outcome. Reads the KMSs and the journal, never a device.
    /// Exit 1 when a rotation is overdue or the last run failed.
    Status {
        #[command(flatten)]
        plan: PlanArg,
    },
    /// Show the journal of runs.
    Journal {
        #[command(flatten)]
        plan: PlanArg,
        /// Print JSON (an array of records) instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// `keyplan key ...`.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Break-glass: write a key version's passphrase bytes to stdout (exactly, no newline).
    /// Refuses when stdout is a terminal unless --reveal is given.
    Get {
        /// Key id from the plan.
        key: String,
        #[command(flatten)]
        plan: PlanArg,
        /// Version (default: current).
        #[arg(long)]
        version: Option<u64>,
        /// Allow printing to a terminal.
        #[arg(long)]
        reveal: bool,
    },
}

fn parse_parallelism(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("must be a whole number of at least 1".to_string()),
    }
}

/// Process entry point: parses arguments, runs the command, maps the outcome to an exit code.
pub fn main() -> ExitCode {
    let _failpoints = crate::failpoint::setup();
    let cli = Cli::parse();
    let color = match cli.color {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => std::env::var_os("NO_COLOR").is_none() && io::stderr().is_terminal(),
    };
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
        Ok(code) => code,
        Err(e) => {
            eprintln!("{e:?}");
            ExitCode::from(1)
        }
    }
}

fn init_logging(cli: &Cli, color: bool) {
    let level = if cli.quiet {
        "error"
    } else {
        match cli.verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
    };
    // The kube client logs each failed request as an ERROR of its own, which only repeats the
    // KMS error keyplan reports (naming the KMS and what to do); shown from `-vv` on.
    let default = if cli.verbose >= 2 {
        level.to_string()
    } else {
        format!("{level},kube_client=off")
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("KEYPLAN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(color)
        .with_target(false)
        .try_init();
}

fn load_plan(cli: &Cli, arg: &PlanArg) -> Result<Plan> {
    let path = match &arg.file {
        Some(p) => p.clone(),
        None => {
            let cwd = std::env::current_dir().into_diagnostic()?;
            spec::find_default(&cwd)?
        }
    };
    let mut plan = spec::load(&path)?;
    if let Some(dir) = &cli.state_dir {
        plan.state_dir = std::path::absolute(dir).into_diagnostic()?;
    }
    Ok(plan)
}

fn run(cli: &Cli) -> Result<ExitCode> {
    match &cli.command {
        Command::Validate { plan, json } => cmd_validate(cli, plan, *json),
        Command::Plan {
            plan,
            detailed_exitcode,
            rotate,
            verify,
            json,
            out,
        } => cmd_plan(
            cli,
            plan,
            *detailed_exitcode,
            rotate,
            *verify,
            *json,
            out.as_deref(),
        ),
        Command::Apply {
            saved: Some(saved),
            parallelism,
            ..
        } => cmd_apply_saved(cli, saved, *parallelism),
        Command::Apply {
            saved: None,
            plan,
            auto_approve,
            rotate,
            verify,
            parallelism,
        } => cmd_apply(cli, plan, *auto_approve, rotate, *verify, *parallelism),
        Command::Show { saved, json } => cmd_show(cli, saved, *json),
        Command::Verify { plan } => cmd_verify(cli, plan),
        Command::Key {
            command:
                KeyCommand::Get {
                    key,
                    plan,
                    version,
                    reveal,
                },
        } => cmd_key_get(cli, plan, key, *version, *reveal),
        Command::Journal { plan, json } => cmd_journal(cli, plan, *json),
        Command::Status { plan } => cmd_status(cli, plan),
    }
}

fn check_rotate_keys(plan: &Plan, rotate: &[String]) -> Result<()> {
    for k in rotate {
        if !plan.keys.contains_key(k) {
            return Err(miette!(
                help = format!(
                    "keys in {}: {}",
                    plan.source_path.display(),
                    plan.keys.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
                "--rotate {k}: no such key in the plan"
            ));
        }
    }
    Ok(())
}
