//! The keyplan image built for real: scripts/build-image.sh makes a Debian 12 base with
//! debootstrap, builds deploy/Containerfile (stage `prebuilt`, with a host release build) with
//! buildah (vfs storage, chroot isolation: no container engine, no registry), and runs
//! `keyplan --version`, `cryptsetup --version` and `keyplan plan` on a LUKS2 image file inside
//! a container of it (`buildah run --isolation chroot`).
//!
//! Minutes of work as root (a cold run: debootstrap, a release build, apt in the image), so it
//! runs only with KEYPLAN_IMAGE_TEST=1. Later runs reuse the cached base
//! (~/.cache/keyplan/image/) and the release build.

use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn image_builds_and_runs_keyplan_cryptsetup_and_a_plan() {
    if std::env::var("KEYPLAN_IMAGE_TEST").as_deref() != Ok("1") {
        eprintln!(
            "skipped: set KEYPLAN_IMAGE_TEST=1 to build the image with scripts/build-image.sh \
             (root, debootstrap and buildah, minutes)"
        );
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // stderr (cargo's and apt's progress) goes through; stdout is read.
    let out = Command::new("bash")
        .arg(root.join("scripts/build-image.sh"))
        .current_dir(root)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/build-image.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "scripts/build-image.sh failed ({}); its output is above",
        out.status
    );

    let smoke: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("smoke: "))
        .collect();
    let has = |line: &str| smoke.contains(&line);
    assert!(
        has("entrypoint: [/usr/local/bin/keyplan]"),
        "entrypoint: {smoke:#?}"
    );
    // `keyplan 0.1.0 (<commit>, <target>)` (src/cli/version.rs).
    let version = format!("keyplan --version: keyplan {} (", env!("CARGO_PKG_VERSION"));
    assert!(
        smoke.iter().any(|l| l.starts_with(&version)),
        "{version}: {smoke:#?}"
    );
    // Debian 12's cryptsetup.
    assert!(
        smoke
            .iter()
            .any(|l| l.starts_with("cryptsetup --version: cryptsetup 2.6.")),
        "cryptsetup 2.6: {smoke:#?}"
    );
    // The key is in no keyslot yet: the plan has changes (exit 2), a new keyslot on the device
    // for the key.
    assert!(
        has("keyplan plan --detailed-exitcode: exit 2"),
        "plan: {smoke:#?}"
    );
    let plan: Vec<&str> = smoke
        .iter()
        .filter_map(|l| l.strip_prefix("plan | "))
        .collect();
    assert!(
        plan.iter().any(|l| l.contains("# device smoke-disk")),
        "the plan names the device: {plan:#?}"
    );
    assert!(
        plan.iter()
            .any(|l| l.contains("+ keyslot") && l.contains("smoke-key v1")),
        "the plan adds a keyslot for the key: {plan:#?}"
    );
    assert!(has("passed"), "{smoke:#?}");
    assert!(
        stdout.contains("image: localhost/keyplan:"),
        "the image's size is reported"
    );
}
