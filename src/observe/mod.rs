//! Observed state: what the LUKS headers, keyplan's records and the KMSs say now.
//!
//! [`observe`] reads every device of the plan (its header through the cryptsetup driver, its
//! records through the [`crate::world::RecordStore`]), every key's versions in its KMS, the
//! KMSs a moved key's records still name ([`Origin`]), and the devices that left the plan but
//! are still remembered by the state directory's registry. It writes nothing and costs no
//! PBKDF run, except for testing an `enroll_with` passphrase when a device can be enrolled no
//! other way ([`enroll`]).
//!
//! Layout: `devices` reads and judges the plan's devices, `keys` reads the KMSs and finds
//! migration origins and the entries earlier moves kept, `former` reads the registry's
//! devices, `adopt` finds unrecorded keyslots a key's current version opens, `enroll` tests
//! `enroll_with`, `holders` recognises this plan's own former KMS holder records.

mod adopt;
mod devices;
mod enroll;
mod former;
mod holders;
mod keys;
mod rename;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::finding::Finding;
use crate::kms::KeyState;
use crate::luks::Header;
use crate::spec::{PathSeg, Plan};
use crate::world::{RecordObs, RecordStatus, SlotRecord, World};

pub use adopt::{Adoption, Untested};
pub use devices::Unavailable;
#[cfg(test)]
pub(crate) use enroll::examine as examine_enroll_file;
pub use enroll::EnrollFile;
pub use holders::{former_holder, plan_uuids, unbacked_own};
#[cfg(test)]
pub(crate) use keys::moved_from;

/// One device as observed.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceState {
    /// Device id from the plan.
    pub id: String,
    /// Device path.
    pub path: PathBuf,
    /// Parsed header.
    pub header: Header,
    /// keyplan records, by keyslot.
    pub records: Vec<RecordObs>,
    /// Why the device cannot be written (immutable or read-only file, read-only filesystem or
    /// block device, no permission); `None` when it can. Only a problem when a change is
    /// planned on it.
    pub read_only: Option<String>,
    /// Why the device's `enroll_with` passphrase cannot enroll a key: set only when observing
    /// found that enrolling needs it (no keyplan keyslot opens the device) and testing it
    /// failed (it opens no bound keyslot). One PBKDF run or more; `None` otherwise.
    pub enroll_with_problem: Option<String>,
    /// The keyslot the `enroll_with` passphrase opened when observing tested it (see
    /// `enroll_with_problem`), so the enrolling `luksAddKey` can name it and derive once instead
    /// of trying keyslots; `None` when it was not tested, or cryptsetup did not say which.
    pub enroll_with_keyslot: Option<u32>,
    /// What the device's `enroll_with` file is, from its metadata (no read, no PBKDF); `None`
    /// when the plan names no `enroll_with` for the device.
    pub enroll_with_file: Option<EnrollFile>,
    /// Unrecorded keyslots the current version of a listed key opens (tested: one PBKDF run
    /// each try, see [`adopt`]), to be recorded rather than enrolled again. Empty when not
    /// tested ([`Testing::HeadersOnly`]).
    pub adoptable: Vec<Adoption>,
    /// With [`Testing::HeadersOnly`]: what [`Testing::Passphrases`] would test for adoption
    /// (no PBKDF run here), so `status` can say a device may be waiting to be adopted.
    pub adoption_untested: Option<Untested>,
    /// Keyslots keyplan did not make that opened with a key version when it retired that
    /// version, and that still have the KDF salt they had then (`world::copies`): the retired
    /// key still opens the device there. From the state directory; no PBKDF run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired_copies: Vec<crate::world::copies::RetiredCopy>,
}

impl DeviceState {
    /// A device as read, with nothing tested yet (`read_only`, `enroll_with_*` unset).
    pub fn new(id: &str, path: PathBuf, header: Header, records: Vec<RecordObs>) -> DeviceState {
        DeviceState {
            id: id.to_string(),
            path,
            header,
            records,
            read_only: None,
            enroll_with_problem: None,
            enroll_with_keyslot: None,
            enroll_with_file: None,
            adoptable: Vec::new(),
            adoption_untested: None,
            retired_copies: Vec::new(),
        }
    }

    /// The valid record of `slot`, if any.
    pub fn record(&self, slot: u32) -> Option<&SlotRecord> {
        self.records
            .iter()
            .find(|r| r.slot == slot && r.status == RecordStatus::Valid)
            .map(|r| &r.record)
    }

