//! keyplan's own access to its KMSs: the credentials each KMS client uses (a Vault token, a
//! client certificate, a service-account token), their expiry, and the warning when one ends
//! before the next rotation is due plus [`MARGIN`].
//!
//! Credential rotation has a circular dependency: if keyplan's credential lapses, the rotation
//! that would have noticed cannot run. So `status` makes an expiring credential a problem (exit
//! 1, the `keyplan_kms_credential_expiring` gauge, the bundled `KeyplanKmsCredentialExpiring`
//! alert) and `plan`/`apply` log the same warning, long before the expiry itself.
//!
//! The rule: a credential's [`Credential::deadline`] (its expiry, or for one that something
//! renews, the end of its renewals) must lie at least [`MARGIN`] after the later of now and
//! the earliest `rotation_due_at` of the KMS's keys. A renewed credential without a known end
//! of renewals never warns, unless it is already past its expiry (then nothing renewed it);
//! its expiry is still exported.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::Engine;
use crate::kms::{Credential, KeyState, KmsError};

/// How long before the next rotation is due a credential must still be valid: 14 days (the
/// time an operator needs to notice the warning and renew or replace the credential).
pub const MARGIN: Duration = Duration::from_secs(14 * 24 * 3600);

/// The credentials of one KMS instance and what `status` concludes about them.
#[derive(Debug, Clone, Serialize)]
pub struct KmsCredentials {
    /// KMS instance name from the plan.
    pub kms: String,
    /// Provider of that instance (`file`, `vault`, ...).
    pub provider: String,
    /// What the provider reports (empty for the `file` KMS, and for an `exec` helper that
    /// reports none).
    pub credentials: Vec<CredentialReport>,
    /// Why the credentials could not be looked at (never a secret).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// True when the KMS refused the credential itself (an expired or revoked token): a
    /// problem, not something unchecked.
    #[serde(skip)]
    pub refused: bool,
    /// The earliest `rotation_due_at` of the keys in this KMS, Unix seconds; `None` when no
    /// key has a `rotate_after` (or none has a current version yet).
    pub next_rotation_due_at: Option<u64>,
}

impl KmsCredentials {
    /// The warning lines, one per credential that ends too early.
    pub fn warnings(&self) -> impl Iterator<Item = &str> {
        self.credentials.iter().filter_map(|c| c.warning.as_deref())
    }
}

