//! PBKDF audit (issue 6): every cryptsetup call keyplan makes costs the fewest PBKDF runs.
//! keyplan runs cryptsetup through a wrapper (`KEYPLAN_CRYPTSETUP`) that appends its argv (never
//! its standard input) to a log and then runs the real cryptsetup; the tests judge the log, the
//! `(N steps, M PBKDF runs)` summary and the headers (read with the real cryptsetup directly).

use crate::common::*;
use std::path::{Path, PathBuf};

/// Scratch dir plus the cryptsetup wrapper and its logs.
struct Audit {
    s: Scratch,
    wrapper: PathBuf,
}

impl Audit {
    /// `debug`: the wrapper also runs `open` and `luksAddKey` with `--debug`, appends those
    /// debug lines (`# ...`; they name keyslots and derivations, never key material) to
    /// `debug.log` and passes the rest of stdout on unchanged.
    fn new(debug: bool) -> Audit {
        Audit::with(debug, false)
    }

    /// Like [`Audit::new`]; with `broken_benchmark` the wrapper answers `benchmark` with
    /// output keyplan cannot understand (exit 0) instead of running it.
    fn with(debug: bool, broken_benchmark: bool) -> Audit {
        let s = Scratch::new();
        let real = real_cryptsetup();
        let log = s.path("argv.log");
        let bench = s.path("bench.log");
        let dbg = s.path("debug.log");
        let debug_case = if debug {
            format!(
                "  luksAddKey|open|-v) \"{real}\" --debug \"$@\" > >(tee -a \"{dbg}\" | grep -v '^# '); exit $? ;;\n",
                real = real.display(),
                dbg = dbg.display()
            )
        } else {
            String::new()
        };
        let broken = if broken_benchmark {
            "  benchmark) echo 'argon2id: a format of the future'; exit 0 ;;\n"
        } else {
            ""
        };
        let body = format!(
            "#!/bin/bash\nprintf '%s\\n' \"$*\" >> \"{log}\"\ncase \"$1\" in\n{broken}  benchmark) out=$(\"{real}\" \"$@\"); rc=$?; printf '%s\\n' \"$out\" >> \"{bench}\"; printf '%s\\n' \"$out\"; exit $rc ;;\n{debug_case}esac\nexec \"{real}\" \"$@\"\n",
            log = log.display(),
            real = real.display(),
            bench = bench.display(),
        );
        let wrapper = script(s.dir.path(), "cryptsetup-wrapper", &body);
        Audit { s, wrapper }
    }

    /// Runs keyplan with the wrapper; asserts exit `code`; returns stdout+stderr.
    fn run(&self, args: &[&str], code: i32) -> String {
        self.s
            .ok_with_env(args, &[("KEYPLAN_CRYPTSETUP", &self.wrapper)], code)
    }

    /// The logged cryptsetup calls since the last [`Audit::clear`], one argv (space-joined) each.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.s.path("argv.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Forgets the logged calls and debug lines.
    fn clear(&self) {
        for f in ["argv.log", "bench.log", "debug.log"] {
            let _ = std::fs::remove_file(self.s.path(f));
        }
    }

    /// Benchmarks cryptsetup ran inside `open`/`luksAddKey` (with the debug wrapper), e.g.
    /// `# Running argon2id() benchmark.`, `# Running pbkdf2(sha256) benchmark.`
    fn internal_benchmarks(&self) -> usize {
        std::fs::read_to_string(self.s.path("debug.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("# Running ") && l.ends_with(") benchmark."))
            .count()
    }

    /// Keyslot key derivations cryptsetup ran (with the debug wrapper): every keyslot tried for
    /// an unlock and every new keyslot.
    fn derivations(&self) -> usize {
        std::fs::read_to_string(self.s.path("debug.log"))
            .unwrap_or_default()
            .matches("# Running keyslot key derivation.")
            .count()
    }
}

/// Calls whose action (first word after options) is `action`.
fn action<'a>(calls: &'a [String], action: &str) -> Vec<&'a String> {
    calls
        .iter()
        .filter(|c| c.split(' ').find(|w| !w.starts_with('-')) == Some(action))
        .collect()
}

