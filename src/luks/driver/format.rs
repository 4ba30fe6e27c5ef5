//! Creating a LUKS device: `cryptsetup luksFormat`.

use std::ffi::OsString;
use std::path::Path;

use super::{check_device, failed, pbkdf_args};
use crate::luks::door::refused;
use crate::luks::{Cryptsetup, LuksError, LuksVersion};
use crate::secret::Passphrase;
use crate::spec::PbkdfSettings;

impl Cryptsetup {
    /// Formats the existing file or device `dev` as a new LUKS container with `pass` in keyslot
    /// 0 (cryptsetup-luksFormat(8)); for tests and examples. DESTROYS any data and header on
    /// `dev`. Runs `cryptsetup luksFormat --batch-mode --type luks1|luks2 --key-file=- [--uuid U]
    /// [PBKDF] DEV` with `pass` on stdin; LUKS2 gets a small header (`--luks2-metadata-size 16k
    /// --luks2-keyslots-size 8m`: 12 KiB of JSON, room for 32 keyslots of 512-bit keys), so an
    /// image of [`crate::luks::TEST_IMAGE_BYTES`] (9 MiB, see [`crate::luks::create_image`])
    /// suits both versions. Adds 1 PBKDF run.
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
}
