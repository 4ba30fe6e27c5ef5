//! The `exec` KMS provider: an external helper program speaking keyplan's JSON protocol,
//! version 1 (the public contract for helper authors is `docs/kms/exec.md`).
//!
//! For every operation keyplan starts the plan's `command` (argv, no shell; a program path
//! containing `/` was resolved against the plan file's directory by the spec loader, a bare
//! name is looked up in `PATH`), writes ONE JSON request object to its standard input and
//! closes it, and reads ONE JSON response object from its standard output:
//!
//! ```text
//! request:  {"protocol_version":1,"operation":"stage","kms":"custom","key":"osd-kek",
//!            "material_base64":"...","at_least":3}
//! response: {"protocol_version":1,"ok":true,"result":{"version":3}}
//!       or  {"protocol_version":1,"ok":false,"error":{"kind":"conflict","message":"..."}}
//! ```
//!
//! Key material travels only inside these two JSON documents (stdin/stdout pipes): never in
//! argv or the environment. The buffers holding them are zeroized after use. Standard error
//! is diagnostic: its last lines (at most [`STDERR_SHOWN_CHARS`] characters) are quoted in
//! errors. Everything quoted from the helper (its standard error, its error message, what the
//! JSON parser quotes) is redacted first, before it is cut or tidied, with
//! [`crate::secret::redact`]: every form of every material this process knows, the request's
//! own included.
//!
//! The helper runs in a process group of its own and dies with keyplan, as cryptsetup
//! children do ([`crate::child`]); duct starts it and waits for it with the deadline, while
//! keyplan's own threads feed its standard input and read its output into zeroizing buffers.
//! A start refused with `ETXTBSY` (the program file is being written, or was just written and
//! another thread forked meanwhile) is retried briefly. A helper that cannot be started
//! (missing, not executable) is a [`KmsError::Config`]; one that cannot be started for another
//! reason (no processes left, the file still busy after the retries), exits non-zero, is killed
//! by a signal, prints nothing, invalid JSON or a response that does not follow the protocol,
//! is [`KmsError::Unavailable`] naming the command; one that takes longer than the time limit
//! ([`timeout_of`]: the plan's `timeout`, [`TIMEOUT_ENV`] seconds, or
//! [`crate::kms::REQUEST_TIMEOUT`]; less when the call's deadline, retries included, ends
//! earlier: [`crate::kms::deadline`]) is [`KmsError::Timeout`], and its whole process group is
//! killed. `read`, `get`, `retire`, `destroy_key` and `check` are
//! retried through [`crate::kms::with_retries`]; `stage` and `commit` never are.

use std::io::{pipe, PipeReader, PipeWriter, Write as _};
use std::path::Path;
use std::process::ExitStatus;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use super::{with_retries, KeyState, Kms, KmsError, VersionInfo, VersionState};
use crate::secret::Passphrase;
use crate::spec::KmsConfig;

/// The protocol version keyplan speaks (the `protocol_version` field of every request and
/// response). Responses carrying another version are refused with [`KmsError::Config`].
pub const PROTOCOL_VERSION: u64 = 1;

/// Environment variable overriding the per-operation time limit: a whole number of seconds,
/// 1 to 3600. Unset: [`crate::kms::REQUEST_TIMEOUT`] (30 s).
pub const TIMEOUT_ENV: &str = "KEYPLAN_EXEC_TIMEOUT_SECS";

/// Largest response keyplan reads from a helper's standard output: 1 MiB. A longer one is
/// [`KmsError::Unavailable`].
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// Most characters of a helper's standard error (its end) quoted in an error message.
pub const STDERR_SHOWN_CHARS: usize = 1000;

/// Most characters of a helper's own error `message` quoted in an error message.
const MESSAGE_SHOWN_CHARS: usize = 1000;

/// Bytes of standard error kept while the helper runs (the tail; older output is dropped).
const STDERR_KEPT_BYTES: usize = 8192;

/// How long keyplan waits for a killed helper's process group to release its pipes.
const KILL_GRACE: Duration = Duration::from_secs(1);

