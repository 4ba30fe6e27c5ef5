//! A key renamed in the plan (observation found its records: `observe::rename`): the records
//! are rewritten to the new id. No PBKDF run, no new keyslot, and no release of the old id's
//! holder record, which is the record of the same KMS entry that the key keeps needing.

use super::Planner;
use crate::diff::{ReasonCode, SlotAction};
use crate::graph::{Step, VersionRef};

impl Planner<'_> {
    /// A re-record step and a `~` change for every record observation found renamed.
    pub(super) fn renames(&mut self) {
        let obs = self.obs;
        for (device, st) in &obs.devices {
            for r in &st.records {
                let Some(from) = &r.renamed_from else {
                    continue;
                };
                let to = &r.record.key;
                let Some(key) = self.plan.keys.get(to) else {
                    continue;
                };
                let (kms, name) = (key.kms.clone(), key.name.clone());
                self.g.add(Step::Rerecord {
                    device: device.clone(),
                    key: to.clone(),
                    slot: r.slot,
                    version: VersionRef::Version(r.record.version),
                    to_kms: kms.clone(),
                    to_name: name.clone(),
                });
                self.change(
                    device,
                    r.slot,
                    SlotAction::Drift,
                    Some(to),
                    Some(r.record.version),
                    (
                        ReasonCode::KeyRenamed,
                        format!(
                            "renamed: key {from} is {to} in the plan now (the same key {name:?} in KMS {kms}); the record is rewritten, no PBKDF"
                        ),
                    ),
                );
            }
        }
    }
}
