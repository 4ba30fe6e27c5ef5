//! The KMS provider contract (docs/rotation.md, `keyplan::kms::Kms` docs), as one function every
//! provider's test calls against a real (or, for Kubernetes, faithfully faked) server. It uses
//! the key names `<prefix>-a` and `<prefix>-b`, which must not exist yet.

use keyplan::kms::{Kms, KmsError, VersionState};
use keyplan::secret::Passphrase;

fn pass(s: &str) -> Passphrase {
    Passphrase::new(s.as_bytes().to_vec())
}

fn conflict<T: std::fmt::Debug>(r: Result<T, KmsError>, what: &str) {
    match r {
        Err(KmsError::Conflict { .. }) => {}
        other => panic!("{what}: expected a Conflict, got {other:?}"),
    }
}

/// Runs the whole contract on `kms`; `other` is a second handle to the same store (another
/// process's view), used to check compare-and-swap against a concurrent writer.
pub fn run(kms: &dyn Kms, other: &dyn Kms, prefix: &str) {
    let a = format!("{prefix}-a");
    let b = format!("{prefix}-b");
    kms.check(std::slice::from_ref(&a)).expect("check");

    // An unknown key reads as empty.
    let st = kms.read(&a).expect("read empty");
    assert_eq!((st.current, st.pending), (None, None));
    assert!(st.versions.is_empty(), "{st:?}");

    // Create: stage v1, then commit it.
    let v1 = kms
        .stage(&a, &pass("first-passphrase-AAAA"), 1)
        .expect("stage v1");
    assert_eq!(v1, 1);
    let st = kms.read(&a).expect("read pending");
    assert_eq!((st.current, st.pending), (None, Some(1)));
    assert_eq!(st.versions[&1].state, VersionState::Pending);
    assert!(st.versions[&1].created_at > 1_600_000_000);
    assert_eq!(
        kms.get(&a, 1).expect("get pending").expose(),
        b"first-passphrase-AAAA"
    );
    // A second stage while one is pending is a conflict (the engine reuses the pending one).
    conflict(kms.stage(&a, &pass("x"), 1), "stage while pending");
    // Commit with a wrong expectation is a conflict and changes nothing.
    conflict(
        kms.commit(&a, Some(7), 1),
        "commit with wrong expected_current",
    );
    assert_eq!(kms.read(&a).unwrap().pending, Some(1));
    kms.commit(&a, None, 1).expect("commit v1");
    // Committing again (a lost reply) is a no-op.
    kms.commit(&a, None, 1).expect("repeated commit");
    let st = other.read(&a).expect("read after commit");
    assert_eq!((st.current, st.pending), (Some(1), None));
    assert_eq!(st.versions[&1].state, VersionState::Current);

    // Rotate: v2 pending while v1 stays current for every reader.
    let v2 = kms
        .stage(&a, &pass("second-passphrase-BBBB"), 0)
        .expect("stage v2");
    assert_eq!(v2, 2);
    let st = other.read(&a).unwrap();
    assert_eq!((st.current, st.pending), (Some(1), Some(2)));
    assert_eq!(other.get(&a, 1).unwrap().expose(), b"first-passphrase-AAAA");
    // A concurrent writer's handle committing with a stale expectation is refused.
    conflict(
        other.commit(&a, Some(2), 2),
        "commit expecting the pending as current",
    );
    kms.commit(&a, Some(1), 2).expect("commit v2");
    conflict(
        other.commit(&a, Some(1), 3),
        "commit of a version never staged",
    );
    let st = kms.read(&a).unwrap();
    assert_eq!((st.current, st.pending), (Some(2), None));
    assert_eq!(st.versions[&1].state, VersionState::Previous);
    assert_eq!(st.versions[&2].state, VersionState::Current);
    assert_eq!(st.current_info().unwrap().version, 2);
    assert_eq!(kms.get(&a, 1).unwrap().expose(), b"first-passphrase-AAAA");
    assert_eq!(kms.get(&a, 2).unwrap().expose(), b"second-passphrase-BBBB");

    // Retention: retire v1; its material is gone, idempotently. The current cannot be retired.
    kms.retire(&a, 1).expect("retire v1");
    kms.retire(&a, 1).expect("retire v1 again");
    let st = kms.read(&a).unwrap();
    assert_eq!(st.versions[&1].state, VersionState::Retired);
    assert!(matches!(
        kms.get(&a, 1),
        Err(KmsError::NoSuchVersion { .. })
    ));
    assert!(
        kms.retire(&a, 2).is_err(),
        "retiring the current version must fail"
    );
    assert_eq!(kms.get(&a, 2).unwrap().expose(), b"second-passphrase-BBBB");

    // at_least: a number a stale device record names is never reused.
    let v10 = kms
        .stage(&a, &pass("tenth-passphrase-CCCC"), 10)
        .expect("stage at_least 10");
    assert_eq!(v10, 10);
    kms.commit(&a, Some(2), 10).expect("commit v10");
    assert_eq!(kms.read(&a).unwrap().current, Some(10));

    // Keys are independent; arbitrary printable material of any length round-trips.
    let long = "p".repeat(300) + "=+/ \t~";
    kms.stage(&b, &pass(&long), 1).unwrap();
    kms.commit(&b, None, 1).unwrap();
    assert_eq!(kms.get(&b, 1).unwrap().expose(), long.as_bytes());
    assert_eq!(kms.read(&a).unwrap().current, Some(10));

    // Migration away: destroy the whole key, compare-and-swap on the current version.
    conflict(kms.destroy_key(&a, 2), "destroy_key with a stale current");
    kms.destroy_key(&a, 10).expect("destroy_key");
    kms.destroy_key(&a, 10).expect("destroy_key again");
    let st = other.read(&a).unwrap();
    assert_eq!((st.current, st.pending), (None, None), "{st:?}");
    assert!(
        st.versions
            .values()
            .all(|v| v.state == VersionState::Retired),
        "{st:?}"
    );
    assert!(matches!(
        kms.get(&a, 10),
        Err(KmsError::NoSuchVersion { .. })
    ));
    // ... and back again later: numbering continues above what records may name.
    let v = kms
        .stage(&a, &pass("back-again-DDDD"), 11)
        .expect("stage after destroy");
    assert!(v >= 11, "{v}");
    kms.commit(&a, None, v).expect("commit after destroy");
    assert_eq!(kms.get(&a, v).unwrap().expose(), b"back-again-DDDD");
    // The other key was untouched.
    assert_eq!(kms.get(&b, 1).unwrap().expose(), long.as_bytes());

    holders(kms, other, &b, &long);
}

