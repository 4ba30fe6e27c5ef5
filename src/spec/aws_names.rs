//! AWS Secrets Manager's rules for what a plan may name (`provider: aws_secrets_manager`):
//! the region, the endpoint and the secret names keyplan derives from `prefix` and a key's
//! name. One home for both users: plan validation (`keyplan validate` reports them with the
//! file's line) and the provider (`src/kms/aws/mod.rs`, which refuses them again for a plan
//! built in code).
//!
//! Sources: secret names, CreateSecret's `Name` parameter
//! (<https://docs.aws.amazon.com/secretsmanager/latest/apireference/API_CreateSecret.html>:
//! 1 to 512 characters, ASCII letters, digits and `/_+=.@-`); regions, the AWS general
//! reference's region codes (`us-east-1`, `eu-central-2`, `us-gov-west-1`, `cn-north-1`).

/// The suffix of keyplan's record secret of a key (`<prefix><name>.keyplan`, holders and
/// retired versions: docs/kms/aws-secrets-manager.md). A key name ending with it would share
/// its secret with another key's record.
pub const RECORD_SUFFIX: &str = ".keyplan";

/// The longest secret name Secrets Manager accepts, in characters.
pub const MAX_SECRET_NAME: usize = 512;

/// What is wrong with key name `name` under `prefix` as AWS Secrets Manager secret names
/// (`<prefix><name>` and its record `<prefix><name>.keyplan`), for a message that goes on
/// "the name ..."; `None` when both are valid. The prefix's own characters are
/// [`prefix_problem`]'s.
pub fn secret_name_problem(prefix: &str, name: &str) -> Option<String> {
    let full = format!("{prefix}{name}");
    if let Some(owner) = full.strip_suffix(RECORD_SUFFIX) {
        return Some(format!(
            "makes the secret name {full:?}, which ends with `{RECORD_SUFFIX}`, the suffix of keyplan's record secret: it is the record of the secret {owner:?} (the key named {:?} under this prefix, or a key of another instance); choose a name that does not end with `{RECORD_SUFFIX}`",
            owner.strip_prefix(prefix).unwrap_or(owner)
        ));
    }
    if let Some(c) = bad_char(name) {
        return Some(format!(
            "contains {c:?}: Secrets Manager allows only ASCII letters, digits and `/_+=.@-` in secret names"
        ));
    }
    let len = full.len() + RECORD_SUFFIX.len();
    // A prefix too long by itself is reported once, at `prefix` ([`prefix_problem`]).
    if len > MAX_SECRET_NAME && prefix.len() + RECORD_SUFFIX.len() < MAX_SECRET_NAME {
        return Some(format!(
            "makes the record secret name {len} characters long ({full:?} and `{RECORD_SUFFIX}`): Secrets Manager allows at most {MAX_SECRET_NAME}; use a shorter name or prefix"
        ));
    }
    None
}

/// The first character of `s` that secret names do not allow.
fn bad_char(s: &str) -> Option<char> {
    s.chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "/_+=.@-".contains(*c)))
}

/// What is wrong with `prefix` as the start of every secret name of an instance, with the
/// fix; `None` when it is usable. (The length is judged with each key's name:
/// [`secret_name_problem`].)
pub fn prefix_problem(prefix: &str) -> Option<String> {
    if let Some(c) = bad_char(prefix) {
        return Some(format!(
            "prefix {prefix:?} contains {c:?}: Secrets Manager allows only ASCII letters, digits and `/_+=.@-` in secret names"
        ));
    }
    (prefix.len() + RECORD_SUFFIX.len() >= MAX_SECRET_NAME).then(|| {
        format!(
            "prefix is {} characters long: with a key name and `{RECORD_SUFFIX}` it exceeds the {MAX_SECRET_NAME} characters Secrets Manager allows in a secret name; use a shorter prefix",
            prefix.len()
        )
    })
}

/// What is wrong with `region` as an AWS region code (`<area>-<place>-<n>`, e.g. `eu-west-1`,
/// `us-gov-west-1`), with the fix; `None` when it has that shape. Whether the region exists is
/// only known to AWS: an unknown region of the right shape fails later, as an unreachable
/// endpoint.
pub fn region_problem(region: &str) -> Option<String> {
    let parts: Vec<&str> = region.split('-').collect();
    let word = |s: &&str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase());
    let ok = parts.len() >= 3
        && parts[..parts.len() - 1].iter().all(word)
        && parts
            .last()
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    (!ok).then(|| {
        format!(
            "region {region:?} is not an AWS region code; write it like `eu-west-1` or `us-gov-west-1` (lowercase, dash-separated, ending with a number)"
        )
    })
}

