//! `keyplan apply`: confirmation, resuming an interrupted run, signals, the run itself.

use super::*;

/// SIGINT/SIGTERM/SIGHUP during `apply`: the first signal lets the running steps finish and then stops
/// the run (left open in the journal, exit 1); a second signal exits at once (safe at any
/// instant: the journal and the step algorithm make every instant resumable, and cryptsetup
/// children die with keyplan, see `luks::run`). Outside a run (planning, the confirmation
/// prompt) a signal exits at once: nothing is being changed then.
pub(super) mod interrupts {
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

/// How an `apply` run shows its steps (see README "Operator comfort"):
/// - stdout a terminal, no `--quiet`, no `-v` (log lines would tear the display): one spinner
///   line per running step (device, step, elapsed) under a bar of steps done/total, drawn by
///   `indicatif`; each finished step also leaves a line in the scrollback.
/// - otherwise one plain line per finished step, stable for logs and scripts:
///   `  [3/8] osd0: add osd-kek v2 into keyslot 2 (unlock with osd-kek v1): added keyslot 2 (1.2s)`
///   or `  [FAILED] ...: after 1.2s: <error>` (the counter counts finished steps only).
/// - `--quiet`: nothing.
pub(super) struct ProgressView {
    mode: ViewMode,
    /// Start instant of each running step, by step index.
    started: BTreeMap<usize, std::time::Instant>,
}

enum ViewMode {
    Quiet,
    Lines,
    Bars {
        multi: indicatif::MultiProgress,
        overall: indicatif::ProgressBar,
        running: BTreeMap<usize, indicatif::ProgressBar>,
    },
}

/// `1.2s`, or `2m03s` from a minute on: the elapsed time of a step, in progress lines.
pub(super) fn elapsed_text(d: std::time::Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1}s")
    } else {
        let whole = d.as_secs();
        format!("{}m{:02}s", whole / 60, whole % 60)
    }
}

impl ProgressView {
    /// Picks the display for `cli` (see [`ProgressView`]).
    pub(super) fn new(cli: &Cli) -> ProgressView {
        let mode = if cli.quiet {
            ViewMode::Quiet
        } else if cli.verbose == 0 && io::stdout().is_terminal() {
            let multi =
                indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stdout());
            let overall = multi.add(indicatif::ProgressBar::new(0));
            let style = indicatif::ProgressStyle::with_template(
                "  [{bar:30}] {pos}/{len} steps, {elapsed}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            overall.set_style(style);
            ViewMode::Bars {
                multi,
                overall,
                running: BTreeMap::new(),
            }
        } else {
            ViewMode::Lines
        };
        ProgressView {
            mode,
            started: BTreeMap::new(),
        }
    }

    /// Shows one executor event.
    pub(super) fn event(&mut self, ev: crate::apply::StepEvent<'_>) {
        use crate::apply::StepEvent;
        match ev {
            StepEvent::Started {
                step, total, desc, ..
            } => {
                self.started.insert(step, std::time::Instant::now());
                if let ViewMode::Bars {
                    multi,
                    overall,
                    running,
                } = &mut self.mode
                {
                    overall.set_length(total as u64);
                    let spinner =
                        multi.insert_before(overall, indicatif::ProgressBar::new_spinner());
                    if let Ok(style) =
                        indicatif::ProgressStyle::with_template("  {spinner} {msg} ({elapsed})")
                    {
                        spinner.set_style(style);
                    }
                    spinner.set_message(desc.to_string());
                    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
                    running.insert(step, spinner);
                }
            }
            StepEvent::Finished {
                step,
                total,
                done,
                desc,
                result,
                ..
            } => {
                let took = self
                    .started
                    .remove(&step)
                    .map(|t| elapsed_text(t.elapsed()))
                    .unwrap_or_default();
                let line = match result {
                    Ok(o) => format!("  [{done}/{total}] {desc}: {o} ({took})"),
                    Err(e) => format!("  [FAILED] {desc}: after {took}: {e}"),
                };
                match &mut self.mode {
                    ViewMode::Quiet => {}
                    ViewMode::Lines => outln!("{line}"),
                    ViewMode::Bars {
                        multi,
                        overall,
                        running,
                    } => {
                        if let Some(sp) = running.remove(&step) {
                            sp.finish_and_clear();
                            multi.remove(&sp);
                        }
                        overall.set_length(total as u64);
                        overall.set_position(done as u64);
                        let _ = multi.println(&line);
                    }
                }
            }
        }
    }

    /// Removes the spinners and the bar (the finished-step lines stay).
    pub(super) fn finish(&mut self) {
        if let ViewMode::Bars {
            multi,
            overall,
            running,
        } = &mut self.mode
        {
            for (_, sp) in std::mem::take(running) {
                sp.finish_and_clear();
            }
            overall.finish_and_clear();
            let _ = multi.clear();
        }
    }
}

