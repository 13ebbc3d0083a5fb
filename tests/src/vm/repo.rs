//! A static apt repository on loopback for the guests: a flat directory of
//! `.deb` files indexed by `dpkg-scanpackages` (and a `Release` from
//! `apt-ftparchive`), served by Python's `http.server`, stopped on drop. The
//! dummy packages come from `crate::apt::dummy_deb`. Guests reach it through a QEMU
//! forward as `deb [trusted=yes] http://<address>/ ./`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{free_port, kill, require_binary, spawn_tied};
use crate::vm::image::INSTALL;

/// The dummy packages the guests install (shared with the apt snapshot tests).
pub use crate::apt::dummy_deb;

/// The repository's directory and its HTTP server.
pub struct AptRepo {
    dir: tempfile::TempDir,
    port: u16,
    server: Child,
}

impl AptRepo {
    /// An empty repository, served on a free loopback port once it answers.
    pub async fn start() -> AptRepo {
        let dir = tempfile::Builder::new()
            .prefix("jio-vm-repo-")
            .tempdir()
            .expect("temporary directory");
        std::fs::create_dir(dir.path().join("repo")).expect("repository directory");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("http.log")).expect("server log");
        let server = spawn_tied(
            Command::new(require_binary("python3", "apt-get install -y python3"))
                .args(["-m", "http.server", "--bind", "127.0.0.1", "--directory"])
                .arg(dir.path().join("repo"))
                .arg(port.to_string())
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log),
        )
        .expect("start python3 -m http.server");
        let repo = AptRepo { dir, port, server };
        repo.publish();
        crate::inspect::wait_for(
            "the apt repository's HTTP server",
            Duration::from_secs(20),
            || async {
                reqwest::get(format!("{}Packages", repo.url()))
                    .await
                    .is_ok_and(|r| r.status().is_success())
            },
        )
        .await;
        repo
    }

    /// The loopback port it serves on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its URL on the host.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// The directory it serves.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    /// The server's request log lines (`"GET /path HTTP/1.1" 200 -`, one per request).
    pub fn requests(&self) -> Vec<String> {
        crate::apt::http_requests(&self.dir.path().join("http.log"))
    }

    /// Copies `deb` into the repository (call `publish` to index it).
    pub fn add(&self, deb: &Path) {
        let name = deb.file_name().expect("a .deb file name");
        std::fs::copy(deb, self.dir().join(name))
            .unwrap_or_else(|e| panic!("copy {} into the repository: {e}", deb.display()));
    }

    /// Rewrites `Packages` and `Release` from the `.deb` files present, each
    /// written beside and renamed, so a guest never reads half an index.
    pub fn publish(&self) {
        let scan = Command::new(require_binary("dpkg-scanpackages", INSTALL))
            .args(["--multiversion", "."])
            .current_dir(self.dir())
            .stderr(Stdio::null())
            .output()
            .expect("run dpkg-scanpackages");
        assert!(scan.status.success(), "dpkg-scanpackages failed");
        self.replace("Packages", &scan.stdout);
        let release = Command::new(require_binary("apt-ftparchive", INSTALL))
            .args(["-o", "APT::FTPArchive::Release::Codename=jio-vm", "release", "."])
            .current_dir(self.dir())
            .output()
            .expect("run apt-ftparchive release");
        assert!(release.status.success(), "apt-ftparchive release failed");
        self.replace("Release", &release.stdout);
    }

    fn replace(&self, name: &str, content: &[u8]) {
        let tmp = self.dir.path().join(format!("{name}.new"));
        std::fs::write(&tmp, content).expect("write the index");
        std::fs::rename(&tmp, self.dir().join(name)).expect("rename the index");
    }
}

impl Drop for AptRepo {
    fn drop(&mut self) {
        kill(&mut self.server);
    }
}
