//! A deterministic simulation of the real engine (docs/verification.md, "Part 2").
//!
//! The real planner, executor and journal (`keyplan::ops`: `ApplySession`, the same calls the
//! CLI's `apply --auto-approve` makes) run against the in-memory doors of [`doors`]. Each
//! simulated keyplan **process** is an OS thread, but only one runs at a time: it holds the
//! *baton*, and every door call is a turn at which a seeded choice stream picks which waiting
//! process goes next (processes of several nodes interleave at every LUKS and KMS call,
//! including between the read and the compare-and-swap write of a KMS update) and what fault
//! the call meets:
//!
//! | fault | what happens |
//! |---|---|
//! | crash before / after | the process dies before the call's effect, or after it with the reply lost; its state directory is put back as it was at that instant (process state lost, disk state kept) |
//! | error before | the call fails without effect (LUKS: an I/O error; KMS: unavailable) |
//! | error after | the effect happens, the reply is an error (a lost reply) |
//! | torn add | the added keyslot holds other bytes than the passphrase given (silent damage) |
//! | another writer | before the call, another writer writes the KMS key: stages a version of its own (only while the first rotation has not committed), or rewrites the key unchanged (a revision bump, so a compare-and-swap in flight fails) |
//! | silent damage | at the start of a round (no process live), a keyslot keyplan added stops opening, if the device still opens without it |
//!
//! A round starts one `apply` per node (sometimes two on one node at once: the second must be
//! refused by the state lock, or run after the first); a crashed process's node resumes in the
//! next round. I1 is checked after every door call, and "no write locks a device out" after
//! every write; at the end (fault-free rounds until every node's `plan` is empty, at most
//! [`MAX_ROUNDS`]; with `--verify` once a keyslot was torn or damaged) convergence is checked. The schedule is
//! the choice stream: the same seed gives the same run, and a failing stream is shrunk
//! ([`minimise`]) to the few non-default choices that still fail, printed as a trace.

#![allow(dead_code)] // each test binary uses a part

pub mod doors;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use keyplan::kms::{Kms, KmsError};
use keyplan::luks::{LuksError, LuksVersion};
use keyplan::ops::apply::{ApplySession, RunOptions};
use keyplan::ops::plan::{PlanOutcome, PlanRequest};
use keyplan::ops::Engine;
use keyplan::spec::Plan;
use keyplan::world::World as EngineWorld;
use rand::{Rng, SeedableRng};

use doors::{MemDev, MemKey, SimKms, SimLuks};

/// Rounds of `apply` per schedule at most (faults only in the first [`FAULT_ROUNDS`]).
pub const MAX_ROUNDS: usize = 14;
/// Rounds in which faults may be injected.
pub const FAULT_ROUNDS: usize = 5;
/// Chance of silent damage to one keyslot keyplan added, at the start of a round, in per mille.
const DAMAGE_PER_MILLE: u32 = 150;
/// Chance of an operator's change at the start of a round in scenarios that allow them
/// ([`Scenario::operator`]), in per mille: `cryptsetup luksConvertKey` of a managed keyslot
/// (same passphrase, new salt), or a copy of a key version added by hand into a free keyslot.
const OPERATOR_PER_MILLE: u32 = 300;
/// Chance of a fault at one reading door call, in per mille (writes: three times this), while
/// the schedule's budget lasts.
const FAULT_PER_MILLE: u32 = 40;

/// What the simulated world holds: the devices and the KMS keys.
#[derive(Default, Clone)]
pub struct World {
    /// Devices by path.
    pub devices: BTreeMap<PathBuf, MemDev>,
    /// KMS keys by `<KMS instance>/<name in the KMS>` (several KMS instances: a key can move).
    pub keys: BTreeMap<String, MemKey>,
    /// Salt counter (fresh salts for written keyslots).
    pub salts: u64,
}

/// One door call, as the trace shows it.
#[derive(Debug, Clone)]
pub struct Call {
    op: &'static str,
    target: String,
    slot: Option<u32>,
    write: bool,
    kms: bool,
}

impl Call {
    /// A LUKS read of `dev`.
    pub fn read(op: &'static str, dev: &Path) -> Call {
        Call {
            op,
            target: dev.display().to_string(),
            slot: None,
            write: false,
            kms: false,
        }
    }
    /// A LUKS write of `dev`.
    pub fn write(op: &'static str, dev: &Path) -> Call {
        Call {
            write: true,
            ..Call::read(op, dev)
        }
    }
    /// With a keyslot.
    pub fn slot(mut self, slot: u32) -> Call {
        self.slot = Some(slot);
        self
    }
    /// A KMS read (or the read half of a write) of key `key`.
    pub fn kms_read(op: &'static str, key: &str) -> Call {
        Call {
            op,
            target: key.to_string(),
            slot: None,
            write: false,
            kms: true,
        }
    }
    /// The compare-and-swap write half of a KMS write of key `key`.
    pub fn kms_write(op: &'static str, key: &str) -> Call {
        Call {
            write: true,
            ..Call::kms_read(op, key)
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let door = if self.kms { "kms" } else { "luks" };
        let half = match (self.kms, self.write) {
            (true, true) if self.op != "destroy-material" => " (cas write)",
            (true, false) if self.op != "read" && self.op != "get" => " (read)",
            _ => "",
        };
        write!(f, "{door} {}{half} {}", self.op, self.target)?;
        if let Some(s) = self.slot {
            write!(f, " keyslot {s}")?;
        }
        Ok(())
    }
}

/// A fault injected at a door call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// No fault.
    None,
    /// The process dies before the effect.
    CrashBefore,
    /// The process dies after the effect (reply lost).
    CrashAfter,
    /// The call fails without effect.
    ErrorBefore,
    /// The effect happens; the reply is an error.
    ErrorAfter,
    /// The added keyslot holds other bytes (silent damage).
    TornAdd,
    /// Another writer writes the KMS key first.
    OtherWriter,
}

/// Which protocol the simulated engine runs: the real one, or one with a deliberate break the
/// simulation must catch (not vacuous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// keyplan as built.
    Correct,
    /// The LUKS door answers every passphrase test of a keyslot keyplan's record names with
    /// "opens": the verify step no longer verifies, so a torn keyslot can be committed.
    VerifyLies,
    /// The KMS commits a pending version without checking that every holder voted for it
    /// (no `book::check_holders`): the cross-node commit no longer waits for the other nodes.
    CommitIgnoresVotes,
    /// The KMS's writes are not compare-and-swap: a write computed from a read overwrites
    /// whatever was written since (lost updates).
    NoCompareAndSwap,
    /// The LUKS door shows a device that left the plan ([`Scenario::departed`]) without
    /// keyplan's tokens, so the planner no longer sees the version it holds: a migration then
    /// destroys the key in the KMS it moves from, as a planner that ignores departed devices
    /// (`Observed::former`, `kept_in_origin` in src/diff/decide/migrate.rs) would.
    DepartedRecordsHidden,
    /// The KMS's `destroy_key` of a key already recorded destroyed returns at once, leaving
    /// the material an interrupted destroy left (the file KMS before issue 46).
    DestroyLeavesMaterial,
}

