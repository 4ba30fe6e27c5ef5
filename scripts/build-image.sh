#!/usr/bin/env bash
# Builds the keyplan image without a container engine or a registry, and smoke-tests it.
#
#   1. debootstrap: a minimal Debian 12 root filesystem (`--variant=minbase`, slimmed as the
#      registry's debian:bookworm-slim is), cached as a tar under ~/.cache/keyplan/image/;
#   2. base import: that tar committed as the local image localhost/keyplan-base:bookworm;
#   3. release build: `cargo build --release --locked` on the host (CARGO_TARGET_DIR honoured);
#   4. image build: `buildah bud --target prebuilt` of deploy/Containerfile (its runtime stage,
#      with the host's binary instead of the rust builder stage) on that base;
#   5. smoke test: in a container of the image (`buildah run --isolation chroot`):
#      `keyplan --version`, `cryptsetup --version`, and `keyplan plan` of a one-key plan (file
#      KMS) on a LUKS2 image file made here with the host's cryptsetup.
#
# Everything goes through buildah (Debian's package) with the vfs storage driver in a store of
# its own (~/.cache/keyplan/image/storage), and chroot isolation: no daemon, no overlay
# mounts, no user namespaces, no registry. Needs root (debootstrap, cryptsetup, chroot).
#
# Usage: scripts/build-image.sh [--tag NAME] [--push DEST] [--binary FILE] [--label KEY=VALUE]...
#                               [--digestfile FILE] [--refresh-base]
#   --tag NAME      the image's name (default localhost/keyplan:<version in Cargo.toml>)
#   --binary FILE   put FILE in the image as /usr/local/bin/keyplan instead of building one
#                   (scripts/release.sh passes its stripped release binary, so the image holds
#                   the very binary the release ships)
#   --label K=V     one more label on the image, besides org.opencontainers.image.version and
#                   .revision set here and .title, .description, .licenses in deploy/Containerfile
#   --digestfile F  with --push, write the digest of the pushed manifest (sha256:...) to F
#   --push DEST     after the smoke test, `buildah push` the image to DEST, any destination
#                   buildah takes: docker://registry.example.com/storage/keyplan:1.0.0 (log in
#                   first with `buildah login registry.example.com`), oci-archive:FILE,
#                   docker-archive:FILE (for `docker load`)
#   --refresh-base  debootstrap again (the cached base has the packages of the day it was made;
#                   the image's own packages are installed fresh at every build)
# Environment: KEYPLAN_IMAGE_CACHE (default ~/.cache/keyplan/image), DEBIAN_MIRROR (default
# http://deb.debian.org/debian), CARGO_TARGET_DIR.
#
# Prints each phase's time, the image's size, and "smoke:" lines (tests/engine/image.rs reads them).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
tag=localhost/keyplan:$version
push=
refresh=0
binary=
labels=()
digestfile=
while [ $# -gt 0 ]; do
  case $1 in
    --tag) tag=$2; shift 2 ;;
    --push) push=$2; shift 2 ;;
    --binary) binary=$(realpath "$2"); shift 2 ;;
    --label) labels+=(--label "$2"); shift 2 ;;
    --digestfile) digestfile=$2; shift 2 ;;
    --refresh-base) refresh=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 64 ;;
  esac
done

