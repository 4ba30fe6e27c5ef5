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

use crate::format::state::records::{self as format, Luks1SlotV1, Luks1V2, TokenV1};
use crate::format::state::ReadError;
use crate::format::NewerFormat;
use crate::fsutil;
use std::sync::Arc;

use crate::luks::{Header, LuksDoor, LuksError, LuksVersion, Token};

/// LUKS2 token type keyplan writes ([`format::TOKEN_TYPE`]).
pub const TOKEN_TYPE: &str = format::TOKEN_TYPE;

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
    /// A `keyplan` token or a LUKS1 record file was written by a newer keyplan: refused, never
    /// taken for an unmanaged keyslot, nothing written.
    #[error(transparent)]
    Newer(#[from] NewerFormat),
    /// A LUKS2 token of type `keyplan` that is not a token of a format this keyplan knows
    /// (damaged, or hand-made): refused, never taken for an unmanaged keyslot.
    #[error("{document} is a `keyplan` token this keyplan cannot read ({detail}); keyplan will neither take its keyslot for unmanaged (it could remove it) nor write over it, and changed nothing. Look at it with `cryptsetup token export --token-id {token} <device>`: if a newer keyplan wrote it, run that keyplan; if it is damaged, restore the LUKS header from a backup, or remove the token (`cryptsetup token remove --token-id {token} <device>`) so that keyplan adopts the keyslot again (`adopt`)")]
    BadToken {
        /// `keyslot <n> token <t>`, with `device <id> ` before it once the device is known
        /// ([`RecordError::on_device`]).
        document: String,
        /// The token id.
        token: u32,
        /// The parser's message.
        detail: String,
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

impl RecordError {
    /// The error with the device named in it (`device <id> keyslot <n> token <t> ...`), for
    /// the errors about one token ([`RecordError::Newer`], [`RecordError::BadToken`]) read by
    /// [`RecordStore::read`], which knows only the header; others as they are.
    pub fn on_device(self, id: &str) -> RecordError {
        match self {
            RecordError::Newer(mut n) if n.document.starts_with("keyslot ") => {
                n.document = format!("device {id} {}", n.document);
                RecordError::Newer(n)
            }
            RecordError::BadToken {
                document,
                token,
                detail,
            } => RecordError::BadToken {
                document: format!("device {id} {document}"),
                token,
                detail,
            },
            other => other,
        }
    }

    /// Whether the message names the device already ([`RecordError::on_device`]).
    pub fn names_device(&self) -> bool {
        match self {
            RecordError::Newer(n) => n.document.starts_with("device "),
            RecordError::BadToken { document, .. } => document.starts_with("device "),
            _ => false,
        }
    }
}

/// `<state_dir>/luks1/<uuid>.json`, as the engine uses it (the file's format:
/// [`crate::format::state::records::Luks1V2`]).
#[derive(Debug, Default)]
struct Luks1Records {
    device: String,
    slots: BTreeMap<u32, SlotRecord>,
}

impl From<Luks1SlotV1> for SlotRecord {
    fn from(s: Luks1SlotV1) -> SlotRecord {
        SlotRecord {
            key: s.key,
            version: s.version,
            salt: s.salt,
            entry: s.entry,
            pbkdf: s.pbkdf,
        }
    }
}

impl From<&SlotRecord> for Luks1SlotV1 {
    fn from(r: &SlotRecord) -> Luks1SlotV1 {
        Luks1SlotV1 {
            key: r.key.clone(),
            version: r.version,
            salt: r.salt.clone(),
            entry: r.entry.clone(),
            pbkdf: r.pbkdf.clone(),
        }
    }
}

impl From<Luks1V2> for Luks1Records {
    fn from(f: Luks1V2) -> Luks1Records {
        Luks1Records {
            device: f.device,
            slots: f.slots.into_iter().map(|(s, r)| (s, r.into())).collect(),
        }
    }
}

impl From<&Luks1Records> for Luks1V2 {
    fn from(r: &Luks1Records) -> Luks1V2 {
        Luks1V2 {
            format: format::LUKS1_FORMAT,
            device: r.device.clone(),
            slots: r.slots.iter().map(|(s, r)| (*s, r.into())).collect(),
        }
    }
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
    /// status against that header. Tokens of other types are not keyplan's; a token of type
    /// `keyplan` that this keyplan cannot read is an error, never skipped: its keyslot would
    /// look unmanaged (and `unmanaged_keyslots: remove` would remove it).
    ///
    /// Errors: [`RecordError::Newer`] (a token or LUKS1 record file of a newer keyplan),
    /// [`RecordError::BadToken`], an unreadable or corrupt LUKS1 record file.
    pub fn read(&self, header: &Header) -> Result<Vec<RecordObs>, RecordError> {
        let raw: Vec<(u32, SlotRecord, Option<u32>)> = match header.version {
            LuksVersion::Luks2 => header
                .tokens
                .values()
                .filter(|t| t.token_type == TOKEN_TYPE)
                .map(|t| token_record(t).map(|(slot, rec)| (slot, rec, Some(t.id))))
                .collect::<Result<_, _>>()?,
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
            Ok(b) => match format::read_luks1(&path.display().to_string(), &b) {
                Ok(f) => Ok(f.into()),
                Err(ReadError::Newer(n)) => Err(RecordError::Newer(n)),
                Err(ReadError::Corrupt(detail)) => Err(RecordError::Corrupt { path, detail }),
            },
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
        let text =
            crate::format::state::pretty(&Luks1V2::from(recs)).map_err(|e| RecordError::Io {
                what: "encoding",
                path: path.clone(),
                source: std::io::Error::other(e),
            })?;
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

/// The `keyplan` token JSON recording `record` for `slot` ([`TokenV1`]). The keyslot number is
/// stored in `slot` as well as in `keyslots`, because cryptsetup removes a killed keyslot from
/// every token's `keyslots` list: `slot` lets keyplan recognize a token left behind after a
/// keyslot was killed by hand.
fn token_json(slot: u32, record: &SlotRecord) -> serde_json::Value {
    let (kms, name) = record.entry.clone().unzip();
    TokenV1 {
        token_type: TOKEN_TYPE.to_string(),
        keyslots: vec![slot.to_string()],
        keyplan_format: format::TOKEN_FORMAT,
        slot,
        key: record.key.clone(),
        version: record.version,
        salt: record.salt.clone(),
        kms,
        name,
        pbkdf: record.pbkdf.clone(),
    }
    .to_json()
}

/// The `(keyslot, record)` the `keyplan` token `t` holds.
///
/// Errors: [`RecordError::Newer`] for a token of a newer `keyplan_format`;
/// [`RecordError::BadToken`] for one without the fields of its format (each naming the
/// keyslot and token, without the device: [`RecordError::on_device`]).
fn token_record(t: &Token) -> Result<(u32, SlotRecord), RecordError> {
    let slot = t
        .json
        .get("slot")
        .and_then(serde_json::Value::as_u64)
        .or(t.keyslots.first().map(|s| u64::from(*s)));
    let document = match slot {
        Some(s) => format!("keyslot {s} token {}", t.id),
        None => format!("keyslot (none named) token {}", t.id),
    };
    let token = format::read_token(&document, &t.json).map_err(|e| match e {
        ReadError::Newer(n) => RecordError::Newer(n),
        ReadError::Corrupt(detail) => RecordError::BadToken {
            document: document.clone(),
            token: t.id,
            detail,
        },
    })?;
    let entry = match (token.kms, token.name) {
        (Some(k), Some(n)) => Some((k, n)),
        _ => None,
    };
    let record = SlotRecord {
        key: token.key,
        version: token.version,
        salt: token.salt,
        entry,
        pbkdf: token.pbkdf,
    };
    Ok((token.slot, record))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: u32, json: serde_json::Value) -> Token {
        Token {
            id,
            token_type: TOKEN_TYPE.into(),
            keyslots: vec![5],
            json,
        }
    }

    #[test]
    fn tokens_round_trip_and_unreadable_ones_are_refused() {
        let rec = SlotRecord {
            key: "k".into(),
            version: 3,
            salt: "c2FsdA==".into(),
            entry: Some(("vault".into(), "osd".into())),
            pbkdf: Some("argon2id memory_kib=65536 iter_time_ms=2000".into()),
        };
        let json = token_json(5, &rec);
        assert_eq!(json["keyslots"], serde_json::json!(["5"]));
        assert_eq!(
            token_record(&token(0, json.clone())).ok(),
            Some((5, rec.clone()))
        );
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
        assert_eq!(token_record(&token(0, old)).ok(), Some((5, expected)));
        let bad = token_record(&token(2, serde_json::json!({"type": "keyplan"})))
            .expect_err("no fields")
            .on_device("d1")
            .to_string();
        assert!(
            bad.starts_with("device d1 keyslot 5 token 2 is a `keyplan` token"),
            "{bad}"
        );
        let negative = serde_json::json!({"keyplan_format": 1, "slot": -1, "key": "k", "version": 1, "salt": ""});
        assert!(matches!(
            token_record(&token(1, negative)),
            Err(RecordError::BadToken { token: 1, .. })
        ));
        let mut newer = json.clone();
        newer["keyplan_format"] = 2.into();
        let err = token_record(&token(3, newer))
            .expect_err("newer")
            .on_device("d1");
        assert!(matches!(err, RecordError::Newer(_)), "{err}");
        assert!(
            err.to_string()
                .starts_with("device d1 keyslot 5 token 3 is luks2-token format 2"),
            "{err}"
        );
    }
}
