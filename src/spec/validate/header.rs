//! The plan's header: `version` and `state_dir`.

use std::path::PathBuf;

use super::paths::resolve;
use super::{empty_issue, p, Ctx, Issue};
use crate::spec::model::PlanFile;

/// Checks `version` and `state_dir` and returns the state directory: `state_dir` resolved
/// against the plan's directory, or `.keyplan` beside the plan file when it is absent or empty.
///
/// Issues, in this order: `keyplan::plan::version` (a version other than 1),
/// `keyplan::plan::empty` (`state_dir` blank), `keyplan::plan::state_dir` (the state directory,
/// written or defaulted, exists but is not a directory).
pub(super) fn check_header(file: &PlanFile, cx: &mut Ctx) -> PathBuf {
    if file.version != 1 {
        cx.push(Issue {
            path: p(&["version"]),
            code: "keyplan::plan::version",
            message: format!("unsupported plan format version {}", file.version),
            label: "only version 1 is supported".to_owned(),
            help: "this keyplan reads plan format version 1".to_owned(),
            also: Vec::new(),
        });
    }
    let state_dir = match &file.state_dir {
        Some(s) if s.trim().is_empty() => {
            cx.push(empty_issue(
                p(&["state_dir"]),
                "state_dir",
                "remove `state_dir` to use `.keyplan` beside the plan file, or name a directory",
            ));
            cx.base.join(".keyplan")
        }
        Some(s) => resolve(cx.base, s),
        None => cx.base.join(".keyplan"),
    };
    check_state_dir_kind(&state_dir, file.state_dir.is_some(), cx);
    state_dir
}

/// `keyplan::plan::state_dir` when `state_dir` exists but is not a directory; `written` says
/// whether the plan names it (the message explains the default otherwise). A missing directory
/// is fine: it is created when needed.
fn check_state_dir_kind(state_dir: &std::path::Path, written: bool, cx: &mut Ctx) {
    let Ok(m) = std::fs::metadata(state_dir) else {
        return;
    };
    if m.is_dir() {
        return;
    }
    cx.push(Issue {
        path: p(&["state_dir"]),
        code: "keyplan::plan::state_dir",
        message: format!(
            "the state directory {} exists but is not a directory{}",
            state_dir.display(),
            if written { "" } else { " (`state_dir` defaults to `.keyplan` beside the plan file)" }
        ),
        label: "not a directory".to_owned(),
        help: format!(
            "move the file {} out of the way, or set `state_dir` to a directory (it is created when missing)",
            state_dir.display()
        ),
        also: Vec::new(),
    });
}
