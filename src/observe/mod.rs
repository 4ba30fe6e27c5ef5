//! Observed state: what the LUKS headers and the KMSs say now.
//!
//! keyplan records which key version each keyslot holds, together with the keyslot's KDF salt:
//! in a LUKS2 token of type `keyplan` (one per keyslot), or for LUKS1 (no tokens) in
//! `<state_dir>/luks1/<LUKS UUID>.json`. A record whose keyslot is gone, or whose salt no longer
//! matches the header, is drift: the keyslot was killed or rewritten outside keyplan. Reading
//! all this costs no PBKDF run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use miette::miette;
use serde::{Deserialize, Serialize};

use crate::fsutil;
use crate::kms::{self, KeyState, Kms};
use crate::luks::{Cryptsetup, Header, LuksVersion};
use crate::spec::{PathSeg, Plan};

/// LUKS2 token type keyplan writes.
pub const TOKEN_TYPE: &str = "keyplan";

/// What keyplan recorded about one keyslot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRecord {
    /// Key id from the plan.
    pub key: String,
    /// KMS version held by the keyslot.
    pub version: u64,
    /// The keyslot's KDF salt when keyplan wrote it.
    pub salt: String,
    /// Where the version lives: `(KMS instance, name in the KMS)`. Lets retention recognize a
    /// keyslot whose key id was renamed in the plan. `None` in records written before it was
    /// added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<(String, String)>,
}

impl SlotRecord {
    /// True when this record holds a version of the plan key `key` (same id, or same KMS
    /// instance and name).
    pub fn is_of(&self, key: &crate::spec::Key) -> bool {
        self.key == key.id
            || self
                .entry
                .as_ref()
                .is_some_and(|(kms, name)| *kms == key.kms && *name == key.name)
    }
}

/// Whether a record still describes its keyslot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordStatus {
    /// Keyslot present with the recorded salt.
    Valid,
    /// The keyslot no longer exists (killed outside keyplan).
    KeyslotGone,
    /// The keyslot exists with another salt (rewritten outside keyplan).
    Rewritten,
    /// `plan --verify` found that the recorded version does not open the keyslot.
    FailedVerify,
}

/// A record as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordObs {
    /// Keyslot the record names.
    pub slot: u32,
    /// The record.
    pub record: SlotRecord,
    /// LUKS2 token id holding it (None for LUKS1 records).
    pub token_id: Option<u32>,
    /// Drift status.
    pub status: RecordStatus,
}

/// One device as observed.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceState {
    /// Device id from the plan.
    pub id: String,
    /// Device path.
    pub path: PathBuf,
    /// Parsed header.
    pub header: Header,
    /// keyplan records, by keyslot.
    pub records: Vec<RecordObs>,
}

impl DeviceState {
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
#[derive(Debug, Clone)]
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
    /// Observation time, Unix seconds.
    pub now: u64,
}

/// File name of the device registry in the state directory.
pub const REGISTRY_FILE: &str = "devices.json";

/// One device keyplan has worked on, keyed by LUKS UUID in `<state_dir>/devices.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryEntry {
    /// Device id in the plan when keyplan last worked on it.
    pub id: String,
    /// Device path then.
    pub path: PathBuf,
}

/// `<state_dir>/devices.json`: every device a run has touched, by LUKS UUID (lower case).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registry {
    /// Format version (1).
    pub format: u32,
    /// LUKS UUID -> entry.
    pub devices: BTreeMap<String, RegistryEntry>,
}

