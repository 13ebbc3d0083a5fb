//! Where jioctl's words for people go: stdout, or stderr under `--json`, which
//! keeps stdout for the command's one JSON document (a program reading it never
//! meets a progress line). The JSON documents carry the schema version.

use std::sync::atomic::{AtomicBool, Ordering};

use indicatif::MultiProgress;
use serde_json::Value;

static WORDS_TO_STDERR: AtomicBool = AtomicBool::new(false);

/// The version of the JSON documents' shapes (docs/jioctl.md documents them); it
/// grows when a field changes meaning or goes, not when one is added.
pub const JSON_SCHEMA: u64 = 1;

/// Set once at start: `--json` sends the words to stderr.
pub fn json_mode(on: bool) {
    WORDS_TO_STDERR.store(on, Ordering::Relaxed);
}

/// Whether the words go to stderr (`--json`).
pub fn words_to_stderr() -> bool {
    WORDS_TO_STDERR.load(Ordering::Relaxed)
}

/// A line for people: stdout, or stderr under `--json`.
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => {
        $crate::out::while_drawn(|| {
            if $crate::out::words_to_stderr() {
                eprintln!($($t)*)
            } else {
                println!($($t)*)
            }
        })
    };
}

/// Text for people without a newline of its own: stdout, or stderr under `--json`.
#[macro_export]
macro_rules! say_text {
    ($($t:tt)*) => {
        $crate::out::while_drawn(|| {
            if $crate::out::words_to_stderr() {
                eprint!($($t)*)
            } else {
                print!($($t)*)
            }
        })
    };
}

/// One JSON document as printed: `{"schema": N, ...the object's fields}`, pretty.
pub fn document(v: Value) -> String {
    let v = match v {
        Value::Object(m) => {
            let mut out = serde_json::Map::new();
            out.insert("schema".into(), Value::from(JSON_SCHEMA));
            out.extend(m.into_iter().filter(|(k, _)| k != "schema"));
            Value::Object(out)
        }
        other => other,
    };
    serde_json::to_string_pretty(&v).unwrap_or_else(|_| v.to_string())
}

/// The bars being drawn, for whatever else prints meanwhile (`while_drawn`).
static DRAWN: std::sync::Mutex<Option<MultiProgress>> = std::sync::Mutex::new(None);

/// Runs `print` with the bars taken off the terminal and drawn again after it:
/// every other word on the terminal (`say!`, the log lines) goes through here, so
/// that nothing is cut by a redraw nor leaves a stale frame behind.
pub fn while_drawn<R>(print: impl FnOnce() -> R) -> R {
    let drawn = DRAWN.lock().unwrap_or_else(|p| p.into_inner()).clone();
    match drawn {
        Some(m) => m.suspend(print),
        None => print(),
    }
}

/// Standard error for the log lines, through `while_drawn`.
pub struct Stderr;

impl std::io::Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        while_drawn(|| std::io::stderr().write_all(buf)).map(|()| buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

pub(crate) fn set_drawn(m: Option<MultiProgress>) {
    *DRAWN.lock().unwrap_or_else(|p| p.into_inner()) = m;
}
