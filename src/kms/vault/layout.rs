//! How keyplan keeps a key in KV version 2 (the layout of `mod.rs`'s module documentation):
//! the main and the pending path, keyplan's data fields, the history of earlier versions and
//! which KV version holds each, read back into [`KeyState`]s and passphrases; the key names
//! that would collide with that layout; and the version book of a key as read.

use std::collections::BTreeMap;

use serde_json::Value;
use vaultrs::api::kv2::responses::ReadSecretMetadataResponse;
use zeroize::Zeroizing;

use super::client::{Read, VaultKms};
use crate::kms::book::VersionBook;
use crate::kms::{with_retries, KeyState, Kms, KmsError, VersionInfo, VersionState};
use crate::secret::Passphrase;

/// Suffix of the sibling path holding the pending version: `<name>.keyplan-pending`.
pub const PENDING_SUFFIX: &str = ".keyplan-pending";
// keyplan's data fields and their version: src/format/kms/vault.rs.
pub use crate::format::kms::vault::{
    FIELD_BASE, FIELD_BASE_VERSION, FIELD_CREATED_AT, FIELD_DESTROYED_AT, FIELD_FORMAT,
    FIELD_HISTORY, FIELD_HOLDERS, FIELD_PASSPHRASE, FIELD_VERSION,
};
/// How many older readable KV versions are searched for a keyplan-written one when the latest
/// version has no keyplan fields (a foreign write on a managed key, or a secret to adopt).
const FOREIGN_SCAN: usize = 20;

/// One earlier version, as recorded in `keyplan_history`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hist {
    pub(super) version: u64,
    pub(super) kv_version: u64,
    pub(super) created_at: u64,
}

/// The latest KV version of the main path.
pub(super) struct Main {
    pub(super) kv_version: u64,
    /// `None` for a tombstone left by an interrupted `destroy_key`.
    pub(super) live: Option<Live>,
    /// The latest version carries no keyplan fields: written by another tool (taken over as
    /// "keyplan version = KV version" unless [`Main::foreign`] or a pending secret says
    /// otherwise).
    pub(super) adopted: bool,
    /// Set when the latest version carries no keyplan fields but an older one does: another
    /// tool overwrote a key keyplan manages (see [`Foreign`]).
    foreign: Option<Foreign>,
}

/// A foreign write on top of keyplan's versions: the newest older KV version written by
/// keyplan. Adopting the foreign value as "keyplan version = KV version" could give a number
/// keyplan already used (a pending or earlier version) to different material, which the engine
/// would trust; so every operation stops instead.
#[derive(Debug, Clone, Copy)]
struct Foreign {
    /// KV version written by keyplan.
    kv_version: u64,
    /// keyplan version it holds.
    version: u64,
}

/// The current version held by the main path.
pub(super) struct Live {
    pub(super) version: u64,
    pub(super) created_at: u64,
    pub(super) history: Vec<Hist>,
    /// [`FIELD_HOLDERS`]: the plans holding the key, holder id -> since.
    pub(super) holders: BTreeMap<String, u64>,
    /// The data has fields keyplan does not write (another writer's `kv patch`).
    pub(super) extra_fields: bool,
    pub(super) passphrase: Zeroizing<String>,
}

/// The pending path's latest version.
pub(super) struct Pending {
    pub(super) version: u64,
    pub(super) created_at: u64,
    /// KV version of the main path when this version was staged (`None`: not recorded).
    pub(super) base: Option<u64>,
    /// The keyplan version current when this version was staged (`None`: not recorded).
    pub(super) base_version: Option<u64>,
    pub(super) passphrase: Zeroizing<String>,
}

/// What the pending path holds.
pub(super) enum PendingRead {
    Absent,
    /// Metadata without a readable latest version (deleted by someone): only in the way.
    Leftover,
    Found(Pending),
}

