//! The in-memory doors of the deterministic simulation: a LUKS door ([`SimLuks`]) and a KMS
//! ([`SimKms`]) behind the engine's own traits (`keyplan::luks::LuksDoor`, `keyplan::kms::Kms`).
//!
//! They follow what the real-component tests established:
//! - LUKS (cryptsetup 2.6.1, src/luks/driver/mod.rs): a passphrase test of an empty keyslot is
//!   "does not open"; an unbound keyslot with its passphrase opens a `--test-passphrase` of that
//!   keyslot but is never tried without `--key-slot` and cannot unlock a `luksAddKey`;
//!   `luksAddKey` into an occupied keyslot fails (exit 1), with a wrong unlocking passphrase
//!   fails (exit 2), and adds a bound keyslot; `luksKillSlot --batch-mode` with stdin closed
//!   removes any occupied keyslot, **even the last**, and fails (exit 1) on an empty one;
//!   `token import` needs the keyslots it names and, with an id, replaces; `token remove` of
//!   an unused id fails (exit 1); every metadata write raises the epoch. keyplan's own guard
//!   (never the only bound keyslot) is the trait's provided `kill_keyslot`, shared with the
//!   real driver. The differential test (tests/verification/luks_door_differential.rs) checks these against
//!   real images.
//! - KMS: the version rules are `keyplan::kms::book`'s, as every provider applies them; every
//!   write is a read followed by a compare-and-swap write on the key's revision (Vault KV v2
//!   `cas`, the Kubernetes `resourceVersion`), **two door calls**, so another process can
//!   write in between and the write then fails with a conflict, as on the real servers.
//!   Keys live per KMS instance (`World::keys` by `<instance>/<name>`), so a key can move
//!   from one simulated KMS to another. `destroy_key` removes the material of every version
//!   but the current one with its record, then the current version's material in a door call
//!   of its own, as the file KMS removes the file after `meta.json` says destroyed; a
//!   `destroy_key` of a key recorded destroyed finishes what an interrupted one left.
//!
//! Every call goes through [`Sim::door`] (tests/sim/mod.rs): the scheduler's turn, the fault
//! the schedule injects, the effect, and the invariant check.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use keyplan::kms::book::{self, Commit, Destroy, VersionBook};
use keyplan::kms::{KeyState, Kms, KmsError, VersionInfo, VersionState};
use keyplan::luks::{
    AddTarget, AnyKeyslot, Header, Keyslot, LuksDoor, LuksError, LuksVersion, Priority, Token,
};
use keyplan::secret::Passphrase;
use keyplan::spec::PbkdfSettings;

use super::{Call, Sim};

/// One occupied keyslot of an in-memory device.
#[derive(Clone)]
pub struct MemSlot {
    /// The passphrase bytes that open it (test material only).
    pub pass: Vec<u8>,
    /// Bound to the data segment (only bound keyslots open the data).
    pub bound: bool,
    /// Fresh on every write, as a real keyslot's salt.
    pub salt: String,
    /// `ignore` keyslots are skipped when no keyslot is named.
    pub priority: Priority,
    /// When it was written (LUKS2 tries keyslots in the order of the JSON metadata, which is
    /// the order they were added in; LUKS1 in keyslot order).
    pub seq: u64,
}

/// One in-memory LUKS device.
#[derive(Clone)]
pub struct MemDev {
    /// LUKS1 or LUKS2.
    pub version: LuksVersion,
    /// LUKS UUID.
    pub uuid: String,
    /// Occupied keyslots.
    pub slots: BTreeMap<u32, MemSlot>,
    /// LUKS2 tokens (JSON objects as imported).
    pub tokens: BTreeMap<u32, serde_json::Value>,
    /// LUKS2 metadata sequence id.
    pub epoch: u64,
}

impl MemDev {
    /// A device with `pass` in keyslot 0.
    pub fn new(version: LuksVersion, uuid: &str, pass: &[u8], salt: String) -> MemDev {
        let mut d = MemDev {
            version,
            uuid: uuid.to_string(),
            slots: BTreeMap::new(),
            tokens: BTreeMap::new(),
            epoch: 1,
        };
        d.slots.insert(
            0,
            MemSlot {
                pass: pass.to_vec(),
                bound: true,
                salt,
                priority: Priority::Normal,
                seq: 0,
            },
        );
        d
    }

