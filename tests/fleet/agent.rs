//! `keyplan agent` (issue 15): agent processes against an API server (Leases, ConfigMaps,
//! Events), each with its own LUKS image files, state directory and node name, the plan in a
//! directory laid out as the kubelet lays out a ConfigMap volume (and swapped as it swaps one).
//!
//! `agent_refuses_and_reports`, `agent_requires_signed_plans`, `fleet_plan_of_a_pull_request`,
//! `a_kms_outage_before_any_change_does_not_halt_the_fleet` and `shared_key_on_three_nodes`
//! run against the real control plane (tests/common/kube.rs), each in a fresh namespace:
//! deploy/kubernetes/rbac.yaml is applied to it (its report and slot names made those of the
//! test's nodes and slots) and the agents authenticate with a TokenRequest token of its
//! ServiceAccount `keyplan`, through the logging proxy of tests/common/kube_proxy.rs;
//! `keyplan fleet` commands run as ServiceAccount `operator`. `simulated_fleet` and
//! `rollout_benchmark` do the same with 20 (100) agents.
//!
//! - `agent_refuses_and_reports`: a subPath-style plan file is refused at start; a plan whose
//!   KMS is not in the agent's configuration changes nothing and is reported `refused` with a
//!   `PlanRefused` Event; the fixed plan is applied without a rollout slot being kept;
//!   `/metrics` carries the node label and `/healthz` answers; SIGTERM stops it cleanly.
//! - `agent_requires_signed_plans`: an agent with `--trusted-keys` (two keys) and `--cluster`
//!   refuses an unsigned plan (nothing runs), runs a signed one, refuses a tampered byte, a
//!   wrong key, another cluster's plan and a replayed older plan while it keeps running the
//!   last good one, accepts the second trusted key (signing-key rotation), and after a restart
//!   runs the kept good plan while the ConfigMap holds a tampered one; each refusal is in the
//!   report, an Event, `/metrics` and `fleet status`.
//! - `fleet_plan_of_a_pull_request`: `keyplan fleet plan` from two real agents' published
//!   observations (one with a drifted device, reported while the rollout is halted): the
//!   diff names both nodes' changes, a stale observation and an unreported node exit 1, and
//!   only the reports are read.
//! - `simulated_fleet` (`KEYPLAN_FLEET_NODES`, default 20): keys in a real OpenBao; an
//!   enrollment rollout with one agent killed for good mid-run (its slot expires and the
//!   rollout goes on); a rotation rollout with agents killed (`kill -9`) mid-rotation and
//!   restarted; OpenBao sealed while both running nodes are held just before their commits
//!   (the `commit.before=return(wait:PATH)` gate of src/failpoint.rs), so that
//!   `max_failed_nodes` failed runs halt the rollout (nodes that cannot observe or plan while
//!   it is sealed do not count); unseal,
//!   `keyplan fleet clear`, convergence. All along: never more nodes applying than
//!   `max_concurrent_nodes`, and every device opens with its key's current version in OpenBao.
//!   With `KEYPLAN_FLEET_FIGURES=FILE` it writes its figures (JSON) there
//!   (benches/fleet_rollout.sh).
//! - `a_kms_outage_before_any_change_does_not_halt_the_fleet`: a node waiting for a slot with
//!   its work known when the KMS stops answering reports `error` (an `ObservationFailed` Event,
//!   `keyplan_agent_observation_failures_total`), records no failure, does not halt the
//!   fleet, and applies by itself once the KMS answers again.
//! - `control_plane_restarts_mid_rollout`: kube-apiserver killed and restarted while a node
//!   holds the slot mid-run, etcd killed and restarted mid-rotation (a control plane of the
//!   test's own): no lock-out at any instant, never two slot holders, no failed run, every
//!   node converges.
//! - `shared_key_on_three_nodes`: one key on devices of three nodes, rotated as one two-phase
//!   commit through the KMS's holder records: each agent `kill -9`ed at every kind of step,
//!   a witness polling that the current version opens every device; a node stopped for good
//!   blocks the commit (reported by name) until it returns, or leaves the plan.

use crate::common::kube;
use crate::common::kube_proxy;
use crate::common::openbao;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

const NS: &str = "keyplan";

/// The two tests that run many agents at once (`simulated_fleet`, `shared_key_on_three_nodes`)
/// take turns: side by side on a 2-core CI machine, the second one's load made the first
/// one's timing assumptions fail.
pub(crate) static MANY_AGENTS: Mutex<()> = Mutex::new(());

/// A directory laid out as the kubelet lays out a ConfigMap volume: `..<ts>/plan.yaml`,
/// `..data -> ..<ts>`, `plan.yaml -> ..data/plan.yaml`; [`ConfigMapDir::write`] swaps it as
/// the kubelet's atomic writer does (new directory, new link renamed over `..data`).
pub(crate) struct ConfigMapDir {
    dir: PathBuf,
    n: usize,
}

impl ConfigMapDir {
    pub(crate) fn new(dir: PathBuf, text: &str) -> ConfigMapDir {
        std::fs::create_dir_all(&dir).expect("mkdir");
        let mut c = ConfigMapDir { dir, n: 0 };
        c.write(text);
        std::os::unix::fs::symlink("..data/plan.yaml", c.dir.join("plan.yaml")).expect("link");
        c
    }

    pub(crate) fn plan(&self) -> PathBuf {
        self.dir.join("plan.yaml")
    }

    pub(crate) fn write(&mut self, text: &str) {
        self.write_signed(text, None);
    }

    /// A new version with `plan.yaml` and, when given, `plan.yaml.sig` (one ConfigMap with
    /// two keys: both change in the same swap).
    fn write_signed(&mut self, text: &str, signature: Option<&[u8]>) {
        self.n += 1;
        let ts = format!("..2026_12_01_00_00_{:02}.{:09}", self.n, self.n);
        std::fs::create_dir(self.dir.join(&ts)).expect("mkdir ts");
        std::fs::write(self.dir.join(&ts).join("plan.yaml"), text).expect("write plan");
        if let Some(sig) = signature {
            std::fs::write(self.dir.join(&ts).join("plan.yaml.sig"), sig).expect("write sig");
            let link = self.dir.join("plan.yaml.sig");
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink("..data/plan.yaml.sig", &link).expect("link sig");
            }
        }
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&ts, &tmp).expect("link tmp");
        std::fs::rename(&tmp, self.dir.join("..data")).expect("swap ..data");
    }
}

/// Where the reports and slots of a test live: a fresh namespace of
/// the real control plane (tests/common/kube.rs) read as admin.
pub(crate) trait FleetApi {
    fn configmap_of(&self, name: &str) -> Option<Value>;
    /// Every ConfigMap of the namespace, from one list request.
    fn configmaps(&self) -> Vec<Value>;
    fn leases(&self) -> Vec<Value>;
}

impl<T: FleetApi> FleetApi for Arc<T> {
    fn configmap_of(&self, name: &str) -> Option<Value> {
        (**self).configmap_of(name)
    }
    fn configmaps(&self) -> Vec<Value> {
        (**self).configmaps()
    }
    fn leases(&self) -> Vec<Value> {
        (**self).leases()
    }
}

/// A test's fleet namespace on the real control plane, deploy/kubernetes/rbac.yaml applied
/// to it (namespace `keyplan` moved to `ns`, `rook-ceph` to `rook_ns`), and a logging proxy
/// in front of the API server for the agents.
pub(crate) struct Real {
    c: &'static kube::Cluster,
    proxy: kube_proxy::KubeProxy,
    pub(crate) ns: String,
    rook_ns: String,
    /// `system:serviceaccount:<ns>:keyplan`, the agents' user.
    agent_user: String,
    /// The agents' token files (outside the scratch directory, whose files the leak checks
    /// scan), one per node, as the kubelet projects a pod's token into its volume.
    tokens: tempfile::TempDir,
}

/// Each node's kubeconfig from [`Real::agent_kubeconfig`].
pub(crate) struct Kubeconfigs(BTreeMap<String, PathBuf>);

impl Kubeconfigs {
    /// Node `node`'s kubeconfig (its own node-bound token).
    pub(crate) fn of(&self, node: &str) -> &Path {
        self.0
            .get(node)
            .unwrap_or_else(|| panic!("no kubeconfig for node {node}"))
    }
}

impl FleetApi for Real {
    fn configmap_of(&self, name: &str) -> Option<Value> {
        self.c.configmap(&self.ns, name)
    }
    fn configmaps(&self) -> Vec<Value> {
        self.c.configmaps(&self.ns)
    }
    fn leases(&self) -> Vec<Value> {
        self.c.objects("leases", &self.ns)
    }
}

impl Real {
    /// `None` (the test is skipped) when the control plane's binaries are missing.
    pub(crate) fn new(prefix: &str) -> Option<Real> {
        Some(Real::on(kube::Cluster::get()?, prefix))
    }

    /// Like [`Real::new`], on the control plane `c` (a [`kube::Cluster::private`] one).
    fn on(c: &'static kube::Cluster, prefix: &str) -> Real {
        let ns = c.fresh_namespace(prefix);
        let rook_ns = c.fresh_namespace(&format!("{prefix}-rook"));
        let proxy = kube_proxy::KubeProxy::start(c);
        let agent_user = format!("system:serviceaccount:{ns}:keyplan");
        Real {
            c,
            proxy,
            ns,
            rook_ns,
            agent_user,
            tokens: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// deploy/kubernetes/rbac.yaml and admission-policy.yaml applied as the generator writes
    /// them for a cluster with nodes `nodes` (reports `keyplan-node-<node>`) and, when given,
    /// `slots` slots; each node's kubeconfig (through the proxy) reads its token from a file, a
    /// TokenRequest token of ServiceAccount `keyplan` bound to a Pod on that Node, so it
    /// carries the node's name as the kubelet's projected token does.
    pub(crate) fn agent_kubeconfig(&self, nodes: &[String], slots: Option<usize>) -> Kubeconfigs {
        self.apply_agent_rbac(nodes, slots);
        self.apply_admission_policy(&[]);
        Kubeconfigs(
            nodes
                .iter()
                .map(|n| (n.clone(), self.node_kubeconfig(n)))
                .collect(),
        )
    }

    /// Node `node`'s token file (a fresh pod-bound token, the Pod `keyplan-<node>` created on
    /// first use) and a kubeconfig reading it.
    fn node_kubeconfig(&self, node: &str) -> PathBuf {
        let client = self.c.node_client(&self.ns, "keyplan", node);
        let file = self.tokens.path().join(format!("token-{node}"));
        std::fs::write(&file, &client.token).expect("write the token file");
        self.proxy.kubeconfig_with_token_file(&self.ns, &file)
    }

    /// deploy/kubernetes/admission-policy.yaml for this test's namespace: its own policy and
    /// binding (cluster-scoped, so named after the namespace), matching this namespace's
    /// ServiceAccount `keyplan`, with `secrets` (node, Secret names) as `secretsByNode`.
    fn apply_admission_policy(&self, secrets: &[(&str, &[&str])]) {
        let mut yaml = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/admission-policy.yaml"),
        )
        .expect("deploy/kubernetes/admission-policy.yaml");
        let user = "system:serviceaccount:keyplan:keyplan";
        assert!(yaml.contains(user), "admission-policy.yaml's user moved");
        yaml = yaml.replace(user, &format!("system:serviceaccount:{}:keyplan", self.ns));
        let line = yaml
            .lines()
            .skip_while(|l| !l.contains("- name: secretsByNode"))
            .nth(1)
            .expect("admission-policy.yaml's secretsByNode")
            .to_string();
        let cel = secrets
            .iter()
            .map(|(n, names)| {
                let list: Vec<String> = names.iter().map(|s| format!("'{s}'")).collect();
                format!("'{n}': [{}]", list.join(", "))
            })
            .collect::<Vec<_>>()
            .join(", ");
        yaml = yaml.replace(&line, &format!("      expression: \"{{{cel}}}\""));
        let name = "keyplan-agent-node-scope";
        yaml = yaml.replace(
            &format!("name: {name}\n"),
            &format!("name: {name}-{}\n", self.ns),
        );
        yaml = yaml.replace(
            &format!("policyName: {name}\n"),
            &format!("policyName: {name}-{}\n", self.ns),
        );
        self.c.apply_yaml(&yaml, &[]);
        // The API server loads policies and bindings from its informers: wait until it
        // enforces this one (a token without a node name is refused a dry-run write that RBAC
        // alone allows).
        self.c.service_account(&self.ns, "keyplan");
        let nameless = self.c.service_account_token(&self.ns, "keyplan", &[], None);
        let path = format!("/api/v1/namespaces/{}/configmaps?dryRun=All", self.ns);
        let probe = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "keyplan-node-probe"}});
        wait_for(
            60,
            "the admission policy to be enforced",
            || {
                let r = self.c.request_as(&nameless, "POST", &path, Some(&probe));
                r.status == 403
                    && r.body["message"]
                        .to_string()
                        .contains("ValidatingAdmissionPolicy")
            },
            String::new,
        );
    }

    /// deploy/kubernetes/rbac.yaml with the report names of `nodes` and, when given, `slots`
    /// slot Leases.
    fn apply_agent_rbac(&self, nodes: &[String], slots: Option<usize>) {
        let mut yaml = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/rbac.yaml"),
        )
        .expect("deploy/kubernetes/rbac.yaml");
        let list = |names: Vec<String>| {
            format!(
                "resourceNames: [{}]",
                names
                    .iter()
                    .map(|n| format!("{n:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let nodes_line = r#"resourceNames: ["keyplan-node-worker-1", "keyplan-node-worker-2", "keyplan-node-worker-3"]"#;
        assert!(yaml.contains(nodes_line), "rbac.yaml's report names moved");
        yaml = yaml.replace(
            nodes_line,
            &list(nodes.iter().map(|n| format!("keyplan-node-{n}")).collect()),
        );
        if let Some(n) = slots {
            let slots_line = r#"resourceNames: ["keyplan-rollout-0", "keyplan-rollout-1"]"#;
            assert!(yaml.contains(slots_line), "rbac.yaml's slot names moved");
            yaml = yaml.replace(
                slots_line,
                &list((0..n).map(|i| format!("keyplan-rollout-{i}")).collect()),
            );
        }
        self.c
            .apply_yaml(&yaml, &[(NS, &self.ns), ("rook-ceph", &self.rook_ns)]);
        self.c.service_account(&self.ns, "keyplan");
    }

    /// The operator's kubeconfig for `keyplan fleet` commands, through the proxy (its
    /// requests are logged under `system:serviceaccount:<ns>:operator`): ServiceAccount
    /// `operator`, bound in the namespace (a RoleBinding) to the ClusterRole `cluster-admin`
    /// (not `admin`: its rules are aggregated by kube-controller-manager, which does not run
    /// here, so it grants nothing). Its own ServiceAccount, so the proxy's log tells the
    /// operator's requests from the agents' and the harness's (`harness-admin`); the admin
    /// certificate would send no token through the proxy.
    fn operator_kubeconfig(&self) -> PathBuf {
        self.c.service_account(&self.ns, "operator");
        self.c.ensure(
            &format!(
                "/apis/rbac.authorization.k8s.io/v1/namespaces/{}/rolebindings",
                self.ns
            ),
            &serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding", "metadata": {"name": "operator"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "operator",
                    "namespace": self.ns}]}),
        );
        let token = self
            .c
            .service_account_token(&self.ns, "operator", &[], None);
        self.proxy.kubeconfig_with_token(&self.ns, &token)
    }
}

pub(crate) struct Agent {
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) log: PathBuf,
    pub(crate) child: Option<Child>,
    /// Unix seconds of the last (re)start.
    pub(crate) started: u64,
}

