//! The command line (DESIGN.md §4): clap definitions, one function per command, and the
//! mapping of outcomes to exit codes (`0` success / no changes, `1` error, `2` changes present
//! with `--detailed-exitcode`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use miette::{miette, IntoDiagnostic, Result};

use crate::apply::{self, RunFailure};
use crate::diff::{self, DiffOptions};
use crate::journal::{self, Journal, StateLock};
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
    },
    /// Make devices and KMS match the plan (finishing an interrupted run first).
    Apply {
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
        } => cmd_plan(cli, plan, *detailed_exitcode, rotate, *verify, *json),
        Command::Apply {
            plan,
            auto_approve,
            rotate,
            verify,
            parallelism,
        } => cmd_apply(cli, plan, *auto_approve, rotate, *verify, *parallelism),
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

fn cmd_validate(cli: &Cli, arg: &PlanArg, json: bool) -> Result<ExitCode> {
    match load_plan(cli, arg) {
        Ok(plan) => {
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"format_version": "1.0", "valid": true, "error_count": 0, "warning_count": 0, "diagnostics": []})
                );
            } else {
                outln!(
                    "The plan file {} is valid: {} KMS, {} keys, {} devices.",
                    plan.source_path.display(),
                    plan.kms.len(),
                    plan.keys.len(),
                    plan.devices.len()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) if json => {
            outln!(
                "{}",
                serde_json::json!({"format_version": "1.0", "valid": false, "error_count": 1, "warning_count": 0,
                    "diagnostics": [{"severity": "error", "summary": e.to_string(), "detail": format!("{e:?}")}]})
            );
            Ok(ExitCode::from(1))
        }
        Err(e) => Err(e),
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

/// Observes and diffs; errors from the diff become one report.
fn make_diff(
    plan: &Plan,
    world: &World,
    rotate: &[String],
    verify: bool,
) -> Result<(observe::Observed, diff::Diff)> {
    let mut observed = observe::observe(plan, world)?;
    if verify {
        verify_records(plan, world, &mut observed)?;
    }
    let d = diff::diff(
        plan,
        &observed,
        &DiffOptions {
            rotate: rotate.to_vec(),
        },
    )
    .map_err(|errs| {
        miette!(
            "no safe plan exists:\n  - {}",
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n  - ")
        )
    })?;
    check_kms(plan, world, &d)?;
    Ok((observed, d))
}

/// Before any device is touched: every KMS the plan would write to must be reachable and
/// allow keyplan to stage, commit and retire (or destroy) those keys ([`crate::kms::Kms::check`],
/// which writes nothing). Rook rotated devices and only then found its KMS could not store
/// the new key; keyplan refuses the plan instead.
fn check_kms(plan: &Plan, world: &World, d: &diff::Diff) -> Result<()> {
    use crate::graph::Step;
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for step in d.graph.steps() {
        if let Step::DestroyOrigin {
            from_kms,
            from_name,
            ..
        } = &step
        {
            names
                .entry(from_kms.clone())
                .or_default()
                .insert(from_name.clone());
        }
        if let Some(k) = step.kms_key().and_then(|key| plan.keys.get(key)) {
            names
                .entry(k.kms.clone())
                .or_default()
                .insert(k.name.clone());
        }
    }
    let mut problems = Vec::new();
    for (instance, set) in names {
        if let Some(kms) = world.kms.get(&instance) {
            let list: Vec<String> = set.into_iter().collect();
            tracing::debug!(kms = %instance, keys = ?list, "checking KMS before planning writes");
            if let Err(e) = kms.check(&list) {
                problems.push(e.to_string());
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(miette!(
        help = "fix the KMS (address, credentials, permissions), then run `keyplan plan` again",
        "the plan needs to write to a KMS that failed its check; no device was touched and nothing was staged:\n  - {}",
        problems.join("\n  - ")
    ))
}

/// `plan --verify`: test every valid record of a current version; failures become drift.
fn verify_records(plan: &Plan, world: &World, observed: &mut observe::Observed) -> Result<()> {
    for dev in observed.devices.values_mut() {
        for r in dev.records.iter_mut() {
            if r.status != observe::RecordStatus::Valid {
                continue;
            }
            let Some(key) = plan.keys.get(&r.record.key) else {
                continue;
            };
            let kms = world.kms_for(plan, &key.id).map_err(|e| miette!("{e}"))?;
            let Ok(p) = kms.get(&key.name, r.record.version) else {
                r.status = observe::RecordStatus::FailedVerify;
                continue;
            };
            let bound = dev.header.keyslots.get(&r.slot).is_some_and(|k| k.bound);
            let opens = world
                .cs
                .test_passphrase(&dev.path, r.slot, &p)
                .map_err(|e| miette!("{e}"))?;
            if !(opens && bound) {
                r.status = observe::RecordStatus::FailedVerify;
            }
        }
    }
    Ok(())
}

/// The last run of the journal when it was interrupted (no `run_end`).
///
/// Errors: the journal is corrupt, or a run holds the state lock right now (its journal is
/// in flux: planning against a half-done run would mislead).
fn interrupted_run(plan: &Plan) -> Result<Option<journal::RunSummary>> {
    if let Some(holder) = journal::lock_holder(&plan.state_dir) {
        return Err(miette!(
            help = "wait for it to finish, then run `keyplan plan` again",
            "a keyplan run is in progress on {}: {holder}",
            plan.state_dir.display()
        ));
    }
    let records = journal::read(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    Ok(journal::last_run(&records).filter(|s| s.ended.is_none()))
}

/// Describes an interrupted run and the steps it has left.
fn interrupted_text(s: &journal::RunSummary) -> String {
    let done = s.done.iter().filter(|d| **d).count();
    let mut out = format!(
        "Run {} was interrupted ({done} of {} steps done). `keyplan apply` finishes it first; remaining steps:\n",
        s.run,
        s.steps.len()
    );
    for (i, step) in s.steps.iter().enumerate().filter(|(i, _)| !s.done[*i]) {
        let note = if s.started_not_done[i] {
            "  (was under way)"
        } else {
            ""
        };
        out.push_str(&format!("  - [{i}] {step}{note}\n"));
    }
    out
}

fn cmd_plan(
    cli: &Cli,
    arg: &PlanArg,
    detailed: bool,
    rotate: &[String],
    verify: bool,
    json: bool,
) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    check_rotate_keys(&plan, rotate)?;
    let world = World::open(&plan)?;
    if let Some(s) = interrupted_run(&plan)? {
        // What is on the devices now is half of that run: a diff would mislead.
        if json {
            let doc = serde_json::json!({
                "format_version": "1.0",
                "changes_present": true,
                "interrupted_run": {
                    "run": s.run,
                    "steps": s.steps,
                    "done": s.done,
                },
            });
            outln!("{}", serde_json::to_string_pretty(&doc).into_diagnostic()?);
        } else {
            out!("{}", interrupted_text(&s));
            outln!("\nRun `keyplan apply` to finish it, then `keyplan plan` again.");
        }
        return Ok(if detailed {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        });
    }
    let (_, d) = make_diff(&plan, &world, rotate, verify)?;
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&render::plan_json(&d)).into_diagnostic()?
        );
    } else {
        out!("{}", render::plan_text(&plan, &d));
    }
    Ok(if detailed && !d.is_empty() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}

/// SIGINT/SIGTERM/SIGHUP during `apply`: the first signal lets the running steps finish and then stops
/// the run (left open in the journal, exit 1); a second signal exits at once (safe at any
/// instant: the journal and the step algorithm make every instant resumable, and cryptsetup
/// children die with keyplan, see `luks::run`). Outside a run (planning, the confirmation
/// prompt) a signal exits at once: nothing is being changed then.
mod interrupts {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::OnceLock;

    use miette::{IntoDiagnostic as _, Result};

    /// Set by the first signal during a run.
    static STOP: AtomicBool = AtomicBool::new(false);
    /// True while a step graph runs.
    static ACTIVE: AtomicBool = AtomicBool::new(false);
    static INSTALLED: OnceLock<()> = OnceLock::new();

    fn say(msg: &[u8]) {
        // SAFETY: write(2) is async-signal-safe; `msg` is a valid buffer of `msg.len()` bytes.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
        }
    }

    fn on_signal() {
        if !ACTIVE.load(Ordering::SeqCst) {
            say(b"\nkeyplan: interrupted\n");
            signal_hook::low_level::exit(1);
        }
        if STOP.swap(true, Ordering::SeqCst) {
            say(b"\nkeyplan: second signal: exiting now. The journal records the interrupted run; run `keyplan apply` to finish it.\n");
            signal_hook::low_level::exit(1);
        }
        say(b"\nkeyplan: signal received: finishing the running steps, then stopping (send it again to exit at once)\n");
    }

    /// Installs the SIGINT, SIGTERM and SIGHUP handlers (once) and returns the stop flag.
    ///
    /// Errors: the handlers could not be installed (sigaction(2) failed).
    pub(super) fn install() -> Result<&'static AtomicBool> {
        if INSTALLED.get().is_none() {
            for sig in [
                signal_hook::consts::SIGINT,
                signal_hook::consts::SIGTERM,
                signal_hook::consts::SIGHUP,
            ] {
                // SAFETY: the handler uses only atomics, write(2) and _exit(2), all
                // async-signal-safe; it allocates and locks nothing.
                unsafe { signal_hook::low_level::register(sig, on_signal) }.into_diagnostic()?;
            }
            let _ = INSTALLED.set(());
        }
        Ok(&STOP)
    }

    /// Runs `f` (a step graph) with signals deferred to the end of the running steps.
    pub(super) fn during_run<T>(f: impl FnOnce() -> T) -> T {
        ACTIVE.store(!STOP.load(Ordering::SeqCst), Ordering::SeqCst);
        let out = f();
        ACTIVE.store(false, Ordering::SeqCst);
        out
    }
}

