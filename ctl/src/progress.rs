//! Live progress of a rollout: a bar per role in a terminal, plain lines otherwise
//! (one per role whose counts changed).

use std::collections::BTreeMap;
use std::io::Write as _;

use jio_common::fleet::{HostState, HostStatus};

/// Counts of one role.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub upgraded: usize,
    pub upgrading: usize,
    pub failed: usize,
    pub pending: usize,
    pub lost: usize,
    pub blocked: usize,
}

impl Counts {
    fn total(&self) -> usize {
        self.upgraded + self.upgrading + self.failed + self.pending + self.lost + self.blocked
    }
}

pub fn counts(hosts: &[HostStatus]) -> BTreeMap<String, Counts> {
    let mut out: BTreeMap<String, Counts> = BTreeMap::new();
    for h in hosts {
        let c = out.entry(h.role.to_string()).or_default();
        match h.state {
            HostState::Upgraded => c.upgraded += 1,
            HostState::Upgrading => c.upgrading += 1,
            HostState::Failed => c.failed += 1,
            // Unknown only without a current version, which a rollout always has.
            HostState::Pending | HostState::Unknown => c.pending += 1,
            HostState::Lost => c.lost += 1,
            HostState::Blocked => c.blocked += 1,
        }
    }
    out
}

/// One role's counts as a plain line ("compute: 3/6 upgraded, 2 upgrading, ...").
pub fn plain_line(role: &str, c: &Counts) -> String {
    format!(
        "{role}: {}/{} upgraded, {} upgrading, {} failed, {} pending, {} lost{}",
        c.upgraded,
        c.total(),
        c.upgrading,
        c.failed,
        c.pending,
        c.lost,
        if c.blocked > 0 {
            format!(", {} blocked", c.blocked)
        } else {
            String::new()
        }
    )
}

/// Where progress goes: stdout, or stderr under `--json` (stdout is the final
/// document's alone).
fn words() -> Box<dyn std::io::Write> {
    if crate::out::words_to_stderr() {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    }
}

/// Renders progress to stdout (stderr under `--json`).
pub struct Progress {
    silent: bool,
    tty: bool,
    drawn: usize,
    last: BTreeMap<String, Counts>,
}

impl Progress {
    pub fn new(tty: bool) -> Progress {
        Progress {
            silent: false,
            tty,
            drawn: 0,
            last: BTreeMap::new(),
        }
    }

    /// Shows nothing.
    pub fn silent() -> Progress {
        Progress {
            silent: true,
            ..Progress::new(false)
        }
    }

    /// Prints a line above the progress block.
    pub fn note(&mut self, line: &str) {
        if self.silent {
            return;
        }
        let mut out = words();
        if self.tty && self.drawn > 0 {
            let _ = write!(out, "\x1b[{}A\x1b[J", self.drawn);
            self.drawn = 0;
        }
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    pub fn update(&mut self, hosts: &[HostStatus]) {
        if self.silent {
            return;
        }
        let now = counts(hosts);
        let mut out = words();
        if self.tty {
            if self.drawn > 0 {
                let _ = write!(out, "\x1b[{}A", self.drawn);
            }
            for (role, c) in &now {
                let width = 24;
                let done = (c.upgraded * width).checked_div(c.total()).unwrap_or(width);
                let _ = writeln!(
                    out,
                    "\x1b[2K{:<16} [{}{}] {:>4}/{:<4} upgrading {:<3} failed {:<3} pending {:<3}{}{}",
                    role,
                    "#".repeat(done),
                    "-".repeat(width - done),
                    c.upgraded,
                    c.total(),
                    c.upgrading,
                    c.failed,
                    c.pending,
                    if c.lost > 0 {
                        format!(" lost {}", c.lost)
                    } else {
                        String::new()
                    },
                    if c.blocked > 0 {
                        format!(" blocked {}", c.blocked)
                    } else {
                        String::new()
                    }
                );
            }
            self.drawn = now.len();
        } else {
            for (role, c) in &now {
                if self.last.get(role) != Some(c) {
                    let _ = writeln!(out, "{}", plain_line(role, c));
                }
            }
        }
        let _ = out.flush();
        self.last = now;
    }
}
