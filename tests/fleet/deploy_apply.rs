//! deploy/kubernetes against a real kube-apiserver (tests/common/kube.rs): the base, with the
//! component `signed-plans`, passes a server-side dry run (`kubectl apply --server-side
//! --dry-run=server --validate=strict -k deploy/kubernetes`, made here with the API's own
//! requests: every object as a server-side apply with `dryRun=All` and strict field
//! validation), and so does the optional component `prometheus-operator` once the
//! Prometheus Operator's published CRDs (v0.85.0, fetched by scripts/k8s-control-plane.sh) are
//! installed: its PodMonitor and PrometheusRule are checked against their real schemas.
//!
//! The kustomizations are rendered here as kustomize renders them: the base and the components
//! only list `resources` (asserted), and the one patch (signed-plans) is an RFC 6902 JSON patch,
//! applied with the `json-patch` crate. tests/fleet/deploy_manifests.rs compares the objects with
//! `kubectl kustomize` where kubectl is installed.
//!
//! Each test maps the manifests' namespaces (`keyplan`, `rook-ceph`) to fresh ones, so the
//! tests share one control plane with the others.

use crate::common::kube;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::Cluster;
use serde_json::{json, Value};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .filter(Value::is_object)
        .collect()
}

/// The objects `kustomize build` makes of the kustomization in `dir` plus `components` (paths
/// under deploy/kubernetes), for the kustomizations this repository has: resources and, in a
/// component, JSON patches with a target.
fn render(dir: &Path, components: &[&str]) -> Vec<Value> {
    let k = yaml_docs(&dir.join("kustomization.yaml")).remove(0);
    let keys: Vec<&str> = k
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    assert!(
        keys.iter()
            .all(|key| ["apiVersion", "kind", "resources"].contains(key)),
        "{}: the base uses more of kustomize than its resources ({keys:?}): render it with kustomize",
        dir.display()
    );
    let mut objs: Vec<Value> = resources(dir, &k);
    for c in components {
        let cdir = dir.join(c);
        let ck = yaml_docs(&cdir.join("kustomization.yaml")).remove(0);
        assert_eq!(ck["kind"], "Component", "{c}");
        let keys: Vec<&str> = ck
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        assert!(
            keys.iter()
                .all(|key| ["apiVersion", "kind", "resources", "patches"].contains(key)),
            "{c}: uses more of kustomize than resources and patches ({keys:?})"
        );
        objs.extend(resources(&cdir, &ck));
        for p in ck["patches"].as_array().into_iter().flatten() {
            let t = &p["target"];
            let ops: Value = serde_saphyr::from_str(p["patch"].as_str().expect("an inline patch"))
                .expect("the patch parses");
            let patch: json_patch::Patch = serde_json::from_value(ops).expect("an RFC 6902 patch");
            let mut hits = 0;
            for o in objs.iter_mut() {
                let api = o["apiVersion"].as_str().unwrap_or_default();
                let (group, version) = api.rsplit_once('/').unwrap_or(("", api));
                if o["kind"] == t["kind"]
                    && o["metadata"]["name"] == t["name"]
                    && o["metadata"]["namespace"] == t["namespace"]
                    && t["group"].as_str().unwrap_or("") == group
                    && t["version"].as_str().is_none_or(|v| v == version)
                {
                    json_patch::patch(o, &patch).expect("the patch applies");
                    hits += 1;
                }
            }
            assert_eq!(hits, 1, "{c}: the patch's target {t} is one object");
        }
    }
    objs
}

