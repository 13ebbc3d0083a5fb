//! Test harness shared by the scenario tests: real servers (etcd, a Swift
//! all-in-one) and the Consul API test server, started on free loopback ports in
//! temporary directories and always stopped, also when a test fails; sandboxes for
//! real `puppet apply`; hosts with their agent configuration; the invariant
//! recorder; the fault-injection fleet; throwaway Debian roots and a signed snapshot
//! apt repository for real apt runs (`apt`); and small helpers (`inspect`).

pub mod apt;
pub mod consul;
pub mod etcd;
pub mod faults;
pub mod fleetgen;
pub mod host;
pub mod inspect;
pub mod pki;
pub mod process;
pub mod prometheus;
pub mod prometheus_server;
pub mod puppet;
pub mod receiver;
pub mod recorder;
pub mod swift;
pub mod vm;

pub use etcd::Etcd;
pub use host::Host;
pub use process::{free_port, require_binary};
pub use puppet::Puppet;
pub use recorder::{Record, Recorder};
pub use swift::Swift;
