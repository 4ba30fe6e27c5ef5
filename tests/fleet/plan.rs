//! Fleet mode, the plan format (issue 15): devices name their Kubernetes node, `validate`
//! checks the whole file, `plan`/`apply`/`status` act only on this node's devices (`--node`,
//! `$NODE_NAME`, else the host name) and say what is left to other nodes; `settings.fleet`;
//! a key on several nodes is valid, and each node's part knows the key's other nodes (peers).

use std::path::Path;

use crate::common::*;
use keyplan::spec::{load_str, Format};

/// A plan over the file KMS: per device `(id, node, key)`, node `None` for no `node:`.
fn cluster(devices: &[(&str, Option<&str>, &str)], extra: &str) -> String {
    let mut keys: Vec<&str> = devices.iter().map(|d| d.2).collect();
    keys.sort();
    keys.dedup();
    let mut t = String::from("version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n");
    for k in keys {
        t.push_str(&format!("  {k}: {{ kms: local }}\n"));
    }
    t.push_str("devices:\n");
    for (id, node, key) in devices {
        let node = node.map(|n| format!(", node: {n}")).unwrap_or_default();
        t.push_str(&format!(
            "  {id}: {{ path: {id}.img, keys: [{key}], enroll_with: initial.pass{node} }}\n"
        ));
    }
    t.push_str(FAST_PBKDF);
    t.push_str(extra);
    t
}

