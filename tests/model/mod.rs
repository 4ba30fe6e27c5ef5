//! An exhaustive model of keyplan's protocol, checked with the `stateright` model checker
//! (docs/verification.md says what is modelled, what is abstracted, and why stateright).
//!
//! The model is small and abstract on purpose, so that every reachable state can be visited:
//! a key with a few versions, one to three nodes with one to three devices in all, five
//! keyslots per device. Each run is a process that takes its node's state lock, finishes the journaled run
//! if one was interrupted, otherwise plans from what it observes and journals the steps, takes
//! a rollout slot (a Lease) in fleet scenarios, and runs its steps one door call at a time.
//! Between any two door calls the run can be killed (`kill -9`): its memory is lost; devices,
//! the KMS, the journal and the Leases stay.
//!
//! The step semantics follow the engine (`src/apply/steps/`): `stage` reuses a pending version;
//! `add` writes the keyslot and then records it (two door calls, a crash in between leaves an
//! unrecorded keyslot that the resumed step records); `verify` tests the recorded version
//! against the keyslot; `vote` records "this node verified vN" among the key's holder records;
//! `commit` is a compare-and-swap on the current version that also requires every other
//! holder's vote; `kill` needs its anchor (a keyslot this process verified; one only the
//! interrupted process verified is verified again first) to be present and unchanged, and
//! refuses the last bound keyslot.

use std::collections::BTreeSet;

use stateright::{Model, Property};

/// Material of the install keyslot (the `enroll_with` passphrase).
pub const INSTALL: u8 = 0;
/// Material of the key's first version, which the KMS holds as current at the start.
pub const V1: u8 = 1;
/// Material of a keyslot that silent damage made open nothing.
pub const GARBAGE: u8 = 254;
/// Material of an older version (v0) that a device which left the plan holds, and the origin
/// KMS keeps as previous ([`Scenario::departed`]).
pub const DEPARTED: u8 = 253;
/// Material of a keyslot keyplan does not manage (another tool's passphrase).
pub const FOREIGN: u8 = 255;
/// Keyslots per device.
pub const SLOTS: usize = 5;
/// Fresh materials (versions) a behaviour may create; the next one sets `bound_hit` and reuses
/// the last, which keeps the state space finite for protocols that rotate without end.
pub const MATERIALS: u8 = 8;

/// A fresh material, or the last one with `bound_hit` set.
fn fresh(next: &mut u8, bound_hit: &mut bool) -> u8 {
    if *next >= MATERIALS {
        *bound_hit = true;
        return MATERIALS - 1;
    }
    *next += 1;
    *next - 1
}

/// Which protocol the model runs: keyplan's, or a deliberately broken one that must yield a
/// counterexample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// keyplan's protocol.
    Correct,
    /// Old keyslots are killed before the commit.
    KillBeforeCommit,
    /// The commit does not wait for the other holders' votes.
    CommitBeforeAllVerified,
    /// A kill does not need a verified anchor (the record is trusted).
    KillWithoutAnchor,
    /// Stage and commit read, then write, without compare-and-swap.
    NoCompareAndSwap,
    /// A resumed run trusts the anchors the interrupted run verified (keyplan before the fix
    /// this model found).
    TrustJournaledAnchors,
    /// A managed keyslot re-salted with the same passphrase (`luksConvertKey`) is forgotten
    /// as "rewritten" and left unmanaged (keyplan before issue 29).
    ForgetResalted,
    /// No keyslot is searched for copies of a version before it is retired.
    NoCopySearch,
    /// A resumed run trusts the copy search the interrupted run made, though the operator may
    /// have added a keyslot since (keyplan before the fix this model found).
    TrustJournaledCopySearch,
    /// A migration destroys the key in the origin KMS even while a device that left the plan
    /// holds a version there (keyplan before issue 46).
    DestroyKeptOrigin,
}

/// How a device starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceStart {
    /// Keyslot 0: install passphrase; keyslot 1: v1, recorded.
    Enrolled,
    /// Keyslot 0: v1, not recorded (a Rook OSD's keyslot 0: adoption).
    Adopt,
    /// Keyslot 0: install passphrase only (enrollment).
    Enroll,
}

/// One model-checking scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Name printed with the figures.
    pub name: &'static str,
    /// Protocol variant.
    pub variant: Variant,
    /// Devices: (node, how it starts). Device 0 also has a foreign keyslot.
    pub devices: Vec<(u8, DeviceStart)>,
    /// Nodes (1 = a single host; more = fleet mode with Leases and votes).
    pub nodes: u8,
    /// Rotations the policy asks for (the key is "too old" until it was rotated this often).
    pub rotations: u8,
    /// `kill -9`s allowed in one behaviour.
    pub max_crashes: u8,
    /// A second `keyplan apply` may run beside the first on node 0 (the state lock).
    pub second_run: bool,
    /// Another writer (another host's keyplan run on this key) may stage a pending version.
    pub external_stage: bool,
    /// One keyslot may be damaged silently (it stays bound with its salt, opens nothing) while
    /// no run is live on its node.
    pub silent_damage: bool,
    /// The last node may be lost for good; the operator then releases it (`keyplan key
    /// release` and the plan edited).
    pub lose_node: bool,
    /// `max_concurrent_nodes` (fleet scenarios).
    pub max_concurrent_nodes: u8,
    /// The key moves from KMS "origin" to KMS "dest" (migration) instead of rotating.
    pub migrate: bool,
    /// With `migrate`: a device that left the plan holds an older version (v0, material
    /// [`DEPARTED`]), which the origin keeps as previous. keyplan never writes such a device,
    /// so it is not in the state: it opens with [`DEPARTED`] only. The migration keeps the key
    /// in the origin (src/diff/decide/migrate.rs, `kept_in_origin`), and the property "a
    /// departed device opens with what a KMS holds" checks it (issue 46).
    pub departed: bool,
    /// The operator may, while no run is live on the device's node, re-salt one managed
    /// keyslot (`luksConvertKey`: the same passphrase) and add the current or the previous
    /// version by hand into one free keyslot (a copy keyplan did not make), once each
    /// (invariant I8). Single-host scenarios only: in a fleet, a copy of the previous version
    /// made by hand on a node after its vote and before another node's commit retires it is
    /// not searched for (docs/verification.md).
    pub operator: bool,
}

/// A version of the key: (version number, material).
pub type Version = (u8, u8);

/// A keyslot.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Which passphrase opens it.
    pub mat: u8,
    /// Bound to the data segment (an unbound keyslot opens nothing).
    pub bound: bool,
    /// keyplan's record: the version it holds.
    pub rec: Option<u8>,
    /// The record names the destination KMS (migration).
    pub rec_dest: bool,
    /// A verify found that the recorded version does not open it (the next plan forgets the
    /// record).
    pub failed: bool,
    /// The record's salt is not the keyslot's any more: the operator rewrote it with the same
    /// passphrase (`luksConvertKey`).
    pub resalted: bool,
    /// Added by the operator (not keyplan's; kept under `unmanaged_keyslots: keep`).
    pub by_hand: bool,
    /// keyplan reported it as a copy of a version it retires (`world::copies`).
    pub reported: bool,
}

