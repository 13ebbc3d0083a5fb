//! The command line: the global flags, and `main`: parse, set up logging, build the
//! context, run the command, map its outcome to a documented exit code (`exit`).

use std::path::PathBuf;

use clap::Parser;

use crate::commands::Command;
use crate::config::{self, Flags};
use crate::context::Context;
use crate::exit::{self, Failure, Outcome};

/// The heading of the options every subcommand takes.
const GLOBAL: &str = "Global options";

#[derive(Parser, Debug)]
#[command(
    name = "jioctl",
    version,
    about = "Drive rolling upgrades of the jiocloud fleet",
    after_help = concat!(
        "Examples:\n",
        "  jioctl status                 the fleet by state and role, and why each host waits\n",
        "  jioctl upgrade v42 --instructions-file /etc/jio-upgrade.json\n",
        "                                roll v42 out under the rules, and follow it\n",
        "  jioctl --json status          the same for programs (one JSON document)\n",
        "  jioctl global-disable-puppet  the emergency stop\n",
        "  jioctl run --role compute restart-nova\n",
        "                                a fleet command, role by role under the rules\n",
        "\n",
        "Exit status: 0 success, 1 failed, 2 store unreachable, 3 invalid rules,\n",
        "8 refused by the store, 64 bad usage; the whole table is in jioctl(1)."
    )
)]
pub struct Cli {
    /// Store URL: etcd://HOST:PORT, sqlite://PATH, consul://HOST:PORT [env: JIO_STORE]
    ///
    /// The store every jioctl and agent of the fleet shares [env: JIO_STORE; file:
    /// store; default: the embedded store /var/lib/jiocloud/store.db for root,
    /// ~/.local/state/jiocloud/store.db for others]. Its forms:
    /// etcd://HOST:PORT, several endpoints separated by commas; etcds://HOST:PORT for
    /// TLS and users, with the query keys ca_file, cert_file, key_file, server_name,
    /// user and password_file; sqlite://PATH, an embedded store; consul://HOST:PORT or
    /// consuls://HOST:PORT for TLS, with the query keys dc, token_file and ca_file
    /// (HOST:PORT?KEY=VALUE&KEY=VALUE).
    #[arg(long, global = true, value_name = "URL", help_heading = GLOBAL)]
    pub store: Option<String>,
    /// Namespace prefix of every key [env: JIO_PREFIX]
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub prefix: Option<String>,
    /// The role of an unregistered host, from its name [env: JIO_ROLE_PATTERN]
    ///
    /// The role of a host that has not registered, from its name: a regex whose first
    /// group is the role [env: JIO_ROLE_PATTERN; default: the agents'
    /// ^([a-z]+)[0-9]+(-.*)?$]
    #[arg(long, global = true, value_name = "REGEX", help_heading = GLOBAL)]
    pub role_pattern: Option<String>,
    /// Configuration file [env: JIOCTL_CONFIG; default: ~/.config/jiocloud/jioctl.toml]
    // The variable is said in the text, as the others' are: clap would show its
    // value as the environment of whoever renders the help has it.
    #[arg(
        long,
        global = true,
        env = "JIOCTL_CONFIG",
        hide_env = true,
        value_name = "PATH",
        help_heading = GLOBAL
    )]
    pub config: Option<PathBuf>,
    /// Machine-readable output on stdout
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub json: bool,
    /// More output: every pass's plan (upgrade), logs on stderr
    #[arg(short, long, global = true, action = clap::ArgAction::Count, help_heading = GLOBAL)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

/// Parses and runs; returns the exit code.
pub fn main() -> u8 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // clap says what was wrong with which argument (or prints the help).
            let _ = e.print();
            return if e.use_stderr() { exit::USAGE } else { exit::OK };
        }
    };
    init_logging(cli.verbose);
    let outcome = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(run(cli)),
        Err(e) => Err(Failure::with(
            exit::SOFTWARE,
            anyhow::Error::new(e).context("cannot start the runtime"),
        )),
    };
    exit::report(outcome)
}

