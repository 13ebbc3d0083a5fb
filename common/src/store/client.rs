//! The HTTP clients of the networked stores (Consul; etcd's gRPC client takes the
//! same checked files from `tls_pem`), plain or TLS.
//!
//! Every file is read and checked once, when the store is opened: a CA file with no
//! certificate, a client certificate without its key, or a private key readable by
//! group or others is an error naming the file, before any request is sent.
//!
//! `server_name` makes each endpoint's client connect to the endpoint's address
//! while checking the certificate (and sending SNI) for that name: the base URL
//! names the server name, and a resolver of that one client answers with the
//! endpoint's own host, looked up when a connection is made.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::url::TlsSettings;

/// One endpoint: the base URL of its requests and the client that sends them.
#[derive(Clone)]
pub(crate) struct EndpointClient {
    pub base: String,
    pub http: reqwest::Client,
}

/// The clients of `endpoints` (`host:port`), TLS when `tls` is set. The error names
/// the setting and the file.
pub(crate) fn endpoint_clients(
    endpoints: &[String],
    tls: Option<&TlsSettings>,
    connect_timeout: Duration,
) -> Result<Vec<EndpointClient>, String> {
    let builder = || {
        reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .tcp_nodelay(true)
    };
    let Some(tls) = tls else {
        let http = build(builder())?;
        return Ok(endpoints
            .iter()
            .map(|e| EndpointClient {
                base: format!("http://{e}"),
                http: http.clone(),
            })
            .collect());
    };
    let ca = match &tls.ca_file {
        Some(p) => Some(read_ca(p)?),
        None => None,
    };
    let identity = match (&tls.cert_file, &tls.key_file) {
        (Some(c), Some(k)) => Some(read_identity(c, k)?),
        _ => None,
    };
    let configure = |mut b: reqwest::ClientBuilder| {
        if let Some(ca) = &ca {
            // Only the site's CA: a certificate from any public CA is not the store.
            b = b.tls_certs_only(ca.iter().cloned());
        }
        if let Some(id) = &identity {
            b = b.identity(id.clone());
        }
        b.https_only(true)
    };
    match &tls.server_name {
        None => {
            let http = build(configure(builder()))?;
            Ok(endpoints
                .iter()
                .map(|e| EndpointClient {
                    base: format!("https://{e}"),
                    http: http.clone(),
                })
                .collect())
        }
        Some(name) => endpoints
            .iter()
            .map(|e| {
                let (host, port) = split_endpoint(e);
                let name_host = if name.contains(':') {
                    format!("[{name}]")
                } else {
                    name.clone()
                };
                let http = build(configure(builder()).dns_resolver(Arc::new(EndpointHost {
                    host: host.to_string(),
                    port,
                })))?;
                Ok(EndpointClient {
                    base: format!("https://{name_host}:{port}"),
                    http,
                })
            })
            .collect(),
    }
}

/// A client for other HTTP(S) servers of the site (the package repository),
/// checked with `tls`'s files as the stores' clients are (`server_name` aside):
/// only `ca_file`'s CAs when it is given, the client certificate when given. Every
/// request gives up after `timeout`. The error names the setting and the file.
pub fn http_client(tls: &TlsSettings, timeout: Duration) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .connect_timeout(timeout)
        .timeout(timeout);
    if let Some(p) = &tls.ca_file {
        b = b.tls_certs_only(read_ca(p)?);
    }
    if let (Some(c), Some(k)) = (&tls.cert_file, &tls.key_file) {
        b = b.identity(read_identity(c, k)?);
    }
    build(b)
}

