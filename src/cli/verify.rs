//! `keyplan verify`: every enrolled key's current version opens a bound keyslot.

use super::*;

pub(super) fn cmd_verify(cli: &Cli, arg: &PlanArg) -> Result<ExitCode> {
    let plan = load_plan(cli, arg)?;
    let world = World::open(&plan)?;
    let observed = observe::observe(&plan, &world)?;
    let mut failures = 0usize;
    for dev in plan.devices.values() {
        let Some(st) = observed.devices.get(&dev.id) else {
            continue;
        };
        for k in &dev.keys {
            let Some(key) = plan.keys.get(&k.key) else {
                continue;
            };
            let Some(cur) = observed.keys.get(&k.key).and_then(|s| s.current) else {
                outln!(
                    "FAIL  {}: {} has no current version in the KMS",
                    dev.id,
                    k.key
                );
                failures += 1;
                continue;
            };
            let Some((slot, _)) = st.slots_of(&k.key).into_iter().find(|(_, v)| *v == cur) else {
                outln!(
                    "FAIL  {}: {} v{cur} is not enrolled (no keyslot recorded)",
                    dev.id,
                    k.key
                );
                failures += 1;
                continue;
            };
            let kms = world.kms_for(&plan, &k.key).map_err(|e| miette!("{e}"))?;
            let pass = kms.get(&key.name, cur).map_err(|e| miette!("{e}"))?;
            let bound = st.header.keyslots.get(&slot).is_some_and(|s| s.bound);
            let opens = world
                .cs
                .test_passphrase(&dev.path, slot, &pass)
                .map_err(|e| miette!("{e}"))?;
            if opens && bound {
                outln!(
                    "ok    {}: {} v{cur} opens bound keyslot {slot}",
                    dev.id,
                    k.key
                );
            } else {
                outln!(
                    "FAIL  {}: {} v{cur} {} keyslot {slot}",
                    dev.id,
                    k.key,
                    if opens {
                        "opens an UNBOUND"
                    } else {
                        "does not open"
                    }
                );
                failures += 1;
            }
        }
    }
    if failures > 0 {
        outln!();
        return Err(miette!(
            help = "run `keyplan plan --verify` to see what keyplan would repair",
            "verification failed for {failures} key(s)"
        ));
    }
    outln!("All keys verified ({} PBKDF runs).", world.cs.pbkdf_runs());
    Ok(ExitCode::SUCCESS)
}
