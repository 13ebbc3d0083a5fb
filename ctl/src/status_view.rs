//! `status` for people at any fleet size (pure): one line per rollout group, then
//! the hosts that need a person, then the hosts in flight, then the pending hosts
//! grouped by why they wait, each group once with a count and a few names. Lines
//! fit the width given (a terminal's); `wide` also lists every host.

use std::collections::BTreeMap;

use jio_common::fleet::{HostState, HostStatus, Snapshot};
use jio_common::names::{HostName, Role};
use jio_common::plan::{GroupPlan, Reason, ReasonCode};

use crate::render::{names_fit, retry_hint};

/// How the view is laid out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Layout {
    /// The terminal's width: lines are cut or folded to it (none: a pipe).
    pub width: Option<usize>,
    /// Every host on its own line too (`--hosts`).
    pub wide: bool,
}

impl Layout {
    /// Laid out for stdout: its width on a terminal, none through a pipe.
    pub fn of_stdout(wide: bool) -> Layout {
        Layout {
            width: terminal().map(|(_, cols)| cols),
            wide,
        }
    }
}

/// The terminal's rows and columns, when stdout is one.
pub fn terminal() -> Option<(usize, usize)> {
    console::Term::stdout()
        .size_checked()
        .map(|(rows, cols)| (usize::from(rows), usize::from(cols)))
}

/// `lines` cut to `rows` (the most important come first), the last one saying
/// how many were left out.
pub fn fit_height(mut lines: Vec<String>, rows: usize) -> Vec<String> {
    if lines.len() <= rows || rows < 2 {
        return lines;
    }
    let left = lines.len() - (rows - 1);
    lines.truncate(rows - 1);
    lines.push(format!("… {left} more lines (a taller terminal shows them)"));
    lines
}

/// Host names shown in a grouped line before `+N more`.
const NAMES: usize = 3;
/// Hosts listed one per line in a section; more are grouped by reason.
const ALONE: usize = 6;
/// Reason lines in a section of hosts that need a person or are in flight.
const GROUPS: usize = 4;
/// Reasons listed for the pending hosts before `+N more`.
const REASONS: usize = 8;

/// What the view is drawn from.
pub struct Input<'a> {
    pub snap: &'a Snapshot,
    pub hosts: &'a [HostStatus],
    pub reasons: &'a BTreeMap<HostName, Reason>,
    /// The group of each role (the role itself without rules that group them).
    pub group_of: &'a BTreeMap<Role, String>,
    /// The planner's groups, when it planned.
    pub groups: &'a [GroupPlan],
}

/// The body of the view, below the header.
pub fn body(i: &Input<'_>, l: Layout) -> Vec<String> {
    let mut out = group_table(i, l);
    out.extend(needs_a_person(i, l));
    out.extend(in_flight(i, l));
    out.extend(waiting(i, l));
    if l.wide {
        out.extend(every_host(i, l));
    }
    out
}

fn group_name(i: &Input<'_>, h: &HostStatus) -> String {
    i.group_of
        .get(&h.role)
        .cloned()
        .unwrap_or_else(|| h.role.to_string())
}

