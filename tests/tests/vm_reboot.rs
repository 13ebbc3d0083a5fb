//! Coordinated reboots on real booted machines: QEMU guests of a Debian image,
//! first booted by cloud-init from a seed made from
//! `packaging/cloud-init/user-data.yaml`, installing `jio-agent` from an apt
//! repository on loopback and running it under systemd as PID 1, against a real
//! etcd on loopback; then `jioctl upgrade` with one compute in flight and stand-in
//! maintenance hooks, where a package's postinst asks for a reboot and each guest
//! really reboots. Judged only by evidence our programs do not keep: the consoles'
//! boot markers stamped by the host's clock, the hooks' own log, and the
//! validation script's console marker.
//!
//! Not part of `cargo test --workspace` (`test = false` in Cargo.toml: on two
//! cores the guests must not run beside the other tests); run it with
//! `cargo test -p jio-tests --test vm_reboot -- --test-threads=1`, as the VM stage
//! of `./scripts/test.sh` does. Needs root (debootstrap), the packages of
//! `jio_tests::vm::image::INSTALL`, the .debs of `packaging/build-debs.sh 1` and
//! the built `jioctl` (`cargo build --workspace --bins`).
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock
#![warn(clippy::too_many_lines)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use jio_tests::Etcd;
use jio_tests::etcd::etcdctl_put;
use jio_tests::inspect::{built_binary, text, wait_for};
use jio_tests::vm::evidence::{self, Interval};
use jio_tests::vm::repo::dummy_deb;
use jio_tests::vm::{self, AptRepo, Fleet, Forward, HOST_ADDR, Seed};

const ETCD_PORT: u16 = 2379;
const REPO_PORT: u16 = 8080;
const GUESTS: [&str; 3] = ["compute1", "compute2", "compute3"];
const ONE_AT_A_TIME: &str = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;
/// First boot under emulation: kernel, systemd, cloud-init, apt, the agent's
/// first converge.
const FIRST_BOOT: Duration = Duration::from_secs(420);
/// The agents' `reboot_timeout`: a reboot here takes well under a minute.
const REBOOT_TIMEOUT: Duration = Duration::from_secs(90);

/// The servers and the guests of one scenario (dropped in reverse: guests first).
struct World {
    etcd: Etcd,
    repo: AptRepo,
    fleet: Fleet,
    work: tempfile::TempDir,
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
    let work = tempfile::Builder::new()
        .prefix("jio-vm-scenario-")
        .tempdir()
        .expect("temporary directory");
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
    let w = World {
        etcd,
        repo,
        fleet,
        work,
        started,
    };
    publish_dummy(&w, 1);
    write_jioctl_config(&w);
    w
}

/// Adds `jio-dummy` `<n>.0` to the repository: the version of fleet version `v<n>`.
/// From 2 on, its postinst asks for a reboot the Debian way.
fn publish_dummy(w: &World, n: u32) {
    let postinst = (n > 1).then_some(
        "#!/bin/sh\nset -e\nif [ \"$1\" = configure ]; then\n  touch /var/run/reboot-required\n  echo jio-dummy >> /var/run/reboot-required.pkgs\nfi\n",
    );
    let deb = dummy_deb(w.work.path(), "jio-dummy", &format!("{n}.0"), postinst);
    w.repo.add(&deb);
    w.repo.publish();
}

/// The test's validation script: says on the console that validation passed, with
/// the fleet version (the agent's fact), the dummy package's version and the boot id.
const VALIDATION_MARK: &str = "#!/bin/sh\nv=$(sed -n 's/^current_version=//p' /etc/facter/facts.d/current_version.txt)\nexec /usr/local/sbin/jio-vm-mark validated \"$v\" \"$(dpkg-query -W -f='${Version}' jio-dummy)\"\n";

