#!/usr/bin/env bash
# The quick start: a local fleet of real jio-agent processes on the embedded store,
# rolled from v1 to v2 by `jioctl upgrade --retry` under examples/rolling.json.
# Needs the Rust toolchain and protoc (etcd's gRPC client is generated at build
# time: installed through apt when run as root); uses Puppet when it is installed, else
# examples/fake-puppet.sh. Cleans up every process it started, also on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

HOSTS=(controller1 controller2 compute1 compute2 compute3 compute4 stmon1 stmonwithosd1)
FROM=${FROM_VERSION:-v1}
TO=${TO_VERSION:-v2}

if [ -z "${PROTOC:-}" ] && ! command -v protoc >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "==> installing protobuf-compiler (protoc: the build generates etcd's gRPC client)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null; }
  else
    echo "protoc is needed to build (etcd's gRPC client is generated at build time): sudo apt-get install -y protobuf-compiler" >&2
    exit 1
  fi
fi

echo "==> building jio-agent and jioctl"
cargo build --quiet --bin jio-agent --bin jioctl
BIN=$ROOT/target/debug

WORK=$(mktemp -d "${TMPDIR:-/tmp}/jio-local-fleet.XXXXXX")
PIDS=()
cleanup() {
  trap - EXIT INT TERM
  if [ ${#PIDS[@]} -gt 0 ]; then
    kill -TERM "${PIDS[@]}" 2>/dev/null || true
    wait "${PIDS[@]}" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo; echo "interrupted"; exit 130' INT TERM

export JIO_STORE="sqlite://$WORK/store.db"
JIOCTL=("$BIN/jioctl" --store "$JIO_STORE")

if command -v puppet >/dev/null 2>&1; then
  PUPPET="puppet"
  echo "==> agents run the real puppet apply ($(puppet --version))"
else
  PUPPET="fake"
  echo "==> puppet is not installed: agents run examples/fake-puppet.sh (apt-get install puppet-agent for the real one)"
fi

toml_list() { local out="" a; for a in "$@"; do out+="\"${a//\"/\\\"}\", "; done; echo "[${out%, }]"; }

for h in "${HOSTS[@]}"; do
  d=$WORK/$h
  mkdir -p "$d/tests" "$d/puppet"/{conf,var,code,log,run}
  printf '#!/bin/sh\necho "%s answers"\n' "$h" > "$d/tests/10-service"
  chmod +x "$d/tests/10-service"
  if [ "$PUPPET" = puppet ]; then
    printf "file { '%s/motd': content => \"managed by jio-agent on %s\\\\n\" }\n" "$d" "$h" > "$d/site.pp"
    cmd=$(toml_list puppet apply --detailed-exitcodes --confdir "$d/puppet/conf" --vardir "$d/puppet/var" \
      --codedir "$d/puppet/code" --logdir "$d/puppet/log" --rundir "$d/puppet/run" \
      --publicdir "$d/puppet/var/public" --logdest "{log_jsonl}" "$d/site.pp")
  else
    cmd=$(toml_list "$ROOT/examples/fake-puppet.sh" --logdest "{log_jsonl}" "$d/deployed-version")
  fi
  cat > "$d/agent.toml" <<TOML
store = "$JIO_STORE"
hostname = "$h"
state_dir = "$d/state"
version_file = "$d/current_version"
facts_file = "$d/facts.d/current_version.txt"
validation_dir = "$d/tests"
pre_commands = []
puppet_command = $cmd
lease_ttl = "5s"
health_interval = "0"
TOML
done

echo "==> desired version $FROM; starting ${#HOSTS[@]} agents"
"${JIOCTL[@]}" trigger-update "$FROM" >/dev/null
for h in "${HOSTS[@]}"; do
  "$BIN/jio-agent" --config "$WORK/$h/agent.toml" run 2> "$WORK/$h/agent.log" &
  PIDS+=($!)
done

echo "==> waiting for every new host to converge to $FROM (first boot ignores the gate)"
for _ in $(seq 1 600); do
  if "${JIOCTL[@]}" verify-hosts "$FROM" "${HOSTS[@]}" >/dev/null 2>&1; then break; fi
  sleep 0.2
done
"${JIOCTL[@]}" verify-hosts "$FROM" "${HOSTS[@]}" >/dev/null || {
  echo "hosts did not reach $FROM; agent logs are in $WORK" >&2; "${JIOCTL[@]}" status; exit 1; }

echo "==> rolling out $TO under examples/rolling.json:"
sed 's/^/    /' examples/rolling.json
status=0
"${JIOCTL[@]}" upgrade "$TO" --instructions-file examples/rolling.json --retry || status=$?

echo "==> final status"
"${JIOCTL[@]}" status
exit $status
