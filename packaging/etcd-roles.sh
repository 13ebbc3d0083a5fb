#!/bin/sh
# Least-privilege etcd roles for jiocloud fleet upgrades.
#
#   etcd-roles.sh [--prefix PREFIX] roles
#       Creates (or completes) the two roles under the key prefix PREFIX (the
#       `prefix` setting of agent.toml and jioctl.toml; empty by default):
#         jio-agent     reads everything under PREFIX/, writes only what an agent
#                       reports: status, running, hosts, agents, active_roles,
#                       runs and results.
#         jio-operator  reads and writes everything under PREFIX/.
#   etcd-roles.sh user NAME ROLE PASSWORD_FILE
#       Creates the user NAME (or sets its password) from PASSWORD_FILE, which must
#       be readable by its owner only, and grants it ROLE.
#   etcd-roles.sh [--prefix PREFIX] print
#       Prints the etcdctl commands of `roles` without running them.
#
# etcdctl is run as root of etcd: give the connection and the credentials the
# usual etcdctl way, in the environment, for example
#   ETCDCTL_API=3 ETCDCTL_ENDPOINTS=https://10.0.0.1:2379 ETCDCTL_CACERT=/etc/etcd/ca.pem \
#   ETCDCTL_CERT=/etc/etcd/admin.pem ETCDCTL_KEY=/etc/etcd/admin-key.pem ETCDCTL_USER=root \
#   ETCDCTL_PASSWORD=... etcd-roles.sh roles
# (etcdctl 3.4 reads ETCDCTL_USER as "root:password" when ETCDCTL_PASSWORD is unset).
# Then enable authentication once, if it is not: etcdctl user grant-role root root;
# etcdctl auth enable.
#
# Every step can be run again: an existing role or user is kept and completed.
set -eu
# No pathname expansion: a planned command is split into words, never globbed.
set -f

prefix=""
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || { echo "etcd-roles.sh: --prefix needs a value" >&2; exit 2; }
                  prefix="$2"; shift 2 ;;
        --prefix=*) prefix="${1#--prefix=}"; shift ;;
        -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) break ;;
    esac
done
prefix="${prefix%/}"
case "$prefix" in
    ""|/*) ;;
    *) echo "etcd-roles.sh: --prefix $prefix: a prefix must start with '/' (or be empty)" >&2; exit 2 ;;
esac
case "$prefix" in
    *//*|*[!A-Za-z0-9_./-]*)
        echo "etcd-roles.sh: --prefix $prefix: only letters, digits, '_', '.', '-' and single '/' are allowed" >&2; exit 2 ;;
esac

# What an agent writes, each a prefix under PREFIX (the key schema of common/src/keys.rs).
AGENT_WRITES="/status/ /running/ /hosts/ /agents/ /active_roles/ /runs/ /results/ /command_runs/ /packages/"

export ETCDCTL_API=3
ETCDCTL="${ETCDCTL:-etcdctl}"

plan() {
    echo "role add jio-agent"
    echo "role grant-permission jio-agent read $prefix/ --prefix=true"
    for p in $AGENT_WRITES; do
        echo "role grant-permission jio-agent readwrite $prefix$p --prefix=true"
    done
    echo "role add jio-operator"
    echo "role grant-permission jio-operator readwrite $prefix/ --prefix=true"
}

run() {
    # shellcheck disable=SC2086 # the words of one planned command
    "$ETCDCTL" "$@"
}

cmd="${1:-}"
case "$cmd" in
    print)
        plan | while read -r line; do printf '%s %s\n' "$ETCDCTL" "$line"; done
        ;;
    roles)
        command -v "$ETCDCTL" >/dev/null 2>&1 || {
            echo "etcd-roles.sh: $ETCDCTL not found; install it: apt-get install -y etcd-client" >&2; exit 1; }
        plan | while read -r line; do
            case "$line" in
                "role add "*)
                    role="${line#role add }"
                    if run role get "$role" >/dev/null 2>&1; then
                        echo "role $role exists; completing its permissions"
                        continue
                    fi ;;
            esac
            # shellcheck disable=SC2086 # split the planned command into words
            run $line >/dev/null || { echo "etcd-roles.sh: etcdctl $line failed" >&2; exit 1; }
            echo "$line"
        done
        ;;
    user)
        [ $# -eq 4 ] || { echo "usage: etcd-roles.sh user NAME ROLE PASSWORD_FILE" >&2; exit 2; }
        name="$2"; role="$3"; file="$4"
        [ -r "$file" ] || { echo "etcd-roles.sh: $file: cannot read it" >&2; exit 1; }
        # etcdctl --interactive=false reads one word: a password with a space or a
        # tab would be cut there, and differ from what jio reads from the file.
        if head -n 1 "$file" | grep -q '[[:space:]]'; then
            echo "etcd-roles.sh: $file: the password holds a space or a tab; etcdctl would keep only its first word: choose one without" >&2
            exit 1
        fi
        mode=$(stat -c %a "$file")
        case "$mode" in
            ?00|400|600) ;;
            *) echo "etcd-roles.sh: $file is readable by group or others (mode $mode); run chmod 600 on it" >&2; exit 1 ;;
        esac
        if run user get "$name" >/dev/null 2>&1; then
            # --interactive=false reads the password from standard input: it is
            # never on a command line.
            head -n 1 "$file" | run user passwd "$name" --interactive=false >/dev/null
            echo "user $name exists; password set from $file"
        else
            head -n 1 "$file" | run user add "$name" --interactive=false >/dev/null
            echo "user $name created with the password in $file"
        fi
        run user grant-role "$name" "$role" >/dev/null
        echo "user $name holds role $role"
        ;;
    *)
        echo "usage: etcd-roles.sh [--prefix PREFIX] roles|print, or etcd-roles.sh user NAME ROLE PASSWORD_FILE" >&2
        exit 2
        ;;
esac
