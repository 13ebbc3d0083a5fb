//! A `jioctl` on a real pseudo terminal: every screen it drew, as a terminal of
//! 24 rows shows them, with the rows that wrapped onto the next (`row_wrapped`).
//! The test keeps the terminal open until it has read everything (a terminal
//! closed by its last process may drop what was left unread), and also feeds the
//! output to a terminal too tall to scroll, so a row wrapped anywhere is seen.

use std::io::Read as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::{Child, Command};

const ROWS: u16 = 24;
/// The rows of the terminal that never scrolls.
const TALL: u16 = 2_000;

/// One screen as drawn, and the rows of it that wrapped.
#[derive(Debug, Clone)]
pub struct Frame {
    pub text: String,
    pub wrapped: Vec<String>,
}

/// What the reader saw: every frame, everything written, and the rows that
/// wrapped anywhere (on the tall terminal).
#[derive(Default)]
struct Seen {
    frames: Vec<Frame>,
    raw: Vec<u8>,
    wrapped_anywhere: Vec<String>,
    first_screen: Vec<String>,
}

/// A process on a terminal, its screens read as it draws them.
pub struct Terminal {
    pub child: Child,
    /// The terminal's keyboard side.
    keys: std::fs::File,
    /// Held open until everything was read.
    slave: Option<std::os::fd::OwnedFd>,
    seen: Arc<Mutex<Seen>>,
    ended: Arc<AtomicBool>,
    reader: tokio::task::JoinHandle<()>,
}

impl Terminal {
    /// Starts `cmd` with stdout and stderr on an xterm of 24 rows and `cols` columns.
    pub fn spawn(cmd: Command, cols: u16) -> Terminal {
        Terminal::spawn_as(cmd, cols, "xterm")
    }

    /// `spawn`, on a terminal of type `term` (`dumb`: no cursor movement).
    pub fn spawn_as(mut cmd: Command, cols: u16, term: &str) -> Terminal {
        let size = nix::pty::Winsize {
            ws_row: ROWS,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&size), None).unwrap();
        let child = cmd
            .env("TERM", term)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::from(pty.slave.try_clone().unwrap()))
            .stderr(std::process::Stdio::from(pty.slave.try_clone().unwrap()))
            .spawn()
            .unwrap();
        let flags = nix::fcntl::fcntl(&pty.master, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&pty.master, nix::fcntl::FcntlArg::F_SETFL(flags)).unwrap();
        let master = std::fs::File::from(pty.master);
        let keys = master.try_clone().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let ended = Arc::new(AtomicBool::new(false));
        let reader = {
            let (seen, ended) = (seen.clone(), ended.clone());
            tokio::task::spawn_blocking(move || read_all(master, cols, &seen, &ended))
        };
        Terminal {
            child,
            keys,
            slave: Some(pty.slave),
            seen,
            ended,
            reader,
        }
    }

    /// The screens so far.
    pub fn frames(&self) -> Vec<Frame> {
        self.seen.lock().unwrap().frames.clone()
    }

    /// Everything written to the terminal so far, as text (without carriage returns).
    pub fn written(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().unwrap().raw).replace('\r', "")
    }

    /// The rows that wrapped anywhere in the output (none, on a screen that fits).
    pub fn wrapped_anywhere(&self) -> Vec<String> {
        self.seen.lock().unwrap().wrapped_anywhere.clone()
    }

    /// The first screenful a person saw: the top of what scrolled by, or the
    /// screen when a redraw cleared it.
    pub fn first_screen(&self) -> String {
        self.seen.lock().unwrap().first_screen.join("\n")
    }

    /// Waits until a screen shows what `seen` looks for (showing the last screen
    /// when none does in time).
    pub async fn wait_until(&self, what: &str, within: Duration, seen: impl Fn(&str) -> bool) {
        let start = tokio::time::Instant::now();
        loop {
            let frames = self.frames();
            if frames.iter().any(|f| seen(&f.text)) {
                return;
            }
            let last = frames.last().map(|f| f.text.clone()).unwrap_or_default();
            assert!(
                start.elapsed() < within,
                "timed out after {within:?} waiting for {what}:\n{last}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Types `keys` (the terminal echoes them: Ctrl-C shows as `^C` where the
    /// cursor is).
    pub fn type_keys(&self, keys: &[u8]) {
        use std::io::Write as _;
        (&self.keys).write_all(keys).unwrap();
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
    }

    /// Waits for the process to end (within `within`), then reads what is left:
    /// its exit code and every screen.
    pub async fn finish(mut self, within: Duration) -> (Option<i32>, Vec<Frame>) {
        let code = self.ended_within(within).await;
        (code, self.frames())
    }

    /// Waits for the process to end (within `within`) and reads what is left,
    /// leaving what was seen to be asked: its exit code.
    pub async fn ended_within(&mut self, within: Duration) -> Option<i32> {
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .expect("jioctl ended in time")
            .unwrap();
        self.drained().await;
        status.code()
    }

    /// Reads what is left once the process ended, then closes the terminal.
    async fn drained(&mut self) {
        self.ended.store(true, Ordering::SeqCst);
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.reader).await;
        self.slave.take();
    }

    /// Stops the process (SIGTERM) and reads what is left.
    pub async fn stop(mut self) -> Terminal {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let _ = tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await;
        self.drained().await;
        self
    }
}

/// Reads the terminal until the process ended and nothing is left, recording a
/// frame per read. On a blocking thread of its own (`spawn_blocking`), so its
/// short sleeps block no async worker.
#[allow(clippy::disallowed_methods)]
fn read_all(mut master: std::fs::File, cols: u16, seen: &Mutex<Seen>, ended: &AtomicBool) {
    let size = |n| std::num::NonZeroU16::new(n).unwrap();
    let mut parser = vt100::Parser::new(size(ROWS), size(cols), 10_000);
    let mut tall = vt100::Parser::new(size(TALL), size(cols), 0);
    let mut buf = [0u8; 8192];
    loop {
        let n = match master.read(&mut buf) {
            Ok(n) if n > 0 => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if ended.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            _ => return,
        };
        parser.process(&buf[..n]);
        tall.process(&buf[..n]);
        let s = parser.screen();
        let rows: Vec<String> = s.rows(0, cols).collect();
        let wrapped = (0..ROWS)
            .filter(|r| s.row_wrapped(*r))
            .map(|r| rows[usize::from(r)].clone())
            .collect();
        let t = tall.screen();
        let wrapped_anywhere = (0..TALL)
            .filter(|r| t.row_wrapped(*r))
            .map(|r| t.rows(0, cols).nth(usize::from(r)).unwrap_or_default())
            .collect();
        parser.screen_mut().set_scrollback(usize::MAX);
        let first_screen = parser.screen().rows(0, cols).collect();
        parser.screen_mut().set_scrollback(0);
        let mut seen = seen.lock().unwrap();
        seen.raw.extend_from_slice(&buf[..n]);
        seen.frames.push(Frame {
            text: rows.join("\n"),
            wrapped,
        });
        seen.wrapped_anywhere = wrapped_anywhere;
        seen.first_screen = first_screen;
    }
}
