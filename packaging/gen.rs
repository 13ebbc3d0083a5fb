//! `jio-gen --docs docs`: writes the reference pages made from the code (exit codes,
//! the agent's configuration keys) under `docs/reference/`; a test fails when the
//! pages in the tree differ from them.
//!
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

/// The EXIT STATUS section of a page, from a binary's table of documented codes.
fn exit_status(codes: &[(&str, &str)]) -> String {
    codes
        .iter()
        .map(|(code, text)| format!(".TP\n\\fB{code}\\fR\n{}\n", roff_text(text)))
        .collect()
}

/// Markdown text as roff: `code` in bold, backslashes escaped.
fn roff_text(md: &str) -> String {
    let escaped = md.replace('\\', "\\e");
    let mut out = String::new();
    for (i, part) in escaped.split('`').enumerate() {
        if i % 2 == 1 {
            out.push_str(&format!("\\fB{part}\\fR"));
        } else {
            out.push_str(part);
        }
    }
    out
}

fn man(cmd: &clap::Command, section: &str, extra: Extra, out: &Path) -> std::io::Result<()> {
    man_with(cmd, section, None, extra, out)
}

/// A page with its EXIT STATUS (`None`: a subcommand's page, which has none of its own).
fn man_with(
    cmd: &clap::Command,
    section: &str,
    exit: Option<&[(&str, &str)]>,
    extra: Extra,
    out: &Path,
) -> std::io::Result<()> {
    let name = cmd.get_name().to_string();
    let page = clap_mangen::Man::new(cmd.clone()).section(section);
    let mut buf = Vec::new();
    page.render(&mut buf)?;
    // clap_mangen titles the text after the options EXTRA; ours is the examples.
    let buf = String::from_utf8_lossy(&buf).replace(".SH EXTRA\nExamples:\n", ".SH EXAMPLES\n");
    let mut buf = buf.into_bytes();
    if let Some(codes) = exit {
        buf.extend_from_slice(format!(".SH \"EXIT STATUS\"\n{}", exit_status(codes)).as_bytes());
    }
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
        "FILES",
        items!(
            (
                "~/.config/jiocloud/jioctl.toml",
                "the configuration: store, prefix, role_pattern, state_dir, [swift], [hooks.ROLE]"
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
            (
                "JIO_STATE_DIR",
                "where a driver keeps the maintenance hooks' logs"
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
    man_with(
        &agent,
        "8",
        Some(jio_agent::cli::exit::DOCUMENTED),
        AGENT_EXTRA,
        &man_dir,
    )?;
    // One page per subcommand (help and nested ones included), so every
    // reference resolves.
    sub_pages(&agent, "8", &man_dir)?;
    agent_toml_page(&man_dir)?;

    let mut ctl = no_help(jioctl::cli::Cli::command());
    ctl.build();
    man_with(&ctl, "1", Some(jioctl::exit::DOCUMENTED), CTL_EXTRA, &man_dir)?;
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

/// The note that heads a page made from the code.
const GENERATED: &str = "<!-- Made from the code by `cargo run -p jio-packaging --bin jio-gen -- --docs docs`: edit the code, not this page. -->";

/// A Markdown table cell: pipes escaped, on one line.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn codes_table(codes: &[(&str, &str)]) -> String {
    let rows: String = codes
        .iter()
        .map(|(c, t)| format!("| {c} | {} |\n", cell(t)))
        .collect();
    format!("| code | meaning |\n| --- | --- |\n{rows}")
}

/// `docs/reference/exit-codes.md`.
fn exit_codes_page() -> String {
    format!(
        "{GENERATED}\n\n# Exit codes\n\nBoth programs end with one of these codes, and say why on stderr (or in the \
         log, for the agent's daemon).\n\n## jio-agent\n\n{}\n## jioctl\n\n{}",
        codes_table(jio_agent::cli::exit::DOCUMENTED),
        codes_table(jioctl::exit::DOCUMENTED)
    )
}

/// `docs/reference/configuration.md`.
fn configuration_page() -> String {
    let rows: String = jio_agent::config_keys::KEYS
        .iter()
        .map(|k| format!("| `{}` | {} | {} |\n", k.key, cell(k.default), cell(k.meaning)))
        .collect();
    let ctl_rows: String = jioctl::config_keys::KEYS
        .iter()
        .map(|k| format!("| `{}` | {} | {} |\n", k.key, cell(k.default), cell(k.meaning)))
        .collect();
    format!(
        "{GENERATED}\n\n# The agent's configuration\n\n`/etc/jiocloud/agent.toml` (or `--config PATH`, or `JIO_CONFIG`) configures \
         `jio-agent`; `man 5 agent.toml` shows the packaged file, which lists every key with its default. Every key \
         is optional. Unknown keys are errors (with the key most likely meant: ``unknown key `stroe`: did you mean \
         `store`?``), and every invalid value is reported at once. A file that cannot be parsed is reported as the \
         parser sees it (the line, the column and the line itself) and is the one error reported: nothing is \
         guessed without it. The same holds for `jioctl.toml`.\n\n\
         Precedence is flag > environment > file > default. Every scalar key can also be set as `JIO_<KEY>` \
         (`JIO_STORE`, `JIO_ROLE`, `JIO_RETRY_INTERVAL`, ...); flags exist for `--store`, `--prefix`, `--hostname`, \
         `--role` and `--state-dir`. Durations are written `500ms`, `30s`, `10m`, `2h`, `1d`, or combined: `1h30m` \
         (also `1h 30m`, `1.5h`; a day is 24 hours).\n\n| key | default | meaning |\n| --- | --- | --- |\n{rows}\n\
         # jioctl's configuration\n\n`~/.config/jiocloud/jioctl.toml` (or `--config PATH`, or `JIOCTL_CONFIG`; \
         `/etc/jiocloud/jioctl.toml` for the `jioctl-drive` service) configures `jioctl`. Every key is optional; the \
         same rules hold (unknown keys and invalid values are errors naming the file and the key, exit 64, nothing \
         written). The example `/usr/share/doc/jioctl/examples/hooks/jioctl.toml` gives two roles maintenance \
         hooks.\n\n| key | default | meaning |\n| --- | --- | --- |\n{ctl_rows}"
    )
}

/// The reference pages made from the code, by their path under `docs/`.
fn reference_pages() -> Vec<(&'static str, String)> {
    vec![
        ("reference/exit-codes.md", exit_codes_page()),
        ("reference/configuration.md", configuration_page()),
    ]
}

fn write_docs(docs: &Path) -> std::io::Result<()> {
    for (path, text) in reference_pages() {
        let file = docs.join(path);
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(file, text)?;
    }
    Ok(())
}

/// Writes the man pages and completions of jio-agent and jioctl, or the reference
/// pages of the manual.
#[derive(clap::Parser)]
#[command(name = "jio-gen")]
struct Args {
    /// The directory to write `man/` and `completions/` into (created if missing)
    #[arg(long, short = 'o', value_name = "DIR", required_unless_present = "docs")]
    out_dir: Option<PathBuf>,
    /// The manual's directory (`docs`): writes its reference pages made from the code
    #[arg(long, value_name = "DIR")]
    docs: Option<PathBuf>,
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
    let written = [
        args.docs.map(|d| (write_docs(&d), d)),
        args.out_dir.map(|o| (generate(&o), o)),
    ];
    for (result, dir) in written.into_iter().flatten() {
        if let Err(e) = result {
            eprintln!("jio-gen: {}: {e}", dir.display());
            return ExitCode::from(70);
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;

    /// The reference pages in the tree are those the code makes.
    #[test]
    fn the_reference_pages_are_those_the_code_makes() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
        for (path, want) in reference_pages() {
            let have = std::fs::read_to_string(docs.join(path)).unwrap_or_default();
            assert!(
                have == want,
                "docs/{path} differs from the code: run `cargo run -p jio-packaging --bin jio-gen -- --docs docs`"
            );
        }
    }

    /// groff lays every page out without a warning (a long unbroken word in a help
    /// text is what lintian reports as `groff-message`).
    #[test]
    fn pages_render_without_groff_warnings() {
        let dir = tempfile::tempdir().unwrap();
        generate(dir.path()).unwrap();
        let mut pages = 0;
        for e in std::fs::read_dir(dir.path().join("man")).unwrap() {
            let page = e.unwrap().path();
            let out = std::process::Command::new("groff")
                .args(["-man", "-Tutf8", "-ww", "-z"])
                .arg(&page)
                .output()
                .expect("groff is missing: apt-get install -y groff-base");
            let warnings = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && warnings.is_empty(),
                "{}: {warnings}",
                page.display()
            );
            pages += 1;
        }
        assert!(pages > 30, "{pages} pages");
    }

    /// The man pages' exit codes are the documented ones, in bold, without Markdown.
    #[test]
    fn exit_status_comes_from_the_documented_codes() {
        let roff = exit_status(jioctl::exit::DOCUMENTED);
        assert!(roff.contains(".TP\n\\fB130, 143\\fR\n"), "{roff}");
        assert!(roff.contains("\\fBupgrade --timeout\\fR passed"), "{roff}");
        assert!(!roff.contains('`'), "{roff}");
    }

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
