//! `add keyslot`: add a key version into a keyslot chosen at plan time, unlocking through a
//! recorded keyslot (or the `enroll_with` passphrase), then record it.
//!
//! Both passphrases travel through pipes (luks::run). A keyslot found occupied is adopted only
//! if this very step was under way when an interrupted process died and the version opens it;
//! a keyslot added but not recorded (the record could not be written) is removed again, so no
//! orphan keyslot nobody can attribute is left.

use std::path::Path;

use super::{failpoint, Exec, StepError, StepOutcome};
use crate::graph::{Unlock, VersionRef};
use crate::luks::{Header, LuksError, Priority};
use crate::secret::Passphrase;
use crate::world::{RecordStatus, SlotRecord};

/// True for the cryptsetup failures of an unlocking passphrase that opens nothing (cryptsetup
/// exit codes 1 and 2).
fn no_unlock(r: &Result<(), LuksError>) -> bool {
    matches!(r, Err(LuksError::Failed { code: 1 | 2, .. }))
}

impl Exec<'_> {
    /// Adds `version` of `key` into `slot` of `device`, unlocking with `unlock`, and records
    /// it. Idempotent: a keyslot already recorded with this version is left as it is.
    pub(super) fn add(
        &self,
        idx: usize,
        device: &str,
        key: &str,
        version: VersionRef,
        slot: u32,
        unlock: &Unlock,
    ) -> Result<StepOutcome, StepError> {
        let path = self.device_path(device)?;
        let (v, material) = self.material(key, version)?;
        let header = self.header(&path)?;
        if header.keyslots.contains_key(&slot) {
            return self.occupied(idx, device, key, v, slot, &path, &header, &material);
        }
        let (unlock_slot, unlock_pass) = self.unlocking(device, unlock, &header)?;
        // The unlocking keyslot's PBKDF (or, for enroll_with, whose named keyslot may fall back
        // to trying every one, the costliest bound keyslot cryptsetup may try) and the new
        // keyslot's, one after the other.
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
        let added = self.luks_add(
            device,
            &path,
            &header,
            unlock,
            unlock_slot,
            &unlock_pass,
            slot,
            &material,
        );
        if let Err(e) = added {
            if self.added_anyway(slot, &path, &material) {
                // cryptsetup wrote the keyslot and still failed (or its reply was lost): the
                // keyslot is this step's, so it is recorded rather than left as an orphan
                // that keeps a non-current version (found by the deterministic simulation).
                tracing::warn!(device = %device, slot, error = %e, "luksAddKey failed, but the new keyslot is there and opens with the version; recording it");
                self.record_new(device, key, v, slot, &path)?;
                return StepOutcome::done(format!(
                    "added keyslot {slot} ({key} v{v}; cryptsetup reported a failure after writing it)"
                ));
            }
            return Err(self.add_failed(device, unlock, e));
        }
        failpoint("add.after_keyslot")?;
        self.record_new(device, key, v, slot, &path)?;
        StepOutcome::done(format!("added keyslot {slot} ({key} v{v})"))
    }

    /// After a failed `luksAddKey`: whether keyslot `slot` (free when the step began) is
    /// occupied now and opens with `material` (one PBKDF run, only on this error path). A
    /// header that cannot be read, or a test that fails, counts as no.
    fn added_anyway(&self, slot: u32, path: &Path, material: &Passphrase) -> bool {
        let Ok(header) = self.header(path) else {
            return false;
        };
        header.keyslots.contains_key(&slot)
            && self
                .world
                .luks
                .test_passphrase(path, slot, material)
                .unwrap_or(false)
    }

    /// The target keyslot is occupied: done already (recorded with this version), adopted (this
    /// step was under way in the interrupted process and the version opens it), or drift.
    #[allow(clippy::too_many_arguments)]
    fn occupied(
        &self,
        idx: usize,
        device: &str,
        key: &str,
        v: u64,
        slot: u32,
        path: &Path,
        header: &Header,
        material: &Passphrase,
    ) -> Result<StepOutcome, StepError> {
        let recs = self.world.records.read(header)?;
        if recs.iter().any(|r| r.holds(slot, key, v)) {
            return StepOutcome::done(format!("keyslot {slot} already holds {key} v{v}"));
        }
        let unrecorded = !recs
            .iter()
            .any(|r| r.slot == slot && r.status == RecordStatus::Valid);
        if self.resumed.get(idx).copied().unwrap_or(false) && unrecorded && {
            let _mem = self.memory_for(header, &[slot], None);
            self.world.luks.test_passphrase(path, slot, material)?
        } {
            let salt = header
                .keyslots
                .get(&slot)
                .map(|k| k.salt.clone())
                .unwrap_or_default();
            // Added by an interrupted run, perhaps under other settings: no PBKDF id, so
            // its PBKDF is judged by what its header says alone.
            let record = SlotRecord {
                key: key.to_string(),
                version: v,
                salt,
                entry: self.entry(key),
                pbkdf: None,
            };
            self.world.records.write(path, header, slot, &record)?;
            return StepOutcome::done(format!(
                "adopted keyslot {slot} (added by the interrupted run, opens with {key} v{v})"
            ));
        }
        Err(StepError::Drift(format!(
            "keyslot {slot} of device {device} became occupied after planning (drift); nothing was changed. Run `keyplan plan` again"
        )))
    }

    /// The unlocking keyslot (when known) and passphrase of `unlock`: a recorded key version
    /// (its keyslot must still exist), or the `enroll_with` file's bytes with the keyslot they
    /// opened when observing, if known.
    fn unlocking(
        &self,
        device: &str,
        unlock: &Unlock,
        header: &Header,
    ) -> Result<(Option<u32>, Passphrase), StepError> {
        match unlock {
            Unlock::Key {
                key: k2,
                version: v2,
                slot: s2,
            } => {
                if !header.keyslots.contains_key(s2) {
                    return Err(StepError::Drift(format!(
                        "keyslot {s2} of device {device}, which should open it with {k2}, is gone (drift); nothing was changed. Run `keyplan plan` again"
                    )));
                }
                let (_, p) = self.material(k2, *v2)?;
                Ok((Some(*s2), p))
            }
            Unlock::EnrollWith => {
                let file = self
                    .plan
                    .devices
                    .get(device)
                    .and_then(|d| d.enroll_with.clone())
                    .ok_or_else(|| {
                        StepError::Plan(format!("device {device} has no enroll_with file"))
                    })?;
                let bytes = std::fs::read(&file).map_err(|e| {
                    StepError::Plan(format!(
                        "cannot read enroll_with file {}: {e}",
                        file.display()
                    ))
                })?;
                if bytes.is_empty() {
                    return Err(StepError::Plan(format!(
                        "enroll_with file {} is empty; it must hold a passphrase that opens device {device}",
                        file.display()
                    )));
                }
                Ok((
                    self.enroll_with_keyslots.get(device).copied(),
                    Passphrase::new(bytes),
                ))
            }
        }
    }

    /// `luksAddKey` of `material` into `slot`, unlocking through `unlock_slot` (or any keyslot).
    /// For `enroll_with`: when the keyslot named at plan time no longer opens, every keyslot is
    /// tried; then the bound keyslots with priority `ignore`, which cryptsetup skips unless
    /// named with `--key-slot` (cryptsetup-config(8)).
    #[allow(clippy::too_many_arguments)]
    fn luks_add(
        &self,
        device: &str,
        path: &Path,
        header: &Header,
        unlock: &Unlock,
        unlock_slot: Option<u32>,
        unlock_pass: &Passphrase,
        slot: u32,
        material: &Passphrase,
    ) -> Result<(), LuksError> {
        let add = |through: Option<u32>| {
            self.world.luks.add_keyslot(
                path,
                header.into(),
                through,
                unlock_pass,
                slot,
                material,
                self.plan.pbkdf.as_ref(),
            )
        };
        let mut added = add(unlock_slot);
        let enroll_with = matches!(unlock, Unlock::EnrollWith);
        if enroll_with && unlock_slot.is_some() && no_unlock(&added) {
            tracing::info!(
                device = %device,
                "the enroll_with passphrase no longer opens keyslot {}; trying every keyslot",
                unlock_slot.unwrap_or_default()
            );
            added = add(None);
        }
        if enroll_with && no_unlock(&added) {
            for (s, _) in header
                .keyslots
                .iter()
                .filter(|(_, k)| k.priority == Priority::Ignore && k.bound)
            {
                added = add(Some(*s));
                if added.is_ok() {
                    break;
                }
            }
        }
        added
    }

    /// The error of a failed `luksAddKey`, saying the device was left as it was.
    fn add_failed(&self, device: &str, unlock: &Unlock, e: LuksError) -> StepError {
        if matches!(e, LuksError::Failed { code: 1 | 2, .. }) && *unlock == Unlock::EnrollWith {
            let file = self
                .plan
                .devices
                .get(device)
                .and_then(|d| d.enroll_with.as_ref())
                .map(|f| f.display().to_string())
                .unwrap_or_default();
            return StepError::Refused(format!(
                "the enroll_with passphrase in {file} opens no keyslot of device {device} (keyplan uses the file's bytes exactly: a trailing newline counts); nothing was changed on the device ({e})"
            ));
        }
        if let (LuksError::Failed { code: 2, .. }, Unlock::Key { key, slot, .. }) = (&e, unlock) {
            // The record says keyslot `slot` holds this version, and the version does not
            // open it: silent damage (or a keyslot rewritten behind keyplan's back). Planning
            // trusts records; `--verify` tests them and repairs the ones that fail.
            return StepError::LuksLeft {
                source: e,
                context: format!(
                    "; nothing was changed on the device. keyplan's record says keyslot {slot} of device {device} holds {key}, but that version does not open it: run `keyplan apply --verify` to test every record and re-enroll the keyslots that fail"
                ),
            };
        }
        StepError::LuksLeft {
            source: e,
            context: "; nothing was changed on the device".to_string(),
        }
    }

    /// Records the keyslot just added. When the record cannot be written the keyslot is
    /// removed again (an unrecorded keyslot would be an orphan nobody can attribute; it holds a
    /// version that is not current yet, and the unlocking keyslot remains, so removing it
    /// cannot lock anyone out).
    fn record_new(
        &self,
        device: &str,
        key: &str,
        v: u64,
        slot: u32,
        path: &Path,
    ) -> Result<(), StepError> {
        let header = match self.header(path) {
            Ok(h) => h,
            // The keyslot was added but cannot be recorded (the kill reads the header itself).
            Err(e) => return Err(self.unrecordable(&e.to_string(), device, key, v, slot, path)),
        };
        let salt = header
            .keyslots
            .get(&slot)
            .map(|k| k.salt.clone())
            .ok_or_else(|| {
                StepError::Drift(format!(
                    "keyslot {slot} of {device} is empty after luksAddKey"
                ))
            })?;
        let record = SlotRecord {
            key: key.to_string(),
            version: v,
            salt,
            entry: self.entry(key),
            pbkdf: self.plan.pbkdf.as_ref().map(crate::luks::pbkdf_id),
        };
        let Err(e) = self.world.records.write(path, &header, slot, &record) else {
            return Ok(());
        };
        Err(self.unrecordable(&e.to_string(), device, key, v, slot, path))
    }

    /// Removes keyslot `slot`, added but not recordable because of `why`, so no orphan
    /// holding a version that is not current yet stays; the error says whether it went.
    fn unrecordable(
        &self,
        why: &str,
        device: &str,
        key: &str,
        v: u64,
        slot: u32,
        path: &Path,
    ) -> StepError {
        StepError::Refused(match self.world.luks.kill_keyslot(path, slot) {
            Ok(()) => format!(
                "{why}; the new keyslot {slot} was removed again, so device {device} is as before"
            ),
            Err(k) => format!(
                "{why}; removing the unrecorded keyslot {slot} also failed ({k}): it holds {key} v{v}, not yet current; kill it by hand (cryptsetup luksKillSlot {} {slot})",
                path.display()
            ),
        })
    }
}
