//! `plan`: observe, diff, check the KMSs the plan would write to. Writes nothing anywhere
//! (invariant I6).

use std::collections::{BTreeMap, BTreeSet};

use super::Engine;
use crate::diff::{self, Diff, DiffOptions};
use crate::error::Error;
use crate::graph::Step;
use crate::journal::RunSummary;
use crate::observe::{self, Observed, Testing};
use crate::spec::Plan;
use crate::world::RecordStatus;

/// What a plan is asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanRequest {
    /// Keys to rotate whatever their age (`--rotate KEY`).
    pub rotate: Vec<String>,
    /// Also test every managed keyslot with its KMS version (one PBKDF run each); failures
    /// become drift to repair (`--verify`).
    pub verify: bool,
    /// Allow writes to devices whose LUKS2 header copies disagree (`--repair-headers`):
    /// cryptsetup's first write rewrites the damaged copy.
    pub repair_headers: bool,
}

/// A plan made from an observation.
#[derive(Debug, Clone)]
pub struct Planned {
    /// The observation as read, before `--verify` marked any record (what a saved plan's
    /// digest covers).
    pub observed: Observed,
    /// The changes and steps.
    pub diff: Diff,
}

/// What [`plan`] found.
#[derive(Debug, Clone)]
pub enum PlanOutcome {
    /// The journal's last run was interrupted: `apply` finishes it before anything else, so no
    /// diff is made (the devices hold half of that run; a diff would mislead).
    Interrupted(Box<RunSummary>),
    /// The plan (both variants are boxed: each is large).
    Planned(Box<Planned>),
}

/// `keyplan plan`: the interrupted run, if there is one; else observes, diffs and checks the
/// KMSs the steps would write to. A read-only command: each KMS instance's calls together
/// wait at most its `timeout` ([`crate::world::World::bound_kms_waits`]).
///
/// Errors: a run holds the state lock right now ([`Error::InProgress`]); the journal cannot be
/// read; see [`make`].
pub fn plan(engine: &Engine, req: &PlanRequest) -> Result<PlanOutcome, Error> {
    engine.world().bound_kms_waits();
    if let Some(s) = interrupted_run(engine.plan())? {
        return Ok(PlanOutcome::Interrupted(Box::new(s)));
    }
    make(engine, req).map(|p| PlanOutcome::Planned(Box::new(p)))
}

/// The last run of the journal when it was interrupted (no `run_end`).
///
/// Errors: [`Error::InProgress`] when a run holds the state lock right now (its journal is in
/// flux: planning against a half-done run would mislead); [`Error::Journal`] when the journal
/// cannot be read.
pub fn interrupted_run(plan: &Plan) -> Result<Option<RunSummary>, Error> {
    if let Some(holder) = crate::journal::lock_holder(&plan.state_dir) {
        return Err(Error::InProgress {
            state_dir: plan.state_dir.clone(),
            holder,
        });
    }
    let records = crate::journal::read(&plan.state_dir)?;
    Ok(crate::journal::last_run(&records).filter(|s| s.ended.is_none()))
}

/// Observes (testing `enroll_with` passphrases enrolling needs), with `req.verify` tests every
/// valid record, diffs, checks every KMS the steps would write to, and logs a warning for each
/// KMS credential that ends too early ([`super::credentials`]).
///
/// Errors: [`Error::Findings`] (observation), [`Error::NoSafePlan`], [`Error::KmsCheck`], and
/// KMS or cryptsetup failures of `--verify`.
pub fn make(engine: &Engine, req: &PlanRequest) -> Result<Planned, Error> {
    let (plan, world) = (engine.plan(), engine.world());
    let observed = observe::observe(plan, world, Testing::Passphrases)?;
    let mut checked = observed.clone();
    if req.verify {
        verify_records(engine, &mut checked)?;
    }
    let opts = DiffOptions {
        rotate: req.rotate.clone(),
        repair_headers: req.repair_headers,
        staged_here: observed.staged_here.clone(),
    };
    let d = diff::diff(plan, &checked, &opts).map_err(Error::NoSafePlan)?;
    check_kms(engine, &d)?;
    super::credentials::log_warnings(engine, &observed.keys);
    Ok(Planned { observed, diff: d })
}

/// Before any device is touched: every KMS the plan would write to must be reachable and allow
/// keyplan to stage, commit and retire (or destroy) those keys ([`crate::kms::Kms::check`],
/// which writes nothing). Rook rotated devices and only then found its KMS could not store the
/// new key; keyplan refuses the plan instead.
///
/// Errors: [`Error::KmsCheck`] listing every KMS that failed.
fn check_kms(engine: &Engine, d: &Diff) -> Result<(), Error> {
    let plan = engine.plan();
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
        if let Some(kms) = engine.world().kms.get(&instance) {
            let list: Vec<String> = set.into_iter().collect();
            tracing::debug!(kms = %instance, keys = ?list, "checking KMS before planning writes");
            if let Err(e) = kms.check(&list) {
                problems.push(e);
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::KmsCheck(problems))
    }
}

/// `plan --verify`: tests every valid record of a key in the plan against its keyslot (one
/// PBKDF run each); a version that does not open it, or a keyslot that is not bound, marks the
/// record [`RecordStatus::FailedVerify`] (drift the diff repairs). The version is read from
/// the KMS the record names (its `entry`) when the plan has that KMS: during a migration the
/// records not yet re-recorded name the KMS the key moves from, which the plan's own KMS for
/// the key does not hold yet (issue 46; found by the simulation's migration scenario).
///
/// Errors: a KMS the plan does not have for a key; a cryptsetup failure.
fn verify_records(engine: &Engine, observed: &mut Observed) -> Result<(), Error> {
    let (plan, world) = (engine.plan(), engine.world());
    for dev in observed.devices.values_mut() {
        for r in dev.records.iter_mut() {
            if r.status != RecordStatus::Valid {
                continue;
            }
            let Some(key) = plan.keys.get(&r.record.key) else {
                continue;
            };
            let named =
                r.record.entry.as_ref().and_then(|(kms, name)| {
                    world.kms.get(kms).map(|k| (k.as_ref(), name.as_str()))
                });
            let (kms, name) = match named {
                Some(found) => found,
                None => (
                    world
                        .kms_for(plan, &key.id)
                        .map_err(|e| Error::request(e.to_string(), None))?,
                    key.name.as_str(),
                ),
            };
            let Ok(p) = kms.get(name, r.record.version) else {
                r.status = RecordStatus::FailedVerify;
                continue;
            };
            let bound = dev.header.keyslots.get(&r.slot).is_some_and(|k| k.bound);
            let opens = world.luks.test_passphrase(&dev.path, r.slot, &p)?;
            if !(opens && bound) {
                r.status = RecordStatus::FailedVerify;
            }
        }
    }
    Ok(())
}
