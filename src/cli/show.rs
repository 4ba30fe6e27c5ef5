//! `keyplan show SAVED`: render a saved plan and say whether it is stale.

use super::*;

/// Whether a saved plan still matches what it was made from.
enum Freshness {
    /// Nothing changed: `keyplan apply SAVED` would run it.
    Current,
    /// What changed (one phrase each).
    Stale(Vec<String>),
    /// Staleness could not be checked (plan file gone, device or KMS unreachable, ...).
    Unknown(String),
}

/// Plans again from the same plan file and options (read-only, no lock taken; the PBKDF runs
/// `plan` would make: an `enroll_with` check, `--verify`), then compares with the saved digest
/// and the saved steps and changes ([`crate::saved::mismatch`]). Returns the plan when it
/// could be loaded (for labels).
fn check(saved: &crate::saved::SavedPlan, cli: &Cli) -> (Freshness, Option<Plan>) {
    let bytes = match std::fs::read(&saved.plan_file.path) {
        Ok(b) => b,
        Err(e) => {
            return (
                Freshness::Unknown(format!(
                    "its plan file {} cannot be read: {e}",
                    saved.plan_file.path.display()
                )),
                None,
            )
        }
    };
    if crate::saved::sha256_hex(&bytes) != saved.plan_file.sha256 {
        let plan = spec::load(&saved.plan_file.path).ok();
        return (
            Freshness::Stale(vec![format!(
                "the plan file {} changed",
                saved.plan_file.path.display()
            )]),
            plan,
        );
    }
    let mut plan = match spec::load(&saved.plan_file.path) {
        Ok(p) => p,
        Err(e) => return (Freshness::Unknown(format!("{e}")), None),
    };
    plan.state_dir = match &cli.state_dir {
        Some(d) => std::path::absolute(d).unwrap_or_else(|_| d.clone()),
        None => saved.state_dir.clone(),
    };
    let observe_now = || -> std::result::Result<(crate::saved::StateDigest, diff::Diff), String> {
        let world = World::open(&plan).map_err(|e| e.to_string())?;
        let records = crate::journal::read(&plan.state_dir).map_err(|e| e.to_string())?;
        let (observed, d) = make_diff(&plan, &world, &saved.options.rotate, saved.options.verify)
            .map_err(|e| e.to_string())?;
        let digest =
            crate::saved::state_digest(&bytes, &observed, crate::saved::journal_mark(&records));
        Ok((digest, d))
    };
    let freshness = match observe_now() {
        Ok((now, d)) => {
            let mut changed = crate::saved::changes_since(&saved.state, &now);
            if changed.is_empty() {
                changed = crate::saved::mismatch(saved, &d);
            }
            if changed.is_empty() {
                Freshness::Current
            } else {
                Freshness::Stale(changed)
            }
        }
        Err(e) => Freshness::Unknown(e),
    };
    (freshness, Some(plan))
}

/// `keyplan show SAVED [--json]`: prints the saved changes like `keyplan plan` does (text, or
/// the `plan --json` document plus `saved_plan` and `stale` fields), and a warning on stderr
/// when the plan is stale or its staleness cannot be checked. Exit 0 either way: showing is
/// informational; `keyplan apply SAVED` is what refuses a stale plan.
///
/// Errors: the file is not a readable keyplan saved plan.
pub(super) fn cmd_show(cli: &Cli, path: &std::path::Path, json: bool) -> Result<ExitCode> {
    let saved = crate::saved::read(path).map_err(|e| miette!("{e}"))?;
    let (freshness, plan) = check(&saved, cli);
    let d = super::apply::saved_diff(&saved, path)?;
    if json {
        let mut doc = render::plan_json(&d);
        if let Some(obj) = doc.as_object_mut() {
            obj.insert(
                "saved_plan".into(),
                serde_json::json!({
                    "path": std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
                    "created_at": saved.created_at,
                    "keyplan_version": saved.keyplan_version,
                    "plan_file": saved.plan_file,
                    "options": saved.options,
                    "digest": saved.state.digest,
                }),
            );
            let (stale, why) = match &freshness {
                Freshness::Current => (serde_json::json!(false), serde_json::json!([])),
                Freshness::Stale(w) => (serde_json::json!(true), serde_json::json!(w)),
                Freshness::Unknown(w) => (serde_json::Value::Null, serde_json::json!([w])),
            };
            obj.insert("stale".into(), stale);
            obj.insert("stale_reasons".into(), why);
        }
        outln!("{}", render::json_text(&doc).into_diagnostic()?);
    } else {
        let created = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(saved.created_at),
        );
        outln!(
            "Saved plan {} (made from {} at {created} by keyplan {}{}):\n",
            path.display(),
            saved.plan_file.path.display(),
            saved.keyplan_version,
            if saved.options.rotate.is_empty() {
                String::new()
            } else {
                format!(", --rotate {}", saved.options.rotate.join(" --rotate "))
            }
        );
        match &plan {
            Some(p) => out!("{}", render::plan_text_styled(p, &d, stdout_color(cli))),
            None => out!("{}", render::saved_text(&d)),
        }
    }
    match freshness {
        Freshness::Current => {
            if !json {
                outln!(
                    "\nThe saved plan is current: `keyplan apply {}` would make exactly these changes.",
                    path.display()
                );
            }
        }
        Freshness::Stale(why) => eprintln!(
            "\nWARNING: saved plan {} is STALE. Since it was made:\n  - {}\n`keyplan apply {}` would refuse it; run `keyplan plan -o {}` again.",
            path.display(),
            why.join("\n  - "),
            path.display(),
            path.display()
        ),
        Freshness::Unknown(why) => eprintln!(
            "\nWARNING: cannot check whether saved plan {} is stale: {why}",
            path.display()
        ),
    }
    Ok(ExitCode::SUCCESS)
}
