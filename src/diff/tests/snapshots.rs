//! Scenario tests of the planner: each a plan and a synthetic observed state, with the changes
//! and the step graph as an insta snapshot (`src/diff/tests/snapshots/`), and the facts that
//! matter for safety asserted as well.

use std::collections::BTreeMap;

use super::scenario::{self, key, observed, plan, render, run, Disk};
use crate::graph::{Step, StepGraph, VersionRef};
use crate::luks::Priority;
use crate::world::RecordStatus;

/// A plan in the manner of Rook: one key, `osd`, on the three devices of a Ceph OSD (block,
/// db, wal).
pub(super) const ROOK: &str = "version: 1
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
pub(super) fn before(g: &StepGraph, a: usize, b: usize) -> bool {
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

/// The indices of the steps of `g` that `want` accepts, in order.
pub(super) fn index_of(g: &StepGraph, want: impl Fn(&Step) -> bool) -> Vec<usize> {
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

/// A key moved to an entry that already holds a version: an interrupted run's copy of the
/// origin's current version is resumed from; another entry's version (no origin version has its
/// material), or an older copy of the key, is refused before anything is planned.
#[test]
fn a_move_into_an_occupied_entry_is_refused() {
    let p = plan(
        "version: 1
kms:
  local: { provider: file, path: keys }
  vault: { provider: file, path: vault-keys }
keys:
  osd: { kms: vault, name: osd-kek }
devices:
  block: { path: block.img, keys: [osd] }
",
    );
    let disks = vec![Disk::luks2("block")
        .holds(1, "osd", 2)
        .entry(1, "local", "osd")];
    let obs = observed(&p, disks, vec![("osd", key(Some(1), 0, None, &[], &[]))]);
    let mut states = BTreeMap::new();
    states.insert(
        ("local".to_string(), "osd".to_string()),
        key(Some(2), 10, None, &[1], &[]),
    );
    let obs = scenario::with_origins(&p, obs, &states);
    let with = |copy_of: Option<u64>| {
        let mut o = obs.clone();
        for origin in o.origins.values_mut().flatten() {
            origin.occupant = Some(crate::observe::Occupant {
                version: 1,
                pending: false,
                copy_of,
            });
        }
        o
    };
    for (copy_of, why) in [(None, "that is not this key"), (Some(1), "an older copy")] {
        let refusals = run(&p, &with(copy_of), &[]).expect_err("refused");
        let text: Vec<String> = refusals.iter().map(|r| r.to_string()).collect();
        let text = text.join("\n");
        assert!(
            text.contains("already holds an entry \"osd-kek\" (current v1)"),
            "{text}"
        );
        assert!(text.contains(why), "{text}");
        assert!(text.contains("Nothing was changed"), "{text}");
        assert!(text.contains("another `name:`"), "{text}");
    }
    let d = run(&p, &with(Some(2)), &[]).expect("an earlier run's copy is resumed from");
    assert_eq!(
        index_of(&d.graph, |s| matches!(s, Step::DestroyOrigin { .. })).len(),
        1
    );
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