say() { printf '\n==> %s\n' "$*"; }
now() { date +%s.%N; }
timings=()
# `phase NAME START [NOTE]`: records how long NAME took since START.
phase() {
  local secs
  secs=$(awk -v a="$2" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  timings+=("$(printf '%-14s %7ss%s' "$1" "$secs" "${3:+  ($3)}")")
  echo "time: $1 ${secs}s${3:+ ($3)}"
}

if [ "$(id -u)" != 0 ]; then
  echo "scripts/build-image.sh needs root (debootstrap, cryptsetup, buildah's chroot isolation)" >&2
  exit 1
fi
export PATH="$PATH:/usr/sbin:/sbin"

missing=()
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v cryptsetup >/dev/null 2>&1 || missing+=(cryptsetup-bin)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  t=$(now)
  apt-get update -qq
  # With recommends: buildah's include netavark, the network backend it looks for (without it,
  # a store first used with netavark fails: 'could not find "netavark"').
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  phase "apt install" "$t" "${missing[*]}"
fi

cache=${KEYPLAN_IMAGE_CACHE:-${HOME:-/root}/.cache/keyplan/image}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
base_tar=$cache/bookworm-minbase.tar
base_image=localhost/keyplan-base:bookworm
mkdir -p "$cache"
# A store of our own, vfs: plain directory copies, which work anywhere (no overlay mounts, no
# fuse-overlayfs), and it cannot clash with the driver of a podman store in the default place.
# The run root (locks, mount records) is state of this boot: under /run.
bh() {
  buildah --root "$cache/storage" --runroot /run/keyplan-image-buildah --storage-driver vfs "$@"
}

# One run at a time (the rootfs, the store); and the containers of a run that was killed go.
exec 9> "$cache/lock"
flock 9
for c in $(bh containers --format '{{.ContainerName}}' 2>/dev/null \
  | grep -E '^keyplan-(smoke|base-import)-[0-9]+$' || true); do
  bh rm "$c" >/dev/null
done

# --- 1. debootstrap ---------------------------------------------------------------------
[ "$refresh" = 1 ] && rm -f "$base_tar"
t=$(now)
if [ -s "$base_tar" ]; then
  phase debootstrap "$t" "cached: $base_tar"
else
  say "debootstrap --variant=minbase bookworm ($mirror)"
  rootfs=$cache/rootfs.tmp
  rm -rf "$rootfs"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" > "$cache/debootstrap.log" 2>&1 || {
    tail -n 30 "$cache/debootstrap.log" >&2
    exit 1
  }
  # As debian:bookworm-slim (debuerreotype's slimify): no docs but the copyright files, no man
  # pages, no locales, not now and not for packages installed later; updates and security
  # updates in the sources; no package cache or lists in the image.
  cat > "$rootfs/etc/dpkg/dpkg.cfg.d/keyplan-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "${rootfs:?}"/usr/share/{man,groff,info,lintian,linda,locale}/*
  rm -f "$rootfs/etc/apt/sources.list"
  cat > "$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "${rootfs:?}"/var/cache/apt/archives/*.deb "${rootfs:?}"/var/cache/apt/*.bin \
    "${rootfs:?}"/var/lib/apt/lists/* "${rootfs:?}"/var/log/* "${rootfs:?}"/tmp/* \
    "${rootfs:?}"/run/* "${rootfs:?}"/dev/* "${rootfs:?}"/proc/* "${rootfs:?}"/sys/*
  # The container engine provides /etc/hostname, /etc/hosts, /etc/resolv.conf.
  rm -f "$rootfs/etc/hostname" "$rootfs/etc/resolv.conf"
  tar --numeric-owner --xattrs --xattrs-include='*' -C "$rootfs" -cf "$base_tar.tmp" .
  mv "$base_tar.tmp" "$base_tar"
  rm -rf "$rootfs"
  phase debootstrap "$t" "$(du -m "$base_tar" | cut -f1) MiB tar"
fi

# --- 2. base import ---------------------------------------------------------------------
# The tar becomes a one-layer image. Buildah 1.28 has no `import` command, so: a working
# container from scratch, mounted (vfs: a plain directory), the tar extracted into it with
# numeric owners, modes and xattrs as debootstrap left them (setuid bits and the shadow group
# survive), committed. Imported again when the tar changed (its hash is a label of the image).
t=$(now)
base_sum=$(sha256sum "$base_tar" | cut -c1-64)
have_sum=$(bh inspect --type image --format '{{index .OCIv1.Config.Labels "keyplan.base.sha256"}}' \
  "$base_image" 2>/dev/null || true)
