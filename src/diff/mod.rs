//! The planner: desired vs observed state, as the changes a run would make (each with a
//! reason) and the step graph that makes them (docs/rotation.md).
//!
//! [`diff`] is a pure function of the plan and an [`Observed`] state: it reads no device, no
//! KMS, no file and no clock (the observation carries its time), so it is tested on synthetic
//! states (`tests`). It runs in three parts:
//!
//! 1. **Decisions** ([`decide`]): per key, what happens (create, rotate, finish a pending
//!    rotation, migrate to another KMS, converge: enroll, move to a pinned keyslot, drop
//!    duplicates and old versions), which keyslot each new version goes into (chosen now, so
//!    the journal names concrete keyslots), which keyslot unlocks each device, which keyslots
//!    are killed and which verified keyslot must remain ("anchor") before each kill; per device,
//!    records to drop (drift) and keyslots to remove. Decisions add steps and name the ordering
//!    facts only they know (this verify gates that commit, this kill frees the keyslot that add
//!    fills).
//! 2. **Preflight checks** ([`preflight`]): what would make `apply` fail half-way, refused now
//!    before anything is staged (a device that cannot be written, a LUKS2 JSON area too full
//!    for the new tokens), and notes (no keyslot left for the next rotation, versions retained).
//! 3. **Ordering passes** ([`crate::graph::passes`]): the rules that order the steps, each a
//!    named, separately tested pass over the graph.
//!
//! It costs no PBKDF run.

mod decide;
pub mod json;
pub use decide::{foreign_holders, unclaimed_creation};
mod preflight;
#[cfg(test)]
mod tests;
pub mod unmanaged;

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::graph::StepGraph;
use crate::observe::Observed;
use crate::spec::Plan;

/// What happens to a key in the KMS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyAction {
    /// The key does not exist in the KMS yet: create version 1 (or the next free number).
    Create,
    /// Stage a new version, enroll it everywhere, commit it, remove the old keyslots.
    Rotate,
    /// Finish a rotation whose pending version an interrupted run staged.
    Finish,
    /// Move the key from the KMS its records name to the KMS the plan names: copy the
    /// current version, verify the copy opens every device, destroy the key in the old KMS,
    /// update the records.
    Migrate,
    /// Destroy the copy an earlier move kept in the KMS the key left (`kms`, `from_kms`) for
    /// devices outside the move, now that no device keyplan knows holds it; `from` and `to`
    /// are the version current there (`to` 0 when none), `retire` every version destroyed
    /// (docs/operations.md, "Moving a key to another KMS").
    DestroyKept,
}

/// A change of this plan's holder record of a key in its KMS ([`crate::kms::Kms::hold`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderChange {
    /// Key id.
    pub key: String,
    /// KMS instance name.
    pub kms: String,
    /// This plan's holder id ([`crate::spec::Plan::holder`]).
    pub holder: String,
    /// `record` or `release`.
    pub action: HolderAction,
    /// For [`HolderAction::ReleaseFormer`]: why the record is this plan's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What happens to a holder record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HolderAction {
    /// The plan's devices hold (or are about to hold) the key: record the plan as a holder.
    Record,
    /// No device of the plan lists the key any more: remove the record.
    Release,
    /// Every device of the plan that lists the key holds its staged version and opened with
    /// it: record the plan's vote for it (`holder` is then the vote id,
    /// [`crate::kms::book::vote_id`]; the two-phase commit of a shared key).
    Vote,
    /// Remove the plan's vote `holder` (stale: its version is no longer pending; or no longer
    /// true: a device lost its keyslot of the version).
    Withdraw,
    /// Remove `holder`, this plan's own record under the id it had before its state directory
    /// moved (`reason` says how that is known), with its votes; this plan's record under its
    /// id now replaces it.
    ReleaseFormer,
}

/// One key-level change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyChange {
    /// Key id.
    pub key: String,
    /// KMS instance name.
    pub kms: String,
    /// Action.
    pub action: KeyAction,
    /// Current version before the run.
    pub from: Option<u64>,
    /// The version that will become current: the pending one, or the predicted next number.
    pub to: u64,
    /// Why, e.g. `rotate_after exceeded: age 41d > 30d`.
    pub reason: String,
    /// Why, as a stable code for programs (`plan --json`, saved plans).
    pub reason_code: ReasonCode,
    /// Old versions destroyed in the KMS at the end of the run (older than the version that
    /// becomes `previous`, and held by no device keyplan knows).
    pub retire: Vec<u64>,
    /// For [`KeyAction::Migrate`]: the KMS instance the key moves from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_kms: Option<String>,
    /// Before the versions of `retire` are destroyed: the keyslots keyplan did not make that
    /// are tested for copies of them (one PBKDF run each; a copy is reported, `world::copies`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copy_checks: Vec<CopyCheck>,
    /// For [`KeyAction::Migrate`]: versions of the key in the KMS it moves from that devices
    /// outside the move hold (devices that left the plan, plan devices that do not list the
    /// key) or may hold (devices keyplan knows that cannot be read now: then every version
    /// still there). When not empty the key is copied but not destroyed there, so none of
    /// those devices is locked out (docs/operations.md, "Moving a key to another KMS").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept_in_origin: Vec<u64>,
}

