//! Reading a LUKS header: in process, or through `cryptsetup luksDump` (the LUKS2 JSON
//! metadata when cryptsetup can print it).

use std::path::Path;

use super::{args, check_device, failed};
use crate::luks::{bench, dump, Cryptsetup, Header, LuksError, LuksVersion};

impl Cryptsetup {
    /// Reads the LUKS header of `dev` in process, read-only ([`crate::luks::ondisk::read`]): no
    /// child process and no PBKDF run, and nothing written, also on a device whose header
    /// copies are damaged or disagree ([`Header::condition`] says so).
    ///
    /// Errors: [`LuksError::Device`] when `dev` does not exist, is not a block device or
    /// regular file, cannot be read, or starts with a LUKS signature but has no usable header;
    /// [`LuksError::NotLuks`] without a LUKS signature; [`LuksError::Parse`] for metadata
    /// keyplan cannot read.
    pub fn dump(&self, dev: &Path) -> Result<Header, LuksError> {
        check_device(dev)?;
        crate::luks::ondisk::read(dev)
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
