//! A real Kubernetes control plane for tests: etcd and kube-apiserver, built from the
//! Kubernetes and etcd projects' Go modules by `scripts/k8s-control-plane.sh`, started on
//! loopback ports the way controller-runtime's envtest does (no kubelet, no
//! controller-manager, no scheduler).
//!
//! Include it with `#[path = "common/kube.rs"] mod kube;`. [`Cluster::get`] starts one cluster
//! per test process (on first use) and returns it; tests isolate themselves with
//! [`Cluster::fresh_namespace`]. It returns `None` (after printing `skipped: ...`) when the
//! binaries are missing, or fails the test when `KEYPLAN_REQUIRE_SERVERS=1` is set (CI), as
//! `tests/common/openbao.rs` does.
//!
//! - Binaries: `$KEYPLAN_K8S_BIN/{kube-apiserver,etcd}`, else the build script's default cache
//!   directory (`${KEYPLAN_K8S_CACHE:-~/.cache/keyplan/k8s}/v1.37.2-etcd3.7.3/bin`).
//! - Sharing across processes: when `KEYPLAN_KUBE_DIR` names a directory holding
//!   `cluster.json` (written by [`serve`], `tests/fleet/kube_cluster.rs`), that cluster is used and
//!   nothing is started.
//! - Lifetime: etcd and kube-apiserver get `PR_SET_PDEATHSIG` = SIGKILL, set from one spawner
//!   thread that lives as long as the process (the signal follows the *thread* that forked),
//!   so they never outlive the test process. Their directory (certificates, etcd data, logs,
//!   kubeconfigs) lies under `$TMPDIR/keyplan-kube/`; directories of dead processes are
//!   removed by the next start.
//!
//! Everything a test does goes through the API with an identity: the admin client
//! certificate (CN=admin, O=system:masters) for setup and independent reads, or bearer tokens
//! minted with the TokenRequest API for real ServiceAccounts bound by real RBAC.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

/// The Kubernetes version the build script builds by default (what `/version` reports).
pub const K8S_VERSION: &str = "v1.37.2";
/// The etcd version the build script builds by default.
pub const ETCD_VERSION: &str = "v3.7.3";

/// How long etcd and kube-apiserver may take to become ready (2 cores, busy CI).
const READY_LIMIT: Duration = Duration::from_secs(120);

/// What another process needs to use a running cluster (`cluster.json`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ClusterInfo {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// The CA certificate (PEM) of the serving certificate and of client certificates.
    pub ca: PathBuf,
    /// The admin client certificate (PEM, CN=admin, O=system:masters).
    pub admin_cert: PathBuf,
    /// The admin client key (PEM, PKCS#8).
    pub admin_key: PathBuf,
    /// The process whose children etcd and kube-apiserver are.
    pub pid: u32,
}

/// An HTTP answer of the API server: status and JSON body (`Value::Null` if not JSON).
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status code.
    pub status: u16,
    /// The body parsed as JSON (`Value::Null` when empty or not JSON).
    pub body: Value,
}

/// The identities [`Cluster::kubeconfig`] offers in one namespace (real ServiceAccounts).
#[derive(Debug, Clone)]
pub struct NamespaceUsers {
    /// Token of ServiceAccount `harness-admin`, bound to `cluster-admin` (context `full`). Not
    /// `keyplan`: that is the agents' ServiceAccount in deploy/kubernetes/rbac.yaml, and a test
    /// that deploys the agents into a namespace whose `full` context exists would hand them
    /// cluster-admin.
    pub full_token: String,
    /// Token of ServiceAccount `reader`: get, list and watch of Secrets (context `read-only`).
    pub read_only_token: String,
    /// Token of ServiceAccount `nobody`: no binding at all (context `no-access`).
    pub no_access_token: String,
}

/// A node identity from [`Cluster::node_client`]: a Pod bound to the node, its
/// ServiceAccount, and a token bound to the Pod (which carries the node's name).
#[derive(Debug, Clone)]
pub struct NodeClient {
    /// The Node's name.
    pub node: String,
    /// Namespace of the Pod and the ServiceAccount.
    pub namespace: String,
    /// The ServiceAccount's name.
    pub service_account: String,
    /// The Pod's name.
    pub pod: String,
    /// The bound token.
    pub token: String,
    /// `system:serviceaccount:<namespace>:<service_account>`.
    pub user: String,
    /// A kubeconfig using `token` (namespace `namespace`).
    pub kubeconfig: PathBuf,
}

/// A running (or shared) etcd + kube-apiserver, with an admin client.
pub struct Cluster {
    /// Where to reach it and with which admin identity.
    pub info: ClusterInfo,
    /// Directory for files written for tests (kubeconfigs), outside any scratch directory.
    files: PathBuf,
    admin: reqwest::Client,
    anonymous: reqwest::Client,
    /// Minted tokens and the user each authenticates as (for [`Cluster::user_of`]).
    tokens: Mutex<BTreeMap<String, String>>,
    users: Mutex<BTreeMap<String, NamespaceUsers>>,
    /// etcd and kube-apiserver when this process started them (killed with the process).
    children: Mutex<Vec<Child>>,
    /// How they were started, for [`Cluster::restart_apiserver`] and [`Cluster::restart_etcd`]
    /// (`None` for a shared cluster).
    spawned: Option<Spawned>,
}

/// Binaries, directory and ports of a control plane this process started.
#[derive(Debug, Clone)]
struct Spawned {
    bin: PathBuf,
    dir: PathBuf,
    /// etcd's client and peer ports, kube-apiserver's secure port.
    ports: (u16, u16, u16),
}

/// Skips (returns `None`) or, with `KEYPLAN_REQUIRE_SERVERS=1`, fails the test.
pub fn missing<T>(what: &str) -> Option<T> {
    if std::env::var("KEYPLAN_REQUIRE_SERVERS").as_deref() == Ok("1") {
        panic!("{what}, and KEYPLAN_REQUIRE_SERVERS=1 requires it: build them with `scripts/k8s-control-plane.sh` (or set KEYPLAN_K8S_BIN)");
    }
    eprintln!("skipped: {what} (build them with scripts/k8s-control-plane.sh)");
    None
}

/// The directory holding `kube-apiserver` and `etcd`: `$KEYPLAN_K8S_BIN`, else the build
/// script's default cache directory for [`K8S_VERSION`] and [`ETCD_VERSION`].
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KEYPLAN_K8S_BIN") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("KEYPLAN_K8S_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/keyplan/k8s")
        });
    cache
        .join(format!(
            "{K8S_VERSION}-etcd{}",
            ETCD_VERSION.trim_start_matches('v')
        ))
        .join("bin")
}

/// The async runtime of the harness's HTTP clients (one worker thread).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kube-harness")
            .enable_all()
            .build()
            .expect("start the harness runtime")
    })
}

/// Runs `f` on the harness's runtime and waits for it.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

