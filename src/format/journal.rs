//! The journal (`<state_dir>/journal.jsonl`), its checkpoint and the audit trail.

use super::Format;

/// The formats of this module ([`super::all`]).
pub const FORMATS: &[Format] = &[];
