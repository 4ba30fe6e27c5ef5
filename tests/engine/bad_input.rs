//! Bad input, one case per test: broken plan files, devices that cannot be worked on, and
//! damaged state. Each case runs keyplan through [`Watched`] (argv, environment and logs are
//! searched for key material), and checks that keyplan refuses with exit code 1 and a message
//! that says where the problem is (`file:line:column` of the plan, or the device and keyslot)
//! and what to do, without a panic, and that every LUKS image and the KMS (`keys/`) are
//! byte-for-byte unchanged.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

// ---------------------------------------------------------------------------------------------
// harness

/// One bad-input scenario: a watched scratch directory whose images and KMS are snapshotted
/// once the setup is done ([`Bad::freeze`]).
struct Bad {
    w: Watched,
    snap: Option<Snapshot>,
    kms_existed: bool,
}

impl Bad {
    fn new() -> Bad {
        Bad {
            w: Watched::new(),
            snap: None,
            kms_existed: false,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.w.s.path(rel)
    }

    /// Writes `keyplan.yaml`.
    fn plan(&self, text: &str) {
        self.w.s.plan("keyplan.yaml", text);
    }

    /// Writes `initial.pass` (the passphrase of every image's keyslot 0).
    fn initial_pass(&self) {
        self.w.s.initial_pass();
    }

    /// A small LUKS image (`luks1`: 1.2 MiB, 8 keyslots; `luks2`: 600 KiB, a 16 KiB metadata
    /// area and room for 4 keyslots; 256-bit volume keys) opening with [`INITIAL`] in keyslot
    /// 0: small, because the leak check reads every byte of every file, several times.
    fn image(&self, name: &str, luks: &str) -> PathBuf {
        let p = self.path(name);
        if luks == "luks2" {
            luks_format(&p, 600 << 10, luks, &LUKS2_SMALL, INITIAL);
        } else {
            luks_format(&p, 1200 << 10, luks, &LUKS1_SMALL, INITIAL);
        }
        p
    }

    /// Runs one of keyplan's commands with the watch's environment and an extra environment.
    fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        let mut cmd = self.w.command(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run keyplan");
        self.w.record(&out);
        out
    }

    /// Snapshots every `*.img` file of the scratch directory and the KMS directory `keys/`.
    fn freeze(&mut self) {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(self.w.s.dir.path())
            .expect("read scratch dir")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "img") && p.is_file())
            .collect();
        paths.sort();
        let keys = self.path("keys");
        self.kms_existed = keys.exists();
        paths.push(keys);
        self.snap = Some(Snapshot::take(&paths));
    }

    /// Runs keyplan with `args` (and `env`), asserts exit code 1, no panic, and that the output
    /// holds every phrase of `wants`; returns stdout + stderr.
    fn refuse_env(&self, args: &[&str], env: &[(&str, &str)], wants: &[&str]) -> String {
        let out = self.run_env(args, env);
        judge(args, &out, wants)
    }

    fn refuse(&self, args: &[&str], wants: &[&str]) -> String {
        self.refuse_env(args, &[], wants)
    }

    /// `apply --auto-approve` and `plan` both refuse with `wants`.
    fn refuse_plan_and_apply(&self, wants: &[&str]) {
        self.refuse(&["plan"], wants);
        self.refuse(&["apply", "--auto-approve"], wants);
    }

    /// Asserts that the images and the KMS are unchanged and that nothing leaked.
    fn done(self) {
        let snap = self.snap.as_ref().expect("freeze() was called");
        snap.assert_unchanged("after the refused commands");
        if !self.kms_existed {
            assert!(
                !self.path("keys").exists(),
                "the KMS directory keys/ was created"
            );
        }
        self.w.assert_no_leaks();
    }
}

/// Checks one refused run: exit code 1, no panic or backtrace hint, every phrase present.
fn judge(args: &[&str], out: &std::process::Output, wants: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let text = format!("{}{stderr}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        out.status.code(),
        Some(1),
        "keyplan {args:?} must exit 1:\n{text}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "keyplan {args:?} panicked:\n{text}"
    );
    for w in wants {
        assert!(
            text.contains(w),
            "keyplan {args:?}: the output lacks {w:?}:\n{text}"
        );
    }
    text
}

/// luksFormat options of the small LUKS2 test image (cryptsetup warns that it is too small to
/// activate: keyplan never activates, it works on the header).
const LUKS2_SMALL: [&str; 6] = [
    "--key-size",
    "256",
    "--luks2-metadata-size",
    "16k",
    "--luks2-keyslots-size",
    "512k",
];

/// luksFormat options of the small LUKS1 test image.
const LUKS1_SMALL: [&str; 4] = ["--key-size", "256", "--align-payload", "8"];

