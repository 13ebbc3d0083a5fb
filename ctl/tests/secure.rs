//! etcd in production: TLS with client-certificate verification, authentication,
//! and the least-privilege roles of `packaging/etcd-roles.sh`, on a real etcd.
//!
//! The rollout runs with every agent as the `jio-agent` user and jioctl as
//! `jio-operator`, and etcd is restarted in the middle of it, which leaves every
//! client idle past its 1 s token; its limit is checked on the configuration step's
//! own log. Every bad credential is one line on stderr,
//! exit code 8, and leaves the store as it was.

#![allow(clippy::unwrap_used)] // tests fail loudly by design
#![allow(clippy::disallowed_methods)] // they time real processes on the wall clock

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use jio_common::keys::Schema;
use jio_tests::Etcd;
use jio_tests::inspect::{open, text};

use common::fleet::{Fleet, finish, max_overlap, now, spawn};
use common::run;
use jio_tests::inspect::wait_for;

const COMPUTE_2: &str = r#"{"rolling_rules":{"roles":{"compute":2}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_over_tls_with_restricted_roles_and_expiring_tokens() {
    // etcd renews a simple token's 1 s TTL each time it is used, so a busy client
    // may keep its token; a restart of etcd leaves every client idle past it.
    let mut etcd = Etcd::secure(1, "").await;
    let operator = etcd.url_as("jio-operator");
    let agent = etcd.url_as("jio-agent");
    let names = [
        "compute1", "compute2", "compute3", "compute4", "compute5", "compute6",
    ];
    let f = Fleet::start_as(&operator, &agent, &names, 1.5).await;
    let t0 = now();
    let driver = spawn(
        &operator,
        &["upgrade", "v2", "--instructions", COMPUTE_2, "--retry"],
    );
    wait_for("the first wave of v2 to run", Duration::from_secs(60), || async {
        f.started("v2") >= 2
    })
    .await;
    etcd.restart(0).await;
    let out = finish(driver, Duration::from_secs(180)).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(f.all_at("v2"));
    let runs = f.runs();
    let (most, at) = max_overlap(&runs, t0);
    assert_eq!(
        most, 2,
        "the limit of 2, reached and never passed: {at:?}\n{runs:#?}"
    );
    for name in names {
        let log = std::fs::read_to_string(f.work.path().join(format!("{name}.log"))).unwrap();
        assert!(!log.contains("permission denied"), "{name}: {log}");
        assert!(!log.contains("-pw-"), "{name} logged a password: {log}");
        assert!(
            log.contains("etcd token renewed"),
            "{name} renewed its token after the restart: {log}"
        );
    }
}

/// The URL of `etcd` as `user`, with one parameter replaced.
/// The current version the store at `url` holds.
async fn current_version(url: &str) -> String {
    let s = open(url).await;
    s.get(&Schema::default().current_version())
        .await
        .unwrap()
        .unwrap()
        .value
}

fn with(url: &str, param: &str, value: &Path) -> String {
    let (base, query) = url.split_once('?').unwrap();
    let q: Vec<String> = query
        .split('&')
        .map(|kv| {
            if kv.starts_with(&format!("{param}=")) {
                format!("{param}={}", value.display())
            } else {
                kv.to_string()
            }
        })
        .collect();
    format!("{base}?{}", q.join("&"))
}

/// `jio-agent run` for compute1 as the `jio-agent` user with the password in `pw`,
/// its stderr in `log`; stopped when the child is dropped.
fn agent_with_password(etcd: &Etcd, pw: &Path, log: &Path) -> (jio_tests::Host, tokio::process::Child) {
    let url = with(&etcd.url_as("jio-agent"), "password_file", pw);
    let host = jio_tests::Host::new("compute1", &url, &["/bin/true".to_string()], "");
    let child = tokio::process::Command::from(host.agent(&common::agent_bin(), &["run"]))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    (host, child)
}

