//! An observation and fault proxy in front of the real API server of `kube.rs`: a plain-HTTP
//! loopback listener (keyplan's kube client accepts `http://` cluster URLs) that forwards
//! each request to kube-apiserver over TLS with the client's own `Authorization` header, so
//! the real authentication and RBAC decide. It logs every request (method, path, query, the
//! user of the token as registered by the harness, status), runs a hook before forwarding a
//! matching write (a concurrent writer between keyplan's read and its write, as the fake's
//! `before_write`), and injects faults (an error status, a broken answer, a delay) into
//! matching requests.
//!
//! Answers are buffered whole, except a watch's (`?watch=true`): it is streamed on a thread
//! of its own, each chunk written and flushed as the API server sends it (the agents' fleet
//! watch, src/fleet/watch.rs), and logged when it starts. Faults and hooks apply to watches
//! as to other requests.
//!
//! Include it after `kube.rs`: `#[path = "common/kube_proxy.rs"] mod kube_proxy;`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use super::kube::{block_on, Cluster};

/// One request the proxy forwarded (or answered with a fault).
#[derive(Debug, Clone)]
pub struct Logged {
    /// HTTP method, upper case.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string as sent (without `?`).
    pub query: String,
    /// The user of the bearer token ([`Cluster::user_of`]); `""` if unknown or missing.
    pub user: String,
    /// HTTP status of the answer (0 for a broken answer).
    pub code: u16,
}

impl Logged {
    /// The request as RBAC sees it: `(API group, resource, verb)`, the group `""` for core/v1,
    /// a subresource as `resource/sub`, the verb from the method, whether an object is named,
    /// and `watch=true` (the apiserver's request-info rules, k8s.io/apiserver
    /// `pkg/endpoints/request/requestinfo.go`). `None` for a path that is no resource.
    #[allow(dead_code)]
    pub fn call(&self) -> Option<(String, String, String)> {
        let parts: Vec<&str> = self.path.trim_matches('/').split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["api", _version, rest @ ..] => ("", rest),
            ["apis", group, _version, rest @ ..] => (*group, rest),
            _ => return None,
        };
        let rest = match rest {
            ["namespaces", _ns, r @ ..] if !r.is_empty() => r,
            r => r,
        };
        let (resource, named) = match rest {
            [res] => (res.to_string(), false),
            [res, _name] => (res.to_string(), true),
            [res, _name, sub] => (format!("{res}/{sub}"), true),
            _ => return None,
        };
        let watch = self
            .query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1");
        let verb = match (self.method.as_str(), named) {
            ("GET", _) if watch => "watch",
            ("GET", true) => "get",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            _ => return None,
        };
        Some((group.to_string(), resource, verb.to_string()))
    }

    /// Did this request change (or try to change) a Secret?
    pub fn is_secret_write(&self) -> bool {
        self.path.starts_with("/api/v1/")
            && self.path.contains("/secrets")
            && matches!(self.method.as_str(), "POST" | "PUT" | "DELETE" | "PATCH")
    }
}

/// A request about to be forwarded, shown to hook and fault predicates.
pub struct Request<'a> {
    /// HTTP method, upper case.
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The request body (`Value::Null` when empty or not JSON).
    pub body: &'a Value,
}

impl Request<'_> {
    /// Is this a write (`POST`, `PUT`, `PATCH`, `DELETE`) of a Secret in `ns` whose name (in
    /// the path, or the body of a `POST`) is `name`?
    pub fn is_secret_write(&self, ns: &str, name: &str) -> bool {
        let collection = format!("/api/v1/namespaces/{ns}/secrets");
        matches!(self.method, "POST" | "PUT" | "PATCH" | "DELETE")
            && (self.path == format!("{collection}/{name}")
                || (self.path == collection && self.body["metadata"]["name"] == name))
    }
}

/// What to do instead of (or before) forwarding a matching request.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer with this status and a `Status` body, without forwarding.
    Status(u16),
    /// Answer with bytes that are not HTTP (the client sees a broken connection, as after a
    /// reset), without forwarding.
    Garbage,
    /// Wait this long, then forward.
    Delay(Duration),
}