/// Runs cryptsetup (directly, not through keyplan) and asserts success.
fn cryptsetup(args: &[&str]) {
    let out = Command::new("cryptsetup")
        .env("LC_ALL", "C")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cryptsetup");
    assert!(
        out.status.success(),
        "cryptsetup {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Adds keyslot `slot` to `dev`, unlocking with the passphrase file `unlock`, new passphrase
/// from the file `new`.
fn add_keyslot(dev: &Path, unlock: &Path, slot: u32, new: &Path) {
    let (dev, unlock, new) = (s(dev), s(unlock), s(new));
    let slot = slot.to_string();
    cryptsetup(&[
        "luksAddKey",
        "--batch-mode",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--new-key-slot",
        &slot,
        "--key-file",
        &unlock,
        &dev,
        &new,
    ]);
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The plan of [`one_key_plan`] with a single device `d` written as one flow mapping on line 7
/// (column 3): `d: { path: PATH, keys: [k]EXTRA }`.
fn one_device(path: &str, extra: &str) -> String {
    one_key_plan(&format!("  d: {{ path: {path}, keys: [k]{extra} }}"))
}

/// A plain header for plan files written line by line: KMS `local` and key `k` (lines 1-5).
const HEAD: &str =
    "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local }\n";

/// A plan-file case: writes `text` as `keyplan.yaml`, then `apply --auto-approve` and
/// `validate` must both refuse with `wants`.
fn plan_file_case(text: &str, wants: &[&str]) {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    b.initial_pass();
    b.plan(text);
    b.freeze();
    b.refuse(&["apply", "--auto-approve"], wants);
    b.refuse(&["validate"], wants);
    b.done();
}

// ---------------------------------------------------------------------------------------------
// plan files

#[test]
fn plan_empty_file() {
    plan_file_case(
        "",
        &["keyplan.yaml:1:1", "is empty", "starts with `version: 1`"],
    );
}

#[test]
fn plan_only_comments() {
    plan_file_case(
        "# to do: write the plan\n\n",
        &["keyplan.yaml:1:1", "is empty", "starts with `version: 1`"],
    );
}

#[test]
fn plan_yaml_syntax_error() {
    plan_file_case(
        "version: 1\nkms:\n  local: { provider: file, path: keys\nkeys:\n  k: { kms: local }\n",
        &["keyplan.yaml:4:5", "invalid YAML", "fix the YAML syntax"],
    );
}

#[test]
fn plan_toml_syntax_error() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    b.w.s.plan(
        "keyplan.toml",
        "version = 1\n[kms.local\nprovider = \"file\"\npath = \"keys\"\n",
    );
    b.freeze();
    let wants = ["keyplan.toml:2:11", "invalid TOML", "fix the TOML syntax"];
    b.refuse(&["apply", "--auto-approve"], &wants);
    b.refuse(&["plan"], &wants);
    b.done();
}

#[test]
fn plan_invalid_utf8() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    std::fs::write(
        b.path("keyplan.yaml"),
        b"version: 1\nkms:\n  l\xe9cal: { provider: file, path: keys }\n",
    )
    .unwrap();
    b.freeze();
    let wants = [
        "keyplan.yaml:3:4",
        "not UTF-8",
        "byte 0xe9",
        "save the plan file as UTF-8",
    ];
    b.refuse(&["apply", "--auto-approve"], &wants);
    b.refuse(&["plan"], &wants);
    b.done();
}

#[test]
fn plan_binary_garbage() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    let garbage: Vec<u8> = (0u8..=255).cycle().take(4096).collect();
    std::fs::write(b.path("garbage.bin"), &garbage).unwrap();
    b.freeze();
    let out = b.refuse(
        &["apply", "--auto-approve", "-f", "garbage.bin"],
        &["garbage.bin:", "not UTF-8", "its content is not shown"],
    );
    assert!(
        out.contains("point it at the plan file"),
        "says what to do: {out}"
    );
    b.done();
}

#[test]
fn plan_version_2() {
    plan_file_case(
        &format!("version: 2\n{}", &HEAD["version: 1\n".len()..]),
        &[
            "keyplan.yaml:1:10",
            "unsupported plan format version 2",
            "write `version: 1`",
        ],
    );
}

#[test]
fn plan_missing_version() {
    plan_file_case(
        &HEAD["version: 1\n".len()..],
        &[
            "keyplan.yaml:1:1",
            "missing field `version`",
            "add `version: 1` at the top",
        ],
    );
}

#[test]
fn plan_unknown_top_level_field() {
    plan_file_case(
        &format!("{HEAD}devices: {{}}\nrotation: fast\n"),
        &[
            "keyplan.yaml:7:1",
            "unknown field `rotation`",
            "remove `rotation` or correct its spelling",
        ],
    );
}

#[test]
fn plan_unknown_field_in_key() {
    plan_file_case(
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local, rotate_every: 30d }\n",
        &[
            "keyplan.yaml:5:20",
            "unknown field `rotate_every`",
            "remove `keys.k.rotate_every`",
        ],
    );
}

#[test]
fn plan_unknown_field_in_device() {
    plan_file_case(
        &one_device("d.img", ", enroll_with: initial.pass, keyslot: 3"),
        &[
            "keyplan.yaml:7:59",
            "unknown field `keyslot`",
            "remove `devices.d.keyslot`",
        ],
    );
}

#[test]
fn plan_unknown_field_in_kms() {
    plan_file_case(
        "version: 1\nkms:\n  local: { provider: file, path: keys, mode: 0700 }\n",
        &[
            "keyplan.yaml:3:40",
            "unknown field `mode`",
            "remove `kms.local.mode`",
        ],
    );
}

#[test]
fn plan_keys_as_a_list() {
    plan_file_case(
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  - k\n",
        &[
            "keyplan.yaml:5:3",
            "keys: expected a mapping, found a list",
            "change `keys` to a value of the expected type",
        ],
    );
}

#[test]
fn plan_keyslot_as_a_string() {
    plan_file_case(
        &format!("{HEAD}devices:\n  d:\n    path: d.img\n    keys:\n      - {{ key: k, keyslot: three }}\n"),
        &[
            "keyplan.yaml:10:28",
            "expected a whole number (0 or more), found `three`",
            "change `devices.d.keys[0].keyslot`",
        ],
    );
}

#[test]
fn plan_negative_keyslot() {
    plan_file_case(
        &format!(
            "{HEAD}devices:\n  d:\n    path: d.img\n    keys:\n      - {{ key: k, keyslot: -1 }}\n"
        ),
        &[
            "keyplan.yaml:10:28",
            "expected a whole number (0 or more), found `-1`",
            "change `devices.d.keys[0].keyslot`",
        ],
    );
}

#[test]
fn plan_key_references_unknown_kms() {
    plan_file_case(
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: vault }\n",
        &[
            "keyplan.yaml:5:13",
            "key `k` uses KMS `vault`, which is not defined",
            "use one of the defined KMS instances (`local`)",
        ],
    );
}

#[test]
fn plan_device_references_unknown_key() {
    plan_file_case(
        &format!("{HEAD}devices:\n  d: {{ path: d.img, keys: [kk], enroll_with: initial.pass }}\n"),
        &[
            "keyplan.yaml:7:28",
            "lists key `kk`, which is not defined",
            "use one of the defined keys (`k`)",
        ],
    );
}

#[test]
fn plan_unknown_provider() {
    plan_file_case(
        "version: 1\nkms:\n  local: { provider: s3, path: keys }\n",
        &[
            "keyplan.yaml:3:22",
            "unknown variant `s3`",
            "use one of the values listed",
        ],
    );
}

