//! Real `puppet apply` (Debian's `puppet-agent`) with throwaway directories.

use std::path::{Path, PathBuf};

use crate::process::require_binary;

/// A sandbox for `puppet apply`: its own conf, var, code, log and run directories.
pub struct Puppet {
    dir: tempfile::TempDir,
    binary: PathBuf,
}

impl Default for Puppet {
    fn default() -> Self {
        Puppet::new()
    }
}

impl Puppet {
    pub fn new() -> Puppet {
        let binary = require_binary("puppet", "apt-get install -y puppet-agent");
        let dir = tempfile::Builder::new()
            .prefix("jio-puppet-")
            .tempdir()
            .expect("temporary directory");
        for d in ["conf", "var", "code", "log", "run"] {
            std::fs::create_dir_all(dir.path().join(d)).expect("puppet directory");
        }
        Puppet { dir, binary }
    }

    /// Writes a manifest and returns its path.
    pub fn manifest(&self, name: &str, content: &str) -> PathBuf {
        let p = self.dir.path().join(format!("{name}.pp"));
        std::fs::write(&p, content).expect("write manifest");
        p
    }

    /// Puppet's `--confdir` (where it reads `hiera.yaml`).
    pub fn confdir(&self) -> PathBuf {
        self.dir.path().join("conf")
    }

    /// A scratch directory the manifests may manage files in.
    pub fn scratch(&self) -> PathBuf {
        let p = self.dir.path().join("scratch");
        std::fs::create_dir_all(&p).expect("scratch directory");
        p
    }

    /// The agent's `puppet_command` for `manifest`, with `{log_jsonl}` for the agent to fill.
    pub fn command(&self, manifest: &Path) -> Vec<String> {
        let d = |s: &str| self.dir.path().join(s).display().to_string();
        vec![
            self.binary.display().to_string(),
            "apply".into(),
            "--detailed-exitcodes".into(),
            "--confdir".into(),
            d("conf"),
            "--vardir".into(),
            d("var"),
            "--codedir".into(),
            d("code"),
            "--logdir".into(),
            d("log"),
            "--rundir".into(),
            d("run"),
            "--publicdir".into(),
            d("var/public"),
            "--logdest".into(),
            "{log_jsonl}".into(),
            manifest.display().to_string(),
        ]
    }
}
