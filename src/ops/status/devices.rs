//! The devices part of `status`: each device observed, and its drift from the plan.

use std::collections::BTreeSet;

use super::findings::{first_line, Findings};
use super::{DeviceReport, DriftKind, DriftReport, Engine};
use crate::diff::{self, DiffOptions, SlotAction};
use crate::observe::{self, Observed, Testing};
use crate::spec::Plan;
use crate::world::RecordStatus;

/// The plan the drift diff sees: no rotation is ever due (every `rotate_after` removed), so the
/// only changes left are drift and key-level work.
fn no_rotation_due(plan: &Plan) -> Plan {
    let mut p = plan.clone();
    for k in p.keys.values_mut() {
        k.rotate_after = None;
    }
    p
}

/// Observes the devices and finds drift (docs/monitoring.md, "Drift"): a device drifted when
/// `keyplan plan` would change it for a reason other than a key-level change (a due rotation,
/// a key not created yet, a pending version, a migration). Due rotations are taken out by
/// diffing against the plan without `rotate_after`; `enroll_with` passphrases are not tested
/// (no PBKDF run), though the diff still sees them, so it plans as `apply` would.
///
/// Devices that cannot be used ([`observe::Unavailable`]) become drift of their own (the
/// observation and the diff go around them). What stops the observation lands in `unchecked`
/// (or `problems`), with the devices marked unchecked.
/// The devices' reports from `given`, or from an observation of their headers (no PBKDF run).
pub(super) fn observe_devices(
    engine: &Engine,
    given: Option<&Observed>,
    f: &mut Findings,
) -> (Option<Observed>, Vec<DeviceReport>) {
    let plan = engine.plan();
    let mut devices: Vec<DeviceReport> = plan
        .devices
        .values()
        .map(|d| DeviceReport {
            id: d.id.clone(),
            path: d.path.display().to_string(),
            checked: false,
            drifted: false,
            drift: Vec::new(),
            header_damage: Vec::new(),
            header_write_in_progress: None,
            being_changed: None,
            retired_copies: Vec::new(),
            unmanaged: None,
        })
        .collect();
    let diff_plan = no_rotation_due(plan);
    let world = engine.world();
    let obs = match given {
        Some(o) => o.clone(),
        None => match observe::observe(&diff_plan, world, Testing::HeadersOnly) {
            Ok(o) => o,
            Err(e) => {
                observation_failed(e, f);
                return (None, devices);
            }
        },
    };
    // Devices that cannot be used: drift of their own, with what to do; the rest is observed.
    for (id, u) in &obs.unavailable {
        if let Some(d) = devices.iter_mut().find(|d| d.id == *id) {
            d.checked = true;
            d.drift.push(DriftReport {
                keyslot: None,
                kind: DriftKind::Unreadable,
                detail: format!("{}; {}", u.why, u.help),
            });
        }
    }
    record_drift(&obs, &mut devices);
    match diff::diff(&diff_plan, &obs, &DiffOptions::default()) {
        Err(refusals) => {
            for r in refusals {
                let dev = r.device.as_deref().and_then(|id| {
                    let why = untested_adoption(&obs, id)?;
                    Some((devices.iter_mut().find(|d| d.id == id)?, why))
                });
                match dev {
                    // Status runs no PBKDF, so it cannot tell an adoption from a refusal.
                    Some((dev, why)) => dev.drift.push(DriftReport {
                        keyslot: None,
                        kind: DriftKind::KeyMissing,
                        detail: why,
                    }),
                    None => f
                        .problems
                        .push(format!("`keyplan apply` could not proceed: {r}")),
                }
            }
        }
        Ok(d) => {
            planned_drift(plan, &obs, &d, &mut devices);
            set_unmanaged(&mut devices, d.unmanaged);
        }
    }
    if devices.iter().all(|d| d.unmanaged.is_none()) {
        // The diff refused: what the headers show, every keyslot left as it is.
        set_unmanaged(
            &mut devices,
            crate::diff::unmanaged::unmanaged(plan, obs.devices.values(), &[]),
        );
    }
    (Some(obs), devices)
}

/// Gives each observed device of `devices` its entry of `unmanaged` (an empty one when it has
/// none).
fn set_unmanaged(
    devices: &mut [DeviceReport],
    unmanaged: Vec<crate::diff::unmanaged::DeviceUnmanaged>,
) {
    for d in devices.iter_mut().filter(|d| d.checked) {
        d.unmanaged = Some(
            unmanaged
                .iter()
                .find(|u| u.device == d.id)
                .cloned()
                .unwrap_or_else(|| crate::diff::unmanaged::DeviceUnmanaged {
                    device: d.id.clone(),
                    keyslots: Vec::new(),
                    tokens: Vec::new(),
                }),
        );
    }
}

/// Files what stopped the observation of the devices: what is wrong (a device listed twice, a
/// pinned keyslot out of range, corrupt records) as problems, what could not be looked at (a
/// KMS that cannot be read) as unchecked.
fn observation_failed(findings: Vec<crate::finding::Finding>, f: &mut Findings) {
    use crate::finding::FindingKind;
    let line = |m: &str| format!("devices could not be checked for drift: {}", first_line(m));
    for x in findings {
        match x.kind {
            FindingKind::Wrong => f.problems.push(line(&x.message)),
            FindingKind::Unreachable => f.not_observed.push(x.message),
        }
    }
}

