//! Crash and error injection points for tests (cargo feature `failpoints`).
//!
//! keyplan's promise that a run killed at any instant converges (docs/rotation.md "The invariants", I1 and I3) is
//! tested by killing the process at named points: between journal records, before and after a
//! step's effect, and between the two halves of compound effects (a keyslot added but not yet
//! recorded, a KMS version written but not yet listed). The points are fail points of the
//! `fail` crate (<https://docs.rs/fail>), configured through the `FAILPOINTS` environment variable
//! (`FAILPOINTS="step.before_effect=2*off->return"` fires on the third evaluation; see the
//! `fail` crate's documentation for the syntax). A point that fires with `return` or
//! `return(crash)` kills keyplan with `SIGKILL` (no unwinding, no destructors, no journal
//! record: what a power cut or the OOM killer does; cryptsetup children die with it, see
//! `child`). A point that fires with `return(error)` makes the operation fail with an
//! injected error instead, for the error paths (an unreachable KMS, say). A point that fires
//! with `return(wait:PATH)` holds its thread while the file `PATH` exists, with a file
//! `PATH.<pid>` beside it for as long as it waits: a test holds processes at a point (every
//! running agent just before its commit, say) and learns from the files that they are there,
//! instead of guessing with sleeps.
//!
//! Without the feature every point compiles to nothing and [`check`] always returns `Ok`.
//!
//! The points, in the order a step meets them:
//! - `journal.torn_append`: write half of the next journal record, `fsync`, crash;
//! - `journal.after_append`: after a journal record is durable;
//! - `step.before_effect`: a worker thread is about to perform a step (its `step_start` is durable);
//! - `add.after_keyslot`: `luksAddKey` succeeded, the record (token) is not written yet;
//! - `kill.after_keyslot`: `luksKillSlot` succeeded, the record is not removed yet;
//! - `kms.file.stage.after_material`: the new version's file is written, its metadata not yet;
//! - `kms.file.retire.after_material`: the version's file is removed, it is not yet marked
//!   retired;
//! - `kms.file.destroy.after_meta`: a destroyed key's record says every version is retired,
//!   the current version's file is not yet removed;
//! - `kept.before_forget`: a move's or a kept copy's destroy in the KMS a key left is done,
//!   its entry in `<state_dir>/kept.json` not yet dropped;
//! - `commit.before`: a commit step is about to ask the KMS to make its staged version current
//!   (outside the KMS call's deadline);
//! - `step.after_effect`: a step's effect is complete, its `step_done` record not yet written;
//! - `kms.read`, `kms.get`, `kms.stage`, `kms.commit`, `kms.retire`, `kms.check`,
//!   `kms.destroy_key`: before each KMS call (any provider); `kms.commit.lost_reply` and
//!   `kms.stage.lost_reply`: after a successful commit or stage, as if the reply was lost;
//! - `kms.after_write`: inside a provider (vault, kubernetes, kmip, aws, exec), one of its
//!   writing requests to its server got a successful answer and keyplan has not made its next
//!   request (a compound call such as a retire or a destroy, killed between its writes);
//! - `status.after_observe` (not a step's): `status` has read the journal, the devices and the
//!   KMSs, and not yet the state lock (a run that ends here tests `status`'s second look);
//! - `journal.compact.after_archive`, `journal.compact.after_history`,
//!   `journal.compact.after_journal` (not a step's): a compaction after a run
//!   ([`crate::journal::compact`]) has appended expired runs to the archive, replaced the
//!   history, replaced the journal.

/// Every injection point keyplan has, for harnesses that enumerate them.
pub const POINTS: &[&str] = &[
    "journal.torn_append",
    "journal.after_append",
    "step.before_effect",
    "add.after_keyslot",
    "kill.after_keyslot",
    "kms.file.stage.after_material",
    "kms.file.retire.after_material",
    "kms.file.destroy.after_meta",
    "kept.before_forget",
    "commit.before",
    "step.after_effect",
    "kms.read",
    "kms.get",
    "kms.stage",
    "kms.commit",
    "kms.commit.lost_reply",
    "kms.stage.lost_reply",
    "kms.retire",
    "kms.check",
    "kms.destroy_key",
    "kms.after_write",
    "status.after_observe",
    "journal.compact.after_archive",
    "journal.compact.after_history",
    "journal.compact.after_journal",
];

/// Evaluates injection point `name`.
///
/// Returns `Ok(())` when the point is not configured (always, without the `failpoints`
/// feature). Kills the process with `SIGKILL` when it fires with `return` or `return(crash)`.
///
/// Errors: a message `injected failure at <name>` when it fires with `return(error)` (or any
/// other argument).
#[inline]
pub fn check(name: &str) -> Result<(), String> {
    #[cfg(feature = "failpoints")]
    {
        if let Some(arg) = fail::eval(name, |arg| arg) {
            match arg.as_deref() {
                None | Some("") | Some("crash") => crash(name),
                Some(arg) if arg.starts_with("wait:") => hold_while_exists(&arg["wait:".len()..]),
                Some(other) => return Err(format!("injected failure at {name} ({other})")),
            }
        }
    }
    let _ = name;
    Ok(())
}

/// True when injection point `name` fires now (for points whose effect is site-specific, such
/// as `journal.torn_append`). Always false without the `failpoints` feature.
#[inline]
pub fn fires(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    {
        fail::eval(name, |_| ()).is_some()
    }
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        false
    }
}

/// Holds the calling thread while the file `gate` exists, with the file `<gate>.<pid>` present
/// meanwhile (see the module documentation: `return(wait:PATH)`). Polls every 20 ms: test
/// builds only.
#[cfg(feature = "failpoints")]
fn hold_while_exists(gate: &str) {
    let gate = std::path::Path::new(gate);
    if !gate.exists() {
        return;
    }
    let marker = std::path::PathBuf::from(format!("{}.{}", gate.display(), std::process::id()));
    let _ = std::fs::write(&marker, b"");
    while gate.exists() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&marker);
}

/// Kills this process with `SIGKILL`: no unwinding, no destructors, no buffered output
/// flushed, no journal record. Used only by injection points.
#[allow(
    clippy::print_stderr,
    reason = "the line tests wait for; no logger is sure to flush before SIGKILL"
)]
pub fn crash(name: &str) -> ! {
    // Tests look for this line to tell an injected crash from a real one.
    eprintln!("keyplan: injected crash at {name}");
    // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

/// Sets up the points from the `FAILPOINTS` environment variable; a no-op without the
/// `failpoints` feature. Call once at program start and keep the guard alive.
///
/// Panics (feature builds only, i.e. tests) when `FAILPOINTS` is malformed.
pub fn setup() -> Guard {
    #[cfg(feature = "failpoints")]
    {
        Guard {
            _scenario: fail::FailScenario::setup(),
        }
    }
    #[cfg(not(feature = "failpoints"))]
    {
        Guard {}
    }
}

/// Keeps the injection points configured while alive (see [`setup`]).
pub struct Guard {
    #[cfg(feature = "failpoints")]
    _scenario: fail::FailScenario<'static>,
}