    /// The keyslots in the order cryptsetup tries them without `--key-slot`: LUKS2 those with
    /// priority `prefer` first, each group in the order of the JSON metadata (the order they
    /// were added); LUKS1 by number.
    pub fn try_order(&self) -> Vec<(u32, &MemSlot)> {
        let mut v: Vec<(u32, &MemSlot)> = self.slots.iter().map(|(n, s)| (*n, s)).collect();
        if self.version == LuksVersion::Luks2 {
            v.sort_by_key(|(n, s)| (s.priority != Priority::Prefer, s.seq, *n));
        }
        v
    }

    /// Whether `pass` opens the data through a bound keyslot.
    pub fn opens(&self, pass: &[u8]) -> bool {
        self.slots.values().any(|s| s.bound && s.pass == pass)
    }

    /// The header as keyplan's in-process reader reports it.
    pub fn header(&self) -> Header {
        let luks2 = self.version == LuksVersion::Luks2;
        let tokens: BTreeMap<u32, Token> = self
            .tokens
            .iter()
            .map(|(id, json)| {
                (
                    *id,
                    Token {
                        id: *id,
                        token_type: json["type"].as_str().unwrap_or_default().to_string(),
                        keyslots: token_keyslots(json).unwrap_or_default(),
                        json: json.clone(),
                    },
                )
            })
            .collect();
        let used = 2048
            + self
                .tokens
                .values()
                .map(|t| t.to_string().len() as u64)
                .sum::<u64>();
        Header {
            version: self.version,
            uuid: self.uuid.clone(),
            keyslots: self
                .slots
                .iter()
                .map(|(n, s)| {
                    (
                        *n,
                        Keyslot {
                            bound: s.bound,
                            salt: s.salt.clone(),
                            priority: s.priority,
                            kdf: "pbkdf2".into(),
                            memory_kib: None,
                            iterations: None,
                            parallel: None,
                        },
                    )
                })
                .collect(),
            tokens,
            json_area: luks2.then_some((12288, used)),
            epoch: luks2.then_some(self.epoch),
            pbkdf2_target: ("sha256".into(), Some(512)),
            condition: Default::default(),
        }
    }
}

/// The keyslot numbers of a token's `keyslots` array of decimal strings.
pub fn token_keyslots(json: &serde_json::Value) -> Result<Vec<u32>, String> {
    let obj = json.as_object().ok_or("the token is not a JSON object")?;
    if !obj.get("type").is_some_and(|t| t.is_string()) {
        return Err("the token has no string `type`".into());
    }
    obj.get("keyslots")
        .and_then(|k| k.as_array())
        .ok_or("the token has no `keyslots` array")?
        .iter()
        .map(|k| {
            k.as_str()
                .and_then(|s| s.parse::<u32>().ok())
                .ok_or_else(|| format!("token keyslot {k} is not a decimal string"))
        })
        .collect()
}

/// One key of the in-memory KMS, as the file provider keeps it, plus a revision (the KV
/// version / resourceVersion every write checks and raises).
#[derive(Clone, Default)]
pub struct MemKey {
    /// Current version.
    pub current: Option<u64>,
    /// Pending version.
    pub pending: Option<u64>,
    /// Every version's metadata.
    pub versions: Vec<VersionInfo>,
    /// Holder records.
    pub holders: BTreeMap<String, u64>,
    /// Material by version: what the KMS can still hand out (dropped when retired; after a
    /// `destroy_key` interrupted between its two door calls, the destroyed current version's
    /// material is still here, as a file KMS's `.key` file would be).
    pub material: BTreeMap<u64, Vec<u8>>,
    /// The material of versions retired or destroyed since: the test's own memory (the engine
    /// cannot read it), for invariant I8 (a retired version opens no keyslot unnoticed).
    pub retired: BTreeMap<u64, Vec<u8>>,
    /// Raised by every write.
    pub revision: u64,
}

