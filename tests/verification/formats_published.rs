//! Fixtures of the documents keyplan publishes (docs/formats.md, "Documents for programs" and
//! "Fleet objects"): node reports, `fleet status` JSON, saved plans and the signed-plan
//! envelope, under `tests/fixtures/formats/<name>/v<N>/`. Each fixture is read with the current
//! keyplan, and today's writer, fed the fixed values the fixture was made from, reproduces it
//! byte for byte. A hand-made document of a newer major version is refused with
//! `format::NewerFormat`'s message, and nothing is written.
//!
//! `KEYPLAN_WRITE_FIXTURES=1` writes a fixture that does not exist yet (a new version); it
//! never overwrites one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use keyplan::fleet::report::{
    AgentRun, AgentState, DeviceSummary, Failure, KeySummary, NodeReport, Observation,
    PlanSignature, RefusedPlan,
};
use keyplan::format::published::node_report;
use keyplan::kms::{KeyState, VersionInfo, VersionState};
use keyplan::luks::{Header, Keyslot, LuksVersion, Priority, Token};
use keyplan::observe::{
    Adoption, DeviceState, EnrollFile, Kept, Observed, Occupant, Origin, Unavailable, Untested,
};
use keyplan::world::{RecordObs, RecordStatus, SlotRecord};

/// `tests/fixtures/formats/<rel>`.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/formats")
        .join(rel)
}

/// Compares `written` with the fixture `rel`, byte for byte; with `KEYPLAN_WRITE_FIXTURES=1`
/// writes a fixture that does not exist yet.
pub fn same_as_fixture(rel: &str, written: &str) {
    let path = fixture(rel);
    if !path.exists() && std::env::var_os("KEYPLAN_WRITE_FIXTURES").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, written).unwrap();
    }
    let stored = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
    assert!(
        stored == written,
        "today's writer no longer reproduces {} byte for byte: a changed format is a new version (docs/formats.md)\n--- fixture\n{stored}\n--- written\n{written}",
        path.display()
    );
}

