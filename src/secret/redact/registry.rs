//! The registry of known material: the salted hashes of every form of each registered
//! material, and the scan that finds them in a text (see the module documentation of
//! [`super`]).

use std::collections::{BTreeMap, HashMap};

use rand::TryRngCore as _;
use sha2::{Digest as _, Sha256};
use zeroize::Zeroizing;

use super::forms::forms_of;
use super::{MIN_BYTES, REDACTED};

/// A salted SHA-256 digest.
type Digest = [u8; 32];

/// Slots of the prefilter table (a power of two).
const FILTER_SLOTS: usize = 1 << 16;

/// One form of a registered material.
#[derive(Debug, Clone, Copy)]
struct Form {
    len: usize,
    rolling: u64,
    digest: Digest,
    class: Class,
}

/// The kind of characters a form is made of: a window holding a byte outside the classes of
/// every form of its length cannot match, so scans skip past it without hashing. (Classes, not
/// the forms' actual bytes, so that the registry learns nothing of the material from them.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    HexLower,
    HexUpper,
    Decimal,
    Base64,
    Base64Url,
    Any,
}

impl Class {
    const ALL: [Class; 6] = [
        Class::HexLower,
        Class::HexUpper,
        Class::Decimal,
        Class::Base64,
        Class::Base64Url,
        Class::Any,
    ];

    /// Whether `b` is of this class.
    fn admits(self, b: u8) -> bool {
        match self {
            Class::HexLower => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
            Class::HexUpper => b.is_ascii_digit() || (b'A'..=b'F').contains(&b),
            Class::Decimal => b.is_ascii_digit() || b == b',' || b == b' ',
            Class::Base64 => b.is_ascii_alphanumeric() || b"+/=".contains(&b),
            Class::Base64Url => b.is_ascii_alphanumeric() || b"-_=".contains(&b),
            Class::Any => true,
        }
    }

    /// The narrowest class of `form`.
    fn of(form: &[u8]) -> Class {
        Class::ALL
            .into_iter()
            .find(|c| form.iter().all(|&b| c.admits(b)))
            .unwrap_or(Class::Any)
    }
}

/// The forms of one length: how many, how many of each [`Class`], which classes (a bit per
/// class, so lengths admitting the same bytes share their scan for runs), the bytes those
/// classes admit, and `base^(len - 1)` (what rolling the hash by one byte takes out).
struct Length {
    forms: u32,
    classes: [u32; Class::ALL.len()],
    mask: u8,
    admitted: [bool; 256],
    pow: u64,
}

impl Length {
    fn new(len: usize, base: u64) -> Length {
        Length {
            forms: 0,
            classes: [0; Class::ALL.len()],
            mask: 0,
            admitted: [false; 256],
            pow: power(base, len.saturating_sub(1) as u64),
        }
    }

    /// Counts `class` in (`add`) or out; recomputes the admitted bytes when a class appears or
    /// disappears.
    fn count(&mut self, class: Class, add: bool) {
        let i = Class::ALL.iter().position(|c| *c == class).unwrap_or(0);
        let before = self.classes[i];
        if add {
            self.forms += 1;
            self.classes[i] += 1;
        } else {
            self.forms = self.forms.saturating_sub(1);
            self.classes[i] = self.classes[i].saturating_sub(1);
        }
        if (before == 0) == (self.classes[i] == 0) {
            return;
        }
        self.mask ^= 1 << i;
        for (b, admitted) in self.admitted.iter_mut().enumerate() {
            *admitted = Class::ALL
                .iter()
                .zip(self.classes)
                .any(|(c, n)| n > 0 && c.admits(b as u8));
        }
    }
}

/// A registered material: its forms and when it was last registered.
#[derive(Debug)]
struct Known {
    tick: u64,
    forms: Vec<Form>,
}

