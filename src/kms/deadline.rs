//! Deadlines of KMS calls (issue 29: a KMS that accepted the connection and never answered
//! made `status` take 370 s). docs/monitoring.md, "Deadlines", is the operators' account.
//!
//! - **One call, one deadline.** Every call of the [`Kms`] trait (a read, a get, a stage, a
//!   credentials lookup, ...) ends within its KMS instance's `timeout` (the plan's
//!   `kms.<name>.timeout`, default [`super::REQUEST_TIMEOUT`]), all its requests and retries
//!   included. [`Guarded`] sets the deadline on the calling thread ([`within`]); providers ask
//!   [`remaining`] before each request and bound it by that: the HTTP clients' futures with a
//!   `tokio` timeout, the KMIP socket's connect, reads and writes, the exec helper's run (its
//!   process group is killed when it passes). [`super::with_retries`] retries only while the
//!   deadline leaves room for the next attempt. A call whose deadline passed fails with
//!   [`KmsError::Timeout`].
//! - **A silent KMS is asked once.** After a call of an instance timed out, the same command
//!   asks that instance nothing more: its later calls fail at once with the same error. So a
//!   KMS that never answers costs a command one `timeout`, not one per key and retry.
//! - **Read-only commands have a budget.** `plan`, `status`, `verify` and `key get` (and the
//!   agent's status summary) call [`WaitPolicy::bound`] on their start: from then on each
//!   instance's calls together may wait at most its `timeout` ([`Guarded`] counts the time
//!   spent in them), so a KMS that answers each call just in time cannot stretch a read-only
//!   command either. `apply` has no budget (a rotation of many devices makes many calls), only
//!   the per-call deadline and the silent-KMS rule.
//!
//! The deadline travels in a thread-local rather than through every provider function: the
//! providers' internal helpers (dozens of request functions) need only ask [`remaining`], and a
//! provider used outside a [`Guarded`] (the provider tests) falls back to
//! [`super::REQUEST_TIMEOUT`] per request.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Credential, KeyState, Kms, KmsError};
use crate::secret::Passphrase;

pub use crate::spec::{MAX_TIMEOUT, MIN_TIMEOUT};

/// The deadline of the KMS call running on this thread, and the limit it came from.
#[derive(Debug, Clone, Copy)]
struct Current {
    until: Instant,
    limit: Duration,
}

thread_local! {
    static CURRENT: Cell<Option<Current>> = const { Cell::new(None) };
}

/// Puts the outer deadline back when a [`within`] scope ends (also on a panic).
struct Restore(Option<Current>);

