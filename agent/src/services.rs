//! The services' upgrade task files (composable rollouts): one TOML file per
//! service in `services_dir`, `<service>.toml`, with the service's `after` and its
//! tasks (argument lists, each with a name, `when`, a step and a timeout). Read at
//! each pass that needs them; what they say is published as the host's catalog.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use jio_common::names::Service;
use jio_common::phase::{Catalog, ServiceSteps, When};
use serde::Deserialize;

/// One task of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub name: String,
    pub when: When,
    /// 0 for finalize tasks without a step.
    pub step: u32,
    pub command: Vec<String>,
    pub timeout: Option<Duration>,
    /// It may run again when its step resumes after an interruption.
    pub idempotent: bool,
}

/// One service's task file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceFile {
    pub path: PathBuf,
    pub after: Vec<Service>,
    pub tasks: Vec<Task>,
}

impl ServiceFile {
    /// Its tasks of `when` at `step` (finalize: every finalize task, by step), in
    /// file order.
    pub fn tasks_at(&self, when: When, step: u32) -> Vec<&Task> {
        let mut v: Vec<&Task> = self
            .tasks
            .iter()
            .filter(|t| t.when == when && (when == When::Finalize || t.step == step))
            .collect();
        v.sort_by_key(|t| t.step);
        v
    }

    fn steps(&self) -> ServiceSteps {
        let collect = |w: When| {
            let set: BTreeSet<u32> = self
                .tasks
                .iter()
                .filter(|t| t.when == w)
                .map(|t| t.step)
                .collect();
            set.into_iter().collect()
        };
        ServiceSteps {
            after: self.after.clone(),
            pre: collect(When::Pre),
            post: collect(When::Post),
            finalize: self.tasks.iter().any(|t| t.when == When::Finalize),
        }
    }
}

/// Every task file of the directory: the usable ones, and why the others are not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Services {
    pub dir: PathBuf,
    pub files: BTreeMap<Service, ServiceFile>,
    pub problems: BTreeMap<Service, String>,
    /// The directory itself cannot be read (other than missing): why.
    pub unreadable: Option<String>,
    /// The directory exists.
    pub exists: bool,
}

impl Services {
    /// What the host publishes: `None` when the directory does not exist (a host
    /// without task files publishes nothing).
    pub fn catalog(&self) -> Option<Catalog> {
        if !self.exists {
            return None;
        }
        Some(Catalog {
            dir: self.dir.display().to_string(),
            services: self.files.iter().map(|(s, f)| (s.clone(), f.steps())).collect(),
            problems: self.problems.clone(),
            error: self.unreadable.clone(),
        })
    }

    /// The file of `s`, or why it cannot be used (naming the file).
    pub fn get(&self, s: &Service) -> Result<&ServiceFile, String> {
        if let Some(p) = self.problems.get(s) {
            return Err(p.clone());
        }
        if let Some(e) = &self.unreadable {
            return Err(e.clone());
        }
        self.files.get(s).ok_or_else(|| {
            format!(
                "service {s} has no task file ({}): install one (an empty file when the service has no upgrade tasks)",
                self.dir.join(format!("{s}.toml")).display()
            )
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    #[serde(default)]
    after: Vec<String>,
    #[serde(default)]
    task: Vec<TaskDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskDoc {
    name: Option<String>,
    step: Option<u32>,
    when: Option<String>,
    command: Option<Vec<String>>,
    timeout: Option<String>,
    #[serde(default)]
    idempotent: bool,
}

/// Reads every `*.toml` of `dir` (a missing directory: no services).
pub fn load(dir: &Path) -> Services {
    let mut out = Services {
        dir: dir.to_path_buf(),
        ..Services::default()
    };
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            out.exists = true;
            out.unreadable = Some(format!("cannot read the task directory {}: {e}", dir.display()));
            return out;
        }
    };
    out.exists = true;
    for entry in rd.flatten() {
        let path = entry.path();
        let Some(stem) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".toml"))
        else {
            continue;
        };
        let service = match Service::new(stem) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(file = %path.display(), "ignored: {e}");
                continue;
            }
        };
        match std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))
            .and_then(|text| parse(&service, &path, &text))
        {
            Ok(f) => {
                out.files.insert(service, f);
            }
            Err(e) => {
                out.problems.insert(service, e);
            }
        }
    }
    out
}

