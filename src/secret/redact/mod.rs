//! Redaction of known key material from everything keyplan prints or writes.
//!
//! A KMS helper or server that quotes its request in an error hands keyplan's diagnostics the
//! material keyplan sent it, in whatever encoding the request carried. So every
//! [`Passphrase`](super::Passphrase) keyplan creates (a KMS read, a generated version, an
//! `enroll_with` file) is [`register`]ed here, and every sink that prints or writes text runs it
//! through [`redact`] first: the CLI's stdout and stderr, the tracing writer ([`Redacting`]),
//! the journal, saved plans, the agent's node reports and Kubernetes Events, and the `exec`
//! provider's quotes of its helper. Each form keyplan can compute of a registered
//! material becomes [`REDACTED`]:
//!
//! - the raw bytes, the raw bytes without surrounding ASCII whitespace (a passphrase file's
//!   trailing newline), and for material that is not UTF-8 its lossy UTF-8 text;
//! - that text (and the trimmed one) as a JSON string and as a Rust `Debug` string quote it
//!   (escapes, no quotes), once or twice in either order (a `Debug`-quoted error inside a
//!   JSON document);
//! - base64: standard and URL-safe alphabets, each with and without padding;
//! - hex, lower and upper case, plain and with a space or `:` between bytes;
//! - the bytes as decimal numbers separated by `,` and by `, ` (a JSON array, `Debug` of bytes);
//! - for material that is itself base64 text (keyplan's generated passphrases: 32 random bytes
//!   in standard base64), the bytes it encodes, as hex (the same six ways) and as base64 in
//!   both alphabets, padded and not (a helper that decodes the passphrase and quotes it).
//!
//! **No copies of secrets.** The registry keeps, per form, only its length, a salted SHA-256
//! digest (a random salt per process, from the operating system's random source), a 64-bit
//! polynomial hash with a random base (a prefilter: each window of a text is hashed in O(1) as
//! it slides, and only a window whose polynomial hash is known is digested) and the class of
//! characters it is made of (windows holding other characters are skipped unhashed). Neither
//! hash gives back material of the length keyplan generates; the forms are computed in
//! zeroizing buffers and the hashers wipe their state (sha2's `zeroize` feature). A
//! long-running agent thus holds no material beyond the [`Passphrase`](super::Passphrase)s it
//! is using.
//!
//! **Bounds.** Material shorter than [`MIN_BYTES`] is not registered (redacting three common
//! characters everywhere would garble every message, and no LUKS passphrase is that short).
//! The registry holds at most [`MAX_SECRETS`] materials; registering another evicts the one
//! registered (or registered again: every KMS read of a version refreshes it) longest ago, so
//! what an agent uses stays known. Duplicates are one entry.
//!
//! **Limits.** Only material this process learned is redacted: `keyplan status` reads no
//! material, so it cannot recognise any. A form cut in two (a line wrapped inside it, a
//! message truncated inside it) is not recognised, so truncating sinks redact before they cut.

mod forms;
mod registry;

use std::borrow::Cow;
use std::io;
use std::sync::{LazyLock, Mutex, MutexGuard, PoisonError};

use zeroize::Zeroizing;

use registry::Registry;

/// What a form of known material is replaced with.
pub const REDACTED: &str = "<redacted>";

/// Shortest material (bytes) that is registered.
pub const MIN_BYTES: usize = 4;

/// Most materials the process-wide registry remembers (a generated passphrase has about 20
/// distinct forms, about 2 KiB of hashes and map entries; text with quotes or control
/// characters up to 25, about 3 KiB); the one registered longest ago is forgotten first.
pub const MAX_SECRETS: usize = 1024;

/// The process-wide registry.
static REGISTRY: LazyLock<Mutex<Registry>> =
    LazyLock::new(|| Mutex::new(Registry::new(MAX_SECRETS)));

fn global() -> MutexGuard<'static, Registry> {
    // A panic while the lock was held leaves the maps consistent (every update completes
    // before the next can start), so a poisoned lock is still usable.
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Remembers `material` (at least [`MIN_BYTES`] long; shorter is ignored) so that every form
/// of it is redacted from now on. Registering known material again only marks it as recently
/// used. Cost: one salted SHA-256 for known material; about twenty hashes of short strings
/// for new material.
pub fn register(material: &[u8]) {
    global().register(material);
}

