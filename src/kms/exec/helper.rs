//! One call of an `exec` helper: the [`ExecKms`] handle, the request sent and the process run
//! within the time limit (`process.rs`), the response checked against the protocol
//! (`protocol.rs`), and the helper's answer or failure mapped to a [`KmsError`] with
//! everything quoted from the helper redacted.

use std::io::pipe;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use zeroize::Zeroizing;

use super::process::{kill_group, serve, Finished, Response, Served, MAX_RESPONSE_BYTES};
use super::protocol::{encode_request, Envelope, ErrorBody, Head, Op, Request, PROTOCOL_VERSION};
use crate::kms::{Kms, KmsError};

/// Environment variable overriding the per-operation time limit: a whole number of seconds,
/// 1 to 3600. Unset: [`crate::kms::REQUEST_TIMEOUT`] (30 s).
pub const TIMEOUT_ENV: &str = "KEYPLAN_EXEC_TIMEOUT_SECS";

/// Most characters of a helper's standard error (its end) quoted in an error message.
pub const STDERR_SHOWN_CHARS: usize = 1000;

/// Most characters of a helper's own error `message` quoted in an error message.
const MESSAGE_SHOWN_CHARS: usize = 1000;

/// How long keyplan waits for a killed helper's process group to release its pipes.
const KILL_GRACE: Duration = Duration::from_secs(1);

/// An `exec` KMS: the helper program `command` run once per operation.
#[derive(Debug, Clone)]
pub struct ExecKms {
    pub(super) name: String,
    command: Vec<String>,
    timeout: Duration,
}

impl ExecKms {
    /// An exec KMS named `name` (the plan's KMS instance name, sent as `kms` in every request)
    /// running `command` (program and arguments, passed unchanged to `execvp(3)`), each run
    /// limited to `timeout`.
    ///
    /// Errors: [`KmsError::Config`] when `command` is empty or its program is blank.
    pub fn new(name: &str, command: Vec<String>, timeout: Duration) -> Result<Self, KmsError> {
        if command.first().is_none_or(|p| p.trim().is_empty()) {
            return Err(KmsError::Config {
                kms: format!("exec KMS {name:?}"),
                detail: "`command` is empty; give the helper program's argv, e.g. `[/usr/local/bin/my-kms-helper]`".into(),
            });
        }
        Ok(ExecKms {
            name: name.to_string(),
            command,
            timeout,
        })
    }

    /// The command line for messages (arguments come from the plan and hold no material; a
    /// user name and password in a URL argument show as `***`).
    pub(super) fn command_line(&self) -> String {
        let args: Vec<_> = self
            .command
            .iter()
            .map(|a| crate::secret::redact::url_credentials(a))
            .collect();
        args.join(" ")
    }

    /// Runs the helper for `op` on `key` and returns its `result`, parsed as `R` (`None` when
    /// the response has no `result`). `secret` is material the request carries: registered
    /// again with [`crate::secret::redact::register`] (it is a `Passphrase`, registered when
    /// made; this marks it as recently used), so that it is redacted from anything quoted.
    pub(super) fn call<R: DeserializeOwned>(
        &self,
        op: &Op<'_>,
        key: Option<&str>,
        secret: Option<&[u8]>,
    ) -> Result<Option<R>, KmsError> {
        if let Some(secret) = secret {
            crate::secret::redact::register(secret);
        }
        let ctx = Ctx {
            kms: self,
            op: op.name(),
            key,
            version: op.version(),
        };
        let request = encode_request(&Request {
            protocol_version: PROTOCOL_VERSION,
            op,
            kms: &self.name,
            key,
        })
        .map_err(|e| ctx.violation(format!("cannot encode the request: {e}")))?;
        tracing::debug!(
            kms = %self.name,
            operation = ctx.op,
            key = key.unwrap_or(""),
            "running the exec KMS helper {}",
            self.command_line()
        );
        let started = Instant::now();
        let done = self.run(&ctx, request)?;
        tracing::debug!(
            kms = %self.name,
            operation = ctx.op,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "exec KMS helper answered"
        );
        let answer = parse_response(&ctx, &done)?;
        if op.writes() {
            crate::failpoint::check("kms.after_write").map_err(|d| ctx.unavailable(d))?;
        }
        Ok(answer)
    }

