//! Fleet mode against a real Kubernetes control plane: the node agent, rollout slots, trust, the manifests in deploy/, and the control-plane harness itself.
//!
//! One test binary per area (`cargo test --test fleet`), one module per file; the support
//! code every area shares is tests/common/ (CONTRIBUTING.md, "Tests").

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)] // tests: a panic is a failure, output the report

#[path = "../common/mod.rs"]
mod common;

mod agent;
mod deploy_apply;
mod deploy_manifests;
mod formats;
mod kube_cluster;
mod kube_harness;
mod mixed_version;
mod plan;
mod real_cluster;
mod slots;
mod trust;