/// One credential and the verdict of the warning rule.
#[derive(Debug, Clone, Serialize)]
pub struct CredentialReport {
    /// What the provider reported.
    #[serde(flatten)]
    pub credential: Credential,
    /// [`Credential::deadline`], Unix seconds.
    pub deadline: Option<u64>,
    /// True when it ends too early (see the module documentation).
    pub expiring: bool,
    /// Why, when `expiring`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// Looks at the credentials of every KMS instance of the engine's plan, in plan order, and
/// applies the warning rule with `due` (key id → when its rotation is due, Unix seconds, as
/// [`rotation_due`] computes it; keys missing from it count as not due) at `now` (Unix
/// seconds). Writes nothing; may contact the KMSs (Vault's `auth/token/lookup-self`). Never
/// fails: an error is kept in [`KmsCredentials::error`].
pub fn review(engine: &Engine, due: &BTreeMap<String, u64>, now: u64) -> Vec<KmsCredentials> {
    let plan = engine.plan();
    let mut out = Vec::new();
    for (instance, config) in &plan.kms {
        let Some(kms) = engine.world().kms.get(instance) else {
            continue;
        };
        let due = next_rotation_due(engine, instance, due);
        let mut report = KmsCredentials {
            kms: instance.clone(),
            provider: config.provider().to_string(),
            credentials: Vec::new(),
            error: None,
            refused: false,
            next_rotation_due_at: due.as_ref().map(|(_, t)| *t),
        };
        match kms.credentials() {
            Ok(list) => {
                report.credentials = list
                    .into_iter()
                    .map(|c| {
                        let warning = warning(instance, &report.provider, &c, due.as_ref(), now);
                        CredentialReport {
                            deadline: c.deadline(),
                            expiring: warning.is_some(),
                            warning,
                            credential: c,
                        }
                    })
                    .collect();
            }
            Err(e) => {
                report.refused = matches!(e, KmsError::Denied { .. });
                report.error = Some(e.to_string());
            }
        }
        out.push(report);
    }
    out
}

/// Logs every warning of [`review`] at `warn` (what `plan` and `apply` do; `status` reports
/// them instead), and a failed look at `debug` (the KMS's own calls report it).
pub fn log_warnings(engine: &Engine, keys: &BTreeMap<String, KeyState>) {
    let due = rotation_due(engine, keys);
    for k in review(engine, &due, crate::clock::now_unix()) {
        for w in k.warnings() {
            tracing::warn!(kms = %k.kms, "{w}");
        }
        if let Some(e) = &k.error {
            if k.refused {
                tracing::warn!(kms = %k.kms, "keyplan's credentials were refused: {e}");
            } else {
                tracing::debug!(kms = %k.kms, "credentials not checked: {e}");
            }
        }
    }
}

/// When the rotation of each key of the engine's plan with a `rotate_after` and a current
/// version in `keys` (key id → state read from its KMS) is due: key id → Unix seconds.
pub fn rotation_due(engine: &Engine, keys: &BTreeMap<String, KeyState>) -> BTreeMap<String, u64> {
    engine
        .plan()
        .keys
        .values()
        .filter_map(|k| {
            let created = keys.get(&k.id)?.current_info()?.created_at;
            let due = created.saturating_add(k.rotate_after?.as_secs());
            Some((k.id.clone(), due))
        })
        .collect()
}

/// The key of `instance` whose rotation is due first, and when (Unix seconds).
fn next_rotation_due(
    engine: &Engine,
    instance: &str,
    due: &BTreeMap<String, u64>,
) -> Option<(String, u64)> {
    engine
        .plan()
        .keys
        .values()
        .filter(|k| k.kms == instance)
        .filter_map(|k| Some((k.id.clone(), *due.get(&k.id)?)))
        .min_by_key(|(_, t)| *t)
}

/// The warning for credential `c` of KMS `instance` (provider `provider`) at `now` when it
/// ends before the later of now and `due` (key id, Unix seconds) plus [`MARGIN`].
fn warning(
    instance: &str,
    provider: &str,
    c: &Credential,
    due: Option<&(String, u64)>,
    now: u64,
) -> Option<String> {
    // A renewed credential past its own expiry was not renewed: whoever should have (the
    // kubelet, a timer) did not, so it counts as expired whatever its end of renewals.
    let lapsed = c.renewed_by.is_some() && c.expires_at.is_some_and(|t| t <= now);
    let deadline = if lapsed { c.expires_at? } else { c.deadline()? };
    let reference = due.map_or(now, |(_, t)| (*t).max(now));
    if deadline >= reference.saturating_add(MARGIN.as_secs()) {
        return None;
    }
    // The provider's guide: docs/kms/vault.md, docs/kms/aws-secrets-manager.md, ...
    let doc = format!("docs/kms/{}.md", provider.replace('_', "-"));
    if deadline <= now {
        return Some(format!(
            "KMS {instance}: {} {} at {} ({} ago); keyplan cannot reach the KMS with it: replace it ({doc})",
            c.what,
            if c.renewed_by.is_some() && !lapsed { "could be renewed only until" } else { "expired" },
            timestamp(deadline),
            crate::diff::short_duration(Duration::from_secs(now - deadline)),
        ));
    }
    let ends = if c.renewed_by.is_some() {
        "can be renewed only until"
    } else {
        "expires at"
    };
    let before = match due {
        Some((key, t)) if *t > now => format!(
            "before the next rotation (key {key}, due {}) plus a {} margin",
            timestamp(*t),
            crate::diff::short_duration(MARGIN)
        ),
        Some((key, _)) => format!(
            "within {} while the rotation of key {key} is already due",
            crate::diff::short_duration(MARGIN)
        ),
        None => format!(
            "within {} (no rotation is scheduled)",
            crate::diff::short_duration(MARGIN)
        ),
    };
    Some(format!(
        "KMS {instance}: {} {ends} {} (in {}), {before}; renew or replace it before then ({doc})",
        c.what,
        timestamp(deadline),
        crate::diff::short_duration(Duration::from_secs(deadline - now)),
    ))
}

/// `2026-12-01T10:00:00Z` for Unix seconds `t`.
fn timestamp(t: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(t)).to_string()
}

