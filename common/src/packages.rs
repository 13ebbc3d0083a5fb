//! Versions as package snapshots: the site's apt source template (one `deb` line
//! with `{version}` in its URI or suite), the sources entry and the apt pin written
//! for one version, the URLs of that snapshot's `InRelease`/`Release`, and a host's
//! installed package set with its digest and what differs between two sets.
//! Pure: nothing here reads a file or the network.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::names::Version;

/// The placeholder a template must hold.
pub const PLACEHOLDER: &str = "{version}";
/// The pin's priority: above 1000, so `dist-upgrade` moves installed packages to the
/// snapshot's versions, downgrades included (apt_preferences(5)).
pub const PIN_PRIORITY: u32 = 1001;

/// A template that cannot be used, or a version it cannot name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(pub String);

/// The site's template: `deb [options] <uri> <suite> [components...]`, one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTemplate {
    line: String,
    options: Option<String>,
    uri: String,
    suite: String,
    components: Vec<String>,
}

impl SourceTemplate {
    /// Parses one sources line in the one-line format of sources.list(5).
    pub fn parse(s: &str) -> Result<SourceTemplate, TemplateError> {
        // A user and password in the URL never reach a message.
        let shown = redact_userinfo(s);
        let fail = |why: &str| Err(TemplateError(format!("package source template {shown:?}: {why}")));
        // A trailing comment is not part of the entry (sources.list(5)).
        let line = s.split_once(" #").map_or(s, |(l, _)| l).trim();
        if line.is_empty() || line.contains('\n') {
            return fail("must be one line: deb [options] <uri> <suite> [components...]");
        }
        let rest = match line.strip_prefix("deb") {
            Some(r) if r.starts_with([' ', '\t']) => r,
            _ => return fail("must start with `deb ` (binary packages; deb-src is not installed)"),
        };
        let (options, rest) = match split_options(rest.trim_start()) {
            Ok(x) => x,
            Err(e) => return fail(&e),
        };
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(suite)) = (words.next(), words.next()) else {
            return fail("needs a URI and a suite after `deb`");
        };
        let components: Vec<String> = words.map(String::from).collect();
        if !(uri.starts_with("http://") || uri.starts_with("https://")) {
            return fail("the URI must be http:// or https:// (jioctl fetches the snapshot's Release file)");
        }
        if !uri.contains(PLACEHOLDER) && !suite.contains(PLACEHOLDER) {
            return fail("the URI or the suite must hold {version}");
        }
        if suite.ends_with('/') != components.is_empty() {
            return fail(
                "a suite ending in `/` (a flat repository) takes no components; any other needs them",
            );
        }
        Ok(SourceTemplate {
            line: line.to_string(),
            options,
            uri: uri.trim_end_matches('/').to_string(),
            suite: suite.to_string(),
            components,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.line
    }

    /// The snapshot of `version`; refused when the version holds a character a URL
    /// or a sources line cannot carry as it is.
    pub fn snapshot(&self, version: &Version) -> Result<PackageSnapshot, TemplateError> {
        let v = version.as_str();
        if let Some(c) = v
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "._~+-".contains(*c)))
        {
            return Err(TemplateError(format!(
                "version {v} cannot name a package snapshot: {c:?} is not a letter, digit or one of . _ ~ + -"
            )));
        }
        let fill = |s: &str| s.replace(PLACEHOLDER, v);
        Ok(PackageSnapshot {
            version: version.clone(),
            options: self.options.as_deref().map(fill),
            uri: fill(&self.uri),
            suite: fill(&self.suite),
            components: self.components.iter().map(|c| fill(c)).collect(),
        })
    }
}

impl fmt::Display for SourceTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line)
    }
}

/// `[opt=v ...] rest` → (the options, rest); no options → (None, rest).
fn split_options(s: &str) -> Result<(Option<String>, &str), String> {
    let Some(inner) = s.strip_prefix('[') else {
        return Ok((None, s));
    };
    let Some((opts, rest)) = inner.split_once(']') else {
        return Err("an option list `[` is not closed by `]`".into());
    };
    Ok((Some(opts.trim().to_string()), rest.trim_start()))
}

/// One version's snapshot: what the agent writes and what `jioctl` checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageSnapshot {
    pub version: Version,
    options: Option<String>,
    uri: String,
    suite: String,
    components: Vec<String>,
}

