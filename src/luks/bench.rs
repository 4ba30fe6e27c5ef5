//! PBKDF parameters for new keyslots, measured at most once per run.
//!
//! Without forced iterations, cryptsetup benchmarks the PBKDF on every `luksAddKey`
//! (cryptsetup(8), `--iter-time`: "the number of milliseconds to spend with PBKDF passphrase
//! processing"; the iteration count, and for argon2 the memory cost, are found by a benchmark).
//! For argon2 that benchmark costs about as much as one PBKDF run (2 s by default), for every
//! keyslot added. keyplan instead runs `cryptsetup benchmark` once per PBKDF type (and, for
//! pbkdf2, hash and key size) per process, lazily on the first add that needs it, and passes
//! the measured parameters explicitly (`--pbkdf-force-iterations`, `--pbkdf-memory`,
//! `--pbkdf-parallel`) to every `luksAddKey` of the run. So `plan`, `verify`, `status` and
//! runs that add no keyslot never benchmark. The benchmark counts as 1 PBKDF run (it is about
//! one PBKDF run of work).
//!
//! Output of `cryptsetup benchmark --pbkdf ...` with cryptsetup 2.6.1 (`LC_ALL=C`), which the
//! parsers below rely on (a comment line `# Tests are approximate ...` comes first):
//!
//! ```text
//! argon2id      4 iterations, 65536 memory, 4 parallel threads (CPUs) for 256-bit key (requested 200 ms time)
//! PBKDF2-sha256    3318278 iterations per second for 256-bit key
//! ```
//!
//! Without `--hash`, the pbkdf2 benchmark prints `PBKDF2-(null) N/A` and exits 1, so the hash is
//! always given. Anything else (another format, a failed benchmark) falls back to the old
//! behaviour for the rest of the process (cryptsetup benchmarks on each add) with a warning.

use std::ffi::OsString;

use super::LuksVersion;
use crate::spec::{PbkdfSettings, PbkdfType};

/// cryptsetup's compiled-in PBKDF iteration time in milliseconds, for LUKS1 and LUKS2 alike
/// (`cryptsetup --help` of cryptsetup 2.6.1: "Default PBKDF for LUKS1: pbkdf2, iteration time:
/// 2000 (ms)", and for LUKS2 "Iteration time: 2000"). Used for pbkdf2 when the plan sets no
/// `iter_time_ms` (the pbkdf2 benchmark prints iterations per second, not a count for a time);
/// argon2's benchmark applies the default itself.
pub const DEFAULT_ITER_TIME_MS: u32 = 2000;

/// cryptsetup's lowest PBKDF2 iteration count (cryptsetup(8) `--pbkdf-force-iterations`:
/// "the minimum is 1000 for PBKDF2").
pub const MIN_PBKDF2_ITERATIONS: u64 = 1000;

/// cryptsetup's lowest argon2 time cost (`--pbkdf-force-iterations`: "4 for Argon2").
pub const MIN_ARGON2_ITERATIONS: u32 = 4;

/// Hash of new PBKDF2 keyslots on LUKS2 (cryptsetup's default `--hash`, as `cryptsetup --help`
/// prints: "LUKS header hashing: sha256").
pub const DEFAULT_HASH: &str = "sha256";

/// What one benchmark measures; equal requests share one benchmark.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Request {
    /// `pbkdf2`, `argon2i` or `argon2id` (cryptsetup's `--pbkdf` names).
    pub kind: &'static str,
    /// Target time in ms from the plan; `None`: cryptsetup's default.
    pub iter_time_ms: Option<u32>,
    /// argon2 memory cost in KiB from the plan; `None`: cryptsetup's default.
    pub memory_kib: Option<u32>,
    /// argon2 threads from the plan; `None`: cryptsetup's default.
    pub parallel: Option<u32>,
    /// pbkdf2 only: the hash (the device's for LUKS1, sha256 for LUKS2), filled in by the
    /// driver from the header; empty for argon2.
    pub hash: String,
    /// pbkdf2 only: the keyslot key size in bits (the volume key's), filled in by the driver;
    /// `None` for argon2 (its cost does not depend on the output size) or when unknown.
    pub key_bits: Option<u32>,
}

/// PBKDF parameters measured by a benchmark, passed to every `luksAddKey` of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Measured {
    /// Iterations (pbkdf2) or time cost (argon2).
    pub iterations: u32,
    /// argon2: memory cost in KiB and threads; `None` for pbkdf2.
    pub argon2: Option<(u32, u32)>,
}

