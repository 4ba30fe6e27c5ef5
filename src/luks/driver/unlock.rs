//! Testing a passphrase: `cryptsetup open --test-passphrase`, against one keyslot or any.

use std::ffi::OsString;
use std::path::Path;

use super::{check_device, failed, AnyKeyslot, MAX_IDS};
use crate::luks::door::{check_slot, refused};
use crate::luks::run::Outcome;
use crate::luks::{Cryptsetup, LuksError};
use crate::secret::Passphrase;

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

impl Cryptsetup {
    /// Tests whether `pass` opens keyslot `slot` of `dev`, without activating anything
    /// (cryptsetup-open(8), `--test-passphrase`): runs
    /// `cryptsetup open --test-passphrase --key-slot SLOT --key-file=- DEV` with the passphrase
    /// on stdin, read whole (no newline handling). Adds 1 PBKDF run whenever cryptsetup is run
    /// (also when it fails before deriving, e.g. on an empty keyslot).
    ///
    /// Returns `Ok(true)` when it opens (exit 0), `Ok(false)` on a wrong passphrase (exit 2) and
    /// when keyslot `slot` is empty (exit 1, confirmed by a fresh dump). Beware: an UNBOUND
    /// keyslot also gives `Ok(true)`; check [`crate::luks::Keyslot::bound`] from [`Self::dump`].
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
        let header = crate::luks::ondisk::read(dev)?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
