#!/usr/bin/env bash
# The long fault-injection run: N seeds (default 20), each a fleet of real agents
# with real Puppet and real jioctl drivers on a 3-member etcd under a random bounded
# schedule of faults (see tests/src/faults/mod.rs). Prints each seed's result and a
# summary line "N of M seeds passed"; exits non-zero when any seed failed.
#   ./scripts/faults.sh [SEEDS [FIRST_SEED [FAULTS_PER_SEED]]]
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-20}
first=${2:-1}
faults=${3:-4}
case "$count$first$faults" in *[!0-9]*) echo "usage: $0 [SEEDS [FIRST_SEED [FAULTS_PER_SEED]]]" >&2; exit 64;; esac
last=$((first + count - 1))
echo "==> building"
cargo build --workspace --bins --locked
passed=0
failed=()
for seed in $(seq "$first" "$last"); do
  if JIO_FAULT_SEEDS=$seed JIO_FAULTS=$faults cargo test -q --locked -p jio-tests --test faults -- --nocapture \
      > "target/faults-seed-$seed.log" 2>&1; then
    passed=$((passed + 1))
    echo "seed $seed: passed"
  else
    failed+=("$seed")
    echo "seed $seed: FAILED (log: target/faults-seed-$seed.log)"
  fi
done
echo "$passed of $count seeds passed${failed[*]:+; failed: ${failed[*]}}"
[ ${#failed[@]} -eq 0 ]
