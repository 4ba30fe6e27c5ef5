//! Reading and judging the plan's devices: header, records, writability, and the checks that
//! need the header (UUID, duplicates, pinned keyslots in range); devices that cannot be used
//! now ([`Unavailable`]).

use std::collections::BTreeMap;
use std::path::Path;

use super::{device_path, observe_workers, DeviceState};
use crate::finding::Finding;
use crate::luks::{Header, LuksError};
use crate::spec::{Device, PathSeg, Plan};
use crate::world::{RecordError, RecordObs, World};

/// What one device read gave: the header, the records, and why it cannot be written.
type DeviceRead = (
    Result<Header, LuksError>,
    Option<Result<Vec<RecordObs>, RecordError>>,
    Option<String>,
);

/// What [`read`] found: the devices that could be read and judged, the devices that cannot be
/// used (gone, unreadable, not LUKS, another LUKS UUID than the plan's), and every LUKS UUID
/// seen (lower case) with its device id.
pub(super) struct Read {
    pub devices: BTreeMap<String, DeviceState>,
    pub unavailable: BTreeMap<String, Unavailable>,
    pub uuids: BTreeMap<String, String>,
}

/// Reads every plan device (on several threads; judged in plan order, so the outcome and the
/// order of findings do not depend on timing). A device that cannot be used is
/// [`Unavailable`]: the rest of the plan goes on without it. Problems of the plan itself (a
/// device listed twice, a pinned keyslot out of range, corrupt records) land in `findings`.
pub(super) fn read(plan: &Plan, world: &World, findings: &mut Vec<Finding>) -> Read {
    // Reading headers is one or two cryptsetup processes per device (a few ms each, no PBKDF).
    let listed: Vec<&Device> = plan.devices.values().collect();
    let reads = crate::par::map(&listed, observe_workers(world, listed.len()), |dev| {
        let header = world.luks.dump(&dev.path);
        let records = header.as_ref().ok().map(|h| world.records.read(h));
        let read_only = header.as_ref().ok().and_then(|_| cannot_write(&dev.path));
        (header, records, read_only)
    });
    let mut out = Read {
        devices: BTreeMap::new(),
        unavailable: BTreeMap::new(),
        uuids: BTreeMap::new(),
    };
    for (dev, read) in listed.into_iter().zip(reads) {
        match judge(dev, read, &mut out.uuids, findings) {
            Judged::Usable(st) => {
                out.devices.insert(dev.id.clone(), *st);
            }
            Judged::Unavailable(mut u, field) => {
                let at = [
                    PathSeg::Key("devices".into()),
                    PathSeg::Key(dev.id.clone()),
                    PathSeg::Key(field.into()),
                ];
                u.at = plan
                    .location_of(&at)
                    .map(|(line, col)| format!("{}:{line}:{col}", plan.source_path.display()));
                tracing::info!(device = %dev.id, "device cannot be used, the plan goes on without it: {}", u.why);
                out.unavailable.insert(dev.id.clone(), u);
            }
            Judged::Wrong => {}
        }
    }
    out
}

/// A device of the plan that cannot be used now: gone (a dead or pulled disk, a wrong path),
/// unreadable (I/O errors, both LUKS2 header copies damaged), not a LUKS container (a blank
/// replacement disk), or a LUKS container with another UUID than the plan's. keyplan never
/// touches it; every change that does not involve it goes ahead; a key it lists is neither
/// created nor rotated until it is back or out of the plan (its devices' commit needs it), and
/// no key version is destroyed meanwhile (it may hold one).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Unavailable {
    /// The device path from the plan.
    pub path: std::path::PathBuf,
    /// Why it cannot be used (cryptsetup's or keyplan's words; no key material).
    pub why: String,
    /// What to do about it.
    pub help: String,
    /// Where in the plan file the device's failing field is (`keyplan.yaml:7:14`: its `path`,
    /// or its `uuid` when the LUKS UUID differs), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// How [`judge`] found one device.
