//! One dead disk does not stop a host (issue 29). A device that is gone or unreadable is left
//! alone and reported (plan text and JSON, apply, status, verify, exit status 1 with what to
//! do); every change that does not involve it goes ahead: a key held only by healthy devices
//! rotates, a key the dead device lists is not committed (its current version still opens
//! every device listing it), and no key version is destroyed while the device is unreadable.

use std::path::{Path, PathBuf};

use crate::common::*;

/// Three devices: d1 and d3 list key `a`, d2 lists key `b`; all enrolled.
struct Host {
    s: Scratch,
    d1: PathBuf,
    d2: PathBuf,
    d3: PathBuf,
}

fn host() -> Host {
    let s = Scratch::new();
    s.initial_pass();
    let d1 = s.small_image("d1.img", "luks2");
    let d2 = s.small_image("d2.img", "luks2");
    let d3 = s.small_image("d3.img", "luks1");
    let dev = |id: &str, p: &Path, k: &str| {
        format!(
            "  {id}: {{ path: {}, keys: [{k}], enroll_with: initial.pass }}\n",
            p.display()
        )
    };
    s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  a: {{ kms: local }}\n  b: {{ kms: local }}\ndevices:\n{}{}{}{FAST_PBKDF}",
            dev("d1", &d1, "a"),
            dev("d2", &d2, "b"),
            dev("d3", &d3, "a"),
        ),
    );
    s.ok(&["apply", "--auto-approve"], 0);
    Host { s, d1, d2, d3 }
}

/// The checks with d3 unusable (`how` says why, for messages).
fn goes_around_it(h: &Host, how: &str) {
    let s = &h.s;
    let a1 = s.key_get("a", None);
    let b1 = s.key_get("b", None);

    let out = s.ok(&["plan", "--rotate", "a", "--rotate", "b"], 1);
    assert!(
        out.contains("! device d3") && out.contains("cannot be used"),
        "{how}: {out}"
    );
    assert!(out.contains("~ key b v1 -> v2"), "{how}: b rotates: {out}");
    assert!(
        out.contains("key a is not rotated") && !out.contains("~ key a v1"),
        "{how}: a waits for d3: {out}"
    );
    assert!(
        out.contains("Error: 1 device(s) of the plan cannot be used: d3"),
        "{how}: {out}"
    );

    let json = s.ok(&["plan", "--json", "--rotate", "b"], 1);
    let start = json.find('{').expect("json");
    let end = json.rfind('}').expect("json");
    let doc: serde_json::Value = serde_json::from_str(&json[start..=end]).expect("plan json");
    assert_eq!(
        doc["unavailable_devices"][0]["device"], "d3",
        "{how}: {doc}"
    );
    assert_eq!(doc["changes_present"], true);

    let out = s.ok(
        &["apply", "--auto-approve", "--rotate", "a", "--rotate", "b"],
        1,
    );
    assert!(out.contains("Apply complete!"), "{how}: {out}");
    let b2 = s.key_get("b", None);
    assert_ne!(b1, b2, "{how}: b rotated");
    assert!(opens(&h.d2, &b2, None) && !opens(&h.d2, &b1, None), "{how}");
    assert_eq!(s.key_get("a", None), a1, "{how}: a not rotated");
    assert!(
        opens(&h.d1, &a1, None),
        "{how}: d1 still opens with a's current"
    );

    // A second rotation of b destroys nothing while d3 cannot be read (d3 named once, as the
    // plan's device, not as one that left the plan).
    let out = s.ok(&["apply", "--auto-approve", "--rotate", "b"], 1);
    assert!(
        out.contains("b v1 is kept in the KMS")
            && out.contains("d3 (")
            && !out.contains("formerly at"),
        "{how}: {out}"
    );
    assert_eq!(s.key_get("b", Some(1)), b1, "{how}: b v1 kept");

    let status = s.ok(&["status"], 1);
    assert!(
        status.contains("d3") && status.contains("take device d3 out of the plan"),
        "{how}: {status}"
    );
    let json = s.ok(&["status", "--format", "json"], 1);
    let doc: serde_json::Value = serde_json::from_str(&json).expect("status json");
    let d3 = doc["devices"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["id"] == "d3"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(d3["drift"][0]["kind"], "unreadable", "{how}: {d3}");

    let out = s.ok(&["verify"], 1);
    assert!(out.contains("ok    d1: a v1"), "{how}: {out}");
    assert!(out.contains("ok    d2: b v3"), "{how}: {out}");
    assert!(
        out.contains("FAIL  d3: a could not be checked"),
        "{how}: {out}"
    );
}

/// Once d3 is back, a rotates on both its devices, and b's old versions go.
fn back(h: &Host) {
    let s = &h.s;
    let a1 = s.key_get("a", None);
    s.ok(&["status"], 0);
    s.ok(&["apply", "--auto-approve", "--rotate", "a"], 0);
    let a2 = s.key_get("a", None);
    assert_ne!(a1, a2);
    for d in [&h.d1, &h.d3] {
        assert!(
            opens(d, &a2, None) && !opens(d, &a1, None),
            "{}",
            d.display()
        );
    }
    s.ok(&["plan", "--detailed-exitcode"], 0);
}

#[test]
fn a_missing_device_is_gone_around() {
    let h = host();
    let away = h.s.path("d3.img.pulled");
    std::fs::rename(&h.d3, &away).expect("pull d3");
    goes_around_it(&h, "missing");
    std::fs::rename(&away, &h.d3).expect("put d3 back");
    back(&h);
}

#[test]
fn a_device_with_a_wiped_header_is_gone_around() {
    let h = host();
    let saved = std::fs::read(&h.d3).expect("read d3");
    let mut wiped = saved.clone();
    wiped[..4096].fill(0);
    std::fs::write(&h.d3, &wiped).expect("wipe d3's header");
    goes_around_it(&h, "wiped");
    std::fs::write(&h.d3, &saved).expect("restore d3");
    back(&h);
}

/// A path without `uuid:` that now holds another LUKS device than the one keyplan worked on
/// there (a loop device attached to another image, a replaced disk): `plan` enrolls the new
/// one, as the plan names it, but says so and how to pin the right one (issue 46).
#[test]
fn a_path_that_now_holds_another_luks_device_is_noted_at_plan_time() {
    let s = Scratch::new();
    s.initial_pass();
    s.small_image("d.img", "luks2");
    s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local }}\ndevices:\n  d: {{ path: d.img, keys: [k], enroll_with: initial.pass }}\n{FAST_PBKDF}"
        ),
    );
    s.ok(&["apply", "--auto-approve"], 0);
    // Another image behind the same path, as `losetup` re-attached to another file leaves it.
    std::fs::rename(s.path("d.img"), s.path("first.img")).expect("set the first disk aside");
    s.small_image("d.img", "luks2");
    let out = std::process::Command::new("cryptsetup")
        .arg("luksUUID")
        .arg(s.path("d.img"))
        .output()
        .expect("cryptsetup luksUUID");
    let new_uuid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!new_uuid.is_empty());
    let out = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(
        out.contains("keyplan worked on another LUKS device at this path before"),
        "{out}"
    );
    assert!(out.contains(&format!("uuid: {new_uuid}")), "{out}");
    // Pinned, the note is gone and the plan is the same enrollment.
    s.plan(
        "keyplan.yaml",
        &format!(
            "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local }}\ndevices:\n  d: {{ path: d.img, uuid: {new_uuid}, keys: [k], enroll_with: initial.pass }}\n{FAST_PBKDF}"
        ),
    );
    let out = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(!out.contains("worked on another LUKS device"), "{out}");
}
