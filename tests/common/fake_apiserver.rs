//! A small in-process **fake** of the Kubernetes API server, for tests (no real kube-apiserver
//! can run here). It is not a Kubernetes: it serves the few API parts below, and follows the
//! documented semantics of the real API for them; where the two differ, the Kubernetes
//! documentation linked here is right and this file is wrong.
//!
//! - API concepts (<https://kubernetes.io/docs/reference/using-api/api-concepts/>): one global,
//!   increasing `resourceVersion` for every object of every kind (a write that changes nothing
//!   does not bump it); `PUT` with a stale `metadata.resourceVersion` is 409 `Conflict` (without
//!   one it is unconditional); `POST` of an existing name is 409 `AlreadyExists`; missing
//!   objects are 404 `NotFound`; an invalid object is 422 `Invalid` with `details.causes`;
//!   `DELETE` honours `preconditions.uid`/`resourceVersion` (409) and answers a `Status`. Every
//!   error is a `kind: Status` object with `reason`, `message` and `details` as the real
//!   server words them. Lists (`<Kind>List`, `metadata.resourceVersion`; items without
//!   `kind`/`apiVersion`, as the real server sends them) take equality-based `labelSelector`s
//!   (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated; set-based ones are 400 here),
//!   `fieldSelector`s (`metadata.name`, `metadata.namespace`, and the real server's extra
//!   fields of Secrets and Events; others are 400 `field label not supported`), and
//!   `limit`/`continue`. A list path without a namespace (`/api/v1/configmaps`) lists all
//!   namespaces. `PATCH` takes JSON merge patches (`application/merge-patch+json`; a
//!   `strategic-merge-patch+json` is applied the same way, which is what it means for the
//!   kinds served here); other patch types are 415. `watch` is not served (405).
//! - Secret v1 (<https://kubernetes.io/docs/reference/kubernetes-api/config-and-storage-resources/secret-v1/>):
//!   `/api/v1/namespaces/{ns}/secrets[/{name}]`; `data` values are base64; `stringData` is
//!   merged into `data` on write and never returned; `type` defaults to `Opaque` and cannot
//!   change; the `data` values of one Secret may hold at most 1 MiB (1048576 bytes) together
//!   (422 `Invalid`); a Secret with `immutable: true` refuses any change of `data`, `type` or
//!   `immutable` (422 `Invalid`), but may be deleted.
//! - Plain namespaced objects, one generic handler ([`Resource`]): Lease v1
//!   (<https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/lease-v1/>,
//!   `/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]`, spec stored as sent),
//!   ConfigMap v1
//!   (<https://kubernetes.io/docs/reference/kubernetes-api/config-and-storage-resources/config-map-v1/>,
//!   `/api/v1/namespaces/{ns}/configmaps[/{name}]`: `data` and `binaryData` keys must match
//!   `[-._a-zA-Z0-9]+` and not appear in both, their values may hold at most 1 MiB together,
//!   `immutable: true` freezes `data`/`binaryData`/`immutable`, all 422 `Invalid`) and Event
//!   v1 (<https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/>,
//!   `/api/v1/namespaces/{ns}/events[/{name}]`, with the real server's legacy checks: without
//!   `eventTime`, `involvedObject.namespace` must equal the Event's namespace, or be empty
//!   for an Event in `default`; with it, `reportingComponent`, `reportingInstance`, `action`
//!   and `reason` are required). `POST` without `metadata.name` but with
//!   `metadata.generateName` appends 5 random characters (the real server's alphabet,
//!   `bcdfghjklmnpqrstvwxz2456789`). `PUT` keeps the server's metadata (uid,
//!   creationTimestamp, namespace, generateName, ...) and takes `labels` and `annotations`
//!   from the body (other client-set metadata, such as ownerReferences and finalizers, keeps
//!   its old value here). Names are RFC 1123 subdomains (Events: any path segment); labels and
//!   annotation keys are validated as the real server does, annotations may hold 256 KiB.
//! - Authentication and authorization: bearer tokens; an unknown or missing token is 401
//!   `Unauthorized`; a known one has a policy, an [`Access`] level or RBAC [`Rule`]s
//!   (<https://kubernetes.io/docs/reference/access-authn-authz/rbac/>; see
//!   [`FakeApiserver::add_token_with_rules`]). Denied requests are 403 `Forbidden` with the
//!   real server's message. `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`
//!   answers per the same policy (any authenticated user may ask).
//! - TokenReview (<https://kubernetes.io/docs/reference/kubernetes-api/authentication-resources/token-review-v1/>):
//!   `POST /apis/authentication.k8s.io/v1/tokenreviews` with `spec.token` answers 201 with
//!   `status.authenticated` and, for a service account token registered with
//!   [`FakeApiserver::add_service_account_token`], `status.user` (`username`
//!   `system:serviceaccount:<ns>:<name>`, `uid`, `groups`) and `status.audiences`; an unknown
//!   token is `authenticated: false` with `status.error`. The reviewer must be authorized to
//!   create tokenreviews (cluster-scoped): only a token with [`Access::Full`] is.
//!
//! Plain HTTP on a free loopback port (the kube client accepts `http://` cluster URLs), 16
//! worker threads: request bodies are read and answers written outside the one lock, so a
//! slow or stalled client holds up only its own worker. Tests read and change the stored
//! objects directly (an independent reader and a concurrent writer), hook a change in front of
//! a chosen Secret write, and see every request made ([`Logged`]).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

/// What a bearer token may do (a fixed policy; see [`Rule`] for RBAC rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Everything: every verb on every resource, in every namespace and at the cluster scope
    /// (TokenReview included).
    Full,
    /// get, list and watch of Secrets only.
    ReadOnly,
    /// Authenticated, but no permission at all.
    Nothing,
}

/// One RBAC `PolicyRule` of a Role
/// (<https://kubernetes.io/docs/reference/access-authn-authz/rbac/>): allows `verbs` on
/// `resources` of `api_groups` (`""` is the core group; `"*"` matches anything in each of
/// the three), limited to the objects `resource_names` when that is not empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
    pub resource_names: Vec<String>,
}

impl Rule {
    /// Does this rule allow `verb` on `resource` in API group `group` for the object named in
    /// the URL (`name`; `None` for `create`, `list` and other collection requests)? A rule
    /// with `resource_names` allows only requests naming one of them, so never `create` or
    /// `list`, as in the real RBAC authorizer.
    pub fn allows(&self, group: &str, resource: &str, verb: &str, name: Option<&str>) -> bool {
        let any = |list: &[String], x: &str| list.iter().any(|v| v == "*" || v == x);
        any(&self.api_groups, group)
            && any(&self.resources, resource)
            && any(&self.verbs, verb)
            && (self.resource_names.is_empty()
                || name.is_some_and(|n| self.resource_names.iter().any(|r| r == n)))
    }
}

/// The rules of every `kind: Role` document of the multi-document YAML `yaml` (a manifest such
/// as `deploy/kubernetes/rbac.yaml`), in order; other documents (RoleBindings,
/// ServiceAccounts, ...) are skipped. Panics if the YAML does not parse or a Role is not a
/// valid `rbac.authorization.k8s.io/v1` Role.
pub fn rules_from_role_yaml(yaml: &str) -> Vec<Rule> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("the RBAC YAML parses");
    docs.into_iter()
        .filter(|d| d["kind"] == "Role")
        .flat_map(|d| {
            let role: k8s_openapi::api::rbac::v1::Role =
                serde_json::from_value(d).expect("a valid rbac.authorization.k8s.io/v1 Role");
            role.rules.unwrap_or_default()
        })
        .map(|r| Rule {
            api_groups: r.api_groups.unwrap_or_default(),
            resources: r.resources.unwrap_or_default(),
            verbs: r.verbs,
            resource_names: r.resource_names.unwrap_or_default(),
        })
        .collect()
}

