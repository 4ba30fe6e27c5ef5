//! Plan files: loading YAML/TOML (docs/plan-file.md), validation, and diagnostics that point at
//! `file:line:column`.
//!
//! [`load`] turns a plan file into a validated [`Plan`]; every error it returns is a
//! `miette::Report` with the source file attached and a label on the offending span.
//! Errors that can only be found later (after a device's header was read, e.g. a keyslot out of
//! range for LUKS1) are built with [`Plan::error_at`], so they point at the plan file too.
//!
//! How locations are found: the text is parsed twice, once into the serde model
//! ([`model::PlanFile`], which catches unknown fields, missing fields and wrong types at the
//! parser's reported position) and once into a schema-free tree whose every node and mapping key
//! carries its byte span (`serde_saphyr::Spanned` / `toml::Spanned` around a hand-written
//! visitor). A path of [`PathSeg`]s is looked up in that tree to label semantic errors.
//!
//! [`json_diagnostics`] turns a load error into the diagnostics of `keyplan validate --json`
//! (one per error, with its range); [`model::plan_schema`] is the JSON Schema of the format
//! (committed as `schemas/keyplan-plan-v1.schema.json`, see docs/plan-schema.md).

pub mod aws_names;
mod diag;
mod load;
mod locate;
pub mod model;
pub mod node;
mod parse_error;
mod validate;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use diag::{json_diagnostics, JsonDiagnostic, Position, Range, Severity};
pub use model::{
    KmsConfig, PbkdfSettings, PbkdfType, UnmanagedKeyslots, UnmanagedKeyslotsFile, VaultAuth,
};
pub use validate::{parse_kms_timeout, MAX_TIMEOUT, MIN_TIMEOUT};

use diag::{Label, PlanError, SourceFile};
use locate::Located;

/// Plan file syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// YAML 1.2 (`.yaml`, `.yml`).
    Yaml,
    /// TOML 1.0 (`.toml`).
    Toml,
}

impl Format {
    /// The format an extension names: `yaml`/`yml` or `toml` (case-insensitive); `None` for any
    /// other extension or none.
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "yaml" | "yml" => Some(Format::Yaml),
            "toml" => Some(Format::Toml),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Yaml => "YAML",
            Format::Toml => "TOML",
        })
    }
}

/// Finds the default plan file in `dir`: exactly one of `keyplan.yaml`, `keyplan.yml` or
/// `keyplan.toml`, returned as `dir` joined with its name.
///
/// Errors (as a `miette::Report` with a help text): none of them exists, or more than one does
/// (the report names them).
pub fn find_default(dir: &Path) -> Result<PathBuf, miette::Report> {
    load::find_default(dir)
}

/// Reads, parses, validates and resolves the plan file at `path`.
///
/// The format follows the extension (`.yaml`/`.yml`: YAML, `.toml`: TOML); with any other
/// extension it is detected (TOML if the text parses as TOML, else YAML). Relative paths in the
/// plan are resolved against the file's directory. The reports carry the file's text under
/// `path` as given, and a label at the offending place; see [`load_str`] for the checks.
pub fn load(path: &Path) -> Result<Plan, miette::Report> {
    load_with_bytes(path).map(|(plan, _)| plan)
}

/// [`load`], also returning the exact bytes the plan was parsed from (one read of the file),
/// for digests that must cover what was planned (saved plans).
///
/// Errors: as [`load`].
pub fn load_with_bytes(path: &Path) -> Result<(Plan, Vec<u8>), miette::Report> {
    let text = load::read(path)?;
    let plan = load_text(&text, path)?;
    Ok((plan, text.into_bytes()))
}

/// Parses, validates and resolves `text`, read from the plan file at `path` (its extension
/// picks the format, else the text does; relative paths resolve against its directory), as
/// [`load`] does after reading the file. The node agent reads the file itself, once per cycle.
///
/// Errors: as [`load_str`].
pub fn load_text(text: &str, path: &Path) -> Result<Plan, miette::Report> {
    let format = Format::from_path(path).unwrap_or_else(|| load::detect(text));
    let base_dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut plan = load_str(text, &path.display().to_string(), format, base_dir)?;
    plan.source_path = path.to_path_buf();
    Ok(plan)
}

