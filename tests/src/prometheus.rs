//! Prometheus's own checker for what we export: `promtool check metrics` (Debian's
//! `prometheus` package) parses the text format and applies Prometheus's naming
//! rules; a scrape over HTTP, a wait for one sample's value, and a lookup of one
//! sample's value in a scrape, for the assertions.

use std::io::Write as _;
use std::process::{Command, Stdio};

/// Runs `promtool check metrics` on `text`: `Err` with what it said when it finds
/// a problem (a parse error, a lint). Fails the test when promtool is missing.
pub fn check(text: &str) -> Result<(), String> {
    let promtool = crate::require_binary("promtool", "apt-get install prometheus");
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    child
        .stdin
        .take()
        .expect("promtool's stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("wait for promtool");
    if out.status.success() && out.stdout.is_empty() && out.stderr.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "promtool check metrics: {}{}{}\n--- the text ---\n{text}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The value of the sample written exactly as `series` (`name` or
/// `name{label="v",...}`, labels in the order written), if there is one.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The text `GET url` answers with 200 (empty for any other answer, or none).
pub async fn scrape(url: &str) -> String {
    match reqwest::get(url).await {
        Ok(r) if r.status() == 200 => r.text().await.unwrap_or_default(),
        _ => String::new(),
    }
}

/// Scrapes `url` until `series` has the value `want` (within a minute), and returns
/// that scrape; fails the test with the last scrape otherwise.
pub async fn until(url: &str, series: &str, want: f64) -> String {
    let start = std::time::Instant::now();
    loop {
        let last = scrape(url).await;
        if value(&last, series) == Some(want) {
            return last;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "timed out waiting for {series} = {want}; the last scrape:\n{last}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
