//! The `status` report ([`crate::ops::status::StatusReport`]) for people (text), programs
//! (JSON) and monitoring (Prometheus text exposition format 0.0.4 for node_exporter's textfile
//! collector, written by the `prometheus-client` crate). docs/monitoring.md documents every
//! field and metric.

use std::fmt::Write as _;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{prometheus_text, DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::clock::rfc3339;
use crate::diff::short_duration;
use crate::ops::status::{DriftKind, StatusReport};

/// The report as pretty-printed JSON (one document, `format_version` first, newline at the
/// end).
///
/// Errors: serialization failed (does not happen for this report).
pub fn json(r: &StatusReport) -> Result<String, serde_json::Error> {
    let mut s = serde_json::to_string_pretty(r)?;
    s.push('\n');
    Ok(s)
}

/// The report for people: one block per key, one line (or block) per device, the last run,
/// and a closing `UNHEALTHY:` / `NOT CHECKED:` line saying why the exit code is not 0.
pub fn text(r: &StatusReport) -> String {
    let mut s = String::new();
    if let Some(n) = &r.node {
        let elsewhere: usize = n.devices_elsewhere.values().sum();
        let _ =
            writeln!(
            s,
            "node {}: {} device{} here; {elsewhere} on {} other node{}, {} key{} used only there",
            n.name,
            r.devices.len(),
            if r.devices.len() == 1 { "" } else { "s" },
            n.devices_elsewhere.len(),
            if n.devices_elsewhere.len() == 1 { "" } else { "s" },
            n.keys_elsewhere.len(),
            if n.keys_elsewhere.len() == 1 { "" } else { "s" },
        );
    }
    for k in &r.keys {
        key_text(&mut s, r, k);
    }
    for k in &r.kms {
        credentials_text(&mut s, r.generated_at, k);
    }
    for d in &r.devices {
        if !d.checked {
            let _ = writeln!(s, "device {} ({}): not checked", d.id, d.path);
        } else if d.drift.is_empty() {
            let _ = writeln!(s, "device {} ({}): no drift", d.id, d.path);
        } else {
            let _ = writeln!(s, "device {} ({}): DRIFT", d.id, d.path);
            for f in &d.drift {
                let _ = writeln!(s, "  {}: {}", f.kind.name(), f.detail);
            }
        }
        if let Some(w) = &d.header_write_in_progress {
            let _ = writeln!(s, "  header: {w}");
        }
        if let Some(what) = d.unmanaged.as_ref().and_then(|u| u.describe_kept()) {
            let _ = writeln!(s, "  not managed by keyplan: {what}");
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
                let _ = writeln!(s, "  error: {}", e.lines().next().unwrap_or(e));
            }
            if run.outcome != "success" {
                let _ = match r.last_success_at {
                    Some(t) => writeln!(s, "  last success: {}", rfc3339(t)),
                    None => writeln!(s, "  last success: none"),
                };
            }
        }
    }
    if !r.problems.is_empty() {
        let _ = writeln!(s, "UNHEALTHY: {}", r.problems.join("; "));
    }
    if !r.unchecked.is_empty() {
        let _ = writeln!(s, "NOT CHECKED: {}", r.unchecked.join("; "));
    }
    s
}

/// One KMS's credentials block of [`text`]; nothing for a KMS without credentials to report.
fn credentials_text(s: &mut String, now: u64, k: &crate::ops::credentials::KmsCredentials) {
    if k.credentials.is_empty() && k.error.is_none() {
        return;
    }
    let _ = writeln!(s, "KMS {} ({}) credentials:", k.kms, k.provider);
    if let Some(e) = &k.error {
        let _ = writeln!(s, "  cannot look at them: {e}");
    }
    for c in &k.credentials {
        let cred = &c.credential;
        let expiry = match cred.expires_at {
            None => "no expiry known".to_string(),
            Some(t) if t <= now => format!("EXPIRED {}", rfc3339(t)),
            Some(t) => format!(
                "expires in {} ({})",
                short_duration(std::time::Duration::from_secs(t - now)),
                rfc3339(t)
            ),
        };
        let renewal = match (&cred.renewed_by, cred.renewable_until) {
            (None, _) => String::new(),
            (Some(by), None) => format!("; {by}"),
            (Some(by), Some(t)) => format!("; {by}, until {}", rfc3339(t)),
        };
        let flag = if c.expiring { "  EXPIRING" } else { "" };
        let _ = writeln!(s, "  {}: {expiry}{renewal}{flag}", cred.what);
    }
}

