//! Scenario tests of keys shared among plans and nodes: the holder records of the plans that
//! hold a key, and a shared key's rotation committed only after every node verified it; the
//! facts that matter for safety asserted (no snapshots).

use super::scenario::{self, key, observed, plan, run, Disk};
use super::snapshots::{before, index_of, ROOK};
use crate::graph::{Step, VersionRef};

/// Holder records (invariant I7), decided from the KMS's `holders`: another plan holds the key.
fn held_by_other(mut st: crate::kms::KeyState, me: Option<&str>) -> crate::kms::KeyState {
    st.holders.clear();
    st.holders.insert(
        "host-b:/srv/b/.keyplan".into(),
        scenario::NOW - 3 * scenario::DAY,
    );
    if let Some(me) = me {
        st.holders.insert(me.into(), scenario::NOW - scenario::DAY);
    }
    st
}

/// A rotation due while another plan holds the key is refused, naming that plan; with no
/// rotation due, this plan joins as a holder (a Hold before its add) and enrolls the key.
#[test]
fn a_key_another_plan_holds_is_not_rotated_here() {
    let p = plan(ROOK);
    let me = p.holder();
    let disks = vec![Disk::luks2("block").holds(0, "osd", 1)];
    // Due for rotation (40 days > 30d), or a pending version to finish: not rotated, with a
    // note naming the other plan (the plan's other changes go on); --rotate: refused.
    for mine in [None, Some(me.as_str())] {
        for (st, rotate) in [
            (key(Some(1), 40, None, &[], &[]), &[][..]),
            (key(Some(1), 1, Some(2), &[], &[]), &[][..]),
        ] {
            let obs = observed(&p, disks.clone(), vec![("osd", held_by_other(st, mine))]);
            let d = run(&p, &obs, rotate).expect("a plan");
            let g = &d.graph;
            assert!(
                index_of(g, |s| matches!(s, Step::Commit { .. } | Step::Stage { .. })).is_empty(),
                "{d:?}"
            );
            assert!(
                d.notes.iter().any(|n| n.contains("host-b:/srv/b/.keyplan")),
                "{:?}",
                d.notes
            );
        }
        let st = held_by_other(key(Some(1), 1, None, &[], &[]), mine);
        let obs = observed(&p, disks.clone(), vec![("osd", st)]);
        let refused = run(&p, &obs, &["osd"]).expect_err("refused");
        let text = refused[0].message.clone();
        assert!(text.contains("host-b:/srv/b/.keyplan"), "{text}");
        assert!(text.contains("Nothing was changed"), "{text}");
    }
    // Another plan's creation in progress (pending, no current, no device here holds it):
    // refused, not finished from here.
    let mut creating = key(None, 0, Some(1), &[], &[]);
    creating.holders.clear();
    let mut obs = observed(
        &p,
        vec![Disk::luks2("block").keyslot(0)],
        vec![("osd", creating)],
    );
    obs.keys.get_mut("osd").expect("osd").holders.clear();
    let refused = run(&p, &obs, &[]).expect_err("refused");
    assert!(refused[0].message.contains("another plan"), "{:?}", refused);
    // Not due, this plan not yet recorded: a Hold before the keyslots it adds.
    let fresh = vec![
        Disk::luks2("block").holds(0, "osd", 1),
        Disk::luks2("db").keyslot(0),
        Disk::luks2("wal").holds(0, "osd", 1),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let pass = dir.path().join("initial.pass");
    std::fs::write(&pass, b"initial").expect("write");
    let p = plan(&ROOK.replace(
        "db: { path: db.img, keys: [osd] }",
        &format!(
            "db: {{ path: db.img, keys: [osd], enroll_with: \"{}\" }}",
            pass.display()
        ),
    ));
    let st = held_by_other(key(Some(1), 1, None, &[], &[]), None);
    let obs = observed(&p, fresh, vec![("osd", st)]);
    let d = run(&p, &obs, &[]).expect("a plan");
    assert_eq!(d.holders.len(), 1, "{d:?}");
    assert_eq!(d.holders[0].holder, p.holder());
    let g = &d.graph;
    let hold = index_of(g, |s| matches!(s, Step::Hold { .. }));
    assert_eq!(hold.len(), 1);
    for a in index_of(g, |s| matches!(s, Step::AddKeyslot { .. })) {
        assert!(before(g, hold[0], a), "the hold comes before add {a}");
    }
    assert!(index_of(g, |s| matches!(s, Step::Commit { .. })).is_empty());
}

/// A plan whose devices held a key before holder records existed records itself first (and
/// so before its own rotation's commit); one whose devices no longer list a key it holds
/// removes its record after the kills, and only then.
#[test]
fn holder_records_are_written_and_removed() {
    let p = plan(ROOK);
    let disks: Vec<Disk> = ["block", "db", "wal"]
        .iter()
        .map(|d| Disk::luks2(d).keyslot(0).holds(1, "osd", 1))
        .collect();
    let mut st = key(Some(1), 40, None, &[], &[]);
    st.holders.insert("placeholder".into(), 0);
    st.holders.clear();
    // `observed` records the plan as holder of an existing key; undo that for this case.
    let mut obs = observed(&p, disks.clone(), vec![("osd", st)]);
    obs.keys.get_mut("osd").expect("osd").holders.clear();
    let d = run(&p, &obs, &[]).expect("a plan");
    let g = &d.graph;
    let hold = index_of(g, |s| matches!(s, Step::Hold { .. }))[0];
    let stage = index_of(g, |s| matches!(s, Step::Stage { .. }))[0];
    let commit = index_of(g, |s| matches!(s, Step::Commit { .. }))[0];
    assert!(before(g, hold, stage) && before(g, hold, commit));
    let text = crate::render::plan_text(&p, &d);
    assert!(text.contains("~ key osd: record this plan"), "{text}");
    assert!(text.contains(", 1 holder record."), "{text}");

    // The key listed by no device any more (they keep another key): its keyslots go first,
    // and the record only once no device holds the key.
    let two = ROOK.replace("keys: [osd] }", "keys: [other] }").replace(
        "osd: { kms: local, rotate_after: 30d }",
        "osd: { kms: local }\n  other: { kms: local }",
    );
    let p2 = plan(&two);
    let keys = || {
        vec![
            ("osd", key(Some(1), 1, None, &[], &[])),
            ("other", key(Some(1), 1, None, &[], &[])),
        ]
    };
    let both: Vec<Disk> = ["block", "db", "wal"]
        .iter()
        .map(|d| Disk::luks2(d).holds(1, "other", 1).holds(2, "osd", 1))
        .collect();
    let d = run(&p2, &observed(&p2, both, keys()), &[]).expect("a plan");
    assert_eq!(d.removes(), 3, "{d:?}");
    let release = index_of(&d.graph, |s| matches!(s, Step::Release { .. }));
    assert_eq!(release.len(), 1, "{d:?}");
    for k in index_of(&d.graph, |s| matches!(s, Step::KillKeyslot { .. })) {
        assert!(
            before(&d.graph, k, release[0]),
            "kill {k} before the release"
        );
    }
    // A device that left the plan still holding the key keeps the record.
    let mut obs = observed(
        &p2,
        ["block", "db", "wal"]
            .iter()
            .map(|d| Disk::luks2(d).holds(1, "other", 1))
            .collect(),
        keys(),
    );
    obs.former.insert(
        "old".into(),
        Disk::luks2("old")
            .holds(0, "osd", 1)
            .state("/srv/old.img".into()),
    );
    let d = run(&p2, &obs, &[]).expect("a plan");
    assert!(
        index_of(&d.graph, |s| matches!(s, Step::Release { .. })).is_empty(),
        "released while a former device holds the key: {d:?}"
    );
    assert!(
        d.notes
            .iter()
            .any(|n| n.contains("keeps its holder record")),
        "{:?}",
        d.notes
    );
    // The key taken out of the plan file too: still kept, and noted.
    let p3 = plan(&two.replace("osd: { kms: local }\n", ""));
    let obs3 = observed(
        &p3,
        ["block", "db", "wal"]
            .iter()
            .map(|d| Disk::luks2(d).holds(1, "other", 1))
            .collect(),
        vec![("other", key(Some(1), 1, None, &[], &[]))],
    );
    let mut obs3 = obs3;
    obs3.former = obs.former.clone();
    let d = run(&p3, &obs3, &[]).expect("a plan");
    assert!(index_of(&d.graph, |s| matches!(s, Step::Release { .. })).is_empty());
    assert!(
        d.notes
            .iter()
            .any(|n| n.contains("no longer in the plan file") && n.contains("old")),
        "{:?}",
        d.notes
    );
    let clean: Vec<Disk> = ["block", "db", "wal"]
        .iter()
        .map(|d| Disk::luks2(d).holds(1, "other", 1))
        .collect();
    let d = run(&p2, &observed(&p2, clean, keys()), &[]).expect("a plan");
    let release = index_of(&d.graph, |s| matches!(s, Step::Release { .. }));
    assert_eq!(release.len(), 1, "{d:?}");
    assert_eq!(d.holders[0].action, crate::diff::HolderAction::Release);
}

/// A key on devices of two nodes (fleet mode): node n1's part. Its peer's record (n2) does not
/// refuse the rotation; the commit waits for n2's vote, and happens once n2 voted.
#[test]
fn a_shared_key_commits_only_after_every_node_verified() {
    let p = plan(
        &ROOK
            .replace("keys: [osd] }\n  db", "keys: [osd], node: n1 }\n  db")
            .replace("db.img, keys: [osd] }", "db.img, keys: [osd], node: n1 }")
            .replace("wal.img, keys: [osd] }", "wal.img, keys: [osd], node: n2 }"),
    )
    .for_node("n1");
    let me = p.holder();
    let peer = "n2:/var/lib/keyplan".to_string();
    let vote = |h: &str, v: u64| crate::kms::book::vote_id(h, v);
    let shared = |mut st: crate::kms::KeyState, extra: &[String]| {
        st.holders.insert(me.clone(), scenario::NOW - scenario::DAY);
        st.holders
            .insert(peer.clone(), scenario::NOW - scenario::DAY);
        for h in extra {
            st.holders.insert(h.clone(), scenario::NOW);
        }
        st
    };
    let v1 = || {
        vec![
            Disk::luks2("block").holds(0, "osd", 1),
            Disk::luks2("db").holds(0, "osd", 1),
        ]
    };
    // Due, n2 has not voted: stage, add, verify, vote; no commit, no kill; the wait names n2.
    let obs = observed(
        &p,
        v1(),
        vec![("osd", shared(key(Some(1), 40, None, &[], &[]), &[]))],
    );
    let d = run(&p, &obs, &[]).expect("a plan");
    let g = &d.graph;
    assert!(
        index_of(g, |s| matches!(
            s,
            Step::Commit { .. } | Step::KillKeyslot { .. }
        ))
        .is_empty(),
        "{d:?}"
    );
    let votes = index_of(g, |s| matches!(s, Step::Vote { .. }));
    assert_eq!(votes.len(), 1, "{d:?}");
    for v in index_of(g, |s| matches!(s, Step::Verify { .. })) {
        assert!(before(g, v, votes[0]), "the vote comes after verify {v}");
    }
    assert_eq!(d.waiting.len(), 1, "{d:?}");
    assert_eq!(d.waiting[0].blocking, vec![peer.clone()]);
    assert!(!d.waiting[0].verified_here);
    assert!(
        d.waiting[0].describe().contains("waits for n2"),
        "{}",
        d.waiting[0].describe()
    );
    // This node voted (its devices hold v2), n2 not yet: nothing to do, the wait is reported.
    let both = || {
        vec![
            Disk::luks2("block").holds(0, "osd", 1).holds(1, "osd", 2),
            Disk::luks2("db").holds(0, "osd", 1).holds(1, "osd", 2),
        ]
    };
    let st = shared(key(Some(1), 1, Some(2), &[], &[]), &[vote(&me, 2)]);
    let d = run(&p, &observed(&p, both(), vec![("osd", st)]), &[]).expect("a plan");
    assert!(d.is_empty(), "{d:?}");
    assert!(d.waiting[0].verified_here, "{d:?}");
    // n2 voted: commit, then the old keyslots go (after the commit); no vote of our own.
    let st = shared(
        key(Some(1), 1, Some(2), &[], &[]),
        &[vote(&me, 2), vote(&peer, 2)],
    );
    let d = run(&p, &observed(&p, both(), vec![("osd", st)]), &[]).expect("a plan");
    let g = &d.graph;
    let commit = index_of(g, |s| matches!(s, Step::Commit { .. }));
    assert_eq!(commit.len(), 1, "{d:?}");
    let kills = index_of(g, |s| matches!(s, Step::KillKeyslot { .. }));
    assert_eq!(kills.len(), 2, "{d:?}");
    for k in kills {
        assert!(before(g, commit[0], k), "kill {k} after the commit");
    }
    assert!(d.waiting.is_empty() && index_of(g, |s| matches!(s, Step::Vote { .. })).is_empty());
    // This node voted, then a device lost its v2 keyslot: the vote is withdrawn before the add.
    let lost = vec![
        Disk::luks2("block").holds(0, "osd", 1).holds(1, "osd", 2),
        Disk::luks2("db").holds(0, "osd", 1),
    ];
    let st = shared(key(Some(1), 1, Some(2), &[], &[]), &[vote(&me, 2)]);
    let d = run(&p, &observed(&p, lost, vec![("osd", st)]), &[]).expect("a plan");
    let g = &d.graph;
    let unvote = index_of(g, |s| matches!(s, Step::Unvote { version: 2, .. }));
    assert_eq!(unvote.len(), 1, "{d:?}");
    for a in index_of(g, |s| matches!(s, Step::AddKeyslot { .. })) {
        assert!(
            before(g, unvote[0], a),
            "the withdrawal comes before add {a}"
        );
    }
    // A stale vote (v1 committed, nothing pending) is withdrawn.
    let st = shared(key(Some(1), 1, None, &[], &[]), &[vote(&me, 1)]);
    let d = run(&p, &observed(&p, v1(), vec![("osd", st)]), &[]).expect("a plan");
    assert_eq!(
        index_of(&d.graph, |s| matches!(s, Step::Unvote { version: 1, .. })).len(),
        1
    );
    // A holder that is not a node of the plan for this key still stops the rotation.
    let st = shared(
        key(Some(1), 40, None, &[], &[]),
        &["host-b:/srv/b/.keyplan".to_string()],
    );
    let d = run(&p, &observed(&p, v1(), vec![("osd", st)]), &[]).expect("a plan");
    assert!(
        index_of(&d.graph, |s| matches!(s, Step::Stage { .. })).is_empty(),
        "{d:?}"
    );
    assert!(
        d.notes.iter().any(|n| n.contains("host-b:/srv/b/.keyplan")),
        "{:?}",
        d.notes
    );
    // ... and when it appears after this node voted, the device converges back on v1: the
    // vote for v2 is withdrawn before v2's keyslot is killed.
    let st = shared(
        key(Some(1), 1, Some(2), &[], &[]),
        &[vote(&me, 2), "host-b:/srv/b/.keyplan".to_string()],
    );
    let d = run(&p, &observed(&p, both(), vec![("osd", st)]), &[]).expect("a plan");
    let g = &d.graph;
    let unvote = index_of(g, |s| matches!(s, Step::Unvote { version: 2, .. }));
    let kills = index_of(g, |s| matches!(s, Step::KillKeyslot { .. }));
    assert_eq!((unvote.len(), kills.len()), (1, 2), "{d:?}");
    for k in kills {
        assert!(before(g, unvote[0], k), "the vote goes before kill {k}");
    }
    // A second record on the peer node (another plan there): no peer, the rotation stops.
    let st = shared(
        key(Some(1), 40, None, &[], &[]),
        &["n2:/srv/other/.keyplan".to_string()],
    );
    let d = run(&p, &observed(&p, v1(), vec![("osd", st)]), &[]).expect("a plan");
    assert!(
        index_of(&d.graph, |s| matches!(s, Step::Stage { .. })).is_empty(),
        "{d:?}"
    );
    assert!(
        d.notes
            .iter()
            .any(|n| n.contains("n2:/srv/other/.keyplan") && n.contains(&peer)),
        "{:?}",
        d.notes
    );
}

/// A device that joins a shared key while its commit waits for another node gets the current
/// version too, not only the new one: until the commit, the current version is what the KMS
/// says opens it.
#[test]
fn a_device_joining_a_waiting_rotation_gets_the_current_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pass = dir.path().join("initial.pass");
    std::fs::write(&pass, b"initial").expect("write");
    let p = plan(
        &ROOK
            .replace("keys: [osd] }\n  db", "keys: [osd], node: n1 }\n  db")
            .replace(
                "db.img, keys: [osd] }",
                &format!(
                    "db.img, keys: [osd], node: n1, enroll_with: \"{}\" }}",
                    pass.display()
                ),
            )
            .replace("wal.img, keys: [osd] }", "wal.img, keys: [osd], node: n2 }"),
    )
    .for_node("n1");
    let me = p.holder();
    let mut st = key(Some(1), 1, Some(2), &[], &[]);
    st.holders.insert(me.clone(), scenario::NOW - scenario::DAY);
    st.holders
        .insert("n2:/var/lib/keyplan".into(), scenario::NOW - scenario::DAY);
    let disks = vec![
        Disk::luks2("block").holds(0, "osd", 1),
        Disk::luks2("db").keyslot(0),
    ];
    let d = run(&p, &observed(&p, disks, vec![("osd", st)]), &[]).expect("a plan");
    let adds_on_db: Vec<VersionRef> = d
        .graph
        .steps()
        .into_iter()
        .filter_map(|s| match s {
            Step::AddKeyslot {
                device, version, ..
            } if device == "db" => Some(version),
            _ => None,
        })
        .collect();
    assert!(adds_on_db.contains(&VersionRef::Version(1)), "{d:?}");
    assert!(adds_on_db.contains(&VersionRef::Staged), "{d:?}");
    assert!(index_of(&d.graph, |s| matches!(s, Step::Commit { .. })).is_empty());
}
