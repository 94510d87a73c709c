#!/usr/bin/env bash
# t/package/test_package.sh - the Debian package, built and installed for real.
#
# Builds the packages with `dpkg-buildpackage -us -uc -b` from a clean copy
# of the committed tree (git archive HEAD), runs lintian on them (exit status
# 0 with --fail-on error,warning: neither an error nor a warning, and
# lintian itself ran), checks its contents, and
# drives its maintainer scripts in a throwaway Debian 12 root made by
# debootstrap: install, upgrade over the previous build with an operator's
# edit of the configuration, remove, purge. The previous build ships other
# conffiles than this one, so the upgrade goes through dpkg's conffile
# logic: the edited idemflow.conf is kept (the new one beside it as
# .dpkg-dist), the unedited pg_service.conf is replaced. Checks after each
# step what an operator would: the idemflow user, the configuration's owner
# and mode, no service enabled or started, each cron job starting its
# program only once the configuration names a database (idemflow.conf's
# db, or pg_service.conf alone) and the program is installed, the edit
# kept, the API through Debian's nginx on port 80, the programs gone, the
# configuration and logs gone after purge. The consumer inbox's packages
# (libidemflow-inbox1, libidemflow-inbox-dev, idemflow-inbox) are installed
# into the same root with a compiler, and a program built with
# `pkg-config --cflags --libs idemflow-inbox` links against the installed
# library and runs. debian/tests (autopkgtest) runs in the root too, and
# the packaged logrotate file rotates the running server's log as the
# idemflow user and makes it reopen the file (no systemd: through the pid
# file its configuration names). lintian's overrides live in
# debian/*.lintian-overrides only, each with its reason, each still used.
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
# Its exit status is the verdict: 1 for an error or a warning, 2 when
# lintian itself could not run (then its output has no tag to grep for).
# A tag lintian should not report is overridden in debian/*.lintian-overrides
# (lintian then reports it no more), never filtered here; the overrides
# are shown (O:) and the informational tags too, for the two that say an
# override matched nothing.
lintian_rc=0
lintian --fail-on error,warning --tag-display-limit 0 --display-info --show-overrides \
	"$WORK"/build/idemflow_*.changes >"$WORK/lintian.txt" 2>&1 || lintian_rc=$?
grep -Ev '^(I|P|X): ' "$WORK/lintian.txt" >&2 || :
check "lintian exits 0 (status $lintian_rc)" test "$lintian_rc" -eq 0
check "lintian reports no error" bash -c "! grep -q '^E: ' '$WORK/lintian.txt'"
check "lintian reports no warning" bash -c "! grep -q '^W: ' '$WORK/lintian.txt'"
check "every lintian override still matches a tag" \
	bash -c "! grep -E '(unused|mismatched)-override' '$WORK/lintian.txt'"
# Each override says why, on a comment line just above it.
for f in "$TOP"/debian/*.lintian-overrides; do
	[[ -e $f ]] || continue
	# shellcheck disable=SC2016 # awk's $0
	check "every override of ${f##*/} has its reason above it" \
		awk '/^[^#[:space:]]/ && prev !~ /^#/ { bad = 1 } { prev = $0 } END { exit bad }' "$f"
done

step "contents"
dpkg-deb -c "$DEB" | awk '{ print $6 }' | sed 's|^\.||' | grep -v '/$' | sort >"$WORK/files"
for f in /usr/bin/idemflow /usr/bin/idemflow-dispatch /usr/sbin/idemflow-fcgi \
	/etc/idemflow/idemflow.conf /etc/idemflow/pg_service.conf /etc/cron.d/idemflow /etc/logrotate.d/idemflow \
	/etc/nginx/sites-available/idemflow /lib/systemd/system/idemflow-fcgi.service \
	/lib/systemd/system/idemflow-dispatch.service /lib/systemd/system/idemflow-dispatch.timer \
	/lib/systemd/system/idemflow-fcgi.socket /lib/systemd/system/idemflow-dispatch-loop.service \
	/lib/systemd/system/idemflow-reap.service /usr/share/doc/idemflow/runbooks.md \
	/usr/lib/sysusers.d/idemflow.conf /usr/share/idemflow/sql/001_init.sql \
	/usr/share/idemflow/sql/roles.sql /usr/share/man/man8/idemflow-fcgi.8.gz \
	/usr/share/idemflow/prometheus/idemflow-rules.yml \
	/usr/share/idemflow/grafana/idemflow-dashboard.json \
	/usr/share/man/man5/idemflow.conf.5.gz /usr/share/doc/idemflow/copyright; do
	check "the package holds $f" grep -qxF "$f" "$WORK/files"
