//! The daemon: passes woken by watches on the desired version and the enable keys,
//! with a slow resync, the retry timer, the idle health check's timer, and backoff
//! after a pass that failed. Nothing read from the store ends it: a failing pass is
//! logged once and tried again. Timers run on tokio's clock (paused in tests).

use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::SelectAll;
use jio_common::backoff::Backoff;
use jio_common::store::WatchStream;
use jio_common::values::AgentState;
use tokio::time::Instant;

use crate::agent::{Agent, AgentError};
use crate::decide::Decision;
use crate::liveness::Liveness;
use crate::pass::PassResult;
use crate::state;

/// Runs `agent` as a daemon: its liveness record, then the reconcile loop until the
/// shutdown signal; the lease is revoked at the end. `jio-agent run` and agents
/// embedded in another program (benchmarks, tests) both go through here.
pub async fn serve(mut agent: Agent) -> Result<(), AgentError> {
    let cfg = agent.config();
    let local = state::read_local_version(&cfg.version_file).ok().flatten();
    let liveness = Liveness::start_reporting(
        agent.store().clone(),
        (
            cfg.schema.agent(&cfg.hostname),
            Some(cfg.schema.clock(&cfg.hostname)),
        ),
        cfg.lease_ttl,
        if agent.rebooting() {
            AgentState::Rebooting
        } else {
            AgentState::Idle
        },
        local,
        Some(agent.metrics().clone()),
    );
    agent.set_liveness(liveness);
    agent.set_reboots(true);
    let res = run(&mut agent).await;
    if let Some(l) = agent.take_liveness() {
        l.stop().await;
    }
    res
}

/// When the idle health check is next due (never when the interval is zero).
struct HealthTimer {
    interval: Duration,
    next: Instant,
}

impl HealthTimer {
    fn new(interval: Duration) -> HealthTimer {
        HealthTimer {
            interval,
            next: Instant::now() + interval,
        }
    }

    fn due(&self) -> bool {
        !self.interval.is_zero() && Instant::now() >= self.next
    }

    fn restart(&mut self) {
        self.next = Instant::now() + self.interval;
    }

    /// How long until it is due; `None` when health checks are off.
    fn left(&self) -> Option<Duration> {
        (!self.interval.is_zero()).then(|| self.next.saturating_duration_since(Instant::now()))
    }
}

/// What the loop does after a pass.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Something happened: look again at once.
    Again,
    /// Wait this long, or until a watch fires.
    Wait(Duration),
}

/// The next step after a pass that returned `result` (pure but for the timers it
/// is handed).
fn after_pass(
    result: &PassResult,
    health_was_due: bool,
    health: &mut HealthTimer,
    resync: Duration,
    now_unix: u64,
) -> Next {
    // The next check comes an interval after this one was due, whatever became of
    // it (run, held, skipped, lost its fence, overtaken by an upgrade), or after a
    // repair ended. Only reporting earlier results first leaves it due.
    let decided = !matches!(result, PassResult::Reported);
    if (health_was_due && decided) || matches!(result, PassResult::Repaired { .. }) {
        health.restart();
    }
    match result {
        PassResult::Reported
        | PassResult::Ran { .. }
        | PassResult::Checked { .. }
        | PassResult::Repaired { .. }
        | PassResult::Command { .. }
        | PassResult::Raced => Next::Again,
        PassResult::Idle(Decision::Backoff { until, .. }) => {
            Next::Wait(resync.min(Duration::from_secs(until.saturating_sub(now_unix).max(1))))
        }
        // A host a composable rollout has not reached keeps its health checks.
        PassResult::Idle(
            Decision::UpToDate | Decision::HealthHeld { .. } | Decision::AwaitingPhase { .. },
        )
        | PassResult::Skipped { .. } => Next::Wait(health.left().map_or(resync, |left| resync.min(left))),
        // The soak's check comes at its time (or with the idle check, if earlier).
        PassResult::Idle(Decision::Soaking { check_at, .. }) => {
            let soak = Duration::from_secs(check_at.saturating_sub(now_unix).max(1));
            let wait = resync.min(soak);
            Next::Wait(health.left().map_or(wait, |left| wait.min(left)))
        }
        PassResult::Idle(_) => Next::Wait(resync),
        // A hold is looked at again soon; the new boot is waited for until its deadline.
        PassResult::Rebooting { until: None, .. } => Next::Wait(resync.min(Duration::from_secs(5))),
        PassResult::Rebooting {
            until: Some(until), ..
        } => Next::Wait(resync.min(Duration::from_secs(until.saturating_sub(now_unix).max(1)))),
    }
}

