//! `jio-gen --out-dir DIR`: writes the man pages (`jio-agent.8`, `jioctl.1` and one page
//! per subcommand, with the exit status, files, environment and examples) and the
//! bash, zsh and fish completions of both, generated from the same clap definitions
//! the binaries parse, so they never drift; and `agent.toml.5` from the packaged,
//! commented configuration file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

/// The sections clap does not know, as (title, roff body).
type Extra = &'static [(&'static str, &'static str)];

fn man(cmd: &clap::Command, section: &str, extra: Extra, out: &Path) -> std::io::Result<()> {
    let name = cmd.get_name().to_string();
    let page = clap_mangen::Man::new(cmd.clone()).section(section);
    let mut buf = Vec::new();
    page.render(&mut buf)?;
    for (title, body) in extra {
        buf.extend_from_slice(format!(".SH \"{title}\"\n{body}\n").as_bytes());
    }
    std::fs::write(out.join(format!("{name}.{section}")), buf)
}

/// A roff list of (term, text) items.
macro_rules! items {
    ($(($term:expr, $text:expr)),* $(,)?) => {
        concat!($(".TP\n\\fB", $term, "\\fR\n", $text, "\n"),*)
    };
}

const AGENT_EXTRA: Extra = &[
    (
        "EXIT STATUS",
        items!(
            ("0", "success (pending-update: an update is pending)"),
            (
                "1",
                "the upgrade failed, waits to retry after a failure, or is blocked by an invalid stored value, which is named (pending-update: up to date)"
            ),
            (
                "2",
                "the store is unreachable (or results could not be reported yet)"
            ),
            (
                "3",
                "pending-update only: the store is unreachable and there is no local version"
            ),
            ("4", "another jio-agent is running on this host"),
            ("5", "the run was interrupted by SIGTERM or SIGINT"),
            (
                "8",
                "the store refused (TLS, authentication or permission); the daemon waits and says why instead"
            ),
            ("64", "bad command line or configuration"),
            (
                "70",
                "a local file needed before deciding could not be read or written"
            ),
        ),
    ),
    (
        "SIGNALS",
        items!(
            (
                "SIGTERM, SIGINT",
                "nothing new starts; a running command gets stop_grace, then its process group is stopped and the run recorded as interrupted"
            ),
            (
                "SIGHUP",
                "run only: the configuration is read again; one with a problem is logged and the daemon runs on, a valid one is applied by starting again in place (same PID)"
            ),
            ("SIGUSR1", "logs the number of store requests since start"),
        ),
    ),
    (
        "FILES",
        items!(
            ("/etc/jiocloud/agent.toml", "the configuration, see agent.toml(5)"),
            (
                "/var/lib/jiocloud",
                "the state directory: the run journal, run directories, the lock"
            ),
            ("/etc/current_version", "the local version"),
            ("/usr/lib/jiocloud/tests", "validation scripts, run by run-parts"),
            (
                "/usr/lib/jiocloud/services",
                "the services' upgrade task files (composable rollouts)"
            ),
            ("/usr/lib/jiocloud/actions", "the actions fleet commands may run"),
        ),
    ),
    (
        "ENVIRONMENT",
        items!(
            ("JIO_CONFIG", "the configuration file, as --config"),
            (
                "JIO_<KEY>",
                "any scalar key of agent.toml, e.g. JIO_STORE, JIO_ROLE, JIO_RETRY_INTERVAL (flag > environment > file > default)"
            ),
            (
                "JIO_LOG",
                "the log filter (tracing's EnvFilter syntax), e.g. debug"
            ),
            (
                "JOURNAL_STREAM",
                "set by systemd: when it names stderr, log lines carry no time of their own"
            ),
            (
                "NOTIFY_SOCKET, WATCHDOG_USEC",
                "set by systemd: readiness, reload and watchdog notifications"
            ),
        ),
    ),
    (
        "EXAMPLES",
        items!(
            (
                "jio-agent status",
                "what this host sees: desired and local version, the enable decision, the last run"
            ),
            ("jio-agent once", "one pass, as cron or a person would run it"),
            (
                "systemctl kill -s HUP --kill-whom=main jio-agent",
                "apply an edited agent.toml"
            ),
        ),
    ),
    ("SEE ALSO", "agent.toml(5), jioctl(1)"),
];

