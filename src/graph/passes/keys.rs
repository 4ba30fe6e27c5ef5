//! The passes of a key across plans and KMS instances: holder records, and migration.

use super::{indexed, is_verify_of, Intents};
use crate::graph::{SlotHolder, Step, StepGraph, VersionRef};

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
                        || matches!(other, Step::DestroyOrigin { key: k, kept: false, .. } if k == key);
                    if first {
                        g.dep(*v, *r);
                    }
                }
            }
            Step::DestroyOrigin {
                key, kept: false, ..
            } => {
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
