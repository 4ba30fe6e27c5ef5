//! Which step may start next: the ready set of a step graph, bounded by `parallelism`, never
//! two steps on one device or on one key's KMS entry at once (cryptsetup rewrites whole header
//! areas; KMS commits are compare-and-swap). Knows nothing of journals or threads.

use std::collections::BTreeSet;

use crate::graph::{Step, StepGraph};

/// The resources step `i` of `g` holds while it runs: its device, else the key whose KMS
/// entry it writes. A retire also holds every device on which the graph searches for copies of
/// the version it destroys: in a resumed run it searches them again first
/// (`src/apply/steps/keys.rs`, `retire`), and a `cryptsetup open --test-passphrase` beside a
/// `luksKillSlot` on the same header reads a half-written header (found by tests/engine/chaos.rs).
fn resources(g: &StepGraph, i: usize) -> Vec<String> {
    let s = g.step(i);
    let mut out: Vec<String> = s
        .device()
        .map(|d| format!("device:{d}"))
        .or_else(|| s.kms_key().map(|k| format!("key:{k}")))
        .into_iter()
        .collect();
    if let Step::Retire { key, version } = s {
        for j in 0..g.len() {
            if let Step::FindCopies {
                device,
                key: k,
                version: v,
                ..
            } = g.step(j)
            {
                let r = format!("device:{device}");
                if k == key && v == version && !out.contains(&r) {
                    out.push(r);
                }
            }
        }
    }
    out
}

/// The scheduling state of one run.
#[derive(Debug)]
pub struct Scheduler {
    preds: Vec<Vec<usize>>,
    /// Per step, the resources it holds while it runs ([`resources`]).
    holds: Vec<Vec<String>>,
    done: Vec<bool>,
    running: BTreeSet<usize>,
    busy: BTreeSet<String>,
    parallelism: usize,
}

impl Scheduler {
    /// A scheduler for `graph` with the steps `done` already (an interrupted run's; shorter or
    /// empty means none), at most `parallelism` (at least 1) at once.
    pub fn new(graph: &StepGraph, mut done: Vec<bool>, parallelism: usize) -> Scheduler {
        let n = graph.len();
        done.resize(n, false);
        Scheduler {
            preds: (0..n).map(|i| graph.predecessors(i)).collect(),
            holds: (0..n).map(|i| resources(graph, i)).collect(),
            done,
            running: BTreeSet::new(),
            busy: BTreeSet::new(),
            parallelism: parallelism.max(1),
        }
    }

    /// The lowest-numbered step that may start now, marked as running: not done, not running,
    /// every predecessor done, all its resources free, and fewer than `parallelism` running.
    pub fn start_next(&mut self) -> Option<usize> {
        if self.running.len() >= self.parallelism {
            return None;
        }
        let i = (0..self.done.len()).find(|&i| {
            !self.done[i]
                && !self.running.contains(&i)
                && self.preds[i].iter().all(|p| self.done[*p])
                && self.holds[i].iter().all(|r| !self.busy.contains(r))
        })?;
        self.busy.extend(self.holds[i].iter().cloned());
        self.running.insert(i);
        Some(i)
    }

    /// Step `i` finished, successfully (`ok`) or not: its resources are free again, and when it
    /// succeeded the steps waiting for it may become ready.
    pub fn finished(&mut self, i: usize, ok: bool) {
        self.running.remove(&i);
        if let Some(held) = self.holds.get(i) {
            for r in held {
                self.busy.remove(r);
            }
        }
        if let Some(d) = self.done.get_mut(i) {
            *d |= ok;
        }
    }

    /// True when no step is running.
    pub fn idle(&self) -> bool {
        self.running.is_empty()
    }

    /// Steps done so far (including an interrupted run's).
    pub fn done_count(&self) -> usize {
        self.done.iter().filter(|d| **d).count()
    }

    /// Steps not done.
    pub fn remaining(&self) -> usize {
        self.done.len() - self.done_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::VersionRef;

    fn verify(device: &str, slot: u32) -> Step {
        Step::Verify {
            device: device.into(),
            key: "k".into(),
            version: VersionRef::Version(1),
            slot,
        }
    }

    /// Ready steps start in index order; one device and one key run one step at a time;
    /// parallelism bounds the rest; a failed step leaves its successors waiting.
    #[test]
    fn ready_set_respects_order_resources_and_parallelism() {
        let mut g = StepGraph::new();
        let a0 = g.add(verify("a", 0));
        let a1 = g.add(verify("a", 1));
        let b0 = g.add(verify("b", 0));
        let c0 = g.add(verify("c", 0));
        let stage = g.add(Step::Stage {
            key: "k".into(),
            at_least: 1,
            planned_current: None,
        });
        let commit = g.add(Step::Commit {
            key: "k".into(),
            expected_current: None,
        });
        g.dep(stage, commit);
        g.dep(b0, commit);
        let mut s = Scheduler::new(&g, Vec::new(), 3);
        assert_eq!(s.start_next(), Some(a0));
        assert_eq!(s.start_next(), Some(b0), "a1 waits: device a is busy");
        assert_eq!(s.start_next(), Some(c0));
        assert_eq!(s.start_next(), None, "parallelism 3 reached");
        s.finished(a0, true);
        assert_eq!(s.start_next(), Some(a1));
        s.finished(c0, true);
        assert_eq!(s.start_next(), Some(stage));
        s.finished(stage, true);
        s.finished(b0, false);
        s.finished(a1, true);
        // A failed step is not done: it is ready again (the run loop starts nothing more after
        // a failure), and the commit still waits for it.
        assert_eq!(s.start_next(), Some(b0));
        assert_eq!(s.start_next(), None);
        s.finished(b0, false);
        assert!(s.idle());
        assert_eq!((s.done_count(), s.remaining()), (4, 2));
        let mut resumed = Scheduler::new(&g, vec![true, true, true, true, true], 1);
        assert_eq!(resumed.start_next(), Some(commit));
    }

    /// A retire holds the devices where the graph searches for copies of its version (a
    /// resumed retire searches them again): it never runs beside a kill on one of them, and
    /// runs beside steps on other devices.
    #[test]
    fn a_retire_waits_for_the_devices_it_searches_again() {
        let mut g = StepGraph::new();
        let find = g.add(Step::FindCopies {
            device: "b".into(),
            key: "k".into(),
            version: 1,
            slots: vec![3],
        });
        let kill_b = g.add(Step::KillKeyslot {
            device: "b".into(),
            slot: 2,
            holder: crate::graph::SlotHolder::Unmanaged { salt: "s".into() },
            anchor: 0,
        });
        let retire = g.add(Step::Retire {
            key: "k".into(),
            version: 1,
        });
        let verify_c = g.add(verify("c", 0));
        g.dep(find, retire);
        let mut s = Scheduler::new(&g, vec![true], 4);
        assert_eq!(s.start_next(), Some(kill_b));
        assert_eq!(
            s.start_next(),
            Some(verify_c),
            "the retire waits: device b is busy"
        );
        assert_eq!(s.start_next(), None);
        s.finished(kill_b, true);
        assert_eq!(s.start_next(), Some(retire));
        let mut k = Scheduler::new(&g, vec![true, false, false, true], 4);
        assert_eq!(k.start_next(), Some(kill_b));
        assert_eq!(k.start_next(), None, "the retire waits for device b");
    }
}
