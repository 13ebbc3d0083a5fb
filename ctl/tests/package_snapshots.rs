//! A version is a package snapshot: with the site's template set, every host at
//! v2 installs v2's snapshot, and all report the same package set; a host changed
//! by hand shows as drifted, naming the package; undo to v1 downgrades every host;
//! a version without a snapshot (or a typo) is refused before anything is
//! written; a snapshot whose signature does not verify fails the host's run with
//! apt's message and upgrades nothing there. Real apt and dpkg in a throwaway
//! Debian root per host (`jio_tests::apt`), a real signed repository served on
//! loopback, real agents and driver, on etcd and on the embedded store. Every
//! check of what is installed reads the roots with `dpkg-query`, never our records.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::Duration;

use jio_common::keys::Schema;
use jio_tests::apt::{DebRoot, SnapshotRepo, dummy_deb};
use jio_tests::inspect::{open, text, wait_for};

use common::fleet::Fleet;
use common::{assert_says, run};

const HOSTS: [&str; 3] = ["compute1", "compute2", "compute3"];
const ONE_AT_A_TIME: &str = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;

/// The repository (v1: jio-dummy 1.0, v2: 2.0, v3: 3.0 signed by a key the hosts
/// do not trust) and the 2.1 someone installs by hand.
struct Site {
    repo: SnapshotRepo,
    by_hand: std::path::PathBuf,
    _debs: tempfile::TempDir,
}

async fn site() -> Site {
    let debs = tempfile::tempdir().unwrap();
    let deb = |v: &str| dummy_deb(debs.path(), "jio-dummy", v, None);
    let repo = SnapshotRepo::start().await;
    repo.add_snapshot("v1", &[deb("1.0")]);
    repo.add_snapshot("v2", &[deb("2.0")]);
    repo.add_badly_signed_snapshot("v3", &[deb("3.0")]);
    let by_hand = deb("2.1");
    Site {
        repo,
        by_hand,
        _debs: debs,
    }
}

/// Each host's root, with the repository's key and jio-dummy 1.0 installed.
async fn roots(site: &Site) -> Vec<DebRoot> {
    let mut roots = Vec::new();
    for h in HOSTS {
        let r = DebRoot::new(h).await;
        r.install_keyring(&site.repo);
        roots.push(r);
    }
    let first = site.by_hand.with_file_name("jio-dummy_1.0_all.deb");
    for r in &roots {
        r.dpkg_install(&first).await;
        assert_eq!(r.installed("jio-dummy").await.as_deref(), Some("1.0"));
    }
    roots
}

/// The agent's settings for a host living in `root`: apt and dpkg run there.
fn agent_toml(root: &DebRoot) -> String {
    let argv = |a: &[&str]| {
        let v: Vec<String> = root.chroot_argv(a).iter().map(|s| format!("{s:?}")).collect();
        format!("[{}]", v.join(", "))
    };
    format!(
        "pre_commands = [{}, {}]\napt_sources_file = {:?}\napt_preferences_file = {:?}\ndpkg_status_file = {:?}\nresync_interval = \"2s\"\n",
        argv(&["apt-get", "update"]),
        argv(&[
            "apt-get",
            "dist-upgrade",
            "-y",
            "--allow-downgrades",
            "-o",
            "Dpkg::Options::=--force-confold"
        ]),
        root.sources_file().display().to_string(),
        root.preferences_file().display().to_string(),
        root.dpkg_status().display().to_string(),
    )
}

/// The installed set as dpkg itself lists it, digested as the documentation says
/// (`name arch version` lines, sorted, SHA-256): independent of the agent's parser.
async fn dpkg_digest(root: &DebRoot) -> String {
    let out = root
        .run(&[
            "dpkg-query",
            "-W",
            "-f",
            "${db:Status-Status} ${Package} ${Architecture} ${Version}\\n",
        ])
        .await;
    assert!(out.status.success(), "{}", text(&out));
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("installed ").map(|r| format!("{r}\n")))
        .collect();
    lines.sort();
    let mut sha = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(sha.stdin.as_mut().unwrap(), lines.concat().as_bytes()).unwrap();
    let out = sha.wait_with_output().unwrap();
    let hex = String::from_utf8_lossy(&out.stdout);
    format!("sha256:{}", hex.split_whitespace().next().unwrap())
}

