//! A simulated node for agent tests: its own state directory, version file, fact
//! file, validation directory and `agent.toml`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// One host's files.
pub struct Host {
    pub name: String,
    dir: tempfile::TempDir,
}

impl Host {
    /// A host using `store`, running `puppet_command` with `extra` TOML lines appended
    /// to its configuration. Validation passes until `set_validation(false)`. No
    /// pre-commands, no package sets and apt files of its own unless `extra` sets
    /// `pre_commands`, `dpkg_status_file` or `apt_*_file` (the test machine's own
    /// dpkg and apt are not a host's).
    pub fn new(name: &str, store: &str, puppet_command: &[String], extra: &str) -> Host {
        let dir = tempfile::Builder::new()
            .prefix(&format!("jio-host-{name}-"))
            .tempdir()
            .expect("temporary directory");
        let h = Host {
            name: name.to_string(),
            dir,
        };
        std::fs::create_dir_all(h.validation_dir()).expect("validation dir");
        h.set_validation(true);
        let p = |x: PathBuf| toml_str(&x.display().to_string());
        let cmd: Vec<String> = puppet_command.iter().map(|a| toml_str(a)).collect();
        let unless_given = |key: &str, line: &str| {
            let given = extra
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{key} =")));
            if given { String::new() } else { format!("{line}\n") }
        };
        // Its own apt files: a template in the store never reaches the machine's /etc/apt.
        let defaults = unless_given("pre_commands", "pre_commands = []")
            + &unless_given("dpkg_status_file", "dpkg_status_file = \"\"")
            + &unless_given(
                "apt_sources_file",
                &format!("apt_sources_file = {}", p(h.dir().join("jiocloud-snapshot.list"))),
            )
            + &unless_given(
                "apt_preferences_file",
                &format!(
                    "apt_preferences_file = {}",
                    p(h.dir().join("jiocloud-snapshot.pref"))
                ),
            );
        let config = format!(
            "store = {}\nhostname = {}\nstate_dir = {}\nversion_file = {}\nfacts_file = {}\nvalidation_dir = {}\nhiera_file = {}\n{defaults}puppet_command = [{}]\nlease_ttl = \"3s\"\nreboot_required_file = {}\nboot_id_file = {}\nreboot_command = [{}]\n{extra}\n",
            toml_str(store),
            toml_str(name),
            p(h.state_dir()),
            p(h.version_file()),
            p(h.facts_file()),
            p(h.validation_dir()),
            p(h.hiera_file()),
            cmd.join(", "),
            p(h.reboot_required_file()),
            p(h.boot_id_file()),
            p(h.dir().join("reboot")),
        );
        std::fs::write(h.config(), config).expect("write agent.toml");
        h.write_reboot_command();
        h
    }

    /// The simulated host's reboot: `reboot` (its reboot command) logs `down <boot
    /// id> <time>` to `reboots.log`, clears the reboot-required file (as a reboot
    /// clears /run) unless `keep-required` exists, leaves the next boot id in
    /// `boot_id.next` and stops its agent with SIGTERM, as systemd does at a
    /// reboot. With `no-reboot` present it logs and returns without rebooting. The
    /// test plays the boot (`boot`).
    fn write_reboot_command(&self) {
        std::fs::write(self.boot_id_file(), "boot-0\n").expect("write boot id");
        let p = self.dir().join("reboot");
        std::fs::write(
            &p,
            "#!/bin/sh\n\
             d=$(dirname \"$0\")\n\
             now() { env -u LD_PRELOAD -u FAKETIME date +%s.%N; }\n\
             echo \"down $(cat \"$d/boot_id\") $(now)\" >> \"$d/reboots.log\"\n\
             [ -e \"$d/no-reboot\" ] && exit 0\n\
             [ -e \"$d/keep-required\" ] || rm -f \"$d/reboot-required\"\n\
             n=$(wc -l < \"$d/reboots.log\")\n\
             echo \"boot-$n\" > \"$d/boot_id.next\"\n\
             kill -TERM $PPID\n",
        )
        .expect("write reboot command");
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    }

    /// The file whose presence says a reboot is required (Debian's
    /// `/var/run/reboot-required`).
    pub fn reboot_required_file(&self) -> PathBuf {
        self.dir.path().join("reboot-required")
    }
    pub fn boot_id_file(&self) -> PathBuf {
        self.dir.path().join("boot_id")
    }
    /// The boot id now.
    pub fn boot_id(&self) -> String {
        std::fs::read_to_string(self.boot_id_file())
            .unwrap_or_default()
            .trim()
            .to_string()
    }
    /// The next boot, after its reboot command ran: the new boot id takes effect
    /// (`false`: no reboot was asked for).
    pub fn boot(&self) -> bool {
        std::fs::rename(self.dir().join("boot_id.next"), self.boot_id_file()).is_ok()
    }
    /// Lines `down <boot id> <time>` that its reboot command logged.
    pub fn reboots(&self) -> Vec<(String, f64)> {
        std::fs::read_to_string(self.dir().join("reboots.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
                ["down", id, at] => Some((id.to_string(), at.parse().ok()?)),
                _ => None,
            })
            .collect()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    pub fn config(&self) -> PathBuf {
        self.dir.path().join("agent.toml")
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    pub fn version_file(&self) -> PathBuf {
        self.dir.path().join("current_version")
    }
    pub fn facts_file(&self) -> PathBuf {
        self.dir.path().join("facts.d/current_version.txt")
    }
    pub fn validation_dir(&self) -> PathBuf {
        self.dir.path().join("tests")
    }
    /// The Hiera data file its agent keeps.
    pub fn hiera_file(&self) -> PathBuf {
        self.dir.path().join("hieradata/jiocloud.yaml")
    }

    /// Makes the validation directory pass or fail (a real `run-parts` script).
    pub fn set_validation(&self, pass: bool) {
        let script = if pass {
            "#!/bin/sh\necho service answers\n"
        } else {
            "#!/bin/sh\necho service does not answer >&2\nexit 1\n"
        };
        let p = self.validation_dir().join("10-service");
        std::fs::write(&p, script).expect("write validation script");
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    }

    /// The local version, if any.
    pub fn local_version(&self) -> Option<String> {
        std::fs::read_to_string(self.version_file())
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    /// `jio-agent --config <this host's file> <args>`.
    pub fn agent(&self, binary: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(binary);
        c.arg("--config")
            .arg(self.config())
            .args(args)
            .env_remove("JIO_STORE");
        c
    }
}

/// A TOML basic string.
pub fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
