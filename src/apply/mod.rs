//! The executor: runs a step graph under the state lock with the write-ahead journal.
//!
//! Steps whose predecessors are done run on worker threads, at most `parallelism` at once and
//! never two on the same device or on the same key's KMS entry. Before each step's effect a
//! `step_start` record is `fsync`ed; after it, a `step_done` record. An interrupted run (a
//! `run_start` with no `run_end`) is finished first by the next `apply`: its remaining steps
//! run again (each is idempotent; an add that was under way when the process died adopts the
//! keyslot it finds only after testing that the staged passphrase opens it).

pub mod memory;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};

use crate::graph::{SlotHolder, Step, StepGraph, Unlock, VersionRef};
use crate::journal::{Event, Journal, RunSummary};
use crate::observe::{RecordStatus, SlotRecord, World};
use crate::secret::Passphrase;
use crate::spec::Plan;

/// What a finished step reports (journaled).
#[derive(Debug, Clone, Default)]
pub struct StepOutcome {
    /// Human summary, e.g. `added keyslot 3`.
    pub outcome: String,
    /// For `stage`: the version staged or reused.
    pub staged_version: Option<u64>,
    /// For `verify`: the salt of the verified keyslot.
    pub verified_salt: Option<String>,
}

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
        /// The step's description ([`Step`]'s `Display`, names no secret).
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

/// Shared state of a run.
struct Exec<'a> {
    plan: &'a Plan,
    world: &'a World,
    /// Key id -> staged version.
    staged: Mutex<BTreeMap<String, u64>>,
    /// Verify step index -> (device id, keyslot, salt) verified in this run.
    verified: Mutex<BTreeMap<usize, (String, u32, String)>>,
    /// Steps that a previous process started and did not finish.
    resumed: Vec<bool>,
    /// Memory for the PBKDF runs of steps running at once.
    memory: memory::MemoryBudget,
    /// See [`RunInput::enroll_with_keyslots`].
    enroll_with_keyslots: &'a BTreeMap<String, u32>,
}

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