impl VaultKms {
    /// Refuses key names that are not usable KV paths or would collide with keyplan's own
    /// pending paths and fields.
    pub(super) fn check_name(&self, name: &str) -> Result<(), KmsError> {
        let why = if name.is_empty() {
            Some("it is empty")
        } else if name.starts_with('/') || name.ends_with('/') {
            Some("it starts or ends with '/'")
        } else if name
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
        {
            Some("it has an empty, '.' or '..' path component")
        } else if name.chars().any(char::is_control) {
            Some("it contains control characters")
        } else if name.ends_with(PENDING_SUFFIX) {
            Some("it ends with .keyplan-pending, the suffix keyplan uses for staged versions")
        } else if basename(name).starts_with("keyplan_") {
            Some("its last component starts with keyplan_, the prefix of keyplan's metadata fields")
        } else {
            None
        };
        match why {
            None => Ok(()),
            Some(why) => Err(KmsError::Config {
                kms: self.describe(),
                detail: format!(
                    "key name {name:?} cannot be used as a KV v2 path: {why}; set another `name` for the key in the plan. Nothing was changed"
                ),
            }),
        }
    }

    /// Checks the layout version of `data`, KV version `kv_version` of `path` (key `name`'s
    /// main or pending path): version 1 (no [`FIELD_FORMAT`]) or 2 (src/format/kms/vault.rs).
    ///
    /// Errors: [`KmsError::NewerFormat`] for a newer version (the caller writes nothing);
    /// [`KmsError::Corrupt`] for a version that is not a number.
    fn check_format(
        &self,
        name: &str,
        path: &str,
        kv_version: u64,
        data: &serde_json::Map<String, Value>,
    ) -> Result<(), KmsError> {
        let document =
            KmsError::document(self, name, &format!("KV version {kv_version} of {path}"));
        crate::format::kms::vault::check(data, &document)
            .map(|_| ())
            .map_err(|e| {
                KmsError::of_read(self, name, e, |why| format!(
                    "KV version {kv_version} of {path}: {why}; nothing was changed. Restore a good version with `bao kv rollback` (see docs/kms/vault.md)"
                ))
            })
    }

    /// The main path's latest version; `None` if the path does not exist.
    pub(super) fn read_main(&self, name: &str) -> Result<Option<Main>, KmsError> {
        let resp = match self.read_secret(name, None)? {
            Read::Absent => return Ok(None),
            Read::Deleted(v) => {
                return Err(KmsError::corrupt(
                    self,
                    name,
                    format!(
                        "the latest KV version ({v}) of {} is deleted or destroyed, so keyplan cannot tell which passphrase opens the devices; nothing was changed. If it was deleted by mistake, restore it with `bao kv undelete -mount={} -versions={v} {name}` (vault kv undelete works the same); if it was destroyed, write the passphrase that opens the devices back as a new version",
                        self.data_path(name),
                        self.mount
                    ),
                ))
            }
            Read::Found(r) => r,
        };
        let kv_version = resp.metadata.version;
        let Value::Object(data) = resp.data else {
            return Err(KmsError::corrupt(
                self,
                name,
                format!(
                    "KV version {kv_version} of {} has no data",
                    self.data_path(name)
                ),
            ));
        };
        self.check_format(name, &self.data_path(name), kv_version, &data)?;
        if data.contains_key(FIELD_DESTROYED_AT) {
            return Ok(Some(Main {
                kv_version,
                live: None,
                adopted: false,
                foreign: None,
            }));
        }
        let adopted = !data.contains_key(FIELD_VERSION);
        let live = self.parse_live(name, kv_version, &resp.metadata.created_time, data)?;
        let foreign = if !adopted || kv_version <= 1 {
            None
        } else {
            self.keyplan_version_below(name, kv_version)?
        };
        Ok(Some(Main {
            kv_version,
            live: Some(live),
            adopted,
            foreign,
        }))
    }

