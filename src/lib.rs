//! keyplan: declarative, crash-safe rotation of LUKS keyslots whose passphrases live in a KMS.
//!
//! Data flows one way: [`spec`] loads and validates the plan file; [`observe`] reads every
//! device's LUKS header (through [`luks`], the cryptsetup driver) and every key's versions
//! (through [`kms`]); [`diff`] compares desired and observed state into a list of changes, each
//! with a reason; [`graph`] turns changes into a dependency graph of idempotent steps; [`apply`]
//! runs that graph under a lock with a write-ahead [`journal`], resuming an interrupted run
//! first. [`render`] prints plans for humans; [`cli`] is the command line. Key material is held
//! only in [`secret::Passphrase`]. [`saved`] holds saved plans (`plan -o`): the file format and the
//! digest of the observed state that makes a stale saved plan refused.
//!
//! [`failpoint`] holds the crash and error injection points the crash tests fire (compiled
//! only with the `failpoints` cargo feature); `fuzzing` (hidden) holds the fuzz harnesses.

pub mod apply;
/// Child processes (cryptsetup, `exec` KMS helpers): own process group, death with keyplan,
/// minimal environment, a retried start while the program file is busy.
pub mod child;
pub mod cli;
pub mod clock;
pub mod diff;
pub mod failpoint;
pub mod fsutil;
#[doc(hidden)]
pub mod fuzzing;
pub mod graph;
pub mod journal;
pub mod kms;
pub mod luks;
pub mod observe;
pub mod par;
pub mod render;
pub mod saved;
pub mod secret;
pub mod spec;
