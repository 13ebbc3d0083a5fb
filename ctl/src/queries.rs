//! The read-only commands of the original tool: running versions, hosts at a
//! version, verify-hosts, check-single-version, get-failures.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead as _;

use jio_common::fleet::Snapshot;
use jio_common::keys::Schema;
use jio_common::names::{HostName, Version};
use jio_common::store::DynStore;
use serde_json::json;

use crate::cli::exit;

/// Reads a snapshot and reports every value it could not understand (by key) on
/// stderr; the rest is used as it is.
async fn read(store: &DynStore, schema: &Schema) -> anyhow::Result<Snapshot> {
    let snap = Snapshot::read(store, schema).await?;
    for p in &snap.problems {
        eprintln!("jioctl: warning: {p}");
    }
    Ok(snap)
}

fn versions(snap: &Snapshot) -> BTreeMap<Version, Vec<HostName>> {
    let mut out: BTreeMap<Version, Vec<HostName>> = BTreeMap::new();
    for (h, vs) in &snap.running {
        for v in vs {
            out.entry(v.clone()).or_default().push(h.clone());
        }
    }
    out
}

pub async fn running_versions(store: &DynStore, schema: &Schema, as_json: bool) -> anyhow::Result<u8> {
    let snap = read(store, schema).await?;
    let v = versions(&snap);
    if as_json {
        println!("{}", json!(v));
    } else {
        for (version, hosts) in &v {
            println!("{version}\t{} host(s)", hosts.len());
        }
    }
    Ok(exit::OK)
}

pub async fn hosts_at_version(
    store: &DynStore,
    schema: &Schema,
    v: &Version,
    as_json: bool,
) -> anyhow::Result<u8> {
    let listing = store.list(&schema.running_version(v)).await?;
    let hosts: Vec<String> = listing
        .kvs
        .iter()
        .filter_map(|kv| match schema.parse(&kv.key) {
            Some(jio_common::keys::Parsed::RunningVersion(_, h)) => Some(h.to_string()),
            _ => None,
        })
        .collect();
    if as_json {
        println!("{}", json!(hosts));
    } else {
        for h in hosts {
            println!("{h}");
        }
    }
    Ok(exit::OK)
}

/// Exit 0 only when every named host runs `v`; the others are printed.
pub async fn verify_hosts(
    store: &DynStore,
    schema: &Schema,
    v: &Version,
    hosts: Vec<String>,
    as_json: bool,
) -> anyhow::Result<u8> {
    let names = if hosts.is_empty() {
        let mut from_stdin = Vec::new();
        for line in std::io::stdin().lock().lines() {
            from_stdin.extend(line?.split_whitespace().map(String::from));
        }
        from_stdin
    } else {
        hosts
    };
    let mut wanted = BTreeSet::new();
    for n in names {
        match HostName::new(n) {
            Ok(h) => {
                wanted.insert(h);
            }
            Err(e) => {
                eprintln!("jioctl: {e}");
                return Ok(exit::USAGE);
            }
        }
    }
    let at: BTreeSet<HostName> = store
        .list(&schema.running_version(v))
        .await?
        .kvs
        .iter()
        .filter_map(|kv| match schema.parse(&kv.key) {
            Some(jio_common::keys::Parsed::RunningVersion(_, h)) => Some(h),
            _ => None,
        })
        .collect();
    let missing: Vec<&HostName> = wanted.iter().filter(|h| !at.contains(*h)).collect();
    if as_json {
        println!(
            "{}",
            json!({"version": v, "all_at_version": missing.is_empty(), "not_at_version": missing})
        );
    } else if missing.is_empty() {
        println!("true");
    } else {
        println!("false");
        for h in &missing {
            eprintln!("{h} is not at {v}");
        }
    }
    Ok(if missing.is_empty() {
        exit::OK
    } else {
        exit::FAILED
    })
}

