#!/usr/bin/env bash
# The upgrade test (issue 47, docs/upgrading.md): opt-in, run before every release; its summary
# goes into the release notes.
#
#   scripts/upgrade-test.sh [--previous COMMIT]      (default c322096)
#
# Builds the previous release from COMMIT in a git worktree (target/upgrade/prev-COMMIT, with
# `--features failpoints`) and this checkout's keyplan, then runs:
#   (a) interrupted runs: the old keyplan interrupted at random moments (a random hit of a
#       random injection point, or SIGKILL after a random delay; UPGRADE_ITERATIONS per
#       scenario, default 8, seeded by UPGRADE_SEED, default 47) in a rotation, an
#       enrollment, a migration and a PBKDF re-wrap (scripts/make-upgrade-fixtures.sh
#       --random), each finished by the new keyplan and checked as the committed upgrade
#       fixtures are (tests/engine/upgrade.rs: I1 as left, end state, journal);
#   (b) saved plans: `plan -o` by the old keyplan (a rotation, a migration), `apply FILE` by
#       the new one: refused (the message is shown), or applied: then the device opens with
#       the key's current version in its KMS, the next plan is the one that follows the same
#       plan saved by the new keyplan, and one more apply converges;
#   (c) the mixed-version fleet: tests/fleet/mixed_version.rs with KEYPLAN_PREVIOUS_BIN set to
#       the old keyplan, on the real control plane (scripts/test-env.sh).
# UPGRADE_PARTS (default "a b c") runs only the parts it lists. Prints a summary table; exits
# non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
previous=c322096
while [ $# -gt 0 ]; do
  case "$1" in
    --previous) previous="$2"; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