/// What a guest's egress probe (the image's `jio-vm-egress.service`) tries, and
/// what it must find: its forward to the repository open; the host's loopback
/// behind QEMU's gateway, where the repository listens, blocked; and a Debian
/// mirror the host itself reaches, blocked.
fn egress_probes(repo: &AptRepo) -> Vec<(String, &'static str)> {
    use std::net::ToSocketAddrs as _;
    let mut probes = vec![
        (format!("{HOST_ADDR}:{REPO_PORT}"), "open"),
        (format!("10.0.2.2:{}", repo.port()), "blocked"),
    ];
    let mirror = ("deb.debian.org", 80)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.find(|a| a.is_ipv4()))
        .filter(|a| std::net::TcpStream::connect_timeout(a, Duration::from_secs(3)).is_ok());
    match mirror {
        Some(a) => probes.push((a.to_string(), "blocked")),
        None => println!("vm: deb.debian.org is not reachable from the host: its egress probe is left out"),
    }
    probes
}

/// The seed of guest `name`: the example's, against the forwarded servers.
fn seed(name: &str, probes: &[(String, &str)]) -> Seed {
    let egress: String = probes.iter().map(|(a, _)| a.replace(':', " ") + "\n").collect();
    let file = |path: &str, mode: &str, content: &str| (path.into(), mode.into(), content.into());
    Seed {
        hostname: name.into(),
        role: "compute".into(),
        store: format!("etcd://{HOST_ADDR}:{ETCD_PORT}"),
        repo: format!("http://{HOST_ADDR}:{REPO_PORT}/"),
        packages: vec!["jio-dummy".into()],
        agent: vec![
            "health_interval = \"0s\"".into(),
            format!("reboot_timeout = \"{}s\"", REBOOT_TIMEOUT.as_secs()),
        ],
        files: vec![
            file(
                "/etc/puppet/manifests/site.pp",
                "0644",
                "notify { 'jio-vm': message => \"converging ${facts['current_version']}\" }\n",
            ),
            file("/usr/lib/jiocloud/tests/90-jio-vm-mark", "0755", VALIDATION_MARK),
            file("/etc/jio-vm/egress", "0644", &egress),
        ],
    }
}

/// Boots every guest and waits until each agent reported `version` as running
/// and said on its console that it validated it.
async fn first_boot(w: &mut World, version: &str) {
    etcdctl_put(&w.etcd.url(), b"/current_version", version.as_bytes());
    let probes = egress_probes(&w.repo);
    for name in GUESTS {
        w.fleet.boot(&seed(name, &probes));
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
        wait_for(&key, within, || async {
            let k = jio_common::keys::Key::new(key.as_str()).expect("key");
            store.get(&k).await.expect("etcd").is_some()
        })
        .await;
        let booted = g.console.find(0, "JIO-VM boot").expect("the boot marker");
        let validated = g.console.markers().into_iter().find(|m| m.event == "validated");
        let words = validated.map(|m| m.words).unwrap_or_default();
        assert_eq!(
            words,
            [version, "1.0"],
            "{name}: the validation marker of the first converge"
        );
        check_egress(&g.console, &probes).await;
        println!(
            "vm: {name}: boot marker +{:.1} s, jio-agent.service ready +{:.1} s, {key} +{:.1} s after QEMU started",
            vm::secs_between(g.started, booted.at),
            vm::secs_between(g.started, ready.at),
            vm::secs_between(g.started, vm::console::now()),
        );
    }
}

/// The guest's egress probes found what `probes` says (its forward open, the rest
/// blocked).
async fn check_egress(console: &vm::Console, probes: &[(String, &str)]) {
    for (addr, want) in probes {
        let needle = format!("JIO-VM egress {addr}=");
        console.wait_for(0, &needle, Duration::from_secs(60)).await;
        let found = console.markers().into_iter().find(|m| {
            m.event == "egress"
                && m.words
                    .first()
                    .is_some_and(|w| w.starts_with(&format!("{addr}=")))
        });
        let word = found.and_then(|m| m.words.first().cloned()).unwrap_or_default();
        assert_eq!(
            word,
            format!("{addr}={want}"),
            "{}: the egress probe of {addr}",
            console.name()
        );
    }
}

/// The first boot went through cloud-init and our packages, as the example says.
fn check_first_boot(w: &World) {
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
}

/// The stand-in maintenance hook: logs its start and end on the host's clock.
const HOOK: &str = "#!/bin/sh\necho \"start $JIO_HOOK $JIO_HOST $JIO_VERSION $(date +%s.%N)\" >> \"$1\"\nsleep 1\necho \"end $JIO_HOOK $JIO_HOST $JIO_VERSION $(date +%s.%N)\" >> \"$1\"\n";

