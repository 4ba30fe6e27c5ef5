//! `status`: per key its KMS state and rotation schedule, per device its drift from the plan,
//! and the journal's last run, as one [`StatusReport`] (rendered by `render::status` as text,
//! JSON or Prometheus metrics; docs/monitoring.md has the definitions).
//!
//! Reads the KMSs, the journal and the LUKS headers; writes nothing; no PBKDF run. It tells a
//! problem it found ([`Verdict::Problem`]) apart from something it could not check
//! ([`Verdict::Unknown`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::credentials::KmsCredentials;
use super::Engine;
use crate::diff::{self, DiffOptions, SlotAction};
use crate::journal::{Event, Record};
use crate::kms::KeyState;
use crate::observe::{self, Observed, Testing};
use crate::spec::Plan;
use crate::world::RecordStatus;

/// Version of the JSON document `status --format json` writes (minor versions only add fields).
pub const FORMAT_VERSION: &str = "1.4";

/// How many times `status` reads a header again after a read that found damage, before it
/// reports it (each read is a few dozen microseconds; nothing else is waited for).
pub const HEADER_REREADS: usize = 3;

/// What `status` concludes (its exit status: docs/monitoring.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Everything was checked and no problem found.
    Healthy,
    /// At least one problem was found (`problems`).
    Problem,
    /// No problem was found, but something could not be checked (`unchecked`).
    Unknown,
}

/// The whole report: what every output format renders.
#[derive(Debug, Clone, Serialize)]
pub struct StatusReport {
    /// Always [`FORMAT_VERSION`].
    pub format_version: &'static str,
    /// When the report was made, Unix seconds (UTC).
    pub generated_at: u64,
    /// True when the verdict is [`Verdict::Healthy`] (exit code 0).
    pub healthy: bool,
    /// The verdict.
    pub verdict: Verdict,
    /// One line per problem found.
    pub problems: Vec<String>,
    /// One line per thing that could not be checked, and why.
    pub unchecked: Vec<String>,
    /// Keys in plan order.
    pub keys: Vec<KeyReport>,
    /// Devices in plan order.
    pub devices: Vec<DeviceReport>,
    /// keyplan's own credentials per KMS instance, in plan order (since format 1.1).
    pub kms: Vec<KmsCredentials>,
    /// For a plan whose devices name nodes: the node reported on and what was left to other
    /// nodes (since format 1.2; absent for a single-host plan).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeReport>,
    /// The last run in the journal, if any.
    pub last_run: Option<RunReport>,
    /// When the last run that ended with `success` ended, Unix seconds.
    pub last_success_at: Option<u64>,
    /// Whether the last run that is over (ended, or stopped without an end record and no
    /// longer holding the state lock) succeeded; `None` before the first such run. Equals
    /// `last_run.outcome == "success"` unless the last run is `in_progress`, in which case it
    /// describes the run before it. Feeds `keyplan_last_run_success` only.
    #[serde(skip)]
    pub last_over_success: Option<bool>,
}

/// One key.
#[derive(Debug, Clone, Serialize)]
pub struct KeyReport {
    /// Key id.
    pub id: String,
    /// KMS instance name from the plan.
    pub kms: String,
    /// Provider of that instance (`file`, `vault`, ...).
    pub provider: String,
    /// Name of the key in the KMS.
    pub name: String,
    /// False when the KMS could not be read (`error` says why).
    pub readable: bool,
    /// Why the KMS could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The current version.
    pub current: Option<CurrentReport>,
    /// True when a run committed a version of this key but the KMS has no current version.
    pub missing: bool,
    /// `rotate_after` in seconds.
    pub rotate_after_seconds: Option<u64>,
    /// `current.created_at + rotate_after_seconds`, Unix seconds.
    pub rotation_due_at: Option<u64>,
    /// True when the rotation is due and has not happened.
    pub overdue: bool,
    /// Version staged by a run that has not committed it yet.
    pub pending: Option<u64>,
    /// Older versions whose material the KMS still holds.
    pub retained: Vec<u64>,
}

/// A key's current version.
#[derive(Debug, Clone, Serialize)]
pub struct CurrentReport {
    /// Version number.
    pub version: u64,
    /// Unix seconds.
    pub created_at: u64,
    /// Seconds since `created_at`.
    pub age_seconds: u64,
}

