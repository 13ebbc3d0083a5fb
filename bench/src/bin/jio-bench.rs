//! `jio-bench --store etcd|sqlite [--quick] [--out PATH]`: runs the five benchmarks,
//! prints a table and writes the same figures as JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use jio_bench::{self as bench, Backend, Sizes};

fn usage() -> ExitCode {
    eprintln!(
        "usage: jio-bench --store etcd|etcd-tls|sqlite [--quick] [--members N] [--hosts-per-role N] [--only makespan|status|footprint] [--proxy] [--out PATH]"
    );
    ExitCode::from(64)
}

fn main() -> ExitCode {
    let mut backend = None;
    let mut quick = false;
    let mut out: Option<PathBuf> = None;
    let mut per_role: Option<usize> = None;
    let mut members = 1;
    let mut only_makespan = false;
    let mut only_status = false;
    let mut only_footprint = false;
    let mut proxy = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--store" => match args.next().as_deref() {
                Some("etcd") => backend = Some(Backend::Etcd),
                Some("etcd-tls") => backend = Some(Backend::EtcdTls),
                Some("sqlite") => backend = Some(Backend::Sqlite),
                _ => return usage(),
            },
            "--quick" => quick = true,
            "--proxy" => proxy = true,
            "--hosts-per-role" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if n > 0 => per_role = Some(n),
                _ => return usage(),
            },
            "--members" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n @ 1..=7) => members = n,
                _ => return usage(),
            },
            "--only" => match args.next().as_deref() {
                Some("makespan") => only_makespan = true,
                Some("status") => only_status = true,
                Some("footprint") => only_footprint = true,
                _ => return usage(),
            },
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
    let mut sizes = if quick { Sizes::quick() } else { Sizes::full() };
    if let Some(n) = per_role {
        sizes.makespan_hosts_per_role = n;
    }
    sizes.members = members;
    if proxy && !only_makespan {
        eprintln!("jio-bench: --proxy is for --only makespan");
        return usage();
    }
    if only_status {
        let st = rt.block_on(async {
            let bs = bench::BenchStore::start(backend, sizes.members).await;
            bench::status(&bs, sizes.status_hosts).await
        });
        println!(
            "status --json on {backend:?}: {} hosts, {:.1}ms (read {:.1}ms, classify {:.1}ms, plan {:.1}ms, JSON {:.1}ms), {} store requests, {} bytes",
            st.hosts,
            st.wall_ms,
            st.read_ms,
            st.classify_ms,
            st.admission_ms,
            st.json_ms,
            st.store_requests,
            st.json_bytes
        );
        return ExitCode::SUCCESS;
    }
    if only_footprint {
        let f = rt.block_on(async {
            let bs = bench::BenchStore::start(backend, sizes.members).await;
            bench::footprint(&bs, sizes.idle).await
        });
        println!(
            "idle agent on {backend:?} for {:.0}s: {:.1}MB resident ({:.1}MB private, {:.1}MB of the program's file), cpu {:.2}s, {} store requests ({} lease renewals)",
            f.idle_s, f.rss_mb, f.rss_anon_mb, f.rss_file_mb, f.cpu_s, f.store_requests, f.lease_renewals
        );
        return ExitCode::SUCCESS;
    }
    if only_makespan {
        // One figure, to see how it depends on the fleet's size.
        let m = rt.block_on(async {
            bench::raise_nofile();
            let mut bs = bench::BenchStore::start(backend, sizes.members).await;
            if proxy {
                bs.use_proxy().await;
            }
            bench::makespan(&bs, sizes.makespan_hosts_per_role, sizes.makespan_step).await
        });
        println!(
            "makespan on {backend:?}: {}",
            bench::makespan_lines(&m).join("\n")
        );
        return ExitCode::SUCCESS;
    }
    let report = rt.block_on(bench::run(backend, sizes));
    print!("{}", bench::table(&report));
    let out = out.unwrap_or_else(|| {
        PathBuf::from(format!(
            "target/bench/{}.json",
            match backend {
                Backend::Etcd => "etcd",
                Backend::EtcdTls => "etcd-tls",
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
