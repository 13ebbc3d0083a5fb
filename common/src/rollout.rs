//! A rollout as a record in the store: `/rollouts/<id>` holds it as JSON and
//! `/rollouts/current` names the active one. This module is pure: the record, its
//! states, the transitions that operators and drivers make, and which finished
//! rollouts history keeps. The transactions that write them belong to `jioctl`.
//!
//! States: `running`, `paused` (reason, by whom, optional expiry), `stuck` (the
//! hosts that hold it and why), and the ends `done`, `failed` (hosts and reasons)
//! and `aborted`. Every change is appended to `changes` with who and when.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::names::Version;
use crate::time::utc_stamp;

/// Finished rollouts kept as history; older ones are deleted.
pub const KEEP_HISTORY: usize = 100;

/// A rollout's id: its start (`YYYYMMDDTHHMMSSZ`, so ids sort by time) and version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RolloutId(String);

impl RolloutId {
    pub fn new(started: u64, version: &Version) -> RolloutId {
        RolloutId(format!("{}-{version}", utc_stamp(started)))
    }

    /// An id read from the store: a stamp, a dash and a version.
    pub fn parse(s: &str) -> Option<RolloutId> {
        let (stamp, version) = s.split_once('-')?;
        let stamp_ok = stamp.len() == 16
            && stamp.ends_with('Z')
            && stamp.chars().filter(|c| !c.is_ascii_digit()).eq(['T', 'Z']);
        (stamp_ok && Version::new(version).is_ok()).then(|| RolloutId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RolloutId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a rollout stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RolloutState {
    Running,
    /// No host is admitted; hosts in flight finish. `until`: Unix time it resumes.
    Paused {
        reason: Option<String>,
        by: String,
        until: Option<u64>,
    },
    /// No host finished within the progress deadline: the hosts that hold it, and why.
    Stuck {
        holding: BTreeMap<String, String>,
    },
    Done,
    /// Hosts failed: each with its reason.
    Failed {
        hosts: BTreeMap<String, String>,
    },
    /// Ended by an operator (or by another rollout that replaced it, or by the
    /// emergency stop); the fleet is left mixed and safe.
    Aborted {
        by: String,
        reason: Option<String>,
        /// The rollout that replaced this one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        superseded_by: Option<RolloutId>,
        /// Ended by `global-disable-puppet`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        emergency: bool,
    },
}

impl RolloutState {
    pub fn name(&self) -> &'static str {
        match self {
            RolloutState::Running => "running",
            RolloutState::Paused { .. } => "paused",
            RolloutState::Stuck { .. } => "stuck",
            RolloutState::Done => "done",
            RolloutState::Failed { .. } => "failed",
            RolloutState::Aborted { .. } => "aborted",
        }
    }

    /// Still to be driven (running, paused or stuck), not ended.
    pub fn active(&self) -> bool {
        matches!(
            self,
            RolloutState::Running | RolloutState::Paused { .. } | RolloutState::Stuck { .. }
        )
    }
}

/// One change of state: to what, by whom, when, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub state: String,
    pub by: String,
    pub at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The record at `/rollouts/<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub id: RolloutId,
    pub version: Version,
    /// The desired version before this rollout (what `undo` goes back to).
    pub previous: Option<Version>,
    /// The rules as validated when the rollout was created (the rules' JSON).
    pub rules: serde_json::Value,
    #[serde(flatten)]
    pub state: RolloutState,
    pub changes: Vec<Change>,
    /// The canary phase is over: by `jioctl rollout promote`, by the canaries
    /// staying healthy for `canary_soak`, or from the start (an undo).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted: Option<Change>,
    /// When the driver first saw every canary finished and healthy (its clock):
    /// `canary_soak` counts from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canaries_done_at: Option<u64>,
    /// A composable rollout's stages started so far, in order (`jioctl upgrade
    /// --stage`); empty: every stage (or not a composable rollout).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<String>,
    /// The operator went ahead with `--force` although the rules' intent was unclear
    /// (`rules::check_intent`): drivers drive it as written. Otherwise every driver
    /// checks it again on every pass, and a rollout whose rules no longer say
    /// clearly what they limit admits nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forced: bool,
}

/// A change the rollout's state does not allow, naming both.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rollout {id} is {state}: it cannot be {action}")]
pub struct TransitionError {
    pub id: RolloutId,
    pub state: &'static str,
    pub action: &'static str,
}

impl RolloutRecord {
    /// A new rollout to `version`, running.
    pub fn start(
        version: Version,
        previous: Option<Version>,
        rules: serde_json::Value,
        by: &str,
        now: u64,
    ) -> RolloutRecord {
        RolloutRecord {
            id: RolloutId::new(now, &version),
            version,
            previous,
            rules,
            state: RolloutState::Running,
            changes: vec![change("running", by, now, None)],
            promoted: None,
            canaries_done_at: None,
            stages: Vec::new(),
            forced: false,
        }
    }

