//! The memory budget of a run's PBKDF runs.
//!
//! An argon2 PBKDF run holds its keyslot's whole memory cost (`kdf.memory`, up to 4 GiB; 1 GiB
//! by cryptsetup's default) for its whole duration. Several devices worked on at once
//! multiply that: 4 devices × 1 GiB on a host with 3 GiB free swaps or is OOM-killed in the
//! middle of a keyslot write. So every step takes its PBKDF runs' memory from a shared
//! [`MemoryBudget`] first and waits while the budget is spent: the number of PBKDF runs at
//! once is at most `parallelism` and at most what the budget holds.
//!
//! The default budget is half of the memory available when the run starts: `MemAvailable` of
//! /proc/meminfo (proc(5)), or, when keyplan runs in a cgroup v2 with a `memory.max` limit
//! (a container, a systemd unit with `MemoryMax=`), what that limit leaves above
//! `memory.current`, whichever is less.

use std::sync::{Condvar, Mutex};

use procfs_core::FromRead;

/// Memory one cryptsetup process needs beside its PBKDF, in KiB (its resident size with a
/// pbkdf2 keyslot is about 8 MiB with cryptsetup 2.6; 16 MiB leaves room).
pub const CRYPTSETUP_OVERHEAD_KIB: u64 = 16 * 1024;

/// Share of the available memory a run uses by default, in percent.
pub const DEFAULT_BUDGET_PERCENT: u64 = 50;

/// Budget used when the available memory cannot be read (no /proc): 1 GiB, in KiB.
pub const FALLBACK_BUDGET_KIB: u64 = 1024 * 1024;

/// Where the default budget came from, for the log and `docs/performance.md`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetSource {
    /// Budget in KiB.
    pub kib: u64,
    /// Human explanation, e.g. `50% of 11.2 GiB available (/proc/meminfo MemAvailable)`.
    pub why: String,
}

/// The budget for a run: `configured` (from `settings.memory_budget_kib`) when set, else
/// [`DEFAULT_BUDGET_PERCENT`] of the available memory (see the module documentation), else
/// [`FALLBACK_BUDGET_KIB`] when /proc cannot be read. Never fails, never 0.
pub fn budget(configured: Option<u64>) -> BudgetSource {
    if let Some(kib) = configured {
        return BudgetSource {
            kib: kib.max(1),
            why: "settings.memory_budget_kib".to_owned(),
        };
    }
    let meminfo = std::fs::File::open("/proc/meminfo")
        .ok()
        .and_then(|f| procfs_core::Meminfo::from_read(f).ok())
        .and_then(|m| m.mem_available)
        .map(|bytes| bytes / 1024);
    let cgroup = cgroup_headroom_kib();
    let (available, source) = match (meminfo, cgroup) {
        (Some(m), Some(c)) if c < m => (c, "the cgroup's memory.max minus memory.current"),
        (Some(m), _) => (m, "/proc/meminfo MemAvailable"),
        (None, Some(c)) => (c, "the cgroup's memory.max minus memory.current"),
        (None, None) => {
            return BudgetSource {
                kib: FALLBACK_BUDGET_KIB,
                why: "a fixed 1 GiB: the available memory could not be read".to_owned(),
            }
        }
    };
    let kib = (available * DEFAULT_BUDGET_PERCENT / 100).max(1);
    BudgetSource {
        kib,
        why: format!(
            "{DEFAULT_BUDGET_PERCENT}% of {} available ({source})",
            mib_text(available)
        ),
    }
}

/// What the cgroup v2 `memory.max` of this process leaves above `memory.current`, in KiB;
/// `None` without cgroup v2, without a limit (`max`), or when the files cannot be read
/// (cgroups(7), "Cgroups version 2"; the kernel's cgroup-v2.rst, "memory.max").
fn cgroup_headroom_kib() -> Option<u64> {
    let groups = std::fs::File::open("/proc/self/cgroup")
        .ok()
        .and_then(|f| procfs_core::ProcessCGroups::from_read(f).ok())?;
    let v2 = groups.into_iter().find(|g| g.hierarchy == 0)?;
    let dir = std::path::Path::new("/sys/fs/cgroup").join(v2.pathname.trim_start_matches('/'));
    let number = |name: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(name))
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    };
    let max = number("memory.max")?;
    let current = number("memory.current").unwrap_or(0);
    Some(max.saturating_sub(current) / 1024)
}

