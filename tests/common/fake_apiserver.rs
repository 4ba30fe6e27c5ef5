//! A small in-process fake of the Kubernetes API server for core/v1 Secrets, for tests (no real
//! kube-apiserver can run here). It follows the documented semantics of the real API:
//!
//! - Secret v1 (<https://kubernetes.io/docs/reference/kubernetes-api/config-and-storage-resources/secret-v1/>):
//!   `GET`/`POST` `/api/v1/namespaces/{ns}/secrets`, `GET`/`PUT`/`DELETE`
//!   `/api/v1/namespaces/{ns}/secrets/{name}`; `data` values are base64; `stringData` is merged
//!   into `data` on write and never returned; `type` defaults to `Opaque`; the `data` values of
//!   one Secret may hold at most 1 MiB (1048576 bytes) together (422 `Invalid`); a Secret with
//!   `immutable: true` refuses any change of `data`, `type` or `immutable` (422 `Invalid`), but
//!   may be deleted.
//! - API concepts (<https://kubernetes.io/docs/reference/using-api/api-concepts/>): one global,
//!   increasing `resourceVersion` (a write that changes nothing does not bump it); `PUT` with a
//!   stale `metadata.resourceVersion` is 409 `Conflict` (without one it is unconditional);
//!   `POST` of an existing name is 409 `AlreadyExists`; missing objects are 404 `NotFound`;
//!   `DELETE` honours `preconditions.uid`/`resourceVersion` (409) and answers a `Status`.
//! - Authentication and authorization: bearer tokens; an unknown or missing token is 401
//!   `Unauthorized`; a known one has a policy ([`Access`]) and forbidden verbs are 403
//!   `Forbidden` with the real server's message. `POST
//!   /apis/authorization.k8s.io/v1/selfsubjectaccessreviews` answers per the same policy (any
//!   authenticated user may ask).
//! - TokenReview (<https://kubernetes.io/docs/reference/kubernetes-api/authentication-resources/token-review-v1/>):
//!   `POST /apis/authentication.k8s.io/v1/tokenreviews` with `spec.token` answers 201 with
//!   `status.authenticated` and, for a service account token registered with
//!   [`FakeApiserver::add_service_account_token`], `status.user` (`username`
//!   `system:serviceaccount:<ns>:<name>`, `uid`, `groups`) and `status.audiences`; an unknown
//!   token is `authenticated: false` with `status.error`. The reviewer must be authorized to
//!   create tokenreviews: only a token with [`Access::Full`] is (others get 403).
//! - Lease v1 (<https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/lease-v1/>):
//!   `GET`/`POST` `/apis/coordination.k8s.io/v1/namespaces/{ns}/leases`, `GET`/`PUT`/`DELETE`
//!   `.../leases/{name}`, with the same resourceVersion rules as Secrets (409 `Conflict` on a
//!   stale `PUT`, 409 `AlreadyExists`, 404 `NotFound`, 422 `Invalid` for a bad name); the
//!   spec is stored as sent. Only [`Access::Full`] may use Leases (others get 403).
//!
//! Every error is a `kind: Status` object as the real server returns it. Plain HTTP on a free
//! loopback port (the kube client accepts `http://` cluster URLs). Tests read and change the
//! stored Secrets directly (an independent reader and a concurrent writer), hook a change in
//! front of a chosen write, and see every request made.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

/// What a bearer token may do with Secrets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// get, list, create, update, delete.
    Full,
    /// get and list only.
    ReadOnly,
    /// Authenticated, but no permission on Secrets.
    Nothing,
}

/// Most bytes the data values of one Secret may hold (the API server's `MaxSecretSize`).
pub const MAX_SECRET_SIZE: usize = 1 << 20;

/// One request the fake answered: method, path (without query) and status code.
#[derive(Debug, Clone)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub code: u16,
}

impl Logged {
    /// Did this request change (or try to change) a Secret?
    pub fn is_secret_write(&self) -> bool {
        self.path.contains("/secrets")
            && matches!(self.method.as_str(), "POST" | "PUT" | "DELETE" | "PATCH")
    }
}

/// A write about to be processed, shown to [`FakeApiserver::before_write`] predicates.
pub struct Write<'a> {
    pub method: &'a str,
    pub namespace: &'a str,
    /// Secret name (from the URL, or the body of a `POST`).
    pub name: &'a str,
    /// The request body (`Value::Null` when empty).
    pub body: &'a Value,
}

