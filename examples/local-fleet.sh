#!/usr/bin/env bash
# The quick start: a local fleet of real jio-agent processes on the embedded store,
# rolled from v1 to v2 by `jioctl upgrade --retry` under examples/rolling.json.
# Needs the Rust toolchain and protoc (etcd's gRPC client is generated at build
# time: installed through apt when run as root); uses Puppet when it is installed, else
# examples/fake-puppet.sh. Cleans up every process it started, also on Ctrl-C.
#
# The hosts' packages move with their version: examples/snapshot-repo.sh builds a
# signed apt repository whose snapshot v1 holds jio-hello 1.0 and v2 jio-hello 2.0,
# served on loopback and set as the fleet's template (`jioctl repo set`); each host
# has its own package root in which its agent runs real apt-get and dpkg (also as a
# normal user; never in this machine's own root), and the script ends by reading
# jio-hello's version in every root with dpkg-query. Without dpkg-deb, apt-ftparchive,
# gpg or python3 it says so and leaves the packages out.
#
# With --composable, the rollout is a composable one (issue 17) under
# examples/composable/rules.json: its roles_data gives each role its services, whose
# task files (examples/composable/services/) the agents read from `services_dir`.
# It runs in two stages of the same rollout, `--stage controlplane` (controllers and
# storage hosts) then `--stage compute`, each host of a stage moving through the
# services' pre steps, its Puppet run and the post steps in lockstep, and ends with
# the finalize tasks on controller1. Every task is examples/composable/task.sh, which
# logs its start and end to one file, printed at the end. FAIL_TASK=HOST-SERVICE-STEP
# (e.g. compute3-nova_compute-post-3) makes that task fail, to see a failed step.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

COMPOSABLE=0
for arg in "$@"; do
  case $arg in
    --composable) COMPOSABLE=1 ;;
    -h|--help) echo "usage: $0 [--composable]"; exit 0 ;;
    *) echo "usage: $0 [--composable]" >&2; exit 64 ;;
  esac
done

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
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug
case $BIN in /*) ;; *) BIN=$ROOT/$BIN ;; esac  # a relative CARGO_TARGET_DIR is cargo's, from here

WORK=$(mktemp -d "${TMPDIR:-/tmp}/jio-local-fleet.XXXXXX")
PIDS=()
# shellcheck disable=SC2317 # run by the EXIT trap, which shellcheck does not follow
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
toml_escape() { local s=${1//\\/\\\\}; printf '%s' "${s//\"/\\\"}"; }
# The actions fleet commands may run (the agents' actions_dir).
ACTIONS=$ROOT/examples/actions

# The hosts' packages (not with --composable): the snapshot repository, served on
# loopback, and its template; each host's package root is made with its agent.toml.
PACKAGES=0
if [ "$COMPOSABLE" -eq 0 ]; then
  if missing=$("$ROOT/examples/snapshot-repo.sh" missing); then
    PACKAGES=1
  else
    echo "==> $missing: the hosts' packages are left out (no snapshot repository)"
  fi
fi
if [ "$PACKAGES" -eq 1 ]; then
  REPO=$WORK/repo
  echo "==> building a signed snapshot repository: jio-hello 1.0 in $FROM, 2.0 in $TO"
  "$ROOT/examples/snapshot-repo.sh" build "$REPO" "$FROM" "$TO"
  : > "$REPO/http.log"  # read below before the server may have opened it
  "$ROOT/examples/snapshot-repo.sh" serve "$REPO" >> "$REPO/http.log" 2>&1 &
  PIDS+=($!)
  port=""
  for _ in $(seq 1 100); do
    port=$(sed -n 's/^Serving HTTP on .* port \([0-9]*\) .*/\1/p' "$REPO/http.log")
    [ -n "$port" ] && break
    sleep 0.05
  done
  [ -n "$port" ] || { echo "the snapshot repository's server did not start:" >&2; cat "$REPO/http.log" >&2; exit 1; }
  TEMPLATE="deb [signed-by=$REPO/keyring.gpg] http://127.0.0.1:$port/snapshots/{version} bookworm main"
  echo "==> jioctl repo set '$TEMPLATE'"
  "${JIOCTL[@]}" repo set "$TEMPLATE" >/dev/null
