//! The `exec` provider's messages (protocol version 1, `docs/kms/exec.md`): the request
//! object keyplan writes to the helper's standard input, and the response objects it reads
//! back (envelope, error, the `result` of each operation).

use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::format::kms::VersionEntry;

/// The protocol version keyplan speaks (the `protocol_version` field of every request and
/// response; its home is src/format/kms/exec.rs). A response of a newer version is refused
/// with [`KmsError::NewerFormat`](crate::kms::KmsError::NewerFormat), an older one with
/// [`KmsError::Config`](crate::kms::KmsError::Config).
pub const PROTOCOL_VERSION: u64 = crate::format::kms::exec::VERSION;

/// The operation of one request, with its fields (serialized next to `operation`).
#[derive(Serialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub(super) enum Op<'a> {
    Check {
        names: &'a [String],
    },
    Read,
    Get {
        version: u64,
    },
    Stage {
        material_base64: &'a str,
        at_least: u64,
    },
    Commit {
        expected_current: Option<u64>,
        pending: u64,
        /// The plan committing: the helper refuses (`conflict`) while another holder is
        /// recorded. Absent: no holder check.
        #[serde(skip_serializing_if = "Option::is_none")]
        holder: Option<&'a str>,
    },
    Hold {
        holder: &'a str,
    },
    Release {
        holder: &'a str,
    },
    Retire {
        version: u64,
    },
    DestroyKey {
        expected_current: u64,
    },
    /// The credentials the helper uses, for `status` (optional: a helper that does not know
    /// it answers `config`).
    Credentials,
    /// The versions the store records as retired whose material it can still hand out, for
    /// `status` (optional: a helper that does not know it answers `config`).
    Lingering,
}

impl Op<'_> {
    /// The `operation` name sent, e.g. `stage`.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Op::Check { .. } => "check",
            Op::Read => "read",
            Op::Get { .. } => "get",
            Op::Stage { .. } => "stage",
            Op::Commit { .. } => "commit",
            Op::Hold { .. } => "hold",
            Op::Release { .. } => "release",
            Op::Retire { .. } => "retire",
            Op::DestroyKey { .. } => "destroy_key",
            Op::Credentials => "credentials",
            Op::Lingering => "lingering",
        }
    }

    /// Whether the operation changes what the KMS holds (after a successful one keyplan
    /// evaluates the `kms.after_write` injection point, crate::failpoint).
    pub(super) fn writes(&self) -> bool {
        matches!(
            self,
            Op::Stage { .. }
                | Op::Commit { .. }
                | Op::Hold { .. }
                | Op::Release { .. }
                | Op::Retire { .. }
                | Op::DestroyKey { .. }
        )
    }

    /// The version the operation names (for
    /// [`KmsError::NoSuchVersion`](crate::kms::KmsError::NoSuchVersion)).
    pub(super) fn version(&self) -> Option<u64> {
        match self {
            Op::Get { version } | Op::Retire { version } => Some(*version),
            Op::Commit { pending, .. } => Some(*pending),
            _ => None,
        }
    }
}

/// One request object.
#[derive(Serialize)]
pub(super) struct Request<'a, 'b> {
    pub(super) protocol_version: u64,
    #[serde(flatten)]
    pub(super) op: &'b Op<'a>,
    pub(super) kms: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) key: Option<&'a str>,
}

/// Serializes `request` into a buffer sized up front (JSON escaping at most sextuples a
/// string), so it is never reallocated, and zeroized on drop.
pub(super) fn encode_request(
    request: &Request<'_, '_>,
) -> Result<Zeroizing<Vec<u8>>, serde_json::Error> {
    let strings = request.kms.len()
        + request.key.map_or(0, str::len)
        + match request.op {
            Op::Check { names } => names.iter().map(|n| n.len() + 3).sum(),
            Op::Stage {
                material_base64, ..
            } => material_base64.len(),
            _ => 0,
        };
    let mut buf = Zeroizing::new(Vec::with_capacity(512 + 6 * strings));
    serde_json::to_writer(&mut *buf, request)?;
    buf.push(b'\n');
    Ok(buf)
}