export PATH="$PATH:/usr/sbin:/sbin" NO_COLOR=1
iterations="${UPGRADE_ITERATIONS:-8}"
parts="${UPGRADE_PARTS:-a b c}"
part() { case " $parts " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
seed="${UPGRADE_SEED:-47}"
work="$PWD/target/upgrade"
mkdir -p "$work"
commit="$(git rev-parse --short=7 "$previous^{commit}")" || { echo "no commit $previous" >&2; exit 2; }
current="$(git rev-parse --short=7 HEAD)$(git diff --quiet HEAD || echo '+changes')"
rows=()
failed=0
row() { # NAME RESULT DETAIL
  rows+=("$(printf '| %s | %s | %s |' "$1" "$2" "$3")")
  [ "$2" = pass ] || failed=1
}

# The previous release, in a worktree of its own, with its own target directory.
prev="$work/prev-$commit"
if [ ! -d "$prev" ]; then
  git worktree add --detach "$prev" "$commit" >/dev/null || exit 1
  # A warm start: this checkout's dependencies, built already (cargo rebuilds what differs).
  [ ! -d target/debug ] || { mkdir -p "$prev/target" && cp -a target/debug "$prev/target/"; }
fi
echo "== building the previous release $commit (failpoints) in $prev"
(cd "$prev" && cargo build --quiet --features failpoints --bin keyplan) || exit 1
old="$prev/target/debug/keyplan"
echo "== building this keyplan ($current)"
cargo build --quiet --features failpoints --bin keyplan || exit 1
new="$PWD/target/debug/keyplan"

# (a) Interrupted runs.
if part a; then
echo "== (a) $commit interrupted at random ($iterations per scenario, seed $seed), finished by $current"
rand="$work/random-$commit-$seed"
rm -rf "$rand"
if scripts/make-upgrade-fixtures.sh --bin "$old" --commit "$commit" --out "$rand/$commit" \
    --random "$iterations" --seed "$seed" 2> >(grep -v WARNING >&2); then
  for sc in rotation enrollment migration pbkdf-rewrap; do
    n="$(find "$rand/$commit/$sc" -mindepth 1 -maxdepth 1 -type d | wc -l)"
    kinds="$(find "$rand/$commit/$sc" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' \
      | sed -E 's/^random-[0-9]+-//; s/.*-finished$/ended before the interruption/; s/-[0-9]+(ms)?$//' \
      | sort | uniq -c | awk '{n=$1; $1=""; printf "%s%s x%s", sep, substr($0, 2), n; sep=", "}')"
    test="upgrade_finishes_interrupted_${sc//-/_}"
    if KEYPLAN_UPGRADE_FIXTURES="$rand" cargo test --quiet --features failpoints --test engine \
        "upgrade::$test" -- --exact >"$work/$sc.log" 2>&1; then
      row "interrupted $sc" pass "$n runs by $commit finished by $current ($kinds)"
    else
      tail -30 "$work/$sc.log"
      row "interrupted $sc" FAIL "see $work/$sc.log"
    fi
  done
else
  row "interrupted runs" FAIL "the old keyplan's runs could not be made"
fi
fi

# (b) Saved plans.
echo "== (b) saved plans made by $commit, applied by $current"
# saved_run MAKER FROM TO ARGS...: a device enrolled into KMS FROM by MAKER, the plan moved
# to KMS TO, `plan ARGS -o saved.json` by MAKER, `apply saved.json` by the new keyplan. Prints
# the directory; $d/apply.out, $d/apply.rc and $d/next-plan (the new keyplan's plan after
# it, the directory's name replaced by DIR) tell what happened.
saved_run() {
  local maker="$1" from="$2" to="$3" d; shift 3
  d="$(mktemp -d)"
  printf 'initial passphrase' >"$d/initial.pass"
  truncate -s 2M "$d/a.img"
  printf 'initial passphrase' | cryptsetup luksFormat --batch-mode --type luks2 \
    --luks2-metadata-size 16k --luks2-keyslots-size 192k --cipher aes-cbc-essiv:sha256 \
    --key-size 128 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file=- "$d/a.img" >/dev/null 2>&1
  planfile() { printf 'version: 1\nkms:\n  old: { provider: file, path: keys-old }\n  new: { provider: file, path: keys-new }\nkeys:\n  k: { kms: %s }\ndevices:\n  a: { path: a.img, keys: [k], enroll_with: initial.pass }\nsettings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }\n' "$1" >"$d/keyplan.yaml"; }
  planfile "$from"
  (cd "$d" && "$maker" apply --auto-approve >/dev/null 2>&1 && { planfile "$to"; "$maker" plan "$@" -o saved.json >/dev/null 2>&1; }) || echo "setup" >"$d/apply.rc"
  [ -e "$d/apply.rc" ] && { echo "$d"; return; }
  local code=0
  (cd "$d" && "$new" apply saved.json >"$d/apply.out" 2>&1) || code=$?
  echo "$code" >"$d/apply.rc"
  (cd "$d" && "$new" plan 2>&1 | sed "s|$d|DIR|g" | grep -v '^$' >"$d/next-plan")
  echo "$d"
}

# saved_plan NAME FROM TO ARGS...: a plan saved by the old keyplan, applied by the new one;
# compared with the same made by the new keyplan (its own saved plan: the baseline).
saved_plan() {
  local name="$1" from="$2" to="$3" d base rc v note; shift 3
  d="$(saved_run "$old" "$from" "$to" "$@")"
  base="$(saved_run "$new" "$from" "$to" "$@")"
  rc="$(cat "$d/apply.rc")"
  if [ "$rc" = setup ]; then row "saved plan: $name" FAIL "setup or plan -o by $commit failed ($d)"; return; fi
  if [ "$rc" != 0 ]; then
    row "saved plan: $name" pass "refused by $current (exit $rc): $(grep -m1 -i 'error' "$d/apply.out" | cut -c1-160)"
    return
  fi
  v="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["current"])' "$d/keys-$to/k/meta.json")"
  if ! cryptsetup open --test-passphrase --key-file="$d/keys-$to/k/v$v.key" "$d/a.img" \
      || { [ "$from" != "$to" ] && [ -e "$d/keys-$from/k/v1.key" ]; }; then
    row "saved plan: $name" FAIL "applied, but the device does not open with k v$v of KMS $to, or KMS $from kept material ($d)"
    return
  fi
  if ! cmp -s "$d/next-plan" "$base/next-plan"; then
    diff "$base/next-plan" "$d/next-plan"
    row "saved plan: $name" FAIL "applied, but the next plan differs from the one after $current's own saved plan ($d, $base)"
    return
  fi
  note="next plan: no changes"
  grep -q "No changes" "$d/next-plan" || note="next plan as after $current's own saved plan: $(grep -m1 '^  [~+-]' "$d/next-plan" | sed 's/^ *//' | cut -c1-90)..."
  (cd "$d" && "$new" apply --auto-approve >/dev/null 2>&1 && "$new" plan --detailed-exitcode >/dev/null 2>&1) \
    || { row "saved plan: $name" FAIL "a second apply does not converge ($d)"; return; }
  row "saved plan: $name" pass "applied by $current: k v$v in KMS $to opens the device; $note"
}
if part b; then
saved_plan "rotation (--rotate k)" old old --rotate k
saved_plan "migration (old -> new KMS)" old new
fi

# (c) The mixed-version fleet.
if part c; then
echo "== (c) the mixed-version fleet ($commit and $current agents)"
# shellcheck disable=SC1091 # the control plane and servers the fleet tests use
source scripts/test-env.sh >"$work/test-env.log" 2>&1
if KEYPLAN_PREVIOUS_BIN="$old" cargo test --quiet --features failpoints --test fleet \
    mixed_version -- --nocapture >"$work/fleet.log" 2>&1 && grep -q "^mixed fleet:" "$work/fleet.log"; then
  row "mixed-version fleet" pass "$(grep '^mixed fleet:' "$work/fleet.log" | tail -1 | cut -c14-)"
else
  tail -40 "$work/fleet.log"
  row "mixed-version fleet" FAIL "see $work/fleet.log"
fi
fi

echo
echo "Upgrade test: previous release $commit -> $current ($(date -u +%Y-%m-%dT%H:%MZ))"
echo
echo "| check | result | detail |"
echo "|---|---|---|"
printf '%s\n' "${rows[@]}"
exit "$failed"
