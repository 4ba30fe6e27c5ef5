//! Reading the KMSs: every key's version metadata, and where moved keys' records say they were.

use std::collections::BTreeMap;

use super::{DeviceState, Kept, Occupant, Origin};
use crate::finding::Finding;
use crate::kms::{KeyState, Kms, KmsError};
use crate::spec::{PathSeg, Plan};
use crate::world::{RecordStatus, World};

/// `keys.<id>` as a path into the plan document.
fn key_path(id: &str) -> Vec<PathSeg> {
    vec![PathSeg::Key("keys".into()), PathSeg::Key(id.to_string())]
}

/// Reads every key's state in its KMS (one read each, in plan order). Keys that cannot be read
/// are left out, with a finding pointing at the key in the plan.
pub(super) fn read(
    plan: &Plan,
    world: &World,
    findings: &mut Vec<Finding>,
) -> BTreeMap<String, KeyState> {
    let mut keys = BTreeMap::new();
    for (id, key) in &plan.keys {
        let res = world
            .kms_for(plan, id)
            .map_err(|e| Finding::at(key_path(id), format!("key {id}: {e}"), None))
            .and_then(|k| k.read(&key.name).map_err(|e| kms_finding(id, &e)));
        match res {
            Ok(st) => {
                keys.insert(id.clone(), st);
            }
            Err(f) => findings.push(f),
        }
    }
    keys
}

/// The `(KMS instance, name)` pairs other than `key`'s own that valid records of `key` on
/// `devices` name (where the key lived before the plan moved it), sorted, each once.
pub(crate) fn moved_from(
    key: &crate::spec::Key,
    devices: &BTreeMap<String, DeviceState>,
) -> Vec<(String, String)> {
    let mut seen: Vec<(String, String)> = devices
        .values()
        .flat_map(|d| d.records.iter())
        .filter(|r| r.status == RecordStatus::Valid && r.record.key == key.id)
        .filter_map(|r| r.record.entry.clone())
        .filter(|(k, n)| *k != key.kms || *n != key.name)
        .collect();
    seen.sort();
    seen.dedup();
    seen
}

/// The finding for KMS error `e` reading key `id`: the KMS could not be reached or would not
/// answer (unreachable: what it holds is unknown), or something is wrong: its data is corrupt,
/// a version it names is missing (the key is lost or damaged), or the KMS's configuration
/// cannot be used (a helper that cannot be started, a key name the store cannot hold: a
/// problem to fix, not an outage, so `plan` and `status` exit 1, not 3).
fn kms_finding(id: &str, e: &crate::kms::KmsError) -> Finding {
    use crate::kms::KmsError;
    let f = Finding::at(key_path(id), format!("key {id}: {e}"), None);
    match e {
        KmsError::Corrupt { .. }
        | KmsError::NoSuchVersion { .. }
        | KmsError::Config { .. }
        | KmsError::NewerFormat(_)
        | KmsError::Unsupported { .. } => f,
        _ => f.unreachable(),
    }
}