impl Agent {
    pub(crate) fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log");
        let mut cmd = keyplan_command();
        cmd.args(&self.args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("spawn agent"));
        self.started = now();
    }

    pub(crate) fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait up to `secs` for the exit; its exit status.
    pub(crate) fn term(&mut self, secs: u64) -> Option<i32> {
        let mut c = self.child.take()?;
        unsafe {
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(secs) {
            if let Ok(Some(st)) = c.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The report document of `node`, if any.
pub(crate) fn report(fake: &impl FleetApi, node: &str) -> Option<Value> {
    let cm = fake.configmap_of(&format!("keyplan-node-{node}"))?;
    serde_json::from_str(cm["data"]["report.json"].as_str()?).ok()
}

/// Every node's report by node name, from one list request: one snapshot of the API server.
/// (Reports read one by one are not: a node that finished after its report was read is counted
/// running beside one that started before its own was read.)
fn reports(fake: &impl FleetApi) -> BTreeMap<String, Value> {
    fake.configmaps()
        .iter()
        .filter_map(|cm| {
            let r: Value = serde_json::from_str(cm["data"]["report.json"].as_str()?).ok()?;
            Some((r["node"].as_str()?.to_string(), r))
        })
        .collect()
}

fn state(fake: &impl FleetApi, node: &str) -> String {
    report(fake, node)
        .and_then(|r| r["state"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Waits up to `secs` for `cond`, polling every 200 ms; panics with `what` and `dump()`.
pub(crate) fn wait_for(
    secs: u64,
    what: &str,
    mut cond: impl FnMut() -> bool,
    dump: impl Fn() -> String,
) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("timed out after {secs} s waiting for {what}\n{}", dump());
}

/// The live holders of the rollout slot Leases now.
pub(crate) fn holders(fake: &impl FleetApi) -> Vec<String> {
    fake.leases()
        .iter()
        .filter_map(|l| {
            let h = l["spec"]["holderIdentity"].as_str()?.to_string();
            (!h.is_empty()).then_some(h)
        })
        .collect()
}

fn agent_args(
    node: &str,
    plan: &Path,
    config: &Path,
    state: &Path,
    kubeconfig: &Path,
    extra: &[&str],
) -> Vec<String> {
    let mut a: Vec<String> = [
        "--node",
        node,
        "--state-dir",
        &state.display().to_string(),
        "--log-format",
        "json",
        "agent",
        "--plan",
        &plan.display().to_string(),
        "--config",
        &config.display().to_string(),
        "--kubeconfig",
        &kubeconfig.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port")
}

/// One HTTP/1.0 GET of `path` on 127.0.0.1:`port`: (status, body).
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}

#[test]
fn agent_refuses_and_reports() {
    let s = Scratch::new();
    let Some(fake) = Real::new("fleet-refuses") else {
        return;
    };
    let kubeconfig = fake
        .agent_kubeconfig(&["worker-1".to_string()], None)
        .of("worker-1")
        .to_path_buf();
    let img = s.small_image("disk.img", "luks2");
    let initial = s.initial_pass();
    let keys = s.path("keys");
    let plan_text = |kms_path: &Path| {
        format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: {} }}\nkeys:\n  k1: {{ kms: local }}\ndevices:\n  d1: {{ path: {}, node: worker-1, keys: [k1], enroll_with: {} }}\n  d2: {{ path: /nonexistent/other.img, node: worker-2, keys: [k2] }}\n{FAST_PBKDF}",
            kms_path.display(),
            img.display(),
            initial.display()
        )
        .replace("keys:\n  k1: { kms: local }", "keys:\n  k1: { kms: local }\n  k2: { kms: local }")
    };
    let config = file_agent_config(&s, &keys);

    // A plain file (what a subPath mount looks like) is refused at start.
    let plain = s.plan("plain.yaml", &plan_text(&keys));
    let out = keyplan_command()
        .args(agent_args(
            "worker-1",
            &plain,
            &config,
            &s.path("state"),
            &kubeconfig,
            &[],
        ))
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("subPath") && err.contains("ConfigMap"),
        "{err}"
    );

    // A plan naming another file KMS directory than the agent's is refused; nothing changes.
    let other_keys = s.path("elsewhere");
    let mut cm = ConfigMapDir::new(s.path("plan-volume"), &plan_text(&other_keys));
    let before = keyslots(&img);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut agent = Agent {
        args: agent_args(
            "worker-1",
            &cm.plan(),
            &config,
            &s.path("state"),
            &kubeconfig,
            &[
                "--namespace",
                &fake.ns,
                "--interval",
                "3s",
                "--poll",
                "1s",
                "--slot-duration",
                "5s",
                "--listen",
                &listen,
            ],
        ),
        env: vec![],
        log: s.path("agent.log"),
        child: None,
        started: 0,
    };
    agent.spawn();
    let log = || std::fs::read_to_string(s.path("agent.log")).unwrap_or_default();
    wait_for(
        30,
        "the plan to be refused",
        || state(&fake, "worker-1") == "refused",
        log,
    );
    let r = report(&fake, "worker-1").expect("report");
    assert!(
        r["message"]
            .as_str()
            .unwrap_or("")
            .contains("is not the agent's"),
        "{r}"
    );
    assert_eq!(keyslots(&img), before, "a refused plan changed the device");
    assert!(
        !other_keys.exists(),
        "a refused plan created its KMS directory"
    );
    assert!(
        fake.c
            .events(&fake.ns)
            .iter()
            .any(|e| e["reason"] == "PlanRefused"),
        "no PlanRefused event"
    );

    // A plan whose devices name no node would be every node's: refused.
    cm.write(
        &plan_text(&keys)
            .replace(", node: worker-1", "")
            .replace(", node: worker-2", ""),
    );
    wait_for(
        30,
        "the nodeless plan to be refused",
        || {
            report(&fake, "worker-1").is_some_and(|r| {
                r["state"] == "refused"
                    && r["message"]
                        .as_str()
                        .unwrap_or("")
                        .contains("names its node")
            })
        },
        log,
    );
    assert_eq!(keyslots(&img), before, "a refused plan changed the device");

    // The fixed plan (the ConfigMap updated in place) is applied; the slot is released.
    cm.write(&plan_text(&keys));
    wait_for(
        60,
        "worker-1 in sync",
        || {
            state(&fake, "worker-1") == "in_sync"
                && report(&fake, "worker-1").is_some_and(|r| r["last_run"]["outcome"] == "success")
        },
        log,
    );
    let r = report(&fake, "worker-1").expect("report");
    assert_eq!(keyslots(&img).len(), 2, "{r}");
    let pass = std::fs::read_dir(&keys).ok().map(|_| ()).is_some();
    assert!(pass, "the key was not created in the agent's KMS");
    assert_eq!(r["devices"][0]["id"], "d1", "{r}");
    assert_eq!(r["keys"][0]["current_version"], 1, "{r}");
    // The report is written before the slot is released: the release follows at once.
    wait_for(
        10,
        "the slot to be released",
        || holders(&fake).is_empty(),
        || format!("{:?}", holders(&fake)),
    );
    // The run's closing Event follows the release (a waiting node is not kept waiting for
    // it): waited for as an API object.
    let reasons = || -> Vec<String> {
        fake.c
            .events(&fake.ns)
            .iter()
            .filter_map(|e| e["reason"].as_str().map(str::to_string))
            .collect()
    };
    wait_for(
        30,
        "the RunStarted and RunSucceeded Events",
        || {
            let r = reasons();
            r.iter().any(|r| r == "RunStarted") && r.iter().any(|r| r == "RunSucceeded")
        },
        || format!("{:?}", reasons()),
    );

    // An idle cycle touches no Lease.
    // Waits for two heartbeats (report writes) in the proxy's log rather than a fixed time.
    let mark = fake.proxy.mark();
    let report_path = format!(
        "/api/v1/namespaces/{}/configmaps/keyplan-node-worker-1",
        fake.ns
    );
    wait_for(
        20,
        "two heartbeats",
        || {
            fake.proxy
                .requests_since(mark)
                .iter()
                .filter(|r| r.method == "PUT" && r.path == report_path)
                .count()
                >= 2
        },
        || format!("{:?}", fake.proxy.requests_since(mark)),
    );
    let idle = fake.proxy.requests_since(mark);
    assert!(
        idle.iter().all(|r| !r.path.contains("/leases")),
        "an idle agent touched Leases: {idle:?}"
    );

    // Metrics with the node label, and health.
    let (code, body) = http_get(port, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    assert!(
        body.contains("keyplan_key_current_version{node=\"worker-1\",key=\"k1\""),
        "{body}"
    );
    assert!(
        body.contains("keyplan_agent_runs_total{node=\"worker-1\",outcome=\"success\"} 1"),
        "{body}"
    );
    assert_eq!(http_get(port, "/healthz").map(|(c, _)| c), Some(200));

    // The JSON log has the run's events.
    let text = log();
    for ev in ["run_initiated", "step_started", "run_complete"] {
        assert!(
            text.contains(&format!("\"event\":\"{ev}\"")),
            "no {ev} in the log:\n{text}"
        );
    }

    // SIGTERM: exit 0, report stopped.
    assert_eq!(agent.term(30), Some(0), "{}", log());
    assert_eq!(state(&fake, "worker-1"), "stopped");

    // A node whose report is not renewed is lost: `fleet status` says so and exits 1.
    let full = fake.operator_kubeconfig();
    let status = |format: &str| {
        let out = keyplan_command()
            .args([
                "fleet",
                "status",
                "--namespace",
                &fake.ns,
                "--format",
                format,
                "--kubeconfig",
            ])
            .arg(&full)
            .output()
            .expect("fleet status");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, text) = status("text");
    // Stopped is what a rolling update shows for a moment: not a problem until it is lost.
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("worker-1") && text.contains("stopped"),
        "{text}"
    );
    fake.c
        .modify_configmap(&fake.ns, "keyplan-node-worker-1", |cm| {
            let mut r: Value =
                serde_json::from_str(cm["data"]["report.json"].as_str().unwrap_or("{}"))
                    .expect("report");
            r["updated_at"] = serde_json::json!(now() - 3600);
            cm["data"]["report.json"] = Value::String(r.to_string());
        });
    let (code, text) = status("json");
    assert_eq!(code, Some(1), "{text}");
    let doc: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(doc["nodes"][0]["state"], "lost", "{text}");
    assert_eq!(doc["totals"]["by_state"]["lost"], 1, "{text}");
    let (_, prom) = status("prometheus");
    assert!(
        prom.contains("keyplan_fleet_node_lost{node=\"worker-1\"} 1"),
        "{prom}"
    );

    // Clearing a node that has no report is an error (a typo in the node or namespace).
    let out = keyplan_command()
        .args([
            "fleet",
            "clear",
            "worker-9",
            "--namespace",
            &fake.ns,
            "--kubeconfig",
        ])
        .arg(&full)
        .output()
        .expect("fleet clear");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no report of node worker-9"), "{err}");

    // No key material in the report, the Events or the log.
    let material = file_kms_versions(&keys);
    assert!(!material.is_empty(), "no key version in the file KMS");
    let mut everything = log().into_bytes();
    for cm in fake.c.configmaps(&fake.ns) {
        everything.extend(cm.to_string().into_bytes());
    }
    for e in fake.c.events(&fake.ns) {
        everything.extend(e.to_string().into_bytes());
    }
    for secret in material.iter().map(|m| m.as_slice()).chain([INITIAL]) {
        for form in leak_forms(secret) {
            assert!(
                !contains(&everything, &form),
                "key material in the agent's report, Events or log"
            );
        }
    }
    // No request was refused by the Role.
    let denied: Vec<_> = fake
        .proxy
        .requests_by_user(&fake.agent_user)
        .into_iter()
        .filter(|r| r.code == 403)
        .collect();
    assert!(denied.is_empty(), "the Role refused: {denied:?}");
}

/// `keyplan sign` of `text` (written to `name` in the scratch directory) for `cluster` with
/// the private key file `key`: the signature file's bytes.
fn sign(s: &Scratch, name: &str, text: &str, cluster: &str, key: &Path) -> Vec<u8> {
    let plan = s.plan(name, text);
    let out = keyplan_command()
        .args(["sign"])
        .arg(&plan)
        .args(["--cluster", cluster, "--key"])
        .arg(key)
        .output()
        .expect("keyplan sign");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(format!("{}.sig", plan.display())).expect("signature file")
}

#[test]
fn agent_requires_signed_plans() {
    let s = Scratch::new();
    let Some(fake) = Real::new("fleet-signed") else {
        return;
    };
    let kubeconfig = fake
        .agent_kubeconfig(&["worker-1".to_string()], None)
        .of("worker-1")
        .to_path_buf();
    let img = s.small_image("disk.img", "luks2");
    let initial = s.initial_pass();
    let keys = s.path("keys");
    let config = file_agent_config(&s, &keys);
    // One key enrolled (plan 1), then a second one on the same device (plan 2).
    let plan_text = |keys_of_d1: &str| {
        format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: {} }}\nkeys:\n  k1: {{ kms: local }}\n  k2: {{ kms: local }}\ndevices:\n  d1: {{ path: {}, node: worker-1, keys: [{keys_of_d1}], enroll_with: {} }}\n{FAST_PBKDF}",
            keys.display(),
            img.display(),
            initial.display()
        )
    };
    let plan1 = plan_text("k1");
    let plan2 = plan_text("k1, k2");
    // Signing keys: the old and the new trusted one (a Secret volume with both), a stranger.
    let keygen = |name: &str| {
        let path = s.path(name);
        let out = keyplan_command()
            .args(["sign", "--generate-key"])
            .arg(&path)
            .output()
            .expect("keygen");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        path
    };
    let (old, new, stranger) = (keygen("old.key"), keygen("new.key"), keygen("stranger.key"));
    let trusted = s.path("trusted");
    let ts = trusted.join("..2026_12_01_00_00_00.1");
    std::fs::create_dir_all(&ts).expect("mkdir");
    for (k, name) in [(&old, "old.pub"), (&new, "new.pub")] {
        std::fs::copy(format!("{}.pub", k.display()), ts.join(name)).expect("copy pub");
        std::os::unix::fs::symlink(format!("..data/{name}"), trusted.join(name)).expect("link");
    }
    std::os::unix::fs::symlink("..2026_12_01_00_00_00.1", trusted.join("..data")).expect("link");

    let state_dir = s.path("state");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut cm = ConfigMapDir::new(s.path("plan-volume"), &plan1);
    let args = |trusted: &Path| {
        agent_args(
            "worker-1",
            &cm.plan(),
            &config,
            &state_dir,
            &kubeconfig,
            &[
                "--namespace",
                &fake.ns,
                "--interval",
                "3s",
                "--poll",
                "1s",
                "--listen",
                &listen,
                "--cluster",
                "prod",
                "--trusted-keys",
                &trusted.display().to_string(),
            ],
        )
    };

    // No fail-open at start: an empty trusted-keys directory, or keys without a cluster.
    let empty = s.path("empty-secret");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let out = keyplan_command().args(args(&empty)).output().expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("holds no key file"), "{err}");
    let mut without_cluster = args(&trusted);
    let at = without_cluster
        .iter()
        .position(|a| a == "--cluster")
        .expect("--cluster");
    without_cluster.drain(at..at + 2);
    let out = keyplan_command()
        .args(&without_cluster)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1), "a usage error exits 1: {out:?}");

    let log = || std::fs::read_to_string(s.path("agent.log")).unwrap_or_default();
    let mut agent = Agent {
        args: args(&trusted),
        env: vec![],
        log: s.path("agent.log"),
        child: None,
        started: 0,
    };
    let refused_for = |reason: &str| {
        report(&fake, "worker-1").is_some_and(|r| r["refused_plan"]["reason"] == reason)
    };
    let metrics = || {
        http_get(port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    };

    // 1. Unsigned, and no good plan yet: refused, nothing runs.
    let before = keyslots(&img);
    agent.spawn();
    wait_for(
        30,
        "the unsigned plan refused",
        || refused_for("unsigned") && state(&fake, "worker-1") == "refused",
        log,
    );
    assert_eq!(
        keyslots(&img),
        before,
        "an unsigned plan changed the device"
    );
    assert!(!keys.exists(), "an unsigned plan created its KMS directory");
    let m = metrics();
    assert!(
        m.contains("keyplan_agent_plan_refusals_total{node=\"worker-1\",reason=\"unsigned\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("keyplan_agent_plan_signature_verified{node=\"worker-1\"} 0"),
        "{m}"
    );

    // 2. Signed with the old key for this cluster: applied.
    let sig1 = sign(&s, "plan1.yaml", &plan1, "prod", &old);
    cm.write_signed(&plan1, Some(&sig1));
    wait_for(
        60,
        "plan 1 applied",
        || state(&fake, "worker-1") == "in_sync" && keyslots(&img).len() == 2,
        log,
    );
    let r = report(&fake, "worker-1").expect("report");
    assert!(r.get("refused_plan").is_none(), "{r}");
    let fp = |k: &Path| {
        let sig: Value =
            serde_json::from_slice(&sign(&s, "fp.yaml", &plan1, "prod", k)).expect("sig");
        sig["key"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(r["plan_signature"]["key"], fp(&old), "{r}");
    assert!(metrics().contains("keyplan_agent_plan_signature_verified{node=\"worker-1\"} 1"));
    let with_k1 = keyslots(&img);

    // 3. Refused while the last good plan keeps running: a tampered byte, a wrong key,
    // another cluster's signature. Plan 2 would add k2's keyslot; none appears. Plan 2's
    // signatures must be newer than plan 1's (a replay of an older signature is refused for
    // another reason), so wait for the clock to pass plan 1's `signed_at` second.
    let signed_at = |sig: &[u8]| {
        serde_json::from_slice::<Value>(sig).expect("signature")["signed_at"]
            .as_u64()
            .expect("signed_at")
    };
    let first = signed_at(&sig1);
    while keyplan::clock::now_unix() <= first {
        std::thread::sleep(Duration::from_millis(20));
    }
    let sig2_old = sign(&s, "plan2.yaml", &plan2, "prod", &old);
    let tampered = plan2.replacen("k1, k2", "k2, k1", 1);
    let cases: [(&str, String, Vec<u8>); 3] = [
        ("tampered", tampered.clone(), sig2_old.clone()),
        (
            "untrusted_key",
            plan2.clone(),
            sign(&s, "p2s.yaml", &plan2, "prod", &stranger),
        ),
        (
            "other_cluster",
            plan2.clone(),
            sign(&s, "p2c.yaml", &plan2, "staging", &old),
        ),
    ];
    for (reason, text, sig) in &cases {
        cm.write_signed(text, Some(sig));
        wait_for(
            30,
            &format!("the plan refused ({reason})"),
            || refused_for(reason),
            log,
        );
        let r = report(&fake, "worker-1").expect("report");
        assert_eq!(
            r["state"], "in_sync",
            "{reason}: the last good plan should keep running: {r}"
        );
        assert_eq!(
            r["plan_digest"].as_str(),
            Some(sha256_hex(plan1.as_bytes()).as_str()),
            "{r}"
        );
        assert_eq!(
            keyslots(&img),
            with_k1,
            "a refused plan ({reason}) changed the device"
        );
        assert!(
            fake.c
                .events(&fake.ns)
                .iter()
                .any(|e| e["reason"] == "PlanRefused"
                    && e["message"]
                        .as_str()
                        .unwrap_or("")
                        .contains(&format!("({reason})"))),
            "no PlanRefused Event for {reason}"
        );
        assert!(
            metrics().contains(&format!(
                "keyplan_agent_plan_refusals_total{{node=\"worker-1\",reason=\"{reason}\"}} 1"
            )),
            "{reason}"
        );
    }
    // fleet status says so and exits 1.
    let full = fake.operator_kubeconfig();
    let out = keyplan_command()
        .args(["fleet", "status", "--namespace", &fake.ns, "--kubeconfig"])
        .arg(&full)
        .output()
        .expect("fleet status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("refused (other_cluster), running the last good signed plan"),
        "{text}"
    );

    // 4. Signing-key rotation: plan 2 signed with the new (second trusted) key is applied.
    let sig2_new = sign(&s, "plan2n.yaml", &plan2, "prod", &new);
    cm.write_signed(&plan2, Some(&sig2_new));
    wait_for(
        60,
        "plan 2 applied",
        || state(&fake, "worker-1") == "in_sync" && keyslots(&img).len() == 3,
        log,
    );
    let r = report(&fake, "worker-1").expect("report");
    assert_eq!(r["plan_signature"]["key"], fp(&new), "{r}");
    assert!(r.get("refused_plan").is_none(), "{r}");
    let with_both = keyslots(&img);

    // 5. A replay of plan 1 with its own (valid, older) signature: refused.
    cm.write_signed(&plan1, Some(&sig1));
    wait_for(
        30,
        "the replayed plan refused",
        || refused_for("older"),
        log,
    );
    assert_eq!(keyslots(&img), with_both);

    // 6. Restarted while the ConfigMap holds a tampered plan: the kept good plan runs.
    assert_eq!(agent.term(30), Some(0), "{}", log());
    cm.write_signed(&tampered, Some(&sig2_new));
    agent.spawn();
    wait_for(
        30,
        "the restarted agent refuses the tampered plan",
        || refused_for("tampered") && state(&fake, "worker-1") == "in_sync",
        log,
    );
    let r = report(&fake, "worker-1").expect("report");
    assert_eq!(
        r["plan_digest"].as_str(),
        Some(sha256_hex(plan2.as_bytes()).as_str()),
        "{r}"
    );
    assert_eq!(r["plan_signature"]["key"], fp(&new), "{r}");
    assert_eq!(keyslots(&img), with_both);
    assert_eq!(agent.term(30), Some(0), "{}", log());

    // No private signing key in the log, reports or Events.
    let mut everything = log().into_bytes();
    for cm in fake.c.configmaps(&fake.ns) {
        everything.extend(cm.to_string().into_bytes());
    }
    for e in fake.c.events(&fake.ns) {
        everything.extend(e.to_string().into_bytes());
    }
    for k in [&old, &new, &stranger] {
        let pem = std::fs::read_to_string(k).expect("key");
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        assert!(
            !contains(&everything, body.as_bytes()),
            "a private signing key leaked"
        );
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `keyplan fleet plan` of a pull request's plan against two real agents' observations: the
/// fleet halted (another node's failure), so worker-2's agent reports the drift of its device
/// without repairing it; the diff names worker-1's new keyslot and worker-2's drift, a stale
/// observation and a node without a report fail the check, and no node or device is touched.
#[test]
fn fleet_plan_of_a_pull_request() {
    let s = Scratch::new();
    let Some(fake) = Real::new("fleet-pr") else {
        return;
    };
    let nodes = ["worker-1".to_string(), "worker-2".to_string()];
    let kubeconfig = fake.agent_kubeconfig(&nodes, None);
    let initial = s.initial_pass();
    let keys = s.path("keys");
    let imgs = [
        s.small_image("d1.img", "luks2"),
        s.small_image("d2.img", "luks2"),
    ];
    let config = file_agent_config(&s, &keys);
    let plan_text = |d1_keys: &str, extra: &str| {
        format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: {} }}\nkeys:\n  k1: {{ kms: local }}\n  k2: {{ kms: local }}\n  k3: {{ kms: local }}\ndevices:\n  d1: {{ path: {}, node: worker-1, keys: [{d1_keys}], enroll_with: {} }}\n  d2: {{ path: {}, node: worker-2, keys: [k2], enroll_with: {} }}\n{extra}{FAST_PBKDF}",
            keys.display(),
            imgs[0].display(),
            initial.display(),
            imgs[1].display(),
            initial.display()
        )
    };
    let cm = ConfigMapDir::new(s.path("plan-volume"), &plan_text("k1", ""));
    let mut agents: Vec<Agent> = nodes
        .iter()
        .map(|n| Agent {
            args: agent_args(
                n,
                &cm.plan(),
                &config,
                &s.path(&format!("{n}/state")),
                kubeconfig.of(n),
                &["--namespace", &fake.ns, "--interval", "2s", "--poll", "1s"],
            ),
            env: vec![],
            log: s.path(&format!("{n}.log")),
            child: None,
            started: 0,
        })
        .collect();
    for a in agents.iter_mut() {
        a.spawn();
    }
    let logs = || {
        nodes
            .iter()
            .map(|n| std::fs::read_to_string(s.path(&format!("{n}.log"))).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    };
    wait_for(
        90,
        "both nodes applied the plan",
        || {
            nodes.iter().all(|n| {
                report(&fake, n).is_some_and(|r| {
                    r["state"] == "in_sync" && r["last_run"]["outcome"] == "success"
                })
            })
        },
        logs,
    );

    // Another node's failed run halts the rollout: the agents observe and report, nothing more.
    let mut failing = report(&fake, "worker-1").expect("report");
    failing["node"] = "worker-9".into();
    failing["failure"] = serde_json::json!({"at": now(), "message": "test: a failed run"});
    failing["updated_at"] = now().into();
    fake.c.put_configmap(
        &fake.ns,
        serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "keyplan-node-worker-9", "namespace": fake.ns,
                "labels": {"app.kubernetes.io/name": "keyplan", "app.kubernetes.io/component": "node-report"}},
            "data": {"report.json": failing.to_string()},
        }),
    );
    // Drift on worker-2: keyplan's keyslot of k2 killed by hand.
    let recorded: Vec<u32> = keyslots(&imgs[1]).into_iter().filter(|k| *k != 0).collect();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let out = Command::new("cryptsetup")
        .args(["luksKillSlot", "--batch-mode"])
        .arg(&imgs[1])
        .arg(recorded[0].to_string())
        .output()
        .expect("cryptsetup");
    assert!(out.status.success(), "{out:?}");
    wait_for(
        60,
        "worker-2 reports its drift, halted",
        || {
            report(&fake, "worker-2").is_some_and(|r| {
                r["state"] == "halted" && r["observation"].to_string().contains("KeyslotGone")
            })
        },
        logs,
    );
    let hashes = || {
        imgs.iter()
            .map(|i| std::fs::read(i).expect("img"))
            .collect::<Vec<_>>()
    };
    let before = hashes();

    // The pull request: k3 on d1 as well.
    let pr = s.plan("pr.yaml", &plan_text("k1, k3", ""));
    let full = fake.operator_kubeconfig();
    let fleet_plan = |plan: &Path, extra: &[&str]| {
        let out = keyplan_command()
            .env("NO_COLOR", "1")
            .args(["fleet", "plan", "-f"])
            .arg(plan)
            .args(["--namespace", &fake.ns, "--kubeconfig"])
            .arg(&full)
            .args(extra)
            .output()
            .expect("fleet plan");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let mark = fake.proxy.mark();
    let (code, text) = fleet_plan(&pr, &["--detailed-exitcode"]);
    assert_eq!(code, Some(2), "{text}");
    assert!(text.contains("## node worker-1 (observed"), "{text}");
    assert!(text.contains("k3 v1"), "worker-1 adds k3: {text}");
    assert!(text.contains("## node worker-2 (observed"), "{text}");
    assert!(text.contains("Note: key k3 was not read"), "{text}");
    assert!(text.contains("Fleet: 2 node(s) to change"), "{text}");
    let (code, json) = fleet_plan(&pr, &["--json"]);
    assert_eq!(code, Some(0), "{json}");
    let doc: Value = serde_json::from_str(&json).expect("json");
    let node = |n: &str| {
        doc["nodes"]
            .as_array()
            .and_then(|ns| ns.iter().find(|x| x["node"] == n))
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(node("worker-1")["changes_present"], true, "{json}");
    assert_eq!(node("worker-2")["changes_present"], true, "{json}");
    let w2 = node("worker-2")["plan"]["keyslots"].to_string();
    assert!(w2.contains("k2"), "worker-2's drift repair names k2: {w2}");
    assert_eq!(
        doc["unplanned_nodes"],
        serde_json::json!(["worker-9"]),
        "{json}"
    );
    // Nothing but reading the reports.
    // (the agents' own heartbeats go on meanwhile)
    let requests: Vec<_> = fake
        .proxy
        .requests_since(mark)
        .into_iter()
        .filter(|r| r.user != fake.agent_user)
        .collect();
    assert!(!requests.is_empty());
    let reports = format!("/api/v1/namespaces/{}/configmaps", fake.ns);
    assert!(
        requests
            .iter()
            .all(|r| r.method == "GET" && r.path == reports),
        "{requests:?}"
    );
    assert_eq!(hashes(), before, "fleet plan changed a device");

    // A stale observation and a node without any report: flagged, exit 1.
    for a in agents.iter_mut() {
        assert_eq!(a.term(30), Some(0));
    }
    fake.c
        .modify_configmap(&fake.ns, "keyplan-node-worker-1", |cm| {
            let mut r: Value =
                serde_json::from_str(cm["data"]["report.json"].as_str().unwrap_or("{}"))
                    .expect("r");
            r["observation"]["observed_at"] = (now() - 7200).into();
            cm["data"]["report.json"] = Value::String(r.to_string());
        });
    let (code, text) = fleet_plan(&pr, &["--max-age", "15m"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("## node worker-1 (observed 2h ago: STALE"),
        "{text}"
    );
    let elsewhere = s.plan(
        "pr3.yaml",
        &plan_text("k1", "").replace("node: worker-2", "node: worker-3"),
    );
    let (code, text) = fleet_plan(&elsewhere, &[]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("## node worker-3: NOT OBSERVED"), "{text}");
}

/// The agents' configuration for the OpenBao at `addr` (token from `KP_AGENT_VAULT_TOKEN`;
/// `enroll_with` files from the scratch directory).
/// The agents' configuration for the file KMS at `keys` (`enroll_with` files anywhere in the
/// scratch directory).
pub(crate) fn file_agent_config(s: &Scratch, keys: &Path) -> PathBuf {
    let config = s.path("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "kms:\n  local: {{ provider: file, path: {} }}\nenroll_with_dirs: [{}]\n",
            keys.display(),
            s.dir.path().display()
        ),
    )
    .expect("config");
    config
}

fn vault_agent_config(s: &Scratch, addr: &str) -> PathBuf {
    let config = s.path("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "kms:\n  bao:\n    provider: vault\n    address: {addr}\n    mount: secret\n    auth: {{ method: token, token_env: KP_AGENT_VAULT_TOKEN }}\nenroll_with_dirs: [{}]\n",
            s.dir.path().display()
        ),
    )
    .expect("config");
    config
}

/// One agent per node of `names` (not started), each with its state directory and log under
/// `<scratch>/<node>/`; `paths` are the plan and the agent configuration, `kubeconfigs` the
/// nodes' kubeconfigs.
pub(crate) fn vault_agents(
    s: &Scratch,
    names: &[String],
    paths: &[&Path; 2],
    kubeconfigs: &Kubeconfigs,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Vec<Agent> {
    names
        .iter()
        .map(|n| Agent {
            args: agent_args(
                n,
                paths[0],
                paths[1],
                &s.path(&format!("{n}/state")),
                kubeconfigs.of(n),
                extra,
            ),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log: s.path(&format!("{n}/agent.log")),
            child: None,
            started: 0,
        })
        .collect()
}

/// A plan with one key and one device per node of `nodes` (names, image files, and the
/// passphrase file the devices are enrolled with): `kms` the entries under `kms:`, `key(node)`
/// the id and body of the node's key (`rotate_after: <rotate>` added when given), `fleet` the
/// body of `settings.fleet`; fast PBKDF.
fn per_node_plan(
    kms: &str,
    key: impl Fn(&str) -> (String, String),
    nodes: (&[String], &[PathBuf], &Path),
    rotate: Option<&str>,
    fleet: &str,
) -> String {
    let (names, images, initial) = nodes;
    let rotate = rotate
        .map(|r| format!(", rotate_after: {r}"))
        .unwrap_or_default();
    let mut t = format!("version: 1\nkms:\n{kms}keys:\n");
    for n in names {
        let (id, body) = key(n);
        t += &format!("  {id}: {{ {body}{rotate} }}\n");
    }
    t += "devices:\n";
    for (n, img) in names.iter().zip(images) {
        t += &format!(
            "  {n}: {{ path: {}, node: {n}, keys: [{}], enroll_with: {} }}\n",
            img.display(),
            key(n).0,
            initial.display()
        );
    }
    t + &format!("{FAST_PBKDF}  fleet: {{ {fleet} }}\n")
}

/// Asserts for `secs` seconds (polling every 100 ms) that no rollout slot is held: the
/// rollout is halted.
fn no_slot_taken_for(secs: u64, fake: &Real, dump: &dyn Fn(&Real) -> String) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        assert!(
            holders(fake).is_empty(),
            "a node took a slot while the rollout is halted\n{}",
            dump(fake)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the sampler saw.
#[derive(Default)]
struct Seen {
    peak_holders: usize,
    peak_running: usize,
    violations: Vec<String>,
    checks: usize,
}

#[test]
fn simulated_fleet() {
    let _turn = MANY_AGENTS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut bao) = openbao::OpenBao::start() else {
        return;
    };
    let nodes: usize = std::env::var("KEYPLAN_FLEET_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let concurrent = 2usize;
    let max_failed = 2usize;
    let step_sleep_ms: u64 = std::env::var("KEYPLAN_FLEET_STEP_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let s = Scratch::new();
    let Some(real) = Real::new("fleet-sim") else {
        return;
    };
    let fake = Arc::new(real);
    let ns = fake.ns.clone();
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i:03}")).collect();
    let kubeconfig = fake.agent_kubeconfig(&names, None);
    let operator = fake.operator_kubeconfig();
    let initial = s.initial_pass();
    let images: Vec<PathBuf> = names
        .iter()
        .map(|n| {
            std::fs::create_dir_all(s.path(n)).expect("mkdir");
            s.small_image(&format!("{n}/disk.img"), "luks2")
        })
        .collect();
    let plan = |rotate: Option<&str>| {
        per_node_plan(
            &format!(
                "  bao: {{ provider: vault, address: {}, mount: secret }}\n",
                bao.addr
            ),
            |n| (n.to_string(), format!("kms: bao, name: fleet/{n}")),
            (&names, &images, &initial),
            rotate,
            &format!(
                "max_concurrent_nodes: {concurrent}, max_failed_nodes: {max_failed}, namespace: {ns}"
            ),
        )
    };
    let config = vault_agent_config(&s, &bao.addr);
    let gate = s.path("commit-gate");
    let mut cm = ConfigMapDir::new(s.path("plan-volume"), &plan(None));
    let mut agents = vault_agents(
        &s,
        &names,
        &[&cm.plan(), &config],
        &kubeconfig,
        &["--interval", "4s", "--poll", "1s", "--slot-duration", "4s"],
        &[
            ("KP_AGENT_VAULT_TOKEN", bao.root_token.as_str()),
            // Phase 3 holds the running nodes just before their commits (a file gate, see
            // src/failpoint.rs): while `commit-gate` is absent, nothing waits.
            (
                "FAILPOINTS",
                &format!(
                    "step.before_effect=sleep({step_sleep_ms});commit.before=return(wait:{})",
                    gate.display()
                ),
            ),
        ],
    );
    let t_start = Instant::now();
    for a in agents.iter_mut() {
        a.spawn();
    }
    let restarted: Arc<Mutex<BTreeMap<String, u64>>> = Arc::new(Mutex::new(BTreeMap::new()));
    let dead: Arc<Mutex<BTreeSet<String>>> = Arc::new(Mutex::new(BTreeSet::new()));

    // The sampler: Leases and reports (never more than `concurrent` nodes applying), and
    // every device opens with its key's current version in OpenBao.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let sealed = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (fake, seen, stop, restarted, dead, sealed) = (
            Arc::clone(&fake),
            Arc::clone(&seen),
            Arc::clone(&stop),
            Arc::clone(&restarted),
            Arc::clone(&dead),
            Arc::clone(&sealed),
        );
        let names = names.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let h = holders(&fake);
                let now = reports(&fake);
                let mut running = 0;
                for n in &names {
                    if dead.lock().unwrap().contains(n) {
                        continue;
                    }
                    let Some(r) = now.get(n) else { continue };
                    let since = restarted.lock().unwrap().get(n).copied().unwrap_or(0);
                    if r["state"] == "running" && r["updated_at"].as_u64().unwrap_or(0) > since {
                        running += 1;
                    }
                }
                let mut s = seen.lock().unwrap();
                s.peak_holders = s.peak_holders.max(h.len());
                s.peak_running = s.peak_running.max(running);
                if h.len() > 2 || running > 2 {
                    s.violations.push(format!(
                        "{} holders {h:?}, {running} running reports",
                        h.len()
                    ));
                }
                drop(s);
                let _ = &sealed;
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let checker = {
        let (seen, stop, sealed) = (Arc::clone(&seen), Arc::clone(&stop), Arc::clone(&sealed));
        let names = names.clone();
        let images = images.clone();
        let addr = bao.addr.clone();
        let token = bao.root_token.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt");
            let http = reqwest::Client::new();
            let current = |n: &str| -> Option<(u64, Vec<u8>)> {
                if sealed.load(Ordering::SeqCst) {
                    return None;
                }
                let v: Value = rt.block_on(async {
                    http.get(format!("{addr}/v1/secret/data/fleet/{n}"))
                        .header("X-Vault-Token", &token)
                        .send()
                        .await
                        .ok()?
                        .bytes()
                        .await
                        .ok()
                        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                })?;
                let d = &v["data"];
                let version = d["metadata"]["version"].as_u64()?;
                Some((version, d["data"][n].as_str()?.as_bytes().to_vec()))
            };
            while !stop.load(Ordering::SeqCst) {
                for (n, img) in names.iter().zip(&images) {
                    let Some((v, pass)) = current(n) else {
                        continue;
                    };
                    if opens(img, &pass, None) {
                        seen.lock().unwrap().checks += 1;
                        continue;
                    }
                    // Changed in between (a commit and a kill of the old keyslot)? Not a
                    // violation then.
                    match current(n) {
                        Some((v2, _)) if v2 != v => continue,
                        None => continue,
                        _ => {}
                    }
                    if !opens(img, &pass, None) {
                        seen.lock().unwrap().violations.push(format!(
                            "{n}: KV version {v} (current) does not open {}",
                            img.display()
                        ));
                    }
                }
            }
        })
    };
    let dump = |fake: &Real| {
        if let Ok(to) = std::env::var("KEYPLAN_FLEET_KEEP_LOGS") {
            for n in &names {
                let _ = std::fs::create_dir_all(&to);
                let _ = std::fs::copy(
                    s.path(&format!("{n}/agent.log")),
                    Path::new(&to).join(format!("{n}.log")),
                );
            }
        }
        let mut out = String::new();
        for n in &names {
            let r = report(fake, n);
            out += &format!(
                "{n}: {} {}\n",
                r.as_ref()
                    .map(|r| r["state"].to_string())
                    .unwrap_or_default(),
                r.as_ref()
                    .map(|r| r["message"].to_string())
                    .unwrap_or_default()
            );
        }
        out += &format!("holders {:?}\n", holders(fake));
        out
    };
    let in_sync_all = |fake: &Real, except: &BTreeSet<String>| {
        names.iter().filter(|n| !except.contains(*n)).all(|n| {
            report(fake, n).is_some_and(|r| {
                r["state"] == "in_sync"
                    && r["changes"] == 0
                    && r["keys"][0]["current_version"].as_u64().unwrap_or(0) >= 1
            })
        })
    };

    // Phase 1: enrollment. One agent is killed for good while it holds a slot.
    let gone = loop {
        let h = holders(&fake);
        if let Some(n) = h.first() {
            break n.clone();
        }
        assert!(
            t_start.elapsed() < Duration::from_secs(120),
            "no node took a slot\n{}",
            dump(&fake)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let gi = names.iter().position(|n| *n == gone).expect("gone node");
    dead.lock().unwrap().insert(gone.clone());
    agents[gi].kill9();
    let except: BTreeSet<String> = [gone.clone()].into();
    wait_for(
        600,
        "every other node enrolled",
        || in_sync_all(&fake, &except),
        || dump(&fake),
    );
    let phase1 = t_start.elapsed();
    // Its slot expired and was taken over: the other nodes all ran.
    let taken_over = fake
        .leases()
        .iter()
        .any(|l| l["spec"]["leaseTransitions"].as_u64().unwrap_or(0) > 0);
    assert!(taken_over, "no slot was ever taken over after expiry");
    // It comes back, finishes its interrupted run, and converges.
    restarted.lock().unwrap().insert(gone.clone(), now());
    dead.lock().unwrap().remove(&gone);
    agents[gi].spawn();
    wait_for(
        300,
        "every node enrolled",
        || in_sync_all(&fake, &BTreeSet::new()),
        || dump(&fake),
    );

    // Phase 2: rotation everywhere (rotate_after: 1s), agents killed mid-rotation.
    cm.write(&plan(Some("1s")));
    let rotated = |fake: &Real| {
        names
            .iter()
            .filter(|n| {
                report(fake, n)
                    .is_some_and(|r| r["keys"][0]["current_version"].as_u64().unwrap_or(0) >= 2)
            })
            .count()
    };
    let mut kills = 0;
    let mut killed = BTreeSet::new();
    let t2 = Instant::now();
    while kills < 3 {
        assert!(
            t2.elapsed() < Duration::from_secs(300),
            "no rotation to kill\n{}",
            dump(&fake)
        );
        let victim = holders(&fake).into_iter().find(|h| !killed.contains(h));
        if let Some(v) = victim {
            // Chaos timing, not synchronisation: the kill lands about two steps into the
            // slot holder's run (each step sleeps `step_sleep_ms` at its failpoint), and the
            // agent comes back after half a second, as a restarted Pod would.
            std::thread::sleep(Duration::from_millis(step_sleep_ms * 2));
            let i = names.iter().position(|n| *n == v).expect("victim");
            agents[i].kill9();
            std::thread::sleep(Duration::from_millis(500));
            restarted.lock().unwrap().insert(v.clone(), now());
            agents[i].spawn();
            killed.insert(v);
            kills += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    wait_for(
        300,
        "six nodes rotated",
        || rotated(&fake) >= 6,
        || dump(&fake),
    );

    // OpenBao sealed mid-rollout (while both slots are held by running nodes): node runs fail
    // until max_failed_nodes stops the rollout.
    let unseal_key = bao
        .log()
        .lines()
        .find_map(|l| l.trim().strip_prefix("Unseal Key: ").map(str::to_string))
        .expect("unseal key in the dev server's log");
    let failed = |fake: &Real| {
        names
            .iter()
            .filter(|n| report(fake, n).is_some_and(|r| !r["failure"].is_null()))
            .count()
    };
    // Sealed while both running nodes wait at their commits (their commits then fail): only
    // runs that changed something count (a node that cannot observe or plan because the KMS is
    // sealed reports `error` and does not count: docs/fleet.md, "A KMS outage"), so the halt
    // needs both running runs to fail. The gate holds each running node just before its
    // commit; once both slot holders are there, OpenBao is sealed and the gate opened.
    std::fs::write(&gate, b"").expect("commit gate");
    let waiting = || -> Vec<String> {
        let prefix = format!(
            "{}.",
            gate.file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
        );
        std::fs::read_dir(s.path(""))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.starts_with(&prefix))
                    .collect()
            })
            .unwrap_or_default()
    };
    wait_for(
        300,
        "both slot holders waiting at the gate before their commits",
        || waiting().len() >= concurrent,
        || format!("waiting: {:?}\n{}", waiting(), dump(&fake)),
    );
    let out = bao.cli_as(&bao.root_token.clone(), &["operator", "seal"], b"");
    assert!(
        out.status.success(),
        "seal: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    sealed.store(true, Ordering::SeqCst);
    std::fs::remove_file(&gate).expect("open the commit gate");
    wait_for(
        300,
        "max_failed_nodes failed runs",
        || failed(&fake) >= max_failed,
        || dump(&fake),
    );
    // Halted: within a few polls no slot is held any more, and none is taken for a while.
    wait_for(
        60,
        "the slots to be free",
        || holders(&fake).is_empty(),
        || dump(&fake),
    );
    let halted_failures = failed(&fake);
    no_slot_taken_for(8, &fake, &dump);
    assert!(
        halted_failures < max_failed + concurrent,
        "{halted_failures} failures for max_failed_nodes {max_failed}\n{}",
        dump(&fake)
    );

    // Unsealed, the nodes find their work again but stay halted until the failures are cleared.
    let out = bao.cli_as(
        &bao.root_token.clone(),
        &["operator", "unseal", &unseal_key],
        b"",
    );
    assert!(
        out.status.success(),
        "unseal: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    sealed.store(false, Ordering::SeqCst);
    wait_for(
        120,
        "a node reporting halted",
        || names.iter().any(|n| state(&fake, n) == "halted"),
        || dump(&fake),
    );
    no_slot_taken_for(6, &fake, &dump);
    let st = keyplan_command()
        .args(["fleet", "status", "--namespace", &ns, "--kubeconfig"])
        .arg(&operator)
        .output()
        .expect("fleet status");
    let st_text = String::from_utf8_lossy(&st.stdout).to_string();
    assert_eq!(st.status.code(), Some(1), "{st_text}");
    assert!(st_text.contains("HALTED"), "{st_text}");

    // Stop rotating, clear: everything converges.
    cm.write(&plan(None));
    let clear = keyplan_command()
        .args(["fleet", "clear", "--namespace", &ns, "--kubeconfig"])
        .arg(&operator)
        .output()
        .expect("fleet clear");
    assert!(
        clear.status.success(),
        "{}",
        String::from_utf8_lossy(&clear.stderr)
    );
    wait_for(
        600,
        "convergence after the outage",
        || {
            in_sync_all(&fake, &BTreeSet::new())
                && names
                    .iter()
                    .all(|n| report(&fake, n).is_some_and(|r| r["failure"].is_null()))
        },
        || dump(&fake),
    );
    let st = keyplan_command()
        .args([
            "fleet",
            "status",
            "--namespace",
            &ns,
            "--format",
            "json",
            "--kubeconfig",
        ])
        .arg(&operator)
        .output()
        .expect("fleet status");
    let doc: Value = serde_json::from_slice(&st.stdout).expect("json");
    let unwell: Vec<String> = doc["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| {
            n["state"] != "in_sync"
                || n["failure_counts"] == true
                || n["report"]["devices"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|d| d["drifted"] == true)
                || n["report"]["keys"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["overdue"] == true)
        })
        .map(|n| {
            format!(
                "{} {} problems={} devices={} keys={}",
                n["node"],
                n["state"],
                n["report"]["problems"],
                n["report"]["devices"],
                n["report"]["keys"]
            )
        })
        .collect();
    assert_eq!(
        st.status.code(),
        Some(0),
        "totals {} halted {}; {unwell:#?}",
        doc["totals"],
        doc["halted"]
    );
    assert_eq!(doc["totals"]["nodes"], nodes as u64);
    assert_eq!(doc["totals"]["by_state"]["in_sync"], nodes as u64);

    // Idle requests per node per cycle.
    let mark = fake.proxy.mark();
    let idle_secs = 12;
    std::thread::sleep(Duration::from_secs(idle_secs));
    let idle = fake
        .proxy
        .requests_since(mark)
        .iter()
        .filter(|r| r.user == fake.agent_user)
        .count();
    let per_cycle = idle as f64 / nodes as f64 / (idle_secs as f64 / 4.0);

    stop.store(true, Ordering::SeqCst);
    let _ = sampler.join();
    let _ = checker.join();
    let seen = seen.lock().unwrap();
    assert!(seen.violations.is_empty(), "{:?}", seen.violations);
    assert!(
        seen.checks > nodes,
        "the checker checked only {} times",
        seen.checks
    );
    assert!(seen.peak_holders <= concurrent && seen.peak_running <= concurrent);

    // Every device opens with its key's current version (the last word: OpenBao itself).
    for (n, img) in names.iter().zip(&images) {
        let pass = bao
            .kv_field(&format!("fleet/{n}"), n)
            .expect("current passphrase");
        assert!(
            opens(img, &pass, None),
            "{n} does not open with its current key"
        );
    }
    // RBAC: every call was allowed, and every verb the Role grants was used.
    let calls: Vec<_> = fake.proxy.requests_by_user(&fake.agent_user);
    let denied: Vec<_> = calls
        .iter()
        .filter(|r| r.code == 403 || r.code == 401)
        .collect();
    assert!(denied.is_empty(), "refused: {denied:?}");
    let used: BTreeSet<(String, String, String)> = calls.iter().filter_map(|r| r.call()).collect();
    let granted: BTreeSet<(String, String, String)> = keyplan::fleet::api::AGENT_CALLS
        .iter()
        .flat_map(|c| {
            c.verbs
                .iter()
                .map(move |v| (c.group.to_string(), c.resource.to_string(), v.to_string()))
        })
        .collect();
    // Every call is granted, and every grant is used, but for the `patch` of a repeated
    // Event: this rollout repeats none (one_nodes_token_speaks_for_its_node_only patches one
    // through a node's own token under the Role and the admission policy).
    let unused: BTreeSet<_> = granted.difference(&used).cloned().collect();
    assert!(
        used.is_subset(&granted),
        "calls beyond AGENT_CALLS: {:?}",
        used.difference(&granted).collect::<Vec<_>>()
    );
    assert!(
        unused
            .iter()
            .all(|(g, r, v)| g.is_empty() && r == "events" && v == "patch"),
        "granted but never used: {unused:?}"
    );

    let figures = serde_json::json!({
        "nodes": nodes,
        "max_concurrent_nodes": concurrent,
        "peak_slot_holders": seen.peak_holders,
        "peak_running_reports": seen.peak_running,
        "kills_survived": kills + 1,
        "enrollment_rollout_seconds": phase1.as_secs_f64(),
        "failures_at_halt": halted_failures,
        "idle_requests_per_node_per_cycle": per_cycle,
        "invariant_checks": seen.checks,
    });
    eprintln!("FIGURES {figures}");
    if let Ok(path) = std::env::var("KEYPLAN_FLEET_FIGURES") {
        let _ = std::fs::write(path, figures.to_string());
    }
    bao.stop();
}

/// Seconds of an RFC 3339 timestamp with a fraction (`2026-12-01T15:20:01.123456Z`).
fn fractional_seconds(ts: &str) -> Option<f64> {
    let (whole, frac) = match ts.trim_end_matches('Z').split_once('.') {
        Some((w, f)) => (format!("{w}Z"), format!("0.{f}")),
        None => (ts.to_string(), "0".to_string()),
    };
    Some(keyplan::clock::parse_rfc3339(&whole)? as f64 + frac.parse::<f64>().ok()?)
}

/// The sum of the samples of metric `name` in the API server's `/metrics` (0 when absent).
fn api_server_metric(c: &kube::Cluster, name: &str) -> f64 {
    let text = c.get_text("/metrics").unwrap_or_default();
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `(event, seconds)` of each `run_initiated` and `run_complete` line of an agent's JSON log.
fn run_events(log: &str) -> Vec<(String, f64)> {
    log.lines()
        .filter_map(|line| {
            let v: Value = serde_json::from_str(line).ok()?;
            let ev = v["fields"]["event"].as_str()?;
            if ev != "run_initiated" && ev != "run_complete" {
                return None;
            }
            Some((
                ev.to_string(),
                fractional_seconds(v["timestamp"].as_str()?)?,
            ))
        })
        .collect()
}

/// The runs in an agent's JSON log: `(slot Lease, start, end)` in seconds, from each
/// `run_initiated` (which names the slot) to the next `run_complete`.
fn slot_runs(log: &str) -> Vec<(String, f64, f64)> {
    let mut out = Vec::new();
    let mut start = None;
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let at = v["timestamp"].as_str().and_then(fractional_seconds);
        match (v["fields"]["event"].as_str(), at) {
            (Some("run_initiated"), Some(t)) => {
                start = Some((v["fields"]["lease"].as_str().unwrap_or("").to_string(), t))
            }
            (Some("run_complete"), Some(t)) => {
                if let Some((lease, s)) = start.take() {
                    out.push((lease, s, t));
                }
            }
            _ => {}
        }
    }
    out
}

/// What the rollout spent beside the runs, from every agent's runs ([`slot_runs`]): the
/// hand-overs (one node's run end to the next run's start on the same slot, seconds, sorted)
/// and, for the slot whose last run ended last, the sum of its runs (seconds).
fn hand_overs(runs: &[(String, f64, f64)]) -> (Vec<f64>, f64) {
    let mut by_slot: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for (lease, start, end) in runs {
        by_slot.entry(lease).or_default().push((*start, *end));
    }
    let mut gaps = Vec::new();
    let (mut last_end, mut last_slot_runs) = (0.0f64, 0.0);
    for chain in by_slot.values_mut() {
        chain.sort_by(|a, b| a.0.total_cmp(&b.0));
        gaps.extend(chain.windows(2).map(|w| w[1].0 - w[0].1));
        let end = chain.last().map_or(0.0, |r| r.1);
        if end > last_end {
            last_end = end;
            last_slot_runs = chain.iter().map(|r| r.1 - r.0).sum();
        }
    }
    gaps.sort_by(|a, b| a.total_cmp(b));
    (gaps, last_slot_runs)
}

/// The durations (seconds) of the runs in an agent's JSON log: `run_initiated` to the next
/// `run_complete`.
fn run_durations(log: &str) -> Vec<f64> {
    let mut out = Vec::new();
    let mut start = None;
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let ev = v["fields"]["event"].as_str().unwrap_or("");
        let at = v["timestamp"].as_str().and_then(fractional_seconds);
        match (ev, at) {
            ("run_initiated", Some(t)) => start = Some(t),
            ("run_complete", Some(t)) => {
                if let Some(s) = start.take() {
                    out.push(t - s);
                }
            }
            _ => {}
        }
    }
    out
}

/// The last JSON log lines of `log` from line `from` on: `(event, message)` of each step event.
fn step_events(log: &Path, from: usize) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .skip(from)
        .filter_map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            let ev = v["fields"]["event"].as_str()?.to_string();
            let msg = v["fields"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            Some((ev, msg))
        })
        .collect()
}

