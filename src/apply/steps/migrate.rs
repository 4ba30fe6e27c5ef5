//! Migration steps (docs/architecture.md, "Migration is planned from the records"): copy a
//! key's current version into the KMS the plan now names, destroy it in the KMS it moved from
//! once every device verified the copy, and re-record each keyslot.
//!
//! Every step checks that the plan still puts the key where the journaled step moves it: a run
//! interrupted during a move is finished only towards the journaled destination.

use super::{Exec, StepError, StepOutcome};
use crate::graph::{Step, VersionRef};
use crate::kms::Kms;
use crate::world::SlotRecord;

impl<'a> Exec<'a> {
    /// The KMS (and name there) a migration step moves `key` to, which must still be where the
    /// plan puts the key.
    fn destination(
        &self,
        key: &str,
        (to_kms, to_name): (&str, &str),
    ) -> Result<(&'a dyn Kms, String), StepError> {
        let (kms, name, _) = self.key_ctx(key)?;
        let planned = self.entry(key);
        if planned.as_ref().map(|(k, n)| (k.as_str(), n.as_str())) != Some((to_kms, to_name)) {
            let (k, n) = planned.unwrap_or_default();
            return Err(StepError::Drift(format!(
                "this run moves {key} to KMS {to_kms} ({to_name}), but the plan now puts it in KMS {k} ({n}); nothing more was changed. Put the key back in KMS {to_kms} in the plan and run `keyplan apply` to finish the move, then change the plan"
            )));
        }
        Ok((kms, name))
    }