done
# dh_compress compresses a document past 4 KiB, as README.Debian now is.
check "the package holds /usr/share/doc/idemflow/README.Debian (or .gz)" \
	grep -qxE '/usr/share/doc/idemflow/README\.Debian(\.gz)?' "$WORK/files"
dpkg-deb -I "$DEB" conffiles >"$WORK/conffiles"
check "the configuration is a conffile" grep -qxF /etc/idemflow/idemflow.conf "$WORK/conffiles"
check "nothing is installed under /usr/local" bash -c "! grep -q '^/usr/local' '$WORK/files'"
check "the service's package holds nothing of the consumer inbox" \
	bash -c "! grep -Eq 'inbox|^/usr/include|\\.so(\\.[0-9]+)*\$' '$WORK/files'"

# The consumer inbox: the library, its development files, its SQL and Python.
MA=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
LIB_DEB=$(ls "$WORK"/build/libidemflow-inbox1_*.deb)
DEV_DEB=$(ls "$WORK"/build/libidemflow-inbox-dev_*.deb)
SQL_DEB=$(ls "$WORK"/build/idemflow-inbox_*_all.deb)
contents() { dpkg-deb -c "$1" | awk '{ print $6 }' | sed 's|^\.||' | grep -v '/$' | sort; }
contents "$LIB_DEB" >"$WORK/lib.files"
contents "$DEV_DEB" >"$WORK/dev.files"
contents "$SQL_DEB" >"$WORK/sql.files"
for f in /usr/lib/$MA/libidemflow-inbox.so.1.0.0 /usr/lib/$MA/libidemflow-inbox.so.1; do
	check "libidemflow-inbox1 holds $f" grep -qxF "$f" "$WORK/lib.files"
done
for f in /usr/include/idemflow/inbox.h /usr/lib/$MA/libidemflow-inbox.so \
	/usr/lib/$MA/pkgconfig/idemflow-inbox.pc /usr/share/man/man3/libidemflow-inbox.3.gz; do
	check "libidemflow-inbox-dev holds $f" grep -qxF "$f" "$WORK/dev.files"
done
for f in /usr/share/idemflow/consumer/inbox.sql /usr/share/idemflow/consumer/idemflow_inbox.py; do
	check "idemflow-inbox holds $f" grep -qxF "$f" "$WORK/sql.files"
done
check "no libtool archive is shipped" bash -c "! cat '$WORK/lib.files' '$WORK/dev.files' | grep -q '\\.la$'"
check "libidemflow-inbox1 has a shlibs entry for its soname" \
	bash -c "dpkg-deb -I '$LIB_DEB' shlibs | grep -qE '^libidemflow-inbox 1 libidemflow-inbox1 \\(>= [0-9.]+\\)$'"

# The previous build, to upgrade from: the same files under a lower
# version, but with two conffiles that differ from this build's, as a
# release that changed its shipped configuration. Only then does dpkg's
# conffile logic decide anything: an unchanged conffile is left alone
# whatever the operator did to it.
step "the previous build, as version ${VERSION}~prev"
dpkg-deb -R "$DEB" "$WORK/prev"
sed -i "s/^Version: .*/Version: ${VERSION}~prev/" "$WORK/prev/DEBIAN/control"
# (dh_md5sums lists no conffile: dpkg takes their sums at unpack.)
for f in etc/idemflow/idemflow.conf etc/idemflow/pg_service.conf; do
	echo "# as shipped by ${VERSION}~prev" >>"$WORK/prev/$f"
done
dpkg-deb --root-owner-group -b "$WORK/prev" "$WORK/idemflow_${VERSION}~prev.deb" >/dev/null
PREV=$WORK/idemflow_${VERSION}~prev.deb
for f in /etc/idemflow/idemflow.conf /etc/idemflow/pg_service.conf; do
	dpkg-deb --fsys-tarfile "$DEB" | tar -xO ".$f" >"$WORK/new.${f##*/}"
	dpkg-deb --fsys-tarfile "$PREV" | tar -xO ".$f" >"$WORK/prev.${f##*/}"
	check "the previous build ships another $f" \
		bash -c "! cmp -s '$WORK/new.${f##*/}' '$WORK/prev.${f##*/}'"
