#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian machine: installs the real components
# the tests drive (through apt, when run as root), then fmt, clippy and every test.
set -euo pipefail
cd "$(dirname "$0")/.."

# binary:package — the real programs the tests start.
NEEDED=(
  "etcd:etcd-server"
  "etcdctl:etcd-client"
  "puppet:puppet-agent"
  "run-parts:debianutils"
  "swift-proxy-server:swift-proxy"
  "swift-account-server:swift-account"
  "swift-container-server:swift-container"
  "swift-object-server:swift-object"
  "swift-ring-builder:swift"
  "memcached:memcached"
  "cloud-init:cloud-init"
  "lintian:lintian"
  "groff:groff-base"
  "debootstrap:debootstrap"
  "systemd-analyze:systemd"
  "protoc:protobuf-compiler"
  "python3:python3"
  "promtool:prometheus"
  "faketime:faketime"
  "shellcheck:shellcheck"
)

missing=()
for entry in "${NEEDED[@]}"; do
  bin=${entry%%:*} pkg=${entry#*:}
  if ! command -v "$bin" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$bin" ]; then
    missing+=("$pkg")
  fi
done
# The Consul test server is checked by py-consul in a virtualenv (tests/tests/consul_client.rs).
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=("python3-venv")
fi
if [ ${#missing[@]} -gt 0 ]; then
  # shellcheck disable=SC2207
  missing=($(printf '%s\n' "${missing[@]}" | sort -u))
  if [ "$(id -u)" -eq 0 ]; then
    echo "==> installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing packages: ${missing[*]}" >&2
    echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "==> cargo deny check licenses bans (deny.toml)"
if ! cargo deny --version >/dev/null 2>&1; then
  echo "==> installing cargo-deny from crates.io: cargo install --locked cargo-deny (a few minutes, once)"
  cargo install --locked --quiet cargo-deny
fi
cargo deny --log-level error check licenses bans
echo "==> cargo build (the scenario tests drive the real binaries)"
cargo build --workspace --bins --locked
echo "==> cargo test"
cargo test --workspace --locked
echo "==> packages: build, lintian, install/upgrade/purge in a throwaway root"
packaging/test-debs.sh
echo "==> the quick start: ./examples/local-fleet.sh"
./examples/local-fleet.sh
echo "==> the quick start's composable rollout: ./examples/local-fleet.sh --composable"
./examples/local-fleet.sh --composable
echo "==> all tests passed"
