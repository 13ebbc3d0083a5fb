//! A `jioctl` on a real pseudo terminal: every screen it drew, as a terminal of
//! 24 rows shows them, with the rows that wrapped onto the next (`row_wrapped`).

use std::io::Read as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::{Child, Command};

/// One screen as drawn, and the rows of it that wrapped.
#[derive(Debug, Clone)]
pub struct Frame {
    pub text: String,
    pub wrapped: Vec<String>,
}

/// A process on a terminal, its screens read as it draws them.
pub struct Terminal {
    pub child: Child,
    /// The terminal's keyboard side.
    keys: std::fs::File,
    frames: Arc<Mutex<Vec<Frame>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Terminal {
    /// Starts `cmd` with stdout and stderr on a terminal of 24 rows and `cols`
    /// columns, of type xterm.
    pub fn spawn(mut cmd: Command, cols: u16) -> Terminal {
        let size = nix::pty::Winsize {
            ws_row: 24,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&size), None).unwrap();
        let child = cmd
            .env("TERM", "xterm")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::from(pty.slave.try_clone().unwrap()))
            .stderr(std::process::Stdio::from(pty.slave))
            .spawn()
            .unwrap();
        let frames = Arc::new(Mutex::new(Vec::new()));
        let into = frames.clone();
        let mut master = std::fs::File::from(pty.master);
        let keys = master.try_clone().unwrap();
        let reader = tokio::task::spawn_blocking(move || {
            let size = |n| std::num::NonZeroU16::new(n).unwrap();
            let mut parser = vt100::Parser::new(size(24), size(cols), 0);
            let mut buf = [0u8; 4096];
            // EIO once the last process holding the terminal has gone.
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                parser.process(&buf[..n]);
                let s = parser.screen();
                let rows: Vec<String> = s.rows(0, cols).collect();
                let wrapped = (0..24u16)
                    .filter(|r| s.row_wrapped(*r))
                    .map(|r| rows[usize::from(r)].clone())
                    .collect();
                into.lock().unwrap().push(Frame {
                    text: rows.join("\n"),
                    wrapped,
                });
            }
        });
        Terminal {
            child,
            keys,
            frames,
            reader,
        }
    }

    /// The screens so far.
    pub fn frames(&self) -> Vec<Frame> {
        self.frames.lock().unwrap().clone()
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

    /// Waits for the process to end (within `within`): its exit code and every screen.
    pub async fn finish(mut self, within: Duration) -> (Option<i32>, Vec<Frame>) {
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .expect("jioctl ended in time")
            .unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.reader).await;
        (status.code(), self.frames())
    }
}