fn load(text: &str) -> Result<keyplan::spec::Plan, String> {
    // The report as rendered, with its line wrapping undone.
    load_str(text, "plan.yaml", Format::Yaml, Path::new("/plans")).map_err(|e| {
        format!("{e:?}")
            .replace('│', " ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    })
}

#[test]
fn a_cluster_plan_is_cut_to_one_node() {
    let plan = load(&cluster(
        &[
            ("a", Some("n1"), "ka"),
            ("b", Some("n2"), "kb"),
            ("c", Some("n2"), "kc"),
            ("d", Some("n1"), "kd"),
        ],
        "",
    ))
    .expect("valid");
    assert!(plan.names_nodes());
    let n1 = plan.clone().for_node("n1");
    assert_eq!(n1.devices.keys().collect::<Vec<_>>(), ["a", "d"]);
    assert_eq!(n1.keys.keys().collect::<Vec<_>>(), ["ka", "kd"]);
    let scope = n1.scope.as_ref().expect("scope");
    assert_eq!(scope.elsewhere.get("n2"), Some(&2));
    assert_eq!(scope.keys_left_out, ["kb", "kc"]);
    assert_eq!(
        scope.note().as_deref(),
        Some("node n1: 2 devices of the plan are on other nodes (n2: 2) and 2 keys are used only there; keyplan on those nodes handles them")
    );
    // A node with no device of the plan says so (a wrong `--node` shows here).
    let n3 = plan.clone().for_node("n3");
    assert!(n3.devices.is_empty());
    assert_eq!(
        n3.scope.as_ref().and_then(|s| s.note()).as_deref(),
        Some("node n3: no device of the plan is on this node (the plan's devices are on n1: 2, n2: 2); if this host is one of those, give its node with `--node` or `$NODE_NAME`")
    );
    // A key no device lists: no node rotates it, and the note says so.
    let unused = load(
        &cluster(&[("a", Some("n1"), "ka")], "")
            .replace("keys:\n", "keys:\n  spare: { kms: local }\n"),
    )
    .expect("valid")
    .for_node("n1");
    assert_eq!(
        unused.scope.as_ref().and_then(|s| s.note()).as_deref(),
        Some("no device of the plan lists key `spare`, so no node rotates it: in a plan for several nodes a key belongs to the node of its devices")
    );

    // A plan that names no node is every host's, unchanged.
    let single = load(&cluster(&[("a", None, "ka")], "  fleet: {}\n")).expect("valid");
    let cut = single.clone().for_node("anything");
    assert!(cut.scope.is_none() && cut.devices.len() == 1 && cut.keys.len() == 1);
}

#[test]
fn validate_checks_nodes_keys_and_fleet_settings() {
    let bad = |text: &str, phrase: &str| match load(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => assert!(e.contains(phrase), "{phrase:?} not in {e}"),
    };
    // One key on two nodes: one two-phase commit across them; each node's part names the
    // other node as the key's peer.
    let shared = load(&cluster(
        &[
            ("a", Some("n1"), "k"),
            ("b", Some("n2"), "k"),
            ("c", Some("n3"), "k"),
        ],
        "",
    ))
    .expect("a key on three nodes");
    let n2 = shared.for_node("n2");
    assert_eq!(
        n2.peers
            .get("k")
            .map(|p| p.iter().cloned().collect::<Vec<_>>()),
        Some(vec!["n1".to_string(), "n3".to_string()])
    );
    // In a plan for several nodes every device names its node.
    bad(
        &cluster(&[("a", Some("n1"), "ka"), ("b", None, "kb")], ""),
        "device `b` names no `node`, but other devices of the plan do (e.g. `a`)",
    );
    // Node names: Kubernetes limits the whole name (253), not each part.
    load(&cluster(&[("a", Some(&"x".repeat(100)), "k")], "")).expect("a long node name");
    bad(
        &cluster(&[("a", Some(&"x".repeat(254)), "k")], ""),
        "is not a Kubernetes node name",
    );
    bad(
        &cluster(&[("a", Some("Node_1"), "k")], ""),
        "`node` \"Node_1\" is not a Kubernetes node name",
    );
    // The same path twice on one node; on two nodes it is two devices.
    let twice = "version: 1\nkms:\n  l: { provider: file, path: keys }\nkeys:\n  a: { kms: l }\n  b: { kms: l }\ndevices:\n  x: { path: /dev/sdb, keys: [a], node: NODE1 }\n  y: { path: /dev/sdb, keys: [b], node: NODE2 }\n";
    bad(
        &twice.replace("NODE1", "n1").replace("NODE2", "n1"),
        "device `y` has the same path as device `x`",
    );
    load(&twice.replace("NODE1", "n1").replace("NODE2", "n2")).expect("one path on two nodes");
    // settings.fleet.
    let fleet = |f: &str| cluster(&[("a", Some("n1"), "k")], &format!("  fleet: {f}\n"));
    bad(
        &fleet("{ max_concurrent_nodes: 0 }"),
        "`max_concurrent_nodes` is 0",
    );
    bad(&fleet("{ max_failed_nodes: 0 }"), "`max_failed_nodes` is 0");
    bad(
        &fleet("{ namespace: Key_Plan }"),
        "is not a Kubernetes namespace name",
    );
    bad(&fleet("{ max_nodes: 3 }"), "max_nodes");
    let p = load(&fleet(
        "{ max_concurrent_nodes: 3, max_failed_nodes: 2, namespace: storage }",
    ))
    .expect("valid");
    assert_eq!(
        (
            p.fleet.max_concurrent_nodes,
            p.fleet.max_failed_nodes,
            p.fleet.namespace.as_str()
        ),
        (3, 2, "storage")
    );
    let p = load(&fleet("{}")).expect("valid");
    assert_eq!(
        (
            p.fleet.max_concurrent_nodes,
            p.fleet.max_failed_nodes,
            p.fleet.namespace.as_str()
        ),
        (1, 1, "keyplan")
    );
}

/// `plan`/`apply`/`status` with `--node` (and `$NODE_NAME`) act on that node's devices only;
/// other nodes' device files need not exist here.
#[test]
fn commands_act_on_this_nodes_devices_only() {
    let s = Scratch::new();
    let a = s.small_image("a.img", "luks2");
    let c = s.small_image("c.img", "luks2");
    s.initial_pass();
    s.plan(
        "keyplan.yaml",
        &cluster(
            &[
                ("a", Some("n1"), "ka"),
                ("b", Some("n2"), "kb"),
                ("c", Some("n1"), "kc"),
            ],
            "",
        ),
    );
    let out = s.ok(&["validate"], 0);
    assert!(
        out.contains("1 KMS, 3 keys, 3 devices on 2 nodes."),
        "{out}"
    );

    // A --node that is no node name is refused, not a node matching nothing.
    let out = s.ok(&["--node", "Worker_1", "plan"], 1);
    assert!(
        out.contains("\"Worker_1\" is not a Kubernetes node name"),
        "{out}"
    );
    let out = s.ok(&["--node", "n2", "key", "get", "ka"], 1);
    assert!(
        out.contains("key \"ka\" of") && out.contains("is not node n2's"),
        "{out}"
    );

    let out = s.ok(&["--node", "n1", "plan"], 0);
    assert!(
        out.contains("+ keyslot 1  ka v1") && out.contains("+ keyslot 1  kc v1"),
        "{out}"
    );
    // No line about n2's key kb (not a bare "kb": the temp dir's random name in the device
    // paths may hold those two letters, which failed this test once).
    assert!(
        !out.lines()
            .any(|l| l.contains("key kb") || l.contains(" kb v")),
        "{out}"
    );
    assert!(
        out.contains(
            "node n1: 1 device of the plan is on other nodes (n2: 1) and 1 key is used only there"
        ),
        "{out}"
    );
    let out = s.ok_with_env(
        &["apply", "--auto-approve"],
        &[("NODE_NAME", Path::new("n1"))],
        0,
    );
    assert!(out.contains("Apply complete! 2 added"), "{out}");
    assert_eq!(keyslots(&a), vec![0, 1]);
    assert_eq!(keyslots(&c), vec![0, 1]);
    assert!(!s.path("keys/kb").exists(), "n2's key is left to n2");

    let (out, _) = status(&s, "n1");
    assert_eq!(out["node"]["name"], "n1");
    assert_eq!(out["node"]["devices_elsewhere"]["n2"], 1);
    assert_eq!(out["node"]["keys_elsewhere"], serde_json::json!(["kb"]));
    assert_eq!(out["devices"].as_array().map(Vec::len), Some(2));
    assert_eq!(out["healthy"], true, "{out:#}");

    // On n2 the device file is missing: that is n2's problem, reported there only. (n2 is
    // another host: its state directory is its own, not n1's, which n1's plan owns.)
    let out = s.keyplan(&[
        "--node",
        "n2",
        "--state-dir",
        "st-n2",
        "status",
        "--format",
        "json",
    ]);
    let (out, code): (serde_json::Value, _) = (
        serde_json::from_slice(&out.stdout).expect("status JSON"),
        out.status.code(),
    );
    assert_eq!(code, Some(1), "{out:#}");
    assert_eq!(out["devices"][0]["id"], "b");
    let text = s.ok(&["--node", "n1", "status"], 0);
    assert!(
        text.starts_with("node n1: 2 devices here; 1 on 1 other node, 1 key used only there"),
        "{text}"
    );
}

/// `status --node NODE --format json` as JSON, and its exit status.
fn status(s: &Scratch, node: &str) -> (serde_json::Value, Option<i32>) {
    let out = s.keyplan(&["--node", node, "status", "--format", "json"]);
    (
        serde_json::from_slice(&out.stdout).expect("status JSON"),
        out.status.code(),
    )
}

/// A `kubectl get pv -o json` item: a local PV bound to `ns/pvc` on `node`, in `mode`
/// (`spec.volumeMode`, `None` for none: Filesystem).
fn pv(
    name: &str,
    ns: &str,
    pvc: &str,
    node: &str,
    path: Option<&str>,
    mode: Option<&str>,
) -> serde_json::Value {
    let mut spec = serde_json::json!({
        "claimRef": {"namespace": ns, "name": pvc},
        "storageClassName": "local-osd",
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
        ]}]}}
    });
    if let Some(p) = path {
        spec["local"] = serde_json::json!({ "path": p });
    }
    if let Some(m) = mode {
        spec["volumeMode"] = serde_json::json!(m);
    }
    serde_json::json!({"metadata": {"name": name}, "spec": spec})
}

