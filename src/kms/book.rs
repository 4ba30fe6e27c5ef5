//! The version book of one key: the rules every provider applies to a key's `current`,
//! `pending` and known versions, written once, with one wording for every refusal.
//!
//! The rules ([`super::Kms`] docs, docs/rotation.md, steps stage, commit and retire, invariants I3
//! and I5):
//!
//! - **stage**: refused while a version is pending (the engine reuses it instead); the new
//!   version is `max(highest known version + 1, at_least)`, so a number a stale device record
//!   still names is never reused ([`VersionBook::stage`], [`VersionBook::next_version`]);
//! - **commit**: committing a version that is already current is a no-op (a lost reply);
//!   otherwise the current version must still be `expected_current` and `pending` must still
//!   be pending (compare-and-swap); the old current becomes `Previous`, the pending one
//!   `Current` ([`VersionBook::commit`], [`commit_states`]);
//! - **retire**: the current and the pending version cannot be retired ([`VersionBook::retire`]);
//! - **destroy_key**: a key with neither a current nor a pending version is done already;
//!   otherwise the current version must be the expected one and nothing may be pending; every
//!   version becomes `Retired` ([`VersionBook::destroy`], [`destroy_states`]).
//!
//! Providers decide with a [`VersionBook`] built from what they read, turn a [`Refusal`] into
//! [`KmsError::Conflict`] with [`Refusal::conflict`], and keep their own extra checks (Vault's
//! check-and-set on the KV version a pending version was staged on, KMIP object states,
//! Kubernetes `resourceVersion`s). Providers that keep a version list of their own (the file
//! KMS's `meta.json`, the Kubernetes annotation) apply the state changes with
//! [`commit_states`], [`retire_state`] and [`destroy_states`]. The `exec` provider forwards
//! every operation to its helper, which applies the same rules (docs/kms/exec.md §3).

use std::fmt;

use super::{KeyState, Kms, KmsError, VersionInfo, VersionState};

/// The refusal of [`Kms::hold`] for `holder` on key `name`, which has no current version: a
/// key is held once it exists.
pub fn no_current_to_hold(kms: &dyn Kms, name: &str, holder: &str) -> KmsError {
    KmsError::conflict(
        kms,
        name,
        format!("{holder} cannot be recorded as a holder: the key has no current version"),
    )
}

/// The holder rule (invariant I7) with its two-phase commit: a commit of `pending` on behalf
/// of the plan `me` is refused while the key records another holder (`holders`, as
/// [`super::KeyState::holders`]) that has not also recorded its vote for `pending`
/// ([`vote_id`]: its devices hold `pending` and it verified that `pending` opens them). Votes
/// for other versions count for nothing. `None`: no check. Providers call it inside the
/// read-check-write of their commit, so a vote withdrawn or a holder recorded concurrently
/// either comes first and stops the commit, or comes after it and sees the new version.
///
/// Errors: [`KmsError::Conflict`] naming the holders that have not verified `pending`.
pub fn check_holders(
    kms: &dyn Kms,
    name: &str,
    holders: &std::collections::BTreeMap<String, u64>,
    me: Option<&str>,
    pending: u64,
) -> Result<(), KmsError> {
    let Some(me) = me else {
        return Ok(());
    };
    let others = unverified_holders(holders, me, pending);
    if others.is_empty() {
        return Ok(());
    }
    let shown: Vec<String> = others
        .iter()
        .map(|h| {
            let since = holders.get(*h).copied().unwrap_or_default();
            format!("{h} (since {})", crate::clock::rfc3339(since))
        })
        .collect();
    Err(KmsError::conflict(
        kms,
        name,
        format!(
            "the key is also held by {}, which has not verified v{pending}: a new version committed from {me} would not be on that plan's devices; nothing was committed",
            shown.join(", ")
        ),
    ))
}

/// The holders of `holders` other than `me` (and other than votes) that have no vote for
/// `version` ([`vote_id`]), in id order.
pub fn unverified_holders<'h>(
    holders: &'h std::collections::BTreeMap<String, u64>,
    me: &str,
    version: u64,
) -> Vec<&'h str> {
    holders
        .keys()
        .filter(|h| h.as_str() != me && parse_vote(h).is_none())
        .filter(|h| !holders.contains_key(&vote_id(h, version)))
        .map(String::as_str)
        .collect()
}

