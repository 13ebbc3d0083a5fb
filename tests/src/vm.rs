//! Real booted machines for the scenario tests: a small fleet of QEMU guests from
//! a cached Debian image (`vm::image`, `tests/vm/build-image.sh`), each first booted
//! by cloud-init from a seed made from our example user-data (`vm::seed`),
//! installing our packages from an apt repository on loopback (`vm::repo`), with
//! its serial console stamped by the host's clock (`vm::console`). The guests
//! reach nothing but the test's loopback servers, through QEMU forwards
//! (`vm::guest`). A `Fleet` kills every guest when it is dropped, also when a test
//! panics; the servers are the test's own guards (`Etcd`, `AptRepo`).

#![warn(clippy::too_many_lines)]

pub mod console;
pub mod evidence;
pub mod guest;
pub mod image;
pub mod repo;
pub mod seed;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

pub use console::{Console, Line, Marker};
pub use guest::{Forward, Guest, HOST_ADDR, Machine};
pub use image::{Accel, Image};
pub use repo::AptRepo;
pub use seed::Seed;

/// The guests of one test, killed on drop.
pub struct Fleet {
    pub image: Image,
    pub machine: Machine,
    work: tempfile::TempDir,
    logs: PathBuf,
    guests: Vec<Guest>,
}

impl Fleet {
    /// The image (built or from the cache) and the accelerator, for guests with
    /// `forwards`; console logs go to `logs` (kept after the test).
    pub async fn new(forwards: Vec<Forward>, memory_mb: u32, logs: &Path) -> Fleet {
        let image = Image::ensure().await;
        let accel = Accel::detect(&image).await;
        let _ = std::fs::remove_dir_all(logs);
        std::fs::create_dir_all(logs).expect("console log directory");
        println!("vm: console logs in {}", logs.display());
        Fleet {
            image,
            machine: Machine {
                accel,
                memory_mb,
                forwards,
            },
            work: tempfile::Builder::new()
                .prefix("jio-vm-")
                .tempdir()
                .expect("temporary directory"),
            logs: logs.to_path_buf(),
            guests: Vec::new(),
        }
    }

    /// Starts a guest named after its seed's host name.
    pub fn boot(&mut self, seed: &Seed) -> &Guest {
        let dir = self.work.path().join(&seed.hostname);
        let iso = seed.build(&dir);
        let g = Guest::start(&self.image, &self.machine, &seed.hostname, &iso, &dir, &self.logs);
        self.guests.push(g);
        self.guests.last().expect("just pushed")
    }

    /// The guest named `name`.
    pub fn guest(&self, name: &str) -> &Guest {
        self.guests
            .iter()
            .find(|g| g.name == name)
            .unwrap_or_else(|| panic!("no guest {name}"))
    }

    pub fn guest_mut(&mut self, name: &str) -> &mut Guest {
        self.guests
            .iter_mut()
            .find(|g| g.name == name)
            .unwrap_or_else(|| panic!("no guest {name}"))
    }

    pub fn guests(&self) -> &[Guest] {
        &self.guests
    }

    /// Each guest's memory as `name: RSS MiB now (peak MiB), overlay MiB`.
    pub fn memory_report(&self) -> String {
        self.guests
            .iter()
            .map(|g| match g.memory_mb() {
                Some((rss, peak)) => format!(
                    "{}: QEMU RSS {rss} MiB (peak {peak} MiB), overlay {} MiB",
                    g.name,
                    g.overlay_mb()
                ),
                None => format!("{}: not running", g.name),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The last lines of every guest's console, for a failure message.
    pub fn tails(&self, n: usize) -> String {
        self.guests
            .iter()
            .map(|g| format!("--- {} ---\n{}", g.name, g.console.tail(n)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for g in &mut self.guests {
            g.kill();
        }
    }
}

/// Seconds from `a` to `b` on the host clock (negative when `b` is earlier).
pub fn secs_between(a: SystemTime, b: SystemTime) -> f64 {
    console::unix(b) - console::unix(a)
}

/// Waits for every guest's console to show `needle` (from position 0), within
/// `within` of now; returns when each showed it.
pub async fn wait_all(fleet: &Fleet, needle: &str, within: Duration) -> Vec<(String, Line)> {
    let mut out = Vec::new();
    for g in fleet.guests() {
        out.push((g.name.clone(), g.console.wait_for(0, needle, within).await));
    }
    out
}
