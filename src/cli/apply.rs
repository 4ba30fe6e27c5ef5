//! `keyplan apply` and `keyplan apply SAVED`: confirmation, progress, signals; the session
//! (lock, journal, interrupted run, rounds) is [`crate::ops::apply::ApplySession`].

use super::*;
use crate::apply::{RunReport, StepEvent};
use crate::ops::apply::{ApplySession, RunOptions};
use crate::ops::plan::PlanRequest;
use crate::ops::saved::PlanFileProblem;
use crate::render::run::{apply_complete, interrupted_text};

/// `keyplan apply` options.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// A plan saved by `keyplan plan -o SAVED`: applied without a prompt.
    #[arg(value_name = "SAVED", conflicts_with_all = ["rotate", "verify", "repair_headers"])]
    pub saved: Option<PathBuf>,
    /// The plan file (`-f`, `--plan`).
    #[command(flatten)]
    pub plan: PlanArg,
    /// Do not ask for confirmation.
    #[arg(long)]
    pub auto_approve: bool,
    /// Rotate KEY now, whatever its age (repeatable).
    #[arg(long, value_name = "KEY")]
    pub rotate: Vec<String>,
    /// Also test every recorded keyslot first (one PBKDF run each) and repair those whose
    /// recorded version does not open them.
    #[arg(long)]
    pub verify: bool,
    /// Write to devices whose two LUKS2 header copies disagree (one damaged): the first
    /// cryptsetup write rewrites the damaged copy from the one keyplan read.
    #[arg(long)]
    pub repair_headers: bool,
    /// Steps (devices) worked on at once, at least 1 (overrides settings.parallelism).
    #[arg(long, value_name = "N", value_parser = parse_parallelism)]
    pub parallelism: Option<usize>,
    /// The `journal` options.
    #[command(flatten)]
    pub journal: RetentionArgs,
}

