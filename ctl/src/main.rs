use std::process::ExitCode;

fn main() -> ExitCode {
    restore_sigpipe();
    ExitCode::from(jioctl::cli::main())
}

/// `jioctl ... | head` ends jioctl the way it ends any Unix tool (killed by
/// SIGPIPE, silently) instead of a panic on the closed pipe: Rust's runtime ignores
/// SIGPIPE, so every `println!` after the reader left would panic.
#[allow(unsafe_code)] // one libc call at start-up, before any thread exists
fn restore_sigpipe() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: SIG_DFL is a valid disposition; no other thread runs yet, and no
    // handler of ours is replaced.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}
