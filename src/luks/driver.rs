//! [`Cryptsetup`]'s operations: one cryptsetup(8) action each (cryptsetup 2.6 documents every
//! action in its own page, cryptsetup-ACTION(8), referenced below).
//!
//! Exit codes observed with cryptsetup 2.6.1 (`LC_ALL=C`), which the code relies on:
//!
//! | situation | exit |
//! |---|---|
//! | `open --test-passphrase`: wrong passphrase for the keyslot | 2 |
//! | `open --test-passphrase`: named keyslot empty, or out of range | 1 |
//! | `open --test-passphrase` on an unbound keyslot with its passphrase | 0 (!) |
//! | `luksAddKey`: target keyslot occupied / keyslots area full / out of range | 1 |
//! | `luksAddKey`: wrong passphrase for the unlocking keyslot | 2 |
//! | `luksAddKey`: unlocking keyslot empty | 1 |
//! | `luksKillSlot --batch-mode` with stdin `/dev/null`, even the last keyslot | 0 (!) |
//! | `luksKillSlot`: keyslot not active | 1 |
//! | `token import`: id in use without `--token-replace`, keyslot missing, metadata full | 1 |
//! | `token remove`: token not in use | 1 |
//! | `isLuks` and `luksDump`: not LUKS (also an empty file) | 1; missing path or directory: 4 |

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::door::{check_kill, check_slot, refused};
use super::run::{self, Outcome};
use super::{bench, dump, AddTarget, Cryptsetup, Header, LuksError, LuksVersion, PbkdfCounter};
use crate::secret::Passphrase;
use crate::spec::{PbkdfSettings, PbkdfType};

/// Highest keyslot count of any LUKS version (LUKS2: 32); LUKS2 also allows 32 tokens.
const MAX_IDS: u32 = 32;

/// Environment variable naming the cryptsetup program to run (see [`Cryptsetup::new`]).
pub const PROGRAM_ENV: &str = "KEYPLAN_CRYPTSETUP";

/// What [`Cryptsetup::test_any_keyslot`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnyKeyslot {
    /// No keyslot cryptsetup tried opens with the passphrase.
    Fails,
    /// Keyslot N opens (cryptsetup printed `Key slot N unlocked.`).
    Keyslot(u32),
    /// It opens, but cryptsetup did not say which keyslot.
    Unknown,
}

/// The keyslot of the one `Key slot N unlocked.` line of `cryptsetup -v open` output (cryptsetup
/// 2.6.1 prints it on stdout), or `None` when there is no such line, or more than one.
fn unlocked_keyslot(stdout: &str) -> Option<u32> {
    let mut found = stdout.lines().filter_map(|l| {
        l.trim()
            .strip_prefix("Key slot ")?
            .strip_suffix(" unlocked.")
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))?
            .parse::<u32>()
            .ok()
            .filter(|n| *n < MAX_IDS)
    });
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

impl Default for Cryptsetup {
    /// Same as [`Cryptsetup::new`].
    fn default() -> Self {
        Self::new()
    }
}

