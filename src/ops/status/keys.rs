//! The keys part of `status`: per key its KMS state, rotation schedule and the lifetimes of
//! the KMS credentials.

use std::collections::{BTreeMap, BTreeSet};

use super::findings::Findings;
use super::{CurrentReport, Engine, KeyReport};
use crate::diff;
use crate::kms::KeyState;
use crate::observe::Observed;
use crate::ops::credentials::KmsCredentials;
use crate::spec::Plan;

/// keyplan's credentials per KMS ([`crate::ops::credentials::review`]): a credential ending too
/// early, or refused by its KMS, is a problem; one that could not be looked at is unchecked,
/// unless the KMS's keys already could not be read (that line says it).
pub(super) fn credentials(
    engine: &Engine,
    keys: &[KeyReport],
    now: u64,
    f: &mut Findings,
) -> Vec<KmsCredentials> {
    let due: BTreeMap<String, u64> = keys
        .iter()
        .filter_map(|k| Some((k.id.clone(), k.rotation_due_at?)))
        .collect();
    let report = crate::ops::credentials::review(engine, &due, now);
    for k in &report {
        f.problems.extend(k.warnings().map(str::to_string));
        match &k.error {
            Some(e) if k.refused => f
                .problems
                .push(format!("KMS {}: keyplan's credentials refused: {e}", k.kms)),
            Some(e) if !keys.iter().any(|x| x.kms == k.kms && !x.readable) => f
                .unchecked
                .push(format!("KMS {}: credentials not checked: {e}", k.kms)),
            _ => {}
        }
    }
    report
}

/// One key's report: from the observation when there is one, else read from its KMS now.
pub(super) fn key_report(
    engine: &Engine,
    observed: Option<&Observed>,
    id: &str,
    committed: &BTreeSet<String>,
    now: u64,
    f: &mut Findings,
) -> KeyReport {
    let plan = engine.plan();
    let key = &plan.keys[id];
    let provider = plan
        .kms
        .get(&key.kms)
        .map_or("unknown", |k| k.provider())
        .to_string();
    // Err((what, damaged)): damaged when the KMS answered with something wrong (corrupt
    // data, a missing version): a problem; otherwise it could not be asked.
    let state: Result<KeyState, (String, bool)> = match observed.and_then(|o| o.keys.get(id)) {
        Some(st) => Ok(st.clone()),
        None => engine
            .world()
            .kms_for(plan, id)
            .map_err(|e| (e.to_string(), false))
            .and_then(|k| {
                k.read(&key.name).map_err(|e| {
                    let damaged = matches!(
                        e,
                        crate::kms::KmsError::Corrupt { .. }
                            | crate::kms::KmsError::NoSuchVersion { .. }
                            | crate::kms::KmsError::NewerFormat(_)
                    );
                    (e.to_string(), damaged)
                })
            }),
    };
    let mut kr = KeyReport {
        id: id.to_string(),
        kms: key.kms.clone(),
        provider,
        name: key.name.clone(),
        readable: true,
        error: None,
        current: None,
        missing: false,
        rotate_after_seconds: key.rotate_after.map(|d| d.as_secs()),
        rotation_due_at: None,
        overdue: false,
        pending: None,
        pending_unclaimed: false,
        retained: Vec::new(),
    };
    let st = match state {
        Ok(st) => st,
        Err((e, damaged)) => {
            if damaged {
                f.problems
                    .push(format!("key {id}: KMS {} unreadable: {e}", key.kms));
            } else {
                let (keys, _) = f
                    .unreadable
                    .entry(key.kms.clone())
                    .or_insert_with(|| (Vec::new(), e.clone()));
                keys.push(id.to_string());
            }
            kr.readable = false;
            kr.error = Some(e);
            return kr;
        }
    };
    if let Some(c) = st.current_info() {
        kr.current = Some(CurrentReport {
            version: c.version,
            created_at: c.created_at,
            age_seconds: now.saturating_sub(c.created_at),
        });
        if let Some(limit) = key.rotate_after {
            let due = c.created_at.saturating_add(limit.as_secs());
            kr.rotation_due_at = Some(due);
            if due <= now {
                kr.overdue = true;
                f.problems.push(format!(
                    "key {id}: rotation overdue by {} (rotate_after {})",
                    diff::short_duration(std::time::Duration::from_secs(now - due)),
                    key.rotate_after_text.as_deref().unwrap_or("?")
                ));
            }
        }
        skipped_rotations(plan, observed, id, &st, &kr, f);
    } else if committed.contains(id) {
        kr.missing = true;
        f.problems.push(format!(
            "key {id}: missing from its KMS {} although a run committed a version",
            key.kms
        ));
    }
    kr.pending = st.pending;
    kr.pending_unclaimed = pending_unclaimed(plan, observed, id, &st);
    kr.retained = st.retained_previous();
    lingering(engine, observed, id, f);
    kr
}

