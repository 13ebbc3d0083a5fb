//! The key schema: the one module that turns names into key strings and back.
//!
//! Keys are those of the original tool and its design documents, under an optional
//! namespace prefix (default none, so keys start at `/`). No other module formats or
//! splits a key; everything else holds [`Key`] values made here.

use std::fmt;

use crate::names::{HostName, Interface, NameError, Role, Version};

/// A store key: an absolute path starting with `/`.
///
/// Keys ending in `/` are used as prefixes (a directory in the original tool's terms).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(String);

/// A key or namespace prefix that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid key {value:?}: {rule}")]
pub struct KeyError {
    pub value: String,
    pub rule: &'static str,
}

impl Key {
    /// A raw key, for tools and tests that work below the schema (the store contract).
    /// It must start with `/` and hold no control characters.
    pub fn new(value: impl Into<String>) -> Result<Key, KeyError> {
        let value = value.into();
        let fail = |rule| {
            Err(KeyError {
                value: value.chars().take(120).collect(),
                rule,
            })
        };
        if !value.starts_with('/') {
            return fail("must start with '/'");
        }
        if value.chars().any(char::is_control) {
            return fail("must not contain control characters");
        }
        Ok(Key(value))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this key names a prefix (ends with `/`).
    pub fn is_prefix(&self) -> bool {
        self.0.ends_with('/')
    }

    /// Whether `self` lies under the prefix `prefix` (byte-wise, like the store's ranges).
    pub fn starts_with(&self, prefix: &Key) -> bool {
        self.0.starts_with(&prefix.0)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The two lifecycle steps that are tracked per version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    Configured,
    Validated,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Configured => "configured",
            Step::Validated => "validated",
        }
    }
    pub const ALL: [Step; 2] = [Step::Configured, Step::Validated];
}

/// Outcome of a lifecycle step. The per-version steps spell failure `failure`; the
/// provisioned step spells it `failed` (both as in the design document).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Success,
    Failure,
}

impl Outcome {
    pub const ALL: [Outcome; 2] = [Outcome::Success, Outcome::Failure];
}

/// Which `enable_puppet` key: the most specific one that is set decides.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EnableLevel {
    Host(HostName),
    Role(Role),
    Global,
}

impl fmt::Display for EnableLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnableLevel::Host(h) => write!(f, "host {h}"),
            EnableLevel::Role(r) => write!(f, "role {r}"),
            EnableLevel::Global => f.write_str("global"),
        }
    }
}

/// A key of the schema, parsed back into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    CurrentVersion,
    RunningVersion(Version, HostName),
    Enable(EnableLevel),
    Provisioned(Outcome, HostName),
    Status(Step, Outcome, Version, HostName),
    ActiveRole(Role, HostName, Interface),
    Host(HostName),
    Agent(HostName),
    /// A run that started and has not been seen to end (not bound to a lease).
    Run(HostName),
    /// `/running/clocks/<host>`: the agent's clock (Unix ms), bound to its lease.
    Clock(HostName),
    Lock(String),
    /// `/rollouts/current`: the id of the active rollout.
    CurrentRollout,
    /// `/rollouts/<id>`: a rollout's record (the id as written, checked by its reader).
    Rollout(String),
    /// `/drivers/<name>`: a driver service (`jioctl drive`) that is alive (leased).
    Driver(String),
    /// `/holds/host/<host>` or `/holds/role/<role>`: kept out of every rollout.
    Hold(HoldTarget),
    /// `/results/<host>`: how the host's last run ended.
    Result(HostName),
    /// `/hosts/<host>/services`: the host's service catalog (composable rollouts).
    Catalog(HostName),
    /// `/steps/roles/<role>`: the phase granted to the role's hosts.
    Grant(Role),
    /// `/steps/finalize`: the host that runs the finalize tasks.
    FinalizeGrant,
    /// `/status/steps/<rollout>/<phase>/<service>/<outcome>/<host>`: one service's
    /// step on one host (the rollout id and the phase as written).
    StepStatus(String, String, crate::names::Service, Outcome, HostName),
    /// `/config_state/commands/<host>`: the fleet commands the host is admitted to.
    CommandInbox(HostName),
    /// `/commands/<id>`: a fleet command's record.
    Command(crate::names::CommandId),
    /// `/command_runs/<id>/<part>/<host>`: a host's run of a command.
    CommandRun(crate::names::CommandId, crate::keys::RunPart, HostName),
    /// `/command_runs/<id>/lock`: the command's driver lock.
    CommandLock(crate::names::CommandId),
    /// `/hooks/<host>`: the host's maintenance hook around its slot.
    Hook(HostName),
    /// `/config_state/package_source`: the site's package snapshot template.
    PackageSource,
    /// `/packages/<digest>`: an installed package set, stored once per digest.
    PackageSet(String),
}

