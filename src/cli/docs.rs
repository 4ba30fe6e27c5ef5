//! `keyplan completions SHELL` and `keyplan man`: generated from the clap definitions in
//! [`super::Cli`] (`clap_complete`, `clap_mangen`), so they always match the binary.

use super::*;

/// `keyplan completions` options.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `keyplan man` options.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write `keyplan.1`, `keyplan-plan.1`, ... into DIR (created if missing) instead.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

/// Writes the completion script for `shell` to stdout.
///
/// Errors: none of its own; a closed stdout is ignored like all other output.
pub(super) fn cmd_completions(shell: clap_complete::Shell) -> Result<Exit> {
    let mut cmd = super::command();
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "keyplan", &mut buf);
    let _ = io::stdout().write_all(&buf);
    Ok(Exit::Success)
}

/// Writes the man page of `keyplan` (section 1, roff) to stdout, or with `out_dir` one page per
/// command and subcommand (`keyplan.1`, `keyplan-plan.1`, `keyplan-key-get.1`, ...) into that
/// directory, creating it if needed, and prints the paths written.
///
/// Errors: the directory cannot be created or a page cannot be written (names the path).
pub(super) fn cmd_man(out_dir: Option<&std::path::Path>) -> Result<Exit> {
    let cmd = super::command();
    match out_dir {
        None => {
            let mut buf = Vec::new();
            clap_mangen::Man::new(cmd)
                .render(&mut buf)
                .into_diagnostic()?;
            let _ = io::stdout().write_all(&buf);
        }
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| {
                miette!(
                    "cannot create the man page directory {}: {e}",
                    dir.display()
                )
            })?;
            let mut cmd = cmd.disable_help_subcommand(true);
            cmd.build();
            let mut written = Vec::new();
            write_pages(&cmd, dir, &mut written)?;
            for p in written {
                outln!("{}", p.display());
            }
        }
    }
    Ok(Exit::Success)
}

/// Writes the page of `cmd` and of each of its visible subcommands (depth first) into `dir`.
fn write_pages(
    cmd: &clap::Command,
    dir: &std::path::Path,
    written: &mut Vec<PathBuf>,
) -> Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, written)?;
    }
    let man = clap_mangen::Man::new(cmd.clone());
    let path = dir.join(man.get_filename());
    man.generate_to(dir)
        .map_err(|e| miette!("cannot write the man page {}: {e}", path.display()))?;
    written.push(path);
    Ok(())
}
