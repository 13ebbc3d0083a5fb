//! What the VM scenarios judge by, read from evidence our programs do not keep: the
//! guests' console markers (stamped by the host's clock as they arrived) and the
//! stand-in hooks' own log (`start|end <hook> <host> <version> <unix seconds>`,
//! written with `date +%s.%N`). Pure functions from those to intervals, and the
//! overlaps between intervals; the tests assert on them.

use crate::vm::console::{Marker, unix};

/// A stretch of host time of one host.
#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    pub host: String,
    pub start: f64,
    /// `f64::INFINITY` while it has not ended.
    pub end: f64,
}

impl Interval {
    /// Whether `t` lies within (ends included).
    pub fn holds(&self, t: f64) -> bool {
        self.start <= t && t <= self.end
    }
}

/// One run of a hook, from its log lines.
#[derive(Debug, Clone, PartialEq)]
pub struct HookRun {
    pub hook: String,
    pub host: String,
    pub version: String,
    pub start: f64,
    pub end: Option<f64>,
}

/// The hook runs of a log, in the order they started. A line that is not the
/// stand-in's is a test failure (the log is the test's own).
pub fn hook_runs(log: &str) -> Vec<HookRun> {
    let mut runs: Vec<HookRun> = Vec::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [what, hook, host, version, at] = f[..] else {
            panic!("not a hook log line: {line:?}")
        };
        let at: f64 = at.parse().unwrap_or_else(|_| panic!("no time in {line:?}"));
        match what {
            "start" => runs.push(HookRun {
                hook: hook.into(),
                host: host.into(),
                version: version.into(),
                start: at,
                end: None,
            }),
            "end" => {
                let run = runs
                    .iter_mut()
                    .rev()
                    .find(|r| r.hook == hook && r.host == host && r.end.is_none())
                    .unwrap_or_else(|| panic!("an end without a start: {line:?}"));
                run.end = Some(at);
            }
            _ => panic!("not a hook log line: {line:?}"),
        }
    }
    runs
}

/// Each host's maintenance slot at `version`: from the start of its `before` hook
/// to the end of its `after` hook (open while `after` has not ended).
pub fn slots(runs: &[HookRun], version: &str) -> Vec<Interval> {
    let mut out = Vec::new();
    for before in runs.iter().filter(|r| r.hook == "before" && r.version == version) {
        let end = runs
            .iter()
            .find(|r| {
                r.hook == "after" && r.host == before.host && r.version == version && r.start >= before.start
            })
            .and_then(|r| r.end)
            .unwrap_or(f64::INFINITY);
        out.push(Interval {
            host: before.host.clone(),
            start: before.start,
            end,
        });
    }
    out
}

/// Every pair of intervals of different hosts that share a moment.
pub fn overlaps(intervals: &[Interval]) -> Vec<(Interval, Interval)> {
    let mut out = Vec::new();
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            if a.host != b.host && a.start <= b.end && b.start <= a.end {
                out.push((a.clone(), b.clone()));
            }
        }
    }
    out
}

/// One reboot of a guest, seen on its console.
#[derive(Debug, Clone, PartialEq)]
pub struct Reboot {
    pub old_boot: String,
    pub new_boot: String,
    /// From its `shutdown` marker (or, without one, its last marker of the old
    /// boot) to the `boot` marker of the new boot.
    pub down: Interval,
    /// The first `validated` marker of the new boot.
    pub validated: Option<f64>,
}

/// The reboots of guest `host` whose new boot came after `since` (host time).
pub fn reboots(host: &str, markers: &[Marker], since: f64) -> Vec<Reboot> {
    let boots: Vec<&Marker> = markers.iter().filter(|m| m.event == "boot").collect();
    let mut out = Vec::new();
    for pair in boots.windows(2) {
        let (old, new) = (pair[0], pair[1]);
        if old.boot_id == new.boot_id || unix(new.at) < since {
            continue;
        }
        let of_old = |event: Option<&str>| {
            markers
                .iter()
                .filter(|m| m.boot_id == old.boot_id && event.is_none_or(|e| m.event == e))
                .map(|m| unix(m.at))
                .reduce(f64::max)
        };
        let start = of_old(Some("shutdown")).or(of_old(None)).unwrap_or(unix(old.at));
        let validated = markers
            .iter()
            .find(|m| m.event == "validated" && m.boot_id == new.boot_id)
            .map(|m| unix(m.at));
        out.push(Reboot {
            old_boot: old.boot_id.clone(),
            new_boot: new.boot_id.clone(),
            down: Interval {
                host: host.into(),
                start,
                end: unix(new.at),
            },
            validated,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn m(at: u64, event: &str, boot: &str) -> Marker {
        Marker {
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(at),
            event: event.into(),
            words: vec![],
            boot_id: boot.into(),
        }
    }

    fn iv(host: &str, start: f64, end: f64) -> Interval {
        Interval {
            host: host.into(),
            start,
            end,
        }
    }

    #[test]
    fn hook_logs_make_slots_and_an_unfinished_one_stays_open() {
        let log = "start before c1 v2 10.0\nend before c1 v2 12.0\nstart after c1 v2 50.0\nend after c1 v2 51.5\nstart before c2 v2 52.0\nend before c2 v2 53.0\n";
        let runs = hook_runs(log);
        assert_eq!(runs.len(), 3);
        assert_eq!(
            slots(&runs, "v2"),
            vec![iv("c1", 10.0, 51.5), iv("c2", 52.0, f64::INFINITY)]
        );
        assert!(slots(&runs, "v3").is_empty());
    }

    #[test]
    fn overlaps_are_found_between_hosts_only() {
        let cases: &[(&[Interval], usize)] = &[
            (&[iv("a", 0.0, 10.0), iv("b", 10.5, 20.0)], 0),
            (&[iv("a", 0.0, 10.0), iv("b", 9.0, 20.0)], 1),
            (&[iv("a", 0.0, 10.0), iv("a", 5.0, 20.0)], 0),
            (
                &[
                    iv("a", 0.0, f64::INFINITY),
                    iv("b", 100.0, 120.0),
                    iv("c", 1.0, 2.0),
                ],
                2,
            ),
        ];
        for (intervals, n) in cases {
            assert_eq!(overlaps(intervals).len(), *n, "{intervals:?}");
        }
    }

    #[test]
    fn a_reboot_runs_from_the_old_boots_shutdown_to_the_new_boot() {
        let markers = [
            m(1, "boot", "A"),
            m(5, "validated", "A"),
            m(20, "validated", "A"),
            m(30, "shutdown", "A"),
            m(60, "boot", "B"),
            m(90, "validated", "B"),
            m(200, "boot", "C"),
        ];
        let r = reboots("c1", &markers, 0.0);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].old_boot.as_str(), r[0].new_boot.as_str()), ("A", "B"));
        assert_eq!(r[0].down, iv("c1", 30.0, 60.0));
        assert_eq!(r[0].validated, Some(90.0));
        // No shutdown marker (the machine lost power): down from its last marker.
        assert_eq!(r[1].down, iv("c1", 90.0, 200.0));
        assert_eq!(r[1].validated, None);
        assert_eq!(reboots("c1", &markers, 100.0).len(), 1);
    }
}
