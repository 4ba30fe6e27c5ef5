//! Per key: what happens to it (create, rotate, finish a pending rotation, migrate, converge),
//! and converging a key that does not rotate.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::Planner;
use crate::diff::{short_duration, DiffOptions, HolderAction, KeyAction, ReasonCode, SlotAction};
use crate::graph::{SlotHolder, VersionRef};
use crate::luks::KdfDrift;
use crate::world::RecordStatus;

impl Planner<'_> {
    /// Decides for `key`: a migration when its records name another KMS; a refusal when its
    /// KMS metadata is damaged or lost; otherwise a rotation when one is due (or asked for, or
    /// pending, or the key does not exist yet), else convergence on every device listing it.
    pub(super) fn key(&mut self, key: &str, opts: &DiffOptions) {
        let Some(st) = self.obs.keys.get(key) else {
            return;
        };
        if let Some(origins) = self.obs.origins.get(key) {
            self.migrate(key, st, origins, opts);
            return;
        }
        if let Some(c) = st.current {
            if st.current_info().is_none() {
                self.refuse_key(key, format!(
                    "key {key}: the KMS names v{c} as current but has no such version; its metadata is damaged. Nothing was changed: repair it (see docs/operations.md, file KMS layout) or restore it from a backup"
                ));
                return;
            }
        }
        if st.versions.is_empty() && self.refuse_lost_kms(key) {
            return;
        }
        let devices = self.devices_of(key);
        let listed = self
            .plan
            .devices
            .values()
            .any(|d| d.keys.iter().any(|k| k.key == key));
        if listed && !st.holders.contains_key(&self.me) && st.current.is_some() {
            // Devices of this plan hold the key, or are about to: say so in the KMS first.
            self.holder_step(key, true);
        }
        self.stale_votes(key, st);
        match self.rotate_reason(key, opts) {
            Some((action, reason)) => {
                if self.blocked_by_unavailable(key, st, action)
                    || self.refuse_foreign_creation(key, st, action, opts)
                    || self.blocked_by_holders(key, st, action, opts)
                {
                    return;
                }
                self.rotate(key, st, &devices, action, reason)
            }
            None => {
                if let Some(c) = st.current {
                    for d in &devices {
                        self.converge(key, c, d);
                    }
                    self.unrotated.push(key.to_string());
                }
            }
        }
    }

    /// A pending version with no current one that no device of this plan holds, and that this
    /// plan's journal does not show it staged ([`DiffOptions::staged_here`]: an own creation
    /// whose run failed or was interrupted before any device held it), is another plan's
    /// creation of the key in progress: finishing it here would commit a version the other
    /// plan's devices may not have yet, and let this plan rotate a key the other plan is
    /// about to hold. Refuses and returns true in that case.
    fn refuse_foreign_creation(
        &mut self,
        key: &str,
        st: &crate::kms::KeyState,
        action: KeyAction,
        opts: &DiffOptions,
    ) -> bool {
        if action != KeyAction::Finish {
            return false;
        }
        let Some(p) = unclaimed_creation(&self.obs.devices, &opts.staged_here, key, st) else {
            return false;
        };
        let kms = self.kms_of(key);
        if let Some(peers) = self.plan.peers.get(key).filter(|p| !p.is_empty()) {
            // A key this node shares with others: one of them is creating it. This node
            // enrolls its current version once it exists.
            self.notes.push(format!(
                "key {key} (KMS {kms}) has a pending v{p} and no current version: another node of the plan ({}) is creating it; this node enrolls it once it is committed",
                peers.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
            return true;
        }
        self.refuse_key(key, format!(
            "key {key} (KMS {kms}) has a pending v{p} and no current version, and no device of this plan holds v{p}. Nothing was changed. If `keyplan key import {key}` was interrupted, run it again with the same passphrase on stdin: it commits v{p}. Otherwise another plan (another host or state directory) is creating the key right now, or an earlier run of this plan lost its journal: run keyplan again once the key exists (this plan then enrolls its current version); if no other plan is creating it, the pending version is a leftover: remove it in the KMS by hand"
        ));
        true
    }

    /// A device of the plan that lists `key` cannot be used now ([`crate::observe::Unavailable`]):
    /// a new version could not be verified there before its commit, so the key is neither
    /// created nor rotated (a pending version stays pending) until the device is back or out
    /// of the plan; the other devices converge on the current version, and every other change
    /// goes ahead. Returns true when blocked, with a note.
    fn blocked_by_unavailable(
        &mut self,
        key: &str,
        st: &crate::kms::KeyState,
        action: KeyAction,
    ) -> bool {
        let missing: Vec<&str> = self
            .plan
            .devices
            .values()
            .filter(|d| d.keys.iter().any(|k| k.key == key))
            .filter(|d| self.obs.unavailable.contains_key(&d.id))
            .map(|d| d.id.as_str())
            .collect();
        if missing.is_empty() {
            return false;
        }
        let what = match (action, st.pending) {
            (KeyAction::Create, _) => "is not created".to_string(),
            (KeyAction::Finish, Some(p)) => format!("keeps v{p} pending, uncommitted"),
            _ => "is not rotated".to_string(),
        };
        self.notes.push(format!(
            "key {key} {what}: device{} {} that list{} it cannot be read now, and a new version is committed only once every device listing the key holds it. The key's current version stays and still opens every other device; replace the device or take it out of the plan",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", "),
            if missing.len() == 1 { "s" } else { "" },
        ));
        if let Some(c) = st.current {
            for d in self.devices_of(key) {
                self.converge(key, c, &d);
            }
        }
        true
    }

    /// Other plans hold `key` (invariant I7): no version of it is committed from here. An
    /// explicit `--rotate` is refused (an error); a rotation that is due (`rotate_after`) or a
    /// pending one to finish is left alone with a note, so this plan's other changes go on
    /// (the KMS's current version still opens every device). Returns true when blocked.
    fn blocked_by_holders(
        &mut self,
        key: &str,
        st: &crate::kms::KeyState,
        action: KeyAction,
        opts: &DiffOptions,
    ) -> bool {
        let others = foreign_holders(self.plan, key, st);
        if others.is_empty() {
            return false;
        }
        let kms = self.kms_of(key);
        let name = self
            .plan
            .keys
            .get(key)
            .map(|k| k.name.clone())
            .unwrap_or_default();
        let fix = format!(
            "Rotate the key from one plan that lists every device holding it (fleet mode: one plan for the cluster), or take the key off the other plan's devices and run `keyplan apply` there (that removes its record); for a host gone for good, `keyplan key release {key} --holder HOLDER` removes its record"
        );
        if opts.rotate.iter().any(|k| k == key) {
            self.refuse_key(key, format!(
                "key {key} (KMS {kms}, {name:?}) is also held by another plan: {}. Rotating it from this plan ({}) would commit a version the other plan's devices do not hold, so the KMS's current version would no longer open them. Nothing was changed. {fix}",
                others.join(", "),
                self.me
            ));
            return true;
        }
        let what = match (action, st.pending) {
            (KeyAction::Finish, Some(p)) => {
                format!("its pending v{p} is not committed (it stays pending)")
            }
            _ => "its rotation that is due (rotate_after) does not happen".to_string(),
        };
        self.notes.push(format!(
            "key {key} (KMS {kms}, {name:?}) is also held by another plan: {}; {what}, since a version committed from this plan would not be on that plan's devices. The current version stays, and still opens every device. {fix}",
            others.join(", ")
        ));
        if let Some(c) = st.current {
            for d in self.devices_of(key) {
                self.converge(key, c, &d);
            }
        }
        true
    }

    /// This plan's votes for versions of `key` that are no longer pending (committed or
    /// abandoned) are withdrawn: they would count for nothing, and a list of holders is
    /// read by people.
    fn stale_votes(&mut self, key: &str, st: &crate::kms::KeyState) {
        let stale: Vec<u64> = st
            .holders
            .keys()
            .filter_map(|h| crate::kms::book::parse_vote(h))
            .filter(|(h, v)| *h == self.me && Some(*v) != st.pending)
            .map(|(_, v)| v)
            .collect();
        for version in stale {
            self.unvote_step(key, version);
        }
    }

    /// A step withdrawing this plan's vote for `version` of `key`, and its change.
    pub(super) fn unvote_step(&mut self, key: &str, version: u64) -> usize {
        self.holders.push(crate::diff::HolderChange {
            key: key.to_string(),
            kms: self.kms_of(key),
            holder: crate::kms::book::vote_id(&self.me, version),
            action: HolderAction::Withdraw,
            reason: None,
        });
        self.g.add(crate::graph::Step::Unvote {
            key: key.to_string(),
            version,
        })
    }

    /// After the removals are decided: this plan's holder record of every key no device of
    /// the plan lists any more goes, once no device keyplan knows still holds the key after
    /// this plan's changes.
    pub(super) fn releases(&mut self) {
        let keys: Vec<String> = self.plan.keys.keys().cloned().collect();
        for key in keys {
            let held = self
                .obs
                .keys
                .get(&key)
                .is_some_and(|st| st.holders.contains_key(&self.me));
            let listed = self
                .plan
                .devices
                .values()
                .any(|d| d.keys.iter().any(|k| k.key == key));
            if held && !listed {
                if self.released_everywhere(&key) {
                    self.holder_step(&key, false);
                } else {
                    self.note_kept_record(&key);
                }
            }
        }
        // Keys the plan no longer defines whose last keyslots on its devices this plan removes:
        // their records name the KMS instance and name; the release is idempotent (this plan
        // did not read those keys, so it may not be recorded).
        // A KMS entry the plan still defines under another id (a renamed key) is not gone: its
        // holder record is the renamed key's, which its devices still need.
        let defined = |kms: &str, name: &str| {
            self.plan
                .keys
                .values()
                .any(|k| k.kms == kms && k.name == name)
        };
        let mut gone: std::collections::BTreeMap<String, (String, String)> = Default::default();
        for d in self.obs.devices.values() {
            for r in &d.records {
                if self.plan.keys.contains_key(&r.record.key) {
                    continue;
                }
                if let Some((kms, name)) = &r.record.entry {
                    if self.plan.kms.contains_key(kms) && !defined(kms, name) {
                        gone.insert(r.record.key.clone(), (kms.clone(), name.clone()));
                    }
                }
            }
        }
        // Keys the plan no longer defines that a device which left the plan still holds: the
        // record of this plan, if any, stays; say so (the plan reads no state of such a key).
        let mut kept: std::collections::BTreeMap<String, (String, String, String)> =
            Default::default();
        for d in self.obs.former.values() {
            for r in &d.records {
                if self.plan.keys.contains_key(&r.record.key) || gone.contains_key(&r.record.key) {
                    continue;
                }
                if let Some((kms, name)) = &r.record.entry {
                    if self.plan.kms.contains_key(kms) && !defined(kms, name) {
                        kept.insert(
                            r.record.key.clone(),
                            (kms.clone(), name.clone(), d.id.clone()),
                        );
                    }
                }
            }
        }
        for (key, (kms, name, device)) in kept {
            self.notes.push(format!(
                "key {key} (KMS {kms}, {name:?}) is no longer in the plan file, but device {device}, which left the plan, still holds it: a holder record of this plan ({}) for it, if there is one, stays, and other plans cannot rotate the key meanwhile. Once that device is gone for good, run `keyplan key release {key} --holder {}` from a plan that defines the key",
                self.me, self.me
            ));
        }
        for (key, entry) in gone {
            if self.released_everywhere(&key) {
                self.holders.push(crate::diff::HolderChange {
                    key: key.clone(),
                    kms: entry.0.clone(),
                    holder: self.me.clone(),
                    action: HolderAction::Release,
                    reason: None,
                });
                self.g.add(crate::graph::Step::Release {
                    key,
                    entry: Some(entry),
                });
            }
        }
    }

    /// A note on why this plan keeps its holder record of `key`, which no device of the plan
    /// lists: a device keyplan knows still holds it.
    fn note_kept_record(&mut self, key: &str) {
        let unreadable: Vec<String> = self
            .obs
            .unknown_holders()
            .iter()
            .map(|(id, path, why)| format!("{id} ({}: {why})", path.display()))
            .collect();
        let why = if unreadable.is_empty() {
            "a device that left the plan still holds it".to_string()
        } else {
            format!(
                "device(s) that left the plan cannot be read and may hold it: {}",
                unreadable.join(", ")
            )
        };
        self.notes.push(format!(
            "key {key}: no device of the plan lists it, but this plan keeps its holder record ({}), since {why}; other plans cannot rotate the key meanwhile. Once that device is gone for good, `keyplan key release {key} --holder {}` removes the record",
            self.me, self.me
        ));
    }

    /// Whether no device keyplan knows still holds `key` (a device that left the plan keeps
    /// its versions, and one that cannot be read may hold it), so this plan's holder record
    /// of it can go.
    fn released_everywhere(&self, key: &str) -> bool {
        let removed = |device: &str, slot: u32| {
            self.slots.iter().any(|c| {
                c.device == device
                    && c.slot == slot
                    && c.action == SlotAction::Remove
                    && c.key.as_deref() == Some(key)
            })
        };
        let kept_here = self.obs.devices.values().any(|d| {
            d.records.iter().any(|r| {
                r.record.key == key && r.status == RecordStatus::Valid && !removed(&d.id, r.slot)
            })
        });
        let kept_elsewhere = self
            .obs
            .former
            .values()
            .any(|d| d.records.iter().any(|r| r.record.key == key));
        self.obs.unknown_holders().is_empty() && !kept_here && !kept_elsewhere
    }

    /// A KMS that holds no version of `key` while device records name it was lost (or its path
    /// changed): creating a new key would enroll it through `enroll_with` and kill the keyslots
    /// holding the real key. Refuses and returns true in that case.
    fn refuse_lost_kms(&mut self, key: &str) -> bool {
        let held: Vec<String> = self
            .obs
            .devices
            .values()
            .chain(self.obs.former.values())
            .flat_map(|d| {
                d.records
                    .iter()
                    .filter(|r| r.status == RecordStatus::Valid && r.record.key == key)
                    .map(move |r| {
                        format!("{} keyslot {} ({key} v{})", d.id, r.slot, r.record.version)
                    })
            })
            .collect();
        if held.is_empty() {
            return false;
        }
        let kms = self.kms_of(key);
        self.refuse_key(key, format!(
            "key {key}: KMS {kms} holds no version of it, yet keyplan recorded it on {}. Was the KMS lost, or did its path change? keyplan will not create a new key over keyslots it cannot open. Nothing was changed: restore the KMS (or fix its path); to start over on purpose, kill those keyslots by hand",
            held.join(", ")
        ));
        true
    }

    /// Why `key` gets a new version now, if it does: a pending version to finish, no version
    /// yet, `--rotate`, or `rotate_after` exceeded at the observation time.
    fn rotate_reason(
        &self,
        key: &str,
        opts: &DiffOptions,
    ) -> Option<(KeyAction, (ReasonCode, String))> {
        let st = self.obs.keys.get(key)?;
        if let Some(p) = st.pending {
            let why = if self.plan.peers.get(key).is_some_and(|p| !p.is_empty()) {
                format!("pending v{p} is this key's rotation on all its nodes (staged here or by another node); adding it here")
            } else {
                format!(
                    "pending v{p} was staged by an earlier run that did not finish; finishing it"
                )
            };
            return Some((KeyAction::Finish, (ReasonCode::PendingRotation, why)));
        }
        let Some(cur) = st.current_info() else {
            return Some((
                KeyAction::Create,
                (ReasonCode::NotCreated, "not in KMS".to_string()),
            ));
        };
        if opts.rotate.iter().any(|k| k == key) {
            return Some((
                KeyAction::Rotate,
                (ReasonCode::RotateRequested, "--rotate".to_string()),
            ));
        }
        let spec = self.plan.keys.get(key)?;
        let max = spec.rotate_after?;
        let age = Duration::from_secs(self.obs.now.saturating_sub(cur.created_at));
        if age <= max {
            return None;
        }
        let written = spec
            .rotate_after_text
            .clone()
            .unwrap_or_else(|| short_duration(max));
        Some((
            KeyAction::Rotate,
            (
                ReasonCode::RotateAfterExceeded,
                format!(
                    "rotate_after exceeded: age {} > {written}",
                    short_duration(age)
                ),
            ),
        ))
    }

    /// Key with a current version `c` and no rotation: make sure `device` holds exactly one
    /// keyslot with it (in the pinned keyslot if any), and no keyslot with older versions.
    pub(super) fn converge(&mut self, key: &str, c: u64, device: &str) {
        let Some(st) = self.state(device) else {
            return;
        };
        let recs = st.slots_of(key);
        let pinned = self.pinned(device, key);
        // Keyslots of `c` whose PBKDF is not the plan's are re-wrapped: `c` goes into a new
        // keyslot beside them (no KMS write), is verified there, and they are killed; until
        // then they count as not holding `c`.
        let rewrap: BTreeMap<u32, KdfDrift> = recs
            .iter()
            .filter(|(_, v)| *v == c)
            .filter_map(|(s, _)| Some((*s, self.kdf_drift(device, *s)?)))
            .collect();
        let with_c: Vec<u32> = recs
            .iter()
            .filter(|(s, v)| *v == c && !rewrap.contains_key(s))
            .map(|(s, _)| *s)
            .collect();
        let keep = match pinned {
            Some(n) => with_c.iter().copied().find(|s| *s == n),
            None => with_c.first().copied(),
        };
        let (keep_slot, anchor) = match keep {
            Some(s) => (s, None),
            None => {
                if let Some(n) = pinned.filter(|n| st.header.keyslots.contains_key(n)) {
                    match self.evictable(device, key, n) {
                        Some(holder) => self.move_into_pin(
                            device,
                            key,
                            c,
                            n,
                            holder,
                            &with_c,
                            &recs,
                            rewrap.get(&n),
                        ),
                        None => self.refuse_pin_taken(device, key, n),
                    }
                    return;
                }
                let why = match rewrap.values().next() {
                    Some(d) => Enrolling::Rewrap(d),
                    None if !with_c.is_empty() => Enrolling::ToPin,
                    None => Enrolling::Missing,
                };
                let Some((target, verify)) = self.enroll(device, key, c, why) else {
                    return;
                };
                (target, Some(verify))
            }
        };
        let extras: Vec<(u32, u64)> = recs
            .iter()
            .copied()
            .filter(|(s, _)| *s != keep_slot)
            .collect();
        if extras.is_empty() {
            return;
        }
        let anchor = match anchor {
            Some(a) => a,
            None => self.verify_step(device, key, VersionRef::Version(c), keep_slot),
        };
        self.dev(device).anchor.get_or_insert(anchor);
        for (s, v) in extras {
            let reason = self.extra_reason(key, c, (s, v), keep_slot, pinned, &rewrap);
            let holder = SlotHolder::Record {
                key: key.to_string(),
                version: VersionRef::Version(v),
            };
            self.kill(device, s, holder, anchor);
            self.change(device, s, SlotAction::Remove, Some(key), Some(v), reason);
        }
    }

    /// Why keyslot `s` (holding v`v` of `key`) goes, when `key`'s current version `c` stays in
    /// `keep_slot`: a re-wrap, a superseded or pending version, a move to the pinned keyslot,
    /// or a duplicate.
    fn extra_reason(
        &self,
        key: &str,
        c: u64,
        (s, v): (u32, u64),
        keep_slot: u32,
        pinned: Option<u32>,
        rewrap: &BTreeMap<u32, KdfDrift>,
    ) -> (ReasonCode, String) {
        let pending = self.obs.keys.get(key).and_then(|k| k.pending) == Some(v);
        if let Some(d) = rewrap.get(&s) {
            (
                ReasonCode::PbkdfRewrap,
                format!(
                    "re-wrap: {key} v{c} moves to keyslot {keep_slot} with {} (this one has {})",
                    d.want, d.was
                ),
            )
        } else if v != c && pending {
            (
                ReasonCode::SupersededVersion,
                format!(
                    "pending v{v} of {key}, whose rotation does not go on here (current is v{c})"
                ),
            )
        } else if v != c {
            (
                ReasonCode::SupersededVersion,
                format!("old version v{v} of {key} (current is v{c})"),
            )
        } else if pinned.is_some() {
            (
                ReasonCode::MoveToPinned,
                format!("{key} moved to pinned keyslot {keep_slot}"),
            )
        } else {
            (
                ReasonCode::DuplicateKeyslot,
                format!("duplicate keyslot of {key} v{c} (keeping keyslot {keep_slot})"),
            )
        }
    }

    /// Adds the current version `c` of `key` to `device` in a free keyslot (the pinned one
    /// when free), for the reason `why`. Returns the keyslot and its verify, which becomes the
    /// device's anchor.
    pub(super) fn enroll(
        &mut self,
        device: &str,
        key: &str,
        c: u64,
        why: Enrolling<'_>,
    ) -> Option<(u32, usize)> {
        let target = self.target(device, key, true)?;
        let unlock = self.unlock(device, key, Some(c))?;
        let (_, v) = self.add_step(device, key, VersionRef::Version(c), target, unlock);
        self.dev(device).anchor.get_or_insert(v);
        let reason = match why {
            Enrolling::Rewrap(d) => (
                ReasonCode::PbkdfRewrap,
                format!("re-wrap {key} v{c} with {} (was {})", d.want, d.was),
            ),
            Enrolling::ToPin => (
                ReasonCode::MoveToPinned,
                format!("move to pinned keyslot {target}"),
            ),
            Enrolling::Missing => (ReasonCode::Enroll, "not enrolled".to_string()),
        };
        self.change(device, target, SlotAction::Add, Some(key), Some(c), reason);
        Some((target, v))
    }

    /// Refuses a pinned keyslot `n` that holds a keyslot keyplan may not kill.
    fn refuse_pin_taken(&mut self, device: &str, key: &str, n: u32) {
        let holder = match self.state(device).and_then(|st| st.record(n)) {
            Some(r) => format!(" ({} v{})", r.key, r.version),
            None => " that keyplan did not create".to_string(),
        };
        let message = format!(
            "{}: keyslot {n} is pinned for {key} but already holds another keyslot{holder}; nothing was changed. Free keyslot {n} or pin another one",
            self.at(device)
        );
        self.refuse_device(device, message);
    }
}

