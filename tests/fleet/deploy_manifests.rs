//! The Kubernetes manifests of `keyplan agent` (deploy/kubernetes, issue 15): every object
//! parses into its Kubernetes type with no field that type does not know, the DaemonSet runs
//! the agent as its interface requires, the Roles grant exactly
//! [`keyplan::fleet::api::AGENT_CALLS`] and the plan's Secrets by name, the example plan
//! validates and fits the agent config and the RBAC, the monitoring objects select the agent
//! and alert on metrics that exist; and `examples/rook/plan-from-pvs.py --role` writes the
//! RBAC of a cluster's plan (for the example plan, rbac.yaml itself).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PodSpec, ServiceAccount, Volume};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use keyplan::fleet::api::AGENT_CALLS;
use keyplan::fleet::report::report_name;
use keyplan::fleet::slots::slot_name;
use keyplan::fleet::trust::AgentConfig;
use keyplan::spec::{KmsConfig, Plan};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The ServiceAccount the agent runs as, and its namespace (the fleet namespace).
const SERVICE_ACCOUNT: (&str, &str) = ("keyplan", "keyplan");
/// The ConfigMaps of the base: the plan and the agent configuration. No node's token may
/// update them.
const CONFIG_MAPS: &[&str] = &["keyplan-plan", "keyplan-agent"];
/// The agent's own metrics (beside the status metrics of docs/monitoring.md, which it labels
/// with `node`).
const AGENT_METRICS: &[&str] = &[
    "keyplan_agent_up",
    "keyplan_agent_plan_refused",
    "keyplan_agent_fleet_halted",
    "keyplan_agent_last_cycle_timestamp_seconds",
    "keyplan_agent_runs_total",
    "keyplan_agent_slot_held",
    "keyplan_agent_state",
];

fn dir() -> PathBuf {
    Path::new(ROOT).join("deploy/kubernetes")
}

/// One document of a manifest file.
#[derive(Clone)]
struct Object {
    file: String,
    kind: String,
    name: String,
    namespace: Option<String>,
    value: Value,
}

impl Object {
    fn id(&self) -> String {
        let ns = self.namespace.as_deref().unwrap_or("-");
        format!("{} {ns}/{} ({})", self.kind, self.name, self.file)
    }

    /// The object as its k8s-openapi type `T`. Serializing it back must give the document
    /// again: k8s-openapi ignores fields it does not know, so a misspelt field (`hostIpc`,
    /// `subpath`) would otherwise pass unnoticed and be dropped by the API server too.
    fn typed<T: DeserializeOwned + Serialize>(&self) -> T {
        let t: T = serde_json::from_value(self.value.clone())
            .unwrap_or_else(|e| panic!("{}: not a valid {}: {e}", self.id(), self.kind));
        let back = serde_json::to_value(&t).expect("serialize");
        if let Some(d) = difference(&self.value, &back, "") {
            panic!(
                "{}: {d} (a field {} does not know, or a value of the wrong type?)",
                self.id(),
                self.kind
            );
        }
        t
    }
}

/// Where `written` and `parsed` (the same document through its type) differ, as a path.
fn difference(written: &Value, parsed: &Value, at: &str) -> Option<String> {
    match (written, parsed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    None => return Some(format!("field {at}/{k} is lost when parsed")),
                    Some(w) => {
                        if let Some(d) = difference(v, w, &format!("{at}/{k}")) {
                            return Some(d);
                        }
                    }
                }
            }
            b.keys()
                .find(|k| !a.contains_key(*k))
                .map(|k| format!("field {at}/{k} appears when parsed"))
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (v, w))| difference(v, w, &format!("{at}/{i}"))),
        (a, b) if a == b => None,
        (a, b) => Some(format!("{at} is {a} as written but {b} when parsed")),
    }
}

/// The YAML documents of `text` (documents holding only comments are skipped).
fn documents(text: &str, what: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text).unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn kustomization() -> Value {
    let docs = documents(
        &read(&dir().join("kustomization.yaml")),
        "kustomization.yaml",
    );
    assert_eq!(docs.len(), 1, "kustomization.yaml: one document");
    docs[0].clone()
}

/// The optional component of the Prometheus Operator's objects (its CRDs are not Kubernetes').
const MONITORING: &str = "components/prometheus-operator";

/// The files kustomization.yaml lists under `resources`, in order, then those of the
/// component [`MONITORING`] (as paths under deploy/kubernetes).
fn resources() -> Vec<String> {
    let list = |k: &Value, prefix: &str| -> Vec<String> {
        k["resources"]
            .as_array()
            .expect("kustomization.yaml: a resources list")
            .iter()
            .map(|r| format!("{prefix}{}", r.as_str().expect("a file name")))
            .collect()
    };
    let mut files = list(&kustomization(), "");
    let component = documents(
        &read(&dir().join(MONITORING).join("kustomization.yaml")),
        "the monitoring component's kustomization.yaml",
    );
    assert_eq!(component[0]["kind"], "Component");
    files.extend(list(&component[0], &format!("{MONITORING}/")));
    files
}

/// The objects of YAML `text` (from `file`).
fn objects_of(text: &str, file: &str) -> Vec<Object> {
    documents(text, file)
        .into_iter()
        .map(|value| {
            let s = |v: &Value| v.as_str().map(str::to_owned);
            let kind =
                s(&value["kind"]).unwrap_or_else(|| panic!("{file}: a document without kind"));
            let name = s(&value["metadata"]["name"])
                .unwrap_or_else(|| panic!("{file}: a {kind} without metadata.name"));
            Object {
                file: file.to_owned(),
                namespace: s(&value["metadata"]["namespace"]),
                kind,
                name,
                value,
            }
        })
        .collect()
}

/// Every object of every file kustomization.yaml lists.
fn objects() -> Vec<Object> {
    resources()
        .iter()
        .flat_map(|f| objects_of(&read(&dir().join(f)), f))
        .collect()
}

/// The one object of `kind` named `name`, as `T`.
fn one<T: DeserializeOwned + Serialize>(objs: &[Object], kind: &str, name: &str) -> (Object, T) {
    let found: Vec<&Object> = objs
        .iter()
        .filter(|o| o.kind == kind && o.name == name)
        .collect();
    assert_eq!(found.len(), 1, "one {kind} {name} in deploy/kubernetes");
    (found[0].clone(), found[0].typed())
}

fn all<T: DeserializeOwned + Serialize>(objs: &[Object], kind: &str) -> Vec<(Object, T)> {
    objs.iter()
        .filter(|o| o.kind == kind)
        .map(|o| (o.clone(), o.typed()))
        .collect()
}

