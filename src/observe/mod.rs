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
use crate::luks::{Cryptsetup, Header, LuksError, LuksVersion, Priority};
use crate::secret::Passphrase;
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
    /// Why the device cannot be written (immutable or read-only file, read-only filesystem or
    /// block device, no permission); `None` when it can. Only a problem when a change is
    /// planned on it.
    pub read_only: Option<String>,
    /// LUKS2: `(json_size, used)` of the JSON metadata area in bytes (`used` an upper bound,
    /// see [`crate::luks::Header::json_area`]); `None` for LUKS1.
    pub json_area: Option<(u64, u64)>,
    /// Why the device's `enroll_with` passphrase cannot enroll a key: set only when observing
    /// found that enrolling needs it (no keyplan keyslot opens the device) and testing it
    /// failed (it opens no bound keyslot). One PBKDF run or more; `None` otherwise.
    pub enroll_with_problem: Option<String>,
    /// The keyslot the `enroll_with` passphrase opened when observing tested it (see
    /// `enroll_with_problem`), so the enrolling `luksAddKey` can name it and derive once instead
    /// of trying keyslots; `None` when it was not tested, or cryptsetup did not say which.
    pub enroll_with_keyslot: Option<u32>,
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
    /// Keys the plan moved to another KMS (migration): by key id, every other `(KMS
    /// instance, name)` that valid records of the key name, with that KMS's state of the key.
    pub origins: BTreeMap<String, Vec<Origin>>,
    /// Observation time, Unix seconds.
    pub now: u64,
}