#[test]
fn plan_file_kms_without_path() {
    plan_file_case(
        "version: 1\nkms:\n  remote: { provider: file, path: keys2 }\n  local: { provider: file }\nkeys:\n  k: { kms: local }\n",
        &[
            "keyplan.yaml:4:3",
            "kms.local: missing field `path`",
            "add `path` to `kms.local`",
        ],
    );
}

#[test]
fn plan_keyslot_32_out_of_range_for_luks2() {
    plan_file_case(
        &format!("{HEAD}devices:\n  d:\n    path: d.img\n    keys:\n      - {{ key: k, keyslot: 32 }}\n    enroll_with: initial.pass\n"),
        &[
            "keyplan.yaml:10:28",
            "keyslot 32 for key `k` is out of range",
            "pin a keyslot from 0 to 31",
        ],
    );
}

/// Keyslot 8 is fine for LUKS2 but not for LUKS1: found once the header is read.
#[test]
fn plan_keyslot_8_out_of_range_for_luks1() {
    let mut b = Bad::new();
    b.initial_pass();
    b.image("old.img", "luks1");
    b.plan(&format!(
        "{HEAD}devices:\n  old:\n    path: old.img\n    keys:\n      - {{ key: k, keyslot: 8 }}\n    enroll_with: initial.pass\n{FAST_PBKDF}"
    ));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "keyplan.yaml:10:28",
        "keyslot 8 is out of range: device old is LUKS1 with keyslots 0-7",
        "pin a keyslot between 0 and 7",
    ]);
    b.done();
}

#[test]
fn plan_two_keys_pinned_to_one_keyslot() {
    plan_file_case(
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  a: { kms: local }\n  b: { kms: local }\ndevices:\n  d:\n    path: d.img\n    keys:\n      - { key: a, keyslot: 2 }\n      - { key: b, keyslot: 2 }\n",
        &[
            "keyplan.yaml:12:28",
            "keyslot 2 is pinned for both key `a` and key `b`",
            "give each key its own keyslot",
        ],
    );
}

#[test]
fn plan_duplicate_device_path() {
    plan_file_case(
        &one_key_plan("  d: { path: d.img, keys: [k] }\n  e: { path: ./d.img, keys: [k] }"),
        &[
            "keyplan.yaml:8:14",
            "device `e` has the same path as device `d`",
            "list each device once",
        ],
    );
}

#[test]
fn plan_duplicate_uuid() {
    let u = "3f9c1c2e-0d1b-4a57-9a54-6cb6f0ee2a11";
    plan_file_case(
        &one_key_plan(&format!(
            "  d: {{ path: d.img, uuid: {u}, keys: [k] }}\n  e: {{ path: e.img, uuid: {}, keys: [k] }}",
            u.to_uppercase()
        )),
        &[
            "keyplan.yaml:8:27",
            "device `e` has the same LUKS UUID as device `d`",
            "two devices cannot share a LUKS UUID",
        ],
    );
}

#[test]
fn plan_bytes_zero() {
    plan_file_case(
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local, bytes: 0 }\n",
        &[
            "keyplan.yaml:5:27",
            "`bytes` is 0, outside 16..=512",
            "set `bytes` between 16 and 512",
        ],
    );
}

#[test]
fn plan_bytes_too_small() {
    plan_file_case(
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local, bytes: 8 }\n",
        &[
            "keyplan.yaml:5:27",
            "`bytes` is 8, outside 16..=512",
            "or remove it for the default 32",
        ],
    );
}

#[test]
fn plan_invalid_rotate_after() {
    plan_file_case(
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local, rotate_after: 3 months }\n",
        &[
            "keyplan.yaml:5:34",
            "uses the unit `months`, which is not accepted",
            "write a number and a unit, e.g. `90d`",
        ],
    );
}

#[test]
fn plan_invalid_pbkdf_type() {
    plan_file_case(
        &format!("{HEAD}settings:\n  pbkdf: {{ type: scrypt, iterations: 4 }}\n"),
        &[
            "keyplan.yaml:7:18",
            "unknown variant `scrypt`, expected one of argon2id, argon2i, pbkdf2",
            "use one of the values listed",
        ],
    );
}

#[test]
fn plan_pbkdf_iterations_zero() {
    plan_file_case(
        &format!("{HEAD}settings:\n  pbkdf: {{ type: pbkdf2, iterations: 0 }}\n"),
        &[
            "keyplan.yaml:7:38",
            "`iterations: 0` is too low for pbkdf2",
            "set `iterations` to 1000 or more",
        ],
    );
}

#[test]
fn plan_pbkdf_memory_with_pbkdf2() {
    plan_file_case(
        &format!(
            "{HEAD}settings:\n  pbkdf: {{ type: pbkdf2, iterations: 1000, memory_kib: 65536 }}\n"
        ),
        &[
            "keyplan.yaml:7:",
            "`memory_kib` with `type: pbkdf2`: PBKDF2 has no memory cost and no threads",
            "remove `memory_kib`, or set `type: argon2id`",
        ],
    );
}

#[test]
fn plan_pbkdf_parallel_with_pbkdf2() {
    plan_file_case(
        &format!("{HEAD}settings:\n  pbkdf: {{ type: pbkdf2, iterations: 1000, parallel: 2 }}\n"),
        &["keyplan.yaml:7:", "`parallel` with `type: pbkdf2`"],
    );
}

#[test]
fn plan_pbkdf_iter_time_beside_iterations() {
    plan_file_case(
        &format!(
            "{HEAD}settings:\n  pbkdf: {{ type: argon2id, iterations: 4, iter_time_ms: 2000 }}\n"
        ),
        &[
            "keyplan.yaml:7:",
            "`iter_time_ms: 2000` beside `iterations`",
            "keep one: `iterations` for a fixed count",
        ],
    );
}

#[test]
fn plan_pbkdf_absurd_memory() {
    plan_file_case(
        &format!("{HEAD}settings:\n  pbkdf: {{ type: argon2id, memory_kib: 1099511627, iterations: 4 }}\n"),
        &[
            "keyplan.yaml:7:40",
            "`memory_kib: 1099511627` is outside what cryptsetup accepts for argon2id",
            "set `memory_kib` between 32 and 4194304",
        ],
    );
}

