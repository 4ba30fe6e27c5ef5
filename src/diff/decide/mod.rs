//! Decisions: what happens to each key and device, as changes, steps and the ordering facts
//! only a decision knows ([`crate::graph::passes::Intents`]).
//!
//! Layout: [`keys`] dispatches per key (create/rotate/finish, converge, migrate) and holds
//! `converge`; [`rotate`] a rotation; [`retention`] which old versions a rotation destroys;
//! [`pins`] moving a key into its pinned keyslot; [`migrate`] moving a key to another KMS;
//! [`kept`] destroying the copies earlier moves kept in the KMS a key left;
//! [`devices`] records to drop (drift) and keyslots to remove; [`unlock`] how a device is
//! opened to add a keyslot; this file the planner's state and the step helpers.

mod adopt;
mod devices;
mod former;
mod kept;
mod keys;
mod migrate;
mod pins;
mod rename;
mod retention;
mod rotate;
mod unlock;

use std::collections::{BTreeMap, BTreeSet};

pub(super) use adopt::with_adopted_records;
pub(super) use former::without_former_holders;
pub use keys::{foreign_holders, unclaimed_creation};

use super::{
    DiffOptions, HolderAction, HolderChange, KeyChange, ReasonCode, Refusal, SlotAction, SlotChange,
};
use crate::graph::passes::Intents;
use crate::graph::{SlotHolder, Step, StepGraph, Unlock, VersionRef};
use crate::observe::{DeviceState, Observed};
use crate::spec::{PathSeg, Plan, UnmanagedKeyslots};
use crate::world::RecordStatus;

/// Per-device planning state.
#[derive(Default)]
pub(super) struct Dev {
    /// Keyslots chosen as targets in this run.
    reserved: BTreeSet<u32>,
    /// Verify step usable as anchor for kills (a keyslot that stays).
    pub(super) anchor: Option<usize>,
    /// The commit the anchor's version waits for, when the anchor verifies a staged version:
    /// kills anchored on it must wait for that commit too (a staged version is not yet the
    /// KMS's current one).
    pub(super) anchor_commit: Option<usize>,
    /// Kill steps by keyslot.
    kills: BTreeMap<u32, usize>,
    /// Forget-record steps for records `--verify` failed: they run only once the device's
    /// anchor (the key enrolled again) is verified, so a failed repair loses no record.
    repairs: Vec<usize>,
    /// Keyslots being added, so they are not taken for unmanaged.
    pub(super) added: BTreeSet<u32>,
}

/// The planner's state while deciding.
pub(super) struct Planner<'a> {
    pub(super) plan: &'a Plan,
    pub(super) obs: &'a Observed,
    pub(super) g: StepGraph,
    pub(super) intents: Intents,
    pub(super) keys: Vec<KeyChange>,
    pub(super) slots: Vec<SlotChange>,
    pub(super) holders: Vec<HolderChange>,
    /// This plan's holder id ([`Plan::holder`]).
    pub(super) me: String,
    pub(super) devs: BTreeMap<String, Dev>,
    pub(super) refusals: Vec<Refusal>,
    pub(super) notes: Vec<String>,
    /// Shared keys whose commit waits for other holders.
    pub(super) waiting: Vec<super::CommitWait>,
    /// `--repair-headers`: changes on devices whose header copies disagree are allowed.
    pub(super) repair_headers: bool,
    /// Keys with a current version that this plan does not rotate: their leftover previous
    /// versions are retired once every keyslot to kill is known ([`Self::leftover_previous`]).
    pub(super) unrotated: Vec<String>,
}