impl PackageSnapshot {
    /// The sources entry, one line.
    pub fn sources_line(&self) -> String {
        let mut words = vec!["deb".to_string()];
        if let Some(o) = &self.options {
            words.push(format!("[{o}]"));
        }
        words.push(self.uri.clone());
        words.push(self.suite.clone());
        words.extend(self.components.iter().cloned());
        words.join(" ")
    }

    /// The whole sources file the agent writes.
    pub fn sources_file(&self) -> String {
        format!(
            "# Written by jio-agent before apt-get update: the package snapshot of version {}.\n{}\n",
            self.version,
            self.sources_line()
        )
    }

    /// The apt preferences file: the snapshot's origin pinned above 1000.
    pub fn preferences_file(&self) -> String {
        format!(
            "# Written by jio-agent: version {v} installs its snapshot's packages, downgrades included.\n\
             Explanation: jiocloud package snapshot {v}\n\
             Package: *\n\
             Pin: origin \"{o}\"\n\
             Pin-Priority: {PIN_PRIORITY}\n",
            v = self.version,
            o = self.origin()
        )
    }

    /// The archive's host, as apt's `Pin: origin` matches it (no user, no port).
    pub fn origin(&self) -> &str {
        let after_scheme = self.uri.split_once("://").map_or(self.uri.as_str(), |(_, r)| r);
        let authority = after_scheme.split('/').next().unwrap_or("");
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        if let Some(v6) = host.strip_prefix('[') {
            return v6.split(']').next().unwrap_or(v6);
        }
        host.split(':').next().unwrap_or(host)
    }

    /// The URLs of its release files, in the order apt tries them: `InRelease`,
    /// then `Release`.
    pub fn release_urls(&self) -> [String; 2] {
        let base = if self.suite.ends_with('/') {
            format!("{}/{}", self.uri, self.suite.trim_start_matches('/'))
        } else {
            format!("{}/dists/{}/", self.uri, self.suite)
        };
        [format!("{base}InRelease"), format!("{base}Release")]
    }

    /// The components the sources entry names (none for a flat repository).
    pub fn components(&self) -> &[String] {
        &self.components
    }
}

/// What a fetched release file says is missing for this snapshot, if anything:
/// the text must look like a Release file and list every component.
pub fn release_problem(snapshot: &PackageSnapshot, text: &str) -> Option<String> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
            .map(str::trim)
    };
    let looks = ["Suite", "Codename", "Date", "SHA256", "MD5Sum"]
        .iter()
        .any(|f| field(f).is_some());
    if !looks {
        return Some("it is not a Release file (none of Suite, Codename, Date, SHA256, MD5Sum)".into());
    }
    let listed: Vec<&str> = field("Components").unwrap_or("").split_whitespace().collect();
    let missing: Vec<&str> = snapshot
        .components
        .iter()
        .map(String::as_str)
        .filter(|c| !listed.iter().any(|l| l == c || l.ends_with(&format!("/{c}"))))
        .collect();
    (!missing.is_empty()).then(|| format!("it lists no component {}", missing.join(", ")))
}

/// One installed package.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Package {
    pub name: String,
    pub arch: String,
    pub version: String,
}

/// A host's installed packages, sorted by name and architecture.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PackageSet(Vec<Package>);

impl PackageSet {
    /// The installed packages of a dpkg status file (`/var/lib/dpkg/status`):
    /// stanzas whose `Status` ends in `installed`.
    pub fn from_dpkg_status(text: &str) -> PackageSet {
        let mut out = Vec::new();
        for stanza in text.split("\n\n") {
            let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
            for line in stanza.lines().filter(|l| !l.starts_with([' ', '\t'])) {
                if let Some((k, v)) = line.split_once(':') {
                    fields.insert(k, v.trim());
                }
            }
            let installed = fields
                .get("Status")
                .is_some_and(|s| s.split_whitespace().nth(2) == Some("installed"));
            if let (true, Some(name), Some(version)) =
                (installed, fields.get("Package"), fields.get("Version"))
            {
                let arch = fields.get("Architecture").copied().unwrap_or("all");
                out.push(Package {
                    name: name.to_string(),
                    arch: arch.to_string(),
                    version: version.to_string(),
                });
            }
        }
        PackageSet::new(out)
    }