/// What a token may do: a fixed [`Access`] level, or RBAC rules.
#[derive(Debug, Clone)]
enum Policy {
    Access(Access),
    /// Role rules; they apply in every namespace (as if bound there by a RoleBinding) and
    /// never at the cluster scope (a Role cannot grant that).
    Rules(Vec<Rule>),
}

/// The authorization attributes of a request
/// (<https://kubernetes.io/docs/reference/access-authn-authz/authorization/#review-your-request-attributes>).
#[derive(Debug, Clone, Default)]
struct Attributes {
    verb: String,
    group: String,
    resource: String,
    /// `""` at the cluster scope.
    namespace: String,
    name: Option<String>,
}

fn authorize(policy: &Policy, a: &Attributes) -> bool {
    match policy {
        Policy::Access(Access::Full) => true,
        Policy::Access(Access::ReadOnly) => {
            a.group.is_empty()
                && a.resource == "secrets"
                && matches!(a.verb.as_str(), "get" | "list" | "watch")
        }
        Policy::Access(Access::Nothing) => false,
        Policy::Rules(rules) => {
            !a.namespace.is_empty()
                && rules
                    .iter()
                    .any(|r| r.allows(&a.group, &a.resource, &a.verb, a.name.as_deref()))
        }
    }
}

/// Most bytes the data values of one Secret may hold (the API server's `MaxSecretSize`).
pub const MAX_SECRET_SIZE: usize = 1 << 20;

/// Most bytes the `data` and `binaryData` values of one ConfigMap may hold together (the
/// same `MaxSecretSize`).
pub const MAX_CONFIGMAP_SIZE: usize = 1 << 20;

/// Most bytes the annotations (keys and values) of one object may hold
/// (`TotalAnnotationSizeLimitB`).
pub const MAX_ANNOTATIONS_SIZE: usize = 256 * 1024;

/// One request the fake answered.
#[derive(Debug, Clone)]
pub struct Logged {
    /// HTTP method, upper case.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// HTTP status code of the answer.
    pub code: u16,
    /// Authorization verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`); `""` for a non-resource path or a method the path does not take.
    pub verb: String,
    /// API group (`""` for core/v1 and for non-resource paths).
    pub group: String,
    /// Resource (plural, `""` for non-resource paths).
    pub resource: String,
    /// Namespace of the path (`""` at the cluster scope).
    pub namespace: String,
    /// Object named by the path (`None` for collections: `list`, `create`).
    pub name: Option<String>,
    /// The query string as sent (still percent-encoded, without `?`).
    pub query: String,
    /// User the bearer token belongs to (`""` when the token was unknown or missing).
    pub user: String,
}

impl Logged {
    /// Did this request change (or try to change) a Secret?
    pub fn is_secret_write(&self) -> bool {
        self.group.is_empty()
            && self.resource == "secrets"
            && matches!(self.method.as_str(), "POST" | "PUT" | "DELETE" | "PATCH")
    }
}

/// A Secret write about to be processed, shown to [`FakeApiserver::before_write`] predicates.
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

/// A plain namespaced resource the generic handler serves.
#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group (`""` for core).
    pub group: &'static str,
    pub version: &'static str,
    /// Resource name in URLs and RBAC rules (plural, lowercase).
    pub plural: &'static str,
    pub kind: &'static str,
}

/// coordination.k8s.io/v1 Leases.
pub const LEASES: Resource = Resource {
    group: "coordination.k8s.io",
    version: "v1",
    plural: "leases",
    kind: "Lease",
};

/// core/v1 ConfigMaps.
pub const CONFIGMAPS: Resource = Resource {
    group: "",
    version: "v1",
    plural: "configmaps",
    kind: "ConfigMap",
};

/// core/v1 Events.
pub const EVENTS: Resource = Resource {
    group: "",
    version: "v1",
    plural: "events",
    kind: "Event",
};

const PLAIN: [&Resource; 3] = [&LEASES, &CONFIGMAPS, &EVENTS];

/// The plain resource `plural` (`leases`, `configmaps`, `events`). Panics on another.
fn resource_named(plural: &str) -> &'static Resource {
    PLAIN
        .into_iter()
        .find(|r| r.plural == plural)
        .unwrap_or_else(|| panic!("the fake serves no plain resource {plural:?}"))
}

impl Resource {
    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `configmaps`, `leases.coordination.k8s.io`: how the real server names the resource in
    /// messages.
    fn qualified(&self) -> String {
        qualified(self.group, self.plural)
    }

    fn details(&self, name: &str) -> Value {
        details(Some(name), self.group, self.plural)
    }

    fn not_found(&self, name: &str) -> (u16, Value) {
        status(
            404,
            "NotFound",
            &format!("{} \"{name}\" not found", self.qualified()),
            Some(self.details(name)),
        )
    }

