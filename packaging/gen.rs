//! `jio-gen --out-dir DIR`: writes the man pages (`jio-agent.8`, `jioctl.1` and one page
//! per jioctl subcommand) and jioctl's bash, zsh and fish completions, generated
//! from the same clap definitions the binaries parse, so they never drift.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

fn man(cmd: &clap::Command, section: &str, out: &Path) -> std::io::Result<()> {
    let name = cmd.get_name().to_string();
    let page = clap_mangen::Man::new(cmd.clone()).section(section);
    let mut buf = Vec::new();
    page.render(&mut buf)?;
    std::fs::write(out.join(format!("{name}.{section}")), buf)
}

fn generate(out: &Path) -> std::io::Result<()> {
    let man_dir = out.join("man");
    let comp_dir = out.join("completions");
    std::fs::create_dir_all(&man_dir)?;
    std::fs::create_dir_all(&comp_dir)?;

    let mut agent = jio_agent::cli::Cli::command();
    agent.build();
    man(&agent, "8", &man_dir)?;

    let mut ctl = jioctl::cli::Cli::command();
    ctl.build();
    man(&ctl, "1", &man_dir)?;
    for sub in ctl.get_subcommands().filter(|s| s.get_name() != "help") {
        let named = sub.clone().name(format!("jioctl-{}", sub.get_name()));
        man(&named, "1", &man_dir)?;
    }
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut ctl, "jioctl", &comp_dir)?;
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
