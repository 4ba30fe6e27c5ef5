//! Child processes keyplan starts: how each one is shielded and what it inherits.
//!
//! One home for the rules every child follows, whoever starts it (`luks::run` for
//! cryptsetup, `kms::exec` for `exec` KMS helpers):
//!
//! - [`shield`]: the child gets a process group of its own (a Ctrl-C at the terminal reaches
//!   keyplan, not the child in the middle of writing a header) and dies with keyplan
//!   (`PR_SET_PDEATHSIG` = `SIGKILL`), as in a power cut (docs/architecture.md, "cryptsetup
//!   children: own process group, die with keyplan").
//! - [`child_env`]: the minimal environment of a cryptsetup child (`PATH`, `TMPDIR`, C locale),
//!   so KMS credentials in keyplan's environment never reach it. (`exec` helpers inherit
//!   keyplan's environment instead: talking to their KMS is their job.)

use std::ffi::OsString;
use std::io;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_env_is_minimal() {
        let env = child_env();
        assert!(env
            .iter()
            .all(|(k, _)| ["PATH", "TMPDIR", "LC_ALL", "LANG"].iter().any(|w| k == w)));
        assert!(env.iter().any(|(k, v)| k == "LC_ALL" && v == "C"));
    }
}
