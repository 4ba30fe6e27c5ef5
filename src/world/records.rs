//! The record store: what keyplan wrote down about each keyslot it manages.
//!
//! A record says which key version a keyslot holds, together with the keyslot's KDF salt at
//! the time keyplan wrote it. LUKS2 devices carry records in their header, one LUKS2 token of
//! type [`TOKEN_TYPE`] per keyslot (imported and removed with `cryptsetup token`); LUKS1 has no
//! tokens, so its records live in `<state_dir>/luks1/<LUKS UUID>.json`. A record whose keyslot
//! is gone, or whose salt no longer matches the header, is drift: the keyslot was killed or
//! rewritten outside keyplan. Reading records costs no PBKDF run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fsutil;
use std::sync::Arc;

use crate::luks::{Header, LuksDoor, LuksError, LuksVersion};

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
    /// The plan's `settings.pbkdf` keyplan added the keyslot with, in its short form
    /// ([`crate::luks::pbkdf_id`], e.g. `argon2id memory_kib=1048576 iter_time_ms=2000`):
    /// what a benchmark then made of it is taken as that plan's PBKDF
    /// ([`crate::luks::kdf_drift`]). `None` for a keyslot added without `settings.pbkdf`,
    /// adopted, or recorded before this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pbkdf: Option<String>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecordObs {
    /// Keyslot the record names.
    pub slot: u32,
    /// The record.
    pub record: SlotRecord,
    /// LUKS2 token id holding it (None for LUKS1 records).
    pub token_id: Option<u32>,
    /// Drift status.
    pub status: RecordStatus,
    /// The key id the record names on disk, when the plan renamed that key (same KMS instance
    /// and name, `observe::rename`): `record.key` is then the new id, and a re-record step
    /// rewrites the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renamed_from: Option<String>,
}

impl RecordObs {
    /// True when the record is valid and says keyslot `slot` holds `key` v`version`.
    pub fn holds(&self, slot: u32, key: &str, version: u64) -> bool {
        self.slot == slot
            && self.status == RecordStatus::Valid
            && self.record.key == key
            && self.record.version == version
    }
}

/// Errors of the record store. Messages name the device or file and what keyplan left as it
/// was.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// cryptsetup could not import or remove a `keyplan` token.
    #[error("{0}")]
    Token(#[from] LuksError),
    /// The token for a new keyslot could not be stored (e.g. the LUKS2 JSON area is full).
    #[error("{source}; keyslot {slot} holds {key} v{version} but keyplan could not record it (is the LUKS2 JSON metadata area full?)")]
    NotRecorded {
        /// cryptsetup's error.
        source: LuksError,
        /// The keyslot.
        slot: u32,
        /// Key id.
        key: String,
        /// Version.
        version: u64,
    },
    /// A LUKS1 record file exists but is not valid JSON of the expected shape.
    #[error("LUKS1 record file {} is corrupt: {detail}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        detail: String,
    },
    /// A LUKS1 record file (or its directory) could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// `reading`, `writing`, `creating`.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// `<state_dir>/luks1/<uuid>.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Luks1Records {
    #[serde(default)]
    device: String,
    #[serde(default)]
    slots: BTreeMap<u32, SlotRecord>,
}

/// Reads and writes keyplan's records: LUKS2 tokens through cryptsetup, LUKS1 record files in
/// the state directory.
#[derive(Debug, Clone)]
pub struct RecordStore {
    cs: Arc<dyn LuksDoor>,
    luks1_dir: PathBuf,
}

impl RecordStore {
    /// A store writing tokens with `cs` and LUKS1 records into `luks1_dir`
    /// (`<state_dir>/luks1`, created 0700 on first write).
    pub fn new(cs: Arc<dyn LuksDoor>, luks1_dir: PathBuf) -> RecordStore {
        RecordStore { cs, luks1_dir }
    }

    fn luks1_file(&self, uuid: &str) -> PathBuf {
        self.luks1_dir.join(format!("{uuid}.json"))
    }