/// The value after `flag` in a logged argv.
fn value(call: &str, flag: &str) -> Option<String> {
    let w: Vec<&str> = call.split(' ').collect();
    w.iter()
        .position(|x| *x == flag)
        .and_then(|i| w.get(i + 1))
        .map(|s| s.to_string())
}

fn plan_text(luks_devices: &[&str], settings: &str) -> String {
    let mut devices = String::new();
    for d in luks_devices {
        devices.push_str(&format!(
            "  {d}:\n    path: {d}.img\n    keys: [osd-kek]\n    enroll_with: initial.pass\n"
        ));
    }
    format!(
        "version: 1\nkms:\n  local:\n    provider: file\n    path: keys\nkeys:\n  osd-kek:\n    kms: local\n    rotate_after: 30d\ndevices:\n{devices}{settings}"
    )
}

const NAMES: [&str; 3] = ["block", "db", "wal"];

/// Three devices of `luks` enrolled with osd-kek v1 (keyslot 1) under `settings`.
fn enrolled_three(a: &Audit, luks: &str, settings: &str) -> Vec<PathBuf> {
    a.s.initial_pass();
    a.s.plan("keyplan.yaml", &plan_text(&NAMES, settings));
    let devs: Vec<PathBuf> = NAMES
        .iter()
        .map(|n| a.s.image(&format!("{n}.img"), luks))
        .collect();
    a.run(&["apply", "--auto-approve"], 0);
    devs
}

