//! Every document keyplan stores or publishes, as its own versioned data type (docs/formats.md).
//!
//! The engine's types ([`crate::graph::Step`], [`crate::observe`]'s `Observed`, ...) may change
//! freely; what is written to disk, to a KMS, to a LUKS2 token, to Kubernetes or to stdout for
//! programs is converted to and from the types in this module, which change only on purpose:
//! a new version, with a reader for the old one, frozen by the fixtures under
//! `tests/fixtures/formats/` (read back by the current keyplan, and today's version written
//! byte for byte).
//!
//! A keyplan that meets a version newer than it reads refuses with [`NewerFormat`] and writes
//! nothing, so a downgrade never corrupts state.
//!
//! The submodules, by where the documents live: [`journal`] (the journal, its checkpoint, the
//! audit trail), [`state`] (the rest of the state directory and keyplan's LUKS2 token and LUKS1
//! records), [`kms`] (what keyplan keeps in each KMS, the exec protocol), [`published`] (saved
//! plans, JSON output, node reports and the other Kubernetes objects agents read). [`all`]
//! lists every format with the version this keyplan writes and the versions it reads
//! (`keyplan version --json`).

pub mod journal;
pub mod kms;
pub mod published;
pub mod state;

/// One stored or published format: what `keyplan version` lists and docs/formats.md describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Format {
    /// Short stable name, e.g. `journal`, `luks2-token`, `plan-json`.
    pub name: &'static str,
    /// The version this keyplan writes, e.g. `2` or `1.4` (`major.minor` for JSON documents
    /// whose readers accept any minor version of a major one).
    pub writes: &'static str,
    /// The versions this keyplan reads, e.g. `1-2` or `1.x`.
    pub reads: &'static str,
    /// Where the document lives, e.g. `<state_dir>/journal.jsonl`.
    pub home: &'static str,
}

/// Every format, in the order of docs/formats.md.
pub fn all() -> Vec<&'static Format> {
    journal::FORMATS
        .iter()
        .chain(state::FORMATS)
        .chain(kms::FORMATS)
        .chain(published::FORMATS)
        .collect()
}

/// A document was written in a version of its format newer than this keyplan reads: it was
/// written by a newer keyplan (a downgrade, or an older agent in a fleet that is half
/// upgraded). The reader refuses it and writes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{document} is {format} format {found}, written by a newer keyplan; this keyplan ({}) reads {format} formats up to {newest}. Nothing was changed or written. Run a keyplan that reads {format} format {found} (CHANGELOG.md says which release introduced it), or finish the work with the keyplan that wrote it.",
    env!("CARGO_PKG_VERSION")
)]
pub struct NewerFormat {
    /// What was read: a path, `device <id> keyslot <n>`, `KMS <instance> key <name>`, ...
    pub document: String,
    /// The format's [`Format::name`].
    pub format: &'static str,
    /// The version found in the document.
    pub found: String,
    /// The newest version this keyplan reads.
    pub newest: String,
}

/// Checks an integer format version: `Ok` when `found <= newest`, else [`NewerFormat`] naming
/// `document`.
pub fn check_version(
    format: &Format,
    document: impl Into<String>,
    found: u64,
    newest: u64,
) -> Result<(), NewerFormat> {
    if found <= newest {
        return Ok(());
    }
    Err(NewerFormat {
        document: document.into(),
        format: format.name,
        found: found.to_string(),
        newest: newest.to_string(),
    })
}

/// Checks a `major.minor` format version (JSON documents: a reader accepts every minor version
/// of the majors it knows, ignoring the fields it does not know): `Ok` when the major number of
/// `found` is at most `newest_major`. A version that is not `major` or `major.minor` counts as
/// newer (it cannot have been written by a keyplan this one knows).
pub fn check_major(
    format: &Format,
    document: impl Into<String>,
    found: &str,
    newest_major: u64,
) -> Result<(), NewerFormat> {
    let major = found
        .split_once('.')
        .map_or(found, |(major, _)| major)
        .parse::<u64>()
        .ok();
    match major {
        Some(major) if major <= newest_major => Ok(()),
        _ => Err(NewerFormat {
            document: document.into(),
            format: format.name,
            found: found.to_string(),
            newest: format!("{newest_major}.x"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: Format = Format {
        name: "example",
        writes: "2",
        reads: "1-2",
        home: "nowhere",
    };

    #[test]
    fn newer_versions_are_refused_with_a_message_naming_the_document() {
        assert!(check_version(&F, "x", 2, 2).is_ok());
        let err = check_version(&F, "/s/journal.jsonl line 3", 3, 2).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("/s/journal.jsonl line 3 is example format 3"),
            "{text}"
        );
        assert!(text.contains("up to 2"), "{text}");
        assert!(check_major(&F, "x", "1.9", 1).is_ok());
        assert!(check_major(&F, "x", "2.0", 1).is_err());
        assert!(check_major(&F, "x", "banana", 1).is_err());
    }

    #[test]
    fn every_format_has_a_unique_name() {
        let mut names: Vec<_> = all().iter().map(|f| f.name).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
    }
}
