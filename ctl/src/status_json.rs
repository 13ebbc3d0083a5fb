//! `status --json`: the document written straight from the snapshot (typed, in
//! one pass, no intermediate tree), so that 10,000 hosts' detail costs a few
//! milliseconds rather than a copy of every value.

use std::collections::{BTreeMap, BTreeSet};

use jio_common::fleet::{self, HostStatus, Snapshot};
use jio_common::names::{HostName, Role, Version};
use jio_common::plan::Reason;
use jio_common::values::{AgentRecord, HostResult, Skew};
use serde::Serialize;
use serde::ser::{SerializeMap as _, Serializer};

use crate::status::{Admission, is_link, rollout_json, undriven_line, upgraded_without_agent};

/// The status document of `hosts` (all of the fleet, or one role's), with the
/// admission computed for the whole fleet. `lead` entries come first (the schema
/// number, a JSON line's type).
pub struct StatusJson<'a> {
    pub snap: &'a Snapshot,
    pub hosts: &'a [HostStatus],
    pub adm: &'a Admission,
    pub now_ms: u64,
    pub lead: Vec<(&'static str, serde_json::Value)>,
    /// Hosts at the same version whose package sets differ (`package_drift`).
    pub drift: Option<serde_json::Value>,
}

impl<'a> StatusJson<'a> {
    /// `status --json`'s document of `hosts` (classified from `snap`, admitted as
    /// `adm`), as of now, led by its schema.
    pub fn document(snap: &'a Snapshot, hosts: &'a [HostStatus], adm: &'a Admission) -> StatusJson<'a> {
        StatusJson {
            snap,
            hosts,
            adm,
            now_ms: jio_common::time::unix_now_ms(),
            lead: vec![("schema", crate::out::JSON_SCHEMA.into())],
            drift: None,
        }
    }

    /// Pretty (a document) or compact (a JSON line).
    pub fn render(&self, pretty: bool) -> String {
        let r = if pretty {
            serde_json::to_string_pretty(self)
        } else {
            serde_json::to_string(self)
        };
        // Serializing plain data to a string cannot fail; say so if it ever does.
        r.unwrap_or_else(|e| format!("{{\"error\":\"the status cannot be written as JSON: {e}\"}}"))
    }
}

impl Serialize for StatusJson<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let (snap, hosts, adm) = (self.snap, self.hosts, self.adm);
        let mut m = ser.serialize_map(None)?;
        for (k, v) in &self.lead {
            m.serialize_entry(k, v)?;
        }
        m.serialize_entry("current_version", &snap.current)?;
        for (state, roles) in fleet::by_state_and_role(hosts) {
            m.serialize_entry(state.as_str(), &roles)?;
        }
        let failures = |links: bool| -> BTreeMap<&HostName, &str> {
            snap.failures
                .iter()
                .filter(|(_, (_, l))| {
                    if links {
                        is_link(l)
                    } else {
                        !l.is_empty() && !is_link(l)
                    }
                })
                .map(|(h, (_, l))| (h, l.as_str()))
                .collect()
        };
        m.serialize_entry("failure_links", &failures(true))?;
        m.serialize_entry("failure_reasons", &failures(false))?;
        let reasons: BTreeMap<&HostName, &Reason> = hosts
            .iter()
            .filter_map(|h| adm.reasons.get(&h.host).map(|r| (&h.host, r)))
            .collect();
        m.serialize_entry("reasons", &reasons)?;
        m.serialize_entry("hosts", &Detail(self))?;
        if let Some(p) = &adm.problem {
            m.serialize_entry("rules_problem", p)?;
        }
        // A composable rollout's stages (`[{"name", "roles", "state", "phase",
        // "taking_part", "finished", "phases", "hosts", "left_behind"}]`) and its
        // finalize step.
        if let Some(c) = &adm.composed {
            m.serialize_entry("stages", &c.stages)?;
            m.serialize_entry("finalize", &c.finalize)?;
        }
        m.serialize_entry("lock", &snap.lock)?;
        m.serialize_entry("rollout", &rollout_json(snap))?;
        m.serialize_entry("drivers", &snap.drivers)?;
        m.serialize_entry("not_driven", &undriven_line(snap))?;
        m.serialize_entry("agents_down", &upgraded_without_agent(snap, hosts))?;
        m.serialize_entry("emergency_stop", &snap.halt.as_ref().map(|(by, _)| by))?;
        if let Some(d) = &self.drift {
            m.serialize_entry("package_drift", d)?;
        }
        if !snap.problems.is_empty() {
            m.serialize_entry("problems", &snap.problems)?;
        }
        m.end()
    }
}