done

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

# debian/tests (autopkgtest), run here as autopkgtest runs them on a
# testbed: each with its Depends installed, AUTOPKGTEST_TMP set.
cp -r "$WORK/build/src/debian/tests" "$ROOT/tmp/autopkgtest"
autopkgtest_run() { # autopkgtest_run NAME
	local rc=0
	mkdir -p "$ROOT/tmp/autopkgtest-$1"
	in_root env AUTOPKGTEST_TMP="/tmp/autopkgtest-$1" "/tmp/autopkgtest/$1" \
		>"$WORK/autopkgtest-$1.out" 2>&1 || rc=$?
	grep -v '^ok: ' "$WORK/autopkgtest-$1.out" >&2 || :
	check "debian/tests/$1 passes (status $rc: $(tail -n 1 "$WORK/autopkgtest-$1.out"))" test "$rc" -eq 0
}
in_root apt-get install -y --no-install-recommends logrotate >>"$WORK/apt.log" 2>&1 ||
	bad "apt-get install logrotate failed"
autopkgtest_run installed

# The cron jobs, as cron runs them: each line's command, as the idemflow
# user, in the file's environment. A program that fails (no database to
# reach) must not count as "ran nothing": for these checks the programs
# are stand-ins that record that they started.
mapfile -t jobs < <(grep -E '^[0-9*]' "$ROOT/etc/cron.d/idemflow" | sed 's/^\([^ ]* *\)\{5\}idemflow *//')
check "the cron file has 3 jobs (${#jobs[@]})" test "${#jobs[@]}" -eq 3
PROGRAMS=(/usr/bin/idemflow /usr/bin/idemflow-dispatch)
stand_ins() { # stand_ins on|off
	local p
	for p in "${PROGRAMS[@]}"; do
		if [[ $1 == on ]]; then
			mv "$ROOT$p" "$ROOT$p.real"
			# The guard (-t) is the real program's; a run is recorded.
			# shellcheck disable=SC2016 # expanded by the stand-in
			printf '#!/bin/sh\ncase " $* " in *" -t "*) exec %s.real "$@" ;; esac\necho "$0 $*" >>/tmp/cron-ran\n' \
				"$p" >"$ROOT$p"
			chmod 755 "$ROOT$p"
		else
			mv "$ROOT$p.real" "$ROOT$p"
		fi
	done
	rm -f "$ROOT/tmp/cron-ran"
}
# cron_job N: run job N; its exit status in $job_rc, its stderr in
# $WORK/job.err, what it started in $WORK/job.ran.
cron_job() {
	job_rc=0
	chroot "$ROOT" setpriv --reuid=idemflow --regid=idemflow --init-groups \
		env -i SHELL=/bin/sh PATH=/usr/bin:/bin PGSERVICEFILE=/etc/idemflow/pg_service.conf \
		HOME=/ sh -c "${jobs[$1]}" >/dev/null 2>"$WORK/job.err" </dev/null || job_rc=$?
	cat "$ROOT/tmp/cron-ran" >"$WORK/job.ran" 2>/dev/null || : >"$WORK/job.ran"
	rm -f "$ROOT/tmp/cron-ran"
}
# A job that runs nothing exits with its guard's status and says
# nothing: 78 from the program's "-t -q" while no database is named, 1
# from "[ -x ]" once the program is gone. "not found" (127) is cron
# mailing an error every minute.
expect_nothing_ran() { # expect_nothing_ran WHEN STATUS
	local i
	for i in "${!jobs[@]}"; do
		cron_job "$i"
		check "$1, cron job $((i + 1)) starts no program ($(wc -l <"$WORK/job.ran") started)" \
			test ! -s "$WORK/job.ran"
		check "$1, cron job $((i + 1)) exits $2 silently (status $job_rc, $(wc -c <"$WORK/job.err") bytes on stderr)" \
			bash -c "[[ $job_rc == $2 && ! -s '$WORK/job.err' ]]"
	done
}
# expect_each_ran WHEN: every job started its program.
expect_each_ran() {
	local i want
	for i in "${!jobs[@]}"; do
		cron_job "$i"
		want=$(grep -o '/usr/bin/idemflow[a-z-]*' <<<"${jobs[$i]}" | tail -n 1)
		check "$1, cron job $((i + 1)) starts $want" grep -q "^$want .*--config" "$WORK/job.ran"
	done
}
stand_ins on
expect_nothing_ran "unconfigured" 78
# Configured through pg_service.conf alone (idemflow.conf names no
# database): the jobs' services name it, and each job runs. Then the
# file goes back as shipped, byte for byte.
cp "$ROOT/etc/idemflow/pg_service.conf" "$WORK/pg_service.shipped"
sed -i 's/^#dbname=idemflow$/dbname=idemflow/' "$ROOT/etc/idemflow/pg_service.conf"
expect_each_ran "configured by pg_service.conf alone"
cp "$WORK/pg_service.shipped" "$ROOT/etc/idemflow/pg_service.conf"
stand_ins off

