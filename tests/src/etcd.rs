//! A real etcd (Debian's `etcd-server`): one member or a cluster on loopback, plain,
//! or secure: TLS with client-certificate verification and authentication on, with
//! the `jio-agent` and `jio-operator` roles made by `packaging/etcd-roles.sh`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::pki::Pki;
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
    secure: Option<Secure>,
    /// The HTTP client of `metrics`, made once (a benchmark samples every second,
    /// with the process's files nearly all in use).
    http: std::sync::OnceLock<reqwest::Client>,
    /// More flags for every member (the benchmark's raft timing).
    flags: Vec<String>,
}

/// What a secure etcd was started with.
struct Secure {
    pki: Pki,
    token_ttl: u64,
    /// TLS with client-certificate verification on the client port.
    tls: bool,
    /// Authentication enabled, with the roles and users.
    auth: bool,
}

/// The users of a secure etcd (each with a password file readable by the owner only).
pub const USERS: [&str; 3] = ["root", "jio-agent", "jio-operator"];

impl Etcd {
    /// One member, healthy.
    pub async fn start() -> Etcd {
        Etcd::cluster(1).await
    }

    /// `n` members forming one cluster, healthy.
    pub async fn cluster(n: usize) -> Etcd {
        Etcd::cluster_with(n, &[]).await
    }

    /// `cluster`, each member started with `flags` besides the harness's own.
    pub async fn cluster_with(n: usize, flags: &[&str]) -> Etcd {
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
        let mut etcd = Etcd {
            dir,
            members,
            binary,
            secure: None,
            http: std::sync::OnceLock::new(),
            flags: flags.iter().map(|f| f.to_string()).collect(),
        };
        for i in 0..n {
            etcd.spawn(i);
        }
        for i in 0..n {
            etcd.wait_healthy(i).await;
        }
        etcd
    }

    /// One member with TLS and client-certificate verification on its client port,
    /// authentication enabled, tokens that expire after `token_ttl` seconds, the roles
    /// of `packaging/etcd-roles.sh` for the key prefix `prefix`, and a user of each
    /// role (named after it) besides root.
    pub async fn secure(token_ttl: u64, prefix: &str) -> Etcd {
        Etcd::secure_parts(true, true, token_ttl, prefix).await
    }

