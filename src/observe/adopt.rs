//! Keyslots to adopt: a keyslot no record names that a listed key's current KMS version opens
//! (a Rook OSD's keyslot 0, a hand-made or clevis setup whose passphrase is in the KMS, a LUKS1
//! disk). Found by testing the version against the candidates, one PBKDF run each
//! (`open --test-passphrase --key-slot N`), keyslot the plan pins first, then keyslot 0 (where
//! `cryptsetup luksFormat` and Rook put the first passphrase), then the others in order, so an
//! adoption costs one PBKDF run when the suggested keyslot is right.
//!
//! Candidates are bound keyslots (an unbound one opens nothing) whose priority is not `ignore`
//! (cryptsetup-config(8): such a keyslot is kept out of normal unlocking on purpose), that no
//! keyplan record names in any state, and that no other key adopts in the same observation.
//!
//! Keyplan's own leftovers too: an `add keyslot` step this state directory's journal shows
//! started and never finished ([`crate::journal::unfinished_adds`]: the process died, or the
//! run failed before the step could record what `luksAddKey` wrote) may have left its target
//! keyslot holding the version it was adding, a pending one mid-rotation, with no record. That
//! keyslot is tested with that version alone (one PBKDF run, only while such a leftover is
//! unrecorded and the version is still pending or current) and adopted as holding it, so the
//! rotation finishes with it instead of adding the version a second time and leaving the
//! first keyslot to open the device with a version the next rotation retires (found by the
//! deterministic simulation, docs/verification.md).

use std::collections::BTreeMap;
use std::path::Path;

use super::{DeviceState, Origin};
use crate::finding::Finding;
use crate::journal::UnfinishedAdd;
use crate::kms::KeyState;
use crate::luks::Priority;
use crate::spec::{Device, PathSeg, Plan};
use crate::world::World;

/// A keyslot found to open with a key's current version, to be recorded as holding it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Adoption {
    /// The keyslot.
    pub slot: u32,
    /// The key id.
    pub key: String,
    /// The KMS version that opened it: the key's current version, or for the leftover of an
    /// unfinished add ([`crate::journal::unfinished_adds`]) the pending (or current) version it
    /// was adding.
    pub version: u64,
    /// The keyslot's KDF salt when it was tested (the adopt step checks it is unchanged).
    pub salt: String,
    /// True when a record of this keyplan names the keyslot already, with the same key and
    /// version but an older salt: the keyslot was rewritten with the same passphrase
    /// (`cryptsetup luksConvertKey`, a KDF upgrade) and is recorded again, not newly adopted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resalted: bool,
}

/// The keyslots of `st` (device `dev` of `plan`) that the current KMS versions of its listed
/// keys open, testing each key whose current version no valid record of the device holds;
/// then the target keyslots of this device's `unfinished` adds ([`leftovers`]). Keys that
/// moved to another KMS (their records name an origin) are left to the migration.
///
/// Errors: a KMS that cannot give a version's passphrase, or a cryptsetup failure: a finding
/// naming the device (nothing is adopted then).
pub(super) fn probe(
    plan: &Plan,
    world: &World,
    dev: &Device,
    st: &DeviceState,
    keys: &BTreeMap<String, KeyState>,
    origins: &BTreeMap<String, Vec<Origin>>,
    unfinished: &[UnfinishedAdd],
) -> Result<Vec<Adoption>, Finding> {
    let mut found: Vec<Adoption> = Vec::new();
    if st.header.condition.copies_disagree {
        // Testing would let cryptsetup rewrite a header copy (`ondisk`): nothing is adopted
        // until the header is repaired; the plan reports the damage.
        return Ok(found);
    }
    for dk in &dev.keys {
        let Some(c) = to_test(&dk.key, st, keys, origins) else {
            continue;
        };
        let candidates = candidates(st, dk.keyslot, &found);
        if candidates.is_empty() {
            continue;
        }
        let what = format!("{} v{c} opens one of its keyslots", dk.key);
        if let Some(slot) = first_opening(plan, world, dev, st, &dk.key, c, &candidates, &what)? {
            tracing::info!(device = %dev.id, key = %dk.key, version = c, slot, "the KMS's current version opens an unrecorded keyslot: adopting it");
            found.push(Adoption {
                slot,
                key: dk.key.clone(),
                version: c,
                salt: st.header.keyslots[&slot].salt.clone(),
                resalted: false,
            });
        }
    }
    resalted(plan, world, dev, st, keys, origins, &mut found)?;
    leftovers(plan, world, dev, st, keys, origins, unfinished, &mut found)?;
    Ok(found)
}