fn line_count(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// The file KMS's `meta.json` of key `k` under `root/keys`.
pub(crate) fn file_meta(root: &Path, key: &str) -> Value {
    std::fs::read(root.join("keys").join(key).join("meta.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null)
}

/// The kinds of steps of a shared key's rotation, as the agents log them, and a short name.
const SHARED_STEP_KINDS: [(&str, &str); 7] = [
    ("stage a new version", "stage"),
    (" add k ", "add"),
    (" verify k ", "verify"),
    ("record that this plan's devices hold", "vote"),
    ("commit the new version", "commit"),
    (" kill keyslot", "kill"),
    ("withdraw this plan's vote", "unvote"),
];

/// A key shared by three nodes (one file KMS entry, four devices: two on worker-1) rotated as
/// one two-phase commit: every agent killed (`kill -9`) at every kind of step and restarted,
/// while a witness checks all along that the KMS's current version opens every device; then
/// worker-3 stopped for good: the commit is blocked and reported, naming worker-3, with nothing
/// locked out; it converges when worker-3 returns; and once worker-3 leaves the plan (its
/// record released), the others rotate without it.
#[test]
fn shared_key_on_three_nodes() {
    let _turn = MANY_AGENTS.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new();
    let Some(fake) = Real::new("fleet-shared-key") else {
        return;
    };
    let fake = Arc::new(fake);
    let names: Vec<String> = (1..=3).map(|i| format!("worker-{i}")).collect();
    let kubeconfig = fake.agent_kubeconfig(&names, Some(2));
    let initial = s.initial_pass();
    let mut images: Vec<(String, String, PathBuf)> = Vec::new();
    for n in &names {
        std::fs::create_dir_all(s.path(n)).expect("mkdir");
        images.push((
            format!("{n}-a"),
            n.clone(),
            s.small_image(&format!("{n}/a.img"), "luks2"),
        ));
    }
    images.push((
        "worker-1-b".into(),
        "worker-1".into(),
        s.small_image("worker-1/b.img", "luks2"),
    ));
    let keys = s.path("keys");
    let plan = |rotate: Option<&str>, without: Option<&str>| {
        let mut t = format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: {} }}\nkeys:\n  k: {{ kms: local{} }}\ndevices:\n",
            keys.display(),
            rotate.map(|r| format!(", rotate_after: {r}")).unwrap_or_default()
        );
        for (id, node, img) in &images {
            if Some(node.as_str()) == without {
                continue;
            }
            t += &format!(
                "  {id}: {{ path: {}, node: {node}, keys: [k], enroll_with: {} }}\n",
                img.display(),
                initial.display()
            );
        }
        t + &format!("{FAST_PBKDF}  fleet: {{ max_concurrent_nodes: 2, max_failed_nodes: 3, namespace: {} }}\n", fake.ns)
    };
    let config = file_agent_config(&s, &keys);
    let mut cm = ConfigMapDir::new(s.path("plan-volume"), &plan(None, None));
    let mut agents = vault_agents(
        &s,
        &names,
        &[&cm.plan(), &config],
        &kubeconfig,
        &["--interval", "3s", "--poll", "1s", "--slot-duration", "4s"],
        &[("FAILPOINTS", "step.before_effect=sleep(100)")],
    );
    for a in agents.iter_mut() {
        a.spawn();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let left: Arc<Mutex<BTreeSet<String>>> = Arc::new(Mutex::new(BTreeSet::new()));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let meta = || file_meta(s.dir.path(), "k");
    let dump = || {
        let mut out = String::new();
        if let Ok(to) = std::env::var("KEYPLAN_FLEET_KEEP_LOGS") {
            let _ = std::fs::create_dir_all(&to);
            for n in &names {
                let _ = std::fs::copy(
                    s.path(&format!("{n}/agent.log")),
                    Path::new(&to).join(format!("{n}.log")),
                );
            }
        }
        for n in &names {
            let r = report(&fake, n);
            out += &format!(
                "{n}: {} {} waiting={}\n",
                r.as_ref()
                    .map(|r| r["state"].to_string())
                    .unwrap_or_default(),
                r.as_ref()
                    .map(|r| r["message"].to_string())
                    .unwrap_or_default(),
                r.as_ref()
                    .map(|r| r["commits_waiting"].to_string())
                    .unwrap_or_default(),
            );
        }
        out += &format!(
            "meta {}\nviolations {:?}\n",
            meta(),
            seen.lock().unwrap().violations
        );
        out
    };
    let current = || meta()["current"].as_u64().unwrap_or(0);
    let holder_ids = || -> Vec<String> {
        meta()["holders"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    // Converged: no version pending, no vote left, every node in sync, and every device of
    // the plan holds exactly its install keyslot and one keyslot of the current version.
    let converged = |except: &BTreeSet<String>| {
        let m = meta();
        let c = m["current"].as_u64().unwrap_or(0);
        c >= 1
            && m["pending"].is_null()
            && holder_ids().iter().all(|h| !h.contains(" verified v"))
            && names.iter().filter(|n| !except.contains(*n)).all(|n| {
                report(&fake, n).is_some_and(|r| {
                    r["state"] == "in_sync"
                        && r["changes"] == 0
                        && r["keys"][0]["current_version"].as_u64() == Some(c)
                })
            })
            && images
                .iter()
                .filter(|(_, n, _)| !except.contains(n))
                .all(|(_, _, img)| keyslots(img).len() == 2)
    };

    // 1. Enrollment: the first node creates the key, the others enroll its current version;
    //    each records itself as a holder.
    wait_for(
        240,
        "enrollment on three nodes",
        || converged(&BTreeSet::new()),
        dump,
    );
    let mut ids = holder_ids();
    ids.sort();
    assert_eq!(ids.len(), 3, "{ids:?}");
    for (id, n) in ids.iter().zip(&names) {
        assert!(id.starts_with(&format!("{n}:")), "{ids:?}");
    }
    let v_enrolled = current();

    eprintln!("shared key: enrolled at v{v_enrolled}");
    // The witness, from the enrollment on: the KMS's current version opens every device still
    // in the plan, at every instant (a failure is re-checked against a fresh read: a commit in between is no
    // violation, since the old version's keyslots go only after it).
    let witness = {
        let (stop, left, seen) = (Arc::clone(&stop), Arc::clone(&left), Arc::clone(&seen));
        let root = s.dir.path().to_path_buf();
        let images = images.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                for (id, node, img) in &images {
                    if left.lock().unwrap().contains(node) {
                        continue;
                    }
                    let (Some(pass), _) = file_kms_state(&root, "k") else {
                        continue;
                    };
                    if opens(img, &pass, None) {
                        seen.lock().unwrap().checks += 1;
                        continue;
                    }
                    let (again, _) = file_kms_state(&root, "k");
                    if again.as_deref() != Some(pass.as_slice()) {
                        continue;
                    }
                    if !opens(img, &pass, None) {
                        seen.lock().unwrap().violations.push(format!(
                            "{id} ({node}): the KMS's current version of k does not open {}",
                            img.display()
                        ));
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // 2. Rotations (rotate_after: 1s): each agent in turn killed at a step of each kind.
    cm.write(&plan(Some("1s"), None));
    let mut killed: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    let mut kills = 0usize;
    let t2 = Instant::now();
    // Each agent at each kind of step in turn; then, while the time lasts, the kinds no agent
    // was killed at yet (on a loaded machine the node that commits may not be the one waited
    // for), every agent in turn.
    let rounds = SHARED_STEP_KINDS.len() * names.len();
    let mut round = 0usize;
    'kills: loop {
        let i = round % names.len();
        let k = if round < rounds {
            (round / names.len() + i) % SHARED_STEP_KINDS.len()
        } else {
            let done: BTreeSet<&str> = killed.values().flatten().copied().collect();
            match SHARED_STEP_KINDS
                .iter()
                .position(|(_, kind)| !done.contains(kind))
            {
                Some(k) => k,
                None => break 'kills,
            }
        };
        round += 1;
        let (pattern, kind) = SHARED_STEP_KINDS[k];
        let log = s.path(&format!("{}/agent.log", names[i]));
        let from = line_count(&log);
        let t = Instant::now();
        // Wait (up to 30 s) for that agent to start a step of that kind, then kill it at once.
        loop {
            if t2.elapsed() > Duration::from_secs(420) {
                break 'kills;
            }
            if t.elapsed() > Duration::from_secs(30) {
                continue 'kills;
            }
            let hit = step_events(&log, from)
                .iter()
                .any(|(ev, msg)| ev == "step_started" && msg.contains(pattern));
            if hit {
                agents[i].kill9();
                kills += 1;
                killed.entry(names[i].clone()).or_default().insert(kind);
                // A restart delay (a restarted Pod), not synchronisation.
                std::thread::sleep(Duration::from_millis(300));
                agents[i].spawn();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let kinds: BTreeSet<&str> = killed.values().flatten().copied().collect();
    for must in ["stage", "add", "verify", "vote", "commit", "kill"] {
        assert!(
            kinds.contains(must),
            "no agent was killed at a {must} step: {killed:?}\n{}",
            dump()
        );
    }
    for n in &names {
        assert!(
            killed.get(n).map_or(0, |k| k.len()) >= 3,
            "{n} was killed at fewer than 3 kinds of steps: {killed:?}"
        );
    }
    let v_rotated = current();
    assert!(
        v_rotated >= v_enrolled + 3,
        "only {} rotations during the kills\n{}",
        v_rotated - v_enrolled,
        dump()
    );
    // Rotation stops: everything converges.
    cm.write(&plan(None, None));
    wait_for(
        240,
        "convergence after the kills",
        || converged(&BTreeSet::new()),
        dump,
    );
    eprintln!(
        "shared key: {kills} kills ({killed:?}), {} rotations, {} witness checks",
        current() - v_enrolled,
        seen.lock().unwrap().checks
    );

    eprintln!("shared key: phase 3 at v{}", current());
    // 3. worker-3 stopped for good: the others stage, add, verify and vote; the commit waits,
    //    reported by name, and the current version stays (and opens worker-3's device).
    agents[2].kill9();
    let before = current();
    cm.write(&plan(Some("1s"), None));
    let waits_for_3 = |n: &str| {
        report(&fake, n).is_some_and(|r| {
            r["state"] == "waiting"
                && r["commits_waiting"].as_array().is_some_and(|w| {
                    w.iter().any(|w| {
                        w["verified_here"] == true
                            && w["blocking"].as_array().is_some_and(|b| {
                                b.len() == 1 && b[0].as_str().unwrap_or("").starts_with("worker-3:")
                            })
                    })
                })
        })
    };
    wait_for(
        120,
        "worker-1 and worker-2 waiting for worker-3",
        || waits_for_3("worker-1") && waits_for_3("worker-2"),
        dump,
    );
    let t3 = Instant::now();
    while t3.elapsed() < Duration::from_secs(6) {
        let m = meta();
        assert_eq!(
            m["current"].as_u64(),
            Some(before),
            "committed without worker-3\n{}",
            dump()
        );
        assert_eq!(m["pending"].as_u64(), Some(before + 1), "{}", dump());
        std::thread::sleep(Duration::from_millis(200));
    }
    let st = keyplan_command()
        .args(["fleet", "status", "--namespace", &fake.ns, "--kubeconfig"])
        .arg(fake.operator_kubeconfig())
        .output()
        .expect("fleet status");
    let st_text = String::from_utf8_lossy(&st.stdout).to_string();
    assert!(
        st_text.contains(&format!(
            "key k v{} (KMS local): the commit waits for worker-3 to verify it",
            before + 1
        )),
        "{st_text}"
    );
    let pending_waits = fake.c.events(&fake.ns).iter().any(|e| {
        e["reason"] == "CommitWaiting" && e["message"].as_str().unwrap_or("").contains("worker-3")
    });
    assert!(pending_waits, "no CommitWaiting Event naming worker-3");
    eprintln!("shared key: commit blocked by worker-3 as reported");
    // It returns: it adds, verifies and votes, and the commit happens.
    agents[2].spawn();
    wait_for(
        120,
        "the commit once worker-3 is back",
        || current() > before,
        dump,
    );
    cm.write(&plan(None, None));
    wait_for(
        240,
        "convergence after worker-3 returned",
        || converged(&BTreeSet::new()),
        dump,
    );

    eprintln!("shared key: phase 4 at v{}", current());
    // 4. worker-3 stopped for good again and taken out of the plan: its record, released by
    //    an operator (`keyplan key release`), no longer blocks the others' rotation.
    agents[2].kill9();
    left.lock().unwrap().insert("worker-3".into());
    let before = current();
    let plan4 = plan(Some("1s"), Some("worker-3"));
    cm.write(&plan4);
    let gone: BTreeSet<String> = ["worker-3".to_string()].into();
    // The others read the new plan and find the rotation due but blocked by worker-3's
    // record (I7: a note, no stage): each reports the plan's digest, in sync, the key
    // overdue. That is the event; for a few of their 1 s cycles after it the current version
    // must stay.
    let digest4 = sha256_hex(plan4.as_bytes());
    let blocked = |n: &str| {
        report(&fake, n).is_some_and(|r| {
            r["plan_digest"].as_str() == Some(digest4.as_str())
                && r["state"] == "in_sync"
                && r["keys"][0]["overdue"] == true
        })
    };
    wait_for(
        120,
        "worker-1 and worker-2 finding the due rotation blocked by worker-3's record",
        || current() > before || (blocked("worker-1") && blocked("worker-2")),
        dump,
    );
    let t4 = Instant::now();
    while t4.elapsed() < Duration::from_secs(3) {
        assert_eq!(
            current(),
            before,
            "committed while worker-3's record is there\n{}",
            dump()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let w3 = holder_ids()
        .into_iter()
        .find(|h| h.starts_with("worker-3:") && !h.contains(" verified v"))
        .expect("worker-3's record");
    let op_plan = s.plan("operator.yaml", &plan(None, Some("worker-3")));
    let out = keyplan_command()
        .args(["key", "release", "k", "--holder", &w3, "-f"])
        .arg(&op_plan)
        .args(["--node", "worker-1", "--state-dir"])
        .arg(s.path("operator-state"))
        .output()
        .expect("key release");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(
        120,
        "a rotation without worker-3",
        || current() > before,
        dump,
    );
    cm.write(&plan(None, Some("worker-3")));
    wait_for(
        240,
        "convergence without worker-3",
        || converged(&gone),
        dump,
    );

    stop.store(true, Ordering::SeqCst);
    witness.join().expect("witness");
    let (violations, checks) = {
        let seen = seen.lock().unwrap();
        (seen.violations.clone(), seen.checks)
    };
    assert!(
        violations.is_empty(),
        "I1 broken: {violations:?}\n{}",
        dump()
    );
    assert!(checks > 100, "only {checks} witness checks");
    for a in agents.iter_mut() {
        a.term(10);
    }
}

/// `benches/fleet_rollout.sh`: `KEYPLAN_FLEET_NODES` (100) agents, `KEYPLAN_FLEET_CONCURRENT`
/// (10) slots, keys in OpenBao, no injected delays: the enrollment rollout's wall time against
/// the ideal `ceil(nodes / slots) × one node's run` (the median run), and the API requests per
/// node per idle cycle. Prints `FIGURES {json}` (and writes `KEYPLAN_FLEET_FIGURES`).
#[test]
#[ignore = "a benchmark: run benches/fleet_rollout.sh"]
fn rollout_benchmark() {
    let Some(mut bao) = openbao::OpenBao::start() else {
        return;
    };
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let nodes = env("KEYPLAN_FLEET_NODES", 100);
    let concurrent = env("KEYPLAN_FLEET_CONCURRENT", 10);
    let interval = env("KEYPLAN_FLEET_INTERVAL", 30) as u64;
    let s = Scratch::new();
    let Some(fake) = Real::new("fleet-bench") else {
        return;
    };
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i:03}")).collect();
    let kubeconfig = fake.agent_kubeconfig(&names, Some(concurrent));
    let initial = s.initial_pass();
    let mut t = format!(
        "version: 1\nkms:\n  bao: {{ provider: vault, address: {}, mount: secret }}\nkeys:\n",
        bao.addr
    );
    for n in &names {
        t += &format!("  {n}: {{ kms: bao, name: fleet/{n} }}\n");
    }
    t += "devices:\n";
    for n in &names {
        std::fs::create_dir_all(s.path(n)).expect("mkdir");
        let img = s.small_image(&format!("{n}/disk.img"), "luks2");
        t += &format!(
            "  {n}: {{ path: {}, node: {n}, keys: [{n}], enroll_with: {} }}\n",
            img.display(),
            initial.display()
        );
    }
    // PBKDF2 with KEYPLAN_FLEET_ITERATIONS (300000) iterations: a node's run costs key
    // derivations as a real one does, without argon2's memory on a 2-core machine.
    let iterations = env("KEYPLAN_FLEET_ITERATIONS", 300_000);
    t += &format!("settings:\n  pbkdf: {{ type: pbkdf2, iterations: {iterations} }}\n  fleet: {{ max_concurrent_nodes: {concurrent}, max_failed_nodes: 1, namespace: {} }}\n", fake.ns);
    let cm = ConfigMapDir::new(s.path("plan-volume"), &t);
    let config = vault_agent_config(&s, &bao.addr);
    let interval_s = format!("{interval}s");
    let mut agents = vault_agents(
        &s,
        &names,
        &[&cm.plan(), &config],
        &kubeconfig,
        &[
            "--interval",
            &interval_s,
            "--poll",
            "2s",
            "--slot-duration",
            "20s",
        ],
        &[("KP_AGENT_VAULT_TOKEN", bao.root_token.as_str())],
    );
    // The rollout starts as an operator's does on a running fleet: the agents start under a
    // pause (`keyplan fleet pause`), observe and report their work, and the rollout is timed
    // from the resume. The agents (and the cryptsetup processes they start) run at the lowest
    // CPU priority: on real nodes a node's key derivations do not take the control plane's
    // CPU, here 100 nodes and the API server share two cores.
    let cms = format!("/api/v1/namespaces/{}/configmaps", fake.ns);
    fake.c.ensure(
        &cms,
        &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "keyplan-pause",
                "labels": {"app.kubernetes.io/name": "keyplan",
                           "app.kubernetes.io/component": "fleet-pause"}},
            "data": {"reason": "the benchmark starts the rollout", "paused_by": "bench"}}),
    );
    let t0 = Instant::now();
    for a in agents.iter_mut() {
        a.spawn();
        if let Some(child) = &a.child {
            let _ = Command::new("renice")
                .args(["-n", "19", "-p", &child.id().to_string()])
                .stdout(Stdio::null())
                .status();
        }
    }
    // One list of the namespace's ConfigMaps per look, not one read per node: the harness's
    // own requests stay out of the way of the agents'.
    let reports = || -> Vec<Value> {
        fake.c
            .get_json(&cms)
            .and_then(|l| l["items"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|cm| serde_json::from_str(cm["data"]["report.json"].as_str()?).ok())
            .collect()
    };
    let all = |pred: &dyn Fn(&Value) -> bool| {
        let r = reports();
        r.len() == nodes && r.iter().all(pred)
    };
    wait_for(
        1800,
        "every agent to report its work, paused",
        || all(&|r: &Value| r["state"] == "paused"),
        String::new,
    );
    let started_up = t0.elapsed().as_secs_f64();
    let resumed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let t0 = Instant::now();
    assert!(
        fake.c.delete(&format!("{cms}/keyplan-pause")),
        "resume: delete keyplan-pause"
    );
    let done = || all(&|r: &Value| r["state"] == "in_sync" && r["keys"][0]["current_version"] == 1);
    wait_for(3600, "the rollout", done, String::new);
    let rollout = t0.elapsed().as_secs_f64();
    let mut runs: Vec<f64> = names
        .iter()
        .flat_map(|n| {
            run_durations(
                &std::fs::read_to_string(s.path(&format!("{n}/agent.log"))).unwrap_or_default(),
            )
        })
        .collect();
    runs.sort_by(|a, b| a.total_cmp(b));
    let median = runs.get(runs.len() / 2).copied().unwrap_or(0.0);
    let ideal = (nodes as f64 / concurrent as f64).ceil() * median;
    // The rollout proper: from the first node's run start to the last node's run end (the
    // agents' start-up, their first observations, happen before).
    let (mut first, mut last) = (f64::MAX, 0.0f64);
    for n in &names {
        let log = std::fs::read_to_string(s.path(&format!("{n}/agent.log"))).unwrap_or_default();
        for (ev, at) in run_events(&log) {
            if ev == "run_initiated" {
                first = first.min(at);
            } else {
                last = last.max(at);
            }
        }
    }
    let busy = (last - first).max(0.0);
    let resumed = (last - resumed_at).max(0.0);
    let all_runs: Vec<(String, f64, f64)> = names
        .iter()
        .flat_map(|n| {
            slot_runs(
                &std::fs::read_to_string(s.path(&format!("{n}/agent.log"))).unwrap_or_default(),
            )
        })
        .collect();
    let (gaps, last_slot_runs) = hand_overs(&all_runs);
    let gap_median = gaps.get(gaps.len() / 2).copied().unwrap_or(0.0);
    let gap_max = gaps.last().copied().unwrap_or(0.0);
    let mean_run = runs.iter().sum::<f64>() / runs.len().max(1) as f64;
    // Two idle intervals: the agents' requests (through the proxy), the API server's own count
    // of requests and its CPU time (its /metrics).
    let server = |what: &str| api_server_metric(fake.c, what);
    let (cpu0, req0) = (
        server("process_cpu_seconds_total"),
        server("apiserver_request_total"),
    );
    let mark = fake.proxy.mark();
    let window = Instant::now();
    std::thread::sleep(Duration::from_secs(interval * 2));
    let idle = fake.proxy.requests_since(mark);
    let window = window.elapsed().as_secs_f64();
    let (cpu1, req1) = (
        server("process_cpu_seconds_total"),
        server("apiserver_request_total"),
    );
    let agents_idle: Vec<_> = idle.iter().filter(|r| r.user == fake.agent_user).collect();
    let per_cycle = agents_idle.len() as f64 / nodes as f64 / 2.0;
    let writes_per_cycle =
        agents_idle.iter().filter(|r| r.method != "GET").count() as f64 / nodes as f64 / 2.0;
    let watches = agents_idle
        .iter()
        .filter(|r| r.query.contains("watch=true"))
        .count();
    let per_node_hour = 3600.0 / window / nodes as f64;
    let figures = serde_json::json!({
        "nodes": nodes,
        "max_concurrent_nodes": concurrent,
        "runs": runs.len(),
        "median_node_run_seconds": median,
        "mean_node_run_seconds": mean_run,
        "hand_overs": gaps.len(),
        "hand_over_median_seconds": gap_median,
        "hand_over_max_seconds": gap_max,
        "last_slot_runs_seconds": last_slot_runs,
        "rollout_seconds": rollout,
        "resumed_seconds": resumed,
        "resumed_over_ideal": resumed / ideal.max(0.001),
        "agents_started_up_seconds": started_up,
        "busy_seconds": busy,
        "ideal_seconds": ideal,
        "rollout_over_ideal": rollout / ideal.max(0.001),
        "busy_over_ideal": busy / ideal.max(0.001),
        "idle_requests_per_node_per_cycle": per_cycle,
        "idle_writes_per_node_per_cycle": writes_per_cycle,
        "idle_watch_requests": watches,
        "idle_interval_seconds": interval,
        "apiserver_requests_per_idle_node_hour": (req1 - req0) * per_node_hour,
        "apiserver_cpu_seconds_per_idle_node_hour": (cpu1 - cpu0) * per_node_hour,
        "pbkdf2_iterations": iterations,
    });
    eprintln!("FIGURES {figures}");
    if let Ok(path) = std::env::var("KEYPLAN_FLEET_FIGURES") {
        let _ = std::fs::write(path, figures.to_string());
    }
    drop(agents);
    bao.stop();
}

/// A KMS outage before any change (issue 29): an observation (or a run's planning) stopped
/// because the KMS cannot be asked is not a failed rotation. The node waits for a slot with
/// work known (another node holds the only slot), the KMS (an exec helper) stops answering,
/// the slot is freed: the node reports `error` saying it does not count towards
/// `max_failed_nodes` (here 1), with an `ObservationFailed` Event and the
/// `keyplan_agent_observation_failures` metric, and no failure, no `RunFailed`, no halt. Once
/// the KMS answers again the node applies by itself, no `fleet clear` needed.
#[test]
fn a_kms_outage_before_any_change_does_not_halt_the_fleet() {
    let python = Path::new("/usr/bin/python3");
    if !python.is_file() {
        eprintln!("SKIPPED: /usr/bin/python3 is needed by the example exec helper");
        return;
    }
    let s = Scratch::new();
    let Some(fake) = Real::new("fleet-kms-outage") else {
        return;
    };
    let kubeconfig = fake
        .agent_kubeconfig(&["worker-1".to_string()], Some(1))
        .of("worker-1")
        .to_path_buf();
    let img = s.small_image("disk.img", "luks2");
    let initial = s.initial_pass();
    let keys = s.path("keys");
    let down = s.path("DOWN");
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/exec-kms/keyplan-kms-dir");
    let wrapper = s.path("kms-helper");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n[ -e {} ] && exec sleep 60\nexec {} {} {}\n",
            down.display(),
            python.display(),
            helper.display(),
            keys.display()
        ),
    )
    .expect("write the helper wrapper");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let config = s.path("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "kms:\n  custom: {{ provider: exec, command: [{}] }}\nenroll_with_dirs: [{}]\n",
            wrapper.display(),
            s.dir.path().display()
        ),
    )
    .expect("config");
    let cm = ConfigMapDir::new(
        s.path("plan-volume"),
        &format!(
            "version: 1\nkms:\n  custom: {{ provider: exec, command: [{}] }}\nkeys:\n  k: {{ kms: custom }}\ndevices:\n  d1: {{ path: {}, node: worker-1, keys: [k], enroll_with: {} }}\n{FAST_PBKDF}  fleet: {{ max_concurrent_nodes: 1, max_failed_nodes: 1, namespace: {} }}\n",
            wrapper.display(),
            img.display(),
            initial.display(),
            fake.ns
        ),
    );
    // Another node holds the only rollout slot.
    let renewed = chrono_like_now();
    fake.c.put_object(
        "leases",
        &fake.ns,
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": { "name": "keyplan-rollout-0", "namespace": fake.ns,
                          "labels": { "app.kubernetes.io/name": "keyplan" } },
            "spec": { "holderIdentity": "worker-9", "leaseDurationSeconds": 3600,
                      "acquireTime": renewed, "renewTime": renewed }
        }),
    );
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut agent = Agent {
        args: agent_args(
            "worker-1",
            &cm.plan(),
            &config,
            &s.path("state"),
            &kubeconfig,
            &[
                "--interval",
                "3s",
                "--poll",
                "1s",
                "--slot-duration",
                "5s",
                "--listen",
                &listen,
            ],
        ),
        // The helper's time limit (the KMS's `timeout` would do the same).
        env: vec![("KEYPLAN_EXEC_TIMEOUT_SECS".into(), "2".into())],
        log: s.path("agent.log"),
        child: None,
        started: 0,
    };
    agent.spawn();
    let log = || std::fs::read_to_string(s.path("agent.log")).unwrap_or_default();
    wait_for(
        60,
        "worker-1 waiting for the slot with its work known",
        || state(&fake, "worker-1") == "waiting",
        log,
    );

    // The KMS stops answering; the slot becomes free.
    std::fs::write(&down, b"").expect("KMS down");
    assert!(fake
        .c
        .delete_object("leases", &fake.ns, "keyplan-rollout-0"));
    let dump = || format!("{:?}\n{}", report(&fake, "worker-1"), log());
    wait_for(
        60,
        "worker-1 reporting that it could not look at the KMS",
        || {
            report(&fake, "worker-1").is_some_and(|r| {
                r["state"] == "error"
                    && r["message"]
                        .as_str()
                        .unwrap_or("")
                        .contains("does not count towards max_failed_nodes")
            })
        },
        dump,
    );
    // Two more full cycles of the outage: still no failure, no halt.
    let failures = |body: &str| -> f64 {
        body.lines()
            .find(|l| l.starts_with("keyplan_agent_observation_failures_total{"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    wait_for(
        60,
        "three observation failures in /metrics",
        || http_get(port, "/metrics").is_some_and(|(_, b)| failures(&b) >= 3.0),
        dump,
    );
    let r = report(&fake, "worker-1").expect("report");
    assert!(
        r["failure"].is_null(),
        "an outage counted as a failure: {r}"
    );
    assert_ne!(r["halted"], true, "{r}");
    assert!(
        r["message"]
            .as_str()
            .unwrap_or("")
            .contains(r#"exec KMS "custom""#),
        "the message does not name the KMS: {r}"
    );
    let reasons: Vec<String> = fake
        .c
        .events(&fake.ns)
        .iter()
        .filter_map(|e| e["reason"].as_str().map(str::to_string))
        .collect();
    assert!(
        reasons.contains(&"ObservationFailed".to_string()),
        "{reasons:?}"
    );
    assert!(!reasons.contains(&"RunFailed".to_string()), "{reasons:?}");
    assert!(
        !reasons.contains(&"RolloutHalted".to_string()),
        "{reasons:?}"
    );
    assert_eq!(keyslots(&img), vec![0], "the outage changed the device");

    // The KMS answers again: the node applies by itself.
    std::fs::remove_file(&down).expect("KMS up");
    wait_for(
        90,
        "worker-1 in sync after the outage",
        || {
            report(&fake, "worker-1")
                .is_some_and(|r| r["state"] == "in_sync" && r["last_run"]["outcome"] == "success")
        },
        dump,
    );
    assert_eq!(keyslots(&img).len(), 2);
    assert_eq!(agent.term(20), Some(0));
}

/// Now as a Kubernetes `MicroTime` text (`2026-12-03T08:00:00.000000Z`).
fn chrono_like_now() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%S.000000Z"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Kubernetes itself going away (issue 30): kube-apiserver killed (`SIGKILL`) and restarted
/// while a node holds the rollout slot in the middle of its run, then etcd killed and
/// restarted while a node is in the middle of a rotation. A control plane of the test's own
/// (the shared one serves other tests). All along a witness checks that every device opens
/// with its key's current version in the KMS; at the end every node is in sync with its key
/// rotated, and no node ever held a slot beside another (`max_concurrent_nodes: 1`).
#[test]
fn control_plane_restarts_mid_rollout() {
    let _turn = MANY_AGENTS.lock().unwrap_or_else(|e| e.into_inner());
    let Some(c) = kube::Cluster::private() else {
        return;
    };
    let s = Scratch::new();
    let fake = Arc::new(Real::on(c, "fleet-restarts"));
    let names: Vec<String> = (1..=3).map(|i| format!("worker-{i}")).collect();
    let kubeconfig = fake.agent_kubeconfig(&names, None);
    let initial = s.initial_pass();
    let keys = s.path("keys");
    let images: Vec<PathBuf> = names
        .iter()
        .map(|n| {
            std::fs::create_dir_all(s.path(n)).expect("mkdir");
            s.small_image(&format!("{n}/disk.img"), "luks2")
        })
        .collect();
    let plan = |rotate: Option<&str>| {
        per_node_plan(
            &format!("  local: {{ provider: file, path: {} }}\n", keys.display()),
            |n| (format!("k-{n}"), "kms: local".to_string()),
            (&names, &images, &initial),
            rotate,
            &format!(
                "max_concurrent_nodes: 1, max_failed_nodes: 3, namespace: {}",
                fake.ns
            ),
        )
    };
    let config = file_agent_config(&s, &keys);
    let mut cm = ConfigMapDir::new(s.path("plan-volume"), &plan(None));
    let mut agents = vault_agents(
        &s,
        &names,
        &[&cm.plan(), &config],
        &kubeconfig,
        &["--interval", "3s", "--poll", "1s", "--slot-duration", "6s"],
        &[("FAILPOINTS", "step.before_effect=sleep(400)")],
    );
    for a in agents.iter_mut() {
        a.spawn();
    }
    let dump = || {
        let mut out = String::new();
        for n in &names {
            let r = report(&fake, n);
            out += &format!(
                "{n}: {} {}\n",
                r.as_ref()
                    .map(|r| r["state"].to_string())
                    .unwrap_or_default(),
                r.as_ref()
                    .map(|r| r["message"].to_string())
                    .unwrap_or_default()
            );
            let log =
                std::fs::read_to_string(s.path(&format!("{n}/agent.log"))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            out += &lines[lines.len().saturating_sub(8)..].join("\n");
            out += "\n";
        }
        out
    };
    // The witness and the slot sampler (samples only while the API answers).
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let witness = {
        let (stop, seen, fake) = (Arc::clone(&stop), Arc::clone(&seen), Arc::clone(&fake));
        let root = s.dir.path().to_path_buf();
        let (names, images) = (names.clone(), images.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                for (n, img) in names.iter().zip(&images) {
                    let key = format!("k-{n}");
                    let (Some(pass), _) = file_kms_state(&root, &key) else {
                        continue;
                    };
                    if opens(img, &pass, None) {
                        seen.lock().unwrap().checks += 1;
                        continue;
                    }
                    let (again, _) = file_kms_state(&root, &key);
                    if again.as_deref() == Some(pass.as_slice()) && !opens(img, &pass, None) {
                        seen.lock().unwrap().violations.push(format!(
                            "{n}: the KMS's current version of {key} does not open {}",
                            img.display()
                        ));
                    }
                }
                // The Leases, read without panicking while the control plane is away.
                let leases = fake.c.try_get(&format!(
                    "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
                    fake.ns
                ));
                let h: Vec<String> = match leases {
                    Ok(r) if r.status == 200 => r.body["items"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|l| l["spec"]["holderIdentity"].as_str())
                        .filter(|h| !h.is_empty())
                        .map(str::to_string)
                        .collect(),
                    _ => Vec::new(),
                };
                let mut sn = seen.lock().unwrap();
                sn.peak_holders = sn.peak_holders.max(h.len());
                if h.len() > 1 {
                    sn.violations.push(format!("two slot holders: {h:?}"));
                }
                drop(sn);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let running_holder = || {
        holders(&fake)
            .first()
            .is_some_and(|h| state(&fake, h) == "running")
    };
    let version = |n: &String| {
        report(&fake, n)
            .and_then(|r| r["keys"][0]["current_version"].as_u64())
            .unwrap_or(0)
    };
    let in_sync = |at_least: u64| {
        names.iter().all(|n| {
            report(&fake, n).is_some_and(|r| r["state"] == "in_sync" && r["changes"] == 0)
                && version(n) >= at_least
        })
    };

    // 1. Enrollment; kube-apiserver killed while a node is in the middle of its run.
    wait_for(
        180,
        "a slot holder in the middle of its run",
        running_holder,
        dump,
    );
    let away = c.restart_apiserver();
    eprintln!("kube-apiserver back after {:.1}s", away.as_secs_f64());
    wait_for(
        300,
        "enrollment after the apiserver restart",
        || in_sync(1),
        dump,
    );

    // 2. Rotation (each key due 20 s after its last rotation, so every node gets its turn);
    //    etcd killed while a node is in the middle of its run.
    cm.write(&plan(Some("20s")));
    wait_for(
        180,
        "a slot holder in the middle of a rotation",
        running_holder,
        dump,
    );
    let away = c.restart_etcd();
    eprintln!(
        "etcd and kube-apiserver back after {:.1}s",
        away.as_secs_f64()
    );
    wait_for(
        300,
        "a rotation of every key after the etcd restart",
        || names.iter().all(|n| version(n) >= 2),
        dump,
    );
    cm.write(&plan(None));
    wait_for(300, "every node in sync", || in_sync(2), dump);

    stop.store(true, Ordering::SeqCst);
    witness.join().expect("witness");
    let seen = seen.lock().unwrap();
    assert!(
        seen.violations.is_empty(),
        "{:?}\n{}",
        seen.violations,
        dump()
    );
    assert!(seen.checks > 30, "only {} witness checks", seen.checks);
    for (n, img) in names.iter().zip(&images) {
        let (Some(pass), _) = file_kms_state(s.dir.path(), &format!("k-{n}")) else {
            panic!("no current version of k-{n}");
        };
        assert!(
            opens(img, &pass, None),
            "{n} does not open with its current key"
        );
    }
    // The restarts cost no failed run (a run whose slot cannot be renewed stops between
    // steps and is finished by the next cycle: src/fleet/agent/slot.rs), so nothing counts towards
    // max_failed_nodes.
    let failures: Vec<String> = names
        .iter()
        .filter_map(|n| {
            let r = report(&fake, n)?;
            (!r["failure"].is_null()).then(|| format!("{n}: {}", r["failure"]))
        })
        .collect();
    assert!(failures.is_empty(), "{failures:?}\n{}", dump());
    for a in agents.iter_mut() {
        a.term(10);
    }
}

/// One row of the refusal matrix: who tried what, what the API server answered.
struct Tried {
    who: &'static str,
    what: String,
    status: u16,
    reason: String,
    by: &'static str,
}

/// Issue 31: with deploy/kubernetes/rbac.yaml and admission-policy.yaml applied, node A's
/// pod-bound token cannot speak for node B (nor for the operator), a token without a node
/// name may write nothing, and each node's own writes pass. Every refusal is asserted by
/// status and reason; the matrix is printed (`--nocapture`).
#[test]
fn one_nodes_token_speaks_for_its_node_only() {
    let Some(fake) = Real::new("fleet-identity") else {
        return;
    };
    let (ns, rook) = (fake.ns.clone(), fake.rook_ns.clone());
    let nodes = ["worker-1".to_string(), "worker-2".to_string()];
    let (osd_a, osd_b) = (
        "rook-ceph-osd-encryption-key-set1-data-0-abcde",
        "rook-ceph-osd-encryption-key-set1-data-1-fghij",
    );
    fake.apply_agent_rbac(&nodes, Some(2));
    fake.apply_admission_policy(&[("worker-1", &[osd_a]), ("worker-2", &[osd_b])]);
    let c = fake.c;
    let a = c.node_client(&ns, "keyplan", "worker-1").token;
    let b = c.node_client(&ns, "keyplan", "worker-2").token;
    let nameless = c.service_account_token(&ns, "keyplan", &[], None);
    // The operator's objects and Rook's Secrets, as the cluster has them.
    for name in ["keyplan-plan", "keyplan-agent"] {
        c.ensure(
            &format!("/api/v1/namespaces/{ns}/configmaps"),
            &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name}, "data": {"x": "operator's"}}),
        );
    }
    for name in [osd_a, osd_b] {
        c.ensure(
            &format!("/api/v1/namespaces/{rook}/secrets"),
            &serde_json::json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name}, "data": {"dmcrypt-key": "c2VjcmV0"}}),
        );
    }
    let cms = format!("/api/v1/namespaces/{ns}/configmaps");
    let leases = format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases");
    let events = format!("/api/v1/namespaces/{ns}/events");
    let secrets = format!("/api/v1/namespaces/{rook}/secrets");
    let report = |node: &str, st: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("keyplan-node-{node}")},
            "data": {"report.json": format!("{{\"state\":\"{st}\"}}")}})
    };
    let lease = |name: &str, holder: Option<&str>| {
        let mut spec = serde_json::json!({"leaseDurationSeconds": 30});
        if let Some(h) = holder {
            spec["holderIdentity"] = serde_json::json!(h);
        }
        serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name}, "spec": spec})
    };
    let event = |node: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": format!("keyplan-node-{node}.")},
            "involvedObject": {"apiVersion": "v1", "kind": "ConfigMap",
                "name": format!("keyplan-node-{node}"), "namespace": ns},
            "related": {"apiVersion": "v1", "kind": "Node", "name": node},
            "reason": "RunFailed", "message": "forged", "type": "Warning"})
    };
    // The current object at `path` with `f` applied (for an update).
    let changed = |path: &str, f: &dyn Fn(&mut Value)| {
        let mut v = c.get_json(path).unwrap_or_else(|| panic!("{path} exists"));
        f(&mut v);
        v
    };

    // Each node's own writes pass (and give the refusals below something to refuse).
    let own = |token: &str, method: &str, path: &str, body: Option<&Value>| {
        let r = c.request_as(token, method, path, body);
        assert!(
            (200..300).contains(&r.status),
            "{method} {path} of the node's own object: {} {}",
            r.status,
            r.body
        );
        r.body
    };
    own(&a, "POST", &cms, Some(&report("worker-1", "in_sync")));
    own(&b, "POST", &cms, Some(&report("worker-2", "failed")));
    own(
        &b,
        "POST",
        &leases,
        Some(&lease("keyplan-rollout-0", Some("worker-2"))),
    );
    own(&a, "POST", &events, Some(&event("worker-1")));
    let own_secret = format!("{secrets}/{osd_a}");
    let v = changed(&own_secret, &|v| {
        v["metadata"]["annotations"] = serde_json::json!({"keyplan.io/versions": "{}"})
    });
    own(&a, "PUT", &own_secret, Some(&v));

    let mut rows: Vec<Tried> = Vec::new();
    let mut refused = |who: &'static str,
                       what: &str,
                       token: &str,
                       method: &str,
                       path: &str,
                       body: Option<Value>| {
        let r = c.request_as(token, method, path, body.as_ref());
        let message = r.body["message"].as_str().unwrap_or_default().to_string();
        assert_eq!(r.status, 403, "{who}: {what}: {}", r.body);
        assert_eq!(r.body["reason"], "Forbidden", "{who}: {what}: {}", r.body);
        let by = if message.contains("ValidatingAdmissionPolicy 'keyplan-agent-node-scope") {
            "admission policy"
        } else {
            "RBAC"
        };
        rows.push(Tried {
            who,
            what: what.to_string(),
            status: r.status,
            reason: message,
            by,
        });
    };
    let b_report = format!("{cms}/keyplan-node-worker-2");
    refused(
        "A",
        "create B's report",
        &a,
        "POST",
        &cms,
        Some(report("worker-2", "in_sync")),
    );
    refused(
        "A",
        "clear B's failure (the halt) in B's report",
        &a,
        "PUT",
        &b_report,
        Some(changed(&b_report, &|v| {
            v["data"]["report.json"] = serde_json::json!("{\"state\":\"in_sync\"}")
        })),
    );
    let a_report = format!("{cms}/keyplan-node-worker-1");
    own(
        &b,
        "PUT",
        &b_report,
        Some(&changed(&b_report, &|v| {
            v["data"]["report.json"] = serde_json::json!("{\"state\":\"in_sync\"}")
        })),
    );
    refused(
        "B",
        "set the halt: a failure in A's report",
        &b,
        "PUT",
        &a_report,
        Some(changed(&a_report, &|v| {
            v["data"]["report.json"] = serde_json::json!("{\"state\":\"failed\"}")
        })),
    );
    refused(
        "A",
        "take a free slot as B",
        &a,
        "POST",
        &leases,
        Some(lease("keyplan-rollout-1", Some("worker-2"))),
    );
    let slot0 = format!("{leases}/keyplan-rollout-0");
    refused(
        "A",
        "release B's slot",
        &a,
        "PUT",
        &slot0,
        Some(changed(&slot0, &|v| {
            v["spec"]
                .as_object_mut()
                .map(|s| s.remove("holderIdentity"));
        })),
    );
    refused(
        "A",
        "hand B's slot to another node",
        &a,
        "PUT",
        &slot0,
        Some(changed(&slot0, &|v| {
            v["spec"]["holderIdentity"] = serde_json::json!("worker-3")
        })),
    );
    refused("A", "delete B's slot", &a, "DELETE", &slot0, None);
    refused(
        "A",
        "rewrite the plan ConfigMap",
        &a,
        "PUT",
        &format!("{cms}/keyplan-plan"),
        Some(changed(&format!("{cms}/keyplan-plan"), &|v| {
            v["data"]["x"] = serde_json::json!("mine")
        })),
    );
    refused(
        "A",
        "create a ConfigMap named like the agent configuration",
        &a,
        "POST",
        &cms,
        Some(
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "keyplan-agent-2"}}),
        ),
    );
    refused(
        "A",
        "delete the agent configuration",
        &a,
        "DELETE",
        &format!("{cms}/keyplan-agent"),
        None,
    );
    refused(
        "A",
        "pause the fleet (create keyplan-pause)",
        &a,
        "POST",
        &cms,
        Some(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "keyplan-pause",
                "labels": {"app.kubernetes.io/component": "fleet-pause"}},
            "data": {"reason": "forged"}})),
    );
    c.ensure(
        &cms,
        &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "keyplan-pause"}, "data": {"reason": "operator's"}}),
    );
    refused(
        "A",
        "resume the fleet (delete keyplan-pause)",
        &a,
        "DELETE",
        &format!("{cms}/keyplan-pause"),
        None,
    );
    refused(
        "A",
        "an Event in B's name",
        &a,
        "POST",
        &events,
        Some(event("worker-2")),
    );
    let b_secret = format!("{secrets}/{osd_b}");
    refused(
        "A",
        "vote/hold as B: B's OSD key Secret's annotation",
        &a,
        "PUT",
        &b_secret,
        Some(changed(
            &b_secret,
            &|v| {
                v["metadata"]["annotations"] =
                    serde_json::json!({"keyplan.io/versions": "{\"holders\":{}}"})
            },
        )),
    );
    refused(
        "A",
        "update B's OSD key",
        &a,
        "PUT",
        &b_secret,
        Some(changed(&b_secret, &|v| {
            v["data"]["dmcrypt-key"] = serde_json::json!("Zm9yZ2Vk")
        })),
    );
    refused("A", "delete B's OSD key", &a, "DELETE", &b_secret, None);
    // B's Event (B's own create, above, passes): A may not raise its count (a patch).
    let b_event = own(&b, "POST", &events, Some(&event("worker-2")));
    let b_event = format!(
        "{events}/{}",
        b_event["metadata"]["name"]
            .as_str()
            .expect("the Event's name")
    );
    refused(
        "A",
        "raise the count of B's Event (patch)",
        &a,
        "PATCH",
        &b_event,
        Some(serde_json::json!({"count": 5})),
    );
    refused(
        "A",
        "create a Secret no OSD of A uses",
        &a,
        "POST",
        &secrets,
        Some(
            serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "planted"}}),
        ),
    );
    refused(
        "no node",
        "create its report",
        &nameless,
        "POST",
        &cms,
        Some(report("worker-1", "in_sync")),
    );
    refused(
        "no node",
        "take a slot",
        &nameless,
        "POST",
        &leases,
        Some(lease("keyplan-rollout-1", Some("worker-1"))),
    );
    refused(
        "no node",
        "update an OSD key",
        &nameless,
        "PUT",
        &own_secret,
        Some(changed(&own_secret, &|v| {
            v["data"]["dmcrypt-key"] = serde_json::json!("Zm9yZ2Vk")
        })),
    );

    // Issue 31: a repeated Event is one object whose count and series grow (a patch, which
    // the Role grants and the policy admits for the node's own Events); another message is
    // another Event.
    let a_client = keyplan::fleet::client(
        Some(&c.node_client(&ns, "keyplan", "worker-1").kubeconfig),
        None,
    )
    .expect("worker-1's client");
    let writer = keyplan::fleet::events::Events::new(a_client, &ns, "worker-1");
    for _ in 0..3 {
        writer.emit(
            keyplan::fleet::events::EventType::Warning,
            "RunFailed",
            "node worker-1: run failed: the same way",
        );
    }
    writer.emit(
        keyplan::fleet::events::EventType::Warning,
        "RunFailed",
        "node worker-1: run failed: another way",
    );
    let mine: Vec<Value> = c
        .get_json(&events)
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("node worker-1: run failed:"))
        })
        .collect();
    assert_eq!(mine.len(), 2, "one Event per message: {mine:?}");
    let same = mine
        .iter()
        .find(|e| e["message"] == "node worker-1: run failed: the same way")
        .expect("the repeated Event");
    assert_eq!(same["count"], 3, "{same}");
    assert_eq!(same["series"]["count"], 3, "{same}");
    assert!(same["series"]["lastObservedTime"].is_string(), "{same}");

    // Nothing of B's changed.
    let lease0 = c.get_json(&slot0).expect("slot 0");
    assert_eq!(lease0["spec"]["holderIdentity"], "worker-2");
    assert_eq!(
        c.get_json(&b_secret).expect("B's Secret")["data"]["dmcrypt-key"],
        "c2VjcmV0"
    );
    assert!(c.get_json(&format!("{leases}/keyplan-rollout-1")).is_none());
    println!("| token | tried | answer | refused by |\n|---|---|---|---|");
    for r in &rows {
        let reason = r
            .reason
            .rsplit("denied request: ")
            .next()
            .unwrap_or(&r.reason);
        println!(
            "| {} | {} | {} Forbidden: {} | {} |",
            r.who, r.what, r.status, reason, r.by
        );
    }
    assert!(
        rows.iter().filter(|r| r.by == "admission policy").count() >= 12,
        "the policy, not only RBAC, refuses"
    );
}

