//! Where the agent reads its plan: a file of a ConfigMap volume, read by path at every cycle.
//!
//! The kubelet writes a ConfigMap volume as a directory holding a timestamped directory with
//! the files (`..2026_12_01_10_00_00.123456789/plan.yaml`), a symlink `..data` to it, and one
//! symlink per key (`plan.yaml -> ..data/plan.yaml`). An update writes a new timestamped
//! directory and swaps `..data` with one `rename(2)`, so a reader that opens `plan.yaml` by
//! path sees the old file or the new one, never a mix
//! (<https://kubernetes.io/docs/concepts/configuration/configmap/#mounted-configmaps-are-updated-automatically>).
//! A `subPath` mount of one key is a bind mount of the file as it was when the container
//! started: it never sees an update
//! (<https://kubernetes.io/docs/concepts/storage/volumes/#using-subpath>). An agent reading such
//! a file would keep applying the old plan forever, so [`PlanSource::open`] refuses any file
//! that is not a key of a ConfigMap volume.

use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

/// The name of the kubelet's link to the current content of a ConfigMap volume.
pub const DATA_LINK: &str = "..data";

/// The plan file of a ConfigMap volume.
#[derive(Debug, Clone)]
pub struct PlanSource {
    path: PathBuf,
}

/// One read of the plan file.
#[derive(Debug, Clone)]
pub struct PlanText {
    /// The file's text.
    pub text: String,
    /// SHA-256 of the text, hex (64 characters): identifies the plan version in reports.
    pub digest: String,
}

impl PlanSource {
    /// The plan file at `path`, once it is known to be a key of a ConfigMap volume: its
    /// directory holds the `..data` link and `path` is a symlink into it.
    ///
    /// Errors: a text naming the path and saying why it is refused (missing, or not in a
    /// ConfigMap volume directory: a `subPath` mount or a plain file) and what to do.
    pub fn open(path: &Path) -> Result<PlanSource, String> {
        let meta = std::fs::symlink_metadata(path)
            .map_err(|e| format!("cannot read the plan {}: {e}", path.display()))?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let data = dir.join(DATA_LINK);
        let via_data = meta.file_type().is_symlink()
            && std::fs::read_link(path).is_ok_and(|t| {
                t.components()
                    .next()
                    .is_some_and(|c| c.as_os_str() == DATA_LINK)
            });
        let data_is_link =
            std::fs::symlink_metadata(&data).is_ok_and(|m| m.file_type().is_symlink());
        if !(via_data && data_is_link) {
            return Err(format!(
                "the plan {} is not a file of a ConfigMap volume (no {DATA_LINK} link beside it, or the file is not a link into it): it looks like a subPath mount or a copied file, which never sees ConfigMap updates, so the agent would keep applying an old plan; mount the ConfigMap as a directory (a volume without subPath) and pass --plan <mount directory>/<key>",
                path.display()
            ));
        }
        Ok(PlanSource {
            path: path.to_path_buf(),
        })
    }

    /// The plan file's path (as given).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the plan file now (by path, through the current `..data` link).
    ///
    /// Errors: a text naming the file when it cannot be read or is not UTF-8.
    pub fn read(&self) -> Result<PlanText, String> {
        let bytes = std::fs::read(&self.path)
            .map_err(|e| format!("cannot read the plan {}: {e}", self.path.display()))?;
        let digest = hex(&Sha256::digest(&bytes));
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("the plan {} is not UTF-8 text", self.path.display()))?;
        Ok(PlanText { text, digest })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
