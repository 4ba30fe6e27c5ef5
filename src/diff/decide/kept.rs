//! The copies earlier moves kept in the KMS a key left (`<state_dir>/kept.json`,
//! [`crate::observe::Observed::kept`]): destroyed once no device keyplan knows holds a version
//! there (docs/architecture.md, "Migration is planned from the records").

use super::Planner;
use crate::diff::{KeyAction, KeyChange, ReasonCode};
use crate::graph::Step;
use crate::kms::VersionState;
use crate::observe::Kept;
use crate::world::RecordStatus;

/// What becomes of one kept copy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Revisit {
    /// The plan puts the key (or another key) in that very entry: it is a live key; `apply`
    /// forgets the kept copy, nothing is destroyed ([`crate::world::kept::is_live`]).
    Live,
    /// A move from that entry is under way (plan devices' records still name it): the move
    /// decides, with its own note.
    Moving,
    /// Devices keyplan knows hold it (`"id keyslot N (vM)"`, with whether each left the
    /// plan), or devices it knows cannot be read (`"id (path: why)"`): kept.
    Held(Vec<String>, Vec<String>),
    /// Nothing holds it, but its KMS is no longer in the plan: it cannot be destroyed.
    KmsGone,
    /// Nothing holds it, but its KMS holds a pending version of it (not this move's): left.
    Pending(u64),
    /// No device of this plan holds it, but the KMS records other holders of the entry
    /// (another plan, another node: their devices are out of sight; this plan's own records,
    /// also from before its state directory moved, [`crate::observe::Observed::former_holders`], are not
    /// others): left.
    OtherHolders(Vec<String>),
    /// Nothing holds it: destroy it, with `version` expected current there (or none).
    Destroy(Option<u64>),
}