fn resources(dir: &Path, k: &Value) -> Vec<Value> {
    k["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| yaml_docs(&dir.join(r.as_str().expect("a file name"))))
        .collect()
}

/// The objects moved to fresh namespaces: `keyplan` → `fleet`, `rook-ceph` → `rook` (the
/// Namespace object, `metadata.namespace` and RBAC subjects).
fn moved(mut objs: Vec<Value>, fleet: &str, rook: &str) -> Vec<Value> {
    let map = |ns: &str| match ns {
        "keyplan" => fleet.to_string(),
        "rook-ceph" => rook.to_string(),
        other => other.to_string(),
    };
    for o in objs.iter_mut() {
        if o["kind"] == "Namespace" {
            let n = map(o["metadata"]["name"].as_str().unwrap_or_default());
            o["metadata"]["name"] = json!(n);
        }
        if let Some(ns) = o["metadata"]["namespace"].as_str().map(map) {
            o["metadata"]["namespace"] = json!(ns);
        }
        // get_mut, not IndexMut: indexing would add `subjects: null` to every object.
        let subjects = o.get_mut("subjects").and_then(Value::as_array_mut);
        for s in subjects.into_iter().flatten() {
            if let Some(ns) = s["namespace"].as_str().map(map) {
                s["namespace"] = json!(ns);
            }
        }
    }
    objs
}

/// The API path of object `o` (the plural of every kind here is `<kind>s`, or `<kin>ies` for
/// a kind ending in `y`: ValidatingAdmissionPolicy).
fn path_of(o: &Value) -> String {
    let api = o["apiVersion"].as_str().expect("apiVersion");
    let prefix = if api.contains('/') {
        format!("/apis/{api}")
    } else {
        format!("/api/{api}")
    };
    let kind = o["kind"].as_str().expect("kind").to_ascii_lowercase();
    let plural = match kind.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{kind}s"),
    };
    let name = o["metadata"]["name"].as_str().expect("metadata.name");
    match o["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{prefix}/namespaces/{ns}/{plural}/{name}"),
        None => format!("{prefix}/{plural}/{name}"),
    }
}

