//! The cryptsetup driver: the only place keyplan touches LUKS headers.
//!
//! Every call runs `cryptsetup` (cryptsetup(8), version 2.6) through `duct` with `LC_ALL=C`,
//! judges outcomes by exit codes (cryptsetup(8) "RETURN CODES": 0 ok, 1 wrong parameters,
//! 2 no permission / bad passphrase, 3 out of memory, 4 wrong device, 5 device busy), and passes
//! passphrases only through pipes: stdin (`--key-file=-`, or `/dev/fd/0` for luksAddKey) and, for a second secret, an inherited
//! pipe on fd 3 (`--new-keyfile=/dev/fd/3`). Nothing secret is ever placed in argv, the
//! environment or a file.
//!
//! PBKDF runs caused by each call are counted in [`PbkdfCounter`]:
//!
//! | call | PBKDF runs |
//! |---|---|
//! | `open --test-passphrase --key-slot N` (verify) | 1 |
//! | `-v open --test-passphrase` (any keyslot: the `enroll_with` check) | 1, a lower bound: each keyslot tried costs 1 |
//! | `luksAddKey --key-slot N --new-key-slot M` with explicit PBKDF parameters | 2 (unlock, derive) |
//! | `luksAddKey` without `--key-slot` | 2, a lower bound: each keyslot tried costs 1 |
//! | `benchmark --pbkdf TYPE` (at most once per PBKDF type per run, see `bench`) | 1 |
//! | `luksFormat` | 1 |
//! | `luksKillSlot --batch-mode` (no key input), `luksDump`, `isLuks`, `token` | 0 |
//!
//! A `luksAddKey` without forced iterations would also benchmark inside cryptsetup (about one
//! more run, uncounted): keyplan passes the parameters measured by its own one benchmark per run
//! instead, and falls back to that only when its benchmark failed.
//!
//! Headers are read in process and read-only ([`ondisk`]: no process, and no tool that may
//! repair a damaged copy); only writes and PBKDF tests run cryptsetup.
//!
//! Layout: this file declares the types; `driver` implements [`Cryptsetup`]'s operations,
//! `ondisk` reads headers, `dump` parses LUKS2 JSON metadata (and `luksDump` output, for the
//! differential test) and `run` starts the child processes (locale, pipes, capture).

mod bench;
mod door;
mod driver;
mod dump;
mod kdf;
pub mod ondisk;
pub(crate) mod run;

pub use bench::DEFAULT_ITER_TIME_MS;
pub use door::{check_kill, LuksDoor};
pub use driver::{pbkdf_args, AnyKeyslot, PROGRAM_ENV};
pub use kdf::{kdf_drift, pbkdf_id, KdfDrift, KdfHost};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// LUKS on-disk format version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LuksVersion {
    /// LUKS1: 8 keyslots, no tokens, always bound keyslots.
    Luks1,
    /// LUKS2: 32 keyslots, JSON metadata, tokens.
    Luks2,
}

impl std::fmt::Display for LuksVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LuksVersion::Luks1 => "LUKS1",
            LuksVersion::Luks2 => "LUKS2",
        })
    }
}

impl LuksVersion {
    /// Number of keyslots: 8 for LUKS1, 32 for LUKS2 (cryptsetup(8), "luksAddKey").
    pub fn max_keyslots(self) -> u32 {
        match self {
            LuksVersion::Luks1 => 8,
            LuksVersion::Luks2 => 32,
        }
    }
}

/// LUKS2 keyslot priority (cryptsetup(8) `config --priority`): `ignore` keyslots are skipped by
/// unlocks that do not name a keyslot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Priority {
    /// 0: used only when named with `--key-slot`.
    Ignore,
    /// 1: default.
    Normal,
    /// 2: tried first.
    Prefer,
}

