//! Build facts for `keyplan version` (src/cli/version.rs): the git commit the binary is built
//! from, whether its sources differ from that commit, the target triple, the compiler and the
//! profile, passed to the crate as `KEYPLAN_BUILD_*` environment variables at compile time.
//!
//! The commit is `git rev-parse HEAD` of the work tree this crate is the top of. Outside one (a
//! source tarball, a vendored copy inside another project's repository, no git installed) it
//! is `unknown`, unless the packager names it in `KEYPLAN_BUILD_COMMIT`. "Dirty" means that
//! a file the binary is built from (`src/`, `build.rs`, `Cargo.toml`, `Cargo.lock`) differs
//! from the commit; edits elsewhere (docs, tests) do not make the binary dirty.
//!
//! The script runs again when HEAD moves (a commit, a checkout), when the index changes, and
//! when a file under `src/` or the manifest changes, so the facts follow the tree without a
//! `cargo clean`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The files the binary is built from: what "dirty" looks at.
const SOURCES: &[&str] = &["src", "build.rs", "Cargo.toml", "Cargo.lock"];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    println!("cargo:rerun-if-env-changed=KEYPLAN_BUILD_COMMIT");
    for source in SOURCES {
        println!("cargo:rerun-if-changed={source}");
    }

    let (commit, dirty) = match std::env::var("KEYPLAN_BUILD_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => (commit.trim().to_string(), String::new()),
        _ => match git_commit(&manifest_dir) {
            Some((commit, dirty)) => (commit, dirty.to_string()),
            None => ("unknown".to_string(), String::new()),
        },
    };
    println!("cargo:rustc-env=KEYPLAN_BUILD_COMMIT={commit}");
    // `true`, `false`, or empty when not known.
    println!("cargo:rustc-env=KEYPLAN_BUILD_DIRTY={dirty}");

    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".to_string());
    println!("cargo:rustc-env=KEYPLAN_BUILD_TARGET={target}");
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".to_string());
    println!("cargo:rustc-env=KEYPLAN_BUILD_PROFILE={profile}");
    let rustc = std::env::var_os("RUSTC")
        .and_then(|rustc| output(Command::new(rustc).arg("--version")))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=KEYPLAN_BUILD_RUSTC={rustc}");
}

/// `(commit, dirty)` of the git work tree whose top is `dir`, watching the files that change
/// when HEAD moves; `None` when `dir` is not the top of a work tree or git cannot be run.
fn git_commit(dir: &Path) -> Option<(String, bool)> {
    let git = |args: &[&str]| output(Command::new("git").arg("-C").arg(dir).args(args));
    // Only this crate's own repository: an unpacked tarball inside another repository must not
    // take that repository's commit.
    let top = PathBuf::from(git(&["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    let commit = git(&["rev-parse", "HEAD"])?;
    // HEAD (a checkout), the branch HEAD names (a commit), packed refs, the index (`git add`,
    // `git commit`). A worktree keeps HEAD and index in its own git dir, refs in the common one.
    let abs = |p: String| {
        let p = PathBuf::from(p);
        if p.is_absolute() {
            p
        } else {
            dir.join(p)
        }
    };
    let git_dir = abs(git(&["rev-parse", "--git-dir"])?);
    let common_dir = abs(git(&["rev-parse", "--git-common-dir"])?);
    let mut watched = vec![
        git_dir.join("HEAD"),
        git_dir.join("index"),
        common_dir.join("packed-refs"),
    ];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(common_dir.join(branch));
    }
    // A path that does not exist would make cargo run this script at every build.
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let mut status = vec!["status", "--porcelain", "--untracked-files=no", "--"];
    status.extend(SOURCES);
    let dirty = !git(&status)?.is_empty();
    Some((commit, dirty))
}

/// The trimmed stdout of a command that succeeded; `None` when it could not run or failed.
fn output(command: &mut Command) -> Option<String> {
    let out = command.output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8(out.stdout).ok()?.trim().to_string())
}
