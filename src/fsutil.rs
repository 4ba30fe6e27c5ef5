//! Small filesystem helpers shared by the file KMS, the LUKS1 record store and the journal:
//! atomic private writes, private directories and `flock(2)` locks.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use atomic_write_file::unix::OpenOptionsExt as _;
use atomic_write_file::AtomicWriteFile;
use std::os::unix::fs::OpenOptionsExt as _;

/// Writes `bytes` to `path` atomically: a temporary file in the same directory with mode
/// `mode` (e.g. `0o600`), `fsync`, `rename(2)` over `path`, then `fsync` of the directory.
/// A crash leaves either the old or the new content, never a torn file.
///
/// Errors: any I/O error, with `path` untouched.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let mut file = AtomicWriteFile::options()
        .preserve_mode(false)
        .mode(mode)
        .open(path)?;
    file.write_all(bytes)?;
    file.commit()?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(())
}

/// `fsync(2)` on a directory so that renames and creations in it are durable.
///
/// Errors: the directory cannot be opened or synced.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    fs::File::open(dir)?.sync_all()
}

/// Creates `dir` (and missing parents) with mode 0700; an existing directory gets its mode set
/// to 0700 too, so key material and records are readable by the owner only.
///
/// Errors: creation or `chmod` failed, or `dir` exists and is not a directory.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = fs::metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} exists and is not a directory",
            dir.display()
        )));
    }
    if meta.permissions().mode() & 0o777 != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Opens (creating if needed, mode 0600) a file to hold an advisory `flock(2)` lock.
///
/// Errors: the file cannot be opened or created.
pub fn open_lock_file(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
}

/// An advisory `flock(2)` lock held on an open file, released with an explicit `LOCK_UN`
/// (`File::unlock`) when dropped, not just by closing the file.
///
/// Closing is not enough while another thread of the process is starting a child (a
/// cryptsetup run, a KMS helper): between its `fork` and its `exec` the child holds a copy of
/// every descriptor, close-on-exec ones included, and a `flock` lock belongs to the open file
/// description, which stays open, and locked, until that copy is closed too (flock(2):
/// "Locks created by flock() are associated with an open file description"). A lock released
/// by `close` alone was thus still held for a moment after the run ended, and the next run in
/// the same process (the node agent's next cycle, the deterministic simulation's next
/// process) was refused with "another keyplan run holds the lock" (found by
/// tests/verification/simulation.rs, `a_schedule_replays_exactly`).
#[derive(Debug)]
pub struct FlockGuard {
    file: fs::File,
}

impl FlockGuard {
    /// Wraps `file`, on which this process has just taken a `flock` lock (shared or
    /// exclusive); the lock is released when the guard is dropped.
    pub fn locked(file: fs::File) -> FlockGuard {
        FlockGuard { file }
    }

    /// The locked file.
    pub fn file(&mut self) -> &mut fs::File {
        &mut self.file
    }
}

impl Drop for FlockGuard {
    fn drop(&mut self) {
        // An error leaves the lock to `close`, as before; there is nothing better to do.
        let _ = self.file.unlock();
    }
}

/// Why [`read_json`] could not read a state file.
#[derive(Debug)]
pub enum JsonFileError {
    /// The file exists but could not be read.
    Io(io::Error),
    /// The file is not JSON of the expected shape (the parser's message).
    Parse(String),
}

/// Reads the JSON state file `path` (the device registry, the owner record, the copies
/// record) as a `T`; `None` when the file does not exist.
///
/// Errors: [`JsonFileError`]; callers wrap it in their own error naming the file's role.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, JsonFileError> {
    match fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| JsonFileError::Parse(e.to_string())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(JsonFileError::Io(e)),
    }
}

/// Writes `value` as pretty JSON (with a final newline) to `dir/name`, atomically
/// ([`write_atomic`], mode 0600), creating `dir` private (0700) first.
///
/// Errors: any I/O error (a value that cannot be serialized is an I/O error too).
pub fn write_json_private<T: serde::Serialize>(
    dir: &Path,
    name: &str,
    value: &T,
) -> io::Result<()> {
    let mut text = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    text.push(b'\n');
    ensure_private_dir(dir)?;
    write_atomic(&dir.join(name), &text, 0o600)
}
