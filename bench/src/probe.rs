//! What the agents cost etcd, seen from etcd's side: each member's resident memory
//! (now and at its peak), CPU time, watch streams and watchers, pending events and
//! slow watchers from its own `/metrics`, gRPC messages received, and the client
//! connections established on its port (from `/proc/net/tcp`). Sampled every
//! second while a benchmark runs, so that a peak between two figures is kept.

use std::time::Duration;

use jio_tests::Etcd;
use jio_tests::etcd::metric_sum;
use serde::Serialize;
use tokio::sync::watch;

/// One member, at one moment (gauges), or over a span (counters: `cpu_s`,
/// `grpc_messages`, `sent_mb`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Member {
    pub leader: bool,
    pub rss_mb: f64,
    pub peak_rss_mb: f64,
    pub cpu_s: f64,
    pub connections: usize,
    pub watch_streams: f64,
    pub watchers: f64,
    pub slow_watchers: f64,
    pub pending_events: f64,
    /// gRPC streams open now (started less handled), watches and keep-alives.
    pub open_streams: f64,
    pub grpc_messages: f64,
    pub sent_mb: f64,
}

/// Every member at one moment.
pub async fn sample(etcd: &Etcd) -> Vec<Member> {
    let mut out = Vec::new();
    for i in 0..etcd.len() {
        let text = etcd.metrics(i).await.unwrap_or_default();
        let m = |name: &str| metric_sum(&text, name, &[]);
        let pid = etcd.pid(i).unwrap_or(0);
        out.push(Member {
            leader: m("etcd_server_is_leader") == 1.0,
            rss_mb: proc_kb(pid, "VmRSS:") / 1024.0,
            peak_rss_mb: proc_kb(pid, "VmHWM:") / 1024.0,
            cpu_s: crate::proc_cpu_s(pid),
            connections: established_on(etcd.port(i)),
            watch_streams: m("etcd_debugging_mvcc_watch_stream_total"),
            watchers: m("etcd_debugging_mvcc_watcher_total"),
            slow_watchers: m("etcd_debugging_mvcc_slow_watcher_total"),
            pending_events: m("etcd_debugging_mvcc_pending_events_total"),
            open_streams: metric_sum(&text, "grpc_server_started_total", &["stream\""])
                - metric_sum(&text, "grpc_server_handled_total", &["stream\""]),
            grpc_messages: m("grpc_server_msg_received_total"),
            sent_mb: m("etcd_network_client_grpc_sent_bytes_total") / 1e6,
        });
    }
    out
}

/// The change of the counters from `a` to `b` (gauges as in `b`).
pub fn since(a: &[Member], b: &[Member]) -> Vec<Member> {
    b.iter()
        .zip(a)
        .map(|(b, a)| Member {
            cpu_s: b.cpu_s - a.cpu_s,
            grpc_messages: b.grpc_messages - a.grpc_messages,
            sent_mb: b.sent_mb - a.sent_mb,
            ..b.clone()
        })
        .collect()
}

/// The largest of each gauge over `samples` (counters as in the last).
fn peaks(samples: &[Vec<Member>]) -> Vec<Member> {
    let Some(last) = samples.last() else {
        return Vec::new();
    };
    let mut out = last.clone();
    for s in samples {
        for (o, m) in out.iter_mut().zip(s) {
            o.peak_rss_mb = o.peak_rss_mb.max(m.peak_rss_mb).max(m.rss_mb);
            o.connections = o.connections.max(m.connections);
            o.watch_streams = o.watch_streams.max(m.watch_streams);
            o.watchers = o.watchers.max(m.watchers);
            o.slow_watchers = o.slow_watchers.max(m.slow_watchers);
            o.pending_events = o.pending_events.max(m.pending_events);
            o.open_streams = o.open_streams.max(m.open_streams);
        }
    }
    out
}

/// Samples every member each second until stopped; `stop` returns the peaks.
pub struct Sampler {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<Vec<Member>>>,
}

impl Sampler {
    pub fn start(etcd: std::sync::Arc<Etcd>) -> Sampler {
        let (stop, mut rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut all = Vec::new();
            loop {
                all.push(sample(&etcd).await);
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = rx.changed() => return all,
                }
            }
        });
        Sampler { stop, task }
    }

    pub async fn stop(self) -> Vec<Member> {
        let _ = self.stop.send(true);
        self.task.await.map(|s| peaks(&s)).unwrap_or_default()
    }
}

/// A `kB` figure of `/proc/PID/status`.
fn proc_kb(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// TCP connections established to local `port` (the server's side).
pub fn established_on(port: u16) -> usize {
    jio_tests::etcd::established(|s| s.local_port == port)
}

/// The table lines for `members`; the cost per agent is what the peak adds to
/// `base` (the members before any agent started).
pub fn lines(title: &str, members: &[Member], base: &[Member], agents: usize, span: Duration) -> Vec<String> {
    let per = |x: f64| if agents > 0 { x / agents as f64 } else { 0.0 };
    let secs = span.as_secs_f64().max(0.001);
    let mut out = vec![title.to_string()];
    for (i, m) in members.iter().enumerate() {
        out.push(format!(
            "   member {i}{}: rss {:.0} MB (peak {:.0} MB), cpu {:.1}s, {} connections, {:.0} watch streams, {:.0} watchers, {:.0} open gRPC streams, {:.0} slow watchers, {:.0} pending events, {:.0} gRPC messages/s, {:.1} MB sent",
            if m.leader { " (leader)" } else { "" },
            m.rss_mb,
            m.peak_rss_mb,
            m.cpu_s,
            m.connections,
            m.watch_streams,
            m.watchers,
            m.open_streams,
            m.slow_watchers,
            m.pending_events,
            m.grpc_messages / secs,
            m.sent_mb,
        ));
    }
    let sum = |f: fn(&Member) -> f64| members.iter().map(f).sum::<f64>();
    let base_rss: f64 = base.iter().map(|m| m.rss_mb).sum();
    out.push(format!(
        "   per agent: {:.3} MB of etcd memory at the peak (all members, less {:.0} MB before the agents), {:.2} connections, {:.2} watch streams, {:.2} watchers, {:.2} open gRPC streams",
        per(sum(|m| m.peak_rss_mb) - base_rss),
        base_rss,
        per(sum(|m| m.connections as f64)),
        per(sum(|m| m.watch_streams)),
        per(sum(|m| m.watchers)),
        per(sum(|m| m.open_streams)),
    ));
    out
}
