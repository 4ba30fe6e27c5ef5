//! Running `cryptsetup` as a child process: fixed locale, captured output, secrets through pipes.
//!
//! Every child gets `LC_ALL=C` and `LANG=C` (and no `LANGUAGE`), so messages are English and
//! stable; callers judge outcomes by the exit code only. Standard output and standard error are
//! captured. Standard input is either `/dev/null` or the read end of a fresh pipe, and an optional
//! second secret arrives through another pipe mapped to file descriptor 3 in the child
//! (`command-fds`, installed from duct's `before_spawn` hook). Both pipes are `O_CLOEXEC` in the
//! parent, so no other child inherits them.
//!
//! Each secret is written into its pipe by a short-lived scoped thread that is started before
//! the child is spawned and drops the write end as soon as everything is written, so the child
//! sees end-of-file after the secret. For secrets that fit into the pipe buffer (keyplan's keys
//! are well below 4 KiB; Linux pipes hold at least one page) the write completes at once,
//! without waiting for the child. For longer secrets (e.g. a big `enroll_with` key file) the
//! thread simply waits for the child to read, instead of deadlocking as a write from the calling
//! thread would. If the child exits without reading, the parent's read end is closed when the
//! duct expression is dropped and the thread's write fails with `EPIPE` (ignored: the exit code
//! reports the failure). The secret bytes are never copied: the threads borrow them.
//!
//! Each child runs in a process group of its own and dies with keyplan, and gets a minimal
//! environment ([`crate::child::shield`], [`crate::child::child_env`]).

use std::ffi::OsString;
use std::io::{self, Write as _};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Mutex;

use command_fds::{CommandFdExt as _, FdMapping};

use crate::child;

/// The child file descriptor the second secret is mapped to (`--new-keyfile=/dev/fd/3`).
pub(crate) const SECRET_FD: i32 = 3;

/// What a finished cryptsetup child left behind.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Exit code; `None` when the child was killed by a signal.
    pub code: Option<i32>,
    /// The signal that killed the child, when one did (`ExitStatusExt::signal`).
    pub signal: Option<i32>,
    /// Standard output (lossy UTF-8).
    pub stdout: String,
    /// Standard error (lossy UTF-8), trimmed, lines joined with `"; "`.
    pub stderr: String,
}

impl Outcome {
    /// True when the child exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs `program args...` and waits for it.
///
/// `stdin`: `None` gives the child `/dev/null`; `Some(bytes)` feeds `bytes` through a pipe.
/// `fd3`: `Some(bytes)` feeds `bytes` through a pipe that is file descriptor 3 in the child.
///
/// Errors: the pipes or threads could not be created, or the program could not be started
/// (`io::Error`, to be wrapped into `LuksError::Spawn` by the caller). A non-zero exit is not an
/// error here.
pub(crate) fn run(
    program: &Path,
    args: &[OsString],
    stdin: Option<&[u8]>,
    fd3: Option<&[u8]>,
) -> io::Result<Outcome> {
    // argv holds no secret (keys travel through stdin and fd 3), so it can be logged.
    tracing::debug!(
        "running {} {}",
        program.display(),
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let output = std::thread::scope(|scope| -> io::Result<std::process::Output> {
        let mut expr = duct::cmd(program.as_os_str(), args)
            .full_env(child::child_env())
            .stdout_capture()
            .stderr_capture()
            .unchecked();

        expr = expr.before_spawn(child::shield);

        match stdin {
            None => expr = expr.stdin_null(),
            Some(bytes) => {
                let (reader, writer) = io::pipe()?;
                feed(scope, writer, bytes)?;
                expr = expr.stdin_file(reader);
            }
        }

        if let Some(bytes) = fd3 {
            let (reader, writer) = io::pipe()?;
            feed(scope, writer, bytes)?;
            // duct's hook is `Fn` (it could be called once per spawn); the read end can be handed
            // over only once, so it sits in a Mutex<Option<_>> and is taken by the first spawn.
            let read_end: Mutex<Option<OwnedFd>> = Mutex::new(Some(OwnedFd::from(reader)));
            expr = expr.before_spawn(move |command| {
                let parent_fd = read_end
                    .lock()
                    .map_err(|_| io::Error::other("secret pipe lock poisoned"))?
                    .take()
                    .ok_or_else(|| io::Error::other("secret pipe already handed to a child"))?;
                command
                    .fd_mappings(vec![FdMapping {
                        parent_fd,
                        child_fd: SECRET_FD,
                    }])
                    .map_err(|e| io::Error::other(e.to_string()))?;
                Ok(())
            });
        }

        let result = expr.run();
        // Close the parent's read ends before the scope joins the writer threads, so a writer
        // blocked on a child that never read gets EPIPE instead of waiting forever.
        drop(expr);
        result
    })?;

    Ok(Outcome {
        code: output.status.code(),
        signal: std::os::unix::process::ExitStatusExt::signal(&output.status),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: tidy_stderr(&String::from_utf8_lossy(&output.stderr)),
    })
}

/// Starts a scoped thread that writes `bytes` into `writer` and then closes it.
fn feed<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    writer: io::PipeWriter,
    bytes: &'scope [u8],
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("keyplan-secret-pipe".to_owned())
        .spawn_scoped(scope, move || {
            let mut writer = writer;
            // EPIPE (child exited without reading) is reported by the child's exit code.
            let _ = writer.write_all(bytes);
            drop(writer);
        })?;
    Ok(())
}

/// Trims cryptsetup's stderr into one line (lines joined with `"; "`), at most 2000 characters.
fn tidy_stderr(raw: &str) -> String {
    let joined = raw
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    if joined.chars().count() > 2000 {
        let mut cut: String = joined.chars().take(2000).collect();
        cut.push_str(" [...]");
        cut
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipes_reach_stdin_and_fd3_unchanged() -> io::Result<()> {
        let secret_in = b"first\nsecret\0bytes\n".to_vec();
        let secret_3 = vec![b'z'; 200_000]; // larger than a default pipe buffer
        let out = run(
            Path::new("sh"),
            &[
                "-c".into(),
                "cat; printf '|%s|%s|' \"$LC_ALL\" \"$LANG\"; wc -c <&3; wc -c <&3; echo warn >&2; echo more >&2".into(),
            ],
            Some(&secret_in),
            Some(&secret_3),
        )?;
        assert!(out.success());
        let (echoed, rest) = out.stdout.split_at(secret_in.len());
        assert_eq!(echoed.as_bytes(), &secret_in[..]);
        let rest: Vec<&str> = rest.split_whitespace().collect();
        // all 200000 bytes arrived on fd 3, which was at end-of-file afterwards
        assert_eq!(rest, ["|C|C|200000", "0"]);
        assert_eq!(out.stderr, "warn; more");
        Ok(())
    }

    #[test]
    fn child_that_never_reads_does_not_hang() -> io::Result<()> {
        let big = vec![b'x'; 1 << 20];
        let out = run(
            Path::new("sh"),
            &["-c".into(), "exit 7".into()],
            Some(&big),
            Some(&big),
        )?;
        assert_eq!(out.code, Some(7));
        Ok(())
    }

    #[test]
    fn stdin_null_is_empty() -> io::Result<()> {
        let out = run(Path::new("sh"), &["-c".into(), "wc -c".into()], None, None)?;
        assert_eq!(out.stdout.trim(), "0");
        Ok(())
    }

    #[test]
    fn stderr_is_trimmed_and_capped() {
        assert_eq!(tidy_stderr("  a \n\n b\n"), "a; b");
        assert!(tidy_stderr(&"x".repeat(5000)).ends_with(" [...]"));
    }
}
