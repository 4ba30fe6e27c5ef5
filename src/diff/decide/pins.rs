//! Pinned keyslots that are occupied: what may be evicted, and moving a key version into its
//! pinned keyslot through a spare one (docs/architecture.md, "Pinned keyslots that are
//! occupied").

use super::Planner;
use crate::diff::{ReasonCode, SlotAction};
use crate::graph::{SlotHolder, Unlock, VersionRef};
use crate::luks::KdfDrift;

impl Planner<'_> {
    /// What keyslot `n` (pinned for `key` on `device`) holds, if keyplan may kill it to make
    /// room: an older version of the same key, or an unmanaged keyslot under
    /// `unmanaged_keyslots: remove`.
    pub(super) fn evictable(&self, device: &str, key: &str, n: u32) -> Option<SlotHolder> {
        let st = self.state(device)?;
        if let Some(r) = st.record(n) {
            return (r.key == key).then(|| SlotHolder::Record {
                key: key.to_string(),
                version: VersionRef::Version(r.version),
            });
        }
        let ks = st.header.keyslots.get(&n)?;
        self.removes_unmanaged(device)
            .then(|| SlotHolder::Unmanaged {
                salt: ks.salt.clone(),
            })
    }

    /// Puts `key` v`c` into its pinned keyslot `n`, which holds `holder`: the version goes to
    /// (or already is in, `with_c`) a spare keyslot M, is verified there, `n` is killed, the
    /// version is added into `n` through M and verified, and M is killed. Other keyslots of the
    /// key (`recs`) are removed once `n` is verified. 3 PBKDF runs more than an unpinned key.
    /// With `rewrap`, `n` holds v`c` already, with another PBKDF than the plan's: the same
    /// moves re-wrap it in place, and the changes say so.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn move_into_pin(
        &mut self,
        device: &str,
        key: &str,
        c: u64,
        n: u32,
        holder: SlotHolder,
        with_c: &[u32],
        recs: &[(u32, u64)],
        rewrap: Option<&KdfDrift>,
    ) {
        let version = VersionRef::Version(c);
        let Some((m, vm)) = self.spare(device, key, c, n, with_c, rewrap) else {
            return;
        };
        let rewrapping = |why: String| rewrap.map(|_| (ReasonCode::PbkdfRewrap, why));
        let (hkey, hversion) = match &holder {
            SlotHolder::Record {
                key,
                version: VersionRef::Version(v),
            } => (Some(key.clone()), Some(*v)),
            _ => (None, None),
        };
        let kn = self.kill(device, n, holder, vm);
        let why = match rewrap {
            Some(d) => (
                ReasonCode::PbkdfRewrap,
                format!(
                    "re-wrap in place with {} (this one has {}): {key} v{c} waits in keyslot {m} meanwhile",
                    d.want, d.was
                ),
            ),
            None => (
                ReasonCode::MakeRoom,
                format!("make room in pinned keyslot {n} for {key} v{c}"),
            ),
        };
        self.change(
            device,
            n,
            SlotAction::Remove,
            hkey.as_deref(),
            hversion,
            why,
        );
        let unlock = Unlock::Key {
            key: key.to_string(),
            version,
            slot: m,
        };
        let (an, vn) = self.add_step(device, key, version, n, unlock);
        self.intents.frees.push((kn, an));
        let why = match rewrap {
            Some(d) => (
                ReasonCode::PbkdfRewrap,
                format!("re-wrap {key} v{c} with {} (was {})", d.want, d.was),
            ),
            None => (
                ReasonCode::MoveToPinned,
                format!("move {key} v{c} into pinned keyslot {n}"),
            ),
        };
        self.change(device, n, SlotAction::Add, Some(key), Some(c), why);
        self.dev(device).anchor = Some(vn);
        let moved = rewrapping(format!("temporary keyslot of the re-wrap of keyslot {n}"))
            .unwrap_or_else(|| {
                (
                    ReasonCode::MoveToPinned,
                    format!("{key} moved to pinned keyslot {n}"),
                )
            });
        let record = |v: u64| SlotHolder::Record {
            key: key.to_string(),
            version: VersionRef::Version(v),
        };
        self.kill(device, m, record(c), vn);
        self.change(
            device,
            m,
            SlotAction::Remove,
            Some(key),
            Some(c),
            moved.clone(),
        );
        for &(s, v) in recs.iter().filter(|(s, _)| *s != n && *s != m) {
            self.kill(device, s, record(v), vn);
            self.change(
                device,
                s,
                SlotAction::Remove,
                Some(key),
                Some(v),
                moved.clone(),
            );
        }
    }

    /// The spare keyslot M of [`Planner::move_into_pin`] and its verify: the first keyslot that
    /// holds v`c` already (`with_c`), or a new one.
    fn spare(
        &mut self,
        device: &str,
        key: &str,
        c: u64,
        n: u32,
        with_c: &[u32],
        rewrap: Option<&KdfDrift>,
    ) -> Option<(u32, usize)> {
        let version = VersionRef::Version(c);
        if let Some(&m) = with_c.first() {
            return Some((m, self.verify_step(device, key, version, m)));
        }
        let m = self.target(device, key, false)?;
        let unlock = self.unlock(device, key, Some(c))?;
        let (_, vm) = self.add_step(device, key, version, m, unlock);
        let why = match rewrap {
            Some(d) => (
                ReasonCode::PbkdfRewrap,
                format!(
                    "temporary keyslot: re-wrap {key} v{c} in its pinned keyslot {n} with {} (was {})",
                    d.want, d.was
                ),
            ),
            None => (
                ReasonCode::TemporaryKeyslot,
                format!("temporary keyslot: pinned keyslot {n} is occupied"),
            ),
        };
        self.change(device, m, SlotAction::Add, Some(key), Some(c), why);
        Some((m, vm))
    }
}
