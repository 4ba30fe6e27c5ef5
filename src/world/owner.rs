//! The state directory's owner: `<state_dir>/owner.json`, the one plan (plan file and node)
//! whose journal, lock, registry and LUKS1 records the directory holds (invariant I5).
//!
//! Two plans that name one state directory (two hosts' plans side by side with the default
//! `.keyplan`, a copied directory, a typo in `state_dir`) would share one journal and, worse,
//! one KMS holder id (`<node>:<state directory>`, [`crate::spec::Plan::holder`]): a rotation
//! from one would count the other's devices as its own and commit a version they do not hold.
//! So the first `apply` that changes something records its plan as the owner ([`claim`]: a
//! refused or empty apply claims nothing), and the commands of another plan that would act on
//! the directory's records (`plan`, `apply`, `key import`, `key release`, `device forget`) are
//! refused before they read or write anything there ([`check`]). Read-only commands do not
//! refuse: `key get` needs nothing of the directory, and `status`, `verify`, `journal` and
//! `key holders` say whose it is and read on ([`OwnerError::read_only_warning`]).
//!
//! A plan file that moved (its recorded path no longer exists), or that was moved or copied
//! together with its state directory, is the same plan, not another one: the next `apply` takes
//! the directory over ([`claim`]). The owner file also remembers the
//! holder ids the directory had before ([`Owner::former_holders`]): a state directory moved
//! with its plan (or the host's directory layout changed) changes the holder id, and the KMS's
//! record under the old id is this plan's own, not another plan's (`observe`'s former holders).

use std::path::{Path, PathBuf};

use crate::format::state::{files::OwnerV1, ReadError};
use crate::format::NewerFormat;
use crate::fsutil;
use crate::spec::Plan;

/// File name of the owner record in the state directory.
pub const OWNER_FILE: &str = "owner.json";

/// `<state_dir>/owner.json` as the engine uses it (the file's format:
/// [`crate::format::state::files::OwnerV1`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The owning plan file: its directory made canonical, its own name kept (a ConfigMap
    /// volume's file is a symlink whose target changes with every update).
    pub plan: PathBuf,
    /// The node (or host) the plan acts for.
    pub node: String,
    /// This state directory, canonical, when it was last claimed: a directory moved or copied
    /// together with its plan file (the same place relative to each other) is still that
    /// plan's.
    pub state_dir: PathBuf,
    /// The plan's holder id in KMS holder records when it last claimed the directory.
    pub holder: String,
    /// Holder ids this state directory had before (it moved, or its plan was given another
    /// `--state-dir` layout), oldest first: KMS holder records under them are this plan's own.
    pub former_holders: Vec<String>,
    /// When the directory was first claimed, Unix seconds.
    pub since: u64,
}

impl From<OwnerV1> for Owner {
    fn from(f: OwnerV1) -> Owner {
        Owner {
            plan: f.plan,
            node: f.node,
            state_dir: f.state_dir,
            holder: f.holder,
            former_holders: f.former_holders,
            since: f.since,
        }
    }
}

impl From<&Owner> for OwnerV1 {
    fn from(o: &Owner) -> OwnerV1 {
        OwnerV1 {
            format: 1,
            plan: o.plan.clone(),
            node: o.node.clone(),
            state_dir: o.state_dir.clone(),
            holder: o.holder.clone(),
            former_holders: o.former_holders.clone(),
            since: o.since,
        }
    }
}

