//! The exhaustive model of keyplan's protocol (tests/model/, docs/verification.md): every
//! reachable state of each scenario is visited and I1, I4, I5, "no second pending version",
//! the Lease bound and convergence are checked in each; each deliberately broken variant
//! must yield a counterexample. The number of states is printed.
//!
//! `KEYPLAN_MODEL_LARGE=1` adds larger scenarios (more crashes; three nodes with a crash).

use crate::model;

use std::time::Instant;

use model::{DeviceStart::*, ProtocolModel, Scenario, Variant};
use stateright::{Checker, Model};

fn base(name: &'static str) -> Scenario {
    Scenario {
        name,
        variant: Variant::Correct,
        devices: vec![(0, Enrolled)],
        nodes: 1,
        rotations: 1,
        max_crashes: 2,
        second_run: false,
        external_stage: false,
        silent_damage: false,
        lose_node: false,
        max_concurrent_nodes: 1,
        migrate: false,
        operator: false,
        departed: false,
    }
}

fn single_host() -> Scenario {
    Scenario {
        devices: vec![(0, Enrolled), (0, Adopt), (0, Enroll)],
        second_run: true,
        external_stage: true,
        ..base("single host: rotate, adopt, enroll; 2 crashes, a second run, another writer")
    }
}

fn single_host_damage() -> Scenario {
    Scenario {
        devices: vec![(0, Enrolled), (0, Enrolled)],
        rotations: 2,
        silent_damage: true,
        ..base("single host: two rotations, 2 crashes, one silently damaged keyslot")
    }
}

fn revocation() -> Scenario {
    Scenario {
        devices: vec![(0, Enrolled), (0, Enrolled)],
        rotations: 2,
        max_crashes: 1,
        operator: true,
        ..base("single host: two rotations, 1 crash, the operator re-salts a managed keyslot and copies a version by hand")
    }
}

fn fleet_two() -> Scenario {
    Scenario {
        devices: vec![(0, Enrolled), (1, Enrolled)],
        nodes: 2,
        max_crashes: 1,
        ..base("fleet: a key on 2 nodes, 1 Lease, 1 crash")
    }
}

fn fleet_lost_node() -> Scenario {
    Scenario {
        devices: vec![(0, Enrolled), (1, Adopt), (2, Enrolled)],
        nodes: 3,
        max_crashes: 0,
        lose_node: true,
        max_concurrent_nodes: 2,
        ..base("fleet: a key on 3 nodes, 2 Leases, a node lost for good")
    }
}

fn migration() -> Scenario {
    Scenario {
        devices: vec![(0, Enrolled), (1, Enrolled)],
        nodes: 2,
        rotations: 0,
        max_crashes: 2,
        migrate: true,
        ..base("fleet: a key moves to another KMS on 2 nodes, 2 crashes")
    }
}

/// Issue 46: a device that left the plan holds v0, which the origin keeps as previous; the
/// key moves, and the origin must keep it.
fn migration_departed() -> Scenario {
    Scenario {
        devices: vec![(0, Enrolled), (0, Enrolled)],
        rotations: 0,
        max_crashes: 2,
        migrate: true,
        departed: true,
        ..base("single host: a key moves to another KMS, a device that left the plan holds an older version, 2 crashes")
    }
}

