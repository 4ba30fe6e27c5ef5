//! The engine API: what a front end (the CLI, the coming node agent) calls to plan, apply,
//! check and report. Front ends parse their input, ask for confirmation, call these, and render
//! what comes back; they never touch the doors ([`crate::luks`], [`crate::kms`]), the journal
//! or the state lock themselves.
//!
//! | operation | function | writes |
//! |---|---|---|
//! | plan | [`plan::plan`] | nothing (I6) |
//! | apply | [`apply::ApplySession`]: lock, journal, interrupted run, rounds | devices, KMS, journal |
//! | apply a saved plan | [`apply::ApplySession::plan_saved`] then `run` | as apply |
//! | save / show a saved plan | [`saved::save`], [`saved::freshness`] | the saved plan file |
//! | status | [`status::status`] → [`status::StatusReport`] | nothing |
//! | credentials of the KMS clients | [`credentials::review`] | nothing |
//! | verify | [`verify::verify`] | nothing |
//! | key get | [`key::source`], [`key::resolve_version`], [`key::material`] | nothing |
//! | journal | [`journal::read`] | nothing |
//! | device forget | [`device::forget`] | the state directory's device registry |
//!
//! Every operation starts from an [`Engine`]: a loaded plan with its doors opened.

pub mod apply;
pub mod credentials;
pub mod device;
pub mod journal;
pub mod key;
pub mod plan;
pub mod saved;
pub mod status;
pub mod verify;

use crate::error::Error;
use crate::spec::Plan;
use crate::world::World;

/// A loaded plan with the doors to the world opened (cryptsetup found, one client per KMS
/// instance; nothing contacted yet).
#[derive(Debug)]
pub struct Engine {
    plan: Plan,
    world: World,
}

impl Engine {
    /// Opens the doors `plan` needs.
    ///
    /// Errors: [`Error::Owner`]: the state directory belongs to another plan (invariant I5,
    /// [`crate::world::owner::check`]); [`Error::Findings`]: the state directory is not a
    /// directory, or a KMS instance cannot be opened (see [`World::open`]).
    pub fn open(plan: Plan) -> Result<Engine, Error> {
        let world = World::open(&plan)?;
        crate::world::owner::check(&plan)?;
        Ok(Engine { plan, world })
    }

    /// An engine over doors the caller opened ([`World::with_doors`]): the deterministic
    /// simulation's in-memory LUKS and KMS doors (tests/sim). The plan is used as given.
    pub fn with_world(plan: Plan, world: World) -> Engine {
        Engine { plan, world }
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The doors (for the engine's own modules and tests).
    pub(crate) fn world(&self) -> &World {
        &self.world
    }

    /// PBKDF runs (key derivations) this engine's cryptsetup calls have caused so far.
    pub fn pbkdf_runs(&self) -> u64 {
        self.world.luks.pbkdf_runs()
    }
}

/// Checks that every `--rotate KEY` names a key of `plan`.
///
/// Errors: [`Error::Request`] naming the first unknown key and listing the plan's keys.
pub fn check_rotate_keys(plan: &Plan, rotate: &[String]) -> Result<(), Error> {
    match rotate.iter().find(|k| !plan.keys.contains_key(*k)) {
        None => Ok(()),
        Some(k) => Err(Error::request(
            format!("--rotate {k}: no such key in the plan"),
            Some(format!(
                "keys in {}: {}",
                plan.source_path.display(),
                plan.keys.keys().cloned().collect::<Vec<_>>().join(", ")
            )),
        )),
    }
}