/// Adds to `found` every keyslot of `st` whose record stands but whose KDF salt changed
/// (`RecordStatus::Rewritten`: `cryptsetup luksConvertKey`, a routine KDF upgrade, rewrites a
/// keyslot with the same passphrase and a new salt) that the recorded version still opens,
/// tested with that version and keyslot only (one PBKDF run each, spent only while such a
/// record stands), to be recorded again with the new salt ([`Adoption::resalted`]): it stays
/// managed, so the next rotation removes it like any keyslot keyplan made, rather than
/// leaving it unmanaged and opening the device with a version keyplan retires. The key must
/// be in the plan and not moving KMS, its KMS must still hold the version's material
/// (current, pending or a retained previous one), and the keyslot must be bound.
///
/// Errors: as [`probe`].
fn resalted(
    plan: &Plan,
    world: &World,
    dev: &Device,
    st: &DeviceState,
    keys: &BTreeMap<String, KeyState>,
    origins: &BTreeMap<String, Vec<Origin>>,
    found: &mut Vec<Adoption>,
) -> Result<(), Finding> {
    use crate::world::RecordStatus;
    for r in st
        .records
        .iter()
        .filter(|r| r.status == RecordStatus::Rewritten)
    {
        let (key, version) = (&r.record.key, r.record.version);
        let live = keys.get(key).is_some_and(|k| {
            k.pending == Some(version)
                || k.current == Some(version)
                || k.retained_previous().contains(&version)
        });
        let Some(ks) = st.header.keyslots.get(&r.slot) else {
            continue;
        };
        let taken = found.iter().any(|a| a.slot == r.slot)
            || st
                .records
                .iter()
                .any(|o| o.slot == r.slot && o.status == RecordStatus::Valid);
        if !live || !ks.bound || taken || origins.contains_key(key) {
            continue;
        }
        let what = format!(
            "{key} v{version} still opens keyslot {}, rewritten outside keyplan (new salt)",
            r.slot
        );
        if first_opening(plan, world, dev, st, key, version, &[r.slot], &what)?.is_some() {
            tracing::info!(device = %dev.id, key = %key, version, slot = r.slot, "a managed keyslot was rewritten with the same passphrase (new salt or KDF): recording it again");
            found.push(Adoption {
                slot: r.slot,
                key: key.clone(),
                version,
                salt: ks.salt.clone(),
                resalted: true,
            });
        }
    }
    Ok(())
}

/// Adds to `found` the target keyslot of each of `unfinished` on device `dev` (same id and
/// path) that the version it was adding opens, tested with that version and keyslot only (one
/// PBKDF run each), when: the key is listed on the device and did not move KMS; the KMS still
/// holds the version's material (pending, current or retained previous); no record of the
/// device holds the version, unless the keyslot is the key's pinned one (the move back of a
/// pinned rotation, whose temporary keyslot holds it); and the keyslot is a candidate
/// ([`candidates`]: bound, unrecorded, not `ignore`, not adopted already).
///
/// Errors: as [`probe`].
#[allow(clippy::too_many_arguments)]
fn leftovers(
    plan: &Plan,
    world: &World,
    dev: &Device,
    st: &DeviceState,
    keys: &BTreeMap<String, KeyState>,
    origins: &BTreeMap<String, Vec<Origin>>,
    unfinished: &[UnfinishedAdd],
    found: &mut Vec<Adoption>,
) -> Result<(), Finding> {
    for u in unfinished {
        if u.device != dev.id || Path::new(&u.path) != st.path {
            continue;
        }
        // The KMS must still hold the version's material to test it: pending, current, or a
        // retained previous version (a device that left the plan mid-rotation and came back).
        let live = keys.get(&u.key).is_some_and(|k| {
            k.pending == Some(u.version)
                || k.current == Some(u.version)
                || k.retained_previous().contains(&u.version)
        });
        let listed = dev.keys.iter().any(|dk| dk.key == u.key);
        // A pinned key's move back into its pinned keyslot adds a version that the rotation's
        // temporary keyslot holds: that leftover is tested even though a record holds the
        // version (the pin cannot be enrolled while it stays unrecorded).
        let pin = dev
            .keys
            .iter()
            .any(|dk| dk.key == u.key && dk.keyslot == Some(u.slot));
        let held = !pin
            && (st.slots_of(&u.key).iter().any(|(_, v)| *v == u.version)
                || found
                    .iter()
                    .any(|a| a.key == u.key && a.version == u.version));
        if !live || !listed || held || origins.contains_key(&u.key) {
            continue;
        }
        if !candidates(st, None, found).contains(&u.slot) {
            continue;
        }
        let what = format!(
            "{} v{}, which an unfinished add of an earlier run was writing to keyslot {}, opens it",
            u.key, u.version, u.slot
        );
        if first_opening(plan, world, dev, st, &u.key, u.version, &[u.slot], &what)?.is_some() {
            tracing::info!(device = %dev.id, key = %u.key, version = u.version, slot = u.slot, "an unfinished add of an earlier run left an unrecorded keyslot that its version opens: adopting it");
            found.push(Adoption {
                slot: u.slot,
                key: u.key.clone(),
                version: u.version,
                salt: st.header.keyslots[&u.slot].salt.clone(),
                resalted: false,
            });
        }
    }
    Ok(())
}