    pub fn new(mut packages: Vec<Package>) -> PackageSet {
        packages.sort();
        packages.dedup();
        PackageSet(packages)
    }

    pub fn packages(&self) -> &[Package] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The stored form: `name arch version` per line, sorted.
    pub fn to_text(&self) -> String {
        self.0
            .iter()
            .map(|p| format!("{} {} {}\n", p.name, p.arch, p.version))
            .collect()
    }

    /// Reads the stored form back; `Err` names the first line that is not one.
    pub fn from_text(text: &str) -> Result<PackageSet, String> {
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
            let w: Vec<&str> = line.split(' ').collect();
            let [name, arch, version] = w[..] else {
                return Err(format!("line {}: {line:?} is not `name arch version`", i + 1));
            };
            out.push(Package {
                name: name.into(),
                arch: arch.into(),
                version: version.into(),
            });
        }
        Ok(PackageSet::new(out))
    }

    /// The digest of the set: `sha256:` and the hex SHA-256 of the stored form.
    pub fn digest(&self) -> String {
        let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, self.to_text().as_bytes());
        let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }

    /// What moved from `before` to `self`, by name and architecture.
    pub fn changes_since(&self, before: &PackageSet) -> Vec<PackageChange> {
        let index = |s: &PackageSet| -> BTreeMap<(String, String), String> {
            s.0.iter()
                .map(|p| ((p.name.clone(), p.arch.clone()), p.version.clone()))
                .collect()
        };
        let (old, new) = (index(before), index(self));
        let mut keys: Vec<&(String, String)> = old.keys().chain(new.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|k| old.get(*k) != new.get(*k))
            .map(|k| PackageChange {
                name: k.0.clone(),
                arch: k.1.clone(),
                from: old.get(k).cloned(),
                to: new.get(k).cloned(),
            })
            .collect()
    }
}

/// `text` with the user and password of every URL in it hidden
/// (`http://user:secret@host/` → `http://***@host/`): messages and logs never
/// carry them.
pub fn redact_userinfo(text: &str) -> String {
    static RE: std::sync::LazyLock<Option<regex::Regex>> =
        std::sync::LazyLock::new(|| regex::Regex::new(r"(?i)\b(https?://)[^/\s\]\[]+@").ok());
    match RE.as_ref() {
        Some(re) => re.replace_all(text, "${1}***@").into_owned(),
        None => text.to_string(),
    }
}

/// A short form of a digest for people: its first 12 hex digits.
pub fn short_digest(d: &str) -> &str {
    let hex = d.strip_prefix("sha256:").unwrap_or(d);
    hex.get(..12).unwrap_or(hex)
}

/// One package that differs between two sets: installed, removed, or moved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageChange {
    pub name: String,
    pub arch: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

impl fmt::Display for PackageChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let arch = if self.arch == "all" || self.arch == "amd64" {
            String::new()
        } else {
            format!(":{}", self.arch)
        };
        match (&self.from, &self.to) {
            (Some(a), Some(b)) => write!(f, "{}{arch} {a} → {b}", self.name),
            (None, Some(b)) => write!(f, "{}{arch} {b} (added)", self.name),
            (Some(a), None) => write!(f, "{}{arch} {a} (removed)", self.name),
            (None, None) => write!(f, "{}{arch}", self.name),
        }
    }
}

/// The packages one run changed, as its result carries them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackageRecord {
    /// The digest of the installed set ([`PackageSet::digest`]); the set itself is
    /// stored once under `/packages/<digest>`.
    pub digest: String,
    /// How many packages are installed.
    pub count: usize,
    /// The packages the run changed (at most [`CHANGES_KEPT`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<PackageChange>,
    /// How many it changed in all (more than `changed` holds when over the cap).
    #[serde(default)]
    pub changed_count: usize,
    /// Unix time the set was read (the run's end, or a later change seen by the agent).
    pub at: u64,
}

/// The most changes a result lists.
pub const CHANGES_KEPT: usize = 50;