    fn conflict(&self, name: &str) -> (u16, Value) {
        status(
            409,
            "Conflict",
            &format!("Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again", self.qualified()),
            Some(self.details(name)),
        )
    }
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

/// `details` of a `Status`, without the empty fields (as the real server sends it).
fn details(name: Option<&str>, group: &str, kind: &str) -> Value {
    let mut d = json!({"kind": kind});
    if let Some(n) = name.filter(|n| !n.is_empty()) {
        d["name"] = json!(n);
    }
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}

/// The stored objects.
pub struct Store {
    rv: u64,
    uid: u64,
    secrets: BTreeMap<(String, String), Value>,
    /// Plain objects (Leases, ConfigMaps, Events) by resource plural, namespace and name.
    objects: BTreeMap<(&'static str, String, String), Value>,
}

impl Store {
    fn bump(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    fn next_uid(&mut self) -> String {
        self.uid += 1;
        uid_string(self.uid)
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
        let old = self.secrets.get(&key).cloned();
        self.stamp(&mut secret, old.as_ref(), ns, "v1", "Secret");
        secret
            .as_object_mut()
            .expect("object")
            .entry("type")
            .or_insert(json!("Opaque"));
        self.secrets.insert(key, secret);
    }

    /// Sets what the server owns on `obj` for a direct write in `ns`: `apiVersion`, `kind`,
    /// namespace, a new resourceVersion, and uid and creationTimestamp (kept from `old`, else
    /// assigned).
    fn stamp(&mut self, obj: &mut Value, old: Option<&Value>, ns: &str, av: &str, kind: &str) {
        let (uid, created) = match old {
            Some(old) => (
                old["metadata"]["uid"].clone(),
                old["metadata"]["creationTimestamp"].clone(),
            ),
            None => (json!(self.next_uid()), json!(timestamp_now())),
        };
        let rv = self.bump();
        obj["apiVersion"] = json!(av);
        obj["kind"] = json!(kind);
        let meta = &mut obj["metadata"];
        meta["namespace"] = json!(ns);
        meta["uid"] = uid;
        meta["creationTimestamp"] = created;
        meta["resourceVersion"] = json!(rv);
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

    /// The stored plain object `ns/name` of `resource` (`leases`, `configmaps`, `events`).
    pub fn object(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let res = resource_named(resource);
        self.objects
            .get(&(res.plural, ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Every stored object of `resource` in `ns` (all namespaces if `ns` is empty), by
    /// namespace and name.
    pub fn objects(&self, resource: &str, ns: &str) -> Vec<Value> {
        let res = resource_named(resource);
        self.objects
            .iter()
            .filter(|((r, n, _), _)| *r == res.plural && (ns.is_empty() || n == ns))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Stores `obj` (its `metadata.name`) as a `resource` in `ns`, a direct write without
    /// validation: new resourceVersion; uid and creationTimestamp kept if it existed, else
    /// assigned; `kind`, `apiVersion` and namespace set.
    pub fn put_object(&mut self, resource: &str, ns: &str, mut obj: Value) {
        let res = resource_named(resource);
        let name = obj["metadata"]["name"]
            .as_str()
            .expect("metadata.name")
            .to_string();
        let key = (res.plural, ns.to_string(), name);
        let old = self.objects.get(&key).cloned();
        self.stamp(&mut obj, old.as_ref(), ns, &res.api_version(), res.kind);
        self.objects.insert(key, obj);
    }

    /// Changes the stored `resource` `ns/name` in place with `f` (another client's write)
    /// and gives it a new resourceVersion; false (nothing changed) if it does not exist.
    pub fn modify_object(
        &mut self,
        resource: &str,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> bool {
        let key = (
            resource_named(resource).plural,
            ns.to_string(),
            name.to_string(),
        );
        if !self.objects.contains_key(&key) {
            return false;
        }
        let rv = self.bump();
        if let Some(o) = self.objects.get_mut(&key) {
            f(o);
            o["metadata"]["resourceVersion"] = json!(rv);
        }
        true
    }

    /// Deletes the stored `resource` `ns/name` directly; true if it existed.
    pub fn delete_object(&mut self, resource: &str, ns: &str, name: &str) -> bool {
        let key = (
            resource_named(resource).plural,
            ns.to_string(),
            name.to_string(),
        );
        let existed = self.objects.remove(&key).is_some();
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
    /// Bearer token → (user, policy).
    tokens: BTreeMap<String, (String, Policy)>,
    service_accounts: BTreeMap<String, ServiceAccount>,
    log: Vec<Logged>,
    hooks: Vec<(Pred, Option<Action>)>,
}

/// Worker threads answering requests.
const WORKERS: usize = 16;

/// A running fake API server (stopped on drop).
pub struct FakeApiserver {
    addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// The only strong reference (workers hold weak ones between requests): dropping it
    /// closes the listening socket.
    server: Option<Arc<tiny_http::Server>>,
    dir: tempfile::TempDir,
    /// Bearer token with [`Access::Full`].
    pub full_token: String,
    /// Bearer token with [`Access::ReadOnly`].
    pub read_only_token: String,
    /// Bearer token with [`Access::Nothing`].
    pub no_access_token: String,
}

impl FakeApiserver {
    /// Starts a fake on a free loopback port with three tokens (full, read-only, no access)
    /// and 16 worker threads.
    pub fn start() -> FakeApiserver {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind fake apiserver"));
        let addr = server.server_addr().to_ip().expect("ip address");
        let tag = format!("{:016x}", rand::random::<u64>());
        let full_token = format!("kp-full-{tag}");
        let read_only_token = format!("kp-ro-{tag}");
        let no_access_token = format!("kp-none-{tag}");
        let mut tokens = BTreeMap::new();
        for (token, user, access) in [
            (
                &full_token,
                "system:serviceaccount:rook-ceph:keyplan",
                Access::Full,
            ),
            (
                &read_only_token,
                "system:serviceaccount:rook-ceph:reader",
                Access::ReadOnly,
            ),
            (
                &no_access_token,
                "system:serviceaccount:default:nobody",
                Access::Nothing,
            ),
        ] {
            tokens.insert(token.clone(), (user.to_string(), Policy::Access(access)));
        }
        let shared = Arc::new(Mutex::new(Shared {
            store: Store {
                rv: 1000,
                uid: 0,
                secrets: BTreeMap::new(),
                objects: BTreeMap::new(),
            },
            tokens,
            service_accounts: BTreeMap::new(),
            log: Vec::new(),
            hooks: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..WORKERS)
            .map(|_| {
                let server = Arc::downgrade(&server);
                let shared = Arc::clone(&shared);
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || worker(&server, &shared, &stop))
            })
            .collect();
        FakeApiserver {
            addr,
            shared,
            stop,
            threads,
            server: Some(server),
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

    /// Writes a kubeconfig whose one context (`token`, the current one, namespace
    /// `namespace`) authenticates with the bearer token `token` (one added with
    /// [`FakeApiserver::add_token`] or [`FakeApiserver::add_token_with_rules`]), and returns
    /// its path (a new file per call).
    pub fn kubeconfig_with_token(&self, namespace: &str, token: &str) -> PathBuf {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n- name: token\n  context:\n    cluster: fake\n    user: token\n    namespace: {namespace}\nusers:\n- name: token\n  user:\n    token: {token}\ncurrent-context: token\n",
            self.url()
        );
        let path = self.dir.path().join(format!(
            "kubeconfig-{namespace}-token-{:08x}",
            rand::random::<u32>()
        ));
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// Accepts `token` from now on as user `user` with `access`.
    pub fn add_token(&self, token: &str, user: &str, access: Access) {
        self.lock().tokens.insert(
            token.to_string(),
            (user.to_string(), Policy::Access(access)),
        );
    }

    /// Accepts `token` from now on as user `user` (such as
    /// `system:serviceaccount:keyplan:keyplan`), authorized by the RBAC `rules` (for example
    /// [`rules_from_role_yaml`] of a manifest): a request is allowed if any rule matches its
    /// API group, resource, verb and (for `resource_names`) the object named in its URL
    /// ([`Rule::allows`]). The rules apply in every namespace, as if a RoleBinding bound them
    /// in each, and never at the cluster scope (TokenReview, lists across namespaces).
    pub fn add_token_with_rules(&self, token: &str, user: &str, rules: Vec<Rule>) {
        self.lock()
            .tokens
            .insert(token.to_string(), (user.to_string(), Policy::Rules(rules)));
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

    /// The stored plain object `ns/name` of `resource` (`leases`, `configmaps`, `events`),
    /// if any (direct access, bypassing authentication).
    pub fn object(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        self.lock().store.object(resource, ns, name)
    }

    /// Every stored `resource` in `ns` (all namespaces if empty), by namespace and name.
    pub fn objects(&self, resource: &str, ns: &str) -> Vec<Value> {
        self.lock().store.objects(resource, ns)
    }

    /// Stores `obj` as a `resource` in `ns` directly (see [`Store::put_object`]).
    pub fn put_object(&self, resource: &str, ns: &str, obj: Value) {
        self.lock().store.put_object(resource, ns, obj)
    }

    /// Changes the stored `resource` `ns/name` directly (see [`Store::modify_object`]);
    /// false if it does not exist.
    pub fn modify_object(
        &self,
        resource: &str,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> bool {
        self.lock().store.modify_object(resource, ns, name, f)
    }

    /// Deletes the stored `resource` `ns/name` directly; true if it existed.
    pub fn delete_object(&self, resource: &str, ns: &str, name: &str) -> bool {
        self.lock().store.delete_object(resource, ns, name)
    }

    /// The Lease `ns/name` as stored, if any (direct access, bypassing authentication).
    pub fn lease(&self, ns: &str, name: &str) -> Option<Value> {
        self.object("leases", ns, name)
    }

    /// Changes the stored Lease `ns/name` with `f` (bumping its resourceVersion), as another
    /// client would; nothing if it does not exist.
    pub fn modify_lease(&self, ns: &str, name: &str, f: impl FnOnce(&mut Value)) {
        self.modify_object("leases", ns, name, f);
    }

    /// The ConfigMap `ns/name` as stored, if any.
    pub fn configmap(&self, ns: &str, name: &str) -> Option<Value> {
        self.object("configmaps", ns, name)
    }

    /// Every ConfigMap stored in `ns`, by name.
    pub fn configmaps(&self, ns: &str) -> Vec<Value> {
        self.objects("configmaps", ns)
    }

    /// Stores the ConfigMap `cm` (its `metadata.name`) in `ns` directly, without validation,
    /// with a new resourceVersion (see [`Store::put_object`]).
    pub fn put_configmap(&self, ns: &str, cm: Value) {
        self.put_object("configmaps", ns, cm)
    }

    /// Changes the stored ConfigMap `ns/name` with `f` (bumping its resourceVersion), as
    /// another client would. Panics if it does not exist.
    pub fn modify_configmap(&self, ns: &str, name: &str, f: impl FnOnce(&mut Value)) {
        assert!(
            self.modify_object("configmaps", ns, name, f),
            "no ConfigMap {ns}/{name} to modify"
        );
    }

    /// Every Event stored in `ns`, by name.
    pub fn events(&self, ns: &str) -> Vec<Value> {
        self.objects("events", ns)
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

    /// Stops serving: the port is closed afterwards (connections are refused). Waits up to
    /// 2 s for the workers; one stuck on a stalled client (a body that never comes) is left
    /// behind, holding nothing of the server.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        for t in self.threads.drain(..) {
            if t.is_finished() {
                let _ = t.join();
            }
        }
        self.server = None;
    }
}

impl Drop for FakeApiserver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One worker: answers requests until `stop`, holding the server only while waiting for one.
fn worker(server: &Weak<tiny_http::Server>, shared: &Arc<Mutex<Shared>>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let Some(s) = server.upgrade() else { break };
        let next = s.recv_timeout(Duration::from_millis(50));
        drop(s);
        match next {
            Ok(Some(req)) => handle(shared, req),
            Ok(None) => {}
            Err(_) => break,
        }
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

/// The parsed query string of a request.
#[derive(Debug, Default)]
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(raw: &str) -> Query {
        Query(
            url::form_urlencoded::parse(raw.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

/// What a resource request's path names
/// (<https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-uris>).
#[derive(Debug, Clone, Default)]
struct Target {
    group: String,
    version: String,
    resource: String,
    /// `""` at the cluster scope.
    namespace: String,
    name: Option<String>,
}

/// `/api/v1/[namespaces/{ns}/]{resource}[/{name}]` or
/// `/apis/{group}/{version}/[namespaces/{ns}/]{resource}[/{name}]`; `None` for other paths
/// (non-resource paths, subresources).
fn parse_target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (*ns, rest),
        _ => ("", rest),
    };
    let (resource, name) = match rest {
        [r] => (*r, None),
        [r, n] if !n.is_empty() => (*r, Some(n.to_string())),
        _ => return None,
    };
    if resource.is_empty() {
        return None;
    }
    Some(Target {
        group: group.to_string(),
        version: version.to_string(),
        resource: resource.to_string(),
        namespace: namespace.to_string(),
        name,
    })
}

/// The authorization verb of a resource request
/// (<https://kubernetes.io/docs/reference/access-authn-authz/authorization/#determine-the-request-verb>);
/// `""` for a method the path does not take.
fn request_verb(method: &str, named: bool, query: &Query) -> &'static str {
    match (method, named) {
        ("GET", _) if query.flag("watch") => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", false) => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "",
    }
}

/// A request as [`route`] sees it.
struct Incoming {
    method: String,
    query: Query,
    /// Media type of the body, lower case, without parameters.
    content_type: String,
    target: Option<Target>,
    verb: &'static str,
}

fn header(req: &tiny_http::Request, name: &'static str) -> Option<String> {
    req.headers()
        .iter()
        .find(|h| h.field.equiv(name))
        .map(|h| h.value.as_str().to_string())
}

fn handle(shared: &Arc<Mutex<Shared>>, mut req: tiny_http::Request) {
    let method = req.method().as_str().to_uppercase();
    let url = req.url().to_string();
    let (path, raw_query) = match url.split_once('?') {
        Some((p, q)) => (p.to_string(), q.to_string()),
        None => (url.clone(), String::new()),
    };
    let token = header(&req, "Authorization")
        .and_then(|v| v.strip_prefix("Bearer ").map(|t| t.trim().to_string()));
    let content_type = header(&req, "Content-Type")
        .map(|v| v.split(';').next().unwrap_or("").trim().to_lowercase())
        .unwrap_or_default();
    // Read outside the lock: a slow body holds up this worker only.
    let mut body_bytes = Vec::new();
    let _ = req.as_reader().read_to_end(&mut body_bytes);
    let body: Option<Value> = if body_bytes.is_empty() {
        Some(Value::Null)
    } else {
        serde_json::from_slice(&body_bytes).ok()
    };
    let query = Query::parse(&raw_query);
    let target = parse_target(&path);
    let verb = target
        .as_ref()
        .map(|t| request_verb(&method, t.name.is_some(), &query))
        .unwrap_or("");
    let incoming = Incoming {
        method: method.clone(),
        query,
        content_type,
        target,
        verb,
    };
    let (code, answer) = {
        let mut sh = shared.lock().unwrap_or_else(|e| e.into_inner());
        let who = token.and_then(|t| sh.tokens.get(&t).cloned());
        let (code, answer) = route(&mut sh, &incoming, who.as_ref(), body);
        let t = incoming.target.clone().unwrap_or_default();
        sh.log.push(Logged {
            method,
            path,
            code,
            verb: verb.to_string(),
            group: t.group,
            resource: t.resource,
            namespace: t.namespace,
            name: t.name,
            query: raw_query,
            user: who.map(|(u, _)| u).unwrap_or_default(),
        });
        (code, answer)
    };
    // Written outside the lock: a slow reader holds up this worker only.
    let data = serde_json::to_vec(&answer).unwrap_or_default();
    let resp = tiny_http::Response::from_data(data)
        .with_status_code(code)
        .with_header(
            tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..])
                .expect("header"),
        );
    let _ = req.respond(resp);
}

fn no_such_resource() -> (u16, Value) {
    status(
        404,
        "NotFound",
        "the server could not find the requested resource",
        None,
    )
}

fn method_not_allowed(what: &str) -> (u16, Value) {
    status(
        405,
        "MethodNotAllowed",
        &format!("the server does not allow this method on the requested resource ({what})"),
        None,
    )
}

fn bad_request(message: &str) -> (u16, Value) {
    status(400, "BadRequest", message, None)
}

/// Authenticates and authorizes a request by `who` (user, policy), then serves it.
fn route(
    sh: &mut Shared,
    r: &Incoming,
    who: Option<&(String, Policy)>,
    body: Option<Value>,
) -> (u16, Value) {
    let Some((user, policy)) = who else {
        return status(401, "Unauthorized", "Unauthorized", None);
    };
    let Some(t) = &r.target else {
        return no_such_resource();
    };
    if r.verb.is_empty() {
        return method_not_allowed(&r.method);
    }
    let attrs = Attributes {
        verb: r.verb.to_string(),
        group: t.group.clone(),
        resource: t.resource.clone(),
        namespace: t.namespace.clone(),
        name: t.name.clone(),
    };
    // Any authenticated user may ask what it may do (the system:basic-user ClusterRole).
    let self_review = t.group == "authorization.k8s.io"
        && t.resource == "selfsubjectaccessreviews"
        && t.namespace.is_empty();
    if !self_review && !authorize(policy, &attrs) {
        return forbidden(user, &attrs);
    }
    let Some(body) = body else {
        return bad_request("the request body is not valid JSON");
    };
    let cluster = t.namespace.is_empty();
    match (t.group.as_str(), t.version.as_str(), t.resource.as_str()) {
        ("authorization.k8s.io", "v1", "selfsubjectaccessreviews") if cluster => match r.verb {
            "create" => access_review(user, policy, &body),
            v => method_not_allowed(v),
        },
        ("authentication.k8s.io", "v1", "tokenreviews") if cluster => match r.verb {
            "create" => token_review(sh, &body),
            v => method_not_allowed(v),
        },
        ("", "v1", "secrets") => secrets(sh, r, t, body),
        (g, v, res) => match PLAIN
            .into_iter()
            .find(|p| p.group == g && p.version == v && p.plural == res)
        {
            Some(p) => plain(&mut sh.store, p, r, t, body),
            None => no_such_resource(),
        },
    }
}

/// The real server's 403 for a request with attributes `a` by `user`.
fn forbidden(user: &str, a: &Attributes) -> (u16, Value) {
    let q = qualified(&a.group, &a.resource);
    let what = match &a.name {
        Some(n) => format!("{q} \"{n}\""),
        None => q,
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", a.namespace)
    };
    status(
        403,
        "Forbidden",
        &format!(
            "{what} is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            a.verb, a.resource, a.group
        ),
        Some(details(a.name.as_deref(), &a.group, &a.resource)),
    )
}

/// `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews` by `user`: whether
/// `policy` allows `spec.resourceAttributes` (non-resource attributes: only [`Access::Full`]).
fn access_review(user: &str, policy: &Policy, body: &Value) -> (u16, Value) {
    let attrs = &body["spec"]["resourceAttributes"];
    let allowed = if attrs.is_object() {
        let s = |k: &str| attrs[k].as_str().unwrap_or("").to_string();
        let a = Attributes {
            verb: s("verb"),
            group: s("group"),
            resource: s("resource"),
            namespace: s("namespace"),
            name: Some(s("name")).filter(|n| !n.is_empty()),
        };
        authorize(policy, &a)
    } else {
        matches!(policy, Policy::Access(Access::Full))
    };
    let mut st = json!({"allowed": allowed});
    if allowed {
        st["reason"] = json!(format!(
            "RBAC: allowed by RoleBinding \"keyplan\" of Role \"keyplan\" to User \"{user}\""
        ));
    }
    review(
        "SelfSubjectAccessReview",
        "authorization.k8s.io/v1",
        body,
        st,
    )
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews` (the reviewer is authorized already).
fn token_review(sh: &Shared, body: &Value) -> (u16, Value) {
    let Some(token) = body["spec"]["token"].as_str() else {
        return bad_request("spec.token: Required value");
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

/// One requirement of an equality-based label selector.
#[derive(Debug)]
enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
}

/// Parses an equality-based label selector (`a=b,c!=d,e,!f`); set-based requirements
/// (`in`, `notin`) are refused (this fake does not evaluate them).
fn parse_label_selector(s: &str) -> Result<Vec<LabelReq>, String> {
    if s.contains('(') {
        return Err(format!(
            "unable to parse requirement: set-based selectors are not supported by this fake: {s:?}"
        ));
    }
    let mut out = Vec::new();
    for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let req = if let Some((k, v)) = term.split_once("!=") {
            LabelReq::Ne(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
        } else if let Some(k) = term.strip_prefix('!') {
            LabelReq::Absent(k.trim().to_string())
        } else {
            LabelReq::Exists(term.to_string())
        };
        let key = match &req {
            LabelReq::Eq(k, _) | LabelReq::Ne(k, _) | LabelReq::Exists(k) | LabelReq::Absent(k) => {
                k
            }
        };
        if let Some(msg) = qualified_name_error(key) {
            return Err(format!(
                "unable to parse requirement: values[0][{key}]: Invalid value: \"{key}\": {msg}"
            ));
        }
        out.push(req);
    }
    Ok(out)
}

fn labels_match(reqs: &[LabelReq], obj: &Value) -> bool {
    let labels = &obj["metadata"]["labels"];
    let get = |k: &str| labels[k].as_str();
    reqs.iter().all(|r| match r {
        LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
        LabelReq::Ne(k, v) => get(k) != Some(v.as_str()),
        LabelReq::Exists(k) => get(k).is_some(),
        LabelReq::Absent(k) => get(k).is_none(),
    })
}

/// The fields a `fieldSelector` may name for `plural`, as the real server supports them.
fn selectable_fields(plural: &str) -> &'static [&'static str] {
    match plural {
        "secrets" => &["metadata.name", "metadata.namespace", "type"],
        "events" => &[
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        _ => &["metadata.name", "metadata.namespace"],
    }
}

/// Parses a field selector (`f=v`, `f==v`, `f!=v`, comma-separated) into (field, equal?,
/// value).
fn parse_field_selector(s: &str, plural: &str) -> Result<Vec<(String, bool, String)>, String> {
    let mut out = Vec::new();
    for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (f, eq, v) = if let Some((f, v)) = term.split_once("!=") {
            (f, false, v)
        } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            (f, true, v)
        } else {
            return Err(format!(
                "invalid selector: '{s}'; can't understand '{term}'"
            ));
        };
        let f = f.trim();
        if !selectable_fields(plural).contains(&f) {
            return Err(format!("field label not supported: {f}"));
        }
        out.push((f.to_string(), eq, v.trim().to_string()));
    }
    Ok(out)
}

fn field_value(obj: &Value, field: &str) -> String {
    let path = if field == "source" {
        "source.component"
    } else {
        field
    };
    let mut v = obj;
    for part in path.split('.') {
        v = &v[part];
    }
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The answer to a list request: the `candidates` (in namespace and name order) that match
/// the query's `labelSelector` and `fieldSelector`, paged by `limit` and `continue`.
fn list_answer(
    candidates: Vec<Value>,
    kind: &str,
    api_version: &str,
    plural: &str,
    query: &Query,
    rv: u64,
) -> (u16, Value) {
    let labels = match parse_label_selector(query.get("labelSelector").unwrap_or("")) {
        Ok(l) => l,
        Err(e) => return bad_request(&e),
    };
    let fields = match parse_field_selector(query.get("fieldSelector").unwrap_or(""), plural) {
        Ok(f) => f,
        Err(e) => return bad_request(&e),
    };
    let key = |o: &Value| {
        format!(
            "{}/{}",
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap_or("")
        )
    };
    let after = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => match base64::engine::general_purpose::STANDARD
            .decode(c)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
        {
            Some(k) => Some(k),
            None => return bad_request("continue key is not valid: illegal base64 data"),
        },
        None => None,
    };
    let mut items: Vec<Value> = candidates
        .into_iter()
        .filter(|o| labels_match(&labels, o))
        .filter(|o| {
            fields
                .iter()
                .all(|(f, eq, v)| (field_value(o, f) == *v) == *eq)
        })
        .filter(|o| after.as_ref().is_none_or(|a| key(o) > *a))
        .collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    let limit = query.get("limit").and_then(|l| l.parse::<usize>().ok());
    if let Some(limit) = limit.filter(|l| *l > 0 && *l < items.len()) {
        let rest = items.split_off(limit);
        let last = items.last().map(key).unwrap_or_default();
        meta["continue"] = json!(base64::engine::general_purpose::STANDARD.encode(last));
        meta["remainingItemCount"] = json!(rest.len());
    }
    for item in &mut items {
        if let Some(o) = item.as_object_mut() {
            o.remove("kind");
            o.remove("apiVersion");
        }
    }
    (
        200,
        json!({"kind": format!("{kind}List"), "apiVersion": api_version, "metadata": meta, "items": items}),
    )
}

/// Applies the JSON merge patch `patch` (RFC 7386) to `target`.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// `old` with the patch `body` (of media type `content_type`) applied, or the error answer.
fn patched(old: &Value, content_type: &str, body: &Value) -> Result<Value, (u16, Value)> {
    match content_type {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            let mut merged = old.clone();
            merge_patch(&mut merged, body);
            Ok(merged)
        }
        other => Err(status(
            415,
            "UnsupportedMediaType",
            &format!("the body of the request was in an unknown format - accepted media types include (in this fake): application/merge-patch+json, application/strategic-merge-patch+json (not {other:?})"),
            None,
        )),
    }
}

/// The 409 when `body`'s `preconditions` (of a `DELETE`) do not hold for `old`.
fn failed_precondition(
    qualified: &str,
    details: Value,
    old: &Value,
    body: &Value,
) -> Option<(u16, Value)> {
    let name = old["metadata"]["name"].as_str().unwrap_or("");
    let pre = &body["preconditions"];
    for (what, field) in [("UID", "uid"), ("ResourceVersion", "resourceVersion")] {
        let have = old["metadata"][field].as_str().unwrap_or("");
        if let Some(want) = pre[field].as_str() {
            if want != have {
                return Some(status(
                    409,
                    "Conflict",
                    &format!("Operation cannot be fulfilled on {qualified} \"{name}\": Precondition failed: {what} in precondition: {want}, {what} in object meta: {have}"),
                    Some(details),
                ));
            }
        }
    }
    None
}

/// The `Status` answer to a successful `DELETE` of `old`.
fn deleted(group: &str, plural: &str, old: &Value) -> (u16, Value) {
    let name = old["metadata"]["name"].as_str().unwrap_or("");
    let mut d = details(Some(name), group, plural);
    d["uid"] = old["metadata"]["uid"].clone();
    (
        200,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": d}),
    )
}

/// Runs the first [`FakeApiserver::before_write`] action whose predicate accepts this Secret
/// write.
fn run_hooks(sh: &mut Shared, method: &str, ns: &str, name: Option<&str>, body: &Value) {
    let target = name
        .map(str::to_string)
        .unwrap_or_else(|| body["metadata"]["name"].as_str().unwrap_or("").to_string());
    let w = Write {
        method,
        namespace: ns,
        name: &target,
        body,
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

/// An authorized Secret request.
fn secrets(sh: &mut Shared, r: &Incoming, t: &Target, body: Value) -> (u16, Value) {
    let ns = t.namespace.as_str();
    if ns.is_empty() && r.verb != "list" {
        return no_such_resource();
    }
    if matches!(r.verb, "create" | "update" | "patch" | "delete") {
        run_hooks(sh, &r.method, ns, t.name.as_deref(), &body);
    }
    let store = &mut sh.store;
    match (r.verb, t.name.as_deref()) {
        ("get", Some(name)) => match store.get(ns, name) {
            Some(s) => (200, s),
            None => not_found(name),
        },
        ("list", _) => {
            let candidates = store
                .secrets
                .iter()
                .filter(|((n, _), _)| ns.is_empty() || n == ns)
                .map(|(_, v)| v.clone())
                .collect();
            list_answer(candidates, "Secret", "v1", "secrets", &r.query, store.rv)
        }
        ("create", _) => create(store, ns, body),
        ("update", Some(name)) => update(store, ns, name, body),
        ("patch", Some(name)) => {
            let Some(old) = store.get(ns, name) else {
                return not_found(name);
            };
            match patched(&old, &r.content_type, &body) {
                Ok(merged) => update(store, ns, name, merged),
                Err(e) => e,
            }
        }
        ("delete", Some(name)) => delete(store, ns, name, &body),
        (verb, _) => method_not_allowed(&format!("{verb} is not supported by this fake")),
    }
}

/// Metadata the server owns: dropped from a created object's body.
const SERVER_METADATA: &[&str] = &[
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "selfLink",
    "managedFields",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// An authorized request on the plain resource `res` (Leases, ConfigMaps, Events).
fn plain(
    store: &mut Store,
    res: &'static Resource,
    r: &Incoming,
    t: &Target,
    body: Value,
) -> (u16, Value) {
    let ns = t.namespace.as_str();
    if ns.is_empty() && r.verb != "list" {
        return no_such_resource();
    }
    match (r.verb, t.name.as_deref()) {
        ("get", Some(name)) => match store.object(res.plural, ns, name) {
            Some(o) => (200, o),
            None => res.not_found(name),
        },
        ("list", _) => {
            let candidates = store.objects(res.plural, ns);
            let av = res.api_version();
            list_answer(candidates, res.kind, &av, res.plural, &r.query, store.rv)
        }
        ("create", _) => plain_create(store, res, ns, body),
        ("update", Some(name)) => plain_update(store, res, ns, name, body),
        ("patch", Some(name)) => {
            let Some(old) = store.object(res.plural, ns, name) else {
                return res.not_found(name);
            };
            match patched(&old, &r.content_type, &body) {
                Ok(merged) => plain_update(store, res, ns, name, merged),
                Err(e) => e,
            }
        }
        ("delete", Some(name)) => {
            let Some(old) = store.object(res.plural, ns, name) else {
                return res.not_found(name);
            };
            if let Some(e) = failed_precondition(&res.qualified(), res.details(name), &old, &body) {
                return e;
            }
            store.delete_object(res.plural, ns, name);
            deleted(res.group, res.plural, &old)
        }
        (verb, _) => method_not_allowed(&format!("{verb} is not supported by this fake")),
    }
}

/// Drops what the real server would not keep or send: `null` fields anywhere, and empty
/// `labels`, `annotations`, `data` and `binaryData` maps (Go's `omitempty`).
fn prune(v: &mut Value) {
    fn nulls(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.retain(|_, x| !x.is_null());
                m.values_mut().for_each(nulls);
            }
            Value::Array(a) => a.iter_mut().for_each(nulls),
            _ => {}
        }
    }
    nulls(v);
    let empty = |x: &Value| x.as_object().is_some_and(|m| m.is_empty());
    if let Some(m) = v["metadata"].as_object_mut() {
        m.retain(|k, x| !(matches!(k.as_str(), "labels" | "annotations") && empty(x)));
    }
    if let Some(m) = v.as_object_mut() {
        m.retain(|k, x| !(matches!(k.as_str(), "data" | "binaryData") && empty(x)));
    }
}

/// `base` and 5 random characters of the real server's alphabet, a name not taken yet in
/// `ns` (`base` cut to 58 bytes, so the name fits 63).
fn generate_name(store: &Store, res: &Resource, ns: &str, base: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let base: String = base.chars().take(58).collect();
    loop {
        let suffix: String = (0..5)
            .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
            .collect();
        let name = format!("{base}{suffix}");
        if store.object(res.plural, ns, &name).is_none() {
            return name;
        }
    }
}

fn plain_create(
    store: &mut Store,
    res: &'static Resource,
    ns: &str,
    mut body: Value,
) -> (u16, Value) {
    if !body.is_object() {
        return bad_request(&format!("the body of the request is not a {}", res.kind));
    }
    if let Some(bns) = body["metadata"]["namespace"].as_str() {
        if !bns.is_empty() && bns != ns {
            return bad_request("the namespace of the provided object does not match the namespace sent on the request");
        }
    }
    let mut name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
    if name.is_empty() {
        if let Some(base) = body["metadata"]["generateName"]
            .as_str()
            .filter(|g| !g.is_empty())
        {
            name = generate_name(store, res, ns, base);
        }
    }
    if let Some(meta) = body["metadata"].as_object_mut() {
        meta.retain(|k, _| !SERVER_METADATA.contains(&k.as_str()));
    }
    body["metadata"]["name"] = json!(name);
    body["metadata"]["namespace"] = json!(ns);
    body["apiVersion"] = json!(res.api_version());
    body["kind"] = json!(res.kind);
    prune(&mut body);
    if let Err(e) = validate_plain(res, &name, &body, None) {
        return e;
    }
    if store.object(res.plural, ns, &name).is_some() {
        return status(
            409,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", res.qualified()),
            Some(res.details(&name)),
        );
    }
    store.put_object(res.plural, ns, body);
    (
        201,
        store.object(res.plural, ns, &name).unwrap_or(Value::Null),
    )
}

fn plain_update(
    store: &mut Store,
    res: &'static Resource,
    ns: &str,
    name: &str,
    mut body: Value,
) -> (u16, Value) {
    if !body.is_object() {
        return bad_request(&format!("the body of the request is not a {}", res.kind));
    }
    let body_name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
    if body_name != name {
        return bad_request(&format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        ));
    }
    let Some(old) = store.object(res.plural, ns, name) else {
        return res.not_found(name);
    };
    if let Some(rv) = body["metadata"]["resourceVersion"].as_str() {
        if Some(rv) != old["metadata"]["resourceVersion"].as_str() {
            return res.conflict(name);
        }
    }
    // The server's metadata, with the labels and annotations the client sent.
    let mut meta = old["metadata"].clone();
    for f in ["labels", "annotations"] {
        match body["metadata"].get(f).filter(|v| !v.is_null()).cloned() {
            Some(v) => meta[f] = v,
            None => {
                if let Some(m) = meta.as_object_mut() {
                    m.remove(f);
                }
            }
        }
    }
    body["metadata"] = meta;
    body["apiVersion"] = json!(res.api_version());
    body["kind"] = json!(res.kind);
    prune(&mut body);
    if let Err(e) = validate_plain(res, name, &body, Some(&old)) {
        return e;
    }
    if body == old {
        return (200, old); // no-op update: no new resourceVersion
    }
    let rv = store.bump();
    body["metadata"]["resourceVersion"] = json!(rv);
    store
        .objects
        .insert((res.plural, ns.to_string(), name.to_string()), body.clone());
    (200, body)
}

fn create(store: &mut Store, ns: &str, mut body: Value) -> (u16, Value) {
    if !body.is_object() {
        return bad_request("the body of the request is not a Secret");
    }
    let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
    if let Some(bns) = body["metadata"]["namespace"].as_str() {
        if bns != ns {
            return bad_request("the namespace of the provided object does not match the namespace sent on the request");
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
            Some(details(Some(&name), "", "secrets")),
        );
    }
    if let Some(meta) = body["metadata"].as_object_mut() {
        meta.retain(|k, _| !SERVER_METADATA.contains(&k.as_str()));
    }
    store.put(ns, body);
    (201, store.get(ns, &name).unwrap_or(Value::Null))
}

/// What an update of Secret `old` to `body` may not change: the immutable fields.
fn immutable_causes(old: &Value, body: &Value) -> Vec<(String, String)> {
    let mut causes = Vec::new();
    let frozen = "Forbidden: field is immutable when `immutable` is set".to_string();
    if old["immutable"] == json!(true) {
        if body["immutable"] != json!(true) {
            causes.push(("immutable".to_string(), frozen.clone()));
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
            causes.push(("data".to_string(), frozen));
        }
    }
    if body["type"] != old["type"] {
        causes.push((
            "type".to_string(),
            format!("Invalid value: {}: field is immutable", body["type"]),
        ));
    }
    causes
}

fn update(store: &mut Store, ns: &str, name: &str, mut body: Value) -> (u16, Value) {
    if !body.is_object() {
        return bad_request("the body of the request is not a Secret");
    }
    let body_name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
    if body_name != name {
        return bad_request(&format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        ));
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
                Some(details(Some(name), "", "secrets")),
            );
        }
    }
    merge_string_data(&mut body);
    if body.get("type").is_none() {
        body["type"] = json!("Opaque");
    }
    let causes = immutable_causes(&old, &body);
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
    let d = details(Some(name), "", "secrets");
    if let Some(e) = failed_precondition("secrets", d, &old, body) {
        return e;
    }
    store.delete(ns, name);
    deleted("", "secrets", &old)
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
        Some(details(Some(name), "", "secrets")),
    )
}

/// The 422 of an invalid Secret `name`.
fn invalid(name: &str, causes: &[(String, String)]) -> (u16, Value) {
    invalid_object("Secret", "", name, causes)
}

/// The 422 of an invalid object `name` of `kind` in API group `group`, with its `causes`
/// (field path, message), worded as the real server words them.
fn invalid_object(
    kind: &str,
    group: &str,
    name: &str,
    causes: &[(String, String)],
) -> (u16, Value) {
    let texts: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
    let joined = if texts.len() == 1 {
        texts[0].clone()
    } else {
        format!("[{}]", texts.join(", "))
    };
    let reason = |m: &str| {
        if m.starts_with("Required value") {
            "FieldValueRequired"
        } else if m.starts_with("Too long") {
            "FieldValueTooLong"
        } else if m.starts_with("Forbidden") {
            "FieldValueForbidden"
        } else {
            "FieldValueInvalid"
        }
    };
    let mut d = json!({
        "name": name,
        "kind": kind,
        "causes": causes.iter().map(|(f, m)| json!({"reason": reason(m), "message": m, "field": f})).collect::<Vec<_>>(),
    });
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    let qualified_kind = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    status(
        422,
        "Invalid",
        &format!("{qualified_kind} \"{name}\" is invalid: {joined}"),
        Some(d),
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

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// `metadata.name` causes: required, and a subdomain (`subdomain`) or a path segment.
fn name_causes(name: &str, subdomain: bool, causes: &mut Vec<(String, String)>) {
    let field = "metadata.name".to_string();
    let bad = |msg: &str| (field.clone(), format!("Invalid value: \"{name}\": {msg}"));
    if name.is_empty() {
        causes.push((
            field.clone(),
            "Required value: name or generateName is required".to_string(),
        ));
    } else if subdomain {
        if !is_subdomain(name) {
            causes.push(bad(SUBDOMAIN_MSG));
        }
    } else if name == "." || name == ".." {
        causes.push(bad(&format!("may not be '{name}'")));
    } else if let Some(c) = ['/', '%'].into_iter().find(|c| name.contains(*c)) {
        causes.push(bad(&format!("may not contain '{c}'")));
    }
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

const LABEL_NAME_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// Why `k` is not a qualified name (a label or annotation key), as the real server says it.
fn qualified_name_error(k: &str) -> Option<String> {
    let parts: Vec<&str> = k.split('/').collect();
    let (prefix, name) = match parts.as_slice() {
        [n] => (None, *n),
        [p, n] => (Some(*p), *n),
        _ => return Some("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_string()),
    };
    match prefix {
        Some("") => return Some("prefix part must be non-empty".to_string()),
        Some(p) if !is_subdomain(p) => return Some(format!("prefix part {SUBDOMAIN_MSG}")),
        _ => {}
    }
    if name.is_empty() {
        Some("name part must be non-empty".to_string())
    } else if name.len() > 63 {
        Some("name part must be no more than 63 characters".to_string())
    } else if !is_label_name(name) {
        Some(LABEL_NAME_MSG.to_string())
    } else {
        None
    }
}

/// Why `v` is not a label value.
fn label_value_error(v: &str) -> Option<String> {
    if v.is_empty() {
        None
    } else if v.len() > 63 {
        Some("must be no more than 63 characters".to_string())
    } else if !is_label_name(v) {
        Some("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_string())
    } else {
        None
    }
}

/// Label and annotation causes of `meta` (ValidateObjectMeta).
fn meta_causes(meta: &Value, causes: &mut Vec<(String, String)>) {
    if let Some(labels) = meta["labels"].as_object() {
        for (k, v) in labels {
            let field = "metadata.labels".to_string();
            if let Some(msg) = qualified_name_error(k) {
                causes.push((field.clone(), format!("Invalid value: \"{k}\": {msg}")));
            }
            let text = v
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string());
            if let Some(msg) = label_value_error(&text)
                .or_else(|| (!v.is_string()).then(|| "must be a string".to_string()))
            {
                causes.push((field, format!("Invalid value: \"{text}\": {msg}")));
            }
        }
    }
    if let Some(ann) = meta["annotations"].as_object() {
        let mut total = 0;
        for (k, v) in ann {
            if let Some(msg) = qualified_name_error(k) {
                causes.push((
                    "metadata.annotations".to_string(),
                    format!("Invalid value: \"{k}\": {msg}"),
                ));
            }
            total += k.len() + v.as_str().map_or(0, str::len);
        }
        if total > MAX_ANNOTATIONS_SIZE {
            causes.push((
                "metadata.annotations".to_string(),
                format!("Too long: must have at most {MAX_ANNOTATIONS_SIZE} bytes"),
            ));
        }
    }
}

/// Why `k` is not a valid key of a ConfigMap or Secret (IsConfigMapKey).
fn config_key_error(k: &str) -> Option<String> {
    if k.len() > 253 {
        Some("must be no more than 253 characters".to_string())
    } else if k.is_empty()
        || !k
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"-._".contains(&c))
    {
        Some("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')".to_string())
    } else if k == "." {
        Some("must not be '.'".to_string())
    } else if k == ".." {
        Some("must not be '..'".to_string())
    } else if k.starts_with("..") {
        Some("must not start with '..'".to_string())
    } else {
        None
    }
}

/// Causes of the plain object `obj` named `name` of `res` (and, for an update, `old`); a
/// body the real server could not even decode is a 400 instead.
fn validate_plain(
    res: &Resource,
    name: &str,
    obj: &Value,
    old: Option<&Value>,
) -> Result<(), (u16, Value)> {
    let mut causes = Vec::new();
    name_causes(name, res.plural != "events", &mut causes);
    meta_causes(&obj["metadata"], &mut causes);
    match res.plural {
        "configmaps" => configmap_causes(obj, old, &mut causes)?,
        "events" => event_causes(obj, &mut causes),
        _ => {}
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(invalid_object(res.kind, res.group, name, &causes))
    }
}

/// ValidateConfigMap (keys, duplicates, total size) and, for an update of an immutable one,
/// ValidateConfigMapUpdate.
fn configmap_causes(
    obj: &Value,
    old: Option<&Value>,
    causes: &mut Vec<(String, String)>,
) -> Result<(), (u16, Value)> {
    let undecodable = |what: &str| {
        Err(bad_request(&format!(
            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: {what}"
        )))
    };
    let (data, bin) = (&obj["data"], &obj["binaryData"]);
    if !(data.is_null() || data.is_object()) || !(bin.is_null() || bin.is_object()) {
        return undecodable("data and binaryData must be objects");
    }
    let mut total = 0usize;
    for (k, v) in data.as_object().into_iter().flatten() {
        let Some(text) = v.as_str() else {
            return undecodable(&format!(
                "json: cannot unmarshal {v} into Go struct field ConfigMap.data of type string"
            ));
        };
        if let Some(msg) = config_key_error(k) {
            causes.push((
                format!("data[{k}]"),
                format!("Invalid value: \"{k}\": {msg}"),
            ));
        }
        if bin.get(k).is_some() {
            causes.push((
                format!("data[{k}]"),
                format!("Invalid value: \"{k}\": duplicate of key present in binaryData"),
            ));
        }
        total += text.len();
    }
    for (k, v) in bin.as_object().into_iter().flatten() {
        let bytes = v
            .as_str()
            .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok());
        let Some(bytes) = bytes else {
            return undecodable("illegal base64 data in binaryData");
        };
        if let Some(msg) = config_key_error(k) {
            causes.push((
                format!("binaryData[{k}]"),
                format!("Invalid value: \"{k}\": {msg}"),
            ));
        }
        total += bytes.len();
    }
    if total > MAX_CONFIGMAP_SIZE {
        causes.push((
            "[]".to_string(),
            format!("Too long: must have at most {MAX_CONFIGMAP_SIZE} bytes"),
        ));
    }
    if let Some(old) = old.filter(|o| o["immutable"] == json!(true)) {
        let frozen = "Forbidden: field is immutable when `immutable` is set";
        if obj["immutable"] != json!(true) {
            causes.push(("immutable".to_string(), frozen.to_string()));
        }
        for f in ["data", "binaryData"] {
            if obj[f] != old[f] {
                causes.push((f.to_string(), frozen.to_string()));
            }
        }
    }
    Ok(())
}

/// The real server's legacy Event checks (all a core/v1 Event gets): the namespaces agree;
/// a "new" Event (with `eventTime`) names its reporter, action and reason.
fn event_causes(obj: &Value, causes: &mut Vec<(String, String)>) {
    let ns = obj["metadata"]["namespace"].as_str().unwrap_or("");
    let io_ns = obj["involvedObject"]["namespace"].as_str().unwrap_or("");
    let mismatch = (
        "involvedObject.namespace".to_string(),
        format!("Invalid value: \"{io_ns}\": does not match event.namespace"),
    );
    if obj["eventTime"].as_str().unwrap_or("").is_empty() {
        if (io_ns.is_empty() && !ns.is_empty() && ns != "default")
            || (!io_ns.is_empty() && ns != io_ns)
        {
            causes.push(mismatch);
        }
        return;
    }
    if io_ns.is_empty() && ns != "default" && ns != "kube-system" {
        causes.push(mismatch);
    }
    let s = |k: &str| obj[k].as_str().unwrap_or("");
    let reporter = s("reportingComponent");
    if let Some(msg) = (!reporter.is_empty())
        .then(|| qualified_name_error(reporter))
        .flatten()
    {
        causes.push((
            "reportingController".to_string(),
            format!("Invalid value: \"{reporter}\": {msg}"),
        ));
    }
    for (field, key, limit) in [
        ("reportingController", "reportingComponent", usize::MAX),
        ("reportingInstance", "reportingInstance", 128),
        ("action", "action", 128),
        ("reason", "reason", 128),
        ("message", "message", 1024),
    ] {
        let v = s(key);
        if v.is_empty() && field != "message" {
            causes.push((field.to_string(), "Required value".to_string()));
        } else if v.len() > limit {
            causes.push((
                field.to_string(),
                format!("Invalid value: \"\": can have at most {limit} characters"),
            ));
        }
    }
}

/// ValidateSecret: name, labels and annotations, data keys, base64 values, total size.
fn validate(name: &str, secret: &Value) -> Result<(), (u16, Value)> {
    let mut causes = Vec::new();
    name_causes(name, true, &mut causes);
    meta_causes(&secret["metadata"], &mut causes);
    let undecodable = || {
        Err(bad_request(
            "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data",
        ))
    };
    let mut total = 0usize;
    for (k, v) in secret["data"].as_object().into_iter().flatten() {
        if let Some(msg) = config_key_error(k) {
            causes.push((
                format!("data[{k}]"),
                format!("Invalid value: \"{k}\": {msg}"),
            ));
        }
        let bytes = v
            .as_str()
            .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok());
        match bytes {
            Some(b) => total += b.len(),
            None => return undecodable(),
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