/// `text` with every form of every registered material replaced by [`REDACTED`] (borrowed when
/// nothing was found). Overlapping or adjacent finds become one [`REDACTED`].
pub fn redact(text: &str) -> Cow<'_, str> {
    match global().find(text.as_bytes()) {
        None => Cow::Borrowed(text),
        // A material that is not UTF-8 can match from inside a character; the cut character
        // then shows as U+FFFD.
        Some(bytes) => Cow::Owned(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }),
    }
}

/// `text` with the user name and password of a URL replaced by `***` (`http://***@host/`) and
/// its query by `***` (`?***`: tokens travel there), when `text` is a URL that holds them, or
/// an option that ends with one (`--endpoint=https://u:p@host`); otherwise `text` as it is.
/// For messages that quote a configured address or a helper's command line: credentials
/// written into a URL are never repeated (a plan file's own line, shown by a diagnostic, is
/// the user's text, not ours).
pub fn url_credentials(text: &str) -> Cow<'_, str> {
    if let Some((option, value)) = text.split_once('=') {
        if let Cow::Owned(v) = url_credentials(value) {
            return Cow::Owned(format!("{option}={v}"));
        }
    }
    match url::Url::parse(text.trim()) {
        Ok(mut u)
            if !u.cannot_be_a_base()
                && (!u.username().is_empty() || u.password().is_some() || u.query().is_some()) =>
        {
            if !u.username().is_empty() || u.password().is_some() {
                let _ = u.set_username("***");
                let _ = u.set_password(None);
            }
            if u.query().is_some() {
                u.set_query(Some("***"));
            }
            Cow::Owned(u.to_string())
        }
        _ => Cow::Borrowed(text),
    }
}

/// [`redact`] of bytes (a child's standard error, a formatted log line).
pub fn redact_bytes(bytes: &[u8]) -> Cow<'_, [u8]> {
    match global().find(bytes) {
        None => Cow::Borrowed(bytes),
        Some(out) => Cow::Owned(out),
    }
}

/// [`redact`] of one serialized JSON document (a journal line, a node report, a saved plan),
/// keeping it valid JSON: a form inside a string is replaced in place; should a replacement
/// break the document (a form spanning its syntax, such as material written as an array of
/// numbers, which keyplan never does), every string of the document is redacted on its own
/// instead and the document serialized again (compactly).
pub fn redact_json(json: &str) -> Cow<'_, str> {
    let out = redact(json);
    if matches!(out, Cow::Borrowed(_))
        || serde_json::from_str::<serde::de::IgnoredAny>(&out).is_ok()
    {
        return out;
    }
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(mut v) => {
            redact_strings(&mut v);
            Cow::Owned(serde_json::to_string(&v).unwrap_or_else(|_| out.into_owned()))
        }
        // Not JSON to begin with: the text redaction is all there is to do.
        Err(_) => out,
    }
}

fn redact_strings(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => {
            if let Cow::Owned(r) = redact(s) {
                *s = r;
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(redact_strings),
        serde_json::Value::Object(o) => {
            let keys: Vec<String> = o.keys().cloned().collect();
            for k in keys {
                if let Some(mut value) = o.remove(&k) {
                    redact_strings(&mut value);
                    o.insert(redact(&k).into_owned(), value);
                }
            }
        }
        _ => {}
    }
}

/// A [`tracing_subscriber::fmt::MakeWriter`] whose writers redact: each writer collects what
/// the formatter writes (one whole event) and passes it on through [`redact_bytes`] when it is
/// flushed or dropped. Logs at every level and in every format go through it.
#[derive(Debug, Clone)]
pub struct Redacting<M>(pub M);

impl<'a, M: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for Redacting<M>
{
    type Writer = RedactingWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        RedactingWriter::new(self.0.make_writer())
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        RedactingWriter::new(self.0.make_writer_for(meta))
    }
}

/// One event's writer of [`Redacting`]: buffers, and writes the redacted text to `inner` on
/// flush and drop (write errors there are ignored, as tracing's own writers do).
pub struct RedactingWriter<W: io::Write> {
    inner: W,
    buf: Zeroizing<Vec<u8>>,
}