impl MemKey {
    fn book(&self) -> VersionBook {
        VersionBook::of_entries(self.current, self.pending, &self.versions)
    }
    /// The material of the current version.
    pub fn current_material(&self) -> Option<&[u8]> {
        self.current
            .and_then(|c| self.material.get(&c))
            .map(|m| m.as_slice())
    }
    /// Versions recorded as retired whose material the KMS still holds (none once every
    /// retire and destroy finished).
    pub fn lingering(&self) -> Vec<u64> {
        self.versions
            .iter()
            .filter(|v| v.state == VersionState::Retired && self.material.contains_key(&v.version))
            .map(|v| v.version)
            .collect()
    }
    /// Moves the material of `versions` (all when `None`) to the test's memory of retired
    /// material: the KMS can no longer hand it out.
    fn drop_material(&mut self, versions: Option<&[u64]>) {
        let gone: Vec<u64> = self
            .material
            .keys()
            .copied()
            .filter(|v| versions.is_none_or(|vs| vs.contains(v)))
            .collect();
        for v in gone {
            if let Some(m) = self.material.remove(&v) {
                self.retired.insert(v, m);
            }
        }
    }
}

fn device_missing(dev: &Path) -> LuksError {
    LuksError::Device {
        path: dev.to_owned(),
        message: "No such file or directory (os error 2)".into(),
    }
}

fn refused(operation: &str, dev: &Path, reason: &str) -> LuksError {
    LuksError::Refused {
        operation: operation.to_string(),
        path: dev.to_owned(),
        reason: reason.to_string(),
    }
}

fn failed(operation: &str, dev: &Path, code: i32, stderr: &str) -> LuksError {
    LuksError::Failed {
        operation: operation.to_string(),
        path: dev.to_owned(),
        code,
        stderr: stderr.to_string(),
    }
}

fn check_slot(operation: &str, dev: &Path, slot: u32, max: u32) -> Result<(), LuksError> {
    if slot >= max {
        return Err(refused(
            operation,
            dev,
            &format!("keyslot {slot} is out of range (0-{})", max - 1),
        ));
    }
    Ok(())
}

/// The LUKS door of one simulated keyplan process.
#[derive(Debug, Clone)]
pub struct SimLuks {
    /// The simulation.
    pub sim: Arc<Sim>,
    /// The process this door belongs to.
    pub proc: usize,
}

impl SimLuks {
    fn with_dev<T>(
        &self,
        call: Call,
        dev: &Path,
        f: impl FnOnce(&mut MemDev, &mut u64) -> Result<T, LuksError>,
    ) -> Result<T, LuksError> {
        let path: PathBuf = dev.to_owned();
        self.sim.luks_door(self.proc, call, dev, move |w| {
            let salt = &mut w.salts;
            match w.devices.get_mut(&path) {
                Some(d) => f(d, salt),
                None => Err(device_missing(&path)),
            }
        })
    }
}

fn fresh_salt(counter: &mut u64) -> String {
    *counter += 1;
    format!("sim-salt-{counter}")
}

impl LuksDoor for SimLuks {
    fn dump(&self, dev: &Path) -> Result<Header, LuksError> {
        // The broken variant shows a device that left the plan without keyplan's tokens: the
        // planner no longer sees the version it holds, as a planner that ignores departed
        // devices (`Observed::former`) would not.
        let hide =
            self.sim.variant() == super::Variant::DepartedRecordsHidden && self.sim.departed(dev);
        self.with_dev(Call::read("dump", dev), dev, move |d, _| {
            let mut h = d.header();
            if hide {
                h.tokens.retain(|_, t| t.token_type != "keyplan");
            }
            Ok(h)
        })
    }

    fn test_passphrase(&self, dev: &Path, slot: u32, pass: &Passphrase) -> Result<bool, LuksError> {
        let op = format!("open --test-passphrase of keyslot {slot}");
        if pass.is_empty() {
            return Err(refused(&op, dev, "the passphrase is empty"));
        }
        check_slot(&op, dev, slot, 32)?;
        let pass = pass.expose().to_vec();
        self.sim.pbkdf(1);
        let lies = self.sim.variant() == super::Variant::VerifyLies;
        self.with_dev(Call::read("test", dev).slot(slot), dev, move |d, _| {
            check_slot(&op, dev, slot, d.version.max_keyslots())?;
            // The broken variant lies only where keyplan verifies: a keyslot its record
            // (LUKS2 token) names; adoption tests unrecorded keyslots, which stay honest.
            let recorded = d
                .tokens
                .values()
                .any(|t| t["type"] == "keyplan" && t["slot"].as_u64() == Some(u64::from(slot)));
            Ok(d.slots
                .get(&slot)
                .is_some_and(|s| s.pass == pass || (lies && recorded)))
        })
    }