/// Each host on its own, by name: where it stands, why, its agent, what it runs,
/// its last run and the log to read.
struct Detail<'a>(&'a StatusJson<'a>);

impl Serialize for Detail<'_> {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let doc = self.0;
        let mut sorted: Vec<&HostStatus> = doc.hosts.iter().collect();
        sorted.sort_by(|a, b| a.host.cmp(&b.host));
        sorted.dedup_by(|a, b| a.host == b.host);
        let mut m = ser.serialize_map(Some(sorted.len()))?;
        for h in sorted {
            m.serialize_entry(h.host.as_str(), &HostDetail::of(doc, h))?;
        }
        m.end()
    }
}

#[derive(Serialize)]
struct HostDetail<'a> {
    clock_skew: Option<SkewJson>,
    role: &'a Role,
    state: &'static str,
    reason: Option<ReasonJson<'a>>,
    agent: Option<AgentJson<'a>>,
    versions: Option<&'a BTreeSet<Version>>,
    last_run: Option<&'a HostResult>,
    log: Option<&'a str>,
    /// Its maintenance hook (`/hooks/<host>`), when it has a record.
    #[serde(skip_serializing_if = "Option::is_none")]
    hook: Option<&'a jio_common::hook_record::HookRecord>,
}

#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum SkewJson {
    AheadMs(u64),
    BehindMs(u64),
}

#[derive(Serialize)]
#[serde(untagged)]
enum ReasonJson<'a> {
    Planned(&'a Reason),
    Text { text: &'a str },
}

#[derive(Serialize)]
#[serde(untagged)]
enum AgentJson<'a> {
    Record(&'a AgentRecord),
    Unreadable { error: String },
}

impl<'a> HostDetail<'a> {
    fn of(doc: &'a StatusJson<'a>, h: &'a HostStatus) -> HostDetail<'a> {
        let snap = doc.snap;
        let result = snap.results.get(&h.host);
        // A failed hook's log (a link, or a path on its driver's host) first.
        let log = snap
            .hook_failure(&h.host)
            .and_then(|r| r.log.as_deref())
            .or_else(|| {
                snap.failures
                    .get(&h.host)
                    .map(|(_, l)| l.as_str())
                    .filter(|l| is_link(l))
                    .or_else(|| result.and_then(|r| r.log.as_deref()))
            });
        let agent = snap.agents.get(&h.host).map(|a| match a {
            Some(a) => AgentJson::Record(a),
            None => AgentJson::Unreadable {
                error: format!("/agents/{} cannot be read", h.host),
            },
        });
        let reason = doc
            .adm
            .reasons
            .get(&h.host)
            .map(ReasonJson::Planned)
            .or_else(|| h.reason.as_deref().map(|text| ReasonJson::Text { text }));
        let clock_skew = snap
            .clocks
            .get(&h.host)
            .and_then(|c| Skew::of(*c, doc.now_ms))
            .map(|s| match s {
                Skew::Ahead(ms) => SkewJson::AheadMs(ms),
                Skew::Behind(ms) => SkewJson::BehindMs(ms),
            });
        HostDetail {
            clock_skew,
            role: &h.role,
            state: h.state.as_str(),
            reason,
            agent,
            versions: snap.running.get(&h.host),
            last_run: result,
            log,
            hook: snap.hooks.get(&h.host),
        }
    }
}
