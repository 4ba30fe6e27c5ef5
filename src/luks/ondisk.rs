//! LUKS headers read in process and read-only (issue 17): the device is opened `O_RDONLY`
//! and never handed to a tool that may repair it, so `plan`, `status`, `verify` and `show`
//! write nothing (invariant I6), and a damaged header copy is reported instead of being
//! silently rewritten by `cryptsetup luksDump`.
//!
//! What is read, after the LUKS2 On-Disk Format Specification (version 1.1.x, Milan Broz,
//! cryptsetup project) and cryptsetup's `lib/luks1/keymanage.c`:
//!
//! - **LUKS2**: two copies of the header, each a 4096-byte binary header (magic
//!   `LUKS\xba\xbe` for the primary at offset 0, `SKUL\xba\xbe` for the secondary, version 2,
//!   `hdr_size`, `seqid`, `checksum_alg`, `uuid`, `hdr_offset`, `csum`) followed by the JSON
//!   area (`hdr_size` − 4096 bytes, NUL-terminated JSON). A copy is valid when its magic,
//!   version, size (a power of two, 16 KiB to 4 MiB) and `hdr_offset` (its own offset) hold,
//!   its checksum (`checksum_alg` over the binary header with `csum` zeroed, then the JSON
//!   area) matches, and its JSON is metadata keyplan can read. The secondary copy sits at the
//!   primary's `hdr_size`; when the primary is unusable, the secondary is looked for at the
//!   offsets the specification lists (16 KiB to 4 MiB). As cryptsetup does, the valid copy
//!   with the highest `seqid` is the header; copies that differ (one damaged, different
//!   `seqid`s or contents) are a [`Condition::damage`] finding.
//! - **LUKS1**: the 592-byte `phdr` (magic, version 1, cipher, hash spec, payload offset, key
//!   bytes, UUID) and its 8 keyslots (state `0x00AC71F3` enabled, `0x0000DEAD` disabled,
//!   iterations, salt, key material offset, stripes), checked as cryptsetup checks them
//!   (`LUKS_check_keyslots`: a known state, 4000 stripes, key material after the header and
//!   before the payload, no two keyslot areas overlapping).
//!
//! The result is the same [`Header`] the cryptsetup dump gave (tests/engine/luks_ondisk.rs compares
//! both over every header the suite makes, the cryptsetup project's images and damaged
//! copies), plus the header's [`Condition`].

use std::collections::BTreeMap;
use std::path::Path;

use sha2::Digest;

use super::{bench, dump, Header, Keyslot, LuksError, LuksVersion, Priority};

/// Size of a LUKS2 binary header, bytes.
const BIN_SIZE: usize = 4096;
/// Offsets at which cryptsetup looks for the secondary LUKS2 header when the primary is
/// unusable (LUKS2 On-Disk Format Specification, "Header area"), bytes.
pub const SECONDARY_OFFSETS: [u64; 9] = [
    0x4000, 0x8000, 0x1_0000, 0x2_0000, 0x4_0000, 0x8_0000, 0x10_0000, 0x20_0000, 0x40_0000,
];
/// LUKS1 `phdr` size, bytes.
const LUKS1_PHDR: usize = 592;
/// LUKS1 keyslot states (cryptsetup `lib/luks1/luks.h`).
const LUKS1_ENABLED: u32 = 0x00AC_71F3;
const LUKS1_DISABLED: u32 = 0x0000_DEAD;
/// LUKS1 anti-forensic stripes of every keyslot cryptsetup makes or accepts.
const LUKS1_STRIPES: u32 = 4000;

