//! An OpenStack Swift client for run logs: authenticate (TempAuth v1 or Keystone v3
//! password), create the container, upload an object, fetch one back.
//!
//! Tokens and keys never appear in a log line or an error message: they are held in
//! `Secret`, whose `Debug` and `Display` print `***`, and errors carry only URLs and
//! status codes. A 401 makes the client authenticate again once (tokens expire, and a
//! Swift restart can invalidate them).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tokio::sync::Mutex;

pub use crate::secret::Secret;

/// The `[swift]` settings shared by the agent and jioctl.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwiftSettings {
    /// TempAuth (`.../auth/v1.0`) or Keystone v3 (`.../v3`).
    pub auth_url: String,
    /// TempAuth `account:user`, or the Keystone user name.
    pub user: String,
    /// File holding the key or password; must not be readable by group or others.
    pub key_file: PathBuf,
    #[serde(default = "default_container")]
    pub container: String,
    /// Retention of uploaded logs (`X-Delete-After`), e.g. `30d`.
    pub delete_after: Option<String>,
    /// Keystone only: the project to scope to.
    pub project: Option<String>,
    #[serde(default = "default_domain")]
    pub user_domain: String,
    #[serde(default = "default_domain")]
    pub project_domain: String,
    /// Keystone only: the region of the object-store endpoint.
    pub region: Option<String>,
}

impl SwiftSettings {
    /// Settings with the defaults for everything but the credentials.
    pub fn new(auth_url: String, user: String, key_file: PathBuf) -> SwiftSettings {
        SwiftSettings {
            auth_url,
            user,
            key_file,
            container: default_container(),
            delete_after: None,
            project: None,
            user_domain: default_domain(),
            project_domain: default_domain(),
            region: None,
        }
    }
}

fn default_container() -> String {
    "jiocloud-logs".into()
}
fn default_domain() -> String {
    "Default".into()
}

/// A Swift problem. Never holds a token or key.
#[derive(Debug, thiserror::Error)]
pub enum SwiftError {
    #[error("swift key file {path}: {reason}")]
    KeyFile { path: PathBuf, reason: String },
    #[error("swift setting {0}")]
    Setting(String),
    #[error("swift at {url} is unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("swift authentication as {user:?} at {url} failed: {reason}")]
    Auth {
        url: String,
        user: String,
        reason: String,
    },
    #[error("swift {op} {url} failed: HTTP {status}")]
    Http {
        op: &'static str,
        url: String,
        status: u16,
    },
}

impl SwiftError {
    /// Whether retrying later may help (Swift down) rather than a setting being wrong.
    pub fn transient(&self) -> bool {
        match self {
            SwiftError::Unreachable { .. } => true,
            SwiftError::Http { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}

/// Reads the key file, refusing one that group or others can read.
pub fn read_key(path: &Path) -> Result<Secret, SwiftError> {
    crate::secret::read_secret_file(path).map_err(|reason| SwiftError::KeyFile {
        path: path.to_path_buf(),
        reason,
    })
}

#[derive(Clone)]
struct Session {
    token: Secret,
    storage_url: String,
}

/// A Swift account's client.
pub struct SwiftClient {
    http: reqwest::Client,
    settings: SwiftSettings,
    key: Secret,
    delete_after: Option<Duration>,
    session: Mutex<Option<Session>>,
    container_ready: Mutex<bool>,
}

impl fmt::Debug for SwiftClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SwiftClient")
            .field("auth_url", &self.settings.auth_url)
            .field("user", &self.settings.user)
            .finish_non_exhaustive()
    }
}

impl SwiftClient {
    /// Checks the settings and reads the key; no I/O to Swift yet.
    pub fn new(settings: SwiftSettings) -> Result<SwiftClient, SwiftError> {
        if !(settings.auth_url.starts_with("http://") || settings.auth_url.starts_with("https://")) {
            return Err(SwiftError::Setting(format!(
                "auth_url {:?}: must be an http(s) URL",
                settings.auth_url
            )));
        }
        if settings.container.is_empty() || settings.container.contains('/') {
            return Err(SwiftError::Setting(format!(
                "container {:?}: must be non-empty and hold no '/'",
                settings.container
            )));
        }
        let delete_after = settings
            .delete_after
            .as_deref()
            .map(crate::duration::parse)
            .transpose()
            .map_err(|e| SwiftError::Setting(format!("delete_after: {e}")))?;
        let key = read_key(&settings.key_file)?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| SwiftError::Setting(format!("HTTP client: {e}")))?;
        Ok(SwiftClient {
            http,
            settings,
            key,
            delete_after,
            session: Mutex::new(None),
            container_ready: Mutex::new(false),
        })
    }

