//! Unit tests of the `vault` provider that need no server: settings, names, the history
//! field's format.

use super::client::squash;
use super::layout::parse_history;
use super::*;
use crate::spec::KmsConfig;

fn cfg(address: &str, mount: Option<&str>) -> KmsConfig {
    KmsConfig::Vault {
        address: address.to_string(),
        mount: mount.map(str::to_string),
        token_env: None,
        auth: None,
        namespace: None,
        ca_cert: None,
        timeout: None,
    }
}

#[test]
fn describe_names_instance_address_and_mount() {
    let k =
        VaultKms::new("v", &cfg("http://127.0.0.1:8200", None), "t", "VAULT_TOKEN").expect("open");
    assert_eq!(
        k.describe(),
        "vault KMS \"v\" (http://127.0.0.1:8200, mount secret)"
    );
    assert!(!format!("{k:?}").contains("\"t\""));
}

#[test]
fn bad_settings_are_config_errors() {
    for (addr, mount) in [
        ("not a url", None),
        ("ftp://x:1", None),
        ("http://127.0.0.1:8200", Some("/")),
        ("http://127.0.0.1:8200", Some("a/../b")),
    ] {
        match VaultKms::new("v", &cfg(addr, mount), "t", "VAULT_TOKEN") {
            Err(KmsError::Config { detail, .. }) => assert!(!detail.is_empty()),
            other => panic!("{addr} {mount:?}: {other:?}"),
        }
    }
}

#[test]
fn missing_token_variable_is_named() {
    let c = KmsConfig::Vault {
        address: "http://127.0.0.1:8200".into(),
        mount: None,
        token_env: Some("KEYPLAN_UNIT_TEST_SURELY_UNSET_TOKEN".into()),
        auth: None,
        namespace: None,
        ca_cert: None,
        timeout: None,
    };
    match open("v", &c) {
        Err(KmsError::Config { detail, .. }) => {
            assert!(
                detail.contains("KEYPLAN_UNIT_TEST_SURELY_UNSET_TOKEN"),
                "{detail}"
            )
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened without a token"),
    }
}

#[test]
fn names_that_collide_are_refused() {
    let k =
        VaultKms::new("v", &cfg("http://127.0.0.1:8200", None), "t", "VAULT_TOKEN").expect("open");
    for bad in [
        "",
        "/a",
        "a/",
        "a//b",
        "a/../b",
        "k.keyplan-pending",
        "x/keyplan_version",
    ] {
        assert!(
            matches!(k.check_name(bad), Err(KmsError::Config { .. })),
            "{bad:?}"
        );
    }
    for good in ["a", "rook/osd-kek", "a.b/c-d_e"] {
        assert!(k.check_name(good).is_ok(), "{good:?}");
    }
}

#[test]
fn history_round_trips_and_times_parse() {
    let h = vec![
        Hist {
            version: 1,
            kv_version: 1,
            created_at: 10,
        },
        Hist {
            version: 3,
            kv_version: 2,
            created_at: 20,
        },
    ];
    let text = history_json(&h);
    assert_eq!(text, "[[1,1,10],[3,2,20]]");
    assert_eq!(parse_history(&Value::String(text)).unwrap(), h);
    assert!(parse_history(&Value::String("[1,2]".into())).is_err());
    assert_eq!(parse_time("1970-01-01T00:01:40.123456789Z"), Some(100));
    assert_eq!(basename("a/b/c"), "c");
    assert_eq!(basename("c"), "c");
    assert_eq!(
        squash("1 error occurred:\n\t* permission denied\n\n"),
        "1 error occurred: * permission denied"
    );
}