/// Parses one task file; every problem is named with the file (and the task).
pub fn parse(service: &Service, path: &Path, text: &str) -> Result<ServiceFile, String> {
    let file = path.display();
    let doc: FileDoc = toml::from_str(text).map_err(|e| {
        format!(
            "{file}: {}",
            e.to_string()
                .lines()
                .filter(|l| !l.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        )
    })?;
    let mut errors = Vec::new();
    let after = parse_after(service, doc.after, &mut errors);
    let mut tasks = Vec::new();
    let mut names = BTreeSet::new();
    for (i, t) in doc.task.into_iter().enumerate() {
        if let Some(task) = parse_task(i, t, &mut names, &mut errors) {
            tasks.push(task);
        }
    }
    if errors.is_empty() {
        Ok(ServiceFile {
            path: path.to_path_buf(),
            after,
            tasks,
        })
    } else {
        Err(format!("{file}: {}", errors.join("; ")))
    }
}

/// The services a task file says its service runs after (never itself).
fn parse_after(service: &Service, names: Vec<String>, errors: &mut Vec<String>) -> Vec<Service> {
    let mut after = Vec::new();
    for a in names {
        match Service::new(a.as_str()) {
            Ok(s) if &s == service => errors.push(format!("after names the service itself ({s})")),
            Ok(s) => after.push(s),
            Err(e) => errors.push(format!("after: {e}")),
        }
    }
    after
}

/// The `i`th task of a file (`None`: it cannot run, and `errors` says why);
/// `names`: the names of the tasks before it.
fn parse_task(i: usize, t: TaskDoc, names: &mut BTreeSet<String>, errors: &mut Vec<String>) -> Option<Task> {
    let label = t
        .name
        .as_deref()
        .map_or_else(|| format!("task {}", i + 1), |n| format!("task {n:?}"));
    let name = match t.name {
        Some(n) if !n.trim().is_empty() => n,
        _ => {
            errors.push(format!("{label}: name is missing"));
            return None;
        }
    };
    if !names.insert(name.clone()) {
        errors.push(format!("{label}: two tasks have this name"));
    }
    let when = match t.when.as_deref() {
        Some("pre") => When::Pre,
        Some("post") => When::Post,
        Some("finalize") => When::Finalize,
        Some(other) => {
            errors.push(format!(
                "{label}: when = {other:?} (allowed: pre, post, finalize)"
            ));
            return None;
        }
        None => {
            errors.push(format!("{label}: when is missing (pre, post or finalize)"));
            return None;
        }
    };
    let step = match (when, t.step) {
        (When::Finalize, s) => s.unwrap_or(0),
        (_, Some(s)) if s > 0 => s,
        (_, _) => {
            errors.push(format!(
                "{label}: step must be a number from 1 for a {} task",
                when.as_str()
            ));
            return None;
        }
    };
    let command = match t.command {
        Some(c) if c.first().is_some_and(|p| !p.is_empty()) => c,
        _ => {
            errors.push(format!("{label}: command must be a non-empty argument list"));
            return None;
        }
    };
    let timeout = task_timeout(&label, t.timeout.as_deref(), errors);
    Some(Task {
        name,
        when,
        step,
        command,
        timeout,
        idempotent: t.idempotent,
    })
}

/// A task's own timeout (`None`: none given, or it is invalid and `errors` says why).
fn task_timeout(label: &str, timeout: Option<&str>, errors: &mut Vec<String>) -> Option<std::time::Duration> {
    match timeout.map(jio_common::duration::parse) {
        None => None,
        Some(Ok(d)) if !d.is_zero() => Some(d),
        Some(Ok(_)) => {
            errors.push(format!("{label}: timeout must be longer than 0"));
            None
        }
        Some(Err(e)) => {
            errors.push(format!("{label}: timeout: {e}"));
            None
        }
    }
}

/// Orders `services` so that each comes after those it names in `after` (among
/// them), then by name.
pub fn in_order(services: &[Service], files: &Services) -> Vec<Service> {
    let mut left: Vec<Service> = services.to_vec();
    left.sort();
    let mut out: Vec<Service> = Vec::new();
    while !left.is_empty() {
        let pos = left
            .iter()
            .position(|s| {
                files
                    .files
                    .get(s)
                    .is_none_or(|f| f.after.iter().all(|a| !left.contains(a) || out.contains(a)))
            })
            .unwrap_or(0);
        out.push(left.remove(pos));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(s: &str) -> Service {
        Service::new(s).unwrap()
    }

    const NOVA: &str = r#"
after = ["keystone"]

[[task]]
name = "RPC pin nova-compute"
step = 1
when = "pre"
command = ["crudini", "--set", "/etc/nova/nova.conf", "upgrade_levels", "compute", "auto"]

[[task]]
name = "stop nova-compute"
step = 2
when = "pre"
command = ["systemctl", "stop", "nova-compute"]
idempotent = true

[[task]]
name = "db sync"
step = 3
when = "post"
command = ["nova-manage", "db", "sync"]
timeout = "20m"

[[task]]
name = "start nova-compute"
step = 4
when = "post"
command = ["systemctl", "start", "nova-compute"]

[[task]]
name = "unpin RPC"
when = "finalize"
command = ["crudini", "--del", "/etc/nova/nova.conf", "upgrade_levels", "compute"]
"#;

    #[test]
    fn the_seeds_nova_compute_example_as_written() {
        let f = parse(&svc("nova_compute"), Path::new("/x/nova_compute.toml"), NOVA).unwrap();
        assert_eq!(f.after, vec![svc("keystone")]);
        let names: Vec<&str> = f.tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "RPC pin nova-compute",
                "stop nova-compute",
                "db sync",
                "start nova-compute",
                "unpin RPC"
            ]
        );
        assert_eq!(f.tasks_at(When::Pre, 2)[0].name, "stop nova-compute");
        assert!(f.tasks_at(When::Pre, 2)[0].idempotent);
        assert_eq!(
            f.tasks_at(When::Post, 3)[0].timeout,
            Some(Duration::from_secs(1200))
        );
        let steps = f.steps();
        assert_eq!(
            (steps.pre, steps.post, steps.finalize),
            (vec![1, 2], vec![3, 4], true)
        );
    }

    #[test]
    fn bad_files_name_the_file_and_the_task() {
        let cases = [
            ("x = 1", "unknown field"),
            (
                "[[task]]\nstep = 1\nwhen = \"pre\"\ncommand = [\"a\"]",
                "task 1: name is missing",
            ),
            (
                "[[task]]\nname = \"a\"\nwhen = \"pre\"\ncommand = [\"a\"]",
                "task \"a\": step must be a number from 1",
            ),
            (
                "[[task]]\nname = \"a\"\nstep = 0\nwhen = \"post\"\ncommand = [\"a\"]",
                "step must be a number from 1",
            ),
            (
                "[[task]]\nname = \"a\"\nstep = 1\nwhen = \"during\"\ncommand = [\"a\"]",
                "when = \"during\"",
            ),
            (
                "[[task]]\nname = \"a\"\nstep = 1\nwhen = \"pre\"\ncommand = []",
                "command must be a non-empty",
            ),
            (
                "[[task]]\nname = \"a\"\nstep = 1\nwhen = \"pre\"\ncommand = \"rm -rf /\"",
                "invalid type",
            ),
            (
                "[[task]]\nname = \"a\"\nstep = 1\nwhen = \"pre\"\ncommand = [\"a\"]\n[[task]]\nname = \"a\"\nstep = 2\nwhen = \"pre\"\ncommand = [\"b\"]",
                "two tasks have this name",
            ),
            ("after = [\"svc\"]", "after names the service itself"),
            (
                "[[task]]\nname = \"a\"\nstep = 1\nwhen = \"pre\"\ncommand = [\"a\"]\ntimeout = \"soon\"",
                "timeout",
            ),
        ];
        for (text, want) in cases {
            let e = parse(&svc("svc"), Path::new("/d/svc.toml"), text).unwrap_err();
            assert!(e.starts_with("/d/svc.toml: "), "{e}");
            assert!(e.contains(want), "{text}: {e}");
        }
        // An empty file: a service without upgrade tasks.
        let f = parse(&svc("svc"), Path::new("/d/svc.toml"), "").unwrap();
        assert!(f.tasks.is_empty());
    }

    #[test]
    fn a_directory_is_read_into_a_catalog_and_services_run_in_dependency_order() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(load(&d.path().join("none")).catalog(), None);
        std::fs::write(d.path().join("nova_compute.toml"), NOVA).unwrap();
        std::fs::write(
            d.path().join("keystone.toml"),
            "[[task]]\nname = \"k\"\nstep = 1\nwhen = \"pre\"\ncommand = [\"true\"]\n",
        )
        .unwrap();
        std::fs::write(d.path().join("broken.toml"), "[[task]]\nname = 3").unwrap();
        std::fs::write(d.path().join("README"), "not a task file").unwrap();
        let s = load(d.path());
        let cat = s.catalog().unwrap();
        assert_eq!(cat.services.len(), 2);
        assert_eq!(cat.services[&svc("keystone")].pre, vec![1]);
        assert!(cat.problems[&svc("broken")].contains("broken.toml"));
        assert!(s.get(&svc("glance")).unwrap_err().contains("glance.toml"));
        assert_eq!(
            in_order(&[svc("nova_compute"), svc("keystone")], &s),
            vec![svc("keystone"), svc("nova_compute")]
        );
    }
}
