//! The `file` KMS: a local directory key store (the embedded default).
//!
//! Layout, documented for operators in docs/operations.md ("File KMS layout"):
//!
//! ```text
//! <path>/                     mode 0700
//!   <key name>/               mode 0700, one directory per key
//!     meta.json               mode 0600: {"format":1,"current":N|null,"pending":N|null,
//!                             "versions":[{"version":N,"created_at":UNIX_SECONDS,"state":"current"|
//!                             "pending"|"previous"|"retired"}],
//!                             "holders":{"<node or host>:<state dir>":SINCE,...}}
//!                             (holders: the plans whose devices hold the key, Kms::hold)
//!     v<N>.key                mode 0600: the passphrase bytes of version N, exactly (no newline)
//!     .lock                   flock(2) taken around every read-modify-write
//! ```
//!
//! Every file is written atomically (temporary file in the same directory, `fsync`, `rename`,
//! `fsync` of the directory). A version's `.key` file is written before `meta.json` names it,
//! so `meta.json` never points at missing material; and removed before `meta.json` calls it
//! retired (`retire`; `destroy_key` removes every other version's file first, then records the
//! key destroyed, then removes the current version's file, and a `destroy_key` run again
//! finishes an interrupted one), so a version recorded as retired has no file left once the
//! call returns. [`Kms::lingering`] reports a retired version whose file is still there.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::book::{self, Commit, Destroy, VersionBook};
use super::{KeyState, Kms, KmsError, VersionInfo, VersionState};
use crate::format::kms::file::FileMeta;
use crate::format::kms::VersionEntry;
use crate::fsutil;
use crate::secret::Passphrase;

/// `meta.json` as the provider works on it; stored as [`FileMeta`]
/// (src/format/kms/file.rs, the layout and its version).
#[derive(Debug, Default)]
struct Meta {
    current: Option<u64>,
    pending: Option<u64>,
    versions: Vec<VersionInfo>,
    /// The plans holding the key ([`Kms::hold`]): holder id -> since (Unix seconds).
    holders: std::collections::BTreeMap<String, u64>,
}

impl From<FileMeta> for Meta {
    fn from(m: FileMeta) -> Meta {
        Meta {
            current: m.current,
            pending: m.pending,
            versions: m.versions.into_iter().map(VersionInfo::from).collect(),
            holders: m.holders,
        }
    }
}

impl From<&Meta> for FileMeta {
    fn from(m: &Meta) -> FileMeta {
        FileMeta {
            format: crate::format::kms::file::VERSION,
            current: m.current,
            pending: m.pending,
            versions: m.versions.iter().cloned().map(VersionEntry::from).collect(),
            holders: m.holders.clone(),
        }
    }
}

/// A file KMS rooted at a directory.
#[derive(Debug, Clone)]
pub struct FileKms {
    name: String,
    root: PathBuf,
}

impl FileKms {
    /// A file KMS named `name` (the plan's KMS instance name) rooted at `root` (created 0700
    /// on first write).
    pub fn new(name: &str, root: PathBuf) -> Self {
        FileKms {
            name: name.to_string(),
            root,
        }
    }

    fn key_dir(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn io(&self, what: String, source: io::Error) -> KmsError {
        KmsError::Io {
            kms: self.describe(),
            what,
            source,
        }
    }

    fn read_meta(&self, key: &str) -> Result<Meta, KmsError> {
        let path = self.key_dir(key).join("meta.json");
        match fs::read(&path) {
            Ok(bytes) => {
                let document = KmsError::document(self, key, &path.display().to_string());
                FileMeta::parse(&bytes, &document)
                    .map(Meta::from)
                    .map_err(|e| {
                        KmsError::of_read(self, key, e, |why| format!(
                            "{} is not valid: {why}; nothing was changed. Restore it from a backup or fix it by hand (see docs/operations.md, file KMS layout)",
                            path.display()
                        ))
                    })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Meta::default()),
            Err(e) => Err(self.io(format!("reading {}", path.display()), e)),
        }
    }

    fn write_meta(&self, key: &str, meta: &Meta) -> Result<(), KmsError> {
        let path = self.key_dir(key).join("meta.json");
        let text = FileMeta::from(meta).to_bytes();
        fsutil::write_atomic(&path, &text, 0o600)
            .map_err(|e| self.io(format!("writing {}", path.display()), e))
    }

    /// Removes the material files of `versions` in key directory `dir` (a missing one is fine:
    /// removed by an earlier, interrupted run), then syncs the directory.
    fn remove_material(&self, dir: &Path, versions: &[u64]) -> Result<(), KmsError> {
        for v in versions {
            let key_path = dir.join(format!("v{v}.key"));
            match fs::remove_file(&key_path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.io(format!("removing {}", key_path.display()), e)),
            }
        }
        fsutil::sync_dir(dir).map_err(|e| self.io(format!("syncing {}", dir.display()), e))
    }

