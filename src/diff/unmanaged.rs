//! Keyslots keyplan does not manage, in plain view (issue 32): every bound keyslot of a
//! device with no keyplan record (a recovery passphrase, the installer's initial passphrase, a
//! TPM or FIDO2 binding, a keyslot added behind keyplan's back), and every LUKS2 token of
//! another tool (`systemd-tpm2`, `systemd-fido2`, `systemd-pkcs11`, `clevis`, ...), with what
//! the plan does with each. `plan` (text and JSON) and `status` (text, JSON, Prometheus) list
//! them on every run, not only once as drift. Read from the headers alone: no PBKDF run.

use serde::Serialize;

use super::{SlotAction, SlotChange};
use crate::observe::DeviceState;
use crate::spec::{Plan, UnmanagedKeyslots};

/// One LUKS2 token of another tool than keyplan (its `type` is not `keyplan`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ForeignToken {
    /// Token id (0-31).
    pub id: u32,
    /// The token's `type`, e.g. `systemd-tpm2`, `clevis`.
    #[serde(rename = "type")]
    pub token_type: String,
    /// Keyslots the token names.
    pub keyslots: Vec<u32>,
}

/// What the plan does with an unmanaged keyslot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// Left alone: `unmanaged_keyslots: keep`, or named by `unmanaged_keyslots: { keep: [...] }`.
    Kept,
    /// Killed by this plan (`unmanaged_keyslots: remove`, or not in the keep list).
    Removed,
    /// Recorded by this plan as a key's version that opens it (adoption).
    Adopted,
}

/// One bound keyslot of a device with no keyplan record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnmanagedKeyslot {
    /// Keyslot number.
    pub keyslot: u32,
    /// Its PBKDF, e.g. `argon2id`, `pbkdf2`.
    pub kdf: String,
    /// Tokens of other tools naming it (`type` and id), e.g. `systemd-tpm2`.
    pub tokens: Vec<ForeignToken>,
    /// What the plan does with it.
    pub fate: Fate,
    /// Why, e.g. `unmanaged_keyslots: keep`.
    pub why: String,
}

/// A device's keyslots without a keyplan record, and its tokens of other tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceUnmanaged {
    /// Device id.
    pub device: String,
    /// Bound keyslots with no keyplan record, by number.
    pub keyslots: Vec<UnmanagedKeyslot>,
    /// Every token of another tool, by id (also those naming no unmanaged keyslot).
    pub tokens: Vec<ForeignToken>,
}