/// The PEM files of `tls`, read and checked as for the HTTP clients: the CA bundle,
/// and the client certificate with its key (for etcd's gRPC client).
pub(crate) struct TlsPem {
    pub ca: Option<Vec<u8>>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

pub(crate) fn tls_pem(tls: &TlsSettings) -> Result<TlsPem, String> {
    let ca = match &tls.ca_file {
        Some(p) => {
            read_ca(p)?;
            Some(std::fs::read(p).map_err(|e| format!("ca_file {}: {e}", p.display()))?)
        }
        None => None,
    };
    let identity = match (&tls.cert_file, &tls.key_file) {
        (Some(c), Some(k)) => {
            read_identity(c, k)?;
            let cert = std::fs::read(c).map_err(|e| format!("cert_file {}: {e}", c.display()))?;
            let key = std::fs::read(k).map_err(|e| format!("key_file {}: {e}", k.display()))?;
            Some((cert, key))
        }
        _ => None,
    };
    Ok(TlsPem { ca, identity })
}

fn build(b: reqwest::ClientBuilder) -> Result<reqwest::Client, String> {
    b.build()
        .map_err(|e| format!("cannot build an HTTP client: {}", error_chain(&e)))
}

/// `host:port` or `[v6]:port`, as `StoreUrl` validated it.
fn split_endpoint(e: &str) -> (&str, u16) {
    let (host, port) = e.rsplit_once(':').unwrap_or((e, "0"));
    (
        host.trim_start_matches('[').trim_end_matches(']'),
        port.parse().unwrap_or(0),
    )
}

fn read_ca(path: &Path) -> Result<Vec<reqwest::Certificate>, String> {
    let fail = |reason: &str| format!("ca_file {}: {reason}", path.display());
    let pem = std::fs::read(path).map_err(|e| fail(&e.to_string()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| fail(&e.to_string()))?;
    if certs.is_empty() {
        return Err(fail("holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
    }
    Ok(certs)
}

fn read_identity(cert: &Path, key: &Path) -> Result<reqwest::Identity, String> {
    let cert_pem = std::fs::read(cert).map_err(|e| format!("cert_file {}: {e}", cert.display()))?;
    if !contains(&cert_pem, b"-----BEGIN CERTIFICATE-----") {
        return Err(format!(
            "cert_file {}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            cert.display()
        ));
    }
    crate::secret::check_private(key).map_err(|r| format!("key_file {}: {r}", key.display()))?;
    let key_pem = std::fs::read(key).map_err(|e| format!("key_file {}: {e}", key.display()))?;
    if !contains(&key_pem, b"PRIVATE KEY-----") {
        return Err(format!(
            "key_file {}: holds no PEM private key (-----BEGIN PRIVATE KEY-----)",
            key.display()
        ));
    }
    let mut both = cert_pem;
    both.push(b'\n');
    both.extend_from_slice(&key_pem);
    reqwest::Identity::from_pem(&both).map_err(|e| {
        format!(
            "cert_file {} with key_file {}: {e}",
            cert.display(),
            key.display()
        )
    })
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Resolves whatever name a request carries to one endpoint's own host.
struct EndpointHost {
    host: String,
    port: u16,
}

impl reqwest::dns::Resolve for EndpointHost {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (host, port) = (self.host.clone(), self.port);
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port)).await?.collect();
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// A TLS refusal, told apart from a network failure (it will not go away by retrying
/// the same endpoint), as one sentence with what to check. `None`: not a refusal
/// (a connection closed during the handshake is a network failure).
pub(crate) fn tls_failure(chain: &str, tls: Option<&TlsSettings>) -> Option<String> {
    let tls = tls?;
    let ca = tls
        .ca_file
        .as_ref()
        .map(|p| format!("ca_file {}", p.display()))
        .unwrap_or_else(|| "the system's trusted CAs (no ca_file given)".into());
    let lower = chain.to_ascii_lowercase();
    let what = if lower.contains("invalid peer certificate") {
        if lower.contains("notvalidforname") || lower.contains("not valid for name") {
            format!(
                "the server's certificate does not name the host connected to (set server_name to a name it carries); {}",
                excerpt(chain)
            )
        } else if lower.contains("expired") {
            format!("the server's certificate has expired; {}", excerpt(chain))
        } else {
            format!(
                "the server's certificate is not signed by {ca}; {}",
                excerpt(chain)
            )
        }
    } else if lower.contains("fatal alert") || lower.contains("certificate required") {
        match &tls.cert_file {
            Some(p) => format!(
                "the server refused the client certificate {} (unknown CA, expired, or not for client use); {}",
                p.display(),
                excerpt(chain)
            ),
            None => format!(
                "the server wants a client certificate and none is configured (give cert_file and key_file); {}",
                excerpt(chain)
            ),
        }
    } else {
        return None;
    };
    Some(format!("TLS: {what}"))
}

/// The last two causes of an error chain: where rustls says what it refused.
fn excerpt(chain: &str) -> String {
    let parts: Vec<&str> = chain.split(": ").collect();
    parts[parts.len().saturating_sub(2)..].join(": ")
}

/// An error and its causes, on one line.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}
