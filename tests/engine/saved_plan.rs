//! Saved plans: `keyplan plan -o FILE`, `keyplan apply FILE`, `keyplan show FILE`, and the plan
//! JSON. Real cryptsetup on LUKS image files, file KMS; every outcome is checked with cryptsetup
//! or the KMS directly.

use std::path::PathBuf;

use crate::common::*;

/// Two fresh LUKS2 devices `a`, `b` that open with the initial passphrase; key `k` in the file
/// KMS, not created yet.
fn setup(s: &Scratch) -> Vec<PathBuf> {
    s.initial_pass();
    s.plan(
        "keyplan.yaml",
        &one_key_plan(
            "  a: { path: a.img, keys: [k], enroll_with: initial.pass }\n  b: { path: b.img, keys: [k], enroll_with: initial.pass }",
        ),
    );
    vec![s.image("a.img", "luks2"), s.image("b.img", "luks2")]
}

fn both(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn saved_json(s: &Scratch, name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(s.path(name)).expect("read saved plan"))
        .expect("saved plan is JSON")
}

#[test]
fn saved_plan_applies_once_then_is_refused_as_stale() {
    let s = Scratch::new();
    let devs = setup(&s);
    let out = s.ok(&["plan", "-o", "saved.json"], 0);
    assert!(out.contains("+ key k v1"), "{out}");
    assert!(
        out.contains("Saved the plan to saved.json; apply it with `keyplan apply saved.json`"),
        "{out}"
    );
    // Saving wrote the saved plan only: no KMS, no state directory.
    assert!(!s.path("keys").exists());
    assert!(!s.path(".keyplan").exists());
    let doc = saved_json(&s, "saved.json");
    assert_eq!(doc["format_version"], "1.0");
    assert_eq!(doc["kind"], "keyplan-saved-plan");
    assert!(doc["state"]["digest"]
        .as_str()
        .is_some_and(|d| d.len() == 64));
    assert!(doc["state"]["devices"]["a"].is_string());
    assert!(doc["state"]["keys"]["k"].is_string());
    assert_eq!(doc["changes"]["keyslots"].as_array().map(Vec::len), Some(2));
    assert_eq!(doc["changes"]["format_version"], "1.0");
    assert_eq!(
        doc["changes"]["changes"][0]["address"], "key.k",
        "same shape as plan --json"
    );
    assert_eq!(doc["steps"][0]["op"], "stage");
    assert!(PathBuf::from(doc["plan_file"]["path"].as_str().unwrap_or("")).is_absolute());

    // Applied without a prompt (stdin is not a terminal here, and no --auto-approve).
    let out = s.ok(&["apply", "saved.json"], 0);
    assert!(out.contains("Apply complete! 2 added, 0 removed"), "{out}");
    let v1 = s.key_get("k", None);
    for d in &devs {
        assert!(opens(d, &v1, Some(1)), "{} opens with k v1", d.display());
    }

    // The same file again: the terraform hole (a plan made with no prior state) is closed.
    let before = Snapshot::take(&[devs[0].clone(), devs[1].clone(), s.path("keys")]);
    let out = s.ok(&["apply", "saved.json"], 1);
    assert!(out.contains("saved plan saved.json is stale"), "{out}");
    assert!(out.contains("device a: keyslot 1 added"), "{out}");
    assert!(out.contains("key k: KMS versions changed"), "{out}");
    assert!(out.contains("the journal records a later run ("), "{out}");
    assert!(out.contains("nothing was changed"), "{out}");
    before.assert_unchanged("second apply of a saved plan");
    assert_eq!(s.key_get("k", None), v1);
}

/// A device and key enrolled by a normal apply, then a rotation saved.
fn enrolled_with_saved_rotation(s: &Scratch) -> Vec<PathBuf> {
    let devs = setup(s);
    s.ok(&["apply", "--auto-approve"], 0);
    let out = s.ok(&["plan", "--rotate", "k", "-o", "rotate.json"], 0);
    assert!(out.contains("~ key k v1 -> v2"), "{out}");
    devs
}