    fn to(&self, state: RolloutState, by: &str, now: u64, reason: Option<String>) -> RolloutRecord {
        let mut r = self.clone();
        r.changes.push(change(state.name(), by, now, reason));
        r.state = state;
        r
    }

    fn refuse(&self, action: &'static str) -> TransitionError {
        TransitionError {
            id: self.id.clone(),
            state: self.state.name(),
            action,
        }
    }

    /// Stops admitting hosts (running or stuck rollouts), until resumed or `until`.
    pub fn pause(
        &self,
        by: &str,
        reason: Option<String>,
        until: Option<u64>,
        now: u64,
    ) -> Result<RolloutRecord, TransitionError> {
        match self.state {
            RolloutState::Running | RolloutState::Stuck { .. } => {
                let paused = RolloutState::Paused {
                    reason: reason.clone(),
                    by: by.to_string(),
                    until,
                };
                Ok(self.to(paused, by, now, reason))
            }
            _ => Err(self.refuse("paused")),
        }
    }

    /// Goes on with the same rules (a paused or stuck rollout).
    pub fn resume(&self, by: &str, now: u64) -> Result<RolloutRecord, TransitionError> {
        match self.state {
            RolloutState::Paused { .. } | RolloutState::Stuck { .. } => {
                Ok(self.to(RolloutState::Running, by, now, None))
            }
            _ => Err(self.refuse("resumed")),
        }
    }

    /// A pause whose expiry has passed resumes by itself (`None`: nothing to do).
    pub fn pause_expired(&self, now: u64) -> Option<RolloutRecord> {
        match &self.state {
            RolloutState::Paused { until: Some(t), .. } if now >= *t => {
                let reason = Some("the pause expired".to_string());
                Some(self.to(RolloutState::Running, "jioctl", now, reason))
            }
            _ => None,
        }
    }

    /// Ends an active rollout where it stands.
    pub fn abort(
        &self,
        by: &str,
        reason: Option<String>,
        now: u64,
    ) -> Result<RolloutRecord, TransitionError> {
        self.end_as(by, reason, None, false, now)
    }

    /// Ends an active rollout because `next` replaces it.
    pub fn supersede(&self, by: &str, next: &RolloutId, now: u64) -> Result<RolloutRecord, TransitionError> {
        let reason = Some(format!("superseded by rollout {next}"));
        self.end_as(by, reason, Some(next.clone()), false, now)
    }

    /// Ends an active rollout by the emergency stop (`global-disable-puppet`).
    pub fn emergency_stop(&self, by: &str, now: u64) -> Result<RolloutRecord, TransitionError> {
        let reason = Some("emergency stop (global-disable-puppet)".to_string());
        self.end_as(by, reason, None, true, now)
    }

    fn end_as(
        &self,
        by: &str,
        reason: Option<String>,
        superseded_by: Option<RolloutId>,
        emergency: bool,
        now: u64,
    ) -> Result<RolloutRecord, TransitionError> {
        if !self.state.active() {
            return Err(self.refuse("aborted"));
        }
        let aborted = RolloutState::Aborted {
            by: by.to_string(),
            reason: reason.clone(),
            superseded_by,
            emergency,
        };
        Ok(self.to(aborted, by, now, reason))
    }

    /// A stuck rollout whose hosts move again (a host finished): running again.
    pub fn unstuck(&self, by: &str, now: u64) -> Option<RolloutRecord> {
        matches!(self.state, RolloutState::Stuck { .. })
            .then(|| self.to(RolloutState::Running, by, now, Some("a host finished".into())))
    }

