//! Steps and the step graph.
//!
//! A [`Step`] is one idempotent operation of docs/rotation.md (stage, add keyslot, verify, commit,
//! kill keyslot, forget record, retire). [`StepGraph`] holds steps and their dependencies in a
//! petgraph DAG; the executor runs a step once all its predecessors are done. Steps are
//! serializable (they go into the journal's `run_start` record) and hold no key material.

pub mod passes;

use std::collections::BTreeMap;
use std::fmt;

use petgraph::graph::{DiGraph, NodeIndex};
use serde::{Deserialize, Serialize};

/// Which version of a key a step means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionRef {
    /// A version known at planning time.
    Version(u64),
    /// The version the run's `stage` step of that key staged (or found pending).
    Staged,
}

impl fmt::Display for VersionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionRef::Version(v) => write!(f, "v{v}"),
            VersionRef::Staged => write!(f, "new version"),
        }
    }
}

/// How an add step opens the device to derive the volume key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unlock {
    /// A key version from the KMS, through the keyslot keyplan recorded for it.
    Key {
        /// Key id.
        key: String,
        /// Version.
        version: VersionRef,
        /// Keyslot holding that version.
        slot: u32,
    },
    /// The device's `enroll_with` passphrase file (no keyslot known: cryptsetup tries each).
    EnrollWith,
}

impl fmt::Display for Unlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unlock::Key { key, version, slot } => {
                write!(f, "{key} {version} in keyslot {slot}")
            }
            Unlock::EnrollWith => write!(f, "the enroll_with passphrase"),
        }
    }
}

/// What a keyslot about to be killed is expected to hold (checked again right before killing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotHolder {
    /// A keyslot keyplan recorded for this key version.
    Record {
        /// Key id.
        key: String,
        /// Version.
        version: VersionRef,
    },
    /// A keyslot keyplan cannot attribute, identified by its KDF salt.
    Unmanaged {
        /// KDF salt seen at planning time.
        salt: String,
    },
}

