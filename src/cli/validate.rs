//! `keyplan validate`: load and check the plan file; with `--json`, one JSON document on
//! stdout listing every diagnostic with its place in the file (see docs/plan-file.md
//! "Checking a plan file").

use super::*;

/// `keyplan validate` options.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The plan file (`-f`, `--plan`).
    #[command(flatten)]
    pub plan: PlanArg,
    /// Print a JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `keyplan validate`.
pub(super) fn run(cli: &Cli, args: &ValidateArgs) -> Result<Exit> {
    cmd_validate(cli, &args.plan, args.json)
}

/// The `format_version` of the `validate --json` document.
const JSON_FORMAT_VERSION: &str = "1.0";

/// The `validate --json` document; fields in this order (`format_version` first).
#[derive(serde::Serialize)]
struct JsonReport {
    format_version: &'static str,
    valid: bool,
    error_count: usize,
    warning_count: usize,
    diagnostics: Vec<spec::JsonDiagnostic>,
}

/// Runs `validate`. Exit code 0 when the plan is valid, 1 when it is not (or cannot be read).
/// Without `--json` an invalid plan is returned as the error (rendered by miette on stderr);
/// with `--json` the diagnostics go to stdout as
/// `{format_version, valid, error_count, warning_count, diagnostics: [...]}`
/// ([`spec::JsonDiagnostic`]) and nothing is written to stderr.
pub(super) fn cmd_validate(cli: &Cli, arg: &PlanArg, json: bool) -> Result<Exit> {
    let result = load_whole_plan(cli, arg);
    if json {
        let diagnostics = match &result {
            Ok(_) => Vec::new(),
            Err(e) => spec::json_diagnostics(e),
        };
        let count = |s: spec::Severity| diagnostics.iter().filter(|d| d.severity == s).count();
        let error_count = count(spec::Severity::Error);
        let warning_count = count(spec::Severity::Warning);
        let valid = result.is_ok() && error_count == 0;
        let doc = JsonReport {
            format_version: JSON_FORMAT_VERSION,
            valid,
            error_count,
            warning_count,
            diagnostics,
        };
        outln!("{}", serde_json::to_string_pretty(&doc).into_diagnostic()?);
        return Ok(if valid { Exit::Success } else { Exit::Failure });
    }
    let plan = result?;
    let nodes: std::collections::BTreeSet<&str> = plan
        .devices
        .values()
        .filter_map(|d| d.node.as_deref())
        .collect();
    let on_nodes = match nodes.len() {
        0 => String::new(),
        1 => " on 1 node".to_string(),
        n => format!(" on {n} nodes"),
    };
    outln!(
        "The plan file {} is valid: {} KMS, {} keys, {} devices{on_nodes}.",
        plan.source_path.display(),
        plan.kms.len(),
        plan.keys.len(),
        plan.devices.len()
    );
    Ok(Exit::Success)
}