/// A loopback port that is free now and never handed out before in this process.
pub fn free_port() -> u16 {
    static USED: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = l.local_addr().expect("local addr").port();
        let mut used = USED.lock().unwrap_or_else(|e| e.into_inner());
        if !used.contains(&port) {
            used.push(port);
            return port;
        }
    }
}

type SpawnJob = Box<dyn FnOnce() -> std::io::Result<Child> + Send>;
/// A job for the spawner thread and where to send its child.
type SpawnRequest = (SpawnJob, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `make()`'s command from one thread that lives as long as the process, with
/// `PR_SET_PDEATHSIG` = SIGKILL: Linux sends the signal when the thread that forked the child
/// exits, so forking from a short-lived test thread would kill the server with that test.
fn spawn_guarded(make: impl FnOnce() -> Command + Send + 'static) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("kube-spawner".into())
            .spawn(move || {
                // Never returns while the process lives (the sender is in a static).
                for (job, reply) in rx {
                    let _ = reply.send(job());
                }
                // Unreachable in practice; park so children keep their parent thread.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawn the kube spawner thread");
        Mutex::new(tx)
    });
    let (rtx, rrx) = mpsc::channel();
    let job: SpawnJob = Box::new(move || {
        use std::os::unix::process::CommandExt as _;
        let mut cmd = make();
        let parent = std::process::id();
        // SAFETY: only async-signal-safe calls (prctl, getppid) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before prctl: then nobody would signal us.
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::other("parent exited"));
                }
                Ok(())
            });
        }
        cmd.spawn()
    });
    tx.lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((job, rtx))
        .expect("kube spawner thread alive");
    rrx.recv().expect("kube spawner thread answers")
}

