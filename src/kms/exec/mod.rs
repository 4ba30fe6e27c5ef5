//! The `exec` KMS provider: an external helper program speaking keyplan's JSON protocol,
//! version 1 (the public contract for helper authors is `docs/kms/exec.md`).
//!
//! For every operation keyplan starts the plan's `command` (argv, no shell; a program path
//! containing `/` was resolved against the plan file's directory by the spec loader, a bare
//! name is looked up in `PATH`), writes ONE JSON request object to its standard input and
//! closes it, and reads ONE JSON response object from its standard output:
//!
//! ```text
//! request:  {"protocol_version":1,"operation":"stage","kms":"custom","key":"osd-kek",
//!            "material_base64":"...","at_least":3}
//! response: {"protocol_version":1,"ok":true,"result":{"version":3}}
//!       or  {"protocol_version":1,"ok":false,"error":{"kind":"conflict","message":"..."}}
//! ```
//!
//! Key material travels only inside these two JSON documents (stdin/stdout pipes): never in
//! argv or the environment. The buffers holding them are zeroized after use. Standard error
//! is diagnostic: its last lines (at most [`STDERR_SHOWN_CHARS`] characters) are quoted in
//! errors. Everything quoted from the helper (its standard error, its error message, what the
//! JSON parser quotes) is redacted first, before it is cut or tidied, with
//! [`crate::secret::redact`]: every form of every material this process knows, the request's
//! own included.
//!
//! The helper runs in a process group of its own and dies with keyplan, as cryptsetup
//! children do ([`crate::child`]); duct starts it and waits for it with the deadline, while
//! keyplan's own threads feed its standard input and read its output into zeroizing buffers.
//! A start refused with `ETXTBSY` (the program file is being written, or was just written and
//! another thread forked meanwhile) is retried briefly. A helper that cannot be started
//! (missing, not executable) is a [`KmsError::Config`]; one that cannot be started for another
//! reason (no processes left, the file still busy after the retries), exits non-zero, is killed
//! by a signal, prints nothing, invalid JSON or a response that does not follow the protocol,
//! is [`KmsError::Unavailable`] naming the command; one that takes longer than the time limit
//! ([`timeout_of`]: the plan's `timeout`, [`TIMEOUT_ENV`] seconds, or
//! [`crate::kms::REQUEST_TIMEOUT`]; less when the call's deadline, retries included, ends
//! earlier: [`crate::kms::deadline`]) is [`KmsError::Timeout`], and its whole process group is
//! killed. `read`, `get`, `hold`, `release`, `retire`, `destroy_key`, `check` and `credentials` are
//! retried through [`crate::kms::with_retries`]; `stage` and `commit` never are.
//!
//! Files: this one holds the provider's rules (the [`Kms`] operations, which are retried, and
//! the consistency checks of a `read` answer); `helper.rs` one call of the helper (request,
//! run, response checks, error mapping); `process.rs` running the helper process (pipes,
//! threads, kill); `protocol.rs` the JSON messages. Imports run one way: this file uses
//! `helper.rs` and `protocol.rs`; `helper.rs` uses `process.rs` and `protocol.rs`.

mod helper;
mod process;
mod protocol;

use std::time::Duration;

use base64::Engine as _;
use serde::de::IgnoredAny;
use zeroize::Zeroizing;

use super::{with_retries, Credential, KeyState, Kms, KmsError, VersionState};
use crate::secret::Passphrase;
use crate::spec::KmsConfig;
use protocol::{
    CredentialsResult, GetResult, HelperCredential, LingeringResult, Op, ReadResult, StageResult,
};

pub use helper::{ExecKms, STDERR_SHOWN_CHARS, TIMEOUT_ENV};
pub use process::MAX_RESPONSE_BYTES;
pub use protocol::PROTOCOL_VERSION;

/// Opens the `exec` KMS instance `name` configured as `config` ([`KmsConfig::Exec`]). Starts
/// nothing: the helper runs once per operation. Its time limit is [`timeout_of`].
///
/// Errors: [`KmsError::Config`] for another provider's configuration, an empty `command`, or
/// an invalid `timeout` or [`TIMEOUT_ENV`] value.
pub fn open(name: &str, config: &KmsConfig) -> Result<Box<dyn Kms>, KmsError> {
    let KmsConfig::Exec { command, .. } = config else {
        return Err(KmsError::misrouted(name, config, "exec"));
    };
    let timeout = timeout_of(name, config)?;
    Ok(Box::new(ExecKms::new(name, command.clone(), timeout)?))
}

