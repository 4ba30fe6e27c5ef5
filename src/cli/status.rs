//! `keyplan status`: [`crate::ops::status::status`] rendered as text, JSON or Prometheus
//! metrics ([`crate::render::status`]), to stdout or atomically to `-o FILE`; the verdict is the
//! exit status (docs/monitoring.md): 0 healthy, 1 a problem found (or the report could not be
//! written; a state directory that belongs to another plan is a problem, reported with the
//! rest), 3 something could not be checked (or nothing could: the plan does not load) and no
//! problem found.

use super::*;
use crate::ops::status::Verdict;

/// `keyplan status` options.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The plan file (`-f`, `--plan`).
    #[command(flatten)]
    pub plan: PlanArg,
    /// Output format: text, a JSON document, or Prometheus textfile metrics.
    #[arg(long, value_enum, default_value_t = StatusFormat::Text)]
    pub format: StatusFormat,
    /// Write to FILE atomically (temporary file + rename) instead of stdout, e.g. into
    /// node_exporter's textfile collector directory.
    #[arg(short = 'o', long = "out", alias = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs `keyplan status`.
pub(super) fn run(cli: &Cli, args: &StatusArgs) -> Result<Exit> {
    cmd_status(cli, &args.plan, args.format, args.output.as_deref())
}

/// `keyplan status`. Reads the KMSs, the journal and the LUKS headers; writes nothing but
/// `output`; costs no PBKDF run.
///
/// Errors: `output` cannot be written (exit 1). A plan that cannot be loaded or a KMS client
/// that cannot be built are printed on stderr and give exit 3: nothing could be checked.
pub(super) fn cmd_status(
    cli: &Cli,
    arg: &PlanArg,
    format: StatusFormat,
    output: Option<&std::path::Path>,
) -> Result<Exit> {
    let unknown = |e: miette::Report| {
        errln!("{e:?}");
        Ok(Exit::Unknown)
    };
    let plan = match load_plan(cli, arg) {
        Ok(p) => p,
        Err(e) => return unknown(e),
    };
    if let Some(path) = output {
        ops::status::check_out_path(&plan, path).or_report(&plan)?;
    }
    // Another plan's state directory is no refusal: the report says whose it is, as its first
    // problem, and reads on (exit 1).
    let engine = match Engine::open_read_only(plan.clone()) {
        Ok(e) => e,
        Err(e) => return unknown(report::report(Some(&plan), e)),
    };
    let report = ops::status::status(&engine);
    tracing::debug!(pbkdf_runs = engine.pbkdf_runs(), "status observed");
    let text = match format {
        StatusFormat::Text => render::status::text(&report),
        StatusFormat::Json => render::status::json(&report).into_diagnostic()?,
        StatusFormat::Prometheus => render::status::prometheus(&report).into_diagnostic()?,
    };
    // KMS errors quoted in the report may quote material back (stdout is redacted by `out!`;
    // `-o FILE` is written here).
    let text = match format {
        StatusFormat::Json => crate::secret::redact::redact_json(&text).into_owned(),
        _ => crate::secret::redact::redact(&text).into_owned(),
    };
    match output {
        None => out!("{text}"),
        Some(path) => {
            if let Err(e) = crate::fsutil::write_atomic(path, text.as_bytes(), 0o644) {
                return Err(miette!(
                    help = "check that the directory exists and is writable; the previous file (if any) was left as it was",
                    "cannot write the status to {}: {e}",
                    path.display()
                ));
            }
        }
    }
    Ok(match report.verdict {
        Verdict::Healthy => Exit::Success,
        Verdict::Problem => Exit::Failure,
        Verdict::Unknown => Exit::Unknown,
    })
}