/// One occupied keyslot as read from the header (no PBKDF needed).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Keyslot {
    /// True when a digest covering data segment 0 lists this keyslot (LUKS2), always true for
    /// an enabled LUKS1 keyslot. Only bound keyslots open the data.
    pub bound: bool,
    /// The keyslot's KDF salt as printed by cryptsetup (LUKS2: base64 from the JSON metadata;
    /// LUKS1: the hex bytes of the text dump with white space removed). Changes whenever the
    /// keyslot is rewritten.
    pub salt: String,
    /// LUKS2 priority; `Normal` for LUKS1.
    pub priority: Priority,
    /// KDF type, e.g. `pbkdf2`, `argon2id`.
    pub kdf: String,
    /// Memory cost in KiB of one PBKDF run of this keyslot: the argon2 `kdf.memory` of the
    /// LUKS2 metadata; `None` for pbkdf2 (and every LUKS1 keyslot), which needs no more than a
    /// few KiB.
    pub memory_kib: Option<u64>,
    /// PBKDF2 iterations, or the argon2 time cost (LUKS2 metadata `kdf.iterations` or
    /// `kdf.time`; LUKS1 `Iterations:`); `None` when the header does not say.
    #[serde(default)]
    pub iterations: Option<u64>,
    /// Argon2 threads (LUKS2 metadata `kdf.cpus`); `None` for pbkdf2.
    #[serde(default)]
    pub parallel: Option<u64>,
}

/// One LUKS2 token (`tokens` object of the JSON metadata).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Token {
    /// Token id (0-31).
    pub id: u32,
    /// The token's `type` field, e.g. `keyplan`, `systemd-tpm2`.
    pub token_type: String,
    /// Keyslots the token is assigned to.
    pub keyslots: Vec<u32>,
    /// The whole token JSON object as stored in the header.
    pub json: serde_json::Value,
}

/// What `luksDump` says about a device.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Header {
    /// LUKS1 or LUKS2.
    pub version: LuksVersion,
    /// The LUKS UUID (lower case as printed).
    pub uuid: String,
    /// Occupied keyslots by number.
    pub keyslots: BTreeMap<u32, Keyslot>,
    /// LUKS2 tokens by id (always empty for LUKS1).
    pub tokens: BTreeMap<u32, Token>,
    /// LUKS2: `(json_size, used)` of the JSON metadata area in bytes, from the same dump
    /// (`used` is an upper bound: compact JSON with each `/` counted twice, plus the
    /// terminating NUL); `None` for LUKS1, which has no JSON area.
    pub json_area: Option<(u64, u64)>,
    /// LUKS2: the header's `Epoch:` (metadata sequence id; cryptsetup increments it on every
    /// metadata write, so a changed epoch means the header changed). `None` for LUKS1, or when
    /// the dump prints none.
    pub epoch: Option<u64>,
    /// What a new pbkdf2 keyslot of this device derives with, for benchmarking it: the hash
    /// (LUKS1: the header's `Hash spec:`; LUKS2: cryptsetup's default, sha256) and the keyslot
    /// key size in bits (LUKS1: `MK bits:`; LUKS2: the first keyslot's `key_size` × 8), `None`
    /// when the dump shows none.
    pub pbkdf2_target: (String, Option<u32>),
    /// Damage, and states in which cryptsetup will not change the header, found while reading
    /// it ([`ondisk`]); default (nothing) for a healthy header.
    #[serde(default)]
    pub condition: ondisk::Condition,
}

/// The device [`Cryptsetup::add_keyslot`] adds to: its LUKS version and, when a header was
/// already read, what a new pbkdf2 keyslot derives with ([`Header::pbkdf2_target`]), so a
/// pbkdf2 benchmark needs no further `luksDump`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddTarget {
    /// LUKS1 or LUKS2.
    pub version: LuksVersion,
    /// [`Header::pbkdf2_target`]; `None`: read with a `luksDump` when a pbkdf2 benchmark needs it.
    pub pbkdf2: Option<(String, Option<u32>)>,
}

impl From<LuksVersion> for AddTarget {
    fn from(version: LuksVersion) -> Self {
        AddTarget {
            version,
            pbkdf2: None,
        }
    }
}

impl From<&Header> for AddTarget {
    fn from(header: &Header) -> Self {
        AddTarget {
            version: header.version,
            pbkdf2: Some(header.pbkdf2_target.clone()),
        }
    }
}

/// The most bytes cryptsetup reads from a key file (8 MiB: cryptsetup(8), `--keyfile-size`,
/// "Maximum keyfile size exceeded"); a longer `enroll_with` file cannot be a passphrase.
pub const MAX_KEYFILE_BYTES: u64 = 8 << 20;

