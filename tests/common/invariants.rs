//! The invariant checks of an interrupted run (docs/rotation.md "The invariants"), asked of
//! cryptsetup and the file KMS's files directly: I1 after a crash, and the end state after the
//! next apply. The crash matrix (tests/engine/crash.rs) and the upgrade fixtures
//! (tests/engine/upgrade.rs) both judge runs with these.

use std::path::Path;

use super::{bound, file_kms_state_in, keyslots, luks2_json, opens, INITIAL};

/// One device of a checked scenario: its image file (relative to the scenario's directory),
/// `luks1` or `luks2`, and the ids of the keys the final plan gives it (the file KMS's names).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Device {
    /// Image file, relative to the scenario's directory.
    pub file: String,
    /// `luks1` or `luks2`.
    pub luks: String,
    /// Keys of the final plan.
    pub keys: Vec<String>,
}

/// The current version's passphrase of `key` in each file KMS directory of `kms_dirs` (under
/// `root`) that has one, with whether a version is pending there.
pub fn currents(root: &Path, kms_dirs: &[&str], key: &str) -> Vec<(String, Vec<u8>, bool)> {
    kms_dirs
        .iter()
        .filter_map(|d| {
            let (cur, pending) = file_kms_state_in(&root.join(d), key);
            cur.map(|c| (d.to_string(), c, pending))
        })
        .collect()
}

/// I1: for every device and every key the plan gives it, the current version of that key in
/// every file KMS of `kms_dirs` that has one opens the device; and some passphrase known to
/// the test (the initial one, or such a version) opens every device.
pub fn check_i1(root: &Path, kms_dirs: &[&str], devices: &[Device], when: &str) {
    for d in devices {
        let dev = root.join(&d.file);
        let mut any = opens(&dev, INITIAL, None);
        for k in &d.keys {
            for (kms, cur, _) in currents(root, kms_dirs, k) {
                assert!(
                    opens(&dev, &cur, None),
                    "{when}: I1 broken: the current {k} in {kms} does not open {}",
                    d.file
                );
                any = true;
            }
        }
        assert!(any, "{when}: nothing known opens {}", d.file);
    }
}

/// The end state after convergence: every key has one current version (in exactly one file
/// KMS of `kms_dirs`) and none pending; it opens every device that lists the key; each device
/// holds exactly one keyslot per key plus the initial one (unless `remove`:
/// `unmanaged_keyslots: remove`), the initial passphrase opens it exactly when it is kept;
/// each LUKS2 device has one `keyplan` token per key, every token naming an existing keyslot
/// bound to the volume key (no orphan keyslot, no orphan token).
pub fn check_converged(
    root: &Path,
    kms_dirs: &[&str],
    devices: &[Device],
    remove: bool,
    when: &str,
) {
    for d in devices {
        let dev = root.join(&d.file);
        let slots = keyslots(&dev);
        let expected = d.keys.len() + usize::from(!remove);
        assert_eq!(
            slots.len(),
            expected,
            "{when}: {} has keyslots {slots:?}, expected {expected} (orphan or missing keyslot)",
            d.file
        );
        assert_eq!(
            opens(&dev, INITIAL, None),
            !remove,
            "{when}: initial passphrase on {} (remove={remove})",
            d.file
        );
        for k in &d.keys {
            let cur = currents(root, kms_dirs, k);
            assert_eq!(
                cur.len(),
                1,
                "{when}: {k} has a current version in {:?}, expected exactly one KMS",
                cur.iter().map(|c| &c.0).collect::<Vec<_>>()
            );
            let (kms, cur, pending) = &cur[0];
            assert!(
                !pending,
                "{when}: {k} has a leftover pending version in {kms}"
            );
            assert!(
                opens(&dev, cur, None),
                "{when}: current {k} does not open {}",
                d.file
            );
        }
        if d.luks == "luks2" {
            check_tokens(&dev, d, &slots, when);
        }
    }
}

/// One `keyplan` token per key of `d`, each naming a keyslot of `slots` bound to segment 0.
fn check_tokens(dev: &Path, d: &Device, slots: &[u32], when: &str) {
    let json = luks2_json(dev);
    let tokens: Vec<&serde_json::Value> = json["tokens"]
        .as_object()
        .expect("tokens")
        .values()
        .filter(|t| t["type"] == "keyplan")
        .collect();
    assert_eq!(
        tokens.len(),
        d.keys.len(),
        "{when}: tokens of {}: {tokens:?}",
        d.file
    );
    for t in tokens {
        for ks in t["keyslots"].as_array().expect("keyslots") {
            let n: u32 = ks.as_str().and_then(|s| s.parse().ok()).expect("slot");
            assert!(
                slots.contains(&n),
                "{when}: orphan token for keyslot {n} on {}",
                d.file
            );
            assert!(bound(dev, n), "{when}: keyslot {n} of {} unbound", d.file);
        }
    }
}
