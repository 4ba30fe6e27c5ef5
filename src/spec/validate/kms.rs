//! KMS instances (`kms.<name>`): valid names, the fields each provider needs, and paths
//! resolved against the plan's directory.

use std::collections::BTreeMap;
use std::path::Path;

use super::{empty_issue, name_issue, p, Ctx, Issue, KmsConfig, PathSeg, VaultAuth};

/// Checks every KMS instance, in name order, and returns them with their paths resolved.
///
/// Issues per instance, in this order: `keyplan::plan::name` (the name is not an id),
/// `keyplan::plan::duration` (a `timeout` that is not a duration from 1s to 1h), then those
/// of its provider (see [`resolve_kms`]).
pub(super) fn check_kms(
    instances: &BTreeMap<String, KmsConfig>,
    cx: &mut Ctx,
) -> BTreeMap<String, KmsConfig> {
    let mut kms = BTreeMap::new();
    for (name, cfg) in instances {
        if !super::syntax::is_id(name) {
            cx.push(name_issue(
                p(&["kms", name]),
                name,
                "KMS instance name",
                "invalid name",
            ));
        }
        if let Some(text) = cfg.timeout() {
            if let Err(message) = super::syntax::parse_kms_timeout(text) {
                cx.push(Issue {
                    path: p(&["kms", name, "timeout"]),
                    code: "keyplan::plan::duration",
                    message: format!("KMS `{name}`: {message}"),
                    label: "not a valid timeout".to_owned(),
                    help: "write a number and a unit from 1s to 1h, e.g. `30s`, `90s` or `2m`"
                        .to_owned(),
                    also: Vec::new(),
                });
            }
        }
        kms.insert(name.clone(), resolve_kms(name, cfg, cx));
    }
    kms
}

/// Instance `name` with its paths resolved against the plan's directory.
///
/// Issues: `keyplan::plan::empty` for the provider's blank required field (`path`, `address`,
/// `namespace`, `endpoint`, `region`, `command`), then `keyplan::plan::path` for each path that
/// resolves to non-UTF-8, in field order; `keyplan::plan::aws` for an AWS Secrets Manager
/// `prefix`, `region` or `endpoint` of the wrong shape ([`crate::spec::aws_names`]). A blank file-KMS
/// `path` is kept as written.
fn resolve_kms(name: &str, cfg: &KmsConfig, cx: &mut Ctx) -> KmsConfig {
    let at = |f: &str| p(&["kms", name, f]);
    let mut resolved = cfg.clone();
    match &mut resolved {
        KmsConfig::File { path } => {
            if path.trim().is_empty() {
                cx.push(empty_issue(
                    at("path"),
                    "path",
                    "set `path` to the directory that holds the keys, e.g. `keys`",
                ));
            } else {
                *path = cx.resolve_string(path, at("path"));
            }
        }
        KmsConfig::Vault {
            address,
            ca_cert,
            token_env,
            auth,
            ..
        } => {
            if address.trim().is_empty() {
                cx.push(empty_issue(
                    at("address"),
                    "address",
                    "set `address` to the Vault server URL, e.g. `http://127.0.0.1:8200`",
                ));
            }
            if let Some(c) = ca_cert {
                *c = cx.resolve_string(c, at("ca_cert"));
            }
            if token_env.as_deref().is_some_and(|t| t.trim().is_empty()) {
                cx.push(empty_issue(
                    at("token_env"),
                    "token_env",
                    "name the environment variable that holds the token, e.g. `VAULT_TOKEN`",
                ));
            }
            if let Some(a) = auth {
                if token_env.is_some() {
                    cx.push(auth_issue(
                        at("token_env"),
                        "`token_env` and `auth` are both set",
                        "given twice",
                        "move the variable into `auth: {method: token, token_env: ...}`, or drop `token_env` for a login method".to_owned(),
                    ));
                }
                resolve_vault_auth(a, address, &|f: &str| p(&["kms", name, "auth", f]), cx);
            }
        }
        KmsConfig::Kubernetes { namespace, .. } => {
            if namespace.trim().is_empty() {
                cx.push(empty_issue(
                    at("namespace"),
                    "namespace",
                    "set `namespace` to the namespace of the Secrets, e.g. `rook-ceph`",
                ));
            }
        }
        KmsConfig::Kmip {
            endpoint,
            ca_cert,
            client_cert,
            client_key,
            ..
        } => {
            if endpoint.trim().is_empty() {
                cx.push(empty_issue(
                    at("endpoint"),
                    "endpoint",
                    "set `endpoint` to the KMIP server's `host:port`",
                ));
            }
            *ca_cert = cx.resolve_string(ca_cert, at("ca_cert"));
            *client_cert = cx.resolve_string(client_cert, at("client_cert"));
            *client_key = cx.resolve_string(client_key, at("client_key"));
        }
        KmsConfig::AwsSecretsManager {
            region,
            endpoint,
            prefix,
            ..
        } => check_aws(
            name,
            region,
            endpoint.as_deref(),
            prefix.as_deref(),
            &at,
            cx,
        ),
        KmsConfig::Exec { command, .. } => resolve_exec(command, at, cx),
    }
    resolved
}