/// Why a plan may not use a state directory, or the owner record cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    /// Another plan (another plan file that exists, or another node) owns the directory.
    #[error("state directory {} belongs to another plan: {} on node {} (since {}), not {} on node {}; nothing was read or changed there", dir.display(), owner.plan.display(), owner.node, crate::clock::rfc3339(owner.since), plan.display(), node)]
    OtherPlan {
        /// The state directory.
        dir: PathBuf,
        /// Its owner.
        owner: Box<Owner>,
        /// The plan that was refused.
        plan: PathBuf,
        /// Its node.
        node: String,
    },
    /// No owner record, but the directory's registry lists only devices that are not this
    /// plan's: another plan's runs filled it.
    #[error("state directory {} has no owner record ({OWNER_FILE}), but the devices keyplan worked on from it are none of this plan's: {}; another plan's runs filled it (its journal and KMS holder records are that plan's), so this plan will not take it over. Nothing was read or changed there", dir.display(), devices.join(", "))]
    Unowned {
        /// The state directory.
        dir: PathBuf,
        /// The registry's devices, as `id (path)`.
        devices: Vec<String>,
    },
    /// The owner file was written by a newer keyplan: refused, nothing read or written.
    #[error(transparent)]
    Newer(#[from] NewerFormat),
    /// The owner file cannot be parsed.
    #[error("{} is corrupt ({detail}); keyplan will not guess which plan owns this state directory. Restore it, or delete it to let the next `keyplan apply` of the plan that uses this directory claim it", path.display())]
    Corrupt {
        /// The owner file.
        path: PathBuf,
        /// The parser's message.
        detail: String,
    },
    /// The owner file could not be read or written.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// `reading` or `writing`.
        what: &'static str,
        /// The owner file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl OwnerError {
    /// What to do next.
    pub fn help(&self) -> Option<String> {
        match self {
            OwnerError::OtherPlan { dir, owner, .. } => Some(format!(
                "give this plan a state directory of its own (`state_dir` in the plan file, or `--state-dir`); the default is `.keyplan` beside the plan file, so two plan files in one directory need one set explicitly. If this plan replaces {} for good (the same devices at the same paths), delete that plan file, or {}, and run `keyplan apply` to claim the directory",
                owner.plan.display(),
                dir.join(OWNER_FILE).display()
            )),
            OwnerError::Unowned { .. } => Some(
                "give this plan a state directory of its own (`state_dir` in the plan file, or `--state-dir`). If the plan that filled this one still exists, restore its owner.json (or run `keyplan apply` of that plan, which records it); if this plan is that plan with its devices at new paths, run it once from a new state directory".to_string(),
            ),
            _ => None,
        }
    }

    /// The warning of a read-only command that reads on although the state directory is not
    /// this plan's (`status`, `verify`, `journal`, `key holders`: [`crate::ops::Engine::open_read_only`]):
    /// whose the directory is, that what the command shows from it is that plan's and nothing
    /// was changed, and how this plan gets a directory of its own. One paragraph, no help line.
    pub fn read_only_warning(&self) -> String {
        const READ: &str = "what this command shows from it (journal, device registry, LUKS1 records) is that plan's, read as it is; nothing was changed there";
        const OWN: &str = "give it a state directory of its own (`state_dir` in the plan file, or `--state-dir`); until then its `keyplan plan` and `keyplan apply` are refused";
        match self {
            OwnerError::OtherPlan {
                dir,
                owner,
                plan,
                node,
            } => format!(
                "state directory {} belongs to another plan: {} on node {} (since {}), not {} on node {}; {READ}. To look at that plan, run the command with `-f {}` as node {}; to use this plan, {OWN}",
                dir.display(),
                owner.plan.display(),
                owner.node,
                crate::clock::rfc3339(owner.since),
                plan.display(),
                node,
                owner.plan.display(),
                owner.node
            ),
            OwnerError::Unowned { dir, devices } => format!(
                "state directory {} has no owner record ({OWNER_FILE}), but the devices keyplan worked on from it are none of this plan's ({}): another plan's runs filled it, and {READ}. To use this plan, {OWN}",
                dir.display(),
                devices.join(", ")
            ),
            OwnerError::Corrupt { path, detail } => format!(
                "{} is corrupt ({detail}), so which plan owns the state directory is not known; this command read the directory as it is and changed nothing. Restore it, or delete it to let the next `keyplan apply` of the plan that uses this directory claim it",
                path.display()
            ),
            OwnerError::Newer(_) | OwnerError::Io { .. } => format!(
                "{}. Which plan owns the state directory is not known; this command read the directory as it is and changed nothing",
                self.to_string().trim_end_matches(['.', ','])
            ),
        }
    }
}

/// The identity of `plan` as an owner: its plan file (directory canonical, name kept) and its
/// node (or host).
pub fn identity(plan: &Plan) -> (PathBuf, String) {
    (plan_file(&plan.source_path), plan.holder_node())
}

/// `path` with its directory made canonical and its file name kept.
fn plan_file(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match (abs.parent(), abs.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or(abs.clone()),
        _ => abs,
    }
}

/// Reads `<state_dir>/owner.json`; `None` when there is none (a new directory, or one an older
/// keyplan made).
///
/// Errors: [`OwnerError::Newer`] (a newer keyplan's file), [`OwnerError::Corrupt`],
/// [`OwnerError::Io`].
pub fn read(state_dir: &Path) -> Result<Option<Owner>, OwnerError> {
    let path = state_dir.join(OWNER_FILE);
    let bytes = match crate::format::state::read_file(&path) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(None),
        Err(source) => {
            return Err(OwnerError::Io {
                what: "reading",
                path,
                source,
            })
        }
    };
    match crate::format::state::files::read_owner(&path.display().to_string(), &bytes) {
        Ok(f) => Ok(Some(f.into())),
        Err(ReadError::Newer(n)) => Err(OwnerError::Newer(n)),
        Err(ReadError::Corrupt(detail)) => Err(OwnerError::Corrupt { path, detail }),
    }
}

