//! Generated fleets written straight into a store, for scale tests and benchmarks.

use jio_common::keys::Key;
use jio_common::store::{DynStore, Op, StoreError, Txn};

/// Writes a fleet of `n` hosts (4 roles) with current version v2: a third already
/// at v2 (with the result of that run), the rest at v1, half enabled with a live
/// agent (its idle record and its clock, as a running agent keeps them), about 1%
/// failed.
pub async fn generate(s: &DynStore, n: usize) -> Result<(), StoreError> {
    let key = |k: String| {
        Key::new(k).map_err(|e| StoreError::Rejected {
            url: s.url().to_string(),
            op: "generate",
            message: e.to_string(),
        })
    };
    let now_ms = jio_common::time::unix_now_ms();
    let mut ops = vec![
        Op::put(key("/current_version".into())?, "v2"),
        Op::put(key("/config_state/enable_puppet/global".into())?, "false"),
    ];
    for i in 0..n {
        let role = ["compute", "controller", "stmon", "db"][i % 4];
        let h = format!("{role}{i}");
        ops.push(Op::put(
            key(format!("/hosts/{h}"))?,
            format!(r#"{{"role":"{role}","agent_version":"0.1.0","addresses":[],"first_seen":1}}"#),
        ));
        let version = if i % 3 == 0 { "v2" } else { "v1" };
        ops.push(Op::put(
            key(format!("/running/versions/{version}/{h}"))?,
            "1700000000",
        ));
        if i % 2 == 0 {
            ops.push(Op::put(
                key(format!("/config_state/enable_puppet/host/{h}"))?,
                "true",
            ));
            ops.push(Op::put(
                key(format!("/agents/{h}"))?,
                format!(r#"{{"state":"idle","version":"{version}","since":1700000000,"pid":4242}}"#),
            ));
            ops.push(Op::put(key(format!("/running/clocks/{h}"))?, now_ms.to_string()));
        }
        if version == "v2" {
            ops.push(Op::put(
                key(format!("/results/{h}"))?,
                format!(
                    r#"{{"version":"v2","ok":true,"run_dir":"/var/lib/jio-agent/runs/{i}","at":1700000000}}"#
                ),
            ));
        }
        if i % 97 == 1 {
            ops.push(Op::put(key(format!("/status/configured/failure/v2/{h}"))?, ""));
        }
    }
    for chunk in ops.chunks(100) {
        s.txn(Txn {
            compares: vec![],
            ops: chunk.to_vec(),
        })
        .await?;
    }
    Ok(())
}

/// Failed hosts `generate(n)` writes.
pub fn generated_failures(n: usize) -> usize {
    (0..n).filter(|i| i % 97 == 1).count()
}
