//! Real apt and dpkg for the package snapshot tests: throwaway Debian roots
//! (`DebRoot`, copies of a cached debootstrap made by `tests/apt/build-root.sh`) in
//! which `chroot <root> apt-get ...` runs, a signed apt repository with one
//! snapshot per version served on loopback (`SnapshotRepo`), and the dummy
//! packages they carry (`dummy_deb`). Never runs apt or dpkg against this
//! machine's own root, and mounts nothing inside a `DebRoot`.
//!
//! A host follows one snapshot when its sources file holds only that snapshot's
//! line (`SnapshotRepo::sources_line`) and its preferences file holds `PIN`:
//!
//! ```text
//! Package: *
//! Pin: origin "127.0.0.1"
//! Pin-Priority: 1001
//! ```
//!
//! A priority above 1000 makes the snapshot's version the candidate also when it
//! is older than the installed one (the installed version alone has priority 100),
//! so `apt-get dist-upgrade -y --allow-downgrades` moves the package to it. The
//! origin is the URI's host name without the port: apt 2.6 (bookworm) does not
//! match `origin "127.0.0.1:<port>"` (priority stays 500, no downgrade).
//! `release o=jiocloud-tests` (the `Origin:` of the Release files) works as well.
//!
//! What apt says (bookworm's apt 2.6, exit code 100 for both):
//! - a snapshot signed by another key: `W: GPG error: <url> bookworm InRelease: The
//!   following signatures couldn't be verified because the public key is not
//!   available: NO_PUBKEY <id>` then `E: The repository '<url> bookworm InRelease'
//!   is not signed.`
//! - a snapshot that does not exist: `E: The repository '<url> bookworm Release'
//!   does not have a Release file.` (stdout: `Err:2 ... 404  File not found`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::process::{free_port, kill, require_binary, spawn_tied};

/// The preferences file that makes the sources' snapshot win, downgrades included.
pub const PIN: &str = "Package: *\nPin: origin \"127.0.0.1\"\nPin-Priority: 1001\n";

/// Where a root keeps the repository's public key (`signed-by=` of the sources line).
pub const KEYRING_IN_ROOT: &str = "/usr/share/keyrings/jio-test.gpg";

/// The PATH inside a root.
const ROOT_PATH: &str = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";

const INSTALL: &str = "apt-get install -y debootstrap gpg apt-utils python3";

/// One host's throwaway Debian root, a copy of the cached one, removed on drop.
pub struct DebRoot {
    name: String,
    dir: Option<tempfile::TempDir>,
}

impl DebRoot {
    /// A fresh copy of the cached root (built first, or waited for, by
    /// `tests/apt/build-root.sh`).
    pub async fn new(name: &str) -> DebRoot {
        let cached = cached_root().await;
        let dir = tempfile::Builder::new()
            .prefix(&format!("jio-debroot-{name}-"))
            .tempdir()
            .expect("temporary directory");
        let root = dir.path().join("root");
        let out = tokio::process::Command::new("cp")
            .arg("-a")
            .arg(&cached)
            .arg(&root)
            .output()
            .await
            .expect("run cp -a");
        assert!(
            out.status.success(),
            "cp -a {} {}: {}",
            cached.display(),
            root.display(),
            crate::inspect::text(&out)
        );
        std::fs::remove_file(root.join(".complete")).expect("remove the copied .complete marker");
        DebRoot {
            name: name.to_string(),
            dir: Some(dir),
        }
    }

    /// The host's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The root directory.
    pub fn path(&self) -> PathBuf {
        self.dir
            .as_ref()
            .expect("the root exists until drop")
            .path()
            .join("root")
    }

    /// `<root>/etc/apt/sources.list.d/jiocloud.list`.
    pub fn sources_file(&self) -> PathBuf {
        self.path().join("etc/apt/sources.list.d/jiocloud.list")
    }

    /// `<root>/etc/apt/preferences.d/jiocloud.pref`.
    pub fn preferences_file(&self) -> PathBuf {
        self.path().join("etc/apt/preferences.d/jiocloud.pref")
    }

    /// `<root>/var/lib/dpkg/status`.
    pub fn dpkg_status(&self) -> PathBuf {
        self.path().join("var/lib/dpkg/status")
    }