impl PackageRecord {
    /// The record of `now`, after a run that started from `before` (none: unknown).
    pub fn of(now: &PackageSet, before: Option<&PackageSet>, at: u64) -> PackageRecord {
        let changes = before.map(|b| now.changes_since(b)).unwrap_or_default();
        PackageRecord {
            digest: now.digest(),
            count: now.len(),
            changed_count: changes.len(),
            changed: changes.into_iter().take(CHANGES_KEPT).collect(),
            at,
        }
    }
}

/// Hosts at one version of one role, by package set: the most common set first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriftGroup<H> {
    /// The digest most hosts have (ties: the smallest digest).
    pub common: String,
    /// Every digest with its hosts, the most common first.
    pub sets: Vec<(String, Vec<H>)>,
}

impl<H: Clone + Ord> DriftGroup<H> {
    /// Groups `(host, digest)`; `None` when there is one set (no drift) or none.
    pub fn of(hosts: &[(H, String)]) -> Option<DriftGroup<H>> {
        let mut by: BTreeMap<&str, Vec<H>> = BTreeMap::new();
        for (h, d) in hosts {
            by.entry(d.as_str()).or_default().push(h.clone());
        }
        if by.len() < 2 {
            return None;
        }
        let mut sets: Vec<(String, Vec<H>)> = by
            .into_iter()
            .map(|(d, mut hs)| {
                hs.sort();
                (d.to_string(), hs)
            })
            .collect();
        sets.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.0.cmp(&b.0)));
        Some(DriftGroup {
            common: sets[0].0.clone(),
            sets,
        })
    }

    /// No set has more hosts than every other (the first is only the smallest digest).
    pub fn tie(&self) -> bool {
        self.sets.len() > 1 && self.sets[0].1.len() == self.sets[1].1.len()
    }

    /// The hosts whose set is not the common one.
    pub fn drifted(&self) -> impl Iterator<Item = (&str, &H)> {
        self.sets
            .iter()
            .skip(1)
            .flat_map(|(d, hs)| hs.iter().map(move |h| (d.as_str(), h)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::new(s).unwrap()
    }

    const SITE: &str = "deb [signed-by=/usr/share/keyrings/site.gpg] http://repo.example:8080/snapshots/{version} bookworm main contrib";

    #[test]
    fn a_template_gives_each_version_its_sources_pin_and_release_urls() {
        let t = SourceTemplate::parse(SITE).unwrap();
        let s = t.snapshot(&v("v2.01")).unwrap();
        assert_eq!(
            s.sources_line(),
            "deb [signed-by=/usr/share/keyrings/site.gpg] http://repo.example:8080/snapshots/v2.01 bookworm main contrib"
        );
        assert_eq!(s.origin(), "repo.example");
        assert!(
            s.preferences_file()
                .contains("Pin: origin \"repo.example\"\nPin-Priority: 1001\n")
        );
        assert_eq!(
            s.release_urls(),
            [
                "http://repo.example:8080/snapshots/v2.01/dists/bookworm/InRelease".to_string(),
                "http://repo.example:8080/snapshots/v2.01/dists/bookworm/Release".to_string()
            ]
        );
        let flat = SourceTemplate::parse("deb https://u@[::1]:9/s/{version}/ ./").unwrap();
        let f = flat.snapshot(&v("7")).unwrap();
        assert_eq!(f.origin(), "::1");
        assert_eq!(f.release_urls()[0], "https://u@[::1]:9/s/7/./InRelease");
        let in_suite =
            SourceTemplate::parse("deb http://snap.example/debian bookworm-{version} main").unwrap();
        assert_eq!(
            in_suite.snapshot(&v("20240101")).unwrap().release_urls()[1],
            "http://snap.example/debian/dists/bookworm-20240101/Release"
        );
    }

    #[test]
    fn a_template_that_cannot_name_a_snapshot_is_refused_with_why() {
        for (bad, why) in [
            ("", "one line"),
            (
                "deb-src http://r/{version} bookworm main",
                "must start with `deb `",
            ),
            ("deb [signed-by=/k http://r/{version} bookworm main", "not closed"),
            ("deb http://r/{version}", "URI and a suite"),
            ("deb ftp://r/{version} bookworm main", "http:// or https://"),
            ("deb http://r/snapshots bookworm main", "must hold {version}"),
            ("deb http://r/{version} bookworm", "takes no components"),
            ("deb http://r/{version} ./ main", "takes no components"),
        ] {
            let e = SourceTemplate::parse(bad).unwrap_err().0;
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        let t = SourceTemplate::parse(SITE).unwrap();
        let e = t.snapshot(&v("v2?x")).unwrap_err().0;
        assert!(
            e.contains("version v2?x cannot name a package snapshot: '?'"),
            "{e}"
        );
    }

    #[test]
    fn credentials_in_urls_are_hidden() {
        assert_eq!(
            redact_userinfo(
                "deb http://ops:s3cret@repo.example/s/v1 bookworm main; https://tok@r/x http://plain/"
            ),
            "deb http://***@repo.example/s/v1 bookworm main; https://***@r/x http://plain/"
        );
        assert_eq!(redact_userinfo("http://u:p@ss@h/x"), "http://***@h/x");
        let e = SourceTemplate::parse("deb http://ops:s3cret@r/snapshots bookworm main")
            .unwrap_err()
            .0;
        assert!(!e.contains("s3cret") && e.contains("***@r"), "{e}");
    }

    #[test]
    fn a_release_file_must_list_the_components() {
        let s = SourceTemplate::parse(SITE).unwrap().snapshot(&v("v1")).unwrap();
        assert_eq!(
            release_problem(&s, "Codename: bookworm\nComponents: main contrib\n"),
            None
        );
        assert_eq!(
            release_problem(&s, "Suite: x\nComponents: updates/main updates/contrib\n"),
            None
        );
        assert_eq!(
            release_problem(&s, "Codename: bookworm\nComponents: main\n").as_deref(),
            Some("it lists no component contrib")
        );
        assert!(
            release_problem(&s, "<html>404</html>")
                .unwrap()
                .contains("not a Release file")
        );
    }

    const STATUS: &str = "Package: jio-dummy\nStatus: install ok installed\nArchitecture: all\nVersion: 2.0\nDescription: x\n continued: line\n\n\
Package: gone\nStatus: deinstall ok config-files\nArchitecture: amd64\nVersion: 1\n\n\
Package: libc6\nStatus: hold ok installed\nArchitecture: amd64\nMulti-Arch: same\nVersion: 2.36-9\n\n\
Package: libc6\nStatus: install ok installed\nArchitecture: i386\nVersion: 2.36-9\n";

    #[test]
    fn the_installed_set_its_digest_and_its_changes() {
        let s = PackageSet::from_dpkg_status(STATUS);
        assert_eq!(
            s.to_text(),
            "jio-dummy all 2.0\nlibc6 amd64 2.36-9\nlibc6 i386 2.36-9\n"
        );
        assert_eq!(PackageSet::from_text(&s.to_text()).unwrap(), s);
        assert!(PackageSet::from_text("a b\n").unwrap_err().contains("line 1"));
        // The digest is of the sorted stored form: order in the file does not matter.
        let mut stanzas: Vec<&str> = STATUS.split("\n\n").collect();
        stanzas.reverse();
        let reordered = stanzas.join("\n\n");
        assert_eq!(PackageSet::from_dpkg_status(&reordered).digest(), s.digest());
        assert_eq!(s.digest().len(), "sha256:".len() + 64);
        let before = PackageSet::from_text("jio-dummy all 1.0\nlibc6 i386 2.36-9\nold all 3\n").unwrap();
        let shown: Vec<String> = s.changes_since(&before).iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            ["jio-dummy 1.0 → 2.0", "libc6 2.36-9 (added)", "old 3 (removed)"]
        );
        let r = PackageRecord::of(&s, Some(&before), 7);
        assert_eq!((r.count, r.changed_count, r.changed.len()), (3, 3, 3));
    }

    #[test]
    fn drift_names_the_hosts_off_the_most_common_set() {
        assert_eq!(
            DriftGroup::of(&[("a", "d1".to_string()), ("b", "d1".to_string())]),
            None
        );
        let g = DriftGroup::of(&[
            ("c", "d2".into()),
            ("a", "d1".into()),
            ("b", "d1".into()),
            ("d", "d0".into()),
        ])
        .unwrap();
        assert_eq!(g.common, "d1");
        let drifted: Vec<(&str, &&str)> = g.drifted().collect();
        assert_eq!(drifted, [("d0", &"d"), ("d2", &"c")]);
    }
}
