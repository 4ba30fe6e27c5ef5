//! Conversions between the engine's types and the node report's own data types
//! ([`crate::format::published::node_report`], [`crate::format::published::observation`]): what
//! an agent publishes is converted from the engine's [`crate::observe::Observed`] and
//! [`crate::diff::CommitWait`], and `keyplan fleet plan` converts a report's observation back to
//! plan from it. Each conversion names every field on both sides, so a field added to an engine
//! type does not compile until it is given a place in the report (a new version) or left out
//! on purpose, and a renamed engine field leaves the report's field name as it is.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::format::published::node_report::{CommitWait, Observation};
use crate::format::published::observation as doc;

/// A conversion by value between an engine type and its report counterpart (both ways).
trait Conv<T> {
    fn conv(self) -> T;
}

macro_rules! same {
    ($($t:ty),*) => {$(
        impl Conv<$t> for $t {
            fn conv(self) -> $t {
                self
            }
        }
    )*};
}

same!(
    String,
    u64,
    u32,
    bool,
    PathBuf,
    serde_json::Value,
    (u64, u64),
    (String, String),
    (String, Option<u32>),
    (String, PathBuf, String),
    BTreeSet<(String, Option<u64>)>
);

impl<A: Conv<B>, B> Conv<Option<B>> for Option<A> {
    fn conv(self) -> Option<B> {
        self.map(Conv::conv)
    }
}

impl<A: Conv<B>, B> Conv<Vec<B>> for Vec<A> {
    fn conv(self) -> Vec<B> {
        self.into_iter().map(Conv::conv).collect()
    }
}

impl<K: Ord, A: Conv<B>, B> Conv<BTreeMap<K, B>> for BTreeMap<K, A> {
    fn conv(self) -> BTreeMap<K, B> {
        self.into_iter().map(|(k, v)| (k, v.conv())).collect()
    }
}

/// A struct converted field by field, both ways.
macro_rules! fields {
    ($a:path, $b:path, { $($f:ident),* $(,)? }) => {
        impl Conv<$b> for $a {
            fn conv(self) -> $b {
                $b { $($f: self.$f.conv()),* }
            }
        }
        impl Conv<$a> for $b {
            fn conv(self) -> $a {
                $a { $($f: self.$f.conv()),* }
            }
        }
    };
}

/// An enum of unit variants converted variant by variant, both ways.
macro_rules! variants {
    ($a:ident, $b:path, { $($v:ident),* $(,)? }) => {
        impl Conv<$b> for doc::$a {
            fn conv(self) -> $b {
                match self { $(doc::$a::$v => <$b>::$v),* }
            }
        }
        impl Conv<doc::$a> for $b {
            fn conv(self) -> doc::$a {
                match self { $(<$b>::$v => doc::$a::$v),* }
            }
        }
    };
}

variants!(LuksVersion, crate::luks::LuksVersion, { Luks1, Luks2 });
variants!(Priority, crate::luks::Priority, { Ignore, Normal, Prefer });
variants!(RecordStatus, crate::world::RecordStatus, { Valid, KeyslotGone, Rewritten, FailedVerify });
variants!(VersionState, crate::kms::VersionState, { Pending, Current, Previous, Retired });

