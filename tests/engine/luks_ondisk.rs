//! The in-process, read-only LUKS header reader (`keyplan::luks::ondisk`, issue 17) against
//! cryptsetup: a differential test over headers this suite makes, the cryptsetup project's
//! images (`../shared/testdata/cryptsetup`, skipped where absent) and damaged copies, each
//! compared with `cryptsetup luksDump` run on a scratch copy (luksDump may repair it); and a
//! test that `plan`, `status`, `verify` and `show` change no byte of a damaged device, whose
//! damage they report.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use keyplan::luks::{Cryptsetup, Header, LuksError};

/// In process vs `cryptsetup luksDump` of a scratch copy: the same header (the damage
/// findings are keyplan's only), or the same verdict (not LUKS / unusable).
fn same_as_cryptsetup(img: &Path, scratch: &Path) -> Result<Header, String> {
    let ours = Cryptsetup::new().dump(img);
    let copy = scratch.join(format!(
        "copy-of-{}",
        img.file_name().and_then(|n| n.to_str()).unwrap_or("img")
    ));
    std::fs::copy(img, &copy).expect("copy");
    let theirs = Cryptsetup::new().dump_by_luksdump(&copy);
    let _ = std::fs::remove_file(&copy);
    match (ours, theirs) {
        (Ok(o), Ok(mut t)) => {
            t.condition = o.condition.clone();
            if o != t {
                return Err(format!(
                    "{}: keyplan read\n{o:#?}\ncryptsetup read\n{t:#?}",
                    img.display()
                ));
            }
            Ok(o)
        }
        (Err(o), Err(t)) => {
            let kind = |e: &LuksError| matches!(e, LuksError::NotLuks { .. });
            if kind(&o) != kind(&t) && !matches!(t, LuksError::Device { .. }) {
                return Err(format!("{}: keyplan: {o}; cryptsetup: {t}", img.display()));
            }
            Err(format!("unusable: {o}"))
        }
        (o, t) => Err(format!(
            "{}: keyplan {:?} but cryptsetup {:?}",
            img.display(),
            o.map(|h| h.uuid),
            t.map(|h| h.uuid)
        )),
    }
}

fn sha(p: &Path) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(std::fs::read(p).expect("read")).to_vec()
}

/// Writes `bytes` at `offset` of `img`.
fn poke(img: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(img)
        .expect("open for writing");
    f.write_all_at(bytes, offset).expect("write");
}

fn read_at(img: &Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(img).expect("open");
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, offset).expect("read");
    b
}

/// The images of a `.tar.xz` of the shared test data, extracted into `into`.
fn shared_tar(name: &str, into: &Path) -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/testdata/cryptsetup")
        .join(format!("{name}.tar.xz"));
    if !src.exists() {
        eprintln!(
            "SKIPPED: {} not found (../shared/testdata absent)",
            src.display()
        );
        return Vec::new();
    }
    let dir = into.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let ok = Command::new("tar")
        .arg("xJf")
        .arg(&src)
        .arg("-C")
        .arg(&dir)
        .status()
        .expect("tar")
        .success();
    assert!(ok, "tar xJf {}", src.display());
    let mut out: Vec<PathBuf> = walk(&dir).into_iter().filter(|p| p.is_file()).collect();
    out.sort();
    out
}

/// LUKS2 `hdr_size` of `img` (bytes).
fn hdr_size(img: &Path) -> u64 {
    let b = read_at(img, 8, 8);
    u64::from_be_bytes(b.try_into().expect("8 bytes"))
}

/// The damaged and disagreeing LUKS2 copies of `base`, by name: primary JSON byte flipped,
/// secondary flipped, primary newer than secondary, secondary newer than primary, both
/// damaged.
fn damaged_variants(s: &Scratch, base: &Path) -> Vec<(String, PathBuf)> {
    let size = hdr_size(base);
    let mk = |name: &str| {
        let p = s.path(&format!("{name}.img"));
        std::fs::copy(base, &p).expect("copy");
        p
    };
    let mut out = Vec::new();
    let p = mk("damaged-primary");
    poke(&p, 4096 + 10, b"#");
    out.push(("damaged primary".to_string(), p));
    let p = mk("damaged-secondary");
    poke(&p, size + 4096 + 10, b"#");
    out.push(("damaged secondary".to_string(), p));
    // The primary's first sector zeroed (its signature gone): cryptsetup still opens the
    // device from the secondary, and so must keyplan read it (found by a new user's trial).
    let p = mk("wiped-primary-signature");
    poke(&p, 0, &[0u8; 512]);
    out.push(("damaged primary signature".to_string(), p));
    // A newer header (one more keyslot): its primary with the older secondary, and the
    // other way round.
    let newer = mk("newer");
    let d = s.dir.path().display().to_string();
    let script = format!(
        "printf '%s' '{}' > {d}/old.pass; printf 'second' > {d}/new.pass; cryptsetup luksAddKey --batch-mode --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file {d}/old.pass {} {d}/new.pass; rc=$?; rm {d}/old.pass {d}/new.pass; exit $rc",
        String::from_utf8_lossy(INITIAL),
        newer.display()
    );
    let added = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("sh");
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let primary_newer = mk("primary-newer");
    let old_secondary = read_at(base, size, size as usize);
    let new_primary = read_at(&newer, 0, size as usize);
    poke(&primary_newer, 0, &new_primary);
    poke(&primary_newer, size, &old_secondary);
    out.push(("primary newer".to_string(), primary_newer));
    let secondary_newer = mk("secondary-newer");
    let new_secondary = read_at(&newer, size, size as usize);
    poke(&secondary_newer, size, &new_secondary);
    out.push(("secondary newer".to_string(), secondary_newer));
    let p = mk("both-damaged");
    poke(&p, 4096 + 10, b"#");
    poke(&p, size + 4096 + 10, b"#");
    out.push(("both damaged".to_string(), p));
    let p = mk("truncated-json");
    // The JSON area's first bytes replaced by an unterminated JSON text: checksum and JSON fail.
    poke(&p, 4096, &[b'{'; 64]);
    out.push(("truncated JSON".to_string(), p));
    out
}

