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
//! /proc/meminfo (proc(5)), or, when keyplan runs in a cgroup with a memory limit (a container,
//! a systemd unit or slice with `MemoryMax=`; cgroup v2 `memory.max` or v1
//! `memory.limit_in_bytes`, on the cgroup or any ancestor), what that limit leaves above the
//! cgroup's usage, whichever is less.

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
        (Some(m), Some(c)) if c < m => (c, "what the cgroup's memory limit leaves"),
        (Some(m), _) => (m, "/proc/meminfo MemAvailable"),
        (None, Some(c)) => (c, "what the cgroup's memory limit leaves"),
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

/// What the memory limits of this process's cgroups leave free, in KiB; `None` when no limit
/// can be read. See [`cgroup_headroom_in`].
fn cgroup_headroom_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_headroom_in(&text, std::path::Path::new("/sys/fs/cgroup"))
}

/// The least headroom (limit minus usage, KiB) of every memory limit over the cgroups named
/// by `proc_self_cgroup` (the text of /proc/self/cgroup, cgroups(7)) and all their ancestors,
/// under the cgroup file system mounted at `sys_root`: cgroup v2 `memory.max` minus
/// `memory.current` (the kernel's cgroup-v2.rst), and cgroup v1 `memory.limit_in_bytes`
/// minus `memory.usage_in_bytes` of the `memory` controller's hierarchy mounted at
/// `sys_root/memory` (cgroup-v1/memory.rst). A limit set on a parent (a systemd slice with
/// `MemoryMax=`, a Kubernetes pod around its container) binds as much as one on the leaf.
/// `max` (no limit) and unreadable files are skipped; `None` when nothing is limited.
fn cgroup_headroom_in(proc_self_cgroup: &str, sys_root: &std::path::Path) -> Option<u64> {
    let groups = procfs_core::ProcessCGroups::from_read(proc_self_cgroup.as_bytes()).ok()?;
    let number = |file: std::path::PathBuf| -> Option<u64> {
        std::fs::read_to_string(file)
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    };
    let mut least: Option<u64> = None;
    for group in groups {
        let (base, limit, usage) = if group.hierarchy == 0 {
            (sys_root.to_path_buf(), "memory.max", "memory.current")
        } else if group.controllers.iter().any(|c| c == "memory") {
            (
                sys_root.join("memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            continue;
        };
        let mut dir = base.join(group.pathname.trim_start_matches('/'));
        loop {
            if let Some(max) = number(dir.join(limit)) {
                let used = number(dir.join(usage)).unwrap_or(0);
                let free = max.saturating_sub(used) / 1024;
                least = Some(least.map_or(free, |l| l.min(free)));
            }
            if dir == base || !dir.pop() || !dir.starts_with(&base) {
                break;
            }
        }
    }
    least
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

    fn write(dir: &std::path::Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn cgroup_limits_of_v2_v1_and_ancestors() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // v2: the leaf is unlimited, its parent (a slice) has 1 GiB of which 256 MiB is used.
        write(&r.join("app.slice"), "memory.max", "1073741824\n");
        write(&r.join("app.slice"), "memory.current", "268435456\n");
        write(&r.join("app.slice/keyplan.service"), "memory.max", "max\n");
        write(
            &r.join("app.slice/keyplan.service"),
            "memory.current",
            "1000\n",
        );
        let v2 = "0::/app.slice/keyplan.service\n";
        assert_eq!(cgroup_headroom_in(v2, r), Some(768 * 1024));
        // v1 (hybrid host): memory controller limit 900 MiB, 100 MiB used; v2 part unlimited.
        write(
            &r.join("memory/user.slice/x"),
            "memory.limit_in_bytes",
            "943718400\n",
        );
        write(
            &r.join("memory/user.slice/x"),
            "memory.usage_in_bytes",
            "104857600\n",
        );
        write(
            &r.join("memory"),
            "memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        let v1 = "12:memory:/user.slice/x\n11:cpu,cpuacct:/user.slice\n0::/other\n";
        assert_eq!(cgroup_headroom_in(v1, r), Some(800 * 1024));
        // Nothing limited.
        assert_eq!(cgroup_headroom_in("0::/nowhere\n", r), None);
        assert_eq!(cgroup_headroom_in("garbage", r), None);
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