/// One keyslot tested for a copy of a version about to be retired ([`KeyChange::copy_checks`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyCheck {
    /// Device id.
    pub device: String,
    /// The keyslot (no record names it).
    pub slot: u32,
    /// The version it is tested with.
    pub version: u64,
}

/// Why a key or keyslot changes, as a stable snake_case code (`reason_code` in `plan --json`
/// and saved plans); the free-text `reason` next to it says the same for people. New codes may
/// be added in minor format versions; readers should accept unknown ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasonCode {
    /// Key: the current version is older than `rotate_after`.
    RotateAfterExceeded,
    /// Key: `--rotate KEY` was given.
    RotateRequested,
    /// Key: the KMS holds no version yet (created); keyslot: the new key's first version is
    /// added.
    NotCreated,
    /// Key: an earlier run staged a version and did not commit it; the rotation is finished.
    PendingRotation,
    /// Key: the plan moved the key to another KMS; keyslot: its record is rewritten to name
    /// the new KMS.
    Migration,
    /// Keyslot: the key's current version is added to a device that does not hold it yet.
    Enroll,
    /// Keyslot: the rotation's new version is added.
    NewVersion,
    /// Keyslot: holds a version that a newer one replaces (or replaced).
    SupersededVersion,
    /// Keyslot: a second keyslot of the same key version.
    DuplicateKeyslot,
    /// Keyslot: added or removed to put a key into its pinned keyslot.
    MoveToPinned,
    /// Keyslot: a temporary keyslot used while moving a key into its pinned keyslot.
    TemporaryKeyslot,
    /// Keyslot: the key's current version is added again with the plan's PBKDF
    /// (`settings.pbkdf`), or its keyslot with another PBKDF is killed once it is
    /// ([`crate::luks::kdf_drift`]).
    PbkdfRewrap,
    /// Keyslot: killed to free the keyslot a key is pinned to.
    MakeRoom,
    /// Keyslot: holds a key no longer listed for the device.
    KeyNotListed,
    /// Keyslot: not created by keyplan, and the device says `unmanaged_keyslots: remove`.
    UnmanagedRemove,
    /// Keyslot (drift): keyplan's record names a keyslot that was killed outside keyplan.
    DriftKeyslotGone,
    /// Keyslot (drift): the keyslot was rewritten outside keyplan (its salt changed).
    DriftRewritten,
    /// Keyslot (drift): `--verify` found the recorded version does not open the keyslot.
    VerifyFailed,
    /// Keyslot: not recorded, and the key's current KMS version opens it: recorded as holding
    /// it (adoption), no new keyslot.
    Adopt,
    /// Keyslot (record): the key's id changed in the plan while its KMS instance and name
    /// stayed; the record is rewritten to the new id (no PBKDF run).
    KeyRenamed,
    /// Key: the copy an earlier move kept in the KMS the key left is destroyed there: no
    /// device keyplan knows holds it any more ([`KeyAction::DestroyKept`]).
    KeptCopyUnneeded,
}

/// What happens to a keyslot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotAction {
    /// A keyslot is added (`+`).
    Add,
    /// A keyslot is killed (`-`).
    Remove,
    /// keyplan's record is corrected (`~`): drift found.
    Drift,
    /// A keyslot keyplan did not create is recorded as holding a key's current version (`=`):
    /// that version opens it (adoption).
    Adopt,
}

/// One keyslot-level change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotChange {
    /// Device id.
    pub device: String,
    /// Keyslot.
    pub slot: u32,
    /// Action.
    pub action: SlotAction,
    /// Key id, when the keyslot belongs to a key.
    pub key: Option<String>,
    /// Version, when known (`None` for an unmanaged keyslot).
    pub version: Option<u64>,
    /// Why.
    pub reason: String,
    /// Why, as a stable code for programs (`plan --json`, saved plans).
    pub reason_code: ReasonCode,
}