    fn test_any_keyslot(&self, dev: &Path, pass: &Passphrase) -> Result<AnyKeyslot, LuksError> {
        if pass.is_empty() {
            return Err(refused(
                "open --test-passphrase (any keyslot)",
                dev,
                "the passphrase is empty",
            ));
        }
        let pass = pass.expose().to_vec();
        self.sim.pbkdf(1);
        self.with_dev(Call::read("test-any", dev), dev, move |d, _| {
            Ok(d.try_order()
                .into_iter()
                .find(|(_, s)| s.bound && s.priority != Priority::Ignore && s.pass == pass)
                .map_or(AnyKeyslot::Fails, |(n, _)| AnyKeyslot::Keyslot(n)))
        })
    }

    fn add_keyslot(
        &self,
        dev: &Path,
        _target: AddTarget,
        unlock_slot: Option<u32>,
        unlock: &Passphrase,
        new_slot: u32,
        new: &Passphrase,
        _pbkdf: Option<&PbkdfSettings>,
    ) -> Result<(), LuksError> {
        let op = format!("luksAddKey into keyslot {new_slot}");
        if unlock.is_empty() {
            return Err(refused(&op, dev, "the unlocking passphrase is empty"));
        }
        if new.is_empty() {
            return Err(refused(&op, dev, "the new passphrase is empty"));
        }
        check_slot(&op, dev, new_slot, 32)?;
        let (unlock, new) = (unlock.expose().to_vec(), new.expose().to_vec());
        self.sim.pbkdf(2);
        let call = Call::write("add", dev).slot(new_slot);
        self.with_dev(call, dev, move |d, salts| {
            let max = d.version.max_keyslots();
            check_slot(&op, dev, new_slot, max)?;
            if let Some(u) = unlock_slot {
                check_slot(&op, dev, u, max)?;
            }
            if d.slots.contains_key(&new_slot) {
                return Err(failed(
                    &op,
                    dev,
                    1,
                    &format!("Key slot {new_slot} is full, please select another one."),
                ));
            }
            let opens = match unlock_slot {
                Some(u) => match d.slots.get(&u) {
                    None => return Err(failed(&op, dev, 1, "Keyslot is not active.")),
                    Some(s) => s.bound && s.pass == unlock,
                },
                None => {
                    // cryptsetup tries only bound keyslots of priority normal or prefer; with
                    // none to try it says so (exit 1), else a wrong passphrase is exit 2.
                    let usable: Vec<&MemSlot> = d
                        .slots
                        .values()
                        .filter(|s| s.bound && s.priority != Priority::Ignore)
                        .collect();
                    if usable.is_empty() {
                        return Err(failed(&op, dev, 1, "No usable keyslot is available."));
                    }
                    usable.iter().any(|s| s.pass == unlock)
                }
            };
            if !opens {
                return Err(failed(
                    &op,
                    dev,
                    2,
                    "No key available with this passphrase.",
                ));
            }
            d.slots.insert(
                new_slot,
                MemSlot {
                    pass: new,
                    bound: true,
                    salt: fresh_salt(salts),
                    priority: Priority::Normal,
                    seq: *salts,
                },
            );
            d.epoch += 1;
            Ok(())
        })
    }

    fn kill_keyslot_unchecked(&self, dev: &Path, slot: u32) -> Result<(), LuksError> {
        let op = format!("luksKillSlot of keyslot {slot}");
        check_slot(&op, dev, slot, 32)?;
        let call = Call::write("kill", dev).slot(slot);
        self.with_dev(call, dev, move |d, _| {
            if d.slots.remove(&slot).is_none() {
                return Err(failed(
                    &op,
                    dev,
                    1,
                    &format!("Keyslot {slot} is not active."),
                ));
            }
            // LUKS2: destroying a keyslot also unassigns it from every token (the token
            // itself stays), as cryptsetup's keyslot wipe does.
            for t in d.tokens.values_mut() {
                if let Some(list) = t.get_mut("keyslots").and_then(|k| k.as_array_mut()) {
                    list.retain(|k| k.as_str() != Some(slot.to_string().as_str()));
                }
            }
            d.epoch += 1;
            Ok(())
        })
    }

