//! Command line (in progress).

/// Entry point.
pub fn main() -> std::process::ExitCode {
    std::process::ExitCode::SUCCESS
}
