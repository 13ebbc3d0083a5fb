//! A guest's NoCloud seed (a `cidata` volume from `cloud-localds`), made FROM our
//! packaged example `packaging/cloud-init/user-data.yaml`: its apt sources point at
//! the test's repository, its store at the test's etcd, and its `agent.toml` gets
//! the role and settings a scenario asks for. Everything else (the packages it
//! installs, `jio-agent bootstrap`, the service) stays as the example has it. The
//! result is checked by `cloud-init schema` before any guest reads it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::process::require_binary;
use crate::vm::image::INSTALL;

/// What one guest's seed says.
#[derive(Debug, Clone, Default)]
pub struct Seed {
    pub hostname: String,
    pub role: String,
    /// The store URL as the guest reaches it.
    pub store: String,
    /// The apt repository's URL as the guest reaches it.
    pub repo: String,
    /// More packages to install at first boot, after the example's.
    pub packages: Vec<String>,
    /// More `agent.toml` lines.
    pub agent: Vec<String>,
    /// More files: (path, mode, content), written before the packages install.
    pub files: Vec<(String, String, String)>,
}

const EXAMPLE: &str = include_str!("../../../packaging/cloud-init/user-data.yaml");

impl Seed {
    /// The user-data: the example with this seed's changes.
    pub fn user_data(&self) -> String {
        user_data(EXAMPLE, self)
    }

    /// Writes `user-data`, `meta-data` and `seed.iso` into `dir`, checks the
    /// user-data with `cloud-init schema`, and returns the ISO's path.
    pub fn build(&self, dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).expect("seed directory");
        let ud = dir.join("user-data");
        let md = dir.join("meta-data");
        std::fs::write(&ud, self.user_data()).expect("user-data");
        let nonce = std::process::id();
        std::fs::write(
            &md,
            format!(
                "instance-id: {}-{nonce}\nlocal-hostname: {}\n",
                self.hostname, self.hostname
            ),
        )
        .expect("meta-data");
        let schema = Command::new(require_binary("cloud-init", "apt-get install -y cloud-init"))
            .args(["schema", "--config-file"])
            .arg(&ud)
            .output()
            .expect("run cloud-init schema");
        assert!(
            schema.status.success(),
            "cloud-init schema rejects the seed made from the example ({}):\n{}",
            ud.display(),
            crate::inspect::text(&schema)
        );
        let iso = dir.join("seed.iso");
        let out = Command::new(require_binary("cloud-localds", INSTALL))
            .arg(&iso)
            .arg(&ud)
            .arg(&md)
            .output()
            .expect("run cloud-localds");
        assert!(
            out.status.success(),
            "cloud-localds: {}",
            crate::inspect::text(&out)
        );
        iso
    }
}

/// `example` with the seed's changes, each made where the example has the thing
/// it changes (a missing anchor fails: the example changed, and so must this).
fn user_data(example: &str, seed: &Seed) -> String {
    let mut lines: Vec<String> = example.lines().map(String::from).collect();
    let at = |lines: &[String], what: &str| {
        lines
            .iter()
            .position(|l| l.trim_start().starts_with(what))
            .unwrap_or_else(|| panic!("the example user-data has no line starting {what:?}"))
    };
    let store = at(&lines, "store = ");
    let indent = lines[store].len() - lines[store].trim_start().len();
    let pad = " ".repeat(indent);
    lines[store] = format!("{pad}store = {}", toml_str(&seed.store));
    let role = at(&lines, "role = ");
    lines[role] = format!("{pad}role = {}", toml_str(&seed.role));
    for (i, l) in seed.agent.iter().enumerate() {
        lines.insert(role + 1 + i, format!("{pad}{l}"));
    }
    let runcmd = at(&lines, "runcmd:");
    for (i, f) in files(&seed.files).into_iter().enumerate() {
        lines.insert(runcmd + i, f);
    }
    let agent_pkg = at(&lines, "- jio-agent");
    for (i, p) in seed.packages.iter().enumerate() {
        lines.insert(agent_pkg + 1 + i, format!("  - {p}"));
    }
    let packages = at(&lines, "packages:");
    let apt = [
        "apt:".to_string(),
        "  sources:".into(),
        "    jiocloud-test:".into(),
        format!("      source: \"deb [trusted=yes] {} ./\"", seed.repo),
    ];
    for (i, l) in apt.into_iter().enumerate() {
        lines.insert(packages + i, l);
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// `write_files` entries (indented as the example's list).
fn files(files: &[(String, String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (path, mode, content) in files {
        out.push(format!("  - path: {path}"));
        out.push(format!("    permissions: \"{mode}\""));
        out.push("    content: |".into());
        out.extend(content.lines().map(|l| format!("      {l}")));
    }
    out
}

fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_is_changed_where_it_says_so() {
        let seed = Seed {
            hostname: "compute1".into(),
            role: "compute".into(),
            store: "etcd://10.0.2.100:2379".into(),
            repo: "http://10.0.2.100:8080/".into(),
            packages: vec!["jio-dummy".into()],
            agent: vec!["health_interval = \"0s\"".into()],
            files: vec![(
                "/usr/lib/jiocloud/tests/50-mark".into(),
                "0755".into(),
                "#!/bin/sh\ntrue\n".into(),
            )],
        };
        let ud = seed.user_data();
        assert!(ud.starts_with("#cloud-config\n"), "{ud}");
        for want in [
            "      store = \"etcd://10.0.2.100:2379\"\n      role = \"compute\"\n      health_interval = \"0s\"\n",
            "apt:\n  sources:\n    jiocloud-test:\n      source: \"deb [trusted=yes] http://10.0.2.100:8080/ ./\"\npackages:\n  - jio-agent\n  - jio-dummy\n",
            "  - path: /usr/lib/jiocloud/tests/50-mark\n    permissions: \"0755\"\n    content: |\n      #!/bin/sh\n      true\nruncmd:\n",
            "jio-agent bootstrap",
        ] {
            assert!(ud.contains(want), "missing {want:?} in:\n{ud}");
        }
        assert!(!ud.contains("10.0.0.11"), "{ud}");
    }
}