/// The first look at a response: its protocol version only (everything else is skipped).
#[derive(Deserialize)]
pub(super) struct Head {
    pub(super) protocol_version: Option<serde_json::Value>,
}

/// A response of protocol version 1 whose `result` is an `R`.
#[derive(Deserialize)]
pub(super) struct Envelope<R> {
    pub(super) ok: bool,
    #[serde(default = "none")]
    pub(super) result: Option<R>,
    #[serde(default)]
    pub(super) error: Option<ErrorBody>,
}

fn none<R>() -> Option<R> {
    None
}

/// `error` of a failed response.
#[derive(Deserialize)]
pub(super) struct ErrorBody {
    pub(super) kind: String,
    #[serde(default)]
    pub(super) message: String,
}

/// `result` of `read`.
#[derive(Deserialize)]
pub(super) struct ReadResult {
    pub(super) current: Option<u64>,
    pub(super) pending: Option<u64>,
    pub(super) versions: Vec<VersionEntry>,
    /// The plans holding the key (holder id -> since, Unix seconds); absent: none.
    #[serde(default)]
    pub(super) holders: std::collections::BTreeMap<String, u64>,
}

/// `result` of `stage`.
#[derive(Deserialize)]
pub(super) struct StageResult {
    pub(super) version: u64,
}

/// `result` of `credentials`.
#[derive(Deserialize)]
pub(super) struct CredentialsResult {
    pub(super) credentials: Vec<HelperCredential>,
}

/// `result` of `lingering`: version numbers (any order; keyplan sorts them and drops
/// duplicates).
#[derive(Deserialize)]
pub(super) struct LingeringResult {
    pub(super) versions: Vec<u64>,
}

/// One credential a helper reports (the fields of [`crate::kms::Credential`]).
#[derive(Deserialize)]
pub(super) struct HelperCredential {
    pub(super) kind: String,
    pub(super) what: String,
    #[serde(default)]
    pub(super) expires_at: Option<u64>,
    #[serde(default)]
    pub(super) renewed_by: Option<String>,
    #[serde(default)]
    pub(super) renewable_until: Option<u64>,
}

