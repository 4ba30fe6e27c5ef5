//! The agent's own configuration, and what it lets a plan do (docs/fleet.md, "The plan is
//! untrusted input").
//!
//! A plan reaches a root agent on every node through a ConfigMap: whoever can write that
//! ConfigMap must not be able to make every node run a command as root, send passphrases to a
//! KMS of their choosing, or pick the credentials the agent logs in with. So the agent's
//! configuration file (`--config`, mounted from a ConfigMap or Secret only administrators
//! write) holds a `kms:` section in the plan file's format, and that section is the allow-list:
//!
//! - every KMS instance a plan defines must be defined in the agent configuration under the
//!   same name, with the same provider and the same **endpoint** fields (file `path`; vault
//!   `address`, `mount`, `namespace`; kubernetes `namespace`, `data_key`; kmip `endpoint`;
//!   exec `command`, the whole argv): an `exec` helper or a KMS endpoint the agent was not
//!   configured with is refused, and so is a plan naming an instance the agent does not know;
//! - the **credential** fields (vault `token_env`, `auth` and `ca_cert`; kubernetes `context`;
//!   kmip `ca_cert`, `client_cert`, `client_key`) are always the agent configuration's: the
//!   plan's are ignored, and the instance the engine opens is the agent's, whole.
//!
//! - a device's `enroll_with` file (a passphrase the root agent reads and uses) must be inside a
//!   directory of the agent configuration's `enroll_with_dirs` (symlinks resolved); without
//!   any, a plan may not use `enroll_with` at all (adopting keys already in the KMS, as for
//!   Rook, needs none). Otherwise a plan could make the agent try any file it can read (a
//!   service-account token, a Vault secret ID) as a passphrase.
//!
//! Paths in the agent configuration must be absolute (they are not relative to any plan).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::fleet::error::FleetError;
use crate::spec::{KmsConfig, Plan, VaultAuth};

/// The agent configuration file (`keyplan agent --config FILE`, YAML or JSON).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The KMS instances plans may use, by name, in the plan file's `kms:` format; with the
    /// credentials the agent uses for them.
    #[serde(default)]
    pub kms: BTreeMap<String, KmsConfig>,
    /// Directories (absolute) a plan's `enroll_with` passphrase files may be in.
    #[serde(default)]
    pub enroll_with_dirs: Vec<PathBuf>,
}

impl AgentConfig {
    /// Reads and checks the agent configuration at `path`.
    ///
    /// Errors: a text naming the file (and line, for a YAML error) and what is wrong: it cannot
    /// be read, does not parse, or a path in it is not absolute.
    pub fn load(path: &Path) -> Result<AgentConfig, FleetError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            FleetError::File(format!(
                "cannot read the agent configuration {}: {e}",
                path.display()
            ))
        })?;
        let config: AgentConfig = serde_saphyr::from_str(&text).map_err(|e| {
            FleetError::File(format!(
                "the agent configuration {} is not valid: {e}",
                path.display()
            ))
        })?;
        if let Some(d) = config.enroll_with_dirs.iter().find(|d| !d.is_absolute()) {
            return Err(FleetError::File(format!(
                "the agent configuration {}: enroll_with_dirs entry {:?} is not absolute",
                path.display(),
                d.display()
            )));
        }
        for (name, kms) in &config.kms {
            if let Some(p) = relative_path(kms) {
                return Err(FleetError::File(format!(
                    "the agent configuration {}: KMS instance {name:?}: path {p:?} is not absolute; paths in the agent configuration must be absolute",
                    path.display()
                )));
            }
        }
        Ok(config)
    }

    /// Checks `plan`'s KMS instances against the allow-list and puts the agent's instances in
    /// their place (with the agent's credentials). Touches nothing outside `plan`.
    ///
    /// Errors: one line per refused instance (not in the agent configuration, another
    /// provider, or another endpoint), naming the instance and the differing field; the plan
    /// is then not to be used at all.
    pub fn restrict(&self, plan: &mut Plan) -> Result<(), Vec<String>> {
        let mut refused = Vec::new();
        for (name, theirs) in &plan.kms {
            let Some(ours) = self.kms.get(name) else {
                refused.push(format!(
                    "KMS instance {name:?} ({} provider) is not in the agent's configuration; the agent only uses the KMS instances its own configuration lists ({})",
                    theirs.provider(),
                    if self.kms.is_empty() {
                        "none".to_string()
                    } else {
                        self.kms.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                ));
                continue;
            };
            if ours.provider() != theirs.provider() {
                refused.push(format!(
                    "KMS instance {name:?} is a {} KMS in the plan but a {} KMS in the agent's configuration",
                    theirs.provider(),
                    ours.provider()
                ));
                continue;
            }
            for (field, plan_value, agent_value) in endpoint_differences(theirs, ours) {
                refused.push(format!(
                    "KMS instance {name:?}: the plan's {field} {plan_value} is not the agent's {agent_value}; the agent only talks to the endpoints and runs the helpers its own configuration lists"
                ));
            }
        }
        refused.extend(self.enroll_with_problems(plan));
        if !refused.is_empty() {
            return Err(refused);
        }
        for (name, kms) in plan.kms.iter_mut() {
            if let Some(ours) = self.kms.get(name) {
                *kms = ours.clone();
            }
        }
        Ok(())
    }
}

