//! Unit tests of the journal (`mod.rs`): unfinished adds, a torn tail's repair, redaction.

use super::*;

fn records(dir: &Path) -> Vec<Record> {
    read(dir).expect("journal reads")
}

/// Adds that started and have no done record in their run are unfinished, whether the run
/// was killed or failed; a `new version` add takes its run's staged version; a finished
/// add, an add of another run that finished, and an add whose run staged nothing are not.
#[test]
fn unfinished_adds_are_the_started_and_never_done() {
    use crate::graph::{Unlock, VersionRef};
    let add = |slot: u32, version: VersionRef| Step::AddKeyslot {
        device: "d1".into(),
        key: "k1".into(),
        version,
        slot,
        unlock: Unlock::EnrollWith,
    };
    let stage = Step::Stage {
        key: "k1".into(),
        at_least: 1,
        planned_current: None,
    };
    let rec = |run: &str, event: Event| Record {
        ts: 0,
        run: run.into(),
        event,
    };
    let start = |steps: Vec<Step>| Event::RunStart {
        steps,
        deps: vec![],
        plan_file: "keyplan.yaml".into(),
        devices: vec![("d1".into(), "/dev/d1".into())],
        pid: 1,
        host: "h".into(),
    };
    let done = |step: usize, staged_version: Option<u64>| Event::StepDone {
        step,
        outcome: "ok".into(),
        staged_version,
        verified_salt: None,
    };
    let records = vec![
        // r1: stage v2, add it to keyslot 1 (killed), resumed, failed before the add ran.
        rec("r1", start(vec![stage.clone(), add(1, VersionRef::Staged)])),
        rec("r1", Event::StepStart { step: 0 }),
        rec("r1", done(0, Some(2))),
        rec("r1", Event::StepStart { step: 1 }),
        rec("r1", Event::RunResumed { pid: 2 }),
        rec(
            "r1",
            Event::RunEnd {
                outcome: "failed".into(),
                message: None,
            },
        ),
        // r2: an add of v1 to keyslot 3 that finished, one to keyslot 4 that failed.
        rec(
            "r2",
            start(vec![
                add(3, VersionRef::Version(1)),
                add(4, VersionRef::Version(1)),
            ]),
        ),
        rec("r2", Event::StepStart { step: 0 }),
        rec("r2", done(0, None)),
        rec("r2", Event::StepStart { step: 1 }),
        rec(
            "r2",
            Event::StepFailed {
                step: 1,
                error: "cryptsetup failed".into(),
            },
        ),
        // r3: a `new version` add with no staged version in its run.
        rec("r3", start(vec![stage, add(5, VersionRef::Staged)])),
        rec("r3", Event::StepStart { step: 1 }),
    ];
    let got: Vec<(u32, u64)> = unfinished_adds(&records)
        .into_iter()
        .map(|u| {
            assert_eq!((u.device.as_str(), u.path.as_str()), ("d1", "/dev/d1"));
            (u.slot, u.version)
        })
        .collect();
    assert_eq!(got, vec![(1, 2), (4, 1)]);
}

/// A torn last record (a crash mid-write) is cut off by `open`, so the next record does not
/// turn it into a corrupt line in the middle; a whole record missing only its newline is kept.
#[test]
fn open_repairs_a_torn_tail() -> Result<(), JournalError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let mut j = Journal::open(&state)?;
    j.append("r1", Event::StepStart { step: 0 })?;
    drop(j);
    let path = state.join(JOURNAL_FILE);
    let whole = fs::read(&path).expect("read");
    // torn: half of a second record
    let mut torn = whole.clone();
    torn.extend_from_slice(&whole[..whole.len() / 2]);
    fs::write(&path, &torn).expect("write");
    let mut j = Journal::open(&state)?;
    j.append("r1", Event::StepStart { step: 1 })?;
    let r = records(&state);
    assert_eq!(r.len(), 2);
    assert!(matches!(r[1].event, Event::StepStart { step: 1 }));
    drop(j);
    // whole record without its newline: kept
    let mut bytes = fs::read(&path).expect("read");
    bytes.pop();
    fs::write(&path, &bytes).expect("write");
    let mut j = Journal::open(&state)?;
    j.append("r1", Event::StepStart { step: 2 })?;
    assert_eq!(records(&state).len(), 3);
    Ok(())
}

/// Error texts quoting known material, in any form and quoted in any way, reach the file
/// redacted, and the lines still read back.
#[test]
fn appended_records_are_redacted() -> Result<(), JournalError> {
    use base64::Engine as _;
    let m = b"journal-material-\"q\"-\\-7e0b";
    crate::secret::redact::register(m);
    let raw = String::from_utf8_lossy(m).into_owned();
    let hex: String = m.iter().map(|b| format!("{b:02x}")).collect();
    let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(m);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut j = Journal::open(dir.path())?;
    j.append(
        "r1",
        Event::StepFailed {
            step: 0,
            error: format!("KMS said {raw} / {raw:?} / {hex} / {b64}"),
        },
    )?;
    j.append(
        "r1",
        Event::RunEnd {
            outcome: "failed".into(),
            message: Some(format!("step 0: {}", hex.to_uppercase())),
        },
    )?;
    let bytes = fs::read(dir.path().join(JOURNAL_FILE)).expect("read");
    let text = String::from_utf8_lossy(&bytes);
    assert!(!text.contains("journal-material"), "{text}");
    assert!(
        !text.contains(&hex) && !text.contains(&hex.to_uppercase()),
        "{text}"
    );
    assert!(!text.contains(&b64), "{text}");
    let r = records(dir.path());
    match &r[0].event {
        Event::StepFailed { error, .. } => assert_eq!(
            error,
            "KMS said <redacted> / \"<redacted>\" / <redacted> / <redacted>"
        ),
        other => panic!("{other:?}"),
    }
    Ok(())
}