/// One key's block of [`text`].
fn key_text(s: &mut String, r: &StatusReport, k: &crate::ops::status::KeyReport) {
    let dur = |secs: u64| short_duration(std::time::Duration::from_secs(secs));
    let _ = writeln!(s, "key {} in {} KMS {}:", k.id, k.provider, k.kms);
    if let Some(e) = &k.error {
        let _ = writeln!(s, "  cannot read: {e}");
        return;
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
        let why = if k.pending_unclaimed {
            format!(
                "not committed, and no device of this plan holds it: if `keyplan key import {}` was interrupted, run it again with the same passphrase on stdin; otherwise another plan is creating the key",
                k.id
            )
        } else {
            "a rotation is under way: run `keyplan apply`".to_string()
        };
        let _ = writeln!(s, "  pending  v{p} ({why})");
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

/// One gauge family: name, help text, and samples as `(labels, value)`, labels in a fixed
/// order (`key`, `kms`; `device`).
#[derive(Debug)]
struct GaugeFamily {
    name: &'static str,
    help: &'static str,
    samples: Vec<(Vec<(&'static str, String)>, u64)>,
    /// Encoded as a counter rather than a gauge.
    counter: bool,
}

impl GaugeFamily {
    fn new(name: &'static str, help: &'static str) -> GaugeFamily {
        GaugeFamily {
            name,
            help,
            samples: Vec::new(),
            counter: false,
        }
    }

    /// Adds a sample with `labels`.
    fn add(&mut self, labels: &[(&'static str, &str)], value: u64) {
        let labels = labels.iter().map(|(k, v)| (*k, (*v).to_string())).collect();
        self.samples.push((labels, value));
    }

    /// A family of one sample without labels, or none.
    fn single(name: &'static str, help: &'static str, value: Option<u64>) -> GaugeFamily {
        let mut f = GaugeFamily::new(name, help);
        if let Some(v) = value {
            f.add(&[], v);
        }
        f
    }
}

/// The report's gauge families, encoded by `prometheus-client` in this order (families, then
/// samples in plan order; a family without samples is left out, so no `# HELP` stands with
/// nothing under it).
#[derive(Debug)]
struct Gauges(Vec<GaugeFamily>);

/// Encodes one sample `v` as a counter or a gauge.
fn encode_value(
    counter: bool,
    v: u64,
    m: prometheus_client::encoding::MetricEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    if counter {
        ConstCounter::new(v).encode(m)
    } else {
        ConstGauge::new(v).encode(m)
    }
}

impl Collector for Gauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in self.0.iter().filter(|f| !f.samples.is_empty()) {
            let kind = if f.counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            let mut metric = encoder.encode_descriptor(f.name, f.help, None, kind)?;
            match f.samples.as_slice() {
                [(labels, v)] if labels.is_empty() => encode_value(f.counter, *v, metric)?,
                samples => {
                    for (labels, v) in samples {
                        encode_value(f.counter, *v, metric.encode_family(labels)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// The report as node_exporter textfile metrics (Prometheus text exposition format 0.0.4):
/// every metric a gauge, documented in docs/monitoring.md.
///
/// Errors: the encoder failed (formatting into a `String` does not fail).
pub fn prometheus(r: &StatusReport) -> Result<String, std::fmt::Error> {
    encode(families(r), Registry::default())
}

/// Every family of the report, in output order.
fn families(r: &StatusReport) -> Vec<GaugeFamily> {
    let b = |x: bool| u64::from(x);
    let mut families = vec![
        GaugeFamily::single(
            "keyplan_status_generated_timestamp_seconds",
            "When keyplan status wrote these metrics (Unix seconds).",
            Some(r.generated_at),
        ),
        GaugeFamily::single(
            "keyplan_status_healthy",
            "1 when keyplan status found no problem and could check everything (its exit code was 0), else 0.",
            Some(b(r.healthy)),
        ),
        GaugeFamily::single(
            "keyplan_status_complete",
            "1 when keyplan status could check everything, 0 when something could not be checked (its exit code is then 3 unless it found a problem).",
            Some(b(r.unchecked.is_empty())),
        ),
        GaugeFamily::single(
            "keyplan_status_problems",
            "Number of problems keyplan status found (its exit code is 1 when above 0).",
            Some(r.problems.len() as u64),
        ),
    ];
    families.extend(key_families(r));
    families.extend(device_families(r));
    families.extend(run_families(r));
    families.extend(credential_families(r));
    families
}

/// Encodes `families` into `registry` as the text exposition format.
fn encode(families: Vec<GaugeFamily>, mut registry: Registry) -> Result<String, std::fmt::Error> {
    registry.register_collector(Box::new(Gauges(families)));
    let mut s = String::new();
    prometheus_text::encode(&mut s, &registry)?;
    Ok(s)
}

/// A metric family the node agent adds to the status metrics: a gauge, or a counter (whose
/// name gets the `_total` suffix in the output).
#[derive(Debug)]
pub struct ExtraGauge(GaugeFamily);

impl ExtraGauge {
    /// A gauge family `name` without samples yet.
    pub fn new(name: &'static str, help: &'static str) -> ExtraGauge {
        ExtraGauge(GaugeFamily::new(name, help))
    }

    /// A counter family `name` (written `<name>_total`) without samples yet.
    pub fn counter(name: &'static str, help: &'static str) -> ExtraGauge {
        let mut f = GaugeFamily::new(name, help);
        f.counter = true;
        ExtraGauge(f)
    }

    /// A gauge family of one sample without labels.
    pub fn single(name: &'static str, help: &'static str, value: u64) -> ExtraGauge {
        ExtraGauge(GaugeFamily::single(name, help, Some(value)))
    }

    /// Adds a sample with `labels`.
    pub fn add(&mut self, labels: Vec<(&'static str, String)>, value: u64) {
        self.0.samples.push((labels, value));
    }
}

/// `extra` alone (for `keyplan fleet status --format prometheus`).
///
/// Errors: the encoder failed (formatting into a `String` does not fail).
pub fn prometheus_plain(extra: Vec<ExtraGauge>) -> Result<String, std::fmt::Error> {
    encode(
        extra.into_iter().map(|e| e.0).collect(),
        Registry::default(),
    )
}

/// The node agent's metrics: `r`'s families (as [`prometheus`] writes them; none before the
/// first status) and `extra`, every sample with the label `node`.
///
/// Errors: the encoder failed (formatting into a `String` does not fail).
pub fn prometheus_for_node(
    r: Option<&StatusReport>,
    node: &str,
    extra: Vec<ExtraGauge>,
) -> Result<String, std::fmt::Error> {
    let mut families = r.map(families).unwrap_or_default();
    families.extend(extra.into_iter().map(|e| e.0));
    let labels = std::iter::once((
        std::borrow::Cow::Borrowed("node"),
        std::borrow::Cow::Owned(node.to_string()),
    ));
    encode(families, Registry::with_labels(labels))
}

/// The per-key families.
fn key_families(r: &StatusReport) -> Vec<GaugeFamily> {
    let b = |x: bool| u64::from(x);
    let mut readable = GaugeFamily::new(
        "keyplan_key_kms_readable",
        "1 when the key's KMS could be read, else 0.",
    );
    let mut version = GaugeFamily::new(
        "keyplan_key_current_version",
        "Current version number of the key in its KMS.",
    );
    let mut created = GaugeFamily::new(
        "keyplan_key_created_timestamp_seconds",
        "When the key's current version was created (Unix seconds).",
    );
    let mut age = GaugeFamily::new(
        "keyplan_key_age_seconds",
        "Age of the key's current version in seconds.",
    );
    let mut due = GaugeFamily::new("keyplan_key_rotation_due_timestamp_seconds", "When the key's current version reaches rotate_after (Unix seconds); keyplan apply rotates it from then on.");
    let mut overdue = GaugeFamily::new(
        "keyplan_key_rotation_overdue",
        "1 when the key's rotation is due and has not happened, else 0.",
    );
    let mut pending = GaugeFamily::new(
        "keyplan_key_pending",
        "1 when a staged version awaits commit (a rotation under way or interrupted), else 0.",
    );
    let mut retained = GaugeFamily::new(
        "keyplan_key_retained_versions",
        "Number of older versions whose material the KMS still holds.",
    );
    let mut missing = GaugeFamily::new(
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
    vec![
        readable, version, created, age, due, overdue, pending, retained, missing,
    ]
}

/// The per-device families and the drifted-device count.
fn device_families(r: &StatusReport) -> Vec<GaugeFamily> {
    let mut drift = GaugeFamily::new("keyplan_device_drift", "1 when the device drifted from the plan or cannot be read (see keyplan status), else 0; absent when it was left unchecked because the observation stopped (a KMS could not be read).");
    let mut findings = GaugeFamily::new(
        "keyplan_device_drift_findings",
        "Number of drift findings on the device.",
    );
    let mut damage = GaugeFamily::new(
        "keyplan_device_header_damage",
        "Number of LUKS header damage findings on the device (a damaged header copy, copies that disagree), read without writing; 0 for a healthy header.",
    );
    let mut rewrap = GaugeFamily::new(
        "keyplan_device_pbkdf_rewrap_keyslots",
        "Number of managed keyslots on the device whose PBKDF is not the plan's settings.pbkdf (keyplan apply re-wraps them); 0 when every one matches or the plan sets no PBKDF.",
    );
    let mut copies = GaugeFamily::new(
        "keyplan_device_retired_copies",
        "Number of keyslots on the device, not made by keyplan, that still open with a key version keyplan retired (found when it retired the version); 0 when there are none.",
    );
    let mut unmanaged = GaugeFamily::new(
        "keyplan_device_unmanaged_keyslots",
        "Number of bound keyslots on the device with no keyplan record (a recovery passphrase, a TPM or FIDO2 binding, a keyslot added behind keyplan's back); keyplan status lists them.",
    );
    for d in r.devices.iter().filter(|d| d.checked) {
        let labels = [("device", d.id.as_str())];
        drift.add(&labels, u64::from(d.drifted));
        if let Some(u) = &d.unmanaged {
            unmanaged.add(&labels, u.keyslots.len() as u64);
        }
        findings.add(&labels, d.drift.len() as u64);
        damage.add(&labels, d.header_damage.len() as u64);
        copies.add(&labels, d.retired_copies.len() as u64);
        let pbkdf = d
            .drift
            .iter()
            .filter(|f| f.kind == DriftKind::Pbkdf)
            .count();
        rewrap.add(&labels, pbkdf as u64);
    }
    let count = r.devices.iter().filter(|d| d.drifted).count() as u64;
    vec![
        drift,
        findings,
        damage,
        rewrap,
        unmanaged,
        copies,
        GaugeFamily::single(
            "keyplan_drift_devices",
            "Number of devices that drifted from the plan.",
            Some(count),
        ),
    ]
}

/// The last-run families.
fn run_families(r: &StatusReport) -> Vec<GaugeFamily> {
    let in_progress = r
        .last_run
        .as_ref()
        .is_some_and(|run| run.outcome == "in_progress");
    vec![
        GaugeFamily::single(
            "keyplan_last_run_success",
            "1 when the last keyplan apply run that is over ended with success, else 0 (failed, interrupted, or stopped without an end record); a run in progress does not count; absent before the first such run.",
            r.last_over_success.map(u64::from),
        ),
        GaugeFamily::single(
            "keyplan_run_in_progress",
            "1 when a keyplan apply run holds the state lock and has not ended yet, else 0.",
            Some(u64::from(in_progress)),
        ),
        GaugeFamily::single(
            "keyplan_last_run_timestamp_seconds",
            "When the last keyplan apply run started (Unix seconds), including a run in progress.",
            r.last_run.as_ref().map(|run| run.started_at),
        ),
        GaugeFamily::single(
            "keyplan_last_success_timestamp_seconds",
            "When the last successful keyplan apply run ended (Unix seconds).",
            r.last_success_at,
        ),
    ]
}

/// The per-credential families (labels `kms`, `credential`: the credential's kind).
fn credential_families(r: &StatusReport) -> Vec<GaugeFamily> {
    let mut expiry = GaugeFamily::new(
        "keyplan_kms_credential_expiry_timestamp_seconds",
        "When keyplan's credential for the KMS expires unless renewed (Unix seconds); absent for credentials that do not expire.",
    );
    let mut deadline = GaugeFamily::new(
        "keyplan_kms_credential_deadline_timestamp_seconds",
        "When keyplan loses access to the KMS unless a person acts (Unix seconds): the expiry, or for a credential keyplan or the kubelet renews, the end of its renewals; absent when none is known.",
    );
    let mut expiring = GaugeFamily::new(
        "keyplan_kms_credential_expiring",
        "1 when keyplan's credential for the KMS ends less than 14 days after the next rotation of its keys is due (or after now), else 0.",
    );
    for k in &r.kms {
        for c in &k.credentials {
            let labels = [
                ("kms", k.kms.as_str()),
                ("credential", c.credential.kind.as_ref()),
            ];
            if let Some(t) = c.credential.expires_at {
                expiry.add(&labels, t);
            }
            if let Some(t) = c.deadline {
                deadline.add(&labels, t);
            }
            expiring.add(&labels, u64::from(c.expiring));
        }
    }
    vec![expiry, deadline, expiring]
}