#[test]
fn plan_parallelism_zero() {
    plan_file_case(
        &format!("{HEAD}settings:\n  parallelism: 0\n"),
        &[
            "keyplan.yaml:7:16",
            "`parallelism` is 0",
            "set `parallelism` to 1 or more",
        ],
    );
}

#[test]
fn plan_duplicate_mapping_key() {
    plan_file_case(
        "version: 1\nkms:\n  local: { provider: file, path: keys }\nkeys:\n  k: { kms: local }\n  k: { kms: local, bytes: 64 }\n",
        &[
            "keyplan.yaml:6:3",
            "duplicate key `k`",
            "each key may appear only once in a mapping",
        ],
    );
}

/// A "billion laughs" document: nine levels of nine aliases each. keyplan must stop quickly
/// (bounded here by a timeout) instead of expanding it.
#[test]
fn plan_yaml_alias_bomb() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    let mut text = String::from(HEAD);
    text.push_str(
        "x0: &x0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 1..10 {
        let p = format!("*x{}", i - 1);
        text.push_str(&format!("x{i}: &x{i} [{}]\n", vec![p; 9].join(",")));
    }
    b.plan(&text);
    b.freeze();
    for args in [&["apply", "--auto-approve"][..], &["plan"][..]] {
        let child =
            b.w.command(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn keyplan");
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(out) => out.expect("keyplan output"),
            Err(_) => {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                panic!("keyplan {args:?} did not stop within 60 s on an alias bomb");
            }
        };
        b.w.record(&out);
        judge(
            args,
            &out,
            &[
                "keyplan.yaml:",
                "expands too many aliases",
                "no large alias (`*name`) expansions",
            ],
        );
    }
    b.done();
}

#[test]
fn plan_device_without_keys_under_remove() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    b.plan(&one_key_plan(
        "  d:\n    path: d.img\n    keys: []\n    unmanaged_keyslots: remove",
    ));
    b.freeze();
    let wants = [
        "keyplan.yaml:10:25",
        "lists no key but says `unmanaged_keyslots: remove`",
        "could lock you out",
        "or set `unmanaged_keyslots: keep`",
    ];
    b.refuse(&["validate"], &wants);
    b.refuse_plan_and_apply(&wants);
    b.done();
}

/// `unmanaged_keyslots: remove` with one key whose enrollment cannot work (the enroll_with
/// passphrase is wrong): refused before the key is staged, and keyslot 0 is not touched.
#[test]
fn plan_remove_where_the_only_key_cannot_be_enrolled() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    std::fs::write(b.path("stale.pass"), b"last year's passphrase").unwrap();
    b.w.add_secret(b"last year's passphrase");
    b.plan(&one_device(
        "d.img",
        ", enroll_with: stale.pass, unmanaged_keyslots: remove",
    ));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "enroll_with at ",
        "keyplan.yaml:7:",
        "opens none of its bound keyslots (keyslot 0)",
        "keyslot(s) 0 would be removed",
        "could lock you out",
        "no key version was staged",
        "Put the passphrase that opens the device today in",
    ]);
    b.done();
}

#[test]
fn plan_f_missing_file() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    b.freeze();
    b.refuse(
        &["apply", "--auto-approve", "-f", "nope.yaml"],
        &["cannot read plan file nope.yaml", "check the path"],
    );
    b.done();
}

#[test]
fn plan_f_directory() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    std::fs::create_dir(b.path("plans")).unwrap();
    std::fs::write(b.path("plans/keyplan.yaml"), one_device("../d.img", "")).unwrap();
    b.freeze();
    b.refuse(
        &["apply", "--auto-approve", "-f", "plans"],
        &[
            "cannot read plan file plans: it is a directory",
            "pass `-f plans/keyplan.yaml`",
        ],
    );
    b.done();
}

#[test]
fn plan_rotate_unknown_key() {
    let mut b = Bad::new();
    b.initial_pass();
    b.image("d.img", "luks2");
    b.plan(&one_device("d.img", ", enroll_with: initial.pass"));
    b.w.ok(&["apply", "--auto-approve"], 0);
    b.freeze();
    for args in [
        &["apply", "--auto-approve", "--rotate", "kk"][..],
        &["plan", "--rotate", "kk"][..],
    ] {
        b.refuse(
            args,
            &["--rotate kk: no such key in the plan", "keyplan.yaml: k"],
        );
    }
    b.done();
}

#[test]
fn plan_multiple_yaml_documents() {
    plan_file_case(
        &format!("{HEAD}---\n{HEAD}"),
        &[
            "keyplan.yaml:7:1",
            "holds more than one YAML document",
            "keep a single document",
        ],
    );
}

// ---------------------------------------------------------------------------------------------
// devices

#[test]
fn device_path_missing() {
    let mut b = Bad::new();
    b.initial_pass();
    b.image("d.img", "luks2");
    b.plan(&one_device("gone.img", ", enroll_with: initial.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "keyplan.yaml:7:14",
        "gone.img does not exist",
        "correct `path`",
    ]);
    b.done();
}

#[test]
fn device_is_a_directory() {
    let mut b = Bad::new();
    b.initial_pass();
    b.image("d.img", "luks2");
    std::fs::create_dir(b.path("disk")).unwrap();
    b.plan(&one_device("disk", ", enroll_with: initial.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "keyplan.yaml:7:14",
        "disk is a directory, not a block device or LUKS image file",
        "correct `path`",
    ]);
    b.done();
}

#[test]
fn device_not_luks_zero_filled() {
    let mut b = Bad::new();
    b.initial_pass();
    std::fs::File::create(b.path("zero.img"))
        .and_then(|f| f.set_len(4 << 20))
        .unwrap();
    b.plan(&one_device("zero.img", ", enroll_with: initial.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "keyplan.yaml:7:14",
        "zero.img is not a LUKS device",
        "keyplan never formats a device",
    ]);
    b.done();
}

#[test]
fn device_dev_null() {
    let mut b = Bad::new();
    b.initial_pass();
    b.image("d.img", "luks2");
    b.plan(&one_device("/dev/null", ", enroll_with: initial.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "keyplan.yaml:7:14",
        "/dev/null is a character device",
        "correct `path`",
    ]);
    b.done();
}