/// Prometheus text without its `# HELP` lines: the families' names, types and labels are the
/// contract of the metrics (docs/formats.md), their help texts are for people.
pub fn without_help(metrics: &str) -> String {
    metrics
        .lines()
        .filter(|l| !l.starts_with("# HELP "))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn keyslot(salt: &str, kdf: &str) -> Keyslot {
    Keyslot {
        bound: true,
        salt: salt.into(),
        priority: Priority::Normal,
        kdf: kdf.into(),
        memory_kib: (kdf == "argon2id").then_some(65536),
        iterations: Some(4),
        parallel: (kdf == "argon2id").then_some(2),
    }
}

fn header(uuid: &str) -> Header {
    let mut keyslots = BTreeMap::new();
    keyslots.insert(0, keyslot("c2FsdDA=", "argon2id"));
    keyslots.insert(
        1,
        Keyslot {
            priority: Priority::Ignore,
            bound: false,
            ..keyslot("c2FsdDE=", "pbkdf2")
        },
    );
    let mut tokens = BTreeMap::new();
    tokens.insert(
        0,
        Token {
            id: 0,
            token_type: "keyplan".into(),
            keyslots: vec![0],
            json: serde_json::json!({"type": "keyplan", "keyslots": ["0"]}),
        },
    );
    Header {
        version: LuksVersion::Luks2,
        uuid: uuid.into(),
        keyslots,
        tokens,
        json_area: Some((12288, 2048)),
        epoch: Some(7),
        pbkdf2_target: ("sha256".into(), Some(512)),
        condition: keyplan::luks::ondisk::Condition {
            damage: vec!["the secondary header copy is damaged".into()],
            copies_disagree: true,
            mid_write: false,
            requirements: vec!["online-reencrypt-v2".into()],
            reencryption: false,
        },
    }
}

fn record(slot: u32, key: &str, version: u64, status: RecordStatus) -> RecordObs {
    RecordObs {
        slot,
        record: SlotRecord {
            key: key.into(),
            version,
            salt: "c2FsdDA=".into(),
            entry: Some(("vault".into(), format!("luks/{key}"))),
            pbkdf: Some("argon2id memory_kib=65536 iter_time_ms=2000".into()),
        },
        token_id: Some(0),
        status,
        renamed_from: (status == RecordStatus::Rewritten).then(|| "old-id".into()),
    }
}

fn key_state(current: u64) -> KeyState {
    let mut versions = BTreeMap::new();
    versions.insert(
        current - 1,
        VersionInfo {
            version: current - 1,
            created_at: 1_700_000_000,
            state: VersionState::Previous,
        },
    );
    versions.insert(
        current,
        VersionInfo {
            version: current,
            created_at: 1_700_086_400,
            state: VersionState::Current,
        },
    );
    versions.insert(
        current + 1,
        VersionInfo {
            version: current + 1,
            created_at: 1_700_172_800,
            state: VersionState::Pending,
        },
    );
    KeyState {
        current: Some(current),
        pending: Some(current + 1),
        versions,
        holders: BTreeMap::from([("worker-1:/var/lib/keyplan".to_string(), 1_700_000_100)]),
    }
}

fn device(id: &str, uuid: &str) -> DeviceState {
    let mut d = DeviceState::new(
        id,
        PathBuf::from(format!("/dev/disk/by-id/{id}")),
        header(uuid),
        vec![
            record(0, "data", 2, RecordStatus::Valid),
            record(3, "data", 1, RecordStatus::Rewritten),
        ],
    );
    d.read_only = Some("read-only filesystem".into());
    d.enroll_with_problem = Some("the passphrase opens no bound keyslot".into());
    d.enroll_with_keyslot = Some(1);
    d.enroll_with_file = Some(EnrollFile::TooLong { bytes: 9_000_000 });
    d.adoptable = vec![Adoption {
        slot: 1,
        key: "data".into(),
        version: 2,
        salt: "c2FsdDE=".into(),
        resalted: true,
    }];
    d.adoption_untested = Some(Untested {
        key: "data".into(),
        version: 2,
        slots: vec![1, 2],
    });
    d.retired_copies = vec![keyplan::world::copies::RetiredCopy {
        uuid: uuid.into(),
        device: id.into(),
        slot: 5,
        salt: "c2FsdDU=".into(),
        key: "data".into(),
        version: 1,
        found_at: 1_700_000_200,
    }];
    d
}

/// An observation with every field of the version-1 document set.
pub fn sample_observed() -> Observed {
    let mut former = device("old-disk", "22222222-2222-2222-2222-222222222222");
    former.enroll_with_file = Some(EnrollFile::Passphrase);
    Observed {
        devices: BTreeMap::from([(
            "disk-a".to_string(),
            device("disk-a", "11111111-1111-1111-1111-111111111111"),
        )]),
        keys: BTreeMap::from([("data".to_string(), key_state(2))]),
        former: BTreeMap::from([("old-disk".to_string(), former)]),
        former_unreadable: vec![(
            "gone".into(),
            PathBuf::from("/dev/disk/by-id/gone"),
            "no such device".into(),
        )],
        origins: BTreeMap::from([(
            "data".to_string(),
            vec![Origin {
                kms: "file".into(),
                name: "data".into(),
                state: Some(key_state(2)),
                occupant: Some(Occupant {
                    version: 1,
                    pending: true,
                    copy_of: Some(2),
                }),
            }],
        )]),
        now: 1_700_200_000,
        staged_here: BTreeSet::from([("data".to_string(), Some(3)), ("new".to_string(), None)]),
        unavailable: BTreeMap::from([(
            "disk-b".to_string(),
            Unavailable {
                path: PathBuf::from("/dev/disk/by-id/disk-b"),
                why: "not a LUKS device".into(),
                help: "check the path".into(),
                at: Some("keyplan.yaml:7:14".into()),
            },
        )]),
        former_holders: BTreeMap::from([(
            "worker-1:/old/state".to_string(),
            "the state directory moved".to_string(),
        )]),
        host: Some(keyplan::luks::KdfHost {
            cpus: 4,
            memory_kib: 8_000_000,
        }),
        kept: vec![Kept {
            copy: keyplan::world::kept::KeptCopy {
                key: "data".into(),
                kms: "file".into(),
                name: "data".into(),
                versions: vec![1, 2],
                since: 1_700_000_300,
            },
            state: Some(key_state(2)),
        }],
    }
}

/// A version-1 node report with every field set (the observation from [`sample_observed`]).
pub fn sample_report() -> NodeReport {
    let mut r = NodeReport::fresh("worker-1", 300, 1_700_200_010);
    r.agent_version = "0.1.0".into();
    r.plan_digest = Some("ab".repeat(32));
    r.state = AgentState::Waiting;
    r.message = Some("waiting for a rollout slot".into());
    r.changes = 2;
    r.devices = vec![DeviceSummary {
        id: "disk-a".into(),
        path: "/dev/disk/by-id/disk-a".into(),
        keyslots: vec![0, 1, 3],
        drifted: true,
    }];
    r.keys = vec![KeySummary {
        id: "data".into(),
        kms: "vault".into(),
        current_version: Some(2),
        versions: vec![1, 2],
        pending: Some(3),
        rotation_due_at: Some(1_702_000_000),
        overdue: false,
    }];
    r.problems = vec!["device disk-a drifted".into()];
    r.unchecked = vec!["key other: the KMS could not be read".into()];
    r.last_run = Some(AgentRun {
        id: Some("1700100000-42".into()),
        started_at: 1_700_100_000,
        ended_at: Some(1_700_100_009),
        outcome: "failed".into(),
        steps: 3,
        pbkdf_runs: 2,
        error: Some("cryptsetup failed".into()),
    });
    r.last_success_at = Some(1_700_000_000);
    r.failure = Some(Failure {
        at: 1_700_100_009,
        message: "cryptsetup failed".into(),
    });
    r.halted = true;
    r.refused_plan = Some(RefusedPlan {
        digest: "cd".repeat(32),
        reason: "unsigned".into(),
        message: "no signature".into(),
        since: 1_700_150_000,
    });
    r.plan_signature = Some(PlanSignature {
        key: "SHA256:abc".into(),
        signed_at: 1_700_000_050,
    });
    r.commits_waiting = vec![keyplan::diff::CommitWait {
        key: "data".into(),
        kms: "vault".into(),
        version: 3,
        current: Some(2),
        blocking: vec!["worker-2:/var/lib/keyplan".into()],
        verified_here: true,
    }
    .into()];
    r.waiting_since = Some(1_700_199_000);
    r.observation = Some(Observation::of(
        &sample_observed(),
        Path::new("/var/lib/keyplan"),
        Some("ab".repeat(32)),
    ));
    r
}

#[test]
fn node_report_v1_is_read_and_written_byte_for_byte() {
    let written = keyplan::fleet::report::document(&sample_report()).unwrap();
    same_as_fixture("node-report/v1/report.json", &written);
    let text = std::fs::read_to_string(fixture("node-report/v1/report.json")).unwrap();
    let read = node_report::parse("ConfigMap keyplan-node-worker-1", &text).unwrap();
    assert_eq!(read, sample_report());
    let obs = read.observation.as_ref().unwrap();
    let observed: Observed = obs.state.clone().into();
    assert_eq!(observed.devices["disk-a"].header.keyslots.len(), 2);
    assert_eq!(
        observed.devices["disk-a"].records[1].status,
        RecordStatus::Rewritten
    );
    assert_eq!(observed.keys["data"].pending, Some(3));
    assert_eq!(observed.now, 1_700_200_000);
    // The whole observation comes back as the engine's, the tokens' contents left out.
    let mut expected = sample_observed();
    for d in expected
        .devices
        .values_mut()
        .chain(expected.former.values_mut())
    {
        for t in d.header.tokens.values_mut() {
            t.json = serde_json::Value::Null;
        }
    }
    assert_eq!(observed, expected);
    // The tokens' contents are left out of a published observation.
    assert_eq!(
        observed.devices["disk-a"].header.tokens[&0].json,
        serde_json::Value::Null
    );
    let wait = keyplan::diff::CommitWait::from(read.commits_waiting[0].clone());
    assert_eq!(wait.blocking_nodes(), ["worker-2"]);
}

#[test]
fn a_node_report_of_a_newer_major_version_is_refused_not_misread() {
    let text = std::fs::read_to_string(fixture("node-report/v2/report.json")).unwrap();
    let err = node_report::parse("node report ConfigMap keyplan-node-worker-1", &text)
        .expect_err("a version-2 report is not read");
    let node_report::ReadError::Newer(newer) = &err else {
        panic!("not refused as newer: {err}");
    };
    assert_eq!(newer.found, "2.0");
    let text = err.to_string();
    assert!(
        text.starts_with("node report ConfigMap keyplan-node-worker-1 is node-report format 2.0, written by a newer keyplan"),
        "{text}"
    );
    assert!(
        text.contains("reads node-report formats up to 1.x"),
        "{text}"
    );
    // A newer minor version is read, its unknown fields ignored.
    let v1 = std::fs::read_to_string(fixture("node-report/v1/report.json")).unwrap();
    let mut minor: serde_json::Value = serde_json::from_str(&v1).unwrap();
    minor["format_version"] = "1.7".into();
    minor["added_in_1_7"] = serde_json::json!({"x": 1});
    let read = node_report::parse("r", &minor.to_string()).unwrap();
    assert_eq!(read.node, "worker-1");
}

/// The plan the envelope fixture signs (`plan-signature/v1/keyplan.yaml`), for cluster
/// `prod`, at 1700000000.
const SIGNED_AT: u64 = 1_700_000_000;

/// Makes the envelope fixture once (`KEYPLAN_WRITE_FIXTURES=1`): a fresh key signs the plan;
/// only its public key is kept.
fn make_signature_fixture() {
    use keyplan::fleet::signature::SigningKey;
    let dir = fixture("plan-signature/v1");
    if dir.join("keyplan.yaml.sig").exists() || std::env::var_os("KEYPLAN_WRITE_FIXTURES").is_none()
    {
        return;
    }
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("keyplan.yaml"),
        "version: 1\nkms: {}\nkeys: {}\ndevices: {}\n",
    )
    .unwrap();
    let key = SigningKey::generate().unwrap();
    std::fs::write(
        dir.join("public.pem"),
        key.public().unwrap().to_pem().unwrap(),
    )
    .unwrap();
    let plan = std::fs::read(dir.join("keyplan.yaml")).unwrap();
    let sig = key.sign(&plan, "prod", SIGNED_AT).unwrap();
    std::fs::write(dir.join("keyplan.yaml.sig"), sig.to_text()).unwrap();
}

