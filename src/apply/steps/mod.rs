//! Step executors: one function per step kind (docs/rotation.md), sharing the run's context
//! ([`Exec`]): the plan, the doors to the world, the versions staged and the keyslots verified
//! so far, the PBKDF memory budget.
//!
//! Every executor is idempotent: run again after a crash (the journal says the step started
//! but not that it finished), it finds its effect done and reports so, or does it. Before every
//! effect it re-reads what it acts on and refuses when that changed since planning (drift),
//! leaving the device as it was.
//!
//! Layout: `keys` stage/commit/retire (the KMS side of a rotation), `add` adds a keyslot,
//! `adopt` records an unrecorded keyslot, `verify`, `kill` kills a keyslot and drops records,
//! `copies` tests unmanaged keyslots for copies of a version about to be retired,
//! `migrate` copies a key to another KMS.

mod add;
mod adopt;
mod copies;
mod keys;
mod kill;
mod migrate;
mod verify;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use super::memory;
use crate::graph::{Step, VersionRef};
use crate::journal::RunSummary;
use crate::kms::{Kms, KmsError};
use crate::luks::{Header, LuksError, LuksVersion};
use crate::secret::Passphrase;
use crate::spec::Plan;
use crate::world::{RecordError, World};

/// What a finished step reports (journaled).
#[derive(Debug, Clone, Default)]
pub struct StepOutcome {
    /// Human summary, e.g. `added keyslot 3`.
    pub outcome: String,
    /// For `stage` (and a migration's copy): the version staged or reused.
    pub staged_version: Option<u64>,
    /// For `verify`: the salt of the verified keyslot.
    pub verified_salt: Option<String>,
}

impl StepOutcome {
    /// An outcome with only a summary.
    fn done(outcome: String) -> Result<StepOutcome, StepError> {
        Ok(StepOutcome {
            outcome,
            ..StepOutcome::default()
        })
    }
}