#[test]
fn the_in_process_reader_agrees_with_cryptsetup() {
    let s = Scratch::new();
    let mut images: Vec<(String, PathBuf)> = Vec::new();
    // Headers this suite makes.
    for (name, luks) in [("luks1", "luks1"), ("luks2", "luks2")] {
        images.push((
            format!("{name} fresh"),
            s.image(&format!("{name}.img"), luks),
        ));
        images.push((
            format!("{name} small"),
            s.small_image(&format!("{name}-small.img"), luks),
        ));
    }
    // More keyslots and a foreign token.
    let busy = s.small_image("busy.img", "luks2");
    let sh = |script: String| {
        let out = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for slot in [3, 7] {
        sh(format!(
            "printf '%s' '{}' > {d}/old.pass; printf 'new-{slot}' > {d}/new.pass; cryptsetup luksAddKey --batch-mode --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-slot {slot} --key-file {d}/old.pass {} {d}/new.pass; rm {d}/old.pass {d}/new.pass",
            String::from_utf8_lossy(INITIAL),
            busy.display(),
            d = s.dir.path().display()
        ));
    }
    sh(format!(
        "printf '%s' '{{\"type\":\"clevis\",\"keyslots\":[\"3\"],\"jwe\":{{\"protected\":\"eyJhbGciOiJkaXIifQ\"}}}}' | cryptsetup token import --token-id 5 {}",
        busy.display()
    ));
    sh(format!(
        "cryptsetup luksKillSlot --batch-mode {} 0",
        busy.display()
    ));
    images.push(("luks2 keyslots 3 and 7, foreign token".into(), busy));
    // The cryptsetup project's images.
    for name in [
        "compatimage",
        "compatimage2",
        "luks2_valid_hdr",
        "luks2_keyslot_unassigned",
    ] {
        if let Some(p) = shared_image(name, s.dir.path()) {
            images.push((name.to_string(), p));
        }
    }
    for tar in ["luks2_mda_images", "luks2_header_requirements"] {
        for p in shared_tar(tar, s.dir.path()) {
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .to_string();
            images.push((format!("{tar}/{name}"), p));
        }
    }
    // A deliberately damaged LUKS1 header (its file name has no `.img`).
    let evil = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/testdata/cryptsetup/evil_hdr-luks_hdr_damage.xz");
    if evil.exists() {
        let out = Command::new("xz")
            .arg("-dc")
            .arg(&evil)
            .output()
            .expect("xz");
        assert!(out.status.success(), "xz -dc {}", evil.display());
        let p = s.path("evil_hdr-luks_hdr_damage.img");
        std::fs::write(&p, out.stdout).expect("write");
        images.push(("evil_hdr-luks_hdr_damage".into(), p));
    } else {
        eprintln!(
            "SKIPPED: {} not found (../shared/testdata absent)",
            evil.display()
        );
    }
    // Damaged and disagreeing copies.
    let base = s.small_image("base.img", "luks2");
    images.extend(damaged_variants(&s, &base));
    let scratch = s.path("scratch");
    std::fs::create_dir_all(&scratch).expect("mkdir");
    let mut agreed = 0;
    let mut failures = Vec::new();
    let mut damaged = Vec::new();
    for (name, img) in &images {
        let before = sha(img);
        match same_as_cryptsetup(img, &scratch) {
            Ok(h) => {
                agreed += 1;
                if !h.condition.damage.is_empty() {
                    damaged.push(name.clone());
                }
                if name.contains("requirements/luks2_header_requirements")
                    && !name.ends_with("_free")
                {
                    assert!(
                        !h.condition.requirements.is_empty(),
                        "{name}: no requirements found"
                    );
                }
            }
            Err(e) if e.starts_with("unusable") => {
                agreed += 1;
                assert!(
                    name.contains("both damaged")
                        || name.contains("evil")
                        || name.contains("truncated"),
                    "{name}: {e}"
                );
            }
            Err(e) => failures.push(e),
        }
        assert_eq!(sha(img), before, "{name}: reading it changed a byte");
    }
    eprintln!(
        "luks_ondisk: {agreed} of {} headers read as cryptsetup reads them; damage reported on {damaged:?}",
        images.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    for must in [
        "damaged primary",
        "damaged primary signature",
        "damaged secondary",
        "primary newer",
        "secondary newer",
    ] {
        assert!(
            damaged.iter().any(|d| d == must),
            "no damage reported for {must}: {damaged:?}"
        );
    }
}

/// A plan whose only device is `img`.
fn plan_for(s: &Scratch, img: &Path) {
    s.initial_pass();
    s.plan(
        "keyplan.yaml",
        &one_key_plan(&format!(
            "  d: {{ path: {}, keys: [k], enroll_with: initial.pass }}",
            img.display()
        )),
    );
}

#[test]
fn plan_status_verify_and_show_change_no_byte_of_a_damaged_device() {
    let s = Scratch::new();
    let base = s.small_image("base.img", "luks2");
    // Enrolled first, so verify and status have something to check.
    plan_for(&s, &base);
    s.ok(&["apply", "--auto-approve"], 0);
    for (name, img) in damaged_variants(&s, &base) {
        if name.contains("both") || name.contains("truncated") {
            continue;
        }
        plan_for(&s, &img);
        let before = sha(&img);
        let plan = s.keyplan(&["plan"]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&plan.stdout),
            String::from_utf8_lossy(&plan.stderr)
        );
        assert!(
            text.contains("LUKS2 header")
                && (text.contains("damaged") || text.contains("disagree")),
            "{name}: plan does not report the damage:\n{text}"
        );
        let status = s.keyplan(&["status", "--format", "json"]);
        let doc: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status json");
        assert!(
            doc["devices"][0]["header_damage"]
                .as_array()
                .is_some_and(|a| !a.is_empty()),
            "{name}: {doc:#}"
        );
        assert_eq!(status.status.code(), Some(1), "{name}: status exit");
        let _ = s.keyplan(&["verify"]);
        let _ = s.keyplan(&["plan", "--verify"]);
        let _ = s.keyplan(&["plan", "-o", "saved.json"]);
        let _ = s.keyplan(&["show", "saved.json"]);
        assert_eq!(
            sha(&img),
            before,
            "{name}: a read-only command changed the device"
        );
        // apply refuses to write to it (copies disagree), unless --repair-headers.
        if name.contains("damaged") || name.contains("newer") {
            let out = s.keyplan(&["apply", "--auto-approve", "--rotate", "k"]);
            let text = String::from_utf8_lossy(&out.stderr).to_string()
                + &String::from_utf8_lossy(&out.stdout);
            assert_ne!(out.status.code(), Some(0), "{name}: {text}");
            assert!(text.contains("--repair-headers"), "{name}: {text}");
            assert_eq!(
                sha(&img),
                before,
                "{name}: a refused apply changed the device"
            );
        }
    }
}

#[test]
fn a_header_with_unmet_requirements_is_refused_at_plan_time() {
    let s = Scratch::new();
    let Some(img) = shared_tar("luks2_header_requirements", s.dir.path())
        .into_iter()
        .find(|p| p.file_name().and_then(|n| n.to_str()) == Some("luks2_header_requirements"))
    else {
        return;
    };
    std::fs::write(s.path("compat.pass"), b"compatkey").expect("pass");
    s.plan(
        "keyplan.yaml",
        &one_key_plan(&format!(
            "  d: {{ path: {}, keys: [k], enroll_with: compat.pass }}",
            img.display()
        )),
    );
    let out = s.ok(&["plan"], 1);
    assert!(out.contains("`req0`") && out.contains("`req1`"), "{out}");
    assert!(out.contains("no key version was staged"), "{out}");
    let out = s.ok(&["apply", "--auto-approve"], 1);
    assert!(out.contains("mandatory requirement"), "{out}");
    assert!(
        !s.path("keys/k").exists(),
        "a key was staged for a device it cannot be added to"
    );
}

/// `verify` checks every device: one whose header copies disagree (so keyplan will not test
/// passphrases on it) is a FAIL line naming why, and the next device is still verified.
#[test]
fn verify_reports_a_damaged_device_and_checks_the_others() {
    let s = Scratch::new();
    s.initial_pass();
    let a = s.small_image("a.img", "luks2");
    s.small_image("b.img", "luks2");
    s.plan(
        "keyplan.yaml",
        &one_key_plan(
            "  a: { path: a.img, keys: [k], enroll_with: initial.pass }\n  b: { path: b.img, keys: [k], enroll_with: initial.pass }",
        ),
    );
    s.ok(&["apply", "--auto-approve"], 0);
    poke(&a, hdr_size(&a) + 4096 + 10, b"#");
    let before = sha(&a);
    let out = s.ok(&["verify"], 1);
    assert!(
        out.contains("FAIL  a: k v1 in keyslot 1 could not be tested")
            && out.contains("ok    b: k v1 opens bound keyslot 1"),
        "{out}"
    );
    assert_eq!(
        sha(&a),
        before,
        "verify changed a byte of the damaged device"
    );
}