/// What a hold keeps out: one host, or every host of a role.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HoldTarget {
    Host(HostName),
    Role(Role),
}

impl fmt::Display for HoldTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldTarget::Host(h) => write!(f, "host {h}"),
            HoldTarget::Role(r) => write!(f, "role {r}"),
        }
    }
}

const CURRENT_VERSION: &str = "/current_version";
const RUNNING: &str = "/running/versions/";
const CLOCKS: &str = "/running/clocks/";
const ENABLE: &str = "/config_state/enable_puppet/";
const STATUS: &str = "/status/";
const ACTIVE_ROLES: &str = "/active_roles/";
const HOSTS: &str = "/hosts/";
const AGENTS: &str = "/agents/";
const RUNS: &str = "/runs/";
const LOCKS: &str = "/locks/";
const ROLLOUTS: &str = "/rollouts/";
const DRIVERS: &str = "/drivers/";
const HOLDS: &str = "/holds/";
const RESULTS: &str = "/results/";
const STEPS: &str = "/steps/";
const STEP_STATUS: &str = "/status/steps/";
const CONFIG_STATE: &str = "/config_state/";
const COMMAND_INBOX: &str = "/config_state/commands/";
const COMMANDS: &str = "/commands/";
const COMMAND_RUNS: &str = "/command_runs/";
const HOOKS: &str = "/hooks/";
const PACKAGE_SOURCE: &str = "/config_state/package_source";
const PACKAGES: &str = "/packages/";

/// A parser of the rest of a key, after its family's prefix.
type FamilyParser = fn(&str) -> Option<Parsed>;

/// The key families under the namespace, each with its parser: the first prefix a
/// key starts with decides (`/status/steps/` before `/status/`).
const FAMILIES: [(&str, FamilyParser); 21] = [
    (RUNNING, parse_running),
    (PACKAGE_SOURCE, |rest| {
        rest.is_empty().then_some(Parsed::PackageSource)
    }),
    (PACKAGES, |d| {
        (d.starts_with("sha256:") && d.len() == 71 && !d.contains('/'))
            .then(|| Parsed::PackageSet(d.to_string()))
    }),
    (COMMAND_INBOX, |h| {
        Some(Parsed::CommandInbox(HostName::new(h).ok()?))
    }),
    (COMMANDS, |id| {
        Some(Parsed::Command(crate::names::CommandId::parse(id)?))
    }),
    (COMMAND_RUNS, parse_command_run),
    (ENABLE, parse_enable),
    (STEP_STATUS, parse_step_status),
    (STEPS, parse_grant),
    (HOSTS, parse_host),
    (STATUS, parse_status),
    (ACTIVE_ROLES, parse_active_role),
    (AGENTS, |h| Some(Parsed::Agent(HostName::new(h).ok()?))),
    (RUNS, |h| Some(Parsed::Run(HostName::new(h).ok()?))),
    (CLOCKS, |h| Some(Parsed::Clock(HostName::new(h).ok()?))),
    (LOCKS, |l| {
        (!l.is_empty() && !l.contains('/')).then(|| Parsed::Lock(l.to_string()))
    }),
    (ROLLOUTS, parse_rollout),
    (DRIVERS, |d| {
        (!d.is_empty() && !d.contains('/')).then(|| Parsed::Driver(d.to_string()))
    }),
    (HOLDS, parse_hold),
    (RESULTS, |h| Some(Parsed::Result(HostName::new(h).ok()?))),
    (HOOKS, |h| Some(Parsed::Hook(HostName::new(h).ok()?))),
];

fn parse_running(r: &str) -> Option<Parsed> {
    let [v, h] = split_n::<2>(r)?;
    Some(Parsed::RunningVersion(
        Version::new(v).ok()?,
        HostName::new(h).ok()?,
    ))
}