#[test]
fn device_truncated_luks_image() {
    let mut b = Bad::new();
    b.initial_pass();
    let full = b.image("full.img", "luks2");
    let head = std::fs::read(&full).unwrap()[..4096].to_vec();
    std::fs::write(b.path("trunc.img"), head).unwrap();
    b.plan(&one_device("trunc.img", ", enroll_with: initial.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "keyplan.yaml:7:14",
        "trunc.img starts with a LUKS signature",
        "damaged or truncated (the file is 4096 bytes)",
        "luksHeaderRestore",
    ]);
    b.done();
}

/// Undoes `chattr +i` when the test ends, also when it fails.
struct Immutable(PathBuf);

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

#[test]
fn device_read_only_immutable_image() {
    let mut b = Bad::new();
    b.initial_pass();
    let d = b.image("d.img", "luks2");
    b.plan(&one_device("d.img", ", enroll_with: initial.pass"));
    let ok = Command::new("chattr")
        .arg("+i")
        .arg(&d)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "SKIPPED device_read_only_immutable_image: chattr +i failed (filesystem or privileges)"
        );
        return;
    }
    let guard = Immutable(d.clone());
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "d.img, ",
        "keyplan.yaml:7:3",
        "the plan would add keyslot 1",
        "cannot be opened for writing",
        "chattr -i",
        "no key version was staged",
    ]);
    drop(guard); // before done(), which removes the scratch directory
    b.done();
}

#[test]
fn device_wrong_uuid() {
    let mut b = Bad::new();
    b.initial_pass();
    b.image("d.img", "luks2");
    b.plan(&one_device(
        "d.img",
        ", uuid: 11111111-2222-3333-4444-555555555555, enroll_with: initial.pass",
    ));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "keyplan.yaml:7:38",
        "not 11111111-2222-3333-4444-555555555555: refusing to touch it",
        "fix `path` or `uuid`",
    ]);
    b.done();
}

/// Two paths holding the same LUKS container (a copied image, or two names of one disk).
#[test]
fn device_same_luks_uuid_on_two_paths() {
    let mut b = Bad::new();
    b.initial_pass();
    let a = b.image("a.img", "luks2");
    std::fs::copy(&a, b.path("b.img")).unwrap();
    b.plan(&one_key_plan(
        "  a: { path: a.img, keys: [k], enroll_with: initial.pass }\n  b: { path: b.img, keys: [k], enroll_with: initial.pass }",
    ));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "keyplan.yaml:8:3",
        "devices a and b are the same LUKS device",
        "list each device once",
    ]);
    b.done();
}

#[test]
fn device_luks1_keyslot_table_full() {
    let mut b = Bad::new();
    b.initial_pass();
    let d = b.image("d.img", "luks1");
    for slot in 1..8 {
        add_keyslot(&d, &b.path("initial.pass"), slot, &b.path("initial.pass"));
    }
    assert_eq!(keyslots(&d).len(), 8);
    b.plan(&one_device("d.img", ", enroll_with: initial.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:3",
        "no free keyslot for k (all 8 keyslots are in use or pinned)",
        "Free a keyslot by hand",
    ]);
    b.done();
}

#[test]
fn device_luks2_keyslot_table_full() {
    let mut b = Bad::new();
    b.initial_pass();
    let d = b.path("d.img");
    luks_format(
        &d,
        (4 << 20) + (256 << 10),
        "luks2",
        &[
            "--key-size",
            "256",
            "--luks2-metadata-size",
            "64k",
            "--luks2-keyslots-size",
            "4m",
        ],
        INITIAL,
    );
    for slot in 1..32 {
        add_keyslot(&d, &b.path("initial.pass"), slot, &b.path("initial.pass"));
    }
    assert_eq!(keyslots(&d).len(), 32);
    b.plan(&one_device("d.img", ", enroll_with: initial.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:3",
        "no free keyslot for k (all 32 keyslots are in use or pinned)",
        "Free a keyslot by hand",
    ]);
    b.done();
}

fn import_token(img: &Path, json: &str) -> bool {
    let mut child = Command::new("cryptsetup")
        .env("LC_ALL", "C")
        .args(["token", "import", "--json-file", "-"])
        .arg(img)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
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

/// A LUKS2 header whose JSON area has some room left, but not enough for another keyslot and
/// keyplan's token: refused at plan time, so the header stays byte-identical (no keyslot is
/// added and removed again) and no key version is staged.
#[test]
fn device_luks2_json_area_full() {
    let mut b = Bad::new();
    b.initial_pass();
    let d = b.image("d.img", "luks2");
    let filler = |pad: usize| {
        format!(
            r#"{{"type":"filler","keyslots":[],"pad":"{}"}}"#,
            "x".repeat(pad)
        )
    };
    // Leave about 300 bytes: more than a token needs, less than a keyslot and a token.
    assert!(import_token(&d, &filler(250)), "reserve token (id 0)");
    let mut n = 1;
    for pad in [2000, 400, 80, 10, 1] {
        while n < 31 && import_token(&d, &filler(pad)) {
            n += 1;
        }
    }
    cryptsetup(&["token", "remove", "--token-id", "0", &s(&d)]);
    b.plan(&one_device("d.img", ", enroll_with: initial.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:3",
        "LUKS2 JSON metadata area is too full for 1 new keyslot",
        "no key version was staged",
        "cryptsetup token remove",
    ]);
    assert_eq!(keyslots(&d), vec![0]);
    b.done();
}

/// cryptsetup's `open --test-passphrase --key-slot N` succeeds on an unbound keyslot, which
/// opens no data: such a passphrase must not be taken for a way in.
#[test]
fn enroll_with_opens_only_an_unbound_keyslot() {
    let mut b = Bad::new();
    let d = b.image("d.img", "luks2");
    std::fs::write(b.path("unbound.pass"), b"unbound passphrase").unwrap();
    b.w.add_secret(b"unbound passphrase");
    cryptsetup(&[
        "luksAddKey",
        "--batch-mode",
        "--unbound",
        "--key-size",
        "512",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-slot",
        "3",
        &s(&d),
        &s(&b.path("unbound.pass")),
    ]);
    assert_eq!(keyslots(&d), vec![0, 3]);
    assert!(!bound(&d, 3));
    b.plan(&one_device("d.img", ", enroll_with: unbound.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:",
        "opens only keyslot 3, which is unbound",
        "no key version was staged",
        "Point enroll_with at the passphrase of a bound keyslot (keyslot 0)",
    ]);
    b.done();
}

#[test]
fn enroll_with_missing() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    b.plan(&one_device("d.img", ", enroll_with: initial.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:3",
        "cannot read enroll_with file",
        "initial.pass: No such file or directory",
        "Nothing was changed",
        "Point enroll_with at the file",
    ]);
    b.done();
}

