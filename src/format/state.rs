//! The state directory's documents other than the journal, keyplan's LUKS2 token and its LUKS1 records.

use super::Format;

/// The formats of this module ([`super::all`]).
pub const FORMATS: &[Format] = &[];
