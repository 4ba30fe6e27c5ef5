//! Scenario tests of the planner: each a plan and a synthetic observed state, with the changes
//! and the step graph as an insta snapshot (`src/diff/tests/snapshots/`), and the facts that
//! matter for safety asserted as well.

use std::collections::BTreeMap;

use super::scenario::{self, key, observed, plan, render, run, Disk};
use crate::graph::{Step, StepGraph, VersionRef};
use crate::luks::Priority;
use crate::world::RecordStatus;

const ROOK: &str = "version: 1
kms:
  local: { provider: file, path: keys }
keys:
  osd: { kms: local, rotate_after: 30d }
devices:
  block: { path: block.img, keys: [osd] }
  db: { path: db.img, keys: [osd] }
  wal: { path: wal.img, keys: [osd] }
";

/// True when step `b` waits (directly or not) for step `a`.
fn before(g: &StepGraph, a: usize, b: usize) -> bool {
    let mut todo = vec![b];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(x) = todo.pop() {
        for p in g.predecessors(x) {
            if p == a {
                return true;
            }
            if seen.insert(p) {
                todo.push(p);
            }
        }
    }
    false
}

fn index_of(g: &StepGraph, want: impl Fn(&Step) -> bool) -> Vec<usize> {
    g.steps()
        .iter()
        .enumerate()
        .filter(|(_, s)| want(s))
        .map(|(i, _)| i)
        .collect()
}

/// A new key, enrolled on three devices through their enroll_with passphrase (the first
/// apply of a Rook-like plan): one stage, an add and a verify per device, one commit after all
/// verifies; the unmanaged initial keyslots are kept.
#[test]
fn enroll_a_new_key_on_three_devices() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pass = dir.path().join("initial.pass");
    std::fs::write(&pass, b"initial").expect("write");
    let text = ROOK.replace(
        "keys: [osd] }",
        &format!("keys: [osd], enroll_with: \"{}\" }}", pass.display()),
    );
    let p = plan(&text);
    let disks = ["block", "db", "wal"]
        .iter()
        .map(|d| Disk::luks2(d).keyslot(0))
        .collect();
    let obs = observed(&p, disks, vec![("osd", key(None, 0, None, &[], &[]))]);
    let d = run(&p, &obs, &[]).expect("a plan");
    let g = &d.graph;
    let commit = index_of(g, |s| matches!(s, Step::Commit { .. }))[0];
    for v in index_of(g, |s| matches!(s, Step::Verify { .. })) {
        assert!(before(g, v, commit), "verify {v} before the commit");
    }
    assert!(index_of(g, |s| matches!(s, Step::KillKeyslot { .. })).is_empty());
    let text = render(&Ok(d)).replace(&dir.path().display().to_string(), "[DIR]");
    insta::assert_snapshot!(text);
}

/// A rotation of the key Rook's block, db and wal share: commit only after every device
/// verified the new version; every old keyslot killed after the commit, each anchored on its
/// own device's verified new keyslot; v1 stays as previous, the older v0... none here.
#[test]
fn rotate_a_key_shared_by_three_devices() {
    let p = plan(ROOK);
    let disks = ["block", "db", "wal"]
        .iter()
        .map(|d| Disk::luks2(d).keyslot(0).holds(1, "osd", 3))
        .collect();
    let obs = observed(&p, disks, vec![("osd", key(Some(3), 45, None, &[2], &[1]))]);
    let d = run(&p, &obs, &[]).expect("a plan");
    let g = &d.graph;
    let commit = index_of(g, |s| matches!(s, Step::Commit { .. }))[0];
    for k in index_of(g, |s| matches!(s, Step::KillKeyslot { .. })) {
        assert!(before(g, commit, k), "kill {k} after the commit");
        let Step::KillKeyslot { anchor, device, .. } = g.step(k) else {
            unreachable!()
        };
        assert!(matches!(g.step(*anchor), Step::Verify { device: v, .. } if v == device));
    }
    assert_eq!(
        d.keys[0].retire,
        vec![2],
        "v2 (older than the previous v3) is destroyed"
    );
    insta::assert_snapshot!(render(&Ok(d)));
}