# ---------------------------------------------------------------- upgrade
step "an operator's edit, then the upgrade to $VERSION"
echo "db = host=/run/postgresql dbname=idemflow user=idemflow" >>"$ROOT/etc/idemflow/idemflow.conf"
cp "$ROOT/etc/idemflow/idemflow.conf" "$WORK/edited.conf"
# Configured, each job starts its program: the guard opens.
stand_ins on
expect_each_ran "configured"
stand_ins off
if in_root apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confold \
	"/tmp/${DEB##*/}" >>"$WORK/apt.log" 2>&1; then
	ok "the package upgrades over the previous build"
else
	tail -n 30 "$WORK/apt.log" >&2
	bad "the upgrade failed"
fi
check "the upgrade installed $VERSION" \
	bash -c "[[ \$(chroot '$ROOT' dpkg-query -W -f '\${Version}' idemflow) == '$VERSION' ]]"
check "the operator's edited configuration survives the upgrade byte for byte" \
	cmp "$WORK/edited.conf" "$ROOT/etc/idemflow/idemflow.conf"
check "the new release's configuration is beside it as idemflow.conf.dpkg-dist" \
	cmp "$WORK/new.idemflow.conf" "$ROOT/etc/idemflow/idemflow.conf.dpkg-dist"
check "the unedited pg_service.conf is the new release's" \
	cmp "$WORK/new.pg_service.conf" "$ROOT/etc/idemflow/pg_service.conf"
check "the configuration is still root:idemflow 0640" \
	bash -c "[[ \$(chroot '$ROOT' stat -c '%U:%G %a' /etc/idemflow/idemflow.conf) == 'root:idemflow 640' ]]"