    /// The current version held by `data`, the data of KV version `kv_version` of the main path
    /// (created at `created_time`, RFC 3339): the passphrase field, keyplan's fields, or, for a
    /// secret without them, the KV version and its creation time.
    pub(super) fn parse_live(
        &self,
        name: &str,
        kv_version: u64,
        created_time: &str,
        mut data: serde_json::Map<String, Value>,
    ) -> Result<Live, KmsError> {
        let field = basename(name);
        let Some(passphrase) = take_string(&mut data, field) else {
            return Err(KmsError::corrupt(
                self,
                name,
                format!(
                    "KV version {kv_version} of {} has no string field {field:?}; keyplan (like Rook) keeps the passphrase in the field named after the key's last path component. Nothing was changed; restore the secret (`bao kv rollback`) or fix the key's `name`",
                    self.data_path(name)
                ),
            ));
        };
        let bad = |detail: String| {
            KmsError::corrupt(
                self,
                name,
                format!(
                    "KV version {kv_version} of {}: {detail}; nothing was changed. Restore a good version with `bao kv rollback` (see docs/kms/vault.md)",
                    self.data_path(name)
                ),
            )
        };
        let version = number(&data, FIELD_VERSION)
            .map_err(&bad)?
            .unwrap_or(kv_version);
        if version == 0 {
            return Err(bad(format!("{FIELD_VERSION} is 0")));
        }
        let created_at = match number(&data, FIELD_CREATED_AT).map_err(&bad)? {
            Some(t) => t,
            None => parse_time(created_time).ok_or_else(|| {
                bad(format!(
                    "its created_time {created_time:?} is not an RFC 3339 time"
                ))
            })?,
        };
        let history = match data.get(FIELD_HISTORY) {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => parse_history(v).map_err(|e| bad(format!("{FIELD_HISTORY}: {e}")))?,
        };
        let holders = match data.get(FIELD_HOLDERS) {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
                bad(format!(
                    "{FIELD_HOLDERS} is not a JSON object of holder -> Unix seconds: {e}"
                ))
            })?,
            Some(_) => return Err(bad(format!("{FIELD_HOLDERS} is not a string"))),
        };
        let extra_fields = data.keys().any(|k| {
            ![
                FIELD_FORMAT,
                FIELD_VERSION,
                FIELD_CREATED_AT,
                FIELD_HISTORY,
                FIELD_HOLDERS,
            ]
            .contains(&k.as_str())
        });
        Ok(Live {
            version,
            created_at,
            history,
            holders,
            extra_fields,
            passphrase,
        })
    }

    /// The newest KV version of `name` older than `kv_version` that keyplan wrote (it has a
    /// `keyplan_version` or is a tombstone), looking at most at the [`FOREIGN_SCAN`] newest
    /// readable ones. Only called for a latest version without keyplan fields, so a secret
    /// adopted from another tool costs these reads only until keyplan's first commit.
    fn keyplan_version_below(
        &self,
        name: &str,
        kv_version: u64,
    ) -> Result<Option<Foreign>, KmsError> {
        let Some(meta) = self.read_metadata(name)? else {
            return Ok(None);
        };
        let now = crate::clock::now_unix();
        let readable = (1..kv_version)
            .rev()
            .filter(|v| material_kept(Some(&meta), *v, now))
            .take(FOREIGN_SCAN);
        for v in readable {
            let Read::Found(resp) = self.read_secret(name, Some(v))? else {
                continue;
            };
            let Value::Object(mut data) = resp.data else {
                continue;
            };
            // Drop the old passphrase through zeroizing storage.
            drop(take_string(&mut data, basename(name)));
            if data.contains_key(FIELD_DESTROYED_AT) {
                return Ok(Some(Foreign {
                    kv_version: v,
                    version: 0,
                }));
            }
            if let Ok(Some(kp)) = number(&data, FIELD_VERSION) {
                return Ok(Some(Foreign {
                    kv_version: v,
                    version: kp,
                }));
            }
        }
        Ok(None)
    }

    /// The error for an operation on a key another tool overwrote (see [`Foreign`]):
    /// [`KmsError::Conflict`] for writes (`conflict`), [`KmsError::Corrupt`] for reads.
    fn foreign_error(&self, name: &str, kv_version: u64, f: Foreign, conflict: bool) -> KmsError {
        let detail = format!(
            "KV version {kv_version} of {} was written by another tool on top of keyplan's v{} (KV version {}); keyplan stops rather than guess which passphrase the devices hold. The devices still open with v{}; to undo the foreign write run `bao kv rollback -mount={} -version={} {name}` (vault kv rollback works the same)",
            self.data_path(name),
            f.version,
            f.kv_version,
            f.version,
            self.mount,
            f.kv_version
        );
        if conflict {
            KmsError::conflict(self, name, detail)
        } else {
            KmsError::corrupt(self, name, format!("{detail}; nothing was changed"))
        }
    }

    /// The main and the pending path, refusing a foreign write on a key keyplan manages
    /// (`conflict`: as a [`KmsError::Conflict`], for callers about to write; else
    /// [`KmsError::Corrupt`]): a latest version without keyplan fields on top of a keyplan
    /// version, or written after keyplan staged its pending version on another KV version
    /// (taking it over could give it the pending version's number).
    pub(super) fn read_state(
        &self,
        name: &str,
        conflict: bool,
    ) -> Result<(Option<Main>, PendingRead), KmsError> {
        let main = self.read_main(name)?;
        let pending = self.read_pending(name)?;
        if let Some(m) = &main {
            if let Some(f) = m.foreign {
                return Err(self.foreign_error(name, m.kv_version, f, conflict));
            }
            let staged_elsewhere = match &pending {
                PendingRead::Found(p) => p.base != Some(m.kv_version),
                PendingRead::Absent | PendingRead::Leftover => false,
            };
            if m.adopted && staged_elsewhere {
                let pending_name = pending_path(name);
                let mut detail = format!(
                    "KV version {} of {} has no keyplan fields, yet keyplan's pending secret {} exists: another tool wrote the key during a rotation, and keyplan stops rather than guess which passphrase the devices hold. ",
                    m.kv_version,
                    self.data_path(name),
                    self.data_path(&pending_name)
                );
                if m.kv_version > 1 {
                    detail.push_str(&format!(
                        "To undo the foreign write run `bao kv rollback -mount={} -version={} {name}`; to keep it instead, ",
                        self.mount,
                        m.kv_version - 1
                    ));
                } else {
                    detail.push_str("To keep the other tool's value, ");
                }
                detail.push_str(&format!(
                    "delete keyplan's pending version with `bao kv metadata delete -mount={} {pending_name}` (the devices still open with their previous passphrase)",
                    self.mount
                ));
                return Err(if conflict {
                    KmsError::conflict(self, name, detail)
                } else {
                    KmsError::corrupt(self, name, format!("{detail}; nothing was changed"))
                });
            }
        }
        Ok((main, pending))
    }

    /// The pending path of `name`.
    fn read_pending(&self, name: &str) -> Result<PendingRead, KmsError> {
        let path = pending_path(name);
        let resp = match self.read_secret(&path, None)? {
            Read::Absent => return Ok(PendingRead::Absent),
            Read::Deleted(_) => return Ok(PendingRead::Leftover),
            Read::Found(r) => r,
        };
        let kv_version = resp.metadata.version;
        let bad = |detail: &str| {
            KmsError::corrupt(
                self,
                name,
                format!(
                    "KV version {kv_version} of {} {detail}; keyplan wrote nothing. Delete it with `bao kv metadata delete -mount={} {path}` if no rotation is under way (the devices do not depend on an uncommitted version)",
                    self.data_path(&path),
                    self.mount
                ),
            )
        };
        let mut data = match resp.data {
            Value::Object(m) => m,
            _ => return Err(bad("has no data")),
        };
        self.check_format(name, &self.data_path(&path), kv_version, &data)?;
        let passphrase = take_string(&mut data, FIELD_PASSPHRASE)
            .ok_or_else(|| bad("has no string field \"passphrase\""))?;
        let version = number(&data, FIELD_VERSION)
            .map_err(|e| bad(&e))?
            .filter(|v| *v > 0)
            .ok_or_else(|| bad("has no keyplan_version"))?;
        let created_at = match number(&data, FIELD_CREATED_AT).map_err(|e| bad(&e))? {
            Some(t) => t,
            None => parse_time(&resp.metadata.created_time).unwrap_or_else(crate::clock::now_unix),
        };
        let base = number(&data, FIELD_BASE).map_err(|e| bad(&e))?;
        let base_version = number(&data, FIELD_BASE_VERSION).map_err(|e| bad(&e))?;
        Ok(PendingRead::Found(Pending {
            version,
            created_at,
            base,
            base_version,
            passphrase,
        }))
    }

    /// Reads the main and the pending path (retrying while the server is unavailable).
    /// [`VaultKms::read_state`] for callers about to write (a foreign write is a
    /// [`KmsError::Conflict`]), retrying while the server is unavailable.
    pub(super) fn read_both(&self, name: &str) -> Result<(Option<Main>, PendingRead), KmsError> {
        with_retries(&format!("read vault key {name}"), || {
            self.read_state(name, true)
        })
    }

    /// One attempt of [`crate::kms::Kms::read`]: the current version and its history (earlier KV
    /// versions whose material is gone read as retired) and the pending version that counts.
    pub(super) fn read_once(&self, name: &str) -> Result<KeyState, KmsError> {
        let (main, pending) = self.read_state(name, false)?;
        let mut st = KeyState::default();
        let live = main.as_ref().and_then(|m| m.live.as_ref());
        if let Some(live) = live {
            st.current = Some(live.version);
            st.holders = live.holders.clone();
            st.versions.insert(
                live.version,
                VersionInfo {
                    version: live.version,
                    created_at: live.created_at,
                    state: VersionState::Current,
                },
            );
            if !live.history.is_empty() {
                let meta = self.read_metadata(name)?;
                let now = crate::clock::now_unix();
                for h in &live.history {
                    let state = if material_kept(meta.as_ref(), h.kv_version, now) {
                        VersionState::Previous
                    } else {
                        VersionState::Retired
                    };
                    st.versions.entry(h.version).or_insert(VersionInfo {
                        version: h.version,
                        created_at: h.created_at,
                        state,
                    });
                }
            }
        }
        if let Some(p) = live_pending(live, &pending) {
            st.pending = Some(p.version);
            st.versions.insert(
                p.version,
                VersionInfo {
                    version: p.version,
                    created_at: p.created_at,
                    state: VersionState::Pending,
                },
            );
        }
        Ok(st)
    }

    /// One attempt of [`crate::kms::Kms::get`]: the material of `version`, from the current
    /// version, the history or the pending path.
    pub(super) fn get_once(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        let (main, pending) = self.read_state(name, false)?;
        if let Some(m) = &main {
            if let Some(live) = &m.live {
                if live.version == version {
                    return Ok(into_passphrase(&live.passphrase));
                }
                if let Some(h) = live.history.iter().find(|h| h.version == version) {
                    return self.get_old(name, *h);
                }
            }
        }
        let live = main.as_ref().and_then(|m| m.live.as_ref());
        match live_pending(live, &pending) {
            Some(p) if p.version == version => Ok(into_passphrase(&p.passphrase)),
            _ => Err(KmsError::NoSuchVersion {
                kms: self.describe(),
                key: name.to_string(),
                version,
            }),
        }
    }

    /// The material of an earlier version, from its KV version.
    fn get_old(&self, name: &str, h: Hist) -> Result<Passphrase, KmsError> {
        let gone = || KmsError::NoSuchVersion {
            kms: self.describe(),
            key: name.to_string(),
            version: h.version,
        };
        let resp = match self.read_secret(name, Some(h.kv_version))? {
            Read::Found(r) => r,
            Read::Absent | Read::Deleted(_) => return Err(gone()),
        };
        let mut data = match resp.data {
            Value::Object(m) => m,
            _ => return Err(gone()),
        };
        let recorded = number(&data, FIELD_VERSION).ok().flatten();
        if recorded.is_some_and(|v| v != h.version) {
            return Err(KmsError::corrupt(
                self,
                name,
                format!(
                    "{FIELD_HISTORY} maps version {} to KV version {}, but that KV version holds keyplan version {}; nothing was changed",
                    h.version,
                    h.kv_version,
                    recorded.unwrap_or(0)
                ),
            ));
        }
        let field = basename(name);
        match take_string(&mut data, field) {
            Some(p) => Ok(into_passphrase(&p)),
            None => Err(KmsError::corrupt(
                self,
                name,
                format!(
                    "KV version {} of {} has no string field {field:?}",
                    h.kv_version,
                    self.data_path(name)
                ),
            )),
        }
    }
}

