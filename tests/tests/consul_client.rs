//! The Consul API test server checked by a client we did not write: py-consul 1.8.0
//! (tests/py/consul_client_check.py) drives it and asserts what a real Consul answers.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use jio_tests::consul::{ConsulOptions, ConsulServer};

const PY_CONSUL: &str = "py-consul==1.8.0";
const FIX: &str = "on Debian: apt-get install -y python3 python3-venv (and reach PyPI for pip)";

/// Runs a command to its end; panics with its output, and how to fix it, when it fails.
fn run(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}\n{FIX}"));
    assert!(
        out.status.success(),
        "{what}: {cmd:?} failed ({})\nstdout:\n{}\nstderr:\n{}\n{FIX}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
}

/// Whether `venv` has py-consul 1.8.0 installed.
fn has_py_consul(venv: &Path) -> bool {
    Command::new(venv.join("bin/python"))
        .args([
            "-c",
            "import consul, importlib.metadata as m; assert m.version('py-consul') == '1.8.0'",
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A virtualenv with py-consul 1.8.0, made once under the target directory and reused.
fn venv() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("py-consul-1.8.0-venv");
        if has_py_consul(&venv) {
            return venv;
        }
        // Made aside and renamed into place: another test run may be making it too.
        let tmp = venv.with_file_name(format!("py-consul-1.8.0-venv.tmp{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&tmp),
            "python3 -m venv",
        );
        run(
            Command::new(tmp.join("bin/python")).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                PY_CONSUL,
            ]),
            "pip install py-consul",
        );
        if has_py_consul(&venv) {
            // Another run put its own in place meanwhile: keep that one.
            let _ = std::fs::remove_dir_all(&tmp);
        } else {
            let _ = std::fs::remove_dir_all(&venv);
            if std::fs::rename(&tmp, &venv).is_err() {
                let _ = std::fs::remove_dir_all(&tmp);
            }
        }
        assert!(
            has_py_consul(&venv),
            "{} has no py-consul 1.8.0\n{FIX}",
            venv.display()
        );
        venv
    })
    .clone()
}

/// Runs the py-consul checks against `server` (off the runtime's workers, so the
/// server keeps answering) and asserts they all passed.
async fn check_with_py_consul(server: &ConsulServer, token: Option<&str>) {
    let addr = server.addr().to_string();
    let token = token.map(str::to_string);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/consul_client_check.py");
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(venv().join("bin/python"));
        // Every check runs, so a failure lists all that differ from real Consul.
        cmd.arg(&script).arg(&addr).arg("--keep-going");
        if let Some(t) = &token {
            cmd.args(["--token", t]);
        }
        for v in [
            "CONSUL_HTTP_ADDR",
            "CONSUL_HTTP_TOKEN",
            "CONSUL_HTTP_SSL",
            "CONSUL_HTTP_SSL_VERIFY",
        ] {
            cmd.env_remove(v);
        }
        cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "py-consul checks failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn py_consul_agrees_with_the_server() {
    let server = ConsulServer::start(ConsulOptions::default()).await;
    check_with_py_consul(&server, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn py_consul_agrees_with_the_server_under_an_acl_token() {
    let token = "b1gs3cr3t-0000-4000-8000-000000000001";
    let server = ConsulServer::start(ConsulOptions {
        token: Some(token.into()),
        ..ConsulOptions::default()
    })
    .await;
    check_with_py_consul(&server, Some(token)).await;
}
