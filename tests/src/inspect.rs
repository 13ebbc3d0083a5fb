//! Small helpers the scenario tests share: opening a store, reading a host's
//! entries, finding the built binaries, showing a command's output, waiting for a
//! condition.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Output;
use std::time::{Duration, Instant};

use jio_common::keys::{Parsed, Schema};
use jio_common::names::HostName;
use jio_common::store::{self, DynStore, StoreUrl};

/// Opens the store at `url` (it must answer).
pub async fn open(url: &str) -> DynStore {
    store::open(&StoreUrl::parse(url).expect("store URL"))
        .await
        .expect("open the store")
}

/// A command's stdout and stderr, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The host's `/status` (per version) and `/running/versions` entries, as key names.
pub async fn host_entries(s: &DynStore, host: &str) -> BTreeSet<String> {
    let schema = Schema::default();
    let h = HostName::new(host).expect("host name");
    let mut out = BTreeSet::new();
    for prefix in [schema.status_root(), schema.running_versions()] {
        for kv in s.list(&prefix).await.expect("list").kvs {
            match schema.parse(&kv.key) {
                Some(Parsed::Status(_, _, _, x)) | Some(Parsed::RunningVersion(_, x)) if x == h => {
                    out.insert(kv.key.to_string());
                }
                _ => {}
            }
        }
    }
    out
}

/// The binary `name` built beside `binary` (another of the workspace's binaries).
pub fn sibling_binary(binary: &str, name: &str) -> PathBuf {
    let p = PathBuf::from(binary).with_file_name(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` first (./scripts/test.sh does)",
        p.display()
    );
    p
}

/// The workspace's built binary `name`, beside the running test (a test runs from
/// `target/<profile>/deps/`; the binaries are in `target/<profile>/`).
pub fn built_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test runs from target/<profile>/deps");
    sibling_binary(&profile_dir.join(name).display().to_string(), name)
}

/// Waits until `cond` holds, polling every 50 ms, or fails naming what it waited for.
pub async fn wait_for<F, Fut>(what: &str, within: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < within,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every file below `dir` whose name ends in `.<ext>`, in no particular order.
pub fn files_below(dir: &std::path::Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == ext) {
                out.push(path);
            }
        }
    }
    out
}
