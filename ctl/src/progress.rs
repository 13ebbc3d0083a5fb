//! Live progress of a rollout or a fleet command, one view for both. In a
//! terminal: one bar per group (the unit the limits apply to) laid out for the
//! terminal's width: name, bar, done/total, time elapsed and left, then the counts
//! with the hosts in flight and failed named as far as they fit (`+N more` for the
//! rest). Otherwise: one stamped line per group whose counts changed. Notes (what
//! the driver did, and the log lines meanwhile) print above the bars, stamped and
//! folded to the width; no row is longer than the terminal. The words and the
//! layout are `text`'s (pure); this module prints them.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use jio_common::fleet::{HostStatus, Snapshot};

use crate::out::{NoteSink, set_view};

mod text;

pub use text::{Counts, Group, Part, changed_lines, counts, groups, plain_line};
use text::{ENDED, FOLLOWING, GOES_ON, Layout, compact, layout, left_text};

/// The bars' terminal, rows ended explicitly. `indicatif` pads each row with
/// spaces to the full width and lets the terminal's autowrap take the cursor to
/// the next row: every row it draws is then a wrapped one to the terminal (and a
/// `^C` echoed at the end of a full row pushes the frame down, so that the next
/// frame is drawn below the last: a bar twice). Here the padding is an erase to
/// the end of the row, and the next row is reached by a newline, written only
/// when something follows (a move of the cursor stays on the row, as after
/// autowrap). `Progress::stop` writes the last one.
#[derive(Debug)]
struct Rows {
    term: console::Term,
    /// A row was padded: the cursor belongs on the next row.
    pending: Arc<std::sync::atomic::AtomicBool>,
}

impl Rows {
    fn newline_if_pending(&self) -> std::io::Result<()> {
        if self.pending.swap(false, Ordering::Relaxed) {
            self.term.write_str("\r\n")?;
        }
        Ok(())
    }

    /// A move of `n` rows (none: nothing happens, the row still ends).
    fn stay(&self, n: usize) {
        if n > 0 {
            self.pending.store(false, Ordering::Relaxed);
        }
    }
}

impl indicatif::TermLike for Rows {
    fn width(&self) -> u16 {
        self.term.size().1
    }

    fn height(&self) -> u16 {
        self.term.size().0
    }

    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.stay(n);
        self.term.move_cursor_up(n)
    }

    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.stay(n);
        self.term.move_cursor_down(n)
    }

    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.term.move_cursor_right(n)
    }

    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.term.move_cursor_left(n)
    }

    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.newline_if_pending()?;
        self.term.write_line(s)
    }

    fn write_str(&self, s: &str) -> std::io::Result<()> {
        if s.chars().all(|c| c == ' ') {
            // The padding of a row: erase the rest of it instead.
            self.pending.store(true, Ordering::Relaxed);
            return self.term.write_str("\x1b[K");
        }
        self.newline_if_pending()?;
        self.term.write_str(s)
    }

    fn clear_line(&self) -> std::io::Result<()> {
        self.stay(1);
        self.term.clear_line()
    }

    fn flush(&self) -> std::io::Result<()> {
        self.term.flush()
    }
}

/// Where a view prints: the words' stream (stdout, or stderr under `--json`), or
/// stderr (a fleet command's progress).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Words,
    Stderr,
}

impl Stream {
    fn stderr(self) -> bool {
        self == Stream::Stderr || crate::out::words_to_stderr()
    }

    fn term(self) -> console::Term {
        if self.stderr() {
            console::Term::stderr()
        } else {
            console::Term::stdout()
        }
    }

    /// The terminal's size, or 24 x 80 (a pipe is read at 80 columns too).
    fn size(self) -> (usize, usize) {
        let (rows, cols) = self.term().size_checked().unwrap_or((24, 80));
        (usize::from(rows), usize::from(cols))
    }

    /// Whether it is a terminal that can draw bars.
    pub fn is_terminal(self) -> bool {
        use std::io::IsTerminal as _;
        let tty = if self.stderr() {
            std::io::stderr().is_terminal()
        } else {
            std::io::stdout().is_terminal()
        };
        tty && !self.target().is_hidden()
    }

