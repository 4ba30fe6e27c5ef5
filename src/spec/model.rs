//! Plan file format version 1 (docs/plan-file.md): the raw serde model, exactly as written by the
//! user, in YAML or TOML. Unknown fields are errors everywhere. [`super::Plan`] is the validated,
//! resolved form the engine works with.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Lowest forced PBKDF2 iteration count cryptsetup accepts (2.6: "minimum is 1000").
pub(crate) const PBKDF2_MIN_ITERATIONS: u32 = 1000;
/// Lowest forced Argon2 time cost cryptsetup accepts (2.6: "minimum is 4").
pub(crate) const ARGON2_MIN_ITERATIONS: u32 = 4;
/// Argon2 memory cost limits in KiB that cryptsetup accepts (2.6: 32 KiB to 4 GiB).
pub(crate) const ARGON2_MEMORY_KIB: (u32, u32) = (32, 4 * 1024 * 1024);
/// The whole plan file as written (`version: 1`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanFile {
    /// Format version; only `1` exists.
    #[schemars(extend("const" = 1))]
    pub version: u32,
    /// Directory for the journal, lock and LUKS1 records. Default: `.keyplan` beside the plan
    /// file. Relative paths are relative to the plan file's directory.
    #[serde(default)]
    #[schemars(regex(pattern = NON_BLANK_PATTERN))]
    pub state_dir: Option<String>,
    /// KMS instances by name (ASCII letters, digits, `.`, `_`, `-`).
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": ID_PATTERN }))]
    pub kms: BTreeMap<String, KmsConfig>,
    /// Keys by id (ASCII letters, digits, `.`, `_`, `-`).
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": ID_PATTERN }))]
    pub keys: BTreeMap<String, KeyFile>,
    /// Devices by id (ASCII letters, digits, `.`, `_`, `-`).
    #[serde(default)]
    #[schemars(extend("propertyNames" = { "pattern": ID_PATTERN }))]
    pub devices: BTreeMap<String, DeviceFile>,
    /// Run-wide settings.
    #[serde(default)]
    pub settings: SettingsFile,
}

