//! A real Swift all-in-one (Debian's `swift-*` packages) on loopback: TempAuth, one
//! replica, rings built in a temporary directory, memcached for tokens.
//!
//! Users (from `tests/swift-aio/proxy-server.conf`): `fleet:uploader` / `s3cr3t`,
//! `test:tester` / `testing`, `admin:admin` / `admin`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_port, kill, require_binary, spawn_tied, spawn_tied_with, terminate};

const INSTALL: &str =
    "apt-get install -y swift swift-proxy swift-account swift-container swift-object memcached";

const SERVERS: [(&str, &str); 4] = [
    ("account", include_str!("../swift-aio/account-server.conf")),
    ("container", include_str!("../swift-aio/container-server.conf")),
    ("object", include_str!("../swift-aio/object-server.conf")),
    ("proxy", include_str!("../swift-aio/proxy-server.conf")),
];

/// A running Swift, stopped on drop.
pub struct Swift {
    dir: tempfile::TempDir,
    ports: [u16; 4],
    memcached_port: u16,
    memcached: Option<Child>,
    servers: [Option<Child>; 4],
}

impl Swift {
    pub async fn start() -> Swift {
        for bin in [
            "swift-ring-builder",
            "swift-proxy-server",
            "swift-account-server",
            "swift-container-server",
            "swift-object-server",
            "memcached",
        ] {
            require_binary(bin, INSTALL);
        }
        let dir = tempfile::Builder::new()
            .prefix("jio-swift-")
            .tempdir()
            .expect("temporary directory");
        let base = dir.path();
        let etc = base.join("etc");
        for d in [
            etc.clone(),
            base.join("srv/node/d1"),
            base.join("cache"),
            base.join("log"),
        ] {
            std::fs::create_dir_all(d).expect("swift directory");
        }
        let ports = [free_port(), free_port(), free_port(), free_port()];
        let memcached_port = free_port();
        for (i, (name, template)) in SERVERS.iter().enumerate() {
            let conf = template
                .replace("@BASE@", &base.display().to_string())
                .replace("@PORT@", &ports[i].to_string())
                .replace("@MEMCACHED_PORT@", &memcached_port.to_string());
            std::fs::write(etc.join(format!("{name}-server.conf")), conf).expect("write swift config");
        }
        std::fs::write(etc.join("swift.conf"), include_str!("../swift-aio/swift.conf"))
            .expect("write swift.conf");
        // Blocking work off the async runtime, so that servers started alongside
        // (etcd) keep being watched meanwhile.
        let ring_dir = etc.clone();
        tokio::task::spawn_blocking(move || build_rings(&ring_dir, ports))
            .await
            .expect("ring builder thread");
        let mut swift = Swift {
            dir,
            ports,
            memcached_port,
            memcached: None,
            servers: [None, None, None, None],
        };
        swift.memcached = Some(spawn_memcached(memcached_port));
        for i in 0..4 {
            swift.spawn(i);
        }
        for i in 0..4 {
            swift.wait_healthy(i).await;
        }
        swift
    }

