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

use std::collections::BTreeMap;

use super::{DeviceState, Origin};
use crate::error::Finding;
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
    /// The KMS version that opened it (the key's current version).
    pub version: u64,
    /// The keyslot's KDF salt when it was tested (the adopt step checks it is unchanged).
    pub salt: String,
}

/// The keyslots of `st` (device `dev` of `plan`) that the current KMS versions of its listed
/// keys open, testing each key whose current version no valid record of the device holds.
/// Keys that moved to another KMS (their records name an origin) are left to the migration.
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
        let failed = |e: String| {
            Finding::at(
                vec![PathSeg::Key("devices".into()), PathSeg::Key(dev.id.clone())],
                format!(
                    "device {}: testing whether {} v{c} opens one of its keyslots failed: {e}",
                    dev.id, dk.key
                ),
                None,
            )
        };
        let key = &plan.keys[&dk.key];
        let kms = world
            .kms_for(plan, &dk.key)
            .map_err(|e| failed(e.to_string()))?;
        let pass = kms
            .get(&key.name, c)
            .map_err(|e| failed(e.to_string()).unreachable())?;
        for slot in candidates {
            if world
                .luks
                .test_passphrase(&st.path, slot, &pass)
                .map_err(|e| failed(e.to_string()))?
            {
                tracing::info!(device = %dev.id, key = %dk.key, version = c, slot, "the KMS's current version opens an unrecorded keyslot: adopting it");
                found.push(Adoption {
                    slot,
                    key: dk.key.clone(),
                    version: c,
                    salt: st.header.keyslots[&slot].salt.clone(),
                });
                break;
            }
        }
    }
    Ok(found)
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
