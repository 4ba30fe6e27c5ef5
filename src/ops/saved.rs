//! Saved plans as operations: save (`plan -o`), check freshness (`show`), plan for applying
//! (`apply SAVED`). The file format and the digests are in [`crate::saved`].
//!
//! A saved plan is never trusted as input (docs/architecture.md, "Saved plans"): the plan file
//! is the one the operator names, its bytes must hash to the saved digest, and keyplan plans
//! again; the saved steps and changes must equal what it plans now.

use std::path::Path;

use super::apply::ApplySession;
use super::plan::{self, PlanRequest, Planned};
use super::Engine;
use crate::diff::Diff;
use crate::error::Error;
use crate::journal::RunSummary;
use crate::saved::{self, SavedError, SavedPlan};
use crate::spec::Plan;

/// Reads saved plan `path` and its changes and steps.
///
/// Errors: [`Error::Saved`]: unreadable, not a saved plan, another major format version,
/// damaged content, or changes and step dependencies that do not hold together.
pub fn read(path: &Path) -> Result<(SavedPlan, Diff), Error> {
    let s = saved::read(path)?;
    let d = s.diff().map_err(|damage| SavedError::Inconsistent {
        path: path.to_path_buf(),
        damage,
    })?;
    Ok((s, d))
}

/// Refuses `-o path` when `path` exists and is not a saved plan: `-o keyplan.yaml` or `-o
/// initial.pass` would replace the plan file or the only copy of a passphrase; only a missing
/// file or an earlier saved plan is overwritten.
///
/// Errors: [`Error::Request`].
pub fn check_out_path(path: &Path) -> Result<(), Error> {
    if path.exists() && saved::read(path).is_err() {
        return Err(Error::request(
            format!(
                "{} exists and is not a keyplan saved plan; refusing to overwrite it (nothing was planned or written)",
                path.display()
            ),
            Some(
                "choose another file name, or delete the file first if it really is disposable"
                    .into(),
            ),
        ));
    }
    Ok(())
}

/// The commands the refusal of a saved plan points to, spelled as the operator's command line
/// gave the plan file, the state directory and the options (the front end knows them; the
/// engine does not). Advice that leaves out `--rotate KEY` makes a plan without the rotation,
/// which says "No changes" (issue 46).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remedy {
    /// Makes the saved plan again as it was made, e.g. `keyplan plan --rotate k -o SAVED`.
    pub remake: String,
    /// Finishes an interrupted run, e.g. `keyplan apply -f PLAN`.
    pub finish: String,
}

impl Remedy {
    /// The advice to make the saved plan again: run `REMAKE` again, review it, and apply the
    /// new file.
    pub fn remake_help(&self) -> String {
        format!(
            "run `{}` again, review it, and apply the new file",
            self.remake
        )
    }
}

/// The refusal of `plan -o path` while run `s` is interrupted: a plan saved now would be made
/// against a half-done run.
pub fn interrupted_refusal(s: &RunSummary, path: &Path, remedy: &Remedy) -> Error {
    Error::Interrupted {
        run: s.run.clone(),
        message: format!(
            "run {} in the journal was interrupted; a plan saved now would be made against a half-done run, so {} was not written",
            s.run,
            path.display()
        ),
        help: format!(
            "run `{}` to finish it, then `{}` again",
            remedy.finish, remedy.remake
        ),
    }
}

/// Saves `planned` (made from `plan_bytes` with `req`) to `path` (atomically, mode 0600) with
/// the digest of what it was made from.
///
/// Errors: the journal cannot be read; [`Error::Saved`] when the file cannot be written.
pub fn save(
    engine: &Engine,
    planned: &Planned,
    req: &PlanRequest,
    plan_bytes: &[u8],
    path: &Path,
) -> Result<(), Error> {
    let plan = engine.plan();
    let journal = crate::journal::read(&plan.state_dir)?;
    let mut changes = crate::diff::json::plan_json(&planned.diff);
    if let Some(o) = changes.as_object_mut() {
        o.remove("steps");
    }
    let s = SavedPlan {
        format_version: saved::FORMAT_VERSION.to_string(),
        kind: saved::KIND.to_string(),
        keyplan_version: env!("CARGO_PKG_VERSION").to_string(),
        created_at: crate::clock::now_unix(),
        plan_file: saved::PlanFileRef {
            path: std::path::absolute(&plan.source_path).map_err(|source| SavedError::Io {
                what: "write",
                path: path.to_path_buf(),
                source,
            })?,
            sha256: saved::sha256_hex(plan_bytes),
        },
        state_dir: plan.state_dir.clone(),
        options: saved::SavedOptions {
            rotate: req.rotate.clone(),
            verify: req.verify,
            repair_headers: req.repair_headers,
        },
        state: saved::state_digest(plan_bytes, &planned.observed, saved::journal_mark(&journal)),
        changes,
        steps: planned.diff.graph.steps(),
        deps: planned.diff.graph.deps(),
    };
    Ok(saved::write(path, &s)?)
}