    /// `(slot, version)` of every valid record of `key`, by keyslot number.
    pub fn slots_of(&self, key: &str) -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> = self
            .records
            .iter()
            .filter(|r| r.status == RecordStatus::Valid && r.record.key == key)
            .map(|r| (r.slot, r.record.version))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Keyslot numbers not in use, ascending.
    pub fn free_slots(&self) -> Vec<u32> {
        (0..self.header.version.max_keyslots())
            .filter(|s| !self.header.keyslots.contains_key(s))
            .collect()
    }
}

/// Everything observed for a plan.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Observed {
    /// Devices by id.
    pub devices: BTreeMap<String, DeviceState>,
    /// KMS state by key id.
    pub keys: BTreeMap<String, KeyState>,
    /// Devices keyplan worked on in earlier runs that are no longer in the plan but still
    /// present (same path, same LUKS UUID), by their former id. keyplan never changes them,
    /// but keeps every key version they hold.
    pub former: BTreeMap<String, DeviceState>,
    /// Devices keyplan worked on in earlier runs, no longer in the plan, that cannot be read
    /// now (offline, moved, damaged): `(former id, path, why)`. Nobody knows which versions
    /// they hold, so no version of any key is destroyed while this list is not empty.
    pub former_unreadable: Vec<(String, PathBuf, String)>,
    /// Keys the plan moved to another KMS (migration): by key id, every other `(KMS
    /// instance, name)` that valid records of the key name, with that KMS's state of the key.
    pub origins: BTreeMap<String, Vec<Origin>>,
    /// Observation time, Unix seconds ([`crate::clock::now_unix`]).
    pub now: u64,
    /// With [`Testing::Passphrases`]: what this plan's own journal says it staged
    /// ([`crate::journal::staged_versions`]), for [`crate::diff::DiffOptions::staged_here`].
    /// Empty with [`Testing::HeadersOnly`], or when the journal cannot be read (the planner
    /// then refuses a pending creation it cannot prove its own: the safe side).
    #[serde(default)]
    pub staged_here: BTreeSet<(String, Option<u64>)>,
    /// Devices of the plan that cannot be used now (gone, unreadable, not LUKS, another LUKS
    /// UUID), by id: left out of `devices`; the planner plans around them
    /// ([`devices::Unavailable`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unavailable: BTreeMap<String, Unavailable>,
    /// Holder ids recorded on the plan's keys that are this plan's own former records (its
    /// state directory moved: [`holders`]), with why each is known to be; the planner replaces
    /// them with this plan's id instead of taking them for another plan's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub former_holders: BTreeMap<String, String>,
    /// This host's CPUs and memory, on which the PBKDF parameters cryptsetup writes depend
    /// ([`crate::luks::KdfHost`]); `None` when they could not be read.
    #[serde(default)]
    pub host: Option<crate::luks::KdfHost>,
    /// The KMS entries earlier moves kept for devices outside the move
    /// (`<state_dir>/kept.json`, [`crate::world::kept`]), each with that KMS's state of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<Kept>,
}

/// A KMS entry an earlier move kept ([`crate::world::kept::KeptCopy`]), as observed now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Kept {
    /// The entry as recorded.
    pub copy: crate::world::kept::KeptCopy,
    /// That KMS's state of the entry; `None` when the KMS instance is no longer in the plan
    /// (it cannot be reached: the copy can be neither checked nor destroyed).
    pub state: Option<KeyState>,
}

impl Observed {
    /// Devices keyplan knows of whose keyslots cannot be read now, so nobody knows which key
    /// versions they hold: former devices that cannot be read, and plan devices that cannot be
    /// used ([`Observed::unavailable`]), as `(id, path, why)`. While there is one, no version
    /// of any key is destroyed and no holder record released.
    pub fn unknown_holders(&self) -> Vec<(String, PathBuf, String)> {
        self.unavailable
            .iter()
            .map(|(id, u)| (id.clone(), u.path.clone(), u.why.clone()))
            .chain(self.former_unreadable.iter().cloned())
            .collect()
    }
}

/// Where keyslot records say a key's versions lived before the plan moved the key to another
/// KMS instance or name (migration, see `diff`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Origin {
    /// KMS instance name the records name.
    pub kms: String,
    /// Name of the key in that KMS.
    pub name: String,
    /// That KMS's state of the key; `None` when the instance is no longer in the plan (it
    /// cannot be reached, so the migration cannot be planned).
    pub state: Option<KeyState>,
    /// What the entry the plan moves the key to already holds, when that KMS holds a current
    /// or pending version of it while this origin still holds a current version; `None`
    /// otherwise (nothing there yet, or the origin no longer holds the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupant: Option<Occupant>,
}

