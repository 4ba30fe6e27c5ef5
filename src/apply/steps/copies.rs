//! `find copies`: before a key version is retired, the keyslots of a device that no record
//! names are tested with it, so a copy of a rotated-out key (a keyslot rewritten or added by
//! hand with the KMS's passphrase) does not go on opening the device unnoticed once the KMS
//! destroys the version (`world::copies`).

use std::collections::BTreeMap;

use super::{Exec, StepError, StepOutcome};
use crate::graph::VersionRef;
use crate::world::copies::{self, RetiredCopy};

impl Exec<'_> {
    /// Tests `version` of `key` against every keyslot of `device` that is bound and named by
    /// no valid record now (one PBKDF run each, named keyslot): the `planned` ones, and any
    /// made since planning (a run interrupted before this step may resume after an operator
    /// added one; found by the deterministic simulation). Records what opens in the state
    /// directory's copies record, which `status` and `plan` report, and says so in the
    /// outcome. Changes no keyslot (under `unmanaged_keyslots: keep` they are not keyplan's to
    /// kill). Idempotent: run again, it tests again and records the same.
    pub(super) fn find_copies(
        &self,
        device: &str,
        key: &str,
        version: u64,
        planned: &[u32],
    ) -> Result<StepOutcome, StepError> {
        let path = self.device_path(device)?;
        let (v, material) = match self.material(key, VersionRef::Version(version)) {
            Ok(m) => m,
            // Retired already (a resumed retire whose destroy happened before the crash, or
            // another run's): there is nothing to test with any more.
            Err(StepError::Kms(crate::kms::KmsError::NoSuchVersion { .. })) => {
                return StepOutcome::done(format!(
                    "{key} v{version} is retired already: nothing to test with"
                ))
            }
            Err(e) => return Err(e),
        };
        let header = self.header(&path)?;
        let recs = self.world.records.read(&header)?;
        let managed = |slot: u32| {
            recs.iter()
                .any(|r| r.slot == slot && r.status == crate::world::RecordStatus::Valid)
        };
        let slots: Vec<u32> = header
            .keyslots
            .iter()
            .filter(|(n, k)| k.bound && !managed(**n))
            .map(|(n, _)| *n)
            .collect();
        if slots.iter().any(|s| !planned.contains(s)) {
            tracing::info!(
                device,
                key,
                "testing keyslots made since planning for copies too"
            );
        }
        let mut found = Vec::new();
        let mut tested = Vec::new();
        for &slot in &slots {
            let Some(ks) = header.keyslots.get(&slot) else {
                continue;
            };
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
