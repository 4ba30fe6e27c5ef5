//! The ordering rules of a step graph, one named pass each (in the manner of terraform's graph
//! transformers): the planner's decisions add steps, and these passes add the edges that make
//! running them safe in any order the executor picks.
//!
//! Most rules follow from the steps themselves (what a step reads, writes, or names as its
//! anchor). Four need a fact only the decision knows, handed over in [`Intents`]: which verify
//! gates which commit, which steps must wait for a commit, which kill frees the keyslot an add
//! fills, and which repair waits for which verify. Every pass only adds edges; running a pass
//! twice changes nothing. The safety argument for each rule is on its function.

use super::{SlotHolder, Step, StepGraph, Unlock, VersionRef};

/// Ordering facts the planner's decisions know and the steps do not say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Intents {
    /// `(verify, commit)`: the verify checks, on one device, the version the commit makes
    /// current ([`commit_gates`]).
    pub gates: Vec<(usize, usize)>,
    /// `(step, commit)`: the step may run only once the commit made the staged version
    /// current ([`after_commit`]).
    pub after_commit: Vec<(usize, usize)>,
    /// `(kill, add)`: the kill frees the keyslot the add fills ([`slot_freed_before_add`]).
    pub frees: Vec<(usize, usize)>,
    /// `(step, verify)`: the step (dropping a record `--verify` failed) waits for the verify
    /// of the key enrolled again on the same device ([`repair_after_anchor`]).
    pub after_verify: Vec<(usize, usize)>,
}

/// A pass: adds the edges of one rule.
pub type Pass = fn(&mut StepGraph, &Intents);

/// Every pass, in the order [`order`] runs them (the order does not change the result).
pub const PASSES: &[(&str, Pass)] = &[
    ("forgets_first", forgets_first),
    ("adoptions_next", adoptions_next),
    ("add_before_verify", add_before_verify),
    ("staged_version_first", staged_version_first),
    ("commit_gates", commit_gates),
    ("after_commit", after_commit),
    ("slot_freed_before_add", slot_freed_before_add),
    ("anchor_before_kill", anchor_before_kill),
    ("readers_before_kill", readers_before_kill),
    ("repair_after_anchor", repair_after_anchor),
    ("retire_last", retire_last),
    ("holders_order", holders_order),
    ("migration_order", migration_order),
    ("rerecord_before_kill", rerecord_before_kill),
];

/// Runs every pass of [`PASSES`] over `g`.
pub fn order(g: &mut StepGraph, intents: &Intents) {
    for (name, pass) in PASSES {
        let before = g.deps().len();
        pass(g, intents);
        tracing::trace!(
            pass = name,
            edges = g.deps().len() - before,
            "ordering pass"
        );
    }
}

/// All `(index, step)` pairs of `g`.
fn indexed(g: &StepGraph) -> Vec<(usize, Step)> {
    g.steps().into_iter().enumerate().collect()
}

/// Dropping a record that drift made stale (a keyslot killed or rewritten outside keyplan)
/// comes before every other step on its device: a stale record must not be found by a step
/// that writes a fresh record for the same keyslot number, and must not be deleted after it.
/// Records `--verify` failed are not stale in that sense (see [`repair_after_anchor`]); they
/// are among the steps that wait.
pub fn forgets_first(g: &mut StepGraph, _: &Intents) {
    let steps = indexed(g);
    for (f, step) in &steps {
        let Step::ForgetRecord {
            device,
            failed_verify: false,
            ..
        } = step
        else {
            continue;
        };
        for (s, other) in &steps {
            let also_stale = matches!(
                other,
                Step::ForgetRecord {
                    failed_verify: false,
                    ..
                }
            );
            if other.device() == Some(device) && !also_stale {
                g.dep(*f, *s);
            }
        }
    }
}

