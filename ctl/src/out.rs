//! Where jioctl's words for people go: stdout, or stderr under `--json`, which
//! keeps stdout for the command's one JSON document (a program reading it never
//! meets a progress line). The JSON documents carry the schema version.

use std::io::Write as _;
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

/// A line for people (`say!`) folded to the width of where it goes: a sentence,
/// not a table.
#[macro_export]
macro_rules! say_fit {
    ($($t:tt)*) => {
        $crate::out::say_fit(&format!($($t)*))
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

/// Where a progress view prints its notes: above its bars (`multi`) or as plain
/// lines, on stdout or stderr, folded to `width` columns.
#[derive(Clone)]
pub struct NoteSink {
    pub multi: Option<MultiProgress>,
    pub stderr: bool,
    pub width: usize,
}

/// The view that takes the log lines as notes, and the bars being drawn (for
/// whatever else prints meanwhile: `while_drawn`).
static VIEW: std::sync::Mutex<Option<NoteSink>> = std::sync::Mutex::new(None);

fn view() -> Option<NoteSink> {
    VIEW.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Runs `print` with the bars taken off the terminal and drawn again after it:
/// every other word on the terminal (`say!`, the log lines) goes through here, so
/// that nothing is cut by a redraw nor leaves a stale frame behind.
pub fn while_drawn<R>(print: impl FnOnce() -> R) -> R {
    match view().and_then(|v| v.multi) {
        Some(m) => m.suspend(print),
        None => print(),
    }
}

/// The width words for people are fitted to: stdout's terminal's, or 80 columns
/// (a pipe, a file).
pub fn width() -> usize {
    console::Term::stdout()
        .size_checked()
        .map_or(80, |(_, cols)| usize::from(cols).saturating_sub(1).max(40))
}

/// The width of stderr's terminal, or 80 columns.
fn stderr_width() -> usize {
    console::Term::stderr()
        .size_checked()
        .map_or(80, |(_, cols)| usize::from(cols).saturating_sub(1).max(40))
}

/// `say_fit!`: `text` folded to the width of the words' stream, then said.
pub fn say_fit(text: &str) {
    let width = if words_to_stderr() {
        stderr_width()
    } else {
        width()
    };
    let rows = crate::render::fold(text, width, 4).join("\n");
    crate::say!("{rows}");
}

/// A line of jioctl's own on stderr (`jioctl: ...`), folded to its width.
pub fn tell(text: &str) {
    let rows = crate::render::fold(&format!("jioctl: {text}"), stderr_width(), 4);
    while_drawn(|| eprintln!("{}", rows.join("\n")));
}

/// The cause of a failure on stderr (`jioctl: ...`): folded to the width on a
/// terminal, one line otherwise (a log or a script reads it whole).
pub fn tell_failure(text: &str) {
    if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        tell(text);
    } else {
        eprintln!("jioctl: {text}");
    }
}

/// When, for a note: `2026-11-26 14:20:01 UTC`.
pub fn stamp() -> String {
    jio_common::time::utc_display(jio_common::time::unix_now())
}

/// A note's rows: stamped with the time, folded to `width` (every line of it).
pub fn note_rows(stamp: &str, text: &str, width: usize) -> Vec<String> {
    text.lines()
        .enumerate()
        .flat_map(|(i, l)| {
            let l = match i {
                0 => format!("{stamp} {l}"),
                _ if l.starts_with(' ') => l.to_string(),
                _ => format!("  {l}"),
            };
            crate::render::fold(&l, width, 4)
        })
        .collect()
}

/// Prints a note through `sink`: stamped, folded, above the bars when drawn.
pub fn note_to(sink: &NoteSink, text: &str) -> std::io::Result<()> {
    let rows = note_rows(&stamp(), text, sink.width).join("\n");
    if let Some(m) = &sink.multi
        && m.println(&rows).is_ok()
    {
        return Ok(());
    }
    let mut out: Box<dyn std::io::Write> = if sink.stderr {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    };
    writeln!(out, "{rows}").and_then(|()| out.flush())
}

/// Standard error for the log lines: while a progress view is shown, each line
/// is one of its notes (stamped, fitted, above the bars); otherwise as written.
pub struct Stderr;

impl std::io::Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match view() {
            Some(v) => {
                for line in String::from_utf8_lossy(buf)
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                {
                    // A reader that left is the view's to notice, at its next line.
                    let _ = note_to(&v, &crate::render::log_note(line));
                }
            }
            None => std::io::stderr().write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Sets (or clears) the view that takes the log lines and whose bars are drawn.
pub(crate) fn set_view(v: Option<NoteSink>) {
    *VIEW.lock().unwrap_or_else(|p| p.into_inner()) = v;
}
