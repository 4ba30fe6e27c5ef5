//! `keyplan version [--json]`: the release, the commit this binary was built from, the target
//! and the formats it writes and reads ([`crate::format::all`]); the facts come from build.rs.
//! `keyplan --version` prints [`VERSION_LINE`].

use super::*;

/// `keyplan version` options.
#[derive(Debug, Args)]
pub struct VersionArgs {
    /// Print a JSON document (`format_version` "1.0") instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The `format_version` of the `version --json` document.
pub const JSON_FORMAT_VERSION: &str = "1.0";

/// The commit build.rs found: 40 hex digits, or `unknown` (built outside a git work tree).
const COMMIT: &str = env!("KEYPLAN_BUILD_COMMIT");
/// `true` when the sources the binary is built from differed from [`COMMIT`], `false`, or empty
/// when not known.
const DIRTY: &str = env!("KEYPLAN_BUILD_DIRTY");

/// What `keyplan --version` (clap's) prints after `keyplan `: the release, the commit's first
/// 12 digits (with `-dirty`) or `unknown commit`, and the target triple, e.g.
/// `0.1.0 (3f9c2a1b7d44, x86_64-unknown-linux-gnu)`.
pub fn version_line() -> &'static str {
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LINE.get_or_init(|| {
        let build = Build::this();
        let commit = match &build.commit {
            Some(c) => format!(
                "{}{}",
                c.get(..12).unwrap_or(c),
                if build.dirty == Some(true) {
                    "-dirty"
                } else {
                    ""
                }
            ),
            None => "unknown commit".to_string(),
        };
        format!("{} ({commit}, {})", build.version, build.target)
    })
}

/// The `version --json` document; fields in this order (`format_version` first). Within 1.x
/// fields are only added; readers ignore the ones they do not know.
#[derive(Debug, serde::Serialize)]
struct Build {
    format_version: &'static str,
    /// `keyplan`.
    name: &'static str,
    /// The release (Cargo.toml's `version`, SemVer: docs/releasing.md).
    version: &'static str,
    /// The full commit hash, `null` when the binary was built outside a git work tree.
    commit: Option<&'static str>,
    /// Whether `src/`, `build.rs`, `Cargo.toml` or `Cargo.lock` differed from `commit` at build
    /// time; `null` when not known.
    dirty: Option<bool>,
    /// The target triple, e.g. `x86_64-unknown-linux-gnu`.
    target: &'static str,
    /// `rustc --version` of the compiler.
    rustc: &'static str,
    /// Cargo's profile: `release` or `debug`.
    profile: &'static str,
    /// Cargo features compiled in (`failpoints`: a test build with injection points).
    features: Vec<&'static str>,
    /// Every stored and published format: the version this keyplan writes, the versions it
    /// reads, where the document lives (docs/formats.md).
    formats: Vec<&'static crate::format::Format>,
}

impl Build {
    /// The facts of this binary.
    fn this() -> Build {
        let mut features = Vec::new();
        if cfg!(feature = "failpoints") {
            features.push("failpoints");
        }
        Build {
            format_version: JSON_FORMAT_VERSION,
            name: env!("CARGO_PKG_NAME"),
            version: env!("CARGO_PKG_VERSION"),
            commit: (COMMIT != "unknown").then_some(COMMIT),
            dirty: match DIRTY {
                "true" => Some(true),
                "false" => Some(false),
                _ => None,
            },
            target: env!("KEYPLAN_BUILD_TARGET"),
            rustc: env!("KEYPLAN_BUILD_RUSTC"),
            profile: env!("KEYPLAN_BUILD_PROFILE"),
            features,
            formats: crate::format::all(),
        }
    }
}

/// Runs `keyplan version`: text for people, or with `--json` the [`Build`] document. Exit 0.
///
/// Errors: none of its own (a closed stdout is ignored like all other output).
pub(super) fn run(args: &VersionArgs) -> Result<Exit> {
    let build = Build::this();
    if args.json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&build).into_diagnostic()?
        );
        return Ok(Exit::Success);
    }
    outln!("keyplan {}", build.version);
    let commit = match (build.commit, build.dirty) {
        (Some(c), Some(true)) => format!("{c} (with uncommitted changes to its sources)"),
        (Some(c), _) => c.to_string(),
        (None, _) => "unknown (built outside a git work tree)".to_string(),
    };
    outln!("commit:   {commit}");
    outln!("target:   {}", build.target);
    outln!("compiler: {}", build.rustc);
    let features = if build.features.is_empty() {
        String::new()
    } else {
        format!(", features: {}", build.features.join(", "))
    };
    outln!("profile:  {}{features}", build.profile);
    outln!();
    if build.formats.is_empty() {
        outln!("Formats: none listed in this build.");
        return Ok(Exit::Success);
    }
    outln!("Formats (docs/formats.md):");
    let width = |f: fn(&crate::format::Format) -> &str, title: &str| {
        build
            .formats
            .iter()
            .map(|x| f(x).len())
            .chain([title.len()])
            .max()
            .unwrap_or(0)
    };
    let (n, w, r) = (
        width(|f| f.name, "name"),
        width(|f| f.writes, "writes"),
        width(|f| f.reads, "reads"),
    );
    outln!("  {:n$}  {:w$}  {:r$}  where", "name", "writes", "reads");
    for f in &build.formats {
        outln!(
            "  {:n$}  {:w$}  {:r$}  {}",
            f.name,
            f.writes,
            f.reads,
            f.home
        );
    }
    Ok(Exit::Success)
}
