//! The planner against the one it replaced (`legacy`): on random observed states (keys with
//! and without versions, pending, previous and retired versions; devices with recorded,
//! unmanaged, unbound, gone and rewritten keyslots; pins; removals; read-only devices; full
//! JSON areas; `enroll_with` files; migrations), both must refuse with the same messages, or
//! plan the same changes, the same steps in the same order, and graphs with the same
//! reachability (an edge one adds that the other implies changes nothing the executor does).

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::scenario::{self, Disk};
use crate::diff::{Diff, DiffOptions};
use crate::graph::StepGraph;
use crate::kms::KeyState;
use crate::luks::Priority;
use crate::observe::Observed;
use crate::spec::Plan;
use crate::world::RecordStatus;

/// Random states compared per test run; `KEYPLAN_PLANNER_CASES` sets another number.
const CASES: u64 = 5000;

/// `reach[a]` holds every step reachable from `a`.
fn reachability(g: &StepGraph) -> Vec<BTreeSet<usize>> {
    let n = g.len();
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (a, b) in g.deps() {
        succ[a].push(b);
    }
    (0..n)
        .map(|start| {
            let mut seen = BTreeSet::new();
            let mut todo = succ[start].clone();
            while let Some(x) = todo.pop() {
                if seen.insert(x) {
                    todo.extend(succ[x].iter().copied());
                }
            }
            seen
        })
        .collect()
}

/// The enroll_with files the scenarios point at: a passphrase, an empty file, a directory and
/// a missing path.
struct Files {
    _dir: tempfile::TempDir,
    paths: Vec<String>,
}

fn files() -> Files {
    let dir = tempfile::tempdir().expect("tempdir");
    let pass = dir.path().join("pass");
    let empty = dir.path().join("empty");
    std::fs::write(&pass, b"hunter2-passphrase").expect("write");
    std::fs::write(&empty, b"").expect("write");
    let paths = vec![
        pass.display().to_string(),
        empty.display().to_string(),
        dir.path().display().to_string(),
        dir.path().join("missing").display().to_string(),
    ];
    Files { _dir: dir, paths }
}

/// A random plan: 1-3 keys in two file KMS instances, 1-3 devices listing random keys, some
/// pinned, some removing unmanaged keyslots, some with enroll_with.
fn random_plan(rng: &mut StdRng, files: &Files) -> (Plan, Vec<bool>) {
    let nkeys = rng.random_range(1..=3);
    let mut text = String::from(
        "version: 1\nkms:\n  local: { provider: file, path: keys }\n  other: { provider: file, path: other }\nkeys:\n",
    );
    for k in 0..nkeys {
        let after = if rng.random_bool(0.6) {
            ", rotate_after: 30d"
        } else {
            ""
        };
        let _ = std::fmt::Write::write_fmt(
            &mut text,
            format_args!("  k{k}: {{ kms: local{after} }}\n"),
        );
    }
    text.push_str("devices:\n");
    let ndev = rng.random_range(1..=3);
    let mut luks1 = Vec::new();
    for d in 0..ndev {
        let is1 = rng.random_bool(0.2);
        luks1.push(is1);
        let mut keys = Vec::new();
        let mut pins = BTreeSet::new();
        for k in 0..nkeys {
            if rng.random_bool(0.7) {
                let pin = if rng.random_bool(0.3) {
                    let p = rng.random_range(0..6u32);
                    pins.insert(p).then_some(p)
                } else {
                    None
                };
                keys.push(match pin {
                    Some(p) => format!("{{ key: k{k}, keyslot: {p} }}"),
                    None => format!("k{k}"),
                });
            }
        }
        let mut extra = String::new();
        if !keys.is_empty() && rng.random_bool(0.3) {
            extra.push_str(", unmanaged_keyslots: remove");
        }
        if rng.random_bool(0.5) {
            let f = &files.paths[rng.random_range(0..files.paths.len())];
            extra.push_str(&format!(", enroll_with: \"{f}\""));
        }
        let _ = std::fmt::Write::write_fmt(
            &mut text,
            format_args!(
                "  d{d}: {{ path: d{d}.img, keys: [{}]{extra} }}\n",
                keys.join(", ")
            ),
        );
    }
    (scenario::plan(&text), luks1)
}

