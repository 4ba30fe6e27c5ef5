//! `status`: per key its KMS state and rotation schedule, per device its drift from the plan,
//! and the journal's last run, as one [`StatusReport`] (rendered by `render::status` as text,
//! JSON or Prometheus metrics; docs/monitoring.md has the definitions).
//!
//! Reads the KMSs, the journal and the LUKS headers; writes nothing; no PBKDF run. It tells a
//! problem it found ([`Verdict::Problem`]) apart from something it could not check
//! ([`Verdict::Unknown`]).

mod devices;
mod findings;
mod keys;
mod look;
mod runs;

use std::collections::BTreeMap;

use serde::Serialize;

use super::credentials::KmsCredentials;
use super::Engine;
use crate::observe::Observed;
use crate::spec::Plan;

use look::status_look;

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
    /// True when `pending` has no current version before it and nothing shows it is this
    /// plan's creation ([`crate::diff::unclaimed_creation`]): an interrupted `keyplan key
    /// import` (run again, it commits it) or another plan creating the key; `apply` does not
    /// finish it. For the text only (the JSON document has `pending` and `current`).
    #[serde(skip)]
    pub pending_unclaimed: bool,
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
    let mut report = looked(engine, given);
    // Another plan's state directory: read on (a report is read-only), but what it shows of
    // the journal and the records is that plan's, and this plan cannot run: a problem.
    if let Some(e) = engine.foreign_state_dir() {
        report.problems.insert(0, e.read_only_warning());
        report.verdict = Verdict::Problem;
        report.healthy = false;
    }
    report
}

/// The report of [`status_with`], looked at again while runs start or end.
fn looked(engine: &Engine, given: Option<&Observed>) -> StatusReport {
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