/// The path of a key in [`World::keys`] without its KMS instance: the key's name there
/// (the plan's key id in every scenario).
pub fn key_name(path: &str) -> &str {
    path.split_once('/').map_or(path, |(_, n)| n)
}

/// The seeded choice stream; every decision takes a fixed number of choices, so a stream
/// edited by [`minimise`] keeps the rest of the schedule in place.
struct Choices {
    rng: rand::rngs::StdRng,
    script: Option<Vec<u32>>,
    taken: Vec<u32>,
}

impl Choices {
    fn choose(&mut self, n: u32) -> u32 {
        let raw = match &self.script {
            Some(s) => s.get(self.taken.len()).copied().unwrap_or(0),
            None => self.rng.random_range(0..1000),
        };
        self.taken.push(raw);
        raw % n.max(1)
    }
}

/// One simulated process.
struct Proc {
    node: usize,
    state_dir: PathBuf,
    waiting: bool,
    done: bool,
    dead: bool,
    faultless: bool,
    /// The state directory as it was at the crash.
    snapshot: Option<PathBuf>,
    /// Whether it made a door call (it holds its node's state lock then).
    made_calls: bool,
}

impl Proc {
    fn new(node: usize, state_dir: &Path, faultless: bool) -> Proc {
        Proc {
            node,
            state_dir: state_dir.to_owned(),
            waiting: false,
            done: false,
            dead: false,
            faultless,
            snapshot: None,
            made_calls: false,
        }
    }
}

/// Counts of one schedule.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    /// Door calls made.
    pub door_calls: u64,
    /// Crashes injected.
    pub crashes: u64,
    /// Errors injected (before or after the effect).
    pub errors: u64,
    /// Torn keyslots written, and keyslots damaged between runs.
    pub torn: u64,
    /// Other writers' KMS writes.
    pub other_writes: u64,
    /// `apply` processes started.
    pub applies: u64,
    /// Applies refused because another run held the state lock.
    pub lock_refusals: u64,
    /// Rounds run.
    pub rounds: u64,
    /// Operator changes (a managed keyslot re-salted, a key version copied by hand).
    pub operator: u64,
}

struct State {
    world: World,
    procs: Vec<Proc>,
    baton: Option<usize>,
    choices: Choices,
    faults_left: u32,
    faults_on: bool,
    trace: Vec<String>,
    violation: Option<String>,
    listing: Vec<(PathBuf, String, PathBuf)>,
    torn: BTreeSet<(PathBuf, u32)>,
    /// Devices silently damaged between runs: exempt from I1 from then on (as in the model:
    /// a vote or verify made before the damage cannot see it), not from "no lockout".
    damaged: BTreeSet<PathBuf>,
    /// Whether the invariants are checked (not in the differential test's standalone door).
    checking: bool,
    /// Devices whose install keyslot (keyslot 0, the initial passphrase) the plan keeps (I4).
    keep_install: Vec<PathBuf>,
    /// Whether an apply with `--rotate` succeeded.
    rotated_any: bool,
    /// The other writer's choices of the current door call.
    writer: (u32, u32),
    initial: BTreeMap<String, Option<u64>>,
    initial_pass: Vec<u8>,
    variant: Variant,
    stats: Stats,
    snapshots: PathBuf,
    /// Managed keyslots the operator re-salted (`luksConvertKey`): (device, keyslot, new salt).
    /// Invariant I8: such a keyslot stays managed.
    converted: Vec<(PathBuf, u32, String)>,
    /// Keyslots the operator added by hand with a key version: (device, keyslot, salt). Kept
    /// under `unmanaged_keyslots: keep` (I4); reported once their version is retired (I8).
    copied: Vec<(PathBuf, u32, String)>,
    /// Devices that left the plan ([`Scenario::departed`]).
    departed: Vec<PathBuf>,
    /// Devices that must open with some version a KMS holds at every instant
    /// ([`Scenario::kms_opens`]).
    kms_opens: Vec<PathBuf>,
    /// Whether the other writer may stage a version of its own ([`Scenario::writer_stages`]).
    writer_stages: bool,
}

/// The simulation shared by every door of every process.
pub struct Sim {
    st: Mutex<State>,
    cv: Condvar,
    pbkdf: AtomicU64,
}

impl fmt::Debug for Sim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Sim")
    }
}

/// Copies directory `from` into `to` (created), recursively; a missing `from` copies nothing.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create snapshot dir");
    if let Ok(entries) = std::fs::read_dir(from) {
        for e in entries.flatten() {
            let p = e.path();
            let dest = to.join(e.file_name());
            if p.is_dir() {
                copy_dir(&p, &dest);
            } else {
                std::fs::copy(&p, &dest).expect("copy state file");
            }
        }
    }
}

impl Sim {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `n` PBKDF runs.
    pub fn pbkdf(&self, n: u64) {
        self.pbkdf.fetch_add(n, Ordering::Relaxed);
    }

    /// PBKDF runs so far (all processes).
    pub fn pbkdf_runs(&self) -> u64 {
        self.pbkdf.load(Ordering::Relaxed)
    }

    fn wait_baton<'a>(&self, p: usize, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        st.procs[p].waiting = true;
        self.cv.notify_all();
        while st.baton != Some(p) && st.violation.is_none() {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.procs[p].waiting = false;
        st
    }

    /// Hands the baton to one waiting process (a choice), or to none.
    fn pass_baton(&self, st: &mut State) {
        let waiting: Vec<usize> = (0..st.procs.len())
            .filter(|&i| st.procs[i].waiting && !st.procs[i].done)
            .collect();
        st.baton = if waiting.is_empty() {
            None
        } else {
            let i = st.choices.choose(waiting.len() as u32) as usize;
            Some(waiting[i])
        };
        self.cv.notify_all();
    }

