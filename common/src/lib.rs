//! Shared vocabulary of the jiocloud fleet tools: validated names, the key schema,
//! stored values, the hostname → role rule, the rules and their planner, the fleet
//! snapshot, the store layer (etcd, the embedded SQLite store, Consul, and an
//! in-memory store for logic tests), the Swift client, the backoff and the clock.

#![forbid(unsafe_code)]

pub mod backoff;
pub mod clock;
pub mod command;
pub mod command_record;
pub mod compose;
pub mod compose_rules;
pub mod duration;
pub mod encode;
pub mod exposition;
pub mod fleet;
pub mod gate;
pub mod keys;
pub mod names;
pub mod phase;
pub mod plan;
pub mod roles;
pub mod rollout;
pub mod rules;
pub mod secret;
pub mod store;
pub mod suggest;
pub mod swift;
pub mod time;
pub mod values;
pub mod window;
