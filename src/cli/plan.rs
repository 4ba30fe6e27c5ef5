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
        PlanOutcome::Planned(p) => *p,
        PlanOutcome::Interrupted(s) => {
            if let Some(path) = out {
                let options = crate::saved::SavedOptions {
                    rotate: req.rotate.clone(),
                    verify: req.verify,
                    repair_headers: req.repair_headers,
                };
                let remedy = saved_remedy(cli, arg, &options, path);
                return Err(report::bare(ops::saved::interrupted_refusal(
                    &s, path, &remedy,
                )));
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
        // `keyplan apply SAVED` needs the same plan file and state directory.
        let options = crate::saved::SavedOptions::default();
        let note = format!(
            "Saved the plan to {}; apply it with `{} {}`",
            path.display(),
            saved_remedy(cli, arg, &options, path).finish,
            shell_word(&path.display().to_string())
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

/// The commands a refused saved plan `out` points to ([`ops::saved::Remedy`]): `keyplan plan`
/// with the options that shaped it (`options`: `--rotate KEY`..., `--verify`,
/// `--repair-headers`) and `keyplan apply`, each with the operator's own `--state-dir`,
/// `--node` (when given as an option, not through `$NODE_NAME`) and `-f`, never paths the
/// saved file records. Words are quoted for a POSIX shell where they need it; texts from the
/// file are escaped.
pub(super) fn saved_remedy(
    cli: &Cli,
    arg: &PlanArg,
    options: &crate::saved::SavedOptions,
    out: &std::path::Path,
) -> ops::saved::Remedy {
    let mut scope = Vec::new();
    if let Some(d) = &cli.state_dir {
        scope.extend([
            "--state-dir".to_string(),
            shell_word(&d.display().to_string()),
        ]);
    }
    if let Some(n) = cli
        .node
        .as_ref()
        .filter(|n| std::env::var("NODE_NAME").ok().as_ref() != Some(*n))
    {
        scope.extend(["--node".to_string(), shell_word(n)]);
    }
    if let Some(f) = &arg.file {
        scope.extend(["-f".to_string(), shell_word(&f.display().to_string())]);
    }
    let mut remake = vec!["keyplan".to_string(), "plan".to_string()];
    remake.extend(scope.iter().cloned());
    for k in &options.rotate {
        remake.extend([
            "--rotate".to_string(),
            shell_word(&k.escape_debug().to_string()),
        ]);
    }
    if options.verify {
        remake.push("--verify".into());
    }
    if options.repair_headers {
        remake.push("--repair-headers".into());
    }
    remake.extend(["-o".to_string(), shell_word(&out.display().to_string())]);
    let mut finish = vec!["keyplan".to_string(), "apply".to_string()];
    finish.extend(scope);
    ops::saved::Remedy {
        remake: remake.join(" "),
        finish: finish.join(" "),
    }
}

/// `word` as one word of a POSIX shell command line: as it is when it holds only characters
/// no shell treats specially, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./:=@%+,-".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