/// Parses, validates and resolves plan `text` in `format`. `name` is the file name shown in
/// diagnostics (`name:line:column`) and kept as [`Plan::source_path`]; `base_dir` is the
/// directory relative paths are resolved against (made absolute with the current directory if
/// it is relative).
///
/// Errors are `miette::Report`s with the text as a named source and a labeled span:
/// - syntax errors, wrong types, unknown fields, missing fields and bad enum values: one
///   report, at the parser's position, naming the field path (`devices.osd0.keys[1]`);
/// - semantic errors, all of them at once (one report, or a summary with each error as a
///   `related` diagnostic, in file order): `version` other than 1, undefined KMS instances or
///   keys, a key listed twice on a device, two keys pinned to one keyslot, keyslots above 31,
///   `rotate_after` not a positive duration in s/m/h/d/w, `bytes` outside 16..=512,
///   `parallelism` 0, two devices with the same path (after resolving relative paths and
///   symlinks) or the same UUID (ignoring case), file-KMS key names that are not safe file
///   names, invalid instance/key/device ids, empty paths, `settings.pbkdf` values cryptsetup
///   would refuse (iterations below its minimum, Argon2 memory outside 32 KiB..4 GiB,
///   `parallel: 0`, `iter_time_ms: 0`), a device listing no key under
///   `unmanaged_keyslots: remove`, and a `state_dir` that exists but is not a directory.
pub fn load_str(
    text: &str,
    name: &str,
    format: Format,
    base_dir: &Path,
) -> Result<Plan, miette::Report> {
    // A file naming none of the top-level fields is no plan file. Refuse it without quoting
    // it: `-f` pointed at a key or passphrase file must not echo the secret in a snippet.
    let content = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .count();
    let fields = ["version", "kms", "keys", "devices", "settings", "state_dir"];
    if content > 0 && !fields.iter().any(|f| text.contains(f)) {
        return Err(miette::miette!(
            code = "keyplan::plan::not_a_plan",
            help = diag::in_format(
                "a plan file starts with `version: 1`; check the -f argument",
                format
            ),
            "{name} is not a keyplan plan file: it names none of the plan fields (version, kms, keys, devices, settings, state_dir); its content is not shown"
        ));
    }
    let src = load::source_file(text, name, format);
    let (file, tree) = load::parse(&src, format)?;
    let base = absolute_dir(base_dir);
    // File positions of the entries of each top-level section (`devices.<id>`, ...), found in
    // one walk: validation orders every key and device by them, and a lookup in the tree is
    // linear in a mapping's size (quadratic for a 10,000-device plan).
    let mut sections: HashMap<(&str, &str), usize> = HashMap::new();
    if let locate::Node::Map(top) = &tree.node {
        for (section, value) in top {
            let (Some(section), locate::Node::Map(entries)) = (section.key_text(), &value.node)
            else {
                continue;
            };
            for (k, _) in entries {
                if let Some(name) = k.key_text() {
                    sections.entry((section, name)).or_insert(k.span.start);
                }
            }
        }
    }
    let order = |path: &[PathSeg]| {
        if let [PathSeg::Key(a), PathSeg::Key(b)] = path {
            if let Some(at) = sections.get(&(a.as_str(), b.as_str())) {
                return *at;
            }
        }
        tree.get(path)
            .map(|t| t.key.unwrap_or(t.value.span).start)
            .unwrap_or(usize::MAX)
    };
    let source = Source {
        file: src,
        format,
        tree: Arc::new(tree.clone()),
    };
    match validate::validate(file, &base, &order) {
        Ok(r) => Ok(Plan {
            source_path: PathBuf::from(name),
            base_dir: base,
            state_dir: r.state_dir,
            kms: r.kms,
            keys: r.keys,
            devices: r.devices,
            pbkdf: r.pbkdf,
            parallelism: r.parallelism,
            memory_budget_kib: r.memory_budget_kib,
            fleet: r.fleet,
            scope: None,
            node: None,
            peers: BTreeMap::new(),
            journal: JournalRetention::default(),
            source,
        }),
        Err(issues) => {
            let errors = issues
                .into_iter()
                .map(|i| {
                    let mut labels = Vec::new();
                    if let Some(l) = source.label(&i.path, i.label) {
                        labels.push(l);
                    }
                    for (path, text) in i.also {
                        if let Some(mut l) = source.label(&path, text) {
                            l.primary = false;
                            labels.push(l);
                        }
                    }
                    PlanError::new(&source.file, i.code, i.message, labels, Some(i.help))
                })
                .collect();
            Err(diag::combine(&source.file, errors))
        }
    }
}

