//! A key renamed in the plan: its id changed while its KMS instance and `name` stayed, so the
//! keyslots recorded under the old id hold versions of the same KMS key. Observation takes
//! those records as the new id's (keeping the old id in [`RecordObs::renamed_from`]), so
//! nothing downstream tests an adoption, asks for `enroll_with` or plans a new keyslot for
//! them, and the planner rewrites the records (`diff::decide::rename`).

use std::collections::BTreeMap;

use super::DeviceState;
use crate::spec::Plan;
use crate::world::{RecordObs, RecordStatus};

/// Renames, in place, every valid record on a plan device whose KMS entry (instance and name)
/// is that of another plan key the device lists than the one its key id now names: its id
/// left the plan, or names another entry now (the old id reused for a new key; ids swapped).
/// The entry decides, not the id: the keyslot holds a version of that KMS key. A record
/// without an entry (written before records named one) is left as it is.
pub(super) fn apply(plan: &Plan, devices: &mut BTreeMap<String, DeviceState>) {
    for (id, st) in devices.iter_mut() {
        let Some(dev) = plan.devices.get(id) else {
            continue;
        };
        for r in st.records.iter_mut() {
            if let Some(to) = new_id(plan, &dev.keys, r) {
                r.renamed_from = Some(std::mem::replace(&mut r.record.key, to));
            }
        }
    }
}

/// The plan key (among `listed`) that record `r` belongs to under a new id, if it was renamed.
fn new_id(plan: &Plan, listed: &[crate::spec::DeviceKey], r: &RecordObs) -> Option<String> {
    if r.status != RecordStatus::Valid {
        return None;
    }
    let (kms, name) = r.record.entry.as_ref()?;
    let is_entry = |id: &str| {
        plan.keys
            .get(id)
            .is_some_and(|pk| (&pk.kms, &pk.name) == (kms, name))
    };
    if is_entry(&r.record.key) {
        return None;
    }
    listed.iter().map(|k| &k.key).find(|k| is_entry(k)).cloned()
}
