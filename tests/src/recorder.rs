//! Watches a whole namespace during a rollout and checks, at every revision, that no
//! rolling limit and no role order was ever violated, on its own reading of the raw
//! keys (never the production classification it is meant to check).

use std::collections::{BTreeMap, BTreeSet};

use futures_util::StreamExt as _;
use jio_common::keys::{Key, Schema};
use jio_common::rules::Rules;
use jio_common::store::{DynStore, KeyValue, WatchEvent};
use tokio::task::JoinHandle;

/// What the recorder saw.
#[derive(Debug, Default, Clone)]
pub struct Record {
    /// Revisions checked.
    pub revisions: usize,
    /// Every violation, with the revision where it happened.
    pub violations: Vec<String>,
    /// The most hosts of each group in flight at once.
    pub max_in_flight: BTreeMap<String, usize>,
    /// The order in which hosts were first seen in flight.
    pub started: Vec<String>,
    /// The most hosts in flight across the fleet at once.
    pub max_fleet_in_flight: usize,
    /// Hosts in flight at the last revision checked (to see a run start).
    running: BTreeSet<String>,
}

/// A running recorder; `stop` returns what it saw.
pub struct Recorder {
    task: JoinHandle<Record>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Recorder {
    /// Starts watching `schema`'s namespace; `rules` gives the limits and order.
    pub async fn start(store: DynStore, schema: Schema, rules: Rules) -> Recorder {
        let listing = store.list(&schema.root()).await.expect("initial listing");
        let mut watch = store
            .watch(&schema.root(), listing.revision + 1)
            .await
            .expect("watch");
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut state: BTreeMap<Key, KeyValue> =
                listing.kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
            let mut rec = Record::default();
            let mut seen = BTreeSet::new();
            // The revision whose events are arriving, and when its first one came: a
            // revision is checked once the next one starts (its events all came), which
            // can be much later, so its time is when it arrived.
            let mut pending: Option<(i64, u64)> = None;
            loop {
                let ev = tokio::select! {
                    ev = watch.next() => ev,
                    _ = &mut stopped => {
                        let (rev, at) = pending.unwrap_or((0, jio_common::time::unix_now()));
                        check(&schema, &rules, &state, rev, at, &mut rec, &mut seen);
                        return rec;
                    }
                };
                let Some(Ok(ev)) = ev else {
                    rec.violations.push(format!("watch ended: {ev:?}"));
                    return rec;
                };
                // Check the state after each complete revision.
                if let Some((rev, at)) = pending
                    && rev != ev.revision()
                {
                    check(&schema, &rules, &state, rev, at, &mut rec, &mut seen);
                    pending = None;
                }
                if pending.is_none() {
                    pending = Some((ev.revision(), jio_common::time::unix_now()));
                }
                match ev {
                    WatchEvent::Put(kv) => {
                        state.insert(kv.key.clone(), kv);
                    }
                    WatchEvent::Delete { key, .. } => {
                        state.remove(&key);
                    }
                    WatchEvent::Reset { kvs, .. } => {
                        state = kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect();
                    }
                }
            }
        });
        Recorder { task, stop }
    }

    pub async fn stop(self) -> Record {
        let _ = self.stop.send(());
        self.task.await.expect("recorder task")
    }
}

/// The fleet as the raw keys say, read without the project's own classification
/// (`fleet::classify`), so that a bug there cannot hide on both sides: a host is in
/// flight while its agent says it runs something (a run marker `/runs/<host>`, or an
/// `/agents/<host>` record whose state is `upgrading` or `checking`), and done once
/// `/running/versions/<current>/<host>` exists. Roles come from `/hosts/<host>`.
struct RawFleet {
    /// host → (role, in flight, done)
    hosts: BTreeMap<String, (String, bool, bool)>,
}

impl RawFleet {
    fn read(schema: &Schema, state: &BTreeMap<Key, KeyValue>) -> RawFleet {
        let p = schema.prefix();
        let at = |k: &str| {
            state
                .get(&Key::new(format!("{p}{k}")).ok()?)
                .map(|kv| kv.value.clone())
        };
        let current = at("/current_version").unwrap_or_default();
        let field = |v: &str, name: &str| {
            serde_json::from_str::<serde_json::Value>(v)
                .ok()
                .and_then(|j| j.get(name)?.as_str().map(str::to_string))
        };
        let mut hosts = BTreeMap::new();
        for kv in state.values() {
            let Some(rest) = kv.key.as_str().strip_prefix(&format!("{p}/hosts/")) else {
                continue;
            };
            let Some(role) = field(&kv.value, "role") else {
                continue;
            };
            let running = at(&format!("/runs/{rest}")).is_some()
                || at(&format!("/agents/{rest}"))
                    .and_then(|v| field(&v, "state"))
                    .is_some_and(|s| s == "upgrading" || s == "checking");
            let done = !current.is_empty() && at(&format!("/running/versions/{current}/{rest}")).is_some();
            hosts.insert(rest.to_string(), (role, running, done));
        }
        RawFleet { hosts }
    }
}

