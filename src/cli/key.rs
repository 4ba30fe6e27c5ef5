//! `keyplan key get`: the break-glass read of a key version ([`crate::ops::key`]).

use super::*;

/// `keyplan key get KEY [--version N]`: the passphrase bytes to stdout, exactly (no newline);
/// refuses a terminal without `--reveal`.
///
/// Errors: no such key; no current version; a retired version; the KMS failed; stdout is a
/// terminal and `--reveal` was not given.
pub(super) fn cmd_key_get(
    cli: &Cli,
    arg: &PlanArg,
    key: &str,
    version: Option<u64>,
    reveal: bool,
) -> Result<Exit> {
    let plan = load_plan(cli, arg)?;
    ops::key::check_key(&plan, key).or_report(&plan)?;
    let engine = Engine::open(plan.clone()).or_report(&plan)?;
    let version = ops::key::resolve_version(&engine, key, version).or_report(&plan)?;
    let stdout = io::stdout();
    if stdout.is_terminal() && !reveal {
        return Err(miette!(
            help = "pipe it (`keyplan key get KEY | cryptsetup open --key-file=- ...`) or add --reveal",
            "refusing to print key material to a terminal"
        ));
    }
    let pass = ops::key::material(&engine, key, version).or_report(&plan)?;
    let mut lock = stdout.lock();
    lock.write_all(pass.expose()).into_diagnostic()?;
    lock.flush().into_diagnostic()?;
    Ok(Exit::Success)
}