    /// A turn of process `p` (which holds the baton): the next process is chosen among the
    /// waiting ones and `p` itself, and `p` waits for the baton again.
    fn turn<'a>(&self, p: usize, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        st.procs[p].waiting = true;
        self.pass_baton(&mut st);
        self.wait_baton(p, st)
    }

    fn enter(&self, p: usize) {
        let st = self.lock();
        drop(self.wait_baton(p, st));
    }

    fn exit(&self, p: usize) {
        let mut st = self.lock();
        st.procs[p].done = true;
        st.procs[p].waiting = false;
        if let Some(snap) = st.procs[p].snapshot.take() {
            let dir = st.procs[p].state_dir.clone();
            let _ = std::fs::remove_dir_all(&dir);
            copy_dir(&snap, &dir);
        }
        if st.baton == Some(p) || st.baton.is_none() {
            self.pass_baton(&mut st);
        }
    }

    fn decide(&self, st: &mut State, p: usize, call: &Call) -> Fault {
        let roll = st.choices.choose(1000);
        let kind = st.choices.choose(1000);
        // The other writer's two choices, drawn whether or not it writes, so that an edited
        // stream keeps every later choice in place.
        st.writer = (st.choices.choose(1000), st.choices.choose(1000));
        if !st.faults_on || st.procs[p].faultless || st.faults_left == 0 {
            return Fault::None;
        }
        let per_mille = if call.write {
            3 * FAULT_PER_MILLE
        } else {
            FAULT_PER_MILLE
        };
        if roll < 1000 - per_mille {
            return Fault::None;
        }
        let mut kinds = vec![Fault::CrashBefore, Fault::ErrorBefore, Fault::OtherWriter];
        if call.write {
            kinds.extend([Fault::CrashAfter, Fault::ErrorAfter]);
        }
        if call.op == "add" {
            kinds.push(Fault::TornAdd);
        }
        // A destroy is split between its two calls by a crash only: an error between them (a
        // lost reply of the record write, a failed removal of the material) fails the run, and
        // no later run destroys again (docs/verification.md, "What the simulation does not
        // cover").
        if call.op.starts_with("destroy") && call.write {
            kinds.retain(|k| *k != Fault::ErrorAfter);
        }
        if call.op == "destroy-material" {
            kinds.retain(|k| *k != Fault::ErrorBefore);
        }
        st.faults_left -= 1;
        kinds[kind as usize % kinds.len()]
    }

    fn crash(&self, st: &mut State, p: usize) {
        st.stats.crashes += 1;
        let n = st.stats.crashes;
        let snap = st.snapshots.join(format!("crash-{p}-{n}"));
        let dir = st.procs[p].state_dir.clone();
        copy_dir(&dir, &snap);
        st.procs[p].snapshot = Some(snap);
        st.procs[p].dead = true;
    }

    fn other_writer(st: &mut State) {
        st.stats.other_writes += 1;
        let names: Vec<String> = st.world.keys.keys().cloned().collect();
        if names.is_empty() {
            return;
        }
        let pick = st.writer.0 as usize % names.len();
        let stage = st.writer.1.is_multiple_of(2);
        let name = &names[pick];
        let initial = st.initial.get(name).copied().flatten();
        let Some(k) = st.world.keys.get_mut(name) else {
            return;
        };
        // Never into a key no run created (a failed first write left it empty): that would be
        // a move into an occupied KMS, which `plan` refuses.
        if stage
            && st.writer_stages
            && !k.versions.is_empty()
            && k.pending.is_none()
            && k.current == initial
        {
            // Another run starts the same rotation: a pending version of its own.
            let v = k.versions.iter().map(|v| v.version).max().unwrap_or(0) + 1;
            k.material
                .insert(v, format!("other-writer-{name}-v{v}").into_bytes());
            k.pending = Some(v);
            k.versions.push(keyplan::kms::VersionInfo {
                version: v,
                created_at: 1_800_000_000,
                state: keyplan::kms::VersionState::Pending,
            });
            st.trace
                .push(format!("    another writer stages {name} v{v}"));
        } else {
            st.trace.push(format!(
                "    another writer rewrites {name} (revision bump)"
            ));
        }
        k.revision += 1;
    }

    /// I1 (across nodes), on the world as it is now. A device holds a key when keyplan's
    /// record (a LUKS2 token, or the LUKS1 record file in the node's state directory) names
    /// the key, at a committed version, on one of its keyslots that the schedule did not
    /// tear; a device damaged between runs is exempt (silent damage is the operator's to
    /// answer with `apply --verify`).
    fn check(st: &mut State) {
        if st.violation.is_some() || !st.checking {
            return;
        }
        for dev in &st.keep_install {
            let kept = st.world.devices.get(dev).is_some_and(|d| {
                d.slots
                    .get(&0)
                    .is_some_and(|s| s.seq == 0 && s.pass == st.initial_pass)
            });
            if !kept {
                st.violation = Some(format!(
                    "I4 broken: the install keyslot 0 of {}, which the plan keeps, was removed or rewritten",
                    dev.display()
                ));
                return;
            }
        }
        for (dev, key, luks1_dir) in st.listing.clone() {
            let Some(d) = st.world.devices.get(&dev) else {
                continue;
            };
            if st.damaged.contains(&dev) {
                continue;
            }
            // The KMS key a record names (during a migration, the old KMS's or the new one's).
            for (slot, rk, v, entry) in records(d, &luks1_dir) {
                let path = entry.unwrap_or_else(|| key.clone());
                let Some(k) = st.world.keys.get(&path) else {
                    continue;
                };
                let Some(m) = k.current_material() else {
                    continue;
                };
                // A record of the pending version is an enrollment in progress, not yet held.
                let held = rk == key_name(&key)
                    && k.pending != Some(v)
                    && k.current.is_some_and(|c| v <= c)
                    && d.slots.contains_key(&slot)
                    && !st.torn.contains(&(dev.clone(), slot));
                if held && !d.opens(m) {
                    st.violation = Some(format!(
                        "I1 broken: {} holds {path} (keyplan's record), and no bound keyslot opens with its current version v{}",
                        dev.display(),
                        k.current.unwrap_or(0)
                    ));
                    return;
                }
            }
        }
        if let Some(dev) = st.kms_opens.iter().find(|p| {
            !st.damaged.contains(*p)
                && st
                    .world
                    .devices
                    .get(*p)
                    .is_some_and(|d| !opens_with_kms(&st.world, d))
        }) {
            let why = if st.departed.contains(dev) {
                "which left the plan holding a version keyplan kept"
            } else {
                "which the plan lists"
            };
            st.violation = Some(format!(
                "I1 broken: {}, a device keyplan knows ({why}), opens with no version any KMS still holds",
                dev.display()
            ));
        }
    }

    /// "No write of keyplan locks a device out": a device that opened with some KMS version
    /// (or its initial passphrase) before the write `call` must still open after it.
    fn check_lockout(st: &mut State, before: &BTreeSet<PathBuf>, call: &Call) {
        if st.violation.is_some() || !st.checking {
            return;
        }
        for path in before {
            let Some(d) = st.world.devices.get(path) else {
                continue;
            };
            if !openable(&st.world, &st.initial_pass, d) {
                st.violation = Some(format!(
                    "locked out: after {call}, no KMS version and not the initial passphrase opens {}",
                    path.display()
                ));
                return;
            }
        }
    }

    /// The devices that open with some KMS version or the initial passphrase.
    fn openable_devices(st: &State) -> BTreeSet<PathBuf> {
        st.world
            .devices
            .iter()
            .filter(|(_, d)| openable(&st.world, &st.initial_pass, d))
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// One door call of process `p`: the turn, the fault, the effect `f`, the check.
    fn door<T, E>(
        &self,
        p: usize,
        call: Call,
        f: impl FnOnce(&mut World) -> Result<T, E>,
        dead: impl Fn() -> E,
        injected: impl Fn() -> E,
    ) -> Result<T, E> {
        let mut st = self.lock();
        if st.procs[p].dead || st.violation.is_some() {
            return Err(dead());
        }
        st = self.turn(p, st);
        if st.violation.is_some() {
            return Err(dead());
        }
        st.stats.door_calls += 1;
        st.procs[p].made_calls = true;
        let node = st.procs[p].node;
        if let Some(q) = (0..st.procs.len()).find(|&q| {
            let o = &st.procs[q];
            q != p && o.node == node && o.made_calls && !o.done && !o.dead && !o.faultless
        }) {
            if !st.procs[p].faultless {
                st.violation = Some(format!(
                    "I5 broken: processes p{q} and p{p} of node n{node} both run against the devices"
                ));
                self.cv.notify_all();
                return Err(dead());
            }
        }
        let fault = self.decide(&mut st, p, &call);
        let line = format!("p{p} n{node}: {call}");
        st.trace.push(match fault {
            Fault::None => line,
            f => format!("{line}  <- {f:?}"),
        });
        match fault {
            Fault::CrashBefore => {
                self.crash(&mut st, p);
                return Err(dead());
            }
            Fault::ErrorBefore => {
                st.stats.errors += 1;
                return Err(injected());
            }
            Fault::OtherWriter => Self::other_writer(&mut st),
            _ => {}
        }
        let before = if call.write {
            Self::openable_devices(&st)
        } else {
            BTreeSet::new()
        };
        let out = f(&mut st.world);
        if call.op == "add" && out.is_ok() {
            let key = (PathBuf::from(&call.target), call.slot.unwrap_or(u32::MAX));
            if fault == Fault::TornAdd {
                st.stats.torn += 1;
                if let Some(s) = st
                    .world
                    .devices
                    .get_mut(&key.0)
                    .and_then(|d| d.slots.get_mut(&key.1))
                {
                    s.pass = b"torn keyslot".to_vec();
                }
                st.torn.insert(key);
            } else {
                st.torn.remove(&key);
            }
        }
        Self::check(&mut st);
        Self::check_lockout(&mut st, &before, &call);
        if st.violation.is_some() {
            self.cv.notify_all();
        }
        match fault {
            Fault::CrashAfter => {
                self.crash(&mut st, p);
                Err(dead())
            }
            Fault::ErrorAfter => {
                st.stats.errors += 1;
                Err(injected())
            }
            _ => out,
        }
    }

    /// A LUKS door call (see [`Self::door`]).
    pub fn luks_door<T>(
        &self,
        p: usize,
        call: Call,
        dev: &Path,
        f: impl FnOnce(&mut World) -> Result<T, LuksError>,
    ) -> Result<T, LuksError> {
        let path = dev.to_owned();
        self.door(
            p,
            call,
            f,
            || LuksError::Device {
                path: path.clone(),
                message: "simulated crash: this process is gone".into(),
            },
            || LuksError::Device {
                path: path.clone(),
                message: "Input/output error (simulated)".into(),
            },
        )
    }

    /// The protocol variant simulated.
    pub fn variant(&self) -> Variant {
        self.lock().variant
    }

    /// Whether `dev` is a device that left the plan ([`Scenario::departed`]).
    pub fn departed(&self, dev: &Path) -> bool {
        self.lock().departed.iter().any(|d| d == dev)
    }

    /// A KMS door call (see [`Self::door`]).
    pub fn kms_door<T>(
        &self,
        p: usize,
        call: Call,
        kms: &str,
        f: impl FnOnce(&mut World) -> Result<T, KmsError>,
    ) -> Result<T, KmsError> {
        self.door(
            p,
            call,
            f,
            || KmsError::Unavailable {
                kms: kms.to_string(),
                detail: "simulated crash: this process is gone".into(),
            },
            || KmsError::Unavailable {
                kms: kms.to_string(),
                detail: "connection reset (simulated)".into(),
            },
        )
    }
}

