//! This plan's own former holder records: KMS holder records (invariant I7) under another
//! holder id of the same host that are this plan's, left from before its state directory
//! moved (a plan tried by hand and moved, a systemd unit given `--state-dir`). The holder id
//! is `<node>:<state directory>` ([`crate::spec::Plan::holder`]), so a moved state directory
//! is a new id while the KMS still records the old one; taken for another plan's, that record
//! would stop every rotation of the key. The same host's same devices are the same holder:
//!
//! - the state directory's owner record names the id as one it had before
//!   ([`crate::world::Owner::former_holders`]) and that directory is gone (the directory
//!   itself moved; a copy leaves the original, whose record is the original's); or
//! - the id's state directory still exists on this host, no run holds its lock, its owner
//!   record (if any) names this plan file or a plan file that no longer exists, and every
//!   device its registry lists (at least one) is a device of this plan (by LUKS UUID). Then
//!   every device that record stands for is one this plan verifies before it commits, so
//!   replacing the record locks no device out.
//!
//! A record whose state directory is gone and that this directory does not remember is not
//! recognised: whose devices it stood for cannot be known. `keyplan key release` removes it
//! after saying so ([`crate::ops::key::release_holder`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::DeviceState;
use crate::kms::KeyState;
use crate::spec::Plan;
use crate::world::Owner;

/// Why holder id `holder` is this plan's own former record, or `None` when it is not known to
/// be (see the module docs). `owner` is this plan's state directory's owner record; `uuids`
/// the LUKS UUIDs (lower case) of this plan's devices. Reads the other state directory's owner
/// record, lock and registry; writes nothing.
pub fn former_holder(
    plan: &Plan,
    owner: Option<&Owner>,
    uuids: &BTreeSet<String>,
    holder: &str,
) -> Option<String> {
    let me = plan.holder();
    if holder == me || crate::kms::book::parse_vote(holder).is_some() {
        return None;
    }
    let (node, dir) = holder.split_once(':')?;
    if node != plan.holder_node() {
        return None;
    }
    let dir = Path::new(dir);
    // The record claim() writes at the next apply, or one it wrote before: this directory
    // was there, and moved (a copy leaves the original there, whose record is its own).
    let had =
        owner.is_some_and(|o| o.holder == holder || o.former_holders.iter().any(|h| h == holder));
    if had && !dir.exists() {
        return Some(format!(
            "this state directory had that id before it moved to {}",
            plan.state_dir.display()
        ));
    }
    if !dir.is_dir() || crate::journal::lock_holder(dir).is_some() {
        return None;
    }
    let (file, _) = crate::world::owner::identity(plan);
    let theirs = crate::world::owner::read(dir).ok()?;
    if theirs
        .as_ref()
        .is_some_and(|o| o.node != node || (o.plan != file && o.plan.exists()))
    {
        return None;
    }
    let registry = crate::world::registry::read(dir).ok()?;
    let all_mine = !registry.devices.is_empty()
        && registry
            .devices
            .keys()
            .all(|u| uuids.contains(&u.to_lowercase()));
    all_mine.then(|| {
        format!(
            "every device its state directory {} worked on ({}) is a device of this plan",
            dir.display(),
            registry.devices.len()
        )
    })
}

/// The holder ids recorded on `keys` that are this plan's own former records, with why
/// ([`former_holder`]); `devices` are the plan's devices as read (their LUKS UUIDs, and the
/// plan's `uuid:` for those that could not be read).
pub(super) fn own_former(
    plan: &Plan,
    keys: &BTreeMap<String, KeyState>,
    devices: &BTreeMap<String, DeviceState>,
) -> BTreeMap<String, String> {
    let ids: BTreeSet<&String> = keys
        .values()
        .flat_map(|st| st.holders.keys())
        .filter(|h| crate::kms::book::parse_vote(h).is_none())
        .collect();
    if ids.is_empty() {
        return BTreeMap::new();
    }
    let owner = crate::world::owner::read(&plan.state_dir).ok().flatten();
    let uuids = plan_uuids(plan, devices);
    ids.into_iter()
        .filter_map(|h| Some((h.clone(), former_holder(plan, owner.as_ref(), &uuids, h)?)))
        .collect()
}