/// Whether `plan` may use its state directory: yes when nobody owns it, when `plan` does, or
/// when the owning plan file no longer exists on the same node (the plan file moved). Reads
/// one file; writes nothing. Returns the owner record, if any.
///
/// Errors: [`OwnerError::OtherPlan`]; the owner file is corrupt or unreadable.
pub fn check(plan: &Plan) -> Result<Option<Owner>, OwnerError> {
    let Some(owner) = read(&plan.state_dir)? else {
        return unowned(plan).map(|()| None);
    };
    let (file, node) = identity(plan);
    let dir = canonical_dir(&plan.state_dir);
    let same_file = owner.plan == file
        || !owner.plan.exists()
        || (owner.state_dir != dir && moved_together(&owner, &file, &dir));
    if same_file && owner.node == node {
        return Ok(Some(owner));
    }
    Err(OwnerError::OtherPlan {
        dir: plan.state_dir.clone(),
        owner: Box::new(owner),
        plan: file,
        node,
    })
}

/// A state directory without an owner record (new, from before owner records, or its
/// `owner.json` removed by hand) may be used by `plan` unless its device registry lists devices
/// and none of them at a path of this plan's devices: then another plan's runs filled it (its
/// journal and holder id are that plan's), and taking it over would make that plan's KMS
/// holder record this plan's.
///
/// Errors: [`OwnerError::Unowned`]; an unreadable registry is not an error here (the
/// observation reports it).
fn unowned(plan: &Plan) -> Result<(), OwnerError> {
    let Ok(registry) = crate::world::registry::read(&plan.state_dir) else {
        return Ok(());
    };
    if registry.devices.is_empty() {
        return Ok(());
    }
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mine: Vec<PathBuf> = plan.devices.values().map(|d| canon(&d.path)).collect();
    if registry
        .devices
        .values()
        .any(|e| mine.contains(&canon(&e.path)))
    {
        return Ok(());
    }
    Err(OwnerError::Unowned {
        dir: plan.state_dir.clone(),
        devices: registry
            .devices
            .values()
            .map(|e| format!("{} ({})", e.id, e.path.display()))
            .collect(),
    })
}

/// Whether the plan file `file` and the state directory `dir` stand as `owner`'s plan file and
/// state directory did (the same file name, the directory at the same place under the plan
/// file's directory): the two were moved or copied together, so this is that plan.
fn moved_together(owner: &Owner, file: &Path, dir: &Path) -> bool {
    let (Some(was), Some(now)) = (owner.plan.parent(), file.parent()) else {
        return false;
    };
    owner.plan.file_name() == file.file_name()
        && matches!(
            (owner.state_dir.strip_prefix(was), dir.strip_prefix(now)),
            (Ok(a), Ok(b)) if a == b
        )
}

/// `dir` made absolute and canonical as far as it exists (a state directory not created yet).
fn canonical_dir(dir: &Path) -> PathBuf {
    let abs = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    std::fs::canonicalize(&abs).unwrap_or(abs)
}

/// Records `plan` as its state directory's owner (under the state lock, once a run is about to
/// write: [`crate::ops::apply::ApplySession::run`] and `resume`; an apply that is refused or
/// has nothing to do claims nothing): creates the directory (0700) and `owner.json` (0600, atomically), or updates the
/// record of a plan file that moved. A holder id the directory had before is kept in
/// [`Owner::former_holders`]. A no-op when the record already says all this.
///
/// Errors: as [`check`]; the file cannot be written.
pub fn claim(plan: &Plan) -> Result<Owner, OwnerError> {
    let old = check(plan)?;
    let (file, node) = identity(plan);
    let holder = plan.holder();
    let mut owner = match old.clone() {
        Some(o) => o,
        None => Owner {
            plan: file.clone(),
            node: node.clone(),
            state_dir: PathBuf::new(),
            holder: holder.clone(),
            former_holders: Vec::new(),
            since: crate::clock::now_unix(),
        },
    };
    owner.plan = file;
    owner.node = node;
    // Created by now (the state lock is in it), so canonical.
    owner.state_dir = canonical_dir(&plan.state_dir);
    if owner.holder != holder {
        let was = std::mem::replace(&mut owner.holder, holder);
        if !owner.former_holders.contains(&was) {
            owner.former_holders.push(was);
        }
    }
    if old.as_ref() == Some(&owner) {
        return Ok(owner);
    }
    fsutil::write_json_private(&plan.state_dir, OWNER_FILE, &OwnerV1::from(&owner)).map_err(
        |source| OwnerError::Io {
            what: "writing",
            path: plan.state_dir.join(OWNER_FILE),
            source,
        },
    )?;
    Ok(owner)
}