    /// Starts the helper, feeds it `request`, and collects its exit status and output within
    /// the time limit (killing its process group when the limit passes). duct starts the
    /// helper and waits for it with the deadline; the pipes are keyplan's own, served by
    /// threads ([`Served`]), so that key material only ever sits in zeroizing buffers.
    fn run(&self, ctx: &Ctx<'_>, request: Zeroizing<Vec<u8>>) -> Result<Finished, KmsError> {
        // One run's limit, or less when the call's deadline (its retries included, set by
        // `deadline::Guarded`) ends earlier.
        let limit = self.timeout;
        crate::kms::deadline::within(Instant::now() + limit, limit, || {
            let deadline = Instant::now() + crate::kms::deadline::remaining();
            self.run_until(ctx, request, deadline)
        })
    }

    /// [`ExecKms::run`] with the deadline `deadline`.
    fn run_until(
        &self,
        ctx: &Ctx<'_>,
        request: Zeroizing<Vec<u8>>,
        deadline: Instant,
    ) -> Result<Finished, KmsError> {
        let (handle, mut served) = self.start(ctx, request)?;
        let status = match handle.wait_deadline(deadline) {
            Ok(Some(output)) => output.status,
            Ok(None) => return Err(self.timed_out(ctx, &handle, &mut served, false)),
            Err(e) => {
                kill_group(&handle);
                return Err(ctx.unavailable(format!("cannot wait for the helper: {e}")));
            }
        };
        // The helper exited; its answer is complete once both output pipes reached their end,
        // which a process it started and left running can prevent.
        if !served.collect(deadline) {
            return Err(self.timed_out(ctx, &handle, &mut served, true));
        }
        Ok(Finished {
            status,
            stdout: served.stdout.take().unwrap_or(Ok(Response::default())),
            stderr_tail: served.stderr.take().unwrap_or_default(),
        })
    }

    /// Creates the helper's three pipes, starts it on them through duct (in its own process
    /// group, dying with keyplan: [`crate::child::shield`]; a start refused with `ETXTBSY` is
    /// retried: [`crate::child::retry_text_busy`]), and starts the threads serving the pipes.
    /// The helper inherits keyplan's environment (its KMS credentials are its business).
    ///
    /// Errors: [`Ctx::spawn_error`] when the pipes cannot be created or the helper cannot be
    /// started; [`KmsError::Unavailable`] when a serving thread cannot be started (the helper's
    /// process group is killed then).
    fn start(
        &self,
        ctx: &Ctx<'_>,
        request: Zeroizing<Vec<u8>>,
    ) -> Result<(duct::Handle, Served), KmsError> {
        let pipes = (|| Ok::<_, std::io::Error>((pipe()?, pipe()?, pipe()?)))();
        let ((stdin_r, stdin_w), (stdout_r, stdout_w), (stderr_r, stderr_w)) =
            pipes.map_err(|e| ctx.spawn_error(&e))?;
        let expr = duct::cmd(&self.command[0], &self.command[1..])
            .stdin_file(stdin_r)
            .stdout_file(stdout_w)
            .stderr_file(stderr_w)
            .unchecked()
            .before_spawn(crate::child::shield);
        let started = crate::child::retry_text_busy(&self.command[0], || expr.start());
        // The expression holds the parent's copies of the helper's ends of the pipes: closing
        // them lets the readers see end-of-file once the helper (and all it started) let go.
        drop(expr);
        let handle = started.map_err(|e| ctx.spawn_error(&e))?;
        match serve(stdin_w, stdout_r, stderr_r, request) {
            Ok(served) => Ok((handle, served)),
            Err(e) => {
                kill_group(&handle);
                Err(ctx.unavailable(format!("cannot start the threads serving the helper: {e}")))
            }
        }
    }

    /// The time limit passed (`lingering`: after the helper had exited, while a process it
    /// started still held its output open). Kills the helper's process group, gives it
    /// [`KILL_GRACE`] to exit and release the pipes (keeping what its standard error said
    /// meanwhile), and returns the error.
    fn timed_out(
        &self,
        ctx: &Ctx<'_>,
        handle: &duct::Handle,
        served: &mut Served,
        lingering: bool,
    ) -> KmsError {
        kill_group(handle);
        let grace_end = Instant::now() + KILL_GRACE;
        // Reaps the killed helper. Failing to, or a pipe still held open after the grace
        // period (a process that left the group), changes nothing: the answer is a timeout
        // either way, duct reaps the helper later, and the detached threads end with the pipes.
        let _ = handle.wait_deadline(grace_end);
        served.collect(grace_end);
        let lingering = if lingering {
            " (it had exited, but a process it started still held its output open)"
        } else {
            ""
        };
        KmsError::Timeout {
            kms: ctx.kms.describe(),
            detail: ctx.redact(format!(
                "operation {}: no answer within {}{lingering}; the helper and its process group were killed (a slow KMS needs a longer `timeout` in the plan, or {TIMEOUT_ENV}){}",
                ctx.what(),
                crate::kms::deadline::limit_text(),
                ctx.stderr_note(served.stderr.as_deref().map_or(&[], |t| &t[..]))
            )),
        }
    }

