//! Diagnostics for plan files: a miette `Diagnostic` that carries the plan text as a
//! `NamedSource` and labels at byte spans, so reports read `plan.yaml:7:19`.

use std::fmt;
use std::sync::Arc;

use miette::{Diagnostic, LabeledSpan, NamedSource, SourceCode};

use super::locate::{clamp, Span};

/// The plan text and the name shown in reports.
#[derive(Clone)]
pub(crate) struct SourceFile {
    /// The file name as given.
    pub name: String,
    /// The whole text.
    pub text: Arc<str>,
    /// Its format: the settings a message quotes are spelled in it ([`in_format`]).
    pub format: super::Format,
}

impl SourceFile {
    fn named(&self) -> NamedSource<Arc<str>> {
        NamedSource::new(self.name.clone(), Arc::clone(&self.text))
    }
}

/// One label: a span, its text, and whether it is the primary place of the error.
pub(crate) struct Label {
    pub span: Span,
    pub text: String,
    pub primary: bool,
}

/// A plan-file error; several of them are reported together through `related`.
pub(crate) struct PlanError {
    message: String,
    code: &'static str,
    source: Option<NamedSource<Arc<str>>>,
    labels: Vec<LabeledSpan>,
    help: Option<String>,
    related: Vec<PlanError>,
    /// Where the primary label starts (for ordering); `usize::MAX` when unlabeled.
    pub order: usize,
}

impl PlanError {
    /// An error about `src`, with labels (spans are clamped into the text).
    pub fn new(
        src: &SourceFile,
        code: &'static str,
        message: impl Into<String>,
        labels: Vec<Label>,
        help: Option<String>,
    ) -> Self {
        let mut order = usize::MAX;
        let labels = labels
            .into_iter()
            .map(|l| {
                let span = clamp(&src.text, l.span);
                if l.primary {
                    order = order.min(span.start);
                }
                let text = if l.text.is_empty() {
                    None
                } else {
                    Some(in_format(&l.text, src.format))
                };
                let ss = miette::SourceSpan::new(span.start.into(), span.len);
                if l.primary {
                    LabeledSpan::new_primary_with_span(text, ss)
                } else {
                    LabeledSpan::new_with_span(text, ss)
                }
            })
            .collect();
        PlanError {
            message: in_format(&message.into(), src.format),
            code,
            source: Some(src.named()),
            labels,
            help: help.map(|h| in_format(&h, src.format)),
            related: Vec::new(),
            order,
        }
    }

    /// An error with no plan text (e.g. the file cannot be read).
    pub fn bare(code: &'static str, message: impl Into<String>, help: Option<String>) -> Self {
        PlanError {
            message: message.into(),
            code,
            source: None,
            labels: Vec::new(),
            help,
            related: Vec::new(),
            order: usize::MAX,
        }
    }

    /// Into a report.
    pub fn report(self) -> miette::Report {
        miette::Report::new(self)
    }
}

/// One report for all `errors`: the error itself when there is one, else a summary with every
/// error attached as `related`, in file order.
pub(crate) fn combine(src: &SourceFile, mut errors: Vec<PlanError>) -> miette::Report {
    errors.sort_by_key(|e| e.order);
    if errors.len() == 1 {
        if let Some(only) = errors.pop() {
            return only.report();
        }
    }
    let mut summary = PlanError::new(
        src,
        "keyplan::plan::invalid",
        format!("{}: {} errors in the plan file", src.name, errors.len()),
        Vec::new(),
        Some("fix each error listed below, then run `keyplan validate` again".to_owned()),
    );
    summary.related = errors;
    summary.report()
}

impl fmt::Debug for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanError")
            .field("code", &self.code)
            .field("message", &self.message)
            .field("help", &self.help)
            .field("related", &self.related)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for PlanError {}

impl Diagnostic for PlanError {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.code))
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display + 'a>)
    }

    fn source_code(&self) -> Option<&dyn SourceCode> {
        self.source.as_ref().map(|s| s as &dyn SourceCode)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        if self.labels.is_empty() {
            None
        } else {
            Some(Box::new(self.labels.iter().cloned()))
        }
    }

    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn Diagnostic> + 'a>> {
        if self.related.is_empty() {
            None
        } else {
            Some(Box::new(self.related.iter().map(|e| e as &dyn Diagnostic)))
        }
    }
}

