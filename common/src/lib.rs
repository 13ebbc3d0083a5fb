//! Shared vocabulary of the jiocloud fleet tools: validated names, the key schema,
//! stored values, and the store layer (etcd and the embedded store).

#![forbid(unsafe_code)]

pub mod duration;
pub mod encode;
pub mod fleet;
pub mod gate;
pub mod keys;
pub mod names;
pub mod roles;
pub mod rules;
pub mod store;
pub mod swift;
pub mod time;
pub mod values;
