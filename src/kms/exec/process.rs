//! Running one `exec` helper process: its three pipes served by threads of keyplan's own (so
//! key material only sits in zeroizing buffers), the response and standard error read with
//! their limits, and the kill of its process group.

use std::io::{PipeReader, PipeWriter, Write as _};
use std::process::ExitStatus;
use std::sync::mpsc;
use std::time::Instant;

use zeroize::Zeroizing;

/// Largest response keyplan reads from a helper's standard output: 1 MiB. A longer one is
/// [`KmsError::Unavailable`](crate::kms::KmsError::Unavailable).
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// Bytes of standard error kept while the helper runs (the tail; older output is dropped).
const STDERR_KEPT_BYTES: usize = 8192;

/// One message from a thread serving the helper.
enum Event {
    Stdout(std::io::Result<Response>),
    Stderr(Zeroizing<Vec<u8>>),
}

/// The helper's standard output as read: at most [`MAX_RESPONSE_BYTES`] bytes.
#[derive(Default)]
pub(super) struct Response {
    pub(super) bytes: Zeroizing<Vec<u8>>,
    pub(super) overflow: bool,
}

/// What a helper run left behind.
pub(super) struct Finished {
    pub(super) status: ExitStatus,
    pub(super) stdout: std::io::Result<Response>,
    pub(super) stderr_tail: Zeroizing<Vec<u8>>,
}

/// The threads serving a running helper's pipes, and what the readers reported so far. Each
/// pipe has a thread of its own, so neither side can block the other (a helper writing much
/// to standard error before reading its standard input, say). The threads are detached: one
/// that a stray process keeps blocked cannot hold keyplan.
pub(super) struct Served {
    rx: mpsc::Receiver<Event>,
    pub(super) stdout: Option<std::io::Result<Response>>,
    pub(super) stderr: Option<Zeroizing<Vec<u8>>>,
}

impl Served {
    /// Waits until both output pipes reached their end or `until` passes (what has arrived
    /// by then is taken even when `until` has passed already); true when nothing more is to
    /// come (both ended, or a reader thread is gone).
    pub(super) fn collect(&mut self, until: Instant) -> bool {
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
pub(super) fn serve(
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
pub(super) fn kill_group(handle: &duct::Handle) {
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