/// The URL with another client certificate and key.
fn with_cert(url: &str, c: &jio_tests::pki::CertFiles) -> String {
    with(&with(url, "cert_file", &c.cert), "key_file", &c.key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_are_one_clear_line_and_change_nothing() {
    let etcd = Etcd::secure(300, "").await;
    let operator = etcd.url_as("jio-operator");
    let out = run(&operator, &["trigger-update", "v1"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let pki = etcd.pki().clone();
    // The certificate names 127.0.0.1 and etcd.test: connecting to the address while
    // checking the name works.
    let by_name = format!("{operator}&server_name=etcd.test");
    let out = run(&by_name, &["status"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let dir = tempfile::tempdir().unwrap();
    let wrong_pw = dir.path().join("wrong.password");
    std::fs::write(&wrong_pw, "not-the-password\n").unwrap();
    std::fs::set_permissions(&wrong_pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let open_key = dir.path().join("open.key");
    std::fs::copy(&pki.client.key, &open_key).unwrap();
    std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open_pw = dir.path().join("open.password");
    std::fs::copy(etcd.password_file("jio-operator"), &open_pw).unwrap();
    std::fs::set_permissions(&open_pw, std::fs::Permissions::from_mode(0o644)).unwrap();
    let no_client_cert = {
        let base = operator.split_once('?').unwrap().0;
        format!(
            "{base}?ca_file={}&user=jio-operator&password_file={}",
            pki.ca.display(),
            etcd.password_file("jio-operator").display()
        )
    };
    let cn_cert = with_cert(&etcd.url_as("jio-agent"), &pki.client_cn);
    let cases: Vec<(&str, String, &str, u8)> = vec![
        (
            "wrong CA",
            with(&operator, "ca_file", &pki.other_ca),
            "TLS: the server's certificate is not signed by ca_file",
            8,
        ),
        (
            "expired client certificate",
            with_cert(&operator, &pki.client_expired),
            "TLS: the server refused the client certificate",
            8,
        ),
        (
            "client certificate of an unknown CA",
            with_cert(&operator, &pki.client_unknown),
            "TLS: the server refused the client certificate",
            8,
        ),
        (
            "no client certificate",
            no_client_cert.clone(),
            "TLS: the server wants a client certificate and none is configured (give cert_file and key_file)",
            8,
        ),
        (
            "a server name the certificate does not carry",
            format!("{operator}&server_name=etcd.example"),
            "TLS: the server's certificate does not name the host connected to (set server_name to a name it carries)",
            8,
        ),
        (
            "no user",
            operator.split("&user=").next().unwrap().to_string(),
            "with no user given, as the CommonName of ",
            8,
        ),
        (
            "wrong password",
            with(&operator, "password_file", &wrong_pw),
            "authentication as user \"jio-operator\" failed: authentication failed, invalid user ID or password",
            8,
        ),
        (
            "write outside the role",
            etcd.url_as("jio-agent"),
            "permission denied (writing /current_version",
            8,
        ),
        (
            // The certificate names CN=root, which etcd would take as the user if no
            // token were sent: the token wins, so the agent's role is what counts.
            "a certificate whose CommonName is root, with the agent's user",
            cn_cert,
            "permission denied (writing /current_version, /locks/epoch as user \"jio-agent\")",
            8,
        ),
        (
            "a private key readable by others",
            with(&operator, "key_file", &open_key),
            "is readable by group or others (mode 0644); run chmod 600 on it",
            64,
        ),
        (
            "a password file readable by others",
            with(&operator, "password_file", &open_pw),
            "is readable by group or others (mode 0644); run chmod 600 on it",
            64,
        ),
    ];
    let passwords: Vec<String> = ["root", "jio-agent", "jio-operator"]
        .iter()
        .map(|u| {
            std::fs::read_to_string(etcd.password_file(u))
                .unwrap()
                .trim()
                .to_string()
        })
        .collect();
    for (what, url, expect, code) in cases {
        let out = run(&url, &["trigger-update", "v9"]).await;
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        eprintln!("{what}: {}", stderr.trim());
        assert_eq!(out.status.code(), Some(code as i32), "{what}: {}", text(&out));
        assert_eq!(stderr.trim().lines().count(), 1, "{what}: one line: {stderr}");
        assert!(
            stderr.contains(expect),
            "{what}: expected {expect:?} in: {stderr}"
        );
        for pw in &passwords {
            assert!(!stderr.contains(pw.as_str()), "{what}: a password in: {stderr}");
        }
        assert!(!stderr.contains("not-the-password"), "{what}: {stderr}");
    }
    // The server closes the connection as it refuses the handshake; a write racing
    // that close must be this error too, never a silent death by SIGPIPE (it was,
    // about one run in three).
    for i in 0..12 {
        let out = run(&no_client_cert, &["status"]).await;
        assert_eq!(
            out.status.code(),
            Some(8),
            "no client certificate, run {i}: {}",
            text(&out)
        );
        assert!(
            text(&out).contains("the server wants a client certificate"),
            "run {i}: {}",
            text(&out)
        );
    }
    assert_eq!(current_version(&operator).await, "v1", "nothing was changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_refuses_an_open_key_file_at_start() {
    let etcd = Etcd::secure(300, "").await;
    let dir = tempfile::tempdir().unwrap();
    let open_key = dir.path().join("open.key");
    std::fs::copy(&etcd.pki().client.key, &open_key).unwrap();
    std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let url = with(&etcd.url_as("jio-agent"), "key_file", &open_key);
    let host = jio_tests::Host::new("compute1", &url, &["/bin/true".to_string()], "");
    let out = tokio::process::Command::from(host.agent(&common::agent_bin(), &["run"]))
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "a bad configuration: {stderr}");
    assert!(
        stderr.contains(&format!(
            "key_file {}: is readable by group or others (mode 0640); run chmod 600 on it",
            open_key.display()
        )),
        "{stderr}"
    );
    let s = open(&etcd.url_as("jio-operator")).await;
    assert!(
        s.list(&Schema::default().hosts()).await.unwrap().kvs.is_empty(),
        "the agent registered nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_agent_waits_says_why_once_and_recovers() {
    let etcd = Etcd::secure(300, "").await;
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("agent.password");
    std::fs::write(&pw, "not-the-password\n").unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let log = dir.path().join("agent.log");
    let (_host, _agent) = agent_with_password(&etcd, &pw, &log);
    let refusal = "the store refused this agent; waiting";
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for("the refusal to be logged", Duration::from_secs(30), || async {
        read().contains(refusal)
    })
    .await;
    // Several more attempts fail the same way: said once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let text = read();
    assert_eq!(text.matches(refusal).count(), 1, "{text}");
    assert!(text.contains("authentication as user"), "{text}");
    assert!(!text.contains("not-the-password"), "{text}");
    let operator = open(&etcd.url_as("jio-operator")).await;
    let me = Schema::default().host(&"compute1".parse().unwrap());
    assert!(
        operator.get(&me).await.unwrap().is_none(),
        "nothing registered while refused"
    );
    // The password is fixed on the node: the agent gets in without a restart.
    std::fs::copy(etcd.password_file("jio-agent"), &pw).unwrap();
    wait_for("the agent to register", Duration::from_secs(60), || async {
        operator.get(&me).await.unwrap().is_some()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_on_an_etcd_without_authentication_is_let_through() {
    // Agents are configured with their user before an operator enables
    // authentication: they work meanwhile, without a token.
    let etcd = Etcd::secure_parts(true, false, 300, "").await;
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("agent.password");
    std::fs::write(&pw, "whatever\n").unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let url = format!(
        "{}&user=jio-agent&password_file={}",
        etcd.url_as("x"),
        pw.display()
    );
    assert!(url.starts_with("etcds://"), "{url}");
    let out = run(&url, &["trigger-update", "v3"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(current_version(&etcd.url_as("x")).await, "v3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_drops_tls_connections_is_passed_over() {
    let etcd = Etcd::secure(300, "").await;
    // A first endpoint that accepts and closes every connection mid-handshake.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let bad = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            drop(c);
        }
    });
    let url = etcd
        .url_as("jio-operator")
        .replacen("etcds://", &format!("etcds://127.0.0.1:{bad},"), 1);
    let out = run(&url, &["trigger-update", "v4"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(current_version(&etcd.url_as("jio-operator")).await, "v4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_liveness_renewal_is_said_once_and_its_end_once() {
    // Tokens expire after 1 s unused (a lease keep-alive does not use one).
    let etcd = Etcd::secure(1, "").await;
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("agent.password");
    std::fs::copy(etcd.password_file("jio-agent"), &pw).unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let log = dir.path().join("agent.log");
    let (_host, _agent) = agent_with_password(&etcd, &pw, &log);
    let operator = open(&etcd.url_as("jio-operator")).await;
    let me = Schema::default().agent(&"compute1".parse().unwrap());
    wait_for("the agent's liveness record", Duration::from_secs(30), || async {
        operator.get(&me).await.is_ok_and(|kv| kv.is_some())
    })
    .await;
    // The password file becomes unusable while the idle agent's token expires:
    // its next request finds the token gone and cannot get another, and from then
    // on every renewal is refused. etcd does not check the token of a lease
    // keep-alive, so the next request is caused by this write.
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    operator
        .put(&Schema::default().current_version(), "v1", None)
        .await
        .unwrap();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !read().contains("cannot renew the liveness lease") {
        assert!(
            std::time::Instant::now() < deadline,
            "no refused renewal logged: {}",
            read()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The lease is renewed every second (TTL 3 s): several more attempts fail.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let text = read();
    assert_eq!(
        text.matches("cannot renew the liveness lease").count(),
        1,
        "{text}"
    );
    assert_eq!(
        text.matches("liveness record restored").count(),
        0,
        "nothing was restored: {text}"
    );
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    wait_for("the record to be restored", Duration::from_secs(30), || async {
        read().contains("liveness record restored")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        read().matches("liveness record restored").count(),
        1,
        "{}",
        read()
    );
}