/// Counts PBKDF runs (key derivations) keyplan caused; shared by clones of [`Cryptsetup`].
#[derive(Debug, Default)]
pub struct PbkdfCounter(AtomicU64);

impl PbkdfCounter {
    /// Runs counted so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    /// Adds `n` runs.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
}

/// Errors from the cryptsetup driver. Messages name the device, the operation and keyslot,
/// and include cryptsetup's stderr (which never holds key material: keys go through pipes).
#[derive(Debug, thiserror::Error)]
pub enum LuksError {
    /// The device path does not exist or cannot be read.
    #[error("device {path}: {message}")]
    Device {
        /// Device path.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The device exists but is not a LUKS container (`cryptsetup luksDump` exit 1, as `isLuks`).
    #[error("device {path} is not a LUKS device (no LUKS signature at offset 0, and no valid LUKS2 header copy at the offsets the LUKS2 specification lists); nothing was changed")]
    NotLuks {
        /// Device path.
        path: PathBuf,
    },
    /// cryptsetup could not be started (not installed?).
    #[error(
        "could not run {program}: {source}; install cryptsetup (apt-get install -y cryptsetup-bin)"
    )]
    Spawn {
        /// Program path.
        program: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// cryptsetup ran and failed.
    #[error("cryptsetup {operation} on {path} failed (exit code {code}): {stderr}")]
    Failed {
        /// e.g. `luksAddKey into keyslot 3`.
        operation: String,
        /// Device path.
        path: PathBuf,
        /// Exit code (cryptsetup(8) RETURN CODES).
        code: i32,
        /// cryptsetup's stderr, trimmed, lines joined with `"; "`, followed by what keyplan
        /// knows was left untouched (e.g. `; existing keyslots were left untouched`).
        stderr: String,
    },
    /// keyplan refused the request before running cryptsetup, because it is invalid or unsafe:
    /// an empty passphrase, a keyslot or token id out of range, killing the last bound keyslot,
    /// a token on a LUKS1 device, malformed token JSON. Nothing was run and nothing changed.
    /// (Added by the driver; not in the original declaration.)
    #[error("refusing {operation} on {path}: {reason}; nothing was changed")]
    Refused {
        /// e.g. `luksKillSlot of keyslot 0`.
        operation: String,
        /// Device path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// cryptsetup's output could not be understood.
    #[error("could not parse cryptsetup {operation} output for {path}: {message}")]
    Parse {
        /// e.g. `luksDump`.
        operation: String,
        /// Device path.
        path: PathBuf,
        /// What was unexpected.
        message: String,
    },
}

/// Handle to the `cryptsetup` program. Cheap to clone; clones share the PBKDF counter and the
/// PBKDF benchmarks of the run (see `bench`).
#[derive(Debug, Clone)]
pub struct Cryptsetup {
    program: PathBuf,
    counter: Arc<PbkdfCounter>,
    /// Benchmarks run so far by request; `None` when one failed (the old behaviour is used).
    benchmarks: Arc<std::sync::Mutex<BTreeMap<bench::Request, Option<bench::Measured>>>>,
}

/// A size for test and example images that suits both versions as [`Cryptsetup::format`] lays
/// them out: 9 MiB (LUKS2: 2 × 16 KiB metadata + 8 MiB keyslots area; LUKS1 needs 2 MiB). The
/// data segment of such an image is empty, which is fine: keyplan only touches headers.
pub const TEST_IMAGE_BYTES: u64 = 9 << 20;

/// Creates a new sparse image file of `size_bytes` bytes for [`Cryptsetup::format`] (tests and
/// examples). Never overwrites: the file must not exist yet.
///
/// Errors: [`LuksError::Device`] when the file exists already or cannot be created or sized.
pub fn create_image(path: &Path, size_bytes: u64) -> Result<(), LuksError> {
    let device_error = |what: &str, e: std::io::Error| LuksError::Device {
        path: path.to_owned(),
        message: format!("cannot {what} image file: {e}"),
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| device_error("create", e))?;
    file.set_len(size_bytes)
        .map_err(|e| device_error("size", e))?;
    Ok(())
}
