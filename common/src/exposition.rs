//! Prometheus's text exposition format (version 0.0.4): what the agent serves on
//! `/metrics` and writes for node-exporter's textfile collector, and what `jioctl
//! drive` exports. The writing (families, samples, escaping) and the serving (GET
//! `/metrics` over HTTP/1) live here; what is measured belongs to each program.
//!
//! The text format, not OpenMetrics: node-exporter's textfile collector and every
//! Prometheus read it, and it keeps the types of counters (`foo_total`) that
//! OpenMetrics writes under a different family name.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

/// One scrape's text, family by family.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

/// One sample: its labels and its value.
pub type Sample<'a> = (Vec<(&'a str, String)>, f64);

impl Exposition {
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// One family: `# HELP`, `# TYPE` and its samples (nothing when there are none).
    /// A counter's name ends in `_total`, as Prometheus's naming rules ask.
    pub fn family<'a>(
        &mut self,
        name: &str,
        kind: Kind,
        help: &str,
        samples: impl IntoIterator<Item = Sample<'a>>,
    ) -> &mut Exposition {
        let mut samples = samples.into_iter().peekable();
        if samples.peek().is_none() {
            return self;
        }
        let kind = match kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            self.out.push_str(name);
            if !labels.is_empty() {
                self.out.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
                }
                self.out.push('}');
            }
            let _ = writeln!(self.out, " {}", number(value));
        }
        self
    }

    /// One family of a single unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: f64) -> &mut Exposition {
        self.family(name, kind, help, [(Vec::new(), value)])
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// A sample value: integers without a fraction, the special values as Prometheus
/// spells them.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        // Rust writes the shortest text that reads back as the same f64.
        format!("{v}")
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Where metrics are served from: `IP:PORT`, or a bare port (`9464`, `:9464`) on
/// the loopback. The error says why, after the value.
pub fn parse_listen(v: &str) -> Result<SocketAddr, String> {
    let port = v.strip_prefix(':').unwrap_or(v);
    let addr = match port.parse::<u16>() {
        Ok(p) => SocketAddr::from(([127, 0, 0, 1], p)),
        Err(_) => v.parse().map_err(|_| {
            "is not an address to listen on: give IP:PORT (127.0.0.1:9464, [::1]:9464) or a port for the loopback"
                .to_string()
        })?,
    };
    if addr.port() == 0 {
        return Err(
            "names port 0, a port picked at random that Prometheus could not be told: give a port".into(),
        );
    }
    Ok(addr)
}

/// What a scrape of `/metrics` answers.
#[async_trait::async_trait]
pub trait Scrape: Send + Sync + 'static {
    async fn scrape(&self) -> String;
}

/// How long a client may take to send its request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one connection may stay open, whatever it does.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections served at once; more wait in the listen queue. A scraper needs
/// one: the bound keeps a flood of connections from taking the program's file
/// descriptors (which its real work needs).
const MAX_CONNECTIONS: usize = 16;

/// Serves `GET /metrics` on `addr` until `stop` turns true. An address that cannot
/// be taken (in use, not this host's) is logged, naming `setting`, and tried again
/// with backoff: metrics never stop the program they describe. `bound` is told the
/// address once it is served (the port, when `addr` asked for any).
pub async fn serve(
    addr: SocketAddr,
    scrape: Arc<dyn Scrape>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    setting: &'static str,
    bound: impl FnOnce(SocketAddr) + Send,
) {
    let mut backoff = crate::backoff::Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) => {
                if backoff.failures() == 0 {
                    tracing::error!(%addr, error = %e, "cannot serve metrics on {setting}; trying again");
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff.fail()) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    };
    bound(listener.local_addr().unwrap_or(addr));
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut failing = crate::backoff::Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        // A slot first: beyond the bound, connections wait in the kernel's queue.
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s,
            _ = stop.changed() => return,
        };
        let Ok(slot) = slot else { return };
        let conn = tokio::select! {
            c = listener.accept() => c,
            _ = stop.changed() => return,
        };
        let stream = match conn {
            Ok((stream, _)) => {
                failing.succeed();
                stream
            }
            // Out of file descriptors (or another passing failure): said once,
            // then a pause, never a loop that spins.
            Err(e) => {
                if failing.failures() == 0 {
                    tracing::warn!(error = %e, "metrics: cannot accept a connection; pausing");
                }
                tokio::select! {
                    _ = tokio::time::sleep(failing.fail()) => {}
                    _ = stop.changed() => return,
                }
                continue;
            }
        };
        let scrape = scrape.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let scrape = scrape.clone();
                async move { Ok::<_, std::convert::Infallible>(respond(scrape.as_ref(), &req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
        });
    }
}

type Body = http_body_util::Full<bytes::Bytes>;

/// `GET /metrics` (or `HEAD`); anything else is 404 or 405.
async fn respond<B>(scrape: &dyn Scrape, req: &hyper::Request<B>) -> hyper::Response<Body> {
    use hyper::{Method, StatusCode, header};
    let (status, ctype, body) = if req.uri().path() != "/metrics" {
        (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: the metrics are on /metrics\n".to_string(),
        )
    } else if req.method() != Method::GET && req.method() != Method::HEAD {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "method not allowed: use GET\n".to_string(),
        )
    } else {
        (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            scrape.scrape().await,
        )
    };
    let mut resp = hyper::Response::new(Body::new(bytes::Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(ctype));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        resp.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_escaping() {
        let mut e = Exposition::new();
        e.single("up", Kind::Gauge, "1 when\nup", 1.0)
            .family(
                "runs_total",
                Kind::Counter,
                "Runs by result.",
                [
                    (vec![("result", "ok".to_string())], 3.0),
                    (vec![("result", "a\"b\\c\nd".to_string()), ("x", "y".into())], 0.5),
                ],
            )
            .family("empty", Kind::Gauge, "never written", []);
        assert_eq!(
            e.finish(),
            "# HELP up 1 when\\nup\n# TYPE up gauge\nup 1\n\
             # HELP runs_total Runs by result.\n# TYPE runs_total counter\n\
             runs_total{result=\"ok\"} 3\nruns_total{result=\"a\\\"b\\\\c\\nd\",x=\"y\"} 0.5\n"
        );
    }

    #[test]
    fn special_values() {
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
        assert_eq!(number(1_700_000_000.0), "1700000000");
        assert_eq!(number(0.25), "0.25");
    }
}