#[test]
fn header_changed_behind_the_plan_makes_it_stale() {
    let s = Scratch::new();
    let devs = enrolled_with_saved_rotation(&s);
    let v1 = s.key_get("k", None);
    // Someone adds a keyslot by hand to device b.
    let mut cmd = std::process::Command::new("cryptsetup");
    cmd.args([
        "luksAddKey",
        "--batch-mode",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
    ])
    .arg(s.path("initial.pass"))
    .arg(&devs[1])
    .arg("/dev/stdin");
    let out = run_with_stdin(cmd, b"another passphrase");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = Snapshot::take(&[devs[0].clone(), devs[1].clone(), s.path("keys")]);
    let out = s.ok(&["apply", "rotate.json"], 1);
    assert!(out.contains("device b: keyslot 2 added"), "{out}");
    assert!(!out.contains("device a:"), "{out}");
    assert!(!out.contains("key k:"), "{out}");
    assert!(
        out.contains("run `keyplan plan --rotate k -o rotate.json` again"),
        "{out}"
    );
    before.assert_unchanged("stale saved plan");
    assert_eq!(s.key_get("k", None), v1);
}

/// The `keyplan plan` command between backticks in `text`: the advice to make a saved plan
/// again.
fn plan_advice(text: &str) -> String {
    let start = text
        .find("`keyplan plan")
        .map(|i| i + 1)
        .expect("advice in the output");
    let len = text[start..].find('`').expect("closing backtick");
    text[start..start + len].to_string()
}

/// A stale saved rotation says how to make it again, and the advice, followed word for word,
/// makes the same plan: it repeats `--rotate k` and the other options that shaped the saved
/// plan (`--verify`, `-f`, `--state-dir`), so the rotation is not lost to a "No changes"
/// plan, and applying the new file rotates the key (issue 46).
#[test]
fn stale_saved_rotation_advice_repeats_the_command_line() {
    let s = Scratch::new();
    let devs = setup(&s);
    let st = ["--state-dir", "st"];
    s.ok(&["--state-dir", "st", "apply", "--auto-approve"], 0);
    let v1 = s.key_get_as(&st, "k", None);
    s.ok(
        &[
            "--state-dir",
            "st",
            "plan",
            "-f",
            "keyplan.yaml",
            "--rotate",
            "k",
            "--verify",
            "-o",
            "rotate.json",
        ],
        0,
    );
    // The plan file is edited (a comment): the saved plan is stale.
    let mut text = std::fs::read_to_string(s.path("keyplan.yaml")).expect("read plan");
    text.push_str("# reviewed\n");
    std::fs::write(s.path("keyplan.yaml"), text).expect("write plan");
    let apply_saved = [
        "--state-dir",
        "st",
        "apply",
        "-f",
        "keyplan.yaml",
        "rotate.json",
    ];
    let out = s.ok(&apply_saved, 1);
    assert!(out.contains("saved plan rotate.json is stale"), "{out}");
    let again = plan_advice(&out);
    let shown = both(&s.keyplan(&[
        "--state-dir",
        "st",
        "show",
        "-f",
        "keyplan.yaml",
        "rotate.json",
    ]));
    assert!(shown.contains("is STALE"), "{shown}");
    assert_eq!(
        plan_advice(&shown),
        again,
        "show and apply give the same advice"
    );
    assert_eq!(s.key_get_as(&st, "k", None), v1, "nothing rotated yet");

    // Followed word for word, the advice plans the rotation again, and the new file applies.
    let args: Vec<&str> = again.split_whitespace().collect();
    assert_eq!(args.first(), Some(&"keyplan"), "{again}");
    let out = s.ok(&args[1..], 0);
    assert!(
        out.contains("~ key k v1 -> v2"),
        "`{again}` plans the rotation: {out}"
    );
    let out = s.ok(&apply_saved, 0);
    assert!(out.contains("1 keys rotated"), "{out}");
    let v2 = s.key_get_as(&st, "k", None);
    assert_eq!(s.key_get_as(&st, "k", Some(2)), v2);
    assert_ne!(v2, v1);
    for d in &devs {
        assert!(opens(d, &v2, None), "{} opens with k v2", d.display());
        assert!(
            !opens(d, &v1, None),
            "{}: the v1 keyslot is killed",
            d.display()
        );
    }
}

