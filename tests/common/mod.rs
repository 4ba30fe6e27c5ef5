//! Shared helpers for integration tests: LUKS image files made with the real cryptsetup (fast
//! PBKDF2, tests only), plan files in a temp dir, and checks that go to cryptsetup directly
//! (not through keyplan's driver) so keyplan is judged by an independent witness.
#![allow(dead_code)]

pub mod azure;
pub mod ibm_standin;
pub mod invariants;
pub mod kms_contract;
pub mod kube;
pub mod kube_proxy;
pub mod moto;
pub mod openbao;
pub mod pykmip;
pub mod standin;

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
        let size = if luks == "luks1" { 4 << 20 } else { 20 << 20 };
        self.image_with(name, luks, size, &[])
    }

    /// Like [`Scratch::image`], but small (1.5 MiB): 256-bit volume key, LUKS2 with 16 KiB
    /// metadata and 512 KiB keyslot area, LUKS1 with minimal payload alignment. For tests that
    /// copy or scan images many times.
    pub fn small_image(&self, name: &str, luks: &str) -> PathBuf {
        let extra: &[&str] = if luks == "luks1" {
            &["--key-size", "256", "--align-payload", "8"]
        } else {
            &[
                "--key-size",
                "256",
                "--luks2-metadata-size",
                "16k",
                "--luks2-keyslots-size",
                "512k",
            ]
        };
        self.image_with(name, luks, 3 << 19, extra)
    }

    /// Creates `name` (`size` bytes) with `luksFormat --type luks ... extra`, opening with
    /// [`INITIAL`] in keyslot 0 (fast PBKDF2).
    pub fn image_with(&self, name: &str, luks: &str, size: u64, extra: &[&str]) -> PathBuf {
        let p = self.path(name);
        luks_format(&p, size, luks, extra, INITIAL);
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
        self.ok_with_env(args, &[], code)
    }

    /// Like [`Scratch::ok`], with extra environment variables (e.g. `KEYPLAN_CRYPTSETUP`).
    pub fn ok_with_env(&self, args: &[&str], env: &[(&str, &Path)], code: i32) -> String {
        let mut cmd = assert_cmd::Command::from_std(keyplan_command());
        cmd.current_dir(self.dir.path()).env("NO_COLOR", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.args(args).output().expect("run keyplan");
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
        self.key_get_as(&[], key, version)
    }

    /// [`Scratch::key_get`] with global options `global` first (`--node`, `--state-dir`).
    pub fn key_get_as(&self, global: &[&str], key: &str, version: Option<u64>) -> Vec<u8> {
        let mut args = global.to_vec();
        args.extend(["key", "get", key]);
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

/// Devices made the Rook way, in `s`: `block.img` and `db.img` (LUKS2) and `legacy.img`
/// (LUKS1), 16 MiB each, formatted with `passphrase` (what the store already holds).
pub fn rook_devices(s: &Scratch, passphrase: &[u8]) -> Vec<PathBuf> {
    [
        ("block.img", "luks2"),
        ("db.img", "luks2"),
        ("legacy.img", "luks1"),
    ]
    .iter()
    .map(|(name, luks)| {
        let p = s.path(name);
        luks_format(&p, 16 << 20, luks, &[], passphrase);
        p
    })
    .collect()
}

/// `cryptsetup luksFormat --type LUKS EXTRA...` of a new file `p` of `size` bytes with `pass`
/// in keyslot 0 (fast PBKDF2, tests only).
pub fn luks_format(p: &Path, size: u64, luks: &str, extra: &[&str], pass: &[u8]) {
    std::fs::File::create(p)
        .and_then(|f| f.set_len(size))
        .expect("create image");
    let mut cmd = Command::new("cryptsetup");
    cmd.env("LC_ALL", "C")
        .args(["luksFormat", "--batch-mode", "--type", luks])
        .args(extra)
        .args(["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"])
        .arg("--key-file=-")
        .arg(p);
    let out = run_with_stdin(cmd, pass);
    assert!(
        out.status.success(),
        "luksFormat: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until process `pid` holds at the `return(wait:GATE)` failpoint gate `gate`: the
/// marker `GATE.<pid>` exists while it waits there (src/failpoint.rs). Fails after 120 s.
pub fn wait_at_gate(gate: &Path, pid: u32) {
    let marker = PathBuf::from(format!("{}.{pid}", gate.display()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !marker.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} never reached the gate {}",
            gate.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The keyplan binary cargo built for this test run.
pub fn keyplan_bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("keyplan")
}

/// The one way tests build a keyplan process: [`keyplan_bin`] and nothing else (no arguments;
/// the test's environment, working directory and standard streams), so that each caller adds
/// exactly what its run needs. Where a test wants assert_cmd's `output()` (standard input a
/// pipe closed at once rather than `/dev/null`), wrap it: `assert_cmd::Command::from_std(..)`.
pub fn keyplan_command() -> Command {
    Command::new(keyplan_bin())
}

/// Runs the keyplan binary in `dir`.
pub fn keyplan_in(dir: &Path, args: &[&str]) -> Output {
    assert_cmd::Command::from_std(keyplan_command())
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
    cmd.arg(dev);
    run_with_stdin(cmd, pass).status.success()
}

/// Runs `cmd` with `input` on its standard input (stdout discarded, stderr captured) and waits.
pub fn run_with_stdin(mut cmd: Command, input: &[u8]) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write");
    child.wait_with_output().expect("wait")
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

/// Every regular file under `dir` (recursively; symlinks are not followed).
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => out.extend(walk(&p)),
                Ok(t) if t.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// Byte-exact copies of files (LUKS images, a KMS directory, a state directory) taken before a
/// command, to prove the command changed none of them.
pub struct Snapshot {
    files: Vec<(PathBuf, Option<Vec<u8>>)>,
    dirs: Vec<PathBuf>,
}

impl Snapshot {
    /// Snapshots each path: a file's bytes (or its absence), a directory's files recursively.
    pub fn take(paths: &[PathBuf]) -> Snapshot {
        let mut files = Vec::new();
        let mut dirs = Vec::new();
        for p in paths {
            if p.is_dir() {
                dirs.push(p.clone());
                for f in walk(p) {
                    let bytes = std::fs::read(&f).ok();
                    files.push((f, bytes));
                }
            } else {
                files.push((p.clone(), std::fs::read(p).ok()));
            }
        }
        Snapshot { files, dirs }
    }

    /// Panics naming the first file whose bytes changed, appeared or vanished.
    pub fn assert_unchanged(&self, context: &str) {
        for (p, before) in &self.files {
            let now = std::fs::read(p).ok();
            assert!(
                now == *before,
                "{context}: {} changed (headers and KMS must be left untouched)",
                p.display()
            );
        }
        for d in &self.dirs {
            for f in walk(d) {
                assert!(
                    self.files.iter().any(|(p, _)| *p == f),
                    "{context}: {} appeared",
                    f.display()
                );
            }
        }
    }
}

/// Does `hay` contain `needle` (non-empty)? (memchr's SIMD substring search: the leak scans
/// read hundreds of MiB of images and trace logs.)
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && memchr::memmem::find(hay, needle).is_some()
}

/// The forms a secret could leak in: raw bytes, lower- and upper-case hex, base64 of the bytes
/// (standard and URL-safe alphabets, each with and without padding), a JSON/Debug array of
/// byte numbers (`[105, 110, ...]` with or without spaces), and for base64 text of at least 16
/// bytes (a generated passphrase) the bytes it encodes as hex (plain, spaced, colon-separated)
/// and URL-safe base64.
pub fn leak_forms(secret: &[u8]) -> Vec<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    use base64::Engine as _;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    let nums: Vec<String> = secret.iter().map(|b| b.to_string()).collect();
    let mut forms = vec![
        secret.to_vec(),
        hex.clone().into_bytes(),
        hex.to_uppercase().into_bytes(),
        nums.join(",").into_bytes(),
        nums.join(", ").into_bytes(),
    ];
    for engine in [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD] {
        let form = engine.encode(secret).into_bytes();
        if !forms.contains(&form) {
            forms.push(form);
        }
    }
    // A generated passphrase is base64 text of random bytes: those bytes' forms too.
    if let Ok(bytes) = STANDARD.decode(secret.trim_ascii()) {
        if bytes.len() >= 16 {
            let spaced = |sep: &str| {
                bytes
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(sep)
            };
            forms.push(spaced("").into_bytes());
            forms.push(spaced(" ").into_bytes());
            forms.push(spaced(":").to_uppercase().into_bytes());
            forms.push(URL_SAFE.encode(&bytes).into_bytes());
        }
    }
    forms
}

/// Every key version currently stored by file KMSs under `root` (files `<kms>/<name>/vN.key`).
pub fn file_kms_versions(root: &Path) -> Vec<Vec<u8>> {
    walk(root)
        .into_iter()
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.starts_with('v') && n.ends_with(".key"))
        })
        .filter_map(|p| std::fs::read(p).ok())
        .filter(|b| !b.is_empty())
        .collect()
}

