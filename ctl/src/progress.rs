//! Live progress of a rollout. In a terminal: one bar per rollout group (the unit
//! the limits apply to), drawn by `indicatif` to the terminal's width, with the
//! time elapsed, an estimate of the time left and the hosts in flight named.
//! Otherwise: one timestamped line per group whose counts changed. Notes (what the
//! driver did) print above the bars, stamped with the time too.

use crate::out::set_drawn;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use jio_common::fleet::{HostState, HostStatus, Snapshot};

/// Counts of one role (or group).
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

    fn add(&mut self, state: HostState) {
        match state {
            HostState::Upgraded => self.upgraded += 1,
            HostState::Upgrading => self.upgrading += 1,
            HostState::Failed => self.failed += 1,
            // Unknown only without a current version, which a rollout always has.
            HostState::Pending | HostState::Unknown => self.pending += 1,
            HostState::Lost => self.lost += 1,
            HostState::Blocked => self.blocked += 1,
        }
    }
}

/// Counts per role (`rollout status`).
pub fn counts(hosts: &[HostStatus]) -> BTreeMap<String, Counts> {
    let mut out: BTreeMap<String, Counts> = BTreeMap::new();
    for h in hosts {
        out.entry(h.role.to_string()).or_default().add(h.state);
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

/// One group as progress shows it: its roles, counts and the hosts in flight.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Group {
    pub roles: BTreeSet<String>,
    pub counts: Counts,
    pub upgrading: Vec<String>,
    pub failed: Vec<String>,
    pub lost: Vec<String>,
}

impl Group {
    /// What the bar says after its counts: the hosts in flight named (the
    /// terminal's width cuts it short, never the counts before it).
    fn message(&self) -> String {
        let mut parts = Vec::new();
        let named = |n: usize, what: &str, hosts: &[String]| {
            if hosts.is_empty() {
                format!("{n} {what}")
            } else {
                format!("{n} {what} ({})", hosts.join(", "))
            }
        };
        parts.push(named(self.counts.upgrading, "upgrading", &self.upgrading));
        if self.counts.failed > 0 {
            parts.push(named(self.counts.failed, "failed", &self.failed));
        }
        if self.counts.lost > 0 {
            parts.push(named(self.counts.lost, "lost", &self.lost));
        }
        parts.push(format!("{} pending", self.counts.pending));
        if self.counts.blocked > 0 {
            parts.push(format!("{} blocked", self.counts.blocked));
        }
        parts.join(", ")
    }

    /// `compute` for a group of one role of its name; `db (mysql, redis)` otherwise.
    fn title(&self, name: &str) -> String {
        if self.roles.len() == 1 && self.roles.contains(name) {
            name.to_string()
        } else {
            let roles: Vec<&str> = self.roles.iter().map(String::as_str).collect();
            format!("{name} ({})", roles.join(", "))
        }
    }

    fn line(&self, name: &str) -> String {
        format!(
            "{}: {}/{} upgraded, {}",
            self.title(name),
            self.counts.upgraded,
            self.counts.total(),
            self.message()
        )
    }
}

/// The hosts by rollout group (as the rollout's rules make them).
pub fn groups(snap: &Snapshot, hosts: &[HostStatus]) -> BTreeMap<String, Group> {
    let (group_of, _) = crate::status::groups(snap, hosts);
    let mut out: BTreeMap<String, Group> = BTreeMap::new();
    for h in hosts {
        let name = group_of
            .get(&h.role)
            .cloned()
            .unwrap_or_else(|| h.role.to_string());
        let g = out.entry(name).or_default();
        g.roles.insert(h.role.to_string());
        g.counts.add(h.state);
        let host = h.host.to_string();
        match h.state {
            HostState::Upgrading => g.upgrading.push(host),
            HostState::Failed => g.failed.push(host),
            HostState::Lost => g.lost.push(host),
            _ => {}
        }
    }
    out
}

/// When, for a line: `2026-11-26 14:20:01 UTC`.
fn stamp() -> String {
    jio_common::time::utc_display(jio_common::time::unix_now())
}

/// A line that could not be written because the reader of the output left (a
/// pager quit): ends the process as a closed output does (`exit::output_closed`),
/// instead of driving on unseen. Other errors are ignored, as before.
fn closed_unless(r: std::io::Result<()>) {
    if let Err(e) = r
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        crate::exit::output_closed(!crate::out::words_to_stderr());
    }
}

/// Where the words go: stdout, or stderr under `--json` (stdout is the final
/// document's alone).
fn words() -> Box<dyn std::io::Write> {
    if crate::out::words_to_stderr() {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    }
}

enum Mode {
    Silent,
    /// The bars are finished: notes are plain stamped lines, updates show nothing.
    Done,
    /// Timestamped lines, one per group whose counts changed.
    Lines {
        last: BTreeMap<String, Group>,
    },
    /// A bar per group in a terminal (`style`: laid out for the terminal at the
    /// first update).
    Bars {
        multi: MultiProgress,
        bars: BTreeMap<String, ProgressBar>,
        style: Option<ProgressStyle>,
    },
}

/// Renders progress (stdout, or stderr under `--json`).
pub struct Progress {
    mode: Mode,
}

/// The bar laid out for a terminal `cols` wide, with group names up to `name`
/// long: name, bar, upgraded/total, elapsed, time left, then the hosts in flight
/// (cut to the terminal's width). Below 72 columns, no bar and no elapsed time.
fn template(cols: u16, name: usize) -> String {
    let name = name.clamp(4, usize::from(cols / 4).max(8));
    if cols < 72 {
        format!("{{prefix:{name}!}} {{pos:>3}}/{{len:<3}} {{left:<9}} {{wide_msg}}")
    } else {
        format!(
            "{{prefix:{name}!}} [{{bar:16}}] {{pos:>3}}/{{len:<3}} {{elapsed:>4}} {{left:<9}} {{wide_msg}}"
        )
    }
}

