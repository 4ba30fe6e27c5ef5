//! Where the `aws_secrets_manager` provider keeps a key (the layout of `mod.rs`'s module
//! documentation): the secret names, the staging labels and version ids of keyplan's versions,
//! keyplan's record secret ([`Meta`]), and how a key reads back ([`View`]).

use std::collections::BTreeMap;

use super::client::Listed;
use crate::format::kms::aws::Record;
use crate::kms::book::VersionBook;
use crate::kms::{KeyState, VersionInfo, VersionState};

/// Secrets Manager's label of the version readers get by default.
pub const CURRENT: &str = "AWSCURRENT";
/// Secrets Manager's label of a version being rotated in.
pub const PENDING: &str = "AWSPENDING";
/// Secrets Manager's label of the version `AWSCURRENT` was on before its last move (Secrets
/// Manager moves it itself).
pub const PREVIOUS: &str = "AWSPREVIOUS";
/// Prefix of the label naming keyplan's version number on a version (`keyplan-v3`). It also
/// keeps retained versions labelled: Secrets Manager deletes unlabelled (deprecated) versions
/// at its own pace.
pub const VERSION_LABEL: &str = "keyplan-v";
/// Suffix of the record secret's name (`<secret>.keyplan`); a key name ending with it is
/// refused (`crate::spec::aws_names`, the suffix's home).
pub const META_SUFFIX: &str = crate::spec::aws_names::RECORD_SUFFIX;
/// Label a new record version carries until it is made `AWSCURRENT`.
pub const META_NEXT: &str = "keyplan-next";

/// The version id (and `ClientRequestToken`, 32 to 64 characters) of keyplan's version
/// `version`: `keyplan-version-<20 digits>`. Deterministic, so a stage whose reply was lost
/// and is tried again writes the same version (Secrets Manager: same token and value, no-op;
/// same token, other value, refused).
pub fn token(version: u64) -> String {
    format!("keyplan-version-{version:020}")
}

/// The label of keyplan's version `version`.
pub fn version_label(version: u64) -> String {
    format!("{VERSION_LABEL}{version}")
}

fn label_number(label: &str) -> Option<u64> {
    label.strip_prefix(VERSION_LABEL)?.parse().ok()
}

/// keyplan's record of a key, the JSON value of the secret `<secret>.keyplan` (no material),
/// as the provider works on it; stored as [`Record`] (src/format/kms/aws.rs, the layout and
/// its version). Every change is a compare-and-swap: a new version, then `AWSCURRENT` moved to
/// it off the version read ([`super::AwsKms`]'s `write_meta`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Meta {
    /// The plans holding the key and their votes ([`crate::kms::KeyState::holders`]).
    pub holders: BTreeMap<String, u64>,
    /// Retired versions and their creation times (Unix seconds); their secret versions carry
    /// no label any more, or are gone.
    pub retired: BTreeMap<u64, u64>,
    /// A first version staged but not committed: Secrets Manager puts `AWSCURRENT` on a
    /// secret's first version itself, so until the commit this record says it is pending.
    pub uncommitted: Option<u64>,
    /// Fields of the record this keyplan does not know, written back as they were.
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl From<Record> for Meta {
    fn from(r: Record) -> Meta {
        Meta {
            holders: r.holders,
            retired: r.retired,
            uncommitted: r.uncommitted,
            extra: r.extra,
        }
    }
}

impl From<&Meta> for Record {
    fn from(m: &Meta) -> Record {
        Record {
            format: crate::format::kms::aws::VERSION,
            holders: m.holders.clone(),
            retired: m.retired.clone(),
            uncommitted: m.uncommitted,
            extra: m.extra.clone(),
        }
    }
}

/// One version keyplan knows: its number, version id, labels and creation time.
#[derive(Debug, Clone, PartialEq)]
pub struct Known {
    /// keyplan's version number.
    pub number: u64,
    /// Secrets Manager's version id.
    pub vid: String,
    /// Its staging labels.
    pub labels: Vec<String>,
    /// Creation time, Unix seconds.
    pub created_at: u64,
    /// `false` for a current version written by someone else (no `keyplan-v` label yet):
    /// its number is assigned at reading ([`View::of`]) and labelled by the next write.
    pub labelled: bool,
}

impl Known {
    /// Whether it carries `label`.
    pub fn has(&self, label: &str) -> bool {
        self.labels.iter().any(|l| l == label)
    }
}

