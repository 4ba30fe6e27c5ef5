//! Child processes keyplan starts: how each one is shielded and what it inherits.
//!
//! One home for the rules every child follows, whoever starts it (`luks::run` for
//! cryptsetup, `kms::exec` for `exec` KMS helpers):
//!
//! - `shield`: the child gets a process group of its own (a Ctrl-C at the terminal reaches
//!   keyplan, not the child in the middle of writing a header) and dies with keyplan
//!   (`PR_SET_PDEATHSIG` = `SIGKILL`), as in a power cut (docs/architecture.md, "cryptsetup
//!   children: own process group, die with keyplan").
//! - `child_env`: the minimal environment of a cryptsetup child (`PATH`, `TMPDIR`, C locale),
//!   so KMS credentials in keyplan's environment never reach it. (`exec` helpers inherit
//!   keyplan's environment instead: talking to their KMS is their job.)
//! - `retry_text_busy`: a start that fails with `ETXTBSY` is tried again, briefly.

use std::ffi::OsString;
use std::io;
use std::time::Duration;

/// Puts the child into a process group of its own, so a Ctrl-C at the terminal (delivered to
/// the foreground process group) reaches keyplan, which lets the running step finish, and not
/// the child in the middle of writing a header. In return the child gets
/// `PR_SET_PDEATHSIG` = `SIGKILL` (prctl(2)): if keyplan dies (a second signal, `kill -9`, the
/// OOM killer) its children die with it, as in a power cut, instead of writing on while a new
/// run starts. A child whose parent is already gone refuses to start (`ESRCH`).
///
/// The death signal fires when the *thread* that spawned the child exits, so that thread must
/// outlive the child: both callers start it on the thread that then waits for it.
///
/// Meant as a `before_spawn` hook (duct) or to be called on a [`std::process::Command`] before
/// spawning it. Errors: none today (the `io::Result` is what duct's hook signature wants); a
/// failure inside the child before `exec` surfaces as the spawn's error.
pub(crate) fn shield(command: &mut std::process::Command) -> io::Result<()> {
    use std::os::unix::process::CommandExt as _;
    command.process_group(0);
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and calls only the async-signal-safe
    // system calls prctl(2) and getppid(2); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    Ok(())
}

/// The whole environment of a cryptsetup child: `PATH` and `TMPDIR` from keyplan's own
/// environment (when set) and `LC_ALL=C`, `LANG=C` (messages in English; keyplan judges by exit
/// codes anyway). Nothing else is passed on, so KMS credentials in keyplan's environment
/// (`VAULT_TOKEN`, a kubeconfig token variable, ...) never reach cryptsetup.
pub(crate) fn child_env() -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = ["PATH", "TMPDIR"]
        .iter()
        .filter_map(|k| std::env::var_os(k).map(|v| ((*k).into(), v)))
        .collect();
    env.push(("LC_ALL".into(), "C".into()));
    env.push(("LANG".into(), "C".into()));
    env
}

/// Runs `start` (which spawns a child) and, while it fails with `ETXTBSY` ("Text file busy"),
/// runs it again: at most 8 more times, 10 ms to 250 ms apart with exponential backoff (about
/// 1 s in all; the `backon` crate, as [`crate::kms::with_retries`] uses). Every other error,
/// and the last `ETXTBSY`, is returned unchanged. Each retry is logged at `debug` with `what`
/// (the program's name, no material).
///
/// Why: execve(2) refuses a program file that some process holds open for writing. A process
/// that writes a script, closes it and then runs it can still hit this when another of its
/// threads forked while the file was open: the forked child holds a copy of the write
/// descriptor until it calls `exec` (or exits) a moment later (`O_CLOEXEC` closes it only
/// then). The same
/// happens when a package manager or an operator replaces a helper program in place while
/// keyplan starts it. Both are over within milliseconds, so a short bounded retry is the
/// remedy; a file that stays busy is reported as before.
pub(crate) fn retry_text_busy<T>(
    what: &str,
    start: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    use backon::{BlockingRetryable, ExponentialBuilder};
    let policy = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(10))
        .with_max_delay(Duration::from_millis(250))
        .with_max_times(8);
    start
        .retry(policy)
        .sleep(std::thread::sleep)
        .when(|e| e.raw_os_error() == Some(libc::ETXTBSY))
        .notify(|e, after| {
            tracing::debug!(program = what, retry_in = ?after, "cannot start the program yet ({e}); retrying");
        })
        .call()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_busy_is_retried_a_few_times_then_reported() {
        let mut calls = 0;
        let r: io::Result<()> = retry_text_busy("t", || {
            calls += 1;
            Err(io::Error::from_raw_os_error(libc::ETXTBSY))
        });
        assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ETXTBSY));
        assert_eq!(calls, 9);

        let mut calls = 0;
        let r = retry_text_busy("t", || {
            calls += 1;
            if calls < 3 {
                Err(io::Error::from_raw_os_error(libc::ETXTBSY))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r.unwrap(), 3);
    }

    #[test]
    fn other_errors_are_not_retried() {
        let mut calls = 0;
        let r: io::Result<()> = retry_text_busy("t", || {
            calls += 1;
            Err(io::Error::from(io::ErrorKind::NotFound))
        });
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(calls, 1);
    }

    #[test]
    fn child_env_is_minimal() {
        let env = child_env();
        assert!(env
            .iter()
            .all(|(k, _)| ["PATH", "TMPDIR", "LC_ALL", "LANG"].iter().any(|w| k == w)));
        assert!(env.iter().any(|(k, v)| k == "LC_ALL" && v == "C"));
    }
}