/// One KMS instance's copy of the key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct KmsKey {
    /// Current version.
    pub current: Option<Version>,
    /// Pending version.
    pub pending: Option<Version>,
    /// The version before current, retained.
    pub previous: Option<Version>,
    /// Holder votes: (node, version verified).
    pub votes: BTreeSet<(u8, u8)>,
}

/// A step as the planner journals it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MStep {
    /// Generate a pending version numbered at least `at_least`, or reuse the pending one;
    /// refused when, with nothing pending, the current version reached `at_least` since
    /// planning (another run rotated the key: this plan is stale).
    Stage { at_least: u8 },
    /// Add version `ver` (`None`: the current one when run) into `slot`, unlocking with `unlock`.
    Add {
        dev: u8,
        slot: u8,
        ver: u8,
        unlock: u8,
    },
    /// `ver` opens `slot` (recorded with it) and the keyslot is bound.
    Verify { dev: u8, slot: u8, ver: u8 },
    /// Record this node's vote for `ver`.
    Vote { ver: u8 },
    /// Withdraw this node's vote for `ver`.
    Unvote { ver: u8 },
    /// Pending `ver` becomes current, compare-and-swap on `expected`.
    Commit { expected: u8, ver: u8 },
    /// Kill `slot`, which holds `holder`, once `anchor` was verified.
    Kill {
        dev: u8,
        slot: u8,
        holder: u8,
        anchor: Option<u8>,
    },
    /// Record an unrecorded keyslot the current version opens (adoption).
    Adopt { dev: u8, slot: u8 },
    /// Record again a keyslot whose salt changed and that its recorded version still opens
    /// (the engine: forget the stale record, adopt the keyslot with its new salt).
    Resalt { dev: u8, slot: u8 },
    /// Before `ver` is retired: report every unrecorded bound keyslot of `dev` it opens.
    FindCopies { dev: u8, ver: u8 },
    /// Drop a record that does not describe its keyslot.
    Forget { dev: u8, slot: u8 },
    /// Copy the origin's current version to the destination KMS (migration).
    MigrateCopy,
    /// Re-record `slot` as held in the destination KMS, after it was verified with the copy.
    Rerecord { dev: u8, slot: u8 },
    /// Destroy the key in the origin KMS once every device verified the copy.
    DestroyOrigin,
}

/// A journaled run: its steps, which are done, which verifies it journaled.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Journal {
    /// The steps, in order.
    pub steps: Vec<MStep>,
    /// Done markers.
    pub done: Vec<bool>,
}

/// Where a live run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Started, lock not yet taken.
    Start,
    /// Holds the lock; plans (or picks up the interrupted run) next.
    Locked,
    /// Journaled its steps; needs a rollout slot (fleet) before writing.
    Planned,
    /// Running step `pc` of the journal.
    Running,
    /// Step `pc`'s effect happened; marking it done in the journal is next.
    Marking,
}

/// A live `keyplan apply` (or agent cycle).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Run {
    /// Its node.
    pub node: u8,
    /// Where it is.
    pub phase: Phase,
    /// Index of the step it runs.
    pub pc: u8,
    /// Second half of a two-call step: `add` wrote the keyslot; `stage`/`commit` (no
    /// compare-and-swap) read this.
    pub half: Option<Option<Version>>,
    /// Verifies this process ran itself (indices into the journal).
    pub verified_here: BTreeSet<u8>,
}

/// A state of the whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// Devices' keyslots.
    pub devs: Vec<[Option<Slot>; SLOTS]>,
    /// The KMS the plan names (the destination, in migration scenarios).
    pub kms: KmsKey,
    /// The KMS the key moves from (migration), `None` once destroyed.
    pub origin: Option<KmsKey>,
    /// Per node: the journaled run that has not ended.
    pub journal: Vec<Option<Journal>>,
    /// Per node: the state lock is held by a live run (flock: released when it dies).
    pub locked: Vec<bool>,
    /// Rollout slots (Leases): holder node of each held one.
    pub leases: BTreeSet<u8>,
    /// Live runs.
    pub runs: Vec<Run>,
    /// Nodes lost for good.
    pub lost: BTreeSet<u8>,
    /// Nodes the operator released (out of the plan, holder record removed).
    pub released: BTreeSet<u8>,
    /// Next fresh material.
    pub next_mat: u8,
    /// Crashes so far.
    pub crashes: u8,
    /// A second run was started on node 0.
    pub second_started: bool,
    /// The external writer staged.
    pub external_done: bool,
    /// The device silent damage hit, if it happened.
    pub damaged: Option<u8>,
    /// A stage overwrote an existing pending version (no second pending version).
    pub pending_replaced: bool,
    /// A commit overwrote a current version other than the one it read (lost update).
    pub lost_update: bool,
    /// A kill left a device that no version the KMS holds opens.
    pub lockout_by_kill: bool,
    /// A kill removed a keyslot keyplan cannot attribute, or the last bound one (I4).
    pub collateral: bool,
    /// Materials of versions the KMS retired (destroyed).
    pub retired: BTreeSet<u8>,
    /// The operator re-salted a managed keyslot.
    pub converted: bool,
    /// The operator added a copy by hand.
    pub copied: bool,
    /// A stage needed a material beyond [`MATERIALS`] (more versions than any scenario asks
    /// for: a protocol that rotates more than asked).
    pub bound_hit: bool,
}

/// The model: a scenario.
pub struct ProtocolModel {
    /// The scenario.
    pub sc: Scenario,
}

/// The actions of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A run starts on a node (`keyplan apply`, an agent cycle).
    Start(u8),
    /// Run `i` tries the state lock.
    Lock(usize),
    /// Run `i` plans, or picks up the interrupted run.
    Plan(usize),
    /// Run `i` takes a rollout slot.
    TakeLease(usize),
    /// Run `i` makes its next door call.
    Step(usize),
    /// Run `i` marks its step done in the journal.
    Mark(usize),
    /// Run `i` is killed (`kill -9`, power cut).
    Crash(usize),
    /// A Lease whose holder runs nothing expires.
    Expire(u8),
    /// A node is lost for good.
    Lose(u8),
    /// The operator releases a lost node.
    Release(u8),
    /// Silent damage of keyslot `slot` of device `dev`.
    Damage(u8, u8),
    /// Another writer stages a pending version.
    ExternalStage,
    /// The operator re-salts keyslot `slot` of device `dev` (same passphrase).
    Convert(u8, u8),
    /// The operator adds the current version (`false`) or the previous one (`true`) into a
    /// free keyslot of device `dev`.
    Copy(u8, bool),
}

/// Why a step failed (the run ends; the journal marks it ended).
#[derive(Debug)]
pub struct Fail;

impl ProtocolModel {
    fn fleet(&self) -> bool {
        self.sc.nodes > 1
    }

    fn dev_node(&self, d: usize) -> u8 {
        self.sc.devices[d].0
    }

    fn own_devs(&self, node: u8) -> Vec<usize> {
        (0..self.sc.devices.len())
            .filter(|d| self.dev_node(*d) == node)
            .collect()
    }