/// Where keyslot records say a key's versions lived before the plan moved the key to another
/// KMS instance or name (migration, see `diff`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// KMS instance name the records name.
    pub kms: String,
    /// Name of the key in that KMS.
    pub name: String,
    /// That KMS's state of the key; `None` when the instance is no longer in the plan (it
    /// cannot be reached, so the migration cannot be planned).
    pub state: Option<KeyState>,
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
    /// Errors: the state directory exists but is not a directory; a KMS provider that is not
    /// available, reported at its plan-file location.
    pub fn open(plan: &Plan) -> Result<World, miette::Report> {
        // A `state_dir` written in the plan was checked when it was loaded; this catches
        // `--state-dir`, which replaces it afterwards.
        if let Ok(m) = std::fs::metadata(&plan.state_dir) {
            if !m.is_dir() {
                return Err(miette!(
                    help = format!(
                        "move the file {} out of the way, or choose another directory with `--state-dir` (or `state_dir` in the plan)",
                        plan.state_dir.display()
                    ),
                    "the state directory {} exists but is not a directory; nothing was changed",
                    plan.state_dir.display()
                ));
            }
        }
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
                self.import_record(dev, slot, record).map(|_| ())
            }
            LuksVersion::Luks1 => self.write_luks1_record(dev, header, slot, record),
        }
    }

    /// Like [`World::write_record`], but never leaves `slot` without a record, even when cut
    /// short: LUKS2 imports the new token first and then removes the keyslot's other keyplan
    /// tokens; LUKS1 rewrites the record file atomically. Used when a record changes while its
    /// keyslot stays (migration to another KMS).
    ///
    /// Errors: as [`World::write_record`].
    pub fn replace_record(
        &self,
        dev: &Path,
        header: &Header,
        slot: u32,
        record: &SlotRecord,
    ) -> Result<(), String> {
        match header.version {
            LuksVersion::Luks2 => {
                let new_id = self.import_record(dev, slot, record)?;
                for r in self.read_records(header)? {
                    if r.slot == slot {
                        if let Some(id) = r.token_id.filter(|id| *id != new_id) {
                            self.cs.token_remove(dev, id).map_err(|e| e.to_string())?;
                        }
                    }
                }
                Ok(())
            }
            LuksVersion::Luks1 => self.write_luks1_record(dev, header, slot, record),
        }
    }

    fn write_luks1_record(
        &self,
        dev: &Path,
        header: &Header,
        slot: u32,
        record: &SlotRecord,
    ) -> Result<(), String> {
        let mut recs = self.read_luks1(&header.uuid)?;
        recs.device = dev.display().to_string();
        recs.slots.insert(slot, record.clone());
        self.write_luks1(&header.uuid, &recs)
    }

    /// Imports a `keyplan` token recording `record` for `slot`; returns its token id.
    fn import_record(&self, dev: &Path, slot: u32, record: &SlotRecord) -> Result<u32, String> {
        let mut json = serde_json::json!({
            "type": TOKEN_TYPE,
            "keyslots": [slot.to_string()],
            "keyplan_format": 1,
            "slot": slot,
            "key": record.key,
            "version": record.version,
            "salt": record.salt,
        });
        if let (Some((kms, name)), Some(m)) = (&record.entry, json.as_object_mut()) {
            m.insert("kms".into(), kms.clone().into());
            m.insert("name".into(), name.clone().into());
        }
        self.cs.token_import(dev, None, &json).map_err(|e| {
            format!(
                "{e}; keyslot {slot} holds {} v{} but keyplan could not record it (is the LUKS2 JSON metadata area full?)",
                record.key, record.version
            )
        })
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
    // Reading headers is one or two cryptsetup processes per device (a few ms each, no PBKDF):
    // they run on several threads, and the results are judged below in plan order, so the
    // outcome and the order of errors do not depend on timing.
    let listed: Vec<&crate::spec::Device> = plan.devices.values().collect();
    let reads = crate::par::map(&listed, observe_workers(listed.len()), |dev| {
        let header = world.cs.dump(&dev.path);
        let records = header.as_ref().ok().map(|h| world.read_records(h));
        let read_only = header.as_ref().ok().and_then(|_| cannot_write(&dev.path));
        (header, records, read_only)
    });
    for ((id, dev), (header, records, read_only)) in plan.devices.iter().zip(reads) {
        let header = match header {
            Ok(h) => h,
            Err(e) => {
                let (message, help) = dump_error(id, &e);
                errors.push(plan.error_at(
                    &[dev_path(id).as_slice(), &[PathSeg::Key("path".into())]].concat(),
                    message,
                    Some(help),
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
        let records = match records {
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                errors.push(miette!("device {id}: {e}"));
                continue;
            }
            None => continue,
        };
        let json_area = header.json_area;
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
                read_only,
                json_area,
                enroll_with_problem: None,
                enroll_with_keyslot: None,
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
    let origins = match origins(plan, world, &devices) {
        Ok(o) => o,
        Err(e) => return Err(combine(e)),
    };
    for (id, st) in devices.iter_mut() {
        if let Some(dev) = plan.devices.get(id) {
            let here = match plan.location_of(&[
                PathSeg::Key("devices".into()),
                PathSeg::Key(id.clone()),
                PathSeg::Key("enroll_with".into()),
            ]) {
                Some((line, col)) => format!(
                    "device {id} ({}, enroll_with at {}:{line}:{col})",
                    st.path.display(),
                    plan.source_path.display()
                ),
                None => format!("device {id} ({})", st.path.display()),
            };
            st.enroll_with_problem = check_enroll_with(world, dev, st, &keys, &origins, &here);
        }
    }
    // Former devices: in the registry, not in the plan. Read (never written) when present with
    // the same UUID; otherwise listed as unreadable, which keeps every key version.
    let mut former = BTreeMap::new();
    let mut former_unreadable = Vec::new();
    match read_registry(&plan.state_dir) {
        Err(e) => errors.push(miette!(help = "keyplan changed nothing", "{e}")),
        Ok(reg) => {
            // Read on several threads like the plan's devices: a state directory remembers
            // every device a run touched, which can be many more than the plan lists.
            let gone: Vec<(String, RegistryEntry)> = reg
                .devices
                .into_iter()
                .filter(|(uuid, _)| !uuids.contains_key(uuid))
                .collect();
            let reads =
                crate::par::map(
                    &gone,
                    observe_workers(gone.len()),
                    |(uuid, entry)| match world.cs.dump(&entry.path) {
                        Ok(h) if h.uuid.eq_ignore_ascii_case(uuid) => {
                            let records = world.read_records(&h);
                            Ok((h, records))
                        }
                        Ok(h) => Err(format!(
                            "it now holds another LUKS device (UUID {})",
                            h.uuid
                        )),
                        Err(e) => Err(e.to_string()),
                    },
                );
            for ((_, entry), read) in gone.into_iter().zip(reads) {
                let id = if plan.devices.contains_key(&entry.id) {
                    format!("{} (formerly at {})", entry.id, entry.path.display())
                } else {
                    entry.id.clone()
                };
                match read {
                    Ok((header, Ok(records))) => {
                        former.insert(
                            id.clone(),
                            DeviceState {
                                id,
                                path: entry.path,
                                header,
                                records,
                                read_only: None,
                                json_area: None,
                                enroll_with_problem: None,
                                enroll_with_keyslot: None,
                            },
                        );
                    }
                    Ok((_, Err(e))) | Err(e) => former_unreadable.push((id, entry.path, e)),
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
        origins,
        now: crate::clock::now_unix(),
    })
}

/// Threads reading device headers at once: twice the CPUs (each read mostly waits for a
/// cryptsetup child), at most [`MAX_OBSERVE_WORKERS`], at least 1, never more than `devices`.
fn observe_workers(devices: usize) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus * 2).clamp(1, MAX_OBSERVE_WORKERS).min(devices.max(1))
}

/// Upper bound on the threads reading device headers at once (each starts cryptsetup children,
/// which take the device's cryptsetup lock for reading).
const MAX_OBSERVE_WORKERS: usize = 16;

/// Finds, for every key of `plan`, the other `(KMS instance, name)` pairs its valid records
/// on plan devices name, and reads the key there (one KMS read each).
///
/// Errors: an origin KMS that cannot be read, pointing at the key in the plan.
fn origins(
    plan: &Plan,
    world: &World,
    devices: &BTreeMap<String, DeviceState>,
) -> Result<BTreeMap<String, Vec<Origin>>, Vec<miette::Report>> {
    let mut out: BTreeMap<String, Vec<Origin>> = BTreeMap::new();
    let mut errors = Vec::new();
    for (id, key) in &plan.keys {
        let mut seen: Vec<(String, String)> = devices
            .values()
            .flat_map(|d| d.records.iter())
            .filter(|r| r.status == RecordStatus::Valid && r.record.key == *id)
            .filter_map(|r| r.record.entry.clone())
            .filter(|(k, n)| *k != key.kms || *n != key.name)
            .collect();
        seen.sort();
        seen.dedup();
        for (kms_name, name) in seen {
            let state = match world.kms.get(&kms_name) {
                None => None,
                Some(k) => match k.read(&name) {
                    Ok(st) => Some(st),
                    Err(e) => {
                        errors.push(plan.error_at(
                            &[PathSeg::Key("keys".into()), PathSeg::Key(id.clone())],
                            format!("key {id}: its devices record it in KMS {kms_name:?} (as {name:?}), which the plan moved it from: {e}"),
                            None,
                        ));
                        continue;
                    }
                },
            };
            out.entry(id.clone()).or_default().push(Origin {
                kms: kms_name,
                name,
                state,
            });
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The message and help for a device whose header cannot be read.
fn dump_error(id: &str, e: &LuksError) -> (String, String) {
    match e {
        LuksError::Device { path, message } => (
            format!("device {id}: {} {message}", path.display()),
            "correct `path` so it names the LUKS block device or image file (e.g. a /dev/disk/by-partuuid/... link); keyplan changed nothing".to_owned(),
        ),
        LuksError::NotLuks { path } => (
            format!("device {id}: {e}"),
            format!(
                "check `path`: it must name a LUKS1 or LUKS2 container (`cryptsetup isLuks {}` must succeed); keyplan never formats a device",
                path.display()
            ),
        ),
        _ => (
            format!("device {id}: {e}"),
            "check the device and cryptsetup; keyplan changed nothing".to_owned(),
        ),
    }
}

/// Why `path` cannot be written, or `None` when it can. Opens a regular file for writing
/// (writing nothing) and asks sysfs whether a block device is read-only.
fn cannot_write(path: &Path) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path).ok()?;
    if m.file_type().is_block_device() {
        let rdev = m.rdev();
        let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
        let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
        let ro = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/ro")).ok()?;
        return (ro.trim() == "1").then(|| {
            "the block device is read-only (`blockdev --getro` says 1; `blockdev --setrw` makes it writable)".to_owned()
        });
    }
    match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(_) => None,
        Err(e) => Some(format!(
            "it cannot be opened for writing: {e} (an immutable file, see `lsattr` and `chattr -i`; a read-only filesystem; or no write permission for this user)"
        )),
    }
}

/// Tests the `enroll_with` passphrase of `dev` when enrolling will need it, so a wrong one is
/// refused before any key version is staged; `here` names the device in messages. Enrolling
/// needs it when no keyslot keyplan recorded opens the device with a version the KMS has (the
/// current version of a key the device lists, or any `previous` version). Returns the problem, or `None` (passphrase fine,
/// or not needed, or the file missing or empty: the diff reports that without a PBKDF run).
///
/// Costs one PBKDF run when the passphrase opens a bound keyslot of normal priority, one more
/// per `ignore`-priority bound keyslot tried, and, only when it fails, one per unbound keyslot
/// (to say whether it opens only an unbound one). Sets `st.enroll_with_keyslot` to the keyslot
/// it opens, when known.
fn check_enroll_with(
    world: &World,
    dev: &crate::spec::Device,
    st: &mut DeviceState,
    keys: &BTreeMap<String, KeyState>,
    origins: &BTreeMap<String, Vec<Origin>>,
    here: &str,
) -> Option<String> {
    let file = dev.enroll_with.as_ref()?;
    if dev.keys.is_empty() {
        return None;
    }
    let way_in = st
        .records
        .iter()
        .filter(|r| r.status == RecordStatus::Valid)
        .any(|r| {
            let Some(k) = keys.get(&r.record.key) else {
                return false;
            };
            let listed = dev.keys.iter().any(|dk| dk.key == r.record.key);
            let moved = origins.get(&r.record.key).is_some_and(|os| {
                os.iter().any(|o| {
                    r.record.entry.as_ref() == Some(&(o.kms.clone(), o.name.clone()))
                        && o.state.as_ref().and_then(|s| s.current) == Some(r.record.version)
                })
            });
            moved
                || (listed && k.current == Some(r.record.version))
                || k.versions
                    .get(&r.record.version)
                    .is_some_and(|v| v.state == kms::VersionState::Previous)
        });
    if way_in {
        return None;
    }
    let bytes = match std::fs::metadata(file) {
        Ok(m) if m.is_file() && m.len() > 0 && m.len() <= crate::luks::MAX_KEYFILE_BYTES => {
            std::fs::read(file).ok()?
        }
        _ => return None,
    };
    let pass = Passphrase::new(bytes);
    let path = &st.path;
    let shown = file.display();
    let failed = |e: LuksError| -> String {
        format!("{here}: testing the enroll_with passphrase in {shown} failed: {e}")
    };
    match world.cs.test_any_keyslot(path, &pass).map_err(failed) {
        Ok(crate::luks::AnyKeyslot::Keyslot(n)) => {
            st.enroll_with_keyslot = Some(n);
            return None;
        }
        Ok(crate::luks::AnyKeyslot::Unknown) => return None,
        Ok(crate::luks::AnyKeyslot::Fails) => {}
        Err(m) => return Some(m),
    }
    let bound: Vec<u32> = st
        .header
        .keyslots
        .iter()
        .filter(|(_, k)| k.bound)
        .map(|(n, _)| *n)
        .collect();
    for (n, _) in st
        .header
        .keyslots
        .iter()
        .filter(|(_, k)| k.bound && k.priority == Priority::Ignore)
    {
        match world.cs.test_passphrase(path, *n, &pass).map_err(failed) {
            Ok(true) => {
                st.enroll_with_keyslot = Some(*n);
                return None;
            }
            Ok(false) => {}
            Err(m) => return Some(m),
        }
    }
    let list = |v: &[u32]| {
        v.iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let check = format!(
        "`cryptsetup open --test-passphrase --key-file {shown} {}` must succeed",
        path.display()
    );
    for (n, _) in st.header.keyslots.iter().filter(|(_, k)| !k.bound) {
        if let Ok(true) = world.cs.test_passphrase(path, *n, &pass) {
            return Some(format!(
                "{here}: the enroll_with passphrase in {shown} opens only keyslot {n}, which is unbound (not assigned to the data segment: it cannot open the data), so it cannot enroll a key; nothing was changed and no key version was staged. Point enroll_with at the passphrase of a bound keyslot ({}); {check}",
                if bound.is_empty() { "there is none".to_owned() } else { format!("keyslot {}", list(&bound)) }
            ));
        }
    }
    Some(if bound.is_empty() {
        format!(
            "{here}: the device has no bound keyslot at all, so the enroll_with passphrase in {shown} cannot enroll a key; nothing was changed and no key version was staged. Restore the header from a backup"
        )
    } else {
        format!(
            "{here}: the enroll_with passphrase in {shown} opens none of its bound keyslots (keyslot {}); keyplan uses the file's bytes exactly, so a trailing newline counts. Nothing was changed and no key version was staged. Put the passphrase that opens the device today in {shown}: {check}",
            list(&bound)
        )
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