/// Issue 31: the agent re-reads its token file (the kubelet replaces a projected token at 80%
/// of its life): once the file holds a new token, the agent uses it, and with the old token
/// dead (its Pod deleted) the agent goes on without an authentication failure.
#[test]
fn a_replaced_token_file_keeps_the_agent_working() {
    let s = Scratch::new();
    let Some(fake) = Real::new("fleet-token") else {
        return;
    };
    let node = "worker-1";
    let kubeconfig = fake
        .agent_kubeconfig(&[node.to_string()], None)
        .of(node)
        .to_path_buf();
    let img = s.small_image("disk.img", "luks2");
    let keys = s.path("keys");
    let plan = format!(
        "version: 1\nkms:\n  local: {{ provider: file, path: {} }}\nkeys:\n  k1: {{ kms: local }}\ndevices:\n  d1: {{ path: {}, node: {node}, keys: [k1], enroll_with: {} }}\n{FAST_PBKDF}",
        keys.display(),
        img.display(),
        s.initial_pass().display()
    );
    let config = file_agent_config(&s, &keys);
    let cm = ConfigMapDir::new(s.path("plan-volume"), &plan);
    let mut agent = Agent {
        args: agent_args(
            node,
            &cm.plan(),
            &config,
            &s.path("state"),
            &kubeconfig,
            &["--namespace", &fake.ns, "--interval", "1s", "--poll", "1s"],
        ),
        env: vec![],
        log: s.path("agent.log"),
        child: None,
        started: 0,
    };
    agent.spawn();
    let log = || std::fs::read_to_string(s.path("agent.log")).unwrap_or_default();
    wait_for(
        60,
        "the enrollment",
        || state(&fake, node) == "in_sync",
        log,
    );

    // The kubelet's rotation: a new token (of a new Pod on the same node, so the old one can
    // be killed) written to the file by rename, as the kubelet's atomic writer does.
    let c = fake.c;
    c.ensure(
        &format!("/api/v1/namespaces/{}/pods", fake.ns),
        &serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "keyplan-worker-1-next"},
            "spec": {"nodeName": node, "serviceAccountName": "keyplan",
                "automountServiceAccountToken": false,
                "containers": [{"name": "agent", "image": "keyplan:test"}]}}),
    );
    let next = c.service_account_token(&fake.ns, "keyplan", &[], Some("keyplan-worker-1-next"));
    let second = format!("{} (second token)", fake.agent_user);
    c.register_token(&next, &second);
    let file = fake.tokens.path().join(format!("token-{node}"));
    let tmp = fake.tokens.path().join("..token.tmp");
    std::fs::write(&tmp, &next).expect("write");
    std::fs::rename(&tmp, &file).expect("rename");
    let report_put = |r: &kube_proxy::Logged| {
        r.method == "PUT"
            && r.path
                .ends_with(&format!("/configmaps/keyplan-node-{node}"))
    };
    // kube's client reads a token file again when its copy is a minute old.
    wait_for(
        90,
        "a request with the new token",
        || {
            fake.proxy
                .requests_by_user(&second)
                .iter()
                .any(|r| r.code == 200)
        },
        log,
    );
    // The old token dies with its Pod.
    assert!(c.delete(&format!(
        "/api/v1/namespaces/{}/pods/keyplan-worker-1",
        fake.ns
    )));
    let mark = fake.proxy.mark();
    wait_for(
        30,
        "three report updates after the old token died",
        || {
            fake.proxy
                .requests_since(mark)
                .iter()
                .filter(|r| report_put(r) && r.code == 200 && r.user == second)
                .count()
                >= 3
        },
        log,
    );
    let after = fake.proxy.requests_since(mark);
    assert!(
        after.iter().all(|r| r.code != 401 && r.code != 403),
        "{:?}",
        after
            .iter()
            .filter(|r| r.code >= 400)
            .map(|r| (&r.method, &r.path, r.code))
            .collect::<Vec<_>>()
    );
    assert_eq!(state(&fake, node), "in_sync");
    assert_eq!(agent.term(30), Some(0), "{}", log());
}