/// Opens the `exec` KMS instance `name` configured as `config` ([`KmsConfig::Exec`]). Starts
/// nothing: the helper runs once per operation. Its time limit is [`timeout_of`].
///
/// Errors: [`KmsError::Config`] for another provider's configuration, an empty `command`, or
/// an invalid `timeout` or [`TIMEOUT_ENV`] value.
pub fn open(name: &str, config: &KmsConfig) -> Result<Box<dyn Kms>, KmsError> {
    let KmsConfig::Exec { command, .. } = config else {
        return Err(KmsError::misrouted(name, config, "exec"));
    };
    let timeout = timeout_of(name, config)?;
    Ok(Box::new(ExecKms::new(name, command.clone(), timeout)?))
}

/// The time limit of one operation of exec KMS instance `name`: the plan's `timeout`, else
/// the one [`TIMEOUT_ENV`] sets, else [`crate::kms::REQUEST_TIMEOUT`].
///
/// Errors: [`KmsError::Config`] for an invalid `timeout` or [`TIMEOUT_ENV`] value.
pub fn timeout_of(name: &str, config: &KmsConfig) -> Result<Duration, KmsError> {
    if config.timeout().is_some() {
        return super::timeout_of(name, config);
    }
    let bad = |value: &str| {
        KmsError::Config {
        kms: format!("exec KMS {name:?}"),
        detail: format!(
            "{TIMEOUT_ENV}={value:?} is not a whole number of seconds from 1 to 3600; fix or unset it"
        ),
    }
    };
    match std::env::var(TIMEOUT_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(super::REQUEST_TIMEOUT),
        Err(std::env::VarError::NotUnicode(_)) => Err(bad("<not UTF-8>")),
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(secs @ 1..=3600) => Ok(Duration::from_secs(secs)),
            _ => Err(bad(&text)),
        },
    }
}

/// An `exec` KMS: the helper program `command` run once per operation.
#[derive(Debug, Clone)]
pub struct ExecKms {
    name: String,
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

    /// The command line for messages (arguments come from the plan and hold no material).
    fn command_line(&self) -> String {
        self.command.join(" ")
    }

    /// Runs the helper for `op` on `key` and returns its `result`, parsed as `R` (`None` when
    /// the response has no `result`). `secret` is material the request carries: registered
    /// again with [`crate::secret::redact::register`] (it is a `Passphrase`, registered when
    /// made; this marks it as recently used), so that it is redacted from anything quoted.
    fn call<R: DeserializeOwned>(
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
        parse_response(&ctx, &done)
    }

    /// Starts the helper, feeds it `request`, and collects its exit status and output within
    /// the time limit (killing its process group when the limit passes). duct starts the
    /// helper and waits for it with the deadline; the pipes are keyplan's own, served by
    /// threads ([`Served`]), so that key material only ever sits in zeroizing buffers.
    fn run(&self, ctx: &Ctx<'_>, request: Zeroizing<Vec<u8>>) -> Result<Finished, KmsError> {
        // One run's limit, or less when the call's deadline (its retries included, set by
        // `deadline::Guarded`) ends earlier.
        let limit = self.timeout;
        super::deadline::within(Instant::now() + limit, limit, || {
            let deadline = Instant::now() + super::deadline::remaining();
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
                super::deadline::limit_text(),
                ctx.stderr_note(served.stderr.as_deref().map_or(&[], |t| &t[..]))
            )),
        }
    }
}

/// One message from a thread serving the helper.
enum Event {
    Stdout(std::io::Result<Response>),
    Stderr(Zeroizing<Vec<u8>>),
}

/// The helper's standard output as read: at most [`MAX_RESPONSE_BYTES`] bytes.
#[derive(Default)]
struct Response {
    bytes: Zeroizing<Vec<u8>>,
    overflow: bool,
}

/// What a helper run left behind.
struct Finished {
    status: ExitStatus,
    stdout: std::io::Result<Response>,
    stderr_tail: Zeroizing<Vec<u8>>,
}

/// The threads serving a running helper's pipes, and what the readers reported so far. Each
/// pipe has a thread of its own, so neither side can block the other (a helper writing much
/// to standard error before reading its standard input, say). The threads are detached: one
/// that a stray process keeps blocked cannot hold keyplan.
struct Served {
    rx: mpsc::Receiver<Event>,
    stdout: Option<std::io::Result<Response>>,
    stderr: Option<Zeroizing<Vec<u8>>>,
}

