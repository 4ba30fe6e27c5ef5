//! Saved plans, JSON output for programs, node reports and the Kubernetes objects agents read.

use super::Format;

/// The formats of this module ([`super::all`]).
pub const FORMATS: &[Format] = &[];
