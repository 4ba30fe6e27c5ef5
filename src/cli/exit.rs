//! Exit statuses of the command line (docs/commands.md, docs/monitoring.md).

use std::process::ExitCode;

/// How a command ends, as its exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: success; no changes; healthy.
    Success,
    /// 1: an error (the message is on stderr), usage errors included (an unknown flag or
    /// subcommand, a missing or bad value: clap's own code 2 would read as "changes present");
    /// for `status`, a problem was found; for `apply`, the operator did not confirm.
    Failure,
    /// 2: `plan --detailed-exitcode` found changes (or an interrupted run to finish).
    Changes,
    /// 3: `status` could not check everything (a KMS, the journal or the devices could not be
    /// read, or nothing at all: the plan could not be loaded) and found no problem in what it
    /// could check; `plan` or `verify` could not be made because a KMS could not be asked
    /// (unreachable, too slow, refusing keyplan's credentials).
    Unknown,
}

impl Exit {
    /// The numeric exit code.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Failure => 1,
            Exit::Changes => 2,
            Exit::Unknown => 3,
        }
    }

    /// [`Exit::Changes`] when `detailed` and there are `changes`, else [`Exit::Success`]
    /// (`plan --detailed-exitcode`).
    pub fn changes(detailed: bool, changes: bool) -> Exit {
        if detailed && changes {
            Exit::Changes
        } else {
            Exit::Success
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}
