//! Rollout slots (issue 15): `max_concurrent_nodes` Leases as a counting semaphore, against the
//! fake apiserver's Lease API (resourceVersion conflicts, 409 AlreadyExists, 404, 403): never
//! more holders than slots, even when many nodes race; a restarted node recognises its slot; a
//! released slot is free at once; an expired one is taken over; a renewal after someone else
//! wrote is a lost slot.

#[path = "common/fake_apiserver.rs"]
mod fake_apiserver;

use std::collections::BTreeSet;
use std::time::Duration;

use fake_apiserver::FakeApiserver;
use keyplan::fleet::slots::{slot_name, Acquired, SlotError, Slots};

const NS: &str = "keyplan";

/// A client for the fake with the kubeconfig context `context`.
fn client(fake: &FakeApiserver, context: &str) -> kube::Client {
    let path = fake.kubeconfig(NS, context);
    keyplan::fleet::client(Some(&path), None).expect("client")
}

fn slots(fake: &FakeApiserver, count: u32, node: &str, secs: u64) -> Slots {
    Slots::new(
        client(fake, "full"),
        NS,
        count,
        node,
        Duration::from_secs(secs),
    )
}

fn holder(fake: &FakeApiserver, i: u32) -> Option<String> {
    fake.lease(NS, &slot_name(i))
        .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
}

fn held(a: Acquired) -> keyplan::fleet::slots::Slot {
    match a {
        Acquired::Held(s) => s,
        Acquired::Busy(h) => panic!("busy: {h:?}"),
    }
}

#[test]
fn slots_bound_holders_recognise_restarts_release_and_expire() {
    let fake = FakeApiserver::start();
    let n1 = held(slots(&fake, 2, "n1", 30).acquire().expect("n1"));
    let n2 = held(slots(&fake, 2, "n2", 1).acquire().expect("n2"));
    assert_eq!((n1.index, n2.index), (0, 1));
    assert_eq!(holder(&fake, 0).as_deref(), Some("n1"));
    assert_eq!(holder(&fake, 1).as_deref(), Some("n2"));
    match slots(&fake, 2, "n3", 30).acquire().expect("n3") {
        Acquired::Busy(h) => assert_eq!(h, ["n1", "n2"]),
        Acquired::Held(s) => panic!("a third holder of two slots: {s:?}"),
    }

    // A restarted n1 (a new client) recognises its slot: same Lease, no transition.
    let again = held(slots(&fake, 2, "n1", 30).acquire().expect("n1 again"));
    assert_eq!(again.index, 0);
    let l = fake.lease(NS, &slot_name(0)).expect("lease");
    assert_eq!(l["spec"]["leaseTransitions"], 0);

    // Released: free at once for n3, counted as a transition.
    slots(&fake, 2, "n1", 30).release(again).expect("release");
    assert_eq!(holder(&fake, 0), None);
    let n3 = held(slots(&fake, 2, "n3", 30).acquire().expect("n3"));
    assert_eq!(n3.index, 0);
    assert_eq!(
        fake.lease(NS, &slot_name(0)).expect("lease")["spec"]["leaseTransitions"],
        1
    );

    // n2 stops renewing (a node gone for good): after its 1 s the slot is taken over, and
    // n2's late renewal finds it lost.
    std::thread::sleep(Duration::from_millis(2500));
    let n4 = held(slots(&fake, 2, "n4", 30).acquire().expect("n4"));
    assert_eq!(n4.index, 1);
    assert_eq!(holder(&fake, 1).as_deref(), Some("n4"));
    let mut late = n2;
    match slots(&fake, 2, "n2", 1).renew(&mut late) {
        Err(SlotError::Lost { lease, node, .. }) => {
            assert_eq!((lease.as_str(), node.as_str()), ("keyplan-rollout-1", "n2"))
        }
        other => panic!("{other:?}"),
    }

    // Someone else writes n3's Lease: n3's next renewal is a 409, so the slot is lost.
    fake.modify_lease(NS, &slot_name(0), |l| {
        l["spec"]["holderIdentity"] = serde_json::json!("intruder")
    });
    let mut n3 = n3;
    assert!(matches!(
        slots(&fake, 2, "n3", 30).renew(&mut n3),
        Err(SlotError::Lost { .. })
    ));
    // Renewing a slot still held works and moves renewTime.
    let mut n4 = n4;
    let before =
        fake.lease(NS, &slot_name(1)).expect("lease")["metadata"]["resourceVersion"].clone();
    slots(&fake, 2, "n4", 30).renew(&mut n4).expect("renew");
    let after =
        fake.lease(NS, &slot_name(1)).expect("lease")["metadata"]["resourceVersion"].clone();
    assert_ne!(before, after);
}

#[test]
fn racing_nodes_never_hold_more_slots_than_there_are() {
    let fake = FakeApiserver::start();
    // One kubeconfig file, written before the threads read it.
    let kubeconfig = fake.kubeconfig(NS, "full");
    let results: Vec<(String, Option<u32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..12)
            .map(|i| {
                let kubeconfig = &kubeconfig;
                s.spawn(move || {
                    let node = format!("node-{i}");
                    let client = keyplan::fleet::client(Some(kubeconfig), None).expect("client");
                    let slots = Slots::new(client, NS, 3, &node, Duration::from_secs(30));
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
        assert_eq!(holder(&fake, index).as_deref(), Some(node.as_str()));
    }
    assert!(
        fake.requests()
            .iter()
            .any(|r| r.path.contains("/leases") && r.code == 409),
        "some nodes lost races (409) and moved on"
    );
}

#[test]
fn a_service_account_without_lease_access_is_told_what_to_grant() {
    let fake = FakeApiserver::start();
    let ro = Slots::new(
        client(&fake, "read-only"),
        NS,
        1,
        "n1",
        Duration::from_secs(30),
    );
    match ro.acquire() {
        Err(e @ SlotError::Denied { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("HTTP 403") && text.contains("get, create and update on leases"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(fake.lease(NS, &slot_name(0)).is_none());
}