    /// The keyring's path as apt inside the root sees it.
    pub fn keyring_path_in_root(&self) -> &'static str {
        KEYRING_IN_ROOT
    }

    /// Copies `repo`'s public key to `keyring_path_in_root()`.
    pub fn install_keyring(&self, repo: &SnapshotRepo) {
        let dest = self.inside(KEYRING_IN_ROOT);
        std::fs::create_dir_all(dest.parent().expect("a keyring directory")).expect("keyring directory");
        std::fs::copy(repo.keyring(), &dest).expect("copy the repository's keyring into the root");
    }

    /// Points the host at `repo`'s snapshot `version`: the sources file holds
    /// only its line, the preferences file holds `PIN`.
    pub fn follow(&self, repo: &SnapshotRepo, version: &str) {
        write(&self.sources_file(), &format!("{}\n", repo.sources_line(version)));
        write(&self.preferences_file(), PIN);
    }

    /// The argument list that runs `args` in the root with a clean environment,
    /// as an agent's `pre_commands` entry would.
    pub fn chroot_argv(&self, args: &[&str]) -> Vec<String> {
        let chroot = require_binary("chroot", "apt-get install -y coreutils");
        let mut argv = vec![chroot.display().to_string(), self.path().display().to_string()];
        argv.extend(
            [
                "env",
                "-i",
                ROOT_PATH,
                "LC_ALL=C",
                "DEBIAN_FRONTEND=noninteractive",
            ]
            .into_iter()
            .chain(args.iter().copied())
            .map(String::from),
        );
        argv
    }

    /// Runs `args` in the root (`chroot_argv`) and returns what it did.
    pub async fn run(&self, args: &[&str]) -> Output {
        let argv = self.chroot_argv(args);
        tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap_or_else(|e| panic!("run {argv:?}: {e}"))
    }

    /// The installed version of `package`, if it is installed.
    pub async fn installed(&self, package: &str) -> Option<String> {
        let out = self
            .run(&["dpkg-query", "-W", "-f=${db:Status-Status} ${Version}", package])
            .await;
        let text = String::from_utf8_lossy(&out.stdout);
        match text.split_once(' ') {
            Some(("installed", version)) if out.status.success() => Some(version.to_string()),
            _ => None,
        }
    }

    /// Installs `deb` with `dpkg -i` (someone installed a version by hand).
    pub async fn dpkg_install(&self, deb: &Path) {
        let name = deb.file_name().expect("a .deb file name").to_string_lossy();
        let inside = format!("/tmp/{name}");
        std::fs::copy(deb, self.inside(&inside)).expect("copy the .deb into the root");
        let out = self.run(&["dpkg", "--force-confold", "-i", &inside]).await;
        assert!(
            out.status.success(),
            "dpkg -i {name} in {}: {}",
            self.name,
            crate::inspect::text(&out)
        );
    }

    fn inside(&self, path_in_root: &str) -> PathBuf {
        self.path().join(path_in_root.trim_start_matches('/'))
    }
}

impl Drop for DebRoot {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        let mounted = mounts_under(dir.path());
        if !mounted.is_empty() {
            // Removing the tree would recurse into what is mounted there.
            let kept = dir.keep();
            eprintln!(
                "apt: {} is left in place: something is mounted inside it ({mounted:?})",
                kept.display()
            );
        }
    }
}

/// The mount points at or under `dir` (from `/proc/self/mountinfo`).
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(String::from)
        .collect()
}

