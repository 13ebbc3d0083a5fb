//! What `jioctl drive --metrics-listen` exports: the fleet as the store has it
//! (hosts per state, role and group; each group's hosts in flight and its limit),
//! the rollout's state, the emergency stop, and whether this driver holds the
//! rollout lock. Read afresh at a scrape (at most once per `FRESH`), never from the
//! driver's own bookkeeping, so it shows what every driver and agent sees.

use std::collections::BTreeMap;
use std::time::Duration;

use jio_common::exposition::{Exposition, Kind, Sample};
use jio_common::fleet::{self, HostState, LockRecord, Snapshot};
use jio_common::keys::Schema;
use jio_common::rollout::RolloutRecord;
use jio_common::store::DynStore;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// A scrape within this long of the last one is answered from it: a busy
/// Prometheus cannot turn into a load on the store.
const FRESH: Duration = Duration::from_secs(5);

/// How long a scrape waits for the store: well within Prometheus's default scrape
/// timeout (10s), so that a store gone quiet shows as `jio_drive_store_up 0` (with
/// the last figures read), not as a failed scrape.
const READ_TIMEOUT: Duration = Duration::from_secs(3);

/// The states of a rollout, each a series of `jio_rollout_state`.
const ROLLOUT_STATES: [&str; 6] = ["running", "paused", "stuck", "done", "failed", "aborted"];

/// The fleet's metrics at `now`; `me` is this driver (the lock's holder when it
/// holds it).
pub fn render(
    snap: &Snapshot,
    last_rollout: Option<&RolloutRecord>,
    me: &LockRecord,
    errors: u64,
    up: bool,
) -> String {
    let hosts = fleet::classify(snap);
    let (group_of, resolved) = crate::status::groups(snap, &hosts);
    let tally = Tally::of(&hosts, &group_of);
    let mut e = Exposition::new();
    store_health(&mut e, errors, up);
    fleet_hosts(&mut e, snap, &tally);
    rebooting(&mut e, snap);
    if let Some(r) = &resolved {
        group_limits(&mut e, r, &tally);
    }
    rollout(&mut e, snap, last_rollout);
    hooks(&mut e, snap);
    safety(&mut e, snap, me);
    e.finish()
}

/// The hosts in their maintenance hooks under the active rollout: how many per
/// hook and state, and since when each running hook runs.
fn hooks(e: &mut Exposition, snap: &Snapshot) {
    use jio_common::hook_record::{HookKind, HookState};
    let active = snap.active_rollout_id();
    let mine: Vec<_> = snap
        .hooks
        .iter()
        .filter(|(_, r)| Some(r.rollout.as_str()) == active)
        .collect();
    let kinds = [HookKind::Before, HookKind::After];
    let states = [HookState::Running, HookState::Succeeded, HookState::Failed];
    e.family(
        "jio_fleet_hooks",
        Kind::Gauge,
        "Hosts by maintenance hook (before, after) and its state (running, succeeded, failed) in the active rollout's slots (every pair present, 0 included).",
        kinds.iter().flat_map(|k| {
            let mine = &mine;
            states.iter().map(move |s| {
                let n = mine.iter().filter(|(_, r)| r.hook == *k && r.state == *s).count();
                (
                    vec![("hook", k.as_str().to_string()), ("state", s.as_str().to_string())],
                    n as f64,
                )
            })
        }),
    )
    .family(
        "jio_fleet_hook_running_since_seconds",
        Kind::Gauge,
        "Unix time each running maintenance hook of the active rollout started (by host and hook): a host stuck in a hook shows here.",
        mine.iter()
            .filter(|(_, r)| r.state == HookState::Running)
            .map(|(h, r)| {
                (
                    vec![("host", h.to_string()), ("hook", r.hook.as_str().to_string())],
                    r.started as f64,
                )
            }),
    )
    .single(
        "jio_fleet_hook_records_unreadable",
        Kind::Gauge,
        "Hook records (/hooks/<host>) that cannot be read: each such host keeps its slot.",
        snap.hooks_invalid.len() as f64,
    );
}

/// The fleet's hosts counted for the metrics.
#[derive(Default)]
struct Tally {
    /// (group, role) → hosts per state, every state present (0 included, for alerts).
    per: BTreeMap<(String, String), BTreeMap<HostState, usize>>,
    /// Hosts per group.
    sizes: BTreeMap<String, usize>,
    /// Hosts per group holding a rolling slot.
    in_flight: BTreeMap<String, usize>,
}

