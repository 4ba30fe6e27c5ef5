//! [`LuksDoor`]: the LUKS operations the engine uses, as a trait, so the same planner,
//! executor and journal run against real cryptsetup ([`Cryptsetup`]) in production and
//! against an in-memory LUKS implementation in the deterministic simulation (tests/sim,
//! docs/verification.md). Safety guards that are keyplan's own, not cryptsetup's (never kill
//! the last bound keyslot), live here as provided methods, so every door has them.

use std::fmt;
use std::path::Path;

use super::{AddTarget, AnyKeyslot, Cryptsetup, Header, LuksError};
use crate::secret::Passphrase;
use crate::spec::PbkdfSettings;

/// Highest keyslot count of any LUKS version (LUKS2: 32).
const MAX_KEYSLOTS: u32 = 32;

/// The LUKS operations of the engine. Each method's contract is that of the [`Cryptsetup`]
/// method of the same name (cryptsetup 2.6 semantics, documented there with the exit codes
/// they come from); an implementation must give the same observable results, which the
/// differential test of the in-memory door checks against real images.
pub trait LuksDoor: Send + Sync + fmt::Debug {
    /// The header of `dev`, read without writing ([`Cryptsetup::dump`]). 0 PBKDF runs.
    ///
    /// Errors: as [`Cryptsetup::dump`].
    fn dump(&self, dev: &Path) -> Result<Header, LuksError>;

    /// Whether `pass` opens keyslot `slot` of `dev` (`Ok(false)`: wrong passphrase, or the
    /// keyslot is empty; an unbound keyslot with its passphrase gives `Ok(true)`). 1 PBKDF run.
    ///
    /// Errors: as [`Cryptsetup::test_passphrase`].
    fn test_passphrase(&self, dev: &Path, slot: u32, pass: &Passphrase) -> Result<bool, LuksError>;

    /// Which bound keyslot (not priority `ignore`) `pass` opens, tried without naming one.
    /// 1 PBKDF run (a lower bound).
    ///
    /// Errors: as [`Cryptsetup::test_any_keyslot`].
    fn test_any_keyslot(&self, dev: &Path, pass: &Passphrase) -> Result<AnyKeyslot, LuksError>;

    /// Adds `new` as a bound keyslot `new_slot`, unlocking the volume key with `unlock`
    /// (from `unlock_slot`, or any bound keyslot). 2 PBKDF runs (a lower bound).
    ///
    /// Errors: as [`Cryptsetup::add_keyslot`].
    #[allow(clippy::too_many_arguments)]
    fn add_keyslot(
        &self,
        dev: &Path,
        target: AddTarget,
        unlock_slot: Option<u32>,
        unlock: &Passphrase,
        new_slot: u32,
        new: &Passphrase,
        pbkdf: Option<&PbkdfSettings>,
    ) -> Result<(), LuksError>;

    /// `luksKillSlot --batch-mode` with stdin closed: removes keyslot `slot` **even when it is
    /// the last one** (cryptsetup 2.6.1 asks for no passphrase in this mode). The engine calls
    /// [`Self::kill_keyslot`], never this directly. 0 PBKDF runs.
    ///
    /// Errors: as [`Cryptsetup::kill_keyslot_unchecked`] (an empty keyslot fails).
    fn kill_keyslot_unchecked(&self, dev: &Path, slot: u32) -> Result<(), LuksError>;

    /// Removes keyslot `slot` after keyplan's own guard ([`check_kill`] on a fresh
    /// [`Self::dump`]): refuses an empty keyslot and the only bound keyslot. 0 PBKDF runs.
    ///
    /// Errors: [`LuksError::Refused`] (nothing changed) from the guard; errors of
    /// [`Self::dump`] and [`Self::kill_keyslot_unchecked`].
    fn kill_keyslot(&self, dev: &Path, slot: u32) -> Result<(), LuksError> {
        let header = self.dump(dev)?;
        check_kill(dev, slot, &header)?;
        self.kill_keyslot_unchecked(dev, slot)
    }

    /// Stores LUKS2 token `json` as `token_id` (replacing it) or the lowest free id; returns
    /// the id written. 0 PBKDF runs.
    ///
    /// Errors: as [`Cryptsetup::token_import`].
    fn token_import(
        &self,
        dev: &Path,
        token_id: Option<u32>,
        json: &serde_json::Value,
    ) -> Result<u32, LuksError>;

