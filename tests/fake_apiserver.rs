//! The fake API server itself (tests/common/fake_apiserver.rs), driven through kube's typed
//! API as keyplan drives it: the real API's semantics for ConfigMaps and Events
//! (resourceVersion conflicts, AlreadyExists, NotFound, 422 Invalid, label selectors,
//! generateName), RBAC-rule tokens (resourceNames, create and list never by name, the real
//! 403 text), the request log, and many concurrent clients next to stalled ones. Every
//! outcome is read back from the fake's store directly, not only from what the client says.

#[path = "common/fake_apiserver.rs"]
mod fake_apiserver;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use fake_apiserver::{rules_from_role_yaml, Access, FakeApiserver, Rule};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Event, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "keyplan";
const AGENT: &str = "system:serviceaccount:keyplan:keyplan";

/// A kube client from the kubeconfig file `path` (its current context).
async fn client(path: &Path) -> kube::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("kube config");
    kube::Client::try_from(config).expect("kube client")
}

async fn full(fake: &FakeApiserver) -> kube::Client {
    client(&fake.kubeconfig(NS, "full")).await
}

/// The API error (`Status`) of a failed call; panics on success or another error.
fn api_err<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn configmap(name: &str, data: &[(&str, &str)], labels: &[(&str, &str)]) -> ConfigMap {
    let map = |kv: &[(&str, &str)]| {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: (!labels.is_empty()).then(|| map(labels)),
            ..ObjectMeta::default()
        },
        data: Some(map(data)),
        ..ConfigMap::default()
    }
}

fn rv(meta: &ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .expect("resourceVersion")
        .parse()
        .expect("numeric resourceVersion")
}

/// A client on the fake, and the ConfigMap `report-n1` (`state: ok`, label `app: keyplan`)
/// created through it.
async fn with_report(fake: &FakeApiserver) -> (Api<ConfigMap>, ConfigMap) {
    let api: Api<ConfigMap> = Api::namespaced(full(fake).await, NS);
    let created = api
        .create(
            &PostParams::default(),
            &configmap("report-n1", &[("state", "ok")], &[("app", "keyplan")]),
        )
        .await
        .expect("create");
    (api, created)
}

#[tokio::test]
async fn configmap_updates_follow_the_resource_version() {
    let fake = FakeApiserver::start();
    let (api, created) = with_report(&fake).await;
    let pp = PostParams::default();
    let stored = fake.configmap(NS, "report-n1").expect("stored");
    assert_eq!(stored["data"]["state"], "ok");
    assert_eq!(stored["metadata"]["labels"]["app"], "keyplan");
    assert_eq!(
        stored["metadata"]["resourceVersion"].as_str(),
        created.metadata.resource_version.as_deref()
    );
    let uid = created.metadata.uid.clone().expect("uid");

    // Update with the current resourceVersion: a new, higher one; labels come from the body,
    // uid and creationTimestamp stay the server's even when the client sends others.
    let mut next = api.get("report-n1").await.expect("get");
    next.data = Some(BTreeMap::from([(
        "state".to_string(),
        "failed".to_string(),
    )]));
    next.metadata.labels = Some(BTreeMap::from([("node".to_string(), "n1".to_string())]));
    next.metadata.uid = Some("someone-else".to_string());
    let updated = api.replace("report-n1", &pp, &next).await.expect("update");
    assert!(rv(&updated.metadata) > rv(&created.metadata));
    let stored = fake.configmap(NS, "report-n1").expect("stored");
    assert_eq!(stored["data"]["state"], "failed");
    assert_eq!(stored["metadata"]["labels"], json!({"node": "n1"}));
    assert_eq!(stored["metadata"]["uid"], uid.as_str());

    // A stale resourceVersion is a 409 Conflict and changes nothing.
    let mut stale = created.clone();
    stale.data = Some(BTreeMap::from([("state".to_string(), "stale".to_string())]));
    let s = api_err(api.replace("report-n1", &pp, &stale).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        s.message,
        "Operation cannot be fulfilled on configmaps \"report-n1\": the object has been modified; please apply your changes to the latest version and try again"
    );
    assert_eq!(
        fake.configmap(NS, "report-n1").expect("stored")["data"]["state"],
        "failed"
    );

    // Another client's write makes this client's copy stale too.
    let mine = api.get("report-n1").await.expect("get");
    fake.modify_configmap(NS, "report-n1", |cm| cm["data"]["by"] = json!("other"));
    let s = api_err(api.replace("report-n1", &pp, &mine).await);
    assert_eq!(s.code, 409);

    // An update that changes nothing keeps the resourceVersion.
    let current = api.get("report-n1").await.expect("get");
    let same = api
        .replace("report-n1", &pp, &current)
        .await
        .expect("no-op update");
    assert_eq!(rv(&same.metadata), rv(&current.metadata));
}

