//! `keyplan key get`: the break-glass read of a key version; `key holders` and `key release`:
//! the plans holding a key ([`crate::ops::key`]); `device forget` ([`crate::ops::device`]).

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

/// `keyplan key holders KEY`: the plans recorded in the KMS as holding the key, one per line
/// (`<holder id>  since <time>`, this plan's marked), or a JSON document with `--json`.
pub(super) fn cmd_key_holders(cli: &Cli, arg: &PlanArg, key: &str, json: bool) -> Result<Exit> {
    let plan = load_plan(cli, arg)?;
    ops::key::check_key(&plan, key).or_report(&plan)?;
    let engine = Engine::open(plan.clone()).or_report(&plan)?;
    let (holders, me) = ops::key::holders(&engine, key).or_report(&plan)?;
    if json {
        let doc = serde_json::json!({
            "format_version": "1.0",
            "key": key,
            "this_plan": me,
            "holders": holders
                .iter()
                .map(|(h, since)| serde_json::json!({"holder": h, "since": since}))
                .collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&doc).into_diagnostic()?);
        return Ok(Exit::Success);
    }
    if holders.is_empty() {
        outln!("key {key}: no plan is recorded as holding it");
    }
    for (h, since) in &holders {
        let mark = if *h == me { "  (this plan)" } else { "" };
        outln!("{h}  since {}{mark}", crate::clock::rfc3339(*since));
    }
    Ok(Exit::Success)
}

/// `keyplan key release KEY --holder HOLDER`: removes a holder record (a plan gone for good).
pub(super) fn cmd_key_release(cli: &Cli, arg: &PlanArg, key: &str, holder: &str) -> Result<Exit> {
    let plan = load_plan(cli, arg)?;
    ops::key::check_key(&plan, key).or_report(&plan)?;
    let engine = Engine::open(plan.clone()).or_report(&plan)?;
    match ops::key::release_holder(&engine, key, holder).or_report(&plan)? {
        Some(why) => outln!(
            "Removed holder {holder} from key {key}: it is on this plan's node and {why}. This plan's own record ({}) stands for its devices from now on.",
            plan.holder()
        ),
        None => outln!(
            "Removed holder {holder} from key {key}. If that plan's devices still hold the key, the next rotation from another plan locks them out: run this only for a host gone for good."
        ),
    }
    Ok(Exit::Success)
}

/// `keyplan device forget ID`: removes a device gone for good from the state directory's
/// registry ([`ops::device::forget`]).
pub(super) fn cmd_device_forget(
    cli: &Cli,
    arg: &PlanArg,
    id: &str,
    uuid: Option<&str>,
    even_if_present: bool,
) -> Result<Exit> {
    let plan = load_plan(cli, arg)?;
    let engine = Engine::open(plan.clone()).or_report(&plan)?;
    let gone = ops::device::forget(&engine, id, uuid, even_if_present).or_report(&plan)?;
    for (u, e) in &gone {
        outln!(
            "Forgot device {} ({}, LUKS UUID {u}): the key versions it may hold are no longer kept for it.",
            e.id,
            e.path.display()
        );
    }
    Ok(Exit::Success)
}

/// Longest passphrase `key import` reads from stdin, bytes.
const MAX_IMPORT_BYTES: u64 = 8192;

/// `keyplan key import KEY < passphrase`: [`ops::key::import`].
pub(super) fn cmd_key_import(cli: &Cli, arg: &PlanArg, key: &str) -> Result<Exit> {
    let plan = load_plan(cli, arg)?;
    ops::key::check_key(&plan, key).or_report(&plan)?;
    let stdin = io::stdin();
    if stdin.is_terminal() {
        return Err(miette!(
            help = format!("pipe it: `keyplan key import {key} < FILE`, or from your secret store"),
            "refusing to read a passphrase from a terminal (it would echo); nothing was imported"
        ));
    }
    let mut bytes = zeroize::Zeroizing::new(Vec::new());
    io::Read::read_to_end(
        &mut io::Read::take(stdin.lock(), MAX_IMPORT_BYTES + 1),
        &mut bytes,
    )
    .into_diagnostic()?;
    if bytes.len() as u64 > MAX_IMPORT_BYTES {
        return Err(miette!(
            "the passphrase on stdin is longer than {MAX_IMPORT_BYTES} bytes; nothing was imported"
        ));
    }
    let pass = crate::secret::Passphrase::new(std::mem::take(&mut *bytes));
    let engine = Engine::open(plan.clone()).or_report(&plan)?;
    let done = ops::key::import(&engine, key, &pass).or_report(&plan)?;
    outln!(
        "Imported key {key} v{} ({}): it opens {}. `keyplan apply` records the keyslots it opens.",
        done.version,
        if done.finished_earlier {
            "the pending version an interrupted import left, committed now"
        } else {
            "now current"
        },
        done.opens
            .iter()
            .map(|(d, n)| format!("device {d} keyslot {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(Exit::Success)
}