/// What keyplan found about a header beyond its contents: damage, and states in which
/// cryptsetup will not change it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Condition {
    /// Damage findings, one line each, with what to do (a damaged or missing copy, copies that
    /// disagree). Empty for a healthy header.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub damage: Vec<String>,
    /// Whether the two LUKS2 copies disagree (one damaged, or different contents): cryptsetup
    /// rewrites one from the other at its next write to the device.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub copies_disagree: bool,
    /// Whether the copies differ exactly as cryptsetup leaves them in the middle of one header
    /// write (`LUKS2_disk_hdr_write` in cryptsetup's `lib/luks2/luks2_disk_metadata.c` writes
    /// the primary copy, then the secondary, each first without its checksum and with the new
    /// seqid, then its JSON area, then the checksum): the primary one seqid ahead of an intact
    /// secondary, or one copy intact and the other carrying an all-zero checksum field and the
    /// seqid of that write. Still damage for a header nobody is writing: `status` reads the
    /// header again and asks the state lock before it calls it a write in progress
    /// (docs/monitoring.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mid_write: bool,
    /// LUKS2 `config.requirements.mandatory`: flags cryptsetup must understand before it
    /// changes the header (an unknown one, or a reencryption in progress, makes every keyslot
    /// write fail with "Unmet LUKS2 requirements detected").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<String>,
    /// A LUKS2 segment of type `reencrypt`, or a keyslot of type `reencrypt`: a reencryption
    /// is in progress.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reencryption: bool,
}

impl Condition {
    /// Why cryptsetup would refuse to add or kill a keyslot of this header, if it would: its
    /// requirements or a reencryption in progress. One sentence, without the device.
    pub fn write_blocker(&self) -> Option<String> {
        if !self.requirements.is_empty() {
            return Some(format!(
                "its LUKS2 header carries the mandatory requirement(s) {} (config.requirements.mandatory), so cryptsetup refuses to change it (\"Unmet LUKS2 requirements detected\")",
                self.requirements
                    .iter()
                    .map(|r| format!("`{r}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if self.reencryption {
            return Some(
                "a LUKS2 reencryption is in progress on it (a `reencrypt` segment or keyslot), so cryptsetup refuses keyslot changes until it finishes (`cryptsetup reencrypt --resume-only`)"
                    .to_string(),
            );
        }
        None
    }
}

/// Reads the LUKS header of `dev` in process, opening it read-only.
///
/// Errors: [`LuksError::Device`] when `dev` cannot be opened or read, or starts with a LUKS
/// signature but no usable header (every copy damaged, truncated, an unknown checksum
/// algorithm); [`LuksError::NotLuks`] when it has no LUKS signature; [`LuksError::Parse`] when
/// a header whose checksum holds has metadata keyplan cannot read.
pub fn read(dev: &Path) -> Result<Header, LuksError> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(dev).map_err(|e| LuksError::Device {
        path: dev.to_owned(),
        message: format!("cannot be opened for reading: {e}"),
    })?;
    let at = |offset: u64, len: usize| -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, offset).ok()?;
        Some(buf)
    };
    parse_with(&at).map_err(|e| {
        let size = file
            .metadata()
            .ok()
            .filter(|m| m.is_file())
            .map(|m| format!(" (the file is {} bytes)", m.len()))
            .unwrap_or_default();
        e.sized(&size).at(dev)
    })
}

/// [`read`] of a device whose bytes are `bytes` (from offset 0): for the fuzz target and
/// tests. Bytes beyond the end read as missing.
///
/// Errors: as [`read`], as an [`Unreadable`].
pub fn parse(bytes: &[u8]) -> Result<Header, Unreadable> {
    let at = |offset: u64, len: usize| -> Option<Vec<u8>> {
        let start = usize::try_from(offset).ok()?;
        bytes
            .get(start..start.checked_add(len)?)
            .map(<[u8]>::to_vec)
    };
    parse_with(&at).map_err(|e| e.sized(""))
}

/// Why a header could not be read (without the device, which [`Unreadable::at`] adds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// No LUKS signature at offset 0.
    NotLuks,
    /// A LUKS signature, but no usable header: what is wrong and what to do.
    Damaged(String),
    /// A header whose checksum holds, with metadata keyplan cannot read.
    Metadata(String),
}

/// Where a message says how big the device file is.
const SIZE: &str = "§SIZE§";

