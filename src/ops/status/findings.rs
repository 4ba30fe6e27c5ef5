//! What `status` collects before its verdict ([`Findings`]), and how it files them.

use std::collections::BTreeMap;

/// What `status` collects before the verdict.
#[derive(Default)]
pub(super) struct Findings {
    /// What is wrong: the report's `problems` (any makes the verdict [`super::Verdict::Problem`]).
    pub(super) problems: Vec<String>,
    /// What could not be checked: the report's `unchecked` (without a problem, any makes the
    /// verdict [`super::Verdict::Unknown`]).
    pub(super) unchecked: Vec<String>,
    /// What kept the devices from being checked for drift, said once when the reason is a
    /// KMS that could not be read ([`Findings::settle`]).
    pub(super) not_observed: Vec<String>,
    /// Per KMS instance that could not be read: its keys, and the first error.
    pub(super) unreadable: BTreeMap<String, (Vec<String>, String)>,
}

impl Findings {
    /// Files the grouped findings as `unchecked` lines, one statement per fact: one line per
    /// KMS instance that could not be read (naming its keys, with the first key's error), and
    /// for the devices either the observation's own reasons or, when a KMS could not be read
    /// (which is what stopped it), one line pointing at those.
    pub(super) fn settle(&mut self) {
        let line = |m: &str| format!("devices could not be checked for drift: {}", first_line(m));
        // The observation asked the KMS first: its message has the error itself, the keys'
        // reads after it were not asked again.
        let first = self.not_observed.first().cloned();
        if self.unreadable.is_empty() {
            let lines: Vec<String> = self.not_observed.iter().map(|m| line(m)).collect();
            self.unchecked.extend(lines);
        } else if first.is_some() {
            self.unchecked
                .push(line("a KMS of their keys could not be read"));
        }
        self.not_observed.clear();
        for (kms, (keys, e)) in std::mem::take(&mut self.unreadable) {
            let which = match keys.as_slice() {
                [one] => format!("key {one}"),
                many => format!("keys {}", many.join(", ")),
            };
            let e = match &first {
                Some(m) if e.contains("not asked: it was unavailable") => first_line(m).to_string(),
                _ => e,
            };
            self.unchecked
                .push(format!("KMS {kms} unreadable ({which}): {e}"));
        }
    }
}

/// The first line of a (possibly multi-line) message.
pub(super) fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}