/// A key as read: whether its secret exists, keyplan's versions, the record and the record's
/// version id.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// The secret exists (possibly without versions).
    pub exists: bool,
    /// keyplan's versions still labelled, by number.
    pub versions: BTreeMap<u64, Known>,
    /// The record ([`Meta::default`] when there is none).
    pub meta: Meta,
    /// The record's `AWSCURRENT` version id; `None`: no record secret yet.
    pub meta_vid: Option<String>,
    /// The ids of the versions carrying `AWSCURRENT`: one, or none for a secret without a
    /// value. Secrets Manager never has more; a server that does (moto after some
    /// `put-secret-value` sequences) leaves the current version unknowable.
    pub current_vids: Vec<String>,
}

impl View {
    /// The view of a listing (`None`: no secret) and a record. A labelled version counts;
    /// the `AWSCURRENT` version without a keyplan label (a secret keyplan adopts, or a value
    /// someone else wrote) gets the number above every known one.
    pub fn of(listing: Option<Vec<Listed>>, meta: Meta, meta_vid: Option<String>) -> View {
        let exists = listing.is_some();
        let mut versions = BTreeMap::new();
        let mut foreign_current = None;
        let mut current_vids = Vec::new();
        for l in listing.unwrap_or_default() {
            if l.labels.iter().any(|x| x == CURRENT) {
                current_vids.push(l.vid.clone());
            }
            let number = l.labels.iter().find_map(|x| label_number(x));
            match number {
                Some(n) => {
                    versions.insert(
                        n,
                        Known {
                            number: n,
                            vid: l.vid,
                            labels: l.labels,
                            created_at: l.created_at,
                            labelled: true,
                        },
                    );
                }
                None if l.labels.iter().any(|x| x == CURRENT) => foreign_current = Some(l),
                None => {}
            }
        }
        if let Some(l) = foreign_current {
            let highest = versions
                .keys()
                .copied()
                .chain(meta.retired.keys().copied())
                .chain(meta.uncommitted)
                .max()
                .unwrap_or(0);
            let n = highest + 1;
            versions.insert(
                n,
                Known {
                    number: n,
                    vid: l.vid,
                    labels: l.labels,
                    created_at: l.created_at,
                    labelled: false,
                },
            );
        }
        View {
            exists,
            versions,
            meta,
            meta_vid,
            current_vids,
        }
    }

    /// The version carrying `AWSCURRENT`, committed: not the first version of a key that is
    /// still [`Meta::uncommitted`].
    pub fn current(&self) -> Option<&Known> {
        self.versions
            .values()
            .find(|k| k.has(CURRENT))
            .filter(|k| self.meta.uncommitted != Some(k.number))
    }

    /// The pending version: the one carrying `AWSPENDING` that is not current (a version
    /// carrying both is a commit whose clean-up was cut short), or the uncommitted first one.
    pub fn pending(&self) -> Option<&Known> {
        let current = self.current().map(|k| k.number);
        let uncommitted = self.meta.uncommitted;
        self.versions
            .values()
            .filter(|k| !self.meta.retired.contains_key(&k.number))
            .find(|k| {
                (k.has(PENDING) && Some(k.number) != current)
                    || (k.has(CURRENT) && uncommitted == Some(k.number))
            })
    }

    /// The version numbered `n`, unless retired: a version the record lists as retired but
    /// that still carries its `keyplan-v<N>` label is a retire cut short (the labels come off
    /// after the record is written, that label last) and is still live, so that the engine
    /// retires it again.
    pub fn live(&self, n: u64) -> Option<&Known> {
        self.versions.get(&n)
    }

    /// The version rules' view.
    pub fn book(&self) -> VersionBook {
        VersionBook::new(
            self.current().map(|k| k.number),
            self.pending().map(|k| k.number),
            self.versions
                .keys()
                .copied()
                .chain(self.meta.retired.keys().copied())
                .chain(self.meta.uncommitted),
        )
    }

