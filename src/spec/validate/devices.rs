//! Devices (`devices.<id>`): valid ids, paths and UUIDs (no two devices the same), the
//! `enroll_with` file, the key list with its pinned keyslots, and no lock-out by
//! `unmanaged_keyslots: remove`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::paths::{identity, resolve};
use super::syntax::is_id;
use super::{
    empty_issue, key, list, name_issue, p, Ctx, Device, Issue, PathSeg, PlanFile, MAX_KEYSLOT,
};
use crate::spec::model::{DeviceFile, DeviceKeyFile, UnmanagedKeyslots};
use crate::spec::DeviceKey;

/// The devices checked so far, by what makes two of them the same device.
#[derive(Default)]
struct Seen<'f> {
    /// Device id by node and [`identity`] of its path (the path as resolved, without following
    /// symlinks, for a device on a named node: its links are that node's, not this host's).
    by_identity: HashMap<(Option<&'f str>, PathBuf), &'f str>,
    /// Device id by LUKS UUID (trimmed, lowercase).
    by_uuid: HashMap<String, &'f str>,
}

/// Checks every device, in file order (so "first" and "second" among duplicates are as
/// written), and returns them resolved (paths absolute, keys in plan order).
///
/// Issues per device, in this order: `keyplan::plan::name` (the id is not an id), then those
/// of [`device_path`], [`device_uuid`], [`device_enroll_with`], [`device_keys`] and
/// [`check_lockout`].
pub(super) fn check_devices(file: &PlanFile, cx: &mut Ctx) -> BTreeMap<String, Device> {
    let mut seen = Seen::default();
    let mut devices = BTreeMap::new();
    for id in cx.in_file_order("devices", file.devices.keys()) {
        let Some(d) = file.devices.get(id) else {
            continue;
        };
        if !is_id(id) {
            cx.push(name_issue(
                p(&["devices", id]),
                id,
                "device id",
                "invalid device id",
            ));
        }
        let path = device_path(file, id, d, &mut seen, cx);
        let uuid = device_uuid(id, d, &mut seen, cx);
        let enroll_with = device_enroll_with(id, d, cx);
        let keys = device_keys(file, id, d, cx);
        check_lockout(id, d, cx);
        check_keep_list(id, d, cx);
        devices.insert(
            id.clone(),
            Device {
                id: id.clone(),
                path: path.unwrap_or_default(),
                uuid,
                keys,
                unmanaged: d.unmanaged_keyslots.mode(),
                keep_keyslots: d.unmanaged_keyslots.kept().iter().copied().collect(),
                enroll_with,
                node: d.node.as_deref().map(str::trim).map(str::to_string),
            },
        );
    }
    devices
}

/// Device `id`'s `path`, resolved against the plan's directory; `None` when blank.
///
/// Issues: `keyplan::plan::empty` (blank), `keyplan::plan::duplicate_device` (the same file as
/// an earlier device's path, after resolving relative paths and symlinks).
fn device_path<'f>(
    file: &PlanFile,
    id: &'f str,
    d: &'f DeviceFile,
    seen: &mut Seen<'f>,
    cx: &mut Ctx,
) -> Option<PathBuf> {
    if d.path.trim().is_empty() {
        cx.push(empty_issue(
            p(&["devices", id, "path"]),
            "path",
            "set `path` to the block device or LUKS image file, e.g. `/dev/disk/by-partuuid/...`",
        ));
        return None;
    }
    let abs = resolve(cx.base, &d.path);
    let node = d.node.as_deref().map(str::trim);
    let ident = match node {
        Some(_) => abs.clone(),
        None => identity(&abs),
    };
    match seen.by_identity.get(&(node, ident.clone())) {
        Some(first) => cx.push(same_path(file, id, d, first, &ident)),
        None => {
            seen.by_identity.insert((node, ident), id);
        }
    }
    Some(abs)
}

