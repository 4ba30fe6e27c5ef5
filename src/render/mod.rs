//! Output for people and programs: the plan (terraform-like text and the versioned
//! `plan --json` document) here; the `status` report in [`status`]; runs, the journal and
//! `verify` in [`run`]. The engine computes; this module only formats.

pub mod run;
pub mod status;

use std::fmt::Write as _;

use crate::diff::json::{key_address, slot_address};
use crate::diff::{Diff, HolderAction, KeyAction, KeyChange, SlotAction, SlotChange};
use crate::spec::Plan;

/// The line printed when nothing would change.
pub const NO_CHANGES: &str = "No changes. Devices and KMS match the plan.";

/// [`plan_text`], coloured with ANSI escapes when `color`: `+` lines green, `-` red, `~` yellow,
/// `>` (a move to another KMS) cyan, the `Plan:` summary and "No changes." bold. The caller
/// decides `color` (`--color`, NO_COLOR, whether stdout is a terminal: see
/// `ColorChoice::enabled` in the CLI).
pub fn plan_text_styled(plan: &Plan, diff: &Diff, color: bool) -> String {
    let text = plan_text(plan, diff);
    if color {
        colorize(&text)
    } else {
        text
    }
}

/// Colours the lines of a rendered plan by their leading sign (see [`plan_text_styled`]).
fn colorize(text: &str) -> String {
    use anstyle::{AnsiColor, Style};
    let mut out = String::with_capacity(text.len() + 64);
    for line in text.split_inclusive('\n') {
        let body = line.strip_suffix('\n').unwrap_or(line);
        let trimmed = body.trim_start();
        let style = if trimmed.starts_with("+ ") {
            Some(Style::new().fg_color(Some(AnsiColor::Green.into())))
        } else if trimmed.starts_with("- ") || body.starts_with("! ") {
            Some(Style::new().fg_color(Some(AnsiColor::Red.into())))
        } else if trimmed.starts_with("~ ") {
            Some(Style::new().fg_color(Some(AnsiColor::Yellow.into())))
        } else if trimmed.starts_with("> ") {
            Some(Style::new().fg_color(Some(AnsiColor::Cyan.into())))
        } else if body.starts_with("Plan:") || body == NO_CHANGES {
            Some(Style::new().bold())
        } else {
            None
        };
        match style {
            Some(st) => {
                let _ = write!(out, "{st}{body}{st:#}");
                if line.ends_with('\n') {
                    out.push('\n');
                }
            }
            None => out.push_str(line),
        }
    }
    out
}

/// Renders `diff` as text: one block per key with a KMS change, one block per device, then the
/// summary line `Plan: N to add, M to remove, K keys to rotate.`
pub fn plan_text(plan: &Plan, diff: &Diff) -> String {
    let mut out = String::new();
    unavailable_lines(&mut out, diff);
    if diff.is_empty() {
        unmanaged_lines(&mut out, plan, diff);
        for n in &diff.notes {
            let _ = writeln!(out, "Note: {n}\n");
        }
        for w in &diff.waiting {
            let _ = writeln!(out, "Note: {}\n", w.describe());
        }
        if diff.unavailable.is_empty() {
            out.push_str(NO_CHANGES);
        } else {
            out.push_str("No changes on the devices that could be read.");
        }
        out.push('\n');
        return out;
    }
    let _ = writeln!(out, "keyplan will perform the following actions:\n");
    for k in &diff.keys {
        key_block(&mut out, plan, k);
    }
    holder_lines(&mut out, plan, diff);
    device_blocks(&mut out, plan, &diff.slots);
    unmanaged_lines(&mut out, plan, diff);
    for n in &diff.notes {
        let _ = writeln!(out, "Note: {n}");
    }
    for w in &diff.waiting {
        let _ = writeln!(out, "Note: {}", w.describe());
    }
    if !diff.notes.is_empty() || !diff.waiting.is_empty() {
        out.push('\n');
    }
    let migrations = diff
        .keys
        .iter()
        .filter(|k| k.action == KeyAction::Migrate)
        .count();
    let adoptions = diff.adoptions();
    let renames = diff.renames();
    let _ = writeln!(
        out,
        "Plan: {} to add, {} to remove, {} keys to rotate{}{}{}{}{}{}.",
        diff.adds(),
        diff.removes(),
        diff.rotations(),
        if migrations > 0 {
            format!(", {migrations} to move to another KMS")
        } else {
            String::new()
        },
        match diff.kept_destroys() {
            0 => String::new(),
            n => format!(
                ", {n} kept cop{} to destroy in the KMS a key left",
                if n == 1 { "y" } else { "ies" }
            ),
        },
        if adoptions > 0 {
            format!(", {adoptions} to adopt")
        } else {
            String::new()
        },
        match renames {
            0 => String::new(),
            1 => ", 1 record to rename".to_string(),
            n => format!(", {n} records to rename"),
        },
        match diff.holders.len() {
            0 => String::new(),
            1 => ", 1 holder record".to_string(),
            n => format!(", {n} holder records"),
        },
        match diff.waiting.len() {
            0 => String::new(),
            n => format!(", {n} commit(s) waiting for other nodes"),
        }
    );
    out
}

