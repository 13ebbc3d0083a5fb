//! Prometheus's own checker for what we export: `promtool check metrics` (Debian's
//! `prometheus` package) parses the text format and applies Prometheus's naming
//! rules; and a lookup of one sample's value in a scrape, for the assertions.

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