/// A random KMS state of one key.
fn random_key(rng: &mut StdRng) -> KeyState {
    if rng.random_bool(0.15) {
        return KeyState::default();
    }
    let current = rng.random_range(1..=4u64);
    let previous: Vec<u64> = (1..current).filter(|_| rng.random_bool(0.5)).collect();
    let retired: Vec<u64> = (1..current)
        .filter(|v| !previous.contains(v) && rng.random_bool(0.5))
        .collect();
    let pending = rng.random_bool(0.2).then_some(current + 1);
    let age = if rng.random_bool(0.5) { 10 } else { 45 };
    let current = if rng.random_bool(0.05) {
        None
    } else {
        Some(current)
    };
    scenario::key(current, age, pending, &previous, &retired)
}

/// A random device: keyslots 0-7 occupied at random. Keys the device lists are usually held
/// in a recorded keyslot (their current version, sometimes an older or the pending one); the
/// rest are unmanaged keyslots, records of other keys (or of a key that left the plan) in any
/// status.
fn random_disk(
    rng: &mut StdRng,
    id: &str,
    luks1: bool,
    listed: &[(String, KeyState)],
    nkeys: usize,
) -> Disk {
    let mut d = if luks1 {
        Disk::luks1(id)
    } else {
        Disk::luks2(id)
    };
    let max = if luks1 { 8 } else { rng.random_range(4..=8) };
    let mut free: Vec<u32> = (0..max).collect();
    for (k, st) in listed {
        if free.is_empty() || rng.random_bool(0.2) {
            continue;
        }
        let n = free.remove(rng.random_range(0..free.len()));
        let version = match (st.current, rng.random_range(0..10)) {
            (Some(c), 0) if c > 1 => c - 1,
            (Some(c), 1) => st.pending.unwrap_or(c),
            (Some(c), _) => c,
            (None, _) => st.pending.unwrap_or(1),
        };
        d = d.holds(n, k, version);
    }
    for n in free {
        let roll = rng.random_range(0..100);
        if roll < 55 {
            continue;
        }
        if roll < 75 {
            let bound = rng.random_bool(0.9);
            let prio = if rng.random_bool(0.1) {
                Priority::Ignore
            } else {
                Priority::Normal
            };
            d = d.keyslot_with(n, bound, prio);
            continue;
        }
        let key = match rng.random_range(0..=nkeys) {
            k if k < nkeys => format!("k{k}"),
            _ => "gone-key".to_string(),
        };
        let version = rng.random_range(1..=5u64);
        let status = match rng.random_range(0..100) {
            0..=69 => RecordStatus::Valid,
            70..=79 => RecordStatus::KeyslotGone,
            80..=89 => RecordStatus::Rewritten,
            _ => RecordStatus::FailedVerify,
        };
        d = d.record(n, &key, version, status);
        if rng.random_bool(0.05) {
            d = d.entry(n, "other", &key);
        }
    }
    if rng.random_bool(0.03) {
        d.read_only = Some("it cannot be opened for writing: Permission denied".into());
    }
    if !luks1 && rng.random_bool(0.03) {
        d.json_area = Some((12288, 11800));
    }
    if rng.random_bool(0.05) {
        d.enroll_with_problem = Some("the enroll_with passphrase opens nothing".into());
    }
    d
}

