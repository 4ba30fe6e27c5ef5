//! The engine's error type: what can stop an engine operation, by kind, with the message a
//! person reads and what to do next ([`Error::help`]).
//!
//! Front ends decide how to show an error: the CLI turns it into a miette report
//! (`cli::report`), pointing [`Finding`]s at their place in the plan file; a node agent can
//! publish the kind and the message. Messages follow STYLE.md: what happened, what was left
//! untouched, what to do. None holds key material.

use std::fmt;
use std::path::PathBuf;

pub use crate::finding::{Finding, FindingKind};

use crate::apply::RunFailure;
use crate::diff::Refusal;
use crate::journal::JournalError;
use crate::kms::KmsError;
use crate::luks::LuksError;
use crate::saved::SavedError;
use crate::world::{OwnerError, RecordError, RegistryError};

/// Why an engine operation stopped. Every variant says what was left untouched.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// What the plan names could not be opened or observed as it must be (devices missing or
    /// not LUKS, an unexpected LUKS UUID, a KMS that cannot be opened or read, ...). Nothing
    /// was changed.
    #[error("{}", join_findings(.0))]
    Findings(Vec<Finding>),
    /// The planner found no safe plan; each refusal names the device or key and what to do.
    /// Nothing was changed.
    #[error("no safe plan exists:\n  - {}", join(.0))]
    NoSafePlan(Vec<Refusal>),
    /// A KMS the plan would write to failed its check ([`crate::kms::Kms::check`]) before any
    /// device was touched.
    #[error("the plan needs to write to a KMS that failed its check; no device was touched and nothing was staged:\n  - {}", join(.0))]
    KmsCheck(Vec<KmsError>),
    /// A run holds the state lock right now; its journal is in flux.
    #[error("a keyplan run is in progress on {}: {holder}", state_dir.display())]
    InProgress {
        /// The state directory.
        state_dir: PathBuf,
        /// `pid P on host H since T`, from the lock file.
        holder: String,
    },
    /// An interrupted run in the journal stands in the way of this operation (saving a plan,
    /// applying a saved plan). Nothing was changed or written.
    #[error("{message}")]
    Interrupted {
        /// The interrupted run's id.
        run: String,
        /// What was refused, naming the run.
        message: String,
        /// What to do (finish the run with `keyplan apply`).
        help: String,
    },
    /// The interrupted run cannot be finished as journaled, because the plan changed in a way
    /// that matters to it (a device path, a migration's destination). Nothing was changed.
    #[error("{message}")]
    Resume {
        /// What differs.
        message: String,
        /// How to restore what the run needs.
        help: String,
    },
    /// A saved plan no longer matches what it was made from. Nothing was changed.
    #[error("saved plan {} is stale; nothing was changed. Since it was made:\n  - {}", saved.display(), changed.join("\n  - "))]
    Stale {
        /// The saved plan file.
        saved: PathBuf,
        /// What changed, one phrase each.
        changed: Vec<String>,
        /// How to make a new one.
        help: String,
    },
    /// A saved plan's steps or changes differ from what keyplan plans now from the same plan
    /// file and state (edited by hand, or a rotation became due). Nothing was changed.
    #[error("saved plan {} does not match what keyplan plans now from the same plan file and state; nothing was changed:\n  - {}", saved.display(), differences.join("\n  - "))]
    SavedMismatch {
        /// The saved plan file.
        saved: PathBuf,
        /// What differs.
        differences: Vec<String>,
        /// How to make a new one.
        help: String,
    },
    /// A saved plan file cannot be used (unreadable, not a saved plan, damaged).
    #[error(transparent)]
    Saved(#[from] SavedError),
    /// A run failed at a step, or stopped at a signal; the journal records how far it got.
    #[error("{}", run_text(.failure, *.resumed))]
    Run {
        /// What the run did and where it stopped.
        failure: RunFailure,
        /// True when the run was an interrupted one being finished.
        resumed: bool,
    },
    /// A request names something the plan does not have, or would overwrite what it must not.
    /// Nothing was changed.
    #[error("{message}")]
    Request {
        /// What is wrong with the request.
        message: String,
        /// What to do.
        help: Option<String>,
    },
    /// A KMS call failed.
    #[error(transparent)]
    Kms(#[from] KmsError),
    /// A cryptsetup call failed.
    #[error(transparent)]
    Luks(#[from] LuksError),
    /// keyplan's records of a device could not be read or written.
    #[error(transparent)]
    Records(#[from] RecordError),
    /// The device registry could not be read or written.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The state directory belongs to another plan, or its owner record cannot be used
    /// (invariant I5). Nothing was read or changed there.
    #[error(transparent)]
    Owner(#[from] OwnerError),
    /// The journal or the state lock could not be read or written, or the lock is taken.
    #[error(transparent)]
    Journal(#[from] JournalError),
}

impl From<Vec<Finding>> for Error {
    fn from(findings: Vec<Finding>) -> Error {
        Error::Findings(findings)
    }
}

impl Error {
    /// Whether the operation stopped, before changing anything, only because something could
    /// not be looked at: every finding of the observation is [`FindingKind::Unreachable`] (a
    /// KMS that could not be read), or the KMS check or call failed because the KMS could not
    /// be reached, did not answer in time or refused keyplan's credentials
    /// ([`KmsError::Unavailable`], [`KmsError::Timeout`], [`KmsError::Denied`]: the same KMS
    /// errors the observation files as unreachable). A run that started (a step ran) is
    /// [`Error::Run`], never this. The node agent does not count such a stop towards
    /// `max_failed_nodes` (docs/fleet.md).
    pub fn could_not_look(&self) -> bool {
        let unreachable = |e: &KmsError| {
            matches!(
                e,
                KmsError::Unavailable { .. } | KmsError::Timeout { .. } | KmsError::Denied { .. }
            )
        };
        match self {
            Error::Findings(f) => {
                !f.is_empty() && f.iter().all(|x| x.kind == FindingKind::Unreachable)
            }
            Error::KmsCheck(errors) => !errors.is_empty() && errors.iter().all(unreachable),
            Error::Kms(e) => unreachable(e),
            _ => false,
        }
    }

    /// What to do next, when the message itself does not say it.
    pub fn help(&self) -> Option<String> {
        match self {
            Error::KmsCheck(_) => Some(
                "fix the KMS (address, credentials, permissions), then run `keyplan plan` again"
                    .to_owned(),
            ),
            Error::InProgress { .. } => {
                Some("wait for it to finish, then run `keyplan plan` again".to_owned())
            }
            Error::Interrupted { help, .. }
            | Error::Resume { help, .. }
            | Error::Stale { help, .. }
            | Error::SavedMismatch { help, .. } => Some(help.clone()),
            Error::Saved(e) => e.help(),
            Error::Run { failure, .. } => Some(if failure.interrupted {
                "run `keyplan apply` again to finish the run: it continues from the journal"
            } else {
                "every step is idempotent and the journal records progress: fix the cause, then run `keyplan apply` again. keyplan killed no keyslot without first verifying another one on the same device."
            }
            .to_owned()),
            Error::Request { help, .. } => help.clone(),
            Error::Owner(e) => e.help(),
            Error::Findings(f) if f.len() == 1 => f[0].help.clone(),
            _ => None,
        }
    }

    /// A [`Error::Request`] with `message` and `help`.
    pub fn request(message: impl Into<String>, help: Option<String>) -> Error {
        Error::Request {
            message: message.into(),
            help,
        }
    }
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("\n  - ")
}

fn join_findings(items: &[Finding]) -> String {
    match items {
        [one] => one.message.clone(),
        _ => format!(
            "{} problems found:\n\n{}",
            items.len(),
            items
                .iter()
                .map(|f| f.message.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
}

fn run_text(f: &RunFailure, resumed: bool) -> String {
    let what = if resumed {
        "finishing interrupted run"
    } else {
        "run"
    };
    if f.interrupted {
        format!(
            "{what} {} was interrupted: {}. {} steps completed; every device still opens with its key's current version",
            f.run,
            f.error,
            f.completed.len()
        )
    } else {
        format!(
            "{what} {} failed: {}\n({} steps completed before the failure)",
            f.run,
            f.error,
            f.completed.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn could_not_look_is_only_what_could_not_be_looked_at() {
        let kms = |detail: &str| KmsError::Timeout {
            kms: "vault KMS \"v\"".into(),
            detail: detail.into(),
        };
        let unreachable = Finding::bare("key k: KMS v unreadable", None).unreachable();
        assert!(Error::Findings(vec![unreachable.clone()]).could_not_look());
        assert!(Error::Kms(kms("reading")).could_not_look());
        assert!(Error::KmsCheck(vec![kms("checking")]).could_not_look());
        // Something wrong, or a refused plan, is not "could not look".
        let wrong = Finding::bare("device a is not LUKS", None);
        assert!(!Error::Findings(vec![unreachable, wrong]).could_not_look());
        assert!(!Error::Findings(Vec::new()).could_not_look());
        assert!(!Error::Kms(KmsError::Corrupt {
            kms: "k".into(),
            key: "k".into(),
            detail: "bad".into()
        })
        .could_not_look());
        assert!(!Error::NoSafePlan(Vec::new()).could_not_look());
    }
}
