use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(jio_agent::cli::main())
}
