//! Keys (`keys.<id>`): valid ids, a defined KMS instance, the name in the KMS, `rotate_after`
//! and `bytes`; and no two keys naming the same KMS entry.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use super::paths::identity;
use super::syntax::{is_id, is_safe_file_name, parse_rotate_after, DURATION_HELP, ID_CHARS};
use super::{
    empty_issue, list, name_issue, p, Ctx, Issue, Key, KmsConfig, PlanFile, BYTES_RANGE,
    DEFAULT_BYTES,
};
use crate::spec::model::KeyFile;

/// Checks every key, in id order, and returns them resolved (name and `bytes` defaulted,
/// `rotate_after` parsed).
///
/// Issues per key, in this order: `keyplan::plan::name` (the id is not an id),
/// `keyplan::plan::undefined_kms`, `keyplan::plan::empty` (`name` blank),
/// `keyplan::plan::key_name` (not a safe file name for a file KMS, or not a usable secret name
/// for an AWS Secrets Manager KMS), `keyplan::plan::duration`,
/// `keyplan::plan::bytes`.
pub(super) fn check_keys(file: &PlanFile, cx: &mut Ctx) -> BTreeMap<String, Key> {
    let mut keys = BTreeMap::new();
    for (id, k) in &file.keys {
        if !is_id(id) {
            cx.push(name_issue(p(&["keys", id]), id, "key id", "invalid key id"));
        }
        let provider = key_provider(file, id, k, cx);
        let name = key_name(id, k, cx);
        if provider == Some("file") && !name.is_empty() && !is_safe_file_name(&name) {
            cx.push(unsafe_file_name(id, k, &name));
        }
        if let Some(KmsConfig::AwsSecretsManager { prefix, .. }) = file
            .kms
            .get(&k.kms)
            .filter(|_| !k.name.as_deref().is_some_and(|n| n.trim().is_empty()))
        {
            let prefix = prefix.as_deref().unwrap_or_default();
            if let Some(why) = crate::spec::aws_names::secret_name_problem(prefix, &name) {
                cx.push(aws_secret_name(id, k, &name, why));
            }
        }
        let rotate_after = key_rotate_after(id, k, cx);
        let bytes = key_bytes(id, k, cx);
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
    keys
}

/// The provider of key `id`'s KMS instance; `None` when the instance is not defined
/// (`keyplan::plan::undefined_kms`, whose help lists the defined instances).
fn key_provider(file: &PlanFile, id: &str, k: &KeyFile, cx: &mut Ctx) -> Option<&'static str> {
    if let Some(cfg) = file.kms.get(&k.kms) {
        return Some(cfg.provider());
    }
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
    cx.push(Issue {
        path: p(&["keys", id, "kms"]),
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

/// Key `id`'s name in the KMS: `name`, or the id when it is absent or blank (blank is a
/// `keyplan::plan::empty` issue).
fn key_name(id: &str, k: &KeyFile, cx: &mut Ctx) -> String {
    match &k.name {
        Some(n) if n.trim().is_empty() => {
            cx.push(empty_issue(
                p(&["keys", id, "name"]),
                "name",
                "remove `name` to use the key id, or give the key's name in the KMS",
            ));
            id.to_owned()
        }
        Some(n) => n.clone(),
        None => id.to_owned(),
    }
}

/// The `keyplan::plan::key_name` issue: key `id`'s `name` (written, or defaulted to the id) is
/// not a safe file name for its file KMS.
fn unsafe_file_name(id: &str, k: &KeyFile, name: &str) -> Issue {
    let (path, note) = if k.name.is_some() {
        (p(&["keys", id, "name"]), "")
    } else {
        (
            p(&["keys", id]),
            " (the name defaults to the key id; set `name:` to choose another)",
        )
    };
    Issue {
        path,
        code: "keyplan::plan::key_name",
        message: format!(
            "key name `{name}` is not a safe file name for the file KMS `{}`",
            k.kms
        ),
        label: "not a safe file name".to_owned(),
        help: format!("use only {ID_CHARS}, not starting with `.`{note}"),
        also: Vec::new(),
    }
}

/// The `keyplan::plan::key_name` issue: key `id`'s `name` is not usable as an AWS Secrets
/// Manager secret name; `why` from [`crate::spec::aws_names::secret_name_problem`].
fn aws_secret_name(id: &str, k: &KeyFile, name: &str, why: String) -> Issue {
    let (path, note) = if k.name.is_some() {
        (p(&["keys", id, "name"]), "")
    } else {
        (
            p(&["keys", id]),
            "; the name defaults to the key id: set `name:` to choose another",
        )
    };
    Issue {
        path,
        code: "keyplan::plan::key_name",
        message: format!(
            "key name `{name}` is not usable in the AWS Secrets Manager KMS `{}`",
            k.kms
        ),
        label: "not a usable secret name".to_owned(),
        help: format!("the name {why}{note}"),
        also: Vec::new(),
    }
}

/// Key `id`'s `rotate_after`, parsed; `None` when absent or invalid (invalid is a
/// `keyplan::plan::duration` issue).
fn key_rotate_after(id: &str, k: &KeyFile, cx: &mut Ctx) -> Option<Duration> {
    let text = k.rotate_after.as_ref()?;
    match parse_rotate_after(text) {
        Ok(d) => Some(d),
        Err(message) => {
            cx.push(Issue {
                path: p(&["keys", id, "rotate_after"]),
                code: "keyplan::plan::duration",
                message: format!("key `{id}`: {message}"),
                label: "not a valid duration".to_owned(),
                help: DURATION_HELP.to_owned(),
                also: Vec::new(),
            });
            None
        }
    }
}

/// Key `id`'s `bytes` (default [`DEFAULT_BYTES`]); outside [`BYTES_RANGE`] is a
/// `keyplan::plan::bytes` issue.
fn key_bytes(id: &str, k: &KeyFile, cx: &mut Ctx) -> usize {
    let bytes = k.bytes.unwrap_or(DEFAULT_BYTES);
    if !(BYTES_RANGE.0..=BYTES_RANGE.1).contains(&bytes) {
        cx.push(Issue {
            path: p(&["keys", id, "bytes"]),
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
    bytes
}

/// Two keys naming the same entry of the same KMS would rotate (and retire) each other's
/// versions: a lock-out. Checks the resolved `keys` against the resolved `kms` instances.
///
/// Issue: `keyplan::plan::duplicate_key_name` at the second key in file order (at its `name`
/// when written), pointing back at the first.
pub(super) fn check_key_entries(
    file: &PlanFile,
    kms: &BTreeMap<String, KmsConfig>,
    keys: &BTreeMap<String, Key>,
    cx: &mut Ctx,
) {
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
    // The entry a key names in its store: for AWS Secrets Manager the full secret name in
    // the region and endpoint (two instances with other prefixes can name one secret).
    let entry = |k: &Key| -> (String, String) {
        match kms.get(&k.kms) {
            Some(KmsConfig::AwsSecretsManager {
                region,
                endpoint,
                prefix,
                ..
            }) => (
                format!(
                    "aws:{region}:{}",
                    endpoint.as_deref().unwrap_or("").trim_end_matches('/')
                ),
                format!("{}{}", prefix.as_deref().unwrap_or(""), k.name),
            ),
            _ => (kms_identity(&k.kms), k.name.clone()),
        }
    };
    let mut by_entry: HashMap<(String, String), &str> = HashMap::new();
    for id in cx.in_file_order("keys", keys.keys()) {
        let Some(k) = keys.get(id) else { continue };
        if let Some(first) = by_entry.insert(entry(k), id) {
            let path = if file.keys.get(id).is_some_and(|f| f.name.is_some()) {
                p(&["keys", id, "name"])
            } else {
                p(&["keys", id])
            };
            cx.push(Issue {
                path,
                code: "keyplan::plan::duplicate_key_name",
                message: format!(
                    "keys `{first}` and `{id}` both use `{}` in KMS `{}` (the same store{}): rotating one would replace and retire the other's versions",
                    k.name,
                    k.kms,
                    match kms.get(&k.kms) {
                        Some(KmsConfig::AwsSecretsManager { .. }) => {
                            format!(": the secret {:?}", entry(k).1)
                        }
                        _ => String::new(),
                    }
                ),
                label: "same KMS entry as another key".to_owned(),
                help: format!(
                    "give `{id}` its own `name:`, or list key `{first}` on the devices instead"
                ),
                also: vec![(p(&["keys", first]), format!("`{first}` uses it first"))],
            });
        }
    }
}