/// One KMS instance, selected by `provider`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(tag = "provider", rename_all = "lowercase", deny_unknown_fields)]
pub enum KmsConfig {
    /// Local directory key store (the embedded default). See `kms::file`.
    File {
        /// Directory holding the keys; created with mode 0700. Relative to the plan file.
        #[schemars(regex(pattern = NON_BLANK_PATTERN))]
        path: String,
    },
    /// HashiCorp Vault / OpenBao KV v2.
    Vault {
        /// Server URL, e.g. `http://127.0.0.1:8200`.
        #[schemars(regex(pattern = NON_BLANK_PATTERN))]
        address: String,
        /// KV v2 mount; default `secret`.
        #[serde(default)]
        mount: Option<String>,
        /// Name of the environment variable holding the token; default `VAULT_TOKEN`. The
        /// short form of `auth: {method: token, token_env: ...}`; not together with `auth`.
        #[serde(default)]
        token_env: Option<String>,
        /// How keyplan logs in (docs/kms/vault.md, "Authentication"); default: a token from
        /// `token_env`.
        #[serde(default)]
        auth: Option<VaultAuth>,
        /// Vault Enterprise namespace.
        #[serde(default)]
        namespace: Option<String>,
        /// CA certificate file (PEM) for TLS.
        #[serde(default)]
        ca_cert: Option<String>,
        /// How long keyplan waits for this KMS, e.g. `30s` or `2m` (1s to 1h; default `30s`):
        /// one call, all its requests and retries included; a KMS that did not answer in time
        /// is not asked again by the same command; and `plan`, `status`, `verify` and `key
        /// get` wait for it this long in all (docs/monitoring.md, "Deadlines").
        #[serde(default)]
        #[schemars(regex(pattern = DURATION_PATTERN))]
        timeout: Option<String>,
    },
    /// Kubernetes core/v1 Secrets.
    Kubernetes {
        /// Namespace of the Secrets.
        #[schemars(regex(pattern = NON_BLANK_PATTERN))]
        namespace: String,
        /// kubeconfig context; default: in-cluster config or `KUBECONFIG`.
        #[serde(default)]
        context: Option<String>,
        /// Secret data key holding the passphrase; default `dmcrypt-key` (Rook's).
        #[serde(default)]
        data_key: Option<String>,
        /// How long keyplan waits for this KMS, e.g. `30s` or `2m` (1s to 1h; default `30s`):
        /// one call, all its requests and retries included; a KMS that did not answer in time
        /// is not asked again by the same command; and `plan`, `status`, `verify` and `key
        /// get` wait for it this long in all (docs/monitoring.md, "Deadlines").
        #[serde(default)]
        #[schemars(regex(pattern = DURATION_PATTERN))]
        timeout: Option<String>,
    },
    /// KMIP server over mutual TLS.
    Kmip {
        /// `host:port`.
        #[schemars(regex(pattern = NON_BLANK_PATTERN))]
        endpoint: String,
        /// CA certificate (PEM).
        ca_cert: String,
        /// Client certificate (PEM).
        client_cert: String,
        /// Client private key (PEM).
        client_key: String,
        /// How long keyplan waits for this KMS, e.g. `30s` or `2m` (1s to 1h; default `30s`):
        /// one call, all its requests and retries included; a KMS that did not answer in time
        /// is not asked again by the same command; and `plan`, `status`, `verify` and `key
        /// get` wait for it this long in all (docs/monitoring.md, "Deadlines").
        #[serde(default)]
        #[schemars(regex(pattern = DURATION_PATTERN))]
        timeout: Option<String>,
    },
    /// AWS Secrets Manager (`kms::aws`, docs/kms/aws-secrets-manager.md): one secret per key,
    /// its versions carrying the staging labels `AWSPENDING`, `AWSCURRENT` and `AWSPREVIOUS`.
    /// Credentials come from the AWS SDK's default chain (environment, shared profile, web
    /// identity for IRSA, container and instance metadata).
    #[serde(rename = "aws_secrets_manager")]
    AwsSecretsManager {
        /// AWS region, e.g. `eu-west-1`.
        #[schemars(regex(pattern = NON_BLANK_PATTERN))]
        region: String,
        /// Endpoint URL instead of the region's public one
        /// (`https://secretsmanager.<region>.amazonaws.com`): a VPC endpoint, or a test
        /// server such as moto's.
        #[serde(default)]
        endpoint: Option<String>,
        /// Prefix of the secret names: key `k` is the secret `<prefix>k`; default none.
        #[serde(default)]
        prefix: Option<String>,
        /// How long keyplan waits for this KMS, e.g. `30s` or `2m` (1s to 1h; default `30s`):
        /// one call, all its requests and retries included; a KMS that did not answer in time
        /// is not asked again by the same command; and `plan`, `status`, `verify` and `key
        /// get` wait for it this long in all (docs/monitoring.md, "Deadlines").
        #[serde(default)]
        #[schemars(regex(pattern = DURATION_PATTERN))]
        timeout: Option<String>,
    },
    /// External program speaking a JSON protocol on stdin/stdout (`kms::exec`,
    /// docs/kms/exec.md).
    Exec {
        /// argv of the helper program. A program path containing `/` is relative to the plan
        /// file; a bare name is looked up in `PATH`. Arguments are passed unchanged.
        #[schemars(length(min = 1))]
        command: Vec<String>,
        /// How long keyplan waits for this KMS, e.g. `30s` or `2m` (1s to 1h; default `30s`, or `KEYPLAN_EXEC_TIMEOUT_SECS`):
        /// one call, all its requests and retries included; a KMS that did not answer in time
        /// is not asked again by the same command; and `plan`, `status`, `verify` and `key
        /// get` wait for it this long in all (docs/monitoring.md, "Deadlines").
        #[serde(default)]
        #[schemars(regex(pattern = DURATION_PATTERN))]
        timeout: Option<String>,
    },
}

