//! Shared vocabulary of the jiocloud fleet tools, in floors: each module names only
//! modules of its own floor or lower ones (`tests/tests/code_shape.rs` checks it).
//!
//! - **support**: backoff, the clock and time, durations, encodings, secrets, the
//!   metrics exposition, suggestions, the Swift client;
//! - **vocab**: validated names, the key schema, stored values and records (a
//!   rollout's, a fleet command's, a host's maintenance hook, a composable
//!   rollout's phases and grants), package snapshots and sets, the hostname → role rule, and the store's
//!   contract (`store::api`);
//! - **store**: the backends (etcd, the embedded SQLite store, Consul, in memory)
//!   and opening one by URL;
//! - **rules**: the rollout rules, the composable rules, maintenance windows;
//! - **fleet**: the fleet snapshot, read from the store, and how each host stands;
//! - **plan**: the pure planners (rolling, composable, fleet commands).

#![forbid(unsafe_code)]
#![warn(clippy::too_many_lines)]

// support
pub mod backoff;
pub mod clock;
pub mod duration;
pub mod encode;
pub mod exposition;
pub mod secret;
pub mod suggest;
pub mod swift;
pub mod time;

// vocab
pub mod command_record;
pub mod hook_record;
pub mod keys;
pub mod names;
pub mod packages;
pub mod phase;
pub mod roles;
pub mod rollout;
pub mod values;

// store (its contract, `store::api`, belongs to vocab)
pub mod store;

// rules
pub mod compose_rules;
pub mod rules;
pub mod window;

// fleet
pub mod fleet;
pub mod gate;

// plan
pub mod command;
pub mod compose;
pub mod plan;
