//! `verify`: every enrolled key's current version opens a bound keyslot of each device that
//! lists it (one PBKDF run per key and device: `open --test-passphrase --key-slot N`).
//! Read-only.

use super::Engine;
use crate::error::Error;
use crate::observe::{self, Testing};

/// What one key on one device showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The current version opens this bound keyslot.
    Opens {
        /// The current version.
        version: u64,
        /// The keyslot.
        slot: u32,
    },
    /// The KMS has no current version of the key.
    NoCurrent,
    /// No keyslot is recorded for the current version.
    NotEnrolled {
        /// The current version.
        version: u64,
    },
    /// The current version opens the recorded keyslot, but it is not bound (opens nothing).
    Unbound {
        /// The current version.
        version: u64,
        /// The keyslot.
        slot: u32,
    },
    /// The current version does not open the recorded keyslot.
    DoesNotOpen {
        /// The current version.
        version: u64,
        /// The keyslot.
        slot: u32,
    },
    /// The keyslot could not be tested (e.g. the header copies disagree, so testing could
    /// make cryptsetup write): why, and what to do. The other devices are still checked.
    Untestable {
        /// The current version.
        version: u64,
        /// The keyslot.
        slot: u32,
        /// The cryptsetup driver's error.
        reason: String,
    },
    /// The device cannot be used now (gone, unreadable, not LUKS, another LUKS UUID:
    /// [`crate::observe::Unavailable`]); the other devices are still checked.
    DeviceUnavailable {
        /// Why, and what to do.
        reason: String,
    },
}

/// One key checked on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Device id.
    pub device: String,
    /// Key id.
    pub key: String,
    /// What it showed.
    pub outcome: Outcome,
}

impl Check {
    /// True unless the current version opens a bound keyslot.
    pub fn failed(&self) -> bool {
        !matches!(self.outcome, Outcome::Opens { .. })
    }
}

/// How a verify ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Checks that failed.
    pub failures: usize,
    /// PBKDF runs of the whole command (observing included).
    pub pbkdf_runs: u64,
}

/// Checks every key listed on every device, in plan order, calling `each` with every check as
/// it is made. Each KMS instance's calls together wait at most its `timeout`
/// ([`crate::world::World::bound_kms_waits`]); PBKDF runs do not count.
///
/// Errors: the observation failed ([`Error::Findings`]); a KMS call failed (the checks made
/// until then were reported). A keyslot cryptsetup could not test is a failed check
/// ([`Outcome::Untestable`]), and the other devices are still checked.
pub fn verify(engine: &Engine, each: &mut dyn FnMut(&Check)) -> Result<Summary, Error> {
    let (plan, world) = (engine.plan(), engine.world());
    world.bound_kms_waits();
    let observed = observe::observe(plan, world, Testing::Passphrases)?;
    let mut failures = 0usize;
    for dev in plan.devices.values() {
        if let Some(u) = observed.unavailable.get(&dev.id) {
            for k in &dev.keys {
                let check = Check {
                    device: dev.id.clone(),
                    key: k.key.clone(),
                    outcome: Outcome::DeviceUnavailable {
                        reason: format!("{}; {}", u.why, u.help),
                    },
                };
                failures += 1;
                each(&check);
            }
            continue;
        }
        let Some(st) = observed.devices.get(&dev.id) else {
            continue;
        };
        for k in &dev.keys {
            let Some(key) = plan.keys.get(&k.key) else {
                continue;
            };
            let outcome = match observed.keys.get(&k.key).and_then(|s| s.current) {
                None => Outcome::NoCurrent,
                Some(version) => match st.slots_of(&k.key).into_iter().find(|(_, v)| *v == version)
                {
                    None => Outcome::NotEnrolled { version },
                    Some((slot, _)) => {
                        let kms = world
                            .kms_for(plan, &k.key)
                            .map_err(|e| Error::request(e.to_string(), None))?;
                        let pass = kms.get(&key.name, version)?;
                        let bound = st.header.keyslots.get(&slot).is_some_and(|s| s.bound);
                        match (world.luks.test_passphrase(&dev.path, slot, &pass), bound) {
                            (Ok(true), true) => Outcome::Opens { version, slot },
                            (Ok(true), false) => Outcome::Unbound { version, slot },
                            (Ok(false), _) => Outcome::DoesNotOpen { version, slot },
                            (Err(e), _) => Outcome::Untestable {
                                version,
                                slot,
                                reason: e.to_string(),
                            },
                        }
                    }
                },
            };
            let check = Check {
                device: dev.id.clone(),
                key: k.key.clone(),
                outcome,
            };
            if check.failed() {
                failures += 1;
            }
            each(&check);
        }
    }
    Ok(Summary {
        failures,
        pbkdf_runs: engine.pbkdf_runs(),
    })
}
