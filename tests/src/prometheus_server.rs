//! A real Prometheus (Debian's `prometheus`) on loopback, scraping the targets a
//! test names and evaluating its alerting rules, and a small exporter whose
//! samples a test sets: what alert gates are tested against. The server is
//! stopped when dropped (and dies with the test process).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::process::{free_port, kill, require_binary, spawn_tied};

/// A Prometheus server of the test's own.
pub struct Prometheus {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus on 127.0.0.1 scraping `targets` (`HOST:PORT`) every
    /// `every`, evaluating `rules` (the YAML of a rule file, `groups: ...`) as
    /// often, and waits until it answers. Fails the test when `prometheus` is
    /// missing, naming the package.
    pub async fn start(targets: &[String], rules: &str, every: Duration) -> Prometheus {
        let dir = tempfile::tempdir().expect("a directory for Prometheus");
        std::fs::write(dir.path().join("rules.yml"), rules).expect("write the rule file");
        std::fs::write(dir.path().join("prometheus.yml"), config(targets, every))
            .expect("write the configuration");
        let mut p = Prometheus {
            child: None,
            port: free_port(),
            dir,
        };
        p.run().await;
        p
    }

    /// Starts (or starts again, on the same port and data) the server.
    async fn run(&mut self) {
        let bin = require_binary("prometheus", "apt-get install prometheus");
        let log = std::fs::File::create(self.dir.path().join("prometheus.log")).expect("the log file");
        let child = spawn_tied(
            Command::new(bin)
                .arg(format!("--config.file={}", self.path("prometheus.yml").display()))
                .arg(format!("--storage.tsdb.path={}", self.path("data").display()))
                .arg(format!("--web.listen-address=127.0.0.1:{}", self.port))
                .arg("--log.level=warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log),
        )
        .expect("start prometheus");
        self.child = Some(child);
        let start = std::time::Instant::now();
        while !reqwest::get(format!("{}/-/ready", self.url()))
            .await
            .is_ok_and(|r| r.status() == reqwest::StatusCode::OK)
        {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "prometheus did not become ready within 60 s; its log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Its HTTP API's base URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("prometheus.log")).unwrap_or_default()
    }

    /// Stops it (SIGKILL): it answers nothing any more.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill(&mut c);
        }
    }

    /// Starts it again after `stop`, on the same port.
    pub async fn restart(&mut self) {
        self.stop();
        self.run().await;
    }

    /// The alerts it holds, as `(alertname, state)` (`pending`, `firing`), from
    /// its own API.
    pub async fn alerts(&self) -> Vec<(String, String)> {
        let v: serde_json::Value = reqwest::get(format!("{}/api/v1/alerts", self.url()))
            .await
            .expect("GET /api/v1/alerts")
            .json()
            .await
            .expect("the alerts as JSON");
        v["data"]["alerts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|x| {
                        let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                        (s(&x["labels"]["alertname"]), s(&x["state"]))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits (up to a minute) until `alert` is firing (`true`) or gone (`false`),
    /// by its own API.
    pub async fn until_firing(&self, alert: &str, firing: bool) {
        let start = std::time::Instant::now();
        loop {
            let alerts = self.alerts().await;
            let is = alerts.iter().any(|(n, s)| n == alert && s == "firing");
            if is == firing {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{alert} not {} within 60 s: {alerts:?}",
                if firing { "firing" } else { "resolved" }
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The configuration: one job scraping `targets`, rules from `rules.yml`.
fn config(targets: &[String], every: Duration) -> String {
    let every = format!("{}ms", every.as_millis());
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    format!(
        "global:\n  scrape_interval: {every}\n  evaluation_interval: {every}\nrule_files:\n  - rules.yml\nscrape_configs:\n  - job_name: fleet\n    static_configs:\n      - targets: [{}]\n",
        targets.join(", ")
    )
}

/// A `/metrics` endpoint whose samples the test sets (the text exposition format).
pub struct Exporter {
    samples: Arc<Mutex<Vec<(String, f64)>>>,
    addr: std::net::SocketAddr,
    _stop: tokio::sync::watch::Sender<bool>,
}

struct Samples(Arc<Mutex<Vec<(String, f64)>>>);

#[async_trait::async_trait]
impl jio_common::exposition::Scrape for Samples {
    async fn scrape(&self) -> String {
        let samples = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        samples.iter().map(|(s, v)| format!("{s} {v}\n")).collect()
    }
}

impl Exporter {
    /// Serves `GET /metrics` on a free loopback port.
    pub async fn start() -> Exporter {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
        let (stop, rx) = tokio::sync::watch::channel(false);
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
        let scrape = Arc::new(Samples(samples.clone()));
        tokio::spawn(async move {
            jio_common::exposition::serve(addr, scrape, rx, "the test exporter", |a| {
                let _ = bound_tx.send(a);
            })
            .await;
        });
        let addr = tokio::time::timeout(Duration::from_secs(30), bound_rx)
            .await
            .expect("the exporter listens within 30 s")
            .expect("the exporter's address");
        Exporter {
            samples,
            addr,
            _stop: stop,
        }
    }

    /// `HOST:PORT`, as a scrape target.
    pub fn target(&self) -> String {
        self.addr.to_string()
    }

    /// Sets `series` (`name` or `name{label="v"}`) to `value`.
    pub fn set(&self, series: &str, value: f64) {
        let mut s = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        match s.iter_mut().find(|(n, _)| n == series) {
            Some(x) => x.1 = value,
            None => s.push((series.to_string(), value)),
        }
    }
}
