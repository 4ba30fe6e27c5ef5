//! Parsing `cryptsetup luksDump` output (cryptsetup(8), "luksDump"), without running anything.
//!
//! * The text dump (both versions) gives the format version (`Version:` line) and the UUID
//!   (`UUID:` line); for LUKS1 it is the only source: `Key Slot N: ENABLED|DISABLED` blocks, each
//!   enabled one with a multi-line `Salt:` field of hex bytes.
//! * LUKS2 keyslots, digests and tokens come from `luksDump --dump-json-metadata` (the JSON
//!   metadata area, see the LUKS2 on-disk format specification): keyslots with `kdf.type`,
//!   `kdf.salt` and an optional `priority` (0 ignore, 1 normal, 2 prefer); a keyslot is bound when
//!   a digest whose `segments` contains `"0"` lists it; tokens with `type` and `keyslots`.

use std::collections::{BTreeMap, BTreeSet};

use super::{Keyslot, LuksVersion, Priority, Token};

/// The format version from a text dump's `Version:` line.
///
/// Errors: no `Version:` line, or a version other than 1 or 2 (message for `LuksError::Parse`).
pub(crate) fn version(text: &str) -> Result<LuksVersion, String> {
    match field(text, "Version:") {
        Some("1") => Ok(LuksVersion::Luks1),
        Some("2") => Ok(LuksVersion::Luks2),
        Some(other) => Err(format!("unsupported LUKS version {other:?}")),
        None => Err("no \"Version:\" line".to_owned()),
    }
}

/// The UUID from a text dump's `UUID:` line, lower-cased.
///
/// Errors: no `UUID:` line (message for `LuksError::Parse`). An empty UUID is returned as "".
pub(crate) fn uuid(text: &str) -> Result<String, String> {
    field(text, "UUID:")
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| "no \"UUID:\" line".to_owned())
}

/// The LUKS2 metadata epoch from a text dump's `Epoch:` line; `None` when there is no such
/// line (LUKS1) or it is not a number.
pub(crate) fn epoch(text: &str) -> Option<u64> {
    field(text, "Epoch:").and_then(|v| v.parse().ok())
}

/// Value of the first unindented line starting with `name`, trimmed.
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|line| line.strip_prefix(name))
        .map(str::trim)
}

/// Occupied keyslots of a LUKS1 text dump. Every enabled LUKS1 keyslot is bound, has priority
/// normal and KDF `pbkdf2` with the iterations of its `Iterations:` line; its salt is the hex of
/// the `Salt:` field without white space, in lower case.
///
/// Errors: a malformed `Key Slot` line, or an enabled keyslot without a hex salt.
pub(crate) fn luks1_keyslots(text: &str) -> Result<BTreeMap<u32, Keyslot>, String> {
    let mut slots = BTreeMap::new();
    let mut current: Option<u32> = None;
    let mut in_salt = false;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Key Slot ") {
            in_salt = false;
            let (number, state) = rest
                .split_once(':')
                .ok_or_else(|| format!("malformed keyslot line {line:?}"))?;
            let number: u32 = number
                .trim()
                .parse()
                .map_err(|_| format!("malformed keyslot number in {line:?}"))?;
            current = match state.trim() {
                "ENABLED" => {
                    slots.insert(
                        number,
                        Keyslot {
                            bound: true,
                            salt: String::new(),
                            priority: Priority::Normal,
                            kdf: "pbkdf2".to_owned(),
                            memory_kib: None,
                            iterations: None,
                            parallel: None,
                        },
                    );
                    Some(number)
                }
                "DISABLED" => None,
                other => return Err(format!("keyslot {number} has unknown state {other:?}")),
            };
            continue;
        }
        let Some(number) = current else { continue };
        let Some(slot) = slots.get_mut(&number) else {
            continue;
        };
        let trimmed = line.trim();
        if let Some(n) = trimmed.strip_prefix("Iterations:") {
            slot.iterations = n.trim().parse().ok();
            in_salt = false;
        } else if let Some(hex) = trimmed.strip_prefix("Salt:") {
            slot.salt.extend(hex.chars().filter(|c| !c.is_whitespace()));
            in_salt = true;
        } else if in_salt && !trimmed.is_empty() && !trimmed.contains(':') {
            slot.salt
                .extend(trimmed.chars().filter(|c| !c.is_whitespace()));
        } else {
            in_salt = false;
        }
    }
    for (number, slot) in slots.iter_mut() {
        if slot.salt.is_empty() || !slot.salt.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!("keyslot {number} has no hex salt"));
        }
        // cryptsetup prints lower case; normalise anyway so salts compare reliably
        slot.salt.make_ascii_lowercase();
    }
    Ok(slots)
}

