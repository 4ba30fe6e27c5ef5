#!/usr/bin/env bash
# Makes what a user installs, in one release directory (docs/releasing.md, "Release procedure"):
#
#   keyplan-<version>-<target>         the release binary (`cargo build --release --locked`,
#                                      stripped), for this host's target
#   keyplan-<version>-image.oci.tar    the container image (scripts/build-image.sh: buildah,
#                                      deploy/Containerfile's runtime stage with that binary),
#                                      with OCI labels, as an OCI archive
#   keyplan-<version>.cdx.json         the SBOM of the Rust dependencies (CycloneDX, by
#                                      cargo-cyclonedx)
#   keyplan-<version>-src.tar.gz       the source at the release's commit (`git archive`)
#   deploy/kubernetes/                 the kustomize base with the image pinned by digest
#                                      (`image: <repo>@sha256:...`)
#   systemd/                           the systemd units of examples/systemd/
#   version.json                       `keyplan version --json` of the binary
#   upgrade-test.txt                   the upgrade test's result, when given
#   RELEASE_NOTES.md                   version, commit, formats written and read, the upgrade
#                                      test's result, this release's CHANGELOG.md section, the
#                                      files and their SHA-256
#   SHA256SUMS                         `sha256sum -c SHA256SUMS` checks every file above
#
# Usage: scripts/release.sh [--out DIR] [--upgrade-result FILE] [--image-repo REPO]
#                           [--source URL] [--allow-dirty]
#   --out DIR              the release directory (default dist/keyplan-<version>/, gitignored);
#                          it must not exist yet
#   --upgrade-result FILE  the result file of scripts/upgrade-test.sh, run before the release
#                          (copied, and quoted in the release notes; without it the notes say
#                          the upgrade test was not run)
#   --image-repo REPO      the repository the image will be pushed to, which the manifests name
#                          (default registry.example.com/storage/keyplan). The digest stays
#                          the same when the archive is copied with its layers as they are:
#                          `skopeo copy --preserve-digests oci-archive:FILE docker://REPO:TAG`
#   --source URL           the org.opencontainers.image.source label (default: the URL of the
#                          git remote `origin`; without either the label is left out, with a
#                          warning)
#   --allow-dirty          release from a work tree whose tracked files differ from HEAD (for a
#                          trial; the binary then says `-dirty` and the notes say so)
#
# Needs root and Debian's buildah and debootstrap (scripts/build-image.sh installs them), and
# cargo-cyclonedx for the SBOM, installed once with:
#   cargo install cargo-cyclonedx --locked
# It is not installed by this script: it is a build of a tool from crates.io that a release
# manager chooses to trust, and the script stops before building anything when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
out=
upgrade_result=
image_repo=registry.example.com/storage/keyplan
source_url=
allow_dirty=0
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --upgrade-result) upgrade_result=$(realpath "$2"); shift 2 ;;
    --image-repo) image_repo=$2; shift 2 ;;
    --source) source_url=$2; shift 2 ;;
    --allow-dirty) allow_dirty=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 64 ;;
  esac
done
out=${out:-dist/keyplan-$version}

say() { printf '\n==> %s\n' "$*"; }
die() { echo "release: $*" >&2; exit 1; }

# --- preconditions, before anything is built ----------------------------------------------
[ "$(id -u)" = 0 ] || die "needs root (scripts/build-image.sh: debootstrap, buildah's chroot isolation)"
cargo cyclonedx --version >/dev/null 2>&1 \
  || die "cargo-cyclonedx is missing (the SBOM): install it with 'cargo install cargo-cyclonedx --locked', then run this again"
for tool in git sha256sum strip rustc; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing"
done
[ -e "$out" ] && die "$out exists: remove it, or name another directory with --out"
[ -z "$upgrade_result" ] || [ -s "$upgrade_result" ] \
  || die "--upgrade-result $upgrade_result: no such file, or empty"
