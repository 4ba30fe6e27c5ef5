//! Semantic checks on a parsed plan and resolution into [`super::Plan`] parts. Every problem
//! is collected (not just the first) as an [`Issue`] naming a path in the document; the caller
//! turns paths into spans with the locator.
//!
//! [`validate`] is the driver: it runs one check per part of the plan, in the order their
//! issues are reported (that order is the output order):
//! - [`header`]: `version` and `state_dir`;
//! - [`kms`]: the KMS instances;
//! - [`keys`]: each key, then two keys naming the same KMS entry;
//! - [`devices`]: each device (paths, UUIDs, `enroll_with`, its key list, lock-out);
//! - [`settings`]: `settings.pbkdf`, `parallelism`, `memory_budget_kib`.
//!
//! [`syntax`] holds the value syntaxes (ids, file names, durations) and [`paths`] the path
//! resolution the checks share.

mod devices;
mod header;
mod keys;
mod kms;
mod paths;
mod settings;
mod syntax;

pub use syntax::{parse_kms_timeout, MAX_TIMEOUT, MIN_TIMEOUT};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::model::{
    KmsConfig, PbkdfSettings, PlanFile, VaultAuth, ARGON2_MEMORY_KIB, ARGON2_MIN_ITERATIONS,
    PBKDF2_MIN_ITERATIONS,
};
use super::{Device, Key, PathSeg};

/// Lowest and highest `bytes` of a key.
pub(crate) const BYTES_RANGE: (usize, usize) = (16, 512);
/// Highest LUKS2 keyslot number.
pub(crate) const MAX_KEYSLOT: u32 = 31;
/// Default `bytes`.
pub(crate) const DEFAULT_BYTES: usize = 32;
/// Default `parallelism`.
pub(crate) const DEFAULT_PARALLELISM: usize = 4;

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
    pub fleet: super::Fleet,
}

/// What every check shares: where relative paths start, where a path is written, and the
/// issues found so far (pushed in output order).
struct Ctx<'a> {
    /// The plan file's directory (absolute); relative paths are resolved against it.
    base: &'a Path,
    /// File position of a path (for "first"/"second" among duplicates).
    order: &'a dyn Fn(&[PathSeg]) -> usize,
    /// The issues found so far, in the order they are reported.
    issues: Vec<Issue>,
}

impl Ctx<'_> {
    /// Records `issue` after those found so far.
    fn push(&mut self, issue: Issue) {
        self.issues.push(issue);
    }

    /// `ids` sorted by the file position of `[section, id]`: the order they are written in
    /// (the maps themselves are sorted by name).
    fn in_file_order<'i>(
        &self,
        section: &str,
        ids: impl Iterator<Item = &'i String>,
    ) -> Vec<&'i String> {
        let mut ids: Vec<&String> = ids.collect();
        ids.sort_by_key(|id| (self.order)(&p(&[section, id])));
        ids
    }
}

/// A mapping-key path segment.
fn key(s: &str) -> PathSeg {
    PathSeg::Key(s.to_owned())
}

/// A path of mapping keys, e.g. `p(&["keys", id, "bytes"])`.
fn p(segs: &[&str]) -> Vec<PathSeg> {
    segs.iter().map(|s| key(s)).collect()
}

/// The `keyplan::plan::empty` issue: `field` (at `path`) is empty; `help` says what to write.
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

/// The `keyplan::plan::name` issue: the mapping key at `path` is not an id; `what` names it
/// in the message ("KMS instance name"), `label` marks it.
fn name_issue(path: Vec<PathSeg>, name: &str, what: &str, label: &str) -> Issue {
    Issue {
        path,
        code: "keyplan::plan::name",
        message: format!("`{name}` is not a valid {what}"),
        label: label.to_owned(),
        help: format!("rename it using only {}", syntax::ID_CHARS),
        also: Vec::new(),
    }
}

/// Whether `name` is a Kubernetes node name (a DNS-1123 subdomain), as `node:` must be.
pub(crate) fn is_node_name(name: &str) -> bool {
    syntax::is_dns_subdomain(name)
}

/// `names` as a comma-separated list of backticked names, e.g. "`a`, `b`".
fn list(names: impl Iterator<Item = impl AsRef<str>>) -> String {
    let v: Vec<String> = names.map(|n| format!("`{}`", n.as_ref())).collect();
    v.join(", ")
}

/// Checks `file` and resolves its paths against `base` (absolute). `order` gives the file
/// position of a path (for "first"/"second" among duplicates).
///
/// Errors: every issue found, in the order the checks run (header, KMS instances, keys, key
/// entries, devices, settings), each part in its own order (see the module documentation).
pub(crate) fn validate(
    file: PlanFile,
    base: &Path,
    order: &dyn Fn(&[PathSeg]) -> usize,
) -> Result<Resolved, Vec<Issue>> {
    let mut cx = Ctx {
        base,
        order,
        issues: Vec::new(),
    };
    let state_dir = header::check_header(&file, &mut cx);
    let kms = kms::check_kms(&file.kms, &mut cx);
    let keys = keys::check_keys(&file, &mut cx);
    keys::check_key_entries(&file, &kms, &keys, &mut cx);
    let devices = devices::check_devices(&file, &mut cx);
    let parallelism = settings::check_settings(&file.settings, &mut cx);
    let fleet = settings::check_fleet(file.settings.fleet.as_ref(), &mut cx);
    devices::check_nodes(&devices, &mut cx);
    if cx.issues.is_empty() {
        Ok(Resolved {
            state_dir,
            kms,
            keys,
            devices,
            pbkdf: file.settings.pbkdf,
            parallelism,
            memory_budget_kib: file.settings.memory_budget_kib,
            fleet,
        })
    } else {
        Err(cx.issues)
    }
}
