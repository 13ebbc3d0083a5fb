//! `jio-bench-packages [STATUS_FILE] [--runs N]`: what recording a host's installed
//! package set costs: reading and parsing dpkg's status file (default
//! `/var/lib/dpkg/status`, only read), its digest, and the sizes stored (the set
//! under `/packages/<digest>`, the record in `/results/<host>`). Prints one JSON line.

use std::process::ExitCode;
use std::time::Instant;

use jio_common::packages::{PackageRecord, PackageSet};

fn main() -> ExitCode {
    let mut path = "/var/lib/dpkg/status".to_string();
    let mut runs = 50usize;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match (
            args[i].as_str(),
            args.get(i + 1).and_then(|n| n.parse::<usize>().ok()),
        ) {
            ("--runs", Some(n)) if n > 0 => {
                runs = n;
                i += 1;
            }
            (p, _) if !p.starts_with('-') => path = p.to_string(),
            _ => {
                eprintln!("usage: jio-bench-packages [STATUS_FILE] [--runs N]");
                return ExitCode::from(64);
            }
        }
        i += 1;
    }
    let mut times = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("jio-bench-packages: {path}: {e}");
                return ExitCode::from(66);
            }
        };
        let set = PackageSet::from_dpkg_status(&text);
        let digest = set.digest();
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        last = Some((text.len(), set, digest));
    }
    let Some((status_bytes, set, _)) = last else {
        return ExitCode::from(70);
    };
    times.sort_by(f64::total_cmp);
    let record = PackageRecord::of(&set, Some(&set), 0);
    let record_bytes = serde_json::to_string(&record).map_or(0, |s| s.len());
    println!(
        "{}",
        serde_json::json!({
            "status_file": path,
            "status_bytes": status_bytes,
            "packages": set.len(),
            "read_parse_digest_ms": {"p50": times[runs / 2], "max": times[runs - 1]},
            "stored_set_bytes": set.to_text().len(),
            "result_record_bytes": record_bytes,
            "runs": runs,
        })
    );
    ExitCode::SUCCESS
}
