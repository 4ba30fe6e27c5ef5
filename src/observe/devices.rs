//! Reading and judging the plan's devices: header, records, writability, and the checks that
//! need the header (UUID, duplicates, pinned keyslots in range).

use std::collections::BTreeMap;
use std::path::Path;

use super::{device_path, observe_workers, DeviceState};
use crate::error::Finding;
use crate::luks::{Header, LuksError};
use crate::spec::{Device, PathSeg, Plan};
use crate::world::{RecordError, RecordObs, World};

/// What one device read gave: the header, the records, and why it cannot be written.
type Read = (
    Result<Header, LuksError>,
    Option<Result<Vec<RecordObs>, RecordError>>,
    Option<String>,
);

/// Reads every plan device (on several threads; judged in plan order, so the outcome and the
/// order of findings do not depend on timing). Returns the devices that could be read and
/// judged, and every LUKS UUID seen (lower case) with its device id; problems land in
/// `findings`.
pub(super) fn read(
    plan: &Plan,
    world: &World,
    findings: &mut Vec<Finding>,
) -> (BTreeMap<String, DeviceState>, BTreeMap<String, String>) {
    // Reading headers is one or two cryptsetup processes per device (a few ms each, no PBKDF).
    let listed: Vec<&Device> = plan.devices.values().collect();
    let reads = crate::par::map(&listed, observe_workers(world, listed.len()), |dev| {
        let header = world.luks.dump(&dev.path);
        let records = header.as_ref().ok().map(|h| world.records.read(h));
        let read_only = header.as_ref().ok().and_then(|_| cannot_write(&dev.path));
        (header, records, read_only)
    });
    let mut devices = BTreeMap::new();
    let mut uuids: BTreeMap<String, String> = BTreeMap::new();
    for (dev, read) in listed.into_iter().zip(reads) {
        if let Some(st) = judge(dev, read, &mut uuids, findings) {
            devices.insert(dev.id.clone(), st);
        }
    }
    (devices, uuids)
}

/// Judges one device's read: `None` (with findings) when it cannot be used.
fn judge(
    dev: &Device,
    (header, records, read_only): Read,
    uuids: &mut BTreeMap<String, String>,
    findings: &mut Vec<Finding>,
) -> Option<DeviceState> {
    let id = &dev.id;
    let at = |field: &str| {
        let mut p = device_path(id);
        p.push(PathSeg::Key(field.into()));
        p
    };
    let header = match header {
        Ok(h) => h,
        Err(e) => {
            let (message, help) = dump_error(id, &e);
            findings.push(Finding::at(at("path"), message, Some(help)));
            return None;
        }
    };
    if let Some(want) = &dev.uuid {
        if !want.eq_ignore_ascii_case(&header.uuid) {
            findings.push(Finding::at(
                at("uuid"),
                format!(
                    "device {id} ({}) has LUKS UUID {}, not {want}: refusing to touch it",
                    dev.path.display(),
                    header.uuid
                ),
                Some("is the path pointing at the wrong disk? fix `path` or `uuid`".into()),
            ));
            return None;
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
        return None;
    }
    pins_in_range(dev, &header, findings);
    let records = match records {
        Some(Ok(r)) => r,
        Some(Err(e)) => {
            findings.push(Finding::bare(format!("device {id}: {e}"), None));
            return None;
        }
        None => return None,
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
    Some(st)
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
