//! The differential test of the in-memory LUKS door of the deterministic simulation
//! (tests/sim/doors.rs) against real cryptsetup: random operation sequences on real LUKS2
//! and LUKS1 images and in memory must give the same results and the same observed headers.
//! `KEYPLAN_DIFF_STEPS=N` (default 40 per image) and `KEYPLAN_DIFF_SEED=S` (default 0) run
//! longer or other sequences.

use crate::sim;

use std::collections::BTreeMap;

/// Keeps the in-memory LUKS door honest: the same operation sequences on a real cryptsetup
/// image and in memory give the same observed state (keyslots, bound, tokens and their
/// keyslots, passphrase tests) and the same success or failure of every operation.
#[test]
fn the_in_memory_luks_door_agrees_with_cryptsetup() {
    use keyplan::luks::{Cryptsetup, LuksDoor, LuksVersion};
    use keyplan::secret::Passphrase;
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().expect("tempdir");
    let cs = Cryptsetup::new();
    let fast = keyplan::spec::PbkdfSettings {
        kind: keyplan::spec::PbkdfType::Pbkdf2,
        iterations: Some(1000),
        memory_kib: None,
        parallel: None,
        iter_time_ms: None,
    };
    let passes: Vec<Passphrase> = (0..4)
        .map(|i| Passphrase::new(format!("differential passphrase {i}").into_bytes()))
        .collect();
    let mut ops_run = 0;
    for (round, version) in [
        (0u64, LuksVersion::Luks2),
        (1, LuksVersion::Luks2),
        (2, LuksVersion::Luks1),
    ] {
        let img = dir.path().join(format!("d{round}.img"));
        keyplan::luks::create_image(&img, keyplan::luks::TEST_IMAGE_BYTES).expect("image");
        cs.format(&img, version, &passes[0], Some(&fast), None)
            .expect("format");
        let uuid = cs.dump(&img).expect("dump").uuid;
        let mem_sim = sim::standalone(version, &uuid, passes[0].expose(), &img);
        let mem = &mem_sim.luks;
        let mut rng = rand::rngs::StdRng::seed_from_u64(env_u64("KEYPLAN_DIFF_SEED", 0) + round);
        let mut before = (cs.dump(&img).expect("dump"), mem.dump(&img).expect("dump"));
        for step in 0..env_u64("KEYPLAN_DIFF_STEPS", 40) {
            let slot = rng.random_range(0..6u32);
            let p = &passes[rng.random_range(0..passes.len())];
            let q = &passes[rng.random_range(0..passes.len())];
            let op = rng.random_range(0..8u32);
            let what = format!("{version} round {round} step {step}: op {op} keyslot {slot}");
            let (real, fake): (Result<String, String>, Result<String, String>) = match op {
                0 | 1 => {
                    let unlock = if op == 0 {
                        None
                    } else {
                        Some(rng.random_range(0..6u32))
                    };
                    let target = keyplan::luks::AddTarget::from(version);
                    (
                        LuksDoor::add_keyslot(
                            &cs,
                            &img,
                            target.clone(),
                            unlock,
                            p,
                            slot,
                            q,
                            Some(&fast),
                        )
                        .map(|()| "added".into())
                        .map_err(|e| kind(&e)),
                        mem.add_keyslot(&img, target, unlock, p, slot, q, Some(&fast))
                            .map(|()| "added".into())
                            .map_err(|e| kind(&e)),
                    )
                }
                2 => (
                    cs.kill_keyslot_unchecked(&img, slot)
                        .map(|()| "killed".into())
                        .map_err(|e| kind(&e)),
                    mem.kill_keyslot_unchecked(&img, slot)
                        .map(|()| "killed".into())
                        .map_err(|e| kind(&e)),
                ),
                3 => (
                    LuksDoor::kill_keyslot(&cs, &img, slot)
                        .map(|()| "killed".into())
                        .map_err(|e| kind(&e)),
                    mem.kill_keyslot(&img, slot)
                        .map(|()| "killed".into())
                        .map_err(|e| kind(&e)),
                ),
                4 => (
                    LuksDoor::test_passphrase(&cs, &img, slot, p)
                        .map(|b| b.to_string())
                        .map_err(|e| kind(&e)),
                    mem.test_passphrase(&img, slot, p)
                        .map(|b| b.to_string())
                        .map_err(|e| kind(&e)),
                ),
                5 => {
                    let json =
                        serde_json::json!({"type": "keyplan-sim", "keyslots": [slot.to_string()]});
                    let id = if rng.random_bool(0.5) {
                        Some(rng.random_range(0..3u32))
                    } else {
                        None
                    };
                    (
                        LuksDoor::token_import(&cs, &img, id, &json)
                            .map(|i| i.to_string())
                            .map_err(|e| kind(&e)),
                        mem.token_import(&img, id, &json)
                            .map(|i| i.to_string())
                            .map_err(|e| kind(&e)),
                    )
                }
                7 => {
                    // A priority set by hand (`cryptsetup config --priority`, LUKS2 only):
                    // the fake keeps the same, and both must then try keyslots alike.
                    let prio = [
                        ("ignore", keyplan::luks::Priority::Ignore),
                        ("normal", keyplan::luks::Priority::Normal),
                        ("prefer", keyplan::luks::Priority::Prefer),
                    ][rng.random_range(0..3usize)];
                    if version == LuksVersion::Luks2 && before.0.keyslots.contains_key(&slot) {
                        let out = std::process::Command::new("cryptsetup")
                            .args(["config", "--priority", prio.0, "--key-slot"])
                            .arg(slot.to_string())
                            .arg(&img)
                            .output()
                            .expect("cryptsetup config");
                        assert!(out.status.success(), "{what}: cryptsetup config: {out:?}");
                        mem_sim.set_priority(&img, slot, prio.1);
                    }
                    (Ok("priority".into()), Ok("priority".into()))
                }
                _ => {
                    let id = rng.random_range(0..3u32);
                    (
                        LuksDoor::token_remove(&cs, &img, id)
                            .map(|()| "removed".into())
                            .map_err(|e| kind(&e)),
                        mem.token_remove(&img, id)
                            .map(|()| "removed".into())
                            .map_err(|e| kind(&e)),
                    )
                }
            };
            ops_run += 1;
            assert_eq!(real, fake, "{what}: the operation's result differs");
            let (h_real, h_mem) = (cs.dump(&img).expect("dump"), mem.dump(&img).expect("dump"));
            assert_eq!(
                observed(&h_real),
                observed(&h_mem),
                "{what}: the headers differ after it"
            );
            // Salts and epochs differ in value; whether they changed must agree (the engine's
            // drift checks compare salts).
            let changed = |a: &keyplan::luks::Header, b: &keyplan::luks::Header| {
                let salts: Vec<(u32, bool)> = b
                    .keyslots
                    .iter()
                    .filter_map(|(n, k)| a.keyslots.get(n).map(|o| (*n, o.salt != k.salt)))
                    .collect();
                (salts, b.epoch > a.epoch)
            };
            assert_eq!(
                changed(&before.0, &h_real),
                changed(&before.1, &h_mem),
                "{what}: salts or epoch changed differently"
            );
            for n in h_real.keyslots.keys() {
                for pass in &passes {
                    assert_eq!(
                        LuksDoor::test_passphrase(&cs, &img, *n, pass).map_err(|e| kind(&e)),
                        mem.test_passphrase(&img, *n, pass).map_err(|e| kind(&e)),
                        "{what}: keyslot {n} opens differently"
                    );
                }
            }
            let any_real = LuksDoor::test_any_keyslot(&cs, &img, p).map_err(|e| kind(&e));
            let any_mem = mem.test_any_keyslot(&img, p).map_err(|e| kind(&e));
            assert_eq!(
                any_real, any_mem,
                "{what}: a test without a keyslot differs"
            );
            before = (h_real, h_mem);
        }
    }
    eprintln!("differential test: {ops_run} operations on 3 real images (LUKS2, LUKS2, LUKS1) gave the same results and headers in memory");
}

/// A number from the environment, or `default`.
fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// An error's kind (the door's contract is the kind and, for cryptsetup failures, the exit
/// code; messages differ).
fn kind(e: &keyplan::luks::LuksError) -> String {
    use keyplan::luks::LuksError as E;
    match e {
        E::Device { .. } => "device".into(),
        E::NotLuks { .. } => "not LUKS".into(),
        E::Spawn { .. } => "spawn".into(),
        E::Failed { code, .. } => format!("failed (exit {code})"),
        E::Refused { .. } => "refused".into(),
        E::Parse { .. } => "parse".into(),
    }
}

/// What the engine reads from a header: keyslots (bound, priority), tokens (type, keyslots).
type Observed = (
    BTreeMap<u32, (bool, keyplan::luks::Priority)>,
    BTreeMap<u32, (String, Vec<u32>)>,
);

/// See [`Observed`].
fn observed(h: &keyplan::luks::Header) -> Observed {
    (
        h.keyslots
            .iter()
            .map(|(n, k)| (*n, (k.bound, k.priority)))
            .collect(),
        h.tokens
            .iter()
            .map(|(id, t)| (*id, (t.token_type.clone(), t.keyslots.clone())))
            .collect(),
    )
}