/// jioctl's configuration (the store, and the hooks of role compute) and the rules.
fn write_jioctl_config(w: &World) {
    let dir = w.work.path();
    let hook = dir.join("hook.sh");
    std::fs::write(&hook, HOOK).expect("hook script");
    let argv = format!(
        "[\"/bin/sh\", \"{}\", \"{}\"]",
        hook.display(),
        hooks_log(w).display()
    );
    let config = dir.join("jioctl.toml");
    std::fs::write(
        &config,
        format!(
            "store = \"{}\"\nstate_dir = \"{}\"\n\n[hooks.compute]\nbefore = {argv}\nafter = {argv}\ntimeout = \"5m\"\n",
            w.etcd.url(),
            dir.join("jioctl-state").display()
        ),
    )
    .expect("jioctl.toml");
    std::fs::write(dir.join("rules.json"), ONE_AT_A_TIME).expect("rules");
}

fn hooks_log(w: &World) -> PathBuf {
    w.work.path().join("hooks.log")
}

/// `jioctl ARGS` with the scenario's configuration (and no other).
fn jioctl(w: &World, args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(built_binary("jioctl"));
    c.arg("--config")
        .arg(w.work.path().join("jioctl.toml"))
        .args(args)
        .env_remove("JIO_STORE")
        .env("HOME", w.work.path())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

fn rules(w: &World) -> String {
    w.work.path().join("rules.json").display().to_string()
}

/// `jioctl upgrade VERSION` with one compute at a time, driven to its end.
async fn upgrade(w: &World, version: &str, within: Duration) -> std::process::Output {
    let rules = rules(w);
    let run = jioctl(w, &["upgrade", version, "--instructions-file", &rules]).output();
    let out = tokio::time::timeout(within, run)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "jioctl upgrade {version} did not end in {within:?};\n{}",
                w.fleet.tails(30)
            )
        })
        .expect("run jioctl");
    assert!(
        out.status.success(),
        "jioctl upgrade {version}: {}\n{}",
        text(&out),
        w.fleet.tails(30)
    );
    out
}

/// What the guests' consoles and the hooks' log say about the rollout to `version`
/// that started at `since` (host time): each guest's one reboot and slot.
struct Rollout {
    reboots: Vec<evidence::Reboot>,
    slots: Vec<Interval>,
}

fn rollout_evidence(w: &World, version: &str, since: f64) -> Rollout {
    let mut reboots = Vec::new();
    for name in GUESTS {
        let markers = w.fleet.guest(name).console.markers();
        let mut r = evidence::reboots(name, &markers, since);
        assert_eq!(
            r.len(),
            1,
            "{name} rebooted {} times in the rollout to {version}: {r:?}",
            r.len()
        );
        reboots.push(r.remove(0));
    }
    let log = std::fs::read_to_string(hooks_log(w)).unwrap_or_default();
    let slots = evidence::slots(&evidence::hook_runs(&log), version);
    Rollout { reboots, slots }
}

/// One guest down at a time, one in its slot at a time, each reboot inside its
/// own slot, and each validated after its boot before the next slot began.
fn check_one_at_a_time(r: &Rollout, version: &str) {
    let downs: Vec<Interval> = r.reboots.iter().map(|b| b.down.clone()).collect();
    assert_eq!(evidence::overlaps(&downs), vec![], "two guests were down at once");
    assert_eq!(r.slots.len(), GUESTS.len(), "one slot per guest: {:?}", r.slots);
    assert_eq!(
        evidence::overlaps(&r.slots),
        vec![],
        "two guests were in their hooks' slot at once"
    );
    let mut slots = r.slots.clone();
    slots.sort_by(|a, b| a.start.total_cmp(&b.start));
    for (i, slot) in slots.iter().enumerate() {
        let b = r
            .reboots
            .iter()
            .find(|b| b.down.host == slot.host)
            .expect("each slotted guest rebooted");
        assert!(
            slot.holds(b.down.start) && slot.holds(b.down.end),
            "{}'s reboot {:?} is not inside its slot {slot:?}",
            slot.host,
            b.down
        );
        let validated = b
            .validated
            .unwrap_or_else(|| panic!("{} never validated {version} after its boot", slot.host));
        assert!(slot.holds(validated), "{} validated after its slot", slot.host);
        if let Some(next) = slots.get(i + 1) {
            assert!(
                validated < next.start,
                "{} validated at {validated:.3}, after {}'s slot began at {:.3}",
                slot.host,
                next.host,
                next.start
            );
        }
        assert_ne!(b.old_boot, b.new_boot);
    }
}

