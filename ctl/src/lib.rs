//! jioctl: the operator CLI. Shows the fleet, sets the desired version and drives
//! rollouts under the rules.

#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod progress;
pub mod queries;
pub mod status;
pub mod upgrade;
pub mod writes;
