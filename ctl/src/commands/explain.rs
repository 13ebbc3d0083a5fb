//! `jioctl explain HOST`: the whole chain that decides whether the host moves: its
//! state, the gate lookup (host → role → global) and the level that decided, a hold,
//! the active rollout and its state, the rule that blocks it (the planner's reason
//! under the rollout's rules, now), its last run with its outcome and log, and its
//! agent's liveness. Read-only.

use clap::Args;
use jio_common::compose::Composed;
use jio_common::fleet::{self, CurrentRollout, Snapshot};
use jio_common::gate::{Gate, KeyState};
use jio_common::keys::{EnableLevel, HoldTarget};
use jio_common::names::{HostName, Role};
use jio_common::plan::{GroupPlan, when};
use jio_common::values::HoldRecord;
use serde_json::json;

use crate::context::{Access, Context};
use crate::exit::{self, Failure, Outcome};
use crate::status::Admission;

#[derive(Args, Debug)]
pub struct Explain {
    /// The host whose chain of decisions to show
    host: HostName,
}

fn key_text(k: Option<&KeyState>) -> String {
    match k {
        None | Some(KeyState::Unset) => "not set".into(),
        Some(KeyState::Set(b)) => b.to_string(),
        Some(KeyState::Invalid(e)) => format!("invalid ({e})"),
    }
}

impl Explain {
    pub async fn run(self, ctx: &Context) -> Outcome {
        let store = ctx.open(Access::Read).await?;
        let snap = ctx.snapshot(&store).await?;
        let h = &self.host;
        if !snap.hosts().contains(h) && !snap.agents.contains_key(h) {
            return Err(Failure::new(
                exit::FAILED,
                format!(
                    "host {h} is not known in this fleet (no /hosts/{h} record, no running version, no live agent)"
                ),
            ));
        }
        let now = jio_common::time::unix_now();
        let mut lines = explain(&snap, h, now);
        let role = snap.role_of(h);
        let drift =
            crate::drift::Drift::load_of(&store, ctx.schema(), &snap, |x| snap.role_of(x) == role).await;
        let (text, json) = package_lines(&snap, h, &drift);
        lines.text.extend(text);
        if let Some(o) = lines.json.as_object_mut() {
            o.insert("packages".into(), json);
        }
        if ctx.json {
            println!("{}", crate::out::document(lines.json.clone()));
        } else {
            for l in lines.text {
                println!("{l}");
            }
        }
        Ok(())
    }
}

/// The host's installed package set: its digest, what its last run changed,
/// and how it differs from the most common set of its role at its version.
fn package_lines(
    snap: &Snapshot,
    h: &HostName,
    drift: &crate::drift::Drift,
) -> (Vec<String>, serde_json::Value) {
    use jio_common::packages::short_digest;
    let Some((r, p)) = snap
        .results
        .get(h)
        .and_then(|r| r.packages.as_ref().map(|p| (r, p)))
    else {
        return (
            vec!["  packages: no package set recorded (no successful run recorded one)".into()],
            serde_json::Value::Null,
        );
    };
    let mut t = vec![format!(
        "  packages: set {} ({} installed, as of {}; last run to {})",
        short_digest(&p.digest),
        p.count,
        jio_common::time::utc_display(p.at),
        r.version
    )];
    if p.changed_count > 0 {
        t.push(format!(
            "    the run changed {}: {}",
            p.changed_count,
            crate::drift::said(&Ok(p.changed.clone()))
        ));
    }
    let mut json = json!({"digest": p.digest, "count": p.count, "changed": p.changed, "changed_count": p.changed_count, "at": p.at});
    match drift.of_host(h) {
        Some((rd, differs)) => {
            let against = if rd.group.tie() {
                "a set as common as its own (a tie)"
            } else {
                "the most common set"
            };
            t.push(format!(
                "    drifted: differs from {against} of {} at {} ({} host(s), {}): {}",
                rd.role,
                rd.version,
                rd.group.sets[0].1.len(),
                short_digest(&rd.group.common),
                crate::drift::said(differs)
            ));
            json["drift"] = match differs {
                Ok(c) => json!({"common": rd.group.common, "differs": c}),
                Err(e) => json!({"common": rd.group.common, "error": e}),
            };
        }
        None => t.push(format!("    {}", not_drifted(snap, h, r))),
    }
    (t, json)
}