impl Drop for Restore {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

/// Runs `op` with the KMS call deadline `until` on this thread; `limit` is the configured
/// time it stands for (named in messages). A deadline already set on this thread that ends
/// earlier stays in force (a call inside a call never gets more time).
pub fn within<T>(until: Instant, limit: Duration, op: impl FnOnce() -> T) -> T {
    let outer = CURRENT.with(Cell::get);
    let here = match outer {
        Some(o) if o.until <= until => o,
        _ => Current { until, limit },
    };
    CURRENT.with(|c| c.set(Some(here)));
    let _restore = Restore(outer);
    op()
}

/// Time left before the deadline of the KMS call running on this thread (zero once it
/// passed); [`super::REQUEST_TIMEOUT`] when no deadline is set (a provider used directly).
pub fn remaining() -> Duration {
    CURRENT.with(Cell::get).map_or(super::REQUEST_TIMEOUT, |c| {
        c.until.saturating_duration_since(Instant::now())
    })
}

/// The configured limit of the KMS call running on this thread, for messages (`30 s`).
pub fn limit_text() -> String {
    let limit = CURRENT
        .with(Cell::get)
        .map_or(super::REQUEST_TIMEOUT, |c| c.limit);
    seconds(limit)
}

/// `d` for messages: whole seconds (`30 s`), or milliseconds below one second.
pub fn seconds(d: Duration) -> String {
    if d >= Duration::from_secs(1) && d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else if d >= Duration::from_secs(1) {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Whether the deadline of the KMS call running on this thread leaves at least `need` (for a
/// retry after a pause of `need`); true when no deadline is set.
pub fn leaves(need: Duration) -> bool {
    CURRENT
        .with(Cell::get)
        .is_none_or(|c| Instant::now() + need < c.until)
}

/// Whether the commands of one world (one per command, or per agent cycle) are bounded:
/// shared by every [`Guarded`] client a [`crate::world::World`] opened.
#[derive(Debug, Default)]
pub struct WaitPolicy {
    /// 0: no budget (apply); otherwise the generation of the budget now in force (each
    /// [`WaitPolicy::bound`] starts a new one, so time spent before it does not count).
    generation: AtomicU64,
}

impl WaitPolicy {
    /// From now on, each KMS instance's calls together may wait at most its `timeout` (a
    /// read-only command: `plan`, `status`, `verify`, `key get`). Called again (the agent's
    /// status summary after its planning), it starts a fresh budget.
    pub fn bound(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

/// What a [`Guarded`] client remembers across calls.
#[derive(Debug, Default)]
struct GuardState {
    /// Why the instance is not asked again: a call of it timed out, or its budget is spent.
    silent: Option<String>,
    /// Under a bounded policy (read-only commands): why the instance is not asked again
    /// because a call found it unavailable (after that call's own retries), so one
    /// unreachable KMS costs one round of retries and one message per command, not one per
    /// key.
    unavailable: Option<String>,
    /// The budget generation `spent` counts for.
    generation: u64,
    /// Time spent in calls since that budget started.
    spent: Duration,
}

/// A KMS client whose every call has a deadline (see the module documentation): a call ends
/// within `timeout`, a timed-out instance is not asked again, and under a bounded
/// [`WaitPolicy`] the calls together wait at most `timeout`.
pub struct Guarded {
    inner: Box<dyn Kms>,
    timeout: Duration,
    policy: Arc<WaitPolicy>,
    state: Mutex<GuardState>,
}

impl Guarded {
    /// `inner` with calls limited to `timeout` each, budgeted by `policy`.
    pub fn new(inner: Box<dyn Kms>, timeout: Duration, policy: Arc<WaitPolicy>) -> Guarded {
        Guarded {
            inner,
            timeout,
            policy,
            state: Mutex::new(GuardState::default()),
        }
    }

    /// Runs one call of the inner client under its deadline (`what`: the operation, for
    /// messages).
    fn call<T>(
        &self,
        what: &str,
        op: impl FnOnce(&dyn Kms) -> Result<T, KmsError>,
    ) -> Result<T, KmsError> {
        self.call_marking(what, true, op)
    }

    /// [`Guarded::call`]; `marks` false for a call whose failure says nothing about the
    /// store's other operations (the credentials lookup, which an `exec` helper serves
    /// separately): its timeout or unavailability does not make the instance's later calls
    /// fail at once, so a slow optional lookup cannot stop a rotation. It still counts
    /// against the read-only budget, and is refused once the instance fell silent.
    fn call_marking<T>(
        &self,
        what: &str,
        marks: bool,
        op: impl FnOnce(&dyn Kms) -> Result<T, KmsError>,
    ) -> Result<T, KmsError> {
        let generation = self.policy.generation();
        let allowed = {
            let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(why) = &st.silent {
                return Err(KmsError::Timeout {
                    kms: self.inner.describe(),
                    detail: format!("{what}: not asked: {why}"),
                });
            }
            if let Some(why) = &st.unavailable {
                return Err(KmsError::Unavailable {
                    kms: self.inner.describe(),
                    detail: format!("{what}: not asked: {why}"),
                });
            }
            if generation == 0 {
                self.timeout
            } else {
                if st.generation != generation {
                    st.generation = generation;
                    st.spent = Duration::ZERO;
                }
                let left = self.timeout.saturating_sub(st.spent);
                if left.is_zero() {
                    let why = format!(
                        "the {} this command may wait for it in all (its `timeout`) are used up",
                        seconds(self.timeout)
                    );
                    st.silent = Some(why.clone());
                    return Err(KmsError::Timeout {
                        kms: self.inner.describe(),
                        detail: format!("{what}: not asked: {why}"),
                    });
                }
                left
            }
        };
        let started = Instant::now();
        let result = within(started + allowed, self.timeout, || op(self.inner.as_ref()));
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if generation != 0 && st.generation == generation {
            st.spent += started.elapsed();
        }
        match &result {
            _ if !marks => {}
            Err(KmsError::Timeout { detail, .. }) if st.silent.is_none() => {
                st.silent = Some(format!(
                    "it did not answer within {} earlier in this command ({detail})",
                    seconds(self.timeout)
                ));
            }
            Err(KmsError::Unavailable { .. }) if generation != 0 => {
                st.unavailable
                    .get_or_insert_with(|| "it was unavailable earlier in this command".into());
            }
            _ => {}
        }
        result
    }
}

impl Kms for Guarded {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn read(&self, name: &str) -> Result<KeyState, KmsError> {
        self.call(&format!("reading key {name:?}"), |k| k.read(name))
    }
    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        self.call(&format!("getting key {name:?} v{version}"), |k| {
            k.get(name, version)
        })
    }
    fn stage(&self, name: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        self.call(&format!("staging a version of key {name:?}"), |k| {
            k.stage(name, material, at_least)
        })
    }
    fn commit_as(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        self.call(&format!("committing key {name:?} v{pending}"), |k| {
            k.commit_as(name, expected_current, pending, holder)
        })
    }
    fn hold(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        self.call(&format!("recording a holder of key {name:?}"), |k| {
            k.hold(name, holder)
        })
    }
    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        self.call(&format!("releasing a holder of key {name:?}"), |k| {
            k.release(name, holder)
        })
    }
    fn retire(&self, name: &str, version: u64) -> Result<(), KmsError> {
        self.call(&format!("retiring key {name:?} v{version}"), |k| {
            k.retire(name, version)
        })
    }
    fn check(&self, names: &[String]) -> Result<(), KmsError> {
        self.call("checking access", |k| k.check(names))
    }
    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError> {
        self.call(&format!("destroying key {name:?}"), |k| {
            k.destroy_key(name, expected_current)
        })
    }
    fn credentials(&self) -> Result<Vec<Credential>, KmsError> {
        self.call_marking("looking at keyplan's credentials", false, |k| {
            k.credentials()
        })
    }
    fn retired_means(&self) -> String {
        self.inner.retired_means()
    }
    fn renew_credentials(&self) -> Result<(), KmsError> {
        self.call("renewing keyplan's credentials", |k| k.renew_credentials())
    }
    fn lingering(&self, name: &str) -> Result<Vec<u64>, KmsError> {
        self.call(
            &format!("looking for retired material of key {name:?}"),
            |k| k.lingering(name),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A KMS whose reads take `delay` and time out when the call's deadline is shorter.
    struct Slow {
        delay: Duration,
        calls: Mutex<u32>,
    }

    impl Kms for Slow {
        fn describe(&self) -> String {
            "slow KMS".into()
        }
        fn read(&self, _: &str) -> Result<KeyState, KmsError> {
            *self.calls.lock().unwrap() += 1;
            if remaining() < self.delay {
                std::thread::sleep(remaining());
                return Err(KmsError::Timeout {
                    kms: self.describe(),
                    detail: format!("no answer within {}", limit_text()),
                });
            }
            std::thread::sleep(self.delay);
            Ok(KeyState::default())
        }
        fn get(&self, _: &str, _: u64) -> Result<Passphrase, KmsError> {
            unimplemented!()
        }
        fn stage(&self, _: &str, _: &Passphrase, _: u64) -> Result<u64, KmsError> {
            unimplemented!()
        }
        fn commit_as(
            &self,
            _: &str,
            _: Option<u64>,
            _: u64,
            _: Option<&str>,
        ) -> Result<(), KmsError> {
            unimplemented!()
        }
        fn hold(&self, _: &str, _: &str) -> Result<(), KmsError> {
            unimplemented!()
        }
        fn release(&self, _: &str, _: &str) -> Result<(), KmsError> {
            unimplemented!()
        }
        fn retire(&self, _: &str, _: u64) -> Result<(), KmsError> {
            unimplemented!()
        }
        fn destroy_key(&self, _: &str, _: u64) -> Result<(), KmsError> {
            unimplemented!()
        }
        /// Never answers in time.
        fn credentials(&self) -> Result<Vec<Credential>, KmsError> {
            std::thread::sleep(remaining());
            Err(KmsError::Timeout {
                kms: self.describe(),
                detail: format!("no answer within {}", limit_text()),
            })
        }
    }

    fn guarded(delay_ms: u64, timeout_ms: u64) -> (Guarded, Arc<WaitPolicy>) {
        let policy = Arc::new(WaitPolicy::default());
        let slow = Slow {
            delay: Duration::from_millis(delay_ms),
            calls: Mutex::new(0),
        };
        (
            Guarded::new(
                Box::new(slow),
                Duration::from_millis(timeout_ms),
                Arc::clone(&policy),
            ),
            policy,
        )
    }

    #[test]
    fn a_silent_kms_is_asked_once() {
        let (g, _) = guarded(10_000, 100);
        let t = Instant::now();
        let first = g.read("a").unwrap_err();
        let second = g.read("b").unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(matches!(first, KmsError::Timeout { .. }), "{first}");
        assert!(
            second
                .to_string()
                .contains("not asked: it did not answer within 100 ms"),
            "{second}"
        );
    }

    #[test]
    fn a_credentials_lookup_that_times_out_does_not_silence_the_kms() {
        let (g, _) = guarded(10, 100);
        let err = g.credentials().unwrap_err();
        assert!(matches!(err, KmsError::Timeout { .. }), "{err}");
        g.read("a").expect("the store is still asked");
        // A silent store is not asked for credentials either.
        let (g, _) = guarded(10_000, 100);
        g.read("a").unwrap_err();
        let t = Instant::now();
        let err = g.credentials().unwrap_err();
        assert!(err.to_string().contains("not asked"), "{err}");
        assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
    }

    #[test]
    fn a_bounded_command_spends_at_most_the_timeout_per_kms() {
        // Each read answers in 40 ms, within its 100 ms deadline; unbounded, all answer.
        let (g, policy) = guarded(40, 100);
        for _ in 0..5 {
            g.read("k").expect("unbounded read");
        }
        policy.bound();
        let t = Instant::now();
        let results: Vec<_> = (0..5).map(|_| g.read("k")).collect();
        assert!(
            t.elapsed() < Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
        assert!(results[0].is_ok() && results[1].is_ok(), "{results:?}");
        // The third gets what is left of the budget (20 ms), too little: it times out, and
        // the rest are not asked.
        assert!(
            matches!(results[2], Err(KmsError::Timeout { .. })),
            "{results:?}"
        );
        let last = results[4].as_ref().unwrap_err().to_string();
        assert!(last.contains("not asked"), "{last}");
    }

    #[test]
    fn an_inner_deadline_never_extends_an_outer_one() {
        let now = Instant::now();
        within(
            now + Duration::from_millis(50),
            Duration::from_secs(1),
            || {
                within(
                    now + Duration::from_secs(60),
                    Duration::from_secs(60),
                    || {
                        assert!(remaining() <= Duration::from_millis(50));
                        assert_eq!(limit_text(), "1 s");
                    },
                );
            },
        );
        assert_eq!(remaining(), super::super::REQUEST_TIMEOUT);
    }
}