/// A scratch directory whose keyplan runs are watched for leaks: a `cryptsetup` wrapper placed
/// first in `PATH` logs every child's argv and environment, `TMPDIR` points into the scratch
/// directory, logs run at `KEYPLAN_LOG=trace`, every output is kept, and every key version the
/// file KMS (`keys/`) held after any run is remembered. [`Watched::assert_no_leaks`] then looks
/// for all of them, in every form of [`leak_forms`], everywhere but the KMS itself and the
/// `*.pass` files the test wrote.
pub struct Watched {
    pub s: Scratch,
    bin: PathBuf,
    log: PathBuf,
    tmp: PathBuf,
    outputs: std::cell::RefCell<Vec<u8>>,
    secrets: std::cell::RefCell<Vec<Vec<u8>>>,
}

impl Watched {
    /// A fresh watched scratch directory.
    pub fn new() -> Watched {
        let s = Scratch::new();
        let bin = s.path("wrapper-bin");
        let tmp = s.path("tmp");
        std::fs::create_dir_all(&bin).expect("mkdir");
        std::fs::create_dir_all(&tmp).expect("mkdir");
        let log = s.path("argv-env.log");
        let real = real_cryptsetup();
        script(
            &bin,
            "cryptsetup",
            &format!(
                "#!/bin/sh\n{{ echo \"ARGV: $0 $*\"; env; }} >> '{}'\nexec '{}' \"$@\"\n",
                log.display(),
                real.display()
            ),
        );
        Watched {
            s,
            bin,
            log,
            tmp,
            outputs: std::cell::RefCell::new(Vec::new()),
            secrets: std::cell::RefCell::new(vec![INITIAL.to_vec()]),
        }
    }

