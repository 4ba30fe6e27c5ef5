//! When the credentials keyplan holds for its KMSs expire, read from the credentials
//! themselves: a PEM certificate's notAfter (KMIP client certificates, Vault's cert auth) and a
//! JWT's `exp` claim (Kubernetes service-account tokens, Vault's kubernetes auth). Providers
//! turn these into [`super::Credential::expires_at`].
//!
//! Neither function verifies anything (a signature, a chain): they only read a date, for a
//! warning. Error texts name the file or say what is malformed, never a token's content.

use std::path::Path;

use base64::Engine as _;

/// The projected service-account token of a pod, which the kubelet refreshes before it
/// expires (<https://kubernetes.io/docs/concepts/security/service-accounts/#assign-to-pod>):
/// a credential at this path is renewed by the kubelet, one elsewhere by nobody known.
pub const PROJECTED_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// The notAfter of the first certificate in the PEM file at `path`, in Unix seconds (UTC; 0
/// for a date before 1970). Further certificates in the file (a chain) are ignored: the first
/// one is the leaf a TLS client presents.
///
/// Errors: a text naming `path` when the file cannot be read or holds no PEM certificate.
pub fn certificate_not_after(path: &Path) -> Result<u64, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    pem_not_after(&pem).map_err(|e| format!("{}: {e}", path.display()))
}

/// The notAfter of the first certificate in the PEM text `pem` (a kubeconfig's
/// `client-certificate-data`, say), in Unix seconds (UTC; 0 for a date before 1970).
///
/// Errors: a text saying `pem` holds no PEM certificate or its date cannot be read.
pub fn pem_not_after(pem: &[u8]) -> Result<u64, String> {
    let cert = openssl::x509::X509::from_pem(pem).map_err(|_| {
        "holds no PEM certificate (expected -----BEGIN CERTIFICATE-----)".to_string()
    })?;
    let epoch = openssl::asn1::Asn1Time::from_unix(0)
        .map_err(|e| format!("cannot represent the Unix epoch as an ASN.1 time: {e}"))?;
    let diff = epoch
        .diff(cert.not_after())
        .map_err(|e| format!("cannot read the notAfter date of the certificate: {e}"))?;
    let seconds = i64::from(diff.days) * 86_400 + i64::from(diff.secs);
    Ok(u64::try_from(seconds).unwrap_or(0))
}