    /// Like `secure`, with TLS or authentication alone (to measure what each costs).
    pub async fn secure_parts(tls: bool, auth: bool, token_ttl: u64, prefix: &str) -> Etcd {
        let binary = require_binary("etcd", INSTALL);
        require_binary("etcdctl", INSTALL);
        let dir = tempfile::Builder::new()
            .prefix("jio-etcd-tls-")
            .tempdir()
            .expect("temporary directory");
        let pki = Pki::create(&dir.path().join("pki"));
        let members = vec![Member {
            name: "n0".into(),
            client: free_port(),
            peer: free_port(),
            data: dir.path().join("n0.etcd"),
            log: dir.path().join("n0.log"),
            child: None,
        }];
        let mut etcd = Etcd {
            dir,
            members,
            binary,
            secure: Some(Secure {
                pki,
                token_ttl,
                tls,
                auth,
            }),
            http: std::sync::OnceLock::new(),
            flags: Vec::new(),
        };
        etcd.spawn(0);
        etcd.wait_healthy(0).await;
        if !auth {
            return etcd;
        }
        for user in USERS {
            use std::os::unix::fs::PermissionsExt as _;
            let f = etcd.password_file(user);
            std::fs::write(&f, format!("{user}-pw-{}\n", std::process::id())).expect("password file");
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/etcd-roles.sh");
        let root = etcd.password_file("root");
        for args in [
            vec!["--prefix", prefix, "roles"],
            vec!["user", "root", "root", root.to_str().expect("path")],
            vec!["user", "jio-agent", "jio-agent", ""],
            vec!["user", "jio-operator", "jio-operator", ""],
        ] {
            let mut args: Vec<String> = args.into_iter().map(String::from).collect();
            if args[0] == "user" && args[3].is_empty() {
                args[3] = etcd.password_file(&args[1]).display().to_string();
            }
            let out = etcd.etcdctl_command(Command::new("sh").arg(script).args(&args), false);
            assert!(
                out.status.success(),
                "etcd-roles.sh {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let out = etcd.etcdctl_command(
            Command::new(require_binary("etcdctl", INSTALL)).args(["auth", "enable"]),
            false,
        );
        assert!(
            out.status.success(),
            "auth enable: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        etcd
    }

    /// The certificates of a secure etcd.
    pub fn pki(&self) -> &Pki {
        &self.secure.as_ref().expect("a secure etcd").pki
    }

    /// The file holding `user`'s password.
    pub fn password_file(&self, user: &str) -> PathBuf {
        self.dir.path().join(format!("{user}.password"))
    }

    /// The store URL of a secure etcd for `user`: TLS with the CA and the good client
    /// certificate, and the user's password file.
    pub fn url_as(&self, user: &str) -> String {
        let s = self.secure.as_ref().expect("a secure etcd");
        let mut q = Vec::new();
        if s.tls {
            q.push(format!("ca_file={}", s.pki.ca.display()));
            q.push(format!("cert_file={}", s.pki.client.cert.display()));
            q.push(format!("key_file={}", s.pki.client.key.display()));
        }
        if s.auth {
            q.push(format!("user={user}"));
            q.push(format!("password_file={}", self.password_file(user).display()));
        }
        format!(
            "{}://127.0.0.1:{}{}{}",
            if s.tls { "etcds" } else { "etcd" },
            self.members[0].client,
            if q.is_empty() { "" } else { "?" },
            q.join("&")
        )
    }

    /// Whether this etcd runs TLS and authentication.
    pub fn is_secure(&self) -> bool {
        self.secure.is_some()
    }

    /// Writes raw bytes under a raw key through member 0's gateway, as another
    /// program could (nothing checks them); as root on a secure etcd.
    pub async fn put_raw(&self, key: &[u8], value: &[u8]) {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let client = self.http_client();
        let mut req = client
            .post(format!("{}/v3/kv/put", self.endpoint(0)))
            .json(&serde_json::json!({"key": b64(key), "value": b64(value)}));
        if self.secure.as_ref().is_some_and(|s| s.auth) {
            let pw = std::fs::read_to_string(self.password_file("root")).expect("root password");
            let r: serde_json::Value = client
                .post(format!("{}/v3/auth/authenticate", self.endpoint(0)))
                .json(&serde_json::json!({"name": "root", "password": pw.trim()}))
                .send()
                .await
                .expect("authenticate")
                .json()
                .await
                .expect("token");
            req = req.header("Authorization", r["token"].as_str().expect("token"));
        }
        let r = req.send().await.expect("put");
        assert!(r.status().is_success(), "{r:?}");
    }

    /// An HTTP client that reaches member 0 (with the CA and the good client
    /// certificate when secure).
    fn http_client(&self) -> reqwest::Client {
        match &self.secure {
            Some(s) if s.tls => {
                let ca = std::fs::read(&s.pki.ca).expect("CA");
                let mut id = std::fs::read(&s.pki.client.cert).expect("client certificate");
                id.extend(std::fs::read(&s.pki.client.key).expect("client key"));
                reqwest::Client::builder()
                    .tls_certs_only(reqwest::Certificate::from_pem_bundle(&ca).expect("CA PEM"))
                    .identity(reqwest::Identity::from_pem(&id).expect("client identity"))
                    .build()
                    .expect("TLS client")
            }
            _ => reqwest::Client::new(),
        }
    }

    /// `etcdctl ARGS` against member 0, as root once authentication is on.
    pub fn etcdctl(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new(require_binary("etcdctl", INSTALL));
        cmd.args(args);
        self.etcdctl_command(&mut cmd, true)
    }

    fn etcdctl_command(&self, cmd: &mut Command, as_root: bool) -> std::process::Output {
        cmd.env("ETCDCTL_API", "3")
            .env("ETCDCTL_ENDPOINTS", self.endpoint(0))
            .env("ETCDCTL_DIAL_TIMEOUT", "5s");
        if let Some(s) = &self.secure {
            if s.tls {
                cmd.env("ETCDCTL_CACERT", &s.pki.ca)
                    .env("ETCDCTL_CERT", &s.pki.client.cert)
                    .env("ETCDCTL_KEY", &s.pki.client.key);
            }
            if as_root && s.auth {
                let root = std::fs::read_to_string(self.password_file("root")).expect("root password");
                cmd.env("ETCDCTL_USER", format!("root:{}", root.trim()));
            }
        }
        cmd.stdin(Stdio::null()).output().expect("run etcdctl")
    }

    fn spawn(&mut self, i: usize) {
        let cluster = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let flags = self.flags.clone();
        let m = &mut self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .expect("etcd log file");
        let tls = self.secure.as_ref().is_some_and(|s| s.tls);
        let scheme = if tls { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let mut cmd = Command::new(&self.binary);
        if let Some(s) = &self.secure {
            if s.tls {
                cmd.arg("--cert-file")
                    .arg(&s.pki.server.cert)
                    .arg("--key-file")
                    .arg(&s.pki.server.key)
                    .arg("--trusted-ca-file")
                    .arg(&s.pki.ca)
                    .arg("--client-cert-auth");
            }
            cmd.arg("--auth-token-ttl").arg(s.token_ttl.to_string());
        }
        let child = spawn_tied(
            cmd.args(&flags)
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
        let url = format!("{}/health", self.endpoint(i));
        let client = self.http_client();
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

    /// The client endpoint of member `i` (`http://127.0.0.1:PORT`, `https://` when secure).
    pub fn endpoint(&self, i: usize) -> String {
        let scheme = if self.secure.as_ref().is_some_and(|s| s.tls) {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://127.0.0.1:{}", self.members[i].client)
    }

    /// Member `i`'s Prometheus metrics text (`GET /metrics` on its client port).
    pub async fn metrics(&self, i: usize) -> Result<String, reqwest::Error> {
        self.http
            .get_or_init(|| self.http_client())
            .get(format!("{}/metrics", self.endpoint(i)))
            .timeout(Duration::from_secs(5))
            .send()
            .await?
            .text()
            .await
    }

    /// The client port of member `i`.
    pub fn port(&self, i: usize) -> u16 {
        self.members[i].client
    }

    /// The process id of member `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(|c| c.id())
    }

    /// TCP connections this process has established to member `i`'s client port
    /// (sockets of `/proc/net/tcp` whose inodes are among `/proc/self/fd`).
    pub fn connections_to(&self, i: usize) -> usize {
        let ours: std::collections::BTreeSet<String> = std::fs::read_dir("/proc/self/fd")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|l| {
                let l = l.to_string_lossy().into_owned();
                Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
            })
            .collect();
        let port = self.port(i);
        established(|s| s.remote_port == port && ours.contains(&s.inode))
    }

    /// Closes the harness's own HTTP connections to the members (kept open between
    /// health checks), for a test that counts the connections of the code it tests.
    pub async fn close_own_connections(&mut self) {
        self.http.take();
        // The pool's connections close in the background.
        tokio::time::sleep(Duration::from_millis(200)).await;
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

/// etcd's gRPC proxy (`etcd grpc-proxy start`, in the same binary) in front of a
/// plain cluster: clients connect to it, and it carries them to the members on its
/// own few connections, with identical watches coalesced. Stopped on drop.
pub struct GrpcProxy {
    port: u16,
    child: Child,
}

impl Etcd {
    /// Starts a gRPC proxy for every member; waits until a request through it is
    /// answered.
    pub async fn grpc_proxy(&self) -> GrpcProxy {
        assert!(
            self.secure.is_none(),
            "the harness's gRPC proxy is for a plain cluster"
        );
        let port = free_port();
        let endpoints: Vec<String> = (0..self.len())
            .map(|i| format!("127.0.0.1:{}", self.port(i)))
            .collect();
        let log_path = self.dir.path().join(format!("grpc-proxy-{port}.log"));
        let log = std::fs::File::create(&log_path).expect("proxy log file");
        let child = spawn_tied(
            Command::new(&self.binary)
                .args(["grpc-proxy", "start", "--endpoints", &endpoints.join(",")])
                .args(["--listen-addr", &format!("127.0.0.1:{port}")])
                .stdout(Stdio::null())
                .stderr(log),
        )
        .expect("start etcd grpc-proxy");
        let proxy = GrpcProxy { port, child };
        let url = jio_common::store::StoreUrl::parse(&proxy.url()).expect("proxy url");
        let store = jio_common::store::EtcdStore::new(&url, jio_common::store::EtcdOptions::default())
            .expect("a client of the proxy");
        let probe = jio_common::keys::Key::new("/grpc-proxy-probe").expect("key");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            use jio_common::store::Store as _;
            match store.get(&probe).await {
                Ok(_) => return proxy,
                Err(e) if Instant::now() > deadline => panic!(
                    "etcd grpc-proxy did not answer in 20 s ({e}); log:\n{}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                ),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

impl GrpcProxy {
    /// The store URL of the proxy.
    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for GrpcProxy {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// The sum of every series of metric `name` in Prometheus text whose labels hold
/// each of `labels` (such as `grpc_method="Watch"`), 0 when none: etcd's own
/// counters and gauges, read by the tests and the benchmark as an independent view
/// of what clients cost it.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (have, value) = match rest.strip_prefix('{') {
                Some(r) => r.split_once('}')?,
                None => ("", rest),
            };
            // A longer name sharing this one's start, or a series not asked for.
            if !value.starts_with(' ') || !labels.iter().all(|want| have.contains(want)) {
                return None;
            }
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

/// One established TCP socket of this machine, from `/proc/net/tcp{,6}`.
pub struct Socket {
    pub local_port: u16,
    pub remote_port: u16,
    pub inode: String,
}

/// How many established TCP sockets (IPv4 and IPv6) `keep` keeps.
pub fn established(keep: impl Fn(&Socket) -> bool) -> usize {
    let port = |addr: &str| {
        addr.rsplit(':')
            .next()
            .and_then(|p| u16::from_str_radix(p, 16).ok())
    };
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .skip(1)
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    (f.len() > 9 && f[3] == "01").then_some(())?;
                    Some(Socket {
                        local_port: port(f[1])?,
                        remote_port: port(f[2])?,
                        inode: f[9].to_string(),
                    })
                })
                .collect::<Vec<_>>()
        })
        .filter(|s| keep(s))
        .count()
}
