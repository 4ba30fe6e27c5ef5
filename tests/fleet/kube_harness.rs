//! The real Kubernetes control plane of tests/common/kube.rs (etcd + kube-apiserver built by
//! scripts/k8s-control-plane.sh) behaves as the tests that will move onto it need: the
//! version built, namespaces, optimistic concurrency on Secrets, node-bound ServiceAccount
//! tokens and RBAC denials. Skipped when the binaries are missing (failed with
//! KEYPLAN_REQUIRE_SERVERS=1).

use crate::common::kube;
use crate::common::kube_proxy;

use kube::Cluster;
use serde_json::json;

#[test]
fn version_is_the_one_built() {
    let Some(c) = Cluster::get() else { return };
    let v = c.get_json("/version").expect("/version");
    // The version scripts/k8s-control-plane.sh built: the default, or KEYPLAN_K8S_VERSION.
    let want = std::env::var("KEYPLAN_K8S_VERSION").unwrap_or_else(|_| kube::K8S_VERSION.into());
    assert_eq!(v["gitVersion"], want.as_str(), "{v}");
    let minor = want
        .trim_start_matches("v1.")
        .split('.')
        .next()
        .unwrap_or_default();
    assert_eq!(v["major"], "1", "{v}");
    assert_eq!(v["minor"], minor, "{v}");
}

#[test]
fn fresh_namespaces_are_distinct_and_exist() {
    let Some(c) = Cluster::get() else { return };
    let a = c.fresh_namespace("harness");
    let b = c.fresh_namespace("harness");
    assert_ne!(a, b);
    for ns in [&a, &b] {
        let n = c
            .get_json(&format!("/api/v1/namespaces/{ns}"))
            .expect("namespace");
        assert_eq!(n["status"]["phase"], "Active");
    }
}

#[test]
fn secret_update_with_a_stale_resource_version_is_a_409() {
    let Some(c) = Cluster::get() else { return };
    let ns = c.fresh_namespace("cas");
    c.put_secret(
        &ns,
        json!({"metadata": {"name": "k"}, "data": {"dmcrypt-key": "b25l"}}),
    );
    let stale = c.secret(&ns, "k").expect("secret");
    // Another writer changes it: the resourceVersion moves on.
    c.modify_secret(&ns, "k", |s| s["data"]["dmcrypt-key"] = json!("dHdv"));
    let mut write = stale.clone();
    write["data"]["dmcrypt-key"] = json!("dGhyZWU=");
    let r = c.put(&Cluster::path("secrets", &ns, Some("k")), &write);
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.body["reason"], "Conflict");
    assert_eq!(
        c.data(&ns, "k", "dmcrypt-key").as_deref(),
        Some(&b"two"[..])
    );
    assert_eq!(c.names(&ns), vec!["k"]);
}

#[test]
fn node_bound_token_carries_the_node_name() {
    let Some(c) = Cluster::get() else { return };
    let ns = c.fresh_namespace("node");
    let node = format!("worker-{:06x}", rand::random::<u32>() >> 8);
    let n = c.node_client(&ns, "keyplan", &node);
    let who = c.whoami(&n.token);
    assert_eq!(who["username"], n.user, "{who}");
    assert_eq!(
        who["extra"]["authentication.kubernetes.io/node-name"],
        json!([node]),
        "{who}"
    );
    assert_eq!(
        who["extra"]["authentication.kubernetes.io/pod-name"],
        json!([n.pod]),
        "{who}"
    );
    assert_eq!(c.user_of(&n.token).as_deref(), Some(n.user.as_str()));
    assert!(n.kubeconfig.is_file());
}

#[test]
fn rbac_denies_what_no_role_grants() {
    let Some(c) = Cluster::get() else { return };
    let ns = c.fresh_namespace("rbac");
    c.put_secret(
        &ns,
        json!({"metadata": {"name": "s"}, "data": {"k": "dg=="}}),
    );
    let u = c.users(&ns);
    let path = Cluster::path("secrets", &ns, Some("s"));
    // nobody: no binding at all.
    let r = c.request_as(&u.no_access_token, "GET", &path, None);
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.body["reason"], "Forbidden");
    // reader: get yes, update no.
    let r = c.request_as(&u.read_only_token, "GET", &path, None);
    assert_eq!(r.status, 200, "{}", r.body);
    let r = c.request_as(&u.read_only_token, "PUT", &path, Some(&r.body));
    assert_eq!(r.status, 403, "{}", r.body);
    // full: everything.
    let r = c.request_as(&u.full_token, "DELETE", &path, None);
    assert_eq!(r.status, 200, "{}", r.body);
    // A token nobody issued: 401.
    let r = c.request_as("not-a-token", "GET", &path, None);
    assert_eq!(r.status, 401, "{}", r.body);
}