/// Known material, as hashes of its forms (see the module documentation of [`super`]). The
/// maps count references, so that forgetting one material leaves another's identical form
/// known.
pub(crate) struct Registry {
    cap: usize,
    salt: [u8; 32],
    base: u64,
    tick: u64,
    /// By the digest of the raw material.
    secrets: HashMap<Digest, Known>,
    /// Registration tick -> material, oldest first.
    order: BTreeMap<u64, Digest>,
    /// Counts per slot of (length, polynomial hash): a cheap first test of each window.
    filter: Vec<u16>,
    windows: HashMap<(usize, u64), u32>,
    digests: HashMap<Digest, u32>,
    lengths: BTreeMap<usize, Length>,
}

impl Registry {
    /// An empty registry remembering at most `cap` materials, with a fresh random salt and
    /// polynomial base.
    pub(crate) fn new(cap: usize) -> Registry {
        let mut seed = Zeroizing::new([0u8; 40]);
        if rand::rngs::OsRng.try_fill_bytes(&mut seed[..]).is_err() {
            // The OS random source failed: a salt from the clock, the process id and an
            // address is still unique to this process, which is what it is for.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default();
            let mut h = Sha256::new();
            h.update(now.to_le_bytes());
            h.update(std::process::id().to_le_bytes());
            h.update((&raw const seed as usize).to_le_bytes());
            let d: Digest = h.finalize().into();
            seed[..32].copy_from_slice(&d);
            seed[32..].copy_from_slice(&d[..8]);
        }
        let mut salt = [0u8; 32];
        salt.copy_from_slice(&seed[..32]);
        let mut b = [0u8; 8];
        b.copy_from_slice(&seed[32..]);
        // An odd base of at least 2^63: far from the small values that make collisions likely,
        // and invertible modulo 2^64.
        let base = u64::from_le_bytes(b) | (1 << 63) | 1;
        Registry {
            cap: cap.max(1),
            salt,
            base,
            tick: 0,
            secrets: HashMap::new(),
            order: BTreeMap::new(),
            filter: vec![0; FILTER_SLOTS],
            windows: HashMap::new(),
            digests: HashMap::new(),
            lengths: BTreeMap::new(),
        }
    }

