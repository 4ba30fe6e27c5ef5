//! A real moto server for tests (`pip install 'moto[server]'`): `moto_server` on a free loopback
//! port, in a temp dir, killed on drop; and an independent reader (a small Python script using
//! boto3, which moto brings), so tests judge keyplan by what the server itself says.
//!
//! moto implements Secrets Manager's API (versions, staging labels, `RemoveFromVersionId`),
//! not IAM: every request is allowed (docs/kms/aws-secrets-manager.md, "What the tests do not
//! check"). Without `moto_server` or `python3` on `PATH`, [`Moto::start`] prints `skipped:
//! ...` and returns `None`, unless `KEYPLAN_REQUIRE_SERVERS=1`, where it panics.
#![allow(dead_code)]

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::pykmip::which;

/// A running moto server.
pub struct Moto {
    /// Holds the server's output.
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    /// The loopback port the server listens on.
    pub port: u16,
}

/// Skips (returns `None` with a note) or, under `KEYPLAN_REQUIRE_SERVERS=1`, fails.
fn skip_or_fail(why: &str) -> Option<Moto> {
    if std::env::var("KEYPLAN_REQUIRE_SERVERS").as_deref() == Ok("1") {
        panic!(
            "{why}; KEYPLAN_REQUIRE_SERVERS=1 requires moto's server (pip install 'moto[server]')"
        );
    }
    eprintln!("skipped: {why} (install with `pip install 'moto[server]'`)");
    None
}

const READER: &str = r#"
import sys, json, boto3
c = boto3.client("secretsmanager", endpoint_url=sys.argv[1], region_name="us-east-1",
                 aws_access_key_id="test", aws_secret_access_key="test")
op = sys.argv[2]
if op == "versions":
    try:
        vs = c.list_secret_version_ids(SecretId=sys.argv[3], IncludeDeprecated=True)["Versions"]
    except c.exceptions.ResourceNotFoundException:
        vs = []
    print(json.dumps([{"id": v["VersionId"], "labels": v.get("VersionStages", [])} for v in vs]))
elif op == "held":
    try:
        c.describe_secret(SecretId=sys.argv[3])
    except c.exceptions.ResourceNotFoundException:
        print("[]")
        sys.exit(0)
    out = []
    for v in c.list_secret_version_ids(SecretId=sys.argv[3], IncludeDeprecated=True)["Versions"]:
        if v.get("VersionStages"):
            r = c.get_secret_value(SecretId=sys.argv[3], VersionId=v["VersionId"])
            out.append({"id": v["VersionId"], "labels": v["VersionStages"], "value": r["SecretString"]})
    print(json.dumps(out))
elif op == "get":
    kw = {"SecretId": sys.argv[3], "VersionStage": "AWSCURRENT"}
    if len(sys.argv) > 4:
        kw = {"SecretId": sys.argv[3], "VersionId": sys.argv[4]}
    try:
        print(json.dumps(c.get_secret_value(**kw)["SecretString"]))
    except c.exceptions.ResourceNotFoundException:
        print("null")
elif op == "put":
    v = sys.stdin.read()
    try:
        c.put_secret_value(SecretId=sys.argv[3], SecretString=v)
    except c.exceptions.ResourceNotFoundException:
        c.create_secret(Name=sys.argv[3], SecretString=v)
    print("null")
elif op == "schedule-deletion":
    c.delete_secret(SecretId=sys.argv[3], RecoveryWindowInDays=7)
    print("null")
elif op == "label":
    c.update_secret_version_stage(SecretId=sys.argv[3], VersionStage=sys.argv[4],
                                  MoveToVersionId=sys.argv[5])
    print("null")
elif op == "restore":
    c.restore_secret(SecretId=sys.argv[3])
    print("null")
"#;

impl Moto {
    /// Starts a fresh server on a free loopback port and waits until it answers HTTP
    /// (about 2 s). `None` when skipped.
    pub fn start() -> Option<Moto> {
        Moto::start_with(&[])
    }

    /// A server that checks credentials against its own IAM from the first request on
    /// (`INITIAL_NO_AUTH_ACTION_COUNT=0`): the test credentials are unknown there, so every
    /// request is refused as Secrets Manager refuses an unknown access key.
    pub fn start_checking_credentials() -> Option<Moto> {
        Moto::start_with(&[("INITIAL_NO_AUTH_ACTION_COUNT", "0")])
    }