    /// [`ExecKms::call`] for an operation whose `result` must be present.
    pub(super) fn call_for<R: DeserializeOwned>(
        &self,
        op: &Op<'_>,
        key: Option<&str>,
        secret: Option<&[u8]>,
    ) -> Result<R, KmsError> {
        self.call::<R>(op, key, secret)?.ok_or_else(|| {
            Ctx {
                kms: self,
                op: op.name(),
                key,
                version: op.version(),
            }
            .violation("`result` is missing".into())
        })
    }
}

/// The context of one helper run, for error messages.
struct Ctx<'a> {
    kms: &'a ExecKms,
    op: &'static str,
    key: Option<&'a str>,
    version: Option<u64>,
}

impl Ctx<'_> {
    fn what(&self) -> String {
        match self.key {
            Some(k) => format!("`{}` of key {k:?}", self.op),
            None => format!("`{}`", self.op),
        }
    }

    fn key_name(&self) -> String {
        self.key.unwrap_or("").to_string()
    }

    fn unavailable(&self, detail: String) -> KmsError {
        KmsError::Unavailable {
            kms: self.kms.describe(),
            detail: self.redact(format!("operation {}: {detail}", self.what())),
        }
    }

    /// A response that does not follow the protocol: the helper is broken, and whether a
    /// write took effect is unknown, so it counts as unavailable.
    fn violation(&self, detail: String) -> KmsError {
        self.unavailable(format!(
            "the answer does not follow keyplan's exec protocol version {PROTOCOL_VERSION} (docs/kms/exec.md): {detail}"
        ))
    }

    fn spawn_error(&self, e: &std::io::Error) -> KmsError {
        let program = &self.kms.command[0];
        match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                let hint = if Path::new(program).is_absolute() {
                    "check `command` in the plan (a relative program path is resolved against the plan file's directory)"
                } else {
                    "check `command` in the plan: a program name without `/` is looked up in PATH"
                };
                KmsError::Config {
                    kms: self.kms.describe(),
                    detail: format!(
                        "cannot start the helper {program:?}: {e}; {hint}. Nothing was changed"
                    ),
                }
            }
            _ => self.unavailable(format!("cannot start the helper: {e}")),
        }
    }

    /// ` ; its standard error ends with: "..."`, or nothing when it wrote none. Redacted as
    /// bytes, before the text is tidied and cut.
    fn stderr_note(&self, tail: &[u8]) -> String {
        let tail = crate::secret::redact::redact_bytes(tail);
        let text = tidy(&String::from_utf8_lossy(&tail));
        if text.is_empty() {
            return String::new();
        }
        let count = text.chars().count();
        let shown: String = if count > STDERR_SHOWN_CHARS {
            let skip = count - STDERR_SHOWN_CHARS;
            format!("[...]{}", text.chars().skip(skip).collect::<String>())
        } else {
            text
        };
        format!("; its standard error ends with: {shown:?}")
    }

    /// `text` with every form of known material redacted ([`crate::secret::redact`]).
    fn redact(&self, text: String) -> String {
        match crate::secret::redact::redact(&text) {
            std::borrow::Cow::Borrowed(_) => text,
            std::borrow::Cow::Owned(r) => r,
        }
    }

    /// Maps a helper's `error` object onto [`KmsError`]. Its message is redacted before it is
    /// tidied and cut.
    fn helper_error(&self, error: &ErrorBody) -> KmsError {
        let message = shown(&error.message, MESSAGE_SHOWN_CHARS);
        let says = self.redact(format!(
            "the helper answered {} with {:?}: {message}",
            self.what(),
            error.kind
        ));
        let kms = self.kms.describe();
        match error.kind.as_str() {
            "conflict" => KmsError::Conflict {
                kms,
                key: self.key_name(),
                detail: says,
            },
            "no_such_version" => match self.version {
                Some(version) => KmsError::NoSuchVersion {
                    kms,
                    key: self.key_name(),
                    version,
                },
                None => self.violation(format!(
                    "kind \"no_such_version\" for an operation that names no version ({says})"
                )),
            },
            "unavailable" => KmsError::Unavailable { kms, detail: says },
            "denied" => KmsError::Denied { kms, detail: says },
            "corrupt" => KmsError::Corrupt {
                kms,
                key: self.key_name(),
                detail: says,
            },
            "config" => KmsError::Config { kms, detail: says },
            other => self.violation(format!("unknown error kind {other:?} ({says})")),
        }
    }
}

