//! [`Cryptsetup`]'s operations: one cryptsetup(8) action each (cryptsetup 2.6 documents every
//! action in its own page, cryptsetup-ACTION(8), referenced below).
//!
//! Exit codes observed with cryptsetup 2.6.1 (`LC_ALL=C`), which the code relies on:
//!
//! | situation | exit |
//! |---|---|
//! | `open --test-passphrase`: wrong passphrase for the keyslot | 2 |
//! | `open --test-passphrase`: named keyslot empty, or out of range | 1 |
//! | `open --test-passphrase` on an unbound keyslot with its passphrase | 0 (!) |
//! | `luksAddKey`: target keyslot occupied / keyslots area full / out of range | 1 |
//! | `luksAddKey`: wrong passphrase for the unlocking keyslot | 2 |
//! | `luksAddKey`: unlocking keyslot empty | 1 |
//! | `luksKillSlot --batch-mode` with stdin `/dev/null`, even the last keyslot | 0 (!) |
//! | `luksKillSlot`: keyslot not active | 1 |
//! | `token import`: id in use without `--token-replace`, keyslot missing, metadata full | 1 |
//! | `token remove`: token not in use | 1 |
//! | `isLuks` and `luksDump`: not LUKS (also an empty file) | 1; missing path or directory: 4 |

mod format;
mod header;
mod keyslots;
mod tokens;
mod unlock;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::run::{self, Outcome};
use super::{Cryptsetup, LuksError, LuksVersion, PbkdfCounter};
use crate::spec::{PbkdfSettings, PbkdfType};

/// Highest keyslot count of any LUKS version (LUKS2: 32); LUKS2 also allows 32 tokens.
const MAX_IDS: u32 = 32;

/// Environment variable naming the cryptsetup program to run (see [`Cryptsetup::new`]).
pub const PROGRAM_ENV: &str = "KEYPLAN_CRYPTSETUP";

/// What [`Cryptsetup::test_any_keyslot`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnyKeyslot {
    /// No keyslot cryptsetup tried opens with the passphrase.
    Fails,
    /// Keyslot N opens (cryptsetup printed `Key slot N unlocked.`).
    Keyslot(u32),
    /// It opens, but cryptsetup did not say which keyslot.
    Unknown,
}

impl Default for Cryptsetup {
    /// Same as [`Cryptsetup::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl Cryptsetup {
    /// A driver running the program named by the `KEYPLAN_CRYPTSETUP` environment variable when
    /// it is set and not empty, else `cryptsetup` looked up in `PATH`. Starts nothing; a missing
    /// program shows up as [`LuksError::Spawn`] on first use. Fresh PBKDF counter at 0.
    pub fn new() -> Self {
        let program = std::env::var_os(PROGRAM_ENV)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("cryptsetup"));
        Self::with_program(program)
    }

    /// A driver running `program` (a path, or a name looked up in `PATH`) instead of
    /// `cryptsetup`. Fresh PBKDF counter at 0.
    pub fn with_program(program: PathBuf) -> Self {
        Cryptsetup {
            program,
            counter: Arc::new(PbkdfCounter::default()),
            benchmarks: Arc::default(),
        }
    }

    /// The program this driver runs.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// PBKDF runs (key derivations) counted so far by this driver and its clones (a count, not a
    /// time). See each operation for what it adds.
    pub fn pbkdf_runs(&self) -> u64 {
        self.counter.get()
    }

    /// The shared PBKDF counter (the same one clones of this driver add to).
    pub fn counter(&self) -> Arc<PbkdfCounter> {
        Arc::clone(&self.counter)
    }

    /// Runs cryptsetup with `argv`; only start failures are errors.
    fn exec(
        &self,
        argv: Vec<OsString>,
        stdin: Option<&[u8]>,
        fd3: Option<&[u8]>,
    ) -> Result<Outcome, LuksError> {
        run::run(&self.program, &argv, stdin, fd3).map_err(|source| LuksError::Spawn {
            program: self.program.clone(),
            source,
        })
    }
}

/// cryptsetup arguments for PBKDF `settings` on a device of `version` (cryptsetup(8) options
/// `--pbkdf`, `--pbkdf-force-iterations`, `--iter-time` (milliseconds), `--pbkdf-memory` (KiB),
/// `--pbkdf-parallel` (threads)), as written in the plan. `luksFormat` uses them as they are;
/// `luksAddKey` only when they force iterations, or when the run's one PBKDF benchmark failed
/// (see [`Cryptsetup::add_keyslot`]): without forced iterations cryptsetup benchmarks on each
/// call.
///
/// * `None`: nothing (cryptsetup's defaults, with a benchmark).
/// * pbkdf2: `--pbkdf pbkdf2`, then `--pbkdf-force-iterations N` when `iterations` is set, else
///   `--iter-time MS` when `iter_time_ms` is set. cryptsetup refuses both together, so forced
///   iterations win. `memory_kib`/`parallel` are not passed (meaningless for pbkdf2).
/// * argon2id/argon2i on LUKS2: `--pbkdf TYPE`, `--pbkdf-memory KiB`, `--pbkdf-parallel N`,
///   and `--pbkdf-force-iterations N` (time cost) or else `--iter-time MS`, each when set.
/// * argon2 on LUKS1: nothing (LUKS1 only knows pbkdf2; cryptsetup uses its pbkdf2 default).
pub fn pbkdf_args(version: LuksVersion, settings: Option<&PbkdfSettings>) -> Vec<OsString> {
    let Some(s) = settings else {
        return Vec::new();
    };
    let name = match (s.kind, version) {
        (PbkdfType::Pbkdf2, _) => "pbkdf2",
        (_, LuksVersion::Luks1) => return Vec::new(),
        (PbkdfType::Argon2id, LuksVersion::Luks2) => "argon2id",
        (PbkdfType::Argon2i, LuksVersion::Luks2) => "argon2i",
    };
    let mut out: Vec<OsString> = vec!["--pbkdf".into(), name.into()];
    if s.kind != PbkdfType::Pbkdf2 {
        if let Some(m) = s.memory_kib {
            out.extend(["--pbkdf-memory".into(), m.to_string().into()]);
        }
        if let Some(p) = s.parallel {
            out.extend(["--pbkdf-parallel".into(), p.to_string().into()]);
        }
    }
    if let Some(i) = s.iterations {
        out.extend(["--pbkdf-force-iterations".into(), i.to_string().into()]);
    } else if let Some(t) = s.iter_time_ms {
        out.extend(["--iter-time".into(), t.to_string().into()]);
    }
    out
}

