//! This plan's own former holder records (its state directory moved, `observe::holders`):
//! the planner sees the keys as held by this plan alone, records this plan's id as for any key
//! it holds, and removes each former record right after, before anything is staged, added or
//! committed, so no instant passes without a record of this plan and no commit meets the old
//! id as another plan's.

use std::borrow::Cow;

use super::Planner;
use crate::diff::{HolderAction, HolderChange};
use crate::graph::Step;
use crate::observe::Observed;

/// A former record of this plan to remove: `(key id, holder id)`.
pub(crate) type FormerRecord = (String, String);

/// `observed` without this plan's former holder records and their votes, with the records to
/// remove; unchanged (borrowed) when there are none.
pub(crate) fn without_former_holders(
    observed: &Observed,
) -> (Cow<'_, Observed>, Vec<FormerRecord>) {
    if observed.former_holders.is_empty() {
        return (Cow::Borrowed(observed), Vec::new());
    }
    let mut out = observed.clone();
    let mut removed = Vec::new();
    for (key, st) in out.keys.iter_mut() {
        for id in observed.former_holders.keys() {
            if st.holders.contains_key(id) {
                removed.push((key.clone(), id.clone()));
            }
        }
        st.holders.retain(|h, _| {
            let of = crate::kms::book::parse_vote(h).map_or(h.as_str(), |(of, _)| of);
            !observed.former_holders.contains_key(of)
        });
    }
    (Cow::Owned(out), removed)
}

impl Planner<'_> {
    /// A step removing each of `records` (this plan's former holder records) and its change.
    pub(crate) fn release_former(&mut self, records: &[FormerRecord]) {
        for (key, holder) in records {
            self.holders.push(HolderChange {
                key: key.clone(),
                kms: self.kms_of(key),
                holder: holder.clone(),
                action: HolderAction::ReleaseFormer,
                reason: self.obs.former_holders.get(holder).cloned(),
            });
            self.g.add(Step::ReleaseFormer {
                key: key.clone(),
                holder: holder.clone(),
            });
        }
    }
}
