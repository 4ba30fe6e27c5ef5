//! Semantic checks on a parsed plan and resolution into [`super::Plan`] parts. Every problem
//! is collected (not just the first) as an [`Issue`] naming a path in the document; the caller
//! turns paths into spans with the locator.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use super::model::{
    DeviceKeyFile, KmsConfig, PbkdfSettings, PbkdfType, PlanFile, UnmanagedKeyslots,
};
use super::{Device, DeviceKey, Key, PathSeg};

/// Lowest and highest `bytes` of a key.
pub(crate) const BYTES_RANGE: (usize, usize) = (16, 512);
/// Highest LUKS2 keyslot number.
pub(crate) const MAX_KEYSLOT: u32 = 31;
/// Default `bytes`.
pub(crate) const DEFAULT_BYTES: usize = 32;
/// Default `parallelism`.
pub(crate) const DEFAULT_PARALLELISM: usize = 4;
/// Lowest forced PBKDF2 iteration count cryptsetup accepts (2.6: "minimum is 1000").
pub(crate) const PBKDF2_MIN_ITERATIONS: u32 = 1000;
/// Lowest forced Argon2 time cost cryptsetup accepts (2.6: "minimum is 4").
pub(crate) const ARGON2_MIN_ITERATIONS: u32 = 4;
/// Argon2 memory cost limits in KiB that cryptsetup accepts (2.6: 32 KiB to 4 GiB).
pub(crate) const ARGON2_MEMORY_KIB: (u32, u32) = (32, 4 * 1024 * 1024);

/// Units accepted in `rotate_after` (humantime's spellings of s, m, h, d, w).
const DURATION_UNITS: [&str; 21] = [
    "s", "sec", "secs", "second", "seconds", "m", "min", "mins", "minute", "minutes", "h", "hr",
    "hrs", "hour", "hours", "d", "day", "days", "w", "week", "weeks",
];

const DURATION_HELP: &str = "write a number and a unit, e.g. `90d`, `12h` or `2w` (combinations like `1w 3d` work too); units: s (seconds), m (minutes), h (hours), d (days), w (weeks); months and years are not accepted because their length varies: use e.g. `13w` or `365d`";

const ID_CHARS: &str = "ASCII letters, digits, `.`, `_` and `-`";

/// One semantic problem.
#[derive(Debug)]
pub(crate) struct Issue {
    /// Where: a path in the document (the nearest written ancestor is used if it is absent).
    pub path: Vec<PathSeg>,
    /// Stable diagnostic code.
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
    /// Short text under the primary label.
    pub label: String,
    /// What to do.
    pub help: String,
    /// Secondary places, e.g. the first of two duplicates.
    pub also: Vec<(Vec<PathSeg>, String)>,
}

/// The resolved parts of a plan.
pub(crate) struct Resolved {
    pub state_dir: PathBuf,
    pub kms: BTreeMap<String, KmsConfig>,
    pub keys: BTreeMap<String, Key>,
    pub devices: BTreeMap<String, Device>,
    pub pbkdf: Option<PbkdfSettings>,
    pub parallelism: usize,
    pub memory_budget_kib: Option<u64>,
}

fn key(s: &str) -> PathSeg {
    PathSeg::Key(s.to_owned())
}

fn p(segs: &[&str]) -> Vec<PathSeg> {
    segs.iter().map(|s| key(s)).collect()
}