/// Removes cluster directories under `base` whose owner process is gone.
fn sweep_dead_dirs(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let owner = std::fs::read_to_string(e.path().join("owner.pid")).unwrap_or_default();
        match owner.trim().parse::<u32>() {
            Ok(pid) if Path::new(&format!("/proc/{pid}")).exists() => {}
            _ => {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Certificates (the `openssl` crate, already a dependency of keyplan)

mod pki {
    use openssl::asn1::{Asn1Integer, Asn1Time};
    use openssl::bn::BigNum;
    use openssl::ec::{EcGroup, EcKey};
    use openssl::hash::MessageDigest;
    use openssl::nid::Nid;
    use openssl::pkey::{PKey, Private};
    use openssl::x509::extension::{
        BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName, SubjectKeyIdentifier,
    };
    use openssl::x509::{X509NameBuilder, X509};

    /// A fresh ECDSA P-256 key.
    pub fn key() -> PKey<Private> {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("P-256");
        PKey::from_ec_key(EcKey::generate(&group).expect("EC key")).expect("pkey")
    }

    /// What a certificate is for.
    pub enum Kind {
        Ca,
        Server,
        Client,
    }

    /// A certificate for `key` with subject CN=`cn` (O=`org`), signed by `issuer` (self-signed
    /// when `None`), valid from an hour ago for a year.
    pub fn cert(
        cn: &str,
        org: Option<&str>,
        key: &PKey<Private>,
        issuer: Option<(&X509, &PKey<Private>)>,
        kind: Kind,
    ) -> X509 {
        let mut name = X509NameBuilder::new().expect("name");
        if let Some(o) = org {
            name.append_entry_by_nid(Nid::ORGANIZATIONNAME, o)
                .expect("O");
        }
        name.append_entry_by_nid(Nid::COMMONNAME, cn).expect("CN");
        let name = name.build();
        let mut b = X509::builder().expect("x509 builder");
        b.set_version(2).expect("version");
        let serial = BigNum::from_u32(rand::random::<u32>() >> 1).expect("serial");
        b.set_serial_number(&Asn1Integer::from_bn(&serial).expect("serial"))
            .expect("serial");
        b.set_subject_name(&name).expect("subject");
        b.set_issuer_name(issuer.map_or(&*name, |(c, _)| c.subject_name()))
            .expect("issuer");
        b.set_pubkey(key).expect("pubkey");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64;
        b.set_not_before(&Asn1Time::from_unix(now - 3600).expect("time"))
            .expect("not before");
        b.set_not_after(&Asn1Time::days_from_now(365).expect("time"))
            .expect("not after");
        match kind {
            Kind::Ca => {
                b.append_extension(BasicConstraints::new().critical().ca().build().expect("bc"))
                    .expect("bc");
                b.append_extension(
                    KeyUsage::new()
                        .critical()
                        .key_cert_sign()
                        .crl_sign()
                        .digital_signature()
                        .build()
                        .expect("ku"),
                )
                .expect("ku");
            }
            Kind::Server | Kind::Client => {
                b.append_extension(BasicConstraints::new().critical().build().expect("bc"))
                    .expect("bc");
                b.append_extension(
                    KeyUsage::new()
                        .critical()
                        .digital_signature()
                        .key_encipherment()
                        .build()
                        .expect("ku"),
                )
                .expect("ku");
                let mut eku = ExtendedKeyUsage::new();
                if matches!(kind, Kind::Server) {
                    eku.server_auth();
                } else {
                    eku.client_auth();
                }
                b.append_extension(eku.build().expect("eku")).expect("eku");
            }
        }
        if matches!(kind, Kind::Server) {
            let san = SubjectAlternativeName::new()
                .ip("127.0.0.1")
                .dns("localhost")
                .build(&b.x509v3_context(issuer.map(|(c, _)| &**c), None))
                .expect("san");
            b.append_extension(san).expect("san");
        }
        let ski = SubjectKeyIdentifier::new()
            .build(&b.x509v3_context(None, None))
            .expect("ski");
        b.append_extension(ski).expect("ski");
        b.sign(issuer.map_or(key, |(_, k)| k), MessageDigest::sha256())
            .expect("sign");
        b.build()
    }
}

/// Writes the cluster's PKI into `dir`: `ca.{crt,key}`, `serving.{crt,key}` (127.0.0.1,
/// localhost), `admin.{crt,key}` (CN=admin, O=system:masters), `sa.key` / `sa.pub` (the
/// ServiceAccount token signing key pair).
fn write_pki(dir: &Path) {
    let w = |name: &str, bytes: Vec<u8>| {
        std::fs::write(dir.join(name), bytes).expect("write PKI file");
    };
    let ca_key = pki::key();
    let ca = pki::cert("keyplan-test-ca", None, &ca_key, None, pki::Kind::Ca);
    let serving_key = pki::key();
    let serving = pki::cert(
        "kube-apiserver",
        None,
        &serving_key,
        Some((&ca, &ca_key)),
        pki::Kind::Server,
    );
    let admin_key = pki::key();
    let admin = pki::cert(
        "admin",
        Some("system:masters"),
        &admin_key,
        Some((&ca, &ca_key)),
        pki::Kind::Client,
    );
    let sa_key = pki::key();
    w("ca.crt", ca.to_pem().expect("pem"));
    w("ca.key", ca_key.private_key_to_pem_pkcs8().expect("pem"));
    w("serving.crt", serving.to_pem().expect("pem"));
    w(
        "serving.key",
        serving_key.private_key_to_pem_pkcs8().expect("pem"),
    );
    w("admin.crt", admin.to_pem().expect("pem"));
    w(
        "admin.key",
        admin_key.private_key_to_pem_pkcs8().expect("pem"),
    );
    w("sa.key", sa_key.private_key_to_pem_pkcs8().expect("pem"));
    w("sa.pub", sa_key.public_key_to_pem().expect("pem"));
}

// ---------------------------------------------------------------------------------------------
// Starting

/// etcd's command line: one member on two free loopback ports, data in `dir/etcd`, no fsync
/// (a throwaway test store).
fn etcd_command(bin: &Path, dir: &Path, client: u16, peer: u16) -> Command {
    let mut cmd = Command::new(bin.join("etcd"));
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    cmd.arg(format!("--data-dir={}", dir.join("etcd").display()))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=default={peer_url}"))
        .arg("--unsafe-no-fsync")
        .arg("--log-level=warn");
    cmd
}

/// kube-apiserver's command line: the minimal set that works with 1.37 (each line says why).
fn apiserver_command(bin: &Path, dir: &Path, etcd_client: u16, port: u16) -> Command {
    let f = |name: &str| dir.join(name).display().to_string();
    let mut cmd = Command::new(bin.join("kube-apiserver"));
    cmd
        // Storage: the etcd started just before.
        .arg(format!("--etcd-servers=http://127.0.0.1:{etcd_client}"))
        // Loopback only, on a free port; HTTPS with our serving certificate (127.0.0.1 SAN).
        .arg("--bind-address=127.0.0.1")
        .arg("--advertise-address=127.0.0.1")
        // 1.37 refuses a loopback advertise address with the default (lease) endpoint
        // reconciler: "cannot use public IP 127.0.0.1 with endpoint reconciler ... may not be
        // in the loopback range". Nothing needs the `kubernetes` Service's endpoints here.
        .arg("--endpoint-reconciler-type=none")
        // Privileged containers allowed, as kubeadm and managed clusters set it: the agent's
        // DaemonSet is privileged (it opens LUKS devices), and the default (false) refuses it.
        .arg("--allow-privileged=true")
        .arg(format!("--secure-port={port}"))
        .arg(format!("--tls-cert-file={}", f("serving.crt")))
        .arg(format!("--tls-private-key-file={}", f("serving.key")))
        // Client certificates (the admin: CN=admin, O=system:masters) are verified with this CA.
        .arg(format!("--client-ca-file={}", f("ca.crt")))
        // Real authorization: RBAC (Node too, as in a real cluster; it only concerns
        // system:node:* users).
        .arg("--authorization-mode=Node,RBAC")
        // ServiceAccount tokens (TokenRequest): required flags since 1.20.
        .arg(format!("--service-account-issuer=https://127.0.0.1:{port}"))
        .arg(format!("--service-account-key-file={}", f("sa.pub")))
        .arg(format!(
            "--service-account-signing-key-file={}",
            f("sa.key")
        ))
        // Required to allocate Service IPs (the `kubernetes` Service); never routed.
        .arg("--service-cluster-ip-range=10.0.0.0/24")
        // No controller-manager creates the `default` ServiceAccount of a namespace: without
        // this, a Pod naming no existing ServiceAccount would be refused. Pods of the harness
        // name their ServiceAccount explicitly; this just keeps other Pods possible.
        .arg("--disable-admission-plugins=ServiceAccount")
        // Nothing watches Services' external IPs, no cloud: keep the log quiet.
        .arg("--enable-priority-and-fairness=false")
        .arg("--profiling=false")
        .arg("--v=0");
    cmd
}

/// Polls `probe` every 100 ms until it is true, `child` exits, or `limit` passes.
fn wait_until(
    what: &str,
    child: &mut Child,
    limit: Duration,
    mut probe: impl FnMut() -> bool,
) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("{what} exited early ({status})"));
        }
        if probe() {
            return Ok(());
        }
        if t0.elapsed() > limit {
            return Err(format!("{what} not ready after {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last `n` lines of a log file.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn kill(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Starts etcd and kube-apiserver from `bin` with their files in `dir` and waits until
/// `/readyz` answers 200 (up to 3 attempts on fresh ports, in case a port was taken between
/// probing and binding).
fn start_servers(bin: &Path, dir: &Path) -> (ClusterInfo, Vec<Child>, (u16, u16, u16)) {
    write_pki(dir);
    let mut failures = String::new();
    for attempt in 0..3 {
        let _ = std::fs::remove_dir_all(dir.join("etcd"));
        let (client, peer, port) = (free_port(), free_port(), free_port());
        let etcd_log = dir.join(format!("etcd-{attempt}.log"));
        let log = std::fs::File::create(&etcd_log).expect("etcd log");
        let (b, d) = (bin.to_path_buf(), dir.to_path_buf());
        let mut etcd = spawn_etcd(&b, &d, client, peer, log);
        let r = wait_etcd(&mut etcd, client);
        if let Err(e) = r {
            kill(etcd);
            failures.push_str(&format!("{e}\n{}\n", tail(&etcd_log, 20)));
            continue;
        }
        let api_log = dir.join(format!("kube-apiserver-{attempt}.log"));
        let log = std::fs::File::create(&api_log).expect("apiserver log");
        let (b, d) = (bin.to_path_buf(), dir.to_path_buf());
        let mut api = spawn_apiserver(&b, &d, client, port, log);
        let info = ClusterInfo {
            url: format!("https://127.0.0.1:{port}"),
            ca: dir.join("ca.crt"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            pid: std::process::id(),
        };
        let r = wait_readyz(&admin_client(&info), &info.url, &mut api);
        match r {
            Ok(()) => return (info, vec![etcd, api], (client, peer, port)),
            Err(e) => {
                kill(api);
                kill(etcd);
                failures.push_str(&format!("{e}\n{}\n", tail(&api_log, 30)));
            }
        }
    }
    panic!("the Kubernetes control plane did not start:\n{failures}");
}

/// Starts the command `make` builds (the program `program`, run in `dir`) with its output to
/// `log`, killed with this process ([`spawn_guarded`]).
fn spawn_logged(
    program: PathBuf,
    dir: &Path,
    log: std::fs::File,
    make: impl FnOnce() -> Command + Send + 'static,
) -> Child {
    let d = dir.to_path_buf();
    spawn_guarded(move || {
        let mut cmd = make();
        cmd.current_dir(&d)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        cmd
    })
    .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()))
}

fn spawn_etcd(bin: &Path, dir: &Path, client: u16, peer: u16, log: std::fs::File) -> Child {
    let (b, d) = (bin.to_path_buf(), dir.to_path_buf());
    spawn_logged(bin.join("etcd"), dir, log, move || {
        etcd_command(&b, &d, client, peer)
    })
}

/// Waits until etcd on `client` reports itself healthy.
fn wait_etcd(etcd: &mut Child, client: u16) -> Result<(), String> {
    let health = format!("http://127.0.0.1:{client}/health");
    install_tls_provider();
    let plain = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("http client");
    wait_until("etcd", etcd, READY_LIMIT, || {
        block_on(async {
            match plain.get(&health).send().await {
                Ok(r) => r.text().await.is_ok_and(|t| t.contains("\"true\"")),
                Err(_) => false,
            }
        })
    })
}

fn spawn_apiserver(bin: &Path, dir: &Path, client: u16, port: u16, log: std::fs::File) -> Child {
    let (b, d) = (bin.to_path_buf(), dir.to_path_buf());
    spawn_logged(bin.join("kube-apiserver"), dir, log, move || {
        apiserver_command(&b, &d, client, port)
    })
}

/// Waits until kube-apiserver (`api`, at `url`) answers `/readyz` with 200 to `admin`.
fn wait_readyz(admin: &reqwest::Client, url: &str, api: &mut Child) -> Result<(), String> {
    let readyz = format!("{url}/readyz");
    wait_until("kube-apiserver", api, READY_LIMIT, || {
        block_on(async { matches!(admin.get(&readyz).send().await, Ok(r) if r.status() == 200) })
    })
}

/// How many `<stem>-<n>.log` files `dir` has (the next log's number).
fn count_logs(dir: &Path, stem: &str) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&format!("{stem}-")) && n.ends_with(".log"))
                .count()
        })
        .unwrap_or(0)
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// An HTTPS client trusting only the cluster CA, with the admin client certificate.
fn admin_client(info: &ClusterInfo) -> reqwest::Client {
    let mut pem = read(&info.admin_cert);
    pem.extend(read(&info.admin_key));
    client_builder(info)
        .identity(reqwest::Identity::from_pem(&pem).expect("admin identity"))
        .build()
        .expect("admin client")
}

