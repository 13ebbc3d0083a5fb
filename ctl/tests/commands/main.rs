//! Fleet commands (`jioctl run`), against a real etcd (and the Consul double where
//! said) with real `jio-agent` daemons and `jioctl` processes. Overlap, order and
//! repetition are checked on the action's own log (each start and end appended to
//! one file shared by the fleet), never on jioctl's classification. Every `jioctl`
//! is bounded: a hang fails the test. A test whose doc says "Found:" failed before
//! the fix of the defect it names.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

#[path = "../common/mod.rs"]
mod common;

mod failures;
mod interface;
mod limits;
mod log_checks;
mod operators;
mod restarts;
mod stored_values;

use common::commands::*;
use common::fleet::{Fleet, Run, finish, keys_under, signal, spawn};
use common::run;
use jio_common::command_record::{CommandRecord, CommandState, Targets};
use jio_common::keys::Key;
use jio_common::names::{CommandId, HostName};
use jio_tests::Etcd;
use jio_tests::etcd::etcdctl_put;
use jio_tests::inspect::{open, text, wait_for};
use nix::sys::signal::Signal;
use std::time::Duration;

use common::secs;

const COMPUTES: [&str; 6] = [
    "compute1", "compute2", "compute3", "compute4", "compute5", "compute6",
];

const ONE_COMPUTE: &str = r#"{"rolling_rules": {"roles": {"compute": 1}}}"#;

const GLOBAL_ONE: &str = r#"{"rolling_rules": {"global": 1}}"#;

// ---------------------------------------------------------------------------
// Hosts outside the command, dead agents, dangling admissions
// ---------------------------------------------------------------------------

/// Kills a process group leader's processes recorded by the actions (tidying up
/// orphans a killed agent left).
fn kill_pids(pids: &[i32]) {
    for p in pids {
        if *p > 0 {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), Signal::SIGKILL);
        }
    }
}