    pub fn settings(&self) -> &SwiftSettings {
        &self.settings
    }

    fn keystone(&self) -> bool {
        self.settings.auth_url.trim_end_matches('/').ends_with("/v3")
    }

    fn unreachable(url: &str, e: reqwest::Error) -> SwiftError {
        // reqwest's message names the URL, never headers.
        SwiftError::Unreachable {
            url: url.to_string(),
            reason: e.without_url().to_string(),
        }
    }

    async fn authenticate(&self) -> Result<Session, SwiftError> {
        let url = self.settings.auth_url.trim_end_matches('/').to_string();
        let auth_err = |reason: String| SwiftError::Auth {
            url: url.clone(),
            user: self.settings.user.clone(),
            reason,
        };
        if !self.keystone() {
            let r = self
                .http
                .get(&url)
                .header("X-Storage-User", &self.settings.user)
                .header("X-Storage-Pass", self.key.expose())
                .send()
                .await
                .map_err(|e| Self::unreachable(&url, e))?;
            if !r.status().is_success() {
                return Err(auth_err(format!("HTTP {}", r.status().as_u16())));
            }
            let header = |n: &str| r.headers().get(n).and_then(|v| v.to_str().ok()).map(String::from);
            let (Some(token), Some(storage_url)) = (header("x-auth-token"), header("x-storage-url")) else {
                return Err(auth_err("the answer has no token or storage URL".into()));
            };
            return Ok(Session {
                token: Secret::new(token),
                storage_url,
            });
        }
        let Some(project) = &self.settings.project else {
            return Err(SwiftError::Setting(
                "project: Keystone v3 needs a project to scope to".into(),
            ));
        };
        let body = json!({"auth": {
            "identity": {"methods": ["password"], "password": {"user": {
                "name": self.settings.user,
                "domain": {"name": self.settings.user_domain},
                "password": self.key.expose(),
            }}},
            "scope": {"project": {"name": project, "domain": {"name": self.settings.project_domain}}},
        }});
        let tokens = format!("{url}/auth/tokens");
        let r = self
            .http
            .post(&tokens)
            .json(&body)
            .send()
            .await
            .map_err(|e| Self::unreachable(&tokens, e))?;
        if !r.status().is_success() {
            return Err(auth_err(format!("HTTP {}", r.status().as_u16())));
        }
        let token = r
            .headers()
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .map(String::from)
            .ok_or_else(|| auth_err("the answer has no X-Subject-Token".into()))?;
        let answer: KeystoneAnswer = r
            .json()
            .await
            .map_err(|e| auth_err(format!("undecodable answer: {}", e.without_url())))?;
        let storage_url = object_store_url(&answer, self.settings.region.as_deref())
            .ok_or_else(|| auth_err("the catalog has no public object-store endpoint".into()))?;
        Ok(Session {
            token: Secret::new(token),
            storage_url,
        })
    }

    async fn session(&self, renew: bool) -> Result<Session, SwiftError> {
        let mut s = self.session.lock().await;
        if renew || s.is_none() {
            *s = Some(self.authenticate().await?);
        }
        s.clone().ok_or_else(|| SwiftError::Setting("no session".into()))
    }