    /// The KMS instance `from_kms` a key of the plan moves from.
    fn origin(&self, key: &str, from_kms: &str) -> Result<&'a dyn Kms, StepError> {
        let world: &'a crate::world::World = self.world;
        world
            .kms
            .get(from_kms)
            .map(|k| k.as_ref())
            .ok_or_else(|| StepError::Plan(format!("KMS {from_kms:?}, which key {key} moves from, is no longer in the plan; restore its definition to finish the migration")))
    }

    /// The two KMSs a `copy` or `destroy origin` step works on: the destination (which must
    /// still be where the plan puts the key, and must not be the origin) and the origin.
    fn endpoints(&self, m: &Move<'_>) -> Result<Endpoints<'a>, StepError> {
        let dest = self.destination(m.key, (m.to_kms, m.to_name))?;
        if (m.to_kms, m.to_name) == (m.from_kms, m.from_name) {
            return Err(StepError::Refused(format!(
                "refusing to {} {} in KMS {} ({}): it is the KMS the key moves to",
                m.op, m.key, m.from_kms, m.from_name
            )));
        }
        Ok((dest, self.origin(m.key, m.from_kms)?))
    }

    /// `copy`: `version` of the key from the KMS it moves from becomes its current version in
    /// the new KMS (a copy an earlier run made is reused); the number it got there is this run's
    /// staged version of the key.
    pub(super) fn migrate_copy(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let m = Move::of(step)?;
        let ((kms, name), old) = self.endpoints(&m)?;
        let (v, what) = copy(kms, &name, old, (m.key, m.from_kms, m.from_name, m.version))?;
        self.staged_outcome(m.key, v, what)
    }

    /// `destroy origin`: destroys the key in the KMS it moved from (compare-and-swap on
    /// `version` being current there), but only when the destination demonstrably holds it as
    /// its current version.
    ///
    /// The copy an earlier move kept (`kept`) is destroyed without a destination check: the
    /// move is done, and the plan's KMS may have rotated the key since; it is refused only when
    /// the plan now puts the key in that very entry (the live key). Either way the entry of
    /// `<state_dir>/kept.json` naming it is dropped after the destroy: a run killed in between
    /// destroys again (nothing left: a no-op) and then drops it.
    pub(super) fn destroy_origin(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let m = Move::of(step)?;
        if m.kept {
            return self.destroy_kept(&m);
        }
        let ((kms, name), old) = self.endpoints(&m)?;
        let (key, from_kms, from_name, version) = (m.key, m.from_kms, m.from_name, m.version);
        let old_st = old.read(from_name)?;
        if old_st.current == Some(version) {
            let src = old.get(from_name, version)?;
            let st = kms.read(&name)?;
            let held = match st.current {
                Some(c) => kms.get(&name, c)?.expose() == src.expose(),
                None => false,
            };
            if !held {
                return Err(StepError::Refused(format!(
                    "not destroying {key} v{version} in KMS {from_kms}: {} does not hold it as its current version; nothing was destroyed. Run `keyplan plan` to see the state",
                    kms.describe()
                )));
            }
        }
        old.destroy_key(from_name, version)?;
        self.forget_kept(&m)?;
        StepOutcome::done(format!("destroyed {key} in KMS {from_kms}"))
    }

    /// The `kept` form of [`Self::destroy_origin`].
    fn destroy_kept(&self, m: &Move<'_>) -> Result<StepOutcome, StepError> {
        if self
            .entry(m.key)
            .as_ref()
            .map(|(k, n)| (k.as_str(), n.as_str()))
            == Some((m.from_kms, m.from_name))
        {
            return Err(StepError::Drift(format!(
                "not destroying {} in KMS {} ({}): the plan now puts the key there, so it is the live key; nothing was destroyed. Run `keyplan apply` again: it forgets the kept copy instead",
                m.key, m.from_kms, m.from_name
            )));
        }
        let old = self.origin(m.key, m.from_kms)?;
        old.destroy_key(m.from_name, m.version)?;
        self.forget_kept(m)?;
        StepOutcome::done(format!(
            "destroyed {} in KMS {} ({}), which no device needs any more",
            m.key, m.from_kms, m.from_name
        ))
    }

    /// Drops the entry of `<state_dir>/kept.json` naming the entry `m` destroyed.
    fn forget_kept(&self, m: &Move<'_>) -> Result<(), StepError> {
        super::failpoint("kept.before_forget")?;
        crate::world::kept::forget(&self.plan.state_dir, m.key, m.from_kms, m.from_name).map_err(
            |e| {
                StepError::State(format!(
                    "{} was destroyed in KMS {}, but {e}; run `keyplan apply` again once it can be written (destroying again is harmless)",
                    m.key, m.from_kms
                ))
            },
        )
    }

    /// `re-record`: records that `slot` of `device` holds `version` of `key` in the KMS it
    /// moved to, replacing the record naming the old KMS without ever leaving none.
    pub(super) fn rerecord(
        &self,
        device: &str,
        key: &str,
        slot: u32,
        version: VersionRef,
        to: (&str, &str),
    ) -> Result<StepOutcome, StepError> {
        self.destination(key, to)?;
        let path = self.device_path(device)?;
        let v = self.resolve(key, version)?;
        let header = self.header(&path)?;
        let ks = header.keyslots.get(&slot).ok_or_else(|| {
            StepError::Drift(format!(
                "keyslot {slot} of device {device} is empty; expected {key} v{v}"
            ))
        })?;
        // The keyslot is the same: the PBKDF settings it was added with stay recorded (an
        // unreadable record only loses them, so its PBKDF is judged by its header alone).
        let pbkdf = self
            .world
            .records
            .read(&header)
            .ok()
            .and_then(|recs| recs.into_iter().find(|r| r.slot == slot))
            .and_then(|r| r.record.pbkdf);
        let record = SlotRecord {
            key: key.to_string(),
            version: v,
            salt: ks.salt.clone(),
            entry: self.entry(key),
            pbkdf,
        };
        self.world.records.replace(&path, &header, slot, &record)?;
        StepOutcome::done(format!("recorded keyslot {slot} as {key} v{v}"))
    }
}

/// The destination KMS with the key's name there, and the origin KMS, of a migration step.
type Endpoints<'a> = ((&'a dyn Kms, String), &'a dyn Kms);

