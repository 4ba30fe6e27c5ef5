//! Building synthetic inputs for the planner: a plan from YAML text, and an observed state
//! made of devices (keyslots, records) and keys (KMS versions), as `observe` would return them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::diff::{Diff, DiffOptions, Refusal};
use crate::kms::{KeyState, VersionInfo, VersionState};
use crate::luks::{Header, Keyslot, LuksVersion, Priority};
use crate::observe::{DeviceState, Observed, Origin};
use crate::spec::{Format, Plan};
use crate::world::{RecordObs, RecordStatus, SlotRecord};

/// Observation time of every scenario (Unix seconds, 2027-01-15).
pub const NOW: u64 = 1_800_000_000;
/// One day in seconds.
pub const DAY: u64 = 86_400;

/// A plan from YAML `text` whose relative paths resolve against `/srv/plan`.
pub fn plan(text: &str) -> Plan {
    match crate::spec::load_str(text, "keyplan.yaml", Format::Yaml, Path::new("/srv/plan")) {
        Ok(p) => p,
        Err(e) => panic!("scenario plan does not load: {e:?}\n{text}"),
    }
}

/// A device under construction.
#[derive(Clone)]
pub struct Disk {
    id: String,
    version: LuksVersion,
    keyslots: BTreeMap<u32, Keyslot>,
    records: Vec<RecordObs>,
    /// Why it cannot be written.
    pub read_only: Option<String>,
    /// `(size, used)` of the LUKS2 JSON area.
    pub json_area: Option<(u64, u64)>,
    /// The enroll_with check's problem.
    pub enroll_with_problem: Option<String>,
}

impl Disk {
    /// A LUKS2 device `id` with no keyslot, path `/srv/plan/<id>.img`.
    pub fn luks2(id: &str) -> Disk {
        Disk {
            id: id.to_string(),
            version: LuksVersion::Luks2,
            keyslots: BTreeMap::new(),
            records: Vec::new(),
            read_only: None,
            json_area: Some((12288, 2000)),
            enroll_with_problem: None,
        }
    }

    /// A LUKS1 device `id` with no keyslot.
    pub fn luks1(id: &str) -> Disk {
        Disk {
            version: LuksVersion::Luks1,
            json_area: None,
            ..Disk::luks2(id)
        }
    }

    fn salt(&self, n: u32) -> String {
        format!("salt-{}-{n}", self.id)
    }

    /// An occupied keyslot `n` (bound unless `bound` is false) with `priority`.
    pub fn keyslot_with(mut self, n: u32, bound: bool, priority: Priority) -> Disk {
        let salt = self.salt(n);
        self.keyslots.insert(
            n,
            Keyslot {
                bound,
                salt,
                priority,
                kdf: "pbkdf2".into(),
                memory_kib: None,
                iterations: None,
                parallel: None,
            },
        );
        self
    }

    /// An occupied, bound keyslot `n` keyplan did not create.
    pub fn keyslot(self, n: u32) -> Disk {
        self.keyslot_with(n, true, Priority::Normal)
    }

    /// A record of `key` v`version` for keyslot `n` with `status`; for `Valid`, `Rewritten`
    /// and `FailedVerify` the keyslot exists (with another salt when `Rewritten`).
    pub fn record(mut self, n: u32, key: &str, version: u64, status: RecordStatus) -> Disk {
        let salt = self.salt(n);
        if status != RecordStatus::KeyslotGone {
            self = self.keyslot(n);
            if status == RecordStatus::Rewritten {
                if let Some(k) = self.keyslots.get_mut(&n) {
                    k.salt = format!("{salt}-rewritten");
                }
            }
        }
        self.records.push(RecordObs {
            slot: n,
            record: SlotRecord {
                key: key.into(),
                version,
                salt,
                entry: Some(("local".into(), key.into())),
                pbkdf: None,
            },
            token_id: Some(n),
            status,
            renamed_from: None,
        });
        self
    }

    /// Keyslot `n` holding `key` v`version`, recorded by keyplan.
    pub fn holds(self, n: u32, key: &str, version: u64) -> Disk {
        self.record(n, key, version, RecordStatus::Valid)
    }

    /// The record of keyslot `n` names KMS instance `kms` (as `name`), e.g. after the plan
    /// moved the key.
    pub fn entry(mut self, n: u32, kms: &str, name: &str) -> Disk {
        for r in self.records.iter_mut().filter(|r| r.slot == n) {
            r.record.entry = Some((kms.into(), name.into()));
        }
        self
    }

    /// The observed device, for a plan whose device `id` has path `path`.
    pub fn state(self, path: PathBuf) -> DeviceState {
        let header = Header {
            version: self.version,
            uuid: format!("uuid-{}", self.id),
            keyslots: self.keyslots,
            tokens: BTreeMap::new(),
            json_area: self.json_area,
            epoch: Some(1),
            pbkdf2_target: ("sha256".into(), Some(512)),
            condition: Default::default(),
        };
        let mut st = DeviceState::new(&self.id, path, header, self.records);
        st.read_only = self.read_only;
        st.enroll_with_problem = self.enroll_with_problem;
        st
    }
}

