//! Rollout slots (issue 15): `max_concurrent_nodes` Leases as a counting semaphore, against the
//! real API server's Lease API (tests/common/kube.rs: resourceVersion conflicts, 409
//! AlreadyExists, 404, and RBAC's 403 for a ServiceAccount without Lease rights), each test in
//! a fresh namespace, every check reading the Leases as admin: never
//! more holders than slots, even when many nodes race; a restarted node recognises its slot; a
//! released slot is free at once; an expired one is taken over; a renewal after someone else
//! wrote is a lost slot.

use crate::common::kube;
use crate::common::kube_proxy;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use keyplan::fleet::slots::{slot_name, Acquired, SlotError, Slots};
use kube::Cluster;
use kube_proxy::KubeProxy;

/// One test's fresh namespace on the real cluster.
struct Ns {
    c: &'static Cluster,
    ns: String,
}

impl Ns {
    /// `None` (the test is skipped) when the control plane's binaries are missing.
    fn new(prefix: &str) -> Option<Ns> {
        let c = Cluster::get()?;
        let ns = c.fresh_namespace(prefix);
        Some(Ns { c, ns })
    }

    /// A client with the kubeconfig context `context` (straight to the API server).
    fn client(&self, context: &str) -> ::kube::Client {
        let path = self.c.kubeconfig(&self.ns, context);
        keyplan::fleet::client(Some(&path), None).expect("client")
    }

    fn slots(&self, count: u32, node: &str, secs: u64) -> Slots {
        Slots::new(
            self.client("full"),
            &self.ns,
            count,
            node,
            Duration::from_secs(secs),
        )
    }

    /// The Lease of slot `i`, read as admin.
    fn lease(&self, i: u32) -> Option<serde_json::Value> {
        self.c.lease(&self.ns, &slot_name(i))
    }

    fn holder(&self, i: u32) -> Option<String> {
        self.lease(i)
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
    }
}

fn held(a: Acquired) -> keyplan::fleet::slots::Slot {
    match a {
        Acquired::Held(s) => s,
        Acquired::Busy(h) => panic!("busy: {h:?}"),
    }
}

