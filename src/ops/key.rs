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

/// Where `key get` reads a key ([`source`]): its KMS and the name there.
pub struct Source<'e> {
    /// The KMS instance holding the key's versions.
    pub kms: &'e dyn crate::kms::Kms,
    /// The key's name in that KMS.
    pub name: String,
    /// Why that is not where the plan puts the key (a move `apply` has not finished), for a
    /// note on stderr; `None` when it is.
    pub note: Option<String>,
}

/// Where the versions of `key` are, which `key get` reads: the KMS entry the plan names, or,
/// while a move the plan asks for is not applied yet, the entry the devices' keyslot records
/// name as long as that KMS still holds a current version of the key (before `apply` copies
/// and destroys it there). Never another entry that merely has the key's name in the plan's
/// KMS: that may be another tool's. Reads the device headers and keyplan's records (no
/// PBKDF) and the origin KMS. Starts the command's KMS budget
/// ([`crate::world::World::bound_kms_waits`]).
///
/// Errors: [`Error::Request`] when the plan has no such key, or the records name a KMS the
/// plan no longer defines or several that hold the key; [`Error::Kms`].
pub fn source<'e>(engine: &'e Engine, key: &str) -> Result<Source<'e>, Error> {
    // `key get` starts here: a read-only command, bounded as `status` is.
    engine.world().bound_kms_waits();
    let (spec, kms) = key_and_kms(engine, key)?;
    let plan = engine.plan();
    let (elsewhere, here) = crate::observe::recorded_elsewhere(plan, engine.world(), key);
    if here && !elsewhere.is_empty() {
        // Some devices' records already name the plan's entry: the move reached them (the
        // copy was verified on them first), so what the plan's KMS holds opens them. Other
        // records naming an old entry are devices the move has not reached yet, or one that
        // rejoined the plan; an old entry may still hold a stale copy, never read here.
        let list: Vec<String> = elsewhere
            .iter()
            .map(|(k, n)| format!("KMS {k:?} (as {n:?})"))
            .collect();
        return Ok(Source {
            kms,
            name: spec.name.clone(),
            note: Some(format!(
                "key {key}: read from KMS {:?} (as {:?}), which the plan names and its devices' records name; some keyslot records still name {}: run `keyplan plan` to see what the next `apply` does about them",
                spec.kms,
                spec.name,
                list.join(", ")
            )),
        });
    }
    let mut holding = Vec::new();
    let mut moved = Vec::new();
    for (kms_name, name) in &elsewhere {
        let Some(from) = engine.world().kms.get(kms_name) else {
            return Err(Error::request(
                format!(
                    "key {key}: its devices' keyslot records say its versions are in KMS {kms_name:?} (as {name:?}), which {} no longer defines, and the move to KMS {:?} is not finished; keyplan will not hand out what KMS {:?} holds as {:?} without knowing it is this key. Restore the definition of KMS {kms_name:?} in the plan file to read the key there",
                    plan.source_path.display(),
                    spec.kms,
                    spec.kms,
                    spec.name
                ),
                None,
            ));
        };
        if from.read(name)?.current.is_some() {
            holding.push((kms_name, name, from.as_ref()));
        } else {
            moved.push(format!("KMS {kms_name:?} (as {name:?})"));
        }
    }
    match holding.as_slice() {
        [] => Ok(Source {
            kms,
            name: spec.name.clone(),
            // An earlier apply copied the key and destroyed it in the old KMS, then stopped:
            // what the new KMS holds is that copy, which the next apply verifies on every
            // device before any record names it.
            note: (!moved.is_empty()).then(|| {
                format!(
                    "key {key}: read from KMS {:?} (as {:?}); some keyslot records still name {}, which no longer holds it: the move is not finished, run `keyplan apply`",
                    spec.kms,
                    spec.name,
                    moved.join(", ")
                )
            }),
        }),
        [(kms_name, name, from)] => Ok(Source {
            kms: *from,
            name: (*name).clone(),
            note: Some(format!(
                "key {key}: read from KMS {kms_name:?} (as {name:?}), where its devices' keyslot records say its versions are; the plan moves it to KMS {:?} (as {:?}), which `keyplan apply` has not done yet",
                spec.kms, spec.name
            )),
        }),
        several => {
            let list: Vec<String> = several
                .iter()
                .map(|(k, n, _)| format!("KMS {k:?} (as {n:?})"))
                .collect();
            Err(Error::request(
                format!(
                    "key {key}: its devices' keyslot records name several KMS entries that hold a current version of it ({}); keyplan cannot tell which one a device needs. Read each with the plan file pointing the key at it (`kms:` and `name:`)",
                    list.join(", ")
                ),
                None,
            ))
        }
    }
}