impl AgentConfig {
    /// One line per device whose `enroll_with` file is outside `enroll_with_dirs`.
    fn enroll_with_problems(&self, plan: &Plan) -> Vec<String> {
        let dirs: Vec<PathBuf> = self
            .enroll_with_dirs
            .iter()
            .filter_map(|d| std::fs::canonicalize(d).ok())
            .collect();
        plan.devices
            .iter()
            .filter_map(|(id, d)| {
                let file = d.enroll_with.as_ref()?;
                let resolved = match std::fs::canonicalize(file) {
                    Ok(f) if f.is_file() => f,
                    Ok(_) => {
                        return Some(format!(
                            "device {id}: its enroll_with {} is not a file",
                            file.display()
                        ))
                    }
                    Err(e) => {
                        return Some(format!(
                            "device {id}: its enroll_with file {} cannot be read: {e}",
                            file.display()
                        ))
                    }
                };
                let inside = dirs.iter().any(|dir| resolved.starts_with(dir));
                (!inside).then(|| {
                    format!(
                        "device {id}: its enroll_with file {} is not inside a directory of the agent's enroll_with_dirs ({}); the agent reads passphrase files only from there",
                        file.display(),
                        if self.enroll_with_dirs.is_empty() {
                            "none".to_string()
                        } else {
                            self.enroll_with_dirs
                                .iter()
                                .map(|d| d.display().to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        }
                    )
                })
            })
            .collect()
    }
}

/// The endpoint fields of two instances of one provider that differ: `(field, plan's value,
/// agent's value)`, values quoted.
fn endpoint_differences(
    plan: &KmsConfig,
    agent: &KmsConfig,
) -> Vec<(&'static str, String, String)> {
    let mut out = Vec::new();
    let mut cmp = |field: &'static str, a: String, b: String| {
        if a != b {
            out.push((field, a, b));
        }
    };
    let q = |s: Option<&str>| match s {
        Some(s) => format!("{s:?}"),
        None => "(default)".to_string(),
    };
    match (plan, agent) {
        (KmsConfig::File { path: a }, KmsConfig::File { path: b }) => {
            cmp("path", format!("{:?}", clean(a)), format!("{:?}", clean(b)))
        }
        (
            KmsConfig::Vault {
                address: a,
                mount: am,
                namespace: an,
                ..
            },
            KmsConfig::Vault {
                address: b,
                mount: bm,
                namespace: bn,
                ..
            },
        ) => {
            cmp(
                "address",
                format!("{:?}", a.trim_end_matches('/')),
                format!("{:?}", b.trim_end_matches('/')),
            );
            cmp("mount", q(am.as_deref()), q(bm.as_deref()));
            cmp("namespace", q(an.as_deref()), q(bn.as_deref()));
        }
        (
            KmsConfig::Kubernetes {
                namespace: a,
                data_key: ad,
                ..
            },
            KmsConfig::Kubernetes {
                namespace: b,
                data_key: bd,
                ..
            },
        ) => {
            cmp("namespace", format!("{a:?}"), format!("{b:?}"));
            cmp("data_key", q(ad.as_deref()), q(bd.as_deref()));
        }
        (KmsConfig::Kmip { endpoint: a, .. }, KmsConfig::Kmip { endpoint: b, .. }) => {
            cmp("endpoint", format!("{a:?}"), format!("{b:?}"))
        }
        (
            KmsConfig::AwsSecretsManager {
                region: ar,
                endpoint: ae,
                prefix: ap,
                ..
            },
            KmsConfig::AwsSecretsManager {
                region: br,
                endpoint: be,
                prefix: bp,
                ..
            },
        ) => {
            // An endpoint with or without its root `/`, and an empty prefix or none, are the
            // same secrets on the same server.
            fn url(e: &Option<String>) -> Option<&str> {
                e.as_deref().map(|e| e.trim_end_matches('/'))
            }
            fn prefix(p: &Option<String>) -> Option<&str> {
                p.as_deref().filter(|p| !p.is_empty())
            }
            cmp("region", format!("{ar:?}"), format!("{br:?}"));
            cmp("endpoint", q(url(ae)), q(url(be)));
            cmp("prefix", q(prefix(ap)), q(prefix(bp)));
        }
        (KmsConfig::Exec { command: a, .. }, KmsConfig::Exec { command: b, .. }) => {
            cmp("command", format!("{a:?}"), format!("{b:?}"))
        }
        _ => {}
    }
    out
}

