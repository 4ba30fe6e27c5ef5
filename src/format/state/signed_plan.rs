//! `<state_dir>/agent-signed-plan.json`: the agent's last good signed plan, kept across
//! restarts (src/fleet/agent/admission.rs). Compact JSON, no final newline.

use serde::{Deserialize, Serialize};

use super::{checked, typed, ReadError};

/// The version this keyplan writes.
pub const SIGNED_PLAN_FORMAT: u64 = 2;

/// Version 1: no `format` field (keyplan before issue 47). Fields it does not know are
/// ignored, as that keyplan did (so it reads version 2 too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedPlanV1 {
    /// The plan file's text.
    pub plan: String,
    /// Its signature file's text (`<plan>.sig`).
    pub signature: String,
}

/// Version 2: version 1 with `"format": 2` first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedPlanV2 {
    /// Always 2.
    pub format: u64,
    /// The plan file's text.
    pub plan: String,
    /// Its signature file's text (`<plan>.sig`).
    pub signature: String,
}

impl SignedPlanV2 {
    /// Today's document for `plan` and `signature`.
    pub fn new(plan: String, signature: String) -> SignedPlanV2 {
        SignedPlanV2 {
            format: SIGNED_PLAN_FORMAT,
            plan,
            signature,
        }
    }

    /// The file's bytes: compact JSON.
    ///
    /// Errors: none in practice (two strings), the encoder's message.
    pub fn to_bytes(&self) -> Result<Vec<u8>, String> {
        serde_json::to_vec(self).map_err(|e| e.to_string())
    }
}

/// Reads the file, any version this keyplan knows, as version 2 (`document`: its path).
///
/// Errors: [`ReadError::Newer`] for a `format` above [`SIGNED_PLAN_FORMAT`];
/// [`ReadError::Corrupt`].
pub fn read_signed_plan(document: &str, bytes: &[u8]) -> Result<SignedPlanV2, ReadError> {
    let (value, version) = checked(
        &super::SIGNED_PLAN,
        document,
        bytes,
        "format",
        Some(1),
        SIGNED_PLAN_FORMAT,
    )?;
    if version < 2 {
        let old: SignedPlanV1 = typed(value)?;
        return Ok(SignedPlanV2::new(old.plan, old.signature));
    }
    typed(value)
}
