//! Which step may start next: the ready set of a step graph, bounded by `parallelism`, never
//! two steps on one device or on one key's KMS entry at once (cryptsetup rewrites whole header
//! areas; KMS commits are compare-and-swap). Knows nothing of journals or threads.

use std::collections::BTreeSet;

use crate::graph::{Step, StepGraph};

/// The resource a step holds while it runs: its device, else the key whose KMS entry it
/// writes; `None` for steps that hold neither.
fn resource(s: &Step) -> Option<String> {
    s.device()
        .map(|d| format!("device:{d}"))
        .or_else(|| s.kms_key().map(|k| format!("key:{k}")))
}

/// The scheduling state of one run.
#[derive(Debug)]
pub struct Scheduler<'g> {
    graph: &'g StepGraph,
    preds: Vec<Vec<usize>>,
    done: Vec<bool>,
    running: BTreeSet<usize>,
    busy: BTreeSet<String>,
    parallelism: usize,
}

impl<'g> Scheduler<'g> {
    /// A scheduler for `graph` with the steps `done` already (an interrupted run's; shorter or
    /// empty means none), at most `parallelism` (at least 1) at once.
    pub fn new(graph: &'g StepGraph, mut done: Vec<bool>, parallelism: usize) -> Scheduler<'g> {
        let n = graph.len();
        done.resize(n, false);
        Scheduler {
            graph,
            preds: (0..n).map(|i| graph.predecessors(i)).collect(),
            done,
            running: BTreeSet::new(),
            busy: BTreeSet::new(),
            parallelism: parallelism.max(1),
        }
    }

    /// The lowest-numbered step that may start now, marked as running: not done, not running,
    /// every predecessor done, its resource free, and fewer than `parallelism` running.
    pub fn start_next(&mut self) -> Option<usize> {
        if self.running.len() >= self.parallelism {
            return None;
        }
        let i = (0..self.done.len()).find(|&i| {
            !self.done[i]
                && !self.running.contains(&i)
                && self.preds[i].iter().all(|p| self.done[*p])
                && resource(self.graph.step(i)).is_none_or(|r| !self.busy.contains(&r))
        })?;
        if let Some(r) = resource(self.graph.step(i)) {
            self.busy.insert(r);
        }
        self.running.insert(i);
        Some(i)
    }

    /// Step `i` finished, successfully (`ok`) or not: its resource is free again, and when it
    /// succeeded the steps waiting for it may become ready.
    pub fn finished(&mut self, i: usize, ok: bool) {
        self.running.remove(&i);
        if let Some(r) = resource(self.graph.step(i)) {
            self.busy.remove(&r);
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
}
