//! Node reports of another format version on the real control plane: `keyplan fleet status`
//! reads each node's report by its `format_version` (docs/formats.md, "Node report"). A report
//! of a newer major version (fixture `node-report/v2`, hand-made) shows that node as `newer`,
//! with which version and which keyplan reads it, while the rest of the fleet still shows (the
//! version-1 fixture, as an agent of this release writes it).

use crate::common::keyplan_command;
use crate::common::kube::Cluster;

fn fixture(rel: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/formats")
        .join(rel);
    serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
}

#[test]
fn fleet_status_shows_a_newer_report_as_newer_and_the_rest_of_the_fleet() {
    let Some(c) = Cluster::get() else {
        return;
    };
    let ns = c.fresh_namespace("fleet-formats");
    let cms = format!("/api/v1/namespaces/{ns}/configmaps");
    let mut v1 = fixture("node-report/v1/report.json");
    v1["updated_at"] = keyplan::clock::now_unix().into();
    let mut v2 = fixture("node-report/v2/report.json");
    v2["node"] = "worker-2".into();
    for (node, report) in [("worker-1", &v1), ("worker-2", &v2)] {
        c.create(
            &cms,
            &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("keyplan-node-{node}"),
                    "labels": {"app.kubernetes.io/name": "keyplan",
                        "app.kubernetes.io/component": "node-report"}},
                "data": {"report.json": serde_json::to_string_pretty(report).unwrap()}}),
        );
    }
    let kubeconfig = c.kubeconfig(&ns, "full");
    let status = |format: &str| {
        keyplan_command()
            .args(["fleet", "status", "--format", format, "--namespace", &ns])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .output()
            .unwrap()
    };
    let out = status("json");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["format_version"], "1.2");
    let nodes = doc["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{text}");
    assert_eq!(nodes[0]["node"], "worker-1");
    assert_eq!(nodes[0]["state"], "waiting");
    assert_eq!(nodes[0]["report"]["devices"][0]["id"], "disk-a");
    assert_eq!(nodes[1]["node"], "worker-2");
    assert_eq!(nodes[1]["state"], "newer");
    assert_eq!(nodes[1]["report"], serde_json::Value::Null);
    assert_eq!(nodes[1]["failure_counts"], false);
    let problem = nodes[1]["problem"].as_str().unwrap();
    assert!(
        problem.contains(
            "keyplan-node-worker-2 is node-report format 2.0, written by a newer keyplan"
        ),
        "{problem}"
    );
    assert_eq!(doc["totals"]["by_state"]["newer"], 1);
    let out = status("text");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("worker-1") && text.contains("waiting"),
        "{text}"
    );
    assert!(
        text.contains("newer") && text.contains("reads node-report formats up to 1.x"),
        "{text}"
    );
}
