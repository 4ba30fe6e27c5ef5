//! The executor: runs a step graph with the write-ahead journal (the caller holds the state
//! lock).
//!
//! Steps whose predecessors are done run on worker threads, at most `parallelism` at once and
//! never two on the same device or on the same key's KMS entry ([`schedule`]). Before each
//! step's effect a `step_start` record is `fsync`ed; after it, a `step_done` record. An
//! interrupted run (a `run_start` with no `run_end`) is finished by passing its journal summary
//! as [`RunInput::resume`]: its remaining steps run again (each is idempotent; an add that was
//! under way when the process died adopts the keyslot it finds only after testing that the
//! staged passphrase opens it). The steps themselves are in [`steps`], one executor per kind.

pub mod memory;
pub mod schedule;
mod steps;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use crate::graph::StepGraph;
use crate::journal::{Event, Journal, JournalError, RunSummary};
use crate::spec::Plan;
use crate::world::World;

pub use steps::{StepError, StepOutcome};

/// The result of a run.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Run id.
    pub run: String,
    /// Steps executed by this process (not counting those done by an interrupted process).
    pub steps_run: usize,
    /// PBKDF runs caused by this run (cryptsetup calls counted by the driver).
    pub pbkdf_runs: u64,
    /// Per step: `(description, outcome)` in completion order.
    pub log: Vec<(String, String)>,
    /// The most PBKDF memory held at once (KiB, estimated: keyslot memory costs plus
    /// cryptsetup's own), and the most PBKDF runs at once.
    pub peak_pbkdf: (u64, usize),
}

/// A failed run: what failed, and what was done before.
#[derive(Debug, Clone)]
pub struct RunFailure {
    /// Run id.
    pub run: String,
    /// The failing step's description and error.
    pub error: String,
    /// Steps completed before the failure.
    pub completed: Vec<String>,
    /// True when the run stopped because [`RunInput::stop`] was set (a signal), not because
    /// a step failed: the running steps finished, no `run_end` record was written, and the next
    /// `apply` finishes the run.
    pub interrupted: bool,
}

/// What the executor tells its progress callback, on the main thread, as a run goes. The
/// engine knows nothing of terminals: the CLI turns these into spinners or plain lines.
#[derive(Debug, Clone, Copy)]
pub enum StepEvent<'a> {
    /// A step was journaled as started and handed to a worker thread.
    Started {
        /// Index of the step in the graph.
        step: usize,
        /// Steps in the graph (including those an interrupted process already did).
        total: usize,
        /// The step's description ([`crate::graph::Step`]'s `Display`, names no secret).
        desc: &'a str,
        /// The device the step works on (its id in the plan), if any.
        device: Option<&'a str>,
    },
    /// A step finished, successfully or not.
    Finished {
        /// Index of the step in the graph.
        step: usize,
        /// Steps in the graph.
        total: usize,
        /// Steps done so far, this one included when it succeeded (steps an interrupted process
        /// finished count too), so `done/total` is the run's progress.
        done: usize,
        /// The step's description.
        desc: &'a str,
        /// The device the step works on, if any.
        device: Option<&'a str>,
        /// The step's outcome summary (e.g. `added keyslot 3`) or its error.
        result: Result<&'a str, &'a str>,
    },
}