/// Counts per group, in flight against the limit, and why it waits.
fn group_table(i: &Input<'_>, l: Layout) -> Vec<String> {
    let mut per: BTreeMap<String, BTreeMap<HostState, usize>> = BTreeMap::new();
    for h in i.hosts {
        *per.entry(group_name(i, h))
            .or_default()
            .entry(h.state)
            .or_default() += 1;
    }
    if per.is_empty() {
        return vec!["(no hosts)".into()];
    }
    let mut per: Vec<(String, BTreeMap<HostState, usize>)> = per.into_iter().collect();
    per.sort_by(|a, b| jio_common::names::natural_cmp(&a.0, &b.0));
    let any = |st| i.hosts.iter().any(|h| h.state == st);
    let (blocked, unknown) = (any(HostState::Blocked), any(HostState::Unknown));
    // The counts take 45 columns and 9 more per extra column: a long group name
    // is cut to what is left.
    let fixed = 45 + 9 * (usize::from(blocked) + usize::from(unknown));
    let room = l.width.map_or(usize::MAX, |w| w.saturating_sub(fixed).max(8));
    let gw = per
        .iter()
        .map(|(g, _)| width(g))
        .max()
        .unwrap_or(5)
        .clamp(5, room);
    let mut head = format!(
        "{:<gw$}  {:>9}  {:>9}  {:>6}  {:>7}  {:>4}",
        "GROUP", "UPGRADED", "SLOTS", "FAILED", "PENDING", "LOST"
    );
    extra_columns(&mut head, blocked, unknown, |_| None);
    head.push_str("  WAITS");
    let mut out = vec![head];
    for (g, counts) in &per {
        let c = |st| counts.get(&st).copied().unwrap_or(0);
        let plan = i.groups.iter().find(|p| &p.group == g);
        let total: usize = counts.values().sum();
        let mut row = format!(
            "{:<gw$}  {:>9}  {:>9}  {:>6}  {:>7}  {:>4}",
            cut(g, Some(gw)),
            format!("{}/{total}", c(HostState::Upgraded)),
            in_flight_cell(plan, c(HostState::Upgrading)),
            c(HostState::Failed),
            c(HostState::Pending),
            c(HostState::Lost),
        );
        extra_columns(&mut row, blocked, unknown, |st| Some(c(st)));
        let why = plan.map(first_wait).unwrap_or_default();
        row.push_str(&format!(
            "  {}",
            cut(&why, l.width.map(|w| w.saturating_sub(width(&row) + 2)))
        ));
        out.push(row.trim_end().to_string());
    }
    out
}

fn extra_columns(row: &mut String, blocked: bool, unknown: bool, n: impl Fn(HostState) -> Option<usize>) {
    for (on, st, name) in [
        (blocked, HostState::Blocked, "BLOCKED"),
        (unknown, HostState::Unknown, "UNKNOWN"),
    ] {
        if on {
            match n(st) {
                Some(v) => row.push_str(&format!("  {v:>7}")),
                None => row.push_str(&format!("  {name:>7}")),
            }
        }
    }
}

/// `2/3`: hosts holding the group's slots against its limit (`2/-` without one).
fn in_flight_cell(plan: Option<&GroupPlan>, upgrading: usize) -> String {
    match plan {
        Some(p) => format!(
            "{}/{}",
            p.in_flight,
            p.limit.map_or("-".into(), |l| l.to_string())
        ),
        None => upgrading.to_string(),
    }
}

/// Why the group admits no one now ("" when it admits, or is done).
fn first_wait(p: &GroupPlan) -> String {
    use jio_common::plan::GroupAction::*;
    match &p.action {
        Done | Admit { .. } | EnableRoles { .. } => String::new(),
        a => crate::render::action(a),
    }
}

/// Failed, lost and blocked hosts, and hosts whose agent is down: one line each
/// (up to a screenful), then the command that retries the failed ones.
fn needs_a_person(i: &Input<'_>, l: Layout) -> Vec<String> {
    let rows: Vec<&HostStatus> = i
        .hosts
        .iter()
        .filter(|h| matches!(h.state, HostState::Failed | HostState::Lost | HostState::Blocked))
        .collect();
    let mut out = host_rows("NEEDS A PERSON", &rows, i, l, "jioctl status --hosts");
    let down: Vec<String> = i
        .hosts
        .iter()
        .filter(|h| matches!(h.state, HostState::Pending | HostState::Upgrading))
        .filter(|h| !i.snap.agents.contains_key(&h.host))
        .map(|h| h.host.to_string())
        .collect();
    if !down.is_empty() {
        if out.is_empty() {
            out.push(String::new());
            out.push("NEEDS A PERSON".into());
        }
        out.extend(fold(
            &format!(
                "{} not upgraded with no live agent (nothing moves them until it is back): {}",
                down.len(),
                names_fit(down, NAMES)
            ),
            2,
            l.width,
        ));
    }
    let (hooks, runs): (Vec<&HostName>, Vec<&HostName>) = rows
        .iter()
        .filter(|h| h.state == HostState::Failed)
        .map(|h| &h.host)
        .partition(|h| i.snap.hook_failure(h).is_some());
    if !runs.is_empty() {
        out.extend(command_lines(&retry_hint(&runs), l.width));
    }
    if !hooks.is_empty() {
        let hint = crate::render::hook_hint(hooks.iter().map(|h| h.to_string()).collect());
        out.extend(fold(&hint, 2, l.width));
    }
    out
}

