//! The locator: a second, schema-free reading of the plan document into a tree of nodes that
//! carry byte spans, so that any path (`devices` / `osd0` / `keys` / `1` / `keyslot`) can be
//! mapped back to a place in the file.
//!
//! The tree is built by one hand-written serde visitor that is generic over the format: every
//! child value and every mapping key is deserialized through the format's own span wrapper
//! (`serde_saphyr::Spanned` for YAML, `toml::Spanned` for TOML), which is why the visitor is
//! parameterized by a [`Spanner`]. No untagged enums are involved, so spans survive.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::PathSeg;

/// A byte range in the plan text. YAML block collections have length 0 (only their start is
/// known); scalars and TOML nodes have their full length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    /// Byte offset of the first byte.
    pub start: usize,
    /// Length in bytes (may be 0).
    pub len: usize,
}

impl Span {
    /// One past the last byte.
    pub fn end(&self) -> usize {
        self.start.saturating_add(self.len)
    }
}

/// A node with its span.
#[derive(Debug, Clone)]
pub(crate) struct Located {
    /// Where the node is written.
    pub span: Span,
    /// The node.
    pub node: Node,
}

/// A schema-free document node.
#[derive(Debug, Clone)]
pub(crate) enum Node {
    /// A mapping, in the order the parser reports its entries: `(key, value)`.
    Map(Vec<(Located, Located)>),
    /// A sequence.
    Seq(Vec<Located>),
    /// A scalar, as text (numbers and booleans formatted back).
    Scalar(String),
    /// An empty value (`~`, `null`, nothing).
    Null,
}

/// What a path leads to in the tree.
pub(crate) struct Target<'a> {
    /// The mapping key naming the node, when the last path segment is a key.
    pub key: Option<Span>,
    /// The node itself.
    pub value: &'a Located,
}

/// What lies at a byte offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Hit {
    /// On the mapping key that ends the path.
    Key(Vec<PathSeg>),
    /// On the scalar value at the path.
    Value(Vec<PathSeg>),
    /// Inside the collection at the path, but on none of its children.
    Container(Vec<PathSeg>),
}

impl Hit {
    /// The path, whatever the kind of hit.
    pub fn path(&self) -> &[PathSeg] {
        match self {
            Hit::Key(p) | Hit::Value(p) | Hit::Container(p) => p,
        }
    }
}

impl Located {
    /// The scalar text of a node used as a mapping key.
    pub fn key_text(&self) -> Option<&str> {
        match &self.node {
            Node::Scalar(s) => Some(s),
            _ => None,
        }
    }

    /// The entry `(key, value)` of a mapping whose key text is `name`.
    pub fn entry(&self, name: &str) -> Option<(&Located, &Located)> {
        match &self.node {
            Node::Map(entries) => entries
                .iter()
                .find(|(k, _)| k.key_text() == Some(name))
                .map(|(k, v)| (k, v)),
            _ => None,
        }
    }

