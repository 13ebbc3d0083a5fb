//! The rollout's words for people: each group's action, the plan table, what a pass
//! enabled and what the rollout waits for. Pure text; printing is the caller's.

use std::collections::BTreeMap;

use jio_common::fleet::{HostState, HostStatus};
use jio_common::names::{HostName, Role};
use jio_common::plan::ReasonCode;
use jio_common::plan::{GroupAction, Plan};
use jio_common::rollout::{RolloutRecord, RolloutState};
use serde::Serialize;

/// A group's action as users read it ("enable host cp1, cp2", "at limit (2 of 2 slots
/// held: ...)", ...).
pub fn action(a: &GroupAction) -> String {
    let list = |xs: &mut dyn Iterator<Item = &str>| xs.collect::<Vec<_>>().join(", ");
    match a {
        GroupAction::Done => "nothing pending".into(),
        GroupAction::StoppedOnFailure { failed, max_failures } => {
            format!("stopped: {failed} failed host(s), more than max_failures {max_failures}")
        }
        GroupAction::Wait { on } => format!("waiting for {}", list(&mut on.iter().map(String::as_str))),
        GroupAction::EnableRoles { roles } => {
            format!("enable role {}", list(&mut roles.iter().map(Role::as_str)))
        }
        GroupAction::Admit { hosts } => {
            format!("enable host {}", list(&mut hosts.iter().map(|h| h.as_str())))
        }
        GroupAction::Frozen => "frozen (limit 0)".into(),
        GroupAction::Full { in_flight, limit } => {
            format!("at limit ({in_flight} of {limit} slots held: in flight, failed, lost or soaking)")
        }
        GroupAction::Paused => "paused".into(),
        GroupAction::OutsideWindow { opens_at } => match opens_at {
            Some(t) => format!("outside its window (opens at {})", jio_common::plan::when(*t)),
            None => "outside its window".into(),
        },
        GroupAction::Canary { canaries, soaked_at } => {
            format!(
                "canary phase ({canaries} canar{} out): {}",
                if *canaries == 1 { "y" } else { "ies" },
                match soaked_at {
                    Some(t) => format!(
                        "the canaries soak until {}, then the rest is admitted",
                        jio_common::plan::when(*t)
                    ),
                    None => "waits for the canaries to finish healthy, then for a promotion (`jioctl rollout promote`, or canary_soak)".into(),
                }
            )
        }
        GroupAction::FleetCap { in_flight, cap } => {
            format!("fleet cap reached ({in_flight} of {cap} in flight)")
        }
        GroupAction::NoneAdmissible => "every pending host is held or lost (never admitted)".into(),
    }
}

/// The plan as `--json` prints it: the planner's plan, field for field, with each
/// group's action as its text.
#[derive(Serialize)]
pub struct PlanJson<'a> {
    enable_roles: &'a [Role],
    clear_host_keys: &'a [HostName],
    enable_hosts: &'a [HostName],
    groups: Vec<GroupJson<'a>>,
    stopped_on_failures: bool,
}

#[derive(Serialize)]
struct GroupJson<'a> {
    group: &'a str,
    limit: Option<u64>,
    upgraded: usize,
    in_flight: usize,
    pending: usize,
    #[serde(skip_serializing_if = "is_zero")]
    blocked: usize,
    action: String,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

pub fn plan_json(plan: &Plan) -> PlanJson<'_> {
    PlanJson {
        enable_roles: &plan.enable_roles,
        clear_host_keys: &plan.clear_host_keys,
        enable_hosts: &plan.enable_hosts,
        groups: plan
            .groups
            .iter()
            .map(|g| GroupJson {
                group: &g.group,
                limit: g.limit,
                upgraded: g.upgraded,
                in_flight: g.in_flight,
                pending: g.pending,
                blocked: g.blocked,
                action: action(&g.action),
            })
            .collect(),
        stopped_on_failures: plan.stopped_on_failures,
    }
}

