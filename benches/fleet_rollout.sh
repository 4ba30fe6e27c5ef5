#!/bin/sh
# Fleet rollout benchmark (issue 15): NODES simulated nodes (keyplan agent processes, each with
# its own LUKS image file and state directory) against the real control plane of
# tests/common/kube.rs (KEYPLAN_K8S_BIN: see scripts/k8s-control-plane.sh), keys in a real
# OpenBao (`bao` on PATH), CONCURRENT rollout slots, no injected delays. Prints the enrollment
# rollout's wall time against the ideal ceil(nodes / slots) x one node's run (the median run
# from the agents' JSON logs), and the API requests per node per idle cycle.
#
#   benches/fleet_rollout.sh [NODES [CONCURRENT [INTERVAL_SECONDS]]]     # default 100 10 30
set -eu
cd "$(dirname "$0")/.."
export KEYPLAN_FLEET_NODES="${1:-100}" KEYPLAN_FLEET_CONCURRENT="${2:-10}" KEYPLAN_FLEET_INTERVAL="${3:-30}"
export PATH="$PATH:/usr/sbin:/sbin"
figures="$(mktemp)"
trap 'rm -f "$figures"' EXIT
KEYPLAN_FLEET_FIGURES="$figures" cargo test --release --locked --test fleet_agent rollout_benchmark -- --ignored --nocapture >/dev/null 2>&1 || {
    echo "the benchmark failed; run: cargo test --release --test fleet_agent rollout_benchmark -- --ignored --nocapture" >&2
    exit 1
}
python3 - "$figures" <<'PY'
import json, sys
f = json.load(open(sys.argv[1]))
print(f"nodes {f['nodes']}, max_concurrent_nodes {f['max_concurrent_nodes']}, runs {f['runs']}")
print(f"one node's run (median, PBKDF2 {f['pbkdf2_iterations']} iterations): {f['median_node_run_seconds']:.2f} s")
print(f"rollout: {f['rollout_seconds']:.1f} s; ideal ceil(nodes/slots) x run: {f['ideal_seconds']:.1f} s; ratio {f['rollout_over_ideal']:.2f}")
print(f"API requests per node per idle cycle ({f['idle_interval_seconds']} s): {f['idle_requests_per_node_per_cycle']:.2f}")
PY
