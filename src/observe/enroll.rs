//! Testing a device's `enroll_with` passphrase at plan time, so that a wrong one is refused
//! before any key version is staged (docs/architecture.md, "Refuse at plan time what apply
//! could not finish").
//!
//! Costs one PBKDF run when the passphrase opens a bound keyslot of normal priority, one more
//! per `ignore`-priority bound keyslot tried (cryptsetup skips those unless named with
//! `--key-slot`, cryptsetup-config(8)), and, only when it fails, one per unbound keyslot (to
//! say whether it opens only an unbound one).

use std::collections::BTreeMap;
use std::path::Path;

use super::{DeviceState, Origin};
use crate::kms::{KeyState, VersionState};
use crate::luks::{AnyKeyslot, LuksError, Priority};
use crate::secret::Passphrase;
use crate::spec::{Device, PathSeg, Plan};
use crate::world::{RecordStatus, World};

/// What an `enroll_with` file is, from its metadata alone (`stat(2)`; nothing is read).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EnrollFile {
    /// A regular file of 1 byte to [`crate::luks::MAX_KEYFILE_BYTES`] (8 MiB): it may hold the
    /// passphrase.
    Passphrase,
    /// A regular file longer than cryptsetup reads from a key file.
    TooLong {
        /// Its size in bytes.
        bytes: u64,
    },
    /// An empty regular file.
    Empty,
    /// Not a regular file.
    NotRegular {
        /// `a directory`, or `not a regular file (a device, FIFO or socket)`.
        kind: String,
    },
    /// It cannot be examined (missing, no permission).
    Unreadable {
        /// The OS error.
        error: String,
    },
}

/// Examines the `enroll_with` file at `path` (metadata only).
pub(crate) fn examine(path: &Path) -> EnrollFile {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() > crate::luks::MAX_KEYFILE_BYTES => {
            EnrollFile::TooLong { bytes: m.len() }
        }
        Ok(m) if m.is_file() && m.len() > 0 => EnrollFile::Passphrase,
        Ok(m) if m.is_file() => EnrollFile::Empty,
        Ok(m) if m.is_dir() => EnrollFile::NotRegular {
            kind: "a directory".into(),
        },
        Ok(_) => EnrollFile::NotRegular {
            kind: "not a regular file (a device, FIFO or socket)".into(),
        },
        Err(e) => EnrollFile::Unreadable {
            error: e.to_string(),
        },
    }
}

/// How messages name device `id`: `device ID (PATH, enroll_with at PLAN:LINE:COL)`.
pub(super) fn device_here(plan: &Plan, id: &str, st: &DeviceState) -> String {
    match plan.location_of(&[
        PathSeg::Key("devices".into()),
        PathSeg::Key(id.to_string()),
        PathSeg::Key("enroll_with".into()),
    ]) {
        Some((line, col)) => format!(
            "device {id} ({}, enroll_with at {}:{line}:{col})",
            st.path.display(),
            plan.source_path.display()
        ),
        None => format!("device {id} ({})", st.path.display()),
    }
}

/// Tests the `enroll_with` passphrase of `dev` when enrolling will need it; `here` names the
/// device in messages. Returns the problem, or `None` (passphrase fine, or not needed, or the
/// file missing, empty or too long: the planner reports those without a PBKDF run). Sets
/// `st.enroll_with_keyslot` to the keyslot it opens, when known.
pub(super) fn check(
    world: &World,
    dev: &Device,
    st: &mut DeviceState,
    keys: &BTreeMap<String, KeyState>,
    origins: &BTreeMap<String, Vec<Origin>>,
    here: &str,
) -> Option<String> {
    let file = dev.enroll_with.as_ref()?;
    if dev.keys.is_empty() || !st.adoptable.is_empty() || has_way_in(dev, st, keys, origins) {
        return None;
    }
    let bytes = match std::fs::metadata(file) {
        Ok(m) if m.is_file() && m.len() > 0 && m.len() <= crate::luks::MAX_KEYFILE_BYTES => {
            std::fs::read(file).ok()?
        }
        _ => return None,
    };
    let pass = Passphrase::new(bytes);
    let shown = file.display().to_string();
    let failed = |e: LuksError| -> String {
        format!("{here}: testing the enroll_with passphrase in {shown} failed: {e}")
    };
    match world.luks.test_any_keyslot(&st.path, &pass).map_err(failed) {
        Ok(AnyKeyslot::Keyslot(n)) => {
            st.enroll_with_keyslot = Some(n);
            return None;
        }
        Ok(AnyKeyslot::Unknown) => return None,
        Ok(AnyKeyslot::Fails) => {}
        Err(m) => return Some(m),
    }
    let ignored: Vec<u32> = st
        .header
        .keyslots
        .iter()
        .filter(|(_, k)| k.bound && k.priority == Priority::Ignore)
        .map(|(n, _)| *n)
        .collect();
    for n in ignored {
        match world
            .luks
            .test_passphrase(&st.path, n, &pass)
            .map_err(failed)
        {
            Ok(true) => {
                st.enroll_with_keyslot = Some(n);
                return None;
            }
            Ok(false) => {}
            Err(m) => return Some(m),
        }
    }
    Some(opens_nothing(world, st, &pass, here, &shown))
}

