//! A store that cannot be reached, as an operator meets it: one line naming the
//! store and the cause once, exit 2; on a terminal a note after a second without
//! an answer, so the wait is explained; through a pipe or under `--json`, only the
//! error. Against a real etcd (answering, then stopped) and a closed port.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use jio_tests::Etcd;

use common::jioctl;

/// `jioctl args` with stdout and stderr on a real pseudo-terminal: its exit code
/// and everything it wrote there (carriage returns removed).
async fn on_a_terminal(url: &str, args: &[&str]) -> (Option<i32>, String) {
    let mut t = common::terminal::Terminal::spawn(jioctl(url, args), 80);
    let code = t.ended_within(Duration::from_secs(60)).await;
    (code, t.written())
}

/// `jioctl args` through pipes: its exit code, stdout and stderr.
async fn through_a_pipe(url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        jioctl(url, args).stdin(Stdio::null()).output(),
    )
    .await
    .unwrap()
    .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A closed port: through a pipe exactly one line, the store once, the cause once;
/// on a terminal the note first, then the same line; under --json no note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_is_one_line_and_a_terminal_hears_that_it_is_tried() {
    let url = format!("etcd://127.0.0.1:{}", closed_port());
    let error = format!("jioctl: cannot reach the store {url}: connection refused");
    let note = format!("jioctl: connecting to {url}: no answer yet, trying for up to 10s");
    let start = Instant::now();
    let (piped, terminal, json_terminal) = tokio::join!(
        through_a_pipe(&url, &["status"]),
        on_a_terminal(&url, &["status"]),
        on_a_terminal(&url, &["--json", "status"]),
    );
    assert!(start.elapsed() < Duration::from_secs(30), "{:?}", start.elapsed());
    let (code, stdout, stderr) = piped;
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stdout, "");
    assert_eq!(stderr, format!("{error}\n"));
    let (code, said) = terminal;
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(said, format!("{note}\n{error}\n"));
    let (code, said) = json_terminal;
    assert_eq!(code, Some(2), "{said}");
    assert_eq!(said, format!("{error}\n"));
}

/// A real etcd answers at once: no note on a terminal. Once it is stopped, the
/// same URL is the one-line error, exit 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_etcd_answers_without_a_note_and_once_stopped_is_one_line() {
    let mut etcd = Etcd::start().await;
    let url = etcd.url();
    let (code, said) = on_a_terminal(&url, &["current-version"]).await;
    // Nothing is set yet: `current-version` says so (exit 1), after an answer.
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("/current_version is not set"), "{said}");
    assert!(!said.contains("connecting to"), "{said}");
    etcd.kill(0);
    let (code, stdout, stderr) = through_a_pipe(&url, &["current-version"]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!("jioctl: cannot reach the store {url}: connection refused\n")
    );
}