/// Rotation of a key shared by 3 devices with forced iterations: per device one luksAddKey
/// naming both keyslots (2 PBKDF runs), one verify naming its keyslot (1), one kill with no key
/// input (0).
fn rotation_costs_three_per_device(luks: &str) {
    let a = Audit::new(false);
    let devs = enrolled_three(&a, luks, FAST_PBKDF);
    a.clear();
    let out = a.run(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    assert!(out.contains(" 9 PBKDF runs)"), "{out}");
    let calls = a.calls();
    let adds = action(&calls, "luksAddKey");
    assert_eq!(adds.len(), 3, "{calls:#?}");
    for c in &adds {
        assert_eq!(value(c, "--key-slot").as_deref(), Some("1"), "{c}");
        assert_eq!(value(c, "--new-key-slot").as_deref(), Some("2"), "{c}");
        assert_eq!(
            value(c, "--pbkdf-force-iterations").as_deref(),
            Some("1000"),
            "{c}"
        );
    }
    let kills = action(&calls, "luksKillSlot");
    assert_eq!(kills.len(), 3, "{calls:#?}");
    for c in &kills {
        assert!(c.contains("--batch-mode"), "{c}");
        assert!(!c.contains("--key-file"), "{c}");
    }
    let opens_ = action(&calls, "open");
    assert_eq!(opens_.len(), 3, "{calls:#?}");
    for c in &opens_ {
        assert!(c.starts_with("open --test-passphrase --key-slot 2 "), "{c}");
    }
    assert!(action(&calls, "benchmark").is_empty(), "{calls:#?}");
    let key = a.s.key_get("osd-kek", None);
    for d in &devs {
        assert!(opens(d, &key, Some(2)), "{}", d.display());
        assert!(!opens(d, &key, Some(1)));
        assert!(opens(d, INITIAL, Some(0)));
    }
}

#[test]
fn luks2_rotation_costs_three_pbkdf_runs_per_device() {
    rotation_costs_three_per_device("luks2");
}

#[test]
fn luks1_rotation_costs_three_pbkdf_runs_per_device() {
    rotation_costs_three_per_device("luks1");
}

/// A time target (`iter_time_ms`): one `cryptsetup benchmark` for the whole run, its result
/// passed to every luksAddKey, and the new keyslots carry exactly that iteration count.
#[test]
fn time_target_benchmarks_once_per_run() {
    let a = Audit::new(false);
    let settings = "settings:\n  pbkdf: { type: pbkdf2, iter_time_ms: 50 }\n  parallelism: 4\n";
    let devs = enrolled_three(&a, "luks2", settings);
    // the enrollment (3 adds) benchmarked once, too
    assert_eq!(action(&a.calls(), "benchmark").len(), 1, "{:#?}", a.calls());
    a.clear();
    let out = a.run(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    // 3 x (unlock + derive + verify) + 1 benchmark
    assert!(out.contains(" 10 PBKDF runs)"), "{out}");
    let calls = a.calls();
    let benches = action(&calls, "benchmark");
    assert_eq!(benches.len(), 1, "{calls:#?}");
    // Scratch::image makes LUKS2 with a 512-bit volume key: the benchmark asks for that size.
    assert_eq!(
        benches[0].as_str(),
        "benchmark --pbkdf pbkdf2 --iter-time 50 --hash sha256 --key-size 512"
    );
    let bench = std::fs::read_to_string(a.s.path("bench.log")).expect("bench.log");
    let per_second: u64 = bench
        .lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.first() == Some(&"PBKDF2-sha256") && w.get(5) == Some(&"for"))
                .then(|| w[1].parse().ok())
                .flatten()
        })
        .unwrap_or_else(|| panic!("no result in {bench:?}"));
    let expected = (per_second * 50 / 1000).max(1000);
    // The benchmark's hash and key size come from the headers keyplan already read: no text
    // `luksDump` beside the one JSON dump per header read.
    assert!(
        action(&calls, "luksDump")
            .iter()
            .all(|c| c.contains("--dump-json-metadata")),
        "{calls:#?}"
    );
    let adds = action(&calls, "luksAddKey");
    assert_eq!(adds.len(), 3, "{calls:#?}");
    for c in &adds {
        assert_eq!(
            value(c, "--pbkdf-force-iterations"),
            Some(expected.to_string()),
            "{c}"
        );
        assert_eq!(value(c, "--pbkdf").as_deref(), Some("pbkdf2"), "{c}");
        assert!(!c.contains("--iter-time"), "{c}");
    }
    for d in &devs {
        let json = luks2_json(d);
        assert_eq!(
            json["keyslots"]["2"]["kdf"]["iterations"].as_u64(),
            Some(expected),
            "{}",
            d.display()
        );
        assert_eq!(json["keyslots"]["2"]["kdf"]["type"], "pbkdf2");
    }
}