/// The reconcile loop, until the shutdown signal.
pub async fn run(agent: &mut Agent) -> Result<(), AgentError> {
    let mut stop = agent.shutdown().clone();
    let resync = agent.config().resync_interval;
    let mut health = HealthTimer::new(agent.config().health_interval);
    let mut failures = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
    // The last error logged: a failing pass is logged once, not on every retry.
    let mut last_error: Option<String> = None;
    let mut watches = open_watches(agent).await;
    let mut steps_watched = agent.watches_steps();
    loop {
        if agent.stopping() {
            return Ok(());
        }
        if agent.reload_asked() {
            tracing::info!("no run is going on: finishing up to start again with the new configuration");
            return Ok(());
        }
        let due = health.due();
        let wait = match agent.pass(due).await {
            Ok(result) => {
                agent.metrics().passed(&result, agent.journal().last_run.as_ref());
                if failures.succeed()
                    && let Some(e) = last_error.take()
                {
                    tracing::info!(was = %e, "passes work again");
                }
                let now = agent.clock_now();
                let next = after_pass(&result, due, &mut health, resync, now);
                if agent.watches_steps() != steps_watched {
                    // A composable rollout began (or ended): its phase grants are
                    // watched from now on (or no longer); the next pass reads
                    // afresh, since a grant may have changed unwatched.
                    watches = open_watches(agent).await;
                    steps_watched = agent.watches_steps();
                    agent.watches_reopened();
                    continue;
                }
                match next {
                    Next::Again => continue,
                    Next::Wait(d) => d,
                }
            }
            Err(e) => {
                pass_failed(agent, &e, &mut last_error);
                if due {
                    health.restart();
                }
                failures.fail_spread()
            }
        };
        tokio::select! {
            ev = watches.next() => watched(agent, &mut watches, ev).await,
            _ = files_or(agent.services_poll(), wait) => {}
            _ = stop.changed() => {}
            _ = agent.reload_changed() => {}
        }
    }
}

/// A pass that failed: counted, logged once until its error changes, and the
/// decision forgotten (the next pass decides again).
fn pass_failed(agent: &mut Agent, e: &AgentError, last_error: &mut Option<String>) {
    agent.metrics().pass_failed(e.store_unavailable());
    let msg = e.to_string();
    if last_error.as_ref() != Some(&msg) {
        if e.store_unavailable() {
            tracing::warn!(error = %e, "store unreachable; retrying");
        } else {
            tracing::error!(error = %e, "the pass failed; retrying with backoff");
        }
        *last_error = Some(msg);
    }
    agent.forget_decision();
}

/// Takes a watch event (and whatever else already arrived: one pass covers it
/// all); watches that failed or ended are opened again.
async fn watched(
    agent: &mut Agent,
    watches: &mut SelectAll<WatchStream>,
    ev: Option<<SelectAll<WatchStream> as futures_util::Stream>::Item>,
) {
    match ev {
        Some(Ok(ev)) => agent.watched(&ev),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "watch failed; reopening");
            agent.metrics().store_failed();
            tokio::time::sleep(Duration::from_millis(500)).await;
            *watches = open_watches(agent).await;
            agent.watches_reopened();
            agent.metrics().watches_reopened();
        }
        None => {
            *watches = open_watches(agent).await;
            agent.watches_reopened();
            agent.metrics().watches_reopened();
        }
    }
    // Drain whatever else already arrived: one pass covers it all.
    while let Some(Some(Ok(ev))) = futures_util::FutureExt::now_or_never(watches.next()) {
        agent.watched(&ev);
    }
}

