//! A guest's serial console, read by a harness thread that stamps every line with
//! the host's clock as it arrives (a guest's own clock may drift under emulation).
//! The lines go to a file (`<unix seconds> <line>`) and stay in memory for the
//! test's questions. It reads and records; it never writes to the guest.

use std::io::{BufRead as _, BufReader, Read, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// One console line and when the host read it.
#[derive(Debug, Clone)]
pub struct Line {
    pub at: SystemTime,
    pub text: String,
}

/// A `JIO-VM <event> ... <boot id>` line of the test image's marker unit (or of a
/// test's own script): the event, its words, and the boot id it ends with.
#[derive(Debug, Clone)]
pub struct Marker {
    pub at: SystemTime,
    pub event: String,
    pub words: Vec<String>,
    pub boot_id: String,
}

#[derive(Default)]
struct Shared {
    lines: Vec<Line>,
    /// When the console closed (the QEMU process ended).
    closed: Option<SystemTime>,
}

/// The captured console of one guest (cheap to clone: the lines are shared).
#[derive(Clone)]
pub struct Console {
    name: String,
    file: PathBuf,
    shared: Arc<Mutex<Shared>>,
}

impl Console {
    /// Starts the thread that reads `from` (QEMU's stdout) until it ends.
    pub fn capture(name: &str, from: impl Read + Send + 'static, file: &Path) -> Console {
        let console = Console {
            name: name.to_string(),
            file: file.to_path_buf(),
            shared: Arc::default(),
        };
        let mut out = std::fs::File::create(file).expect("console log file");
        let shared = console.shared.clone();
        std::thread::Builder::new()
            .name(format!("console-{name}"))
            .spawn(move || {
                for raw in BufReader::new(from).split(b'\n') {
                    let Ok(raw) = raw else { break };
                    let at = now();
                    let text = plain(&raw);
                    let _ = writeln!(out, "{:.3} {text}", unix(at));
                    lock(&shared).lines.push(Line { at, text });
                }
                lock(&shared).closed = Some(now());
            })
            .expect("console thread");
        console
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file holding the stamped lines.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<Line> {
        lock(&self.shared).lines.clone()
    }

    /// How many lines so far (a position for `wait_for`).
    pub fn len(&self) -> usize {
        lock(&self.shared).lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// When the console closed, if it did.
    pub fn closed(&self) -> Option<SystemTime> {
        lock(&self.shared).closed
    }

    /// The first line from position `from` on that contains `needle`.
    pub fn find(&self, from: usize, needle: &str) -> Option<Line> {
        let s = lock(&self.shared);
        s.lines
            .iter()
            .skip(from)
            .find(|l| l.text.contains(needle))
            .cloned()
    }

    /// Waits for a line from position `from` on containing `needle`; fails after
    /// `within`, or at once when the console closed, with the console's last lines.
    pub async fn wait_for(&self, from: usize, needle: &str, within: Duration) -> Line {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(l) = self.find(from, needle) {
                return l;
            }
            let closed = self.closed().is_some();
            if closed || tokio::time::Instant::now() > deadline {
                panic!(
                    "{}: no console line with {needle:?} {} (log {}); last lines:\n{}",
                    self.name,
                    if closed { "before QEMU ended" } else { "in time" },
                    self.file.display(),
                    self.tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last `n` lines, stamped, for failure messages.
    pub fn tail(&self, n: usize) -> String {
        let lines = self.lines();
        let start = lines.len().saturating_sub(n);
        lines[start..]
            .iter()
            .map(|l| format!("  {:.3} {}", unix(l.at), l.text))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every `JIO-VM` marker line, in order.
    pub fn markers(&self) -> Vec<Marker> {
        self.lines().iter().filter_map(marker).collect()
    }
}

fn marker(l: &Line) -> Option<Marker> {
    let rest = &l.text[l.text.find("JIO-VM ")? + "JIO-VM ".len()..];
    let mut words: Vec<String> = rest.split_whitespace().map(String::from).collect();
    // The boot id is the first word shaped like one (another writer's text may
    // follow on the same console line).
    let id_at = words.iter().position(|w| is_boot_id(w))?;
    words.truncate(id_at + 1);
    let boot_id = words.pop()?;
    if words.is_empty() {
        return None;
    }
    let event = words.remove(0);
    Some(Marker {
        at: l.at,
        event,
        words,
        boot_id,
    })
}

/// `8-4-4-4-12` hexadecimal digits, as in `/proc/sys/kernel/random/boot_id`.
fn is_boot_id(w: &str) -> bool {
    let parts: Vec<&str> = w.split('-').collect();
    parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts.iter().all(|p| p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Seconds since the Unix epoch (for logs, and to compare with `date +%s.%N`).
pub fn unix(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The host's wall clock: console stamps are compared with hook logs written by
/// other processes, so they must share one clock.
#[allow(clippy::disallowed_methods)]
pub fn now() -> SystemTime {
    SystemTime::now()
}

fn lock(m: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A console line as text: lossy UTF-8, without terminal escapes and carriage returns.
fn plain(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                // CSI: ESC [ parameters, ended by a letter.
                if chars.peek() == Some(&'[') {
                    for c in chars.by_ref() {
                        if c.is_ascii_alphabetic() {
                            break;
                        }
                    }
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_dropped_and_markers_parsed() {
        let text = plain(b"\x1b[0;32m  OK  \x1b[0m] Started \x1b[0;1;39mjio-agent.service\x1b[0m\r");
        assert_eq!(text, "  OK  ] Started jio-agent.service");
        let l = Line {
            at: SystemTime::UNIX_EPOCH,
            text: "[   11.75] JIO-VM validated v2 2b02725c-be57-4115-a72d-602329b61af9[  OK  ]".into(),
        };
        assert!(
            marker(&l).is_none(),
            "a boot id run into other text is no boot id"
        );
        let l = Line {
            text: "[   11.75] JIO-VM validated v2 2b02725c-be57-4115-a72d-602329b61af9 [  OK  ]".into(),
            ..l
        };
        let m = marker(&l).expect("a marker");
        assert_eq!(m.event, "validated");
        assert_eq!(m.words, ["v2"]);
        assert_eq!(m.boot_id, "2b02725c-be57-4115-a72d-602329b61af9");
        let cut = Line {
            text: "JIO-VM boot".into(),
            ..l
        };
        assert!(marker(&cut).is_none());
    }
}