fn policy() -> keyplan::fleet::signature::SignaturePolicy {
    keyplan::fleet::signature::SignaturePolicy::load(
        &[fixture("plan-signature/v1/public.pem")],
        "prod",
    )
    .unwrap()
}

#[test]
fn signature_envelope_v1_verifies_and_is_written_byte_for_byte() {
    use keyplan::fleet::signature::Signature;
    make_signature_fixture();
    let plan = std::fs::read(fixture("plan-signature/v1/keyplan.yaml")).unwrap();
    let text = std::fs::read_to_string(fixture("plan-signature/v1/keyplan.yaml.sig")).unwrap();
    let sig = Signature::parse(text.as_bytes()).unwrap();
    assert_eq!(sig.format, "keyplan-signature/v1");
    assert_eq!(sig.cluster, "prod");
    assert_eq!(sig.signed_at, SIGNED_AT);
    assert_eq!(sig.plan_sha256, keyplan::saved::sha256_hex(&plan));
    same_as_fixture("plan-signature/v1/keyplan.yaml.sig", &sig.to_text());
    let verified = policy()
        .verify(&plan, Some(text.as_bytes()), "keyplan.yaml.sig", None)
        .unwrap();
    assert_eq!(verified.signed_at, SIGNED_AT);
}

#[test]
fn a_signature_envelope_of_a_newer_version_is_refused_as_written_by_a_newer_keyplan() {
    use keyplan::fleet::signature::{Refusal, Signature};
    let plan = std::fs::read(fixture("plan-signature/v1/keyplan.yaml")).unwrap();
    let text = std::fs::read(fixture("plan-signature/v2/keyplan.yaml.sig")).unwrap();
    let err = Signature::parse(&text).expect_err("a v2 envelope is not read");
    let message = err.to_string();
    assert!(
        message
            .contains("the signature file is plan-signature format 2, written by a newer keyplan"),
        "{message}"
    );
    let refused = policy()
        .verify(&plan, Some(&text), "keyplan.yaml.sig", None)
        .expect_err("refused");
    let Refusal::Malformed { reason } = &refused else {
        panic!("not refused as unreadable: {refused:?}");
    };
    assert!(reason.contains("written by a newer keyplan"), "{reason}");
    // An envelope that is not keyplan's is still said to be one.
    let err = Signature::parse(br#"{"format": "something-else/v1"}"#).unwrap_err();
    assert!(
        err.to_string().contains("has format \"something-else/v1\""),
        "{err}"
    );
}

#[test]
fn fleet_status_json_is_written_byte_for_byte() {
    use keyplan::fleet::status::{FleetCommitWait, FleetStatus, NodeStatus, SlotStatus, Totals};
    let report = sample_report();
    let status = FleetStatus {
        format_version: keyplan::fleet::status::FORMAT_VERSION,
        generated_at: 1_700_200_020,
        namespace: "keyplan".into(),
        nodes: vec![
            NodeStatus {
                node: "worker-1".into(),
                state: "waiting".into(),
                lost: false,
                report_age_seconds: 10,
                failure_counts: true,
                report: Some(report),
                problem: None,
            },
            NodeStatus {
                node: "worker-2".into(),
                state: "newer".into(),
                lost: false,
                report_age_seconds: 0,
                failure_counts: false,
                report: None,
                problem: Some("node report ConfigMap keyplan-node-worker-2 is node-report format 2.0, written by a newer keyplan".into()),
            },
        ],
        totals: Totals {
            nodes: 2,
            by_state: [("newer".to_string(), 1), ("waiting".to_string(), 1)].into(),
            devices: 1,
            drifted_devices: 1,
            keys: 1,
            overdue_keys: 0,
            failures: 1,
            refused_plans: 1,
        },
        halted: false,
        paused: Some(keyplan::fleet::pause::Pause {
            reason: "maintenance".into(),
            by: "alice".into(),
            since: 1_700_200_000,
        }),
        slots: vec![SlotStatus {
            lease: "keyplan-rollout-0".into(),
            holder: Some("worker-3".into()),
        }],
        commits_waiting: vec![FleetCommitWait {
            key: "data".into(),
            kms: "vault".into(),
            version: 3,
            waiting_for: vec!["worker-2".into()],
            reported_by: vec!["worker-1".into()],
        }],
    };
    let json = keyplan::fleet::render::json(&status).unwrap();
    same_as_fixture("fleet-status-json/v1/status-1.2.json", &json);
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["format_version"], "1.2");
    assert_eq!(doc["nodes"][0]["report"]["node"], "worker-1");
    assert_eq!(doc["nodes"][1]["state"], "newer");
    let metrics = keyplan::fleet::render::prometheus(&status).unwrap();
    same_as_fixture(
        "fleet-status-metrics/v1/metrics.prom",
        &without_help(&metrics),
    );
    assert!(
        metrics.contains("keyplan_fleet_nodes{state=\"newer\"} 1"),
        "{metrics}"
    );
}

