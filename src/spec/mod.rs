//! Plan files: loading YAML/TOML (DESIGN.md §3), validation, and diagnostics that point at
//! `file:line:column`.
//!
//! [`load`] turns a plan file into a validated [`Plan`]; every error it returns is a
//! `miette::Report` with the source file attached and a label on the offending span.
//! Errors that can only be found later (after a device's header was read, e.g. a keyslot out of
//! range for LUKS1) are built with [`Plan::error_at`], so they point at the plan file too.

pub mod model;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use model::{KmsConfig, PbkdfSettings, PbkdfType, UnmanagedKeyslots};

/// One segment of a path into the plan document, e.g. `devices` / `osd0` / `keys` / `1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSeg {
    /// A mapping key.
    Key(String),
    /// A sequence index (0-based).
    Index(usize),
}

/// A validated plan: paths resolved against the plan file's directory, durations parsed.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The plan file as given (for messages).
    pub source_path: PathBuf,
    /// Directory of the plan file; relative paths are resolved against it.
    pub base_dir: PathBuf,
    /// Journal, lock and LUKS1 records (default `<base_dir>/.keyplan`).
    pub state_dir: PathBuf,
    /// KMS instances by name; `File { path }` holds an absolute path.
    pub kms: BTreeMap<String, KmsConfig>,
    /// Keys by id.
    pub keys: BTreeMap<String, Key>,
    /// Devices by id.
    pub devices: BTreeMap<String, Device>,
    /// PBKDF for new keyslots; `None`: cryptsetup's default.
    pub pbkdf: Option<PbkdfSettings>,
    /// Devices worked on at once (>= 1; default 4).
    pub parallelism: usize,
    /// The raw text and a span index, for diagnostics.
    source: Source,
}

/// A key of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// Id (the mapping key under `keys:`).
    pub id: String,
    /// KMS instance name.
    pub kms: String,
    /// Name in the KMS (default: the id).
    pub name: String,
    /// Maximum age of the current version before rotation.
    pub rotate_after: Option<Duration>,
    /// `rotate_after` as written (for messages), e.g. `90d`.
    pub rotate_after_text: Option<String>,
    /// Random bytes in a new version (default 32).
    pub bytes: usize,
}

/// A device of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// Id (the mapping key under `devices:`).
    pub id: String,
    /// Absolute path (not canonicalized: symlinks kept as written).
    pub path: PathBuf,
    /// Expected LUKS UUID.
    pub uuid: Option<String>,
    /// Keys that must open this device, in plan order.
    pub keys: Vec<DeviceKey>,
    /// Policy for keyslots keyplan cannot attribute.
    pub unmanaged: UnmanagedKeyslots,
    /// Absolute path of the `enroll_with` passphrase file.
    pub enroll_with: Option<PathBuf>,
}

/// A key listed on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceKey {
    /// Key id.
    pub key: String,
    /// Pinned keyslot.
    pub keyslot: Option<u32>,
}

/// The plan file's text and format, kept for diagnostics (placeholder; spec loader fills it).
#[derive(Debug, Clone)]
struct Source {
    text: String,
}
