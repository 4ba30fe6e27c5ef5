//! Preflight checks: what would make `apply` fail half-way (after staging a KMS version and
//! changing the first device) is refused at plan time instead, from the same observation
//! (docs/architecture.md, "Refuse at plan time what apply could not finish"); and notes about
//! the state the plan leaves behind.
//!
//! The `enroll_with` passphrase, the other such check, costs PBKDF runs and is made while
//! observing (`observe::enroll`); the planner only reads its outcome.

use super::decide::Planner;
use super::SlotAction;

/// Bytes one more LUKS2 keyslot takes in the JSON metadata, counted high: the keyslot object
/// (about 300 bytes for pbkdf2 or argon2 with a 32-byte salt and an `aes-xts-plain64` area),
/// its id, and its entry in the digest's keyslot list.
const KEYSLOT_JSON_BYTES: u64 = 512;
/// Bytes keyplan's token for a keyslot takes, counted high, without the key id, KMS and key
/// names and the PBKDF settings (added separately): `{"type":"keyplan","keyslots":["31"],
/// "keyplan_format":1,"slot":31,"key":"","version":N,"salt":"<44>","kms":"","name":"",
/// "pbkdf":""}` and its id.
const TOKEN_JSON_BYTES: u64 = 256;

/// Every preflight check, in this order: devices that cannot be written, headers cryptsetup
/// will not change or whose copies disagree, LUKS2 JSON areas too full for the new keyslots and
/// tokens (refusals), then notes: header damage on devices left unchanged, devices left
/// without a free keyslot, keyslots that still open with a retired version. (Versions a KMS
/// retains are state, not news: `status` lists them, and a rotation's plan the ones it
/// destroys.)
pub(super) fn check(p: &mut Planner<'_>) {
    writable(p);
    header_state(p);
    metadata_room(p);
    headroom(p);
    retired_copies(p);
}

/// Notes every keyslot that still opens with a key version keyplan retired (found when it
/// retired the version: `world::copies`), whatever the plan changes: it is there until someone
/// removes it.
fn retired_copies(p: &mut Planner<'_>) {
    let obs = p.obs;
    for (id, st) in &obs.devices {
        for c in &st.retired_copies {
            let note = format!("{}: {}", p.at(id), c.describe(&st.path));
            p.notes.push(note);
        }
    }
}

/// The devices with a keyslot change, each once, in id order.
fn changed_devices(p: &Planner<'_>) -> Vec<String> {
    let mut changed: Vec<String> = p.slots.iter().map(|c| c.device.clone()).collect();
    changed.sort();
    changed.dedup();
    changed
}

/// Refuses changes on devices that cannot be written (immutable image, read-only filesystem
/// or block device), before anything is staged.
fn writable(p: &mut Planner<'_>) {
    for device in changed_devices(p) {
        let Some(why) = p.state(&device).and_then(|s| s.read_only.clone()) else {
            continue;
        };
        let slots: Vec<String> = p
            .slots
            .iter()
            .filter(|c| c.device == device)
            .map(|c| {
                let sign = match c.action {
                    SlotAction::Add => "add",
                    SlotAction::Remove => "remove",
                    SlotAction::Drift => "update the record of",
                    SlotAction::Adopt => "record",
                };
                format!("{sign} keyslot {}", c.slot)
            })
            .collect();
        let message = format!(
            "{}: the plan would {} but {why}. Nothing was changed and no key version was staged. Make the device writable, or take it out of the plan",
            p.at(&device),
            slots.join(", ")
        );
        p.refuse_device(&device, message);
    }
}

/// Headers read in process ([`crate::luks::ondisk`]): a device with changes whose header
/// cryptsetup will not change (mandatory requirements, a reencryption in progress) is refused;
/// so is one whose copies disagree, unless `--repair-headers` lets cryptsetup rewrite the
/// damaged copy at its first write. Damage on any device is a note (with what to do).
fn header_state(p: &mut Planner<'_>) {
    let changed = changed_devices(p);
    let ids: Vec<String> = p.obs.devices.keys().cloned().collect();
    for device in ids {
        let Some(cond) = p.state(&device).map(|s| s.header.condition.clone()) else {
            continue;
        };
        let writes = changed.contains(&device);
        let refused = p
            .refusals
            .iter()
            .any(|r| r.device.as_deref() == Some(device.as_str()));
        if writes || refused {
            if let Some(why) = cond.write_blocker() {
                // The root cause: whatever else was refused on this device (e.g. an
                // `enroll_with` test cryptsetup could not make on such a header) follows from it.
                p.refusals
                    .retain(|r| r.device.as_deref() != Some(device.as_str()));
                let message = format!(
                    "{}: {why}. Nothing was changed and no key version was staged. Finish or cancel what the requirement stands for with cryptsetup (e.g. `cryptsetup reencrypt --resume-only`), or take the device out of the plan",
                    p.at(&device)
                );
                p.refuse_device(&device, message);
                continue;
            }
            if cond.copies_disagree && !p.repair_headers {
                let message = format!(
                    "{}: {}. keyplan does not write to it: cryptsetup's first write would rewrite a header copy silently. Nothing was changed and no key version was staged. Repair it yourself, or run again with `--repair-headers` to let cryptsetup do it at its first write",
                    p.at(&device),
                    cond.damage.join("; ")
                );
                p.refuse_device(&device, message);
                continue;
            }
        }
        for d in &cond.damage {
            let also = if writes {
                " (--repair-headers: cryptsetup rewrites it at the first write of this apply)"
            } else {
                ""
            };
            p.notes.push(format!("{}: {d}{also}", p.at(&device)));
        }
    }
}

