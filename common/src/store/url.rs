//! Store URLs: `etcd://host:port[,host:port...]`, `etcds://...` (TLS), `sqlite://PATH`,
//! `consul://...` and `consuls://...` (TLS).
//!
//! Everything a connection needs is in the URL: TLS files and a user go in its query
//! (`etcds://10.0.0.1:2379?ca_file=/etc/jiocloud/etcd-ca.pem&user=jio-agent&password_file=...`),
//! as Consul's `token_file` and `dc` already did. A URL holds file names, never a
//! secret, so it may be printed; and a `--store` flag replaces the whole connection,
//! so the CA of one store is never used with the endpoints of another.

use std::fmt;
use std::path::PathBuf;

use super::api::StoreError;

/// A parsed store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// etcd v3 through its HTTP/JSON gateway; several endpoints fail over. `tls` is
    /// set for `etcds://`.
    Etcd {
        endpoints: Vec<String>,
        tls: Option<TlsSettings>,
        auth: Option<EtcdAuth>,
    },
    /// The embedded SQLite store in one file.
    Sqlite { path: PathBuf },
    /// Consul's HTTP API (`tls` set for `consuls://`), with an optional datacenter
    /// and a file holding the ACL token.
    Consul {
        endpoints: Vec<String>,
        tls: Option<TlsSettings>,
        datacenter: Option<String>,
        token_file: Option<PathBuf>,
    },
}

/// How a TLS connection to the store is checked and authenticated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// The CA certificates (PEM) that sign the servers' certificates; without it, the
    /// system's trusted CAs.
    pub ca_file: Option<PathBuf>,
    /// The client certificate chain (PEM), for servers that verify clients.
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM); must not be readable by group or others.
    pub key_file: Option<PathBuf>,
    /// The name the servers' certificates must carry, when it is not the endpoint's
    /// host (endpoints given as addresses, certificates issued for a name).
    pub server_name: Option<String>,
}

/// An etcd user, whose password is read from a private file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    pub user: String,
    pub password_file: PathBuf,
}

/// The query parameters of a URL, each at most once, in a fixed order when printed.
#[derive(Debug, Default)]
struct Query {
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    server_name: Option<String>,
    user: Option<String>,
    password_file: Option<PathBuf>,
    dc: Option<String>,
    token_file: Option<PathBuf>,
}

impl Query {
    /// Parses `query`, accepting only the parameters in `allowed`.
    fn parse(query: &str, allowed: &[&str]) -> Result<Query, String> {
        let mut q = Query::default();
        for kv in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("parameter {kv:?} has no value (expected NAME=VALUE)"))?;
            if matches!(k, "password" | "token") {
                return Err(format!(
                    "parameter {k:?}: a secret never goes in the URL; give {k}_file=PATH, a file readable by its owner only"
                ));
            }
            if !allowed.contains(&k) {
                return Err(format!(
                    "unknown parameter {k:?} (allowed here: {})",
                    allowed.join(", ")
                ));
            }
            q.set(k, v)?;
        }
        Ok(q)
    }

    /// Sets the parameter `k` (one of the known ones) to `v`, once.
    fn set(&mut self, k: &str, v: &str) -> Result<(), String> {
        let first = match k {
            "ca_file" | "cert_file" | "key_file" | "password_file" | "token_file" => {
                let slot = match k {
                    "ca_file" => &mut self.ca_file,
                    "cert_file" => &mut self.cert_file,
                    "key_file" => &mut self.key_file,
                    "password_file" => &mut self.password_file,
                    _ => &mut self.token_file,
                };
                slot.replace(absolute_path(k, v)?).is_none()
            }
            "server_name" => self.server_name.replace(server_name(v)?).is_none(),
            "user" => self.user.replace(user_name(v)?).is_none(),
            "dc" => self.dc.replace(datacenter(v)?).is_none(),
            _ => unreachable!("checked against `allowed`"),
        };
        if first {
            Ok(())
        } else {
            Err(format!("parameter {k:?} given twice"))
        }
    }

    /// The TLS settings, for a TLS scheme; an error when they are given without TLS
    /// or only half given.
    fn tls(&mut self, tls: bool, scheme: &str) -> Result<Option<TlsSettings>, String> {
        let t = TlsSettings {
            ca_file: self.ca_file.take(),
            cert_file: self.cert_file.take(),
            key_file: self.key_file.take(),
            server_name: self.server_name.take(),
        };
        if t.cert_file.is_some() != t.key_file.is_some() {
            return Err("cert_file and key_file go together (a client certificate and its key)".into());
        }
        if !tls {
            if t != TlsSettings::default() {
                return Err(format!(
                    "ca_file, cert_file, key_file and server_name need TLS: use {scheme}s://"
                ));
            }
            return Ok(None);
        }
        Ok(Some(t))
    }

    fn print(&self, tls: Option<&TlsSettings>, auth: Option<&EtcdAuth>) -> String {
        let mut q: Vec<String> = Vec::new();
        let mut path = |k: &str, p: &Option<PathBuf>| {
            if let Some(p) = p {
                q.push(format!("{k}={}", p.display()));
            }
        };
        if let Some(t) = tls {
            path("ca_file", &t.ca_file);
            path("cert_file", &t.cert_file);
            path("key_file", &t.key_file);
            if let Some(n) = &t.server_name {
                q.push(format!("server_name={n}"));
            }
        }
        if let Some(a) = auth {
            q.push(format!("user={}", a.user));
            q.push(format!("password_file={}", a.password_file.display()));
        }
        if let Some(dc) = &self.dc {
            q.push(format!("dc={dc}"));
        }
        if let Some(t) = &self.token_file {
            q.push(format!("token_file={}", t.display()));
        }
        if q.is_empty() {
            String::new()
        } else {
            format!("?{}", q.join("&"))
        }
    }
}

