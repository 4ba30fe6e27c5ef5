//! Engine errors as miette reports, the CLI's edge: [`crate::error::Finding`]s point at their
//! place in the plan file; every other error shows its message and what to do. Messages and
//! help are redacted ([`crate::secret::redact`]) before miette lays them out: a form of
//! material wrapped onto two lines would no longer be recognised afterwards.

use miette::miette;

use crate::error::{Error, Finding};
use crate::secret::redact::redact;
use crate::spec::Plan;

/// `e` as a report; `plan` gives findings their place in the plan file (without it, they
/// are shown without a place).
pub(super) fn report(plan: Option<&Plan>, e: Error) -> miette::Report {
    match e {
        Error::Findings(findings) => {
            combine(findings.into_iter().map(|f| finding(plan, f)).collect())
        }
        e => {
            let message = redact(&e.to_string()).into_owned();
            match e.help() {
                Some(help) => miette!(help = redact(&help).into_owned(), "{message}"),
                None => miette!("{message}"),
            }
        }
    }
}

/// One finding: labeled in the plan file when it has a place there.
fn finding(plan: Option<&Plan>, f: Finding) -> miette::Report {
    let message = redact(&f.message).into_owned();
    let help = f.help.map(|h| redact(&h).into_owned());
    match (f.at, help, plan) {
        (Some(at), help, Some(plan)) => plan.error_at(&at, message, help),
        (_, Some(help), _) => miette!(help = help, "{message}"),
        (_, None, _) => miette!("{message}"),
    }
}

/// Joins several reports into one: the only one, or a summary with each rendered in full
/// (source snippets included).
fn combine(mut errors: Vec<miette::Report>) -> miette::Report {
    if errors.len() == 1 {
        if let Some(e) = errors.pop() {
            return e;
        }
    }
    let count = errors.len();
    let text: Vec<String> = errors.iter().map(|e| format!("{e:?}")).collect();
    miette!("{count} problems found:\n\n{}", text.join("\n"))
}

/// Turns engine errors into reports with the plan at hand.
pub(super) trait OrReport<T> {
    /// The value, or the error as a report (see [`report`]).
    fn or_report(self, plan: &Plan) -> miette::Result<T>;
}

impl<T> OrReport<T> for Result<T, Error> {
    fn or_report(self, plan: &Plan) -> miette::Result<T> {
        self.map_err(|e| report(Some(plan), e))
    }
}

/// Says on stderr, as a warning, that `engine`'s state directory is not its plan's: a
/// read-only command reading on ([`crate::ops::Engine::open_read_only`]). Nothing when it is.
pub(super) fn warn_foreign_state_dir(engine: &crate::ops::Engine) {
    if let Some(e) = engine.foreign_state_dir() {
        errln!("Warning: {}", e.read_only_warning());
    }
}

/// `e` as a report when no plan is loaded yet (a saved plan that cannot be read, ...).
pub(super) fn bare(e: Error) -> miette::Report {
    report(None, e)
}

/// Prints `e` (as [`report`]) on stderr and returns [`super::Exit::Unknown`] (exit 3) when it
/// says something could not be looked at ([`Error::could_not_look`]: a KMS unreachable, too
/// slow or refusing keyplan's credentials), so `plan` and `verify` tell "could not check" from
/// a problem as `status` does; any other error is returned as a report (exit 1).
///
/// Errors: `e` as a report when it is not "could not look".
pub(super) fn could_not_check(plan: &Plan, e: Error) -> miette::Result<super::Exit> {
    if e.could_not_look() {
        errln!("{:?}", report(Some(plan), e));
        Ok(super::Exit::Unknown)
    } else {
        Err(report(Some(plan), e))
    }
}