/// Why a host with a set is not drifted: it is compared, or why it is not.
fn not_drifted(snap: &Snapshot, h: &HostName, r: &jio_common::values::HostResult) -> String {
    if !r.ok {
        return format!("not compared: its last run (to {}) did not succeed", r.version);
    }
    if !snap.running.get(h).is_some_and(|v| v.contains(&r.version)) {
        return format!(
            "not compared: it does not run {}, the version of its last run",
            r.version
        );
    }
    let role = snap.role_of(h);
    let peers = crate::drift::recorded(snap)
        .get(&(role.clone(), r.version.clone()))
        .map_or(0, |hs| hs.len().saturating_sub(1));
    if peers == 0 {
        return format!(
            "not compared: no other host of {role} at {} recorded a set",
            r.version
        );
    }
    format!(
        "no drift: the same set as the {peers} other host(s) of {role} at {} that recorded one",
        r.version
    )
}

struct Explained {
    text: Vec<String>,
    json: serde_json::Value,
}

fn explain(snap: &Snapshot, h: &HostName, now: u64) -> Explained {
    let mut t = Vec::new();
    let schema_role = snap.role_of(h);
    let hosts = fleet::classify(snap);
    let status = hosts.iter().find(|s| &s.host == h);
    let adm = crate::status::admission(snap, now);
    let reason = adm.reasons.get(h);
    let state = status.map_or("unknown", |s| s.state.as_str());
    t.push(format!("host {h} (role {schema_role})"));
    if let Some(line) = crate::status::undriven_line(snap) {
        t.push(format!("  {line}"));
    }
    t.push(format!(
        "  state: {state}{}",
        reason.map(|r| format!(" — {}", r.text)).unwrap_or_default()
    ));
    let versions: Vec<String> = snap
        .running
        .get(h)
        .map(|v| v.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    t.push(format!(
        "  desired version: {}; running: {}",
        snap.current
            .as_ref()
            .map_or("(not set)".into(), ToString::to_string),
        if versions.is_empty() {
            "nothing recorded".into()
        } else {
            versions.join(", ")
        }
    ));
    if let Some(c) = &adm.composed {
        composable_lines(&mut t, snap, h, &schema_role, c);
    }
    let gate = snap.gate(h, &schema_role);
    gate_lines(&mut t, snap, h, &schema_role, &gate);
    let hold = snap.hold_of(h, &schema_role);
    hold_lines(&mut t, &hold);
    let rollout = snap.rollout.as_ref();
    rollout_lines(&mut t, rollout);
    // The rule that blocks it (or what moves it).
    let group = adm.plan.as_ref().and_then(|p| {
        p.groups
            .iter()
            .find(|g| g.group == adm_group(snap, h, rollout))
            .cloned()
    });
    group_lines(&mut t, group.as_ref(), &adm);
    last_run_lines(&mut t, snap, h);
    hook_lines(&mut t, snap, h);
    agent_lines(&mut t, snap, h);
    let json = json!({
        "host": h,
        "role": schema_role,
        "state": state,
        "reason": reason,
        "running": versions,
        "gate": gate,
        "hold": hold.as_ref().map(|(t, r)| json!({"target": t.to_string(), "record": r})),
        "rollout": crate::status::rollout_json(snap),
        "group": group,
        "last_run": snap.results.get(h),
        "agent": snap.agents.get(h),
        "desired_version": snap.current,
        "failure_entry": snap.failures.get(h).map(|(step, value)| json!({"step": step.as_str(), "value": value})),
        "run_marker": snap.runs.get(h),
        "hook": snap.hooks.get(h),
        "fleet": adm.plan.as_ref().map(|p| json!({"in_flight": p.fleet_in_flight, "cap": p.fleet_cap})),
    });
    Explained { text: t, json }
}

/// A composable rollout: the host's stage, the phase going on, its catalog.
fn composable_lines(t: &mut Vec<String>, snap: &Snapshot, h: &HostName, schema_role: &Role, c: &Composed) {
    if let Some(st) = c.stages.iter().find(|st| st.roles.contains(schema_role)) {
        t.push(format!(
            "  stage {} (composable rollout): {}{}{}",
            st.name,
            st.state.replace('_', " "),
            st.phase
                .as_ref()
                .map(|p| format!(", phase {p}"))
                .unwrap_or_default(),
            match (st.finished, st.taking_part) {
                (Some(d), Some(of)) => format!(" ({d}/{of} finished)"),
                _ => String::new(),
            }
        ));
        if let Some(why) = st.left_behind.get(h) {
            t.push(format!("    left behind: {why}"));
        }
    }
    if let Some(g) = snap.grants.get(schema_role) {
        t.push(format!(
            "    granted to role {schema_role}: {} ({})",
            g.phase,
            g.services
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    match snap.catalogs.get(h) {
        Some(Ok(cat)) => t.push(format!(
            "    task files ({}): {}",
            cat.dir,
            cat.services
                .iter()
                .map(|(s, st)| {
                    let steps: Vec<String> = st
                        .pre
                        .iter()
                        .map(|k| format!("pre-{k}"))
                        .chain(st.post.iter().map(|k| format!("post-{k}")))
                        .chain(st.finalize.then(|| "finalize".to_string()))
                        .collect();
                    format!("{s} [{}]", steps.join(" "))
                })
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Some(Err(e)) => t.push(format!("    task files: {e}")),
        None => t.push(format!("    task files: none published (/hosts/{h}/services)")),
    }
    if c.finalize.host.as_ref() == Some(h) {
        t.push(format!("    finalize: {} here", c.finalize.state));
    }
}

/// The gate: each enable key, and the one that decides.
fn gate_lines(t: &mut Vec<String>, snap: &Snapshot, h: &HostName, schema_role: &Role, gate: &Gate) {
    t.push("  gate (the most specific key that is set decides):".into());
    let levels = [
        ("host", EnableLevel::Host(h.clone()), snap.host_keys.get(h)),
        (
            "role",
            EnableLevel::Role(schema_role.clone()),
            snap.role_keys.get(schema_role),
        ),
        ("global", EnableLevel::Global, Some(&snap.global)),
    ];
    for (name, level, k) in &levels {
        let decided = gate.level.as_str() == *name;
        t.push(format!(
            "    {name:<6} {:<48} {}{}",
            match level {
                EnableLevel::Host(h) => format!("/config_state/enable_puppet/host/{h}"),
                EnableLevel::Role(r) => format!("/config_state/enable_puppet/role/{r}"),
                EnableLevel::Global => "/config_state/enable_puppet/global".into(),
            },
            key_text(*k),
            if decided { "  <- decides" } else { "" }
        ));
    }
    t.push(format!(
        "    => {}{}",
        if gate.enabled { "enabled" } else { "not enabled" },
        gate.blocked
            .as_ref()
            .map(|b| format!(" (blocked: {b})"))
            .unwrap_or_default()
    ));
}

/// Its maintenance hook: the one of the active rollout's slot, or the last one.
fn hook_lines(t: &mut Vec<String>, snap: &Snapshot, h: &HostName) {
    if snap.hooks_invalid.contains(h) {
        t.push(format!(
            "  maintenance hook: /hooks/{h} cannot be read; the host keeps its slot until it is fixed or deleted"
        ));
        return;
    }
    let Some(rec) = snap.hooks.get(h) else {
        return;
    };
    let current = snap.active_rollout_id() == Some(rec.rollout.as_str());
    let mut line = format!(
        "  maintenance hook: {} (rollout {}{})",
        rec.describe(),
        rec.rollout,
        if current { "" } else { ", not the active one" }
    );
    if rec.state != jio_common::hook_record::HookState::Failed
        && let Some(log) = &rec.log
    {
        line.push_str(&format!("; log: {log}"));
    }
    if let Some(stage) = snap.hook_stage(h) {
        line.push_str(&format!(
            "\n    {}",
            stage.describe(snap.gate(h, &snap.role_of(h)).enabled)
        ));
    } else if !current && rec.hook == jio_common::hook_record::HookKind::Before {
        line.push_str("\n    its rollout ended before its after hook ran: put the host back by hand if its before hook drained it (the next rollout runs both again)");
    }
    t.push(line);
}

/// A hold on the host or its role.
fn hold_lines(t: &mut Vec<String>, hold: &Option<(HoldTarget, Option<&HoldRecord>)>) {
    match hold {
        Some((target, Some(rec))) => t.push(format!(
            "  hold: {target} held by {}{} since {}",
            rec.by,
            rec.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default(),
            when(rec.at)
        )),
        Some((target, None)) => t.push(format!(
            "  hold: {target} (its record cannot be read; it still holds)"
        )),
        None => t.push("  hold: none".into()),
    }
}

/// The active rollout.
fn rollout_lines(t: &mut Vec<String>, rollout: Option<&CurrentRollout>) {
    match rollout {
        None => t.push("  rollout: none is active".into()),
        Some(c) => match &c.record {
            Ok(r) => t.push(format!(
                "  rollout: {} to {}, {}{}",
                r.id,
                r.version,
                r.state.name(),
                match (&r.promoted, r.rules.get("canary")) {
                    (_, None) => String::new(),
                    (Some(p), _) => format!(" (promoted by {} at {})", p.by, when(p.at)),
                    (None, Some(_)) => " (canary phase)".into(),
                }
            )),
            Err(e) => t.push(format!("  rollout: {} cannot be used: {e}", c.id)),
        },
    }
}

/// The host's group under the rules, the fleet cap, and a problem with the rules.
fn group_lines(t: &mut Vec<String>, group: Option<&GroupPlan>, adm: &Admission) {
    if let Some(g) = group {
        t.push(format!(
            "  group {}: {} upgraded, {} in flight{}, {} pending; {}",
            g.group,
            g.upgraded,
            g.in_flight,
            g.limit.map(|l| format!(" (limit {l})")).unwrap_or_default(),
            g.pending,
            crate::render::action(&g.action)
        ));
    }
    if let Some(p) = &adm.plan
        && let Some(cap) = p.fleet_cap
    {
        t.push(format!("  fleet: {} in flight (cap {cap})", p.fleet_in_flight));
    }
    if let Some(p) = &adm.problem {
        t.push(format!("  rules: {p}"));
    }
}

/// The last run's result and the failure entry.
fn last_run_lines(t: &mut Vec<String>, snap: &Snapshot, h: &HostName) {
    match snap.results.get(h) {
        Some(r) => {
            t.push(format!(
                "  last run: to {} {} at {} (attempt {}){}",
                r.version,
                if r.ok { "succeeded" } else { "failed" },
                when(r.at),
                r.attempt,
                r.checked_at
                    .map(|c| format!("; last health check passed at {}", when(c)))
                    .unwrap_or_default()
            ));
            if !r.ok {
                t.push(format!(
                    "    step {}{}{}{}{}",
                    r.step.as_deref().unwrap_or("?"),
                    r.service
                        .as_ref()
                        .map(|s| format!(", service {s}"))
                        .unwrap_or_default(),
                    r.task
                        .as_ref()
                        .map(|t| format!(", task {t:?}"))
                        .unwrap_or_default(),
                    r.exit_code.map(|c| format!(", exit {c}")).unwrap_or_default(),
                    r.message.as_ref().map(|m| format!(": {m}")).unwrap_or_default()
                ));
            }
            if let Some(d) = &r.run_dir {
                t.push(format!("    run directory on the host: {d}"));
            }
            if let Some(l) = &r.log {
                t.push(format!("    log: {l}"));
            }
            if let Some(at) = r.retry_at {
                t.push(retry_line(at, snap, h));
            }
        }
        None => t.push("  last run: none recorded (/results/{h} is absent)".replace("{h}", h.as_str())),
    }
    if let Some((step, value)) = snap.failures.get(h) {
        t.push(format!(
            "  failure entry ({}): {}",
            step.as_str(),
            crate::status::describe_entry(value)
        ));
    }
}

/// When the agent tries again: only while the host's gate lets it; otherwise
/// what would move it (the retry command, unless a stop or a hold refuses it).
fn retry_line(at: u64, snap: &Snapshot, h: &HostName) -> String {
    let role = snap.role_of(h);
    if snap.gate(h, &role).enabled && snap.halt.is_none() {
        return format!("    the agent retries at {}", when(at));
    }
    let next = if snap.halt.is_some() {
        "an emergency stop is in force: `jioctl upgrade VERSION` starts a new rollout".to_string()
    } else if let Some((t, _)) = snap.hold_of(h, &role) {
        format!("it is held ({t}): `jioctl release` it, then `jioctl retry {h}`")
    } else if snap.hook_failure(h).is_some() {
        "its maintenance hook failed: fix the host, then `jioctl upgrade VERSION` runs the hooks again".into()
    } else {
        format!("`jioctl retry {h}` retries it")
    };
    format!(
        "    no retry: its gate is off, so the agent does not run (it would have retried at {}); {next}",
        when(at)
    )
}

/// What the agent's record says it does, in words that name the right version:
/// the one it moves to while it runs, the one the host runs while idle or failed.
fn agent_doing(a: &jio_common::values::AgentRecord) -> String {
    use jio_common::values::AgentState::*;
    let v = a.version.as_ref().map_or("-".to_string(), ToString::to_string);
    match a.state {
        Idle => format!("idle, the host runs {v}"),
        Upgrading => format!("upgrading to {v}"),
        Checking => format!("checking the health of {v}"),
        Failed => format!("failed (its last run did not succeed), the host runs {v}"),
        Command => format!("running a fleet command, the host runs {v}"),
        Rebooting => format!("rebooting into {v}"),
    }
}

/// The agent, its clock, and a run marker.
fn agent_lines(t: &mut Vec<String>, snap: &Snapshot, h: &HostName) {
    match snap.agents.get(h) {
        Some(Some(a)) => t.push(format!(
            "  agent: alive (pid {}), {} since {}",
            a.pid,
            agent_doing(a),
            when(a.since)
        )),
        Some(None) => t.push(format!("  agent: alive, but /agents/{h} cannot be read")),
        None if snap.runs.contains_key(h) => t.push(format!(
            "  agent: not alive (no /agents/{h} lease) while its run marker is there: the host is lost in flight and keeps its slot"
        )),
        None => t.push(format!(
            "  agent: not alive (no /agents/{h} lease): the host is lost"
        )),
    }
    if let Some(skew) = snap
        .clocks
        .get(h)
        .and_then(|c| jio_common::values::Skew::of(*c, jio_common::time::unix_now_ms()))
    {
        t.push(format!("  warning: {}", skew.describe()));
    }
    if let Some(run) = snap.runs.get(h) {
        t.push(match run {
            Some(r) => format!(
                "  run marker: a run of {} started at {} and was not yet seen to end",
                r.version.as_ref().map_or("-".into(), ToString::to_string),
                when(r.since)
            ),
            None => format!("  run marker: /runs/{h} cannot be read"),
        });
    }
}

/// The host's group under the active rollout's rules (its role without them).
fn adm_group(snap: &Snapshot, h: &HostName, rollout: Option<&jio_common::fleet::CurrentRollout>) -> String {
    let role = snap.role_of(h);
    let rules = rollout
        .and_then(|c| c.ok())
        .and_then(|r| jio_common::rules::Rules::parse(&r.rules.to_string()).ok());
    let roles = fleet::classify(snap).into_iter().map(|s| s.role).collect();
    rules
        .and_then(|r| r.resolve(&roles).ok())
        .and_then(|r| r.group_of.get(&role).cloned())
        .unwrap_or_else(|| role.to_string())
}