impl Cryptsetup {
    /// A driver running the program named by the `KEYPLAN_CRYPTSETUP` environment variable when
    /// it is set and not empty, else `cryptsetup` looked up in `PATH`. Starts nothing; a missing
    /// program shows up as [`LuksError::Spawn`] on first use. Fresh PBKDF counter at 0.
    pub fn new() -> Self {
        let program = std::env::var_os(PROGRAM_ENV)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("cryptsetup"));
        Self::with_program(program)
    }

    /// A driver running `program` (a path, or a name looked up in `PATH`) instead of
    /// `cryptsetup`. Fresh PBKDF counter at 0.
    pub fn with_program(program: PathBuf) -> Self {
        Cryptsetup {
            program,
            counter: Arc::new(PbkdfCounter::default()),
            benchmarks: Arc::default(),
        }
    }

    /// The program this driver runs.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// PBKDF runs (key derivations) counted so far by this driver and its clones (a count, not a
    /// time). See each operation for what it adds.
    pub fn pbkdf_runs(&self) -> u64 {
        self.counter.get()
    }

    /// The shared PBKDF counter (the same one clones of this driver add to).
    pub fn counter(&self) -> Arc<PbkdfCounter> {
        Arc::clone(&self.counter)
    }

    /// Reads the LUKS header of `dev` in process, read-only ([`super::ondisk::read`]): no
    /// child process and no PBKDF run, and nothing written, also on a device whose header
    /// copies are damaged or disagree ([`Header::condition`] says so).
    ///
    /// Errors: [`LuksError::Device`] when `dev` does not exist, is not a block device or
    /// regular file, cannot be read, or starts with a LUKS signature but has no usable header;
    /// [`LuksError::NotLuks`] without a LUKS signature; [`LuksError::Parse`] for metadata
    /// keyplan cannot read.
    pub fn dump(&self, dev: &Path) -> Result<Header, LuksError> {
        check_device(dev)?;
        super::ondisk::read(dev)
    }

    /// The header of `dev` as `cryptsetup luksDump` reports it, for the differential test of
    /// [`Cryptsetup::dump`] (tests/engine/luks_ondisk.rs) only: **luksDump rewrites a damaged LUKS2
    /// header copy on a writable device**, so keyplan never runs it on a device it manages.
    ///
    /// A LUKS2 device whose two binary headers agree takes one process: keyplan reads the UUID
    /// and epoch from the binary headers and the rest from `cryptsetup luksDump
    /// --dump-json-metadata DEV` (see `dump_luks2_fast`). Otherwise it runs `cryptsetup luksDump
    /// DEV` (cryptsetup-luksDump(8)), whose `Version:` line gives the version and whose `UUID:`
    /// line gives the UUID. LUKS1 keyslots come from the same text (`Key Slot N: ENABLED`, salt =
    /// the hex of the multi-line `Salt:` field without white space; all enabled LUKS1 keyslots
    /// are bound, priority normal, KDF pbkdf2). LUKS2 keyslots and tokens then come from
    /// `cryptsetup luksDump --dump-json-metadata DEV`: bound = listed by a digest whose
    /// `segments` contains `"0"`, priority from the optional `priority` field (0 ignore,
    /// 1 normal, 2 prefer), salt = `kdf.salt` (base64), KDF = `kdf.type`.
    ///
    /// Errors: [`LuksError::Device`] when `dev` does not exist, is a directory, or cryptsetup
    /// cannot use it (exit 4), or starts with a LUKS signature that cryptsetup cannot read
    /// (a damaged or truncated header); [`LuksError::NotLuks`] when luksDump says it is not a
    /// valid LUKS device (exit 1, the same verdict as `cryptsetup isLuks`);
    /// [`LuksError::Spawn`], [`LuksError::Failed`] for other failures; [`LuksError::Parse`] when
    /// the dump is not understood.
    pub fn dump_by_luksdump(&self, dev: &Path) -> Result<Header, LuksError> {
        check_device(dev)?;
        if let Some(header) = self.dump_luks2_fast(dev)? {
            return Ok(header);
        }
        // luksDump exits like isLuks (cryptsetup-isLuks(8)) when the device is not LUKS: 1 for
        // "not a valid LUKS device", 4 for a device it cannot use. Skipping a separate isLuks
        // saves one process per device per observation.
        let text = self.exec(args(["luksDump"], dev), None, None)?;
        match text.code {
            Some(0) => {}
            Some(1) => {
                return Err(match damaged_luks(dev) {
                    Some(message) => LuksError::Device {
                        path: dev.to_owned(),
                        message,
                    },
                    None => LuksError::NotLuks {
                        path: dev.to_owned(),
                    },
                })
            }
            Some(4) => {
                return Err(LuksError::Device {
                    path: dev.to_owned(),
                    message: format!(
                        "cryptsetup luksDump cannot use it (exit code 4, wrong device or file): {}",
                        text.stderr
                    ),
                })
            }
            _ => return Err(failed("luksDump", dev, &text, None)),
        }
        let parse_error = |operation: &str, message: String| LuksError::Parse {
            operation: operation.to_owned(),
            path: dev.to_owned(),
            message,
        };
        let version = dump::version(&text.stdout).map_err(|m| parse_error("luksDump", m))?;
        let uuid = dump::uuid(&text.stdout).map_err(|m| parse_error("luksDump", m))?;
        match version {
            LuksVersion::Luks1 => {
                let keyslots =
                    dump::luks1_keyslots(&text.stdout).map_err(|m| parse_error("luksDump", m))?;
                Ok(Header {
                    version,
                    uuid,
                    keyslots,
                    tokens: Default::default(),
                    json_area: None,
                    epoch: None,
                    pbkdf2_target: bench::hash_and_key_bits(version, &text.stdout),
                    condition: Default::default(),
                })
            }
            LuksVersion::Luks2 => {
                let json =
                    self.exec(args(["luksDump", "--dump-json-metadata"], dev), None, None)?;
                if !json.success() {
                    return Err(failed(LUKS2_JSON_DUMP, dev, &json, None));
                }
                luks2_header(dev, uuid, dump::epoch(&text.stdout), &json.stdout)
            }
        }
    }

    /// The fast way to read a LUKS2 header: one cryptsetup process instead of two. keyplan
    /// reads the UUID and the epoch (seqid) from the two binary headers itself
    /// ([`dump::luks2_binary_header`]), runs `cryptsetup luksDump --dump-json-metadata DEV`, and
    /// reads the binary headers again. The result is used only when both copies carry the same
    /// UUID and seqid, before and after the dump (cryptsetup increments the seqid on every
    /// metadata write, so an unchanged seqid means the JSON belongs to that header).
    ///
    /// Returns `Ok(None)` whenever that does not hold (LUKS1, not LUKS, copies that differ
    /// such as after a damaged primary header, a concurrent write, or a failing dump): the
    /// caller then reads the header the slow way, which also produces the right error.
    ///
    /// Errors: [`LuksError::Spawn`]; [`LuksError::Parse`] when the JSON is not understood.
    fn dump_luks2_fast(&self, dev: &Path) -> Result<Option<Header>, LuksError> {
        let Some(before) = luks2_ids(dev) else {
            return Ok(None);
        };
        let json = self.exec(args(["luksDump", "--dump-json-metadata"], dev), None, None)?;
        if !json.success() || luks2_ids(dev).as_ref() != Some(&before) {
            return Ok(None);
        }
        let (uuid, seqid) = before;
        luks2_header(dev, uuid, Some(seqid), &json.stdout).map(Some)
    }

    /// Tests whether `pass` opens keyslot `slot` of `dev`, without activating anything
    /// (cryptsetup-open(8), `--test-passphrase`): runs
    /// `cryptsetup open --test-passphrase --key-slot SLOT --key-file=- DEV` with the passphrase
    /// on stdin, read whole (no newline handling). Adds 1 PBKDF run whenever cryptsetup is run
    /// (also when it fails before deriving, e.g. on an empty keyslot).
    ///
    /// Returns `Ok(true)` when it opens (exit 0), `Ok(false)` on a wrong passphrase (exit 2) and
    /// when keyslot `slot` is empty (exit 1, confirmed by a fresh dump). Beware: an UNBOUND
    /// keyslot also gives `Ok(true)`; check [`super::Keyslot::bound`] from [`Self::dump`].
    ///
    /// Errors: [`LuksError::Refused`] for an empty passphrase or `slot` ≥ 32 (or beyond the
    /// device's keyslot count), [`LuksError::Device`]/[`LuksError::NotLuks`] for a bad device,
    /// [`LuksError::Failed`] for any other failure (the header is only read, never changed).
    pub fn test_passphrase(
        &self,
        dev: &Path,
        slot: u32,
        pass: &Passphrase,
    ) -> Result<bool, LuksError> {
        let operation = format!("open --test-passphrase of keyslot {slot}");
        if pass.is_empty() {
            return Err(refused(&operation, dev, "the passphrase is empty"));
        }
        check_slot(&operation, dev, slot, MAX_IDS)?;
        let out = self.open_test(dev, Some(slot), pass)?;
        match out.code {
            Some(0) => Ok(true),
            Some(2) => Ok(false),
            Some(1) => {
                // Exit 1 is also "wrong parameters"; only an empty keyslot counts as "does not
                // open", judged by the header rather than by the message.
                let header = self.dump(dev)?;
                check_slot(&operation, dev, slot, header.version.max_keyslots())?;
                if header.keyslots.contains_key(&slot) {
                    Err(failed(
                        &operation,
                        dev,
                        &out,
                        Some("the header was only read"),
                    ))
                } else {
                    Ok(false)
                }
            }
            _ => Err(failed(
                &operation,
                dev,
                &out,
                Some("the header was only read"),
            )),
        }
    }

    /// Tests whether `pass` opens `dev` through any keyslot cryptsetup tries without being told
    /// which (cryptsetup-open(8), `--test-passphrase` without `--key-slot`): only keyslots
    /// bound to the data segment, and not those with priority `ignore`. Runs
    /// `cryptsetup -v open --test-passphrase --key-file=- DEV` with the passphrase on stdin;
    /// `-v` makes cryptsetup 2.6 print `Key slot N unlocked.` on stdout, which tells which
    /// keyslot opened, so a later `luksAddKey` can name it (`--key-slot N`) and derive once
    /// instead of trying keyslots again. Adds 1 PBKDF run (a lower bound: each keyslot tried
    /// costs one).
    ///
    /// Returns [`AnyKeyslot::Keyslot`] on exit 0 with exactly one such line,
    /// [`AnyKeyslot::Unknown`] on exit 0 without it (or with several), [`AnyKeyslot::Fails`]
    /// when no tried keyslot opens (exit 2, or exit 1 "no usable keyslot", e.g. when the
    /// passphrase belongs to an unbound keyslot).
    ///
    /// Errors: [`LuksError::Refused`] for an empty passphrase; [`LuksError::Device`] for a bad
    /// device; [`LuksError::Failed`] for any other exit (the header is only read).
    pub fn test_any_keyslot(&self, dev: &Path, pass: &Passphrase) -> Result<AnyKeyslot, LuksError> {
        let operation = "open --test-passphrase (any keyslot)";
        if pass.is_empty() {
            return Err(refused(operation, dev, "the passphrase is empty"));
        }
        let out = self.open_test(dev, None, pass)?;
        match out.code {
            Some(0) => Ok(unlocked_keyslot(&out.stdout)
                .map(AnyKeyslot::Keyslot)
                .unwrap_or(AnyKeyslot::Unknown)),
            Some(1 | 2) => Ok(AnyKeyslot::Fails),
            _ => Err(failed(
                operation,
                dev,
                &out,
                Some("the header was only read"),
            )),
        }
    }

    /// Runs `cryptsetup open --test-passphrase [--key-slot SLOT] --key-file=- DEV` with `pass`
    /// on stdin after checking the device, and counts 1 PBKDF run; the caller judges the exit.
    /// Without `slot`, `-v` comes first (see [`Self::test_any_keyslot`]).
    ///
    /// Errors: [`LuksError::Device`] for a bad device; [`LuksError::Spawn`].
    fn open_test(
        &self,
        dev: &Path,
        slot: Option<u32>,
        pass: &Passphrase,
    ) -> Result<Outcome, LuksError> {
        check_device(dev)?;
        // cryptsetup rewrites a damaged LUKS2 header copy when it loads the header of a
        // writable device, also for `open --test-passphrase` (tried with cryptsetup 2.6): a
        // test must not be a write, so a header whose copies disagree is not tested.
        let header = super::ondisk::read(dev)?;
        if header.condition.copies_disagree {
            return Err(refused(
                "open --test-passphrase",
                dev,
                &format!(
                    "{}; testing a passphrase would let cryptsetup rewrite a header copy, so keyplan does not. Repair the header first (`cryptsetup repair DEVICE`; `--repair-headers` cannot, as a passphrase is tested before any write), then run again",
                    header.condition.damage.join("; ")
                ),
            ));
        }
        let mut argv: Vec<OsString> = Vec::new();
        if slot.is_none() {
            argv.push("-v".into());
        }
        argv.extend(["open".into(), "--test-passphrase".into()]);
        if let Some(slot) = slot {
            argv.push("--key-slot".into());
            argv.push(slot.to_string().into());
        }
        argv.push("--key-file=-".into());
        argv.push(dev.as_os_str().to_owned());
        let out = self.exec(argv, Some(pass.expose()), None)?;
        self.counter.add(1);
        Ok(out)
    }

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
    /// test of the in-memory LUKS door (tests/sim) and [`super::LuksDoor`]; the engine always
    /// goes through the guarded [`super::LuksDoor::kill_keyslot`]. Adds 0 PBKDF runs.
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

    /// Stores token `json` in the LUKS2 header of `dev` (cryptsetup-token(8), `import`):
    /// `cryptsetup token import --json-file - --token-id ID [--token-replace] DEV` with the JSON
    /// on stdin. With `token_id` `Some`, that id is written, replacing a token already there
    /// (`--token-replace`); with `None`, the lowest free id of a fresh dump is used. Returns the
    /// id written. Adds 0 PBKDF runs.
    ///
    /// `json` must be an object with a string `type` and a `keyslots` array of decimal strings
    /// naming occupied keyslots (checked here against a fresh dump; cryptsetup checks it too).
    ///
    /// Errors: [`LuksError::Refused`] (nothing run) for a LUKS1 device, malformed JSON, a
    /// keyslot that is not occupied, `token_id` ≥ 32 or no free id; errors of [`Self::dump`];
    /// [`LuksError::Failed`] when cryptsetup fails (exit 1, also when the JSON metadata area is
    /// too small for the token).
    pub fn token_import(
        &self,
        dev: &Path,
        token_id: Option<u32>,
        json: &serde_json::Value,
    ) -> Result<u32, LuksError> {
        let operation = match token_id {
            Some(id) => format!("token import as token {id}"),
            None => "token import".to_owned(),
        };
        let keyslots = token_keyslots(json).map_err(|m| refused(&operation, dev, &m))?;
        if let Some(id) = token_id {
            if id >= MAX_IDS {
                return Err(refused(
                    &operation,
                    dev,
                    &format!("token id {id} is out of range (LUKS2 tokens are 0-31)"),
                ));
            }
        }
        let header = self.dump(dev)?;
        if header.version != LuksVersion::Luks2 {
            return Err(refused(
                &operation,
                dev,
                "the device is LUKS1, which has no tokens",
            ));
        }
        if let Some(missing) = keyslots.iter().find(|k| !header.keyslots.contains_key(k)) {
            return Err(refused(
                &operation,
                dev,
                &format!("the token names keyslot {missing}, which is empty"),
            ));
        }
        let id = match token_id {
            Some(id) => id,
            None => (0..MAX_IDS)
                .find(|i| !header.tokens.contains_key(i))
                .ok_or_else(|| refused(&operation, dev, "all 32 token ids are in use"))?,
        };
        let operation = format!("token import as token {id}");
        let mut argv: Vec<OsString> = [
            "token",
            "import",
            "--json-file",
            "-",
            "--token-id",
            &id.to_string(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        if token_id.is_some() {
            argv.push("--token-replace".into());
        }
        argv.push(dev.as_os_str().to_owned());
        let body =
            serde_json::to_vec(json).map_err(|e| refused(&operation, dev, &e.to_string()))?;
        let out = self.exec(argv, Some(&body), None)?;
        if out.success() {
            Ok(id)
        } else {
            Err(failed(
                &operation,
                dev,
                &out,
                Some(
                    "keyslots were left untouched; a full LUKS2 metadata area also fails this way",
                ),
            ))
        }
    }

    /// Removes token `token_id` from the LUKS2 header of `dev` (cryptsetup-token(8), `remove`):
    /// `cryptsetup token remove --token-id ID DEV`. Adds 0 PBKDF runs.
    ///
    /// Errors: [`LuksError::Refused`] (nothing run) for `token_id` ≥ 32;
    /// [`LuksError::Device`] for a missing path or directory; [`LuksError::Failed`] when
    /// cryptsetup fails (exit 1 when the token is not in use or the device is LUKS1).
    pub fn token_remove(&self, dev: &Path, token_id: u32) -> Result<(), LuksError> {
        let operation = format!("token remove of token {token_id}");
        if token_id >= MAX_IDS {
            return Err(refused(
                &operation,
                dev,
                &format!("token id {token_id} is out of range (LUKS2 tokens are 0-31)"),
            ));
        }
        check_device(dev)?;
        let argv: Vec<OsString> = vec![
            "token".into(),
            "remove".into(),
            "--token-id".into(),
            token_id.to_string().into(),
            dev.as_os_str().to_owned(),
        ];
        let out = self.exec(argv, None, None)?;
        if out.success() {
            Ok(())
        } else {
            Err(failed(
                &operation,
                dev,
                &out,
                Some("keyslots and other tokens were left untouched"),
            ))
        }
    }

    /// Formats the existing file or device `dev` as a new LUKS container with `pass` in keyslot
    /// 0 (cryptsetup-luksFormat(8)); for tests and examples. DESTROYS any data and header on
    /// `dev`. Runs `cryptsetup luksFormat --batch-mode --type luks1|luks2 --key-file=- [--uuid U]
    /// [PBKDF] DEV` with `pass` on stdin; LUKS2 gets a small header (`--luks2-metadata-size 16k
    /// --luks2-keyslots-size 8m`: 12 KiB of JSON, room for 32 keyslots of 512-bit keys), so an
    /// image of [`super::TEST_IMAGE_BYTES`] (9 MiB, see [`super::create_image`]) suits both
    /// versions. Adds 1 PBKDF run.
    ///
    /// Errors: [`LuksError::Refused`] for an empty passphrase; [`LuksError::Device`] when `dev`
    /// is missing or a directory; [`LuksError::Failed`] when cryptsetup fails (e.g. exit 1 for a
    /// malformed `uuid`).
    pub fn format(
        &self,
        dev: &Path,
        version: LuksVersion,
        pass: &Passphrase,
        pbkdf: Option<&PbkdfSettings>,
        uuid: Option<&str>,
    ) -> Result<(), LuksError> {
        let operation = "luksFormat (keyslot 0)";
        if pass.is_empty() {
            return Err(refused(operation, dev, "the passphrase is empty"));
        }
        check_device(dev)?;
        let mut argv: Vec<OsString> = vec![
            "luksFormat".into(),
            "--batch-mode".into(),
            "--type".into(),
            match version {
                LuksVersion::Luks1 => "luks1".into(),
                LuksVersion::Luks2 => "luks2".into(),
            },
            "--key-file=-".into(),
        ];
        if version == LuksVersion::Luks2 {
            argv.extend([
                "--luks2-metadata-size".into(),
                "16k".into(),
                "--luks2-keyslots-size".into(),
                "8m".into(),
            ]);
        }
        if let Some(u) = uuid {
            argv.extend(["--uuid".into(), u.into()]);
        }
        argv.extend(pbkdf_args(version, pbkdf));
        argv.push(dev.as_os_str().to_owned());
        let out = self.exec(argv, Some(pass.expose()), None)?;
        self.counter.add(1);
        if out.success() {
            Ok(())
        } else {
            Err(failed(operation, dev, &out, None))
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

    /// Runs cryptsetup with `argv`; only start failures are errors.
    fn exec(
        &self,
        argv: Vec<OsString>,
        stdin: Option<&[u8]>,
        fd3: Option<&[u8]>,
    ) -> Result<Outcome, LuksError> {
        run::run(&self.program, &argv, stdin, fd3).map_err(|source| LuksError::Spawn {
            program: self.program.clone(),
            source,
        })
    }
}

/// cryptsetup arguments for PBKDF `settings` on a device of `version` (cryptsetup(8) options
/// `--pbkdf`, `--pbkdf-force-iterations`, `--iter-time` (milliseconds), `--pbkdf-memory` (KiB),
/// `--pbkdf-parallel` (threads)), as written in the plan. `luksFormat` uses them as they are;
/// `luksAddKey` only when they force iterations, or when the run's one PBKDF benchmark failed
/// (see [`Cryptsetup::add_keyslot`]): without forced iterations cryptsetup benchmarks on each
/// call.
///
/// * `None`: nothing (cryptsetup's defaults, with a benchmark).
/// * pbkdf2: `--pbkdf pbkdf2`, then `--pbkdf-force-iterations N` when `iterations` is set, else
///   `--iter-time MS` when `iter_time_ms` is set. cryptsetup refuses both together, so forced
///   iterations win. `memory_kib`/`parallel` are not passed (meaningless for pbkdf2).
/// * argon2id/argon2i on LUKS2: `--pbkdf TYPE`, `--pbkdf-memory KiB`, `--pbkdf-parallel N`,
///   and `--pbkdf-force-iterations N` (time cost) or else `--iter-time MS`, each when set.
/// * argon2 on LUKS1: nothing (LUKS1 only knows pbkdf2; cryptsetup uses its pbkdf2 default).
pub fn pbkdf_args(version: LuksVersion, settings: Option<&PbkdfSettings>) -> Vec<OsString> {
    let Some(s) = settings else {
        return Vec::new();
    };
    let name = match (s.kind, version) {
        (PbkdfType::Pbkdf2, _) => "pbkdf2",
        (_, LuksVersion::Luks1) => return Vec::new(),
        (PbkdfType::Argon2id, LuksVersion::Luks2) => "argon2id",
        (PbkdfType::Argon2i, LuksVersion::Luks2) => "argon2i",
    };
    let mut out: Vec<OsString> = vec!["--pbkdf".into(), name.into()];
    if s.kind != PbkdfType::Pbkdf2 {
        if let Some(m) = s.memory_kib {
            out.extend(["--pbkdf-memory".into(), m.to_string().into()]);
        }
        if let Some(p) = s.parallel {
            out.extend(["--pbkdf-parallel".into(), p.to_string().into()]);
        }
    }
    if let Some(i) = s.iterations {
        out.extend(["--pbkdf-force-iterations".into(), i.to_string().into()]);
    } else if let Some(t) = s.iter_time_ms {
        out.extend(["--iter-time".into(), t.to_string().into()]);
    }
    out
}

/// The operation name of `cryptsetup luksDump --dump-json-metadata` in errors.
const LUKS2_JSON_DUMP: &str = "luksDump --dump-json-metadata";

/// A LUKS2 [`Header`] from the output of `cryptsetup luksDump --dump-json-metadata`: bound =
/// listed by a digest whose `segments` contains `"0"`, priority from the optional `priority`
/// field (0 ignore, 1 normal, 2 prefer), salt = `kdf.salt` (base64), KDF = `kdf.type`.
///
/// Errors: [`LuksError::Parse`] when the JSON is not understood.
fn luks2_header(
    dev: &Path,
    uuid: String,
    epoch: Option<u64>,
    json: &str,
) -> Result<Header, LuksError> {
    let parse_error = |message: String| LuksError::Parse {
        operation: LUKS2_JSON_DUMP.to_owned(),
        path: dev.to_owned(),
        message,
    };
    let (keyslots, tokens) = dump::luks2_metadata(json).map_err(parse_error)?;
    let json_area = dump::json_area(json).map_err(parse_error)?;
    Ok(Header {
        version: LuksVersion::Luks2,
        uuid,
        keyslots,
        tokens,
        json_area: Some(json_area),
        epoch,
        pbkdf2_target: (bench::DEFAULT_HASH.to_owned(), dump::luks2_key_bits(json)),
        condition: Default::default(),
    })
}

/// `(UUID, seqid)` of the LUKS2 device `dev` when its primary binary header (offset 0) and
/// secondary one (offset `hdr_size`) are both readable and agree on `hdr_size`, seqid and
/// UUID; `None` otherwise (including LUKS1 and anything not LUKS). Reads 2 × 512 bytes.
fn luks2_ids(dev: &Path) -> Option<(String, u64)> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(dev).ok()?;
    let mut buf = [0u8; 512];
    file.read_exact_at(&mut buf, 0).ok()?;
    let primary = dump::luks2_binary_header(&buf).filter(|h| h.primary)?;
    file.read_exact_at(&mut buf, primary.hdr_size).ok()?;
    let secondary = dump::luks2_binary_header(&buf).filter(|h| !h.primary)?;
    (secondary.hdr_size == primary.hdr_size
        && secondary.seqid == primary.seqid
        && secondary.uuid == primary.uuid)
        .then_some((primary.uuid, primary.seqid))
}

/// `words...` followed by the device path.
fn args<const N: usize>(words: [&str; N], dev: &Path) -> Vec<OsString> {
    let mut v: Vec<OsString> = words.into_iter().map(OsString::from).collect();
    v.push(dev.as_os_str().to_owned());
    v
}

/// Checks that `dev` exists and is a block device or a regular file (not a directory, a
/// character device such as `/dev/null`, a FIFO or a socket), so cryptsetup's vaguer exit 4
/// is avoided.
fn check_device(dev: &Path) -> Result<(), LuksError> {
    use std::os::unix::fs::FileTypeExt;
    let message = match std::fs::metadata(dev) {
        Ok(m) if m.is_dir() => {
            "is a directory, not a block device or LUKS image file; nothing was changed".to_owned()
        }
        Ok(m) if m.is_file() || m.file_type().is_block_device() => return Ok(()),
        Ok(m) => {
            let t = m.file_type();
            let kind = if t.is_char_device() {
                "a character device"
            } else if t.is_fifo() {
                "a FIFO"
            } else if t.is_socket() {
                "a socket"
            } else {
                "not a regular file"
            };
            format!(
                "is {kind}, not a block device or LUKS image file (LUKS lives on a block device or in an image file); nothing was changed"
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            "does not exist (no such block device or image file); nothing was changed".to_owned()
        }
        Err(e) => format!("cannot be accessed: {e}; nothing was changed"),
    };
    Err(LuksError::Device {
        path: dev.to_owned(),
        message,
    })
}

/// The LUKS magic at the start of a LUKS1 or LUKS2 header (and the LUKS2 secondary header's).
const LUKS_MAGICS: [&[u8; 6]; 2] = [b"LUKS\xba\xbe", b"SKUL\xba\xbe"];

/// For a device cryptsetup does not take for LUKS: a message when it nevertheless starts with a
/// LUKS signature (a damaged or truncated header, e.g. a partial copy), `None` otherwise (or
/// when it cannot be read: the plain "not LUKS" message fits then).
fn damaged_luks(dev: &Path) -> Option<String> {
    use std::io::Read;
    let mut magic = [0u8; 6];
    let mut f = std::fs::File::open(dev).ok()?;
    f.read_exact(&mut magic).ok()?;
    if !LUKS_MAGICS.iter().any(|m| **m == magic) {
        return None;
    }
    let size = f
        .metadata()
        .ok()
        .filter(|m| m.is_file())
        .map(|m| format!(" (the file is {} bytes)", m.len()))
        .unwrap_or_default();
    Some(format!(
        "starts with a LUKS signature, but cryptsetup cannot read its header: it is damaged or truncated{size}; nothing was changed. Restore the header from a backup (`cryptsetup luksHeaderRestore DEVICE --header-backup-file FILE`) or check that `path` names the whole device"
    ))
}

/// A [`LuksError::Failed`] from a finished child; `note` says what was left untouched.
fn failed(operation: &str, dev: &Path, out: &Outcome, note: Option<&str>) -> LuksError {
    let mut stderr = if out.stderr.is_empty() {
        "(no message)".to_owned()
    } else {
        out.stderr.clone()
    };
    match (out.code, out.signal) {
        (None, Some(9)) => stderr.push_str(
            " (killed by SIGKILL: by the kernel's OOM killer when memory ran out, see `dmesg`, or by an operator; lower settings.memory_budget_kib or settings.pbkdf.memory_kib if memory is short)",
        ),
        (None, Some(n)) => stderr.push_str(&format!(" (killed by signal {n})")),
        (None, None) => stderr.push_str(" (killed by a signal)"),
        _ => {}
    }
    if let Some(n) = note {
        stderr.push_str("; ");
        stderr.push_str(n);
    }
    LuksError::Failed {
        operation: operation.to_owned(),
        path: dev.to_owned(),
        code: out.code.unwrap_or(-1),
        stderr,
    }
}

/// The keyslot numbers of a token JSON object; errors describe what is malformed.
fn token_keyslots(json: &serde_json::Value) -> Result<Vec<u32>, String> {
    let object = json.as_object().ok_or("the token JSON is not an object")?;
    match object.get("type").and_then(serde_json::Value::as_str) {
        Some(t) if !t.is_empty() => {}
        _ => return Err("the token JSON has no non-empty string \"type\"".to_owned()),
    }
    object
        .get("keyslots")
        .and_then(serde_json::Value::as_array)
        .ok_or("the token JSON has no \"keyslots\" array")?
        .iter()
        .map(|v| dump::number_string(v, "token keyslot"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(kind: PbkdfType) -> PbkdfSettings {
        PbkdfSettings {
            kind,
            memory_kib: Some(65536),
            parallel: Some(2),
            iter_time_ms: Some(500),
            iterations: None,
        }
    }

    fn strings(v: Vec<OsString>) -> Vec<String> {
        v.into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn pbkdf_arguments() {
        use LuksVersion::*;
        assert!(pbkdf_args(Luks2, None).is_empty());
        assert_eq!(
            strings(pbkdf_args(Luks2, Some(&settings(PbkdfType::Argon2id)))),
            [
                "--pbkdf",
                "argon2id",
                "--pbkdf-memory",
                "65536",
                "--pbkdf-parallel",
                "2",
                "--iter-time",
                "500"
            ]
        );
        assert!(pbkdf_args(Luks1, Some(&settings(PbkdfType::Argon2i))).is_empty());
        let mut p = settings(PbkdfType::Pbkdf2);
        assert_eq!(
            strings(pbkdf_args(Luks1, Some(&p))),
            ["--pbkdf", "pbkdf2", "--iter-time", "500"]
        );
        p.iterations = Some(1000);
        assert_eq!(
            strings(pbkdf_args(Luks2, Some(&p))),
            ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]
        );
        let mut a = settings(PbkdfType::Argon2i);
        a.iterations = Some(4);
        a.memory_kib = None;
        assert_eq!(
            strings(pbkdf_args(Luks2, Some(&a))),
            [
                "--pbkdf",
                "argon2i",
                "--pbkdf-parallel",
                "2",
                "--pbkdf-force-iterations",
                "4"
            ]
        );
    }

    #[test]
    fn unlocked_keyslot_lines() {
        let out = "No usable token is available.\nKey slot 2 unlocked.\nCommand successful.\n";
        assert_eq!(unlocked_keyslot(out), Some(2));
        for bad in [
            "",
            "Command successful.\n",
            "Key slot unlocked.\n",
            "Key slot 32 unlocked.\n",
            "Key slot +1 unlocked.\n",
            "Key slot 1 unlocked.\nKey slot 2 unlocked.\n",
        ] {
            assert_eq!(unlocked_keyslot(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn token_json_checks() -> Result<(), String> {
        let ok = serde_json::json!({"type": "keyplan", "keyslots": ["1", "3"]});
        assert_eq!(token_keyslots(&ok)?, [1, 3]);
        for bad in [
            serde_json::json!([]),
            serde_json::json!({"keyslots": []}),
            serde_json::json!({"type": "", "keyslots": []}),
            serde_json::json!({"type": "k"}),
            serde_json::json!({"type": "k", "keyslots": [1]}),
        ] {
            assert!(token_keyslots(&bad).is_err(), "{bad}");
        }
        Ok(())
    }
}
