//! The engine end to end against the real cryptsetup: plan, apply, the crash matrix, chaos, adoption, day-2 commands, status, the LUKS driver.
//!
//! One test binary per area (`cargo test --test engine`), one module per file; the support
//! code every area shares is tests/common/ (CONTRIBUTING.md, "Tests").

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)] // tests: a panic is a failure, output the report

#[path = "../common/mod.rs"]
mod common;

mod adopt;
mod bad_input;
mod chaos;
mod crash;
mod day2_commands;
mod dead_disk;
mod e2e;
mod hygiene;
mod image;
mod journal_compaction;
mod keyslots_in_view;
mod luks_driver;
mod luks_ondisk;
mod memory_budget;
mod migration;
mod migration_kept;
mod pbkdf_audit;
mod pbkdf_rewrap;
mod revocation;
mod safety;
mod saved_plan;
mod shared_keys;
mod state_formats;
mod state_owner;
mod status;
mod upgrade;
