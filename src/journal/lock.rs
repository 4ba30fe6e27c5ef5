//! The state-directory lock: `<state_dir>/lock`, held with `flock(2)` (through `File::try_lock`)
//! for the whole run, so a lock left by a dead process never blocks the next run: the kernel
//! drops it. The file's content names the holder (pid, host, start time) for the refusal
//! message ([`JournalError::Locked`]).

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use super::{open_state_file, JournalError};
use crate::fsutil::FlockGuard;

/// Lock file name inside the state directory.
pub const LOCK_FILE: &str = "lock";

/// The holder description written into a lock file, or `unknown holder`.
fn read_holder(path: &Path) -> String {
    let holder = fs::read_to_string(path).unwrap_or_default();
    match holder.trim() {
        "" => "unknown holder".to_string(),
        h => h.to_string(),
    }
}

/// Who holds the state lock right now, if anyone: `pid P on host H since T`. Read-only: opens
/// the lock file without creating or writing it and probes with a shared `flock(2)`.
pub fn lock_holder(state_dir: &Path) -> Option<String> {
    let path = state_dir.join(LOCK_FILE);
    let file = fs::File::open(&path).ok()?;
    match file.try_lock_shared() {
        // Released at once and explicitly (see `FlockGuard`): a probe that lingered would
        // refuse a run starting right now.
        Ok(()) => {
            drop(FlockGuard::locked(file));
            None
        }
        Err(fs::TryLockError::WouldBlock) => Some(read_holder(&path)),
        Err(fs::TryLockError::Error(_)) => None,
    }
}

/// The exclusive state-directory lock; released when dropped (explicitly: see
/// [`FlockGuard`]) or when the process dies.
#[derive(Debug)]
pub struct StateLock {
    _guard: FlockGuard,
}

impl StateLock {
    /// Takes `<state_dir>/lock` without waiting, writing `pid P on host H since T` into it.
    ///
    /// Errors: [`JournalError::Locked`] naming the holder when another process has it;
    /// [`JournalError::Io`].
    pub fn acquire(state_dir: &Path) -> Result<StateLock, JournalError> {
        let (path, file) = open_state_file(state_dir, LOCK_FILE)?;
        let io_err = |what, source| JournalError::Io {
            what,
            path: path.clone(),
            source,
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let holder = read_holder(&path);
                return Err(JournalError::Locked { path, holder });
            }
            Err(fs::TryLockError::Error(e)) => return Err(io_err("locking", e)),
        }
        // From here on the guard releases the lock on every path, errors included.
        let mut guard = FlockGuard::locked(file);
        let file = guard.file();
        let info = format!(
            "pid {} on host {} since {}\n",
            std::process::id(),
            gethostname::gethostname().to_string_lossy(),
            crate::clock::now_rfc3339()
        );
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(info.as_bytes()))
            .and_then(|()| file.sync_data())
            .map_err(|e| io_err("writing", e))?;
        Ok(StateLock { _guard: guard })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_lock_is_free_while_a_copy_of_its_descriptor_lives() {
        let dir = tempfile::tempdir().unwrap();
        let mut lock = StateLock::acquire(dir.path()).unwrap();
        // What a child process holds between its fork and its exec.
        let copy = lock._guard.file().try_clone().unwrap();
        assert!(matches!(
            StateLock::acquire(dir.path()),
            Err(JournalError::Locked { .. })
        ));
        assert!(lock_holder(dir.path()).is_some_and(|h| h.starts_with("pid ")));
        drop(lock);
        assert_eq!(lock_holder(dir.path()), None);
        let again = StateLock::acquire(dir.path());
        assert!(again.is_ok(), "still locked by the copy: {again:?}");
        drop(copy);
    }
}
