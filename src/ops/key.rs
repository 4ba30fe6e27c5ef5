//! `key get`: the break-glass read of a key version's passphrase from its KMS; `key holders`
//! and `key release`: the plans recorded as holding a key (invariant I7), and removing the
//! record of a plan that is gone for good.

use super::Engine;
use crate::error::Error;
use crate::kms::VersionState;
use crate::secret::Passphrase;

/// Checks that the plan has a key `key`, before anything is opened.
///
/// Errors: [`Error::Request`] naming the plan file.
pub fn check_key(plan: &crate::spec::Plan, key: &str) -> Result<(), Error> {
    if plan.keys.contains_key(key) {
        return Ok(());
    }
    if let Some(scope) = plan
        .scope
        .as_ref()
        .filter(|s| s.keys_left_out.iter().any(|k| k == key))
    {
        return Err(Error::request(
            format!(
                "key {key:?} of {} is not node {}'s: no device of this node lists it; run `keyplan key get` on (or with `--node`) the node whose devices list it",
                plan.source_path.display(),
                scope.node
            ),
            None,
        ));
    }
    Err(Error::request(
        format!("no key {key:?} in {}", plan.source_path.display()),
        None,
    ))
}

/// The version `key get` means: `version`, or the key's current version in its KMS. Starts
/// the command's KMS budget ([`crate::world::World::bound_kms_waits`]).
///
/// Errors: [`Error::Request`] when the plan has no such key, or the key has no current
/// version yet; [`Error::Kms`].
pub fn resolve_version(engine: &Engine, key: &str, version: Option<u64>) -> Result<u64, Error> {
    // `key get` starts here: a read-only command, bounded as `status` is.
    engine.world().bound_kms_waits();
    let (spec, kms) = key_and_kms(engine, key)?;
    match version {
        Some(v) => Ok(v),
        None => kms.read(&spec.name)?.current.ok_or_else(|| {
            Error::request(
                format!(
                    "{}: key {key} has no current version yet; run `keyplan apply`",
                    kms.describe()
                ),
                None,
            )
        }),
    }
}

/// The passphrase of `version` of `key` (zeroized when dropped).
///
/// Errors: [`Error::Request`] when the version was retired (its material destroyed);
/// [`Error::Kms`] (no such version, KMS unreachable, ...).
pub fn material(engine: &Engine, key: &str, version: u64) -> Result<Passphrase, Error> {
    let (spec, kms) = key_and_kms(engine, key)?;
    let state = kms.read(&spec.name)?;
    if let Some(info) = state.versions.get(&version) {
        if info.state == VersionState::Retired {
            return Err(Error::request(
                format!(
                    "{}: {key} v{version} was retired: its material was destroyed after a rotation, as no device held it any more",
                    kms.describe()
                ),
                None,
            ));
        }
    }
    Ok(kms.get(&spec.name, version)?)
}

/// The plans recorded in the KMS as holding `key` ([`crate::kms::Kms::hold`]): holder id ->
/// since (Unix seconds), and this plan's own id ([`crate::spec::Plan::holder`]).
///
/// Errors: [`Error::Request`] when the plan has no such key; [`Error::Kms`].
pub fn holders(
    engine: &Engine,
    key: &str,
) -> Result<(std::collections::BTreeMap<String, u64>, String), Error> {
    let (spec, kms) = key_and_kms(engine, key)?;
    Ok((kms.read(&spec.name)?.holders, engine.plan().holder()))
}

