//! The `aws_secrets_manager` KMS's record of a key: the JSON value of the secret
//! `<prefix><name>.keyplan` (src/kms/aws/layout.rs; docs/kms/aws-secrets-manager.md). Version 1,
//! compact JSON, no material:
//!
//! ```text
//! {"format":1,"holders":{"<holder id>":SINCE,...},"retired":{"<N>":CREATED_AT,...},
//!  "uncommitted":N}
//! ```
//!
//! `uncommitted` is absent when there is none. The staging labels and version ids of the
//! key's own secret (`keyplan-v<N>`, `keyplan-version-<20 digits>`, `keyplan-next` on a record
//! version being written) belong to the same version. Fields a later version 1 adds are kept
//! through every rewrite ([`Record::extra`]); a `format` above [`VERSION`] is refused. A record
//! without `format` is version 1 (as every field, it has a default).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{read_json, ReadError};
use crate::format::Format;

/// The version of the record this keyplan writes, and the newest it reads.
pub const VERSION: u64 = 1;

/// The record secret and the labels of a key's versions.
pub const FORMAT: Format = Format {
    name: "kms-aws-record",
    writes: "1",
    reads: "1",
    home: "secret <prefix><name>.keyplan and version labels (aws_secrets_manager KMS)",
};

/// The record secret's value. (Read by [`Record::parse`]: serde's `flatten` cannot read the
/// integer keys of `retired`.)
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Record {
    /// Format version, [`VERSION`].
    #[serde(default)]
    pub format: u64,
    /// The holder and vote records ([`super::holders`]): id -> since (Unix seconds).
    #[serde(default)]
    pub holders: BTreeMap<String, u64>,
    /// Retired versions -> their creation time (Unix seconds).
    #[serde(default)]
    pub retired: BTreeMap<u64, u64>,
    /// A first version staged but not committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncommitted: Option<u64>,
    /// Fields this keyplan does not know: written back unchanged.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// The fields of version 1.
const KNOWN: [&str; 4] = ["format", "holders", "retired", "uncommitted"];

/// [`Record`]'s known fields, as read.
#[derive(Deserialize)]
struct Known {
    #[serde(default)]
    format: u64,
    #[serde(default)]
    holders: BTreeMap<String, u64>,
    #[serde(default)]
    retired: BTreeMap<u64, u64>,
    #[serde(default)]
    uncommitted: Option<u64>,
}

impl Record {
    /// Reads the record's bytes; `document` names the KMS instance, key and secret in a
    /// refusal.
    ///
    /// Errors: [`ReadError::Newer`] for a `format` above [`VERSION`]; [`ReadError::Invalid`]
    /// for bytes that are not a version-1 record.
    pub fn parse(bytes: &[u8], document: &str) -> Result<Record, ReadError> {
        let known: Known = read_json(&FORMAT, document, bytes, "format", 1, VERSION)?;
        let mut extra: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(bytes).map_err(|e| ReadError::Invalid(e.to_string()))?;
        extra.retain(|k, _| !KNOWN.contains(&k.as_str()));
        Ok(Record {
            format: known.format.max(1),
            holders: known.holders,
            retired: known.retired,
            uncommitted: known.uncommitted,
            extra,
        })
    }

    /// The text this keyplan writes: compact JSON, `format` [`VERSION`], unknown fields kept.
    pub fn to_text(&self) -> String {
        let record = Record {
            format: VERSION,
            ..self.clone()
        };
        // Numbers, strings and JSON values only: encoding cannot fail.
        serde_json::to_string(&record).unwrap_or_default()
    }
}