const CTL_EXTRA: Extra = &[
    (
        "EXIT STATUS",
        items!(
            ("0", "success; a followed rollout is done"),
            (
                "1",
                "the rollout failed, a fleet command did not succeed everywhere, a check is false, status shows a failed or lost host, or a rollout change is not allowed"
            ),
            ("2", "the store is unreachable"),
            (
                "3",
                "the rules are invalid (nothing was written), or stopped fitting the fleet"
            ),
            ("4", "this jioctl lost the rollout lock to another driver"),
            ("5", "upgrade --timeout passed (the rollout goes on)"),
            ("6", "an operator stopped the followed rollout or fleet command"),
            (
                "7",
                "the rollout is stuck: no host finished within its progress_deadline"
            ),
            (
                "8",
                "the store refused: TLS, authentication or permission (nothing was written)"
            ),
            (
                "64",
                "bad command line, configuration or argument, or a mass release refused without --force (nothing was written)"
            ),
            ("70", "anything else"),
            (
                "130, 143",
                "stopped by SIGINT or SIGTERM; the rollout lock was released"
            ),
            ("141", "its standard output was closed by its reader"),
        ),
    ),
    (
        "FILES",
        items!(
            (
                "~/.config/jiocloud/jioctl.toml",
                "the configuration: store, prefix, role_pattern, [swift]"
            ),
            ("/etc/jio-upgrade.json", "the default rules of upgrade and run"),
        ),
    ),
    (
        "ENVIRONMENT",
        items!(
            (
                "JIO_STORE, JIO_PREFIX, JIO_ROLE_PATTERN",
                "as --store, --prefix, --role-pattern"
            ),
            ("JIO_LOG", "the log filter, e.g. debug"),
            ("XDG_CONFIG_HOME", "where jioctl.toml is looked for"),
        ),
    ),
    ("EXAMPLES", EXAMPLES_ROFF),
    ("SEE ALSO", "jio-agent(8), agent.toml(5)"),
];

const EXAMPLES_ROFF: &str = items!(
    (
        "jioctl status",
        "the fleet by state and role, and why each host waits"
    ),
    (
        "jioctl upgrade v42 --instructions-file /etc/jio-upgrade.json",
        "roll v42 out under the rules, and follow it"
    ),
    ("jioctl --json status", "the same for programs"),
    ("jioctl global-disable-puppet", "the emergency stop"),
    (
        "jioctl run --role compute restart-nova",
        "a fleet command, role by role under the rules"
    ),
);