#[test]
fn every_manifest_is_listed_and_parses_into_its_kind() {
    let k = kustomization();
    assert_eq!(k["apiVersion"], "kustomize.config.k8s.io/v1beta1");
    assert_eq!(k["kind"], "Kustomization");
    // kustomize's `namespace:` would move the Role of rook-ceph into the fleet namespace;
    // generated ConfigMaps would get hashed names.
    assert!(
        k.get("namespace").is_none(),
        "kustomization.yaml sets namespace"
    );
    assert!(
        k.get("configMapGenerator").is_none(),
        "kustomization.yaml generates ConfigMaps"
    );

    let listed: BTreeSet<String> = resources().into_iter().collect();
    let mut present = BTreeSet::new();
    for entry in std::fs::read_dir(dir()).expect("deploy/kubernetes") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if (name.ends_with(".yaml") || name.ends_with(".yml")) && name != "kustomization.yaml" {
            present.insert(name);
        }
    }
    for entry in std::fs::read_dir(dir().join(MONITORING)).expect(MONITORING) {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            present.insert(format!("{MONITORING}/{name}"));
        }
    }
    assert_eq!(listed, present, "the files kustomization.yaml lists");

    let objs = objects();
    let mut kinds = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for o in &objs {
        assert!(
            ids.insert((o.kind.clone(), o.namespace.clone(), o.name.clone())),
            "{} twice",
            o.id()
        );
        let cluster_scoped = matches!(
            o.kind.as_str(),
            "Namespace"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
        );
        assert_eq!(
            o.namespace.is_none(),
            cluster_scoped,
            "{}: a namespaced object names its namespace, a cluster-scoped one none",
            o.id()
        );
        match o.kind.as_str() {
            "Namespace" => {
                o.typed::<Namespace>();
            }
            "ServiceAccount" => {
                o.typed::<ServiceAccount>();
            }
            "Role" => {
                o.typed::<Role>();
            }
            "RoleBinding" => {
                o.typed::<RoleBinding>();
            }
            "ClusterRole" => {
                o.typed::<ClusterRole>();
            }
            "ClusterRoleBinding" => {
                o.typed::<ClusterRoleBinding>();
            }
            "DaemonSet" => {
                o.typed::<DaemonSet>();
            }
            "ConfigMap" => {
                o.typed::<ConfigMap>();
            }
            "ValidatingAdmissionPolicy" => {
                o.typed::<ValidatingAdmissionPolicy>();
            }
            "ValidatingAdmissionPolicyBinding" => {
                o.typed::<ValidatingAdmissionPolicyBinding>();
            }
            "PodMonitor" | "PrometheusRule" => {
                assert_eq!(
                    o.value["apiVersion"],
                    "monitoring.coreos.com/v1",
                    "{}",
                    o.id()
                );
                assert!(o.value["spec"].is_object(), "{}: no spec", o.id());
            }
            other => panic!("{}: unexpected kind {other}", o.id()),
        }
        kinds.insert(o.kind.as_str());
    }
    for kind in [
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "DaemonSet",
        "ConfigMap",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "PodMonitor",
        "PrometheusRule",
    ] {
        assert!(kinds.contains(kind), "no {kind} in deploy/kubernetes");
    }
    // Every namespace used is created here, or is Rook's.
    let (_, ns) = one::<Namespace>(&objs, "Namespace", SERVICE_ACCOUNT.1);
    assert_eq!(
        ns.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("pod-security.kubernetes.io/enforce"))
            .map(String::as_str),
        Some("privileged"),
        "the fleet namespace admits the privileged agent"
    );
    for o in &objs {
        if let Some(n) = &o.namespace {
            assert!(n == SERVICE_ACCOUNT.1 || n == "rook-ceph", "{}", o.id());
        }
    }
}

/// The agent's container in the DaemonSet, with the pod spec and its volumes.
struct Agent {
    ds: DaemonSet,
    namespace: String,
    pod: PodSpec,
    argv: Vec<String>,
    volumes: BTreeMap<String, Volume>,
}

fn agent(objs: &[Object]) -> Agent {
    let (o, ds) = one::<DaemonSet>(objs, "DaemonSet", "keyplan-agent");
    let pod = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("a pod spec");
    assert_eq!(pod.containers.len(), 1, "one container, the agent");
    let c = &pod.containers[0];
    let argv: Vec<String> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect();
    let volumes = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.clone(), v.clone()))
        .collect();
    Agent {
        namespace: o.namespace.expect("namespace"),
        ds,
        pod,
        argv,
        volumes,
    }
}

impl Agent {
    /// The value of `--option` on the command line.
    fn arg(&self, option: &str) -> &str {
        let i = self
            .argv
            .iter()
            .position(|a| a == option)
            .unwrap_or_else(|| panic!("no {option} in {:?}", self.argv));
        &self.argv[i + 1]
    }

    /// The volume mounted at `path`.
    fn volume_at(&self, path: &str) -> &Volume {
        let c = &self.pod.containers[0];
        let m = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == path)
            .unwrap_or_else(|| panic!("nothing is mounted at {path}"));
        &self.volumes[&m.name]
    }

    /// `(path, type)` of the hostPath volume mounted at `path`.
    fn host_path_at(&self, path: &str) -> (String, Option<String>) {
        let h = self
            .volume_at(path)
            .host_path
            .as_ref()
            .unwrap_or_else(|| panic!("{path} is not a hostPath volume"));
        (h.path.clone(), h.type_.clone())
    }

    /// The ConfigMap mounted as the directory holding the file `--option` names, and that
    /// file's name (its key).
    fn config_map_of(&self, option: &str) -> (String, String) {
        let file = Path::new(self.arg(option));
        let parent = file.parent().and_then(Path::to_str).expect("a directory");
        let cm = self
            .volume_at(parent)
            .config_map
            .as_ref()
            .unwrap_or_else(|| panic!("{parent} ({option}) is not a ConfigMap volume"));
        let key = file
            .file_name()
            .and_then(|f| f.to_str())
            .expect("a file name");
        // `items` would pick keys; then the file's key must be one of them, under its own name.
        if let Some(items) = &cm.items {
            assert!(
                items.iter().any(|i| i.key == key && i.path == key),
                "{option}: {items:?}"
            );
        }
        (cm.name.clone(), key.to_owned())
    }
}

