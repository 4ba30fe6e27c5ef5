//! Moving a key to the KMS instance or name the plan now gives it (docs/architecture.md,
//! "Migration is planned from the records"): copy, verify on every device, destroy in the old
//! KMS, re-record.

use super::Planner;
use crate::diff::{DiffOptions, KeyAction, KeyChange, ReasonCode, SlotAction};
use crate::graph::{Step, VersionRef};
use crate::kms::KeyState;
use crate::observe::Origin;
use crate::world::RecordStatus;

impl Planner<'_> {
    /// The plan moved `key` (state `st` in its new KMS) away from the `origins` its records
    /// name: plan the migration (copy, read back, verify on every device, destroy in the old
    /// KMS, update the records). A rotation that is due waits for the next planning round,
    /// which `apply` runs right after the migration.
    pub(super) fn migrate(
        &mut self,
        key: &str,
        st: &KeyState,
        origins: &[Origin],
        opts: &DiffOptions,
    ) {
        let to_kms = self.kms_of(key);
        let Some(o) = self.single_origin(key, origins, &to_kms) else {
            return;
        };
        let Some(old) = &o.state else {
            self.refuse_key(key, format!(
                "key {key}: its keyslots are recorded in KMS {:?} (as {:?}), which is no longer in the plan, so the key cannot be moved to KMS {to_kms}. Nothing was changed: keep the definition of KMS {:?} in the plan until `keyplan apply` has moved the key, then remove it",
                o.kms, o.name, o.kms
            ));
            return;
        };
        if self.refuse_rejoined(key, o, old, &to_kms) || self.refuse_occupied(key, o, old, &to_kms)
        {
            return;
        }
        let holders = self.migration_holders(key, o);
        if holders.is_empty() {
            return;
        }
        if let Some(p) = old.pending {
            self.refuse_key(key, format!(
                "key {key}: a rotation is under way in KMS {:?} (v{p} pending), which the plan moves the key from. Nothing was changed: point the key back at KMS {:?}, run `keyplan apply` to finish the rotation, then move it",
                o.kms, o.kms
            ));
            return;
        }
        let Some((from, copy)) = self.migration_source(key, st, o, old, &holders, &to_kms) else {
            return;
        };
        let to = match (copy, st.current) {
            (false, Some(c)) => c,
            _ => from.max(st.versions.keys().copied().max().map_or(0, |m| m + 1)),
        };
        let to_name = self.name_of(key);
        let kept = self.kept_in_origin(key, o, old, &holders);
        self.keys.push(KeyChange {
            key: key.to_string(),
            kms: to_kms.clone(),
            action: KeyAction::Migrate,
            from: Some(from),
            to,
            reason_code: ReasonCode::Migration,
            reason: format!(
                "moved in the plan from KMS {} ({}) to KMS {to_kms} ({to_name})",
                o.kms, o.name,
            ),
            retire: Vec::new(),
            from_kms: Some(o.kms.clone()),
            copy_checks: Vec::new(),
            kept_in_origin: kept.clone(),
        });
        let dest = (to_kms.clone(), to_name);
        // Also when the origin holds no current version any more (an earlier run copied and
        // destroyed it, then stopped, or its destroy failed after recording the key destroyed):
        // destroying again finishes what material a destroy left (`Kms::destroy_key`).
        let destroy = kept.is_empty();
        self.migration_steps(key, o, (from, copy, destroy, to), &dest, &holders);
        if opts.rotate.iter().any(|k| k == key) {
            self.notes.push(format!(
                "{key} is rotated right after its migration: `keyplan apply` plans again once the key is in KMS {to_kms}"
            ));
        }
    }

    /// The steps of a migration from origin `o` to `(to_kms, to_name)`: when `copy`, copy
    /// version `from`; when `destroy`, destroy the key in the origin (with nothing current
    /// left there, that finishes an earlier destroy: no material stays); then, per holder,
    /// verify the keyslot with the version now in the destination (the copy, or `from`) and
    /// re-record it as `to`.
    fn migration_steps(
        &mut self,
        key: &str,
        o: &Origin,
        (from, copy, destroy, to): (u64, bool, bool, u64),
        (to_kms, to_name): &(String, String),
        holders: &[(String, u32, u64)],
    ) {
        let version = if copy {
            self.g.add(Step::MigrateCopy {
                key: key.to_string(),
                from_kms: o.kms.clone(),
                from_name: o.name.clone(),
                version: from,
                to_kms: to_kms.clone(),
                to_name: to_name.clone(),
            });
            VersionRef::Staged
        } else {
            VersionRef::Version(from)
        };
        if destroy {
            self.g.add(Step::DestroyOrigin {
                key: key.to_string(),
                from_kms: o.kms.clone(),
                from_name: o.name.clone(),
                version: from,
                to_kms: to_kms.clone(),
                to_name: to_name.clone(),
                kept: false,
            });
        }
        for (device, slot, _) in holders {
            self.verify_step(device, key, version, *slot);
            self.g.add(Step::Rerecord {
                device: device.clone(),
                key: key.to_string(),
                slot: *slot,
                version,
                to_kms: to_kms.clone(),
                to_name: to_name.clone(),
            });
            self.change(
                device,
                *slot,
                SlotAction::Drift,
                Some(key),
                Some(to),
                (
                    ReasonCode::Migration,
                    format!("record: {key} now lives in KMS {to_kms}"),
                ),
            );
        }
    }

    /// The versions of the key in origin `o` (state `old`) that devices outside this move
    /// hold, or may hold: a valid record naming the origin's entry on a device that left the
    /// plan ([`crate::observe::Observed::former`]) or on a plan device whose keyslot is not one
    /// of the move's `holders`; while a device keyplan knows cannot be read
    /// ([`crate::observe::Observed::unknown_holders`]), every version the origin still holds.
    /// Notes each, with the devices; the origin keeps the key while this is not empty (and
    /// `apply` remembers it in `<state_dir>/kept.json`, to destroy it once nothing holds it:
    /// [`Planner::revisit_kept`]).
    fn kept_in_origin(
        &mut self,
        key: &str,
        o: &Origin,
        old: &KeyState,
        holders: &[(String, u32, u64)],
    ) -> Vec<u64> {
        let entry = Some((o.kms.clone(), o.name.clone()));
        let mut kept: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
        for (id, d) in self.obs.devices.iter().chain(self.obs.former.iter()) {
            let former = self.obs.former.contains_key(id) && !self.obs.devices.contains_key(id);
            for r in d.records.iter().filter(|r| {
                r.status == RecordStatus::Valid
                    && r.record.entry == entry
                    && !holders.iter().any(|(h, s, _)| h == id && *s == r.slot)
            }) {
                kept.entry(r.record.version).or_default().push(format!(
                    "{id} keyslot {}{}",
                    r.slot,
                    if former {
                        " (no longer in the plan)"
                    } else {
                        ""
                    }
                ));
            }
        }
        let unknown = self.obs.unknown_holders();
        let mut versions: Vec<u64> = kept.keys().copied().collect();
        if !unknown.is_empty() {
            versions.extend(old.current);
            versions.extend(old.retained_previous());
        }
        versions.sort_unstable();
        versions.dedup();
        if versions.is_empty() {
            return versions;
        }
        let mut why: Vec<String> = kept
            .iter()
            .map(|(v, at)| {
                format!(
                    "{} hold{} v{v}",
                    at.join(", "),
                    if at.len() == 1 { "s" } else { "" }
                )
            })
            .collect();
        if !unknown.is_empty() {
            let list: Vec<String> = unknown
                .iter()
                .map(|(id, path, why)| format!("{id} ({}: {why})", path.display()))
                .collect();
            why.push(format!(
                "device(s) keyplan knows cannot be read now, so nobody knows which versions they hold: {}",
                list.join("; ")
            ));
        }
        self.notes.push(format!(
            "{key} is copied to KMS {} but not destroyed in KMS {} ({}): it keeps v{} there, as {}; keyplan never locks a device out. keyplan remembers the copy ({}) and destroys it there once no device keyplan knows holds it (a device gone for good: `keyplan device forget ID`)",
            self.kms_of(key),
            o.kms,
            o.name,
            versions.iter().map(u64::to_string).collect::<Vec<_>>().join(", v"),
            why.join("; "),
            self.plan
                .state_dir
                .join(crate::world::kept::KEPT_FILE)
                .display(),
        ));
        versions
    }

    /// The name of `key` in the KMS the plan puts it in (its id when the key is not in the
    /// plan).
    fn name_of(&self, key: &str) -> String {
        self.plan
            .keys
            .get(key)
            .map_or_else(|| key.to_string(), |k| k.name.clone())
    }

    /// The one origin a moved key's records name; refuses when they name several.
    fn single_origin<'o>(
        &mut self,
        key: &str,
        origins: &'o [Origin],
        to_kms: &str,
    ) -> Option<&'o Origin> {
        if origins.len() > 1 {
            let list: Vec<String> = origins
                .iter()
                .map(|o| format!("{} ({})", o.kms, o.name))
                .collect();
            self.refuse_key(key, format!(
                "key {key}: its keyslot records name several KMSs ({}) besides {to_kms}; keyplan cannot tell which holds the key. Nothing was changed: point the plan back at one of them and apply, then move it",
                list.join(", ")
            ));
            return None;
        }
        origins.first()
    }

    /// `(device, keyslot, version)` of every valid record of `key` naming origin `o`, on the
    /// plan devices that list the key.
    fn migration_holders(&self, key: &str, o: &Origin) -> Vec<(String, u32, u64)> {
        let entry = Some((o.kms.clone(), o.name.clone()));
        let planned = self.devices_of(key);
        self.obs
            .devices
            .iter()
            .filter(|(id, _)| planned.contains(id))
            .flat_map(|(id, d)| {
                d.records
                    .iter()
                    .filter(|r| {
                        r.status == RecordStatus::Valid
                            && r.record.key == key
                            && r.record.entry == entry
                    })
                    .map(move |r| (id.clone(), r.slot, r.record.version))
            })
            .collect()
    }

    /// The version to move and whether it must be copied: the origin's current version (every
    /// holder must hold it), or, when the origin has none any more (an earlier run copied and
    /// destroyed it, then stopped), the destination's current version, which is only verified
    /// and recorded. Refuses otherwise.
    fn migration_source(
        &mut self,
        key: &str,
        st: &KeyState,
        o: &Origin,
        old: &KeyState,
        holders: &[(String, u32, u64)],
        to_kms: &str,
    ) -> Option<(u64, bool)> {
        if let Some(n) = old.current {
            if let Some((d, s, v)) = holders.iter().find(|(_, _, v)| *v != n) {
                let message = format!(
                    "key {key}: {} keyslot {s} holds v{v}, but v{n} is current in KMS {:?}; nothing was changed. Point the key back at KMS {:?} and run `keyplan apply` so every device holds the current version, then move it",
                    self.at(d), o.kms, o.kms
                );
                self.refuse_key(key, message);
                return None;
            }
            return Some((n, true));
        }
        if let Some(c) = st.current {
            return Some((c, false));
        }
        self.refuse_key(key, format!(
            "key {key}: its keyslots are recorded in KMS {:?} (as {:?}), which holds no current version of it, and KMS {to_kms} holds none either. Nothing was changed: restore the key in one of them",
            o.kms, o.name
        ));
        None
    }

    /// The move already reached some of the key's devices (their records name the plan's
    /// entry) and the plan's KMS no longer holds a copy of what the old KMS holds as current
    /// (the key was rotated there since), yet records of other plan devices still name the old
    /// entry: a device that left the plan while the old KMS kept its version, and rejoined.
    /// Refuses (true) with what the devices hold and the way on; the plan's entry is the live
    /// key and must not be removed.
    fn refuse_rejoined(
        &mut self,
        key: &str,
        o: &Origin,
        old: &crate::kms::KeyState,
        to_kms: &str,
    ) -> bool {
        let to_name = self.name_of(key);
        let entry = Some((to_kms.to_string(), to_name.clone()));
        let planned = self.devices_of(key);
        let reached: Vec<String> = self
            .obs
            .devices
            .iter()
            .filter(|(id, d)| {
                planned.contains(id)
                    && d.records.iter().any(|r| {
                        r.status == RecordStatus::Valid
                            && r.record.key == key
                            && r.record.entry == entry
                    })
            })
            .map(|(id, _)| id.clone())
            .collect();
        if reached.is_empty() {
            return false;
        }
        // An interrupted move: the old KMS no longer holds the key (destroyed before the
        // records were rewritten), or the plan's KMS holds a copy of its current version; the
        // rest of its devices follow.
        if old.current.is_none()
            || o.occupant
                .as_ref()
                .is_some_and(|occ| occ.copy_of == old.current)
        {
            return false;
        }
        let holders = self.migration_holders(key, o);
        if holders.is_empty() {
            return false;
        }
        let left: Vec<String> = holders
            .iter()
            .map(|(d, s, v)| format!("{} keyslot {s} (v{v})", self.at(d)))
            .collect();
        self.refuse_key(key, format!(
            "key {key}: {} still record{} it in KMS {:?} (as {:?}), but the key already lives in KMS {to_kms:?} (as {to_name:?}), which {} hold{} and which holds no copy of those versions: a device that left the plan while KMS {:?} kept its version, and rejoined it? Nothing was changed; KMS {to_kms:?} holds the live key: do not remove it. Take the device out of the plan again (it keeps opening with the version KMS {:?} keeps for it), or, to give it the live key, kill that keyslot (`cryptsetup luksKillSlot`, while its `enroll_with` passphrase still opens another keyslot) and list it again with `enroll_with`",
            left.join(", "),
            if holders.len() == 1 { "s" } else { "" },
            o.kms,
            o.name,
            reached.join(", "),
            if reached.len() == 1 { "s" } else { "" },
            o.kms,
            o.kms,
        ));
        true
    }

    /// The entry the plan moves `key` to (in KMS `to_kms`) already holds a version that is not
    /// the current version of the key in origin `o` (state `old`), by material
    /// ([`crate::observe::Occupant`]): another tool's entry of that name, or an older copy of
    /// this key. The move would fail at its copy, or take that version for the key; refuses
    /// and returns true, before anything is touched. An earlier, interrupted run's copy of the
    /// current version is no reason to refuse: the move resumes from it.
    fn refuse_occupied(
        &mut self,
        key: &str,
        o: &Origin,
        old: &crate::kms::KeyState,
        to_kms: &str,
    ) -> bool {
        let (Some(occ), Some(current)) = (&o.occupant, old.current) else {
            return false;
        };
        if occ.copy_of == Some(current) {
            return false;
        }
        let to_name = self.name_of(key);
        if let Some(kept) = self.kept_copy_of(key, to_kms, &to_name) {
            let versions = kept
                .copy
                .versions
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", v");
            self.refuse_key(key, format!(
                "key {key}: the plan moves it back to KMS {to_kms:?} ({to_name:?}), where an earlier move kept a copy for devices outside the move (v{versions} for them, remembered in {}); that copy holds v{}, but the key has been rotated since in KMS {:?} (current v{current}), and keyplan does not carry versions into an entry devices still need. Nothing was changed: keep the key in KMS {:?}, or give it another `name:` in KMS {to_kms:?} (keys.{key}.name in the plan file). Never remove the kept entry by hand while a device holds a version there: `keyplan apply` destroys it once none does",
                self.plan.state_dir.join(crate::world::kept::KEPT_FILE).display(),
                occ.version,
                o.kms,
                o.kms,
            ));
            return true;
        }
        let held = format!(
            "{} v{}",
            if occ.pending { "pending" } else { "current" },
            occ.version
        );
        let what = match occ.copy_of {
            Some(v) => format!(
                "that holds v{v} of this key, an older copy (from an earlier move that did not finish?), not its current v{current}"
            ),
            None => format!(
                "that is not this key: its material matches none of the versions of {key} that KMS {:?} holds (as {:?}), where the devices' keyslot records say they are",
                o.kms, o.name
            ),
        };
        self.refuse_key(key, format!(
            "key {key}: the plan moves it to KMS {to_kms:?}, but that KMS already holds an entry {to_name:?} ({held}) {what}. Nothing was changed: the key stays in KMS {:?}. Give the key another `name:` in KMS {to_kms:?} (keys.{key}.name in the plan file), or remove or rename that entry in KMS {to_kms:?} if nothing needs it, then run `keyplan plan` again",
            o.kms
        ));
        true
    }
}
