//! `device forget`: the state directory stops remembering a device that left the plan for
//! good, so the key versions it may hold are no longer kept for it (docs/operations.md,
//! "Where keyplan keeps its records"). Before: editing `<state_dir>/devices.json` by hand.

use super::Engine;
use crate::error::Error;
use crate::world::{registry, RegistryEntry};

/// What `device forget` removed: `(LUKS UUID, entry)` per device.
pub type Forgotten = Vec<(String, RegistryEntry)>;

/// Removes device `id` from the registry of the engine's state directory (under the state
/// lock: no run is going on): every entry with that id, or only the one of LUKS UUID `uuid`.
/// A device the plan lists at the same path is refused (it is not gone: take it out of the
/// plan first), and so is one present now with the same LUKS UUID unless `even_if_present`
/// (its keyslots still open with the versions it holds, and the next rotation may retire
/// them: it then opens with no key the KMS holds).
///
/// Errors: [`Error::Request`] saying which rule refused and what to do; [`Error::Journal`]
/// when a run holds the state lock; [`Error::Registry`] when the registry is corrupt or
/// cannot be written.
pub fn forget(
    engine: &Engine,
    id: &str,
    uuid: Option<&str>,
    even_if_present: bool,
) -> Result<Forgotten, Error> {
    let plan = engine.plan();
    let _lock = crate::journal::StateLock::acquire(&plan.state_dir)?;
    let reg = registry::read(&plan.state_dir)?;
    let file = plan.state_dir.join(registry::REGISTRY_FILE);
    let matches: Vec<(&String, &RegistryEntry)> = reg
        .devices
        .iter()
        .filter(|(u, e)| e.id == id && uuid.is_none_or(|x| x.eq_ignore_ascii_case(u)))
        .collect();
    if matches.is_empty() {
        let mut known: Vec<String> = reg
            .devices
            .iter()
            .map(|(u, e)| format!("{} ({}, LUKS UUID {u})", e.id, e.path.display()))
            .collect();
        known.sort();
        return Err(Error::request(
            format!(
                "{} remembers no device {id:?}{}; nothing was changed",
                file.display(),
                uuid.map(|u| format!(" with LUKS UUID {u}"))
                    .unwrap_or_default()
            ),
            Some(if known.is_empty() {
                "it remembers no device at all".to_string()
            } else {
                format!("it remembers: {}", known.join("; "))
            }),
        ));
    }
    if uuid.is_none() && matches.len() > 1 {
        return Err(Error::request(
            format!(
                "{} remembers {} devices with id {id:?}: {}; nothing was changed",
                file.display(),
                matches.len(),
                matches
                    .iter()
                    .map(|(u, e)| format!("LUKS UUID {u} at {}", e.path.display()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Some("name the one to forget with --uuid".into()),
        ));
    }
    for (u, e) in &matches {
        if plan.devices.get(id).is_some_and(|d| d.path == e.path) {
            return Err(Error::request(
                format!(
                    "device {id} ({}) is in the plan file {}: it has not left; nothing was changed",
                    e.path.display(),
                    plan.source_path.display()
                ),
                Some("take it out of the plan file first (keyplan then keeps the key versions it holds while it is present), and forget it once it is gone for good".into()),
            ));
        }
        if !even_if_present {
            if let Ok(h) = engine.world().luks.dump(&e.path) {
                if h.uuid.eq_ignore_ascii_case(u) {
                    return Err(Error::request(
                        format!(
                            "device {id} is still present at {} (LUKS UUID {u}): its keyslots may hold key versions keyplan keeps for it; nothing was changed",
                            e.path.display()
                        ),
                        Some("wipe or remove the device first (`cryptsetup erase`), or pass --even-if-present: the next rotation may then retire the versions it holds, and no key in the KMS opens it any more".into()),
                    ));
                }
            }
        }
    }
    let uuids: Vec<String> = matches.iter().map(|(u, _)| (*u).clone()).collect();
    Ok(registry::remove(&plan.state_dir, &uuids)?)
}
