//! Where jioctl's words for people go: stdout, or stderr under `--json`, which
//! keeps stdout for the command's one JSON document (a program reading it never
//! meets a progress line). The JSON documents carry the schema version.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

static WORDS_TO_STDERR: AtomicBool = AtomicBool::new(false);

/// The version of the JSON documents' shapes (the README documents them); it
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
        $crate::progress::while_drawn(|| {
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
        $crate::progress::while_drawn(|| {
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
