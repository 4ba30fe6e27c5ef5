//! Turning parser errors into diagnostics: the YAML and TOML parsers' complaints, placed in
//! the located tree, get a code, a field path (`devices.osd0.keys[1]`), a label on the marked
//! line and a help text that says what to do.
//!
//! Two kinds: [`syntax_error`] for text that does not parse at all, [`schema_error`] for a
//! document that parses but does not fit the plan model (unknown or missing field, bad value,
//! wrong type).

use serde_saphyr::MessageFormatter;

use super::diag::{Label, PlanError, SourceFile};
use super::locate::{self, display_path, Hit, Located, Node, Span};
use super::{Format, PathSeg};

/// A parser's complaint: message without location, and where (byte span), if known.
pub(super) struct RawError {
    /// The message, one line.
    message: String,
    /// The byte span the parser points at.
    span: Option<Span>,
}

/// The complaint of the YAML parser; no span when it gives no position (line 0).
pub(super) fn yaml_raw(err: &serde_saphyr::Error) -> RawError {
    let inner = err.without_snippet();
    let message = sanitize(&serde_saphyr::DefaultMessageFormatter.format_message(inner));
    let span = err.location().and_then(|loc| {
        if loc.line() == 0 {
            return None;
        }
        let s = loc.span();
        Some(Span {
            start: usize::try_from(s.byte_offset().unwrap_or(s.offset())).ok()?,
            len: usize::try_from(s.byte_len().unwrap_or(s.len())).unwrap_or(0),
        })
    });
    RawError { message, span }
}

/// The complaint of the TOML parser.
pub(super) fn toml_raw(err: &toml::de::Error) -> RawError {
    RawError {
        message: sanitize(err.message()),
        span: err.span().map(|r| Span {
            start: r.start,
            len: r.end.saturating_sub(r.start),
        }),
    }
}

/// One line, no control characters.
fn sanitize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.trim().chars() {
        if c == '\n' || c == '\r' || c == '\t' {
            out.push(' ');
        } else if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// A syntax error of the located-tree parse (`keyplan::plan::syntax`, or
/// `keyplan::plan::duplicate_key` for a key written twice): the parser's message reworded for
/// the known cases (duplicate keys, several YAML documents, nesting or alias limits, a
/// truncated document), a `here` label at its position, and help on fixing the syntax.
pub(super) fn syntax_error(src: &SourceFile, format: Format, raw: RawError) -> PlanError {
    let lang = match format {
        Format::Yaml => "YAML",
        Format::Toml => "TOML",
    };
    let mut message = raw.message;
    let mut help = format!(
        "fix the {lang} syntax at the marked place (check indentation, quotes, brackets and `{}` separators)",
        match format {
            Format::Yaml => ":",
            Format::Toml => "=",
        }
    );
    let mut code = "keyplan::plan::syntax";
    if let Some(rest) = message.strip_prefix("duplicate mapping key: ") {
        let key = rest
            .split(", set DuplicateKeyPolicy")
            .next()
            .unwrap_or(rest);
        message = format!("duplicate key `{key}`");
        help = "each key may appear only once in a mapping: remove one of them or merge their contents".to_owned();
        code = "keyplan::plan::duplicate_key";
    } else if message == "duplicate key" {
        help =
            "each key may appear only once in a table: remove one of them or merge their contents"
                .to_owned();
        code = "keyplan::plan::duplicate_key";
    } else if message.starts_with("multiple YAML documents") {
        message = "the plan file holds more than one YAML document".to_owned();
        help = "keep a single document: remove the `---` separator and what follows, or merge them"
            .to_owned();
    } else if message.starts_with("budget breached") || message.contains("recurs") {
        message = format!(
            "the document is nested too deeply, too large, or expands too many aliases ({message}); reading stopped here"
        );
        help = "a plan file needs only a few levels of nesting and no large alias (`*name`) expansions: simplify the marked structure"
            .to_owned();
    } else if message.starts_with("unexpected end of") {
        message = format!("unexpected end of the {lang} document");
    }
    let message = format!("invalid {lang}: {message}");
    let labels = raw
        .span
        .map(|s| Label {
            span: locate::at_least_one_char(&src.text, s),
            text: "here".to_owned(),
            primary: true,
        })
        .into_iter()
        .collect();
    PlanError::new(src, code, message, labels, Some(help))
}

/// The text between the first pair of backticks after `prefix`.
fn backticked_after<'a>(message: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = message.strip_prefix(prefix)?;
    let end = rest.find('`')?;
    Some(&rest[..end])
}

/// The node at `path`; the root for an empty path.
fn node_at<'a>(tree: &'a Located, path: &[PathSeg]) -> Option<&'a Located> {
    if path.is_empty() {
        Some(tree)
    } else {
        tree.get(path).map(|t| t.value)
    }
}

/// What a node is, for "found ...": the scalar itself, or the kind of collection.
fn describe(node: Option<&Located>) -> String {
    match node.map(|n| &n.node) {
        Some(Node::Scalar(s)) => format!("`{s}`"),
        Some(Node::Map(_)) => "a mapping".to_owned(),
        Some(Node::Seq(_)) => "a list".to_owned(),
        Some(Node::Null) => "an empty value".to_owned(),
        None => "something else".to_owned(),
    }
}

