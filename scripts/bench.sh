#!/usr/bin/env bash
# Runs the benchmarks on a real etcd and on the embedded store; prints the tables and
# writes target/bench/etcd.json and target/bench/sqlite.json. Installs etcd through
# apt when missing (as root). Usage: scripts/bench.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v etcd >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    apt-get install -y -qq etcd-server >/dev/null
  else
    echo "etcd is missing: sudo apt-get install -y etcd-server" >&2
    exit 1
  fi
fi
cargo build --release --locked --bins
# The idle agent is measured as it is packaged: built for size.
cargo build --profile agent --locked -p jio-agent
for store in etcd sqlite; do
  ./target/release/jio-bench --store "$store" --out "target/bench/$store.json" "$@"
  echo
done