/// KMS instance names, key ids and device ids: non-empty `[A-Za-z0-9._-]+`.
pub(crate) fn is_id(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Key names stored by the file KMS: an id that does not start with `.`.
pub(crate) fn is_safe_file_name(s: &str) -> bool {
    is_id(s) && !s.starts_with('.')
}

/// Parses `rotate_after`: humantime syntax restricted to units s, m, h, d, w; more than zero.
/// Errors carry a message (the help is [`DURATION_HELP`]).
pub(crate) fn parse_rotate_after(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("`rotate_after` is empty".to_owned());
    }
    let chars: Vec<char> = t.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        if i >= chars.len() {
            break;
        }
        let num_start = i;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
        if i == num_start {
            return Err(format!(
                "`rotate_after: {t}` is not a duration (expected a number at `{}`)",
                chars[num_start..].iter().collect::<String>()
            ));
        }
        let number: String = chars[num_start..i].iter().collect();
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        let unit_start = i;
        while i < chars.len() && chars[i].is_alphabetic() {
            i += 1;
        }
        if i == unit_start {
            return Err(if i >= chars.len() {
                format!("`rotate_after: {t}` has no unit after `{number}`")
            } else {
                format!(
                    "`rotate_after: {t}` is not a duration (unexpected `{}`)",
                    chars[i]
                )
            });
        }
        let unit: String = chars[unit_start..i].iter().collect();
        if !DURATION_UNITS.contains(&unit.as_str()) {
            return Err(format!(
                "`rotate_after: {t}` uses the unit `{unit}`, which is not accepted"
            ));
        }
    }
    let d = humantime::parse_duration(t)
        .map_err(|e| format!("`rotate_after: {t}` is not a duration: {e}"))?;
    if d.is_zero() {
        return Err(format!(
            "`rotate_after: {t}` is zero; keys would rotate on every run"
        ));
    }
    Ok(d)
}

/// `path` made absolute against `base` (already absolute), `.` components removed; `..` and
/// symlinks kept as written.
pub(crate) fn resolve(base: &Path, path: &str) -> PathBuf {
    let joined = base.join(path);
    std::path::absolute(&joined).unwrap_or(joined)
}

/// `path` with `.` removed and `..` applied lexically (for comparing paths that do not exist).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(c);
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// What makes two device paths the same device: the canonical path when it exists.
fn identity(abs: &Path) -> PathBuf {
    std::fs::canonicalize(abs).unwrap_or_else(|_| lexical(abs))
}

/// A resolved path as the `String` the KMS model holds.
fn resolve_string(base: &Path, path: &str, at: Vec<PathSeg>, issues: &mut Vec<Issue>) -> String {
    let resolved = resolve(base, path);
    match resolved.to_str() {
        Some(s) => s.to_owned(),
        None => {
            issues.push(Issue {
                path: at,
                code: "keyplan::plan::path",
                message: format!(
                    "`{path}` resolved against the plan's directory is not valid UTF-8: {}",
                    resolved.display()
                ),
                label: "relative to the plan file".to_owned(),
                help: "write an absolute path, or move the plan file to a directory whose path is UTF-8".to_owned(),
                also: Vec::new(),
            });
            path.to_owned()
        }
    }
}

fn empty_issue(path: Vec<PathSeg>, field: &str, help: &str) -> Issue {
    Issue {
        path,
        code: "keyplan::plan::empty",
        message: format!("`{field}` is empty"),
        label: "empty".to_owned(),
        help: help.to_owned(),
        also: Vec::new(),
    }
}

fn list(names: impl Iterator<Item = impl AsRef<str>>) -> String {
    let v: Vec<String> = names.map(|n| format!("`{}`", n.as_ref())).collect();
    v.join(", ")
}