#[test]
fn the_daemonset_runs_the_agent_as_its_interface_requires() {
    let objs = objects();
    let a = agent(&objs);
    let c = &a.pod.containers[0];

    assert_eq!(
        a.argv,
        [
            "keyplan",
            "agent",
            "--plan",
            "/etc/keyplan/plan/plan.yaml",
            "--config",
            "/etc/keyplan/agent/agent.yaml",
            "--state-dir",
            "/var/lib/keyplan",
            "--interval",
            "5m",
            "--listen",
            "0.0.0.0:9808",
            "--log-format",
            "json",
        ]
    );

    // cryptsetup on the host's devices.
    let sc = c.security_context.as_ref().expect("a securityContext");
    assert_eq!(sc.privileged, Some(true), "privileged");
    assert_eq!(a.pod.host_ipc, Some(true), "hostIPC (udev semaphores)");
    assert_eq!(a.host_path_at("/dev").0, "/dev");
    assert_eq!(a.host_path_at("/run/udev").0, "/run/udev");
    assert_eq!(
        a.host_path_at("/run/cryptsetup"),
        ("/run/cryptsetup".into(), Some("DirectoryOrCreate".into()))
    );
    // The node's journal outlives the pod, at the --state-dir the agent is given.
    assert_eq!(
        a.host_path_at(a.arg("--state-dir")),
        ("/var/lib/keyplan".into(), Some("DirectoryOrCreate".into()))
    );
    if sc.read_only_root_filesystem == Some(true) {
        assert!(a.volume_at("/tmp").empty_dir.is_some(), "a writable /tmp");
    }

    // The node name from the downward API.
    let env = |name: &str| {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.clone())
    };
    assert_eq!(env("NODE_NAME").as_deref(), Some("spec.nodeName"));
    assert_eq!(env("POD_NAMESPACE").as_deref(), Some("metadata.namespace"));

    // No subPath anywhere (a subPath mount never sees a ConfigMap update), and the plan and
    // agent config are ConfigMaps of this base mounted as directories.
    for m in c.volume_mounts.iter().flatten() {
        assert!(m.sub_path.is_none() && m.sub_path_expr.is_none(), "{m:?}");
        assert!(a.volumes.contains_key(&m.name), "no volume {}", m.name);
    }
    for (option, name) in [("--plan", "keyplan-plan"), ("--config", "keyplan-agent")] {
        let (cm, key) = a.config_map_of(option);
        assert_eq!(cm, name, "{option}");
        let (o, map) = one::<ConfigMap>(&objs, "ConfigMap", &cm);
        assert_eq!(o.namespace.as_deref(), Some(a.namespace.as_str()));
        assert!(
            map.data.as_ref().is_some_and(|d| d.contains_key(&key)),
            "{cm} has no {key}"
        );
    }

    // Metrics and health on the port --listen names, probed by name.
    let port = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))
        .expect("a port named metrics");
    let listen = a.arg("--listen");
    assert_eq!(
        listen.rsplit(':').next(),
        Some(port.container_port.to_string().as_str())
    );
    let probe = c.liveness_probe.as_ref().expect("a liveness probe");
    let get = probe.http_get.as_ref().expect("an HTTP liveness probe");
    assert_eq!(get.path.as_deref(), Some("/healthz"));
    assert_eq!(get.port, IntOrString::String("metrics".into()));

    // A running step gets time to finish on SIGTERM.
    let grace = a
        .pod
        .termination_grace_period_seconds
        .expect("terminationGracePeriodSeconds");
    assert!(grace >= 60, "terminationGracePeriodSeconds {grace}");

    // One node at a time on an update; on every node whatever its taints (a documented choice).
    let spec = a.ds.spec.as_ref().expect("spec");
    let update = spec.update_strategy.as_ref().expect("updateStrategy");
    assert_eq!(update.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        update
            .rolling_update
            .as_ref()
            .and_then(|r| r.max_unavailable.clone()),
        Some(IntOrString::Int(1))
    );
    assert!(
        a.pod
            .tolerations
            .iter()
            .flatten()
            .any(|t| t.operator.as_deref() == Some("Exists")
                && t.key.is_none()
                && t.effect.is_none()),
        "tolerates every taint"
    );
    let labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    for (k, v) in spec.selector.match_labels.iter().flatten() {
        assert_eq!(
            labels.get(k),
            Some(v),
            "the selector matches the pods' labels"
        );
    }

    // Requests, and room for an argon2id PBKDF of cryptsetup's default cost (1 GiB) plus
    // cryptsetup (16 MiB) and the agent: a smaller limit OOM-kills cryptsetup mid-write.
    let res = c.resources.as_ref().expect("resources");
    let requests = res.requests.clone().unwrap_or_default();
    assert!(
        requests.contains_key("cpu") && requests.contains_key("memory"),
        "{requests:?}"
    );
    let limits = res.limits.clone().unwrap_or_default();
    assert!(
        !limits.contains_key("cpu"),
        "a CPU limit throttles the PBKDF"
    );
    if let Some(m) = limits.get("memory") {
        let bytes = quantity_bytes(&m.0);
        assert!(bytes >= (1024 + 16 + 64) << 20, "memory limit {}", m.0);
    }

    // The agent runs as the ServiceAccount the RoleBindings bind, in the fleet namespace.
    assert_eq!(
        a.pod.service_account_name.as_deref(),
        Some(SERVICE_ACCOUNT.0)
    );
    assert_eq!(a.namespace, SERVICE_ACCOUNT.1);
    let (sa, _) = one::<ServiceAccount>(&objs, "ServiceAccount", SERVICE_ACCOUNT.0);
    assert_eq!(sa.namespace.as_deref(), Some(SERVICE_ACCOUNT.1));
}

/// Bytes of a Kubernetes memory quantity (`2Gi`, `512Mi`, `1G`, plain bytes).
fn quantity_bytes(q: &str) -> u64 {
    let units: &[(&str, u64)] = &[
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, factor) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().expect("a whole number") * factor;
        }
    }
    q.parse().expect("a whole number of bytes")
}

/// A rule as `(group, resource, sorted verbs, by name)`; one group and one resource per rule.
fn call_of(r: &PolicyRule, what: &str) -> (String, String, Vec<String>, bool) {
    let groups = r.api_groups.clone().unwrap_or_default();
    let resources = r.resources.clone().unwrap_or_default();
    assert!(
        groups.len() == 1 && resources.len() == 1 && r.non_resource_urls.is_none(),
        "{what}: one API group and one resource per rule: {r:?}"
    );
    let mut verbs = r.verbs.clone();
    verbs.sort();
    (
        groups[0].clone(),
        resources[0].clone(),
        verbs,
        r.resource_names.is_some(),
    )
}

/// The Secrets the plan's keys name, per namespace of their `kubernetes` KMS.
fn secrets_of(plan: &Plan) -> BTreeMap<String, BTreeSet<String>> {
    let mut secrets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for key in plan.keys.values() {
        if let Some(KmsConfig::Kubernetes { namespace, .. }) = plan.kms.get(&key.kms) {
            secrets
                .entry(namespace.clone())
                .or_default()
                .insert(key.name.clone());
        }
    }
    secrets
}

/// The report ConfigMaps of the plan's nodes (`keyplan-node-<node>`).
fn report_names(plan: &Plan) -> BTreeSet<String> {
    plan.devices
        .values()
        .filter_map(|d| d.node.as_deref())
        .map(report_name)
        .collect()
}

/// No rule lets `update` (or `patch`) ConfigMaps of any name: with it, any node's token could
/// rewrite the plan or the agent configuration and so take over every node.
fn assert_no_config_map_update_by_any_name(rules: &[PolicyRule], what: &str) {
    let has =
        |list: &Option<Vec<String>>, x: &str| list.iter().flatten().any(|v| v == x || v == "*");
    for r in rules {
        let writes = r
            .verbs
            .iter()
            .any(|v| matches!(v.as_str(), "update" | "patch" | "*"));
        if !(writes && has(&r.api_groups, "") && has(&r.resources, "configmaps")) {
            continue;
        }
        let names = r.resource_names.clone().unwrap_or_default();
        assert!(
            !names.is_empty() && !names.iter().any(|n| n == "*"),
            "{what}: update of ConfigMaps of any name: {r:?}"
        );
        for n in CONFIG_MAPS {
            assert!(
                !names.iter().any(|x| x == n),
                "{what}: update of {n}: {r:?}"
            );
        }
    }
}

