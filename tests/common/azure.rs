//! The Azure Key Vault stand-in for tests (`tests/standins/azure_key_vault.py`, Python 3
//! standard library: no Key Vault emulator can be had here), started per test on a port the
//! system chooses and killed on drop; a witness that reads and writes it directly over HTTP
//! (never through keyplan or the helper); and the example helper
//! `examples/azure-key-vault/keyplan-kms-azure` run against it.
//!
//! Without `python3`, [`AzureVault::start`] prints `skipped: ...` and returns `None`, unless
//! `KEYPLAN_REQUIRE_SERVERS=1`, where it panics.
#![allow(dead_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::standin::{python, Standin};

/// The example helper.
pub const HELPER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/azure-key-vault/keyplan-kms-azure"
);
const STANDIN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/standins/azure_key_vault.py"
);
/// The stand-in's tenant (a test value, nothing real).
pub const TENANT: &str = "00000000-test-tena-nt00-000000000000";
/// The stand-in's client id (a test value).
pub const CLIENT_ID: &str = "11111111-test-clie-nt00-000000000000";
/// The stand-in's client secret (a test value).
pub const CLIENT_SECRET: &str = "stand-in-client-secret-not-real";

/// One version of a secret, as the stand-in lists it.
#[derive(Debug, Clone)]
pub struct Version {
    /// Its version id (the last segment of its `id` URL).
    pub id: String,
    /// Is it enabled?
    pub enabled: bool,
    /// When it was created (Unix seconds).
    pub created: u64,
    /// Its tags.
    pub tags: serde_json::Map<String, serde_json::Value>,
}

/// A running stand-in (killed on drop).
pub struct AzureVault {
    /// The running stand-in (its port, log; [`Standin::stop`] kills it).
    pub standin: Standin,
}

impl AzureVault {
    /// A stand-in serving every request.
    pub fn start() -> Option<AzureVault> {
        AzureVault::start_with(&[])
    }

    /// A stand-in refusing every write (PUT, PATCH) with 403 `ForbiddenByRbac`.
    pub fn start_denying_writes() -> Option<AzureVault> {
        AzureVault::start_with(&["--deny-writes"])
    }

    /// A stand-in started with extra arguments (`--federated-token T`, `--page-size N`).
    pub fn start_with(extra: &[&str]) -> Option<AzureVault> {
        let mut args = vec!["--tenant", TENANT, "--client-id", CLIENT_ID];
        args.extend(["--client-secret", CLIENT_SECRET]);
        args.extend(extra);
        let standin = Standin::start("the Azure Key Vault stand-in and helper", STANDIN, &args)?;
        Some(AzureVault { standin })
    }

    /// The vault URL.
    pub fn url(&self) -> String {
        self.standin.url()
    }

    /// The stand-in's request log.
    pub fn log(&self) -> String {
        self.standin.log()
    }

    /// The environment the helper needs for this stand-in, with `client_secret`; the settle
    /// margin is 0 s (the helper still waits for the server's clock to pass the second of
    /// each record entry) unless `settle` says otherwise.
    pub fn helper_env(&self, client_secret: &str, settle: u32) -> Vec<(String, String)> {
        vec![
            ("AZURE_TENANT_ID".into(), TENANT.into()),
            ("AZURE_CLIENT_ID".into(), CLIENT_ID.into()),
            ("AZURE_CLIENT_SECRET".into(), client_secret.into()),
            ("AZURE_AUTHORITY_HOST".into(), format!("{}/", self.url())),
            ("KEYPLAN_AZURE_SETTLE_SECS".into(), settle.to_string()),
        ]
    }

    /// Writes `<dir>/<name>`, a script running the helper against this stand-in with
    /// `--prefix prefix` and the credentials in its environment (as a plan's `command` would
    /// with the variables set by the service manager).
    pub fn helper_script(
        &self,
        dir: &Path,
        name: &str,
        prefix: &str,
        client_secret: &str,
    ) -> PathBuf {
        let exports: String = self
            .helper_env(client_secret, 0)
            .iter()
            .map(|(k, v)| format!("export {k}='{v}'\n"))
            .collect();
        super::script(
            dir,
            name,
            &format!(
                "#!/bin/sh\n{exports}exec '{}' '{HELPER}' '{}' --prefix '{prefix}'\n",
                python(),
                self.url()
            ),
        )
    }

