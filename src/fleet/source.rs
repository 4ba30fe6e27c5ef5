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

use crate::fleet::error::FleetError;
use sha2::{Digest as _, Sha256};

/// The name of the kubelet's link to the current content of a ConfigMap volume.
pub const DATA_LINK: &str = "..data";

/// The plan file of a ConfigMap volume.
#[derive(Debug, Clone)]
pub struct PlanSource {
    path: PathBuf,
}

/// One read of the plan file (and its signature file, from the same ConfigMap version).
#[derive(Debug, Clone)]
pub struct PlanText {
    /// The file's text.
    pub text: String,
    /// SHA-256 of the text, hex (64 characters): identifies the plan version in reports.
    pub digest: String,
    /// The bytes of the signature file beside it (`<key>.sig`, [`super::signature`]), if the
    /// ConfigMap has one.
    pub signature: Option<Vec<u8>>,
}

impl PlanText {
    /// Identifies this read for change detection: the plan's digest, and the signature's
    /// when there is one (a plan signed again is read again).
    pub fn version(&self) -> String {
        match &self.signature {
            Some(sig) => format!("{}+{}", self.digest, hex(&Sha256::digest(sig))),
            None => self.digest.clone(),
        }
    }
}

impl PlanSource {
    /// The plan file at `path`, once it is known to be a key of a ConfigMap volume: its
    /// directory holds the `..data` link and `path` is a symlink into it.
    ///
    /// Errors: a text naming the path and saying why it is refused (missing, or not in a
    /// ConfigMap volume directory: a `subPath` mount or a plain file) and what to do.
    pub fn open(path: &Path) -> Result<PlanSource, FleetError> {
        let meta = std::fs::symlink_metadata(path).map_err(|e| {
            FleetError::File(format!("cannot read the plan {}: {e}", path.display()))
        })?;
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
            return Err(FleetError::File(format!(
                "the plan {} is not a file of a ConfigMap volume (no {DATA_LINK} link beside it, or the file is not a link into it): it looks like a subPath mount or a copied file, which never sees ConfigMap updates, so the agent would keep applying an old plan; mount the ConfigMap as a directory (a volume without subPath) and pass --plan <mount directory>/<key>",
                path.display()
            )));
        }
        Ok(PlanSource {
            path: path.to_path_buf(),
        })
    }

    /// The plan file's path (as given).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The signature file's name beside the plan (`<key>.sig`), for messages.
    pub fn signature_name(&self) -> String {
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!("{name}{}", super::signature::SUFFIX)
    }

    /// Reads the plan file now, and its signature file if there is one, both from the
    /// directory the `..data` link names at this instant: the kubelet swaps that link in one
    /// `rename(2)` and removes the old directory later, so the two files always come from the
    /// same version of the ConfigMap (a plan never meets the signature of another version).
    ///
    /// Errors: a text naming the file when it cannot be read (the old directory removed
    /// under the read: the next poll reads the new one) or is not UTF-8.
    pub fn read(&self) -> Result<PlanText, FleetError> {
        // The kubelet removes the old version's directory right after the swap: a read that
        // lost that race reads the new version.
        let mut result = self.read_once();
        for _ in 0..2 {
            match &result {
                Err((_, Some(version))) if self.current_version().as_ref() != Some(version) => {
                    result = self.read_once();
                }
                _ => break,
            }
        }
        result.map_err(|(e, _)| FleetError::File(e))
    }

    fn current_version(&self) -> Option<PathBuf> {
        let dir = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::read_link(dir.join(DATA_LINK)).ok()
    }

    /// One read; the error comes with the version directory it tried, if it got that far.
    fn read_once(&self) -> Result<PlanText, (String, Option<PathBuf>)> {
        let dir = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let data = dir.join(DATA_LINK);
        let version = std::fs::read_link(&data).map_err(|e| {
            (
                format!("cannot read the link {}: {e}", data.display()),
                None,
            )
        })?;
        let failed = |text: String| (text, Some(version.clone()));
        let version_dir = dir.join(&version);
        let name = self.path.file_name().unwrap_or_default();
        let bytes = std::fs::read(version_dir.join(name))
            .map_err(|e| failed(format!("cannot read the plan {}: {e}", self.path.display())))?;
        let sig_file = version_dir.join(self.signature_name());
        let signature = match std::fs::File::open(&sig_file) {
            Ok(f) => {
                use std::io::Read as _;
                let mut buf = Vec::new();
                f.take(super::signature::MAX_SIGNATURE_BYTES)
                    .read_to_end(&mut buf)
                    .map_err(|e| {
                        failed(format!(
                            "cannot read the signature {}: {e}",
                            sig_file.display()
                        ))
                    })?;
                Some(buf)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(failed(format!(
                    "cannot read the signature {}: {e}",
                    sig_file.display()
                )))
            }
        };
        let digest = hex(&Sha256::digest(&bytes));
        let text = String::from_utf8(bytes).map_err(|_| {
            failed(format!(
                "the plan {} is not UTF-8 text",
                self.path.display()
            ))
        })?;
        Ok(PlanText {
            text,
            digest,
            signature,
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