/// The cached root's directory, from `tests/apt/build-root.sh` (it builds it or
/// waits for a build already going).
async fn cached_root() -> PathBuf {
    require_binary("debootstrap", INSTALL);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("apt/build-root.sh");
    let out = tokio::process::Command::new(&script)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run tests/apt/build-root.sh");
    assert!(
        out.status.success(),
        "tests/apt/build-root.sh failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().expect("the root's directory").trim())
}

/// A signed apt repository with one snapshot per version
/// (`snapshots/<version>/dists/bookworm/...` and `.../pool/`), served over HTTP on
/// loopback, stopped on drop.
pub struct SnapshotRepo {
    dir: tempfile::TempDir,
    port: u16,
    server: Child,
    key: Signer,
    other_key: Signer,
}

impl SnapshotRepo {
    /// An empty repository with its signing key, served on a free loopback port
    /// once it answers.
    pub async fn start() -> SnapshotRepo {
        let dir = tempfile::Builder::new()
            .prefix("jio-snapshots-")
            .tempdir()
            .expect("temporary directory");
        std::fs::create_dir_all(dir.path().join("www/snapshots")).expect("snapshots directory");
        let key = Signer::generate(&dir.path().join("gnupg"), "jiocloud test repository");
        let other_key = Signer::generate(&dir.path().join("gnupg-other"), "not the repository");
        key.export(&dir.path().join("keyring.gpg"));
        let port = free_port();
        let server = serve(&dir.path().join("www"), port, &dir.path().join("http.log"));
        let repo = SnapshotRepo {
            dir,
            port,
            server,
            key,
            other_key,
        };
        crate::inspect::wait_for(
            "the snapshot repository's HTTP server",
            Duration::from_secs(20),
            || async {
                reqwest::get(repo.url())
                    .await
                    .is_ok_and(|r| r.status().is_success())
            },
        )
        .await;
        repo
    }

    /// Publishes snapshot `version` holding `debs`, signed by the repository's key.
    pub fn add_snapshot(&self, version: &str, debs: &[PathBuf]) {
        self.publish(version, debs, &self.key);
    }

    /// Publishes snapshot `version` signed by another key, which apt rejects.
    pub fn add_badly_signed_snapshot(&self, version: &str, debs: &[PathBuf]) {
        self.publish(version, debs, &self.other_key);
    }

    /// Its URL on the host (`http://127.0.0.1:<port>/`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// The loopback port it serves on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The sources line with `{version}` where the snapshot's version goes.
    pub fn template(&self) -> String {
        format!(
            "deb [signed-by={KEYRING_IN_ROOT}] {}snapshots/{{version}} bookworm main",
            self.url()
        )
    }

    /// The sources line of snapshot `version`.
    pub fn sources_line(&self, version: &str) -> String {
        self.template().replace("{version}", version)
    }

    /// The public key (binary), for `signed-by=`.
    pub fn keyring(&self) -> PathBuf {
        self.dir.path().join("keyring.gpg")
    }

    /// The directory it serves.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().join("www")
    }

    /// The server's request log lines (`"GET /path HTTP/1.1" 200 -`, one per request).
    pub fn requests(&self) -> Vec<String> {
        http_requests(&self.dir.path().join("http.log"))
    }

    /// Builds the snapshot beside and renames it into place, so apt never reads
    /// half of one.
    fn publish(&self, version: &str, debs: &[PathBuf], signer: &Signer) {
        assert!(
            !version.is_empty() && !version.contains(['/', ' ']) && !version.starts_with('.'),
            "a snapshot version names a directory: {version:?}"
        );
        let dest = self.dir().join("snapshots").join(version);
        assert!(!dest.exists(), "snapshot {version} is already published");
        let tmp = self.dir.path().join(format!(".build-{version}"));
        let pool = tmp.join("pool");
        std::fs::create_dir_all(&pool).expect("pool directory");
        for deb in debs {
            let name = deb.file_name().expect("a .deb file name");
            std::fs::copy(deb, pool.join(name))
                .unwrap_or_else(|e| panic!("copy {} into snapshot {version}: {e}", deb.display()));
        }
        index(&tmp);
        let release = tmp.join("dists/bookworm/Release");
        signer.sign(&release);
        std::fs::rename(&tmp, &dest).expect("move the snapshot into place");
    }
}

impl Drop for SnapshotRepo {
    fn drop(&mut self) {
        kill(&mut self.server);
        self.key.stop_agent();
        self.other_key.stop_agent();
    }
}

/// `python3 -m http.server` serving `dir` on `port`, logging to `log`.
fn serve(dir: &Path, port: u16, log: &Path) -> Child {
    let log = std::fs::File::create(log).expect("server log");
    spawn_tied(
        Command::new(require_binary("python3", INSTALL))
            .args(["-m", "http.server", "--bind", "127.0.0.1", "--directory"])
            .arg(dir)
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log),
    )
    .expect("start python3 -m http.server")
}

