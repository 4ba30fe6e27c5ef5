//! One look of `status`: the journal, the KMS keys and the devices read as one snapshot, and
//! whether a run started or ended meanwhile.

use std::collections::BTreeSet;

use super::devices::observe_devices;
use super::findings::Findings;
use super::keys::{credentials, key_report};
use super::runs::{devices_being_changed, last_over_success, last_run};
use super::{Engine, KeyReport, NodeReport, StatusReport, Verdict, FORMAT_VERSION, HEADER_REREADS};
use crate::journal::Record;
use crate::observe::{self, Observed};
use crate::spec::Plan;

/// Whether the journal's last run, as read in `before`, differs from the journal now (another
/// run started, or that run wrote its end record): see [`super::status_with`].
fn journal_moved(plan: &Plan, before: &[Record]) -> bool {
    let now = crate::journal::read(&plan.state_dir).unwrap_or_default();
    let last = |r: &[Record]| crate::journal::last_run(r).map(|s| (s.run, s.ended));
    last(before) != last(&now)
}

/// One look of [`super::status_with`]: the report, and whether the journal moved while it looked.
pub(super) fn status_look(engine: &Engine, given: Option<&Observed>) -> (StatusReport, bool) {
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
