//! `keyplan verify`: [`crate::ops::verify::verify`], one line per key and device.

use super::*;
use crate::render::run::verify_line;

/// `keyplan verify` options.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The plan file (`-f`, `--plan`).
    #[command(flatten)]
    pub plan: PlanArg,
}

/// Runs `keyplan verify`.
pub(super) fn run(cli: &Cli, args: &VerifyArgs) -> Result<Exit> {
    cmd_verify(cli, &args.plan)
}

/// `keyplan verify`: exit 0 when every check passed; exit 3 when a KMS could not be asked
/// (unreachable, too slow, refusing keyplan's credentials): nothing failed, but not everything
/// was checked. A state directory that belongs to another plan is no refusal: a warning on
/// stderr says whose it is, and the checks run (they read, and write nothing).
///
/// Errors: the plan cannot be loaded or observed; a KMS or cryptsetup call failed otherwise;
/// some key failed its check (`verification failed for N key(s)`).
pub(super) fn cmd_verify(cli: &Cli, arg: &PlanArg) -> Result<Exit> {
    let plan = load_plan(cli, arg)?;
    let engine = Engine::open_read_only(plan.clone()).or_report(&plan)?;
    report::warn_foreign_state_dir(&engine);
    let summary = match ops::verify::verify(&engine, &mut |c| outln!("{}", verify_line(c))) {
        Ok(s) => s,
        Err(e) => return report::could_not_check(&plan, e),
    };
    if summary.failures > 0 {
        outln!();
        return Err(miette!(
            help = "run `keyplan plan --verify` to see what keyplan would repair",
            "verification failed for {} key(s)",
            summary.failures
        ));
    }
    outln!("All keys verified ({} PBKDF runs).", summary.pbkdf_runs);
    Ok(Exit::Success)
}
