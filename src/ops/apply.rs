//! `apply`: a session that owns the state lock and the journal for its whole life, finishes an
//! interrupted run first (once the front end has asked), then plans and runs in rounds: a round
//! that moved a key to another KMS is followed by a second round, so a rotation that is due runs
//! once the key is in its new KMS.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

use super::plan::{self, PlanRequest, Planned};
use super::Engine;
use crate::apply::{self, memory, Progress, RunInput, RunReport};
use crate::error::Error;
use crate::graph::StepGraph;
use crate::journal::{Journal, RunSummary, StateLock};
use crate::observe::Observed;
use crate::spec::Plan;
use crate::world::registry;

/// How a run runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions<'a> {
    /// Steps (devices) at once; `None`: the plan's `settings.parallelism`.
    pub parallelism: Option<usize>,
    /// A flag a signal handler sets to stop starting steps (the running ones finish and the
    /// run stays open in the journal, to be finished by the next apply).
    pub stop: Option<&'a AtomicBool>,
}

/// What a session's runs did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Keyslots added.
    pub added: usize,
    /// Keyslots removed.
    pub removed: usize,
    /// Keys rotated.
    pub rotated: usize,
    /// Keyslots adopted (recorded without a new keyslot).
    pub adopted: usize,
    /// Steps run by this process.
    pub steps: usize,
}

/// An apply session: the state lock held, the journal open, the interrupted run (if any) known.
pub struct ApplySession<'e> {
    engine: &'e Engine,
    _lock: StateLock,
    journal: Journal,
    interrupted: Option<RunSummary>,
    /// Rounds planned so far.
    rounds: usize,
    /// Whether the last round run moved a key to another KMS.
    last_migrated: bool,
    totals: Totals,
}

impl<'e> ApplySession<'e> {
    /// Takes the state lock (never waiting), opens the journal (cutting a torn last record),
    /// reads the interrupted run, if any, and renews keyplan's KMS credentials where due
    /// ([`crate::kms::Kms::renew_credentials`]; a failure is logged, not returned), so every
    /// apply, even one with nothing to do, keeps a renewable credential alive.
    ///
    /// Errors: [`Error::Journal`]: another run holds the lock, or the journal cannot be opened
    /// or read; [`Error::Owner`]: the state directory belongs to another plan (checked here,
    /// claimed only by [`Self::run`] and [`Self::resume`]).
    pub fn open(engine: &'e Engine) -> Result<ApplySession<'e>, Error> {
        let state_dir = &engine.plan().state_dir;
        crate::journal::compact::check_archive(engine.plan())
            .map_err(|e| Error::request(e, None))?;
        let lock = StateLock::acquire(state_dir)?;
        // Under the lock, before anything is read: the directory is this plan's, or nobody's
        // (I5). It is claimed only when a run is about to write ([`Self::claim`]): a refused
        // apply, or one with nothing to do, leaves the directory's owner as it was.
        crate::world::owner::check(engine.plan())?;
        let journal = Journal::open(state_dir)?;
        let records = crate::journal::read(state_dir)?;
        let interrupted = crate::journal::last_run(&records).filter(|s| s.ended.is_none());
        renew_credentials(engine);
        Ok(ApplySession {
            engine,
            _lock: lock,
            journal,
            interrupted,
            rounds: 0,
            last_migrated: false,
            totals: Totals::default(),
        })
    }

    /// The engine this session runs on.
    pub fn engine(&self) -> &'e Engine {
        self.engine
    }

    /// The interrupted run the session must finish before planning, if any.
    pub fn interrupted(&self) -> Option<&RunSummary> {
        self.interrupted.as_ref()
    }

    /// Whether the interrupted run can be finished as journaled: every device it names is at
    /// the same path in the plan, and every key it moves is still to go where it moves it.
    ///
    /// Errors: [`Error::Resume`] saying what differs and how to restore it.
    pub fn check_resumable(&self) -> Result<(), Error> {
        let Some(s) = &self.interrupted else {
            return Ok(());
        };
        check_resumable(self.engine.plan(), s)
    }

