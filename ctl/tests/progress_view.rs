//! The progress view of `jioctl upgrade` and `jioctl run` at 10, 500 and 10,000
//! hosts (three real agents, the rest registered without one, every fifth of
//! those failed), on a real 80x24 terminal and through a pipe: no row wraps and
//! no line is longer than 80 columns, the failed hosts and those in flight are on
//! the screen, no group's line is said twice, the counts add up to the fleet, and
//! after Ctrl-C the bars say what goes on and who drives it.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::time::Duration;

use common::commands::Actions;
use common::fleet::{Fleet, register_hosts};
use common::terminal::{Frame, Terminal};
use jio_tests::inspect::{open, text};

const SIZES: [usize; 3] = [10, 500, 10_000];
const REAL: [&str; 3] = ["compute1", "compute2", "compute3"];
/// The computes one at a time; the agentless hosts (lost, or failed) do not stop it.
const RULES: &str = r#"{"rolling_rules":{"roles":{"compute":1,"stmon":1}},"max_failures":100000}"#;

/// Grows the fleet to `n` hosts: stmon hosts without an agent, every fifth failed
/// at each of `versions`; those failed.
async fn grow(url: &str, n: usize, versions: &[&str]) -> Vec<String> {
    let s = open(url).await;
    let mut failed = Vec::new();
    for v in versions {
        failed = register_hosts(&s, "stmon", (REAL.len(), n - REAL.len()), 5, v).await;
    }
    failed
}

/// The first screen with a row that wrapped onto the next.
fn wrapped(frames: &[Frame]) -> Option<&Frame> {
    frames.iter().find(|f| !f.wrapped.is_empty())
}

/// The `done/total` of each bar (a row that starts with a group's name), summed.
fn bar_total(screen: &str, groups: &[&str]) -> usize {
    let slash = regex::Regex::new(r" (\d+)/(\d+) ").unwrap();
    screen
        .lines()
        .filter(|l| groups.iter().any(|g| l.starts_with(&format!("{g} "))))
        .filter_map(|l| slash.captures(l).map(|c| c[2].parse::<usize>().unwrap()))
        .sum()
}

/// Lines of a pipe joined as said: a stamped line and the rows folded under it
/// (a row of names, `    upgrading: a, b`, is its own).
fn logical(out: &str) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for row in out.lines() {
        match lines.last_mut() {
            Some(l) if row.starts_with("    ") && !row.trim_start().contains(": ") => {
                l.push(' ');
                l.push_str(row.trim_start());
            }
            _ => lines.push(row.to_string()),
        }
    }
    lines
}

