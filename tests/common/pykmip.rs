//! A real PyKMIP server for tests (`pip install pykmip`): a throw-away CA, server and client
//! certificates made with the `openssl` CLI, a `server.conf` (TLS 1.2, ECDHE-ECDSA-AES128-GCM,
//! client certificates required, SQLite database) and `pykmip-server` on a free loopback port,
//! all in a temp dir, killed on drop. Also an independent reader and writer: small Python
//! scripts using PyKMIP's own client (`kmip.pie.client.ProxyKmipClient`) with the client
//! certificate, so tests judge keyplan by what the server itself says.
//!
//! Without `pykmip-server`, `python3` or `openssl` on `PATH`, [`PyKmip::start`] prints
//! `skipped: ...` and returns `None`, unless `KEYPLAN_REQUIRE_SERVERS=1`, where it panics.
#![allow(dead_code)]

use std::io::Read as _;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running PyKMIP server and its credentials.
pub struct PyKmip {
    /// Holds the certificates, `server.conf`, the SQLite database and the logs.
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    /// The loopback port the server listens on.
    pub port: u16,
}

/// One object as PyKMIP's own client sees it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct PyObject {
    /// Unique identifier.
    pub uid: String,
    /// Name attribute values.
    pub names: Vec<String>,
    /// State, as PyKMIP's enum name (`PRE_ACTIVE`, `ACTIVE`, `DEACTIVATED`, ...).
    pub state: String,
    /// Object Group values.
    pub groups: Vec<String>,
    /// Cryptographic Algorithm enum name (`HMAC_SHA256`).
    pub algorithm: String,
    /// Cryptographic Length in bits.
    pub length: u64,
    /// The key material, base64.
    pub value: String,
}

impl PyObject {
    /// The key material bytes.
    pub fn bytes(&self) -> Vec<u8> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(&self.value)
            .expect("base64 from the reader")
    }
}

const READER: &str = r#"
import sys, json, base64, logging, warnings
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
from kmip.pie.client import ProxyKmipClient
from kmip.core import enums
host, port, cert, key, ca = sys.argv[1:6]
c = ProxyKmipClient(hostname=host, port=int(port), cert=cert, key=key, ca=ca,
                    config_file="/dev/null", kmip_version=enums.KMIPVersion.KMIP_1_2)
out = []
with c:
    for uid in c.locate():
        _, attrs = c.get_attributes(uid, ["Name", "State", "Object Group"])
        names = [a.attribute_value.name_value.value for a in attrs if a.attribute_name.value == "Name"]
        groups = [a.attribute_value.value for a in attrs if a.attribute_name.value == "Object Group"]
        state = [a.attribute_value.value.name for a in attrs if a.attribute_name.value == "State"][0]
        obj = c.get(uid)
        out.append({"uid": uid, "names": names, "state": state, "groups": groups,
                    "algorithm": obj.cryptographic_algorithm.name,
                    "length": obj.cryptographic_length,
                    "value": base64.b64encode(obj.value).decode()})
print(json.dumps(out))
"#;

/// Connects, then registers a Symmetric Key named `name` in Object Group `group` with the
/// material read from stdin (until EOF), activates it and prints its uid: an operator acting on
/// the server directly. Everything slow (imports, TLS) happens before stdin is read.
const WRITER: &str = r#"
import sys, logging, warnings
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
from kmip.pie.client import ProxyKmipClient
from kmip.pie import objects
from kmip.core import enums, objects as cobjects
from kmip.core.factories import attributes as af
host, port, cert, key, ca, name, group = sys.argv[1:8]
c = ProxyKmipClient(hostname=host, port=int(port), cert=cert, key=key, ca=ca,
                    config_file="/dev/null", kmip_version=enums.KMIPVersion.KMIP_1_2)
f = af.AttributeFactory()
with c:
    value = sys.stdin.buffer.read()
    k = objects.SymmetricKey(enums.CryptographicAlgorithm.HMAC_SHA256, 8 * len(value), value)
    template = cobjects.TemplateAttribute(attributes=[
        f.create_attribute(enums.AttributeType.NAME, name),
        f.create_attribute(enums.AttributeType.OBJECT_GROUP, group),
    ])
    r = c.proxy.register(enums.ObjectType.SYMMETRIC_KEY, template, c.object_factory.convert(k))
    assert r.result_status.value == enums.ResultStatus.SUCCESS, r.result_message
    uid = r.uuid
    c.activate(uid)
    print(uid)
"#;

