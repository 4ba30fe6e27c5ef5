//! Keyslots in plain view (issue 32, src/diff/unmanaged.rs): `plan` and `status` list every
//! bound keyslot keyplan does not manage and every LUKS2 token of another tool, on every run;
//! `unmanaged_keyslots: { keep: [N] }` removes the other unmanaged keyslots and keeps those.
//! Judged with the real cryptsetup on LUKS2 image files.

use crate::common::*;

fn plan(unmanaged: &str) -> String {
    format!(
        "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local }}\ndevices:\n  a: {{ path: a.img, keys: [k], enroll_with: initial.pass{unmanaged} }}\nsettings:\n  pbkdf: {{ type: pbkdf2, iterations: 1000 }}\n"
    )
}

/// Adds `pass` to keyslot `slot` of `dev` (unlocking with the initial passphrase), as an
/// operator or an installer would.
fn add_keyslot(dev: &std::path::Path, slot: u32, pass: &[u8]) {
    let s = tempfile::tempdir().expect("tempdir");
    let new = s.path().join("new.pass");
    std::fs::write(&new, pass).expect("write");
    let mut cmd = std::process::Command::new(real_cryptsetup());
    cmd.args([
        "luksAddKey",
        "--batch-mode",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-slot",
        &slot.to_string(),
        "--key-file=-",
    ])
    .arg(dev)
    .arg(&new);
    let out = run_with_stdin(cmd, INITIAL);
    assert!(out.status.success(), "{out:?}");
}