fn id(o: &Value) -> String {
    format!(
        "{} {}/{}",
        o["kind"].as_str().unwrap_or_default(),
        o["metadata"]["namespace"].as_str().unwrap_or("-"),
        o["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// The objects of deploy/kubernetes with `components`, moved to two fresh namespaces named
/// after `prefix` ([`moved`]).
fn in_fresh_namespaces(c: &Cluster, prefix: &str, components: &[&str]) -> Vec<Value> {
    let fleet = c.fresh_namespace(prefix);
    let rook = c.fresh_namespace(&format!("{prefix}-r"));
    moved(render(&deploy(), components), &fleet, &rook)
}

/// Polls `ready` every 100 ms for up to 120 s; panics with `what()` when it never holds.
fn wait_until(mut ready: impl FnMut() -> bool, what: impl Fn() -> String) {
    let t0 = Instant::now();
    while !ready() {
        assert!(t0.elapsed() < Duration::from_secs(120), "{}", what());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Dry-runs every object; panics naming each one the server refused.
fn dry_run_all(c: &Cluster, objs: &[Value]) -> Vec<Value> {
    let mut refused = Vec::new();
    let mut answers = Vec::new();
    for o in objs {
        let r = c.server_side_apply(&path_of(o), o, true);
        if matches!(r.status, 200 | 201) {
            answers.push(r.body);
        } else {
            refused.push(format!("{}: {} {}", id(o), r.status, r.body["message"]));
        }
    }
    assert!(refused.is_empty(), "the server refused: {refused:#?}");
    answers
}

#[test]
fn the_base_and_signed_plans_pass_a_server_side_dry_run() {
    let Some(c) = Cluster::get() else { return };
    let objs = in_fresh_namespaces(c, "deploy", &["components/signed-plans"]);
    // The base is Kubernetes' own kinds only: it applies on a cluster without any CRD.
    for o in &objs {
        let api = o["apiVersion"].as_str().unwrap_or_default();
        assert!(
            [
                "v1",
                "apps/v1",
                "rbac.authorization.k8s.io/v1",
                "admissionregistration.k8s.io/v1"
            ]
            .contains(&api),
            "{}: {api} is not a built-in API; it belongs in an optional component",
            id(o)
        );
    }
    let answers = dry_run_all(c, &objs);
    // The server ran its defaulting and admission on them: the DaemonSet comes back with the
    // defaults the apiserver fills in (not echoed from our manifest), and is not stored.
    let ds = answers
        .iter()
        .find(|a| a["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    assert_eq!(
        ds["spec"]["template"]["spec"]["schedulerName"], "default-scheduler",
        "{ds}"
    );
    let args = ds["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains("--trusted-keys"),
        "signed-plans patched: {args}"
    );
    let ds_obj = objs.iter().find(|o| o["kind"] == "DaemonSet").expect("ds");
    assert_eq!(
        c.request("GET", &path_of(ds_obj), None).status,
        404,
        "a dry run stores nothing"
    );
}

#[test]
fn a_misspelt_field_fails_the_dry_run() {
    let Some(c) = Cluster::get() else { return };
    let objs = in_fresh_namespaces(c, "deploy-typo", &[]);
    let mut ds = objs
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("ds")
        .clone();
    let c0 = &mut ds["spec"]["template"]["spec"]["containers"][0];
    let mounts = c0["volumeMounts"].take();
    c0["volumeMount"] = mounts;
    let r = c.server_side_apply(&path_of(&ds), &ds, true);
    // Server-side apply answers an unknown field with 500 "failed to create typed patch
    // object ... field not declared in schema" (kube-apiserver v1.37.2; a create with
    // fieldValidation=Strict says 400 "unknown field"): either way the object is refused,
    // naming the field.
    let msg = r.body["message"].to_string();
    assert!(
        matches!(r.status, 400 | 422 | 500)
            && msg.contains("volumeMount")
            && (msg.contains("not declared in schema") || msg.contains("unknown field")),
        "{} {}",
        r.status,
        r.body
    );
}

/// Installs the Prometheus Operator's CRDs (cluster-wide, once) and waits until both kinds
/// are served. `None` (skipped, or failed with KEYPLAN_REQUIRE_SERVERS=1) without them.
fn prometheus_operator_crds(c: &Cluster) -> Option<()> {
    let dir = kube::bin_dir().parent()?.join("crds");
    let files = [
        "monitoring.coreos.com_podmonitors.yaml",
        "monitoring.coreos.com_prometheusrules.yaml",
    ];
    if !files.iter().all(|f| dir.join(f).is_file()) {
        return kube::missing(&format!(
            "the Prometheus Operator's CRDs in {} (scripts/k8s-control-plane.sh fetches them)",
            dir.display()
        ));
    }
    for f in files {
        let crd = yaml_docs(&dir.join(f)).remove(0);
        c.ensure(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            &crd,
        );
        let name = crd["metadata"]["name"]
            .as_str()
            .expect("CRD name")
            .to_string();
        let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}");
        let crd_now = || c.get_json(&path).unwrap_or(Value::Null);
        wait_until(
            || {
                crd_now()["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|x| x["type"] == "Established" && x["status"] == "True")
            },
            || format!("CRD {name} not Established: {}", crd_now()),
        );
    }
    // Established, then served: discovery lists the kinds.
    let served = || {
        c.get_json("/apis/monitoring.coreos.com/v1")
            .map(|l| l["resources"].to_string())
            .unwrap_or_default()
    };
    wait_until(
        || {
            let kinds = served();
            kinds.contains("\"podmonitors\"") && kinds.contains("\"prometheusrules\"")
        },
        || format!("monitoring.coreos.com/v1 not served: {}", served()),
    );
    Some(())
}

#[test]
fn the_prometheus_operator_component_passes_a_dry_run_against_its_crds() {
    let Some(c) = Cluster::get() else { return };
    let Some(()) = prometheus_operator_crds(c) else {
        return;
    };
    let all = in_fresh_namespaces(c, "deploy-mon", &["components/prometheus-operator"]);
    let monitoring: Vec<Value> = all
        .iter()
        .filter(|o| o["apiVersion"] == "monitoring.coreos.com/v1")
        .cloned()
        .collect();
    let kinds: Vec<&str> = monitoring
        .iter()
        .filter_map(|o| o["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["PodMonitor", "PrometheusRule"]);
    let answers = dry_run_all(c, &all);
    assert_eq!(answers.len(), all.len());
    // The CRDs' schemas are enforced: a rule whose `for` is not a Prometheus duration (the
    // CRD's pattern) is refused.
    let mut bad = monitoring
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("rule")
        .clone();
    bad["spec"]["groups"][0]["rules"][0]["for"] = json!("soon");
    let r = c.server_side_apply(&path_of(&bad), &bad, true);
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(r.body["message"].to_string().contains("for"), "{}", r.body);
}
