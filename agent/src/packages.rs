//! Package snapshots on the host: which template a run uses (agent.toml's
//! `package_source` over the store's), the sources entry and apt pin written
//! before the pre-commands, and the installed package set read from dpkg's status
//! file (before a run, into its directory; after it, for its result). Deciding
//! whether a run happens is not here.

use std::path::{Path, PathBuf};

use jio_common::names::Version;
use jio_common::packages::{PackageRecord, PackageSet, PackageSnapshot, SourceTemplate};

/// `package_source` in agent.toml.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSetting {
    /// The store's template (`jioctl repo set`), if any: the default.
    Store,
    /// No snapshot on this host, whatever the store says (`none`).
    Off,
    /// This host's own template.
    Template(SourceTemplate),
}

impl SourceSetting {
    /// `store`, `none` or a template line.
    pub fn parse(s: &str) -> Result<SourceSetting, String> {
        match s.trim() {
            "store" | "" => Ok(SourceSetting::Store),
            "none" => Ok(SourceSetting::Off),
            t => SourceTemplate::parse(t)
                .map(SourceSetting::Template)
                .map_err(|e| e.0),
        }
    }
}

/// Where the snapshot's files go and where dpkg keeps its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageSettings {
    pub source: SourceSetting,
    pub sources_file: PathBuf,
    pub preferences_file: PathBuf,
    /// dpkg's status file; `None` (`dpkg_status_file = ""`): no package sets recorded.
    pub dpkg_status: Option<PathBuf>,
}

/// What a run does about packages before its pre-commands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PackageStep {
    /// No template: the sources are left as they are.
    #[default]
    AsToday,
    /// Write this snapshot's sources entry and pin.
    Snapshot(PackageSnapshot),
    /// A template applies but cannot be used: the run fails with this reason.
    Unusable(String),
}

impl PackageStep {
    /// The step for `version`: this host's setting, else the store's template
    /// (`stored`: none, or the value read and the key it came from).
    pub fn of(setting: &SourceSetting, stored: Option<(&str, &str)>, version: &Version) -> PackageStep {
        let template = match (setting, stored) {
            (SourceSetting::Off, _) | (SourceSetting::Store, None) => return PackageStep::AsToday,
            (SourceSetting::Template(t), _) => t.clone(),
            (SourceSetting::Store, Some((key, value))) => match SourceTemplate::parse(value) {
                Ok(t) => t,
                Err(e) => {
                    return PackageStep::Unusable(format!(
                        "key {key}: {e} (set it again with jioctl repo set, or remove it with jioctl repo unset)"
                    ));
                }
            },
        };
        match template.snapshot(version) {
            Ok(s) => PackageStep::Snapshot(s),
            Err(e) => PackageStep::Unusable(e.0),
        }
    }
}

/// Writes the snapshot's sources entry and pin, each to a file beside it and
/// renamed over it (apt never reads half a file). The error names the file.
pub fn write_snapshot(settings: &PackageSettings, snap: &PackageSnapshot) -> Result<(), String> {
    replace(&settings.sources_file, &snap.sources_file())?;
    replace(&settings.preferences_file, &snap.preferences_file())
}