/// Exit 0 when `v` is the only version any host runs.
pub async fn check_single_version(
    store: &DynStore,
    schema: &Schema,
    v: &Version,
    as_json: bool,
) -> anyhow::Result<u8> {
    let snap = read(store, schema).await?;
    let others: BTreeMap<Version, Vec<HostName>> =
        versions(&snap).into_iter().filter(|(x, _)| x != v).collect();
    if as_json {
        println!(
            "{}",
            json!({"version": v, "single": others.is_empty(), "other_versions": others})
        );
    } else if others.is_empty() {
        println!("true");
    } else {
        println!("false");
        for (x, hosts) in &others {
            eprintln!("{} host(s) at {x}", hosts.len());
        }
    }
    Ok(if others.is_empty() { exit::OK } else { exit::FAILED })
}

/// Failed hosts of the current version; exit 1 when there are any.
pub async fn get_failures(
    store: &DynStore,
    schema: &Schema,
    hosts: bool,
    as_json: bool,
) -> anyhow::Result<u8> {
    let snap = read(store, schema).await?;
    let f = &snap.failures;
    if as_json {
        let v: BTreeMap<&str, serde_json::Value> = f
            .iter()
            .map(|(h, (step, link))| {
                (
                    h.as_str(),
                    json!({"role": snap.role_of(h), "step": step.as_str(), "link": link}),
                )
            })
            .collect();
        println!("{}", json!(v));
    } else if hosts {
        for (h, (step, value)) in f {
            println!(
                "{h}\t{}\t{}\t{}",
                snap.role_of(h),
                step.as_str(),
                crate::status::describe_entry(value)
            );
        }
    } else {
        let mut by_role: BTreeMap<String, usize> = BTreeMap::new();
        for h in f.keys() {
            *by_role.entry(snap.role_of(h).to_string()).or_default() += 1;
        }
        println!("{} failed host(s)", f.len());
        for (r, n) in by_role {
            println!("  {r}: {n}");
        }
    }
    Ok(if f.is_empty() { exit::OK } else { exit::FAILED })
}

/// Prints the run log linked from the host's status entry for `version` (default
/// the current one), of `phase` when given.
pub async fn logs(
    store: &DynStore,
    schema: &Schema,
    client: &jio_common::swift::SwiftClient,
    host: &HostName,
    version: Option<Version>,
    phase: Option<&str>,
) -> anyhow::Result<u8> {
    use jio_common::keys::{Outcome, Step};
    use std::io::Write as _;
    let version = match version {
        Some(v) => v,
        None => match store.get(&schema.current_version()).await? {
            Some(kv) => match jio_common::values::parse_version(&kv)? {
                Some(v) => v,
                None => {
                    eprintln!("jioctl: /current_version is empty; give --version");
                    return Ok(exit::FAILED);
                }
            },
            None => {
                eprintln!("jioctl: /current_version is not set; give --version");
                return Ok(exit::FAILED);
            }
        },
    };
    let mut found = None;
    for step in Step::ALL {
        if phase.is_some_and(|p| p != step.as_str()) {
            continue;
        }
        for outcome in Outcome::ALL {
            let key = schema.status(step, outcome, &version, host);
            if let Some(kv) = store.get(&key).await? {
                found = Some(kv);
            }
        }
    }
    let Some(kv) = found else {
        eprintln!(
            "jioctl: {host} has no {}status entry for {version}",
            phase.map(|p| format!("{p} ")).unwrap_or_default()
        );
        return Ok(exit::FAILED);
    };
    if kv.not_text {
        eprintln!(
            "jioctl: {} holds a value that is not UTF-8 text ({})",
            kv.key, kv.value
        );
        return Ok(exit::FAILED);
    }
    if !kv.value.is_empty() && !crate::status::is_link(&kv.value) {
        eprintln!(
            "jioctl: {} has no log link; the agent reported: {}",
            kv.key, kv.value
        );
        return Ok(exit::FAILED);
    }
    if kv.value.is_empty() {
        eprintln!(
            "jioctl: {} has no log link yet (the upload is still queued on the host, or Swift is not configured there)",
            kv.key
        );
        return Ok(exit::FAILED);
    }
    match client.fetch(&kv.value).await {
        Ok(body) => {
            std::io::stdout().write_all(&body)?;
            Ok(exit::OK)
        }
        Err(e) => {
            eprintln!("jioctl: {e}");
            Ok(exit::FAILED)
        }
    }
}
