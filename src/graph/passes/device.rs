//! The passes of one device and of a key version on it: records, keyslots, and a version's
//! stage, commit and retirement.

use super::{indexed, is_verify_of, Intents};
use crate::graph::{SlotHolder, Step, StepGraph, Unlock, VersionRef};

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