/// One idempotent operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Step {
    /// Generate a new version and store it as pending, or reuse the pending one.
    Stage {
        /// Key id.
        key: String,
        /// Lowest version number acceptable (above any version a device record names).
        at_least: u64,
        /// The key's current version when planned (a rotation): with nothing pending, a
        /// different current version at run time means another run rotated the key since,
        /// and the stage is refused (docs/verification.md). Absent in older journals.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        planned_current: Option<u64>,
    },
    /// Add `version` of `key` into `slot`, unlocking with `unlock`; then record it.
    AddKeyslot {
        /// Device id.
        device: String,
        /// Key id.
        key: String,
        /// Version to add.
        version: VersionRef,
        /// Target keyslot.
        slot: u32,
        /// How to open the device.
        unlock: Unlock,
    },
    /// `version` of `key` opens `slot`, and the keyslot is bound to the data segment.
    Verify {
        /// Device id.
        device: String,
        /// Key id.
        key: String,
        /// Version.
        version: VersionRef,
        /// Keyslot.
        slot: u32,
    },
    /// Staged version becomes current (compare-and-swap on `expected_current`).
    Commit {
        /// Key id.
        key: String,
        /// Current version when planned.
        expected_current: Option<u64>,
    },
    /// Kill `slot`, which must hold `holder`, once `anchor` (another keyslot) was verified.
    KillKeyslot {
        /// Device id.
        device: String,
        /// Keyslot to kill.
        slot: u32,
        /// What it must hold.
        holder: SlotHolder,
        /// Index of the verify step whose keyslot stays and opens the device.
        anchor: usize,
    },
    /// Drop keyplan's record of `slot` (the keyslot was killed or rewritten outside keyplan,
    /// or `--verify` found that its recorded version does not open it).
    ForgetRecord {
        /// Device id.
        device: String,
        /// Keyslot the record names.
        slot: u32,
        /// Set when `--verify` failed the record: it is dropped even though its salt still
        /// matches the header.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        failed_verify: bool,
    },
    /// Record that `slot` of `device`, which no record names, holds `version` of `key`: when
    /// planning, that version (the key's current one) opened it (adoption). The keyslot must
    /// still be bound and have the KDF `salt` it had then; no PBKDF run.
    AdoptKeyslot {
        /// Device id.
        device: String,
        /// Keyslot.
        slot: u32,
        /// Key id.
        key: String,
        /// The version that opened it.
        version: u64,
        /// The keyslot's KDF salt when it was tested.
        salt: String,
    },
    /// Record this plan ([`crate::spec::Plan::holder`]) as a holder of `key` in its KMS
    /// ([`crate::kms::Kms::hold`]): before this plan adds a keyslot of the key or commits a
    /// version of it, so no other plan rotates the key without this plan's devices.
    Hold {
        /// Key id.
        key: String,
        /// The key's current version when planned: the step fails, before any keyslot of the
        /// key is added, when another plan committed a new one meanwhile (the plan is stale).
        #[serde(default)]
        current: Option<u64>,
    },
    /// Remove this plan's holder record of `key` (no device of the plan lists it any more),
    /// after every other step on the key.
    Release {
        /// Key id.
        key: String,
        /// For a key the plan no longer defines: `(KMS instance, name)` from its records.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        entry: Option<(String, String)>,
    },
    /// Remove `holder`, this plan's own holder record of `key` under the id it had before its
    /// state directory moved (`observe::holders`), and that id's votes: after this plan's own
    /// record (`Hold`) and before anything of the key is staged, added or committed.
    ReleaseFormer {
        /// Key id.
        key: String,
        /// The former holder id.
        holder: String,
    },
    /// Record this plan's vote for the staged version of `key` in its KMS
    /// ([`crate::kms::book::vote_id`]): every device of this plan that lists the key holds the
    /// staged version and opened with it (the verify steps before it). A key several nodes (or
    /// plans) hold is committed only once every other holder voted for the version (the
    /// two-phase commit, [`crate::kms::book::check_holders`]).
    Vote {
        /// Key id.
        key: String,
    },
    /// Remove this plan's vote for `version` of `key`: a stale one (the version was
    /// committed or abandoned), or one that no longer holds (a device lost its keyslot of the
    /// version: the vote goes before the keyslot is added again).
    Unvote {
        /// Key id.
        key: String,
        /// The version the vote names.
        version: u64,
    },
    /// Before `version` of `key` is retired: test each of `slots` of `device` (keyslots no
    /// record names, bound) with it, one PBKDF run each, and record any that opens as a copy
    /// keyplan did not make (`world::copies`; reported by `status`). Changes no keyslot.
    FindCopies {
        /// Device id.
        device: String,
        /// Key id.
        key: String,
        /// The version about to be retired.
        version: u64,
        /// The keyslots to test.
        slots: Vec<u32>,
    },
    /// Destroy a non-current version in the KMS.
    Retire {
        /// Key id.
        key: String,
        /// Version.
        version: u64,
    },
    /// Migration: copy `version` of `key` from the KMS its records name (`from_kms`,
    /// `from_name`) into the key's KMS in the plan, as its current version (stage with
    /// `at_least = version`, then commit); read the copy back and compare. A copy an earlier
    /// run made is reused. The number the copy got is this step's staged version.
    MigrateCopy {
        /// Key id.
        key: String,
        /// KMS instance the key moves from.
        from_kms: String,
        /// Name of the key there.
        from_name: String,
        /// The version the devices hold (current there).
        version: u64,
        /// KMS instance the key moves to (journaled: a resumed run finishes this move, never
        /// one the plan file names since).
        #[serde(default)]
        to_kms: String,
        /// Name of the key there.
        #[serde(default)]
        to_name: String,
    },
    /// Migration: destroy the key in the KMS it moved from (compare-and-swap on `version`
    /// being current there), once every device was verified with the copy. With `kept`: the
    /// copy an earlier move kept there for devices outside it (`<state_dir>/kept.json`), now
    /// that no device keyplan knows holds it; the move is long done, so `to_kms`/`to_name`
    /// only say where the plan put the key when planning (empty when the key left the plan).
    /// Either way the entry of `kept.json` naming it is dropped once it is destroyed.
    DestroyOrigin {
        /// Key id.
        key: String,
        /// KMS instance the key moves from.
        from_kms: String,
        /// Name of the key there.
        from_name: String,
        /// Version expected current there.
        version: u64,
        /// KMS instance the key moves to (journaled: a resumed run finishes this move, never
        /// one the plan file names since).
        #[serde(default)]
        to_kms: String,
        /// Name of the key there.
        #[serde(default)]
        to_name: String,
        /// The copy an earlier move kept, destroyed now no device needs it (not part of a
        /// move: its destination is not checked, only that the plan does not put the key in
        /// the entry destroyed).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        kept: bool,
    },
    /// Migration: record that `slot` of `device` holds `version` of `key` in the key's KMS in
    /// the plan (replacing the record naming the old KMS).
    Rerecord {
        /// Device id.
        device: String,
        /// Key id.
        key: String,
        /// Keyslot.
        slot: u32,
        /// Version in the new KMS.
        version: VersionRef,
        /// KMS instance the key moves to (journaled: a resumed run finishes this move, never
        /// one the plan file names since).
        #[serde(default)]
        to_kms: String,
        /// Name of the key there.
        #[serde(default)]
        to_name: String,
    },
}

