//! `keyplan show SAVED`: render a saved plan and say whether it is stale
//! ([`crate::ops::saved::freshness`]).

use super::*;
use crate::ops::saved::Freshness;

/// `keyplan show` options.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The saved plan file.
    #[arg(value_name = "SAVED")]
    pub saved: PathBuf,
    /// The plan file (`-f`, `--plan`).
    #[command(flatten)]
    pub plan: PlanArg,
    /// Print the saved plan as JSON (the `plan --json` shape plus `stale`).
    #[arg(long)]
    pub json: bool,
}

/// Runs `keyplan show`.
pub(super) fn run(cli: &Cli, args: &ShowArgs) -> Result<Exit> {
    cmd_show(cli, &args.plan, &args.saved, args.json)
}

/// What `show` says about a saved plan's freshness.
enum Shown {
    /// Nothing changed: `keyplan apply SAVED` would run it.
    Current,
    /// What changed (one phrase each).
    Stale(Vec<String>),
    /// Staleness could not be checked (plan file gone, device or KMS unreachable, ...).
    Unknown(String),
}

/// Whether `saved` is current, checked against the plan file the operator names (`-f` or the
/// default, never the path the saved file records); that plan when it could be loaded (for
/// labels); and, when current, the diff as keyplan plans it now.
fn check(
    saved: &crate::saved::SavedPlan,
    cli: &Cli,
    arg: &PlanArg,
) -> (Shown, Option<Plan>, Option<diff::Diff>) {
    let (plan, bytes) = match load_plan_with_bytes(cli, arg) {
        Ok(x) => x,
        Err(e) => {
            let why = format!("no plan file to check it against: {e}");
            return (Shown::Unknown(why), None, None);
        }
    };
    let shown = match ops::saved::freshness(saved, &plan, &bytes) {
        Freshness::Current(d) => return (Shown::Current, Some(plan), Some(*d)),
        Freshness::Stale(why) => Shown::Stale(why),
        Freshness::Unknown(e) => Shown::Unknown(report::report(Some(&plan), e).to_string()),
    };
    (shown, Some(plan), None)
}

/// `keyplan show SAVED [--json]`: prints the saved changes like `keyplan plan` does (text, or
/// the `plan --json` document plus `saved_plan` and `stale` fields), and a warning on stderr
/// when the plan is stale or its staleness cannot be checked. Exit 0 either way: showing is
/// informational; `keyplan apply SAVED` is what refuses a stale plan.
///
/// Errors: the file is not a readable keyplan saved plan.
pub(super) fn cmd_show(
    cli: &Cli,
    arg: &PlanArg,
    path: &std::path::Path,
    json: bool,
) -> Result<Exit> {
    let (saved, saved_d) = ops::saved::read(path).map_err(report::bare)?;
    let (freshness, plan, fresh) = check(&saved, cli, arg);
    // A current plan is shown as keyplan plans it now (equal steps and changes, reasons and
    // notes from keyplan itself); otherwise the file's own texts, under a warning.
    let d = fresh.unwrap_or_else(|| defang(saved_d));
    if json {
        let mut doc = crate::diff::json::plan_json(&d);
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
                Shown::Current => (serde_json::json!(false), serde_json::json!([])),
                Shown::Stale(w) => (serde_json::json!(true), serde_json::json!(w)),
                Shown::Unknown(w) => (serde_json::Value::Null, serde_json::json!([w])),
            };
            obj.insert("stale".into(), stale);
            obj.insert("stale_reasons".into(), why);
        }
        outln!("{}", render::json_text(&doc).into_diagnostic()?);
    } else {
        // Texts from the file are printed with escapes (a forged version string must not
        // drive the terminal); a time past year 9999 is shown as the raw number.
        let created = crate::clock::rfc3339(saved.created_at);
        outln!(
            "Saved plan {} (the file says: made from {} at {created} by keyplan {}{}):\n",
            path.display(),
            saved.plan_file.path.display().to_string().escape_debug(),
            saved.keyplan_version.escape_debug(),
            if saved.options.rotate.is_empty() {
                String::new()
            } else {
                format!(
                    ", --rotate {}",
                    saved.options.rotate.join(" --rotate ").escape_debug()
                )
            }
        );
        match &plan {
            Some(p) => out!("{}", render::plan_text_styled(p, &d, stdout_color(cli))),
            None => out!("{}", render::saved_text(&d)),
        }
    }
    match freshness {
        Shown::Current => {
            if !json {
                outln!(
                    "\nThe saved plan is current: `keyplan apply {}` would make exactly these changes.",
                    path.display()
                );
            }
        }
        Shown::Stale(why) => errln!(
            "\nWARNING: saved plan {} is STALE. Since it was made:\n  - {}\n`keyplan apply {}` would refuse it; run `{}` again.",
            path.display(),
            why.join("\n  - "),
            path.display(),
            super::plan::saved_remedy(cli, arg, &saved.options, path).remake
        ),
        Shown::Unknown(why) => errln!(
            "\nWARNING: cannot check whether saved plan {} is stale: {why}",
            path.display()
        ),
    }
    Ok(Exit::Success)
}

/// `text` with control characters (terminal escape sequences) shown as escapes.
fn escaped(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let v: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            v
        })
        .collect()
}

/// The saved plan's own texts (ids, reasons, notes), rendered only under a warning when the
/// plan is not current, with control characters escaped: a file edited to drive the terminal
/// (clear the screen, hide lines) shows its escapes instead.
fn defang(mut d: diff::Diff) -> diff::Diff {
    for k in &mut d.keys {
        k.key = escaped(&k.key);
        k.kms = escaped(&k.kms);
        k.reason = escaped(&k.reason);
        k.from_kms = k.from_kms.as_deref().map(escaped);
    }
    for c in &mut d.slots {
        c.device = escaped(&c.device);
        c.key = c.key.as_deref().map(escaped);
        c.reason = escaped(&c.reason);
    }
    for n in &mut d.notes {
        *n = escaped(n);
    }
    d
}
