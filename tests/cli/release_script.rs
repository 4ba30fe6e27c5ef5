//! scripts/release.sh and the image script it runs, checked cheaply (a real release needs root,
//! buildah and minutes): both parse (`bash -n`), shellcheck finds nothing where it is installed,
//! and release.sh answers `--help` and refuses an unknown argument before it checks anything.

use std::path::Path;
use std::process::Command;

const SCRIPTS: &[&str] = &["scripts/release.sh", "scripts/build-image.sh"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn release_scripts_parse_and_pass_shellcheck() {
    for script in SCRIPTS {
        let out = Command::new("bash")
            .arg("-n")
            .arg(root().join(script))
            .output()
            .expect("bash");
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let Ok(out) = Command::new("shellcheck")
        .current_dir(root())
        .args(SCRIPTS)
        .output()
    else {
        eprintln!("shellcheck not installed: skipping (apt-get install shellcheck)");
        return;
    };
    assert!(
        out.status.success(),
        "shellcheck:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn release_script_answers_help_and_refuses_unknown_arguments() {
    let run = |arg: &str| {
        Command::new("bash")
            .arg(root().join("scripts/release.sh"))
            .arg(arg)
            .output()
            .expect("bash")
    };
    let help = run("--help");
    let text = String::from_utf8_lossy(&help.stdout);
    assert_eq!(help.status.code(), Some(0), "{help:?}");
    for word in [
        "--upgrade-result FILE",
        "--image-repo REPO",
        "SHA256SUMS",
        "cargo install cargo-cyclonedx --locked",
    ] {
        assert!(text.contains(word), "{word} missing from --help:\n{text}");
    }
    let bad = run("--frobnicate");
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("unknown argument: --frobnicate"),
        "{bad:?}"
    );
}