#[test]
fn enroll_with_empty() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    std::fs::write(b.path("initial.pass"), b"").unwrap();
    b.plan(&one_device("d.img", ", enroll_with: initial.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:3",
        "initial.pass is empty",
        "it must hold a passphrase that opens the device today",
    ]);
    b.done();
}

/// Larger than cryptsetup's 8 MiB key-file limit: refused by size, before reading it.
#[test]
fn enroll_with_larger_than_cryptsetup_reads() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    std::fs::File::create(b.path("huge.pass"))
        .and_then(|f| f.set_len(9 << 20))
        .unwrap();
    b.plan(&one_device("d.img", ", enroll_with: huge.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:3",
        "huge.pass is 9437184 bytes; cryptsetup reads at most 8388608 bytes",
        "Point enroll_with at the file",
    ]);
    b.done();
}

/// A character device (here /dev/zero) is named as such, not guessed to be a directory.
#[test]
fn enroll_with_character_device() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    b.plan(&one_device("d.img", ", enroll_with: /dev/zero"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:3",
        "/dev/zero is not a regular file (a device, FIFO or socket)",
    ]);
    b.done();
}

#[test]
fn enroll_with_directory() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    std::fs::create_dir(b.path("secrets")).unwrap();
    b.plan(&one_device("d.img", ", enroll_with: secrets"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:3",
        "secrets is a directory",
        "Point enroll_with at the file",
    ]);
    b.done();
}

/// The right passphrase plus a trailing newline (as `echo` writes it) is a wrong passphrase.
#[test]
fn enroll_with_wrong_bytes_trailing_newline() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    let mut bytes = INITIAL.to_vec();
    bytes.push(b'\n');
    std::fs::write(b.path("initial.pass"), &bytes).unwrap();
    b.w.add_secret(&bytes);
    b.plan(&one_device("d.img", ", enroll_with: initial.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "enroll_with at ",
        "keyplan.yaml:7:",
        "opens none of its bound keyslots (keyslot 0)",
        "a trailing newline counts",
        "no key version was staged",
        "cryptsetup open --test-passphrase --key-file",
    ]);
    b.done();
}

#[test]
fn enroll_with_binary_bytes_that_do_not_match() {
    let mut b = Bad::new();
    b.image("d.img", "luks2");
    let bytes = b"line1\nline2\0\xff\xfe end\n\0".to_vec();
    std::fs::write(b.path("binary.pass"), &bytes).unwrap();
    b.w.add_secret(&bytes);
    b.plan(&one_device("d.img", ", enroll_with: binary.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:",
        "binary.pass opens none of its bound keyslots (keyslot 0)",
        "no key version was staged",
    ]);
    b.done();
}

#[test]
fn enroll_with_wrong_on_luks1() {
    let mut b = Bad::new();
    b.image("d.img", "luks1");
    std::fs::write(b.path("old.pass"), b"not the passphrase").unwrap();
    b.w.add_secret(b"not the passphrase");
    b.plan(&one_device("d.img", ", enroll_with: old.pass"));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:",
        "opens none of its bound keyslots (keyslot 0)",
        "no key version was staged",
    ]);
    b.done();
}

/// A pinned keyslot that holds a keyslot keyplan did not create, under `keep`.
#[test]
fn pinned_keyslot_occupied_by_an_unmanaged_keyslot() {
    let mut b = Bad::new();
    b.initial_pass();
    b.image("d.img", "luks2");
    b.plan(&format!(
        "{HEAD}devices:\n  d:\n    path: d.img\n    keys:\n      - {{ key: k, keyslot: 0 }}\n    enroll_with: initial.pass\n{FAST_PBKDF}"
    ));
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:3",
        "keyslot 0 is pinned for k but holds a keyslot that is not k's",
        "Free keyslot 0 or pin another one",
    ]);
    b.done();
}

/// Enrolls `k` into `d.img` with `unmanaged_keyslots: remove`, so only keyslot 1 (k v1) is
/// left, then writes the plan again with `extra`.
fn enrolled_under_remove(b: &Bad, extra_after: &str) -> PathBuf {
    b.initial_pass();
    let d = b.image("d.img", "luks2");
    b.plan(&one_device(
        "d.img",
        ", enroll_with: initial.pass, unmanaged_keyslots: remove",
    ));
    b.w.ok(&["apply", "--auto-approve"], 0);
    assert_eq!(keyslots(&d), vec![1]);
    b.plan(&one_device(
        "d.img",
        &format!(", unmanaged_keyslots: remove{extra_after}"),
    ));
    d
}

/// The KMS's current version was replaced (tampered, or restored from the wrong backup): it
/// opens no keyslot. `verify` and `plan --verify` say which device and keyslot, and since
/// nothing else opens the device, no repair is possible: exit 1.
#[test]
fn kms_key_that_opens_no_keyslot() {
    let mut b = Bad::new();
    let d = enrolled_under_remove(&b, "");
    std::fs::write(
        b.path("keys/k/v1.key"),
        b"tampered-material-0123456789abcdef",
    )
    .unwrap();
    b.w.harvest();
    assert!(!opens(&d, b"tampered-material-0123456789abcdef", None));
    b.freeze();
    b.refuse(
        &["verify"],
        &[
            "FAIL  d: k v1 does not open keyslot 1",
            "verification failed for 1 key(s)",
            "keyplan plan --verify",
        ],
    );
    let wants = [
        "device d (",
        "keyplan.yaml:7:3",
        "keyslot 1 no longer opens with k v1 from the KMS (--verify)",
        "Set `enroll_with:`",
    ];
    b.refuse(&["plan", "--verify"], &wants);
    b.refuse(&["apply", "--auto-approve", "--verify"], &wants);
    b.done();
}