/// The fields of a `copy` or `destroy origin` step.
struct Move<'s> {
    /// `move` or `destroy`, for the refusal of a move onto itself.
    op: &'static str,
    key: &'s str,
    from_kms: &'s str,
    from_name: &'s str,
    version: u64,
    to_kms: &'s str,
    to_name: &'s str,
    /// A kept copy's destroy (`Step::DestroyOrigin::kept`).
    kept: bool,
}

impl<'s> Move<'s> {
    fn of(step: &'s Step) -> Result<Move<'s>, StepError> {
        let (op, key, from_kms, from_name, version, to_kms, to_name, kept) = match step {
            Step::MigrateCopy {
                key,
                from_kms,
                from_name,
                version,
                to_kms,
                to_name,
            } => (
                "move", key, from_kms, from_name, version, to_kms, to_name, false,
            ),
            Step::DestroyOrigin {
                key,
                from_kms,
                from_name,
                version,
                to_kms,
                to_name,
                kept,
            } => (
                "destroy", key, from_kms, from_name, version, to_kms, to_name, *kept,
            ),
            _ => return Err(StepError::Internal(format!("not a migration step: {step}"))),
        };
        Ok(Move {
            op,
            key,
            from_kms,
            from_name,
            version: *version,
            to_kms,
            to_name,
            kept,
        })
    }
}

/// Copies `version` of `key` from `old` (as `from_name` in KMS instance `from_kms`) into `kms`
/// (as `name`) as its current version, or finds the copy an earlier run made. Returns the
/// copy's version number there and the outcome text.
fn copy(
    kms: &dyn Kms,
    name: &str,
    old: &dyn Kms,
    (key, from_kms, from_name, version): (&str, &str, &str, u64),
) -> Result<(u64, String), StepError> {
    let st = kms.read(name)?;
    let old_st = old.read(from_name)?;
    let source = if old_st.current == Some(version) {
        Some(old.get(from_name, version)?)
    } else {
        None
    };
    if let Some(c) = st.current {
        return match &source {
            Some(src) if kms.get(name, c)?.expose() == src.expose() => {
                Ok((c, format!("{key} v{version} already copied (v{c})")))
            }
            Some(_) => Err(StepError::Refused(format!(
                "{} already holds a current version of {name:?} (v{c}) that is not {key} v{version} from KMS {from_kms}; nothing was overwritten. Give the key another `name`, or remove that entry from the KMS",
                kms.describe()
            ))),
            // The old KMS no longer holds it: an earlier run copied and destroyed it; the
            // verify steps that follow test the copy on every device.
            None => Ok((c, format!("{key} already moved (v{c})"))),
        };
    }
    let Some(src) = source else {
        return Err(StepError::Drift(format!(
            "{key} v{version} is no longer current in KMS {from_kms}, and {} holds no copy; nothing was changed. Run `keyplan plan` to see the new state",
            kms.describe()
        )));
    };
    let v = match st.pending {
        Some(p) if kms.get(name, p)?.expose() == src.expose() => p,
        Some(p) => {
            return Err(StepError::Refused(format!(
                "{} holds a pending version v{p} of {name:?} that is not {key} v{version} from KMS {from_kms}; nothing was overwritten. Remove it from the KMS, then run `keyplan apply` again",
                kms.describe()
            )))
        }
        None => kms.stage(name, &src, version)?,
    };
    kms.commit(name, None, v)?;
    let back = kms.get(name, v)?;
    let st = kms.read(name)?;
    if back.expose() != src.expose() || st.current != Some(v) {
        return Err(StepError::Refused(format!(
            "{}: the copy of {key} v{version} does not read back as the current version v{v}; KMS {from_kms} still holds the key, nothing else was changed",
            kms.describe()
        )));
    }
    Ok((
        v,
        format!("copied {key} v{version} from KMS {from_kms} as v{v}"),
    ))
}