#[test]
fn kms_changed_and_plan_file_edited_make_it_stale() {
    let s = Scratch::new();
    let devs = enrolled_with_saved_rotation(&s);
    // Another rotation happens first (the KMS and headers change, and a run is journaled).
    s.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let v2 = s.key_get("k", None);
    let out = s.ok(&["apply", "rotate.json"], 1);
    assert!(out.contains("key k: KMS versions changed"), "{out}");
    assert!(out.contains("is stale"), "{out}");
    assert_eq!(s.key_get("k", None), v2, "KMS untouched");
    for d in &devs {
        assert!(opens(d, &v2, None));
    }

    // A fresh saved plan, then the plan file is edited (a comment only): stale.
    s.ok(&["plan", "--rotate", "k", "-o", "rotate2.json"], 0);
    let plan = s.path("keyplan.yaml");
    let mut text = std::fs::read_to_string(&plan).expect("plan");
    text.push_str("# reviewed\n");
    std::fs::write(&plan, text).expect("edit plan");
    let out = s.ok(&["apply", "rotate2.json"], 1);
    assert!(out.contains("the plan file"), "{out}");
    assert!(
        out.contains("Since it was made:") && out.contains("- the plan file"),
        "{out}"
    );
    assert_eq!(s.key_get("k", None), v2);
}

