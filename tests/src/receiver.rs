//! A real HTTP receiver of notifications (a webhook endpoint) for the tests: it
//! records every JSON body POSTed to it, in the order received, and can be taken
//! down (connections refused) and brought back on the same port, to test delivery
//! that retries.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt as _;

use crate::process::free_port;

/// Every body received, and the ones that were not JSON.
type Received = Arc<Mutex<Vec<serde_json::Value>>>;

pub struct Receiver {
    port: u16,
    received: Received,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    serving: Option<tokio::task::JoinHandle<()>>,
}

impl Receiver {
    /// Listens on a free loopback port.
    pub async fn start() -> Receiver {
        let mut r = Receiver {
            port: free_port(),
            received: Arc::default(),
            stop: None,
            serving: None,
        };
        r.up().await;
        r
    }

    /// The URL to POST to (`http://127.0.0.1:PORT/hook`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Every JSON body received, in order (a body that is not JSON is recorded as
    /// `{"not_json": "<text>"}`).
    pub fn received(&self) -> Vec<serde_json::Value> {
        self.received.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Stops listening (the listener is closed when this returns): connections
    /// are refused until `up`.
    pub async fn down(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(task) = self.serving.take() {
            let _ = task.await;
        }
    }

    /// Listens again, on the same port.
    pub async fn up(&mut self) {
        self.down().await;
        let listener = bind(self.port).await;
        let (tx, rx) = tokio::sync::watch::channel(false);
        self.stop = Some(tx);
        self.serving = Some(tokio::spawn(serve(listener, self.received.clone(), rx)));
    }

    /// Waits (up to `within`) until at least `n` bodies were received.
    pub async fn until(&self, n: usize, within: Duration) -> Vec<serde_json::Value> {
        let start = std::time::Instant::now();
        loop {
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            assert!(
                start.elapsed() < within,
                "{} of {n} notifications within {within:?}: {got:#?}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
    }
}

/// Binds the port (just given up by this process: retried for a few seconds).
async fn bind(port: u16) -> tokio::net::TcpListener {
    let start = std::time::Instant::now();
    loop {
        match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
            Ok(l) => return l,
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "the receiver cannot listen on 127.0.0.1:{port}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Accepts connections until told to stop, then drops the listener.
async fn serve(
    listener: tokio::net::TcpListener,
    received: Received,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            c = listener.accept() => match c {
                Ok((s, _)) => s,
                Err(_) => continue,
            },
            _ = stop.changed() => return,
        };
        let received = received.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let received = received.clone();
                async move {
                    let body = req
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let value = serde_json::from_slice(&body)
                        .unwrap_or_else(|_| serde_json::json!({"not_json": String::from_utf8_lossy(&body)}));
                    received.lock().unwrap_or_else(|p| p.into_inner()).push(value);
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(http_body_util::Full::new(
                        bytes::Bytes::from_static(b"ok"),
                    )))
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            // A connection open when the receiver goes down ends with it.
            let mut stop = stop;
            tokio::select! {
                _ = conn => {}
                _ = stop.changed() => {}
            }
        });
    }
}