/// Recording an adopted keyslot comes before every other step on its device but the dropping
/// of stale records: steps that kill, move or unlock through the keyslot find it recorded (a
/// kill refuses a keyslot whose record does not name what it must hold).
pub fn adoptions_next(g: &mut StepGraph, _: &Intents) {
    let steps = indexed(g);
    for (a, step) in &steps {
        let Step::AdoptKeyslot { device, .. } = step else {
            continue;
        };
        for (s, other) in &steps {
            let first = matches!(
                other,
                Step::AdoptKeyslot { .. }
                    | Step::ForgetRecord {
                        failed_verify: false,
                        ..
                    }
            );
            if other.device() == Some(device) && !first {
                g.dep(*a, *s);
            }
        }
    }
}

/// A keyslot's re-record (a key renamed in the plan, or moved to another KMS) comes before a
/// kill of that keyslot: the kill refuses a keyslot whose record does not name what it must
/// hold, and it names the key by its id in the plan.
pub fn rerecord_before_kill(g: &mut StepGraph, _: &Intents) {
    let steps = indexed(g);
    for (r, step) in &steps {
        let Step::Rerecord { device, slot, .. } = step else {
            continue;
        };
        for (k, other) in &steps {
            if matches!(other, Step::KillKeyslot { device: d, slot: s, .. } if d == device && s == slot)
            {
                g.dep(*r, *k);
            }
        }
    }
}

/// A keyslot is verified only after it was added: the verify of (device, key, version,
/// keyslot) waits for the add of the same.
pub fn add_before_verify(g: &mut StepGraph, _: &Intents) {
    let steps = indexed(g);
    for (a, add) in &steps {
        let Step::AddKeyslot {
            device,
            key,
            version,
            slot,
            ..
        } = add
        else {
            continue;
        };
        for (v, verify) in &steps {
            if is_verify_of(verify, device, key, *version, *slot) {
                g.dep(*a, *v);
            }
        }
    }
}

fn is_verify_of(step: &Step, device: &str, key: &str, version: VersionRef, slot: u32) -> bool {
    matches!(step, Step::Verify { device: d, key: k, version: v, slot: s }
        if d == device && k == key && *v == version && *s == slot)
}

/// The step that fixes a key's staged version (`stage`, or a migration's `copy`, whose number
/// in the new KMS is the staged version) comes before every step that uses that version: adds,
/// unlocks, verifies and kills of it, the commit, and re-records.
pub fn staged_version_first(g: &mut StepGraph, _: &Intents) {
    let steps = indexed(g);
    for (s, step) in &steps {
        let key = match step {
            Step::Stage { key, .. } | Step::MigrateCopy { key, .. } => key,
            _ => continue,
        };
        for (u, user) in &steps {
            if uses_staged(user, key) {
                g.dep(*s, *u);
            }
        }
    }
}

/// True when `step` uses the staged version of `key`.
fn uses_staged(step: &Step, key: &str) -> bool {
    let staged = |k: &str, v: &VersionRef| k == key && *v == VersionRef::Staged;
    match step {
        Step::AddKeyslot {
            key: k,
            version,
            unlock,
            ..
        } => {
            staged(k, version)
                || matches!(unlock, Unlock::Key { key: uk, version: uv, .. } if staged(uk, uv))
        }
        Step::Verify {
            key: k, version, ..
        }
        | Step::Rerecord {
            key: k, version, ..
        } => staged(k, version),
        Step::KillKeyslot {
            holder: SlotHolder::Record { key: k, version },
            ..
        } => staged(k, version),
        Step::Commit { key: k, .. } => k == key,
        _ => false,
    }
}

/// Invariant I1 at the commit: a staged version becomes current only after every device that
/// must hold it has verified it ([`Intents::gates`]).
pub fn commit_gates(g: &mut StepGraph, i: &Intents) {
    for &(verify, commit) in &i.gates {
        g.dep(verify, commit);
    }
}

/// Steps that remove what opens a device with the old version (kills of superseded keyslots,
/// kills anchored on a keyslot of the staged version, a repair anchored on one) wait for the
/// commit: until then the old version is the KMS's current one ([`Intents::after_commit`]).
pub fn after_commit(g: &mut StepGraph, i: &Intents) {
    for &(step, commit) in &i.after_commit {
        g.dep(commit, step);
    }
}