/// How keyplan gets its Vault/OpenBao token, selected by `method`. Paths are relative to the
/// plan file. Login methods log in once per process, on the first request.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(tag = "method", rename_all = "lowercase", deny_unknown_fields)]
pub enum VaultAuth {
    /// A token from an environment variable (the default).
    Token {
        /// Name of the environment variable holding the token; default `VAULT_TOKEN`.
        #[serde(default)]
        token_env: Option<String>,
    },
    /// AppRole login (`POST auth/<mount>/login` with `role_id` and `secret_id`).
    Approle {
        /// Mount path of the AppRole auth method; default `approle`.
        #[serde(default)]
        mount: Option<String>,
        /// The role ID itself (not a secret); or use `role_id_file`.
        #[serde(default)]
        role_id: Option<String>,
        /// File holding the role ID; or use `role_id`.
        #[serde(default)]
        role_id_file: Option<String>,
        /// File holding the secret ID (read at login, never logged); or use `secret_id_env`.
        #[serde(default)]
        secret_id_file: Option<String>,
        /// Environment variable holding the secret ID; or use `secret_id_file`.
        #[serde(default)]
        secret_id_env: Option<String>,
    },
    /// Kubernetes login (`POST auth/<mount>/login` with the service account's JWT).
    Kubernetes {
        /// Mount path of the Kubernetes auth method; default `kubernetes`.
        #[serde(default)]
        mount: Option<String>,
        /// The Vault role bound to the service account.
        #[schemars(regex(pattern = NON_BLANK_PATTERN))]
        role: String,
        /// File holding the service account token (JWT), re-read at each login; default
        /// `/var/run/secrets/kubernetes.io/serviceaccount/token` (the projected token).
        #[serde(default)]
        jwt_file: Option<String>,
    },
    /// TLS certificate login (`POST auth/<mount>/login` over mutual TLS); `https://` only.
    Cert {
        /// Mount path of the TLS certificate auth method; default `cert`.
        #[serde(default)]
        mount: Option<String>,
        /// Certificate role to log in as; default: any role whose certificate matches.
        #[serde(default)]
        name: Option<String>,
        /// Client certificate (PEM).
        client_cert: String,
        /// Client private key (PEM, unencrypted).
        client_key: String,
    },
}

impl KmsConfig {
    /// The provider name as written in the plan file (`file`, `vault`, ...).
    pub fn provider(&self) -> &'static str {
        match self {
            KmsConfig::File { .. } => "file",
            KmsConfig::Vault { .. } => "vault",
            KmsConfig::Kubernetes { .. } => "kubernetes",
            KmsConfig::Kmip { .. } => "kmip",
            KmsConfig::AwsSecretsManager { .. } => "aws_secrets_manager",
            KmsConfig::Exec { .. } => "exec",
        }
    }

    /// The `timeout` as written, if the plan gives one (never for the file KMS).
    pub fn timeout(&self) -> Option<&str> {
        match self {
            KmsConfig::File { .. } => None,
            KmsConfig::Vault { timeout, .. }
            | KmsConfig::Kubernetes { timeout, .. }
            | KmsConfig::Kmip { timeout, .. }
            | KmsConfig::AwsSecretsManager { timeout, .. }
            | KmsConfig::Exec { timeout, .. } => timeout.as_deref(),
        }
    }
}

/// A key as written under `keys:`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KeyFile {
    /// Name of the KMS instance (a key of `kms:`).
    #[schemars(regex(pattern = ID_PATTERN))]
    pub kms: String,
    /// Name/path of the key in the KMS; default: the key's id.
    #[serde(default)]
    #[schemars(regex(pattern = NON_BLANK_PATTERN))]
    pub name: Option<String>,
    /// Rotate when the current version is older than this, e.g. `90d` (units s, m, h, d, w).
    #[serde(default)]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub rotate_after: Option<String>,
    /// Random bytes in a new version (default 32, at least 16, at most 512); the passphrase is
    /// their standard base64 text.
    #[serde(default)]
    #[schemars(range(min = 16, max = 512))]
    pub bytes: Option<usize>,
}