/// One device.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReport {
    /// Device id.
    pub id: String,
    /// Device path.
    pub path: String,
    /// False when drift could not be determined (the KMS or the plan stopped the observation;
    /// `unchecked` says why).
    pub checked: bool,
    /// True when `drift` is not empty.
    pub drifted: bool,
    /// The findings.
    pub drift: Vec<DriftReport>,
    /// LUKS header damage found while reading the header read-only (a damaged copy, copies
    /// that disagree), one line each with what to do; empty for a healthy header.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub header_damage: Vec<String>,
    /// Set instead of `header_damage` when the header copies differ as a header write leaves
    /// them while a keyplan run holds the state lock, on every read ([`HEADER_REREADS`] more):
    /// a write in progress, not damage (since format 1.3). What was seen and who writes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header_write_in_progress: Option<String>,
    /// Set while a keyplan run that holds the state lock has steps left on this device: its
    /// drift findings are listed but are no problem (`drifted` false) until that run ends, e.g.
    /// two versions of a key between the run's commit and its kill (since format 1.3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub being_changed: Option<String>,
    /// Keyslots keyplan did not make that still open with a key version it retired (found
    /// when it retired the version, `world::copies`; kept under `unmanaged_keyslots: keep`),
    /// one line each with what to do; each is a problem (since format 1.3).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retired_copies: Vec<String>,
    /// Bound keyslots with no keyplan record and tokens of other tools (systemd-tpm2,
    /// clevis, ...), with what `keyplan plan` would do with each keyslot (`kept`, `removed`,
    /// `adopted`); `None` when the device was not observed (since format 1.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmanaged: Option<crate::diff::unmanaged::DeviceUnmanaged>,
}

/// One drift finding.
#[derive(Debug, Clone, Serialize)]
pub struct DriftReport {
    /// The keyslot concerned, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyslot: Option<u32>,
    /// What kind of drift.
    pub kind: DriftKind,
    /// What `status` found or `apply` would do.
    pub detail: String,
}

/// Kinds of drift (docs/monitoring.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DriftKind {
    /// The device cannot be read (missing, not LUKS, another LUKS UUID than the plan's).
    Unreadable,
    /// A keyslot keyplan recorded is gone (its LUKS2 token or LUKS1 record remains).
    KeyslotGone,
    /// A keyslot keyplan recorded was rewritten (other KDF salt).
    KeyslotRewritten,
    /// A key the plan lists for the device is held by no keyslot.
    KeyMissing,
    /// The device holds a version of a key other than the KMS's current one.
    StaleVersion,
    /// A keyslot holds a key the plan no longer lists for the device.
    KeyNotListed,
    /// A keyslot keyplan did not create, under `unmanaged_keyslots: remove`.
    UnmanagedKeyslot,
    /// A managed keyslot whose PBKDF is not the plan's `settings.pbkdf`
    /// ([`crate::luks::kdf_drift`]): `apply` re-wraps it.
    Pbkdf,
    /// A keyslot recorded under a key id the plan renamed (same KMS instance and name):
    /// `apply` rewrites its record.
    KeyRenamed,
    /// Any other change `keyplan plan` would make on the device.
    Other,
}

impl DriftKind {
    /// The snake_case name (`key_missing`, ...), as in JSON.
    pub fn name(self) -> &'static str {
        match self {
            DriftKind::Unreadable => "unreadable",
            DriftKind::KeyslotGone => "keyslot_gone",
            DriftKind::KeyslotRewritten => "keyslot_rewritten",
            DriftKind::KeyMissing => "key_missing",
            DriftKind::StaleVersion => "stale_version",
            DriftKind::KeyNotListed => "key_not_listed",
            DriftKind::UnmanagedKeyslot => "unmanaged_keyslot",
            DriftKind::Pbkdf => "pbkdf",
            DriftKind::KeyRenamed => "key_renamed",
            DriftKind::Other => "other",
        }
    }
}

/// The last run.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Run id.
    pub id: String,
    /// Unix seconds.
    pub started_at: u64,
    /// Unix seconds; `None` when the run has no end record.
    pub ended_at: Option<u64>,
    /// `success`, `failed`, `interrupted` (signal), `in_progress` (no end record, and a run
    /// holds the state lock right now), or `unfinished` (no end record and the lock is free:
    /// killed or crashed).
    pub outcome: String,
    /// Who holds the state lock (`pid P on host H since T`), for an `in_progress` run only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The last error recorded for the run (never key material).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What `status` collects before the verdict.
#[derive(Default)]
struct Findings {
    problems: Vec<String>,
    unchecked: Vec<String>,
    /// What kept the devices from being checked for drift, said once when the reason is a
    /// KMS that could not be read ([`Findings::settle`]).
    not_observed: Vec<String>,
    /// Per KMS instance that could not be read: its keys, and the first error.
    unreadable: BTreeMap<String, (Vec<String>, String)>,
}

impl Findings {
    /// Files the grouped findings as `unchecked` lines, one statement per fact: one line per
    /// KMS instance that could not be read (naming its keys, with the first key's error), and
    /// for the devices either the observation's own reasons or, when a KMS could not be read
    /// (which is what stopped it), one line pointing at those.
    fn settle(&mut self) {
        let line = |m: &str| format!("devices could not be checked for drift: {}", first_line(m));
        // The observation asked the KMS first: its message has the error itself, the keys'
        // reads after it were not asked again.
        let first = self.not_observed.first().cloned();
        if self.unreadable.is_empty() {
            let lines: Vec<String> = self.not_observed.iter().map(|m| line(m)).collect();
            self.unchecked.extend(lines);
        } else if first.is_some() {
            self.unchecked
                .push(line("a KMS of their keys could not be read"));
        }
        self.not_observed.clear();
        for (kms, (keys, e)) in std::mem::take(&mut self.unreadable) {
            let which = match keys.as_slice() {
                [one] => format!("key {one}"),
                many => format!("keys {}", many.join(", ")),
            };
            let e = match &first {
                Some(m) if e.contains("not asked: it was unavailable") => first_line(m).to_string(),
                _ => e,
            };
            self.unchecked
                .push(format!("KMS {kms} unreadable ({which}): {e}"));
        }
    }
}

