//! `kill keyslot` and `forget record`: removing a keyslot once another one of the same device
//! was verified (its anchor), and dropping records that no longer describe their keyslot.

use super::{failpoint, Exec, StepError, StepOutcome};
use crate::graph::{SlotHolder, Step};
use crate::luks::Header;
use crate::world::RecordStatus;

impl Exec<'_> {
    /// Kills `slot` of `device` after checking, on the header read now, that it still holds
    /// `holder` and that the `anchor` keyslot this run verified is present, bound and has the
    /// verified salt (invariant I1; the driver also refuses the last bound keyslot). cryptsetup
    /// runs in batch mode with stdin closed: no PBKDF (one, to verify the anchor again, when
    /// only an interrupted process verified it). A keyslot already gone only loses its record.
    pub(super) fn kill(
        &self,
        device: &str,
        slot: u32,
        holder: &SlotHolder,
        anchor: usize,
    ) -> Result<StepOutcome, StepError> {
        let path = self.device_path(device)?;
        let header = self.header(&path)?;
        let Some(ks) = header.keyslots.get(&slot) else {
            self.world.records.remove(&path, &header, slot)?;
            return StepOutcome::done(format!("keyslot {slot} already empty"));
        };
        match holder {
            SlotHolder::Record { key, version } => {
                let v = self.resolve(key, *version)?;
                let recs = self.world.records.read(&header)?;
                if !recs.iter().any(|r| r.holds(slot, key, v)) {
                    return Err(StepError::Drift(format!(
                        "keyslot {slot} of device {device} no longer holds {key} v{v} (changed after planning); not killed"
                    )));
                }
            }
            SlotHolder::Unmanaged { salt } => {
                if ks.salt != *salt {
                    return Err(StepError::Drift(format!(
                        "keyslot {slot} of device {device} was rewritten after planning; not killed"
                    )));
                }
            }
        }
        let aslot = self.anchor_holds(device, slot, anchor, &header)?;
        self.world.luks.kill_keyslot(&path, slot)?;
        failpoint("kill.after_keyslot")?;
        // Killing a keyslot leaves token ids (and the LUKS1 UUID) as they were, so the header
        // read before the kill still finds the record: no second dump needed.
        self.world.records.remove(&path, &header, slot)?;
        StepOutcome::done(format!("killed keyslot {slot} (keyslot {aslot} verified)"))
    }

    /// The keyslot verify step `anchor` verified in this run, when it is another keyslot of
    /// `device` that is still present, bound and unchanged in `header`; refuses otherwise. An
    /// anchor only the interrupted process verified is verified again first.
    fn anchor_holds(
        &self,
        device: &str,
        slot: u32,
        anchor: usize,
        header: &Header,
    ) -> Result<u32, StepError> {
        let mut verified = Self::lock(&self.verified)?.get(&anchor).cloned();
        if verified.is_none() {
            // Verified by the interrupted process: the keyslot may have changed since (found
            // by the protocol model, tests/verification/protocol_model.rs), so this process verifies it
            // again (one PBKDF run) before relying on it.
            if let Some(Step::Verify {
                device: vdev,
                key,
                version,
                slot: vslot,
            }) = self.reverify.get(&anchor)
            {
                self.verify(anchor, vdev, key, *version, *vslot)?;
                verified = Self::lock(&self.verified)?.get(&anchor).cloned();
            }
        }
        let Some((adev, aslot, asalt)) = verified else {
            return Err(StepError::Refused(format!(
                "refusing to kill keyslot {slot} of device {device}: no other keyslot was verified in this run"
            )));
        };
        let anchor_ok = adev == device
            && aslot != slot
            && header
                .keyslots
                .get(&aslot)
                .is_some_and(|a| a.bound && a.salt == asalt);
        if !anchor_ok {
            return Err(StepError::Refused(format!(
                "refusing to kill keyslot {slot} of device {device}: keyslot {aslot}, verified to open it, is no longer as verified"
            )));
        }
        Ok(aslot)
    }

    /// Drops keyplan's record of `slot` of `device` (the keyslot was killed or rewritten
    /// outside keyplan, or `failed_verify`: `--verify` found its version does not open it). A
    /// record valid again by now is kept, unless `--verify` failed it.
    pub(super) fn forget(
        &self,
        device: &str,
        slot: u32,
        failed_verify: bool,
    ) -> Result<StepOutcome, StepError> {
        let path = self.device_path(device)?;
        let header = self.header(&path)?;
        let recs = self.world.records.read(&header)?;
        if !failed_verify
            && recs
                .iter()
                .any(|r| r.slot == slot && r.status == RecordStatus::Valid)
        {
            return StepOutcome::done(format!("record of keyslot {slot} is valid again; kept"));
        }
        self.world.records.remove(&path, &header, slot)?;
        StepOutcome::done(format!("dropped the record of keyslot {slot}"))
    }
}
