//! What keyplan keeps in each KMS, and the `exec` KMS protocol.

use super::Format;

/// The formats of this module ([`super::all`]).
pub const FORMATS: &[Format] = &[];