impl DeviceUnmanaged {
    /// What the plan leaves as it is, in one line, e.g. `keyslot 0 (pbkdf2), keyslot 2
    /// (argon2id, systemd-tpm2 token 1); token 3 clevis (no keyslot)`; `None` when nothing is
    /// left (every unmanaged keyslot is removed or adopted: those are changes, shown as such).
    pub fn describe_kept(&self) -> Option<String> {
        let mut parts: Vec<String> = self
            .keyslots
            .iter()
            .filter(|k| k.fate == Fate::Kept)
            .map(|k| {
                let mut what = vec![k.kdf.clone()];
                what.extend(
                    k.tokens
                        .iter()
                        .map(|t| format!("{} token {}", t.token_type, t.id)),
                );
                let note = if k.why == KEEP_LISTED || k.why == KEPT_UNTIL_VERIFIED {
                    format!(": {}", k.why)
                } else {
                    String::new()
                };
                format!("keyslot {} ({}){note}", k.keyslot, what.join(", "))
            })
            .collect();
        parts.extend(
            self.tokens
                .iter()
                .filter(|t| {
                    !self
                        .keyslots
                        .iter()
                        .any(|k| t.keyslots.contains(&k.keyslot))
                })
                .map(|t| match t.keyslots.as_slice() {
                    [] => format!("{} token {} (no keyslot)", t.token_type, t.id),
                    s => format!(
                        "{} token {} (keyslot {}, managed by keyplan)",
                        t.token_type,
                        t.id,
                        s.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
                    ),
                }),
        );
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// [`UnmanagedKeyslot::why`] of a keyslot kept by `unmanaged_keyslots: { keep: [...] }`.
pub const KEEP_LISTED: &str = "listed in unmanaged_keyslots.keep";
/// [`UnmanagedKeyslot::why`] of a keyslot that `unmanaged_keyslots: remove` (or a keep list)
/// removes once a managed key is verified on the device, which this plan does not do yet.
pub const KEPT_UNTIL_VERIFIED: &str = "removed once a managed key is verified on the device";

/// The unmanaged keyslots and foreign tokens of every observed device of `plan` that has any,
/// in device order; fates from `slots` (the diff's keyslot changes: a kill is `Removed`, an
/// adoption `Adopted`), else `Kept`. `devices` are the observed devices before adoption
/// records are added.
pub fn unmanaged<'a>(
    plan: &Plan,
    devices: impl IntoIterator<Item = &'a DeviceState>,
    slots: &[SlotChange],
) -> Vec<DeviceUnmanaged> {
    let mut out = Vec::new();
    for st in devices {
        let tokens: Vec<ForeignToken> = st
            .header
            .tokens
            .values()
            .filter(|t| t.token_type != crate::world::records::TOKEN_TYPE)
            .map(|t| ForeignToken {
                id: t.id,
                token_type: t.token_type.clone(),
                keyslots: t.keyslots.clone(),
            })
            .collect();
        let spec = plan.devices.get(&st.id);
        let keyslots: Vec<UnmanagedKeyslot> = st
            .header
            .keyslots
            .iter()
            .filter(|(n, ks)| ks.bound && st.record(**n).is_none())
            .map(|(n, ks)| {
                let change = slots
                    .iter()
                    .find(|c| c.device == st.id && c.slot == *n)
                    .map(|c| c.action);
                let (fate, why) = match change {
                    Some(SlotAction::Remove) => (Fate::Removed, "not created by keyplan".into()),
                    Some(SlotAction::Adopt) => {
                        (Fate::Adopted, "a key's current version opens it".into())
                    }
                    _ => match spec {
                        Some(d) if d.unmanaged == UnmanagedKeyslots::Remove => (
                            Fate::Kept,
                            if d.keep_keyslots.contains(n) {
                                KEEP_LISTED.to_string()
                            } else {
                                KEPT_UNTIL_VERIFIED.to_string()
                            },
                        ),
                        _ => (Fate::Kept, "unmanaged_keyslots: keep".to_string()),
                    },
                };
                UnmanagedKeyslot {
                    keyslot: *n,
                    kdf: ks.kdf.clone(),
                    tokens: tokens
                        .iter()
                        .filter(|t| t.keyslots.contains(n))
                        .cloned()
                        .collect(),
                    fate,
                    why,
                }
            })
            .collect();
        if !keyslots.is_empty() || !tokens.is_empty() {
            out.push(DeviceUnmanaged {
                device: st.id.clone(),
                keyslots,
                tokens,
            });
        }
    }
    out
}

/// Notes for the keyslots `slots` kills that a token of another tool names (a Clevis or
/// systemd-tpm2 binding of a keyslot keyplan manages or removes): the token then names a
/// keyslot that is gone, and that tool no longer opens the device through it.
pub fn orphaned_tokens(unmanaged: &[DeviceUnmanaged], slots: &[SlotChange]) -> Vec<String> {
    let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    let mut out = Vec::new();
    for d in unmanaged {
        for t in &d.tokens {
            let killed: Vec<u32> = slots
                .iter()
                .filter(|c| {
                    c.device == d.device
                        && c.action == SlotAction::Remove
                        && t.keyslots.contains(&c.slot)
                })
                .map(|c| c.slot)
                .collect();
            if killed.is_empty() {
                continue;
            }
            let left: Vec<u32> = t
                .keyslots
                .iter()
                .copied()
                .filter(|n| !killed.contains(n))
                .collect();
            out.push(if left.is_empty() {
                format!(
                    "device {}: keyslot {} is killed, and the {} token {} names it: that token is then left naming no keyslot, so {} no longer opens the device through it. Bind it again to a new keyslot afterwards, or remove the token",
                    d.device,
                    list(&killed),
                    t.token_type,
                    t.id,
                    t.token_type
                )
            } else {
                format!(
                    "device {}: keyslot {} is killed, which the {} token {} names; the token keeps keyslot {}",
                    d.device,
                    list(&killed),
                    t.token_type,
                    t.id,
                    list(&left)
                )
            });
        }
    }
    out
}
