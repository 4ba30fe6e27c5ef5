//! The `vault` provider's [`Kms::check`]: the token (reachability, validity), the mount's
//! engine (KV version 2), the token's capabilities on every path keyplan touches, and key
//! settings that would delete the current passphrase behind keyplan's back. Writes nothing.

use serde_json::Value;

use super::client::{Answer, CapabilitiesSelf, UiMount, VaultKms};
use super::layout::pending_path;
use crate::kms::{Kms, KmsError};

impl VaultKms {
    /// One attempt of [`Kms::check`]: token, mount, capabilities, key settings.
    pub(super) fn check_once(&self, names: &[String]) -> Result<(), KmsError> {
        self.check_token()?;
        self.check_mount()?;
        let mut wanted: Vec<(String, &'static [&'static str])> = Vec::new();
        for name in names {
            self.check_name(name)?;
            wanted.extend(self.required_capabilities(name));
        }
        if !wanted.is_empty() {
            self.check_capabilities(&wanted)?;
        }
        for name in names {
            self.check_delete_after(name)?;
        }
        Ok(())
    }

    /// Reachability and a valid token.
    /// <https://developer.hashicorp.com/vault/api-docs/auth/token#lookup-a-token-self>
    fn check_token(&self) -> Result<(), KmsError> {
        self.lookup_self().map(drop)
    }

    /// The mount is a KV version 2 engine.
    fn check_mount(&self) -> Result<(), KmsError> {
        let what = format!(
            "reading the engine of mount {:?} (GET sys/internal/ui/mounts/{})",
            self.mount, self.mount
        );
        let endpoint = UiMount {
            mount: self.mount.clone(),
        };
        let answer = self
            .request(
                &what,
                vaultrs::api::exec_with_result(self.client()?, endpoint),
            )
            .map_err(|e| match e {
                // Vault answers 403 ("preflight capability check") both for a mount that does
                // not exist and for one the token may use nothing under, even to root.
                KmsError::Denied { kms, .. } => KmsError::Denied {
                    kms,
                    detail: format!(
                        "{what}: HTTP 403: mount {:?} does not exist, or {} may use nothing under it; set `mount` to a KV version 2 mount, or grant the policy in docs/kms/vault.md",
                        self.mount, self.auth.token_origin()
                    ),
                },
                other => other,
            })?;
        let Answer::Ok(m) = answer else {
            return Err(KmsError::Config {
                kms: self.describe(),
                detail: format!(
                    "{what}: no such mount; set `mount` to a KV version 2 mount. Nothing was changed"
                ),
            });
        };
        let version = m
            .options
            .as_ref()
            .and_then(|o| o.get("version"))
            .map(String::as_str)
            .unwrap_or("1");
        if m.kind == "kv" && version == "2" {
            return Ok(());
        }
        Err(KmsError::Config {
            kms: self.describe(),
            detail: format!(
                "mount {:?} is a {:?} engine (version {version}), not KV version 2; enable one with `bao secrets enable -path={} kv-v2` or set `mount` to a KV v2 mount. Nothing was changed",
                self.mount, m.kind, self.mount
            ),
        })
    }

    /// The capabilities every operation needs, on every path it touches (`wanted`: path and
    /// capabilities), per `sys/capabilities-self`.
    fn check_capabilities(
        &self,
        wanted: &[(String, &'static [&'static str])],
    ) -> Result<(), KmsError> {
        let what = "checking the token's capabilities (POST sys/capabilities-self)";
        let endpoint = CapabilitiesSelf {
            paths: wanted.iter().map(|(p, _)| p.clone()).collect(),
        };
        let caps = match self.request(
            what,
            vaultrs::api::exec_with_result(self.client()?, endpoint),
        )? {
            Answer::Ok(c) => c,
            _ => return Err(self.unexpected(what)),
        };
        let mut missing = Vec::new();
        for (path, need) in wanted {
            let have: Vec<&str> = caps
                .get(path)
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if have.contains(&"root") {
                continue;
            }
            let lacking: Vec<String> = need
                .iter()
                .filter(|c| !have.contains(*c) || have.contains(&"deny"))
                .map(|c| format!("{c:?}"))
                .collect();
            if !lacking.is_empty() {
                missing.push(format!("{} on {path}", lacking.join(", ")));
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(KmsError::Denied {
            kms: self.describe(),
            detail: format!(
                "{} lacks capabilities keyplan needs (per sys/capabilities-self): {}; see docs/kms/vault.md for the policy",
                self.auth.token_origin(),
                missing.join("; ")
            ),
        })
    }

    /// Key settings that would delete the current passphrase behind keyplan's back.
    fn check_delete_after(&self, name: &str) -> Result<(), KmsError> {
        let Some(meta) = self.read_metadata(name)? else {
            return Ok(());
        };
        let after = meta.delete_version_after.trim();
        if after.is_empty() || after == "0s" || after == "0" {
            return Ok(());
        }
        Err(KmsError::Config {
            kms: self.describe(),
            detail: format!(
                "{}/metadata/{name} has delete_version_after={after}, which would soft-delete the current passphrase; set it to 0s (`bao kv metadata put -mount={} -delete-version-after=0s {name}`). Nothing was changed",
                self.mount, self.mount
            ),
        })
    }

    /// The capabilities keyplan's operations need on each path of key `name` (the minimal
    /// policy; docs/kms/vault.md shows it as HCL).
    fn required_capabilities(&self, name: &str) -> Vec<(String, &'static [&'static str])> {
        let m = &self.mount;
        let p = pending_path(name);
        vec![
            (format!("{m}/data/{name}"), &["create", "read", "update"]),
            (format!("{m}/metadata/{name}"), &["read", "delete"]),
            (format!("{m}/destroy/{name}"), &["update"]),
            (format!("{m}/data/{p}"), &["create", "read"]),
            (format!("{m}/metadata/{p}"), &["delete"]),
        ]
    }
}