/// The first of `slots` of device `dev` (`st`) that version `version` of key `key` opens,
/// testing them in order with the passphrase fetched once from the key's KMS (one PBKDF run
/// per keyslot tested, cryptsetup `open --test-passphrase --key-slot`). `None` when none opens.
///
/// Errors: a KMS that cannot give the passphrase, or a cryptsetup failure: a finding naming the
/// device and saying what was being tested (`what`, "k v2 opens …").
#[allow(clippy::too_many_arguments)]
fn first_opening(
    plan: &Plan,
    world: &World,
    dev: &Device,
    st: &DeviceState,
    key: &str,
    version: u64,
    slots: &[u32],
    what: &str,
) -> Result<Option<u32>, Finding> {
    let failed = |e: String| {
        Finding::at(
            vec![PathSeg::Key("devices".into()), PathSeg::Key(dev.id.clone())],
            format!("device {}: testing whether {what} failed: {e}", dev.id),
            None,
        )
    };
    let Some(spec) = plan.keys.get(key) else {
        return Ok(None);
    };
    let kms = world
        .kms_for(plan, key)
        .map_err(|e| failed(e.to_string()))?;
    let pass = kms
        .get(&spec.name, version)
        .map_err(|e| failed(e.to_string()).unreachable())?;
    for &slot in slots {
        if world
            .luks
            .test_passphrase(&st.path, slot, &pass)
            .map_err(|e| failed(e.to_string()))?
        {
            return Ok(Some(slot));
        }
    }
    Ok(None)
}

/// What [`probe`] would test first on device `dev` (`st`), without testing it: the first
/// listed key whose current version no record holds, with the keyslots it may adopt. `None`
/// when there is nothing to test.
pub(super) fn untested(
    dev: &Device,
    st: &DeviceState,
    keys: &BTreeMap<String, KeyState>,
    origins: &BTreeMap<String, Vec<Origin>>,
) -> Option<Untested> {
    dev.keys.iter().find_map(|dk| {
        let version = to_test(&dk.key, st, keys, origins)?;
        let slots = candidates(st, dk.keyslot, &[]);
        (!slots.is_empty()).then(|| Untested {
            key: dk.key.clone(),
            version,
            slots,
        })
    })
}

/// A possible adoption not tested ([`untested`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Untested {
    /// The key id.
    pub key: String,
    /// Its current KMS version, which no record of the device holds.
    pub version: u64,
    /// The keyslots it may open, in the order [`probe`] tests them.
    pub slots: Vec<u32>,
}

/// The current version of key `key` to test against `st`'s unrecorded keyslots: `None` when
/// the key has no current version, a record already holds it, or the key moved from another
/// KMS (the migration handles it).
fn to_test(
    key: &str,
    st: &DeviceState,
    keys: &BTreeMap<String, KeyState>,
    origins: &BTreeMap<String, Vec<Origin>>,
) -> Option<u64> {
    let c = keys.get(key).and_then(|k| k.current)?;
    let recorded = st.slots_of(key).iter().any(|(_, v)| *v == c);
    (!recorded && !origins.contains_key(key)).then_some(c)
}

/// The keyslots of `st` a key pinned to `pin` (if any) may adopt, in the order to test them:
/// the pin, keyslot 0, then the others ascending.
fn candidates(st: &DeviceState, pin: Option<u32>, taken: &[Adoption]) -> Vec<u32> {
    let mut out: Vec<u32> = st
        .header
        .keyslots
        .iter()
        .filter(|(_, k)| k.bound && k.priority != Priority::Ignore)
        .map(|(n, _)| *n)
        .filter(|n| !st.records.iter().any(|r| r.slot == *n))
        .filter(|n| !taken.iter().any(|a| a.slot == *n))
        .collect();
    let first = |n: u32| u8::from(Some(n) != pin) * 2 + u8::from(n != 0);
    out.sort_by_key(|n| (first(*n), *n));
    out
}
