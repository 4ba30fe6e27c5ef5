//! The KMS side of a rotation: stage a new version (or reuse the pending one), commit it with
//! compare-and-swap and read it back, retire an old version.

use super::{Exec, StepError, StepOutcome};
use crate::secret::Passphrase;

impl Exec<'_> {
    /// `stage`: reuses the pending version if the KMS has one (I3: never a second pending
    /// version), else generates `bytes` random bytes (OS CSPRNG, base64 text) and stores them
    /// as pending, numbered at least `at_least`. Refuses ([`StepError::Drift`]) when nothing is
    /// pending and the current version is not `planned_current` (when given) or is at least
    /// `at_least`: the plan is stale.
    pub(super) fn stage(
        &self,
        key: &str,
        at_least: u64,
        planned_current: Option<u64>,
    ) -> Result<StepOutcome, StepError> {
        let (kms, name, bytes) = self.key_ctx(key)?;
        let st = kms.read(&name)?;
        let (v, what) = match (st.pending, st.current) {
            (Some(p), _) => (p, format!("reused pending v{p}")),
            // Nothing pending and the current version is not the one planned against (or is
            // at or above `at_least`, above every version the plan saw): another run
            // committed a rotation since, so this run's is stale (found by the protocol model
            // and its review, docs/verification.md).
            (None, Some(c)) if c >= at_least || planned_current.is_some_and(|p| p != c) => {
                return Err(StepError::Drift(format!(
                    "{}: {key} v{c} became current after this run was planned (another run rotated it); nothing was staged. Run `keyplan apply` again to plan from the new state",
                    kms.describe(),
                )));
            }
            (None, _) => {
                let material = Passphrase::generate(bytes).map_err(StepError::Internal)?;
                let v = kms.stage(&name, &material, at_least)?;
                (v, format!("staged v{v}"))
            }
        };
        self.staged_outcome(key, v, what)
    }

    /// `commit`: the staged version becomes current if the current one is still
    /// `expected_current` (compare-and-swap in the KMS), then reads it back.
    pub(super) fn commit(
        &self,
        key: &str,
        expected_current: Option<u64>,
    ) -> Result<StepOutcome, StepError> {
        let v = self.resolve(key, crate::graph::VersionRef::Staged)?;
        let (kms, name, _) = self.key_ctx(key)?;
        let me = self.plan.holder();
        super::failpoint("commit.before")?;
        kms.commit_as(&name, expected_current, v, Some(&me))?;
        let st = kms.read(&name)?;
        if st.current != Some(v) {
            return Err(StepError::Drift(format!(
                "{}: after commit, the current version of {key} reads back as {:?}, not v{v}",
                kms.describe(),
                st.current
            )));
        }
        // The plan that made a version current holds the key when its devices list it (a
        // created key gets its first record here; for the others it is there already and
        // this writes nothing).
        let listed = self
            .plan
            .devices
            .values()
            .any(|d| d.keys.iter().any(|k| k.key == key));
        if listed && !st.holders.contains_key(&me) {
            kms.hold(&name, &me)?;
        }
        StepOutcome::done(format!("{key} v{v} is now current"))
    }

    /// `hold`: records this plan as a holder of `key` in its KMS (idempotent), then checks
    /// that the key's current version is still `current`, the one this plan adds: another plan
    /// may have committed a new one between planning and now (it could, until this record was
    /// written).
    pub(super) fn hold(&self, key: &str, current: Option<u64>) -> Result<StepOutcome, StepError> {
        let (kms, name, _) = self.key_ctx(key)?;
        let me = self.plan.holder();
        kms.hold(&name, &me)?;
        let st = kms.read(&name)?;
        if current.is_some() && st.current != current {
            return Err(StepError::Drift(format!(
                "{}: key {key} was rotated by another plan after this plan was made (current {}, planned v{}); this plan is now recorded as a holder, so no further rotation happens without it, but nothing was added: run keyplan apply again to enroll the current version",
                kms.describe(),
                st.current.map(|v| format!("v{v}")).unwrap_or_else(|| "none".into()),
                current.unwrap_or_default()
            )));
        }
        StepOutcome::done(format!("{me} holds {key}"))
    }

    /// `release`: removes this plan's holder record of `key` (idempotent); for a key the plan
    /// no longer defines, in the KMS instance and under the name `entry` its records named.
    pub(super) fn release(
        &self,
        key: &str,
        entry: Option<&(String, String)>,
    ) -> Result<StepOutcome, StepError> {
        let (kms, name) = match entry {
            Some((instance, name)) => {
                let kms = self.world.kms.get(instance).ok_or_else(|| {
                    StepError::Plan(format!(
                        "KMS {instance} of key {key} is no longer in the plan"
                    ))
                })?;
                (kms.as_ref(), name.clone())
            }
            None => {
                let (kms, name, _) = self.key_ctx(key)?;
                (kms, name)
            }
        };
        let me = self.plan.holder();
        kms.release(&name, &me)?;
        StepOutcome::done(format!("{me} no longer holds {key}"))
    }

    /// `release_former`: removes `holder`, this plan's own record of `key` under its former
    /// id, and that id's votes (idempotent). Runs after this plan's `hold`, so the key is
    /// never without a record of this plan.
    pub(super) fn release_former(&self, key: &str, holder: &str) -> Result<StepOutcome, StepError> {
        let (kms, name, _) = self.key_ctx(key)?;
        let st = kms.read(&name)?;
        for id in st
            .holders
            .keys()
            .filter(|h| crate::kms::book::parse_vote(h).map_or(h.as_str(), |(of, _)| of) == holder)
        {
            kms.release(&name, id)?;
        }
        StepOutcome::done(format!(
            "{} replaces the former record {holder} of {key}",
            self.plan.holder()
        ))
    }

    /// `vote`: records this plan's vote for the staged version of `key`
    /// ([`crate::kms::book::vote_id`], idempotent), after its verify steps; then checks the
    /// version is still the pending one (or was committed meanwhile by another holder).
    pub(super) fn vote(&self, key: &str) -> Result<StepOutcome, StepError> {
        let v = self.resolve(key, crate::graph::VersionRef::Staged)?;
        let (kms, name, _) = self.key_ctx(key)?;
        let me = self.plan.holder();
        kms.hold(&name, &crate::kms::book::vote_id(&me, v))?;
        let st = kms.read(&name)?;
        if st.pending != Some(v) && st.current != Some(v) {
            return Err(StepError::Drift(format!(
                "{}: key {key}: v{v}, which this plan's devices now hold, is neither pending nor current any more (current {}, pending {}); run keyplan apply again",
                kms.describe(),
                st.current.map(|c| format!("v{c}")).unwrap_or_else(|| "none".into()),
                st.pending.map(|p| format!("v{p}")).unwrap_or_else(|| "none".into()),
            )));
        }
        StepOutcome::done(format!("{me} verified {key} v{v}"))
    }

    /// `unvote`: removes this plan's vote for `version` of `key` (idempotent).
    pub(super) fn unvote(&self, key: &str, version: u64) -> Result<StepOutcome, StepError> {
        let (kms, name, _) = self.key_ctx(key)?;
        let me = self.plan.holder();
        kms.release(&name, &crate::kms::book::vote_id(&me, version))?;
        StepOutcome::done(format!("{me} no longer votes for {key} v{version}"))
    }

    /// `retire`: destroys the material of a non-current version in the KMS (idempotent). In a
    /// resumed run, the searches for copies of the version that the interrupted process made
    /// are made again first (its material is gone afterwards).
    pub(super) fn retire(&self, key: &str, version: u64) -> Result<StepOutcome, StepError> {
        let mut found = Vec::new();
        for step in &self.recheck_copies {
            if let crate::graph::Step::FindCopies {
                device,
                key: k,
                version: v,
                slots,
            } = step
            {
                if k == key && *v == version {
                    let o = self.find_copies(device, key, version, slots)?;
                    if o.outcome.contains(" opens with ") {
                        found.push(format!("{device}: {}", o.outcome));
                    }
                }
            }
        }
        let (kms, name, _) = self.key_ctx(key)?;
        kms.retire(&name, version)?;
        StepOutcome::done(if found.is_empty() {
            format!("retired {key} v{version}")
        } else {
            format!(
                "retired {key} v{version}; first searched again for copies: {}",
                found.join("; ")
            )
        })
    }
}