/// `dir` as an absolute path (`.` for an empty one); unchanged if the current directory is
/// unknown.
fn absolute_dir(dir: &Path) -> PathBuf {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// One segment of a path into the plan document, e.g. `devices` / `osd0` / `keys` / `1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathSeg {
    /// A mapping key.
    Key(String),
    /// A sequence index (0-based).
    Index(usize),
}

/// A validated plan: paths resolved against the plan file's directory, durations parsed.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The plan file as given (for messages).
    pub source_path: PathBuf,
    /// Directory of the plan file; relative paths are resolved against it.
    pub base_dir: PathBuf,
    /// Journal, lock and LUKS1 records (default `<base_dir>/.keyplan`).
    pub state_dir: PathBuf,
    /// KMS instances by name; `File { path }` holds an absolute path.
    pub kms: BTreeMap<String, KmsConfig>,
    /// Keys by id.
    pub keys: BTreeMap<String, Key>,
    /// Devices by id.
    pub devices: BTreeMap<String, Device>,
    /// PBKDF for new keyslots; `None`: cryptsetup's default.
    pub pbkdf: Option<PbkdfSettings>,
    /// Devices worked on at once (>= 1; default 4).
    pub parallelism: usize,
    /// `settings.memory_budget_kib`: KiB the PBKDF runs of one apply may use at once; `None`:
    /// half the available memory, see [`crate::apply::memory`].
    pub memory_budget_kib: Option<u64>,
    /// `settings.fleet`, with defaults.
    pub fleet: Fleet,
    /// Set when the plan was cut down to one node's devices ([`Plan::for_node`]).
    pub scope: Option<node::NodeScope>,
    /// The node (or host) the plan was cut for ([`Plan::for_node`], also for a plan that
    /// names no nodes); `None`: not cut (the host name stands in, [`Plan::holder`]).
    pub node: Option<String>,
    /// For a plan cut to one node ([`Plan::for_node`]): per key this node's devices list, the
    /// other nodes whose devices list it too, by name. Their holder records are this plan's
    /// peers in the key's two-phase commit (docs/fleet.md, "Keys on several nodes"); empty for
    /// a key of this node alone and for a plan that names no nodes.
    pub peers: BTreeMap<String, std::collections::BTreeSet<String>>,
    /// How much of the journal's finished history the state directory keeps, and where the
    /// rest goes. Not part of the plan file: the front end sets it (`apply` and `agent`
    /// options `--journal-keep-runs` and `--journal-archive`), so a plan that reaches an agent
    /// through the cluster cannot name a file for it to write.
    pub journal: JournalRetention,
    /// The raw text and a span index, for diagnostics.
    source: Source,
}

/// The journal's audit trail ([`crate::journal::compact`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalRetention {
    /// Finished runs the audit trail `<state_dir>/history.jsonl` keeps (>= 1; default
    /// [`DEFAULT_JOURNAL_KEEP_RUNS`]).
    pub keep_runs: usize,
    /// File the records of runs leaving the audit trail are appended to, as JSON Lines (e.g.
    /// one a log shipper tails); `None`: they are dropped.
    pub archive: Option<PathBuf>,
}

