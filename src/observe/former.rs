//! Devices the registry remembers that are no longer in the plan: read (never written) when
//! present with the same LUKS UUID, otherwise listed as unreadable, which keeps every key
//! version (docs/architecture.md, "Retention").

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{observe_workers, DeviceState};
use crate::finding::Finding;
use crate::spec::Plan;
use crate::world::{registry, RegistryEntry, World};

/// Former devices that could be read, and those that could not: `(former id, path, why)`.
type Former = (
    BTreeMap<String, DeviceState>,
    Vec<(String, PathBuf, String)>,
);

/// Reads the registry's devices whose LUKS UUID is not among `uuids` (the plan's devices),
/// on several threads like the plan's devices: a state directory remembers every device a run
/// touched, which can be many more than the plan lists. A plan device that cannot be used now
/// (`unavailable`) is not a former device when the registry remembers it at the same id and
/// path: it is reported once, as the plan's. A corrupt registry is a finding.
pub(super) fn read(
    plan: &Plan,
    world: &World,
    uuids: &BTreeMap<String, String>,
    unavailable: &BTreeMap<String, super::Unavailable>,
    findings: &mut Vec<Finding>,
) -> Former {
    let mut former = BTreeMap::new();
    let mut unreadable = Vec::new();
    let reg = match registry::read(&plan.state_dir) {
        Ok(reg) => reg,
        Err(e) => {
            let f = Finding::bare(e.to_string(), Some("keyplan changed nothing".into()));
            findings.push(match e {
                registry::RegistryError::Io { .. } => f.unreachable(),
                registry::RegistryError::Corrupt { .. } | registry::RegistryError::Newer(_) => f,
            });
            return (former, unreadable);
        }
    };
    let gone: Vec<(String, RegistryEntry)> = reg
        .devices
        .into_iter()
        .filter(|(uuid, _)| !uuids.contains_key(uuid))
        .filter(|(_, e)| unavailable.get(&e.id).is_none_or(|u| u.path != e.path))
        .collect();
    let reads = crate::par::map(
        &gone,
        observe_workers(world, gone.len()),
        |(uuid, entry)| match world.luks.dump(&entry.path) {
            Ok(h) if h.uuid.eq_ignore_ascii_case(uuid) => {
                let records = world.records.read(&h).map_err(|e| e.to_string());
                Ok((h, records))
            }
            Ok(h) => Err(format!(
                "it now holds another LUKS device (UUID {})",
                h.uuid
            )),
            Err(e) => Err(e.to_string()),
        },
    );
    for ((_, entry), read) in gone.into_iter().zip(reads) {
        let id = if plan.devices.contains_key(&entry.id) {
            format!("{} (formerly at {})", entry.id, entry.path.display())
        } else {
            entry.id.clone()
        };
        match read {
            Ok((header, Ok(records))) => {
                former.insert(
                    id.clone(),
                    DeviceState::new(&id, entry.path, header, records),
                );
            }
            Ok((_, Err(e))) | Err(e) => unreadable.push((id, entry.path, e)),
        }
    }
    (former, unreadable)
}
