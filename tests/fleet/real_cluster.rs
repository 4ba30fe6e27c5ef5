//! Opt-in: fleet mode against a real Kubernetes cluster (`KEYPLAN_REAL_CLUSTER=1`, with
//! `KUBECONFIG` or `~/.kube/config` naming a cluster where the user may create and delete a
//! namespace). It creates the namespace `keyplan-test-<random>`, races two nodes for one
//! rollout slot, writes, lists and clears node reports, writes an Event, reads the fleet status,
//! and deletes the namespace. Skipped (with a note) otherwise: no cluster can run where the
//! default suite runs.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use keyplan::fleet::report::{AgentState, Failure, NodeReport, Reports};
use keyplan::fleet::slots::{Acquired, Slots};
use kube::api::{Api, DeleteParams, PostParams};

fn report(node: &str, failed: bool) -> NodeReport {
    NodeReport {
        format_version: "1".into(),
        node: node.into(),
        agent_version: "test".into(),
        updated_at: keyplan::clock::now_unix(),
        interval_seconds: 300,
        plan_digest: None,
        state: if failed {
            AgentState::Failed
        } else {
            AgentState::InSync
        },
        message: None,
        changes: 0,
        devices: vec![],
        keys: vec![],
        problems: vec![],
        unchecked: vec![],
        last_run: None,
        last_success_at: None,
        failure: failed.then(|| Failure {
            at: 1,
            message: "test failure".into(),
        }),
        halted: false,
        refused_plan: None,
        commits_waiting: Vec::new(),
        plan_signature: None,
        observation: None,
        waiting_since: None,
    }
}

#[test]
fn real_cluster_slots_reports_events_status() {
    if std::env::var("KEYPLAN_REAL_CLUSTER").as_deref() != Ok("1") {
        eprintln!(
            "skipped: set KEYPLAN_REAL_CLUSTER=1 (and KUBECONFIG) to run against a real cluster"
        );
        return;
    }
    let client = keyplan::fleet::client(None, None).expect("a client from KUBECONFIG");
    let ns = format!("keyplan-test-{:08x}", rand::random::<u32>());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(namespaces.create(
        &PostParams::default(),
        &Namespace {
            metadata: ObjectMeta {
                name: Some(ns.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        },
    ))
    .expect("create the test namespace");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let a = Slots::new(client.clone(), &ns, 1, "node-a", Duration::from_secs(30));
        let b = Slots::new(client.clone(), &ns, 1, "node-b", Duration::from_secs(30));
        let slot = match a.acquire().expect("node-a acquires") {
            Acquired::Held(s) => s,
            Acquired::Busy(h) => panic!("busy: {h:?}"),
        };
        match b.acquire().expect("node-b tries") {
            Acquired::Busy(h) => assert_eq!(h, ["node-a"]),
            Acquired::Held(_) => panic!("two holders of one slot"),
        }
        a.release(slot).expect("release");
        assert!(matches!(
            b.acquire().expect("node-b again"),
            Acquired::Held(_)
        ));

        let reports = Reports::new(client.clone(), &ns);
        reports
            .put(&report("node-a", false), None)
            .expect("report a");
        reports
            .put(&report("node-b", true), None)
            .expect("report b");
        keyplan::fleet::events::Events::new(client.clone(), &ns, "node-b").emit(
            keyplan::fleet::events::EventType::Warning,
            "RunFailed",
            "test event",
        );
        let st = keyplan::fleet::status::read(&client, &ns).expect("fleet status");
        assert_eq!(st.totals.nodes, 2);
        assert_eq!(st.totals.failures, 1);
        assert_eq!(st.slots.len(), 1);
        assert_eq!(st.slots[0].holder.as_deref(), Some("node-b"));
        let cleared = keyplan::fleet::status::clear(&client, &ns, None).expect("clear");
        assert_eq!(cleared, ["node-b"]);
        let st = keyplan::fleet::status::read(&client, &ns).expect("fleet status");
        assert_eq!(st.totals.failures, 0);
    }));
    let _ = rt.block_on(namespaces.delete(&ns, &DeleteParams::default()));
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