/// At the start of a round, with the schedule's chance: the operator re-salts a keyslot
/// keyplan manages (`luksConvertKey`: same passphrase, new salt and KDF), or copies a key
/// version by hand (the previous one, else the current one) into a free keyslot of a device
/// whose plan keeps unmanaged keyslots. Takes three choices either way.
fn operator_change(st: &mut State, sc: &Scenario) {
    let roll = st.choices.choose(1000);
    let what = st.choices.choose(2);
    let pick = st.choices.choose(1000) as usize;
    if !st.faults_on || roll < 1000 - OPERATOR_PER_MILLE {
        return;
    }
    if what == 0 {
        let mut managed: Vec<(PathBuf, u32)> = Vec::new();
        for (dev, key, luks1_dir) in &sc.listing {
            let (Some(d), Some(k)) = (st.world.devices.get(dev), st.world.keys.get(key)) else {
                continue;
            };
            for (slot, rk, v, _) in records(d, luks1_dir) {
                let real = d.slots.get(&slot).zip(k.material.get(&v));
                if rk == key_name(key) && real.is_some_and(|(s, m)| s.pass == *m) {
                    managed.push((dev.clone(), slot));
                }
            }
        }
        let Some((dev, slot)) = managed.get(pick % managed.len().max(1)).cloned() else {
            return;
        };
        st.world.salts += 1;
        let salt = format!("converted-{}", st.world.salts);
        if let Some(d) = st.world.devices.get_mut(&dev) {
            if let Some(s) = d.slots.get_mut(&slot) {
                s.salt = salt.clone();
            }
            d.epoch += 1;
        }
        st.trace.push(format!(
            "    <- operator: luksConvertKey {} keyslot {slot}",
            dev.display()
        ));
        st.converted.push((dev, slot, salt));
    } else {
        let keep: Vec<&PathBuf> = sc
            .install_keyslot
            .iter()
            .filter(|(_, keep)| *keep)
            .map(|(d, _)| d)
            .collect();
        let mut options: Vec<(PathBuf, String, u64, Vec<u8>)> = Vec::new();
        for (dev, key, _) in sc.listing.iter().filter(|(d, _, _)| keep.contains(&d)) {
            let Some(k) = st.world.keys.get(key) else {
                continue;
            };
            let previous = k
                .versions
                .iter()
                .find(|v| v.state == keyplan::kms::VersionState::Previous)
                .map(|v| v.version);
            if let Some(v) = previous.or(k.current) {
                if let Some(m) = k.material.get(&v) {
                    options.push((dev.clone(), key.clone(), v, m.clone()));
                }
            }
        }
        let Some((dev, key, v, m)) = options.get(pick % options.len().max(1)).cloned() else {
            return;
        };
        st.world.salts += 1;
        let salt = format!("copy-{}", st.world.salts);
        let Some(d) = st.world.devices.get_mut(&dev) else {
            return;
        };
        let max = if d.version == LuksVersion::Luks1 {
            8
        } else {
            32
        };
        let Some(free) = (0..max).find(|n| !d.slots.contains_key(n)) else {
            return;
        };
        let seq = d.slots.values().map(|s| s.seq).max().unwrap_or(0) + 1;
        d.slots.insert(
            free,
            doors::MemSlot {
                pass: m,
                bound: true,
                salt: salt.clone(),
                priority: keyplan::luks::Priority::Normal,
                seq,
            },
        );
        st.copied.push((dev.clone(), free, salt));
        d.epoch += 1;
        st.trace.push(format!(
            "    <- operator: copies {key} v{v} into {} keyslot {free}",
            dev.display()
        ));
    }
    st.stats.operator += 1;
}