/// A new run id: `<unix seconds>-<pid>`.
pub fn new_run_id() -> String {
    format!("{}-{}", crate::clock::now_unix(), std::process::id())
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

/// Runs `input.graph` as run `input.run_id`, journaling into `journal`. `input.resume` carries
/// what an interrupted process already did (done steps are skipped; staged versions and
/// verified keyslots are taken over). Writes the `run_start` record unless resuming, and
/// always a `run_end` record.
///
/// Errors: the first failing step (later independent steps are not started; running ones
/// finish), or a journal write failure (the run stops before the next effect).
pub fn run_graph(
    input: RunInput<'_>,
    journal: &mut Journal,
    progress: Progress<'_>,
) -> Result<RunReport, RunFailure> {
    let RunInput {
        plan,
        world,
        graph,
        run_id,
        resume,
        parallelism,
        memory_budget_kib,
        stop,
        enroll_with_keyslots,
    } = input;
    let n = graph.len();
    let fail = |error: String, completed: Vec<String>| RunFailure {
        run: run_id.to_string(),
        error,
        completed,
        interrupted: false,
    };
    let stopping = || stop.is_some_and(|s| s.load(Ordering::SeqCst));
    let mut done = vec![false; n];
    let mut exec = Exec {
        plan,
        world,
        staged: Mutex::new(BTreeMap::new()),
        verified: Mutex::new(BTreeMap::new()),
        resumed: vec![false; n],
        memory: memory::MemoryBudget::new(memory_budget_kib),
        enroll_with_keyslots,
    };
    match resume {
        Some(s) => {
            done.clone_from(&s.done);
            done.resize(n, false);
            exec.resumed.clone_from(&s.started_not_done);
            exec.resumed.resize(n, false);
            if let Ok(mut m) = exec.staged.lock() {
                m.extend(s.staged.iter().cloned());
            }
            if let Ok(mut m) = exec.verified.lock() {
                for (i, salt) in &s.verified {
                    if let Some(Step::Verify { device, slot, .. }) = s.steps.get(*i) {
                        m.insert(*i, (device.clone(), *slot, salt.clone()));
                    }
                }
            }
            journal
                .append(
                    run_id,
                    Event::RunResumed {
                        pid: std::process::id(),
                    },
                )
                .map_err(|e| fail(e.to_string(), Vec::new()))?;
        }
        None => {
            let devices = plan
                .devices
                .values()
                .map(|d| (d.id.clone(), d.path.display().to_string()))
                .collect();
            journal
                .append(
                    run_id,
                    Event::RunStart {
                        steps: graph.steps(),
                        deps: graph.deps(),
                        plan_file: plan.source_path.display().to_string(),
                        devices,
                        pid: std::process::id(),
                        host: gethostname::gethostname().to_string_lossy().into_owned(),
                    },
                )
                .map_err(|e| fail(e.to_string(), Vec::new()))?;
        }
    }
    let pbkdf_before = world.cs.pbkdf_runs();
    let preds: Vec<Vec<usize>> = (0..n).map(|i| graph.predecessors(i)).collect();
    let parallelism = parallelism.max(1);
    let mut running: BTreeSet<usize> = BTreeSet::new();
    let mut busy: BTreeSet<String> = BTreeSet::new();
    let mut failure: Option<String> = None;
    let mut log: Vec<(String, String)> = Vec::new();
    let mut steps_run = 0usize;
    let resource = |s: &Step| -> Option<String> {
        s.device()
            .map(|d| format!("device:{d}"))
            .or_else(|| s.kms_key().map(|k| format!("key:{k}")))
    };
    let exec = &exec;
    let outcome: Result<(), String> = std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<(usize, Result<StepOutcome, String>)>();
        loop {
            if failure.is_none() && !stopping() {
                for i in 0..n {
                    if running.len() >= parallelism {
                        break;
                    }
                    if done[i] || running.contains(&i) || !preds[i].iter().all(|p| done[*p]) {
                        continue;
                    }
                    let step = graph.step(i);
                    let res = resource(step);
                    if let Some(r) = &res {
                        if busy.contains(r) {
                            continue;
                        }
                    }
                    journal
                        .append(run_id, Event::StepStart { step: i })
                        .map_err(|e| e.to_string())?;
                    if let Some(r) = res {
                        busy.insert(r);
                    }
                    running.insert(i);
                    tracing::info!(run = run_id, step = i, "start: {}", step);
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
                        let r = crate::failpoint::check("step.before_effect")
                            .and_then(|()| exec.run(i, &step))
                            .and_then(|o| crate::failpoint::check("step.after_effect").map(|()| o));
                        let _ = tx.send((i, r));
                    });
                }
            }
            if running.is_empty() {
                break;
            }
            let Ok((i, result)) = rx.recv() else {
                return Err("a worker thread vanished".to_string());
            };
            running.remove(&i);
            if let Some(r) = resource(graph.step(i)) {
                busy.remove(&r);
            }
            steps_run += 1;
            let desc = graph.step(i).to_string();
            match &result {
                Ok(o) => tracing::info!(run = run_id, step = i, "done: {desc}: {}", o.outcome),
                Err(e) => tracing::warn!(run = run_id, step = i, "failed: {desc}: {e}"),
            }
            done[i] |= result.is_ok();
            progress(StepEvent::Finished {
                step: i,
                total: n,
                done: done.iter().filter(|d| **d).count(),
                desc: &desc,
                device: graph.step(i).device(),
                result: match &result {
                    Ok(o) => Ok(&o.outcome),
                    Err(e) => Err(e),
                },
            });
            match result {
                Ok(o) => {
                    log.push((desc, o.outcome.clone()));
                    journal
                        .append(
                            run_id,
                            Event::StepDone {
                                step: i,
                                outcome: o.outcome,
                                staged_version: o.staged_version,
                                verified_salt: o.verified_salt,
                            },
                        )
                        .map_err(|e| e.to_string())?;
                }
                Err(e) => {
                    let _ = journal.append(
                        run_id,
                        Event::StepFailed {
                            step: i,
                            error: e.clone(),
                        },
                    );
                    failure.get_or_insert(format!("{desc}: {e}"));
                }
            }
        }
        Ok(())
    });
    let completed: Vec<String> = log.iter().map(|(d, _)| d.clone()).collect();
    if outcome.is_ok() && failure.is_none() && done.iter().any(|d| !d) && stopping() {
        // Left open on purpose: the next `apply` finishes the run from the journal.
        let remaining = done.iter().filter(|d| !**d).count();
        return Err(RunFailure {
            run: run_id.to_string(),
            error: format!(
                "interrupted by a signal; the running steps finished and {remaining} steps were not started"
            ),
            completed,
            interrupted: true,
        });
    }
    let error = match (outcome, failure) {
        (Err(e), _) => Some(e),
        (Ok(()), Some(f)) => Some(f),
        (Ok(()), None) if done.iter().any(|d| !d) => {
            Some("some steps could not be scheduled (dependency cycle)".to_string())
        }
        _ => None,
    };
    match error {
        Some(e) => {
            let _ = journal.append(
                run_id,
                Event::RunEnd {
                    outcome: "failed".into(),
                    message: Some(e.clone()),
                },
            );
            Err(fail(e, completed))
        }
        None => {
            journal
                .append(
                    run_id,
                    Event::RunEnd {
                        outcome: "success".into(),
                        message: None,
                    },
                )
                .map_err(|e| fail(e.to_string(), completed.clone()))?;
            Ok(RunReport {
                run: run_id.to_string(),
                steps_run,
                pbkdf_runs: world.cs.pbkdf_runs() - pbkdf_before,
                log,
                peak_pbkdf: exec.memory.peak(),
            })
        }
    }
}