    /// Runs `f` with the key directory created and its `.lock` held exclusively.
    fn locked<T>(
        &self,
        key: &str,
        f: impl FnOnce(&Path) -> Result<T, KmsError>,
    ) -> Result<T, KmsError> {
        let dir = self.key_dir(key);
        fsutil::ensure_private_dir(&self.root)
            .and_then(|()| fsutil::ensure_private_dir(&dir))
            .map_err(|e| self.io(format!("creating {}", dir.display()), e))?;
        let lock_path = dir.join(".lock");
        let lock = fsutil::open_lock_file(&lock_path)
            .map_err(|e| self.io(format!("opening {}", lock_path.display()), e))?;
        lock.lock()
            .map_err(|e| self.io(format!("locking {}", lock_path.display()), e))?;
        let guard = fsutil::FlockGuard::locked(lock);
        let out = f(&dir);
        drop(guard);
        out
    }
}

impl Meta {
    /// The version rules' view of this metadata.
    fn book(&self) -> VersionBook {
        VersionBook::of_entries(self.current, self.pending, &self.versions)
    }
}

impl Kms for FileKms {
    fn describe(&self) -> String {
        format!("file KMS {:?} ({})", self.name, self.root.display())
    }

    fn read(&self, name: &str) -> Result<KeyState, KmsError> {
        let meta = self.read_meta(name)?;
        for v in meta.current.iter().chain(meta.pending.iter()) {
            let path = self.key_dir(name).join(format!("v{v}.key"));
            if !path.is_file() {
                return Err(KmsError::Corrupt {
                    kms: self.describe(),
                    key: name.to_string(),
                    detail: format!(
                        "meta.json names v{v} as current or pending, but {} is missing; restore it from a backup (nothing was changed)",
                        path.display()
                    ),
                });
            }
        }
        Ok(KeyState {
            current: meta.current,
            pending: meta.pending,
            versions: meta.versions.into_iter().map(|v| (v.version, v)).collect(),
            holders: meta.holders,
        })
    }

    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        let path = self.key_dir(name).join(format!("v{version}.key"));
        match fs::read(&path) {
            Ok(bytes) if bytes.is_empty() => Err(KmsError::Corrupt {
                kms: self.describe(),
                key: name.to_string(),
                detail: format!("{} is empty", path.display()),
            }),
            Ok(bytes) => Ok(Passphrase::new(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(KmsError::NoSuchVersion {
                kms: self.describe(),
                key: name.to_string(),
                version,
            }),
            Err(e) => Err(self.io(format!("reading {}", path.display()), e)),
        }
    }

    fn stage(&self, name: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        self.locked(name, |dir| {
            let mut meta = self.read_meta(name)?;
            let version = meta
                .book()
                .stage(at_least)
                .map_err(|r| r.conflict(self, name))?;
            let key_path = dir.join(format!("v{version}.key"));
            fsutil::write_atomic(&key_path, material.expose(), 0o600)
                .map_err(|e| self.io(format!("writing {}", key_path.display()), e))?;
            crate::failpoint::check("kms.file.stage.after_material")
                .map_err(|e| self.io("staging".into(), io::Error::other(e)))?;
            meta.pending = Some(version);
            meta.versions.push(VersionInfo {
                version,
                created_at: crate::clock::now_unix(),
                state: VersionState::Pending,
            });
            self.write_meta(name, &meta)?;
            Ok(version)
        })
    }

    fn commit_as(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        self.locked(name, |_| {
            let mut meta = self.read_meta(name)?;
            if meta.current != Some(pending) {
                book::check_holders(self, name, &meta.holders, holder, pending)?;
            }
            let decision = meta.book().commit(expected_current, pending);
            let Commit::Go { previous } = decision.map_err(|r| r.conflict(self, name))? else {
                return Ok(());
            };
            (meta.current, meta.pending) =
                book::commit_states(&mut meta.versions, previous, pending);
            self.write_meta(name, &meta)
        })
    }

    fn hold(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        self.locked(name, |_| {
            let mut meta = self.read_meta(name)?;
            if meta.current.is_none() {
                return Err(super::book::no_current_to_hold(self, name, holder));
            }
            if meta.holders.contains_key(holder) {
                return Ok(());
            }
            meta.holders
                .insert(holder.to_string(), crate::clock::now_unix());
            self.write_meta(name, &meta)
        })
    }

    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        if !self.key_dir(name).join("meta.json").exists() {
            return Ok(());
        }
        self.locked(name, |_| {
            let mut meta = self.read_meta(name)?;
            if meta.holders.remove(holder).is_none() {
                return Ok(());
            }
            self.write_meta(name, &meta)
        })
    }

