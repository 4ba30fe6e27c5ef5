//! The copies earlier moves kept in the KMS a key left ([`crate::observe::Observed::kept`]):
//! destroyed once no device keyplan knows holds them, never the live entry (issue 46).

use super::scenario::{self, key, observed, plan, run, Disk};
use crate::diff::{KeyAction, ReasonCode};
use crate::graph::Step;
use crate::observe::{Kept, Observed, Origin};
use crate::world::kept::KeptCopy;

const PLAN: &str = "version: 1
kms:
  old: { provider: file, path: keys-old }
  new: { provider: file, path: keys-new }
keys:
  k: { kms: KMS }
devices:
  a: { path: a.img, keys: [k] }
";

/// Device a holds k v3 in `new`; `old` kept v1 (and v2, current there) for a device that
/// left the plan; the plan puts k in `kms`.
fn state(kms: &str) -> (crate::spec::Plan, Observed) {
    let p = plan(&PLAN.replace("KMS", kms));
    let disks = vec![Disk::luks2("a").holds(1, "k", 3).entry(1, "new", "k")];
    let mut obs = observed(&p, disks, vec![("k", key(Some(3), 1, None, &[2], &[1]))]);
    obs.kept.push(Kept {
        copy: KeptCopy {
            key: "k".into(),
            kms: "old".into(),
            name: "k".into(),
            versions: vec![1],
            since: scenario::NOW - 10 * scenario::DAY,
        },
        state: Some(key(Some(2), 30, None, &[1], &[])),
    });
    (p, obs)
}

/// The kept destroys of a plan.
fn destroys(d: &crate::diff::Diff) -> Vec<Step> {
    d.graph
        .steps()
        .into_iter()
        .filter(|s| matches!(s, Step::DestroyOrigin { kept: true, .. }))
        .collect()
}

#[test]
fn a_kept_copy_nothing_holds_is_destroyed() {
    let (p, obs) = state("new");
    let d = run(&p, &obs, &[]).expect("a plan");
    assert_eq!(
        destroys(&d),
        [Step::DestroyOrigin {
            key: "k".into(),
            from_kms: "old".into(),
            from_name: "k".into(),
            version: 2,
            to_kms: "new".into(),
            to_name: "k".into(),
            kept: true,
        }]
    );
    let k = d
        .keys
        .iter()
        .find(|k| k.action == KeyAction::DestroyKept)
        .expect("a key change");
    assert_eq!(
        (k.kms.as_str(), k.reason_code, k.retire.clone()),
        ("old", ReasonCode::KeptCopyUnneeded, vec![1, 2])
    );
    assert_eq!(d.rotations(), 0);
    assert_eq!(d.kept_destroys(), 1);
    assert!(!d.is_empty());
}

#[test]
fn a_kept_copy_a_device_holds_or_may_hold_stays() {
    let (p, obs) = state("new");
    // A device that left the plan still holds v1 there.
    let mut held = obs.clone();
    held.former.insert(
        "b".into(),
        Disk::luks2("b")
            .holds(1, "k", 1)
            .entry(1, "old", "k")
            .state("/srv/b.img".into()),
    );
    // A device keyplan knows cannot be read.
    let mut unknown = obs.clone();
    unknown
        .former_unreadable
        .push(("b".into(), "/srv/b.img".into(), "gone".into()));
    for (o, why) in [
        (held, "for b keyslot 1 (v1) (no longer in the plan)"),
        (unknown, "cannot be read"),
    ] {
        let d = run(&p, &o, &[]).expect("a plan");
        assert_eq!(destroys(&d), []);
        assert!(d.is_empty(), "{:?}", d.keys);
        let notes = d.notes.join("\n");
        assert!(notes.contains("k: KMS old keeps v1"), "{notes}");
        assert!(notes.contains(why), "{notes}");
    }
}