impl Unreadable {
    /// The message with the device file's size (`size`, e.g. ` (the file is 4096 bytes)`, or
    /// empty) in place.
    fn sized(self, size: &str) -> Unreadable {
        match self {
            Unreadable::Damaged(m) => Unreadable::Damaged(m.replace(SIZE, size)),
            other => other,
        }
    }

    /// The [`LuksError`] for device `dev`.
    pub fn at(self, dev: &Path) -> LuksError {
        match self {
            Unreadable::NotLuks => LuksError::NotLuks {
                path: dev.to_owned(),
            },
            Unreadable::Damaged(message) => LuksError::Device {
                path: dev.to_owned(),
                message,
            },
            Unreadable::Metadata(message) => LuksError::Parse {
                operation: "reading the LUKS2 header".to_owned(),
                path: dev.to_owned(),
                message,
            },
        }
    }
}

type At<'a> = &'a dyn Fn(u64, usize) -> Option<Vec<u8>>;

fn parse_with(at: At<'_>) -> Result<Header, Unreadable> {
    let Some(first) = at(0, 8) else {
        return Err(Unreadable::NotLuks);
    };
    let magic = &first[..6];
    let version = u16::from_be_bytes([first[6], first[7]]);
    match (magic, version) {
        (b"LUKS\xba\xbe", 1) => luks1(at),
        (b"LUKS\xba\xbe", 2) => luks2(at),
        (b"LUKS\xba\xbe", v) => Err(Unreadable::Damaged(format!(
            "starts with a LUKS signature but LUKS version {v}, which neither keyplan nor cryptsetup knows; nothing was changed. Check that `path` names the right device"
        ))),
        (b"SKUL\xba\xbe", 2) => luks2(at),
        // No signature at offset 0: a LUKS2 device with a damaged primary when a secondary
        // copy is valid (cryptsetup opens it from there), else not LUKS.
        _ => match luks2(at) {
            Err(Unreadable::Damaged(_)) => Err(Unreadable::NotLuks),
            other => other,
        },
    }
}

/// What to do about a damaged copy, after cryptsetup(8) `repair` and `luksHeaderRestore`.
const REPAIR_HINT: &str = "back the header up first (`cryptsetup luksHeaderBackup DEVICE --header-backup-file FILE`), then let cryptsetup rewrite the damaged copy from the good one (`cryptsetup repair DEVICE`), or restore a known-good backup (`cryptsetup luksHeaderRestore`)";

/// Why [`copy_at`] found no copy: the device is shorter than the copy's binary header.
const DEVICE_ENDS: &str = "the device ends before it";

/// Why [`copy_at`] found no copy: the bytes there are not a LUKS2 header at all.
const NO_SIGNATURE: &str = "no LUKS2 signature";

/// One LUKS2 header copy as found.
struct Copy {
    offset: u64,
    seqid: u64,
    uuid: String,
    json: String,
    /// The binary header and JSON area as stored (to compare copies).
    bytes: Vec<u8>,
}