    fn retire(&self, name: &str, version: u64) -> Result<(), KmsError> {
        self.locked(name, |dir| {
            let mut meta = self.read_meta(name)?;
            meta.book()
                .retire(version)
                .map_err(|r| r.conflict(self, name))?;
            // The material goes first, then the record that says so: a run killed in between
            // leaves a `previous` version without its file (unreadable, as retired), never a
            // `retired` one whose file still opens a device. Retiring again finishes it.
            self.remove_material(dir, &[version])?;
            crate::failpoint::check("kms.file.retire.after_material")
                .map_err(|e| self.io("retiring".into(), io::Error::other(e)))?;
            book::retire_state(&mut meta.versions, version);
            self.write_meta(name, &meta)
        })
    }

    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError> {
        self.locked(name, |dir| {
            let mut meta = self.read_meta(name)?;
            let decision = meta.book().destroy(expected_current);
            let all: Vec<u64> = meta.versions.iter().map(|v| v.version).collect();
            if decision.map_err(|r| r.conflict(self, name))? == Destroy::NothingLeft {
                // Destroyed already, or a destroy killed after its record: finish it (the
                // record says every version is retired, so no file may remain).
                return self.remove_material(dir, &all);
            }
            // Every version but the current one first: the record still names the current
            // version, whose file is still there, so the key stays readable until the record
            // says it is gone; the current version's file goes right after that record.
            let others: Vec<u64> = all
                .iter()
                .copied()
                .filter(|v| Some(*v) != meta.current)
                .collect();
            self.remove_material(dir, &others)?;
            (meta.current, meta.pending) = book::destroy_states(&mut meta.versions);
            self.write_meta(name, &meta)?;
            crate::failpoint::check("kms.file.destroy.after_meta")
                .map_err(|e| self.io("destroying".into(), io::Error::other(e)))?;
            self.remove_material(dir, &all)
        })
    }

    fn lingering(&self, name: &str) -> Result<Vec<u64>, KmsError> {
        let meta = self.read_meta(name)?;
        Ok(meta
            .versions
            .iter()
            .filter(|v| v.state == VersionState::Retired)
            .map(|v| v.version)
            .filter(|v| self.key_dir(name).join(format!("v{v}.key")).exists())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(s: &str) -> Passphrase {
        Passphrase::new(s.as_bytes().to_vec())
    }

    /// The `.key` files left in key `k`'s directory under `root`.
    fn key_files(root: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(root.join("k"))
            .expect("key directory")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".key"))
            .collect();
        names.sort();
        names
    }

    /// A `destroy_key` killed after `meta.json` recorded the key destroyed (every version
    /// retired, none current; the current version's file still there, and, as an older
    /// keyplan left it, the previous version's too) is finished by the next `destroy_key`;
    /// `lingering` reports the leftover versions before and none after.
    #[test]
    fn destroy_key_again_finishes_a_destroy_killed_after_its_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kms = FileKms::new("t", dir.path().to_path_buf());
        for (material, expected) in [("first-passphrase", None), ("second-passphrase", Some(1))] {
            let v = kms.stage("k", &pass(material), 1).expect("stage");
            kms.commit("k", expected, v).expect("commit");
        }
        assert_eq!(kms.lingering("k").expect("lingering"), Vec::<u64>::new());
        // The state a kill right after the record leaves: meta.json says destroyed.
        let mut meta = kms.read_meta("k").expect("meta");
        (meta.current, meta.pending) = book::destroy_states(&mut meta.versions);
        kms.write_meta("k", &meta).expect("write meta");
        assert_eq!(key_files(dir.path()), ["v1.key", "v2.key"]);
        assert_eq!(kms.lingering("k").expect("lingering"), [1, 2]);
        assert!(kms.read("k").expect("read").current.is_none());

        kms.destroy_key("k", 2).expect("destroy_key again");
        assert_eq!(key_files(dir.path()), Vec::<String>::new());
        assert_eq!(kms.lingering("k").expect("lingering"), Vec::<u64>::new());
        for v in [1, 2] {
            assert!(matches!(
                kms.get("k", v),
                Err(KmsError::NoSuchVersion { version, .. }) if version == v
            ));
        }
        // Idempotent: nothing left, nothing to do.
        kms.destroy_key("k", 2).expect("destroy_key a third time");
    }

    /// `retire` removes the version's file; a file restored by hand afterwards (or left by a
    /// retire of an older keyplan that recorded first) is reported by `lingering`, and
    /// retiring the version again removes it.
    #[test]
    fn lingering_reports_a_retired_version_whose_file_is_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kms = FileKms::new("t", dir.path().to_path_buf());
        let mut current = None;
        for material in ["one-passphrase", "two-passphrase", "three-passphrase"] {
            let v = kms.stage("k", &pass(material), 1).expect("stage");
            kms.commit("k", current, v).expect("commit");
            current = Some(v);
        }
        let old = fs::read(dir.path().join("k/v1.key")).expect("v1");
        kms.retire("k", 1).expect("retire");
        assert_eq!(key_files(dir.path()), ["v2.key", "v3.key"]);
        assert_eq!(kms.lingering("k").expect("lingering"), Vec::<u64>::new());
        fs::write(dir.path().join("k/v1.key"), old).expect("restore v1");
        assert_eq!(kms.lingering("k").expect("lingering"), [1]);
        kms.retire("k", 1).expect("retire again");
        assert_eq!(key_files(dir.path()), ["v2.key", "v3.key"]);
        assert_eq!(kms.lingering("k").expect("lingering"), Vec::<u64>::new());
    }
}