fn parse_command_run(r: &str) -> Option<Parsed> {
    let (id, tail) = r.split_once('/')?;
    let id = crate::names::CommandId::parse(id)?;
    if tail == "lock" {
        return Some(Parsed::CommandLock(id));
    }
    let [part, h] = split_n::<2>(tail)?;
    Some(Parsed::CommandRun(
        id,
        RunPart::parse(part)?,
        HostName::new(h).ok()?,
    ))
}

fn parse_enable(r: &str) -> Option<Parsed> {
    if r == "global" {
        return Some(Parsed::Enable(EnableLevel::Global));
    }
    let [level, name] = split_n::<2>(r)?;
    match level {
        "role" => Some(Parsed::Enable(EnableLevel::Role(Role::new(name).ok()?))),
        "host" => Some(Parsed::Enable(EnableLevel::Host(HostName::new(name).ok()?))),
        _ => None,
    }
}

fn parse_outcome(o: &str, failure: &str) -> Option<Outcome> {
    match o {
        "success" => Some(Outcome::Success),
        f if f == failure => Some(Outcome::Failure),
        _ => None,
    }
}

fn parse_step_status(r: &str) -> Option<Parsed> {
    let [id, phase, service, o, h] = split_n::<5>(r)?;
    let outcome = parse_outcome(o, "failure")?;
    crate::phase::parse_phase(phase)?;
    Some(Parsed::StepStatus(
        id.to_string(),
        phase.to_string(),
        crate::names::Service::new(service).ok()?,
        outcome,
        HostName::new(h).ok()?,
    ))
}

fn parse_grant(r: &str) -> Option<Parsed> {
    if r == "finalize" {
        return Some(Parsed::FinalizeGrant);
    }
    let role = r.strip_prefix("roles/")?;
    Some(Parsed::Grant(Role::new(role).ok()?))
}

/// `/hosts/<host>` (the registry) or `/hosts/<host>/services` (its catalog).
fn parse_host(r: &str) -> Option<Parsed> {
    match r.strip_suffix("/services") {
        Some(h) => Some(Parsed::Catalog(HostName::new(h).ok()?)),
        None => Some(Parsed::Host(HostName::new(r).ok()?)),
    }
}

fn parse_status(r: &str) -> Option<Parsed> {
    if let Some(p) = r.strip_prefix("provisioned/") {
        let [o, h] = split_n::<2>(p)?;
        return Some(Parsed::Provisioned(
            parse_outcome(o, "failed")?,
            HostName::new(h).ok()?,
        ));
    }
    let [step, o, v, h] = split_n::<4>(r)?;
    let step = match step {
        "configured" => Step::Configured,
        "validated" => Step::Validated,
        _ => return None,
    };
    let outcome = parse_outcome(o, "failure")?;
    Some(Parsed::Status(
        step,
        outcome,
        Version::new(v).ok()?,
        HostName::new(h).ok()?,
    ))
}

fn parse_active_role(r: &str) -> Option<Parsed> {
    let [role, h, i] = split_n::<3>(r)?;
    Some(Parsed::ActiveRole(
        Role::new(role).ok()?,
        HostName::new(h).ok()?,
        Interface::new(i).ok()?,
    ))
}

fn parse_rollout(r: &str) -> Option<Parsed> {
    match r {
        "current" => Some(Parsed::CurrentRollout),
        _ => (!r.is_empty() && !r.contains('/')).then(|| Parsed::Rollout(r.to_string())),
    }
}

fn parse_hold(r: &str) -> Option<Parsed> {
    let [level, name] = split_n::<2>(r)?;
    match level {
        "host" => Some(Parsed::Hold(HoldTarget::Host(HostName::new(name).ok()?))),
        "role" => Some(Parsed::Hold(HoldTarget::Role(Role::new(name).ok()?))),
        _ => None,
    }
}

/// The prefixes, under the namespace, that an agent writes: all the `jio-agent`
/// etcd role of `packaging/etcd-roles.sh` may write (and the Consul policy in
/// docs/tls-and-users.md), everything else being the operators'.
pub const AGENT_WRITES: [&str; 9] = [
    STATUS,
    "/running/",
    HOSTS,
    AGENTS,
    ACTIVE_ROLES,
    RUNS,
    RESULTS,
    COMMAND_RUNS,
    PACKAGES,
];

/// The key schema under one namespace prefix.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Schema {
    ns: String,
}

