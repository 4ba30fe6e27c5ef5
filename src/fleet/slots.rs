//! Rollout slots: a counting semaphore of `max_concurrent_nodes` Kubernetes Leases
//! (`coordination.k8s.io/v1`, <https://kubernetes.io/docs/concepts/architecture/leases/>),
//! named `keyplan-rollout-0` .. `keyplan-rollout-<N-1>` in the fleet namespace. A node that has
//! changes to apply holds one while its run lasts; so at most N nodes apply at once.
//!
//! - **Holding** a slot means being its Lease's `spec.holderIdentity` (the node name) with a
//!   `spec.renewTime` less than `spec.leaseDurationSeconds` old.
//! - **Acquiring** goes through the slots in order: one this node already holds (a restarted
//!   agent recognises its own slot) is renewed and kept; otherwise the first free one is
//!   taken: absent (created), released (no holder) or expired (its holder stopped renewing: a
//!   node gone for good), bumping `leaseTransitions` on a takeover.
//! - **Every write is conditional**: creating a Lease that exists is 409 `AlreadyExists`, and a
//!   `PUT` carries the `resourceVersion` read just before (409 `Conflict` when someone wrote in
//!   between). A 409 means another node won that slot; the next one is tried.
//! - **Renewing** is a conditional `PUT` of `renewTime`; a renewal that finds another holder
//!   or a conflict means the slot was lost ([`SlotError::Lost`]), and the holder must stop
//!   starting new steps.
//! - **Releasing** clears the holder (conditional as well), so the next node need not wait for
//!   the expiry.
//!
//! Times are the local clock's; expiry compares this host's clock with the renewer's, so
//! clocks must agree to within a small part of the Lease duration (as for Kubernetes' own
//! leader election).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

use crate::runtime::block_on;

/// Prefix of the slots' Lease names; slot `i` is `keyplan-rollout-<i>`.
pub const SLOT_PREFIX: &str = "keyplan-rollout-";

/// Why a slot operation failed. Messages name the Lease and the namespace.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// The API server refused (401/403): the service account lacks the Lease permissions of
    /// the deploy manifests' Role.
    #[error("rollout slots in namespace {namespace}: {detail}; grant keyplan's service account create, update, list and watch on leases (deploy/kubernetes/rbac.yaml)")]
    Denied {
        /// The fleet namespace.
        namespace: String,
        /// What was refused.
        detail: String,
    },
    /// The API server could not be reached or answered unexpectedly; nothing is known to be
    /// held.
    #[error("rollout slots in namespace {namespace}: {detail}")]
    Unavailable {
        /// The fleet namespace.
        namespace: String,
        /// What failed.
        detail: String,
    },
    /// The slot is no longer this node's: another node holds it (it expired, or someone wrote
    /// the Lease), or a conditional write lost.
    #[error("rollout slot {lease} in namespace {namespace} is no longer held by {node}: {detail}")]
    Lost {
        /// The Lease name.
        lease: String,
        /// The fleet namespace.
        namespace: String,
        /// This node.
        node: String,
        /// What was seen.
        detail: String,
    },
}

/// A slot this node holds: its Lease as last written.
#[derive(Debug, Clone)]
pub struct Slot {
    /// Index (0 .. max_concurrent_nodes).
    pub index: u32,
    /// Lease name.
    pub name: String,
    /// Boxed: a Lease is large next to [`Acquired::Busy`].
    lease: Box<Lease>,
}

/// The slots as seen at one moment ([`Slots::view`]).
#[derive(Debug, Default)]
pub struct View {
    /// The slot this node holds, with its Lease.
    pub mine: Option<(u32, Lease)>,
    /// The slots another node may take: absent (`None`), released or expired.
    pub free: Vec<(u32, Option<Lease>)>,
    /// The live holders of the other slots, by slot.
    pub holders: Vec<String>,
}

/// The outcome of [`Slots::acquire`].
#[derive(Debug)]
pub enum Acquired {
    /// This node holds the slot now.
    Held(Slot),
    /// Every slot is held by another node: their names, by slot.
    Busy(Vec<String>),
}

/// The rollout slots of one fleet namespace, as seen by node `holder`.
#[derive(Clone)]
pub struct Slots {
    api: Api<Lease>,
    namespace: String,
    count: u32,
    holder: String,
    duration: Duration,
}