/// argon2id with a time target: one benchmark (with the plan's memory and threads), and every
/// new keyslot carries the measured time cost, memory and threads.
#[test]
fn argon2_time_target_benchmarks_once_per_run() {
    let a = Audit::new(true);
    let settings = "settings:\n  pbkdf: { type: argon2id, iter_time_ms: 100, memory_kib: 32768, parallel: 1 }\n  parallelism: 4\n";
    let devs = enrolled_three(&a, "luks2", settings);
    a.clear();
    let out = a.run(&["apply", "--auto-approve", "--rotate", "osd-kek"], 0);
    assert!(out.contains(" 10 PBKDF runs)"), "{out}");
    let calls = a.calls();
    let benches = action(&calls, "benchmark");
    assert_eq!(
        benches,
        ["benchmark --pbkdf argon2id --iter-time 100 --pbkdf-memory 32768 --pbkdf-parallel 1"]
    );
    let bench = std::fs::read_to_string(a.s.path("bench.log")).expect("bench.log");
    // argon2id      4 iterations, 32768 memory, 1 parallel threads (CPUs) for 256-bit key ...
    let (time, memory, threads) = bench
        .lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.first() != Some(&"argon2id") || w.len() < 6 {
                return None;
            }
            let n = |s: &str| s.trim_end_matches(',').parse::<u64>().ok();
            Some((n(w[1])?, n(w[3])?, n(w[5])?))
        })
        .unwrap_or_else(|| panic!("no result in {bench:?}"));
    let adds = action(&calls, "luksAddKey");
    assert_eq!(adds.len(), 3, "{calls:#?}");
    for c in &adds {
        assert_eq!(value(c, "--pbkdf").as_deref(), Some("argon2id"), "{c}");
        assert_eq!(value(c, "--pbkdf-force-iterations"), Some(time.to_string()));
        assert_eq!(value(c, "--pbkdf-memory"), Some(memory.to_string()));
        assert_eq!(value(c, "--pbkdf-parallel"), Some(threads.to_string()));
        assert!(!c.contains("--iter-time"), "{c}");
    }
    for d in &devs {
        let kdf = &luks2_json(d)["keyslots"]["2"]["kdf"];
        assert_eq!(kdf["type"], "argon2id");
        assert_eq!(kdf["time"].as_u64(), Some(time), "{kdf}");
        assert_eq!(kdf["memory"].as_u64(), Some(memory), "{kdf}");
        assert_eq!(kdf["cpus"].as_u64(), Some(threads), "{kdf}");
    }
    // cryptsetup itself benchmarked nothing: the parameters were explicit.
    assert_eq!(a.internal_benchmarks(), 0);
    // unlock + derive per add, one derivation per verify
    assert_eq!(a.derivations(), 9);
}

/// A benchmark whose output keyplan does not understand is not fatal: a warning, and every add
/// gets the plan's time target as before (cryptsetup benchmarks itself); the benchmark is not
/// run again for each add.
#[test]
fn unparsable_benchmark_falls_back_with_a_warning() {
    let a = Audit::with(true, true);
    let settings = "settings:\n  pbkdf: { type: pbkdf2, iter_time_ms: 50 }\n  parallelism: 4\n";
    a.s.initial_pass();
    a.s.plan("keyplan.yaml", &plan_text(&NAMES, settings));
    let devs: Vec<PathBuf> = NAMES
        .iter()
        .map(|n| a.s.image(&format!("{n}.img"), "luks2"))
        .collect();
    let out = a.run(&["apply", "--auto-approve"], 0);
    assert!(
        out.contains("cannot understand the output of cryptsetup benchmark"),
        "{out}"
    );
    let calls = a.calls();
    assert_eq!(action(&calls, "benchmark").len(), 1, "{calls:#?}");
    let adds = action(&calls, "luksAddKey");
    assert_eq!(adds.len(), 3, "{calls:#?}");
    for c in &adds {
        assert_eq!(value(c, "--iter-time").as_deref(), Some("50"), "{c}");
        assert!(!c.contains("--pbkdf-force-iterations"), "{c}");
    }
    // the old behaviour: cryptsetup benchmarks inside every luksAddKey
    assert_eq!(a.internal_benchmarks(), 3);
    let key = a.s.key_get("osd-kek", None);
    for d in &devs {
        assert!(opens(d, &key, Some(1)));
    }
}

