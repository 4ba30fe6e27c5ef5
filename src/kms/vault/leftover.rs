//! Material that keyplan's record of a key no longer counts on
//! ([`crate::kms::Kms::lingering`]): readable KV versions of the main path that hold a version
//! the record calls retired, and a committed pending secret left behind. They come from a
//! holder record whose destruction of the KV version it copied failed or was cut short
//! ([`crate::kms::Kms::hold`]), from a `destroy_key` killed between its tombstone and the
//! deletion of the key's metadata, or from a hand-made write. `retire` destroys the copies of
//! the version it retires before that version's own KV version (whose destroyed flag is the
//! record), and `destroy_key` finishes an interrupted destroy.

use std::collections::BTreeSet;

use serde_json::Value;

use super::client::{Read, VaultKms};
use super::layout::{
    basename, material_kept, number, take_string, Main, PendingRead, FIELD_DESTROYED_AT,
    FIELD_VERSION,
};
use crate::kms::KmsError;

/// A readable KV version of a key's main path that is neither the latest one nor the one the
/// history maps a version to, and the keyplan version whose material it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stray {
    /// The KV version.
    pub(super) kv_version: u64,
    /// The keyplan version it holds (`keyplan_version`; below a tombstone, a KV version
    /// without keyplan fields counts as its KV version, as an adopted secret does).
    pub(super) version: u64,
    /// The record calls that version retired (or the key destroyed): the copy lingers.
    pub(super) retired: bool,
}

impl VaultKms {
    /// The [`Stray`] copies of key `name` whose main path reads as `main`: the readable KV
    /// versions below the latest one that no history entry maps to, read one by one (none in
    /// the usual case: keyplan destroys every KV version it supersedes). Tombstones hold no
    /// material and are left out, and so, on a live key, are KV versions without keyplan
    /// fields (another tool's, older than keyplan's first version). Reads only.
    ///
    /// Errors: those of the reads.
    pub(super) fn strays(&self, name: &str, main: &Main) -> Result<Vec<Stray>, KmsError> {
        let Some(meta) = self.read_metadata(name)? else {
            return Ok(Vec::new());
        };
        let now = crate::clock::now_unix();
        let live = main.live.as_ref();
        let history = live.map_or(&[][..], |l| &l.history[..]);
        let mapped: BTreeSet<u64> = history.iter().map(|h| h.kv_version).collect();
        let mut kvs: Vec<u64> = meta
            .versions
            .keys()
            .filter_map(|k| k.parse().ok())
            .filter(|kv| *kv < main.kv_version && !mapped.contains(kv))
            .filter(|kv| material_kept(Some(&meta), *kv, now))
            .collect();
        kvs.sort_unstable();
        let mut out = Vec::new();
        for kv in kvs {
            let Read::Found(resp) = self.read_secret(name, Some(kv))? else {
                continue;
            };
            let Value::Object(mut data) = resp.data else {
                continue;
            };
            // The copy's passphrase is dropped through zeroizing storage, unread.
            drop(take_string(&mut data, basename(name)));
            if data.contains_key(FIELD_DESTROYED_AT) {
                continue;
            }
            let version = match number(&data, FIELD_VERSION) {
                Ok(Some(v)) => v,
                Ok(None) if live.is_none() => kv,
                _ => continue,
            };
            let retired = live.is_none_or(|l| {
                version != l.version
                    && !history.iter().any(|h| {
                        h.version == version && material_kept(Some(&meta), h.kv_version, now)
                    })
            });
            out.push(Stray {
                kv_version: kv,
                version,
                retired,
            });
        }
        Ok(out)
    }

    /// One attempt of [`crate::kms::Kms::lingering`]: the versions of the readable [`Stray`]
    /// copies the record calls retired, and the version of a committed pending secret left
    /// behind when the record calls it retired (or the key is destroyed).
    pub(super) fn lingering_once(&self, name: &str) -> Result<Vec<u64>, KmsError> {
        let (main, pending) = self.read_state(name, false)?;
        let mut out = BTreeSet::new();
        // No main path: nothing, or a first version being staged.
        let Some(main) = main else {
            return Ok(Vec::new());
        };
        let strays = self.strays(name, &main)?;
        out.extend(strays.iter().filter(|s| s.retired).map(|s| s.version));
        if let PendingRead::Found(p) = &pending {
            let live = main.live.as_ref();
            let stale = live.is_none_or(|l| p.version <= l.version);
            if stale && self.retired_in(name, &main, p.version)? {
                out.insert(p.version);
            }
        }
        Ok(out.into_iter().collect())
    }

    /// Does the record of `name` (main path `main`) call `version` retired: the key is
    /// destroyed (a tombstone), or `version` is neither current nor a previous version whose
    /// KV version still holds its material?
    fn retired_in(&self, name: &str, main: &Main, version: u64) -> Result<bool, KmsError> {
        let Some(live) = &main.live else {
            return Ok(true);
        };
        if live.version == version {
            return Ok(false);
        }
        let Some(h) = live.history.iter().find(|h| h.version == version) else {
            return Ok(true);
        };
        let meta = self.read_metadata(name)?;
        Ok(!material_kept(
            meta.as_ref(),
            h.kv_version,
            crate::clock::now_unix(),
        ))
    }
}
