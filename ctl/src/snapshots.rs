//! A version's package snapshot, checked before a command writes the version: the
//! site's template (`/config_state/package_source`), and the snapshot's
//! `InRelease` (else `Release`) fetched with `[repo]`'s settings. A version whose
//! snapshot is missing or unreadable is refused, naming the URL and the HTTP
//! status; `--force` skips the fetch and says so. Sites without a template are
//! not checked.

use jio_common::keys::{Parsed, Schema};
use jio_common::names::Version;
use jio_common::packages::{PackageSnapshot, SourceTemplate, redact_userinfo, release_problem};
use jio_common::store::{DynStore, Op, StoreError, Txn};

use crate::config::RepoSettings;
use crate::context::Context;
use crate::exit::{Failure, Outcome};

/// The site's template, if one is set; a stored one that cannot be used is an
/// error naming the key and how to mend it.
pub async fn template(store: &DynStore, schema: &Schema) -> Result<Option<SourceTemplate>, Failure> {
    let key = schema.package_source();
    let Some(kv) = store.get(&key).await? else {
        return Ok(None);
    };
    let text = jio_common::values::text(&kv).map_err(Failure::usage)?;
    SourceTemplate::parse(text).map(Some).map_err(|e| {
        Failure::usage(format!(
            "key {key}: {e}; nothing was written (set a valid one with `jioctl repo set`, or remove it with `jioctl repo unset`)"
        ))
    })
}

/// Fetches the snapshot's release file: `Ok` with the URL that answered, or why
/// not, naming each URL tried and what it answered.
pub async fn fetch_release(settings: &RepoSettings, snap: &PackageSnapshot) -> Result<String, String> {
    let client =
        jio_common::store::http_client(&settings.tls, settings.timeout).map_err(|e| format!("[repo] {e}"))?;
    let mut tried = Vec::new();
    for url in snap.release_urls() {
        let answer = match client.get(&url).send().await {
            Ok(r) if r.status().is_success() => match r.text().await {
                Ok(text) => match release_problem(snap, &text) {
                    None => return Ok(redact_userinfo(&url)),
                    Some(p) => format!("HTTP 200 but {p}"),
                },
                Err(e) => format!("HTTP 200 but the body could not be read: {}", chain(&e)),
            },
            Ok(r) => format!("HTTP {}", r.status()),
            Err(e) if e.is_timeout() => format!(
                "no answer within {}",
                jio_common::duration::format(settings.timeout)
            ),
            Err(e) => chain(&e),
        };
        tried.push(format!("{url}: {answer}"));
    }
    Err(redact_userinfo(&tried.join("; ")))
}

/// An error and its causes on one line (reqwest's top line says little).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let c_text = c.to_string();
        if !s.contains(&c_text) {
            s.push_str(": ");
            s.push_str(&c_text);
        }
        src = c.source();
    }
    s
}

/// `what` (such as `upgrade v2`) may write `version` only when its snapshot is
/// found (or there is no template, or `force`).
pub async fn check(ctx: &Context, store: &DynStore, version: &Version, force: bool, what: &str) -> Outcome {
    let Some(t) = template(store, ctx.schema()).await? else {
        return Ok(());
    };
    let snap = t
        .snapshot(version)
        .map_err(|e| Failure::usage(format!("{what}: {e}; nothing was written")))?;
    let inrelease = redact_userinfo(&snap.release_urls()[0]);
    if force {
        crate::say!("warning: --force: the package snapshot of {version} was not checked ({inrelease})");
        return Ok(());
    }
    match fetch_release(&ctx.config.repo, &snap).await {
        Ok(url) => {
            if ctx.verbose > 0 {
                crate::say!("package snapshot of {version}: {url}");
            }
            Ok(())
        }
        Err(why) => Err(Failure::usage(format!(
            "{what}: version {version} has no readable package snapshot ({why}); nothing was written (check the version's spelling, publish the snapshot, or give --force to skip this check)"
        ))),
    }
}

/// Deletes the stored package sets (`/packages/<digest>`) that no host's result
/// refers to; returns their digests. The sets are listed before the results: a
/// set written after that listing is not seen, so not deleted. One written just
/// before it whose host reports after the results were listed is deleted with
/// the rest (its host's set shows as not stored until its next run or change).
pub async fn prune(store: &DynStore, schema: &Schema) -> Result<Vec<String>, StoreError> {
    let sets = store.list(&schema.package_sets()).await?;
    let results = store.list(&schema.results()).await?;
    let mut used = std::collections::BTreeSet::new();
    for kv in &results.kvs {
        // A result that cannot be read may refer to any set: delete none.
        let r = jio_common::values::parse_json::<jio_common::values::HostResult>(kv).map_err(|e| {
            StoreError::Rejected {
                url: store.url().to_string(),
                op: "prune",
                message: format!("{e}; no package set was deleted"),
            }
        })?;
        used.extend(r.packages.map(|p| p.digest));
    }
    let unused: Vec<String> = sets
        .kvs
        .iter()
        .filter_map(|kv| match schema.parse(&kv.key) {
            Some(Parsed::PackageSet(d)) if !used.contains(&d) => Some(d),
            _ => None,
        })
        .collect();
    for chunk in unused.chunks(32) {
        let ops = chunk.iter().map(|d| Op::Delete(schema.package_set(d))).collect();
        store
            .txn(Txn {
                compares: vec![],
                ops,
            })
            .await?;
    }
    Ok(unused)
}