enum Judged {
    /// Read and judged.
    Usable(Box<DeviceState>),
    /// Cannot be used now (see [`Unavailable`]), and the device's field in the plan file it is
    /// about (`path` or `uuid`).
    Unavailable(Unavailable, &'static str),
    /// A problem of the plan or the state directory (a finding was filed).
    Wrong,
}

/// Judges one device's read.
fn judge(
    dev: &Device,
    (header, records, read_only): DeviceRead,
    uuids: &mut BTreeMap<String, String>,
    findings: &mut Vec<Finding>,
) -> Judged {
    let id = &dev.id;
    let gone = |why: String, fix: &str, field: &'static str| {
        Judged::Unavailable(
            Unavailable {
                path: dev.path.clone(),
                why,
                help: format!(
                    "{fix}; if the disk failed, replace it and enroll the new one (`enroll_with`), or take device {id} out of the plan. Until then keyplan leaves it alone, rotates no key it lists and destroys no key version"
                ),
                at: None,
            },
            field,
        )
    };
    let header = match header {
        Ok(h) => h,
        Err(e) => {
            let (message, help) = dump_error(id, &e);
            return gone(message, &help, "path");
        }
    };
    if let Some(want) = &dev.uuid {
        if !want.eq_ignore_ascii_case(&header.uuid) {
            return gone(
                format!(
                    "device {id} ({}) has LUKS UUID {}, not {want}: refusing to touch it",
                    dev.path.display(),
                    header.uuid
                ),
                "is the path pointing at the wrong disk (a replaced disk)? fix `path` or `uuid`",
                "uuid",
            );
        }
    }
    if let Some(other) = uuids.insert(header.uuid.to_lowercase(), id.clone()) {
        findings.push(Finding::at(
            device_path(id),
            format!(
                "devices {other} and {id} are the same LUKS device (UUID {})",
                header.uuid
            ),
            Some("list each device once".into()),
        ));
        return Judged::Wrong;
    }
    pins_in_range(dev, &header, findings);
    let records = match records {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            let e = e.on_device(id);
            let message = if e.names_device() {
                e.to_string()
            } else {
                format!("device {id}: {e}")
            };
            findings.push(Finding::bare(message, None));
            return Judged::Wrong;
        }
        None => return Judged::Wrong,
    };
    tracing::debug!(
        device = %id,
        "{} {}: {} keyslots, {} keyplan records",
        header.version,
        header.uuid,
        header.keyslots.len(),
        records.len()
    );
    let mut st = DeviceState::new(id, dev.path.clone(), header, records);
    st.read_only = read_only;
    st.enroll_with_file = dev.enroll_with.as_deref().map(super::enroll::examine);
    Judged::Usable(Box::new(st))
}

/// A finding for every keyslot `dev` pins that its LUKS version does not have (LUKS1: 0-7).
fn pins_in_range(dev: &Device, header: &Header, findings: &mut Vec<Finding>) {
    let max = header.version.max_keyslots();
    for (i, k) in dev.keys.iter().enumerate() {
        let Some(slot) = k.keyslot.filter(|s| *s >= max) else {
            continue;
        };
        let mut at = device_path(&dev.id);
        at.extend([
            PathSeg::Key("keys".into()),
            PathSeg::Index(i),
            PathSeg::Key("keyslot".into()),
        ]);
        findings.push(Finding::at(
            at,
            format!(
                "keyslot {slot} is out of range: device {} is {} with keyslots 0-{}",
                dev.id,
                header.version,
                max - 1
            ),
            Some(format!("pin a keyslot between 0 and {}", max - 1)),
        ));
    }
}

/// The message and help for a device whose header cannot be read.
pub(crate) fn dump_error(id: &str, e: &LuksError) -> (String, String) {
    match e {
        LuksError::Device { path, message } => (
            format!("device {id}: {} {message}", path.display()),
            "correct `path` so it names the LUKS block device or image file (e.g. a /dev/disk/by-partuuid/... link); keyplan changed nothing".to_owned(),
        ),
        LuksError::NotLuks { path } => (
            format!("device {id}: {e}"),
            format!(
                "check `path`: it must name a LUKS1 or LUKS2 container (`cryptsetup isLuks {}` must succeed); keyplan never formats a device",
                path.display()
            ),
        ),
        _ => (
            format!("device {id}: {e}"),
            "check the device and cryptsetup; keyplan changed nothing".to_owned(),
        ),
    }
}

/// Why `path` cannot be written, or `None` when it can. Opens a regular file for writing
/// (writing nothing) and asks sysfs whether a block device is read-only.
fn cannot_write(path: &Path) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path).ok()?;
    if m.file_type().is_block_device() {
        let rdev = m.rdev();
        let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
        let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
        let ro = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/ro")).ok()?;
        return (ro.trim() == "1").then(|| {
            "the block device is read-only (`blockdev --getro` says 1; `blockdev --setrw` makes it writable)".to_owned()
        });
    }
    match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(_) => None,
        Err(e) => Some(format!(
            "it cannot be opened for writing: {e} (an immutable file, see `lsattr` and `chattr -i`; a read-only filesystem; or no write permission for this user)"
        )),
    }
}
