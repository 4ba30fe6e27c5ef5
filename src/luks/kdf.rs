//! Whether a keyslot's PBKDF is the one the plan's `settings.pbkdf` asks for: the comparison
//! behind the re-wrap of a managed keyslot whose KDF is weaker, stronger or other than the plan
//! says (docs/architecture.md, "PBKDF reconciliation").
//!
//! What cryptsetup writes is not always what it was given, and a comparison that ignored that
//! would re-wrap the same keyslot at every run. So a keyslot matches when it is what cryptsetup
//! 2.6 makes of the plan's settings on this host:
//!
//! * **type**: `--pbkdf` as given; argon2 on LUKS1 is pbkdf2 (LUKS1 knows no other,
//!   [`super::driver::pbkdf_args`] passes nothing then).
//! * **forced iterations** (`iterations`): the PBKDF2 iteration count or argon2 time cost, as
//!   given. Without them cryptsetup benchmarks (`iter_time_ms`), so the count is not compared.
//! * **argon2 threads** (`parallel`): at most the CPUs online and at most 4 (cryptsetup's
//!   debug log: "Maximum PBKDF threads is 4 (requested 8)"; `luksAddKey --pbkdf-parallel 8` on
//!   a 2-CPU host writes `cpus: 2`).
//! * **argon2 memory** (`memory_kib`): never more than the plan's (a lowered `memory_kib` is a
//!   re-wrap, so that the smallest machine that must open the device can), and not less than
//!   the plan's capped at half the host's memory, as cryptsetup caps it; except that a
//!   benchmark may lower it to meet the unlock time on a slow host, so a keyslot keyplan added
//!   under these very settings without forced iterations (its record says so: [`pbkdf_id`])
//!   is what the benchmark made of them, and a re-wrap would make the same again.
//! * **the settings themselves**: a keyslot recorded as added under other settings than the
//!   plan's (another `iter_time_ms`, say) is re-wrapped even where its header alone would pass:
//!   the benchmark would make another keyslot now. Its record then names the new settings, so
//!   this happens once.
//!
//! Without `settings.pbkdf` the plan declares nothing about PBKDFs and no keyslot is compared.

use serde::{Deserialize, Serialize};

use super::{Keyslot, LuksVersion};
use crate::spec::{PbkdfSettings, PbkdfType};

/// cryptsetup's most argon2 threads for a LUKS2 keyslot, whatever it is asked for.
const ARGON2_MAX_THREADS: u64 = 4;

/// The short form of `settings.pbkdf` a record keeps of the settings its keyslot was added with:
/// `type` then each field that is set, as `field=value` (`argon2id memory_kib=1048576
/// parallel=2 iter_time_ms=2000`). Equal settings give equal forms.
pub fn pbkdf_id(s: &PbkdfSettings) -> String {
    let kind = match s.kind {
        PbkdfType::Argon2id => "argon2id",
        PbkdfType::Argon2i => "argon2i",
        PbkdfType::Pbkdf2 => "pbkdf2",
    };
    let mut out = kind.to_string();
    for (field, value) in [
        ("memory_kib", s.memory_kib),
        ("parallel", s.parallel),
        ("iter_time_ms", s.iter_time_ms),
        ("iterations", s.iterations),
    ] {
        if let Some(v) = value {
            out.push_str(&format!(" {field}={v}"));
        }
    }
    out
}

/// What of the host cryptsetup's PBKDF parameters depend on: the CPUs online (argon2 threads
/// are capped to them) and the physical memory in KiB (argon2 memory is capped to half of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdfHost {
    /// CPUs online (`/sys/devices/system/cpu/online`, as glibc's `_SC_NPROCESSORS_ONLN` that
    /// cryptsetup uses: all online CPUs, not a container's CPU quota).
    pub cpus: u64,
    /// Physical memory in KiB (`MemTotal` of /proc/meminfo).
    pub memory_kib: u64,
}

impl KdfHost {
    /// This host, or `None` when /sys or /proc cannot be read (then no cap is applied, and a
    /// plan asking for more threads than the host has may show a re-wrap that makes the same
    /// keyslot again: the documented cost of an unreadable /proc).
    pub fn this() -> Option<KdfHost> {
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
        let cpus = online_cpus(&online)?;
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let memory_kib = meminfo.lines().find_map(|l| {
            l.strip_prefix("MemTotal:")?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })?;
        Some(KdfHost { cpus, memory_kib })
    }
}