/// PyKMIP client script for the layout fixtures (tests/kms/formats.rs). `dump` prints every
/// object as `{"name","group","state","info","value"}` (`info`: the Application Specific
/// Information data of namespace `keyplan`; `value`: base64), sorted by name; `load` registers
/// each object of such a list (read from stdin) as keyplan does (HMAC-SHA256 Symmetric Key)
/// with its Name, Object Group and Application Specific Information, and brings it to its
/// state (`ACTIVE`: activated; `DEACTIVATED`: activated, then revoked).
const LAYOUT_IO: &str = r#"
import sys, json, base64, logging, warnings
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
from kmip.pie.client import ProxyKmipClient
from kmip.pie import objects
from kmip.core import enums, objects as cobjects
from kmip.core.factories import attributes as af
host, port, cert, key, ca, mode = sys.argv[1:7]
c = ProxyKmipClient(hostname=host, port=int(port), cert=cert, key=key, ca=ca,
                    config_file="/dev/null", kmip_version=enums.KMIPVersion.KMIP_1_2)
f = af.AttributeFactory()
with c:
    if mode == "dump":
        out = []
        for uid in c.locate():
            _, attrs = c.get_attributes(uid, ["Name", "State", "Object Group", "Application Specific Information"])
            o = {"name": None, "group": None, "state": None, "info": None}
            for a in attrs:
                n = a.attribute_name.value
                if n == "Name": o["name"] = a.attribute_value.name_value.value
                elif n == "Object Group": o["group"] = a.attribute_value.value
                elif n == "State": o["state"] = a.attribute_value.value.name
                elif n == "Application Specific Information":
                    if a.attribute_value.application_namespace == "keyplan":
                        o["info"] = a.attribute_value.application_data
            o["value"] = base64.b64encode(c.get(uid).value).decode()
            out.append(o)
        out.sort(key=lambda o: o["name"])
        print(json.dumps(out))
    else:
        for o in json.load(sys.stdin):
            value = base64.b64decode(o["value"])
            k = objects.SymmetricKey(enums.CryptographicAlgorithm.HMAC_SHA256, 8 * len(value), value)
            template = cobjects.TemplateAttribute(attributes=[
                f.create_attribute(enums.AttributeType.NAME, o["name"]),
                f.create_attribute(enums.AttributeType.OBJECT_GROUP, o["group"]),
                f.create_attribute(enums.AttributeType.APPLICATION_SPECIFIC_INFORMATION,
                    {"application_namespace": "keyplan", "application_data": o["info"]}),
            ])
            r = c.proxy.register(enums.ObjectType.SYMMETRIC_KEY, template, c.object_factory.convert(k))
            assert r.result_status.value == enums.ResultStatus.SUCCESS, r.result_message
            if o["state"] in ("ACTIVE", "DEACTIVATED"):
                c.activate(r.uuid)
            if o["state"] == "DEACTIVATED":
                c.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, r.uuid)
        print("null")
"#;

/// PyKMIP client script: revokes object `uid` (reason Cessation of Operation), as an operator.
const REVOKER: &str = r#"
import sys, logging, warnings
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
from kmip.pie.client import ProxyKmipClient
from kmip.core import enums
host, port, cert, key, ca, uid = sys.argv[1:7]
c = ProxyKmipClient(hostname=host, port=int(port), cert=cert, key=key, ca=ca,
                    config_file="/dev/null", kmip_version=enums.KMIPVersion.KMIP_1_2)
with c:
    c.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, uid)
"#;

/// Skips (returns `None` with a note) or, under `KEYPLAN_REQUIRE_SERVERS=1`, fails.
pub fn skip_or_fail(why: &str) -> Option<PyKmip> {
    if std::env::var("KEYPLAN_REQUIRE_SERVERS").as_deref() == Ok("1") {
        panic!(
            "{why}; KEYPLAN_REQUIRE_SERVERS=1 requires the real PyKMIP server (pip install pykmip)"
        );
    }
    eprintln!("skipped: {why} (install with `pip install pykmip`)");
    None
}

/// Finds `bin` in `PATH`.
pub fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|p| p.is_file())
    })
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes `<stem>.key` (P-256) and `<stem>.crt` in `dir`, signed by `ca` (`ca.crt`/`ca.key`), or
/// self-signed when `ca` is `None`, with the extensions in `ext` (openssl `-addext` syntax,
/// one per line).
pub fn make_cert(dir: &Path, stem: &str, cn: &str, ca: Option<&str>, ext: &[&str]) {
    make_cert_days(dir, stem, cn, ca, ext, 2)
}