/// The keyslots keyplan does not manage and leaves as they are, and tokens of other tools, one
/// line per device under `Keyslots keyplan does not manage (left as they are):`, then a blank
/// line; nothing when there are none. Those this plan removes or adopts are changes, listed in
/// the device blocks.
fn unmanaged_lines(out: &mut String, plan: &Plan, diff: &Diff) {
    let lines: Vec<String> = diff
        .unmanaged
        .iter()
        .filter_map(|d| {
            let what = d.describe_kept()?;
            let path = plan
                .devices
                .get(&d.device)
                .map(|x| format!(" ({})", x.path.display()))
                .unwrap_or_default();
            Some(format!("  {}{path}: {what}", d.device))
        })
        .collect();
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(out, "Keyslots keyplan does not manage (left as they are):");
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    out.push('\n');
}

/// One block per device of the plan that cannot be used now (`! device ...`), first: the
/// rest of the plan goes around it.
fn unavailable_lines(out: &mut String, diff: &Diff) {
    for (id, u) in &diff.unavailable {
        let at = u.at.as_ref().map(|a| format!(", {a}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "! device {id} ({}{at}) cannot be used, so nothing is planned on it: {}\n    {}\n",
            u.path.display(),
            u.why,
            u.help
        );
    }
}

/// One line per holder record change (`~ key k1: record this plan as a holder ...`).
fn holder_lines(out: &mut String, plan: &Plan, diff: &Diff) {
    for h in &diff.holders {
        let name = plan
            .keys
            .get(&h.key)
            .map(|k| format!(" {:?}", k.name))
            .unwrap_or_default();
        let what = match h.action {
            HolderAction::Record => format!(
                "record this plan ({}) as a holder of the key in KMS {}{name} (its devices hold it; another plan's rotation of it is then refused, a rotation on the key's other nodes waits for this one's)",
                h.holder, h.kms
            ),
            HolderAction::Release => format!(
                "remove this plan's holder record ({}) from KMS {}{name} (no device of the plan holds it any more)",
                h.holder, h.kms
            ),
            HolderAction::Vote => format!(
                "record in KMS {}{name} that this plan's devices hold and open with the new version ({}); the commit waits for every holder's vote",
                h.kms, h.holder
            ),
            HolderAction::ReleaseFormer => format!(
                "remove {} from KMS {}{name}: it is this plan's own record from before its state directory moved ({}); this plan's record ({}) replaces it",
                h.holder,
                h.kms,
                h.reason.as_deref().unwrap_or("recognised"),
                plan.holder()
            ),
            HolderAction::Withdraw => format!(
                "withdraw this plan's vote ({}) from KMS {}{name} (its version is no longer pending, or a device lost it)",
                h.holder, h.kms
            ),
        };
        let _ = writeln!(out, "  ~ key {}: {what}\n", h.key);
    }
}

/// The line of a kept copy's destroy ([`KeyAction::DestroyKept`]): `- key k in KMS old (v1,
/// v2)` and the reason.
fn kept_destroy_line(out: &mut String, k: &KeyChange) {
    let versions: Vec<String> = k.retire.iter().map(|v| format!("v{v}")).collect();
    let _ = writeln!(
        out,
        "{:<44} ({})",
        format!(
            "  - key {} in KMS {}{}",
            k.key,
            k.kms,
            if versions.is_empty() {
                String::new()
            } else {
                format!(" ({})", versions.join(", "))
            }
        ),
        k.reason
    );
}

/// The block of one key change: the new version, the one kept as previous (or the KMS it
/// leaves), the versions destroyed.
fn key_block(out: &mut String, plan: &Plan, k: &KeyChange) {
    let kms = plan
        .kms
        .get(&k.kms)
        .map(|c| format!("{} KMS {:?}", c.provider(), k.kms))
        .unwrap_or_else(|| k.kms.clone());
    let _ = writeln!(out, "  # key {} ({kms})", k.key);
    if k.action == KeyAction::DestroyKept {
        kept_destroy_line(out, k);
        return;
    }
    let line = match (k.action, k.from) {
        (KeyAction::Migrate, from) => format!(
            "  > key {} v{} from KMS {}{}",
            k.key,
            k.to,
            k.from_kms.as_deref().unwrap_or("?"),
            from.filter(|f| *f != k.to)
                .map(|f| format!(" (there v{f})"))
                .unwrap_or_default()
        ),
        (KeyAction::Create, _) | (_, None) => format!("  + key {} v{}", k.key, k.to),
        (_, Some(from)) => format!("  ~ key {} v{from} -> v{}", k.key, k.to),
    };
    let _ = writeln!(out, "{line:<44} ({})", k.reason);
    if k.action == KeyAction::Migrate && k.kept_in_origin.is_empty() {
        let _ = writeln!(
            out,
            "{:<44} (copied, read back, verified on every device, then destroyed there)",
            format!(
                "  - key {} in KMS {}",
                k.key,
                k.from_kms.as_deref().unwrap_or("?")
            )
        );
    } else if k.action == KeyAction::Migrate {
        let _ = writeln!(
            out,
            "{:<44} (copied, read back, verified on every device; kept there: other devices hold v{}, see the note)",
            format!(
                "    key {} in KMS {}",
                k.key,
                k.from_kms.as_deref().unwrap_or("?")
            ),
            k.kept_in_origin
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", v")
        );
    } else if let Some(from) = k.from {
        let _ = writeln!(
            out,
            "{:<44} (kept as the previous version)",
            format!("    key {} v{from}", k.key)
        );
    }
    for v in &k.retire {
        let _ = writeln!(
            out,
            "{:<44} (destroyed at the end: older than the previous version; no other device holds it)",
            format!("  - key {} v{v}", k.key)
        );
        let checks: Vec<String> = k
            .copy_checks
            .iter()
            .filter(|c| c.version == *v)
            .map(|c| format!("{} keyslot {}", c.device, c.slot))
            .collect();
        if !checks.is_empty() {
            let _ = writeln!(
                out,
                "      first tested for copies of it: {} ({} PBKDF run{}; a keyslot that opens is reported, not removed)",
                checks.join(", "),
                checks.len(),
                if checks.len() == 1 { "" } else { "s" }
            );
        }
    }
    let before_vote: Vec<String> = k
        .copy_checks
        .iter()
        .filter(|c| !k.retire.contains(&c.version))
        .map(|c| format!("{} keyslot {} (v{})", c.device, c.slot, c.version))
        .collect();
    if !before_vote.is_empty() {
        let _ = writeln!(
            out,
            "      before this node votes, tested for copies of versions the commit may retire: {} ({} PBKDF run{}; a keyslot that opens is reported, not removed)",
            before_vote.join(", "),
            before_vote.len(),
            if before_vote.len() == 1 { "" } else { "s" }
        );
    }
    out.push('\n');
}