/// The Role of the fleet namespace grants exactly `AGENT_CALLS`, each call by name (a rule with
/// `resourceNames`) exactly when it is `by_name`: the Leases
/// `keyplan-rollout-0` .. `keyplan-rollout-<max_concurrent_nodes - 1>` of `plan`, and the
/// reports of exactly its nodes.
fn check_fleet_role(role: &Role, plan: &Plan, what: &str) {
    let rules = role.rules.clone().unwrap_or_default();
    let mut granted: Vec<_> = rules.iter().map(|r| call_of(r, what)).collect();
    granted.sort();
    let mut wanted: Vec<_> = AGENT_CALLS
        .iter()
        .map(|c| {
            let mut verbs: Vec<String> = c.verbs.iter().map(|v| v.to_string()).collect();
            verbs.sort();
            (c.group.to_owned(), c.resource.to_owned(), verbs, c.by_name)
        })
        .collect();
    wanted.sort();
    assert_eq!(granted, wanted, "{what}: the rules are not AGENT_CALLS");

    let slots: Vec<String> = (0..plan.fleet.max_concurrent_nodes)
        .map(slot_name)
        .collect();
    let reports = report_names(plan);
    assert!(
        !slots.is_empty() && !reports.is_empty(),
        "{what}: a plan of no node"
    );
    let mut named = BTreeSet::new();
    for r in &rules {
        let Some(names) = &r.resource_names else {
            continue;
        };
        assert!(
            !names.is_empty(),
            "{what}: an empty resourceNames grants every object: {r:?}"
        );
        let (_, resource, _, _) = call_of(r, what);
        match resource.as_str() {
            "leases" => assert_eq!(
                names, &slots,
                "{what}: the slot Leases of max_concurrent_nodes {}",
                plan.fleet.max_concurrent_nodes
            ),
            "configmaps" => {
                let set: BTreeSet<String> = names.iter().cloned().collect();
                assert_eq!(set.len(), names.len(), "{what}: a report twice: {names:?}");
                assert_eq!(set, reports, "{what}: the reports of the plan's nodes");
            }
            other => panic!("{what}: {other} by name, but which names? {r:?}"),
        }
        named.insert(resource);
    }
    assert_eq!(
        named.into_iter().collect::<Vec<_>>(),
        ["configmaps", "leases"],
        "{what}: Leases and ConfigMaps by name"
    );
    assert_no_config_map_update_by_any_name(&rules, what);
}

/// A Role of Secrets grants `get`, `update` and `delete` of exactly `secrets`, by name, and
/// `create` (which RBAC cannot limit by name, and keyplan's check before an apply asks for);
/// no list, watch or patch, and no other Secret.
fn check_secrets_role(role: &Role, secrets: &BTreeSet<String>, what: &str) {
    let rules = role.rules.clone().unwrap_or_default();
    let mut calls: Vec<_> = rules.iter().map(|r| call_of(r, what)).collect();
    calls.sort();
    let verbs = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        calls,
        [
            ("".into(), "secrets".into(), verbs(&["create"]), false),
            (
                "".into(),
                "secrets".into(),
                verbs(&["delete", "get", "update"]),
                true
            ),
        ],
        "{what}: get/update/delete of Secrets by name, and create of Secrets"
    );
    let mut names = BTreeSet::new();
    for r in &rules {
        if let Some(listed) = &r.resource_names {
            assert!(
                !listed.is_empty(),
                "{what}: empty resourceNames grants every Secret"
            );
            names.extend(listed.iter().cloned());
        }
    }
    assert_eq!(&names, secrets, "{what}: the Secrets the plan names");
}

/// The plan of the ConfigMap keyplan-plan, written to `dir`.
fn plan_file(objs: &[Object], dir: &Path) -> PathBuf {
    let (_, cm) = one::<ConfigMap>(objs, "ConfigMap", "keyplan-plan");
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get("plan.yaml"))
        .expect("plan.yaml");
    let path = dir.join("plan.yaml");
    std::fs::write(&path, text).expect("write plan.yaml");
    path
}

#[test]
fn rbac_grants_exactly_the_agent_calls_and_the_plans_secrets() {
    let objs = objects();
    let tmp = tempfile::tempdir().expect("tempdir");
    let plan = keyplan::spec::load(&plan_file(&objs, tmp.path())).expect("the example plan");
    let fleet_ns = plan.fleet.namespace.as_str();
    assert_eq!(fleet_ns, SERVICE_ACCOUNT.1, "the plan's fleet namespace");

    let roles = all::<Role>(&objs, "Role");
    for (o, role) in &roles {
        for r in role.rules.iter().flatten() {
            for list in [&r.api_groups, &r.resources, &r.resource_names] {
                assert!(
                    !list.iter().flatten().any(|x| x == "*"),
                    "{}: a wildcard",
                    o.id()
                );
            }
            assert!(!r.verbs.iter().any(|v| v == "*"), "{}: a wildcard", o.id());
        }
    }
    for (o, role) in all::<ClusterRole>(&objs, "ClusterRole") {
        for r in role.rules.iter().flatten() {
            let res = r.resources.iter().flatten();
            assert!(
                !res.clone().any(|x| x == "secrets" || x == "*"),
                "{}: grants Secrets",
                o.id()
            );
        }
    }
    let cluster_bindings = all::<ClusterRoleBinding>(&objs, "ClusterRoleBinding");
    assert!(
        cluster_bindings.is_empty(),
        "the agent needs no cluster-wide grant: {:?}",
        cluster_bindings
            .iter()
            .map(|(o, _)| o.id())
            .collect::<Vec<_>>()
    );

    // Nowhere an update of every ConfigMap (the plan's, the agent config's).
    for (o, role) in &roles {
        assert_no_config_map_update_by_any_name(role.rules.as_deref().unwrap_or_default(), &o.id());
    }
    for (o, role) in all::<ClusterRole>(&objs, "ClusterRole") {
        assert_no_config_map_update_by_any_name(role.rules.as_deref().unwrap_or_default(), &o.id());
    }

    // The fleet namespace: exactly AGENT_CALLS, the slot Leases and the plan's node reports
    // by name.
    let fleet: Vec<&(Object, Role)> = roles
        .iter()
        .filter(|(o, _)| o.namespace.as_deref() == Some(fleet_ns))
        .collect();
    assert_eq!(fleet.len(), 1, "one Role in the fleet namespace");
    let (o, role) = fleet[0];
    check_fleet_role(role, &plan, &o.id());

    // Elsewhere: get/update/delete of the Secrets of the plan's kubernetes KMSs there, by
    // name, and create.
    let secrets_of = secrets_of(&plan);
    assert!(
        !secrets_of.is_empty(),
        "the example plan uses Rook's Secrets"
    );
    for (o, role) in &roles {
        let ns = o.namespace.clone().expect("namespace");
        if ns == fleet_ns {
            continue;
        }
        let secrets = secrets_of
            .get(&ns)
            .unwrap_or_else(|| panic!("{}: the plan has no Secrets in {ns}", o.id()));
        check_secrets_role(role, secrets, &o.id());
    }
    for ns in secrets_of.keys() {
        assert!(
            roles
                .iter()
                .any(|(o, _)| o.namespace.as_deref() == Some(ns)),
            "no Role for the plan's Secrets in {ns}"
        );
    }

    // Every Role is bound to the agent's ServiceAccount, by a RoleBinding of its namespace,
    // and no RoleBinding lends a ClusterRole (edit, admin, ... would grant Secrets).
    let bindings = all::<RoleBinding>(&objs, "RoleBinding");
    for (o, b) in &bindings {
        assert_eq!(b.role_ref.kind, "Role", "{}", o.id());
        assert_eq!(
            b.role_ref.api_group,
            "rbac.authorization.k8s.io",
            "{}",
            o.id()
        );
        assert!(
            roles
                .iter()
                .any(|(r, _)| r.name == b.role_ref.name && r.namespace == o.namespace),
            "{}: binds a Role that is not here",
            o.id()
        );
        let subjects: Vec<_> = b
            .subjects
            .iter()
            .flatten()
            .map(|s| (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()))
            .collect();
        assert_eq!(
            subjects,
            [("ServiceAccount", SERVICE_ACCOUNT.0, Some(SERVICE_ACCOUNT.1))],
            "{}",
            o.id()
        );
    }
    for (o, _) in &roles {
        assert!(
            bindings
                .iter()
                .any(|(b, rb)| rb.role_ref.name == o.name && b.namespace == o.namespace),
            "{}: not bound",
            o.id()
        );
    }
}

