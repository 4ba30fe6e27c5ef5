//! Which old versions a rotation destroys in the KMS (docs/architecture.md, "Retention:
//! previous version kept, known devices consulted").
//!
//! The version superseded now stays as `previous` (a device that was offline, or left the
//! plan, can still be opened with it). Older versions are destroyed once no device keyplan
//! knows holds them: plan devices that do not list this key (their keyslots are removed by
//! `removals`, but only after this run's retire would be too late to matter) and former devices
//! that left the plan but are still present. While a former device cannot be read, nothing is
//! destroyed. A plan that does not rotate the key destroys what is left of that: versions
//! below the newest previous one that no device holds (a retire that failed, or a device that
//! has let go of the version since).

use std::collections::BTreeMap;

use super::Planner;
use crate::graph::Step;
use crate::kms::{KeyState, VersionState};
use crate::world::RecordStatus;

impl Planner<'_> {
    /// Plans the retire steps of `key` (state `st`) rotated on `devices` and notes the versions
    /// kept and why. Returns the versions destroyed.
    pub(super) fn retention(&mut self, key: &str, st: &KeyState, devices: &[String]) -> Vec<u64> {
        let held = self.held_elsewhere(key, devices);
        let old: Vec<u64> = st
            .versions
            .values()
            .filter(|v| v.state == VersionState::Previous)
            .map(|v| v.version)
            .collect();
        let mut retired = Vec::new();
        let unknown = self.obs.unknown_holders();
        if !unknown.is_empty() && !old.is_empty() {
            self.note_unknown_holders(key, &old);
        }
        for v in old.into_iter().filter(|_| unknown.is_empty()) {
            if let Some(where_) = held.get(&v) {
                let former = self
                    .obs
                    .former
                    .keys()
                    .any(|f| where_.iter().any(|w| w.starts_with(f.as_str())));
                self.notes.push(format!(
                    "{key} v{v} is kept in the KMS: {} still hold{} it{}",
                    where_.join(", "),
                    if where_.len() == 1 { "s" } else { "" },
                    if former {
                        " (a device no longer in the plan; keyplan does not touch it)"
                    } else {
                        ""
                    }
                ));
                continue;
            }
            self.g.add(Step::Retire {
                key: key.to_string(),
                version: v,
            });
            self.find_copies(key, v, devices);
            retired.push(v);
        }
        if let Some(c) = st.current {
            if let Some(where_) = held.get(&c) {
                self.notes.push(format!(
                    "{key} v{c} stays in the KMS as the previous version; {} still hold{} it",
                    where_.join(", "),
                    if where_.len() == 1 { "s" } else { "" }
                ));
            }
        }
        retired
    }

    /// Retires the versions of `key` (state `st`, not rotated in this plan) left `previous`
    /// below the newest previous one that no device keyplan knows holds: what a rotation's
    /// retire would have destroyed had it not failed (the KMS unreachable then; a killed run
    /// is resumed from its journal instead). Only when nothing else may hold them: no device
    /// keyplan knows that cannot be read, no peer node or other plan holding the key, no
    /// pending version. Each is noted.
    pub(super) fn leftover_previous(&mut self, key: &str, st: &KeyState) {
        if st.pending.is_some()
            || !self.obs.unknown_holders().is_empty()
            || self.plan.peers.get(key).is_some_and(|p| !p.is_empty())
            || st.holders.keys().any(|h| *h != self.me)
        {
            return;
        }
        let previous = st.retained_previous();
        let Some(&newest) = previous.iter().max() else {
            return;
        };
        // Held: by a valid record of the key's entry whose keyslot this run does not kill
        // (a kill of a version's keyslot runs before its retire: `retire_last`).
        let spec = self.plan.keys.get(key);
        let mut held = std::collections::BTreeSet::new();
        for (id, d) in self.obs.devices.iter().chain(self.obs.former.iter()) {
            let kills = self.devs.get(id).map(|x| &x.kills);
            for r in d.records.iter().filter(|r| r.status == RecordStatus::Valid) {
                if spec.is_some_and(|k| r.record.is_of(k))
                    && !kills.is_some_and(|k| k.contains_key(&r.slot))
                {
                    held.insert(r.record.version);
                }
            }
        }
        let devices = self.devices_of(key);
        for v in previous {
            if v == newest || held.contains(&v) {
                continue;
            }
            self.g.add(Step::Retire {
                key: key.to_string(),
                version: v,
            });
            self.find_copies(key, v, &devices);
            self.notes.push(format!(
                "{key} v{v} will be destroyed in the KMS: it is older than the previous version v{newest} and no device holds it (the retire of an earlier rotation did not finish)"
            ));
        }
    }

    /// Before `version` of `key` is retired (here, or by another node's commit this node votes
    /// for): a `find copies` step per device of `devices`
    /// that keeps unmanaged keyslots (`unmanaged_keyslots: keep`; under `remove` this run kills
    /// them all), testing its bound keyslots no record names and this run does not kill, and
    /// the cost listed on the key's change (one PBKDF run per keyslot, `KeyChange::copy_checks`).
    pub(super) fn find_copies(&mut self, key: &str, version: u64, devices: &[String]) {
        for device in devices {
            if self.removes_unmanaged(device) {
                continue;
            }
            let Some(st) = self.state(device) else {
                continue;
            };
            let killed = self
                .devs
                .get(device)
                .map(|d| d.kills.clone())
                .unwrap_or_default();
            let slots: Vec<u32> = st
                .header
                .keyslots
                .iter()
                .filter(|(n, k)| k.bound && st.record(**n).is_none() && !killed.contains_key(n))
                .map(|(n, _)| *n)
                .collect();
            if slots.is_empty() {
                continue;
            }
            if let Some(k) = self.keys.iter_mut().rev().find(|k| k.key == key) {
                k.copy_checks
                    .extend(slots.iter().map(|s| crate::diff::CopyCheck {
                        device: device.clone(),
                        slot: *s,
                        version,
                    }));
            }
            self.g.add(Step::FindCopies {
                device: device.clone(),
                key: key.to_string(),
                version,
                slots,
            });
        }
    }

    /// Versions of `key`'s KMS entry that keyslots outside this rotation hold, with where:
    /// every valid record of the same entry (another device, or an older key id naming the
    /// same entry, or a former device), except the keyslots of this key on the `devices` it is
    /// rotated on (those are replaced in this run).
    fn held_elsewhere(&self, key: &str, devices: &[String]) -> BTreeMap<u64, Vec<String>> {
        let mut held: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        let spec = self.plan.keys.get(key);
        for (id, d) in self.obs.devices.iter().chain(self.obs.former.iter()) {
            for r in d.records.iter().filter(|r| r.status == RecordStatus::Valid) {
                let same_entry = spec.is_some_and(|k| r.record.is_of(k));
                if !same_entry || (devices.contains(id) && r.record.key == key) {
                    continue;
                }
                held.entry(r.record.version)
                    .or_default()
                    .push(format!("{id} keyslot {}", r.slot));
            }
        }
        held
    }

    /// Notes that versions `old` of `key` are kept because devices keyplan knows cannot be
    /// read ([`crate::observe::Observed::unknown_holders`]).
    fn note_unknown_holders(&mut self, key: &str, old: &[u64]) {
        let list: Vec<String> = self
            .obs
            .unknown_holders()
            .iter()
            .map(|(id, path, why)| format!("{id} ({}: {why})", path.display()))
            .collect();
        self.notes.push(format!(
            "{key} v{} {} kept in the KMS: device(s) keyplan knows cannot be read now, so nobody knows which versions they hold: {}. Once such a device is gone for good, take it out of the plan file if it is listed there, and run `keyplan device forget ID`",
            old.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", v"),
            if old.len() == 1 { "is" } else { "are" },
            list.join("; "),
        ));
    }
}