#[test]
fn the_live_entry_is_never_destroyed() {
    // The plan puts k back in `old` (its move back is planned from a's records).
    let (p, obs) = state("old");
    let mut states = std::collections::BTreeMap::new();
    states.insert(
        ("new".to_string(), "k".to_string()),
        key(Some(3), 1, None, &[], &[]),
    );
    let mut obs = scenario::with_origins(&p, obs, &states);
    obs.keys
        .insert("k".into(), key(Some(2), 30, None, &[1], &[]));
    if let Some(o) = obs.origins.get_mut("k") {
        for origin in o.iter_mut() {
            origin.occupant = Some(crate::observe::Occupant {
                version: 2,
                pending: false,
                copy_of: Some(3),
            });
        }
    }
    let d = run(&p, &obs, &[]).expect("a plan");
    assert_eq!(destroys(&d), []);
    assert!(
        !d.graph
            .steps()
            .iter()
            .any(|s| matches!(s, Step::DestroyOrigin { from_kms, .. } if from_kms == "old")),
        "nothing destroyed in old"
    );
    assert!(d.notes.join("\n").contains("the live key"), "{:?}", d.notes);
}

#[test]
fn a_kept_copy_in_a_kms_gone_from_the_plan_is_noted() {
    let (p, mut obs) = state("new");
    obs.kept[0].state = None;
    let d = run(&p, &obs, &[]).expect("a plan");
    assert_eq!(destroys(&d), []);
    let notes = d.notes.join("\n");
    assert!(
        notes.contains("KMS old is no longer in the plan"),
        "{notes}"
    );
    assert!(notes.contains("kept.json"), "{notes}");
}

#[test]
fn a_move_from_the_kept_entry_under_way_decides_alone() {
    let (p, mut obs) = state("new");
    obs.origins.insert(
        "k".into(),
        vec![Origin {
            kms: "old".into(),
            name: "k".into(),
            state: obs.kept[0].state.clone(),
            occupant: None,
        }],
    );
    let d = run(&p, &obs, &[]).expect("a plan");
    assert_eq!(destroys(&d), []);
    assert!(
        !d.notes.iter().any(|n| n.contains("k: KMS old keeps")),
        "{:?}",
        d.notes
    );
}

/// A key taken out of the plan: its kept copy is revisited the same way (the plan no longer
/// needs it), with no destination.
#[test]
fn a_kept_copy_of_a_key_out_of_the_plan_is_destroyed() {
    let p = plan(
        "version: 1
kms:
  old: { provider: file, path: keys-old }
  new: { provider: file, path: keys-new }
keys:
  other: { kms: new }
devices:
  a: { path: a.img, keys: [other] }
",
    );
    let disks = vec![Disk::luks2("a")
        .holds(1, "other", 1)
        .entry(1, "new", "other")];
    let mut obs = observed(&p, disks, vec![("other", key(Some(1), 1, None, &[], &[]))]);
    let (_, with_k) = state("new");
    obs.kept = with_k.kept;
    let d = run(&p, &obs, &[]).expect("a plan");
    assert_eq!(
        destroys(&d),
        [Step::DestroyOrigin {
            key: "k".into(),
            from_kms: "old".into(),
            from_name: "k".into(),
            version: 2,
            to_kms: String::new(),
            to_name: String::new(),
            kept: true,
        }]
    );
    assert!(
        d.keys[0].reason.contains("no longer in the plan"),
        "{:?}",
        d.keys
    );
}

/// Another plan (or node) recorded in the KMS as a holder of the kept entry may have devices
/// that hold it, out of this plan's sight: the copy stays. This plan's own record does not
/// keep it.
#[test]
fn a_kept_copy_another_holder_records_stays() {
    let (p, mut obs) = state("new");
    let me = p.holder();
    if let Some(st) = obs.kept[0].state.as_mut() {
        st.holders.insert(me.clone(), scenario::NOW);
        st.holders
            .insert(format!("{me} verified v2"), scenario::NOW);
    }
    let d = run(&p, &obs, &[]).expect("a plan");
    assert_eq!(
        destroys(&d).len(),
        1,
        "this plan's own records keep nothing"
    );
    if let Some(st) = obs.kept[0].state.as_mut() {
        st.holders
            .insert("node-2:/var/lib/keyplan".into(), scenario::NOW);
    }
    let d = run(&p, &obs, &[]).expect("a plan");
    assert_eq!(destroys(&d), []);
    let notes = d.notes.join("\n");
    assert!(
        notes.contains("records other holders of it (node-2:/var/lib/keyplan)"),
        "{notes}"
    );
}