/// Finished runs the audit trail keeps when `--journal-keep-runs` is not given.
pub const DEFAULT_JOURNAL_KEEP_RUNS: usize = 100;

impl Default for JournalRetention {
    fn default() -> JournalRetention {
        JournalRetention {
            keep_runs: DEFAULT_JOURNAL_KEEP_RUNS,
            archive: None,
        }
    }
}

/// `settings.fleet`, resolved (docs/fleet.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fleet {
    /// Nodes applying changes at once, fleet-wide (>= 1; default 1).
    pub max_concurrent_nodes: u32,
    /// Failed node runs that stop new node runs fleet-wide (>= 1; default 1).
    pub max_failed_nodes: u32,
    /// Namespace of the rollout's Leases, reports and Events (default `keyplan`).
    pub namespace: String,
}

impl Default for Fleet {
    fn default() -> Fleet {
        Fleet {
            max_concurrent_nodes: 1,
            max_failed_nodes: 1,
            namespace: DEFAULT_FLEET_NAMESPACE.to_string(),
        }
    }
}

/// Namespace of the fleet's objects when `settings.fleet.namespace` is unset.
pub const DEFAULT_FLEET_NAMESPACE: &str = "keyplan";

/// A key of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// Id (the mapping key under `keys:`).
    pub id: String,
    /// KMS instance name.
    pub kms: String,
    /// Name in the KMS (default: the id).
    pub name: String,
    /// Maximum age of the current version before rotation.
    pub rotate_after: Option<Duration>,
    /// `rotate_after` as written (for messages), e.g. `90d`.
    pub rotate_after_text: Option<String>,
    /// Random bytes in a new version (default 32).
    pub bytes: usize,
}

/// A device of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// Id (the mapping key under `devices:`).
    pub id: String,
    /// Absolute path (not canonicalized: symlinks kept as written).
    pub path: PathBuf,
    /// Expected LUKS UUID.
    pub uuid: Option<String>,
    /// Keys that must open this device, in plan order.
    pub keys: Vec<DeviceKey>,
    /// Policy for keyslots keyplan cannot attribute.
    pub unmanaged: UnmanagedKeyslots,
    /// With `unmanaged: Remove`: unmanaged keyslots to keep nevertheless
    /// (`unmanaged_keyslots: { keep: [...] }`); empty otherwise.
    pub keep_keyslots: std::collections::BTreeSet<u32>,
    /// Absolute path of the `enroll_with` passphrase file.
    pub enroll_with: Option<PathBuf>,
    /// The Kubernetes node the device is on; `None`: the host keyplan runs on.
    pub node: Option<String>,
}

/// A key listed on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceKey {
    /// Key id.
    pub key: String,
    /// Pinned keyslot.
    pub keyslot: Option<u32>,
}