fn progress_printer(quiet: bool) -> impl FnMut(&str, &std::result::Result<String, String>) {
    move |desc, res| {
        if quiet {
            return;
        }
        match res {
            Ok(o) => outln!("  {desc}: {o}"),
            Err(e) => outln!("  {desc}: FAILED: {e}"),
        }
    }
}

fn failure_report(f: RunFailure, what: &str) -> miette::Report {
    if f.interrupted {
        return miette!(
            help = "run `keyplan apply` again to finish the run: it continues from the journal",
            "{what} {} was interrupted: {}. {} steps completed; every device still opens with its key's current version",
            f.run,
            f.error,
            f.completed.len()
        );
    }
    miette!(
        help = "every step is idempotent and the journal records progress: fix the cause, then run `keyplan apply` again. keyplan killed no keyslot without first verifying another one on the same device.",
        "{what} {} failed: {}\n({} steps completed before the failure)",
        f.run,
        f.error,
        f.completed.len()
    )
}

/// Asks `question` on the terminal; true only for the answer `yes`.
fn confirm(question: &str) -> Result<bool> {
    out!("\n{question} Only 'yes' will be accepted: ");
    let _ = io::stdout().flush();
    let mut answer = String::new();
    io::stdin()
        .lock()
        .read_line(&mut answer)
        .into_diagnostic()?;
    Ok(answer.trim() == "yes")
}