/// The pending version that counts: one above the current version (a lower one is the
/// leftover of a commit whose cleanup was cut short).
pub(super) fn live_pending<'a>(
    live: Option<&Live>,
    pending: &'a PendingRead,
) -> Option<&'a Pending> {
    match pending {
        PendingRead::Found(p) if p.version > live.map_or(0, |l| l.version) => Some(p),
        _ => None,
    }
}

/// The version rules' view of what [`VaultKms::read_state`] returned: the current version,
/// the pending version that counts ([`live_pending`]), and every other version number known
/// (the history, and a pending leftover, whose number is not to be reused either).
pub(super) fn book_of(main: Option<&Main>, pending: &PendingRead) -> VersionBook {
    let live = main.and_then(|m| m.live.as_ref());
    let history = live
        .into_iter()
        .flat_map(|l| l.history.iter().map(|h| h.version));
    let leftover = match pending {
        PendingRead::Found(p) => Some(p.version),
        PendingRead::Absent | PendingRead::Leftover => None,
    };
    VersionBook::new(
        live.map(|l| l.version),
        live_pending(live, pending).map(|p| p.version),
        history.chain(leftover),
    )
}

/// Does KV version `kv` still hold material (not destroyed, not soft-deleted, not pruned)?
pub(super) fn material_kept(meta: Option<&ReadSecretMetadataResponse>, kv: u64, now: u64) -> bool {
    let Some(v) = meta.and_then(|m| m.versions.get(&kv.to_string())) else {
        return false;
    };
    if v.destroyed {
        return false;
    }
    // `delete_version_after` sets a deletion time in the future; it counts once passed.
    let t = v.deletion_time.trim();
    t.is_empty() || parse_time(t).is_some_and(|at| at > now)
}