/// Refuses adding keyslots to a LUKS2 header whose JSON metadata area cannot hold them:
/// cryptsetup would add the keyslot and then fail to store keyplan's token for it.
fn metadata_room(p: &mut Planner<'_>) {
    let ids: Vec<String> = p.devs.keys().cloned().collect();
    for device in ids {
        let adds = p.devs.get(&device).map_or(0, |d| d.added.len());
        let adopts = p
            .slots
            .iter()
            .filter(|c| c.device == device && c.action == SlotAction::Adopt)
            .count();
        if adds + adopts == 0 {
            continue;
        }
        let Some((size, used)) = p.state(&device).and_then(|s| s.header.json_area) else {
            continue;
        };
        let per_key = |k: &str| {
            let (kms, name) = p
                .plan
                .keys
                .get(k)
                .map_or((0, 0), |s| (s.kms.len(), s.name.len()));
            // The settings new keyslots are recorded with (`SlotRecord::pbkdf`: ASCII).
            let pbkdf = p
                .plan
                .pbkdf
                .as_ref()
                .map_or(0, |s| crate::luks::pbkdf_id(s).len());
            // json-c may escape any byte of the names: count them twice.
            KEYSLOT_JSON_BYTES + TOKEN_JSON_BYTES + (2 * (k.len() + kms + name) + pbkdf) as u64
        };
        let longest = p
            .slots
            .iter()
            .filter(|c| c.device == device && c.action == SlotAction::Add)
            .filter_map(|c| c.key.as_deref())
            .map(per_key)
            .max()
            .unwrap_or(per_key(""));
        // An adoption adds a token and no keyslot.
        let need = longest
            .saturating_mul(adds as u64)
            .saturating_add((TOKEN_JSON_BYTES + 2 * 64) * adopts as u64);
        let free = size.saturating_sub(used);
        if need > free {
            let plural = if adds == 1 { "" } else { "s" };
            let message = format!(
                "{}: its LUKS2 JSON metadata area is too full for {adds} new keyslot{plural} and keyplan's token{plural}: {used} of {size} bytes are used, {free} are free, and about {need} are needed; nothing was changed and no key version was staged. Remove tokens or keyslots that are no longer needed (`cryptsetup luksDump` lists them; `cryptsetup token remove --token-id N`, `cryptsetup luksKillSlot`), then run keyplan again",
                p.at(&device),
            );
            p.refuse_device(&device, message);
        }
    }
}

/// Notes a device that will have no free keyslot once this plan is applied: every later
/// rotation of its keys needs one (the new version is added before the old one is killed), so
/// it would be refused, perhaps only when `rotate_after` comes due.
fn headroom(p: &mut Planner<'_>) {
    let ids: Vec<String> = p.devs.keys().cloned().collect();
    for device in ids {
        let listed = p
            .plan
            .devices
            .get(&device)
            .is_some_and(|d| !d.keys.is_empty());
        let Some(st) = p.state(&device) else {
            continue;
        };
        if !listed {
            continue;
        }
        let max = st.header.version.max_keyslots() as usize;
        let count = |a: SlotAction| {
            p.slots
                .iter()
                .filter(|c| c.device == device && c.action == a)
                .count()
        };
        let end = (st.header.keyslots.len() + count(SlotAction::Add))
            .saturating_sub(count(SlotAction::Remove));
        if end >= max {
            let note = format!(
                "{} will have no free keyslot ({end} of {max} in use): rotating its keys needs one, so the next rotation will be refused. Kill a keyslot that is no longer needed (`cryptsetup luksKillSlot`) before a rotation is due",
                p.at(&device)
            );
            p.notes.push(note);
        }
    }
}
