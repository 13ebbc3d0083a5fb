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

/// A port on 127.0.0.1 that was free a moment ago, for a server a test starts.
///
/// Taken below Linux's ephemeral range (32768 and up), where the kernel picks the
/// local ports of outgoing connections: a port handed out there could be taken by
/// a client's connection before the server binds it (seen: Swift's proxy could
/// not bind while other tests' clients were busy). Never the same port twice in
/// one test process.
pub fn free_port() -> u16 {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    static NEXT: AtomicU64 = AtomicU64::new(0);
    const LOW: u64 = 20_000;
    const SPAN: u64 = 12_000;
    // A different starting point per process (pid and time), then a stride.
    let seed = u64::from(std::process::id()).wrapping_mul(2_654_435_761)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos()));
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (seed.wrapping_add(n.wrapping_mul(7_919))) % SPAN) as u16;
        if given.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port on 127.0.0.1");
    l.local_addr().expect("local address").port()
}

/// Starts `cmd` so that it dies with the test process even if the test is killed
/// before its `Drop` runs.
pub fn spawn_tied(cmd: &mut Command) -> std::io::Result<Child> {
    spawn_tied_with(cmd, nix::sys::signal::Signal::SIGKILL)
}

/// Like `spawn_tied`, with the signal the child gets when the test process dies
/// (SIGTERM for servers that must stop their own workers).
pub fn spawn_tied_with(cmd: &mut Command, signal: nix::sys::signal::Signal) -> std::io::Result<Child> {
    // SAFETY: the closure runs in the child between fork and exec and only calls
    // prctl(2), which is async-signal-safe.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::from));
    }
    cmd.spawn()
}

/// Kills and reaps a child (SIGKILL: tests want speed, not a clean shutdown).
pub fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// SIGTERM, then SIGKILL if the child has not exited after `grace`. For servers
/// whose parent must stop its own workers (Swift): SIGKILL would orphan them.
pub fn terminate(child: &mut Child, grace: std::time::Duration) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    kill(child);
}
