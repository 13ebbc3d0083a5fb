//! `jioctl status` and `status --watch` for people at 10, 500 and 10,000 hosts on a
//! real etcd, seen through a real pseudo terminal of 80×24 (as a terminal shows
//! it, by `vt100`) and through a pipe: no row wraps, the hosts that need a person
//! and the hosts in flight are on the first screen, no pending line is repeated,
//! and the counts add up to the fleet.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::jioctl;
use common::terminal::Terminal;
use jio_common::keys::Key;
use jio_tests::inspect::{open, text};

const COLS: u16 = 80;

/// What a terminal of 80×24 shows after `jioctl args` drew, once `done` holds for
/// a screen (the process is then stopped) or the process ended: the first screen a
/// person saw, and the rows that wrapped anywhere.
async fn on_a_terminal(url: &str, args: &[&str], done: fn(&str) -> bool) -> (String, Vec<String>) {
    let t = Terminal::spawn(jioctl(url, args), COLS);
    t.wait_until("the view", Duration::from_secs(120), done).await;
    let t = t.stop().await;
    (t.first_screen(), t.wrapped_anywhere())
}

/// The hosts the generated fleet has failed, from the store's own failure keys.
async fn failed_in_store(s: &jio_common::store::DynStore) -> BTreeSet<String> {
    let prefix = Key::new("/status/configured/failure/").unwrap();
    s.list(&prefix)
        .await
        .unwrap()
        .kvs
        .iter()
        .filter_map(|kv| kv.key.as_str().rsplit('/').next().map(String::from))
        .collect()
}

async fn view_at(n: usize) {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let store = open(&url).await;
    jio_tests::fleetgen::generate(&store, n).await.unwrap();
    let failed = failed_in_store(&store).await;
    assert!(!failed.is_empty());

    // Through a pipe: whole lines, the groups' counts adding up to the fleet.
    let out = jioctl(&url, &["status"]).output().await.unwrap();
    let piped = text(&out);
    let mut total = 0;
    for l in piped
        .lines()
        .skip_while(|l| !l.starts_with("GROUP"))
        .skip(1)
        .take_while(|l| !l.is_empty())
    {
        let upgraded = l.split_whitespace().nth(1).unwrap();
        total += upgraded.split('/').nth(1).unwrap().parse::<usize>().unwrap();
    }
    assert_eq!(total, n, "{n} hosts: the groups do not add up:\n{piped}");
    let pending: Vec<&str> = piped.lines().filter(|l| l.contains(" pending in ")).collect();
    let unique: BTreeSet<&&str> = pending.iter().collect();
    assert_eq!(
        unique.len(),
        pending.len(),
        "{n} hosts: a pending line repeated:\n{piped}"
    );
    assert!(
        piped.lines().count() < 60,
        "{n} hosts: {} lines:\n{piped}",
        piped.lines().count()
    );
    if std::env::var_os("JIO_SHOW").is_some() {
        eprintln!("{piped}");
    }

    // On a terminal: nothing wraps, and a person sees first who needs them.
    for args in [&["status"][..], &["status", "--watch"][..]] {
        let (screen, wrapped) = on_a_terminal(&url, args, |s| s.contains("IN FLIGHT")).await;
        assert!(
            wrapped.is_empty(),
            "{n} hosts, {args:?}: rows wrapped {wrapped:#?}:\n{screen}"
        );
        assert!(
            screen.contains("NEEDS A PERSON"),
            "{n} hosts, {args:?}:\n{screen}"
        );
        assert!(screen.contains("IN FLIGHT"), "{n} hosts, {args:?}:\n{screen}");
        assert!(
            failed.iter().any(|h| screen.contains(h.as_str())),
            "{n} hosts, {args:?}: none of the failed hosts {failed:?} on the first screen:\n{screen}"
        );
        if args.contains(&"--watch") {
            assert!(screen.starts_with("as of "), "{n} hosts: {screen}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_at_10_hosts_fits_a_terminal() {
    view_at(10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_at_500_hosts_fits_a_terminal() {
    view_at(500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_at_10000_hosts_fits_a_terminal() {
    view_at(10_000).await;
}