/// A device as written under `devices:`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceFile {
    /// Block device or LUKS image file. Relative to the plan file.
    #[schemars(regex(pattern = NON_BLANK_PATTERN))]
    pub path: String,
    /// Expected LUKS UUID; keyplan refuses to act on a device whose UUID differs.
    #[serde(default)]
    #[schemars(regex(pattern = NON_BLANK_PATTERN))]
    pub uuid: Option<String>,
    /// Keys that must open this device.
    #[serde(default)]
    pub keys: Vec<DeviceKeyFile>,
    /// What to do with keyslots keyplan cannot attribute to a managed key: `keep` (default),
    /// `remove`, or `{ keep: [N, ...] }` (remove all but the keyslots listed).
    #[serde(default)]
    pub unmanaged_keyslots: UnmanagedKeyslotsFile,
    /// File holding a passphrase that opens the device today (read whole, no newline
    /// stripping), used only to enroll keys no keyslot holds yet. Relative to the plan file.
    #[serde(default)]
    #[schemars(regex(pattern = NON_BLANK_PATTERN))]
    pub enroll_with: Option<String>,
    /// The Kubernetes node (its name) the device is on; default: the host keyplan runs on.
    /// `plan`/`apply`/`status` on a host act only on the devices of its node (`--node`).
    #[serde(default)]
    #[schemars(regex(pattern = NODE_NAME_PATTERN))]
    pub node: Option<String>,
}

/// An entry of a device's `keys:` list: a key id, or `{ key: ID, keyslot: N }` to pin.
//
// Serialized untagged; deserialized by hand (not `#[serde(untagged)]`) so that a bad pinned
// entry reports the real problem (e.g. an unknown field) at its place in the file, instead of
// serde's "data did not match any variant".
#[derive(Debug, Clone, Serialize, PartialEq, JsonSchema)]
#[serde(untagged)]
pub enum DeviceKeyFile {
    /// Just the key id; keyplan picks a free keyslot.
    Name(#[schemars(regex(pattern = ID_PATTERN))] String),
    /// Key pinned to a keyslot.
    Pinned(PinnedKeyFile),
}

impl<'de> Deserialize<'de> for DeviceKeyFile {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntryVisitor;

        impl<'de> serde::de::Visitor<'de> for EntryVisitor {
            type Value = DeviceKeyFile;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key id, or a mapping `{ key: ID, keyslot: N }`")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(DeviceKeyFile::Name(v.to_owned()))
            }

            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(DeviceKeyFile::Name(v))
            }

            // A plain YAML scalar such as `- 1234` arrives as a number: take it as the id text.
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(DeviceKeyFile::Name(v.to_string()))
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(DeviceKeyFile::Name(v.to_string()))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                PinnedKeyFile::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(DeviceKeyFile::Pinned)
            }
        }

        deserializer.deserialize_any(EntryVisitor)
    }
}

/// `{ key: ID, keyslot: N }`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PinnedKeyFile {
    /// Key id.
    #[schemars(regex(pattern = ID_PATTERN))]
    pub key: String,
    /// Keyslot number (LUKS1 0-7, LUKS2 0-31).
    #[serde(default)]
    #[schemars(range(max = 31))]
    pub keyslot: Option<u32>,
}

/// `unmanaged_keyslots: keep | remove`.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UnmanagedKeyslots {
    /// Leave keyslots keyplan did not create alone (default).
    #[default]
    Keep,
    /// Kill them, once a managed key has been verified to open the device.
    Remove,
}

/// `unmanaged_keyslots` as written: a word, or `{ keep: [N, ...] }`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, JsonSchema)]
#[serde(untagged)]
pub enum UnmanagedKeyslotsFile {
    /// `keep` or `remove`.
    Mode(UnmanagedKeyslots),
    /// `{ keep: [N, ...] }`: remove every unmanaged keyslot but these (keyslot numbers), e.g.
    /// the recovery passphrase's, once a managed key is verified on the device.
    KeepOnly(KeepOnlyFile),
}

/// `unmanaged_keyslots: { keep: [N, ...] }`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KeepOnlyFile {
    /// Keyslot numbers to keep (0-31; LUKS1 devices have 0-7).
    pub keep: Vec<u32>,
}

