#!/usr/bin/env bash
# `keyplan plan` on N unchanged LUKS2 devices (default 1000): wall time, and the cryptsetup
# processes it starts (counted by a wrapper: headers are read in process, so 0 is expected);
# then one key rotated on 3 devices: cryptsetup processes per device and PBKDF runs. A
# benchmark, not a test (docs/performance.md, "Observation"): it prints numbers.
#
# Usage: benches/observe.sh [N]      binary: $KEYPLAN, else target/release/keyplan (built here)
# Needs: cryptsetup; about 1.6 MiB of disk per device (small LUKS2 images).
set -euo pipefail
{
export PATH="$PATH:/usr/sbin:/sbin" LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
n=${1:-1000}
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
cat > wrap.sh <<WRAP
#!/bin/sh
echo "\$1 \$2" >> "$work/calls.log"
exec "$(command -v cryptsetup)" "\$@"
WRAP
chmod +x wrap.sh
{
  printf 'version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n'
  for i in $(seq 1 "$n"); do printf '  k%s: { kms: local }\n' "$i"; done
  printf 'devices:\n'
  for i in $(seq 1 "$n"); do printf '  d%s: { path: d%s.img, keys: [k%s], enroll_with: init.pass }\n' "$i" "$i" "$i"; done
  printf 'settings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }\n  parallelism: 2\n'
} > keyplan.yaml
for i in $(seq 1 "$n"); do
  cp base.img "d$i.img"
  cryptsetup luksUUID --batch-mode --uuid "$(cat /proc/sys/kernel/random/uuid)" "d$i.img"
done
"$KEYPLAN" apply --auto-approve > /dev/null
: > calls.log
start=$(date +%s.%N)
KEYPLAN_CRYPTSETUP="$work/wrap.sh" "$KEYPLAN" plan > plan.out
end=$(date +%s.%N)
echo "plan on $n unchanged LUKS2 devices: $(echo "$end - $start" | bc) s, $(wc -l < calls.log) cryptsetup processes ($(tail -1 plan.out))"
# One key on 3 devices, rotated.
mkdir rot && cd rot && printf 'initpass' > init.pass
for i in 1 2 3; do cp ../base.img "r$i.img"; cryptsetup luksUUID --batch-mode --uuid "$(cat /proc/sys/kernel/random/uuid)" "r$i.img"; done
printf 'version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local }\ndevices:\n  r1: { path: r1.img, keys: [k], enroll_with: init.pass }\n  r2: { path: r2.img, keys: [k], enroll_with: init.pass }\n  r3: { path: r3.img, keys: [k], enroll_with: init.pass }\nsettings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }\n' > keyplan.yaml
"$KEYPLAN" apply --auto-approve > /dev/null
: > ../calls.log
summary=$(KEYPLAN_CRYPTSETUP="$work/wrap.sh" "$KEYPLAN" apply --auto-approve --rotate k | tail -1)
echo "rotation of one key on 3 devices: $(wc -l < ../calls.log) cryptsetup processes ($(( $(wc -l < ../calls.log) / 3 )) per device): $summary"
sort ../calls.log | uniq -c
}