/// Whether serde's message is `invalid <integer type>` (a non-integer where a number goes).
fn is_int_type_message(message: &str) -> bool {
    let Some(ty) = message.strip_prefix("invalid ") else {
        return false;
    };
    matches!(
        ty,
        "u8" | "u16"
            | "u32"
            | "u64"
            | "u128"
            | "usize"
            | "i8"
            | "i16"
            | "i32"
            | "i64"
            | "i128"
            | "isize"
    )
}

/// A serde error on a syntactically valid document, placed in the located tree but not yet
/// classified: what the parser said, and where.
struct SchemaAt<'a> {
    /// The plan file's text.
    text: &'a str,
    /// Its syntax.
    format: Format,
    /// The located tree of `text`.
    tree: &'a Located,
    /// The parser's message, without location.
    message: String,
    /// What lies at the parser's position; `None` when it gave none.
    hit: Option<Hit>,
    /// The parser's span.
    span: Option<Span>,
}

impl SchemaAt<'_> {
    /// The path at the parser's position (empty when it gave none).
    fn path(&self) -> Vec<PathSeg> {
        self.hit
            .as_ref()
            .map(|h| h.path().to_vec())
            .unwrap_or_default()
    }
}

/// A classified schema error: its code, where to report it, and what to say.
struct SchemaReport {
    /// Stable diagnostic code.
    code: &'static str,
    /// The field the error is about (empty: the document).
    path: Vec<PathSeg>,
    /// What to mark (widened to the line); `None`: no label.
    span: Option<Span>,
    /// The message after the field path.
    detail: String,
    /// What to do.
    help: String,
}

/// A serde error on a syntactically valid document: unknown or missing field, wrong type, bad
/// enum value. The path comes from the located tree at the parser's position; each kind is
/// placed and worded by [`unknown_field`], [`missing_field`], [`unknown_variant`] or
/// [`bad_type`]. The message is `path: detail`, the label marks the span's line.
pub(super) fn schema_error(
    src: &SourceFile,
    format: Format,
    tree: &Located,
    raw: RawError,
) -> PlanError {
    let text: &str = &src.text;
    let at = SchemaAt {
        text,
        format,
        tree,
        hit: raw.span.map(|s| tree.hit(s.start)),
        span: raw.span,
        message: raw.message,
    };
    let report = if let Some(field) = backticked_after(&at.message, "unknown field `") {
        unknown_field(&at, field)
    } else if let Some(field) = backticked_after(&at.message, "missing field `") {
        missing_field(&at, field)
    } else if at.message.starts_with("unknown variant `") {
        unknown_variant(&at)
    } else {
        bad_type(&at)
    };
    let SchemaReport {
        code,
        path,
        span,
        detail,
        help,
    } = report;
    let full = if path.is_empty() {
        detail
    } else {
        format!("{}: {detail}", display_path(&path))
    };
    let labels = span
        .map(|s| Label {
            span: locate::widen_to_line(text, s),
            text: short_label(code).to_owned(),
            primary: true,
        })
        .into_iter()
        .collect();
    PlanError::new(src, code, full, labels, Some(help))
}

/// `keyplan::plan::unknown_field` for `field`. Internally tagged enums (`kms:`) report it at
/// the enclosing entry: the nearest enclosing mapping that has `field` is searched for it, and
/// the report moves to that key.
fn unknown_field(at: &SchemaAt, field: &str) -> SchemaReport {
    let mut path = at.path();
    let mut span = at.span;
    if path.last() != Some(&PathSeg::Key(field.to_owned())) {
        let mut base = path.clone();
        loop {
            if let Some((k, _)) = node_at(at.tree, &base).and_then(|n| n.entry(field)) {
                span = Some(k.span);
                base.push(PathSeg::Key(field.to_owned()));
                path = base;
                break;
            }
            if base.pop().is_none() {
                break;
            }
        }
    }
    let help = format!(
        "remove `{}` or correct its spelling: only the fields listed are allowed here",
        display_path(&path)
    );
    SchemaReport {
        code: "keyplan::plan::unknown_field",
        path,
        span,
        detail: at.message.clone(),
        help,
    }
}

/// `keyplan::plan::missing_field` for `field`, reported at the mapping that lacks it (a
/// top-level field: at the start of the document); the help says where to add it.
fn missing_field(at: &SchemaAt, field: &str) -> SchemaReport {
    let mut path = at.path();
    let mut span = at.span;
    // Reported at the start of the mapping, which is also its first key (YAML), or at the
    // table's header (TOML; the root table has an empty span at 0).
    if let Some(Hit::Key(_)) = at.hit {
        path.pop();
    }
    if at.format == Format::Toml && at.span.is_some_and(|s| s.len == 0 && s.start == 0) {
        path.clear();
    }
    // KMS instances are an internally tagged enum (`provider:`): YAML reports their missing
    // fields at the start of the whole `kms` mapping. Find the instance that lacks it.
    if path == [PathSeg::Key("kms".to_owned())] {
        if let Some(name) = kms_instance_missing(at.tree, field) {
            path.push(PathSeg::Key(name));
        }
    }
    if let Some(t) = at.tree.get(&path) {
        span = Some(locate::label_span(at.text, &t));
    } else if path.is_empty() {
        // A top-level field: mark the start of the document, not where the parser stopped.
        span = Some(Span {
            start: at.tree.span.start.min(first_content(at.text)),
            len: 0,
        });
    }
    let help = if path.is_empty() && field == "version" {
        format!(
            "add `{}` at the top of the plan file",
            version_line(at.format)
        )
    } else if path.is_empty() {
        format!("add `{field}` at the top level of the plan file")
    } else {
        format!("add `{field}` to `{}`", display_path(&path))
    };
    SchemaReport {
        code: "keyplan::plan::missing_field",
        path,
        span,
        detail: at.message.clone(),
        help,
    }
}