/// AWS Secrets Manager instance `name`'s settings: `keyplan::plan::empty` for a blank
/// `region`; `keyplan::plan::aws` for a `prefix`, `region` or `endpoint` of the wrong shape
/// ([`crate::spec::aws_names`]).
fn check_aws(
    name: &str,
    region: &str,
    endpoint: Option<&str>,
    prefix: Option<&str>,
    at: &dyn Fn(&str) -> Vec<PathSeg>,
    cx: &mut Ctx,
) {
    use crate::spec::aws_names::{endpoint_problem, prefix_problem, region_problem};
    if let Some(help) = prefix.and_then(prefix_problem) {
        cx.push(aws_issue(at("prefix"), name, "prefix", help));
    }
    if region.trim().is_empty() {
        cx.push(empty_issue(
            at("region"),
            "region",
            "set `region` to the AWS region of the secrets, e.g. `eu-west-1`",
        ));
    } else if let Some(help) = region_problem(region) {
        cx.push(aws_issue(at("region"), name, "region", help));
    }
    if let Some(help) = endpoint.and_then(endpoint_problem) {
        cx.push(aws_issue(at("endpoint"), name, "endpoint", help));
    }
}

/// The `keyplan::plan::aws` issue at `path`: AWS Secrets Manager instance `name`'s `field`
/// is unusable; `help` says why and what to write (`crate::spec::aws_names`).
fn aws_issue(path: Vec<PathSeg>, name: &str, field: &str, help: String) -> Issue {
    Issue {
        path,
        code: "keyplan::plan::aws",
        message: format!("KMS `{name}`: `{field}` is not usable by AWS Secrets Manager"),
        label: format!("not a valid {field}"),
        help,
        also: Vec::new(),
    }
}

/// The `keyplan::plan::vault_auth` issue at `path`.
fn auth_issue(path: Vec<PathSeg>, message: &str, label: &str, help: String) -> Issue {
    Issue {
        path,
        code: "keyplan::plan::vault_auth",
        message: message.to_owned(),
        label: label.to_owned(),
        help,
        also: Vec::new(),
    }
}