/// One line per group.
pub fn plan_table(plan: &Plan) -> String {
    let mut out = String::new();
    for g in &plan.groups {
        let limit = g
            .limit
            .map(|l| l.to_string())
            .unwrap_or_else(|| "unlimited".into());
        let blocked = if g.blocked > 0 {
            format!(" blocked {}", g.blocked)
        } else {
            String::new()
        };
        out.push_str(&format!(
            "  {:<16} limit {:<9} upgraded {:<4} in flight {:<4} pending {:<4}{blocked} -> {}\n",
            g.group,
            limit,
            g.upgraded,
            g.in_flight,
            g.pending,
            action(&g.action)
        ));
    }
    out
}

/// What a plan enables ("enabled role a, b; host c"), when anything.
pub fn admitted(plan: &Plan) -> Option<String> {
    let mut parts = Vec::new();
    if !plan.enable_roles.is_empty() {
        let roles: Vec<&str> = plan.enable_roles.iter().map(Role::as_str).collect();
        parts.push(format!("role {}", roles.join(", ")));
    }
    if !plan.enable_hosts.is_empty() {
        let hosts: Vec<&str> = plan.enable_hosts.iter().map(|h| h.as_str()).collect();
        parts.push(format!("host {}", hosts.join(", ")));
    }
    if !plan.permit_reboots.is_empty() {
        let hosts: Vec<&str> = plan.permit_reboots.iter().map(|h| h.as_str()).collect();
        parts.push(format!("the reboot of {} (inside its window)", hosts.join(", ")));
    }
    let mut line = (!parts.is_empty()).then(|| format!("enabled {}", parts.join("; ")));
    let (closed, held): (Vec<&HostName>, Vec<&HostName>) = plan
        .disable_hosts
        .iter()
        .partition(|h| plan.armed_outside_window.contains(h));
    for (hosts, why) in [
        (held, "disabled held host {} (its key was still on)"),
        (
            closed,
            "disarmed host {} (its window closed before its agent started it)",
        ),
    ] {
        if hosts.is_empty() {
            continue;
        }
        let names: Vec<&str> = hosts.iter().map(|h| h.as_str()).collect();
        let off = why.replace("{}", &names.join(", "));
        line = Some(line.map_or(off.clone(), |l| format!("{l}; {off}")));
    }
    line
}

/// At most this many hosts are named per kind in a waiting line.
const NAMED: usize = 8;

/// The first `NAMED` names, and how many more.
pub fn first_names(hosts: &[&HostName]) -> String {
    let mut parts: Vec<&str> = hosts.iter().take(NAMED).map(|h| h.as_str()).collect();
    let more = hosts.len().saturating_sub(NAMED);
    let more = format!("and {more} more");
    if hosts.len() > NAMED {
        parts.push(&more);
    }
    parts.join(", ")
}

fn named(hosts: &[&HostStatus]) -> String {
    let mut parts: Vec<String> = hosts
        .iter()
        .take(NAMED)
        .map(|h| match &h.reason {
            Some(r) => format!("{} ({r})", h.host),
            None => h.host.to_string(),
        })
        .collect();
    if hosts.len() > NAMED {
        parts.push(format!("and {} more", hosts.len() - NAMED));
    }
    parts.join(", ")
}

