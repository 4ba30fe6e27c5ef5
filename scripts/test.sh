#!/usr/bin/env bash
# The whole test suite: installs what the tests need (cryptsetup-bin, xz-utils), then checks
# formatting and lints and runs every test against the real cryptsetup on LUKS image files.
# Tests that use the cryptsetup project's images from ../shared/testdata report SKIPPED when
# that directory is absent (set KEYPLAN_TESTDATA to point elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin:/sbin"

need=()
command -v cryptsetup >/dev/null 2>&1 || need+=(cryptsetup-bin)
command -v xz >/dev/null 2>&1 || need+=(xz-utils)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
cryptsetup --version

cargo fmt --all -- --check
cargo clippy --locked --all-targets -- -D warnings
cargo test --locked
