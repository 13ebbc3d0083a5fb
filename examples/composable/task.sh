#!/bin/sh
# One upgrade task of the composable example (examples/local-fleet.sh --composable):
#   task.sh LOG [COMMAND ARG...]
# COMMAND is what the task runs on a real node (crudini, systemctl, nova-manage,
# ...); here it is only printed, so that the example runs on a plain Debian box
# without OpenStack. The log path comes as the first argument because a task file
# holds an argument list, run without a shell, and the agent gives a task its own
# environment (JIO_HOST, JIO_SERVICE, JIO_STEP, JIO_TASK, JIO_ROLE, JIO_VERSION,
# JIO_ROLLOUT, JIO_RUN_DIR), nothing of the operator's.
#
# Appends to LOG, one line each, when it starts and when it ends:
#   start HOST SERVICE STEP TASK UNIX_TIME
#   end HOST SERVICE STEP TASK UNIX_TIME
# (STEP as JIO_STEP says it: pre-1, post-3, finalize; TASK with its spaces as '_'),
# so that the lockstep shows in the log: no host of a stage starts a step before
# every host of the stage has ended the one before. Sleeps TASK_SECONDS (default
# 0.3), then exits 0, or 1 when a file fail-HOST-SERVICE-STEP exists next to LOG
# (for a demo of a failed step: `FAIL_TASK=compute3-nova_compute-post-3
# examples/local-fleet.sh --composable` creates it).
set -eu
[ "$#" -ge 1 ] || { echo "usage: $0 LOG [COMMAND ARG...]" >&2; exit 64; }
log=$1
shift
host=${JIO_HOST:?is set by jio-agent} service=${JIO_SERVICE:?is set by jio-agent}
step=${JIO_STEP:?is set by jio-agent}
task=$(printf '%s' "${JIO_TASK:?is set by jio-agent}" | tr ' \t' '__')
fail="$(dirname "$log")/fail-$host-$service-$step"

echo "start $host $service $step $task $(date +%s.%N)" >> "$log"
if [ "$#" -gt 0 ]; then
  echo "$host: $service $step \"$JIO_TASK\" would run: $*"
fi
sleep "${TASK_SECONDS:-0.3}"
if [ -e "$fail" ]; then
  echo "fail $host $service $step $task $(date +%s.%N)" >> "$log"
  echo "failing on purpose: $fail exists" >&2
  exit 1
fi
echo "end $host $service $step $task $(date +%s.%N)" >> "$log"
exit 0