/// The id of `holder`'s vote for `version` in the key's holder records: `<holder> verified
/// v<version>`, an id of the stored holder records ([`crate::format::kms::holders`]). A plan
/// records it ([`super::Kms::hold`]) once every one of its devices that lists the key holds the
/// pending `version` and opened with it; [`check_holders`] lets a commit of `version` through
/// only when every other holder has voted so (the two-phase commit of a key shared by several
/// plans or nodes, docs/fleet.md "Keys on several nodes").
pub use crate::format::kms::holders::vote_id;

/// `(holder, version)` of a vote id ([`vote_id`]); `None` for a holder record.
pub use crate::format::kms::holders::parse_vote;

/// What the version rules need to know of a key: its current and pending version and the
/// highest version number known (0: none). Built by each provider from what it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VersionBook {
    /// The current version, if the key exists.
    pub current: Option<u64>,
    /// The pending (staged, not yet committed) version, if any.
    pub pending: Option<u64>,
    /// The highest version number the provider knows of, including retired versions and
    /// leftovers it is about to clean up (0 when there is none).
    pub highest: u64,
}

/// What a commit that passed the book's checks has to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// The version is current already (the reply to an earlier commit was lost): nothing to
    /// change; a provider may finish its own clean-up.
    AlreadyCurrent,
    /// Make the pending version current; `previous` (the current one so far) becomes
    /// `Previous`.
    Go {
        /// The version that stops being current, if any.
        previous: Option<u64>,
    },
}

/// What a `destroy_key` that passed the book's checks has to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destroy {
    /// Neither a current nor a pending version is left: nothing to destroy (idempotent); a
    /// provider may finish the clean-up of an interrupted destroy.
    NothingLeft,
    /// Destroy every version, the current one included.
    Go,
}

/// Why the version rules refuse an operation; [`Refusal::conflict`] makes it the
/// [`KmsError::Conflict`] the caller returns. The texts name versions only, never material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `stage`: a version is pending already; it must be committed or discarded first.
    PendingExists {
        /// The pending version.
        pending: u64,
    },
    /// `commit`: the current version is not the expected one, or `pending` is not pending.
    CommitMismatch {
        /// The current version the caller expected.
        expected_current: Option<u64>,
        /// The version the caller wants to commit.
        pending: u64,
        /// The current version found.
        found_current: Option<u64>,
        /// The pending version found.
        found_pending: Option<u64>,
    },
    /// `retire`: the version is current or pending.
    RetireLive {
        /// The version the caller wants to retire.
        version: u64,
    },
    /// `destroy_key`: the current version is not the expected one, or a version is pending.
    DestroyMismatch {
        /// The current version the caller expected.
        expected_current: u64,
        /// The current version found.
        found_current: Option<u64>,
        /// The pending version found.
        found_pending: Option<u64>,
    },
}

impl VersionBook {
    /// A book for `current` and `pending`, `highest` being the highest of them and of `known`
    /// (every other version number the provider knows of).
    pub fn new(
        current: Option<u64>,
        pending: Option<u64>,
        known: impl IntoIterator<Item = u64>,
    ) -> VersionBook {
        let highest = known
            .into_iter()
            .chain(current)
            .chain(pending)
            .max()
            .unwrap_or(0);
        VersionBook {
            current,
            pending,
            highest,
        }
    }

    /// The book of what [`super::Kms::read`] returned.
    pub fn of(state: &KeyState) -> VersionBook {
        VersionBook::new(state.current, state.pending, state.versions.keys().copied())
    }

    /// The book of a provider's own version list (see [`Entry`]).
    pub fn of_entries<E: Entry>(
        current: Option<u64>,
        pending: Option<u64>,
        versions: &[E],
    ) -> VersionBook {
        VersionBook::new(current, pending, versions.iter().map(Entry::number))
    }

    /// The number a newly staged version gets: one above the highest known version, or
    /// `at_least` if that is higher.
    pub fn next_version(&self, at_least: u64) -> u64 {
        self.highest.saturating_add(1).max(at_least)
    }

    /// May a version be staged? Returns its number ([`VersionBook::next_version`]).
    ///
    /// Errors: [`Refusal::PendingExists`] while a version is pending.
    pub fn stage(&self, at_least: u64) -> Result<u64, Refusal> {
        match self.pending {
            Some(pending) => Err(Refusal::PendingExists { pending }),
            None => Ok(self.next_version(at_least)),
        }
    }

