//! Small filesystem helpers shared by the file KMS, the LUKS1 record store and the journal:
//! atomic private writes and private directories.

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
