//! `jioctl status` and `status --watch` for people at 10, 500 and 10,000 hosts on a
//! real etcd, seen through a real pseudo terminal of 80×24 (as a terminal shows
//! it, by `vt100`) and through a pipe: no row wraps, the hosts that need a person
//! and the hosts in flight are on the first screen, no pending line is repeated,
//! and the counts add up to the fleet.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::collections::BTreeSet;
use std::io::Read as _;
use std::time::Duration;

use common::jioctl;
use jio_common::keys::Key;
use jio_tests::inspect::{open, text};

const ROWS: u16 = 24;
const COLS: u16 = 80;

/// What a terminal of 80×24 shows after `jioctl args` drew, once `done` holds for
/// the screen (the process is then stopped) or the process ended: the screen's
/// rows, and whether any row was wrapped onto the next. The test keeps the
/// terminal open until it has read everything (a closed one may drop what is
/// left unread).
async fn on_a_terminal(url: &str, args: &[&str], done: fn(&str) -> bool) -> (Vec<String>, bool) {
    let size = nix::pty::Winsize {
        ws_row: ROWS,
        ws_col: COLS,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(Some(&size), None).unwrap();
    let mut child = jioctl(url, args)
        .env("TERM", "xterm")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(pty.slave.try_clone().unwrap()))
        .stderr(std::process::Stdio::from(pty.slave.try_clone().unwrap()))
        .spawn()
        .unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    let flags = nix::fcntl::fcntl(&pty.master, nix::fcntl::FcntlArg::F_GETFL).unwrap();
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&pty.master, nix::fcntl::FcntlArg::F_SETFL(flags)).unwrap();
    let mut master = std::fs::File::from(pty.master);
    let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = {
        let ended = ended.clone();
        tokio::task::spawn_blocking(move || {
            let n = |v| std::num::NonZeroU16::new(v).unwrap();
            let mut parser = vt100::Parser::new(n(ROWS), n(COLS), 10_000);
            // The same output on a terminal too tall to scroll: a row wrapped
            // anywhere stays there to be seen.
            let mut tall = vt100::Parser::new(n(2_000), n(COLS), 0);
            let mut buf = [0u8; 8192];
            let mut wrapped = false;
            loop {
                match master.read(&mut buf) {
                    Ok(k) if k > 0 => {
                        parser.process(&buf[..k]);
                        tall.process(&buf[..k]);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if ended.load(std::sync::atomic::Ordering::SeqCst) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    _ => break,
                }
                wrapped |= (0..2_000).any(|r| tall.screen().row_wrapped(r));
                let rows = first_screen(&mut parser);
                if done(&rows.join("\n")) {
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                    return (rows, wrapped);
                }
            }
            (first_screen(&mut parser), wrapped)
        })
    };
    let waited = tokio::time::timeout(Duration::from_secs(120), child.wait()).await;
    ended.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(waited.is_ok(), "jioctl {args:?} did not end within 120 s");
    let seen = seen.await.unwrap();
    drop(pty.slave);
    seen
}

/// The first screenful a person saw: the top of what scrolled by (or the screen,
/// when a redraw cleared it).
fn first_screen(parser: &mut vt100::Parser) -> Vec<String> {
    parser.screen_mut().set_scrollback(usize::MAX);
    let rows = parser.screen().rows(0, COLS).collect();
    parser.screen_mut().set_scrollback(0);
    rows
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
        let (rows, wrapped) = on_a_terminal(&url, args, |s| s.contains("IN FLIGHT")).await;
        let screen = rows.join("\n");
        assert!(!wrapped, "{n} hosts, {args:?}: a row wrapped:\n{screen}");
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
