//! The fault-injection test: real agents, real Puppet, real `jioctl` drivers on a
//! 3-member etcd, under a random bounded schedule of faults per seed (see
//! `jio_tests::faults`). The invariants are checked on the configuration step's own
//! log, not on the project's classification.
//!
//! `JIO_FAULT_SEEDS` picks the seeds: `3`, `1,5,9` or `1..20` (default `1`);
//! `JIO_FAULTS` how many faults per seed (default 4). `scripts/faults.sh N` runs N.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::PathBuf;
use std::time::Duration;

use jio_tests::faults::{FaultFleet, Rng, invariants, now, schedule};

fn seeds() -> Vec<u64> {
    let spec = std::env::var("JIO_FAULT_SEEDS").unwrap_or_else(|_| "1".into());
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once("..") {
            Some((a, b)) => out.extend(a.parse::<u64>().unwrap()..=b.parse::<u64>().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

fn bins() -> (PathBuf, PathBuf) {
    let agent = jio_tests::inspect::built_binary("jio-agent");
    let jioctl = jio_tests::inspect::built_binary("jioctl");
    (agent, jioctl)
}

/// One seed: the rollout under its faults, then the checks. `Err` says what broke.
async fn one_seed(seed: u64, faults: usize) -> Result<(), String> {
    let (agent, jioctl) = bins();
    let mut f = FaultFleet::start(&agent, &jioctl).await;
    let plan = schedule(seed, faults);
    eprintln!("faults: seed {seed}: {plan:?}");
    let t0 = now();
    let mut target = 2;
    let mut rng = Rng::new(seed ^ 0x5eed);
    f.start_driver(target);
    let begun = tokio::time::Instant::now();
    for (at, fault) in &plan {
        tokio::time::sleep_until(begun + *at).await;
        f.inject(*fault, &mut rng, &mut target).await;
    }
    f.heal();
    let (code, out) = f.finish(target).await;
    let want = format!("v{target}");
    let mut problems = Vec::new();
    if code != Some(0) {
        problems.push(format!("the final driver exited {code:?}:\n{out}"));
    }
    // Let the last reports land before reading the versions.
    f.wait_all_at(&want, Duration::from_secs(60)).await;
    if !f.verify_hosts(&want) {
        problems.push(format!("jioctl verify-hosts {want} is false"));
    }
    problems.extend(invariants().violations(&f.runs(), t0));
    problems.extend(f.double_states(&want));
    if problems.is_empty() {
        eprintln!("faults: seed {seed}: passed ({} runs checked)", f.runs().len());
        Ok(())
    } else {
        Err(format!(
            "seed {seed} broke an invariant (replay: JIO_FAULT_SEEDS={seed}):\n{}\nschedule:\n{}\n{}",
            problems.join("\n"),
            f.events.join("\n"),
            f.diagnostics()
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_never_break_the_rules() {
    let faults = std::env::var("JIO_FAULTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(4);
    let seeds = seeds();
    let mut failed = Vec::new();
    for seed in &seeds {
        if let Err(e) = one_seed(*seed, faults).await {
            eprintln!("{e}");
            failed.push(*seed);
        }
    }
    eprintln!(
        "faults: {} of {} seeds passed{}",
        seeds.len() - failed.len(),
        seeds.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!("; failed: {failed:?}")
        }
    );
    assert!(failed.is_empty(), "seeds {failed:?} failed (see above)");
}
