//! systemd's notify protocol (`Type=notify`): READY, STATUS, STOPPING and the
//! watchdog, sent as datagrams to `$NOTIFY_SOCKET`. Without that variable (not under
//! systemd) every call is a no-op.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Sends `state` (e.g. `READY=1`) to the socket at `path` (`@name` is abstract).
pub fn notify_to(path: &str, state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    if let Some(name) = path.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt as _;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), path)?;
    }
    Ok(())
}

/// Sends `state` to systemd, if it is listening.
pub fn notify(state: &str) {
    if let Ok(path) = std::env::var("NOTIFY_SOCKET")
        && let Err(e) = notify_to(&path, state)
    {
        tracing::debug!(error = %e, "cannot notify systemd");
    }
}

/// How often systemd expects a watchdog ping (half of `WATCHDOG_USEC`), when the
/// watchdog is on for this process.
pub fn watchdog_period() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.parse::<u32>().ok() != Some(std::process::id())
    {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// Pings the watchdog until the process ends. The pings come from the runtime, not
/// the reconcile loop, which may legitimately wait for a long Puppet run.
pub fn spawn_watchdog() {
    if let Some(period) = watchdog_period() {
        tokio::spawn(async move {
            loop {
                notify("WATCHDOG=1");
                tokio::time::sleep(period).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_datagrams_to_path_and_abstract_sockets() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("notify");
        let server = UnixDatagram::bind(&p).unwrap();
        notify_to(p.to_str().unwrap(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("jio-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let server = UnixDatagram::bind_addr(&addr).unwrap();
        notify_to(&format!("@{name}"), "WATCHDOG=1").unwrap();
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"WATCHDOG=1");
    }
}