    /// May `pending` be committed, the current version being expected to be
    /// `expected_current`? A version that is current already gives [`Commit::AlreadyCurrent`]
    /// whatever else is true.
    ///
    /// Errors: [`Refusal::CommitMismatch`] when the current version is not `expected_current`
    /// or `pending` is not the pending version.
    pub fn commit(&self, expected_current: Option<u64>, pending: u64) -> Result<Commit, Refusal> {
        if self.current == Some(pending) {
            return Ok(Commit::AlreadyCurrent);
        }
        if self.current != expected_current || self.pending != Some(pending) {
            return Err(Refusal::CommitMismatch {
                expected_current,
                pending,
                found_current: self.current,
                found_pending: self.pending,
            });
        }
        Ok(Commit::Go {
            previous: self.current,
        })
    }

    /// May `version` be retired? Unknown and already retired versions may (retiring is
    /// idempotent; what that means in the store is the provider's business).
    ///
    /// Errors: [`Refusal::RetireLive`] for the current and the pending version.
    pub fn retire(&self, version: u64) -> Result<(), Refusal> {
        if self.current == Some(version) || self.pending == Some(version) {
            return Err(Refusal::RetireLive { version });
        }
        Ok(())
    }

    /// May the whole key be destroyed, the current version being expected to be
    /// `expected_current`?
    ///
    /// Errors: [`Refusal::DestroyMismatch`] when a current or pending version exists and the
    /// current one is not `expected_current` or a version is pending.
    pub fn destroy(&self, expected_current: u64) -> Result<Destroy, Refusal> {
        if self.current.is_none() && self.pending.is_none() {
            return Ok(Destroy::NothingLeft);
        }
        if self.current != Some(expected_current) || self.pending.is_some() {
            return Err(Refusal::DestroyMismatch {
                expected_current,
                found_current: self.current,
                found_pending: self.pending,
            });
        }
        Ok(Destroy::Go)
    }
}

impl Refusal {
    /// The [`KmsError::Conflict`] for key `key` of `kms`.
    pub fn conflict(&self, kms: &dyn Kms, key: &str) -> KmsError {
        KmsError::conflict(kms, key, self.to_string())
    }

    /// [`Refusal::conflict`] with `place` (where the provider keeps the version in question,
    /// e.g. a path or an object id; no material) named after the subject of the message.
    pub fn conflict_at(&self, kms: &dyn Kms, key: &str, place: &str) -> KmsError {
        let (subject, rest) = self.parts();
        let detail = match rest {
            Some(rest) => format!("{subject} ({place}); {rest}"),
            None => format!("{subject} ({place})"),
        };
        KmsError::conflict(kms, key, detail)
    }

