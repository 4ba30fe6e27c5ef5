//! The forms of a material: every encoding of it keyplan can compute (raw, trimmed, text,
//! JSON and `Debug` quotes, base64, hex, decimal, and the bytes a base64 text encodes).

use std::fmt::Write as _;

use base64::Engine as _;
use zeroize::Zeroizing;

use super::MIN_BYTES;

/// Every form of `m` keyplan can compute (see the module documentation of [`super`]), each in
/// a zeroizing buffer allocated at its final size (no reallocation leaves a copy behind).
/// Duplicates are possible (e.g. padded base64 of a multiple of 3 bytes is the unpadded one).
pub(super) fn forms_of(m: &[u8]) -> Vec<Zeroizing<Vec<u8>>> {
    let copy = |b: &[u8]| Zeroizing::new(b.to_vec());
    let mut out = vec![copy(m)];
    let trimmed = m.trim_ascii();
    if trimmed.len() != m.len() {
        out.push(copy(trimmed));
    }
    for raw in [m, trimmed] {
        // The material as text: lossy when it is not UTF-8.
        let mut text = Zeroizing::new(String::with_capacity(3 * raw.len()));
        for chunk in raw.utf8_chunks() {
            text.push_str(chunk.valid());
            if !chunk.invalid().is_empty() {
                text.push(char::REPLACEMENT_CHARACTER);
            }
        }
        if text.as_bytes() != raw {
            out.push(copy(text.as_bytes()));
        }
        // ... quoted in JSON (serde_json: tracing's JSON logs, the journal, reports) or by
        // Rust's `Debug` of a string (`{:?}`), without the quotes; and such a quote quoted
        // again (a `Debug`-quoted error inside a JSON document).
        for once in [Quote::Json, Quote::Debug] {
            let Some(first) = quote(once, &text) else {
                continue;
            };
            if first.as_str() == text.as_str() {
                continue;
            }
            out.push(copy(first.as_bytes()));
            for twice in [Quote::Json, Quote::Debug] {
                if let Some(second) = quote(twice, &first) {
                    if second.as_str() != first.as_str() {
                        out.push(copy(second.as_bytes()));
                    }
                }
            }
        }
        if trimmed.len() == m.len() {
            break;
        }
    }
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    if let Some(size) = base64::encoded_len(m.len(), true) {
        for engine in [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD] {
            let mut b = Zeroizing::new(vec![0u8; size]);
            if let Ok(n) = engine.encode_slice(m, &mut b[..]) {
                b.truncate(n);
                out.push(b);
            }
        }
    }
    hex_forms(m, &mut out);
    for sep in [&b","[..], &b", "[..]] {
        let mut d = Zeroizing::new(Vec::with_capacity((3 + sep.len()) * m.len()));
        for (i, &byte) in m.iter().enumerate() {
            if i > 0 {
                d.extend_from_slice(sep);
            }
            let mut n = Zeroizing::new([0u8; 3]);
            let mut k = 0;
            let mut v = byte;
            loop {
                n[k] = b'0' + v % 10;
                k += 1;
                v /= 10;
                if v == 0 {
                    break;
                }
            }
            d.extend(n[..k].iter().rev());
        }
        out.push(d);
    }
    // Material that is base64 text (keyplan's generated passphrases are 32 random bytes in
    // standard base64): the bytes it encodes, in the forms a helper that decodes it would
    // quote (hex, base64 in the other alphabet or padding).
    if let Some(bytes) = decoded(trimmed) {
        hex_forms(&bytes, &mut out);
        if let Some(size) = base64::encoded_len(bytes.len(), true) {
            for engine in [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD] {
                let mut b = Zeroizing::new(vec![0u8; size]);
                if let Ok(n) = engine.encode_slice(&bytes, &mut b[..]) {
                    b.truncate(n);
                    out.push(b);
                }
            }
        }
    }
    out
}

/// Hex forms of `m`: lower and upper case, each plain and with a space or `:` between bytes
/// (`xxd`-, `od`- and fingerprint-style dumps).
fn hex_forms(m: &[u8], out: &mut Vec<Zeroizing<Vec<u8>>>) {
    for digits in [b"0123456789abcdef", b"0123456789ABCDEF"] {
        for sep in [None, Some(b' '), Some(b':')] {
            let mut h = Zeroizing::new(Vec::with_capacity(3 * m.len()));
            for (i, &byte) in m.iter().enumerate() {
                if let (Some(c), true) = (sep, i > 0) {
                    h.push(c);
                }
                h.push(digits[usize::from(byte >> 4)]);
                h.push(digits[usize::from(byte & 0xf)]);
            }
            out.push(h);
        }
    }
}

/// The bytes `text` encodes when all of it is base64 (either alphabet, padded or not) of at
/// least [`MIN_BYTES`] bytes; `None` otherwise.
fn decoded(text: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    if text.len() < 8 {
        return None;
    }
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| {
            let mut buf = Zeroizing::new(vec![0u8; text.len()]);
            let n = engine.decode_slice(text, &mut buf[..]).ok()?;
            buf.truncate(n);
            (n >= MIN_BYTES).then_some(buf)
        })
}

/// How a string is quoted.
#[derive(Clone, Copy)]
enum Quote {
    /// As serde_json writes a string.
    Json,
    /// As Rust's `Debug` of a `str` does (`{:?}`).
    Debug,
}

/// `text` quoted `how`, without the surrounding quotes, in a zeroizing buffer of its final
/// size; `None` if the formatter failed.
fn quote(how: Quote, text: &str) -> Option<Zeroizing<String>> {
    // At most 6 (JSON `\u001f`) or 10 (`\u{10ffff}`) bytes per byte, and the quotes.
    let mut q = Zeroizing::new(String::with_capacity(10 * text.len() + 2));
    match how {
        Quote::Json => {
            let mut buf = Zeroizing::new(Vec::with_capacity(6 * text.len() + 2));
            serde_json::to_writer(&mut *buf, text).ok()?;
            q.push_str(std::str::from_utf8(&buf).ok()?);
        }
        Quote::Debug => write!(q, "{text:?}").ok()?,
    }
    if q.len() < 2 {
        return None;
    }
    let inner = Zeroizing::new(q[1..q.len() - 1].to_string());
    Some(inner)
}
