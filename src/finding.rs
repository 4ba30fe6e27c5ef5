//! What observation and the doors to the world report when something a plan names cannot be
//! opened or observed as it must be: a [`Finding`], pointing at its place in the plan file.
//!
//! A leaf below the pipeline: `observe` and `world` return findings plainly
//! (`Result<_, Vec<Finding>>`); `ops` turns them into the engine error
//! ([`crate::error::Error::Findings`]), which sits above the engine.

use std::fmt;

use crate::spec::PathSeg;

/// One problem found while opening or observing what a plan names (a device that cannot be
/// read, a KMS that cannot be opened, ...), pointing at the plan file where it can.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Where in the plan document the problem is (e.g. `devices.osd0.path`); `None` when it
    /// has no place there.
    pub at: Option<Vec<PathSeg>>,
    /// What is wrong, naming the device, key or file.
    pub message: String,
    /// What to do about it.
    pub help: Option<String>,
    /// Whether something is wrong, or could not be looked at.
    pub kind: FindingKind,
}

/// What a [`Finding`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FindingKind {
    /// Something is not as the plan needs it (a device missing or with another LUKS UUID, two
    /// devices that are one, a pinned keyslot out of range, corrupt records or registry, ...).
    Wrong,
    /// Something could not be looked at (a KMS that cannot be read, a file that cannot be
    /// opened): what it holds is unknown, which may be fine.
    Unreachable,
}

impl Finding {
    /// A finding at `at` in the plan document that something is wrong.
    pub fn at(at: Vec<PathSeg>, message: impl Into<String>, help: Option<String>) -> Finding {
        Finding {
            at: Some(at),
            message: message.into(),
            help,
            kind: FindingKind::Wrong,
        }
    }

    /// A finding with no place in the plan document that something is wrong.
    pub fn bare(message: impl Into<String>, help: Option<String>) -> Finding {
        Finding {
            at: None,
            message: message.into(),
            help,
            kind: FindingKind::Wrong,
        }
    }

    /// The same finding, saying something could not be looked at.
    pub fn unreachable(self) -> Finding {
        Finding {
            kind: FindingKind::Unreachable,
            ..self
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}