/// What the rollout waits for, in one line: the hosts that are not done and why.
pub fn waiting_line(hosts: &[HostStatus], plan: &Plan) -> String {
    let of = |st: HostState| -> Vec<&HostStatus> { hosts.iter().filter(|h| h.state == st).collect() };
    let mut parts = Vec::new();
    for (st, what) in [
        (HostState::Upgrading, "upgrading"),
        (HostState::Lost, "lost"),
        (HostState::Blocked, "blocked"),
        (HostState::Failed, "failed"),
    ] {
        let hs = of(st);
        if !hs.is_empty() {
            parts.push(format!("{} {what}: {}", hs.len(), named(&hs)));
        }
    }
    if !plan.soaking.is_empty() {
        parts.push(format!(
            "{} soaking (min_healthy_time): {}",
            plan.soaking.len(),
            jio_common::values::host_list(&plan.soaking)
        ));
    }
    for (code, what) in [
        (ReasonCode::Held, "held"),
        (ReasonCode::Lost, "lost (never admitted)"),
    ] {
        let hs: Vec<&HostStatus> = hosts
            .iter()
            .filter(|h| h.state == HostState::Pending)
            .filter(|h| plan.reasons.get(&h.host).is_some_and(|r| r.code == code))
            .collect();
        if !hs.is_empty() {
            // The names only: each host's own reason would repeat the word.
            let names = names_fit(hs.iter().map(|h| h.host.to_string()), NAMED);
            parts.push(format!("{} {what}: {names}", hs.len()));
        }
    }
    for g in &plan.groups {
        // A group with nothing left to admit whose pending hosts are all held or
        // lost: the parts above name them.
        if g.pending > 0 && !matches!(g.action, GroupAction::Done) {
            parts.push(format!(
                "{} pending in {}: {}",
                g.pending,
                g.group,
                action(&g.action)
            ));
        }
    }
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join("; ")
    }
}

/// `waiting_line`, and when nothing can move without an operator, it says so.
pub fn waiting_line_forever(hosts: &[HostStatus], plan: &Plan) -> String {
    let line = waiting_line(hosts, plan);
    if jio_common::plan::waits_forever(hosts, plan) {
        format!(
            "{line} — nothing is in flight and nothing can be admitted: it waits until someone acts (free or fix these hosts, change the rules, or `jioctl rollout abort`)"
        )
    } else {
        line
    }
}

/// The hosts that hold a rollout and why (for its `stuck` record): every host not
/// done, with its state and reason, or for a pending host its group's action.
pub fn holding(
    hosts: &[HostStatus],
    plan: &Plan,
    group_of: &BTreeMap<Role, String>,
) -> BTreeMap<String, String> {
    let action_of = |h: &HostStatus| {
        let g = group_of
            .get(&h.role)
            .cloned()
            .unwrap_or_else(|| h.role.to_string());
        plan.groups
            .iter()
            .find(|p| p.group == g)
            .map(|p| format!("pending in {g}: {}", action(&p.action)))
            .unwrap_or_else(|| "pending".into())
    };
    hosts
        .iter()
        .filter(|h| !matches!(h.state, HostState::Upgraded | HostState::Failed))
        .map(|h| {
            let why = match (h.state, &h.reason) {
                (HostState::Pending, _) => plan
                    .reasons
                    .get(&h.host)
                    .filter(|r| r.code != ReasonCode::Admitted)
                    .map(|r| r.text.clone())
                    .unwrap_or_else(|| action_of(h)),
                (st, Some(r)) => format!("{}: {r}", st.as_str()),
                (st, None) => st.as_str().to_string(),
            };
            (h.host.to_string(), why)
        })
        .collect()
}

/// What happens to the hosts in flight when admission stops: `n` of them finish
/// their run (said right for none and for one).
pub fn in_flight_finish(n: usize) -> String {
    match n {
        0 => "no host is in flight".into(),
        1 => "the 1 host in flight finishes its run".into(),
        n => format!("the {n} hosts in flight finish their run"),
    }
}

/// A paused rollout, in one line.
pub fn paused_line(r: &RolloutRecord, in_flight: usize) -> String {
    let RolloutState::Paused { reason, by, until } = &r.state else {
        return format!("rollout {} is {}", r.id, r.state.name());
    };
    format!(
        "rollout {} is paused by {by}{}{}: nothing new is admitted, {}; `jioctl rollout resume` continues it",
        r.id,
        reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default(),
        until
            .map(|t| format!(", until {}", jio_common::time::utc_display(t)))
            .unwrap_or_default(),
        in_flight_finish(in_flight)
    )
}