# ---------------------------------------------------------------- the server through nginx
# The installed package as an operator runs it, on a stock Debian 12 root:
# PostgreSQL and nginx from Debian, nginx's "default" site left enabled
# (it holds default_server on port 80), the packaged site linked beside it
# as README.Debian says, idemflow-fcgi as the idemflow user. Everything
# runs in network and mount namespaces of its own (port 80 and a /proc for
# the root), held open by one process; in_ns runs a command inside.
NSPID=''
SERVER_PID=''
ns_start() {
	unshare --net --mount --propagation private --fork sleep infinity &
	NSPID=
	local i
	for i in $(seq 50); do
		NSPID=$(pgrep -P $! -x sleep || :)
		[[ -n $NSPID ]] && break
		sleep 0.1
	done
	NSPID_HOLDER=$!
	nsenter -t "$NSPID" -n ip link set lo up
	nsenter -t "$NSPID" -m mount -t proc proc "$ROOT/proc"
}
in_ns() {
	nsenter -t "$NSPID" -n -m chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
		DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"
}
server_pid() {
	local p pp
	for p in $(pgrep -x idemflow-fcgi); do
		[[ $(readlink "/proc/$p/root" 2>/dev/null) == "$ROOT" ]] || continue
		pp=$(ps -o ppid= -p "$p" | tr -d ' ')
		if [[ $(ps -o comm= -p "$pp" 2>/dev/null) != idemflow-fcgi ]]; then
			echo "$p"
			return
		fi
	done
}
ns_stop() {
	[[ -n $NSPID ]] || return 0
	local i p left=''
	if [[ -n $SERVER_PID ]]; then
		kill -TERM "$SERVER_PID" 2>/dev/null || :
		for i in $(seq 100); do
			kill -0 "$SERVER_PID" 2>/dev/null || break
			sleep 0.1
		done
		SERVER_PID=
	fi
	# shellcheck disable=SC2016 # expanded in the root
	in_ns sh -c 'nginx -s stop; sleep 1
		for v in /etc/postgresql/*/main; do v=${v#/etc/postgresql/}; v=${v%/main}
			su postgres -s /bin/sh -c "pg_ctlcluster $v main stop -m fast"; done' \
		>/dev/null 2>&1 || :
	# Whatever still runs in the root is stopped by its root directory.
	for p in /proc/[0-9]*; do
		[[ $(readlink "$p/root" 2>/dev/null) == "$ROOT" ]] && left+=" ${p#/proc/}"
	done
	# shellcheck disable=SC2086 # a list of pids
	[[ -z $left ]] || kill -KILL $left 2>/dev/null || :
	kill "$NSPID_HOLDER" "$NSPID" 2>/dev/null || :
	wait "$NSPID_HOLDER" 2>/dev/null || :
	NSPID=
}
trap 'ns_stop; rm -rf -- "$WORK"' EXIT

# http_req NAME CURL-ARGS...: one request through port 80, as a client on
# this host; the status in $WORK/NAME.status, the headers and body beside.
http_req() {
	local name=$1
	shift
	in_ns curl -sS -o "/tmp/$name.body" -D "/tmp/$name.headers" -w '%{http_code}' \
		--max-time 30 "$@" >"$WORK/$name.status" 2>"$WORK/$name.err" || :
	cp "$ROOT/tmp/$name.body" "$WORK/$name.body" 2>/dev/null || : >"$WORK/$name.body"
	tr -d '\r' <"$ROOT/tmp/$name.headers" >"$WORK/$name.headers" 2>/dev/null ||
		: >"$WORK/$name.headers"
}
status_is() { # status_is NAME CODE
	[[ $(cat "$WORK/$1.status") == "$2" ]]
}

server_through_nginx() {
	step "the server behind Debian's nginx, its default site left enabled"
	if ! in_root apt-get install -y --no-install-recommends nginx postgresql curl logrotate \
		>>"$WORK/apt.log" 2>&1; then
		tail -n 30 "$WORK/apt.log" >&2
		bad "apt-get install nginx postgresql curl logrotate failed"
		return
	fi
	check "Debian's default site is enabled" test -L "$ROOT/etc/nginx/sites-enabled/default"
	check "the default site holds default_server on port 80" \
		grep -q '^[[:space:]]*listen 80 default_server;' "$ROOT/etc/nginx/sites-available/default"
	local pgconf
	pgconf=$(ls -d "$ROOT"/etc/postgresql/*/main)
	# Unix socket only (no port taken on this machine); the test root's
	# own roles may log in without a password.
	echo "listen_addresses = ''" >>"$pgconf/postgresql.conf"
	sed -i '1i local all all trust' "$pgconf/pg_hba.conf"
	local pgver=${pgconf%/main}
	pgver=${pgver##*/}
	ns_start
	in_ns sh -c 'mkdir -p /run/postgresql && chown postgres:postgres /run/postgresql' || :
	check "PostgreSQL $pgver starts in the root" \
		in_ns su postgres -s /bin/sh -c "pg_ctlcluster $pgver main start"
	in_ns su postgres -s /bin/sh -c \
		"psql -qX -v ON_ERROR_STOP=1 -c 'CREATE ROLE idemflow LOGIN' &&
		 createdb -O idemflow idemflow" >>"$WORK/server.log" 2>&1 || bad "creating the database"
	check "idemflow migrate, as README.Debian says" \
		in_ns runuser -u idemflow -- idemflow --config /etc/idemflow/idemflow.conf migrate
	in_ns runuser -u idemflow -- idemflow --config /etc/idemflow/idemflow.conf tenant create pkg \
		>/dev/null 2>>"$WORK/server.log" || bad "tenant create pkg"
	local token
	token=$(in_ns runuser -u idemflow -- idemflow --config /etc/idemflow/idemflow.conf \
		token create --tenant pkg 2>>"$WORK/server.log") || bad "token create"
	# The log in a file, as logrotate's file expects it, in the directory
	# the unit's LogsDirectory= makes; no systemd here, so the server
	# writes the pid file logrotate then signals.
	install -d -o "$(chroot "$ROOT" id -u idemflow)" -g "$(chroot "$ROOT" id -g idemflow)" \
		-m 0755 "$ROOT/var/log/idemflow"
	printf '%s\n' 'log_file = /var/log/idemflow/idemflow.log' \
		'pid_file = /tmp/idemflow-fcgi.pid' >>"$ROOT/etc/idemflow/idemflow.conf"
	server_start
	ln -s ../sites-available/idemflow "$ROOT/etc/nginx/sites-enabled/idemflow"
	check "nginx -t accepts the packaged site beside the default one" in_ns nginx -t -q
	check "nginx starts" in_ns nginx

	local body='{"type":"order-flow","input":{"order":1}}'
	local args=(-H 'Host: idemflow' -H "Authorization: Bearer $token"
		-H 'Content-Type: application/json' -H 'Idempotency-Key: pkg-order-1' -d "$body"
		http://127.0.0.1/v1/workflows)
	http_req create "${args[@]}"
	check "a keyed create through port 80 is 201 ($(cat "$WORK/create.status"))" status_is create 201
	check "its answer is idemflow's JSON" grep -qi '^content-type: application/json' "$WORK/create.headers"
	http_req replay "${args[@]}"
	check "its replay is 201 ($(cat "$WORK/replay.status"))" status_is replay 201
	check "the replay is byte for byte the first answer" cmp "$WORK/create.body" "$WORK/replay.body"
	check "the replay says Idempotent-Replayed: true" \
		grep -qix 'idempotent-replayed: true' "$WORK/replay.headers"
	check "the create made one workflow" bash -c "[[ \$(chroot '$ROOT' su postgres -s /bin/sh \
		-c \"psql -AtqX -d idemflow -c 'SELECT count(*) FROM workflows'\") == 1 ]]"
	# Any other name still gets Debian's default site.
	http_req other -H 'Host: www.example.org' http://127.0.0.1/
	check "another host name gets the default site's welcome page ($(cat "$WORK/other.status"))" \
		bash -c "[[ \$(cat '$WORK/other.status') == 200 ]] && grep -q 'Welcome to nginx' '$WORK/other.body'"
	server_checks
	logrotate_checks
	ns_stop
	if ((FAIL > 0)); then
		tail -n 30 "$WORK/server.log" "$ROOT"/var/log/idemflow/idemflow.log* >&2 || :
		tail -n 30 "$ROOT/var/log/nginx/idemflow.error.log" >&2 || :
	fi
	rm -f "$ROOT/etc/nginx/sites-enabled/idemflow"
}

# Start idemflow-fcgi in the root the way the packaged units do, without
# systemd: what idemflow-fcgi.socket says (the socket idemflow:www-data
# 0660, passed as descriptor 3 with LISTEN_FDS and LISTEN_PID), then the
# service's command as the idemflow user. Perl (perl-base) plays systemd.
server_start() {
	local unit=$ROOT/lib/systemd/system/idemflow-fcgi.socket
	local path user group mode
	path=$(sed -n 's/^ListenStream=//p' "$unit" 2>/dev/null || :)
	user=$(sed -n 's/^SocketUser=//p' "$unit" 2>/dev/null || :)
	group=$(sed -n 's/^SocketGroup=//p' "$unit" 2>/dev/null || :)
	mode=$(sed -n 's/^SocketMode=//p' "$unit" 2>/dev/null || :)
	check "idemflow-fcgi.socket: $path, $user:$group $mode" \
		test "$path $user:$group $mode" == "/run/idemflow/idemflow.sock idemflow:www-data 0660"
	cat >"$ROOT/tmp/socket-unit.pl" <<'PERL'
use strict;
use Socket;
use POSIX ();
my ($path, $user, $group, $mode, @cmd) = @ARGV;
mkdir "/run/idemflow", 0755;
unlink $path;
# Descriptors up to 3 survive exec: the socket may well be 3 already,
# where dup2 below changes nothing.
$^F = 3;
socket(my $s, PF_UNIX, SOCK_STREAM, 0) or die "socket: $!";
bind($s, pack_sockaddr_un($path)) or die "bind: $!";
listen($s, 1024) or die "listen: $!";
chown scalar(getpwnam($user)), scalar(getgrnam($group)), $path or die "chown: $!";
chmod oct($mode), $path or die "chmod: $!";
POSIX::dup2(fileno($s), 3) == 3 or die "dup2: $!";
$ENV{LISTEN_FDS} = 1;
$ENV{LISTEN_PID} = $$;
exec @cmd or die "exec: $!";
PERL
	in_ns setsid perl /tmp/socket-unit.pl "$path" "$user" "$group" "$mode" \
		setpriv --reuid=idemflow --regid=idemflow --init-groups \
		idemflow-fcgi --config /etc/idemflow/idemflow.conf --workers 2 \
		>>"$WORK/server.log" 2>&1 </dev/null &
	# $! names the subshell that runs in_ns, not the server: found by its
	# root and name, the idemflow-fcgi whose parent is not one.
	local i
	for i in $(seq 100); do
		SERVER_PID=$(server_pid)
		[[ -n $SERVER_PID ]] && grep -q 'msg="worker started"' \
			"$ROOT/var/log/idemflow/idemflow.log" 2>/dev/null && break
		sleep 0.1
	done
	check "the server's pid is known, to stop it" test -n "$SERVER_PID"
	check "idemflow-fcgi serves on the socket from the socket unit" \
		grep -q 'msg="listening on the socket from systemd" fd=3' "$ROOT/var/log/idemflow/idemflow.log"
}

# The packaged logrotate file, run as cron.daily runs it: the log moved
# and created as the idemflow user ("su"), and the running server told,
# without systemd, through the pid file its configuration names.
logrotate_checks() {
	local log=$ROOT/var/log/idemflow/idemflow.log i rc=0 n=0
	in_ns logrotate -f -s /tmp/logrotate.state /etc/logrotate.d/idemflow \
		>"$WORK/logrotate.out" 2>&1 || rc=$?
	check "logrotate rotates the server's log (status $rc, $(wc -c <"$WORK/logrotate.out") bytes of output)" \
		bash -c "[[ $rc == 0 && ! -s '$WORK/logrotate.out' ]]"
	cat "$WORK/logrotate.out" >&2
	check "the old log is idemflow.log.1" grep -q 'msg="worker started"' "$log.1"
	check "the new log is idemflow:idemflow 0640" \
		bash -c "[[ \$(chroot '$ROOT' stat -c '%U:%G %a' /var/log/idemflow/idemflow.log) == 'idemflow:idemflow 640' ]]"
	for i in $(seq 100); do
		n=$(grep -c 'msg="log file reopened"' "$log" 2>/dev/null || :)
		[[ ${n:-0} -ge 3 ]] && break
		sleep 0.1
	done
	check "the supervisor and its 2 workers reopened their log in the new file (${n:-0} lines)" \
		test "${n:-0}" -eq 3
}

# The secrets: nginx's workers reach the server through the socket unit's
# socket, never by reading what the idemflow group may read.
server_checks() {
	check "www-data is not in the idemflow group" \
		bash -c "! chroot '$ROOT' id -nG www-data | grep -qw idemflow"
	check "www-data cannot read /etc/idemflow/idemflow.conf" \
		bash -c "! chroot '$ROOT' runuser -u www-data -- cat /etc/idemflow/idemflow.conf >/dev/null 2>&1"
	check "README.Debian does not tell to add www-data to the idemflow group" \
		bash -c "! zcat -f '$ROOT/usr/share/doc/idemflow/README.Debian'* | grep -q 'adduser www-data'"
	http_req after -H 'Host: idemflow' http://127.0.0.1/healthz
	check "and still, a request through nginx is served ($(cat "$WORK/after.status"))" \
		status_is after 204
}

server_through_nginx

# ---------------------------------------------------------------- remove, purge
step "remove"
mkdir -p "$ROOT/var/log/idemflow"
echo "a line" >"$ROOT/var/log/idemflow/idemflow.log"
in_root apt-get remove -y idemflow >>"$WORK/apt.log" 2>&1 || bad "apt-get remove failed"
check "remove takes the programs" bash -c "[[ ! -e '$ROOT/usr/bin/idemflow-dispatch' ]]"
check "remove keeps the configuration" test -f "$ROOT/etc/idemflow/idemflow.conf"
# Configured (the edit is kept), but the programs are gone.
expect_nothing_ran "removed" 1
step "purge"
in_root apt-get purge -y idemflow >>"$WORK/apt.log" 2>&1 || bad "apt-get purge failed"
check "purge takes the configuration" bash -c "[[ ! -e '$ROOT/etc/idemflow' ]]"
check "purge takes the cron file" bash -c "[[ ! -e '$ROOT/etc/cron.d/idemflow' ]]"
check "purge takes the logs" bash -c "[[ ! -e '$ROOT/var/log/idemflow' ]]"
check "dpkg forgets the package" bash -c "! chroot '$ROOT' dpkg-query -W idemflow >/dev/null 2>&1"

# ---------------------------------------------------------------- the inbox's packages
step "the consumer inbox: install, build a program with pkg-config, run it"
cp "$LIB_DEB" "$DEV_DEB" "$SQL_DEB" "$ROOT/tmp/"
if in_root apt-get install -y --no-install-recommends gcc libc6-dev pkg-config \
	"/tmp/${LIB_DEB##*/}" "/tmp/${DEV_DEB##*/}" "/tmp/${SQL_DEB##*/}" >>"$WORK/apt.log" 2>&1; then
	ok "the inbox packages install (with a compiler and their dependencies)"
else
	tail -n 30 "$WORK/apt.log" >&2
	bad "apt-get install of the inbox packages failed"
fi
# A consumer's first program: the library answers through its API. No
# database in this root: a claim on no connection fails with the
# library's own message, and setup on a refused connection fails.
cat >"$ROOT/tmp/inbox_demo.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include <idemflow/inbox.h>

int main(void)
{
	struct idemflow_inbox_err err;
	PGconn *conn;
	int r = idemflow_inbox_claim(NULL, "billing", "evt-1", &err);

	printf("claim %d: %s\n", r, err.msg);
	conn = PQconnectdb("host=/nonexistent connect_timeout=2");
	r = idemflow_inbox_setup(conn, &err);
	printf("setup %d: %s\n", r,
	       strstr(err.msg, "could not set up the inbox: ") == err.msg ? "refused" : err.msg);
	PQfinish(conn);
	return 0;
}
EOF
# shellcheck disable=SC2016 # $(pkg-config ...) is expanded inside the root
if in_root sh -c 'cc -Wall -Werror -o /tmp/inbox_demo /tmp/inbox_demo.c $(pkg-config --cflags --libs idemflow-inbox)' \
	>"$WORK/cc.log" 2>&1; then
	ok "a program builds with pkg-config --cflags --libs idemflow-inbox"
else
	cat "$WORK/cc.log" >&2
	bad "the program does not build against the installed library"
fi
in_root /tmp/inbox_demo >"$WORK/demo.out" 2>&1 || true
cat "$WORK/demo.out" >&2
check "it runs, and the library answers" cmp -s "$WORK/demo.out" <(printf '%s\n' \
	"claim -1: could not claim the event: no connection" "setup -1: refused")
# (/lib is /usr/lib in Debian 12: the loader's cache may name either.)
check "it runs on the packaged libidemflow-inbox.so.1" \
	bash -c "chroot '$ROOT' ldd /tmp/inbox_demo | grep -qE '^\s*libidemflow-inbox\.so\.1 => (/usr)?/lib/$MA/libidemflow-inbox\.so\.1 '"
autopkgtest_run inbox
in_root apt-get purge -y libidemflow-inbox-dev libidemflow-inbox1 idemflow-inbox >>"$WORK/apt.log" 2>&1 ||
	bad "apt-get purge of the inbox packages failed"
check "purge takes the library" bash -c "! ls '$ROOT'/usr/lib/$MA/libidemflow-inbox* >/dev/null 2>&1"
check "purge takes the inbox's SQL" bash -c "[[ ! -e '$ROOT/usr/share/idemflow/consumer' ]]"

echo "$PASS passed, $FAIL failed"
((FAIL == 0))