/// Like [`make_cert`], valid for `days` days from now.
pub fn make_cert_days(dir: &Path, stem: &str, cn: &str, ca: Option<&str>, ext: &[&str], days: u32) {
    let days = days.to_string();
    let key = format!("{stem}.key");
    let crt = format!("{stem}.crt");
    let subj = format!("/CN={cn}");
    match ca {
        None => {
            let mut args = vec![
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &crt,
                "-days",
                &days,
                "-subj",
                &subj,
            ];
            for e in ext {
                args.push("-addext");
                args.push(e);
            }
            openssl(dir, &args);
        }
        Some(ca) => {
            let csr = format!("{stem}.csr");
            openssl(
                dir,
                &[
                    "req",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-keyout",
                    &key,
                    "-out",
                    &csr,
                    "-subj",
                    &subj,
                ],
            );
            let extfile = format!("{stem}.ext");
            std::fs::write(dir.join(&extfile), ext.join("\n") + "\n").expect("write ext");
            let ca_crt = format!("{ca}.crt");
            let ca_key = format!("{ca}.key");
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    &ca_crt,
                    "-CAkey",
                    &ca_key,
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    &days,
                    "-extfile",
                    &extfile,
                ],
            );
        }
    }
}

/// A free loopback port never handed out before in this test process (a test that stops its
/// server must not meet another test's server on the same port).
pub fn free_port() -> u16 {
    static USED: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        if USED.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

impl PyKmip {
    /// Starts a fresh server (certificates, config, empty database) on a free loopback port
    /// and waits until it accepts connections (~0.5 s). `None` when skipped.
    pub fn start() -> Option<PyKmip> {
        for bin in ["pykmip-server", "python3", "openssl"] {
            if which(bin).is_none() {
                return skip_or_fail(&format!("{bin} not found in PATH"));
            }
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        make_cert(
            d,
            "ca",
            "keyplan test CA",
            None,
            &[
                "basicConstraints=critical,CA:TRUE",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
        make_cert(
            d,
            "server",
            "127.0.0.1",
            Some("ca"),
            &[
                "subjectAltName=IP:127.0.0.1,DNS:localhost",
                "extendedKeyUsage=serverAuth",
                "basicConstraints=CA:FALSE",
            ],
        );
        make_cert(
            d,
            "client",
            "keyplan",
            Some("ca"),
            &["extendedKeyUsage=clientAuth", "basicConstraints=CA:FALSE"],
        );
        let mut server = PyKmip {
            dir,
            child: None,
            port: 0,
        };
        for _ in 0..3 {
            server.port = free_port();
            if server.launch() {
                return Some(server);
            }
        }
        panic!("pykmip-server did not start; its log:\n{}", server.log());
    }

    /// Writes `server.conf` for the current port and starts the server; true once it accepts
    /// TCP connections, false if it exited (port taken).
    fn launch(&mut self) -> bool {
        let d = self.dir.path();
        let conf = format!(
            "[server]\nhostname=127.0.0.1\nport={port}\ncertificate_path={d}/server.crt\nkey_path={d}/server.key\nca_path={d}/ca.crt\nauth_suite=TLS1.2\nenable_tls_client_auth=True\ntls_cipher_suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256\nlogging_level=INFO\ndatabase_path={d}/pykmip.db\n",
            port = self.port,
            d = d.display()
        );
        std::fs::write(d.join("server.conf"), conf).expect("write server.conf");
        let out = std::fs::File::create(d.join("server.out")).expect("server.out");
        let err = out.try_clone().expect("dup");
        // Its own process group: pykmip-server forks a policy-monitor process that outlives a
        // SIGKILL of the main process, so `stop` kills the whole group.
        let child = Command::new("pykmip-server")
            .process_group(0)
            .current_dir(d)
            .arg("-f")
            .arg(d.join("server.conf"))
            .arg("-l")
            .arg(d.join("server.log"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn pykmip-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(_)) = c.try_wait() {
                    self.child = None;
                    return false;
                }
            }
            if self.log().contains("Starting connection service")
                && TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.stop();
        false
    }

    /// Kills the server and its helper process (SIGKILL to its process group) and waits for
    /// it; the database and certificates stay.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(pgid) = i32::try_from(c.id()) {
                // SAFETY: kill(2) on the process group this harness created; no memory effects.
                unsafe {
                    libc::kill(-pgid, libc::SIGKILL);
                }
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The server's log (`-l`) and its stdout/stderr.
    pub fn log(&self) -> String {
        let mut s = String::new();
        for f in ["server.log", "server.out"] {
            if let Ok(mut file) = std::fs::File::open(self.dir.path().join(f)) {
                let _ = file.read_to_string(&mut s);
            }
        }
        s
    }

    /// `127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A file in the server's temp dir (`ca.crt`, `client.crt`, `client.key`, ...).
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A client certificate and key (`rogue.crt`/`rogue.key`) that no CA the server trusts
    /// signed: self-signed, with extendedKeyUsage clientAuth.
    pub fn rogue_client(&self) -> (PathBuf, PathBuf) {
        if !self.file("rogue.crt").exists() {
            make_cert(
                self.dir.path(),
                "rogue",
                "keyplan",
                None,
                &["extendedKeyUsage=clientAuth", "basicConstraints=CA:FALSE"],
            );
        }
        (self.file("rogue.crt"), self.file("rogue.key"))
    }

    /// The plan-file lines of a KMS instance `name` using this server with the good client
    /// certificate (YAML, indented under `kms:`).
    pub fn kms_yaml(&self, name: &str) -> String {
        self.kms_yaml_with(
            name,
            &self.file("ca.crt"),
            &self.file("client.crt"),
            &self.file("client.key"),
        )
    }

    /// Like [`PyKmip::kms_yaml`] with other credential files.
    pub fn kms_yaml_with(&self, name: &str, ca: &Path, cert: &Path, key: &Path) -> String {
        format!(
            "  {name}:\n    provider: kmip\n    endpoint: {}\n    ca_cert: {}\n    client_cert: {}\n    client_key: {}\n",
            self.endpoint(),
            ca.display(),
            cert.display(),
            key.display()
        )
    }

    fn python(&self, script: &str, extra: &[&str], stdin: &[u8]) -> String {
        self.spawn_python(script, extra).finish(stdin)
    }

    fn spawn_python(&self, script: &str, extra: &[&str]) -> Python {
        let child = Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg("127.0.0.1")
            .arg(self.port.to_string())
            .arg(self.file("client.crt"))
            .arg(self.file("client.key"))
            .arg(self.file("ca.crt"))
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn python3");
        Python(Some(child))
    }

    /// Every object the client identity can see, read with PyKMIP's own client (Locate, Get
    /// Attributes, Get): the independent witness.
    pub fn objects(&self) -> Vec<PyObject> {
        serde_json::from_str(&self.python(READER, &[], b"")).expect("reader JSON")
    }

    /// The objects named `name` (one reader run; use [`named`] on one [`PyKmip::objects`]
    /// snapshot to look up several names).
    pub fn named(&self, name: &str) -> Vec<PyObject> {
        named(&self.objects(), name).into_iter().cloned().collect()
    }

    /// As an operator with PyKMIP's client: registers `value` as an HMAC-SHA256 key named
    /// `name` in Object Group `group`, activates it, and returns its uid.
    pub fn operator_register_active(&self, name: &str, group: &str, value: &[u8]) -> String {
        self.python(WRITER, &[name, group], value)
            .trim()
            .to_string()
    }

    /// Every object with the attributes of keyplan's layout, read with PyKMIP's client
    /// (`LAYOUT_IO`'s `dump`): what the layout fixtures hold.
    pub fn layout_dump(&self) -> serde_json::Value {
        serde_json::from_str(&self.python(LAYOUT_IO, &["dump"], b"")).expect("dump JSON")
    }

    /// Registers the objects of `objs` (a [`PyKmip::layout_dump`]) with PyKMIP's client.
    pub fn layout_load(&self, objs: &serde_json::Value) {
        self.python(LAYOUT_IO, &["load"], objs.to_string().as_bytes());
    }

    /// As an operator with PyKMIP's client: revokes object `uid` (it becomes Deactivated).
    pub fn operator_revoke(&self, uid: &str) {
        self.python(REVOKER, &[uid], b"");
    }

    /// Like [`PyKmip::operator_register_active`], started now (imports, connection) and
    /// acting when [`Python::finish`] hands it the material: the write then takes a fraction
    /// of a second.
    pub fn operator_ready(&self, name: &str, group: &str) -> Python {
        self.spawn_python(WRITER, &[name, group])
    }
}

/// The objects of `objs` named `name`.
pub fn named<'a>(objs: &'a [PyObject], name: &str) -> Vec<&'a PyObject> {
    objs.iter()
        .filter(|o| o.names.iter().any(|n| n == name))
        .collect()
}

/// A running PyKMIP client script (killed if dropped unfinished).
pub struct Python(Option<Child>);

impl Python {
    /// Writes `stdin` to the script, closes it, waits, and returns its stdout.
    pub fn finish(mut self, stdin: &[u8]) -> String {
        use std::io::Write as _;
        let mut child = self.0.take().expect("running");
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(stdin).expect("write stdin");
        drop(pipe);
        let out = child.wait_with_output().expect("python3");
        assert!(
            out.status.success(),
            "PyKMIP client script failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .to_string()
    }
}

impl Drop for Python {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for PyKmip {
    fn drop(&mut self) {
        self.stop();
    }
}