/// Refuses `status -o path` when `path` is one of the plan's own files
/// ([`Plan::protected_path`]) or exists and is not a status document keyplan wrote (a
/// Prometheus textfile whose first line is a `# HELP keyplan_` comment, a status JSON document,
/// or status text): `-o keyplan.yaml` or `-o disk.img` would replace them.
///
/// Errors: [`Error::Request`] saying why, before anything is observed.
pub fn check_out_path(plan: &Plan, path: &std::path::Path) -> Result<(), crate::error::Error> {
    let refuse = |why: String| {
        Err(crate::error::Error::request(
            format!(
                "refusing to write the status to {}: {why}; nothing was written",
                path.display()
            ),
            Some(
                "choose another file, e.g. one in node_exporter's textfile collector directory"
                    .into(),
            ),
        ))
    };
    if let Some(why) = plan.protected_path(path) {
        return refuse(why);
    }
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.is_file() {
        return refuse("it exists and is not a regular file".into());
    }
    let mut head = Vec::new();
    let read = std::fs::File::open(path)
        .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 1 << 20), &mut head));
    if read.is_err() {
        return refuse("it exists and cannot be read to check what it is".into());
    }
    let text = String::from_utf8_lossy(&head);
    // An empty file is nobody's status (keyplan never writes one): a lock file, say.
    let ours = text.starts_with("# HELP keyplan_")
        || serde_json::from_slice::<serde_json::Value>(&head)
            .is_ok_and(|v| v.get("verdict").is_some() && v.get("format_version").is_some())
        || text.lines().any(|l| l.starts_with("last run: "));
    if ours {
        Ok(())
    } else {
        refuse("it exists and is not a status keyplan wrote".into())
    }
}

/// `keyplan status`: KMS state per key, drift per device, the journal's last run. Never fails:
/// what cannot be read becomes an `unchecked` line of the report.
pub fn status(engine: &Engine) -> StatusReport {
    status_with(engine, None)
}

/// [`status`] from an observation already made (`observed`: a plan's or an apply's, e.g. the
/// node agent's cycle, [`crate::fleet::agent`]): the devices and keys are not read again, so a
/// cycle observes once. The KMS credentials' lifetimes are still asked as [`status`] asks
/// them.
pub fn status_observed(engine: &Engine, observed: &Observed) -> StatusReport {
    status_with(engine, Some(observed))
}

/// How many times `status` looks again when a run started or ended while it looked
/// ([`status_with`]); after the last look it reports what it saw, with an `unchecked` line.
pub const STATUS_LOOKS: usize = 3;

/// A look is one consistent snapshot only if no run started or ended while it was taken: the
/// journal is read before the devices are observed, the state lock and the journal again after.
/// A run that ended in between (its end record written, then its lock released) would
/// otherwise look unfinished, and the devices it changed under the observation drifted; a look
/// that saw the journal move is taken again, up to [`STATUS_LOOKS`] times (an observation
/// `given` cannot be taken again: its single look is kept).
fn status_with(engine: &Engine, given: Option<&Observed>) -> StatusReport {
    let looks = if given.is_some() { 1 } else { STATUS_LOOKS };
    let mut look = 1;
    loop {
        let (mut report, moved) = status_look(engine, given);
        if !moved {
            return report;
        }
        if look < looks {
            look += 1;
            continue;
        }
        report.unchecked.push(format!(
            "a keyplan run started or ended while status looked ({look} looks), so what it saw may mix the devices before and after that run: run `keyplan status` again"
        ));
        if report.verdict == Verdict::Healthy {
            report.verdict = Verdict::Unknown;
            report.healthy = false;
        }
        return report;
    }
}

/// Whether the journal's last run, as read in `before`, differs from the journal now (another
/// run started, or that run wrote its end record): see [`status_with`].
fn journal_moved(plan: &Plan, before: &[Record]) -> bool {
    let now = crate::journal::read(&plan.state_dir).unwrap_or_default();
    let last = |r: &[Record]| crate::journal::last_run(r).map(|s| (s.run, s.ended));
    last(before) != last(&now)
}

