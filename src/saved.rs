//! Saved plans (`keyplan plan -o FILE`, `keyplan apply FILE`, `keyplan show FILE`): the file
//! format and the digest of the observed state a plan was made from.
//!
//! A saved plan is one JSON document ([`SavedPlan`]) holding the planned changes, the step
//! graph that makes them, and a [`StateDigest`]: SHA-256 digests over a canonical JSON
//! serialization of everything the plan was derived from, per component, so that a refusal can
//! say what changed:
//!
//! * per device (and per former device still present): path, LUKS version and UUID, LUKS2
//!   metadata epoch, every keyslot's number, KDF salt and type, priority and bound-ness, every
//!   LUKS2 token, and keyplan's records (LUKS1: the record in the state directory);
//! * per key (and per migration origin): the KMS state: current and pending version and every
//!   version's number, state and creation time. Never key material;
//! * the plan file's bytes;
//! * the journal: the last run's id and whether it ended.
//!
//! Applying a saved plan changes the headers, the KMS and the journal, so the same saved plan
//! is refused the second time, also when it was made against fresh devices. Nothing here
//! touches a terminal; the CLI renders.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::diff::{Diff, HolderChange, KeyChange, SlotChange};
use crate::graph::{Step, StepGraph};
use crate::journal::Record;
use crate::kms::KeyState;
use crate::observe::{DeviceState, Observed};

/// `format_version` written into saved plans. Readers accept any `1.x` and ignore unknown
/// fields.
pub const FORMAT_VERSION: &str = "1.0";
/// `kind` of a saved plan file.
pub const KIND: &str = "keyplan-saved-plan";

/// The plan file a saved plan was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanFileRef {
    /// Absolute path.
    pub path: PathBuf,
    /// SHA-256 of its bytes, lower-case hex.
    pub sha256: String,
}

/// Command-line options the plan was made with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedOptions {
    /// `--rotate KEY` keys.
    pub rotate: Vec<String>,
    /// `--verify`.
    pub verify: bool,
    /// `--repair-headers`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repair_headers: bool,
}

/// The journal's last run when the plan was made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalMark {
    /// Run id of the last run, `None` for an empty journal.
    pub last_run: Option<String>,
    /// That run's outcome (`run_end`), `None` when it did not end (or there is none).
    pub outcome: Option<String>,
}

/// Digests of the observed state (each a lower-case hex SHA-256).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDigest {
    /// Digest over all components below.
    pub digest: String,
    /// Plan file bytes.
    pub plan_file: String,
    /// Per device id (former devices as `former:ID`).
    pub devices: BTreeMap<String, String>,
    /// Per device id: per keyslot number, a digest of the keyslot (salt, KDF, priority,
    /// bound-ness), the LUKS2 tokens assigned to it and keyplan's records of it; says which
    /// keyslots changed when a device's digest did.
    #[serde(default)]
    pub keyslots: BTreeMap<String, BTreeMap<u32, String>>,
    /// Per key id (migration origins as `KEY@KMS/NAME`).
    pub keys: BTreeMap<String, String>,
    /// The journal's last run.
    pub journal: JournalMark,
}

/// A saved plan file (`keyplan plan -o FILE`). Holds no key material.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedPlan {
    /// [`FORMAT_VERSION`].
    pub format_version: String,
    /// [`KIND`].
    pub kind: String,
    /// keyplan version that wrote it.
    pub keyplan_version: String,
    /// Unix seconds (UTC) when it was made.
    pub created_at: u64,
    /// The plan file.
    pub plan_file: PlanFileRef,
    /// The state directory (journal, lock) the plan was made against.
    pub state_dir: PathBuf,
    /// Options.
    pub options: SavedOptions,
    /// Digest of what the plan was made from.
    pub state: StateDigest,
    /// The changes: the `plan --json` document (`format_version`, `changes_present`,
    /// `summary`, `changes`, `keys`, `keyslots`, `notes`) without its `steps`, which are below.
    pub changes: serde_json::Value,
    /// The steps, as the journal records them.
    pub steps: Vec<Step>,
    /// Step dependencies `(before, after)`.
    pub deps: Vec<(usize, usize)>,
}