fields!(doc::Observed, crate::observe::Observed, {
    devices, keys, former, former_unreadable, origins, now, staged_here, unavailable,
    former_holders, host, kept,
});
fields!(doc::DeviceState, crate::observe::DeviceState, {
    id, path, header, records, read_only, enroll_with_problem, enroll_with_keyslot,
    enroll_with_file, adoptable, adoption_untested, retired_copies,
});
fields!(doc::Keyslot, crate::luks::Keyslot, {
    bound, salt, priority, kdf, memory_kib, iterations, parallel,
});
fields!(doc::Token, crate::luks::Token, { id, token_type, keyslots, json });
fields!(doc::Condition, crate::luks::ondisk::Condition, {
    damage, copies_disagree, mid_write, requirements, reencryption,
});
fields!(doc::Header, crate::luks::Header, {
    version, uuid, keyslots, tokens, json_area, epoch, pbkdf2_target, condition,
});
fields!(doc::SlotRecord, crate::world::SlotRecord, { key, version, salt, entry, pbkdf });
fields!(doc::RecordObs, crate::world::RecordObs, {
    slot, record, token_id, status, renamed_from,
});
fields!(doc::VersionInfo, crate::kms::VersionInfo, { version, created_at, state });
fields!(doc::KeyState, crate::kms::KeyState, { current, pending, versions, holders });
fields!(doc::RetiredCopy, crate::world::copies::RetiredCopy, {
    uuid, device, slot, salt, key, version, found_at,
});
fields!(doc::Adoption, crate::observe::Adoption, { slot, key, version, salt, resalted });
fields!(doc::Untested, crate::observe::Untested, { key, version, slots });
fields!(doc::Unavailable, crate::observe::Unavailable, { path, why, help, at });
fields!(doc::KdfHost, crate::luks::KdfHost, { cpus, memory_kib });
fields!(doc::Origin, crate::observe::Origin, { kms, name, state, occupant });
fields!(doc::Occupant, crate::observe::Occupant, { version, pending, copy_of });
fields!(doc::Kept, crate::observe::Kept, { copy, state });
fields!(doc::KeptCopy, crate::world::kept::KeptCopy, { key, kms, name, versions, since });
fields!(CommitWait, crate::diff::CommitWait, {
    key, kms, version, current, blocking, verified_here,
});

impl Conv<crate::observe::EnrollFile> for doc::EnrollFile {
    fn conv(self) -> crate::observe::EnrollFile {
        use crate::observe::EnrollFile as E;
        match self {
            doc::EnrollFile::Passphrase => E::Passphrase,
            doc::EnrollFile::TooLong { bytes } => E::TooLong { bytes },
            doc::EnrollFile::Empty => E::Empty,
            doc::EnrollFile::NotRegular { kind } => E::NotRegular { kind },
            doc::EnrollFile::Unreadable { error } => E::Unreadable { error },
        }
    }
}

impl Conv<doc::EnrollFile> for crate::observe::EnrollFile {
    fn conv(self) -> doc::EnrollFile {
        use crate::observe::EnrollFile as E;
        match self {
            E::Passphrase => doc::EnrollFile::Passphrase,
            E::TooLong { bytes } => doc::EnrollFile::TooLong { bytes },
            E::Empty => doc::EnrollFile::Empty,
            E::NotRegular { kind } => doc::EnrollFile::NotRegular { kind },
            E::Unreadable { error } => doc::EnrollFile::Unreadable { error },
        }
    }
}

impl From<&crate::observe::Observed> for doc::Observed {
    fn from(o: &crate::observe::Observed) -> doc::Observed {
        o.clone().conv()
    }
}

impl From<doc::Observed> for crate::observe::Observed {
    fn from(o: doc::Observed) -> crate::observe::Observed {
        o.conv()
    }
}

impl From<crate::diff::CommitWait> for CommitWait {
    fn from(w: crate::diff::CommitWait) -> CommitWait {
        w.conv()
    }
}

impl From<CommitWait> for crate::diff::CommitWait {
    fn from(w: CommitWait) -> crate::diff::CommitWait {
        w.conv()
    }
}

impl Observation {
    /// The publishable copy of `observed` (observed for the plan of SHA-256 `plan_digest`,
    /// with the state directory `state_dir`): the LUKS2 tokens' contents left out (a foreign
    /// token, such as clevis's or systemd's, may hold wrapped key material).
    pub fn of(
        observed: &crate::observe::Observed,
        state_dir: &std::path::Path,
        plan_digest: Option<String>,
    ) -> Observation {
        let mut state = doc::Observed::from(observed);
        for d in state.devices.values_mut().chain(state.former.values_mut()) {
            for t in d.header.tokens.values_mut() {
                t.json = serde_json::Value::Null;
            }
        }
        Observation {
            observed_at: observed.now,
            state_dir: state_dir.display().to_string(),
            plan_digest,
            state,
        }
    }
}