fn cmd_apply(
    cli: &Cli,
    arg: &PlanArg,
    auto_approve: bool,
    rotate: &[String],
    verify: bool,
    parallelism: Option<usize>,
) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    check_rotate_keys(&plan, rotate)?;
    if !auto_approve && !io::stdin().is_terminal() {
        let pending = match interrupted_run(&plan) {
            Ok(Some(s)) => format!(
                " (run {} was interrupted and will be finished first: see `keyplan plan`)",
                s.run
            ),
            _ => String::new(),
        };
        return Err(miette!(
            help = "run `keyplan apply --auto-approve` in scripts and pipelines",
            "refusing to apply: no terminal to ask for confirmation on; nothing was changed{pending}"
        ));
    }
    let parallelism = parallelism.unwrap_or(plan.parallelism);
    let world = World::open(&plan)?;
    let _lock = StateLock::acquire(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    let mut journal = Journal::open(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    let records = journal::read(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    if let Some(s) = journal::last_run(&records).filter(|s| s.ended.is_none()) {
        for (id, path) in &s.devices {
            if let Some(d) = plan.devices.get(id) {
                if d.path.display().to_string() != *path {
                    return Err(miette!(
                        help = "restore the device's path in the plan file to finish the interrupted run, then change it",
                        "device {id} was {path} in the interrupted run but is now {} in the plan; refusing to resume",
                        d.path.display()
                    ));
                }
            }
        }
        for step in &s.steps {
            if let Some((key, to_kms, to_name)) = step.migration_target() {
                let now = plan
                    .keys
                    .get(key)
                    .map(|k| (k.kms.as_str(), k.name.as_str()));
                if now != Some((to_kms, to_name)) {
                    return Err(miette!(
                        help = format!("put key {key} back in KMS {to_kms:?} (name {to_name:?}) in the plan, run `keyplan apply` to finish the move, then change the plan"),
                        "the interrupted run {} moves key {key} to KMS {to_kms:?} ({to_name}), but the plan now puts it {}; refusing to resume, nothing was changed",
                        s.run,
                        match now {
                            Some((k, n)) => format!("in KMS {k:?} ({n})"),
                            None => "nowhere (the key left the plan)".to_owned(),
                        }
                    ));
                }
            }
        }
        out!("{}", interrupted_text(&s));
        if !auto_approve && !confirm("Finish the interrupted run now?")? {
            outln!("Apply cancelled; nothing was changed.");
            return Ok(ExitCode::from(1));
        }
        outln!();
        tracing::info!(run = %s.run, "finishing interrupted run");
        let graph = crate::graph::StepGraph::from_parts(s.steps.clone(), &s.deps);
        let mut progress = progress_printer(cli.quiet);
        let input = apply::RunInput {
            plan: &plan,
            world: &world,
            graph: &graph,
            run_id: &s.run,
            resume: Some(&s),
            parallelism,
            stop: Some(interrupts::install()?),
        };
        interrupts::during_run(|| apply::run_graph(input, &mut journal, &mut progress))
            .map_err(|f| failure_report(f, "finishing interrupted run"))?;
        outln!("Interrupted run {} finished.\n", s.run);
    }
    let mut totals = (0usize, 0usize, 0usize, 0usize);
    // Round 2 exists only after a migration: a rotation that is due (or asked for) runs once
    // the key is in its new KMS.
    for round in 0..2 {
        let (observed, d) = make_diff(
            &plan,
            &world,
            rotate,
            if round == 0 { verify } else { false },
        )?;
        if d.is_empty() {
            if round == 0 {
                out!("{}", render::plan_text(&plan, &d));
                return Ok(ExitCode::SUCCESS);
            }
            break;
        }
        if round == 1 {
            outln!("\nThe migration is done; planning again with the keys in their new KMS:\n");
        }
        out!("{}", render::plan_text(&plan, &d));
        if !auto_approve && !confirm("Do you want to perform these actions?")? {
            outln!(
                "Apply cancelled; nothing {}was changed.",
                if round == 1 { "more " } else { "" }
            );
            return Ok(ExitCode::from(1));
        }
        outln!();
        observe::update_registry(&plan.state_dir, &observed).map_err(|e| miette!("{e}"))?;
        let run_id = apply::new_run_id();
        tracing::info!(run = %run_id, steps = d.graph.len(), "starting run");
        let mut progress = progress_printer(cli.quiet);
        let input = apply::RunInput {
            plan: &plan,
            world: &world,
            graph: &d.graph,
            run_id: &run_id,
            resume: None,
            parallelism,
            stop: Some(interrupts::install()?),
        };
        let report =
            interrupts::during_run(|| apply::run_graph(input, &mut journal, &mut progress))
                .map_err(|f| failure_report(f, "run"))?;
        totals.0 += d.adds();
        totals.1 += d.removes();
        totals.2 += d.rotations();
        totals.3 += report.steps_run;
        let migrated = d.keys.iter().any(|k| k.action == diff::KeyAction::Migrate);
        if !migrated {
            break;
        }
    }
    // Every key derivation of this command: planning checks (an enroll_with test), an
    // interrupted run finished first, and this run.
    outln!(
        "\nApply complete! {} added, {} removed, {} keys rotated. ({} steps, {} PBKDF runs)",
        totals.0,
        totals.1,
        totals.2,
        totals.3,
        world.cs.pbkdf_runs()
    );
    Ok(ExitCode::SUCCESS)
}

fn cmd_status(cli: &Cli, arg: &PlanArg) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    let world = World::open(&plan)?;
    let now = crate::kms::now_unix();
    let mut unhealthy = Vec::new();
    let records = journal::read(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    let committed = committed_keys(&records);
    for (id, key) in &plan.keys {
        let kms = world.kms_for(&plan, id).map_err(|e| miette!("{e}"))?;
        outln!("key {id} in {}:", kms.describe());
        let st = match kms.read(&key.name) {
            Ok(st) => st,
            Err(e) => {
                outln!("  cannot read: {e}");
                unhealthy.push(format!("key {id}: KMS unreadable"));
                continue;
            }
        };
        match st.current_info() {
            None if committed.contains(id) => {
                outln!("  NO CURRENT VERSION, although a run committed one: the KMS lost the key or the plan points at the wrong KMS/name (`keyplan plan` explains)");
                unhealthy.push(format!("key {id}: missing from its KMS"));
            }
            None => outln!("  no current version (not created yet)"),
            Some(c) => {
                let age = now.saturating_sub(c.created_at);
                outln!(
                    "  current  v{} ({} old)",
                    c.version,
                    diff::short_duration(std::time::Duration::from_secs(age))
                );
                if let Some(limit) = key.rotate_after {
                    let due = c.created_at.saturating_add(limit.as_secs());
                    if due <= now {
                        outln!(
                            "  rotation OVERDUE by {} (rotate_after {})",
                            diff::short_duration(std::time::Duration::from_secs(now - due)),
                            key.rotate_after_text.as_deref().unwrap_or("?")
                        );
                        unhealthy.push(format!("key {id}: rotation overdue"));
                    } else {
                        outln!(
                            "  rotation due in {}",
                            diff::short_duration(std::time::Duration::from_secs(due - now))
                        );
                    }
                }
            }
        }
        if let Some(p) = st.pending {
            outln!("  pending  v{p} (a rotation is under way: run `keyplan apply`)");
        }
        let retained = st.retained_previous();
        if !retained.is_empty() {
            let list: Vec<String> = retained.iter().map(|v| format!("v{v}")).collect();
            outln!(
                "  retained {} (material kept until no device holds it)",
                list.join(", ")
            );
        }
    }
    match journal::last_run(&records) {
        None => outln!("last run: none"),
        Some(r) => {
            let outcome = r.ended.clone().unwrap_or_else(|| "interrupted".into());
            outln!("last run: {} ({outcome})", r.run);
            if outcome != "success" {
                unhealthy.push(format!("last run {outcome}"));
            }
        }
    }
    if unhealthy.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        outln!("UNHEALTHY: {}", unhealthy.join("; "));
        Ok(ExitCode::from(1))
    }
}

/// Key ids for which a run of the journal finished a commit or a migration copy (the key
/// existed in its KMS then).
fn committed_keys(records: &[journal::Record]) -> BTreeSet<String> {
    use crate::graph::Step;
    let mut steps: BTreeMap<&str, &Vec<Step>> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for r in records {
        match &r.event {
            journal::Event::RunStart { steps: s, .. } => {
                steps.insert(r.run.as_str(), s);
            }
            journal::Event::StepDone { step, .. } => {
                if let Some(Step::Commit { key, .. } | Step::MigrateCopy { key, .. }) =
                    steps.get(r.run.as_str()).and_then(|s| s.get(*step))
                {
                    out.insert(key.clone());
                }
            }
            _ => {}
        }
    }
    out
}

fn cmd_verify(cli: &Cli, arg: &PlanArg) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    let world = World::open(&plan)?;
    let observed = observe::observe(&plan, &world)?;
    let mut failures = 0usize;
    for dev in plan.devices.values() {
        let Some(st) = observed.devices.get(&dev.id) else {
            continue;
        };
        for k in &dev.keys {
            let Some(key) = plan.keys.get(&k.key) else {
                continue;
            };
            let Some(cur) = observed.keys.get(&k.key).and_then(|s| s.current) else {
                outln!(
                    "FAIL  {}: {} has no current version in the KMS",
                    dev.id,
                    k.key
                );
                failures += 1;
                continue;
            };
            let Some((slot, _)) = st.slots_of(&k.key).into_iter().find(|(_, v)| *v == cur) else {
                outln!(
                    "FAIL  {}: {} v{cur} is not enrolled (no keyslot recorded)",
                    dev.id,
                    k.key
                );
                failures += 1;
                continue;
            };
            let kms = world.kms_for(&plan, &k.key).map_err(|e| miette!("{e}"))?;
            let pass = kms.get(&key.name, cur).map_err(|e| miette!("{e}"))?;
            let bound = st.header.keyslots.get(&slot).is_some_and(|s| s.bound);
            let opens = world
                .cs
                .test_passphrase(&dev.path, slot, &pass)
                .map_err(|e| miette!("{e}"))?;
            if opens && bound {
                outln!(
                    "ok    {}: {} v{cur} opens bound keyslot {slot}",
                    dev.id,
                    k.key
                );
            } else {
                outln!(
                    "FAIL  {}: {} v{cur} {} keyslot {slot}",
                    dev.id,
                    k.key,
                    if opens {
                        "opens an UNBOUND"
                    } else {
                        "does not open"
                    }
                );
                failures += 1;
            }
        }
    }
    if failures > 0 {
        outln!();
        return Err(miette!(
            help = "run `keyplan plan --verify` to see what keyplan would repair",
            "verification failed for {failures} key(s)"
        ));
    }
    outln!("All keys verified ({} PBKDF runs).", world.cs.pbkdf_runs());
    Ok(ExitCode::SUCCESS)
}

