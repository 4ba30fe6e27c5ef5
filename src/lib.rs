//! keyplan: declarative, crash-safe rotation of LUKS keyslots whose passphrases live in a KMS.
//!
//! # Where things live
//!
//! **Front ends** call the engine API and nothing else: [`cli`] is the command line (one thin
//! module per command: parse, prompt, call [`ops`], render, exit status); the node agent
//! ([`fleet::agent`]) is another. **[`ops`]** is the engine API: `plan`, an `apply` session (state lock, journal,
//! the interrupted run, planning rounds), saved plans, `status`, `verify`, `key get`,
//! `journal`. Engine errors are [`error::Error`]; front ends decide how to show them.
//!
//! **The pipeline** behind `ops` runs one way: [`spec`] loads and validates the plan file
//! (the only place with source-span diagnostics) and cuts a cluster plan down to one node
//! ([`spec::node`]); [`observe`] reads every device's header and
//! records and every key's versions, into an `Observed` state; [`diff`] is the planner, a pure
//! function of plan and observed state, in three parts (decisions, preflight checks, and the
//! ordering passes of [`graph::passes`]) producing changes and a [`graph::StepGraph`] of
//! idempotent steps; [`apply`] runs the graph: a scheduler ([`apply::schedule`]), one executor
//! per step kind, and the write-ahead [`journal`] (which also holds the state lock). [`render`]
//! formats plans, status reports, journal lines for people and programs; [`saved`] is the
//! saved-plan file format and its state digests.
//!
//! **Formats** ([`format`], docs/formats.md): every document keyplan stores or publishes
//! (journal, state files, LUKS2 tokens, KMS records, node reports, JSON output) as its own
//! versioned type, converted to and from the engine's types; a newer version is refused.
//!
//! **The doors to the world** are [`world::World`]: the LUKS door ([`luks::LuksDoor`], a trait:
//! the cryptsetup driver [`luks`] in production, an in-memory door in the deterministic
//! simulation, tests/sim), one client per KMS instance ([`kms`]: the `Kms` trait, its providers, `kms::book`, the version
//! bookkeeping all providers share, and `kms::expiry`, the expiry of keyplan's own KMS
//! credentials, which [`ops::credentials`] judges against the rotation schedule; Vault's login
//! methods are `kms::vault::auth`), and the record store ([`world::records`]: keyplan's
//! LUKS2 tokens and LUKS1 record files); [`world::registry`] remembers every device a run
//! touched. Child processes (cryptsetup, exec KMS helpers) are started through [`child`].
//!
//! **Fleet mode** ([`fleet`], docs/fleet.md): the Kubernetes side of running on many nodes.
//! The node agent's loop is [`fleet::agent`] (a front end over [`ops`] like the CLI, with the
//! fleet's policy: when to take a rollout slot, when the rollout is halted); around it the
//! rollout slots ([`fleet::slots`], a Lease semaphore), node reports and the failure count
//! ([`fleet::report`]), Events, the plan's ConfigMap volume ([`fleet::source`]), the agent's
//! allow-list ([`fleet::trust`]), `fleet status` ([`fleet::status`]) and its rendering
//! ([`fleet::render`]).
//!
//! **Shared pieces**: the one async runtime and TLS provider ([`runtime`]) and Kubernetes
//! clients ([`kube_client`]), which the KMS providers and fleet mode share; what observation
//! reports ([`finding`]); key material only ever in [`secret::Passphrase`], and every form of
//! material the process knows redacted from every output by [`secret::redact`]; the one clock
//! [`clock`]; [`fsutil`] (atomic private writes); [`par`] (a bounded parallel map);
//! [`failpoint`] (crash and error injection points, compiled only with the `failpoints` cargo
//! feature); `fuzzing` (hidden) holds the fuzz harnesses.

pub mod apply;
/// Child processes (cryptsetup, `exec` KMS helpers): own process group, death with keyplan,
/// minimal environment, a retried start while the program file is busy.
pub mod child;
pub mod cli;
pub mod clock;
pub mod diff;
pub mod error;
pub mod failpoint;
pub mod finding;
pub mod fleet;
pub mod format;
pub mod fsutil;
#[doc(hidden)]
pub mod fuzzing;
pub mod graph;
pub mod journal;
pub mod kms;
pub mod kube_client;
pub mod luks;
pub mod observe;
pub mod ops;
pub mod par;
pub mod render;
pub mod runtime;
pub mod saved;
pub mod secret;
pub mod spec;
pub mod world;
