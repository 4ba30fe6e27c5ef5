//! `keyplan plan`: observe, diff, check the KMSs the plan writes to, render.

use super::*;

/// Observes and diffs; errors from the diff become one report.
pub(super) fn make_diff(
    plan: &Plan,
    world: &World,
    rotate: &[String],
    verify: bool,
) -> Result<(observe::Observed, diff::Diff)> {
    let mut observed = observe::observe(plan, world)?;
    if verify {
        verify_records(plan, world, &mut observed)?;
    }
    let d = diff::diff(
        plan,
        &observed,
        &DiffOptions {
            rotate: rotate.to_vec(),
        },
    )
    .map_err(|errs| {
        miette!(
            "no safe plan exists:\n  - {}",
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n  - ")
        )
    })?;
    check_kms(plan, world, &d)?;
    Ok((observed, d))
}

/// Before any device is touched: every KMS the plan would write to must be reachable and
/// allow keyplan to stage, commit and retire (or destroy) those keys ([`crate::kms::Kms::check`],
/// which writes nothing). Rook rotated devices and only then found its KMS could not store
/// the new key; keyplan refuses the plan instead.
pub(super) fn check_kms(plan: &Plan, world: &World, d: &diff::Diff) -> Result<()> {
    use crate::graph::Step;
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for step in d.graph.steps() {
        if let Step::DestroyOrigin {
            from_kms,
            from_name,
            ..
        } = &step
        {
            names
                .entry(from_kms.clone())
                .or_default()
                .insert(from_name.clone());
        }
        if let Some(k) = step.kms_key().and_then(|key| plan.keys.get(key)) {
            names
                .entry(k.kms.clone())
                .or_default()
                .insert(k.name.clone());
        }
    }
    let mut problems = Vec::new();
    for (instance, set) in names {
        if let Some(kms) = world.kms.get(&instance) {
            let list: Vec<String> = set.into_iter().collect();
            tracing::debug!(kms = %instance, keys = ?list, "checking KMS before planning writes");
            if let Err(e) = kms.check(&list) {
                problems.push(e.to_string());
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(miette!(
        help = "fix the KMS (address, credentials, permissions), then run `keyplan plan` again",
        "the plan needs to write to a KMS that failed its check; no device was touched and nothing was staged:\n  - {}",
        problems.join("\n  - ")
    ))
}

/// `plan --verify`: test every valid record of a current version; failures become drift.
pub(super) fn verify_records(
    plan: &Plan,
    world: &World,
    observed: &mut observe::Observed,
) -> Result<()> {
    for dev in observed.devices.values_mut() {
        for r in dev.records.iter_mut() {
            if r.status != observe::RecordStatus::Valid {
                continue;
            }
            let Some(key) = plan.keys.get(&r.record.key) else {
                continue;
            };
            let kms = world.kms_for(plan, &key.id).map_err(|e| miette!("{e}"))?;
            let Ok(p) = kms.get(&key.name, r.record.version) else {
                r.status = observe::RecordStatus::FailedVerify;
                continue;
            };
            let bound = dev.header.keyslots.get(&r.slot).is_some_and(|k| k.bound);
            let opens = world
                .cs
                .test_passphrase(&dev.path, r.slot, &p)
                .map_err(|e| miette!("{e}"))?;
            if !(opens && bound) {
                r.status = observe::RecordStatus::FailedVerify;
            }
        }
    }
    Ok(())
}

/// The last run of the journal when it was interrupted (no `run_end`).
///
/// Errors: the journal is corrupt, or a run holds the state lock right now (its journal is
/// in flux: planning against a half-done run would mislead).
pub(super) fn interrupted_run(plan: &Plan) -> Result<Option<crate::journal::RunSummary>> {
    if let Some(holder) = crate::journal::lock_holder(&plan.state_dir) {
        return Err(miette!(
            help = "wait for it to finish, then run `keyplan plan` again",
            "a keyplan run is in progress on {}: {holder}",
            plan.state_dir.display()
        ));
    }
    let records = crate::journal::read(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    Ok(crate::journal::last_run(&records).filter(|s| s.ended.is_none()))
}

/// Describes an interrupted run and the steps it has left.
pub(super) fn interrupted_text(s: &crate::journal::RunSummary) -> String {
    let done = s.done.iter().filter(|d| **d).count();
    let mut out = format!(
        "Run {} was interrupted ({done} of {} steps done). `keyplan apply` finishes it first; remaining steps:\n",
        s.run,
        s.steps.len()
    );
    for (i, step) in s.steps.iter().enumerate().filter(|(i, _)| !s.done[*i]) {
        let note = if s.started_not_done[i] {
            "  (was under way)"
        } else {
            ""
        };
        out.push_str(&format!("  - [{i}] {step}{note}\n"));
    }
    out
}

pub(super) fn cmd_plan(
    cli: &Cli,
    arg: &PlanArg,
    detailed: bool,
    rotate: &[String],
    verify: bool,
    json: bool,
) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    check_rotate_keys(&plan, rotate)?;
    let world = World::open(&plan)?;
    if let Some(s) = interrupted_run(&plan)? {
        // What is on the devices now is half of that run: a diff would mislead.
        if json {
            let doc = serde_json::json!({
                "format_version": "1.0",
                "changes_present": true,
                "interrupted_run": {
                    "run": s.run,
                    "steps": s.steps,
                    "done": s.done,
                },
            });
            outln!("{}", serde_json::to_string_pretty(&doc).into_diagnostic()?);
        } else {
            out!("{}", interrupted_text(&s));
            outln!("\nRun `keyplan apply` to finish it, then `keyplan plan` again.");
        }
        return Ok(if detailed {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        });
    }
    let (_, d) = make_diff(&plan, &world, rotate, verify)?;
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&render::plan_json(&d)).into_diagnostic()?
        );
    } else {
        out!("{}", render::plan_text_styled(&plan, &d, stdout_color(cli)));
    }
    Ok(if detailed && !d.is_empty() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}
