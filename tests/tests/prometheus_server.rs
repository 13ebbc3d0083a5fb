//! The harness's real Prometheus: it scrapes the test's exporter, fires an alert
//! when a sample crosses its rule, resolves it when the sample comes back, and
//! answers nothing once stopped: what alert gates are tested against.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::time::Duration;

use jio_tests::prometheus_server::{Exporter, Prometheus};

const RULES: &str = "groups:
  - name: fleet
    rules:
      - alert: NovaApiErrors
        expr: nova_api_errors > 0
        labels:
          severity: critical
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alert_fires_resolves_and_a_stopped_server_answers_nothing() {
    let exporter = Exporter::start().await;
    exporter.set("nova_api_errors", 0.0);
    let mut prometheus = Prometheus::start(&[exporter.target()], RULES, Duration::from_millis(500)).await;
    prometheus.until_firing("NovaApiErrors", false).await;
    exporter.set("nova_api_errors", 3.0);
    prometheus.until_firing("NovaApiErrors", true).await;
    exporter.set("nova_api_errors", 0.0);
    prometheus.until_firing("NovaApiErrors", false).await;
    prometheus.stop();
    assert!(
        reqwest::get(format!("{}/-/ready", prometheus.url()))
            .await
            .is_err()
    );
    prometheus.restart().await;
    assert!(prometheus.alerts().await.is_empty(), "{}", prometheus.log());
}
