//! How a device is opened to add a keyslot: through a keyslot keyplan recorded (the key's own
//! current version, another listed key's, a retained `previous` version), or through the
//! device's `enroll_with` passphrase file.

use super::Planner;
use crate::graph::{Unlock, VersionRef};
use crate::kms::VersionState;
use crate::observe::EnrollFile;
use crate::world::RecordStatus;

impl Planner<'_> {
    /// How to open `device` to add a keyslot of `key` whose current version is `current`:
    /// the key's own current keyslot, another listed key's current keyslot, a keyslot holding a
    /// version the KMS still keeps as `previous`, or the `enroll_with` file. Refuses (and
    /// returns `None`) when there is no way in, or the `enroll_with` file cannot be used.
    pub(super) fn unlock(
        &mut self,
        device: &str,
        key: &str,
        current: Option<u64>,
    ) -> Option<Unlock> {
        let st = self.state(device)?;
        if let Some(c) = current {
            if let Some((slot, _)) = st.slots_of(key).into_iter().find(|(_, v)| *v == c) {
                return Some(Unlock::Key {
                    key: key.to_string(),
                    version: VersionRef::Version(c),
                    slot,
                });
            }
        }
        let dev = self.plan.devices.get(device)?;
        for other in dev.keys.iter().filter(|k| k.key != key) {
            let Some(oc) = self.obs.keys.get(&other.key).and_then(|k| k.current) else {
                continue;
            };
            if let Some((slot, _)) = st.slots_of(&other.key).into_iter().find(|(_, v)| *v == oc) {
                return Some(Unlock::Key {
                    key: other.key.clone(),
                    version: VersionRef::Version(oc),
                    slot,
                });
            }
        }
        // A keyslot holding a version the KMS still keeps (`previous`): e.g. a device that was
        // out of the plan, or offline, during a rotation, or whose header was restored.
        for r in st
            .records
            .iter()
            .filter(|r| r.status == RecordStatus::Valid)
        {
            let kept = self
                .obs
                .keys
                .get(&r.record.key)
                .and_then(|k| k.versions.get(&r.record.version))
                .is_some_and(|v| v.state == VersionState::Previous);
            if kept {
                return Some(Unlock::Key {
                    key: r.record.key.clone(),
                    version: VersionRef::Version(r.record.version),
                    slot: r.slot,
                });
            }
        }
        if dev.enroll_with.is_some() {
            return self.enroll_with(device);
        }
        let lost = self.lost_records(device);
        let message = format!(
            "{}: keyplan holds no key that opens it{lost}, so it cannot enroll {key}; nothing was changed. Set `enroll_with:` to a file holding a passphrase that opens the device today, or, when that passphrase is to be {key}'s first version, import it into the KMS: `keyplan key import {key} < FILE`",
            self.at(device)
        );
        self.refuse_device(device, message);
        None
    }

    /// The device's `enroll_with` file as the way in, when observing found it usable: checked
    /// now (its size as observed; the passphrase itself was tested by observe when enrolling
    /// needs it) so that a bad file stops the run before anything is staged in the KMS.
    fn enroll_with(&mut self, device: &str) -> Option<Unlock> {
        let st = self.state(device)?;
        let file = self
            .plan
            .devices
            .get(device)
            .and_then(|d| d.enroll_with.as_ref())?
            .display()
            .to_string();
        let here = self.at(device);
        let point =
            "Point enroll_with at the file holding a passphrase that opens the device today";
        let message = match &st.enroll_with_file {
            Some(EnrollFile::Passphrase) => match &st.enroll_with_problem {
                None => return Some(Unlock::EnrollWith),
                Some(p) => {
                    let lost = self.lost_records(device);
                    if lost.is_empty() {
                        p.clone()
                    } else {
                        format!("{p}. keyplan's own keyslots cannot be used either{lost}")
                    }
                }
            },
            Some(EnrollFile::TooLong { bytes }) => format!(
                "{here}: enroll_with file {file} is {bytes} bytes; cryptsetup reads at most {} bytes (8 MiB) from a key file (cryptsetup(8), --keyfile-size), so it cannot hold the passphrase. Nothing was changed. {point}",
                crate::luks::MAX_KEYFILE_BYTES
            ),
            Some(EnrollFile::Empty) => format!(
                "{here}: enroll_with file {file} is empty; it must hold a passphrase that opens the device today. Nothing was changed"
            ),
            Some(EnrollFile::NotRegular { kind }) => {
                format!("{here}: enroll_with {file} is {kind}. Nothing was changed. {point}")
            }
            Some(EnrollFile::Unreadable { error }) => format!(
                "{here}: cannot read enroll_with file {file}: {error}. Nothing was changed. {point}"
            ),
            None => format!(
                "{here}: enroll_with file {file} was not examined. Nothing was changed. {point}"
            ),
        };
        self.refuse_device(device, message);
        None
    }
}