    /// A keyplan command in the scratch dir with the watch's environment (not yet run).
    pub fn command(&self, args: &[&str]) -> std::process::Command {
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = keyplan_command();
        cmd.current_dir(self.s.dir.path())
            .env("NO_COLOR", "1")
            .env("PATH", path)
            .env("TMPDIR", &self.tmp)
            .env("KEYPLAN_LOG", "trace")
            .env_remove("KEYPLAN_CRYPTSETUP")
            .args(args);
        cmd
    }

    /// Records the output of a finished run and the KMS's versions after it.
    pub fn record(&self, out: &Output) {
        self.outputs.borrow_mut().extend_from_slice(&out.stdout);
        self.outputs.borrow_mut().extend_from_slice(&out.stderr);
        self.harvest();
    }

    /// Remembers every key version the file KMS holds now.
    pub fn harvest(&self) {
        let mut secrets = self.secrets.borrow_mut();
        for v in file_kms_versions(&self.s.path("keys")) {
            if !secrets.contains(&v) {
                secrets.push(v);
            }
        }
    }

    /// Runs keyplan, records it, and returns the output.
    pub fn run(&self, args: &[&str]) -> Output {
        let out = self.command(args).output().expect("run keyplan");
        self.record(&out);
        out
    }

    /// Runs keyplan, asserts exit code `code`, and returns stdout+stderr as text.
    pub fn ok(&self, args: &[&str], code: i32) -> String {
        let out = self.run(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(code), "keyplan {args:?}:\n{text}");
        text
    }

