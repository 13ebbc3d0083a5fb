use std::process::ExitCode;

fn main() -> ExitCode {
    end_quietly_on_a_closed_output();
    ExitCode::from(jioctl::cli::main())
}

/// `jioctl ... | head` ends like any Unix tool whose reader left: silently, with
/// the shell's code for SIGPIPE (141), instead of a panic message.
///
/// SIGPIPE itself stays ignored (Rust's default): with its default action, a write
/// to a store connection the server had just closed (a TLS server refusing a
/// client without a certificate) killed jioctl without a word, where the store
/// layer turns that EPIPE into a clear error. Only a failed print to stdout or
/// stderr, which `println!` reports by panicking, ends the process here.
fn end_quietly_on_a_closed_output() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = (payload.downcast_ref::<String>().map(String::as_str))
            .or_else(|| payload.downcast_ref::<&str>().copied());
        if jioctl::exit::is_closed_output_panic(message) {
            // A driver whose stdout closed says so on stderr (if that is still
            // open): it stopped, and who drives now.
            jioctl::exit::output_closed(message.is_some_and(|m| m.starts_with("failed printing to stdout")));
        }
        default(info);
    }));
}
