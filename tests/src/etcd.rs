//! A real etcd (Debian's `etcd-server`): one member or a cluster on loopback.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{free_port, kill, require_binary, spawn_tied};

const INSTALL: &str = "apt-get install -y etcd-server etcd-client";

struct Member {
    name: String,
    client: u16,
    peer: u16,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// Running etcd members, stopped on drop.
pub struct Etcd {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    binary: PathBuf,
}

impl Etcd {
    /// One member, healthy.
    pub async fn start() -> Etcd {
        Etcd::cluster(1).await
    }

    /// `n` members forming one cluster, healthy.
    pub async fn cluster(n: usize) -> Etcd {
        let binary = require_binary("etcd", INSTALL);
        let dir = tempfile::Builder::new()
            .prefix("jio-etcd-")
            .tempdir()
            .expect("temporary directory");
        let members = (0..n)
            .map(|i| Member {
                name: format!("n{i}"),
                client: free_port(),
                peer: free_port(),
                data: dir.path().join(format!("n{i}.etcd")),
                log: dir.path().join(format!("n{i}.log")),
                child: None,
            })
            .collect();
        let mut etcd = Etcd { dir, members, binary };
        for i in 0..n {
            etcd.spawn(i);
        }
        for i in 0..n {
            etcd.wait_healthy(i).await;
        }
        etcd
    }

    fn spawn(&mut self, i: usize) {
        let cluster = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let m = &mut self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .expect("etcd log file");
        let client = format!("http://127.0.0.1:{}", m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let child = spawn_tied(
            Command::new(&self.binary)
                .args(["--name", &m.name, "--data-dir"])
                .arg(&m.data)
                .args([
                    "--listen-client-urls",
                    &client,
                    "--advertise-client-urls",
                    &client,
                ])
                .args([
                    "--listen-peer-urls",
                    &peer,
                    "--initial-advertise-peer-urls",
                    &peer,
                ])
                .args(["--initial-cluster", &cluster, "--initial-cluster-state", "new"])
                .args([
                    "--initial-cluster-token",
                    &format!("jio-test-{}", std::process::id()),
                ])
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log handle"))
                .stderr(log),
        )
        .unwrap_or_else(|e| panic!("cannot start etcd ({}): {e}", self.binary.display()));
        m.child = Some(child);
    }

    async fn wait_healthy(&mut self, i: usize) {
        let url = format!("http://127.0.0.1:{}/health", self.members[i].client);
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(child) = self.members[i].child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("etcd member {i} exited with {status}; log:\n{}", self.log_tail(i));
            }
            if let Ok(r) = client.get(&url).timeout(Duration::from_millis(500)).send().await
                && let Ok(body) = r.text().await
                && body.contains("\"true\"")
            {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "etcd member {i} did not become healthy in 20 s; log:\n{}",
                    self.log_tail(i)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self, i: usize) -> String {
        let log = std::fs::read_to_string(&self.members[i].log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The store URL naming every member.
    pub fn url(&self) -> String {
        let eps: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect();
        format!("etcd://{}", eps.join(","))
    }

    /// The client endpoint of member `i` (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client)
    }

    /// The process id of member `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(|c| c.id())
    }

    /// How many members the cluster has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members (never: a cluster has at least one).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The member that leads the cluster now, asked of each member in turn.
    pub async fn leader(&self) -> Option<usize> {
        let client = reqwest::Client::new();
        let mut ids = Vec::new();
        let mut leader = None;
        for i in 0..self.members.len() {
            let r = client
                .post(format!("{}/v3/maintenance/status", self.endpoint(i)))
                .json(&serde_json::json!({}))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            let v: serde_json::Value = match r {
                Ok(r) => r.json().await.unwrap_or_default(),
                Err(_) => serde_json::Value::Null,
            };
            ids.push(v["header"]["member_id"].as_str().map(String::from));
            if let Some(l) = v["leader"].as_str() {
                leader = Some(l.to_string());
            }
        }
        let leader = leader?;
        ids.iter().position(|id| id.as_deref() == Some(leader.as_str()))
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            kill(&mut c);
        }
    }

    /// Starts member `i` again on its data directory and ports; waits until the
    /// cluster answers through it.
    pub async fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_healthy(i).await;
    }

    /// The temporary directory holding the data and logs.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// Writes raw bytes under `key` with the real `etcdctl` (as another program could:
/// nothing checks them), against the endpoints of `url` (`etcd://...`).
pub fn etcdctl_put(url: &str, key: &[u8], value: &[u8]) {
    use std::os::unix::ffi::OsStrExt as _;
    let ok = Command::new(require_binary("etcdctl", INSTALL))
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", url.trim_start_matches("etcd://")))
        .arg("--command-timeout=15s")
        .arg("put")
        .arg(std::ffi::OsStr::from_bytes(key))
        .arg(std::ffi::OsStr::from_bytes(value))
        .stdout(Stdio::null())
        .status()
        .expect("run etcdctl")
        .success();
    assert!(ok, "etcdctl put {} failed", jio_common::encode::escape_bytes(key));
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
