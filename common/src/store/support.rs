//! What the backends share: endpoint rotation, deadlines and retries, the check of
//! a transaction's operations, prefix ranges, and the count of re-established
//! watches.

use std::time::Duration;

use super::api::{Op, short};

/// Watches re-established after their connection was lost, by every store of this
/// process (etcd's and Consul's reconnect by themselves): for the agent's metrics.
static WATCH_RECONNECTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many watches this process's stores re-established so far.
pub fn watch_reconnects() -> u64 {
    WATCH_RECONNECTS.load(std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn count_watch_reconnect() {
    WATCH_RECONNECTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// A number that differs from one client to the next (and one process to the next).
pub(crate) fn spread() -> usize {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as usize
}

/// The endpoints of a clustered store, tried in turn: one is current, and a failure
/// moves the client on to the next (unless another request already did).
pub(crate) struct Endpoints {
    urls: Vec<String>,
    current: std::sync::atomic::AtomicUsize,
    kind: &'static str,
}

impl Endpoints {
    pub(crate) fn new(urls: Vec<String>, kind: &'static str) -> Endpoints {
        // Each client starts at an endpoint of its own, so that a fleet's agents
        // spread over the members rather than all loading the first.
        let first = spread() % urls.len().max(1);
        Endpoints {
            urls,
            current: std::sync::atomic::AtomicUsize::new(first),
            kind,
        }
    }

    /// Every endpoint's URL.
    pub(crate) fn urls(&self) -> &[String] {
        &self.urls
    }

    /// How many endpoints there are.
    pub(crate) fn len(&self) -> usize {
        self.urls.len()
    }

    /// The current endpoint and its position.
    pub(crate) fn pick(&self) -> (usize, &str) {
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed) % self.urls.len();
        (i, &self.urls[i])
    }

    /// Moves on from endpoint `i` after it failed.
    pub(crate) fn fail_over(&self, i: usize, reason: &str) {
        use std::sync::atomic::Ordering;
        let next = (i + 1) % self.urls.len();
        if self.urls.len() > 1
            && self
                .current
                .compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(store = self.kind, from = %short(&self.urls[i]), to = %short(&self.urls[next]), %reason, "endpoint failed, switching");
        }
    }
}

/// The end of one operation's retry budget: the requests count against it too, so
/// an endpoint that accepts connections and never answers makes the operation fail
/// after about `budget`, not after `budget` plus every request's timeout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline(tokio::time::Instant);

impl Deadline {
    pub(crate) fn after(budget: Duration) -> Deadline {
        Deadline(tokio::time::Instant::now() + budget)
    }

    /// The timeout of the next attempt: at most `per_request`, at most what is left
    /// (but long enough to get an answer from a healthy store).
    pub(crate) fn attempt_timeout(&self, per_request: Duration) -> Duration {
        self.left().clamp(
            Duration::from_millis(100),
            per_request.max(Duration::from_millis(100)),
        )
    }

    pub(crate) fn left(&self) -> Duration {
        self.0.saturating_duration_since(tokio::time::Instant::now())
    }

    /// Another attempt may start.
    pub(crate) fn open(&self) -> bool {
        !self.left().is_zero()
    }
}

/// How one operation retries: quickly at first, for at most `budget` in all.
pub(crate) fn retry_policy(budget: Duration) -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(1))
        .with_jitter()
        .with_total_delay(Some(budget))
        .without_max_times()
}

/// etcd refuses a transaction that writes one key twice, or puts a key that a
/// delete of the same transaction also covers; the other backends refuse it too.
pub(crate) fn overlapping_ops(ops: &[Op]) -> Option<String> {
    let mut puts = std::collections::BTreeSet::new();
    let mut deletes: Vec<(&str, bool)> = Vec::new();
    for op in ops {
        match op {
            Op::Put { key, .. } => {
                if !puts.insert(key.as_str()) {
                    return Some(format!("duplicate key given in txn request: {key}"));
                }
            }
            Op::Delete(k) => deletes.push((k.as_str(), false)),
            Op::DeletePrefix(k) => deletes.push((k.as_str(), true)),
        }
    }
    for put in &puts {
        for (d, prefix) in &deletes {
            if (*prefix && put.starts_with(d)) || (!*prefix && put == d) {
                return Some(format!(
                    "duplicate key given in txn request: {put} is both put and deleted"
                ));
            }
        }
    }
    None
}

/// The smallest key greater than every key starting with `prefix` (etcd's `range_end`).
/// `None` means "no upper bound" (the prefix is empty or all 0xff bytes).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end(b"/a/"), Some(b"/a0".to_vec()));
        assert_eq!(prefix_end(b"/a\xff"), Some(b"/b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }
}
