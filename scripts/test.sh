#!/usr/bin/env bash
# The whole test suite: installs what the tests need (cryptsetup-bin, xz-utils), then checks
# formatting and lints and runs every test against the real cryptsetup on LUKS image files,
# including the crash matrix and a short chaos run.
# Tests that use the cryptsetup project's images from ../shared/testdata report SKIPPED when
# that directory is absent (set KEYPLAN_TESTDATA to point elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
# Installing and starting what the tests need: scripts/test-env.sh.
source scripts/test-env.sh

cargo fmt --all -- --check
# Lint both builds: release code (no injection points) and the test build (`failpoints`).
cargo clippy --locked --all-targets -- -D warnings
cargo clippy --locked --all-targets --features failpoints -- -D warnings
# `failpoints` compiles keyplan's crash/error injection points (src/failpoint.rs), which the
# crash matrix (tests/engine/crash.rs) and the KMS fault tests (tests/kms/faults.rs) fire. Set
# KEYPLAN_CHAOS_RUNS for a longer chaos soak (tests/engine/chaos.rs).
# Four test threads: the crash matrix and chaos tests wait on fsync and cryptsetup more than
# they compute, so they overlap well even on 2 cores.
cargo test --locked --features failpoints -- --test-threads=4 7>&-
