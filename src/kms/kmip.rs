//! The `kmip` KMS provider (not implemented yet).

use super::{Kms, KmsError};
use crate::spec::KmsConfig;

/// Opens the `kmip` KMS instance `name`.
///
/// Errors: [`KmsError::Unsupported`] until the provider is built.
pub fn open(name: &str, config: &KmsConfig) -> Result<Box<dyn Kms>, KmsError> {
    Err(KmsError::Unsupported {
        name: name.to_string(),
        provider: config.provider().to_string(),
    })
}
