#!/bin/sh
# Stands in for `puppet apply --detailed-exitcodes` when Puppet is not installed:
#   fake-puppet.sh --logdest LOG.jsonl FILE
# writes "$JIO_VERSION" into FILE and exits like Puppet: 2 when it changed the
# file, 0 when it was already right, 1 on bad arguments, 4 when FILE cannot be written.
set -u
if [ "$#" -ne 3 ] || [ "$1" != "--logdest" ]; then echo "usage: $0 --logdest LOG FILE" >&2; exit 1; fi
log=$2 file=$3 want="${JIO_VERSION:-unknown}"
sleep "${FAKE_PUPPET_SECONDS:-1}"
if [ -f "$file" ] && [ "$(cat "$file")" = "$want" ]; then
  printf '{"level":"notice","message":"Applied catalog: no changes"}\n' >> "$log"
  exit 0
fi
if printf '%s\n' "$want" > "$file"; then
  printf '{"level":"notice","message":"content changed to %s","source":"File[%s]"}\n' "$want" "$file" >> "$log"
  exit 2
fi
printf '{"level":"err","message":"cannot write %s"}\n' "$file" >> "$log"
exit 4