/// The endpoints, TLS settings and other parameters of a networked store's URL
/// (`rest` is what follows `scheme://`); `params` are its parameters besides TLS,
/// `credentials` says where credentials go instead of before an '@'.
fn networked(
    rest: &str,
    kind: &str,
    tls: bool,
    params: &[&str],
    credentials: &str,
) -> Result<(Vec<String>, Option<TlsSettings>, Query), String> {
    let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
    if hosts.contains('@') {
        return Err(format!(
            "credentials do not belong in the URL (give {credentials})"
        ));
    }
    let endpoints = endpoints_of(hosts, kind)?;
    let mut allowed = vec!["ca_file", "cert_file", "key_file", "server_name"];
    allowed.extend_from_slice(params);
    let mut q = Query::parse(query, &allowed)?;
    let tls = q.tls(tls, kind)?;
    Ok((endpoints, tls, q))
}

fn endpoints_of(hosts: &str, scheme: &str) -> Result<Vec<String>, String> {
    let hosts = hosts.trim_end_matches('/');
    if hosts.is_empty() {
        return Err(format!("no endpoint given ({scheme}://host:port[,host:port...])"));
    }
    hosts
        .split(',')
        .map(|ep| parse_endpoint(ep).map_err(|r| format!("endpoint {ep:?}: {r}")))
        .collect()
}