/// `to retry: jioctl retry a b c` as one line when it fits, else the command on
/// lines of its own (never folded: a person pastes it).
fn command_lines(hint: &str, w: Option<usize>) -> Vec<String> {
    let Some((say, cmd)) = hint
        .split_once(": ")
        .filter(|_| w.is_some_and(|w| width(hint) > w))
    else {
        return vec![hint.to_string()];
    };
    let mut out = vec![format!("{say}:")];
    match cmd.strip_prefix("jioctl retry ") {
        Some(hosts) if !hosts.starts_with("--") => {
            out.extend(hosts.split(' ').map(|h| format!("  jioctl retry {h}")));
        }
        _ => out.push(format!("  {cmd}")),
    }
    out
}

/// Hosts in flight and soaking, one line each.
fn in_flight(i: &Input<'_>, l: Layout) -> Vec<String> {
    let rows: Vec<&HostStatus> = i
        .hosts
        .iter()
        .filter(|h| {
            h.state == HostState::Upgrading
                || i.reasons
                    .get(&h.host)
                    .is_some_and(|r| r.code == ReasonCode::Soaking)
        })
        .collect();
    host_rows("IN FLIGHT", &rows, i, l, "jioctl status --hosts")
}

/// A titled section: a row per host (HOST ROLE STATE REASON, the reason folded
/// to the width) when there are few, or with `--hosts`; else the hosts grouped
/// by group, state and reason, each group once with a count and a few names.
fn host_rows(title: &str, rows: &[&HostStatus], i: &Input<'_>, l: Layout, more: &str) -> Vec<String> {
    if rows.is_empty() {
        return vec![];
    }
    let mut out = vec![String::new(), format!("{title} ({})", rows.len())];
    if rows.len() <= ALONE || l.wide {
        let hw = rows
            .iter()
            .map(|h| width(h.host.as_str()))
            .max()
            .unwrap_or(4)
            .max(4);
        let rw = rows
            .iter()
            .map(|h| width(h.role.as_str()))
            .max()
            .unwrap_or(4)
            .max(4);
        for h in rows {
            let lead = format!(
                "{:<hw$}  {:<rw$}  {:<9}  ",
                h.host.as_str(),
                h.role.as_str(),
                state_of(i, h)
            );
            out.extend(lead_fold(&lead, &reason_of(i, h), l.width));
        }
        return out;
    }
    let mut by: BTreeMap<(String, &str, String), Vec<&HostName>> = BTreeMap::new();
    for h in rows {
        // A log link names the host: the same failure groups without it.
        let why = shared_reason(h, &reason_of(i, h));
        by.entry((group_name(i, h), state_of(i, h), why))
            .or_default()
            .push(&h.host);
    }
    out.extend(grouped(
        by.into_iter()
            .map(|((g, st, why), hs)| (format!("{st} in {g}"), why, hs))
            .collect(),
        GROUPS,
        l,
        more,
    ));
    out
}

/// A host's reason as hosts share it (`render::shared_reason`).
fn shared_reason(h: &HostStatus, why: &str) -> String {
    crate::render::shared_reason(h.host.as_str(), why)
}