    /// How many materials are known.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.secrets.len()
    }

    fn digest(&self, bytes: &[u8]) -> Digest {
        let mut h = Sha256::new();
        h.update(self.salt);
        h.update(bytes);
        h.finalize().into()
    }

    fn slot(len: usize, rolling: u64) -> usize {
        let mixed = rolling ^ (len as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (mixed as usize) & (FILTER_SLOTS - 1)
    }

    /// See [`super::register`].
    pub(crate) fn register(&mut self, material: &[u8]) {
        if material.len() < MIN_BYTES {
            return;
        }
        let id = self.digest(material);
        self.tick += 1;
        if let Some(known) = self.secrets.get_mut(&id) {
            self.order.remove(&known.tick);
            known.tick = self.tick;
            self.order.insert(self.tick, id);
            return;
        }
        let mut forms: Vec<Form> = Vec::new();
        for f in forms_of(material) {
            if f.len() < MIN_BYTES {
                continue;
            }
            let digest = self.digest(&f);
            if forms.iter().any(|g| g.digest == digest) {
                continue;
            }
            forms.push(Form {
                len: f.len(),
                rolling: poly(self.base, &f),
                digest,
                class: Class::of(&f),
            });
        }
        for f in &forms {
            let slot = &mut self.filter[Self::slot(f.len, f.rolling)];
            *slot = slot.saturating_add(1);
            *self.windows.entry((f.len, f.rolling)).or_default() += 1;
            *self.digests.entry(f.digest).or_default() += 1;
            self.lengths
                .entry(f.len)
                .or_insert_with(|| Length::new(f.len, self.base))
                .count(f.class, true);
        }
        self.secrets.insert(
            id,
            Known {
                tick: self.tick,
                forms,
            },
        );
        self.order.insert(self.tick, id);
        while self.secrets.len() > self.cap {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.forget(&oldest);
        }
    }

    fn forget(&mut self, id: &Digest) {
        let Some(known) = self.secrets.remove(id) else {
            return;
        };
        /// Drops one reference; true when it was the last.
        fn release(count: Option<&mut u32>) -> bool {
            match count {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                _ => true,
            }
        }
        for f in &known.forms {
            let slot = &mut self.filter[Self::slot(f.len, f.rolling)];
            *slot = slot.saturating_sub(1);
            if release(self.windows.get_mut(&(f.len, f.rolling))) {
                self.windows.remove(&(f.len, f.rolling));
            }
            if release(self.digests.get_mut(&f.digest)) {
                self.digests.remove(&f.digest);
            }
            if let Some(length) = self.lengths.get_mut(&f.len) {
                length.count(f.class, false);
                if length.forms == 0 {
                    self.lengths.remove(&f.len);
                }
            }
        }
    }

    /// `text` with every known form replaced, or `None` when it holds none.
    pub(crate) fn find(&self, text: &[u8]) -> Option<Vec<u8>> {
        let mut hits: Vec<(usize, usize)> = Vec::new();
        // The runs of admitted bytes (start, end), per set of classes: a window can only
        // match inside a run at least as long as it.
        let mut runs: Vec<(u8, Vec<(usize, usize)>)> = Vec::new();
        for (&len, length) in &self.lengths {
            if len > text.len() {
                // Lengths are in ascending order.
                break;
            }
            let at = match runs.iter().position(|(m, _)| *m == length.mask) {
                Some(at) => at,
                None => {
                    runs.push((length.mask, runs_of(text, &length.admitted)));
                    runs.len() - 1
                }
            };
            let pow = length.pow;
            for &(from, to) in runs[at].1.iter().filter(|(from, to)| to - from >= len) {
                let mut h = poly(self.base, &text[from..from + len]);
                for start in from..=to - len {
                    if start > from {
                        h = roll(h, text[start - 1], text[start + len - 1], self.base, pow);
                    }
                    if self.filter[Self::slot(len, h)] == 0 || !self.windows.contains_key(&(len, h))
                    {
                        continue;
                    }
                    if self
                        .digests
                        .contains_key(&self.digest(&text[start..start + len]))
                    {
                        hits.push((start, start + len));
                    }
                }
            }
        }
        if hits.is_empty() {
            return None;
        }
        hits.sort_unstable();
        let mut out = Vec::with_capacity(text.len());
        let mut at = 0;
        let mut i = 0;
        while i < hits.len() {
            let (start, mut end) = hits[i];
            i += 1;
            while i < hits.len() && hits[i].0 <= end {
                end = end.max(hits[i].1);
                i += 1;
            }
            out.extend_from_slice(&text[at..start]);
            out.extend_from_slice(REDACTED.as_bytes());
            at = end;
        }
        out.extend_from_slice(&text[at..]);
        Some(out)
    }
}

/// The maximal runs `(start, end)` of bytes of `text` that `admitted` admits.
fn runs_of(text: &[u8], admitted: &[bool; 256]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut from = None;
    for (i, &b) in text.iter().enumerate() {
        match (admitted[usize::from(b)], from) {
            (true, None) => from = Some(i),
            (false, Some(f)) => {
                runs.push((f, i));
                from = None;
            }
            _ => {}
        }
    }
    if let Some(f) = from {
        runs.push((f, text.len()));
    }
    runs
}

/// The hash of the window one byte further: `out` leaves it, `inn` enters it; `pow` is
/// `base^(len - 1)`.
fn roll(h: u64, out: u8, inn: u8, base: u64, pow: u64) -> u64 {
    h.wrapping_sub((u64::from(out) + 1).wrapping_mul(pow))
        .wrapping_mul(base)
        .wrapping_add(u64::from(inn) + 1)
}