impl Planner<'_> {
    /// For every copy an earlier move kept: destroy it in its KMS when no device keyplan knows
    /// holds a version there (no valid record on a plan device or a readable former device
    /// names the entry, and no device keyplan knows is unreadable), else say why it stays.
    /// Never the entry the plan puts the key in: that is the live key.
    pub(super) fn revisit_kept(&mut self) {
        let obs = self.obs;
        for kept in &obs.kept {
            let decision = self.revisit(kept);
            self.revisit_step(kept, decision);
        }
    }

    /// A plan key placed in an entry that an earlier move kept for another key's devices
    /// outside that move: refused (the entry holds the other key's versions, which those
    /// devices still open with; taking it over would give this key that key's material).
    pub(super) fn refuse_kept_entries(&mut self) {
        let obs = self.obs;
        for kept in &obs.kept {
            let c = &kept.copy;
            for (id, k) in &self.plan.keys {
                if *id == c.key || k.kms != c.kms || k.name != c.name {
                    continue;
                }
                self.refuse_key(id, format!(
                    "key {id}: the plan puts it in KMS {:?} as {:?}, but that entry is the copy of key {} an earlier move kept there for devices outside the move (v{}, remembered in {}). Nothing was changed: give key {id} another `name:` (keys.{id}.name in the plan file); the kept copy is destroyed by `keyplan apply` once no device keyplan knows holds it",
                    c.kms,
                    c.name,
                    c.key,
                    c.versions.iter().map(u64::to_string).collect::<Vec<_>>().join(", v"),
                    self.plan.state_dir.join(crate::world::kept::KEPT_FILE).display(),
                ));
            }
        }
    }

    /// The copy an earlier move of `key` kept in `(kms, name)`, if any.
    pub(super) fn kept_copy_of(&self, key: &str, kms: &str, name: &str) -> Option<&Kept> {
        self.obs.kept.iter().find(|k| k.copy.is(key, kms, name))
    }

    /// The decision for one kept copy (pure: see [`Revisit`]).
    fn revisit(&self, kept: &Kept) -> Revisit {
        let c = &kept.copy;
        if crate::world::kept::is_live(self.plan, c) {
            return Revisit::Live;
        }
        let moving = self.obs.origins.get(&c.key).is_some_and(|os| {
            os.iter()
                .any(|o| o.kms == c.kms && o.name == c.name && o.state.is_some())
        });
        if moving {
            return Revisit::Moving;
        }
        let entry = Some((c.kms.clone(), c.name.clone()));
        let mut held = Vec::new();
        for (id, d) in self.obs.devices.iter().chain(self.obs.former.iter()) {
            let former = !self.obs.devices.contains_key(id);
            for r in d
                .records
                .iter()
                .filter(|r| r.status == RecordStatus::Valid && r.record.entry == entry)
            {
                held.push(format!(
                    "{id} keyslot {} (v{}){}",
                    r.slot,
                    r.record.version,
                    if former {
                        " (no longer in the plan)"
                    } else {
                        ""
                    }
                ));
            }
        }
        let unknown: Vec<String> = self
            .obs
            .unknown_holders()
            .iter()
            .map(|(id, path, why)| format!("{id} ({}: {why})", path.display()))
            .collect();
        if !held.is_empty() || !unknown.is_empty() {
            return Revisit::Held(held, unknown);
        }
        let Some(st) = &kept.state else {
            return Revisit::KmsGone;
        };
        let others: Vec<String> = st
            .holders
            .keys()
            .filter(|h| {
                let holder = crate::kms::book::parse_vote(h).map_or(h.as_str(), |(h, _)| h);
                holder != self.me && !self.obs.former_holders.contains_key(holder)
            })
            .cloned()
            .collect();
        if !others.is_empty() {
            return Revisit::OtherHolders(others);
        }
        match st.pending {
            Some(p) => Revisit::Pending(p),
            None => Revisit::Destroy(st.current),
        }
    }

    /// The note, or the change and step, of `decision` for `kept`.
    fn revisit_step(&mut self, kept: &Kept, decision: Revisit) {
        let c = &kept.copy;
        let versions = c
            .versions
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", v");
        let what = format!(
            "{}: KMS {} keeps v{versions} (as {:?})",
            c.key, c.kms, c.name
        );
        let note = match decision {
            Revisit::Moving => return,
            Revisit::Live => format!(
                "{what}, kept there when the key moved away, and the plan puts the key there again: that entry is the live key now, nothing is destroyed; `keyplan apply` forgets the kept copy"
            ),
            Revisit::Held(held, unknown) => {
                let mut why = Vec::new();
                if !held.is_empty() {
                    why.push(format!("for {}", held.join(", ")));
                }
                if !unknown.is_empty() {
                    why.push(format!(
                        "while device(s) keyplan knows cannot be read, so nobody knows what they hold: {}",
                        unknown.join("; ")
                    ));
                }
                format!(
                    "{what} {}; keyplan destroys it there once no device keyplan knows holds it (a device gone for good: `keyplan device forget ID`)",
                    why.join(", ")
                )
            }
            Revisit::KmsGone => format!(
                "{what}, kept there when the key moved away; no device keyplan knows holds it any more, but KMS {} is no longer in the plan, so keyplan cannot destroy it. Put the definition of KMS {} back in the plan for one `keyplan apply`, which destroys it; or remove it with that KMS's own tools and then delete its entry from {}",
                c.kms,
                c.kms,
                self.plan
                    .state_dir
                    .join(crate::world::kept::KEPT_FILE)
                    .display()
            ),
            Revisit::Pending(p) => format!(
                "{what}, kept there when the key moved away; no device keyplan knows holds it any more, but KMS {} holds a pending v{p} of it, which keyplan did not stage: not destroyed. Remove that pending version there, then run `keyplan apply`",
                c.kms
            ),
            Revisit::OtherHolders(others) => format!(
                "{what}, kept there when the key moved away; no device of this plan holds it any more, but KMS {} records other holders of it ({}), whose devices keyplan cannot see: not destroyed. Once none of them needs it, remove the entry (and their records) with that KMS's own tools, then delete its entry from {}",
                c.kms,
                others.join(", "),
                self.plan
                    .state_dir
                    .join(crate::world::kept::KEPT_FILE)
                    .display()
            ),
            Revisit::Destroy(current) => {
                self.destroy_kept(kept, current);
                return;
            }
        };
        self.notes.push(note);
    }

    /// The change and step destroying kept copy `kept` (`current` there, if any).
    fn destroy_kept(&mut self, kept: &Kept, current: Option<u64>) {
        let c = &kept.copy;
        let held: Vec<u64> = kept
            .state
            .iter()
            .flat_map(|st| st.versions.values())
            .filter(|v| v.state != VersionState::Retired)
            .map(|v| v.version)
            .collect();
        let live = self.plan.keys.get(&c.key);
        let (to_kms, to_name) = live
            .map(|k| (k.kms.clone(), k.name.clone()))
            .unwrap_or_default();
        self.keys.push(KeyChange {
            key: c.key.clone(),
            kms: c.kms.clone(),
            action: KeyAction::DestroyKept,
            from: current,
            to: current.unwrap_or(0),
            reason_code: ReasonCode::KeptCopyUnneeded,
            reason: format!(
                "kept as {:?} for devices outside the move to {} since {}; no device keyplan knows holds it any more",
                c.name,
                if live.is_some() {
                    format!("KMS {to_kms}")
                } else {
                    "another KMS (the key is no longer in the plan)".to_string()
                },
                crate::clock::rfc3339(c.since)
            ),
            retire: held,
            from_kms: Some(c.kms.clone()),
            copy_checks: Vec::new(),
            kept_in_origin: Vec::new(),
        });
        self.g.add(Step::DestroyOrigin {
            key: c.key.clone(),
            from_kms: c.kms.clone(),
            from_name: c.name.clone(),
            version: current.unwrap_or(0),
            to_kms,
            to_name,
            kept: true,
        });
    }
}