impl<'a> Planner<'a> {
    /// A planner with nothing decided yet.
    pub(super) fn new(plan: &'a Plan, obs: &'a Observed) -> Planner<'a> {
        let devs = obs
            .devices
            .keys()
            .map(|id| (id.clone(), Dev::default()))
            .collect();
        Planner {
            plan,
            obs,
            g: StepGraph::new(),
            intents: Intents::default(),
            keys: Vec::new(),
            slots: Vec::new(),
            holders: Vec::new(),
            me: plan.holder(),
            devs,
            refusals: Vec::new(),
            notes: Vec::new(),
            waiting: Vec::new(),
            repair_headers: false,
            unrotated: Vec::new(),
        }
    }

    /// Every decision, in this order: records drift made stale, keyslots to adopt, each key in
    /// plan order, keyslots to remove, old versions of unrotated keys to retire, then the
    /// repair facts of each device.
    pub(super) fn decide(&mut self, opts: &DiffOptions) {
        self.drift();
        self.adopt();
        self.renames();
        self.refuse_kept_entries();
        for key in self.plan.keys.keys() {
            self.key(key, opts);
        }
        self.revisit_kept();
        self.removals();
        for key in std::mem::take(&mut self.unrotated) {
            if let Some(st) = self.obs.keys.get(&key) {
                self.leftover_previous(&key, st);
            }
        }
        self.releases();
        self.withdraw_killed_votes();
        self.repairs();
    }

    /// A vote of this plan says its devices hold a version: before any keyslot of that
    /// version is killed here (the key left the rotation, e.g. another plan's record now
    /// stops it and the device converges back on the current version), the vote is withdrawn,
    /// so no other holder commits a version this plan's devices no longer hold.
    fn withdraw_killed_votes(&mut self) {
        let steps: Vec<(usize, Step)> = self.g.steps().into_iter().enumerate().collect();
        let obs = self.obs;
        for (key, st) in &obs.keys {
            let mine: Vec<u64> = st
                .holders
                .keys()
                .filter_map(|h| crate::kms::book::parse_vote(h))
                .filter(|(h, _)| *h == self.me)
                .map(|(_, v)| v)
                .collect();
            for v in mine {
                let kills: Vec<usize> = steps
                    .iter()
                    .filter(|(_, s)| {
                        matches!(s, Step::KillKeyslot {
                            holder: SlotHolder::Record { key: k, version },
                            ..
                        } if k == key && (*version == VersionRef::Version(v)
                            || (*version == VersionRef::Staged && st.pending == Some(v))))
                    })
                    .map(|(i, _)| *i)
                    .collect();
                if kills.is_empty() {
                    continue;
                }
                let existing = steps.iter().find_map(|(i, s)| match s {
                    Step::Unvote { key: k, version } if k == key && *version == v => Some(*i),
                    _ => None,
                });
                let unvote = match existing {
                    Some(i) => i,
                    None => self.unvote_step(key, v),
                };
                for k in kills {
                    self.g.dep(unvote, k);
                }
            }
        }
    }

    fn dev(&mut self, id: &str) -> &mut Dev {
        self.devs.entry(id.to_string()).or_default()
    }

    pub(super) fn state(&self, id: &str) -> Option<&'a DeviceState> {
        self.obs.devices.get(id)
    }

    /// `device ID (PATH, PLAN:LINE:COL)`: how refusals name a device, with its place in the
    /// plan file.
    pub(super) fn at(&self, device: &str) -> String {
        let path = self
            .plan
            .devices
            .get(device)
            .map(|d| d.path.display().to_string())
            .unwrap_or_default();
        match self
            .plan
            .location_of(&[PathSeg::Key("devices".into()), PathSeg::Key(device.into())])
        {
            Some((line, col)) => format!(
                "device {device} ({path}, {}:{line}:{col})",
                self.plan.source_path.display()
            ),
            None => format!("device {device} ({path})"),
        }
    }

    /// Refuses for device `id`.
    pub(super) fn refuse_device(&mut self, id: &str, message: String) {
        self.refusals.push(Refusal::device(id, message));
    }

    /// Refuses for key `id`.
    fn refuse_key(&mut self, id: &str, message: String) {
        self.refusals.push(Refusal::key(id, message));
    }

    /// A holder record step for `key` and its change: `record` (a `Hold`), else a `Release`.
    /// Votes have their own steps (`rotate`, `unvote_step`).
    fn holder_step(&mut self, key: &str, record: bool) -> usize {
        let action = if record {
            HolderAction::Record
        } else {
            HolderAction::Release
        };
        self.holders.push(HolderChange {
            key: key.to_string(),
            kms: self.kms_of(key),
            holder: self.me.clone(),
            action,
            reason: None,
        });
        self.g.add(if record {
            Step::Hold {
                key: key.to_string(),
                current: self.obs.keys.get(key).and_then(|st| st.current),
            }
        } else {
            Step::Release {
                key: key.to_string(),
                entry: None,
            }
        })
    }

    /// Records of `device` keyplan can no longer use, described for a refusal (e.g.
    /// ` (keyslot 1 (k v1) was removed outside keyplan)`), or an empty string.
    fn lost_records(&self, device: &str) -> String {
        let Some(st) = self.state(device) else {
            return String::new();
        };
        let lost: Vec<String> = st
            .records
            .iter()
            .filter_map(|r| {
                let (slot, key, v) = (r.slot, &r.record.key, r.record.version);
                Some(match r.status {
                    RecordStatus::Valid => return None,
                    RecordStatus::KeyslotGone => {
                        format!("keyslot {slot} ({key} v{v}) was removed outside keyplan")
                    }
                    RecordStatus::Rewritten => {
                        format!("keyslot {slot} ({key} v{v}) was rewritten outside keyplan")
                    }
                    RecordStatus::FailedVerify => format!(
                        "keyslot {slot} no longer opens with {key} v{v} from the KMS (--verify)"
                    ),
                })
            })
            .collect();
        if lost.is_empty() {
            String::new()
        } else {
            format!(" ({})", lost.join("; "))
        }
    }

    /// Lists a keyslot change.
    fn change(
        &mut self,
        device: &str,
        slot: u32,
        action: SlotAction,
        key: Option<&str>,
        version: Option<u64>,
        (reason_code, reason): (ReasonCode, String),
    ) {
        self.slots.push(SlotChange {
            device: device.to_string(),
            slot,
            action,
            key: key.map(str::to_string),
            version,
            reason,
            reason_code,
        });
    }

    /// The keyslot `key` is pinned to on `device`, if any.
    fn pinned(&self, device: &str, key: &str) -> Option<u32> {
        self.plan
            .devices
            .get(device)
            .and_then(|d| d.keys.iter().find(|k| k.key == key))
            .and_then(|k| k.keyslot)
    }

    /// The keyslots other keys are pinned to on `device`.
    fn pins_of_others(&self, device: &str, key: &str) -> BTreeSet<u32> {
        self.plan
            .devices
            .get(device)
            .map(|d| {
                d.keys
                    .iter()
                    .filter(|k| k.key != key)
                    .filter_map(|k| k.keyslot)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether keyslot `slot` of `device` has another PBKDF than the plan's `settings.pbkdf`
    /// makes on the observed host ([`crate::luks::kdf_drift`]), and how.
    pub(super) fn kdf_drift(&self, device: &str, slot: u32) -> Option<crate::luks::KdfDrift> {
        let st = self.state(device)?;
        crate::luks::kdf_drift(
            self.plan.pbkdf.as_ref(),
            st.header.version,
            self.obs.host.as_ref(),
            st.header.keyslots.get(&slot)?,
            st.record(slot).and_then(|r| r.pbkdf.as_deref()),
        )
    }

    /// True when `device` says `unmanaged_keyslots: remove`.
    pub(super) fn removes_unmanaged(&self, device: &str) -> bool {
        self.plan
            .devices
            .get(device)
            .is_some_and(|d| d.unmanaged == UnmanagedKeyslots::Remove)
    }

    /// Picks the keyslot for a new keyslot of `key` on `device`: the pinned one when free (and
    /// `allow_pinned`), else the lowest free keyslot not pinned by another key and not already
    /// chosen. Refuses when there is none.
    fn target(&mut self, device: &str, key: &str, allow_pinned: bool) -> Option<u32> {
        let st = self.state(device)?;
        let free = st.free_slots();
        let others = self.pins_of_others(device, key);
        let pinned = self.pinned(device, key);
        let reserved = self
            .devs
            .get(device)
            .map(|d| d.reserved.clone())
            .unwrap_or_default();
        let pick = match pinned {
            Some(n) if allow_pinned && free.contains(&n) && !reserved.contains(&n) => Some(n),
            _ => free
                .into_iter()
                .find(|s| !others.contains(s) && !reserved.contains(s) && Some(*s) != pinned),
        };
        if let Some(s) = pick {
            let d = self.dev(device);
            d.reserved.insert(s);
            d.added.insert(s);
            return Some(s);
        }
        let max = st.header.version.max_keyslots();
        let advice = if self.removes_unmanaged(device) {
            "Unmanaged keyslots are removed only after the plan's keys are in place: run `keyplan apply` without --rotate first, or free a keyslot by hand (cryptsetup luksKillSlot)"
        } else {
            "Free a keyslot by hand (cryptsetup luksKillSlot) or set unmanaged_keyslots: remove"
        };
        let message = format!(
            "{}: no free keyslot for {key} (all {max} keyslots are in use or pinned); nothing was changed. {advice}",
            self.at(device)
        );
        self.refuse_device(device, message);
        None
    }

    /// Adds `version` of `key` into `slot` of `device`, unlocking with `unlock`, and its verify.
    /// Returns `(add, verify)`.
    fn add_step(
        &mut self,
        device: &str,
        key: &str,
        version: VersionRef,
        slot: u32,
        unlock: Unlock,
    ) -> (usize, usize) {
        let a = self.g.add(Step::AddKeyslot {
            device: device.to_string(),
            key: key.to_string(),
            version,
            slot,
            unlock,
        });
        let v = self.g.add(Step::Verify {
            device: device.to_string(),
            key: key.to_string(),
            version,
            slot,
        });
        (a, v)
    }

    /// A verify that `version` of `key` opens the existing `slot` of `device`.
    fn verify_step(&mut self, device: &str, key: &str, version: VersionRef, slot: u32) -> usize {
        self.g.add(Step::Verify {
            device: device.to_string(),
            key: key.to_string(),
            version,
            slot,
        })
    }

    /// A kill of `slot` of `device`, which must hold `holder`, once `anchor` is verified.
    fn kill(&mut self, device: &str, slot: u32, holder: SlotHolder, anchor: usize) -> usize {
        let k = self.g.add(Step::KillKeyslot {
            device: device.to_string(),
            slot,
            holder,
            anchor,
        });
        self.dev(device).kills.insert(slot, k);
        k
    }

    /// The KMS instance name of `key` (empty if the key is not in the plan).
    fn kms_of(&self, key: &str) -> String {
        self.plan
            .keys
            .get(key)
            .map(|k| k.kms.clone())
            .unwrap_or_default()
    }

    /// Plan devices that list `key` and could be observed, in plan order.
    fn devices_of(&self, key: &str) -> Vec<String> {
        self.plan
            .devices
            .values()
            .filter(|d| d.keys.iter().any(|k| k.key == key))
            .filter(|d| self.obs.devices.contains_key(&d.id))
            .map(|d| d.id.clone())
            .collect()
    }

    /// The facts of each device's repairs (records `--verify` failed): after the device's
    /// anchor, and after the commit that anchor waits for.
    fn repairs(&mut self) {
        for d in self.devs.values() {
            for &r in &d.repairs {
                if let Some(a) = d.anchor {
                    self.intents.after_verify.push((r, a));
                }
                if let Some(c) = d.anchor_commit {
                    self.intents.after_commit.push((r, c));
                }
            }
        }
    }
}