#[tokio::test]
async fn configmaps_exist_once_and_missing_ones_are_404() {
    let fake = FakeApiserver::start();
    let (api, _) = with_report(&fake).await;
    let pp = PostParams::default();
    let s = api_err(api.create(&pp, &configmap("report-n1", &[], &[])).await);
    assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(s.message, "configmaps \"report-n1\" already exists");
    assert_eq!(
        fake.configmap(NS, "report-n1").expect("stored")["data"]["state"],
        "ok"
    );

    let s = api_err(api.get("report-n9").await);
    assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
    assert_eq!(s.message, "configmaps \"report-n9\" not found");
    let s = api_err(
        api.replace("report-n9", &pp, &configmap("report-n9", &[], &[]))
            .await,
    );
    assert_eq!(s.code, 404);
    assert!(fake.configmap(NS, "report-n9").is_none());

    // A merge patch changes what it names and keeps the rest.
    let patch = json!({"metadata": {"labels": {"phase": "done"}}, "data": {"by": "n1"}});
    api.patch("report-n1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("merge patch");
    let stored = fake.configmap(NS, "report-n1").expect("stored");
    assert_eq!(
        stored["metadata"]["labels"],
        json!({"app": "keyplan", "phase": "done"})
    );
    assert_eq!(stored["data"], json!({"state": "ok", "by": "n1"}));

    api.delete("report-n1", &Default::default())
        .await
        .expect("delete");
    assert!(fake.configmap(NS, "report-n1").is_none());
    let s = api_err(api.delete("report-n1", &Default::default()).await);
    assert_eq!(s.code, 404);
}

#[tokio::test]
async fn invalid_configmaps_are_422_and_not_stored() {
    let fake = FakeApiserver::start();
    let api: Api<ConfigMap> = Api::namespaced(full(&fake).await, NS);
    let pp = PostParams::default();

    // Exactly 1 MiB of data and binaryData together is allowed; one byte more is not.
    let mut at_limit = configmap("at-limit", &[], &[]);
    at_limit.data = Some(BTreeMap::from([(
        "a".to_string(),
        "x".repeat((1 << 20) - 10),
    )]));
    at_limit.binary_data = Some(BTreeMap::from([("b".to_string(), ByteString(vec![7; 10]))]));
    api.create(&pp, &at_limit).await.expect("exactly 1 MiB");
    let mut over = at_limit.clone();
    over.metadata.name = Some("over-limit".to_string());
    over.binary_data = Some(BTreeMap::from([("b".to_string(), ByteString(vec![7; 11]))]));
    let s = api_err(api.create(&pp, &over).await);
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        s.message,
        "ConfigMap \"over-limit\" is invalid: []: Too long: must have at most 1048576 bytes"
    );
    assert!(fake.configmap(NS, "over-limit").is_none());

    let s = api_err(
        api.create(&pp, &configmap("bad-key", &[("no spaces", "v")], &[]))
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert!(
        s.message.starts_with(
            "ConfigMap \"bad-key\" is invalid: data[no spaces]: Invalid value: \"no spaces\": a valid config key must consist of alphanumeric characters"
        ),
        "{}",
        s.message
    );
    let causes = s.details.expect("details").causes;
    assert_eq!(causes[0].field, "data[no spaces]");
    assert!(fake.configmap(NS, "bad-key").is_none());

    let s = api_err(api.create(&pp, &configmap("Not_A_Name", &[], &[])).await);
    assert_eq!(s.code, 422);
    assert!(s
        .message
        .contains("metadata.name: Invalid value: \"Not_A_Name\""));
    let s = api_err(
        api.create(
            &pp,
            &configmap("bad-label", &[], &[("node", "not a label value")]),
        )
        .await,
    );
    assert_eq!(s.code, 422);
    assert!(
        s.message.contains("metadata.labels: Invalid value"),
        "{}",
        s.message
    );

    // An immutable ConfigMap keeps its data.
    let mut frozen = configmap("frozen", &[("k", "v")], &[]);
    frozen.immutable = Some(true);
    let mut frozen = api.create(&pp, &frozen).await.expect("create immutable");
    frozen.data = Some(BTreeMap::from([("k".to_string(), "w".to_string())]));
    let s = api_err(api.replace("frozen", &pp, &frozen).await);
    assert_eq!(s.code, 422);
    assert!(
        s.message.contains("data: Forbidden: field is immutable"),
        "{}",
        s.message
    );
    assert_eq!(
        fake.configmap(NS, "frozen").expect("stored")["data"]["k"],
        "v"
    );
}

/// A client on the fake after creating ConfigMaps `r-n1`, `r-n2` (labels `app: keyplan`,
/// `node`), `other` (`app: else`) and `plain` (no labels) in the namespace, and `r-n3` in
/// namespace `elsewhere`, which lists of the namespace never show; and that last one.
async fn with_reports(fake: &FakeApiserver) -> (Api<ConfigMap>, ConfigMap) {
    let api: Api<ConfigMap> = Api::namespaced(full(fake).await, NS);
    let pp = PostParams::default();
    for (name, labels) in [
        ("r-n1", vec![("app", "keyplan"), ("node", "n1")]),
        ("r-n2", vec![("app", "keyplan"), ("node", "n2")]),
        ("other", vec![("app", "else")]),
        ("plain", vec![]),
    ] {
        api.create(&pp, &configmap(name, &[], &labels))
            .await
            .expect("create");
    }
    let elsewhere: Api<ConfigMap> = Api::namespaced(full(fake).await, "elsewhere");
    let last = elsewhere
        .create(&pp, &configmap("r-n3", &[], &[("app", "keyplan")]))
        .await
        .expect("create elsewhere");
    (api, last)
}

fn names(l: kube::core::ObjectList<ConfigMap>) -> Vec<String> {
    l.items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect()
}

#[tokio::test]
async fn lists_select_by_labels() {
    let fake = FakeApiserver::start();
    let (api, last) = with_reports(&fake).await;
    let mark = fake.mark();
    let l = api
        .list(&ListParams::default().labels("app=keyplan,node=n1"))
        .await
        .expect("list");
    let list_rv: u64 = l
        .metadata
        .resource_version
        .clone()
        .expect("rv")
        .parse()
        .expect("rv");
    assert_eq!(
        list_rv,
        rv(&last.metadata),
        "the list's resourceVersion is the latest write's"
    );
    assert_eq!(names(l), ["r-n1"]);
    let logged = &fake.requests_since(mark)[0];
    assert_eq!(
        (logged.verb.as_str(), logged.resource.as_str()),
        ("list", "configmaps")
    );
    assert!(
        logged
            .query
            .contains("labelSelector=app%3Dkeyplan%2Cnode%3Dn1"),
        "{logged:?}"
    );

    let by = |sel: &'static str| ListParams::default().labels(sel);
    assert_eq!(
        names(api.list(&by("app=keyplan")).await.expect("list")),
        ["r-n1", "r-n2"]
    );
    assert_eq!(
        names(api.list(&by("app!=keyplan")).await.expect("list")),
        ["other", "plain"]
    );
    assert_eq!(names(api.list(&by("!app")).await.expect("list")), ["plain"]);
    assert_eq!(
        names(api.list(&by("node")).await.expect("list")),
        ["r-n1", "r-n2"]
    );
}

#[tokio::test]
async fn lists_select_by_fields_and_page() {
    let fake = FakeApiserver::start();
    let (api, _) = with_reports(&fake).await;
    let l = api
        .list(&ListParams::default().fields("metadata.name=other"))
        .await
        .expect("list");
    assert_eq!(names(l), ["other"]);
    let s = api_err(api.list(&ListParams::default().fields("spec.nope=1")).await);
    assert_eq!(
        (s.code, s.message.as_str()),
        (400, "field label not supported: spec.nope")
    );

    // limit and continue walk the same list.
    let first = api
        .list(&ListParams::default().limit(3))
        .await
        .expect("page 1");
    let token = first.metadata.continue_.clone().expect("continue");
    let second = api
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .expect("page 2");
    assert_eq!(names(first), ["other", "plain", "r-n1"]);
    assert_eq!(names(second), ["r-n2"]);
}

#[tokio::test]
async fn events_get_generated_names_and_the_real_namespace_check() {
    let fake = FakeApiserver::start();
    let api: Api<Event> = Api::namespaced(full(&fake).await, NS);
    let pp = PostParams::default();
    let event = |involved_ns: Option<&str>| Event {
        metadata: ObjectMeta {
            generate_name: Some("keyplan-run-".to_string()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: Some("ConfigMap".to_string()),
            name: Some("report-n1".to_string()),
            namespace: involved_ns.map(str::to_string),
            ..ObjectReference::default()
        },
        reason: Some("RunSucceeded".to_string()),
        message: Some("keyplan apply succeeded on n1".to_string()),
        type_: Some("Normal".to_string()),
        ..Event::default()
    };
    let a = api
        .create(&pp, &event(Some(NS)))
        .await
        .expect("create event");
    let b = api
        .create(&pp, &event(Some(NS)))
        .await
        .expect("create event");
    let name = a.metadata.name.clone().expect("name");
    let suffix = name
        .strip_prefix("keyplan-run-")
        .expect("generateName prefix");
    assert_eq!(suffix.len(), 5, "{name}");
    assert!(
        suffix
            .chars()
            .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c)),
        "{name}"
    );
    assert_ne!(a.metadata.name, b.metadata.name);
    let stored = fake.events(NS);
    assert_eq!(stored.len(), 2);
    assert_eq!(
        stored
            .iter()
            .filter(|e| e["metadata"]["name"] == name.as_str())
            .count(),
        1
    );
    assert_eq!(stored[0]["metadata"]["generateName"], "keyplan-run-");

    // An Event about an object of another namespace (or a cluster-scoped one, such as a
    // Node) without eventTime is refused by the real server, and so here.
    let s = api_err(api.create(&pp, &event(None)).await);
    assert_eq!(s.code, 422);
    assert!(
        s.message.contains(
            "involvedObject.namespace: Invalid value: \"\": does not match event.namespace"
        ),
        "{}",
        s.message
    );
    assert_eq!(fake.events(NS).len(), 2);

    let l = api
        .list(&ListParams::default().fields("involvedObject.name=report-n1,reason=RunSucceeded"))
        .await
        .expect("list events");
    assert_eq!(l.items.len(), 2);
}

