//! Shared helpers for integration tests: LUKS image files made with the real cryptsetup (fast
//! PBKDF2, tests only), plan files in a temp dir, and checks that go to cryptsetup directly
//! (not through keyplan's driver) so keyplan is judged by an independent witness.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The passphrase every test image starts with (keyslot 0).
pub const INITIAL: &[u8] = b"initial passphrase";

/// Fast PBKDF settings for plans in tests only.
pub const FAST_PBKDF: &str =
    "settings:\n  pbkdf: { type: pbkdf2, iterations: 1000 }\n  parallelism: 4\n";

/// A scratch directory with images and a plan.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Creates `name` as a LUKS image (`luks1` or `luks2`) opening with [`INITIAL`] in keyslot 0.
    pub fn image(&self, name: &str, luks: &str) -> PathBuf {
        let p = self.path(name);
        let size = if luks == "luks1" { 4 << 20 } else { 20 << 20 };
        std::fs::File::create(&p)
            .and_then(|f| f.set_len(size))
            .expect("create image");
        let mut child = Command::new("cryptsetup")
            .env("LC_ALL", "C")
            .args([
                "luksFormat",
                "--batch-mode",
                "--type",
                luks,
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file=-",
            ])
            .arg(&p)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cryptsetup");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(INITIAL)
            .expect("write");
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "luksFormat: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        p
    }

    /// Writes the initial passphrase file `initial.pass`.
    pub fn initial_pass(&self) -> PathBuf {
        let p = self.path("initial.pass");
        std::fs::write(&p, INITIAL).expect("write pass");
        p
    }

    /// Writes `keyplan.yaml` (or another name) with `text`.
    pub fn plan(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).expect("write plan");
        p
    }

    /// Runs keyplan in the scratch dir with `args`.
    pub fn keyplan(&self, args: &[&str]) -> Output {
        keyplan_in(self.dir.path(), args)
    }

    /// Runs keyplan and asserts exit code `code`; returns stdout+stderr as text.
    pub fn ok(&self, args: &[&str], code: i32) -> String {
        let out = self.keyplan(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(code), "keyplan {args:?}:\n{text}");
        text
    }

    /// The passphrase of `key` (current or `version`) through `keyplan key get`.
    pub fn key_get(&self, key: &str, version: Option<u64>) -> Vec<u8> {
        let mut args = vec!["key", "get", key];
        let v;
        if let Some(n) = version {
            v = n.to_string();
            args.push("--version");
            args.push(&v);
        }
        let out = self.keyplan(&args);
        assert!(
            out.status.success(),
            "key get: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}

/// Runs the keyplan binary in `dir`.
pub fn keyplan_in(dir: &Path, args: &[&str]) -> Output {
    assert_cmd::Command::cargo_bin("keyplan")
        .expect("binary")
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .args(args)
        .output()
        .expect("run keyplan")
}

/// Does `pass` open `dev` (any keyslot, or `slot`)? Asked of cryptsetup directly.
pub fn opens(dev: &Path, pass: &[u8], slot: Option<u32>) -> bool {
    let mut cmd = Command::new("cryptsetup");
    cmd.env("LC_ALL", "C")
        .args(["open", "--test-passphrase", "--key-file=-"]);
    if let Some(s) = slot {
        cmd.arg("--key-slot").arg(s.to_string());
    }
    let mut child = cmd
        .arg(dev)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cryptsetup");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(pass)
        .expect("write");
    child.wait().expect("wait").success()
}

/// LUKS2 JSON metadata of `dev`.
pub fn luks2_json(dev: &Path) -> serde_json::Value {
    let out = Command::new("cryptsetup")
        .env("LC_ALL", "C")
        .args(["luksDump", "--dump-json-metadata"])
        .arg(dev)
        .output()
        .expect("luksDump");
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).expect("json")
}

/// Occupied keyslots of `dev` as numbers (LUKS1 or LUKS2), from the text dump.
pub fn keyslots(dev: &Path) -> Vec<u32> {
    let out = Command::new("cryptsetup")
        .env("LC_ALL", "C")
        .arg("luksDump")
        .arg(dev)
        .output()
        .expect("luksDump");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if text.contains("Version:       \t1") || text.contains("Key Slot 0:") {
        return text
            .lines()
            .filter_map(|l| l.strip_prefix("Key Slot "))
            .filter(|l| l.ends_with("ENABLED"))
            .filter_map(|l| l.split(':').next()?.trim().parse().ok())
            .collect();
    }
    let json = luks2_json(dev);
    let mut v: Vec<u32> = json["keyslots"]
        .as_object()
        .expect("keyslots")
        .keys()
        .filter_map(|k| k.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

/// Is keyslot `slot` of a LUKS2 `dev` bound (listed in a digest of segment 0)?
pub fn bound(dev: &Path, slot: u32) -> bool {
    let json = luks2_json(dev);
    json["digests"]
        .as_object()
        .expect("digests")
        .values()
        .any(|d| {
            d["segments"]
                .as_array()
                .is_some_and(|s| s.iter().any(|x| x == "0"))
                && d["keyslots"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|x| x == &serde_json::json!(slot.to_string())))
        })
}

/// The cryptsetup project's test images, decompressed into `into`, or None (with a SKIPPED
/// note on stderr) when `../shared/testdata/cryptsetup` is absent.
pub fn shared_image(name: &str, into: &Path) -> Option<PathBuf> {
    let base = std::env::var_os("KEYPLAN_TESTDATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/testdata/cryptsetup")
        });
    let src = base.join(format!("{name}.img.xz"));
    if !src.exists() {
        eprintln!(
            "SKIPPED: {} not found (../shared/testdata absent)",
            src.display()
        );
        return None;
    }
    let dst = into.join(format!("{name}.img"));
    let out = Command::new("xz")
        .arg("-dc")
        .arg(&src)
        .output()
        .expect("xz");
    assert!(out.status.success(), "xz -dc {}", src.display());
    std::fs::write(&dst, out.stdout).expect("write image");
    Some(dst)
}

/// A plan with the file KMS `local` (at `keys`), one key `k`, fast PBKDF, and `devices` (YAML
/// lines that go under `devices:`, indented by two spaces).
pub fn one_key_plan(devices: &str) -> String {
    format!(
        "version: 1\nkms:\n  local: {{ provider: file, path: keys }}\nkeys:\n  k: {{ kms: local }}\ndevices:\n{devices}\n{FAST_PBKDF}"
    )
}

/// Writes an executable shell script `name` into `dir` and returns its path.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, body).expect("write script");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p
}
