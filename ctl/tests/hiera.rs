//! The Hiera data file (seed 003) with real Puppet on a real etcd: a manifest
//! renders the controllers it finds with `lookup()`, and the file it writes
//! changes when a controller joins and when one is forgotten (`jioctl forget-host`),
//! read again by the agent before each run.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::process::Stdio;
use std::time::Duration;

use jio_common::keys::Schema;
use jio_common::names::HostName;
use jio_tests::inspect::{open, text, wait_for};
use jio_tests::{Etcd, Host, Puppet};
use tokio::process::{Child, Command};

use common::{agent_bin, run};

fn daemon(host: &Host, log: &std::path::Path) -> Child {
    Command::from(host.agent(&agent_bin(), &["run"]))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puppet_looks_up_the_controllers_and_sees_them_come_and_go() {
    let etcd = Etcd::start().await;
    let url = etcd.url();
    let s = open(&url).await;
    let schema = Schema::default();
    let logs = tempfile::tempdir().unwrap();
    let puppet = Puppet::new();
    let out_file = puppet.scratch().join("controllers");
    let manifest = puppet.manifest(
        "site",
        &format!(
            "$c = lookup('etcdlookup::active_roles::controller', Hash, 'first', {{}})\n\
             file {{ '{}': content => \"${{sort(keys($c)).join(',')}}\\n\" }}\n",
            out_file.display()
        ),
    );
    let compute = Host::new("compute1", &url, &puppet.command(&manifest), "");
    std::fs::write(
        puppet.confdir().join("hiera.yaml"),
        format!(
            "---\nversion: 5\ndefaults:\n  datadir: {}\n  data_hash: yaml_data\nhierarchy:\n  - name: jiocloud\n    path: jiocloud.yaml\n",
            compute.hiera_file().parent().unwrap().display()
        ),
    )
    .unwrap();
    let controller = |name: &str| Host::new(name, &url, &["true".to_string()], "");
    let c1 = controller("controller1");
    let c2 = controller("controller2");
    let mut daemons = vec![daemon(&c1, &logs.path().join("controller1.log"))];
    let published = |h: &'static str| {
        let s = s.clone();
        let key = schema.active_roles();
        async move {
            s.list(&key)
                .await
                .unwrap()
                .kvs
                .iter()
                .any(|kv| kv.key.as_str().contains(&format!("/{h}/")))
        }
    };
    wait_for(
        "controller1 to publish its addresses",
        Duration::from_secs(30),
        || published("controller1"),
    )
    .await;
    let rules = r#"{"rolling_rules":{"global":3}}"#;
    let upgrade = |v: &'static str| {
        let url = url.clone();
        async move {
            let out = run(&url, &["upgrade", v, "--instructions", rules, "--timeout", "3m"]).await;
            assert_eq!(out.status.code(), Some(0), "upgrade {v}: {}", text(&out));
        }
    };
    let rendered = || std::fs::read_to_string(&out_file).unwrap_or_default();
    daemons.push(daemon(&compute, &logs.path().join("compute1.log")));
    upgrade("v1").await;
    assert_eq!(
        rendered(),
        "controller1\n",
        "{}",
        std::fs::read_to_string(compute.hiera_file()).unwrap_or_default()
    );
    // A controller joins: the next run sees it.
    daemons.push(daemon(&c2, &logs.path().join("controller2.log")));
    wait_for(
        "controller2 to publish its addresses",
        Duration::from_secs(30),
        || published("controller2"),
    )
    .await;
    upgrade("v2").await;
    assert_eq!(rendered(), "controller1,controller2\n");
    // It is decommissioned and forgotten: the next run no longer sees it.
    daemons[2].kill().await.unwrap();
    let agent_key = schema.agent(&HostName::new("controller2").unwrap());
    wait_for(
        "controller2's lease to expire",
        Duration::from_secs(20),
        || async { s.get(&agent_key).await.unwrap().is_none() },
    )
    .await;
    let out = run(&url, &["forget-host", "controller2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // The file is read again before the next run, not kept from a watch.
    assert!(
        std::fs::read_to_string(compute.hiera_file())
            .unwrap()
            .contains("controller2"),
        "nothing reads /active_roles/ between runs"
    );
    upgrade("v3").await;
    assert_eq!(rendered(), "controller1\n");
    assert!(
        !std::fs::read_to_string(compute.hiera_file())
            .unwrap()
            .contains("controller2")
    );
}
