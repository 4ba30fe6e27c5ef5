//! The plan as a JSON document (`plan --json`, saved plans, `show --json`): the machine
//! form of a [`Diff`], beside the model it describes. Formatting for people is in
//! `src/render/mod.rs`.

use super::{Diff, KeyAction, KeyChange, SlotChange};

/// The plan as a JSON document (`format_version` "1.0"; readers must tolerate unknown fields
/// within 1.x): `changes_present`, `summary`, `changes` (every key and keyslot change with its
/// `address` — `key.ID` or `device.ID.keyslot[N]` —, `actions`, `reason`, `reason_code`
/// ([`crate::diff::ReasonCode`]), `device`, `keyslot`, `key`, `version`), and, as before,
/// `keys` and `keyslots` (each entry also with `address`), `notes` and `steps`. No secrets:
/// only ids, numbers and KMS metadata.
pub fn plan_json(diff: &Diff) -> serde_json::Value {
    let keys: Vec<serde_json::Value> = diff.keys.iter().map(key_json).collect();
    let slots: Vec<serde_json::Value> = diff.slots.iter().map(slot_json).collect();
    let mut changes = Vec::new();
    for (k, j) in diff.keys.iter().zip(&keys) {
        changes.push(serde_json::json!({
            "address": j["address"],
            "type": "key",
            "actions": [k.action],
            "reason": k.reason,
            "reason_code": k.reason_code,
            "key": k.key,
            "kms": k.kms,
            "from_version": k.from,
            "version": k.to,
            "retire": k.retire,
            "from_kms": k.from_kms,
        }));
    }
    for h in &diff.holders {
        changes.push(serde_json::json!({
            "address": key_address(&h.key),
            "type": "holder",
            "actions": [h.action],
            "key": h.key,
            "kms": h.kms,
            "holder": h.holder,
        }));
    }
    for (c, j) in diff.slots.iter().zip(&slots) {
        changes.push(serde_json::json!({
            "address": j["address"],
            "type": "keyslot",
            "actions": [c.action],
            "reason": c.reason,
            "reason_code": c.reason_code,
            "device": c.device,
            "keyslot": c.slot,
            "key": c.key,
            "version": c.version,
        }));
    }
    let mut doc = serde_json::json!({
        "format_version": "1.0",
        "changes_present": !diff.is_empty(),
        "summary": {
            "add": diff.adds(),
            "remove": diff.removes(),
            "rotate": diff.rotations(),
            "migrate": diff.keys.iter().filter(|k| k.action == KeyAction::Migrate).count(),
        },
        "changes": changes,
        "keys": keys,
        "keyslots": slots,
        "notes": diff.notes,
        "steps": diff.graph.steps(),
    });
    // Only when there are some: a plan without adoptions reads as it always did (saved plans
    // compare this document).
    if diff.adoptions() > 0 {
        doc["summary"]["adopt"] = diff.adoptions().into();
    }
    // Likewise: the copies earlier moves kept, destroyed now (`actions: ["destroy_kept"]`).
    if diff.kept_destroys() > 0 {
        doc["summary"]["destroy_kept"] = diff.kept_destroys().into();
    }
    // Likewise: only devices with keyslots keyplan does not manage, or tokens of other
    // tools, add `unmanaged_keyslots` (one object per device: its keyslots with their fate,
    // `kept`, `removed` or `adopted`, and its tokens of other tools).
    if !diff.unmanaged.is_empty() {
        doc["unmanaged_keyslots"] = serde_json::to_value(&diff.unmanaged).unwrap_or_default();
    }
    // Likewise: only a shared key's commit that waits for other nodes adds `waiting`.
    if !diff.waiting.is_empty() {
        doc["waiting"] = serde_json::to_value(&diff.waiting).unwrap_or_default();
    }
    if !diff.holders.is_empty() {
        doc["summary"]["holders"] = diff.holders.len().into();
        doc["holders"] = serde_json::to_value(&diff.holders).unwrap_or_default();
    }
    // Only when a device cannot be used: `unavailable_devices`, each with its id, path, why
    // and what to do (the command then exits 1).
    if !diff.unavailable.is_empty() {
        doc["unavailable_devices"] = diff
            .unavailable
            .iter()
            .map(|(id, u)| {
                serde_json::json!({"device": id, "path": u.path, "at": u.at, "error": u.why, "help": u.help})
            })
            .collect();
    }
    doc
}

/// `key.ID`: the address of a key change.
pub fn key_address(key: &str) -> String {
    format!("key.{key}")
}

/// `device.ID.keyslot[N]`: the address of a keyslot change.
pub fn slot_address(device: &str, slot: u32) -> String {
    format!("device.{device}.keyslot[{slot}]")
}

fn with_address<T: serde::Serialize>(v: &T, address: String) -> serde_json::Value {
    let mut j = serde_json::to_value(v).unwrap_or(serde_json::Value::Null);
    if let Some(o) = j.as_object_mut() {
        o.insert("address".into(), serde_json::Value::String(address));
    }
    j
}

fn key_json(k: &KeyChange) -> serde_json::Value {
    with_address(k, key_address(&k.key))
}

fn slot_json(c: &SlotChange) -> serde_json::Value {
    with_address(c, slot_address(&c.device, c.slot))
}