impl<'de> Deserialize<'de> for UnmanagedKeyslotsFile {
    /// A word (`keep`, `remove`) or a mapping `{ keep: [...] }`, with errors that say which
    /// forms are accepted (serde's untagged enums only say that none matched).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = UnmanagedKeyslotsFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`keep`, `remove` or `{ keep: [keyslot numbers] }`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                match v {
                    "keep" => Ok(UnmanagedKeyslotsFile::Mode(UnmanagedKeyslots::Keep)),
                    "remove" => Ok(UnmanagedKeyslotsFile::Mode(UnmanagedKeyslots::Remove)),
                    other => Err(E::unknown_variant(other, &["keep", "remove"])),
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                KeepOnlyFile::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(UnmanagedKeyslotsFile::KeepOnly)
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl Default for UnmanagedKeyslotsFile {
    fn default() -> UnmanagedKeyslotsFile {
        UnmanagedKeyslotsFile::Mode(UnmanagedKeyslots::Keep)
    }
}

impl UnmanagedKeyslotsFile {
    /// `Remove` for `remove` and for a keep list, else `Keep`.
    pub fn mode(&self) -> UnmanagedKeyslots {
        match self {
            UnmanagedKeyslotsFile::Mode(m) => *m,
            UnmanagedKeyslotsFile::KeepOnly(_) => UnmanagedKeyslots::Remove,
        }
    }

    /// The keyslots of a keep list (none for a word).
    pub fn kept(&self) -> &[u32] {
        match self {
            UnmanagedKeyslotsFile::Mode(_) => &[],
            UnmanagedKeyslotsFile::KeepOnly(k) => &k.keep,
        }
    }
}

/// `settings:`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SettingsFile {
    /// PBKDF for new keyslots; default: cryptsetup's own default (argon2id for LUKS2, pbkdf2 for
    /// LUKS1, 2 s), measured once per `apply` with `cryptsetup benchmark`.
    #[serde(default)]
    pub pbkdf: Option<PbkdfSettings>,
    /// Devices worked on at once (default 4, at least 1).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub parallelism: Option<usize>,
    /// KiB of memory the PBKDF runs of one `apply` may use at once, together (each argon2 run
    /// needs its keyslot's memory cost, plus about 16 MiB for cryptsetup itself). Default: half
    /// of the memory available when the run starts (`MemAvailable` of /proc/meminfo, or less
    /// when the cgroup's `memory.max` leaves less). Devices wait for memory rather than swap.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub memory_budget_kib: Option<u64>,
    /// Fleet mode (docs/fleet.md): how a rollout across nodes is bounded.
    #[serde(default)]
    pub fleet: Option<FleetFile>,
}

/// `settings.fleet:`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    /// Nodes applying changes at once, fleet-wide (default 1, at least 1): the number of
    /// rollout slots (Leases).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_concurrent_nodes: Option<u32>,
    /// Failed node runs after which no new node run starts, fleet-wide, until an operator
    /// clears them (default 1, at least 1).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_failed_nodes: Option<u32>,
    /// Kubernetes namespace of the rollout's Leases, reports and Events (default `keyplan`).
    #[serde(default)]
    #[schemars(regex(pattern = DNS_LABEL_PATTERN))]
    pub namespace: Option<String>,
}

/// PBKDF type, as cryptsetup's `--pbkdf` names it (cryptsetup(8), "--pbkdf").
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PbkdfType {
    /// Argon2id (LUKS2 only).
    Argon2id,
    /// Argon2i (LUKS2 only).
    Argon2i,
    /// PBKDF2 (LUKS1 and LUKS2).
    Pbkdf2,
}

/// `settings.pbkdf` (cryptsetup(8): `--pbkdf`, `--pbkdf-memory`, `--pbkdf-parallel`,
/// `--iter-time`, `--pbkdf-force-iterations`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(transform = pbkdf_limits)]
pub struct PbkdfSettings {
    /// PBKDF algorithm.
    #[serde(rename = "type")]
    pub kind: PbkdfType,
    /// Argon2 memory cost in KiB.
    #[serde(default)]
    pub memory_kib: Option<u32>,
    /// Argon2 parallel threads.
    #[serde(default)]
    pub parallel: Option<u32>,
    /// Target unlock time in milliseconds: keyplan runs `cryptsetup benchmark` once per `apply`
    /// and forces the iterations it measures on every new keyslot of that run.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub iter_time_ms: Option<u32>,
    /// Forced iteration count (PBKDF2 iterations, or Argon2 time cost); no benchmark.
    #[serde(default)]
    pub iterations: Option<u32>,
}

