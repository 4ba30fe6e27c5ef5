//! The one clock: wall-clock time as whole Unix seconds (UTC), and how keyplan writes and reads
//! it as text.
//!
//! Every timestamp keyplan stores or compares (KMS version `created_at`, journal `ts`, the
//! observation time that decides whether a rotation is due, saved-plan `created_at`, run ids)
//! comes from [`now_unix`]; every time it prints is [`rfc3339`]. Planning itself never reads the
//! clock: the observation carries the time it was made (`Observed::now`), so the planner is a
//! pure function of its inputs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The current time in whole seconds since the Unix epoch (UTC); 0 if the system clock is set
/// before 1970.
pub fn now_unix() -> u64 {
    unix_seconds(SystemTime::now()).unwrap_or(0)
}

/// `t` in whole seconds since the Unix epoch; `None` before 1970.
pub fn unix_seconds(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
}

/// Unix seconds `t` as RFC 3339 text in UTC with whole seconds (`2026-12-01T08:41:10Z`).
/// Times past the year 9999, which RFC 3339 cannot write (a forged saved plan may carry one),
/// are written as `Unix time N`.
pub fn rfc3339(t: u64) -> String {
    /// 9999-12-31T23:59:59Z.
    const LAST_RFC3339_SECOND: u64 = 253_402_300_799;
    if t > LAST_RFC3339_SECOND {
        return format!("Unix time {t}");
    }
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(t)).to_string()
}

/// The current time as [`rfc3339`] text.
pub fn now_rfc3339() -> String {
    rfc3339(now_unix())
}

/// Parses an RFC 3339 timestamp as servers write it (fractional seconds allowed, `Z` or no
/// offset, e.g. Vault's `2024-05-01T12:00:00.123456789Z`) into whole Unix seconds; `None` when
/// it is not one, or before 1970.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    unix_seconds(humantime::parse_rfc3339_weak(text.trim()).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_and_caps_the_year() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_982_686), "2026-11-29T20:04:46Z");
        assert_eq!(parse_rfc3339("2026-11-29T20:04:46.5Z"), Some(1_795_982_686));
        assert_eq!(parse_rfc3339("yesterday"), None);
        assert_eq!(rfc3339(253_402_300_800), "Unix time 253402300800");
        assert!(now_unix() > 1_700_000_000);
    }
}