/// The only managed keyslot was killed behind keyplan's back (someone re-keyed the device by
/// hand), under `remove`: neither the KMS key nor the old enroll_with passphrase opens it.
#[test]
fn managed_keyslot_killed_behind_keyplans_back() {
    let mut b = Bad::new();
    let d = enrolled_under_remove(&b, ", enroll_with: initial.pass");
    std::fs::write(
        b.path("k.pass"),
        std::fs::read(b.path("keys/k/v1.key")).unwrap(),
    )
    .unwrap();
    std::fs::write(b.path("other.pass"), b"someone else's passphrase").unwrap();
    b.w.add_secret(b"someone else's passphrase");
    add_keyslot(&d, &b.path("k.pass"), 2, &b.path("other.pass"));
    cryptsetup(&["luksKillSlot", "--batch-mode", &s(&d), "1"]);
    std::fs::remove_file(b.path("k.pass")).unwrap();
    assert_eq!(keyslots(&d), vec![2]);
    b.freeze();
    b.refuse_plan_and_apply(&[
        "device d (",
        "keyplan.yaml:7:",
        "keyslot 1 (k v1) was removed outside keyplan",
        "opens none of its bound keyslots (keyslot 2)",
        "keyslot(s) 2 would be removed",
        "could lock you out",
    ]);
    b.done();
}

/// cryptsetup's messages are not parsed (it runs with LC_ALL=C), and keyplan's own are English
/// whatever the caller's locale.
#[test]
fn non_english_locale_not_luks() {
    let mut b = Bad::new();
    b.initial_pass();
    std::fs::File::create(b.path("zero.img"))
        .and_then(|f| f.set_len(4 << 20))
        .unwrap();
    b.plan(&one_device("zero.img", ", enroll_with: initial.pass"));
    b.freeze();
    let env = [("LC_ALL", "de_DE.UTF-8"), ("LANG", "fr_FR.UTF-8")];
    let wants = [
        "keyplan.yaml:7:14",
        "zero.img is not a LUKS device",
        "keyplan never formats a device",
    ];
    b.refuse_env(&["apply", "--auto-approve"], &env, &wants);
    b.refuse_env(&["plan"], &env, &wants);
    b.done();
}

// ---------------------------------------------------------------------------------------------
// state

#[test]
fn state_dir_is_a_regular_file() {
    let mut b = Bad::new();
    b.initial_pass();
    b.image("d.img", "luks2");
    std::fs::write(b.path("state"), b"not a directory\n").unwrap();
    b.plan(&format!(
        "version: 1\nstate_dir: state\n{}",
        &one_device("d.img", ", enroll_with: initial.pass")["version: 1\n".len()..]
    ));
    b.freeze();
    let wants = [
        "keyplan.yaml:2:12",
        "state exists but is not a directory",
        "move the file",
    ];
    b.refuse_plan_and_apply(&wants);
    assert_eq!(
        std::fs::read(b.path("state")).unwrap(),
        b"not a directory\n"
    );
    b.done();
}

#[test]
fn state_dir_option_names_a_regular_file() {
    let mut b = Bad::new();
    b.initial_pass();
    b.image("d.img", "luks2");
    std::fs::write(b.path("state"), b"not a directory\n").unwrap();
    b.plan(&one_device("d.img", ", enroll_with: initial.pass"));
    b.freeze();
    let wants = [
        "state exists but is not a directory",
        "move the file",
        "--state-dir",
    ];
    b.refuse(&["--state-dir", "state", "plan"], &wants);
    b.refuse(&["--state-dir", "state", "apply", "--auto-approve"], &wants);
    b.done();
}

#[test]
fn corrupt_journal_line_in_the_middle() {
    let mut b = Bad::new();
    b.initial_pass();
    b.image("d.img", "luks2");
    b.plan(&one_device("d.img", ", enroll_with: initial.pass"));
    b.w.ok(&["apply", "--auto-approve"], 0);
    b.w.ok(&["apply", "--auto-approve", "--rotate", "k"], 0);
    let journal = b.path(".keyplan/journal.jsonl");
    let text = std::fs::read_to_string(&journal).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() > 6, "a journal of two runs");
    lines[2] = "{\"ts\": 17, \"run\": garbage";
    std::fs::write(&journal, lines.join("\n") + "\n").unwrap();
    b.freeze();
    let wants = [
        "journal.jsonl line 3 is corrupt",
        "move the file aside to start a fresh journal",
    ];
    b.refuse(&["apply", "--auto-approve", "--rotate", "k"], &wants);
    b.refuse(&["plan"], &wants);
    b.done();
}

