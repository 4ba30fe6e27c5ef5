//! Human output: terraform-like plan rendering.

use std::fmt::Write as _;

use crate::diff::{Diff, KeyAction, SlotAction};
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
        } else if trimmed.starts_with("- ") {
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
    if diff.is_empty() {
        let mut out = String::new();
        for n in &diff.notes {
            let _ = writeln!(out, "Note: {n}\n");
        }
        out.push_str(NO_CHANGES);
        out.push('\n');
        return out;
    }
    let mut out = String::new();
    let _ = writeln!(out, "keyplan will perform the following actions:\n");
    for k in &diff.keys {
        let kms = plan
            .kms
            .get(&k.kms)
            .map(|c| format!("{} KMS {:?}", c.provider(), k.kms))
            .unwrap_or_else(|| k.kms.clone());
        let _ = writeln!(out, "  # key {} ({kms})", k.key);
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
        if k.action == KeyAction::Migrate {
            let _ = writeln!(
                out,
                "{:<44} (copied, read back, verified on every device, then destroyed there)",
                format!(
                    "  - key {} in KMS {}",
                    k.key,
                    k.from_kms.as_deref().unwrap_or("?")
                )
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
        }
        out.push('\n');
    }
    let mut current: Option<&str> = None;
    for s in &diff.slots {
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
    for n in &diff.notes {
        let _ = writeln!(out, "Note: {n}");
    }
    if !diff.notes.is_empty() {
        out.push('\n');
    }
    let migrations = diff
        .keys
        .iter()
        .filter(|k| k.action == KeyAction::Migrate)
        .count();
    let _ = writeln!(
        out,
        "Plan: {} to add, {} to remove, {} keys to rotate{}.",
        diff.adds(),
        diff.removes(),
        diff.rotations(),
        if migrations > 0 {
            format!(", {migrations} to move to another KMS")
        } else {
            String::new()
        }
    );
    out
}

/// The plan as a JSON document (`format_version` "1.0"): keys and keyslot changes, no secrets.
pub fn plan_json(diff: &Diff) -> serde_json::Value {
    serde_json::json!({
        "format_version": "1.0",
        "changes_present": !diff.is_empty(),
        "summary": {
            "add": diff.adds(),
            "remove": diff.removes(),
            "rotate": diff.rotations(),
            "migrate": diff.keys.iter().filter(|k| k.action == KeyAction::Migrate).count(),
        },
        "keys": diff.keys,
        "keyslots": diff.slots,
        "notes": diff.notes,
        "steps": diff.graph.steps(),
    })
}