/// True when a keyslot keyplan recorded opens the device with a version the KMS has: the
/// current version of a key the device lists, the current version of a moved key in the KMS it
/// moves from, or any `previous` version. Then enrolling needs no `enroll_with`.
fn has_way_in(
    dev: &Device,
    st: &DeviceState,
    keys: &BTreeMap<String, KeyState>,
    origins: &BTreeMap<String, Vec<Origin>>,
) -> bool {
    st.records
        .iter()
        .filter(|r| r.status == RecordStatus::Valid)
        .any(|r| {
            let Some(k) = keys.get(&r.record.key) else {
                return false;
            };
            let listed = dev.keys.iter().any(|dk| dk.key == r.record.key);
            let moved = origins.get(&r.record.key).is_some_and(|os| {
                os.iter().any(|o| {
                    r.record.entry.as_ref() == Some(&(o.kms.clone(), o.name.clone()))
                        && o.state.as_ref().and_then(|s| s.current) == Some(r.record.version)
                })
            });
            moved
                || (listed && k.current == Some(r.record.version))
                || k.versions
                    .get(&r.record.version)
                    .is_some_and(|v| v.state == VersionState::Previous)
        })
}

/// The problem of a passphrase that opens no bound keyslot: it opens only an unbound one
/// (tested, one PBKDF run per unbound keyslot), the device has no bound keyslot, or it opens
/// none.
fn opens_nothing(
    world: &World,
    st: &DeviceState,
    pass: &Passphrase,
    here: &str,
    shown: &str,
) -> String {
    let path = &st.path;
    let bound: Vec<u32> = st
        .header
        .keyslots
        .iter()
        .filter(|(_, k)| k.bound)
        .map(|(n, _)| *n)
        .collect();
    let list = |v: &[u32]| {
        v.iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let check = format!(
        "`cryptsetup open --test-passphrase --key-file {shown} {}` must succeed",
        path.display()
    );
    for (n, _) in st.header.keyslots.iter().filter(|(_, k)| !k.bound) {
        if let Ok(true) = world.luks.test_passphrase(path, *n, pass) {
            return format!(
                "{here}: the enroll_with passphrase in {shown} opens only keyslot {n}, which is unbound (not assigned to the data segment: it cannot open the data), so it cannot enroll a key; nothing was changed and no key version was staged. Point enroll_with at the passphrase of a bound keyslot ({}); {check}",
                if bound.is_empty() { "there is none".to_owned() } else { format!("keyslot {}", list(&bound)) }
            );
        }
    }
    if bound.is_empty() {
        format!(
            "{here}: the device has no bound keyslot at all, so the enroll_with passphrase in {shown} cannot enroll a key; nothing was changed and no key version was staged. Restore the header from a backup"
        )
    } else {
        format!(
            "{here}: the enroll_with passphrase in {shown} opens none of its bound keyslots (keyslot {}); keyplan uses the file's bytes exactly, so a trailing newline counts. Nothing was changed and no key version was staged. Put the passphrase that opens the device today in {shown}: {check}",
            list(&bound)
        )
    }
}