/// Enrollment that takes a device's last free keyslot succeeds, and `plan` then says, in a
/// note, that the next rotation will need a free keyslot (it would be refused otherwise, perhaps
/// only when `rotate_after` comes due).
#[test]
fn last_free_keyslot_is_noted() {
    let s = Scratch::new();
    s.initial_pass();
    let d = s.path("d.img");
    luks_format(
        &d,
        (4 << 20) + (256 << 10),
        "luks2",
        &[
            "--key-size",
            "256",
            "--luks2-metadata-size",
            "64k",
            "--luks2-keyslots-size",
            "4m",
        ],
        INITIAL,
    );
    for slot in 1..31 {
        add_keyslot(&d, &s.path("initial.pass"), slot, &s.path("initial.pass"));
    }
    assert_eq!(keyslots(&d).len(), 31);
    s.plan(
        "keyplan.yaml",
        &one_key_plan("  d: { path: d.img, keys: [k], enroll_with: initial.pass }"),
    );
    let out = s.ok(&["plan"], 0);
    assert!(
        out.contains("will have no free keyslot (32 of 32 in use)"),
        "{out}"
    );
    s.ok(&["apply", "--auto-approve"], 0);
    let out = s.ok(&["plan", "--detailed-exitcode"], 0);
    assert!(out.contains("No changes"), "{out}");
    assert!(out.contains("Note: device d ("), "{out}");
    assert!(out.contains("cryptsetup luksKillSlot"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// command lines

/// Usage errors (an unknown flag, subcommand or value, a missing value or argument, arguments
/// that conflict) exit 1 like every other error, for every subcommand: clap's own code 2 is
/// what `plan --detailed-exitcode` means by "changes present", so a typo in a CI pipeline
/// would pass as "changes". clap's message is on stderr, stdout is empty, and nothing is
/// written. `--help` and `--version` still exit 0 with their text on stdout.
#[test]
fn usage_errors_exit_1_for_every_subcommand() {
    let s = Scratch::new();
    let unexpected = |flag: &str| format!("unexpected argument '{flag}' found");
    let cases: Vec<(Vec<&str>, String)> = vec![
        (vec![], "Usage: keyplan".into()),
        (
            vec!["frobnicate"],
            "unrecognized subcommand 'frobnicate'".into(),
        ),
        (vec!["--bogus", "plan"], unexpected("--bogus")),
        (
            vec!["--log-format", "xml", "validate"],
            "invalid value 'xml' for '--log-format".into(),
        ),
        (
            vec!["--color", "sometimes", "plan"],
            "invalid value 'sometimes' for '--color".into(),
        ),
        (vec!["validate", "--bogus"], unexpected("--bogus")),
        (
            vec!["validate", "-f"],
            "a value is required for '--file <PLAN>'".into(),
        ),
        (vec!["plan", "--bogus"], unexpected("--bogus")),
        (
            vec!["plan", "--detailed-exitcode", "--rotate"],
            "a value is required for '--rotate <KEY>'".into(),
        ),
        (vec!["plan", "extra"], unexpected("extra")),
        (vec!["apply", "--bogus"], unexpected("--bogus")),
        (
            vec!["apply", "--parallelism", "0"],
            "invalid value '0' for '--parallelism <N>'".into(),
        ),
        (
            vec!["apply", "saved.json", "--rotate", "k"],
            "cannot be used with".into(),
        ),
        (vec!["verify", "--bogus"], unexpected("--bogus")),
        (
            vec!["status", "--format", "xml"],
            "invalid value 'xml' for '--format <FORMAT>'".into(),
        ),
        (
            vec!["status", "-o"],
            "a value is required for '--out <FILE>'".into(),
        ),
        (vec!["key"], "Usage: keyplan key".into()),
        (
            vec!["key", "frobnicate"],
            "unrecognized subcommand 'frobnicate'".into(),
        ),
        (vec!["key", "get"], "<KEY>".into()),
        (
            vec!["key", "get", "k", "--version", "x"],
            "invalid value 'x' for '--version <VERSION>'".into(),
        ),
        (vec!["key", "get", "k", "--bogus"], unexpected("--bogus")),
        (vec!["key", "holders"], "<KEY>".into()),
        (
            vec!["key", "holders", "k", "--bogus"],
            unexpected("--bogus"),
        ),
        (vec!["key", "release", "k"], "--holder <HOLDER>".into()),
        (
            vec!["key", "release", "k", "--holder"],
            "a value is required".into(),
        ),
        (vec!["journal", "--bogus"], unexpected("--bogus")),
        (vec!["show"], "<SAVED>".into()),
        (vec!["show", "saved.json", "--bogus"], unexpected("--bogus")),
        (vec!["agent"], "--plan <FILE>".into()),
        (
            vec!["agent", "--plan", "p.yaml", "--interval", "soon"],
            "invalid value 'soon' for '--interval <DURATION>'".into(),
        ),
        (
            vec!["agent", "--plan", "p.yaml", "--trusted-keys", "keys"],
            "--cluster <NAME>".into(),
        ),
        (vec!["fleet"], "Usage: keyplan fleet".into()),
        (
            vec!["fleet", "frobnicate"],
            "unrecognized subcommand 'frobnicate'".into(),
        ),
        (vec!["fleet", "status", "--bogus"], unexpected("--bogus")),
        (
            vec!["fleet", "status", "--format", "xml"],
            "invalid value 'xml' for '--format <FORMAT>'".into(),
        ),
        (vec!["fleet", "plan"], "--file <PLAN>".into()),
        (
            vec!["fleet", "plan", "-f", "p.yaml", "--max-age", "soon"],
            "invalid value 'soon' for '--max-age <DURATION>'".into(),
        ),
        (vec!["fleet", "clear", "--bogus"], unexpected("--bogus")),
        (vec!["sign"], "--cluster <NAME>".into()),
        (
            vec!["sign", "--generate-key", "k.key", "p.yaml"],
            "cannot be used with".into(),
        ),
        (vec!["completions"], "<SHELL>".into()),
        (
            vec!["completions", "tcsh"],
            "invalid value 'tcsh' for '<SHELL>'".into(),
        ),
        (vec!["man", "--bogus"], unexpected("--bogus")),
        (
            vec!["man", "--out-dir"],
            "a value is required for '--out-dir <DIR>'".into(),
        ),
    ];
    for (args, wants) in &cases {
        let out = s.keyplan(args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "keyplan {args:?} must exit 1 (a usage error):\n{stdout}{stderr}"
        );
        assert!(
            stderr.contains(wants.as_str()),
            "keyplan {args:?}: stderr lacks clap's {wants:?}:\n{stderr}"
        );
        assert!(stdout.is_empty(), "keyplan {args:?}: stdout: {stdout}");
        assert!(
            !stderr.contains("panicked"),
            "keyplan {args:?} panicked:\n{stderr}"
        );
    }
    assert!(
        walk(s.dir.path()).is_empty(),
        "a usage error wrote {:?}",
        walk(s.dir.path())
    );
    for args in [
        &["--help"][..],
        &["--version"][..],
        &["plan", "--help"][..],
        &["key", "get", "--help"][..],
        &["fleet", "status", "--help"][..],
        &["help", "apply"][..],
    ] {
        let out = s.keyplan(args);
        assert_eq!(out.status.code(), Some(0), "keyplan {args:?}: {out:?}");
        assert!(
            !out.stdout.is_empty(),
            "keyplan {args:?}: nothing on stdout"
        );
    }
}
