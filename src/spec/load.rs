//! Reading a plan file: locating it, parsing YAML or TOML twice (once into the serde model,
//! once into the located tree), and turning parser errors into diagnostics that name the
//! field path and say what to do.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_saphyr::MessageFormatter;

use super::diag::{Label, PlanError, SourceFile};
use super::locate::{self, display_path, Hit, Located, Node, Span};
use super::model::PlanFile;
use super::{Format, PathSeg};

/// File names [`super::find_default`] looks for, in order.
pub(crate) const DEFAULT_NAMES: [&str; 3] = ["keyplan.yaml", "keyplan.yml", "keyplan.toml"];

/// See [`super::find_default`].
pub(crate) fn find_default(dir: &Path) -> Result<PathBuf, miette::Report> {
    let found: Vec<PathBuf> = DEFAULT_NAMES
        .iter()
        .map(|n| dir.join(n))
        .filter(|p| p.is_file())
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(PlanError::bare(
            "keyplan::plan::not_found",
            format!(
                "no plan file in {}: looked for {}",
                shown_dir(dir),
                DEFAULT_NAMES.join(", ")
            ),
            Some(
                "create keyplan.yaml (or keyplan.toml) there, or name the plan with `-f PLAN`"
                    .to_owned(),
            ),
        )
        .report()),
        many => Err(PlanError::bare(
            "keyplan::plan::ambiguous",
            format!(
                "several plan files in {}: {}",
                shown_dir(dir),
                many.iter()
                    .filter_map(|p| p.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Some("keep only one of them, or choose one with `-f PLAN`".to_owned()),
        )
        .report()),
    }
}

fn shown_dir(dir: &Path) -> String {
    if dir.as_os_str().is_empty() {
        ".".to_owned()
    } else {
        dir.display().to_string()
    }
}

/// Reads the file at `path` as text.
///
/// Errors name the file and say what to do: missing, unreadable, a directory (with the plan
/// file inside it, if there is one), or not UTF-8 (with the `file:line:column` of the first
/// byte that is not; the content is never shown, since `-f` may point at a binary key file).
pub(crate) fn read(path: &Path) -> Result<String, miette::Report> {
    let bytes = std::fs::read(path).map_err(|e| {
        let help = match e.kind() {
            std::io::ErrorKind::NotFound => {
                "check the path, or run keyplan where keyplan.yaml is (or pass `-f PLAN`)"
                    .to_owned()
            }
            std::io::ErrorKind::PermissionDenied => {
                "make the plan file readable by this user, or run keyplan as its owner".to_owned()
            }
            _ if path.is_dir() => {
                let inside = DEFAULT_NAMES
                    .iter()
                    .map(|n| path.join(n))
                    .find(|p| p.is_file());
                match inside {
                    Some(p) => format!(
                        "`-f` takes a plan file, not a directory: pass `-f {}`",
                        p.display()
                    ),
                    None => format!(
                        "`-f` takes a plan file, not a directory: name the plan file ({}) itself",
                        DEFAULT_NAMES.join(", ")
                    ),
                }
            }
            _ => "check that the path names a readable plan file".to_owned(),
        };
        let what = if path.is_dir() {
            "it is a directory".to_owned()
        } else {
            e.to_string()
        };
        PlanError::bare(
            "keyplan::plan::read",
            format!("cannot read plan file {}: {what}", path.display()),
            Some(help),
        )
        .report()
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let bad = e.utf8_error();
        let at = bad.valid_up_to();
        let bytes = e.as_bytes();
        let valid = String::from_utf8_lossy(&bytes[..at]);
        let (line, column) = locate::line_col(&valid, at);
        let byte = bytes.get(at).copied().unwrap_or(0);
        PlanError::bare(
            "keyplan::plan::encoding",
            format!(
                "{}:{line}:{column}: the plan file is not UTF-8 text (byte 0x{byte:02x} at offset {at} is not valid UTF-8); its content is not shown",
                path.display()
            ),
            Some(
                "save the plan file as UTF-8 text; if `-f` points at a binary or key file, point it at the plan file instead"
                    .to_owned(),
            ),
        )
        .report()
    })
}

/// Guesses the format of a file whose extension says nothing: TOML when the text parses as
/// TOML, else YAML.
pub(crate) fn detect(text: &str) -> Format {
    if locate::parse_toml(text).is_ok() {
        Format::Toml
    } else {
        Format::Yaml
    }
}

/// A parser's complaint: message without location, and where (byte span), if known.
struct RawError {
    message: String,
    span: Option<Span>,
}

fn yaml_raw(err: &serde_saphyr::Error) -> RawError {
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

fn toml_raw(err: &toml::de::Error) -> RawError {
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

/// Parses `src` in `format`: the located tree first (its failure is a syntax error), then the
/// version, then the serde model.
pub(crate) fn parse(
    src: &SourceFile,
    format: Format,
) -> Result<(PlanFile, Located), miette::Report> {
    let text: &str = &src.text;
    if is_blank(text) {
        return Err(PlanError::new(
            src,
            "keyplan::plan::empty",
            format!(
                "{}:1:1: the plan file is empty (it holds nothing but blank lines or comments)",
                src.name
            ),
            Vec::new(),
            Some(format!(
                "a plan file starts with `{}`, then lists `kms`, `keys` and `devices`",
                version_line(format)
            )),
        )
        .report());
    }
    let tree = match format {
        Format::Yaml => {
            locate::parse_yaml(text).map_err(|e| syntax_error(src, format, yaml_raw(&e)))
        }
        Format::Toml => {
            locate::parse_toml(text).map_err(|e| syntax_error(src, format, toml_raw(&e)))
        }
    }?;
    check_version(src, format, &tree)?;
    let file = match format {
        Format::Yaml => serde_saphyr::from_str::<PlanFile>(text)
            .map_err(|e| schema_error(src, format, &tree, yaml_raw(&e)).report()),
        Format::Toml => toml::from_str::<PlanFile>(text)
            .map_err(|e| schema_error(src, format, &tree, toml_raw(&e)).report()),
    }?;
    Ok((file, tree))
}

/// Only blanks and comments (both formats use `#`).
fn is_blank(text: &str) -> bool {
    text.lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
}

fn version_line(format: Format) -> &'static str {
    match format {
        Format::Yaml => "version: 1",
        Format::Toml => "version = 1",
    }
}

/// `version` is checked before the model, because another version may well have other fields.
fn check_version(src: &SourceFile, format: Format, tree: &Located) -> Result<(), miette::Report> {
    let Some((_, value)) = tree.entry("version") else {
        return Ok(());
    };
    let Node::Scalar(text) = &value.node else {
        return Ok(());
    };
    match text.parse::<i128>() {
        Ok(1) | Err(_) => Ok(()),
        Ok(v) => Err(PlanError::new(
            src,
            "keyplan::plan::version",
            format!("unsupported plan format version {v}"),
            vec![Label {
                span: locate::widen_to_line(text_of(src), value.span),
                text: "only version 1 is supported".to_owned(),
                primary: true,
            }],
            Some(format!(
                "this keyplan reads plan format version 1: write `{}` and use the version 1 fields",
                version_line(format)
            )),
        )
        .report()),
    }
}

fn text_of(src: &SourceFile) -> &str {
    &src.text
}

fn syntax_error(src: &SourceFile, format: Format, raw: RawError) -> PlanError {
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

fn describe(node: Option<&Located>) -> String {
    match node.map(|n| &n.node) {
        Some(Node::Scalar(s)) => format!("`{s}`"),
        Some(Node::Map(_)) => "a mapping".to_owned(),
        Some(Node::Seq(_)) => "a list".to_owned(),
        Some(Node::Null) => "an empty value".to_owned(),
        None => "something else".to_owned(),
    }
}

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
fn schema_error(src: &SourceFile, format: Format, tree: &Located, raw: RawError) -> PlanError {
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

fn short_label(code: &str) -> &'static str {
    match code {
        "keyplan::plan::unknown_field" => "unknown field",
        "keyplan::plan::missing_field" => "a required field is missing here",
        "keyplan::plan::bad_value" => "not an allowed value",
        _ => "wrong type",
    }
}

/// The file name given, as shared text for a [`SourceFile`].
pub(crate) fn source_file(text: &str, name: &str) -> SourceFile {
    // A byte order mark would shift every offset the parsers report.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    SourceFile {
        name: name.to_owned(),
        text: Arc::from(text),
    }
}

/// Shown in `Debug` of a plan: the name and size, never the text.
pub(crate) fn debug_source(src: &SourceFile) -> Cow<'static, str> {
    Cow::Owned(format!("{} ({} bytes)", src.name, src.text.len()))
}