/// The time left, as the bar shows it: `eta 4m10s` from the pace so far, `eta ?`
/// before the group's first host is done, `done` once all are.
fn left(state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write) {
    let _ = match (state.pos(), state.len()) {
        (p, Some(l)) if p >= l => w.write_str("done"),
        // Following ended (the rollout failed, was stopped, or this jioctl was).
        _ if state.is_finished() => w.write_str("ended"),
        (0, _) => w.write_str("eta ?"),
        _ => write!(w, "eta {}", compact(state.eta().as_secs())),
    };
}

/// `42s`, `4m10s`, `1h05m`.
fn compact(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

impl Progress {
    /// Bars when `tty`, lines otherwise.
    pub fn new(tty: bool) -> Progress {
        let target = if crate::out::words_to_stderr() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::stdout()
        };
        // A terminal that cannot draw bars (TERM=dumb) gets the lines.
        let mode = if tty && !target.is_hidden() {
            let multi = MultiProgress::with_draw_target(target);
            set_drawn(Some(multi.clone()));
            Mode::Bars {
                multi,
                bars: BTreeMap::new(),
                style: None,
            }
        } else {
            Mode::Lines {
                last: BTreeMap::new(),
            }
        };
        Progress { mode }
    }

    /// Shows nothing.
    pub fn silent() -> Progress {
        Progress { mode: Mode::Silent }
    }

    /// Prints a line (stamped with the time) above the bars.
    pub fn note(&mut self, line: &str) {
        let line = format!("{} {line}", stamp());
        match &self.mode {
            Mode::Silent => {}
            Mode::Bars { multi, .. } => {
                if multi.println(&line).is_err() {
                    let _ = writeln!(words(), "{line}");
                }
            }
            Mode::Lines { .. } | Mode::Done => {
                let mut out = words();
                closed_unless(writeln!(out, "{line}").and_then(|()| out.flush()));
            }
        }
    }

    pub fn update(&mut self, snap: &Snapshot, hosts: &[HostStatus]) {
        if matches!(self.mode, Mode::Silent | Mode::Done) {
            return;
        }
        let now = groups(snap, hosts);
        match &mut self.mode {
            Mode::Silent | Mode::Done => {}
            Mode::Lines { last } => {
                let mut out = words();
                for (name, g) in &now {
                    if last.get(name) != Some(g) {
                        closed_unless(writeln!(out, "{} {}", stamp(), g.line(name)));
                    }
                }
                closed_unless(out.flush());
                *last = now;
            }
            Mode::Bars { multi, bars, style } => {
                let term = if crate::out::words_to_stderr() {
                    console::Term::stderr()
                } else {
                    console::Term::stdout()
                };
                let (rows, cols) = term.size_checked().unwrap_or((24, 80));
                // More groups than the terminal has rows for: lines, said once.
                if now.len() + 2 > usize::from(rows) {
                    multi.clear().ok();
                    set_drawn(None);
                    let _ = writeln!(
                        words(),
                        "{} {} groups do not fit a terminal of {rows} rows: progress as lines",
                        stamp(),
                        now.len()
                    );
                    self.mode = Mode::Lines {
                        last: BTreeMap::new(),
                    };
                    return self.update(snap, hosts);
                }
                let style = style.get_or_insert_with(|| {
                    let name = now
                        .iter()
                        .map(|(n, g)| g.title(n).chars().count())
                        .max()
                        .unwrap_or(8);
                    ProgressStyle::with_template(&template(cols, name))
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .with_key("left", left)
                        .progress_chars("#>-")
                });
                for (name, g) in &now {
                    let bar = bars.entry(name.clone()).or_insert_with(|| {
                        let b = multi.add(ProgressBar::new(g.counts.total() as u64));
                        b.set_style(style.clone());
                        b.set_prefix(g.title(name));
                        // Elapsed time moves between changes too.
                        b.enable_steady_tick(Duration::from_secs(1));
                        b
                    });
                    bar.set_length(g.counts.total() as u64);
                    bar.set_position(g.counts.upgraded as u64);
                    bar.set_message(g.message());
                }
            }
        }
    }
}

impl Progress {
    /// Stops the bars where they are (drawn once more, then left above what is
    /// printed next); before anything else is printed when following ends.
    pub fn finish(&mut self) {
        if let Mode::Bars { bars, .. } = &self.mode {
            for b in bars.values() {
                b.disable_steady_tick();
                b.abandon();
            }
            set_drawn(None);
            self.mode = Mode::Done;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_names_its_hosts_in_flight_and_its_roles() {
        let g = Group {
            roles: ["mysql".to_string(), "redis".to_string()].into(),
            counts: Counts {
                upgraded: 3,
                upgrading: 2,
                failed: 1,
                pending: 4,
                lost: 0,
                blocked: 0,
            },
            upgrading: vec!["mysql2".into(), "redis1".into()],
            failed: vec!["mysql3".into()],
            lost: vec![],
        };
        assert_eq!(
            g.line("db"),
            "db (mysql, redis): 3/10 upgraded, 2 upgrading (mysql2, redis1), 1 failed (mysql3), 4 pending"
        );
        assert_eq!(compact(42), "42s");
        assert_eq!(compact(250), "4m10s");
        assert_eq!(compact(3900), "1h05m");
        let one = Group {
            roles: ["compute".to_string()].into(),
            ..Group::default()
        };
        assert_eq!(one.title("compute"), "compute");
    }
}
