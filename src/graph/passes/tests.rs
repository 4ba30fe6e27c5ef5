//! Each pass on a small graph: the edges it adds, and none it must not add.

use super::*;
use crate::graph::{SlotHolder, Unlock};

const D: &str = "dev";

fn add(slot: u32, version: VersionRef, unlock_slot: Option<u32>) -> Step {
    Step::AddKeyslot {
        device: D.into(),
        key: "k".into(),
        version,
        slot,
        unlock: match unlock_slot {
            Some(s) => Unlock::Key {
                key: "k".into(),
                version: VersionRef::Version(1),
                slot: s,
            },
            None => Unlock::EnrollWith,
        },
    }
}

fn verify(slot: u32, version: VersionRef) -> Step {
    Step::Verify {
        device: D.into(),
        key: "k".into(),
        version,
        slot,
    }
}

fn kill(slot: u32, version: VersionRef, anchor: usize) -> Step {
    Step::KillKeyslot {
        device: D.into(),
        slot,
        holder: SlotHolder::Record {
            key: "k".into(),
            version,
        },
        anchor,
    }
}

fn graph(steps: Vec<Step>) -> StepGraph {
    StepGraph::from_parts(steps, &[])
}

/// `pass` on `steps` with `intents` adds exactly the edges `want`.
fn adds(pass: Pass, steps: Vec<Step>, intents: &Intents, want: &[(usize, usize)]) {
    let mut g = graph(steps);
    pass(&mut g, intents);
    let mut got = g.deps();
    got.sort_unstable();
    let mut want = want.to_vec();
    want.sort_unstable();
    assert_eq!(got, want);
    let again = g.deps().len();
    pass(&mut g, intents);
    assert_eq!(g.deps().len(), again, "running a pass twice adds nothing");
}

const V1: VersionRef = VersionRef::Version(1);
const NEW: VersionRef = VersionRef::Staged;

#[test]
fn stale_records_are_forgotten_first() {
    let forget = |slot, failed_verify| Step::ForgetRecord {
        device: D.into(),
        slot,
        failed_verify,
    };
    let steps = vec![
        forget(1, false),
        verify(0, V1),
        forget(2, true),
        forget(3, false),
        Step::Stage {
            key: "k".into(),
            at_least: 1,
            planned_current: None,
        },
    ];
    // Both stale forgets precede the verify and the failed-verify forget, not each other
    // and not the key-level stage.
    adds(
        forgets_first,
        steps,
        &Intents::default(),
        &[(0, 1), (0, 2), (3, 1), (3, 2)],
    );
}

#[test]
fn adoptions_come_after_stale_records_and_before_the_rest() {
    let steps = vec![
        Step::ForgetRecord {
            device: D.into(),
            slot: 3,
            failed_verify: false,
        },
        Step::AdoptKeyslot {
            device: D.into(),
            slot: 0,
            key: "k".into(),
            version: 1,
            salt: "s".into(),
        },
        kill(0, V1, 3),
        verify(1, NEW),
        Step::Verify {
            device: "other".into(),
            key: "k".into(),
            version: V1,
            slot: 0,
        },
    ];
    adds(
        adoptions_next,
        steps,
        &Intents::default(),
        &[(1, 2), (1, 3)],
    );
}

#[test]
fn an_add_precedes_the_verify_of_the_same_keyslot_and_version() {
    let steps = vec![
        add(2, NEW, Some(0)),
        verify(2, NEW),
        verify(2, V1),
        verify(0, NEW),
    ];
    adds(add_before_verify, steps, &Intents::default(), &[(0, 1)]);
}

#[test]
fn the_stage_precedes_every_user_of_the_staged_version() {
    let steps = vec![
        Step::Stage {
            key: "k".into(),
            at_least: 2,
            planned_current: None,
        },
        add(2, NEW, Some(0)),
        verify(2, NEW),
        Step::Commit {
            key: "k".into(),
            expected_current: Some(1),
        },
        kill(2, NEW, 2),
        verify(0, V1),
        Step::Stage {
            key: "other".into(),
            at_least: 1,
            planned_current: None,
        },
    ];
    adds(
        staged_version_first,
        steps,
        &Intents::default(),
        &[(0, 1), (0, 2), (0, 3), (0, 4)],
    );
}

#[test]
fn intents_become_their_edges() {
    let steps = vec![
        verify(1, NEW),
        verify(0, V1),
        add(0, NEW, Some(1)),
        kill(0, V1, 0),
    ];
    let i = Intents {
        gates: vec![(0, 1)],
        after_commit: vec![(3, 1)],
        frees: vec![(3, 2)],
        after_verify: vec![(2, 0)],
    };
    adds(commit_gates, steps.clone(), &i, &[(0, 1)]);
    adds(after_commit, steps.clone(), &i, &[(1, 3)]);
    adds(slot_freed_before_add, steps.clone(), &i, &[(3, 2)]);
    adds(repair_after_anchor, steps, &i, &[(0, 2)]);
}

