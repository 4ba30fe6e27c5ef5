//! The holder and vote records every KMS layout keeps for a key (src/kms/book.rs; docs/fleet.md,
//! "Keys on several nodes"): a map from record id to the time it was recorded (Unix seconds),
//! stored as each layout stores its holders (a JSON object in `meta.json`, a Vault field, the
//! Kubernetes annotation and the AWS record; one object per record in KMIP).
//!
//! - a **holder** id is a plan: `<node or host>:<state directory>`;
//! - a **vote** id is `<holder> verified v<N>` ([`vote_id`]): that plan's devices hold the
//!   pending version N and opened with it.
//!
//! The ids are part of every layout's version: a new kind of record is a new version of each.

/// The id of `holder`'s vote for `version`: `<holder> verified v<version>`.
pub fn vote_id(holder: &str, version: u64) -> String {
    format!("{holder}{VOTE_INFIX}{version}")
}

/// `(holder, version)` of a vote id ([`vote_id`]); `None` for a holder record.
pub fn parse_vote(id: &str) -> Option<(&str, u64)> {
    let (holder, v) = id.rsplit_once(VOTE_INFIX)?;
    let version = v.parse().ok()?;
    Some((holder, version))
}

/// What separates a vote's holder from its version number.
const VOTE_INFIX: &str = " verified v";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn votes_round_trip_and_holders_are_not_votes() {
        let id = vote_id("node-a:/var/lib/keyplan", 7);
        assert_eq!(id, "node-a:/var/lib/keyplan verified v7");
        assert_eq!(parse_vote(&id), Some(("node-a:/var/lib/keyplan", 7)));
        assert_eq!(parse_vote("node-a:/var/lib/keyplan"), None);
        assert_eq!(parse_vote("x verified vX"), None);
    }
}