/// Invariant I8 at the end of a schedule: no keyslot of a listed device opens with a version
/// the KMS retired, unless keyplan reported it as a copy it did not make (the node's
/// `copies.json`, by LUKS UUID, keyslot and salt); and every managed keyslot the operator
/// re-salted is still managed (recorded) or gone.
fn revoked(sc: &Scenario, st: &State) -> Result<(), String> {
    for (dev, key, luks1_dir) in &sc.listing {
        let (Some(d), Some(k)) = (st.world.devices.get(dev), st.world.keys.get(key)) else {
            continue;
        };
        let state_dir = luks1_dir.parent().unwrap_or(luks1_dir);
        let reported = keyplan::world::copies::read(state_dir).unwrap_or_default();
        for (n, s) in &d.slots {
            let Some((v, _)) = k.retired.iter().find(|(_, m)| **m == s.pass) else {
                continue;
            };
            let known = reported
                .iter()
                .any(|c| c.uuid.eq_ignore_ascii_case(&d.uuid) && c.slot == *n && c.salt == s.salt);
            if s.bound && !known {
                return Err(format!(
                    "I8 broken: {} keyslot {n} still opens with {key} v{v}, which the KMS retired, and keyplan did not report it",
                    dev.display()
                ));
            }
        }
    }
    for (dev, slot, salt) in &st.converted {
        let Some(d) = st.world.devices.get(dev) else {
            continue;
        };
        if st.torn.contains(&(dev.clone(), *slot)) {
            continue; // damaged since: it opens with nothing keyplan knows
        }
        if d.slots.get(slot).is_none_or(|s| s.salt != *salt) {
            continue;
        }
        let luks1_dir = sc
            .listing
            .iter()
            .find(|(d, _, _)| d == dev)
            .map(|(_, _, l)| l.clone())
            .unwrap_or_default();
        if !records(d, &luks1_dir).iter().any(|(n, ..)| n == slot) {
            return Err(format!(
                "I8 broken: {} keyslot {slot}, which keyplan managed and the operator re-salted (luksConvertKey, same passphrase), is no longer managed",
                dev.display()
            ));
        }
    }
    Ok(())
}

/// Whether `d` opens with any version material the KMS holds, or with `initial`.
fn openable(w: &World, initial: &[u8], d: &MemDev) -> bool {
    d.opens(initial) || opens_with_kms(w, d)
}

/// Whether `d` opens with material some KMS instance can still hand out.
fn opens_with_kms(w: &World, d: &MemDev) -> bool {
    w.keys
        .values()
        .any(|k| k.material.values().any(|m| d.opens(m)))
}

/// keyplan's records on device `d`: `(keyslot, key id, version, KMS key)` from its `keyplan`
/// LUKS2 tokens, or from the LUKS1 record file `<luks1_dir>/<uuid>.json`; the KMS key is the
/// record's `entry` as a [`World::keys`] path (`None` in a record without one).
fn records(d: &MemDev, luks1_dir: &Path) -> Vec<(u32, String, u64, Option<String>)> {
    let triple = |slot: &serde_json::Value, r: &serde_json::Value| {
        let entry = r["entry"]
            .as_array()
            .and_then(|e| Some(format!("{}/{}", e.first()?.as_str()?, e.get(1)?.as_str()?)));
        Some((
            u32::try_from(slot.as_u64()?).ok()?,
            r["key"].as_str()?.to_string(),
            r["version"].as_u64()?,
            entry,
        ))
    };
    if d.version == LuksVersion::Luks2 {
        return d
            .tokens
            .values()
            .filter(|t| t["type"] == "keyplan")
            .filter_map(|t| triple(&t["slot"], t))
            .collect();
    }
    let file = luks1_dir.join(format!("{}.json", d.uuid));
    let Ok(text) = std::fs::read(&file) else {
        return Vec::new();
    };
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    json["slots"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(n, r)| triple(&serde_json::json!(n.parse::<u64>().ok()?), r))
                .collect()
        })
        .unwrap_or_default()
}

/// One simulated node: its plan (cut to the node) and its state directory.
pub struct Node {
    /// Node name.
    pub name: String,
    /// The plan as this node's agent sees it.
    pub plan: Plan,
}

/// A scenario: the plan, the nodes, the initial world.
pub struct Scenario {
    /// Name, for the figures.
    pub name: &'static str,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// The initial devices and keys.
    pub world: fn() -> World,
    /// Keys `--rotate`d by each node's applies until one succeeds.
    pub rotate: Vec<String>,
    /// Whether a round may start two applies on one node at once.
    pub concurrent_runs: bool,
    /// (device path, KMS key name, the LUKS1 record directory of the device's node) of every
    /// key the plan lists on a device (I1's scope).
    pub listing: Vec<(PathBuf, String, PathBuf)>,
    /// The passphrase the devices open with before keyplan (enroll_with), in keyslot 0.
    pub initial_pass: Vec<u8>,
    /// Per device: whether the plan keeps its install keyslot (`unmanaged_keyslots: keep`).
    pub install_keyslot: Vec<(PathBuf, bool)>,
    /// The scratch directory (state directories, snapshots).
    pub dir: PathBuf,
    /// Whether the operator changes keyslots between rounds (invariant I8): re-salts a managed
    /// keyslot (`luksConvertKey`), or copies a key version (the previous one when there is
    /// one) by hand into a free keyslot of a device that keeps unmanaged keyslots.
    pub operator: bool,
    /// The world and the state directory (of the only node) the schedules start from, when
    /// earlier fault-free runs made them ([`prepare`]); `world` is not used then.
    pub prepared: Option<Prepared>,
    /// Devices that left the plan: keyplan's registry knows them, the plan no longer lists
    /// them, and they hold a version of a key.
    pub departed: Vec<PathBuf>,
    /// Devices that must open with some version a KMS still holds, at every instant and at
    /// the end (not the initial passphrase): every device keyplan knows of, departed ones
    /// included, once it holds a key (I1 across a migration).
    pub kms_opens: Vec<PathBuf>,
    /// Whether the other writer may stage a version of its own (else it only bumps the
    /// revision).
    pub writer_stages: bool,
}

/// A world and a state directory made by fault-free runs ([`prepare`]).
pub struct Prepared {
    /// The world after those runs.
    pub world: World,
    /// A copy of the state directory after them.
    pub state: PathBuf,
}