impl Step {
    /// For a migration step: `(key, KMS instance, name)` the step moves the key to (not for
    /// the destroy of a kept copy, which belongs to no move under way).
    pub fn migration_target(&self) -> Option<(&str, &str, &str)> {
        match self {
            Step::MigrateCopy {
                key,
                to_kms,
                to_name,
                ..
            }
            | Step::DestroyOrigin {
                key,
                to_kms,
                to_name,
                kept: false,
                ..
            }
            | Step::Rerecord {
                key,
                to_kms,
                to_name,
                ..
            } => Some((key, to_kms, to_name)),
            _ => None,
        }
    }

    /// The device this step works on, if any (steps on one device never run at once).
    pub fn device(&self) -> Option<&str> {
        match self {
            Step::AddKeyslot { device, .. }
            | Step::Verify { device, .. }
            | Step::KillKeyslot { device, .. }
            | Step::ForgetRecord { device, .. }
            | Step::AdoptKeyslot { device, .. }
            | Step::FindCopies { device, .. }
            | Step::Rerecord { device, .. } => Some(device),
            _ => None,
        }
    }

    /// The key whose KMS entry this step writes, if any.
    pub fn kms_key(&self) -> Option<&str> {
        match self {
            Step::Stage { key, .. }
            | Step::Commit { key, .. }
            | Step::Retire { key, .. }
            | Step::Hold { key, .. }
            | Step::Release { key, .. }
            | Step::ReleaseFormer { key, .. }
            | Step::Vote { key }
            | Step::Unvote { key, .. }
            | Step::MigrateCopy { key, .. }
            | Step::DestroyOrigin { key, .. } => Some(key),
            _ => None,
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Stage { key, .. } => write!(f, "stage a new version of {key}"),
            Step::AddKeyslot {
                device,
                key,
                version,
                slot,
                unlock,
            } => write!(
                f,
                "{device}: add {key} {version} into keyslot {slot} (unlock with {unlock})"
            ),
            Step::Verify {
                device,
                key,
                version,
                slot,
            } => write!(f, "{device}: verify {key} {version} opens keyslot {slot}"),
            Step::Commit { key, .. } => write!(f, "commit the new version of {key}"),
            Step::KillKeyslot {
                device,
                slot,
                holder,
                ..
            } => match holder {
                SlotHolder::Record { key, version } => {
                    write!(f, "{device}: kill keyslot {slot} ({key} {version})")
                }
                SlotHolder::Unmanaged { .. } => {
                    write!(f, "{device}: kill keyslot {slot} (unmanaged)")
                }
            },
            Step::ForgetRecord { device, slot, .. } => {
                write!(f, "{device}: forget the record of keyslot {slot}")
            }
            Step::AdoptKeyslot {
                device,
                slot,
                key,
                version,
                ..
            } => write!(f, "{device}: adopt keyslot {slot} as {key} v{version}"),
            Step::Retire { key, version } => write!(f, "retire {key} v{version}"),
            Step::FindCopies {
                device,
                key,
                version,
                slots,
            } => write!(
                f,
                "{device}: test keyslot{} {} for copies of {key} v{version}",
                if slots.len() == 1 { "" } else { "s" },
                slots
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Step::Hold { key, .. } => write!(f, "record this plan as a holder of {key}"),
            Step::Release { key, .. } => write!(f, "remove this plan's holder record of {key}"),
            Step::ReleaseFormer { key, holder } => write!(
                f,
                "remove this plan's former holder record of {key} ({holder})"
            ),
            Step::Vote { key } => write!(
                f,
                "record that this plan's devices hold and open with the new version of {key}"
            ),
            Step::Unvote { key, version } => {
                write!(f, "withdraw this plan's vote for {key} v{version}")
            }
            Step::MigrateCopy {
                key,
                from_kms,
                version,
                to_kms,
                ..
            } => write!(
                f,
                "copy {key} v{version} from KMS {from_kms} to KMS {to_kms}"
            ),
            Step::DestroyOrigin { .. } => destroy_origin_text(f, self),
            Step::Rerecord {
                device,
                key,
                slot,
                to_kms,
                ..
            } => write!(
                f,
                "{device}: record keyslot {slot} as {key} in KMS {to_kms}"
            ),
        }
    }
}

/// The text of a [`Step::DestroyOrigin`] (a move's, or a kept copy's).
fn destroy_origin_text(f: &mut fmt::Formatter<'_>, step: &Step) -> fmt::Result {
    match step {
        Step::DestroyOrigin {
            key,
            from_kms,
            version,
            kept: false,
            ..
        } => write!(f, "destroy {key} (v{version}) in KMS {from_kms}"),
        Step::DestroyOrigin {
            key,
            from_kms,
            from_name,
            ..
        } => write!(
            f,
            "destroy {key} in KMS {from_kms} ({from_name}), kept there for devices that no longer need it"
        ),
        _ => Ok(()),
    }
}

/// Steps with dependencies; node indices equal positions in [`StepGraph::steps`].
#[derive(Debug, Clone, Default)]
pub struct StepGraph {
    graph: DiGraph<Step, ()>,
}

impl StepGraph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Rebuilds a graph from journaled steps and `(before, after)` edges. Edges naming steps
    /// out of range are ignored.
    pub fn from_parts(steps: Vec<Step>, deps: &[(usize, usize)]) -> Self {
        let mut g = StepGraph::new();
        for s in steps {
            g.add(s);
        }
        for &(a, b) in deps {
            g.dep(a, b);
        }
        g
    }

