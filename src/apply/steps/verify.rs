//! `verify`: a key version opens a keyslot, and the keyslot is bound to the data segment.

use super::{Exec, StepError, StepOutcome};
use crate::graph::VersionRef;

impl Exec<'_> {
    /// Tests `version` of `key` against `slot` of `device` (one PBKDF run, named keyslot) and
    /// checks that the keyslot is bound (an unbound keyslot opens nothing). Remembers the
    /// keyslot's salt as verified for the kills anchored on this step, and journals it, so a
    /// resumed run keeps the guarantee.
    pub(super) fn verify(
        &self,
        idx: usize,
        device: &str,
        key: &str,
        version: VersionRef,
        slot: u32,
    ) -> Result<StepOutcome, StepError> {
        let path = self.device_path(device)?;
        let (v, material) = self.material(key, version)?;
        let header = self.header(&path)?;
        let ks = header.keyslots.get(&slot).ok_or_else(|| {
            StepError::Drift(format!(
                "keyslot {slot} of device {device} is empty; expected {key} v{v}"
            ))
        })?;
        if !ks.bound {
            return Err(StepError::Refused(format!(
                "keyslot {slot} of device {device} is not bound to the data segment: it would open nothing"
            )));
        }
        let mem = self.memory_for(&header, &[slot], None);
        let opens = self.world.luks.test_passphrase(&path, slot, &material)?;
        drop(mem);
        if !opens {
            return Err(StepError::Refused(format!(
                "{key} v{v} does not open keyslot {slot} of device {device}; the steps that rely on it (commit, kills) were not run. `keyplan apply --verify` re-checks every keyslot and repairs the records"
            )));
        }
        let salt = ks.salt.clone();
        Self::lock(&self.verified)?.insert(idx, (device.to_string(), slot, salt.clone()));
        Ok(StepOutcome {
            outcome: format!("{key} v{v} opens keyslot {slot}"),
            staged_version: None,
            verified_salt: Some(salt),
        })
    }
}