#[test]
fn fleet_plan_json_is_written_byte_for_byte() {
    use keyplan::fleet::report::Stored;
    let plan = keyplan::spec::load_text(
        "version: 1\nstate_dir: /var/lib/keyplan\nkms:\n  vault: { provider: file, path: /keys }\nkeys:\n  data: { kms: vault }\ndevices:\n  disk-a: { path: /dev/disk/by-id/disk-a, keys: [data], node: worker-1 }\n  disk-c: { path: /dev/disk/by-id/disk-c, keys: [data], node: worker-2 }\n",
        Path::new("/fleet/keyplan.yaml"),
    )
    .unwrap();
    let v1 = std::fs::read_to_string(fixture("node-report/v1/report.json")).unwrap();
    let v2 = std::fs::read_to_string(fixture("node-report/v2/report.json")).unwrap();
    let reports = vec![
        Stored {
            report: Some(node_report::parse("r", &v1).unwrap()),
            newer: None,
            name: "keyplan-node-worker-1".into(),
            cleared: None,
            object: Default::default(),
        },
        Stored {
            report: None,
            newer: match node_report::parse("node report ConfigMap keyplan-node-worker-2", &v2) {
                Err(node_report::ReadError::Newer(n)) => Some(n),
                other => panic!("{other:?}"),
            },
            name: "keyplan-node-worker-2".into(),
            cleared: None,
            object: Default::default(),
        },
    ];
    let fp = keyplan::fleet::plan::compute(&plan, &reports, 1_700_200_020, None);
    // The refusal names this keyplan's version: the fixture says `X.Y.Z`.
    let json = keyplan::fleet::render::plan_json(&fp, "keyplan")
        .unwrap()
        .replace(&format!("({})", env!("CARGO_PKG_VERSION")), "(X.Y.Z)");
    same_as_fixture("fleet-plan-json/v1/plan-1.0.json", &json);
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(doc["nodes"][0]["node"], "worker-1");
    assert_eq!(doc["nodes"][0]["observed"], true);
    assert_eq!(doc["nodes"][1]["observed"], false);
    let missing = doc["nodes"][1]["missing"].as_str().unwrap();
    assert!(missing.contains("written by a newer keyplan"), "{missing}");
}

#[test]
fn pause_configmap_v1_is_read_and_written_byte_for_byte() {
    use keyplan::fleet::pause::{configmap, Pause};
    let written = serde_json::to_string_pretty(&configmap("change freeze", "alice", 1_700_000_000))
        .unwrap()
        + "\n";
    same_as_fixture("fleet-pause/v1/configmap.json", &written);
    let text = std::fs::read_to_string(fixture("fleet-pause/v1/configmap.json")).unwrap();
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_str(&text).unwrap();
    assert_eq!(
        Pause::of(&cm),
        Some(Pause {
            reason: "change freeze".into(),
            by: "alice".into(),
            since: 1_700_000_000,
        })
    );
}
