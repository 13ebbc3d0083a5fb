use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(jioctl::cli::main())
}