/// One look of [`status_with`]: the report, and whether the journal moved while it looked.
fn status_look(engine: &Engine, given: Option<&Observed>) -> (StatusReport, bool) {
    let plan = engine.plan();
    // Each KMS instance's calls together wait at most its `timeout` from here on: a KMS that
    // never answers costs one `timeout` and is reported under `unchecked` (docs/monitoring.md,
    // "Deadlines").
    engine.world().bound_kms_waits();
    let now = crate::clock::now_unix();
    let mut f = Findings::default();
    let records = match crate::journal::read(&plan.state_dir) {
        Ok(r) => r,
        Err(e) => {
            f.unchecked.push(format!("journal unreadable: {e}"));
            Vec::new()
        }
    };
    let (observed, mut devices) = observe_devices(engine, given, &mut f);
    let committed = crate::journal::committed_keys(&records);
    let keys: Vec<KeyReport> = plan
        .keys
        .keys()
        .map(|id| key_report(engine, observed.as_ref(), id, &committed, now, &mut f))
        .collect();
    f.settle();
    let kms = credentials(engine, &keys, now, &mut f);
    let _ = crate::failpoint::check("status.after_observe");
    // The lock first, the journal again after it: a run writes its end record before it
    // releases the lock, so a lock found free with no end record read after it is a run that
    // never wrote one.
    let holder = crate::journal::lock_holder(&plan.state_dir);
    let moved = journal_moved(plan, &records);
    let last_run = last_run(&records, holder);
    let changing = devices_being_changed(&records, last_run.as_ref());
    let last_over_success = last_over_success(&records, last_run.as_ref());
    if let Some(r) = &last_run {
        if r.outcome != "success" && r.outcome != "in_progress" {
            f.problems.push(format!(
                "last run {} {} (`keyplan journal` shows its steps; `keyplan apply` finishes or retries it)",
                r.id, r.outcome
            ));
        }
    }
    let last_success_at = crate::journal::last_success_at(&records);
    for d in &mut devices {
        if let Some(st) = observed.as_ref().and_then(|o| o.devices.get(&d.id)) {
            match judge_header(engine, st) {
                HeaderSeen::Healthy => {}
                HeaderSeen::Writing(what) => d.header_write_in_progress = Some(what),
                HeaderSeen::Damaged(damage) => d.header_damage = damage,
            }
            d.retired_copies = st
                .retired_copies
                .iter()
                .map(|c| c.describe(&st.path))
                .collect();
        }
        for x in d.header_damage.iter().chain(&d.retired_copies) {
            f.problems.push(format!("device {}: {x}", d.id));
        }
        // A run at work right now changes its devices step by step: between its commit and
        // its kills a device holds two versions, which is drift only once the run is over.
        if let Some(run) = changing.get(&d.id).filter(|_| !d.drift.is_empty()) {
            d.being_changed = Some(format!(
                "run {run}, in progress, has steps left on this device; its drift is not a problem until that run ends"
            ));
        }
        d.drifted = !d.drift.is_empty() && d.being_changed.is_none();
        if d.drifted {
            let kinds: BTreeSet<&str> = d.drift.iter().map(|x| x.kind.name()).collect();
            f.problems.push(format!(
                "device {} drifted ({}; `keyplan plan` shows the repair)",
                d.id,
                kinds.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    let verdict = if !f.problems.is_empty() {
        Verdict::Problem
    } else if !f.unchecked.is_empty() {
        Verdict::Unknown
    } else {
        Verdict::Healthy
    };
    let report = StatusReport {
        format_version: FORMAT_VERSION,
        generated_at: now,
        healthy: verdict == Verdict::Healthy,
        verdict,
        problems: f.problems,
        unchecked: f.unchecked,
        keys,
        devices,
        kms,
        node: engine.plan().scope.as_ref().map(|s| NodeReport {
            name: s.node.clone(),
            devices_elsewhere: s.elsewhere.clone(),
            keys_elsewhere: s.keys_left_out.clone(),
        }),
        last_run,
        last_success_at,
        last_over_success,
    };
    (report, moved)
}

/// What `status` concludes about one device's header ([`judge_header`]).
enum HeaderSeen {
    /// No damage (on the first read, or on a read again: a write ended meanwhile).
    Healthy,
    /// A header write in progress, not damage: what was seen and who holds the state lock.
    Writing(String),
    /// Damage, one line each with what to do (the last read's).
    Damaged(Vec<String>),
}

/// Tells a header write in progress from damage (docs/monitoring.md, "A run writing a
/// header"): cryptsetup writes the two LUKS2 copies one after the other, so a read between
/// its writes sees copies that disagree. A header whose observed read found damage is read
/// again, up to [`HEADER_REREADS`] times, waiting on nothing but the reads: a read without
/// damage means a write ended meanwhile (healthy). Damage seen on every read is a write in
/// progress only when every read showed the shape a write leaves
/// ([`crate::luks::ondisk::Condition::mid_write`]) and a keyplan run holds the state lock now
/// (keyplan's runs write headers only under it); otherwise it is damage. A device that cannot
/// be read again is judged by the reads made.
fn judge_header(engine: &Engine, st: &observe::DeviceState) -> HeaderSeen {
    let first = &st.header.condition;
    if first.damage.is_empty() {
        return HeaderSeen::Healthy;
    }
    let mut last = first.clone();
    let mut writing = first.mid_write;
    let mut reads = 1;
    for _ in 0..HEADER_REREADS {
        match engine.world().luks.dump(&st.path) {
            Ok(h) if h.condition.damage.is_empty() => return HeaderSeen::Healthy,
            Ok(h) => {
                reads += 1;
                writing &= h.condition.mid_write;
                last = h.condition;
            }
            Err(_) => break,
        }
    }
    if writing {
        if let Some(holder) = crate::journal::lock_holder(&engine.plan().state_dir) {
            return HeaderSeen::Writing(format!(
                "the LUKS2 header copies differ as cryptsetup leaves them between its two writes of one header update, on each of {reads} reads, while a keyplan run holds the state lock ({holder}): a write in progress, not damage"
            ));
        }
    }
    HeaderSeen::Damaged(last.damage)
}

/// The node a status report is about (fleet mode, docs/fleet.md).
#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    /// The node's name (`--node`, `$NODE_NAME` or the host name).
    pub name: String,
    /// Devices of the plan on other nodes: count by node name.
    pub devices_elsewhere: BTreeMap<String, usize>,
    /// Keys listed only on other nodes' devices (or on none), in id order.
    pub keys_elsewhere: Vec<String>,
}

/// keyplan's credentials per KMS ([`super::credentials::review`]): a credential ending too
/// early, or refused by its KMS, is a problem; one that could not be looked at is unchecked,
/// unless the KMS's keys already could not be read (that line says it).
fn credentials(
    engine: &Engine,
    keys: &[KeyReport],
    now: u64,
    f: &mut Findings,
) -> Vec<KmsCredentials> {
    let due: BTreeMap<String, u64> = keys
        .iter()
        .filter_map(|k| Some((k.id.clone(), k.rotation_due_at?)))
        .collect();
    let report = super::credentials::review(engine, &due, now);
    for k in &report {
        f.problems.extend(k.warnings().map(str::to_string));
        match &k.error {
            Some(e) if k.refused => f
                .problems
                .push(format!("KMS {}: keyplan's credentials refused: {e}", k.kms)),
            Some(e) if !keys.iter().any(|x| x.kms == k.kms && !x.readable) => f
                .unchecked
                .push(format!("KMS {}: credentials not checked: {e}", k.kms)),
            _ => {}
        }
    }
    report
}

/// One key's report: from the observation when there is one, else read from its KMS now.
fn key_report(
    engine: &Engine,
    observed: Option<&Observed>,
    id: &str,
    committed: &BTreeSet<String>,
    now: u64,
    f: &mut Findings,
) -> KeyReport {
    let plan = engine.plan();
    let key = &plan.keys[id];
    let provider = plan
        .kms
        .get(&key.kms)
        .map_or("unknown", |k| k.provider())
        .to_string();
    // Err((what, damaged)): damaged when the KMS answered with something wrong (corrupt
    // data, a missing version): a problem; otherwise it could not be asked.
    let state: Result<KeyState, (String, bool)> = match observed.and_then(|o| o.keys.get(id)) {
        Some(st) => Ok(st.clone()),
        None => engine
            .world()
            .kms_for(plan, id)
            .map_err(|e| (e.to_string(), false))
            .and_then(|k| {
                k.read(&key.name).map_err(|e| {
                    let damaged = matches!(
                        e,
                        crate::kms::KmsError::Corrupt { .. }
                            | crate::kms::KmsError::NoSuchVersion { .. }
                    );
                    (e.to_string(), damaged)
                })
            }),
    };
    let mut kr = KeyReport {
        id: id.to_string(),
        kms: key.kms.clone(),
        provider,
        name: key.name.clone(),
        readable: true,
        error: None,
        current: None,
        missing: false,
        rotate_after_seconds: key.rotate_after.map(|d| d.as_secs()),
        rotation_due_at: None,
        overdue: false,
        pending: None,
        retained: Vec::new(),
    };
    let st = match state {
        Ok(st) => st,
        Err((e, damaged)) => {
            if damaged {
                f.problems
                    .push(format!("key {id}: KMS {} unreadable: {e}", key.kms));
            } else {
                let (keys, _) = f
                    .unreadable
                    .entry(key.kms.clone())
                    .or_insert_with(|| (Vec::new(), e.clone()));
                keys.push(id.to_string());
            }
            kr.readable = false;
            kr.error = Some(e);
            return kr;
        }
    };
    if let Some(c) = st.current_info() {
        kr.current = Some(CurrentReport {
            version: c.version,
            created_at: c.created_at,
            age_seconds: now.saturating_sub(c.created_at),
        });
        if let Some(limit) = key.rotate_after {
            let due = c.created_at.saturating_add(limit.as_secs());
            kr.rotation_due_at = Some(due);
            if due <= now {
                kr.overdue = true;
                f.problems.push(format!(
                    "key {id}: rotation overdue by {} (rotate_after {})",
                    diff::short_duration(std::time::Duration::from_secs(now - due)),
                    key.rotate_after_text.as_deref().unwrap_or("?")
                ));
            }
        }
        skipped_rotations(plan, observed, id, &st, &kr, f);
    } else if committed.contains(id) {
        kr.missing = true;
        f.problems.push(format!(
            "key {id}: missing from its KMS {} although a run committed a version",
            key.kms
        ));
    }
    kr.pending = st.pending;
    kr.retained = st.retained_previous();
    kr
}

/// A key that rotates on a schedule (`rotate_after`) but is also held by another plan
/// (invariant I7; not a peer node, nor this plan's own former record): every scheduled
/// rotation is skipped (`plan` says so in a note), so that is a problem here, before the key
/// is overdue.
fn skipped_rotations(
    plan: &Plan,
    observed: Option<&Observed>,
    id: &str,
    st: &KeyState,
    kr: &KeyReport,
    f: &mut Findings,
) {
    let (Some(due), Some(text)) = (kr.rotation_due_at, &plan.keys[id].rotate_after_text) else {
        return;
    };
    let mut st = st.clone();
    if let Some(o) = observed {
        st.holders.retain(|h, _| {
            let of = crate::kms::book::parse_vote(h).map_or(h.as_str(), |(of, _)| of);
            !o.former_holders.contains_key(of)
        });
    }
    let others = diff::foreign_holders(plan, id, &st);
    if others.is_empty() {
        return;
    }
    f.problems.push(format!(
        "key {id}: its scheduled rotation (rotate_after {text}, due {}) is skipped: the key is also held by another plan ({}), and a version committed from this plan ({}) would not be on that plan's devices. Rotate it from one plan that lists every device holding it; for a plan gone for good, `keyplan key release {id} --holder HOLDER` removes its record",
        crate::clock::rfc3339(due),
        others.join(", "),
        plan.holder()
    ));
}

/// The journal's last run, with its outcome; `in_progress` when it has no end record and a
/// run holds the state lock (`holder`, who holds it; only a run takes it), `unfinished` when
/// the lock is free.
fn last_run(records: &[Record], holder: Option<String>) -> Option<RunReport> {
    let r = crate::journal::last_run(records)?;
    let ended_at = records.iter().rev().find_map(|x| match &x.event {
        Event::RunEnd { .. } if x.run == r.run => Some(x.ts),
        _ => None,
    });
    let holder = match r.ended {
        Some(_) => None,
        None => holder,
    };
    let outcome = match (&r.ended, &holder) {
        (Some(o), _) => o.clone(),
        (None, Some(_)) => "in_progress".to_string(),
        (None, None) => "unfinished".to_string(),
    };
    Some(RunReport {
        id: r.run.clone(),
        started_at: r.started,
        ended_at,
        outcome,
        holder,
        error: r.last_error.clone(),
    })
}

/// The devices the run in progress (`last`, `in_progress`: it holds the state lock) still has
/// steps on, with its id; empty when no run is in progress.
fn devices_being_changed(records: &[Record], last: Option<&RunReport>) -> BTreeMap<String, String> {
    let Some(r) = last.filter(|r| r.outcome == "in_progress") else {
        return BTreeMap::new();
    };
    let Some(run) = crate::journal::last_run(records).filter(|s| s.run == r.id) else {
        return BTreeMap::new();
    };
    run.steps
        .iter()
        .zip(&run.done)
        .filter(|(_, done)| !**done)
        .filter_map(|(step, _)| step.device())
        .map(|d| (d.to_string(), run.run.clone()))
        .collect()
}

/// Whether the last run that is over succeeded: the last run, or the one before it while the
/// last one is in progress.
fn last_over_success(records: &[Record], last: Option<&RunReport>) -> Option<bool> {
    match last {
        Some(r) if r.outcome == "in_progress" => records
            .iter()
            .rposition(|x| matches!(x.event, Event::RunStart { .. }))
            .and_then(|start| crate::journal::last_run(&records[..start]))
            .map(|prev| prev.ended.as_deref() == Some("success")),
        Some(r) => Some(r.outcome == "success"),
        None => None,
    }
}

/// The plan the drift diff sees: no rotation is ever due (every `rotate_after` removed), so the
/// only changes left are drift and key-level work.
fn no_rotation_due(plan: &Plan) -> Plan {
    let mut p = plan.clone();
    for k in p.keys.values_mut() {
        k.rotate_after = None;
    }
    p
}

/// Observes the devices and finds drift (docs/monitoring.md, "Drift"): a device drifted when
/// `keyplan plan` would change it for a reason other than a key-level change (a due rotation,
/// a key not created yet, a pending version, a migration). Due rotations are taken out by
/// diffing against the plan without `rotate_after`; `enroll_with` passphrases are not tested
/// (no PBKDF run), though the diff still sees them, so it plans as `apply` would.
///
/// Devices that cannot be used ([`observe::Unavailable`]) become drift of their own (the
/// observation and the diff go around them). What stops the observation lands in `unchecked`
/// (or `problems`), with the devices marked unchecked.
/// The devices' reports from `given`, or from an observation of their headers (no PBKDF run).
fn observe_devices(
    engine: &Engine,
    given: Option<&Observed>,
    f: &mut Findings,
) -> (Option<Observed>, Vec<DeviceReport>) {
    let plan = engine.plan();
    let mut devices: Vec<DeviceReport> = plan
        .devices
        .values()
        .map(|d| DeviceReport {
            id: d.id.clone(),
            path: d.path.display().to_string(),
            checked: false,
            drifted: false,
            drift: Vec::new(),
            header_damage: Vec::new(),
            header_write_in_progress: None,
            being_changed: None,
            retired_copies: Vec::new(),
            unmanaged: None,
        })
        .collect();
    let diff_plan = no_rotation_due(plan);
    let world = engine.world();
    let obs = match given {
        Some(o) => o.clone(),
        None => match observe::observe(&diff_plan, world, Testing::HeadersOnly) {
            Ok(o) => o,
            Err(e) => {
                observation_failed(e, f);
                return (None, devices);
            }
        },
    };
    // Devices that cannot be used: drift of their own, with what to do; the rest is observed.
    for (id, u) in &obs.unavailable {
        if let Some(d) = devices.iter_mut().find(|d| d.id == *id) {
            d.checked = true;
            d.drift.push(DriftReport {
                keyslot: None,
                kind: DriftKind::Unreadable,
                detail: format!("{}; {}", u.why, u.help),
            });
        }
    }
    record_drift(&obs, &mut devices);
    match diff::diff(&diff_plan, &obs, &DiffOptions::default()) {
        Err(refusals) => {
            for r in refusals {
                let dev = r.device.as_deref().and_then(|id| {
                    let why = untested_adoption(&obs, id)?;
                    Some((devices.iter_mut().find(|d| d.id == id)?, why))
                });
                match dev {
                    // Status runs no PBKDF, so it cannot tell an adoption from a refusal.
                    Some((dev, why)) => dev.drift.push(DriftReport {
                        keyslot: None,
                        kind: DriftKind::KeyMissing,
                        detail: why,
                    }),
                    None => f
                        .problems
                        .push(format!("`keyplan apply` could not proceed: {r}")),
                }
            }
        }
        Ok(d) => {
            planned_drift(plan, &obs, &d, &mut devices);
            set_unmanaged(&mut devices, d.unmanaged);
        }
    }
    if devices.iter().all(|d| d.unmanaged.is_none()) {
        // The diff refused: what the headers show, every keyslot left as it is.
        set_unmanaged(
            &mut devices,
            crate::diff::unmanaged::unmanaged(plan, obs.devices.values(), &[]),
        );
    }
    (Some(obs), devices)
}

/// Gives each observed device of `devices` its entry of `unmanaged` (an empty one when it has
/// none).
fn set_unmanaged(
    devices: &mut [DeviceReport],
    unmanaged: Vec<crate::diff::unmanaged::DeviceUnmanaged>,
) {
    for d in devices.iter_mut().filter(|d| d.checked) {
        d.unmanaged = Some(
            unmanaged
                .iter()
                .find(|u| u.device == d.id)
                .cloned()
                .unwrap_or_else(|| crate::diff::unmanaged::DeviceUnmanaged {
                    device: d.id.clone(),
                    keyslots: Vec::new(),
                    tokens: Vec::new(),
                }),
        );
    }
}

/// Files what stopped the observation of the devices: what is wrong (a device listed twice, a
/// pinned keyslot out of range, corrupt records) as problems, what could not be looked at (a
/// KMS that cannot be read) as unchecked.
fn observation_failed(findings: Vec<crate::finding::Finding>, f: &mut Findings) {
    use crate::finding::FindingKind;
    let line = |m: &str| format!("devices could not be checked for drift: {}", first_line(m));
    for x in findings {
        match x.kind {
            FindingKind::Wrong => f.problems.push(line(&x.message)),
            FindingKind::Unreachable => f.not_observed.push(x.message),
        }
    }
}

/// Marks the observed devices checked and reports their records that drift made stale.
fn record_drift(obs: &Observed, devices: &mut [DeviceReport]) {
    for (id, st) in &obs.devices {
        let Some(d) = devices.iter_mut().find(|d| d.id == *id) else {
            continue;
        };
        d.checked = true;
        for r in &st.records {
            let kind = match r.status {
                RecordStatus::Valid => continue,
                RecordStatus::KeyslotGone => DriftKind::KeyslotGone,
                RecordStatus::Rewritten => DriftKind::KeyslotRewritten,
                RecordStatus::FailedVerify => DriftKind::Other,
            };
            let detail = match kind {
                DriftKind::KeyslotGone => format!(
                    "keyslot {} was removed outside keyplan; it held {} v{}",
                    r.slot, r.record.key, r.record.version
                ),
                _ => format!(
                    "keyslot {} was rewritten outside keyplan (a new salt or KDF); `keyplan plan` tests whether it still holds {} v{} (one PBKDF run) and keeps managing it if so",
                    r.slot, r.record.key, r.record.version
                ),
            };
            d.drift.push(DriftReport {
                keyslot: Some(r.slot),
                kind,
                detail,
            });
        }
    }
}

/// Classifies the keyslot changes of the no-rotation diff `d` that key-level work does not
/// explain as drift of their device.
fn planned_drift(plan: &Plan, obs: &Observed, d: &diff::Diff, devices: &mut [DeviceReport]) {
    let key_work: BTreeSet<&str> = d.keys.iter().map(|k| k.key.as_str()).collect();
    for (i, c) in d.slots.iter().enumerate() {
        if c.reason_code == diff::ReasonCode::KeyRenamed {
            if let Some(dev) = devices.iter_mut().find(|x| x.id == c.device) {
                dev.drift.push(DriftReport {
                    keyslot: Some(c.slot),
                    kind: DriftKind::KeyRenamed,
                    detail: format!(
                        "`keyplan apply` would rewrite the record of keyslot {}: {}",
                        c.slot, c.reason
                    ),
                });
            }
            continue;
        }
        if c.action == SlotAction::Drift {
            continue; // reported from the records
        }
        if c.key.as_deref().is_some_and(|k| key_work.contains(k)) {
            continue; // explained by key-level work `keyplan plan` shows
        }
        let Some(dev) = devices.iter_mut().find(|x| x.id == c.device) else {
            continue;
        };
        if c.reason_code == diff::ReasonCode::PbkdfRewrap {
            // One finding per re-wrapped keyslot: the kill of the old keyslot names it (the
            // add beside it is the same fact, and a temporary keyslot, added before it is
            // killed, is no finding).
            let temporary = d.slots[..i]
                .iter()
                .any(|o| o.device == c.device && o.slot == c.slot && o.action == SlotAction::Add);
            if let (SlotAction::Remove, Some(k), Some(v), false) =
                (c.action, &c.key, c.version, temporary)
            {
                dev.drift.push(DriftReport {
                    keyslot: Some(c.slot),
                    kind: DriftKind::Pbkdf,
                    detail: format!(
                        "`keyplan apply` would re-wrap keyslot {} ({k} v{v}) {}",
                        c.slot,
                        c.reason
                            .strip_prefix("re-wrap: ")
                            .map(|r| format!("for the plan's PBKDF: {r}"))
                            .or_else(|| c.reason.strip_prefix("re-wrap ").map(str::to_string))
                            .unwrap_or_else(|| c.reason.clone())
                    ),
                });
            }
            continue;
        }
        let listed = plan
            .devices
            .get(&c.device)
            .is_some_and(|pd| pd.keys.iter().any(|k| Some(&k.key) == c.key.as_ref()));
        let holds_other = |key: &str| {
            obs.devices
                .get(&c.device)
                .is_some_and(|st| st.slots_of(key).iter().any(|(_, v)| Some(*v) != c.version))
        };
        let kind = match (c.action, c.key.as_deref()) {
            (SlotAction::Add, Some(k)) if holds_other(k) => DriftKind::StaleVersion,
            (SlotAction::Add, Some(_)) => DriftKind::KeyMissing,
            (SlotAction::Remove, None) => DriftKind::UnmanagedKeyslot,
            (SlotAction::Remove, Some(_)) if !listed => DriftKind::KeyNotListed,
            (SlotAction::Remove, Some(_)) => DriftKind::StaleVersion,
            _ => DriftKind::Other,
        };
        let (keyslot, what) = match (c.action, &c.key, c.version) {
            (SlotAction::Add, Some(k), Some(v)) => {
                (None, format!("would add {k} v{v} in keyslot {}", c.slot))
            }
            (SlotAction::Remove, Some(k), Some(v)) => (
                Some(c.slot),
                format!("would remove keyslot {} ({k} v{v})", c.slot),
            ),
            _ => (Some(c.slot), format!("would change keyslot {}", c.slot)),
        };
        dev.drift.push(DriftReport {
            keyslot,
            kind,
            detail: format!("`keyplan apply` {what}: {}", c.reason),
        });
    }
}

/// Why device `id` may be waiting to be adopted: a key it lists has a KMS current version no
/// record on it holds, and keyslots no record names may hold that version (what `plan` tests
/// with one PBKDF run per keyslot, and `status` does not: [`observe::Untested`]). `None` when
/// no keyslot could be adopted (then the planner's refusal stands).
fn untested_adoption(obs: &Observed, id: &str) -> Option<String> {
    let u = obs.devices.get(id)?.adoption_untested.as_ref()?;
    let slots: Vec<String> = u.slots.iter().map(u32::to_string).collect();
    Some(format!(
        "{} v{} is recorded in no keyslot, and keyslot {} (not made by keyplan) may hold it: `keyplan plan` tests that (status runs no PBKDF) and plans the adoption, or says why not",
        u.key,
        u.version,
        slots.join(", ")
    ))
}

/// The first line of a (possibly multi-line) message.
fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}
