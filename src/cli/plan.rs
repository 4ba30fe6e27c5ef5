//! `keyplan plan`: render [`crate::ops::plan::plan`]; with `-o FILE`, save it
//! ([`crate::ops::saved::save`]).

use super::*;
use crate::ops::plan::{PlanOutcome, PlanRequest};
use crate::render::run::{interrupted_json, interrupted_text};

/// `keyplan plan` options.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The plan file (`-f`, `--plan`).
    #[command(flatten)]
    pub plan: PlanArg,
    /// Exit 0 when there are no changes, 2 when there are, 1 on error.
    #[arg(long)]
    pub detailed_exitcode: bool,
    /// Rotate KEY now, whatever its age (repeatable).
    #[arg(long, value_name = "KEY")]
    pub rotate: Vec<String>,
    /// Also test every managed keyslot with its KMS version (one PBKDF run each).
    #[arg(long)]
    pub verify: bool,
    /// Plan changes on devices whose two LUKS2 header copies disagree (one damaged): the
    /// first cryptsetup write rewrites the damaged copy from the one keyplan read.
    #[arg(long)]
    pub repair_headers: bool,
    /// Print a JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also save the plan to SAVED (with a digest of the state it was made from), for
    /// `keyplan apply SAVED`.
    #[arg(short = 'o', long = "out", alias = "output", value_name = "SAVED")]
    pub out: Option<PathBuf>,
}

/// Runs `keyplan plan`.
pub(super) fn run(cli: &Cli, args: &PlanArgs) -> Result<Exit> {
    let req = PlanRequest {
        rotate: args.rotate.clone(),
        verify: args.verify,
        repair_headers: args.repair_headers,
    };
    cmd_plan(
        cli,
        &args.plan,
        args.detailed_exitcode,
        req,
        args.json,
        args.out.as_deref(),
    )
}

/// `keyplan plan` (docs/commands.md); with `out` (`-o FILE`) it also saves the plan.
pub(super) fn cmd_plan(
    cli: &Cli,
    arg: &PlanArg,
    detailed: bool,
    req: PlanRequest,
    json: bool,
    out: Option<&std::path::Path>,
) -> Result<Exit> {
    // Read once: a saved plan's digest covers exactly the bytes that were planned.
    let (plan, bytes) = load_plan_with_bytes(cli, arg)?;
    ops::check_rotate_keys(&plan, &req.rotate).or_report(&plan)?;
    let engine = Engine::open(plan.clone()).or_report(&plan)?;
    if let Some(path) = out {
        ops::saved::check_out_path(path).or_report(&plan)?;
    }
    let outcome = match ops::plan::plan(&engine, &req) {
        Ok(o) => o,
        Err(e) => return report::could_not_check(&plan, e),
    };
    let planned = match outcome {
        PlanOutcome::Planned(p) => p,
        PlanOutcome::Interrupted(s) => {
            if let Some(path) = out {
                return Err(report::bare(ops::saved::interrupted_refusal(&s, path)));
            }
            // What is on the devices now is half of that run: a diff would mislead.
            if json {
                outln!(
                    "{}",
                    render::json_text(&interrupted_json(&s)).into_diagnostic()?
                );
            } else {
                out!("{}", interrupted_text(&s));
                outln!("\nRun `keyplan apply` to finish it, then `keyplan plan` again.");
            }
            return Ok(Exit::changes(detailed, true));
        }
    };
    if let Some(path) = out {
        ops::saved::save(&engine, &planned, &req, &bytes, path).or_report(&plan)?;
    }
    let d = &planned.diff;
    if json {
        outln!(
            "{}",
            render::json_text(&crate::diff::json::plan_json(d)).into_diagnostic()?
        );
    } else {
        out!("{}", render::plan_text_styled(&plan, d, stdout_color(cli)));
    }
    if let Some(path) = out {
        // With --json, stdout holds exactly one JSON document: the note goes to stderr.
        let note = format!(
            "Saved the plan to {}; apply it with `keyplan apply {}`",
            path.display(),
            path.display()
        );
        if json {
            errln!("{note}");
        } else {
            outln!("\n{note}");
        }
    }
    if !d.unavailable.is_empty() {
        // The plan went around them; a person has to act (replace the disk, or edit the plan).
        errln!(
            "Error: {} device(s) of the plan cannot be used: {}. Nothing is planned on them, and no key they list is rotated; replace them or take them out of the plan",
            d.unavailable.len(),
            d.unavailable.keys().cloned().collect::<Vec<_>>().join(", ")
        );
        return Ok(Exit::Failure);
    }
    Ok(Exit::changes(detailed, !d.is_empty()))
}
