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
    /// to its configuration. Validation passes until `set_validation(false)`.
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
        let config = format!(
            "store = {}\nhostname = {}\nstate_dir = {}\nversion_file = {}\nfacts_file = {}\nvalidation_dir = {}\nhiera_file = {}\npre_commands = []\npuppet_command = [{}]\nlease_ttl = \"3s\"\n{extra}\n",
            toml_str(store),
            toml_str(name),
            p(h.state_dir()),
            p(h.version_file()),
            p(h.facts_file()),
            p(h.validation_dir()),
            p(h.hiera_file()),
            cmd.join(", "),
        );
        std::fs::write(h.config(), config).expect("write agent.toml");
        h
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