impl SavedPlan {
    /// The changes and steps as a [`Diff`] (for rendering and running).
    ///
    /// Errors: `changes.keys`, `changes.keyslots` or `changes.notes` do not have the shape
    /// keyplan writes (message says which), or `deps` name a step that does not exist.
    pub fn diff(&self) -> Result<Diff, Damage> {
        fn field<T: serde::de::DeserializeOwned + Default>(
            v: &serde_json::Value,
            name: &str,
        ) -> Result<T, Damage> {
            match v.get(name) {
                None => Ok(T::default()),
                Some(x) => serde_json::from_value(x.clone())
                    .map_err(|e| Damage(format!("\"changes.{name}\" is damaged: {e}"))),
            }
        }
        let keys: Vec<KeyChange> = field(&self.changes, "keys")?;
        let slots: Vec<SlotChange> = field(&self.changes, "keyslots")?;
        let notes: Vec<String> = field(&self.changes, "notes")?;
        let holders: Vec<HolderChange> = field(&self.changes, "holders")?;
        if let Some((a, b)) = self
            .deps
            .iter()
            .find(|(a, b)| *a >= self.steps.len() || *b >= self.steps.len())
        {
            return Err(Damage(format!(
                "\"deps\" names step {} of {} steps",
                (*a).max(*b),
                self.steps.len()
            )));
        }
        Ok(Diff {
            keys,
            slots,
            holders,
            graph: StepGraph::from_parts(self.steps.clone(), &self.deps),
            notes,
            // Not saved: a wait is a fact of the moment of planning, not a change.
            waiting: Vec::new(),
            unavailable: Default::default(),
            // Not saved either: what the plan leaves alone is not a change.
            unmanaged: Vec::new(),
        })
    }
}

/// What is inconsistent in a saved plan's changes or step dependencies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Damage(pub String);

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn digest_json(v: &serde_json::Value) -> String {
    // serde_json writes object keys in sorted order (no `preserve_order` feature), so the
    // compact serialization is canonical.
    sha256_hex(v.to_string().as_bytes())
}

fn device_json(d: &DeviceState) -> serde_json::Value {
    let h = &d.header;
    let keyslots: BTreeMap<String, serde_json::Value> = h
        .keyslots
        .iter()
        .map(|(n, k)| {
            (
                n.to_string(),
                serde_json::json!({
                    "salt": k.salt,
                    "kdf": k.kdf,
                    "priority": format!("{:?}", k.priority),
                    "bound": k.bound,
                }),
            )
        })
        .collect();
    let tokens: BTreeMap<String, serde_json::Value> = h
        .tokens
        .iter()
        .map(|(id, t)| (id.to_string(), t.json.clone()))
        .collect();
    let mut records: Vec<serde_json::Value> = d
        .records
        .iter()
        .map(|r| {
            serde_json::json!({
                "slot": r.slot,
                "key": r.record.key,
                "version": r.record.version,
                "salt": r.record.salt,
                "entry": r.record.entry,
                "token": r.token_id,
            })
        })
        .collect();
    records.sort_by_key(|v| v.to_string());
    serde_json::json!({
        "path": d.path,
        "luks": h.version.to_string(),
        "uuid": h.uuid,
        "epoch": h.epoch,
        "keyslots": keyslots,
        "tokens": tokens,
        "records": records,
    })
}

/// Per keyslot of `d` (every occupied keyslot and every keyslot a record names): a digest
/// of its header entry, the tokens assigned to it and keyplan's records of it.
fn slot_digests(d: &DeviceState) -> BTreeMap<u32, String> {
    let mut numbers: Vec<u32> = d.header.keyslots.keys().copied().collect();
    numbers.extend(d.records.iter().map(|r| r.slot));
    numbers.sort_unstable();
    numbers.dedup();
    numbers
        .into_iter()
        .map(|n| {
            let ks = d.header.keyslots.get(&n).map(|k| {
                serde_json::json!({
                    "salt": k.salt,
                    "kdf": k.kdf,
                    "priority": format!("{:?}", k.priority),
                    "bound": k.bound,
                })
            });
            let tokens: Vec<&serde_json::Value> = d
                .header
                .tokens
                .values()
                .filter(|t| t.keyslots.contains(&n))
                .map(|t| &t.json)
                .collect();
            let records: Vec<serde_json::Value> = d
                .records
                .iter()
                .filter(|r| r.slot == n)
                .map(|r| {
                    serde_json::json!({
                        "key": r.record.key,
                        "version": r.record.version,
                        "salt": r.record.salt,
                        "entry": r.record.entry,
                    })
                })
                .collect();
            (
                n,
                digest_json(&serde_json::json!({
                    "keyslot": ks,
                    "tokens": tokens,
                    "records": records,
                })),
            )
        })
        .collect()
}