/// A key pinned to keyslot 0 whose keyslot 0 holds the old version: the new version goes to a
/// spare keyslot, is verified, committed; keyslot 0 is killed, the new version added back into
/// it through the spare, verified, and the spare killed (3 more PBKDF runs).
#[test]
fn rotate_a_pinned_key() {
    let p = plan(
        "version: 1
kms:
  local: { provider: file, path: keys }
keys:
  osd: { kms: local, rotate_after: 30d }
devices:
  block: { path: block.img, keys: [{ key: osd, keyslot: 0 }] }
",
    );
    let obs = observed(
        &p,
        vec![Disk::luks2("block").holds(0, "osd", 1)],
        vec![("osd", key(Some(1), 45, None, &[], &[]))],
    );
    let d = run(&p, &obs, &[]).expect("a plan");
    let g = &d.graph;
    let adds = index_of(g, |s| matches!(s, Step::AddKeyslot { .. }));
    let kill0 = index_of(g, |s| matches!(s, Step::KillKeyslot { slot: 0, .. }))[0];
    let back = index_of(g, |s| matches!(s, Step::AddKeyslot { slot: 0, .. }))[0];
    assert_eq!(adds.len(), 2);
    assert!(
        before(g, kill0, back),
        "keyslot 0 is freed before the re-add"
    );
    insta::assert_snapshot!(render(&Ok(d)));
}

/// A key the plan moved to another KMS instance: copy, verify the copy on every device,
/// destroy in the old KMS, re-record; no keyslot is added or killed.
#[test]
fn migrate_a_key_to_another_kms() {
    let p = plan(
        "version: 1
kms:
  local: { provider: file, path: keys }
  vault: { provider: file, path: vault-keys }
keys:
  osd: { kms: vault, name: osd-kek }
devices:
  block: { path: block.img, keys: [osd] }
  db: { path: db.img, keys: [osd] }
",
    );
    let disks = vec![
        Disk::luks2("block")
            .holds(1, "osd", 2)
            .entry(1, "local", "osd"),
        Disk::luks2("db")
            .holds(0, "osd", 2)
            .entry(0, "local", "osd"),
    ];
    let obs = observed(&p, disks, vec![("osd", key(None, 0, None, &[], &[]))]);
    let mut states = BTreeMap::new();
    states.insert(
        ("local".to_string(), "osd".to_string()),
        key(Some(2), 10, None, &[1], &[]),
    );
    let obs = scenario::with_origins(&p, obs, &states);
    let d = run(&p, &obs, &[]).expect("a plan");
    let g = &d.graph;
    let destroy = index_of(g, |s| matches!(s, Step::DestroyOrigin { .. }))[0];
    for v in index_of(g, |s| matches!(s, Step::Verify { .. })) {
        assert!(
            before(g, v, destroy),
            "every device verified the copy first"
        );
    }
    for r in index_of(g, |s| matches!(s, Step::Rerecord { .. })) {
        assert!(before(g, destroy, r));
    }
    insta::assert_snapshot!(render(&Ok(d)));
}

