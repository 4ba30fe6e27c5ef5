//! The `kmip` KMS's attributes (src/kms/kmip/layout.rs; docs/kms/kmip.md).
//!
//! One Symmetric Key object per version: Name `<key>/v<N>`, Object Group `keyplan:<key>`
//! ([`GROUP_PREFIX`]), and Application Specific Information in namespace `keyplan`
//! ([`NAMESPACE`]) whose data is `;`-separated `field=value` pairs ([`AppInfo`]):
//! `format=2;created=<unix>;history=<N>@<unix>,...` (the versions known when it was staged).
//! The object's KMIP state is the version's state. One object per holder or vote record
//! ([`super::holders`]): Name `<key>/holder/<id>`, Object Group `keyplan-holders:<key>`
//! ([`HOLDER_GROUP_PREFIX`]), data `format=2;since=<unix>`.
//!
//! Versions: **1** is the data without `format=` (keyplan up to commit c322096); **2** adds
//! the `format=2` pair in front, and nothing else (a version-1 reader skips unknown pairs).
//! This keyplan reads both and refuses a higher one. Unknown pairs are skipped.

use super::ReadError;
use crate::format::Format;

/// The version this keyplan writes, and the newest it reads.
pub const VERSION: u64 = 2;

/// keyplan's KMIP objects and their attributes.
pub const FORMAT: Format = Format {
    name: "kms-kmip",
    writes: "2",
    reads: "1-2",
    home: "KMIP object attributes: Name, Object Group, Application Specific Information (kmip KMS)",
};

/// Application Specific Information namespace of keyplan's objects.
pub const NAMESPACE: &str = "keyplan";
/// Object Group prefix of a key's versions: `keyplan:<key>`.
pub const GROUP_PREFIX: &str = "keyplan:";
/// Object Group prefix of a key's holder records: `keyplan-holders:<key>`.
pub const HOLDER_GROUP_PREFIX: &str = "keyplan-holders:";
/// The data's version field.
pub const FORMAT_FIELD: &str = "format";
/// The data's field with a version's staging time (Unix seconds).
pub const CREATED_FIELD: &str = "created";
/// The data's field listing earlier versions, `<N>@<unix>,...`.
pub const HISTORY_FIELD: &str = "history";
/// The data's field with a holder record's time (Unix seconds).
pub const SINCE_FIELD: &str = "since";

/// The Application Specific Information data of a version's or a holder record's object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppInfo {
    /// The data's version: 1 when it has no `format=` pair.
    pub format: u64,
    /// `created=`: a version's staging time, Unix seconds (0: absent or malformed).
    pub created_at: u64,
    /// `history=`: `(version, created_at)` of the versions known at staging (malformed entries
    /// skipped).
    pub history: Vec<(u64, u64)>,
    /// `since=`: a holder record's time, Unix seconds (0: absent or malformed).
    pub since: u64,
}

impl AppInfo {
    /// Reads the data `data`; `document` names the KMS instance, key and object in a refusal.
    ///
    /// Errors: [`ReadError::Newer`] for a `format=` above [`VERSION`]; [`ReadError::Invalid`]
    /// for a `format=` that is not a whole number (other malformed pairs are skipped, as
    /// version 1 did).
    pub fn parse(data: &str, document: &str) -> Result<AppInfo, ReadError> {
        let mut info = AppInfo {
            format: 1,
            ..AppInfo::default()
        };
        for (field, value) in data.split(';').filter_map(|f| f.split_once('=')) {
            let value = value.trim();
            match field.trim() {
                FORMAT_FIELD => {
                    info.format = value.parse().map_err(|_| {
                        ReadError::Invalid(format!("format={value} is not a whole number"))
                    })?;
                }
                CREATED_FIELD => info.created_at = value.parse().unwrap_or(0),
                HISTORY_FIELD => info.history.extend(parse_history(value)),
                SINCE_FIELD => info.since = value.parse().unwrap_or(0),
                _ => {}
            }
        }
        crate::format::check_version(&FORMAT, document, info.format, VERSION)
            .map_err(ReadError::Newer)?;
        Ok(info)
    }

    /// The data of a version's object as this keyplan writes it:
    /// `format=2;created=<unix>;history=<N>@<unix>,...`.
    pub fn version_text(created_at: u64, history: &[(u64, u64)]) -> String {
        let list: Vec<String> = history.iter().map(|(v, t)| format!("{v}@{t}")).collect();
        format!(
            "{FORMAT_FIELD}={VERSION};{CREATED_FIELD}={created_at};{HISTORY_FIELD}={}",
            list.join(",")
        )
    }

    /// The data of a holder record's object as this keyplan writes it: `format=2;since=<unix>`.
    pub fn holder_text(since: u64) -> String {
        format!("{FORMAT_FIELD}={VERSION};{SINCE_FIELD}={since}")
    }
}

/// `"1@1790000000,2@1795000000"` as (version, created_at) pairs; malformed entries and version
/// 0 are skipped.
pub fn parse_history(list: &str) -> Vec<(u64, u64)> {
    list.split(',')
        .filter_map(|e| {
            let (v, t) = e.split_once('@')?;
            Some((v.trim().parse().ok()?, t.trim().parse().ok()?))
        })
        .filter(|&(v, _)| v > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_1_data_reads_and_newer_is_refused() {
        let v1 = AppInfo::parse("created=1700000000;history=1@1690000000,x@y", "o").unwrap();
        assert_eq!(
            v1,
            AppInfo {
                format: 1,
                created_at: 1_700_000_000,
                history: vec![(1, 1_690_000_000)],
                since: 0
            }
        );
        let text = AppInfo::version_text(1_700_000_000, &[(1, 1_690_000_000)]);
        assert_eq!(text, "format=2;created=1700000000;history=1@1690000000");
        assert_eq!(AppInfo::parse(&text, "o").unwrap().format, 2);
        assert_eq!(
            AppInfo::parse(&AppInfo::holder_text(5), "o").unwrap().since,
            5
        );
        assert!(matches!(
            AppInfo::parse("format=3;since=1", "o"),
            Err(ReadError::Newer(n)) if n.found == "3"
        ));
    }
}