type Pred = Box<dyn FnMut(&Write<'_>) -> bool + Send>;
type Action = Box<dyn FnOnce(&mut Store) + Send>;

/// The stored objects.
pub struct Store {
    rv: u64,
    uid: u64,
    secrets: BTreeMap<(String, String), Value>,
    /// coordination.k8s.io/v1 Leases by namespace and name.
    leases: BTreeMap<(String, String), Value>,
}

impl Store {
    fn bump(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    /// The stored Secret `ns/name`, as the API would return it.
    pub fn get(&self, ns: &str, name: &str) -> Option<Value> {
        self.secrets
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Stores `secret` (its `metadata.name`) in `ns` as a direct write: new resourceVersion,
    /// uid and creationTimestamp kept if it existed, else assigned; `stringData` merged.
    pub fn put(&mut self, ns: &str, mut secret: Value) {
        let name = secret["metadata"]["name"]
            .as_str()
            .expect("metadata.name")
            .to_string();
        merge_string_data(&mut secret);
        let key = (ns.to_string(), name);
        let (uid, created) = match self.secrets.get(&key) {
            Some(old) => (
                old["metadata"]["uid"].clone(),
                old["metadata"]["creationTimestamp"].clone(),
            ),
            None => {
                self.uid += 1;
                (json!(uid_string(self.uid)), json!(timestamp_now()))
            }
        };
        let rv = self.bump();
        let obj = secret.as_object_mut().expect("object");
        obj.insert("apiVersion".into(), json!("v1"));
        obj.insert("kind".into(), json!("Secret"));
        obj.entry("type").or_insert(json!("Opaque"));
        let meta = obj.entry("metadata").or_insert(json!({}));
        meta["namespace"] = json!(ns);
        meta["uid"] = uid;
        meta["creationTimestamp"] = created;
        meta["resourceVersion"] = json!(rv);
        self.secrets.insert(key, secret);
    }

    /// Changes Secret `ns/name` in place with `f` (a concurrent writer) and bumps its
    /// resourceVersion. Panics if it does not exist.
    pub fn modify(&mut self, ns: &str, name: &str, f: impl FnOnce(&mut Value)) {
        let rv = self.bump();
        let s = self
            .secrets
            .get_mut(&(ns.to_string(), name.to_string()))
            .expect("secret to modify");
        f(s);
        s["metadata"]["resourceVersion"] = json!(rv);
    }

    /// Deletes Secret `ns/name` directly; true if it existed.
    pub fn delete(&mut self, ns: &str, name: &str) -> bool {
        let existed = self
            .secrets
            .remove(&(ns.to_string(), name.to_string()))
            .is_some();
        if existed {
            self.bump();
        }
        existed
    }
}

/// A service account a token belongs to, for TokenReview.
#[derive(Debug, Clone)]
struct ServiceAccount {
    namespace: String,
    name: String,
    uid: String,
    audiences: Vec<String>,
}

struct Shared {
    store: Store,
    tokens: BTreeMap<String, (String, Access)>,
    service_accounts: BTreeMap<String, ServiceAccount>,
    log: Vec<Logged>,
    hooks: Vec<(Pred, Option<Action>)>,
}

/// A running fake API server (stopped on drop).
pub struct FakeApiserver {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    dir: tempfile::TempDir,
    /// Bearer token with [`Access::Full`].
    pub full_token: String,
    /// Bearer token with [`Access::ReadOnly`].
    pub read_only_token: String,
    /// Bearer token with [`Access::Nothing`].
    pub no_access_token: String,
}

impl FakeApiserver {
    /// Starts a fake on a free loopback port with three tokens (full, read-only, no access).
    pub fn start() -> FakeApiserver {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind fake apiserver"));
        let addr = server.server_addr().to_ip().expect("ip address");
        let tag = format!("{:016x}", rand::random::<u64>());
        let full_token = format!("kp-full-{tag}");
        let read_only_token = format!("kp-ro-{tag}");
        let no_access_token = format!("kp-none-{tag}");
        let mut tokens = BTreeMap::new();
        tokens.insert(
            full_token.clone(),
            (
                "system:serviceaccount:rook-ceph:keyplan".to_string(),
                Access::Full,
            ),
        );
        tokens.insert(
            read_only_token.clone(),
            (
                "system:serviceaccount:rook-ceph:reader".to_string(),
                Access::ReadOnly,
            ),
        );
        tokens.insert(
            no_access_token.clone(),
            (
                "system:serviceaccount:default:nobody".to_string(),
                Access::Nothing,
            ),
        );
        let shared = Arc::new(Mutex::new(Shared {
            store: Store {
                rv: 1000,
                uid: 0,
                secrets: BTreeMap::new(),
                leases: BTreeMap::new(),
            },
            tokens,
            service_accounts: BTreeMap::new(),
            log: Vec::new(),
            hooks: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..4)
            .map(|_| {
                let server = Arc::clone(&server);
                let shared = Arc::clone(&shared);
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        match server.recv_timeout(Duration::from_millis(50)) {
                            Ok(Some(req)) => handle(&shared, req),
                            Ok(None) => {}
                            Err(_) => break,
                        }
                    }
                })
            })
            .collect();
        FakeApiserver {
            addr,
            shared,
            stop,
            threads,
            dir: tempfile::tempdir().expect("tempdir"),
            full_token,
            read_only_token,
            no_access_token,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig for this server (outside any scratch directory, so leak scans of
    /// a scratch directory do not find its tokens) and returns its path. Contexts `full`,
    /// `read-only`, `no-access` (the three tokens) and `bad-token` (an unknown token), all
    /// with namespace `namespace`; `current` is the current context.
    pub fn kubeconfig(&self, namespace: &str, current: &str) -> PathBuf {
        let users = [
            ("full", self.full_token.clone()),
            ("read-only", self.read_only_token.clone()),
            ("no-access", self.no_access_token.clone()),
            ("bad-token", "kp-not-a-valid-token".to_string()),
        ];
        let mut text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n",
            self.url()
        );
        for (u, _) in &users {
            text.push_str(&format!(
                "- name: {u}\n  context:\n    cluster: fake\n    user: {u}\n    namespace: {namespace}\n"
            ));
        }
        text.push_str("users:\n");
        for (u, t) in &users {
            text.push_str(&format!("- name: {u}\n  user:\n    token: {t}\n"));
        }
        text.push_str(&format!("current-context: {current}\n"));
        let path = self
            .dir
            .path()
            .join(format!("kubeconfig-{namespace}-{current}"));
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// Accepts `token` from now on as user `user` with `access`.
    pub fn add_token(&self, token: &str, user: &str, access: Access) {
        self.lock()
            .tokens
            .insert(token.to_string(), (user.to_string(), access));
    }

    /// Makes TokenReview say that `jwt` is a valid token of service account `name` (uid `uid`)
    /// in `namespace`, for the audiences `audiences`.
    pub fn add_service_account_token(
        &self,
        jwt: &str,
        namespace: &str,
        name: &str,
        uid: &str,
        audiences: &[&str],
    ) {
        self.lock().service_accounts.insert(
            jwt.to_string(),
            ServiceAccount {
                namespace: namespace.to_string(),
                name: name.to_string(),
                uid: uid.to_string(),
                audiences: audiences.iter().map(|a| a.to_string()).collect(),
            },
        );
    }

    /// Writes a kubeconfig for this server whose one user authenticates with the token in
    /// the file `token_file` (`tokenFile`, as a kubeconfig for a service account does), and
    /// returns its path.
    pub fn kubeconfig_with_token_file(
        &self,
        namespace: &str,
        token_file: &std::path::Path,
    ) -> PathBuf {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n- name: sa\n  context:\n    cluster: fake\n    user: sa\n    namespace: {namespace}\nusers:\n- name: sa\n  user:\n    tokenFile: {}\ncurrent-context: sa\n",
            self.url(),
            token_file.display()
        );
        let path = self
            .dir
            .path()
            .join(format!("kubeconfig-{namespace}-token-file"));
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// Runs `f` on the store (direct access, bypassing authentication).
    pub fn with_store<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        f(&mut self.lock().store)
    }

    /// The stored Secret `ns/name`.
    pub fn secret(&self, ns: &str, name: &str) -> Option<Value> {
        self.lock().store.get(ns, name)
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

    /// Stores `secret` in `ns` directly (see [`Store::put`]).
    pub fn put_secret(&self, ns: &str, secret: Value) {
        self.lock().store.put(ns, secret)
    }

    /// Changes Secret `ns/name` directly (see [`Store::modify`]).
    pub fn modify_secret(&self, ns: &str, name: &str, f: impl FnOnce(&mut Value)) {
        self.lock().store.modify(ns, name, f)
    }

    /// Names of the Secrets in `ns`.
    pub fn names(&self, ns: &str) -> Vec<String> {
        self.lock()
            .store
            .secrets
            .keys()
            .filter(|(n, _)| n == ns)
            .map(|(_, name)| name.clone())
            .collect()
    }

    /// Every data value stored now, decoded (for leak scans).
    pub fn all_data(&self) -> Vec<Vec<u8>> {
        let shared = self.lock();
        let mut out = Vec::new();
        for s in shared.store.secrets.values() {
            if let Some(data) = s["data"].as_object() {
                for v in data.values() {
                    if let Some(t) = v.as_str() {
                        if let Ok(b) = base64::engine::general_purpose::STANDARD.decode(t) {
                            if !b.is_empty() && !out.contains(&b) {
                                out.push(b);
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<Logged> {
        self.lock().log.clone()
    }

    /// Number of requests answered so far (a mark for [`FakeApiserver::requests_since`]).
    pub fn mark(&self) -> usize {
        self.lock().log.len()
    }

    /// The requests answered after `mark`.
    pub fn requests_since(&self, mark: usize) -> Vec<Logged> {
        self.lock().log[mark..].to_vec()
    }

    /// Runs `action` on the store once, right before the first authorized write of a Secret
    /// for which `pred` is true (a concurrent writer sneaking in between keyplan's read and
    /// its write).
    pub fn before_write(
        &self,
        pred: impl FnMut(&Write<'_>) -> bool + Send + 'static,
        action: impl FnOnce(&mut Store) + Send + 'static,
    ) {
        self.lock()
            .hooks
            .push((Box::new(pred), Some(Box::new(action))));
    }

    /// Stops serving: the port is closed afterwards (connections are refused).
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for FakeApiserver {
    fn drop(&mut self) {
        self.stop();
    }
}

fn uid_string(n: u64) -> String {
    format!("00000000-0000-4000-8000-{n:012x}")
}

fn timestamp_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(now)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Merges `stringData` into `data` (base64) and removes it, as the API server does.
fn merge_string_data(secret: &mut Value) {
    let Some(obj) = secret.as_object_mut() else {
        return;
    };
    if let Some(Value::Object(sd)) = obj.remove("stringData") {
        let data = obj.entry("data").or_insert(json!({}));
        for (k, v) in sd {
            let text = v.as_str().unwrap_or_default();
            data[k] = json!(base64::engine::general_purpose::STANDARD.encode(text));
        }
    }
}

fn status(code: u16, reason: &str, message: &str, details: Option<Value>) -> (u16, Value) {
    let mut v = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if let Some(d) = details {
        v["details"] = d;
    }
    (code, v)
}

fn not_found(name: &str) -> (u16, Value) {
    status(
        404,
        "NotFound",
        &format!("secrets \"{name}\" not found"),
        Some(json!({"name": name, "kind": "secrets"})),
    )
}

fn invalid(name: &str, causes: &[(String, String)]) -> (u16, Value) {
    let texts: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
    let joined = if texts.len() == 1 {
        texts[0].clone()
    } else {
        format!("[{}]", texts.join(", "))
    };
    status(
        422,
        "Invalid",
        &format!("Secret \"{name}\" is invalid: {joined}"),
        Some(json!({
            "name": name,
            "kind": "Secret",
            "causes": causes.iter().map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f})).collect::<Vec<_>>(),
        })),
    )
}

fn is_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// ValidateSecret: name, data keys, base64 values, total size.
fn validate(name: &str, secret: &Value) -> Result<(), (u16, Value)> {
    let mut causes = Vec::new();
    if name.is_empty() {
        causes.push((
            "metadata.name".to_string(),
            "Required value: name or generateName is required".to_string(),
        ));
    } else if !is_subdomain(name) {
        causes.push((
            "metadata.name".to_string(),
            format!("Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
        ));
    }
    let mut total = 0usize;
    if let Some(data) = secret["data"].as_object() {
        for (k, v) in data {
            if k.is_empty()
                || !k
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"-._".contains(&c))
            {
                causes.push((format!("data[{k}]"), format!("Invalid value: \"{k}\": a valid config key must consist of alphanumeric characters, '-', '_' or '.'")));
            }
            let Some(text) = v.as_str() else {
                return Err(status(
                    400,
                    "BadRequest",
                    "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data",
                    None,
                ));
            };
            match base64::engine::general_purpose::STANDARD.decode(text) {
                Ok(b) => total += b.len(),
                Err(_) => return Err(status(
                    400,
                    "BadRequest",
                    "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data",
                    None,
                )),
            }
        }
    }
    if total > MAX_SECRET_SIZE {
        causes.push((
            "data".to_string(),
            format!("Too long: must have at most {MAX_SECRET_SIZE} bytes"),
        ));
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(invalid(name, &causes))
    }
}

fn forbidden(user: &str, verb: &str, ns: &str, name: Option<&str>) -> (u16, Value) {
    let what = match name {
        Some(n) => format!("secrets \"{n}\""),
        None => "secrets".to_string(),
    };
    status(
        403,
        "Forbidden",
        &format!("{what} is forbidden: User \"{user}\" cannot {verb} resource \"secrets\" in API group \"\" in the namespace \"{ns}\""),
        Some(json!({"name": name.unwrap_or(""), "kind": "secrets"})),
    )
}

fn allows(access: Access, verb: &str) -> bool {
    match access {
        Access::Full => matches!(
            verb,
            "get" | "list" | "watch" | "create" | "update" | "patch" | "delete"
        ),
        Access::ReadOnly => matches!(verb, "get" | "list" | "watch"),
        Access::Nothing => false,
    }
}

fn handle(shared: &Arc<Mutex<Shared>>, mut req: tiny_http::Request) {
    let method = req.method().as_str().to_uppercase();
    let url = req.url().to_string();
    let path = url.split('?').next().unwrap_or("").to_string();
    let token = req
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .and_then(|h| h.value.as_str().strip_prefix("Bearer ").map(str::to_string));
    let mut body_bytes = Vec::new();
    let _ = req.as_reader().read_to_end(&mut body_bytes);
    let body: Option<Value> = if body_bytes.is_empty() {
        Some(Value::Null)
    } else {
        serde_json::from_slice(&body_bytes).ok()
    };
    let (code, answer) = {
        let mut sh = shared.lock().unwrap_or_else(|e| e.into_inner());
        let (code, answer) = route(&mut sh, &method, &path, token.as_deref(), body);
        sh.log.push(Logged {
            method: method.clone(),
            path: path.clone(),
            code,
        });
        (code, answer)
    };
    let data = serde_json::to_vec(&answer).unwrap_or_default();
    let resp = tiny_http::Response::from_data(data)
        .with_status_code(code)
        .with_header(
            tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..])
                .expect("header"),
        );
    let _ = req.respond(resp);
}

fn route(
    sh: &mut Shared,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let Some((user, access)) = token.and_then(|t| sh.tokens.get(t)).cloned() else {
        return status(401, "Unauthorized", "Unauthorized", None);
    };
    let Some(body) = body else {
        return status(
            400,
            "BadRequest",
            "the request body is not valid JSON",
            None,
        );
    };
    if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" && method == "POST" {
        let attrs = &body["spec"]["resourceAttributes"];
        let verb = attrs["verb"].as_str().unwrap_or("");
        let resource = attrs["resource"].as_str().unwrap_or("");
        let group = attrs["group"].as_str().unwrap_or("");
        let allowed = resource == "secrets" && group.is_empty() && allows(access, verb);
        let mut st = json!({"allowed": allowed});
        if allowed {
            st["reason"] = json!(format!(
                "RBAC: allowed by RoleBinding \"keyplan\" of Role \"keyplan\" to User \"{user}\""
            ));
        }
        return review(
            "SelfSubjectAccessReview",
            "authorization.k8s.io/v1",
            &body,
            st,
        );
    }
    if path == "/apis/authentication.k8s.io/v1/tokenreviews" && method == "POST" {
        return token_review(sh, &user, access, &body);
    }
    if let Some(rest) = path.strip_prefix("/apis/coordination.k8s.io/v1/namespaces/") {
        return lease(&mut sh.store, &user, access, method, rest, body);
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (ns, name) = match parts.as_slice() {
        ["api", "v1", "namespaces", ns, "secrets"] => (ns.to_string(), None),
        ["api", "v1", "namespaces", ns, "secrets", name] => {
            (ns.to_string(), Some(name.to_string()))
        }
        _ => {
            return status(
                404,
                "NotFound",
                "the server could not find the requested resource",
                None,
            )
        }
    };
    let verb = match (method, name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", false) => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        _ => {
            return status(
                405,
                "MethodNotAllowed",
                &format!(
                    "the server does not allow this method on the requested resource ({method})"
                ),
                None,
            )
        }
    };
    if !allows(access, verb) {
        return forbidden(&user, verb, &ns, name.as_deref());
    }
    if verb != "get" && verb != "list" {
        let target = name
            .clone()
            .unwrap_or_else(|| body["metadata"]["name"].as_str().unwrap_or("").to_string());
        let w = Write {
            method,
            namespace: &ns,
            name: &target,
            body: &body,
        };
        let mut fire = None;
        for (pred, action) in sh.hooks.iter_mut() {
            if action.is_some() && pred(&w) {
                fire = action.take();
                break;
            }
        }
        sh.hooks.retain(|(_, a)| a.is_some());
        if let Some(action) = fire {
            action(&mut sh.store);
        }
    }
    let store = &mut sh.store;
    match verb {
        "get" => {
            let name = name.unwrap_or_default();
            match store.get(&ns, &name) {
                Some(s) => (200, s),
                None => not_found(&name),
            }
        }
        "list" => {
            let items: Vec<Value> = store
                .secrets
                .iter()
                .filter(|((n, _), _)| *n == ns)
                .map(|(_, v)| v.clone())
                .collect();
            (
                200,
                json!({"kind": "SecretList", "apiVersion": "v1", "metadata": {"resourceVersion": store.rv.to_string()}, "items": items}),
            )
        }
        "create" => create(store, &ns, body),
        "update" => update(store, &ns, &name.unwrap_or_default(), body),
        "delete" => delete(store, &ns, &name.unwrap_or_default(), &body),
        _ => status(
            405,
            "MethodNotAllowed",
            "PATCH is not supported by this fake",
            None,
        ),
    }
}

/// A Lease request by `user` (`access`): `rest` is the path after
/// `/apis/coordination.k8s.io/v1/namespaces/`.
fn lease(
    store: &mut Store,
    user: &str,
    access: Access,
    method: &str,
    rest: &str,
    mut body: Value,
) -> (u16, Value) {
    let parts: Vec<&str> = rest.split('/').collect();
    let (ns, name) = match parts.as_slice() {
        [ns, "leases"] => (ns.to_string(), None),
        [ns, "leases", name] => (ns.to_string(), Some(name.to_string())),
        _ => {
            return status(
                404,
                "NotFound",
                "the server could not find the requested resource",
                None,
            )
        }
    };
    let gone = |name: &str| {
        status(
            404,
            "NotFound",
            &format!("leases.coordination.k8s.io \"{name}\" not found"),
            Some(json!({"name": name, "group": "coordination.k8s.io", "kind": "leases"})),
        )
    };
    if access != Access::Full {
        return status(
            403,
            "Forbidden",
            &format!("leases.coordination.k8s.io is forbidden: User \"{user}\" cannot {} resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"{ns}\"", method.to_lowercase()),
            Some(json!({"group": "coordination.k8s.io", "kind": "leases"})),
        );
    }
    match (method, name) {
        ("GET", Some(name)) => match store.leases.get(&(ns, name.clone())) {
            Some(l) => (200, l.clone()),
            None => gone(&name),
        },
        ("GET", None) => {
            let items: Vec<Value> = store
                .leases
                .iter()
                .filter(|((n, _), _)| *n == ns)
                .map(|(_, l)| l.clone())
                .collect();
            let rv = store.rv.to_string();
            (
                200,
                json!({"kind": "LeaseList", "apiVersion": "coordination.k8s.io/v1", "metadata": {"resourceVersion": rv}, "items": items}),
            )
        }
        ("POST", None) => {
            let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
            if !is_subdomain(&name) {
                return invalid(&name, &[("metadata.name".into(), "Invalid value".into())]);
            }
            if store.leases.contains_key(&(ns.clone(), name.clone())) {
                return status(
                    409,
                    "AlreadyExists",
                    &format!("leases.coordination.k8s.io \"{name}\" already exists"),
                    Some(json!({"name": name, "group": "coordination.k8s.io", "kind": "leases"})),
                );
            }
            store.uid += 1;
            let uid = uid_string(store.uid);
            let rv = store.bump();
            body["metadata"]["namespace"] = json!(ns);
            body["metadata"]["uid"] = json!(uid);
            body["metadata"]["resourceVersion"] = json!(rv);
            body["metadata"]["creationTimestamp"] = json!(timestamp_now());
            body["kind"] = json!("Lease");
            body["apiVersion"] = json!("coordination.k8s.io/v1");
            store.leases.insert((ns, name), body.clone());
            (201, body)
        }
        ("PUT", Some(name)) => {
            let key = (ns.clone(), name.clone());
            let Some(old) = store.leases.get(&key).cloned() else {
                return gone(&name);
            };
            let sent = body["metadata"]["resourceVersion"]
                .as_str()
                .map(str::to_string);
            if sent
                .as_deref()
                .is_some_and(|rv| Some(rv) != old["metadata"]["resourceVersion"].as_str())
            {
                return status(
                    409,
                    "Conflict",
                    &format!("Operation cannot be fulfilled on leases.coordination.k8s.io \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
                    Some(json!({"name": name, "group": "coordination.k8s.io", "kind": "leases"})),
                );
            }
            let rv = store.bump();
            let mut meta = old["metadata"].clone();
            meta["resourceVersion"] = json!(rv);
            body["metadata"] = meta;
            body["kind"] = json!("Lease");
            body["apiVersion"] = json!("coordination.k8s.io/v1");
            store.leases.insert(key, body.clone());
            (200, body)
        }
        ("DELETE", Some(name)) => match store.leases.remove(&(ns, name.clone())) {
            Some(_) => (
                200,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name, "group": "coordination.k8s.io", "kind": "leases"}}),
            ),
            None => gone(&name),
        },
        _ => status(
            405,
            "MethodNotAllowed",
            &format!("the server does not allow this method on the requested resource ({method})"),
            None,
        ),
    }
}

impl FakeApiserver {
    /// The Lease `ns/name` as stored, if any (direct access, bypassing authentication).
    pub fn lease(&self, ns: &str, name: &str) -> Option<Value> {
        self.lock()
            .store
            .leases
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Changes the stored Lease `ns/name` with `f` (bumping its resourceVersion), as another
    /// client would.
    pub fn modify_lease(&self, ns: &str, name: &str, f: impl FnOnce(&mut Value)) {
        let mut sh = self.lock();
        let rv = sh.store.bump();
        if let Some(l) = sh.store.leases.get_mut(&(ns.to_string(), name.to_string())) {
            f(l);
            l["metadata"]["resourceVersion"] = json!(rv);
        }
    }
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews` by `user` (with `access`).
fn token_review(sh: &Shared, user: &str, access: Access, body: &Value) -> (u16, Value) {
    if access != Access::Full {
        return status(
            403,
            "Forbidden",
            &format!("tokenreviews.authentication.k8s.io is forbidden: User \"{user}\" cannot create resource \"tokenreviews\" in API group \"authentication.k8s.io\" at the cluster scope"),
            Some(json!({"group": "authentication.k8s.io", "kind": "tokenreviews"})),
        );
    }
    let Some(token) = body["spec"]["token"].as_str() else {
        return status(400, "BadRequest", "spec.token: Required value", None);
    };
    let wanted: Vec<String> = body["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let st = match sh.service_accounts.get(token) {
        Some(sa) if wanted.is_empty() || wanted.iter().any(|a| sa.audiences.contains(a)) => {
            let audiences = if wanted.is_empty() {
                sa.audiences.clone()
            } else {
                wanted
                    .iter()
                    .filter(|a| sa.audiences.contains(a))
                    .cloned()
                    .collect()
            };
            json!({
                "authenticated": true,
                "user": {
                    "username": format!("system:serviceaccount:{}:{}", sa.namespace, sa.name),
                    "uid": sa.uid,
                    "groups": [
                        "system:serviceaccounts",
                        format!("system:serviceaccounts:{}", sa.namespace),
                        "system:authenticated",
                    ],
                },
                "audiences": audiences,
            })
        }
        Some(_) => {
            json!({"user": {}, "error": "[invalid bearer token, token audiences ... is invalid for the target audiences]"})
        }
        None => {
            json!({"user": {}, "error": "[invalid bearer token, square/go-jose: error in cryptographic primitive]"})
        }
    };
    review("TokenReview", "authentication.k8s.io/v1", body, st)
}

/// The 201 answer to a review request (`kind` in `api_version`): its `spec` as sent, and
/// `status`, as the real server returns review objects (they are not stored).
fn review(kind: &str, api_version: &str, body: &Value, status: Value) -> (u16, Value) {
    (
        201,
        json!({
            "kind": kind,
            "apiVersion": api_version,
            "metadata": {"creationTimestamp": null},
            "spec": body["spec"].clone(),
            "status": status,
        }),
    )
}

fn create(store: &mut Store, ns: &str, mut body: Value) -> (u16, Value) {
    if !body.is_object() {
        return status(
            400,
            "BadRequest",
            "the body of the request is not a Secret",
            None,
        );
    }
    let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
    if let Some(bns) = body["metadata"]["namespace"].as_str() {
        if bns != ns {
            return status(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request", None);
        }
    }
    merge_string_data(&mut body);
    if let Err(e) = validate(&name, &body) {
        return e;
    }
    if store.get(ns, &name).is_some() {
        return status(
            409,
            "AlreadyExists",
            &format!("secrets \"{name}\" already exists"),
            Some(json!({"name": name, "kind": "secrets"})),
        );
    }
    if let Some(meta) = body["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
        meta.remove("uid");
        meta.remove("creationTimestamp");
    }
    store.put(ns, body);
    (201, store.get(ns, &name).unwrap_or(Value::Null))
}

fn update(store: &mut Store, ns: &str, name: &str, mut body: Value) -> (u16, Value) {
    if !body.is_object() {
        return status(
            400,
            "BadRequest",
            "the body of the request is not a Secret",
            None,
        );
    }
    let body_name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
    if body_name != name {
        return status(
            400,
            "BadRequest",
            &format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            ),
            None,
        );
    }
    let Some(old) = store.get(ns, name) else {
        return not_found(name);
    };
    if let Some(rv) = body["metadata"]["resourceVersion"].as_str() {
        if rv != old["metadata"]["resourceVersion"].as_str().unwrap_or("") {
            return status(
                409,
                "Conflict",
                &format!("Operation cannot be fulfilled on secrets \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
                Some(json!({"name": name, "kind": "secrets"})),
            );
        }
    }
    merge_string_data(&mut body);
    if body.get("type").is_none() {
        body["type"] = json!("Opaque");
    }
    let mut causes = Vec::new();
    if old["immutable"] == json!(true) {
        if body["immutable"] != json!(true) {
            causes.push((
                "immutable".to_string(),
                "Forbidden: field is immutable when `immutable` is set".to_string(),
            ));
        }
        let empty = json!({});
        let od = if old["data"].is_null() {
            &empty
        } else {
            &old["data"]
        };
        let nd = if body["data"].is_null() {
            &empty
        } else {
            &body["data"]
        };
        if od != nd {
            causes.push((
                "data".to_string(),
                "Forbidden: field is immutable when `immutable` is set".to_string(),
            ));
        }
    }
    if body["type"] != old["type"] {
        causes.push((
            "type".to_string(),
            format!("Invalid value: {}: field is immutable", body["type"]),
        ));
    }
    if !causes.is_empty() {
        return invalid(name, &causes);
    }
    if let Err(e) = validate(name, &body) {
        return e;
    }
    // Server-owned metadata stays the server's.
    for f in ["uid", "creationTimestamp", "namespace", "resourceVersion"] {
        body["metadata"][f] = old["metadata"][f].clone();
    }
    body["apiVersion"] = json!("v1");
    body["kind"] = json!("Secret");
    if body == old {
        return (200, old); // no-op update: no new resourceVersion
    }
    let rv = store.bump();
    body["metadata"]["resourceVersion"] = json!(rv);
    store
        .secrets
        .insert((ns.to_string(), name.to_string()), body.clone());
    (200, body)
}

fn delete(store: &mut Store, ns: &str, name: &str, body: &Value) -> (u16, Value) {
    let Some(old) = store.get(ns, name) else {
        return not_found(name);
    };
    let pre = &body["preconditions"];
    let conflict = |what: &str, want: &str, have: &str| {
        status(
            409,
            "Conflict",
            &format!("Operation cannot be fulfilled on secrets \"{name}\": Precondition failed: {what} in precondition: {want}, {what} in object meta: {have}"),
            Some(json!({"name": name, "kind": "secrets"})),
        )
    };
    if let Some(uid) = pre["uid"].as_str() {
        let have = old["metadata"]["uid"].as_str().unwrap_or("");
        if uid != have {
            return conflict("UID", uid, have);
        }
    }
    if let Some(rv) = pre["resourceVersion"].as_str() {
        let have = old["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if rv != have {
            return conflict("ResourceVersion", rv, have);
        }
    }
    store.delete(ns, name);
    (
        200,
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": name, "kind": "secrets", "uid": old["metadata"]["uid"].clone()},
        }),
    )
}
