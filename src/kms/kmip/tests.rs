//! Unit tests of the `kmip` provider that need no server: the Register mirror's encoding,
//! names, history and endpoints, and the state mapping.

use super::layout::{key_state, parse_name};
use super::session::split_endpoint;
use super::ttlv::wire;
use super::*;
use crate::format::kms::kmip::parse_history;
use kmip_protocol::types::common::{CryptographicAlgorithm, CryptographicLength, ObjectType};
use kmip_protocol::types::common::{KeyFormatType, KeyMaterial};
use kmip_protocol::types::request as rq;
use kmip_protocol::types::request::TemplateAttribute;
use kmip_protocol::types::request::{
    BatchCount, BatchItem, RequestHeader, RequestMessage, RequestPayload,
};

#[test]
fn register_mirror_encodes_like_kmip_protocol() {
    let attrs = || {
        vec![
            Attribute::Name("k/v3".into()),
            Attribute::ObjectGroup(group("k")),
        ]
    };
    let material = b"passphrase bytes".to_vec();
    let theirs = RequestMessage(
        RequestHeader(
            rq::ProtocolVersion(rq::ProtocolVersionMajor(1), rq::ProtocolVersionMinor(0)),
            None,
            None,
            BatchCount(1),
        ),
        vec![BatchItem(
            Operation::Register,
            None,
            RequestPayload::Register(
                ObjectType::SymmetricKey,
                TemplateAttribute::unnamed(attrs()),
                Some(rq::ManagedObject::SymmetricKey(rq::SymmetricKey(
                    rq::KeyBlock(
                        KeyFormatType::Raw,
                        None,
                        Some(rq::KeyValue(KeyMaterial::Bytes(material.clone()), None)),
                        Some(CryptographicAlgorithm::AES),
                        Some(CryptographicLength(128)),
                        None,
                    ),
                ))),
            ),
        )],
    );
    let ours = wire::register(attrs(), &material, CryptographicAlgorithm::AES, 128);
    assert_eq!(
        kmip_ttlv::to_vec(&ours).unwrap(),
        kmip_ttlv::to_vec(&theirs).unwrap()
    );
    // HMAC-SHA256 differs only in the algorithm's enumeration value.
    let a = kmip_ttlv::to_vec(&ours).unwrap();
    let b = kmip_ttlv::to_vec(&wire::register(
        attrs(),
        &material,
        wire::Algorithm::HmacSha256,
        128,
    ))
    .unwrap();
    let diff: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
    assert_eq!(a.len(), b.len());
    assert_eq!(diff.len(), 1);
    assert_eq!((a[diff[0]], b[diff[0]]), (3, 9));
}

#[test]
fn names_history_endpoints() {
    assert_eq!(parse_name("k", "k/v12"), Some(12));
    assert_eq!(parse_name("k", "k/v0"), None);
    assert_eq!(parse_name("k", "kk/v1"), None);
    assert_eq!(parse_name("a/b", "a/b/v2"), Some(2));
    assert_eq!(parse_name("k", "k/v+1"), None);
    assert_eq!(
        parse_history("1@1790000000, 2@1795000000,x@1,3"),
        vec![(1, 1_790_000_000), (2, 1_795_000_000)]
    );
    assert_eq!(parse_history(""), vec![]);
    assert_eq!(
        split_endpoint("127.0.0.1:5696"),
        Some(("127.0.0.1".into(), 5696))
    );
    assert_eq!(split_endpoint("[::1]:5696"), Some(("::1".into(), 5696)));
    assert_eq!(split_endpoint("::1:5696"), None);
    assert_eq!(split_endpoint("host"), None);
    assert_eq!(split_endpoint("host:0"), None);
    assert_eq!(split_endpoint(":5696"), None);
}

#[test]
fn states_map_to_versions() {
    let obj = |version, state| Obj {
        uid: format!("u{version}"),
        version,
        state,
        created_at: 1_800_000_000 + version,
        history: vec![(1, 1_700_000_000)],
    };
    let st = key_state(&[
        obj(2, State::Active),
        obj(3, State::Active),
        obj(4, State::PreActive),
    ]);
    assert_eq!((st.current, st.pending), (Some(3), Some(4)));
    assert_eq!(st.versions[&1].state, VersionState::Retired);
    assert_eq!(st.versions[&1].created_at, 1_700_000_000);
    assert_eq!(st.versions[&2].state, VersionState::Previous);
    assert_eq!(st.versions[&3].state, VersionState::Current);
    assert_eq!(st.versions[&4].state, VersionState::Pending);
    assert_eq!(key_state(&[]), KeyState::default());
}