    /// Secrets seen so far (the initial passphrase and every KMS version).
    pub fn secrets(&self) -> Vec<Vec<u8>> {
        self.secrets.borrow().clone()
    }

    /// Adds a secret to look for (e.g. an `enroll_with` passphrase).
    pub fn add_secret(&self, secret: &[u8]) {
        self.secrets.borrow_mut().push(secret.to_vec());
    }

    /// Panics if any secret, in any of its [`leak_forms`], is found in: keyplan's outputs (logs
    /// at trace level), the argv and environment of every cryptsetup child, the state
    /// directory, `TMPDIR`, and every other file of the scratch directory (images included)
    /// except the KMS directory `keys/` and `*.pass` files. Also checks that the wrapper saw
    /// cryptsetup calls (so the check is not vacuous).
    pub fn assert_no_leaks(&self) {
        self.harvest();
        let logged = std::fs::read(&self.log).unwrap_or_default();
        let outputs = self.outputs.borrow();
        let mut places: Vec<(String, Vec<u8>)> = vec![
            ("cryptsetup argv/environment".into(), logged),
            ("keyplan's output and trace logs".into(), outputs.clone()),
        ];
        let keys = self.s.path("keys");
        for f in walk(self.s.dir.path()) {
            if f.starts_with(&keys) || f.extension().is_some_and(|e| e == "pass") {
                continue;
            }
            if let Ok(b) = std::fs::read(&f) {
                places.push((f.display().to_string(), b));
            }
        }
        for secret in self.secrets.borrow().iter() {
            for form in leak_forms(secret) {
                let finder = memchr::memmem::Finder::new(&form);
                for (place, bytes) in &places {
                    assert!(
                        finder.find(bytes).is_none(),
                        "key material found in {place}"
                    );
                }
            }
        }
    }

    /// Did the wrapper log any cryptsetup call?
    /// Everything the cryptsetup wrapper logged: each child's argv and environment.
    pub fn child_log(&self) -> Vec<u8> {
        std::fs::read(&self.log).unwrap_or_default()
    }

    pub fn wrapper_saw_calls(&self) -> bool {
        std::fs::read(&self.log).is_ok_and(|b| contains(&b, b"ARGV:"))
    }
}

/// The real cryptsetup binary (absolute), found in PATH, /usr/sbin or /sbin.
pub fn real_cryptsetup() -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    for dir in path.split(':').chain(["/usr/sbin", "/sbin"]) {
        let p = Path::new(dir).join("cryptsetup");
        if p.is_file() && !dir.contains("wrapper-bin") {
            return p;
        }
    }
    PathBuf::from("/usr/sbin/cryptsetup")
}

/// The file KMS under `root/keys`, read directly (an independent witness, not through
/// keyplan): the current version's passphrase of `key` (if any) and whether a version is
/// pending.
pub fn file_kms_state(root: &Path, key: &str) -> (Option<Vec<u8>>, bool) {
    file_kms_state_in(&root.join("keys"), key)
}

/// [`file_kms_state`] of the file KMS whose `path:` is `keys` (a plan with several file KMSs).
pub fn file_kms_state_in(keys: &Path, key: &str) -> (Option<Vec<u8>>, bool) {
    let meta = keys.join(key).join("meta.json");
    let Ok(bytes) = std::fs::read(&meta) else {
        return (None, false);
    };
    let json: serde_json::Value = serde_json::from_slice(&bytes).expect("meta.json");
    let current = json["current"].as_u64().map(|v| {
        std::fs::read(keys.join(key).join(format!("v{v}.key"))).expect("current version's material")
    });
    (current, !json["pending"].is_null())
}

/// Writes key `key` into the file KMS under `root/keys` as another tool would have (no
/// keyplan run): one current version 1 holding `material`, created a day ago.
pub fn file_kms_put(root: &Path, key: &str, material: &[u8]) {
    file_kms_put_in(&root.join("keys"), key, material);
}