/// Why a step failed. Its text goes into the journal's `step_failed` record and the run's
/// error; it never holds key material. Each says what was left as it was.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// The device or KMS is no longer as planned (a keyslot occupied, gone or rewritten since,
    /// the plan moved a key elsewhere); nothing was changed. `keyplan plan` shows the new
    /// state.
    #[error("{0}")]
    Drift(String),
    /// keyplan refused an effect that could lock someone out or overwrite what it cannot
    /// attribute (a kill whose anchor is not as verified, a KMS entry that is not the key).
    #[error("{0}")]
    Refused(String),
    /// The plan no longer names what the step needs (a key, a device, a KMS instance).
    #[error("{0}")]
    Plan(String),
    /// A KMS call failed.
    #[error(transparent)]
    Kms(#[from] KmsError),
    /// A cryptsetup call failed.
    #[error(transparent)]
    Luks(#[from] LuksError),
    /// A cryptsetup call failed, with what the step left (`context` starts with `; `).
    #[error("{source}{context}")]
    LuksLeft {
        /// The failure.
        source: LuksError,
        /// What was left untouched, or what to do.
        context: String,
    },
    /// keyplan's records could not be read or written.
    #[error(transparent)]
    Records(#[from] RecordError),
    /// A file of the state directory could not be read or written (the text says which, what
    /// the step did before, and what to do).
    #[error("{0}")]
    State(String),
    /// The operating system's random source failed, or an internal lock was poisoned.
    #[error("{0}")]
    Internal(String),
    /// A test injection point fired (`failpoints` builds only).
    #[error("{0}")]
    Injected(String),
}

/// Evaluates injection point `name` ([`crate::failpoint::check`]) as a step error.
pub(super) fn failpoint(name: &str) -> Result<(), StepError> {
    crate::failpoint::check(name).map_err(StepError::Injected)
}

/// Shared state of a run's steps.
pub(super) struct Exec<'a> {
    plan: &'a Plan,
    world: &'a World,
    /// Key id -> staged version.
    staged: Mutex<BTreeMap<String, u64>>,
    /// Verify step index -> (device id, keyslot, salt) verified by this process.
    verified: Mutex<BTreeMap<usize, (String, u32, String)>>,
    /// Verify steps an interrupted process journaled as done: a kill anchored on one runs it
    /// again first (docs/verification.md: silent damage between the crash and the resume).
    reverify: BTreeMap<usize, Step>,
    /// `find copies` steps an interrupted process journaled as done: a retire of their version
    /// runs them again first (an operator may have added a keyslot while no keyplan ran;
    /// found by the protocol model, docs/verification.md).
    recheck_copies: Vec<Step>,
    /// Steps that a previous process started and did not finish.
    resumed: Vec<bool>,
    /// Memory for the PBKDF runs of steps running at once.
    pub(super) memory: memory::MemoryBudget,
    /// See [`super::RunInput::enroll_with_keyslots`].
    enroll_with_keyslots: &'a BTreeMap<String, u32>,
}

impl<'a> Exec<'a> {
    /// The context of a run of `steps` steps; with `resume`, what an interrupted process
    /// already staged and verified, and which steps it left under way.
    pub(super) fn new(
        plan: &'a Plan,
        world: &'a World,
        steps: usize,
        resume: Option<&RunSummary>,
        memory_budget_kib: u64,
        enroll_with_keyslots: &'a BTreeMap<String, u32>,
    ) -> Exec<'a> {
        let mut staged = BTreeMap::new();
        let mut reverify = BTreeMap::new();
        let mut recheck_copies = Vec::new();
        let mut resumed = vec![false; steps];
        if let Some(s) = resume {
            resumed.clone_from(&s.started_not_done);
            resumed.resize(steps, false);
            staged.extend(s.staged.iter().cloned());
            for (i, _salt) in &s.verified {
                if let Some(step @ Step::Verify { .. }) = s.steps.get(*i) {
                    reverify.insert(*i, step.clone());
                }
            }
            recheck_copies = s
                .steps
                .iter()
                .zip(&s.done)
                .filter(|(step, done)| **done && matches!(step, Step::FindCopies { .. }))
                .map(|(step, _)| step.clone())
                .collect();
        }
        Exec {
            plan,
            world,
            staged: Mutex::new(staged),
            verified: Mutex::new(BTreeMap::new()),
            reverify,
            recheck_copies,
            resumed,
            memory: memory::MemoryBudget::new(memory_budget_kib),
            enroll_with_keyslots,
        }
    }

    /// Runs step `idx`, `step`, with its executor.
    pub(super) fn run(&self, idx: usize, step: &Step) -> Result<StepOutcome, StepError> {
        match step {
            Step::Stage {
                key,
                at_least,
                planned_current,
            } => self.stage(key, *at_least, *planned_current),
            Step::AddKeyslot {
                device,
                key,
                version,
                slot,
                unlock,
            } => self.add(idx, device, key, *version, *slot, unlock),
            Step::Verify {
                device,
                key,
                version,
                slot,
            } => self.verify(idx, device, key, *version, *slot),
            Step::Commit {
                key,
                expected_current,
            } => self.commit(key, *expected_current),
            Step::KillKeyslot {
                device,
                slot,
                holder,
                anchor,
            } => self.kill(device, *slot, holder, *anchor),
            Step::ForgetRecord {
                device,
                slot,
                failed_verify,
            } => self.forget(device, *slot, *failed_verify),
            Step::AdoptKeyslot {
                device,
                slot,
                key,
                version,
                salt,
            } => self.adopt(device, *slot, key, *version, salt),
            Step::Retire { key, version } => self.retire(key, *version),
            Step::FindCopies {
                device,
                key,
                version,
                slots,
            } => self.find_copies(device, key, *version, slots),
            Step::Hold { key, current } => self.hold(key, *current),
            Step::Release { key, entry } => self.release(key, entry.as_ref()),
            Step::ReleaseFormer { key, holder } => self.release_former(key, holder),
            Step::Vote { key } => self.vote(key),
            Step::Unvote { key, version } => self.unvote(key, *version),
            Step::MigrateCopy { .. } => self.migrate_copy(step),
            Step::DestroyOrigin { .. } => self.destroy_origin(step),
            Step::Rerecord {
                device,
                key,
                slot,
                version,
                to_kms,
                to_name,
            } => self.rerecord(device, key, *slot, *version, (to_kms, to_name)),
        }
    }

    /// The KMS, name in it and `bytes` of plan key `key`.
    fn key_ctx(&self, key: &str) -> Result<(&'a dyn Kms, String, usize), StepError> {
        let spec = self
            .plan
            .keys
            .get(key)
            .ok_or_else(|| StepError::Plan(format!("key {key} is no longer in the plan")))?;
        let kms = self
            .world
            .kms_for(self.plan, key)
            .map_err(|e| StepError::Plan(e.to_string()))?;
        Ok((kms, spec.name.clone(), spec.bytes))
    }

    /// `(KMS instance, name)` of a plan key, for its records.
    fn entry(&self, key: &str) -> Option<(String, String)> {
        self.plan
            .keys
            .get(key)
            .map(|k| (k.kms.clone(), k.name.clone()))
    }

    fn device_path(&self, device: &str) -> Result<PathBuf, StepError> {
        self.plan
            .devices
            .get(device)
            .map(|d| d.path.clone())
            .ok_or_else(|| StepError::Plan(format!("device {device} is no longer in the plan")))
    }

    fn lock<'m, T>(m: &'m Mutex<T>) -> Result<std::sync::MutexGuard<'m, T>, StepError> {
        m.lock()
            .map_err(|_| StepError::Internal("internal lock poisoned".to_string()))
    }

    /// Remembers `v` as the version of `key` this run's later steps use (`VersionRef::Staged`)
    /// and reports it in the step's outcome, so a resumed run knows it too.
    fn staged_outcome(&self, key: &str, v: u64, what: String) -> Result<StepOutcome, StepError> {
        Self::lock(&self.staged)?.insert(key.to_string(), v);
        Ok(StepOutcome {
            outcome: what,
            staged_version: Some(v),
            verified_salt: None,
        })
    }

    /// The version number `v` means for `key` in this run.
    fn resolve(&self, key: &str, v: VersionRef) -> Result<u64, StepError> {
        match v {
            VersionRef::Version(n) => Ok(n),
            VersionRef::Staged => Self::lock(&self.staged)?.get(key).copied().ok_or_else(|| {
                StepError::Internal(format!("no version of {key} was staged in this run"))
            }),
        }
    }

    /// The passphrase of `v` of `key` from its KMS (never empty).
    fn material(&self, key: &str, v: VersionRef) -> Result<(u64, Passphrase), StepError> {
        let version = self.resolve(key, v)?;
        let (kms, name, _) = self.key_ctx(key)?;
        let p = kms.get(&name, version)?;
        if p.is_empty() {
            return Err(StepError::Refused(format!(
                "{key} v{version} is empty in the KMS"
            )));
        }
        Ok((version, p))
    }

    /// The header of the device at `path`, read now.
    fn header(&self, path: &std::path::Path) -> Result<Header, StepError> {
        Ok(self.world.luks.dump(path)?)
    }

    /// Takes from the run's memory budget what one PBKDF run at a time of the keyslots `slots`
    /// of `header` needs (the costliest of them), and, with `new_keyslot` set to the device's
    /// LUKS version, of a new keyslot made with the plan's PBKDF settings; blocks until free.
    fn memory_for(
        &self,
        header: &Header,
        slots: &[u32],
        new_keyslot: Option<LuksVersion>,
    ) -> memory::MemoryGuard<'_> {
        let existing = slots
            .iter()
            .filter_map(|s| header.keyslots.get(s))
            .filter_map(|k| k.memory_kib)
            .max();
        let new = new_keyslot.and_then(|v| super::new_keyslot_memory_kib(self.plan, v));
        self.memory.take(memory::pbkdf_kib(existing.max(new)))
    }
}
