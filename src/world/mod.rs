//! The doors to the world and what keyplan keeps beside them.
//!
//! [`World`] holds the only handles through which the engine touches anything outside its
//! memory: the cryptsetup driver ([`crate::luks`]), one client per KMS instance of the plan
//! ([`crate::kms`]) and the [`RecordStore`] (keyplan's per-keyslot records: LUKS2 tokens, or
//! LUKS1 record files in the state directory). The device registry ([`registry`]) remembers
//! every device a run touched; [`kept`] the KMS entries a migration left in place for devices
//! outside the move; [`owner`] records the one plan a state directory belongs to. The journal and the state lock are in [`crate::journal`].

pub mod copies;
pub mod kept;
pub mod owner;
pub mod records;
pub mod registry;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::finding::Finding;
use crate::kms::{self, Kms};
use crate::luks::{Cryptsetup, LuksDoor};
use crate::spec::{PathSeg, Plan};

pub use owner::{Owner, OwnerError, OWNER_FILE};
pub use records::{RecordError, RecordObs, RecordStatus, RecordStore, SlotRecord, TOKEN_TYPE};
pub use registry::{Registry, RegistryEntry, RegistryError, REGISTRY_FILE};

/// The doors to the world: cryptsetup, the KMS instances, the record store.
pub struct World {
    /// The LUKS door: the cryptsetup driver ([`Cryptsetup`], which counts PBKDF runs), or an
    /// in-memory one in the deterministic simulation (tests/sim).
    pub luks: Arc<dyn LuksDoor>,
    /// KMS instances by name.
    pub kms: BTreeMap<String, Box<dyn Kms>>,
    /// keyplan's records of keyslots.
    pub records: RecordStore,
    /// How long this world's commands may wait for their KMSs (shared by the clients
    /// [`World::open`] made: [`kms::deadline`]).
    pub kms_waits: Arc<kms::deadline::WaitPolicy>,
}

/// A key or KMS instance a caller named is not in the plan (cannot happen for a validated
/// plan and the keys it lists).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotInPlan {
    /// No such key.
    #[error("key {0:?} is not in the plan")]
    Key(String),
    /// The key's KMS instance is not in the plan.
    #[error("KMS {kms:?} of key {key:?} is not in the plan")]
    Kms {
        /// The KMS instance name.
        kms: String,
        /// The key id.
        key: String,
    },
}

impl World {
    /// Opens every KMS instance of `plan` (contacting none) and finds cryptsetup.
    ///
    /// Errors: [`Finding`]s: the state directory exists but is not a directory; a KMS
    /// instance that cannot be opened (unusable settings or credentials), pointing at its
    /// place in the plan file.
    pub fn open(plan: &Plan) -> Result<World, Vec<Finding>> {
        // A `state_dir` written in the plan was checked when it was loaded; this catches
        // `--state-dir`, which replaces it afterwards.
        if let Ok(m) = std::fs::metadata(&plan.state_dir) {
            if !m.is_dir() {
                return Err(vec![Finding::bare(
                    format!(
                        "the state directory {} exists but is not a directory; nothing was changed",
                        plan.state_dir.display()
                    ),
                    Some(format!(
                        "move the file {} out of the way, or choose another directory with `--state-dir` (or `state_dir` in the plan)",
                        plan.state_dir.display()
                    )),
                )]);
            }
        }
        let mut map = BTreeMap::new();
        let waits = Arc::new(kms::deadline::WaitPolicy::default());
        for (name, cfg) in &plan.kms {
            let k = kms::open(name, cfg, &waits).map_err(|e| {
                vec![Finding::at(
                    vec![PathSeg::Key("kms".into()), PathSeg::Key(name.clone())],
                    e.to_string(),
                    None,
                )]
            })?;
            map.insert(name.clone(), k);
        }
        let mut world = World::with_doors(plan, Arc::new(Cryptsetup::new()), map);
        world.kms_waits = waits;
        Ok(world)
    }

    /// From now on, each KMS instance's calls together wait at most its `timeout`: called at
    /// the start of the read-only commands (`plan`, `status`, `verify`, `key get`), so they
    /// finish within a known bound ([`kms::deadline`], docs/monitoring.md "Deadlines").
    /// Clients not opened by [`World::open`] (the simulation's doors) are not bounded.
    pub fn bound_kms_waits(&self) {
        self.kms_waits.bound();
    }

    /// A world over doors the caller made: `luks` for every LUKS operation and `kms`, one
    /// client per KMS instance name of `plan` (the deterministic simulation passes in-memory
    /// doors; [`World::open`] passes cryptsetup and the plan's providers). Checks nothing.
    pub fn with_doors(
        plan: &Plan,
        luks: Arc<dyn LuksDoor>,
        kms: BTreeMap<String, Box<dyn Kms>>,
    ) -> World {
        World {
            records: RecordStore::new(Arc::clone(&luks), plan.state_dir.join("luks1")),
            luks,
            kms,
            kms_waits: Arc::default(),
        }
    }

    /// The KMS holding key `key_id` of `plan`.
    ///
    /// Errors: the key or its KMS is not in the plan.
    pub fn kms_for(&self, plan: &Plan, key_id: &str) -> Result<&dyn Kms, NotInPlan> {
        let key = plan
            .keys
            .get(key_id)
            .ok_or_else(|| NotInPlan::Key(key_id.to_string()))?;
        self.kms
            .get(&key.kms)
            .map(|b| b.as_ref())
            .ok_or_else(|| NotInPlan::Kms {
                kms: key.kms.clone(),
                key: key_id.to_string(),
            })
    }
}

impl fmt::Debug for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("World")
            .field("luks", &self.luks)
            .field("kms", &self.kms.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}
