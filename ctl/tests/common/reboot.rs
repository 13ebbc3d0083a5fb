//! Simulated reboots for fleets of real agents: each host's reboot command (see
//! `jio_tests::Host`) logs its own `down` time, leaves the next boot id and stops
//! its agent with SIGTERM; `Boots` plays the rest of the reboot (down for a while,
//! then the new boot id and a fresh agent) and logs each `up` time on this
//! machine's clock. With the validation scripts' own log, the tests check what was
//! down and what was validated without the project's classification.

#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::fleet::{Fleet, now};

/// The boots of a fleet's hosts.
pub struct Boots {
    /// How long a host stays down after its agent stopped.
    pub down: Duration,
    /// Hosts that never come back (their machine is gone).
    pub never: Vec<String>,
    /// When each host's agent was seen stopped for a reboot.
    stopped: BTreeMap<usize, Instant>,
    /// `(host, up time)` of every boot played.
    pub ups: Vec<(String, f64)>,
}

impl Boots {
    pub fn new(down: Duration, never: &[&str]) -> Boots {
        Boots {
            down,
            never: never.iter().map(|s| s.to_string()).collect(),
            stopped: BTreeMap::new(),
            ups: Vec::new(),
        }
    }

    /// Hosts down now (their agent stopped by their reboot command).
    pub fn down_now(&self, f: &Fleet) -> Vec<String> {
        self.stopped.keys().map(|i| f.hosts[*i].name.clone()).collect()
    }

    /// One look at the fleet: a host whose reboot command ran and whose agent has
    /// stopped is down; once down for `down`, it boots (new boot id, agent started).
    pub fn tick(&mut self, f: &mut Fleet) {
        for i in 0..f.hosts.len() {
            let pending = f.hosts[i].dir().join("boot_id.next").exists();
            if !pending || self.stopped.contains_key(&i) {
                continue;
            }
            if f.daemons[i].try_wait().ok().flatten().is_some() {
                self.stopped.insert(i, Instant::now());
            }
        }
        let due: Vec<usize> = self
            .stopped
            .iter()
            .filter(|(i, at)| at.elapsed() >= self.down && !self.never.contains(&f.hosts[**i].name))
            .map(|(i, _)| *i)
            .collect();
        for i in due {
            self.stopped.remove(&i);
            assert!(f.hosts[i].boot(), "{} had no next boot id", f.hosts[i].name);
            f.daemons[i] = f.spawn_agent(i);
            self.ups.push((f.hosts[i].name.clone(), now()));
        }
    }
}

/// Writes each host's validation script: it logs `validate <host> <boot id>
/// <time>` to `validations.log` in the fleet's directory, then passes.
pub fn log_validations(f: &Fleet) {
    for h in &f.hosts {
        let p = h.validation_dir().join("10-service");
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\nnow() {{ env -u LD_PRELOAD -u FAKETIME date +%s.%N; }}\necho \"validate {} $(cat '{}') $(now)\" >> '{}'\n",
                h.name,
                h.boot_id_file().display(),
                f.work.path().join("validations.log").display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
}

/// `(host, boot id, time)` of every validation the scripts logged.
pub fn validations(f: &Fleet) -> Vec<(String, String, f64)> {
    std::fs::read_to_string(f.work.path().join("validations.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            ["validate", h, id, at] => Some((h.to_string(), id.to_string(), at.parse().ok()?)),
            _ => None,
        })
        .collect()
}
