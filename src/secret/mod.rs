//! Key material in memory: [`Passphrase`]; and [`redact`], which keeps every form of known
//! material out of everything keyplan prints or writes.
//!
//! A passphrase is the byte string a LUKS keyslot is opened with. keyplan keeps it only in
//! memory, passes it to `cryptsetup` through pipes (stdin or an inherited pipe fd, never argv,
//! environment or files) and zeroizes it when dropped. It has no `Serialize` impl, and its
//! `Debug`/`Display` output is redacted, so it cannot reach logs, the journal or error messages
//! by accident. Every passphrase created is registered with [`redact`], so that material
//! quoted back by someone else (a KMS helper echoing its request in an error) is redacted at
//! every sink too.

use std::fmt;

use base64::Engine as _;
use rand::TryRngCore as _;
use zeroize::{Zeroize, ZeroizeOnDrop};

pub mod redact;

/// Secret bytes used as a LUKS passphrase (a KEK version from a KMS, or an `enroll_with` file).
///
/// Invariants: zeroized on drop; `Debug` and `Display` print `<redacted N bytes>`; never
/// serialized; registered with [`redact::register`] when created (every form of it is redacted
/// from keyplan's outputs). Cloning copies the bytes into a new zeroizing buffer.
#[derive(Clone, Zeroize, ZeroizeOnDrop, PartialEq, Eq)]
pub struct Passphrase(Vec<u8>);

impl Passphrase {
    /// Wraps `bytes` (taken by value so the caller keeps no copy) and registers them with
    /// [`redact::register`].
    pub fn new(bytes: Vec<u8>) -> Self {
        redact::register(&bytes);
        Passphrase(bytes)
    }

    /// Generates a new passphrase: `random_bytes` bytes from the operating system's CSPRNG
    /// (`getrandom(2)` through `rand::rngs::OsRng`), encoded as standard base64 text with
    /// padding, as docs/plan-file.md (`bytes`) specifies. 32 random bytes give 44 characters.
    /// Registered with [`redact::register`], as [`Passphrase::new`] does.
    ///
    /// Errors: the OS random source failed (reported as a string without key material).
    pub fn generate(random_bytes: usize) -> Result<Self, String> {
        let mut raw = zeroize::Zeroizing::new(vec![0u8; random_bytes]);
        rand::rngs::OsRng
            .try_fill_bytes(&mut raw)
            .map_err(|e| format!("the operating system's random source failed: {e}"))?;
        let text = base64::engine::general_purpose::STANDARD.encode(&*raw);
        Ok(Passphrase::new(text.into_bytes()))
    }

    /// The secret bytes. Callers must not copy them into non-zeroizing storage.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when the passphrase holds no bytes (cryptsetup refuses empty passphrases).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Passphrase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Passphrase(<redacted {} bytes>)", self.0.len())
    }
}

impl fmt::Display for Passphrase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<redacted {} bytes>", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_redact() {
        let p = Passphrase::new(b"hunter2-secret".to_vec());
        assert_eq!(format!("{p:?}"), "Passphrase(<redacted 14 bytes>)");
        assert_eq!(format!("{p}"), "<redacted 14 bytes>");
        assert!(!format!("{p:?}{p}").contains("hunter2"));
    }

    #[test]
    fn generate_is_base64_of_requested_length() {
        let p = Passphrase::generate(32).expect("os rng");
        assert_eq!(p.len(), 44);
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(p.expose())
            .expect("base64");
        assert_eq!(decoded.len(), 32);
        assert_ne!(p, Passphrase::generate(32).expect("os rng"));
    }

    #[test]
    fn created_passphrases_are_redacted_everywhere() {
        let generated = Passphrase::generate(24).expect("os rng");
        let read = Passphrase::new(b"read-from-a-kms-\x00\x01-9c1e".to_vec());
        for p in [&generated, &read] {
            let hex: String = p.expose().iter().map(|b| format!("{b:02X}")).collect();
            let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(p.expose());
            let text = format!(
                "echo: {} / {hex} / {url}",
                String::from_utf8_lossy(p.expose())
            );
            assert_eq!(
                redact::redact(&text),
                "echo: <redacted> / <redacted> / <redacted>"
            );
        }
    }
}