#[test]
fn the_example_plan_validates_and_fits_the_agent_config() {
    let objs = objects();
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = plan_file(&objs, tmp.path());
    let out = assert_cmd::Command::from_std(crate::common::keyplan_command())
        .env("NO_COLOR", "1")
        .args(["validate", "-f"])
        .arg(&path)
        .output()
        .expect("run keyplan validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "keyplan validate:\n{text}");
    assert!(
        text.contains("is valid: 1 KMS, 4 keys, 4 devices on 3 nodes."),
        "{text}"
    );

    let plan = keyplan::spec::load(&path).expect("plan");
    assert!(
        plan.devices.values().all(|d| d.node.is_some()),
        "every device names its node"
    );
    assert_eq!(
        plan.fleet.namespace,
        agent(&objs).namespace,
        "the agents' namespace"
    );

    // The agent config: a `kms` map of valid KMS instances (the allow-list), which defines
    // every instance the plan uses, with the same settings.
    let (_, cm) = one::<ConfigMap>(&objs, "ConfigMap", "keyplan-agent");
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get("agent.yaml"))
        .expect("agent.yaml");
    let config = documents(text, "agent.yaml");
    assert_eq!(config.len(), 1, "agent.yaml: one document");
    let fields: Vec<&String> = config[0].as_object().expect("a map").keys().collect();
    assert_eq!(
        fields,
        ["kms"],
        "agent.yaml's fields (enroll_with_dirs only as a comment: Rook adoption needs none)"
    );
    let allowed: BTreeMap<String, KmsConfig> =
        serde_json::from_value(config[0]["kms"].clone()).expect("agent.yaml: kms instances");
    assert!(!plan.kms.is_empty());
    for (name, kms) in &plan.kms {
        assert_eq!(
            allowed.get(name),
            Some(kms),
            "KMS {name} of the plan in agent.yaml"
        );
    }
    // The agent reads it, and lets the plan through, as it is and with the commented-out
    // enroll_with_dirs example in.
    let commented = "# enroll_with_dirs: ";
    assert!(
        text.contains(&format!("\n{commented}")),
        "agent.yaml shows enroll_with_dirs:\n{text}"
    );
    for (what, text) in [
        ("agent.yaml", text.clone()),
        (
            "agent.yaml with enroll_with_dirs",
            text.replace(commented, "enroll_with_dirs: "),
        ),
    ] {
        let path = tmp.path().join("agent.yaml");
        std::fs::write(&path, &text).expect("write agent.yaml");
        let config = AgentConfig::load(&path).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            config.enroll_with_dirs.is_empty(),
            what == "agent.yaml",
            "{what}: enroll_with_dirs"
        );
        let mut restricted = plan.clone();
        config
            .restrict(&mut restricted)
            .unwrap_or_else(|e| panic!("{what} refuses the example plan: {e:?}"));
    }
}

/// Names of `keyplan_*` metrics in `text` (a name runs on over letters, digits and `_`).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("keyplan_") {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_monitoring_objects_scrape_the_agents_and_alert_on_their_metrics() {
    let objs = objects();
    let a = agent(&objs);
    let pod_labels =
        a.ds.spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();

    let pm: Vec<&Object> = objs.iter().filter(|o| o.kind == "PodMonitor").collect();
    assert_eq!(pm.len(), 1, "one PodMonitor");
    let pm = pm[0];
    assert_eq!(
        pm.namespace.as_deref(),
        Some(a.namespace.as_str()),
        "beside the pods"
    );
    let selector = pm.value["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(
            pod_labels.get(k).map(String::as_str),
            v.as_str(),
            "selector {k}"
        );
    }
    let endpoints = pm.value["spec"]["podMetricsEndpoints"]
        .as_array()
        .expect("podMetricsEndpoints");
    assert!(!endpoints.is_empty());
    for e in endpoints {
        assert_eq!(e["port"], "metrics", "{e}");
        assert!(e.get("path").is_none_or(|p| p == "/metrics"), "{e}");
    }
    // Prometheus Operator's job label of a PodMonitor's targets.
    let job = format!("{}/{}", a.namespace, pm.name);

    // The agent serves each of AGENT_METRICS (a counter's name there has no `_total`).
    let endpoint = read(&Path::new(ROOT).join("src/fleet/endpoint.rs"));
    for m in AGENT_METRICS {
        let served = m.strip_suffix("_total").unwrap_or(m);
        assert!(
            endpoint.contains(&format!("\"{served}\"")),
            "{m}: not a metric of src/fleet/endpoint.rs"
        );
    }
    let known: BTreeSet<String> = metric_names(&read(&Path::new(ROOT).join("docs/monitoring.md")))
        .into_iter()
        .chain(AGENT_METRICS.iter().map(|m| m.to_string()))
        .collect();
    let rules: Vec<&Object> = objs.iter().filter(|o| o.kind == "PrometheusRule").collect();
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    let groups = rules[0].value["spec"]["groups"]
        .as_array()
        .expect("spec.groups");
    let mut alerts = BTreeSet::new();
    let mut used = BTreeSet::new();
    for g in groups {
        assert!(
            g["name"].as_str().is_some_and(|n| !n.is_empty()),
            "a group name"
        );
        for r in g["rules"].as_array().expect("rules") {
            let alert = r["alert"].as_str().expect("an alerting rule");
            assert!(alerts.insert(alert.to_owned()), "alert {alert} twice");
            let expr = r["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{alert}: expr"));
            assert!(
                balanced(expr),
                "{alert}: unbalanced brackets or quotes in {expr}"
            );
            let names = metric_names(expr);
            for m in &names {
                assert!(
                    known.contains(m),
                    "{alert}: {m} is no metric of keyplan's ({known:?})"
                );
            }
            if expr.contains("up{") {
                assert!(
                    expr.contains(&format!("job=\"{job}\"")),
                    "{alert}: the job is {job}"
                );
            }
            used.extend(names);
            assert!(
                matches!(
                    r["labels"]["severity"].as_str(),
                    Some("warning" | "critical")
                ),
                "{alert}: severity"
            );
            for a in ["summary", "description"] {
                assert!(
                    r["annotations"][a].as_str().is_some_and(|s| !s.is_empty()),
                    "{alert}: {a}"
                );
            }
            if let Some(f) = r.get("for") {
                let f = f.as_str().expect("for: a duration");
                assert!(humantime::parse_duration(f).is_ok(), "{alert}: for {f}");
            }
        }
    }
    // Failing runs, rotation overdue, credentials expiring, an agent not reporting, the fleet
    // halted.
    for m in [
        "keyplan_last_run_success",
        "keyplan_key_rotation_due_timestamp_seconds",
        "keyplan_kms_credential_expiring",
        "keyplan_agent_last_cycle_timestamp_seconds",
        "keyplan_agent_fleet_halted",
    ] {
        assert!(used.contains(m), "no alert on {m}");
    }
    assert!(alerts.iter().any(|a| a == "KeyplanAgentDown"), "{alerts:?}");
}

/// Brackets nest and close, quotes close (PromQL strings: no escapes used here).
fn balanced(expr: &str) -> bool {
    let mut stack = Vec::new();
    let mut quoted = false;
    for c in expr.chars() {
        match c {
            '"' => quoted = !quoted,
            _ if quoted => {}
            '(' | '{' | '[' => stack.push(c),
            ')' | '}' | ']' => {
                let open = match c {
                    ')' => '(',
                    '}' => '{',
                    _ => '[',
                };
                if stack.pop() != Some(open) {
                    return false;
                }
            }
            _ => {}
        }
    }
    stack.is_empty() && !quoted
}