/// `p` without `.` components and trailing slashes, for comparing file KMS paths.
fn clean(p: &str) -> PathBuf {
    Path::new(p).components().collect()
}

/// The first path of `kms` that is not absolute, if any.
fn relative_path(kms: &KmsConfig) -> Option<String> {
    let mut paths: Vec<&str> = Vec::new();
    match kms {
        KmsConfig::File { path } => paths.push(path),
        KmsConfig::Vault { ca_cert, auth, .. } => {
            paths.extend(ca_cert.as_deref());
            match auth {
                Some(VaultAuth::Approle {
                    role_id_file,
                    secret_id_file,
                    ..
                }) => {
                    paths.extend(role_id_file.as_deref());
                    paths.extend(secret_id_file.as_deref());
                }
                Some(VaultAuth::Kubernetes { jwt_file, .. }) => paths.extend(jwt_file.as_deref()),
                Some(VaultAuth::Cert {
                    client_cert,
                    client_key,
                    ..
                }) => {
                    paths.push(client_cert);
                    paths.push(client_key);
                }
                Some(VaultAuth::Token { .. }) | None => {}
            }
        }
        KmsConfig::Kubernetes { .. } | KmsConfig::AwsSecretsManager { .. } => {}
        KmsConfig::Kmip {
            ca_cert,
            client_cert,
            client_key,
            ..
        } => paths.extend([ca_cert.as_str(), client_cert, client_key]),
        KmsConfig::Exec { command, .. } => {
            if let Some(program) = command.first().filter(|p| p.contains('/')) {
                paths.push(program);
            }
        }
    }
    paths
        .into_iter()
        .find(|p| !Path::new(p).is_absolute())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aws(region: &str, endpoint: Option<&str>, prefix: Option<&str>) -> KmsConfig {
        KmsConfig::AwsSecretsManager {
            region: region.into(),
            endpoint: endpoint.map(Into::into),
            prefix: prefix.map(Into::into),
            timeout: None,
        }
    }

    /// A plan's AWS Secrets Manager instance must name the agent's region, endpoint and
    /// prefix: another endpoint would receive the node's AWS credentials, another prefix
    /// reach other secrets.
    #[test]
    fn aws_instances_must_match_region_endpoint_and_prefix() {
        let agent = aws("eu-west-1", Some("https://vpce.example:443"), Some("ceph/"));
        let same = aws(
            "eu-west-1",
            Some("https://vpce.example:443/"),
            Some("ceph/"),
        );
        assert!(endpoint_differences(&same, &agent).is_empty());
        let fields = |plan: &KmsConfig| -> Vec<&str> {
            endpoint_differences(plan, &agent)
                .into_iter()
                .map(|(f, _, _)| f)
                .collect()
        };
        assert_eq!(
            fields(&aws(
                "eu-west-1",
                Some("https://evil.example"),
                Some("ceph/")
            )),
            ["endpoint"]
        );
        assert_eq!(fields(&aws("eu-west-1", None, Some("ceph/"))), ["endpoint"]);
        assert_eq!(
            fields(&aws(
                "us-east-1",
                Some("https://vpce.example:443"),
                Some("ceph/")
            )),
            ["region"]
        );
        assert_eq!(
            fields(&aws(
                "eu-west-1",
                Some("https://vpce.example:443"),
                Some("")
            )),
            ["prefix"]
        );
        let no_prefix = aws("eu-west-1", None, None);
        assert!(endpoint_differences(&aws("eu-west-1", None, Some("")), &no_prefix).is_empty());
    }
}