    /// The node at `path`, exactly.
    pub fn get(&self, path: &[PathSeg]) -> Option<Target<'_>> {
        let (matched, target) = self.nearest(path);
        if matched == path.len() {
            target
        } else {
            None
        }
    }

    /// The deepest existing node along `path`: how many segments matched, and the node
    /// (`None` when not even the first segment exists; the root itself is then the answer).
    pub fn nearest(&self, path: &[PathSeg]) -> (usize, Option<Target<'_>>) {
        let mut current = self;
        let mut best: Option<Target<'_>> = None;
        for (depth, seg) in path.iter().enumerate() {
            let next = match (seg, &current.node) {
                (PathSeg::Key(name), Node::Map(_)) => current.entry(name).map(|(k, v)| Target {
                    key: Some(k.span),
                    value: v,
                }),
                (PathSeg::Index(i), Node::Seq(items)) => items.get(*i).map(|v| Target {
                    key: None,
                    value: v,
                }),
                _ => None,
            };
            match next {
                Some(t) => {
                    current = t.value;
                    best = Some(t);
                }
                None => return (depth, best),
            }
        }
        (path.len(), best)
    }

    /// The smallest start and largest end over this node and all its descendants.
    pub fn extent(&self) -> (usize, usize) {
        let mut lo = self.span.start;
        let mut hi = self.span.end();
        let mut widen = |n: &Located| {
            let (a, b) = n.extent();
            lo = lo.min(a);
            hi = hi.max(b);
        };
        match &self.node {
            Node::Map(entries) => {
                for (k, v) in entries {
                    widen(k);
                    widen(v);
                }
            }
            Node::Seq(items) => items.iter().for_each(widen),
            Node::Scalar(_) | Node::Null => {}
        }
        (lo, hi)
    }

    /// What lies at byte `offset`: the deepest key, scalar or collection covering it.
    pub fn hit(&self, offset: usize) -> Hit {
        let mut path = Vec::new();
        let mut current = self;
        loop {
            let mut descend: Option<&Located> = None;
            match &current.node {
                Node::Map(entries) => {
                    for (k, v) in entries {
                        if covers(k.span, offset) {
                            path.push(seg_for_key(k));
                            return Hit::Key(path);
                        }
                        if covers_extent(v, offset) {
                            path.push(seg_for_key(k));
                            descend = Some(v);
                            break;
                        }
                    }
                }
                Node::Seq(items) => {
                    for (i, v) in items.iter().enumerate() {
                        if covers_extent(v, offset) {
                            path.push(PathSeg::Index(i));
                            descend = Some(v);
                            break;
                        }
                    }
                }
                Node::Scalar(_) | Node::Null => return Hit::Value(path),
            }
            match descend {
                Some(next) => current = next,
                None => return Hit::Container(path),
            }
        }
    }
}

fn seg_for_key(k: &Located) -> PathSeg {
    PathSeg::Key(k.key_text().unwrap_or("?").to_owned())
}

/// Whether `span` covers `offset` (a zero-length span covers its start).
fn covers(span: Span, offset: usize) -> bool {
    if span.len == 0 {
        offset == span.start
    } else {
        offset >= span.start && offset < span.end()
    }
}

fn covers_extent(n: &Located, offset: usize) -> bool {
    let (lo, hi) = n.extent();
    if lo == hi {
        offset == lo
    } else {
        offset >= lo && offset < hi
    }
}

