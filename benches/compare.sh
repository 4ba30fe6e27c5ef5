#!/usr/bin/env bash
# keyplan vs Rook's rotation sequence vs Ansible's community.crypto.luks_device: what rotating
# one key shared by N LUKS2 devices costs each, with the same PBKDF parameters for everyone;
# plus how long `keyplan plan` takes on 10, 100 and 1,000 unchanged devices.
# Method and results: docs/performance.md. A benchmark, not a test: it prints numbers, and
# fails only when a tool gets the rotation wrong (new key must open every device, old key none).
#
# Usage: benches/compare.sh [options]
#   --devices N            devices sharing the rotated key (default 4; env BENCH_DEVICES)
#   --memory KIB           argon2id memory cost (default 262144; env BENCH_PBKDF_MEMORY)
#   --parallel P           argon2id threads (default 1; env BENCH_PBKDF_PARALLEL)
#   --iterations I         argon2id iterations, forced (default 4; env BENCH_PBKDF_ITERATIONS)
#   --iter-time MS         instead of forced iterations, a time target for everyone (cryptsetup
#                          --iter-time; keyplan iter_time_ms; Ansible iteration_time): each tool
#                          benchmarks as it does, as Rook does in production (env BENCH_PBKDF_ITER_TIME)
#   --plan-sizes "A B ..." device counts for the plan timing (default "10 100 1000"; env BENCH_PLAN_SIZES)
#   --skip-rook, --skip-ansible, --skip-plan, --skip-count, --skip-budget
#                          leave a part out (--skip-count: the pass that counts PBKDF runs with
#                          cryptsetup --debug; --skip-budget: keyplan's rotation with parallelism 2
#                          under a memory budget that holds one PBKDF run)
#   --out FILE             also write the Markdown results to FILE
#   --keep                 keep the scratch directory (printed) instead of removing it
#
# Binary: $KEYPLAN if set, else `cargo build --release --locked` here and target/release/keyplan.
# Needs: cryptsetup (2.4+), python3, and for Ansible losetup and loop devices (the module
# refuses image files) plus PyPI access on the first run: ansible is installed into a venv in
# ${XDG_CACHE_HOME:-$HOME/.cache}/keyplan-bench/venv (env BENCH_VENV) when missing.
# Run as root (cryptsetup on images needs no root, losetup does).
set -euo pipefail
{ # the whole script is read before it runs, so editing it during a run cannot break the run
export PATH="$PATH:/usr/sbin:/sbin"
export LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")

devices=${BENCH_DEVICES:-4}
mem=${BENCH_PBKDF_MEMORY:-262144}
par=${BENCH_PBKDF_PARALLEL:-1}
iters=${BENCH_PBKDF_ITERATIONS:-4}
iter_time=${BENCH_PBKDF_ITER_TIME:-}
plan_sizes=${BENCH_PLAN_SIZES:-"10 100 1000"}
venv=${BENCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/keyplan-bench/venv}
skip_rook=0 skip_ansible=0 skip_plan=0 skip_count=0 skip_budget=0 keep=0 out=""

die() { echo "compare.sh: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }
while (($#)); do
  case $1 in
    --devices) devices=${2:?}; shift ;;
    --memory) mem=${2:?}; shift ;;
    --parallel) par=${2:?}; shift ;;
    --iterations) iters=${2:?}; shift ;;
    --iter-time) iter_time=${2:?}; shift ;;
    --plan-sizes) plan_sizes=${2?}; shift ;;
    --skip-rook) skip_rook=1 ;;
    --skip-ansible) skip_ansible=1 ;;
    --skip-plan) skip_plan=1 ;;
    --skip-count) skip_count=1 ;;
    --skip-budget) skip_budget=1 ;;
    --out) out=${2:?}; shift ;;
    --keep) keep=1 ;;
    -h | --help) usage 0 ;;
    *) echo "compare.sh: unknown option $1" >&2; usage 2 >&2 ;;
  esac
  shift
done
for v in devices mem par iters; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "--${v/mem/memory}: a positive integer is needed, got '${!v}'"
done
[[ -z $iter_time || $iter_time =~ ^[1-9][0-9]*$ ]] || die "--iter-time: a positive integer (ms) is needed, got '$iter_time'"
for n in $plan_sizes; do
  [[ $n =~ ^[1-9][0-9]*$ && $n -le 1000 ]] || die "--plan-sizes: integers 1-1000 are needed, got '$n'"