impl Slots {
    /// The `count` slots (`settings.fleet.max_concurrent_nodes`, at least 1) in `namespace`,
    /// acquired as node `holder` for `duration` (whole seconds, at least 1) per renewal.
    /// Contacts nothing.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        count: u32,
        holder: &str,
        duration: Duration,
    ) -> Slots {
        Slots {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            count: count.max(1),
            holder: holder.to_string(),
            duration: duration.max(Duration::from_secs(1)),
        }
    }

    /// Takes a slot for this node, or says who holds them all (one `get` per slot, then the
    /// writes of [`Slots::take`]). A slot this node already holds is renewed and returned
    /// first.
    ///
    /// Errors: [`SlotError::Denied`], [`SlotError::Unavailable`]; a lost race on one slot is
    /// not an error (the next slot is tried).
    pub fn acquire(&self) -> Result<Acquired, SlotError> {
        let mut leases = BTreeMap::new();
        for i in 0..self.count {
            if let Some(l) = self.get(&slot_name(i))? {
                leases.insert(slot_name(i), l);
            }
        }
        let view = self.view(&leases);
        let mut holders = view.holders;
        for (i, lease) in view
            .mine
            .into_iter()
            .map(|(i, l)| (i, Some(l)))
            .chain(view.free)
        {
            match self.take(i, lease)? {
                Some(slot) => return Ok(Acquired::Held(slot)),
                None => holders.push("(another node, just now)".to_string()),
            }
        }
        Ok(Acquired::Busy(holders))
    }

    /// The slots as `leases` (by name: a watch's copy, or what was just read) show them now.
    /// Reads nothing.
    pub fn view(&self, leases: &BTreeMap<String, Lease>) -> View {
        let now = Timestamp::now();
        let mut view = View::default();
        for i in 0..self.count {
            match leases.get(&slot_name(i)) {
                None => view.free.push((i, None)),
                Some(l) if holder_of(l) == Some(self.holder.as_str()) && view.mine.is_none() => {
                    view.mine = Some((i, l.clone()));
                }
                Some(l) if holder_of(l).is_none() || expired(l, now) => {
                    view.free.push((i, Some(l.clone())));
                }
                Some(l) => view
                    .holders
                    .push(holder_of(l).unwrap_or_default().to_string()),
            }
        }
        view
    }

    /// Takes slot `i` for this node, its Lease being `lease` as last seen: renews it when this
    /// node holds it (a restarted agent's own slot), creates it when absent, takes it over
    /// when free or expired. Every write is conditional on `lease`'s `resourceVersion`:
    /// `None` when another write came first (409), or when the Lease names another live
    /// holder.
    ///
    /// Errors: [`SlotError::Denied`], [`SlotError::Unavailable`].
    pub fn take(&self, i: u32, lease: Option<Lease>) -> Result<Option<Slot>, SlotError> {
        let name = slot_name(i);
        let taken = match lease {
            None => self.create(i)?,
            Some(l) if holder_of(&l) == Some(self.holder.as_str()) => {
                let mut slot = Slot {
                    index: i,
                    name: name.clone(),
                    lease: Box::new(l),
                };
                match self.renew(&mut slot) {
                    Ok(()) => return Ok(Some(slot)),
                    Err(SlotError::Lost { .. }) => None,
                    Err(e) => return Err(e),
                }
            }
            Some(l) if holder_of(&l).is_none() || expired(&l, Timestamp::now()) => {
                self.take_over(i, l)?
            }
            Some(_) => None,
        };
        if taken.is_some() {
            tracing::info!(node = %self.holder, lease = %name, "took rollout slot {name}");
        }
        Ok(taken)
    }

    /// Renews `slot` (a conditional `PUT` of `renewTime`).
    ///
    /// Errors: [`SlotError::Lost`] when the Lease has another holder or changed since it was
    /// last written by this node; [`SlotError::Denied`], [`SlotError::Unavailable`].
    pub fn renew(&self, slot: &mut Slot) -> Result<(), SlotError> {
        let mut lease = (*slot.lease).clone();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.holder.as_str()) {
            return Err(self.lost(&slot.name, "its Lease names another holder"));
        }
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        spec.lease_duration_seconds = Some(self.duration_seconds());
        match self.replace(&slot.name, &lease)? {
            Some(l) => {
                *slot.lease = l;
                Ok(())
            }
            None => Err(self.lost(
                &slot.name,
                "its Lease was changed by someone else (409 Conflict)",
            )),
        }
    }

    /// Gives `slot` back: clears the holder (conditional), so another node may take it at
    /// once. A slot already lost is not an error.
    ///
    /// Errors: [`SlotError::Denied`], [`SlotError::Unavailable`] (the slot then expires by
    /// itself after its duration).
    pub fn release(&self, slot: Slot) -> Result<(), SlotError> {
        let mut lease = *slot.lease;
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = None;
            spec.acquire_time = None;
        }
        self.replace(&slot.name, &lease)?;
        tracing::info!(node = %self.holder, lease = %slot.name, "released rollout slot {}", slot.name);
        Ok(())
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// A fresh spec naming this node as holder, acquired and renewed now.
    fn held_spec(&self, transitions: i32) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.holder.clone()),
            lease_duration_seconds: Some(self.duration_seconds()),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// Creates slot `i` held by this node; `None` when it exists already (409).
    fn create(&self, i: u32) -> Result<Option<Slot>, SlotError> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(slot_name(i)),
                labels: Some(
                    [("app.kubernetes.io/name".to_string(), "keyplan".to_string())].into(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(self.held_spec(0)),
        };
        let what = format!("creating Lease {}", slot_name(i));
        match self.call(&what, self.api.create(&PostParams::default(), &lease))? {
            Ok(l) => Ok(Some(Slot {
                index: i,
                name: slot_name(i),
                lease: Box::new(l),
            })),
            Err(409) => Ok(None),
            Err(code) => Err(self.unexpected(&what, code)),
        }
    }

    /// Takes slot `i` (its Lease `old`, free or expired) for this node; `None` when another
    /// write came first (409).
    fn take_over(&self, i: u32, old: Lease) -> Result<Option<Slot>, SlotError> {
        let transitions = old
            .spec
            .as_ref()
            .and_then(|s| s.lease_transitions)
            .unwrap_or(0)
            .saturating_add(1);
        if let Some(prev) = holder_of(&old) {
            tracing::warn!(node = %self.holder, lease = %slot_name(i), "taking over rollout slot {} from {prev}, whose lease expired", slot_name(i));
        }
        let lease = Lease {
            metadata: old.metadata,
            spec: Some(self.held_spec(transitions)),
        };
        Ok(self.replace(&slot_name(i), &lease)?.map(|l| Slot {
            index: i,
            name: slot_name(i),
            lease: Box::new(l),
        }))
    }

    /// `GET` of Lease `name`; `None` when absent.
    fn get(&self, name: &str) -> Result<Option<Lease>, SlotError> {
        let what = format!("reading Lease {name}");
        match self.call(&what, self.api.get(name))? {
            Ok(l) => Ok(Some(l)),
            Err(404) => Ok(None),
            Err(code) => Err(self.unexpected(&what, code)),
        }
    }

    /// Conditional `PUT` of `lease` (its `resourceVersion`); `None` on 409.
    fn replace(&self, name: &str, lease: &Lease) -> Result<Option<Lease>, SlotError> {
        let what = format!("updating Lease {name}");
        match self.call(&what, self.api.replace(name, &PostParams::default(), lease))? {
            Ok(l) => Ok(Some(l)),
            Err(409) => Ok(None),
            Err(code) => Err(self.unexpected(&what, code)),
        }
    }

    /// Runs one request: `Ok(Ok(value))`, `Ok(Err(code))` for an API status the caller
    /// sorts, or the error for refusals (401/403) and transport failures.
    fn call<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, u16>, SlotError> {
        let out = block_on(&self.namespace, fut).map_err(|e| SlotError::Unavailable {
            namespace: self.namespace.clone(),
            detail: format!("{what}: {e}"),
        })?;
        match out {
            Ok(v) => Ok(Ok(v)),
            Err(kube::Error::Api(s)) if s.code == 401 || s.code == 403 => Err(SlotError::Denied {
                namespace: self.namespace.clone(),
                detail: format!("{what}: HTTP {}: {}", s.code, s.message),
            }),
            Err(kube::Error::Api(s)) => Ok(Err(s.code)),
            Err(e) => Err(SlotError::Unavailable {
                namespace: self.namespace.clone(),
                detail: format!("{what}: {e}"),
            }),
        }
    }

    fn unexpected(&self, what: &str, code: u16) -> SlotError {
        SlotError::Unavailable {
            namespace: self.namespace.clone(),
            detail: format!("{what}: unexpected HTTP {code}"),
        }
    }

    fn lost(&self, lease: &str, detail: &str) -> SlotError {
        SlotError::Lost {
            lease: lease.to_string(),
            namespace: self.namespace.clone(),
            node: self.holder.clone(),
            detail: detail.to_string(),
        }
    }
}

/// The Lease name of slot `i`.
pub fn slot_name(i: u32) -> String {
    format!("{SLOT_PREFIX}{i}")
}

/// The holder a Lease names, if any (an empty name counts as none).
fn holder_of(l: &Lease) -> Option<&str> {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// Whether the Lease's holder stopped renewing: no renew time, or renew time plus duration
/// before `now`.
fn expired(l: &Lease, now: Timestamp) -> bool {
    let Some(spec) = l.spec.as_ref() else {
        return true;
    };
    let (Some(renewed), Some(secs)) = (spec.renew_time.as_ref(), spec.lease_duration_seconds)
    else {
        return true;
    };
    renewed.0.as_second().saturating_add(i64::from(secs)) < now.as_second()
}

/// The holder of Lease `l` at `now` (Unix seconds) when it is held and not expired.
pub fn live_holder(l: &Lease, now: u64) -> Option<String> {
    let now =
        Timestamp::from_second(i64::try_from(now).unwrap_or(i64::MAX)).unwrap_or(Timestamp::now());
    holder_of(l)
        .filter(|_| !expired(l, now))
        .map(str::to_string)
}