    fn token_import(
        &self,
        dev: &Path,
        token_id: Option<u32>,
        json: &serde_json::Value,
    ) -> Result<u32, LuksError> {
        let op = "token import";
        let keyslots = token_keyslots(json).map_err(|m| refused(op, dev, &m))?;
        if token_id.is_some_and(|id| id >= 32) {
            return Err(refused(
                op,
                dev,
                "token id out of range (LUKS2 tokens are 0-31)",
            ));
        }
        let json = json.clone();
        let call = Call::write("token-import", dev);
        self.with_dev(call, dev, move |d, _| {
            if d.version != LuksVersion::Luks2 {
                return Err(refused(op, dev, "the device is LUKS1, which has no tokens"));
            }
            if let Some(k) = keyslots.iter().find(|k| !d.slots.contains_key(k)) {
                return Err(refused(
                    op,
                    dev,
                    &format!("the token names keyslot {k}, which is empty"),
                ));
            }
            let id = match token_id {
                Some(id) => id,
                None => (0..32)
                    .find(|i| !d.tokens.contains_key(i))
                    .ok_or_else(|| refused(op, dev, "all 32 token ids are in use"))?,
            };
            d.tokens.insert(id, json);
            d.epoch += 1;
            Ok(id)
        })
    }

    fn token_remove(&self, dev: &Path, token_id: u32) -> Result<(), LuksError> {
        let op = format!("token remove of token {token_id}");
        if token_id >= 32 {
            return Err(refused(&op, dev, "token id out of range"));
        }
        let call = Call::write("token-remove", dev);
        self.with_dev(call, dev, move |d, _| {
            if d.version != LuksVersion::Luks2 || d.tokens.remove(&token_id).is_none() {
                return Err(failed(
                    &op,
                    dev,
                    1,
                    &format!("Token {token_id} is not in use."),
                ));
            }
            d.epoch += 1;
            Ok(())
        })
    }

    fn pbkdf_runs(&self) -> u64 {
        self.sim.pbkdf_runs()
    }

    fn read_parallelism(&self) -> usize {
        1
    }
}

/// The KMS door of one simulated keyplan process, for KMS instance `name`.
#[derive(Debug, Clone)]
pub struct SimKms {
    /// The simulation.
    pub sim: Arc<Sim>,
    /// The process this door belongs to.
    pub proc: usize,
    /// KMS instance name.
    pub name: String,
}

impl SimKms {
    /// Where key `key` of this KMS instance lives in [`super::World::keys`].
    fn path(&self, key: &str) -> String {
        format!("{}/{key}", self.name)
    }

    /// A read-only call on key `key`.
    fn read_call<T>(
        &self,
        op: &'static str,
        key: &str,
        f: impl FnOnce(&MemKey) -> Result<T, KmsError>,
    ) -> Result<T, KmsError> {
        let key = self.path(key);
        self.sim.kms_door(
            self.proc,
            Call::kms_read(op, &key),
            &self.describe(),
            move |w| f(w.keys.get(&key).unwrap_or(&MemKey::default())),
        )
    }

    /// A write: a read of the revision (one door call), then a compare-and-swap write of the
    /// key (another door call) that fails as a conflict when someone wrote in between.
    fn write_call<T>(
        &self,
        op: &'static str,
        key: &str,
        f: impl FnOnce(&mut MemKey) -> Result<T, KmsError>,
    ) -> Result<T, KmsError> {
        let seen = self.read_call(op, key, |k| Ok(k.clone()))?;
        let no_cas = self.sim.variant() == super::Variant::NoCompareAndSwap;
        let key_s = key.to_string();
        let path = self.path(key);
        let me = self.describe();
        let describe = me.clone();
        self.sim
            .kms_door(self.proc, Call::kms_write(op, &path), &describe, move |w| {
                let k = w.keys.entry(path.clone()).or_default();
                // The broken variant writes what it computed from its read, whatever was
                // written since (a lost update).
                let mut copy = if no_cas {
                    seen
                } else if k.revision != seen.revision {
                    return Err(KmsError::Conflict {
                        kms: me.clone(),
                        key: key_s.clone(),
                        detail: format!(
                            "check-and-set failed: revision {} read, {} now",
                            seen.revision, k.revision
                        ),
                    });
                } else {
                    k.clone()
                };
                let out = f(&mut copy)?;
                copy.revision = k.revision + 1;
                *k = copy;
                Ok(out)
            })
    }
}

impl Kms for SimKms {
    fn describe(&self) -> String {
        format!("simulated KMS {:?}", self.name)
    }

