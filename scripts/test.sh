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
  # The VM stage (tests/tests/vm_reboot.rs, tests/vm/build-image.sh).
  "qemu-system-x86_64:qemu-system-x86"
  "qemu-img:qemu-utils"
  "cloud-localds:cloud-image-utils"
  "socat:socat"
  "mkfs.ext4:e2fsprogs"
  "dpkg-scanpackages:dpkg-dev"
  "apt-ftparchive:apt-utils"
  # The apt snapshot tests (tests/tests/apt_snapshot_repo.rs, tests/apt/build-root.sh).
  "gpg:gpg"
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
    # Some machines carry qemu-utils from backports, which no source here provides;
    # QEMU from bookworm needs bookworm's qemu-utils, so it goes back to it.
    extra=()
    if printf '%s\n' "${missing[@]}" | grep -qx qemu-system-x86; then
      want=$(apt-cache madison qemu-utils | awk -F'|' '$3 ~ / bookworm\/main / {gsub(/ /,"",$2); print $2; exit}')
      have=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
      if [ -n "$have" ] && [ -n "$want" ] && [ "$have" != "$want" ]; then
        echo "==> qemu-utils $have goes back to bookworm's $want (QEMU needs its own)"
        extra=(--allow-downgrades "qemu-utils=$want")
      fi
    fi
    apt-get install -y -qq "${extra[@]}" "${missing[@]}" >/dev/null
  else
    echo "missing packages: ${missing[*]}" >&2
    echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

# The VM stage's guest image (debootstrap: network and disk bound) builds in the
# background while the rest runs; the VM stage waits for it. A cached image is
# found at once (tests/vm/build-image.sh; cache in ${JIO_VM_CACHE:-/var/cache/jiocloud-tests/vm}).
VM_IMAGE_LOG=$(mktemp "${TMPDIR:-/tmp}/jio-vm-image.XXXXXX")
setsid nice -n 10 tests/vm/build-image.sh >"$VM_IMAGE_LOG" 2>&1 &
VM_IMAGE_PID=$!
# Likewise the apt snapshot tests' Debian root (tests/apt/build-root.sh, cache in
# ${JIO_APT_CACHE:-/var/cache/jiocloud-tests/apt}); the tests wait for it under its lock.
APT_ROOT_LOG=$(mktemp "${TMPDIR:-/tmp}/jio-apt-root.XXXXXX")
setsid nice -n 10 tests/apt/build-root.sh >"$APT_ROOT_LOG" 2>&1 &
APT_ROOT_PID=$!
trap 'kill -- -"$VM_IMAGE_PID" -"$APT_ROOT_PID" 2>/dev/null || true; rm -f "$VM_IMAGE_LOG" "$APT_ROOT_LOG"' EXIT

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
# --all-targets leaves out test targets with `test = false` (the VM stage's).
cargo clippy -p jio-tests --test vm_reboot --locked -- -D warnings
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
echo "==> VM stage: QEMU guests booted by cloud-init, coordinated reboots (tests/tests/vm_reboot.rs)"
vm_start=$(date +%s)
if ! wait "$VM_IMAGE_PID"; then
  cat "$VM_IMAGE_LOG" >&2
  echo "the VM image could not be built (tests/vm/build-image.sh)" >&2
  exit 1
fi
sed 's/^/    /' "$VM_IMAGE_LOG"
# Alone: on two cores the guests must not run beside other tests.
cargo test -p jio-tests --locked --test vm_reboot -- --test-threads=1 --nocapture
echo "==> VM stage took $(( $(date +%s) - vm_start )) s"
echo "==> all tests passed"
