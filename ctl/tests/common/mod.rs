//! What the jioctl scenario tests share: the built binaries and running jioctl
//! against a store.

#![allow(dead_code)] // each test file uses its own part

pub mod commands;
pub mod composable;
pub mod fleet;
pub mod hooks;
pub mod reboot;
pub mod terminal;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use tokio::process::Command;

/// `n` seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn jioctl_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_jioctl"))
}

pub fn agent_bin() -> PathBuf {
    jio_tests::inspect::sibling_binary(env!("CARGO_BIN_EXE_jioctl"), "jio-agent")
}

/// `jioctl --store <url> <args>`, free of the caller's environment and files; it
/// is killed if the test drops it.
pub fn jioctl(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new(jioctl_bin());
    c.arg("--store")
        .arg(url)
        .args(args)
        .env_remove("JIO_STORE")
        .env("HOME", "/nonexistent")
        .kill_on_drop(true);
    c
}

pub async fn run(url: &str, args: &[&str]) -> Output {
    jioctl(url, args).output().await.unwrap()
}

/// Checks that what a `jioctl` printed (its output and errors) holds `what`
/// (folded or not), showing all of it otherwise.
#[track_caller]
pub fn assert_says(out: &Output, what: &str) {
    let t = jio_tests::inspect::text(out);
    assert!(t.contains(what) || unfolded(&t).contains(what), "{t}");
}

/// What `jioctl status` exits with, as documented: 1 when the fleet it shows (its
/// JSON document) has a failed or lost host, or one without a live agent that is
/// not upgraded; 0 otherwise.
pub fn status_code(v: &serde_json::Value) -> i32 {
    let any = |state: &str| {
        v[state].as_object().is_some_and(|roles| {
            roles
                .values()
                .any(|hosts| hosts.as_array().is_some_and(|h| !h.is_empty()))
        })
    };
    let agentless = v["hosts"].as_object().is_some_and(|hosts| {
        hosts.values().any(|h| {
            matches!(h["state"].as_str(), Some("upgrading" | "pending" | "blocked")) && h["agent"].is_null()
        })
    });
    i32::from(any("failed") || any("lost") || agentless)
}

/// What a `jioctl` said with the rows folded under a line (4 spaces in, as
/// jioctl folds its notes and sentences to 80 columns) joined back to it: a
/// sentence reads whole whatever the width cut.
pub fn unfolded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for row in text.lines() {
        if row.starts_with("    ") && !out.is_empty() {
            out.push(' ');
            out.push_str(row.trim_start());
        } else {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(row);
        }
    }
    out
}
