//! `adopt keyslot`: record an unrecorded keyslot as holding the key version that opened it
//! when planning. No PBKDF run: the keyslot must still have the KDF salt it had when it was
//! tested (a rewritten keyslot gets a new salt), so it still opens with that version.

use super::{Exec, StepError, StepOutcome};
use crate::world::SlotRecord;

impl Exec<'_> {
    /// Records `slot` of `device` as holding `key` v`version` after checking, on the header read
    /// now, that it is still bound, unchanged (`salt`) and named by no other record.
    /// Idempotent: a keyslot recorded so already is left as it is.
    pub(super) fn adopt(
        &self,
        device: &str,
        slot: u32,
        key: &str,
        version: u64,
        salt: &str,
    ) -> Result<StepOutcome, StepError> {
        let path = self.device_path(device)?;
        let header = self.header(&path)?;
        let recs = self.world.records.read(&header)?;
        if recs.iter().any(|r| r.holds(slot, key, version)) {
            return StepOutcome::done(format!("keyslot {slot} already records {key} v{version}"));
        }
        let unchanged = header
            .keyslots
            .get(&slot)
            .is_some_and(|k| k.bound && k.salt == salt);
        if !unchanged || recs.iter().any(|r| r.slot == slot) {
            return Err(StepError::Drift(format!(
                "keyslot {slot} of device {device}, which {key} v{version} opened when planning, is gone, was rewritten or is recorded otherwise since; nothing was changed. Run `keyplan plan` again"
            )));
        }
        let record = SlotRecord {
            key: key.to_string(),
            version,
            salt: salt.to_string(),
            entry: self.entry(key),
            pbkdf: None,
        };
        self.world.records.write(&path, &header, slot, &record)?;
        StepOutcome::done(format!("adopted keyslot {slot} ({key} v{version})"))
    }
}
