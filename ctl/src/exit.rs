//! The documented exit codes, and the one place that turns how a command ended into
//! one of them, printing the cause chain once. Commands return
//! a `Failure`; they never print their own errors nor pick a code elsewhere.

use std::fmt;

use jio_common::store::{ErrorKind, StoreError};

pub const OK: u8 = 0;
/// The rollout stopped on failures, or a check was false.
pub const FAILED: u8 = 1;
/// The store is unreachable.
pub const UNREACHABLE: u8 = 2;
/// The rules are invalid (nothing was written).
pub const INVALID_RULES: u8 = 3;
/// Another jioctl drives a rollout (without --retry), or this one lost the lock.
pub const LOCKED: u8 = 4;
/// `upgrade --timeout` passed before the rollout finished.
pub const TIMED_OUT: u8 = 5;
/// The rollout was stopped by an operator: an emergency stop
/// (`global-disable-puppet`), `jioctl rollout abort`, or a newer rollout replaced it.
pub const HALTED: u8 = 6;
/// The rollout is stuck: no host finished within its `progress_deadline`.
pub const STUCK: u8 = 7;
/// The store refused: TLS, authentication or permission (nothing was written).
pub const DENIED: u8 = 8;
/// Stopped by SIGINT (Ctrl-C) / SIGTERM: 128 + the signal number, as shells do.
pub const SIGINT: u8 = 130;
pub const SIGTERM: u8 = 143;
/// Its standard output (or error) was closed by the reader (`jioctl ... | head`):
/// it stops silently with the code a shell gives a tool killed by SIGPIPE.
pub const CLOSED_OUTPUT: u8 = 141;
/// Bad command line, configuration or input (nothing was written).
pub const USAGE: u8 = 64;
/// Anything else.
pub const SOFTWARE: u8 = 70;

/// Every exit code as operators read it: the man page's EXIT STATUS and
/// `docs/reference/exit-codes.md` are made from this table (`jio-gen`), and a test
/// fails when either differs from it.
pub const DOCUMENTED: &[(&str, &str)] = &[
    (
        "0",
        "success; for a following `upgrade` (and `rollout undo`), the rollout is done; for `--once`, the pass was applied (or left to the driver that holds the lock); for `--detach`, the rollout is recorded",
    ),
    (
        "1",
        "the rollout failed (stopped on failures, or ended with failed hosts); a fleet command ended without every host succeeding (failed, refused, interrupted, or not run); `commands cancel` of a command that already ended; a `rollout` change the rollout's state does not allow, or no active rollout; a check (`verify-hosts`, `check-single-version`, `get-failures`) is false; `status` shows a failed or lost host, or one without a live agent that is not upgraded",
    ),
    ("2", "the store is unreachable"),
    (
        "3",
        "the rules are invalid (nothing was written); or, for a following `upgrade`, the rollout's rules stopped fitting the fleet (a new role breaks them): the rollout stays recorded and admits nothing until `rollout abort`",
    ),
    (
        "4",
        "this `jioctl` was driving and lost the rollout lock to another driver (it was paused or cut off past the lease)",
    ),
    (
        "5",
        "`upgrade --timeout` passed before the rollout finished (the rollout goes on)",
    ),
    (
        "6",
        "an operator stopped the followed rollout: an emergency stop (`global-disable-puppet`), `rollout abort`, or a newer rollout that replaced it; or the followed fleet command was cancelled (`commands cancel`) or ended by the emergency stop",
    ),
    (
        "7",
        "the rollout is stuck: no host finished within its `progress_deadline` (the hosts that hold it are named)",
    ),
    (
        "8",
        "the store refused: TLS (certificate not trusted, client certificate refused), authentication (wrong user or password) or permission (a write outside the user's role); nothing was written",
    ),
    (
        "64",
        "bad command line, configuration or argument, or a `trigger-update` / `enable-puppet true --global` refused without `--force`, or a version whose package snapshot cannot be found (nothing was written)",
    ),
    ("70", "anything else"),
    (
        "130, 143",
        "stopped by SIGINT (Ctrl-C) or SIGTERM; the rollout lock was released",
    ),
    (
        "141",
        "its standard output was closed by its reader (`jioctl status | head` once `head` has what it wants): it stops silently, as a shell's tools do (a rollout lock it held is left to expire with its lease)",
    ),
];