/// `keyplan fleet ...` as the operator (through the proxy), with `args` after the command
/// name; returns (exit code, stdout, stderr).
fn operator(kubeconfig: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = keyplan_command()
        .arg("fleet")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("USER", "alice")
        .output()
        .expect("run keyplan fleet");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 31: the operator's brake. `keyplan fleet pause` (the namespace from the plan's
/// settings.fleet.namespace) stops a node with work from taking a slot at its next poll
/// (state `paused` in its report, `/metrics` and `fleet status`, an Event); a node that is
/// applying when the pause comes finishes its run and takes no new slot; the agents' tokens
/// can neither pause nor resume; `keyplan fleet resume` lets them go on.
#[test]
fn an_operator_pauses_and_resumes_the_rollout() {
    let s = Scratch::new();
    let Some(fake) = Real::new("fleet-pause") else {
        return;
    };
    let node = "worker-1";
    let kubeconfig = fake
        .agent_kubeconfig(&[node.to_string()], None)
        .of(node)
        .to_path_buf();
    let operator_kc = fake.operator_kubeconfig();
    let img = s.small_image("disk.img", "luks2");
    let keys = s.path("keys");
    let plan = |key_list: &str| {
        format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: {} }}\nkeys:\n  k1: {{ kms: local }}\n  k2: {{ kms: local }}\ndevices:\n  d1: {{ path: {}, node: {node}, keys: [{key_list}], enroll_with: {} }}\n{FAST_PBKDF}  fleet: {{ namespace: {} }}\n",
            keys.display(),
            img.display(),
            s.initial_pass().display(),
            fake.ns
        )
    };
    let mut cm = ConfigMapDir::new(s.path("plan-volume"), &plan("k1"));
    let plan_file = s.plan("operator-plan.yaml", &plan("k1"));
    let config = file_agent_config(&s, &keys);
    let gate = s.path("commit-gate");
    std::fs::write(&gate, "held").expect("gate");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut agent = Agent {
        args: agent_args(
            node,
            &cm.plan(),
            &config,
            &s.path("state"),
            &kubeconfig,
            &["--interval", "2s", "--poll", "1s", "--listen", &listen],
        ),
        // Every run holds just before its KMS commit while `commit-gate` exists.
        env: vec![(
            "FAILPOINTS".into(),
            format!("commit.before=return(wait:{})", gate.display()),
        )],
        log: s.path("agent.log"),
        child: None,
        started: 0,
    };
    agent.spawn();
    let log = || std::fs::read_to_string(s.path("agent.log")).unwrap_or_default();
    let plan_arg = plan_file.display().to_string();

    // A run in progress (held at its commit) when the operator pauses.
    wait_for(
        60,
        "the enrollment run to hold its slot",
        || state(&fake, node) == "running" && holders(&fake) == [node.to_string()],
        log,
    );
    let (code, out, err) = operator(
        &operator_kc,
        &["pause", "-f", &plan_arg, "--reason", "change freeze"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(&format!("Paused the rollout in namespace {}", fake.ns)),
        "{out}"
    );
    let (code, out, _) = operator(&operator_kc, &["pause", "-f", &plan_arg]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("already paused by alice") && out.contains("change freeze"),
        "{out}"
    );
    // The run goes on to its end, and the slot is given back.
    std::fs::remove_file(&gate).expect("open the gate");
    wait_for(
        60,
        "the run in progress to finish",
        || state(&fake, node) == "in_sync" && holders(&fake).is_empty(),
        log,
    );
    assert_eq!(
        keyslots(&img).len(),
        2,
        "k1 enrolled beside the initial passphrase"
    );

    // New work while paused: no slot is taken.
    cm.write(&plan("k1, k2"));
    wait_for(
        60,
        "the agent to see the pause",
        || state(&fake, node) == "paused",
        log,
    );
    let r = report(&fake, node).expect("report");
    assert!(
        r["message"]
            .as_str()
            .unwrap_or_default()
            .contains("paused by alice"),
        "{r}"
    );
    // The node keeps its place in the queue through the pause (docs/fleet.md, "The queue").
    assert!(r["waiting_since"].as_u64().is_some(), "{r}");
    let (code, metrics) = http_get(port, "/metrics").expect("metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("keyplan_agent_fleet_paused{node=\"worker-1\"} 1"),
        "{metrics}"
    );
    let (code, out, err) = operator(&operator_kc, &["status", "-f", &plan_arg]);
    assert!(
        out.contains("the rollout is PAUSED (paused by alice"),
        "{out}{err}"
    );
    assert!(out.contains("paused"), "{out}");
    assert_eq!(code, Some(0), "a pause is no failure: {out}{err}");
    let (_, json, _) = operator(
        &operator_kc,
        &["status", "-f", &plan_arg, "--format", "json"],
    );
    let v: Value = serde_json::from_str(&json).expect("status JSON");
    assert_eq!(v["paused"]["reason"], "change freeze", "{v}");
    let events = fake.c.objects("events", &fake.ns);
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "RolloutPaused"
                && e["involvedObject"]["name"] == "keyplan-pause"),
        "{events:?}"
    );
    // Three full cycles later (three heartbeats of the report), still no slot and no change,
    // and the agent learnt nothing by polling: it watches the pause (issue 31).
    let mark = fake.proxy.mark();
    wait_for(
        30,
        "three heartbeats while paused",
        || {
            fake.proxy
                .requests_since(mark)
                .iter()
                .filter(|r| {
                    r.method == "PUT"
                        && r.path
                            .ends_with(&format!("/configmaps/keyplan-node-{node}"))
                        && r.user == fake.agent_user
                })
                .count()
                >= 3
        },
        log,
    );
    let polls: Vec<_> = fake
        .proxy
        .requests_since(mark)
        .into_iter()
        .filter(|r| {
            r.user == fake.agent_user && r.method == "GET" && !r.query.contains("watch=true")
        })
        .filter(|r| r.path.ends_with("/configmaps") || r.path.contains("/leases"))
        .collect();
    assert!(polls.is_empty(), "a paused agent polled: {polls:?}");
    assert!(holders(&fake).is_empty());
    assert_eq!(keyslots(&img).len(), 2);
    // A node's token can neither resume nor pause the fleet.
    let token =
        std::fs::read_to_string(fake.tokens.path().join(format!("token-{node}"))).expect("token");
    let path = format!("/api/v1/namespaces/{}/configmaps/keyplan-pause", fake.ns);
    let r = fake.c.request_as(&token, "DELETE", &path, None);
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (403, Some("Forbidden")),
        "{}",
        r.body
    );
    let mut pause = fake.c.get_json(&path).expect("the pause");
    pause["data"]["reason"] = serde_json::json!("");
    let r = fake.c.request_as(&token, "PUT", &path, Some(&pause));
    assert_eq!(
        (r.status, r.body["reason"].as_str()),
        (403, Some("Forbidden")),
        "{}",
        r.body
    );

    // Resume: the node takes a slot at its next poll.
    let (code, out, err) = operator(&operator_kc, &["resume", "-f", &plan_arg]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("Resumed the rollout"), "{out}");
    wait_for(
        60,
        "the run after the resume",
        || state(&fake, node) == "in_sync" && keyslots(&img).len() == 3,
        log,
    );
    let (code, out, _) = operator(&operator_kc, &["resume", "-f", &plan_arg]);
    assert_eq!(code, Some(0));
    assert!(out.contains("is not paused"), "{out}");
    let (_, metrics) = http_get(port, "/metrics").expect("metrics");
    assert!(
        metrics.contains("keyplan_agent_fleet_paused{node=\"worker-1\"} 0"),
        "{metrics}"
    );
    assert_eq!(agent.term(30), Some(0), "{}", log());
}