fn luks2(at: At<'_>) -> Result<Header, Unreadable> {
    let primary = copy_at(at, 0, true);
    let secondary = match &primary {
        Ok(p) => copy_at(at, p.bytes.len() as u64, false),
        Err(_) => any_secondary(at),
    };
    let mut condition = Condition::default();
    let chosen = match (primary, secondary) {
        (Ok(p), Ok(s)) => {
            if p.seqid != s.seqid || p.json != s.json || p.uuid != s.uuid {
                condition.copies_disagree = true;
                condition.mid_write = p.uuid == s.uuid && p.seqid == s.seqid.wrapping_add(1);
                condition.damage.push(format!(
                    "the two LUKS2 header copies disagree (primary seqid {}, secondary seqid {}{}): cryptsetup would rewrite the older from the newer at its next write; {REPAIR_HINT}",
                    p.seqid,
                    s.seqid,
                    if p.seqid == s.seqid { ", different metadata" } else { "" }
                ));
            }
            if s.seqid > p.seqid {
                s
            } else {
                p
            }
        }
        (Ok(p), Err(why)) if why.starts_with("the device ends") => {
            condition.copies_disagree = true;
            condition.damage.push(format!(
                "the device ends before its secondary LUKS2 header (offset {}): it is truncated, and cryptsetup refuses a device this small; nothing was changed. Restore the whole device from a backup, or check that `path` names the whole device",
                p.bytes.len()
            ));
            p
        }
        (Ok(p), Err(why)) => {
            condition.copies_disagree = true;
            // The secondary being written (same seqid as the primary, without its checksum).
            condition.mid_write =
                unsummed_seqid(at, p.bytes.len() as u64, false) == Some(p.seqid);
            condition.damage.push(format!(
                "the secondary LUKS2 header (offset {}) is damaged: {why}; cryptsetup would rewrite it from the primary at its next write; {REPAIR_HINT}",
                p.bytes.len()
            ));
            p
        }
        (Err(why), Ok(s)) => {
            condition.copies_disagree = true;
            // The primary being written: the next seqid (an update), or the secondary's own (a
            // repair rewriting the primary from it).
            condition.mid_write = unsummed_seqid(at, 0, true)
                .is_some_and(|q| q == s.seqid || q == s.seqid.wrapping_add(1));
            condition.damage.push(format!(
                "the primary LUKS2 header (offset 0) is damaged: {why}; the secondary copy (offset {}) is intact and used; cryptsetup would rewrite the primary from it at its next write; {REPAIR_HINT}",
                s.offset
            ));
            s
        }
        (Err(p), Err(s)) => {
            return Err(Unreadable::Damaged(format!(
                "starts with a LUKS signature, but neither LUKS2 header copy is usable (primary: {p}; secondary: {s}): it is damaged or truncated§SIZE§; nothing was changed. Restore the header from a backup (`cryptsetup luksHeaderRestore DEVICE --header-backup-file FILE`) or check that `path` names the whole device"
            )))
        }
    };
    let (keyslots, tokens) = dump::luks2_metadata(&chosen.json).map_err(Unreadable::Metadata)?;
    let json_area = dump::json_area(&chosen.json).map_err(Unreadable::Metadata)?;
    let root: serde_json::Value =
        serde_json::from_str(&chosen.json).map_err(|e| Unreadable::Metadata(e.to_string()))?;
    condition.requirements = root
        .pointer("/config/requirements/mandatory")
        .and_then(serde_json::Value::as_array)
        .map(|a| {
            a.iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let typed = |object: &str, kind: &str| {
        root.get(object)
            .and_then(serde_json::Value::as_object)
            .is_some_and(|m| {
                m.values()
                    .any(|v| v.get("type").and_then(|t| t.as_str()) == Some(kind))
            })
    };
    condition.reencryption = typed("segments", "reencrypt") || typed("keyslots", "reencrypt");
    Ok(Header {
        version: LuksVersion::Luks2,
        uuid: chosen.uuid,
        keyslots,
        tokens,
        json_area: Some(json_area),
        epoch: Some(chosen.seqid),
        pbkdf2_target: (
            bench::DEFAULT_HASH.to_owned(),
            dump::luks2_key_bits(&chosen.json),
        ),
        condition,
    })
}

/// With the primary header unusable: the first valid secondary copy at any offset the LUKS2
/// specification allows (as cryptsetup looks), else what is wrong with the first copy that has
/// the secondary's signature.
fn any_secondary(at: At<'_>) -> Result<Copy, String> {
    // The primary is unusable: look at every offset the specification allows, as
    // cryptsetup does, and take the first valid secondary; else say what is wrong
    // with the first one that has the secondary's signature.
    let mut first_bad: Option<String> = None;
    let mut found = None;
    for offset in SECONDARY_OFFSETS {
        match copy_at(at, offset, false) {
            Ok(c) => {
                found = Some(c);
                break;
            }
            Err(why) if first_bad.is_none() && why != NO_SIGNATURE => {
                first_bad = Some(format!("the copy at offset {offset}: {why}"));
            }
            Err(_) => {}
        }
    }
    found.ok_or_else(|| {
        first_bad.unwrap_or_else(|| {
            "no valid copy at any of the offsets the LUKS2 specification lists".to_string()
        })
    })
}

/// The seqid of the LUKS2 binary header at `offset` (the primary's when `primary`) when it is
/// one cryptsetup is writing: its signature, version and `hdr_offset` are right and its
/// checksum field is all zeros (`hdr_write_disk` writes it so before the JSON area, and the
/// checksum last). `None` for anything else.
fn unsummed_seqid(at: At<'_>, offset: u64, primary: bool) -> Option<u64> {
    let bin = at(offset, BIN_SIZE)?;
    let magic: &[u8] = if primary {
        b"LUKS\xba\xbe"
    } else {
        b"SKUL\xba\xbe"
    };
    let be_u64 = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bin[at..at + 8]);
        u64::from_be_bytes(b)
    };
    let unsummed = &bin[..6] == magic
        && u16::from_be_bytes([bin[6], bin[7]]) == 2
        && be_u64(256) == offset
        && bin[448..512].iter().all(|b| *b == 0);
    unsummed.then(|| be_u64(16))
}

