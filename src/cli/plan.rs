//! `keyplan plan`: observe, diff, check the KMSs the plan writes to, render.

use super::*;

/// Observes and diffs; errors from the diff become one report. Returns the observation as
/// read (before `--verify` marked any record), which is what a saved plan's digest covers.
pub(super) fn make_diff(
    plan: &Plan,
    world: &World,
    rotate: &[String],
    verify: bool,
) -> Result<(observe::Observed, diff::Diff)> {
    let observed = observe::observe(plan, world)?;
    let mut checked = observed.clone();
    if verify {
        verify_records(plan, world, &mut checked)?;
    }
    let d = diff::diff(
        plan,
        &checked,
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

/// `keyplan plan` (DESIGN.md §4); with `out` (`-o FILE`) it also saves the plan (see
/// [`crate::saved`]).
pub(super) fn cmd_plan(
    cli: &Cli,
    arg: &PlanArg,
    detailed: bool,
    rotate: &[String],
    verify: bool,
    json: bool,
    out: Option<&std::path::Path>,
) -> Result<ExitCode> {
    // Read once: a saved plan's digest covers exactly the bytes that were planned.
    let (plan, bytes) = load_plan_with_bytes(cli, arg)?;
    check_rotate_keys(&plan, rotate)?;
    let world = World::open(&plan)?;
    if let Some(path) = out {
        // `-o keyplan.yaml` or `-o initial.pass` would replace the plan file or the only copy
        // of a passphrase: only a missing file or an earlier saved plan is overwritten.
        if path.exists() && crate::saved::read(path).is_err() {
            return Err(miette!(
                help = "choose another file name, or delete the file first if it really is disposable",
                "{} exists and is not a keyplan saved plan; refusing to overwrite it (nothing was planned or written)",
                path.display()
            ));
        }
    }
    let plan_bytes = out.map(|_| bytes);
    if let Some(s) = interrupted_run(&plan)? {
        if let Some(path) = out {
            return Err(miette!(
                help = "run `keyplan apply` to finish it, then `keyplan plan -o FILE` again",
                "run {} in the journal was interrupted; a plan saved now would be made against a half-done run, so {} was not written",
                s.run,
                path.display()
            ));
        }
        // What is on the devices now is half of that run: a diff would mislead.
        if json {
            // The usual fields stay present (empty), so readers of `changes` do not break; the
            // remaining steps are under `interrupted_run`.
            let doc = serde_json::json!({
                "format_version": "1.0",
                "changes_present": true,
                "summary": {"add": 0, "remove": 0, "rotate": 0, "migrate": 0},
                "changes": [],
                "keys": [],
                "keyslots": [],
                "notes": [format!("run {} was interrupted: `keyplan apply` finishes it first; plan again afterwards", s.run)],
                "interrupted_run": {
                    "run": s.run,
                    "steps": s.steps,
                    "done": s.done,
                },
            });
            outln!("{}", render::json_text(&doc).into_diagnostic()?);
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
    let (observed, d) = make_diff(&plan, &world, rotate, verify)?;
    let saved = match (out, plan_bytes) {
        (Some(path), Some(bytes)) => {
            let journal = crate::journal::read(&plan.state_dir).map_err(|e| miette!("{e}"))?;
            let saved = crate::saved::SavedPlan {
                format_version: crate::saved::FORMAT_VERSION.to_string(),
                kind: crate::saved::KIND.to_string(),
                keyplan_version: env!("CARGO_PKG_VERSION").to_string(),
                created_at: crate::clock::now_unix(),
                plan_file: crate::saved::PlanFileRef {
                    path: std::path::absolute(&plan.source_path).into_diagnostic()?,
                    sha256: crate::saved::sha256_hex(&bytes),
                },
                state_dir: plan.state_dir.clone(),
                options: crate::saved::SavedOptions {
                    rotate: rotate.to_vec(),
                    verify,
                },
                state: crate::saved::state_digest(
                    &bytes,
                    &observed,
                    crate::saved::journal_mark(&journal),
                ),
                changes: {
                    let mut doc = render::plan_json(&d);
                    if let Some(o) = doc.as_object_mut() {
                        o.remove("steps");
                    }
                    doc
                },
                steps: d.graph.steps(),
                deps: d.graph.deps(),
            };
            crate::saved::write(path, &saved).map_err(|e| miette!("{e}"))?;
            Some(path)
        }
        _ => None,
    };
    if json {
        outln!(
            "{}",
            render::json_text(&render::plan_json(&d)).into_diagnostic()?
        );
    } else {
        out!("{}", render::plan_text_styled(&plan, &d, stdout_color(cli)));
    }
    if let Some(path) = saved {
        // With --json, stdout holds exactly one JSON document: the note goes to stderr.
        let note = format!(
            "Saved the plan to {}; apply it with `keyplan apply {}`",
            path.display(),
            path.display()
        );
        if json {
            eprintln!("{note}");
        } else {
            outln!("\n{note}");
        }
    }
    Ok(if detailed && !d.is_empty() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    })
}