/// `base^exp` modulo 2^64.
fn power(base: u64, mut exp: u64) -> u64 {
    let (mut result, mut b) = (1u64, base);
    while exp > 0 {
        if exp & 1 == 1 {
            result = result.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        exp >>= 1;
    }
    result
}

/// The polynomial hash of `bytes`: the sum of `(byte + 1) * base^(len - 1 - i)` modulo 2^64.
/// (Wrapping arithmetic is cheap; the known weakness of such hashes, strings built to collide,
/// only costs a digest per collision, never a wrong redaction: a window is redacted only when
/// its salted SHA-256 is known.)
fn poly(base: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(0, |h: u64, &b| {
        h.wrapping_mul(base).wrapping_add(u64::from(b) + 1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    use base64::Engine as _;

    fn hex(m: &[u8]) -> String {
        m.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn red(r: &Registry, text: &str) -> String {
        match r.find(text.as_bytes()) {
            Some(b) => String::from_utf8(b).expect("UTF-8"),
            None => text.to_string(),
        }
    }

    /// Material whose base64 differs between the standard and URL-safe alphabets and has
    /// padding (20 bytes: one `=`), and whose hex has letters.
    const M: &[u8] = b"\xfb\xff\xbe-material?>>~\xfa\xfb\xfc\x01";

    /// A generated passphrase (base64 of 32 random bytes): the bytes it encodes, as a helper
    /// that decodes it would quote them, and spaced or colon-separated hex (a new user's
    /// finding, issue 29).
    #[test]
    fn a_base64_passphrase_is_redacted_as_the_bytes_it_encodes() {
        let bytes: Vec<u8> = (0u8..32)
            .map(|i| i.wrapping_mul(37).wrapping_add(0xf9))
            .collect();
        let pass = STANDARD.encode(&bytes);
        let mut r = Registry::new(8);
        r.register(pass.as_bytes());
        let spaced = |m: &[u8], sep: &str| {
            m.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(sep)
        };
        let forms = [
            hex(&bytes),
            hex(&bytes).to_uppercase(),
            URL_SAFE.encode(&bytes),
            URL_SAFE_NO_PAD.encode(&bytes),
            spaced(&bytes, " "),
            spaced(&bytes, ":").to_uppercase(),
            spaced(pass.as_bytes(), " "),
        ];
        assert_ne!(forms[2], pass, "the alphabets differ for these bytes");
        for form in &forms {
            let got = red(&r, &format!("helper said: [{form}] (exit 1)"));
            assert_eq!(got, "helper said: [<redacted>] (exit 1)", "{form}");
        }
    }

    #[test]
    fn every_form_is_redacted() {
        let mut r = Registry::new(8);
        r.register(M);
        let forms = [
            String::from_utf8_lossy(M).into_owned(),
            STANDARD.encode(M),
            STANDARD_NO_PAD.encode(M),
            URL_SAFE.encode(M),
            URL_SAFE_NO_PAD.encode(M),
            hex(M),
            hex(M).to_uppercase(),
            M.iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(","),
            M.iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            serde_json::to_string(&String::from_utf8_lossy(M)).unwrap(),
            format!("{:?}", String::from_utf8_lossy(M)),
        ];
        assert_ne!(forms[1], forms[3], "the alphabets differ");
        assert_ne!(forms[1], forms[2], "padding");
        for form in &forms {
            let text = format!("helper said: [{form}] (exit 1)");
            let got = red(&r, &text);
            assert!(!got.contains(form.as_str()), "{form}: {got}");
            assert!(got.contains("<redacted>"), "{form}: {got}");
            assert!(got.starts_with("helper said: ["), "{got}");
            assert!(got.ends_with("] (exit 1)"), "{got}");
            // Inside a longer run of characters of its kind (the scan rolls through it).
            // (The JSON and Debug quotes keep their quotation marks.)
            let got = red(&r, &format!("Zz09{form}Zz09"));
            let bare = form.trim_matches('"');
            assert_eq!(got, format!("Zz09{}Zz09", form.replace(bare, "<redacted>")));
        }
        // Raw bytes, in bytes.
        let mut text = b"stderr: ".to_vec();
        text.extend_from_slice(M);
        text.extend_from_slice(b"\n");
        assert_eq!(r.find(&text).unwrap(), b"stderr: <redacted>\n");
        // Nothing else is touched.
        assert!(r.find(b"nothing to see here, 0123456789abcdef").is_none());
    }

    #[test]
    fn text_material_and_its_escapes() {
        let mut r = Registry::new(8);
        let m = b"pa\"ss\\phrase\twith\nlines\n";
        r.register(m);
        let text = String::from_utf8_lossy(m);
        for quoted in [
            text.to_string(),
            text.trim_end().to_string(),
            serde_json::to_string(&text).unwrap(),
            format!("{text:?}"),
            format!("{:?}", text.trim_end()),
            // Quoted twice: a `Debug`-quoted message inside a JSON document, and the reverse.
            serde_json::to_string(&format!("error: {text:?}")).unwrap(),
            format!("{:?}", serde_json::to_string(&text.trim_end()).unwrap()),
        ] {
            let got = red(&r, &format!("x {quoted} y"));
            assert!(!got.contains("phrase"), "{quoted:?}: {got:?}");
        }
        // Short material is not registered: redacting it would garble every message.
        let mut r = Registry::new(8);
        r.register(b"abc");
        assert_eq!(r.len(), 0);
        assert_eq!(red(&r, "abc abc"), "abc abc");
        r.register(b"abcd");
        assert_eq!(red(&r, "xabcdx"), "x<redacted>x");
    }

    #[test]
    fn overlaps_and_several_secrets() {
        let mut r = Registry::new(8);
        let a = b"first-secret-AAAA";
        let b = b"second-secret-BBBBBB";
        r.register(a);
        r.register(b);
        // Adjacent, and each in two forms.
        let text = format!(
            "{}{} and {} / {}",
            String::from_utf8_lossy(a),
            String::from_utf8_lossy(b),
            STANDARD.encode(a),
            hex(b)
        );
        assert_eq!(red(&r, &text), "<redacted> and <redacted> / <redacted>");
        // Overlapping: b's raw form starts inside a's.
        let mut r = Registry::new(8);
        r.register(b"abcdefgh");
        r.register(b"efghijkl");
        assert_eq!(red(&r, "0abcdefghijkl1"), "0<redacted>1");
        // Padded and unpadded base64 overlap (same start): one replacement.
        let mut r = Registry::new(8);
        r.register(b"twenty-byte-material");
        let padded = STANDARD.encode(b"twenty-byte-material");
        assert!(padded.ends_with('='));
        assert_eq!(red(&r, &format!("[{padded}]")), "[<redacted>]");
        // Repeated occurrences.
        assert_eq!(
            red(&r, "twenty-byte-material,twenty-byte-material."),
            "<redacted>,<redacted>."
        );
    }

    #[test]
    fn non_utf8_material() {
        let mut r = Registry::new(8);
        let m: &[u8] = &[0xff, 0x00, 0x80, b'k', b'e', b'y', 0xc3];
        r.register(m);
        let mut bytes = b"<<".to_vec();
        bytes.extend_from_slice(m);
        bytes.extend_from_slice(b">>");
        assert_eq!(r.find(&bytes).unwrap(), b"<<<redacted>>>");
        // As lossy text, and that text as JSON and Debug quote it.
        let lossy = String::from_utf8_lossy(m).into_owned();
        for quoted in [
            lossy.clone(),
            serde_json::to_string(&lossy).unwrap(),
            format!("{lossy:?}"),
            STANDARD.encode(m),
            URL_SAFE_NO_PAD.encode(m),
            hex(m).to_uppercase(),
        ] {
            let got = red(&r, &format!("<{quoted}>"));
            assert!(!got.contains("key"), "{quoted:?}: {got:?}");
            assert!(got.contains("<redacted>"), "{quoted:?}: {got:?}");
        }
        // A match from inside a character leaves valid UTF-8 through `redact`.
        let mut r = Registry::new(8);
        r.register(&[0xa9, b'a', b'b', b'c']);
        let got = r.find("é abc / éabc".as_bytes()).unwrap();
        assert_eq!(String::from_utf8_lossy(&got), "é abc / \u{fffd}<redacted>");
    }

    #[test]
    fn bounded_oldest_forgotten_first_and_deduplicated() {
        let mut r = Registry::new(2);
        r.register(b"secret-one");
        r.register(b"secret-one");
        assert_eq!(r.len(), 1);
        r.register(b"secret-two");
        // Registered again: now the most recent.
        r.register(b"secret-one");
        r.register(b"secret-three");
        assert_eq!(r.len(), 2);
        assert_eq!(red(&r, "secret-one"), "<redacted>");
        assert_eq!(red(&r, "secret-three"), "<redacted>");
        assert_eq!(
            red(&r, "secret-two"),
            "secret-two",
            "the oldest is forgotten"
        );
        // Two materials sharing a form: forgetting one keeps the form known for the other.
        // (The hex of "0000" is "30303030", itself registered as the material "30303030".)
        let mut r = Registry::new(2);
        r.register(b"30303030");
        r.register(b"0000");
        r.register(b"another-secret");
        assert_eq!(r.len(), 2);
        assert_eq!(red(&r, "30303030"), "<redacted>");
        // Many materials: every form of every one is still found (the prefilter and the
        // reference counts stay consistent through evictions).
        let mut r = Registry::new(64);
        for i in 0..500 {
            r.register(format!("material-{i:04}").as_bytes());
        }
        assert_eq!(r.len(), 64);
        assert_eq!(red(&r, "material-0499"), "<redacted>");
        assert_eq!(red(&r, &hex(b"material-0436")), "<redacted>");
        assert_eq!(red(&r, "material-0435"), "material-0435");
        assert_eq!(r.digests.len(), r.windows.len());
        let counted: u32 = r.filter.iter().map(|&n| u32::from(n)).sum();
        let forms: usize = r.secrets.values().map(|k| k.forms.len()).sum();
        assert_eq!(counted as usize, forms);
    }

    #[test]
    fn the_registry_holds_hashes_not_material() {
        let mut r = Registry::new(4);
        let m = b"only-hashes-are-kept-0123456789";
        r.register(m);
        // Every form is represented by its length and two hashes; no field holds bytes of
        // the material.
        let known = r.secrets.values().next().unwrap();
        // Raw, base64 with and without padding (both alphabets agree here), hex in two
        // cases each plain, spaced and colon-separated, decimals with two separators (the
        // material is not canonical base64, so no decoded forms).
        assert_eq!(known.forms.len(), 11);
        let dump = format!("{known:?}");
        assert!(!dump.contains("only-hashes"), "{dump}");
        // Another registry (another process) hashes with another salt.
        let other = Registry::new(4);
        assert_ne!(r.digest(m), other.digest(m));
    }

    #[test]
    fn rolling_hash_matches_direct_hash() {
        let r = Registry::new(1);
        let text = b"the quick brown fox jumps over the lazy dog";
        for len in [1usize, 4, 9, 17] {
            let pow = power(r.base, len as u64 - 1);
            let mut h = poly(r.base, &text[..len]);
            for start in 1..=text.len() - len {
                h = roll(h, text[start - 1], text[start + len - 1], r.base, pow);
                assert_eq!(h, poly(r.base, &text[start..start + len]), "{len} {start}");
            }
        }
    }
}