/// `raw` from a helper as keyplan shows it: redacted ([`crate::secret::redact`]), then
/// trimmed into one line ([`tidy`]) of at most `max` characters (longer: cut, ` [...]`
/// appended).
pub(super) fn shown(raw: &str, max: usize) -> String {
    let mut text = tidy(&crate::secret::redact::redact(raw));
    if text.chars().count() > max {
        text = text.chars().take(max).collect::<String>() + " [...]";
    }
    text
}

/// Trims `raw` into one line (lines joined with `"; "`, control characters and invisible
/// formatting characters dropped: zero-width ones, line and paragraph separators, bidi
/// overrides and isolates, which could make a terminal show other text than is there).
fn tidy(raw: &str) -> String {
    let invisible = |c: char| matches!(c, '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}');
    raw.lines()
        .map(|l| {
            l.chars()
                .filter(|&c| !c.is_control() && !invisible(c))
                .collect::<String>()
                .trim()
                .to_string()
        })
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Checks a finished run and extracts the `result` of its response.
fn parse_response<R: DeserializeOwned>(
    ctx: &Ctx<'_>,
    done: &Finished,
) -> Result<Option<R>, KmsError> {
    if !done.status.success() {
        let how = match (
            done.status.code(),
            std::os::unix::process::ExitStatusExt::signal(&done.status),
        ) {
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(sig)) => format!("was killed by signal {sig}"),
            (None, None) => format!("ended with {}", done.status),
        };
        return Err(ctx.unavailable(format!(
            "the helper {how} (an answer counts only with exit code 0){}",
            ctx.stderr_note(&done.stderr_tail)
        )));
    }
    let out = match &done.stdout {
        Ok(out) => out,
        Err(e) => return Err(ctx.unavailable(format!("cannot read the helper's output: {e}"))),
    };
    if out.overflow {
        return Err(ctx.violation(format!(
            "the helper printed more than {MAX_RESPONSE_BYTES} bytes"
        )));
    }
    if out.bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ctx.violation(format!(
            "the helper exited with code 0 but printed nothing{}",
            ctx.stderr_note(&done.stderr_tail)
        )));
    }
    // Messages from the JSON parser may quote the input; for `get` that could be material,
    // so only the position is shown there.
    let parse_error = |e: serde_json::Error| {
        if ctx.op == "get" {
            format!("invalid at line {} column {}", e.line(), e.column())
        } else {
            e.to_string()
        }
    };
    let head: Head = serde_json::from_slice(&out.bytes).map_err(|e| {
        ctx.violation(format!(
            "not one JSON object: {}{}",
            parse_error(e),
            ctx.stderr_note(&done.stderr_tail)
        ))
    })?;
    match head.protocol_version {
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(PROTOCOL_VERSION) => {}
        Some(serde_json::Value::Number(n)) if n.as_u64().is_some_and(|v| v > PROTOCOL_VERSION) => {
            let document = format!("{}: the helper's answer to {}", ctx.kms.describe(), ctx.what());
            let found = n.as_u64().unwrap_or_default();
            if let Err(crate::format::kms::ReadError::Newer(newer)) =
                crate::format::kms::exec::check(found, &document)
            {
                return Err(KmsError::NewerFormat(newer));
            }
        }
        Some(other) => {
            return Err(KmsError::Config {
                kms: ctx.kms.describe(),
                detail: ctx.redact(format!(
                    "the helper answered {} with protocol_version {other}, but keyplan speaks version {PROTOCOL_VERSION} (docs/kms/exec.md); use a helper that speaks protocol {PROTOCOL_VERSION}",
                    ctx.what()
                )),
            })
        }
        None => return Err(ctx.violation("`protocol_version` is missing".into())),
    }
    let envelope: Envelope<R> =
        serde_json::from_slice(&out.bytes).map_err(|e| ctx.violation(parse_error(e)))?;
    if envelope.ok {
        Ok(envelope.result)
    } else {
        match &envelope.error {
            Some(error) => Err(ctx.helper_error(error)),
            None => Err(ctx.violation("`ok` is false but `error` is missing".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tidy_joins_lines_and_drops_control_characters() {
        assert_eq!(tidy("a\n\n b\x1b[31m \nc\r\n"), "a; b[31m; c");
        assert_eq!(tidy("ok\u{202E}kab\u{200B}\u{2028}x\u{FEFF}"), "okkabx");
    }
}