impl Schema {
    /// `prefix` is empty (keys start at `/`) or an absolute path such as `/jio` or
    /// `/sites/bom1`; a trailing `/` is ignored.
    pub fn new(prefix: &str) -> Result<Schema, KeyError> {
        let trimmed = prefix.trim_end_matches('/');
        if trimmed.is_empty() {
            return Ok(Schema::default());
        }
        let fail = |rule| {
            Err(KeyError {
                value: prefix.to_string(),
                rule,
            })
        };
        if !trimmed.starts_with('/') {
            return fail("a namespace prefix must start with '/'");
        }
        for part in trimmed[1..].split('/') {
            if part.is_empty() {
                return fail("a namespace prefix must not contain '//'");
            }
            if part == "." || part == ".." {
                return fail("a namespace prefix must not contain '.' or '..' segments");
            }
            if part.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return fail("a namespace prefix must not contain whitespace or control characters");
            }
        }
        Ok(Schema {
            ns: trimmed.to_string(),
        })
    }

    /// The namespace prefix, empty for none.
    pub fn prefix(&self) -> &str {
        &self.ns
    }

    fn key(&self, parts: &[&str]) -> Key {
        let mut s = String::with_capacity(self.ns.len() + 64);
        s.push_str(&self.ns);
        for p in parts {
            s.push_str(p);
        }
        Key(s)
    }

    /// Everything this schema owns (for watching the whole namespace).
    pub fn root(&self) -> Key {
        self.key(&["/"])
    }

    pub fn current_version(&self) -> Key {
        self.key(&[CURRENT_VERSION])
    }

    /// Prefix of every running-version entry.
    pub fn running_versions(&self) -> Key {
        self.key(&[RUNNING])
    }

    /// Prefix of the hosts running `v`.
    pub fn running_version(&self, v: &Version) -> Key {
        self.key(&[RUNNING, v.as_str(), "/"])
    }

    pub fn running_version_host(&self, v: &Version, h: &HostName) -> Key {
        self.key(&[RUNNING, v.as_str(), "/", h.as_str()])
    }

    /// Prefix of the agents' clocks.
    pub fn clocks(&self) -> Key {
        self.key(&[CLOCKS])
    }

    /// The host's agent's clock: its Unix time in milliseconds, written with its
    /// liveness lease when it starts and every `values::CLOCK_REFRESH`, so readers
    /// can tell a skewed clock. No watcher wakes on it.
    pub fn clock(&self, h: &HostName) -> Key {
        self.key(&[CLOCKS, h.as_str()])
    }

    /// Prefix of every `enable_puppet` key.
    pub fn enable_root(&self) -> Key {
        self.key(&[ENABLE])
    }

    /// Prefix of every role key (`role: true`) or every host key (`role: false`).
    pub fn enable_level_prefix(&self, role: bool) -> Key {
        self.key(&[ENABLE, if role { "role/" } else { "host/" }])
    }

    pub fn enable(&self, level: &EnableLevel) -> Key {
        match level {
            EnableLevel::Global => self.key(&[ENABLE, "global"]),
            EnableLevel::Role(r) => self.key(&[ENABLE, "role/", r.as_str()]),
            EnableLevel::Host(h) => self.key(&[ENABLE, "host/", h.as_str()]),
        }
    }

    /// Prefix of the whole lifecycle tree.
    pub fn status_root(&self) -> Key {
        self.key(&[STATUS])
    }

    pub fn provisioned(&self, outcome: Outcome, h: &HostName) -> Key {
        let o = match outcome {
            Outcome::Success => "provisioned/success/",
            Outcome::Failure => "provisioned/failed/",
        };
        self.key(&[STATUS, o, h.as_str()])
    }

    /// Prefix of one step's entries of one outcome, every version.
    pub fn status_prefix(&self, step: Step, outcome: Outcome) -> Key {
        self.key(&[STATUS, step.as_str(), "/", per_version_outcome(outcome), "/"])
    }

    /// Prefix of one step's entries of one outcome for one version.
    pub fn status_version_prefix(&self, step: Step, outcome: Outcome, v: &Version) -> Key {
        self.key(&[
            STATUS,
            step.as_str(),
            "/",
            per_version_outcome(outcome),
            "/",
            v.as_str(),
            "/",
        ])
    }

    pub fn status(&self, step: Step, outcome: Outcome, v: &Version, h: &HostName) -> Key {
        self.key(&[
            STATUS,
            step.as_str(),
            "/",
            per_version_outcome(outcome),
            "/",
            v.as_str(),
            "/",
            h.as_str(),
        ])
    }

    pub fn active_roles(&self) -> Key {
        self.key(&[ACTIVE_ROLES])
    }

    /// Prefix of one host's published addresses.
    pub fn active_role_host(&self, r: &Role, h: &HostName) -> Key {
        self.key(&[ACTIVE_ROLES, r.as_str(), "/", h.as_str(), "/"])
    }

    pub fn active_role(&self, r: &Role, h: &HostName, i: &Interface) -> Key {
        self.key(&[ACTIVE_ROLES, r.as_str(), "/", h.as_str(), "/", i.as_str()])
    }

    pub fn hosts(&self) -> Key {
        self.key(&[HOSTS])
    }

    pub fn host(&self, h: &HostName) -> Key {
        self.key(&[HOSTS, h.as_str()])
    }

    pub fn agents(&self) -> Key {
        self.key(&[AGENTS])
    }

    pub fn agent(&self, h: &HostName) -> Key {
        self.key(&[AGENTS, h.as_str()])
    }

    /// Prefix of the run markers.
    pub fn runs(&self) -> Key {
        self.key(&[RUNS])
    }

    /// The host's run marker: written when a run starts (with its liveness record,
    /// fenced), deleted once the agent has seen it end. Unlike the liveness record it
    /// outlives a frozen or dead agent, so the host keeps its slot meanwhile.
    pub fn run(&self, h: &HostName) -> Key {
        self.key(&[RUNS, h.as_str()])
    }

    /// Prefix of the rollout records (and of `/rollouts/current`).
    pub fn rollouts(&self) -> Key {
        self.key(&[ROLLOUTS])
    }

    /// A rollout's record (`rollout::RolloutRecord`, JSON).
    pub fn rollout(&self, id: &crate::rollout::RolloutId) -> Key {
        self.key(&[ROLLOUTS, id.as_str()])
    }

    /// Prefix of the driver services' leased records.
    pub fn drivers(&self) -> Key {
        self.key(&[DRIVERS])
    }

    /// A driver service's leased record (`fleet::LockRecord`, JSON).
    pub fn driver(&self, name: &str) -> Key {
        self.key(&[DRIVERS, name])
    }

    /// The id of the active rollout, when there is one.
    pub fn current_rollout(&self) -> Key {
        self.key(&[ROLLOUTS, "current"])
    }

    /// Prefix of every lock.
    pub fn locks(&self) -> Key {
        self.key(&[LOCKS])
    }

    /// A named lock (for example the one `jioctl upgrade` holds while it drives).
    pub fn lock(&self, name: &str) -> Key {
        self.key(&[LOCKS, name])
    }

    /// Prefix of every hold.
    pub fn holds(&self) -> Key {
        self.key(&[HOLDS])
    }

    /// A hold (`values::HoldRecord`, JSON).
    pub fn hold(&self, t: &HoldTarget) -> Key {
        match t {
            HoldTarget::Host(h) => self.key(&[HOLDS, "host/", h.as_str()]),
            HoldTarget::Role(r) => self.key(&[HOLDS, "role/", r.as_str()]),
        }
    }

    /// Prefix of the hosts' last-run results.
    pub fn results(&self) -> Key {
        self.key(&[RESULTS])
    }

    /// The host's last-run result (`values::HostResult`, JSON).
    pub fn result(&self, h: &HostName) -> Key {
        self.key(&[RESULTS, h.as_str()])
    }

    /// A host's service catalog (`phase::Catalog`, JSON), written by its agent.
    pub fn catalog(&self, h: &HostName) -> Key {
        self.key(&[HOSTS, h.as_str(), "/services"])
    }

    /// Prefix of everything that says what hosts may do: the enable keys and the
    /// fleet commands' admissions (one listing reads both).
    pub fn config_state(&self) -> Key {
        self.key(&[CONFIG_STATE])
    }

    /// Prefix of the fleet commands' admissions.
    pub fn command_inboxes(&self) -> Key {
        self.key(&[COMMAND_INBOX])
    }

    /// The fleet commands a host is admitted to (`command_record::Inbox`, JSON), written
    /// by the commands' drivers.
    pub fn command_inbox(&self, h: &HostName) -> Key {
        self.key(&[COMMAND_INBOX, h.as_str()])
    }

    /// Prefix of the fleet commands' records.
    pub fn commands(&self) -> Key {
        self.key(&[COMMANDS])
    }

    /// A fleet command's record (`command_record::CommandRecord`, JSON).
    pub fn command(&self, id: &crate::names::CommandId) -> Key {
        self.key(&[COMMANDS, id.as_str()])
    }

    /// Prefix of everything of one command's runs: its driver's lock and each
    /// host's start, result and log.
    pub fn command_runs(&self, id: &crate::names::CommandId) -> Key {
        self.key(&[COMMAND_RUNS, id.as_str(), "/"])
    }

    /// The leased lock of whoever drives the command.
    pub fn command_lock(&self, id: &crate::names::CommandId) -> Key {
        self.key(&[COMMAND_RUNS, id.as_str(), "/lock"])
    }

    /// A host's run of a command: `started` (written when its agent starts it),
    /// `results` (how it ended) or `logs` (the link to its output in Swift).
    pub fn command_run(&self, id: &crate::names::CommandId, part: crate::keys::RunPart, h: &HostName) -> Key {
        self.key(&[COMMAND_RUNS, id.as_str(), "/", part.as_str(), "/", h.as_str()])
    }

    /// Prefix of the hosts' maintenance hooks.
    pub fn hooks(&self) -> Key {
        self.key(&[HOOKS])
    }

    /// The host's maintenance hook (`hook_record::HookRecord`, JSON), written only by
    /// the rollout's driver, fenced like an enable key.
    pub fn hook(&self, h: &HostName) -> Key {
        self.key(&[HOOKS, h.as_str()])
    }

    /// The site's package snapshot template (one sources line with `{version}`),
    /// written by `jioctl repo set`; under `config_state`, so the agent's one
    /// listing of what hosts may do reads it too.
    pub fn package_source(&self) -> Key {
        self.key(&[PACKAGE_SOURCE])
    }

    /// Prefix of the stored package sets.
    pub fn package_sets(&self) -> Key {
        self.key(&[PACKAGES])
    }

    /// One installed package set (`packages::PackageSet`'s stored form) under its
    /// digest, written by the first agent that has it and never changed after.
    pub fn package_set(&self, digest: &str) -> Key {
        self.key(&[PACKAGES, digest])
    }

    /// Prefix of the phase grants of composable rollouts (written by the driver).
    pub fn steps(&self) -> Key {
        self.key(&[STEPS])
    }

    /// The phase granted to the hosts of `role` (`phase::Grant`, JSON).
    pub fn grant(&self, role: &Role) -> Key {
        self.key(&[STEPS, "roles/", role.as_str()])
    }

    /// The host that runs the finalize tasks (`phase::FinalizeGrant`, JSON).
    pub fn finalize_grant(&self) -> Key {
        self.key(&[STEPS, "finalize"])
    }

    /// Prefix of the step statuses of the rollout `id`.
    pub fn step_statuses(&self, id: &str) -> Key {
        self.key(&[STEP_STATUS, id, "/"])
    }

    /// One service's step (`pre-1`, `post-3`, `finalize`) on one host, in rollout `id`.
    pub fn step_status(
        &self,
        id: &str,
        phase: &str,
        service: &crate::names::Service,
        outcome: Outcome,
        h: &HostName,
    ) -> Key {
        self.key(&[
            STEP_STATUS,
            id,
            "/",
            phase,
            "/",
            service.as_str(),
            "/",
            per_version_outcome(outcome),
            "/",
            h.as_str(),
        ])
    }

    /// Parses a key of this schema back into its parts; `None` for keys outside the
    /// schema or with invalid names (another tool's keys are ignored, not errors).
    pub fn parse(&self, key: &Key) -> Option<Parsed> {
        let rest = key.as_str().strip_prefix(self.ns.as_str())?;
        if rest == CURRENT_VERSION {
            return Some(Parsed::CurrentVersion);
        }
        let (prefix, parse) = FAMILIES.iter().find(|(p, _)| rest.starts_with(p))?;
        parse(&rest[prefix.len()..])
    }
}