/// Keyslots and tokens of a LUKS2 JSON metadata dump.
///
/// Errors: invalid JSON, a missing `keyslots`/`digests`/`tokens` object, a keyslot or token id
/// that is not a number, a `priority` other than 0, 1 or 2, a token without string `type` or
/// string-array `keyslots`.
#[allow(clippy::type_complexity)]
pub(crate) fn luks2_metadata(
    json_text: &str,
) -> Result<(BTreeMap<u32, Keyslot>, BTreeMap<u32, Token>), String> {
    let root: serde_json::Value =
        serde_json::from_str(json_text).map_err(|e| format!("invalid JSON: {e}"))?;
    let object = |name: &str| {
        root.get(name)
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| format!("JSON metadata has no {name:?} object"))
    };
    let bound = bound_keyslots(object("digests")?)?;
    let mut keyslots = BTreeMap::new();
    for (id, slot) in object("keyslots")? {
        let number: u32 = id
            .parse()
            .map_err(|_| format!("keyslot id {id:?} is not a number"))?;
        keyslots.insert(number, keyslot(number, slot, bound.contains(&number))?);
    }
    let mut tokens = BTreeMap::new();
    for (id, token) in object("tokens")? {
        let number: u32 = id
            .parse()
            .map_err(|_| format!("token id {id:?} is not a number"))?;
        tokens.insert(number, self::token(number, token)?);
    }
    Ok((keyslots, tokens))
}

/// The keyslots a digest covering data segment 0 lists: the bound ones.
///
/// Errors: such a digest without a `keyslots` array of number strings.
fn bound_keyslots(
    digests: &serde_json::Map<String, serde_json::Value>,
) -> Result<BTreeSet<u32>, String> {
    let mut bound = BTreeSet::new();
    for (id, digest) in digests {
        let covers_segment_0 = digest
            .get("segments")
            .and_then(serde_json::Value::as_array)
            .is_some_and(|s| s.iter().any(|v| v.as_str() == Some("0")));
        if !covers_segment_0 {
            continue;
        }
        let slots = digest
            .get("keyslots")
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| format!("digest {id} has no \"keyslots\" array"))?;
        for slot in slots {
            bound.insert(number_string(slot, &format!("digest {id} keyslot"))?);
        }
    }
    Ok(bound)
}

/// Keyslot `number` from its JSON object: KDF type, salt, argon2 memory (KiB), time cost and
/// threads or pbkdf2 iterations (LUKS2 On-Disk Format Specification, "kdf" object), priority.
///
/// Errors: a `priority` other than 0, 1 or 2.
fn keyslot(number: u32, slot: &serde_json::Value, bound: bool) -> Result<Keyslot, String> {
    let kdf = slot.get("kdf");
    let text = |field: &str, default: &str| {
        kdf.and_then(|k| k.get(field))
            .and_then(serde_json::Value::as_str)
            .unwrap_or(default)
            .to_owned()
    };
    let kdf_number = |field: &str| {
        kdf.and_then(|k| k.get(field))
            .and_then(serde_json::Value::as_u64)
    };
    let priority = match slot.get("priority") {
        None => Priority::Normal,
        Some(p) => match p.as_u64() {
            Some(0) => Priority::Ignore,
            Some(1) => Priority::Normal,
            Some(2) => Priority::Prefer,
            _ => return Err(format!("keyslot {number} has unknown priority {p}")),
        },
    };
    Ok(Keyslot {
        bound,
        memory_kib: kdf_number("memory"),
        iterations: kdf_number("iterations").or_else(|| kdf_number("time")),
        parallel: kdf_number("cpus"),
        salt: text("salt", ""),
        priority,
        kdf: text("type", "none"),
    })
}

/// Token `number` from its JSON object.
///
/// Errors: no string `type`, or no `keyslots` array of number strings.
fn token(number: u32, token: &serde_json::Value) -> Result<Token, String> {
    let token_type = token
        .get("type")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| format!("token {number} has no string \"type\""))?
        .to_owned();
    let keyslots = token
        .get("keyslots")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| format!("token {number} has no \"keyslots\" array"))?
        .iter()
        .map(|v| number_string(v, &format!("token {number} keyslot")))
        .collect::<Result<Vec<u32>, String>>()?;
    Ok(Token {
        id: number,
        token_type,
        keyslots,
        json: token.clone(),
    })
}