    /// The message: what was found, and (when there is one) what has to happen first.
    fn parts(&self) -> (String, Option<&'static str>) {
        match *self {
            Refusal::PendingExists { pending } => (
                format!("version {pending} is already pending"),
                Some("it must be committed or discarded first"),
            ),
            Refusal::CommitMismatch {
                expected_current,
                pending,
                found_current,
                found_pending,
            } => (
                format!(
                    "expected current {} and pending v{pending}, found current {} and pending {}",
                    show(expected_current),
                    show(found_current),
                    show(found_pending)
                ),
                None,
            ),
            Refusal::RetireLive { version } => (
                format!("version {version} is current or pending and cannot be retired"),
                None,
            ),
            Refusal::DestroyMismatch {
                expected_current,
                found_current,
                found_pending,
            } => (
                format!(
                    "expected current v{expected_current} and no pending version, found current {} and pending {}",
                    show(found_current),
                    show(found_pending)
                ),
                None,
            ),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.parts() {
            (subject, Some(rest)) => write!(f, "{subject}; {rest}"),
            (subject, None) => f.write_str(&subject),
        }
    }
}

/// A version number for messages: `v3`, or `none`.
pub fn show(v: Option<u64>) -> String {
    v.map_or_else(|| "none".to_string(), |v| format!("v{v}"))
}

/// One version in a provider's own version list: its number and its state.
pub trait Entry {
    /// The version number.
    fn number(&self) -> u64;
    /// The version's lifecycle state, to be changed by the book's transitions.
    fn state_mut(&mut self) -> &mut VersionState;
}

impl Entry for VersionInfo {
    fn number(&self) -> u64 {
        self.version
    }
    fn state_mut(&mut self) -> &mut VersionState {
        &mut self.state
    }
}

/// Sets the state of `version` in `versions` (nothing when it is not listed).
pub fn set_state<E: Entry>(versions: &mut [E], version: u64, state: VersionState) {
    if let Some(v) = versions.iter_mut().find(|v| v.number() == version) {
        *v.state_mut() = state;
    }
}

/// The state changes of a commit of `pending` that [`VersionBook::commit`] allowed as
/// [`Commit::Go`]: `previous` (the old current) becomes `Previous`, `pending` becomes
/// `Current`. Returns the new `(current, pending)` pointers: `(Some(pending), None)`.
pub fn commit_states<E: Entry>(
    versions: &mut [E],
    previous: Option<u64>,
    pending: u64,
) -> (Option<u64>, Option<u64>) {
    if let Some(old) = previous {
        set_state(versions, old, VersionState::Previous);
    }
    set_state(versions, pending, VersionState::Current);
    (Some(pending), None)
}

/// The state change of retiring `version`: it becomes `Retired`.
pub fn retire_state<E: Entry>(versions: &mut [E], version: u64) {
    set_state(versions, version, VersionState::Retired);
}

/// The state changes of a `destroy_key` that [`VersionBook::destroy`] allowed: every version
/// becomes `Retired`. Returns the new `(current, pending)` pointers: `(None, None)`.
pub fn destroy_states<E: Entry>(versions: &mut [E]) -> (Option<u64>, Option<u64>) {
    for v in versions.iter_mut() {
        *v.state_mut() = VersionState::Retired;
    }
    (None, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(current: Option<u64>, pending: Option<u64>, known: &[u64]) -> VersionBook {
        VersionBook::new(current, pending, known.iter().copied())
    }

    fn info(version: u64, state: VersionState) -> VersionInfo {
        VersionInfo {
            version,
            created_at: 1,
            state,
        }
    }

    #[test]
    fn next_version_is_above_every_known_one_and_at_least() {
        assert_eq!(book(None, None, &[]).next_version(0), 1);
        assert_eq!(book(None, None, &[]).next_version(1), 1);
        assert_eq!(book(Some(2), None, &[1]).next_version(0), 3);
        // Retired and leftover versions count too.
        assert_eq!(book(Some(2), None, &[1, 7]).next_version(3), 8);
        assert_eq!(book(Some(2), None, &[1]).next_version(10), 10);
        assert_eq!(book(None, None, &[u64::MAX]).next_version(0), u64::MAX);
        let st = KeyState {
            current: Some(4),
            pending: None,
            versions: [
                (3, info(3, VersionState::Retired)),
                (4, info(4, VersionState::Current)),
            ]
            .into_iter()
            .collect(),
            holders: Default::default(),
        };
        assert_eq!(VersionBook::of(&st).highest, 4);
        let list = [
            info(1, VersionState::Previous),
            info(5, VersionState::Retired),
        ];
        assert_eq!(VersionBook::of_entries(Some(1), None, &list).highest, 5);
    }

    #[test]
    fn stage_is_refused_while_a_version_is_pending() {
        assert_eq!(book(Some(1), None, &[1]).stage(0), Ok(2));
        assert_eq!(book(None, None, &[]).stage(3), Ok(3));
        let r = book(Some(1), Some(2), &[]).stage(0).unwrap_err();
        assert_eq!(r, Refusal::PendingExists { pending: 2 });
        assert_eq!(
            r.to_string(),
            "version 2 is already pending; it must be committed or discarded first"
        );
    }

    #[test]
    fn commit_is_compare_and_swap_and_repeating_it_is_a_no_op() {
        let b = book(Some(1), Some(2), &[]);
        assert_eq!(b.commit(Some(1), 2), Ok(Commit::Go { previous: Some(1) }));
        assert_eq!(
            book(None, Some(1), &[]).commit(None, 1),
            Ok(Commit::Go { previous: None })
        );
        // Already current: a lost reply, whatever the expectation and a newer pending say.
        assert_eq!(
            book(Some(2), None, &[]).commit(Some(1), 2),
            Ok(Commit::AlreadyCurrent)
        );
        assert_eq!(
            book(Some(2), Some(3), &[]).commit(Some(1), 2),
            Ok(Commit::AlreadyCurrent)
        );
        // Wrong expectation, or a version that is not pending.
        let r = b.commit(Some(7), 2).unwrap_err();
        assert_eq!(
            r.to_string(),
            "expected current v7 and pending v2, found current v1 and pending v2"
        );
        let r = b.commit(Some(1), 3).unwrap_err();
        assert_eq!(
            r,
            Refusal::CommitMismatch {
                expected_current: Some(1),
                pending: 3,
                found_current: Some(1),
                found_pending: Some(2)
            }
        );
        assert!(book(None, None, &[]).commit(None, 1).is_err());
        assert_eq!(
            book(Some(1), None, &[])
                .commit(None, 2)
                .unwrap_err()
                .to_string(),
            "expected current none and pending v2, found current v1 and pending none"
        );
    }

    #[test]
    fn current_and_pending_cannot_be_retired() {
        let b = book(Some(2), Some(3), &[1]);
        assert_eq!(b.retire(1), Ok(()));
        assert_eq!(b.retire(9), Ok(()));
        for v in [2, 3] {
            let r = b.retire(v).unwrap_err();
            assert_eq!(
                r.to_string(),
                format!("version {v} is current or pending and cannot be retired")
            );
        }
    }

    #[test]
    fn destroy_needs_the_expected_current_and_no_pending() {
        assert_eq!(
            book(None, None, &[1, 2]).destroy(2),
            Ok(Destroy::NothingLeft)
        );
        assert_eq!(book(Some(2), None, &[1]).destroy(2), Ok(Destroy::Go));
        let r = book(Some(2), None, &[]).destroy(1).unwrap_err();
        assert_eq!(
            r.to_string(),
            "expected current v1 and no pending version, found current v2 and pending none"
        );
        let r = book(Some(2), Some(3), &[]).destroy(2).unwrap_err();
        assert!(matches!(
            r,
            Refusal::DestroyMismatch {
                found_pending: Some(3),
                ..
            }
        ));
        let r = book(None, Some(3), &[]).destroy(2).unwrap_err();
        assert_eq!(
            r.to_string(),
            "expected current v2 and no pending version, found current none and pending v3"
        );
    }

    #[test]
    fn transitions_move_the_states() {
        let mut list = vec![
            info(1, VersionState::Retired),
            info(2, VersionState::Current),
            info(3, VersionState::Pending),
        ];
        assert_eq!(commit_states(&mut list, Some(2), 3), (Some(3), None));
        let states: Vec<VersionState> = list.iter().map(|v| v.state).collect();
        assert_eq!(
            states,
            [
                VersionState::Retired,
                VersionState::Previous,
                VersionState::Current
            ]
        );
        retire_state(&mut list, 2);
        retire_state(&mut list, 9);
        assert_eq!(list[1].state, VersionState::Retired);
        let mut first = vec![info(1, VersionState::Pending)];
        assert_eq!(commit_states(&mut first, None, 1), (Some(1), None));
        assert_eq!(first[0].state, VersionState::Current);
        assert_eq!(destroy_states(&mut list), (None, None));
        assert!(list.iter().all(|v| v.state == VersionState::Retired));
    }

    #[test]
    fn conflicts_name_the_kms_the_key_and_the_place() {
        let kms = super::super::file::FileKms::new("local", "/srv/keys".into());
        let e =
            Refusal::PendingExists { pending: 4 }.conflict_at(&kms, "k", "object 12, Pre-Active");
        match e {
            KmsError::Conflict { kms, key, detail } => {
                assert_eq!(kms, "file KMS \"local\" (/srv/keys)");
                assert_eq!(key, "k");
                assert_eq!(
                    detail,
                    "version 4 is already pending (object 12, Pre-Active); it must be committed or discarded first"
                );
            }
            other => panic!("{other:?}"),
        }
        let e = Refusal::RetireLive { version: 2 }.conflict_at(&kms, "k", "secret/data/k");
        assert!(e
            .to_string()
            .contains("version 2 is current or pending and cannot be retired (secret/data/k)"));
        assert!(show(None) == "none" && show(Some(3)) == "v3");
    }
}
