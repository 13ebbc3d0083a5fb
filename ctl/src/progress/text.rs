//! The progress view's words, pure: each group's counts and named hosts fitted
//! to a width (`+N more` for the names that do not fit, a name never cut), the
//! bars' layout for a terminal's width, the stamped lines of the groups that
//! changed, and what the time-left column says. No I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};

use jio_common::fleet::{HostState, HostStatus, Snapshot};

use crate::render::fit_names;

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

/// Some of a group's hosts as progress counts them: `2 upgrading (a, b)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub n: usize,
    pub word: &'static str,
    /// Named as far as room allows (empty: only counted).
    pub names: Vec<String>,
    /// Shown at 0 too.
    pub always: bool,
}

impl Part {
    pub fn new(n: usize, word: &'static str, names: Vec<String>, always: bool) -> Part {
        Part {
            n,
            word,
            names,
            always,
        }
    }
}

/// One group as progress shows it: its roles, how many of its hosts are done,
/// and the rest by what they do (parts that add up to `total` with `done`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Group {
    pub roles: BTreeSet<String>,
    pub done: usize,
    pub total: usize,
    /// What done is: `upgraded`, `succeeded`.
    pub done_word: &'static str,
    pub parts: Vec<Part>,
}

/// ` (a, b +3 more)` within `room` characters, or nothing.
fn paren(names: &[String], room: usize) -> String {
    match fit_names(names, room.saturating_sub(3)) {
        s if s.is_empty() => s,
        s => format!(" ({s})"),
    }
}

impl Group {
    fn shown(&self) -> Vec<&Part> {
        self.parts.iter().filter(|p| p.always || p.n > 0).collect()
    }

    /// The counts after done/total within `room` characters when they fit, each
    /// named list shortened to its share of the room (`+N more` for the rest).
    pub fn message(&self, room: usize) -> String {
        let shown = self.shown();
        let counts: Vec<String> = shown.iter().map(|p| format!("{} {}", p.n, p.word)).collect();
        let base: usize = counts.iter().map(String::len).sum::<usize>() + 2 * counts.len().saturating_sub(1);
        let named = shown.iter().filter(|p| !p.names.is_empty()).count().max(1);
        let mut spare = room.saturating_sub(base);
        let mut lists: Vec<String> = shown.iter().map(|p| paren(&p.names, spare / named)).collect();
        spare = spare.saturating_sub(lists.iter().map(String::len).sum());
        // What a list did not use goes to the next that was shortened.
        for (p, l) in shown.iter().zip(lists.iter_mut()) {
            let wider = paren(&p.names, l.len() + spare);
            spare = (spare + l.len()).saturating_sub(wider.len());
            *l = wider;
        }
        let parts: Vec<String> = counts.into_iter().zip(lists).map(|(c, l)| c + &l).collect();
        parts.join(", ")
    }

    /// `compute` for a group of one role of its name; `db (mysql, redis)` otherwise,
    /// the roles shortened to `width` (`+N more`).
    pub fn title(&self, name: &str, width: usize) -> String {
        if self.roles.len() == 1 && self.roles.contains(name) {
            return name.to_string();
        }
        let roles: Vec<String> = self.roles.iter().cloned().collect();
        let inner = fit_names(&roles, width.saturating_sub(name.len() + 3));
        if inner.is_empty() {
            name.to_string()
        } else {
            format!("{name} ({inner})")
        }
    }

    /// The group as lines: its counts (`compute: 3/10 upgraded, 2 upgrading, 4
    /// pending`), then a row per named kind with the names that fit `width`
    /// (`    upgrading: a, b +3 more`).
    pub fn lines(&self, name: &str, width: usize) -> Vec<String> {
        let counts: Vec<String> = self
            .shown()
            .iter()
            .map(|p| format!("{} {}", p.n, p.word))
            .collect();
        let mut out = vec![format!(
            "{}: {}/{} {}, {}",
            self.title(name, width / 3),
            self.done,
            self.total,
            self.done_word,
            counts.join(", ")
        )];
        for p in self.parts.iter().filter(|p| !p.names.is_empty()) {
            let room = width.saturating_sub(4 + p.word.len() + 2);
            out.push(format!("    {}: {}", p.word, fit_names(&p.names, room)));
        }
        out
    }
}