/// The devices' `node` names, and in a plan that names nodes, a `node` on every device. A
/// key may be listed on devices of several nodes: its rotation is then one two-phase commit
/// across the nodes (docs/fleet.md, "Keys on several nodes").
///
/// Issues: `keyplan::plan::node` (not a Kubernetes node name), `keyplan::plan::node_missing`
/// (a device without `node` in a plan whose other devices name theirs).
pub(super) fn check_nodes(devices: &BTreeMap<String, Device>, cx: &mut Ctx) {
    for id in cx.in_file_order("devices", devices.keys()) {
        let Some(n) = devices.get(id).and_then(|d| d.node.as_deref()) else {
            continue;
        };
        if !super::syntax::is_dns_subdomain(n) {
            cx.push(Issue {
                path: p(&["devices", id, "node"]),
                code: "keyplan::plan::node",
                message: format!("device `{id}`: `node` {n:?} is not a Kubernetes node name"),
                label: "not a DNS-1123 subdomain".to_owned(),
                help: "write the node's name as `kubectl get nodes` shows it: at most 253 lowercase letters, digits, `-` and `.`, each part between dots starting and ending with a letter or digit".to_owned(),
                also: Vec::new(),
            });
        }
    }
    // In a plan that names nodes, a device without `node` would be every host's: each node
    // would act on it, and on its keys, alone.
    let named = cx
        .in_file_order("devices", devices.keys())
        .into_iter()
        .find(|id| devices.get(*id).is_some_and(|d| d.node.is_some()))
        .cloned();
    if let Some(first) = named {
        for id in cx.in_file_order("devices", devices.keys()) {
            if devices.get(id).is_some_and(|d| d.node.is_none()) {
                cx.push(Issue {
                    path: p(&["devices", id]),
                    code: "keyplan::plan::node_missing",
                    message: format!(
                        "device `{id}` names no `node`, but other devices of the plan do (e.g. `{first}`)"
                    ),
                    label: "no `node`".to_owned(),
                    help: format!(
                        "add `node: <node name>` to `{id}`: in a plan for several nodes a device without one would be acted on by every node's keyplan, each on its own"
                    ),
                    also: vec![(p(&["devices", &first, "node"]), format!("`{first}` names its node"))],
                });
            }
        }
    }
}

/// The `keyplan::plan::duplicate_device` issue: device `id` (`d`) has the same path (`ident`)
/// as device `first`; the message shows both spellings when they differ.
fn same_path(file: &PlanFile, id: &str, d: &DeviceFile, first: &str, ident: &Path) -> Issue {
    let same = match file.devices.get(first) {
        Some(f) if f.path != d.path => format!(
            " (`{}` and `{}` are the same file: {})",
            f.path,
            d.path,
            ident.display()
        ),
        _ => String::new(),
    };
    Issue {
        path: p(&["devices", id, "path"]),
        code: "keyplan::plan::duplicate_device",
        message: format!("device `{id}` has the same path as device `{first}`{same}"),
        label: format!("same device as `{first}`"),
        help: format!("list each device once: remove `{id}` or `{first}`, and merge their keys"),
        also: vec![(
            p(&["devices", first, "path"]),
            format!("device `{first}` is first"),
        )],
    }
}

