#!/usr/bin/env bash
# A year of keyplan on one host, in simulated time: 24 LUKS2 devices with a key each (Rook's
# layout: one KEK per OSD), every key rotated once a week (`apply --rotate` for all 24), and a
# 5-minute cycle (`apply --auto-approve` with nothing to do) in between. Prints, per simulated
# week: the state directory's size (journal, audit trail), the median time of `keyplan plan`
# and of an idle cycle, and the rotation's steps and PBKDF runs; at the end, the same `plan`
# against the year's runs left uncompacted in one journal (what keyplan did before journal
# compaction). A benchmark, not a test (docs/performance.md, "A year of journal").
#
# Idle cycles write nothing (no run, no journal record): the script checks that the state
# directory is byte for byte the same after IDLE_SAMPLES idle cycles of each week, and does
# not run the other 2,016 - IDLE_SAMPLES. Time is simulated: a week is one rotation.
#
# Usage: benches/journal_year.sh [WEEKS [KEEP_RUNS [IDLE_SAMPLES]]]   (default 52 8 3)
#        binary: $KEYPLAN, else target/release/keyplan (built here)
# Needs: cryptsetup, bc; about 40 MiB of disk.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin" LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
weeks=${1:-52}
keep=${2:-8}
idle=${3:-3}
devices=24
if [ -z "${KEYPLAN:-}" ]; then
  (cd "$repo" && cargo build --release --locked -q)
  KEYPLAN="$repo/target/release/keyplan"
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
printf 'initpass' > init.pass
truncate -s 1572864 base.img
printf 'initpass' | cryptsetup luksFormat --batch-mode --type luks2 --pbkdf pbkdf2 \
  --pbkdf-force-iterations 1000 --key-size 256 --luks2-metadata-size 16k \
  --luks2-keyslots-size 512k --key-file=- base.img 2>/dev/null
{
  printf 'version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n'
  for i in $(seq 1 "$devices"); do printf '  k%s: { kms: local }\n' "$i"; done
  printf 'devices:\n'
  for i in $(seq 1 "$devices"); do printf '  d%s: { path: d%s.img, keys: [k%s], enroll_with: init.pass }\n' "$i" "$i" "$i"; done
  printf 'settings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }\n  parallelism: 2\n'
} > keyplan.yaml
for i in $(seq 1 "$devices"); do
  cp base.img "d$i.img"
  cryptsetup luksUUID --batch-mode --uuid "$(cat /proc/sys/kernel/random/uuid)" "d$i.img"
done
retention=(--journal-keep-runs "$keep" --journal-archive "$work/archive.jsonl")
"$KEYPLAN" apply --auto-approve "${retention[@]}" > /dev/null
rotate=()
for i in $(seq 1 "$devices"); do rotate+=(--rotate "k$i"); done

now() { date +%s.%N; }
# Median wall time in seconds of 3 runs of the command.
median3() {
  local t=()
  for _ in 1 2 3; do
    local a b
    a=$(now); "$@" > /dev/null; b=$(now)
    t+=("$(printf '%.3f' "$(echo "$b - $a" | bc)")")
  done
  printf '%s\n' "${t[@]}" | sort -n | sed -n 2p
}
bytes() { if [ -f "$1" ]; then stat -c %s "$1"; else echo 0; fi; }
state_sum() { find .keyplan -type f ! -name lock -print0 | sort -z | xargs -0 sha256sum | sha256sum; }

printf '%-5s %-10s %-12s %-12s %-12s %-9s %-9s %s\n' week runs state_bytes journal_bytes history_bytes plan_s idle_s rotation
for w in $(seq 1 "$weeks"); do
  summary=$("$KEYPLAN" apply --auto-approve "${rotate[@]}" "${retention[@]}" | tail -1)
  before=$(state_sum)
  idle_t=$(median3 "$KEYPLAN" apply --auto-approve "${retention[@]}")
  for _ in $(seq 4 "$idle"); do "$KEYPLAN" apply --auto-approve "${retention[@]}" > /dev/null; done
  if [ "$(state_sum)" != "$before" ]; then
    echo "week $w: an idle cycle changed the state directory" >&2
    exit 1
  fi
  if [ "$w" -le 2 ] || [ $((w % 4)) -eq 0 ] || [ "$w" -eq "$weeks" ]; then
    plan_t=$(median3 "$KEYPLAN" plan)
    state=$(du -sb .keyplan | cut -f1)
    printf '%-5s %-10s %-12s %-12s %-12s %-9s %-9s %s\n' "$w" "$((w + 1))" "$state" \
      "$(bytes .keyplan/journal.jsonl)" "$(bytes .keyplan/history.jsonl)" "$plan_t" "$idle_t" "$summary"
  fi
done

# The same year without compaction: every run's records in one journal, as before.
archived=$(bytes "$work/archive.jsonl")
cp .keyplan/journal.jsonl journal.compacted
{ cat "$work/archive.jsonl" .keyplan/history.jsonl; grep -v '"event":"checkpoint"' journal.compacted; } > uncompacted.jsonl
mv .keyplan/history.jsonl history.compacted
cp uncompacted.jsonl .keyplan/journal.jsonl
plan_t=$(median3 "$KEYPLAN" plan)
echo "without compaction: journal $(bytes .keyplan/journal.jsonl) bytes, plan ${plan_t} s (archive of the compacted runs: ${archived} bytes)"
cp journal.compacted .keyplan/journal.jsonl
mv history.compacted .keyplan/history.jsonl
"$KEYPLAN" plan | tail -1