/// A group's roles, counts, and hosts upgrading, failed and lost, as counted.
type Tally = (BTreeSet<String>, Counts, [Vec<String>; 3]);

/// The hosts by rollout group (as the rollout's rules make them).
pub fn groups(snap: &Snapshot, hosts: &[HostStatus]) -> BTreeMap<String, Group> {
    let (group_of, _) = crate::status::groups(snap, hosts);
    let mut by: BTreeMap<String, Tally> = BTreeMap::new();
    for h in hosts {
        let name = group_of
            .get(&h.role)
            .cloned()
            .unwrap_or_else(|| h.role.to_string());
        let (roles, counts, named) = by.entry(name).or_default();
        roles.insert(h.role.to_string());
        counts.add(h.state);
        let host = h.host.to_string();
        match h.state {
            HostState::Upgrading => named[0].push(host),
            HostState::Failed => named[1].push(host),
            HostState::Lost => named[2].push(host),
            _ => {}
        }
    }
    by.into_iter()
        .map(|(name, (roles, c, [upgrading, failed, lost]))| {
            let g = Group {
                roles,
                done: c.upgraded,
                total: c.total(),
                done_word: "upgraded",
                parts: vec![
                    Part::new(c.upgrading, "upgrading", upgrading, true),
                    Part::new(c.failed, "failed", failed, false),
                    Part::new(c.lost, "lost", lost, false),
                    Part::new(c.pending, "pending", vec![], true),
                    Part::new(c.blocked, "blocked", vec![], false),
                ],
            };
            (name, g)
        })
        .collect()
}

/// How the bars of a terminal `cols` wide are laid out (columns of each field;
/// 0: not shown). The row stays 3 columns short of the width, so that neither
/// the terminal's pending wrap nor an echoed `^C` pushes it onto a second row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) title: usize,
    pub(super) bar: usize,
    pub(super) num: usize,
    pub(super) took: usize,
    pub(super) msg: usize,
}

/// The time-left column's width.
const LEFT: usize = 9;

pub(super) fn layout(cols: usize, groups: &BTreeMap<String, Group>) -> Layout {
    let usable = cols.saturating_sub(3);
    let num = groups
        .values()
        .map(|g| g.total.to_string().len())
        .max()
        .unwrap_or(1);
    let cap = (cols / 4).max(8);
    let title = groups
        .iter()
        .map(|(n, g)| g.title(n, cap).chars().count())
        .max()
        .unwrap_or(8)
        .min(cap);
    let base = groups.values().map(|g| g.message(0).len()).max().unwrap_or(0);
    let full = groups
        .values()
        .map(|g| g.message(usize::MAX).len())
        .max()
        .unwrap_or(0);
    let fixed = title + 1 + 2 * num + 1 + 1 + LEFT + 1;
    // The counts first, then up to 40 columns of names, the bar, the time
    // elapsed, and whatever is left to more names.
    let mut rest = usable.saturating_sub(fixed + base);
    rest -= (full - base).min(40).min(rest);
    let bar = match rest.saturating_sub(3).min(20) {
        b if b >= 6 => b,
        _ => 0,
    };
    rest -= if bar > 0 { bar + 3 } else { 0 };
    let took = if rest >= 6 { 6 } else { 0 };
    let used = fixed + took + if bar > 0 { bar + 3 } else { 0 };
    Layout {
        title,
        bar,
        num,
        took,
        msg: usable.saturating_sub(used),
    }
}