fn cmd_key_get(
    cli: &Cli,
    arg: &PlanArg,
    key: &str,
    version: Option<u64>,
    reveal: bool,
) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    let Some(spec) = plan.keys.get(key) else {
        return Err(miette!("no key {key:?} in {}", plan.source_path.display()));
    };
    let world = World::open(&plan)?;
    let kms = world.kms_for(&plan, key).map_err(|e| miette!("{e}"))?;
    let version = match version {
        Some(v) => v,
        None => kms
            .read(&spec.name)
            .map_err(|e| miette!("{e}"))?
            .current
            .ok_or_else(|| {
                miette!(
                    "{}: key {key} has no current version yet; run `keyplan apply`",
                    kms.describe()
                )
            })?,
    };
    let stdout = io::stdout();
    if stdout.is_terminal() && !reveal {
        return Err(miette!(
            help = "pipe it (`keyplan key get KEY | cryptsetup open --key-file=- ...`) or add --reveal",
            "refusing to print key material to a terminal"
        ));
    }
    let state = kms.read(&spec.name).map_err(|e| miette!("{e}"))?;
    if let Some(info) = state.versions.get(&version) {
        if info.state == crate::kms::VersionState::Retired {
            return Err(miette!(
                "{}: {key} v{version} was retired: its material was destroyed after a rotation, as no device held it any more",
                kms.describe()
            ));
        }
    }
    let pass = kms.get(&spec.name, version).map_err(|e| miette!("{e}"))?;
    let mut lock = stdout.lock();
    lock.write_all(pass.expose()).into_diagnostic()?;
    lock.flush().into_diagnostic()?;
    Ok(ExitCode::SUCCESS)
}