fi

if [ "$COMPOSABLE" -eq 1 ]; then
  # A task file holds argument lists, which the agent runs without a shell, so it
  # cannot say "task.sh of this checkout" or "the log of this run": the templates in
  # examples/composable/services/ say @TASK@ and @LOG@, and the files the agents read
  # are written here with this run's absolute paths (escaped for a TOML string).
  RULES=$ROOT/examples/composable/rules.json
  SERVICES=$WORK/services
  TASKLOG=$WORK/tasks.log
  task=$(toml_escape "$ROOT/examples/composable/task.sh")
  log=$(toml_escape "$TASKLOG")
  mkdir -p "$SERVICES"
  for t in examples/composable/services/*.toml; do
    text=$(<"$t")
    text=${text//@TASK@/"$task"}
    text=${text//@LOG@/"$log"}
    printf '%s\n' "$text" > "$SERVICES/${t##*/}"
  done
  echo "==> composable: the agents read the task files of $(cd "$SERVICES" && echo *.toml) from $SERVICES"
  if [ -n "${FAIL_TASK:-}" ]; then
    : > "$WORK/fail-$FAIL_TASK"
    echo "==> the task $FAIL_TASK will fail (FAIL_TASK)"
  fi
fi

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
  if [ "$PACKAGES" -eq 1 ]; then
    # apt-get and dpkg in the host's package root (examples/snapshot-repo.sh root
    # says why each setting), jio-hello 1.0 installed there before the agent starts:
    # dist-upgrade moves installed packages only.
    "$ROOT/examples/snapshot-repo.sh" root "$d/root"
    apt=(env "APT_CONFIG=$d/root/apt.conf" DEBIAN_FRONTEND=noninteractive apt-get -q)
    "${apt[@]}" install -y "$REPO/debs/jio-hello_1.0_all.deb" > "$d/root/install.log" 2>&1 \
      || { echo "installing jio-hello 1.0 in $h's package root failed:" >&2; cat "$d/root/install.log" >&2; exit 1; }
    pre="[$(toml_list "${apt[@]}" update), $(toml_list "${apt[@]}" dist-upgrade -y --allow-downgrades -o Dpkg::Options::=--force-confold)]"
    packages=$(printf 'apt_sources_file = "%s"\napt_preferences_file = "%s"\ndpkg_status_file = "%s"' \
      "$(toml_escape "$d/root/etc/apt/sources.list.d/jiocloud-snapshot.list")" \
      "$(toml_escape "$d/root/etc/apt/preferences.d/jiocloud-snapshot")" \
      "$(toml_escape "$d/root/var/lib/dpkg/status")")
  else
    pre="[]"
    # Without the snapshot repository no package sets are recorded (the machine's own
    # dpkg status is none of the hosts'), and the apt files an agent would write or
    # remove are the host's own, never the machine's.
    packages=$(printf 'apt_sources_file = "%s"\napt_preferences_file = "%s"\ndpkg_status_file = ""' \
      "$(toml_escape "$d/jiocloud-snapshot.list")" "$(toml_escape "$d/jiocloud-snapshot.pref")")
  fi
  cat > "$d/agent.toml" <<TOML
store = "$JIO_STORE"
hostname = "$h"
state_dir = "$d/state"
version_file = "$d/current_version"
facts_file = "$d/facts.d/current_version.txt"
validation_dir = "$d/tests"
hiera_file = "$d/hieradata/jiocloud.yaml"
pre_commands = $pre
${packages:+$packages
}puppet_command = $cmd
lease_ttl = "5s"
health_interval = "0"
# These agents share this machine: none of them may reboot it.
reboot = "never"
actions_dir = "$(toml_escape "$ACTIONS")"
TOML
  if [ "$COMPOSABLE" -eq 1 ]; then
    printf 'services_dir = "%s"\ntask_timeout = "5m"\n' "$(toml_escape "$SERVICES")" >> "$d/agent.toml"
  fi
done

