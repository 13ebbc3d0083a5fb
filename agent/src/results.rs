//! The host's run result `/results/<host>` (`HostResult`): built purely from how a
//! run ended, written in the transaction that reports the run (see `report`), and
//! the fenced read-modify-writes that follow it (a passing health check's
//! `checked_at`, the uploaded log's link). Nothing here decides what runs.

use std::path::Path;
use std::time::Duration;

use jio_common::keys::{Key, Step};
use jio_common::names::Version;
use jio_common::store::{Compare, DynStore, Op, StoreError, Txn, TxnOutcome};
use jio_common::values::{HostResult, parse_json};

use crate::decide;
use crate::runner::Outcome;
use crate::state::Failure;

/// The longest `message`, in characters.
const MESSAGE_CHARS: usize = 160;
/// The longest detail line taken from a command's output, in characters.
const DETAIL_CHARS: usize = 120;
/// Read-modify-writes retried this often when the result moved under them.
const ATTEMPTS: usize = 3;

/// How one run ended, as its result needs it.
pub struct RunEnd<'a> {
    pub version: &'a Version,
    /// The last step that ran.
    pub step: Step,
    pub outcome: &'a Outcome,
    /// The failing command's exit code.
    pub exit_code: Option<i32>,
    /// The first meaningful line of the failing command's output.
    pub detail: Option<String>,
    pub run_dir: &'a Path,
    /// Unix time the run ended.
    pub at: u64,
    /// The id of the rollout current when the run started.
    pub rollout: Option<String>,
}

/// Which attempt at `version` a run is, after the journal's `previous` failure.
pub fn attempt(previous: Option<&Failure>, version: &Version) -> u32 {
    match previous {
        Some(f) if &f.version == version => f.attempts.saturating_add(1),
        _ => 1,
    }
}

/// When the agent retries a failed `attempt` ended at `at` on its own (the rule of
/// `decide::backoff`).
pub fn retry_at(at: u64, attempt: u32, retry_interval: Duration) -> u64 {
    at.saturating_add(decide::backoff(retry_interval, attempt).as_secs())
}

/// The result of an upgrade run (`attempt` from [`attempt`]).
pub fn of_run(end: &RunEnd<'_>, attempt: u32, retry_interval: Duration) -> HostResult {
    let mut r = HostResult {
        version: end.version.clone(),
        ok: end.outcome.ok(),
        step: None,
        service: None,
        task: None,
        exit_code: None,
        message: None,
        run_dir: Some(end.run_dir.display().to_string()),
        log: None,
        at: end.at,
        checked_at: None,
        attempt,
        retry_at: None,
        rollout: end.rollout.clone(),
        packages: None,
    };
    if let Outcome::Failure(reason) = end.outcome {
        fail(&mut r, end.step, reason, end.detail.as_deref(), retry_interval);
        r.exit_code = end.exit_code;
    }
    r
}

/// The result after the soak's health check failed: the run's result, failed at
/// validation, with the check's run directory. The agent does not retry it.
pub fn soak_failed(run: &HostResult, reason: &str, detail: Option<&str>, run_dir: &Path) -> HostResult {
    let mut r = run.clone();
    r.ok = false;
    r.step = Some(Step::Validated.as_str().into());
    r.exit_code = None;
    r.message = Some(message(
        &format!("the health check failed during the min_healthy_time soak: {reason}"),
        detail,
    ));
    r.run_dir = Some(run_dir.display().to_string());
    r.log = None;
    r.retry_at = None;
    r
}

/// Turns `r` into a failure at `step` with `reason` (a validated success whose
/// version file could not be written becomes one).
pub fn fail(r: &mut HostResult, step: Step, reason: &str, detail: Option<&str>, retry_interval: Duration) {
    r.ok = false;
    r.step = Some(step.as_str().into());
    r.message = Some(message(reason, detail));
    r.retry_at = Some(retry_at(r.at, r.attempt, retry_interval));
}

/// One short line: the reason, then the output's detail when it adds something.
/// Reasons such as `puppet exited 6: changes were made and some resources failed`
/// keep their head (`puppet exited 6`) before the detail.
pub fn message(reason: &str, detail: Option<&str>) -> String {
    let reason = one_line(reason);
    let text = match detail.map(one_line).filter(|d| !d.is_empty()) {
        Some(d) => {
            let head = match reason.split_once(": ") {
                Some((head, _)) if head.contains(" exited ") => head,
                _ => reason.as_str(),
            };
            format!("{head}: {d}")
        }
        None => reason,
    };
    clip(&jio_common::packages::redact_userinfo(&text), MESSAGE_CHARS)
}