    fn read(&self, name: &str) -> Result<KeyState, KmsError> {
        self.read_call("read", name, |k| {
            Ok(KeyState {
                current: k.current,
                pending: k.pending,
                versions: k.versions.iter().map(|v| (v.version, v.clone())).collect(),
                holders: k.holders.clone(),
            })
        })
    }

    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        let me = self.describe();
        let key = name.to_string();
        self.read_call("get", name, move |k| {
            k.material
                .get(&version)
                .map(|m| Passphrase::new(m.clone()))
                .ok_or(KmsError::NoSuchVersion {
                    kms: me,
                    key,
                    version,
                })
        })
    }

    fn stage(&self, name: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        let m = material.expose().to_vec();
        let this = self.clone();
        let key = name.to_string();
        self.write_call("stage", name, move |k| {
            let version = k
                .book()
                .stage(at_least)
                .map_err(|r| r.conflict(&this, &key))?;
            k.material.insert(version, m);
            k.pending = Some(version);
            k.versions.push(VersionInfo {
                version,
                created_at: 1_800_000_000,
                state: VersionState::Pending,
            });
            Ok(version)
        })
    }

    fn commit_as(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        let this = self.clone();
        let key = name.to_string();
        let holder = holder.map(str::to_string);
        let ignore_votes = self.sim.variant() == super::Variant::CommitIgnoresVotes;
        self.write_call("commit", name, move |k| {
            if k.current != Some(pending) && !ignore_votes {
                book::check_holders(&this, &key, &k.holders, holder.as_deref(), pending)?;
            }
            let decision = k.book().commit(expected_current, pending);
            let Commit::Go { previous } = decision.map_err(|r| r.conflict(&this, &key))? else {
                return Ok(());
            };
            (k.current, k.pending) = book::commit_states(&mut k.versions, previous, pending);
            Ok(())
        })
    }

    fn hold(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        let this = self.clone();
        let key = name.to_string();
        let holder = holder.to_string();
        self.write_call("hold", name, move |k| {
            if k.current.is_none() {
                return Err(KmsError::conflict(
                    &this,
                    &key,
                    format!(
                        "{holder} cannot be recorded as a holder: the key has no current version"
                    ),
                ));
            }
            k.holders.entry(holder).or_insert(1_800_000_000);
            Ok(())
        })
    }

    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        let holder = holder.to_string();
        self.write_call("release", name, move |k| {
            k.holders.remove(&holder);
            Ok(())
        })
    }

    fn retire(&self, name: &str, version: u64) -> Result<(), KmsError> {
        let this = self.clone();
        let key = name.to_string();
        self.write_call("retire", name, move |k| {
            k.book()
                .retire(version)
                .map_err(|r| r.conflict(&this, &key))?;
            k.drop_material(Some(&[version]));
            book::retire_state(&mut k.versions, version);
            Ok(())
        })
    }

    /// As the file KMS (src/kms/file.rs) does it: every version's material but the current
    /// one's goes with the record that says the key is destroyed (one compare-and-swap write),
    /// then the current version's material in a door call of its own, so a crash in between
    /// leaves a destroyed key whose current material is still readable. A `destroy_key` of a
    /// key recorded destroyed finishes it (the broken variant
    /// [`super::Variant::DestroyLeavesMaterial`] returns early instead, as the file KMS did
    /// before issue 46).
    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError> {
        let this = self.clone();
        let key = name.to_string();
        let early = self.sim.variant() == super::Variant::DestroyLeavesMaterial;
        let recorded_before = self.write_call("destroy", name, move |k| {
            let decision = k.book().destroy(expected_current);
            if decision.map_err(|r| r.conflict(&this, &key))? == Destroy::NothingLeft {
                if !early {
                    k.drop_material(None);
                }
                return Ok(true);
            }
            let others: Vec<u64> = k
                .material
                .keys()
                .copied()
                .filter(|v| Some(*v) != k.current)
                .collect();
            k.drop_material(Some(&others));
            (k.current, k.pending) = book::destroy_states(&mut k.versions);
            Ok(false)
        })?;
        if recorded_before {
            return Ok(());
        }
        let path = self.path(name);
        self.sim.kms_door(
            self.proc,
            Call::kms_write("destroy-material", &path),
            &self.describe(),
            move |w| {
                if let Some(k) = w.keys.get_mut(&path) {
                    k.drop_material(None);
                }
                Ok(())
            },
        )
    }
}