/// The LUKS2 copy at `offset` (the primary when `primary`), or why it is not usable.
fn copy_at(at: At<'_>, offset: u64, primary: bool) -> Result<Copy, String> {
    let bin = at(offset, BIN_SIZE).ok_or(DEVICE_ENDS)?;
    let magic: &[u8] = if primary {
        b"LUKS\xba\xbe"
    } else {
        b"SKUL\xba\xbe"
    };
    if &bin[..6] != magic {
        return Err(NO_SIGNATURE.into());
    }
    if u16::from_be_bytes([bin[6], bin[7]]) != 2 {
        return Err("not LUKS version 2".into());
    }
    let be_u64 = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bin[at..at + 8]);
        u64::from_be_bytes(b)
    };
    let hdr_size = be_u64(8);
    if !hdr_size.is_power_of_two() || !(0x4000..=0x40_0000).contains(&hdr_size) {
        return Err(format!("impossible header size {hdr_size}"));
    }
    let seqid = be_u64(16);
    if be_u64(256) != offset {
        return Err(format!(
            "its hdr_offset field says {} but it is at offset {offset}",
            be_u64(256)
        ));
    }
    let text = |range: std::ops::Range<usize>| -> String {
        let raw = &bin[range];
        let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
        String::from_utf8_lossy(&raw[..end]).into_owned()
    };
    let alg = text(72..104);
    let uuid = text(168..208);
    let area_len = usize::try_from(hdr_size).map_err(|e| e.to_string())? - BIN_SIZE;
    let area =
        at(offset + BIN_SIZE as u64, area_len).ok_or("the device ends inside its JSON area")?;
    let mut zeroed = bin.clone();
    zeroed[448..512].fill(0);
    let sum: Vec<u8> = match alg.as_str() {
        "sha256" => {
            let mut h = sha2::Sha256::new();
            h.update(&zeroed);
            h.update(&area);
            h.finalize().to_vec()
        }
        "sha512" => {
            let mut h = sha2::Sha512::new();
            h.update(&zeroed);
            h.update(&area);
            h.finalize().to_vec()
        }
        "sha384" => {
            let mut h = sha2::Sha384::new();
            h.update(&zeroed);
            h.update(&area);
            h.finalize().to_vec()
        }
        other => {
            return Err(format!(
                "checksum algorithm {other:?}, which keyplan's header reader does not implement (sha256, sha384, sha512)"
            ))
        }
    };
    if bin[448..448 + sum.len()] != sum[..] {
        return Err("checksum mismatch".into());
    }
    let end = area
        .iter()
        .position(|b| *b == 0)
        .ok_or("its JSON area is not NUL-terminated (truncated JSON)")?;
    let json = std::str::from_utf8(&area[..end])
        .map_err(|_| "its JSON area is not UTF-8")?
        .to_owned();
    let value: serde_json::Value = serde_json::from_str(&json)
        .map_err(|e| format!("its JSON metadata does not parse: {e}"))?;
    if !value.is_object() {
        return Err("its JSON metadata is not an object".into());
    }
    dump::luks2_metadata(&json).map_err(|e| format!("its JSON metadata is not valid: {e}"))?;
    let mut bytes = bin;
    bytes.extend_from_slice(&area);
    Ok(Copy {
        offset,
        seqid,
        uuid,
        json,
        bytes,
    })
}