/// Installs rustls' `ring` provider as the process default (as keyplan's kube client does),
/// so reqwest's rustls needs no provider of its own.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn client_builder(info: &ClusterInfo) -> reqwest::ClientBuilder {
    install_tls_provider();
    let ca = reqwest::Certificate::from_pem(&read(&info.ca)).expect("cluster CA");
    reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([ca])
        .timeout(Duration::from_secs(30))
}

// ---------------------------------------------------------------------------------------------
// The cluster

impl Cluster {
    /// The cluster of this test process: the shared one named by `KEYPLAN_KUBE_DIR`, else one
    /// started on first use. `None` (after `skipped: ...`) when the binaries are missing;
    /// panics instead with `KEYPLAN_REQUIRE_SERVERS=1`.
    pub fn get() -> Option<&'static Cluster> {
        static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
        CLUSTER.get_or_init(Cluster::init).as_ref()
    }

    fn init() -> Option<Cluster> {
        if let Some(shared) = std::env::var_os("KEYPLAN_KUBE_DIR") {
            let shared = PathBuf::from(shared);
            let file = shared.join("cluster.json");
            let text = std::fs::read_to_string(&file).unwrap_or_else(|e| {
                panic!(
                    "KEYPLAN_KUBE_DIR is set but {} is unreadable: {e}",
                    file.display()
                )
            });
            let info: ClusterInfo = serde_json::from_str(&text).expect("cluster.json parses");
            let files = shared.join(format!("files-{}", std::process::id()));
            std::fs::create_dir_all(&files).expect("files dir");
            let c = Cluster::with_info(info, files, Vec::new(), None);
            assert_eq!(
                c.request("GET", "/readyz", None).status,
                200,
                "the shared cluster of {} is not ready",
                file.display()
            );
            return Some(c);
        }
        Cluster::start_own()
    }

    /// A control plane of this test's own, not the shared one: for tests that stop and
    /// restart it ([`Cluster::restart_apiserver`], [`Cluster::restart_etcd`]). Lives until the
    /// process ends. `None` as [`Cluster::get`].
    pub fn private() -> Option<&'static Cluster> {
        Some(Box::leak(Box::new(Cluster::start_own()?)))
    }

    fn start_own() -> Option<Cluster> {
        let bin = bin_dir();
        for b in ["kube-apiserver", "etcd"] {
            if !bin.join(b).is_file() {
                return missing(&format!("{} is missing", bin.join(b).display()));
            }
        }
        let base = std::env::temp_dir().join("keyplan-kube");
        std::fs::create_dir_all(&base).expect("create the kube base dir");
        sweep_dead_dirs(&base);
        let dir = base.join(format!(
            "{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("create the cluster dir");
        std::fs::write(dir.join("owner.pid"), std::process::id().to_string())
            .expect("write owner.pid");
        Some(Cluster::start_in(&bin, &dir))
    }

    /// Starts a new cluster from the binaries in `bin` with its files in `dir` (which must
    /// exist) and waits until it is ready.
    pub fn start_in(bin: &Path, dir: &Path) -> Cluster {
        let t0 = Instant::now();
        let (info, children, ports) = start_servers(bin, dir);
        eprintln!(
            "kube: control plane at {} ready in {:.1}s (files in {})",
            info.url,
            t0.elapsed().as_secs_f64(),
            dir.display()
        );
        let files = dir.join("files");
        std::fs::create_dir_all(&files).expect("files dir");
        let spawned = Spawned {
            bin: bin.to_path_buf(),
            dir: dir.to_path_buf(),
            ports,
        };
        Cluster::with_info(info, files, children, Some(spawned))
    }

    fn with_info(
        info: ClusterInfo,
        files: PathBuf,
        children: Vec<Child>,
        spawned: Option<Spawned>,
    ) -> Cluster {
        Cluster {
            admin: admin_client(&info),
            anonymous: client_builder(&info).build().expect("token client"),
            info,
            files,
            tokens: Mutex::new(BTreeMap::new()),
            users: Mutex::new(BTreeMap::new()),
            children: Mutex::new(children),
            spawned,
        }
    }

    /// Kills kube-apiserver (SIGKILL) and starts it again on the same port against the same
    /// etcd; returns once `/readyz` answers 200, with the time it was away. Panics on a shared
    /// cluster (see [`Cluster::private`]).
    #[allow(dead_code)]
    pub fn restart_apiserver(&self) -> Duration {
        let sp = self
            .spawned
            .clone()
            .expect("restart needs Cluster::private()");
        let t0 = Instant::now();
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        let _ = children[1].kill();
        let _ = children[1].wait();
        let n = count_logs(&sp.dir, "kube-apiserver");
        let log = std::fs::File::create(sp.dir.join(format!("kube-apiserver-{n}.log")))
            .expect("apiserver log");
        children[1] = spawn_apiserver(&sp.bin, &sp.dir, sp.ports.0, sp.ports.2, log);
        self.wait_ready(&mut children[1]);
        t0.elapsed()
    }

    /// Kills etcd (SIGKILL) and starts it again with the same data directory and ports;
    /// returns once etcd is healthy and kube-apiserver's `/readyz` answers 200 again, with the
    /// time it took. Panics on a shared cluster (see [`Cluster::private`]).
    #[allow(dead_code)]
    pub fn restart_etcd(&self) -> Duration {
        let sp = self
            .spawned
            .clone()
            .expect("restart needs Cluster::private()");
        let t0 = Instant::now();
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        let _ = children[0].kill();
        let _ = children[0].wait();
        let n = count_logs(&sp.dir, "etcd");
        let log = std::fs::File::create(sp.dir.join(format!("etcd-{n}.log"))).expect("etcd log");
        children[0] = spawn_etcd(&sp.bin, &sp.dir, sp.ports.0, sp.ports.1, log);
        if let Err(e) = wait_etcd(&mut children[0], sp.ports.0) {
            panic!("etcd did not come back: {e}");
        }
        self.wait_ready(&mut children[1]);
        t0.elapsed()
    }

    /// Waits until kube-apiserver (`api`) answers `/readyz` with 200.
    fn wait_ready(&self, api: &mut Child) {
        if let Err(e) = wait_readyz(&self.admin, &self.info.url, api) {
            panic!("kube-apiserver did not come back: {e}");
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.info.url
    }

    /// Kills etcd and kube-apiserver if this process started them (a shared cluster is left
    /// alone). For [`serve`]; tests never need it.
    pub fn stop(&self) {
        for c in self
            .children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            kill(c);
        }
    }

    // ----- raw requests

    async fn send(
        client: &reqwest::Client,
        url: String,
        method: &str,
        token: Option<&str>,
        body: Option<&Value>,
        content_type: &str,
    ) -> Reply {
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("HTTP method");
        let mut req = client.request(m, url).header("Accept", "application/json");
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req
                .header("Content-Type", content_type)
                .body(serde_json::to_vec(b).expect("JSON body"));
        }
        let resp = req.send().await.expect("request to kube-apiserver");
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.expect("kube-apiserver answer body");
        Reply {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }

    /// `GET path` with the admin identity, for callers that outlive a restart of the control
    /// plane: `Err` with the transport error (connection refused or reset) instead of a panic.
    #[allow(dead_code)]
    pub fn try_get(&self, path: &str) -> Result<Reply, String> {
        let url = format!("{}{path}", self.info.url);
        block_on(async {
            let resp = self
                .admin
                .get(url)
                .header("Accept", "application/json")
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
            Ok(Reply {
                status,
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            })
        })
    }

    /// `GET path` with the admin identity, as text (e.g. `/metrics`, the API server's own
    /// Prometheus metrics). `Err` on a transport error or a status other than 200.
    #[allow(dead_code)]
    pub fn get_text(&self, path: &str) -> Result<String, String> {
        let url = format!("{}{path}", self.info.url);
        block_on(async {
            let resp = self
                .admin
                .get(url)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let text = resp.text().await.map_err(|e| e.to_string())?;
            if status != 200 {
                return Err(format!("HTTP {status}: {text}"));
            }
            Ok(text)
        })
    }

    /// `method path` (path with query, e.g. `/api/v1/namespaces`) with the admin identity;
    /// JSON `body` if any. Any status is returned; a transport error panics.
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Reply {
        let url = format!("{}{path}", self.info.url);
        block_on(Self::send(
            &self.admin,
            url,
            method,
            None,
            body,
            "application/json",
        ))
    }

    /// Server-side apply of `obj` (any kind) at its object path `path` as field manager
    /// `keyplan-tests`, with the admin identity: `PATCH` with `application/apply-patch+yaml`
    /// (JSON is YAML), `force=true`, `fieldValidation=Strict` (an unknown or duplicate field is
    /// an error, as `kubectl apply --validate=strict` makes it) and, with `dry_run`,
    /// `dryRun=All` (admission and validation run, nothing is stored). Any status is returned.
    #[allow(dead_code)]
    pub fn server_side_apply(&self, path: &str, obj: &Value, dry_run: bool) -> Reply {
        let url = format!(
            "{}{path}?fieldManager=keyplan-tests&force=true&fieldValidation=Strict{}",
            self.info.url,
            if dry_run { "&dryRun=All" } else { "" }
        );
        block_on(Self::send(
            &self.admin,
            url,
            "PATCH",
            None,
            Some(obj),
            "application/apply-patch+yaml",
        ))
    }

    /// Like [`Cluster::request`], authenticated by the bearer `token` instead (no client
    /// certificate).
    pub fn request_as(&self, token: &str, method: &str, path: &str, body: Option<&Value>) -> Reply {
        let url = format!("{}{path}", self.info.url);
        block_on(Self::send(
            &self.anonymous,
            url,
            method,
            Some(token),
            body,
            if method == "PATCH" {
                "application/merge-patch+json"
            } else {
                "application/json"
            },
        ))
    }

    /// `GET path` as admin: the object, or `None` on 404 (other errors panic).
    pub fn get_json(&self, path: &str) -> Option<Value> {
        let r = self.request("GET", path, None);
        match r.status {
            200 => Some(r.body),
            404 => None,
            s => panic!("GET {path}: {s} {}", r.body),
        }
    }

    /// `POST path` (a collection) as admin; panics unless 200/201. Returns the created object.
    pub fn create(&self, path: &str, obj: &Value) -> Value {
        let r = self.request("POST", path, Some(obj));
        assert!(
            matches!(r.status, 200 | 201),
            "POST {path}: {} {}",
            r.status,
            r.body
        );
        r.body
    }

    /// Like [`Cluster::create`], but an existing object (409 AlreadyExists) is fine.
    pub fn ensure(&self, path: &str, obj: &Value) {
        let r = self.request("POST", path, Some(obj));
        assert!(
            matches!(r.status, 200 | 201 | 409),
            "POST {path}: {} {}",
            r.status,
            r.body
        );
    }

    /// `PUT path` (an object) as admin; returns the reply (409 on a stale resourceVersion).
    pub fn put(&self, path: &str, obj: &Value) -> Reply {
        self.request("PUT", path, Some(obj))
    }

    /// JSON merge patch (`application/merge-patch+json`) of `path` as admin; panics unless
    /// 200. Returns the patched object.
    pub fn patch(&self, path: &str, patch: &Value) -> Value {
        let url = format!("{}{path}", self.info.url);
        let r = block_on(Self::send(
            &self.admin,
            url,
            "PATCH",
            None,
            Some(patch),
            "application/merge-patch+json",
        ));
        assert_eq!(r.status, 200, "PATCH {path}: {}", r.body);
        r.body
    }

    /// `DELETE path` as admin: true if it existed (404 is false, other errors panic).
    pub fn delete(&self, path: &str) -> bool {
        let r = self.request("DELETE", path, None);
        match r.status {
            200 | 202 => true,
            404 => false,
            s => panic!("DELETE {path}: {s} {}", r.body),
        }
    }

    // ----- namespaces, identities

    /// Creates a namespace named `<prefix>-<random>` (a DNS label) and returns its name.
    pub fn fresh_namespace(&self, prefix: &str) -> String {
        let clean: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        let clean = clean.trim_matches('-');
        let name = format!(
            "{}-{:08x}",
            if clean.is_empty() { "t" } else { clean },
            rand::random::<u32>()
        );
        self.create(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        );
        name
    }

    /// The user a token minted by this harness authenticates as (`None` for other tokens).
    pub fn user_of(&self, token: &str) -> Option<String> {
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()
    }

    /// Remembers that `token` authenticates as `user` (for [`Cluster::user_of`] and the
    /// proxy's request log).
    pub fn register_token(&self, token: &str, user: &str) {
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.to_string(), user.to_string());
    }

    /// Creates ServiceAccount `ns/name` (an existing one is fine).
    pub fn service_account(&self, ns: &str, name: &str) {
        self.ensure(
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}),
        );
    }

    /// Mints a token for ServiceAccount `ns/sa` with the TokenRequest API (valid 24 h):
    /// audiences `audiences` (empty: the API server's own, so it authenticates to it), bound
    /// to Pod `ns/<bound_pod>` when given (the token then dies with the Pod and carries the
    /// Pod's node name). The ServiceAccount must exist.
    pub fn service_account_token(
        &self,
        ns: &str,
        sa: &str,
        audiences: &[&str],
        bound_pod: Option<&str>,
    ) -> String {
        let mut spec = json!({"audiences": audiences, "expirationSeconds": 86400});
        if let Some(pod) = bound_pod {
            let p = self
                .get_json(&format!("/api/v1/namespaces/{ns}/pods/{pod}"))
                .unwrap_or_else(|| panic!("no Pod {ns}/{pod} to bind a token to"));
            spec["boundObjectRef"] = json!({"apiVersion": "v1", "kind": "Pod",
                "name": pod, "uid": p["metadata"]["uid"]});
        }
        let r = self.create(
            &format!("/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"),
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": spec}),
        );
        let token = r["status"]["token"]
            .as_str()
            .expect("TokenRequest status.token")
            .to_string();
        self.register_token(&token, &format!("system:serviceaccount:{ns}:{sa}"));
        token
    }

    /// A node's identity as keyplan's agent has it in a DaemonSet Pod: creates Node `node`
    /// (if absent), ServiceAccount `ns/<sa>`, a Pod `ns/<sa>-<node>` bound to the node
    /// (`spec.nodeName`; no kubelet runs it) and mints a token bound to that Pod, which
    /// carries `authentication.kubernetes.io/node-name` in its user's extra.
    pub fn node_client(&self, ns: &str, sa: &str, node: &str) -> NodeClient {
        self.ensure(
            "/api/v1/nodes",
            &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
        );
        self.service_account(ns, sa);
        let pod = format!("{sa}-{node}");
        self.ensure(
            &format!("/api/v1/namespaces/{ns}/pods"),
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod},
                "spec": {"nodeName": node, "serviceAccountName": sa,
                    "automountServiceAccountToken": false,
                    "containers": [{"name": "agent", "image": "keyplan:test"}]}}),
        );
        let token = self.service_account_token(ns, sa, &[], Some(&pod));
        let kubeconfig = self.kubeconfig_with_token(ns, &token);
        NodeClient {
            node: node.to_string(),
            namespace: ns.to_string(),
            service_account: sa.to_string(),
            pod,
            user: format!("system:serviceaccount:{ns}:{sa}"),
            token,
            kubeconfig,
        }
    }

    /// `POST selfsubjectreviews` with `token`: the `status.userInfo` the API server sees.
    pub fn whoami(&self, token: &str) -> Value {
        let r = self.request_as(
            token,
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            Some(&json!({"apiVersion": "authentication.k8s.io/v1",
                "kind": "SelfSubjectReview"})),
        );
        assert_eq!(r.status, 201, "SelfSubjectReview: {}", r.body);
        r.body["status"]["userInfo"].clone()
    }

    /// The identities of [`Cluster::kubeconfig`]'s contexts in `ns`, created on first use:
    /// ServiceAccounts `harness-admin` (bound to `cluster-admin` by a ClusterRoleBinding: every verb
    /// everywhere, TokenReview included), `reader` (a Role: get, list, watch of Secrets) and
    /// `nobody` (no binding), each with a minted token.
    pub fn users(&self, ns: &str) -> NamespaceUsers {
        if let Some(u) = self.users.lock().unwrap_or_else(|e| e.into_inner()).get(ns) {
            return u.clone();
        }
        for sa in ["harness-admin", "reader", "nobody"] {
            self.service_account(ns, sa);
        }
        self.ensure(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": format!("harness-admin-{ns}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "harness-admin", "namespace": ns}]}),
        );
        self.ensure(
            &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"),
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "secret-reader"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"],
                    "verbs": ["get", "list", "watch"]}]}),
        );
        self.ensure(
            &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"),
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "secret-reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "secret-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]}),
        );
        let u = NamespaceUsers {
            full_token: self.service_account_token(ns, "harness-admin", &[], None),
            read_only_token: self.service_account_token(ns, "reader", &[], None),
            no_access_token: self.service_account_token(ns, "nobody", &[], None),
        };
        self.users
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ns.to_string(), u.clone());
        u
    }

    // ----- kubeconfigs

    fn kubeconfig_file(&self, stem: &str) -> PathBuf {
        self.files
            .join(format!("kubeconfig-{stem}-{:08x}", rand::random::<u32>()))
    }

    fn cluster_entry(&self, server: &str) -> String {
        let b64 = |p: &Path| base64::engine::general_purpose::STANDARD.encode(read(p));
        if server.starts_with("https://") {
            format!(
                "- name: kube\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\n",
                b64(&self.info.ca)
            )
        } else {
            format!("- name: kube\n  cluster:\n    server: {server}\n")
        }
    }

    /// Writes a kubeconfig (outside any scratch directory, a new file per call) with the
    /// contexts `full`, `read-only`, `no-access` (the
    /// tokens of [`Cluster::users`]) and `bad-token` (a token no one issued) — all with
    /// namespace `namespace`, `current` being the current one. Returns its path.
    pub fn kubeconfig(&self, namespace: &str, current: &str) -> PathBuf {
        self.kubeconfig_at(&self.info.url.clone(), namespace, current)
    }

    /// Like [`Cluster::kubeconfig`], with `server` as the cluster URL (e.g. a
    /// [`super::kube_proxy`] in front of the API server: `http://` needs no CA).
    pub fn kubeconfig_at(&self, server: &str, namespace: &str, current: &str) -> PathBuf {
        let u = self.users(namespace);
        let users = [
            ("full", u.full_token),
            ("read-only", u.read_only_token),
            ("no-access", u.no_access_token),
            (
                "bad-token",
                "eyJhbGciOiJub25lIn0.e30.not-a-valid-token".to_string(),
            ),
        ];
        let mut text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n{}contexts:\n",
            self.cluster_entry(server)
        );
        for (name, _) in &users {
            text.push_str(&format!(
                "- name: {name}\n  context:\n    cluster: kube\n    user: {name}\n    namespace: {namespace}\n"
            ));
        }
        text.push_str("users:\n");
        for (name, token) in &users {
            text.push_str(&format!("- name: {name}\n  user:\n    token: {token}\n"));
        }
        text.push_str(&format!("current-context: {current}\n"));
        let path = self.kubeconfig_file(&format!("{namespace}-{current}"));
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// Writes a kubeconfig whose one context (`token`, namespace `namespace`) authenticates
    /// with the bearer `token`; returns its path (a new file per call).
    pub fn kubeconfig_with_token(&self, namespace: &str, token: &str) -> PathBuf {
        self.kubeconfig_with_token_at(&self.info.url.clone(), namespace, token)
    }

    /// Like [`Cluster::kubeconfig_with_token`], with `server` as the cluster URL.
    pub fn kubeconfig_with_token_at(&self, server: &str, namespace: &str, token: &str) -> PathBuf {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n{}contexts:\n- name: token\n  context:\n    cluster: kube\n    user: token\n    namespace: {namespace}\nusers:\n- name: token\n  user:\n    token: {token}\ncurrent-context: token\n",
            self.cluster_entry(server)
        );
        let path = self.kubeconfig_file(&format!("{namespace}-token"));
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// Writes a kubeconfig whose one context (`token-file`, namespace `namespace`, cluster
    /// `server`) authenticates with the bearer token read from `token_file` (`tokenFile`, as
    /// a ServiceAccount's kubeconfig does); returns its path (a new file per call).
    pub fn kubeconfig_with_token_file_at(
        &self,
        server: &str,
        namespace: &str,
        token_file: &Path,
    ) -> PathBuf {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n{}contexts:\n- name: token-file\n  context:\n    cluster: kube\n    user: token-file\n    namespace: {namespace}\nusers:\n- name: token-file\n  user:\n    tokenFile: {}\ncurrent-context: token-file\n",
            self.cluster_entry(server),
            token_file.display()
        );
        let path = self.kubeconfig_file(&format!("{namespace}-token-file"));
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// Writes a kubeconfig with the admin client certificate and key embedded (context
    /// `admin`, namespace `namespace`); returns its path.
    pub fn kubeconfig_admin(&self, namespace: &str) -> PathBuf {
        let b64 = |p: &Path| base64::engine::general_purpose::STANDARD.encode(read(p));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n{}contexts:\n- name: admin\n  context:\n    cluster: kube\n    user: admin\n    namespace: {namespace}\nusers:\n- name: admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncurrent-context: admin\n",
            self.cluster_entry(&self.info.url),
            b64(&self.info.admin_cert),
            b64(&self.info.admin_key)
        );
        let path = self.kubeconfig_file(&format!("{namespace}-admin"));
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    // ----- manifests

    /// Applies every document of the multi-document YAML `yaml` as admin (create, or replace
    /// an existing object), moving objects of namespace `from` to namespace `to` for each
    /// `(from, to)` in `namespaces` (in `metadata.namespace` and in RoleBinding subjects).
    /// Kinds: Namespace, ServiceAccount, Secret, ConfigMap, Role, RoleBinding, ClusterRole,
    /// ClusterRoleBinding, Lease.
    pub fn apply_yaml(&self, yaml: &str, namespaces: &[(&str, &str)]) {
        let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("the YAML parses");
        let map = |ns: &str| {
            namespaces
                .iter()
                .find(|(from, _)| *from == ns)
                .map_or(ns.to_string(), |(_, to)| to.to_string())
        };
        for mut doc in docs.into_iter().filter(|d| d.is_object()) {
            if let Some(ns) = doc["metadata"]["namespace"].as_str().map(map) {
                doc["metadata"]["namespace"] = json!(ns);
            }
            if let Some(subjects) = doc["subjects"].as_array_mut() {
                for s in subjects {
                    if let Some(ns) = s["namespace"].as_str().map(map) {
                        s["namespace"] = json!(ns);
                    }
                }
            }
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let ns = doc["metadata"]["namespace"].as_str().unwrap_or("default");
            let name = doc["metadata"]["name"].as_str().expect("metadata.name");
            let collection = match kind.as_str() {
                "Namespace" => "/api/v1/namespaces".to_string(),
                "ClusterRole" | "ClusterRoleBinding" => format!(
                    "/apis/rbac.authorization.k8s.io/v1/{}s",
                    kind.to_ascii_lowercase()
                ),
                "Role" | "RoleBinding" => format!(
                    "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/{}s",
                    kind.to_ascii_lowercase()
                ),
                "Lease" => format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"),
                "ValidatingAdmissionPolicy" => {
                    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies".to_string()
                }
                "ValidatingAdmissionPolicyBinding" => {
                    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
                        .to_string()
                }
                "ServiceAccount" | "Secret" | "ConfigMap" => {
                    format!("/api/v1/namespaces/{ns}/{}s", kind.to_ascii_lowercase())
                }
                other => panic!("apply_yaml: kind {other:?} is not supported"),
            };
            let path = format!("{collection}/{name}");
            match self.get_json(&path) {
                None => {
                    self.create(&collection, &doc);
                }
                Some(cur) => {
                    doc["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"].clone();
                    let r = self.put(&path, &doc);
                    assert_eq!(r.status, 200, "PUT {path}: {}", r.body);
                }
            }
        }
    }

    // ----- reading and writing objects

    /// The API path of `resource` (`secrets`, `configmaps`, `events`, `leases`,
    /// `serviceaccounts`, `pods`) in `ns`, and of object `name` if given.
    pub fn path(resource: &str, ns: &str, name: Option<&str>) -> String {
        let prefix = match resource {
            "leases" => "/apis/coordination.k8s.io/v1",
            "roles" | "rolebindings" => "/apis/rbac.authorization.k8s.io/v1",
            _ => "/api/v1",
        };
        match name {
            Some(n) => format!("{prefix}/namespaces/{ns}/{resource}/{n}"),
            None => format!("{prefix}/namespaces/{ns}/{resource}"),
        }
    }

    /// The object `ns/name` of `resource`, read as admin (`None` if absent).
    pub fn object(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        self.get_json(&Self::path(resource, ns, Some(name)))
    }

    /// Every `resource` in `ns`, sorted by name.
    pub fn objects(&self, resource: &str, ns: &str) -> Vec<Value> {
        let list = self
            .get_json(&Self::path(resource, ns, None))
            .unwrap_or_else(|| panic!("list {resource} in {ns}"));
        let mut items = list["items"].as_array().cloned().unwrap_or_default();
        items.sort_by(|a, b| {
            a["metadata"]["name"]
                .as_str()
                .cmp(&b["metadata"]["name"].as_str())
        });
        items
    }

    /// Creates `obj` as a `resource` in `ns`, or replaces the existing object of that name
    /// whatever its resourceVersion (a write by another client).
    pub fn put_object(&self, resource: &str, ns: &str, mut obj: Value) {
        let name = obj["metadata"]["name"]
            .as_str()
            .expect("metadata.name")
            .to_string();
        obj["metadata"]["namespace"] = json!(ns);
        for _ in 0..10 {
            let r = match self.object(resource, ns, &name) {
                None => self.request("POST", &Self::path(resource, ns, None), Some(&obj)),
                Some(cur) => {
                    obj["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"].clone();
                    self.put(&Self::path(resource, ns, Some(&name)), &obj)
                }
            };
            match r.status {
                200 | 201 => return,
                409 => continue,
                s => panic!("put {resource} {ns}/{name}: {s} {}", r.body),
            }
        }
        panic!("put {resource} {ns}/{name}: conflicts did not stop");
    }

    /// Changes `resource` `ns/name` with `f` (read, change, conditional PUT, retried on a
    /// conflict), as another client would; false if it does not exist.
    pub fn modify_object(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
        mut f: impl FnMut(&mut Value),
    ) -> bool {
        for _ in 0..10 {
            let Some(mut obj) = self.object(resource, ns, name) else {
                return false;
            };
            f(&mut obj);
            let r = self.put(&Self::path(resource, ns, Some(name)), &obj);
            match r.status {
                200 => return true,
                409 => continue,
                s => panic!("modify {resource} {ns}/{name}: {s} {}", r.body),
            }
        }
        panic!("modify {resource} {ns}/{name}: conflicts did not stop");
    }

    /// Deletes `resource` `ns/name`; true if it existed.
    pub fn delete_object(&self, resource: &str, ns: &str, name: &str) -> bool {
        self.delete(&Self::path(resource, ns, Some(name)))
    }

    /// The Secret `ns/name` as stored (`None` if absent).
    pub fn secret(&self, ns: &str, name: &str) -> Option<Value> {
        self.object("secrets", ns, name)
    }

    /// `data[key]` of Secret `ns/name`, base64-decoded.
    pub fn data(&self, ns: &str, name: &str, key: &str) -> Option<Vec<u8>> {
        let s = self.secret(ns, name)?;
        let text = s["data"][key].as_str()?.to_string();
        Some(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .expect("base64 data"),
        )
    }

    /// Annotation `ann` of Secret `ns/name`.
    pub fn annotation(&self, ns: &str, name: &str, ann: &str) -> Option<String> {
        let s = self.secret(ns, name)?;
        s["metadata"]["annotations"][ann]
            .as_str()
            .map(str::to_string)
    }

    /// The `keyplan.io/versions` annotation of Secret `ns/name`, parsed.
    pub fn versions(&self, ns: &str, name: &str) -> Option<Value> {
        self.annotation(ns, name, "keyplan.io/versions")
            .map(|t| serde_json::from_str(&t).expect("versions annotation is JSON"))
    }

    /// Creates or replaces the Secret `secret` (its `metadata.name`) in `ns`.
    pub fn put_secret(&self, ns: &str, secret: Value) {
        self.put_object("secrets", ns, secret)
    }

    /// Changes Secret `ns/name` with `f`, as another client would. Panics if absent.
    pub fn modify_secret(&self, ns: &str, name: &str, f: impl FnMut(&mut Value)) {
        assert!(
            self.modify_object("secrets", ns, name, f),
            "no Secret {ns}/{name} to modify"
        );
    }

    /// Names of the Secrets in `ns`, sorted.
    pub fn names(&self, ns: &str) -> Vec<String> {
        self.objects("secrets", ns)
            .iter()
            .filter_map(|s| s["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    }

    /// Every non-empty `data` value of every Secret in `ns`, decoded, without duplicates (for
    /// leak scans: what a test must never find in keyplan's output or files).
    pub fn all_data(&self, ns: &str) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = Vec::new();
        for s in self.objects("secrets", ns) {
            for v in s["data"].as_object().into_iter().flat_map(|d| d.values()) {
                let Some(b) = v
                    .as_str()
                    .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok())
                else {
                    continue;
                };
                if !b.is_empty() && !out.contains(&b) {
                    out.push(b);
                }
            }
        }
        out
    }

    /// The Lease `ns/name`, if any.
    pub fn lease(&self, ns: &str, name: &str) -> Option<Value> {
        self.object("leases", ns, name)
    }

    /// Changes Lease `ns/name` with `f`, as another client would; nothing if absent.
    pub fn modify_lease(&self, ns: &str, name: &str, f: impl FnMut(&mut Value)) {
        self.modify_object("leases", ns, name, f);
    }

    /// The ConfigMap `ns/name`, if any.
    pub fn configmap(&self, ns: &str, name: &str) -> Option<Value> {
        self.object("configmaps", ns, name)
    }

    /// Every ConfigMap in `ns`, by name.
    pub fn configmaps(&self, ns: &str) -> Vec<Value> {
        self.objects("configmaps", ns)
    }

    /// Creates or replaces the ConfigMap `cm` in `ns`.
    pub fn put_configmap(&self, ns: &str, cm: Value) {
        self.put_object("configmaps", ns, cm)
    }

    /// Changes ConfigMap `ns/name` with `f`, as another client would. Panics if absent.
    pub fn modify_configmap(&self, ns: &str, name: &str, f: impl FnMut(&mut Value)) {
        assert!(
            self.modify_object("configmaps", ns, name, f),
            "no ConfigMap {ns}/{name} to modify"
        );
    }

    /// Every Event in `ns`, by name.
    pub fn events(&self, ns: &str) -> Vec<Value> {
        self.objects("events", ns)
    }
}

/// Starts a cluster with its files in `dir`, writes `dir/cluster.json` (atomically, once
/// ready) for other processes (`KEYPLAN_KUBE_DIR=dir`), then serves until standard input
/// closes, and stops it. For `tests/fleet/kube_cluster.rs`.
pub fn serve(dir: &Path) {
    let bin = bin_dir();
    std::fs::create_dir_all(dir).expect("create the shared cluster dir");
    let cluster = Cluster::start_in(&bin, dir);
    let tmp = dir.join("cluster.json.tmp");
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(&cluster.info).expect("cluster.json"),
    )
    .expect("write cluster.json");
    std::fs::rename(&tmp, dir.join("cluster.json")).expect("publish cluster.json");
    eprintln!("kube: serving {} until stdin closes", cluster.info.url);
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    let _ = std::fs::remove_file(dir.join("cluster.json"));
    cluster.stop();
}
