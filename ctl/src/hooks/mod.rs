//! Maintenance hooks: the programs a rollout's driver runs around a host's slot,
//! per role (`[hooks.<role>]` in jioctl's configuration): `before` drains the host
//! (disable its compute service, move its instances away) and must succeed before
//! the host is enabled; `after` puts it back once the host reported success at the
//! target version, and must succeed before its slot is free. They run on the
//! driver, which holds the cloud's admin credentials that the host does not.
//!
//! `settings` holds the validated configuration, `decide` the pure decision of a
//! driver's pass (which hook starts, which record is written), `runner` the child
//! process contract and `runs` the hooks this process runs.

pub mod decide;
pub mod runner;
pub mod runs;
pub mod settings;

pub use settings::{HookSettings, HookSpec};
