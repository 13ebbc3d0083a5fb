//! Finding and supervising the real programs the tests drive.

use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command};

/// Finds `binary` on `PATH`, or fails the test with the command that installs it.
/// A missing component is never a silent skip.
pub fn require_binary(binary: &str, install: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path).chain(["/usr/sbin".into(), "/sbin".into()]) {
        let candidate = dir.join(binary);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "`{binary}` is not installed; this test needs the real program. Install it with: {install} (or run ./scripts/test.sh as root, which installs it)"
    );
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port on 127.0.0.1");
    l.local_addr().expect("local address").port()
}

/// Starts `cmd` so that it dies with the test process even if the test is killed
/// before its `Drop` runs.
pub fn spawn_tied(cmd: &mut Command) -> std::io::Result<Child> {
    // SAFETY: the closure runs in the child between fork and exec and only calls
    // prctl(2), which is async-signal-safe.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    cmd.spawn()
}

/// Kills and reaps a child (SIGKILL: tests want speed, not a clean shutdown).
pub fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}
