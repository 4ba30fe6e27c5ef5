//! Per device: records that drift made stale, keyslots to remove (keys no longer listed,
//! unmanaged keyslots under `remove`), and the anchor that makes a removal safe.

use std::collections::BTreeSet;

use super::Planner;
use crate::diff::{ReasonCode, SlotAction};
use crate::graph::{SlotHolder, Step, VersionRef};
use crate::spec::UnmanagedKeyslots;
use crate::world::RecordStatus;

/// A keyslot `removals` plans to kill: `(keyslot, holder, key, version, reason)`.
type Victim = (
    u32,
    SlotHolder,
    Option<String>,
    Option<u64>,
    (ReasonCode, String),
);

impl Planner<'_> {
    /// A plan device without `uuid:` whose path now holds another LUKS device than the one
    /// keyplan worked on there (a loop device re-attached to another image, a replaced disk
    /// behind the same path): the registry's device at that path reads as another UUID
    /// ([`crate::observe::Observed::former_unreadable`]). `plan` goes on with the new one (it is
    /// what the plan names) but says so, and how to pin the right one.
    fn reattached(&mut self) {
        let obs = self.obs;
        for (former, path, why) in &obs.former_unreadable {
            let Some((id, st)) = obs.devices.iter().find(|(_, d)| d.path == *path) else {
                continue;
            };
            if self.plan.devices.get(id).is_none_or(|d| d.uuid.is_some()) {
                continue;
            }
            self.notes.push(format!(
                "device {id} ({}) is LUKS device {}, but keyplan worked on another LUKS device at this path before ({former}: {why}). If the path now names another disk (a loop device attached to another image, a replaced disk), this plan treats the new one as device {id}, and keeps every key version the old one may hold until `keyplan device forget`. Pin the one you mean with `uuid: {}` on device {id}, so a path that names another disk is refused",
                path.display(),
                st.header.uuid,
                st.header.uuid,
            ));
        }
    }

    /// Records whose keyslot was killed or rewritten outside keyplan (or that `--verify`
    /// failed): a forget step and a `~` change each.
    pub(super) fn drift(&mut self) {
        self.reattached();
        let obs = self.obs;
        for (id, d) in &obs.devices {
            for r in &d.records {
                let reason = match r.status {
                    RecordStatus::Valid => continue,
                    RecordStatus::KeyslotGone => (ReasonCode::DriftKeyslotGone, format!(
                        "drift: keyslot {} removed outside keyplan (it held {} v{}); record dropped",
                        r.slot, r.record.key, r.record.version
                    )),
                    RecordStatus::Rewritten => (ReasonCode::DriftRewritten, format!(
                        "drift: keyslot {} rewritten outside keyplan; it no longer holds {} v{} and is now unmanaged",
                        r.slot, r.record.key, r.record.version
                    )),
                    RecordStatus::FailedVerify => (ReasonCode::VerifyFailed, format!(
                        "drift: keyslot {} no longer opens with {} v{}; record dropped, keyslot now unmanaged",
                        r.slot, r.record.key, r.record.version
                    )),
                };
                let failed_verify = r.status == RecordStatus::FailedVerify;
                let s = self.g.add(Step::ForgetRecord {
                    device: id.clone(),
                    slot: r.slot,
                    failed_verify,
                });
                if failed_verify {
                    self.dev(id).repairs.push(s);
                }
                // A keyslot rewritten with the same passphrase is recorded again (`adopt`):
                // its stale record goes first, and the adoption's line says it all.
                let rerecorded = d
                    .adoptable
                    .iter()
                    .any(|a| a.resalted && a.slot == r.slot && r.status == RecordStatus::Rewritten);
                if rerecorded {
                    continue;
                }
                self.change(
                    id,
                    r.slot,
                    SlotAction::Drift,
                    Some(&r.record.key),
                    Some(r.record.version),
                    reason,
                );
            }
        }
    }

    /// Keyslots of keys no longer listed for a device, and unmanaged keyslots under `remove`:
    /// killed once a keyslot of a listed key is verified on the device (and, when that keyslot
    /// holds a staged version, once it is committed). Refused when no listed key is known to
    /// open the device.
    pub(super) fn removals(&mut self) {
        let obs = self.obs;
        for id in obs.devices.keys() {
            if let Some(message) = self.bad_keep_list(id) {
                self.refuse_device(id, message);
                continue;
            }
            let victims = self.victims(id);
            if victims.is_empty() {
                continue;
            }
            let Some(anchor) = self.anchor(id) else {
                let lost = self.lost_records(id);
                let message = format!(
                    "{}: keyslot(s) {} would be removed, but no keyslot of a key in the plan is known to open the device{lost}, so removing them could lock you out; nothing was changed. List a key for this device (with enroll_with if needed) first",
                    self.at(id),
                    victims.iter().map(|v| v.0.to_string()).collect::<Vec<_>>().join(", ")
                );
                self.refuse_device(id, message);
                continue;
            };
            for (slot, holder, key, version, reason) in victims {
                if self.dev(id).kills.contains_key(&slot) {
                    continue;
                }
                let k = self.kill(id, slot, holder, anchor);
                if let Some(c) = self.devs.get(id).and_then(|d| d.anchor_commit) {
                    self.intents.after_commit.push((k, c));
                }
                self.change(
                    id,
                    slot,
                    SlotAction::Remove,
                    key.as_deref(),
                    version,
                    reason,
                );
            }
        }
    }

    /// Why device `id`'s keep list (`unmanaged_keyslots: { keep: [...] }`) cannot be trusted to
    /// say what to keep: it names a keyslot the device does not have, or one keyplan manages
    /// (a typo would otherwise remove the keyslot that was meant to stay). `None` when every
    /// keyslot it names is an unmanaged keyslot of the device, or it names none.
    fn bad_keep_list(&self, id: &str) -> Option<String> {
        let (st, spec) = (self.state(id)?, self.plan.devices.get(id)?);
        let unmanaged: Vec<String> = st
            .header
            .keyslots
            .keys()
            .filter(|n| st.record(**n).is_none())
            .map(u32::to_string)
            .collect();
        let problems: Vec<String> = spec
            .keep_keyslots
            .iter()
            .filter_map(|n| match (st.header.keyslots.get(n), st.record(*n)) {
                (None, _) => Some(format!("keyslot {n} does not exist")),
                (Some(_), Some(r)) => Some(format!(
                    "keyslot {n} is keyplan's own ({} v{})",
                    r.key, r.version
                )),
                (Some(_), None) => None,
            })
            .collect();
        (!problems.is_empty()).then(|| {
            format!(
                "{}: unmanaged_keyslots keeps keyslot(s) {}, but {}; nothing is removed from a device whose keep list may hold a typo, and nothing was changed. Name the unmanaged keyslots to keep (this device has: {})",
                self.at(id),
                spec.keep_keyslots
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                problems.join(", "),
                if unmanaged.is_empty() {
                    "none".to_string()
                } else {
                    unmanaged.join(", ")
                }
            )
        })
    }

    /// The keyslots of device `id` that `removals` would kill.
    fn victims(&self, id: &str) -> Vec<Victim> {
        let (Some(st), Some(spec)) = (self.state(id), self.plan.devices.get(id)) else {
            return Vec::new();
        };
        let listed: BTreeSet<&str> = spec.keys.iter().map(|k| k.key.as_str()).collect();
        let mut victims: Vec<Victim> = Vec::new();
        for r in st
            .records
            .iter()
            .filter(|r| r.status == RecordStatus::Valid)
            .filter(|r| !listed.contains(r.record.key.as_str()))
        {
            victims.push((
                r.slot,
                SlotHolder::Record {
                    key: r.record.key.clone(),
                    version: VersionRef::Version(r.record.version),
                },
                Some(r.record.key.clone()),
                Some(r.record.version),
                (
                    ReasonCode::KeyNotListed,
                    format!("key {} is no longer listed for this device", r.record.key),
                ),
            ));
        }
        if spec.unmanaged == UnmanagedKeyslots::Remove {
            for (slot, ks) in &st.header.keyslots {
                if st.record(*slot).is_some() || spec.keep_keyslots.contains(slot) {
                    continue;
                }
                victims.push((
                    *slot,
                    SlotHolder::Unmanaged {
                        salt: ks.salt.clone(),
                    },
                    None,
                    None,
                    (
                        ReasonCode::UnmanagedRemove,
                        format!(
                            "{}{}",
                            if spec.keep_keyslots.is_empty() {
                                "not created by keyplan (unmanaged_keyslots: remove)"
                            } else {
                                "not created by keyplan, not in unmanaged_keyslots.keep"
                            },
                            unlisted_kind(ks)
                        ),
                    ),
                ));
            }
        }
        victims
    }

    /// A verify step of a keyslot that stays on `device`: one planned already, or a new verify
    /// of the first listed key whose current version is recorded there.
    fn anchor(&mut self, device: &str) -> Option<usize> {
        if let Some(a) = self.devs.get(device).and_then(|d| d.anchor) {
            return Some(a);
        }
        let spec = self.plan.devices.get(device)?;
        let st = self.state(device)?;
        for k in &spec.keys {
            let Some(c) = self.obs.keys.get(&k.key).and_then(|s| s.current) else {
                continue;
            };
            if let Some((slot, _)) = st.slots_of(&k.key).into_iter().find(|(_, v)| *v == c) {
                let v = self.verify_step(device, &k.key, VersionRef::Version(c), slot);
                self.dev(device).anchor = Some(v);
                return Some(v);
            }
        }
        None
    }
}

/// What sets unmanaged keyslot `ks` apart from those the list of keyslots keyplan does not
/// manage shows (bound ones, of priority normal or prefer), as a suffix of its removal reason:
/// `remove` and a keep list remove unbound keyslots and those of priority `ignore` too, which a
/// reader of that list would not expect. Empty for the others.
fn unlisted_kind(ks: &crate::luks::Keyslot) -> &'static str {
    if !ks.bound {
        "; unbound keyslots are removed too"
    } else if ks.priority == crate::luks::Priority::Ignore {
        "; keyslots of priority ignore are removed too"
    } else {
        ""
    }
}