/// The version an entry already holds in the KMS a key moves to ([`Origin::occupant`]),
/// compared by material (no material kept) with the key's versions in the origin: an earlier,
/// interrupted run's copy, or a foreign entry that the move must not take for the key.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Occupant {
    /// The destination's version compared: its current version, else its pending one.
    pub version: u64,
    /// Whether `version` is pending there (staged, not committed).
    pub pending: bool,
    /// The origin's version (current or previous) with the same material, `None` when none
    /// has: the entry is not this key's.
    pub copy_of: Option<u64>,
}

/// Whether [`observe`] may test passphrases (PBKDF runs) or only reads headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Testing {
    /// Test what planning needs (`plan`, `apply`, `verify`): a listed key's current version
    /// against the unrecorded keyslots it may open ([`adopt`]), and a device's `enroll_with`
    /// passphrase when enrolling needs it, so a wrong one is refused before anything is staged.
    Passphrases,
    /// Read headers, records and KMSs only (`status`: no PBKDF run).
    HeadersOnly,
}

/// Reads every device header, keyplan's records and every key's KMS state, then the devices
/// the registry remembers. Writes nothing. No PBKDF run, except with [`Testing::Passphrases`]
/// for keyslots to adopt ([`adopt`]) and an `enroll_with` passphrase that enrolling needs
/// ([`enroll`]).
///
/// Errors: the [`Finding`]s, all collected, each pointing at the plan file where it can: a
/// device missing, not LUKS, or with an unexpected UUID; two devices with the same LUKS UUID;
/// a pinned keyslot out of range for the device's LUKS version; unreadable records; a KMS that
/// cannot be read; a corrupt registry.
pub fn observe(plan: &Plan, world: &World, testing: Testing) -> Result<Observed, Vec<Finding>> {
    let mut findings: Vec<Finding> = Vec::new();
    let devices::Read {
        mut devices,
        unavailable,
        uuids,
    } = devices::read(plan, world, &mut findings);
    let keys = keys::read(plan, world, &mut findings);
    if !findings.is_empty() {
        return Err(findings);
    }
    rename::apply(plan, &mut devices);
    let origins = keys::origins(plan, world, &devices, &keys)?;
    if let Err(f) = retired_copies(plan, &mut devices) {
        return Err(vec![f]);
    }
    if testing == Testing::HeadersOnly {
        for (id, st) in devices.iter_mut() {
            if let Some(dev) = plan.devices.get(id) {
                st.adoption_untested = adopt::untested(dev, st, &keys, &origins);
            }
        }
    }
    let mut staged_here = BTreeSet::new();
    if testing == Testing::Passphrases {
        // One read of the journal: the versions this plan staged, and the adds that started
        // and never finished (their keyslots may hold a version no record names, `adopt`).
        // An unreadable journal adopts nothing from it and proves no creation this plan's own.
        let records = crate::journal::read(&plan.state_dir).unwrap_or_default();
        staged_here = crate::journal::staged_versions(&records);
        let unfinished = crate::journal::unfinished_adds(&records);
        for (id, st) in devices.iter_mut() {
            let Some(dev) = plan.devices.get(id) else {
                continue;
            };
            match adopt::probe(plan, world, dev, st, &keys, &origins, &unfinished) {
                Ok(a) => st.adoptable = a,
                Err(f) => findings.push(f),
            }
            let here = enroll::device_here(plan, id, st);
            st.enroll_with_problem = enroll::check(world, dev, st, &keys, &origins, &here);
        }
        if !findings.is_empty() {
            return Err(findings);
        }
    }
    let (former, former_unreadable) =
        former::read(plan, world, &uuids, &unavailable, &mut findings);
    if !findings.is_empty() {
        return Err(findings);
    }
    let kept = keys::kept(plan, world)?;
    let former_holders = holders::own_former(plan, &keys, &devices);
    findings.extend(holders::unbacked_findings(plan, &keys, &devices, &kept));
    if !findings.is_empty() {
        return Err(findings);
    }
    Ok(Observed {
        former_holders,
        unavailable,
        devices,
        keys,
        former,
        former_unreadable,
        origins,
        now: crate::clock::now_unix(),
        staged_here,
        host: crate::luks::KdfHost::this(),
        kept,
    })
}