/// Checks `file` and resolves its paths against `base` (absolute). `order` gives the file
/// position of a path (for "first"/"second" among duplicates).
pub(crate) fn validate(
    file: PlanFile,
    base: &Path,
    order: &dyn Fn(&[PathSeg]) -> usize,
) -> Result<Resolved, Vec<Issue>> {
    let mut issues = Vec::new();

    if file.version != 1 {
        issues.push(Issue {
            path: p(&["version"]),
            code: "keyplan::plan::version",
            message: format!("unsupported plan format version {}", file.version),
            label: "only version 1 is supported".to_owned(),
            help: "this keyplan reads plan format version 1".to_owned(),
            also: Vec::new(),
        });
    }

    let state_dir = match &file.state_dir {
        Some(s) if s.trim().is_empty() => {
            issues.push(empty_issue(
                p(&["state_dir"]),
                "state_dir",
                "remove `state_dir` to use `.keyplan` beside the plan file, or name a directory",
            ));
            base.join(".keyplan")
        }
        Some(s) => resolve(base, s),
        None => base.join(".keyplan"),
    };
    if let Ok(m) = std::fs::metadata(&state_dir) {
        if !m.is_dir() {
            let written = file.state_dir.is_some();
            issues.push(Issue {
                path: p(&["state_dir"]),
                code: "keyplan::plan::state_dir",
                message: format!(
                    "the state directory {} exists but is not a directory{}",
                    state_dir.display(),
                    if written { "" } else { " (`state_dir` defaults to `.keyplan` beside the plan file)" }
                ),
                label: "not a directory".to_owned(),
                help: format!(
                    "move the file {} out of the way, or set `state_dir` to a directory (it is created when missing)",
                    state_dir.display()
                ),
                also: Vec::new(),
            });
        }
    }

    // KMS instances.
    let mut kms = BTreeMap::new();
    for (name, cfg) in &file.kms {
        let at = |f: &str| p(&["kms", name, f]);
        if !is_id(name) {
            issues.push(Issue {
                path: p(&["kms", name]),
                code: "keyplan::plan::name",
                message: format!("`{name}` is not a valid KMS instance name"),
                label: "invalid name".to_owned(),
                help: format!("rename it using only {ID_CHARS}"),
                also: Vec::new(),
            });
        }
        let resolved = match cfg {
            KmsConfig::File { path } => {
                if path.trim().is_empty() {
                    issues.push(empty_issue(
                        at("path"),
                        "path",
                        "set `path` to the directory that holds the keys, e.g. `keys`",
                    ));
                    cfg.clone()
                } else {
                    KmsConfig::File {
                        path: resolve_string(base, path, at("path"), &mut issues),
                    }
                }
            }
            KmsConfig::Vault {
                address,
                mount,
                token_env,
                namespace,
                ca_cert,
            } => {
                if address.trim().is_empty() {
                    issues.push(empty_issue(
                        at("address"),
                        "address",
                        "set `address` to the Vault server URL, e.g. `http://127.0.0.1:8200`",
                    ));
                }
                KmsConfig::Vault {
                    address: address.clone(),
                    mount: mount.clone(),
                    token_env: token_env.clone(),
                    namespace: namespace.clone(),
                    ca_cert: ca_cert
                        .as_ref()
                        .map(|c| resolve_string(base, c, at("ca_cert"), &mut issues)),
                }
            }
            KmsConfig::Kubernetes { namespace, .. } => {
                if namespace.trim().is_empty() {
                    issues.push(empty_issue(
                        at("namespace"),
                        "namespace",
                        "set `namespace` to the namespace of the Secrets, e.g. `rook-ceph`",
                    ));
                }
                cfg.clone()
            }
            KmsConfig::Kmip {
                endpoint,
                ca_cert,
                client_cert,
                client_key,
            } => {
                if endpoint.trim().is_empty() {
                    issues.push(empty_issue(
                        at("endpoint"),
                        "endpoint",
                        "set `endpoint` to the KMIP server's `host:port`",
                    ));
                }
                KmsConfig::Kmip {
                    endpoint: endpoint.clone(),
                    ca_cert: resolve_string(base, ca_cert, at("ca_cert"), &mut issues),
                    client_cert: resolve_string(base, client_cert, at("client_cert"), &mut issues),
                    client_key: resolve_string(base, client_key, at("client_key"), &mut issues),
                }
            }
            KmsConfig::Exec { command } => {
                if command.first().is_none_or(|c| c.trim().is_empty()) {
                    issues.push(empty_issue(
                        at("command"),
                        "command",
                        "give the helper program's argv, e.g. `[/usr/local/bin/my-kms-helper]`",
                    ));
                }
                // The program, like every path in the plan, is relative to the plan file when
                // it names a path (`./helper`, `bin/helper`); a bare name is looked up in
                // `PATH` as a shell would. Arguments are passed unchanged (docs/kms/exec.md).
                let mut command = command.clone();
                if let Some(program) = command.first_mut() {
                    if program.contains('/') && !Path::new(program.as_str()).is_absolute() {
                        *program = resolve_string(base, program, at("command"), &mut issues);
                    }
                }
                KmsConfig::Exec { command }
            }
        };
        kms.insert(name.clone(), resolved);
    }

    // Keys.
    let mut keys = BTreeMap::new();
    for (id, k) in &file.keys {
        let at = |f: &str| p(&["keys", id, f]);
        if !is_id(id) {
            issues.push(Issue {
                path: p(&["keys", id]),
                code: "keyplan::plan::name",
                message: format!("`{id}` is not a valid key id"),
                label: "invalid key id".to_owned(),
                help: format!("rename it using only {ID_CHARS}"),
                also: Vec::new(),
            });
        }
        let provider = match file.kms.get(&k.kms) {
            Some(cfg) => Some(cfg.provider()),
            None => {
                let help = if file.kms.is_empty() {
                    format!(
                        "define a KMS instance `{}` under `kms` (e.g. `provider: file`)",
                        k.kms
                    )
                } else {
                    format!(
                        "use one of the defined KMS instances ({}), or define `{}` under `kms`",
                        list(file.kms.keys()),
                        k.kms
                    )
                };
                issues.push(Issue {
                    path: at("kms"),
                    code: "keyplan::plan::undefined_kms",
                    message: format!(
                        "key `{id}` uses KMS `{}`, which is not defined under `kms`",
                        k.kms
                    ),
                    label: "undefined KMS instance".to_owned(),
                    help,
                    also: Vec::new(),
                });
                None
            }
        };
        let name = match &k.name {
            Some(n) if n.trim().is_empty() => {
                issues.push(empty_issue(
                    at("name"),
                    "name",
                    "remove `name` to use the key id, or give the key's name in the KMS",
                ));
                id.clone()
            }
            Some(n) => n.clone(),
            None => id.clone(),
        };
        if provider == Some("file") && !name.is_empty() && !is_safe_file_name(&name) {
            let (path, note) = if k.name.is_some() {
                (at("name"), "")
            } else {
                (
                    p(&["keys", id]),
                    " (the name defaults to the key id; set `name:` to choose another)",
                )
            };
            issues.push(Issue {
                path,
                code: "keyplan::plan::key_name",
                message: format!(
                    "key name `{name}` is not a safe file name for the file KMS `{}`",
                    k.kms
                ),
                label: "not a safe file name".to_owned(),
                help: format!("use only {ID_CHARS}, not starting with `.`{note}"),
                also: Vec::new(),
            });
        }
        let rotate_after = match &k.rotate_after {
            Some(text) => match parse_rotate_after(text) {
                Ok(d) => Some(d),
                Err(message) => {
                    issues.push(Issue {
                        path: at("rotate_after"),
                        code: "keyplan::plan::duration",
                        message: format!("key `{id}`: {message}"),
                        label: "not a valid duration".to_owned(),
                        help: DURATION_HELP.to_owned(),
                        also: Vec::new(),
                    });
                    None
                }
            },
            None => None,
        };
        let bytes = k.bytes.unwrap_or(DEFAULT_BYTES);
        if !(BYTES_RANGE.0..=BYTES_RANGE.1).contains(&bytes) {
            issues.push(Issue {
                path: at("bytes"),
                code: "keyplan::plan::bytes",
                message: format!(
                    "key `{id}`: `bytes` is {bytes}, outside {}..={}",
                    BYTES_RANGE.0, BYTES_RANGE.1
                ),
                label: format!("must be {} to {}", BYTES_RANGE.0, BYTES_RANGE.1),
                help: format!(
                    "set `bytes` between {} and {}, or remove it for the default {DEFAULT_BYTES} (256 bits)",
                    BYTES_RANGE.0, BYTES_RANGE.1
                ),
                also: Vec::new(),
            });
        }
        keys.insert(
            id.clone(),
            Key {
                id: id.clone(),
                kms: k.kms.clone(),
                name,
                rotate_after,
                rotate_after_text: k.rotate_after.clone(),
                bytes,
            },
        );
    }

    // Two keys naming the same entry of the same KMS would rotate (and retire) each other's
    // versions: a lock-out. Reported at the second key in file order.
    let mut key_ids: Vec<&String> = keys.keys().collect();
    key_ids.sort_by_key(|id| order(&p(&["keys", id])));
    // A KMS instance's identity: for the file provider its directory (resolved, so `keys` and
    // `./keys/` or a symlink are one store); otherwise its instance name.
    let kms_identity = |name: &str| -> String {
        match kms.get(name) {
            Some(KmsConfig::File { path }) => {
                format!("file:{}", identity(Path::new(path)).display())
            }
            _ => format!("instance:{name}"),
        }
    };
    let mut by_entry: HashMap<(String, String), &str> = HashMap::new();
    for id in key_ids {
        let Some(k) = keys.get(id) else { continue };
        if let Some(first) = by_entry.insert((kms_identity(&k.kms), k.name.clone()), id) {
            let path = if file.keys.get(id).is_some_and(|f| f.name.is_some()) {
                p(&["keys", id, "name"])
            } else {
                p(&["keys", id])
            };
            issues.push(Issue {
                path,
                code: "keyplan::plan::duplicate_key_name",
                message: format!(
                    "keys `{first}` and `{id}` both use `{}` in KMS `{}` (the same store): rotating one would replace and retire the other's versions",
                    k.name, k.kms
                ),
                label: "same KMS entry as another key".to_owned(),
                help: format!(
                    "give `{id}` its own `name:`, or list key `{first}` on the devices instead"
                ),
                also: vec![(p(&["keys", first]), format!("`{first}` uses it first"))],
            });
        }
    }

    // Devices, in file order (for "first"/"second" among duplicates).
    let mut ids: Vec<&String> = file.devices.keys().collect();
    ids.sort_by_key(|id| order(&p(&["devices", id])));
    let mut devices = BTreeMap::new();
    let mut by_identity: HashMap<PathBuf, &str> = HashMap::new();
    let mut by_uuid: HashMap<String, &str> = HashMap::new();
    for id in ids {
        let Some(d) = file.devices.get(id) else {
            continue;
        };
        let at = |f: &str| p(&["devices", id, f]);
        if !is_id(id) {
            issues.push(Issue {
                path: p(&["devices", id]),
                code: "keyplan::plan::name",
                message: format!("`{id}` is not a valid device id"),
                label: "invalid device id".to_owned(),
                help: format!("rename it using only {ID_CHARS}"),
                also: Vec::new(),
            });
        }

        let path = if d.path.trim().is_empty() {
            issues.push(empty_issue(
                at("path"),
                "path",
                "set `path` to the block device or LUKS image file, e.g. `/dev/disk/by-partuuid/...`",
            ));
            None
        } else {
            Some(resolve(base, &d.path))
        };
        if let Some(abs) = &path {
            let ident = identity(abs);
            if let Some(first) = by_identity.get(&ident) {
                let same = match file.devices.get(*first) {
                    Some(f) if f.path != d.path => format!(
                        " (`{}` and `{}` are the same file: {})",
                        f.path,
                        d.path,
                        ident.display()
                    ),
                    _ => String::new(),
                };
                issues.push(Issue {
                    path: at("path"),
                    code: "keyplan::plan::duplicate_device",
                    message: format!("device `{id}` has the same path as device `{first}`{same}"),
                    label: format!("same device as `{first}`"),
                    help: format!(
                        "list each device once: remove `{id}` or `{first}`, and merge their keys"
                    ),
                    also: vec![(
                        p(&["devices", first, "path"]),
                        format!("device `{first}` is first"),
                    )],
                });
            } else {
                by_identity.insert(ident, id);
            }
        }

        let uuid = match &d.uuid {
            Some(u) if u.trim().is_empty() => {
                issues.push(empty_issue(
                    at("uuid"),
                    "uuid",
                    "remove `uuid`, or give the device's LUKS UUID (`cryptsetup luksUUID DEVICE`)",
                ));
                None
            }
            Some(u) => {
                let norm = u.trim().to_ascii_lowercase();
                if let Some(first) = by_uuid.get(&norm) {
                    issues.push(Issue {
                        path: at("uuid"),
                        code: "keyplan::plan::duplicate_device",
                        message: format!(
                            "device `{id}` has the same LUKS UUID as device `{first}`"
                        ),
                        label: format!("same UUID as `{first}`"),
                        help: format!(
                            "two devices cannot share a LUKS UUID: correct the UUID of `{id}` or `{first}` (`cryptsetup luksUUID DEVICE`), or remove one of them"
                        ),
                        also: vec![(
                            p(&["devices", first, "uuid"]),
                            format!("device `{first}` is first"),
                        )],
                    });
                } else {
                    by_uuid.insert(norm, id);
                }
                Some(u.trim().to_owned())
            }
            None => None,
        };

        let enroll_with = match &d.enroll_with {
            Some(e) if e.trim().is_empty() => {
                issues.push(empty_issue(
                    at("enroll_with"),
                    "enroll_with",
                    "remove `enroll_with`, or name the file holding a passphrase that opens the device today",
                ));
                None
            }
            Some(e) => Some(resolve(base, e)),
            None => None,
        };

        let mut listed: HashMap<&str, usize> = HashMap::new();
        let mut pinned: HashMap<u32, (usize, &str)> = HashMap::new();
        let mut dkeys = Vec::new();
        for (i, entry) in d.keys.iter().enumerate() {
            let entry_path = |rest: &[&str]| {
                let mut v = p(&["devices", id, "keys"]);
                v.push(PathSeg::Index(i));
                v.extend(rest.iter().map(|s| key(s)));
                v
            };
            let (kid, keyslot, kid_path) = match entry {
                DeviceKeyFile::Name(k) => (k.as_str(), None, entry_path(&[])),
                DeviceKeyFile::Pinned(pk) => (pk.key.as_str(), pk.keyslot, entry_path(&["key"])),
            };
            if !file.keys.contains_key(kid) {
                let help = if file.keys.is_empty() {
                    format!("define key `{kid}` under `keys`")
                } else {
                    format!(
                        "use one of the defined keys ({}), or define `{kid}` under `keys`",
                        list(file.keys.keys())
                    )
                };
                issues.push(Issue {
                    path: kid_path.clone(),
                    code: "keyplan::plan::undefined_key",
                    message: format!(
                        "device `{id}` lists key `{kid}`, which is not defined under `keys`"
                    ),
                    label: "undefined key".to_owned(),
                    help,
                    also: Vec::new(),
                });
            }
            if let Some(first) = listed.get(kid) {
                let mut first_path = p(&["devices", id, "keys"]);
                first_path.push(PathSeg::Index(*first));
                issues.push(Issue {
                    path: kid_path.clone(),
                    code: "keyplan::plan::duplicate_key",
                    message: format!(
                        "key `{kid}` is listed twice on device `{id}` (entries {first} and {i})"
                    ),
                    label: "listed again".to_owned(),
                    help: "list each key once per device: remove this entry".to_owned(),
                    also: vec![(first_path, "first listed here".to_owned())],
                });
            } else {
                listed.insert(kid, i);
            }
            if let Some(slot) = keyslot {
                if slot > MAX_KEYSLOT {
                    issues.push(Issue {
                        path: entry_path(&["keyslot"]),
                        code: "keyplan::plan::keyslot",
                        message: format!(
                            "device `{id}`: keyslot {slot} for key `{kid}` is out of range"
                        ),
                        label: format!("LUKS2 keyslots are 0-{MAX_KEYSLOT}"),
                        help: format!(
                            "pin a keyslot from 0 to {MAX_KEYSLOT} (0 to 7 on LUKS1), or remove `keyslot` to let keyplan choose a free one"
                        ),
                        also: Vec::new(),
                    });
                } else if let Some((first, first_key)) = pinned.get(&slot) {
                    issues.push(Issue {
                        path: entry_path(&["keyslot"]),
                        code: "keyplan::plan::keyslot_taken",
                        message: format!(
                            "device `{id}`: keyslot {slot} is pinned for both key `{first_key}` and key `{kid}`"
                        ),
                        label: format!("keyslot {slot} is already pinned"),
                        help: "give each key its own keyslot, or remove `keyslot` from one of them to let keyplan choose".to_owned(),
                        also: vec![(
                            {
                                let mut v = p(&["devices", id, "keys"]);
                                v.push(PathSeg::Index(*first));
                                v.push(key("keyslot"));
                                v
                            },
                            format!("pinned for `{first_key}` here"),
                        )],
                    });
                } else {
                    pinned.insert(slot, (i, kid));
                }
            }
            dkeys.push(DeviceKey {
                key: kid.to_owned(),
                keyslot,
            });
        }

        if d.keys.is_empty() && d.unmanaged_keyslots == UnmanagedKeyslots::Remove {
            issues.push(Issue {
                path: at("unmanaged_keyslots"),
                code: "keyplan::plan::lockout",
                message: format!(
                    "device `{id}` lists no key but says `unmanaged_keyslots: remove`: every keyslot would be removed, which could lock you out (nothing would open the device)"
                ),
                label: "would remove every keyslot".to_owned(),
                help: "list at least one key under `keys` (with `enroll_with` to enroll it), or set `unmanaged_keyslots: keep`".to_owned(),
                also: Vec::new(),
            });
        }

        devices.insert(
            id.clone(),
            Device {
                id: id.clone(),
                path: path.unwrap_or_default(),
                uuid,
                keys: dkeys,
                unmanaged: d.unmanaged_keyslots,
                enroll_with,
            },
        );
    }

    if let Some(pbkdf) = &file.settings.pbkdf {
        check_pbkdf(pbkdf, &mut issues);
    }

    let parallelism = file.settings.parallelism.unwrap_or(DEFAULT_PARALLELISM);
    if parallelism == 0 {
        issues.push(Issue {
            path: p(&["settings", "parallelism"]),
            code: "keyplan::plan::parallelism",
            message: "`parallelism` is 0: no device could be worked on".to_owned(),
            label: "must be 1 or more".to_owned(),
            help: format!(
                "set `parallelism` to 1 or more (devices worked on at once), or remove it for the default {DEFAULT_PARALLELISM}"
            ),
            also: Vec::new(),
        });
    }

    if file.settings.memory_budget_kib == Some(0) {
        issues.push(Issue {
            path: p(&["settings", "memory_budget_kib"]),
            code: "keyplan::plan::memory_budget",
            message: "`memory_budget_kib` is 0: no PBKDF run could start".to_owned(),
            label: "must be 1 or more".to_owned(),
            help: "set the KiB the PBKDF runs of one apply may use at once, or remove it for the default (half the available memory)".to_owned(),
            also: Vec::new(),
        });
    }

    if issues.is_empty() {
        Ok(Resolved {
            state_dir,
            kms,
            keys,
            devices,
            pbkdf: file.settings.pbkdf,
            parallelism,
            memory_budget_kib: file.settings.memory_budget_kib,
        })
    } else {
        Err(issues)
    }
}