/// How a command ended, when not with success: a documented exit code and what to
/// say on stderr (`None`: the command's output already said it, e.g. a false check).
pub struct Failure {
    code: u8,
    cause: Option<anyhow::Error>,
}

/// What a command returns.
pub type Outcome = Result<(), Failure>;

impl Failure {
    /// Ends with `code`, saying `msg`.
    pub fn new(code: u8, msg: impl fmt::Display + fmt::Debug + Send + Sync + 'static) -> Failure {
        Failure {
            code,
            cause: Some(anyhow::Error::msg(msg)),
        }
    }

    /// A bad command line, configuration or argument: exit 64, nothing written.
    pub fn usage(msg: impl fmt::Display + fmt::Debug + Send + Sync + 'static) -> Failure {
        Failure::new(USAGE, msg)
    }

    /// Ends with `code`; the output already said why.
    pub fn quiet(code: u8) -> Failure {
        Failure { code, cause: None }
    }

    /// Ends with `code`, saying `cause` and its chain.
    pub fn with(code: u8, cause: anyhow::Error) -> Failure {
        Failure {
            code,
            cause: Some(cause),
        }
    }

    pub fn code(&self) -> u8 {
        self.code
    }
}

/// Any other error: a store error by its kind (unreachable → 2, invalid input → 64),
/// no store configured 64, anything else 70. A store that cannot be reached is said
/// in one line: the store, and the cause once.
impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Failure {
        let e: anyhow::Error = e.into();
        if e.downcast_ref::<crate::config::NoStore>().is_some() {
            return Failure::with(USAGE, e);
        }
        let store_error = e.downcast_ref::<StoreError>();
        let code = match store_error.map(StoreError::kind) {
            Some(ErrorKind::Unavailable) => UNREACHABLE,
            Some(ErrorKind::InvalidInput) => USAGE,
            Some(ErrorKind::Denied) => DENIED,
            _ => SOFTWARE,
        };
        // The chain as `{:#}` says it, the unreachable store in plain words.
        let unreachable = |link: &(dyn std::error::Error + 'static)| match link.downcast_ref::<StoreError>() {
            Some(StoreError::Unavailable { url, op, reason }) => Some(cannot_reach(url, op, reason)),
            _ => None,
        };
        if e.chain().any(|l| unreachable(l).is_some()) {
            let said: Vec<String> = e
                .chain()
                .map(|l| unreachable(l).unwrap_or_else(|| l.to_string()))
                .collect();
            return Failure::new(code, said.join(": "));
        }
        Failure::with(code, e)
    }
}

/// `cannot reach the store URL: CAUSE`: the store named once, the cause once.
fn cannot_reach(url: &str, op: &str, reason: &str) -> String {
    let during = match op {
        // Opening: what every command does first.
        "ping" | "open" => String::new(),
        op => format!(" ({op})"),
    };
    format!(
        "cannot reach the store {}{during}: {}",
        jio_common::store::short(url),
        plain_cause(reason)
    )
}

/// The layers of a connection failure that only repeat that a connection failed
/// (tonic's, hyper's and reqwest's words around the operating system's).
const LAYERS: &[&str] = &[
    "transport error",
    "tcp connect error",
    "error trying to connect",
    "error sending request",
    "client error (Connect)",
];

