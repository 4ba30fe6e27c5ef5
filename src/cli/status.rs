//! `keyplan status`: per-key health and per-device drift, for people (text) and monitoring
//! (`--format json`, `--format prometheus`). See docs/monitoring.md for the definitions (drift,
//! healthy, exit codes) and the metric names.

use serde::Serialize;

use super::*;
use crate::diff::SlotAction;
use crate::kms::KeyState;
use crate::observe::{Observed, RecordStatus};

/// Version of the JSON document `status --format json` writes (minor versions only add fields).
const FORMAT_VERSION: &str = "1.0";

/// The whole report: what every output format renders.
#[derive(Debug, Serialize)]
struct Report {
    /// Always [`FORMAT_VERSION`].
    format_version: &'static str,
    /// When the report was made, Unix seconds (UTC).
    generated_at: u64,
    /// True when `problems` is empty (exit code 0).
    healthy: bool,
    /// One line per reason the status is unhealthy.
    problems: Vec<String>,
    /// Keys in plan order.
    keys: Vec<KeyReport>,
    /// Devices in plan order.
    devices: Vec<DeviceReport>,
    /// The last run in the journal, if any.
    last_run: Option<RunReport>,
    /// When the last run that ended with `success` ended, Unix seconds.
    last_success_at: Option<u64>,
    /// Whether the last run that is over (ended, or stopped without an end record and no
    /// longer holding the state lock) succeeded; `None` before the first such run. Equals
    /// `last_run.outcome == "success"` unless the last run is `in_progress`, in which case it
    /// describes the run before it. Feeds `keyplan_last_run_success` only.
    #[serde(skip)]
    last_over_success: Option<bool>,
}

/// One key.
#[derive(Debug, Serialize)]
struct KeyReport {
    id: String,
    /// KMS instance name from the plan.
    kms: String,
    /// Provider of that instance (`file`, `vault`, ...).
    provider: String,
    /// Name of the key in the KMS.
    name: String,
    /// False when the KMS could not be read (`error` says why).
    readable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    current: Option<CurrentReport>,
    /// True when a run committed a version of this key but the KMS has no current version.
    missing: bool,
    rotate_after_seconds: Option<u64>,
    /// `current.created_at + rotate_after_seconds`, Unix seconds.
    rotation_due_at: Option<u64>,
    overdue: bool,
    /// Version staged by a run that has not committed it yet.
    pending: Option<u64>,
    /// Older versions whose material the KMS still holds.
    retained: Vec<u64>,
}

/// A key's current version.
#[derive(Debug, Serialize)]
struct CurrentReport {
    version: u64,
    /// Unix seconds.
    created_at: u64,
    age_seconds: u64,
}

/// One device.
#[derive(Debug, Serialize)]
struct DeviceReport {
    id: String,
    path: String,
    /// False when drift could not be determined (the KMS or the plan stopped the
    /// observation; `problems` says why).
    checked: bool,
    drifted: bool,
    drift: Vec<DriftReport>,
}

/// One drift finding.
#[derive(Debug, Serialize)]
struct DriftReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    keyslot: Option<u32>,
    kind: DriftKind,
    detail: String,
}

/// Kinds of drift (docs/monitoring.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum DriftKind {
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
    /// Any other change `keyplan plan` would make on the device.
    Other,
}