/// Finds, for every key of `plan`, the other `(KMS instance, name)` pairs its valid records
/// on plan devices name, and reads the key there (one KMS read each); where the key's own
/// entry (`keys`: the keys as read in their KMSs) already holds a version while the origin
/// still holds its current one, compares the two by material ([`occupant`]).
///
/// Errors: every origin KMS that cannot be read, pointing at the key in the plan.
pub(super) fn origins(
    plan: &Plan,
    world: &World,
    devices: &BTreeMap<String, DeviceState>,
    keys: &BTreeMap<String, KeyState>,
) -> Result<BTreeMap<String, Vec<Origin>>, Vec<Finding>> {
    let mut out: BTreeMap<String, Vec<Origin>> = BTreeMap::new();
    let mut errors = Vec::new();
    for (id, key) in &plan.keys {
        for (kms_name, name) in moved_from(key, devices) {
            let Some(from) = world.kms.get(&kms_name) else {
                out.entry(id.clone()).or_default().push(Origin {
                    kms: kms_name,
                    name,
                    state: None,
                    occupant: None,
                });
                continue;
            };
            let st = match from.read(&name) {
                Ok(st) => st,
                Err(e) => {
                    errors.push(Finding::at(
                        key_path(id),
                        format!("key {id}: its devices record it in KMS {kms_name:?} (as {name:?}), which the plan moved it from: {e}"),
                        None,
                    ).unreachable());
                    continue;
                }
            };
            let dest = world.kms_for(plan, id).ok().zip(keys.get(id));
            let occupant = match dest {
                Some((d, dst)) => {
                    match occupant((d, &key.name, dst), (from.as_ref(), &name, &st)) {
                        Ok(o) => o,
                        Err(e) => {
                            errors.push(Finding::at(
                            key_path(id),
                            format!("key {id}: the plan moves it to KMS {:?} (as {:?}), which already holds a version of that name; comparing it with the key's versions in KMS {kms_name:?} (as {name:?}) failed: {e}", key.kms, key.name),
                            None,
                        ).unreachable());
                            continue;
                        }
                    }
                }
                None => None,
            };
            out.entry(id.clone()).or_default().push(Origin {
                kms: kms_name,
                name,
                state: Some(st),
                occupant,
            });
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// What the key's own entry `(kms, name, state)` (where the plan moves it) already holds,
/// compared with the origin `(kms, name, state)` by material: `None` when the origin holds no
/// current version (an earlier run copied and destroyed it; the verify steps test the copy)
/// or the destination holds no current or pending version. Material is compared in memory and
/// dropped (zeroized); nothing of it is kept.
///
/// Errors: a version either KMS lists cannot be read.
fn occupant(
    (dest, dest_name, dest_st): (&dyn Kms, &str, &KeyState),
    (from, from_name, from_st): (&dyn Kms, &str, &KeyState),
) -> Result<Option<Occupant>, KmsError> {
    let Some(current) = from_st.current else {
        return Ok(None);
    };
    let (version, pending) = match (dest_st.current, dest_st.pending) {
        (Some(c), _) => (c, false),
        (None, Some(p)) => (p, true),
        (None, None) => return Ok(None),
    };
    let held = dest.get(dest_name, version)?;
    let mut copy_of = None;
    for v in std::iter::once(current).chain(from_st.retained_previous()) {
        if from.get(from_name, v)?.expose() == held.expose() {
            copy_of = Some(v);
            break;
        }
    }
    Ok(Some(Occupant {
        version,
        pending,
        copy_of,
    }))
}

/// The entries earlier moves kept (`<state_dir>/kept.json`), each read in its KMS (one read
/// each) when that KMS instance is still in the plan.
///
/// Errors: the file is corrupt or cannot be read; a KMS holding a kept entry cannot be read.
pub(super) fn kept(plan: &Plan, world: &World) -> Result<Vec<Kept>, Vec<Finding>> {
    let copies = crate::world::kept::read(&plan.state_dir).map_err(|e| {
        use crate::world::kept::KeptError;
        let help = "fix or restore the file, then run `keyplan plan` again";
        let help = (!matches!(e, KeptError::Newer(_))).then(|| help.to_string());
        let f = Finding::bare(e.to_string(), help);
        vec![match e {
            KeptError::Io { .. } => f.unreachable(),
            KeptError::Corrupt { .. } | KeptError::Newer(_) => f,
        }]
    })?;
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for copy in copies {
        let state = match world.kms.get(&copy.kms) {
            None => None,
            Some(kms) => match kms.read(&copy.name) {
                Ok(st) => Some(st),
                Err(e) => {
                    errors.push(Finding::bare(
                        format!(
                            "key {}: KMS {:?} keeps a copy of it (as {:?}) for devices outside an earlier move, and cannot be read: {e}",
                            copy.key, copy.kms, copy.name
                        ),
                        Some("nothing was changed; run `keyplan plan` again once the KMS answers".into()),
                    ).unreachable());
                    continue;
                }
            },
        };
        out.push(Kept { copy, state });
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}