fn state_of(i: &Input<'_>, h: &HostStatus) -> &'static str {
    match i.reasons.get(&h.host) {
        Some(r) if r.code == ReasonCode::Soaking => "soaking",
        _ => h.state.as_str(),
    }
}

fn reason_of(i: &Input<'_>, h: &HostStatus) -> String {
    i.reasons
        .get(&h.host)
        .map_or_else(|| h.reason.clone().unwrap_or_default(), |r| r.text.clone())
}

/// Lines of `N <what>: <why> (a, b, c +N more)`, the largest first, at most `max`
/// of them and then how many hosts and reasons were left out and where to see them.
fn grouped(
    mut groups: Vec<(String, String, Vec<&HostName>)>,
    max: usize,
    l: Layout,
    more: &str,
) -> Vec<String> {
    groups.sort_by(|a, b| {
        b.2.len()
            .cmp(&a.2.len())
            .then_with(|| (&a.0, &a.1).cmp(&(&b.0, &b.1)))
    });
    let shown = if l.wide {
        groups.len()
    } else {
        groups.len().min(max)
    };
    let mut out = Vec::new();
    for (what, why, hosts) in &groups[..shown] {
        let names = names_fit(hosts.iter().map(|h| h.to_string()), NAMES);
        let why = if why.is_empty() { "-" } else { why };
        out.extend(fold(
            &format!("{} {what}: {why} ({names})", hosts.len()),
            2,
            l.width,
        ));
    }
    if groups.len() > shown {
        let left: usize = groups[shown..].iter().map(|g| g.2.len()).sum();
        out.push(format!(
            "+{left} more host(s) for {} other reason(s) ({more} lists them)",
            groups.len() - shown
        ));
    }
    out
}

/// Pending hosts grouped by group and reason, the largest first:
/// `398 pending in compute: waiting for controller (compute1, compute2 +396 more)`.
fn waiting(i: &Input<'_>, l: Layout) -> Vec<String> {
    let mut by: BTreeMap<(String, String), Vec<&HostName>> = BTreeMap::new();
    for h in i.hosts.iter().filter(|h| h.state == HostState::Pending) {
        by.entry((group_name(i, h), shared_reason(h, &reason_of(i, h))))
            .or_default()
            .push(&h.host);
    }
    if by.is_empty() {
        return vec![];
    }
    let total: usize = by.values().map(Vec::len).sum();
    let mut out = vec![String::new(), format!("PENDING ({total})")];
    let groups = by
        .into_iter()
        .map(|((g, why), hs)| (format!("pending in {g}"), why, hs))
        .collect();
    out.extend(grouped(groups, REASONS, l, "jioctl status --hosts"));
    out
}

/// `--hosts`: every host, one line each.
fn every_host(i: &Input<'_>, l: Layout) -> Vec<String> {
    let all: Vec<&HostStatus> = i.hosts.iter().collect();
    host_rows("EVERY HOST", &all, i, l, "")
}

/// The display width of `s` (in characters).
pub fn width(s: &str) -> usize {
    s.chars().count()
}

/// `s` cut to `w` characters with `…` (whole without a width).
pub fn cut(s: &str, w: Option<usize>) -> String {
    match w {
        Some(w) if width(s) > w => {
            let mut t: String = s.chars().take(w.saturating_sub(1)).collect();
            t.push('…');
            t
        }
        _ => s.to_string(),
    }
}

/// `text` folded at spaces to `w`, continuation lines indented by `indent`.
pub fn fold(text: &str, indent: usize, w: Option<usize>) -> Vec<String> {
    wrap("", text, indent, w)
}

/// `lead` then `text`, folded so that every line fits `w`, each continuation line
/// indented to where `text` began (at most half the width).
pub fn lead_fold(lead: &str, text: &str, w: Option<usize>) -> Vec<String> {
    match w {
        // A lead wider than half the line (long host and role names): the lead on
        // its own line, cut to fit, and the text below it.
        Some(w) if width(lead) + width(text) > w && width(lead) > w / 2 => {
            let mut out = vec![cut(lead.trim_end(), Some(w))];
            out.extend(wrap("    ", text, 4, Some(w)));
            out
        }
        _ => wrap(lead, text, width(lead), w),
    }
}

/// `lead` then `text` folded at spaces: the first line fits `w` with `lead`, the
/// others with `hang` spaces before them. A word longer than a line (a URL) is cut
/// into pieces. Without a width, one line.
pub fn wrap(lead: &str, text: &str, hang: usize, w: Option<usize>) -> Vec<String> {
    let Some(w) = w.filter(|w| width(lead) + width(text) > *w) else {
        return vec![format!("{lead}{text}")];
    };
    let room = |n: usize| {
        if n == 0 {
            w.saturating_sub(width(lead)).max(1)
        } else {
            w.saturating_sub(hang).max(1)
        }
    };
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !cur.is_empty() && width(&cur) + 1 + width(word) > room(lines.len()) {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
        while width(&cur) > room(lines.len()) {
            let r = room(lines.len());
            lines.push(cur.chars().take(r).collect());
            cur = cur.chars().skip(r).collect();
        }
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
        .into_iter()
        .enumerate()
        .map(|(n, t)| {
            if n == 0 {
                format!("{lead}{t}")
            } else {
                format!("{}{t}", " ".repeat(hang))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use jio_common::fleet::{self, Snapshot};
    use jio_common::keys::Schema;
    use jio_common::store::KeyValue;

    fn kv(key: &str, value: &str) -> KeyValue {
        let key = jio_common::keys::Key::new(key).unwrap();
        KeyValue::from_bytes(key, value.as_bytes().to_vec(), 1, 1, 1, None)
    }

    /// `n` hosts: 3 controllers upgraded to v2; computes with 2 upgrading, 1
    /// failed, 1 whose agent is down, a tenth upgraded, the rest pending.
    fn fleet_of(n: usize) -> Snapshot {
        let mut kvs = vec![
            kv("/current_version", "v2"),
            kv("/config_state/enable_puppet/global", "false"),
        ];
        let reg =
            |role: &str| format!(r#"{{"role":"{role}","agent_version":"1","addresses":[],"first_seen":1}}"#);
        let agent = r#"{"state":"idle","version":"v1","since":1,"pid":1}"#;
        for i in 1..=n {
            let (h, role) = if i <= 3 {
                (format!("controller{i}"), "controller")
            } else {
                (format!("compute{}", i - 3), "compute")
            };
            kvs.push(kv(&format!("/hosts/{h}"), &reg(role)));
            if i != 8 {
                kvs.push(kv(&format!("/agents/{h}"), agent));
            }
            if i <= 3 || (i > 10 && i % 10 == 0) {
                kvs.push(kv(&format!("/running/versions/v2/{h}"), "1"));
            } else if i == 4 || i == 5 {
                kvs.push(kv(&format!("/config_state/enable_puppet/host/{h}"), "true"));
            } else if i == 6 {
                kvs.push(kv(
                    &format!("/status/configured/failure/v2/{h}"),
                    "puppet exited 4: some resources failed",
                ));
            }
        }
        Snapshot::from_kvs(&Schema::default(), &kvs)
    }

    fn render(snap: &Snapshot, width: Option<usize>) -> Vec<String> {
        let hosts = fleet::classify(snap);
        let adm = crate::status::admission_of(snap, &hosts, 1_000);
        let text = crate::status::to_text(
            snap,
            &hosts,
            &adm,
            "etcd://127.0.0.1:2379",
            Layout { width, wide: false },
        );
        text.lines().map(String::from).collect()
    }

    #[test]
    fn the_view_fits_80_columns_and_a_screen_names_who_needs_a_person_at_any_size() {
        for n in [10, 500, 10_000] {
            let snap = fleet_of(n);
            let lines = render(&snap, Some(80));
            let all = lines.join("\n");
            for l in &lines {
                assert!(width(l) <= 80, "{n} hosts: a line wider than 80: {l:?}\n{all}");
            }
            // The failed host, its retry and the hosts in flight come before
            // the pending ones, on the first screen.
            let screen = lines[..lines.len().min(23)].join("\n");
            for want in [
                "compute3  compute  failed",
                "to retry: jioctl retry compute3",
                "compute1  compute  upgrading",
                "compute2  compute  upgrading",
                "no live agent",
            ] {
                assert!(
                    screen.contains(want),
                    "{n} hosts: {want:?} not on the first screen:\n{screen}"
                );
            }
            // Each pending reason once: no line repeated.
            let pending: Vec<&String> = lines.iter().filter(|l| l.contains(" pending in ")).collect();
            let unique: std::collections::BTreeSet<&&String> = pending.iter().collect();
            assert_eq!(unique.len(), pending.len(), "{all}");
            assert!(pending.len() <= REASONS + 1, "{all}");
            // The counts add up to the fleet.
            let mut total = 0;
            for l in lines
                .iter()
                .skip_while(|l| !l.starts_with("GROUP"))
                .skip(1)
                .take_while(|l| !l.is_empty())
            {
                let cols: Vec<&str> = l.split_whitespace().collect();
                total += cols[1].split('/').nth(1).unwrap().parse::<usize>().unwrap();
            }
            assert_eq!(total, n, "{all}");
            // The pending hosts are all counted in the grouped lines.
            let counted: usize = pending
                .iter()
                .map(|l| l.split_whitespace().next().unwrap().parse::<usize>().unwrap())
                .sum();
            let want = fleet::classify(&snap)
                .iter()
                .filter(|h| h.state == HostState::Pending)
                .count();
            assert_eq!(counted, want, "{all}");
        }
    }

    #[test]
    #[ignore = "prints the view"]
    fn show() {
        println!("{}", render(&fleet_of(500), Some(80)).join("\n"));
    }

    #[test]
    fn a_pipe_gets_whole_lines_and_wide_lists_every_host_in_natural_order() {
        let snap = fleet_of(30);
        let hosts = fleet::classify(&snap);
        let adm = crate::status::admission_of(&snap, &hosts, 1_000);
        let text = crate::status::to_text(
            &snap,
            &hosts,
            &adm,
            "s",
            Layout {
                width: None,
                wide: true,
            },
        );
        let every: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("EVERY HOST"))
            .skip(1)
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(every.len(), 30, "{text}");
        let pos = |h: &str| every.iter().position(|x| *x == h).unwrap();
        assert!(pos("compute2") < pos("compute10"), "{text}");
    }

    #[test]
    fn the_header_names_the_prefix_so_two_fleets_in_one_store_differ() {
        let a = Schema::new("/fleet-a").unwrap();
        assert_eq!(
            crate::status::store_label("etcd://e:2379", &a),
            "etcd://e:2379  prefix: /fleet-a"
        );
        assert_eq!(
            crate::status::store_label("etcd://e:2379", &Schema::default()),
            "etcd://e:2379"
        );
    }

    #[test]
    fn long_names_and_commands_never_wrap_and_a_command_is_never_folded() {
        let lead = format!(
            "{:<40}  {:<33}  failed     ",
            "compute1.rack7.dc2.example.org", "nova-compute-with-local-storage"
        );
        let lines = lead_fold(
            &lead,
            "failed at configured, exit 4: some resources failed",
            Some(80),
        );
        assert!(lines.iter().all(|l| width(l) <= 80), "{lines:#?}");
        assert!(lines[1].starts_with("    failed at configured"), "{lines:#?}");
        let hint = "to retry: jioctl retry compute1.rack7.dc2.example.org compute2.rack7.dc2.example.org";
        assert_eq!(
            command_lines(hint, Some(80)),
            [
                "to retry:",
                "  jioctl retry compute1.rack7.dc2.example.org",
                "  jioctl retry compute2.rack7.dc2.example.org"
            ]
        );
        assert_eq!(
            command_lines("to retry: jioctl retry c3", Some(80)),
            ["to retry: jioctl retry c3"]
        );
        let more = fit_height((0..300).map(|i| i.to_string()).collect(), 24);
        assert!(width(&more[23]) < 60, "{}", more[23]);
    }

    #[test]
    fn folding_keeps_every_word_within_the_width() {
        let text = "failed at puppet, exit 4: Could not find class ::nova::compute::libvirt for compute3.example.org (log: https://swift.example/v1/AUTH_x/logs/compute3/20261128T003100Z-very-long-name.log)";
        let lines = lead_fold("compute3  compute  failed     ", text, Some(80));
        assert!(lines.len() > 1, "{lines:#?}");
        for l in &lines {
            assert!(width(l) <= 80, "{l:?}");
        }
        let back: String = lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
        assert!(back.contains("AUTH_x/logs/compute3"), "{back}");
        assert_eq!(cut("abcdef", Some(4)), "abc…");
        assert_eq!(fit_height((0..30).map(|i| i.to_string()).collect(), 24).len(), 24);
    }
}