/// The last run.
#[derive(Debug, Serialize)]
struct RunReport {
    id: String,
    /// Unix seconds.
    started_at: u64,
    /// Unix seconds; `None` when the run has no end record.
    ended_at: Option<u64>,
    /// `success`, `failed`, `interrupted` (signal), `in_progress` (no end record, and a run
    /// holds the state lock right now), or `unfinished` (no end record and the lock is free:
    /// killed or crashed).
    outcome: String,
    /// Who holds the state lock (`pid P on host H since T`), for an `in_progress` run only.
    #[serde(skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
    /// The last error recorded for the run (never key material).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// `keyplan status`: builds the report, renders it as `format` to stdout or atomically to
/// `output`, and returns exit code 0 when healthy, 1 otherwise (DESIGN.md §4).
///
/// Reads the KMSs, the journal and the LUKS headers; writes nothing but `output`. Costs no
/// PBKDF run.
///
/// Errors: the plan cannot be loaded, a KMS client cannot be built, or `output` cannot be
/// written (all exit 1).
pub(super) fn cmd_status(
    cli: &Cli,
    arg: &PlanArg,
    format: StatusFormat,
    output: Option<&std::path::Path>,
) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    let world = World::open(&plan)?;
    let report = build(&plan, &world);
    tracing::debug!(pbkdf_runs = world.cs.pbkdf_runs(), "status observed");
    let text = match format {
        StatusFormat::Text => render_text(&report),
        StatusFormat::Json => {
            let mut s = serde_json::to_string_pretty(&report).into_diagnostic()?;
            s.push('\n');
            s
        }
        StatusFormat::Prometheus => render_prometheus(&report),
    };
    match output {
        None => out!("{text}"),
        Some(path) => crate::fsutil::write_atomic(path, text.as_bytes(), 0o644).map_err(|e| {
            miette!(
                help = "check that the directory exists and is writable; the previous file (if any) was left as it was",
                "cannot write the status to {}: {e}",
                path.display()
            )
        })?,
    }
    Ok(if report.healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Gathers everything: KMS state per key, drift per device, the journal's last run.
fn build(plan: &Plan, world: &World) -> Report {
    let now = crate::clock::now_unix();
    let mut problems = Vec::new();
    let records = match crate::journal::read(&plan.state_dir) {
        Ok(r) => r,
        Err(e) => {
            problems.push(format!("journal unreadable: {e}"));
            Vec::new()
        }
    };
    let committed = committed_keys(&records);

    let (observed, mut devices) = observe_devices(plan, world, &mut problems);

    let mut keys = Vec::new();
    for (id, key) in &plan.keys {
        let provider = plan
            .kms
            .get(&key.kms)
            .map_or("unknown", |k| k.provider())
            .to_string();
        let state: Result<KeyState, String> = match observed.as_ref().and_then(|o| o.keys.get(id)) {
            Some(st) => Ok(st.clone()),
            None => world
                .kms_for(plan, id)
                .and_then(|k| k.read(&key.name).map_err(|e| e.to_string())),
        };
        let mut kr = KeyReport {
            id: id.clone(),
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
        match state {
            Err(e) => {
                problems.push(format!("key {id}: KMS {} unreadable: {e}", key.kms));
                kr.readable = false;
                kr.error = Some(e);
            }
            Ok(st) => {
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
                            problems.push(format!(
                                "key {id}: rotation overdue by {} (rotate_after {})",
                                diff::short_duration(std::time::Duration::from_secs(now - due)),
                                key.rotate_after_text.as_deref().unwrap_or("?")
                            ));
                        }
                    }
                } else if committed.contains(id) {
                    kr.missing = true;
                    problems.push(format!(
                        "key {id}: missing from its KMS {} although a run committed a version",
                        key.kms
                    ));
                }
                kr.pending = st.pending;
                kr.retained = st.retained_previous();
            }
        }
        keys.push(kr);
    }

    let last_run = crate::journal::last_run(&records).map(|r| {
        let ended_at = records.iter().rev().find_map(|x| match &x.event {
            crate::journal::Event::RunEnd { .. } if x.run == r.run => Some(x.ts),
            _ => None,
        });
        // No end record: running now if someone holds the state lock (only a run takes
        // it), else killed or crashed.
        let holder = match r.ended {
            Some(_) => None,
            None => crate::journal::lock_holder(&plan.state_dir),
        };
        let outcome = match (&r.ended, &holder) {
            (Some(o), _) => o.clone(),
            (None, Some(_)) => "in_progress".to_string(),
            (None, None) => "unfinished".to_string(),
        };
        RunReport {
            id: r.run.clone(),
            started_at: r.started,
            ended_at,
            outcome,
            holder,
            error: r.last_error.clone(),
        }
    });
    // The last run that is over: the last run, or the one before it while it is in progress.
    let last_over_success = match &last_run {
        Some(r) if r.outcome == "in_progress" => records
            .iter()
            .rposition(|x| matches!(x.event, crate::journal::Event::RunStart { .. }))
            .and_then(|start| crate::journal::last_run(&records[..start]))
            .map(|prev| prev.ended.as_deref() == Some("success")),
        Some(r) => Some(r.outcome == "success"),
        None => None,
    };
    if let Some(r) = &last_run {
        if r.outcome != "success" && r.outcome != "in_progress" {
            problems.push(format!(
                "last run {} {} (`keyplan journal` shows its steps; `keyplan apply` finishes or retries it)",
                r.id, r.outcome
            ));
        }
    }
    let last_success_at = records.iter().rev().find_map(|x| match &x.event {
        crate::journal::Event::RunEnd { outcome, .. } if outcome == "success" => Some(x.ts),
        _ => None,
    });

