//! Composable rollouts (seed 004), against a real store with real `jio-agent`
//! daemons (where agents matter) and real `jioctl` processes, with the real `puppet
//! apply` where said. Order, overlap and repetition come from the task log the
//! fleet's scripts write (`common::composable`), never from jioctl's
//! classification. A test whose doc says "Found:" failed before the fix of the
//! defect it names.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

#[path = "../common/mod.rs"]
mod common;

mod faults;
mod finalize;
mod left_behind;
mod lockstep;
mod log_checks;
mod operators;
mod stages;
mod stores;

use common::composable::{
    Fleet, NOVA_PHASES, Phase, PuppetKind, Service, Task, TaskRun, after_violations, alive,
    assert_one_compute_at_a_time, assert_rollout_failed_naming, count, finalize_violations, json,
    lockstep_violations, max_overlap, nova_compute, of_version, parent_pid, parse_log, rollout_record,
    sequence_violations, set, spawn_stage, stage_order_violations, stage_states, stand_in_fleet,
    wait_for_run, wait_v2_phase,
};
use common::fleet::{finish, keys_under, spawn};
use common::run;
use jio_common::keys::{Key, Schema};
use jio_tests::Etcd;
use jio_tests::inspect::{open, text, wait_for};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::composable::{keystone, nova_compute_short};
use common::fleet::now;
use common::secs;

/// nova_api runs each of its steps after keystone's, everywhere.
fn nova_api() -> Service {
    Service::new(
        "nova_api",
        vec![
            Task::pre(1, "stop nova-api"),
            Task::post(3, "api db sync"),
            Task::post(3, "start nova-api"),
            Task::finalize("online data migrations"),
        ],
    )
    .after(&["keystone"])
}

// The checks themselves, on hand-made logs: each must catch what it is for.

fn line(kind: &str, host: &str, service: &str, phase: &str, pid: u32, at: f64, task: &str) -> String {
    format!("{kind} {host} {service} {phase} v2 {pid} {at} {task}\n")
}

/// A hand-made run: `(host, service, phase, pid, start, end, task)`, an end of
/// `None` leaving the run open.
type Made<'a> = (&'a str, &'a str, &'a str, u32, f64, Option<f64>, &'a str);

/// Hand-made runs as log lines, in time order.
fn log(runs: &[Made<'_>]) -> String {
    let mut lines: Vec<(f64, String)> = Vec::new();
    for &(h, s, p, pid, start, end, task) in runs {
        lines.push((start, line("start", h, s, p, pid, start, task)));
        if let Some(e) = end {
            lines.push((e, line("end", h, s, p, pid, e, task)));
        }
    }
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    lines.into_iter().map(|(_, l)| l).collect()
}

/// Rules with keystone on the controllers, nova_compute on the computes and the
/// finalize step on a controller.
const FINALIZE_RULES: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" }
}"#;

/// [`FINALIZE_RULES`] with two computes at a time.
const TWO_COMPUTES_RULES: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "compute": 2 } }
}"#;

/// Rules with one compute at a time, so that computes wait for admission.
const ONE_RULES: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "compute": 1 } }
}"#;

/// Starts a driver under ONE_RULES with compute1's pre-1 slow, and returns once
/// compute1 runs it (the other computes wait for their turn).
async fn mid_pre_1(f: &Fleet, url: &str, seconds: f64) -> tokio::process::Child {
    f.set_task_seconds("compute1", "nova_compute", Phase::Pre(1), None, seconds);
    let driver = f.spawn_upgrade(url, ONE_RULES);
    wait_v2_phase(f, "compute1", Phase::Pre(1)).await;
    driver
}

/// How often `host` ran nova_compute's pre-1 task "RPC pin nova-compute".
fn rpc_pins(runs: &[TaskRun], host: &str) -> usize {
    count(runs, host, "nova_compute", Phase::Pre(1), "RPC pin nova-compute")
}

fn key(k: &str) -> Key {
    Key::new(k).unwrap()
}

/// nova_compute with one pre and one post step and a finalize task.
fn nova_compute_fin() -> Service {
    Service::new(
        "nova_compute",
        vec![
            Task::pre(1, "RPC pin nova-compute"),
            Task::post(3, "db sync"),
            Task::finalize("unpin RPC"),
        ],
    )
}

/// `jioctl upgrade` spawned, waited for at most `within`: its output, or a panic
/// naming what the fleet and `jioctl status` show when it did not end.
async fn ends_within(
    f: &Fleet,
    url: &str,
    child: tokio::process::Child,
    within: Duration,
) -> std::process::Output {
    match tokio::time::timeout(within, child.wait_with_output()).await {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let st = text(&run(url, &["status"]).await);
            panic!(
                "the driver did not end within {within:?}\n--- jioctl status\n{st}\n{}",
                f.diagnostics()
            )
        }
    }
}

const STAGED: &str = r#"{
  "roles_data": { "controller": ["keystone"], "compute": ["nova_compute"] },
  "stages": { "controlplane": ["controller"], "compute": ["compute"] },
  "finalize": { "role": "controller" },
  "rolling_rules": { "roles": { "compute": 2 } }
}"#;