fn key_json(k: &KeyState) -> serde_json::Value {
    serde_json::json!({
        "current": k.current,
        "pending": k.pending,
        "versions": k.versions.values().collect::<Vec<_>>(),
    })
}

/// The journal's last run in `records`.
pub fn journal_mark(records: &[Record]) -> JournalMark {
    match crate::journal::last_run(records) {
        Some(s) => JournalMark {
            last_run: Some(s.run),
            outcome: s.ended,
        },
        None => JournalMark::default(),
    }
}

/// Computes the digest of `observed` (as [`crate::observe::observe`] returns it, before any
/// `--verify`; record drift statuses are not part of it, they follow from header and record),
/// the plan file's bytes and the journal's last run.
pub fn state_digest(plan_bytes: &[u8], observed: &Observed, journal: JournalMark) -> StateDigest {
    let mut devices = BTreeMap::new();
    let mut keyslots = BTreeMap::new();
    for (id, d) in &observed.devices {
        devices.insert(id.clone(), digest_json(&device_json(d)));
        keyslots.insert(id.clone(), slot_digests(d));
    }
    for (id, d) in &observed.former {
        devices.insert(format!("former:{id}"), digest_json(&device_json(d)));
    }
    for (id, u) in &observed.unavailable {
        devices.insert(
            id.clone(),
            digest_json(&serde_json::json!({"path": u.path, "unavailable": u.why})),
        );
    }
    for (id, path, why) in &observed.former_unreadable {
        devices.insert(
            format!("former:{id}"),
            digest_json(&serde_json::json!({"path": path, "unreadable": why})),
        );
    }
    let mut keys = BTreeMap::new();
    for (id, k) in &observed.keys {
        keys.insert(id.clone(), digest_json(&key_json(k)));
    }
    for (id, origins) in &observed.origins {
        for o in origins {
            keys.insert(
                format!("{id}@{}/{}", o.kms, o.name),
                digest_json(&serde_json::json!({
                    "state": o.state.as_ref().map(key_json),
                })),
            );
        }
    }
    let plan_file = sha256_hex(plan_bytes);
    let all = serde_json::json!({
        "plan_file": plan_file,
        "devices": devices,
        "keys": keys,
        "journal": journal,
    });
    StateDigest {
        digest: digest_json(&all),
        plan_file,
        devices,
        keyslots,
        keys,
        journal,
    }
}

