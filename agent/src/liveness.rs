//! The liveness record `/agents/<host>`, bound to a lease the agent keeps renewing,
//! so `jioctl` can tell a dead agent from a slow Puppet run.
//!
//! One task owns the lease: it renews every TTL/3, grants a new lease when the old
//! one ended (the store was unreachable for longer than the TTL), and rewrites the
//! record whenever it changes. It logs on change, not on every renewal.

use std::time::Duration;

use jio_common::keys::Key;
use jio_common::names::Version;
use jio_common::store::{DynStore, ErrorKind, LeaseId};
use jio_common::time::unix_now;
use jio_common::values::{AgentRecord, AgentState};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Handle on the liveness task.
pub struct Liveness {
    record: watch::Sender<AgentRecord>,
    task: JoinHandle<Option<LeaseId>>,
    stop: watch::Sender<bool>,
    store: DynStore,
}

impl Liveness {
    pub fn start(
        store: DynStore,
        key: Key,
        ttl: Duration,
        state: AgentState,
        version: Option<Version>,
    ) -> Liveness {
        let (record, rx) = watch::channel(AgentRecord {
            state,
            version,
            since: unix_now(),
            pid: std::process::id(),
        });
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(keep(store.clone(), key, ttl, rx, stop_rx));
        Liveness {
            record,
            task,
            stop,
            store,
        }
    }

    /// Updates the record (written at once when it changed).
    pub fn set(&self, state: AgentState, version: Option<Version>) {
        self.record.send_if_modified(|r| {
            if r.state == state && r.version == version {
                return false;
            }
            *r = AgentRecord {
                state,
                version,
                since: unix_now(),
                pid: r.pid,
            };
            true
        });
    }

    /// Stops renewing and revokes the lease, which deletes the record.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if let Ok(Some(lease)) = self.task.await {
            let _ = self.store.revoke_lease(&lease).await;
        }
    }
}

async fn keep(
    store: DynStore,
    key: Key,
    ttl: Duration,
    mut record: watch::Receiver<AgentRecord>,
    mut stop: watch::Receiver<bool>,
) -> Option<LeaseId> {
    let mut lease: Option<LeaseId> = None;
    let mut dirty = true;
    let mut failing = false;
    let period = ttl / 3;
    loop {
        let step: Result<(), jio_common::store::StoreError> = async {
            if lease.is_none() {
                lease = Some(store.grant_lease(ttl).await?.id);
                dirty = true;
            }
            if dirty {
                let value = serde_json::to_string(&*record.borrow_and_update()).unwrap_or_default();
                store.put(&key, &value, lease.as_ref()).await?;
                dirty = false;
            }
            Ok(())
        }
        .await;
        match step {
            Ok(()) if failing => {
                tracing::info!(key = %key, "liveness record restored");
                failing = false;
            }
            Ok(()) => {}
            Err(e) => {
                if e.kind() == ErrorKind::NotFound {
                    lease = None;
                }
                if !failing {
                    tracing::warn!(key = %key, error = %e, "cannot write the liveness record; retrying");
                    failing = true;
                }
            }
        }
        let wait = if failing {
            Duration::from_secs(1).min(period)
        } else {
            period
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {
                if let Some(l) = &lease && !failing {
                    match store.keep_alive(l).await {
                        Ok(_) => {}
                        Err(e) if e.kind() == ErrorKind::NotFound => {
                            tracing::warn!(key = %key, "liveness lease ended; granting a new one");
                            lease = None;
                        }
                        Err(e) => {
                            tracing::warn!(key = %key, error = %e, "cannot renew the liveness lease; retrying");
                            failing = true;
                        }
                    }
                }
            }
            changed = record.changed() => {
                if changed.is_err() {
                    return lease;
                }
                dirty = true;
            }
            _ = stop.changed() => return lease,
        }
    }
}
