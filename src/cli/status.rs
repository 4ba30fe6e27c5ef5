//! `keyplan status`: [`crate::ops::status::status`] rendered as text, JSON or Prometheus
//! metrics ([`crate::render::status`]), to stdout or atomically to `-o FILE`; the verdict is the
//! exit status (docs/monitoring.md): 0 healthy, 1 a problem found, 3 something could not be
//! checked (or the report could not be made or written) and no problem found.

use super::*;
use crate::ops::status::Verdict;

/// `keyplan status`. Reads the KMSs, the journal and the LUKS headers; writes nothing but
/// `output`; costs no PBKDF run.
///
/// Errors: none of its own: a plan that cannot be loaded, a KMS client that cannot be built,
/// or `output` that cannot be written are printed on stderr and give exit 3.
pub(super) fn cmd_status(
    cli: &Cli,
    arg: &PlanArg,
    format: StatusFormat,
    output: Option<&std::path::Path>,
) -> Result<Exit> {
    let unknown = |e: miette::Report| {
        eprintln!("{e:?}");
        Ok(Exit::Unknown)
    };
    let plan = match load_plan(cli, arg) {
        Ok(p) => p,
        Err(e) => return unknown(e),
    };
    let engine = match Engine::open(plan.clone()).or_report(&plan) {
        Ok(e) => e,
        Err(e) => return unknown(e),
    };
    let report = ops::status::status(&engine);
    tracing::debug!(pbkdf_runs = engine.pbkdf_runs(), "status observed");
    let text = match format {
        StatusFormat::Text => render::status::text(&report),
        StatusFormat::Json => render::status::json(&report).into_diagnostic()?,
        StatusFormat::Prometheus => render::status::prometheus(&report).into_diagnostic()?,
    };
    match output {
        None => out!("{text}"),
        Some(path) => {
            if let Err(e) = crate::fsutil::write_atomic(path, text.as_bytes(), 0o644) {
                return unknown(miette!(
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
