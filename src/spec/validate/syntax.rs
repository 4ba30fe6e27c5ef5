//! The syntax of values: ids (KMS instance names, key ids, device ids), file-KMS key names,
//! and `rotate_after` durations.

use std::time::Duration;

/// Units accepted in `rotate_after` (humantime's spellings of s, m, h, d, w).
const DURATION_UNITS: [&str; 21] = [
    "s", "sec", "secs", "second", "seconds", "m", "min", "mins", "minute", "minutes", "h", "hr",
    "hrs", "hour", "hours", "d", "day", "days", "w", "week", "weeks",
];

/// The help of every `rotate_after` issue.
pub(super) const DURATION_HELP: &str = "write a number and a unit, e.g. `90d`, `12h` or `2w` (combinations like `1w 3d` work too); units: s (seconds), m (minutes), h (hours), d (days), w (weeks); months and years are not accepted because their length varies: use e.g. `13w` or `365d`";

/// The characters of an id, as the help of an id issue names them.
pub(super) const ID_CHARS: &str = "ASCII letters, digits, `.`, `_` and `-`";

/// KMS instance names, key ids and device ids: non-empty `[A-Za-z0-9._-]+`.
pub(crate) fn is_id(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Key names stored by the file KMS: an id that does not start with `.`.
pub(crate) fn is_safe_file_name(s: &str) -> bool {
    is_id(s) && !s.starts_with('.')
}

/// Parses `rotate_after`: humantime syntax restricted to units s, m, h, d, w; more than zero.
/// Errors carry a message (the help is [`DURATION_HELP`]).
pub(crate) fn parse_rotate_after(text: &str) -> Result<Duration, String> {
    let d = parse_duration("rotate_after", text)?;
    if d.is_zero() {
        return Err(format!(
            "`rotate_after: {}` is zero; keys would rotate on every run",
            text.trim()
        ));
    }
    Ok(d)
}

/// Shortest `timeout` a plan may give a KMS instance.
pub const MIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// Longest `timeout` a plan may give a KMS instance (one hour).
pub const MAX_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Parses a KMS instance's `timeout` (the syntax of `rotate_after`), from
/// [`MIN_TIMEOUT`] to [`MAX_TIMEOUT`]. Errors
/// carry a message saying what is accepted.
pub fn parse_kms_timeout(text: &str) -> Result<Duration, String> {
    let d = parse_duration("timeout", text)?;
    if !(MIN_TIMEOUT..=MAX_TIMEOUT).contains(&d) {
        return Err(format!(
            "`timeout: {}` is outside 1s to 1h: keyplan waits at least a second and at most an hour for one KMS call",
            text.trim()
        ));
    }
    Ok(d)
}

/// Parses duration `text` of plan field `field`: humantime syntax restricted to units s, m,
/// h, d, w. Errors carry a message naming the field.
fn parse_duration(field: &str, text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err(format!("`{field}` is empty"));
    }
    let chars: Vec<char> = t.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        if i >= chars.len() {
            break;
        }
        let num_start = i;
        while i < chars.len() && chars[i].is_ascii_digit() {
            i += 1;
        }
        if i == num_start {
            return Err(format!(
                "`{field}: {t}` is not a duration (expected a number at `{}`)",
                chars[num_start..].iter().collect::<String>()
            ));
        }
        let number: String = chars[num_start..i].iter().collect();
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        let unit_start = i;
        while i < chars.len() && chars[i].is_alphabetic() {
            i += 1;
        }
        if i == unit_start {
            return Err(if i >= chars.len() {
                format!("`{field}: {t}` has no unit after `{number}`")
            } else {
                format!(
                    "`{field}: {t}` is not a duration (unexpected `{}`)",
                    chars[i]
                )
            });
        }
        let unit: String = chars[unit_start..i].iter().collect();
        if !DURATION_UNITS.contains(&unit.as_str()) {
            return Err(format!(
                "`{field}: {t}` uses the unit `{unit}`, which is not accepted"
            ));
        }
    }
    let d = humantime::parse_duration(t)
        .map_err(|e| format!("`{field}: {t}` is not a duration: {e}"))?;
    Ok(d)
}

/// Whether `s` is a DNS-1123 label (a Kubernetes namespace name): 1 to 63 lowercase letters,
/// digits and `-`, starting and ending with a letter or digit.
pub(crate) fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&b.len())
        && b.iter().all(|c| alnum(c) || *c == b'-')
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
}

/// Whether `s` is a DNS-1123 subdomain (a Kubernetes node name): 1 to 253 characters, parts
/// of lowercase letters, digits and `-` that start and end with a letter or digit, joined by
/// `.` (Kubernetes' `IsDNS1123Subdomain`, which limits the whole name, not each part).
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    let part = |p: &str| {
        let b = p.as_bytes();
        let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        b.iter().all(|c| alnum(c) || *c == b'-')
            && b.first().is_some_and(alnum)
            && b.last().is_some_and(alnum)
    };
    (1..=253).contains(&s.len()) && s.split('.').all(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kms_timeouts() {
        assert_eq!(parse_kms_timeout("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_kms_timeout(" 2m ").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_kms_timeout("1h").unwrap(), Duration::from_secs(3600));
        for bad in ["0s", "2h", "1d"] {
            let e = parse_kms_timeout(bad).unwrap_err();
            assert!(e.contains("outside 1s to 1h"), "{bad}: {e}");
        }
        let e = parse_kms_timeout("soon").unwrap_err();
        assert!(e.starts_with("`timeout: soon`"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_rotate_after("90d").unwrap(),
            Duration::from_secs(90 * 86400)
        );
        assert_eq!(
            parse_rotate_after("12h").unwrap(),
            Duration::from_secs(12 * 3600)
        );
        assert_eq!(
            parse_rotate_after("2w").unwrap(),
            Duration::from_secs(14 * 86400)
        );
        assert_eq!(
            parse_rotate_after("1w 3d").unwrap(),
            Duration::from_secs(10 * 86400)
        );
        assert_eq!(
            parse_rotate_after("30m").unwrap(),
            Duration::from_secs(1800)
        );
        // The long spellings, with or without a space, as docs/plan-file.md says.
        for (text, secs) in [
            ("30 days", 30 * 86400),
            ("30days", 30 * 86400),
            ("2 weeks 3 days", 17 * 86400),
            ("12 hours", 12 * 3600),
            ("1 day", 86400),
        ] {
            assert_eq!(
                parse_rotate_after(text).unwrap(),
                Duration::from_secs(secs),
                "{text}"
            );
        }
        for bad in [
            "90x",
            "3 months",
            "0d",
            "1y",
            "2M",
            "",
            "d",
            "90",
            "1.5h",
            "-1d",
            "10ms",
            "12h!",
            "99999999999999999999w",
        ] {
            assert!(parse_rotate_after(bad).is_err(), "{bad} accepted");
        }
        assert!(parse_rotate_after("3 months")
            .unwrap_err()
            .contains("months"));
    }

    #[test]
    fn ids_and_file_names() {
        assert!(is_id("osd0-block_1.x"));
        assert!(!is_id(""));
        assert!(!is_id("a/b"));
        assert!(!is_id("a b"));
        assert!(is_safe_file_name("data-kek"));
        assert!(!is_safe_file_name(".hidden"));
        assert!(!is_safe_file_name(".."));
    }
}