    /// Finishes the interrupted run exactly as journaled (its remaining steps; enroll_with adds
    /// try keyslots: the keyslot hint of the original observation is not journaled).
    ///
    /// Claims the state directory first ([`Self::claim`]).
    ///
    /// Errors: [`Error::Resume`] (see [`Self::check_resumable`]); [`Error::Owner`] when
    /// `owner.json` cannot be written; [`Error::Run`] when it fails or is stopped.
    pub fn resume(
        &mut self,
        opts: RunOptions<'_>,
        progress: Progress<'_>,
    ) -> Result<RunReport, Error> {
        let Some(s) = self.interrupted.clone() else {
            return Err(Error::request(
                "there is no interrupted run to finish",
                None,
            ));
        };
        self.check_resumable()?;
        self.claim()?;
        tracing::info!(run = %s.run, "finishing interrupted run");
        let plan = self.engine.plan();
        let parallelism = opts.parallelism.unwrap_or(plan.parallelism);
        let graph = StepGraph::from_parts(s.steps.clone(), &s.deps);
        let none = BTreeMap::new();
        let input = RunInput {
            plan,
            world: self.engine.world(),
            graph: &graph,
            run_id: &s.run,
            resume: Some(&s),
            parallelism,
            memory_budget_kib: memory_budget_kib(plan, parallelism, None),
            stop: opts.stop,
            enroll_with_keyslots: &none,
        };
        let report = apply::run_graph(input, &mut self.journal, progress);
        self.compact();
        let report = report.map_err(|failure| Error::Run {
            failure,
            resumed: true,
        })?;
        self.interrupted = None;
        // Not in the totals: "Apply complete!" counts the steps of this command's own plans.
        Ok(report)
    }

    /// The next round's plan, or `None` when the session is done: the first round always
    /// plans (possibly no changes); a second round plans, without `--verify`, only after a
    /// first round that moved a key to another KMS, and only when it has changes.
    ///
    /// Errors: the interrupted run was not finished ([`Error::Interrupted`]); see
    /// [`plan::make`].
    pub fn next_plan(&mut self, req: &PlanRequest) -> Result<Option<Planned>, Error> {
        if let Some(s) = &self.interrupted {
            return Err(Error::Interrupted {
                run: s.run.clone(),
                message: format!("run {} in the journal was interrupted and is not finished; nothing was planned", s.run),
                help: "run `keyplan apply` to finish it first".into(),
            });
        }
        let round = self.rounds;
        if round >= 2 || (round == 1 && !self.last_migrated) {
            return Ok(None);
        }
        self.rounds += 1;
        self.last_migrated = false;
        let req = PlanRequest {
            rotate: req.rotate.clone(),
            verify: req.verify && round == 0,
            repair_headers: req.repair_headers,
        };
        let planned = plan::make(self.engine, &req)?;
        if round == 1 && planned.diff.is_empty() {
            return Ok(None);
        }
        Ok(Some(planned))
    }

    /// Which round [`Self::next_plan`] returned last: 1 for the first, 2 for the round after a
    /// migration.
    pub fn round(&self) -> usize {
        self.rounds
    }