/// The `exp` claim of the JWT `token` (RFC 7519 §4.1.4: Unix seconds), read from its payload
/// without verifying the signature; surrounding whitespace (a file's trailing newline) is
/// ignored. `Ok(None)`: the token has no `exp` claim (it does not expire by itself). A
/// fractional `exp` is rounded down.
///
/// Errors: a text saying what is malformed (not three dot-separated parts, a payload that is
/// not base64url JSON, an `exp` that is not a non-negative number); never the token itself.
pub fn jwt_expiry(token: &str) -> Result<Option<u64>, String> {
    let parts: Vec<&str> = token.trim().split('.').collect();
    let [_, payload, _] = parts.as_slice() else {
        return Err(format!(
            "not a JWT: expected 3 dot-separated parts (header.payload.signature), found {}",
            parts.len()
        ));
    };
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let json = engine
        .decode(payload)
        .map_err(|_| "not a JWT: the payload is not base64url (RFC 7515 §2)".to_string())?;
    let claims: serde_json::Value = serde_json::from_slice(&json)
        .map_err(|_| "not a JWT: the payload is not JSON".to_string())?;
    let Some(claims) = claims.as_object() else {
        return Err("not a JWT: the payload is not a JSON object".to_string());
    };
    match claims.get("exp") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(exp) => {
            if let Some(n) = exp.as_u64() {
                Ok(Some(n))
            } else {
                match exp.as_f64() {
                    // Truncation is the intent: a NumericDate may carry a fraction.
                    Some(f) if f.is_finite() && f >= 0.0 && f < u64::MAX as f64 => {
                        Ok(Some(f as u64))
                    }
                    _ => Err(
                        "the JWT's exp claim is not a non-negative number of seconds".to_string(),
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(payload: &str) -> String {
        let e = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.c2ln",
            e.encode(r#"{"alg":"RS256","typ":"JWT"}"#),
            e.encode(payload)
        )
    }

    #[test]
    fn reads_the_exp_claim() {
        let t = jwt(r#"{"iss":"kubernetes/serviceaccount","exp":1800000000,"sub":"x"}"#);
        assert_eq!(jwt_expiry(&t), Ok(Some(1_800_000_000)));
        assert_eq!(jwt_expiry(&format!("{t}\n")), Ok(Some(1_800_000_000)));
        assert_eq!(jwt_expiry(&jwt(r#"{"exp":1.5}"#)), Ok(Some(1)));
    }

    #[test]
    fn a_token_without_exp_does_not_expire() {
        assert_eq!(jwt_expiry(&jwt(r#"{"sub":"x"}"#)), Ok(None));
    }

    #[test]
    fn padded_payloads_are_accepted() {
        let e = &base64::engine::general_purpose::URL_SAFE;
        let t = format!("h.{}.s", e.encode(r#"{"exp":7}"#));
        assert_eq!(jwt_expiry(&t), Ok(Some(7)));
    }

    #[test]
    fn malformed_tokens_are_errors_without_their_content() {
        let secret = "s3cr3t-not-a-jwt";
        let e = jwt_expiry(secret).expect_err("not a JWT");
        assert!(e.contains("3 dot-separated parts"), "{e}");
        assert!(!e.contains(secret), "{e}");
        assert!(jwt_expiry("a.!!!.c")
            .expect_err("bad base64")
            .contains("base64url"));
        assert!(jwt_expiry(&jwt("[1]"))
            .expect_err("array")
            .contains("JSON object"));
        assert!(jwt_expiry(&jwt("{"))
            .expect_err("bad json")
            .contains("not JSON"));
        assert!(jwt_expiry(&jwt(r#"{"exp":-1}"#)).is_err());
        assert!(jwt_expiry(&jwt(r#"{"exp":"soon"}"#)).is_err());
    }

    #[test]
    fn reads_a_certificate_not_after() {
        use openssl::asn1::Asn1Time;
        use openssl::hash::MessageDigest;
        use openssl::pkey::PKey;
        use openssl::rsa::Rsa;
        use openssl::x509::{X509Builder, X509NameBuilder};

        let key = PKey::from_rsa(Rsa::generate(2048).expect("rsa")).expect("pkey");
        let mut name = X509NameBuilder::new().expect("name");
        name.append_entry_by_text("CN", "keyplan-test").expect("cn");
        let name = name.build();
        let mut b = X509Builder::new().expect("builder");
        b.set_version(2).expect("version");
        b.set_subject_name(&name).expect("subject");
        b.set_issuer_name(&name).expect("issuer");
        b.set_pubkey(&key).expect("pubkey");
        let not_after: i64 = 1_900_000_000;
        b.set_not_before(&Asn1Time::from_unix(1_600_000_000).expect("t"))
            .expect("nb");
        b.set_not_after(&Asn1Time::from_unix(not_after).expect("t"))
            .expect("na");
        b.sign(&key, MessageDigest::sha256()).expect("sign");
        let pem = b.build().to_pem().expect("pem");

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("client.crt");
        std::fs::write(&path, &pem).expect("write");
        assert_eq!(certificate_not_after(&path), Ok(not_after as u64));

        let missing = dir.path().join("missing.crt");
        let e = certificate_not_after(&missing).expect_err("missing");
        assert!(e.contains("missing.crt"), "{e}");
        let junk = dir.path().join("junk.crt");
        std::fs::write(&junk, "not a certificate").expect("write");
        let e = certificate_not_after(&junk).expect_err("junk");
        assert!(e.contains("no PEM certificate"), "{e}");
    }
}