/// `kubectl kustomize` (kustomize built into kubectl), where kubectl is installed, builds the
/// same objects, each in its own namespace.
#[test]
fn kustomize_builds_the_same_objects_in_their_namespaces() {
    let Ok(out) = Command::new("kubectl").arg("kustomize").arg(dir()).output() else {
        eprintln!("skipped: kubectl is not installed");
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids = |objs: Vec<Object>| -> BTreeSet<(String, Option<String>, String)> {
        objs.into_iter()
            .map(|o| (o.kind, o.namespace, o.name))
            .collect()
    };
    let built = ids(objects_of(
        &String::from_utf8_lossy(&out.stdout),
        "kubectl kustomize",
    ));
    // The base: every object but the optional monitoring component's.
    let base: Vec<Object> = objects()
        .into_iter()
        .filter(|o| !o.file.starts_with(MONITORING))
        .collect();
    assert_eq!(built, ids(base));
    assert!(built.contains(&(
        "Role".into(),
        Some("rook-ceph".into()),
        "keyplan-osd-keys".into()
    )));
}

/// The Python 3 interpreter: the system's when present (a version manager's shim can cost
/// half a second per run), else `python3` from PATH.
fn python() -> String {
    if Path::new("/usr/bin/python3").is_file() {
        "/usr/bin/python3".into()
    } else {
        "python3".into()
    }
}

/// Runs examples/rook/plan-from-pvs.py with `args` on `input`.
fn generator(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(python())
        .arg(Path::new(ROOT).join("examples/rook/plan-from-pvs.py"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the generator");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("the generator's output")
}

/// A `kubectl get pv -o json` item: a local block PV bound to `ns/pvc` on `node`.
fn pv(name: &str, ns: &str, pvc: &str, node: &str, path: Option<&str>) -> Value {
    let mut spec = serde_json::json!({
        "claimRef": {"namespace": ns, "name": pvc},
        "storageClassName": "local-osd",
        "volumeMode": "Block",
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
        ]}]}}
    });
    if let Some(p) = path {
        spec["local"] = serde_json::json!({ "path": p });
    }
    serde_json::json!({"metadata": {"name": name}, "spec": spec, "status": {"phase": "Bound"}})
}

/// The generator's stdout with `args` on `input`; it must succeed.
fn generated(args: &[&str], input: &str) -> String {
    let out = generator(args, input);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The plan the generator writes with `args` on `input` (its text, and loaded from `dir`).
fn generated_plan(args: &[&str], input: &str, dir: &Path) -> (String, Plan) {
    let text = generated(args, input);
    let path = dir.join("keyplan.yaml");
    std::fs::write(&path, &text).expect("write the plan");
    let plan = keyplan::spec::load(&path)
        .unwrap_or_else(|e| panic!("{args:?}: the generated plan: {e:?}\n{text}"));
    (text, plan)
}

/// A PersistentVolumeList of local PVs bound in `ns`: `(pv, pvc, node, path)`.
fn pv_list(ns: &str, pvs: &[(&str, &str, &str, Option<&str>)]) -> String {
    let items: Vec<Value> = pvs
        .iter()
        .map(|(name, pvc, node, path)| pv(name, ns, pvc, node, *path))
        .collect();
    serde_json::json!({"kind": "PersistentVolumeList", "items": items}).to_string()
}

/// The four objects of `--role`: the agent's Role and the Secrets Role, and their bindings.
struct Rbac {
    objects: Vec<Object>,
    agent: (Object, Role),
    agent_binding: (Object, RoleBinding),
    keys: (Object, Role),
    keys_binding: (Object, RoleBinding),
}

fn rbac_of(text: &str, what: &str) -> Rbac {
    let objects = objects_of(text, what);
    assert_eq!(
        objects.len(),
        4,
        "{what}: two Roles and their RoleBindings:\n{text}"
    );
    Rbac {
        agent: one::<Role>(&objects, "Role", "keyplan-agent"),
        agent_binding: one::<RoleBinding>(&objects, "RoleBinding", "keyplan-agent"),
        keys: one::<Role>(&objects, "Role", "keyplan-osd-keys"),
        keys_binding: one::<RoleBinding>(&objects, "RoleBinding", "keyplan-osd-keys"),
        objects,
    }
}

/// `(kind, name, subjects)` of a binding, checked to bind the Role of its name.
fn bound(b: &RoleBinding) -> Vec<(String, String, Option<String>)> {
    assert_eq!(b.role_ref.kind, "Role");
    assert_eq!(b.role_ref.api_group, "rbac.authorization.k8s.io");
    assert_eq!(Some(&b.role_ref.name), b.metadata.name.as_ref());
    b.subjects
        .iter()
        .flatten()
        .map(|s| (s.kind.clone(), s.name.clone(), s.namespace.clone()))
        .collect()
}

/// `role` with no `resourceNames`.
fn without_names(role: &Role) -> Role {
    let mut r = role.clone();
    r.rules
        .iter_mut()
        .flatten()
        .for_each(|rule| rule.resource_names = None);
    r
}

/// The path of `to` relative to the directory `from` (both absolute; kustomize refuses an
/// absolute base).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut rel = PathBuf::new();
    for _ in common..from.len() {
        rel.push("..");
    }
    for c in &to[common..] {
        rel.push(c);
    }
    rel
}

