//! The `exec` KMS protocol's version (src/kms/exec/protocol.rs holds the messages;
//! docs/kms/exec.md is the contract helpers implement).
//!
//! Every request keyplan writes to a helper's standard input and every response it reads back
//! carries `protocol_version`. Version 1: one JSON request object, one JSON response object
//! (`ok`, `result` or `error`); `read`'s result lists versions as [`super::VersionEntry`].
//! Unknown fields are ignored on both sides; a response of a higher version is refused with
//! [`crate::format::NewerFormat`] ([`check`]).

use super::ReadError;
use crate::format::Format;

/// The protocol version keyplan speaks.
pub const VERSION: u64 = 1;

/// The `exec` protocol.
pub const FORMAT: Format = Format {
    name: "kms-exec-protocol",
    writes: "1",
    reads: "1",
    home: "exec KMS helper's stdin (requests) and stdout (responses)",
};

/// Checks a response's `protocol_version` `found`; `document` names the KMS instance, the
/// operation and the key in a refusal.
///
/// Errors: [`ReadError::Newer`] above [`VERSION`]; [`ReadError::Invalid`] below it (a
/// version 0 or a number from no keyplan protocol).
pub fn check(found: u64, document: &str) -> Result<(), ReadError> {
    crate::format::check_version(&FORMAT, document, found, VERSION).map_err(ReadError::Newer)?;
    if found < VERSION {
        return Err(ReadError::Invalid(format!(
            "protocol_version {found} is not a version of the protocol (they start at 1)"
        )));
    }
    Ok(())
}