/// agent.toml(5): the packaged, commented configuration file is the reference.
fn agent_toml_page(out: &Path) -> std::io::Result<()> {
    let sample = include_str!("agent/agent.toml").replace('\\', "\\e");
    let sample: String = sample
        .lines()
        .map(|l| {
            if l.starts_with('.') || l.starts_with('\'') {
                format!("\\&{l}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    let page = format!(
        ".TH agent.toml 5 \"\" \"jio-agent {}\"\n.SH NAME\nagent.toml \\- configuration of jio-agent\n.SH DESCRIPTION\n\
/etc/jiocloud/agent.toml (or --config PATH, or JIO_CONFIG) configures jio-agent(8). \
Every key is optional; unknown keys are errors (with the key most likely meant), and every invalid value is reported at once. \
Precedence is flag > environment (JIO_<KEY>) > file > default. \
Durations are written 500ms, 30s, 10m, 2h, 1d or combined, 1h30m. \
The file as packaged lists every key with its default and what it does:\n.PP\n.nf\n{sample}.fi\n.SH SEE ALSO\njio-agent(8)\n",
        env!("CARGO_PKG_VERSION")
    );
    std::fs::write(out.join("agent.toml.5"), page)
}

/// The command without its `help` subcommands: a man page documents `--help`
/// already, and a page per `help X` would only repeat X's.
fn no_help(c: clap::Command) -> clap::Command {
    c.disable_help_subcommand(true).mut_subcommands(no_help)
}

/// `<parent>-<sub>.<section>` for every subcommand, down to the nested ones.
fn sub_pages(parent: &clap::Command, section: &str, out: &Path) -> std::io::Result<()> {
    for sub in parent.get_subcommands() {
        let named = sub
            .clone()
            .name(format!("{}-{}", parent.get_name(), sub.get_name()));
        man(&named, section, &[], out)?;
        sub_pages(&named, section, out)?;
    }
    Ok(())
}

fn generate(out: &Path) -> std::io::Result<()> {
    let man_dir = out.join("man");
    let comp_dir = out.join("completions");
    std::fs::create_dir_all(&man_dir)?;
    std::fs::create_dir_all(&comp_dir)?;

    let mut agent = no_help(jio_agent::cli::Cli::command());
    agent.build();
    man(&agent, "8", AGENT_EXTRA, &man_dir)?;
    // One page per subcommand (help and nested ones included), so every
    // reference resolves.
    sub_pages(&agent, "8", &man_dir)?;
    agent_toml_page(&man_dir)?;

    let mut ctl = no_help(jioctl::cli::Cli::command());
    ctl.build();
    man(&ctl, "1", CTL_EXTRA, &man_dir)?;
    sub_pages(&ctl, "1", &man_dir)?;
    // The completions know the `help` subcommands the binaries have.
    let mut agent = jio_agent::cli::Cli::command();
    let mut ctl = jioctl::cli::Cli::command();
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut ctl, "jioctl", &comp_dir)?;
        clap_complete::generate_to(shell, &mut agent, "jio-agent", &comp_dir)?;
    }
    Ok(())
}

/// Writes the man pages and completions of jio-agent and jioctl.
#[derive(clap::Parser)]
#[command(name = "jio-gen")]
struct Args {
    /// The directory to write `man/` and `completions/` into (created if missing)
    #[arg(long, short = 'o', value_name = "DIR")]
    out_dir: PathBuf,
}

fn main() -> ExitCode {
    let args = match <Args as clap::Parser>::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(64)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let out = args.out_dir;
    match generate(&out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("jio-gen: {}: {e}", out.display());
            ExitCode::from(70)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;

    /// Every `name(N)` a page names (SEE ALSO, subcommands) is a page written.
    #[test]
    fn pages_have_the_sections_and_every_reference_resolves() {
        let dir = tempfile::tempdir().unwrap();
        generate(dir.path()).unwrap();
        let man = dir.path().join("man");
        let read = |n: &str| std::fs::read_to_string(man.join(n)).unwrap();
        for page in ["jioctl.1", "jio-agent.8"] {
            let t = read(page);
            for s in ["EXIT STATUS", "FILES", "ENVIRONMENT", "EXAMPLES", "SEE ALSO"] {
                assert!(t.contains(&format!(".SH \"{s}\"")), "{page}: no {s}");
            }
        }
        assert!(
            read("agent.toml.5").contains("log_format"),
            "agent.toml(5) lists the keys"
        );
        let mut refs = 0;
        for e in std::fs::read_dir(&man).unwrap() {
            let text = std::fs::read_to_string(e.unwrap().path())
                .unwrap()
                .replace("\\-", "-")
                .replace("\\fB", " ")
                .replace("\\fI", " ")
                .replace("\\fR", " ");
            for (i, _) in text.match_indices('(') {
                let section = text[i + 1..].chars().next().filter(|c| c.is_ascii_digit());
                let close = text[i + 1..].chars().nth(1) == Some(')');
                let name: String = text[..i]
                    .chars()
                    .rev()
                    .take_while(|c| c.is_ascii_alphanumeric() || "-._".contains(*c))
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                if let (Some(n), true, false) = (section, close, name.is_empty()) {
                    assert!(
                        man.join(format!("{name}.{n}")).exists(),
                        "{name}({n}) has no page"
                    );
                    refs += 1;
                }
            }
        }
        assert!(refs > 20, "the references were found ({refs})");
    }
}