/// `plan` on enrolled, unchanged devices starts no cryptsetup process (so derives nothing);
/// `plan --verify` and `verify` derive
/// once per managed keyslot, naming it.
#[test]
fn plan_derives_nothing_and_verify_once_per_keyslot() {
    let a = Audit::new(false);
    enrolled_three(&a, "luks2", FAST_PBKDF);
    a.clear();
    let out = a.run(&["plan", "--detailed-exitcode"], 0);
    assert!(out.contains("No changes."), "{out}");
    // Headers are read in process (issue 17): `plan` on unchanged devices starts no
    // cryptsetup process at all, so it derives nothing.
    let calls = a.calls();
    assert!(calls.is_empty(), "plan started cryptsetup: {calls:#?}");
    for (args, summary) in [
        (&["plan", "--verify", "--detailed-exitcode"][..], None),
        (&["verify"][..], Some("All keys verified (3 PBKDF runs).")),
    ] {
        a.clear();
        let out = a.run(args, 0);
        if let Some(s) = summary {
            assert!(out.contains(s), "{out}");
        }
        let calls = a.calls();
        let opens_ = action(&calls, "open");
        assert_eq!(opens_.len(), 3, "{args:?}: {calls:#?}");
        let mut devices: Vec<String> = opens_
            .iter()
            .map(|c| {
                assert!(c.starts_with("open --test-passphrase --key-slot 1 "), "{c}");
                c.rsplit('/').next().unwrap_or_default().to_owned()
            })
            .collect();
        devices.sort();
        assert_eq!(devices, ["block.img", "db.img", "wal.img"]);
        assert!(action(&calls, "luksAddKey").is_empty());
        assert!(action(&calls, "benchmark").is_empty());
    }
}

/// `luksAddKey` of a LUKS2 `dev` with `have` (in a file) adding `new` (fast PBKDF2).
fn add_passphrase(a: &Audit, dev: &Path, have: &[u8], new: &[u8]) {
    let have_file = a.s.path("have.tmp");
    let new_file = a.s.path("new.tmp");
    std::fs::write(&have_file, have).expect("write");
    std::fs::write(&new_file, new).expect("write");
    let out = std::process::Command::new(real_cryptsetup())
        .env("LC_ALL", "C")
        .args(["luksAddKey", "--batch-mode", "--pbkdf", "pbkdf2"])
        .args(["--pbkdf-force-iterations", "1000", "--key-file"])
        .arg(&have_file)
        .arg(dev)
        .arg(&new_file)
        .output()
        .expect("luksAddKey");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(have_file).expect("rm");
    std::fs::remove_file(new_file).expect("rm");
}

/// Keyslot key derivations cryptsetup runs for `args` on `dev` with `pass` on stdin, counted
/// from its `--debug` output.
fn derivations_of(dev: &Path, args: &[&str], pass: &[u8]) -> usize {
    use std::io::Write;
    let mut child = std::process::Command::new(real_cryptsetup())
        .env("LC_ALL", "C")
        .arg("--debug")
        .args(args)
        .arg(dev)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(pass)
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{args:?}");
    String::from_utf8_lossy(&out.stdout)
        .matches("# Running keyslot key derivation.")
        .count()
}

