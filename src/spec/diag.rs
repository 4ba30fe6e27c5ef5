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
                    Some(l.text)
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
            message: message.into(),
            code,
            source: Some(src.named()),
            labels,
            help,
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