/// Where a diagnostic points, for `keyplan validate --json`.
///
/// `line` and `column` are 1-based, `byte` is the 0-based byte offset into the file. `column`
/// counts characters (Unicode scalar values) from the start of the line, so it differs from the
/// human report's `file:line:column` (which counts bytes, as miette does) only when non-ASCII
/// text precedes the place on its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Position {
    /// Line, 1-based (`\n`, `\r\n` and a lone `\r` end a line).
    pub line: usize,
    /// Column in characters, 1-based.
    pub column: usize,
    /// Byte offset, 0-based.
    pub byte: usize,
}

/// The marked part of a plan file: `start` inclusive, `end` exclusive (the position just after
/// the last marked character; equal to `start` for an empty mark).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Range {
    /// The plan file as named on the command line (or found in the current directory).
    pub filename: String,
    /// First marked character.
    pub start: Position,
    /// Just after the last marked character.
    pub end: Position,
}

/// Severity of a [`JsonDiagnostic`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The plan cannot be used.
    Error,
    /// The plan can be used, but something looks wrong.
    Warning,
}

/// One diagnostic of `keyplan validate --json` (the shape of `diagnostics[]`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JsonDiagnostic {
    /// `error` or `warning`.
    pub severity: Severity,
    /// One line: what is wrong (the human report's headline).
    pub summary: String,
    /// The text at the mark (when it says more than "here") and what to do; lines joined with
    /// `\n`. Empty when there is nothing more to say.
    pub detail: String,
    /// Stable diagnostic code, e.g. `keyplan::plan::undefined_key`.
    pub code: String,
    /// Where in the plan file; absent when the error has no place in it (e.g. the file cannot
    /// be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range: Option<Range>,
}

/// The position of byte `offset` in `text` (clamped to the text and to a character boundary).
fn position(text: &str, offset: usize) -> Position {
    let mut offset = offset.min(text.len());
    while offset > 0 && !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let (line, byte_column) = super::locate::line_col(text, offset);
    let line_start = offset.saturating_sub(byte_column.saturating_sub(1));
    let column = text
        .get(line_start..offset)
        .map_or(byte_column, |s| s.chars().count() + 1);
    Position {
        line,
        column,
        byte: offset,
    }
}

/// Every diagnostic in `report`, flattened: a summary that only gathers several errors (as
/// [`combine`] builds it) is replaced by the errors themselves, each with its own range. Plan
/// file errors get a range from their primary label (or first label); other reports (e.g. a
/// plan file that cannot be read) become one diagnostic without a range.
pub fn json_diagnostics(report: &miette::Report) -> Vec<JsonDiagnostic> {
    let mut out = Vec::new();
    match report.downcast_ref::<PlanError>() {
        Some(e) => flatten(e, &mut out),
        None => out.push(generic(report.as_ref())),
    }
    out
}

fn flatten(e: &PlanError, out: &mut Vec<JsonDiagnostic>) {
    if e.related.is_empty() || !e.labels.is_empty() {
        out.push(from_plan_error(e));
    }
    for r in &e.related {
        flatten(r, out);
    }
}

fn severity_of(d: &dyn Diagnostic) -> Severity {
    match d.severity() {
        Some(miette::Severity::Warning) | Some(miette::Severity::Advice) => Severity::Warning,
        _ => Severity::Error,
    }
}

fn generic(d: &dyn Diagnostic) -> JsonDiagnostic {
    JsonDiagnostic {
        severity: severity_of(d),
        summary: d.to_string(),
        detail: d.help().map(|h| h.to_string()).unwrap_or_default(),
        code: d.code().map(|c| c.to_string()).unwrap_or_default(),
        range: None,
    }
}

fn from_plan_error(e: &PlanError) -> JsonDiagnostic {
    let primary = e
        .labels
        .iter()
        .find(|l| l.primary())
        .or_else(|| e.labels.first());
    let mut detail: Vec<String> = Vec::new();
    if let Some(text) = primary.and_then(|l| l.label()) {
        if text != "here" {
            detail.push(format!("{text}."));
        }
    }
    if let Some(help) = &e.help {
        detail.push(help.clone());
    }
    let range = match (&e.source, primary) {
        (Some(src), Some(label)) => {
            let text: &str = src.inner();
            let start = label.offset();
            Some(Range {
                filename: src.name().to_owned(),
                start: position(text, start),
                end: position(text, start + label.len()),
            })
        }
        _ => None,
    };
    JsonDiagnostic {
        severity: Severity::Error,
        summary: e.message.clone(),
        detail: detail.join("\n"),
        code: e.code.to_owned(),
        range,
    }
}