/// One block per device: its keyslot changes, `+` added, `-` removed, `~` record corrected.
fn device_blocks(out: &mut String, plan: &Plan, slots: &[SlotChange]) {
    let mut current: Option<&str> = None;
    for s in slots {
        if current != Some(s.device.as_str()) {
            if current.is_some() {
                out.push('\n');
            }
            current = Some(s.device.as_str());
            let path = plan
                .devices
                .get(&s.device)
                .map(|d| d.path.display().to_string())
                .unwrap_or_default();
            let _ = writeln!(out, "  # device {} ({path})", s.device);
        }
        let sign = match s.action {
            SlotAction::Add => '+',
            SlotAction::Remove => '-',
            SlotAction::Drift => '~',
            SlotAction::Adopt => '=',
        };
        let what = match (&s.key, s.version) {
            (Some(k), Some(v)) => format!("{k} v{v}"),
            (Some(k), None) => k.clone(),
            (None, _) => "unmanaged".to_string(),
        };
        let line = format!("  {sign} keyslot {:<2} {what}", s.slot);
        let _ = writeln!(out, "{line:<44} ({})", s.reason);
    }
    if current.is_some() {
        out.push('\n');
    }
}

/// Renders a saved plan's changes when its plan file cannot be loaded (no device paths or KMS
/// providers to show): one line per key and keyslot change with its address and reason, then
/// the summary line of [`plan_text`].
pub fn saved_text(diff: &Diff) -> String {
    if diff.is_empty() {
        return format!("{NO_CHANGES}\n");
    }
    let mut out = String::new();
    for k in &diff.keys {
        let from = k.from.map(|f| format!("v{f} -> ")).unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:?} {} {from}v{}  ({})",
            k.action,
            key_address(&k.key),
            k.to,
            k.reason
        );
    }
    for c in &diff.slots {
        let what = match (&c.key, c.version) {
            (Some(k), Some(v)) => format!(" {k} v{v}"),
            (Some(k), None) => format!(" {k}"),
            (None, _) => " unmanaged".to_string(),
        };
        let _ = writeln!(
            out,
            "  {:?} {}{what}  ({})",
            c.action,
            slot_address(&c.device, c.slot),
            c.reason
        );
    }
    for h in &diff.holders {
        let _ = writeln!(
            out,
            "  {:?} holder {} of {}",
            h.action,
            h.holder,
            key_address(&h.key)
        );
    }
    for n in &diff.notes {
        let _ = writeln!(out, "Note: {n}");
    }
    let _ = writeln!(
        out,
        "\nPlan: {} to add, {} to remove, {} keys to rotate.",
        diff.adds(),
        diff.removes(),
        diff.rotations()
    );
    out
}

/// A JSON document that serializes with its `format_version` member first (then the other
/// members in key order), so that readers and people see the version before anything else
/// (docs/commands.md: the document starts with `format_version`). Nested values are unchanged.
pub struct VersionFirst<'a>(pub &'a serde_json::Value);

impl serde::Serialize for VersionFirst<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let Some(obj) = self.0.as_object() else {
            return self.0.serialize(s);
        };
        let mut map = s.serialize_map(Some(obj.len()))?;
        if let Some(v) = obj.get("format_version") {
            map.serialize_entry("format_version", v)?;
        }
        for (k, v) in obj.iter().filter(|(k, _)| *k != "format_version") {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// `doc` as pretty-printed JSON text with `format_version` first (see [`VersionFirst`]).
///
/// Errors: serialization failed (does not happen for a `serde_json::Value`).
pub fn json_text(doc: &serde_json::Value) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(&VersionFirst(doc))
}