/// Progress callback: called with each [`StepEvent`] on the main thread. Time spent in it delays
/// the scheduling of further steps, so it should only print.
pub type Progress<'a> = &'a mut dyn FnMut(StepEvent<'_>);

/// cryptsetup 2.6's default argon2 memory cost for new LUKS2 keyslots, in KiB (1 GiB;
/// `cryptsetup --help` prints it; cryptsetup lowers it on hosts with less than twice that).
pub const CRYPTSETUP_DEFAULT_ARGON2_KIB: u64 = 1024 * 1024;

/// The argon2 memory cost in KiB of a keyslot that `plan` adds to a device of LUKS `version`:
/// `settings.pbkdf.memory_kib` for argon2 (cryptsetup's default 1 GiB when unset, or when
/// `settings.pbkdf` is absent on LUKS2); `None` for pbkdf2 and for LUKS1 (pbkdf2 only).
pub fn new_keyslot_memory_kib(plan: &Plan, version: crate::luks::LuksVersion) -> Option<u64> {
    use crate::spec::PbkdfType;
    if version == crate::luks::LuksVersion::Luks1 {
        return None;
    }
    match &plan.pbkdf {
        None => Some(CRYPTSETUP_DEFAULT_ARGON2_KIB),
        Some(p) if p.kind == PbkdfType::Pbkdf2 => None,
        Some(p) => Some(
            p.memory_kib
                .map_or(CRYPTSETUP_DEFAULT_ARGON2_KIB, u64::from),
        ),
    }
}

/// A new run id: `<unix seconds>-<pid>`, unique within the process: the seconds part is the
/// start time, moved one second past the previous id's when this process already started a
/// run in that second (an apply's second round after a migration, the node agent's cycles).
/// Two runs with one id would mix their records in the journal, which tells runs apart by
/// id (found by the deterministic simulation, docs/verification.md).
pub fn new_run_id() -> String {
    use std::sync::atomic::AtomicU64;
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = crate::clock::now_unix();
    let mut last = LAST.load(Ordering::SeqCst);
    let t = loop {
        let t = now.max(last + 1);
        match LAST.compare_exchange(last, t, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => break t,
            Err(seen) => last = seen,
        }
    };
    format!("{t}-{}", std::process::id())
}

/// What [`run_graph`] runs.
pub struct RunInput<'a> {
    /// The plan (device paths, KMS bindings, PBKDF settings).
    pub plan: &'a Plan,
    /// cryptsetup and the KMS instances.
    pub world: &'a World,
    /// The steps.
    pub graph: &'a StepGraph,
    /// Run id (a new one, or the interrupted run's when resuming).
    pub run_id: &'a str,
    /// What an interrupted process already did, when finishing its run.
    pub resume: Option<&'a RunSummary>,
    /// Steps at once (>= 1).
    pub parallelism: usize,
    /// KiB the PBKDF runs of steps running at once may use together (see [`memory`]): a step
    /// waits for its PBKDF memory before it starts cryptsetup.
    pub memory_budget_kib: u64,
    /// When set (by a signal handler), no further step is started; running steps finish and
    /// the run returns a [`RunFailure`] with `interrupted`, leaving the run open in the journal.
    pub stop: Option<&'a AtomicBool>,
    /// Device id -> the keyslot its `enroll_with` passphrase opened when observing
    /// ([`crate::observe::DeviceState::enroll_with_keyslot`]). An add unlocking with
    /// `enroll_with` names that keyslot (`--key-slot N`: one unlocking PBKDF run instead of one
    /// per keyslot tried) and falls back to trying keyslots when it no longer opens. May be
    /// empty (a resumed run): every such add then tries keyslots. Not journaled.
    pub enroll_with_keyslots: &'a BTreeMap<String, u32>,
}

/// Why [`drive`] stopped early.
#[derive(Debug, thiserror::Error)]
enum DriveError {
    /// A journal record could not be written.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// A worker thread ended without reporting its step (it panicked).
    #[error("a worker thread vanished")]
    WorkerVanished,
}

/// What the worker threads and the journal produced while a run went.
struct Progressed {
    steps_run: usize,
    log: Vec<(String, String)>,
    /// The first step failure (`description: error`).
    failure: Option<String>,
}

