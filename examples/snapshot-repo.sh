#!/usr/bin/env bash
# The quick start's package snapshots (examples/local-fleet.sh): a signed apt
# repository with one snapshot per version, and a package root per host in which
# real apt-get and dpkg install its packages, as a normal user too, never touching
# this machine's own root (see docs/package-snapshots.md).
#
#   snapshot-repo.sh missing               prints the first program it needs that is
#                                          missing, with its Debian package; exits 1
#   snapshot-repo.sh build DIR FROM TO     DIR/www/snapshots/FROM holds jio-hello 1.0,
#                                          .../TO jio-hello 2.0, each signed (InRelease)
#                                          by a throwaway key whose public half is
#                                          DIR/keyring.gpg; the .debs stay in DIR/debs
#   snapshot-repo.sh serve DIR             serves DIR/www on 127.0.0.1, on a free port
#                                          (named in its first line of output)
#   snapshot-repo.sh root ROOT             makes ROOT a host's package root: ROOT/apt.conf
#                                          is the APT_CONFIG that keeps apt and dpkg in it
set -euo pipefail

usage() { echo "usage: $0 missing | build DIR FROM TO | serve DIR | root ROOT" >&2; exit 64; }

# The suite of every snapshot, and its one component.
SUITE=bookworm
COMPONENT=main

missing() {
  local need
  for need in dpkg-deb:dpkg apt-ftparchive:apt-utils apt-get:apt gpg:gpg python3:python3; do
    if ! command -v "${need%%:*}" >/dev/null 2>&1; then
      echo "${need%%:*} is not installed (Debian package ${need#*:})"
      return 1
    fi
  done
}

# jio-hello VERSION, architecture all, holding /usr/share/jio-hello/version.
package() {
  local debs=$1 version=$2 tree=$1/jio-hello_$2
  mkdir -p "$tree/DEBIAN" "$tree/usr/share/jio-hello"
  echo "$version" > "$tree/usr/share/jio-hello/version"
  cat > "$tree/DEBIAN/control" <<CONTROL
Package: jio-hello
Version: $version
Architecture: all
Maintainer: jio quick start <quick-start@jiocloud.invalid>
Priority: optional
Section: misc
Description: the quick start's package, one version per snapshot
CONTROL
  dpkg-deb --root-owner-group --build "$tree" "$debs/jio-hello_${version}_all.deb" >/dev/null
  rm -rf "$tree"
}

# Snapshot NAME holding DEB: pool/, Packages, a Release naming its suite, component
# and architectures, and InRelease clearsigned by the key of $GNUPGHOME.
snapshot() {
  local www=$1 name=$2 deb=$3 dir
  dir=$www/snapshots/$name
  mkdir -p "$dir/pool" "$dir/dists/$SUITE/$COMPONENT/binary-all"
  cp "$deb" "$dir/pool/"
  (
    cd "$dir"
    apt-ftparchive packages pool > "dists/$SUITE/$COMPONENT/binary-all/Packages"
    gzip -9nk "dists/$SUITE/$COMPONENT/binary-all/Packages"
    apt-ftparchive \
      -o APT::FTPArchive::Release::Origin=jio-quick-start \
      -o APT::FTPArchive::Release::Label=jio-quick-start \
      -o "APT::FTPArchive::Release::Suite=$SUITE" \
      -o "APT::FTPArchive::Release::Codename=$SUITE" \
      -o "APT::FTPArchive::Release::Components=$COMPONENT" \
      -o "APT::FTPArchive::Release::Architectures=$(dpkg --print-architecture) all" \
      -o "APT::FTPArchive::Release::Description=jio quick start snapshot $name" \
      release "dists/$SUITE" > "$dir/Release"
    mv "$dir/Release" "dists/$SUITE/Release"
    gpg --batch --quiet --yes --clearsign -o "dists/$SUITE/InRelease" "dists/$SUITE/Release"
  )
}

build() {
  local dir=$1 from=$2 to=$3
  mkdir -p "$dir/debs" "$dir/www"
  export GNUPGHOME=$dir/gnupg
  mkdir -m 700 "$GNUPGHOME"
  # gpg starts an agent for this GNUPGHOME: it must not outlive the build.
  # shellcheck disable=SC2317 # run by the EXIT trap
  stop_agent() { gpgconf --kill gpg-agent >/dev/null 2>&1 || true; }
  trap stop_agent EXIT
  gpg --batch --quiet --passphrase '' \
    --quick-gen-key "jio quick start <quick-start@jiocloud.invalid>" ed25519 sign never 2>/dev/null
  gpg --batch --export > "$dir/keyring.gpg"
  package "$dir/debs" 1.0
  package "$dir/debs" 2.0
  snapshot "$dir/www" "$from" "$dir/debs/jio-hello_1.0_all.deb"
  snapshot "$dir/www" "$to" "$dir/debs/jio-hello_2.0_all.deb"
}

serve() {
  # Port 0: the kernel picks a free one, which the server prints first (-u: at once).
  exec python3 -u -m http.server --bind 127.0.0.1 --directory "$1/www" 0
}

# A host's package root: dpkg's database, apt's directories, and an apt.conf to give
# apt-get as APT_CONFIG. Why each setting:
# - Dir: apt's etc/apt (sources, preferences, keyrings, apt.conf.d), its lists, cache
#   and logs are the root's. Read through APT_CONFIG, before any apt.conf.d, it also
#   makes apt read the root's apt.conf.d instead of this machine's: no sources,
#   proxies or dpkg hooks of the machine apply, and apt fetches only from the
#   sources in the root, here the loopback snapshot;
# - Dir::State::status: dpkg's status file is an absolute path, outside Dir;
# - DPkg::Options: apt runs /usr/bin/dpkg, which unpacks into the root (--root) and
#   keeps its database (--admindir) and log (--log) there; --force-not-root lets a
#   normal user run it (files keep that user as owner), --force-bad-path lets it run
#   without /usr/sbin and /sbin (ldconfig, start-stop-daemon) in a user's PATH;
# - APT::Sandbox::User: apt downloads as this user, not as _apt (which, as root,
#   could not enter the private work directory).
root() {
  local r=$1 d
  for d in etc/apt/apt.conf.d etc/apt/sources.list.d etc/apt/preferences.d \
    var/lib/apt/lists/partial var/cache/apt/archives/partial var/log/apt \
    var/lib/dpkg/info var/lib/dpkg/updates var/lib/dpkg/triggers; do
    mkdir -p "$r/$d"
  done
  : > "$r/var/lib/dpkg/status"
  cat > "$r/apt.conf" <<CONF
// apt and dpkg in the package root $r, never in this machine's own root.
Dir "$r/";
Dir::State::status "$r/var/lib/dpkg/status";
DPkg::Options { "--root=$r"; "--admindir=$r/var/lib/dpkg"; "--log=$r/var/log/dpkg.log"; "--force-not-root"; "--force-bad-path"; };
APT::Sandbox::User "$(id -un)";
CONF
}

[ $# -ge 1 ] || usage
case $1 in
  missing) [ $# -eq 1 ] || usage; missing ;;
  build) [ $# -eq 4 ] || usage; build "$2" "$3" "$4" ;;
  serve) [ $# -eq 2 ] || usage; serve "$2" ;;
  root) [ $# -eq 2 ] || usage; root "$2" ;;
  *) usage ;;
esac