/// The version `key get` means: `version`, or the key's current version where `src` says its
/// versions are ([`source`]).
///
/// Errors: [`Error::Request`] when the key has no current version yet; [`Error::Kms`].
pub fn resolve_version(src: &Source<'_>, key: &str, version: Option<u64>) -> Result<u64, Error> {
    match version {
        Some(v) => Ok(v),
        None => src.kms.read(&src.name)?.current.ok_or_else(|| {
            Error::request(
                format!(
                    "{}: key {key} has no current version yet; run `keyplan apply`",
                    src.kms.describe()
                ),
                None,
            )
        }),
    }
}

/// The passphrase of `version` of `key` where `src` says its versions are ([`source`]),
/// zeroized when dropped.
///
/// Errors: [`Error::Request`] when the version was retired (its material destroyed, or what
/// its store does instead: [`crate::kms::Kms::retired_means`]);
/// [`Error::Kms`] (no such version, KMS unreachable, ...).
pub fn material(src: &Source<'_>, key: &str, version: u64) -> Result<Passphrase, Error> {
    let kms = src.kms;
    let state = kms.read(&src.name)?;
    if let Some(info) = state.versions.get(&version) {
        if info.state == VersionState::Retired {
            return Err(Error::request(
                format!(
                    "{}: {key} v{version} was retired after a rotation, as no device held it any more: {}; keyplan does not serve a retired version",
                    kms.describe(),
                    kms.retired_means()
                ),
                None,
            ));
        }
    }
    Ok(kms.get(&src.name, version)?)
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
/// (a typo must not look like success), when the holder is another plan on this node whose
/// state directory exists (its devices may hold the key, listed by this plan or not), or a
/// node this plan file lists with the key; [`Error::Kms`].
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
    // Another state directory on this node: this plan's own former record (released), or
    // another plan's that lives here, whose devices may hold the key, whether or not this plan
    // lists it.
    if crate::kms::book::parse_vote(holder).is_none()
        && holder != plan.holder()
        && node == plan.holder_node()
    {
        if let Some(why) = own_former_record(engine, holder) {
            release_with_votes(kms, &spec.name, holder, &st)?;
            return Ok(Some(why));
        }
        return Err(another_plan_here(kms.describe(), key, holder));
    }
    let listed = plan.peers.get(key).is_some_and(|p| p.contains(node))
        || (plan.node.as_deref() == Some(node)
            && plan
                .devices
                .values()
                .any(|d| d.keys.iter().any(|k| k.key == key)));
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

/// The refusal of `key release` for `holder`, the record of another plan on this node whose
/// state directory exists (`kms`: the KMS's description): names that plan (its `owner.json`)
/// and the ways on.
fn another_plan_here(kms: String, key: &str, holder: &str) -> Error {
    let dir = holder.split_once(':').map_or(holder, |(_, d)| d);
    let owner = crate::world::owner::read(std::path::Path::new(dir))
        .ok()
        .flatten();
    let (whose, finish) = match &owner {
        Some(o) => (
            format!(", the state directory of plan file {}", o.plan.display()),
            format!("`keyplan apply -f {}`", o.plan.display()),
        ),
        None => (String::new(), "`keyplan apply` of that plan".to_string()),
    };
    Error::request(
        format!(
            "{kms}: holder {holder:?} is another plan on this host: its state directory {dir} exists{whose}, so its devices may hold key {key}; nothing was changed. Releasing its record would let the key be rotated without those devices, locking them out"
        ),
        Some(format!(
            "if that plan no longer uses key {key}, take the key out of its plan file and run {finish}: that removes its record; if the plan is gone for good, remove its state directory {dir} first, then release the record"
        )),
    )
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

/// What [`import`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The version the passphrase is now (the key's current version).
    pub version: u64,
    /// The devices and keyslots the passphrase was found to open (one per device).
    pub opens: Vec<(String, u32)>,
    /// Whether the version was already pending from an earlier, interrupted import and was only
    /// committed now.
    pub finished_earlier: bool,
}

/// Imports `pass`, a passphrase that opens the plan's devices today, as the first version of
/// `key` in its KMS (before: writing the file KMS's `meta.json` by hand), so the next `apply`
/// adopts the keyslots it opens instead of enrolling a new key through `enroll_with`. Under
/// the state lock. Checked first: the KMS holds no version of the key, and the passphrase opens
/// a bound keyslot of every device that lists the key, or that device has an `enroll_with`
/// passphrase (PBKDF runs: about one per device). Then the
/// KMS stages it and commits it as the current version (compare-and-swap, on behalf of this
/// plan's holder id). Crash-safe by being repeatable: a run killed between the stage and the
/// commit leaves the passphrase pending, and importing the same passphrase again commits it.
///
/// Errors: [`Error::Request`] when the key is not in the plan, the KMS already holds a
/// version (another passphrase pending, or a current one: `apply --rotate` replaces a key),
/// the passphrase is empty, or a device that lists the key is unreadable or does not open with
/// it and has no `enroll_with` (nothing imported);
/// [`Error::Journal`] when a run holds the state lock; [`Error::Kms`] from the KMS.
pub fn import(engine: &Engine, key: &str, pass: &Passphrase) -> Result<Imported, Error> {
    let (spec, kms) = key_and_kms(engine, key)?;
    let plan = engine.plan();
    let _lock = crate::journal::StateLock::acquire(&plan.state_dir)?;
    if pass.is_empty() {
        return Err(Error::request(
            format!("the passphrase for key {key} is empty; nothing was imported"),
            Some("pipe the passphrase's exact bytes on stdin".into()),
        ));
    }
    let st = kms.read(&spec.name)?;
    let pending_is_this = match (st.current, st.pending) {
        (None, None) if st.versions.is_empty() => None,
        (None, Some(p)) => {
            let there = kms.get(&spec.name, p)?;
            if there.expose() != pass.expose() {
                return Err(Error::request(
                    format!(
                        "{} holds a pending v{p} of key {key} that is another passphrase: another import or plan is creating the key; nothing was imported",
                        kms.describe()
                    ),
                    Some("wait for it, or remove the pending version in the KMS by hand if it is a leftover".into()),
                ));
            }
            Some(p)
        }
        (current, _) => {
            return Err(Error::request(
                format!(
                    "{} already holds key {key} ({}): import is for a key the KMS does not hold yet; nothing was imported",
                    kms.describe(),
                    match current {
                        Some(c) => format!("current v{c}"),
                        None => "retired versions".into(),
                    }
                ),
                Some(format!("`keyplan apply --rotate {key}` replaces the key with a new version")),
            ))
        }
    };
    let opens = opening_keyslots(engine, key, pass)?;
    let (version, finished_earlier) = match pending_is_this {
        Some(p) => (p, true),
        None => (kms.stage(&spec.name, pass, 1)?, false),
    };
    kms.commit_as(&spec.name, None, version, Some(&plan.holder()))?;
    Ok(Imported {
        version,
        opens,
        finished_earlier,
    })
}

/// Every device listing `key` (in plan order) and the bound keyslot `pass` opens there.
/// A device it does not open is fine when it has an `enroll_with` passphrase (`apply` enrolls
/// the key through it); otherwise the import would leave a device the plan cannot enroll.
///
/// Errors: [`Error::Request`] when no device lists the key, a device cannot be read, one it
/// does not open has no `enroll_with`, or it opens none of them (naming each).
fn opening_keyslots(
    engine: &Engine,
    key: &str,
    pass: &Passphrase,
) -> Result<Vec<(String, u32)>, Error> {
    let plan = engine.plan();
    let luks = &engine.world().luks;
    let mut opens = Vec::new();
    let mut problems = Vec::new();
    let devices: Vec<_> = plan
        .devices
        .values()
        .filter(|d| d.keys.iter().any(|k| k.key == key))
        .collect();
    if devices.is_empty() {
        return Err(Error::request(
            format!("no device of the plan lists key {key}, so nothing can check the passphrase; nothing was imported"),
            Some(format!("list {key} under a device's `keys` first")),
        ));
    }
    for d in devices {
        let header = match luks.dump(&d.path) {
            Ok(h) => h,
            Err(e) => {
                problems.push(format!("{} cannot be read ({e})", d.id));
                continue;
            }
        };
        let found = match luks.test_any_keyslot(&d.path, pass)? {
            crate::luks::AnyKeyslot::Keyslot(n)
                if header.keyslots.get(&n).is_some_and(|k| k.bound) =>
            {
                Some(n)
            }
            crate::luks::AnyKeyslot::Fails | crate::luks::AnyKeyslot::Keyslot(_) => None,
            crate::luks::AnyKeyslot::Unknown => {
                let mut hit = None;
                for (n, _) in header.keyslots.iter().filter(|(_, k)| k.bound) {
                    if luks.test_passphrase(&d.path, *n, pass)? {
                        hit = Some(*n);
                        break;
                    }
                }
                hit
            }
        };
        match found {
            Some(n) => opens.push((d.id.clone(), n)),
            None if d.enroll_with.is_some() => {}
            None => problems.push(format!(
                "it opens no bound keyslot of {} (which has no enroll_with)",
                d.id
            )),
        }
    }
    if opens.is_empty() || !problems.is_empty() {
        let mut why = problems;
        if opens.is_empty() {
            why.push("it opens no device that lists the key".into());
        }
        return Err(Error::request(
            format!(
                "key {key} not imported: {}; nothing was imported",
                why.join("; ")
            ),
            Some("every device that lists the key must open with the passphrase (or have an enroll_with passphrase to enroll it); check that stdin holds the passphrase's exact bytes (no added newline)".into()),
        ));
    }
    Ok(opens)
}