impl Served {
    /// Waits until both output pipes reached their end or `until` passes (what has arrived
    /// by then is taken even when `until` has passed already); true when nothing more is to
    /// come (both ended, or a reader thread is gone).
    fn collect(&mut self, until: Instant) -> bool {
        while self.stdout.is_none() || self.stderr.is_none() {
            match self
                .rx
                .recv_timeout(until.saturating_duration_since(Instant::now()))
            {
                Ok(Event::Stdout(o)) => self.stdout = Some(o),
                Ok(Event::Stderr(t)) => self.stderr = Some(t),
                Err(mpsc::RecvTimeoutError::Timeout) => return false,
                Err(mpsc::RecvTimeoutError::Disconnected) => return true,
            }
        }
        true
    }
}

/// Starts the threads serving a started helper's pipes: one writes `request` into its
/// standard input and closes it, two read its standard output ([`read_response`]) and
/// standard error ([`read_tail`]).
fn serve(
    stdin: PipeWriter,
    stdout: PipeReader,
    stderr: PipeReader,
    request: Zeroizing<Vec<u8>>,
) -> std::io::Result<Served> {
    let (tx, rx) = mpsc::channel::<Event>();
    spawn_thread("keyplan-exec-stdin", move || {
        let mut pipe = stdin;
        // EPIPE (the helper exited without reading) shows in its exit status.
        let _ = pipe.write_all(&request);
        drop(pipe);
        drop(request);
    })?;
    let out = tx.clone();
    spawn_thread("keyplan-exec-stdout", move || {
        let _ = out.send(Event::Stdout(read_response(stdout)));
    })?;
    spawn_thread("keyplan-exec-stderr", move || {
        let _ = tx.send(Event::Stderr(read_tail(stderr)));
    })?;
    Ok(Served {
        rx,
        stdout: None,
        stderr: None,
    })
}

fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .map(drop)
}