/// A local block PV, as Rook's OSDs on PVC use.
fn block_pv(name: &str, ns: &str, pvc: &str, node: &str, path: Option<&str>) -> serde_json::Value {
    pv(name, ns, pvc, node, path, Some("Block"))
}

/// Runs examples/rook/plan-from-pvs.py with `args` on the PV list `items`, in `s`: its
/// stdout and stderr; it must succeed.
fn generate(s: &Scratch, args: &[&str], items: &[serde_json::Value]) -> (String, String) {
    let list = serde_json::json!({"kind": "PersistentVolumeList", "items": items});
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rook/plan-from-pvs.py");
    std::fs::write(s.path("pvs.json"), list.to_string()).expect("write pvs.json");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .args(args)
        .stdin(std::fs::File::open(s.path("pvs.json")).expect("pvs.json"))
        .output()
        .expect("run the generator");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), err)
}

/// The example generator turns `kubectl get pv -o json` into a plan that validates.
#[test]
fn the_rook_example_generator_writes_a_valid_cluster_plan() {
    let s = Scratch::new();
    let (plan_text, err) = generate(
        &s,
        &["--max-concurrent-nodes", "2"],
        &[
            block_pv(
                "pv-a",
                "rook-ceph",
                "set1-data-0-abcde",
                "worker-1",
                Some("/dev/sdb"),
            ),
            block_pv(
                "pv-b",
                "rook-ceph",
                "set1-data-1-fghij",
                "worker-2",
                Some("/dev/sdb"),
            ),
            block_pv("pv-c", "other", "db", "worker-1", Some("/dev/sdc")),
            block_pv("pv-d", "rook-ceph", "set1-data-2-klmno", "worker-3", None),
        ],
    );
    assert!(
        err.contains("skipped PV pv-d: no spec.local.path") && err.contains("2 OSDs on 2 nodes"),
        "{err}"
    );
    // Plain names and paths are written as they were (only what YAML would read as another
    // type is quoted).
    assert!(
        plan_text.contains("\n  rook: { provider: kubernetes, namespace: rook-ceph }\n")
            && plan_text.contains("\n  set1-data-0-abcde: { kms: rook, name: rook-ceph-osd-encryption-key-set1-data-0-abcde, rotate_after: 90d }\n")
            && plan_text.contains("\n  set1-data-1-fghij: { path: \"/dev/sdb\", node: worker-2, keys: [set1-data-1-fghij] }\n"),
        "{plan_text}"
    );
    s.plan("keyplan.yaml", &plan_text);
    let text = s.ok(&["validate"], 0);
    assert!(
        text.contains("1 KMS, 2 keys, 2 devices on 2 nodes."),
        "{text}"
    );
    let plan = keyplan::spec::load(&s.path("keyplan.yaml")).expect("plan");
    assert_eq!(plan.fleet.max_concurrent_nodes, 2);
    assert_eq!(
        plan.keys["set1-data-0-abcde"].name,
        "rook-ceph-osd-encryption-key-set1-data-0-abcde"
    );
    assert_eq!(
        plan.devices["set1-data-1-fghij"].node.as_deref(),
        Some("worker-2")
    );
}

