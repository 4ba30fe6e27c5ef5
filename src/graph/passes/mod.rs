//! The ordering rules of a step graph, one named pass each (in the manner of terraform's graph
//! transformers): the planner's decisions add steps, and these passes add the edges that make
//! running them safe in any order the executor picks.
//!
//! Most rules follow from the steps themselves (what a step reads, writes, or names as its
//! anchor). Four need a fact only the decision knows, handed over in [`Intents`]: which verify
//! gates which commit, which steps must wait for a commit, which kill frees the keyslot an add
//! fills, and which repair waits for which verify. Every pass only adds edges; running a pass
//! twice changes nothing. The safety argument for each rule is on its function.

mod device;
mod keys;
#[cfg(test)]
mod tests;

use super::{Step, StepGraph, VersionRef};

pub use device::{
    add_before_verify, adoptions_next, after_commit, anchor_before_kill, commit_gates,
    forgets_first, readers_before_kill, repair_after_anchor, rerecord_before_kill, retire_last,
    slot_freed_before_add, staged_version_first,
};
pub use keys::{holders_order, migration_order};

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

fn is_verify_of(step: &Step, device: &str, key: &str, version: VersionRef, slot: u32) -> bool {
    matches!(step, Step::Verify { device: d, key: k, version: v, slot: s }
        if d == device && k == key && *v == version && *s == slot)
}
