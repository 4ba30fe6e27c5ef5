//! Copies a migration kept: `<state_dir>/kept.json`, the KMS entries a key moved away from
//! that still hold versions devices outside the move needed (docs/architecture.md, "Migration
//! is planned from the records").
//!
//! A move keeps the key in the KMS it leaves while a device outside the move (one that left
//! the plan, or one keyplan knows that cannot be read) may hold a version of it there. Once
//! every device of the plan is re-recorded, no record of the plan names that entry any more,
//! and once the departed device is forgotten no record anywhere does: this file is what
//! remembers it, so that a later `plan` destroys it when no device keyplan knows holds it.
//! `apply` writes an entry before the first step of the move that keeps the copy, and drops
//! it once the copy is destroyed (or the plan puts the key back in that entry). Nothing secret
//! is stored.

use std::path::{Path, PathBuf};

use crate::format::state::files::{KeptCopyV1, KeptV1};
use crate::format::state::ReadError;
use crate::format::NewerFormat;
use crate::fsutil;

/// File name of the kept-copies record in the state directory.
pub const KEPT_FILE: &str = "kept.json";

/// The format version this keyplan writes and reads.
pub const KEPT_FORMAT: u32 = 1;

/// One KMS entry a migration left in place for devices outside the move. (Its serde shape is
/// that of `observe::Kept` in node reports; the file's is
/// [`crate::format::state::files::KeptCopyV1`].)
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeptCopy {
    /// Key id (in the plan when the copy was kept).
    pub key: String,
    /// The KMS instance the key moved from.
    pub kms: String,
    /// The key's name in that KMS.
    pub name: String,
    /// The versions kept there for devices outside the move, ascending.
    pub versions: Vec<u64>,
    /// When the copy was first kept, Unix seconds.
    pub since: u64,
}

impl KeptCopy {
    /// Whether this is the entry `(key, kms, name)`.
    pub fn is(&self, key: &str, kms: &str, name: &str) -> bool {
        self.key == key && self.kms == kms && self.name == name
    }
}

impl From<KeptCopyV1> for KeptCopy {
    fn from(c: KeptCopyV1) -> KeptCopy {
        KeptCopy {
            key: c.key,
            kms: c.kms,
            name: c.name,
            versions: c.versions,
            since: c.since,
        }
    }
}

impl From<&KeptCopy> for KeptCopyV1 {
    fn from(c: &KeptCopy) -> KeptCopyV1 {
        KeptCopyV1 {
            key: c.key.clone(),
            kms: c.kms.clone(),
            name: c.name.clone(),
            versions: c.versions.clone(),
            since: c.since,
        }
    }
}

