//! Serves one real Kubernetes control plane (tests/common/kube.rs) for several test processes:
//!
//! ```text
//! KEYPLAN_KUBE_DIR=$dir cargo test --features failpoints --test fleet kube_cluster:: -- \
//!     --ignored --exact kube_cluster::serve --nocapture < some-pipe &
//! # wait for $dir/cluster.json, then run tests with KEYPLAN_KUBE_DIR=$dir
//! ```
//!
//! It serves until its standard input closes (the script that started it exits or closes
//! the pipe); etcd and kube-apiserver die with it. See `scripts/test.sh`.

use crate::common::kube;

#[test]
#[ignore = "serves a shared cluster until stdin closes; started by scripts/test.sh"]
fn serve() {
    let dir = std::env::var_os("KEYPLAN_KUBE_DIR")
        .expect("KEYPLAN_KUBE_DIR names where to write cluster.json");
    kube::serve(std::path::Path::new(&dir));
}
