//! `keyplan key get`: break-glass read of a key version.

use super::*;

pub(super) fn cmd_key_get(
    cli: &Cli,
    arg: &PlanArg,
    key: &str,
    version: Option<u64>,
    reveal: bool,
) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    let Some(spec) = plan.keys.get(key) else {
        return Err(miette!("no key {key:?} in {}", plan.source_path.display()));
    };
    let world = World::open(&plan)?;
    let kms = world.kms_for(&plan, key).map_err(|e| miette!("{e}"))?;
    let version = match version {
        Some(v) => v,
        None => kms
            .read(&spec.name)
            .map_err(|e| miette!("{e}"))?
            .current
            .ok_or_else(|| {
                miette!(
                    "{}: key {key} has no current version yet; run `keyplan apply`",
                    kms.describe()
                )
            })?,
    };
    let stdout = io::stdout();
    if stdout.is_terminal() && !reveal {
        return Err(miette!(
            help = "pipe it (`keyplan key get KEY | cryptsetup open --key-file=- ...`) or add --reveal",
            "refusing to print key material to a terminal"
        ));
    }
    let state = kms.read(&spec.name).map_err(|e| miette!("{e}"))?;
    if let Some(info) = state.versions.get(&version) {
        if info.state == crate::kms::VersionState::Retired {
            return Err(miette!(
                "{}: {key} v{version} was retired: its material was destroyed after a rotation, as no device held it any more",
                kms.describe()
            ));
        }
    }
    let pass = kms.get(&spec.name, version).map_err(|e| miette!("{e}"))?;
    let mut lock = stdout.lock();
    lock.write_all(pass.expose()).into_diagnostic()?;
    lock.flush().into_diagnostic()?;
    Ok(ExitCode::SUCCESS)
}