impl<W: io::Write> RedactingWriter<W> {
    /// A writer passing redacted text on to `inner`.
    pub fn new(inner: W) -> Self {
        RedactingWriter {
            inner,
            buf: Zeroizing::new(Vec::new()),
        }
    }

    fn pass_on(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let result = self.inner.write_all(&redact_bytes(&self.buf));
        self.buf.clear();
        result
    }
}

impl<W: io::Write> io::Write for RedactingWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.pass_on()?;
        self.inner.flush()
    }
}

impl<W: io::Write> Drop for RedactingWriter<W> {
    fn drop(&mut self) {
        let _ = self.pass_on();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use base64::Engine as _;

    fn hex(m: &[u8]) -> String {
        m.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn credentials_in_a_url_are_never_quoted() {
        let e = url_credentials("http://alice:hunter2@127.0.0.1:1/v1");
        assert_eq!(e, "http://***@127.0.0.1:1/v1");
        assert!(matches!(
            url_credentials("https://host:1"),
            Cow::Borrowed(_)
        ));
        assert!(matches!(url_credentials("--prefix"), Cow::Borrowed(_)));
        assert_eq!(url_credentials("ftp://:pw@h"), "ftp://***@h/");
        assert_eq!(
            url_credentials("--endpoint=https://svc:pw@kms.example"),
            "--endpoint=https://***@kms.example/"
        );
        assert_eq!(url_credentials("https://h/?token=QTOKEN"), "https://h/?***");
        assert!(matches!(
            url_credentials("--name=osd-kek"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn global_registry_json_and_the_log_writer() {
        let m = b"global-registry-test-material-7f3a";
        register(m);
        let b64 = STANDARD.encode(m);
        assert_eq!(redact(&format!("a {b64} b")), "a <redacted> b");
        assert!(matches!(redact("nothing here"), Cow::Borrowed(_)));
        assert_eq!(
            redact_bytes(&[b"x".as_slice(), m, b"y"].concat()).as_ref(),
            b"x<redacted>y"
        );
        // JSON stays valid.
        let doc = serde_json::json!({"error": format!("denied: {}", hex(m)), "n": 3}).to_string();
        let out = redact_json(&doc);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["error"], "denied: <redacted>");
        // A form spanning the document's syntax: each string is redacted on its own instead.
        let numbers = m
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let doc = format!(
            "{{\"a\":[{numbers}],\"b\":\"{}\"}}",
            String::from_utf8_lossy(m)
        );
        let out = redact_json(&doc);
        let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
        assert_eq!(v["b"], "<redacted>");
        // The log writer redacts each event.
        let sink = std::sync::Arc::new(Mutex::new(Vec::<u8>::new()));
        struct Sink(std::sync::Arc<Mutex<Vec<u8>>>);
        impl io::Write for Sink {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let make = {
            let sink = sink.clone();
            Redacting(move || Sink(sink.clone()))
        };
        for json in [false, true] {
            let builder = tracing_subscriber::fmt()
                .with_writer(make.clone())
                .with_max_level(tracing::Level::TRACE);
            let dispatch: tracing::Dispatch = if json {
                builder.json().finish().into()
            } else {
                builder.finish().into()
            };
            tracing::dispatcher::with_default(&dispatch, || {
                tracing::trace!(detail = %URL_SAFE_NO_PAD.encode(m), "helper said {}", hex(m).to_uppercase());
                tracing::warn!(quoted = ?String::from_utf8_lossy(m), "done");
            });
        }
        let logged = String::from_utf8(sink.lock().unwrap().clone()).unwrap();
        assert_eq!(logged.lines().count(), 4, "{logged}");
        assert!(!logged.contains("global-registry"), "{logged}");
        assert!(!logged.contains(&hex(m).to_uppercase()), "{logged}");
        assert!(!logged.contains(&URL_SAFE_NO_PAD.encode(m)), "{logged}");
        // Text and JSON: the message and the field of the first event, the field of the second.
        assert_eq!(logged.matches("<redacted>").count(), 6, "{logged}");
    }
}
