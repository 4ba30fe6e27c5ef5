//! Where the `kmip` provider keeps a key (the layout of `mod.rs`'s module documentation): the
//! Name, Object Group and Application Specific Information of each version's object and of
//! the holder records, how they read back into versions, and how KMIP states map to keyplan's.

use std::collections::BTreeMap;

use kmip_protocol::types::common::{AttributeValue, State};
use kmip_protocol::types::request::Attribute;
use kmip_protocol::types::response::ResultReason;

use super::session::{KmipKms, Session};
use super::ttlv::Fail;
use crate::kms::{KeyState, Kms, KmsError, VersionInfo, VersionState};

// The names, groups and Application Specific Information of keyplan's objects, and their
// version: src/format/kms/kmip.rs. A holder record is one small Symmetric Key object per
// holder ([`Kms::hold`]), Name `"<key>/holder/<holder id>"`, never Activated, destroyed by
// [`Kms::release`]; its material is the holder id's bytes (KMIP has no object without
// material that PyKMIP registers; nothing secret).
use crate::format::kms::kmip::AppInfo;
pub(super) use crate::format::kms::kmip::{
    GROUP_PREFIX, HOLDER_GROUP_PREFIX, NAMESPACE as APP_NAMESPACE,
};

impl KmipKms {
    /// Every object of Object Group `group_name` with its attributes (Locate, then Get
    /// Attributes of each; an object destroyed in between is skipped). `what` names them for
    /// messages.
    fn group_objects(
        &self,
        s: &mut Session<'_>,
        group_name: String,
        what: &str,
    ) -> Result<Vec<(String, Vec<kmip_protocol::types::response::Attribute>)>, KmsError> {
        let uids = s
            .locate(vec![Attribute::ObjectGroup(group_name)])
            .map_err(|f| self.fail(&format!("locating {what}"), f))?;
        let mut out = Vec::with_capacity(uids.len());
        for uid in uids {
            match s.attributes(&uid) {
                Ok(a) => out.push((uid, a)),
                // Destroyed between Locate and Get Attributes.
                Err(Fail::Server {
                    reason: Some(ResultReason::ItemNotFound),
                    ..
                }) => continue,
                Err(f) => {
                    return Err(self.fail(&format!("reading the attributes of object {uid}"), f))
                }
            }
        }
        Ok(out)
    }

    /// The Application Specific Information `data` of object `uid` of key `key`, its version
    /// checked (src/format/kms/kmip.rs).
    ///
    /// Errors: [`KmsError::NewerFormat`] for data of a newer version (the caller writes
    /// nothing); [`KmsError::Corrupt`] for a version that is not a number.
    fn app_info(&self, key: &str, uid: &str, data: &str) -> Result<AppInfo, KmsError> {
        let document = KmsError::document(self, key, &format!("object {uid}"));
        AppInfo::parse(data, &document).map_err(|e| {
            KmsError::of_read(self, key, e, |why| format!(
                "object {uid}: Application Specific Information {data:?}: {why}; nothing was changed"
            ))
        })
    }

    /// Every object of key `key` that the server lists (Locate by Object Group, then Get
    /// Attributes of each).
    pub(super) fn objects(&self, s: &mut Session<'_>, key: &str) -> Result<Vec<Obj>, KmsError> {
        let found = self.group_objects(s, group(key), &format!("the versions of {key:?}"))?;
        let mut out: Vec<Obj> = Vec::with_capacity(found.len());
        for (uid, attrs) in found {
            let mut version = None;
            let mut state = None;
            let mut created_at = 0;
            let mut history = Vec::new();
            for a in attrs {
                match a.value {
                    AttributeValue::Name(n, _) if a.name == *"Name" => {
                        if let Some(v) = parse_name(key, &n.0) {
                            version = Some(v);
                        }
                    }
                    AttributeValue::State(st) => state = Some(st),
                    AttributeValue::ApplicationSpecificInformation(ns, data)
                        if ns.0 == APP_NAMESPACE =>
                    {
                        let info = self.app_info(key, &uid, &data.0)?;
                        created_at = info.created_at;
                        history = info.history;
                    }
                    _ => {}
                }
            }
            let (Some(version), Some(state)) = (version, state) else {
                tracing::warn!(
                    kms = %self.describe(),
                    key,
                    object = %uid,
                    "object in keyplan's object group has no \"{key}/v<N>\" name or no state; ignored"
                );
                continue;
            };
            if let Some(twin) = out.iter().find(|o| o.version == version) {
                return Err(KmsError::corrupt(
                    self,
                    key,
                    format!(
                        "objects {} and {uid} both hold version {version} (name \"{key}/v{version}\"); nothing was changed. Destroy the one no device was enrolled with, using the KMIP server's own tools",
                        twin.uid
                    ),
                ));
            }
            out.push(Obj {
                uid,
                version,
                state,
                created_at,
                history,
            });
        }
        Ok(out)
    }