/// Reads `<state_dir>/devices.json`; an empty registry when the file does not exist.
///
/// Errors: the file exists but cannot be read or parsed (it is never guessed at: a lost
/// registry could let a rotation destroy a version an absent device still needs).
pub fn read_registry(state_dir: &Path) -> Result<Registry, String> {
    let path = state_dir.join(REGISTRY_FILE);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| {
            format!(
                "{} is corrupt ({e}); keyplan will not guess which devices it worked on. Restore it from a backup, or fix it by hand: {{\"format\":1,\"devices\":{{\"<LUKS UUID>\":{{\"id\":\"<device id>\",\"path\":\"<path>\"}}}}}}",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Registry {
            format: 1,
            devices: BTreeMap::new(),
        }),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

/// Adds every observed device to `<state_dir>/devices.json` (atomically, mode 0600), keeping
/// entries of devices no longer in the plan, so later rotations keep what they hold.
///
/// Errors: the registry is corrupt, or could not be written.
pub fn update_registry(state_dir: &Path, observed: &Observed) -> Result<(), String> {
    let mut reg = read_registry(state_dir)?;
    reg.format = 1;
    for (id, d) in &observed.devices {
        reg.devices.insert(
            d.header.uuid.to_lowercase(),
            RegistryEntry {
                id: id.clone(),
                path: d.path.clone(),
            },
        );
    }
    let mut text = serde_json::to_vec_pretty(&reg).map_err(|e| e.to_string())?;
    text.push(b'\n');
    fsutil::ensure_private_dir(state_dir)
        .and_then(|()| fsutil::write_atomic(&state_dir.join(REGISTRY_FILE), &text, 0o600))
        .map_err(|e| format!("writing {}: {e}", state_dir.join(REGISTRY_FILE).display()))
}

/// The doors to the world: cryptsetup, the KMS instances, the LUKS1 record directory.
pub struct World {
    /// The cryptsetup driver.
    pub cs: Cryptsetup,
    /// KMS instances by name.
    pub kms: BTreeMap<String, Box<dyn Kms>>,
    /// `<state_dir>/luks1`.
    pub luks1_dir: PathBuf,
}

impl World {
    /// Opens every KMS instance of `plan` and finds cryptsetup.
    ///
    /// Errors: a KMS provider that is not available, reported at its plan-file location.
    pub fn open(plan: &Plan) -> Result<World, miette::Report> {
        let mut map = BTreeMap::new();
        for (name, cfg) in &plan.kms {
            let k = kms::open(name, cfg).map_err(|e| {
                plan.error_at(
                    &[PathSeg::Key("kms".into()), PathSeg::Key(name.clone())],
                    e.to_string(),
                    None,
                )
            })?;
            map.insert(name.clone(), k);
        }
        Ok(World {
            cs: Cryptsetup::new(),
            kms: map,
            luks1_dir: plan.state_dir.join("luks1"),
        })
    }

    /// The KMS holding key `key_id` of `plan`.
    ///
    /// Errors: the key or its KMS is not in the plan (cannot happen for a validated plan).
    pub fn kms_for(&self, plan: &Plan, key_id: &str) -> Result<&dyn Kms, String> {
        let key = plan
            .keys
            .get(key_id)
            .ok_or_else(|| format!("key {key_id:?} is not in the plan"))?;
        self.kms
            .get(&key.kms)
            .map(|b| b.as_ref())
            .ok_or_else(|| format!("KMS {:?} of key {key_id:?} is not in the plan", key.kms))
    }

    fn luks1_file(&self, uuid: &str) -> PathBuf {
        self.luks1_dir.join(format!("{uuid}.json"))
    }

    /// Reads keyplan's records for a device whose header is `header`.
    ///
    /// Errors: an unreadable LUKS1 record file.
    pub fn read_records(&self, header: &Header) -> Result<Vec<RecordObs>, String> {
        let raw: Vec<(u32, SlotRecord, Option<u32>)> = match header.version {
            LuksVersion::Luks2 => header
                .tokens
                .values()
                .filter(|t| t.token_type == TOKEN_TYPE)
                .filter_map(|t| {
                    let slot = t.json.get("slot")?.as_u64()?;
                    let entry = match (t.json.get("kms"), t.json.get("name")) {
                        (Some(k), Some(n)) => {
                            Some((k.as_str()?.to_string(), n.as_str()?.to_string()))
                        }
                        _ => None,
                    };
                    let rec = SlotRecord {
                        key: t.json.get("key")?.as_str()?.to_string(),
                        version: t.json.get("version")?.as_u64()?,
                        salt: t.json.get("salt")?.as_str()?.to_string(),
                        entry,
                    };
                    Some((u32::try_from(slot).ok()?, rec, Some(t.id)))
                })
                .collect(),
            LuksVersion::Luks1 => self
                .read_luks1(&header.uuid)?
                .slots
                .into_iter()
                .map(|(s, r)| (s, r, None))
                .collect(),
        };
        Ok(raw
            .into_iter()
            .map(|(slot, record, token_id)| {
                let status = match header.keyslots.get(&slot) {
                    None => RecordStatus::KeyslotGone,
                    Some(ks) if ks.salt != record.salt => RecordStatus::Rewritten,
                    Some(_) => RecordStatus::Valid,
                };
                RecordObs {
                    slot,
                    record,
                    token_id,
                    status,
                }
            })
            .collect())
    }

    fn read_luks1(&self, uuid: &str) -> Result<Luks1Records, String> {
        let path = self.luks1_file(uuid);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| format!("LUKS1 record file {} is corrupt: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Luks1Records::default()),
            Err(e) => Err(format!("reading {}: {e}", path.display())),
        }
    }

    fn write_luks1(&self, uuid: &str, recs: &Luks1Records) -> Result<(), String> {
        let path = self.luks1_file(uuid);
        fsutil::ensure_private_dir(&self.luks1_dir)
            .map_err(|e| format!("creating {}: {e}", self.luks1_dir.display()))?;
        let mut text = serde_json::to_vec_pretty(recs).map_err(|e| e.to_string())?;
        text.push(b'\n');
        fsutil::write_atomic(&path, &text, 0o600)
            .map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// Records that `slot` of `dev` holds `record` (replacing any record of that keyslot).
    /// LUKS2: removes keyplan tokens naming `slot`, then imports a new token; LUKS1: rewrites
    /// the record file.
    ///
    /// Errors: cryptsetup token import failed (e.g. the LUKS2 JSON area is full) or the record
    /// file could not be written.
    pub fn write_record(
        &self,
        dev: &Path,
        header: &Header,
        slot: u32,
        record: &SlotRecord,
    ) -> Result<(), String> {
        match header.version {
            LuksVersion::Luks2 => {
                self.remove_record(dev, header, slot)?;
                let json = serde_json::json!({
                    "type": TOKEN_TYPE,
                    "keyslots": [slot.to_string()],
                    "keyplan_format": 1,
                    "slot": slot,
                    "key": record.key,
                    "version": record.version,
                    "salt": record.salt,
                });
                let json = match (&record.entry, json) {
                    (Some((kms, name)), serde_json::Value::Object(mut m)) => {
                        m.insert("kms".into(), kms.clone().into());
                        m.insert("name".into(), name.clone().into());
                        serde_json::Value::Object(m)
                    }
                    (_, j) => j,
                };
                self.cs.token_import(dev, None, &json).map(|_| ()).map_err(|e| {
                    format!(
                        "{e}; keyslot {slot} holds {} v{} but keyplan could not record it (is the LUKS2 JSON metadata area full?)",
                        record.key, record.version
                    )
                })
            }
            LuksVersion::Luks1 => {
                let mut recs = self.read_luks1(&header.uuid)?;
                recs.device = dev.display().to_string();
                recs.slots.insert(slot, record.clone());
                self.write_luks1(&header.uuid, &recs)
            }
        }
    }

    /// Removes keyplan's record(s) of `slot` of `dev`. Idempotent.
    ///
    /// Errors: cryptsetup token remove failed, or the record file could not be written.
    pub fn remove_record(&self, dev: &Path, header: &Header, slot: u32) -> Result<(), String> {
        match header.version {
            LuksVersion::Luks2 => {
                for r in self.read_records(header)? {
                    if r.slot == slot {
                        if let Some(id) = r.token_id {
                            self.cs.token_remove(dev, id).map_err(|e| e.to_string())?;
                        }
                    }
                }
                Ok(())
            }
            LuksVersion::Luks1 => {
                let mut recs = self.read_luks1(&header.uuid)?;
                if recs.slots.remove(&slot).is_some() {
                    self.write_luks1(&header.uuid, &recs)?;
                }
                Ok(())
            }
        }
    }
}

/// `<state_dir>/luks1/<uuid>.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Luks1Records {
    #[serde(default)]
    device: String,
    #[serde(default)]
    slots: BTreeMap<u32, SlotRecord>,
}

/// Reads every device header and every key's KMS state. No PBKDF, no writes.
///
/// Errors (all collected, each pointing at the plan file): a device missing, not LUKS, or with
/// an unexpected UUID; two devices with the same LUKS UUID; a pinned keyslot out of range for
/// the device's LUKS version; a KMS that cannot be read.
pub fn observe(plan: &Plan, world: &World) -> Result<Observed, miette::Report> {
    let mut errors: Vec<miette::Report> = Vec::new();
    let mut devices = BTreeMap::new();
    let mut uuids: BTreeMap<String, String> = BTreeMap::new();
    let dev_path = |id: &str| [PathSeg::Key("devices".into()), PathSeg::Key(id.to_string())];
    for (id, dev) in &plan.devices {
        let header = match world.cs.dump(&dev.path) {
            Ok(h) => h,
            Err(e) => {
                errors.push(plan.error_at(
                    &[dev_path(id).as_slice(), &[PathSeg::Key("path".into())]].concat(),
                    format!("device {id}: {e}"),
                    Some("check the path; keyplan changed nothing".into()),
                ));
                continue;
            }
        };
        if let Some(want) = &dev.uuid {
            if !want.eq_ignore_ascii_case(&header.uuid) {
                errors.push(plan.error_at(
                    &[dev_path(id).as_slice(), &[PathSeg::Key("uuid".into())]].concat(),
                    format!(
                        "device {id} ({}) has LUKS UUID {}, not {want}: refusing to touch it",
                        dev.path.display(),
                        header.uuid
                    ),
                    Some("is the path pointing at the wrong disk? fix `path` or `uuid`".into()),
                ));
                continue;
            }
        }
        if let Some(other) = uuids.insert(header.uuid.to_lowercase(), id.clone()) {
            errors.push(plan.error_at(
                &dev_path(id),
                format!(
                    "devices {other} and {id} are the same LUKS device (UUID {})",
                    header.uuid
                ),
                Some("list each device once".into()),
            ));
            continue;
        }
        let max = header.version.max_keyslots();
        for (i, k) in dev.keys.iter().enumerate() {
            if let Some(slot) = k.keyslot {
                if slot >= max {
                    errors.push(
                        plan.error_at(
                            &[
                                dev_path(id).as_slice(),
                                &[
                                    PathSeg::Key("keys".into()),
                                    PathSeg::Index(i),
                                    PathSeg::Key("keyslot".into()),
                                ],
                            ]
                            .concat(),
                            format!(
                            "keyslot {slot} is out of range: device {id} is {} with keyslots 0-{}",
                            header.version,
                            max - 1
                        ),
                            Some(format!("pin a keyslot between 0 and {}", max - 1)),
                        ),
                    );
                }
            }
        }
        let records = match world.read_records(&header) {
            Ok(r) => r,
            Err(e) => {
                errors.push(miette!("device {id}: {e}"));
                continue;
            }
        };
        tracing::debug!(
            device = %id,
            "{} {}: {} keyslots, {} keyplan records",
            header.version,
            header.uuid,
            header.keyslots.len(),
            records.len()
        );
        devices.insert(
            id.clone(),
            DeviceState {
                id: id.clone(),
                path: dev.path.clone(),
                header,
                records,
            },
        );
    }
    let mut keys = BTreeMap::new();
    for (id, key) in &plan.keys {
        let res = world
            .kms_for(plan, id)
            .and_then(|k| k.read(&key.name).map_err(|e| e.to_string()));
        match res {
            Ok(st) => {
                keys.insert(id.clone(), st);
            }
            Err(e) => errors.push(plan.error_at(
                &[PathSeg::Key("keys".into()), PathSeg::Key(id.clone())],
                format!("key {id}: {e}"),
                None,
            )),
        }
    }
    if !errors.is_empty() {
        return Err(combine(errors));
    }
    // Former devices: in the registry, not in the plan. Read (never written) when present with
    // the same UUID; otherwise listed as unreadable, which keeps every key version.
    let mut former = BTreeMap::new();
    let mut former_unreadable = Vec::new();
    match read_registry(&plan.state_dir) {
        Err(e) => errors.push(miette!(help = "keyplan changed nothing", "{e}")),
        Ok(reg) => {
            for (uuid, entry) in reg.devices {
                if uuids.contains_key(&uuid) {
                    continue;
                }
                let id = if plan.devices.contains_key(&entry.id) {
                    format!("{} (formerly at {})", entry.id, entry.path.display())
                } else {
                    entry.id.clone()
                };
                let header = match world.cs.dump(&entry.path) {
                    Ok(h) if h.uuid.eq_ignore_ascii_case(&uuid) => h,
                    Ok(h) => {
                        former_unreadable.push((
                            id,
                            entry.path,
                            format!("it now holds another LUKS device (UUID {})", h.uuid),
                        ));
                        continue;
                    }
                    Err(e) => {
                        former_unreadable.push((id, entry.path, e.to_string()));
                        continue;
                    }
                };
                match world.read_records(&header) {
                    Ok(records) => {
                        former.insert(
                            id.clone(),
                            DeviceState {
                                id,
                                path: entry.path,
                                header,
                                records,
                            },
                        );
                    }
                    Err(e) => former_unreadable.push((id, entry.path, e)),
                }
            }
        }
    }
    if !errors.is_empty() {
        return Err(combine(errors));
    }
    Ok(Observed {
        devices,
        keys,
        former,
        former_unreadable,
        now: kms::now_unix(),
    })
}

/// Joins several reports into one (the first, with the others as related diagnostics).
pub fn combine(mut errors: Vec<miette::Report>) -> miette::Report {
    if errors.len() == 1 {
        if let Some(e) = errors.pop() {
            return e;
        }
    }
    let count = errors.len();
    let text: Vec<String> = errors.iter().map(|e| format!("{e:?}")).collect();
    miette!("{count} problems found:\n\n{}", text.join("\n"))
}