#[test]
fn deploy_rbac_manifest_applies_and_limits_the_agent() {
    let Some(c) = Cluster::get() else { return };
    let fleet = c.fresh_namespace("fleet");
    let rook = c.fresh_namespace("rook");
    let yaml = std::fs::read_to_string("deploy/kubernetes/rbac.yaml").expect("rbac.yaml");
    c.apply_yaml(&yaml, &[("keyplan", &fleet), ("rook-ceph", &rook)]);
    c.service_account(&fleet, "keyplan");
    let n = c.node_client(&fleet, "keyplan", "worker-1");
    // The agent may read its own node report but not the plan ConfigMap.
    c.put_configmap(
        &fleet,
        json!({"metadata": {"name": "keyplan-plan"}, "data": {"a": "b"}}),
    );
    let r = c.request_as(
        &n.token,
        "GET",
        &Cluster::path("configmaps", &fleet, Some("keyplan-plan")),
        None,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let r = c.request_as(
        &n.token,
        "GET",
        &Cluster::path("configmaps", &fleet, Some("keyplan-node-worker-1")),
        None,
    );
    assert_eq!(r.status, 404, "allowed, absent: {}", r.body);
}

#[test]
fn admin_kubeconfig_works_with_keyplans_kube_client() {
    let Some(c) = Cluster::get() else { return };
    let ns = c.fresh_namespace("kc");
    c.put_secret(
        &ns,
        json!({"metadata": {"name": "x"}, "data": {"dmcrypt-key": "aGk="}}),
    );
    for kc in [c.kubeconfig_admin(&ns), c.kubeconfig(&ns, "full")] {
        let k = keyplan::kms::kubernetes::KubernetesKms::new("k8s", &ns, None, Some(&kc), None)
            .expect("open kubernetes KMS");
        use keyplan::kms::Kms as _;
        let st = k.read("x").expect("read through keyplan");
        assert_eq!(st.current, Some(1));
    }
    let kc = c.kubeconfig(&ns, "no-access");
    let k = keyplan::kms::kubernetes::KubernetesKms::new("k8s", &ns, None, Some(&kc), None)
        .expect("open kubernetes KMS");
    use keyplan::kms::Kms as _;
    assert!(k.read("x").is_err());
}

#[test]
fn proxy_logs_users_runs_hooks_and_injects_faults() {
    let Some(c) = Cluster::get() else { return };
    let ns = c.fresh_namespace("proxy");
    let proxy = kube_proxy::KubeProxy::start(c);
    c.put_secret(
        &ns,
        json!({"metadata": {"name": "k"}, "data": {"dmcrypt-key": "b25l"}}),
    );
    let u = c.users(&ns);
    let path = Cluster::path("secrets", &ns, Some("k"));
    let via = |token: &str, method: &str, body: Option<&serde_json::Value>| {
        kube::block_on(async {
            let mut r = reqwest::Client::new()
                .request(
                    reqwest::Method::from_bytes(method.as_bytes()).expect("method"),
                    format!("{}{path}", proxy.url()),
                )
                .bearer_auth(token);
            if let Some(b) = body {
                r = r
                    .header("Content-Type", "application/json")
                    .body(b.to_string());
            }
            match r.send().await {
                Ok(resp) => {
                    let code = resp.status().as_u16();
                    let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
                    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
                    Ok((code, v))
                }
                Err(e) => Err(e.to_string()),
            }
        })
    };
    // A concurrent writer sneaks in between the read and the write: the write is a 409.
    let (code, read) = via(&u.full_token, "GET", None).expect("GET through the proxy");
    assert_eq!(code, 200);
    let ns2 = ns.clone();
    proxy.before_write(
        move |r| r.is_secret_write(&ns2, "k"),
        move || {
            Cluster::get()
                .expect("cluster")
                .modify_secret(&ns, "k", |s| s["data"]["dmcrypt-key"] = json!("dHdv"))
        },
    );
    let (code, _) = via(&u.full_token, "PUT", Some(&read)).expect("PUT through the proxy");
    assert_eq!(code, 409);
    // Injected faults.
    proxy.inject(|r| r.method == "GET", kube_proxy::Fault::Status(503), 1);
    assert_eq!(via(&u.full_token, "GET", None).expect("GET").0, 503);
    proxy.inject(|r| r.method == "GET", kube_proxy::Fault::Garbage, 1);
    assert!(via(&u.full_token, "GET", None).is_err());
    assert_eq!(via(&u.no_access_token, "GET", None).expect("GET").0, 403);
    let log = proxy.requests();
    let codes: Vec<u16> = log.iter().map(|r| r.code).collect();
    assert_eq!(codes, vec![200, 409, 503, 0, 403], "{log:?}");
    let full_user = log[0].user.clone();
    assert!(full_user.ends_with(":harness-admin"), "{log:?}");
    assert!(log[4].user.ends_with(":nobody"), "{log:?}");
    assert!(log[1].is_secret_write());
}