/// Drift: a recorded keyslot killed outside keyplan (its record is dropped first), one
/// rewritten (its record dropped, the keyslot now unmanaged and kept), and a record `--verify`
/// failed (dropped only after the key is enrolled again and verified).
#[test]
fn drift_is_repaired() {
    let p = plan(
        "version: 1
kms:
  local: { provider: file, path: keys }
keys:
  k: { kms: local }
devices:
  a: { path: a.img, keys: [k] }
  b: { path: b.img, keys: [k] }
",
    );
    let disks = vec![
        Disk::luks2("a")
            .holds(0, "k", 1)
            .record(1, "k", 1, RecordStatus::KeyslotGone)
            .record(2, "k", 1, RecordStatus::Rewritten),
        Disk::luks2("b")
            .keyslot(0)
            .holds(2, "k", 1)
            .record(1, "k", 1, RecordStatus::FailedVerify),
    ];
    let obs = observed(&p, disks, vec![("k", key(Some(1), 1, None, &[], &[]))]);
    let d = run(&p, &obs, &[]).expect("a plan");
    let g = &d.graph;
    for f in index_of(
        g,
        |s| matches!(s, Step::ForgetRecord { device, failed_verify: false, .. } if device == "a"),
    ) {
        for s in g.by_device()["a"].iter().filter(|s| **s != f) {
            if !matches!(
                g.step(*s),
                Step::ForgetRecord {
                    failed_verify: false,
                    ..
                }
            ) {
                assert!(before(g, f, *s), "stale records are dropped first");
            }
        }
    }
    insta::assert_snapshot!(render(&Ok(d)));
}

/// A key no longer listed and an unmanaged keyslot under `unmanaged_keyslots: remove` are
/// killed, anchored on a verify of the listed key; an unbound keyslot is unmanaged too.
#[test]
fn removals_wait_for_an_anchor() {
    let p = plan(
        "version: 1
kms:
  local: { provider: file, path: keys }
keys:
  k: { kms: local }
devices:
  a: { path: a.img, keys: [k], unmanaged_keyslots: remove }
",
    );
    let disks = vec![Disk::luks2("a")
        .keyslot(0)
        .holds(1, "k", 4)
        .holds(2, "old", 1)
        .keyslot_with(3, false, Priority::Ignore)];
    let obs = observed(&p, disks, vec![("k", key(Some(4), 1, None, &[3], &[]))]);
    let d = run(&p, &obs, &[]).expect("a plan");
    let kills = index_of(&d.graph, |s| matches!(s, Step::KillKeyslot { .. }));
    assert_eq!(kills.len(), 3);
    insta::assert_snapshot!(render(&Ok(d)));
}

/// Refusals, each naming the device or key and what to do: no free keyslot (LUKS1 full), no
/// way in (no record opens the device and no enroll_with), a pinned keyslot held by another
/// key, a read-only device, a LUKS2 JSON area too full for the new token, and a KMS that lost
/// a key the devices still hold.
#[test]
fn refusals() {
    let p = plan(
        "version: 1
kms:
  local: { provider: file, path: keys }
keys:
  k: { kms: local, rotate_after: 30d }
  lost: { kms: local }
  other: { kms: local }
devices:
  full: { path: full.img, keys: [k] }
  locked: { path: locked.img, keys: [k] }
  pinned: { path: pinned.img, keys: [other, { key: k, keyslot: 1 }] }
  ro: { path: ro.img, keys: [k] }
  tight: { path: tight.img, keys: [k] }
  keep: { path: keep.img, keys: [lost] }
",
    );
    let mut full = Disk::luks1("full").holds(0, "k", 1);
    for n in 1..8 {
        full = full.keyslot(n);
    }
    let mut ro = Disk::luks2("ro").holds(0, "k", 1);
    ro.read_only = Some("it cannot be opened for writing: Read-only file system".into());
    let mut tight = Disk::luks2("tight").holds(0, "k", 1);
    tight.json_area = Some((12288, 11900));
    let disks = vec![
        full,
        Disk::luks2("locked").keyslot(0),
        Disk::luks2("pinned")
            .holds(0, "other", 1)
            .holds(1, "other", 1),
        ro,
        tight,
        Disk::luks2("keep").holds(0, "lost", 2),
    ];
    let obs = observed(
        &p,
        disks,
        vec![
            ("k", key(Some(1), 45, None, &[], &[])),
            ("lost", key(None, 0, None, &[], &[])),
            ("other", key(Some(1), 1, None, &[], &[])),
        ],
    );
    let r = run(&p, &obs, &[]);
    assert!(r.is_err());
    insta::assert_snapshot!(render(&r));
}