echo "==> desired version $FROM; starting ${#HOSTS[@]} agents"
# The fleet commands' action log (examples/actions/restart-service writes it).
export ACTION_LOG=$WORK/actions.log
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

if [ "$COMPOSABLE" -eq 1 ]; then
  echo "==> composable rollout of $TO under examples/composable/rules.json:"
  sed 's/^/    /' "$RULES"
  status=0
  echo "==> stage controlplane: controllers and storage hosts, step by step in lockstep"
  "${JIOCTL[@]}" upgrade "$TO" --instructions-file "$RULES" --stage controlplane || status=$?
  echo "==> status between the stages (the computes stay at $FROM, healthy)"
  "${JIOCTL[@]}" status || true  # exits 1 when a host failed: said above
  if [ "$status" -eq 0 ]; then
    echo "==> stage compute: the same rollout goes on"
    "${JIOCTL[@]}" upgrade "$TO" --instructions-file "$RULES" --stage compute || status=$?
  fi
  echo "==> final status"
  "${JIOCTL[@]}" status || true  # exits 1 when a host failed: said above
  "${JIOCTL[@]}" rollout status || true
  echo "==> the task log, seconds from the first task: no host of a stage starts a step"
  echo "    before every host of the stage has ended the one before (each host's Puppet"
  echo "    run, not logged here, comes between its pre and post steps); finalize, when"
  echo "    every host reached $TO, is last; a \"fail\" line is a task that failed"
  if [ -s "$TASKLOG" ]; then
    awk '{ if (t0 == "") t0 = $NF; line = $1; for (i = 2; i < NF; i++) line = line " " $i
           printf "    %7.2fs  %s\n", $NF - t0, line }' "$TASKLOG"
  else
    echo "    (no task ran)"
  fi
  exit $status
fi

echo "==> rolling out $TO under examples/rolling.json:"
sed 's/^/    /' examples/rolling.json
status=0
"${JIOCTL[@]}" upgrade "$TO" --instructions-file examples/rolling.json --retry || status=$?

echo "==> final status"
"${JIOCTL[@]}" status || true  # exits 1 when a host failed: said above
[ "$status" -eq 0 ] || exit $status

if [ "$PACKAGES" -eq 1 ]; then
  echo "==> jio-hello in each host's package root, read by dpkg-query (not the agents' records):"
  wrong=0
  for h in "${HOSTS[@]}"; do
    v=$(dpkg-query --admindir="$WORK/$h/root/var/lib/dpkg" -W -f '${Version}' jio-hello 2>/dev/null) || v="not installed"
    echo "    $h: jio-hello $v"
    [ "$v" = 2.0 ] || wrong=1
  done
  echo "==> what compute1's agent recorded (jioctl explain compute1):"
  "${JIOCTL[@]}" explain compute1 | awk '/^  packages:/ { p = 1; print; next } p && /^    / { print; next } { p = 0 }'
  if same=$("${JIOCTL[@]}" verify-hosts "$TO" --same-packages "${HOSTS[@]}" 2>&1); then
    echo "==> no package drift: the hosts of each role share one package set at $TO (jioctl verify-hosts --same-packages)"
  else
    echo "==> package drift at $TO (jioctl verify-hosts --same-packages):"
    printf '%s\n' "$same" | sed 's/^/    /'
    wrong=1
  fi
  if [ "$wrong" -ne 0 ]; then
    echo "not every host has jio-hello 2.0 from $TO's snapshot, or their package sets differ" >&2
    exit 1
  fi
fi

echo "==> a fleet command under the same rules: restart-service web, role by role"
echo "    (the action is examples/actions/restart-service, installed in the agents' actions_dir)"
"${JIOCTL[@]}" run --all --instructions-file examples/rolling.json restart-service web || status=$?
echo "==> the action's own log, seconds from the first start: at most one host of a"
echo "    role at once (two computes), and no compute or storage host before both"
echo "    controllers are done"
if [ -s "$ACTION_LOG" ]; then
  awk '{ if (t0 == "") t0 = $NF; printf "    %7.2fs  %-5s %s\n", $NF - t0, $1, $2 }' "$ACTION_LOG"
fi
exit $status
