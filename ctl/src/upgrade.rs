//! `jioctl upgrade`: set the desired version and drive the rollout under the rules.
//!
//! Each pass reads a snapshot, plans with the pure planner, and applies the plan in
//! epoch-fenced transactions; a pass that lost the race plans again. With `--retry`
//! passes repeat, woken by a watch on the namespace (not a timer), until nothing is
//! pending or upgrading, or failures stop the rollout.

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use std::collections::BTreeMap;

use jio_common::fleet::{self, HostState, Snapshot};
use jio_common::keys::{Key, Outcome, Parsed, Schema};
use jio_common::names::{Role, Version};
use jio_common::rules::{self, Plan, Rules};
use jio_common::store::{DynStore, ErrorKind, KeyValue, Revision, StoreError, WatchEvent};

use crate::cli::exit;
use crate::progress::Progress;
use crate::writes::{self, LockOutcome, RolloutLock};

pub struct Args {
    pub version: Version,
    pub rules: Rules,
    pub noop: bool,
    pub retry: bool,
    pub verbose: bool,
    pub json: bool,
    /// Print nothing but errors (for programs that drive upgrades in-process).
    pub quiet: bool,
}

/// The keys a snapshot reads, kept up to date from the watch so that a pass costs
/// no store request (a full read only at the start, after a reset, and when the
/// desired version changes: failure entries are read per version).
struct LiveView {
    kvs: BTreeMap<Key, KeyValue>,
    revision: Revision,
}

impl LiveView {
    async fn read(store: &DynStore, schema: &Schema) -> Result<LiveView, StoreError> {
        let (kvs, revision) = Snapshot::read_kvs(store, schema, None).await?;
        Ok(LiveView {
            kvs: kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect(),
            revision,
        })
    }

    fn snapshot(&self, schema: &Schema) -> Snapshot {
        let mut s = Snapshot::from_kvs(schema, self.kvs.values());
        s.revision = self.revision;
        s
    }

    /// Applies one event: whether it changed what a plan depends on, and whether a
    /// full read is needed.
    fn apply(&mut self, schema: &Schema, ev: WatchEvent) -> Applied {
        self.revision = self.revision.max(ev.revision());
        let relevant = |k: &Key| {
            !matches!(
                schema.parse(k),
                None | Some(Parsed::ActiveRole(..))
                    | Some(Parsed::Provisioned(..))
                    | Some(Parsed::Status(_, Outcome::Success, ..))
            )
        };
        match ev {
            WatchEvent::Put(kv) => {
                if !relevant(&kv.key) {
                    return Applied::Nothing;
                }
                let parsed = schema.parse(&kv.key);
                let old = self.kvs.get(&kv.key).map(|o| o.value.clone());
                // A liveness record only matters by being there; other values matter.
                let changed = match parsed {
                    Some(Parsed::Agent(_)) => old.is_none(),
                    _ => old.as_ref() != Some(&kv.value),
                };
                let version_changed = parsed == Some(Parsed::CurrentVersion) && changed;
                self.kvs.insert(kv.key.clone(), kv);
                if version_changed {
                    Applied::Reread
                } else if changed {
                    Applied::Changed
                } else {
                    Applied::Nothing
                }
            }
            WatchEvent::Delete { key, .. } => {
                if schema.parse(&key) == Some(Parsed::CurrentVersion) {
                    Applied::Reread
                } else if self.kvs.remove(&key).is_some() {
                    Applied::Changed
                } else {
                    Applied::Nothing
                }
            }
            WatchEvent::Reset { .. } => Applied::Reread,
        }
    }
}

/// What one watch event did to the live view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applied {
    Nothing,
    Changed,
    Reread,
}

/// How long `--retry` keeps going while the store is unreachable.
const STORE_PATIENCE: Duration = Duration::from_secs(300);

/// A snapshot as it will be once the rollout to `v` has started (for `--noop`).
fn as_if_started(mut snap: Snapshot, v: &Version) -> Snapshot {
    if snap.current.as_ref() != Some(v) {
        snap.current = Some(v.clone());
        snap.global = jio_common::gate::KeyState::Set(false);
        snap.role_keys.clear();
        snap.host_keys.clear();
    }
    snap
}

fn print_plan(plan: &Plan) {
    for g in &plan.groups {
        let limit = g
            .limit
            .map(|l| l.to_string())
            .unwrap_or_else(|| "unlimited".into());
        println!(
            "  {:<16} limit {:<9} upgraded {:<4} in flight {:<4} pending {:<4} -> {}",
            g.group, limit, g.upgraded, g.in_flight, g.pending, g.action
        );
    }
}