    /// Adds a step, returning its index. Adding a step equal to an existing one returns the
    /// existing index (steps are idempotent, so duplicates would only cost PBKDF runs).
    pub fn add(&mut self, step: Step) -> usize {
        if let Some(i) = self.graph.node_indices().find(|&i| self.graph[i] == step) {
            return i.index();
        }
        self.graph.add_node(step).index()
    }

    /// Makes `after` wait for `before`. Self-edges and duplicates are ignored.
    pub fn dep(&mut self, before: usize, after: usize) {
        if before == after || before >= self.len() || after >= self.len() {
            return;
        }
        let (a, b) = (NodeIndex::new(before), NodeIndex::new(after));
        if !self.graph.contains_edge(a, b) {
            self.graph.add_edge(a, b, ());
        }
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.graph.node_count()
    }

    /// True when there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.graph.node_count() == 0
    }

    /// Step `i`.
    pub fn step(&self, i: usize) -> &Step {
        &self.graph[NodeIndex::new(i)]
    }

    /// All steps in index order.
    pub fn steps(&self) -> Vec<Step> {
        self.graph.node_weights().cloned().collect()
    }

    /// All edges `(before, after)`.
    pub fn deps(&self) -> Vec<(usize, usize)> {
        self.graph
            .raw_edges()
            .iter()
            .map(|e| (e.source().index(), e.target().index()))
            .collect()
    }

    /// Indices of the steps `i` waits for.
    pub fn predecessors(&self, i: usize) -> Vec<usize> {
        self.graph
            .neighbors_directed(NodeIndex::new(i), petgraph::Direction::Incoming)
            .map(|n| n.index())
            .collect()
    }

    /// True when the graph has no cycle (always the case for graphs built by `diff`).
    pub fn is_acyclic(&self) -> bool {
        !petgraph::algo::is_cyclic_directed(&self.graph)
    }

    /// Indices of steps per device, for tests and rendering.
    pub fn by_device(&self) -> BTreeMap<String, Vec<usize>> {
        let mut m: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for i in self.graph.node_indices() {
            if let Some(d) = self.graph[i].device() {
                m.entry(d.to_string()).or_default().push(i.index());
            }
        }
        m
    }
}
