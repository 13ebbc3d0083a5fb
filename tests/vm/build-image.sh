#!/usr/bin/env bash
# Builds (or finds) the base disk image of the VM tests: a Debian bookworm root from
# debootstrap with systemd as init, udev, the packaged kernel and an initramfs made
# inside the root, cloud-init, ifupdown/dhclient and Puppet, plus the test-only files
# of tests/vm/guest/. No Debian mirror is left in the guest's apt sources: a guest
# reaches nothing but the test's loopback servers.
#
# The image is cached outside the repository, in ${JIO_VM_CACHE:-/var/cache/jiocloud-tests/vm}/base-<key>/,
# keyed by a hash of this script, packages.txt and guest/; it is built in a temporary
# directory and renamed into place, so an interrupted build is never used. Older
# images are removed once a new one is in place. Builds are serialised by a lock, so
# a background build (scripts/test.sh) and a test may both ask for it.
#
# Prints the image's directory (base.img, vmlinuz, initrd.img, packages.lst) as the
# last line of stdout. Usage: tests/vm/build-image.sh [--key]   (--key: print the key only)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${JIO_VM_CACHE:-/var/cache/jiocloud-tests/vm}

fail() { echo "build-image: $*" >&2; exit 1; }

key() {
  { cat "$HERE/build-image.sh" "$HERE/packages.txt"
    (cd "$HERE/guest" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
    (cd "$HERE/guest" && find . -type f -perm -u+x | sort)
  } | sha256sum | cut -c1-16
}
KEY=$(key)
if [ "${1:-}" = "--key" ]; then echo "$KEY"; exit 0; fi
OUT=$CACHE/base-$KEY

for tool in debootstrap:debootstrap mkfs.ext4:e2fsprogs chroot:coreutils flock:util-linux; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool%%:*}" ] \
    || fail "${tool%%:*} is missing: apt-get install -y ${tool#*:}"
done
[ "$(id -u)" -eq 0 ] || fail "debootstrap needs root"

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [ -f "$OUT/base.img" ]; then
  echo "==> cached VM image $OUT" >&2
  echo "$OUT"
  exit 0
fi

# What an interrupted build left (no build runs: we hold the lock).
rm -rf "$CACHE"/.build-*
START=$(date +%s)
TMP=$(mktemp -d "$CACHE/.build-$KEY.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
trap 'exit 143' TERM INT
ROOT=$TMP/root
MIRROR=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
PACKAGES=$(grep -v '^#' "$HERE/packages.txt" | grep . | paste -sd, -)
echo "==> debootstrap bookworm (minbase + $PACKAGES) into $ROOT" >&2
# The downloaded .debs are kept (debs/), so a change of the inputs rebuilds offline.
mkdir -p "$CACHE/debs"
debootstrap --cache-dir="$CACHE/debs" --variant=minbase --include="$PACKAGES" bookworm "$ROOT" "${MIRROR:-http://deb.debian.org/debian}" >"$TMP/debootstrap.log" 2>&1 \
  || { tail -n 30 "$TMP/debootstrap.log" "$ROOT/debootstrap/debootstrap.log" >&2; fail "debootstrap failed"; }
T_BOOTSTRAP=$(( $(date +%s) - START ))

in_root() { chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C "$@"; }

echo "==> configure the guest root" >&2
cp -a "$HERE/guest/." "$ROOT/"
# Nothing outside the test: no mirror (the test's repository comes from the seed).
: >"$ROOT/etc/apt/sources.list"
rm -f "$ROOT"/etc/apt/sources.list.d/*
echo "jio-vm" >"$ROOT/etc/hostname"
printf '127.0.0.1\tlocalhost\n' >"$ROOT/etc/hosts"
printf '/dev/vda\t/\text4\trw,errors=remount-ro\t0\t1\n' >"$ROOT/etc/fstab"
# cloud-init's first boot runs only when the machine is new (no machine id yet).
: >"$ROOT/etc/machine-id"
rm -f "$ROOT/var/lib/dbus/machine-id"
in_root systemctl enable jio-vm-marker.service jio-vm-egress.service >/dev/null 2>&1
# Less to do at boot under emulation: no timers, no login prompts.
in_root systemctl mask apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer \
  fstrim.timer e2scrub_reap.service getty@tty1.service serial-getty@ttyS0.service \
  getty-static.service puppet.service >/dev/null 2>&1
# A smaller kernel: no drivers a QEMU guest never loads.
KVER=$(basename "$(ls -d "$ROOT"/lib/modules/*)")
M=$ROOT/lib/modules/$KVER/kernel
rm -rf "$M/sound" "$M/drivers/gpu" "$M/drivers/media" "$M/drivers/net/wireless" "$M/drivers/infiniband" \
  "$M/drivers/staging" "$M/drivers/bluetooth" "$M/drivers/iio" "$M/drivers/isdn" "$M/drivers/usb" \
  "$M/drivers/hid" "$M/drivers/net/ethernet" "$M/drivers/scsi" "$M/drivers/md" "$M/drivers/nvme"
rm -rf "$M/net/wireless" "$M/net/mac80211" "$M/net/bluetooth" "$M/fs/btrfs" "$M/fs/xfs" "$M/fs/ocfs2" "$M/fs/gfs2"
in_root depmod "$KVER"
echo "==> initramfs for $KVER (made in the root)" >&2
in_root update-initramfs -u -k "$KVER" >"$TMP/initramfs.log" 2>&1 || { cat "$TMP/initramfs.log" >&2; fail "update-initramfs failed"; }
# shellcheck disable=SC2016 # dpkg-query expands these, not the shell
in_root dpkg-query -W -f='${Package} ${Version}\n' >"$TMP/packages.lst"
in_root apt-get clean
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/* \
  "$ROOT"/var/log/*.log "$ROOT"/var/cache/debconf/*-old
cp "$ROOT/boot/vmlinuz-$KVER" "$TMP/vmlinuz"
cp "$ROOT/boot/initrd.img-$KVER" "$TMP/initrd.img"

echo "==> ext4 image (mkfs.ext4 -d, nothing mounted)" >&2
USED=$(du -sm "$ROOT" | cut -f1)
# Room for what a guest installs and downloads; the file is sparse.
truncate -s "$(( USED + 1024 ))M" "$TMP/base.img"
mkfs.ext4 -q -F -L jio-root -J size=16 -d "$ROOT" "$TMP/base.img" || fail "mkfs.ext4 -d failed"
rm -rf "$ROOT"
END=$(date +%s)
printf 'key=%s\nused_mb=%s\ndebootstrap_s=%s\ntotal_s=%s\nkernel=%s\n' "$KEY" "$USED" "$T_BOOTSTRAP" "$(( END - START ))" "$KVER" >"$TMP/build.txt"
rm -f "$TMP/debootstrap.log" "$TMP/initramfs.log"
mv "$TMP" "$OUT"
trap - EXIT
for old in "$CACHE"/base-*; do
  [ "$old" = "$OUT" ] || rm -rf "$old"
done
echo "==> built VM image $OUT in $(( END - START )) s (debootstrap ${T_BOOTSTRAP} s, root ${USED} MB)" >&2
echo "$OUT"