/// Versions of key `id` its KMS records as retired but whose material it can still hand out
/// ([`crate::kms::Kms::lingering`]), in its KMS and in the KMSs a move takes it from
/// ([`Observed::origins`]) or left with a copy kept for other devices ([`Observed::kept`]): a
/// problem, since a version rotated out, or a key moved away, must
/// open nothing. A KMS that cannot be asked is left to the key's own line.
fn lingering(engine: &Engine, observed: Option<&Observed>, id: &str, f: &mut Findings) {
    let plan = engine.plan();
    let key = &plan.keys[id];
    let mut entries = vec![(key.kms.clone(), key.name.clone())];
    if let Some(os) = observed.and_then(|o| o.origins.get(id)) {
        entries.extend(os.iter().map(|o| (o.kms.clone(), o.name.clone())));
    }
    // The copies earlier moves kept in the KMS a key left ([`Observed::kept`]).
    if let Some(o) = observed {
        entries.extend(
            o.kept
                .iter()
                .filter(|k| k.copy.key == id)
                .map(|k| (k.copy.kms.clone(), k.copy.name.clone())),
        );
    }
    entries.sort();
    entries.dedup();
    for (kms_name, name) in entries {
        let Some(kms) = engine.world().kms.get(&kms_name) else {
            continue;
        };
        let Ok(versions) = kms.lingering(&name) else {
            continue;
        };
        if versions.is_empty() {
            continue;
        }
        let list: Vec<String> = versions.iter().map(|v| format!("v{v}")).collect();
        f.problems.push(format!(
            "key {id}: KMS {kms_name} records {} of {name:?} as retired, yet can still hand out {} material (a retire or destroy interrupted before it finished, or material restored by hand); a version rotated out must open nothing. Run `keyplan apply` to finish an interrupted run; if it stays, destroy {} with the KMS's own tools (for the file KMS: delete the version's `.key` file, docs/operations.md, \"File KMS layout\")",
            list.join(", "),
            if versions.len() == 1 { "its" } else { "their" },
            if versions.len() == 1 { "it" } else { "them" },
        ));
    }
}

/// Whether key `id`'s pending version (state `st`) is a creation that nothing shows is this
/// plan's ([`diff::unclaimed_creation`]): an interrupted `keyplan key import`, or another plan
/// creating the key. Another node of the plan creating a shared key is no stranger: `apply`
/// enrolls it once it is committed.
fn pending_unclaimed(plan: &Plan, observed: Option<&Observed>, id: &str, st: &KeyState) -> bool {
    let peers = plan.peers.get(id).is_some_and(|p| !p.is_empty());
    !peers
        && observed
            .and_then(|o| diff::unclaimed_creation(&o.devices, &o.staged_here, id, st))
            .is_some()
}

/// A key that rotates on a schedule (`rotate_after`) but is also held by another plan
/// (invariant I7; not a peer node, nor this plan's own former record): every scheduled
/// rotation is skipped (`plan` says so in a note), so that is a problem here, before the key
/// is overdue.
fn skipped_rotations(
    plan: &Plan,
    observed: Option<&Observed>,
    id: &str,
    st: &KeyState,
    kr: &KeyReport,
    f: &mut Findings,
) {
    let (Some(due), Some(text)) = (kr.rotation_due_at, &plan.keys[id].rotate_after_text) else {
        return;
    };
    let mut st = st.clone();
    if let Some(o) = observed {
        st.holders.retain(|h, _| {
            let of = crate::kms::book::parse_vote(h).map_or(h.as_str(), |(of, _)| of);
            !o.former_holders.contains_key(of)
        });
    }
    let others = diff::foreign_holders(plan, id, &st);
    if others.is_empty() {
        return;
    }
    f.problems.push(format!(
        "key {id}: its scheduled rotation (rotate_after {text}, due {}) is skipped: the key is also held by another plan ({}), and a version committed from this plan ({}) would not be on that plan's devices. Rotate it from one plan that lists every device holding it; for a plan gone for good, `keyplan key release {id} --holder HOLDER` removes its record",
        crate::clock::rfc3339(due),
        others.join(", "),
        plan.holder()
    ));
}