/// Runs `keyplan apply`, of the plan file or of a saved plan.
pub(super) fn run(cli: &Cli, args: &ApplyArgs) -> Result<Exit> {
    if let Some(saved) = &args.saved {
        return cmd_apply_saved(cli, &args.plan, saved, args.parallelism, &args.journal);
    }
    let req = crate::ops::plan::PlanRequest {
        rotate: args.rotate.clone(),
        verify: args.verify,
        repair_headers: args.repair_headers,
    };
    cmd_apply(
        cli,
        &args.plan,
        args.auto_approve,
        req,
        args.parallelism,
        &args.journal,
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

/// Runs `f` (one run of `session`) with signals deferred to the end of the running steps
/// ([`interrupts`]) and its steps shown by a [`ProgressView`] for `cli`, cleared afterwards.
fn with_progress(
    cli: &Cli,
    parallelism: Option<usize>,
    f: impl FnOnce(RunOptions<'_>, &mut dyn FnMut(StepEvent<'_>)) -> Result<RunReport, Error>,
) -> Result<std::result::Result<RunReport, Error>> {
    let opts = RunOptions {
        parallelism,
        stop: Some(interrupts::install()?),
    };
    let mut view = ProgressView::new(cli);
    let out = interrupts::during_run(|| f(opts, &mut |ev| view.event(ev)));
    view.finish();
    Ok(out)
}

/// `keyplan apply` (docs/commands.md): refuses without a terminal unless `--auto-approve`;
/// finishes an interrupted run first (asking), then shows each round's plan, asks, and runs it.
pub(super) fn cmd_apply(
    cli: &Cli,
    arg: &PlanArg,
    auto_approve: bool,
    req: PlanRequest,
    parallelism: Option<usize>,
    journal: &RetentionArgs,
) -> Result<Exit> {
    let mut plan = load_plan(cli, arg)?;
    plan.journal = journal.retention()?;
    ops::check_rotate_keys(&plan, &req.rotate).or_report(&plan)?;
    if !auto_approve && !io::stdin().is_terminal() {
        let pending = match ops::plan::interrupted_run(&plan) {
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
    let engine = Engine::open(plan.clone()).or_report(&plan)?;
    let mut session = ApplySession::open(&engine).or_report(&plan)?;
    if let Some(s) = session.interrupted().cloned() {
        session.check_resumable().or_report(&plan)?;
        out!("{}", interrupted_text(&s));
        if !auto_approve && !confirm("Finish the interrupted run now?")? {
            outln!("Apply cancelled; nothing was changed.");
            return Ok(Exit::Failure);
        }
        outln!();
        with_progress(cli, parallelism, |o, p| session.resume(o, p))?.or_report(&plan)?;
        outln!("Interrupted run {} finished.\n", s.run);
    }
    let mut unavailable = std::collections::BTreeSet::new();
    while let Some(planned) = session.next_plan(&req).or_report(&plan)? {
        let first = session.round() == 1;
        unavailable.extend(planned.diff.unavailable.keys().cloned());
        let text = render::plan_text_styled(&plan, &planned.diff, stdout_color(cli));
        if planned.diff.is_empty() {
            out!("{text}");
            return Ok(unavailable_exit(&unavailable));
        }
        if !first {
            outln!("\nThe migration is done; planning again with the keys in their new KMS:\n");
        }
        out!("{text}");
        if !auto_approve && !confirm("Do you want to perform these actions?")? {
            outln!(
                "Apply cancelled; nothing {}was changed.",
                if first { "" } else { "more " }
            );
            return Ok(Exit::Failure);
        }
        outln!();
        with_progress(cli, parallelism, |o, p| session.run(&planned, o, p))?.or_report(&plan)?;
    }
    // Every key derivation of this command: planning checks (an enroll_with test), an
    // interrupted run finished first, and this run.
    outln!(
        "\n{}",
        apply_complete(session.totals(), engine.pbkdf_runs())
    );
    Ok(unavailable_exit(&unavailable))
}

/// Exit status 1, with an error naming them, when devices of the plan could not be used (the
/// run went around them: a person has to act), else success.
fn unavailable_exit(devices: &std::collections::BTreeSet<String>) -> Exit {
    if devices.is_empty() {
        return Exit::Success;
    }
    errln!(
        "Error: {} device(s) of the plan cannot be used: {}. keyplan changed nothing on them and rotated no key they list; every other change was made. Replace them or take them out of the plan",
        devices.len(),
        devices.iter().cloned().collect::<Vec<_>>().join(", ")
    );
    Exit::Failure
}

/// `keyplan apply SAVED`: applies exactly the steps of a saved plan, without a prompt, after
/// checking (under the state lock) that nothing it was made from changed and that keyplan
/// plans the same now ([`ApplySession::plan_saved`]). A stale plan is refused with exit 1,
/// naming what changed; nothing is changed then.
///
/// Errors: the saved plan cannot be read or is damaged; its plan file is gone or changed;
/// `--state-dir` names another state directory than the plan was made against; a run holds
/// the lock or was interrupted; the plan is stale; a KMS check fails; the run fails.
pub(super) fn cmd_apply_saved(
    cli: &Cli,
    arg: &PlanArg,
    path: &std::path::Path,
    parallelism: Option<usize>,
    journal: &RetentionArgs,
) -> Result<Exit> {
    let (saved, _) = ops::saved::read(path).map_err(report::bare)?;
    // Advice names the operator's own plan file (`-f` as given), never a path from the file,
    // and repeats the options that shaped the saved plan (`--rotate KEY`, ...).
    let remedy = super::plan::saved_remedy(cli, arg, &saved.options, path);
    let again = remedy.remake_help();
    let (mut plan, bytes) = load_plan_with_bytes(cli, arg)?;
    plan.journal = journal.retention()?;
    match ops::saved::check_plan_file(&saved, &plan, &bytes) {
        Ok(()) => {}
        Err(PlanFileProblem::Differs(m)) => {
            let stale = Error::Stale {
                saved: path.to_path_buf(),
                changed: vec![m],
                help: again,
            };
            return Err(report::bare(stale));
        }
        Err(PlanFileProblem::StateDir(m)) => {
            return Err(miette!(help = again, "{m}; nothing was changed"))
        }
    }
    let engine = Engine::open(plan.clone()).or_report(&plan)?;
    let mut session = ApplySession::open(&engine).or_report(&plan)?;
    let planned = session
        .plan_saved(&saved, path, &bytes, &remedy)
        .or_report(&plan)?;
    // Equal to the saved steps and changes: shown and run as keyplan planned them just now
    // (reasons and notes from keyplan itself, not texts from the file).
    let d = &planned.diff;
    let unavailable = d.unavailable.keys().cloned().collect();
    out!("{}", render::plan_text_styled(&plan, d, stdout_color(cli)));
    if d.is_empty() {
        return Ok(unavailable_exit(&unavailable));
    }
    outln!();
    with_progress(cli, parallelism, |o, p| session.run(&planned, o, p))?.or_report(&plan)?;
    outln!(
        "\n{}",
        apply_complete(session.totals(), engine.pbkdf_runs())
    );
    if d.migrates() {
        outln!(
            "Note: this saved plan moved keys to another KMS and stops there; a rotation that is due runs only after a new plan: run `keyplan plan` again."
        );
    }
    Ok(unavailable_exit(&unavailable))
}