    for d in &mut devices {
        d.drifted = !d.drift.is_empty();
        if d.drifted {
            let kinds: BTreeSet<String> = d
                .drift
                .iter()
                .map(|f| kind_name(f.kind).to_string())
                .collect();
            problems.push(format!(
                "device {} drifted ({}; `keyplan plan` shows the repair)",
                d.id,
                kinds.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }

    Report {
        format_version: FORMAT_VERSION,
        generated_at: now,
        healthy: problems.is_empty(),
        problems,
        keys,
        devices,
        last_run,
        last_success_at,
        last_over_success,
    }
}

/// The serde name of a drift kind (`key_missing`, ...).
fn kind_name(k: DriftKind) -> &'static str {
    match k {
        DriftKind::Unreadable => "unreadable",
        DriftKind::KeyslotGone => "keyslot_gone",
        DriftKind::KeyslotRewritten => "keyslot_rewritten",
        DriftKind::KeyMissing => "key_missing",
        DriftKind::StaleVersion => "stale_version",
        DriftKind::KeyNotListed => "key_not_listed",
        DriftKind::UnmanagedKeyslot => "unmanaged_keyslot",
        DriftKind::Other => "other",
    }
}

/// Observes the devices and finds drift (docs/monitoring.md, "Drift"): a device drifted when
/// `keyplan plan` would change it for a reason other than a key-level change (a due
/// rotation, a key not created yet, a pending version, a migration). Due rotations are
/// taken out by diffing against the plan without `rotate_after`.
///
/// No PBKDF run: the `enroll_with` passphrases are not tested (observation runs on a copy of
/// the plan without them; the diff still sees them, so it plans as `apply` would).
///
/// Unreadable devices become drift of their own and are left out of the diff. Problems that
/// stop the observation or the diff land in `problems`, with the devices marked unchecked.
fn observe_devices(
    plan: &Plan,
    world: &World,
    problems: &mut Vec<String>,
) -> (Option<Observed>, Vec<DeviceReport>) {
    let mut devices: Vec<DeviceReport> = plan
        .devices
        .values()
        .map(|d| DeviceReport {
            id: d.id.clone(),
            path: d.path.display().to_string(),
            checked: false,
            drifted: false,
            drift: Vec::new(),
        })
        .collect();
    // The plan the diff sees: no rotation is ever due, so the only changes left are drift
    // and key-level work.
    let mut diff_plan = plan.clone();
    for k in diff_plan.keys.values_mut() {
        k.rotate_after = None;
    }
    let quiet = |p: &Plan| {
        let mut q = p.clone();
        for d in q.devices.values_mut() {
            d.enroll_with = None;
        }
        q
    };
    let observed = match observe::observe(&quiet(&diff_plan), world) {
        Ok(o) => Some(o),
        Err(_) => {
            // Find the devices that cannot be read, report them, and observe the rest.
            for dev in plan.devices.values() {
                let why = match world.cs.dump(&dev.path) {
                    Err(e) => Some(e.to_string()),
                    Ok(h) => match &dev.uuid {
                        Some(want) if !want.eq_ignore_ascii_case(&h.uuid) => Some(format!(
                            "it has LUKS UUID {}, not the plan's {want}",
                            h.uuid
                        )),
                        _ => None,
                    },
                };
                if let Some(why) = why {
                    diff_plan.devices.remove(&dev.id);
                    if let Some(d) = devices.iter_mut().find(|d| d.id == dev.id) {
                        d.checked = true;
                        d.drift.push(DriftReport {
                            keyslot: None,
                            kind: DriftKind::Unreadable,
                            detail: why,
                        });
                    }
                }
            }
            match observe::observe(&quiet(&diff_plan), world) {
                Ok(o) => Some(o),
                Err(e) => {
                    problems.push(format!(
                        "devices could not be checked for drift: {}",
                        first_line(&e.to_string())
                    ));
                    None
                }
            }
        }
    };
    let Some(obs) = observed else {
        return (None, devices);
    };
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
            d.drift.push(DriftReport {
                keyslot: Some(r.slot),
                kind,
                detail: match kind {
                    DriftKind::KeyslotGone => format!(
                        "keyslot {} was removed outside keyplan; it held {} v{}",
                        r.slot, r.record.key, r.record.version
                    ),
                    _ => format!(
                        "keyslot {} was rewritten outside keyplan; it no longer holds {} v{}",
                        r.slot, r.record.key, r.record.version
                    ),
                },
            });
        }
    }
    match diff::diff(&diff_plan, &obs, &DiffOptions::default()) {
        Err(errs) => {
            for e in errs {
                problems.push(format!("`keyplan apply` could not proceed: {e}"));
            }
        }
        Ok(d) => {
            let key_work: BTreeSet<&str> = d.keys.iter().map(|k| k.key.as_str()).collect();
            for c in &d.slots {
                if c.action == SlotAction::Drift {
                    continue; // reported from the records above
                }
                if c.key.as_deref().is_some_and(|k| key_work.contains(k)) {
                    continue; // explained by key-level work `keyplan plan` shows
                }
                let Some(dev) = devices.iter_mut().find(|x| x.id == c.device) else {
                    continue;
                };
                let listed = plan
                    .devices
                    .get(&c.device)
                    .is_some_and(|pd| pd.keys.iter().any(|k| Some(&k.key) == c.key.as_ref()));
                let holds_other = |key: &str| {
                    obs.devices.get(&c.device).is_some_and(|st| {
                        st.slots_of(key).iter().any(|(_, v)| Some(*v) != c.version)
                    })
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
    }
    (Some(obs), devices)
}

/// The first line of a (possibly multi-line) message.
fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// Unix seconds as RFC 3339 (UTC, whole seconds).
fn rfc3339(t: u64) -> String {
    crate::clock::rfc3339(t)
}

/// The report for people.
fn render_text(r: &Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let dur = |secs: u64| diff::short_duration(std::time::Duration::from_secs(secs));
    for k in &r.keys {
        let _ = writeln!(s, "key {} in {} KMS {}:", k.id, k.provider, k.kms);
        if let Some(e) = &k.error {
            let _ = writeln!(s, "  cannot read: {e}");
            continue;
        }
        match &k.current {
            None if k.missing => {
                let _ = writeln!(s, "  NO CURRENT VERSION, although a run committed one: the KMS lost the key or the plan points at the wrong KMS/name (`keyplan plan` explains)");
            }
            None => {
                let _ = writeln!(s, "  no current version (not created yet)");
            }
            Some(c) => {
                let _ = writeln!(s, "  current  v{} ({} old)", c.version, dur(c.age_seconds));
            }
        }
        if let Some(due) = k.rotation_due_at {
            if k.overdue {
                let _ = writeln!(
                    s,
                    "  rotation OVERDUE by {} (due {})",
                    dur(r.generated_at.saturating_sub(due)),
                    rfc3339(due)
                );
            } else {
                let _ = writeln!(
                    s,
                    "  rotation due in {} ({})",
                    dur(due.saturating_sub(r.generated_at)),
                    rfc3339(due)
                );
            }
        }
        if let Some(p) = k.pending {
            let _ = writeln!(
                s,
                "  pending  v{p} (a rotation is under way: run `keyplan apply`)"
            );
        }
        if !k.retained.is_empty() {
            let list: Vec<String> = k.retained.iter().map(|v| format!("v{v}")).collect();
            let _ = writeln!(
                s,
                "  retained {} (material kept until no device holds it)",
                list.join(", ")
            );
        }
    }
    for d in &r.devices {
        if !d.checked {
            let _ = writeln!(s, "device {} ({}): not checked", d.id, d.path);
        } else if d.drift.is_empty() {
            let _ = writeln!(s, "device {} ({}): no drift", d.id, d.path);
        } else {
            let _ = writeln!(s, "device {} ({}): DRIFT", d.id, d.path);
            for f in &d.drift {
                let _ = writeln!(s, "  {}: {}", kind_name(f.kind), f.detail);
            }
        }
    }
    match &r.last_run {
        None => {
            let _ = writeln!(s, "last run: none");
        }
        Some(run) => {
            let outcome = match &run.holder {
                Some(h) => format!("in progress ({h})"),
                None => run.outcome.clone(),
            };
            let _ = writeln!(
                s,
                "last run: {} ({outcome}), started {}",
                run.id,
                rfc3339(run.started_at)
            );
            if let Some(e) = &run.error {
                let _ = writeln!(s, "  error: {}", first_line(e));
            }
        }
    }
    if !r.healthy {
        let _ = writeln!(s, "UNHEALTHY: {}", r.problems.join("; "));
    }
    s
}

/// Escapes a label value per the Prometheus text exposition format: `\`, `"` and newline.
fn label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// One gauge family: `# HELP`, `# TYPE`, then its samples (labels already escaped).
struct Family {
    name: &'static str,
    help: &'static str,
    samples: Vec<(String, u64)>,
}

impl Family {
    fn new(name: &'static str, help: &'static str) -> Family {
        Family {
            name,
            help,
            samples: Vec::new(),
        }
    }
    /// Adds a sample with `labels` (`(name, raw value)` pairs).
    fn add(&mut self, labels: &[(&str, &str)], value: u64) {
        let l = if labels.is_empty() {
            String::new()
        } else {
            let parts: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", label_value(v)))
                .collect();
            format!("{{{}}}", parts.join(","))
        };
        self.samples.push((l, value));
    }
}

/// The report as node_exporter textfile metrics (Prometheus text exposition format 0.0.4),
/// all gauges. Written by hand: see docs/monitoring.md for why not a metrics crate.
fn render_prometheus(r: &Report) -> String {
    use std::fmt::Write as _;
    let b = |x: bool| u64::from(x);
    let mut generated = Family::new(
        "keyplan_status_generated_timestamp_seconds",
        "When keyplan status wrote these metrics (Unix seconds).",
    );
    generated.add(&[], r.generated_at);
    let mut healthy = Family::new(
        "keyplan_status_healthy",
        "1 when keyplan status found no problem (its exit code was 0), else 0.",
    );
    healthy.add(&[], b(r.healthy));
    let mut readable = Family::new(
        "keyplan_key_kms_readable",
        "1 when the key's KMS could be read, else 0.",
    );
    let mut version = Family::new(
        "keyplan_key_current_version",
        "Current version number of the key in its KMS.",
    );
    let mut created = Family::new(
        "keyplan_key_created_timestamp_seconds",
        "When the key's current version was created (Unix seconds).",
    );
    let mut age = Family::new(
        "keyplan_key_age_seconds",
        "Age of the key's current version in seconds.",
    );
    let mut due = Family::new(
        "keyplan_key_rotation_due_timestamp_seconds",
        "When the key's current version reaches rotate_after (Unix seconds); keyplan apply rotates it from then on.",
    );
    let mut overdue = Family::new(
        "keyplan_key_rotation_overdue",
        "1 when the key's rotation is due and has not happened, else 0.",
    );
    let mut pending = Family::new(
        "keyplan_key_pending",
        "1 when a staged version awaits commit (a rotation under way or interrupted), else 0.",
    );
    let mut retained = Family::new(
        "keyplan_key_retained_versions",
        "Number of older versions whose material the KMS still holds.",
    );
    let mut missing = Family::new(
        "keyplan_key_missing",
        "1 when a run committed a version of the key but its KMS has no current version, else 0.",
    );
    for k in &r.keys {
        let labels = [("key", k.id.as_str()), ("kms", k.kms.as_str())];
        readable.add(&labels, b(k.readable));
        if !k.readable {
            continue;
        }
        missing.add(&labels, b(k.missing));
        pending.add(&labels, b(k.pending.is_some()));
        retained.add(&labels, k.retained.len() as u64);
        if let Some(c) = &k.current {
            version.add(&labels, c.version);
            created.add(&labels, c.created_at);
            age.add(&labels, c.age_seconds);
        }
        if let Some(d) = k.rotation_due_at {
            due.add(&labels, d);
            overdue.add(&labels, b(k.overdue));
        }
    }
    let mut drift = Family::new(
        "keyplan_device_drift",
        "1 when the device drifted from the plan or cannot be read (see keyplan status), else 0; absent when it was left unchecked because the observation stopped (a KMS could not be read).",
    );
    let mut findings = Family::new(
        "keyplan_device_drift_findings",
        "Number of drift findings on the device.",
    );
    let mut drift_devices = Family::new(
        "keyplan_drift_devices",
        "Number of devices that drifted from the plan.",
    );
    for d in r.devices.iter().filter(|d| d.checked) {
        let labels = [("device", d.id.as_str())];
        drift.add(&labels, b(d.drifted));
        findings.add(&labels, d.drift.len() as u64);
    }
    drift_devices.add(&[], r.devices.iter().filter(|d| d.drifted).count() as u64);
    let mut run_success = Family::new(
        "keyplan_last_run_success",
        "1 when the last keyplan apply run that is over ended with success, else 0 (failed, interrupted, or stopped without an end record); a run in progress does not count; absent before the first such run.",
    );
    let mut run_in_progress = Family::new(
        "keyplan_run_in_progress",
        "1 when a keyplan apply run holds the state lock and has not ended yet, else 0.",
    );
    let mut run_started = Family::new(
        "keyplan_last_run_timestamp_seconds",
        "When the last keyplan apply run started (Unix seconds), including a run in progress.",
    );
    let mut last_success = Family::new(
        "keyplan_last_success_timestamp_seconds",
        "When the last successful keyplan apply run ended (Unix seconds).",
    );
    if let Some(ok) = r.last_over_success {
        run_success.add(&[], b(ok));
    }
    run_in_progress.add(
        &[],
        b(r.last_run
            .as_ref()
            .is_some_and(|run| run.outcome == "in_progress")),
    );
    if let Some(run) = &r.last_run {
        run_started.add(&[], run.started_at);
    }
    if let Some(t) = r.last_success_at {
        last_success.add(&[], t);
    }
    let mut s = String::new();
    for f in [
        generated,
        healthy,
        readable,
        version,
        created,
        age,
        due,
        overdue,
        pending,
        retained,
        missing,
        drift,
        findings,
        drift_devices,
        run_success,
        run_in_progress,
        run_started,
        last_success,
    ] {
        if f.samples.is_empty() {
            continue;
        }
        let _ = writeln!(s, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(s, "# TYPE {} gauge", f.name);
        for (labels, v) in &f.samples {
            let _ = writeln!(s, "{}{labels} {v}", f.name);
        }
    }
    s
}

/// Key ids for which a run of the journal finished a commit or a migration copy (the key
/// existed in its KMS then).
pub(super) fn committed_keys(records: &[crate::journal::Record]) -> BTreeSet<String> {
    use crate::graph::Step;
    let mut steps: BTreeMap<&str, &Vec<Step>> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for r in records {
        match &r.event {
            crate::journal::Event::RunStart { steps: s, .. } => {
                steps.insert(r.run.as_str(), s);
            }
            crate::journal::Event::StepDone { step, .. } => {
                if let Some(Step::Commit { key, .. } | Step::MigrateCopy { key, .. }) =
                    steps.get(r.run.as_str()).and_then(|s| s.get(*step))
                {
                    out.insert(key.clone());
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(label_value("x\ny"), "x\\ny");
        assert_eq!(label_value("plain-id_1"), "plain-id_1");
    }
}
