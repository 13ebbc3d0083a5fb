#!/usr/bin/env bash
# Package tests: build both .debs, run lintian, then install, upgrade and purge them
# in a throwaway Debian root (debootstrap of bookworm, minbase plus systemd), where the
# maintainer scripts really run (no systemd runs there, as on these machines).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT_CACHE=target/debroot

fail() { echo "FAIL: $*" >&2; exit 1; }
# grep that reads all its input: `grep -q` quits at the first match, and under
# pipefail the writer's SIGPIPE then fails the check at random.
has() { grep "$@" >/dev/null; }
need() { command -v "$1" >/dev/null 2>&1 || fail "$1 is missing: apt-get install -y $2"; }
need lintian lintian
need debootstrap debootstrap
need systemd-analyze systemd

packaging/build-debs.sh 1 >/dev/null
packaging/build-debs.sh 2 >/dev/null
AGENT1=$(ls target/debian/1/jio-agent_*-1_*.deb)
AGENT2=$(ls target/debian/2/jio-agent_*-2_*.deb)
CTL1=$(ls target/debian/1/jioctl_*-1_*.deb)
echo "==> built $(basename "$AGENT1") $(basename "$AGENT2") $(basename "$CTL1")"

echo "==> lintian"
for deb in "$AGENT1" "$CTL1"; do
  report=$(lintian --fail-on error "$deb" 2>&1) || { echo "$report" | sed 's/^/    /'; fail "lintian reports errors on $(basename "$deb")"; }
  echo "$report" | grep -v "running with root privileges" | sed 's/^/    /' || true
  # A man page line groff cannot break (a long unbroken word in a help text).
  if echo "$report" | has "groff-message"; then fail "lintian: groff-message on $(basename "$deb")"; fi
done

if [ ! -f "$ROOT_CACHE/.complete" ]; then
  echo "==> debootstrap bookworm (minbase) into $ROOT_CACHE"
  rm -rf "$ROOT_CACHE"
  MIRROR=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
  debootstrap --variant=minbase --include=systemd bookworm "$ROOT_CACHE" "${MIRROR:-http://deb.debian.org/debian}" >/dev/null
  touch "$ROOT_CACHE/.complete"
fi
R=$(mktemp -d "${TMPDIR:-/tmp}/jio-debroot.XXXXXX")
trap 'rm -rf "$R"' EXIT
cp -a "$ROOT_CACHE/." "$R/"
cp "$AGENT1" "$AGENT2" "$CTL1" "$R/tmp/"
in_root() { chroot "$R" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C "$@"; }
dpkg_i() { in_root dpkg --force-confold -i "/tmp/$(basename "$1")" 2>&1; }

echo "==> install (default configuration)"
out=$(dpkg_i "$AGENT1") || fail "install failed: $out"
echo "$out" | has "is the shipped default" || fail "postinst did not recognise the default configuration: $out"
out=$(dpkg_i "$CTL1") || fail "jioctl install failed: $out"
in_root jio-agent --version | has '^jio-agent ' || fail "jio-agent --version"
in_root jioctl --version | has '^jioctl ' || fail "jioctl --version"
for f in /etc/jiocloud/agent.toml /lib/systemd/system/jio-agent.service /lib/systemd/system/jio-agent-bootstrap.service \
         /usr/share/man/man8/jio-agent.8.gz /usr/share/man/man8/jio-agent-run.8.gz /usr/share/man/man5/agent.toml.5.gz /usr/share/bash-completion/completions/jio-agent /usr/share/man/man1/jioctl.1.gz /usr/share/man/man1/jioctl-upgrade.1.gz \
         /usr/share/bash-completion/completions/jioctl /usr/share/zsh/vendor-completions/_jioctl \
         /usr/share/fish/vendor_completions.d/jioctl.fish /usr/share/doc/jioctl/examples/jio-upgrade.json \
         /usr/share/doc/jioctl/examples/hooks/jioctl.toml /usr/share/doc/jioctl/examples/hooks/nova-before \
         /usr/share/doc/jioctl/examples/hooks/nova-after /usr/share/doc/jioctl/examples/hooks/ceph-before \
         /usr/share/doc/jioctl/examples/hooks/ceph-after \
         /lib/systemd/system/jioctl-drive.service /usr/share/jiocloud/etcd-roles.sh \
         /usr/share/doc/jio-agent/changelog.Debian.gz /usr/share/doc/jio-agent/copyright \
         /etc/systemd/system/multi-user.target.wants/jio-agent.service; do
  [ -e "$R$f" ] || [ -L "$R$f" ] || fail "$f is missing after install"