    fn start_with(env: &[(&str, &str)]) -> Option<Moto> {
        for bin in ["moto_server", "python3"] {
            if which(bin).is_none() {
                return skip_or_fail(&format!("{bin} not found in PATH"));
            }
        }
        let mut m = Moto {
            dir: tempfile::tempdir().expect("tempdir"),
            child: None,
            port: 0,
        };
        for _ in 0..3 {
            m.port = super::pykmip::free_port();
            if m.launch(env) {
                return Some(m);
            }
        }
        panic!("moto_server did not start; its output:\n{}", m.log());
    }

    fn launch(&mut self, env: &[(&str, &str)]) -> bool {
        let out = std::fs::File::create(self.dir.path().join("server.out")).expect("server.out");
        let err = out.try_clone().expect("dup");
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn moto_server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(_)) = c.try_wait() {
                    self.child = None;
                    return false;
                }
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop();
        false
    }

    /// Kills the server (its state is in memory: a restarted server is empty).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The server's output.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.out")).unwrap_or_default()
    }

    /// The endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment keyplan needs to reach it: static test credentials (moto accepts any).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ]
    }

    /// A plan's `kms:` entry named `name` for this server (region `us-east-1`).
    pub fn kms_yaml(&self, name: &str, prefix: &str) -> String {
        format!(
            "  {name}:\n    provider: aws_secrets_manager\n    region: us-east-1\n    endpoint: {}\n    prefix: {prefix:?}\n",
            self.endpoint()
        )
    }

    fn python(&self, args: &[&str], stdin: &[u8]) -> String {
        use std::io::Write as _;
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(READER)
            .arg(self.endpoint())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin)
            .expect("write stdin");
        let out = child.wait_with_output().expect("python3");
        assert!(
            out.status.success(),
            "boto3 reader {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Every version of secret `id` (deprecated ones included): `(version id, labels)`.
    pub fn versions(&self, id: &str) -> Vec<(String, Vec<String>)> {
        let v: serde_json::Value =
            serde_json::from_str(&self.python(&["versions", id], b"")).expect("json");
        v.as_array()
            .into_iter()
            .flatten()
            .map(|x| {
                (
                    x["id"].as_str().unwrap_or_default().to_string(),
                    x["labels"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|l| l.as_str().map(str::to_string))
                        .collect(),
                )
            })
            .collect()
    }

    /// Every version of secret `id` that carries a label: `(version id, labels, value)`, in
    /// one reader run; none when the secret does not exist. (An unlabelled version is
    /// deprecated: Secrets Manager deletes it at its own pace.)
    pub fn labelled(&self, id: &str) -> Vec<(String, Vec<String>, String)> {
        let v: serde_json::Value =
            serde_json::from_str(&self.python(&["held", id], b"")).expect("json");
        v.as_array()
            .into_iter()
            .flatten()
            .map(|x| {
                (
                    x["id"].as_str().unwrap_or_default().to_string(),
                    x["labels"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|l| l.as_str().map(str::to_string))
                        .collect(),
                    x["value"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// The `AWSCURRENT` value of secret `id` (or of version `vid`), as any reader gets it.
    pub fn get(&self, id: &str, vid: Option<&str>) -> Option<String> {
        let mut args = vec!["get", id];
        args.extend(vid);
        serde_json::from_str(&self.python(&args, b"")).expect("json")
    }

    /// Writes `value` as a new `AWSCURRENT` version of secret `id` (creating it), as an
    /// operator or another tool would.
    pub fn put(&self, id: &str, value: &str) {
        self.python(&["put", id], value.as_bytes());
    }

    /// Schedules secret `id` for deletion in 7 days (`DeleteSecret` with a recovery window),
    /// as an operator's mistake would.
    pub fn schedule_deletion(&self, id: &str) {
        self.python(&["schedule-deletion", id], b"");
    }

    /// Puts staging label `label` on version `vid` of secret `id` (`UpdateSecretVersionStage`).
    pub fn label(&self, id: &str, label: &str, vid: &str) {
        self.python(&["label", id, label, vid], b"");
    }

    /// Cancels the scheduled deletion of secret `id` (`RestoreSecret`).
    pub fn restore(&self, id: &str) {
        self.python(&["restore", id], b"");
    }

    /// Where the server's output is.
    pub fn out_path(&self) -> PathBuf {
        self.dir.path().join("server.out")
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        self.stop();
    }
}
