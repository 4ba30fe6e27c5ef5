#!/usr/bin/env bash
# A `cryptsetup` that counts, for benches/compare.sh's counting pass: runs the real cryptsetup
# (CRYPTSETUP_REAL), with --debug for the actions that can derive a key, appends one line per
# key derivation ("derive") and per PBKDF benchmark ("benchmark") that cryptsetup reports to
# COUNT_FILE, and passes every other stdout line through unchanged. stdin, stderr and inherited descriptors (keyplan's fd 3) are the
# caller's. cryptsetup prints its debug lines, and only those, with a leading "# ".
set -uo pipefail
: "${CRYPTSETUP_REAL:?}" "${COUNT_FILE:?}"
# --debug only for the actions that can run a PBKDF: the others' output is parsed by callers
# (luksDump JSON), and --debug appends its lines to it without a newline in between.
debug=()
for arg in "$@"; do
  case $arg in
    luksAddKey | luksKillSlot | luksRemoveKey | luksChangeKey | luksFormat | open | luksOpen)
      debug=(--debug)
      break
      ;;
  esac
done
((${#debug[@]})) || exec "$CRYPTSETUP_REAL" "$@"
"$CRYPTSETUP_REAL" "${debug[@]}" "$@" | while IFS= read -r line || [[ -n $line ]]; do
  case $line in
    "# Running keyslot key derivation."*) echo derive >>"$COUNT_FILE" ;;
    "# Running "*"() benchmark."*) echo benchmark >>"$COUNT_FILE" ;;
    "# "*) ;;
    *) printf '%s\n' "$line" ;;
  esac
done
exit "${PIPESTATUS[0]}"
