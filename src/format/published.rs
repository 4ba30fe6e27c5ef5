//! Saved plans, JSON output for programs, node reports and the Kubernetes objects agents read
//! (docs/formats.md, "Documents for programs" and "Fleet objects").
//!
//! The node report has its own data types here ([`node_report`], [`observation`]), converted
//! from the engine's in src/fleet/published.rs. The other documents' writers live with their
//! commands; [`FORMATS`] names each with its version, and the fixtures under
//! `tests/fixtures/formats/` freeze them (tests/verification/formats_published.rs).

pub mod node_report;
pub mod observation;

use super::Format;

/// The formats of this module ([`super::all`]), in the order of docs/formats.md.
pub const FORMATS: &[Format] = &[
    Format {
        name: "saved-plan",
        writes: "1.0",
        reads: "1.x",
        home: "keyplan plan -o FILE",
    },
    Format {
        name: "plan-json",
        writes: "1.0",
        reads: "1.x",
        home: "stdout of plan --json, show --json",
    },
    Format {
        name: "validate-json",
        writes: "1.0",
        reads: "1.x",
        home: "stdout of validate --json",
    },
    Format {
        name: "status-json",
        writes: "1.4",
        reads: "1.x",
        home: "stdout of status --format json, status -o FILE",
    },
    Format {
        name: "status-metrics",
        writes: "1",
        reads: "1",
        home: "stdout of status --format prometheus, -o FILE, the agent's /metrics",
    },
    Format {
        name: "journal-json",
        writes: "1.0",
        reads: "1.x",
        home: "stdout of journal --json",
    },
    Format {
        name: "holders-json",
        writes: "1.0",
        reads: "1.x",
        home: "stdout of key holders --json",
    },
    node_report::FORMAT,
    Format {
        name: "fleet-status-json",
        writes: "1.2",
        reads: "1.x",
        home: "stdout of fleet status --format json",
    },
    Format {
        name: "fleet-status-metrics",
        writes: "1",
        reads: "1",
        home: "stdout of fleet status --format prometheus",
    },
    Format {
        name: "fleet-plan-json",
        writes: "1.0",
        reads: "1.x",
        home: "stdout of fleet plan --json",
    },
    Format {
        name: "rollout-lease",
        writes: "1",
        reads: "1",
        home: "Leases keyplan-rollout-<i> (standard Lease fields)",
    },
    Format {
        name: "fleet-pause",
        writes: "1",
        reads: "1",
        home: "ConfigMap keyplan-pause (data reason, paused_by, paused_at)",
    },
    Format {
        name: "fleet-events",
        writes: "1",
        reads: "none",
        home: "core/v1 Events (reasons)",
    },
    SIGNATURE,
    Format {
        name: "version-json",
        writes: "1.0",
        reads: "-",
        home: "stdout of `keyplan version --json` (src/cli/version.rs)",
    },
];

/// The signed-plan envelope `<plan>.sig`: its `format` is `keyplan-signature/v<N>`
/// ([`SIGNATURE_PREFIX`] and the version).
pub const SIGNATURE: Format = Format {
    name: "plan-signature",
    writes: "1",
    reads: "1",
    home: "<plan>.sig beside the plan file",
};

/// The `format` of a signed-plan envelope without its version number.
pub const SIGNATURE_PREFIX: &str = "keyplan-signature/v";
/// The newest envelope version this keyplan reads (and the one it writes).
pub const SIGNATURE_VERSION: u64 = 1;

/// The saved plan's format; its `format_version` is `major.minor`, and a reader reads every
/// minor version of [`SAVED_PLAN_MAJOR`].
pub const SAVED_PLAN: &Format = &FORMATS[0];
/// The newest major version of saved plans this keyplan reads.
pub const SAVED_PLAN_MAJOR: u64 = 1;