/// A store client's error chain as an operator reads it: each part once, without
/// the layers in `LAYERS` nor the errno (`Connection refused (os error 111)` is
/// `connection refused`). A chain of nothing but layers is left as it is.
fn plain_cause(reason: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    for part in reason.split(": ") {
        let part = part.trim();
        let part = match (part.rfind(" (os error "), part.ends_with(')')) {
            (Some(i), true) => &part[..i],
            _ => part,
        };
        let part = match part {
            "deadline has elapsed" => "no answer in time".to_string(),
            p => lower_first(p),
        };
        if !part.is_empty() && !LAYERS.contains(&part.as_str()) && !parts.contains(&part) {
            parts.push(part);
        }
    }
    if parts.is_empty() {
        return reason.to_string();
    }
    parts.join(": ")
}

/// A sentence of the operating system's in the middle of ours: `Connection
/// refused` → `connection refused`; `TLS` and a name such as `Expired` stay.
fn lower_first(s: &str) -> String {
    let mut chars = s.chars();
    match (chars.next(), chars.next()) {
        (Some(a), Some(b)) if a.is_uppercase() && b.is_lowercase() && s.contains(' ') => {
            a.to_lowercase().chain(s[a.len_utf8()..].chars()).collect()
        }
        _ => s.to_string(),
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            Some(c) => write!(f, "exit {}: {c:#}", self.code),
            None => write!(f, "exit {}", self.code),
        }
    }
}

/// The one place an outcome becomes an exit code: says the cause (with its chain)
/// once on stderr.
pub fn report(outcome: Outcome) -> u8 {
    match outcome {
        Ok(()) => OK,
        Err(f) => {
            if let Some(c) = &f.cause {
                crate::out::tell_failure(&format!("{c:#}"));
            }
            f.code
        }
    }
}

/// What a process that drives something says on stderr when its stdout is closed
/// under it (a pager quit): that it stopped, and who drives now. Kept up to date
/// by the driver; said by `main`'s panic hook before it exits 141.
static CLOSING_WORDS: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Sets (or clears) the words said if stdout closes.
pub fn set_closing_words(words: Option<String>) {
    if let Ok(mut w) = CLOSING_WORDS.lock() {
        *w = words;
    }
}

/// The reader of our output left: says the closing words on stderr when stdout
/// is what closed (and stderr is still open), and ends with 141, as a tool killed
/// by SIGPIPE does.
pub fn output_closed(stdout: bool) -> ! {
    if stdout && let Some(words) = closing_words() {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "jioctl: {words}");
    }
    std::process::exit(CLOSED_OUTPUT.into())
}

/// The words to say if stdout closes now.
pub fn closing_words() -> Option<String> {
    CLOSING_WORDS.lock().ok().and_then(|w| w.clone())
}