/// An add into a keyslot that holds something now (a pinned keyslot) waits for the kill that
/// frees it ([`Intents::frees`]).
pub fn slot_freed_before_add(g: &mut StepGraph, i: &Intents) {
    for &(kill, add) in &i.frees {
        g.dep(kill, add);
    }
}

/// A kill waits for its anchor: the verify of another keyslot of the same device that stays
/// (the executor checks again, before killing, that the anchor is as verified).
pub fn anchor_before_kill(g: &mut StepGraph, _: &Intents) {
    for (k, step) in indexed(g) {
        if let Step::KillKeyslot { anchor, .. } = step {
            g.dep(anchor, k);
        }
    }
}

/// Every step that reads a keyslot as it is now (an add unlocking through it, a verify of it)
/// runs before the kill of that keyslot. The verify of a keyslot this graph adds reads the new
/// keyslot, not the one a kill of the same number removes, and is ordered by the rules of the
/// add instead.
pub fn readers_before_kill(g: &mut StepGraph, _: &Intents) {
    let steps = indexed(g);
    let adds: Vec<&Step> = steps
        .iter()
        .map(|(_, s)| s)
        .filter(|s| matches!(s, Step::AddKeyslot { .. }))
        .collect();
    for (k, kill) in &steps {
        let Step::KillKeyslot { device, slot, .. } = kill else {
            continue;
        };
        for (r, reader) in &steps {
            let reads = match reader {
                Step::AddKeyslot {
                    device: d,
                    unlock: Unlock::Key { slot: s, .. },
                    ..
                } => d == device && s == slot,
                Step::Verify {
                    device: d,
                    key,
                    version,
                    slot: s,
                } => {
                    d == device
                        && s == slot
                        && !adds.iter().any(|a| added_as(a, d, key, *version, *s))
                }
                _ => false,
            };
            if reads {
                g.dep(*r, *k);
            }
        }
    }
}

fn added_as(step: &Step, device: &str, key: &str, version: VersionRef, slot: u32) -> bool {
    matches!(step, Step::AddKeyslot { device: d, key: k, version: v, slot: s, .. }
        if d == device && k == key && *v == version && *s == slot)
}

/// Dropping a record `--verify` failed waits for the verify of the key enrolled again on that
/// device, so a failed repair loses no record ([`Intents::after_verify`]).
pub fn repair_after_anchor(g: &mut StepGraph, i: &Intents) {
    for &(step, verify) in &i.after_verify {
        g.dep(verify, step);
    }
}

/// A superseded version is destroyed in the KMS last: after the commit of its key, after
/// every kill of a keyslot that held it, and after every search for copies of it (which needs
/// its material).
pub fn retire_last(g: &mut StepGraph, _: &Intents) {
    let steps = indexed(g);
    for (r, retire) in &steps {
        let Step::Retire { key, version } = retire else {
            continue;
        };
        for (s, step) in &steps {
            let before = match step {
                Step::Commit { key: k, .. } => k == key,
                Step::KillKeyslot {
                    holder:
                        SlotHolder::Record {
                            key: k,
                            version: VersionRef::Version(v),
                        },
                    ..
                } => k == key && v == version,
                // The version's material is needed to look for its copies.
                Step::FindCopies {
                    key: k, version: v, ..
                } => k == key && v == version,
                _ => false,
            };
            if before {
                g.dep(*s, *r);
            }
        }
    }
}

