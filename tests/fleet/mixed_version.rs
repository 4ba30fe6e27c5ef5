//! A fleet whose agents are half the previous release, half this keyplan (issue 47,
//! docs/upgrading.md), as a DaemonSet rolling update leaves it: with `KEYPLAN_PREVIOUS_BIN`
//! naming an older keyplan (scripts/upgrade-test.sh builds one), four nodes share one key in a
//! file KMS on the real control plane (tests/common/kube.rs), worker-1 and worker-2 run the old
//! agent and worker-3 and worker-4 this one. The key is enrolled, then rotated; once the
//! rotation's new version is staged, worker-1's old agent is killed and replaced by this
//! keyplan's (its Pod updated mid-rollout, the same state directory). Checked: a witness sees
//! the KMS's current version open every device at every instant (no lock-out); the rotation
//! commits and the fleet converges (the rollout finishes, so no vote was lost: the commit waits
//! for every node's); every device then holds exactly its first keyslot and one of the current
//! version, with one `keyplan` token (no double keyslot), and the KMS records one holder per
//! node and no vote left. Without `KEYPLAN_PREVIOUS_BIN` it reports SKIPPED.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::agent::{
    file_agent_config, file_meta, now, report, vault_agents, wait_for, Agent, ConfigMapDir, Real,
    MANY_AGENTS,
};
use crate::common::*;

/// Starts `a` with the keyplan binary `bin` instead of this one (an old agent's image).
fn spawn_bin(a: &mut Agent, bin: &Path) {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&a.log)
        .expect("log");
    let mut cmd = std::process::Command::new(bin);
    cmd.args(&a.args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    for (k, v) in &a.env {
        cmd.env(k, v);
    }
    a.child = Some(cmd.spawn().expect("spawn the old agent"));
    a.started = now();
}

/// The LUKS2 `keyplan` tokens of `img`.
fn tokens(img: &Path) -> usize {
    luks2_json(img)["tokens"]
        .as_object()
        .map(|t| t.values().filter(|t| t["type"] == "keyplan").count())
        .unwrap_or(0)
}

