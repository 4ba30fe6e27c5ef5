//! docs/cli-reference.md, every command's `--help`, generated from the clap definitions
//! (`keyplan::cli::command()`, the same the binary parses with) and kept up to date: the test
//! fails while the committed file differs.
//!
//! Regenerate it with `KEYPLAN_UPDATE_DOCS=1 cargo test --features failpoints --test cli reference::`.

use std::path::Path;

const REFERENCE_FILE: &str = "docs/cli-reference.md";

/// Text width of the help in the reference, in columns (clap wraps to it).
const WIDTH: usize = 100;

/// Every command and subcommand, depth first, with its path from `keyplan`.
fn walk(cmd: &clap::Command, path: &mut Vec<String>, out: &mut Vec<(String, clap::Command)>) {
    path.push(cmd.get_name().to_string());
    out.push((path.join(" "), cmd.clone()));
    for sub in cmd.get_subcommands() {
        if sub.get_name() != "help" {
            walk(sub, path, out);
        }
    }
    path.pop();
}

/// The reference as generated now.
fn generated() -> String {
    // `build` propagates global options and versions into subcommands, as parsing does.
    let mut root = keyplan::cli::command()
        .term_width(WIDTH)
        .max_term_width(WIDTH);
    root.build();
    let mut commands = Vec::new();
    walk(&root, &mut Vec::new(), &mut commands);
    let mut text = String::from(
        "# Command reference\n\n\
         Every command's `--help`, generated from the clap definitions in `src/cli/` by\n\
         `tests/cli/reference.rs` (which fails while this file is out of date; regenerate it with\n\
         `KEYPLAN_UPDATE_DOCS=1 cargo test --features failpoints --test cli reference::`). The\n\
         commands explained, with examples, JSON documents and exit codes: [commands.md](commands.md).\n\n",
    );
    for (path, _) in &commands {
        let anchor = path.replace(' ', "-");
        text.push_str(&format!("- [`{path}`](#{anchor})\n"));
    }
    for (path, mut cmd) in commands {
        let help = cmd.render_long_help().to_string();
        let help: Vec<&str> = help.lines().map(str::trim_end).collect();
        text.push_str(&format!(
            "\n## {path}\n\n```text\n{}\n```\n",
            help.join("\n").trim_end()
        ));
    }
    text
}

#[test]
fn reference_is_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join(REFERENCE_FILE);
    let now = generated();
    if std::env::var_os("KEYPLAN_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &now).expect("write the reference");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != now {
        let line = committed
            .lines()
            .zip(now.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(now.lines().count()));
        panic!(
            "{REFERENCE_FILE} is out of date with the clap definitions in src/cli/ (first difference at line {}); regenerate it with `KEYPLAN_UPDATE_DOCS=1 cargo test --features failpoints --test cli reference::` and commit it",
            line + 1
        );
    }
}

/// The reference holds every command, with the options its `--help` shows.
#[test]
fn reference_names_every_command() {
    let now = generated();
    for heading in [
        "## keyplan plan",
        "## keyplan apply",
        "## keyplan key get",
        "## keyplan device forget",
        "## keyplan fleet status",
        "## keyplan agent",
    ] {
        assert!(now.contains(&format!("{heading}\n")), "{heading} missing");
    }
    assert!(
        now.contains("--detailed-exitcode"),
        "plan's options missing"
    );
    // Global options a command ignores are hidden from its help, so from the reference too.
    let sign = now.split("## keyplan sign\n").nth(1).expect("sign section");
    let sign = sign.split("\n## ").next().unwrap_or_default();
    assert!(!sign.contains("--state-dir"), "{sign}");
}