fn check(
    schema: &Schema,
    rules: &Rules,
    state: &BTreeMap<Key, KeyValue>,
    rev: i64,
    now: u64,
    rec: &mut Record,
    seen: &mut BTreeSet<String>,
) {
    rec.revisions += 1;
    let fleet = RawFleet::read(schema, state);
    let roles = fleet
        .hosts
        .values()
        .filter_map(|(r, _, _)| jio_common::names::Role::new(r.clone()).ok())
        .collect();
    let resolved = match rules.resolve(&roles) {
        Ok(r) => r,
        Err(e) => {
            rec.violations
                .push(format!("rev {rev}: rules do not resolve: {e}"));
            return;
        }
    };
    let group = |r: &str| {
        jio_common::names::Role::new(r.to_string())
            .ok()
            .and_then(|r| resolved.group_of.get(&r).cloned())
            .unwrap_or_else(|| r.to_string())
    };
    let mut in_flight: BTreeMap<String, usize> = BTreeMap::new();
    let mut who: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut not_done: BTreeSet<String> = BTreeSet::new();
    for (host, (role, running, done)) in &fleet.hosts {
        let g = group(role);
        if *running {
            *in_flight.entry(g.clone()).or_default() += 1;
            who.entry(g.clone()).or_default().push(host.clone());
            if seen.insert(host.clone()) {
                rec.started.push(host.clone());
            }
        }
        if !done {
            not_done.insert(g);
        }
    }
    // The fleet cap, and runs that start while held or outside their window.
    let total_in_flight: usize = in_flight.values().sum();
    rec.max_fleet_in_flight = rec.max_fleet_in_flight.max(total_in_flight);
    if let Some(cap) = resolved.fleet_cap(fleet.hosts.len())
        && total_in_flight as u64 > cap
    {
        rec.violations.push(format!(
            "rev {rev}: {total_in_flight} hosts in flight across the fleet, cap {cap}"
        ));
    }
    let p = schema.prefix();
    let has = |k: String| {
        Key::new(format!("{p}{k}"))
            .ok()
            .is_some_and(|k| state.contains_key(&k))
    };
    let running_now: BTreeSet<String> = fleet
        .hosts
        .iter()
        .filter(|(_, (_, running, _))| *running)
        .map(|(h, _)| h.clone())
        .collect();
    let upgrading = |h: &str| {
        [format!("/runs/{h}"), format!("/agents/{h}")]
            .into_iter()
            .any(|k| {
                Key::new(format!("{p}{k}"))
                    .ok()
                    .and_then(|k| state.get(&k))
                    .is_some_and(|kv| kv.value.contains("\"state\":\"upgrading\""))
            })
    };
    // Health checks may run while held or outside a window; upgrades may not.
    for h in running_now.difference(&rec.running).filter(|h| upgrading(h)) {
        let role = &fleet.hosts[h].0;
        if has(format!("/holds/host/{h}")) || has(format!("/holds/role/{role}")) {
            rec.violations
                .push(format!("rev {rev}: {h} started a run while held"));
        }
        if let Ok(r) = jio_common::names::Role::new(role.clone()) {
            let windows = rules.windows_for(&r);
            // Closed when the start arrived and 2 s before: a start observed late is
            // not blamed on the close.
            let closed = |t: u64| !jio_common::window::state(&windows, t).open();
            if closed(now) && closed(now.saturating_sub(2)) {
                rec.violations.push(format!(
                    "rev {rev}: {h} started a run outside its maintenance window"
                ));
            }
        }
    }
    rec.running = running_now;
    for (g, n) in &in_flight {
        let m = rec.max_in_flight.entry(g.clone()).or_default();
        *m = (*m).max(*n);
        let size = fleet.hosts.values().filter(|(r, ..)| group(r) == *g).count();
        if let Some(limit) = resolved.limit_of(g, size)
            && *n as u64 > limit
        {
            let p = schema.prefix();
            let raw = |k: String| {
                Key::new(format!("{p}{k}"))
                    .ok()
                    .and_then(|k| state.get(&k))
                    .map(|kv| format!("{}@{}", kv.value, kv.mod_revision))
            };
            let hosts: Vec<String> = who
                .get(g)
                .into_iter()
                .flatten()
                .map(|h| {
                    format!(
                        "{h} (run marker {:?}, agent {:?})",
                        raw(format!("/runs/{h}")),
                        raw(format!("/agents/{h}"))
                    )
                })
                .collect();
            rec.violations.push(format!(
                "rev {rev}: group {g} has {n} hosts in flight, limit {limit}: {}",
                hosts.join("; ")
            ));
        }
        for dep in resolved.deps.get(g).into_iter().flatten() {
            if not_done.contains(dep) {
                rec.violations
                    .push(format!("rev {rev}: group {g} started while {dep} is not done"));
            }
        }
    }
}
