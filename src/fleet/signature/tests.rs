//! Unit tests of plan signatures: keys, the signature format, and the policy's refusals.

use super::*;

fn policy(keys: &[&SigningKey], cluster: &str) -> SignaturePolicy {
    SignaturePolicy::new(keys.iter().map(|k| k.public().unwrap()).collect(), cluster).unwrap()
}

#[test]
fn sign_and_verify() {
    let key = SigningKey::generate().unwrap();
    let plan = b"version: 1\n";
    let sig = key.sign(plan, "prod", 100).unwrap();
    let text = sig.to_text();
    let p = policy(&[&key], "prod");
    let ok = p
        .verify(plan, Some(text.as_bytes()), "plan.yaml.sig", None)
        .unwrap();
    assert_eq!(ok.key, key.fingerprint());
    assert_eq!(ok.signed_at, 100);
    // The same or a later plan than the running one.
    assert!(p
        .verify(plan, Some(text.as_bytes()), "x", Some(100))
        .is_ok());
    assert_eq!(
        p.verify(plan, Some(text.as_bytes()), "x", Some(101))
            .unwrap_err()
            .reason(),
        "older"
    );
}

#[test]
fn every_refusal() {
    let key = SigningKey::generate().unwrap();
    let other = SigningKey::generate().unwrap();
    let plan = b"version: 1\n";
    let text = key.sign(plan, "prod", 100).unwrap().to_text();
    let p = policy(&[&key], "prod");
    let reason = |plan: &[u8], sig: Option<&[u8]>, p: &SignaturePolicy| {
        p.verify(plan, sig, "plan.yaml.sig", None)
            .unwrap_err()
            .reason()
    };
    assert_eq!(reason(plan, None, &p), "unsigned");
    assert_eq!(reason(plan, Some(b"{"), &p), "malformed");
    assert_eq!(
        reason(b"version: 2\n", Some(text.as_bytes()), &p),
        "tampered"
    );
    assert_eq!(
        reason(plan, Some(text.as_bytes()), &policy(&[&key], "staging")),
        "other_cluster"
    );
    assert_eq!(
        reason(plan, Some(text.as_bytes()), &policy(&[&other], "prod")),
        "untrusted_key"
    );
    // A signature file whose cluster is changed to match: the signature no longer verifies.
    let forged = text.replace("\"prod\"", "\"staging\"");
    assert_eq!(
        reason(plan, Some(forged.as_bytes()), &policy(&[&key], "staging")),
        "tampered"
    );
    // The digest field edited (the signature itself intact): refused.
    let sig: Signature = Signature::parse(text.as_bytes()).unwrap();
    let edited = text.replace(&sig.plan_sha256, &"0".repeat(64));
    assert_eq!(reason(plan, Some(edited.as_bytes()), &p), "tampered");
    // Signed far ahead of this clock: refused (it would block every later plan).
    let ahead = key
        .sign(
            plan,
            "prod",
            crate::clock::now_unix() + 2 * MAX_CLOCK_SKEW_SECONDS,
        )
        .unwrap()
        .to_text();
    assert_eq!(reason(plan, Some(ahead.as_bytes()), &p), "future");
    // Every single flipped bit of the plan is caught.
    for i in 0..plan.len() * 8 {
        let mut bad = plan.to_vec();
        bad[i / 8] ^= 1 << (i % 8);
        assert_eq!(
            reason(&bad, Some(text.as_bytes()), &p),
            "tampered",
            "bit {i}"
        );
    }
    // Two trusted keys: either verifies (rotation of the signing key).
    let both = policy(&[&other, &key], "prod");
    assert!(both.verify(plan, Some(text.as_bytes()), "x", None).is_ok());
    let by_other = other.sign(plan, "prod", 101).unwrap().to_text();
    assert!(both
        .verify(plan, Some(by_other.as_bytes()), "x", None)
        .is_ok());
}

#[test]
fn keys_round_trip_and_never_show() {
    let key = SigningKey::generate().unwrap();
    let pem = key.to_pem().unwrap();
    let again = SigningKey::from_pem(&pem, "test").unwrap();
    assert_eq!(again.fingerprint(), key.fingerprint());
    let public = key.public().unwrap();
    let p2 = PublicKey::from_pem(&public.to_pem().unwrap(), "test").unwrap();
    assert_eq!(p2.fingerprint(), key.fingerprint());
    let shown = format!("{key:?}");
    assert!(!shown.contains("PRIVATE"), "{shown}");
    let body: String = String::from_utf8_lossy(&pem)
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    assert!(!shown.contains(&body));
    assert!(SigningKey::from_pem(b"nonsense", "the file x")
        .unwrap_err()
        .to_string()
        .contains("the file x"));
    assert!(PublicKey::from_pem(&pem, "the file y").is_err());
    assert!(check_cluster("Prod")
        .unwrap_err()
        .to_string()
        .contains("upper-case"));
    assert!(check_cluster("a..b").is_err());
    assert!(check_cluster("prod-east.example").is_ok());
    // A public key is not a signing key, a private key not a trusted key, two PEM blocks
    // in one trusted file are refused, an encrypted key is refused without a prompt.
    let pub_pem = public.to_pem().unwrap();
    assert!(SigningKey::from_pem(&pub_pem, "x")
        .unwrap_err()
        .to_string()
        .contains("public key"));
    assert!(PublicKey::from_pem(&pem, "y")
        .unwrap_err()
        .to_string()
        .contains("private key"));
    let mut two = pub_pem.clone();
    two.extend_from_slice(
        &SigningKey::generate()
            .unwrap()
            .public()
            .unwrap()
            .to_pem()
            .unwrap(),
    );
    assert!(PublicKey::from_pem(&two, "z")
        .unwrap_err()
        .to_string()
        .contains("2 PEM blocks"));
    let enc = key
        .key
        .private_key_to_pem_pkcs8_passphrase(openssl::symm::Cipher::aes_256_cbc(), b"pw")
        .unwrap();
    assert!(SigningKey::from_pem(&enc, "e")
        .unwrap_err()
        .to_string()
        .contains("encrypted"));
}
