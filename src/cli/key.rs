//! `keyplan key get`: the break-glass read of a key version; `key holders` and `key release`:
//! the plans holding a key ([`crate::ops::key`]).

use super::*;

/// `keyplan key` and its subcommand.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The key subcommand.
    #[command(subcommand)]
    pub command: KeyCommand,
}

/// `keyplan key ...`.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Break-glass: write a key version's passphrase bytes to stdout (exactly, no newline).
    /// Refuses when stdout is a terminal unless --reveal is given.
    Get {
        /// Key id from the plan.
        key: String,
        /// The plan file (`-f`, `--plan`).
        #[command(flatten)]
        plan: PlanArg,
        /// Version (default: current).
        #[arg(long)]
        version: Option<u64>,
        /// Allow printing to a terminal.
        #[arg(long)]
        reveal: bool,
    },
    /// The plans recorded in the key's KMS as holding it (their devices hold it); a rotation
    /// from one is refused while another is recorded. Read-only.
    Holders {
        /// Key id from the plan.
        key: String,
        /// The plan file (`-f`, `--plan`).
        #[command(flatten)]
        plan: PlanArg,
        /// Print a JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Import a passphrase that opens the plan's devices today as the key's first version in
    /// its KMS, read from stdin (its exact bytes; never from a terminal). Refused when the KMS
    /// already holds the key, or when a device that lists the key does not open with it and
    /// has no enroll_with (about one PBKDF run per device). The next `apply` then adopts the
    /// keyslots it opens.
    Import {
        /// Key id from the plan.
        key: String,
        /// The plan file (`-f`, `--plan`).
        #[command(flatten)]
        plan: PlanArg,
    },
    /// Remove a plan's holder record from the key's KMS: only for a host or plan gone for
    /// good (its devices no longer hold the key), whose record refuses every rotation.
    Release {
        /// Key id from the plan.
        key: String,
        /// The plan file (`-f`, `--plan`).
        #[command(flatten)]
        plan: PlanArg,
        /// The holder id, exactly as `keyplan key holders` shows it (`<node or host>:<state
        /// directory>`).
        #[arg(long, value_name = "HOLDER")]
        holder: String,
    },
}

/// Runs `keyplan key ...`.
pub(super) fn run(cli: &Cli, args: &KeyArgs) -> Result<Exit> {
    match &args.command {
        KeyCommand::Get {
            key,
            plan,
            version,
            reveal,
        } => cmd_key_get(cli, plan, key, *version, *reveal),
        KeyCommand::Holders { key, plan, json } => cmd_key_holders(cli, plan, key, *json),
        KeyCommand::Release { key, plan, holder } => cmd_key_release(cli, plan, key, holder),
        KeyCommand::Import { key, plan } => cmd_key_import(cli, plan, key),
    }
}

/// `keyplan key get KEY [--version N]`: the passphrase bytes to stdout, exactly (no newline);
/// refuses a terminal without `--reveal`.
///
/// Never refused for the state directory's owner (an older copy of the plan, a colleague's
/// copy beside the live one): it needs nothing of the directory.
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
    // Break-glass reads the KMS (and the devices' records) alone: whose the state directory
    // is does not matter here.
    let engine = Engine::open_read_only(plan.clone()).or_report(&plan)?;
    let src = ops::key::source(&engine, key).or_report(&plan)?;
    if let Some(note) = &src.note {
        errln!("{note}");
    }
    let version = ops::key::resolve_version(&src, key, version).or_report(&plan)?;
    let stdout = io::stdout();
    if stdout.is_terminal() && !reveal {
        return Err(miette!(
            help = "pipe it (`keyplan key get KEY | cryptsetup open --key-file=- ...`) or add --reveal",
            "refusing to print key material to a terminal"
        ));
    }
    let pass = ops::key::material(&src, key, version).or_report(&plan)?;
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
    // Read-only: another plan's state directory is said (its holder id is the one marked as
    // this plan's), not refused.
    let engine = Engine::open_read_only(plan.clone()).or_report(&plan)?;
    report::warn_foreign_state_dir(&engine);
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