const ROLE: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: keyplan, namespace: keyplan}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: keyplan-agent, namespace: keyplan}
rules:
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    resourceNames: ["keyplan-rollout-0", "keyplan-rollout-1"]
    verbs: ["get", "update"]
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    resourceNames: ["keyplan-rollout-0"]
    verbs: ["create"]
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["create", "get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: keyplan-agent, namespace: keyplan}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: keyplan-agent}
subjects: [{kind: ServiceAccount, name: keyplan, namespace: keyplan}]
"#;

fn lease(name: &str, holder: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_string()),
            ..LeaseSpec::default()
        }),
    }
}

#[test]
fn rules_from_a_manifest_read_every_role_document() {
    let rules = rules_from_role_yaml(ROLE);
    assert_eq!(rules.len(), 3);
    assert_eq!(
        rules[0].resource_names,
        ["keyplan-rollout-0", "keyplan-rollout-1"]
    );
    assert_eq!(rules[2].api_groups, [""]);
    assert!(rules[0].allows(
        "coordination.k8s.io",
        "leases",
        "get",
        Some("keyplan-rollout-1")
    ));
    assert!(!rules[0].allows(
        "coordination.k8s.io",
        "leases",
        "get",
        Some("keyplan-rollout-2")
    ));
    assert!(!rules[0].allows("coordination.k8s.io", "leases", "list", None));
    assert!(!rules[1].allows("coordination.k8s.io", "leases", "create", None));
    let star = Rule {
        api_groups: vec!["*".into()],
        resources: vec!["*".into()],
        verbs: vec!["*".into()],
        resource_names: vec![],
    };
    assert!(star.allows("apps", "deployments", "deletecollection", None));
}

