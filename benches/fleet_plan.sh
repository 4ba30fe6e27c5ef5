#!/usr/bin/env bash
# How long a cluster-sized plan takes to validate and to cut down to one node (fleet mode,
# issue 15): a generated plan with N devices (default 10,000) on N/100 nodes, one key per
# device (the file KMS), as tooling writes it for a Rook cluster. A benchmark, not a test: it
# prints the median of 5 runs of
#   - `keyplan validate` (the whole file),
#   - `keyplan --node elsewhere status` (load, validate, cut to a node with no devices: what
#     every agent pays per cycle before it looks at a device),
#   - `keyplan --node node-0 plan` (the same plan, node-0's 100 devices as real LUKS2 image
#     files, enrolled before: "No changes", one luksDump per device).
#
# Usage: benches/fleet_plan.sh [DEVICES]   (env KEYPLAN: the binary; default: build --release)
# Needs cryptsetup (root for nothing: image files only) and python3.
set -euo pipefail
N=${1:-10000}
PER_NODE=100
here=$(cd "$(dirname "$0")/.." && pwd)
if [[ -z "${KEYPLAN:-}" ]]; then
  (cd "$here" && cargo build --release --locked -q)
  KEYPLAN=$here/target/release/keyplan
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
printf 'initial passphrase' > initial.pass
python3 - "$N" "$PER_NODE" > keyplan.yaml <<'PY'
import sys
n, per = int(sys.argv[1]), int(sys.argv[2])
print("version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:")
for i in range(n):
    print(f"  osd-{i}: {{ kms: local }}")
print("devices:")
for i in range(n):
    node = f"node-{i // per}"
    # node-0's devices are image files here; the others' paths exist only on their nodes.
    path = f"osd-{i}.img" if i < per else f"/dev/disk/by-id/osd-{i}"
    print(f"  osd-{i}: {{ path: {path}, keys: [osd-{i}], enroll_with: initial.pass, node: {node} }}")
print("settings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }")
PY
for i in $(seq 0 $((PER_NODE - 1))); do
  truncate -s 3M "osd-$i.img"
  cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --luks2-metadata-size 16k --luks2-keyslots-size 512k "osd-$i.img" --key-file initial.pass
done
"$KEYPLAN" --node node-0 apply --auto-approve > /dev/null

median() { # COMMAND...: median wall seconds of 5 runs (exit status 0 or 1 accepted)
  python3 - "$@" <<'PY'
import subprocess, sys, time
times = []
for _ in range(5):
    t = time.monotonic()
    r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times.append(time.monotonic() - t)
    if r.returncode not in (0, 1):
        sys.exit(f"{sys.argv[1:]} exited {r.returncode}")
times.sort()
print(f"{times[2]:.2f} s (min {times[0]:.2f}, max {times[4]:.2f})")
PY
}
echo "plan: $N devices, $((N / PER_NODE)) nodes, $N keys ($(wc -c < keyplan.yaml) bytes)"
echo "keyplan validate:                     $(median "$KEYPLAN" validate)"
echo "keyplan --node elsewhere status:      $(median "$KEYPLAN" --node elsewhere status)"
echo "keyplan --node node-0 plan (100 dev): $(median "$KEYPLAN" --node node-0 plan)"
