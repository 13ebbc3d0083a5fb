//! jio-agent: the node agent. It decides whether its host may upgrade, runs Puppet
//! and validation, and reports versions and lifecycle entries to the store.

#![forbid(unsafe_code)]
#![warn(clippy::too_many_lines)]

pub mod agent;
pub mod cli;
pub mod command_step;
pub mod config;
pub mod config_keys;
pub mod daemon;
pub mod decide;
pub mod error;
pub mod hiera;
pub mod identity;
pub mod ledger;
pub mod liveness;
pub mod metrics;
pub mod notify;
pub mod observe;
pub mod packages;
pub mod pass;
pub mod reboot;
pub mod report;
pub mod results;
pub mod rundir;
pub mod runner;
pub mod services;
pub mod state;
pub mod steps;
pub mod uploads;