/// Runs `input.graph` as run `input.run_id`, journaling into `journal`. `input.resume` carries
/// what an interrupted process already did (done steps are skipped; staged versions and
/// verified keyslots are taken over). Writes the `run_start` record unless resuming (then
/// `run_resumed`), and a `run_end` record unless stopped by [`RunInput::stop`].
///
/// Errors: the first failing step (later independent steps are not started; running ones
/// finish), a journal write failure (the run stops before the next effect), or a stop.
pub fn run_graph(
    input: RunInput<'_>,
    journal: &mut Journal,
    progress: Progress<'_>,
) -> Result<RunReport, RunFailure> {
    let fail = |error: String, completed: Vec<String>| RunFailure {
        run: input.run_id.to_string(),
        error,
        completed,
        interrupted: false,
    };
    let exec = steps::Exec::new(
        input.plan,
        input.world,
        input.graph.len(),
        input.resume,
        input.memory_budget_kib,
        input.enroll_with_keyslots,
    );
    begin(&input, journal).map_err(|e| fail(e.to_string(), Vec::new()))?;
    let pbkdf_before = input.world.luks.pbkdf_runs();
    let done = input.resume.map(|s| s.done.clone()).unwrap_or_default();
    let mut sched = schedule::Scheduler::new(input.graph, done, input.parallelism);
    let mut went = Progressed {
        steps_run: 0,
        log: Vec::new(),
        failure: None,
    };
    let outcome = drive(&input, &exec, &mut sched, journal, progress, &mut went);
    let completed: Vec<String> = went.log.iter().map(|(d, _)| d.clone()).collect();
    let stopping = input.stop.is_some_and(|s| s.load(Ordering::SeqCst));
    if outcome.is_ok() && went.failure.is_none() && sched.remaining() > 0 && stopping {
        // Left open on purpose: the next `apply` finishes the run from the journal.
        return Err(RunFailure {
            run: input.run_id.to_string(),
            error: format!(
                "interrupted by a signal; the running steps finished and {} steps were not started",
                sched.remaining()
            ),
            completed,
            interrupted: true,
        });
    }
    let error = match (outcome.map_err(|e| e.to_string()), went.failure) {
        (Err(e), _) => Some(e),
        (Ok(()), Some(f)) => Some(f),
        (Ok(()), None) if sched.remaining() > 0 => {
            Some("some steps could not be scheduled (dependency cycle)".to_string())
        }
        _ => None,
    };
    if let Some(e) = error {
        let _ = journal.append(
            input.run_id,
            Event::RunEnd {
                outcome: "failed".into(),
                message: Some(e.clone()),
            },
        );
        return Err(fail(e, completed));
    }
    journal
        .append(
            input.run_id,
            Event::RunEnd {
                outcome: "success".into(),
                message: None,
            },
        )
        .map_err(|e| fail(e.to_string(), completed.clone()))?;
    Ok(RunReport {
        run: input.run_id.to_string(),
        steps_run: went.steps_run,
        pbkdf_runs: input.world.luks.pbkdf_runs() - pbkdf_before,
        log: went.log,
        peak_pbkdf: exec.memory.peak(),
    })
}

/// Journals the start of the run: `run_start` with the whole graph (and the plan's devices),
/// or `run_resumed` when finishing an interrupted run.
fn begin(input: &RunInput<'_>, journal: &mut Journal) -> Result<(), JournalError> {
    let event = match input.resume {
        Some(_) => Event::RunResumed {
            pid: std::process::id(),
        },
        None => Event::RunStart {
            steps: input.graph.steps(),
            deps: input.graph.deps(),
            plan_file: input.plan.source_path.display().to_string(),
            devices: input
                .plan
                .devices
                .values()
                .map(|d| (d.id.clone(), d.path.display().to_string()))
                .collect(),
            pid: std::process::id(),
            host: gethostname::gethostname().to_string_lossy().into_owned(),
        },
    };
    journal.append(input.run_id, event)
}

