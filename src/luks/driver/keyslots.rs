//! Adding and removing keyslots: `cryptsetup luksAddKey` (with the PBKDF settings this run
//! measured) and `luksKillSlot`.

use std::ffi::OsString;
use std::path::Path;

use super::{args, check_device, failed, pbkdf_args, MAX_IDS};
use crate::luks::door::{check_kill, check_slot, refused};
use crate::luks::run;
use crate::luks::{bench, AddTarget, Cryptsetup, LuksError};
use crate::secret::Passphrase;
use crate::spec::PbkdfSettings;

impl Cryptsetup {
    /// Adds passphrase `new` in keyslot `new_slot` of `dev`, unlocking the volume key with
    /// `unlock` (cryptsetup-luksAddKey(8)): runs `cryptsetup luksAddKey --batch-mode
    /// [--key-slot UNLOCK] --new-key-slot NEW --key-file=- --new-keyfile=/dev/fd/3 [PBKDF] DEV`,
    /// `unlock` on stdin and `new` through a pipe on the child's fd 3. With `unlock_slot` `None`,
    /// `--key-slot` is omitted and cryptsetup tries every keyslot (skipping priority `ignore`).
    ///
    /// `version` is the device's LUKS version as read by [`Self::dump`] (not looked up again);
    /// with `pbkdf` it decides the PBKDF of the new keyslot: LUKS1 ignores argon2 settings,
    /// `pbkdf` `None` means cryptsetup's defaults (pbkdf2 for LUKS1, argon2id for LUKS2). When
    /// `pbkdf` forces `iterations`, the arguments are those of [`pbkdf_args`]. Otherwise (a time
    /// target, or the defaults) the parameters are measured by one `cryptsetup benchmark` per
    /// PBKDF type (pbkdf2: and hash and key size) for this driver and its clones, run by the
    /// first add that needs it (pbkdf2 takes the key size and hash from `target` when it comes
    /// from a [`Header`], else from a `luksDump`), and
    /// passed explicitly (`--pbkdf TYPE --pbkdf-force-iterations N`, argon2 also
    /// `--pbkdf-memory KiB --pbkdf-parallel N`), so cryptsetup does not benchmark on every add.
    /// When the benchmark fails or its output is not understood, a warning is logged and the
    /// arguments of [`pbkdf_args`] are used (cryptsetup benchmarks per add, as before).
    ///
    /// Adds 2 PBKDF runs (unlock + derive) whenever cryptsetup is run, plus 1 for a benchmark
    /// run by this call; without `unlock_slot` the 2 are a lower bound (each keyslot tried
    /// costs one more).
    ///
    /// Errors: [`LuksError::Refused`] (nothing run) when either passphrase is empty or a keyslot
    /// number is beyond `version`'s keyslot count; [`LuksError::Failed`] when cryptsetup fails:
    /// exit 1 for an occupied `new_slot`, an empty unlocking keyslot or a full keyslots area,
    /// exit 2 for a wrong `unlock` passphrase. luksAddKey never modifies existing keyslots.
    #[allow(clippy::too_many_arguments)]
    pub fn add_keyslot(
        &self,
        dev: &Path,
        target: impl Into<AddTarget>,
        unlock_slot: Option<u32>,
        unlock: &Passphrase,
        new_slot: u32,
        new: &Passphrase,
        pbkdf: Option<&PbkdfSettings>,
    ) -> Result<(), LuksError> {
        let target = target.into();
        let version = target.version;
        let operation = match unlock_slot {
            Some(u) => format!("luksAddKey into keyslot {new_slot} unlocking with keyslot {u}"),
            None => format!("luksAddKey into keyslot {new_slot} unlocking with any keyslot"),
        };
        if unlock.is_empty() {
            return Err(refused(
                &operation,
                dev,
                "the unlocking passphrase is empty",
            ));
        }
        if new.is_empty() {
            return Err(refused(&operation, dev, "the new passphrase is empty"));
        }
        let max = version.max_keyslots();
        check_slot(&operation, dev, new_slot, max)?;
        if let Some(u) = unlock_slot {
            check_slot(&operation, dev, u, max)?;
        }
        check_device(dev)?;

        let mut argv: Vec<OsString> = vec!["luksAddKey".into(), "--batch-mode".into()];
        if let Some(u) = unlock_slot {
            argv.extend(["--key-slot".into(), u.to_string().into()]);
        }
        // The unlocking passphrase is read from stdin through the path /dev/fd/0 rather than
        // `-`: cryptsetup 2.6.1 refuses a keyslot with priority `ignore` even when named with
        // --key-slot if the key file is `-` ("No usable keyslot is available"), but not when
        // it is a path. The bytes read are the same (whole input, no newline handling).
        argv.extend([
            "--new-key-slot".into(),
            new_slot.to_string().into(),
            "--key-file=/dev/fd/0".into(),
            format!("--new-keyfile=/dev/fd/{}", run::SECRET_FD).into(),
        ]);
        argv.extend(self.new_keyslot_pbkdf_args(dev, &target, pbkdf));
        argv.push(dev.as_os_str().to_owned());

        let out = self.exec(argv, Some(unlock.expose()), Some(new.expose()))?;
        self.counter.add(2);
        if out.success() {
            Ok(())
        } else {
            Err(failed(
                &operation,
                dev,
                &out,
                Some("existing keyslots were left untouched"),
            ))
        }
    }

