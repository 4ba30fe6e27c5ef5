//! Secret hygiene and enroll_with edge cases, against the real cryptsetup.

use std::path::Path;

use crate::common::*;

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn scan_dir(dir: &Path, secrets: &[Vec<u8>]) {
    for entry in walk(dir) {
        let bytes = std::fs::read(&entry).unwrap();
        for s in secrets {
            assert!(
                !contains(&bytes, s),
                "key material found in {}",
                entry.display()
            );
        }
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// Runs enrollment and two rotations with a cryptsetup wrapper that logs every child's argv
/// and environment, and with the most verbose logs; then looks for every key version in the
/// logs, the outputs, the state directory (journal, lock, LUKS1 records) and /tmp-like dirs.
#[test]
fn key_material_never_leaks() {
    let s = Scratch::new();
    s.initial_pass();
    s.image("a.img", "luks2");
    s.image("b.img", "luks1");
    s.plan(
        "keyplan.yaml",
        &one_key_plan("  a: { path: a.img, keys: [k], enroll_with: initial.pass }\n  b: { path: b.img, keys: [k], enroll_with: initial.pass }"),
    );
    let log = s.path("argv-env.log");
    let wrapper = script(
        s.dir.path(),
        "cs-wrapper",
        &format!(
            "#!/bin/sh\n{{ echo \"ARGV: $*\"; env; }} >> {}\nexec cryptsetup \"$@\"\n",
            log.display()
        ),
    );
    let mut outputs = Vec::new();
    let mut seen: Vec<Vec<u8>> = Vec::new();
    for args in [
        vec!["-vvv", "apply", "--auto-approve"],
        vec!["-vvv", "apply", "--auto-approve", "--rotate", "k"],
        vec!["-vvv", "plan", "--verify", "--json"],
        vec!["-vvv", "verify"],
        vec!["-vvv", "journal", "--json"],
        vec!["-vvv", "apply", "--auto-approve", "--rotate", "k"],
    ] {
        let out = assert_cmd::Command::from_std(keyplan_command())
            .current_dir(s.dir.path())
            .env("KEYPLAN_CRYPTSETUP", &wrapper)
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        outputs.extend(out.stdout);
        outputs.extend(out.stderr);
        let current = s.key_get("k", None);
        if !seen.contains(&current) {
            seen.push(current);
        }
    }
    let secrets = seen;
    assert_eq!(secrets.len(), 3, "three versions were current in turn");
    // the retired versions' files are gone: only the current one is in the KMS
    assert!(!s.path("keys/k/v1.key").exists());
    let logged = std::fs::read(&log).unwrap();
    assert!(contains(&logged, b"luksAddKey"), "wrapper saw the calls");
    let mut all = secrets.clone();
    all.push(INITIAL.to_vec());
    for sec in &all {
        assert!(
            !contains(&logged, sec),
            "key material in a cryptsetup argv or environment"
        );
        assert!(
            !contains(&outputs, sec),
            "key material in keyplan's output or logs"
        );
    }
    scan_dir(&s.path(".keyplan"), &all);
    // no stray files beside the plan: only what the test made, the KMS and the state dir
    let mut names: Vec<String> = std::fs::read_dir(s.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ".keyplan",
            "a.img",
            "argv-env.log",
            "b.img",
            "cs-wrapper",
            "initial.pass",
            "keyplan.yaml",
            "keys"
        ]
    );
}

/// An enroll_with passphrase with newlines, NULs and high bytes is passed through exactly.
#[test]
fn enroll_with_binary_passphrase() {
    let s = Scratch::new();
    let pass: Vec<u8> = b"line1\nline2\0\xff\xfe end\n".to_vec();
    std::fs::write(s.path("bin.pass"), &pass).unwrap();
    let img = s.path("d.img");
    luks_format(&img, 20 << 20, "luks2", &[], &pass);
    s.plan(
        "keyplan.yaml",
        &one_key_plan(
            "  d: { path: d.img, keys: [k], enroll_with: bin.pass, unmanaged_keyslots: remove }",
        ),
    );
    s.ok(&["apply", "--auto-approve"], 0);
    let k = s.key_get("k", None);
    assert!(opens(&img, &k, None));
    assert!(!opens(&img, &pass, None), "binary initial keyslot removed");
}

#[test]
fn enroll_with_missing_or_empty_changes_nothing() {
    for (setup, expect) in [
        (None, "cannot read enroll_with file"),
        (Some(&b""[..]), "is empty"),
    ] {
        let s = Scratch::new();
        let img = s.image("d.img", "luks2");
        if let Some(content) = setup {
            std::fs::write(s.path("initial.pass"), content).unwrap();
        }
        s.plan(
            "keyplan.yaml",
            &one_key_plan("  d: { path: d.img, keys: [k], enroll_with: initial.pass }"),
        );
        let before = std::fs::read(&img).unwrap();
        let out = s.ok(&["apply", "--auto-approve"], 1);
        assert!(out.contains(expect), "{out}");
        assert!(out.contains("Nothing was changed"), "{out}");
        assert_eq!(
            std::fs::read(&img).unwrap(),
            before,
            "header bytes unchanged"
        );
        assert!(!s.path("keys").exists(), "KMS untouched");
    }
}

/// A wrong enroll_with passphrase is found at plan time (it is tested when enrolling needs
/// it): the device is unchanged, no version is staged, and the next apply (with the right
/// file) enrolls version 1.
#[test]
fn wrong_enroll_with_then_fixed() {
    let s = Scratch::new();
    let img = s.image("d.img", "luks2");
    std::fs::write(s.path("initial.pass"), b"wrong").unwrap();
    s.plan(
        "keyplan.yaml",
        &one_key_plan("  d: { path: d.img, keys: [k], enroll_with: initial.pass }"),
    );
    let out = s.ok(&["apply", "--auto-approve"], 1);
    assert!(out.contains("opens none of its bound keyslots"), "{out}");
    assert_eq!(keyslots(&img), vec![0]);
    assert!(!s.path("keys/k/meta.json").exists(), "nothing staged");
    s.initial_pass();
    s.ok(&["apply", "--auto-approve"], 0);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.path("keys/k/meta.json")).unwrap()).unwrap();
    assert_eq!(
        meta["current"], 1,
        "the staged version was reused, not doubled"
    );
    assert!(opens(&img, &s.key_get("k", None), Some(1)));
}