/// The key size in bits of the first keyslot of a LUKS2 JSON metadata dump (`key_size`, in
/// bytes, × 8); `None` without keyslots or on unreadable JSON (the caller has parsed it already).
pub(crate) fn luks2_key_bits(json_text: &str) -> Option<u32> {
    let root: serde_json::Value = serde_json::from_str(json_text).ok()?;
    let keyslots = root.get("keyslots")?.as_object()?;
    let (_, first) = keyslots
        .iter()
        .min_by_key(|(id, _)| id.parse::<u32>().unwrap_or(u32::MAX))?;
    let bytes = first.get("key_size")?.as_u64()?;
    u32::try_from(bytes.checked_mul(8)?).ok()
}

/// `(json_size, used)` of a LUKS2 JSON metadata dump: `config.json_size` (the JSON area's
/// size in bytes) and an upper bound of the bytes cryptsetup needs to store this metadata:
/// the compact JSON text, with every `/` counted twice (json-c may escape it as `\/`), plus
/// the terminating NUL.
///
/// Errors: invalid JSON, or no `config.json_size` holding a number (as a string or a number).
pub(crate) fn json_area(json_text: &str) -> Result<(u64, u64), String> {
    let root: serde_json::Value =
        serde_json::from_str(json_text).map_err(|e| format!("invalid JSON: {e}"))?;
    let size = root
        .get("config")
        .and_then(|c| c.get("json_size"))
        .and_then(|v| match v {
            serde_json::Value::String(s) => s.parse::<u64>().ok(),
            other => other.as_u64(),
        })
        .ok_or("JSON metadata has no numeric \"config.json_size\"")?;
    let compact = serde_json::to_string(&root).map_err(|e| e.to_string())?;
    let slashes = compact.bytes().filter(|b| *b == b'/').count();
    let used = u64::try_from(compact.len() + slashes + 1).unwrap_or(u64::MAX);
    Ok((size, used))
}