    /// Removes keyslot `slot` of `dev` without asking for any passphrase
    /// (cryptsetup-luksKillSlot(8)): `cryptsetup luksKillSlot --batch-mode DEV SLOT` with stdin
    /// `/dev/null`. Adds 0 PBKDF runs.
    ///
    /// cryptsetup itself checks nothing in this mode (2.6.1 kills even the last keyslot), so
    /// the caller must have verified that another bound keyslot opens the device. As a last
    /// guard this function reads the header first and refuses when `slot` is the only occupied
    /// bound keyslot.
    ///
    /// Errors: [`LuksError::Refused`] (nothing run, keyslot left untouched) when `slot` is out of
    /// range, empty, or the only bound keyslot; errors of [`Self::dump`];
    /// [`LuksError::Failed`] when cryptsetup fails.
    pub fn kill_keyslot(&self, dev: &Path, slot: u32) -> Result<(), LuksError> {
        let header = self.dump(dev)?;
        check_kill(dev, slot, &header)?;
        self.kill_keyslot_unchecked(dev, slot)
    }

    /// `cryptsetup luksKillSlot --batch-mode DEV SLOT` with stdin `/dev/null`, **without the
    /// guard** of [`Self::kill_keyslot`]: cryptsetup 2.6.1 then removes any occupied keyslot,
    /// even the last one (exit 0), and fails (exit 1) on an empty one. For the differential
    /// test of the in-memory LUKS door (tests/sim) and [`crate::luks::LuksDoor`]; the engine always
    /// goes through the guarded [`crate::luks::LuksDoor::kill_keyslot`]. Adds 0 PBKDF runs.
    ///
    /// Errors: [`LuksError::Refused`] for `slot` ≥ 32; [`LuksError::Device`] for a bad device;
    /// [`LuksError::Failed`] when cryptsetup fails.
    pub fn kill_keyslot_unchecked(&self, dev: &Path, slot: u32) -> Result<(), LuksError> {
        let operation = format!("luksKillSlot of keyslot {slot}");
        check_slot(&operation, dev, slot, MAX_IDS)?;
        check_device(dev)?;
        let mut argv = args(["luksKillSlot", "--batch-mode"], dev);
        argv.push(slot.to_string().into());
        let out = self.exec(argv, None, None)?;
        if out.success() {
            Ok(())
        } else {
            Err(failed(
                &operation,
                dev,
                &out,
                Some("other keyslots were left untouched"),
            ))
        }
    }

    /// PBKDF arguments for a new keyslot of `dev` (see [`Self::add_keyslot`]): measured ones
    /// from this run's benchmark (run now when it is the first), or [`pbkdf_args`] when the
    /// plan forces iterations or the benchmark failed.
    fn new_keyslot_pbkdf_args(
        &self,
        dev: &Path,
        target: &AddTarget,
        settings: Option<&PbkdfSettings>,
    ) -> Vec<OsString> {
        let version = target.version;
        let Some(mut req) = bench::request(version, settings) else {
            return pbkdf_args(version, settings);
        };
        if req.kind == "pbkdf2" {
            // PBKDF2's cost per iteration grows with the output (the keyslot key) size, and
            // LUKS1 keyslots use the header's hash: benchmark exactly what the add derives,
            // as the caller's header says, or else as a `luksDump` says.
            let (hash, bits) = match &target.pbkdf2 {
                Some(known) => known.clone(),
                None => match self.exec(args(["luksDump"], dev), None, None) {
                    Ok(out) if out.success() => bench::hash_and_key_bits(version, &out.stdout),
                    _ => (bench::DEFAULT_HASH.to_owned(), None),
                },
            };
            req.hash = hash;
            req.key_bits = bits;
        }
        // Held while benchmarking: concurrent adds wait for the one benchmark of the run.
        let measured = match self.benchmarks.lock() {
            Ok(mut cache) => match cache.get(&req) {
                Some(m) => *m,
                None => {
                    let m = self.benchmark(&req);
                    cache.insert(req.clone(), m);
                    m
                }
            },
            Err(_) => None,
        };
        match measured {
            Some(m) => bench::forced_args(&req, &m),
            None => pbkdf_args(version, settings),
        }
    }

    /// Runs `cryptsetup benchmark` for `req` (adds 1 PBKDF run when it ran) and parses it;
    /// `None`, with a warning, when it cannot be run, fails or is not understood.
    fn benchmark(&self, req: &bench::Request) -> Option<bench::Measured> {
        let argv = bench::benchmark_args(req);
        let shown = argv
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let out = match self.exec(argv, None, None) {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!("cryptsetup {shown}: {e}; cryptsetup will benchmark the PBKDF on each luksAddKey instead");
                return None;
            }
        };
        self.counter.add(1);
        if !out.success() {
            tracing::warn!(
                "cryptsetup {shown} failed (exit code {:?}): {}; cryptsetup will benchmark the PBKDF on each luksAddKey instead",
                out.code,
                out.stderr
            );
            return None;
        }
        match bench::parse(req, &out.stdout) {
            Ok(m) => {
                tracing::info!(
                    "PBKDF benchmark (cryptsetup {shown}): {} iterations{}; used for every new keyslot of this run",
                    m.iterations,
                    m.argon2
                        .map(|(mem, par)| format!(", {mem} KiB, {par} threads"))
                        .unwrap_or_default()
                );
                Some(m)
            }
            Err(e) => {
                tracing::warn!("cannot understand the output of cryptsetup {shown}: {e}; cryptsetup will benchmark the PBKDF on each luksAddKey instead");
                None
            }
        }
    }
}