/// Writes `Packages`, `Packages.gz` and `Release` of the snapshot in `snapshot`
/// (its `.debs` in `pool/`) with `apt-ftparchive`.
fn index(snapshot: &Path) {
    let binary = snapshot.join("dists/bookworm/main/binary-all");
    std::fs::create_dir_all(&binary).expect("index directory");
    let packages = ftparchive(snapshot, &["packages", "pool"]);
    std::fs::write(binary.join("Packages"), &packages).expect("write Packages");
    gzip(&binary.join("Packages"));
    let arch = native_arch();
    let fields = [
        "Origin=jiocloud-tests".to_string(),
        "Label=jiocloud-tests".to_string(),
        "Suite=bookworm".to_string(),
        "Codename=bookworm".to_string(),
        format!("Architectures={arch} all"),
        "Components=main".to_string(),
        "Description=jiocloud test snapshot".to_string(),
    ];
    let mut args: Vec<String> = fields
        .iter()
        .flat_map(|f| ["-o".to_string(), format!("APT::FTPArchive::Release::{f}")])
        .collect();
    args.extend(["release".to_string(), "dists/bookworm".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let release = ftparchive(snapshot, &args);
    std::fs::write(snapshot.join("dists/bookworm/Release"), release).expect("write Release");
}

fn ftparchive(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new(require_binary("apt-ftparchive", INSTALL))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run apt-ftparchive");
    assert!(
        out.status.success(),
        "apt-ftparchive {args:?}: {}",
        crate::inspect::text(&out)
    );
    out.stdout
}

fn gzip(file: &Path) {
    let out = Command::new(require_binary("gzip", "apt-get install -y gzip"))
        .args(["-9nkf"])
        .arg(file)
        .output()
        .expect("run gzip");
    assert!(
        out.status.success(),
        "gzip {}: {}",
        file.display(),
        crate::inspect::text(&out)
    );
}

/// dpkg's architecture of this machine (the roots' own), e.g. `amd64`.
fn native_arch() -> String {
    let out = Command::new(require_binary("dpkg", "apt-get install -y dpkg"))
        .arg("--print-architecture")
        .output()
        .expect("run dpkg --print-architecture");
    assert!(out.status.success(), "dpkg --print-architecture failed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A throwaway signing key without passphrase in its own GNUPGHOME.
struct Signer {
    home: PathBuf,
}

impl Signer {
    fn generate(home: &Path, name: &str) -> Signer {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::create_dir_all(home).expect("GNUPGHOME");
        std::fs::set_permissions(home, std::fs::Permissions::from_mode(0o700)).expect("chmod GNUPGHOME");
        let signer = Signer {
            home: home.to_path_buf(),
        };
        let uid = format!("{name} <tests@jiocloud.invalid>");
        signer.gpg(&[
            "--passphrase",
            "",
            "--quick-gen-key",
            &uid,
            "ed25519",
            "sign",
            "never",
        ]);
        signer
    }

    /// The public key, binary (what `signed-by=` reads), into `dest`.
    fn export(&self, dest: &Path) {
        let key = self.gpg(&["--export"]);
        assert!(!key.is_empty(), "gpg --export wrote no key");
        std::fs::write(dest, key).expect("write the keyring");
    }

    /// `InRelease` (clearsigned) and `Release.gpg` (detached) beside `release`.
    fn sign(&self, release: &Path) {
        let dir = release.parent().expect("the Release file's directory");
        let release = release.display().to_string();
        let inrelease = dir.join("InRelease").display().to_string();
        let detached = dir.join("Release.gpg").display().to_string();
        self.gpg(&["--yes", "--clearsign", "-o", &inrelease, &release]);
        self.gpg(&["--yes", "--armor", "--detach-sign", "-o", &detached, &release]);
    }

    fn gpg(&self, args: &[&str]) -> Vec<u8> {
        let out = Command::new(require_binary("gpg", INSTALL))
            .env("GNUPGHOME", &self.home)
            .arg("--batch")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run gpg");
        assert!(
            out.status.success(),
            "gpg {args:?}: {}",
            crate::inspect::text(&out)
        );
        out.stdout
    }

    /// gpg starts an agent per GNUPGHOME; it would outlive the test.
    fn stop_agent(&self) {
        let _ = Command::new("gpgconf")
            .env("GNUPGHOME", &self.home)
            .args(["--kill", "all"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The request lines of `python3 -m http.server`'s log (`"GET /path HTTP/1.1" 200 -`).
pub fn http_requests(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"GET ") || l.contains("\"HEAD "))
        .map(String::from)
        .collect()
}

/// A dummy package: `name` at `version`, architecture all, holding
/// `/usr/share/<name>/version`, with `postinst` as its maintainer script if given.
/// Built with `dpkg-deb` into `dir`; returns the `.deb`'s path.
pub fn dummy_deb(dir: &Path, name: &str, version: &str, postinst: Option<&str>) -> PathBuf {
    let root = dir.join(format!("{name}_{version}"));
    let debian = root.join("DEBIAN");
    std::fs::create_dir_all(&debian).expect("DEBIAN directory");
    let share = root.join("usr/share").join(name);
    std::fs::create_dir_all(&share).expect("package files");
    std::fs::write(share.join("version"), format!("{version}\n")).expect("payload");
    write(
        &debian.join("control"),
        &format!(
            "Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: jiocloud tests <tests@jiocloud.invalid>\nPriority: optional\nSection: misc\nDescription: test package of the scenario tests\n"
        ),
    );
    if let Some(script) = postinst {
        use std::os::unix::fs::PermissionsExt as _;
        let p = debian.join("postinst");
        write(&p, script);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod postinst");
    }
    let deb = dir.join(format!("{name}_{version}_all.deb"));
    let out = Command::new(require_binary("dpkg-deb", "apt-get install -y dpkg"))
        .args(["--root-owner-group", "--build"])
        .arg(&root)
        .arg(&deb)
        .output()
        .expect("run dpkg-deb");
    assert!(
        out.status.success(),
        "dpkg-deb --build {name} {version}: {}",
        crate::inspect::text(&out)
    );
    std::fs::remove_dir_all(&root).expect("remove the package's tree");
    deb
}

fn write(path: &Path, content: &str) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    }
    std::fs::write(path, content).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