impl Layout {
    pub(super) fn template(&self) -> String {
        let mut t = format!("{{prefix:<{}}} ", self.title);
        if self.bar > 0 {
            t.push_str(&format!("[{{bar:{}}}] ", self.bar));
        }
        t.push_str(&format!("{{pos:>{n}}}/{{len:<{n}}} ", n = self.num));
        if self.took > 0 {
            t.push_str("{took:>5} ");
        }
        t.push_str(&format!("{{left:<{LEFT}}} {{msg}}"));
        t
    }
}

/// What the bars say in their time-left column once this process stops showing them.
pub(super) const FOLLOWING: u8 = 0;
pub(super) const ENDED: u8 = 1;
pub(super) const GOES_ON: u8 = 2;

/// The time left, as the bar shows it: `eta 4m10s` from the pace so far, `eta ?`
/// before the group's first host is done, `done` once all are; `goes on` when this
/// process stopped following a rollout or command that goes on, `ended` when it
/// ended.
pub(super) fn left_text(done: u64, total: u64, end: u8, eta_secs: u64) -> String {
    match (done, end) {
        (d, _) if d >= total => "done".into(),
        (_, GOES_ON) => "goes on".into(),
        (_, ENDED) => "ended".into(),
        (0, _) => "eta ?".into(),
        _ => format!("eta {}", compact(eta_secs)),
    }
}