/// Holder records (invariant I7): key `b` (current v1 with material `material`) is held by
/// two plans; a commit from one is refused while the other holds it, and allowed once it
/// released it. Recording a holder changes neither the versions nor the material.
fn holders(kms: &dyn Kms, other: &dyn Kms, b: &str, material: &str) {
    const A: &str = "host-a:/var/lib/keyplan";
    const B: &str = "host-b:/srv/keyplan/.keyplan";
    assert!(kms.read(b).unwrap().holders.is_empty());
    // A key without a current version cannot be held; releasing it is a no-op.
    conflict(
        kms.hold(&format!("{b}-never-created"), A),
        "hold of a missing key",
    );
    kms.release(&format!("{b}-never-created"), A)
        .expect("release of a missing key");

    kms.hold(b, A).expect("hold A");
    let since = kms.read(b).unwrap().holders[A];
    assert!(since > 1_600_000_000, "{since}");
    kms.hold(b, A).expect("hold A again (idempotent)");
    other.hold(b, B).expect("hold B from another handle");
    let st = kms.read(b).unwrap();
    assert_eq!(
        st.holders.keys().map(String::as_str).collect::<Vec<_>>(),
        [A, B]
    );
    assert_eq!(st.holders[A], since, "an existing record keeps its time");
    assert_eq!((st.current, st.pending), (Some(1), None));
    assert_eq!(kms.get(b, 1).unwrap().expose(), material.as_bytes());

    // A rotation from A while B holds the key: the commit is refused, v2 stays pending and
    // v1 current (B's devices, which hold v1 only, still open with the current version).
    let v2 = kms
        .stage(b, &pass("held-rotation-EEEE"), 0)
        .expect("stage v2");
    match kms.commit_as(b, Some(1), v2, Some(A)) {
        Err(KmsError::Conflict { detail, .. }) => {
            assert!(
                detail.contains(B),
                "the refusal names the other holder: {detail}"
            )
        }
        other => panic!("commit while another plan holds the key: {other:?}"),
    }
    let st = other.read(b).unwrap();
    assert_eq!((st.current, st.pending), (Some(1), Some(v2)), "{st:?}");
    // B's own commit is refused too (A holds it); a commit without a holder check is not.
    conflict(
        other.commit_as(b, Some(1), v2, Some(B)),
        "commit from B while A holds",
    );

    // The two-phase commit: B's vote for another version counts for nothing; its vote for
    // v2 (B's devices hold v2 and opened with it) lets A's commit through... after B withdraws
    // it again, it no longer does.
    other
        .hold(b, &keyplan::kms::book::vote_id(B, v2 + 1))
        .expect("vote of B for another version");
    conflict(
        kms.commit_as(b, Some(1), v2, Some(A)),
        "commit while B voted for another version",
    );
    other
        .hold(b, &keyplan::kms::book::vote_id(B, v2))
        .expect("vote of B for v2");
    other
        .release(b, &keyplan::kms::book::vote_id(B, v2))
        .expect("B withdraws its vote");
    conflict(
        kms.commit_as(b, Some(1), v2, Some(A)),
        "commit after B withdrew its vote",
    );
    other
        .hold(b, &keyplan::kms::book::vote_id(B, v2))
        .expect("vote of B for v2 again");
    kms.commit_as(b, Some(1), v2, Some(A))
        .expect("commit once every other holder voted for v2");
    let st = other.read(b).unwrap();
    assert_eq!((st.current, st.pending), (Some(v2), None), "{st:?}");
    for v in [v2, v2 + 1] {
        other
            .release(b, &keyplan::kms::book::vote_id(B, v))
            .expect("stale vote withdrawn");
    }
    // Commit again (a lost reply) is a no-op, also with the votes gone.
    kms.commit_as(b, Some(1), v2, Some(A))
        .expect("repeated commit after the votes");

    // B drops the key: A's commit goes through, and a repeated one is a no-op.
    other.release(b, B).expect("release B");
    other.release(b, B).expect("release B again (idempotent)");
    kms.commit_as(b, Some(1), v2, Some(A))
        .expect("commit from the only holder");
    kms.commit_as(b, Some(1), v2, Some(A))
        .expect("repeated commit");
    let st = other.read(b).unwrap();
    assert_eq!(st.current, Some(v2));
    assert_eq!(
        st.holders.keys().map(String::as_str).collect::<Vec<_>>(),
        [A],
        "holders survive a commit"
    );
    assert_eq!(kms.get(b, v2).unwrap().expose(), b"held-rotation-EEEE");
    assert_eq!(kms.get(b, 1).unwrap().expose(), material.as_bytes());
    kms.release(b, A).expect("release A");
    assert!(kms.read(b).unwrap().holders.is_empty());
}