/// How often a host with task files looks at them for a change while it waits.
const SERVICES_POLL: Duration = Duration::from_secs(5);

/// Sleeps `wait`, or less when the task files (`poll`: their directory and the
/// catalog they gave last) say something else now: the next pass publishes it.
async fn files_or(poll: Option<(std::path::PathBuf, Option<jio_common::phase::Catalog>)>, wait: Duration) {
    let Some((dir, last)) = poll else {
        return tokio::time::sleep(wait).await;
    };
    let until = Instant::now() + wait;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(SERVICES_POLL)).await;
        let dir2 = dir.clone();
        let now = tokio::task::spawn_blocking(move || crate::services::load(&dir2).catalog())
            .await
            .unwrap_or(None);
        if now != last {
            tracing::info!(dir = %dir.display(), "the task files changed");
            return;
        }
    }
}

/// Watches on every key that should wake the agent, retried with backoff until
/// they open (or the agent stops).
async fn open_watches(agent: &Agent) -> SelectAll<WatchStream> {
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
    let mut stop = agent.shutdown().clone();
    loop {
        let mut all = SelectAll::new();
        let mut failed = None;
        let mut keys = agent.subject().watched_keys();
        if agent.watches_steps() {
            keys.push(agent.subject().steps_watch());
        }
        // All on one stream: on etcd, one gRPC watch stream per agent.
        match agent.store().watch_many(&keys, 0).await {
            Ok(w) => all.push(w),
            Err(e) => failed = Some(e),
        }
        let Some(e) = failed else { return all };
        agent.metrics().store_failed();
        tracing::warn!(error = %e, "cannot open watches; retrying");
        tokio::select! {
            _ = tokio::time::sleep(backoff.fail_spread()) => {}
            _ = stop.changed() => return all,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jio_common::names::Version;

    #[tokio::test(start_paused = true)]
    async fn what_follows_a_pass() {
        let v = Version::new("v1").unwrap_or_else(|e| panic!("{e}"));
        let resync = Duration::from_secs(600);
        let mut h = HealthTimer::new(Duration::from_secs(60));
        let up = PassResult::Idle(Decision::UpToDate);
        assert_eq!(
            after_pass(&up, false, &mut h, resync, 0),
            Next::Wait(Duration::from_secs(60))
        );
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert!(h.due());
        let checked = PassResult::Checked {
            version: v.clone(),
            ok: true,
        };
        assert_eq!(after_pass(&checked, true, &mut h, resync, 0), Next::Again);
        assert!(!h.due(), "a check restarts the timer");
        let backoff = PassResult::Idle(Decision::Backoff {
            version: v.clone(),
            until: 130,
        });
        assert_eq!(
            after_pass(&backoff, false, &mut h, resync, 100),
            Next::Wait(Duration::from_secs(30))
        );
        let off = &mut HealthTimer::new(Duration::ZERO);
        assert_eq!(after_pass(&up, false, off, resync, 0), Next::Wait(resync));
        assert!(!off.due());
        // The soak wakes it when its check is due; never later than a resync, never
        // sooner than a second.
        let soaking = |check_at| {
            PassResult::Idle(Decision::Soaking {
                version: v.clone(),
                check_at,
            })
        };
        for (result, want) in [(soaking(102), 2), (soaking(90), 1), (soaking(100_000), 600)] {
            assert_eq!(
                after_pass(&result, false, off, resync, 100),
                Next::Wait(Duration::from_secs(want)),
                "{result:?}"
            );
        }
    }
}