/// The result of [`diff`].
#[derive(Debug, Clone, Default)]
pub struct Diff {
    /// Key-level changes, in key order.
    pub keys: Vec<KeyChange>,
    /// Keyslot-level changes, by device then in planning order.
    pub slots: Vec<SlotChange>,
    /// Holder records of this plan to write or remove, in key order.
    pub holders: Vec<HolderChange>,
    /// Steps that make the changes.
    pub graph: StepGraph,
    /// Facts worth knowing that are not changes (e.g. a device that left the plan still holds
    /// a key version, which is therefore kept).
    pub notes: Vec<String>,
    /// Keys whose staged version waits for other holders (nodes) to verify it before it is
    /// committed (the two-phase commit of a shared key), in key order. Not changes: this plan
    /// has nothing more to do for them until the others vote.
    pub waiting: Vec<CommitWait>,
    /// Devices of the plan that cannot be used now, by id (from the observation): the plan
    /// goes around them, and the command that made it ends with exit status 1, because
    /// something needs a person (a failed disk to replace, a device to take out of the plan).
    pub unavailable: std::collections::BTreeMap<String, crate::observe::Unavailable>,
    /// Per device, bound keyslots with no keyplan record and tokens of other tools, with what
    /// this diff does with each ([`unmanaged::unmanaged`]); devices with none are left out.
    pub unmanaged: Vec<unmanaged::DeviceUnmanaged>,
}

/// A shared key's commit that waits for other holders (docs/fleet.md, "Keys on several
/// nodes"): `version` is staged (or about to be), and is committed only once every holder in
/// `blocking` has recorded that its devices hold it and open with it
/// ([`crate::kms::book::vote_id`]). Until then the current version stays and opens every
/// device of every holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitWait {
    /// Key id.
    pub key: String,
    /// KMS instance.
    pub kms: String,
    /// The version waiting to be committed.
    pub version: u64,
    /// The key's current version meanwhile.
    pub current: Option<u64>,
    /// The holders (`<node>:<state directory>`) that have not verified `version`, in id order.
    pub blocking: Vec<String>,
    /// Whether this plan's own devices hold and verified `version` already (its vote is
    /// recorded), or will once this plan's steps ran.
    pub verified_here: bool,
}

impl CommitWait {
    /// The nodes of [`CommitWait::blocking`] (the part of each holder id before `:`).
    pub fn blocking_nodes(&self) -> Vec<String> {
        let mut n: Vec<String> = self
            .blocking
            .iter()
            .map(|h| h.split_once(':').map(|(n, _)| n).unwrap_or(h).to_string())
            .collect();
        n.dedup();
        n
    }

    /// One line for people: e.g. `key k: v3 is verified on this node's devices; its commit
    /// waits for node(s) worker-2, worker-3 to verify it (v2 stays current and opens every
    /// device)`.
    pub fn describe(&self) -> String {
        let here = if self.verified_here {
            "is verified on this plan's devices"
        } else {
            "is being added on this plan's devices"
        };
        let stays = match self.current {
            Some(c) => format!("v{c} stays current and opens every device meanwhile"),
            None => "nothing is current yet".to_string(),
        };
        format!(
            "key {}: v{} {here}; its commit waits for {} to verify it ({}); {stays}. A node that is down blocks the commit until it returns; for a node gone for good, `keyplan key release {} --holder HOLDER` removes its record",
            self.key,
            self.version,
            self.blocking_nodes().join(", "),
            self.blocking.join(", "),
            self.key
        )
    }
}

impl Diff {
    /// True when nothing would change.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
            && self.slots.is_empty()
            && self.holders.is_empty()
            && self.graph.is_empty()
    }
    /// Keyslots to add.
    pub fn adds(&self) -> usize {
        self.count(SlotAction::Add)
    }
    /// Keyslots to remove.
    pub fn removes(&self) -> usize {
        self.count(SlotAction::Remove)
    }
    /// Keyslots to adopt.
    pub fn adoptions(&self) -> usize {
        self.count(SlotAction::Adopt)
    }
    /// Records to rewrite for a key renamed in the plan ([`ReasonCode::KeyRenamed`]).
    pub fn renames(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.reason_code == ReasonCode::KeyRenamed)
            .count()
    }
    /// Keys to rotate (rotations and finished rotations of existing keys; creating a key,
    /// or finishing its creation, is not a rotation; a shared key whose commit waits for other
    /// nodes, [`Diff::waiting`], is not rotated by this plan yet).
    pub fn rotations(&self) -> usize {
        self.keys
            .iter()
            .filter(|k| {
                !matches!(
                    k.action,
                    KeyAction::Create | KeyAction::Migrate | KeyAction::DestroyKept
                ) && k.from.is_some()
            })
            .filter(|k| !self.waiting.iter().any(|w| w.key == k.key))
            .count()
    }
    /// True when a key moves to another KMS in this plan (a rotation that is due then waits
    /// for a plan made once the key is in its new KMS).
    pub fn migrates(&self) -> bool {
        self.keys.iter().any(|k| k.action == KeyAction::Migrate)
    }
    /// Kept copies to destroy in the KMS a key left ([`KeyAction::DestroyKept`]).
    pub fn kept_destroys(&self) -> usize {
        self.keys
            .iter()
            .filter(|k| k.action == KeyAction::DestroyKept)
            .count()
    }
    fn count(&self, a: SlotAction) -> usize {
        self.slots.iter().filter(|s| s.action == a).count()
    }
}