/// Only block PVs are OSDs: a Filesystem PV of Rook's namespace (a mon's; no `volumeMode`
/// means Filesystem) is skipped, and stderr says how many and why.
#[test]
fn the_rook_example_generator_skips_filesystem_pvs() {
    let s = Scratch::new();
    let (plan_text, err) = generate(
        &s,
        &[],
        &[
            block_pv(
                "pv-a",
                "rook-ceph",
                "set1-data-0-abcde",
                "worker-1",
                Some("/dev/sdb"),
            ),
            pv(
                "pv-mon-a",
                "rook-ceph",
                "rook-ceph-mon-a",
                "worker-1",
                Some("/mnt/disks/mon-a"),
                Some("Filesystem"),
            ),
            pv(
                "pv-mon-b",
                "rook-ceph",
                "rook-ceph-mon-b",
                "worker-2",
                Some("/mnt/disks/mon-b"),
                None,
            ),
            // Another namespace's: not Rook's, skipped silently whatever its mode.
            pv("pv-c", "other", "db", "worker-1", Some("/mnt/db"), None),
        ],
    );
    assert!(
        err.contains(
            "skipped 2 PV(s) of namespace rook-ceph not in volumeMode Block (pv-mon-a, pv-mon-b)"
        ) && err.contains("1 OSDs on 1 nodes")
            && !err.contains("pv-c"),
        "{err}"
    );
    assert!(!plan_text.contains("mon"), "{plan_text}");
    s.plan("keyplan.yaml", &plan_text);
    let text = s.ok(&["validate"], 0);
    assert!(
        text.contains("1 KMS, 1 keys, 1 devices on 1 node."),
        "{text}"
    );
    let plan = keyplan::spec::load(&s.path("keyplan.yaml")).expect("plan");
    assert_eq!(
        plan.devices.keys().collect::<Vec<_>>(),
        ["set1-data-0-abcde"]
    );
}

/// Names YAML would read as null, a boolean or a number (a claim named `null`, a node named
/// `true`) are quoted: the plan validates, with those names as strings.
#[test]
fn the_rook_example_generator_quotes_names_yaml_would_misread() {
    let s = Scratch::new();
    let (plan_text, _) = generate(
        &s,
        &["--rotate-after", "1w 3d"],
        &[
            block_pv("pv-a", "rook-ceph", "null", "worker-1", Some("/dev/sdb")),
            block_pv("pv-b", "rook-ceph", "1e3", "true", Some("/dev/sdb")),
            block_pv("pv-c", "rook-ceph", "yes", "123", Some("/dev/sdc")),
        ],
    );
    assert!(
        plan_text.contains("\n  \"null\": { kms: rook, name: rook-ceph-osd-encryption-key-null, rotate_after: \"1w 3d\" }\n")
            && plan_text.contains("\n  \"1e3\": { path: \"/dev/sdb\", node: \"true\", keys: [\"1e3\"] }\n"),
        "{plan_text}"
    );
    s.plan("keyplan.yaml", &plan_text);
    let text = s.ok(&["validate"], 0);
    assert!(
        text.contains("1 KMS, 3 keys, 3 devices on 3 nodes."),
        "{text}"
    );
    let plan = keyplan::spec::load(&s.path("keyplan.yaml")).expect("plan");
    assert_eq!(plan.keys.keys().collect::<Vec<_>>(), ["1e3", "null", "yes"]);
    assert_eq!(plan.keys["null"].name, "rook-ceph-osd-encryption-key-null");
    assert_eq!(
        plan.devices["null"]
            .keys
            .iter()
            .map(|k| k.key.as_str())
            .collect::<Vec<_>>(),
        ["null"]
    );
    assert_eq!(plan.devices["null"].node.as_deref(), Some("worker-1"));
    assert_eq!(plan.devices["1e3"].node.as_deref(), Some("true"));
    assert_eq!(plan.devices["yes"].node.as_deref(), Some("123"));
    assert_eq!(
        plan.keys["yes"].rotate_after,
        Some(std::time::Duration::from_secs(10 * 86400))
    );
}