/// The first meaningful line of a command's output: Puppet's first `Error:` line,
/// else the first line that is not blank or a mere notice; colour codes dropped.
pub fn first_meaningful_line(output: &str) -> Option<String> {
    let lines: Vec<String> = output
        .lines()
        .map(strip_ansi)
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    // Puppet's `Error:` first, then apt's `E:` (its `W:` lines come before them).
    let pick = lines
        .iter()
        .find(|l| l.starts_with("Error:") || l.starts_with("E: "))
        .or_else(|| {
            lines
                .iter()
                .find(|l| !l.starts_with("Notice:") && !l.starts_with("Info:") && !l.starts_with("Debug:"))
        })?;
    Some(clip(pick, DETAIL_CHARS))
}

/// The first error of Puppet's JSON-lines log: a failed resource's (named by its
/// `Type[title]`) before Puppet's own, before any other (Facter's, say).
pub fn first_puppet_error(jsonl: &str) -> Option<String> {
    let errors: Vec<(String, String)> = jsonl
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| matches!(v["level"].as_str(), Some("err" | "crit" | "alert" | "emerg")))
        .filter_map(|v| {
            let message = one_line(&strip_ansi(v["message"].as_str()?));
            Some((v["source"].as_str().unwrap_or_default().to_string(), message))
        })
        .collect();
    let resource = errors.iter().find_map(|(source, message)| {
        let r = source
            .strip_prefix("/Stage[")?
            .split('/')
            .rfind(|part| part.contains('[') && part.ends_with(']'))?;
        Some(format!("{r}: {message}"))
    });
    let line = resource
        .or_else(|| errors.iter().find(|(s, _)| s == "Puppet").map(|(_, m)| m.clone()))
        .or_else(|| errors.first().map(|(_, m)| m.clone()))?;
    Some(clip(&line, DETAIL_CHARS))
}

/// The detail of a failed step, from its output in `run_dir`: Puppet's log, then
/// the commands' stderr and stdout (of Puppet, else of the last pre-command).
pub fn detail_from(run_dir: &Path, step: Step) -> Option<String> {
    // Only the start of a file: a meaningful line is near the top.
    let head = |name: &str| {
        read_head(&run_dir.join(name), 256 * 1024).map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    let mut names: Vec<String> = match step {
        Step::Configured => {
            if let Some(d) = head("puppet.jsonl").and_then(|t| first_puppet_error(&t)) {
                return Some(d);
            }
            let mut pre: Vec<String> = std::fs::read_dir(run_dir)
                .map(|rd| {
                    rd.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                        .filter(|n| n.starts_with("pre-") && n.ends_with(".stderr"))
                        .collect()
                })
                .unwrap_or_default();
            pre.sort();
            let mut v = vec!["puppet.stderr".to_string(), "puppet.stdout".to_string()];
            if let Some(last) = pre.last() {
                v.push(last.clone());
                v.push(last.replace(".stderr", ".stdout"));
            }
            v
        }
        Step::Validated => vec!["validation.stderr".into(), "validation.stdout".into()],
    };
    names
        .drain(..)
        .find_map(|n| head(&n).and_then(|t| first_meaningful_line(&t)))
}

fn read_head(path: &Path, max: u64) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.take(max).read_to_end(&mut buf).ok()?;
    Some(buf)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte.
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        if !c.is_control() || c == '\t' {
            out.push(c);
        }
    }
    out
}

/// The op that writes `r` as the host's result at `key` (`Schema::result`).
pub fn put_op(key: &Key, r: &HostResult) -> Op {
    Op::put(key.clone(), serde_json::to_string(r).unwrap_or_default())
}