/// Attaches to each device the copies of retired versions the state directory recorded
/// (`world::copies`) whose keyslot is still there with the same salt. A corrupt record is
/// logged and skipped: it only ever adds a report. A record of a newer format is a [`Finding`]:
/// `apply` would write it (a rotation's copy search), so nothing may run before a keyplan that
/// reads it does (docs/formats.md).
fn retired_copies(plan: &Plan, devices: &mut BTreeMap<String, DeviceState>) -> Result<(), Finding> {
    let copies = match crate::world::copies::read(&plan.state_dir) {
        Ok(c) => c,
        Err(e @ crate::world::copies::CopiesError::Newer(_)) => {
            return Err(Finding::bare(
                e.to_string(),
                Some("keyplan changed nothing; plan and apply stop until a keyplan that reads this file runs".into()),
            ));
        }
        Err(e) => {
            tracing::warn!("{e}");
            return Ok(());
        }
    };
    for st in devices.values_mut() {
        let uuid = st.header.uuid.to_lowercase();
        st.retired_copies = copies
            .iter()
            .filter(|c| c.uuid == uuid)
            .filter(|c| {
                st.header
                    .keyslots
                    .get(&c.slot)
                    .is_some_and(|k| k.salt == c.salt)
            })
            .cloned()
            .collect();
    }
    Ok(())
}

/// `devices.<id>` as a path into the plan document.
fn device_path(id: &str) -> Vec<PathSeg> {
    vec![PathSeg::Key("devices".into()), PathSeg::Key(id.to_string())]
}

/// Threads reading device headers at once: twice the CPUs (each read mostly waits for a
/// cryptsetup child), at most [`MAX_OBSERVE_WORKERS`] and what the LUKS door asks for
/// ([`crate::luks::LuksDoor::read_parallelism`]), at least 1, never more than `devices`.
fn observe_workers(world: &World, devices: usize) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus * 2)
        .clamp(1, MAX_OBSERVE_WORKERS)
        .min(world.luks.read_parallelism().max(1))
        .min(devices.max(1))
}

/// Upper bound on the threads reading device headers at once (each starts cryptsetup children,
/// which take the device's cryptsetup lock for reading).
const MAX_OBSERVE_WORKERS: usize = 16;

/// Whether this plan's own holder record of key `key_id` (`st`, the key as read) is backed by
/// none of its devices ([`unbacked_own`]), reading the plan's device headers and keyplan's
/// records on them (no PBKDF, no KMS). For `keyplan key release` of such a record.
pub fn own_record_unbacked(
    plan: &Plan,
    world: &World,
    key_id: &str,
    st: &crate::kms::KeyState,
) -> bool {
    let mut findings = Vec::new();
    let read = devices::read(plan, world, &mut findings);
    unbacked_own(plan, key_id, st, &read.devices)
}

/// The `(KMS instance, name)` entries other than its own in the plan that valid keyplan
/// records of key `key_id` on the plan's devices name: where a move the plan asks for (a
/// changed `kms:` or `name:`) that `apply` has not finished says the key's versions are.
/// Sorted, each once; empty when the records name only the plan's entry. Reads the headers
/// and keyplan's records of the devices that list the key (no PBKDF, no KMS); devices that
/// cannot be read are left out.
///
/// Also says whether a valid record already names the plan's own entry: a move that reached
/// those devices (copied, verified, re-recorded), so the plan's entry holds what they need.
pub fn recorded_elsewhere(
    plan: &Plan,
    world: &World,
    key_id: &str,
) -> (Vec<(String, String)>, bool) {
    let Some(key) = plan.keys.get(key_id) else {
        return (Vec::new(), false);
    };
    let mut listing = plan.clone();
    listing
        .devices
        .retain(|_, d| d.keys.iter().any(|k| k.key == key_id));
    let mut findings = Vec::new();
    let mut read = devices::read(&listing, world, &mut findings);
    rename::apply(&listing, &mut read.devices);
    let here = read
        .devices
        .values()
        .flat_map(|d| d.records.iter())
        .any(|r| {
            r.status == crate::world::RecordStatus::Valid
                && r.record.key == key.id
                && r.record.entry.as_ref() == Some(&(key.kms.clone(), key.name.clone()))
        });
    (keys::moved_from(key, &read.devices), here)
}
