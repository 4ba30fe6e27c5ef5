//! The KMS providers against real servers (OpenBao, PyKMIP, kube-apiserver, exec helpers): the contract test, faults, authentication, migration between providers, the retire and destroy crash matrix.
//!
//! One test binary per area (`cargo test --test kms`), one module per file; the support
//! code every area shares is tests/common/ (CONTRIBUTING.md, "Tests").

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)] // tests: a panic is a failure, output the report

#[path = "../common/mod.rs"]
mod common;

mod aws;
mod azure;
#[cfg(feature = "failpoints")]
mod destroy_matrix;
mod exec;
mod faults;
mod file;
mod formats;
mod ibm;
mod kmip;
mod kubernetes;
mod migration_providers;
mod vault;
mod vault_auth;