fn init_logging(verbose: u8) {
    let filter = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("JIO_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        // Through the progress bars, when they are drawn: a log line never cuts one.
        .with_writer(|| crate::out::Stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Builds the context from the configuration and runs the command.
pub async fn run(cli: Cli) -> Outcome {
    let flags = Flags {
        store: cli.store,
        prefix: cli.prefix,
        role_pattern: cli.role_pattern,
    };
    let config = config::load(cli.config.as_deref(), &flags, |k| std::env::var(k).ok())
        .map_err(|e| Failure::usage(format!("invalid configuration: {e:#}")))?;
    crate::out::json_mode(cli.json);
    let ctx = Context {
        config,
        json: cli.json,
        verbose: cli.verbose,
    };
    cli.command.run(&ctx).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use clap::CommandFactory;

    use super::*;

    /// A shell line as words: quotes (single or double) group, nothing else is
    /// special; the last command of a pipeline.
    fn words(line: &str) -> Vec<String> {
        let line = line.rsplit(" | ").next().unwrap_or(line);
        let (mut out, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
        for c in line.chars() {
            match (quote, c) {
                (None, '\'' | '"') => (quote, any) = (Some(c), true),
                (Some(q), c) if c == q => quote = None,
                (None, ' ') => {
                    if any {
                        out.push(std::mem::take(&mut word));
                    }
                    any = false;
                }
                (_, c) => (word.push(c), any = true).1,
            }
        }
        assert!(quote.is_none(), "unbalanced quote in {line:?}");
        if any {
            out.push(word);
        }
        out
    }

    /// Every subcommand, nested ones too, by its full path (`rollout pause`).
    fn every_subcommand(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let path = format!("{path} {}", sub.get_name());
            out.push((path.clone(), sub.clone()));
            every_subcommand(sub, &path, out);
        }
    }

    /// Each subcommand's help ends with 1 to 3 examples in 80 columns, each a
    /// command line jioctl parses, invoking that very subcommand: a new subcommand
    /// without one, or an example that no longer parses, fails here.
    #[test]
    fn every_subcommand_has_examples_that_parse() {
        let mut subs = Vec::new();
        every_subcommand(&Cli::command(), "jioctl", &mut subs);
        assert!(subs.len() > 30, "{} subcommands", subs.len());
        let mut wrong = Vec::new();
        for (path, sub) in &subs {
            let help = sub.get_after_help().map(|h| h.to_string()).unwrap_or_default();
            let Some(section) = help.split_once("Examples:\n").map(|(_, e)| e) else {
                wrong.push(format!("{path}: no Examples: section"));
                continue;
            };
            let invocations: Vec<&str> = section
                .lines()
                .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
                .map(str::trim)
                .collect();
            for l in section.lines().filter(|l| l.chars().count() > 80) {
                wrong.push(format!("{path}: wider than 80 columns: {l:?}"));
            }
            if !(1..=3).contains(&invocations.len()) {
                wrong.push(format!("{path}: {} examples", invocations.len()));
            }
            for line in invocations {
                let w = words(line);
                // The subcommand's words, in order, global options aside.
                let named: Vec<&str> = path.split(' ').collect();
                let mut at = w.iter().map(String::as_str);
                if !named.iter().all(|n| at.any(|x| x == *n)) {
                    wrong.push(format!("{path}: {line:?} does not invoke it"));
                }
                if let Err(e) = Cli::try_parse_from(&w) {
                    wrong.push(format!("{path}: {line:?} does not parse: {e}"));
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn words_are_split_as_a_shell_does() {
        assert_eq!(
            words("echo a | jioctl hold x --reason 'disk swap' --x \"a b\" ''"),
            ["jioctl", "hold", "x", "--reason", "disk swap", "--x", "a b", ""]
        );
    }
}
