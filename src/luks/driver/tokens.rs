//! LUKS2 tokens: `cryptsetup token import` and `token remove`.

use std::ffi::OsString;
use std::path::Path;

use super::{check_device, failed, MAX_IDS};
use crate::luks::door::refused;
use crate::luks::{dump, Cryptsetup, LuksError, LuksVersion};

impl Cryptsetup {
    /// Stores token `json` in the LUKS2 header of `dev` (cryptsetup-token(8), `import`):
    /// `cryptsetup token import --json-file - --token-id ID [--token-replace] DEV` with the JSON
    /// on stdin. With `token_id` `Some`, that id is written, replacing a token already there
    /// (`--token-replace`); with `None`, the lowest free id of a fresh dump is used. Returns the
    /// id written. Adds 0 PBKDF runs.
    ///
    /// `json` must be an object with a string `type` and a `keyslots` array of decimal strings
    /// naming occupied keyslots (checked here against a fresh dump; cryptsetup checks it too).
    ///
    /// Errors: [`LuksError::Refused`] (nothing run) for a LUKS1 device, malformed JSON, a
    /// keyslot that is not occupied, `token_id` ≥ 32 or no free id; errors of [`Self::dump`];
    /// [`LuksError::Failed`] when cryptsetup fails (exit 1, also when the JSON metadata area is
    /// too small for the token).
    pub fn token_import(
        &self,
        dev: &Path,
        token_id: Option<u32>,
        json: &serde_json::Value,
    ) -> Result<u32, LuksError> {
        let operation = match token_id {
            Some(id) => format!("token import as token {id}"),
            None => "token import".to_owned(),
        };
        let keyslots = token_keyslots(json).map_err(|m| refused(&operation, dev, &m))?;
        if let Some(id) = token_id {
            if id >= MAX_IDS {
                return Err(refused(
                    &operation,
                    dev,
                    &format!("token id {id} is out of range (LUKS2 tokens are 0-31)"),
                ));
            }
        }
        let header = self.dump(dev)?;
        if header.version != LuksVersion::Luks2 {
            return Err(refused(
                &operation,
                dev,
                "the device is LUKS1, which has no tokens",
            ));
        }
        if let Some(missing) = keyslots.iter().find(|k| !header.keyslots.contains_key(k)) {
            return Err(refused(
                &operation,
                dev,
                &format!("the token names keyslot {missing}, which is empty"),
            ));
        }
        let id = match token_id {
            Some(id) => id,
            None => (0..MAX_IDS)
                .find(|i| !header.tokens.contains_key(i))
                .ok_or_else(|| refused(&operation, dev, "all 32 token ids are in use"))?,
        };
        let operation = format!("token import as token {id}");
        let mut argv: Vec<OsString> = [
            "token",
            "import",
            "--json-file",
            "-",
            "--token-id",
            &id.to_string(),
        ]
        .into_iter()
        .map(OsString::from)
        .collect();
        if token_id.is_some() {
            argv.push("--token-replace".into());
        }
        argv.push(dev.as_os_str().to_owned());
        let body =
            serde_json::to_vec(json).map_err(|e| refused(&operation, dev, &e.to_string()))?;
        let out = self.exec(argv, Some(&body), None)?;
        if out.success() {
            Ok(id)
        } else {
            Err(failed(
                &operation,
                dev,
                &out,
                Some(
                    "keyslots were left untouched; a full LUKS2 metadata area also fails this way",
                ),
            ))
        }
    }

    /// Removes token `token_id` from the LUKS2 header of `dev` (cryptsetup-token(8), `remove`):
    /// `cryptsetup token remove --token-id ID DEV`. Adds 0 PBKDF runs.
    ///
    /// Errors: [`LuksError::Refused`] (nothing run) for `token_id` ≥ 32;
    /// [`LuksError::Device`] for a missing path or directory; [`LuksError::Failed`] when
    /// cryptsetup fails (exit 1 when the token is not in use or the device is LUKS1).
    pub fn token_remove(&self, dev: &Path, token_id: u32) -> Result<(), LuksError> {
        let operation = format!("token remove of token {token_id}");
        if token_id >= MAX_IDS {
            return Err(refused(
                &operation,
                dev,
                &format!("token id {token_id} is out of range (LUKS2 tokens are 0-31)"),
            ));
        }
        check_device(dev)?;
        let argv: Vec<OsString> = vec![
            "token".into(),
            "remove".into(),
            "--token-id".into(),
            token_id.to_string().into(),
            dev.as_os_str().to_owned(),
        ];
        let out = self.exec(argv, None, None)?;
        if out.success() {
            Ok(())
        } else {
            Err(failed(
                &operation,
                dev,
                &out,
                Some("keyslots and other tokens were left untouched"),
            ))
        }
    }
}

/// The keyslot numbers of a token JSON object; errors describe what is malformed.
fn token_keyslots(json: &serde_json::Value) -> Result<Vec<u32>, String> {
    let object = json.as_object().ok_or("the token JSON is not an object")?;
    match object.get("type").and_then(serde_json::Value::as_str) {
        Some(t) if !t.is_empty() => {}
        _ => return Err("the token JSON has no non-empty string \"type\"".to_owned()),
    }
    object
        .get("keyslots")
        .and_then(serde_json::Value::as_array)
        .ok_or("the token JSON has no \"keyslots\" array")?
        .iter()
        .map(|v| dump::number_string(v, "token keyslot"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_json_checks() -> Result<(), String> {
        let ok = serde_json::json!({"type": "keyplan", "keyslots": ["1", "3"]});
        assert_eq!(token_keyslots(&ok)?, [1, 3]);
        for bad in [
            serde_json::json!([]),
            serde_json::json!({"keyslots": []}),
            serde_json::json!({"type": "", "keyslots": []}),
            serde_json::json!({"type": "k"}),
            serde_json::json!({"type": "k", "keyslots": [1]}),
        ] {
            assert!(token_keyslots(&bad).is_err(), "{bad}");
        }
        Ok(())
    }
}
