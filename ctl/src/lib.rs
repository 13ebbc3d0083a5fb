//! jioctl: the operator CLI. Shows the fleet, sets the desired version and drives
//! rollouts under the rules.
//!
//! Layering, one way: `cli` → `commands` → (`upgrade`, `hooks`, `release`,
//! `status`, `render`, `rollouts`, `fleet_commands`, `writes`, `context`) → `exit`
//! and `config` (with the hooks' settings); no module imports one that imports it
//! back.

#![forbid(unsafe_code)]
#![warn(clippy::too_many_lines)]

pub mod cli;
pub mod commands;
pub mod config;
pub mod config_keys;
pub mod context;
pub mod drift;
pub mod exit;
pub mod fleet_commands;
pub mod hooks;
pub mod hosts_arg;
pub mod metrics;
pub mod out;
pub mod progress;
pub mod release;
pub mod render;
pub mod rollouts;
pub mod snapshots;
pub mod status;
pub mod status_json;
pub mod status_view;
pub mod upgrade;
pub mod writes;