/// A composable rollout's stages and finalize step, one line each.
pub fn stages(c: &jio_common::compose::Composed) -> String {
    let mut out = String::new();
    for s in &c.stages {
        let roles: Vec<&str> = s.roles.iter().map(Role::as_str).collect();
        out.push_str(&format!(
            "stage {} ({}): {}",
            s.name,
            roles.join(", "),
            s.state.replace('_', " ")
        ));
        if let Some(p) = &s.phase {
            out.push_str(&format!(", phase {p}"));
            if let (Some(done), Some(of)) = (s.finished, s.taking_part) {
                out.push_str(&format!(": {done}/{of} hosts finished"));
            }
        }
        if !s.left_behind.is_empty() {
            out.push_str(&format!(
                "; left behind: {}",
                s.left_behind
                    .keys()
                    .map(|h| h.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out.push('\n');
    }
    let f = &c.finalize;
    if f.state != "none" {
        out.push_str(&format!("finalize: {}", f.state));
        if let Some(h) = &f.host {
            out.push_str(&format!(" on {h}"));
        }
        if !f.services.is_empty() {
            out.push_str(&format!(
                " ({})",
                f.services
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if let Some(r) = &f.reason {
            out.push_str(&format!(": {r}"));
        }
        out.push('\n');
    }
    out
}

/// Where a composable rollout stopped on failures, and what did not run after it.
pub fn stopped_at(c: &jio_common::compose::Composed) -> Option<String> {
    let at = c
        .stages
        .iter()
        .position(|s| s.state == "running" || s.state == "blocked")?;
    let st = &c.stages[at];
    let mut after: Vec<String> = Vec::new();
    if let Some(p) = &st.phase {
        let i = st.phases.iter().position(|x| x == p).map_or(0, |i| i + 1);
        after.extend(st.phases[i..].iter().map(|p| format!("{p} of stage {}", st.name)));
    }
    after.extend(c.stages[at + 1..].iter().map(|s| format!("stage {}", s.name)));
    if c.finalize.state != "none" {
        after.push("finalize".into());
    }
    Some(format!(
        "stopped in stage {}{}; not run: {}",
        st.name,
        st.phase
            .as_ref()
            .map(|p| format!(" during phase {p}"))
            .unwrap_or_default(),
        if after.is_empty() {
            "nothing".into()
        } else {
            after.join(", ")
        }
    ))
}

/// What a composable rollout waits for, in one line.
pub fn compose_waiting(c: &jio_common::compose::Composed) -> String {
    let mut parts: Vec<String> = c
        .stages
        .iter()
        .filter(|s| s.state == "running" || s.state == "blocked")
        .map(|s| {
            format!(
                "stage {} {}{}",
                s.name,
                s.phase
                    .as_ref()
                    .map_or_else(|| s.state.to_string(), |p| format!("phase {p}")),
                match (s.finished, s.taking_part) {
                    (Some(d), Some(of)) => format!(" ({d}/{of} finished)"),
                    _ => String::new(),
                }
            )
        })
        .collect();
    if c.stages.iter().all(|s| s.state == "done") {
        parts.push(format!(
            "finalize {}{}",
            c.finalize.state,
            c.finalize
                .reason
                .as_ref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ));
    }
    let line = waiting_line(&c.hosts, &c.plan);
    if line != "nothing" {
        parts.push(line);
    }
    let blocked: Vec<String> = c
        .plan
        .reasons
        .iter()
        .filter(|(_, r)| r.code == ReasonCode::Blocked)
        .map(|(h, r)| format!("{h} ({})", r.text.strip_prefix("blocked: ").unwrap_or(&r.text)))
        .collect();
    if !blocked.is_empty() {
        parts.push(format!("blocked: {}", blocked.join(", ")));
    }
    if parts.is_empty() {
        "nothing".into()
    } else {
        parts.join("; ")
    }
}

/// `names` joined with ", " in at most `room` characters: as many as fit, then
/// `+N more` for the rest (alone when no name fits; "" when not even that does).
pub fn fit_names(names: &[String], room: usize) -> String {
    let more = |k: usize| match names.len() - k {
        0 => 0,
        rest => format!("+{rest} more").len() + usize::from(k > 0),
    };
    let (mut k, mut used) = (0, 0);
    while k < names.len() {
        let next = used + usize::from(k > 0) * 2 + names[k].chars().count();
        if next + more(k + 1) > room {
            break;
        }
        (k, used) = (k + 1, next);
    }
    let mut out = names[..k].join(", ");
    if k < names.len() {
        let tail = format!("+{} more", names.len() - k);
        if used + more(k) > room {
            return String::new();
        }
        if k > 0 {
            out.push(' ');
        }
        out.push_str(&tail);
    }
    out
}

/// `text` folded at spaces into lines of at most `width` characters, the lines
/// after the first indented by `indent` spaces; a word longer than a line is cut
/// into pieces (nothing is dropped).
pub fn fold(text: &str, width: usize, indent: usize) -> Vec<String> {
    // An indented text keeps its indent, and its next lines go further in.
    let lead = text.len() - text.trim_start_matches(' ').len();
    let indent = if lead > 0 { lead + 2 } else { indent };
    let width = width.max(indent + 8);
    let mut lines = vec![" ".repeat(lead)];
    for word in text[lead..].split(' ') {
        let mut word: Vec<char> = word.chars().collect();
        loop {
            let at = if lines.len() == 1 { lead } else { indent };
            let line = lines.last_mut().expect("one line at least");
            let len = line.chars().count();
            let start = len == at;
            let need = word.len() + usize::from(!start);
            if len + need <= width {
                if !start {
                    line.push(' ');
                }
                line.extend(word.iter());
                break;
            }
            if start {
                // Longer than a whole line: cut it, after its last `/` that fits
                // when it has one (a path or a link reads on).
                let fits = width - len;
                let at = word[..fits].iter().rposition(|c| *c == '/').filter(|i| *i > 0);
                line.extend(word.drain(..at.map_or(fits, |i| i + 1)));
            }
            lines.push(" ".repeat(indent));
        }
    }
    lines
}

/// A log line as the tracing formatter writes it (time, level, message; colours
/// or not) as the words of a note: `warning: cannot renew ...`.
pub fn log_note(raw: &str) -> String {
    let plain = strip_ansi(raw);
    let line = plain.trim();
    let Some((stamp, after)) = line.split_once(' ') else {
        return line.to_string();
    };
    if !(stamp.ends_with('Z') && stamp.contains('T')) {
        return line.to_string();
    }
    let (level, text) = after
        .trim_start()
        .split_once(' ')
        .unwrap_or((after.trim_start(), ""));
    let what = match level {
        "ERROR" => "error",
        "WARN" => "warning",
        "INFO" => "info",
        "DEBUG" => "debug",
        _ => "trace",
    };
    format!("{what}: {}", text.trim_start())
}

/// `s` without its terminal escape sequences (CSI: ESC [ ... final byte).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
        } else if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {

    #[test]
    fn hosts_in_flight_are_counted_in_words_that_fit_the_count() {
        assert_eq!(in_flight_finish(0), "no host is in flight");
        assert_eq!(in_flight_finish(1), "the 1 host in flight finishes its run");
        assert_eq!(in_flight_finish(3), "the 3 hosts in flight finish their run");
    }

    use super::*;

    #[test]
    fn the_plan_json_keeps_its_shape_and_order() {
        let cp1 = HostName::new("cp1").unwrap();
        let plan = Plan {
            enable_hosts: vec![cp1.clone()],
            groups: vec![jio_common::plan::GroupPlan {
                group: "compute".into(),
                limit: Some(1),
                upgraded: 0,
                in_flight: 0,
                pending: 2,
                blocked: 0,
                held: 0,
                action: GroupAction::Admit { hosts: vec![cp1] },
            }],
            ..Plan::default()
        };
        assert_eq!(
            serde_json::to_string(&plan_json(&plan)).unwrap(),
            r#"{"enable_roles":[],"clear_host_keys":[],"enable_hosts":["cp1"],"groups":[{"group":"compute","limit":1,"upgraded":0,"in_flight":0,"pending":2,"action":"enable host cp1"}],"stopped_on_failures":false}"#
        );
    }

    #[test]
    fn actions_read_as_before() {
        let h = |s: &str| HostName::new(s).unwrap();
        let r = |s: &str| Role::new(s).unwrap();
        let cases = [
            (GroupAction::Done, "nothing pending"),
            (
                GroupAction::StoppedOnFailure {
                    failed: 2,
                    max_failures: 1,
                },
                "stopped: 2 failed host(s), more than max_failures 1",
            ),
            (
                GroupAction::Wait {
                    on: vec!["controller".into(), "db".into()],
                },
                "waiting for controller, db",
            ),
            (
                GroupAction::EnableRoles {
                    roles: vec![r("stmon"), r("stmonleader")],
                },
                "enable role stmon, stmonleader",
            ),
            (
                GroupAction::Admit {
                    hosts: vec![h("cp1"), h("cp2")],
                },
                "enable host cp1, cp2",
            ),
            (GroupAction::Frozen, "frozen (limit 0)"),
            (
                GroupAction::Full {
                    in_flight: 3,
                    limit: 3,
                },
                "at limit (3 of 3 slots held: in flight, failed, lost or soaking)",
            ),
        ];
        for (a, want) in cases {
            assert_eq!(action(&a), want);
        }
    }
}

/// Up to `n` names, then `+N more` (`compute1, compute2 +7 more`).
pub fn names_fit(names: impl IntoIterator<Item = String>, n: usize) -> String {
    let mut shown = Vec::new();
    let mut more = 0;
    for name in names {
        if shown.len() < n {
            shown.push(name);
        } else {
            more += 1;
        }
    }
    let mut s = shown.join(", ");
    if more > 0 {
        s.push_str(&format!(" +{more} more"));
    }
    s
}

/// Failed hosts and why, for a person: one line each (`  compute3: why`) when there
/// are up to 6, else one line per reason (the host's own name and log link aside)
/// with a count and the first names, the largest first. In natural host order.
pub fn failure_lines<'a>(failures: impl IntoIterator<Item = (&'a String, &'a String)>) -> Vec<String> {
    let mut all: Vec<(&String, &String)> = failures.into_iter().collect();
    all.sort_by(|a, b| jio_common::names::natural_cmp(a.0, b.0));
    if all.len() <= 6 {
        return all.iter().map(|(h, why)| format!("  {h}: {why}")).collect();
    }
    let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (h, why) in &all {
        by.entry(shared_reason(h, why)).or_default().push(h.to_string());
    }
    let mut groups: Vec<(String, Vec<String>)> = by.into_iter().collect();
    groups.sort_by_key(|g| std::cmp::Reverse(g.1.len()));
    groups
        .into_iter()
        .map(|(why, hosts)| format!("  {} host(s): {why} ({})", hosts.len(), names_fit(hosts, 3)))
        .collect()
}

/// A host's reason as hosts share it: its log link (which names the host) left
/// out, and its own name, where it stands as a whole name, written `<host>`
/// (`no /agents/<host> lease`; never the `a` inside `agent`, nor `compute1` inside
/// `compute10`).
pub fn shared_reason(host: &str, why: &str) -> String {
    let why = why.split(" (log: ").next().unwrap_or_default();
    let part_of_name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_');
    // A dot ends a name unless a name part follows it (`db1.example.org`).
    let continues = |after: &str| {
        after.chars().next().is_some_and(part_of_name)
            || (after.starts_with('.') && after[1..].chars().next().is_some_and(part_of_name))
    };
    let mut out = String::with_capacity(why.len());
    let mut rest = why;
    while let Some(i) = rest.find(host) {
        let (before, after) = (&rest[..i], &rest[i + host.len()..]);
        let whole = !before
            .chars()
            .next_back()
            .is_some_and(|c| part_of_name(c) || c == '.')
            && !continues(after);
        out.push_str(before);
        out.push_str(if whole { "<host>" } else { host });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The hosts a retry helps and the line that says how, and for hosts whose
/// maintenance hook failed (a retry would run them undrained) what does.
pub fn retry_lines(failures: &[(&String, &String)]) -> Vec<String> {
    let hook = |why: &str| why.starts_with("before hook failed") || why.starts_with("after hook failed");
    let mut runs: Vec<&String> = failures
        .iter()
        .filter(|(_, w)| !hook(w))
        .map(|(h, _)| *h)
        .collect();
    let mut hooks: Vec<String> = failures
        .iter()
        .filter(|(_, w)| hook(w))
        .map(|(h, _)| h.to_string())
        .collect();
    runs.sort_by(|a, b| jio_common::names::natural_cmp(a, b));
    hooks.sort_by(|a, b| jio_common::names::natural_cmp(a, b));
    let mut out = Vec::new();
    if !runs.is_empty() {
        out.push(retry_hint(&runs));
    }
    if !hooks.is_empty() {
        out.push(hook_hint(hooks));
    }
    out
}

/// What recovers hosts whose maintenance hook failed.
pub fn hook_hint(hosts: Vec<String>) -> String {
    format!(
        "a maintenance hook failed on {}: fix the host, then start a new rollout (`jioctl upgrade VERSION` runs the hooks again; `jioctl retry` would not)",
        names_fit(hosts, 3)
    )
}

/// The command that runs failed hosts again, to end every failure shown to a person
/// (empty without failures).
pub fn retry_hint<H: std::fmt::Display>(failed: &[H]) -> String {
    match failed.len() {
        0 => String::new(),
        1..=3 => format!(
            "to retry: jioctl retry {}",
            failed
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        ),
        n => format!("to retry: jioctl retry --failed (all {n}), or jioctl retry HOST..."),
    }
}

#[cfg(test)]
mod hint_tests {
    use super::*;
    use jio_common::plan::{GroupPlan, Reason};

    fn host(name: &str, state: HostState, reason: Option<&str>) -> HostStatus {
        HostStatus {
            host: HostName::new(name).unwrap(),
            role: Role::new("compute").unwrap(),
            state,
            reason: reason.map(String::from),
        }
    }

    #[test]
    fn a_held_host_is_named_once_and_a_done_group_never_says_nothing_pending() {
        let hosts = [host("compute2", HostState::Pending, Some("held (host compute2)"))];
        let mut plan = Plan::default();
        plan.reasons.insert(
            hosts[0].host.clone(),
            Reason {
                code: ReasonCode::Held,
                text: "held by alice since 00:31".into(),
                at: None,
            },
        );
        plan.groups.push(GroupPlan {
            group: "compute".into(),
            limit: Some(1),
            upgraded: 0,
            in_flight: 0,
            pending: 1,
            blocked: 0,
            held: 1,
            action: GroupAction::Done,
        });
        let line = waiting_line(&hosts, &plan);
        assert_eq!(line, "1 held: compute2");
        assert!(!line.contains("held (held"), "{line}");
        assert!(!line.contains("nothing pending"), "{line}");
    }

    #[test]
    fn only_a_whole_host_name_is_shared_as_host() {
        let cases = [
            (
                "a",
                "in flight: enabled, its agent is about to start",
                "in flight: enabled, its agent is about to start",
            ),
            (
                "compute1",
                "in flight (compute10, compute11)",
                "in flight (compute10, compute11)",
            ),
            (
                "compute1",
                "no /agents/compute1 lease; never admitted",
                "no /agents/<host> lease; never admitted",
            ),
            ("db1", "failed on db1.", "failed on <host>."),
            ("db1", "db1.example.org is down", "db1.example.org is down"),
            ("c3", "exit 4 (log: http://s/c3/log)", "exit 4"),
        ];
        for (host, why, want) in cases {
            assert_eq!(shared_reason(host, why), want, "{host}: {why}");
        }
        let (a, b) = ("c1".to_string(), "c2".to_string());
        let (x, hook) = (
            "configured failed".to_string(),
            "before hook failed (exit 3): nova".to_string(),
        );
        let lines = retry_lines(&[(&a, &x), (&b, &hook)]);
        assert_eq!(lines[0], "to retry: jioctl retry c1");
        assert!(
            lines[1].starts_with("a maintenance hook failed on c2: fix the host"),
            "{lines:?}"
        );
    }

    #[test]
    fn retry_hints_name_the_command_and_never_a_long_list() {
        assert_eq!(retry_hint::<&str>(&[]), "");
        assert_eq!(retry_hint(&["compute3"]), "to retry: jioctl retry compute3");
        assert_eq!(
            retry_hint(&["a1", "a2", "a3", "a4"]),
            "to retry: jioctl retry --failed (all 4), or jioctl retry HOST..."
        );
        assert_eq!(
            names_fit(["a".to_string(), "b".into(), "c".into()], 2),
            "a, b +1 more"
        );
        assert_eq!(names_fit(["a".to_string()], 2), "a");
        let few: Vec<(String, String)> = vec![("c10".into(), "x".into()), ("c2".into(), "y".into())];
        assert_eq!(
            failure_lines(few.iter().map(|(a, b)| (a, b))),
            ["  c2: y", "  c10: x"]
        );
        let many: Vec<(String, String)> = (1..=9)
            .map(|i| {
                (
                    format!("c{i}"),
                    format!("configured failed: exit 4 on c{i} (log: http://s/c{i})"),
                )
            })
            .collect();
        assert_eq!(
            failure_lines(many.iter().map(|(a, b)| (a, b))),
            ["  9 host(s): configured failed: exit 4 on <host> (c1, c2, c3 +6 more)"]
        );
    }
}

#[cfg(test)]
mod fit_tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("compute{i}")).collect()
    }

    #[test]
    fn names_fit_their_room_and_say_how_many_more() {
        let cases: [(usize, usize, &str); 6] = [
            (3, 80, "compute0, compute1, compute2"),
            (3, 28, "compute0, compute1, compute2"),
            (3, 27, "compute0, compute1 +1 more"),
            (3, 10, "+3 more"),
            (3, 6, ""),
            (0, 10, ""),
        ];
        for (n, room, want) in cases {
            assert_eq!(fit_names(&names(n), room), want, "{n} names in {room}");
        }
        // 10,000 names: what is shown and the count add up, within the room.
        let shown = fit_names(&names(10_000), 60);
        assert!(shown.len() <= 60, "{shown}");
        let listed = shown.matches("compute").count();
        let more: usize = shown
            .rsplit('+')
            .next()
            .unwrap()
            .trim_end_matches(" more")
            .parse()
            .unwrap();
        assert_eq!(listed + more, 10_000, "{shown}");
    }

    #[test]
    fn folded_text_keeps_every_word_within_the_width() {
        let text = "the store cannot be reached (dial tcp 127.0.0.1:2379: connection refused); trying again";
        let lines = fold(text, 30, 4);
        assert!(lines.iter().all(|l| l.chars().count() <= 30), "{lines:#?}");
        assert!(lines[1..].iter().all(|l| l.starts_with("    ")), "{lines:#?}");
        let joined: Vec<&str> = lines.iter().flat_map(|l| l.split_whitespace()).collect();
        assert_eq!(joined.join(" "), text);
        let long = "/var/lib/jio-agent/runs/0123456789abcdef0123456789abcdef0123456789abcdef";
        let lines = fold(long, 20, 2);
        assert!(lines.iter().all(|l| l.chars().count() <= 20), "{lines:#?}");
        assert_eq!(lines.iter().map(|l| l.trim()).collect::<String>(), long);
        assert!(lines[0].ends_with('/'), "cut after a slash: {lines:#?}");
        assert_eq!(fold("short", 80, 4), vec!["short".to_string()]);
    }

    #[test]
    fn a_log_line_reads_as_a_note() {
        let cases = [
            (
                "2026-11-28T00:31:12.015944Z  WARN cannot renew the lease key=/locks/rollout\n",
                "warning: cannot renew the lease key=/locks/rollout",
            ),
            (
                "\x1b[2m2026-11-28T00:31:12.015944Z\x1b[0m \x1b[31mERROR\x1b[0m store failed",
                "error: store failed",
            ),
            ("no stamp at all", "no stamp at all"),
        ];
        for (raw, want) in cases {
            assert_eq!(log_note(raw), want, "{raw:?}");
        }
    }
}