/// Imports a token of another tool (Clevis) naming `slot`.
fn clevis_token(dev: &std::path::Path, slot: u32) {
    let mut cmd = std::process::Command::new(real_cryptsetup());
    cmd.args(["token", "import"]).arg(dev);
    let json = format!("{{\"type\":\"clevis\",\"keyslots\":[\"{slot}\"],\"jwe\":{{}}}}");
    let out = run_with_stdin(cmd, json.as_bytes());
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn unmanaged_keyslots_and_other_tools_tokens_are_listed_on_every_run() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan(""));
    s.ok(&["apply", "--auto-approve"], 0);
    add_keyslot(&a, 5, b"recovery passphrase");
    clevis_token(&a, 5);

    // Every plan says it, also one with no changes; twice in a row.
    for _ in 0..2 {
        let text = s.ok(&["plan", "--detailed-exitcode"], 0);
        assert!(
            text.contains(&format!(
                "Keyslots keyplan does not manage (left as they are):\n  a ({}): keyslot 0 (pbkdf2), keyslot 5 (pbkdf2, clevis token 1)\n",
                a.display()
            )),
            "{text}"
        );
        assert!(text.contains("No changes"), "{text}");
    }
    let j: serde_json::Value =
        serde_json::from_str(&s.ok(&["plan", "--json"], 0)).expect("plan --json");
    let u = &j["unmanaged_keyslots"][0];
    assert_eq!(u["device"], "a", "{j}");
    let slots: Vec<(u64, &str)> = u["keyslots"]
        .as_array()
        .expect("keyslots")
        .iter()
        .map(|k| {
            (
                k["keyslot"].as_u64().unwrap_or(99),
                k["fate"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(slots, vec![(0, "kept"), (5, "kept")], "{j}");
    assert_eq!(u["keyslots"][1]["tokens"][0]["type"], "clevis", "{j}");
    assert_eq!(u["tokens"][0]["id"], 1, "{j}");

    // status: text, JSON (format 1.4) and the Prometheus gauge.
    let text = s.ok(&["status"], 0);
    assert!(
        text.contains(
            "  not managed by keyplan: keyslot 0 (pbkdf2), keyslot 5 (pbkdf2, clevis token 1)"
        ),
        "{text}"
    );
    let j: serde_json::Value =
        serde_json::from_str(&s.ok(&["status", "--format", "json"], 0)).expect("status json");
    assert_eq!(j["format_version"], "1.4");
    assert_eq!(
        j["devices"][0]["unmanaged"]["keyslots"][1]["keyslot"], 5,
        "{j}"
    );
    let prom = s.ok(&["status", "--format", "prometheus"], 0);
    assert!(
        prom.contains("keyplan_device_unmanaged_keyslots{device=\"a\"} 2"),
        "{prom}"
    );

    // A keep list: the installer's keyslot 0 goes, the recovery keyslot 5 stays.
    s.plan("keyplan.yaml", &plan(", unmanaged_keyslots: { keep: [5] }"));
    let text = s.ok(&["plan", "--detailed-exitcode"], 2);
    assert!(text.contains("- keyslot 0  unmanaged"), "{text}");
    assert!(
        text.contains("keyslot 5 (pbkdf2, clevis token 1): listed in unmanaged_keyslots.keep"),
        "{text}"
    );
    assert!(!text.contains("- keyslot 5"), "{text}");
    s.ok(&["apply", "--auto-approve"], 0);
    assert!(
        !opens(&a, INITIAL, None),
        "the installer's passphrase still opens a.img"
    );
    assert!(opens(&a, b"recovery passphrase", Some(5)));
    assert!(opens(&a, &s.key_get("k", None), None));
    let text = s.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(text.contains("No changes"), "{text}");

    // Another tool's token on keyplan's own keyslot: a rotation kills that keyslot, and the
    // plan says the token is left naming nothing.
    let [managed] = keyslots(&a)
        .into_iter()
        .filter(|n| *n != 5)
        .collect::<Vec<_>>()[..]
    else {
        panic!("one managed keyslot: {:?}", keyslots(&a));
    };
    clevis_token(&a, managed);
    let text = s.ok(&["plan", "--rotate", "k"], 0);
    assert!(
        text.contains(&format!(
            "Note: device a: keyslot {managed} is killed, and the clevis token 2 names it"
        )),
        "{text}"
    );
    // A token that names another keyslot too keeps that one.
    let mut cmd = std::process::Command::new(real_cryptsetup());
    cmd.args(["token", "import"]).arg(&a);
    let json = format!("{{\"type\":\"clevis\",\"keyslots\":[\"5\",\"{managed}\"],\"jwe\":{{}}}}");
    assert!(run_with_stdin(cmd, json.as_bytes()).status.success());
    let text = s.ok(&["plan", "--rotate", "k"], 0);
    assert!(
        text.contains(&format!(
            "Note: device a: keyslot {managed} is killed, which the clevis token 3 names; the token keeps keyslot 5"
        )),
        "{text}"
    );
}

/// A keep list names keyslots that exist on a LUKS2 device, once each; with no key listed it
/// would remove every other keyslot and is refused as `remove` is.
#[test]
fn a_keep_list_is_validated() {
    let s = Scratch::new();
    s.initial_pass();
    s.plan(
        "keyplan.yaml",
        &plan(", unmanaged_keyslots: { keep: [7, 32, 7] }"),
    );
    let text = s.ok(&["validate"], 1);
    assert!(
        text.contains("unmanaged_keyslots keeps keyslot 32, but a LUKS2 device has keyslots 0-31"),
        "{text}"
    );
    assert!(text.contains("keeps keyslot 7 twice"), "{text}");
    s.plan(
        "keyplan.yaml",
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys: {}\ndevices:\n  a: { path: a.img, unmanaged_keyslots: { keep: [7] } }\n",
    );
    let text = s.ok(&["validate"], 1);
    assert!(text.contains("keyplan::plan::lockout"), "{text}");
    s.plan("keyplan.yaml", &plan(", unmanaged_keyslots: { keep: [] }"));
    let text = s.ok(&["validate"], 1);
    assert!(text.contains("keeps no keyslot (`keep: []`)"), "{text}");
    s.plan(
        "keyplan.yaml",
        &plan(", unmanaged_keyslots: { keep: [7], drop: [1] }"),
    );
    let text = s.ok(&["validate"], 1);
    assert!(text.contains("unmanaged_keyslots"), "{text}");
}

/// A keep list that names a keyslot the device does not have, or one keyplan manages, is
/// refused on that device: a typo must not remove the keyslot that was meant to stay.
#[test]
fn a_keep_list_with_a_typo_removes_nothing() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.small_image("a.img", "luks2");
    s.plan("keyplan.yaml", &plan(""));
    s.ok(&["apply", "--auto-approve"], 0);
    add_keyslot(&a, 5, b"recovery passphrase");
    let before = keyslots(&a);
    for (keep, says) in [
        ("[9]", "keyslot 9 does not exist"),
        ("[1]", "keyslot 1 is keyplan's own (k v1)"),
    ] {
        s.plan(
            "keyplan.yaml",
            &plan(&format!(", unmanaged_keyslots: {{ keep: {keep} }}")),
        );
        let text = s.ok(&["apply", "--auto-approve"], 1);
        assert!(text.contains(says), "{text}");
        assert!(text.contains("this device has: 0, 5"), "{text}");
        assert_eq!(keyslots(&a), before);
    }
    assert!(opens(&a, b"recovery passphrase", Some(5)));
}

/// A keep list (as `remove`) also removes the unmanaged keyslots that the list of keyslots
/// keyplan does not manage leaves out: an unbound keyslot and one of priority `ignore`. `plan`
/// says so on each of their lines, so that the keep list's reader is not surprised (issue 46).
#[test]
fn a_keep_list_says_it_removes_unbound_and_ignored_keyslots_too() {
    let s = Scratch::new();
    s.initial_pass();
    // Room for five keyslots (a small image's keyslots area holds four).
    let a = s.image("a.img", "luks2");
    add_keyslot(&a, 5, b"recovery passphrase");
    // An unbound keyslot (no volume key) and a keyslot cryptsetup tries only when named.
    let pass = s.path("other.pass");
    std::fs::write(&pass, b"another passphrase").expect("write");
    let mut cmd = std::process::Command::new(real_cryptsetup());
    cmd.args([
        "luksAddKey",
        "--batch-mode",
        "--unbound",
        "--key-size",
        "256",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-slot",
        "6",
    ])
    .arg(&a)
    .arg(&pass);
    let out = cmd.output().expect("cryptsetup");
    assert!(out.status.success(), "{out:?}");
    add_keyslot(&a, 7, b"an ignored passphrase");
    let out = std::process::Command::new(real_cryptsetup())
        .args(["config", "--priority", "ignore", "--key-slot", "7"])
        .arg(&a)
        .output()
        .expect("cryptsetup");
    assert!(out.status.success(), "{out:?}");

    s.plan("keyplan.yaml", &plan(", unmanaged_keyslots: { keep: [5] }"));
    let text = s.ok(&["plan", "--detailed-exitcode"], 2);
    let line = |n: u32| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("- keyslot {n} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line(6).contains("unbound keyslots are removed too"),
        "{text}"
    );
    assert!(
        line(7).contains("keyslots of priority ignore are removed too"),
        "{text}"
    );
    assert!(!line(0).contains("removed too"), "{text}");
    s.ok(&["apply", "--auto-approve"], 0);
    assert!(!keyslots(&a).contains(&6), "{:?}", keyslots(&a));
    assert!(!opens(&a, b"an ignored passphrase", Some(7)));
    assert!(opens(&a, b"recovery passphrase", Some(5)));
    assert!(opens(&a, &s.key_get("k", None), None));
}