    fn spawn(&mut self, i: usize) {
        let (name, _) = SERVERS[i];
        let conf = self.dir.path().join(format!("etc/{name}-server.conf"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("log/{name}.log")))
            .expect("swift log");
        let child = spawn_tied_with(
            Command::new(format!("/usr/bin/swift-{name}-server"))
                .arg(&conf)
                .arg("-v")
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log handle"))
                .stderr(log),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap_or_else(|e| panic!("cannot start swift-{name}-server: {e}"));
        self.servers[i] = Some(child);
    }

    async fn wait_healthy(&mut self, i: usize) {
        let url = format!("http://127.0.0.1:{}/healthcheck", self.ports[i]);
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = client.get(&url).timeout(Duration::from_millis(500)).send().await
                && r.text().await.is_ok_and(|b| b.trim() == "OK")
            {
                return;
            }
            if let Some(Ok(Some(status))) = self.servers[i].as_mut().map(Child::try_wait) {
                panic!(
                    "swift-{}-server exited with {status}: {}",
                    SERVERS[i].0,
                    self.log_tail(i)
                );
            }
            assert!(
                Instant::now() < deadline,
                "swift-{}-server not healthy in 30 s: {}",
                SERVERS[i].0,
                self.log_tail(i)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_tail(&self, i: usize) -> String {
        let log = std::fs::read_to_string(self.dir.path().join(format!("log/{}.log", SERVERS[i].0)))
            .unwrap_or_default();
        log.lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// TempAuth's v1 endpoint.
    pub fn auth_url(&self) -> String {
        format!("http://127.0.0.1:{}/auth/v1.0", self.ports[3])
    }

    /// Stops the proxy: Swift is down for clients.
    pub fn stop_proxy(&mut self) {
        if let Some(mut c) = self.servers[3].take() {
            terminate(&mut c, Duration::from_secs(5));
        }
    }

    /// Starts the proxy again on its port.
    pub async fn start_proxy(&mut self) {
        self.spawn(3);
        self.wait_healthy(3).await;
    }

    /// Restarts memcached, which invalidates every token.
    pub fn restart_memcached(&mut self) {
        if let Some(mut c) = self.memcached.take() {
            kill(&mut c);
        }
        self.memcached = Some(spawn_memcached(self.memcached_port));
        std::thread::sleep(Duration::from_millis(300));
    }

    /// Logs in as `user` (`account:user`) and returns (token, storage URL).
    pub async fn login(&self, user: &str, key: &str) -> (String, String) {
        let r = reqwest::Client::new()
            .get(self.auth_url())
            .header("X-Storage-User", user)
            .header("X-Storage-Pass", key)
            .send()
            .await
            .expect("swift auth");
        assert!(r.status().is_success(), "swift auth failed: {}", r.status());
        let h = |n: &str| {
            r.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        (h("x-auth-token"), h("x-storage-url"))
    }

    /// GETs `url` with a token of `fleet:uploader`; returns the body (panics on an error status).
    pub async fn get(&self, url: &str) -> String {
        let (token, _) = self.login("fleet:uploader", "s3cr3t").await;
        let r = reqwest::Client::new()
            .get(url)
            .header("X-Auth-Token", token)
            .send()
            .await
            .expect("swift GET");
        assert!(r.status().is_success(), "GET {url}: {}", r.status());
        r.text().await.expect("swift body")
    }

    /// Writes `key` to a file readable by its owner only; returns the path.
    pub fn key_file(&self, key: &str) -> PathBuf {
        let p = self.dir.path().join(format!("key-{}", key.len()));
        write_secret(&p, key);
        p
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn memcached_port(&self) -> u16 {
        self.memcached_port
    }
}

/// memcached on `port` (TempAuth keeps its tokens there).
fn spawn_memcached(port: u16) -> Child {
    spawn_tied(
        Command::new("memcached")
            .args([
                "-u",
                "root",
                "-l",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "0",
                "-m",
                "64",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("start memcached")
}

/// Builds the account, container and object rings (one replica) in `etc`.
fn build_rings(etc: &Path, ports: [u16; 4]) {
    for (i, ring) in ["account", "container", "object"].iter().enumerate() {
        let builder = format!("{ring}.builder");
        for args in [
            vec!["create", "8", "1", "1"],
            vec!["add", &format!("r1z1-127.0.0.1:{}/d1", ports[i]), "100"],
            vec!["rebalance"],
        ] {
            let out = Command::new("swift-ring-builder")
                .arg(&builder)
                .args(&args)
                .current_dir(etc)
                .output()
                .expect("run swift-ring-builder");
            // `rebalance` exits 1 with a warning on a one-device ring; the ring is still written.
            assert!(
                out.status.code().is_some_and(|c| c <= 1),
                "swift-ring-builder {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            etc.join(format!("{ring}.ring.gz")).exists(),
            "{ring}.ring.gz was not written"
        );
    }
}

/// Writes a secret file with mode 0600.
pub fn write_secret(path: &Path, secret: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, format!("{secret}\n")).expect("write secret");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod secret");
}

impl Drop for Swift {
    fn drop(&mut self) {
        for c in self.servers.iter_mut().flatten() {
            terminate(c, Duration::from_secs(5));
        }
        if let Some(c) = self.memcached.as_mut() {
            kill(c);
        }
    }
}