    /// Runs `planned` as a new run: claims the state directory for this plan
    /// ([`Self::claim`]), records its devices in the registry and the copies its moves keep
    /// ([`remember_kept`]), then runs the steps with the journal.
    ///
    /// Errors: [`Error::Owner`] when `owner.json` cannot be written; the registry cannot be
    /// written; [`Error::Run`] when the run fails or is stopped.
    pub fn run(
        &mut self,
        planned: &Planned,
        opts: RunOptions<'_>,
        progress: Progress<'_>,
    ) -> Result<RunReport, Error> {
        self.claim()?;
        let plan = self.engine.plan();
        let devices = planned
            .observed
            .devices
            .iter()
            .map(|(id, d)| (id.as_str(), d.header.uuid.as_str(), d.path.as_path()));
        registry::update(&plan.state_dir, devices)?;
        remember_kept(plan, planned)?;
        let run_id = apply::new_run_id();
        let graph = &planned.diff.graph;
        tracing::info!(run = %run_id, steps = graph.len(), "starting run");
        let enroll_with_keyslots: BTreeMap<String, u32> = planned
            .observed
            .devices
            .iter()
            .filter_map(|(id, d)| d.enroll_with_keyslot.map(|n| (id.clone(), n)))
            .collect();
        let parallelism = opts.parallelism.unwrap_or(plan.parallelism);
        let input = RunInput {
            plan,
            world: self.engine.world(),
            graph,
            run_id: &run_id,
            resume: None,
            parallelism,
            memory_budget_kib: memory_budget_kib(plan, parallelism, Some(&planned.observed)),
            stop: opts.stop,
            enroll_with_keyslots: &enroll_with_keyslots,
        };
        let report = apply::run_graph(input, &mut self.journal, progress);
        self.compact();
        let report = report.map_err(|failure| Error::Run {
            failure,
            resumed: false,
        })?;
        let d = &planned.diff;
        self.totals.added += d.adds();
        self.totals.removed += d.removes();
        self.totals.rotated += d.rotations();
        self.totals.adopted += d.adoptions();
        self.totals.steps += report.steps_run;
        self.last_migrated = d.migrates();
        Ok(report)
    }

    /// Compacts the journal after a run ([`crate::journal::compact`]): finished runs but the
    /// last move to the audit trail. Best effort: a failure is logged at `warn` and the
    /// journal stays as it was (it only grows until a later compaction succeeds).
    fn compact(&mut self) {
        let plan = self.engine.plan();
        match crate::journal::compact::compact(&plan.state_dir, &mut self.journal, &plan.journal) {
            Ok(Some(c)) => tracing::info!(
                moved_runs = c.moved,
                expired_runs = c.expired,
                archived = c.archived,
                journal_bytes_before = c.journal_bytes.0,
                journal_bytes_after = c.journal_bytes.1,
                "journal compacted: {} finished run{} moved to the audit trail",
                c.moved,
                if c.moved == 1 { "" } else { "s" }
            ),
            Ok(None) => {}
            Err(e) => tracing::warn!(
                "could not compact the journal, which stays as it was (nothing is lost; the next run tries again): {e}"
            ),
        }
    }

    /// Records this plan as the state directory's owner ([`crate::world::owner::claim`]), under
    /// the session's lock, right before a run writes: so an apply refused while planning ("nothing
    /// was changed") or with nothing to do leaves no `owner.json` behind, nor changes one.
    ///
    /// Errors: [`Error::Owner`]: the record cannot be written.
    fn claim(&self) -> Result<(), Error> {
        crate::world::owner::claim(self.engine.plan())?;
        Ok(())
    }

    /// What this session's runs did so far.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// The journal's records as they are now (read again from the state directory).
    ///
    /// Errors: [`Error::Journal`].
    pub(crate) fn records(&self) -> Result<Vec<crate::journal::Record>, Error> {
        Ok(crate::journal::read(&self.engine.plan().state_dir)?)
    }
}