/// A device that left the plan but still holds v2: v2 is kept, the older v1 destroyed; a
/// `previous` version left by an earlier rotation also opens a device out of date (no
/// enroll_with needed).
#[test]
fn retention_keeps_what_a_former_device_holds() {
    let p = plan(
        "version: 1
kms:
  local: { provider: file, path: keys }
keys:
  k: { kms: local }
devices:
  a: { path: a.img, keys: [k] }
  late: { path: late.img, keys: [k] }
",
    );
    let disks = vec![
        Disk::luks2("a").holds(0, "k", 3),
        Disk::luks2("late").holds(0, "k", 2),
    ];
    let mut obs = observed(&p, disks, vec![("k", key(Some(3), 1, None, &[1, 2], &[]))]);
    let former = Disk::luks2("gone")
        .holds(4, "k", 2)
        .state("/srv/gone.img".into());
    obs.former.insert("gone".into(), former);
    let d = run(&p, &obs, &["k"]).expect("a plan");
    assert_eq!(d.keys[0].retire, vec![1]);
    let unlock_v2 = index_of(
        &d.graph,
        |s| matches!(s, Step::AddKeyslot { device, unlock: crate::graph::Unlock::Key { version: VersionRef::Version(2), .. }, .. } if device == "late"),
    );
    assert_eq!(
        unlock_v2.len(),
        1,
        "late is opened with the previous version"
    );
    insta::assert_snapshot!(render(&Ok(d)));
}

/// Nothing to do: every device holds the current version once, no rotation due.
#[test]
fn no_changes() {
    let p = plan(ROOK);
    let disks = ["block", "db", "wal"]
        .iter()
        .map(|d| Disk::luks2(d).keyslot(0).holds(1, "osd", 3))
        .collect();
    let obs = observed(&p, disks, vec![("osd", key(Some(3), 5, None, &[2], &[]))]);
    let d = run(&p, &obs, &[]).expect("a plan");
    assert!(d.is_empty());
    insta::assert_snapshot!(render(&Ok(d)));
}

/// Adoption: the KMS's current version opens the unrecorded keyslot 0 of two devices (Rook's
/// OSD); one also pins the key to keyslot 2. Adopt first; the rotation replaces keyslot 0
/// (unpinned) or goes into the pin.
#[test]
fn adopt_rooks_keyslot_then_rotate() {
    let p = plan(
        "version: 1
kms:
  local: { provider: file, path: keys }
keys:
  osd: { kms: local, rotate_after: 30d }
devices:
  block: { path: block.img, keys: [osd] }
  db: { path: db.img, keys: [{ key: osd, keyslot: 2 }] }
",
    );
    let mut obs = observed(
        &p,
        vec![
            Disk::luks2("block").keyslot(0),
            Disk::luks2("db").keyslot(0),
        ],
        vec![("osd", key(Some(1), 45, None, &[], &[]))],
    );
    for d in obs.devices.values_mut() {
        let salt = d.header.keyslots[&0].salt.clone();
        d.adoptable.push(crate::observe::Adoption {
            slot: 0,
            key: "osd".into(),
            version: 1,
            salt,
            resalted: false,
        });
    }
    let d = run(&p, &obs, &[]).expect("a plan");
    let g = &d.graph;
    for a in index_of(g, |s| matches!(s, Step::AdoptKeyslot { .. })) {
        let Step::AdoptKeyslot { device, .. } = g.step(a) else {
            unreachable!()
        };
        for s in g.by_device()[device.as_str()].iter().filter(|s| **s != a) {
            assert!(before(g, a, *s), "adoption first on {device}");
        }
    }
    assert_eq!(d.adoptions(), 2);
    insta::assert_snapshot!(render(&Ok(d)));
}

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
