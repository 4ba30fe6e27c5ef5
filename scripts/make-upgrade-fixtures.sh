#!/usr/bin/env bash
# Makes the upgrade fixtures (docs/upgrading.md, docs/formats.md "Upgrade fixtures"): runs made
# by a PREVIOUS keyplan, interrupted at every journal step boundary, that the current keyplan
# must finish (tests/engine/upgrade.rs).
#
#   scripts/make-upgrade-fixtures.sh --bin OLD_KEYPLAN --commit COMMIT [--out DIR]
#       [--random N --seed S]
#
# OLD_KEYPLAN is a `--features failpoints` build of COMMIT (scripts/upgrade-test.sh builds one
# in a worktree). For each scenario (rotation, enrollment, migration, PBKDF re-wrap) it
# formats small LUKS images, runs the scenario's setup applies without faults, then runs the
# apply to interrupt, held at every hit of each point in turn (see `scenario` below), and saves
# what a SIGKILL there leaves: the plan file, the state directory, the file KMS directories,
# the passphrase file and the images, into DIR/<scenario>/<seq>-<point>-<hit>/ (and
# DIR/<scenario>/torn-<n>/ for a torn journal record, crashed as tests/engine/crash.rs does). Images are stored once, xz-compressed and
# named by the SHA-256 of their bytes (DIR/images/<sha256>.img.xz); each case's `images`
# file names the image of each device file.
#
# Every run happens in the same directory, ROOT below, with NODE_NAME=fixture-node: the
# journal, owner.json, devices.json and the KMS's holder records carry ROOT in absolute paths
# and the holder id `fixture-node:ROOT/.keyplan`. The test restores a case into a directory of
# its own and replaces ROOT by that directory's path in every file but the images (the one
# edit it makes; see DIR/README.md).
#
# With --random N (scripts/upgrade-test.sh), each scenario is instead interrupted N times at
# random (seeded by S): at a random hit of a random point, or by SIGKILL after a random delay
# within the time an uninterrupted run takes;
# the cases (`<scenario>/random-<i>-<how>/`, same layout) go to DIR, which the test reads
# when KEYPLAN_UPGRADE_FIXTURES names it.
#
# Released fixtures are never edited or regenerated: a new previous release gets a directory
# of its own (DIR defaults to tests/fixtures/upgrade/<COMMIT>).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
export LC_ALL=C NO_COLOR=1 NODE_NAME=fixture-node

ROOT=/tmp/keyplan-upgrade-fixture.root
bin="" commit="" out="" random=0 seed=47
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$2"; shift 2 ;;
    --commit) commit="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --random) random="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$bin" ] && [ -x "$bin" ] || { echo "--bin names no executable keyplan: '$bin'" >&2; exit 2; }
[ -n "$commit" ] || { echo "--commit names the commit the binary was built from" >&2; exit 2; }
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${out:-$repo/tests/fixtures/upgrade/$commit}"
RANDOM="$seed"
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  echo "$out exists: released fixtures are never regenerated (remove it only if it was never committed)" >&2
  exit 1
fi
mkdir -p "$out/images"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"

# The points an interrupted run is saved at: after every durable journal record (every step
# boundary), and the instants inside a step that leave what no record says (a keyslot added
# or killed, a version written, an effect done, a torn record).
POINTS=(journal.after_append step.after_effect add.after_keyslot kill.after_keyslot
  kms.file.stage.after_material)
HITS=150 # more than any point has in a scenario
TORN=4   # torn records saved: the first ones (before any image changes)

PASS="initial passphrase"
luks2() { # FILE: small LUKS2 image, 128-bit key (64 KiB keyslots), room for 3 keyslots
  truncate -s 2M "$1"
  printf '%s' "$PASS" | cryptsetup luksFormat --batch-mode --type luks2 \
    --cipher aes-cbc-essiv:sha256 --key-size 128 --luks2-metadata-size 16k \
    --luks2-keyslots-size 192k --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --key-file=- "$1" >/dev/null 2>&1
}
luks1() { # FILE: small LUKS1 image, 128-bit key
  truncate -s 2M "$1"
  printf '%s' "$PASS" | cryptsetup luksFormat --batch-mode --type luks1 \
    --cipher aes-cbc-essiv:sha256 --key-size 128 --align-payload 8 \
    --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file=- "$1"
}