/// Starts ready steps on scoped worker threads and journals their ends, until nothing runs and
/// nothing more may start (all done, a failure, or a stop). Only this thread writes the
/// journal, so records are totally ordered.
///
/// Errors: a journal write failed (the run stops before the next effect), or a worker thread
/// vanished.
fn drive(
    input: &RunInput<'_>,
    exec: &steps::Exec<'_>,
    sched: &mut schedule::Scheduler,
    journal: &mut Journal,
    progress: Progress<'_>,
    went: &mut Progressed,
) -> Result<(), DriveError> {
    let graph = input.graph;
    let n = graph.len();
    let stopping = || input.stop.is_some_and(|s| s.load(Ordering::SeqCst));
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<(usize, Result<StepOutcome, StepError>)>();
        loop {
            while went.failure.is_none() && !stopping() {
                let Some(i) = sched.start_next() else { break };
                let step = graph.step(i);
                journal.append(input.run_id, Event::StepStart { step: i })?;
                tracing::info!(run = input.run_id, step = i, "start: {}", step);
                let desc = step.to_string();
                progress(StepEvent::Started {
                    step: i,
                    total: n,
                    desc: &desc,
                    device: step.device(),
                });
                let tx = tx.clone();
                let step = step.clone();
                scope.spawn(move || {
                    // A panicking step fails the run like any failed step: without this, the
                    // step's result never arrives and the run waits for it forever (the
                    // channel's sender lives on in this loop).
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        steps::failpoint("step.before_effect")
                            .and_then(|()| exec.run(i, &step))
                            .and_then(|o| steps::failpoint("step.after_effect").map(|()| o))
                    }))
                    .unwrap_or_else(|_| {
                        Err(StepError::Internal(
                            "the step panicked (a keyplan bug); its effect may or may not have happened, and the next apply re-checks it".into(),
                        ))
                    });
                    let _ = tx.send((i, r));
                });
            }
            if sched.idle() {
                return Ok(());
            }
            let Ok((i, result)) = rx.recv() else {
                return Err(DriveError::WorkerVanished);
            };
            sched.finished(i, result.is_ok());
            went.steps_run += 1;
            finish_step(input, journal, progress, sched, went, i, result)?;
        }
    })
}

/// Reports and journals the end of step `i`: `step_done` (with its staged version or verified
/// salt) or `step_failed`, which also makes it the run's failure.
///
/// Errors: the `step_done` record could not be written.
fn finish_step(
    input: &RunInput<'_>,
    journal: &mut Journal,
    progress: Progress<'_>,
    sched: &schedule::Scheduler,
    went: &mut Progressed,
    i: usize,
    result: Result<StepOutcome, StepError>,
) -> Result<(), JournalError> {
    let step = input.graph.step(i);
    let desc = step.to_string();
    let error = result.as_ref().err().map(|e| e.to_string());
    match (&result, &error) {
        (Ok(o), _) => tracing::info!(run = input.run_id, step = i, "done: {desc}: {}", o.outcome),
        (Err(_), Some(e)) => tracing::warn!(run = input.run_id, step = i, "failed: {desc}: {e}"),
        _ => {}
    }
    progress(StepEvent::Finished {
        step: i,
        total: input.graph.len(),
        done: sched.done_count(),
        desc: &desc,
        device: step.device(),
        result: match (&result, &error) {
            (Ok(o), _) => Ok(&o.outcome),
            (Err(_), Some(e)) => Err(e),
            (Err(_), None) => Err(""),
        },
    });
    match result {
        Ok(o) => {
            went.log.push((desc, o.outcome.clone()));
            journal.append(
                input.run_id,
                Event::StepDone {
                    step: i,
                    outcome: o.outcome,
                    staged_version: o.staged_version,
                    verified_salt: o.verified_salt,
                },
            )
        }
        Err(_) => {
            let e = error.unwrap_or_default();
            let _ = journal.append(
                input.run_id,
                Event::StepFailed {
                    step: i,
                    error: e.clone(),
                },
            );
            went.failure.get_or_insert(format!("{desc}: {e}"));
            Ok(())
        }
    }
}

#[cfg(test)]
mod run_id_tests {
    #[test]
    fn run_ids_of_one_process_differ_within_a_second() {
        let ids: Vec<String> = (0..50).map(|_| super::new_run_id()).collect();
        let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "{ids:?}");
        let pid = std::process::id().to_string();
        assert!(
            ids.iter().all(|id| id.ends_with(&format!("-{pid}"))),
            "{ids:?}"
        );
    }
}