/// Before any step of `planned` runs (so no kill can lose it): records in
/// `<state_dir>/kept.json` every entry a move of this plan keeps in the KMS the key leaves
/// ([`crate::diff::KeyChange::kept_in_origin`]), and forgets the kept copies whose entry the
/// plan puts a key in again (a live key: [`crate::world::kept::is_live`]). Idempotent: a
/// resumed or repeated move records the same entry again.
///
/// Errors: [`Error::Request`] when the file is corrupt or cannot be written; nothing was
/// changed then (no step ran).
fn remember_kept(plan: &Plan, planned: &Planned) -> Result<(), Error> {
    use crate::world::kept::{self, KeptCopy};
    let add: Vec<KeptCopy> = planned
        .diff
        .keys
        .iter()
        .filter(|k| k.action == crate::diff::KeyAction::Migrate && !k.kept_in_origin.is_empty())
        .filter_map(|k| {
            let from = k.from_kms.as_deref()?;
            let origin = planned
                .observed
                .origins
                .get(&k.key)?
                .iter()
                .find(|o| o.kms == from)?;
            Some(KeptCopy {
                key: k.key.clone(),
                kms: origin.kms.clone(),
                name: origin.name.clone(),
                versions: k.kept_in_origin.clone(),
                since: planned.observed.now,
            })
        })
        .collect();
    kept::update(&plan.state_dir, &add, &|c| kept::is_live(plan, c)).map_err(|e| {
        Error::request(
            format!("{e}; no step ran, nothing was changed"),
            Some("fix the state directory, then run `keyplan apply` again".into()),
        )
    })
}

/// See [`ApplySession::check_resumable`].
/// Renews the credentials of every KMS instance of the engine's plan where due; a failure is
/// logged at `warn` (the credential may still be valid; the KMS's own calls report it if not).
fn renew_credentials(engine: &Engine) {
    for (instance, kms) in &engine.world().kms {
        if let Err(e) = kms.renew_credentials() {
            tracing::warn!(kms = %instance, "could not renew keyplan's credentials: {e}");
        }
    }
}

fn check_resumable(plan: &Plan, s: &RunSummary) -> Result<(), Error> {
    for (id, path) in &s.devices {
        if let Some(d) = plan.devices.get(id) {
            if d.path.display().to_string() != *path {
                return Err(Error::Resume {
                    message: format!(
                        "device {id} was {path} in the interrupted run but is now {} in the plan; refusing to resume",
                        d.path.display()
                    ),
                    help: "restore the device's path in the plan file to finish the interrupted run, then change it".into(),
                });
            }
        }
    }
    for step in &s.steps {
        let Some((key, to_kms, to_name)) = step.migration_target() else {
            continue;
        };
        let now = plan
            .keys
            .get(key)
            .map(|k| (k.kms.as_str(), k.name.as_str()));
        if now != Some((to_kms, to_name)) {
            return Err(Error::Resume {
                message: format!(
                    "the interrupted run {} moves key {key} to KMS {to_kms:?} ({to_name}), but the plan now puts it {}; refusing to resume, nothing was changed",
                    s.run,
                    match now {
                        Some((k, n)) => format!("in KMS {k:?} ({n})"),
                        None => "nowhere (the key left the plan)".to_owned(),
                    }
                ),
                help: format!("put key {key} back in KMS {to_kms:?} (name {to_name:?}) in the plan, run `keyplan apply` to finish the move, then change the plan"),
            });
        }
    }
    Ok(())
}

/// The PBKDF memory budget of a run in KiB (`settings.memory_budget_kib`, or half the available
/// memory: [`memory::budget`]). Logged at info level; when it holds fewer PBKDF runs than
/// `parallelism` asks for, a warning on stderr says so (devices then wait for memory rather
/// than swap). The cost of one run is the larger of a new keyslot's argon2 memory (the plan's
/// `memory_kib`, else cryptsetup's default of up to 1 GiB) and the largest argon2 memory of the
/// keyslots the `observed` devices already have (`None`: not known, when finishing an
/// interrupted run), plus 16 MiB for cryptsetup.
fn memory_budget_kib(plan: &Plan, parallelism: usize, observed: Option<&Observed>) -> u64 {
    let budget = memory::budget(plan.memory_budget_kib);
    let new = apply::new_keyslot_memory_kib(plan, crate::luks::LuksVersion::Luks2);
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