#[test]
fn the_rook_generator_writes_the_rbac_of_its_plan() {
    if Command::new(python()).arg("--version").output().is_err() {
        assert!(
            std::env::var("KEYPLAN_REQUIRE_SERVERS").as_deref() != Ok("1"),
            "python3 is not installed, and examples/rook/plan-from-pvs.py needs it"
        );
        eprintln!("skipped: python3 not found (examples/rook/plan-from-pvs.py needs it)");
        return;
    }
    let pvs = [
        ("pv-a", "set1-data-0-abcde", "worker-1", Some("/dev/sdb")),
        ("pv-b", "set1-data-1-fghij", "worker-2", Some("/dev/sdb")),
        ("pv-d", "set1-data-2-klmno", "worker-3", None),
        ("pv-e", "set1-data-3-pqrst", "worker-1", Some("/dev/sdc")),
    ];
    // Rook's PVs, and one of another namespace (not Rook's, skipped).
    let list = |ns: &str| {
        let mut v: Value = serde_json::from_str(&pv_list(ns, &pvs)).expect("json");
        let other = pv("pv-c", "other", "db", "worker-4", Some("/dev/sdc"));
        v["items"].as_array_mut().expect("items").insert(2, other);
        v.to_string()
    };
    let input = list("rook-ceph");
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = objects();
    let base_agent = one::<Role>(&base, "Role", "keyplan-agent").1;
    let base_agent_binding = one::<RoleBinding>(&base, "RoleBinding", "keyplan-agent").1;
    let base_keys = one::<Role>(&base, "Role", "keyplan-osd-keys").1;
    let base_keys_binding = one::<RoleBinding>(&base, "RoleBinding", "keyplan-osd-keys").1;
    let agent_sa = vec![(
        "ServiceAccount".to_string(),
        SERVICE_ACCOUNT.0.to_string(),
        Some(SERVICE_ACCOUNT.1.to_string()),
    )];

    // With the default max_concurrent_nodes (1) and with 3: the Roles of the plan the same
    // options write.
    for (options, slots) in [(&[][..], 1), (&["--max-concurrent-nodes", "3"][..], 3)] {
        let (_, plan) = generated_plan(options, &input, tmp.path());
        assert_eq!(plan.fleet.max_concurrent_nodes, slots, "{options:?}");
        let role_args: Vec<&str> = options.iter().copied().chain(["--role"]).collect();
        let rbac = rbac_of(&generated(&role_args, &input), "--role");
        let what = format!("{role_args:?}");
        for (o, ns) in [
            (&rbac.agent.0, SERVICE_ACCOUNT.1),
            (&rbac.agent_binding.0, SERVICE_ACCOUNT.1),
            (&rbac.keys.0, "rook-ceph"),
            (&rbac.keys_binding.0, "rook-ceph"),
        ] {
            assert_eq!(o.namespace.as_deref(), Some(ns), "{what}: {}", o.id());
        }

        // The agent's Role: AGENT_CALLS, the plan's slots and nodes by name.
        check_fleet_role(&rbac.agent.1, &plan, &what);
        assert_eq!(
            report_names(&plan).into_iter().collect::<Vec<_>>(),
            ["keyplan-node-worker-1", "keyplan-node-worker-2"],
            "worker-3's only OSD has no path; worker-4's PV is not Rook's"
        );
        // The Secrets Role: the plan's Secrets.
        let secrets = secrets_of(&plan);
        assert_eq!(
            secrets["rook-ceph"].iter().collect::<Vec<_>>(),
            [
                "rook-ceph-osd-encryption-key-set1-data-0-abcde",
                "rook-ceph-osd-encryption-key-set1-data-1-fghij",
                "rook-ceph-osd-encryption-key-set1-data-3-pqrst",
            ]
        );
        check_secrets_role(&rbac.keys.1, &secrets["rook-ceph"], &what);
        for o in &rbac.objects {
            if let "Role" = o.kind.as_str() {
                let role: Role = o.typed();
                assert_no_config_map_update_by_any_name(
                    role.rules.as_deref().unwrap_or_default(),
                    &what,
                );
            }
        }
        assert_eq!(bound(&rbac.agent_binding.1), agent_sa, "{what}");
        assert_eq!(bound(&rbac.keys_binding.1), agent_sa, "{what}");

        // They replace the Roles of deploy/kubernetes (a kustomize patch): the same objects,
        // the same rules but for the names.
        assert_eq!(without_names(&rbac.agent.1), without_names(&base_agent));
        assert_eq!(without_names(&rbac.keys.1), without_names(&base_keys));
        assert_eq!(rbac.agent_binding.1, base_agent_binding);
        assert_eq!(rbac.keys_binding.1, base_keys_binding);
    }

    // For the PVs of the example plan (its 4 OSDs on 3 nodes, max_concurrent_nodes 2) the
    // generator writes plan.yaml's plan and rbac.yaml itself: regenerating them is exact.
    let example = pv_list(
        "rook-ceph",
        &[
            ("pv-a", "set1-data-0-abcde", "worker-1", Some("/dev/sdb")),
            ("pv-b", "set1-data-1-fghij", "worker-2", Some("/dev/sdb")),
            ("pv-d", "set1-data-2-klmno", "worker-3", Some("/dev/sdb")),
            ("pv-e", "set1-data-3-pqrst", "worker-1", Some("/dev/sdc")),
        ],
    );
    let two = ["--max-concurrent-nodes", "2"];
    let (plan_text, _) = generated_plan(&two, &example, tmp.path());
    let (_, base_plan) = one::<ConfigMap>(&base, "ConfigMap", "keyplan-plan");
    let base_plan_text = base_plan
        .data
        .as_ref()
        .and_then(|d| d.get("plan.yaml"))
        .expect("plan.yaml");
    assert_eq!(
        documents(&plan_text, "the generated plan"),
        documents(base_plan_text, "plan.yaml"),
        "plan.yaml's plan is not what the generator writes for its PVs"
    );
    let written = objects_of(
        &generated(&["--max-concurrent-nodes", "2", "--role"], &example),
        "--role",
    );
    let rbac_yaml = objects_of(&read(&dir().join("rbac.yaml")), "rbac.yaml");
    let values = |objs: &[Object]| -> Vec<Value> { objs.iter().map(|o| o.value.clone()).collect() };
    assert_eq!(
        values(&written),
        values(&rbac_yaml),
        "rbac.yaml is not what the generator writes for plan.yaml's PVs"
    );
    let written = objects_of(&generated(&["--policy"], &example), "--policy");
    let policy_yaml = objects_of(
        &read(&dir().join("admission-policy.yaml")),
        "admission-policy.yaml",
    );
    assert_eq!(
        values(&written),
        values(&policy_yaml),
        "admission-policy.yaml is not what the generator writes for plan.yaml's PVs"
    );
    let (_, policy) = one::<ValidatingAdmissionPolicy>(
        &policy_yaml,
        "ValidatingAdmissionPolicy",
        "keyplan-agent-node-scope",
    );
    let spec = policy.spec.expect("spec");
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let secrets_by_node = spec
        .variables
        .iter()
        .flatten()
        .find(|v| v.name == "secretsByNode")
        .expect("secretsByNode")
        .expression
        .clone();
    for (node, secret) in [
        ("worker-1", "rook-ceph-osd-encryption-key-set1-data-0-abcde"),
        ("worker-1", "rook-ceph-osd-encryption-key-set1-data-3-pqrst"),
        ("worker-2", "rook-ceph-osd-encryption-key-set1-data-1-fghij"),
    ] {
        let entry = secrets_by_node
            .split(&format!("'{node}': ["))
            .nth(1)
            .and_then(|r| r.split(']').next())
            .unwrap_or_else(|| panic!("{node} in {secrets_by_node}"));
        assert!(entry.contains(&format!("'{secret}'")), "{node}: {entry}");
    }
    let written = objects_of(
        &generated(&["--policy", "storage-keys"], &example),
        "--policy storage-keys",
    );
    assert!(
        written[0].value["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .is_some_and(|e| e.contains("'system:serviceaccount:storage-keys:keyplan'")),
        "{:?}",
        written[0].value
    );

    // A node name too long for keyplan-node-<node> (over 240 bytes): the report name the agent
    // uses.
    let long = [
        "a".repeat(60),
        "b".repeat(60),
        "c".repeat(60),
        "d".repeat(62),
    ]
    .join(".");
    assert!(long.len() > 240 && long.len() <= 253);
    let input_long = pv_list(
        "rook-ceph",
        &[
            ("pv-a", "set1-data-0-abcde", &long, Some("/dev/sdb")),
            ("pv-b", "set1-data-1-fghij", "worker-2", Some("/dev/sdb")),
        ],
    );
    let (_, plan) = generated_plan(&[], &input_long, tmp.path());
    let rbac = rbac_of(&generated(&["--role"], &input_long), "--role (long node)");
    check_fleet_role(&rbac.agent.1, &plan, "--role (long node)");
    assert!(
        report_names(&plan).contains(&report_name(&long)),
        "{:?}",
        report_names(&plan)
    );

    // Rook in another namespace, keyplan's ServiceAccount in another.
    let text = generated(
        &["--namespace", "storage", "--role", "fleet"],
        &list("storage"),
    );
    let rbac = rbac_of(&text, "--role fleet");
    assert_eq!(rbac.agent.0.namespace.as_deref(), Some("fleet"));
    assert_eq!(rbac.agent_binding.0.namespace.as_deref(), Some("fleet"));
    assert_eq!(rbac.keys.0.namespace.as_deref(), Some("storage"));
    assert_eq!(rbac.keys_binding.0.namespace.as_deref(), Some("storage"));
    let (_, plan) = generated_plan(&["--namespace", "storage"], &list("storage"), tmp.path());
    check_fleet_role(&rbac.agent.1, &plan, "--role fleet");
    check_secrets_role(&rbac.keys.1, &secrets_of(&plan)["storage"], "--role fleet");
    let fleet_sa = vec![(
        "ServiceAccount".to_string(),
        "keyplan".to_string(),
        Some("fleet".to_string()),
    )];
    assert_eq!(bound(&rbac.agent_binding.1), fleet_sa);
    assert_eq!(bound(&rbac.keys_binding.1), fleet_sa);

    // No OSD: no Role (empty resourceNames would grant every Secret and every ConfigMap), no
    // slot (every Lease): nothing on stdout.
    for (args, input, why) in [
        (&["--role"][..], list("elsewhere"), "nothing was written"),
        (
            &["--role", "Not_A_Namespace"][..],
            input.clone(),
            "is not a Kubernetes namespace name",
        ),
        (
            &["--max-concurrent-nodes", "0", "--role"][..],
            input.clone(),
            "is below 1",
        ),
        (
            &["--max-concurrent-nodes", "0"][..],
            input.clone(),
            "is below 1",
        ),
    ] {
        let out = generator(args, &input);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(err.contains(why), "{args:?}: {err}");
    }

    // The overlay of README.md: the generated plan and RBAC replace the example's.
    let overlay = tmp.path().join("my-cluster");
    std::fs::create_dir(&overlay).expect("mkdir");
    let overlay = overlay.canonicalize().expect("canonical");
    let three = ["--max-concurrent-nodes", "3"];
    let (plan_text, _) = generated_plan(&three, &input, &overlay);
    std::fs::rename(overlay.join("keyplan.yaml"), overlay.join("plan.yaml")).expect("rename");
    let rbac_text = generated(&["--max-concurrent-nodes", "3", "--role"], &input);
    std::fs::write(overlay.join("rbac.yaml"), &rbac_text).expect("write rbac.yaml");
    let base_dir = relative(&overlay, &dir().canonicalize().expect("canonical"));
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            r#"resources:
  - {}
configMapGenerator:
  - name: keyplan-plan
    namespace: keyplan
    behavior: replace
    files: [plan.yaml]
    options:
      disableNameSuffixHash: true
patches:
  - path: rbac.yaml
"#,
            base_dir.display()
        ),
    )
    .expect("write kustomization.yaml");
    let Ok(out) = Command::new("kubectl")
        .arg("kustomize")
        .arg(&overlay)
        .output()
    else {
        eprintln!("overlay not built: kubectl is not installed");
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = objects_of(
        &String::from_utf8_lossy(&out.stdout),
        "kubectl kustomize my-cluster",
    );
    let rbac = rbac_of(&rbac_text, "--role");
    for (o, role) in [&rbac.agent, &rbac.keys] {
        let (b, built_role) = one::<Role>(&built, "Role", &o.name);
        assert_eq!(b.namespace, o.namespace);
        assert_eq!(
            built_role.rules,
            role.rules,
            "{}: the overlay's rules",
            o.id()
        );
    }
    let (_, cm) = one::<ConfigMap>(&built, "ConfigMap", "keyplan-plan");
    assert_eq!(
        cm.data.as_ref().and_then(|d| d.get("plan.yaml")),
        Some(&plan_text),
        "the overlay's plan"
    );
}