#[test]
fn saved_rotation_applies_and_show_reports_freshness() {
    let s = Scratch::new();
    let devs = enrolled_with_saved_rotation(&s);
    let out = s.keyplan(&["show", "rotate.json"]);
    let text = both(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("~ key k v1 -> v2"), "{text}");
    assert!(text.contains("The saved plan is current"), "{text}");
    assert!(!text.contains("STALE"), "{text}");

    let out = s.keyplan(&["show", "--json", "rotate.json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("show --json");
    assert_eq!(doc["stale"], false);
    assert_eq!(doc["format_version"], "1.0");

    let out = s.ok(&["apply", "rotate.json"], 0);
    assert!(out.contains("1 keys rotated"), "{out}");
    let v2 = s.key_get("k", None);
    assert_eq!(s.key_get("k", Some(2)), v2);
    for d in &devs {
        assert!(opens(d, &v2, None), "{} opens with v2", d.display());
        assert!(
            !opens(d, &s.key_get("k", Some(1)), None),
            "v1 keyslot killed"
        );
    }

    // Now stale: show still exits 0, with a warning on stderr naming what changed.
    let out = s.keyplan(&["show", "rotate.json"]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("saved plan rotate.json is STALE"),
        "{stderr}"
    );
    assert!(stderr.contains("key k: KMS versions changed"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("~ key k v1 -> v2"));
    let out = s.keyplan(&["show", "--json", "rotate.json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("show --json");
    assert_eq!(doc["stale"], true);

    // The plan file gone: rendered anyway, "cannot check".
    std::fs::rename(s.path("keyplan.yaml"), s.path("moved.yaml")).expect("mv");
    let out = s.keyplan(&["show", "rotate.json"]);
    assert_eq!(out.status.code(), Some(0));
    let text = both(&out);
    assert!(text.contains("cannot check whether saved plan"), "{text}");
    assert!(text.contains("key.k v1 -> v2"), "{text}");
    let out = s.ok(&["apply", "rotate.json"], 1);
    assert!(out.contains("no plan file in"), "{out}");
    // Named with -f, it applies (the bytes are the ones the plan was made from).
    let out = s.ok(&["apply", "-f", "moved.yaml", "rotate.json"], 1);
    assert!(out.contains("stale"), "already applied: {out}");
}

#[test]
fn no_changes_saved_plan_is_a_noop_and_stays_current() {
    let s = Scratch::new();
    setup(&s);
    s.ok(&["apply", "--auto-approve"], 0);
    let out = s.ok(&["plan", "-o", "noop.json"], 0);
    assert!(out.contains("No changes."), "{out}");
    let journal = std::fs::read(s.path(".keyplan/journal.jsonl")).unwrap_or_default();
    for _ in 0..2 {
        let out = s.ok(&["apply", "noop.json"], 0);
        assert!(out.contains("No changes."), "{out}");
    }
    assert_eq!(
        std::fs::read(s.path(".keyplan/journal.jsonl")).unwrap_or_default(),
        journal,
        "a no-op saved plan starts no run"
    );
}

#[test]
fn saved_plan_options_conflict_and_bad_files() {
    let s = Scratch::new();
    setup(&s);
    s.ok(&["plan", "-o", "saved.json"], 0);
    let out = s.ok(&["apply", "saved.json", "--rotate", "k"], 1);
    assert!(out.contains("cannot be used with"), "{out}");
    std::fs::write(s.path("junk.json"), "{\"kind\": \"other\"}").expect("write");
    let out = s.ok(&["apply", "junk.json"], 1);
    assert!(out.contains("is not a keyplan saved plan"), "{out}");
    let out = s.ok(&["--state-dir", "elsewhere", "apply", "saved.json"], 1);
    assert!(
        out.contains("the saved plan names another state directory"),
        "{out}"
    );
    assert!(!s.path("elsewhere").exists());
    let mut doc = saved_json(&s, "saved.json");
    doc["deps"] = serde_json::json!([[0, 99]]);
    std::fs::write(s.path("damaged.json"), doc.to_string()).expect("write");
    let out = s.ok(&["apply", "damaged.json"], 1);
    assert!(out.contains("saved plan damaged.json is damaged"), "{out}");
    assert!(!s.path("keys").exists(), "nothing was staged");
    let out = s.ok(&["apply", "keyplan.yaml"], 1);
    assert!(
        out.contains("to apply a plan file, use `keyplan apply -f keyplan.yaml`"),
        "{out}"
    );
    let out = s.ok(&["show", "nope.json"], 1);
    assert!(out.contains("cannot read saved plan nope.json"), "{out}");
}

#[test]
fn plan_json_has_addresses_and_reason_codes() {
    let s = Scratch::new();
    setup(&s);
    let out = s.keyplan(&["plan", "--json", "-o", "saved.json"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("{\n  \"format_version\": \"1.0\","),
        "the document starts with format_version"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("Saved the plan to saved.json"));
    assert_eq!(doc["format_version"], "1.0");
    assert_eq!(doc["changes_present"], true);
    let changes = doc["changes"].as_array().expect("changes");
    let key = changes
        .iter()
        .find(|c| c["address"] == "key.k")
        .expect("key change");
    assert_eq!(key["actions"], serde_json::json!(["create"]));
    assert_eq!(key["reason_code"], "not_created");
    assert_eq!(key["version"], 1);
    let slot = changes
        .iter()
        .find(|c| c["address"] == "device.a.keyslot[1]")
        .expect("keyslot change");
    assert_eq!(slot["actions"], serde_json::json!(["add"]));
    assert_eq!(slot["reason_code"], "not_created");
    assert_eq!(slot["device"], "a");
    assert_eq!(slot["keyslot"], 1);
    assert_eq!(slot["key"], "k");
    // Existing fields kept.
    assert_eq!(doc["keyslots"][0]["address"], "device.a.keyslot[1]");
    assert_eq!(doc["keys"][0]["reason"], "not in KMS");
    assert!(doc["steps"].is_array());
    // The saved plan holds the same document, without the steps (kept beside it).
    let saved = saved_json(&s, "saved.json");
    let mut expected = doc.clone();
    expected.as_object_mut().map(|o| o.remove("steps"));
    assert_eq!(saved["changes"], expected);
    assert_eq!(saved["steps"], doc["steps"]);

    s.ok(&["apply", "saved.json"], 0);
    s.ok(&["apply", "--auto-approve"], 0);
    let out = s.keyplan(&["plan", "--json", "--rotate", "k"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let codes: Vec<&str> = doc["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .filter_map(|c| c["reason_code"].as_str())
        .collect();
    assert!(codes.contains(&"rotate_requested"), "{codes:?}");
    assert!(codes.contains(&"new_version"), "{codes:?}");
    assert!(codes.contains(&"superseded_version"), "{codes:?}");
}

#[test]
fn saved_plans_and_plan_json_hold_no_key_material() {
    let w = Watched::new();
    w.s.initial_pass();
    w.s.plan(
        "keyplan.yaml",
        &one_key_plan("  a: { path: a.img, keys: [k], enroll_with: initial.pass }"),
    );
    w.s.image("a.img", "luks2");
    w.ok(&["plan", "--json", "-o", "enroll.json"], 0);
    w.ok(&["apply", "enroll.json"], 0);
    w.ok(&["plan", "--rotate", "k", "-o", "rotate.json"], 0);
    w.ok(&["show", "--json", "rotate.json"], 0);
    w.ok(&["apply", "rotate.json"], 0);
    w.ok(&["plan", "--json", "--rotate", "k", "-o", "again.json"], 0);
    w.ok(&["show", "again.json"], 0);
    // The saved plans lie in the scratch directory, which assert_no_leaks scans whole.
    assert!(w.s.path("again.json").exists());
    w.assert_no_leaks();
}

#[cfg(feature = "failpoints")]
#[test]
fn interrupted_run_refuses_saving_and_applying_saved_plans() {
    let s = Scratch::new();
    setup(&s);
    s.ok(&["apply", "--auto-approve"], 0);
    s.ok(&["plan", "--rotate", "k", "-o", "rotate.json"], 0);
    let out = keyplan_cmd(&s)
        .args(["apply", "--auto-approve", "--rotate", "k"])
        .env("FAILPOINTS", "step.before_effect=2*off->return")
        .output()
        .expect("run keyplan");
    assert!(!out.status.success(), "{}", both(&out));
    let out = s.ok(&["apply", "rotate.json"], 1);
    assert!(out.contains("was interrupted"), "{out}");
    assert!(out.contains("nothing was changed"), "{out}");
    let out = s.ok(&["plan", "--rotate", "k", "-o", "new.json"], 1);
    assert!(out.contains("was interrupted"), "{out}");
    assert!(!s.path("new.json").exists());
    // Finishing the run lets a new saved plan be made.
    s.ok(&["apply", "--auto-approve"], 0);
    s.ok(&["plan", "-o", "new.json"], 0);
    assert!(s.path("new.json").exists());
}

#[cfg(feature = "failpoints")]
fn keyplan_cmd(s: &Scratch) -> std::process::Command {
    let mut cmd = keyplan_command();
    cmd.current_dir(s.dir.path()).env("NO_COLOR", "1");
    cmd
}

/// A saved plan is a file anyone who can write it can edit: steps added by hand (here: killing
/// the unmanaged keyslot 0, whose passphrase the plan keeps) make `apply` refuse the file,
/// `show` call it stale, and nothing changes. Found by a new-user trial.
#[test]
fn hand_edited_saved_plan_is_refused() {
    let s = Scratch::new();
    let devs = enrolled_with_saved_rotation(&s);
    let mut doc = saved_json(&s, "rotate.json");
    let salt = luks2_json(&devs[0])["keyslots"]["0"]["kdf"]["salt"]
        .as_str()
        .expect("keyslot 0 salt")
        .to_string();
    let steps = doc["steps"].as_array_mut().expect("steps");
    let anchor = steps
        .iter()
        .position(|st| st["op"] == "verify" && st["device"] == "a")
        .expect("verify step of a");
    steps.push(serde_json::json!({
        "op": "kill_keyslot", "device": "a", "slot": 0,
        "holder": {"unmanaged": {"salt": salt}}, "anchor": anchor
    }));
    let killer = steps.len() - 1;
    doc["deps"]
        .as_array_mut()
        .expect("deps")
        .push(serde_json::json!([anchor, killer]));
    std::fs::write(
        s.path("evil.json"),
        serde_json::to_vec_pretty(&doc).expect("json"),
    )
    .expect("write");
    // The steps are still a valid graph (the file parses), but not what keyplan plans.
    let before = Snapshot::take(&[devs[0].clone(), devs[1].clone(), s.path("keys")]);
    let out = s.ok(&["show", "evil.json"], 0);
    assert!(out.contains("is STALE"), "{out}");
    assert!(out.contains("its steps differ"), "{out}");
    let out = s.ok(&["apply", "evil.json"], 1);
    assert!(
        out.contains("does not match what keyplan plans now"),
        "{out}"
    );
    assert!(out.contains("kill keyslot 0 (unmanaged)"), "{out}");
    assert!(out.contains("nothing was changed"), "{out}");
    before.assert_unchanged("hand-edited saved plan");
    assert!(opens(&devs[0], INITIAL, Some(0)), "keyslot 0 still opens");

    // The listed changes edited (what `show` renders and people review): refused too.
    let mut doc = saved_json(&s, "rotate.json");
    doc["changes"]["keyslots"]
        .as_array_mut()
        .expect("keyslots")
        .pop();
    std::fs::write(
        s.path("edited.json"),
        serde_json::to_vec_pretty(&doc).expect("json"),
    )
    .expect("write");
    let out = s.ok(&["apply", "edited.json"], 1);
    assert!(out.contains("the changes it lists differ"), "{out}");
    before.assert_unchanged("saved plan with edited changes");

    // The untouched file still applies.
    let out = s.ok(&["apply", "rotate.json"], 0);
    assert!(out.contains("Apply complete! 2 added, 2 removed"), "{out}");
    assert!(opens(&devs[0], INITIAL, Some(0)), "keyslot 0 kept");
}

/// `apply SAVED` makes the same checks as `plan` before a run starts: an `enroll_with`
/// passphrase that stopped working is refused with no run in the journal (so the reviewed
/// file still applies once the passphrase is fixed). Found by a new-user trial.
#[test]
fn saved_plan_checks_enroll_with_before_any_run() {
    let s = Scratch::new();
    let devs = setup(&s);
    s.ok(&["plan", "-o", "saved.json"], 0);
    let good = std::fs::read(s.path("initial.pass")).expect("read");
    std::fs::write(s.path("initial.pass"), b"wrong passphrase").expect("write");
    let before = Snapshot::take(&[devs[0].clone(), devs[1].clone()]);
    let out = s.ok(&["apply", "saved.json"], 1);
    assert!(out.contains("no safe plan exists"), "{out}");
    assert!(out.contains("enroll_with"), "{out}");
    before.assert_unchanged("apply SAVED with a wrong enroll_with passphrase");
    assert!(!s.path("keys").exists(), "nothing staged");
    let journal = s.ok(&["journal", "--json"], 0);
    let j: serde_json::Value = serde_json::from_str(&journal).expect("journal json");
    assert_eq!(j["runs"].as_array().map(Vec::len), Some(0), "{journal}");
    std::fs::write(s.path("initial.pass"), good).expect("write");
    let out = s.ok(&["apply", "saved.json"], 0);
    assert!(out.contains("Apply complete! 2 added"), "{out}");
}

/// `plan -o` never overwrites a file that is not a saved plan (the plan file itself, a
/// passphrase file); an earlier saved plan is replaced.
#[test]
fn plan_out_refuses_to_overwrite_other_files() {
    let s = Scratch::new();
    setup(&s);
    let plan_text = std::fs::read(s.path("keyplan.yaml")).expect("read");
    let out = s.ok(&["plan", "-o", "keyplan.yaml"], 1);
    assert!(
        out.contains("is not a keyplan saved plan; refusing to overwrite"),
        "{out}"
    );
    assert_eq!(
        std::fs::read(s.path("keyplan.yaml")).expect("read"),
        plan_text
    );
    let pass = std::fs::read(s.path("initial.pass")).expect("read");
    s.ok(&["plan", "-o", "initial.pass"], 1);
    assert_eq!(std::fs::read(s.path("initial.pass")).expect("read"), pass);
    s.ok(&["plan", "-o", "saved.json"], 0);
    s.ok(&["plan", "-o", "saved.json"], 0);
    assert_eq!(saved_json(&s, "saved.json")["kind"], "keyplan-saved-plan");
}

/// The plan file is the one the operator names (`-f` or the default), never the path written
/// in the saved file: a saved plan made from another plan file (here one that removes the
/// unmanaged keyslot 0), or one whose recorded path was edited to point at it, is refused and
/// runs nothing, not even that plan's KMS helpers. Found by a tampering trial.
#[test]
fn saved_plan_is_bound_to_the_operators_plan_file() {
    let s = Scratch::new();
    let devs = enrolled_with_saved_rotation(&s);
    let text = std::fs::read_to_string(s.path("keyplan.yaml")).expect("read");
    // Another plan file: a state directory of its own (invariant I5).
    let evil = text.replace(
        "enroll_with: initial.pass }",
        "enroll_with: initial.pass, unmanaged_keyslots: remove }",
    );
    assert_ne!(evil, text);
    let evil = format!("state_dir: .keyplan-other\n{evil}");
    std::fs::write(s.path("other.yaml"), evil).expect("write");
    s.ok(&["plan", "-f", "other.yaml", "-o", "other.json"], 0);
    let before = Snapshot::take(&[devs[0].clone(), devs[1].clone(), s.path("keys")]);
    for args in [
        vec!["apply", "other.json"],
        vec!["apply", "-f", "keyplan.yaml", "other.json"],
    ] {
        let out = s.ok(&args, 1);
        assert!(
            out.contains("is not the one the plan was made from"),
            "{args:?}: {out}"
        );
        assert!(out.contains("nothing was changed"), "{out}");
    }
    let out = s.ok(&["show", "other.json"], 0);
    assert!(out.contains("is STALE"), "{out}");
    // The same with the recorded path edited to name the operator's file.
    let mut doc = saved_json(&s, "other.json");
    doc["plan_file"]["path"] = serde_json::json!(s.path("keyplan.yaml"));
    std::fs::write(s.path("edited.json"), doc.to_string()).expect("write");
    let out = s.ok(&["apply", "edited.json"], 1);
    assert!(
        out.contains("is not the one the plan was made from"),
        "{out}"
    );
    before.assert_unchanged("saved plan of another plan file");
    assert!(opens(&devs[0], INITIAL, Some(0)), "keyslot 0 kept");
    // The other plan's own saved plan applies with its own plan file.
    let out = s.ok(&["apply", "-f", "other.yaml", "other.json"], 0);
    assert!(out.contains("Apply complete!"), "{out}");
}

/// What reviewers read in the file (`changes`: summary, `changes_present`, `changes[]`) must
/// list what would run; texts from the file never reach the terminal unescaped, and a forged
/// time does not crash `show`. Found by a tampering trial.
#[test]
fn forged_review_texts_are_refused_or_escaped() {
    let s = Scratch::new();
    let devs = enrolled_with_saved_rotation(&s);
    let before = Snapshot::take(&[devs[0].clone(), devs[1].clone(), s.path("keys")]);
    let mut doc = saved_json(&s, "rotate.json");
    doc["changes"]["changes_present"] = serde_json::json!(false);
    doc["changes"]["summary"] =
        serde_json::json!({"add": 0, "remove": 0, "rotate": 0, "migrate": 0});
    std::fs::write(s.path("summary.json"), doc.to_string()).expect("write");
    let out = s.ok(&["apply", "summary.json"], 1);
    assert!(out.contains("the changes it lists differ"), "{out}");
    before.assert_unchanged("forged summary");

    let mut doc = saved_json(&s, "rotate.json");
    doc["keyplan_version"] = serde_json::json!("1.0\u{1b}[2J\u{1b}[H No changes.");
    doc["created_at"] = serde_json::json!(u64::MAX);
    doc["changes"]["keys"][0]["reason"] = serde_json::json!("\u{1b}[8mhidden");
    std::fs::write(s.path("escapes.json"), doc.to_string()).expect("write");
    let out = s.keyplan(&["show", "escapes.json"]);
    assert_eq!(out.status.code(), Some(0), "{}", both(&out));
    let text = both(&out);
    assert!(
        !text.contains('\u{1b}'),
        "no escape sequence reaches the terminal: {text:?}"
    );
    assert!(text.contains("\\u{1b}[2J"), "shown escaped: {text}");
    assert!(
        text.contains("The saved plan is current"),
        "the version text is not checked: {text}"
    );
    assert!(
        !text.contains("hidden"),
        "a current plan is shown as keyplan plans it: {text}"
    );
    // The reviewed file itself still applies.
    let out = s.ok(&["apply", "rotate.json"], 0);
    assert!(out.contains("Apply complete!"), "{out}");
}