/// `keyplan::plan::bad_value`: an enum value not among those allowed (the parser's message
/// lists them). Internally tagged enums (`provider:`) report it at the key: the value is
/// marked instead.
fn unknown_variant(at: &SchemaAt) -> SchemaReport {
    let mut span = at.span;
    if let Some(Hit::Key(p)) = &at.hit {
        if let Some(t) = at.tree.get(p) {
            if let Node::Scalar(_) = t.value.node {
                span = Some(t.value.span);
            }
        }
    }
    SchemaReport {
        code: "keyplan::plan::bad_value",
        path: at.path(),
        span,
        detail: at.message.clone(),
        help: "use one of the values listed".to_owned(),
    }
}

/// `keyplan::plan::bad_type`: a value of the wrong type. The parser's wording (`invalid u32`,
/// `expected sequence start`, ...) becomes what was expected and what was found.
fn bad_type(at: &SchemaAt) -> SchemaReport {
    let path = at.path();
    let message = &at.message;
    let found = describe(node_at(at.tree, &path));
    let detail = if is_int_type_message(message) {
        format!("expected a whole number (0 or more), found {found}")
    } else if message == "expected sequence start" {
        format!("expected a list, found {found}")
    } else if message == "expected mapping start" {
        format!("expected a mapping, found {found}")
    } else if message == "expected string scalar" {
        format!("expected a text value, found {found}")
    } else if message.starts_with("cannot deserialize null") {
        "a value is required here, found an empty value".to_owned()
    } else {
        message.clone()
    };
    let help = if path.is_empty() {
        format!(
            "a plan file is a mapping that starts with `{}`",
            version_line(at.format)
        )
    } else {
        format!(
            "change `{}` to a value of the expected type",
            display_path(&path)
        )
    };
    SchemaReport {
        code: "keyplan::plan::bad_type",
        path,
        span: at.span,
        detail,
        help,
    }
}

/// Byte offset of the first line that is neither blank nor a comment (0 if none).
fn first_content(text: &str) -> usize {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim();
        if !t.is_empty() && !t.starts_with('#') && !t.starts_with("---") {
            return offset + (line.len() - line.trim_start().len());
        }
        offset += line.len();
    }
    0
}

/// Fields each KMS provider requires (see `model::KmsConfig`).
fn kms_required(provider: &str) -> &'static [&'static str] {
    match provider {
        "file" => &["path"],
        "vault" => &["address"],
        "kubernetes" => &["namespace"],
        "kmip" => &["endpoint", "ca_cert", "client_cert", "client_key"],
        "exec" => &["command"],
        _ => &[],
    }
}

/// The first KMS instance (in file order) that lacks `field`: one whose provider requires it,
/// else (for `provider` itself, or an unknown provider) any instance without it.
fn kms_instance_missing(tree: &Located, field: &str) -> Option<String> {
    let (_, kms) = tree.entry("kms")?;
    let Node::Map(entries) = &kms.node else {
        return None;
    };
    let lacking = |value: &Located| match &value.node {
        Node::Map(_) => value.entry(field).is_none(),
        _ => true,
    };
    let provider = |value: &Located| match value.entry("provider") {
        Some((
            _,
            Located {
                node: Node::Scalar(p),
                ..
            },
        )) => Some(p.clone()),
        _ => None,
    };
    let name = |k: &Located| match &k.node {
        Node::Scalar(s) => Some(s.clone()),
        _ => None,
    };
    entries
        .iter()
        .find(|(_, v)| lacking(v) && provider(v).is_some_and(|p| kms_required(&p).contains(&field)))
        .or_else(|| entries.iter().find(|(_, v)| lacking(v)))
        .and_then(|(k, _)| name(k))
}

/// The label text under the marked place for a schema error's `code`.
fn short_label(code: &str) -> &'static str {
    match code {
        "keyplan::plan::unknown_field" => "unknown field",
        "keyplan::plan::missing_field" => "a required field is missing here",
        "keyplan::plan::bad_value" => "not an allowed value",
        _ => "wrong type",
    }
}

/// The `version` line of a plan file in `format`, e.g. `version: 1`.
pub(super) fn version_line(format: Format) -> &'static str {
    match format {
        Format::Yaml => "version: 1",
        Format::Toml => "version = 1",
    }
}