/// `42s`, `4m10s`, `1h05m`.
pub(super) fn compact(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// The stamped lines of the groups that changed since `last`, fitted to `width`.
pub fn changed_lines(
    last: &BTreeMap<String, Group>,
    now: &BTreeMap<String, Group>,
    stamp: &str,
    width: usize,
) -> Vec<String> {
    now.iter()
        .filter(|(name, g)| last.get(*name) != Some(*g))
        .flat_map(|(name, g)| crate::out::note_rows(stamp, &g.lines(name, width).join("\n"), width))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Group {
        Group {
            roles: ["mysql".to_string(), "redis".to_string()].into(),
            done: 3,
            total: 10,
            done_word: "upgraded",
            parts: vec![
                Part::new(2, "upgrading", vec!["mysql2".into(), "redis1".into()], true),
                Part::new(1, "failed", vec!["mysql3".into()], false),
                Part::new(0, "lost", vec![], false),
                Part::new(4, "pending", vec![], true),
            ],
        }
    }

    #[test]
    fn a_group_names_its_hosts_in_flight_and_its_roles() {
        assert_eq!(
            db().message(200),
            "2 upgrading (mysql2, redis1), 1 failed (mysql3), 4 pending"
        );
        assert_eq!(
            db().lines("db", 80),
            [
                "db (mysql, redis): 3/10 upgraded, 2 upgrading, 1 failed, 4 pending",
                "    upgrading: mysql2, redis1",
                "    failed: mysql3"
            ]
        );
        assert_eq!(compact(42), "42s");
        assert_eq!(compact(250), "4m10s");
        assert_eq!(compact(3900), "1h05m");
        let one = Group {
            roles: ["compute".to_string()].into(),
            ..Group::default()
        };
        assert_eq!(one.title("compute", 8), "compute");
    }

    #[test]
    fn the_time_left_says_what_goes_on() {
        let cases = [
            (3, 3, FOLLOWING, 0, "done"),
            (3, 3, GOES_ON, 0, "done"),
            (1, 3, FOLLOWING, 250, "eta 4m10s"),
            (0, 3, FOLLOWING, 0, "eta ?"),
            (1, 3, GOES_ON, 250, "goes on"),
            (0, 3, GOES_ON, 0, "goes on"),
            (1, 3, ENDED, 250, "ended"),
        ];
        for (done, total, end, eta, want) in cases {
            assert_eq!(left_text(done, total, end, eta), want, "{done}/{total} end {end}");
            assert!(want.len() <= LEFT);
        }
    }

    /// A fleet of `n` hosts in four groups: 1% failed, 2 in flight per group, a
    /// third done.
    fn fleet(n: usize) -> BTreeMap<String, Group> {
        ["compute", "controller", "stmon", "db"]
            .iter()
            .map(|role| {
                let total = n / 4;
                let hosts = |from: usize, k: usize| {
                    (from..from + k).map(|i| format!("{role}{i}")).collect::<Vec<_>>()
                };
                let failed = total / 100;
                let g = Group {
                    roles: [role.to_string()].into(),
                    done: total / 3,
                    total,
                    done_word: "upgraded",
                    parts: vec![
                        Part::new(2, "upgrading", hosts(0, 2), true),
                        Part::new(failed, "failed", hosts(2, failed), false),
                        Part::new(total - total / 3 - 2 - failed, "pending", vec![], true),
                    ],
                };
                (role.to_string(), g)
            })
            .collect()
    }

    #[test]
    fn bars_fit_the_terminal_at_any_fleet_size() {
        for n in [10, 500, 10_000] {
            let groups = fleet(n);
            for cols in [50, 80, 132] {
                let l = layout(cols, &groups);
                let row =
                    l.title + 1 + if l.bar > 0 { l.bar + 3 } else { 0 } + 2 * l.num + 2 + l.took + LEFT + 1;
                for (name, g) in &groups {
                    let msg = g.message(l.msg);
                    assert!(g.title(name, l.title).len() <= l.title, "{name} at {cols}");
                    if msg.len() <= l.msg {
                        assert!(row + msg.len() <= cols - 3, "{n} hosts at {cols}: {msg}");
                    }
                    if cols >= 80 {
                        assert!(msg.len() <= l.msg, "{n} hosts at {cols}: {msg} > {}", l.msg);
                    }
                    if cols >= 80 && n <= 10 || cols >= 132 {
                        assert!(msg.contains(&format!("({name}0")), "in flight named: {msg}");
                    }
                }
            }
        }
    }

    #[test]
    fn stamped_lines_fit_80_columns_and_count_the_whole_fleet() {
        for n in [10, 500, 10_000] {
            let groups = fleet(n);
            let lines = changed_lines(&BTreeMap::new(), &groups, "2026-11-26 14:20:01 UTC", 80);
            assert!(lines.iter().all(|l| l.chars().count() <= 80), "{lines:#?}");
            let text = lines.join("\n");
            let again = changed_lines(&groups, &groups, "2026-11-26 14:20:01 UTC", 80);
            assert!(again.is_empty(), "an unchanged group is not repeated: {again:?}");
            // The counts as printed add up, group by group, to the fleet.
            let mut fleet = 0;
            let mut logical: Vec<String> = Vec::new();
            for row in &lines {
                match logical.last_mut() {
                    _ if row.starts_with("2026") => logical.push(row.clone()),
                    Some(l) if row.trim_start().starts_with(|c: char| c.is_ascii_digit()) => {
                        l.push(' ');
                        l.push_str(row.trim_start());
                    }
                    _ => {}
                }
            }
            for l in &logical {
                let (_, counts) = l.split_once(": ").unwrap();
                let (done_total, rest) = counts.split_once(' ').unwrap();
                let (done, total) = done_total.split_once('/').unwrap();
                let n_of = |s: &str| {
                    s.trim_start_matches(',')
                        .trim()
                        .split(' ')
                        .next()
                        .unwrap()
                        .parse::<usize>()
                        .unwrap()
                };
                let parts: usize = rest.split(", ").skip(1).map(n_of).sum();
                let total: usize = total.parse().unwrap();
                assert_eq!(n_of(done) + parts, total, "{l}");
                fleet += total;
            }
            assert_eq!(fleet, n / 4 * 4, "{text}");
            assert!(text.contains("    failed: ") || n < 400, "{text}");
            assert!(text.contains("    upgrading: compute0"), "{text}");
        }
    }
}
