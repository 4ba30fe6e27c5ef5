//! Adoption: a keyslot keyplan did not create that a listed key's current KMS version opens,
//! or that an unfinished add of an earlier run left holding the version it was adding
//! (observing tested it, see `observe::adopt`), is recorded as holding that version. No new
//! keyslot, no key file; from then on it is managed like a keyslot keyplan added.

use std::borrow::Cow;

use super::Planner;
use crate::diff::{ReasonCode, SlotAction};
use crate::graph::Step;
use crate::observe::Observed;
use crate::world::{RecordObs, RecordStatus, SlotRecord};

/// `observed` with a valid record for every adoptable keyslot (as the adopt step will write
/// it), so every other decision treats the keyslot as recorded; unchanged (borrowed) when
/// nothing is adoptable.
pub(crate) fn with_adopted_records(observed: &Observed) -> Cow<'_, Observed> {
    if observed.devices.values().all(|d| d.adoptable.is_empty()) {
        return Cow::Borrowed(observed);
    }
    let mut out = observed.clone();
    for d in out.devices.values_mut() {
        let adopted: Vec<RecordObs> = d
            .adoptable
            .iter()
            .map(|a| RecordObs {
                slot: a.slot,
                record: SlotRecord {
                    key: a.key.clone(),
                    version: a.version,
                    salt: a.salt.clone(),
                    entry: None,
                    pbkdf: None,
                },
                token_id: None,
                status: RecordStatus::Valid,
                renamed_from: None,
            })
            .collect();
        d.records.extend(adopted);
    }
    Cow::Owned(out)
}

impl Planner<'_> {
    /// An adopt step and an `=` change for every adoptable keyslot of every device.
    pub(super) fn adopt(&mut self) {
        let obs = self.obs;
        for (id, d) in &obs.devices {
            for a in &d.adoptable {
                let k = obs.keys.get(&a.key);
                let reason = if a.resalted {
                    format!(
                        "re-record: rewritten outside keyplan with the same passphrase (a new salt or KDF, e.g. `cryptsetup luksConvertKey`); {} v{} still opens it, so it stays managed",
                        a.key, a.version
                    )
                } else if k.and_then(|k| k.current) == Some(a.version) {
                    "adopt: the KMS's current key opens it".to_string()
                } else {
                    let state = if k.and_then(|k| k.pending) == Some(a.version) {
                        "pending"
                    } else {
                        "previous"
                    };
                    format!(
                        "adopt: v{} ({state}), which an unfinished add of an earlier run was writing here, opens it",
                        a.version
                    )
                };
                self.g.add(Step::AdoptKeyslot {
                    device: id.clone(),
                    slot: a.slot,
                    key: a.key.clone(),
                    version: a.version,
                    salt: a.salt.clone(),
                });
                self.change(
                    id,
                    a.slot,
                    SlotAction::Adopt,
                    Some(&a.key),
                    Some(a.version),
                    (ReasonCode::Adopt, reason),
                );
            }
        }
    }
}