impl Tally {
    /// Counts `hosts`, each in its role's group (`group_of`; a role without one is its own).
    fn of(hosts: &[fleet::HostStatus], group_of: &BTreeMap<jio_common::names::Role, String>) -> Tally {
        let group =
            |role: &jio_common::names::Role| group_of.get(role).cloned().unwrap_or_else(|| role.to_string());
        let mut t = Tally::default();
        for h in hosts {
            let g = group(&h.role);
            let states = t
                .per
                .entry((g.clone(), h.role.to_string()))
                .or_insert_with(|| HostState::ALL.iter().map(|s| (*s, 0)).collect());
            *states.entry(h.state).or_default() += 1;
            *t.sizes.entry(g.clone()).or_default() += 1;
            *t.in_flight.entry(g).or_default() += usize::from(h.state.in_flight());
        }
        t
    }
}

/// Whether the last read of the store worked, and how many failed.
fn store_health(e: &mut Exposition, errors: u64, up: bool) {
    e.single(
        "jio_drive_store_up",
        Kind::Gauge,
        "1 when the last read of the store worked, 0 when it failed (the figures are then from the read before).",
        f64::from(u8::from(up)),
    )
    .single(
        "jio_drive_store_errors_total",
        Kind::Counter,
        "Reads of the store for a scrape that failed.",
        errors as f64,
    );
}

/// The desired version, and the hosts per group, role and state and in flight per group.
fn fleet_hosts(e: &mut Exposition, snap: &Snapshot, tally: &Tally) {
    e.family(
        "jio_fleet_desired_version_info",
        Kind::Gauge,
        "The fleet's desired version, /current_version (always 1; absent when none is set).",
        snap.current.iter().map(|v| (vec![("version", v.to_string())], 1.0)),
    )
    .family(
        "jio_fleet_hosts",
        Kind::Gauge,
        "Hosts by rollout group, role and state (upgraded, upgrading, failed, pending, lost, blocked, unknown).",
        tally.per.iter().flat_map(|((g, r), states)| {
            states.iter().map(move |(s, n)| -> Sample<'_> {
                (
                    vec![
                        ("group", g.clone()),
                        ("role", r.clone()),
                        ("state", s.as_str().to_string()),
                    ],
                    *n as f64,
                )
            })
        }),
    )
    .family(
        "jio_fleet_group_in_flight",
        Kind::Gauge,
        "Hosts of each group holding a rolling slot (upgrading, failed or lost).",
        tally.in_flight.iter().map(|(g, n)| (vec![("group", g.clone())], *n as f64)),
    );
}