commit=$(git rev-parse HEAD) || die "not a git work tree: a release is made from a commit"
dirty=$(git status --porcelain --untracked-files=no)
if [ -n "$dirty" ]; then
  [ "$allow_dirty" = 1 ] || die "the work tree differs from $commit (git status); commit first, or pass --allow-dirty for a trial"
  echo "warning: releasing from a dirty work tree:" >&2
  echo "$dirty" >&2
fi
if [ -z "$source_url" ]; then
  source_url=$(git remote get-url origin 2>/dev/null || true)
fi
target=$(rustc -vV | sed -n 's/^host: //p')
# What a published release needs and a trial may lack: said again at the end.
notes=()
[ -n "$upgrade_result" ] || notes+=("the upgrade test's result is not in the release notes (--upgrade-result FILE)")
grep -q "^## \[$version\] - [0-9]" CHANGELOG.md \
  || notes+=("CHANGELOG.md has no dated section '## [$version] - YYYY-MM-DD'")
[ "$(git tag --points-at HEAD --list "v$version")" = "v$version" ] \
  || notes+=("HEAD is not tagged v$version")
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
mkdir -p "$out"
out=$(realpath "$out")
name=keyplan-$version

# --- 1. the binary ------------------------------------------------------------------------
say "cargo build --release --locked"
cargo build --release --locked
target_dir=${CARGO_TARGET_DIR:-$root/target}
case $target_dir in /*) ;; *) target_dir="$root/$target_dir" ;; esac
bin=$out/$name-$target
install -m 0755 "$target_dir/release/keyplan" "$bin"
strip "$bin"
"$bin" version --json > "$out/version.json"
built=$(sed -n 's/^  "commit": "\(.*\)",$/\1/p' "$out/version.json")
[ "$built" = "$commit" ] || die "the binary says it was built from '$built', not $commit"
grep -q '^  "version": "'"$version"'",$' "$out/version.json" \
  || die "the binary's version is not $version: $(head -c 300 "$out/version.json")"

# --- 2. the image -------------------------------------------------------------------------
say "the image (scripts/build-image.sh)"
tag=localhost/keyplan:$version
labels=(--label "org.opencontainers.image.created=$created"
  --label "org.opencontainers.image.title=keyplan"
  --label "org.opencontainers.image.licenses=Apache-2.0")
if [ -n "$source_url" ]; then
  labels+=(--label "org.opencontainers.image.source=$source_url")
else
  echo "warning: no --source and no git remote 'origin': the image has no org.opencontainers.image.source label" >&2
fi
image=$out/$name-image.oci.tar
scripts/build-image.sh --tag "$tag" --binary "$bin" "${labels[@]}" \
  --push "oci-archive:$image:$tag" --digestfile "$out/.image-digest"
digest=$(cat "$out/.image-digest")
rm -f "$out/.image-digest"
case $digest in sha256:*) ;; *) die "no image digest from buildah push: '$digest'" ;; esac

# --- 3. the SBOM --------------------------------------------------------------------------
say "SBOM (cargo cyclonedx)"
# Every dependency of the release build, direct and indirect, build scripts' included; no
# dev-dependencies; default features; this target. CycloneDX 1.5.
# cargo-cyclonedx writes <name>.cdx.json beside Cargo.toml.
cargo cyclonedx --format json --spec-version 1.5 --all --target "$target" --override-filename "$name.cdx"
mv "$root/$name.cdx.json" "$out/$name.cdx.json"

# --- 4. the source ------------------------------------------------------------------------
git archive --format=tar.gz --prefix="$name/" -o "$out/$name-src.tar.gz" "$commit"

# --- 5. the manifests, pinned by digest ---------------------------------------------------
say "deploy manifests pinned to $image_repo@$digest"
mkdir -p "$out/deploy" "$out/systemd"
cp -r deploy/kubernetes "$out/deploy/"
cp examples/systemd/*.service examples/systemd/*.timer "$out/systemd/"
# Every container image line of the base and its components.
while IFS= read -r file; do
  sed -i -E "s|^([[:space:]]*image:[[:space:]]*)keyplan:[^[:space:]]+|\1$image_repo@$digest|" "$file"
done < <(grep -rl --include='*.yaml' -E '^[[:space:]]*image:' "$out/deploy")
unpinned=$(grep -rn --include='*.yaml' -E '^[[:space:]]*image:' "$out/deploy" | grep -v "@$digest" || true)
[ -z "$unpinned" ] || die "image references not pinned by digest: $unpinned"

# --- 6. release notes ---------------------------------------------------------------------
say "release notes"
[ -n "$upgrade_result" ] && cp "$upgrade_result" "$out/upgrade-test.txt"
changes=$(awk -v v="$version" '
  $0 ~ "^## \\[" v "\\]" { on = 1; next }
  on && /^## \[/ { exit }
  on { print }' CHANGELOG.md)
{
  echo "# keyplan $version"
  echo
  echo "- Commit: \`$commit\`$([ -n "$dirty" ] && echo ' (built from a work tree with uncommitted changes: a trial, not a release)')"
  echo "- Built: $created, for \`$target\` ($(sed -n 's/^  "rustc": "\(.*\)",$/\1/p' "$out/version.json"))"
  echo "- Image: \`$image_repo@$digest\` (\`$name-image.oci.tar\`; push it with \`skopeo copy --preserve-digests oci-archive:$name-image.oci.tar docker://$image_repo:$version\` so the digest the manifests name stays the same)"
  echo
  echo "## Formats this release writes and reads"
  echo
  echo "Each stored and published format: the version written, the versions read, where it"
  echo "lives (docs/formats.md). A keyplan that meets a newer version than it reads refuses and"
  echo "writes nothing (docs/releasing.md)."
  echo
  echo '```text'
  "$bin" version
  echo '```'
  echo
  echo "## Upgrade test"
  echo
  if [ -n "$upgrade_result" ]; then
    echo "scripts/upgrade-test.sh, run before this release (\`upgrade-test.txt\`):"
    echo
    echo '```text'
    cat "$upgrade_result"
    echo '```'
  else
    echo "**Not run for this build.** Run scripts/upgrade-test.sh and pass its result with"
    echo "\`scripts/release.sh --upgrade-result FILE\` before publishing."
  fi
  echo
  echo "## Changes"
  echo
  if [ -n "$changes" ]; then
    echo "$changes"
  else
    echo "CHANGELOG.md has no section for $version."
  fi
  echo
  echo "## Installing and upgrading"
  echo
  echo "README.md, \"Installing a release\" and \"Upgrading\"; docs/releasing.md."
} > "$out/RELEASE_NOTES.md"

# --- 7. checksums -------------------------------------------------------------------------
{
  echo
  echo "## Files"
  echo
  echo "Check them with \`sha256sum -c SHA256SUMS\` (SHA256SUMS lists every file, these notes"
  echo "and the manifests too)."
  echo
  echo '```text'
  (cd "$out" && find . -maxdepth 1 -type f ! -name RELEASE_NOTES.md ! -name SHA256SUMS -printf '%P\n' \
    | LC_ALL=C sort | xargs -d '\n' sha256sum)
  echo '```'
} >> "$out/RELEASE_NOTES.md"
sums=$(mktemp)
(cd "$out" && find . -type f -printf '%P\n' | LC_ALL=C sort | xargs -d '\n' sha256sum > "$sums")
mv "$sums" "$out/SHA256SUMS"
chmod 0644 "$out/SHA256SUMS"
(cd "$out" && sha256sum --quiet -c SHA256SUMS)

say "done: $out"
(cd "$out" && find . -type f -printf '%P\t%s\n' | LC_ALL=C sort | awk -F'\t' '{ printf "%12d  %s\n", $2, $1 }')
for note in "${notes[@]}"; do
  echo "warning: not ready to publish: $note" >&2
done
