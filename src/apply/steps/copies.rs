//! `find copies`: before a key version is retired, the keyslots of a device that no record
//! names are tested with it, so a copy of a rotated-out key (a keyslot rewritten or added by
//! hand with the KMS's passphrase) does not go on opening the device unnoticed once the KMS
//! destroys the version (`world::copies`).

use std::collections::BTreeMap;

use super::{Exec, StepError, StepOutcome};
use crate::graph::VersionRef;
use crate::world::copies::{self, RetiredCopy};

impl Exec<'_> {
    /// Tests `version` of `key` against each of `slots` of `device` that is still bound and
    /// named by no record (one PBKDF run each, named keyslot); records what opens in the state
    /// directory's copies record, which `status` and `plan` report, and says so in the outcome.
    /// Changes no keyslot (under `unmanaged_keyslots: keep` they are not keyplan's to kill).
    /// Idempotent: run again, it tests again and records the same.
    pub(super) fn find_copies(
        &self,
        device: &str,
        key: &str,
        version: u64,
        slots: &[u32],
    ) -> Result<StepOutcome, StepError> {
        let path = self.device_path(device)?;
        let (v, material) = self.material(key, VersionRef::Version(version))?;
        let header = self.header(&path)?;
        let recs = self.world.records.read(&header)?;
        let mut found = Vec::new();
        let mut tested = Vec::new();
        for &slot in slots {
            let Some(ks) = header.keyslots.get(&slot).filter(|k| k.bound) else {
                continue;
            };
            if recs.iter().any(|r| r.slot == slot) {
                continue;
            }
            let mem = self.memory_for(&header, &[slot], None);
            let opens = self.world.luks.test_passphrase(&path, slot, &material)?;
            drop(mem);
            tested.push(slot.to_string());
            if opens {
                found.push(RetiredCopy {
                    uuid: header.uuid.to_lowercase(),
                    device: device.to_string(),
                    slot,
                    salt: ks.salt.clone(),
                    key: key.to_string(),
                    version: v,
                    found_at: crate::clock::now_unix(),
                });
            }
        }
        let still: BTreeMap<u32, String> = header
            .keyslots
            .iter()
            .map(|(n, k)| (*n, k.salt.clone()))
            .collect();
        copies::record(&self.plan.state_dir, &header.uuid, &still, &found).map_err(|e| {
            StepError::Internal(format!(
                "{e}; no keyslot was changed. Run keyplan apply again"
            ))
        })?;
        if found.is_empty() {
            return StepOutcome::done(format!(
                "no copy of {key} v{v} in keyslot(s) {}",
                if tested.is_empty() {
                    "-".to_string()
                } else {
                    tested.join(", ")
                }
            ));
        }
        let slots: Vec<String> = found.iter().map(|c| c.slot.to_string()).collect();
        tracing::warn!(device, key, version = v, slots = %slots.join(", "), "keyslots keyplan did not make open with a version it retires");
        StepOutcome::done(format!(
            "keyslot {} opens with {key} v{v}, which this run retires: a copy keyplan did not make; it stays (unmanaged_keyslots: keep), and `keyplan status` reports it until it is removed",
            slots.join(", ")
        ))
    }
}