    /// The objects of key `key` ([`KmipKms::objects`]) and the key's state: versions as
    /// [`key_state`] reads them, with the holders recorded ([`KmipKms::holder_objects`]).
    pub(super) fn read_on(
        &self,
        s: &mut Session<'_>,
        key: &str,
    ) -> Result<(Vec<Obj>, KeyState), KmsError> {
        let objs = self.objects(s, key)?;
        let mut st = key_state(&objs);
        st.holders = self
            .holder_objects(s, key)?
            .into_iter()
            .map(|(_, holder, since)| (holder, since))
            .collect();
        Ok((objs, st))
    }

    /// The holder records of `key`: `(object id, holder id, since)` (Locate by the holder
    /// Object Group, then Get Attributes of each).
    pub(super) fn holder_objects(
        &self,
        s: &mut Session<'_>,
        key: &str,
    ) -> Result<Vec<(String, String, u64)>, KmsError> {
        let found = self.group_objects(
            s,
            format!("{HOLDER_GROUP_PREFIX}{key}"),
            &format!("the holders of {key:?}"),
        )?;
        let prefix = format!("{key}/holder/");
        let mut out = Vec::new();
        for (uid, attrs) in found {
            let mut holder = None;
            let mut since = 0;
            for a in attrs {
                match a.value {
                    AttributeValue::Name(n, _) if a.name == *"Name" => {
                        if let Some(h) = n.0.strip_prefix(&prefix) {
                            holder = Some(h.to_string());
                        }
                    }
                    AttributeValue::ApplicationSpecificInformation(ns, data)
                        if ns.0 == APP_NAMESPACE =>
                    {
                        since = self.app_info(key, &uid, &data.0)?.since;
                    }
                    _ => {}
                }
            }
            if let Some(h) = holder {
                out.push((uid, h, since));
            }
        }
        Ok(out)
    }
}

/// One object of a key, as listed by [`KmipKms::objects`].
pub(super) struct Obj {
    pub(super) uid: String,
    pub(super) version: u64,
    pub(super) state: State,
    pub(super) created_at: u64,
    pub(super) history: Vec<(u64, u64)>,
}

/// keyplan's view of a KMIP object state.
pub(super) fn state_of(s: State) -> VersionState {
    match s {
        State::PreActive => VersionState::Pending,
        State::Active => VersionState::Current,
        State::Deactivated | State::Compromised => VersionState::Previous,
        State::Destroyed | State::DestroyedCompromised => VersionState::Retired,
        // A state newer than KMIP 1.x: not usable as current, material possibly held.
        _ => VersionState::Previous,
    }
}

/// The key's versions: objects as their states say (the highest Active one is current, lower
/// Active ones previous; the highest Pre-Active one is pending), and versions known only from
/// `history` as retired.
pub(super) fn key_state(objs: &[Obj]) -> KeyState {
    let mut versions = BTreeMap::new();
    for o in objs {
        for &(version, created_at) in &o.history {
            versions.insert(
                version,
                VersionInfo {
                    version,
                    created_at,
                    state: VersionState::Retired,
                },
            );
        }
    }
    let highest = |want: State| {
        objs.iter()
            .filter(|o| o.state == want)
            .map(|o| o.version)
            .max()
    };
    let current = highest(State::Active);
    let pending = highest(State::PreActive);
    for o in objs {
        let state = match state_of(o.state) {
            VersionState::Current if Some(o.version) != current => VersionState::Previous,
            s => s,
        };
        versions.insert(
            o.version,
            VersionInfo {
                version: o.version,
                created_at: o.created_at,
                state,
            },
        );
    }
    KeyState {
        current,
        pending,
        versions,
        holders: BTreeMap::new(),
    }
}

/// The Object Group of key `key`.
pub(super) fn group(key: &str) -> String {
    format!("{GROUP_PREFIX}{key}")
}

/// The version number in the Name `"<key>/v<N>"`.
pub(super) fn parse_name(key: &str, name: &str) -> Option<u64> {
    let n = name.strip_prefix(key)?.strip_prefix("/v")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok().filter(|&v| v > 0)
}