/// The time limit of one operation of exec KMS instance `name`: the plan's `timeout`, else
/// the one [`TIMEOUT_ENV`] sets, else [`crate::kms::REQUEST_TIMEOUT`].
///
/// Errors: [`KmsError::Config`] for an invalid `timeout` or [`TIMEOUT_ENV`] value.
pub fn timeout_of(name: &str, config: &KmsConfig) -> Result<Duration, KmsError> {
    if config.timeout().is_some() {
        return super::timeout_of(name, config);
    }
    let bad = |value: &str| {
        KmsError::Config {
        kms: format!("exec KMS {name:?}"),
        detail: format!(
            "{TIMEOUT_ENV}={value:?} is not a whole number of seconds from 1 to 3600; fix or unset it"
        ),
    }
    };
    match std::env::var(TIMEOUT_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(super::REQUEST_TIMEOUT),
        Err(std::env::VarError::NotUnicode(_)) => Err(bad("<not UTF-8>")),
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(secs @ 1..=3600) => Ok(Duration::from_secs(secs)),
            _ => Err(bad(&text)),
        },
    }
}

impl ExecKms {
    fn corrupt(&self, key: &str, detail: String) -> KmsError {
        KmsError::Corrupt {
            kms: self.describe(),
            key: key.to_string(),
            detail: format!(
                "the helper answered `read` inconsistently: {detail}; nothing was changed. Fix the helper or the data it reads"
            ),
        }
    }

    /// Checks that a `read` result is consistent (current and pending listed with their states,
    /// version numbers unique and positive) and turns it into a [`KeyState`].
    fn key_state(&self, key: &str, r: ReadResult) -> Result<KeyState, KmsError> {
        let mut state = KeyState {
            current: r.current,
            pending: r.pending,
            holders: r.holders,
            ..KeyState::default()
        };
        for v in r.versions {
            if v.version == 0 {
                return Err(self.corrupt(key, "version 0 listed (versions start at 1)".into()));
            }
            let number = v.version;
            if state.versions.insert(number, v.into()).is_some() {
                return Err(self.corrupt(key, format!("version {number} listed twice")));
            }
        }
        for (slot, wanted, name) in [
            (r.current, VersionState::Current, "current"),
            (r.pending, VersionState::Pending, "pending"),
        ] {
            match slot.map(|n| (n, state.versions.get(&n))) {
                Some((n, None)) => {
                    return Err(
                        self.corrupt(key, format!("{name} version {n} is not in `versions`"))
                    )
                }
                Some((n, Some(info))) if info.state != wanted => {
                    return Err(self.corrupt(
                        key,
                        format!("{name} version {n} is listed with state {:?}", info.state),
                    ))
                }
                _ => {}
            }
            let others: Vec<u64> = state
                .versions
                .values()
                .filter(|v| v.state == wanted && Some(v.version) != slot)
                .map(|v| v.version)
                .collect();
            if !others.is_empty() {
                return Err(self.corrupt(
                    key,
                    format!("versions {others:?} have state {name}, but `{name}` is {slot:?}"),
                ));
            }
        }
        if r.current.is_some() && r.current == r.pending {
            return Err(self.corrupt(key, "the same version is current and pending".into()));
        }
        Ok(state)
    }

    /// Checks one credential a helper reported and turns it into a [`Credential`]: `kind` must
    /// be 1 to [`KIND_MAX_CHARS`] lowercase letters, digits or `_` (it becomes a metrics
    /// label); `what` and `renewed_by` are shown as keyplan shows a helper's messages
    /// (redacted, one line, at most [`WHAT_MAX_CHARS`] characters).
    ///
    /// Errors: [`KmsError::Unavailable`] (the answer does not follow the protocol) for a bad
    /// `kind` or an empty `what`.
    fn credential(&self, c: HelperCredential) -> Result<Credential, KmsError> {
        let kind_ok = (1..=KIND_MAX_CHARS).contains(&c.kind.len())
            && c.kind
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        let what = helper::shown(&c.what, WHAT_MAX_CHARS);
        if !kind_ok || what.is_empty() {
            let kind = helper::shown(&c.kind, KIND_MAX_CHARS);
            return Err(KmsError::Unavailable {
                kms: self.describe(),
                detail: format!(
                    "operation `credentials`: the answer does not follow keyplan's exec protocol version 1 (docs/kms/exec.md): a credential needs a `kind` of 1 to {KIND_MAX_CHARS} lowercase letters, digits or '_' and a non-empty `what` (got kind {kind:?}); fix the helper"
                ),
            });
        }
        Ok(Credential {
            kind: c.kind.into(),
            what,
            expires_at: c.expires_at,
            renewed_by: c
                .renewed_by
                .map(|r| helper::shown(&r, WHAT_MAX_CHARS))
                .filter(|r| !r.is_empty()),
            renewable_until: c.renewable_until,
        })
    }
}

