#!/usr/bin/env bash
# Runs the default test suite N times (default 10) in a row, exactly as scripts/test.sh runs
# it, and lists every test that failed at least once, with how often. Exit 0 when all N runs
# were green, 1 otherwise. Logs: $KEYPLAN_FLAKES_DIR (default target/flakes/), one per run.
#   scripts/flakes.sh 10
# A test that failed once is a bug, in the test or in keyplan: read its log, do not retry it.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-10}"
source scripts/test-env.sh
dir="${KEYPLAN_FLAKES_DIR:-target/flakes}"
mkdir -p "$dir"
cargo test --locked --features failpoints --no-run -q 7>&-
green=0
for i in $(seq "$runs"); do
  start=$(date +%s)
  # --no-fail-fast: every test binary runs, so one failure does not hide another.
  if cargo test --locked --features failpoints --no-fail-fast -- --test-threads=4 \
      >"$dir/run-$i.log" 2>&1 7>&-; then
    green=$((green + 1))
    verdict=green
  else
    verdict=FAILED
  fi
  echo "run $i/$runs: $verdict in $(( $(date +%s) - start )) s"
done
echo "$green of $runs runs green"
# "Running <binary> (...)" names the binary; "test name ... FAILED" the test.
awk '/^     Running /{bin=$2} / \.\.\. FAILED$/{print bin" "$2}' "$dir"/run-*.log \
  | sort | uniq -c | sort -rn | awk '{printf "  failed %d of '"$runs"': %s %s\n", $1, $2, $3}'
[ "$green" = "$runs" ]
