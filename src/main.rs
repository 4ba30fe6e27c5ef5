//! The `keyplan` executable: the command line of src/cli/mod.rs.

fn main() -> std::process::ExitCode {
    keyplan::cli::main()
}