impl StoreUrl {
    /// Parses a URL given by an operator. Errors name the URL (with any credentials
    /// blanked) and what is wrong with it.
    pub fn parse(raw: &str) -> Result<StoreUrl, StoreError> {
        // The URL as an error names it: no query values (a secret given where a
        // file name belongs must not reach a log), no credentials before an '@'.
        let named = match raw.split_once('?') {
            Some((base, _)) => format!("{}?...", redact(base)),
            None => redact(raw),
        };
        let fail = |reason: &str| StoreError::InvalidUrl {
            url: named.clone(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = raw
            .split_once("://")
            .ok_or_else(|| fail("expected SCHEME://..., for example etcd://127.0.0.1:2379 or sqlite:///var/lib/jiocloud/store.db"))?;
        match scheme {
            "etcd" | "etcds" => {
                let (endpoints, tls, mut q) = networked(
                    rest,
                    "etcd",
                    scheme == "etcds",
                    &["user", "password_file"],
                    "user=NAME&password_file=PATH",
                )
                .map_err(|r| fail(&r))?;
                let auth = match (q.user.take(), q.password_file.take()) {
                    (Some(user), Some(password_file)) => Some(EtcdAuth { user, password_file }),
                    (None, None) => None,
                    _ => return Err(fail("user and password_file go together")),
                };
                Ok(StoreUrl::Etcd { endpoints, tls, auth })
            }
            "sqlite" => {
                if rest.is_empty() {
                    return Err(fail(
                        "no path given (sqlite:///absolute/path/store.db; with no store at all, the default is used)",
                    ));
                }
                if rest.contains('?') || rest.contains('#') {
                    return Err(fail("query strings and fragments are not supported"));
                }
                Ok(StoreUrl::Sqlite {
                    path: PathBuf::from(rest),
                })
            }
            "consul" | "consuls" => {
                let (endpoints, tls, q) = networked(
                    rest,
                    "consul",
                    scheme == "consuls",
                    &["dc", "token_file"],
                    "token_file=PATH",
                )
                .map_err(|r| fail(&r))?;
                Ok(StoreUrl::Consul {
                    endpoints,
                    tls,
                    datacenter: q.dc,
                    token_file: q.token_file,
                })
            }
            "http" | "https" => Err(fail(
                "give the store kind as the scheme, for example etcd://127.0.0.1:2379",
            )),
            _ => Err(fail(&format!(
                "unknown scheme {scheme:?} (supported: etcd, etcds, sqlite, consul, consuls)"
            ))),
        }
    }

    /// The URL without its query: the scheme and the endpoints, as store errors and
    /// status lines name the store.
    pub fn without_query(&self) -> String {
        let s = self.to_string();
        match s.split_once('?') {
            Some((base, _)) => base.to_string(),
            None => s,
        }
    }

    /// Checks the files the URL names, as a start-up check: the CA and the client
    /// certificate can be read, and a private key, password or token file is
    /// readable by its owner only. Each problem names the parameter and the file.
    pub fn check_files(&self) -> Vec<String> {
        let mut errors = Vec::new();
        let (tls, secrets): (Option<&TlsSettings>, Vec<(&str, &PathBuf)>) = match self {
            StoreUrl::Sqlite { .. } => return errors,
            StoreUrl::Etcd { tls, auth, .. } => (
                tls.as_ref(),
                auth.iter().map(|a| ("password_file", &a.password_file)).collect(),
            ),
            StoreUrl::Consul { tls, token_file, .. } => (
                tls.as_ref(),
                token_file.iter().map(|t| ("token_file", t)).collect(),
            ),
        };
        if let Some(t) = tls {
            for (name, file) in [("ca_file", &t.ca_file), ("cert_file", &t.cert_file)] {
                if let Some(f) = file {
                    match std::fs::metadata(f).and_then(|m| std::fs::File::open(f).map(|_| m)) {
                        Ok(m) if !m.is_file() => {
                            errors.push(format!("{name} {}: is not a regular file", f.display()))
                        }
                        Ok(_) => {}
                        Err(e) => errors.push(format!("{name} {}: {e}", f.display())),
                    }
                }
            }
            if let Some(k) = &t.key_file
                && let Err(r) = crate::secret::check_private(k)
            {
                errors.push(format!("key_file {}: {r}", k.display()));
            }
        }
        for (name, f) in secrets {
            if let Err(r) = crate::secret::read_secret_file(f) {
                errors.push(format!("{name} {}: {r}", f.display()));
            }
        }
        errors
    }

    /// Whether this is the embedded store.
    pub fn is_embedded(&self) -> bool {
        matches!(self, StoreUrl::Sqlite { .. })
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Etcd { endpoints, tls, auth } => write!(
                f,
                "{}://{}{}",
                if tls.is_some() { "etcds" } else { "etcd" },
                endpoints.join(","),
                Query::default().print(tls.as_ref(), auth.as_ref())
            ),
            StoreUrl::Sqlite { path } => write!(f, "sqlite://{}", path.display()),
            StoreUrl::Consul {
                endpoints,
                tls,
                datacenter,
                token_file,
            } => {
                let q = Query {
                    dc: datacenter.clone(),
                    token_file: token_file.clone(),
                    ..Query::default()
                };
                write!(
                    f,
                    "{}://{}{}",
                    if tls.is_some() { "consuls" } else { "consul" },
                    endpoints.join(","),
                    q.print(tls.as_ref(), None)
                )
            }
        }
    }
}

/// The store used when none is given: the embedded store in the user's state
/// directory (`/var/lib/jiocloud/store.db` for root).
pub fn default_store_url() -> StoreUrl {
    StoreUrl::Sqlite {
        path: default_sqlite_path(),
    }
}

fn default_sqlite_path() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        return PathBuf::from("/var/lib/jiocloud/store.db");
    }
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("."));
    state.join("jiocloud/store.db")
}