    /// What [`crate::kms::Kms::read`] returns.
    pub fn key_state(&self) -> KeyState {
        let current = self.current().map(|k| k.number);
        let pending = self.pending().map(|k| k.number);
        let mut versions: BTreeMap<u64, VersionInfo> = self
            .meta
            .retired
            .iter()
            .map(|(&version, &created_at)| {
                (
                    version,
                    VersionInfo {
                        version,
                        created_at,
                        state: VersionState::Retired,
                    },
                )
            })
            .collect();
        // A version still labelled is not retired, whatever the record says ([`View::live`]):
        // it reads as previous until its labels are off.
        for k in self.versions.values() {
            let state = if Some(k.number) == current {
                VersionState::Current
            } else if Some(k.number) == pending {
                VersionState::Pending
            } else {
                VersionState::Previous
            };
            versions.insert(
                k.number,
                VersionInfo {
                    version: k.number,
                    created_at: k.created_at,
                    state,
                },
            );
        }
        KeyState {
            current,
            pending,
            versions,
            holders: self.meta.holders.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(vid: &str, labels: &[&str]) -> Listed {
        Listed {
            vid: vid.into(),
            labels: labels.iter().map(|s| s.to_string()).collect(),
            created_at: 1_800_000_000,
        }
    }

    #[test]
    fn a_foreign_secret_is_version_one_and_a_rotation_reads_back() {
        let v = View::of(Some(vec![listed("x", &[CURRENT])]), Meta::default(), None);
        let st = v.key_state();
        assert_eq!((st.current, st.pending), (Some(1), None));
        assert!(!v.versions[&1].labelled);

        let v = View::of(
            Some(vec![
                listed("a", &[CURRENT, "keyplan-v1"]),
                listed("b", &[PENDING, "keyplan-v2"]),
            ]),
            Meta::default(),
            None,
        );
        let st = v.key_state();
        assert_eq!((st.current, st.pending), (Some(1), Some(2)));
        assert_eq!(
            v.book().stage(0),
            Err(crate::kms::book::Refusal::PendingExists { pending: 2 })
        );
    }

    #[test]
    fn a_retire_cut_short_reads_as_previous_until_the_labels_are_off() {
        let meta = Meta {
            retired: [(1, 1_800_000_000)].into_iter().collect(),
            ..Meta::default()
        };
        let v = View::of(
            Some(vec![
                listed("a", &["keyplan-v1"]),
                listed("b", &[CURRENT, "keyplan-v2"]),
            ]),
            meta.clone(),
            None,
        );
        assert_eq!(v.key_state().versions[&1].state, VersionState::Previous);
        assert!(v.live(1).is_some());
        assert!(v.book().retire(1).is_ok());
        let v = View::of(
            Some(vec![listed("b", &[CURRENT, "keyplan-v2"])]),
            meta,
            None,
        );
        assert_eq!(v.key_state().versions[&1].state, VersionState::Retired);
        assert!(v.live(1).is_none());
    }

    #[test]
    fn two_versions_labelled_current_are_both_seen() {
        let v = View::of(
            Some(vec![
                listed("a", &[CURRENT, "keyplan-v1"]),
                listed("b", &[CURRENT]),
            ]),
            Meta::default(),
            None,
        );
        assert_eq!(v.current_vids, ["a", "b"]);
    }

    #[test]
    fn the_first_version_is_pending_until_the_record_says_otherwise() {
        let meta = Meta {
            uncommitted: Some(1),
            ..Meta::default()
        };
        let l = vec![listed("a", &[CURRENT, PENDING, "keyplan-v1"])];
        let st = View::of(Some(l.clone()), meta, Some("m".into())).key_state();
        assert_eq!((st.current, st.pending), (None, Some(1)));
        // Committed: the record no longer says so; a leftover AWSPENDING is ignored.
        let st = View::of(Some(l), Meta::default(), Some("m".into())).key_state();
        assert_eq!((st.current, st.pending), (Some(1), None));
    }

    #[test]
    fn retired_versions_are_reported_without_material() {
        let meta = Meta {
            retired: [(1, 1_700_000_000)].into(),
            ..Meta::default()
        };
        let v = View::of(
            Some(vec![listed("b", &[CURRENT, "keyplan-v2"])]),
            meta,
            Some("m".into()),
        );
        let st = v.key_state();
        assert_eq!(st.versions[&1].state, VersionState::Retired);
        assert!(v.live(1).is_none());
        assert_eq!(v.book().next_version(0), 3);
    }

    #[test]
    fn tokens_fit_the_client_request_token_length() {
        assert_eq!(token(1).len(), 36);
        assert_eq!(token(u64::MAX).len(), 36);
    }
}