/// Without a template: removes the sources entry and pin an earlier run wrote
/// (files that start with the agent's header), so that no old snapshot stays
/// pinned. Returns whether it removed any; the error names the file.
pub fn remove_snapshot(settings: &PackageSettings) -> Result<bool, String> {
    let mut removed = false;
    for path in [&settings.sources_file, &settings.preferences_file] {
        match std::fs::read_to_string(path) {
            Ok(t) if t.starts_with(HEADER) => {
                std::fs::remove_file(path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
                removed = true;
            }
            _ => {}
        }
    }
    Ok(removed)
}

/// How the files the agent writes begin (`PackageSnapshot::sources_file` and
/// `preferences_file`); others are never removed.
const HEADER: &str = "# Written by jio-agent";

fn replace(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write as _;
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.jio-new"));
    let mut f = std::fs::File::create(&tmp).map_err(fail)?;
    f.write_all(text.as_bytes()).map_err(fail)?;
    f.sync_all().map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}

/// The installed set as dpkg has it now; `None` when sets are not recorded.
pub fn read_installed(settings: &PackageSettings) -> Option<Result<PackageSet, String>> {
    let path = settings.dpkg_status.as_ref()?;
    Some(
        std::fs::read_to_string(path)
            .map(|t| PackageSet::from_dpkg_status(&t))
            .map_err(|e| format!("cannot read dpkg's status {}: {e}", path.display())),
    )
}

/// dpkg's status file's size and modification time: a change means the set may
/// have changed.
pub fn status_stamp(settings: &PackageSettings) -> Option<(u64, std::time::SystemTime)> {
    let m = std::fs::metadata(settings.dpkg_status.as_ref()?).ok()?;
    Some((m.len(), m.modified().ok()?))
}

/// The file of a run's directory that holds the set the run started from.
const BEFORE: &str = "packages-before.txt";

/// Keeps the set the run starts from in its directory (it survives a reboot).
pub fn save_before(settings: &PackageSettings, run_dir: &Path) {
    match read_installed(settings) {
        None => {}
        Some(Ok(set)) => {
            if let Err(e) = std::fs::write(run_dir.join(BEFORE), set.to_text()) {
                tracing::warn!(error = %e, "cannot keep the installed packages before the run; its result will not list what it changed");
            }
        }
        Some(Err(e)) => tracing::warn!(error = %e, "the run's result will not list the packages it changed"),
    }
}

/// The record of the set now, after the run of `run_dir`, with the set itself.
pub fn after_run(settings: &PackageSettings, run_dir: &Path, at: u64) -> Option<(PackageRecord, PackageSet)> {
    let now = match read_installed(settings)? {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "the run's result records no package set");
            return None;
        }
    };
    let before = std::fs::read_to_string(run_dir.join(BEFORE))
        .ok()
        .and_then(|t| PackageSet::from_text(&t).ok());
    Some((PackageRecord::of(&now, before.as_ref(), at), now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::new(s).unwrap()
    }

    #[test]
    fn the_hosts_setting_wins_over_the_stores_and_a_bad_one_fails_the_run() {
        let site = "deb http://r.example/s/{version} bookworm main";
        let own = SourceSetting::parse("deb http://own.example/{version} bookworm main").unwrap();
        assert_eq!(SourceSetting::parse("none").unwrap(), SourceSetting::Off);
        assert_eq!(SourceSetting::parse("store").unwrap(), SourceSetting::Store);
        assert!(
            SourceSetting::parse("deb http://x/ bookworm main")
                .unwrap_err()
                .contains("{version}")
        );
        let key = "/config_state/package_source";
        assert_eq!(
            PackageStep::of(&SourceSetting::Store, None, &v("v2")),
            PackageStep::AsToday
        );
        assert_eq!(
            PackageStep::of(&SourceSetting::Off, Some((key, site)), &v("v2")),
            PackageStep::AsToday
        );
        let PackageStep::Snapshot(s) = PackageStep::of(&SourceSetting::Store, Some((key, site)), &v("v2"))
        else {
            panic!("the store's template applies");
        };
        assert_eq!(s.sources_line(), "deb http://r.example/s/v2 bookworm main");
        let PackageStep::Snapshot(s) = PackageStep::of(&own, Some((key, site)), &v("v2")) else {
            panic!("the host's template applies");
        };
        assert_eq!(s.origin(), "own.example");
        let PackageStep::Unusable(why) =
            PackageStep::of(&SourceSetting::Store, Some((key, "deb x")), &v("v2"))
        else {
            panic!("a bad stored template fails the run");
        };
        assert!(
            why.starts_with("key /config_state/package_source: ") && why.contains("jioctl repo set"),
            "{why}"
        );
        assert!(matches!(
            PackageStep::of(&SourceSetting::Store, Some((key, site)), &v("v2#")),
            PackageStep::Unusable(_)
        ));
    }

    #[test]
    fn the_snapshot_files_replace_the_old_ones_and_the_run_records_its_changes() {
        let d = tempfile::tempdir().unwrap();
        let status = d.path().join("status");
        let settings = PackageSettings {
            source: SourceSetting::Store,
            sources_file: d.path().join("jio.list"),
            preferences_file: d.path().join("jio.pref"),
            dpkg_status: Some(status.clone()),
        };
        let t = SourceTemplate::parse("deb http://r.example/s/{version} bookworm main").unwrap();
        write_snapshot(&settings, &t.snapshot(&v("v1")).unwrap()).unwrap();
        write_snapshot(&settings, &t.snapshot(&v("v2")).unwrap()).unwrap();
        let list = std::fs::read_to_string(&settings.sources_file).unwrap();
        assert!(
            list.ends_with("deb http://r.example/s/v2 bookworm main\n") && !list.contains("/v1"),
            "{list}"
        );
        assert!(
            std::fs::read_to_string(&settings.preferences_file)
                .unwrap()
                .contains("Pin-Priority: 1001")
        );
        assert_eq!(
            std::fs::read_dir(d.path()).unwrap().count(),
            2,
            "no temporary file left"
        );
        let missing = PackageSettings {
            sources_file: d.path().join("no/such/dir/jio.list"),
            ..settings.clone()
        };
        assert!(
            write_snapshot(&missing, &t.snapshot(&v("v1")).unwrap())
                .unwrap_err()
                .contains("no/such/dir/jio.list")
        );

        let stanza = |ver: &str| {
            format!("Package: p\nStatus: install ok installed\nArchitecture: all\nVersion: {ver}\n")
        };
        std::fs::write(&status, stanza("1.0")).unwrap();
        save_before(&settings, d.path());
        std::fs::write(&status, stanza("2.0")).unwrap();
        let (rec, set) = after_run(&settings, d.path(), 9).unwrap();
        assert_eq!(rec.digest, set.digest());
        assert_eq!(
            rec.changed.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["p 1.0 → 2.0"]
        );
        let off = PackageSettings {
            dpkg_status: None,
            ..settings
        };
        assert!(after_run(&off, d.path(), 9).is_none());
    }
}