    fn target(self) -> ProgressDrawTarget {
        if self.stderr() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::stdout()
        }
    }
}

enum Mode {
    Silent,
    /// The bars are finished: notes are plain stamped lines, updates show nothing.
    Done,
    /// Stamped lines, one per group whose counts changed.
    Lines {
        last: BTreeMap<String, Group>,
    },
    /// A bar per group in a terminal.
    Bars {
        multi: MultiProgress,
        bars: BTreeMap<String, ProgressBar>,
        layout: Option<Layout>,
    },
}

/// Shows progress as bars or lines, and notes.
pub struct Progress {
    mode: Mode,
    stream: Stream,
    /// What the bars say at the end (`FOLLOWING`, `ENDED`, `GOES_ON`).
    end: Arc<AtomicU8>,
    /// Whether the log lines are this view's notes meanwhile.
    logs: bool,
    /// Whether `out` knows this view (to be forgotten when it stops).
    registered: bool,
    /// The bars' last row is ended by the next write (`Rows`).
    pending: Arc<std::sync::atomic::AtomicBool>,
}

/// A line that could not be written because the reader of the output left (a
/// pager quit): ends the process as a closed output does (`exit::output_closed`),
/// instead of driving on unseen. Other errors are ignored, as before.
fn closed_unless(r: std::io::Result<()>, stderr: bool) {
    if let Err(e) = r
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        crate::exit::output_closed(!stderr);
    }
}

impl Progress {
    /// Bars when `tty` and the words' stream can draw them, lines otherwise.
    pub fn new(tty: bool) -> Progress {
        Progress::on(Stream::Words, tty)
    }

    /// On `stream`: bars when `tty` and it can draw them, lines otherwise.
    pub fn on(stream: Stream, tty: bool) -> Progress {
        let pending = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mode = if tty && !stream.target().is_hidden() {
            let rows = Rows {
                term: stream.term(),
                pending: pending.clone(),
            };
            Mode::Bars {
                multi: MultiProgress::with_draw_target(ProgressDrawTarget::term_like_with_hz(
                    Box::new(rows),
                    20,
                )),
                bars: BTreeMap::new(),
                layout: None,
            }
        } else {
            Mode::Lines {
                last: BTreeMap::new(),
            }
        };
        let mut p = Progress {
            mode,
            stream,
            end: Arc::new(AtomicU8::new(FOLLOWING)),
            logs: false,
            registered: false,
            pending,
        };
        p.register();
        p
    }

    /// Shows nothing.
    pub fn silent() -> Progress {
        Progress {
            mode: Mode::Silent,
            stream: Stream::Words,
            end: Arc::new(AtomicU8::new(FOLLOWING)),
            logs: false,
            registered: false,
            pending: Arc::default(),
        }
    }

    /// The log lines (tracing) are this view's notes while it shows.
    pub fn take_log_lines(&mut self) {
        self.logs = !matches!(self.mode, Mode::Silent);
        self.register();
    }

    fn sink(&self) -> NoteSink {
        NoteSink {
            multi: match &self.mode {
                Mode::Bars { multi, .. } => Some(multi.clone()),
                _ => None,
            },
            stderr: self.stream.stderr(),
            width: self.stream.size().1.saturating_sub(1).max(20),
        }
    }

    /// Tells `out` where notes and log lines go now: bars are always told (what
    /// else prints suspends them), lines when they take the log lines.
    fn register(&mut self) {
        let on = match &self.mode {
            Mode::Bars { .. } => true,
            Mode::Lines { .. } => self.logs,
            Mode::Silent | Mode::Done => false,
        };
        if on {
            set_view(Some(self.sink()));
        } else if self.registered {
            set_view(None);
        }
        self.registered = on;
    }

    /// Prints a note (stamped with the time, folded to the width) above the bars.
    pub fn note(&mut self, line: &str) {
        if !matches!(self.mode, Mode::Silent) {
            closed_unless(crate::out::note_to(&self.sink(), line), self.stream.stderr());
        }
    }

