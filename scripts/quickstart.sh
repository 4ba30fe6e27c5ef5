#!/usr/bin/env bash
# keyplan quickstart: installs what is missing, builds keyplan, and runs the bundled example
# end to end on LUKS image files in a scratch directory: validate, plan, apply, a rotation,
# verify, and the result checked with cryptsetup itself.
#
# Usage: scripts/quickstart.sh [SCRATCH_DIR]     (default: ./scratch/quickstart, recreated)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
scratch=${1:-$root/scratch/quickstart}

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

if ! command -v cryptsetup >/dev/null 2>&1 && [ ! -x /usr/sbin/cryptsetup ] && [ ! -x /sbin/cryptsetup ]; then
  say "installing cryptsetup-bin"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq cryptsetup-bin xz-utils >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq cryptsetup-bin xz-utils >/dev/null; fi
fi
export PATH="$PATH:/usr/sbin:/sbin"

say "building keyplan (cargo build --release)"
cargo build --release --locked --quiet
# cargo puts the binary under CARGO_TARGET_DIR when set (relative to where cargo ran: $root).
target_dir=${CARGO_TARGET_DIR:-$root/target}
case $target_dir in /*) ;; *) target_dir="$root/$target_dir" ;; esac
kp="$target_dir/release/keyplan"

say "creating LUKS image files in $scratch"
rm -rf "$scratch"
mkdir -p "$scratch"
cp examples/quickstart/keyplan.yaml "$scratch/"
cd "$scratch"
printf 'correct horse battery staple' > initial.pass
chmod 600 initial.pass
for d in osd0-block osd0-db osd0-wal; do
  truncate -s 24M "$d.img"
  cryptsetup luksFormat --batch-mode --type luks2 --pbkdf argon2id --pbkdf-memory 65536 \
    --pbkdf-parallel 2 --pbkdf-force-iterations 4 --key-file initial.pass "$d.img"
done
truncate -s 8M legacy-luks1.img
cryptsetup luksFormat --batch-mode --type luks1 --iter-time 100 --key-file initial.pass legacy-luks1.img
ls -l *.img

say "keyplan validate"
"$kp" validate
say "keyplan plan   (read-only: shows what apply would do)"
"$kp" plan
say "keyplan apply --auto-approve"
"$kp" apply --auto-approve
say "keyplan plan --detailed-exitcode   (0 = nothing left to do)"
"$kp" plan --detailed-exitcode
say "keyplan apply --rotate osd-kek --auto-approve   (two-phase rotation of the shared key)"
old=$("$kp" key get osd-kek | sha256sum | cut -c1-16)
"$kp" apply --auto-approve --rotate osd-kek
new=$("$kp" key get osd-kek | sha256sum | cut -c1-16)
echo "osd-kek fingerprint (sha256 of the passphrase, first 16 hex): before $old, after $new"
say "keyplan verify   (every key's current version opens a bound keyslot)"
"$kp" verify

say "checking with cryptsetup itself"
# After one rotation the old version v1 is kept in the KMS as "previous" (so it can be shown
# to open nothing); the next rotation destroys it.
"$kp" key get osd-kek --version 1 > /dev/null || { echo "  cannot read osd-kek v1"; exit 1; }
for d in osd0-block osd0-db osd0-wal; do
  "$kp" key get osd-kek | cryptsetup open --test-passphrase --key-file=- "$d.img" \
    && echo "  $d.img: opens with osd-kek v2 (current)"
  if "$kp" key get osd-kek --version 1 | cryptsetup open --test-passphrase --key-file=- "$d.img" 2>/dev/null; then
    echo "  $d.img: STILL OPENS WITH THE OLD VERSION v1"; exit 1
  fi
  echo "  $d.img: osd-kek v1 (previous) no longer opens it"
  cryptsetup open --test-passphrase --key-file initial.pass "$d.img" \
    && echo "  $d.img: initial.pass still opens it (unmanaged_keyslots: keep, the default)"
done
"$kp" key get legacy-kek | cryptsetup open --test-passphrase --key-file=- legacy-luks1.img \
  && echo "  legacy-luks1.img: opens with legacy-kek (pinned keyslot 3)"
if cryptsetup open --test-passphrase --key-file initial.pass legacy-luks1.img 2>/dev/null; then
  echo "  legacy-luks1.img: initial passphrase still opens it"; exit 1
fi
echo "  legacy-luks1.img: initial passphrase removed (unmanaged_keyslots: remove)"

say "keyplan journal (last lines)"
"$kp" journal | tail -n 8
say "done: the scratch directory is $scratch (keys in ./keys, journal in ./.keyplan)"