/// `settings.pbkdf` against the limits cryptsetup 2.6 enforces when it adds a keyslot, so a
/// bad value is refused here rather than by `luksAddKey` in the middle of a run (after a new
/// key version was staged).
fn check_pbkdf(pbkdf: &PbkdfSettings, issues: &mut Vec<Issue>) {
    let at = |f: &str| p(&["settings", "pbkdf", f]);
    let argon2 = pbkdf.kind != PbkdfType::Pbkdf2;
    let kind = match pbkdf.kind {
        PbkdfType::Argon2id => "argon2id",
        PbkdfType::Argon2i => "argon2i",
        PbkdfType::Pbkdf2 => "pbkdf2",
    };
    if let Some(i) = pbkdf.iterations {
        let min = if argon2 {
            ARGON2_MIN_ITERATIONS
        } else {
            PBKDF2_MIN_ITERATIONS
        };
        if i < min {
            issues.push(Issue {
                path: at("iterations"),
                code: "keyplan::plan::pbkdf",
                message: format!(
                    "`iterations: {i}` is too low for {kind}: cryptsetup refuses fewer than {min}"
                ),
                label: format!("at least {min}"),
                help: format!(
                    "set `iterations` to {min} or more, or remove it (and set `iter_time_ms`) to let cryptsetup choose by benchmark"
                ),
                also: Vec::new(),
            });
        }
    }
    if let Some(t) = pbkdf.iter_time_ms {
        if t == 0 {
            issues.push(Issue {
                path: at("iter_time_ms"),
                code: "keyplan::plan::pbkdf",
                message: "`iter_time_ms: 0` asks for a PBKDF that takes no time".to_owned(),
                label: "must be 1 or more".to_owned(),
                help: "set `iter_time_ms` to the unlock time wanted in milliseconds (cryptsetup's default is 2000), or remove it".to_owned(),
                also: Vec::new(),
            });
        }
    }
    if let Some(m) = pbkdf.memory_kib {
        let (lo, hi) = ARGON2_MEMORY_KIB;
        if argon2 && !(lo..=hi).contains(&m) {
            issues.push(Issue {
                path: at("memory_kib"),
                code: "keyplan::plan::pbkdf",
                message: format!(
                    "`memory_kib: {m}` is outside what cryptsetup accepts for {kind} ({lo} KiB to {hi} KiB = 4 GiB)"
                ),
                label: format!("must be {lo} to {hi}"),
                help: format!(
                    "set `memory_kib` between {lo} and {hi} (e.g. 1048576 for 1 GiB), no more than the smallest machine that must unlock the device has; or remove it for cryptsetup's default"
                ),
                also: Vec::new(),
            });
        }
    }
    if let Some(0) = pbkdf.parallel {
        if argon2 {
            issues.push(Issue {
                path: at("parallel"),
                code: "keyplan::plan::pbkdf",
                message: "`parallel: 0`: Argon2 needs at least one thread".to_owned(),
                label: "must be 1 or more".to_owned(),
                help: "set `parallel` to 1 or more (cryptsetup uses at most the number of CPUs), or remove it for cryptsetup's default".to_owned(),
                also: Vec::new(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_rotate_after("90d").unwrap(),
            Duration::from_secs(90 * 86400)
        );
        assert_eq!(
            parse_rotate_after("12h").unwrap(),
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(
            parse_rotate_after("2w").unwrap(),
            Duration::from_secs(14 * 86400)
        );
        assert_eq!(
            parse_rotate_after("1w 3d").unwrap(),
            Duration::from_secs(10 * 86400)
        );
        assert_eq!(
            parse_rotate_after("30m").unwrap(),
            Duration::from_secs(1800)
        );
        for bad in [
            "90x",
            "3 months",
            "0d",
            "1y",
            "2M",
            "",
            "d",
            "90",
            "1.5h",
            "-1d",
            "10ms",
            "12h!",
            "99999999999999999999w",
        ] {
            assert!(parse_rotate_after(bad).is_err(), "{bad} accepted");
        }
        assert!(parse_rotate_after("3 months")
            .unwrap_err()
            .contains("months"));
    }

    #[test]
    fn ids_and_file_names() {
        assert!(is_id("osd0-block_1.x"));
        assert!(!is_id(""));
        assert!(!is_id("a/b"));
        assert!(!is_id("a b"));
        assert!(is_safe_file_name("data-kek"));
        assert!(!is_safe_file_name(".hidden"));
        assert!(!is_safe_file_name(".."));
    }

    #[test]
    fn lexical_paths() {
        assert_eq!(lexical(Path::new("/a/./b/../c")), PathBuf::from("/a/c"));
        assert_eq!(
            resolve(Path::new("/plans"), "./img/../x.img"),
            PathBuf::from("/plans/img/../x.img")
        );
        assert_eq!(
            resolve(Path::new("/plans"), "/dev/sda"),
            PathBuf::from("/dev/sda")
        );
    }
}
