//! A rotation (docs/rotation.md): stage a new version, add it on every device, verify it, commit,
//! kill the keyslots of the old version; a pinned key's new version moves back into its pinned
//! keyslot after the commit (docs/architecture.md, "Pinned keys cost more to rotate").

use super::Planner;
use crate::diff::{KeyAction, KeyChange, ReasonCode, SlotAction};
use crate::graph::{SlotHolder, Step, Unlock, VersionRef};
use crate::kms::KeyState;

/// The steps of one rotation that every device's steps hang on.
#[derive(Clone, Copy)]
struct Rotation {
    /// The commit, or `None` when it waits for other holders' votes (the two-phase commit of
    /// a shared key): the new version is then only added, verified and voted for.
    commit: Option<usize>,
    /// The version that becomes current (the pending one, or the predicted next number).
    to: u64,
    action: KeyAction,
}

impl Planner<'_> {
    /// Rotates `key` (state `st`) on `devices`: one stage and one commit, per device an add and
    /// a verify of the new version (or a verify of a keyslot that holds the pending version
    /// already) and the kills of the old keyslots, then which old versions the KMS destroys.
    pub(super) fn rotate(
        &mut self,
        key: &str,
        st: &KeyState,
        devices: &[String],
        action: KeyAction,
        (reason_code, reason): (ReasonCode, String),
    ) {
        let c = st.current;
        let max_known = st.versions.keys().copied().max().unwrap_or(0);
        let at_least = self.max_recorded(key).max(max_known) + 1;
        let to = st.pending.unwrap_or(at_least);
        let blocking = self.commit_blockers(key, st, to);
        let voted = st
            .holders
            .contains_key(&crate::kms::book::vote_id(&self.me, to));
        if !blocking.is_empty() {
            // Every device holds the new version, and the current one (a device that joined
            // during the rotation gets the current version too: until the commit, it is the
            // one the KMS says opens it).
            let held_here = devices.iter().all(|d| {
                self.state(d).is_some_and(|ds| {
                    let recs = ds.slots_of(key);
                    recs.iter().any(|(_, v)| *v == to)
                        && c.is_none_or(|c| recs.iter().any(|(_, v)| *v == c))
                })
            });
            if voted && st.pending == Some(to) && held_here {
                // This plan did its part; nothing to do until the others vote but kill the
                // keyslots of versions older than the current one.
                for d in devices {
                    let Some(ds) = self.state(d) else { continue };
                    let recs = ds.slots_of(key);
                    if let Some((new_slot, _)) = recs.iter().find(|(_, v)| *v == to).copied() {
                        self.kill_older_than_current(key, st, d, &recs, new_slot);
                    }
                }
                self.waiting.push(crate::diff::CommitWait {
                    key: key.to_string(),
                    kms: self.kms_of(key),
                    version: to,
                    current: c,
                    blocking,
                    verified_here: true,
                });
                return;
            }
            if voted {
                // A device lost its keyslot of `to` (or joined the plan): the vote no longer
                // holds; withdraw it before adding again.
                self.unvote_step(key, to);
            }
        }
        let change_index = self.keys.len();
        self.keys.push(KeyChange {
            key: key.to_string(),
            kms: self.kms_of(key),
            action,
            from: c,
            to,
            reason,
            reason_code,
            retire: Vec::new(),
            from_kms: None,
            copy_checks: Vec::new(),
            kept_in_origin: Vec::new(),
        });
        self.g.add(Step::Stage {
            key: key.to_string(),
            at_least,
            planned_current: c,
        });
        let commit = if blocking.is_empty() {
            Some(self.g.add(Step::Commit {
                key: key.to_string(),
                expected_current: c,
            }))
        } else {
            self.vote_instead(key, st, devices, (c, to), blocking);
            None
        };
        let r = Rotation { commit, to, action };
        for device in devices {
            self.rotate_device(key, st, device, r);
        }
        if commit.is_some() {
            let retired = self.retention(key, st, devices);
            if let Some(k) = self.keys.get_mut(change_index) {
                k.retire = retired;
            }
        }
    }

    /// The highest version of `key` any plan device's record names (0 for none): a new version
    /// is numbered above it, so a number a stale keyslot claims is never reused.
    fn max_recorded(&self, key: &str) -> u64 {
        self.obs
            .devices
            .values()
            .flat_map(|d| d.records.iter())
            .filter(|r| r.record.key == key)
            .map(|r| r.record.version)
            .max()
            .unwrap_or(0)
    }

    /// For a shared key whose commit waits for other nodes: this node votes for `to` instead
    /// of committing it (after its devices are searched for copies of the previous versions,
    /// which another node's commit may retire), and the wait is reported.
    fn vote_instead(
        &mut self,
        key: &str,
        st: &KeyState,
        devices: &[String],
        (c, to): (Option<u64>, u64),
        blocking: Vec<String>,
    ) {
        let vote = crate::kms::book::vote_id(&self.me, to);
        self.holders.push(crate::diff::HolderChange {
            key: key.to_string(),
            kms: self.kms_of(key),
            holder: vote,
            action: crate::diff::HolderAction::Vote,
            reason: None,
        });
        // Another node's commit of this version may retire the previous ones: this
        // node's devices are searched for copies of them before it votes (invariant I8).
        let previous: Vec<u64> = st
            .versions
            .values()
            .filter(|v| v.state == crate::kms::VersionState::Previous)
            .map(|v| v.version)
            .collect();
        for v in previous {
            self.find_copies(key, v, devices);
        }
        self.g.add(Step::Vote {
            key: key.to_string(),
        });
        self.waiting.push(crate::diff::CommitWait {
            key: key.to_string(),
            kms: self.kms_of(key),
            version: to,
            current: c,
            blocking,
            verified_here: false,
        });
    }

    /// Who must vote for version `to` of a shared key before this plan commits it: every other
    /// holder that has not (a peer node; other plans were refused before), and each node the
    /// plan file lists with the key but that has no holder record yet.
    fn commit_blockers(&self, key: &str, st: &KeyState, to: u64) -> Vec<String> {
        let c = st.current;
        // The two-phase commit of a shared key: every other holder (a peer node; other plans
        // were refused before) must have voted for `to` before it is committed.
        let mut blocking: Vec<String> =
            crate::kms::book::unverified_holders(&st.holders, &self.me, to)
                .into_iter()
                .map(str::to_string)
                .collect();
        // A node the plan file lists with the key but that has no holder record (its agent
        // has not run yet, or its record was released from a plan file without it) blocks
        // the commit too: this plan says its devices hold the key.
        if c.is_some() {
            let node_of = |h: &str| h.split_once(':').map(|(n, _)| n.to_string());
            for node in self.plan.peers.get(key).into_iter().flatten() {
                let recorded = st.holders.keys().any(|h| {
                    crate::kms::book::parse_vote(h).is_none()
                        && node_of(h).as_deref() == Some(node.as_str())
                });
                if !recorded {
                    blocking.push(format!("{node}:(no holder record yet)"));
                }
            }
        }
        blocking
    }

    /// The rotation's steps on one device.
    fn rotate_device(&mut self, key: &str, st: &KeyState, device: &str, r: Rotation) {
        let Some(ds) = self.state(device) else {
            return;
        };
        let recs = ds.slots_of(key);
        let pinned = self.pinned(device, key);
        if r.commit.is_none() {
            if let Some(c) = st.current.filter(|c| !recs.iter().any(|(_, v)| v == c)) {
                // A device new to the key while its commit waits for other nodes: it gets the
                // current version first, which stays the KMS's current one until then.
                self.enroll(device, key, c, super::keys::Enrolling::Missing);
            }
        }
        let already = st
            .pending
            .and_then(|p| recs.iter().find(|(_, v)| *v == p).map(|(s, _)| *s));
        let (new_slot, verify) = match already {
            Some(s) => (s, self.verify_step(device, key, VersionRef::Staged, s)),
            None => match self.add_new_version(key, st, device, pinned, &recs, r) {
                Some(x) => x,
                None => return,
            },
        };
        let Some(commit) = r.commit else {
            // The commit waits for other holders: the current version's keyslot stays, and so
            // does the new one; keyslots of older versions go now, anchored on the current
            // version's keyslot (a rotation due again before this node killed the last one's
            // old keyslots).
            self.kill_older_than_current(key, st, device, &recs, new_slot);
            return;
        };
        self.intents.gates.push((verify, commit));
        let d = self.dev(device);
        if d.anchor.is_none() {
            d.anchor = Some(verify);
            d.anchor_commit = Some(commit);
        }
        let mut pinned_kill = None;
        for (s, v) in recs.iter().copied().filter(|(s, _)| *s != new_slot) {
            let k = self.kill_superseded(key, device, (s, v), verify, r.to);
            self.intents.after_commit.push((k, commit));
            if Some(s) == pinned {
                pinned_kill = Some(k);
            }
        }
        if let Some(n) = pinned.filter(|n| *n != new_slot) {
            if pinned_kill.is_none() {
                pinned_kill = self.evict_unmanaged_pin(key, device, n, verify, r);
            }
            if let Some(k) = pinned_kill {
                self.move_back_to_pin(key, device, n, new_slot, k, r);
            }
        }
    }

    /// While a shared key's commit waits: kills the keyslots of `device` that hold versions of
    /// `key` other than the current one and the new one (`new_slot`), once the current
    /// version's keyslot was verified (it stays, and opens the device).
    fn kill_older_than_current(
        &mut self,
        key: &str,
        st: &KeyState,
        device: &str,
        recs: &[(u32, u64)],
        new_slot: u32,
    ) {
        let Some(c) = st.current else {
            return;
        };
        let Some(anchor_slot) = recs.iter().find(|(_, v)| *v == c).map(|(s, _)| *s) else {
            return;
        };
        let older: Vec<(u32, u64)> = recs
            .iter()
            .copied()
            .filter(|(s, v)| *s != new_slot && *s != anchor_slot && *v != c)
            .collect();
        if older.is_empty() {
            return;
        }
        let anchor = self.verify_step(device, key, VersionRef::Version(c), anchor_slot);
        for slot in older {
            self.kill_superseded(key, device, slot, anchor, c);
        }
    }

    /// Kills keyslot `slot` of `device`, which holds `version` of `key`, once `anchor` was
    /// verified, listed as replaced by `by`. Returns the kill.
    fn kill_superseded(
        &mut self,
        key: &str,
        device: &str,
        (slot, version): (u32, u64),
        anchor: usize,
        by: u64,
    ) -> usize {
        let holder = SlotHolder::Record {
            key: key.to_string(),
            version: VersionRef::Version(version),
        };
        let k = self.kill(device, slot, holder, anchor);
        self.change(
            device,
            slot,
            SlotAction::Remove,
            Some(key),
            Some(version),
            (
                ReasonCode::SupersededVersion,
                format!("replaced by {key} v{by}"),
            ),
        );
        k
    }

    /// Adds the staged version on `device` (into the pinned keyslot when it is free), unlocking
    /// with the current version `st.current`. Returns the keyslot and its verify; refuses when
    /// the pinned keyslot holds a keyslot keyplan may not evict, or no keyslot or way in is
    /// left.
    fn add_new_version(
        &mut self,
        key: &str,
        st: &KeyState,
        device: &str,
        pinned: Option<u32>,
        recs: &[(u32, u64)],
        r: Rotation,
    ) -> Option<(u32, usize)> {
        if let Some(n) = pinned {
            let occupied = self
                .state(device)
                .is_some_and(|ds| ds.header.keyslots.contains_key(&n));
            let held_by_key = recs.iter().any(|(s, _)| *s == n);
            if occupied && !held_by_key && self.evictable(device, key, n).is_none() {
                let message = format!(
                    "{}: keyslot {n} is pinned for {key} but holds a keyslot that is not {key}'s; nothing was changed. Free keyslot {n} or pin another one",
                    self.at(device)
                );
                self.refuse_device(device, message);
                return None;
            }
        }
        let target = self.target(device, key, true)?;
        let unlock = self.unlock(device, key, st.current)?;
        let (_, v) = self.add_step(device, key, VersionRef::Staged, target, unlock);
        let why = match r.action {
            KeyAction::Create => (ReasonCode::NotCreated, "not in KMS: new key".to_string()),
            _ => (ReasonCode::NewVersion, format!("rotate {key}")),
        };
        self.change(device, target, SlotAction::Add, Some(key), Some(r.to), why);
        Some((target, v))
    }

    /// A pinned keyslot `n` held by an unmanaged keyslot (under `remove`): killed after the
    /// commit, like an old version, to make room. Returns the kill.
    fn evict_unmanaged_pin(
        &mut self,
        key: &str,
        device: &str,
        n: u32,
        verify: usize,
        r: Rotation,
    ) -> Option<usize> {
        let occupied = self
            .state(device)
            .is_some_and(|ds| ds.header.keyslots.contains_key(&n));
        if !occupied {
            return None;
        }
        let holder @ SlotHolder::Unmanaged { .. } = self.evictable(device, key, n)? else {
            return None;
        };
        let k = self.kill(device, n, holder, verify);
        self.intents.after_commit.extend(r.commit.map(|c| (k, c)));
        self.change(
            device,
            n,
            SlotAction::Remove,
            None,
            None,
            (
                ReasonCode::MakeRoom,
                format!("make room in pinned keyslot {n} for {key}"),
            ),
        );
        Some(k)
    }

    /// Moves the new version into the pinned keyslot `n` once kill `freed` emptied it: add into
    /// `n` unlocking through `new_slot`, verify, kill `new_slot` (3 more PBKDF runs). The verify
    /// of `n` becomes the device's anchor.
    fn move_back_to_pin(
        &mut self,
        key: &str,
        device: &str,
        n: u32,
        new_slot: u32,
        freed: usize,
        r: Rotation,
    ) {
        let unlock = Unlock::Key {
            key: key.to_string(),
            version: VersionRef::Staged,
            slot: new_slot,
        };
        let (a2, v2) = self.add_step(device, key, VersionRef::Staged, n, unlock);
        self.intents.frees.push((freed, a2));
        self.change(
            device,
            n,
            SlotAction::Add,
            Some(key),
            Some(r.to),
            (
                ReasonCode::MoveToPinned,
                format!("move {key} v{} back to pinned keyslot {n}", r.to),
            ),
        );
        let holder = SlotHolder::Record {
            key: key.to_string(),
            version: VersionRef::Staged,
        };
        self.kill(device, new_slot, holder, v2);
        self.change(
            device,
            new_slot,
            SlotAction::Remove,
            Some(key),
            Some(r.to),
            (
                ReasonCode::TemporaryKeyslot,
                format!("temporary keyslot of the rotation (pinned keyslot is {n})"),
            ),
        );
        let d = self.dev(device);
        d.anchor = Some(v2);
        d.anchor_commit = r.commit;
    }
}