/// A holder record comes before every keyslot added, adopted or committed for its key (unless
/// the hold waits for the key's creation: an [`Intents::after_commit`] of the commit), and the
/// removal of one after every other step on its key; the removal of a former record of this
/// plan after this plan's record and before the key's writes; a vote after the verifies of the staged
/// version and the searches for copies of the versions its commit may retire, and before the
/// commit, a withdrawn vote before the key's adds.
pub fn holders_order(g: &mut StepGraph, intents: &Intents) {
    let steps = indexed(g);
    let on_key = |step: &Step, key: &str| -> bool {
        match step {
            Step::Stage { key: k, .. }
            | Step::AddKeyslot { key: k, .. }
            | Step::Verify { key: k, .. }
            | Step::Commit { key: k, .. }
            | Step::AdoptKeyslot { key: k, .. }
            | Step::Retire { key: k, .. } => k == key,
            Step::KillKeyslot {
                holder: SlotHolder::Record { key: k, .. },
                ..
            } => k == key,
            _ => false,
        }
    };
    for (h, step) in &steps {
        match step {
            Step::Hold { key, .. } => {
                if intents.after_commit.iter().any(|(s, _)| s == h) {
                    continue;
                }
                for (s, other) in &steps {
                    let writes = matches!(
                        other,
                        Step::Stage { .. }
                            | Step::AddKeyslot { .. }
                            | Step::Commit { .. }
                            | Step::AdoptKeyslot { .. }
                    );
                    if writes && on_key(other, key) {
                        g.dep(*h, *s);
                    }
                }
            }
            Step::Release { key, .. } => {
                for (s, other) in &steps {
                    if on_key(other, key) {
                        g.dep(*s, *h);
                    }
                }
            }
            // A former record of this plan goes once this plan's own record is written, and
            // before the key is written otherwise: a commit must not meet it as another
            // plan's, and the key is never without a record of this plan.
            Step::ReleaseFormer { key, .. } => {
                for (s, other) in &steps {
                    match other {
                        Step::Hold { key: k, .. } if k == key => g.dep(*s, *h),
                        Step::Vote { key: k } if k == key => g.dep(*h, *s),
                        _ if on_key(other, key)
                            && matches!(
                                other,
                                Step::Stage { .. }
                                    | Step::AddKeyslot { .. }
                                    | Step::Commit { .. }
                                    | Step::AdoptKeyslot { .. }
                            ) =>
                        {
                            g.dep(*h, *s)
                        }
                        _ => {}
                    }
                }
            }
            // A vote comes after every verify of the staged version on this plan's devices
            // and before the commit; a withdrawn vote goes before any keyslot of the key is
            // added (and before a new vote).
            Step::Vote { key } => {
                for (s, other) in &steps {
                    match other {
                        Step::Verify {
                            key: k,
                            version: VersionRef::Staged,
                            ..
                        }
                        | Step::Hold { key: k, .. }
                        | Step::Stage { key: k, .. }
                        | Step::FindCopies { key: k, .. }
                            if k == key =>
                        {
                            g.dep(*s, *h)
                        }
                        Step::Commit { key: k, .. } if k == key => g.dep(*h, *s),
                        _ => {}
                    }
                }
            }
            Step::Unvote { key, .. } => {
                for (s, other) in &steps {
                    match other {
                        Step::AddKeyslot { key: k, .. } | Step::Vote { key: k } if k == key => {
                            g.dep(*h, *s)
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
}

/// A migration destroys the key in the KMS it moves from only after every device verified the
/// copy, and re-records a keyslot only after it was verified and the origin was destroyed (so
/// no record names a KMS that still holds a copy nobody verified).
pub fn migration_order(g: &mut StepGraph, _: &Intents) {
    let steps = indexed(g);
    for (r, step) in &steps {
        match step {
            Step::Rerecord {
                device,
                key,
                slot,
                version,
                ..
            } => {
                for (v, other) in &steps {
                    let first = is_verify_of(other, device, key, *version, *slot)
                        || matches!(other, Step::DestroyOrigin { key: k, .. } if k == key);
                    if first {
                        g.dep(*v, *r);
                    }
                }
            }
            Step::DestroyOrigin { key, .. } => {
                for (v, other) in &steps {
                    if matches!(other, Step::Verify { key: k, version: VersionRef::Staged, .. } if k == key)
                    {
                        g.dep(*v, *r);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each pass on a small graph: the edges it adds, and none it must not add.

    use super::*;

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
}