/// Marks the observed devices checked and reports their records that drift made stale.
fn record_drift(obs: &Observed, devices: &mut [DeviceReport]) {
    for (id, st) in &obs.devices {
        let Some(d) = devices.iter_mut().find(|d| d.id == *id) else {
            continue;
        };
        d.checked = true;
        for r in &st.records {
            let kind = match r.status {
                RecordStatus::Valid => continue,
                RecordStatus::KeyslotGone => DriftKind::KeyslotGone,
                RecordStatus::Rewritten => DriftKind::KeyslotRewritten,
                RecordStatus::FailedVerify => DriftKind::Other,
            };
            let detail = match kind {
                DriftKind::KeyslotGone => format!(
                    "keyslot {} was removed outside keyplan; it held {} v{}",
                    r.slot, r.record.key, r.record.version
                ),
                _ => format!(
                    "keyslot {} was rewritten outside keyplan (a new salt or KDF); `keyplan plan` tests whether it still holds {} v{} (one PBKDF run) and keeps managing it if so",
                    r.slot, r.record.key, r.record.version
                ),
            };
            d.drift.push(DriftReport {
                keyslot: Some(r.slot),
                kind,
                detail,
            });
        }
    }
}

/// Classifies the keyslot changes of the no-rotation diff `d` that key-level work does not
/// explain as drift of their device.
fn planned_drift(plan: &Plan, obs: &Observed, d: &diff::Diff, devices: &mut [DeviceReport]) {
    let key_work: BTreeSet<&str> = d.keys.iter().map(|k| k.key.as_str()).collect();
    for (i, c) in d.slots.iter().enumerate() {
        if c.reason_code == diff::ReasonCode::KeyRenamed {
            if let Some(dev) = devices.iter_mut().find(|x| x.id == c.device) {
                dev.drift.push(DriftReport {
                    keyslot: Some(c.slot),
                    kind: DriftKind::KeyRenamed,
                    detail: format!(
                        "`keyplan apply` would rewrite the record of keyslot {}: {}",
                        c.slot, c.reason
                    ),
                });
            }
            continue;
        }
        if c.action == SlotAction::Drift {
            continue; // reported from the records
        }
        if c.key.as_deref().is_some_and(|k| key_work.contains(k)) {
            continue; // explained by key-level work `keyplan plan` shows
        }
        let Some(dev) = devices.iter_mut().find(|x| x.id == c.device) else {
            continue;
        };
        if c.reason_code == diff::ReasonCode::PbkdfRewrap {
            // One finding per re-wrapped keyslot: the kill of the old keyslot names it (the
            // add beside it is the same fact, and a temporary keyslot, added before it is
            // killed, is no finding).
            let temporary = d.slots[..i]
                .iter()
                .any(|o| o.device == c.device && o.slot == c.slot && o.action == SlotAction::Add);
            if let (SlotAction::Remove, Some(k), Some(v), false) =
                (c.action, &c.key, c.version, temporary)
            {
                dev.drift.push(DriftReport {
                    keyslot: Some(c.slot),
                    kind: DriftKind::Pbkdf,
                    detail: format!(
                        "`keyplan apply` would re-wrap keyslot {} ({k} v{v}) {}",
                        c.slot,
                        c.reason
                            .strip_prefix("re-wrap: ")
                            .map(|r| format!("for the plan's PBKDF: {r}"))
                            .or_else(|| c.reason.strip_prefix("re-wrap ").map(str::to_string))
                            .unwrap_or_else(|| c.reason.clone())
                    ),
                });
            }
            continue;
        }
        let listed = plan
            .devices
            .get(&c.device)
            .is_some_and(|pd| pd.keys.iter().any(|k| Some(&k.key) == c.key.as_ref()));
        let holds_other = |key: &str| {
            obs.devices
                .get(&c.device)
                .is_some_and(|st| st.slots_of(key).iter().any(|(_, v)| Some(*v) != c.version))
        };
        let kind = match (c.action, c.key.as_deref()) {
            (SlotAction::Add, Some(k)) if holds_other(k) => DriftKind::StaleVersion,
            (SlotAction::Add, Some(_)) => DriftKind::KeyMissing,
            (SlotAction::Remove, None) => DriftKind::UnmanagedKeyslot,
            (SlotAction::Remove, Some(_)) if !listed => DriftKind::KeyNotListed,
            (SlotAction::Remove, Some(_)) => DriftKind::StaleVersion,
            _ => DriftKind::Other,
        };
        let (keyslot, what) = match (c.action, &c.key, c.version) {
            (SlotAction::Add, Some(k), Some(v)) => {
                (None, format!("would add {k} v{v} in keyslot {}", c.slot))
            }
            (SlotAction::Remove, Some(k), Some(v)) => (
                Some(c.slot),
                format!("would remove keyslot {} ({k} v{v})", c.slot),
            ),
            _ => (Some(c.slot), format!("would change keyslot {}", c.slot)),
        };
        dev.drift.push(DriftReport {
            keyslot,
            kind,
            detail: format!("`keyplan apply` {what}: {}", c.reason),
        });
    }
}

/// Why device `id` may be waiting to be adopted: a key it lists has a KMS current version no
/// record on it holds, and keyslots no record names may hold that version (what `plan` tests
/// with one PBKDF run per keyslot, and `status` does not: [`observe::Untested`]). `None` when
/// no keyslot could be adopted (then the planner's refusal stands).
fn untested_adoption(obs: &Observed, id: &str) -> Option<String> {
    let u = obs.devices.get(id)?.adoption_untested.as_ref()?;
    let slots: Vec<String> = u.slots.iter().map(u32::to_string).collect();
    Some(format!(
        "{} v{} is recorded in no keyslot, and keyslot {} (not made by keyplan) may hold it: `keyplan plan` tests that (status runs no PBKDF) and plans the adoption, or says why not",
        u.key,
        u.version,
        slots.join(", ")
    ))
}