/// The fake with Leases `keyplan-rollout-0` and `-5` (held by `n0`) and a token for
/// [`AGENT`] with the rules of [`ROLE`]; a client with that token.
async fn with_agent(fake: &FakeApiserver) -> kube::Client {
    fake.add_token_with_rules("kp-agent", AGENT, rules_from_role_yaml(ROLE));
    let admin: Api<Lease> = Api::namespaced(full(fake).await, NS);
    for i in [0, 5] {
        admin
            .create(
                &PostParams::default(),
                &lease(&format!("keyplan-rollout-{i}"), "n0"),
            )
            .await
            .expect("admin creates");
    }
    client(&fake.kubeconfig_with_token(NS, "kp-agent")).await
}

fn held_by(holder: &str) -> Option<LeaseSpec> {
    Some(LeaseSpec {
        holder_identity: Some(holder.to_string()),
        ..LeaseSpec::default()
    })
}

#[tokio::test]
async fn a_rules_token_may_use_named_objects_only_by_their_names() {
    let fake = FakeApiserver::start();
    let leases: Api<Lease> = Api::namespaced(with_agent(&fake).await, NS);
    let pp = PostParams::default();

    let mut l0 = leases
        .get("keyplan-rollout-0")
        .await
        .expect("get by resourceNames");
    l0.spec = held_by("n1");
    leases
        .replace("keyplan-rollout-0", &pp, &l0)
        .await
        .expect("update by resourceNames");
    assert_eq!(
        fake.lease(NS, "keyplan-rollout-0").expect("lease")["spec"]["holderIdentity"],
        "n1"
    );

    // Another name: 403, with the real server's words, and nothing changed.
    let s = api_err(leases.get("keyplan-rollout-5").await);
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        s.message,
        "leases.coordination.k8s.io \"keyplan-rollout-5\" is forbidden: User \"system:serviceaccount:keyplan:keyplan\" cannot get resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"keyplan\""
    );
    let mut l5 = l0.clone();
    l5.metadata = ObjectMeta {
        name: Some("keyplan-rollout-5".to_string()),
        ..ObjectMeta::default()
    };
    let s = api_err(leases.replace("keyplan-rollout-5", &pp, &l5).await);
    assert_eq!(s.code, 403);
    assert!(
        s.message.contains("cannot update resource \"leases\""),
        "{}",
        s.message
    );
    assert_eq!(
        fake.lease(NS, "keyplan-rollout-5").expect("lease")["spec"]["holderIdentity"],
        "n0"
    );
}