    /// Sends a request built by `make` with the token; authenticates again once on 401.
    async fn with_token(
        &self,
        op: &'static str,
        make: impl Fn(&Session) -> (String, reqwest::RequestBuilder),
    ) -> Result<reqwest::Response, SwiftError> {
        let mut renew = false;
        loop {
            let session = self.session(renew).await?;
            let (url, req) = make(&session);
            let r = req
                .header("X-Auth-Token", session.token.expose())
                .send()
                .await
                .map_err(|e| Self::unreachable(&url, e))?;
            if r.status().as_u16() == 401 && !renew {
                tracing::info!(%url, "swift token rejected; authenticating again");
                renew = true;
                continue;
            }
            if !r.status().is_success() {
                return Err(SwiftError::Http {
                    op,
                    url,
                    status: r.status().as_u16(),
                });
            }
            return Ok(r);
        }
    }

    /// Uploads `body` as `object` in the container (created when missing); returns its URL.
    pub async fn upload(&self, object: &str, body: Vec<u8>) -> Result<String, SwiftError> {
        let container = self.settings.container.clone();
        {
            let mut ready = self.container_ready.lock().await;
            if !*ready {
                self.with_token("create container", |s| {
                    let url = format!("{}/{}", s.storage_url, container);
                    (url.clone(), self.http.put(url))
                })
                .await?;
                *ready = true;
            }
        }
        let r = self
            .with_token("upload", |s| {
                let url = format!("{}/{}/{}", s.storage_url, container, crate::encode::path(object));
                let mut req = self
                    .http
                    .put(&url)
                    .header("Content-Type", "text/plain; charset=utf-8")
                    .body(body.clone());
                if let Some(d) = self.delete_after {
                    req = req.header("X-Delete-After", d.as_secs().max(1).to_string());
                }
                (url, req)
            })
            .await?;
        Ok(r.url().to_string())
    }

    /// Fetches an object by its URL (as stored in a `/status` leaf).
    pub async fn fetch(&self, url: &str) -> Result<Vec<u8>, SwiftError> {
        let r = self
            .with_token("fetch", |_| (url.to_string(), self.http.get(url)))
            .await?;
        let u = url.to_string();
        Ok(r.bytes().await.map_err(|e| Self::unreachable(&u, e))?.to_vec())
    }
}

#[derive(Deserialize)]
struct KeystoneAnswer {
    token: KeystoneToken,
}

#[derive(Deserialize)]
struct KeystoneToken {
    #[serde(default)]
    catalog: Vec<CatalogEntry>,
}

#[derive(Deserialize)]
struct CatalogEntry {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    endpoints: Vec<Endpoint>,
}

#[derive(Deserialize)]
struct Endpoint {
    interface: String,
    url: String,
    #[serde(default)]
    region: Option<String>,
}

fn object_store_url(a: &KeystoneAnswer, region: Option<&str>) -> Option<String> {
    a.token
        .catalog
        .iter()
        .filter(|c| c.kind == "object-store")
        .flat_map(|c| c.endpoints.iter())
        .find(|e| e.interface == "public" && region.is_none_or(|r| e.region.as_deref() == Some(r)))
        .map(|e| e.url.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_permissions_are_enforced() {
        use std::os::unix::fs::PermissionsExt as _;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("key");
        std::fs::write(&p, "hunter2\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        let err = read_key(&p).unwrap_err().to_string();
        assert!(err.contains("readable by group or others (mode 0640)"), "{err}");
        assert!(!err.contains("hunter2"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_key(&p).unwrap().expose(), "hunter2");
    }

    #[test]
    fn keystone_catalog_lookup() {
        let a: KeystoneAnswer = serde_json::from_value(json!({"token": {"catalog": [
            {"type": "identity", "endpoints": [{"interface": "public", "url": "http://k/v3"}]},
            {"type": "object-store", "endpoints": [
                {"interface": "internal", "url": "http://int/v1/AUTH_p", "region": "r1"},
                {"interface": "public", "url": "http://pub1/v1/AUTH_p/", "region": "r1"},
                {"interface": "public", "url": "http://pub2/v1/AUTH_p", "region": "r2"}
            ]}
        ]}}))
        .unwrap();
        assert_eq!(
            object_store_url(&a, None).as_deref(),
            Some("http://pub1/v1/AUTH_p")
        );
        assert_eq!(
            object_store_url(&a, Some("r2")).as_deref(),
            Some("http://pub2/v1/AUTH_p")
        );
        assert_eq!(object_store_url(&a, Some("r9")), None);
    }
}