/// Unix seconds of `t` (0 before the epoch); for providers turning a certificate's or token's
/// time into [`Credential::expires_at`].
pub fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400;
    const NOW: u64 = 1_800_000_000;

    fn token(expires_in_days: u64) -> Credential {
        Credential {
            kind: "vault_token".into(),
            what: "token from $VAULT_TOKEN".into(),
            expires_at: Some(NOW + expires_in_days * DAY),
            renewed_by: None,
            renewable_until: None,
        }
    }

    #[test]
    fn a_credential_ending_before_the_next_rotation_plus_margin_warns() {
        let due = ("osd".to_string(), NOW + 30 * DAY);
        let w = warning("vault", "vault", &token(40), Some(&due), NOW).expect("warns");
        assert!(w.contains("token from $VAULT_TOKEN expires at"), "{w}");
        assert!(w.contains("key osd"), "{w}");
        assert!(w.contains("docs/kms/vault.md"), "{w}");
        assert_eq!(warning("vault", "vault", &token(44), Some(&due), NOW), None);
        // The guide's file name has '-' where the provider's name has '_'.
        let w = warning("aws", "aws_secrets_manager", &token(1), None, NOW).expect("warns");
        assert!(w.contains("docs/kms/aws-secrets-manager.md"), "{w}");
    }

    #[test]
    fn without_a_due_rotation_the_margin_counts_from_now() {
        assert!(warning("v", "vault", &token(13), None, NOW).is_some());
        assert_eq!(warning("v", "vault", &token(15), None, NOW), None);
        // An overdue rotation counts from now as well.
        let overdue = ("osd".to_string(), NOW - DAY);
        let w = warning("v", "vault", &token(1), Some(&overdue), NOW).expect("warns");
        assert!(w.contains("already due"), "{w}");
    }

    #[test]
    fn a_renewed_credential_past_its_expiry_was_not_renewed() {
        let mut c = token(0);
        c.expires_at = Some(NOW - 3600);
        c.renewed_by = Some("the kubelet refreshes it".into());
        let w = warning("v", "exec", &c, None, NOW).expect("warns");
        assert!(w.contains("expired at"), "{w}");
        assert!(w.contains("docs/kms/exec.md"), "{w}");
        // Renewed and not yet expired, without a known end of renewals: no warning.
        c.expires_at = Some(NOW + 3600);
        assert_eq!(warning("v", "exec", &c, None, NOW), None);
    }

    #[test]
    fn an_expired_credential_says_so() {
        let mut c = token(0);
        c.expires_at = Some(NOW - 2 * 3600);
        let w = warning("v", "vault", &c, None, NOW).expect("warns");
        assert!(w.contains("expired at"), "{w}");
        assert!(w.contains("ago"), "{w}");
    }

    #[test]
    fn a_renewed_credential_warns_only_about_the_end_of_its_renewals() {
        let mut c = token(1);
        c.renewed_by = Some("keyplan renews it at each apply".into());
        assert_eq!(warning("v", "vault", &c, None, NOW), None, "no known end");
        c.renewable_until = Some(NOW + 5 * DAY);
        let w = warning("v", "vault", &c, None, NOW).expect("warns");
        assert!(w.contains("can be renewed only until"), "{w}");
    }

    #[test]
    fn a_credential_that_never_expires_never_warns() {
        let mut c = token(0);
        c.expires_at = None;
        assert_eq!(warning("v", "vault", &c, None, NOW), None);
    }
}