/// enroll_with: the plan-time test learns which keyslot the passphrase opens (keyslot 2, behind
/// two keyslots holding other passphrases) and the enrolling luksAddKey names it.
#[test]
fn enroll_with_names_the_keyslot_it_opens() {
    let a = Audit::new(true);
    a.s.initial_pass();
    a.s.plan(
        "keyplan.yaml",
        &format!("{}{FAST_PBKDF}", plan_text(&["block"], "")),
    );
    let dev = a.s.path("block.img");
    luks_format(&dev, 20 << 20, "luks2", &[], b"other passphrase 0");
    add_passphrase(&a, &dev, b"other passphrase 0", b"other passphrase 1");
    add_passphrase(&a, &dev, b"other passphrase 0", INITIAL);
    assert!(opens(&dev, INITIAL, Some(2)));
    // A twin of the device for the reference: what cryptsetup derives for the calls keyplan
    // made before it named the keyslot.
    let twin = a.s.path("twin.img");
    std::fs::copy(&dev, &twin).expect("copy");

    let out = a.run(&["apply", "--auto-approve"], 0);
    let calls = a.calls();
    let adds = action(&calls, "luksAddKey");
    assert_eq!(adds.len(), 1, "{calls:#?}");
    assert_eq!(
        value(adds[0], "--key-slot").as_deref(),
        Some("2"),
        "{}",
        adds[0]
    );
    assert_eq!(value(adds[0], "--new-key-slot").as_deref(), Some("3"));
    let tests: Vec<&String> = action(&calls, "open");
    assert_eq!(tests.len(), 2, "{calls:#?}");
    assert!(tests[0].starts_with("-v open --test-passphrase --key-file=- "));
    assert!(tests[1].starts_with("open --test-passphrase --key-slot 3 "));
    // counted: 1 (test) + 2 (add) + 1 (verify)
    assert!(out.contains(" 4 PBKDF runs)"), "{out}");
    let key = a.s.key_get("osd-kek", None);
    assert!(opens(&dev, &key, Some(3)));
    assert!(opens(&dev, INITIAL, Some(2)));
    assert!(opens(&dev, INITIAL, None));

    // Derivations cryptsetup really ran: the test tries keyslots 0, 1, 2 (3); the add unlocks
    // keyslot 2 only and derives the new keyslot (2); the verify (1): 6.
    let now = a.derivations();
    assert_eq!(now, 6, "keyplan's derivations now");
    // Before: the add named no keyslot, so cryptsetup tried 0, 1, 2 again (4 for the add): 8.
    let new_file = a.s.path("new.tmp");
    std::fs::write(&new_file, b"some new passphrase").expect("write");
    let new_arg = format!("--new-keyfile={}", new_file.display());
    let before = derivations_of(
        &twin,
        &["-v", "open", "--test-passphrase", "--key-file=-"],
        INITIAL,
    ) + derivations_of(
        &twin,
        &[
            "luksAddKey",
            "--batch-mode",
            "--new-key-slot",
            "3",
            "--key-file=/dev/fd/0",
            &new_arg,
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ],
        INITIAL,
    ) + derivations_of(
        &twin,
        &[
            "open",
            "--test-passphrase",
            "--key-slot",
            "3",
            "--key-file=-",
        ],
        b"some new passphrase",
    );
    std::fs::remove_file(new_file).expect("rm");
    assert_eq!(before, 8, "the old call sequence");
    assert!(now < before);
    // The debug log holds no key material.
    let log = std::fs::read(a.s.path("debug.log")).expect("debug.log");
    for secret in [&key[..], INITIAL, b"other passphrase 0"] {
        assert!(!contains(&log, secret), "secret in the debug log");
    }
}

