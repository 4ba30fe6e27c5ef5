fn main() -> std::process::ExitCode {
    keyplan::cli::main()
}