    /// The driver saw no host finish within the progress deadline.
    pub fn stuck(
        &self,
        holding: BTreeMap<String, String>,
        by: &str,
        now: u64,
    ) -> Result<RolloutRecord, TransitionError> {
        match self.state {
            RolloutState::Running => {
                let why = format!("{} host(s) hold it", holding.len());
                Ok(self.to(RolloutState::Stuck { holding }, by, now, Some(why)))
            }
            _ => Err(self.refuse("marked stuck")),
        }
    }

    /// The driver's end of a running rollout: done, or failed with its hosts.
    pub fn finish(
        &self,
        failed: BTreeMap<String, String>,
        by: &str,
        now: u64,
    ) -> Result<RolloutRecord, TransitionError> {
        if !matches!(self.state, RolloutState::Running | RolloutState::Stuck { .. }) {
            return Err(self.refuse("finished"));
        }
        let end = if failed.is_empty() {
            RolloutState::Done
        } else {
            RolloutState::Failed { hosts: failed }
        };
        Ok(self.to(end, by, now, None))
    }

    /// A new rollout back to the previous version with the same rules (an ended
    /// rollout only: an active one is paused or aborted first).
    pub fn undo(&self, by: &str, now: u64) -> Result<RolloutRecord, TransitionError> {
        let Some(previous) = self.previous.clone().filter(|_| !self.state.active()) else {
            let mut e = self.refuse("undone");
            if self.previous.is_none() {
                e.state = "the first rollout (no previous version)";
            }
            return Err(e);
        };
        let mut back =
            RolloutRecord::start(previous, Some(self.version.clone()), self.rules.clone(), by, now);
        back.forced = self.forced;
        // Going back to a version the fleet ran: no canary phase.
        back.promoted = Some(change("promoted", by, now, Some(format!("undo of {}", self.id))));
        Ok(back)
    }

    /// Records that every canary finished healthy at `now` (once; cleared by
    /// nothing: a canary that fails afterwards stops the rollout anyway).
    pub fn canaries_done(&self, now: u64) -> Option<RolloutRecord> {
        (self.canaries_done_at.is_none() && self.state.active()).then(|| {
            let mut r = self.clone();
            r.canaries_done_at = Some(now);
            r
        })
    }

    /// Ends the canary phase (a running, paused or stuck rollout not yet promoted).
    pub fn promote(
        &self,
        by: &str,
        reason: Option<String>,
        now: u64,
    ) -> Result<RolloutRecord, TransitionError> {
        if !self.state.active() {
            return Err(self.refuse("promoted"));
        }
        if self.promoted.is_some() {
            let mut e = self.refuse("promoted");
            e.state = "already promoted";
            return Err(e);
        }
        if self.rules.get("canary").is_none() {
            let mut e = self.refuse("promoted");
            e.state = "without a canary rule (nothing waits for a promotion)";
            return Err(e);
        }
        let mut r = self.clone();
        let c = change("promoted", by, now, reason);
        r.changes.push(c.clone());
        r.promoted = Some(c);
        Ok(r)
    }

    /// Who started it.
    pub fn started_by(&self) -> &str {
        self.changes.first().map_or("unknown", |c| c.by.as_str())
    }

    /// When it started (Unix time).
    pub fn started_at(&self) -> u64 {
        self.changes.first().map_or(0, |c| c.at)
    }

    /// When its state last changed (Unix time).
    pub fn changed_at(&self) -> u64 {
        self.changes.last().map_or(0, |c| c.at)
    }

    /// The short digest of its rules (`digest`).
    pub fn rules_digest(&self) -> String {
        digest(&self.rules)
    }

    /// How long it ran: from its start to its last change.
    pub fn duration_s(&self) -> u64 {
        let first = self.changes.first().map_or(0, |c| c.at);
        let last = self.changes.last().map_or(first, |c| c.at);
        last.saturating_sub(first)
    }
}

fn change(state: &str, by: &str, at: u64, reason: Option<String>) -> Change {
    Change {
        state: state.to_string(),
        by: by.to_string(),
        at,
        reason,
    }
}

/// A short, stable digest of rules JSON (FNV-1a over its canonical text: keys
/// sorted, no spaces), to tell two rule sets apart at a glance.
pub fn digest(rules: &serde_json::Value) -> String {
    // Over the keys in sorted order: the same rules in another order (or as kept
    // before `serde_json` kept the order written) are the same rules.
    fn canonical(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(o) => {
                let mut keys: Vec<&String> = o.keys().collect();
                keys.sort();
                serde_json::Value::Object(keys.into_iter().map(|k| (k.clone(), canonical(&o[k]))).collect())
            }
            serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(canonical).collect()),
            other => other.clone(),
        }
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canonical(rules).to_string().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:012x}", h >> 16)
}

