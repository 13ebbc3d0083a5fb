#!/usr/bin/env bash
# Builds the two Debian packages into target/debian/<revision>/:
#   jio-agent_<version>-<revision>_<arch>.deb and jioctl_<version>-<revision>_<arch>.deb
# Usage: packaging/build-debs.sh [REVISION]   (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
REVISION=${1:-1}

if ! command -v cargo-deb >/dev/null 2>&1; then
  echo "==> installing cargo-deb"
  cargo install cargo-deb --locked
fi
# The agent is built for size (Cargo.toml, [profile.agent]); jioctl for speed.
cargo build --profile agent --locked -p jio-agent
cargo build --release --locked -p jioctl
# Man pages and completions, generated from the CLI definitions.
cargo run --quiet --locked -p jio-packaging --bin jio-gen -- --out-dir target/packaging
OUT=target/debian/$REVISION
mkdir -p "$OUT"
for p in jio-agent:agent jioctl:release; do
  # cargo-deb only recognises target/release/ as build output (and reads it as the
  # profile's directory); the generated man pages and completions are plain files,
  # which is what its warning is about.
  # (pipefail: a failure of cargo deb itself still stops the script.)
  cargo deb --no-build --locked -p "${p%%:*}" --profile "${p##*:}" --deb-revision "$REVISION" -o "$OUT/" 2>&1 \
    | { grep -v "^warning: Only source paths starting with exactly 'target/release/'" || true; }
done
ls "$OUT"/*.deb