/// [`file_kms_put`] into the file KMS whose `path:` is `keys` (a plan with several file KMSs).
pub fn file_kms_put_in(keys: &Path, key: &str, material: &[u8]) {
    let dir = keys.join(key);
    std::fs::create_dir_all(&dir).expect("mkdir keys/<key>");
    std::fs::write(dir.join("v1.key"), material).expect("write v1.key");
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        - 86_400;
    let meta = serde_json::json!({
        "format": 1, "current": 1, "pending": null,
        "versions": [{"version": 1, "created_at": created, "state": "current"}],
    });
    std::fs::write(dir.join("meta.json"), meta.to_string()).expect("write meta.json");
}

/// Makes `key`'s current version in the file KMS under `root/keys` `secs` seconds older, as if
/// that much time had passed since it was created (`created_at` in its meta.json): a test of an
/// age limit needs no sleep.
pub fn file_kms_age_current(root: &Path, key: &str, secs: u64) {
    let meta = root.join("keys").join(key).join("meta.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta).expect("read meta.json")).expect("meta.json");
    let current = json["current"].as_u64().expect("a current version");
    let versions = json["versions"].as_array_mut().expect("versions");
    let v = versions
        .iter_mut()
        .find(|v| v["version"].as_u64() == Some(current))
        .expect("the current version's entry");
    let created = v["created_at"].as_u64().expect("created_at");
    v["created_at"] = (created - secs).into();
    std::fs::write(&meta, json.to_string()).expect("write meta.json");
}

/// A TCP port on 127.0.0.1 that accepts connections and never answers (issue 29): a listener
/// nobody accepts from, so the kernel completes the handshakes (up to its backlog) and what a
/// client sends is never read. Held until the listener is dropped. Returns it and its
/// `127.0.0.1:PORT`.
pub fn silent_listener() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a silent listener");
    let addr = l.local_addr().expect("its address").to_string();
    (l, addr)
}

/// Runs keyplan in `dir` with `args` and extra environment `env`; its output and how long it
/// took.
pub fn keyplan_timed(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Output, std::time::Duration) {
    let mut cmd = keyplan_command();
    cmd.current_dir(dir).env("NO_COLOR", "1").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let started = std::time::Instant::now();
    let out = cmd.output().expect("run keyplan");
    (out, started.elapsed())
}

/// Asserts what `status`, `plan` and `verify` do with a plan (in `dir`) whose KMS `kms` never
/// answers within `timeout_secs` (issue 29): `status` ends within `bound` with exit 3 and its
/// JSON names the KMS and the deadline under `unchecked`; `plan` and `verify` end within
/// `bound` with exit 3 (could not check) and an error naming both; `describe` is how messages name the KMS.
pub fn assert_silent_kms_bounded(
    dir: &Path,
    env: &[(&str, &str)],
    describe: &str,
    timeout_secs: u64,
    bound: std::time::Duration,
) {
    // "within 2 s" (the call that timed out) or "the 2 s ... are used up" (the budget).
    let within = format!("{timeout_secs} s");
    let (out, took) = keyplan_timed(dir, &["status", "--format", "json"], env);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(3),
        "status: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(took < bound, "status took {took:?} (bound {bound:?})");
    let j: serde_json::Value = serde_json::from_str(&text).expect("status JSON");
    assert_eq!(j["verdict"], "unknown", "{j}");
    let unchecked: String = j["unchecked"]
        .as_array()
        .expect("unchecked lines")
        .iter()
        .filter_map(|l| l.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        unchecked.contains(describe) && unchecked.contains(&within),
        "the unchecked lines name neither {describe} nor the deadline: {unchecked}"
    );
    assert_eq!(j["keys"][0]["readable"], false, "{j}");
    for cmd in ["plan", "verify"] {
        let (out, took) = keyplan_timed(dir, &[cmd], env);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(3), "{cmd}: {text}");
        assert!(took < bound, "{cmd} took {took:?} (bound {bound:?})");
        assert!(
            text.contains(describe) && text.contains(&within) && text.contains("did not answer"),
            "{cmd} names neither {describe} nor the deadline: {text}"
        );
    }
}