if [ "$have_sum" = "$base_sum" ]; then
  phase "base import" "$t" "cached: $base_image"
else
  say "importing the root filesystem as $base_image"
  ctr=$(bh from --name keyplan-base-import-$$ scratch)
  mnt=$(bh mount "$ctr")
  tar --numeric-owner --xattrs --xattrs-include='*' -C "$mnt" -xpf "$base_tar"
  bh umount "$ctr" >/dev/null
  # What debian:bookworm-slim sets.
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd bash --label keyplan.base.sha256="$base_sum" "$ctr"
  bh commit --quiet --rm "$ctr" "$base_image" >/dev/null
  phase "base import" "$t"
fi

# --- 3. release build -------------------------------------------------------------------
t=$(now)
if [ -n "$binary" ]; then
  [ -x "$binary" ] || { echo "--binary $binary: not an executable file" >&2; exit 1; }
  phase "release build" "$t" "given: $binary"
else
  say "cargo build --release --locked"
  # Run from `cargo test` (tests/engine/image.rs), the environment holds the test's CARGO_PKG_*,
  # CARGO_MANIFEST_DIR and the like; build scripts that watch them (ring's) would make every
  # nested build a rebuild of half the release tree.
  for v in $(compgen -e | grep -E '^(CARGO_(PKG|MANIFEST|CRATE|BIN|PRIMARY|TARGET_TMPDIR)|OUT_DIR$)' || true); do
    unset "$v"
  done
  cargo build --release --locked
  # cargo puts the binary under CARGO_TARGET_DIR when set (relative to where cargo ran: $root).
  target_dir=${CARGO_TARGET_DIR:-$root/target}
  case $target_dir in /*) ;; *) target_dir="$root/$target_dir" ;; esac
  binary=$target_dir/release/keyplan
  phase "release build" "$t"
fi
codename=$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release 2>/dev/null || true)
if [ "$codename" != bookworm ]; then
  echo "warning: this host is not Debian 12 (bookworm): a binary built here may need a newer glibc than the image's (Debian 12)" >&2
fi

work=$(mktemp -d)
ctr=
cleanup() {
  [ -n "$ctr" ] && bh rm "$ctr" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

# --- 4. image build ---------------------------------------------------------------------
say "buildah bud --target prebuilt -f deploy/Containerfile -t $tag"
t=$(now)
mkdir "$work/context"
install -m 0755 "$binary" "$work/context/keyplan"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
bh bud --isolation chroot --pull=never --target prebuilt \
  --build-arg BASE="$base_image" \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.revision="$revision" \
  "${labels[@]}" \
  -f "$root/deploy/Containerfile" -t "$tag" "$work/context"
phase "image build" "$t"

# --- 5. smoke test ----------------------------------------------------------------------
# A 16 MiB LUKS2 image file (fast PBKDF2, tests only; a 4 MiB keyslot area, so that the
# header leaves room for data) opening with a passphrase given on stdin, the same passphrase
# in initial.pass for the plan's enroll_with, an empty file KMS directory, and a plan that
# enrolls one new key: `keyplan plan` inside the image reads the header with the image's
# cryptsetup and must say it would add the key to the device.
say "smoke test in a container of $tag"
t=$(now)
smoke=$work/smoke
mkdir -m 0700 "$smoke" "$smoke/keys" "$smoke/out"
printf '%s' 'keyplan smoke test passphrase' > "$smoke/initial.pass"
chmod 600 "$smoke/initial.pass"
truncate -s 16M "$smoke/disk.img"
cryptsetup luksFormat --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 -q \
  --luks2-keyslots-size 4m --key-file - "$smoke/disk.img" < "$smoke/initial.pass"
cat > "$smoke/keyplan.yaml" <<'EOF'
version: 1
kms:
  local: { provider: file, path: keys }
keys:
  smoke-key: { kms: local }
devices:
  smoke-disk:
    path: disk.img
    keys: [smoke-key]
    enroll_with: initial.pass
settings:
  pbkdf: { type: pbkdf2, iterations: 1000 }
EOF
ctr=$(bh from --pull=never --name "keyplan-smoke-$$" "$tag")
entrypoint=$(bh inspect --format '{{.OCIv1.Config.Entrypoint}}' "$ctr")
echo "smoke: entrypoint: $entrypoint"
[ "$entrypoint" = "[/usr/local/bin/keyplan]" ] || { echo "smoke: FAILED: entrypoint" >&2; exit 1; }
# The commands write their output and exit status to files in the mounted directory: buildah
# 1.28's `run --isolation chroot` now and then returns a command's stdout empty (about once in
# 200 runs here), which a smoke test should not fail on.
# shellcheck disable=SC2016 # expanded by the sh in the container
bh run --isolation chroot -e NO_COLOR=1 -v "$smoke:/smoke" --workingdir /smoke "$ctr" -- sh -c '
  run() { name=$1; shift; "$@" > "out/$name" 2>&1; echo $? > "out/$name.rc"; }
  run version keyplan --version
  run cryptsetup cryptsetup --version
  run plan keyplan plan --detailed-exitcode'
# `check NAME DESCRIPTION CODES`: prints what NAME printed and its exit status, which must be
# one of CODES.
check() {
  local rc
  rc=$(cat "$smoke/out/$1.rc" 2>/dev/null || echo missing)
  if [ "$1" = plan ]; then
    sed 's/^/smoke: plan | /' "$smoke/out/plan"
  else
    echo "smoke: $2: $(cat "$smoke/out/$1")"
  fi
  echo "smoke: $2: exit $rc"
  case " $3 " in
    *" $rc "*) ;;
    *) echo "smoke: FAILED: $2 exited $rc" >&2; exit 1 ;;
  esac
}
check version "keyplan --version" 0
check cryptsetup "cryptsetup --version" 0
# 2: there are changes (the key is enrolled by `apply`); 0 would be nothing to do.
check plan "keyplan plan --detailed-exitcode" "0 2"
for word in smoke-disk smoke-key; do
  if ! grep -q -- "$word" "$smoke/out/plan"; then
    echo "smoke: FAILED: the plan does not name $word" >&2
    exit 1
  fi
done
bh rm "$ctr" >/dev/null
ctr=
phase "smoke test" "$t"
echo "smoke: passed"

# --- size, push ---------------------------------------------------------------------------
size=$(bh images --format '{{.Size}}' "$tag" | head -n1)
base_size=$(bh images --format '{{.Size}}' "$base_image" | head -n1)
bin_size=$(awk -v b="$(stat -c %s "$work/context/keyplan")" 'BEGIN { printf "%.1f MB", b / 1e6 }')
# What a registry stores and a node pulls: the layers gzip-compressed, as `buildah push` sends
# them (an OCI layout written to a temp directory).
bh push --quiet "$tag" "oci:$work/oci:$version" >/dev/null
compressed=$(du -sb "$work/oci" | awk '{ printf "%.1f MB", $1 / 1e6 }')
if [ -n "$push" ]; then
  say "buildah push $tag $push"
  t=$(now)
  bh push ${digestfile:+--digestfile "$digestfile"} "$tag" "$push"
  phase push "$t" "$push"
fi

# The images this tag had before (vfs keeps a full copy of each).
bh rmi --prune >/dev/null 2>&1 || true

say "done: $tag"
printf '%s\n' "${timings[@]}"
echo "image: $tag: $size (base $base_size, keyplan binary $bin_size), $compressed compressed"
echo "push it (log in first: buildah login REGISTRY):"
echo "  buildah --root $cache/storage --runroot /run/keyplan-image-buildah --storage-driver vfs push $tag docker://REGISTRY/keyplan:$version"
