#!/usr/bin/env bash
# Fuzz keyplan's plan-file loader, journal reader and LUKS header reader with cargo-fuzz
# (libFuzzer).
#
# Usage: scripts/fuzz.sh [plan_loader|journal_reader|luks_header|all] [SECONDS]
#        (default: all 300)
#
# luks_header also reads, as a read-only seed corpus, the first 128 KiB of every image in the
# cryptsetup project's test images (../shared/testdata/cryptsetup/, when present), unpacked to a
# temporary directory that is removed afterwards: those images are never committed.
#
# Installs cargo-fuzz if missing. Works on a stable toolchain: RUSTC_BOOTSTRAP=1 lets stable
# rustc accept the nightly flags cargo-fuzz passes. keyplan is safe Rust, so the default is no
# sanitizer (about 9x more execs/s than AddressSanitizer; panics, overflows and debug
# assertions are still caught); FUZZ_SANITIZER=address builds with ASan. FUZZ_JOBS=N runs N
# fuzzing processes per target. New inputs that reach new code are added
# to fuzz/corpus/<target>/; crashes go to fuzz/artifacts/<target>/ (see docs/fuzzing.md to
# turn one into a regression input). Minimize the corpus afterwards with
#   RUSTC_BOOTSTRAP=1 cargo fuzz cmin <target>     (in fuzz/)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

target=${1:-all}
seconds=${2:-300}
sanitizer=${FUZZ_SANITIZER:-none}
jobs=${FUZZ_JOBS:-1}

case "$target" in
  all) targets=(plan_loader journal_reader luks_header) ;;
  plan_loader | journal_reader | luks_header) targets=("$target") ;;
  *) echo "usage: $0 [plan_loader|journal_reader|luks_header|all] [SECONDS]" >&2; exit 2 ;;
esac
if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
  echo "SECONDS must be a whole number, got: $seconds" >&2
  exit 2
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "==> installing cargo-fuzz (cargo install cargo-fuzz --locked)"
  cargo install cargo-fuzz --locked
fi

# Unpacks the cryptsetup project's test images into a temporary directory, keeping the first
# 128 KiB of each (both LUKS2 header copies of every layout up to 64 KiB, or a LUKS1 header and
# keyslot table), into $seed_tmp/seeds; leaves $seed_tmp empty when ../shared/testdata is absent.
seed_tmp=""
cryptsetup_seeds() {
  local src=../../shared/testdata/cryptsetup
  [ -d "$src" ] || return 0
  seed_tmp=$(mktemp -d)
  local unpack="$seed_tmp/unpack" out="$seed_tmp/seeds"
  mkdir -p "$unpack" "$out"
  local f
  for f in "$src"/*.xz; do
    case "$f" in
      *.tar.xz) tar -xJf "$f" -C "$unpack" ;;
      *) xz -dc "$f" > "$unpack/$(basename "${f%.xz}")" ;;
    esac
  done
  local n=0
  while IFS= read -r -d '' f; do
    head -c 131072 "$f" > "$out/seed-$n"
    n=$((n + 1))
  done < <(find "$unpack" -type f -print0)
  rm -rf "$unpack"
  echo "==> seeding luks_header with $n files from $src"
}
trap '[ -z "$seed_tmp" ] || rm -rf "$seed_tmp"' EXIT

export RUSTC_BOOTSTRAP=1
for t in "${targets[@]}"; do
  case "$t" in
    plan_loader) max_len=4096 ;;
    journal_reader) max_len=16384 ;;
    luks_header) max_len=131072 ;;
  esac
  mkdir -p "corpus/$t"
  seeds=()
  if [ "$t" = luks_header ]; then
    cryptsetup_seeds
    if [ -n "$seed_tmp" ]; then seeds=("$seed_tmp/seeds"); fi
  fi
  echo "==> fuzzing $t for ${seconds}s (sanitizer: $sanitizer, jobs: $jobs)"
  # One job runs in this process (output here); more run as libFuzzer workers that log to
  # fuzz-N.log. -timeout: an input taking 10 s is a hang worth reporting.
  parallel=()
  if [ "$jobs" -gt 1 ]; then parallel=(-jobs="$jobs" -workers="$jobs"); fi
  cargo fuzz run -s "$sanitizer" "$t" "corpus/$t" "${seeds[@]}" -- \
    -max_total_time="$seconds" "${parallel[@]}" -max_len="$max_len" \
    -timeout=10 -dict="dicts/$t.dict" -print_final_stats=1
done