/// Reads standard output into a buffer allocated once (never grown, so no stray copies of
/// material are left behind by reallocation) and zeroized on drop; output beyond
/// [`MAX_RESPONSE_BYTES`] is drained and flagged.
fn read_response(mut pipe: impl std::io::Read) -> std::io::Result<Response> {
    let mut bytes = Zeroizing::new(vec![0u8; MAX_RESPONSE_BYTES]);
    let mut len = 0;
    while len < bytes.len() {
        match pipe.read(&mut bytes[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let mut overflow = false;
    if len == bytes.len() {
        let mut sink = Zeroizing::new([0u8; 4096]);
        loop {
            match pipe.read(&mut sink[..]) {
                Ok(0) => break,
                Ok(_) => overflow = true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }
    bytes.truncate(len);
    Ok(Response { bytes, overflow })
}

/// Reads standard error to its end, keeping the last [`STDERR_KEPT_BYTES`] bytes.
fn read_tail(mut pipe: impl std::io::Read) -> Zeroizing<Vec<u8>> {
    let mut tail = Zeroizing::new(Vec::with_capacity(2 * STDERR_KEPT_BYTES + 4096));
    let mut chunk = Zeroizing::new([0u8; 4096]);
    loop {
        match pipe.read(&mut chunk[..]) {
            Ok(0) => break,
            Ok(n) => {
                tail.extend_from_slice(&chunk[..n]);
                if tail.len() > 2 * STDERR_KEPT_BYTES {
                    let cut = tail.len() - STDERR_KEPT_BYTES;
                    tail.drain(..cut);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    tail
}

/// Sends `SIGKILL` to the helper's process group (its id is the helper's pid: the helper was
/// started with `process_group(0)`), so that programs it started die with it. duct's own
/// `Handle::kill` would kill the helper only.
fn kill_group(handle: &duct::Handle) {
    for pid in handle.pids() {
        if let Ok(pgid) = libc::pid_t::try_from(pid) {
            // SAFETY: killpg(2) is a plain system call on an integer process group id; a group
            // that is already gone gives ESRCH, which is ignored.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

/// The operation of one request, with its fields (serialized next to `operation`).
#[derive(Serialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
enum Op<'a> {
    Check {
        names: &'a [String],
    },
    Read,
    Get {
        version: u64,
    },
    Stage {
        material_base64: &'a str,
        at_least: u64,
    },
    Commit {
        expected_current: Option<u64>,
        pending: u64,
        /// The plan committing: the helper refuses (`conflict`) while another holder is
        /// recorded. Absent: no holder check.
        #[serde(skip_serializing_if = "Option::is_none")]
        holder: Option<&'a str>,
    },
    Hold {
        holder: &'a str,
    },
    Release {
        holder: &'a str,
    },
    Retire {
        version: u64,
    },
    DestroyKey {
        expected_current: u64,
    },
}

impl Op<'_> {
    fn name(&self) -> &'static str {
        match self {
            Op::Check { .. } => "check",
            Op::Read => "read",
            Op::Get { .. } => "get",
            Op::Stage { .. } => "stage",
            Op::Commit { .. } => "commit",
            Op::Hold { .. } => "hold",
            Op::Release { .. } => "release",
            Op::Retire { .. } => "retire",
            Op::DestroyKey { .. } => "destroy_key",
        }
    }

    /// The version the operation names (for [`KmsError::NoSuchVersion`]).
    fn version(&self) -> Option<u64> {
        match self {
            Op::Get { version } | Op::Retire { version } => Some(*version),
            Op::Commit { pending, .. } => Some(*pending),
            _ => None,
        }
    }
}

/// One request object.
#[derive(Serialize)]
struct Request<'a, 'b> {
    protocol_version: u64,
    #[serde(flatten)]
    op: &'b Op<'a>,
    kms: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
}

/// Serializes `request` into a buffer sized up front (JSON escaping at most sextuples a
/// string), so it is never reallocated, and zeroized on drop.
fn encode_request(request: &Request<'_, '_>) -> Result<Zeroizing<Vec<u8>>, serde_json::Error> {
    let strings = request.kms.len()
        + request.key.map_or(0, str::len)
        + match request.op {
            Op::Check { names } => names.iter().map(|n| n.len() + 3).sum(),
            Op::Stage {
                material_base64, ..
            } => material_base64.len(),
            _ => 0,
        };
    let mut buf = Zeroizing::new(Vec::with_capacity(512 + 6 * strings));
    serde_json::to_writer(&mut *buf, request)?;
    buf.push(b'\n');
    Ok(buf)
}

/// The first look at a response: its protocol version only (everything else is skipped).
#[derive(Deserialize)]
struct Head {
    protocol_version: Option<serde_json::Value>,
}

/// A response of protocol version 1 whose `result` is an `R`.
#[derive(Deserialize)]
struct Envelope<R> {
    ok: bool,
    #[serde(default = "none")]
    result: Option<R>,
    #[serde(default)]
    error: Option<ErrorBody>,
}

fn none<R>() -> Option<R> {
    None
}

/// `error` of a failed response.
#[derive(Deserialize)]
struct ErrorBody {
    kind: String,
    #[serde(default)]
    message: String,
}

/// `result` of `read`.
#[derive(Deserialize)]
struct ReadResult {
    current: Option<u64>,
    pending: Option<u64>,
    versions: Vec<VersionInfo>,
    /// The plans holding the key (holder id -> since, Unix seconds); absent: none.
    #[serde(default)]
    holders: std::collections::BTreeMap<String, u64>,
}

/// `result` of `stage`.
#[derive(Deserialize)]
struct StageResult {
    version: u64,
}

/// `result` of `get` (zeroized on drop).
#[derive(Deserialize, Zeroize, ZeroizeOnDrop)]
struct GetResult {
    material_base64: String,
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
        let mut message = tidy(&crate::secret::redact::redact(&error.message));
        if message.chars().count() > MESSAGE_SHOWN_CHARS {
            message = message
                .chars()
                .take(MESSAGE_SHOWN_CHARS)
                .collect::<String>()
                + " [...]";
        }
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

/// Trims `raw` into one line (lines joined with `"; "`, control characters dropped).
fn tidy(raw: &str) -> String {
    raw.lines()
        .map(|l| {
            l.chars()
                .filter(|c| !c.is_control())
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

impl ExecKms {
    /// [`ExecKms::call`] for an operation whose `result` must be present.
    fn call_for<R: DeserializeOwned>(
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

    fn corrupt(&self, key: &str, detail: String) -> KmsError {
        KmsError::Corrupt {
            kms: self.describe(),
            key: key.to_string(),
            detail: format!(
                "the helper answered `read` inconsistently: {detail}; nothing was changed. Fix the helper or the data it reads"
            ),
        }
    }

    /// Checks that a `read` result is consistent (current and pending listed with their states,
    /// version numbers unique and positive) and turns it into a [`KeyState`].
    fn key_state(&self, key: &str, r: ReadResult) -> Result<KeyState, KmsError> {
        let mut state = KeyState {
            current: r.current,
            pending: r.pending,
            holders: r.holders,
            ..KeyState::default()
        };
        for v in r.versions {
            if v.version == 0 {
                return Err(self.corrupt(key, "version 0 listed (versions start at 1)".into()));
            }
            let number = v.version;
            if state.versions.insert(number, v).is_some() {
                return Err(self.corrupt(key, format!("version {number} listed twice")));
            }
        }
        for (slot, wanted, name) in [
            (r.current, VersionState::Current, "current"),
            (r.pending, VersionState::Pending, "pending"),
        ] {
            match slot.map(|n| (n, state.versions.get(&n))) {
                Some((n, None)) => {
                    return Err(
                        self.corrupt(key, format!("{name} version {n} is not in `versions`"))
                    )
                }
                Some((n, Some(info))) if info.state != wanted => {
                    return Err(self.corrupt(
                        key,
                        format!("{name} version {n} is listed with state {:?}", info.state),
                    ))
                }
                _ => {}
            }
            let others: Vec<u64> = state
                .versions
                .values()
                .filter(|v| v.state == wanted && Some(v.version) != slot)
                .map(|v| v.version)
                .collect();
            if !others.is_empty() {
                return Err(self.corrupt(
                    key,
                    format!("versions {others:?} have state {name}, but `{name}` is {slot:?}"),
                ));
            }
        }
        if r.current.is_some() && r.current == r.pending {
            return Err(self.corrupt(key, "the same version is current and pending".into()));
        }
        Ok(state)
    }
}

impl Kms for ExecKms {
    /// `exec KMS "<name>" (<command line>)`.
    fn describe(&self) -> String {
        format!("exec KMS {:?} ({})", self.name, self.command_line())
    }

    fn read(&self, name: &str) -> Result<KeyState, KmsError> {
        let r = with_retries(&format!("read of key {name:?}"), || {
            self.call_for::<ReadResult>(&Op::Read, Some(name), None)
        })?;
        self.key_state(name, r)
    }

    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        let r = with_retries(&format!("get of key {name:?} version {version}"), || {
            self.call_for::<GetResult>(&Op::Get { version }, Some(name), None)
        })?;
        let engine = &base64::engine::general_purpose::STANDARD;
        let text = r.material_base64.as_bytes();
        let mut bytes = Zeroizing::new(vec![0u8; base64::decoded_len_estimate(text.len())]);
        let bad = |detail: &str| KmsError::Corrupt {
            kms: self.describe(),
            key: name.to_string(),
            detail: format!("the helper answered `get` of version {version} with {detail}"),
        };
        let n = engine.decode_slice(text, &mut bytes[..]).map_err(|_| {
            bad("`material_base64` that is not standard base64 (RFC 4648 §4, padded)")
        })?;
        if n == 0 {
            return Err(bad("empty material"));
        }
        bytes.truncate(n);
        Ok(Passphrase::new(std::mem::take(&mut *bytes)))
    }

    fn stage(&self, name: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        let engine = &base64::engine::general_purpose::STANDARD;
        let len = base64::encoded_len(material.len(), true).ok_or_else(|| KmsError::Config {
            kms: self.describe(),
            detail: format!(
                "key {name:?}: material of {} bytes is too long",
                material.len()
            ),
        })?;
        let mut text = Zeroizing::new(vec![0u8; len]);
        let n = engine
            .encode_slice(material.expose(), &mut text[..])
            .map_err(|e| KmsError::Config {
                kms: self.describe(),
                detail: format!("key {name:?}: cannot encode the material: {e}"),
            })?;
        text.truncate(n);
        // Base64 output is ASCII; the fallback is never taken.
        let material_base64 = std::str::from_utf8(&text).unwrap_or_default();
        // Never retried: after an ambiguous failure the engine re-reads the key first.
        let r: StageResult = self.call_for(
            &Op::Stage {
                material_base64,
                at_least,
            },
            Some(name),
            Some(material.expose()),
        )?;
        if r.version == 0 || r.version < at_least {
            return Err(KmsError::Corrupt {
                kms: self.describe(),
                key: name.to_string(),
                detail: format!(
                    "the helper staged version {} although at least {at_least} was required (versions start at 1 and `at_least` must be honoured); inspect the key in the KMS and fix the helper before running keyplan again",
                    r.version
                ),
            });
        }
        Ok(r.version)
    }

    fn commit_as(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        // Never retried: after an ambiguous failure the engine re-reads the key first.
        self.call::<IgnoredAny>(
            &Op::Commit {
                expected_current,
                pending,
                holder,
            },
            Some(name),
            None,
        )
        .map(drop)
    }

    fn hold(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        with_retries(&format!("hold of key {name:?}"), || {
            self.call::<IgnoredAny>(&Op::Hold { holder }, Some(name), None)
                .map(drop)
        })
    }

    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        with_retries(&format!("release of key {name:?}"), || {
            self.call::<IgnoredAny>(&Op::Release { holder }, Some(name), None)
                .map(drop)
        })
    }

    fn retire(&self, name: &str, version: u64) -> Result<(), KmsError> {
        with_retries(&format!("retire of key {name:?} version {version}"), || {
            self.call::<IgnoredAny>(&Op::Retire { version }, Some(name), None)
                .map(drop)
        })
    }

    fn check(&self, names: &[String]) -> Result<(), KmsError> {
        with_retries("check", || {
            self.call::<IgnoredAny>(&Op::Check { names }, None, None)
                .map(drop)
        })
    }

    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError> {
        with_retries(&format!("destroy_key of key {name:?}"), || {
            self.call::<IgnoredAny>(&Op::DestroyKey { expected_current }, Some(name), None)
                .map(drop)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_documented_shape() {
        let names = vec!["a".to_string(), "b".to_string()];
        let cases: Vec<(Op<'_>, Option<&str>, serde_json::Value)> = vec![
            (
                Op::Check { names: &names },
                None,
                serde_json::json!({"protocol_version":1,"operation":"check","kms":"c","names":["a","b"]}),
            ),
            (
                Op::Read,
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"read","kms":"c","key":"k"}),
            ),
            (
                Op::Stage {
                    material_base64: "c2VjcmV0",
                    at_least: 3,
                },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"stage","kms":"c","key":"k","material_base64":"c2VjcmV0","at_least":3}),
            ),
            (
                Op::Commit {
                    expected_current: None,
                    pending: 1,
                    holder: None,
                },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"commit","kms":"c","key":"k","expected_current":null,"pending":1}),
            ),
            (
                Op::Commit {
                    expected_current: Some(1),
                    pending: 2,
                    holder: Some("node-a:/var/lib/keyplan"),
                },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"commit","kms":"c","key":"k","expected_current":1,"pending":2,"holder":"node-a:/var/lib/keyplan"}),
            ),
            (
                Op::Hold {
                    holder: "node-a:/var/lib/keyplan",
                },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"hold","kms":"c","key":"k","holder":"node-a:/var/lib/keyplan"}),
            ),
            (
                Op::Release {
                    holder: "node-a:/var/lib/keyplan",
                },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"release","kms":"c","key":"k","holder":"node-a:/var/lib/keyplan"}),
            ),
            (
                Op::DestroyKey {
                    expected_current: 4,
                },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"destroy_key","kms":"c","key":"k","expected_current":4}),
            ),
        ];
        for (op, key, want) in cases {
            let buf = encode_request(&Request {
                protocol_version: 1,
                op: &op,
                kms: "c",
                key,
            })
            .expect("encode");
            let got: serde_json::Value = serde_json::from_slice(&buf).expect("json");
            assert_eq!(got, want);
        }
    }

    #[test]
    fn tidy_joins_lines_and_drops_control_characters() {
        assert_eq!(tidy("a\n\n b\x1b[31m \nc\r\n"), "a; b[31m; c");
    }
}
