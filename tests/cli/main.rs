//! The command line: output snapshots, operator comfort, the plan file loader and its JSON Schema, validate, sign, version, the release script.
//!
//! One test binary per area (`cargo test --test cli`), one module per file; the support
//! code every area shares is tests/common/ (CONTRIBUTING.md, "Tests").

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)] // tests: a panic is a failure, output the report

#[path = "../common/mod.rs"]
mod common;

mod comfort;
mod reference;
mod release_script;
mod schema;
mod sign;
mod snapshots;
mod spec_load;
mod validate_json;
mod version;