/// The pending version of `key` (state `st`) when it has no current version and nothing shows
/// it is this plan's creation: no device of `devices` (the plan's, as observed) records it, and
/// `staged_here` (this plan's journal: [`crate::observe::Observed::staged_here`]) does not
/// show it staged. Such a version is a `keyplan key import` that was interrupted between its
/// stage and its commit (the same import again commits it), another plan creating the key, or
/// a leftover; `apply` does not finish it and `status` says so.
pub fn unclaimed_creation(
    devices: &BTreeMap<String, crate::observe::DeviceState>,
    staged_here: &BTreeSet<(String, Option<u64>)>,
    key: &str,
    st: &crate::kms::KeyState,
) -> Option<u64> {
    let (None, Some(p)) = (st.current, st.pending) else {
        return None;
    };
    let mine = devices.values().any(|d| {
        d.records
            .iter()
            .any(|r| r.record.key == key && r.record.version == p)
    });
    let staged = staged_here.contains(&(key.to_string(), Some(p)))
        || staged_here.contains(&(key.to_string(), None));
    (!mine && !staged).then_some(p)
}

/// The holder records of `key` (state `st`, with this plan's own former records already taken
/// out, `decide::former`) that stop `plan` from rotating it (invariant I7): every record but
/// this plan's own, its peers' and votes, as `<holder> (since <time>)`, in id order. Also what
/// `status` reports as a rotation that will be skipped.
pub fn foreign_holders(
    plan: &crate::spec::Plan,
    key: &str,
    st: &crate::kms::KeyState,
) -> Vec<String> {
    let me = plan.holder();
    st.holders
        .iter()
        .filter(|(h, _)| **h != me && !is_peer(plan, key, st, h))
        .filter(|(h, _)| crate::kms::book::parse_vote(h).is_none())
        .map(|(h, since)| format!("{h} (since {})", crate::clock::rfc3339(*since)))
        .collect()
}