/// Runs `apply --auto-approve` once per phase, fault-free and unchecked, each with its plan
/// (all with one state directory and plan file) and its `--rotate` keys, on `world`; returns
/// the world after the last one. The plans' state directory is left as those runs left it.
///
/// Errors: a phase's apply failed.
pub fn prepare(world: World, phases: &[(&Plan, Vec<String>)]) -> Result<World, String> {
    let sim = Arc::new(Sim {
        st: Mutex::new(quiet_state(world, &[])),
        cv: Condvar::new(),
        pbkdf: AtomicU64::new(0),
    });
    for (i, (plan, rotate)) in phases.iter().enumerate() {
        let p = {
            let mut st = sim.lock();
            let p = st.procs.len();
            st.procs.push(Proc::new(0, &plan.state_dir, true));
            st.baton = Some(p);
            p
        };
        let engine = engine_for(&sim, p, plan);
        let out = apply_once(&engine, rotate, false);
        drop(engine);
        sim.exit(p);
        out.map_err(|e| format!("preparing, phase {}: {e}", i + 1))?;
    }
    let world = std::mem::take(&mut sim.lock().world);
    Ok(world)
}

/// What one schedule did.
pub struct Outcome {
    /// The first property broken, if any.
    pub violation: Option<String>,
    /// The door-call trace.
    pub trace: Vec<String>,
    /// The choice stream taken.
    pub choices: Vec<u32>,
    /// Counts.
    pub stats: Stats,
}

/// The CLI's `apply --auto-approve`, through the engine API: finish an interrupted run, then
/// plan and run rounds.
fn apply_once(
    engine: &Engine,
    rotate: &[String],
    verify: bool,
) -> Result<(), keyplan::error::Error> {
    let mut session = ApplySession::open(engine)?;
    let opts = RunOptions::default();
    if session.interrupted().is_some() {
        session.check_resumable()?;
        session.resume(opts, &mut |_| {})?;
    }
    let req = PlanRequest {
        rotate: rotate.to_vec(),
        verify,
        ..PlanRequest::default()
    };
    let mut unavailable = Vec::new();
    while let Some(planned) = session.next_plan(&req)? {
        unavailable.extend(planned.diff.unavailable.keys().cloned());
        if planned.diff.is_empty() {
            break;
        }
        session.run(&planned, opts, &mut |_| {})?;
    }
    // The CLI exits 1 when it had to go around a device: not a successful apply.
    if !unavailable.is_empty() {
        return Err(keyplan::error::Error::request(
            format!("device(s) {} could not be used", unavailable.join(", ")),
            None,
        ));
    }
    Ok(())
}

fn engine_for(sim: &Arc<Sim>, p: usize, plan: &Plan) -> Engine {
    let mut kms: BTreeMap<String, Box<dyn Kms>> = BTreeMap::new();
    for name in plan.kms.keys() {
        kms.insert(
            name.clone(),
            Box::new(SimKms {
                sim: Arc::clone(sim),
                proc: p,
                name: name.clone(),
            }),
        );
    }
    let luks = Arc::new(SimLuks {
        sim: Arc::clone(sim),
        proc: p,
    });
    Engine::with_world(plan.clone(), EngineWorld::with_doors(plan, luks, kms))
}

