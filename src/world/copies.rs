//! Copies of retired key versions: `<state_dir>/copies.json`, the keyslots keyplan did not
//! make that it found opening with a key version when it retired that version.
//!
//! A rotation's point is that the old key stops working. Before a version is destroyed in the
//! KMS (`retire`), keyplan still knows its material, so it tests every unmanaged bound keyslot
//! of the devices that held it once (the `find copies` step, one PBKDF run per keyslot). A
//! copy under `unmanaged_keyslots: keep` is not keyplan's to remove: it is remembered here, by
//! LUKS UUID, keyslot and KDF salt, so that `status` and `plan` keep reporting it (no PBKDF
//! run needed) for as long as that keyslot is unchanged. Nothing secret is stored.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::format::state::files::{CopiesV1, CopyV1};
use crate::format::state::ReadError;
use crate::format::NewerFormat;
use crate::fsutil;

/// File name of the copies record in the state directory.
pub const COPIES_FILE: &str = "copies.json";

/// One keyslot found to open with a version keyplan retired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetiredCopy {
    /// The device's LUKS UUID (lower case).
    pub uuid: String,
    /// The device id in the plan when found.
    pub device: String,
    /// The keyslot.
    pub slot: u32,
    /// Its KDF salt when tested: the record stands while the keyslot keeps it.
    pub salt: String,
    /// Key id.
    pub key: String,
    /// The version that opened it, retired since.
    pub version: u64,
    /// When it was found, Unix seconds.
    pub found_at: u64,
}

impl RetiredCopy {
    /// One line for people, with what to do; `path` is the device's: `keyslot 3 still opens
    /// with k v1, which keyplan retired (found ...): ... Remove it (...)`. For `status` (a
    /// problem) and `plan` (a note).
    pub fn describe(&self, path: &Path) -> String {
        format!(
            "keyslot {} still opens with {} v{}, which keyplan retired (found {}): a copy keyplan did not make, kept because of `unmanaged_keyslots: keep`; anyone who has that old key can still open the device. Remove it (`cryptsetup luksKillSlot {} {}`), or set `unmanaged_keyslots: remove`",
            self.slot,
            self.key,
            self.version,
            crate::clock::rfc3339(self.found_at),
            path.display(),
            self.slot
        )
    }
}

impl From<CopyV1> for RetiredCopy {
    fn from(c: CopyV1) -> RetiredCopy {
        RetiredCopy {
            uuid: c.uuid,
            device: c.device,
            slot: c.slot,
            salt: c.salt,
            key: c.key,
            version: c.version,
            found_at: c.found_at,
        }
    }
}

impl From<&RetiredCopy> for CopyV1 {
    fn from(c: &RetiredCopy) -> CopyV1 {
        CopyV1 {
            uuid: c.uuid.clone(),
            device: c.device.clone(),
            slot: c.slot,
            salt: c.salt.clone(),
            key: c.key.clone(),
            version: c.version,
            found_at: c.found_at,
        }
    }
}

/// Errors reading or writing the copies record.
#[derive(Debug, thiserror::Error)]
pub enum CopiesError {
    /// The file was written by a newer keyplan: refused, nothing written.
    #[error(transparent)]
    Newer(#[from] NewerFormat),
    /// The file cannot be parsed.
    #[error("{} is corrupt ({detail}); delete it: the next retirement of a key version tests the keyslots again", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        detail: String,
    },
    /// The file could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// `reading` or `writing`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Every copy recorded in `state_dir` (none when there is no file).
///
/// Errors: [`CopiesError::Newer`] (a newer keyplan's file), [`CopiesError::Corrupt`],
/// [`CopiesError::Io`].
pub fn read(state_dir: &Path) -> Result<Vec<RetiredCopy>, CopiesError> {
    let path = state_dir.join(COPIES_FILE);
    let bytes = match crate::format::state::read_file(&path) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(Vec::new()),
        Err(source) => {
            return Err(CopiesError::Io {
                what: "reading",
                path,
                source,
            })
        }
    };
    match crate::format::state::files::read_copies(&path.display().to_string(), &bytes) {
        Ok(f) => Ok(f.copies.into_iter().map(RetiredCopy::from).collect()),
        Err(ReadError::Newer(n)) => Err(CopiesError::Newer(n)),
        Err(ReadError::Corrupt(detail)) => Err(CopiesError::Corrupt { path, detail }),
    }
}

/// Records `found` (atomically, mode 0600) and drops the records of device `uuid`'s keyslots
/// that `still` (keyslot -> salt of the header read now) no longer has with their salt.
///
/// Errors: [`CopiesError`].
pub fn record(
    state_dir: &Path,
    uuid: &str,
    still: &std::collections::BTreeMap<u32, String>,
    found: &[RetiredCopy],
) -> Result<(), CopiesError> {
    let mut copies = read(state_dir)?;
    let uuid = uuid.to_lowercase();
    copies.retain(|c| c.uuid != uuid || still.get(&c.slot) == Some(&c.salt));
    for f in found {
        copies.retain(|c| !(c.uuid == f.uuid && c.slot == f.slot && c.salt == f.salt));
        copies.push(f.clone());
    }
    let file = CopiesV1 {
        format: 1,
        copies: copies.iter().map(CopyV1::from).collect(),
    };
    fsutil::write_json_private(state_dir, COPIES_FILE, &file).map_err(|source| CopiesError::Io {
        what: "writing",
        path: state_dir.join(COPIES_FILE),
        source,
    })
}
