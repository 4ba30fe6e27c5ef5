#!/bin/sh
# Fleet rollout benchmark (issues 15, 31): NODES simulated nodes (keyplan agent processes, each
# with its own LUKS image file and state directory) against the real control plane of
# tests/common/kube.rs (KEYPLAN_K8S_BIN: see scripts/k8s-control-plane.sh), keys in a real
# OpenBao (`bao` on PATH), CONCURRENT rollout slots, no injected delays. For each PBKDF2
# iteration count in ITERATIONS (default 300000 and 1500000; the run lengths they give with 10
# at once on a 2-core machine are in docs/fleet.md, "How fast the rollout goes") it prints the
# enrollment rollout against the ideal ceil(nodes / slots) x one node's run (the median run
# from the agents' JSON logs), timed from `fleet resume` (the agents start paused, as on a
# running fleet; they run niced, as if the control plane had its own CPU), and the idle cost:
# the agents' requests and writes per node per interval, watches held, and the API server's
# own request count and CPU time (its /metrics) per idle node per hour.
#
#   benches/fleet_rollout.sh [NODES [CONCURRENT [INTERVAL_SECONDS]]]     # default 100 10 30
#   ITERATIONS="300000 1500000" PROFILE=--release benches/fleet_rollout.sh
set -eu
cd "$(dirname "$0")/.."
export KEYPLAN_FLEET_NODES="${1:-100}" KEYPLAN_FLEET_CONCURRENT="${2:-10}" KEYPLAN_FLEET_INTERVAL="${3:-30}"
export PATH="$PATH:/usr/sbin:/sbin"
profile="${PROFILE---release}"
figures="$(mktemp)"
trap 'rm -f "$figures"' EXIT
for iterations in ${ITERATIONS:-300000 1500000}; do
    KEYPLAN_FLEET_ITERATIONS="$iterations" KEYPLAN_FLEET_FIGURES="$figures" \
        cargo test $profile --locked --test fleet rollout_benchmark -- --ignored --nocapture >/dev/null 2>&1 || {
        echo "the benchmark failed; run: cargo test $profile --test fleet rollout_benchmark -- --ignored --nocapture" >&2
        exit 1
    }
    python3 - "$figures" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
print(f"nodes {f['nodes']}, max_concurrent_nodes {f['max_concurrent_nodes']}, runs {f['runs']}, PBKDF2 {f['pbkdf2_iterations']} iterations")
print(f"  one node's run (median): {f['median_node_run_seconds']:.2f} s; ideal ceil(nodes/slots) x run: {f['ideal_seconds']:.1f} s")
print(f"  agents started, observed and reported their work (paused): {f['agents_started_up_seconds']:.1f} s")
print(f"  runs: mean {f['mean_node_run_seconds']:.2f} s; the slot that ended last ran {f['last_slot_runs_seconds']:.1f} s of runs")
print(f"  hand-overs (a run's end to the next run's start on its slot): {f['hand_overs']}, median {f['hand_over_median_seconds']:.3f} s, max {f['hand_over_max_seconds']:.3f} s")
print(f"  rollout, resume to last run end: {f['resumed_seconds']:.1f} s = {f['resumed_over_ideal']:.2f} x ideal")
print(f"  rollout, first run start to last run end: {f['busy_seconds']:.1f} s = {f['busy_over_ideal']:.2f} x ideal")
print(f"  rollout, resume to every node's report in sync: {f['rollout_seconds']:.1f} s = {f['rollout_over_ideal']:.2f} x ideal")
print(f"  idle ({f['idle_interval_seconds']} s interval): {f['idle_requests_per_node_per_cycle']:.2f} requests and {f['idle_writes_per_node_per_cycle']:.2f} writes per node per interval, {f['idle_watch_requests']} watch requests")
print(f"  API server per idle node per hour: {f['apiserver_requests_per_idle_node_hour']:.0f} requests, {f['apiserver_cpu_seconds_per_idle_node_hour']:.2f} CPU seconds")
PY
done
