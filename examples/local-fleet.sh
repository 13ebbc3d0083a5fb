#!/usr/bin/env bash
# The quick start: a local fleet of real jio-agent processes on the embedded store,
# rolled from v1 to v2 by `jioctl upgrade --retry` under examples/rolling.json.
# Needs the Rust toolchain and protoc (etcd's gRPC client is generated at build
# time: installed through apt when run as root); uses Puppet when it is installed, else
# examples/fake-puppet.sh. Cleans up every process it started, also on Ctrl-C.
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
BIN=$ROOT/target/debug

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
  cat > "$d/agent.toml" <<TOML
store = "$JIO_STORE"
hostname = "$h"
state_dir = "$d/state"
version_file = "$d/current_version"
facts_file = "$d/facts.d/current_version.txt"
validation_dir = "$d/tests"
hiera_file = "$d/hieradata/jiocloud.yaml"
pre_commands = []
puppet_command = $cmd
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