impl Plan {
    /// Why an output option (`status -o`, `--journal-archive`) must not write `path`: it is
    /// the plan file, a device of the plan or its `enroll_with` file, inside the state
    /// directory or a file KMS's directory, or a state directory's file (any plan's: a
    /// `journal.jsonl`, `history.jsonl`, `owner.json` or `devices.json`, or a file beside one).
    /// `None` when it is none of these. Paths are compared
    /// resolved (symbolic links followed; a file that does not exist yet by its directory).
    pub fn protected_path(&self, path: &Path) -> Option<String> {
        fn resolve(p: &Path) -> PathBuf {
            if let Ok(c) = std::fs::canonicalize(p) {
                return c;
            }
            match (p.parent(), p.file_name()) {
                (Some(dir), Some(name)) => {
                    let dir = if dir.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        dir
                    };
                    std::fs::canonicalize(dir)
                        .map(|d| d.join(name))
                        .unwrap_or_else(|_| absolute_dir(p))
                }
                _ => absolute_dir(p),
            }
        }
        let target = resolve(path);
        if target == resolve(&self.source_path) {
            return Some("it is the plan file".into());
        }
        for d in self.devices.values() {
            if target == resolve(&d.path) {
                return Some(format!("it is device {} of the plan", d.id));
            }
            if d.enroll_with
                .as_deref()
                .is_some_and(|e| target == resolve(e))
            {
                return Some(format!("it is the enroll_with file of device {}", d.id));
            }
        }
        if target.starts_with(resolve(&self.state_dir)) {
            return Some(format!(
                "it is inside the state directory {}",
                self.state_dir.display()
            ));
        }
        for (name, k) in &self.kms {
            if let KmsConfig::File { path: dir, .. } = k {
                if target.starts_with(resolve(Path::new(dir))) {
                    return Some(format!("it is inside the directory of file KMS {name}"));
                }
            }
        }
        // Another plan's state directory: its journal, audit trail, lock and records.
        let name = target.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if matches!(
            name,
            "journal.jsonl" | "history.jsonl" | "owner.json" | "devices.json"
        ) || target.parent().is_some_and(|dir| {
            dir.join("owner.json").exists() || dir.join("journal.jsonl").exists()
        }) {
            return Some("it is in a keyplan state directory (another plan's?)".into());
        }
        None
    }

    /// A diagnostic pointing at the plan-file location of `path`, e.g.
    /// `[Key("devices"), Key("osd0"), Key("keys"), Index(1), Key("keyslot")]`, for errors found
    /// after reading the plan (e.g. keyslot 9 on a LUKS1 device).
    ///
    /// The label marks the value at `path` (or the mapping key naming it, for a mapping or
    /// list). When `path` is not written in the plan (a default), the label marks its nearest
    /// written ancestor; when not even the first segment is written, the report shows the file
    /// without a label. `help` should say what to do.
    pub fn error_at(
        &self,
        path: &[PathSeg],
        message: impl Into<String>,
        help: Option<String>,
    ) -> miette::Report {
        let (matched, _) = self.source.tree.nearest(path);
        let text = if matched == path.len() {
            "here".to_owned()
        } else {
            format!(
                "`{}` is not written in the plan; this is the nearest place",
                locate::display_path(path)
            )
        };
        let labels: Vec<Label> = self.source.label(path, text).into_iter().collect();
        let message = message.into();
        // Without a label miette shows no file name: put it in the message.
        let message = if labels.is_empty() {
            format!("{}: {message}", self.source.file.name)
        } else {
            message
        };
        PlanError::new(
            &self.source.file,
            "keyplan::plan::error",
            message,
            labels,
            help,
        )
        .report()
    }

    /// Line and column (both 1-based) where `path` is written in the plan file: the value, or
    /// for a mapping or list the mapping key naming it. Columns count bytes, as in miette's
    /// `file:line:column`. `None` if `path` is empty or not written in the plan.
    pub fn location_of(&self, path: &[PathSeg]) -> Option<(usize, usize)> {
        let target = self.source.tree.get(path)?;
        let span = locate::label_span(&self.source.file.text, &target);
        Some(locate::line_col(&self.source.file.text, span.start))
    }

    /// The syntax the plan file was read as.
    pub fn format(&self) -> Format {
        self.source.format
    }
}

/// The plan file's text, format and located tree, kept for diagnostics.
#[derive(Clone)]
struct Source {
    file: SourceFile,
    format: Format,
    tree: Arc<Located>,
}

impl Source {
    /// A primary label at `path`, or at its nearest written ancestor; `None` when nothing along
    /// `path` is written.
    fn label(&self, path: &[PathSeg], text: String) -> Option<Label> {
        let (_, target) = self.tree.nearest(path);
        let target = target?;
        Some(Label {
            span: locate::label_span(&self.file.text, &target),
            text,
            primary: true,
        })
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("file", &load::debug_source(&self.file))
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}