/// The signed-plans component (components/signed-plans): a kustomize Component whose JSON
/// patch, applied to the base DaemonSet, gives an agent command line keyplan accepts, with
/// `--cluster` and `--trusted-keys` naming the mount of a Secret volume that is not optional
/// (a missing Secret stops the pod rather than dropping the signature check); the plan's
/// ConfigMap is mounted whole, so its `plan.yaml.sig` key is beside `plan.yaml`.
#[test]
fn the_signed_plans_component_patches_the_daemonset() {
    let path = dir().join("components/signed-plans/kustomization.yaml");
    let docs = documents(&read(&path), "components/signed-plans/kustomization.yaml");
    assert_eq!(docs.len(), 1);
    let c = &docs[0];
    assert_eq!(c["apiVersion"], "kustomize.config.k8s.io/v1alpha1");
    assert_eq!(c["kind"], "Component");
    let patches = c["patches"].as_array().expect("patches");
    assert_eq!(patches.len(), 1);
    let target = &patches[0]["target"];
    assert_eq!(
        (&target["kind"], &target["name"], &target["namespace"]),
        (
            &Value::from("DaemonSet"),
            &Value::from("keyplan-agent"),
            &Value::from("keyplan")
        )
    );
    let ops: json_patch::Patch = serde_json::from_value(
        documents(
            patches[0]["patch"].as_str().expect("an inline patch"),
            "the patch",
        )
        .into_iter()
        .next()
        .expect("one document"),
    )
    .expect("a JSON patch");
    let objs = objects();
    let base = objs
        .iter()
        .find(|o| o.kind == "DaemonSet" && o.name == "keyplan-agent")
        .expect("the DaemonSet");
    let mut patched = base.value.clone();
    json_patch::patch(&mut patched, &ops).expect("the patch applies to the base");
    let obj = Object {
        value: patched,
        ..base.clone()
    };
    let a = agent(std::slice::from_ref(&obj));
    let keys_dir = a.arg("--trusted-keys").to_owned();
    assert!(!a.arg("--cluster").is_empty());
    let secret = a
        .volume_at(&keys_dir)
        .secret
        .clone()
        .expect("--trusted-keys is a Secret volume");
    assert_eq!(secret.secret_name.as_deref(), Some("keyplan-trusted-keys"));
    assert_ne!(
        secret.optional,
        Some(true),
        "the Secret must not be optional"
    );
    assert!(secret.items.is_none(), "every key of the Secret is trusted");
    let (cm, key) = a.config_map_of("--plan");
    assert_eq!((cm.as_str(), key.as_str()), ("keyplan-plan", "plan.yaml"));
    // keyplan's own parser takes the patched command line.
    use clap::Parser as _;
    keyplan::cli::Cli::try_parse_from(&a.argv).expect("keyplan accepts the patched args");
}

/// `--policy` writes names into CEL string literals: a name that is no Kubernetes object name
/// (a quote would end the literal) is refused, and so are two nodes' Secrets one of which is
/// a version name of the other's (the policy could not keep them apart); nothing is written.
#[test]
fn the_policy_generator_refuses_names_it_cannot_keep_apart() {
    if Command::new(python()).arg("--version").output().is_err() {
        eprintln!("skipped: python3 is not installed");
        return;
    }
    let quoted = pv_list(
        "rook-ceph",
        &[("pv-a", "set1-data-0", "wor'ker-1", Some("/dev/sdb"))],
    );
    let overlap = pv_list(
        "rook-ceph",
        &[
            ("pv-a", "set1-data-0", "worker-1", Some("/dev/sdb")),
            ("pv-b", "set1-data-0-v1", "worker-2", Some("/dev/sdb")),
        ],
    );
    for (input, why) in [
        (quoted, "is not a Kubernetes object name"),
        (overlap, "could not keep them apart"),
    ] {
        let out = generator(&["--policy"], &input);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(out.stdout.is_empty(), "nothing on stdout");
        assert!(err.contains(why), "{err}");
    }
}
