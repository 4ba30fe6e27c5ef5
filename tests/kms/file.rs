//! The file KMS against a real directory: stage/commit/retire cycle, compare-and-swap,
//! file modes.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use keyplan::kms::file::FileKms;
use keyplan::kms::{KeyState, Kms, KmsError};
use keyplan::secret::Passphrase;

use crate::common::kms_contract;

#[test]
fn provider_contract() {
    let dir = tempfile::tempdir().unwrap();
    let kms = FileKms::new("local", dir.path().join("keys"));
    let other = FileKms::new("local", dir.path().join("keys"));
    kms_contract::run(&kms, &other, "contract");
}

#[test]
fn stage_commit_retire_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let kms = FileKms::new("local", dir.path().join("keys"));
    assert_eq!(kms.read("k").unwrap(), KeyState::default());
    let v1 = kms
        .stage("k", &Passphrase::new(b"one".to_vec()), 1)
        .unwrap();
    assert_eq!(v1, 1);
    assert!(kms
        .stage("k", &Passphrase::new(b"again".to_vec()), 1)
        .is_err());
    kms.commit("k", None, 1).unwrap();
    kms.commit("k", None, 1).unwrap(); // idempotent
    let v2 = kms
        .stage("k", &Passphrase::new(b"two".to_vec()), 1)
        .unwrap();
    // Concurrent writer: CAS on a wrong expectation fails.
    assert!(matches!(
        kms.commit("k", Some(7), v2),
        Err(KmsError::Conflict { .. })
    ));
    kms.commit("k", Some(1), v2).unwrap();
    let st = kms.read("k").unwrap();
    assert_eq!(st.current, Some(2));
    assert_eq!(st.retained_previous(), vec![1]);
    assert_eq!(kms.get("k", 1).unwrap().expose(), b"one");
    kms.retire("k", 1).unwrap();
    kms.retire("k", 1).unwrap();
    assert!(kms.get("k", 1).is_err());
    assert!(kms.retire("k", 2).is_err());
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.path().join("keys")), 0o700);
    assert_eq!(mode(&dir.path().join("keys/k")), 0o700);
    assert_eq!(mode(&dir.path().join("keys/k/v2.key")), 0o600);
    assert_eq!(mode(&dir.path().join("keys/k/meta.json")), 0o600);
}