/// Device `id`'s `uuid`, trimmed; `None` when absent or blank.
///
/// Issues: `keyplan::plan::empty` (blank), `keyplan::plan::duplicate_device` (the same UUID,
/// ignoring case, as an earlier device).
fn device_uuid<'f>(
    id: &'f str,
    d: &DeviceFile,
    seen: &mut Seen<'f>,
    cx: &mut Ctx,
) -> Option<String> {
    let u = d.uuid.as_ref()?;
    if u.trim().is_empty() {
        cx.push(empty_issue(
            p(&["devices", id, "uuid"]),
            "uuid",
            "remove `uuid`, or give the device's LUKS UUID (`cryptsetup luksUUID DEVICE`)",
        ));
        return None;
    }
    let norm = u.trim().to_ascii_lowercase();
    if let Some(first) = seen.by_uuid.get(&norm) {
        cx.push(Issue {
            path: p(&["devices", id, "uuid"]),
            code: "keyplan::plan::duplicate_device",
            message: format!("device `{id}` has the same LUKS UUID as device `{first}`"),
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
        seen.by_uuid.insert(norm, id);
    }
    Some(u.trim().to_owned())
}

/// Device `id`'s `enroll_with`, resolved against the plan's directory; `None` when absent or
/// blank (blank is a `keyplan::plan::empty` issue).
fn device_enroll_with(id: &str, d: &DeviceFile, cx: &mut Ctx) -> Option<PathBuf> {
    let e = d.enroll_with.as_ref()?;
    if e.trim().is_empty() {
        cx.push(empty_issue(
            p(&["devices", id, "enroll_with"]),
            "enroll_with",
            "remove `enroll_with`, or name the file holding a passphrase that opens the device today",
        ));
        return None;
    }
    Some(resolve(cx.base, e))
}

/// The path of device `id`'s key entry `i`, then `rest`, e.g. `devices.osd0.keys[1].keyslot`.
fn entry_path(id: &str, i: usize, rest: &[&str]) -> Vec<PathSeg> {
    let mut v = p(&["devices", id, "keys"]);
    v.push(PathSeg::Index(i));
    v.extend(rest.iter().map(|s| key(s)));
    v
}

/// Device `id`'s key list, in plan order.
///
/// Issues per entry, in this order: `keyplan::plan::undefined_key` (not under `keys`),
/// `keyplan::plan::duplicate_key` (listed twice on the device), then those of
/// [`check_keyslot`].
fn device_keys(file: &PlanFile, id: &str, d: &DeviceFile, cx: &mut Ctx) -> Vec<DeviceKey> {
    let mut listed: HashMap<&str, usize> = HashMap::new();
    let mut pinned: HashMap<u32, (usize, &str)> = HashMap::new();
    let mut keys = Vec::new();
    for (i, entry) in d.keys.iter().enumerate() {
        let (kid, keyslot, kid_path) = match entry {
            DeviceKeyFile::Name(k) => (k.as_str(), None, entry_path(id, i, &[])),
            DeviceKeyFile::Pinned(pk) => (pk.key.as_str(), pk.keyslot, entry_path(id, i, &["key"])),
        };
        if !file.keys.contains_key(kid) {
            cx.push(undefined_key(file, id, kid, kid_path.clone()));
        }
        if let Some(first) = listed.get(kid) {
            cx.push(Issue {
                path: kid_path,
                code: "keyplan::plan::duplicate_key",
                message: format!(
                    "key `{kid}` is listed twice on device `{id}` (entries {first} and {i})"
                ),
                label: "listed again".to_owned(),
                help: "list each key once per device: remove this entry".to_owned(),
                also: vec![(entry_path(id, *first, &[]), "first listed here".to_owned())],
            });
        } else {
            listed.insert(kid, i);
        }
        if let Some(slot) = keyslot {
            check_keyslot(id, i, kid, slot, &mut pinned, cx);
        }
        keys.push(DeviceKey {
            key: kid.to_owned(),
            keyslot,
        });
    }
    keys
}

/// The `keyplan::plan::undefined_key` issue at `path`: device `id` lists key `kid`, which is
/// not under `keys` (the help lists the defined keys).
fn undefined_key(file: &PlanFile, id: &str, kid: &str, path: Vec<PathSeg>) -> Issue {
    let help = if file.keys.is_empty() {
        format!("define key `{kid}` under `keys`")
    } else {
        format!(
            "use one of the defined keys ({}), or define `{kid}` under `keys`",
            list(file.keys.keys())
        )
    };
    Issue {
        path,
        code: "keyplan::plan::undefined_key",
        message: format!("device `{id}` lists key `{kid}`, which is not defined under `keys`"),
        label: "undefined key".to_owned(),
        help,
        also: Vec::new(),
    }
}

/// Keyslot `slot` pinned for key `kid` by entry `i` of device `id`; `pinned` holds the
/// keyslots pinned by earlier entries (entry and key), and gets this one if it is new.
///
/// Issues: `keyplan::plan::keyslot` (above [`MAX_KEYSLOT`]), else
/// `keyplan::plan::keyslot_taken` (already pinned for another entry).
fn check_keyslot<'k>(
    id: &str,
    i: usize,
    kid: &'k str,
    slot: u32,
    pinned: &mut HashMap<u32, (usize, &'k str)>,
    cx: &mut Ctx,
) {
    if slot > MAX_KEYSLOT {
        cx.push(Issue {
            path: entry_path(id, i, &["keyslot"]),
            code: "keyplan::plan::keyslot",
            message: format!("device `{id}`: keyslot {slot} for key `{kid}` is out of range"),
            label: format!("LUKS2 keyslots are 0-{MAX_KEYSLOT}"),
            help: format!(
                "pin a keyslot from 0 to {MAX_KEYSLOT} (0 to 7 on LUKS1), or remove `keyslot` to let keyplan choose a free one"
            ),
            also: Vec::new(),
        });
    } else if let Some((first, first_key)) = pinned.get(&slot) {
        cx.push(Issue {
            path: entry_path(id, i, &["keyslot"]),
            code: "keyplan::plan::keyslot_taken",
            message: format!(
                "device `{id}`: keyslot {slot} is pinned for both key `{first_key}` and key `{kid}`"
            ),
            label: format!("keyslot {slot} is already pinned"),
            help: "give each key its own keyslot, or remove `keyslot` from one of them to let keyplan choose".to_owned(),
            also: vec![(
                entry_path(id, *first, &["keyslot"]),
                format!("pinned for `{first_key}` here"),
            )],
        });
    } else {
        pinned.insert(slot, (i, kid));
    }
}

/// `keyplan::plan::keyslot_range` for a keyslot of `unmanaged_keyslots: { keep: [...] }` past
/// 31 (LUKS2 has keyslots 0-31), `keyplan::plan::duplicate_keyslot` for one listed twice,
/// `keyplan::plan::empty` for an empty list (`remove` says that).
fn check_keep_list(id: &str, d: &DeviceFile, cx: &mut Ctx) {
    if matches!(
        &d.unmanaged_keyslots,
        crate::spec::UnmanagedKeyslotsFile::KeepOnly(k) if k.keep.is_empty()
    ) {
        cx.push(Issue {
            path: p(&["devices", id, "unmanaged_keyslots", "keep"]),
            code: "keyplan::plan::empty",
            message: format!(
                "device `{id}`: unmanaged_keyslots keeps no keyslot (`keep: []`), which removes every unmanaged keyslot"
            ),
            label: "empty keep list".to_owned(),
            help: "list the keyslots to keep, or say `unmanaged_keyslots: remove` if every unmanaged keyslot is to go".to_owned(),
            also: Vec::new(),
        });
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, n) in d.unmanaged_keyslots.kept().iter().enumerate() {
        let mut path = p(&["devices", id, "unmanaged_keyslots", "keep"]);
        path.push(PathSeg::Index(i));
        if *n > 31 {
            cx.push(Issue {
                path,
                code: "keyplan::plan::keyslot_range",
                message: format!(
                    "device `{id}`: unmanaged_keyslots keeps keyslot {n}, but a LUKS2 device has keyslots 0-31 (LUKS1: 0-7)"
                ),
                label: "no such keyslot".to_owned(),
                help: "list the keyslot numbers `cryptsetup luksDump` shows for the device".to_owned(),
                also: Vec::new(),
            });
        } else if !seen.insert(*n) {
            cx.push(Issue {
                path,
                code: "keyplan::plan::duplicate_keyslot",
                message: format!("device `{id}`: unmanaged_keyslots keeps keyslot {n} twice"),
                label: "listed twice".to_owned(),
                help: "list each keyslot once".to_owned(),
                also: Vec::new(),
            });
        }
    }
}

/// `keyplan::plan::lockout` when device `id` lists no key but says
/// `unmanaged_keyslots: remove`: every keyslot would be removed.
fn check_lockout(id: &str, d: &DeviceFile, cx: &mut Ctx) {
    if d.keys.is_empty() && d.unmanaged_keyslots.mode() == UnmanagedKeyslots::Remove {
        cx.push(Issue {
            path: p(&["devices", id, "unmanaged_keyslots"]),
            code: "keyplan::plan::lockout",
            message: format!(
                "device `{id}` lists no key but says `unmanaged_keyslots: remove`: every keyslot would be removed, which could lock you out (nothing would open the device)"
            ),
            label: "would remove every keyslot".to_owned(),
            help: "list at least one key under `keys` (with `enroll_with` to enroll it), or set `unmanaged_keyslots: keep`".to_owned(),
            also: Vec::new(),
        });
    }
}
