//! `keyplan status`: per-key health for people and monitoring.

use super::*;

pub(super) fn cmd_status(cli: &Cli, arg: &PlanArg) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    let world = World::open(&plan)?;
    let now = crate::kms::now_unix();
    let mut unhealthy = Vec::new();
    let records = crate::journal::read(&plan.state_dir).map_err(|e| miette!("{e}"))?;
    let committed = committed_keys(&records);
    for (id, key) in &plan.keys {
        let kms = world.kms_for(&plan, id).map_err(|e| miette!("{e}"))?;
        outln!("key {id} in {}:", kms.describe());
        let st = match kms.read(&key.name) {
            Ok(st) => st,
            Err(e) => {
                outln!("  cannot read: {e}");
                unhealthy.push(format!("key {id}: KMS unreadable"));
                continue;
            }
        };
        match st.current_info() {
            None if committed.contains(id) => {
                outln!("  NO CURRENT VERSION, although a run committed one: the KMS lost the key or the plan points at the wrong KMS/name (`keyplan plan` explains)");
                unhealthy.push(format!("key {id}: missing from its KMS"));
            }
            None => outln!("  no current version (not created yet)"),
            Some(c) => {
                let age = now.saturating_sub(c.created_at);
                outln!(
                    "  current  v{} ({} old)",
                    c.version,
                    diff::short_duration(std::time::Duration::from_secs(age))
                );
                if let Some(limit) = key.rotate_after {
                    let due = c.created_at.saturating_add(limit.as_secs());
                    if due <= now {
                        outln!(
                            "  rotation OVERDUE by {} (rotate_after {})",
                            diff::short_duration(std::time::Duration::from_secs(now - due)),
                            key.rotate_after_text.as_deref().unwrap_or("?")
                        );
                        unhealthy.push(format!("key {id}: rotation overdue"));
                    } else {
                        outln!(
                            "  rotation due in {}",
                            diff::short_duration(std::time::Duration::from_secs(due - now))
                        );
                    }
                }
            }
        }
        if let Some(p) = st.pending {
            outln!("  pending  v{p} (a rotation is under way: run `keyplan apply`)");
        }
        let retained = st.retained_previous();
        if !retained.is_empty() {
            let list: Vec<String> = retained.iter().map(|v| format!("v{v}")).collect();
            outln!(
                "  retained {} (material kept until no device holds it)",
                list.join(", ")
            );
        }
    }
    match crate::journal::last_run(&records) {
        None => outln!("last run: none"),
        Some(r) => {
            let outcome = r.ended.clone().unwrap_or_else(|| "interrupted".into());
            outln!("last run: {} ({outcome})", r.run);
            if outcome != "success" {
                unhealthy.push(format!("last run {outcome}"));
            }
        }
    }
    if unhealthy.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        outln!("UNHEALTHY: {}", unhealthy.join("; "));
        Ok(ExitCode::from(1))
    }
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