/// A JSON string holding a decimal number, as LUKS2 metadata writes ids (`"3"`).
pub(crate) fn number_string(value: &serde_json::Value, what: &str) -> Result<u32, String> {
    value
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{what} {value} is not a number in a string"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LUKS1: &str = "LUKS header information for x.img\n\nVersion:       \t1\nCipher name:   \taes\n\
MK salt:       \t5e b3 af a8 5c fe c9 3c de b6 72 f8 4b 1f c9 4d \n               \td9 16 43 d4 10 ce 5d b4 bf c3 48 3b 68 68 4e dd \n\
MK iterations: \t1000\nUUID:          \t4C7A4862-2bf2-42c6-b2b7-c38e303bca82\n\n\
Key Slot 0: ENABLED\n\tIterations:         \t1000\n\tSalt:               \t23 47 72 84 08 e7 97 61 b3 7c 93 aa 1b b4 fa 1a \n\
\t                      \t71 b5 3b 83 58 9d d3 a4 17 9e 6a db 6b 24 14 ef \n\tKey material offset:\t8\n\tAF stripes:            \t4000\n\
Key Slot 1: DISABLED\nKey Slot 2: ENABLED\n\tIterations:         \t1000\n\tSalt:               \tAA bb \n\tKey material offset:\t8\n\
Key Slot 3: DISABLED\n";

    #[test]
    fn luks1_text() -> Result<(), String> {
        assert_eq!(version(LUKS1), Ok(LuksVersion::Luks1));
        assert_eq!(uuid(LUKS1)?, "4c7a4862-2bf2-42c6-b2b7-c38e303bca82");
        let slots = luks1_keyslots(LUKS1)?;
        assert_eq!(slots.keys().copied().collect::<Vec<_>>(), [0, 2]);
        assert_eq!(
            slots[&0].salt,
            "2347728408e79761b37c93aa1bb4fa1a71b53b83589dd3a4179e6adb6b2414ef"
        );
        assert_eq!(slots[&2].salt, "aabb");
        assert!(slots[&0].bound);
        assert_eq!(slots[&0].priority, Priority::Normal);
        assert_eq!(slots[&0].kdf, "pbkdf2");
        assert_eq!(
            (slots[&0].iterations, slots[&2].iterations),
            (Some(1000), Some(1000))
        );
        Ok(())
    }

    #[test]
    fn luks1_bad_input() {
        assert!(luks1_keyslots("Key Slot x: ENABLED\n").is_err());
        assert!(luks1_keyslots("Key Slot 0: ENABLED\n\tIterations: 1\n").is_err());
        assert!(luks1_keyslots("Key Slot 0: WEIRD\n").is_err());
        assert!(version("Version: 3\n").is_err());
        assert!(version("nothing\n").is_err());
        assert!(uuid("Version: 1\n").is_err());
    }

    #[test]
    fn luks2_json() -> Result<(), String> {
        let json = r#"{
          "keyslots": {
            "0": {"type":"luks2","kdf":{"type":"pbkdf2","salt":"AAA="}},
            "1": {"type":"luks2","priority":0,"kdf":{"type":"argon2id","time":4,"memory":32768,"cpus":2,"salt":"BBB="}},
            "2": {"type":"luks2","priority":2,"kdf":{"type":"pbkdf2","salt":"CCC="}},
            "3": {"type":"reencrypt","kdf":{"type":"none"}}
          },
          "tokens": {"4": {"type":"keyplan","keyslots":["0","2"],"key":"k"}},
          "segments": {"0": {}},
          "digests": {
            "0": {"keyslots":["0","1"],"segments":["0"]},
            "1": {"keyslots":["2"],"segments":[]}
          }
        }"#;
        let (slots, tokens) = luks2_metadata(json)?;
        assert!(slots[&0].bound && slots[&1].bound && !slots[&2].bound && !slots[&3].bound);
        assert_eq!(slots[&1].priority, Priority::Ignore);
        assert_eq!(slots[&2].priority, Priority::Prefer);
        assert_eq!(slots[&0].priority, Priority::Normal);
        assert_eq!(slots[&1].kdf, "argon2id");
        assert_eq!(slots[&1].salt, "BBB=");
        assert_eq!(
            (
                slots[&1].memory_kib,
                slots[&1].iterations,
                slots[&1].parallel
            ),
            (Some(32768), Some(4), Some(2))
        );
        assert_eq!(
            (slots[&3].kdf.as_str(), slots[&3].salt.as_str()),
            ("none", "")
        );
        assert_eq!(tokens[&4].keyslots, [0, 2]);
        assert_eq!(tokens[&4].token_type, "keyplan");
        assert_eq!(tokens[&4].json["key"], "k");
        Ok(())
    }

    #[test]
    fn epoch_from_luks2_text_dump() {
        let text = "LUKS header information\nVersion:       \t2\nEpoch:         \t7\nUUID: x\n";
        assert_eq!(epoch(text), Some(7));
        assert_eq!(epoch("LUKS header information for x\nVersion: 1\n"), None);
    }

    #[test]
    fn json_area_counts_compact_text() -> Result<(), String> {
        let json = r#"{ "config": { "json_size": "12288" },
            "keyslots": { "0": { "kdf": { "salt": "a/b" } } } }"#;
        let compact = r#"{"config":{"json_size":"12288"},"keyslots":{"0":{"kdf":{"salt":"a/b"}}}}"#;
        assert_eq!(json_area(json)?, (12288, compact.len() as u64 + 2));
        assert!(json_area(r#"{"config":{}}"#).is_err());
        assert!(json_area("{").is_err());
        Ok(())
    }

    #[test]
    fn luks2_bad_input() {
        assert!(luks2_metadata("{").is_err());
        assert!(luks2_metadata(r#"{"keyslots":{},"tokens":{}}"#).is_err());
        let bad_priority = r#"{"keyslots":{"0":{"priority":7}},"tokens":{},"digests":{}}"#;
        assert!(luks2_metadata(bad_priority).is_err());
        let bad_token =
            r#"{"keyslots":{},"tokens":{"0":{"type":"x","keyslots":[1]}},"digests":{}}"#;
        assert!(luks2_metadata(bad_token).is_err());
    }
}

/// What keyplan reads itself from one LUKS2 binary header (LUKS2 On-Disk Format
/// Specification, section 2.1, `struct luks2_hdr_disk`; all integers big-endian): the
/// magic (`LUKS\xba\xbe` primary, `SKUL\xba\xbe` secondary, bytes 0-5), the version (u16 at
/// 6, must be 2), `hdr_size` (u64 at 8: binary plus JSON area in bytes, 16 KiB to 4 MiB, a
/// power of two), `seqid` (u64 at 16, what `luksDump` prints as `Epoch:`) and `uuid` (40 bytes
/// at 168, NUL-terminated ASCII).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BinaryHeader {
    /// True for the primary header (magic `LUKS\xba\xbe`), false for the secondary.
    pub primary: bool,
    /// Size of one header copy (binary header + JSON area) in bytes.
    pub hdr_size: u64,
    /// Metadata sequence id (`Epoch:`).
    pub seqid: u64,
    /// LUKS UUID as stored.
    pub uuid: String,
}

/// Parses the first 512 bytes of a LUKS2 binary header, or `None` when `bytes` is shorter, has
/// no LUKS2 magic, another version, an impossible `hdr_size`, or a UUID that is empty or not
/// printable ASCII. Checksums are not verified: the caller compares the two copies and lets
/// cryptsetup decide whenever they differ.
pub(crate) fn luks2_binary_header(bytes: &[u8]) -> Option<BinaryHeader> {
    let bytes = bytes.get(..512)?;
    let primary = match &bytes[..6] {
        b"LUKS\xba\xbe" => true,
        b"SKUL\xba\xbe" => false,
        _ => return None,
    };
    let be_u64 = |at: usize| -> Option<u64> {
        Some(u64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
    };
    if u16::from_be_bytes([bytes[6], bytes[7]]) != 2 {
        return None;
    }
    let hdr_size = be_u64(8)?;
    if !hdr_size.is_power_of_two() || !(0x4000..=0x40_0000).contains(&hdr_size) {
        return None;
    }
    let seqid = be_u64(16)?;
    let raw = &bytes[168..208];
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    let uuid = std::str::from_utf8(&raw[..end]).ok()?;
    if uuid.is_empty() || !uuid.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    Some(BinaryHeader {
        primary,
        hdr_size,
        seqid,
        uuid: uuid.to_owned(),
    })
}

#[cfg(test)]
mod binary_tests {
    use super::{luks2_binary_header, luks2_key_bits};

    #[test]
    fn key_bits_of_the_first_keyslot() {
        let json = r#"{"keyslots":{"3":{"key_size":32},"1":{"key_size":64}}}"#;
        assert_eq!(luks2_key_bits(json), Some(512));
        assert_eq!(luks2_key_bits(r#"{"keyslots":{}}"#), None);
        assert_eq!(luks2_key_bits("not json"), None);
    }

    fn header(magic: &[u8; 6], version: u16, size: u64, seqid: u64, uuid: &str) -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        b[..6].copy_from_slice(magic);
        b[6..8].copy_from_slice(&version.to_be_bytes());
        b[8..16].copy_from_slice(&size.to_be_bytes());
        b[16..24].copy_from_slice(&seqid.to_be_bytes());
        b[168..168 + uuid.len()].copy_from_slice(uuid.as_bytes());
        b
    }

    #[test]
    fn reads_the_fields_and_refuses_what_is_not_a_luks2_header() {
        let uuid = "eab820d8-6f8f-48bd-8375-8550a386a3bd";
        let h = luks2_binary_header(&header(b"LUKS\xba\xbe", 2, 16384, 7, uuid));
        let h = h.expect("a valid primary header");
        assert!(h.primary);
        assert_eq!((h.hdr_size, h.seqid, h.uuid.as_str()), (16384, 7, uuid));
        let s = luks2_binary_header(&header(b"SKUL\xba\xbe", 2, 16384, 7, uuid));
        assert_eq!(s.map(|s| s.primary), Some(false));
        // LUKS1, bad sizes, no UUID, garbage, short input.
        assert_eq!(
            luks2_binary_header(&header(b"LUKS\xba\xbe", 1, 16384, 7, uuid)),
            None
        );
        assert_eq!(
            luks2_binary_header(&header(b"LUKS\xba\xbe", 2, 16385, 7, uuid)),
            None
        );
        assert_eq!(
            luks2_binary_header(&header(b"LUKS\xba\xbe", 2, 8 << 20, 7, uuid)),
            None
        );
        assert_eq!(
            luks2_binary_header(&header(b"LUKS\xba\xbe", 2, 16384, 7, "")),
            None
        );
        assert_eq!(
            luks2_binary_header(&header(b"LUKS\xba\xbe", 2, 16384, 7, "a\u{1b}[2J")),
            None
        );
        assert_eq!(luks2_binary_header(&[0u8; 4096]), None);
        assert_eq!(luks2_binary_header(b"LUKS\xba\xbe\x00\x02"), None);
    }
}