    /// Nodes in the plan (not released).
    fn plan_nodes<'s>(&self, s: &'s State) -> impl Iterator<Item = u8> + 's {
        let n = self.sc.nodes;
        (0..n).filter(move |x| !s.released.contains(x))
    }

    /// Materials the KMS side can give for unlocking: current, previous, pending (and the
    /// origin's current during a migration).
    fn kms_materials(s: &State) -> Vec<u8> {
        let mut v = Vec::new();
        for k in std::iter::once(&s.kms).chain(s.origin.iter()) {
            for x in [k.current, k.previous, k.pending].into_iter().flatten() {
                v.push(x.1);
            }
        }
        v
    }

    /// The material of version `ver` the KMS holds (pending or current or previous).
    fn material_of(k: &KmsKey, ver: u8) -> Option<u8> {
        [k.current, k.pending, k.previous]
            .into_iter()
            .flatten()
            .find(|v| v.0 == ver)
            .map(|v| v.1)
    }

    /// The key as the plan's runs read it: the destination's copy when there is one, else the
    /// origin's.
    fn key_view(s: &State) -> &KmsKey {
        match &s.origin {
            Some(o) if s.kms.current.is_none() => o,
            _ => &s.kms,
        }
    }

    fn opens(slots: &[Option<Slot>; SLOTS], mat: u8) -> bool {
        slots.iter().flatten().any(|k| k.bound && k.mat == mat)
    }

    fn free_slot(slots: &[Option<Slot>; SLOTS], also_taken: &[u8]) -> Option<u8> {
        (0..SLOTS as u8).find(|i| slots[*i as usize].is_none() && !also_taken.contains(i))
    }

    fn init(&self) -> State {
        let sc = &self.sc;
        let slot = |mat, rec: Option<u8>| {
            Some(Slot {
                mat,
                bound: true,
                rec,
                rec_dest: false,
                failed: false,
                resalted: false,
                by_hand: false,
                reported: false,
            })
        };
        let mut devs = Vec::new();
        for (i, (_, start)) in sc.devices.iter().enumerate() {
            let mut d: [Option<Slot>; SLOTS] = Default::default();
            match start {
                DeviceStart::Enrolled => {
                    d[0] = slot(INSTALL, None);
                    d[1] = slot(V1, Some(1));
                }
                DeviceStart::Adopt => d[0] = slot(V1, None),
                DeviceStart::Enroll => d[0] = slot(INSTALL, None),
            }
            if i == 0 {
                d[SLOTS - 1] = slot(FOREIGN, None);
            }
            devs.push(d);
        }
        let key = KmsKey {
            current: Some((1, V1)),
            previous: sc.departed.then_some((0, DEPARTED)),
            ..Default::default()
        };
        let (kms, origin) = if sc.migrate {
            (KmsKey::default(), Some(key))
        } else {
            (key, None)
        };
        let n = sc.nodes as usize;
        State {
            devs,
            kms,
            origin,
            journal: vec![None; n],
            locked: vec![false; n],
            leases: BTreeSet::new(),
            runs: Vec::new(),
            lost: BTreeSet::new(),
            released: BTreeSet::new(),
            next_mat: 2,
            crashes: 0,
            second_started: false,
            external_done: false,
            damaged: None,
            pending_replaced: false,
            lost_update: false,
            lockout_by_kill: false,
            collateral: false,
            bound_hit: false,
            retired: BTreeSet::new(),
            converted: false,
            copied: false,
        }
    }

    /// The planner: the steps node `node` plans from what it observes now (one snapshot).
    pub fn plan(&self, s: &State, node: u8) -> Vec<MStep> {
        let v = self.sc.variant;
        let mut steps = Vec::new();
        let devs = self.own_devs(node);
        if s.origin.is_some() {
            return self.plan_migration(s, node);
        }
        let k = &s.kms;
        let Some(cur) = k.current else {
            return steps;
        };
        // Per device: the keyslot recorded with each version, after forgetting failed records
        // and adopting unrecorded keyslots the current version opens.
        let mut rec_of: Vec<Vec<(u8, u8)>> = Vec::new(); // (slot, ver)
        for &d in &devs {
            let mut recs = Vec::new();
            for (i, sl) in s.devs[d].iter().enumerate() {
                let Some(sl) = sl else { continue };
                match sl.rec {
                    Some(_) if sl.failed => steps.push(MStep::Forget {
                        dev: d as u8,
                        slot: i as u8,
                    }),
                    // A re-salted keyslot: tested with its recorded version (the engine's one
                    // PBKDF run) and recorded again when that still opens it.
                    Some(ver)
                        if sl.resalted
                            && v != Variant::ForgetResalted
                            && sl.bound
                            && Self::material_of(k, ver) == Some(sl.mat) =>
                    {
                        steps.push(MStep::Resalt {
                            dev: d as u8,
                            slot: i as u8,
                        });
                        recs.push((i as u8, ver));
                    }
                    Some(_) if sl.resalted => steps.push(MStep::Forget {
                        dev: d as u8,
                        slot: i as u8,
                    }),
                    Some(ver) => recs.push((i as u8, ver)),
                    None => {}
                }
            }
            // Adoption: the first unrecorded keyslot the current version opens, when no record
            // of the device holds it (observe::adopt).
            if !recs.iter().any(|r| r.1 == cur.0) {
                let first = s.devs[d].iter().enumerate().find_map(|(i, sl)| {
                    let sl = sl.as_ref()?;
                    (sl.rec.is_none() && sl.bound && sl.mat == cur.1).then_some(i)
                });
                if let Some(i) = first {
                    steps.push(MStep::Adopt {
                        dev: d as u8,
                        slot: i as u8,
                    });
                    recs.push((i as u8, cur.0));
                }
            }
            rec_of.push(recs);
        }
        let rotated = cur.0.saturating_sub(1);
        let rotating = k.pending.is_some() || rotated < self.sc.rotations;
        let target = k.pending.map(|p| p.0).unwrap_or(cur.0 + 1);
        let unlock_for = |d: usize, recs: &[(u8, u8)]| -> u8 {
            // The current version's keyslot, else a retained version's, else the install
            // passphrase (enroll_with).
            if recs.iter().any(|r| r.1 == cur.0) {
                return cur.1;
            }
            for x in [k.previous].into_iter().flatten() {
                if recs.iter().any(|r| r.1 == x.0) {
                    return x.1;
                }
            }
            let _ = d;
            INSTALL
        };
        // Every device holds the current version first (enrollment, or a lost keyslot).
        let mut cur_verify: Vec<Option<u8>> = vec![None; devs.len()];
        let mut taken: Vec<Vec<u8>> = vec![Vec::new(); devs.len()];
        for (j, &d) in devs.iter().enumerate() {
            let recs = &rec_of[j];
            let has_cur = recs.iter().find(|r| r.1 == cur.0).map(|r| r.0);
            let olds = recs.iter().any(|r| r.1 < cur.0);
            match has_cur {
                None => {
                    if let Some(slot) = Self::free_slot(&s.devs[d], &taken[j]) {
                        taken[j].push(slot);
                        let unlock = unlock_for(d, recs);
                        steps.push(MStep::Add {
                            dev: d as u8,
                            slot,
                            ver: cur.0,
                            unlock,
                        });
                        cur_verify[j] = Some(steps.len() as u8);
                        steps.push(MStep::Verify {
                            dev: d as u8,
                            slot,
                            ver: cur.0,
                        });
                    }
                }
                Some(slot) if olds && v != Variant::KillWithoutAnchor => {
                    cur_verify[j] = Some(steps.len() as u8);
                    steps.push(MStep::Verify {
                        dev: d as u8,
                        slot,
                        ver: cur.0,
                    });
                }
                Some(_) => {}
            }
        }
        // Keyslots of versions older than current go (anchored on a verify of current).
        let mut kills = Vec::new();
        for (j, &d) in devs.iter().enumerate() {
            if cur_verify[j].is_none() && v != Variant::KillWithoutAnchor {
                continue;
            }
            for &(slot, ver) in &rec_of[j] {
                if ver < cur.0 {
                    kills.push(MStep::Kill {
                        dev: d as u8,
                        slot,
                        holder: ver,
                        anchor: cur_verify[j],
                    });
                }
            }
        }
        let peers: Vec<u8> = self.plan_nodes(s).filter(|p| *p != node).collect();
        // A full keyslot table refuses the rotation (preflight): nothing is staged.
        let full = devs.iter().enumerate().any(|(j, &d)| {
            !rec_of[j].iter().any(|r| r.1 == target)
                && Self::free_slot(&s.devs[d], &taken[j]).is_none()
        });
        // A node that voted for the pending version and still holds it plans nothing for the
        // rotation: it waits for the others.
        let voted = k.votes.contains(&(node, target))
            && (0..devs.len()).all(|j| rec_of[j].iter().any(|r| r.1 == target))
            && !peers.iter().all(|p| k.votes.contains(&(*p, target)))
            && v != Variant::CommitBeforeAllVerified;
        if rotating && voted {
            steps.append(&mut kills);
        } else if rotating && !full {
            steps.append(&mut kills);
            let lacks = |j: usize| !rec_of[j].iter().any(|r| r.1 == target);
            if k.votes.contains(&(node, target)) && (0..devs.len()).any(lacks) {
                steps.push(MStep::Unvote { ver: target });
            }
            steps.push(MStep::Stage { at_least: target });
            let mut pv: Vec<Option<u8>> = vec![None; devs.len()];
            for (j, &d) in devs.iter().enumerate() {
                let slot = match rec_of[j].iter().find(|r| r.1 == target) {
                    Some(r) => r.0,
                    None => {
                        let Some(slot) = Self::free_slot(&s.devs[d], &taken[j]) else {
                            continue;
                        };
                        taken[j].push(slot);
                        let unlock = match cur_verify[j] {
                            Some(_) if !rec_of[j].iter().any(|r| r.1 == cur.0) => INSTALL,
                            _ => unlock_for(d, &rec_of[j]),
                        };
                        steps.push(MStep::Add {
                            dev: d as u8,
                            slot,
                            ver: target,
                            unlock,
                        });
                        slot
                    }
                };
                pv[j] = Some(steps.len() as u8);
                steps.push(MStep::Verify {
                    dev: d as u8,
                    slot,
                    ver: target,
                });
            }
            // Before the version the commit retires (the previous one) is gone: this node's
            // devices are searched for copies of it, before its vote (a peer's commit may
            // retire it) and before its own commit.
            let search = |steps: &mut Vec<MStep>| {
                if let (Some(prev), true) = (k.previous, v != Variant::NoCopySearch) {
                    for &d in &devs {
                        steps.push(MStep::FindCopies {
                            dev: d as u8,
                            ver: prev.0,
                        });
                    }
                }
            };
            if !peers.is_empty() && !k.votes.contains(&(node, target)) {
                search(&mut steps);
                steps.push(MStep::Vote { ver: target });
            }
            let all_voted = peers.iter().all(|p| k.votes.contains(&(*p, target)));
            if all_voted || v == Variant::CommitBeforeAllVerified {
                let mut kills = Vec::new();
                for (j, &d) in devs.iter().enumerate() {
                    for &(slot, ver) in &rec_of[j] {
                        let killed_before = ver < cur.0 && cur_verify[j].is_some();
                        if ver < target && !killed_before {
                            let anchor = if v == Variant::KillWithoutAnchor {
                                None
                            } else {
                                pv[j]
                            };
                            kills.push(MStep::Kill {
                                dev: d as u8,
                                slot,
                                holder: ver,
                                anchor,
                            });
                        }
                    }
                    // The current version's keyslot added in this run goes too.
                    if let (Some(ci), None) =
                        (cur_verify[j], rec_of[j].iter().find(|r| r.1 == cur.0))
                    {
                        if let Some(MStep::Verify { slot, .. }) = steps.get(ci as usize).cloned() {
                            kills.push(MStep::Kill {
                                dev: d as u8,
                                slot,
                                holder: cur.0,
                                anchor: pv[j],
                            });
                        }
                    }
                }
                if peers.is_empty() {
                    search(&mut steps);
                }
                let commit = MStep::Commit {
                    expected: cur.0,
                    ver: target,
                };
                if v == Variant::KillBeforeCommit {
                    steps.append(&mut kills);
                    steps.push(commit);
                } else {
                    steps.push(commit);
                    steps.append(&mut kills);
                }
            }
        } else {
            steps.append(&mut kills);
            for &(n, ver) in &k.votes {
                if n == node && ver <= cur.0 {
                    steps.push(MStep::Unvote { ver });
                }
            }
        }
        steps
    }

    /// The migration planner: copy, verify each device with the copy, re-record, destroy the
    /// origin once every device of every node verified.
    fn plan_migration(&self, s: &State, node: u8) -> Vec<MStep> {
        let mut steps = Vec::new();
        let Some(o) = &s.origin else { return steps };
        let Some(cur) = o.current else { return steps };
        if s.kms.current.is_none() {
            steps.push(MStep::MigrateCopy);
        }
        for d in self.own_devs(node) {
            for (i, sl) in s.devs[d].iter().enumerate() {
                let Some(sl) = sl else { continue };
                if sl.rec == Some(cur.0) && !sl.rec_dest {
                    steps.push(MStep::Verify {
                        dev: d as u8,
                        slot: i as u8,
                        ver: cur.0,
                    });
                    steps.push(MStep::Rerecord {
                        dev: d as u8,
                        slot: i as u8,
                    });
                }
            }
        }
        if !self.kept_in_origin() {
            steps.push(MStep::DestroyOrigin);
        }
        steps
    }

    /// Whether the migration keeps the key in the origin: a device that left the plan holds
    /// a version there (the broken variant destroys it anyway).
    fn kept_in_origin(&self) -> bool {
        self.sc.departed && self.sc.variant != Variant::DestroyKeptOrigin
    }

    /// Whether the migration is done: the destination holds the key and every keyslot of a
    /// device of the plan that keyplan records is recorded there.
    fn migrated(&self, s: &State) -> bool {
        s.kms.current.is_some()
            && (0..self.sc.devices.len())
                .filter(|d| !s.released.contains(&self.dev_node(*d)))
                .all(|d| {
                    s.devs[d]
                        .iter()
                        .flatten()
                        .all(|k| k.rec.is_none() || k.rec_dest)
                })
    }

    /// Runs one door call of `step` for run `r` (its journal is `node`'s). `Ok(true)`: the
    /// step's effect is complete; `Ok(false)`: the first half of a two-call step happened.
    pub fn exec(&self, s: &mut State, r: usize, step: &MStep) -> Result<bool, Fail> {
        let v = self.sc.variant;
        let node = s.runs[r].node;
        let idx = s.runs[r].pc;
        match step {
            MStep::Stage { at_least } => {
                let k = &mut s.kms;
                let cur = k.current.ok_or(Fail)?;
                if v == Variant::NoCompareAndSwap {
                    match s.runs[r].half.take() {
                        None => {
                            // The read: the same checks as below; the write comes later,
                            // blind.
                            if k.pending.is_none() && cur.0 >= *at_least {
                                return Err(Fail);
                            }
                            s.runs[r].half = Some(k.pending);
                            return Ok(false);
                        }
                        Some(Some(_)) => return Ok(true),
                        Some(None) => {
                            if k.pending.is_some() {
                                s.pending_replaced = true;
                            }
                            let m = fresh(&mut s.next_mat, &mut s.bound_hit);
                            s.kms.pending = Some((cur.0 + 1, m));
                            return Ok(true);
                        }
                    }
                }
                if k.pending.is_none() && cur.0 >= *at_least {
                    return Err(Fail);
                }
                if k.pending.is_none() {
                    let m = fresh(&mut s.next_mat, &mut s.bound_hit);
                    s.kms.pending = Some((cur.0 + 1, m));
                }
                Ok(true)
            }
            MStep::Add {
                dev,
                slot,
                ver,
                unlock,
            } => {
                let mat = Self::material_of(&s.kms, *ver).ok_or(Fail)?;
                let d = &mut s.devs[*dev as usize];
                if d.iter()
                    .flatten()
                    .any(|k| k.rec == Some(*ver) && k.mat == mat)
                {
                    s.runs[r].half = None;
                    return Ok(true);
                }
                match (&mut d[*slot as usize], s.runs[r].half.is_some()) {
                    (Some(k), _) if k.rec.is_none() && k.mat == mat && k.bound => {
                        // The keyslot was added; record it.
                        k.rec = Some(*ver);
                        s.runs[r].half = None;
                        Ok(true)
                    }
                    (Some(_), _) => Err(Fail),
                    (None, _) => {
                        let can_unlock = Self::opens(d, *unlock)
                            && (*unlock == INSTALL || Self::kms_materials(s).contains(unlock));
                        if !can_unlock {
                            return Err(Fail);
                        }
                        let d = &mut s.devs[*dev as usize];
                        d[*slot as usize] = Some(Slot {
                            mat,
                            bound: true,
                            rec: None,
                            rec_dest: false,
                            failed: false,
                            resalted: false,
                            by_hand: false,
                            reported: false,
                        });
                        s.runs[r].half = Some(None);
                        Ok(false)
                    }
                }
            }
            MStep::Verify { dev, slot, ver } => {
                let key = Self::key_view(s).clone();
                let mat = Self::material_of(&key, *ver);
                let d = &mut s.devs[*dev as usize];
                match &mut d[*slot as usize] {
                    Some(k) if k.rec == Some(*ver) && k.bound && Some(k.mat) == mat => {
                        s.runs[r].verified_here.insert(idx);
                        Ok(true)
                    }
                    // The engine stops the run; the record stays until `apply --verify`.
                    _ => Err(Fail),
                }
            }
            MStep::Vote { ver } => {
                if s.kms.pending.map(|p| p.0) != Some(*ver) {
                    return Err(Fail);
                }
                s.kms.votes.insert((node, *ver));
                Ok(true)
            }
            MStep::Unvote { ver } => {
                s.kms.votes.remove(&(node, *ver));
                Ok(true)
            }
            MStep::Commit { expected, ver } => {
                let peers: Vec<u8> = self.plan_nodes(s).filter(|p| *p != node).collect();
                let k = &mut s.kms;
                if v == Variant::NoCompareAndSwap {
                    match s.runs[r].half.take() {
                        None => {
                            // The read, with the same checks as below; the write comes
                            // later, blind.
                            let cur = k.current.ok_or(Fail)?;
                            if cur.0 == *ver {
                                return Ok(true);
                            }
                            let p = k.pending.ok_or(Fail)?;
                            let voted = peers.iter().all(|n| k.votes.contains(&(*n, *ver)));
                            if cur.0 != *expected || p.0 != *ver || !voted {
                                return Err(Fail);
                            }
                            s.runs[r].half = Some(Some(p));
                            return Ok(false);
                        }
                        Some(None) => return Err(Fail),
                        Some(Some(p)) => {
                            if k.current.map(|c| c.0) != Some(*expected) {
                                s.lost_update = true;
                            }
                            if let Some(old) = k.previous {
                                s.retired.insert(old.1);
                            }
                            k.previous = k.current;
                            k.current = Some(p);
                            k.pending = None;
                            return Ok(true);
                        }
                    }
                }
                let cur = k.current.ok_or(Fail)?;
                if cur.0 == *ver {
                    return Ok(true);
                }
                if cur.0 != *expected {
                    return Err(Fail);
                }
                let p = k.pending.ok_or(Fail)?;
                if p.0 != *ver {
                    return Err(Fail);
                }
                if v != Variant::CommitBeforeAllVerified
                    && !peers.iter().all(|n| k.votes.contains(&(*n, *ver)))
                {
                    return Err(Fail);
                }
                // The commit retires the previous version (the engine: the retire step after
                // it). A search for its copies that only the interrupted process made is made
                // again first: the operator may have added a keyslot since.
                if v != Variant::TrustJournaledCopySearch {
                    let again: Vec<MStep> = s.journal[node as usize]
                        .as_ref()
                        .map(|j| {
                            j.steps
                                .iter()
                                .enumerate()
                                .filter(|(i, st)| {
                                    matches!(st, MStep::FindCopies { .. })
                                        && j.done[*i]
                                        && !s.runs[r].verified_here.contains(&(*i as u8))
                                })
                                .map(|(_, st)| st.clone())
                                .collect()
                        })
                        .unwrap_or_default();
                    for st in again {
                        self.exec(s, r, &st)?;
                    }
                }
                let k = &mut s.kms;
                if let Some(old) = k.previous {
                    s.retired.insert(old.1);
                }
                k.previous = k.current;
                k.current = Some(p);
                k.pending = None;
                Ok(true)
            }
            MStep::Kill {
                dev,
                slot,
                holder,
                anchor,
            } => {
                let d = &s.devs[*dev as usize];
                let Some(k) = &d[*slot as usize] else {
                    return Ok(true);
                };
                if k.rec != Some(*holder) {
                    return Err(Fail);
                }
                if v != Variant::KillWithoutAnchor {
                    let Some(a) = anchor else { return Err(Fail) };
                    let journaled = s.journal[node as usize]
                        .as_ref()
                        .is_some_and(|j| j.done.get(*a as usize) == Some(&true));
                    let here = s.runs[r].verified_here.contains(a);
                    let Some(MStep::Verify {
                        dev: adev,
                        slot: aslot,
                        ver: aver,
                    }) = s.journal[node as usize]
                        .as_ref()
                        .and_then(|j| j.steps.get(*a as usize))
                        .cloned()
                    else {
                        return Err(Fail);
                    };
                    if !here {
                        if !journaled {
                            return Err(Fail);
                        }
                        if v != Variant::TrustJournaledAnchors {
                            // The interrupted process verified the anchor: verify it again
                            // before relying on it.
                            let mat = Self::material_of(Self::key_view(s), aver);
                            let ok = d[aslot as usize]
                                .as_ref()
                                .is_some_and(|k| k.bound && Some(k.mat) == mat);
                            if !ok {
                                return Err(Fail);
                            }
                            s.runs[r].verified_here.insert(*a);
                        }
                    }
                    let d = &s.devs[*dev as usize];
                    if adev != *dev
                        || aslot == *slot
                        || !d[aslot as usize].as_ref().is_some_and(|a| a.bound)
                    {
                        return Err(Fail);
                    }
                }
                let d = &s.devs[*dev as usize];
                let others_bound = d
                    .iter()
                    .enumerate()
                    .any(|(i, x)| i != *slot as usize && x.as_ref().is_some_and(|x| x.bound));
                if !others_bound {
                    return Err(Fail);
                }
                let mats = Self::kms_materials(s);
                let before = mats.iter().any(|m| Self::opens(&s.devs[*dev as usize], *m));
                let k = s.devs[*dev as usize][*slot as usize].take();
                if k.is_some_and(|k| k.mat == INSTALL || k.mat == FOREIGN) {
                    s.collateral = true;
                }
                let after = mats.iter().any(|m| Self::opens(&s.devs[*dev as usize], *m));
                if before && !after {
                    s.lockout_by_kill = true;
                }
                Ok(true)
            }
            MStep::Adopt { dev, slot } => {
                let cur = s.kms.current.ok_or(Fail)?;
                match &mut s.devs[*dev as usize][*slot as usize] {
                    Some(k) if k.rec == Some(cur.0) => Ok(true),
                    Some(k) if k.rec.is_none() && k.bound && k.mat == cur.1 => {
                        k.rec = Some(cur.0);
                        Ok(true)
                    }
                    _ => Err(Fail),
                }
            }
            MStep::Forget { dev, slot } => {
                if let Some(k) = &mut s.devs[*dev as usize][*slot as usize] {
                    k.rec = None;
                    k.failed = false;
                    k.resalted = false;
                }
                Ok(true)
            }
            MStep::Resalt { dev, slot } => {
                let key = Self::key_view(s).clone();
                match &mut s.devs[*dev as usize][*slot as usize] {
                    Some(k) if !k.resalted => Ok(true),
                    Some(k)
                        if k.bound
                            && k.rec
                                .is_some_and(|ver| Self::material_of(&key, ver) == Some(k.mat)) =>
                    {
                        k.resalted = false;
                        Ok(true)
                    }
                    _ => Err(Fail),
                }
            }
            MStep::FindCopies { dev, ver } => {
                if let Some(mat) = Self::material_of(&s.kms, *ver) {
                    for k in s.devs[*dev as usize].iter_mut().flatten() {
                        if k.rec.is_none() && k.bound && k.mat == mat {
                            k.reported = true;
                        }
                    }
                }
                s.runs[r].verified_here.insert(idx);
                Ok(true)
            }
            MStep::MigrateCopy => {
                let o = s.origin.as_ref().ok_or(Fail)?;
                if s.kms.current.is_none() {
                    s.kms.current = o.current;
                }
                Ok(true)
            }
            MStep::Rerecord { dev, slot } => {
                // The verify before it (in this run) checked the copy opens the keyslot.
                let verified = idx > 0 && s.runs[r].verified_here.contains(&(idx - 1));
                let journaled = idx > 0
                    && s.journal[node as usize]
                        .as_ref()
                        .is_some_and(|j| j.done[idx as usize - 1]);
                if !(verified || journaled) {
                    return Err(Fail);
                }
                if let Some(k) = &mut s.devs[*dev as usize][*slot as usize] {
                    k.rec_dest = true;
                }
                Ok(true)
            }
            MStep::DestroyOrigin => {
                // Only once every device of the plan holds a record in the destination.
                let Some(o) = &s.origin else { return Ok(true) };
                let Some(cur) = o.current else {
                    return Err(Fail);
                };
                let all = (0..self.sc.devices.len())
                    .filter(|d| !s.released.contains(&self.dev_node(*d)))
                    .all(|d| {
                        s.devs[d]
                            .iter()
                            .flatten()
                            .any(|k| k.rec == Some(cur.0) && k.rec_dest)
                    });
                if !all || s.kms.current != o.current {
                    return Err(Fail);
                }
                s.origin = None;
                Ok(true)
            }
        }
    }

    /// Ends run `r` (lock released, Lease released); `failed`: the journal marks the run
    /// ended (a failed step); else it ended because every step is done.
    fn end_run(&self, s: &mut State, r: usize) {
        let run = s.runs.remove(r);
        let n = run.node as usize;
        if run.phase != Phase::Start {
            s.locked[n] = false;
            s.journal[n] = None;
        }
        if !s
            .runs
            .iter()
            .any(|x| x.node == run.node && x.phase != Phase::Start)
        {
            s.leases.remove(&run.node);
        }
    }

    /// The first step of `node`'s journal not yet done.
    fn first_undone(s: &State, node: u8) -> Option<u8> {
        let j = s.journal[node as usize].as_ref()?;
        j.done.iter().position(|d| !d).map(|i| i as u8)
    }

    /// Applies one action; `None` when it is not enabled.
    fn act(&self, s: &State, a: &Action) -> Option<State> {
        let mut s = s.clone();
        match a {
            Action::Start(n) => {
                if s.lost.contains(n) || s.released.contains(n) {
                    return None;
                }
                let live = s.runs.iter().filter(|r| r.node == *n).count();
                if live >= 2 || (live == 1 && !(self.sc.second_run && *n == 0)) {
                    return None;
                }
                if live == 1 {
                    if s.second_started {
                        return None;
                    }
                    s.second_started = true;
                }
                s.runs.push(Run {
                    node: *n,
                    phase: Phase::Start,
                    pc: 0,
                    half: None,
                    verified_here: BTreeSet::new(),
                });
            }
            Action::Lock(r) => {
                let n = s.runs[*r].node as usize;
                if s.locked[n] {
                    // `keyplan apply` exits: another run holds the state lock (I5).
                    s.runs.remove(*r);
                } else {
                    s.locked[n] = true;
                    s.runs[*r].phase = Phase::Locked;
                }
            }
            Action::Plan(r) => {
                let node = s.runs[*r].node;
                if let Some(pc) = Self::first_undone(&s, node) {
                    s.runs[*r].pc = pc;
                    s.runs[*r].phase = Phase::Planned;
                } else {
                    s.journal[node as usize] = None;
                    let steps = self.plan(&s, node);
                    if steps.is_empty() {
                        self.end_run(&mut s, *r);
                        return Some(s);
                    }
                    let n = steps.len();
                    s.journal[node as usize] = Some(Journal {
                        steps,
                        done: vec![false; n],
                    });
                    s.runs[*r].pc = 0;
                    s.runs[*r].phase = Phase::Planned;
                }
                if !self.fleet() {
                    s.runs[*r].phase = Phase::Running;
                }
            }
            Action::TakeLease(r) => {
                let node = s.runs[*r].node;
                if !s.leases.contains(&node)
                    && s.leases.len() >= self.sc.max_concurrent_nodes as usize
                {
                    return None;
                }
                s.leases.insert(node);
                s.runs[*r].phase = Phase::Running;
            }
            Action::Step(r) => {
                let node = s.runs[*r].node;
                let pc = s.runs[*r].pc as usize;
                let step = s.journal[node as usize].as_ref()?.steps.get(pc)?.clone();
                match self.exec(&mut s, *r, &step) {
                    // A verify writes nothing: a crash before its done marker is the same as
                    // a crash before it, so it is marked in the same action.
                    Ok(true) if matches!(step, MStep::Verify { .. }) => {
                        return self.act(&s, &Action::Mark(*r));
                    }
                    Ok(true) => s.runs[*r].phase = Phase::Marking,
                    Ok(false) => {}
                    Err(Fail) => self.end_run(&mut s, *r),
                }
            }
            Action::Mark(r) => {
                let node = s.runs[*r].node as usize;
                let pc = s.runs[*r].pc as usize;
                let j = s.journal[node].as_mut()?;
                j.done[pc] = true;
                if pc + 1 == j.done.len() {
                    self.end_run(&mut s, *r);
                } else {
                    s.runs[*r].pc += 1;
                    s.runs[*r].phase = Phase::Running;
                }
            }
            Action::Crash(r) => {
                if s.crashes >= self.sc.max_crashes {
                    return None;
                }
                s.crashes += 1;
                let run = s.runs.remove(*r);
                if run.phase != Phase::Start {
                    s.locked[run.node as usize] = false;
                }
            }
            Action::Expire(n) => {
                if !s.leases.contains(n) || s.runs.iter().any(|r| r.node == *n) {
                    return None;
                }
                s.leases.remove(n);
            }
            Action::Lose(n) => {
                if !self.sc.lose_node || *n + 1 != self.sc.nodes || s.lost.contains(n) {
                    return None;
                }
                s.runs.retain(|r| r.node != *n);
                s.locked[*n as usize] = false;
                s.lost.insert(*n);
            }
            Action::Release(n) => {
                if !s.lost.contains(n) || s.released.contains(n) {
                    return None;
                }
                s.released.insert(*n);
                s.kms.votes.retain(|(x, _)| x != n);
            }
            Action::Damage(d, i) => {
                let node = self.dev_node(*d as usize);
                if !self.sc.silent_damage
                    || s.damaged.is_some()
                    || s.runs
                        .iter()
                        .any(|r| r.node == node && r.phase != Phase::Start)
                {
                    return None;
                }
                let mats = Self::kms_materials(&s);
                let sl = s.devs[*d as usize][*i as usize].as_mut()?;
                if sl.rec.is_none() || !mats.contains(&sl.mat) {
                    return None;
                }
                sl.mat = GARBAGE;
                s.damaged = Some(*d);
            }
            Action::Convert(d, i) => {
                let node = self.dev_node(*d as usize);
                let live = s
                    .runs
                    .iter()
                    .any(|r| r.node == node && r.phase != Phase::Start);
                if !self.sc.operator || s.converted || live {
                    return None;
                }
                let mats = Self::kms_materials(&s);
                let sl = s.devs[*d as usize][*i as usize].as_mut()?;
                if sl.rec.is_none() || sl.resalted || !mats.contains(&sl.mat) {
                    return None;
                }
                sl.resalted = true;
                s.converted = true;
            }
            Action::Copy(d, previous) => {
                let node = self.dev_node(*d as usize);
                let live = s
                    .runs
                    .iter()
                    .any(|r| r.node == node && r.phase != Phase::Start);
                if !self.sc.operator || s.copied || live {
                    return None;
                }
                let version = if *previous {
                    s.kms.previous?
                } else {
                    s.kms.current?
                };
                let free = Self::free_slot(&s.devs[*d as usize], &[])?;
                s.devs[*d as usize][free as usize] = Some(Slot {
                    mat: version.1,
                    bound: true,
                    rec: None,
                    rec_dest: false,
                    failed: false,
                    resalted: false,
                    by_hand: true,
                    reported: false,
                });
                s.copied = true;
            }
            Action::ExternalStage => {
                if !self.sc.external_stage || s.external_done || s.kms.pending.is_some() {
                    return None;
                }
                let cur = s.kms.current?;
                let m = fresh(&mut s.next_mat, &mut s.bound_hit);
                s.kms.pending = Some((cur.0 + 1, m));
                s.external_done = true;
            }
        }
        s.runs.sort_by_key(|r| (r.node, r.phase as u8, r.pc));
        Some(s)
    }

    /// I1: the KMS's current version (of the KMS a device's record names, during a migration)
    /// opens a bound keyslot of every device of the plan that holds the key, across nodes.
    pub fn i1(&self, s: &State) -> bool {
        (0..self.sc.devices.len()).all(|d| {
            // Silent damage itself can break I1 on its device; keyplan must not elsewhere.
            if s.released.contains(&self.dev_node(d)) || s.damaged == Some(d as u8) {
                return true;
            }
            let slots = &s.devs[d];
            let holds = slots.iter().flatten().any(|k| k.rec.is_some())
                || slots
                    .iter()
                    .flatten()
                    .any(|k| k.mat != INSTALL && k.mat != FOREIGN);
            if !holds {
                return true;
            }
            let mut currents = vec![];
            if let Some(c) = s.kms.current {
                currents.push(c.1);
            }
            if let Some(c) = s.origin.as_ref().and_then(|o| o.current) {
                currents.push(c.1);
            }
            // During a migration both KMS hold the same material; otherwise one current.
            currents.iter().all(|m| Self::opens(slots, *m)) && !currents.is_empty()
        })
    }

    /// I8: no bound keyslot of a device of the plan opens with a version the KMS retired,
    /// unless keyplan reported it as a copy it did not make.
    pub fn i8(&self, s: &State) -> bool {
        (0..self.sc.devices.len())
            .filter(|d| !s.released.contains(&self.dev_node(*d)))
            .all(|d| {
                s.devs[d]
                    .iter()
                    .flatten()
                    .all(|k| !(k.bound && s.retired.contains(&k.mat)) || k.reported)
            })
    }

    /// I4: the install and foreign keyslots are never killed, and no device is left without a
    /// bound keyslot.
    pub fn i4(&self, s: &State) -> bool {
        !s.collateral && s.devs.iter().all(|d| d.iter().flatten().any(|k| k.bound))
    }

    /// Convergence: from this state, killing every live run and then running `keyplan apply`
    /// on every node in turn, without crashes or other writers (lost nodes released by the
    /// operator; after silent damage, the first apply is `apply --verify`), reaches the plan.
    pub fn converges(&self, s: &State) -> bool {
        self.resume_to_end(s).is_ok()
    }

    /// The crash-free resume from `s`: its end state, or why it did not reach the plan.
    pub fn resume_to_end(&self, s: &State) -> Result<State, String> {
        let mut s = s.clone();
        s.runs.clear();
        for n in 0..self.sc.nodes as usize {
            s.locked[n] = false;
        }
        let lost: Vec<u8> = s.lost.iter().copied().collect();
        for n in lost {
            s.released.insert(n);
            s.kms.votes.retain(|(x, _)| *x != n);
        }
        s.leases.clear();
        if s.damaged.is_some() {
            // After silent damage the operator's first `apply` is `keyplan apply --verify`
            // (the run that failed says so): every record is tested, and records whose
            // version does not open their keyslot are dropped.
            let key = Self::key_view(&s).clone();
            for d in s.devs.iter_mut() {
                for k in d.iter_mut().flatten() {
                    if let Some(ver) = k.rec {
                        if Self::material_of(&key, ver) != Some(k.mat) {
                            k.failed = true;
                        }
                    }
                }
            }
        }
        for _round in 0..8 {
            let mut changed = false;
            for n in self.plan_nodes(&s.clone()).collect::<Vec<_>>() {
                // Up to three applies per node per round (a failed step ends a run).
                for _ in 0..3 {
                    let before = s.clone();
                    s.runs.push(Run {
                        node: n,
                        phase: Phase::Start,
                        pc: 0,
                        half: None,
                        verified_here: BTreeSet::new(),
                    });
                    let mut guard = 0;
                    while let Some(i) = s.runs.iter().position(|r| r.node == n) {
                        guard += 1;
                        if guard > 200 {
                            return Err("a run did not end".into());
                        }
                        let a = match s.runs[i].phase {
                            Phase::Start => Action::Lock(i),
                            Phase::Locked => Action::Plan(i),
                            Phase::Planned => Action::TakeLease(i),
                            Phase::Running => Action::Step(i),
                            Phase::Marking => Action::Mark(i),
                        };
                        s = self
                            .act(&s, &a)
                            .ok_or_else(|| format!("{a:?} not enabled in a resume"))?;
                    }
                    if s == before {
                        break;
                    }
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        self.goal(&s)?;
        Ok(s)
    }

    /// The plan is reached: every rotation done, nothing pending, no vote, no journaled run,
    /// each device of the plan holds exactly one recorded keyslot (the current version,
    /// opening it) beside its install and foreign keyslots.
    pub fn goal(&self, s: &State) -> Result<(), String> {
        if s.origin.is_some() && !(self.kept_in_origin() && self.migrated(s)) {
            return Err("the origin KMS still holds the key".into());
        }
        let cur = s.kms.current.ok_or("no current version")?;
        if cur.0 < 1 + self.sc.rotations {
            return Err(format!("current is v{}: not rotated", cur.0));
        }
        if s.kms.pending.is_some() || !s.kms.votes.is_empty() {
            return Err(format!(
                "pending {:?}, votes {:?}",
                s.kms.pending, s.kms.votes
            ));
        }
        if (0..self.sc.nodes).any(|n| !s.released.contains(&n) && s.journal[n as usize].is_some()) {
            return Err("a journaled run is unfinished".into());
        }
        for d in 0..self.sc.devices.len() {
            if s.released.contains(&self.dev_node(d)) {
                continue;
            }
            let slots = &s.devs[d];
            let recs: Vec<&Slot> = slots.iter().flatten().filter(|k| k.rec.is_some()).collect();
            let ok = recs.len() == 1 && recs[0].rec == Some(cur.0) && recs[0].mat == cur.1;
            let extra = slots.iter().flatten().any(|k| {
                k.rec.is_none() && !k.by_hand && ![INSTALL, FOREIGN, GARBAGE].contains(&k.mat)
            });
            if slots.iter().flatten().any(|k| k.resalted) {
                return Err(format!("device {d}: a re-salted record stands: {slots:?}"));
            }
            if !ok || extra {
                return Err(format!("device {d}: {slots:?}"));
            }
            if d == 0 && !slots.iter().flatten().any(|k| k.mat == FOREIGN) {
                return Err("the foreign keyslot is gone".into());
            }
        }
        Ok(())
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.init()]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        for n in 0..self.sc.nodes {
            out.push(Action::Start(n));
            out.push(Action::Expire(n));
            out.push(Action::Lose(n));
            out.push(Action::Release(n));
        }
        for (i, r) in s.runs.iter().enumerate() {
            out.push(match r.phase {
                Phase::Start => Action::Lock(i),
                Phase::Locked => Action::Plan(i),
                Phase::Planned => Action::TakeLease(i),
                Phase::Running => Action::Step(i),
                Phase::Marking => Action::Mark(i),
            });
            out.push(Action::Crash(i));
        }
        if self.sc.silent_damage && s.damaged.is_none() {
            for d in 0..s.devs.len() {
                for i in 0..SLOTS {
                    out.push(Action::Damage(d as u8, i as u8));
                }
            }
        }
        if self.sc.external_stage {
            out.push(Action::ExternalStage);
        }
        if self.sc.operator {
            for d in 0..s.devs.len() {
                if !s.copied {
                    out.push(Action::Copy(d as u8, false));
                    out.push(Action::Copy(d as u8, true));
                }
                if !s.converted {
                    for i in 0..SLOTS {
                        out.push(Action::Convert(d as u8, i as u8));
                    }
                }
            }
        }
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        self.act(s, &a)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("I1 current opens every device", |m: &Self, s: &State| {
                m.i1(s)
            }),
            Property::always("no kill locks a device out", |_, s: &State| {
                !s.lockout_by_kill
            }),
            Property::always("I4 no collateral", |m: &Self, s: &State| m.i4(s)),
            Property::always("I5 one writer per node", |m: &Self, s: &State| {
                (0..m.sc.nodes).all(|n| {
                    s.runs
                        .iter()
                        .filter(|r| r.node == n && r.phase != Phase::Start)
                        .count()
                        <= 1
                })
            }),
            Property::always("I5 no lost update", |_, s: &State| !s.lost_update),
            Property::always("no second pending version", |_, s: &State| {
                !s.pending_replaced
            }),
            Property::always("Leases bound the rollout", |m: &Self, s: &State| {
                let writing: BTreeSet<u8> = s
                    .runs
                    .iter()
                    .filter(|r| matches!(r.phase, Phase::Running | Phase::Marking))
                    .map(|r| r.node)
                    .collect();
                !m.fleet() || writing.len() <= m.sc.max_concurrent_nodes as usize
            }),
            Property::always("converges", |m: &Self, s: &State| m.converges(s)),
            Property::always(
                "I8 a retired version opens nothing unreported",
                |m: &Self, s: &State| m.i8(s),
            ),
            Property::always("no unasked-for version", |_, s: &State| !s.bound_hit),
            Property::always(
                "a departed device opens with what a KMS holds",
                |m: &Self, s: &State| !m.sc.departed || Self::kms_materials(s).contains(&DEPARTED),
            ),
            Property::sometimes("a rotation commits", |m: &Self, s: &State| {
                s.kms.current.is_some_and(|c| c.0 > 1)
                    || (m.sc.migrate && (s.origin.is_none() || m.migrated(s)))
            }),
        ]
    }
}