type Pred = Box<dyn FnMut(&Request<'_>) -> bool + Send>;
type Action = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Shared {
    log: Vec<Logged>,
    hooks: Vec<(Pred, Option<Action>)>,
    faults: Vec<(Pred, Fault, usize)>,
    /// Set by [`KubeProxy::stop`]: streaming watches end.
    stopped: bool,
}

/// A running proxy (stopped on drop).
pub struct KubeProxy {
    cluster: &'static Cluster,
    url: String,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

const WORKERS: usize = 8;

impl KubeProxy {
    /// Starts a proxy to `cluster` on a free loopback port.
    pub fn start(cluster: &'static Cluster) -> KubeProxy {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind the kube proxy"));
        let addr = server.server_addr().to_ip().expect("ip address");
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        super::kube::install_tls_provider();
        let client = reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only([reqwest::Certificate::from_pem(
                &std::fs::read(&cluster.info.ca).expect("cluster CA"),
            )
            .expect("cluster CA")])
            .timeout(Duration::from_secs(60))
            .build()
            .expect("proxy client");
        let threads = (0..WORKERS)
            .map(|_| {
                let (server, shared, stop, client) = (
                    Arc::clone(&server),
                    Arc::clone(&shared),
                    Arc::clone(&stop),
                    client.clone(),
                );
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        match server.recv_timeout(Duration::from_millis(50)) {
                            Ok(Some(req)) => handle(cluster, &client, &shared, req),
                            Ok(None) => {}
                            Err(_) => break,
                        }
                    }
                })
            })
            .collect();
        KubeProxy {
            cluster,
            url: format!("http://{addr}"),
            shared,
            stop,
            threads,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// [`Cluster::kubeconfig`] through this proxy (contexts `full`, `read-only`,
    /// `no-access`, `bad-token`).
    pub fn kubeconfig(&self, namespace: &str, current: &str) -> PathBuf {
        self.cluster.kubeconfig_at(&self.url, namespace, current)
    }

    /// [`Cluster::kubeconfig_with_token`] through this proxy.
    pub fn kubeconfig_with_token(&self, namespace: &str, token: &str) -> PathBuf {
        self.cluster
            .kubeconfig_with_token_at(&self.url, namespace, token)
    }

    /// [`Cluster::kubeconfig_with_token_file_at`] through this proxy.
    pub fn kubeconfig_with_token_file(
        &self,
        namespace: &str,
        token_file: &std::path::Path,
    ) -> PathBuf {
        self.cluster
            .kubeconfig_with_token_file_at(&self.url, namespace, token_file)
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<Logged> {
        self.lock().log.clone()
    }

    /// Every request answered so far that authenticated as `user`.
    pub fn requests_by_user(&self, user: &str) -> Vec<Logged> {
        self.lock()
            .log
            .iter()
            .filter(|r| r.user == user)
            .cloned()
            .collect()
    }

    /// Number of requests answered so far (a mark for [`KubeProxy::requests_since`]).
    pub fn mark(&self) -> usize {
        self.lock().log.len()
    }

    /// The requests answered after `mark`.
    pub fn requests_since(&self, mark: usize) -> Vec<Logged> {
        self.lock().log[mark..].to_vec()
    }

    /// Runs `action` once, right before forwarding the first request for which `pred` is
    /// true (typically a Secret write: [`Request::is_secret_write`]); the action writes
    /// through the cluster's admin client, as a concurrent writer would.
    pub fn before_write(
        &self,
        pred: impl FnMut(&Request<'_>) -> bool + Send + 'static,
        action: impl FnOnce() + Send + 'static,
    ) {
        self.lock()
            .hooks
            .push((Box::new(pred), Some(Box::new(action))));
    }

    /// Applies `fault` to the next `times` requests for which `pred` is true.
    pub fn inject(
        &self,
        pred: impl FnMut(&Request<'_>) -> bool + Send + 'static,
        fault: Fault,
        times: usize,
    ) {
        self.lock().faults.push((Box::new(pred), fault, times));
    }

    /// Stops serving (waits for the workers, which poll every 50 ms).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.lock().stopped = true;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn header(req: &tiny_http::Request, name: &str) -> Option<String> {
    req.headers()
        .iter()
        .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str().to_string())
}

/// Forwards a watch and streams its answer: the status line and headers as the API server
/// sent them (`Transfer-Encoding: chunked`, `Connection: close`), then every chunk as it
/// comes, flushed. Ends when either side does.
fn stream_watch(
    client: &reqwest::Client,
    shared: &Mutex<Shared>,
    req: tiny_http::Request,
    target: String,
    auth: Option<String>,
    accept: Option<String>,
    mut entry: Logged,
) {
    use std::io::Write as _;
    let resp = block_on(async {
        let mut r = client.get(target).timeout(Duration::from_secs(600));
        if let Some(a) = &auth {
            r = r.header("Authorization", a);
        }
        if let Some(acc) = &accept {
            r = r.header("Accept", acc);
        }
        r.send().await
    });
    let mut w = req.into_writer();
    let mut resp = match resp {
        Ok(resp) => resp,
        Err(e) => {
            entry.code = 502;
            shared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .log
                .push(entry);
            let text = format!("proxy: {e}");
            let _ = write!(
                w,
                "HTTP/1.1 502 Bad Gateway\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
            let _ = w.flush();
            return;
        }
    };
    entry.code = resp.status().as_u16();
    shared
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .log
        .push(entry);
    let ct = resp
        .headers()
        .get("Content-Type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let status = resp.status();
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {ct}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    if w.write_all(head.as_bytes())
        .and_then(|_| w.flush())
        .is_err()
    {
        return;
    }
    loop {
        if shared.lock().unwrap_or_else(|e| e.into_inner()).stopped {
            // The proxy stopped: so do its watches (the client sees the connection end).
            return;
        }
        let chunk = match block_on(async {
            tokio::time::timeout(Duration::from_millis(500), resp.chunk()).await
        }) {
            Err(_) => continue,
            Ok(Ok(Some(chunk))) => chunk,
            Ok(_) => break,
        };
        let sent = write!(w, "{:x}\r\n", chunk.len())
            .and_then(|_| w.write_all(&chunk))
            .and_then(|_| w.write_all(b"\r\n"))
            .and_then(|_| w.flush());
        if sent.is_err() {
            return;
        }
    }
    let _ = w.write_all(b"0\r\n\r\n").and_then(|_| w.flush());
}

fn handle(
    cluster: &Cluster,
    client: &reqwest::Client,
    shared: &Arc<Mutex<Shared>>,
    mut req: tiny_http::Request,
) {
    let method = req.method().as_str().to_ascii_uppercase();
    let url = req.url().to_string();
    let (path, query) = url.split_once('?').unwrap_or((url.as_str(), ""));
    let (path, query) = (path.to_string(), query.to_string());
    let auth = header(&req, "Authorization");
    let content_type = header(&req, "Content-Type");
    let user = auth
        .as_deref()
        .and_then(|a| a.strip_prefix("Bearer "))
        .and_then(|t| cluster.user_of(t.trim()))
        .unwrap_or_default();
    let mut body = Vec::new();
    let _ = req.as_reader().read_to_end(&mut body);
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let view = Request {
        method: &method,
        path: &path,
        body: &json,
    };
    // Faults and hooks are chosen under the lock and run outside it.
    let (fault, action) = {
        let mut s = shared.lock().unwrap_or_else(|e| e.into_inner());
        let mut fault = None;
        for (pred, f, times) in s.faults.iter_mut() {
            if *times > 0 && pred(&view) {
                *times -= 1;
                fault = Some(f.clone());
                break;
            }
        }
        let mut action = None;
        if fault.is_none() || matches!(fault, Some(Fault::Delay(_))) {
            for (pred, a) in s.hooks.iter_mut() {
                if a.is_some() && pred(&view) {
                    action = a.take();
                    break;
                }
            }
        }
        (fault, action)
    };
    let log = |code: u16| {
        shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .log
            .push(Logged {
                method: method.clone(),
                path: path.clone(),
                query: query.clone(),
                user: user.clone(),
                code,
            });
    };
    match fault {
        Some(Fault::Status(code)) => {
            let body = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                "status": "Failure", "message": "injected by the test proxy", "code": code});
            log(code);
            let _ = req.respond(
                tiny_http::Response::from_data(body.to_string())
                    .with_status_code(code)
                    .with_header(json_header()),
            );
            return;
        }
        Some(Fault::Garbage) => {
            log(0);
            let mut w = req.into_writer();
            let _ = std::io::Write::write_all(&mut w, b"NOT-HTTP garbage\r\n\r\n");
            let _ = std::io::Write::flush(&mut w);
            return;
        }
        Some(Fault::Delay(d)) => std::thread::sleep(d),
        None => {}
    }
    if let Some(action) = action {
        action();
    }
    let target = format!("{}{url}", cluster.info.url);
    if query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1")
    {
        let accept = header(&req, "Accept");
        let (client, shared) = (client.clone(), Arc::clone(shared));
        let entry = Logged {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            user: user.clone(),
            code: 0,
        };
        std::thread::spawn(move || {
            stream_watch(&client, &shared, req, target, auth, accept, entry)
        });
        return;
    }
    let m = reqwest::Method::from_bytes(method.as_bytes()).expect("HTTP method");
    let result = block_on(async {
        let mut r = client.request(m, target).body(body);
        if let Some(a) = &auth {
            r = r.header("Authorization", a);
        }
        if let Some(ct) = &content_type {
            r = r.header("Content-Type", ct);
        }
        if let Some(acc) = header(&req, "Accept") {
            r = r.header("Accept", acc);
        }
        let resp = r.send().await?;
        let code = resp.status().as_u16();
        let ct = resp
            .headers()
            .get("Content-Type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        Ok::<_, reqwest::Error>((code, ct, resp.bytes().await?))
    });
    match result {
        Ok((code, ct, bytes)) => {
            log(code);
            let mut resp = tiny_http::Response::from_data(bytes.to_vec()).with_status_code(code);
            if let Some(ct) = ct.and_then(|v| {
                tiny_http::Header::from_bytes(&b"Content-Type"[..], v.as_bytes()).ok()
            }) {
                resp = resp.with_header(ct);
            }
            let _ = req.respond(resp);
        }
        Err(e) => {
            log(502);
            let _ = req.respond(
                tiny_http::Response::from_string(format!("proxy: {e}")).with_status_code(502),
            );
        }
    }
}

fn json_header() -> tiny_http::Header {
    tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]).expect("header")
}