/// What the soak samples of a running agent: resident memory (KiB, `VmRSS`), open file
/// descriptors, and the bytes of its state directory's files (all, the journal, the audit
/// trail).
#[derive(Debug, Clone, Copy)]
struct SoakSample {
    rss_kib: u64,
    fds: usize,
    state: u64,
    journal: u64,
    history: u64,
}

fn soak_sample(pid: u32, state: &Path) -> SoakSample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("agent status");
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("agent fds")
        .count();
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    SoakSample {
        rss_kib,
        fds,
        state: walk(state).iter().map(|p| size(p)).sum(),
        journal: size(&state.join("journal.jsonl")),
        history: size(&state.join("history.jsonl")),
    }
}

/// The node agent over many cycles (issue 32): `KEYPLAN_SOAK_CYCLES` cycles of 1 s (default
/// 60; the soak: `KEYPLAN_SOAK_CYCLES=5000 KEYPLAN_SOAK_ROTATE_AFTER=300s`), its key rotating
/// every `KEYPLAN_SOAK_ROTATE_AFTER` (default 20s) and the audit trail kept to 2 runs. At the
/// start, the middle and the end it prints `SOAK {json}`: resident memory, open descriptors,
/// the state directory's size, and the agent's API writes in five idle cycles (their count,
/// and how many were not its report's heartbeat). From the middle to the end memory,
/// descriptors and state size stay flat, and an idle cycle writes only the heartbeat.
#[test]
fn agent_soak() {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let cycles: u64 = env("KEYPLAN_SOAK_CYCLES")
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let rotate = env("KEYPLAN_SOAK_ROTATE_AFTER").unwrap_or_else(|| "20s".into());
    let s = Scratch::new();
    let Some(fake) = Real::new("fleet-soak") else {
        return;
    };
    let node = "worker-1";
    let kubeconfig = fake
        .agent_kubeconfig(&[node.to_string()], None)
        .of(node)
        .to_path_buf();
    let img = s.small_image("disk.img", "luks2");
    let keys = s.path("keys");
    let plan = format!(
        "version: 1\nkms:\n  local: {{ provider: file, path: {} }}\nkeys:\n  k1: {{ kms: local, rotate_after: {rotate} }}\ndevices:\n  d1: {{ path: {}, node: {node}, keys: [k1], enroll_with: {} }}\n{FAST_PBKDF}",
        keys.display(),
        img.display(),
        s.initial_pass().display()
    );
    let config = file_agent_config(&s, &keys);
    let cm = ConfigMapDir::new(s.path("plan-volume"), &plan);
    let state_dir = s.path("state");
    let mut agent = Agent {
        args: agent_args(
            node,
            &cm.plan(),
            &config,
            &state_dir,
            &kubeconfig,
            &[
                "--namespace",
                &fake.ns,
                "--interval",
                "1s",
                "--poll",
                "1s",
                "--journal-keep-runs",
                "2",
            ],
        ),
        env: vec![],
        log: s.path("agent.log"),
        child: None,
        started: 0,
    };
    agent.spawn();
    let pid = agent.child.as_ref().map(|c| c.id()).expect("agent pid");
    let log = || std::fs::read_to_string(s.path("agent.log")).unwrap_or_default();
    wait_for(
        60,
        "the enrollment",
        || state(&fake, node) == "in_sync",
        log,
    );
    let t0 = Instant::now();
    let version = || report(&fake, node).and_then(|r| r["keys"][0]["current_version"].as_u64());
    let heartbeat = |r: &kube_proxy::Logged| {
        r.method == "PUT"
            && r.path
                .ends_with(&format!("/configmaps/keyplan-node-{node}"))
    };
    // Five idle cycles' writes: (all writes, writes other than the heartbeat). Writes other
    // than the heartbeat mean a run (the key's rotation, due every `rotate`) began in the
    // window: the test waits for it to commit its version and measures again; a window with
    // other writes and no run after it fails here.
    let idle_writes = || -> (usize, usize) {
        loop {
            let before = version().unwrap_or(0);
            let mark = fake.proxy.mark();
            wait_for(
                30,
                "five heartbeats",
                || {
                    fake.proxy
                        .requests_since(mark)
                        .iter()
                        .filter(|r| heartbeat(r) && r.user == fake.agent_user)
                        .count()
                        >= 5
                },
                log,
            );
            let writes: Vec<_> = fake
                .proxy
                .requests_since(mark)
                .into_iter()
                .filter(|r| r.user == fake.agent_user && r.method != "GET")
                .collect();
            let other: Vec<String> = writes
                .iter()
                .filter(|r| !heartbeat(r))
                .map(|r| format!("{} {} {}", r.method, r.path, r.code))
                .collect();
            if other.is_empty() {
                return (writes.len(), 0);
            }
            wait_for(
                60,
                "the run whose writes fell in the idle window to commit its version",
                || version().unwrap_or(0) > before,
                || format!("writes other than the heartbeat: {other:?}\n{}", log()),
            );
        }
    };
    let mut samples = Vec::new();
    for (name, at) in [("start", 2), ("middle", cycles / 2), ("end", cycles)] {
        wait_for(
            cycles + 120,
            &format!("cycle {at}"),
            || t0.elapsed() >= Duration::from_secs(at),
            log,
        );
        let sample = soak_sample(pid, &state_dir);
        let (writes, other) = idle_writes();
        assert_eq!(other, 0);
        let doc = serde_json::json!({
            "at": name,
            "cycle": t0.elapsed().as_secs(),
            "rss_kib": sample.rss_kib,
            "open_fds": sample.fds,
            "state_bytes": sample.state,
            "journal_bytes": sample.journal,
            "history_bytes": sample.history,
            "key_version": version(),
            "idle_writes_in_5_cycles": writes,
            "idle_writes_not_heartbeat": other,
        });
        eprintln!("SOAK {doc}");
        samples.push(sample);
    }
    let (mid, end) = (samples[1], samples[2]);
    let rotations = version().unwrap_or(0);
    assert!(
        rotations >= 2,
        "the key rotated {rotations} times in {cycles} cycles\n{}",
        log()
    );
    assert!(
        end.rss_kib <= mid.rss_kib + (mid.rss_kib / 4).max(8192),
        "memory grew from {} KiB to {} KiB",
        mid.rss_kib,
        end.rss_kib
    );
    assert!(
        end.fds <= mid.fds + 2,
        "descriptors: {} then {}",
        mid.fds,
        end.fds
    );
    assert!(
        end.state <= mid.state + mid.state / 2,
        "state directory: {} bytes then {}",
        mid.state,
        end.state
    );
    assert_eq!(agent.term(30), Some(0), "{}", log());
}