/// What is wrong with `endpoint` as a Secrets Manager endpoint (an `http(s)://host[:port]`
/// URL: a VPC endpoint or a test server), with the fix; `None` when it is one. A user name or
/// password in it is refused, never quoted (the message shows it as `***`).
pub fn endpoint_problem(endpoint: &str) -> Option<String> {
    let shown = crate::secret::redact::url_credentials(endpoint);
    let url = match url::Url::parse(endpoint.trim()) {
        Ok(u) => u,
        Err(e) => {
            return Some(format!(
                "endpoint {shown:?} is not a URL ({e}); write it like `https://secretsmanager.eu-west-1.amazonaws.com`, or drop it for the region's public endpoint"
            ))
        }
    };
    if url.scheme() != "https" && url.scheme() != "http" {
        return Some(format!(
            "endpoint {shown:?} must start with https:// (or http:// for a local test server)"
        ));
    }
    if url.cannot_be_a_base() || url.host_str().is_none_or(str::is_empty) {
        return Some(format!(
            "endpoint {shown:?} names no host; write it like `https://vpce-0123-abcd.secretsmanager.eu-west-1.vpce.amazonaws.com`"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Some(format!(
            "endpoint {shown:?} holds a user name or password: Secrets Manager takes credentials from the AWS credential chain (environment, profile, web identity), never from the URL; remove them from the plan"
        ));
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Some(format!(
            "endpoint {shown:?} has a path, query or fragment: Secrets Manager is served at the root of its endpoint; write only `scheme://host[:port]`"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names() {
        assert_eq!(secret_name_problem("rook/", "osd-kek"), None);
        assert_eq!(secret_name_problem("", "a+b=c.d@e_f/g-h"), None);
        let e = secret_name_problem("", "foo.keyplan").unwrap();
        assert!(e.contains("the key named \"foo\""), "{e}");
        // The prefix can complete the suffix: still another secret's record.
        let e = secret_name_problem("prod/osd-kek.", "keyplan").unwrap();
        assert!(e.contains("record of the secret \"prod/osd-kek\""), "{e}");
        assert!(prefix_problem(&"p".repeat(600))
            .unwrap()
            .contains("600 characters"));
        assert_eq!(
            secret_name_problem(&"p".repeat(600), "k"),
            None,
            "reported at prefix"
        );
        let e = secret_name_problem("p/", "k k").unwrap();
        assert!(e.contains("' '"), "{e}");
        assert_eq!(
            secret_name_problem("p ", "k"),
            None,
            "the prefix is judged apart"
        );
        assert!(prefix_problem("p ").unwrap().contains("' '"));
        assert_eq!(prefix_problem("rook/"), None);
        assert!(secret_name_problem("", &"a".repeat(504)).is_none());
        let e = secret_name_problem("", &"a".repeat(505)).unwrap();
        assert!(e.contains("513 characters"), "{e}");
    }

    #[test]
    fn regions() {
        for ok in ["eu-west-1", "us-gov-west-1", "cn-north-1", "ap-southeast-4"] {
            assert_eq!(region_problem(ok), None, "{ok}");
        }
        for bad in [
            "us-east1",
            "useast-1",
            "EU-west-1",
            "eu-west-",
            "eu west 1",
            "",
        ] {
            assert!(region_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn endpoints() {
        assert_eq!(endpoint_problem("http://127.0.0.1:4566"), None);
        assert_eq!(endpoint_problem("https://vpce.example.com/"), None);
        for bad in [
            "127.0.0.1:4566",
            "ftp://host",
            "http://host:1/v1",
            "http://host?x=1",
            "not a url",
        ] {
            assert!(endpoint_problem(bad).is_some(), "{bad}");
        }
        let e = endpoint_problem("http://alice:hunter2@host:1").unwrap();
        assert!(!e.contains("hunter2") && !e.contains("alice"), "{e}");
        assert!(e.contains("***"), "{e}");
    }
}
