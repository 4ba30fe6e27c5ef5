//! Pure planner tests: synthetic observed states (no cryptsetup, no KMS, no files but the plan
//! text), the changes and the step graph as snapshots (`src/diff/tests/snapshots/`).
//!
//! `scenario` builds plans and observed states; `snapshots` holds the scenario tests;
//! `shared_keys` the scenario tests of keys shared among plans and nodes; `kept` the copies
//! earlier moves kept in the KMS a key left; `properties` checks the safety properties of plans of random states.

mod kept;
mod properties;
pub(crate) mod scenario;
mod shared_keys;
mod snapshots;