/// `words...` followed by the device path.
fn args<const N: usize>(words: [&str; N], dev: &Path) -> Vec<OsString> {
    let mut v: Vec<OsString> = words.into_iter().map(OsString::from).collect();
    v.push(dev.as_os_str().to_owned());
    v
}

/// Checks that `dev` exists and is a block device or a regular file (not a directory, a
/// character device such as `/dev/null`, a FIFO or a socket), so cryptsetup's vaguer exit 4
/// is avoided.
fn check_device(dev: &Path) -> Result<(), LuksError> {
    use std::os::unix::fs::FileTypeExt;
    let message = match std::fs::metadata(dev) {
        Ok(m) if m.is_dir() => {
            "is a directory, not a block device or LUKS image file; nothing was changed".to_owned()
        }
        Ok(m) if m.is_file() || m.file_type().is_block_device() => return Ok(()),
        Ok(m) => {
            let t = m.file_type();
            let kind = if t.is_char_device() {
                "a character device"
            } else if t.is_fifo() {
                "a FIFO"
            } else if t.is_socket() {
                "a socket"
            } else {
                "not a regular file"
            };
            format!(
                "is {kind}, not a block device or LUKS image file (LUKS lives on a block device or in an image file); nothing was changed"
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            "does not exist (no such block device or image file); nothing was changed".to_owned()
        }
        Err(e) => format!("cannot be accessed: {e}; nothing was changed"),
    };
    Err(LuksError::Device {
        path: dev.to_owned(),
        message,
    })
}

/// A [`LuksError::Failed`] from a finished child; `note` says what was left untouched.
fn failed(operation: &str, dev: &Path, out: &Outcome, note: Option<&str>) -> LuksError {
    let mut stderr = if out.stderr.is_empty() {
        "(no message)".to_owned()
    } else {
        out.stderr.clone()
    };
    match (out.code, out.signal) {
        (None, Some(9)) => stderr.push_str(
            " (killed by SIGKILL: by the kernel's OOM killer when memory ran out, see `dmesg`, or by an operator; lower settings.memory_budget_kib or settings.pbkdf.memory_kib if memory is short)",
        ),
        (None, Some(n)) => stderr.push_str(&format!(" (killed by signal {n})")),
        (None, None) => stderr.push_str(" (killed by a signal)"),
        _ => {}
    }
    if let Some(n) = note {
        stderr.push_str("; ");
        stderr.push_str(n);
    }
    LuksError::Failed {
        operation: operation.to_owned(),
        path: dev.to_owned(),
        code: out.code.unwrap_or(-1),
        stderr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(kind: PbkdfType) -> PbkdfSettings {
        PbkdfSettings {
            kind,
            memory_kib: Some(65536),
            parallel: Some(2),
            iter_time_ms: Some(500),
            iterations: None,
        }
    }

    fn strings(v: Vec<OsString>) -> Vec<String> {
        v.into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn pbkdf_arguments() {
        use LuksVersion::*;
        assert!(pbkdf_args(Luks2, None).is_empty());
        assert_eq!(
            strings(pbkdf_args(Luks2, Some(&settings(PbkdfType::Argon2id)))),
            [
                "--pbkdf",
                "argon2id",
                "--pbkdf-memory",
                "65536",
                "--pbkdf-parallel",
                "2",
                "--iter-time",
                "500"
            ]
        );
        assert!(pbkdf_args(Luks1, Some(&settings(PbkdfType::Argon2i))).is_empty());
        let mut p = settings(PbkdfType::Pbkdf2);
        assert_eq!(
            strings(pbkdf_args(Luks1, Some(&p))),
            ["--pbkdf", "pbkdf2", "--iter-time", "500"]
        );
        p.iterations = Some(1000);
        assert_eq!(
            strings(pbkdf_args(Luks2, Some(&p))),
            ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]
        );
        let mut a = settings(PbkdfType::Argon2i);
        a.iterations = Some(4);
        a.memory_kib = None;
        assert_eq!(
            strings(pbkdf_args(Luks2, Some(&a))),
            [
                "--pbkdf",
                "argon2i",
                "--pbkdf-parallel",
                "2",
                "--pbkdf-force-iterations",
                "4"
            ]
        );
    }
}