/// Errors reading or writing the kept-copies record.
#[derive(Debug, thiserror::Error)]
pub enum KeptError {
    /// The file was written by a newer keyplan: refused, nothing written.
    #[error(transparent)]
    Newer(#[from] NewerFormat),
    /// The file cannot be parsed; keyplan never
    /// guesses at it: a lost entry would leave a key's old copy in its KMS for good.
    #[error("{} is corrupt ({detail}); keyplan will not guess which old KMS entries it kept, and changed nothing. Restore it from a backup, or fix it by hand: {{\"format\":1,\"copies\":[{{\"key\":\"<key id>\",\"kms\":\"<KMS instance>\",\"name\":\"<name there>\",\"versions\":[1],\"since\":0}}]}} (an empty list forgets every kept copy: each must then be removed from its KMS by hand)", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The file could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// `reading` or `writing`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Every kept copy recorded in `state_dir` (none when there is no file).
///
/// Errors: [`KeptError::Newer`] (a newer keyplan's file), [`KeptError::Corrupt`] (not JSON
/// of format 1), [`KeptError::Io`].
pub fn read(state_dir: &Path) -> Result<Vec<KeptCopy>, KeptError> {
    let path = state_dir.join(KEPT_FILE);
    let bytes = match crate::format::state::read_file(&path) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(Vec::new()),
        Err(source) => {
            return Err(KeptError::Io {
                what: "reading",
                path,
                source,
            })
        }
    };
    match crate::format::state::files::read_kept(&path.display().to_string(), &bytes) {
        Ok(f) => Ok(f.copies.into_iter().map(KeptCopy::from).collect()),
        Err(ReadError::Newer(n)) => Err(KeptError::Newer(n)),
        Err(ReadError::Corrupt(detail)) => Err(KeptError::Corrupt { path, detail }),
    }
}

/// Records `add` (an entry already there keeps its `since` and gains the versions) and drops
/// the entries `drop` says to, atomically (mode 0600). Writes nothing when nothing changes,
/// so a plan without kept copies leaves no file.
///
/// Errors: [`KeptError`]; on any, the file is as it was.
pub fn update(
    state_dir: &Path,
    add: &[KeptCopy],
    drop: &dyn Fn(&KeptCopy) -> bool,
) -> Result<(), KeptError> {
    let before = read(state_dir)?;
    let mut copies = before.clone();
    copies.retain(|c| !drop(c));
    for a in add {
        match copies.iter_mut().find(|c| c.is(&a.key, &a.kms, &a.name)) {
            Some(c) => {
                c.versions.extend(&a.versions);
                c.versions.sort_unstable();
                c.versions.dedup();
            }
            None => {
                let mut a = a.clone();
                a.versions.sort_unstable();
                a.versions.dedup();
                copies.push(a);
            }
        }
    }
    if copies == before {
        return Ok(());
    }
    let file = KeptV1 {
        format: u64::from(KEPT_FORMAT),
        copies: copies.iter().map(KeptCopyV1::from).collect(),
    };
    fsutil::write_json_private(state_dir, KEPT_FILE, &file).map_err(|source| KeptError::Io {
        what: "writing",
        path: state_dir.join(KEPT_FILE),
        source,
    })
}

/// Whether the plan puts a key, this one or another, in the entry `copy` names: then it is a
/// live key, never to be destroyed, and the kept copy is forgotten instead.
pub fn is_live(plan: &crate::spec::Plan, copy: &KeptCopy) -> bool {
    plan.keys
        .values()
        .any(|k| k.kms == copy.kms && k.name == copy.name)
}

/// Drops the entry `(key, kms, name)` (its copy was destroyed); idempotent.
///
/// Errors: [`KeptError`].
pub fn forget(state_dir: &Path, key: &str, kms: &str, name: &str) -> Result<(), KeptError> {
    update(state_dir, &[], &|c| c.is(key, kms, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Format 1 as written: frozen. A change here breaks every state directory that holds a
    /// kept copy; add a format instead.
    const FORMAT_1: &str = r#"{
  "format": 1,
  "copies": [
    {
      "key": "k",
      "kms": "old",
      "name": "k-name",
      "versions": [
        1,
        2
      ],
      "since": 1765000000
    }
  ]
}
"#;

    fn copy(versions: &[u64], since: u64) -> KeptCopy {
        KeptCopy {
            key: "k".into(),
            kms: "old".into(),
            name: "k-name".into(),
            versions: versions.to_vec(),
            since,
        }
    }

    #[test]
    fn format_1_is_frozen() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(KEPT_FILE), FORMAT_1).expect("write fixture");
        assert_eq!(read(dir.path()).expect("read"), [copy(&[1, 2], 1765000000)]);
        std::fs::remove_file(dir.path().join(KEPT_FILE)).expect("rm");
        update(dir.path(), &[copy(&[2, 1], 1765000000)], &|_| false).expect("update");
        let written = std::fs::read_to_string(dir.path().join(KEPT_FILE)).expect("written");
        assert_eq!(written, FORMAT_1);
    }

    #[test]
    fn entries_merge_keep_their_time_and_are_forgotten() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(read(dir.path()).expect("no file"), []);
        update(dir.path(), &[], &|_| true).expect("nothing");
        assert!(!dir.path().join(KEPT_FILE).exists(), "no file for nothing");
        update(dir.path(), &[copy(&[1], 10)], &|_| false).expect("first");
        update(dir.path(), &[copy(&[2], 20)], &|_| false).expect("again");
        assert_eq!(read(dir.path()).expect("read"), [copy(&[1, 2], 10)]);
        forget(dir.path(), "k", "old", "other").expect("another entry");
        assert_eq!(read(dir.path()).expect("read").len(), 1);
        forget(dir.path(), "k", "old", "k-name").expect("forget");
        forget(dir.path(), "k", "old", "k-name").expect("idempotent");
        assert_eq!(read(dir.path()).expect("read"), []);
    }

    #[test]
    fn a_corrupt_or_unknown_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cases = [
            ("{not json", "kept.json is corrupt"),
            (
                r#"{"format":2,"copies":[]}"#,
                "kept.json is kept-json format 2, written by a newer keyplan",
            ),
        ];
        for (text, expect) in cases {
            std::fs::write(dir.path().join(KEPT_FILE), text).expect("write");
            let e = read(dir.path()).expect_err("corrupt").to_string();
            assert!(e.contains(expect), "{e}");
            assert!(
                e.contains("changed nothing") || e.contains("Nothing was changed"),
                "{e}"
            );
            assert!(update(dir.path(), &[copy(&[1], 1)], &|_| false).is_err());
            assert_eq!(
                std::fs::read_to_string(dir.path().join(KEPT_FILE)).expect("kept"),
                text,
                "left as it was"
            );
        }
    }
}