/// What changed on device `id`: the keyslots added, removed or changed (rewritten, another
/// record or token), or, when no keyslot did, the header's other metadata.
fn device_change(saved: &StateDigest, now: &StateDigest, id: &str) -> String {
    let (Some(before), Some(after)) = (saved.keyslots.get(id), now.keyslots.get(id)) else {
        return "LUKS header or keyplan record changed".to_string();
    };
    let list = |v: Vec<u32>| {
        v.iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let added: Vec<u32> = after
        .keys()
        .filter(|n| !before.contains_key(n))
        .copied()
        .collect();
    let removed: Vec<u32> = before
        .keys()
        .filter(|n| !after.contains_key(n))
        .copied()
        .collect();
    let changed: Vec<u32> = before
        .iter()
        .filter(|(n, d)| after.get(n).is_some_and(|a| a != *d))
        .map(|(n, _)| *n)
        .collect();
    let mut parts = Vec::new();
    if !added.is_empty() {
        parts.push(format!("keyslot {} added", list(added)));
    }
    if !removed.is_empty() {
        parts.push(format!("keyslot {} removed", list(removed)));
    }
    if !changed.is_empty() {
        parts.push(format!("keyslot {} changed", list(changed)));
    }
    if parts.is_empty() {
        "LUKS header metadata changed".to_string()
    } else {
        parts.join(", ")
    }
}

/// What differs between the digest a plan was saved with and the one observed now, one
/// phrase each (e.g. `device osd0: LUKS header or keyplan record changed`, `key data: KMS
/// versions changed`, `the plan file changed`, `the journal records a later run (ID,
/// success)`). Empty when nothing changed.
pub fn changes_since(saved: &StateDigest, now: &StateDigest) -> Vec<String> {
    let mut out = Vec::new();
    if saved.plan_file != now.plan_file {
        out.push("the plan file changed".to_string());
    }
    let describe = |what: &str, id: &str| -> String {
        match id.strip_prefix("former:") {
            Some(f) => format!("{what} {f} (no longer in the plan)"),
            None => format!("{what} {id}"),
        }
    };
    for (id, d) in &saved.devices {
        match now.devices.get(id) {
            Some(n) if n == d => {}
            Some(_) => out.push(format!(
                "{}: {}",
                describe("device", id),
                device_change(saved, now, id)
            )),
            None => out.push(format!("{}: no longer observed", describe("device", id))),
        }
    }
    for id in now
        .devices
        .keys()
        .filter(|id| !saved.devices.contains_key(*id))
    {
        out.push(format!("{}: new since the plan", describe("device", id)));
    }
    for (id, d) in &saved.keys {
        match now.keys.get(id) {
            Some(n) if n == d => {}
            Some(_) => out.push(format!("key {id}: KMS versions changed")),
            None => out.push(format!("key {id}: no longer observed")),
        }
    }
    for id in now.keys.keys().filter(|id| !saved.keys.contains_key(*id)) {
        out.push(format!("key {id}: new since the plan"));
    }
    if saved.journal != now.journal {
        match (&now.journal.last_run, &now.journal.outcome) {
            (Some(run), Some(outcome)) => out.push(format!(
                "the journal records a later run ({run}, {outcome})"
            )),
            (Some(run), None) => out.push(format!(
                "the journal records a later run ({run}) that did not finish"
            )),
            (None, _) => out.push("the journal was emptied".to_string()),
        }
    }
    if out.is_empty() && saved.digest != now.digest {
        out.push("the observed state changed".to_string());
    }
    out
}

/// What differs between the saved plan and `now`, the diff keyplan makes from the same plan
/// file, the current state and the saved options (`--rotate`, `--verify`): the steps and their
/// order, and every key and keyslot change (action, key, versions, device, keyslot), and the
/// whole `changes` document reviewers read (`summary`, `changes_present`, `changes[]`, against
/// `now_json`, the `plan --json` document of `now`); the reason and note texts are left out, as
/// they name ages that grow by the minute. Empty when they agree.
///
/// A saved plan is a file anyone with write access to it can edit: `apply SAVED` runs its steps
/// only when they are exactly the steps keyplan would plan now, so a hand-edited or damaged
/// file cannot make keyplan kill a keyslot the plan keeps or commit a version some device does
/// not hold. `changes` (what `show` renders and people review) must agree too.
pub fn mismatch(saved: &SavedPlan, now: &Diff, now_json: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let now_steps = now.graph.steps();
    if saved.steps != now_steps {
        let first = saved
            .steps
            .iter()
            .zip(&now_steps)
            .position(|(a, b)| a != b)
            .unwrap_or(saved.steps.len().min(now_steps.len()));
        // The step text leaves out some fields (`at_least`, `anchor`, ...): when both sides
        // read the same, show the steps as JSON.
        let same_text = match (saved.steps.get(first), now_steps.get(first)) {
            (Some(a), Some(b)) => a.to_string() == b.to_string(),
            _ => false,
        };
        let show = |v: &[Step]| {
            v.get(first).map_or_else(
                || "nothing".to_string(),
                |s| {
                    if same_text {
                        serde_json::to_string(s).unwrap_or_else(|_| format!("`{s}`"))
                    } else {
                        format!("`{s}`")
                    }
                },
            )
        };
        out.push(format!(
            "its steps differ from the {} steps keyplan would run now ({} saved); step {first}: saved {}, now {}",
            now_steps.len(),
            saved.steps.len(),
            show(&saved.steps),
            show(&now_steps)
        ));
    } else {
        // The order is what the edges imply: an edge another one already implies changes
        // nothing the executor does, so plans of keyplan versions that draw such an edge or not
        // (the ordering passes) are the same plan.
        let a = order_of(saved.steps.len(), &saved.deps);
        let b = order_of(now_steps.len(), &now.graph.deps());
        if a != b {
            out.push(
                "the order of its steps (dependencies) differs from what keyplan would plan now"
                    .to_string(),
            );
        }
    }
    // `changes` holds every key and keyslot change with all its fields (action, key, versions,
    // device, keyslot, address, reason code): comparing it without the texts covers them all.
    if let Err(e) = saved.diff() {
        out.push(e.0);
    } else if without_texts(&saved.changes) != without_texts(now_json) {
        out.push("the changes it lists differ from what keyplan would plan now".to_string());
    }
    out
}

/// Which step waits for which, directly or not: the transitive closure of `deps` over `n`
/// steps, as `(before, after)` pairs. Edges naming a step out of range are ignored.
fn order_of(n: usize, deps: &[(usize, usize)]) -> std::collections::BTreeSet<(usize, usize)> {
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in deps.iter().filter(|(a, b)| *a < n && *b < n) {
        succ[a].push(b);
    }
    let mut out = std::collections::BTreeSet::new();
    for start in 0..n {
        let mut todo = succ[start].clone();
        while let Some(x) = todo.pop() {
            if out.insert((start, x)) {
                todo.extend(succ[x].iter().copied());
            }
        }
    }
    out
}

/// `doc` (a `plan --json` document) without what may differ between two plans of the same
/// changes: the reason and note texts (they name ages), the steps (compared on their own) and
/// the keyslots the plan leaves alone (`unmanaged_keyslots`: a view of the headers, which the
/// state digest covers, not a change).
fn without_texts(doc: &serde_json::Value) -> serde_json::Value {
    match doc {
        serde_json::Value::Object(m) => serde_json::Value::Object(
            m.iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "reason" | "notes" | "steps" | "unmanaged_keyslots"
                    )
                })
                .map(|(k, v)| (k.clone(), without_texts(v)))
                .collect(),
        ),
        serde_json::Value::Array(a) => {
            serde_json::Value::Array(a.iter().map(without_texts).collect())
        }
        other => other.clone(),
    }
}