/// Runs one schedule of `sc`: from `seed`, or replaying `script` (a choice stream).
pub fn run(sc: &Scenario, seed: u64, script: Option<Vec<u32>>, variant: Variant) -> Outcome {
    let snapshots = sc.dir.join(format!("snapshots-{seed}"));
    for n in &sc.nodes {
        let _ = std::fs::remove_dir_all(&n.plan.state_dir);
    }
    let _ = std::fs::remove_dir_all(&snapshots);
    let mut choices = Choices {
        rng: rand::rngs::StdRng::seed_from_u64(seed),
        script,
        taken: Vec::new(),
    };
    let faults = choices.choose(5) + 1;
    let world = match &sc.prepared {
        Some(p) => {
            for n in &sc.nodes {
                copy_dir(&p.state, &n.plan.state_dir);
            }
            p.world.clone()
        }
        None => (sc.world)(),
    };
    let initial = world
        .keys
        .iter()
        .map(|(n, k)| (n.clone(), k.current))
        .collect();
    let sim = Arc::new(Sim {
        st: Mutex::new(State {
            world,
            procs: Vec::new(),
            baton: None,
            choices,
            faults_left: faults,
            faults_on: true,
            trace: Vec::new(),
            violation: None,
            listing: sc.listing.clone(),
            torn: BTreeSet::new(),
            damaged: BTreeSet::new(),
            checking: true,
            keep_install: sc
                .install_keyslot
                .iter()
                .filter(|(_, keep)| *keep)
                .map(|(d, _)| d.clone())
                .collect(),
            rotated_any: false,
            writer: (0, 0),
            initial,
            initial_pass: sc.initial_pass.clone(),
            variant,
            stats: Stats::default(),
            snapshots,
            converted: Vec::new(),
            copied: Vec::new(),
            departed: sc.departed.clone(),
            kms_opens: sc.kms_opens.clone(),
            writer_stages: sc.writer_stages,
        }),
        cv: Condvar::new(),
        pbkdf: AtomicU64::new(0),
    });
    Sim::check(&mut sim.lock());
    let mut rotated = vec![false; sc.nodes.len()];
    let (mut done, mut last_why) = (false, String::new());
    for round in 0..MAX_ROUNDS {
        let torn = sim.lock().stats.torn > 0;
        let started: Vec<(usize, usize)> = {
            let mut st = sim.lock();
            st.stats.rounds += 1;
            st.faults_on = round < FAULT_ROUNDS;
            st.trace.push(format!("-- round {}", round + 1));
            // Silent damage between runs (no process is live): a keyslot keyplan added stops
            // opening with its passphrase, as in the model's Damage action.
            let roll = st.choices.choose(1000);
            let pick = st.choices.choose(1000);
            if st.faults_on && st.faults_left > 0 && roll >= 1000 - DAMAGE_PER_MILLE {
                // Only keyslots without which the device still opens: damage that locks a
                // device out by itself is no test of keyplan.
                let added: Vec<(PathBuf, u32)> = st
                    .world
                    .devices
                    .iter()
                    .flat_map(|(p, d)| {
                        d.slots
                            .iter()
                            .filter(|(_, s)| s.seq > 0)
                            .map(move |(n, _)| (p.clone(), *n))
                    })
                    .filter(|(p, n)| {
                        let mut d = st.world.devices[p].clone();
                        d.slots.remove(n);
                        openable(&st.world, &st.initial_pass, &d)
                    })
                    .collect();
                if let Some((dev, slot)) = added.get(pick as usize % added.len().max(1)).cloned() {
                    if let Some(s) = st
                        .world
                        .devices
                        .get_mut(&dev)
                        .and_then(|d| d.slots.get_mut(&slot))
                    {
                        s.pass = b"silently damaged keyslot".to_vec();
                    }
                    st.faults_left -= 1;
                    st.stats.torn += 1;
                    st.trace.push(format!(
                        "    <- silent damage: {} keyslot {slot}",
                        dev.display()
                    ));
                    st.torn.insert((dev.clone(), slot));
                    st.damaged.insert(dev);
                }
            }
            if sc.operator {
                operator_change(&mut st, sc);
            }
            let mut started = Vec::new();
            for (i, n) in sc.nodes.iter().enumerate() {
                let copies = if sc.concurrent_runs && st.choices.choose(4) == 0 {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let p = st.procs.len();
                    st.procs.push(Proc::new(i, &n.plan.state_dir, false));
                    started.push((p, i));
                }
            }
            st.stats.applies += started.len() as u64;
            started
        };
        let results: Vec<(usize, Result<(), String>)> = std::thread::scope(|s| {
            let handles: Vec<_> = started
                .iter()
                .map(|&(p, i)| {
                    let sim = Arc::clone(&sim);
                    let plan = &sc.nodes[i].plan;
                    let rotate = if rotated[i] {
                        Vec::new()
                    } else {
                        sc.rotate.clone()
                    };
                    // Silent damage is answered by the operator's `apply --verify` (as in the
                    // model): once a torn keyslot was written, the fault-free rounds verify.
                    let verify = round >= FAULT_ROUNDS && torn;
                    s.spawn(move || {
                        sim.enter(p);
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            let engine = engine_for(&sim, p, plan);
                            apply_once(&engine, &rotate, verify).map_err(|e| e.to_string())
                        }));
                        let r = r.unwrap_or_else(|panic| {
                            let what = panic
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default();
                            let mut st = sim.lock();
                            st.violation
                                .get_or_insert(format!("the engine panicked: {what}"));
                            sim.cv.notify_all();
                            Err(format!("panicked: {what}"))
                        });
                        sim.exit(p);
                        (i, r)
                    })
                })
                .collect();
            // Every process waits for the baton before its first step; then one is chosen.
            {
                let mut st = sim.lock();
                while started.iter().any(|&(p, _)| !st.procs[p].waiting) {
                    st = sim.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                sim.pass_baton(&mut st);
            }
            handles
                .into_iter()
                .map(|h| h.join().expect("a simulated process panicked"))
                .collect()
        });
        {
            let mut st = sim.lock();
            for (p, (i, r)) in started.iter().map(|s| s.0).zip(&results) {
                let dead = st.procs[p].dead;
                match r {
                    Ok(()) if !dead => {
                        st.rotated_any |= !rotated[*i] && !sc.rotate.is_empty();
                        rotated[*i] = true;
                        st.trace.push(format!("   p{p} n{i}: apply succeeded"));
                    }
                    Ok(()) => st.trace.push(format!("   p{p} n{i}: crashed")),
                    Err(e) => {
                        if e.contains("holds the lock") {
                            st.stats.lock_refusals += 1;
                        }
                        let first = e.lines().map(str::trim).collect::<Vec<_>>().join(" | ");
                        st.trace.push(format!(
                            "   p{p} n{i}: apply {}: {first}",
                            if dead { "crashed" } else { "failed" }
                        ));
                    }
                }
            }
            if st.violation.is_some() {
                break;
            }
        }
        if round + 1 >= FAULT_ROUNDS {
            if let Err(why) = converged(&sim, sc) {
                // Every node's plan is empty by then: nothing will finish that retire or
                // destroy, so it is a violation now rather than after the last round.
                if why.starts_with("retired material left") {
                    sim.lock().violation = Some(why);
                    break;
                }
                last_why = why;
            } else {
                done = true;
                break;
            }
        }
    }
    let mut st = sim.lock();
    if st.violation.is_none() && !done {
        st.violation = Some(format!(
            "did not converge within {MAX_ROUNDS} rounds of apply ({FAULT_ROUNDS} with faults): {last_why}"
        ));
    }
    Outcome {
        violation: st.violation.clone(),
        trace: st.trace.clone(),
        choices: st.choices.taken.clone(),
        stats: st.stats,
    }
}

/// Whether the schedule converged: every node's `plan` is empty (no interrupted run), and,
/// independently of the planner, the world is at the plan:
/// - nothing is pending, and every key that was `--rotate`d by a successful apply moved past
///   its first version;
/// - every device opens with the current version of each key it lists, and no keyslot of it
///   opens with another version of that key;
/// - the install keyslot (the initial passphrase) is gone where the plan removes unmanaged
///   keyslots, and still there, unchanged, where it keeps them (I4);
/// - no vote is left in the KMS, and the holders are exactly the nodes listing the key.
///
/// Errors: what is not at the plan.
fn converged(sim: &Arc<Sim>, sc: &Scenario) -> Result<(), String> {
    for (i, n) in sc.nodes.iter().enumerate() {
        let p = {
            let mut st = sim.lock();
            let p = st.procs.len();
            st.procs.push(Proc::new(i, &n.plan.state_dir, true));
            st.baton = Some(p);
            p
        };
        let engine = engine_for(sim, p, &n.plan);
        let out = keyplan::ops::plan::plan(&engine, &PlanRequest::default());
        drop(engine);
        sim.exit(p);
        match out {
            Ok(PlanOutcome::Planned(planned)) if planned.diff.is_empty() => {}
            Ok(PlanOutcome::Planned(_)) => {
                return Err(format!("node {} still plans changes", n.name))
            }
            Ok(PlanOutcome::Interrupted(s)) => {
                return Err(format!("node {} has interrupted run {}", n.name, s.run))
            }
            Err(e) => return Err(format!("node {}: plan failed: {e}", n.name)),
        }
    }
    let st = sim.lock();
    world_at_plan(sc, &st)
}