#[test]
fn mixed_version_fleet_rolls_out_a_shared_key() {
    let Some(old_bin) = std::env::var_os("KEYPLAN_PREVIOUS_BIN").map(PathBuf::from) else {
        eprintln!(
            "SKIPPED: set KEYPLAN_PREVIOUS_BIN to an older keyplan (scripts/upgrade-test.sh)"
        );
        return;
    };
    assert!(
        old_bin.is_file(),
        "KEYPLAN_PREVIOUS_BIN: {}",
        old_bin.display()
    );
    let _turn = MANY_AGENTS.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new();
    let Some(fake) = Real::new("fleet-mixed") else {
        return;
    };
    let fake = Arc::new(fake);
    let names: Vec<String> = (1..=4).map(|i| format!("worker-{i}")).collect();
    let kubeconfig = fake.agent_kubeconfig(&names, Some(2));
    let initial = s.initial_pass();
    let images: Vec<(String, PathBuf)> = names
        .iter()
        .map(|n| {
            std::fs::create_dir_all(s.path(n)).expect("mkdir");
            (n.clone(), s.small_image(&format!("{n}/a.img"), "luks2"))
        })
        .collect();
    let keys = s.path("keys");
    let plan = |rotate: Option<&str>| {
        let mut t = format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: {} }}\nkeys:\n  k: {{ kms: local{} }}\ndevices:\n",
            keys.display(),
            rotate.map(|r| format!(", rotate_after: {r}")).unwrap_or_default()
        );
        for (node, img) in &images {
            t += &format!(
                "  {node}-a: {{ path: {}, node: {node}, keys: [k], enroll_with: {} }}\n",
                img.display(),
                initial.display()
            );
        }
        t + &format!(
            "{FAST_PBKDF}  fleet: {{ max_concurrent_nodes: 2, max_failed_nodes: 4, namespace: {} }}\n",
            fake.ns
        )
    };
    let config = file_agent_config(&s, &keys);
    let mut cm = ConfigMapDir::new(s.path("plan-volume"), &plan(None));
    let mut agents = vault_agents(
        &s,
        &names,
        &[&cm.plan(), &config],
        &kubeconfig,
        &["--interval", "3s", "--poll", "1s", "--slot-duration", "4s"],
        &[],
    );
    let old_nodes = ["worker-1", "worker-2"];
    for (a, n) in agents.iter_mut().zip(&names) {
        if old_nodes.contains(&n.as_str()) {
            spawn_bin(a, &old_bin);
        } else {
            a.spawn();
        }
    }
    let meta = || file_meta(s.dir.path(), "k");
    let current = || meta()["current"].as_u64().unwrap_or(0);
    let holder_ids = || -> Vec<String> {
        meta()["holders"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    let dump = || {
        let mut out = String::new();
        for n in &names {
            let r = report(&fake, n);
            out += &format!(
                "{n}: {} {}\n",
                r.as_ref()
                    .map(|r| r["state"].to_string())
                    .unwrap_or_default(),
                r.as_ref()
                    .map(|r| r["message"].to_string())
                    .unwrap_or_default()
            );
        }
        out + &format!("meta {}\n", meta())
    };
    let converged = || {
        let m = meta();
        let c = m["current"].as_u64().unwrap_or(0);
        c >= 1
            && m["pending"].is_null()
            && holder_ids().iter().all(|h| !h.contains(" verified v"))
            && names.iter().all(|n| {
                report(&fake, n).is_some_and(|r| {
                    r["state"] == "in_sync"
                        && r["changes"] == 0
                        && r["keys"][0]["current_version"].as_u64() == Some(c)
                })
            })
            && images.iter().all(|(_, img)| keyslots(img).len() == 2)
    };

    // 1. Enrollment by old and new agents together.
    wait_for(
        300,
        "enrollment on four nodes, two old agents",
        converged,
        dump,
    );
    let v_enrolled = current();

    // The witness: the KMS's current version opens every device at every instant.
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<(usize, Vec<String>)>> = Arc::new(Mutex::new((0, Vec::new())));
    let witness = {
        let (stop, seen) = (Arc::clone(&stop), Arc::clone(&seen));
        let root = s.dir.path().to_path_buf();
        let images = images.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                for (node, img) in &images {
                    let (Some(pass), _) = file_kms_state(&root, "k") else {
                        continue;
                    };
                    if opens(img, &pass, None) {
                        seen.lock().unwrap().0 += 1;
                        continue;
                    }
                    // A commit between the read and the test is no violation.
                    if file_kms_state(&root, "k").0.as_deref() == Some(pass.as_slice())
                        && !opens(img, &pass, None)
                    {
                        seen.lock().unwrap().1.push(format!(
                            "{node}: the KMS's current k does not open {}",
                            img.display()
                        ));
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    // 2. A rotation; once its version is staged, worker-1's old agent is replaced by a new one.
    cm.write(&plan(Some("1s")));
    let t = Instant::now();
    wait_for(
        180,
        "the rotation's new version staged",
        || !meta()["pending"].is_null() || current() > v_enrolled,
        dump,
    );
    let replaced_while_pending = !meta()["pending"].is_null();
    agents[0].kill9();
    agents[0].spawn();
    wait_for(
        240,
        "the rotation's commit",
        || current() > v_enrolled,
        dump,
    );
    let rotated_in = t.elapsed();
    cm.write(&plan(None));
    wait_for(300, "convergence after the rotation", converged, dump);

    stop.store(true, Ordering::SeqCst);
    witness.join().expect("witness");
    let (checks, violations) = seen.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "lock-out: {violations:?}\n{}",
        dump()
    );
    assert!(checks > 20, "only {checks} witness checks");
    for (node, img) in &images {
        assert_eq!(keyslots(img).len(), 2, "{node}: keyslots\n{}", dump());
        assert_eq!(tokens(img), 1, "{node}: keyplan tokens\n{}", dump());
    }
    let mut holders: Vec<String> = holder_ids();
    holders.sort();
    let nodes: BTreeSet<&str> = holders.iter().filter_map(|h| h.split(':').next()).collect();
    assert_eq!(holders.len(), 4, "holder records {holders:?}");
    assert_eq!(nodes.len(), 4, "holder records {holders:?}");
    let v = current();
    println!(
        "mixed fleet: 4 nodes (worker-1, worker-2 on the previous keyplan, worker-3, worker-4 on this one), shared key enrolled at v{v_enrolled}, rotated to v{v} in {:.0?}; worker-1 replaced by this keyplan {} the rotation; {checks} witness checks, no lock-out, 2 keyslots and 1 token per device, 4 holder records, no vote left",
        rotated_in,
        if replaced_while_pending { "while a version was pending in" } else { "after" }
    );
    for a in agents.iter_mut() {
        a.term(10);
    }
}
