#!/usr/bin/env bash
# Builds the real Kubernetes control plane the tests run against (tests/common/kube.rs):
# kube-apiserver and etcd, compiled from the Kubernetes and etcd projects' own Go modules
# (tools/k8s/go.mod). Go is only the build tool here; no Go code of ours is involved.
#
#   scripts/k8s-control-plane.sh            build (no-op when cached); last line: the bin dir
#   scripts/k8s-control-plane.sh gen-mod    regenerate tools/k8s/go.mod + go.sum for the
#                                           versions below (the step to run when bumping)
#
# Environment:
#   KEYPLAN_K8S_VERSION   Kubernetes version (default v1.37.2)
#   KEYPLAN_ETCD_VERSION  etcd version (default v3.7.3)
#   KEYPLAN_K8S_CACHE     cache root (default ~/.cache/keyplan/k8s); binaries go to
#                         $KEYPLAN_K8S_CACHE/<k8s>-etcd<etcd>/bin/{kube-apiserver,etcd}, and the
#                         Go module and build caches to $KEYPLAN_K8S_CACHE/go/{mod,build};
#                         the Prometheus Operator's CRDs to $KEYPLAN_K8S_CACHE/<k8s>-etcd<etcd>/crds
#   KEYPLAN_K8S_REBUILD=1 rebuild even when the binaries are there
#   GO                    the go command (default: `go` on PATH, else /usr/local/go/bin/go)
#
# With other versions than the committed ones the go.mod is generated in a temporary copy;
# tools/k8s/go.mod stays as committed. The checksum database is not reachable from this
# workplace, so GOSUMDB=off: the committed go.sum (written from the module proxy's content by
# `gen-mod`) is what verifies the downloads of the default versions.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

default_k8s=v1.37.2
default_etcd=v3.7.3
k8s_version="${KEYPLAN_K8S_VERSION:-$default_k8s}"
etcd_version="${KEYPLAN_ETCD_VERSION:-$default_etcd}"
cache="${KEYPLAN_K8S_CACHE:-$HOME/.cache/keyplan/k8s}"
key="${k8s_version}-etcd${etcd_version#v}"
bin="$cache/$key/bin"

GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
export GOMODCACHE="${KEYPLAN_K8S_GOMODCACHE:-$cache/go/mod}"
export GOCACHE="${KEYPLAN_K8S_GOCACHE:-$cache/go/build}"
export GOSUMDB=off GOFLAGS=-buildvcs=false CGO_ENABLED=0

# Writes go.mod and go.sum for $1 (k8s version) and $2 (etcd version) into directory $3.
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0
# with `=> ./staging/src/...` replaces that Go ignores in a dependency: each becomes a replace
# to the published k8s.io/<m> v0.<minor>.<patch>, generated from the upstream go.mod.
gen_mod() {
  local k8s="$1" etcd="$2" dir="$3"
  local staging_version="v0.${k8s#v1.}"
  mkdir -p "$dir"
  (
    cd "$dir"
    rm -f go.mod go.sum
    "$GO" mod init keyplan.local/k8s-control-plane >/dev/null 2>&1
    local gomod
    gomod="$("$GO" mod download -json "k8s.io/kubernetes@$k8s" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [ -f "$gomod" ] || { echo "no go.mod for k8s.io/kubernetes@$k8s" >&2; exit 1; }
    local mods
    mods="$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$gomod" | sort -u)"
    [ -n "$mods" ] || { echo "no staging replaces in $gomod" >&2; exit 1; }
    local args=()
    for m in $mods; do args+=("-replace=$m=$m@$staging_version"); done
    "$GO" mod edit "${args[@]}"
    "$GO" get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$k8s" "go.etcd.io/etcd/server/v3@$etcd"
    "$GO" mod tidy
  )
}

if [ "${1:-}" = gen-mod ]; then
  gen_mod "$k8s_version" "$etcd_version" "$root/tools/k8s"
  echo "regenerated $root/tools/k8s/go.mod for $k8s_version, etcd $etcd_version"
  exit 0
fi

# The Prometheus Operator's published CRDs (PodMonitor, PrometheusRule), for the server-side
# dry run of deploy/kubernetes/components/prometheus-operator (tests/fleet/deploy_apply.rs): from the
# operator's Go module (example/prometheus-operator-crd), pinned by version and by the module's
# h1: hash (GOSUMDB is off), into $cache/$key/crds.
promop_version=v0.85.0
promop_sum="h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s="
crds="$cache/$key/crds"
fetch_crds() {
  [ -f "$crds/monitoring.coreos.com_podmonitors.yaml" ] && [ -f "$crds/monitoring.coreos.com_prometheusrules.yaml" ] && return 0
  local info dir sum
  info="$(cd "$(mktemp -d)" && "$GO" mod download -json "github.com/prometheus-operator/prometheus-operator@$promop_version")"
  dir="$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  sum="$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",\{0,1\}$/\1/p')"
  [ "$sum" = "$promop_sum" ] || { echo "prometheus-operator $promop_version: module hash $sum, expected $promop_sum" >&2; exit 1; }
  mkdir -p "$crds.tmp"
  cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" \
     "$dir/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml" "$crds.tmp/"
  chmod u+w "$crds.tmp"/*
  rm -rf "$crds"; mv "$crds.tmp" "$crds"
  echo "prometheus-operator $promop_version CRDs in $crds"
}

if [ "${KEYPLAN_K8S_REBUILD:-0}" != 1 ] && [ -x "$bin/kube-apiserver" ] && [ -x "$bin/etcd" ]; then
  fetch_crds
  echo "k8s control plane $key: cached (warm, no build)"
  echo "$bin"
  exit 0
fi

mkdir -p "$cache/$key"
exec 9>"$cache/$key/lock"
flock 9
start=$(date +%s)
if [ "$k8s_version" = "$default_k8s" ] && [ "$etcd_version" = "$default_etcd" ]; then
  moddir="$root/tools/k8s"
else
  moddir="$(mktemp -d)"
  trap 'rm -rf "$moddir"' EXIT
  echo "generating go.mod for $k8s_version / etcd $etcd_version in $moddir"
  gen_mod "$k8s_version" "$etcd_version" "$moddir"
fi

v="${k8s_version#v}"
major="${v%%.*}"; rest="${v#*.}"; minor="${rest%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitCommit=0000000000000000000000000000000000000000 -X $pkg.gitTreeState=clean"
  ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

tmp="$cache/$key/bin.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
(
  cd "$moddir"
  echo "building kube-apiserver $k8s_version ($("$GO" version))"
  "$GO" build -trimpath -ldflags "$ldflags" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
  echo "building etcd $etcd_version"
  "$GO" build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
)
rm -rf "$bin"; mv "$tmp" "$bin"
fetch_crds
printf 'KEYPLAN_K8S_BIN=%s\n' "$bin" >"$cache/$key/env"
echo "k8s control plane $key: built in $(( $(date +%s) - start ))s"
echo "$bin"