/// The independent half of [`converged`].
fn world_at_plan(sc: &Scenario, st: &State) -> Result<(), String> {
    revoked(sc, st)?;
    // Destroying and retiring finish, whatever the interruption (issue 46): no version a KMS
    // records as retired (or destroyed) is still handed out.
    for (path, k) in &st.world.keys {
        if let Some(v) = k.lingering().first() {
            return Err(format!(
                "retired material left: KMS key {path} records v{v} as retired (or destroyed), yet still hands out its material"
            ));
        }
    }
    for dev in &sc.kms_opens {
        let d = st.world.devices.get(dev).ok_or("device gone")?;
        if !st.damaged.contains(dev) && !opens_with_kms(&st.world, d) {
            return Err(format!(
                "{} opens with no version any KMS still holds",
                dev.display()
            ));
        }
    }
    for (dev, key, _) in &sc.listing {
        let k = st
            .world
            .keys
            .get(key)
            .ok_or(format!("{key} does not exist"))?;
        if let Some(p) = k.pending {
            return Err(format!("{key} v{p} is still pending"));
        }
        let m = k
            .current_material()
            .ok_or(format!("{key} has no current version"))?;
        let d = st.world.devices.get(dev).ok_or("device gone")?;
        if !d.opens(m) {
            return Err(format!(
                "{} does not open with {key}'s current version",
                dev.display()
            ));
        }
        // The operator's own copies are not keyplan's (kept: I4; reported once retired: I8).
        let operators = |n: &u32, s: &doors::MemSlot| {
            st.copied
                .iter()
                .any(|(p, c, salt)| p == dev && c == n && *salt == s.salt)
        };
        for (v, other) in &k.material {
            if Some(*v) != k.current
                && d.slots
                    .iter()
                    .any(|(n, s)| s.pass == *other && !operators(n, s))
            {
                return Err(format!(
                    "{} still has a keyslot of {key} v{v}",
                    dev.display()
                ));
            }
        }
        if let Some(votes) = k
            .holders
            .keys()
            .find(|h| keyplan::kms::book::parse_vote(h).is_some())
        {
            return Err(format!("{key} still has the vote {votes}"));
        }
    }
    for id in &sc.rotate {
        let key = sc
            .listing
            .iter()
            .map(|(_, path, _)| path)
            .find(|path| key_name(path) == id)
            .unwrap_or(id);
        let started = st.initial.get(key).copied().flatten().unwrap_or(0);
        let now = st.world.keys.get(key).and_then(|k| k.current).unwrap_or(0);
        if st.rotated_any && now <= started {
            return Err(format!(
                "{key} was rotated by a successful apply and is still at v{now}"
            ));
        }
    }
    for (dev, keep) in &sc.install_keyslot {
        let d = st.world.devices.get(dev).ok_or("device gone")?;
        let has = d
            .slots
            .get(&0)
            .is_some_and(|s| s.pass == sc.initial_pass && s.seq == 0);
        if has != *keep {
            return Err(format!(
                "{}: the install keyslot is {} though the plan {} unmanaged keyslots",
                dev.display(),
                if has { "still there" } else { "gone" },
                if *keep { "keeps" } else { "removes" }
            ));
        }
    }
    Ok(())
}

/// Shrinks a failing choice stream: sets choices to 0 (no fault, the first waiting process)
/// one at a time, keeping each change that still fails the same way (the same property), and
/// cuts the tail.
/// Returns the shortest failing outcome found, within `budget` replays.
pub fn minimise(
    sc: &Scenario,
    seed: u64,
    failing: &Outcome,
    variant: Variant,
    budget: usize,
) -> Outcome {
    let class = |o: &Outcome| {
        o.violation
            .as_deref()
            .map(|v| v.split_whitespace().next().unwrap_or_default().to_string())
    };
    let want = class(failing);
    let mut best: Vec<u32> = failing.choices.clone();
    let mut best_out: Option<Outcome> = None;
    let mut tries = 0;
    // Cut the tail first.
    let mut len = best.len();
    while len > 1 && tries < budget {
        let cut = len / 2;
        let cand: Vec<u32> = best[..cut].to_vec();
        tries += 1;
        let o = run(sc, seed, Some(cand.clone()), variant);
        if class(&o) == want {
            best = cand;
            len = cut;
            best_out = Some(o);
        } else {
            break;
        }
    }
    let mut i = 0;
    while i < best.len() && tries < budget {
        if !best[i].is_multiple_of(1000) {
            let mut cand = best.clone();
            cand[i] = 0;
            tries += 1;
            let o = run(sc, seed, Some(cand.clone()), variant);
            if class(&o) == want {
                best = cand;
                best_out = Some(o);
            }
        }
        i += 1;
    }
    best_out.unwrap_or_else(|| run(sc, seed, Some(best), variant))
}

/// The lines of a trace worth reading: faults, other writers, apply ends, and the last calls
/// before the violation.
pub fn short_trace(o: &Outcome) -> String {
    let n = o.trace.len();
    o.trace
        .iter()
        .enumerate()
        .filter(|(i, l)| {
            l.contains("<-") || l.starts_with("--") || l.starts_with("   ") || *i + 6 >= n
        })
        .map(|(_, l)| l.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A LUKS2 device of the scenarios.
pub fn luks2(uuid: &str, pass: &[u8], salt: u64) -> MemDev {
    MemDev::new(LuksVersion::Luks2, uuid, pass, format!("initial-{salt}"))
}

/// A LUKS1 device of the scenarios.
pub fn luks1(uuid: &str, pass: &[u8], salt: u64) -> MemDev {
    MemDev::new(LuksVersion::Luks1, uuid, pass, format!("initial-{salt}"))
}

/// A simulation holding one device (`version`, `uuid`, `pass` in keyslot 0, at `path`) and
/// one fault-free process, whose LUKS door is `luks`: the differential test's in-memory side.
pub struct Standalone {
    /// The in-memory LUKS door.
    pub luks: SimLuks,
}

impl Standalone {
    /// Sets the priority of keyslot `slot` of `path`, as `cryptsetup config --priority` does.
    pub fn set_priority(&self, path: &Path, slot: u32, priority: keyplan::luks::Priority) {
        let mut st = self.luks.sim.lock();
        if let Some(s) = st
            .world
            .devices
            .get_mut(path)
            .and_then(|d| d.slots.get_mut(&slot))
        {
            s.priority = priority;
        }
        if let Some(d) = st.world.devices.get_mut(path) {
            d.epoch += 1;
        }
    }
}

/// See [`Standalone`].
pub fn standalone(version: LuksVersion, uuid: &str, pass: &[u8], path: &Path) -> Standalone {
    let mut world = World::default();
    world.devices.insert(
        path.to_owned(),
        MemDev::new(version, uuid, pass, "initial".into()),
    );
    let mut st = quiet_state(world, pass);
    st.procs.push(Proc::new(0, Path::new(""), true));
    st.baton = Some(0);
    let sim = Arc::new(Sim {
        st: Mutex::new(st),
        cv: Condvar::new(),
        pbkdf: AtomicU64::new(0),
    });
    Standalone {
        luks: SimLuks { sim, proc: 0 },
    }
}

/// The state of a simulation that injects no fault and checks nothing, over `world` (no
/// process yet).
fn quiet_state(world: World, pass: &[u8]) -> State {
    State {
        world,
        procs: Vec::new(),
        baton: None,
        choices: Choices {
            rng: rand::rngs::StdRng::seed_from_u64(0),
            script: None,
            taken: Vec::new(),
        },
        faults_left: 0,
        faults_on: false,
        trace: Vec::new(),
        violation: None,
        listing: Vec::new(),
        torn: BTreeSet::new(),
        damaged: BTreeSet::new(),
        checking: false,
        keep_install: Vec::new(),
        rotated_any: false,
        writer: (0, 0),
        initial: BTreeMap::new(),
        initial_pass: pass.to_vec(),
        variant: Variant::Correct,
        stats: Stats::default(),
        snapshots: PathBuf::new(),
        converted: Vec::new(),
        copied: Vec::new(),
        departed: Vec::new(),
        kms_opens: Vec::new(),
        writer_stages: true,
    }
}
