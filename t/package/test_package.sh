#!/usr/bin/env bash
# t/package/test_package.sh - the Debian package, built and installed for real.
#
# Builds the package with `dpkg-buildpackage -us -uc -b` from a clean copy
# of the committed tree (git archive HEAD), runs lintian on it (neither an
# error nor a warning), checks its contents, and
# drives its maintainer scripts in a throwaway Debian 12 root made by
# debootstrap: install, upgrade over the previous build with an operator's
# edit of the configuration, remove, purge. Checks after each step what an
# operator would: the idemflow user, the configuration's owner and mode,
# no service enabled or started, the edit kept, the programs gone, the
# configuration and logs gone after purge.
#
# Slow (a package build and a debootstrap: minutes), so not in `make
# check`: `scripts/test --package` runs it. Needs root (chroot), network
# access to the Debian mirror in /etc/apt/sources.list.d, and the packages
# `scripts/deps --package` installs. Set IDEMFLOW_PKG_ROOT to reuse a root
# made by an earlier run (it is copied, never changed).
# Prints "N passed, N failed" last.
set -euo pipefail

TOP=$(cd "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=$(mktemp -d /var/tmp/idemflow-package.XXXXXX)
PASS=0
FAIL=0
trap 'rm -rf -- "$WORK"' EXIT

ok() {
	PASS=$((PASS + 1))
	echo "ok: $*"
}
bad() {
	FAIL=$((FAIL + 1))
	echo "FAIL: $*" >&2
}
check() { # check DESCRIPTION CMD...
	local what=$1
	shift
	if "$@"; then ok "$what"; else bad "$what"; fi
}
step() {
	printf '==> %s\n' "$*" >&2
}

# ---------------------------------------------------------------- build
step "dpkg-buildpackage -us -uc -b (a clean copy of HEAD)"
mkdir -p "$WORK/build/src"
git -C "$TOP" archive HEAD | tar -x -C "$WORK/build/src"
if (cd "$WORK/build/src" && dpkg-buildpackage -us -uc -b) >"$WORK/build.log" 2>&1; then
	ok "dpkg-buildpackage builds the package from a clean tree"
else
	tail -n 30 "$WORK/build.log" >&2
	bad "dpkg-buildpackage failed"
	echo "$PASS passed, $FAIL failed"
	exit 1
fi
DEB=$(ls "$WORK"/build/idemflow_*_*.deb)
VERSION=$(dpkg-deb -f "$DEB" Version)

step "lintian"
lintian --fail-on none --tag-display-limit 0 "$WORK"/build/idemflow_*.changes \
	>"$WORK/lintian.txt" 2>&1 || true
cat "$WORK/lintian.txt" >&2
check "lintian reports no error" bash -c "! grep -q '^E: ' '$WORK/lintian.txt'"
check "lintian reports no warning" bash -c "! grep -q '^W: ' '$WORK/lintian.txt'"

step "contents"
dpkg-deb -c "$DEB" | awk '{ print $6 }' | sed 's|^\.||' | grep -v '/$' | sort >"$WORK/files"
for f in /usr/bin/idemflow /usr/bin/idemflow-dispatch /usr/sbin/idemflow-fcgi \
	/etc/idemflow/idemflow.conf /etc/idemflow/pg_service.conf /etc/cron.d/idemflow /etc/logrotate.d/idemflow \
	/etc/nginx/sites-available/idemflow /lib/systemd/system/idemflow-fcgi.service \
	/lib/systemd/system/idemflow-dispatch.service /lib/systemd/system/idemflow-dispatch.timer \
	/usr/lib/sysusers.d/idemflow.conf /usr/share/idemflow/sql/001_init.sql \
	/usr/share/idemflow/sql/roles.sql /usr/share/man/man8/idemflow-fcgi.8.gz \
	/usr/share/idemflow/prometheus/idemflow-rules.yml \
	/usr/share/idemflow/grafana/idemflow-dashboard.json \
	/usr/share/man/man5/idemflow.conf.5.gz /usr/share/doc/idemflow/copyright \
	/usr/share/doc/idemflow/README.Debian; do
	check "the package holds $f" grep -qxF "$f" "$WORK/files"
done
dpkg-deb -I "$DEB" conffiles >"$WORK/conffiles"
check "the configuration is a conffile" grep -qxF /etc/idemflow/idemflow.conf "$WORK/conffiles"
check "nothing is installed under /usr/local" bash -c "! grep -q '^/usr/local' '$WORK/files'"

# The previous build: the same files under a lower version, to upgrade from.
step "the previous build, as version ${VERSION}~prev"
dpkg-deb -R "$DEB" "$WORK/prev"
sed -i "s/^Version: .*/Version: ${VERSION}~prev/" "$WORK/prev/DEBIAN/control"
dpkg-deb --root-owner-group -b "$WORK/prev" "$WORK/idemflow_${VERSION}~prev.deb" >/dev/null
PREV=$WORK/idemflow_${VERSION}~prev.deb

# ---------------------------------------------------------------- a root
ROOT=$WORK/root
if [[ -n ${IDEMFLOW_PKG_ROOT:-} ]]; then
	step "copying the root in $IDEMFLOW_PKG_ROOT"
	cp -a "$IDEMFLOW_PKG_ROOT" "$ROOT"
else
	step "debootstrap --variant=minbase bookworm"
	mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
	debootstrap --variant=minbase bookworm "$ROOT" "${mirror:-http://deb.debian.org/debian}" \
		>"$WORK/debootstrap.log" 2>&1 || {
		tail -n 20 "$WORK/debootstrap.log" >&2
		bad "debootstrap failed"
		echo "$PASS passed, $FAIL failed"
		exit 1
	}
fi
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# No service starts inside the root, whatever a maintainer script asks.
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
chmod 755 "$ROOT/usr/sbin/policy-rc.d"
cp "$DEB" "$PREV" "$ROOT/tmp/"
in_root() {
	chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
		LC_ALL=C.UTF-8 "$@"
}
in_root apt-get update >"$WORK/apt.log" 2>&1 || { tail -n 20 "$WORK/apt.log" >&2; bad "apt-get update"; }

# ---------------------------------------------------------------- install
step "install the previous build"
if in_root apt-get install -y --no-install-recommends "/tmp/${PREV##*/}" >>"$WORK/apt.log" 2>&1; then
	ok "the package installs (with its dependencies)"
else
	tail -n 30 "$WORK/apt.log" >&2
	bad "apt-get install failed"
fi
check "the idemflow user exists" in_root getent passwd idemflow
check "the idemflow group exists" in_root getent group idemflow
check "the configuration is root:idemflow 0640" \
	bash -c "[[ \$(chroot '$ROOT' stat -c '%U:%G %a' /etc/idemflow/idemflow.conf) == 'root:idemflow 640' ]]"
check "the server unit is not enabled" \
	bash -c "! ls '$ROOT'/etc/systemd/system/*.wants/idemflow* 2>/dev/null | grep -q ."
check "the dispatcher's timer is not enabled" \
	bash -c "! ls '$ROOT'/etc/systemd/system/timers.target.wants/idemflow* 2>/dev/null | grep -q ."
check "the programs run" in_root idemflow-dispatch --version
# What cron would run as the idemflow user: nothing, while no database
# is named (grep's exit status 1 ends the && chain before the program).
line=$(grep -m 1 'idemflow-dispatch --config' "$ROOT/etc/cron.d/idemflow" | sed 's/^\([^ ]* *\)\{5\}idemflow *//')
check "an unconfigured installation's cron job runs nothing" \
	bash -c "! chroot '$ROOT' setpriv --reuid=idemflow --regid=idemflow --init-groups sh -c \"\$1\" 2>/dev/null" _ "$line"

# ---------------------------------------------------------------- upgrade
step "an operator's edit, then the upgrade to $VERSION"
echo "db = host=/run/postgresql dbname=idemflow user=idemflow" >>"$ROOT/etc/idemflow/idemflow.conf"
if in_root apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confold \
	"/tmp/${DEB##*/}" >>"$WORK/apt.log" 2>&1; then
	ok "the package upgrades over the previous build"
else
	tail -n 30 "$WORK/apt.log" >&2
	bad "the upgrade failed"
fi
check "the upgrade installed $VERSION" \
	bash -c "[[ \$(chroot '$ROOT' dpkg-query -W -f '\${Version}' idemflow) == '$VERSION' ]]"
check "the operator's edit survives the upgrade" \
	grep -qxF "db = host=/run/postgresql dbname=idemflow user=idemflow" "$ROOT/etc/idemflow/idemflow.conf"
check "the configuration is still root:idemflow 0640" \
	bash -c "[[ \$(chroot '$ROOT' stat -c '%U:%G %a' /etc/idemflow/idemflow.conf) == 'root:idemflow 640' ]]"

# ---------------------------------------------------------------- remove, purge
step "remove"
mkdir -p "$ROOT/var/log/idemflow"
echo "a line" >"$ROOT/var/log/idemflow/idemflow.log"
in_root apt-get remove -y idemflow >>"$WORK/apt.log" 2>&1 || bad "apt-get remove failed"
check "remove takes the programs" bash -c "[[ ! -e '$ROOT/usr/bin/idemflow-dispatch' ]]"
check "remove keeps the configuration" test -f "$ROOT/etc/idemflow/idemflow.conf"
check "a removed package's cron job runs nothing" \
	bash -c "! chroot '$ROOT' sh -c \"\$1\" 2>/dev/null" _ "$line"
step "purge"
in_root apt-get purge -y idemflow >>"$WORK/apt.log" 2>&1 || bad "apt-get purge failed"
check "purge takes the configuration" bash -c "[[ ! -e '$ROOT/etc/idemflow' ]]"
check "purge takes the cron file" bash -c "[[ ! -e '$ROOT/etc/cron.d/idemflow' ]]"
check "purge takes the logs" bash -c "[[ ! -e '$ROOT/var/log/idemflow' ]]"
check "dpkg forgets the package" bash -c "! chroot '$ROOT' dpkg-query -W idemflow >/dev/null 2>&1"

echo "$PASS passed, $FAIL failed"
((FAIL == 0))
