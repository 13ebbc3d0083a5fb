//! Our packages on real booted machines: QEMU guests of a Debian image, first
//! booted by cloud-init from a seed made from `packaging/cloud-init/user-data.yaml`,
//! installing `jio-agent` from an apt repository on loopback and running it under
//! systemd as PID 1, against a real etcd on loopback.
//!
//! Not part of `cargo test --workspace` (`test = false` in Cargo.toml: on two
//! cores the guests must not run beside the other tests); run it with
//! `cargo test -p jio-tests --test vm_reboot -- --test-threads=1`, as the VM stage
//! of `./scripts/test.sh` does. Needs root (debootstrap) and the packages of
//! `jio_tests::vm::image::INSTALL`; the .debs from `packaging/build-debs.sh 1`.
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock
#![warn(clippy::too_many_lines)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use jio_tests::Etcd;
use jio_tests::etcd::etcdctl_put;
use jio_tests::vm::{self, AptRepo, Fleet, Forward, HOST_ADDR, Seed};

const ETCD_PORT: u16 = 2379;
const REPO_PORT: u16 = 8080;
const GUESTS: [&str; 3] = ["compute1", "compute2", "compute3"];
/// First boot under emulation: kernel, systemd, cloud-init, apt, the agent's
/// first converge.
const FIRST_BOOT: Duration = Duration::from_secs(420);

/// The servers and the guests of one scenario (dropped in reverse: guests first).
struct World {
    etcd: Etcd,
    repo: AptRepo,
    fleet: Fleet,
    started: Instant,
}

/// The packaged .debs (`packaging/build-debs.sh 1`, or `JIO_VM_DEBS`).
fn agent_deb() -> PathBuf {
    let dir = std::env::var_os("JIO_VM_DEBS").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debian/1"),
        PathBuf::from,
    );
    let found = std::fs::read_dir(&dir).ok().and_then(|entries| {
        entries.flatten().map(|e| e.path()).find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("jio-agent_"))
        })
    });
    found.unwrap_or_else(|| {
        panic!(
            "no jio-agent .deb in {}: run packaging/build-debs.sh 1 first (./scripts/test.sh does)",
            dir.display()
        )
    })
}

async fn world() -> World {
    let started = Instant::now();
    let etcd = Etcd::start().await;
    let repo = AptRepo::start().await;
    repo.add(&agent_deb());
    repo.publish();
    let forwards = vec![
        Forward {
            guest_port: ETCD_PORT,
            host_port: etcd.port(0),
        },
        Forward {
            guest_port: REPO_PORT,
            host_port: repo.port(),
        },
    ];
    let logs = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("vm_reboot");
    let fleet = Fleet::new(forwards, 512, &logs).await;
    World {
        etcd,
        repo,
        fleet,
        started,
    }
}

/// The seed of guest `name`: the example's, against the forwarded servers.
fn seed(name: &str) -> Seed {
    Seed {
        hostname: name.into(),
        role: "compute".into(),
        store: format!("etcd://{HOST_ADDR}:{ETCD_PORT}"),
        repo: format!("http://{HOST_ADDR}:{REPO_PORT}/"),
        packages: vec![],
        agent: vec!["health_interval = \"0s\"".into()],
        files: vec![(
            "/etc/puppet/manifests/site.pp".into(),
            "0644".into(),
            "notify { 'jio-vm': message => \"converging ${facts['current_version']}\" }\n".into(),
        )],
    }
}

/// Boots every guest and waits until each agent reported `version` as running.
async fn first_boot(w: &mut World, version: &str) {
    etcdctl_put(&w.etcd.url(), b"/current_version", version.as_bytes());
    for name in GUESTS {
        w.fleet.boot(&seed(name));
    }
    let store = jio_tests::inspect::open(&w.etcd.url()).await;
    for name in GUESTS {
        let key = format!("/running/versions/{version}/{name}");
        let g = w.fleet.guest(name);
        let ready = g
            .console
            .wait_for(0, "Started jio-agent.service", FIRST_BOOT)
            .await;
        let within = FIRST_BOOT.saturating_sub(w.started.elapsed());
        jio_tests::inspect::wait_for(&key, within, || async {
            let k = jio_common::keys::Key::new(key.as_str()).expect("key");
            store.get(&k).await.expect("etcd").is_some()
        })
        .await;
        let booted = g.console.find(0, "JIO-VM boot").expect("the boot marker");
        println!(
            "vm: {name}: boot marker +{:.1} s, jio-agent.service ready +{:.1} s, {key} +{:.1} s after QEMU started",
            vm::secs_between(g.started, booted.at),
            vm::secs_between(g.started, ready.at),
            vm::secs_between(g.started, vm::console::now()),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_boot_install_the_agent_and_report_v1() {
    let mut w = world().await;
    first_boot(&mut w, "v1").await;
    let out = w
        .etcd
        .etcdctl(&["get", "--prefix", "/status/provisioned/success/", "--keys-only"]);
    let provisioned = String::from_utf8_lossy(&out.stdout);
    for name in GUESTS {
        assert!(
            provisioned.contains(&format!("/status/provisioned/success/{name}")),
            "{name} is not provisioned: {provisioned}"
        );
    }
    let fetched = w
        .repo
        .requests()
        .iter()
        .filter(|l| l.contains("/jio-agent_") && l.contains("\" 200 "))
        .count();
    assert_eq!(
        fetched,
        GUESTS.len(),
        "each guest downloads jio-agent once from the test's repository"
    );
    println!("vm: memory: {}", w.fleet.memory_report());
    println!(
        "vm: first boot of {} guests took {:.1} s in all",
        GUESTS.len(),
        w.started.elapsed().as_secs_f64()
    );
}
