//! Pure planner tests: synthetic observed states (no cryptsetup, no KMS, no files but the plan
//! text), the changes and the step graph as snapshots (`src/diff/tests/snapshots/`).
//!
//! `scenario` builds plans and observed states; `snapshots` holds the scenario tests;
//! `properties` checks the safety properties of plans of random states.

mod properties;
pub(crate) mod scenario;
mod snapshots;