    /// Removes LUKS2 token `token_id`. 0 PBKDF runs.
    ///
    /// Errors: as [`Cryptsetup::token_remove`] (a token not in use fails).
    fn token_remove(&self, dev: &Path, token_id: u32) -> Result<(), LuksError>;

    /// PBKDF runs (a count) this door has caused so far.
    fn pbkdf_runs(&self) -> u64;

    /// How many header reads are worth running at once on this door (threads; at least 1):
    /// cryptsetup's are I/O bound, so the observer runs several; an in-memory door says 1, so
    /// a simulation sees its calls in one deterministic order.
    fn read_parallelism(&self) -> usize {
        usize::MAX
    }
}

/// keyplan's guard before any keyslot kill, on `header` (just read from `dev`): `slot` must
/// be in range, occupied, and not the only bound keyslot (removing that would make the data
/// unopenable: cryptsetup's batch mode would do it without asking).
///
/// Errors: [`LuksError::Refused`] saying which, with nothing changed.
pub fn check_kill(dev: &Path, slot: u32, header: &Header) -> Result<(), LuksError> {
    let operation = format!("luksKillSlot of keyslot {slot}");
    check_slot(&operation, dev, slot, MAX_KEYSLOTS)?;
    check_slot(&operation, dev, slot, header.version.max_keyslots())?;
    let Some(target) = header.keyslots.get(&slot) else {
        return Err(refused(
            &operation,
            dev,
            &format!("keyslot {slot} is empty (already removed?)"),
        ));
    };
    let other_bound = header.keyslots.iter().any(|(n, k)| *n != slot && k.bound);
    if target.bound && !other_bound {
        return Err(refused(
            &operation,
            dev,
            &format!(
                "keyslot {slot} is the only bound keyslot; removing it would make the data \
                 unopenable, so keyslot {slot} was left untouched"
            ),
        ));
    }
    Ok(())
}

impl LuksDoor for Cryptsetup {
    fn dump(&self, dev: &Path) -> Result<Header, LuksError> {
        Cryptsetup::dump(self, dev)
    }
    fn test_passphrase(&self, dev: &Path, slot: u32, pass: &Passphrase) -> Result<bool, LuksError> {
        Cryptsetup::test_passphrase(self, dev, slot, pass)
    }
    fn test_any_keyslot(&self, dev: &Path, pass: &Passphrase) -> Result<AnyKeyslot, LuksError> {
        Cryptsetup::test_any_keyslot(self, dev, pass)
    }
    fn add_keyslot(
        &self,
        dev: &Path,
        target: AddTarget,
        unlock_slot: Option<u32>,
        unlock: &Passphrase,
        new_slot: u32,
        new: &Passphrase,
        pbkdf: Option<&PbkdfSettings>,
    ) -> Result<(), LuksError> {
        Cryptsetup::add_keyslot(self, dev, target, unlock_slot, unlock, new_slot, new, pbkdf)
    }
    fn kill_keyslot_unchecked(&self, dev: &Path, slot: u32) -> Result<(), LuksError> {
        Cryptsetup::kill_keyslot_unchecked(self, dev, slot)
    }
    // `kill_keyslot` is the trait's provided method: the guard is the same code for every door.
    fn token_import(
        &self,
        dev: &Path,
        token_id: Option<u32>,
        json: &serde_json::Value,
    ) -> Result<u32, LuksError> {
        Cryptsetup::token_import(self, dev, token_id, json)
    }
    fn token_remove(&self, dev: &Path, token_id: u32) -> Result<(), LuksError> {
        Cryptsetup::token_remove(self, dev, token_id)
    }
    fn pbkdf_runs(&self) -> u64 {
        Cryptsetup::pbkdf_runs(self)
    }
}

/// Refuses keyslot numbers at or above `max`.
pub(super) fn check_slot(
    operation: &str,
    dev: &Path,
    slot: u32,
    max: u32,
) -> Result<(), LuksError> {
    if slot >= max {
        Err(refused(
            operation,
            dev,
            &format!(
                "keyslot {slot} is out of range (this device has keyslots 0-{})",
                max - 1
            ),
        ))
    } else {
        Ok(())
    }
}

pub(super) fn refused(operation: &str, dev: &Path, reason: &str) -> LuksError {
    LuksError::Refused {
        operation: operation.to_owned(),
        path: dev.to_owned(),
        reason: reason.to_owned(),
    }
}
