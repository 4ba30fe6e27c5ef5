//! Verification: the exhaustive protocol model, the deterministic simulation of the engine
//! (seeded schedules of crashes, errors and concurrent writers at every LUKS and KMS call), the
//! LUKS door differential test, the fuzz corpora, and the shape of src/.
//!
//! One test binary per area (`cargo test --test verification`), one module per file; the support
//! code every area shares is tests/common/ (CONTRIBUTING.md, "Tests").

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)] // tests: a panic is a failure, output the report

#[path = "../common/mod.rs"]
mod common;
#[path = "../model/mod.rs"]
mod model;
#[path = "../sim/mod.rs"]
mod sim;

mod formats_journal;
mod formats_published;
mod formats_state;
mod formats_stdout;
mod fuzz_corpus;
mod luks_door_differential;
mod protocol_model;
mod simulation;
mod structure;