/// Changes the host's result at `key` with `change` in a transaction fenced on the
/// mod revision read, so that it never clobbers a newer write. `change` returns
/// `false` when the result as read is not the one to change (then nothing is
/// written; a missing or unreadable result is never changed). Returns whether it
/// was written; a result that kept moving is left as it is.
pub async fn update(
    store: &DynStore,
    key: &Key,
    mut change: impl FnMut(&mut HostResult) -> bool,
) -> Result<bool, StoreError> {
    for _ in 0..ATTEMPTS {
        let Some(kv) = store.get(key).await? else {
            return Ok(false);
        };
        let Ok(mut r) = parse_json::<HostResult>(&kv) else {
            return Ok(false);
        };
        if !change(&mut r) {
            return Ok(false);
        }
        let txn = Txn::new()
            .when(Compare::ModRevision(key.clone(), kv.mod_revision))
            .then(put_op(key, &r));
        if let TxnOutcome::Committed(_) = store.txn(txn).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// dpkg's status changed while idle, or the result carries no set: the
/// successful result at `local` takes the set's `digest` (a run's own changes
/// stay listed). False when nothing moves.
pub fn packages_changed(
    r: &mut HostResult,
    local: &Version,
    set: &jio_common::packages::PackageSet,
    digest: &str,
    now: u64,
) -> bool {
    if !r.ok || &r.version != local || r.packages.as_ref().is_some_and(|p| p.digest == digest) {
        return false;
    }
    let p = r
        .packages
        .get_or_insert_with(|| jio_common::packages::PackageRecord::of(set, None, now));
    p.digest = digest.to_string();
    p.count = set.len();
    p.at = now;
    true
}

/// A passing health check at `now` of the `local` version: `checked_at` moves to
/// `now` when the last result is of that version and was not checked later.
pub fn checked(r: &mut HostResult, local: &Version, now: u64) -> bool {
    if &r.version != local || r.checked_at.is_some_and(|c| c >= now) {
        return false;
    }
    r.checked_at = Some(now);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::new(s).unwrap()
    }

    #[test]
    fn results_of_runs() {
        let dir = Path::new("/var/lib/jiocloud/runs/x-v2");
        let min = Duration::from_secs(60);
        let ok = Outcome::Success { changes: true };
        let end = RunEnd {
            version: &v("v2"),
            step: Step::Validated,
            outcome: &ok,
            exit_code: None,
            detail: None,
            run_dir: dir,
            at: 1000,
            rollout: Some("20261123T020000Z-v2".into()),
        };
        let r = of_run(&end, 1, min);
        assert_eq!(r.rollout.as_deref(), Some("20261123T020000Z-v2"));
        assert!(r.ok && r.step.is_none() && r.message.is_none() && r.retry_at.is_none());
        assert_eq!((r.at, r.attempt), (1000, 1));
        assert_eq!(r.run_dir.as_deref(), Some("/var/lib/jiocloud/runs/x-v2"));

        let failed = Outcome::Failure("puppet exited 6: changes were made and some resources failed".into());
        let end = RunEnd {
            step: Step::Configured,
            outcome: &failed,
            exit_code: Some(6),
            detail: Some(
                "Error: /Stage[main]/Main/Exec[broken]/returns: change from 'notrun' to ['0'] failed".into(),
            ),
            ..end
        };
        let r = of_run(&end, 3, min);
        assert!(!r.ok);
        assert_eq!(r.step.as_deref(), Some("configured"));
        assert_eq!(r.exit_code, Some(6));
        let m = r.message.unwrap();
        assert!(m.starts_with("puppet exited 6: Error: /Stage[main]"), "{m}");
        assert!(m.chars().count() <= MESSAGE_CHARS, "{m}");
        // The third attempt backs off 4 intervals.
        assert_eq!(r.retry_at, Some(1000 + 4 * 60));
    }

    #[test]
    fn attempts_count_up_at_one_version() {
        let f = |version: &str, attempts| Failure {
            version: v(version),
            at: 1,
            attempts,
            gate_revisions: [0; 3],
            reported: None,
        };
        assert_eq!(attempt(None, &v("v2")), 1);
        assert_eq!(attempt(Some(&f("v2", 1)), &v("v2")), 2);
        assert_eq!(attempt(Some(&f("v1", 4)), &v("v2")), 1);
    }

    #[test]
    fn messages_are_one_short_line() {
        let cases = [
            (
                "validation exited 1",
                Some("service does not answer"),
                "validation exited 1: service does not answer",
            ),
            (
                "puppet exited 4: some resources failed",
                None,
                "puppet exited 4: some resources failed",
            ),
            (
                "puppet did not finish within 3s and was stopped",
                Some("Notice: x"),
                "puppet did not finish within 3s and was stopped: Notice: x",
            ),
            ("a\nb  c", None, "a b c"),
        ];
        for (reason, detail, want) in cases {
            assert_eq!(message(reason, detail), want);
        }
        assert_eq!(message(&"x".repeat(500), None).chars().count(), MESSAGE_CHARS);
    }

    #[test]
    fn the_first_meaningful_line() {
        let cases = [
            (
                "\n\nNotice: Compiled catalog\n\u{1b}[1;31mError: boom\u{1b}[0m\nError: later\n",
                Some("Error: boom"),
            ),
            ("Notice: only notices\n", None),
            ("  \nservice does not answer\n", Some("service does not answer")),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(first_meaningful_line(text).as_deref(), want, "{text:?}");
        }
    }

    #[test]
    fn the_first_puppet_error() {
        let log = r#"{"level":"err","message":"Permission denied @ rb_sysopen - /proc/1/environ","source":"Facter"}
{"level":"notice","message":"Compiled catalog","source":"Puppet"}
{"level":"err","message":"'/bin/false' returned 1 instead of one of [0]","source":"Puppet"}
{"level":"err","message":"change from 'notrun' to ['0'] failed: '/bin/false' returned 1 instead of one of [0]","source":"/Stage[main]/Main/Exec[broken]/returns"}
not json
"#;
        assert_eq!(
            first_puppet_error(log).as_deref(),
            Some(
                "Exec[broken]: change from 'notrun' to ['0'] failed: '/bin/false' returned 1 instead of one of [0]"
            )
        );
        let compile = r#"{"level":"err","message":"Facter","source":"Facter"}
{"level":"err","message":"Could not parse for environment production: Syntax error","source":"Puppet"}"#;
        assert_eq!(
            first_puppet_error(compile).as_deref(),
            Some("Could not parse for environment production: Syntax error")
        );
        assert_eq!(first_puppet_error(r#"{"level":"notice","message":"ok"}"#), None);
    }

    #[test]
    fn a_soak_failure_and_a_check() {
        let run = HostResult {
            version: v("v2"),
            ok: true,
            step: None,
            service: None,
            task: None,
            exit_code: None,
            message: None,
            run_dir: Some("/r/1".into()),
            log: Some("http://swift/o".into()),
            at: 100,
            checked_at: None,
            attempt: 2,
            retry_at: None,
            rollout: None,
            packages: None,
        };
        // A set seen while idle: a result without one (a composable step wrote it)
        // takes it; one with it moves only on a new digest; a failed one never.
        let set = jio_common::packages::PackageSet::from_text("p all 1\n").unwrap();
        let mut r = run.clone();
        assert!(packages_changed(&mut r, &v("v2"), &set, &set.digest(), 7));
        assert_eq!(
            r.packages.as_ref().map(|p| (p.digest.clone(), p.count, p.at)),
            Some((set.digest(), 1, 7))
        );
        assert!(
            !packages_changed(&mut r, &v("v2"), &set, &set.digest(), 8),
            "same digest"
        );
        assert!(
            !packages_changed(&mut r.clone(), &v("v3"), &set, "sha256:x", 8),
            "another version"
        );
        assert!(packages_changed(&mut r, &v("v2"), &set, "sha256:x", 9));
        let mut failed = HostResult {
            ok: false,
            ..run.clone()
        };
        assert!(!packages_changed(&mut failed, &v("v2"), &set, &set.digest(), 7));
        let f = soak_failed(&run, "validation exited 1", Some("down"), Path::new("/r/2"));
        assert!(!f.ok);
        assert_eq!((f.step.as_deref(), f.at, f.attempt), (Some("validated"), 100, 2));
        assert_eq!(
            f.message.as_deref(),
            Some("the health check failed during the min_healthy_time soak: validation exited 1: down")
        );
        assert_eq!(
            (f.run_dir.as_deref(), f.log, f.retry_at),
            (Some("/r/2"), None, None)
        );

        let mut r = run.clone();
        assert!(checked(&mut r, &v("v2"), 150));
        assert_eq!(r.checked_at, Some(150));
        assert!(!checked(&mut r, &v("v2"), 150), "not older");
        assert!(!checked(&mut r, &v("v3"), 200), "another version's result");
    }
}