fn luks1(at: At<'_>) -> Result<Header, Unreadable> {
    let damaged = |why: String| {
        Unreadable::Damaged(format!(
            "starts with a LUKS1 signature, but its header is damaged or truncated§SIZE§: {why}; nothing was changed. cryptsetup cannot use it either: restore the header from a backup (`cryptsetup luksHeaderRestore DEVICE --header-backup-file FILE`) or check that `path` names the whole device"
        ))
    };
    let h = at(0, LUKS1_PHDR).ok_or_else(|| damaged("the device ends inside the header".into()))?;
    let be_u32 = |at: usize| u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    let text = |range: std::ops::Range<usize>| -> String {
        let raw = &h[range];
        let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
        String::from_utf8_lossy(&raw[..end]).into_owned()
    };
    let hash = text(72..104);
    let payload = u64::from(be_u32(104));
    let key_bytes = be_u32(108);
    let uuid = text(168..208);
    if !matches!(key_bytes, 1..=512) {
        return Err(damaged(format!(
            "impossible volume key size {key_bytes} bytes"
        )));
    }
    // The area a keyslot's key material takes, in 512-byte sectors (cryptsetup
    // AF_split_sectors: key bytes × stripes, rounded up to whole sectors, then aligned to 8).
    let area = |stripes: u64| -> u64 {
        let sectors = (u64::from(key_bytes) * stripes).div_ceil(512);
        sectors.div_ceil(8) * 8
    };
    let mut keyslots = BTreeMap::new();
    let mut areas: Vec<(u64, u64, u32)> = Vec::new();
    for i in 0..8u32 {
        let base = 208 + 48 * i as usize;
        let state = be_u32(base);
        let iterations = be_u32(base + 4);
        let salt = &h[base + 8..base + 40];
        let offset = u64::from(be_u32(base + 40));
        let stripes = be_u32(base + 44);
        match state {
            LUKS1_DISABLED => {}
            LUKS1_ENABLED => {}
            other => {
                return Err(damaged(format!(
                    "keyslot {i} has the unknown state {other:#010x}"
                )))
            }
        }
        if stripes != LUKS1_STRIPES {
            return Err(damaged(format!(
                "keyslot {i} has {stripes} anti-forensic stripes (cryptsetup uses {LUKS1_STRIPES})"
            )));
        }
        let end = offset + area(u64::from(stripes));
        if offset < (LUKS1_PHDR as u64).div_ceil(512) || (payload != 0 && end > payload) {
            return Err(damaged(format!(
                "keyslot {i}'s key material (sectors {offset}-{end}) is outside the header area"
            )));
        }
        if let Some((_, _, j)) = areas.iter().find(|(s, e, _)| offset < *e && *s < end) {
            return Err(damaged(format!(
                "the key material areas of keyslots {j} and {i} overlap"
            )));
        }
        areas.push((offset, end, i));
        if state == LUKS1_ENABLED {
            keyslots.insert(
                i,
                Keyslot {
                    bound: true,
                    salt: hex_lower(salt),
                    priority: Priority::Normal,
                    kdf: "pbkdf2".to_owned(),
                    memory_kib: None,
                    iterations: Some(u64::from(iterations)),
                    parallel: None,
                },
            );
        }
    }
    Ok(Header {
        version: LuksVersion::Luks1,
        uuid,
        keyslots,
        tokens: BTreeMap::new(),
        json_area: None,
        epoch: None,
        pbkdf2_target: (hash, Some(key_bytes * 8)),
        condition: Condition::default(),
    })
}

/// `bytes` as lower-case hex.
fn hex_lower(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
