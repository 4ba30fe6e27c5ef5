//! Paths in the plan: resolving them against the plan's directory, and what makes two of them
//! the same file.

use std::path::{Component, Path, PathBuf};

use super::{Ctx, Issue, PathSeg};

/// `path` made absolute against `base` (already absolute), `.` components removed; `..` and
/// symlinks kept as written.
pub(crate) fn resolve(base: &Path, path: &str) -> PathBuf {
    let joined = base.join(path);
    std::path::absolute(&joined).unwrap_or(joined)
}

/// `path` with `.` removed and `..` applied lexically (for comparing paths that do not exist).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(c);
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// What makes two device paths the same device: the canonical path when it exists.
pub(super) fn identity(abs: &Path) -> PathBuf {
    std::fs::canonicalize(abs).unwrap_or_else(|_| lexical(abs))
}

impl Ctx<'_> {
    /// `path` resolved against the plan's directory, as the `String` the KMS model holds.
    ///
    /// Issue: `keyplan::plan::path` at `at` when the resolved path is not valid UTF-8; `path`
    /// is then returned as written.
    pub(super) fn resolve_string(&mut self, path: &str, at: Vec<PathSeg>) -> String {
        let resolved = resolve(self.base, path);
        match resolved.to_str() {
            Some(s) => s.to_owned(),
            None => {
                self.push(Issue {
                    path: at,
                    code: "keyplan::plan::path",
                    message: format!(
                        "`{path}` resolved against the plan's directory is not valid UTF-8: {}",
                        resolved.display()
                    ),
                    label: "relative to the plan file".to_owned(),
                    help: "write an absolute path, or move the plan file to a directory whose path is UTF-8".to_owned(),
                    also: Vec::new(),
                });
                path.to_owned()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_paths() {
        assert_eq!(lexical(Path::new("/a/./b/../c")), PathBuf::from("/a/c"));
        assert_eq!(
            resolve(Path::new("/plans"), "./img/../x.img"),
            PathBuf::from("/plans/img/../x.img")
        );
        assert_eq!(
            resolve(Path::new("/plans"), "/dev/sda"),
            PathBuf::from("/dev/sda")
        );
    }
}