#[test]
fn a_kill_waits_for_its_anchor() {
    let steps = vec![verify(1, NEW), kill(0, V1, 0)];
    adds(anchor_before_kill, steps, &Intents::default(), &[(0, 1)]);
}

#[test]
fn readers_of_a_keyslot_precede_its_kill_but_not_the_verify_of_a_re_add() {
    let steps = vec![
        add(1, NEW, Some(0)), // reads keyslot 0 (unlock)
        verify(0, V1),        // reads keyslot 0 as it is now
        kill(0, V1, 3),       // the kill of keyslot 0
        verify(1, NEW),       // the kill's anchor, another keyslot
        add(0, NEW, Some(1)), // re-adds keyslot 0 ...
        verify(0, NEW),       // ... and its verify reads the new keyslot 0
    ];
    adds(
        readers_before_kill,
        steps,
        &Intents::default(),
        &[(0, 2), (1, 2)],
    );
}

#[test]
fn a_version_is_retired_after_the_commit_and_the_kills_of_its_keyslots() {
    let steps = vec![
        Step::Commit {
            key: "k".into(),
            expected_current: Some(2),
        },
        kill(0, V1, 2),
        verify(1, NEW),
        kill(3, VersionRef::Version(2), 2),
        Step::Retire {
            key: "k".into(),
            version: 1,
        },
    ];
    adds(retire_last, steps, &Intents::default(), &[(0, 4), (1, 4)]);
}

#[test]
fn a_migration_destroys_after_the_verifies_and_re_records_last() {
    let moved = |s: &str| (s.to_string(), "k".to_string());
    let (to_kms, to_name) = moved("new");
    let steps = vec![
        Step::DestroyOrigin {
            key: "k".into(),
            from_kms: "old".into(),
            from_name: "k".into(),
            version: 1,
            to_kms: to_kms.clone(),
            to_name: to_name.clone(),
            kept: false,
        },
        verify(0, NEW),
        Step::Rerecord {
            device: D.into(),
            key: "k".into(),
            slot: 0,
            version: NEW,
            to_kms,
            to_name,
        },
        verify(1, V1),
    ];
    adds(
        migration_order,
        steps,
        &Intents::default(),
        &[(1, 0), (0, 2), (1, 2)],
    );
}

#[test]
fn every_pass_is_in_the_list_once() {
    let names: std::collections::BTreeSet<&str> = PASSES.iter().map(|(n, _)| *n).collect();
    assert_eq!(names.len(), PASSES.len());
    assert_eq!(PASSES.len(), 14);
}

#[test]
fn a_keyslot_is_re_recorded_before_it_is_killed() {
    const V1: VersionRef = VersionRef::Version(1);
    let rerecord = |slot: u32| Step::Rerecord {
        device: D.into(),
        key: "k".into(),
        slot,
        version: V1,
        to_kms: "local".into(),
        to_name: "old".into(),
    };
    // Kill of keyslot 0 after its re-record; keyslot 1's re-record orders nothing.
    let steps = vec![verify(2, V1), kill(0, V1, 0), rerecord(0), rerecord(1)];
    adds(rerecord_before_kill, steps, &Intents::default(), &[(2, 1)]);
}

#[test]
fn holder_records_come_first_and_go_last() {
    const V1: VersionRef = VersionRef::Version(1);
    let hold = Step::Hold {
        key: "k".into(),
        current: Some(1),
    };
    let stage = Step::Stage {
        key: "k".into(),
        at_least: 2,
        planned_current: None,
    };
    let commit = Step::Commit {
        key: "k".into(),
        expected_current: Some(1),
    };
    // Before the stage, the add and the commit of its key; not before a verify, and not
    // before another key's steps.
    let other = Step::Stage {
        key: "j".into(),
        at_least: 1,
        planned_current: None,
    };
    adds(
        holders_order,
        vec![
            hold.clone(),
            stage,
            add(1, VersionRef::Staged, Some(0)),
            verify(1, VersionRef::Staged),
            commit.clone(),
            other,
        ],
        &Intents::default(),
        &[(0, 1), (0, 2), (0, 4)],
    );
    // A hold that waits for the key's creation adds nothing.
    adds(
        holders_order,
        vec![hold, commit],
        &Intents {
            after_commit: vec![(0, 1)],
            ..Intents::default()
        },
        &[],
    );
    // A release after every step on its key.
    adds(
        holders_order,
        vec![
            kill(0, V1, 1),
            verify(1, V1),
            Step::Release {
                key: "k".into(),
                entry: None,
            },
        ],
        &Intents::default(),
        &[(0, 2), (1, 2)],
    );
}