/// Runs `input` with signals deferred (see [`interrupts`]) and progress shown by a
/// [`ProgressView`] for `cli`; the display is cleared before the result is returned.
fn run_with_progress(
    cli: &Cli,
    input: crate::apply::RunInput<'_>,
    journal: &mut Journal,
) -> std::result::Result<crate::apply::RunReport, RunFailure> {
    let mut view = ProgressView::new(cli);
    let out = interrupts::during_run(|| {
        crate::apply::run_graph(input, journal, &mut |ev| view.event(ev))
    });
    view.finish();
    out
}

pub(super) fn failure_report(f: RunFailure, what: &str) -> miette::Report {
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
pub(super) fn confirm(question: &str) -> Result<bool> {
    out!("\n{question} Only 'yes' will be accepted: ");
    let _ = io::stdout().flush();
    let mut answer = String::new();
    io::stdin()
        .lock()
        .read_line(&mut answer)
        .into_diagnostic()?;
    Ok(answer.trim() == "yes")
}

pub(super) fn cmd_apply(
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
    let records = crate::journal::read(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    if let Some(s) = crate::journal::last_run(&records).filter(|s| s.ended.is_none()) {
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
        let input = crate::apply::RunInput {
            plan: &plan,
            world: &world,
            graph: &graph,
            run_id: &s.run,
            resume: Some(&s),
            parallelism,
            memory_budget_kib: memory_budget_kib(&plan, parallelism, None),
            stop: Some(interrupts::install()?),
            // Not journaled: the resumed adds try keyslots (one PBKDF run per keyslot tried).
            enroll_with_keyslots: &BTreeMap::new(),
        };
        run_with_progress(cli, input, &mut journal)
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
                out!("{}", render::plan_text_styled(&plan, &d, stdout_color(cli)));
                return Ok(ExitCode::SUCCESS);
            }
            break;
        }
        if round == 1 {
            outln!("\nThe migration is done; planning again with the keys in their new KMS:\n");
        }
        out!("{}", render::plan_text_styled(&plan, &d, stdout_color(cli)));
        if !auto_approve && !confirm("Do you want to perform these actions?")? {
            outln!(
                "Apply cancelled; nothing {}was changed.",
                if round == 1 { "more " } else { "" }
            );
            return Ok(ExitCode::from(1));
        }
        outln!();
        let report = run_new(
            cli,
            &plan,
            &world,
            &mut journal,
            &observed,
            &d.graph,
            parallelism,
        )?;
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
    apply_complete(totals, world.cs.pbkdf_runs());
    Ok(ExitCode::SUCCESS)
}

/// The PBKDF memory budget of a run in KiB (`settings.memory_budget_kib`, or half the available
/// memory: [`crate::apply::memory::budget`]). Logged at info level; when it holds fewer PBKDF
/// runs than `parallelism` asks for, a warning on stderr says so (devices then wait for memory
/// rather than swap). The cost of one run is the larger of a new keyslot's argon2 memory (the
/// plan's `memory_kib`, else cryptsetup's default of up to 1 GiB) and the largest argon2 memory
/// of the keyslots the `observed` devices already have (`None`: not known, when finishing an
/// interrupted run), plus 16 MiB for cryptsetup.
fn memory_budget_kib(plan: &Plan, parallelism: usize, observed: Option<&observe::Observed>) -> u64 {
    use crate::apply::memory;
    let budget = memory::budget(plan.memory_budget_kib);
    let new = crate::apply::new_keyslot_memory_kib(plan, crate::luks::LuksVersion::Luks2);
    let existing = observed.and_then(|o| {
        o.devices
            .values()
            .flat_map(|d| d.header.keyslots.values())
            .filter_map(|k| k.memory_kib)
            .max()
    });
    let per_run = memory::pbkdf_kib(new.max(existing));
    let fits = usize::try_from(budget.kib / per_run).unwrap_or(usize::MAX);
    tracing::info!(
        budget_kib = budget.kib,
        per_pbkdf_kib = per_run,
        "PBKDF memory budget {} ({}): {fits} PBKDF runs of {} at once",
        memory::mib_text(budget.kib),
        budget.why,
        memory::mib_text(per_run)
    );
    if fits < parallelism.min(plan.devices.len()) {
        let advice = if existing > new {
            "existing keyslots with a larger argon2 memory cost are unlocked as they are; raise settings.memory_budget_kib to run more at once"
        } else if plan.pbkdf.as_ref().is_some_and(|p| p.memory_kib.is_some()) {
            "raise settings.memory_budget_kib or lower settings.pbkdf.memory_kib to run more at once"
        } else {
            "without settings.pbkdf.memory_kib each run may take cryptsetup's default of up to 1 GiB; set it, or raise settings.memory_budget_kib, to run more at once"
        };
        tracing::warn!(
            "the PBKDF memory budget of {} ({}) holds {} PBKDF run(s) of up to {} at once, fewer than parallelism {parallelism}: devices wait for memory rather than swap ({advice})",
            memory::mib_text(budget.kib),
            budget.why,
            fits.max(1),
            memory::mib_text(per_run)
        );
    }
    budget.kib
}

/// Runs `graph` as a new run (the caller holds the state lock): records the plan's devices in
/// the registry, then runs the steps with the journal, the progress printer and deferred
/// signals.
///
/// Errors: the registry cannot be written, the signal handlers cannot be installed, or the run
/// failed or was interrupted (reported by [`failure_report`]).
fn run_new(
    cli: &Cli,
    plan: &Plan,
    world: &World,
    journal: &mut Journal,
    observed: &observe::Observed,
    graph: &crate::graph::StepGraph,
    parallelism: usize,
) -> Result<crate::apply::RunReport> {
    observe::update_registry(&plan.state_dir, observed).map_err(|e| miette!("{e}"))?;
    let run_id = crate::apply::new_run_id();
    tracing::info!(run = %run_id, steps = graph.len(), "starting run");
    let enroll_with_keyslots: BTreeMap<String, u32> = observed
        .devices
        .iter()
        .filter_map(|(id, d)| d.enroll_with_keyslot.map(|n| (id.clone(), n)))
        .collect();
    let input = crate::apply::RunInput {
        plan,
        world,
        graph,
        run_id: &run_id,
        resume: None,
        parallelism,
        memory_budget_kib: memory_budget_kib(plan, parallelism, Some(observed)),
        stop: Some(interrupts::install()?),
        enroll_with_keyslots: &enroll_with_keyslots,
    };
    run_with_progress(cli, input, journal).map_err(|f| failure_report(f, "run"))
}

/// `keyplan apply SAVED`: applies exactly the steps of a saved plan, without a prompt, after
/// checking (under the state lock; no PBKDF run beyond the `enroll_with` test observing makes
/// for a device not enrolled yet) that nothing it was made from
/// changed: the plan file's bytes, every device's LUKS header and keyplan records, every key's
/// KMS versions, and the journal's last run. A stale plan is refused with exit 1, naming what
/// changed; nothing is changed then.
///
/// Errors: the saved plan cannot be read; its plan file is gone or changed; `--state-dir`
/// names another state directory than the plan was made against; a run holds the lock or was
/// interrupted; the plan is stale; a KMS check fails; the run fails.
pub(super) fn cmd_apply_saved(
    cli: &Cli,
    arg: &PlanArg,
    path: &std::path::Path,
    parallelism: Option<usize>,
) -> Result<ExitCode> {
    let saved = crate::saved::read(path).map_err(|e| miette!("{e}"))?;
    // Damaged step dependencies are reported as such, before anything else.
    saved_diff(&saved, path)?;
    // Advice names the operator's own plan file (`-f` as given), never a path from the file.
    let again = format!(
        "run `keyplan plan{} -o {}` again, review it, and apply the new file",
        arg.file
            .as_ref()
            .map(|f| format!(" -f {}", f.display()))
            .unwrap_or_default(),
        path.display()
    );
    let stale = |what: Vec<String>| {
        miette!(
            help = again.clone(),
            "saved plan {} is stale; nothing was changed. Since it was made:\n  - {}",
            path.display(),
            what.join("\n  - ")
        )
    };
    let (plan, bytes) = match plan_for_saved(cli, arg, &saved) {
        Ok(x) => x,
        Err(PlanFileProblem::Unreadable(r)) => return Err(r),
        Err(PlanFileProblem::Differs(m)) => return Err(stale(vec![m])),
        Err(PlanFileProblem::StateDir(m)) => {
            return Err(miette!(help = again.clone(), "{m}; nothing was changed"))
        }
    };
    let parallelism = parallelism.unwrap_or(plan.parallelism);
    let world = World::open(&plan)?;
    let _lock = StateLock::acquire(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    let mut journal = Journal::open(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    let records = crate::journal::read(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    if let Some(s) = crate::journal::last_run(&records).filter(|s| s.ended.is_none()) {
        return Err(miette!(
            help = format!(
                "run `keyplan apply -f {}` to finish it, then make a new saved plan: `keyplan plan -o {}`",
                plan.source_path.display(),
                path.display()
            ),
            "refusing to apply saved plan {}: run {} in the journal was interrupted; nothing was changed",
            path.display(),
            s.run
        ));
    }
    // Plan again, exactly as `plan -o` did (same checks: enroll_with passphrases, free
    // keyslots, writable devices, the KMS check), then require the saved file to agree with
    // the state it was made from and with the plan keyplan makes now.
    check_rotate_keys(&plan, &saved.options.rotate)?;
    let (observed, now_diff) =
        make_diff(&plan, &world, &saved.options.rotate, saved.options.verify)?;
    let now = crate::saved::state_digest(&bytes, &observed, crate::saved::journal_mark(&records));
    let changed = crate::saved::changes_since(&saved.state, &now);
    if !changed.is_empty() {
        return Err(stale(changed));
    }
    let differs = crate::saved::mismatch(&saved, &now_diff, &render::plan_json(&now_diff));
    if !differs.is_empty() {
        return Err(miette!(
            help = format!("{again}. A rotation that became due since the plan was made also changes the plan; a file edited by hand is never run"),
            "saved plan {} does not match what keyplan plans now from the same plan file and state; nothing was changed:\n  - {}",
            path.display(),
            differs.join("\n  - ")
        ));
    }
    // Equal to the saved steps and changes: shown and run as keyplan planned them just now
    // (reasons and notes from keyplan itself, not texts from the file).
    let d = now_diff;
    out!("{}", render::plan_text_styled(&plan, &d, stdout_color(cli)));
    if d.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    outln!();
    let report = run_new(
        cli,
        &plan,
        &world,
        &mut journal,
        &observed,
        &d.graph,
        parallelism,
    )?;
    apply_complete(
        (d.adds(), d.removes(), d.rotations(), report.steps_run),
        world.cs.pbkdf_runs(),
    );
    if d.keys.iter().any(|k| k.action == diff::KeyAction::Migrate) {
        outln!(
            "Note: this saved plan moved keys to another KMS and stops there; a rotation that is due runs only after a new plan: run `keyplan plan` again."
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the closing line of an apply: `(added, removed, keys rotated, steps run)` and every
/// PBKDF run of the command (planning checks, a finished interrupted run, this run).
fn apply_complete(totals: (usize, usize, usize, usize), pbkdf_runs: u64) {
    outln!(
        "\nApply complete! {} added, {} removed, {} keys rotated. ({} steps, {} PBKDF runs)",
        totals.0,
        totals.1,
        totals.2,
        totals.3,
        pbkdf_runs
    );
}

/// The changes and steps of saved plan `saved` (read from `path`).
///
/// Errors: the file's `changes` or `deps` are damaged (see [`crate::saved::SavedPlan::diff`]).
pub(super) fn saved_diff(
    saved: &crate::saved::SavedPlan,
    path: &std::path::Path,
) -> Result<diff::Diff> {
    saved.diff().map_err(|e| {
        miette!(
            help = "make it again with `keyplan plan -o FILE`",
            "saved plan {} is damaged: {e}",
            path.display()
        )
    })
}

/// Why the plan file the operator names cannot be used with a saved plan.
pub(super) enum PlanFileProblem {
    /// It cannot be found, read or loaded.
    Unreadable(miette::Report),
    /// Its bytes are not the ones the saved plan was made from (another file, or edited).
    Differs(String),
    /// It uses another state directory than the saved plan was made against.
    StateDir(String),
}

/// The plan file for saved plan `saved`: the one the operator names (`-f`, or the default in
/// the current directory, as for every command), never the path written in the saved file,
/// which anyone who can edit that file could point elsewhere. Loaded from exactly the bytes
/// that are compared with the saved SHA-256 (one read), and with the state directory the
/// saved plan was made against.
///
/// Errors: see [`PlanFileProblem`].
pub(super) fn plan_for_saved(
    cli: &Cli,
    arg: &PlanArg,
    saved: &crate::saved::SavedPlan,
) -> std::result::Result<(Plan, Vec<u8>), PlanFileProblem> {
    let (plan, bytes) = load_plan_with_bytes(cli, arg).map_err(PlanFileProblem::Unreadable)?;
    if crate::saved::sha256_hex(&bytes) != saved.plan_file.sha256 {
        return Err(PlanFileProblem::Differs(format!(
            "the plan file {} is not the one the plan was made from ({}), or it changed since",
            plan.source_path.display(),
            saved.plan_file.path.display().to_string().escape_debug()
        )));
    }
    if plan.state_dir != saved.state_dir {
        // The recorded directory is text from the file: quoted with escapes, never steering.
        return Err(PlanFileProblem::StateDir(format!(
            "the saved plan names another state directory ({}) than the plan uses ({})",
            saved.state_dir.display().to_string().escape_debug(),
            plan.state_dir.display()
        )));
    }
    Ok((plan, bytes))
}
