//! The apt snapshot harness with real apt and dpkg in a throwaway Debian root: a
//! host that follows a snapshot (its one sources line and `apt::PIN`) is moved to
//! that snapshot's version by `apt-get dist-upgrade`, downgrades included; a
//! snapshot signed by another key, or one that does not exist, fails
//! `apt-get update` and changes nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use jio_tests::apt::{DebRoot, PIN, SnapshotRepo, dummy_deb};
use jio_tests::inspect::text;

const DIST_UPGRADE: &[&str] = &[
    "apt-get",
    "dist-upgrade",
    "-y",
    "--allow-downgrades",
    "-o",
    "Dpkg::Options::=--force-confold",
];

/// Runs `args` in the root; it must succeed without an error, warning or notice
/// line (`N: Download is performed unsandboxed as root` would be one).
async fn apt_ok(root: &DebRoot, args: &[&str]) -> Output {
    let out = root.run(args).await;
    assert!(out.status.success(), "{args:?} failed: {}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr
            .lines()
            .any(|l| ["E:", "W:", "N:"].iter().any(|p| l.starts_with(p))),
        "{args:?} complained: {stderr}"
    );
    out
}

/// `apt-get update` in the root must fail with exit code 100 and `expected` in
/// its error output.
async fn update_fails(root: &DebRoot, expected: &[&str]) {
    let out = root.run(&["apt-get", "update"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("apt-get update: exit {:?}\n{stderr}", out.status.code());
    assert_eq!(out.status.code(), Some(100), "apt-get update: {}", text(&out));
    for e in expected {
        assert!(
            stderr.contains(e),
            "no {e:?} in apt-get update's errors: {stderr}"
        );
    }
}

async fn policy(root: &DebRoot) -> String {
    let out = apt_ok(root, &["apt-cache", "policy", "jio-dummy"]).await;
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn debs(dir: &Path) -> [PathBuf; 3] {
    ["1.0", "2.0", "3.0"].map(|v| dummy_deb(dir, "jio-dummy", v, None))
}

#[tokio::test]
async fn a_host_follows_its_snapshot_up_and_down_and_refuses_a_bad_signature() {
    let start = Instant::now();
    let work = tempfile::tempdir().expect("work directory");
    let [d1, d2, d3] = debs(work.path());
    let repo = SnapshotRepo::start().await;
    repo.add_snapshot("v1", std::slice::from_ref(&d1));
    repo.add_snapshot("v2", std::slice::from_ref(&d2));
    repo.add_badly_signed_snapshot("v3", std::slice::from_ref(&d3));
    let root = DebRoot::new("apt1").await;
    println!(
        "set-up (repository, root) took {:.1} s",
        start.elapsed().as_secs_f64()
    );
    root.install_keyring(&repo);

    root.follow(&repo, "v1");
    apt_ok(&root, &["apt-get", "update"]).await;
    apt_ok(&root, &["apt-get", "install", "-y", "jio-dummy"]).await;
    assert_eq!(root.installed("jio-dummy").await.as_deref(), Some("1.0"));

    root.follow(&repo, "v2");
    apt_ok(&root, &["apt-get", "update"]).await;
    apt_ok(&root, DIST_UPGRADE).await;
    assert_eq!(root.installed("jio-dummy").await.as_deref(), Some("2.0"));

    // Back to v1: without the pin apt keeps the newer installed version...
    std::fs::write(root.sources_file(), format!("{}\n", repo.sources_line("v1"))).expect("sources");
    std::fs::remove_file(root.preferences_file()).expect("remove the pin");
    apt_ok(&root, &["apt-get", "update"]).await;
    assert!(
        policy(&root).await.contains("Candidate: 2.0"),
        "{}",
        policy(&root).await
    );
    // ...with it, the snapshot's version is the candidate and dist-upgrade downgrades.
    std::fs::write(root.preferences_file(), PIN).expect("pin");
    let p = policy(&root).await;
    println!("apt-cache policy jio-dummy (v1 pinned, 2.0 installed):\n{p}");
    assert!(p.contains("Candidate: 1.0") && p.contains("1.0 1001"), "{p}");
    apt_ok(&root, DIST_UPGRADE).await;
    assert_eq!(root.installed("jio-dummy").await.as_deref(), Some("1.0"));

    // A version installed by hand goes back to the snapshot's too.
    root.dpkg_install(&d3).await;
    assert_eq!(root.installed("jio-dummy").await.as_deref(), Some("3.0"));
    println!(
        "apt-cache policy jio-dummy (v1 pinned, 3.0 installed by hand):\n{}",
        policy(&root).await
    );
    apt_ok(&root, DIST_UPGRADE).await;
    assert_eq!(root.installed("jio-dummy").await.as_deref(), Some("1.0"));

    root.follow(&repo, "v3");
    update_fails(&root, &["NO_PUBKEY", "E: The repository", "is not signed"]).await;
    assert_eq!(root.installed("jio-dummy").await.as_deref(), Some("1.0"));

    root.follow(&repo, "v9");
    update_fails(&root, &["does not have a Release file"]).await;
    assert_eq!(root.installed("jio-dummy").await.as_deref(), Some("1.0"));

    let requests = repo.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.contains("GET /snapshots/v2/pool/jio-dummy_2.0_all.deb")),
        "apt did not fetch 2.0 from the repository: {requests:#?}"
    );
    println!("took {:.1} s", start.elapsed().as_secs_f64());
}

/// The root's build script passes shellcheck.
#[test]
fn the_build_root_script_passes_shellcheck() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("apt/build-root.sh");
    let shellcheck = jio_tests::require_binary("shellcheck", "apt-get install -y shellcheck");
    let out = Command::new(shellcheck)
        .arg(&script)
        .output()
        .expect("run shellcheck");
    assert!(out.status.success(), "{}", text(&out));
}