/// The benchmark a new keyslot on a `version` device with plan `settings` needs, or `None`
/// when the plan forces iterations (nothing to measure: today's explicit arguments are used).
/// Mirrors [`super::pbkdf_args`]: no settings means cryptsetup's default PBKDF (pbkdf2 for
/// LUKS1, argon2id for LUKS2, `cryptsetup --help`); argon2 settings on LUKS1 are ignored
/// (pbkdf2 with cryptsetup's defaults). `hash` and `key_bits` are left for the driver.
pub(crate) fn request(version: LuksVersion, settings: Option<&PbkdfSettings>) -> Option<Request> {
    let blank = |kind| Request {
        kind,
        iter_time_ms: None,
        memory_kib: None,
        parallel: None,
        hash: String::new(),
        key_bits: None,
    };
    let Some(s) = settings else {
        return Some(blank(match version {
            LuksVersion::Luks1 => "pbkdf2",
            LuksVersion::Luks2 => "argon2id",
        }));
    };
    let kind = match (s.kind, version) {
        (PbkdfType::Pbkdf2, _) => "pbkdf2",
        (_, LuksVersion::Luks1) => return Some(blank("pbkdf2")),
        (PbkdfType::Argon2id, LuksVersion::Luks2) => "argon2id",
        (PbkdfType::Argon2i, LuksVersion::Luks2) => "argon2i",
    };
    if s.iterations.is_some() {
        return None;
    }
    let argon2 = kind != "pbkdf2";
    Some(Request {
        kind,
        iter_time_ms: s.iter_time_ms,
        memory_kib: s.memory_kib.filter(|_| argon2),
        parallel: s.parallel.filter(|_| argon2),
        hash: String::new(),
        key_bits: None,
    })
}

/// `cryptsetup benchmark` arguments for `req`: `benchmark --pbkdf TYPE [--iter-time MS]`, then
/// for argon2 `[--pbkdf-memory KiB] [--pbkdf-parallel N]`, for pbkdf2 `--hash H
/// [--key-size BITS]`.
pub(crate) fn benchmark_args(req: &Request) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec!["benchmark".into(), "--pbkdf".into(), req.kind.into()];
    if let Some(t) = req.iter_time_ms {
        v.extend(["--iter-time".into(), t.to_string().into()]);
    }
    if req.kind == "pbkdf2" {
        v.extend(["--hash".into(), req.hash.clone().into()]);
        if let Some(b) = req.key_bits {
            v.extend(["--key-size".into(), b.to_string().into()]);
        }
    } else {
        if let Some(m) = req.memory_kib {
            v.extend(["--pbkdf-memory".into(), m.to_string().into()]);
        }
        if let Some(p) = req.parallel {
            v.extend(["--pbkdf-parallel".into(), p.to_string().into()]);
        }
    }
    v
}