fn per_version_outcome(o: Outcome) -> &'static str {
    match o {
        Outcome::Success => "success",
        Outcome::Failure => "failure",
    }
}

/// Splits `s` into exactly `N` non-empty `/`-separated parts.
fn split_n<const N: usize>(s: &str) -> Option<[&str; N]> {
    let mut out = [""; N];
    let mut it = s.split('/');
    for slot in out.iter_mut() {
        *slot = it.next().filter(|p| !p.is_empty())?;
    }
    it.next().is_none().then_some(out)
}

/// Converts a name error into the key error callers of raw paths see.
impl From<NameError> for KeyError {
    fn from(e: NameError) -> Self {
        KeyError {
            value: e.value,
            rule: "contains an invalid name",
        }
    }
}

/// The parts of a host's run of a command, under `/command_runs/<id>/<part>/<host>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RunPart {
    /// Written by the agent in the transaction that starts the action.
    Started,
    /// How it ended (`CommandResult`).
    Results,
    /// The link to its output in Swift (empty until uploaded).
    Logs,
}

impl RunPart {
    pub fn as_str(self) -> &'static str {
        match self {
            RunPart::Started => "started",
            RunPart::Results => "results",
            RunPart::Logs => "logs",
        }
    }

    pub fn parse(s: &str) -> Option<RunPart> {
        match s {
            "started" => Some(RunPart::Started),
            "results" => Some(RunPart::Results),
            "logs" => Some(RunPart::Logs),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> HostName {
        HostName::new(s).unwrap()
    }
    fn v(s: &str) -> Version {
        Version::new(s).unwrap()
    }
    fn r(s: &str) -> Role {
        Role::new(s).unwrap()
    }

    #[test]
    fn keys_match_the_design_documents() {
        let s = Schema::default();
        let table: Vec<(Key, &str)> = vec![
            (s.current_version(), "/current_version"),
            (
                s.running_version_host(&v("v2"), &h("compute1")),
                "/running/versions/v2/compute1",
            ),
            (s.running_version(&v("v2")), "/running/versions/v2/"),
            (
                s.enable(&EnableLevel::Global),
                "/config_state/enable_puppet/global",
            ),
            (
                s.enable(&EnableLevel::Role(r("compute"))),
                "/config_state/enable_puppet/role/compute",
            ),
            (
                s.enable(&EnableLevel::Host(h("compute1"))),
                "/config_state/enable_puppet/host/compute1",
            ),
            (
                s.provisioned(Outcome::Success, &h("c1")),
                "/status/provisioned/success/c1",
            ),
            (
                s.provisioned(Outcome::Failure, &h("c1")),
                "/status/provisioned/failed/c1",
            ),
            (
                s.status(Step::Configured, Outcome::Success, &v("v2"), &h("c1")),
                "/status/configured/success/v2/c1",
            ),
            (
                s.status(Step::Configured, Outcome::Failure, &v("v2"), &h("c1")),
                "/status/configured/failure/v2/c1",
            ),
            (
                s.status(Step::Validated, Outcome::Success, &v("v2"), &h("c1")),
                "/status/validated/success/v2/c1",
            ),
            (
                s.status(Step::Validated, Outcome::Failure, &v("v2"), &h("c1")),
                "/status/validated/failure/v2/c1",
            ),
            (
                s.active_role(&r("compute"), &h("c1"), &Interface::new("eth0").unwrap()),
                "/active_roles/compute/c1/eth0",
            ),
            (s.host(&h("c1")), "/hosts/c1"),
            (s.agent(&h("c1")), "/agents/c1"),
            (s.lock("rollout"), "/locks/rollout"),
            (s.hold(&HoldTarget::Host(h("c1"))), "/holds/host/c1"),
            (s.hold(&HoldTarget::Role(r("compute"))), "/holds/role/compute"),
            (s.result(&h("c1")), "/results/c1"),
            (s.hook(&h("c1")), "/hooks/c1"),
            (s.hooks(), "/hooks/"),
        ];
        for (key, want) in &table {
            assert_eq!(key.as_str(), *want);
        }
    }

    #[test]
    fn namespace_prefix_is_prepended() {
        let s = Schema::new("/sites/bom1/").unwrap();
        assert_eq!(s.current_version().as_str(), "/sites/bom1/current_version");
        assert_eq!(s.root().as_str(), "/sites/bom1/");
        assert_eq!(Schema::new("").unwrap(), Schema::default());
        assert_eq!(Schema::new("/").unwrap(), Schema::default());
        for bad in ["jio", "/a//b", "/a/../b", "/a b", "/a\n"] {
            assert!(Schema::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parse_round_trips_every_key() {
        for ns in ["", "/jio"] {
            let s = Schema::new(ns).unwrap();
            let cases = vec![
                (s.current_version(), Parsed::CurrentVersion),
                (
                    s.running_version_host(&v("v2"), &h("c1")),
                    Parsed::RunningVersion(v("v2"), h("c1")),
                ),
                (
                    s.enable(&EnableLevel::Global),
                    Parsed::Enable(EnableLevel::Global),
                ),
                (
                    s.enable(&EnableLevel::Role(r("db"))),
                    Parsed::Enable(EnableLevel::Role(r("db"))),
                ),
                (
                    s.enable(&EnableLevel::Host(h("c1"))),
                    Parsed::Enable(EnableLevel::Host(h("c1"))),
                ),
                (
                    s.provisioned(Outcome::Failure, &h("c1")),
                    Parsed::Provisioned(Outcome::Failure, h("c1")),
                ),
                (
                    s.hold(&HoldTarget::Host(h("c1"))),
                    Parsed::Hold(HoldTarget::Host(h("c1"))),
                ),
                (
                    s.hold(&HoldTarget::Role(r("db"))),
                    Parsed::Hold(HoldTarget::Role(r("db"))),
                ),
                (s.result(&h("c1")), Parsed::Result(h("c1"))),
                (s.hook(&h("c1")), Parsed::Hook(h("c1"))),
                (
                    s.status(Step::Validated, Outcome::Failure, &v("v3"), &h("c1")),
                    Parsed::Status(Step::Validated, Outcome::Failure, v("v3"), h("c1")),
                ),
                (
                    s.active_role(&r("db"), &h("c1"), &Interface::new("eth1").unwrap()),
                    Parsed::ActiveRole(r("db"), h("c1"), Interface::new("eth1").unwrap()),
                ),
                (s.host(&h("c1")), Parsed::Host(h("c1"))),
                (s.agent(&h("c1")), Parsed::Agent(h("c1"))),
                (s.run(&h("c1")), Parsed::Run(h("c1"))),
                (s.clock(&h("c1")), Parsed::Clock(h("c1"))),
                (s.lock("rollout"), Parsed::Lock("rollout".into())),
                (s.current_rollout(), Parsed::CurrentRollout),
                (
                    s.rollout(&crate::rollout::RolloutId::parse("20261123T020000Z-v2").unwrap()),
                    Parsed::Rollout("20261123T020000Z-v2".into()),
                ),
                (s.driver("mgmt1-42"), Parsed::Driver("mgmt1-42".into())),
            ];
            for (key, want) in cases {
                assert_eq!(s.parse(&key), Some(want), "{key}");
            }
        }
    }

    #[test]
    fn parse_ignores_foreign_and_malformed_keys() {
        let s = Schema::default();
        for k in [
            "/other",
            "/running/versions/v2",
            "/running/versions/v2/c1/extra",
            "/running/versions//c1",
            "/config_state/enable_puppet/zone/a",
            "/status/configured/maybe/v2/c1",
            "/status/provisioned/success/",
            "/hosts/",
            "/hooks/",
            "/hooks/c1/before",
        ] {
            assert_eq!(s.parse(&Key::new(k).unwrap()), None, "{k}");
        }
        let ns = Schema::new("/jio").unwrap();
        assert_eq!(ns.parse(&Key::new("/current_version").unwrap()), None);
    }

    #[test]
    fn raw_keys_are_checked() {
        assert!(Key::new("/a/b").is_ok());
        assert_eq!(Key::new("a").unwrap_err().rule, "must start with '/'");
        assert!(Key::new("/a\nb").is_err());
    }

    #[test]
    fn the_roles_script_grants_the_agent_what_it_writes() {
        let script = include_str!("../../packaging/etcd-roles.sh");
        let line = script
            .lines()
            .find_map(|l| l.strip_prefix("AGENT_WRITES=\""))
            .and_then(|l| l.strip_suffix('"'))
            .expect("the AGENT_WRITES line of etcd-roles.sh");
        assert_eq!(line.split(' ').collect::<Vec<_>>(), AGENT_WRITES);
        assert!(RUNNING.starts_with(AGENT_WRITES[1]));
        assert!(CLOCKS.starts_with(AGENT_WRITES[1]));
    }
}