fn parse_endpoint(ep: &str) -> Result<String, &'static str> {
    let (host, port) = if let Some(v6) = ep.strip_prefix('[') {
        let (h, p) = v6.split_once("]:").ok_or("expected [v6-address]:port")?;
        (h, p)
    } else {
        ep.rsplit_once(':').ok_or("expected host:port")?
    };
    if host.is_empty() || host.contains(['/', ' ', '[', ']']) {
        return Err("bad host");
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err("port must be a number from 1 to 65535"),
    }
    Ok(if ep.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// Blanks anything between `://` and `@` so a password never reaches a message.
pub(crate) fn redact(raw: &str) -> String {
    match (raw.find("://"), raw.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &raw[..s], &raw[at + 1..]),
        _ => raw.to_string(),
    }
}

fn absolute_path(k: &str, v: &str) -> Result<PathBuf, String> {
    if v.starts_with('/') && !v.contains('\0') {
        Ok(PathBuf::from(v))
    } else {
        Err(format!("{k}={v:?}: must be an absolute path"))
    }
}

/// `server_name`: a DNS name (an address is checked against the certificate's
/// addresses without it).
fn server_name(v: &str) -> Result<String, String> {
    let ok = !v.is_empty()
        && v.len() <= 253
        && v.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
    if v.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!(
            "server_name={v:?}: must be a DNS name (an endpoint given as an address is checked against the addresses its certificate names, without server_name)"
        ));
    }
    if !ok {
        return Err(format!("server_name={v:?}: must be a DNS name"));
    }
    Ok(v.to_string())
}

/// `user`: etcd allows any name; these characters keep it printable and
/// unambiguous in a URL.
fn user_name(v: &str) -> Result<String, String> {
    if v.is_empty()
        || v.len() > 128
        || !v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
    {
        return Err(format!(
            "user={v:?}: must be 1 to 128 letters, digits, '-', '_', '.' or '@'"
        ));
    }
    Ok(v.to_string())
}