/// Most credentials an `exec` helper may report.
const MAX_CREDENTIALS: usize = 16;

/// Most versions a `lingering` answer may list (docs/kms/exec.md).
pub const MAX_LINGERING: usize = 1000;

/// Most characters of a credential `kind` an `exec` helper may report.
const KIND_MAX_CHARS: usize = 40;

/// Most characters of a credential's `what` (and `renewed_by`) shown from an `exec` helper.
const WHAT_MAX_CHARS: usize = 200;

impl Kms for ExecKms {
    /// `exec KMS "<name>" (<command line>)`.
    fn describe(&self) -> String {
        format!("exec KMS {:?} ({})", self.name, self.command_line())
    }

    /// The helper was asked to destroy it (docs/kms/exec.md, `retire`); stores that cannot
    /// destroy one version make it unreadable instead, as their helper documents.
    fn retired_means(&self) -> String {
        "the helper was asked to destroy its material (a store that cannot destroy a single version makes it unreadable instead: see the helper's documentation)".to_string()
    }

    fn read(&self, name: &str) -> Result<KeyState, KmsError> {
        let r = with_retries(&format!("read of key {name:?}"), || {
            self.call_for::<ReadResult>(&Op::Read, Some(name), None)
        })?;
        self.key_state(name, r)
    }

    fn get(&self, name: &str, version: u64) -> Result<Passphrase, KmsError> {
        let r = with_retries(&format!("get of key {name:?} version {version}"), || {
            self.call_for::<GetResult>(&Op::Get { version }, Some(name), None)
        })?;
        let engine = &base64::engine::general_purpose::STANDARD;
        let text = r.material_base64.as_bytes();
        let mut bytes = Zeroizing::new(vec![0u8; base64::decoded_len_estimate(text.len())]);
        let bad = |detail: &str| KmsError::Corrupt {
            kms: self.describe(),
            key: name.to_string(),
            detail: format!("the helper answered `get` of version {version} with {detail}"),
        };
        let n = engine.decode_slice(text, &mut bytes[..]).map_err(|_| {
            bad("`material_base64` that is not standard base64 (RFC 4648 §4, padded)")
        })?;
        if n == 0 {
            return Err(bad("empty material"));
        }
        bytes.truncate(n);
        Ok(Passphrase::new(std::mem::take(&mut *bytes)))
    }

    fn stage(&self, name: &str, material: &Passphrase, at_least: u64) -> Result<u64, KmsError> {
        let engine = &base64::engine::general_purpose::STANDARD;
        let len = base64::encoded_len(material.len(), true).ok_or_else(|| KmsError::Config {
            kms: self.describe(),
            detail: format!(
                "key {name:?}: material of {} bytes is too long",
                material.len()
            ),
        })?;
        let mut text = Zeroizing::new(vec![0u8; len]);
        let n = engine
            .encode_slice(material.expose(), &mut text[..])
            .map_err(|e| KmsError::Config {
                kms: self.describe(),
                detail: format!("key {name:?}: cannot encode the material: {e}"),
            })?;
        text.truncate(n);
        // Base64 output is ASCII; the fallback is never taken.
        let material_base64 = std::str::from_utf8(&text).unwrap_or_default();
        // Never retried: after an ambiguous failure the engine re-reads the key first.
        let r: StageResult = self.call_for(
            &Op::Stage {
                material_base64,
                at_least,
            },
            Some(name),
            Some(material.expose()),
        )?;
        if r.version == 0 || r.version < at_least {
            return Err(KmsError::Corrupt {
                kms: self.describe(),
                key: name.to_string(),
                detail: format!(
                    "the helper staged version {} although at least {at_least} was required (versions start at 1 and `at_least` must be honoured); inspect the key in the KMS and fix the helper before running keyplan again",
                    r.version
                ),
            });
        }
        Ok(r.version)
    }