/// Whether a panic is `println!`/`eprintln!` failing on a pipe whose reader left
/// (EPIPE), the one panic that means "stop quietly", not a bug.
pub fn is_closed_output_panic(message: Option<&str>) -> bool {
    message.is_some_and(|m| {
        (m.starts_with("failed printing to stdout") || m.starts_with("failed printing to stderr"))
            && m.ends_with(&std::io::Error::from_raw_os_error(nix::errno::Errno::EPIPE as i32).to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each code a command can end with is documented once, and nothing else is.
    #[test]
    fn every_exit_code_is_documented_once() {
        let codes = [
            OK,
            FAILED,
            UNREACHABLE,
            INVALID_RULES,
            LOCKED,
            TIMED_OUT,
            HALTED,
            STUCK,
            DENIED,
            USAGE,
            SOFTWARE,
            SIGINT,
            CLOSED_OUTPUT,
            SIGTERM,
        ];
        let documented: Vec<u8> = DOCUMENTED
            .iter()
            .flat_map(|(c, _)| c.split(", ").map(|n| n.parse::<u8>().unwrap()))
            .collect();
        let mut sorted = codes.to_vec();
        sorted.sort_unstable();
        let mut listed = documented.clone();
        listed.sort_unstable();
        assert_eq!(listed, sorted);
    }

    #[test]
    fn only_a_print_to_a_closed_pipe_ends_quietly() {
        let epipe = std::io::Error::from_raw_os_error(nix::errno::Errno::EPIPE as i32);
        assert!(is_closed_output_panic(Some(&format!(
            "failed printing to stdout: {epipe}"
        ))));
        assert!(is_closed_output_panic(Some(&format!(
            "failed printing to stderr: {epipe}"
        ))));
        let full = std::io::Error::from_raw_os_error(nix::errno::Errno::ENOSPC as i32);
        for other in [
            format!("failed printing to stdout: {full}"),
            format!("called `Result::unwrap()` on an `Err` value: {epipe}"),
            String::new(),
        ] {
            assert!(!is_closed_output_panic(Some(&other)), "{other}");
        }
        assert!(!is_closed_output_panic(None));
    }

    /// The chains the store clients give for a closed port, a name that does not
    /// resolve and a silent host (as seen from `jioctl status`), said plainly.
    #[test]
    fn an_unreachable_store_is_said_in_one_line_with_its_cause_once() {
        let cases = [
            (
                "ping",
                "tcp connect error: transport error: tcp connect error: tcp connect error: Connection refused (os error 111)",
                "cannot reach the store etcd://127.0.0.1:2379: connection refused",
            ),
            (
                "ping",
                "error sending request: client error (Connect): tcp connect error: Connection refused (os error 111)",
                "cannot reach the store etcd://127.0.0.1:2379: connection refused",
            ),
            (
                "ping",
                "tcp connect error: transport error: dns error: failed to lookup address information: Name or service not known",
                "cannot reach the store etcd://127.0.0.1:2379: dns error: failed to lookup address information: name or service not known",
            ),
            (
                "get",
                "tcp connect error: transport error: tcp connect error: deadline has elapsed",
                "cannot reach the store etcd://127.0.0.1:2379 (get): no answer in time",
            ),
            (
                "ping",
                "TLS: the server's certificate has expired; invalid peer certificate: Expired",
                "cannot reach the store etcd://127.0.0.1:2379: TLS: the server's certificate has expired; invalid peer certificate: Expired",
            ),
            // Nothing but layers: as it was said.
            (
                "ping",
                "transport error",
                "cannot reach the store etcd://127.0.0.1:2379: transport error",
            ),
        ];
        for (op, reason, want) in cases {
            let e = StoreError::Unavailable {
                url: "etcd://127.0.0.1:2379".into(),
                op,
                reason: reason.into(),
            };
            let f = Failure::from(e);
            assert_eq!(f.code(), UNREACHABLE, "{reason}");
            assert_eq!(format!("{f:?}"), format!("exit 2: {want}"), "{reason}");
        }
        // Under a context, the context leads, the store said the same way.
        let e = anyhow::Error::new(StoreError::Unavailable {
            url: "etcd://x:1".into(),
            op: "get",
            reason: "Connection refused (os error 111)".into(),
        })
        .context("reading the fleet");
        let f = Failure::from(e);
        assert_eq!(f.code(), UNREACHABLE);
        assert!(
            format!("{f:?}").starts_with("exit 2: reading the fleet: "),
            "{f:?}"
        );
    }

    #[test]
    fn errors_map_to_documented_codes() {
        let unavailable = StoreError::Unavailable {
            url: "etcd://x:1".into(),
            op: "get",
            reason: "connection refused".into(),
        };
        let cases: Vec<(Outcome, u8)> = vec![
            (Ok(()), OK),
            (Err(Failure::quiet(FAILED)), FAILED),
            (Err(Failure::usage("bad")), USAGE),
            (Err(unavailable.into()), UNREACHABLE),
            (Err(anyhow::anyhow!("odd").into()), SOFTWARE),
            (Err(Failure::new(HALTED, "halted")), HALTED),
        ];
        for (outcome, code) in cases {
            let what = format!("{outcome:?}");
            assert_eq!(report(outcome), code, "{what}");
        }
    }
}