/// `dc`: a Consul datacenter's name.
fn datacenter(v: &str) -> Result<String, String> {
    if v.is_empty()
        || !v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!("dc={v:?}: must be letters, digits, '-' or '_'"));
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_etcd_endpoints() {
        assert_eq!(
            StoreUrl::parse("etcd://127.0.0.1:2379,10.0.0.2:2379").unwrap(),
            StoreUrl::Etcd {
                endpoints: vec!["127.0.0.1:2379".into(), "10.0.0.2:2379".into()],
                tls: None,
                auth: None,
            }
        );
        assert_eq!(
            StoreUrl::parse("etcd://[::1]:2379/").unwrap(),
            StoreUrl::Etcd {
                endpoints: vec!["[::1]:2379".into()],
                tls: None,
                auth: None,
            }
        );
    }

    #[test]
    fn parses_sqlite_paths() {
        assert_eq!(
            StoreUrl::parse("sqlite:///tmp/x.db").unwrap(),
            StoreUrl::Sqlite {
                path: "/tmp/x.db".into()
            }
        );
        let err = StoreUrl::parse("sqlite://").unwrap_err().to_string();
        assert!(err.contains("no path given"), "{err}");
        assert_eq!(
            StoreUrl::parse("sqlite:///tmp/x.db").unwrap().to_string(),
            "sqlite:///tmp/x.db"
        );
    }

    #[test]
    fn rejects_bad_urls_naming_them() {
        for bad in [
            "localhost:2379",
            "etcd://",
            "etcd://host",
            "etcd://host:0",
            "etcd://host:99999",
            "etcd://host:abc",
            "etcd://a:1,,b:2",
            "redis://x:1",
            "http://127.0.0.1:2379",
            "consul://",
            "consul://127.0.0.1:8500?token=abc",
            "consul://127.0.0.1:8500?token_file=relative",
            "sqlite:///x?mode=ro",
            "etcd://h:1?ca_file=/etc/ca.pem",
            "etcds://h:1?ca_file=relative.pem",
            "etcds://h:1?cert_file=/c.pem",
            "etcds://h:1?user=jio-agent",
            "etcds://h:1?user=a b&password_file=/p",
            "etcds://h:1?ca_file=/a&ca_file=/b",
            "etcds://h:1?server_name=bad..name",
            "etcds://h:1?token_file=/t",
            "etcds://h:1?ca_file",
            "consul://h:1?ca_file=/etc/ca.pem",
            "consuls://h:1?user=x&password_file=/p",
        ] {
            let err = StoreUrl::parse(bad).unwrap_err();
            let msg = err.to_string();
            // Named without its query's values.
            assert!(msg.contains(bad.split('?').next().unwrap()), "{msg}");
            assert!(!msg.contains('\n'));
        }
    }

    #[test]
    fn parses_consul_urls() {
        let u = StoreUrl::parse("consuls://c1:8501,c2:8501?dc=bom1&token_file=/etc/jiocloud/consul.token")
            .unwrap();
        assert_eq!(
            u,
            StoreUrl::Consul {
                endpoints: vec!["c1:8501".into(), "c2:8501".into()],
                tls: Some(TlsSettings::default()),
                datacenter: Some("bom1".into()),
                token_file: Some("/etc/jiocloud/consul.token".into()),
            }
        );
        assert_eq!(
            u.to_string(),
            "consuls://c1:8501,c2:8501?dc=bom1&token_file=/etc/jiocloud/consul.token"
        );
        assert!(matches!(
            StoreUrl::parse("consul://127.0.0.1:8500").unwrap(),
            StoreUrl::Consul { tls: None, .. }
        ));
    }

    #[test]
    fn parses_tls_and_auth() {
        let raw = "etcds://10.0.0.1:2379,10.0.0.2:2379?ca_file=/etc/jiocloud/etcd-ca.pem&cert_file=/etc/jiocloud/etcd-client.pem&key_file=/etc/jiocloud/etcd-client.key&server_name=etcd.example&user=jio-agent&password_file=/etc/jiocloud/etcd.password";
        let u = StoreUrl::parse(raw).unwrap();
        assert_eq!(
            u,
            StoreUrl::Etcd {
                endpoints: vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()],
                tls: Some(TlsSettings {
                    ca_file: Some("/etc/jiocloud/etcd-ca.pem".into()),
                    cert_file: Some("/etc/jiocloud/etcd-client.pem".into()),
                    key_file: Some("/etc/jiocloud/etcd-client.key".into()),
                    server_name: Some("etcd.example".into()),
                }),
                auth: Some(EtcdAuth {
                    user: "jio-agent".into(),
                    password_file: "/etc/jiocloud/etcd.password".into(),
                }),
            }
        );
        assert_eq!(u.to_string(), raw, "printed as given, so it can be pasted back");
        // Parameters in another order print in the fixed order.
        let u = StoreUrl::parse("etcds://h:1?password_file=/p&user=u").unwrap();
        assert_eq!(u.to_string(), "etcds://h:1?user=u&password_file=/p");
        assert_eq!(StoreUrl::parse("etcds://h:1").unwrap().to_string(), "etcds://h:1");
        let u = StoreUrl::parse(
            "consuls://c:8501?ca_file=/ca.pem&cert_file=/c.pem&key_file=/k.pem&token_file=/t",
        )
        .unwrap();
        assert_eq!(
            u.to_string(),
            "consuls://c:8501?ca_file=/ca.pem&cert_file=/c.pem&key_file=/k.pem&token_file=/t"
        );
    }

    #[test]
    fn never_echoes_a_secret_given_in_the_query() {
        for raw in [
            "etcds://h:1?password=hunter2",
            "consul://h:1?token=hunter2",
            "etcds://h:1?passwd=hunter2",
            "etcds://h:1?user=u&password_file=/p&extra=hunter2",
        ] {
            let err = StoreUrl::parse(raw).unwrap_err().to_string();
            assert!(!err.contains("hunter2"), "{err}");
            assert!(err.contains("?..."), "{err}");
        }
        let err = StoreUrl::parse("etcds://h:1?password=hunter2")
            .unwrap_err()
            .to_string();
        assert!(err.contains("give password_file=PATH"), "{err}");
        // An '@' in the query is no credential: a user or a path may hold one.
        let u = StoreUrl::parse("etcds://h:1?user=ops@bom1&password_file=/etc/j@/pw").unwrap();
        assert!(matches!(u, StoreUrl::Etcd { auth: Some(ref a), .. } if a.user == "ops@bom1"));
        let err = StoreUrl::parse("etcds://h:1?server_name=10.0.0.1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be a DNS name"), "{err}");
    }

    #[test]
    fn never_echoes_credentials() {
        let err = StoreUrl::parse("etcd://root:hunter2@127.0.0.1:2379").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        let err = StoreUrl::parse("bogus://u:hunter2@h").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