/// A path as users read it: `devices.osd0.keys[1].keyslot`.
pub(crate) fn display_path(path: &[PathSeg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            PathSeg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                let plain = !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if plain {
                    out.push_str(k);
                } else {
                    out.push_str(&format!("{k:?}"));
                }
            }
            PathSeg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// 1-based line and column of byte `offset`, counted the way miette's report header counts
/// them (columns in bytes; `\n`, `\r` and `\r\n` end a line).
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let bytes = text.as_bytes();
    let offset = offset.min(bytes.len());
    let mut line = 1;
    let mut line_start = 0;
    let mut i = 0;
    while i < offset {
        match bytes[i] {
            b'\n' => {
                line += 1;
                line_start = i + 1;
            }
            b'\r' => {
                if i + 1 < bytes.len() && bytes[i + 1] == b'\n' {
                    i += 1;
                }
                line += 1;
                line_start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    (line, offset.saturating_sub(line_start) + 1)
}

/// `span` moved inside `text` and onto char boundaries, so miette can always render it.
pub(crate) fn clamp(text: &str, span: Span) -> Span {
    let mut start = span.start.min(text.len());
    while start > 0 && !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = span.end().min(text.len()).max(start);
    while end < text.len() && !text.is_char_boundary(end) {
        end += 1;
    }
    Span {
        start,
        len: end - start,
    }
}

/// A zero-length span widened to the rest of its line (trailing blanks and comments excluded),
/// so a label on a YAML block collection marks something visible.
pub(crate) fn widen_to_line(text: &str, span: Span) -> Span {
    let span = clamp(text, span);
    if span.len > 0 {
        return span;
    }
    let rest = &text[span.start..];
    let line = rest.split(['\n', '\r']).next().unwrap_or("");
    let line = match line.find(" #") {
        Some(i) => &line[..i],
        None => line,
    };
    let mut len = line.trim_end().len().min(MAX_WIDENED);
    while len > 0 && !line.is_char_boundary(len) {
        len -= 1;
    }
    Span {
        start: span.start,
        len,
    }
}

/// Longest label [`widen_to_line`] makes, in bytes.
const MAX_WIDENED: usize = 60;

/// The span a label on `target` should cover: the scalar value itself; for a collection, the
/// mapping key that names it (or the collection, when it has a visible extent).
pub(crate) fn label_span(text: &str, target: &Target<'_>) -> Span {
    let value = target.value;
    let span = match (&value.node, target.key) {
        (Node::Scalar(_), _) => value.span,
        (Node::Null, Some(k)) if value.span.len == 0 => k,
        (Node::Null, _) => value.span,
        (Node::Map(_) | Node::Seq(_), Some(k)) => k,
        (Node::Map(_) | Node::Seq(_), None) => value.span,
    };
    widen_to_line(text, span)
}

/// A zero-length span widened to the character at its start (unless that is a line end), so a
/// syntax error label marks one visible character.
pub(crate) fn at_least_one_char(text: &str, span: Span) -> Span {
    let span = clamp(text, span);
    if span.len > 0 {
        return span;
    }
    match text[span.start..].chars().next() {
        Some(c) if c != '\n' && c != '\r' => Span {
            start: span.start,
            len: c.len_utf8(),
        },
        _ => span,
    }
}

/// How a format wraps a value with its location.
pub(crate) trait Spanner {
    /// Deserializes one value with its span.
    fn located<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Located, D::Error>;
}

/// YAML through `serde_saphyr::Spanned`.
pub(crate) struct Yaml;

/// TOML through `toml::Spanned`.
pub(crate) struct Toml;

impl Spanner for Yaml {
    fn located<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Located, D::Error> {
        let spanned = serde_saphyr::Spanned::<Tree<Yaml>>::deserialize(deserializer)?;
        let span = spanned.referenced.span();
        let start = span.byte_offset().unwrap_or(span.offset());
        let len = span.byte_len().unwrap_or(span.len());
        Ok(Located {
            span: Span {
                start: usize::try_from(start).unwrap_or(usize::MAX),
                len: usize::try_from(len).unwrap_or(0),
            },
            node: spanned.value.node,
        })
    }
}

impl Spanner for Toml {
    fn located<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Located, D::Error> {
        let spanned = toml::Spanned::<Tree<Toml>>::deserialize(deserializer)?;
        let range = spanned.span();
        Ok(Located {
            span: Span {
                start: range.start,
                len: range.end.saturating_sub(range.start),
            },
            node: spanned.into_inner().node,
        })
    }
}

/// Parses YAML text into a located tree (the root span is the start of the document).
pub(crate) fn parse_yaml(text: &str) -> Result<Located, serde_saphyr::Error> {
    serde_saphyr::from_str::<Tree<Yaml>>(text).map(|t| Located {
        span: Span { start: 0, len: 0 },
        node: t.node,
    })
}

/// Parses TOML text into a located tree (the root span is the start of the document).
pub(crate) fn parse_toml(text: &str) -> Result<Located, toml::de::Error> {
    toml::from_str::<Tree<Toml>>(text).map(|t| Located {
        span: Span { start: 0, len: 0 },
        node: t.node,
    })
}

/// A node whose children are read through the span wrapper of format `S`.
pub(crate) struct Tree<S> {
    node: Node,
    format: PhantomData<S>,
}

impl<'de, S: Spanner> Deserialize<'de> for Tree<S> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(TreeVisitor::<S>(PhantomData))
            .map(|node| Tree {
                node,
                format: PhantomData,
            })
    }
}

struct LocatedSeed<S>(PhantomData<S>);

impl<'de, S: Spanner> DeserializeSeed<'de> for LocatedSeed<S> {
    type Value = Located;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Located, D::Error> {
        S::located(deserializer)
    }
}

struct TreeVisitor<S>(PhantomData<S>);

impl<'de, S: Spanner> Visitor<'de> for TreeVisitor<S> {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Scalar(v.to_string()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Scalar(v.to_string()))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Node, E> {
        Ok(Node::Scalar(v.to_string()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Scalar(v.to_string()))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Node, E> {
        Ok(Node::Scalar(v.to_string()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Scalar(v.to_string()))
    }

    fn visit_char<E: de::Error>(self, v: char) -> Result<Node, E> {
        Ok(Node::Scalar(v.to_string()))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Scalar(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        Ok(Node::Scalar(v))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Node, E> {
        Ok(Node::Scalar(String::from_utf8_lossy(v).into_owned()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(LocatedSeed::<S>(PhantomData))? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key_seed(LocatedSeed::<S>(PhantomData))? {
            let value = map.next_value_seed(LocatedSeed::<S>(PhantomData))?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> PathSeg {
        PathSeg::Key(s.to_owned())
    }

    const YAML: &str = "version: 1\ndevices:\n  a:\n    path: x\n    keys:\n      - k1\n      - { key: k2, keyslot: 3 }\n";

    #[test]
    fn yaml_paths_map_to_spans() {
        let tree = parse_yaml(YAML).unwrap();
        let t = tree
            .get(&[
                k("devices"),
                k("a"),
                k("keys"),
                PathSeg::Index(1),
                k("keyslot"),
            ])
            .unwrap();
        let s = label_span(YAML, &t);
        assert_eq!(&YAML[s.start..s.end()], "3");
        assert_eq!(line_col(YAML, s.start), (7, 29));
        let t = tree.get(&[k("devices"), k("a")]).unwrap();
        let s = label_span(YAML, &t);
        assert_eq!(&YAML[s.start..s.end()], "a");
        assert!(tree.get(&[k("devices"), k("b")]).is_none());
        assert_eq!(tree.nearest(&[k("devices"), k("b")]).0, 1);
    }

    #[test]
    fn toml_paths_map_to_spans() {
        let text = "version = 1\n[devices.a]\npath = \"x\"\nkeys = [\"k1\", { key = \"k2\", keyslot = 3 }]\n";
        let tree = parse_toml(text).unwrap();
        let t = tree
            .get(&[
                k("devices"),
                k("a"),
                k("keys"),
                PathSeg::Index(1),
                k("keyslot"),
            ])
            .unwrap();
        let s = label_span(text, &t);
        assert_eq!(&text[s.start..s.end()], "3");
    }

    #[test]
    fn hit_finds_keys_values_and_containers() {
        let tree = parse_yaml(YAML).unwrap();
        let off = YAML.find("keyslot").unwrap();
        assert_eq!(
            tree.hit(off),
            Hit::Key(vec![
                k("devices"),
                k("a"),
                k("keys"),
                PathSeg::Index(1),
                k("keyslot")
            ])
        );
        let off = YAML.find("k1").unwrap();
        assert_eq!(
            tree.hit(off),
            Hit::Value(vec![k("devices"), k("a"), k("keys"), PathSeg::Index(0)])
        );
    }

    #[test]
    fn display_and_line_col() {
        assert_eq!(
            display_path(&[k("devices"), k("a.b"), k("keys"), PathSeg::Index(2)]),
            "devices.\"a.b\".keys[2]"
        );
        assert_eq!(line_col("a\r\nbc", 4), (2, 2));
        assert_eq!(line_col("", 10), (1, 1));
        let s = clamp("é", Span { start: 1, len: 9 });
        assert_eq!((s.start, s.len), (0, 2));
    }
}
