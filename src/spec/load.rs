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
pub(crate) fn read(path: &Path) -> Result<String, miette::Report> {
    std::fs::read_to_string(path).map_err(|e| {
        let help = match e.kind() {
            std::io::ErrorKind::NotFound => {
                "check the path, or run keyplan where keyplan.yaml is (or pass `-f PLAN`)"
            }
            std::io::ErrorKind::PermissionDenied => {
                "make the plan file readable by this user, or run keyplan as its owner"
            }
            std::io::ErrorKind::InvalidData => "save the plan file as UTF-8 text",
            _ => "check that the path names a readable plan file",
        };
        PlanError::bare(
            "keyplan::plan::read",
            format!("cannot read plan file {}: {e}", path.display()),
            Some(help.to_owned()),
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
            format!("plan file {} is empty", src.name),
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
        message = format!("the document is nested too deeply or is too large ({message})");
        help = "a plan file needs only a few levels of nesting: simplify the marked structure"
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

/// A serde error on a syntactically valid document: unknown or missing field, wrong type, bad
/// enum value. The path comes from the located tree at the parser's position.
fn schema_error(src: &SourceFile, format: Format, tree: &Located, raw: RawError) -> PlanError {
    let text: &str = &src.text;
    let hit = raw.span.map(|s| tree.hit(s.start));
    let mut path: Vec<PathSeg> = hit.as_ref().map(|h| h.path().to_vec()).unwrap_or_default();
    let mut span = raw.span;
    let message = raw.message;
    let code;
    let help: String;
    let detail: String;

    if let Some(field) = backticked_after(&message, "unknown field `") {
        code = "keyplan::plan::unknown_field";
        // Internally tagged enums (`kms:`) report at the enclosing entry: find the field.
        if path.last() != Some(&PathSeg::Key(field.to_owned())) {
            let mut base = path.clone();
            loop {
                if let Some((k, _)) = node_at(tree, &base).and_then(|n| n.entry(field)) {
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
        detail = message.clone();
        help = format!(
            "remove `{}` or correct its spelling: only the fields listed are allowed here",
            display_path(&path)
        );
    } else if let Some(field) = backticked_after(&message, "missing field `") {
        code = "keyplan::plan::missing_field";
        // Reported at the start of the mapping, which is also its first key (YAML), or at the
        // table's header (TOML; the root table has an empty span at 0).
        if let Some(Hit::Key(_)) = hit {
            path.pop();
        }
        if format == Format::Toml && raw.span.is_some_and(|s| s.len == 0 && s.start == 0) {
            path.clear();
        }
        if let Some(t) = tree.get(&path) {
            span = Some(locate::label_span(text, &t));
        }
        detail = message.clone();
        help = if path.is_empty() && field == "version" {
            format!("add `{}` at the top of the plan file", version_line(format))
        } else if path.is_empty() {
            format!("add `{field}` at the top level of the plan file")
        } else {
            format!("add `{field}` to `{}`", display_path(&path))
        };
    } else if message.starts_with("unknown variant `") {
        code = "keyplan::plan::bad_value";
        // Internally tagged enums (`provider:`) report at the key: mark the value.
        if let Some(Hit::Key(p)) = &hit {
            if let Some(t) = tree.get(p) {
                if let Node::Scalar(_) = t.value.node {
                    span = Some(t.value.span);
                }
            }
        }
        detail = message.clone();
        help = "use one of the values listed".to_owned();
    } else {
        code = "keyplan::plan::bad_type";
        let found = describe(node_at(tree, &path));
        detail = if is_int_type_message(&message) {
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
        help = if path.is_empty() {
            format!(
                "a plan file is a mapping that starts with `{}`",
                version_line(format)
            )
        } else {
            format!(
                "change `{}` to a value of the expected type",
                display_path(&path)
            )
        };
    }

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