/// When the keyslot named at plan time no longer opens with the enroll_with passphrase (the
/// passphrase moved to another keyslot after keyplan observed the device), the add falls back
/// to trying keyslots and still enrolls. The move happens while the first step (stage) is held
/// at an injection point.
#[test]
fn enroll_with_falls_back_when_the_named_keyslot_changed() {
    let a = Audit::new(false);
    a.s.initial_pass();
    a.s.plan(
        "keyplan.yaml",
        &format!("{}{FAST_PBKDF}", plan_text(&["block"], "")),
    );
    let dev = a.s.path("block.img");
    luks_format(&dev, 20 << 20, "luks2", &[], b"other passphrase 0");
    add_passphrase(&a, &dev, b"other passphrase 0", INITIAL);
    let gate = a.s.path("first-step.gate");
    std::fs::write(&gate, b"").expect("gate");
    let child = keyplan_command()
        .current_dir(a.s.dir.path())
        .env("NO_COLOR", "1")
        .env("KEYPLAN_CRYPTSETUP", &a.wrapper)
        .env(
            "FAILPOINTS",
            format!("step.before_effect=1*return(wait:{})", gate.display()),
        )
        .args(["apply", "--auto-approve"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn keyplan");
    // The first step waits while the gate exists (src/failpoint.rs).
    wait_at_gate(&gate, child.id());
    // keyplan observed keyslot 1; move the passphrase to keyslot 4.
    let pass = a.s.path("initial.pass");
    let out = std::process::Command::new(real_cryptsetup())
        .env("LC_ALL", "C")
        .args(["luksAddKey", "--batch-mode", "--pbkdf", "pbkdf2"])
        .args(["--pbkdf-force-iterations", "1000", "--new-key-slot", "4"])
        .arg("--key-file")
        .arg(&pass)
        .arg(&dev)
        .arg(&pass)
        .output()
        .expect("luksAddKey");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(real_cryptsetup())
        .args(["luksKillSlot", "--batch-mode"])
        .arg(&dev)
        .arg("1")
        .output()
        .expect("luksKillSlot");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(&gate).expect("open the gate");
    let out = child.wait_with_output().expect("wait");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    let calls = a.calls();
    let adds = action(&calls, "luksAddKey");
    assert_eq!(adds.len(), 2, "{calls:#?}");
    assert_eq!(
        value(adds[0], "--key-slot").as_deref(),
        Some("1"),
        "{}",
        adds[0]
    );
    assert_eq!(value(adds[1], "--key-slot"), None, "{}", adds[1]);
    let key = a.s.key_get("osd-kek", None);
    assert!(opens(&dev, &key, Some(2)));
    assert!(opens(&dev, INITIAL, Some(4)));
}

/// Adoption (issue 14): a key the KMS already holds, in keyslot 0 of three devices (2 LUKS2, 1
/// LUKS1), costs one PBKDF run per device: `open --test-passphrase --key-slot 0` when planning,
/// nothing when applying (the adopt step checks the keyslot's salt, not the passphrase), counted
/// by cryptsetup itself (`--debug`). When the key is not in the suggested keyslot 0, each
/// keyslot tried before the right one costs one more.
#[test]
fn adoption_costs_one_pbkdf_run_per_device() {
    let a = Audit::new(true);
    let devs: Vec<PathBuf> = [("block", "luks2"), ("db", "luks2"), ("wal", "luks1")]
        .iter()
        .map(|(n, luks)| a.s.image(&format!("{n}.img"), luks))
        .collect();
    file_kms_put(a.s.dir.path(), "osd-kek", INITIAL);
    let mut text = plan_text(&NAMES, FAST_PBKDF);
    text = text.replace("    enroll_with: initial.pass\n", "");
    a.s.plan("keyplan.yaml", &text);
    a.clear();
    let out = a.run(&["apply", "--auto-approve"], 0);
    assert!(out.contains("3 adopted. (4 steps, 3 PBKDF runs)"), "{out}");
    let calls = a.calls();
    let opens_ = action(&calls, "open");
    assert_eq!(opens_.len(), 3, "{calls:#?}");
    for c in &opens_ {
        assert!(c.starts_with("open --test-passphrase --key-slot 0 "), "{c}");
    }
    assert!(action(&calls, "luksAddKey").is_empty(), "{calls:#?}");
    // cryptsetup prints its derivation line for LUKS2 only; the LUKS1 device's one test is
    // the third `open` above.
    assert_eq!(
        a.derivations(),
        2,
        "cryptsetup derived once per LUKS2 device"
    );
    a.clear();
    a.run(&["plan", "--detailed-exitcode"], 0);
    assert!(
        action(&a.calls(), "open").is_empty(),
        "adopted: no more tests"
    );

    // The key in keyslot 2, behind keyslot 0 (the initial passphrase) and keyslot 1 (another).
    let b = Audit::new(true);
    let dev = b.s.image("block.img", "luks2");
    add_passphrase(&b, &dev, INITIAL, b"another passphrase");
    add_passphrase(&b, &dev, INITIAL, b"the KEK Rook wrote");
    file_kms_put(b.s.dir.path(), "osd-kek", b"the KEK Rook wrote");
    b.s.plan(
        "keyplan.yaml",
        &plan_text(&["block"], FAST_PBKDF).replace("    enroll_with: initial.pass\n", ""),
    );
    b.clear();
    let out = b.run(&["apply", "--auto-approve"], 0);
    assert!(out.contains("= keyslot 2  osd-kek v1"), "{out}");
    assert_eq!(b.derivations(), 3, "keyslots 0, 1 and 2 tried: {out}");
    drop(devs);
}