    /// Runs the helper once (prefix `prefix`, settle margin `settle`) with `request`; its
    /// JSON answer. Asserts it exited 0 with nothing on standard error.
    pub fn helper(&self, prefix: &str, settle: u32, request: &str) -> serde_json::Value {
        let mut child = Command::new(python())
            .args([HELPER, &self.url(), "--prefix", prefix])
            .envs(self.helper_env(CLIENT_SECRET, settle))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the helper");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(request.as_bytes())
            .expect("write the request");
        let out = child.wait_with_output().expect("wait");
        assert!(out.status.success(), "{out:?}");
        assert!(out.stderr.is_empty(), "{out:?}");
        serde_json::from_slice(&out.stdout).expect("one JSON answer")
    }

    /// One HTTP/1.1 request to the stand-in (with a bearer token, except to the token
    /// endpoint); status and JSON body (`null` when not JSON).
    fn request(&self, method: &str, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
        let oauth = path.contains("/oauth2/");
        let auth = if oauth {
            None
        } else {
            Some(format!("Bearer {}", self.token()))
        };
        let mut headers = vec![(
            "Content-Type",
            if oauth {
                "application/x-www-form-urlencoded"
            } else {
                "application/json"
            },
        )];
        headers.extend(auth.as_deref().map(|a| ("Authorization", a)));
        let (status, body) =
            self.standin
                .http(method, path, &headers, body.unwrap_or("").as_bytes());
        let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
        (status, json)
    }

    /// An access token, from the stand-in's token endpoint.
    pub fn token(&self) -> String {
        let (status, j) = self.request(
            "POST",
            &format!("/{TENANT}/oauth2/v2.0/token"),
            Some(&format!(
                "grant_type=client_credentials&client_id={CLIENT_ID}&client_secret={CLIENT_SECRET}&scope=https%3A%2F%2Fvault.azure.net%2F.default"
            )),
        );
        assert_eq!(status, 200, "{j}");
        j["access_token"].as_str().expect("a token").to_string()
    }

    /// Stores `value` as a new version of secret `name` (creating it), as Rook or an operator
    /// would; the new version's id.
    pub fn put(&self, name: &str, value: &str) -> String {
        let (status, j) = self.request(
            "PUT",
            &format!("/secrets/{name}?api-version=7.4"),
            Some(&serde_json::json!({ "value": value }).to_string()),
        );
        assert_eq!(status, 200, "{j}");
        j["id"]
            .as_str()
            .and_then(|id| id.rsplit('/').next())
            .expect("an id")
            .to_string()
    }

    /// Soft-deletes secret `name`.
    pub fn delete(&self, name: &str) {
        let (status, j) = self.request("DELETE", &format!("/secrets/{name}?api-version=7.4"), None);
        assert_eq!(status, 200, "{j}");
    }

    /// The value of version `version` of secret `name` (its latest version when `None`), as
    /// any Key Vault reader (Rook) gets it: `Err(status)` when refused (403: disabled; 404).
    pub fn get(&self, name: &str, version: Option<&str>) -> Result<String, u16> {
        let path = match version {
            Some(v) => format!("/secrets/{name}/{v}?api-version=7.4"),
            None => format!("/secrets/{name}?api-version=7.4"),
        };
        let (status, j) = self.request("GET", &path, None);
        if status != 200 {
            return Err(status);
        }
        Ok(j["value"].as_str().expect("a value").to_string())
    }

    /// Every version of secret `name`, oldest first (following `nextLink`).
    pub fn versions(&self, name: &str) -> Vec<Version> {
        let mut out = Vec::new();
        let mut path = format!("/secrets/{name}/versions?api-version=7.4");
        loop {
            let (status, j) = self.request("GET", &path, None);
            if status == 404 {
                break;
            }
            assert_eq!(status, 200, "{j}");
            for v in j["value"].as_array().expect("value") {
                out.push(Version {
                    id: v["id"]
                        .as_str()
                        .and_then(|id| id.rsplit('/').next())
                        .expect("id")
                        .to_string(),
                    enabled: v["attributes"]["enabled"].as_bool().expect("enabled"),
                    created: v["attributes"]["created"].as_u64().expect("created"),
                    tags: v["tags"].as_object().cloned().unwrap_or_default(),
                });
            }
            match j["nextLink"].as_str() {
                Some(next) => {
                    path = next
                        .strip_prefix(&self.url())
                        .expect("a link to the stand-in")
                        .to_string()
                }
                None => break,
            }
        }
        out.sort_by_key(|v| v.created);
        out
    }
}