/// Parses `cryptsetup benchmark` output for `req` (format in the module doc). pbkdf2: the
/// iterations for the target time, `N × T / 1000` with T = `iter_time_ms` or
/// [`DEFAULT_ITER_TIME_MS`], at least [`MIN_PBKDF2_ITERATIONS`] (cryptsetup computes the same
/// from its own benchmark). argon2: the printed time cost, memory and threads as they are.
///
/// Errors: a message saying what was unexpected (no result line, another type, hash or key
/// size than asked for, a count that does not fit 32 bits).
pub(crate) fn parse(req: &Request, stdout: &str) -> Result<Measured, String> {
    let lines: Vec<&str> = stdout
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let [line] = lines.as_slice() else {
        return Err(format!(
            "expected one result line, found {}: {stdout:?}",
            lines.len()
        ));
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    let number = |s: &str| -> Result<u64, String> {
        s.trim_end_matches(',')
            .parse::<u64>()
            .map_err(|_| format!("{s:?} is not a number in {line:?}"))
    };
    let small = |n: u64| u32::try_from(n).map_err(|_| format!("{n} is too large in {line:?}"));
    if req.kind == "pbkdf2" {
        // PBKDF2-sha256 N iterations per second for B-bit key
        let want = format!("PBKDF2-{}", req.hash);
        match words.as_slice() {
            [name, n, "iterations", "per", "second", "for", bits, "key"] if *name == want => {
                let bits_ok = match req.key_bits {
                    Some(b) => *bits == format!("{b}-bit"),
                    None => bits.ends_with("-bit"),
                };
                if !bits_ok {
                    return Err(format!("unexpected key size in {line:?}"));
                }
                let t = u64::from(req.iter_time_ms.unwrap_or(DEFAULT_ITER_TIME_MS));
                let iterations = (number(n)?.saturating_mul(t) / 1000).max(MIN_PBKDF2_ITERATIONS);
                Ok(Measured {
                    iterations: small(iterations)?,
                    argon2: None,
                })
            }
            _ => Err(format!("unexpected pbkdf2 benchmark line {line:?}")),
        }
    } else {
        // argon2id 4 iterations, 65536 memory, 4 parallel threads (CPUs) for 256-bit key
        // (requested 200 ms time)
        match words.as_slice() {
            [name, i, "iterations,", m, "memory,", p, "parallel", "threads", "(CPUs)", "for", _bits, "key", "(requested", _t, "ms", "time)"]
                if *name == req.kind =>
            {
                let iterations = small(number(i)?)?;
                let memory = small(number(m)?)?;
                let parallel = small(number(p)?)?;
                if iterations < MIN_ARGON2_ITERATIONS || memory == 0 || parallel == 0 {
                    return Err(format!("implausible argon2 parameters in {line:?}"));
                }
                Ok(Measured {
                    iterations,
                    argon2: Some((memory, parallel)),
                })
            }
            _ => Err(format!("unexpected {} benchmark line {line:?}", req.kind)),
        }
    }
}

/// `luksAddKey` arguments for measured parameters: `--pbkdf TYPE --pbkdf-force-iterations N`,
/// and for argon2 `--pbkdf-memory KiB --pbkdf-parallel N` (cryptsetup still lowers the threads
/// to the CPUs online, as it would after its own benchmark). No `--hash`: LUKS1 keyslots use
/// the header's hash, LUKS2 pbkdf2 keyslots cryptsetup's default, the ones benchmarked.
pub(crate) fn forced_args(req: &Request, m: &Measured) -> Vec<OsString> {
    let mut v: Vec<OsString> = vec![
        "--pbkdf".into(),
        req.kind.into(),
        "--pbkdf-force-iterations".into(),
        m.iterations.to_string().into(),
    ];
    if let Some((memory, parallel)) = m.argon2 {
        v.extend([
            "--pbkdf-memory".into(),
            memory.to_string().into(),
            "--pbkdf-parallel".into(),
            parallel.to_string().into(),
        ]);
    }
    v
}

/// From a `luksDump` text of a `version` device: the pbkdf2 hash new keyslots get (LUKS1: the
/// header's `Hash spec:`; LUKS2: [`DEFAULT_HASH`]) and the keyslot key size in bits (LUKS1:
/// `MK bits:`; LUKS2: the first keyslot's `Key: N bits`), `None` when not found.
pub(crate) fn hash_and_key_bits(version: LuksVersion, text: &str) -> (String, Option<u32>) {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.trim_start().strip_prefix(name).map(str::trim))
    };
    match version {
        LuksVersion::Luks1 => (
            field("Hash spec:")
                .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_alphanumeric()))
                .unwrap_or(DEFAULT_HASH)
                .to_owned(),
            field("MK bits:").and_then(|b| b.parse().ok()),
        ),
        LuksVersion::Luks2 => (
            DEFAULT_HASH.to_owned(),
            field("Key:")
                .and_then(|b| b.strip_suffix("bits"))
                .and_then(|b| b.trim().parse().ok()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: Vec<OsString>) -> Vec<String> {
        v.into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    fn settings(kind: PbkdfType) -> PbkdfSettings {
        PbkdfSettings {
            kind,
            memory_kib: Some(65536),
            parallel: Some(2),
            iter_time_ms: Some(200),
            iterations: None,
        }
    }

    #[test]
    fn requests() {
        use LuksVersion::*;
        assert_eq!(request(Luks2, None).map(|r| r.kind), Some("argon2id"));
        assert_eq!(request(Luks1, None).map(|r| r.kind), Some("pbkdf2"));
        let mut s = settings(PbkdfType::Argon2i);
        let r = request(Luks2, Some(&s)).expect("benchmark");
        assert_eq!(
            (r.kind, r.iter_time_ms, r.memory_kib, r.parallel),
            ("argon2i", Some(200), Some(65536), Some(2))
        );
        // argon2 settings on LUKS1: cryptsetup's pbkdf2 defaults
        let r = request(Luks1, Some(&s)).expect("benchmark");
        assert_eq!(
            (r.kind, r.iter_time_ms, r.memory_kib),
            ("pbkdf2", None, None)
        );
        s.iterations = Some(4);
        assert_eq!(request(Luks2, Some(&s)), None);
        let p = settings(PbkdfType::Pbkdf2);
        let r = request(Luks2, Some(&p)).expect("benchmark");
        assert_eq!((r.kind, r.memory_kib, r.parallel), ("pbkdf2", None, None));
    }

    #[test]
    fn argon2_output() -> Result<(), String> {
        let mut r = request(LuksVersion::Luks2, Some(&settings(PbkdfType::Argon2id)))
            .ok_or("no request")?;
        assert_eq!(
            strings(benchmark_args(&r)),
            [
                "benchmark",
                "--pbkdf",
                "argon2id",
                "--iter-time",
                "200",
                "--pbkdf-memory",
                "65536",
                "--pbkdf-parallel",
                "2"
            ]
        );
        let out = "# Tests are approximate using memory only (no storage IO).\nargon2id      4 iterations, 65536 memory, 4 parallel threads (CPUs) for 256-bit key (requested 200 ms time)\n";
        let m = parse(&r, out)?;
        assert_eq!(
            m,
            Measured {
                iterations: 4,
                argon2: Some((65536, 4))
            }
        );
        assert_eq!(
            strings(forced_args(&r, &m)),
            [
                "--pbkdf",
                "argon2id",
                "--pbkdf-force-iterations",
                "4",
                "--pbkdf-memory",
                "65536",
                "--pbkdf-parallel",
                "4"
            ]
        );
        for bad in [
            "",
            "argon2i 4 iterations, 65536 memory, 4 parallel threads (CPUs) for 256-bit key (requested 200 ms time)",
            "argon2id N/A",
            "argon2id 4 iterations, 65536 memory, 4 parallel threads for 256-bit key (requested 200 ms time)",
            "argon2id 1 iterations, 65536 memory, 4 parallel threads (CPUs) for 256-bit key (requested 200 ms time)",
        ] {
            assert!(parse(&r, bad).is_err(), "{bad}");
        }
        r.kind = "argon2i";
        assert!(parse(&r, out).is_err());
        Ok(())
    }

    #[test]
    fn pbkdf2_output() -> Result<(), String> {
        let mut r =
            request(LuksVersion::Luks2, Some(&settings(PbkdfType::Pbkdf2))).ok_or("no request")?;
        r.hash = "sha256".into();
        r.key_bits = Some(512);
        assert_eq!(
            strings(benchmark_args(&r)),
            [
                "benchmark",
                "--pbkdf",
                "pbkdf2",
                "--iter-time",
                "200",
                "--hash",
                "sha256",
                "--key-size",
                "512"
            ]
        );
        let out = "# Tests are approximate using memory only (no storage IO).\nPBKDF2-sha256     1530767 iterations per second for 512-bit key\n";
        let m = parse(&r, out)?;
        // 1530767 per second x 200 ms
        assert_eq!(m.iterations, 306_153);
        assert_eq!(
            strings(forced_args(&r, &m)),
            ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "306153"]
        );
        // cryptsetup's minimum
        let slow = "PBKDF2-sha256 2000 iterations per second for 512-bit key";
        assert_eq!(parse(&r, slow)?.iterations, 1000);
        r.iter_time_ms = None;
        assert_eq!(parse(&r, out)?.iterations, 3_061_534);
        for bad in [
            "PBKDF2-(null)        N/A",
            "PBKDF2-sha1 1530767 iterations per second for 512-bit key",
            "PBKDF2-sha256 1530767 iterations per second for 256-bit key",
            "PBKDF2-sha256 99999999999 iterations per second for 512-bit key",
            "PBKDF2-sha256 1530767 iterations per second for 512-bit key\nPBKDF2-sha256 1 iterations per second for 512-bit key",
        ] {
            assert!(parse(&r, bad).is_err(), "{bad}");
        }
        Ok(())
    }

    #[test]
    fn dump_fields() {
        let luks2 = "Keyslots:\n  0: luks2\n\tKey:        512 bits\n\tPriority:   normal\n\tCipher key: 512 bits\n";
        assert_eq!(
            hash_and_key_bits(LuksVersion::Luks2, luks2),
            ("sha256".to_owned(), Some(512))
        );
        let luks1 = "Version:       \t1\nHash spec:     \tsha1\nPayload offset:\t4096\nMK bits:       \t256\n";
        assert_eq!(
            hash_and_key_bits(LuksVersion::Luks1, luks1),
            ("sha1".to_owned(), Some(256))
        );
        assert_eq!(
            hash_and_key_bits(LuksVersion::Luks1, ""),
            ("sha256".to_owned(), None)
        );
    }
}
