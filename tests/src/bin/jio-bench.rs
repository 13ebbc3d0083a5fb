//! `jio-bench --store etcd|sqlite [--quick] [--out PATH]`: runs the five benchmarks,
//! prints a table and writes the same figures as JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use jio_tests::bench::{self, Backend, Sizes};

fn usage() -> ExitCode {
    eprintln!("usage: jio-bench --store etcd|sqlite [--quick] [--out PATH]");
    ExitCode::from(64)
}

fn main() -> ExitCode {
    let mut backend = None;
    let mut quick = false;
    let mut out: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--store" => match args.next().as_deref() {
                Some("etcd") => backend = Some(Backend::Etcd),
                Some("sqlite") => backend = Some(Backend::Sqlite),
                _ => return usage(),
            },
            "--quick" => quick = true,
            "--out" => match args.next() {
                Some(p) => out = Some(PathBuf::from(p)),
                None => return usage(),
            },
            _ => return usage(),
        }
    }
    let Some(backend) = backend else { return usage() };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("jio-bench: {e}");
            return ExitCode::from(70);
        }
    };
    let sizes = if quick { Sizes::quick() } else { Sizes::full() };
    let report = rt.block_on(bench::run(backend, sizes));
    print!("{}", bench::table(&report));
    let out = out.unwrap_or_else(|| {
        PathBuf::from(format!(
            "target/bench/{}.json",
            match backend {
                Backend::Etcd => "etcd",
                Backend::Sqlite => "sqlite",
            }
        ))
    });
    if let Some(d) = out.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    match serde_json::to_string_pretty(&report).map(|j| std::fs::write(&out, j)) {
        Ok(Ok(())) => {
            println!("figures written to {}", out.display());
            ExitCode::SUCCESS
        }
        Ok(Err(e)) => {
            eprintln!("jio-bench: {}: {e}", out.display());
            ExitCode::from(70)
        }
        Err(e) => {
            eprintln!("jio-bench: {e}");
            ExitCode::from(70)
        }
    }
}
