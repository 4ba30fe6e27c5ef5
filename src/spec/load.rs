//! Reading a plan file: locating it, reading it as text, and parsing YAML or TOML twice (once
//! into the serde model, once into the located tree). Parser errors become diagnostics in
//! [`super::parse_error`].

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::diag::{Label, PlanError, SourceFile};
use super::locate::{self, Located, Node};
use super::model::PlanFile;
use super::parse_error::{schema_error, syntax_error, toml_raw, version_line, yaml_raw};
use super::Format;

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

/// `dir` for messages: `.` for the empty path (the current directory).
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

/// The text of `src`.
fn text_of(src: &SourceFile) -> &str {
    &src.text
}

/// The file name given, as shared text for a [`SourceFile`].
pub(crate) fn source_file(text: &str, name: &str, format: super::Format) -> SourceFile {
    // A byte order mark would shift every offset the parsers report.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    SourceFile {
        name: name.to_owned(),
        text: Arc::from(text),
        format,
    }
}

/// Shown in `Debug` of a plan: the name and size, never the text.
pub(crate) fn debug_source(src: &SourceFile) -> Cow<'static, str> {
    Cow::Owned(format!("{} ({} bytes)", src.name, src.text.len()))
}