/// `text` with every setting it quotes in YAML syntax (a backticked `key: value`, e.g.
/// `` `rotate_after: 90x` ``, `` `keep: []` ``, `` `auth: {method: token}` ``) spelled in
/// `format`: unchanged for YAML, `key = value` for TOML with strings quoted
/// (`` `rotate_after = "90x"` ``), so that the advice of a TOML plan's error can be copied into
/// it. Messages are written once, in YAML; this is the one place that translates them.
pub(crate) fn in_format(text: &str, format: super::Format) -> String {
    if format == super::Format::Yaml {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut parts = text.split('`');
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    // Odd pieces are inside backticks; an unpaired last backtick leaves its text as it is.
    let rest: Vec<&str> = parts.collect();
    for (i, piece) in rest.iter().enumerate() {
        out.push('`');
        let inside = i % 2 == 0 && i + 1 < rest.len();
        match toml_setting(piece).filter(|_| inside) {
            Some(t) => out.push_str(&t),
            None => out.push_str(piece),
        }
    }
    out
}

/// `key: value` (a plan field name, then YAML) as TOML's `key = value`; `None` when `text` is
/// not one.
fn toml_setting(text: &str) -> Option<String> {
    let (key, value) = text.split_once(": ")?;
    let is_key = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    is_key.then(|| format!("{key} = {}", toml_value(value.trim())))
}

/// A YAML value as TOML: numbers, booleans, lists, `...` as they are; a flow mapping
/// (`{a: b, c: d}`) as an inline table; anything else a quoted string.
fn toml_value(value: &str) -> String {
    if let Some(inner) = value.strip_prefix('{').and_then(|v| v.strip_suffix('}')) {
        let fields: Vec<String> = inner
            .split(',')
            .map(|f| match f.trim().split_once(':') {
                Some((k, v)) => format!("{} = {}", k.trim(), toml_value(v.trim())),
                None => f.trim().to_owned(),
            })
            .collect();
        return format!("{{ {} }}", fields.join(", "));
    }
    let plain = value.parse::<i64>().is_ok()
        || matches!(value, "true" | "false" | "..." | "")
        || value.starts_with('[');
    if plain {
        value.to_owned()
    } else {
        format!("{value:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(line: usize, column: usize, byte: usize) -> Position {
        Position { line, column, byte }
    }

    #[test]
    fn positions_count_lines_and_characters() {
        let text = "ab\nçé: x\r\ny\rz";
        assert_eq!(position(text, 0), p(1, 1, 0));
        assert_eq!(position(text, 2), p(1, 3, 2));
        assert_eq!(position(text, 3), p(2, 1, 3));
        // `ç` and `é` are two bytes each, one character each.
        assert_eq!(position(text, 9), p(2, 5, 9));
        // CRLF ends one line; a lone CR ends one too.
        assert_eq!(position(text, 12), p(3, 1, 12));
        assert_eq!(position(text, 14), p(4, 1, 14));
        // Inside a character: moved back to its start; past the end: clamped.
        assert_eq!(position(text, 4), p(2, 1, 3));
        assert_eq!(position(text, 99), p(4, 2, 15));
    }
}

#[cfg(test)]
mod format_tests {
    use super::*;
    use crate::spec::Format;

    #[test]
    fn settings_are_quoted_in_the_plans_format() {
        let yaml = "say `unmanaged_keyslots: remove`, or `keep: []`; `rotate_after: 1w 3d` of `node: <node name>` in `auth: {method: token, token_env: ...}`; `version: 1`; run `keyplan plan`";
        assert_eq!(in_format(yaml, Format::Yaml), yaml);
        assert_eq!(
            in_format(yaml, Format::Toml),
            "say `unmanaged_keyslots = \"remove\"`, or `keep = []`; `rotate_after = \"1w 3d\"` of `node = \"<node name>\"` in `auth = { method = \"token\", token_env = ... }`; `version = 1`; run `keyplan plan`"
        );
        // Text outside backticks, and an unpaired backtick, are left alone.
        assert_eq!(in_format("a: b `c: d", Format::Toml), "a: b `c: d");
    }
}