/// Hosts whose run ends with a reboot (their run marker says `rebooting`), by
/// role: down, back and validating, or waiting for a hold; and those past their
/// deadline (lost).
fn rebooting(e: &mut Exposition, snap: &Snapshot) {
    let mut by: std::collections::BTreeMap<(String, &'static str), u64> = std::collections::BTreeMap::new();
    for (h, r) in &snap.runs {
        let Some(r) = r
            .as_ref()
            .filter(|r| r.state == jio_common::values::AgentState::Rebooting)
        else {
            continue;
        };
        let late =
            matches!((r.until, snap.now), (Some(u), Some(now)) if now >= u) && !snap.agents.contains_key(h);
        let phase = match (r.until, late) {
            (None, _) => "waiting",
            (Some(_), true) => "not_back",
            (Some(_), false) => "rebooting",
        };
        *by.entry((snap.role_of(h).to_string(), phase)).or_default() += 1;
    }
    e.family(
        "jio_fleet_hosts_rebooting",
        Kind::Gauge,
        "Hosts whose run ends with a reboot, by role and phase: waiting (for a hold), rebooting (down or validating again), not_back (past reboot_timeout with no agent).",
        by.into_iter()
            .map(|((role, phase), n)| (vec![("role", role), ("phase", phase.to_string())], n as f64)),
    );
}

/// Each group's limit on hosts in flight under the active rollout's rules.
fn group_limits(e: &mut Exposition, r: &jio_common::rules::Resolved, tally: &Tally) {
    e.family(
        "jio_fleet_group_limit",
        Kind::Gauge,
        "Each group's limit on hosts in flight under the active rollout's rules (absent: no limit).",
        tally.sizes.iter().filter_map(|(g, size)| {
            r.limits
                .get(g)
                .and_then(|ls| ls.iter().map(|l| l.of(*size, true)).min())
                .map(|n| (vec![("group", g.clone())], n as f64))
        }),
    );
}

/// Whether a rollout is active, and the current (or last) one's id, version and state.
fn rollout(e: &mut Exposition, snap: &Snapshot, last_rollout: Option<&RolloutRecord>) {
    let current = snap.rollout.as_ref().and_then(|c| c.record.as_ref().ok());
    let rollout = current.or(last_rollout);
    e.single(
        "jio_rollout_active",
        Kind::Gauge,
        "1 while a rollout is current (/rollouts/current), running, paused or stuck.",
        f64::from(u8::from(current.is_some_and(|r| r.state.active()))),
    )
    .family(
        "jio_rollout_info",
        Kind::Gauge,
        "The current rollout, or the last one when none is current: its id, version and state (always 1; absent before the first).",
        rollout.iter().map(|r| {
            (
                vec![
                    ("id", r.id.to_string()),
                    ("version", r.version.to_string()),
                    ("state", r.state.name().to_string()),
                ],
                1.0,
            )
        }),
    )
    .family(
        "jio_rollout_state",
        Kind::Gauge,
        "1 for the state the current (or last) rollout is in, 0 for the others (absent before the first).",
        rollout.iter().flat_map(|r| {
            ROLLOUT_STATES
                .iter()
                .map(|s| (vec![("state", s.to_string())], f64::from(u8::from(r.state.name() == *s))))
        }),
    );
}

/// The emergency stop, whether this driver (`me`) holds the lock, and unreadable values.
fn safety(e: &mut Exposition, snap: &Snapshot, me: &LockRecord) {
    e.single(
        "jio_fleet_emergency_stop",
        Kind::Gauge,
        "1 while global-disable-puppet's emergency stop is in force.",
        f64::from(u8::from(snap.halt.is_some())),
    )
    .single(
        "jio_drive_lock_held",
        Kind::Gauge,
        "1 when this driver holds the rollout lock.",
        f64::from(u8::from(
            snap.lock
                .as_ref()
                .is_some_and(|l| l.host == me.host && l.pid == me.pid),
        )),
    )
    .single(
        "jio_fleet_problems",
        Kind::Gauge,
        "Values in the store that cannot be read (jioctl status names each key).",
        snap.problems.len() as f64,
    );
}

/// A scrape reads the store (at most once per `FRESH`) and renders.
pub struct FleetMetrics {
    store: DynStore,
    schema: Schema,
    me: LockRecord,
    last: Mutex<Last>,
}

#[derive(Default)]
struct Last {
    at: Option<Instant>,
    snap: Option<Snapshot>,
    last_rollout: Option<RolloutRecord>,
    text: String,
    errors: u64,
    /// The last read failed (said once, until one works again).
    down: bool,
}

impl FleetMetrics {
    pub fn new(store: DynStore, schema: Schema) -> FleetMetrics {
        FleetMetrics {
            store,
            schema,
            me: crate::writes::holder(),
            last: Mutex::default(),
        }
    }
}

#[async_trait::async_trait]
impl jio_common::exposition::Scrape for FleetMetrics {
    async fn scrape(&self) -> String {
        let mut last = self.last.lock().await;
        if last.at.is_some_and(|at| at.elapsed() < FRESH) {
            return last.text.clone();
        }
        let read = async {
            let snap = Snapshot::read(&self.store, &self.schema).await?;
            // The last rollout's record, once the current one has ended.
            let last = match snap.rollout {
                Some(_) => None,
                None => crate::rollouts::last_record(&self.store, &self.schema).await?,
            };
            Ok::<_, jio_common::store::StoreError>((snap, last))
        };
        let read = async {
            match tokio::time::timeout(READ_TIMEOUT, read).await {
                Ok(r) => r.map_err(|e| e.to_string()),
                Err(_) => Err(format!(
                    "no answer within {}",
                    jio_common::duration::format(READ_TIMEOUT)
                )),
            }
        };
        let up = match read.await {
            Ok((s, r)) => {
                last.last_rollout = r;
                if std::mem::take(&mut last.down) {
                    eprintln!("jioctl drive: metrics: the store answers again");
                }
                last.snap = Some(s);
                true
            }
            Err(e) => {
                if !last.down {
                    eprintln!(
                        "jioctl drive: metrics: cannot read the store ({e}); the figures are from the last read that worked"
                    );
                    last.down = true;
                }
                last.errors += 1;
                false
            }
        };
        let empty = Snapshot::default();
        last.text = render(
            last.snap.as_ref().unwrap_or(&empty),
            last.last_rollout.as_ref(),
            &self.me,
            last.errors,
            up,
        );
        last.at = Some(Instant::now());
        last.text.clone()
    }
}