    /// Reads keyplan's records for a device whose header is `header`, each with its drift
    /// status against that header. LUKS2 tokens that do not have keyplan's shape are ignored.
    ///
    /// Errors: an unreadable or corrupt LUKS1 record file.
    pub fn read(&self, header: &Header) -> Result<Vec<RecordObs>, RecordError> {
        let raw: Vec<(u32, SlotRecord, Option<u32>)> = match header.version {
            LuksVersion::Luks2 => header
                .tokens
                .values()
                .filter(|t| t.token_type == TOKEN_TYPE)
                .filter_map(|t| Some((token_record(&t.json)?, t.id)))
                .map(|((slot, rec), id)| (slot, rec, Some(id)))
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
                    renamed_from: None,
                }
            })
            .collect())
    }

    fn read_luks1(&self, uuid: &str) -> Result<Luks1Records, RecordError> {
        let path = self.luks1_file(uuid);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| RecordError::Corrupt {
                path,
                detail: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Luks1Records::default()),
            Err(source) => Err(RecordError::Io {
                what: "reading",
                path,
                source,
            }),
        }
    }

    fn write_luks1(&self, uuid: &str, recs: &Luks1Records) -> Result<(), RecordError> {
        let path = self.luks1_file(uuid);
        fsutil::ensure_private_dir(&self.luks1_dir).map_err(|source| RecordError::Io {
            what: "creating",
            path: self.luks1_dir.clone(),
            source,
        })?;
        let mut text = serde_json::to_vec_pretty(recs).map_err(|e| RecordError::Io {
            what: "encoding",
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        text.push(b'\n');
        fsutil::write_atomic(&path, &text, 0o600).map_err(|source| RecordError::Io {
            what: "writing",
            path,
            source,
        })
    }

    /// Records that `slot` of `dev` holds `record` (replacing any record of that keyslot).
    /// LUKS2: removes keyplan tokens naming `slot`, then imports a new token; LUKS1: rewrites
    /// the record file.
    ///
    /// Errors: cryptsetup token import failed (e.g. the LUKS2 JSON area is full) or the record
    /// file could not be written.
    pub fn write(
        &self,
        dev: &Path,
        header: &Header,
        slot: u32,
        record: &SlotRecord,
    ) -> Result<(), RecordError> {
        match header.version {
            LuksVersion::Luks2 => {
                self.remove(dev, header, slot)?;
                self.import(dev, slot, record).map(|_| ())
            }
            LuksVersion::Luks1 => self.write_luks1_record(dev, header, slot, record),
        }
    }

    /// Like [`RecordStore::write`], but never leaves `slot` without a record, even when cut
    /// short: LUKS2 imports the new token first and then removes the keyslot's other keyplan
    /// tokens; LUKS1 rewrites the record file atomically. Used when a record changes while its
    /// keyslot stays (migration to another KMS).
    ///
    /// Errors: as [`RecordStore::write`].
    pub fn replace(
        &self,
        dev: &Path,
        header: &Header,
        slot: u32,
        record: &SlotRecord,
    ) -> Result<(), RecordError> {
        match header.version {
            LuksVersion::Luks2 => {
                let new_id = self.import(dev, slot, record)?;
                self.remove_tokens(dev, header, slot, Some(new_id))
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
    ) -> Result<(), RecordError> {
        let mut recs = self.read_luks1(&header.uuid)?;
        recs.device = dev.display().to_string();
        recs.slots.insert(slot, record.clone());
        self.write_luks1(&header.uuid, &recs)
    }

    /// Imports a `keyplan` token recording `record` for `slot`; returns its token id.
    fn import(&self, dev: &Path, slot: u32, record: &SlotRecord) -> Result<u32, RecordError> {
        self.cs
            .token_import(dev, None, &token_json(slot, record))
            .map_err(|source| RecordError::NotRecorded {
                source,
                slot,
                key: record.key.clone(),
                version: record.version,
            })
    }

    /// Removes keyplan's record(s) of `slot` of `dev`. Idempotent.
    ///
    /// Errors: cryptsetup token remove failed, or the record file could not be written.
    pub fn remove(&self, dev: &Path, header: &Header, slot: u32) -> Result<(), RecordError> {
        match header.version {
            LuksVersion::Luks2 => self.remove_tokens(dev, header, slot, None),
            LuksVersion::Luks1 => {
                let mut recs = self.read_luks1(&header.uuid)?;
                if recs.slots.remove(&slot).is_some() {
                    self.write_luks1(&header.uuid, &recs)?;
                }
                Ok(())
            }
        }
    }

    /// Removes the `keyplan` tokens of `header` that name `slot`, except token `keep`.
    ///
    /// Errors: cryptsetup token remove failed.
    fn remove_tokens(
        &self,
        dev: &Path,
        header: &Header,
        slot: u32,
        keep: Option<u32>,
    ) -> Result<(), RecordError> {
        for r in self.read(header)?.iter().filter(|r| r.slot == slot) {
            if let Some(id) = r.token_id.filter(|id| Some(*id) != keep) {
                self.cs.token_remove(dev, id)?;
            }
        }
        Ok(())
    }
}

/// The `keyplan` token JSON recording `record` for `slot`. The keyslot number is stored in
/// `slot` as well as in `keyslots`, because cryptsetup removes a killed keyslot from every
/// token's `keyslots` list: `slot` lets keyplan recognize a token left behind after a keyslot
/// was killed by hand.
fn token_json(slot: u32, record: &SlotRecord) -> serde_json::Value {
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
    if let (Some(pbkdf), Some(m)) = (&record.pbkdf, json.as_object_mut()) {
        m.insert("pbkdf".into(), pbkdf.clone().into());
    }
    json
}

/// The `(keyslot, record)` a `keyplan` token's JSON holds; `None` when it lacks a field.
fn token_record(json: &serde_json::Value) -> Option<(u32, SlotRecord)> {
    let slot = u32::try_from(json.get("slot")?.as_u64()?).ok()?;
    let entry = match (json.get("kms"), json.get("name")) {
        (Some(k), Some(n)) => Some((k.as_str()?.to_string(), n.as_str()?.to_string())),
        _ => None,
    };
    let rec = SlotRecord {
        key: json.get("key")?.as_str()?.to_string(),
        version: json.get("version")?.as_u64()?,
        salt: json.get("salt")?.as_str()?.to_string(),
        entry,
        pbkdf: json
            .get("pbkdf")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string),
    };
    Some((slot, rec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_odd_ones_are_ignored() {
        let rec = SlotRecord {
            key: "k".into(),
            version: 3,
            salt: "c2FsdA==".into(),
            entry: Some(("vault".into(), "osd".into())),
            pbkdf: Some("argon2id memory_kib=65536 iter_time_ms=2000".into()),
        };
        let json = token_json(5, &rec);
        assert_eq!(json["keyslots"], serde_json::json!(["5"]));
        assert_eq!(token_record(&json), Some((5, rec.clone())));
        let mut old = json.clone();
        if let Some(m) = old.as_object_mut() {
            m.remove("kms");
            m.remove("name");
            m.remove("pbkdf");
        }
        let expected = SlotRecord {
            entry: None,
            pbkdf: None,
            ..rec
        };
        assert_eq!(token_record(&old), Some((5, expected)));
        assert_eq!(token_record(&serde_json::json!({"type": "keyplan"})), None);
        assert_eq!(
            token_record(&serde_json::json!({"slot": -1, "key": "k", "version": 1, "salt": ""})),
            None
        );
    }
}
