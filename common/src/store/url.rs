//! Store URLs: `etcd://host:port[,host:port...]` and `sqlite://PATH`.

use std::fmt;
use std::path::PathBuf;

use super::StoreError;

/// A parsed store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// etcd v3 through its HTTP/JSON gateway; several endpoints fail over.
    Etcd { endpoints: Vec<String> },
    /// The embedded SQLite store in one file.
    Sqlite { path: PathBuf },
    /// Consul's HTTP API (`consuls://` for HTTPS), with an optional datacenter and
    /// a file holding the ACL token.
    Consul {
        endpoints: Vec<String>,
        https: bool,
        datacenter: Option<String>,
        token_file: Option<PathBuf>,
    },
}

impl StoreUrl {
    /// Parses a URL given by an operator. Errors name the URL (with any credentials
    /// blanked) and what is wrong with it.
    pub fn parse(raw: &str) -> Result<StoreUrl, StoreError> {
        let fail = |reason: &str| StoreError::InvalidUrl {
            url: redact(raw),
            reason: reason.to_string(),
        };
        let (scheme, rest) = raw
            .split_once("://")
            .ok_or_else(|| fail("expected SCHEME://..., for example etcd://127.0.0.1:2379 or sqlite:///var/lib/jiocloud/store.db"))?;
        match scheme {
            "etcd" => {
                if rest.contains('@') {
                    return Err(fail("credentials do not belong in the URL"));
                }
                let rest = rest.trim_end_matches('/');
                if rest.is_empty() {
                    return Err(fail("no endpoint given (etcd://host:port[,host:port...])"));
                }
                let mut endpoints = Vec::new();
                for ep in rest.split(',') {
                    endpoints.push(parse_endpoint(ep).map_err(|r| fail(&format!("endpoint {ep:?}: {r}")))?);
                }
                Ok(StoreUrl::Etcd { endpoints })
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
                if rest.contains('@') {
                    return Err(fail(
                        "credentials do not belong in the URL (give token_file=PATH)",
                    ));
                }
                let (hosts, query) = rest.split_once('?').unwrap_or((rest, ""));
                let hosts = hosts.trim_end_matches('/');
                if hosts.is_empty() {
                    return Err(fail("no endpoint given (consul://host:port[,host:port...])"));
                }
                let mut endpoints = Vec::new();
                for ep in hosts.split(',') {
                    endpoints.push(parse_endpoint(ep).map_err(|r| fail(&format!("endpoint {ep:?}: {r}")))?);
                }
                let (mut datacenter, mut token_file) = (None, None);
                for kv in query.split('&').filter(|s| !s.is_empty()) {
                    match kv.split_once('=') {
                        Some(("dc", v))
                            if !v.is_empty()
                                && v.chars()
                                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') =>
                        {
                            datacenter = Some(v.to_string())
                        }
                        Some(("token_file", v)) if v.starts_with('/') => token_file = Some(PathBuf::from(v)),
                        _ => {
                            return Err(fail(&format!(
                                "unknown or invalid parameter {kv:?} (allowed: dc=NAME, token_file=/absolute/path)"
                            )));
                        }
                    }
                }
                Ok(StoreUrl::Consul {
                    endpoints,
                    https: scheme == "consuls",
                    datacenter,
                    token_file,
                })
            }
            "http" | "https" => Err(fail(
                "give the store kind as the scheme, for example etcd://127.0.0.1:2379",
            )),
            _ => Err(fail(&format!(
                "unknown scheme {scheme:?} (supported: etcd, sqlite, consul, consuls)"
            ))),
        }
    }

    /// Whether this is the embedded store.
    pub fn is_embedded(&self) -> bool {
        matches!(self, StoreUrl::Sqlite { .. })
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Etcd { endpoints } => write!(f, "etcd://{}", endpoints.join(",")),
            StoreUrl::Sqlite { path } => write!(f, "sqlite://{}", path.display()),
            StoreUrl::Consul {
                endpoints,
                https,
                datacenter,
                token_file,
            } => {
                write!(
                    f,
                    "{}://{}",
                    if *https { "consuls" } else { "consul" },
                    endpoints.join(",")
                )?;
                let mut q = Vec::new();
                if let Some(dc) = datacenter {
                    q.push(format!("dc={dc}"));
                }
                if let Some(t) = token_file {
                    q.push(format!("token_file={}", t.display()));
                }
                if !q.is_empty() {
                    write!(f, "?{}", q.join("&"))?;
                }
                Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_etcd_endpoints() {
        assert_eq!(
            StoreUrl::parse("etcd://127.0.0.1:2379,10.0.0.2:2379").unwrap(),
            StoreUrl::Etcd {
                endpoints: vec!["127.0.0.1:2379".into(), "10.0.0.2:2379".into()]
            }
        );
        assert_eq!(
            StoreUrl::parse("etcd://[::1]:2379/").unwrap(),
            StoreUrl::Etcd {
                endpoints: vec!["[::1]:2379".into()]
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
        ] {
            let err = StoreUrl::parse(bad).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(bad), "{msg}");
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
                https: true,
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
            StoreUrl::Consul { https: false, .. }
        ));
    }

    #[test]
    fn never_echoes_credentials() {
        let err = StoreUrl::parse("etcd://root:hunter2@127.0.0.1:2379").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        let err = StoreUrl::parse("bogus://u:hunter2@h").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