async fn status_json(url: &str) -> serde_json::Value {
    let out = run(url, &["status", "--json"]).await;
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

async fn versions(roots: &[DebRoot]) -> Vec<Option<String>> {
    let mut v = Vec::new();
    for r in roots {
        v.push(r.installed("jio-dummy").await);
    }
    v
}

/// Every host's recorded digest equals dpkg's own, and all are one.
async fn assert_one_set(url: &str, roots: &[DebRoot]) -> String {
    let st = status_json(url).await;
    let mut digests = Vec::new();
    for (h, r) in HOSTS.iter().zip(roots) {
        let recorded = st["hosts"][h]["last_run"]["packages"]["digest"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert_eq!(
            recorded,
            dpkg_digest(r).await,
            "{h}'s recorded set is not dpkg's: {st:#}"
        );
        digests.push(recorded);
    }
    digests.dedup();
    assert_eq!(digests.len(), 1, "the hosts report different sets: {st:#}");
    assert_eq!(st["package_drift"], serde_json::json!([]), "{st:#}");
    digests.remove(0)
}

/// Nothing was written: the desired version and the rollouts are as before.
async fn assert_nothing_written(url: &str, before: &serde_json::Value) {
    let now = status_json(url).await;
    assert_eq!(now["current_version"], before["current_version"]);
    assert_eq!(now["rollout"], before["rollout"]);
}

async fn scenario(url: &str) {
    let site = site().await;
    let roots = roots(&site).await;
    let template = site.repo.template();
    let set = run(url, &["repo", "set", &template]).await;
    assert_eq!(set.status.code(), Some(0), "{}", text(&set));
    let f = Fleet::start_with(url, url, &HOSTS, 0.1, |h| {
        agent_toml(&roots[HOSTS.iter().position(|x| *x == h).unwrap()])
    })
    .await;
    // At v1 every host has v1's snapshot in its sources and pinned.
    for r in &roots {
        let list = std::fs::read_to_string(r.sources_file()).unwrap();
        assert!(list.contains(&site.repo.sources_line("v1")), "{list}");
    }
    let v1 = assert_one_set(url, &roots).await;

    // A version without a snapshot, and a typo, are refused with nothing written.
    let before = status_json(url).await;
    for (args, v) in [
        (vec!["upgrade", "v2.0", "--instructions", ONE_AT_A_TIME], "v2.0"),
        (vec!["trigger-update", "v9"], "v9"),
    ] {
        let out = run(url, &args).await;
        assert_eq!(out.status.code(), Some(64), "{}", text(&out));
        assert_says(&out, &format!("version {v} has no readable package snapshot"));
        assert_says(
            &out,
            &format!("/snapshots/{v}/dists/bookworm/InRelease: HTTP 404"),
        );
        assert_says(&out, "nothing was written");
        assert_nothing_written(url, &before).await;
    }
    let check = run(url, &["repo", "check", "v2"]).await;
    assert_eq!(check.status.code(), Some(0), "{}", text(&check));

    // v1 → v2: every host installs v2's 2.0, and all report one set.
    let up = run(url, &["upgrade", "v2", "--instructions", ONE_AT_A_TIME]).await;
    assert_eq!(up.status.code(), Some(0), "{}", text(&up));
    assert!(f.all_at("v2"));
    assert_eq!(versions(&roots).await, vec![Some("2.0".to_string()); 3]);
    let v2 = assert_one_set(url, &roots).await;
    assert_ne!(v1, v2);
    let st = status_json(url).await;
    assert_eq!(
        st["hosts"]["compute1"]["last_run"]["packages"]["changed"],
        serde_json::json!([{"name": "jio-dummy", "arch": "all", "from": "1.0", "to": "2.0"}]),
        "{st:#}"
    );

    // Someone installs 2.1 by hand on compute2: it shows as drifted, by name.
    roots[1].dpkg_install(&site.by_hand).await;
    let drift_named = || async {
        let st = status_json(url).await;
        st["package_drift"][0]["hosts"]["compute2"]["differs"]
            == serde_json::json!([{"name": "jio-dummy", "arch": "all", "from": "2.0", "to": "2.1"}])
    };
    wait_for(
        "compute2's drift to show in status",
        Duration::from_secs(30),
        drift_named,
    )
    .await;
    let status = run(url, &["status"]).await;
    assert_says(
        &status,
        "package drift: compute at v2: 2 set(s); 2 host(s) share the most common one",
    );
    assert_says(&status, "compute2 (");
    assert_says(&status, "jio-dummy 2.0 → 2.1");
    let explain = run(url, &["explain", "compute2"]).await;
    assert_says(
        &explain,
        "drifted: differs from the most common set of compute at v2 (2 host(s)",
    );
    assert_says(&explain, "jio-dummy 2.0 → 2.1");
    let verify = run(
        url,
        &[
            "verify-hosts",
            "v2",
            "compute1",
            "compute2",
            "compute3",
            "--same-packages",
        ],
    )
    .await;
    assert_eq!(verify.status.code(), Some(1), "{}", text(&verify));
    assert_says(&verify, "jio-dummy 2.0 → 2.1");

    // Undo to v1 downgrades every host, the hand-installed 2.1 included.
    let undo = run(url, &["rollout", "undo"]).await;
    assert_eq!(undo.status.code(), Some(0), "{}", text(&undo));
    assert!(f.all_at("v1"));
    assert_eq!(versions(&roots).await, vec![Some("1.0".to_string()); 3]);
    assert_eq!(assert_one_set(url, &roots).await, v1);
    // The sets no host uses any more went when the undo ended: v1's is stored again.
    let sets = open(url)
        .await
        .list(&Schema::default().package_sets())
        .await
        .unwrap();
    let keys: Vec<&str> = sets.kvs.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, [format!("/packages/{v1}")], "{keys:?}");
    let prune = run(url, &["repo", "prune"]).await;
    assert_says(&prune, "deleted 0 stored package set(s)");
    let verify = run(
        url,
        &[
            "verify-hosts",
            "v1",
            "compute1",
            "compute2",
            "compute3",
            "--same-packages",
        ],
    )
    .await;
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));

    // v3's signature does not verify: the first host fails with apt's message and
    // nothing is upgraded, there or anywhere.
    let bad = run(url, &["upgrade", "v3", "--instructions", ONE_AT_A_TIME]).await;
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    assert_says(&bad, "exited 100: E: The repository");
    assert_eq!(versions(&roots).await, vec![Some("1.0".to_string()); 3]);
    let st = status_json(url).await;
    let failed: Vec<String> = HOSTS
        .iter()
        .filter(|h| st["hosts"][**h]["last_run"]["ok"] == false)
        .map(|h| {
            st["hosts"][*h]["last_run"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(failed.len(), 1, "{st:#}");
    assert!(
        failed[0].contains("exited 100: E: ") && failed[0].contains("/snapshots/v3"),
        "the failure does not carry apt's message: {failed:?}"
    );

    // Without the template, the next run removes the sources entry and pin the
    // agent wrote (no old snapshot stays pinned) and leaves the packages as they are.
    let unset = run(url, &["repo", "unset"]).await;
    assert_eq!(unset.status.code(), Some(0), "{}", text(&unset));
    let up = run(url, &["upgrade", "v4", "--instructions", ONE_AT_A_TIME]).await;
    assert_eq!(up.status.code(), Some(0), "{}", text(&up));
    for r in &roots {
        assert!(
            !r.sources_file().exists() && !r.preferences_file().exists(),
            "{} keeps its pin",
            r.name()
        );
    }
    assert_eq!(versions(&roots).await, vec![Some("1.0".to_string()); 3]);
    drop(f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_is_a_package_snapshot_on_etcd() {
    let etcd = jio_tests::Etcd::start().await;
    scenario(&etcd.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_is_a_package_snapshot_on_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    scenario(&url).await;
}