/// The LUKS UUIDs (lower case) of `plan`'s devices: as read, else as the plan gives them.
pub fn plan_uuids(plan: &Plan, devices: &BTreeMap<String, DeviceState>) -> BTreeSet<String> {
    plan.devices
        .values()
        .filter_map(|d| match devices.get(&d.id) {
            Some(st) => Some(st.header.uuid.to_lowercase()),
            None => d.uuid.as_ref().map(|u| u.to_lowercase()),
        })
        .collect()
}

/// Whether this plan's own holder record of key `key_id` (`st`: the key as read) is backed by
/// none of this plan's devices: the KMS holds a record under this plan's holder id
/// (`<node>:<state directory>`), some device of the plan that lists the key could be read
/// (`devices`), and not one of them has a keyslot keyplan recorded for the key (or one to
/// adopt). A holder record says its devices hold the version it names, so a plan whose
/// devices hold nothing of the key did not write it: a state directory that was at this path
/// before did (it moved away, or its `owner.json` was removed), for devices that may not be
/// this plan's. Taking that record for its own, this plan would commit rotations those devices
/// never got and later destroy the version they hold. `false` when this state directory's
/// journal ever planned a KMS write of the key (its own record, from a run that failed or was
/// killed before its devices got a keyslot), or the journal cannot be read. Reads the
/// journal; writes nothing. (A state directory whose `owner.json` was removed keeps the
/// journal of the plan that wrote it, so this cannot tell that plan's record from the
/// newcomer's; `owner.json`'s refusal is what guards that case.)
pub fn unbacked_own(
    plan: &Plan,
    key_id: &str,
    st: &KeyState,
    devices: &BTreeMap<String, DeviceState>,
) -> bool {
    let Some(key) = plan.keys.get(key_id) else {
        return false;
    };
    if !st.holders.contains_key(&plan.holder()) {
        return false;
    }
    let listing: Vec<&DeviceState> = plan
        .devices
        .values()
        .filter(|d| d.keys.iter().any(|k| k.key == key_id))
        .filter_map(|d| devices.get(&d.id))
        .collect();
    if listing.is_empty() {
        return false;
    }
    let backed = listing.iter().any(|d| {
        d.records.iter().any(|r| r.record.is_of(key)) || d.adoptable.iter().any(|a| a.key == key_id)
    });
    if backed {
        return false;
    }
    // This state directory's journal planned a KMS write of the key (a holder record, a
    // stage, a vote, ...): the record is this directory's own, from a run that failed or was
    // killed before its devices got a keyslot.
    match crate::journal::read(&plan.state_dir) {
        Ok(records) => !crate::journal::planned_kms_keys(&records).contains(key_id),
        Err(_) => false,
    }
}

/// Findings for the keys whose own holder record this plan's devices do not back
/// ([`unbacked_own`]): the plan must not act on such a key before the record is sorted out.
/// A key the plan puts in an entry an earlier move kept for another key (`kept`) is left to
/// the planner, which refuses it for that (its holder record is the other key's).
pub(super) fn unbacked_findings(
    plan: &Plan,
    keys: &BTreeMap<String, KeyState>,
    devices: &BTreeMap<String, DeviceState>,
    kept: &[super::Kept],
) -> Vec<crate::finding::Finding> {
    let me = plan.holder();
    let in_kept_entry = |id: &str| {
        plan.keys.get(id).is_some_and(|k| {
            kept.iter()
                .any(|c| c.copy.key != id && c.copy.kms == k.kms && c.copy.name == k.name)
        })
    };
    keys.iter()
        .filter(|(id, st)| !in_kept_entry(id) && unbacked_own(plan, id, st, devices))
        .map(|(id, _)| {
            crate::finding::Finding::at(
                vec![
                    crate::spec::PathSeg::Key("keys".into()),
                    crate::spec::PathSeg::Key(id.clone()),
                ],
                format!(
                    "key {id}: the KMS holds a holder record under this state directory's id {me:?}, but none of this plan's devices that list the key holds a keyslot of it. A state directory that was at {} before (moved away, or its owner.json removed) wrote that record, for devices that may not be this plan's; acting on it could commit a rotation they never got. Nothing was changed",
                    plan.state_dir.display()
                ),
                Some(format!(
                    "if the plan that wrote it moved, run that plan once from its new place (it records itself under its new id), then release the old record from here: `keyplan key release {id} --holder '{me}'`. If that plan's devices are gone for good, release it the same way. Or give this plan another state directory (`state_dir` or --state-dir)"
                )),
            )
        })
        .collect()
}