/// The number of CPUs in a kernel CPU list (`0-3,5,7-8`: 7); `None` when it is not one.
fn online_cpus(list: &str) -> Option<u64> {
    let mut n = 0u64;
    for part in list.trim().split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<u64>().ok()?.checked_sub(a.parse().ok()?)? + 1,
            None => {
                part.parse::<u64>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// A keyslot whose PBKDF is not the plan's: what the plan asks for and what the keyslot has,
/// each in a few words (`argon2id 1 GiB`, `pbkdf2 1000 iterations`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KdfDrift {
    /// The plan's PBKDF for new keyslots on this device.
    pub want: String,
    /// The keyslot's.
    pub was: String,
}

/// `None` when `keyslot` (on a device of LUKS `version`) has the PBKDF the plan's `settings`
/// make on `host` (module doc); else what differs. `made_under` is what its record says it
/// was added with ([`pbkdf_id`]; `None`: unknown). `None` without `settings`, and for a
/// keyslot whose header does not say its KDF (`none`); a parameter the header does not give
/// (`None` in [`Keyslot`]) is not compared.
pub fn kdf_drift(
    settings: Option<&PbkdfSettings>,
    version: LuksVersion,
    host: Option<&KdfHost>,
    keyslot: &Keyslot,
    made_under: Option<&str>,
) -> Option<KdfDrift> {
    let s = settings?;
    if keyslot.kdf == "none" {
        return None;
    }
    let kind = match (s.kind, version) {
        (PbkdfType::Pbkdf2, _) | (_, LuksVersion::Luks1) => "pbkdf2",
        (PbkdfType::Argon2id, LuksVersion::Luks2) => "argon2id",
        (PbkdfType::Argon2i, LuksVersion::Luks2) => "argon2i",
    };
    let argon2 = kind != "pbkdf2";
    // An argon2 plan on LUKS1 asks for pbkdf2 with cryptsetup's defaults: only the type.
    let forced = s
        .iterations
        .filter(|_| argon2 || s.kind == PbkdfType::Pbkdf2);
    // Made by keyplan under these very settings; or under others (a benchmark would make
    // another keyslot now). Only what LUKS2 keyslots can differ in counts for the second.
    let same_settings = made_under == Some(pbkdf_id(s).as_str());
    // (An argon2 plan's settings mean nothing to a LUKS1 keyslot: cryptsetup's pbkdf2.)
    let settings_apply = version == LuksVersion::Luks2 || s.kind == PbkdfType::Pbkdf2;
    let other_settings = made_under.filter(|_| !same_settings && settings_apply);
    let header_differs = keyslot.kdf != kind
        || forced
            .zip(keyslot.iterations)
            .is_some_and(|(i, have)| have != u64::from(i))
        || (argon2 && threads_differ(s, host, keyslot))
        || (argon2 && memory_differs(s, host, keyslot, same_settings));
    let added_otherwise = other_settings.filter(|_| s.iterations.is_none());
    if !header_differs && added_otherwise.is_none() {
        return None;
    }
    let mut was = described(keyslot);
    if let (false, Some(under)) = (header_differs, added_otherwise) {
        was = format!("{was}, added for `{under}`");
    }
    Some(KdfDrift {
        want: wanted(s, kind, host),
        was,
    })
}

/// The argon2 threads cryptsetup writes for `parallel` on `host`: at most its CPUs, at most 4.
fn threads_written(p: u32, host: Option<&KdfHost>) -> u64 {
    let p = u64::from(p).min(ARGON2_MAX_THREADS);
    host.map_or(p, |h| p.min(h.cpus.max(1)))
}

/// Whether an argon2 keyslot's threads are not the plan's `parallel` (as cryptsetup caps it).
fn threads_differ(s: &PbkdfSettings, host: Option<&KdfHost>, keyslot: &Keyslot) -> bool {
    let (Some(p), Some(have)) = (s.parallel, keyslot.parallel) else {
        return false;
    };
    have != threads_written(p, host)
}

/// Whether an argon2 keyslot's memory is not what the plan's `memory_kib` makes (module doc);
/// `same_settings`: keyplan added it under these very settings.
fn memory_differs(
    s: &PbkdfSettings,
    host: Option<&KdfHost>,
    keyslot: &Keyslot,
    same_settings: bool,
) -> bool {
    let (Some(m), Some(have)) = (s.memory_kib, keyslot.memory_kib) else {
        return false;
    };
    let m = u64::from(m);
    if have > m {
        return true;
    }
    let floor = host.map_or(m, |h| m.min(h.memory_kib / 2));
    let benchmark_lowered = s.iterations.is_none() && same_settings;
    have < floor && !benchmark_lowered
}

/// The plan's PBKDF in a few words, as cryptsetup writes it on `host`: `argon2id 1 GiB, 4
/// iterations, 2 threads`, `argon2id 1 GiB, 2000 ms`, `pbkdf2`.
fn wanted(s: &PbkdfSettings, kind: &str, host: Option<&KdfHost>) -> String {
    let mut parts = Vec::new();
    if kind != "pbkdf2" {
        if let Some(m) = s.memory_kib {
            parts.push(kib(u64::from(m)));
        }
    }
    match (s.iterations, s.iter_time_ms) {
        (Some(i), _) => parts.push(format!("{i} iterations")),
        (None, Some(t)) => parts.push(format!("{t} ms")),
        (None, None) => {}
    }
    if kind != "pbkdf2" {
        if let Some(p) = s.parallel {
            parts.push(threads(threads_written(p, host)));
        }
    }
    join(kind, parts)
}

/// A keyslot's PBKDF in a few words, as [`wanted`].
fn described(k: &Keyslot) -> String {
    let mut parts = Vec::new();
    if let Some(m) = k.memory_kib {
        parts.push(kib(m));
    }
    if let Some(i) = k.iterations {
        parts.push(format!("{i} iterations"));
    }
    if let Some(p) = k.parallel {
        parts.push(threads(p));
    }
    join(&k.kdf, parts)
}

/// `1 thread`, `4 threads`.
fn threads(n: u64) -> String {
    format!("{n} thread{}", if n == 1 { "" } else { "s" })
}

/// `kind` and its parameters: `argon2id 1 GiB, 4 iterations`.
fn join(kind: &str, parts: Vec<String>) -> String {
    if parts.is_empty() {
        kind.to_string()
    } else {
        format!("{kind} {}", parts.join(", "))
    }
}

/// KiB as people say it: `1 GiB`, `64 MiB`, `1000 KiB`.
fn kib(k: u64) -> String {
    if k >= 1 << 20 && k.is_multiple_of(1 << 20) {
        format!("{} GiB", k >> 20)
    } else if k >= 1 << 10 && k.is_multiple_of(1 << 10) {
        format!("{} MiB", k >> 10)
    } else {
        format!("{k} KiB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::luks::Priority;

    fn slot(kdf: &str, memory: Option<u64>, iterations: u64, parallel: Option<u64>) -> Keyslot {
        Keyslot {
            bound: true,
            salt: "s".into(),
            priority: Priority::Normal,
            kdf: kdf.into(),
            memory_kib: memory,
            iterations: Some(iterations),
            parallel,
        }
    }

    fn argon(memory: Option<u32>, iterations: Option<u32>, parallel: Option<u32>) -> PbkdfSettings {
        PbkdfSettings {
            kind: PbkdfType::Argon2id,
            memory_kib: memory,
            parallel,
            iter_time_ms: None,
            iterations,
        }
    }

    /// [`kdf_drift`] of a keyslot whose record names no settings.
    fn drift(
        s: Option<&PbkdfSettings>,
        v: LuksVersion,
        host: Option<&KdfHost>,
        k: &Keyslot,
    ) -> Option<KdfDrift> {
        kdf_drift(s, v, host, k, None)
    }

    const HOST: KdfHost = KdfHost {
        cpus: 2,
        memory_kib: 4 << 20,
    };

    #[test]
    fn only_a_declared_pbkdf_is_compared() {
        let k = slot("pbkdf2", None, 1000, None);
        assert_eq!(drift(None, LuksVersion::Luks2, Some(&HOST), &k), None);
    }

    #[test]
    fn a_weaker_kdf_is_a_re_wrap_with_both_named() {
        let k = slot("pbkdf2", None, 1000, None);
        let s = argon(Some(1 << 20), None, None);
        let d = drift(Some(&s), LuksVersion::Luks2, Some(&HOST), &k);
        assert_eq!(
            d,
            Some(KdfDrift {
                want: "argon2id 1 GiB".into(),
                was: "pbkdf2 1000 iterations".into()
            })
        );
        // LUKS1 knows only pbkdf2: an argon2 plan asks nothing else of it.
        assert_eq!(drift(Some(&s), LuksVersion::Luks1, None, &k), None);
    }

    #[test]
    fn forced_iterations_and_threads_compare_as_cryptsetup_writes_them() {
        let s = argon(Some(65536), Some(4), Some(8));
        // 8 threads asked on a 2-CPU host: cryptsetup writes 2.
        let k = slot("argon2id", Some(65536), 4, Some(2));
        assert_eq!(drift(Some(&s), LuksVersion::Luks2, Some(&HOST), &k), None);
        let other_time = slot("argon2id", Some(65536), 5, Some(2));
        assert!(drift(Some(&s), LuksVersion::Luks2, Some(&HOST), &other_time).is_some());
        let pbkdf2 = PbkdfSettings {
            kind: PbkdfType::Pbkdf2,
            memory_kib: None,
            parallel: None,
            iter_time_ms: None,
            iterations: Some(1000),
        };
        let k = slot("pbkdf2", None, 1000, None);
        assert_eq!(drift(Some(&pbkdf2), LuksVersion::Luks1, None, &k), None);
        // An argon2 plan's time cost means nothing to a LUKS1 keyslot's PBKDF2 iterations.
        assert_eq!(drift(Some(&s), LuksVersion::Luks1, None, &k), None);
        let k = slot("pbkdf2", None, 2000, None);
        assert!(drift(Some(&pbkdf2), LuksVersion::Luks1, None, &k).is_some());
    }

    #[test]
    fn memory_above_the_plan_is_a_re_wrap_below_only_where_cryptsetup_would_not_lower_it() {
        let benchmarked = argon(Some(1 << 20), None, None);
        let more = slot("argon2id", Some(2 << 20), 5, Some(2));
        assert!(drift(Some(&benchmarked), LuksVersion::Luks2, Some(&HOST), &more).is_some());
        let less = slot("argon2id", Some(65536), 6, Some(2));
        assert!(drift(Some(&benchmarked), LuksVersion::Luks2, Some(&HOST), &less).is_some());
        // Less memory at the lowest time cost: what the benchmark makes of these settings on a
        // slow host, when keyplan added it under them (its record says so); not otherwise (a
        // weak keyslot from a forced plan is not excused by a time target now).
        let lowered = slot("argon2id", Some(500_000), 4, Some(2));
        assert!(drift(
            Some(&benchmarked),
            LuksVersion::Luks2,
            Some(&HOST),
            &lowered
        )
        .is_some());
        let id = pbkdf_id(&benchmarked);
        assert_eq!(id, "argon2id memory_kib=1048576");
        let by_keyplan = |k: &Keyslot, under: &str| {
            kdf_drift(
                Some(&benchmarked),
                LuksVersion::Luks2,
                Some(&HOST),
                k,
                Some(under),
            )
        };
        assert_eq!(by_keyplan(&lowered, &id), None);
        assert!(by_keyplan(&lowered, "argon2id memory_kib=65536 iterations=4").is_some());
        // Added under other benchmarked settings (another time target): re-wrapped once, even
        // where the header alone would pass.
        let fine = slot("argon2id", Some(1 << 20), 5, Some(2));
        assert_eq!(by_keyplan(&fine, &id), None);
        assert!(by_keyplan(&fine, "argon2id memory_kib=1048576 iter_time_ms=200").is_some());
        // Capped at half the host's memory.
        let small = KdfHost {
            cpus: 2,
            memory_kib: 1 << 20,
        };
        let capped = slot("argon2id", Some(1 << 19), 4, Some(2));
        let forced = argon(Some(1 << 20), Some(4), None);
        assert_eq!(
            drift(Some(&forced), LuksVersion::Luks2, Some(&small), &capped),
            None
        );
        assert!(drift(Some(&forced), LuksVersion::Luks2, Some(&HOST), &capped).is_some());
    }

    #[test]
    fn a_pbkdf2_time_target_applies_to_luks1_too_an_argon2_one_does_not() {
        let k = slot("pbkdf2", None, 1000, None);
        let target = PbkdfSettings {
            kind: PbkdfType::Pbkdf2,
            memory_kib: None,
            parallel: None,
            iter_time_ms: Some(50),
            iterations: None,
        };
        let under = Some("pbkdf2 iterations=1000");
        let d = kdf_drift(Some(&target), LuksVersion::Luks1, None, &k, under);
        assert_eq!(
            d.map(|d| d.was).as_deref(),
            Some("pbkdf2 1000 iterations, added for `pbkdf2 iterations=1000`")
        );
        let argon = argon(Some(65536), None, None);
        assert_eq!(
            kdf_drift(Some(&argon), LuksVersion::Luks1, None, &k, under),
            None
        );
    }

    #[test]
    fn threads_are_capped_at_four_and_the_cpus() {
        let many = KdfHost {
            cpus: 8,
            memory_kib: 4 << 20,
        };
        let s = argon(Some(65536), Some(4), Some(8));
        let k = slot("argon2id", Some(65536), 4, Some(4));
        assert_eq!(drift(Some(&s), LuksVersion::Luks2, Some(&many), &k), None);
        let k2 = slot("argon2id", Some(65536), 4, Some(2));
        let d = drift(Some(&s), LuksVersion::Luks2, Some(&many), &k2).map(|d| d.want);
        assert_eq!(
            d.as_deref(),
            Some("argon2id 64 MiB, 4 iterations, 4 threads")
        );
    }

    #[test]
    fn cpu_lists_are_counted() {
        assert_eq!(online_cpus("0-1\n"), Some(2));
        assert_eq!(online_cpus("0-3,5,7-8"), Some(7));
        assert_eq!(online_cpus("x"), None);
        assert_eq!(online_cpus("3-1"), None);
    }
}