    fn commit_as(
        &self,
        name: &str,
        expected_current: Option<u64>,
        pending: u64,
        holder: Option<&str>,
    ) -> Result<(), KmsError> {
        // Never retried: after an ambiguous failure the engine re-reads the key first.
        self.call::<IgnoredAny>(
            &Op::Commit {
                expected_current,
                pending,
                holder,
            },
            Some(name),
            None,
        )
        .map(drop)
    }

    fn hold(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        with_retries(&format!("hold of key {name:?}"), || {
            self.call::<IgnoredAny>(&Op::Hold { holder }, Some(name), None)
                .map(drop)
        })
    }

    fn release(&self, name: &str, holder: &str) -> Result<(), KmsError> {
        with_retries(&format!("release of key {name:?}"), || {
            self.call::<IgnoredAny>(&Op::Release { holder }, Some(name), None)
                .map(drop)
        })
    }

    fn retire(&self, name: &str, version: u64) -> Result<(), KmsError> {
        with_retries(&format!("retire of key {name:?} version {version}"), || {
            self.call::<IgnoredAny>(&Op::Retire { version }, Some(name), None)
                .map(drop)
        })
    }

    fn check(&self, names: &[String]) -> Result<(), KmsError> {
        with_retries("check", || {
            self.call::<IgnoredAny>(&Op::Check { names }, None, None)
                .map(drop)
        })
    }

    fn destroy_key(&self, name: &str, expected_current: u64) -> Result<(), KmsError> {
        with_retries(&format!("destroy_key of key {name:?}"), || {
            self.call::<IgnoredAny>(&Op::DestroyKey { expected_current }, Some(name), None)
                .map(drop)
        })
    }

    /// What the helper reports for `credentials` (docs/kms/exec.md). A helper that answers
    /// `config`, as helpers written before this operation answer an unknown one, reports
    /// none (its configuration errors surface at `read` and `check`).
    fn credentials(&self) -> Result<Vec<Credential>, KmsError> {
        let answer = with_retries("credentials", || {
            self.call_for::<CredentialsResult>(&Op::Credentials, None, None)
        });
        match answer {
            Ok(r) => {
                let list: Vec<Credential> = r
                    .credentials
                    .into_iter()
                    .map(|c| self.credential(c))
                    .collect::<Result<_, _>>()?;
                let mut kinds = std::collections::BTreeSet::new();
                let duplicate = list.iter().find(|c| !kinds.insert(c.kind.clone()));
                if list.len() > MAX_CREDENTIALS || duplicate.is_some() {
                    return Err(KmsError::Unavailable {
                        kms: self.describe(),
                        detail: format!(
                            "operation `credentials`: the answer does not follow keyplan's exec protocol version 1 (docs/kms/exec.md): at most {MAX_CREDENTIALS} credentials, each of its own `kind` (kinds are metrics labels){}; fix the helper",
                            duplicate.map_or(String::new(), |c| format!(", but kind {:?} comes twice", c.kind))
                        ),
                    });
                }
                Ok(list)
            }
            Err(KmsError::Config { detail, .. }) => {
                tracing::debug!(kms = %self.name, "the helper reports no credentials: {detail}");
                Ok(Vec::new())
            }
            Err(e) => Err(e),
        }
    }

    /// What the helper reports for `lingering` (docs/kms/exec.md): versions its store records
    /// as retired whose material it can still hand out. A helper that answers `config`, as
    /// helpers written before this operation answer an unknown one, cannot tell: none. More
    /// than [`MAX_LINGERING`] versions is a protocol violation (unavailable).
    fn lingering(&self, name: &str) -> Result<Vec<u64>, KmsError> {
        let answer = with_retries(&format!("lingering of key {name:?}"), || {
            self.call_for::<LingeringResult>(&Op::Lingering, Some(name), None)
        });
        match answer {
            Ok(r) if r.versions.len() > MAX_LINGERING => Err(KmsError::Unavailable {
                kms: self.describe(),
                detail: format!(
                    "operation `lingering` of key {name:?}: the answer lists {} versions; keyplan's exec protocol version 1 (docs/kms/exec.md) allows at most {MAX_LINGERING}; fix the helper",
                    r.versions.len()
                ),
            }),
            Ok(mut r) => {
                r.versions.sort_unstable();
                r.versions.dedup();
                Ok(r.versions)
            }
            Err(KmsError::Config { detail, .. }) => {
                tracing::debug!(kms = %self.name, "the helper cannot tell lingering material of {name:?}: {detail}");
                Ok(Vec::new())
            }
            Err(e) => Err(e),
        }
    }
}