# plan KMS_ENTRIES KEYS DEVICES ITERATIONS: a plan file's text. KEYS: "k: {...};j: {...}";
# DEVICES: "a:k,j b:k".
plan() {
  local kms="$1" keys="$2" devices="$3" iter="$4" d id ks k
  printf 'version: 1\nkms:\n%bkeys:\n' "$kms"
  local IFS=';'
  for k in $keys; do printf '  %s\n' "$k"; done
  IFS=' '

  printf 'devices:\n'
  for d in $devices; do
    id="${d%%:*}"; ks="${d#*:}"
    printf '  %s:\n    path: %s.img\n    keys: [%s]\n    enroll_with: initial.pass\n' \
      "$id" "$id" "${ks//,/, }"
  done
  printf 'settings:\n  pbkdf: { type: pbkdf2, iterations: %s }\n  parallelism: 1\n' "$iter"
}
LOCAL='  local: { provider: file, path: keys }\n'
TWO='  old: { provider: file, path: keys-old }\n  new: { provider: file, path: keys-new }\n'

run_ok() { # ARGS...: the old keyplan in ROOT, must succeed
  (cd "$ROOT" && "$bin" "$@" >"$ROOT.log" 2>&1) || { cat "$ROOT.log" >&2; echo "setup run $* failed" >&2; exit 1; }
}

restore() { # GOLDEN: ROOT := GOLDEN
  rm -rf "$ROOT"; cp -a "$1" "$ROOT"
}