/// A random observed state of `plan`, with former devices and migration origins at times.
fn random_observed(rng: &mut StdRng, plan: &Plan, luks1: &[bool]) -> Observed {
    let nkeys = plan.keys.len();
    let keys: Vec<(String, KeyState)> = plan
        .keys
        .keys()
        .map(|k| (k.clone(), random_key(rng)))
        .collect();
    let disks: Vec<Disk> = plan
        .devices
        .values()
        .zip(luks1)
        .map(|(dev, l1)| {
            let listed: Vec<(String, KeyState)> = keys
                .iter()
                .filter(|(k, _)| dev.keys.iter().any(|dk| dk.key == *k))
                .cloned()
                .collect();
            random_disk(rng, &dev.id, *l1, &listed, nkeys)
        })
        .collect();
    let keys_ref: Vec<(&str, KeyState)> =
        keys.iter().map(|(k, s)| (k.as_str(), s.clone())).collect();
    let mut obs = scenario::observed(plan, disks, keys_ref);
    let mut states = BTreeMap::new();
    for k in plan.keys.keys() {
        states.insert(("other".to_string(), k.clone()), random_key(rng));
    }
    obs = scenario::with_origins(plan, obs, &states);
    if rng.random_bool(0.2) {
        let former = random_disk(rng, "old", false, &keys, nkeys).state("/srv/old.img".into());
        obs.former.insert("old".into(), former);
    }
    if rng.random_bool(0.05) {
        obs.former_unreadable
            .push(("lost".into(), "/srv/lost.img".into(), "missing".into()));
    }
    obs
}

/// Compares the two planners on one state; panics with the seed and both results on a
/// difference.
fn compare(seed: u64, plan: &Plan, obs: &Observed, rotate: &[String]) {
    let opts = DiffOptions {
        rotate: rotate.to_vec(),
    };
    let new = crate::diff::diff(plan, obs, &opts);
    let old = super::super::legacy::diff(plan, obs, &opts);
    let context = || format!("seed {seed}\nnew:\n{}", scenario::render(&new));
    match (&new, &old) {
        (Err(n), Err(o)) => {
            let n: Vec<&str> = n.iter().map(|r| r.message.as_str()).collect();
            let o: Vec<&str> = o.iter().map(|r| r.0.as_str()).collect();
            assert_eq!(n, o, "refusals differ, {}", context());
        }
        (Ok(n), Ok(o)) => same_plan(n, o, &context),
        _ => panic!(
            "one refused, the other did not ({}), {}",
            old.as_ref().map_or("legacy refused", |_| "new refused"),
            context()
        ),
    }
}

fn same_plan(n: &Diff, o: &Diff, context: &dyn Fn() -> String) {
    assert_eq!(n.keys, o.keys, "key changes differ, {}", context());
    assert_eq!(n.slots, o.slots, "keyslot changes differ, {}", context());
    assert_eq!(n.notes, o.notes, "notes differ, {}", context());
    assert_eq!(
        n.graph.steps(),
        o.graph.steps(),
        "steps differ, {}",
        context()
    );
    assert!(n.graph.is_acyclic(), "cycle, {}", context());
    let (rn, ro) = (reachability(&n.graph), reachability(&o.graph));
    for (i, (a, b)) in rn.iter().zip(&ro).enumerate() {
        assert_eq!(
            a,
            b,
            "steps reachable from [{i}] differ (new vs legacy), {}\nlegacy deps {:?}",
            context(),
            o.graph.deps()
        );
    }
}

#[test]
fn the_planner_plans_what_the_legacy_planner_planned() {
    let files = files();
    let mut stats = (0usize, 0usize, 0usize);
    let cases = std::env::var("KEYPLAN_PLANNER_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES);
    for seed in 0..cases {
        let mut rng = StdRng::seed_from_u64(seed);
        let (plan, luks1) = random_plan(&mut rng, &files);
        let obs = random_observed(&mut rng, &plan, &luks1);
        let rotate: Vec<String> = plan
            .keys
            .keys()
            .filter(|_| rng.random_bool(0.2))
            .cloned()
            .collect();
        compare(seed, &plan, &obs, &rotate);
        match crate::diff::diff(&plan, &obs, &DiffOptions { rotate }) {
            Ok(d) if d.is_empty() => stats.0 += 1,
            Ok(_) => stats.1 += 1,
            Err(_) => stats.2 += 1,
        }
    }
    eprintln!(
        "planner vs legacy planner: {cases} random states: {} without changes, {} with changes, {} refused; all equal",
        stats.0, stats.1, stats.2
    );
    // Not vacuous: the states cover plans with changes, without, and refusals.
    let share = |n: usize, percent: usize| n * 100 >= cases as usize * percent;
    assert!(
        stats.0 > 0 && share(stats.1, 20) && share(stats.2, 5),
        "{stats:?}"
    );
}