/// Last path component of a key name: the data field holding the passphrase (Rook's layout).
pub(super) fn basename(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// The path of `name`'s pending version: `<name>.keyplan-pending` ([`PENDING_SUFFIX`]).
pub(super) fn pending_path(name: &str) -> String {
    format!("{name}{PENDING_SUFFIX}")
}

/// Moves a string field out of `data` into zeroizing storage (no copy of the bytes).
pub(super) fn take_string(
    data: &mut serde_json::Map<String, Value>,
    field: &str,
) -> Option<Zeroizing<String>> {
    match data.remove(field) {
        Some(Value::String(s)) => Some(Zeroizing::new(s)),
        _ => None,
    }
}

/// A `u64` field written as a decimal string (keyplan's form) or a JSON number.
pub(super) fn number(
    data: &serde_json::Map<String, Value>,
    field: &str,
) -> Result<Option<u64>, String> {
    match data.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("{field} is {s:?}, not a number")),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{field} is {n}, not a whole number")),
        Some(_) => Err(format!("{field} is not a number")),
    }
}

/// [`FIELD_HISTORY`]'s value (JSON text, or a JSON list) as [`Hist`] rows. Errors: what is wrong.
pub(super) fn parse_history(v: &Value) -> Result<Vec<Hist>, String> {
    let rows: Vec<[u64; 3]> = match v {
        Value::String(s) => serde_json::from_str(s),
        other => serde_json::from_value(other.clone()),
    }
    .map_err(|e| format!("not a JSON list of [version, kv_version, created_at] ({e})"))?;
    Ok(rows
        .into_iter()
        .map(|[version, kv_version, created_at]| Hist {
            version,
            kv_version,
            created_at,
        })
        .collect())
}

/// [`FIELD_HOLDERS`]'s text for `holders`; empty for none.
pub(super) fn holders_json(holders: &BTreeMap<String, u64>) -> String {
    if holders.is_empty() {
        String::new()
    } else {
        serde_json::to_string(holders).unwrap_or_default()
    }
}

/// [`FIELD_HISTORY`]'s text for `history`: compact JSON `[[version, kv_version, created_at], ...]`.
pub(super) fn history_json(history: &[Hist]) -> String {
    let rows: Vec<[u64; 3]> = history
        .iter()
        .map(|h| [h.version, h.kv_version, h.created_at])
        .collect();
    serde_json::Value::from(
        rows.iter()
            .map(|r| serde_json::Value::from(r.to_vec()))
            .collect::<Vec<_>>(),
    )
    .to_string()
}

/// Vault's RFC 3339 timestamps (`2024-05-01T12:00:00.123456789Z`) as Unix seconds.
pub(super) fn parse_time(t: &str) -> Option<u64> {
    crate::clock::parse_rfc3339(t)
}

fn into_passphrase(p: &Zeroizing<String>) -> Passphrase {
    Passphrase::new(p.as_bytes().to_vec())
}