/// Removes `holder`'s record from `key` in its KMS: for a plan whose host is gone for good,
/// whose record would otherwise refuse every rotation of the key, or this plan's own record
/// under the id it had before its state directory moved (on this node: recognised as in
/// `observe::holders`, or its state directory is gone from this host). Touches no device and
/// no journal. Returns why the record was taken for this plan's own former one, if it was.
///
/// Errors: [`Error::Request`] when the plan has no such key or no such holder is recorded
/// (a typo must not look like success); [`Error::Kms`].
pub fn release_holder(engine: &Engine, key: &str, holder: &str) -> Result<Option<String>, Error> {
    let (spec, kms) = key_and_kms(engine, key)?;
    let st = kms.read(&spec.name)?;
    if !st.holders.contains_key(holder) {
        let known: Vec<&str> = st.holders.keys().map(String::as_str).collect();
        return Err(Error::request(
            format!(
                "{}: key {key} has no holder {holder:?} (recorded: {}); nothing was changed",
                kms.describe(),
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ),
            None,
        ));
    }
    // A node the plan file still lists with the key: its devices are meant to hold the key,
    // so its record must stay (a shared key's commit waits for its vote).
    let node = holder.split_once(':').map(|(n, _)| n).unwrap_or(holder);
    let plan = engine.plan();
    let listed = plan.peers.get(key).is_some_and(|p| p.contains(node))
        || (plan.node.as_deref() == Some(node)
            && plan
                .devices
                .values()
                .any(|d| d.keys.iter().any(|k| k.key == key)));
    if listed && crate::kms::book::parse_vote(holder).is_none() && holder != plan.holder() {
        // The same node under another state directory: this plan's own former record (its
        // state directory moved), or one whose state directory is gone from this host.
        if let Some(why) = own_former_record(engine, holder) {
            release_with_votes(kms, &spec.name, holder, &st)?;
            return Ok(Some(why));
        }
    }
    // This plan's own id, on a record none of its devices backs: a state directory that was
    // here before wrote it (observe::unbacked_own).
    if holder == plan.holder()
        && crate::observe::own_record_unbacked(plan, engine.world(), key, &st)
    {
        release_with_votes(kms, &spec.name, holder, &st)?;
        return Ok(Some(format!(
            "it is under this state directory's id, but none of this plan's devices that list key {key} holds a keyslot of it: a state directory that was at {} before wrote it (make sure the plan that did holds its devices under its new id)",
            plan.state_dir.display()
        )));
    }
    if listed && crate::kms::book::parse_vote(holder).is_none() {
        return Err(Error::request(
            format!(
                "{}: holder {holder:?} is node {node}, whose devices the plan file {} still lists with key {key}; nothing was changed. Releasing it would let the key be rotated without that node, locking its devices out. If the node is gone for good, take its devices out of the plan file first, then release its record",
                kms.describe(),
                plan.source_path.display()
            ),
            None,
        ));
    }
    release_with_votes(kms, &spec.name, holder, &st)?;
    Ok(None)
}

/// Removes `holder`'s record of key `name` and its votes (`st`: the key as read): a vote
/// without a holder means nothing, and must not count if the holder ever comes back with
/// other devices.
fn release_with_votes(
    kms: &dyn crate::kms::Kms,
    name: &str,
    holder: &str,
    st: &crate::kms::KeyState,
) -> Result<(), Error> {
    kms.release(name, holder)?;
    for vote in st
        .holders
        .keys()
        .filter(|h| crate::kms::book::parse_vote(h).is_some_and(|(of, _)| of == holder))
    {
        kms.release(name, vote)?;
    }
    Ok(())
}

/// Why `holder`, a record on this plan's own node under another state directory, may be
/// released from this plan: it is this plan's own former record
/// ([`crate::observe::former_holder`]: the device headers are read for their LUKS UUIDs, no
/// PBKDF), or its state directory no longer exists on this host, so no plan here uses it.
/// `None`: neither is known.
fn own_former_record(engine: &Engine, holder: &str) -> Option<String> {
    let plan = engine.plan();
    let (node, dir) = holder.split_once(':')?;
    if node != plan.holder_node() {
        return None;
    }
    if !std::path::Path::new(dir).exists() {
        return Some(format!(
            "its state directory {dir} no longer exists on this host, so no plan here uses that record (make sure no device outside this plan still needs the key)"
        ));
    }
    let devices: std::collections::BTreeMap<String, crate::observe::DeviceState> = plan
        .devices
        .values()
        .filter_map(|d| {
            let h = engine.world().luks.dump(&d.path).ok()?;
            Some((
                d.id.clone(),
                crate::observe::DeviceState::new(&d.id, d.path.clone(), h, Vec::new()),
            ))
        })
        .collect();
    let owner = crate::world::owner::read(&plan.state_dir).ok().flatten();
    let uuids = crate::observe::plan_uuids(plan, &devices);
    crate::observe::former_holder(plan, owner.as_ref(), &uuids, holder)
}

/// The plan's key `key` and its KMS.
///
/// Errors: [`Error::Request`] when the plan has no such key.
fn key_and_kms<'e>(
    engine: &'e Engine,
    key: &str,
) -> Result<(&'e crate::spec::Key, &'e dyn crate::kms::Kms), Error> {
    let plan = engine.plan();
    check_key(plan, key)?;
    let spec = &plan.keys[key];
    let kms = engine
        .world()
        .kms_for(plan, key)
        .map_err(|e| Error::request(e.to_string(), None))?;
    Ok((spec, kms))
}