/// Checks every reachable state of `sc`; returns the number of unique states.
fn check(sc: Scenario) -> usize {
    let name = sc.name;
    let started = Instant::now();
    let checker = ProtocolModel { sc }.checker().threads(2).spawn_bfs().join();
    let states = checker.unique_state_count();
    println!(
        "{name}: {states} states, max depth {}, {:.1} s",
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    if let Some(path) = checker.discovery("converges") {
        let last = path.last_state().clone();
        println!(
            "does not converge from {last:#?}: {:?}",
            checker.model().resume_to_end(&last).err()
        );
    }
    checker.assert_properties();
    states
}

#[test]
fn single_host_rotation_adoption_and_enrollment_hold_in_every_state() {
    check(single_host());
}

#[test]
fn two_rotations_with_silent_damage_hold_in_every_state() {
    check(single_host_damage());
}

#[test]
fn a_retired_version_opens_nothing_unreported_in_every_state() {
    check(revocation());
}

#[test]
fn a_key_on_two_nodes_holds_in_every_state() {
    check(fleet_two());
}

#[test]
fn a_key_on_three_nodes_with_one_lost_holds_in_every_state() {
    check(fleet_lost_node());
}

#[test]
fn a_migration_on_two_nodes_holds_in_every_state() {
    check(migration());
}

/// Larger scenarios, behind `KEYPLAN_MODEL_LARGE=1`.
#[test]
fn larger_scenarios_hold_in_every_state() {
    if std::env::var_os("KEYPLAN_MODEL_LARGE").is_none() {
        println!("skipped: set KEYPLAN_MODEL_LARGE=1 to check the larger scenarios");
        return;
    }
    check(Scenario {
        max_crashes: 3,
        ..single_host()
    });
    check(Scenario {
        max_crashes: 2,
        silent_damage: true,
        ..fleet_two()
    });
    check(Scenario {
        max_crashes: 1,
        ..fleet_lost_node()
    });
}

#[test]
fn a_migration_with_a_departed_device_holds_in_every_state() {
    check(migration_departed());
}

/// A broken variant must break `property`; prints the counterexample.
fn must_break(sc: Scenario, property: &'static str) {
    let name = sc.name;
    let variant = sc.variant;
    let checker = ProtocolModel { sc }.checker().threads(2).spawn_bfs().join();
    let Some(path) = checker.discovery(property) else {
        panic!(
            "{variant:?} ({name}): no counterexample for {property:?} in {} states",
            checker.unique_state_count()
        );
    };
    let actions = path.into_actions();
    println!(
        "{variant:?} breaks {property:?} ({} states explored): {} actions: {actions:?}",
        checker.unique_state_count(),
        actions.len()
    );
}

#[test]
fn killing_before_the_commit_locks_a_device_out() {
    must_break(
        Scenario {
            variant: Variant::KillBeforeCommit,
            ..base("single host, one device")
        },
        "I1 current opens every device",
    );
}

#[test]
fn committing_before_every_node_verified_locks_a_device_out() {
    must_break(
        Scenario {
            variant: Variant::CommitBeforeAllVerified,
            max_crashes: 0,
            ..fleet_two()
        },
        "I1 current opens every device",
    );
}

#[test]
fn a_kill_without_a_verified_anchor_locks_a_device_out() {
    must_break(
        Scenario {
            variant: Variant::KillWithoutAnchor,
            max_crashes: 0,
            silent_damage: true,
            ..fleet_two()
        },
        "no kill locks a device out",
    );
}

#[test]
fn stage_and_commit_without_compare_and_swap_lose_a_version() {
    // Two Leases, so that both nodes write at once: the race compare-and-swap is for.
    let sc = || Scenario {
        variant: Variant::NoCompareAndSwap,
        max_crashes: 0,
        max_concurrent_nodes: 2,
        ..fleet_two()
    };
    must_break(sc(), "no second pending version");
    must_break(sc(), "I1 current opens every device");
}

#[test]
fn trusting_the_anchors_an_interrupted_run_verified_can_lock_a_device_out() {
    must_break(
        Scenario {
            variant: Variant::TrustJournaledAnchors,
            ..single_host_damage()
        },
        "no kill locks a device out",
    );
}

#[test]
fn forgetting_a_resalted_keyslot_leaves_it_unmanaged() {
    must_break(
        Scenario {
            variant: Variant::ForgetResalted,
            max_crashes: 0,
            ..revocation()
        },
        "converges",
    );
}

#[test]
fn no_search_for_copies_leaves_a_retired_version_opening_a_device() {
    must_break(
        Scenario {
            variant: Variant::NoCopySearch,
            max_crashes: 0,
            ..revocation()
        },
        "I8 a retired version opens nothing unreported",
    );
}

#[test]
fn trusting_the_copy_search_of_an_interrupted_run_misses_a_copy() {
    must_break(
        Scenario {
            variant: Variant::TrustJournaledCopySearch,
            ..revocation()
        },
        "I8 a retired version opens nothing unreported",
    );
}

#[test]
fn destroying_the_origin_a_departed_device_needs_locks_it_out() {
    must_break(
        Scenario {
            variant: Variant::DestroyKeptOrigin,
            ..migration_departed()
        },
        "a departed device opens with what a KMS holds",
    );
}
