//! SIGINT/SIGTERM/SIGHUP during `apply`: the first signal lets the running steps finish and
//! then stops the run (left open in the journal, exit 1); a second signal exits at once (safe
//! at any instant: the journal and the step algorithm make every instant resumable, and
//! cryptsetup children die with keyplan, see `child`). Outside a run (planning, the
//! confirmation prompt) a signal exits at once: nothing is being changed then.
//!
//! Signals are the front end's business: the engine only gets the stop flag
//! (`ops::apply::RunOptions::stop`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use miette::{IntoDiagnostic as _, Result};

/// Set by the first signal during a run.
static STOP: AtomicBool = AtomicBool::new(false);
/// True while a step graph runs.
static ACTIVE: AtomicBool = AtomicBool::new(false);
static INSTALLED: OnceLock<()> = OnceLock::new();

fn say(msg: &[u8]) {
    // SAFETY: write(2) is async-signal-safe; `msg` is a valid buffer of `msg.len()` bytes.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
    }
}

fn on_signal() {
    if !ACTIVE.load(Ordering::SeqCst) {
        say(b"\nkeyplan: interrupted\n");
        signal_hook::low_level::exit(1);
    }
    if STOP.swap(true, Ordering::SeqCst) {
        say(b"\nkeyplan: second signal: exiting now. The journal records the interrupted run; run `keyplan apply` to finish it.\n");
        signal_hook::low_level::exit(1);
    }
    say(b"\nkeyplan: signal received: finishing the running steps, then stopping (send it again to exit at once)\n");
}

/// Installs the SIGINT, SIGTERM and SIGHUP handlers (once) and returns the stop flag.
///
/// Errors: the handlers could not be installed (sigaction(2) failed).
pub(super) fn install() -> Result<&'static AtomicBool> {
    if INSTALLED.get().is_none() {
        for sig in [
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGHUP,
        ] {
            // SAFETY: the handler uses only atomics, write(2) and _exit(2), all
            // async-signal-safe; it allocates and locks nothing.
            unsafe { signal_hook::low_level::register(sig, on_signal) }.into_diagnostic()?;
        }
        let _ = INSTALLED.set(());
    }
    Ok(&STOP)
}

/// Runs `f` (a step graph) with signals deferred to the end of the running steps.
pub(super) fn during_run<T>(f: impl FnOnce() -> T) -> T {
    ACTIVE.store(!STOP.load(Ordering::SeqCst), Ordering::SeqCst);
    let out = f();
    ACTIVE.store(false, Ordering::SeqCst);
    out
}

/// Set by the first SIGTERM/SIGINT/SIGHUP of `keyplan agent`.
static AGENT_STOP: AtomicBool = AtomicBool::new(false);

/// `keyplan agent`'s handlers: the first signal sets the returned flag (the agent lets the
/// running steps finish, releases its rollout slot, reports and exits 0); a second one exits
/// at once with status 1 (safe at any instant, as for `apply`).
///
/// Errors: the handlers could not be installed.
pub(super) fn install_agent() -> Result<&'static AtomicBool> {
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        // SAFETY: the handler stores into an atomic and writes with write(2) (async-signal-safe).
        unsafe {
            signal_hook::low_level::register(sig, || {
                if AGENT_STOP.swap(true, Ordering::SeqCst) {
                    say(b"\nkeyplan agent: second signal: exiting now. The journal records any interrupted run; the next agent finishes it.\n");
                    signal_hook::low_level::exit(1);
                }
                say(b"\nkeyplan agent: signal received: finishing the running step, releasing the rollout slot, then exiting (send it again to exit at once)\n");
            })
        }
        .into_diagnostic()?;
    }
    Ok(&AGENT_STOP)
}
