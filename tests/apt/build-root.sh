#!/usr/bin/env bash
# Builds (or finds) the Debian root of the apt snapshot tests (tests/src/apt.rs): a
# bookworm minbase from debootstrap (apt, dpkg and gpgv are part of it), with no Debian
# mirror left in its apt sources, so a test's host sees nothing but the test's
# repository on loopback. Each test copies it into its own throwaway directory.
#
# Cached outside the repository, in ${JIO_APT_CACHE:-/var/cache/jiocloud-tests/apt}/root-<key>/,
# keyed by a hash of this script; built in a temporary directory and renamed into
# place with a .complete marker, so an interrupted build is never used. Builds are
# serialised by a lock: scripts/test.sh starts one in the background and the tests
# wait for it. Older roots are removed once a new one is in place.
#
# Prints the root's directory as the last line of stdout, progress on stderr.
# Usage: tests/apt/build-root.sh [--key]   (--key: print the key only)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${JIO_APT_CACHE:-/var/cache/jiocloud-tests/apt}

fail() { echo "build-root: $*" >&2; exit 1; }

KEY=$(sha256sum <"$HERE/build-root.sh" | cut -c1-16)
if [ "${1:-}" = "--key" ]; then echo "$KEY"; exit 0; fi
OUT=$CACHE/root-$KEY

for tool in debootstrap:debootstrap chroot:coreutils flock:util-linux; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool%%:*}" ] \
    || fail "${tool%%:*} is missing: apt-get install -y ${tool#*:}"
done
[ "$(id -u)" -eq 0 ] || fail "debootstrap and chroot need root"

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [ -f "$OUT/.complete" ]; then
  echo "==> cached apt test root $OUT" >&2
  echo "$OUT"
  exit 0
fi

# What an interrupted build left (no build runs: we hold the lock).
rm -rf "$CACHE"/.build-* "$OUT"
START=$(date +%s)
TMP=$(mktemp -d "$CACHE/.build-$KEY.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
trap 'exit 143' TERM INT
ROOT=$TMP/root
MIRROR=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
echo "==> debootstrap bookworm (minbase) into $ROOT" >&2
# The downloaded .debs are kept (debs/), so a change of this script rebuilds offline.
mkdir -p "$CACHE/debs"
debootstrap --cache-dir="$CACHE/debs" --variant=minbase bookworm "$ROOT" "${MIRROR:-http://deb.debian.org/debian}" >"$TMP/debootstrap.log" 2>&1 \
  || { tail -n 30 "$TMP/debootstrap.log" "$ROOT/debootstrap/debootstrap.log" >&2; fail "debootstrap failed"; }

echo "==> no mirror in the root's apt sources, no downloaded lists or debs" >&2
: >"$ROOT/etc/apt/sources.list"
rm -f "$ROOT"/etc/apt/sources.list.d/*
chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C apt-get clean
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/* \
  "$ROOT"/var/log/*.log "$ROOT"/var/cache/debconf/*-old
mkdir -p "$ROOT/var/lib/apt/lists/partial"
# Nothing is mounted in the copies (no /proc, no /dev/pts): dpkg's log through a
# pseudo-terminal would print "E: Can not write log (Is /dev/pts mounted?)" after
# every successful install, a line a real host never shows.
# No binary package cache: apt trusts it while the dpkg status file keeps its size
# and mtime (in seconds), so a test's `dpkg -i` of 3.0 over 1.0 in the same second
# as an apt run went unseen by the next apt run. The lists are tiny; apt rebuilds
# its cache in memory each time.
cat >"$ROOT/etc/apt/apt.conf.d/90jio-test" <<'CONF'
Dpkg::Use-Pty "false";
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CONF
rm -f "$TMP/debootstrap.log"
touch "$ROOT/.complete"
mv "$ROOT" "$OUT"
for old in "$CACHE"/root-*; do
  [ "$old" = "$OUT" ] || rm -rf "$old"
done
END=$(date +%s)
echo "==> built apt test root $OUT in $(( END - START )) s ($(du -sm "$OUT" | cut -f1) MB)" >&2
echo "$OUT"
