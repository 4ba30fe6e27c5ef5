//! keyplan's records in a real LUKS2 header that this keyplan cannot read (a newer keyplan's
//! token, a damaged one) are refused, never taken for unmanaged keyslots: under
//! `unmanaged_keyslots: remove` such a keyslot would otherwise be killed (issue 47,
//! src/world/records.rs `token_record`).

use crate::common::*;
use std::path::Path;
use std::process::Command;

/// A scratch with LUKS2 image `d1.img` enrolled by `apply` with key `k` (`options` added to the
/// device's plan entry): the scratch and the image.
fn enrolled_with(options: &str) -> (Scratch, std::path::PathBuf) {
    let s = Scratch::new();
    s.initial_pass();
    let d = s.image("d1.img", "luks2");
    s.plan(
        "keyplan.yaml",
        &one_key_plan(&format!(
            "  d1: {{ path: d1.img, keys: [k], enroll_with: initial.pass{options} }}"
        )),
    );
    s.ok(&["apply", "--auto-approve"], 0);
    (s, d)
}

/// A LUKS2 image `d1.img` enrolled by `apply` with key `k` under `unmanaged_keyslots: remove`
/// (the initial passphrase removed): the scratch, the image, and its keyplan token's id, JSON
/// and keyslot.
fn enrolled() -> (Scratch, std::path::PathBuf, u32, serde_json::Value, u32) {
    let (s, d) = enrolled_with(", unmanaged_keyslots: remove");
    let (id, json) = (0..32)
        .find_map(|id| {
            let json = export(&d, id)?;
            (json["type"] == "keyplan").then_some((id, json))
        })
        .expect("apply wrote a keyplan token");
    let slot = u32::try_from(json["slot"].as_u64().expect("slot")).expect("u32");
    assert!(opens(&d, &s.key_get("k", None), Some(slot)));
    assert_eq!(
        keyslots(&d),
        vec![slot],
        "the initial passphrase was removed"
    );
    (s, d, id, json, slot)
}

/// `cryptsetup token export --token-id id`, parsed; `None` when there is no such token.
fn export(dev: &Path, id: u32) -> Option<serde_json::Value> {
    let out = Command::new("cryptsetup")
        .env("LC_ALL", "C")
        .args(["token", "export", "--token-id", &id.to_string()])
        .arg(dev)
        .output()
        .expect("cryptsetup token export");
    if !out.status.success() {
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).expect("token JSON"))
}

/// Replaces token `id` of `dev` with `json` (`cryptsetup token import --token-replace`).
fn replace_token(dev: &Path, id: u32, json: &serde_json::Value) {
    let mut child = Command::new("cryptsetup")
        .args([
            "token",
            "import",
            "--token-replace",
            "--token-id",
            &id.to_string(),
        ])
        .arg(dev)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("cryptsetup token import");
    std::io::Write::write_all(
        child.stdin.as_mut().expect("stdin"),
        json.to_string().as_bytes(),
    )
    .expect("write token");
    drop(child.stdin.take());
    assert!(child.wait().expect("wait").success(), "token import");
}

/// `plan` and `apply` refuse the device with `expect` in their output, and the keyslot, its
/// token and the header are left as they were.
fn refused(s: &Scratch, d: &Path, id: u32, token: &serde_json::Value, slot: u32, expect: &[&str]) {
    let key = s.key_get("k", None);
    // Before issue 47 the token was skipped: `apply` adopted the keyslot (importing a token of
    // its own beside the newer one), and with `--rotate` killed it once the new version was in.
    let runs: [&[&str]; 3] = [
        &["plan"],
        &["apply", "--auto-approve"],
        &["apply", "--auto-approve", "--rotate", "k"],
    ];
    for args in runs {
        let out = s.ok(args, 1);
        for e in expect {
            assert!(out.contains(e), "{args:?}: {e:?} missing in {out}");
        }
        assert!(!out.contains("kill keyslot"), "{args:?}: {out}");
    }
    assert!(
        opens(d, &key, Some(slot)),
        "keyslot {slot} still opens with k"
    );
    assert_eq!(keyslots(d), vec![slot], "no keyslot added or removed");
    assert_eq!(
        export(d, id).as_ref(),
        Some(token),
        "the token is untouched"
    );
}