/// A Vault instance's `auth` (`at`: the path of one of its fields) with its files resolved
/// against the plan's directory.
///
/// Issues (`keyplan::plan::vault_auth`): AppRole without exactly one of `role_id` /
/// `role_id_file` or of `secret_id_file` / `secret_id_env`; certificate login on an address
/// that is not `https://`. `keyplan::plan::empty` for a blank `role`; `keyplan::plan::path` as
/// for every path.
fn resolve_vault_auth(
    auth: &mut VaultAuth,
    address: &str,
    at: &dyn Fn(&str) -> Vec<PathSeg>,
    cx: &mut Ctx,
) {
    let one_of = |a: bool, b: bool, fa: &str, fb: &str, what: &str, cx: &mut Ctx| {
        if a == b {
            let (message, label) = if a {
                (format!("`{fa}` and `{fb}` are both set"), "given twice")
            } else {
                (format!("AppRole login needs `{fa}` or `{fb}`"), "missing")
            };
            cx.push(auth_issue(
                at(if a { fb } else { "method" }),
                &message,
                label,
                format!("give the {what} once: `{fa}` or `{fb}`"),
            ));
        }
    };
    for (field, help) in blank_auth_fields(auth) {
        cx.push(empty_issue(at(field), field, help));
    }
    match auth {
        VaultAuth::Token { .. } => {}
        VaultAuth::Approle {
            role_id,
            role_id_file,
            secret_id_file,
            secret_id_env,
            ..
        } => {
            let what = "role ID (`role_id` itself, or a file holding it)";
            one_of(
                role_id.is_some(),
                role_id_file.is_some(),
                "role_id",
                "role_id_file",
                what,
                cx,
            );
            let what = "secret ID (a file or an environment variable holding it)";
            let (f, e) = (secret_id_file.is_some(), secret_id_env.is_some());
            one_of(f, e, "secret_id_file", "secret_id_env", what, cx);
            for (field, value) in [
                ("role_id_file", role_id_file),
                ("secret_id_file", secret_id_file),
            ] {
                if let Some(v) = value {
                    *v = cx.resolve_string(v, at(field));
                }
            }
        }
        VaultAuth::Kubernetes { role, jwt_file, .. } => {
            if role.trim().is_empty() {
                cx.push(empty_issue(
                    at("role"),
                    "role",
                    "set `role` to the Vault Kubernetes auth role bound to keyplan's service account",
                ));
            }
            if let Some(f) = jwt_file {
                *f = cx.resolve_string(f, at("jwt_file"));
            }
        }
        VaultAuth::Cert {
            client_cert,
            client_key,
            ..
        } => {
            if !address.trim().to_ascii_lowercase().starts_with("https://") {
                cx.push(auth_issue(
                    at("method"),
                    "certificate login needs an `https://` address",
                    "needs TLS",
                    "set `address` to the server's https:// URL (and `ca_cert` to its CA)"
                        .to_owned(),
                ));
            }
            *client_cert = cx.resolve_string(client_cert, at("client_cert"));
            *client_key = cx.resolve_string(client_key, at("client_key"));
        }
    }
}

/// The login fields of `auth` given but blank, each with what to do about it.
fn blank_auth_fields(auth: &VaultAuth) -> Vec<(&'static str, &'static str)> {
    let blank = |v: &Option<String>| v.as_deref().is_some_and(|t| t.trim().is_empty());
    let mut blanks: Vec<(&'static str, &'static str)> = Vec::new();
    match auth {
        VaultAuth::Token { token_env } => {
            if blank(token_env) {
                blanks.push(("token_env", "name the variable that holds the token"));
            }
        }
        VaultAuth::Approle {
            mount,
            role_id,
            role_id_file,
            secret_id_file,
            secret_id_env,
        } => {
            for (f, v) in [
                ("mount", mount),
                ("role_id", role_id),
                ("role_id_file", role_id_file),
                ("secret_id_file", secret_id_file),
                ("secret_id_env", secret_id_env),
            ] {
                if blank(v) {
                    blanks.push((f, "give a value, or leave the field out"));
                }
            }
        }
        VaultAuth::Kubernetes {
            mount, jwt_file, ..
        } => {
            for (f, v) in [("mount", mount), ("jwt_file", jwt_file)] {
                if blank(v) {
                    blanks.push((f, "give a value, or leave the field out for the default"));
                }
            }
        }
        VaultAuth::Cert { mount, name, .. } => {
            for (f, v) in [("mount", mount), ("name", name)] {
                if blank(v) {
                    blanks.push((f, "give a value, or leave the field out"));
                }
            }
        }
    }
    blanks
}

/// The exec provider's `command`: the program must be given and not blank
/// (`keyplan::plan::empty`); a program naming a relative path is resolved
/// (`keyplan::plan::path`).
fn resolve_exec(command: &mut [String], at: impl Fn(&str) -> Vec<PathSeg>, cx: &mut Ctx) {
    if command.first().is_none_or(|c| c.trim().is_empty()) {
        cx.push(empty_issue(
            at("command"),
            "command",
            "give the helper program's argv, e.g. `[/usr/local/bin/my-kms-helper]`",
        ));
    }
    // The program, like every path in the plan, is relative to the plan file when it names a
    // path (`./helper`, `bin/helper`); a bare name is looked up in `PATH` as a shell would.
    // Arguments are passed unchanged (docs/kms/exec.md).
    if let Some(program) = command.first_mut() {
        if program.contains('/') && !Path::new(program.as_str()).is_absolute() {
            *program = cx.resolve_string(program, at("command"));
        }
    }
}
