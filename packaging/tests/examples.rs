//! The shipped configuration and the cloud-init example stay valid: the real
//! `cloud-init schema` accepts the example, it calls jio-agent only with real
//! subcommands and flags, and both agent configurations load. The example shell
//! scripts (hooks, the quick start and its helpers) are clean under shellcheck.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::PathBuf;
use std::process::Command;

use clap::Parser as _;
use jio_agent::config::{Overrides, load};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn user_data() -> PathBuf {
    root().join("packaging/cloud-init/user-data.yaml")
}

fn loads(path: PathBuf) {
    let ov = Overrides {
        config_path: Some(path.clone()),
        ..Overrides::default()
    };
    if let Err(e) = load(&ov, || Some("compute1".into())) {
        panic!("{} does not load: {e}", path.display());
    }
}

#[test]
fn the_shipped_agent_configuration_loads() {
    loads(root().join("packaging/agent/agent.toml"));
}

#[test]
fn cloud_init_example_is_valid_cloud_config() {
    let text = std::fs::read_to_string(user_data()).unwrap();
    assert_eq!(text.lines().next(), Some("#cloud-config"));
    let cloud_init = jio_tests::require_binary("cloud-init", "apt-get install -y cloud-init");
    let out = Command::new(cloud_init)
        .args(["schema", "--config-file"])
        .arg(user_data())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cloud-init schema rejects the example: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The example parsed as JSON (with the YAML parser cloud-init itself uses).
fn parsed() -> serde_json::Value {
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
        ])
        .arg(user_data())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn cloud_init_example_uses_only_real_agent_flags_and_a_valid_configuration() {
    let doc = parsed();
    // Every command line of runcmd, with `sh -c` scripts split into their commands.
    let mut commands: Vec<Vec<String>> = Vec::new();
    for entry in doc["runcmd"].as_array().unwrap() {
        let words: Vec<String> = match entry {
            serde_json::Value::Array(a) => a.iter().map(|w| w.as_str().unwrap().to_string()).collect(),
            serde_json::Value::String(s) => s.split_whitespace().map(String::from).collect(),
            other => panic!("unexpected runcmd entry {other}"),
        };
        if words.first().map(String::as_str) == Some("sh") && words.get(1).map(String::as_str) == Some("-c") {
            for part in words[2].split([';', '&', '|']) {
                commands.push(part.split_whitespace().map(String::from).collect());
            }
        } else {
            commands.push(words);
        }
    }
    let agent_calls: Vec<&Vec<String>> = commands
        .iter()
        .filter(|c| c.first().is_some_and(|w| w == "jio-agent"))
        .collect();
    assert!(!agent_calls.is_empty(), "the example never runs jio-agent");
    for call in agent_calls {
        if let Err(e) = jio_agent::cli::Cli::try_parse_from(call) {
            panic!("{call:?} is not a valid jio-agent command line: {e}");
        }
    }
    assert!(
        commands
            .iter()
            .any(|c| c.len() >= 2 && c[0] == "jio-agent" && c[1] == "bootstrap")
    );
    // The configuration it writes loads.
    let file = doc["write_files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "/etc/jiocloud/agent.toml")
        .expect("the example writes /etc/jiocloud/agent.toml");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("agent.toml");
    std::fs::write(&p, file["content"].as_str().unwrap()).unwrap();
    loads(p);
}

/// The example maintenance hooks shipped with jioctl parse as shell scripts, and
/// shellcheck finds nothing in them (they cannot run against a real cloud here).
#[test]
fn the_example_hooks_are_sound_shell_scripts() {
    let dir = root().join("examples/hooks");
    let hooks = ["nova-before", "nova-after", "ceph-before", "ceph-after"];
    for h in hooks {
        let out = Command::new("sh").arg("-n").arg(dir.join(h)).output().unwrap();
        assert!(
            out.status.success(),
            "{h}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let shellcheck = jio_tests::require_binary("shellcheck", "apt-get install -y shellcheck");
    let out = Command::new(shellcheck)
        .args(["-s", "sh"])
        .args(hooks.iter().map(|h| dir.join(h)))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

/// The example scripts (the quick start, its snapshot repository, the stand-in for
/// Puppet) parse, and shellcheck finds nothing in them.
#[test]
fn the_example_scripts_are_sound_shell_scripts() {
    let dir = root().join("examples");
    let scripts = ["local-fleet.sh", "snapshot-repo.sh", "fake-puppet.sh"];
    for s in scripts {
        let shell = if s == "fake-puppet.sh" { "sh" } else { "bash" };
        let out = Command::new(shell).arg("-n").arg(dir.join(s)).output().unwrap();
        assert!(
            out.status.success(),
            "{s}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let shellcheck = jio_tests::require_binary("shellcheck", "apt-get install -y shellcheck");
    let out = Command::new(shellcheck)
        .current_dir(&dir)
        .args(scripts)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}