/// A key on two nodes, by hand (`keyplan --node N apply`, one state directory per node): a
/// rotation started on n1 waits for n2's vote. `keyplan key release` refuses the record of
/// n2 while the plan file lists n2's device with the key (the next rotation would lock it
/// out); once n2 is out of the plan, its record and its votes go, and n1 rotates alone.
#[test]
fn key_release_refuses_a_node_the_plan_still_lists() {
    let s = Scratch::new();
    let a = s.small_image("a.img", "luks2");
    s.small_image("b.img", "luks2");
    s.initial_pass();
    let both = cluster(&[("a", Some("n1"), "k"), ("b", Some("n2"), "k")], "");
    s.plan("keyplan.yaml", &both);
    let on = |node: &str, args: &[&str], code: i32| {
        let dir = format!("st-{node}");
        let mut all = vec!["--node", node, "--state-dir", dir.as_str()];
        all.extend_from_slice(args);
        s.ok(&all, code)
    };
    on("n1", &["apply", "--auto-approve"], 0);
    on("n2", &["apply", "--auto-approve"], 0);
    let out = on("n1", &["apply", "--auto-approve", "--rotate", "k"], 0);
    assert!(out.contains("its commit waits for n2"), "{out}");
    assert!(out.contains("1 commit(s) waiting for other nodes"), "{out}");
    let holders = on("n1", &["key", "holders", "k"], 0);
    let n2 = holders
        .lines()
        .find_map(|l| l.strip_prefix("n2:").and(l.split_whitespace().next()))
        .expect("n2's record")
        .to_string();
    let out = on("n1", &["key", "release", "k", "--holder", &n2], 1);
    assert!(out.contains("still lists with key k"), "{out}");
    assert!(on("n1", &["key", "holders", "k"], 0).contains(&n2));

    // Nor its own record, while its devices list the key.
    let n1 = holders
        .lines()
        .find_map(|l| l.strip_prefix("n1:").and(l.split_whitespace().next()))
        .expect("n1's record")
        .to_string();
    let out = on("n1", &["key", "release", "k", "--holder", &n1], 1);
    assert!(out.contains("still lists with key k"), "{out}");

    // An operator releases n2 with a plan file without it, while n1 still runs the plan that
    // lists n2: n1 does not commit (n2 has no record now, and no vote).
    // (That plan file is another plan: a state directory of its own, not n1's.)
    let without = cluster(&[("a", Some("n1"), "k")], "");
    std::fs::write(s.path("without-n2.yaml"), &without).expect("write");
    s.ok(
        &[
            "--node",
            "n1",
            "--state-dir",
            "st-operator",
            "key",
            "release",
            "k",
            "--holder",
            &n2,
            "-f",
            "without-n2.yaml",
        ],
        0,
    );
    let holders = on("n1", &["key", "holders", "k"], 0);
    assert!(!holders.contains("n2:"), "{holders}");
    let out = on("n1", &["apply", "--auto-approve"], 0);
    assert!(out.contains("n2:(no holder record yet)"), "{out}");
    assert!(!out.contains("is now current"), "{out}");
    // n2 leaves the plan n1 runs: n1's rotation is committed.
    s.plan("keyplan.yaml", &without);
    let out = on("n1", &["apply", "--auto-approve"], 0);
    assert!(out.contains("k v2 is now current"), "{out}");
    let (current, pending) = file_kms_state(s.dir.path(), "k");
    assert!(!pending);
    assert!(opens(&a, &current.expect("current"), None));
    assert_eq!(keyslots(&a).len(), 2, "the install keyslot and k v2");
}