/// Each guest's validation after its boot says `version` and the dummy `<n>.0`.
fn check_validated(w: &World, r: &Rollout, version: &str, dummy: &str) {
    for (name, b) in GUESTS.iter().zip(&r.reboots) {
        let m = w
            .fleet
            .guest(name)
            .console
            .markers()
            .into_iter()
            .find(|m| m.event == "validated" && m.boot_id == b.new_boot)
            .expect("a validation after the boot");
        assert_eq!(m.words, [version, dummy], "{name}'s validation after its boot");
    }
}

/// Rolls the fleet to `version` and checks the reboots by the evidence.
async fn rolling_reboot(w: &World, version: &str, dummy: u32) {
    publish_dummy(w, dummy);
    let since = vm::console::unix(vm::console::now());
    let out = upgrade(w, version, Duration::from_secs(480)).await;
    let r = rollout_evidence(w, version, since);
    check_one_at_a_time(&r, version);
    check_validated(w, &r, version, &format!("{dummy}.0"));
    for b in &r.reboots {
        let slot = r.slots.iter().find(|s| s.host == b.down.host).expect("slot");
        let console = &w.fleet.guest(&b.down.host).console;
        let after_boot = |needle: &str| {
            let l = console
                .lines()
                .into_iter()
                .find(|l| vm::console::unix(l.at) >= b.down.end && l.text.contains(needle));
            l.map_or(f64::NAN, |l| vm::console::unix(l.at) - b.down.end)
        };
        println!(
            "vm: {}: slot {:.1} s, down {:.1} s (shutdown marker to boot marker); after the boot marker: jio-agent.service ready {:.1} s, validated {:.1} s",
            b.down.host,
            slot.end - slot.start,
            b.down.end - b.down.start,
            after_boot("Started jio-agent.service"),
            b.validated.unwrap_or(f64::NAN) - b.down.end
        );
    }
    println!(
        "vm: jioctl upgrade {version}:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `jioctl status --json`.
async fn status_json(w: &World) -> serde_json::Value {
    let out = jioctl(w, &["status", "--json"])
        .output()
        .await
        .expect("jioctl status");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

/// The first guest whose console shows a shutdown after position `from[i]`.
async fn first_to_shut_down(w: &World, from: &[usize], within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        for (name, at) in GUESTS.iter().zip(from) {
            if w.fleet.guest(name).console.find(*at, "JIO-VM shutdown").is_some() {
                return name.to_string();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no guest rebooted in {within:?};\n{}",
            w.fleet.tails(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The rules of the lost-guest rollout: one compute at a time, and a progress
/// deadline past the victim's reboot deadline (its run starts, reboots at about
/// 40 s and is lost `REBOOT_TIMEOUT` after that).
fn stuck_rules(w: &World) -> String {
    let deadline = REBOOT_TIMEOUT.as_secs() + 30;
    let rules =
        format!(r#"{{"rolling_rules":{{"roles":{{"compute":1}}}},"progress_deadline":"{deadline}s"}}"#);
    let path = w.work.path().join("stuck-rules.json");
    std::fs::write(&path, rules).expect("rules");
    path.display().to_string()
}

/// A rollout to `version` where the first guest to reboot is lost mid-reboot (its
/// QEMU killed): it keeps its slot, no other guest starts, `status` names it lost
/// once its reboot deadline passed, and the driver ends saying the rollout is stuck
/// on it.
async fn lost_guest(w: &mut World, version: &str, dummy: u32) {
    publish_dummy(w, dummy);
    let from: Vec<usize> = GUESTS.iter().map(|n| w.fleet.guest(n).console.len()).collect();
    let rules = stuck_rules(w);
    let driver = jioctl(w, &["upgrade", version, "--instructions-file", &rules])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start jioctl upgrade");
    let victim = first_to_shut_down(w, &from, Duration::from_secs(240)).await;
    w.fleet.guest_mut(&victim).kill();
    println!("vm: {victim} killed in its reboot (QEMU SIGKILLed at its shutdown marker)");
    let lost = wait_lost(w, &victim).await;
    let out = tokio::time::timeout(Duration::from_secs(240), driver.wait_with_output())
        .await
        .expect("jioctl upgrade did not end on the stuck rollout")
        .expect("jioctl upgrade");
    let said = text(&out);
    assert_eq!(
        out.status.code(),
        Some(7),
        "jioctl upgrade {version} on a lost guest: {said}"
    );
    assert!(said.contains("is stuck") && said.contains(&victim), "{said}");
    check_slot_kept(w, &victim, version, &from);
    let rollout = jioctl(w, &["rollout", "status"])
        .output()
        .await
        .expect("jioctl rollout status");
    let shown = text(&rollout);
    println!(
        "vm: status says {victim}: {lost}\nvm: jioctl upgrade {version} said:\n{said}\nvm: jioctl rollout status:\n{shown}"
    );
    assert!(
        shown.contains("stuck") && shown.contains(&victim),
        "jioctl rollout status: {shown}"
    );
}

/// The lost guest still holds its slot (its run marker says `rebooting`), and
/// nobody else of its role started: no other `before` hook ran, no other agent's
/// console shows an upgrade to `version` (from position `from[i]` on).
fn check_slot_kept(w: &World, victim: &str, version: &str, from: &[usize]) {
    let run = w
        .etcd
        .etcdctl(&["get", &format!("/runs/{victim}"), "--print-value-only"]);
    let marker = String::from_utf8_lossy(&run.stdout);
    assert!(
        marker.contains("rebooting"),
        "{victim}'s run marker (its slot): {marker:?}"
    );
    for (name, at) in GUESTS.iter().zip(from).filter(|(n, _)| **n != victim) {
        let c = &w.fleet.guest(name).console;
        let started = c.find(*at, &format!("upgrade starts version={version}"));
        assert!(
            started.is_none(),
            "{name} started while {victim} held the slot: {started:?}"
        );
    }
    let log = std::fs::read_to_string(hooks_log(w)).unwrap_or_default();
    let befores: Vec<String> = evidence::hook_runs(&log)
        .into_iter()
        .filter(|r| r.version == version && r.hook == "before")
        .map(|r| r.host)
        .collect();
    assert_eq!(befores, [victim], "only the lost guest's before hook ran");
}

/// Waits until `jioctl status --json` calls `victim` lost; returns its reason.
async fn wait_lost(w: &World, victim: &str) -> String {
    let deadline = Instant::now() + REBOOT_TIMEOUT + Duration::from_secs(90);
    loop {
        let v = status_json(w).await;
        let h = &v["hosts"][victim];
        if h["state"] == "lost" {
            let reason = h["reason"]["text"].as_str().unwrap_or_default().to_string();
            assert!(reason.contains("not back by"), "{victim} is lost, but why: {h}");
            return reason;
        }
        assert!(Instant::now() < deadline, "{victim} is never called lost: {h}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guests_reboot_one_at_a_time_inside_their_hooks() {
    let mut w = world().await;
    first_boot(&mut w, "v1").await;
    check_first_boot(&w);
    let booted = w.started.elapsed();
    println!("vm: memory: {}", w.fleet.memory_report());
    rolling_reboot(&w, "v2", 2).await;
    let rolled = w.started.elapsed();
    println!("vm: memory: {}", w.fleet.memory_report());
    lost_guest(&mut w, "v3", 3).await;
    println!(
        "vm: first boot {:.0} s, rolling reboot {:.0} s, lost guest {:.0} s: {:.0} s in all",
        booted.as_secs_f64(),
        (rolled - booted).as_secs_f64(),
        (w.started.elapsed() - rolled).as_secs_f64(),
        w.started.elapsed().as_secs_f64()
    );
}