    pub fn update(&mut self, snap: &Snapshot, hosts: &[HostStatus]) {
        if !matches!(self.mode, Mode::Silent | Mode::Done) {
            self.show(groups(snap, hosts));
        }
    }

    /// Shows the groups as they are now.
    pub fn show(&mut self, now: BTreeMap<String, Group>) {
        let (rows, cols) = self.stream.size();
        let sink = self.sink();
        match &mut self.mode {
            Mode::Silent | Mode::Done => {}
            Mode::Lines { last } => {
                let lines = changed_lines(last, &now, &crate::out::stamp(), sink.width);
                if !lines.is_empty() {
                    let mut out = sink_writer(&sink);
                    closed_unless(
                        writeln!(out, "{}", lines.join("\n")).and_then(|()| out.flush()),
                        sink.stderr,
                    );
                }
                *last = now;
            }
            // More groups than the terminal has rows for: lines, said once.
            Mode::Bars { multi, .. } if now.len() + 2 > rows => {
                multi.clear().ok();
                self.mode = Mode::Lines {
                    last: BTreeMap::new(),
                };
                self.register();
                self.note(&format!(
                    "{} groups do not fit a terminal of {rows} rows: progress as lines",
                    now.len()
                ));
                self.show(now);
            }
            Mode::Bars {
                multi,
                bars,
                layout: was,
            } => {
                let l = layout(cols, &now);
                let restyle = *was != Some(l);
                *was = Some(l);
                for (name, g) in &now {
                    let bar = bars.entry(name.clone()).or_insert_with(|| {
                        let b = multi.add(ProgressBar::new(g.total as u64));
                        // Elapsed time moves between changes too.
                        b.enable_steady_tick(Duration::from_secs(1));
                        b
                    });
                    if restyle || bar.length().is_none() {
                        bar.set_style(style(&l, &self.end));
                    }
                    bar.set_prefix(g.title(name, l.title));
                    bar.set_length(g.total as u64);
                    bar.set_position(g.done as u64);
                    bar.set_message(g.message(l.msg));
                }
            }
        }
    }

    /// Stops the bars where they are (drawn once more, then left above what is
    /// printed next), saying the rollout or command ended where it did not finish.
    pub fn finish(&mut self) {
        self.stop(ENDED, None);
    }

    /// Stops the bars where they are, saying it goes on without this process, and
    /// notes `what` (who drives it now) above them.
    pub fn went_on(&mut self, what: Option<&str>) {
        self.stop(GOES_ON, what);
    }

    fn stop(&mut self, end: u8, what: Option<&str>) {
        if let Some(w) = what {
            self.note(w);
        }
        if let Mode::Bars { bars, .. } = &self.mode {
            // Once: a later stop (the drop) leaves what the bars said.
            self.end.store(end, Ordering::Relaxed);
            for b in bars.values() {
                b.disable_steady_tick();
                b.abandon();
            }
            // What prints next starts below the bars.
            if self.pending.swap(false, Ordering::Relaxed) {
                let _ = self.stream.term().write_str("\r\n");
            }
            self.mode = Mode::Done;
        }
        if std::mem::take(&mut self.registered) {
            set_view(None);
        }
    }
}

fn left(end: u8, state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write) {
    let total = state.len().unwrap_or(0);
    let _ = w.write_str(&left_text(state.pos(), total, end, state.eta().as_secs()));
}

fn sink_writer(sink: &NoteSink) -> Box<dyn std::io::Write> {
    if sink.stderr {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    }
}

/// The bars' style for `l`; `end` says what their time-left column says at the end.
fn style(l: &Layout, end: &Arc<AtomicU8>) -> ProgressStyle {
    let end = end.clone();
    ProgressStyle::with_template(&l.template())
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key(
            "left",
            move |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                left(end.load(Ordering::Relaxed), s, w)
            },
        )
        .with_key(
            "took",
            |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&compact(s.elapsed().as_secs()));
            },
        )
        .progress_chars("#>-")
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
