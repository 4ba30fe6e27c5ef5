//! The node's report (its ConfigMap, read at start and written when it changes) and its Events.

use std::time::Instant;

use k8s_openapi::api::core::v1::ConfigMap;

use super::Agent;
use crate::clock::now_unix;
use crate::fleet::events::{EventType, Events};
use crate::fleet::report::{AgentState, NodeReport, ReportError, Reports, Stored};

impl Agent {
    /// The node reports of the fleet namespace.
    pub(super) fn reports(&self) -> Reports {
        Reports::new(self.client.clone(), &self.namespace)
    }

    /// Writes an Event about this node with its one writer for the fleet namespace (kept, so
    /// that a repeated Event updates its count: [`Events::emit`]).
    pub(super) fn emit(&mut self, kind: EventType, reason: &str, message: &str) {
        let events = self.take_events();
        events.emit(kind, reason, message);
        self.events = Some(events);
    }

    /// This node's Event writer for the fleet namespace, taken out (put it back in
    /// `self.events`, so that repeats are aggregated); a new one after a namespace change.
    pub(super) fn take_events(&mut self) -> Events {
        match self.events.take() {
            Some(e) if e.namespace() == self.namespace => e,
            _ => Events::new(self.client.clone(), &self.namespace, &self.opts.node),
        }
    }

    /// Picks up this node's previous report (a restarted agent keeps its failure, last run and
    /// last success), once the fleet namespace is known.
    pub(super) fn adopt_previous(&mut self) {
        match self.reports().get(&self.opts.node) {
            Ok(Some(stored)) => self.adopt(stored),
            Ok(None) => {}
            Err(e) => tracing::warn!("could not read this node's previous report: {e}"),
        }
    }

    fn adopt(&mut self, stored: Stored) {
        if let Some(newer) = &stored.newer {
            // A newer keyplan ran on this node (this one was rolled back): its report is not
            // read; this agent's own report replaces it at its next write.
            tracing::warn!(node = %self.opts.node, "this node's previous report is not read: {newer}");
        }
        if let Some(old) = stored.report {
            self.report.last_run = old.last_run;
            self.report.last_success_at = old.last_success_at;
            self.report.failure = old.failure;
        }
        self.prior = Some(stored.object);
    }

    /// Sets the report's state and message, and the metrics' state; clears the report's place
    /// in the queue for a slot (`waiting_since`).
    pub(super) fn set_state(&mut self, state: AgentState, message: Option<String>) {
        self.report.state = state;
        // Only a node waiting for a slot has a place in the queue (try_slot sets it again).
        self.report.waiting_since = None;
        self.report.message = message;
        self.health().state = Some(state);
    }

    /// Writes the report when it changed, or `force`, or when the last write is half an
    /// interval old (so every full cycle writes it: the heartbeat). A write that loses to another writer (409: `fleet clear`) reads the report
    /// again, keeps its annotations and retries once.
    pub(super) fn publish(&mut self, force: bool) {
        if !self.has_devices {
            return;
        }
        let mut unchanged = self.report.clone();
        let same = self.published.as_ref().is_some_and(|(last, at)| {
            unchanged.updated_at = last.updated_at;
            // Half an interval: every full cycle rewrites it, so the heartbeat is one interval.
            *last == unchanged && at.elapsed() < self.opts.interval / 2
        });
        if same && !force {
            return;
        }
        self.report.updated_at = now_unix();
        let result = put_report(
            &self.reports(),
            &self.opts.node,
            &self.report,
            self.prior.as_ref(),
        );
        let written = self.report.clone();
        self.published_as(written, result);
    }

    /// Keeps what a write of the report `written` left: the object written (the next write's
    /// condition) or, after a refusal, no prior (read it again next time).
    pub(super) fn published_as(
        &mut self,
        written: NodeReport,
        result: Result<ConfigMap, ReportError>,
    ) {
        match result {
            Ok(cm) => {
                self.prior = Some(cm);
                self.published = Some((written, Instant::now()));
            }
            Err(e) => {
                // A prior that may be stale: read it again next time.
                if e.code.is_some() {
                    self.prior = None;
                }
                tracing::warn!(node = %self.opts.node, "could not write this node's report: {e}");
            }
        }
    }
}

/// Writes `report` over `prior` (a conditional update; a create when there is none). A write
/// that loses to another writer (409: `fleet clear` annotated the report) or finds the report
/// gone (404) reads it again and retries once. The ConfigMap written.
///
/// Errors: [`Reports::put`]'s and [`Reports::get`]'s (denied, unreachable, a second conflict).
pub(super) fn put_report(
    reports: &Reports,
    node: &str,
    report: &NodeReport,
    prior: Option<&ConfigMap>,
) -> Result<ConfigMap, ReportError> {
    match reports.put(report, prior) {
        Err(e) if matches!(e.code, Some(409) | Some(404)) => {
            let fresh = reports.get(node)?;
            reports.put(report, fresh.as_ref().map(|s| &s.object))
        }
        written => written,
    }
}