/// Pattern of KMS instance names, key ids and device ids (`spec::validate::syntax::is_id`).
pub const ID_PATTERN: &str = "^[A-Za-z0-9._-]+$";

/// Pattern of fields that must not be empty or blank (they are trimmed before the check in
/// `spec::validate`): at least one non-whitespace character.
pub const NON_BLANK_PATTERN: &str = r"\S";

/// Pattern of a Kubernetes node name, a DNS-1123 subdomain (at most 253 characters, checked by
/// `keyplan validate`): lowercase letters, digits, `-` and `.`, starting and ending with a
/// letter or digit (<https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#dns-subdomain-names>).
pub const NODE_NAME_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// Pattern of a Kubernetes namespace, a DNS-1123 label (at most 63 characters, checked by
/// `keyplan validate`).
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// Pattern of `rotate_after`: one or more `<number><unit>` parts (spaces allowed), units as
/// `spec::validate::syntax::parse_rotate_after` accepts them (s, m, h, d, w and their long
/// spellings). A zero duration matches but is refused by `keyplan validate`.
pub const DURATION_PATTERN: &str =
    r"^(\s*[0-9]+\s*(s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?|d|days?|w|weeks?))+\s*$";

/// The schema of `settings.pbkdf` gets the limits that depend on `type` (the same cryptsetup
/// limits `spec::validate` enforces): PBKDF2 needs at least 1000 iterations and takes no
/// `memory_kib` or `parallel`; Argon2 at least 4, a memory cost of 32 KiB to 4 GiB and at
/// least one thread; `iterations` and `iter_time_ms` do not go together.
fn pbkdf_limits(schema: &mut schemars::Schema) {
    let (mem_lo, mem_hi) = ARGON2_MEMORY_KIB;
    schema.insert(
        "if".to_owned(),
        serde_json::json!({ "properties": { "type": { "const": "pbkdf2" } } }),
    );
    schema.insert(
        "then".to_owned(),
        serde_json::json!({
            "properties": {
                "iterations": { "minimum": PBKDF2_MIN_ITERATIONS }
            },
            "not": { "anyOf": [ { "required": ["memory_kib"] }, { "required": ["parallel"] } ] }
        }),
    );
    schema.insert(
        "not".to_owned(),
        serde_json::json!({ "required": ["iterations", "iter_time_ms"] }),
    );
    schema.insert(
        "else".to_owned(),
        serde_json::json!({ "properties": {
            "iterations": { "minimum": ARGON2_MIN_ITERATIONS },
            "memory_kib": { "minimum": mem_lo, "maximum": mem_hi },
            "parallel": { "minimum": 1 }
        } }),
    );
}

/// The JSON Schema (draft 2020-12) of plan format version 1, generated from [`PlanFile`]: doc
/// comments become descriptions; unknown fields, provider tags, enum values, id and duration
/// patterns and numeric limits are as strict as `keyplan validate` where a schema can say so.
/// Checks that need more than one field at a time (undefined references, duplicates) are left
/// to `keyplan validate`. Committed as `schemas/keyplan-plan-v1.schema.json` (`tests/cli/schema.rs`
/// keeps it up to date).
pub fn plan_schema() -> serde_json::Value {
    let mut schema = schemars::generate::SchemaSettings::draft2020_12()
        .for_deserialize()
        .into_generator()
        .into_root_schema_for::<PlanFile>();
    schema.insert("$id".to_owned(), serde_json::json!(SCHEMA_ID));
    schema.insert(
        "title".to_owned(),
        serde_json::json!("keyplan plan file, format version 1"),
    );
    schema.to_value()
}

/// `$id` of the plan format version 1 schema.
pub const SCHEMA_ID: &str = "urn:keyplan:plan-format:1";