fn cmd_journal(cli: &Cli, arg: &PlanArg, json: bool) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    let records = journal::read(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&records).into_diagnostic()?
        );
        return Ok(ExitCode::SUCCESS);
    }
    if records.is_empty() {
        outln!("The journal in {} is empty.", plan.state_dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    let mut steps: Vec<crate::graph::Step> = Vec::new();
    for r in &records {
        let ts = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(r.ts),
        );
        let line = match &r.event {
            journal::Event::RunStart {
                steps: s,
                host,
                pid,
                ..
            } => {
                steps.clone_from(s);
                format!("run started: {} steps (pid {pid} on {host})", s.len())
            }
            journal::Event::StepStart { step } => format!("start  {}", describe(&steps, *step)),
            journal::Event::StepDone { step, outcome, .. } => {
                format!("done   {}: {outcome}", describe(&steps, *step))
            }
            journal::Event::StepFailed { step, error } => {
                format!("FAILED {}: {error}", describe(&steps, *step))
            }
            journal::Event::RunResumed { pid } => format!("run resumed by pid {pid}"),
            journal::Event::RunEnd { outcome, message } => match message {
                Some(m) => format!("run ended: {outcome}: {m}"),
                None => format!("run ended: {outcome}"),
            },
        };
        outln!("{ts}  {}  {line}", r.run);
    }
    Ok(ExitCode::SUCCESS)
}

fn describe(steps: &[crate::graph::Step], i: usize) -> String {
    steps
        .get(i)
        .map_or_else(|| format!("step {i}"), |s| format!("[{i}] {s}"))
}