save_case() { # DIR: ROOT's state into DIR, images content-addressed
  local dir="$1" f sum
  mkdir -p "$dir"
  (cd "$ROOT" && tar -cf - --exclude='*.img' .) | (cd "$dir" && tar -xf -)
  # `.keyplan/` is in .gitignore: the state directory is kept as `state/`.
  [ ! -d "$dir/.keyplan" ] || mv "$dir/.keyplan" "$dir/state"
  : >"$dir/images"
  for f in "$ROOT"/*.img; do
    sum="$(sha256sum "$f" | cut -d' ' -f1)"
    [ -e "$out/images/$sum.img.xz" ] || xz -9 -T1 -c "$f" >"$out/images/$sum.img.xz"
    printf '%s %s\n' "$(basename "$f")" "$sum" >>"$dir/images"
  done
}

# matrix NAME ARGS: the interrupted runs of NAME; the setup is already in ROOT and its plan
# file holds the plan of the interrupted run.
#
# One run of the old keyplan is held at every hit of every point in turn (`return(wait:GATE)`
# of src/failpoint.rs, one gate file per hit: `1*return(wait:G.1)->1*return(wait:G.2)->...`),
# and ROOT is saved while it waits there: the state a SIGKILL at that instant leaves (the
# journal record is durable, the keyslot written), from one run, so the cases share their
# images. The held run's own lock file content is saved as it is (the flock dies with it).
# The torn records (`journal.torn_append`, which crashes at once) are runs of their own from
# the setup, for the first hits only (no image has changed yet).
matrix() {
  local name="$1" args="$2" golden gates point i fp="" chain pid marker gate
  local seq=0 code=0 argv
  golden="$(mktemp -d)"; cp -a "$ROOT" "$golden/root"
  gates="$(mktemp -d)"
  argv="$(printf '%s' "$args" | tr -d '",')"
  for point in "${POINTS[@]}"; do
    chain=""
    for i in $(seq 1 "$HITS"); do
      : >"$gates/$point.$i"
      chain="$chain${chain:+->}1*return(wait:$gates/$point.$i)"
    done
    fp="$fp${fp:+;}$point=$chain"
  done
  # shellcheck disable=SC2086 # ARGS is a word list
  (cd "$ROOT" && FAILPOINTS="$fp" exec "$bin" apply --auto-approve $argv) >"$ROOT.log" 2>&1 &
  pid=$!
  while :; do
    marker="$(ls "$gates"/*."$pid" 2>/dev/null | head -1 || true)"
    if [ -n "$marker" ]; then
      gate="${marker%."$pid"}"
      seq=$((seq + 1))
      save_case "$out/$name/$(printf '%03d' "$seq")-$(basename "$gate" | sed 's/\.\([0-9]*\)$/-\1/')"
      rm -f "$gate"
      while [ -e "$marker" ]; do sleep 0.01; done
      continue
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
  done
  wait "$pid" || code=$?
  if [ "$code" != 0 ]; then
    cat "$ROOT.log" >&2; echo "$name: the held run failed (exit $code)" >&2; exit 1
  fi
  for i in $(seq 1 "$TORN"); do
    restore "$golden/root"; code=0
    # shellcheck disable=SC2086
    { (cd "$ROOT" && FAILPOINTS="journal.torn_append=$((i - 1))*off->return" exec "$bin" \
      apply --auto-approve $argv >"$ROOT.log" 2>&1); } 2>/dev/null || code=$?
    if [ "$code" != 137 ] || ! grep -q "injected crash at journal.torn_append" "$ROOT.log"; then
      cat "$ROOT.log" >&2; echo "$name: torn append $i: exit $code" >&2; exit 1
    fi
    save_case "$out/$name/torn-$i"
  done
  rm -rf "$golden" "$gates"
  echo "$name: $seq held instants, $TORN torn records"
}

# random_cases NAME ARGS: RANDOM_N runs of NAME from its setup (in ROOT), each interrupted at
# random: a random hit of a random point, or SIGKILL after a random delay.
random_cases() {
  local name="$1" args="$2" golden i how code pid argv point hit ms
  golden="$(mktemp -d)"; cp -a "$ROOT" "$golden/root"
  argv="$(printf '%s' "$args" | tr -d '",')"
  # The SIGKILL delays fall within an uninterrupted run's time (ms), measured here.
  local t0 span
  t0="$(date +%s%N)"
  # shellcheck disable=SC2086
  (cd "$ROOT" && "$bin" apply --auto-approve $argv >"$ROOT.log" 2>&1) || { cat "$ROOT.log" >&2; exit 1; }
  span=$((($(date +%s%N) - t0) / 1000000 + 1))
  for i in $(seq 1 "$random"); do
    restore "$golden/root"; code=0
    if [ $((RANDOM % 2)) = 0 ]; then
      point="${POINTS[$((RANDOM % ${#POINTS[@]}))]}"; hit=$((RANDOM % 6))
      [ "$point" != journal.after_append ] || hit=$((RANDOM % 30))
      [ $((RANDOM % 4)) != 0 ] || { point=journal.torn_append; hit=$((RANDOM % 30)); }
      how="$point-$((hit + 1))"
      # shellcheck disable=SC2086
      { (cd "$ROOT" && FAILPOINTS="$point=${hit}*off->return" exec "$bin" apply \
        --auto-approve $argv >"$ROOT.log" 2>&1); } 2>/dev/null || code=$?
    else
      ms=$((RANDOM % span)); how="sigkill-${ms}ms"
      # shellcheck disable=SC2086
      (cd "$ROOT" && exec "$bin" apply --auto-approve $argv) >"$ROOT.log" 2>&1 &
      pid=$!
      sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
      kill -KILL "$pid" 2>/dev/null || true
      { wait "$pid"; } 2>/dev/null || code=$?
    fi
    case "$code" in
      0) how="$how-finished" ;; # the point has fewer hits, or the run ended before the kill
      137) ;;
      *) cat "$ROOT.log" >&2; echo "$name: random run $i ($how): exit $code" >&2; exit 1 ;;
    esac
    save_case "$out/$name/random-$(printf '%03d' "$i")-$how"
  done
  rm -rf "$golden"
  echo "$name: $random random interruptions (an uninterrupted run: $span ms)"
}

# scenario NAME ARGS DEVICES_JSON KMS BEFORE_JSON: the cases of NAME. scenario.json says what
# the test checks: the run's arguments, the devices with the keys the run's plan gives them
# (`devices`) and those they held before it (`before`), and the file KMS directory that holds
# the keys once the run is finished (`kms`).
scenario() {
  mkdir -p "$out/$1"
  printf '{\n  "scenario": "%s",\n  "args": [%s],\n  "devices": %s,\n  "before": %s,\n  "kms": "%s"\n}\n' \
    "$1" "$2" "$3" "$5" "$4" >"$out/$1/scenario.json"
  if [ "$random" -gt 0 ]; then random_cases "$1" "$2"; else matrix "$1" "$2"; fi
}

dev() { # ID LUKS KEYS...: one device of scenario.json
  local id="$1" luks="$2"; shift 2
  local keys=""; [ $# = 0 ] || keys="$(printf '"%s",' "$@")"
  printf '{"file": "%s.img", "luks": "%s", "keys": [%s]}' "$id" "$luks" "${keys%,}"
}

fresh() { # DEVICE:LUKS...
  local d
  rm -rf "$ROOT"; mkdir -p "$ROOT"
  printf '%s' "$PASS" >"$ROOT/initial.pass"
  for d in "$@"; do "${d#*:}" "$ROOT/${d%%:*}.img"; done
}
three="[$(dev a luks2 k), $(dev b luks2 k), $(dev c luks1 k)]"
two="[$(dev a luks2 k), $(dev b luks2 k)]"

# Rotation of a key shared by three devices (two LUKS2, one LUKS1), the second one: the
# interrupted run also retires v1.
fresh a:luks2 b:luks2 c:luks1
plan "$LOCAL" "k: { kms: local }" "a:k b:k c:k" 1000 >"$ROOT/keyplan.yaml"
run_ok apply --auto-approve
run_ok apply --auto-approve --rotate k
scenario rotation '"--rotate", "k"' "$three" keys "$three"

# Enrollment: a new device (b) gets the current version of k, a new key j is created and
# enrolled into a beside k.
fresh a:luks2 b:luks2
plan "$LOCAL" "k: { kms: local }" "a:k" 1000 >"$ROOT/keyplan.yaml"
run_ok apply --auto-approve
plan "$LOCAL" "k: { kms: local };j: { kms: local }" "a:k,j b:k" 1000 >"$ROOT/keyplan.yaml"
scenario enrollment '' "[$(dev a luks2 k j), $(dev b luks2 k)]" keys \
  "[$(dev a luks2 k), $(dev b luks2)]"

# Migration: k moves from the file KMS `old` to the file KMS `new`.
fresh a:luks2 b:luks2
plan "$TWO" "k: { kms: old }" "a:k b:k" 1000 >"$ROOT/keyplan.yaml"
run_ok apply --auto-approve
plan "$TWO" "k: { kms: new }" "a:k b:k" 1000 >"$ROOT/keyplan.yaml"
scenario migration '' "$two" keys-new "$two"

# PBKDF re-wrap: the plan's PBKDF2 iterations go from 1000 to 2000.
fresh a:luks2 b:luks2
plan "$LOCAL" "k: { kms: local }" "a:k b:k" 1000 >"$ROOT/keyplan.yaml"
run_ok apply --auto-approve
plan "$LOCAL" "k: { kms: local }" "a:k b:k" 2000 >"$ROOT/keyplan.yaml"
scenario pbkdf-rewrap '' "$two" keys "$two"

rm -rf "$ROOT" "$ROOT.log"
printf '%s\n' "$commit" >"$out/COMMIT"
du -sh "$out"