/// Whether holder id `holder` (`<node>:<state directory>`) is a peer of `plan` for `key`
/// (state `st`): a node whose devices the plan file lists with the key
/// ([`crate::spec::Plan::peers`]). A peer's record does not block this plan's rotation: the
/// commit waits for its vote.
///
/// A node with two records (two plans on one node, e.g. another state directory) is no peer:
/// which of them is the fleet's cannot be told, so both stop the rotation as other plans do,
/// with the note naming them.
fn is_peer(plan: &crate::spec::Plan, key: &str, st: &crate::kms::KeyState, holder: &str) -> bool {
    let node_of = |h: &str| h.split_once(':').map(|(n, _)| n).unwrap_or(h).to_string();
    let node = node_of(holder);
    if !plan.peers.get(key).is_some_and(|p| p.contains(&node)) {
        return false;
    }
    let records = st
        .holders
        .keys()
        .filter(|h| crate::kms::book::parse_vote(h).is_none() && node_of(h) == node)
        .count();
    records <= 1
}

/// Why [`Planner::enroll`] adds a key's current version to a device.
pub(super) enum Enrolling<'a> {
    /// The device holds it in no keyslot.
    Missing,
    /// The device holds it elsewhere; it moves to its pinned keyslot.
    ToPin,
    /// The device holds it only in keyslots whose PBKDF is not the plan's.
    Rewrap(&'a KdfDrift),
}
