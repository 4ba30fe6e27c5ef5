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
//! Every operation starts from an [`Engine`]: a loaded plan with its doors opened. The
//! operations that write, and `plan` (what `apply` would do), open it with [`Engine::open`],
//! which refuses a state directory another plan owns (invariant I5); the read-only ones with
//! [`Engine::open_read_only`], which reads on and says whose the directory is.

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
use crate::world::{OwnerError, World};

/// A loaded plan with the doors to the world opened (cryptsetup found, one client per KMS
/// instance; nothing contacted yet).
#[derive(Debug)]
pub struct Engine {
    plan: Plan,
    world: World,
    /// Why the state directory is not this plan's, for an engine of a read-only command that
    /// reads on anyway ([`Engine::open_read_only`]); `None` otherwise.
    foreign: Option<OwnerError>,
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
        Ok(Engine {
            plan,
            world,
            foreign: None,
        })
    }

    /// Opens the doors for a read-only command (`status`, `verify`, `journal`, `key get`, `key
    /// holders`): as [`Engine::open`], but a state directory that is not this plan's (another
    /// plan owns it, or its owner record cannot be read: [`crate::world::owner::check`]) is no
    /// refusal. The command reads on, writing nothing, and says whose the directory is
    /// ([`Engine::foreign_state_dir`]); `key get` needs nothing of it (the KMS alone), so an
    /// operator opening a disk by hand with an older copy of the plan, or a colleague's, is
    /// never turned away.
    ///
    /// Errors: [`Error::Findings`] as [`Engine::open`] (the state directory is not a
    /// directory, a KMS instance cannot be opened).
    pub fn open_read_only(plan: Plan) -> Result<Engine, Error> {
        let world = World::open(&plan)?;
        let foreign = crate::world::owner::check(&plan).err();
        Ok(Engine {
            plan,
            world,
            foreign,
        })
    }

    /// An engine over doors the caller opened ([`World::with_doors`]): the deterministic
    /// simulation's in-memory LUKS and KMS doors (tests/sim). The plan is used as given.
    pub fn with_world(plan: Plan, world: World) -> Engine {
        Engine {
            plan,
            world,
            foreign: None,
        }
    }

    /// For an engine of [`Engine::open_read_only`]: why the state directory is not this plan's
    /// (what the command reads there is another plan's), to be said with what the command
    /// shows ([`OwnerError::read_only_warning`]). `None`: it is this plan's, or nobody's yet.
    pub fn foreign_state_dir(&self) -> Option<&OwnerError> {
        self.foreign.as_ref()
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