impl Exec<'_> {
    fn key_ctx(&self, key: &str) -> Result<(&dyn crate::kms::Kms, String, usize), String> {
        let spec = self
            .plan
            .keys
            .get(key)
            .ok_or_else(|| format!("key {key} is no longer in the plan"))?;
        let kms = self.world.kms_for(self.plan, key)?;
        Ok((kms, spec.name.clone(), spec.bytes))
    }

    /// `(KMS instance, name)` of a plan key, for its records.
    fn entry(&self, key: &str) -> Option<(String, String)> {
        self.plan
            .keys
            .get(key)
            .map(|k| (k.kms.clone(), k.name.clone()))
    }

    /// Remembers `v` as the version of `key` this run's later steps use (`VersionRef::Staged`)
    /// and reports it in the step's outcome, so a resumed run knows it too.
    fn staged_outcome(&self, key: &str, v: u64, what: String) -> Result<StepOutcome, String> {
        self.staged
            .lock()
            .map_err(|_| "internal lock poisoned".to_string())?
            .insert(key.to_string(), v);
        Ok(StepOutcome {
            outcome: what,
            staged_version: Some(v),
            verified_salt: None,
        })
    }

    /// The KMS a migration step moves `key` to, which must still be where the plan puts the
    /// key: a run interrupted during a move is finished only towards the journaled
    /// destination, never towards a KMS the plan file names since.
    fn destination(
        &self,
        key: &str,
        to_kms: &str,
        to_name: &str,
    ) -> Result<(&dyn crate::kms::Kms, String), String> {
        let (kms, name, _) = self.key_ctx(key)?;
        let planned = self.entry(key);
        if planned.as_ref().map(|(k, n)| (k.as_str(), n.as_str())) != Some((to_kms, to_name)) {
            let (k, n) = planned.unwrap_or_default();
            return Err(format!(
                "this run moves {key} to KMS {to_kms} ({to_name}), but the plan now puts it in KMS {k} ({n}); nothing more was changed. Put the key back in KMS {to_kms} in the plan and run `keyplan apply` to finish the move, then change the plan"
            ));
        }
        Ok((kms, name))
    }

    /// The KMS instance `from_kms` a key of the plan moves from.
    fn origin(&self, key: &str, from_kms: &str) -> Result<&dyn crate::kms::Kms, String> {
        self.world
            .kms
            .get(from_kms)
            .map(|k| k.as_ref())
            .ok_or_else(|| format!("KMS {from_kms:?}, which key {key} moves from, is no longer in the plan; restore its definition to finish the migration"))
    }

    /// Copies `version` of `key` from `from_kms` into the key's KMS as its current version, or
    /// finds the copy an earlier run made. Returns the copy's version number there.
    fn migrate_copy(
        &self,
        key: &str,
        from_kms: &str,
        from_name: &str,
        version: u64,
    ) -> Result<(u64, String), String> {
        let e = |e: crate::kms::KmsError| e.to_string();
        let (kms, name, _) = self.key_ctx(key)?;
        let old = self.origin(key, from_kms)?;
        let st = kms.read(&name).map_err(e)?;
        let old_st = old.read(from_name).map_err(e)?;
        let source = if old_st.current == Some(version) {
            Some(old.get(from_name, version).map_err(e)?)
        } else {
            None
        };
        if let Some(c) = st.current {
            return match &source {
                Some(src) if kms.get(&name, c).map_err(e)?.expose() == src.expose() => {
                    Ok((c, format!("{key} v{version} already copied (v{c})")))
                }
                Some(_) => Err(format!(
                    "{} already holds a current version of {name:?} (v{c}) that is not {key} v{version} from KMS {from_kms}; nothing was overwritten. Give the key another `name`, or remove that entry from the KMS",
                    kms.describe()
                )),
                // The old KMS no longer holds it: an earlier run copied and destroyed it; the
                // verify steps that follow test the copy on every device.
                None => Ok((c, format!("{key} already moved (v{c})"))),
            };
        }
        let Some(src) = source else {
            return Err(format!(
                "{key} v{version} is no longer current in KMS {from_kms}, and {} holds no copy; nothing was changed. Run `keyplan plan` to see the new state",
                kms.describe()
            ));
        };
        let v = match st.pending {
            Some(p) if kms.get(&name, p).map_err(e)?.expose() == src.expose() => p,
            Some(p) => {
                return Err(format!(
                    "{} holds a pending version v{p} of {name:?} that is not {key} v{version} from KMS {from_kms}; nothing was overwritten. Remove it from the KMS, then run `keyplan apply` again",
                    kms.describe()
                ))
            }
            None => kms.stage(&name, &src, version).map_err(e)?,
        };
        kms.commit(&name, None, v).map_err(e)?;
        let back = kms.get(&name, v).map_err(e)?;
        let st = kms.read(&name).map_err(e)?;
        if back.expose() != src.expose() || st.current != Some(v) {
            return Err(format!(
                "{}: the copy of {key} v{version} does not read back as the current version v{v}; KMS {from_kms} still holds the key, nothing else was changed",
                kms.describe()
            ));
        }
        Ok((
            v,
            format!("copied {key} v{version} from KMS {from_kms} as v{v}"),
        ))
    }

    fn device_path(&self, device: &str) -> Result<std::path::PathBuf, String> {
        self.plan
            .devices
            .get(device)
            .map(|d| d.path.clone())
            .ok_or_else(|| format!("device {device} is no longer in the plan"))
    }

    fn resolve(&self, key: &str, v: VersionRef) -> Result<u64, String> {
        match v {
            VersionRef::Version(n) => Ok(n),
            VersionRef::Staged => self
                .staged
                .lock()
                .map_err(|_| "internal lock poisoned".to_string())?
                .get(key)
                .copied()
                .ok_or_else(|| format!("no version of {key} was staged in this run")),
        }
    }

    fn material(&self, key: &str, v: VersionRef) -> Result<(u64, Passphrase), String> {
        let version = self.resolve(key, v)?;
        let (kms, name, _) = self.key_ctx(key)?;
        let p = kms.get(&name, version).map_err(|e| e.to_string())?;
        if p.is_empty() {
            return Err(format!("{key} v{version} is empty in the KMS"));
        }
        Ok((version, p))
    }

    /// Takes from the run's memory budget what one PBKDF run at a time of the keyslots `slots`
    /// of `header` needs (the costliest of them), and, with `new_keyslot` set to the device's
    /// LUKS version, of a new keyslot made with the plan's PBKDF settings; blocks until free.
    fn memory_for(
        &self,
        header: &crate::luks::Header,
        slots: &[u32],
        new_keyslot: Option<crate::luks::LuksVersion>,
    ) -> memory::MemoryGuard<'_> {
        let existing = slots
            .iter()
            .filter_map(|s| header.keyslots.get(s))
            .filter_map(|k| k.memory_kib)
            .max();
        let new = new_keyslot.and_then(|v| new_keyslot_memory_kib(self.plan, v));
        self.memory.take(memory::pbkdf_kib(existing.max(new)))
    }

    fn run(&self, idx: usize, step: &Step) -> Result<StepOutcome, String> {
        let cs = &self.world.cs;
        let ok = |s: String| {
            Ok(StepOutcome {
                outcome: s,
                ..StepOutcome::default()
            })
        };
        match step {
            Step::Stage { key, at_least } => {
                let (kms, name, bytes) = self.key_ctx(key)?;
                let st = kms.read(&name).map_err(|e| e.to_string())?;
                let (v, what) = match st.pending {
                    Some(p) => (p, format!("reused pending v{p}")),
                    None => {
                        let material = Passphrase::generate(bytes)?;
                        let v = kms
                            .stage(&name, &material, *at_least)
                            .map_err(|e| e.to_string())?;
                        (v, format!("staged v{v}"))
                    }
                };
                self.staged_outcome(key, v, what)
            }
            Step::AddKeyslot {
                device,
                key,
                version,
                slot,
                unlock,
            } => {
                let path = self.device_path(device)?;
                let (v, material) = self.material(key, *version)?;
                let header = cs.dump(&path).map_err(|e| e.to_string())?;
                if header.keyslots.contains_key(slot) {
                    let recs = self.world.read_records(&header)?;
                    if recs.iter().any(|r| {
                        r.slot == *slot
                            && r.status == RecordStatus::Valid
                            && r.record.key == *key
                            && r.record.version == v
                    }) {
                        return ok(format!("keyslot {slot} already holds {key} v{v}"));
                    }
                    if self.resumed.get(idx).copied().unwrap_or(false)
                        && !recs
                            .iter()
                            .any(|r| r.slot == *slot && r.status == RecordStatus::Valid)
                        && {
                            let _mem = self.memory_for(&header, &[*slot], None);
                            cs.test_passphrase(&path, *slot, &material)
                                .map_err(|e| e.to_string())?
                        }
                    {
                        let salt = header
                            .keyslots
                            .get(slot)
                            .map(|k| k.salt.clone())
                            .unwrap_or_default();
                        self.world.write_record(
                            &path,
                            &header,
                            *slot,
                            &SlotRecord {
                                key: key.clone(),
                                version: v,
                                salt,
                                entry: self.entry(key),
                            },
                        )?;
                        return ok(format!(
                            "adopted keyslot {slot} (added by the interrupted run, opens with {key} v{v})"
                        ));
                    }
                    return Err(format!(
                        "keyslot {slot} of device {device} became occupied after planning (drift); nothing was changed. Run `keyplan plan` again"
                    ));
                }
                let (unlock_slot, unlock_pass) = match unlock {
                    Unlock::Key {
                        key: k2,
                        version: v2,
                        slot: s2,
                    } => {
                        if !header.keyslots.contains_key(s2) {
                            return Err(format!(
                                "keyslot {s2} of device {device}, which should open it with {k2}, is gone (drift); nothing was changed. Run `keyplan plan` again"
                            ));
                        }
                        let (_, p) = self.material(k2, *v2)?;
                        (Some(*s2), p)
                    }
                    Unlock::EnrollWith => {
                        let file = self
                            .plan
                            .devices
                            .get(device)
                            .and_then(|d| d.enroll_with.clone())
                            .ok_or_else(|| format!("device {device} has no enroll_with file"))?;
                        let bytes = std::fs::read(&file).map_err(|e| {
                            format!("cannot read enroll_with file {}: {e}", file.display())
                        })?;
                        if bytes.is_empty() {
                            return Err(format!(
                                "enroll_with file {} is empty; it must hold a passphrase that opens device {device}",
                                file.display()
                            ));
                        }
                        (
                            self.enroll_with_keyslots.get(device).copied(),
                            Passphrase::new(bytes),
                        )
                    }
                };
                // The unlocking keyslot's PBKDF (or, for enroll_with, whose named keyslot may
                // fall back to trying every one, the costliest bound keyslot cryptsetup may
                // try) and the new keyslot's, one after the other.
                let tried: Vec<u32> = match (unlock, unlock_slot) {
                    (Unlock::Key { .. }, Some(s)) => vec![s],
                    _ => header
                        .keyslots
                        .iter()
                        .filter(|(_, k)| k.bound)
                        .map(|(n, _)| *n)
                        .collect(),
                };
                let _mem = self.memory_for(&header, &tried, Some(header.version));
                let mut added = cs.add_keyslot(
                    &path,
                    &header,
                    unlock_slot,
                    &unlock_pass,
                    *slot,
                    &material,
                    self.plan.pbkdf.as_ref(),
                );
                let enroll_with = matches!(unlock, Unlock::EnrollWith);
                let no_unlock = |a: &Result<(), crate::luks::LuksError>| {
                    matches!(a, Err(crate::luks::LuksError::Failed { code: 1 | 2, .. }))
                };
                // The keyslot the enroll_with passphrase opened when planning no longer opens
                // with it (changed since): try keyslots, as without the hint.
                if enroll_with && unlock_slot.is_some() && no_unlock(&added) {
                    tracing::info!(
                        device = %device,
                        "the enroll_with passphrase no longer opens keyslot {}; trying every keyslot",
                        unlock_slot.unwrap_or_default()
                    );
                    added = cs.add_keyslot(
                        &path,
                        &header,
                        None,
                        &unlock_pass,
                        *slot,
                        &material,
                        self.plan.pbkdf.as_ref(),
                    );
                }
                // cryptsetup skips keyslots with priority `ignore` unless named with
                // --key-slot (cryptsetup-config(8)); an enroll_with passphrase may live in one.
                if enroll_with && no_unlock(&added) {
                    for (s, _) in header
                        .keyslots
                        .iter()
                        .filter(|(_, k)| k.priority == crate::luks::Priority::Ignore && k.bound)
                    {
                        added = cs.add_keyslot(
                            &path,
                            &header,
                            Some(*s),
                            &unlock_pass,
                            *slot,
                            &material,
                            self.plan.pbkdf.as_ref(),
                        );
                        if added.is_ok() {
                            break;
                        }
                    }
                }
                added.map_err(|e| match (&e, unlock) {
                    (crate::luks::LuksError::Failed { code: 1 | 2, .. }, Unlock::EnrollWith) => {
                        let file = self
                            .plan
                            .devices
                            .get(device)
                            .and_then(|d| d.enroll_with.as_ref())
                            .map(|f| f.display().to_string())
                            .unwrap_or_default();
                        format!(
                            "the enroll_with passphrase in {file} opens no keyslot of device {device} (keyplan uses the file's bytes exactly: a trailing newline counts); nothing was changed on the device ({e})"
                        )
                    }
                    _ => format!("{e}; nothing was changed on the device"),
                })?;
                crate::failpoint::check("add.after_keyslot")?;
                let header = cs.dump(&path).map_err(|e| e.to_string())?;
                let salt = header
                    .keyslots
                    .get(slot)
                    .map(|k| k.salt.clone())
                    .ok_or_else(|| {
                        format!("keyslot {slot} of {device} is empty after luksAddKey")
                    })?;
                let record = SlotRecord {
                    key: key.clone(),
                    version: v,
                    salt,
                    entry: self.entry(key),
                };
                if let Err(e) = self.world.write_record(&path, &header, *slot, &record) {
                    // An unrecorded keyslot would be an orphan nobody can attribute. It holds a
                    // version that is not current yet, and the unlocking keyslot remains, so
                    // removing it again cannot lock anyone out.
                    let undo = cs.kill_keyslot(&path, *slot);
                    return Err(match undo {
                        Ok(()) => format!("{e}; the new keyslot {slot} was removed again, so device {device} is as before"),
                        Err(k) => format!("{e}; removing the unrecorded keyslot {slot} also failed ({k}): it holds {key} v{v}, not yet current; kill it by hand (cryptsetup luksKillSlot {} {slot})", path.display()),
                    });
                }
                ok(format!("added keyslot {slot} ({key} v{v})"))
            }
            Step::Verify {
                device,
                key,
                version,
                slot,
            } => {
                let path = self.device_path(device)?;
                let (v, material) = self.material(key, *version)?;
                let header = cs.dump(&path).map_err(|e| e.to_string())?;
                let ks = header.keyslots.get(slot).ok_or_else(|| {
                    format!("keyslot {slot} of device {device} is empty; expected {key} v{v}")
                })?;
                if !ks.bound {
                    return Err(format!(
                        "keyslot {slot} of device {device} is not bound to the data segment: it would open nothing"
                    ));
                }
                let mem = self.memory_for(&header, &[*slot], None);
                let opens = cs
                    .test_passphrase(&path, *slot, &material)
                    .map_err(|e| e.to_string())?;
                drop(mem);
                if !opens {
                    return Err(format!(
                        "{key} v{v} does not open keyslot {slot} of device {device}; nothing was committed or killed"
                    ));
                }
                let salt = ks.salt.clone();
                self.verified
                    .lock()
                    .map_err(|_| "internal lock poisoned".to_string())?
                    .insert(idx, (device.clone(), *slot, salt.clone()));
                Ok(StepOutcome {
                    outcome: format!("{key} v{v} opens keyslot {slot}"),
                    staged_version: None,
                    verified_salt: Some(salt),
                })
            }
            Step::Commit {
                key,
                expected_current,
            } => {
                let v = self.resolve(key, VersionRef::Staged)?;
                let (kms, name, _) = self.key_ctx(key)?;
                kms.commit(&name, *expected_current, v)
                    .map_err(|e| e.to_string())?;
                let st = kms.read(&name).map_err(|e| e.to_string())?;
                if st.current != Some(v) {
                    return Err(format!(
                        "{}: after commit, the current version of {key} reads back as {:?}, not v{v}",
                        kms.describe(),
                        st.current
                    ));
                }
                ok(format!("{key} v{v} is now current"))
            }
            Step::KillKeyslot {
                device,
                slot,
                holder,
                anchor,
            } => {
                let path = self.device_path(device)?;
                let header = cs.dump(&path).map_err(|e| e.to_string())?;
                let Some(ks) = header.keyslots.get(slot) else {
                    self.world.remove_record(&path, &header, *slot)?;
                    return ok(format!("keyslot {slot} already empty"));
                };
                match holder {
                    SlotHolder::Record { key, version } => {
                        let v = self.resolve(key, *version)?;
                        let recs = self.world.read_records(&header)?;
                        if !recs.iter().any(|r| {
                            r.slot == *slot
                                && r.status == RecordStatus::Valid
                                && r.record.key == *key
                                && r.record.version == v
                        }) {
                            return Err(format!(
                                "keyslot {slot} of device {device} no longer holds {key} v{v} (changed after planning); not killed"
                            ));
                        }
                    }
                    SlotHolder::Unmanaged { salt } => {
                        if ks.salt != *salt {
                            return Err(format!(
                                "keyslot {slot} of device {device} was rewritten after planning; not killed"
                            ));
                        }
                    }
                }
                let verified = self
                    .verified
                    .lock()
                    .map_err(|_| "internal lock poisoned".to_string())?
                    .get(anchor)
                    .cloned();
                let Some((adev, aslot, asalt)) = verified else {
                    return Err(format!(
                        "refusing to kill keyslot {slot} of device {device}: no other keyslot was verified in this run"
                    ));
                };
                let anchor_ok = adev == *device
                    && aslot != *slot
                    && header
                        .keyslots
                        .get(&aslot)
                        .is_some_and(|a| a.bound && a.salt == asalt);
                if !anchor_ok {
                    return Err(format!(
                        "refusing to kill keyslot {slot} of device {device}: keyslot {aslot}, verified to open it, is no longer as verified"
                    ));
                }
                cs.kill_keyslot(&path, *slot).map_err(|e| e.to_string())?;
                crate::failpoint::check("kill.after_keyslot")?;
                // Killing a keyslot leaves token ids (and the LUKS1 UUID) as they were, so the
                // header read before the kill still finds the record: no second dump needed.
                self.world.remove_record(&path, &header, *slot)?;
                ok(format!("killed keyslot {slot} (keyslot {aslot} verified)"))
            }
            Step::ForgetRecord {
                device,
                slot,
                failed_verify,
            } => {
                let path = self.device_path(device)?;
                let header = cs.dump(&path).map_err(|e| e.to_string())?;
                let recs = self.world.read_records(&header)?;
                if !failed_verify
                    && recs
                        .iter()
                        .any(|r| r.slot == *slot && r.status == RecordStatus::Valid)
                {
                    return ok(format!("record of keyslot {slot} is valid again; kept"));
                }
                self.world.remove_record(&path, &header, *slot)?;
                ok(format!("dropped the record of keyslot {slot}"))
            }
            Step::Retire { key, version } => {
                let (kms, name, _) = self.key_ctx(key)?;
                kms.retire(&name, *version).map_err(|e| e.to_string())?;
                ok(format!("retired {key} v{version}"))
            }
            Step::MigrateCopy {
                key,
                from_kms,
                from_name,
                version,
                to_kms,
                to_name,
            } => {
                self.destination(key, to_kms, to_name)?;
                if (to_kms, to_name) == (from_kms, from_name) {
                    return Err(format!(
                        "refusing to move {key} from KMS {from_kms} ({from_name}) onto itself"
                    ));
                }
                let (v, what) = self.migrate_copy(key, from_kms, from_name, *version)?;
                self.staged_outcome(key, v, what)
            }
            Step::DestroyOrigin {
                key,
                from_kms,
                from_name,
                version,
                to_kms,
                to_name,
            } => {
                let (kms, name) = self.destination(key, to_kms, to_name)?;
                if (to_kms, to_name) == (from_kms, from_name) {
                    return Err(format!(
                        "refusing to destroy {key} in KMS {from_kms}: it is the KMS the key moves to"
                    ));
                }
                let old = self.origin(key, from_kms)?;
                let e = |e: crate::kms::KmsError| e.to_string();
                let old_st = old.read(from_name).map_err(e)?;
                if old_st.current == Some(*version) {
                    // Destroy only what the destination demonstrably holds.
                    let src = old.get(from_name, *version).map_err(e)?;
                    let st = kms.read(&name).map_err(e)?;
                    let held = match st.current {
                        Some(c) => kms.get(&name, c).map_err(e)?.expose() == src.expose(),
                        None => false,
                    };
                    if !held {
                        return Err(format!(
                            "not destroying {key} v{version} in KMS {from_kms}: {} does not hold it as its current version; nothing was destroyed. Run `keyplan plan` to see the state",
                            kms.describe()
                        ));
                    }
                }
                old.destroy_key(from_name, *version).map_err(e)?;
                ok(format!("destroyed {key} in KMS {from_kms}"))
            }
            Step::Rerecord {
                device,
                key,
                slot,
                version,
                to_kms,
                to_name,
            } => {
                self.destination(key, to_kms, to_name)?;
                let path = self.device_path(device)?;
                let v = self.resolve(key, *version)?;
                let header = cs.dump(&path).map_err(|e| e.to_string())?;
                let ks = header.keyslots.get(slot).ok_or_else(|| {
                    format!("keyslot {slot} of device {device} is empty; expected {key} v{v}")
                })?;
                let record = SlotRecord {
                    key: key.clone(),
                    version: v,
                    salt: ks.salt.clone(),
                    entry: self.entry(key),
                };
                self.world.replace_record(&path, &header, *slot, &record)?;
                ok(format!("recorded keyslot {slot} as {key} v{v}"))
            }
        }
    }
}
