//! The planner as it was before the planner was split into decisions, preflight checks and
//! ordering passes, kept only for the differential test in `tests` (same steps, same
//! reachability). To be removed with that test.
//!
//! [`diff`] decides everything that can be decided without key material: which keys rotate and
//! why, which keyslot each new version goes into (chosen now, so the journal names concrete
//! keyslots), which keyslot unlocks each device, which keyslots are killed and which verified
//! keyslot must remain ("anchor") before each kill. It costs no PBKDF run.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{
    short_duration, Diff, DiffOptions, KeyAction, KeyChange, ReasonCode, SlotAction, SlotChange,
};
use crate::graph::{SlotHolder, Step, StepGraph, Unlock, VersionRef};
use crate::observe::{DeviceState, Observed};
use crate::spec::{PathSeg, Plan, UnmanagedKeyslots};
use crate::world::RecordStatus;

/// A legacy refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffError(pub String);

/// Per-device planning state.
#[derive(Default)]
struct Dev {
    /// Keyslots chosen as targets in this run.
    reserved: BTreeSet<u32>,
    /// Verify step usable as anchor for kills (a keyslot that stays).
    anchor: Option<usize>,
    /// Steps that read a keyslot (unlock or verify), by keyslot.
    readers: BTreeMap<u32, Vec<usize>>,
    /// Kill steps by keyslot.
    kills: BTreeMap<u32, usize>,
    /// Forget-record steps (run before anything else on the device).
    forgets: Vec<usize>,
    /// Forget-record steps for records `--verify` failed: they run only once the device's
    /// anchor (the key enrolled again) is verified, so a failed repair loses no record.
    verify_forgets: Vec<usize>,
    /// The commit the anchor's version waits for, when the anchor verifies a staged version:
    /// kills anchored on it must wait for that commit too (a staged version is not yet the
    /// KMS's current one).
    anchor_commit: Option<usize>,
    /// Keyslots being added, so they are not taken for unmanaged.
    added: BTreeSet<u32>,
}

struct Planner<'a> {
    plan: &'a Plan,
    obs: &'a Observed,
    g: StepGraph,
    keys: Vec<KeyChange>,
    slots: Vec<SlotChange>,
    devs: BTreeMap<String, Dev>,
    errors: Vec<String>,
    notes: Vec<String>,
}

/// Compares `plan` with `observed` and builds the step graph.
///
/// Errors: every device/key for which no safe plan exists, each message naming the device and
/// keyslot and what to do (no free keyslot, nothing to unlock a device with, a pinned keyslot
/// occupied by something else, a kill that would leave no verified keyslot).
pub fn diff(plan: &Plan, observed: &Observed, opts: &DiffOptions) -> Result<Diff, Vec<DiffError>> {
    let mut p = Planner {
        plan,
        obs: observed,
        g: StepGraph::new(),
        keys: Vec::new(),
        slots: Vec::new(),
        devs: BTreeMap::new(),
        errors: Vec::new(),
        notes: Vec::new(),
    };
    for id in observed.devices.keys() {
        p.devs.insert(id.clone(), Dev::default());
    }
    p.drift();
    for key in plan.keys.keys() {
        p.key(key, opts);
    }
    p.removals();
    p.writable();
    p.metadata_room();
    p.headroom();
    p.retained();
    p.ordering();
    if !p.errors.is_empty() {
        let mut errors: Vec<DiffError> = Vec::new();
        for e in p.errors {
            if !errors.iter().any(|x| x.0 == e) {
                errors.push(DiffError(e));
            }
        }
        return Err(errors);
    }
    let mut slots = p.slots;
    // Stable order for display: by device, keeping planning order within a device.
    slots.sort_by(|a, b| a.device.cmp(&b.device));
    Ok(Diff {
        keys: p.keys,
        slots,
        graph: p.g,
        notes: p.notes,
    })
}

