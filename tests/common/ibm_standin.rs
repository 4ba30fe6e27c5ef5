//! The local stand-in of IBM Key Protect and IAM (`tests/standins/ibm_key_protect.py`, Python 3
//! standard library), started per test on a free loopback port and killed on drop; and an
//! independent witness that reads its keys over its test hook (`/_standin/keys`), never through
//! keyplan or the helper. What the stand-in does not model is listed at its top.
//!
//! Without `python3` the start prints `skipped: ...` and returns `None`, unless
//! `KEYPLAN_REQUIRE_SERVERS=1`, where it panics.
#![allow(dead_code)]

use base64::Engine as _;

use super::standin::Standin;

/// The stand-in's script.
pub const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/standins/ibm_key_protect.py"
);

/// The instance id the stand-in serves.
pub const INSTANCE: &str = "5b4e2f0a-keyplan-test-instance";
/// An API key with the Manager role.
pub const MANAGER_KEY: &str = "test-api-key-manager-0123";
/// An API key with the Writer role (creates keys, cannot delete them).
pub const WRITER_KEY: &str = "test-api-key-writer-89ab";
/// An API key with the Reader role only.
pub const READER_KEY: &str = "test-api-key-reader-4567";

/// A running stand-in (killed on drop).
pub struct KeyProtect {
    /// The running stand-in (its port, log; [`Standin::stop`] kills it).
    pub standin: Standin,
}

impl KeyProtect {
    /// Starts a stand-in for the test `test` and waits for the line announcing its port.
    /// `None` (with a note) when python3 is missing and servers are not required.
    pub fn start(test: &str) -> Option<KeyProtect> {
        let manager = format!("{MANAGER_KEY}=Manager");
        let reader = format!("{READER_KEY}=Reader");
        let writer = format!("{WRITER_KEY}=Writer");
        let args = [
            "--instance",
            INSTANCE,
            "--api-key",
            &manager,
            "--api-key",
            &reader,
            "--api-key",
            &writer,
        ];
        let standin = Standin::start(test, SCRIPT, &args)?;
        Some(KeyProtect { standin })
    }

    /// `http://127.0.0.1:<port>`: Key Protect's and IAM's endpoint alike.
    pub fn url(&self) -> String {
        self.standin.url()
    }

    /// Every key the stand-in holds, deleted ones too, with payloads (the test hook).
    pub fn keys(&self) -> Vec<serde_json::Value> {
        let (status, body) = self.standin.http("GET", "/_standin/keys", &[], b"");
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        v["resources"].as_array().cloned().unwrap_or_default()
    }

    /// The key with alias `alias` (deleted or not), as the stand-in holds it.
    pub fn by_alias(&self, alias: &str) -> Option<serde_json::Value> {
        self.keys().into_iter().find(|k| {
            k["aliases"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == alias))
        })
    }

    /// The payload bytes of the key with alias `alias`; `None` when missing or deleted.
    pub fn payload(&self, alias: &str) -> Option<Vec<u8>> {
        let k = self.by_alias(alias)?;
        k["payload"].as_str().map(|p| {
            base64::engine::general_purpose::STANDARD
                .decode(p)
                .expect("payload base64")
        })
    }

    /// Is the key with alias `alias` deleted (crypto-shredded)?
    pub fn deleted(&self, alias: &str) -> bool {
        self.by_alias(alias)
            .is_some_and(|k| k["deleted"] == true && k["payload"].is_null())
    }

    /// The newest record of keyplan key `base` (`<prefix><name>`): the JSON of the key with
    /// the highest `<base>_s<K>` alias, read from the stand-in directly.
    pub fn record(&self, base: &str) -> Option<serde_json::Value> {
        let keys = self.keys();
        let head = keys
            .iter()
            .filter_map(|k| {
                let alias = k["aliases"][0].as_str()?;
                let n: u64 = alias.strip_prefix(&format!("{base}_s"))?.parse().ok()?;
                Some((n, k))
            })
            .max_by_key(|(n, _)| *n)?;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(head.1["payload"].as_str()?)
            .ok()?;
        serde_json::from_slice(&raw).ok()
    }

    /// The current version of keyplan key `base` and its material, read from the stand-in
    /// directly: the newest record's `current`, then that version's key (by the id the record
    /// names, or else by its alias `<base>_v<N>`). `None` while no version is current.
    pub fn current(&self, base: &str) -> Option<(u64, Vec<u8>)> {
        let rec = self.record(base)?;
        let v = rec["current"].as_u64()?;
        let entry = rec["versions"]
            .as_array()?
            .iter()
            .find(|e| e["version"] == v)?
            .clone();
        let material = match entry["id"].as_str() {
            Some(id) => self
                .keys()
                .into_iter()
                .find(|k| k["id"] == id)
                .and_then(|k| {
                    base64::engine::general_purpose::STANDARD
                        .decode(k["payload"].as_str()?)
                        .ok()
                }),
            None => self.payload(&format!("{base}_v{v}")),
        }?;
        Some((v, material))
    }

    /// Creates a standard key (as an operator or Rook-era tooling would, through the API with
    /// the Manager key): `name`, one alias, `payload` as its material.
    pub fn put_standard_key(&self, name: &str, alias: &str, payload: &[u8]) {
        let (status, body) = self.standin.http(
            "POST",
            "/identity/token",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            format!(
                "grant_type=urn%3Aibm%3Aparams%3Aoauth%3Agrant-type%3Aapikey&apikey={MANAGER_KEY}"
            )
            .as_bytes(),
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let token: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let token = token["access_token"].as_str().unwrap().to_string();
        let key = serde_json::json!({
            "metadata": {"collectionType": "application/vnd.ibm.kms.key+json", "collectionTotal": 1},
            "resources": [{"type": "application/vnd.ibm.kms.key+json", "name": name, "aliases": [alias],
                           "extractable": true,
                           "payload": base64::engine::general_purpose::STANDARD.encode(payload)}]
        });
        let auth = format!("Bearer {token}");
        let (status, body) = self.standin.http(
            "POST",
            "/api/v2/keys",
            &[
                ("Authorization", &auth),
                ("bluemix-instance", INSTANCE),
                ("Content-Type", "application/vnd.ibm.kms.key+json"),
            ],
            key.to_string().as_bytes(),
        );
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    }

    /// Arms the hang hook: the next key created with an alias containing `alias` and a
    /// payload containing `payload` hangs, `before` or `after` it is created.
    pub fn hang(&self, alias: &str, payload: &str, mode: &str) {
        let rule =
            serde_json::json!({"alias_contains": alias, "payload_contains": payload, "mode": mode});
        let (status, _) =
            self.standin
                .http("POST", "/_standin/hang", &[], rule.to_string().as_bytes());
        assert_eq!(status, 200);
    }

    /// Clears the hang hook; a hanging request's connection is closed without an answer.
    pub fn release(&self) {
        let (status, _) = self.standin.http("DELETE", "/_standin/hang", &[], b"");
        assert_eq!(status, 200);
    }
}