fn admitted(plan: &Plan) -> Option<String> {
    let mut parts = Vec::new();
    if !plan.enable_roles.is_empty() {
        parts.push(format!(
            "role {}",
            plan.enable_roles
                .iter()
                .map(Role::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !plan.enable_hosts.is_empty() {
        parts.push(format!(
            "host {}",
            plan.enable_hosts
                .iter()
                .map(|h| h.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    (!parts.is_empty()).then(|| format!("enabled {}", parts.join("; ")))
}

/// Runs the command; returns the exit code.
pub async fn run(store: &DynStore, schema: &Schema, args: Args) -> anyhow::Result<u8> {
    // Check the rules against the fleet before anything is written.
    let snap = Snapshot::read_for(store, schema, Some(&args.version)).await?;
    let roles = fleet::classify(&snap).into_iter().map(|h| h.role).collect();
    let resolved = match args.rules.resolve(&roles) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("jioctl: {e}");
            return Ok(exit::INVALID_RULES);
        }
    };
    for w in &resolved.warnings {
        eprintln!("jioctl: warning: {w}");
    }
    if args.noop {
        let snap = as_if_started(snap, &args.version);
        let hosts = fleet::classify(&snap);
        let plan = rules::plan(&snap, &hosts, &resolved);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&plan)?);
        } else {
            println!("plan for {} (noop: nothing written):", args.version);
            print_plan(&plan);
            if let Some(a) = admitted(&plan) {
                println!("would have {a}");
            }
        }
        return Ok(exit::OK);
    }

    let lock = loop {
        match RolloutLock::try_take(store, schema).await? {
            LockOutcome::Taken(l) => break l,
            LockOutcome::Held(holder) => {
                let who = writes::describe(&holder);
                if !args.retry {
                    eprintln!(
                        "jioctl: a rollout is already being driven by {who}; try again later or use --retry to wait"
                    );
                    return Ok(exit::LOCKED);
                }
                eprintln!("jioctl: waiting for the rollout lock held by {who}");
                let rev = store.ping().await?;
                let mut w = store.watch(&schema.lock(fleet::ROLLOUT_LOCK), rev + 1).await?;
                if store.get(&schema.lock(fleet::ROLLOUT_LOCK)).await?.is_some() {
                    let _ = tokio::time::timeout(Duration::from_secs(30), w.next()).await;
                }
            }
        }
    };
    let result = drive(store, schema, &args).await;
    lock.release().await;
    let (code, show) = result?;
    if show && !args.quiet {
        finish(store, schema, &args).await?;
    }
    Ok(code)
}

/// Runs passes; returns the exit code and whether to print the final status.
async fn drive(store: &DynStore, schema: &Schema, args: &Args) -> anyhow::Result<(u8, bool)> {
    let tty = std::io::stdout().is_terminal() && !args.json;
    let mut progress = if args.quiet {
        Progress::silent()
    } else {
        Progress::new(tty)
    };
    let mut view: Option<LiveView> = None;
    let mut watch = None;
    let mut unreachable_since: Option<Instant> = None;
    loop {
        let result = async {
            let v = match view.take() {
                Some(v) => v,
                None => {
                    // Something may have been missed: read everything again.
                    watch = None;
                    LiveView::read(store, schema).await?
                }
            };
            Ok::<_, PassError>(v)
        }
        .await;
        let pass = match result {
            Ok(mut v) => {
                let r = pass(store, schema, args, &mut progress, &mut v).await;
                view = Some(v);
                r
            }
            Err(e) => Err(e),
        };
        let (snap, outcome) = match pass {
            Ok(x) => {
                if unreachable_since.take().is_some() {
                    eprintln!("jioctl: store reachable again");
                }
                x
            }
            Err(PassError::Store(e)) if args.retry && e.kind() == ErrorKind::Unavailable => {
                let since = *unreachable_since.get_or_insert_with(|| {
                    eprintln!("jioctl: {e}; retrying");
                    Instant::now()
                });
                if since.elapsed() > STORE_PATIENCE {
                    return Err(e.into());
                }
                view = None;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(PassError::Store(e)) => return Err(e.into()),
            Err(PassError::Rules(e)) => {
                eprintln!("jioctl: {e}");
                return Ok((exit::INVALID_RULES, false));
            }
        };
        match outcome {
            PassOutcome::Replan => {
                view = None;
                continue;
            }
            PassOutcome::Again => continue,
            PassOutcome::Stopped => {
                report_failures(&snap, args);
                return Ok((exit::FAILED, false));
            }
            PassOutcome::Finished { failed } => {
                return Ok((if failed == 0 { exit::OK } else { exit::FAILED }, true));
            }
            PassOutcome::Continue if !args.retry => return Ok((exit::OK, true)),
            PassOutcome::Continue => {}
        }
        if watch.is_none() {
            watch = Some(store.watch(&schema.root(), snap.revision + 1).await?);
        }
        let Some(w) = watch.as_mut() else { continue };
        // Woken by any change; a slow resync guards against a silent watch.
        let first = match tokio::time::timeout(Duration::from_secs(30), w.next()).await {
            Ok(Some(Ok(ev))) => Some(ev),
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(None) | Err(_) => {
                view = None;
                None
            }
        };
        let mut events: Vec<WatchEvent> = first.into_iter().collect();
        let mut quiet = false;
        loop {
            while let Some(Some(Ok(ev))) = futures_util::FutureExt::now_or_never(w.next()) {
                events.push(ev);
            }
            let Some(v) = view.as_mut() else { break };
            let mut changed = false;
            for ev in events.drain(..) {
                match v.apply(schema, ev) {
                    Applied::Nothing => {}
                    Applied::Changed => changed = true,
                    Applied::Reread => {
                        view = None;
                        break;
                    }
                }
            }
            if changed || view.is_none() {
                break;
            }
            // Nothing a plan depends on changed: wait for more, without a pass.
            match tokio::time::timeout(Duration::from_secs(30), w.next()).await {
                Ok(Some(Ok(ev))) => events.push(ev),
                Ok(Some(Err(e))) => return Err(e.into()),
                Ok(None) | Err(_) => {
                    quiet = true;
                    break;
                }
            }
        }
        if quiet {
            // The slow resync: plan from a fresh read.
            view = None;
        }
    }
}

enum PassError {
    Store(StoreError),
    Rules(rules::RulesError),
}

impl From<StoreError> for PassError {
    fn from(e: StoreError) -> Self {
        PassError::Store(e)
    }
}

enum PassOutcome {
    /// The store changed under the plan: read it again and plan again.
    Replan,
    /// The view is fresh: plan again at once.
    Again,
    /// More failures than allowed.
    Stopped,
    /// Nothing pending or upgrading.
    Finished {
        failed: usize,
    },
    Continue,
}

async fn pass(
    store: &DynStore,
    schema: &Schema,
    args: &Args,
    progress: &mut Progress,
    view: &mut LiveView,
) -> Result<(Snapshot, PassOutcome), PassError> {
    let snap = view.snapshot(schema);
    if snap.current.as_ref() != Some(&args.version) {
        // First pass (or someone changed it): start the rollout in one transaction.
        let ops = writes::start_rollout_ops(schema, &args.version);
        if !writes::apply_fenced(store, schema, ops, snap.epoch).await? {
            return Ok((snap, PassOutcome::Replan));
        }
        if !args.quiet {
            println!(
                "current_version set to {} (puppet disabled globally; hosts start under the rules)",
                args.version
            );
        }
        // Failure entries are read per version: read everything again.
        *view = LiveView::read(store, schema).await?;
        return Ok((view.snapshot(schema), PassOutcome::Again));
    }
    let hosts = fleet::classify(&snap);
    let roles = hosts.iter().map(|h| h.role.clone()).collect();
    let resolved = args.rules.resolve(&roles).map_err(PassError::Rules)?;
    let plan = rules::plan(&snap, &hosts, &resolved);
    if args.verbose {
        println!("pass at revision {}:", snap.revision);
        print_plan(&plan);
    }
    if !plan.is_empty() {
        if !writes::apply_fenced(store, schema, writes::plan_ops(schema, &plan), snap.epoch).await? {
            return Ok((snap, PassOutcome::Replan));
        }
        if let Some(a) = admitted(&plan) {
            progress.note(&a);
        }
        // The watch brings our own writes back into the view.
        return Ok((snap, PassOutcome::Continue));
    }
    progress.update(&hosts);
    let count = |s: HostState| hosts.iter().filter(|h| h.state == s).count();
    let failed = count(HostState::Failed);
    if plan.stopped_on_failures {
        return Ok((snap, PassOutcome::Stopped));
    }
    let moving = count(HostState::Pending) + count(HostState::Upgrading) + count(HostState::Lost);
    if moving == 0 {
        return Ok((snap, PassOutcome::Finished { failed }));
    }
    Ok((snap, PassOutcome::Continue))
}

fn report_failures(snap: &Snapshot, args: &Args) {
    eprintln!(
        "jioctl: rollout to {} stopped: {} host(s) failed (max_failures {})",
        args.version,
        snap.failures.len(),
        args.rules.max_failures
    );
    for (h, (step, link)) in &snap.failures {
        let link = if link.is_empty() { "(no log link)" } else { link };
        eprintln!("  {h}: {} failed: {link}", step.as_str());
    }
}

async fn finish(store: &DynStore, schema: &Schema, args: &Args) -> anyhow::Result<()> {
    let snap = Snapshot::read(store, schema).await?;
    let hosts = fleet::classify(&snap);
    if args.json {
        println!("{}", crate::status::to_json(&snap, &hosts));
    } else {
        print!("{}", crate::status::to_text(&snap, &hosts, store.url()));
    }
    Ok(())
}