/// Why a saved plan file cannot be used. Nothing was changed in any case.
#[derive(Debug, thiserror::Error)]
pub enum SavedError {
    /// The file cannot be read or written.
    #[error("cannot {what} saved plan {}: {source}", path.display())]
    Io {
        /// `read` or `write`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a keyplan saved plan (not JSON, no `kind`, a plan file given instead).
    #[error("{} is not a keyplan saved plan ({why}); {advice}", path.display())]
    NotSaved {
        /// The file.
        path: PathBuf,
        /// What it lacks.
        why: String,
        /// What to do.
        advice: String,
    },
    /// Its `format_version` is a newer major version than this keyplan reads (or not a
    /// version at all): nothing was applied. The message says which version and that a newer
    /// keyplan reads it; making the plan again with this keyplan also works.
    #[error("{0} Or make the plan again with this keyplan (`keyplan plan -o FILE`).")]
    Newer(#[from] crate::format::NewerFormat),
    /// It has the right kind and version but does not parse as a saved plan.
    #[error("saved plan {} is damaged ({detail}); make it again with `keyplan plan -o FILE`", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        detail: String,
    },
    /// It parses, but its changes or step dependencies are inconsistent.
    #[error("saved plan {} is damaged: {damage}", path.display())]
    Inconsistent {
        /// The file.
        path: PathBuf,
        /// What is inconsistent.
        damage: Damage,
    },
    /// It cannot be serialized (does not happen for plans keyplan made).
    #[error("cannot serialize the saved plan: {0}")]
    Encode(String),
}

impl SavedError {
    /// What to do, for the variants whose message does not say it.
    pub fn help(&self) -> Option<String> {
        match self {
            SavedError::Inconsistent { .. } => {
                Some("make it again with `keyplan plan -o FILE`".into())
            }
            _ => None,
        }
    }
}

/// Writes `saved` to `path` atomically with mode 0600 (it holds no secret, but names devices
/// and keys).
///
/// Errors: the file cannot be written (message names the path); `path` is left as it was.
pub fn write(path: &Path, saved: &SavedPlan) -> Result<(), SavedError> {
    let text =
        serde_json::to_string_pretty(saved).map_err(|e| SavedError::Encode(e.to_string()))?;
    // Notes in `changes` may quote a KMS.
    let mut text = crate::secret::redact::redact_json(&text).into_owned();
    text.push('\n');
    crate::fsutil::write_atomic(path, text.as_bytes(), 0o600).map_err(|source| SavedError::Io {
        what: "write",
        path: path.to_path_buf(),
        source,
    })
}

/// Reads and checks a saved plan file.
///
/// Errors (messages name the file and what to do): unreadable, not JSON, not a keyplan saved
/// plan (`kind`), or a `format_version` whose major version is not 1, or damaged content.
pub fn read(path: &Path) -> Result<SavedPlan, SavedError> {
    let bytes = std::fs::read(path).map_err(|source| SavedError::Io {
        what: "read",
        path: path.to_path_buf(),
        source,
    })?;
    let not_saved = |why: String, advice: String| SavedError::NotSaved {
        path: path.to_path_buf(),
        why,
        advice,
    };
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        // A plan file given where a saved plan belongs gets the `-f` hint; a saved plan cut
        // short (or otherwise not JSON) does not.
        if crate::spec::Format::from_path(path).is_some() {
            not_saved(
                format!("not JSON: {e}"),
                format!(
                    "make one with `keyplan plan -o FILE`, or, to apply a plan file, use `keyplan apply -f {}`",
                    path.display()
                ),
            )
        } else {
            not_saved(
                format!("not JSON: {e}"),
                "if it was one, it is damaged: make it again with `keyplan plan -o FILE`".into(),
            )
        }
    })?;
    if v.get("kind").and_then(|k| k.as_str()) != Some(KIND) {
        return Err(not_saved(
            format!("no \"kind\": \"{KIND}\""),
            "make one with `keyplan plan -o FILE`".into(),
        ));
    }
    let Some(fv) = v.get("format_version").and_then(|k| k.as_str()) else {
        return Err(SavedError::Damaged {
            path: path.to_path_buf(),
            detail: "no \"format_version\"".to_string(),
        });
    };
    crate::format::check_major(
        crate::format::published::SAVED_PLAN,
        format!("saved plan {}", path.display()),
        fv,
        crate::format::published::SAVED_PLAN_MAJOR,
    )?;
    serde_json::from_value(v).map_err(|e| SavedError::Damaged {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest() -> StateDigest {
        let mut d = StateDigest {
            digest: "all".into(),
            plan_file: "p".into(),
            ..Default::default()
        };
        d.devices.insert("a".into(), "da".into());
        d.keyslots.insert(
            "a".into(),
            [(0, "s0".to_string()), (1, "s1".to_string())].into(),
        );
        d.keys.insert("k".into(), "dk".into());
        d.journal = JournalMark {
            last_run: Some("1-1".into()),
            outcome: Some("success".into()),
        };
        d
    }

    #[test]
    fn an_implied_edge_is_the_same_order() {
        assert_eq!(
            order_of(3, &[(0, 1), (1, 2)]),
            order_of(3, &[(0, 1), (1, 2), (0, 2)])
        );
        assert_ne!(order_of(3, &[(0, 1), (1, 2)]), order_of(3, &[(0, 1)]));
        assert_ne!(order_of(3, &[(0, 1)]), order_of(3, &[(1, 0)]));
        assert_eq!(order_of(2, &[(0, 1), (0, 7)]), order_of(2, &[(0, 1)]));
    }

    #[test]
    fn nothing_changed_says_nothing() {
        assert!(changes_since(&digest(), &digest()).is_empty());
    }

    #[test]
    fn each_component_is_named() {
        let saved = digest();
        let mut now = digest();
        now.digest = "other".into();
        now.plan_file = "p2".into();
        now.devices.insert("a".into(), "da2".into());
        now.keyslots.insert(
            "a".into(),
            [(1, "s1b".to_string()), (2, "s2".to_string())].into(),
        );
        now.keys.insert("k".into(), "dk2".into());
        now.journal.last_run = Some("2-2".into());
        now.journal.outcome = None;
        assert_eq!(
            changes_since(&saved, &now),
            vec![
                "the plan file changed".to_string(),
                "device a: keyslot 2 added, keyslot 0 removed, keyslot 1 changed".to_string(),
                "key k: KMS versions changed".to_string(),
                "the journal records a later run (2-2) that did not finish".to_string(),
            ]
        );
    }

    #[test]
    fn header_change_outside_keyslots_is_named() {
        let saved = digest();
        let mut now = digest();
        now.digest = "other".into();
        now.devices.insert("a".into(), "da2".into());
        assert_eq!(
            changes_since(&saved, &now),
            vec!["device a: LUKS header metadata changed".to_string()]
        );
    }
}