#[test]
fn every_bundled_plan_validates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for dir in ["plans", "examples/quickstart"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if !matches!(
                p.extension().and_then(|x| x.to_str()),
                Some("yaml" | "yml" | "toml")
            ) {
                continue;
            }
            let out = keyplan_in(root, &["validate", "-f", p.to_str().unwrap()]);
            assert!(
                out.status.success(),
                "{}: {}",
                p.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            n += 1;
        }
    }
    assert!(n >= 5);
}

fn single_device_plan(s: &Scratch, extra: &str) {
    s.plan(
        "keyplan.yaml",
        &one_key_plan(&format!(
            "  d: {{ path: d.img, keys: [k], enroll_with: initial.pass{extra} }}"
        )),
    );
}

/// cryptsetup skips `ignore`-priority keyslots unless named; enroll_with must still work.
#[test]
fn enroll_with_passphrase_in_ignore_priority_keyslot() {
    let s = Scratch::new();
    s.initial_pass();
    let img = s.image("d.img", "luks2");
    let st = std::process::Command::new("cryptsetup")
        .args(["config", "--priority", "ignore", "--key-slot", "0"])
        .arg(&img)
        .status()
        .unwrap();
    assert!(st.success());
    single_device_plan(&s, "");
    s.ok(&["apply", "--auto-approve"], 0);
    assert!(opens(&img, &s.key_get("k", None), Some(1)));
}

fn import_token(img: &Path, json: &str) -> bool {
    use std::io::Write;
    let mut child = std::process::Command::new("cryptsetup")
        .args(["token", "import", "--json-file", "-"])
        .arg(img)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(json.as_bytes())
        .unwrap();
    child.wait().unwrap().success()
}

/// A LUKS2 header whose JSON area has room for a new keyslot but not for keyplan's token: no
/// orphan keyslot is left and nothing is committed. `plan` estimates the room needed (on the
/// safe side) and refuses such a header before anything is written, so normally the header
/// stays byte-identical; should the estimate ever fall short, the added keyslot is removed
/// again and the error says so. The free space is tuned by leaving a "reserve" filler token and
/// removing it at the end; several reserve sizes are tried because cryptsetup's JSON layout
/// decides the exact margin.
#[test]
fn luks2_metadata_full_leaves_no_orphan_keyslot() {
    let mut hit = false;
    for reserve in (100..=900).step_by(40) {
        let s = Scratch::new();
        s.initial_pass();
        // A small JSON area (16 KiB metadata), so tokens can fill it.
        let img = s.image_with(
            "d.img",
            "luks2",
            20 << 20,
            &[
                "--luks2-metadata-size",
                "16k",
                "--luks2-keyslots-size",
                "1m",
            ],
        );
        let filler = |pad: usize| {
            format!(
                r#"{{"type":"filler","keyslots":[],"pad":"{}"}}"#,
                "x".repeat(pad)
            )
        };
        assert!(import_token(&img, &filler(reserve)), "reserve token (id 0)");
        let mut n = 1;
        for pad in [2000, 400, 80, 10, 1] {
            while n < 31 && import_token(&img, &filler(pad)) {
                n += 1;
            }
        }
        let st = std::process::Command::new("cryptsetup")
            .args(["token", "remove", "--token-id", "0"])
            .arg(&img)
            .status()
            .unwrap();
        assert!(st.success());
        single_device_plan(&s, "");
        let before = std::fs::read(&img).unwrap();
        let out = s.keyplan(&["apply", "--auto-approve"]);
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            continue; // enough room for both: fine, try less room
        }
        if text.contains("JSON metadata area is too full") {
            assert_eq!(
                std::fs::read(&img).unwrap(),
                before,
                "refused before writing"
            );
            assert!(!s.path("keys/k/meta.json").exists(), "nothing staged");
            hit = true;
            break;
        }
        assert_eq!(
            keyslots(&img),
            vec![0],
            "no orphan keyslot (reserve {reserve}): {text}"
        );
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(s.path("keys/k/meta.json")).unwrap()).unwrap();
        assert_eq!(
            meta["current"],
            serde_json::Value::Null,
            "nothing committed"
        );
        if text.contains("was removed again") {
            hit = true;
            break;
        }
    }
    assert!(
        hit,
        "no reserve size produced a header without room for a keyslot and its token"
    );
}