#[test]
fn slots_bound_holders_recognise_restarts_release_and_expire() {
    let Some(k) = Ns::new("fleet-slots") else {
        return;
    };
    let n1 = held(k.slots(2, "n1", 30).acquire().expect("n1"));
    let n2 = held(k.slots(2, "n2", 1).acquire().expect("n2"));
    assert_eq!((n1.index, n2.index), (0, 1));
    assert_eq!(k.holder(0).as_deref(), Some("n1"));
    assert_eq!(k.holder(1).as_deref(), Some("n2"));
    match k.slots(2, "n3", 30).acquire().expect("n3") {
        Acquired::Busy(h) => assert_eq!(h, ["n1", "n2"]),
        Acquired::Held(s) => panic!("a third holder of two slots: {s:?}"),
    }

    // A restarted n1 (a new client) recognises its slot: same Lease, no transition.
    let again = held(k.slots(2, "n1", 30).acquire().expect("n1 again"));
    assert_eq!(again.index, 0);
    let l = k.lease(0).expect("lease");
    assert_eq!(l["spec"]["leaseTransitions"], 0, "{l}");

    // Released: free at once for n3, counted as a transition.
    k.slots(2, "n1", 30).release(again).expect("release");
    assert_eq!(k.holder(0), None);
    let n3 = held(k.slots(2, "n3", 30).acquire().expect("n3"));
    assert_eq!(n3.index, 0);
    assert_eq!(k.lease(0).expect("lease")["spec"]["leaseTransitions"], 1);

    // n2 stops renewing (a node gone for good): once its 1 s is over the slot is taken
    // over, and n2's late renewal finds it lost. n4 tries until the Lease has expired (busy
    // until then, with n2 still named as a holder).
    let t0 = Instant::now();
    let n4 = loop {
        match k.slots(2, "n4", 30).acquire().expect("n4") {
            Acquired::Held(s) => break s,
            Acquired::Busy(h) => {
                assert_eq!(h, ["n3", "n2"]);
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "n2's 1 s Lease never expired"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert_eq!(n4.index, 1);
    assert_eq!(k.holder(1).as_deref(), Some("n4"));
    let mut late = n2;
    match k.slots(2, "n2", 1).renew(&mut late) {
        Err(SlotError::Lost { lease, node, .. }) => {
            assert_eq!((lease.as_str(), node.as_str()), ("keyplan-rollout-1", "n2"))
        }
        other => panic!("{other:?}"),
    }

    // Someone else writes n3's Lease: n3's next renewal is a 409, so the slot is lost.
    k.c.modify_lease(&k.ns, &slot_name(0), |l| {
        l["spec"]["holderIdentity"] = serde_json::json!("intruder")
    });
    let mut n3 = n3;
    assert!(matches!(
        k.slots(2, "n3", 30).renew(&mut n3),
        Err(SlotError::Lost { .. })
    ));
    assert_eq!(k.holder(0).as_deref(), Some("intruder"), "left as written");
    // Renewing a slot still held works and moves renewTime.
    let mut n4 = n4;
    let before = k.lease(1).expect("lease");
    k.slots(2, "n4", 30).renew(&mut n4).expect("renew");
    let after = k.lease(1).expect("lease");
    assert_ne!(
        before["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );
    assert_ne!(before["spec"]["renewTime"], after["spec"]["renewTime"]);
}

#[test]
fn racing_nodes_never_hold_more_slots_than_there_are() {
    let Some(k) = Ns::new("fleet-slots-race") else {
        return;
    };
    // The proxy's request log shows the lost races.
    let proxy = KubeProxy::start(k.c);
    // One kubeconfig file, written before the threads read it.
    let kubeconfig = proxy.kubeconfig(&k.ns, "full");
    let ns = k.ns.as_str();
    let results: Vec<(String, Option<u32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..12)
            .map(|i| {
                let kubeconfig = &kubeconfig;
                s.spawn(move || {
                    let node = format!("node-{i}");
                    let client = keyplan::fleet::client(Some(kubeconfig), None).expect("client");
                    let slots = Slots::new(client, ns, 3, &node, Duration::from_secs(30));
                    let got = match slots.acquire().expect("acquire") {
                        Acquired::Held(slot) => Some(slot.index),
                        Acquired::Busy(_) => None,
                    };
                    (node, got)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let winners: Vec<&(String, Option<u32>)> = results.iter().filter(|r| r.1.is_some()).collect();
    assert_eq!(winners.len(), 3, "{results:?}");
    let indexes: BTreeSet<u32> = winners.iter().filter_map(|r| r.1).collect();
    assert_eq!(indexes, BTreeSet::from([0, 1, 2]));
    for (node, index) in winners.iter().map(|(n, i)| (n, i.unwrap_or(99))) {
        assert_eq!(k.holder(index).as_deref(), Some(node.as_str()));
    }
    assert!(
        proxy
            .requests()
            .iter()
            .any(|r| r.path.contains("/leases") && r.code == 409),
        "some nodes lost races (409) and moved on"
    );
}

/// Issue 31: a waiting agent's watch ([`keyplan::fleet::watch`]) sees a slot released, an
/// operator's pause and a failed node's report as they happen, with no request of its own in
/// between (the proxy's log), and resumes after the API server ends a watch.
#[test]
fn a_watch_sees_releases_pauses_and_failures_without_polling() {
    let Some(k) = Ns::new("fleet-watch") else {
        return;
    };
    let proxy = KubeProxy::start(k.c);
    let kubeconfig = proxy.kubeconfig(&k.ns, "full");
    let client = keyplan::fleet::watch_client(Some(&kubeconfig), None).expect("client");
    let watch = keyplan::fleet::watch::FleetWatch::start(client, &k.ns).expect("watch");
    let until = |secs: u64| Instant::now() + Duration::from_secs(secs);
    // Waits for the copy to satisfy `cond`, on the watch's notifications only.
    let wait = |what: &str, cond: &dyn Fn(&keyplan::fleet::watch::Seen) -> bool| -> Duration {
        let t0 = Instant::now();
        loop {
            let g = watch.generation();
            if watch.snapshot().is_some_and(|s| cond(&s)) {
                return t0.elapsed();
            }
            assert!(
                watch.wait_change(g, until(20)),
                "the watch did not show {what} within 20 s (error: {:?})",
                watch.error()
            );
        }
    };
    wait("its first list", &|_| true);
    let n1 = k.slots(2, "n1", 30);
    let slot = held(n1.acquire().expect("n1"));
    let holder = |s: &keyplan::fleet::watch::Seen| {
        s.leases
            .get(&slot_name(0))
            .and_then(|l| l.spec.as_ref()?.holder_identity.clone())
    };
    let mut slot = slot;
    wait("n1 holding slot 0", &|s| holder(s).as_deref() == Some("n1"));
    // A renewal changes the copy but wakes no waiter (the generation stays): the release
    // after it, delivered after it on the same watch, is the one bump.
    let before = watch.generation();
    n1.renew(&mut slot).expect("renew");
    let mark = proxy.mark();
    n1.release(slot).expect("release");
    let seen_free = wait("slot 0 released", &|s| holder(s).is_none());
    assert_eq!(
        watch.generation(),
        before + 1,
        "only the release woke the waiters, not the renewal before it"
    );
    assert!(
        seen_free < Duration::from_secs(1),
        "a released slot is seen within a second, not at a poll: {seen_free:?}"
    );
    // The operator's pause, then a failed node's report.
    let cms = format!("/api/v1/namespaces/{}/configmaps", k.ns);
    k.c.create(
        &cms,
        &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "keyplan-pause",
                "labels": {"app.kubernetes.io/name": "keyplan", "app.kubernetes.io/component": "fleet-pause"}},
            "data": {"reason": "freeze", "paused_by": "alice", "paused_at": "1"}}),
    );
    wait("the pause", &|s| {
        s.pause.as_ref().is_some_and(|p| p.reason == "freeze")
    });
    k.c.delete(&format!("{cms}/keyplan-pause"));
    wait("the pause lifted", &|s| s.pause.is_none());
    let report = serde_json::json!({"format_version": "1", "node": "n9", "agent_version": "0",
        "updated_at": 1, "interval_seconds": 30, "plan_digest": null, "state": "failed",
        "message": null, "changes": 1, "devices": [], "keys": [], "problems": [],
        "unchecked": [], "last_run": null, "last_success_at": null,
        "failure": {"at": 1, "message": "boom"}, "halted": false});
    k.c.create(
        &cms,
        &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "keyplan-node-n9",
                "labels": {"app.kubernetes.io/name": "keyplan", "app.kubernetes.io/component": "node-report"}},
            "data": {"report.json": report.to_string()}}),
    );
    wait("n9's failure", &|s| {
        s.reports
            .get("keyplan-node-n9")
            .is_some_and(|r| r.counts_as_failed())
    });
    // Between the release and now the watch's client sent nothing: no polling.
    let sent: Vec<_> = proxy
        .requests_since(mark)
        .into_iter()
        .filter(|r| !r.query.contains("watch=true") || r.code != 200)
        .filter(|r| {
            r.method == "GET" && (r.path.contains("/leases") || r.path.contains("/configmaps"))
        })
        .collect();
    assert!(sent.is_empty(), "the watch polled: {sent:?}");
    drop(watch);
}

#[test]
fn a_service_account_without_lease_access_is_told_what_to_grant() {
    let Some(k) = Ns::new("fleet-slots-rbac") else {
        return;
    };
    // `reader`: a real ServiceAccount whose Role grants get, list and watch of Secrets only.
    let ro = Slots::new(
        k.client("read-only"),
        &k.ns,
        1,
        "n1",
        Duration::from_secs(30),
    );
    match ro.acquire() {
        Err(e @ SlotError::Denied { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("HTTP 403")
                    && text.contains("create, update, list and watch on leases"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(k.lease(0).is_none());
}
