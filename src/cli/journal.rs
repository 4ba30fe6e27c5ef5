//! `keyplan journal`: the journal of runs ([`crate::ops::journal`]).

use super::*;

/// `keyplan journal` options.
#[derive(Debug, Args)]
pub struct JournalArgs {
    /// The plan file (`-f`, `--plan`).
    #[command(flatten)]
    pub plan: PlanArg,
    /// Print one JSON document (format_version, records, runs) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `keyplan journal`.
pub(super) fn run(cli: &Cli, args: &JournalArgs) -> Result<Exit> {
    cmd_journal(cli, &args.plan, args.json)
}

/// `keyplan journal`: the journal's records as text lines, or with `--json` one document
/// `{format_version, state_dir, records, runs}` (docs/monitoring.md).
///
/// Errors: the plan cannot be loaded or the journal cannot be read.
pub(super) fn cmd_journal(cli: &Cli, arg: &PlanArg, json: bool) -> Result<Exit> {
    let plan = load_plan(cli, arg)?;
    let (records, foreign) = ops::journal::read(&plan).or_report(&plan)?;
    // Another plan's state directory: its journal is shown, saying whose it is.
    if let Some(e) = foreign {
        errln!("Warning: {}", e.read_only_warning());
    }
    if json {
        let doc = serde_json::json!({
            "format_version": "1.0",
            "state_dir": plan.state_dir.display().to_string(),
            "records": records
                .iter()
                .map(crate::journal::record_json)
                .collect::<Result<Vec<_>, _>>()
                .into_diagnostic()?,
            "runs": ops::journal::runs(&records),
        });
        outln!("{}", serde_json::to_string_pretty(&doc).into_diagnostic()?);
        return Ok(Exit::Success);
    }
    if records.is_empty() {
        outln!("The journal in {} is empty.", plan.state_dir.display());
        return Ok(Exit::Success);
    }
    for line in render::run::journal_lines(&records) {
        outln!("{line}");
    }
    Ok(Exit::Success)
}