/// Options of a plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiffOptions {
    /// Keys to rotate regardless of age (`--rotate KEY`).
    pub rotate: Vec<String>,
    /// Allow changes on devices whose LUKS2 header copies disagree (`--repair-headers`).
    pub repair_headers: bool,
    /// What this plan's own journal says it staged ([`crate::journal::staged_versions`]):
    /// `(key id, Some(version))`, or `(key id, None)` for a stage whose reply was lost. A
    /// pending version among them (or any pending version of a `None` key: the stage would
    /// have reused it anyway) is this plan's own creation of the key, to be finished, even
    /// when its run failed before any device held it (found by the deterministic simulation,
    /// docs/verification.md).
    pub staged_here: std::collections::BTreeSet<(String, Option<u64>)>,
}

/// Why the planner refuses: no safe plan exists for a device or key. The message names the
/// device (with its place in the plan file) or key, the keyslot, what was left unchanged and
/// what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The device the refusal is about, if any.
    pub device: Option<String>,
    /// The key the refusal is about, if any.
    pub key: Option<String>,
    /// What is wrong and what to do.
    pub message: String,
}

impl Refusal {
    /// A refusal about device `id`.
    pub fn device(id: &str, message: String) -> Refusal {
        Refusal {
            device: Some(id.to_string()),
            key: None,
            message,
        }
    }

    /// A refusal about key `id`.
    pub fn key(id: &str, message: String) -> Refusal {
        Refusal {
            device: None,
            key: Some(id.to_string()),
            message,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Renders a duration in the largest whole unit among d, h, m, s (e.g. `41d`).
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 86_400 {
        format!("{}d", s / 86_400)
    } else if s >= 3_600 {
        format!("{}h", s / 3_600)
    } else if s >= 60 {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// Compares `plan` with `observed` and builds the step graph: decisions, then preflight checks,
/// then the ordering passes (see the module docs).
///
/// Errors: every device/key for which no safe plan exists, each once, in the order found (no
/// free keyslot, nothing to unlock a device with, a pinned keyslot occupied by something else,
/// a kill that would leave no verified keyslot, a device that cannot be written, a LUKS2 JSON
/// area too full, ...).
pub fn diff(plan: &Plan, observed: &Observed, opts: &DiffOptions) -> Result<Diff, Vec<Refusal>> {
    let before_adoption = observed;
    // Adopted keyslots count as recorded from the start: the rest plans as for a keyslot
    // keyplan made (a rotation replaces it, a pin moves it), and the adopt steps come first.
    let observed = decide::with_adopted_records(observed);
    // This plan's own former holder records (a moved state directory) are not another plan's:
    // the planner sees them gone, and removes them first.
    let (observed, former) = decide::without_former_holders(&observed);
    let mut p = decide::Planner::new(plan, &observed);
    p.decide(opts);
    p.release_former(&former);
    p.repair_headers = opts.repair_headers;
    preflight::check(&mut p);
    let decide::Planner {
        mut g,
        intents,
        keys,
        mut slots,
        holders,
        refusals,
        mut notes,
        waiting,
        ..
    } = p;
    if let Some(n) = plan.scope.as_ref().and_then(|s| s.note()) {
        notes.insert(0, n);
    }
    if !refusals.is_empty() {
        let mut unique: Vec<Refusal> = Vec::new();
        for r in refusals {
            if !unique.iter().any(|x| x.message == r.message) {
                unique.push(r);
            }
        }
        return Err(unique);
    }
    crate::graph::passes::order(&mut g, &intents);
    // Stable order for display: by device, keeping planning order within a device.
    slots.sort_by(|a, b| a.device.cmp(&b.device));
    let unmanaged = unmanaged::unmanaged(plan, before_adoption.devices.values(), &slots);
    notes.extend(unmanaged::orphaned_tokens(&unmanaged, &slots));
    Ok(Diff {
        keys,
        slots,
        holders,
        graph: g,
        notes,
        waiting,
        unavailable: observed.unavailable.clone(),
        unmanaged,
    })
}
