#!/usr/bin/env bash
# Rook's documented OSD key-encryption-key rotation, reimplemented from its description for
# benches/compare.sh (not Rook's code): one key shared by the devices of one OSD, stored in
# STORE (a file standing in for the Kubernetes Secret or Vault entry).
#
#   1. read the current key K1 from the store
#   2. every device: put K1 into keyslot 1 (luksAddKey, unlocking with K1 without naming a
#      keyslot; if keyslot 1 is already occupied: keep it when K1 opens it, else kill it first)
#   3. generate K2; every device: kill keyslot 0 (luksKillSlot, given K1: cryptsetup verifies
#      it against another keyslot), then add K2 into keyslot 0 (luksAddKey unlocking with K1)
#   4. write K2 to the store, read it back and compare
#   5. every device: kill keyslot 1 (luksKillSlot, given K2)
#
# Sources: Rook's design doc design/ceph/key-encryption-key-rotation.md (the step table) and
# its OSD key rotation (pkg/daemon/ceph/osd/key_rotation.go: steps 2, 3 and 5 each loop over
# the devices, in this order; kills are given a passphrase, see rook/rook PR 14367).
#
# Usage: PBKDF_ARGS="--pbkdf argon2id --pbkdf-memory 262144 ..." rook_sequence.sh STORE DEVICE...
# PBKDF_ARGS: cryptsetup options for new keyslots. Real Rook passes none, so cryptsetup also
# benchmarks the PBKDF on each luksAddKey; the benchmark passes explicit ones so that every
# tool derives keyslots with the same cost (this understates Rook).
# Keys go to cryptsetup through pipes (process substitution), never through argv or files.
set -euo pipefail
store=$1
shift
read -r -a pbkdf <<<"${PBKDF_ARGS:-}"

k1=$(cat "$store")
[[ -n $k1 ]] || { echo "rook_sequence.sh: store $store is empty" >&2; exit 1; }

slot_used() { # DEVICE SLOT: is the keyslot occupied? (header read, no PBKDF)
  cryptsetup luksDump --dump-json-metadata "$1" |
    python3 -c 'import json,sys; sys.exit(0 if sys.argv[1] in json.load(sys.stdin)["keyslots"] else 1)' "$2"
}

add_key() { # DEVICE UNLOCK_KEY NEW_KEY SLOT
  local dev=$1 unlock=$2 new=$3 slot=$4
  if slot_used "$dev" "$slot"; then
    if cryptsetup open --test-passphrase --key-slot "$slot" --key-file <(printf '%s' "$new") "$dev" 2>/dev/null; then
      return 0
    fi
    cryptsetup luksKillSlot --key-file <(printf '%s' "$unlock") "$dev" "$slot"
  fi
  # -S/--key-slot without --new-key-slot names the keyslot to create (the form that works on
  # every cryptsetup 2.x); the unlocking keyslot is not named, so cryptsetup tries them in turn.
  cryptsetup luksAddKey --batch-mode "${pbkdf[@]}" --key-slot "$slot" \
    --key-file <(printf '%s' "$unlock") "$dev" <(printf '%s' "$new")
}

for dev in "$@"; do
  add_key "$dev" "$k1" "$k1" 1
done

k2=$(head -c 32 /dev/urandom | base64 -w0)
for dev in "$@"; do
  if slot_used "$dev" 0; then
    cryptsetup luksKillSlot --key-file <(printf '%s' "$k1") "$dev" 0
  fi
  add_key "$dev" "$k1" "$k2" 0
done

tmp=$(mktemp "$store.XXXXXX")
printf '%s' "$k2" >"$tmp"
mv "$tmp" "$store"
[[ $(cat "$store") == "$k2" ]] || { echo "rook_sequence.sh: store $store does not hold the new key" >&2; exit 1; }

for dev in "$@"; do
  cryptsetup luksKillSlot --key-file <(printf '%s' "$k2") "$dev" 1
done