/// `result` of `get` (zeroized on drop).
#[derive(Deserialize, Zeroize, ZeroizeOnDrop)]
pub(super) struct GetResult {
    pub(super) material_base64: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_the_documented_shape() {
        let names = vec!["a".to_string(), "b".to_string()];
        let cases: Vec<(Op<'_>, Option<&str>, serde_json::Value)> = vec![
            (
                Op::Check { names: &names },
                None,
                serde_json::json!({"protocol_version":1,"operation":"check","kms":"c","names":["a","b"]}),
            ),
            (
                Op::Read,
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"read","kms":"c","key":"k"}),
            ),
            (
                Op::Stage {
                    material_base64: "c2VjcmV0",
                    at_least: 3,
                },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"stage","kms":"c","key":"k","material_base64":"c2VjcmV0","at_least":3}),
            ),
            (
                Op::Commit {
                    expected_current: None,
                    pending: 1,
                    holder: None,
                },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"commit","kms":"c","key":"k","expected_current":null,"pending":1}),
            ),
            (
                Op::Commit {
                    expected_current: Some(1),
                    pending: 2,
                    holder: Some("node-a:/var/lib/keyplan"),
                },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"commit","kms":"c","key":"k","expected_current":1,"pending":2,"holder":"node-a:/var/lib/keyplan"}),
            ),
            (
                Op::Hold {
                    holder: "node-a:/var/lib/keyplan",
                },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"hold","kms":"c","key":"k","holder":"node-a:/var/lib/keyplan"}),
            ),
            (
                Op::Release {
                    holder: "node-a:/var/lib/keyplan",
                },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"release","kms":"c","key":"k","holder":"node-a:/var/lib/keyplan"}),
            ),
            (
                Op::DestroyKey {
                    expected_current: 4,
                },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"destroy_key","kms":"c","key":"k","expected_current":4}),
            ),
            (
                Op::Get { version: 2 },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"get","kms":"c","key":"k","version":2}),
            ),
            (
                Op::Retire { version: 1 },
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"retire","kms":"c","key":"k","version":1}),
            ),
            (
                Op::Lingering,
                Some("k"),
                serde_json::json!({"protocol_version":1,"operation":"lingering","kms":"c","key":"k"}),
            ),
            (
                Op::Credentials,
                None,
                serde_json::json!({"protocol_version":1,"operation":"credentials","kms":"c"}),
            ),
        ];
        check_requests_fixture(&cases);
        for (op, key, want) in cases {
            let buf = encode_request(&Request {
                protocol_version: 1,
                op: &op,
                kms: "c",
                key,
            })
            .expect("encode");
            let got: serde_json::Value = serde_json::from_slice(&buf).expect("json");
            assert_eq!(got, want);
        }
    }

    /// `tests/fixtures/formats/kms-exec-protocol/v1/<file>`.
    fn fixture_path(file: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/formats/kms-exec-protocol/v1")
            .join(file)
    }

    /// The requests of `cases`, as keyplan writes them (one line each), are the version-1
    /// fixture `requests.jsonl` byte for byte (`KEYPLAN_WRITE_FIXTURES=1` writes it afresh).
    fn check_requests_fixture(cases: &[(Op<'_>, Option<&str>, serde_json::Value)]) {
        let mut bytes = Vec::new();
        for (op, key, _) in cases {
            let buf = encode_request(&Request {
                protocol_version: PROTOCOL_VERSION,
                op,
                kms: "c",
                key: *key,
            })
            .expect("encode");
            bytes.extend_from_slice(&buf);
        }
        let path = fixture_path("requests.jsonl");
        if std::env::var_os("KEYPLAN_WRITE_FIXTURES").is_some_and(|v| v == "1") {
            std::fs::write(&path, &bytes).expect("write fixture");
        }
        let want = std::fs::read(&path).expect("requests.jsonl");
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            String::from_utf8_lossy(&want),
            "today's requests differ from the protocol's version-1 fixture"
        );
    }

    /// Every response of the version-1 fixture `responses.json` (one per operation, as
    /// docs/kms/exec.md gives them) reads with today's types.
    #[test]
    fn version_1_responses_read() {
        let text = std::fs::read(fixture_path("responses.json")).expect("responses.json");
        let all: Vec<serde_json::Value> = serde_json::from_slice(&text).expect("JSON list");
        for r in all {
            let op = r["operation"].as_str().expect("operation");
            let bytes = serde_json::to_vec(&r["response"]).expect("json");
            let head: Head = serde_json::from_slice(&bytes).expect("head");
            assert_eq!(
                head.protocol_version,
                Some(serde_json::Value::from(PROTOCOL_VERSION))
            );
            let ok = match op {
                "read" => {
                    let e: Envelope<ReadResult> = serde_json::from_slice(&bytes).expect(op);
                    let read = e.result.expect("result");
                    assert_eq!(read.versions.len(), 2);
                    assert!(read.holders.contains_key("node-a:/var/lib/keyplan"));
                    e.ok
                }
                "stage" => {
                    let e: Envelope<StageResult> = serde_json::from_slice(&bytes).expect(op);
                    assert_eq!(e.result.expect("result").version, 3);
                    e.ok
                }
                "get" => {
                    let e: Envelope<GetResult> = serde_json::from_slice(&bytes).expect(op);
                    assert!(!e.result.expect("result").material_base64.is_empty());
                    e.ok
                }
                "credentials" => {
                    let e: Envelope<CredentialsResult> = serde_json::from_slice(&bytes).expect(op);
                    assert_eq!(e.result.expect("result").credentials.len(), 1);
                    e.ok
                }
                "lingering" => {
                    let e: Envelope<LingeringResult> = serde_json::from_slice(&bytes).expect(op);
                    assert_eq!(e.result.expect("result").versions, [1]);
                    e.ok
                }
                "error" => {
                    let e: Envelope<serde_json::Value> = serde_json::from_slice(&bytes).expect(op);
                    assert_eq!(e.error.expect("error").kind, "conflict");
                    e.ok
                }
                _ => {
                    let e: Envelope<serde_json::Value> = serde_json::from_slice(&bytes).expect(op);
                    e.ok
                }
            };
            assert_eq!(ok, op != "error", "{op}");
        }
    }
}