/// A token written by a newer keyplan (`keyplan_format` 2, another shape) is refused with the
/// newer-format message naming device, keyslot and token; the keyslot is not removed.
#[test]
fn tokens_of_a_newer_keyplan_are_refused_not_removed() {
    let (s, d, id, mut json, slot) = enrolled();
    let m = json.as_object_mut().expect("object");
    m.insert("keyplan_format".into(), 2.into());
    let key = m.remove("key").expect("key");
    m.insert("key_id".into(), key);
    replace_token(&d, id, &json);
    let document = format!("device d1 keyslot {slot} token {id} is luks2-token format 2");
    refused(
        &s,
        &d,
        id,
        &json,
        slot,
        &[&document, "written by a newer keyplan"],
    );
}

/// A damaged `keyplan` token (no `version`) is refused as such, naming the keyslot and what to
/// do; the keyslot is not removed.
#[test]
fn unreadable_keyplan_tokens_are_refused_not_removed() {
    let (s, d, id, mut json, slot) = enrolled();
    json.as_object_mut().expect("object").remove("version");
    replace_token(&d, id, &json);
    let document = format!("device d1 keyslot {slot} token {id} is a `keyplan` token");
    refused(
        &s,
        &d,
        id,
        &json,
        slot,
        &[
            &document,
            "cannot read",
            "cryptsetup token export --token-id",
        ],
    );
}

/// A token whose `keyplan_format` is 0 (which no keyplan writes) is refused as unreadable, not
/// read as format 1 (found by a new-user trial).
#[test]
fn a_token_of_format_zero_is_refused_not_read() {
    let (s, d, id, mut json, slot) = enrolled();
    json["keyplan_format"] = 0.into();
    replace_token(&d, id, &json);
    let document = format!("device d1 keyslot {slot} token {id} is a `keyplan` token");
    refused(&s, &d, id, &json, slot, &[&document, "cannot read"]);
}

/// Every file under `dir` with its bytes: the state a refusal must leave as it was.
fn snapshot(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = walk(dir)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "lock"))
        .map(|p| {
            let bytes = std::fs::read(&p).expect("read");
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

/// A `copies.json` of a newer format stops `plan` and `apply` before anything is staged or
/// added: a rotation's copy search would have to write it. Before, `plan` only warned and
/// `apply` staged a version and added a keyslot before failing (found by a new-user trial).
#[test]
fn a_newer_copies_file_stops_plan_and_apply_before_anything_changes() {
    // The initial passphrase's keyslot stays (unmanaged, kept): retiring a version then
    // searches it for copies, which writes copies.json.
    let (s, d) = enrolled_with("");
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let copies = s.path(".keyplan/copies.json");
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&copies).expect("a rotation wrote copies.json"))
            .expect("JSON");
    doc["format"] = 2.into();
    std::fs::write(&copies, doc.to_string()).expect("write");
    let (keys, state) = (snapshot(&s.path("keys")), snapshot(&s.path(".keyplan")));
    let (slots, key) = (keyslots(&d), s.key_get("k", None));
    for args in [
        &["plan"][..],
        &["apply", "--auto-approve", "--rotate", "k"][..],
    ] {
        let out = s.ok(args, 1);
        assert!(
            out.contains("copies-json format 2, written by a newer keyplan"),
            "{args:?}: {out}"
        );
        assert!(!out.contains("staged"), "{args:?}: {out}");
    }
    assert_eq!(snapshot(&s.path("keys")), keys, "the KMS is untouched");
    assert_eq!(
        snapshot(&s.path(".keyplan")),
        state,
        "the state directory is untouched"
    );
    assert_eq!(keyslots(&d), slots, "no keyslot added or removed");
    assert!(
        opens(&d, &key, None),
        "the current version still opens the device"
    );
}