/// Checks a pipe's output: no line over 80 columns (but JSON), no group line said
/// twice in a row, and each group's last counts add up, to `n` over the groups.
fn check_pipe(out: &str, n: usize, word: &str) {
    for l in out.lines() {
        let json = l.trim_start().starts_with(['{', '}', '"', '[', ']']);
        assert!(
            json || l.chars().count() <= 80,
            "a line over 80 columns: {l:?}\n{out}"
        );
    }
    let group = regex::Regex::new(&format!(
        r"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC (\w+): (\d+)/(\d+) {word}, (.*)$"
    ))
    .unwrap();
    let mut last: std::collections::BTreeMap<String, String> = Default::default();
    let mut totals: std::collections::BTreeMap<String, usize> = Default::default();
    for l in logical(out) {
        let Some(c) = group.captures(&l) else { continue };
        let (name, rest) = (c[1].to_string(), c[4].to_string());
        let said = format!("{}/{} {rest}", &c[2], &c[3]);
        assert_ne!(last.get(&name), Some(&said), "said twice: {l}\n{out}");
        let parts: usize = rest
            .split(", ")
            .map(|p| p.split(' ').next().unwrap().parse::<usize>().unwrap())
            .sum();
        let (done, total): (usize, usize) = (c[2].parse().unwrap(), c[3].parse().unwrap());
        assert_eq!(done + parts, total, "counts that do not add up: {l}");
        totals.insert(name.clone(), total);
        last.insert(name, said);
    }
    assert_eq!(totals.values().sum::<usize>(), n, "{totals:?}\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_progress_fits_80_columns_and_counts_the_fleet_at_any_size() {
    let (_etcd, url, f) = common::fleet::fleet_on_etcd(&REAL, 1.0).await;
    f.fail("compute2", true);
    for (i, n) in SIZES.into_iter().enumerate() {
        let (piped, drawn) = (format!("v{}", 2 * i + 2), format!("v{}", 2 * i + 3));
        let failed = grow(&url, n, &[&piped, &drawn]).await;
        // Through a pipe: stamped lines.
        let args = [
            "upgrade",
            &piped,
            "--instructions",
            RULES,
            "--force",
            "--timeout",
            "8s",
        ];
        let out = common::run(&url, &args).await;
        assert_eq!(out.status.code(), Some(5), "{}", text(&out));
        check_pipe(&String::from_utf8_lossy(&out.stdout), n, "upgraded");
        // On a terminal: bars; the computes in flight and a failed host on one
        // screen; the counts of the bars add up to the fleet.
        let args = [
            "upgrade",
            &drawn,
            "--instructions",
            RULES,
            "--force",
            "--timeout",
            "8s",
        ];
        let term = Terminal::spawn(common::jioctl(&url, &args), 80);
        let (code, frames) = term.finish(Duration::from_secs(120)).await;
        let last = frames.last().map(|f| f.text.clone()).unwrap_or_default();
        println!("{n} hosts, the last screen:\n{last}");
        assert_eq!(code, Some(5), "{last}");
        assert!(
            wrapped(&frames).is_none(),
            "a wrapped row at {n} hosts: {:#?}",
            wrapped(&frames)
        );
        let in_flight = |s: &str| {
            REAL.iter()
                .any(|h| s.contains(&format!("upgrading ({h}")) || s.contains(&format!("upgrading: {h}")))
        };
        assert!(
            frames
                .iter()
                .any(|f| in_flight(&f.text) && failed.iter().any(|h| f.text.contains(h.as_str()))),
            "no screen shows a compute in flight and a failed host at {n} hosts: {last}"
        );
        for fr in &frames {
            for g in ["compute ", "stmon "] {
                let bars = fr
                    .text
                    .lines()
                    .filter(|l| l.starts_with(g) && l.contains('/'))
                    .count();
                assert!(bars <= 1, "{g:?} drawn {bars} times:\n{}", fr.text);
            }
        }
        assert_eq!(bar_total(&last, &["compute", "stmon"]), n, "{last}");
        // Following stopped; the rollout did not.
        assert!(last.contains("goes on"), "{last}");
        assert!(!last.contains(" ended "), "{last}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_progress_fits_80_columns_and_says_who_drives_after_ctrl_c() {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let _f = Fleet::start_with(&url, &url, &REAL, 0.1, |_| a.config(false)).await;
    a.fail("compute2");
    let rules = r#"{"rolling_rules":{"global":1},"max_failures":100000}"#;
    for n in SIZES {
        grow(&url, n, &["v1"]).await;
        let args = [
            "run",
            "--all",
            "--instructions",
            rules,
            "--force",
            "restart",
            "nova",
        ];
        let term = Terminal::spawn(common::jioctl(&url, &args), 80);
        term.wait_until("compute2 failed", Duration::from_secs(60), |s| {
            s.contains("did not succeed: 1 host (compute2)")
        })
        .await;
        term.wait_until("the bars count what ran", Duration::from_secs(30), |s| {
            s.lines()
                .any(|l| l.starts_with("compute ") && l.contains(" 1/3") && l.contains("1 failed"))
        })
        .await;
        // Ctrl-C as typed: the terminal echoes `^C` after the last bar, then the
        // signal comes.
        term.type_keys(b"\x03");
        term.wait_until("^C echoed", Duration::from_secs(10), |s| s.contains("^C"))
            .await;
        term.signal(nix::sys::signal::Signal::SIGINT);
        let (code, frames) = term.finish(Duration::from_secs(60)).await;
        let last = frames.last().map(|f| f.text.clone()).unwrap_or_default();
        println!("{n} hosts, the last screen:\n{last}");
        assert_eq!(code, Some(130), "{last}");
        assert!(
            wrapped(&frames).is_none(),
            "a wrapped row at {n} hosts: {:#?}",
            wrapped(&frames)
        );
        assert_eq!(bar_total(&last, &["compute", "stmon"]), n, "{last}");
        assert!(
            last.contains("goes on") && last.contains("nobody drives it now"),
            "{last}"
        );
        assert!(!last.contains(" ended "), "{last}");
        for fr in &frames {
            for g in ["compute ", "stmon "] {
                let bars = fr
                    .text
                    .lines()
                    .filter(|l| l.starts_with(g) && l.contains('/'))
                    .count();
                assert!(bars <= 1, "{g:?} drawn {bars} times:\n{}", fr.text);
            }
        }
        assert!(
            frames
                .iter()
                .any(|f| f.text.contains("did not succeed: 1 host (compute2)")),
            "{last}"
        );
        // The command is left to itself: cancel it before the next size.
        let id = common::commands::first_command_id(&open(&url).await).await;
        let out = common::run(&url, &["commands", "cancel", &id]).await;
        assert!(out.status.code().is_some(), "{}", text(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_through_a_pipe_fits_80_columns_and_its_table_too() {
    let etcd = jio_tests::Etcd::start().await;
    let url = etcd.url();
    let a = Actions::new();
    let _f = Fleet::start_with(&url, &url, &REAL, 0.1, |_| a.config(false)).await;
    a.fail("compute2");
    let rules = r#"{"rolling_rules":{"global":1}}"#;
    for n in SIZES {
        grow(&url, n, &["v1"]).await;
        // Only the computes: it ends, with its table.
        let args = [
            "run",
            "--role",
            "compute",
            "--instructions",
            rules,
            "restart",
            "nova",
        ];
        let out = common::commands::run_bounded(&url, &args).await;
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        for l in stdout.lines().chain(stderr.lines()) {
            assert!(
                l.chars().count() <= 80,
                "a line over 80 columns: {l:?}\n{}",
                text(&out)
            );
        }
        check_pipe(&stderr, REAL.len(), "succeeded");
        // No note is said twice (a reason the hosts still wait for included).
        let mut said = std::collections::BTreeSet::new();
        for l in logical(&stderr).iter().filter_map(|l| l.split_once(" UTC ")) {
            assert!(said.insert(l.1.to_string()), "said twice: {}\n{stderr}", l.1);
        }
        assert!(stderr.contains("did not succeed: 1 host (compute2)"), "{stderr}");
        // The table names every host, the run directories below their rows.
        for h in REAL {
            assert!(stdout.lines().any(|l| l.starts_with(h)), "{stdout}");
        }
        assert!(stdout.contains("(on the host)"), "{stdout}");
    }
}

/// An etcd stall while `upgrade` draws its bars: the store layer's warning (the
/// rollout lock cannot be renewed) is a stamped note above the bars, never a raw
/// log line among them, and no row wraps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_line_during_an_etcd_stall_is_a_stamped_note() {
    use nix::sys::signal::{Signal, kill};
    let (etcd, url, _f) = common::fleet::fleet_on_etcd(&REAL, 3.0).await;
    let rules = r#"{"rolling_rules":{"roles":{"compute":1}}}"#;
    let term = Terminal::spawn(
        common::jioctl(&url, &["upgrade", "v2", "--instructions", rules]),
        80,
    );
    term.wait_until("the computes' bar", Duration::from_secs(30), |s| {
        s.lines().any(|l| l.starts_with("compute ") && l.contains("/3"))
    })
    .await;
    let etcd_pid = nix::unistd::Pid::from_raw(etcd.pid(0).unwrap() as i32);
    kill(etcd_pid, Signal::SIGSTOP).unwrap();
    let warned = std::panic::AssertUnwindSafe(term.wait_until("a warning", Duration::from_secs(60), |s| {
        s.contains(" UTC warning: ")
    }));
    let warned = futures_util::FutureExt::catch_unwind(warned).await;
    kill(etcd_pid, Signal::SIGCONT).unwrap();
    term.signal(Signal::SIGINT);
    let (_, frames) = term.finish(Duration::from_secs(60)).await;
    let last = frames.last().map(|f| f.text.clone()).unwrap_or_default();
    assert!(warned.is_ok(), "no warning while etcd stalled:\n{last}");
    let stamped = regex::Regex::new(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC warning: cannot renew").unwrap();
    assert!(
        frames.iter().any(|f| f.text.lines().any(|l| stamped.is_match(l))),
        "{last}"
    );
    let raw = regex::Regex::new(r"\d\dZ\s+(WARN|ERROR|INFO)\s").unwrap();
    assert!(
        frames.iter().all(|f| !raw.is_match(&f.text)),
        "a raw log line: {:?}",
        frames.iter().find(|f| raw.is_match(&f.text))
    );
    assert!(wrapped(&frames).is_none(), "{:#?}", wrapped(&frames));
    // Ctrl-C: following stopped, the rollout did not.
    assert!(last.contains("goes on") && !last.contains(" ended "), "{last}");
}