/// The finished rollouts history no longer keeps: all but the newest
/// `KEEP_HISTORY`, never the current one.
pub fn beyond_history(ids: &[RolloutId], current: Option<&RolloutId>) -> Vec<RolloutId> {
    let mut ended: Vec<&RolloutId> = ids.iter().filter(|id| Some(*id) != current).collect();
    ended.sort();
    let drop = ended.len().saturating_sub(KEEP_HISTORY);
    ended.into_iter().take(drop).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::new(s).expect("version")
    }

    fn started() -> RolloutRecord {
        let rules = serde_json::json!({"rolling_rules": {"roles": {"compute": 2}}});
        RolloutRecord::start(v("v2"), Some(v("v1")), rules, "alice@laptop", 1_800_000_000)
    }

    #[test]
    fn ids_sort_by_time_and_parse_back() {
        let a = RolloutId::new(1_800_000_000, &v("v2"));
        let b = RolloutId::new(1_800_000_060, &v("v1"));
        assert_eq!(a.as_str(), "20270115T080000Z-v2");
        assert!(a < b);
        assert_eq!(RolloutId::parse(a.as_str()), Some(a));
        for bad in ["current", "2027-v2", "20270115T080000Z-", "20270115X080000Z-v2"] {
            assert_eq!(RolloutId::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn transitions_and_their_refusals() {
        let r = started();
        let paused = r
            .pause("bob", Some("night".into()), Some(1_800_003_600), 1_800_000_100)
            .unwrap();
        assert_eq!(paused.state.name(), "paused");
        assert_eq!(
            paused.pause("bob", None, None, 1).unwrap_err().to_string(),
            "rollout 20270115T080000Z-v2 is paused: it cannot be paused"
        );
        assert_eq!(paused.pause_expired(1_800_003_599), None);
        assert_eq!(
            paused.pause_expired(1_800_003_600).unwrap().state,
            RolloutState::Running
        );
        let resumed = paused.resume("bob", 1_800_000_200).unwrap();
        assert!(
            resumed.resume("bob", 1).is_err(),
            "a running rollout is not resumed"
        );
        let holding = BTreeMap::from([("compute3".to_string(), "lost".to_string())]);
        let stuck = resumed.stuck(holding, "driver", 1_800_003_800).unwrap();
        assert!(stuck.state.active());
        let aborted = stuck
            .abort("carol", Some("bad build".into()), 1_800_004_000)
            .unwrap();
        assert!(!aborted.state.active());
        assert!(aborted.abort("carol", None, 1).is_err());
        assert!(aborted.pause("carol", None, None, 1).is_err());
        let names: Vec<&str> = aborted.changes.iter().map(|c| c.state.as_str()).collect();
        assert_eq!(names, ["running", "paused", "running", "stuck", "aborted"]);
        assert_eq!(aborted.duration_s(), 4_000);
    }

    #[test]
    fn promotion_ends_the_canary_phase_once() {
        let plain = started();
        let e = plain.promote("bob", None, 5).unwrap_err().to_string();
        assert!(e.contains("without a canary rule"), "{e}");
        let mut canary = started();
        canary.rules = serde_json::json!({"canary": 1});
        let p = canary.promote("bob", Some("looks fine".into()), 5).unwrap();
        assert_eq!(p.promoted.as_ref().map(|c| c.by.as_str()), Some("bob"));
        assert_eq!(p.changes.last().unwrap().state, "promoted");
        assert!(
            p.promote("bob", None, 6)
                .unwrap_err()
                .to_string()
                .contains("already promoted")
        );
        let done = p.finish(BTreeMap::new(), "driver", 7).unwrap();
        assert!(
            done.promote("bob", None, 8).is_err(),
            "an ended rollout is not promoted"
        );
        // An undo starts promoted: no canary phase going back.
        let back = done.undo("bob", 9).unwrap();
        assert!(back.promoted.is_some());
    }

    #[test]
    fn finish_and_undo() {
        let r = started();
        assert!(r.undo("bob", 1).is_err(), "an active rollout is not undone");
        assert_eq!(
            r.finish(BTreeMap::new(), "driver", 2).unwrap().state,
            RolloutState::Done
        );
        let failed = r
            .finish(
                BTreeMap::from([("compute2".to_string(), "puppet exited 4".to_string())]),
                "driver",
                2,
            )
            .unwrap();
        assert_eq!(failed.state.name(), "failed");
        let back = failed.undo("bob", 1_800_001_000).unwrap();
        assert_eq!(
            (back.version.as_str(), back.previous.as_ref().map(Version::as_str)),
            ("v1", Some("v2"))
        );
        assert_eq!(back.rules, r.rules);
        assert_eq!(back.state, RolloutState::Running);
        let first = RolloutRecord::start(v("v1"), None, serde_json::json!({}), "bob", 5);
        let done = first.finish(BTreeMap::new(), "driver", 6).unwrap();
        assert!(
            done.undo("bob", 7)
                .unwrap_err()
                .to_string()
                .contains("no previous version")
        );
    }

    #[test]
    fn the_json_record() {
        let r = started()
            .pause("bob", Some("night".into()), None, 1_800_000_100)
            .unwrap();
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["id"], "20270115T080000Z-v2");
        assert_eq!(j["state"], "paused");
        assert_eq!(j["by"], "bob");
        assert_eq!(j["previous"], "v1");
        assert_eq!(j["rules"]["rolling_rules"]["roles"]["compute"], 2);
        assert_eq!(j["changes"][1]["reason"], "night");
        let back: RolloutRecord = serde_json::from_value(j).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn supersede_emergency_unstuck_and_digest() {
        let r = started();
        let next = RolloutId::new(1_800_000_500, &v("v3"));
        let s = r.supersede("bob", &next, 1_800_000_500).unwrap();
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(
            (j["state"].as_str(), j["superseded_by"].as_str()),
            (Some("aborted"), Some(next.as_str()))
        );
        assert!(j.get("emergency").is_none());
        let e = r.emergency_stop("carol", 1_800_000_600).unwrap();
        assert!(matches!(e.state, RolloutState::Aborted { emergency: true, .. }));
        assert!(
            e.emergency_stop("carol", 1).is_err(),
            "an ended rollout stays ended"
        );
        let holding = BTreeMap::from([("compute3".to_string(), "lost".to_string())]);
        let stuck = r.stuck(holding, "driver", 1_800_003_700).unwrap();
        assert_eq!(r.unstuck("driver", 1), None, "a running rollout is not stuck");
        let again = stuck.unstuck("driver", 1_800_003_900).unwrap();
        assert_eq!(again.state, RolloutState::Running);
        assert_eq!(
            stuck
                .finish(BTreeMap::new(), "driver", 1_800_004_000)
                .unwrap()
                .state,
            RolloutState::Done
        );
        // Same rules, same digest, whatever the key order; other rules, another.
        let a = serde_json::from_str(r#"{"a":1,"b":{"c":2}}"#).unwrap();
        let b = serde_json::from_str(r#"{ "b": {"c": 2}, "a": 1 }"#).unwrap();
        let c = serde_json::from_str(r#"{"a":2,"b":{"c":2}}"#).unwrap();
        assert_eq!(digest(&a), digest(&b));
        assert_ne!(digest(&a), digest(&c));
        assert_eq!(digest(&a).len(), 12);
        assert_eq!((r.started_by(), r.started_at()), ("alice@laptop", 1_800_000_000));
    }

    #[test]
    fn history_keeps_the_newest_hundred_and_the_current() {
        let ids: Vec<RolloutId> = (0..105)
            .map(|i| RolloutId::new(1_800_000_000 + i * 60, &v("v2")))
            .collect();
        let gone = beyond_history(&ids, Some(&ids[0]));
        // 104 ended ones: the 4 oldest of them go; the current (oldest id) stays.
        assert_eq!(gone, ids[1..5].to_vec());
        assert!(beyond_history(&ids[..100], None).is_empty());
    }
}
