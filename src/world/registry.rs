//! The device registry: `<state_dir>/devices.json`, every device a run has touched, keyed by
//! LUKS UUID (lower case).
//!
//! Retention consults it: a device that left the plan may still hold an old key version, so
//! such a version is kept until no device keyplan knows holds it (docs/architecture.md,
//! "Retention"). Keying by LUKS UUID means re-pointing a device id at another disk does not
//! forget the first one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::format::state::files::{DeviceV1, DevicesV1};
use crate::format::state::ReadError;
use crate::format::NewerFormat;
use crate::fsutil;

/// File name of the device registry in the state directory.
pub const REGISTRY_FILE: &str = "devices.json";

/// One device keyplan has worked on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryEntry {
    /// Device id in the plan when keyplan last worked on it.
    pub id: String,
    /// Device path then.
    pub path: PathBuf,
}

/// `<state_dir>/devices.json` as the engine uses it (the file's format:
/// [`crate::format::state::files::DevicesV1`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registry {
    /// LUKS UUID (lower case) -> entry.
    pub devices: BTreeMap<String, RegistryEntry>,
}

impl From<DevicesV1> for Registry {
    fn from(f: DevicesV1) -> Registry {
        Registry {
            devices: f
                .devices
                .into_iter()
                .map(|(uuid, d)| {
                    let entry = RegistryEntry {
                        id: d.id,
                        path: d.path,
                    };
                    (uuid, entry)
                })
                .collect(),
        }
    }
}

impl From<&Registry> for DevicesV1 {
    fn from(r: &Registry) -> DevicesV1 {
        DevicesV1 {
            format: 1,
            devices: r
                .devices
                .iter()
                .map(|(uuid, e)| {
                    let device = DeviceV1 {
                        id: e.id.clone(),
                        path: e.path.clone(),
                    };
                    (uuid.clone(), device)
                })
                .collect(),
        }
    }
}

/// Writes `reg` to `<state_dir>/devices.json` (atomically, mode 0600, in a 0700 directory).
///
/// Errors: [`RegistryError::Io`].
fn write(state_dir: &Path, reg: &Registry) -> Result<(), RegistryError> {
    fsutil::write_json_private(state_dir, REGISTRY_FILE, &DevicesV1::from(reg)).map_err(|source| {
        RegistryError::Io {
            what: "writing",
            path: state_dir.join(REGISTRY_FILE),
            source,
        }
    })
}

/// Errors reading or writing the registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The file was written by a newer keyplan: refused, nothing written.
    #[error(transparent)]
    Newer(#[from] NewerFormat),
    /// The file exists but cannot be parsed; keyplan never guesses at it, because a lost
    /// registry could let a rotation destroy a version an absent device still needs.
    #[error("{} is corrupt ({detail}); keyplan will not guess which devices it worked on. Restore it from a backup, or fix it by hand: {{\"format\":1,\"devices\":{{\"<LUKS UUID>\":{{\"id\":\"<device id>\",\"path\":\"<path>\"}}}}}}", path.display())]
    Corrupt {
        /// The registry file.
        path: PathBuf,
        /// The parser's message.
        detail: String,
    },
    /// The file could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// `reading` or `writing`.
        what: &'static str,
        /// The registry file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Reads `<state_dir>/devices.json`; an empty registry when the file does not exist.
///
/// Errors: [`RegistryError::Newer`] (a newer keyplan's file), [`RegistryError::Corrupt`],
/// [`RegistryError::Io`].
pub fn read(state_dir: &Path) -> Result<Registry, RegistryError> {
    let path = state_dir.join(REGISTRY_FILE);
    let bytes = match crate::format::state::read_file(&path) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(Registry::default()),
        Err(source) => {
            return Err(RegistryError::Io {
                what: "reading",
                path,
                source,
            })
        }
    };
    match crate::format::state::files::read_devices(&path.display().to_string(), &bytes) {
        Ok(f) => Ok(f.into()),
        Err(ReadError::Newer(n)) => Err(RegistryError::Newer(n)),
        Err(ReadError::Corrupt(detail)) => Err(RegistryError::Corrupt { path, detail }),
    }
}

/// Removes the entries of LUKS UUIDs `uuids` from `<state_dir>/devices.json` (atomically),
/// for a device gone for good (`keyplan device forget`); returns the entries removed.
///
/// Errors: the registry is corrupt, or could not be written.
pub fn remove(
    state_dir: &Path,
    uuids: &[String],
) -> Result<Vec<(String, RegistryEntry)>, RegistryError> {
    let mut reg = read(state_dir)?;
    let gone: Vec<(String, RegistryEntry)> = uuids
        .iter()
        .filter_map(|u| {
            let u = u.to_lowercase();
            reg.devices.remove(&u).map(|e| (u, e))
        })
        .collect();
    if gone.is_empty() {
        return Ok(gone);
    }
    write(state_dir, &reg)?;
    Ok(gone)
}

/// Adds `devices` (`(device id, LUKS UUID, path)`) to `<state_dir>/devices.json` (atomically,
/// mode 0600, in a 0700 directory), keeping entries of devices no longer in the plan, so later
/// rotations keep what they hold.
///
/// Errors: the registry is corrupt, or could not be written.
pub fn update<'a>(
    state_dir: &Path,
    devices: impl IntoIterator<Item = (&'a str, &'a str, &'a Path)>,
) -> Result<(), RegistryError> {
    let mut reg = read(state_dir)?;
    for (id, uuid, path) in devices {
        reg.devices.insert(
            uuid.to_lowercase(),
            RegistryEntry {
                id: id.to_string(),
                path: path.to_path_buf(),
            },
        );
    }
    write(state_dir, &reg)
}