done
# The example maintenance hooks are shell scripts the installed sh parses.
for f in nova-before nova-after ceph-before ceph-after; do
  in_root sh -n "/usr/share/doc/jioctl/examples/hooks/$f" || fail "the example hook $f does not parse"
done
[ -d "$R/var/lib/jiocloud" ] && [ -d "$R/usr/lib/jiocloud/tests" ] && [ -d "$R/usr/lib/jiocloud/services" ] \
  || fail "state, validation or services directory missing"
in_root sh /usr/share/jiocloud/etcd-roles.sh --prefix /jio print | has "role grant-permission jio-agent readwrite /jio/status/ --prefix=true" \
  || fail "the shipped etcd-roles.sh does not print the agent's role"
in_root dpkg-query -W -f='${Conffiles}\n' jio-agent | has /etc/jiocloud/agent.toml || fail "agent.toml is not a conffile"
# The shipped configuration is valid: the agent loads it (exit 1: no local version yet).
set +e; in_root jio-agent --hostname compute1 local-version >/dev/null 2>&1; rc=$?; set -e
[ "$rc" = 1 ] || fail "the shipped agent.toml does not load (exit $rc)"
echo "==> systemd-analyze verify"
# The driver service is shipped disabled: nothing enables it but an operator.
[ ! -e "$R/etc/systemd/system/multi-user.target.wants/jioctl-drive.service" ] || fail "jioctl-drive.service is enabled by the package"
systemd-analyze verify --man=no --root="$R" /lib/systemd/system/jio-agent.service /lib/systemd/system/jio-agent-bootstrap.service \
  /lib/systemd/system/jioctl-drive.service \
  || fail "systemd-analyze rejects the units"

echo "==> upgrade (edited configuration kept)"
echo 'store = "etcd://10.9.9.9:2379"' > "$R/etc/jiocloud/agent.toml"
out=$(dpkg_i "$AGENT2") || fail "upgrade failed: $out"
echo "$out" | has "not starting the service (restart)" || fail "postinst did not plan a restart on upgrade: $out"
grep -q 10.9.9.9 "$R/etc/jiocloud/agent.toml" || fail "the edited conffile was replaced on upgrade"
in_root dpkg-query -W -f='${Version}\n' jio-agent | has -- '-2$' || fail "version after upgrade"

echo "==> purge"
in_root dpkg --purge jio-agent jioctl >/dev/null 2>&1 || fail "purge failed"
for f in /var/lib/jiocloud /usr/lib/jiocloud /etc/jiocloud/agent.toml /usr/bin/jio-agent /usr/bin/jioctl /lib/systemd/system/jio-agent.service \
         /etc/systemd/system/multi-user.target.wants/jio-agent.service; do
  [ ! -e "$R$f" ] && [ ! -L "$R$f" ] || fail "$f is left after purge"
done

echo "==> fresh install with a configuration provided first (as cloud-init does)"
mkdir -p "$R/etc/jiocloud"
echo 'store = "etcd://10.0.0.11:2379"' > "$R/etc/jiocloud/agent.toml"
out=$(dpkg_i "$AGENT1") || fail "install failed: $out"
echo "$out" | has "not starting the service (start)" || fail "postinst did not plan a start with a provided configuration: $out"
grep -q 10.0.0.11 "$R/etc/jiocloud/agent.toml" || fail "the provided configuration was replaced"
in_root dpkg --purge jio-agent >/dev/null 2>&1 || fail "second purge failed"
echo "==> package tests passed"