/// Why the plan file the operator names cannot be used with a saved plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanFileProblem {
    /// Its bytes are not the ones the saved plan was made from (another file, or edited).
    Differs(String),
    /// It uses another state directory than the saved plan was made against.
    StateDir(String),
}

/// Checks that `plan` (loaded from `bytes`, the file the operator names: `-f` or the default,
/// never the path the saved file records, which anyone who can edit that file could point
/// elsewhere) is the plan `saved` was made from, with the same state directory.
///
/// Errors: see [`PlanFileProblem`]; texts from the file are quoted with escapes.
pub fn check_plan_file(
    saved: &SavedPlan,
    plan: &Plan,
    bytes: &[u8],
) -> Result<(), PlanFileProblem> {
    if saved::sha256_hex(bytes) != saved.plan_file.sha256 {
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
    Ok(())
}

/// Whether a saved plan still matches what it was made from.
#[derive(Debug)]
pub enum Freshness {
    /// Nothing changed: `keyplan apply SAVED` would run it; the diff as keyplan plans it now.
    Current(Box<Diff>),
    /// What changed (one phrase each).
    Stale(Vec<String>),
    /// Staleness could not be checked (a device or KMS unreachable, ...).
    Unknown(Error),
}

/// `show`: plans again from `plan` (loaded from `bytes`) with the saved options, read-only and
/// without the lock (the PBKDF runs `plan` would make: an `enroll_with` check, `--verify`),
/// then compares with the saved digest and the saved steps and changes.
pub fn freshness(saved: &SavedPlan, plan: &Plan, bytes: &[u8]) -> Freshness {
    if let Err(PlanFileProblem::Differs(m) | PlanFileProblem::StateDir(m)) =
        check_plan_file(saved, plan, bytes)
    {
        return Freshness::Stale(vec![m]);
    }
    if let Err(e) = super::check_rotate_keys(plan, &saved.options.rotate) {
        return Freshness::Stale(vec![e.to_string()]);
    }
    let now = || -> Result<(saved::StateDigest, Diff), Error> {
        let engine = Engine::open(plan.clone())?;
        let records = crate::journal::read(&plan.state_dir)?;
        let planned = plan::make(&engine, &request(saved))?;
        let digest = saved::state_digest(bytes, &planned.observed, saved::journal_mark(&records));
        Ok((digest, planned.diff))
    };
    match now() {
        Ok((digest, d)) => {
            let mut changed = saved::changes_since(&saved.state, &digest);
            if changed.is_empty() {
                changed = saved::mismatch(saved, &d, &crate::diff::json::plan_json(&d));
            }
            if changed.is_empty() {
                Freshness::Current(Box::new(d))
            } else {
                Freshness::Stale(changed)
            }
        }
        Err(e) => Freshness::Unknown(e),
    }
}

/// The plan request a saved plan was made with.
fn request(saved: &SavedPlan) -> PlanRequest {
    PlanRequest {
        rotate: saved.options.rotate.clone(),
        verify: saved.options.verify,
        repair_headers: saved.options.repair_headers,
    }
}

impl ApplySession<'_> {
    /// `apply SAVED`: plans again exactly as `plan -o` did (same checks: `enroll_with`
    /// passphrases, free keyslots, writable devices, the KMS check), under this session's lock,
    /// and requires the saved file to agree with the state it was made from (`plan_bytes`, the
    /// devices, the KMSs, the journal) and with the plan keyplan makes now. `remedy` holds the
    /// commands the refusals advise.
    ///
    /// Errors: [`Error::Interrupted`] while the journal holds an interrupted run;
    /// [`Error::Stale`]; [`Error::SavedMismatch`]; and those of [`plan::make`].
    pub fn plan_saved(
        &mut self,
        saved: &SavedPlan,
        path: &Path,
        plan_bytes: &[u8],
        remedy: &Remedy,
    ) -> Result<Planned, Error> {
        let plan = self.engine().plan();
        if let Some(s) = self.interrupted() {
            return Err(Error::Interrupted {
                run: s.run.clone(),
                message: format!(
                    "refusing to apply saved plan {}: run {} in the journal was interrupted; nothing was changed",
                    path.display(),
                    s.run
                ),
                help: format!(
                    "run `{}` to finish it, then make a new saved plan: `{}`",
                    remedy.finish, remedy.remake
                ),
            });
        }
        let records = self.records()?;
        super::check_rotate_keys(plan, &saved.options.rotate)?;
        let planned = plan::make(self.engine(), &request(saved))?;
        let now = saved::state_digest(plan_bytes, &planned.observed, saved::journal_mark(&records));
        let changed = saved::changes_since(&saved.state, &now);
        if !changed.is_empty() {
            return Err(Error::Stale {
                saved: path.to_path_buf(),
                changed,
                help: remedy.remake_help(),
            });
        }
        let d = &planned.diff;
        let differences = saved::mismatch(saved, d, &crate::diff::json::plan_json(d));
        if !differences.is_empty() {
            return Err(Error::SavedMismatch {
                saved: path.to_path_buf(),
                differences,
                help: format!("{}. A rotation that became due since the plan was made also changes the plan; a file edited by hand is never run", remedy.remake_help()),
            });
        }
        Ok(planned)
    }
}