impl Planner<'_> {
    fn dev(&mut self, id: &str) -> &mut Dev {
        self.devs.entry(id.to_string()).or_default()
    }

    fn state(&self, id: &str) -> Option<&DeviceState> {
        self.obs.devices.get(id)
    }

    /// `device ID (PATH, PLAN:LINE:COL)`: how errors name a device, with its place in the plan
    /// file.
    fn at(&self, device: &str) -> String {
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

    /// Records of `device` keyplan can no longer use, described for an error message (e.g.
    /// `keyslot 1 (k v1) was removed outside keyplan`), or an empty string.
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

    /// Refuses changes on devices that cannot be written (immutable image, read-only
    /// filesystem or block device), before anything is staged.
    fn writable(&mut self) {
        let mut changed: Vec<String> = self.slots.iter().map(|c| c.device.clone()).collect();
        changed.sort();
        changed.dedup();
        for device in changed {
            let Some(why) = self.state(&device).and_then(|s| s.read_only.clone()) else {
                continue;
            };
            let slots: Vec<String> = self
                .slots
                .iter()
                .filter(|c| c.device == device)
                .map(|c| {
                    let sign = match c.action {
                        SlotAction::Add => "add",
                        SlotAction::Remove => "remove",
                        SlotAction::Drift => "update the record of",
                    };
                    format!("{sign} keyslot {}", c.slot)
                })
                .collect();
            self.errors.push(format!(
                "{}: the plan would {} but {why}. Nothing was changed and no key version was staged. Make the device writable, or take it out of the plan",
                self.at(&device),
                slots.join(", ")
            ));
        }
    }

    /// Notes old versions a KMS still holds the material of (retention), for keys this plan
    /// does not rotate (a rotation lists what it destroys itself).
    fn retained(&mut self) {
        for (id, key) in &self.plan.keys {
            if self.keys.iter().any(|k| k.key == *id) {
                continue;
            }
            let Some(st) = self.obs.keys.get(id) else {
                continue;
            };
            let kept = st.retained_previous();
            if kept.is_empty() {
                continue;
            }
            let list: Vec<String> = kept.iter().map(|v| format!("v{v}")).collect();
            self.notes.push(format!(
                "KMS {} retains {id} {} (previous version, kept while a device may hold it; destroyed by the next rotation)",
                key.kms,
                list.join(", ")
            ));
        }
    }

    /// Notes a device that will have no free keyslot once this plan is applied: every later
    /// rotation of its keys needs one (the new version is added before the old one is
    /// killed), so it would be refused, perhaps only when `rotate_after` comes due.
    fn headroom(&mut self) {
        let ids: Vec<String> = self.devs.keys().cloned().collect();
        for device in ids {
            let listed = self
                .plan
                .devices
                .get(&device)
                .is_some_and(|d| !d.keys.is_empty());
            let Some(st) = self.state(&device) else {
                continue;
            };
            if !listed {
                continue;
            }
            let max = st.header.version.max_keyslots() as usize;
            let adds = self
                .slots
                .iter()
                .filter(|c| c.device == device && c.action == SlotAction::Add)
                .count();
            let removes = self
                .slots
                .iter()
                .filter(|c| c.device == device && c.action == SlotAction::Remove)
                .count();
            let end = (st.header.keyslots.len() + adds).saturating_sub(removes);
            if end >= max {
                self.notes.push(format!(
                    "{} will have no free keyslot ({end} of {max} in use): rotating its keys needs one, so the next rotation will be refused. Kill a keyslot that is no longer needed (`cryptsetup luksKillSlot`) before a rotation is due",
                    self.at(&device)
                ));
            }
        }
    }

    /// Refuses adding keyslots to a LUKS2 header whose JSON metadata area cannot hold them:
    /// cryptsetup would add the keyslot and then fail to store keyplan's token for it.
    fn metadata_room(&mut self) {
        let ids: Vec<String> = self.devs.keys().cloned().collect();
        for device in ids {
            let adds = self.devs.get(&device).map_or(0, |d| d.added.len());
            if adds == 0 {
                continue;
            }
            let Some((size, used)) = self.state(&device).and_then(|s| s.header.json_area) else {
                continue;
            };
            let keys: Vec<&str> = self
                .slots
                .iter()
                .filter(|c| c.device == device && c.action == SlotAction::Add)
                .filter_map(|c| c.key.as_deref())
                .collect();
            let per_key = |k: &str| {
                let (kms, name) = self
                    .plan
                    .keys
                    .get(k)
                    .map_or((0, 0), |s| (s.kms.len(), s.name.len()));
                // json-c may escape any byte of the names: count them twice.
                KEYSLOT_JSON_BYTES + TOKEN_JSON_BYTES + 2 * (k.len() + kms + name) as u64
            };
            let longest = keys.iter().map(|k| per_key(k)).max().unwrap_or(per_key(""));
            let need = longest.saturating_mul(adds as u64);
            let free = size.saturating_sub(used);
            if need > free {
                self.errors.push(format!(
                    "{}: its LUKS2 JSON metadata area is too full for {} new keyslot{} and keyplan's token{}: {used} of {size} bytes are used, {free} are free, and about {need} are needed; nothing was changed and no key version was staged. Remove tokens or keyslots that are no longer needed (`cryptsetup luksDump` lists them; `cryptsetup token remove --token-id N`, `cryptsetup luksKillSlot`), then run keyplan again",
                    self.at(&device),
                    adds,
                    if adds == 1 { "" } else { "s" },
                    if adds == 1 { "" } else { "s" },
                ));
            }
        }
    }

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

    /// Records whose keyslot was killed or rewritten outside keyplan.
    fn drift(&mut self) {
        let mut todo = Vec::new();
        for (id, d) in &self.obs.devices {
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
                todo.push((
                    id.clone(),
                    r.slot,
                    r.record.key.clone(),
                    r.record.version,
                    reason,
                    r.status == RecordStatus::FailedVerify,
                ));
            }
        }
        for (id, slot, key, version, reason, failed_verify) in todo {
            let s = self.g.add(Step::ForgetRecord {
                device: id.clone(),
                slot,
                failed_verify,
            });
            if failed_verify {
                self.dev(&id).verify_forgets.push(s);
            } else {
                self.dev(&id).forgets.push(s);
            }
            self.change(
                &id,
                slot,
                SlotAction::Drift,
                Some(&key),
                Some(version),
                reason,
            );
        }
    }

    fn pinned(&self, device: &str, key: &str) -> Option<u32> {
        self.plan
            .devices
            .get(device)
            .and_then(|d| d.keys.iter().find(|k| k.key == key))
            .and_then(|k| k.keyslot)
    }

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

    /// Picks the keyslot for a new keyslot of `key` on `device`: the pinned one when free,
    /// else the lowest free keyslot not pinned by another key and not already chosen.
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
        match pick {
            Some(s) => {
                let d = self.dev(device);
                d.reserved.insert(s);
                d.added.insert(s);
                Some(s)
            }
            None => {
                let max = st_max(self.state(device));
                let remove = self
                    .plan
                    .devices
                    .get(device)
                    .is_some_and(|d| d.unmanaged == UnmanagedKeyslots::Remove);
                let advice = if remove {
                    "Unmanaged keyslots are removed only after the plan's keys are in place: run `keyplan apply` without --rotate first, or free a keyslot by hand (cryptsetup luksKillSlot)"
                } else {
                    "Free a keyslot by hand (cryptsetup luksKillSlot) or set unmanaged_keyslots: remove"
                };
                self.errors.push(format!(
                    "{}: no free keyslot for {key} (all {max} keyslots are in use or pinned); nothing was changed. {advice}",
                    self.at(device)
                ));
                None
            }
        }
    }

    /// How to open `device` to add a keyslot of `key`: the key's own `current` keyslot, another
    /// managed key's current keyslot, or the device's `enroll_with` file.
    fn unlock(&mut self, device: &str, key: &str, current: Option<u64>) -> Option<Unlock> {
        let st = self.state(device)?;
        if let Some(c) = current {
            if let Some((slot, _)) = st.slots_of(key).into_iter().find(|(_, v)| *v == c) {
                return Some(Unlock::Key {
                    key: key.to_string(),
                    version: VersionRef::Version(c),
                    slot,
                });
            }
        }
        let dev = self.plan.devices.get(device)?;
        for other in dev.keys.iter().filter(|k| k.key != key) {
            let Some(oc) = self.obs.keys.get(&other.key).and_then(|k| k.current) else {
                continue;
            };
            if let Some((slot, _)) = st.slots_of(&other.key).into_iter().find(|(_, v)| *v == oc) {
                return Some(Unlock::Key {
                    key: other.key.clone(),
                    version: VersionRef::Version(oc),
                    slot,
                });
            }
        }
        // A keyslot holding a version the KMS still keeps (`previous`): e.g. a device that was
        // out of the plan, or offline, during a rotation, or whose header was restored.
        for r in st
            .records
            .iter()
            .filter(|r| r.status == RecordStatus::Valid)
        {
            let kept = self
                .obs
                .keys
                .get(&r.record.key)
                .and_then(|k| k.versions.get(&r.record.version))
                .is_some_and(|v| v.state == crate::kms::VersionState::Previous);
            if kept {
                return Some(Unlock::Key {
                    key: r.record.key.clone(),
                    version: VersionRef::Version(r.record.version),
                    slot: r.slot,
                });
            }
        }
        let here = self.at(device);
        if let Some(file) = dev.enroll_with.clone() {
            // Checked now (size here; the passphrase itself was tested by observe when
            // enrolling needs it) so that a bad file stops the run before anything is staged
            // in the KMS.
            let problem = st.enroll_with_problem.clone();
            let lost = self.lost_records(device);
            return match std::fs::metadata(&file) {
                Ok(m) if m.is_file() && m.len() > crate::luks::MAX_KEYFILE_BYTES => {
                    self.errors.push(format!(
                        "{here}: enroll_with file {} is {} bytes; cryptsetup reads at most {} bytes (8 MiB) from a key file (cryptsetup(8), --keyfile-size), so it cannot hold the passphrase. Nothing was changed. Point enroll_with at the file holding a passphrase that opens the device today",
                        file.display(),
                        m.len(),
                        crate::luks::MAX_KEYFILE_BYTES
                    ));
                    None
                }
                Ok(m) if m.is_file() && m.len() > 0 => match problem {
                    None => Some(Unlock::EnrollWith),
                    Some(p) => {
                        self.errors.push(if lost.is_empty() {
                            p
                        } else {
                            format!("{p}. keyplan's own keyslots cannot be used either{lost}")
                        });
                        None
                    }
                },
                Ok(m) if m.is_file() => {
                    self.errors.push(format!(
                        "{here}: enroll_with file {} is empty; it must hold a passphrase that opens the device today. Nothing was changed",
                        file.display()
                    ));
                    None
                }
                Ok(m) => {
                    let kind = if m.is_dir() {
                        "a directory"
                    } else {
                        "not a regular file (a device, FIFO or socket)"
                    };
                    self.errors.push(format!(
                        "{here}: enroll_with {} is {kind}. Nothing was changed. Point enroll_with at the file holding a passphrase that opens the device today",
                        file.display()
                    ));
                    None
                }
                Err(e) => {
                    self.errors.push(format!(
                        "{here}: cannot read enroll_with file {}: {e}. Nothing was changed. Point enroll_with at the file holding a passphrase that opens the device today",
                        file.display()
                    ));
                    None
                }
            };
        }
        let lost = self.lost_records(device);
        self.errors.push(format!(
            "{here}: keyplan holds no key that opens it{lost}, so it cannot enroll {key}; nothing was changed. Set `enroll_with:` to a file holding a passphrase that opens the device today"
        ));
        None
    }

    fn add_reader(&mut self, device: &str, slot: u32, step: usize) {
        self.dev(device).readers.entry(slot).or_default().push(step);
    }

    fn add_step(
        &mut self,
        device: &str,
        key: &str,
        version: VersionRef,
        slot: u32,
        unlock: Unlock,
    ) -> (usize, usize) {
        let unlock_slot = match &unlock {
            Unlock::Key { slot, .. } => Some(*slot),
            Unlock::EnrollWith => None,
        };
        let a = self.g.add(Step::AddKeyslot {
            device: device.to_string(),
            key: key.to_string(),
            version,
            slot,
            unlock,
        });
        if let Some(s) = unlock_slot {
            self.add_reader(device, s, a);
        }
        let v = self.g.add(Step::Verify {
            device: device.to_string(),
            key: key.to_string(),
            version,
            slot,
        });
        self.g.dep(a, v);
        (a, v)
    }

    fn verify_step(&mut self, device: &str, key: &str, version: VersionRef, slot: u32) -> usize {
        let v = self.g.add(Step::Verify {
            device: device.to_string(),
            key: key.to_string(),
            version,
            slot,
        });
        self.add_reader(device, slot, v);
        v
    }

    fn kill(&mut self, device: &str, slot: u32, holder: SlotHolder, anchor: usize) -> usize {
        let k = self.g.add(Step::KillKeyslot {
            device: device.to_string(),
            slot,
            holder,
            anchor,
        });
        self.g.dep(anchor, k);
        self.dev(device).kills.insert(slot, k);
        k
    }

    fn rotate_reason(
        &self,
        key: &str,
        opts: &DiffOptions,
    ) -> Option<(KeyAction, (ReasonCode, String))> {
        let st = self.obs.keys.get(key)?;
        if let Some(p) = st.pending {
            return Some((
                KeyAction::Finish,
                (
                    ReasonCode::PendingRotation,
                    format!("pending v{p} was staged by an earlier run that did not finish; finishing it"),
                ),
            ));
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
        if let Some(max) = spec.rotate_after {
            let age = Duration::from_secs(self.obs.now.saturating_sub(cur.created_at));
            if age > max {
                let written = spec
                    .rotate_after_text
                    .clone()
                    .unwrap_or_else(|| short_duration(max));
                return Some((
                    KeyAction::Rotate,
                    (
                        ReasonCode::RotateAfterExceeded,
                        format!(
                            "rotate_after exceeded: age {} > {written}",
                            short_duration(age)
                        ),
                    ),
                ));
            }
        }
        None
    }

    fn devices_of(&self, key: &str) -> Vec<String> {
        self.plan
            .devices
            .values()
            .filter(|d| d.keys.iter().any(|k| k.key == key))
            .filter(|d| self.obs.devices.contains_key(&d.id))
            .map(|d| d.id.clone())
            .collect()
    }

    fn key(&mut self, key: &str, opts: &DiffOptions) {
        let Some(st) = self.obs.keys.get(key).cloned() else {
            return;
        };
        if let Some(origins) = self.obs.origins.get(key).cloned() {
            self.migrate(key, &st, &origins, opts);
            return;
        }
        if let Some(c) = st.current {
            if st.current_info().is_none() {
                self.errors.push(format!(
                    "key {key}: the KMS names v{c} as current but has no such version; its metadata is damaged. Nothing was changed: repair it (see README, file KMS layout) or restore it from a backup"
                ));
                return;
            }
        }
        if st.versions.is_empty() {
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
            if !held.is_empty() {
                let kms = self.kms_of(key);
                self.errors.push(format!(
                    "key {key}: KMS {kms} holds no version of it, yet keyplan recorded it on {}. Was the KMS lost, or did its path change? keyplan will not create a new key over keyslots it cannot open. Nothing was changed: restore the KMS (or fix its path); to start over on purpose, kill those keyslots by hand",
                    held.join(", ")
                ));
                return;
            }
        }
        let devices = self.devices_of(key);
        match self.rotate_reason(key, opts) {
            Some((action, reason)) => self.rotate(key, &st, &devices, action, reason),
            None => {
                let Some(c) = st.current else { return };
                for d in &devices {
                    self.converge(key, c, d);
                }
            }
        }
    }

    /// Key with a current version and no rotation: make sure each device holds exactly one
    /// keyslot with it (in the pinned keyslot if any), and no keyslot with older versions.
    fn converge(&mut self, key: &str, c: u64, device: &str) {
        let Some(st) = self.state(device).cloned() else {
            return;
        };
        let recs = st.slots_of(key);
        let pinned = self.pinned(device, key);
        let with_c: Vec<u32> = recs
            .iter()
            .filter(|(_, v)| *v == c)
            .map(|(s, _)| *s)
            .collect();
        let keep = match pinned {
            Some(n) => with_c.iter().copied().find(|s| *s == n),
            None => with_c.first().copied(),
        };
        let (keep_slot, anchor) = match keep {
            Some(s) => (s, None),
            None => {
                if let Some(n) = pinned {
                    if st.header.keyslots.contains_key(&n) {
                        if let Some(holder) = self.evictable(device, key, n) {
                            self.move_into_pin(device, key, c, n, holder, &with_c, &recs);
                            return;
                        }
                        self.errors.push(format!(
                            "{}: keyslot {n} is pinned for {key} but already holds another keyslot{}; nothing was changed. Free keyslot {n} or pin another one",
                            self.at(device),
                            match st.record(n) { Some(r) => format!(" ({} v{})", r.key, r.version), None => " that keyplan did not create".to_string() }
                        ));
                        return;
                    }
                }
                let Some(target) = self.target(device, key, true) else {
                    return;
                };
                let Some(unlock) = self.unlock(device, key, Some(c)) else {
                    return;
                };
                let (_, v) = self.add_step(device, key, VersionRef::Version(c), target, unlock);
                self.dev(device).anchor.get_or_insert(v);
                let reason = if !with_c.is_empty() {
                    (
                        ReasonCode::MoveToPinned,
                        format!("move to pinned keyslot {target}"),
                    )
                } else {
                    (ReasonCode::Enroll, "not enrolled".to_string())
                };
                self.change(device, target, SlotAction::Add, Some(key), Some(c), reason);
                (target, Some(v))
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
            let reason = if v != c {
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
            };
            self.kill(
                device,
                s,
                SlotHolder::Record {
                    key: key.to_string(),
                    version: VersionRef::Version(v),
                },
                anchor,
            );
            self.change(device, s, SlotAction::Remove, Some(key), Some(v), reason);
        }
    }

    /// What keyslot `n` (pinned for `key` on `device`) holds, if keyplan may kill it to make
    /// room: an older version of the same key, or an unmanaged keyslot under
    /// `unmanaged_keyslots: remove`.
    fn evictable(&self, device: &str, key: &str, n: u32) -> Option<SlotHolder> {
        let st = self.state(device)?;
        if let Some(r) = st.record(n) {
            return (r.key == key).then(|| SlotHolder::Record {
                key: key.to_string(),
                version: VersionRef::Version(r.version),
            });
        }
        let remove = self
            .plan
            .devices
            .get(device)
            .is_some_and(|d| d.unmanaged == UnmanagedKeyslots::Remove);
        let ks = st.header.keyslots.get(&n)?;
        remove.then(|| SlotHolder::Unmanaged {
            salt: ks.salt.clone(),
        })
    }

    /// Puts `key` v`c` into its pinned keyslot `n`, which holds `holder`: the version goes to
    /// (or already is in) a spare keyslot M, is verified there, `n` is killed, the version is
    /// added into `n` through M and verified, and M is killed. Other keyslots of the key are
    /// removed once `n` is verified.
    #[allow(clippy::too_many_arguments)]
    fn move_into_pin(
        &mut self,
        device: &str,
        key: &str,
        c: u64,
        n: u32,
        holder: SlotHolder,
        with_c: &[u32],
        recs: &[(u32, u64)],
    ) {
        let version = VersionRef::Version(c);
        let (m, vm) = match with_c.first() {
            Some(&m) => (m, self.verify_step(device, key, version, m)),
            None => {
                let Some(m) = self.target(device, key, false) else {
                    return;
                };
                let Some(unlock) = self.unlock(device, key, Some(c)) else {
                    return;
                };
                let (_, vm) = self.add_step(device, key, version, m, unlock);
                self.change(
                    device,
                    m,
                    SlotAction::Add,
                    Some(key),
                    Some(c),
                    (
                        ReasonCode::TemporaryKeyslot,
                        format!("temporary keyslot: pinned keyslot {n} is occupied"),
                    ),
                );
                (m, vm)
            }
        };
        let (hkey, hversion) = match &holder {
            SlotHolder::Record {
                key,
                version: VersionRef::Version(v),
            } => (Some(key.clone()), Some(*v)),
            _ => (None, None),
        };
        let kn = self.kill(device, n, holder, vm);
        self.change(
            device,
            n,
            SlotAction::Remove,
            hkey.as_deref(),
            hversion,
            (
                ReasonCode::MakeRoom,
                format!("make room in pinned keyslot {n} for {key} v{c}"),
            ),
        );
        let unlock = Unlock::Key {
            key: key.to_string(),
            version,
            slot: m,
        };
        let (an, vn) = self.add_step(device, key, version, n, unlock);
        self.g.dep(kn, an);
        self.change(
            device,
            n,
            SlotAction::Add,
            Some(key),
            Some(c),
            (
                ReasonCode::MoveToPinned,
                format!("move {key} v{c} into pinned keyslot {n}"),
            ),
        );
        self.dev(device).anchor = Some(vn);
        self.kill(
            device,
            m,
            SlotHolder::Record {
                key: key.to_string(),
                version,
            },
            vn,
        );
        self.change(
            device,
            m,
            SlotAction::Remove,
            Some(key),
            Some(c),
            (
                ReasonCode::MoveToPinned,
                format!("{key} moved to pinned keyslot {n}"),
            ),
        );
        for &(s, v) in recs.iter().filter(|(s, _)| *s != n && *s != m) {
            self.kill(
                device,
                s,
                SlotHolder::Record {
                    key: key.to_string(),
                    version: VersionRef::Version(v),
                },
                vn,
            );
            self.change(
                device,
                s,
                SlotAction::Remove,
                Some(key),
                Some(v),
                (
                    ReasonCode::MoveToPinned,
                    format!("{key} moved to pinned keyslot {n}"),
                ),
            );
        }
    }

    /// The KMS instance name of `key` (empty if the key is not in the plan).
    /// The plan moved `key` to another KMS instance or name than its records name: plan the
    /// migration (DESIGN.md: copy, read back, verify on every device, destroy in the old KMS,
    /// update the records). A rotation that is due waits for the next planning round, which
    /// `apply` runs right after the migration.
    fn migrate(
        &mut self,
        key: &str,
        st: &crate::kms::KeyState,
        origins: &[crate::observe::Origin],
        opts: &DiffOptions,
    ) {
        let to_kms = self.kms_of(key);
        if origins.len() > 1 {
            let list: Vec<String> = origins
                .iter()
                .map(|o| format!("{} ({})", o.kms, o.name))
                .collect();
            self.errors.push(format!(
                "key {key}: its keyslot records name several KMSs ({}) besides {to_kms}; keyplan cannot tell which holds the key. Nothing was changed: point the plan back at one of them and apply, then move the key",
                list.join(", ")
            ));
            return;
        }
        let Some(o) = origins.first() else { return };
        let Some(old) = &o.state else {
            self.errors.push(format!(
                "key {key}: its keyslots are recorded in KMS {:?} (as {:?}), which is no longer in the plan, so the key cannot be moved to KMS {to_kms}. Nothing was changed: keep the definition of KMS {:?} in the plan until `keyplan apply` has moved the key, then remove it",
                o.kms, o.name, o.kms
            ));
            return;
        };
        let entry = Some((o.kms.clone(), o.name.clone()));
        let to_name = self
            .plan
            .keys
            .get(key)
            .map(|k| k.name.clone())
            .unwrap_or_else(|| key.to_string());
        let planned = self.devices_of(key);
        let holders: Vec<(String, u32, u64)> = self
            .obs
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
            .collect();
        if holders.is_empty() {
            return;
        }
        if let Some(p) = old.pending {
            self.errors.push(format!(
                "key {key}: a rotation is under way in KMS {:?} (v{p} pending), which the plan moves the key from. Nothing was changed: point the key back at KMS {:?}, run `keyplan apply` to finish the rotation, then move it",
                o.kms, o.kms
            ));
            return;
        }
        let (from, copy) = match old.current {
            Some(n) => {
                if let Some((d, s, v)) = holders.iter().find(|(_, _, v)| *v != n) {
                    self.errors.push(format!(
                        "key {key}: {} keyslot {s} holds v{v}, but v{n} is current in KMS {:?}; nothing was changed. Point the key back at KMS {:?} and run `keyplan apply` so every device holds the current version, then move it",
                        self.at(d), o.kms, o.kms
                    ));
                    return;
                }
                (n, true)
            }
            None => match st.current {
                // An earlier run copied the key and destroyed it in the old KMS, then stopped
                // before updating the records: verify the copy and record it.
                Some(c) => (c, false),
                None => {
                    self.errors.push(format!(
                        "key {key}: its keyslots are recorded in KMS {:?} (as {:?}), which holds no current version of it, and KMS {to_kms} holds none either. Nothing was changed: restore the key in one of them",
                        o.kms, o.name
                    ));
                    return;
                }
            },
        };
        let to = match (copy, st.current) {
            (false, Some(c)) => c,
            _ => from.max(st.versions.keys().copied().max().map_or(0, |m| m + 1)),
        };
        self.keys.push(KeyChange {
            key: key.to_string(),
            kms: to_kms.clone(),
            action: KeyAction::Migrate,
            from: Some(from),
            to,
            reason_code: ReasonCode::Migration,
            reason: format!(
                "moved in the plan from KMS {} ({}) to KMS {to_kms} ({})",
                o.kms,
                o.name,
                self.plan
                    .keys
                    .get(key)
                    .map(|k| k.name.as_str())
                    .unwrap_or(key)
            ),
            retire: Vec::new(),
            from_kms: Some(o.kms.clone()),
        });
        let (version, copy_step) = if copy {
            let c = self.g.add(Step::MigrateCopy {
                key: key.to_string(),
                from_kms: o.kms.clone(),
                from_name: o.name.clone(),
                version: from,
                to_kms: to_kms.clone(),
                to_name: to_name.clone(),
            });
            (VersionRef::Staged, Some(c))
        } else {
            (VersionRef::Version(from), None)
        };
        let destroy = copy.then(|| {
            self.g.add(Step::DestroyOrigin {
                key: key.to_string(),
                from_kms: o.kms.clone(),
                from_name: o.name.clone(),
                version: from,
                to_kms: to_kms.clone(),
                to_name: to_name.clone(),
            })
        });
        for (device, slot, _) in &holders {
            let v = self.verify_step(device, key, version, *slot);
            if let Some(c) = copy_step {
                self.g.dep(c, v);
            }
            let r = self.g.add(Step::Rerecord {
                device: device.clone(),
                key: key.to_string(),
                slot: *slot,
                version,
                to_kms: to_kms.clone(),
                to_name: to_name.clone(),
            });
            self.g.dep(v, r);
            if let Some(d) = destroy {
                self.g.dep(v, d);
                self.g.dep(d, r);
            }
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
        if opts.rotate.iter().any(|k| k == key) {
            self.notes.push(format!(
                "{key} is rotated right after its migration: `keyplan apply` plans again once the key is in KMS {to_kms}"
            ));
        }
    }

    fn kms_of(&self, key: &str) -> String {
        self.plan
            .keys
            .get(key)
            .map(|k| k.kms.clone())
            .unwrap_or_default()
    }

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

    fn rotate(
        &mut self,
        key: &str,
        st: &crate::kms::KeyState,
        devices: &[String],
        action: KeyAction,
        (reason_code, reason): (ReasonCode, String),
    ) {
        let c = st.current;
        let max_known = st.versions.keys().copied().max().unwrap_or(0);
        let at_least = self.max_recorded(key).max(max_known) + 1;
        let to = st.pending.unwrap_or(at_least);
        let kms = self.kms_of(key);
        let change_index = self.keys.len();
        self.keys.push(KeyChange {
            key: key.to_string(),
            kms,
            action,
            from: c,
            to,
            reason: reason.clone(),
            reason_code,
            retire: Vec::new(),
            from_kms: None,
        });
        let stage = self.g.add(Step::Stage {
            key: key.to_string(),
            at_least,
        });
        let commit = self.g.add(Step::Commit {
            key: key.to_string(),
            expected_current: c,
        });
        self.g.dep(stage, commit);
        let mut kills_of_version: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for device in devices {
            let Some(ds) = self.state(device).cloned() else {
                continue;
            };
            let recs = ds.slots_of(key);
            let pinned = self.pinned(device, key);
            let already = st
                .pending
                .and_then(|p| recs.iter().find(|(_, v)| *v == p).map(|(s, _)| *s));
            let (new_slot, verify) = match already {
                Some(s) => {
                    let v = self.verify_step(device, key, VersionRef::Staged, s);
                    self.g.dep(stage, v);
                    (s, v)
                }
                None => {
                    if let Some(n) = pinned {
                        let held_by_key = recs.iter().any(|(s, _)| *s == n);
                        if ds.header.keyslots.contains_key(&n)
                            && !held_by_key
                            && self.evictable(device, key, n).is_none()
                        {
                            self.errors.push(format!(
                                "{}: keyslot {n} is pinned for {key} but holds a keyslot that is not {key}'s; nothing was changed. Free keyslot {n} or pin another one",
                                self.at(device)
                            ));
                            continue;
                        }
                    }
                    let Some(target) = self.target(device, key, true) else {
                        continue;
                    };
                    let Some(unlock) = self.unlock(device, key, c) else {
                        continue;
                    };
                    let (a, v) = self.add_step(device, key, VersionRef::Staged, target, unlock);
                    self.g.dep(stage, a);
                    let why = match action {
                        KeyAction::Create => {
                            (ReasonCode::NotCreated, "not in KMS: new key".to_string())
                        }
                        _ => (ReasonCode::NewVersion, format!("rotate {key}")),
                    };
                    self.change(device, target, SlotAction::Add, Some(key), Some(to), why);
                    (target, v)
                }
            };
            self.g.dep(verify, commit);
            let d = self.dev(device);
            if d.anchor.is_none() {
                d.anchor = Some(verify);
                d.anchor_commit = Some(commit);
            }
            let mut pinned_kill = None;
            for (s, v) in recs.iter().copied().filter(|(s, _)| *s != new_slot) {
                let k = self.kill(
                    device,
                    s,
                    SlotHolder::Record {
                        key: key.to_string(),
                        version: VersionRef::Version(v),
                    },
                    verify,
                );
                self.g.dep(commit, k);
                kills_of_version.entry(v).or_default().push(k);
                self.change(
                    device,
                    s,
                    SlotAction::Remove,
                    Some(key),
                    Some(v),
                    (
                        ReasonCode::SupersededVersion,
                        format!("replaced by {key} v{to}"),
                    ),
                );
                if Some(s) == pinned {
                    pinned_kill = Some(k);
                }
            }
            // A pinned keyslot held by an unmanaged keyslot (under `remove`): kill it after
            // commit, like an old version, to make room.
            if let Some(n) = pinned {
                if pinned_kill.is_none() && n != new_slot && ds.header.keyslots.contains_key(&n) {
                    if let Some(holder @ SlotHolder::Unmanaged { .. }) =
                        self.evictable(device, key, n)
                    {
                        let k = self.kill(device, n, holder, verify);
                        self.g.dep(commit, k);
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
                        pinned_kill = Some(k);
                    }
                }
            }
            // A pinned key whose pinned keyslot held the old version: move the new version
            // into the pinned keyslot once it is free (3 more PBKDF runs; see docs).
            if let (Some(n), Some(k)) = (pinned, pinned_kill) {
                let unlock = Unlock::Key {
                    key: key.to_string(),
                    version: VersionRef::Staged,
                    slot: new_slot,
                };
                let (a2, v2) = self.add_step(device, key, VersionRef::Staged, n, unlock);
                self.g.dep(k, a2);
                self.change(
                    device,
                    n,
                    SlotAction::Add,
                    Some(key),
                    Some(to),
                    (
                        ReasonCode::MoveToPinned,
                        format!("move {key} v{to} back to pinned keyslot {n}"),
                    ),
                );
                let k2 = self.kill(
                    device,
                    new_slot,
                    SlotHolder::Record {
                        key: key.to_string(),
                        version: VersionRef::Staged,
                    },
                    v2,
                );
                self.change(
                    device,
                    new_slot,
                    SlotAction::Remove,
                    Some(key),
                    Some(to),
                    (
                        ReasonCode::TemporaryKeyslot,
                        format!("temporary keyslot of the rotation (pinned keyslot is {n})"),
                    ),
                );
                let d = self.dev(device);
                d.anchor = Some(v2);
                d.anchor_commit = Some(commit);
                let _ = k2;
            }
        }
        // Retention: the version superseded now stays as `previous` (a device that was
        // offline, or left the plan, can still be opened with it). Older versions are destroyed
        // once no device keyplan knows holds them: plan devices that do not list this key (their
        // keyslots are removed by `removals`, but only after this run's retire would be too
        // late to matter) and former devices that left the plan but are still present.
        let mut held: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        let spec = self.plan.keys.get(key).cloned();
        for (id, d) in self.obs.devices.iter().chain(self.obs.former.iter()) {
            for r in d.records.iter().filter(|r| r.status == RecordStatus::Valid) {
                // Keyslots of this key on devices that list it are replaced in this run; any
                // other record of the same KMS entry (another device, or an older key id
                // naming the same entry) keeps its version.
                let same_entry = spec.as_ref().is_some_and(|k| r.record.is_of(k));
                if !same_entry || (devices.contains(id) && r.record.key == key) {
                    continue;
                }
                held.entry(r.record.version)
                    .or_default()
                    .push(format!("{id} keyslot {}", r.slot));
            }
        }
        let old: Vec<u64> = st
            .versions
            .values()
            .filter(|v| v.state == crate::kms::VersionState::Previous)
            .map(|v| v.version)
            .collect();
        let mut retired = Vec::new();
        if !self.obs.former_unreadable.is_empty() && !old.is_empty() {
            let list: Vec<String> = self
                .obs
                .former_unreadable
                .iter()
                .map(|(id, path, why)| format!("{id} ({}: {why})", path.display()))
                .collect();
            self.notes.push(format!(
                "{key} v{} {} kept in the KMS: device(s) keyplan worked on before cannot be read now, so nobody knows which versions they hold: {}. Once such a device is gone for good, delete its entry from {}",
                old.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", v"),
                if old.len() == 1 { "is" } else { "are" },
                list.join("; "),
                self.plan.state_dir.join(crate::world::REGISTRY_FILE).display()
            ));
        }
        for v in old
            .into_iter()
            .filter(|_| self.obs.former_unreadable.is_empty())
        {
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
            let r = self.g.add(Step::Retire {
                key: key.to_string(),
                version: v,
            });
            self.g.dep(commit, r);
            for k in kills_of_version.get(&v).cloned().unwrap_or_default() {
                self.g.dep(k, r);
            }
            retired.push(v);
        }
        if let Some(c) = c {
            if let Some(where_) = held.get(&c) {
                self.notes.push(format!(
                    "{key} v{c} stays in the KMS as the previous version; {} still hold{} it",
                    where_.join(", "),
                    if where_.len() == 1 { "s" } else { "" }
                ));
            }
        }
        if let Some(k) = self.keys.get_mut(change_index) {
            k.retire = retired;
        }
    }

    /// Keyslots of keys no longer listed for a device, and unmanaged keyslots under `remove`.
    fn removals(&mut self) {
        let ids: Vec<String> = self.obs.devices.keys().cloned().collect();
        for id in ids {
            let Some(st) = self.state(&id).cloned() else {
                continue;
            };
            let Some(spec) = self.plan.devices.get(&id).cloned() else {
                continue;
            };
            let listed: BTreeSet<&str> = spec.keys.iter().map(|k| k.key.as_str()).collect();
            let mut victims: Vec<Victim> = Vec::new();
            for r in st
                .records
                .iter()
                .filter(|r| r.status == RecordStatus::Valid)
            {
                if !listed.contains(r.record.key.as_str()) {
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
            }
            if spec.unmanaged == UnmanagedKeyslots::Remove {
                for (slot, ks) in &st.header.keyslots {
                    if st.record(*slot).is_some() {
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
                            "not created by keyplan (unmanaged_keyslots: remove)".to_string(),
                        ),
                    ));
                }
            }
            if victims.is_empty() {
                continue;
            }
            let Some(anchor) = self.anchor(&id) else {
                let lost = self.lost_records(&id);
                self.errors.push(format!(
                    "{}: keyslot(s) {} would be removed, but no keyslot of a key in the plan is known to open the device{lost}, so removing them could lock you out; nothing was changed. List a key for this device (with enroll_with if needed) first",
                    self.at(&id),
                    victims.iter().map(|v| v.0.to_string()).collect::<Vec<_>>().join(", ")
                ));
                continue;
            };
            for (slot, holder, key, version, reason) in victims {
                if self.dev(&id).kills.contains_key(&slot) {
                    continue;
                }
                let k = self.kill(&id, slot, holder, anchor);
                if let Some(c) = self.devs.get(&id).and_then(|d| d.anchor_commit) {
                    self.g.dep(c, k);
                }
                self.change(
                    &id,
                    slot,
                    SlotAction::Remove,
                    key.as_deref(),
                    version,
                    reason,
                );
            }
        }
    }

    /// A verify step of a keyslot that stays on `device`: one planned already, or a new verify
    /// of the first listed key whose current version is recorded there.
    fn anchor(&mut self, device: &str) -> Option<usize> {
        if let Some(a) = self.devs.get(device).and_then(|d| d.anchor) {
            return Some(a);
        }
        let spec = self.plan.devices.get(device)?.clone();
        let st = self.state(device)?.clone();
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

    /// Cross-step ordering on each device: forgotten records first; every step reading a
    /// keyslot before the kill of that keyslot.
    fn ordering(&mut self) {
        let devs = std::mem::take(&mut self.devs);
        let by_device = self.g.by_device();
        for (id, d) in &devs {
            for f in &d.forgets {
                for s in by_device.get(id).into_iter().flatten() {
                    if !d.forgets.contains(s) {
                        self.g.dep(*f, *s);
                    }
                }
            }
            for vf in &d.verify_forgets {
                if let Some(a) = d.anchor {
                    self.g.dep(a, *vf);
                }
                if let Some(c) = d.anchor_commit {
                    self.g.dep(c, *vf);
                }
            }
            for (slot, k) in &d.kills {
                for r in d.readers.get(slot).into_iter().flatten() {
                    if let Step::KillKeyslot { anchor, .. } = self.g.step(*k) {
                        if anchor == r {
                            continue;
                        }
                    }
                    self.g.dep(*r, *k);
                }
            }
        }
    }
}

/// Bytes one more LUKS2 keyslot takes in the JSON metadata, counted high: the keyslot object
/// (about 300 bytes for pbkdf2 or argon2 with a 32-byte salt and an `aes-xts-plain64` area),
/// its id, and its entry in the digest's keyslot list.
const KEYSLOT_JSON_BYTES: u64 = 512;
/// Bytes keyplan's token for a keyslot takes, counted high, without the key id, KMS and key
/// names (added separately): `{"type":"keyplan","keyslots":["31"],"keyplan_format":1,
/// "slot":31,"key":"","version":N,"salt":"<44>","kms":"","name":""}` and its id.
const TOKEN_JSON_BYTES: u64 = 256;

/// A keyslot `removals` plans to kill: `(keyslot, holder, key, version, reason)`.
type Victim = (
    u32,
    SlotHolder,
    Option<String>,
    Option<u64>,
    (ReasonCode, String),
);

fn st_max(st: Option<&DeviceState>) -> u32 {
    st.map_or(32, |s| s.header.version.max_keyslots())
}