done
[[ -n ${plan_sizes//[[:space:]]/} ]] || skip_plan=1
command -v cryptsetup >/dev/null || die "cryptsetup not found (looked in PATH, /usr/sbin, /sbin)"
command -v python3 >/dev/null || die "python3 not found"
[[ -z $out ]] || out=$(realpath -m "$out")

if [[ -z ${KEYPLAN:-} ]]; then
  echo "== building keyplan (cargo build --release --locked)"
  (cd "$repo" && cargo build --release --locked --quiet) || die "cargo build failed"
  KEYPLAN=$repo/target/release/keyplan
fi
[[ -x $KEYPLAN ]] || die "KEYPLAN=$KEYPLAN is not an executable"
KEYPLAN=$(realpath "$KEYPLAN")

work=$(mktemp -d "${TMPDIR:-/tmp}/keyplan-bench.XXXXXX")
loops=()
# shellcheck disable=SC2329 # run by the EXIT trap
cleanup() {
  local l
  for l in ${loops[@]+"${loops[@]}"}; do losetup -d "$l" 2>/dev/null || true; done
  if ((keep)); then echo "scratch directory kept: $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
results=$work/results.jsonl
python3 - "$devices" "$mem" "$par" "$iters" "$(cryptsetup --version)" "$("$KEYPLAN" --version | cut -d' ' -f2)" "${iter_time:-0}" >"$results" <<'PY2'
import json, os, sys, time
devices, mem, par, iters, cs, kp, iter_time = sys.argv[1:]
info = dict(l.split(":", 1) for l in open("/proc/meminfo"))
gib = lambda k: round(int(info[k].split()[0]) / 1048576, 1)
print(json.dumps({"kind": "meta", "label": "meta", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    "nproc": os.cpu_count(), "mem_total_gib": gib("MemTotal"), "mem_available_gib": gib("MemAvailable"),
    "load_start": open("/proc/loadavg").read().split()[0], "cryptsetup": cs, "keyplan": kp,
    "devices": int(devices), "memory_kib": int(mem), "parallel": int(par), "iterations": int(iters),
    "iter_time_ms": int(iter_time)}))
PY2
measure=$here/measure.py

if [[ -n $iter_time ]]; then
  # Time-target mode: every tool asks for the same argon2id memory, threads and unlock time,
  # and each decides how to meet it (cryptsetup benchmarks on each luksAddKey; keyplan once
  # per run). This is how Rook runs: it passes no PBKDF options at all.
  pbkdf_args="--pbkdf argon2id --pbkdf-memory $mem --pbkdf-parallel $par --iter-time $iter_time"
  kdf_yaml="iter_time_ms: $iter_time"
  kdf_desc="iter-time $iter_time ms (each tool benchmarks as it does)"
else
  pbkdf_args="--pbkdf argon2id --pbkdf-memory $mem --pbkdf-parallel $par --pbkdf-force-iterations $iters"
  kdf_yaml="iterations: $iters"
  kdf_desc="iterations $iters"
fi
fast_args="--pbkdf pbkdf2 --pbkdf-force-iterations 1000"
real_cryptsetup=$(command -v cryptsetup)
cs_version=$(cryptsetup --version)
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $cs_version, keyplan $("$KEYPLAN" --version | cut -d' ' -f2)"
echo "== PBKDF for everyone: argon2id, memory $mem KiB, parallel $par, $kdf_desc; $devices devices per set"

# ---------------------------------------------------------------- helpers
newkey() { head -c 32 /dev/urandom | base64 -w0; }
initial=$(newkey)
printf '%s' "$initial" >"$work/initial.pass" # keyplan's enroll_with needs a file

# record LABEL KIND JSON_FROM_MEASURE [extra JSON fields...]: append a result line
record() {
  python3 - "$@" >>"$results" <<'PY'
import json, sys
label, kind, measured = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
measured.update(label=label, kind=kind)
for extra in sys.argv[4:]:
    k, v = extra.split("=", 1)
    measured[k] = json.loads(v)
print(json.dumps(measured))
PY
}

# run_measured LABEL LOG CMD...: run CMD under measure.py, fail loudly if it failed; prints JSON
run_measured() {
  local label=$1 log=$2 json
  shift 2
  json=$(python3 "$measure" "$label" "$log" -- "$@")
  if [[ $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["rc"])' "$json") != 0 ]]; then
    echo "---- $log" >&2
    tail -n 40 "$log" >&2
    die "$label failed (log above)"
  fi
  printf '%s\n' "$json"
}

# make_set DIR PBKDF_ARGS: N LUKS2 images whose keyslot 0 holds $initial. One image is
# formatted; the others are copies given fresh UUIDs (cheap, and identical but for the UUID).
make_set() {
  local dir=$1 args=$2 i
  mkdir -p "$dir"
  truncate -s 24M "$dir/d1.img"
  # shellcheck disable=SC2086
  printf '%s' "$initial" | cryptsetup luksFormat --batch-mode --type luks2 $args --key-file=- "$dir/d1.img"
  for ((i = 2; i <= devices; i++)); do
    cp --sparse=always "$dir/d1.img" "$dir/d$i.img"
    cryptsetup luksUUID --batch-mode --uuid "$(cat /proc/sys/kernel/random/uuid)" "$dir/d$i.img"
  done
}

opens() { # KEY DEVICE: does KEY open DEVICE (any keyslot)?
  printf '%s' "$1" | cryptsetup open --test-passphrase --key-file=- "$2" 2>/dev/null
}
keyslot_count() {
  cryptsetup luksDump --dump-json-metadata "$1" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["keyslots"]))'
}
# check_rotated TOOL NEW OLD DEVICE...: the new key opens each device, the old one does not,
# and exactly one keyslot is left
check_rotated() {
  local tool=$1 new=$2 old=$3 dev
  shift 3
  [[ -n $new && $new != "$old" ]] || die "$tool: the store does not hold a new key"
  for dev in "$@"; do
    opens "$new" "$dev" || die "$tool: the new key does not open $dev"
    ! opens "$old" "$dev" || die "$tool: the old key still opens $dev"
    [[ $(keyslot_count "$dev") == 1 ]] || die "$tool: $dev has $(keyslot_count "$dev") keyslots, expected 1"
  done
}

set_devices() { local i; for ((i = 1; i <= devices; i++)); do printf '%s\n' "$1/d$i.img"; done; }

# ---------------------------------------------------------------- keyplan
# keyplan_plan DIR KIND(argon|fast): plan file sharing key k over the set's devices
keyplan_plan() {
  local dir=$1 kind=$2 i
  {
    echo "version: 1"
    echo "kms: { local: { provider: file, path: keys } }"
    echo "keys: { k: { kms: local } }"
    echo "devices:"
    for ((i = 1; i <= devices; i++)); do
      echo "  d$i: { path: d$i.img, keys: [k], enroll_with: $work/initial.pass, unmanaged_keyslots: remove }"
    done
    echo "settings:"
    if [[ $kind == argon ]]; then
      echo "  pbkdf: { type: argon2id, memory_kib: $mem, parallel: $par, $kdf_yaml }"
    else
      echo "  pbkdf: { type: pbkdf2, iterations: 1000 }"
    fi
    echo "  parallelism: 2"
  } >"$dir/keyplan.yaml"
}

# keyplan_prepare DIR KIND: devices, plan, enrollment (not measured: every device then holds
# key k v1 in one keyslot, the initial passphrase's keyslot removed)
keyplan_prepare() {
  local dir=$1 kind=$2
  make_set "$dir" "$([[ $kind == argon ]] && echo "$pbkdf_args" || echo "$fast_args")"
  keyplan_plan "$dir" "$kind"
  "$KEYPLAN" apply -f "$dir/keyplan.yaml" --auto-approve --color never >"$dir/enroll.log" 2>&1 ||
    { tail -n 40 "$dir/enroll.log" >&2; die "keyplan enrollment failed ($dir)"; }
}

keyplan_key() { "$KEYPLAN" key get -f "$1/keyplan.yaml" -q k; }

keyplan_counted_runs() { # LOG: "(S steps, R PBKDF runs)" -> R
  grep -o '[0-9]* PBKDF runs' "$1" | tail -n 1 | cut -d' ' -f1
}

# bench_keyplan PARALLELISM [BUDGET_KIB]: enroll a fresh set, then the measured rotation; with
# BUDGET_KIB, settings.memory_budget_kib is set to it for the rotation
bench_keyplan() {
  local p=$1 budget=${2:-} dir=$work/keyplan-p$1${2:+-budget} old new json runs label
  label="keyplan, parallelism $p${budget:+, memory_budget_kib $budget}"
  echo "== $label: enrolling (not measured)"
  keyplan_prepare "$dir" argon
  if [[ -n $budget ]]; then
    echo "  memory_budget_kib: $budget" >>"$dir/keyplan.yaml"
    if ! "$KEYPLAN" validate -f "$dir/keyplan.yaml" --color never >"$dir/validate.log" 2>&1; then
      echo "   (skipped: this keyplan does not accept settings.memory_budget_kib)"
      return 0
    fi
  fi
  old=$(keyplan_key "$dir")
  unit_sample
  echo "== $label: rotating"
  json=$(run_measured "keyplan-p$p" "$dir/rotate.log" "$KEYPLAN" apply -f "$dir/keyplan.yaml" \
    --auto-approve --rotate k --parallelism "$p" --color never)
  runs=$(keyplan_counted_runs "$dir/rotate.log")
  new=$(keyplan_key "$dir")
  # shellcheck disable=SC2046
  check_rotated "keyplan" "$new" "$old" $(set_devices "$dir")
  record "$label" rotation "$json" "self_counted=${runs:-null}" "budget_kib=${budget:-null}"
}

# ---------------------------------------------------------------- Rook
bench_rook() {
  local dir=$work/rook json new
  echo "== Rook sequence: preparing"
  make_set "$dir" "$pbkdf_args"
  printf '%s' "$initial" >"$dir/store"
  unit_sample
  echo "== Rook sequence: rotating"
  # shellcheck disable=SC2046
  json=$(run_measured rook "$dir/rotate.log" env PBKDF_ARGS="$pbkdf_args" "$here/rook_sequence.sh" "$dir/store" $(set_devices "$dir"))
  new=$(cat "$dir/store")
  # shellcheck disable=SC2046
  check_rotated "Rook sequence" "$new" "$initial" $(set_devices "$dir")
  record "Rook sequence (shell)" rotation "$json"
}

# ---------------------------------------------------------------- Ansible
ansible_install() {
  if [[ -x $venv/bin/ansible-playbook ]] && compgen -G "$venv/lib/python3*/site-packages/ansible_collections/community/crypto/plugins/modules/luks_device.py" >/dev/null; then
    return 0
  fi
  echo "== installing ansible (PyPI) into $venv"
  mkdir -p "$(dirname "$venv")"
  if ! { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet ansible; }; then
    die "could not install ansible into $venv"
  fi
}

# ansible_playbook FILE MODULE(luks|noop): two tasks over all devices, one play on localhost
ansible_playbook() {
  local task1 task2
  if [[ $2 == luks ]]; then
    task1='community.crypto.luks_device:
        device: "{{ item.dev }}"
        state: present
        passphrase: "{{ item.old }}"
        new_passphrase: "{{ item.new }}"
        pbkdf: "{{ pbkdf }}"'
    task2='community.crypto.luks_device:
        device: "{{ item.dev }}"
        state: present
        remove_passphrase: "{{ item.old }}"'
  else
    task1='ansible.builtin.stat:
        path: "{{ item.dev }}"'
    task2=$task1
  fi
  cat >"$1" <<EOF
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  tasks:
    - name: add the new passphrase (unlock with the old one)
      $task1
      loop: "{{ luks }}"
      no_log: true
    - name: remove the old passphrase
      $task2
      loop: "{{ luks }}"
      no_log: true
EOF
}

# ansible_vars FILE DIR KIND: per device its loop device, old and new passphrase (the new ones
# are the "store" the check reads back), and the module's pbkdf option
ansible_vars() {
  local file=$1 dir=$2 kind=$3 i dev
  : >"$dir/devs"
  for ((i = 1; i <= devices; i++)); do
    dev=$(losetup --find --show "$dir/d$i.img") || die "losetup failed for $dir/d$i.img (the Ansible module needs block devices)"
    loops+=("$dev")
    printf '%s %s\n' "$dev" "$(newkey)" >>"$dir/devs"
  done
  python3 - "$file" "$kind" "$initial" "$mem" "$par" "$iters" "$dir/devs" "${iter_time:-0}" <<'PY'
import json, sys
file, kind, old, mem, par, iters, devs, iter_time = sys.argv[1:]
if kind == "argon" and int(iter_time):
    pbkdf = {"algorithm": "argon2id", "memory": int(mem), "parallel": int(par), "iteration_time": int(iter_time) / 1000}
elif kind == "argon":
    pbkdf = {"algorithm": "argon2id", "memory": int(mem), "parallel": int(par), "iteration_count": int(iters)}
else:
    pbkdf = {"algorithm": "pbkdf2", "iteration_count": 1000}
luks = [{"dev": d, "old": old, "new": n} for d, n in (l.split() for l in open(devs))]
json.dump({"luks": luks, "pbkdf": pbkdf}, open(file, "w"))
PY
}

# ansible-playbook with its state kept in the scratch directory, quiet, colourless
# shellcheck disable=SC2054 # "localhost," is one argument (an inventory of one host)
ansible_cmd=(env LC_ALL=C.UTF-8 LANG=C.UTF-8 ANSIBLE_HOME="$work/ansible-home" ANSIBLE_LOCAL_TEMP="$work/ansible-home/tmp"
  ANSIBLE_NOCOLOR=1 ANSIBLE_LOCALHOST_WARNING=false ANSIBLE_INVENTORY_UNPARSED_WARNING=false
  ANSIBLE_RETRY_FILES_ENABLED=false ANSIBLE_CONFIG="$work/ansible.cfg" "$venv/bin/ansible-playbook" -i localhost,)

ansible_check() { # DIR VARS
  local dir=$1 vars=$2 dev new
  while read -r dev new; do
    [[ $(python3 -c 'import json,sys; print(next(x["new"] for x in json.load(open(sys.argv[1]))["luks"] if x["dev"] == sys.argv[2]))' "$vars" "$dev") == "$new" ]] ||
      die "Ansible: the vars file does not hold the new passphrase of $dev"
    check_rotated "Ansible luks_device" "$new" "$initial" "$dev"
  done <"$dir/devs"
}

ansible_detach() { # DIR
  local dev rest
  while read -r dev rest; do losetup -d "$dev" || true; done <"$1/devs"
}

bench_ansible() {
  local dir=$work/ansible json
  ansible_install
  : >"$work/ansible.cfg" # no user or system configuration
  echo "== Ansible luks_device: preparing (images on loop devices)"
  make_set "$dir" "$pbkdf_args"
  ansible_vars "$dir/vars.json" "$dir" argon
  ansible_playbook "$dir/noop.yml" noop
  ansible_playbook "$dir/rotate.yml" luks
  unit_sample
  echo "== Ansible: the same playbook with a no-op module (harness overhead)"
  json=$(run_measured ansible-noop "$dir/noop.log" "${ansible_cmd[@]}" -e "@$dir/vars.json" "$dir/noop.yml")
  record "Ansible harness alone (stat instead of luks_device)" overhead "$json"
  echo "== Ansible luks_device: rotating"
  json=$(run_measured ansible "$dir/rotate.log" "${ansible_cmd[@]}" -e "@$dir/vars.json" "$dir/rotate.yml")
  ansible_check "$dir" "$dir/vars.json"
  ansible_detach "$dir"
  record "Ansible luks_device" rotation "$json"
}

# ---------------------------------------------------------------- PBKDF unit
# One PBKDF run = `cryptsetup open --test-passphrase --key-slot 0` on a device formatted with
# the same parameters. Sampled 3 times at the start and once more next to each measured tool,
# so that the unit sees the same machine load as the tools (argon2id is memory-bound: other
# work on the machine slows it down); the report uses the median of all samples.
unit_prepare() {
  mkdir -p "$work/unit"
  truncate -s 24M "$work/unit/u.img"
  # shellcheck disable=SC2086
  printf '%s' "$initial" | cryptsetup luksFormat --batch-mode --type luks2 $pbkdf_args --key-file=- "$work/unit/u.img"
}
unit_sample() {
  local json
  json=$(run_measured unit "$work/unit/unit.log" cryptsetup open --test-passphrase --key-slot 0 --key-file "$work/initial.pass" "$work/unit/u.img")
  record "one PBKDF run" unit "$json"
}
bench_unit() {
  echo "== one PBKDF run: cryptsetup open --test-passphrase --key-slot 0 (3 times, then once next to each tool)"
  unit_prepare
  unit_sample
  unit_sample
  unit_sample
}

# ---------------------------------------------------------------- counting pass
# Each tool again on small pbkdf2 devices, with a cryptsetup that runs with --debug and counts
# the key derivations and PBKDF benchmarks cryptsetup itself reports. Fast, and independent of
# the tools' own claims. The counts do not depend on the PBKDF type (none of these tools
# benchmarks when given explicit parameters).
bench_count() {
  local dir=$work/count shim=$work/count/bin old new cf
  echo "== counting pass (cryptsetup --debug, pbkdf2 devices)"
  mkdir -p "$shim"
  # keyplan runs cryptsetup with a cleared environment: the shim carries its settings itself
  cf=$dir/current.count
  printf '#!/bin/sh\nexec env CRYPTSETUP_REAL=%q COUNT_FILE=%q %q "$@"\n' \
    "$real_cryptsetup" "$cf" "$here/cryptsetup_counting.sh" >"$shim/cryptsetup"
  chmod +x "$shim/cryptsetup"
  count_env() { : >"$cf"; env PATH="$shim:$PATH" KEYPLAN_CRYPTSETUP="$shim/cryptsetup" "$@"; }
  count_of() { grep -c "^$2\$" "$cf" || true; }

  keyplan_prepare "$dir/keyplan" fast
  old=$(keyplan_key "$dir/keyplan")
  count_env "$KEYPLAN" apply -f "$dir/keyplan/keyplan.yaml" --auto-approve --rotate k --parallelism 2 --color never >"$dir/keyplan.log" 2>&1 ||
    { tail -n 40 "$dir/keyplan.log" >&2; die "keyplan failed in the counting pass"; }
  # shellcheck disable=SC2046
  check_rotated "keyplan (counting pass)" "$(keyplan_key "$dir/keyplan")" "$old" $(set_devices "$dir/keyplan")
  record "keyplan" count '{}' "devices=$devices" "derive=$(count_of "$cf" derive)" "benchmark=$(count_of "$cf" benchmark)"

  if ((!skip_rook)); then
    make_set "$dir/rook" "$fast_args"
    printf '%s' "$initial" >"$dir/rook/store"
    # shellcheck disable=SC2046
    count_env env PBKDF_ARGS="$fast_args" "$here/rook_sequence.sh" "$dir/rook/store" $(set_devices "$dir/rook") >"$dir/rook.log" 2>&1 ||
      { tail -n 40 "$dir/rook.log" >&2; die "Rook sequence failed in the counting pass"; }
    # shellcheck disable=SC2046
    check_rotated "Rook sequence (counting pass)" "$(cat "$dir/rook/store")" "$initial" $(set_devices "$dir/rook")
    record "Rook sequence (shell)" count '{}' "devices=$devices" "derive=$(count_of "$cf" derive)" "benchmark=$(count_of "$cf" benchmark)"
    # Rook as shipped: no PBKDF options, so cryptsetup benchmarks on every luksAddKey (and
    # derives with what it measured: up to 1 GiB and 2 s per run), so one device is enough
    make_set "$dir/rook-default" "$fast_args"
    printf '%s' "$initial" >"$dir/rook-default/store"
    # shellcheck disable=SC2046
    count_env env PBKDF_ARGS="" "$here/rook_sequence.sh" "$dir/rook-default/store" "$dir/rook-default/d1.img" >"$dir/rook-default.log" 2>&1 ||
      { tail -n 40 "$dir/rook-default.log" >&2; die "Rook sequence (default PBKDF) failed in the counting pass"; }
    record "Rook sequence, cryptsetup's default PBKDF (as shipped)" count '{}' "devices=1" "derive=$(count_of "$cf" derive)" "benchmark=$(count_of "$cf" benchmark)"
  fi

  if ((!skip_ansible)); then
    make_set "$dir/ansible" "$fast_args"
    ansible_vars "$dir/ansible/vars.json" "$dir/ansible" fast
    ansible_playbook "$dir/ansible/rotate.yml" luks
    count_env "${ansible_cmd[@]}" -e "@$dir/ansible/vars.json" "$dir/ansible/rotate.yml" >"$dir/ansible.log" 2>&1 ||
      { tail -n 40 "$dir/ansible.log" >&2; die "Ansible failed in the counting pass"; }
    ansible_check "$dir/ansible" "$dir/ansible/vars.json"
    ansible_detach "$dir/ansible"
    record "Ansible luks_device" count '{}' "devices=$devices" "derive=$(count_of "$cf" derive)" "benchmark=$(count_of "$cf" benchmark)"
  fi
  rm -rf "$dir"
}

# ---------------------------------------------------------------- plan scaling
bench_plan() {
  local dir=$work/plan max=0 n i json
  for n in $plan_sizes; do ((n > max)) && max=$n; done
  echo "== plan scaling: formatting $max small LUKS2 images (pbkdf2, 1000 iterations; 2 at a time)"
  mkdir -p "$dir"
  for ((i = 1; i <= max; i++)); do truncate -s 2M "$dir/p$i.img"; done
  # The smallest areas cryptsetup accepts that hold two keyslots of a 512-bit key.
  # shellcheck disable=SC2016
  seq 1 "$max" | xargs -P2 -n 25 sh -c 'for i; do
      cryptsetup luksFormat --batch-mode --type luks2 --luks2-metadata-size 16k --luks2-keyslots-size 1m \
        --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file "$0/initial.pass" "$0/plan/p$i.img" \
        >>"$0/plan/format-$$.log" 2>&1 || exit 255
    done' "$work" || { cat "$dir"/format-*.log >&2; die "formatting the plan-scaling images failed"; }
  # One plan and state directory per size: a state directory's registry (devices.json) names
  # every device a run touched, and plan reads all of them, so the smaller plans get fresh
  # state directories (no registry: exactly their own devices are known).
  for n in $plan_sizes $max; do
    {
      echo "version: 1"
      echo "state_dir: state-$n"
      echo "kms: { local: { provider: file, path: keys } }"
      echo "keys: { k: { kms: local } }"
      echo "devices:"
      for ((i = 1; i <= n; i++)); do
        echo "  p$i: { path: p$i.img, keys: [k], enroll_with: $work/initial.pass }"
      done
      echo "settings:"
      echo "  pbkdf: { type: pbkdf2, iterations: 1000 }"
      echo "  parallelism: 2"
    } >"$dir/plan-$n.yaml"
  done
  echo "== plan scaling: enrolling $max devices with one apply"
  json=$(run_measured enroll "$dir/enroll.log" "$KEYPLAN" apply -f "$dir/plan-$max.yaml" --auto-approve --color never)
  record "keyplan apply enrolling $max devices (pbkdf2, parallelism 2)" enroll "$json" "devices=$max"
  for n in $plan_sizes; do
    echo "== plan scaling: keyplan plan on $n devices (3 runs)"
    for _ in 1 2 3; do
      json=$(run_measured "plan-$n" "$dir/plan-$n.log" "$KEYPLAN" plan -f "$dir/plan-$n.yaml" --detailed-exitcode --color never)
      grep -q 'No changes' "$dir/plan-$n.log" || die "keyplan plan on $n devices does not say 'No changes' (see $dir/plan-$n.log)"
      record "keyplan plan" plan "$json" "devices=$n" "registry=$n"
    done
  done
  # shellcheck disable=SC2086 # one size per word
  n=$(printf '%s\n' $plan_sizes | sort -n | head -n 1)
  if ((n < max)); then
    echo "== plan scaling: keyplan plan on $n devices, state directory knowing all $max (1 run)"
    json=$(run_measured "plan-$n-registry" "$dir/plan-$n.log" "$KEYPLAN" plan -f "$dir/plan-$n.yaml" \
      --state-dir "$dir/state-$max" --detailed-exitcode --color never)
    grep -q 'No changes' "$dir/plan-$n.log" || die "keyplan plan on $n devices (registry of $max) does not say 'No changes'"
    record "keyplan plan" plan "$json" "devices=$n" "registry=$max"
  fi
  rm -rf "$dir"
}

# ---------------------------------------------------------------- run
bench_unit
bench_keyplan 1
bench_keyplan 2
# A budget that holds one PBKDF run (memory cost + 16 MiB for cryptsetup) but not two: parallelism
# 2 must then run one derivation at a time
((skip_budget)) || bench_keyplan 2 $(((mem + 16384) * 3 / 2))
((skip_rook)) || bench_rook
((skip_ansible)) || bench_ansible
unit_sample
((skip_count)) || bench_count
((skip_plan)) || bench_plan

python3 "$here/report.py" "$results" >"$work/report.md"
echo
cat "$work/report.md"
if [[ -n $out ]]; then cp "$work/report.md" "$out" && echo "(written to $out)"; fi
exit
}