#[tokio::test]
async fn a_rules_token_creates_and_lists_only_by_nameless_rules() {
    let fake = FakeApiserver::start();
    let agent = with_agent(&fake).await;
    let leases: Api<Lease> = Api::namespaced(agent.clone(), NS);
    let configmaps: Api<ConfigMap> = Api::namespaced(agent.clone(), NS);
    let pp = PostParams::default();

    // Only a resourceNames rule grants create: never allowed, even for the listed name.
    fake.delete_object("leases", NS, "keyplan-rollout-0");
    let s = api_err(leases.create(&pp, &lease("keyplan-rollout-0", "n2")).await);
    assert_eq!(s.code, 403);
    assert_eq!(
        s.message,
        "leases.coordination.k8s.io is forbidden: User \"system:serviceaccount:keyplan:keyplan\" cannot create resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"keyplan\""
    );
    assert!(fake.lease(NS, "keyplan-rollout-0").is_none());

    // A nameless rule grants create; list is not granted.
    configmaps
        .create(&pp, &configmap("report-n1", &[("state", "ok")], &[]))
        .await
        .expect("create by a nameless rule");
    assert!(fake.configmap(NS, "report-n1").is_some());
    let s = api_err(configmaps.list(&ListParams::default()).await);
    assert_eq!(
        s.message,
        "configmaps is forbidden: User \"system:serviceaccount:keyplan:keyplan\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"keyplan\""
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(agent, NS);
    assert_eq!(api_err(secrets.get("anything").await).code, 403);

    // The log says who asked what, in authorization terms.
    let log = fake.requests_by_user(AGENT);
    assert!(fake
        .requests()
        .iter()
        .all(|r| r.user == AGENT || r.user == "system:serviceaccount:rook-ceph:keyplan"));
    let seen: Vec<_> = log
        .iter()
        .map(|r| {
            (
                r.code,
                r.verb.as_str(),
                r.group.as_str(),
                r.resource.as_str(),
                r.name.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (403, "create", "coordination.k8s.io", "leases", None),
            (201, "create", "", "configmaps", None),
            (403, "list", "", "configmaps", None),
            (403, "get", "", "secrets", Some("anything")),
        ]
    );
    assert_eq!(
        (
            log[1].method.as_str(),
            log[1].namespace.as_str(),
            log[1].path.as_str()
        ),
        ("POST", NS, "/api/v1/namespaces/keyplan/configmaps")
    );
}

#[tokio::test]
async fn access_reviews_answer_by_the_same_rules() {
    let fake = FakeApiserver::start();
    let reviews: Api<SelfSubjectAccessReview> = Api::all(with_agent(&fake).await);
    let may = |verb: &str, name: Option<&str>| SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(NS.to_string()),
                verb: Some(verb.to_string()),
                group: Some("coordination.k8s.io".to_string()),
                resource: Some("leases".to_string()),
                name: name.map(str::to_string),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    for (verb, name, allowed) in [
        ("update", Some("keyplan-rollout-1"), true),
        ("update", Some("keyplan-rollout-5"), false),
        ("create", None, false),
        ("list", None, false),
    ] {
        let answer = reviews
            .create(&PostParams::default(), &may(verb, name))
            .await
            .expect("access review");
        assert_eq!(
            answer.status.expect("status").allowed,
            allowed,
            "{verb} {name:?}"
        );
    }
    let review = fake.requests_by_user(AGENT).pop().expect("logged");
    assert_eq!(
        (
            review.code,
            review.verb.as_str(),
            review.group.as_str(),
            review.resource.as_str(),
            review.namespace.as_str()
        ),
        (
            201,
            "create",
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
            ""
        )
    );
}

#[tokio::test]
async fn fixed_access_tokens_keep_their_policy_on_the_new_resources() {
    let fake = FakeApiserver::start();
    fake.add_token("kp-reader", "reader", Access::ReadOnly);
    let full_cm: Api<ConfigMap> = Api::namespaced(full(&fake).await, NS);
    full_cm
        .create(&PostParams::default(), &configmap("c", &[], &[]))
        .await
        .expect("full creates");
    let reader: Api<ConfigMap> = Api::namespaced(
        client(&fake.kubeconfig_with_token(NS, "kp-reader")).await,
        NS,
    );
    let s = api_err(reader.get("c").await);
    assert_eq!(s.code, 403);
    assert_eq!(
        s.message,
        "configmaps \"c\" is forbidden: User \"reader\" cannot get resource \"configmaps\" in API group \"\" in the namespace \"keyplan\""
    );
    let unknown: Api<ConfigMap> =
        Api::namespaced(client(&fake.kubeconfig(NS, "bad-token")).await, NS);
    assert_eq!(api_err(unknown.get("c").await).code, 401);
    let last = fake.requests().pop().expect("logged");
    assert_eq!(
        (last.code, last.user.as_str(), last.resource.as_str()),
        (401, "", "configmaps")
    );
}

/// A request whose body never comes (over 1024 bytes, so tiny_http hands it to a worker before
/// reading it): it holds up one worker, not the server.
fn stall(fake: &FakeApiserver) -> std::net::TcpStream {
    let mut s =
        std::net::TcpStream::connect(fake.url().trim_start_matches("http://")).expect("connect");
    write!(
        s,
        "POST /api/v1/namespaces/{NS}/configmaps HTTP/1.1\r\nHost: fake\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{",
        fake.full_token
    )
    .expect("write");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn a_hundred_clients_are_served_next_to_stalled_ones() {
    let fake = FakeApiserver::start();
    let kubeconfig = fake.kubeconfig(NS, "full");
    // More stalled requests than the 4 workers the fake used to have, fewer than its 16.
    let stalled: Vec<_> = (0..12).map(|_| stall(&fake)).collect();
    std::thread::sleep(Duration::from_millis(200));

    let started = Instant::now();
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let kubeconfig = kubeconfig.clone();
            tokio::spawn(async move {
                let api: Api<ConfigMap> = Api::namespaced(client(&kubeconfig).await, NS);
                let name = format!("report-n{i}");
                let made = api
                    .create(
                        &PostParams::default(),
                        &configmap(&name, &[("n", "1")], &[]),
                    )
                    .await
                    .expect("create");
                for _ in 0..3 {
                    api.get(&name).await.expect("poll");
                }
                rv(&made.metadata)
            })
        })
        .collect();
    let mut rvs = Vec::new();
    for t in tasks {
        rvs.push(
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("served in time")
                .expect("task"),
        );
    }
    assert!(started.elapsed() < Duration::from_secs(60));
    rvs.sort();
    rvs.dedup();
    assert_eq!(
        rvs.len(),
        100,
        "one global resourceVersion: every write its own"
    );
    assert_eq!(fake.configmaps(NS).len(), 100);

    // Stopping does not wait for the stalled clients.
    let started = Instant::now();
    drop(fake);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    drop(stalled);
}