/// A key's KMS state: `current` (created `age_days` before [`NOW`]), `pending`, older
/// `previous` versions (material kept) and `retired` ones.
pub fn key(
    current: Option<u64>,
    age_days: u64,
    pending: Option<u64>,
    previous: &[u64],
    retired: &[u64],
) -> KeyState {
    let mut versions = BTreeMap::new();
    let mut put = |v: u64, state: VersionState, created_at: u64| {
        versions.insert(
            v,
            VersionInfo {
                version: v,
                created_at,
                state,
            },
        );
    };
    for &v in retired {
        put(v, VersionState::Retired, NOW - 400 * DAY);
    }
    for &v in previous {
        put(v, VersionState::Previous, NOW - 200 * DAY);
    }
    if let Some(c) = current {
        put(c, VersionState::Current, NOW - age_days * DAY);
    }
    if let Some(p) = pending {
        put(p, VersionState::Pending, NOW - DAY);
    }
    KeyState {
        current,
        pending,
        versions,
        holders: BTreeMap::new(),
    }
}

/// An observed state of `plan`: `disks` (each device's path and enroll_with file examined from
/// the plan), `keys` by id, no former devices, no migration origins.
pub fn observed(plan: &Plan, disks: Vec<Disk>, keys: Vec<(&str, KeyState)>) -> Observed {
    let mut devices = BTreeMap::new();
    for d in disks {
        let id = d.id.clone();
        let spec = plan.devices.get(&id);
        let path = spec.map_or_else(|| PathBuf::from(format!("/srv/{id}")), |s| s.path.clone());
        let mut st = d.state(path);
        st.enroll_with_file = spec
            .and_then(|s| s.enroll_with.as_deref())
            .map(crate::observe::examine_enroll_file);
        devices.insert(id, st);
    }
    // The plan holds every key that exists (it recorded itself when it enrolled them); the
    // tests of holder records set `holders` themselves afterwards.
    let me = plan.holder();
    let keys = keys
        .into_iter()
        .map(|(k, mut s)| {
            if s.current.is_some() && s.holders.is_empty() {
                s.holders.insert(me.clone(), NOW - DAY);
            }
            (k.to_string(), s)
        })
        .collect();
    Observed {
        devices,
        keys,
        now: NOW,
        ..Observed::default()
    }
}

/// Adds migration origins: for every key, the other KMS entries its valid records name, with
/// `states` of those entries (by `(kms, name)`; missing: the instance is not in the plan).
pub fn with_origins(
    plan: &Plan,
    mut obs: Observed,
    states: &BTreeMap<(String, String), KeyState>,
) -> Observed {
    for (id, key) in &plan.keys {
        for (kms, name) in crate::observe::moved_from(key, &obs.devices) {
            let state = if plan.kms.contains_key(&kms) {
                Some(
                    states
                        .get(&(kms.clone(), name.clone()))
                        .cloned()
                        .unwrap_or_default(),
                )
            } else {
                None
            };
            obs.origins.entry(id.clone()).or_default().push(Origin {
                kms,
                name,
                state,
                occupant: None,
            });
        }
    }
    obs
}

/// The planner's result as text for a snapshot: key changes, keyslot changes, notes, and the
/// steps with the direct predecessors of each (`<- 0, 3`); or the refusals.
pub fn render(result: &Result<Diff, Vec<Refusal>>) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let d = match result {
        Err(refusals) => {
            s.push_str("REFUSED\n");
            for r in refusals {
                let about = match (&r.device, &r.key) {
                    (Some(d), _) => format!("device {d}"),
                    (_, Some(k)) => format!("key {k}"),
                    _ => "plan".to_string(),
                };
                let _ = writeln!(s, "  [{about}] {}", r.message);
            }
            return s;
        }
        Ok(d) => d,
    };
    for k in &d.keys {
        let _ = writeln!(
            s,
            "key {} {:?} {:?} -> v{} retire {:?} ({:?}: {})",
            k.key, k.action, k.from, k.to, k.retire, k.reason_code, k.reason
        );
    }
    for c in &d.slots {
        let what = match (&c.key, c.version) {
            (Some(k), Some(v)) => format!("{k} v{v}"),
            (Some(k), None) => k.clone(),
            (None, _) => "unmanaged".into(),
        };
        let _ = writeln!(
            s,
            "slot {} {:?} {} {what} ({:?}: {})",
            c.device, c.action, c.slot, c.reason_code, c.reason
        );
    }
    for n in &d.notes {
        let _ = writeln!(s, "note: {n}");
    }
    for (i, step) in d.graph.steps().iter().enumerate() {
        let extra = match step {
            crate::graph::Step::KillKeyslot { anchor, .. } => format!(" [anchor {anchor}]"),
            crate::graph::Step::Stage { at_least, .. } => format!(" [at least v{at_least}]"),
            crate::graph::Step::Commit {
                expected_current, ..
            } => format!(" [expects {expected_current:?}]"),
            _ => String::new(),
        };
        let mut preds = d.graph.predecessors(i);
        preds.sort_unstable();
        let after = if preds.is_empty() {
            String::new()
        } else {
            format!(
                "  <- {}",
                preds
                    .iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let _ = writeln!(s, "[{i}] {step}{extra}{after}");
    }
    s
}

/// Plans `plan` against `obs` with `rotate`.
pub fn run(plan: &Plan, obs: &Observed, rotate: &[&str]) -> Result<Diff, Vec<Refusal>> {
    let opts = DiffOptions {
        rotate: rotate.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    crate::diff::diff(plan, obs, &opts)
}

/// Whether `version` of a key (state `st`) is a previous version below the newest previous
/// one: a leftover of an earlier rotation, which a plan retires without a commit
/// (src/diff/decide/retention.rs).
pub(super) fn left_over_previous(st: &crate::kms::KeyState, version: u64) -> bool {
    st.versions
        .get(&version)
        .is_some_and(|v| v.state == crate::kms::VersionState::Previous)
        && st.retained_previous().iter().any(|p| *p > version)
}