/// `N.N GiB` or `N MiB` for `kib` KiB.
pub fn mib_text(kib: u64) -> String {
    if kib >= 1024 * 1024 {
        format!("{:.1} GiB", kib as f64 / (1024.0 * 1024.0))
    } else {
        format!("{} MiB", kib / 1024)
    }
}

/// Memory in KiB that one PBKDF run of a keyslot with argon2 memory cost `memory_kib` (KiB;
/// `None` for pbkdf2) needs: that cost plus [`CRYPTSETUP_OVERHEAD_KIB`].
pub fn pbkdf_kib(memory_kib: Option<u64>) -> u64 {
    memory_kib
        .unwrap_or(0)
        .saturating_add(CRYPTSETUP_OVERHEAD_KIB)
}

/// A pool of KiB shared by the steps of a run. [`MemoryBudget::take`] blocks until the
/// amount is free; a request larger than the whole budget is granted when nothing else is
/// held (one PBKDF run at a time is the least a run can do), so a run never deadlocks.
#[derive(Debug)]
pub struct MemoryBudget {
    total_kib: u64,
    state: Mutex<Held>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct Held {
    kib: u64,
    runs: usize,
    peak_kib: u64,
    peak_runs: usize,
}

/// Memory taken from a [`MemoryBudget`]; given back when dropped.
#[must_use = "the memory is given back when the guard is dropped"]
#[derive(Debug)]
pub struct MemoryGuard<'a> {
    budget: &'a MemoryBudget,
    kib: u64,
}

impl MemoryBudget {
    /// A budget of `total_kib` KiB (at least 1).
    pub fn new(total_kib: u64) -> Self {
        MemoryBudget {
            total_kib: total_kib.max(1),
            state: Mutex::new(Held::default()),
            freed: Condvar::new(),
        }
    }

    /// The budget in KiB.
    pub fn total_kib(&self) -> u64 {
        self.total_kib
    }

    /// Takes `kib` KiB, waiting while they are not free (see the type's documentation for a
    /// request above the whole budget). Never fails: a poisoned lock is taken over.
    pub fn take(&self, kib: u64) -> MemoryGuard<'_> {
        let mut held = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while held.runs > 0 && held.kib.saturating_add(kib) > self.total_kib {
            held = self.freed.wait(held).unwrap_or_else(|p| p.into_inner());
        }
        held.kib = held.kib.saturating_add(kib);
        held.runs += 1;
        held.peak_kib = held.peak_kib.max(held.kib);
        held.peak_runs = held.peak_runs.max(held.runs);
        MemoryGuard { budget: self, kib }
    }

    /// The most KiB held at once so far, and the most PBKDF runs at once.
    pub fn peak(&self) -> (u64, usize) {
        let held = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (held.peak_kib, held.peak_runs)
    }
}

impl Drop for MemoryGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.budget.state.lock().unwrap_or_else(|p| p.into_inner());
        held.kib = held.kib.saturating_sub(self.kib);
        held.runs = held.runs.saturating_sub(1);
        self.budget.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn runs_at_once_are_bounded_by_the_budget() {
        // 4 workers, each wanting 300 KiB of a 700 KiB budget: at most 2 at once.
        let budget = MemoryBudget::new(700);
        let now = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..5 {
                        let _g = budget.take(300);
                        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        now.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 2);
        assert_eq!(budget.peak(), (600, 2));
    }

    #[test]
    fn a_request_above_the_budget_runs_alone() {
        let budget = MemoryBudget::new(100);
        {
            let _g = budget.take(5000);
        }
        let _a = budget.take(60);
        assert_eq!(budget.peak(), (5000, 1));
    }

    #[test]
    fn default_budget_is_half_the_available_memory() {
        let b = budget(None);
        assert!(b.kib >= 1, "{b:?}");
        assert!(b.why.contains("50%") || b.why.contains("fixed"), "{b:?}");
        assert_eq!(budget(Some(4096)).kib, 4096);
        assert_eq!(pbkdf_kib(Some(1024)), 1024 + CRYPTSETUP_OVERHEAD_KIB);
        assert_eq!(pbkdf_kib(None), CRYPTSETUP_OVERHEAD_KIB);
    }
}
