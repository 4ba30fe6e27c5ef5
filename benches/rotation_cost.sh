#!/usr/bin/env bash
# Measures what one rotation of a key shared by N LUKS2 devices costs keyplan, in PBKDF runs
# (keyplan's own counter) and in PBKDF-equivalents (child CPU seconds / CPU seconds of one
# `cryptsetup open --test-passphrase`, i.e. one PBKDF run with the same parameters).
#
# Usage: benches/rotation_cost.sh [N_DEVICES] [ARGON2_MEMORY_KIB]   (defaults: 3, 262144)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin:/sbin"
n=${1:-3}
mem=${2:-262144}
cargo build --release --locked --quiet
kp=$PWD/target/release/keyplan
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
printf 'bench initial passphrase' > initial.pass
pbkdf="--pbkdf argon2id --pbkdf-memory $mem --pbkdf-parallel 2 --pbkdf-force-iterations 4"
{
  echo "version: 1"
  echo "kms: { local: { provider: file, path: keys } }"
  echo "keys: { k: { kms: local } }"
  echo "devices:"
  for i in $(seq 1 "$n"); do
    truncate -s 24M "d$i.img"
    cryptsetup luksFormat --batch-mode --type luks2 $pbkdf --key-file initial.pass "d$i.img"
    echo "  d$i: { path: d$i.img, keys: [k], enroll_with: initial.pass }"
  done
  echo "settings:"
  echo "  pbkdf: { type: argon2id, memory_kib: $mem, parallel: 2, iterations: 4 }"
  echo "  parallelism: 1"
} > keyplan.yaml
"$kp" apply --auto-approve -q > /dev/null

cpu() { # child user+sys seconds of "$@"
  python3 - "$@" <<'PY'
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{r.ru_utime + r.ru_stime:.3f}")
PY
}
one=$(cpu cryptsetup open --test-passphrase --key-file initial.pass --key-slot 0 d1.img)
start=$(date +%s.%N)
out=$("$kp" apply --auto-approve --rotate k)
wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}')
rot=$(cpu "$kp" apply --auto-approve --rotate k)
runs=$(grep -o '[0-9]* PBKDF runs' <<<"$out" | cut -d' ' -f1)
echo "devices: $n, argon2id memory: $mem KiB, parallel 2, iterations 4"
echo "one PBKDF run (test-passphrase): ${one}s CPU"
echo "rotation: $runs PBKDF runs counted = $(awk -v r="$runs" -v n="$n" 'BEGIN{printf "%.2f", r/n}') per device"
echo "rotation: ${rot}s child CPU = $(awk -v r="$rot" -v o="$one" -v n="$n" 'BEGIN{printf "%.2f", r/o/n}') PBKDF-equivalents per device; wall ${wall}s (parallelism 1)"
