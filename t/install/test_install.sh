#!/usr/bin/env bash
# t/install/test_install.sh - "make install DESTDIR=..." lays out the
# expected tree, with configure's directories filled into every file that
# names a path; every man page renders with "man -l" without a warning;
# idemflow.conf(5) names every configuration key; "make uninstall" leaves
# no file behind.
#
# Run by "make check" (t/run-test runs it as is), which exports the build
# directory (top_builddir) and the configured directories (inst_*).
set -euo pipefail

: "${top_builddir:?run me from make check}" "${top_srcdir:?}"
: "${inst_prefix:?}" "${inst_bindir:?}" "${inst_sbindir:?}" "${inst_sysconfdir:?}"
: "${inst_pkgdatadir:?}" "${inst_mandir:?}" "${inst_docdir:?}" "${inst_unitdir:?}"
: "${inst_sysusersdir:?}" "${inst_libdir:?}" "${inst_includedir:?}"

FAILS=0
TMP=$(mktemp -d /tmp/idemflow-install.XXXXXX)
trap 'rm -rf -- "$TMP"' EXIT
DEST=$TMP/root

fail() {
	echo "FAIL: $*" >&2
	FAILS=$((FAILS + 1))
}

# expect_file PATH [MODE]: an installed regular file (under DESTDIR).
expect_file() {
	local f=$DEST$1 mode
	if [[ ! -f $f ]]; then
		fail "not installed: $1"
		return
	fi
	if [[ -n ${2:-} ]]; then
		mode=$(stat -c %a "$f")
		[[ $mode == "$2" ]] || fail "$1 has mode $mode, want $2"
	fi
}

# expect_line PATH LINE: the installed file has exactly this line.
expect_line() {
	grep -qxF -- "$2" "$DEST$1" || fail "$1 lacks the line: $2"
}

# The nested make must not try to join the parent's job server.
mk() {
	env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$top_builddir" "$@"
}

if ! mk install DESTDIR="$DEST" >"$TMP/install.log" 2>&1; then
	cat "$TMP/install.log" >&2
	echo "FAIL: make install DESTDIR=$DEST" >&2
	exit 1
fi

# --- The tree ----------------------------------------------------------
expect_file "$inst_bindir/idemflow" 755
expect_file "$inst_bindir/idemflow-dispatch" 755
expect_file "$inst_sbindir/idemflow-fcgi" 755
for f in 001_init.sql 002_dispatch.sql; do
	expect_file "$inst_pkgdatadir/sql/$f" 644
done
# Every migration the programs carry is there to read.
for f in "$top_srcdir"/sql/[0-9]*.sql; do
	expect_file "$inst_pkgdatadir/sql/${f##*/}" 644
done
# The least-privilege roles, to run with psql.
expect_file "$inst_pkgdatadir/sql/roles.sql" 644
# The API's contract, as written and as the JSON the server answers with.
expect_file "$inst_pkgdatadir/openapi.yaml" 644
expect_file "$inst_pkgdatadir/openapi.json" 644
if [[ -f $DEST$inst_pkgdatadir/openapi.json ]] &&
	! python3 -c 'import json, sys, yaml
y = yaml.safe_load(open(sys.argv[1], encoding="utf-8"))
j = json.load(open(sys.argv[2], encoding="ascii"))
sys.exit(0 if j["openapi"] == y["openapi"] and j["paths"].keys() == y["paths"].keys() else 1)' \
		"$DEST$inst_pkgdatadir/openapi.yaml" "$DEST$inst_pkgdatadir/openapi.json"; then
	fail "$inst_pkgdatadir/openapi.json is not openapi.yaml as JSON"
fi
expect_file "$inst_sysconfdir/idemflow/idemflow.conf.example" 644
expect_file "$inst_sysconfdir/idemflow/idemflow.conf" 644
expect_file "$inst_sysconfdir/idemflow/pg_service.conf" 644
expect_file "$inst_sysconfdir/nginx/sites-available/idemflow" 644
expect_file "$inst_sysconfdir/cron.d/idemflow" 644
expect_file "$inst_sysconfdir/logrotate.d/idemflow" 644
# --without-systemdsystemunitdir installs no unit.
if [[ $inst_unitdir != no ]]; then
	for u in idemflow-fcgi.service idemflow-fcgi.socket idemflow-dispatch.service idemflow-dispatch.timer \
		idemflow-dispatch-loop.service idemflow-reap.service; do
		expect_file "$inst_unitdir/$u" 644
	done
fi
expect_file "$inst_sysusersdir/idemflow.conf" 644
expect_file "$inst_pkgdatadir/prometheus/idemflow-rules.yml" 644
expect_file "$inst_pkgdatadir/prometheus/idemflow-rules.test.yml" 644
expect_file "$inst_pkgdatadir/grafana/idemflow-dashboard.json" 644
# The reference clients (doc/clients.md).
CLIENTS=(python/idemflow_client.py python/webhook_receiver.py node/idemflow-client.mjs
	node/webhook-receiver.mjs)
for f in "${CLIENTS[@]}"; do
	expect_file "$inst_pkgdatadir/clients/$f" 644
done
expect_file "$inst_docdir/README.md" 644
# The reference the README links to, beside it.
DOCS=(api.md architecture.md operations.md reliability.md security.md performance.md
	ha.md distribution.md clients.md consumers.md runbooks.md)
for d in "${DOCS[@]}"; do
	expect_file "$inst_docdir/$d" 644
done
PAGES=(man1/idemflow.1 man5/idemflow.conf.5 man8/idemflow-fcgi.8 man8/idemflow-dispatch.8
	man3/libidemflow-inbox.3)
for p in "${PAGES[@]}"; do
	expect_file "$inst_mandir/$p" 644
done
# The consumer inbox: the shared library with its soname, its header and
# pkg-config file, its SQL and the Python module that uses only the SQL.
INBOX_LIB=libidemflow-inbox.so.1.0.0
INBOX=("$inst_libdir/$INBOX_LIB" "$inst_libdir/libidemflow-inbox.la"
	"$inst_includedir/idemflow/inbox.h" "$inst_libdir/pkgconfig/idemflow-inbox.pc"
	"$inst_pkgdatadir/consumer/inbox.sql" "$inst_pkgdatadir/consumer/idemflow_inbox.py")
for f in "${INBOX[@]}"; do
	expect_file "$f"
done
for l in libidemflow-inbox.so.1 libidemflow-inbox.so; do
	[[ $(readlink "$DEST$inst_libdir/$l") == "$INBOX_LIB" ]] ||
		fail "$inst_libdir/$l is not a link to $INBOX_LIB"
done
if command -v readelf >/dev/null; then
	soname=$(readelf -d "$DEST$inst_libdir/$INBOX_LIB" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
	[[ $soname == libidemflow-inbox.so.1 ]] || fail "$INBOX_LIB: soname '$soname', want libidemflow-inbox.so.1"
	# The interface, and nothing else: debian/libidemflow-inbox1.symbols lists the same.
	syms=$(nm -D --defined-only "$DEST$inst_libdir/$INBOX_LIB" | awk '$2 == "T" { print $3 }' | sort | tr '\n' ' ')
	want_syms="idemflow_inbox_claim idemflow_inbox_duplicates idemflow_inbox_metrics idemflow_inbox_setup idemflow_inbox_write_textfile "
	[[ $syms == "$want_syms" ]] || fail "$INBOX_LIB exports '$syms', want '$want_syms'"
fi
pc_dir=$DEST$inst_libdir/pkgconfig
PKG_CONFIG_PATH=$pc_dir pkg-config --validate idemflow-inbox || fail "idemflow-inbox.pc does not validate"
pc_libs=$(PKG_CONFIG_PATH=$pc_dir pkg-config --libs-only-l idemflow-inbox | xargs)
[[ $pc_libs == "-lidemflow-inbox -lpq" ]] || fail "pkg-config --libs-only-l idemflow-inbox: $pc_libs"
grep -q 'core/' "$DEST$inst_includedir/idemflow/inbox.h" &&
	fail "the installed header names the service's internal headers"
cmp -s "$top_srcdir/sql/consumer/inbox.sql" "$DEST$inst_pkgdatadir/consumer/inbox.sql" ||
	fail "the installed inbox.sql is not sql/consumer/inbox.sql"

# Nothing else: a stray file is as much a bug as a missing one.
want=$(
	printf '%s\n' "$inst_bindir/idemflow" "$inst_bindir/idemflow-dispatch" \
		"$inst_sbindir/idemflow-fcgi" \
		"$inst_sysconfdir/idemflow/idemflow.conf.example" \
		"$inst_sysconfdir/idemflow/idemflow.conf" \
		"$inst_sysconfdir/idemflow/pg_service.conf" \
		"$inst_sysconfdir/nginx/sites-available/idemflow" \
		"$inst_sysconfdir/cron.d/idemflow" "$inst_sysconfdir/logrotate.d/idemflow" \
		"$inst_sysusersdir/idemflow.conf" \
		"$inst_pkgdatadir/prometheus/idemflow-rules.yml" \
		"$inst_pkgdatadir/prometheus/idemflow-rules.test.yml" \
		"$inst_pkgdatadir/grafana/idemflow-dashboard.json" \
		"$inst_docdir/README.md" "$inst_docdir/ChangeLog" \
		"$inst_pkgdatadir/sql/roles.sql" \
		"$inst_pkgdatadir/openapi.yaml" "$inst_pkgdatadir/openapi.json"
	for d in "${DOCS[@]}"; do echo "$inst_docdir/$d"; done
	for f in "${CLIENTS[@]}"; do echo "$inst_pkgdatadir/clients/$f"; done
	for f in "$top_srcdir"/sql/[0-9]*.sql; do echo "$inst_pkgdatadir/sql/${f##*/}"; done
	for p in "${PAGES[@]}"; do echo "$inst_mandir/$p"; done
	printf '%s\n' "${INBOX[@]}"
	if [[ $inst_unitdir != no ]]; then
		for u in idemflow-fcgi.service idemflow-fcgi.socket idemflow-dispatch.service idemflow-dispatch.timer \
		idemflow-dispatch-loop.service idemflow-reap.service; do
			echo "$inst_unitdir/$u"
		done
	fi
)
got=$(cd "$DEST" && find . -type f | sed 's|^\.||' | sort)
extra=$(comm -13 <(sort <<<"$want") <(echo "$got"))
[[ -z $extra ]] || fail "unexpected files installed: $extra"

# --- Paths filled in -----------------------------------------------------
conf=$inst_sysconfdir/idemflow/idemflow.conf
if [[ $inst_unitdir != no ]]; then
	unit=$inst_unitdir/idemflow-fcgi.service
	expect_line "$unit" "ExecStart=$inst_sbindir/idemflow-fcgi --config $conf"
	expect_line "$unit" "Requires=idemflow-fcgi.socket"
	expect_line "$inst_unitdir/idemflow-fcgi.socket" "ListenStream=/run/idemflow/idemflow.sock"
	expect_line "$inst_unitdir/idemflow-fcgi.socket" "SocketUser=idemflow"
	expect_line "$inst_unitdir/idemflow-fcgi.socket" "SocketGroup=www-data"
	expect_line "$inst_unitdir/idemflow-fcgi.socket" "SocketMode=0660"
	expect_line "$unit" "ExecStartPre=$inst_sbindir/idemflow-fcgi --config $conf -t"
	expect_line "$unit" "ExecReload=/bin/sh -c '$inst_sbindir/idemflow-fcgi --config $conf -t && exec /bin/kill -HUP \"\$MAINPID\"'"
	expect_line "$unit" "Type=notify"
	expect_line "$unit" "NotifyAccess=main"
	expect_line "$unit" "WatchdogSec=30s"
	expect_line "$unit" "User=idemflow"
	expect_line "$inst_unitdir/idemflow-dispatch.service" \
		"ExecStart=$inst_bindir/idemflow-dispatch --config $conf --once --max-runtime 55s"
	expect_line "$inst_unitdir/idemflow-dispatch.timer" "OnCalendar=minutely"
	# The looping programs, the other choice to the timer and cron.
	expect_line "$inst_unitdir/idemflow-dispatch-loop.service" \
		"ExecStart=$inst_bindir/idemflow-dispatch --config $conf --loop"
	expect_line "$inst_unitdir/idemflow-dispatch-loop.service" \
		"ExecCondition=$inst_bindir/idemflow-dispatch --config $conf -t -q"
	expect_line "$inst_unitdir/idemflow-dispatch-loop.service" "Restart=on-failure"
	expect_line "$inst_unitdir/idemflow-reap.service" \
		"ExecStart=$inst_bindir/idemflow --config $conf reap --loop --interval 200"
	expect_line "$inst_unitdir/idemflow-reap.service" \
		"ExecCondition=$inst_bindir/idemflow --config $conf -t -q"
	expect_line "$inst_unitdir/idemflow-reap.service" \
		"Environment=PGSERVICEFILE=$inst_sysconfdir/idemflow/pg_service.conf PGSERVICE=idemflow-maintenance"
	expect_line "$inst_unitdir/idemflow-dispatch-loop.service" \
		"Environment=PGSERVICEFILE=$inst_sysconfdir/idemflow/pg_service.conf PGSERVICE=idemflow-dispatch"
	# Hardening: systemd's own score of each service, "OK" or better.
	if command -v systemd-analyze >/dev/null; then
		for u in idemflow-fcgi.service idemflow-dispatch.service \
			idemflow-dispatch-loop.service idemflow-reap.service; do
			level=$(systemd-analyze security --offline=yes "$DEST$inst_unitdir/$u" 2>/dev/null |
				sed -n 's/.*Overall exposure level for [^:]*: [0-9.]* \([A-Z]*\).*/\1/p')
			case $level in
			SAFE | OK) ;;
			*) fail "$u: systemd-analyze security says ${level:-nothing}, want OK or better" ;;
			esac
		done
	else
		echo "systemd-analyze not found: the units' hardening is not scored" >&2
	fi
	# Each program its own database role (t/db/test_roles.c runs them).
	expect_line "$unit" "Environment=PGSERVICEFILE=$inst_sysconfdir/idemflow/pg_service.conf PGSERVICE=idemflow-server"
	expect_line "$inst_unitdir/idemflow-dispatch.service" \
		"Environment=PGSERVICEFILE=$inst_sysconfdir/idemflow/pg_service.conf PGSERVICE=idemflow-dispatch"
fi
cron=$inst_sysconfdir/cron.d/idemflow
expect_line "$cron" "PGSERVICEFILE=$inst_sysconfdir/idemflow/pg_service.conf"
expect_line "$cron" "* * * * *  idemflow  [ -x $inst_bindir/idemflow-dispatch ] && PGSERVICE=idemflow-dispatch $inst_bindir/idemflow-dispatch --config $conf -t -q && PGSERVICE=idemflow-dispatch $inst_bindir/idemflow-dispatch --config $conf --once --max-runtime 55s"
expect_line "$cron" "17 * * * * idemflow  [ -x $inst_bindir/idemflow ] && PGSERVICE=idemflow-maintenance $inst_bindir/idemflow --config $conf -t -q && PGSERVICE=idemflow-maintenance $inst_bindir/idemflow --config $conf prune | logger -t idemflow-prune"
expect_line "$cron" "* * * * *  idemflow  [ -x $inst_bindir/idemflow ] && PGSERVICE=idemflow-maintenance $inst_bindir/idemflow --config $conf -t -q && PGSERVICE=idemflow-maintenance $inst_bindir/idemflow --config $conf reap | logger -t idemflow-reap"
svc=$inst_sysconfdir/idemflow/pg_service.conf
cmp -s "$top_srcdir/etc/pg_service.conf" "$DEST$svc" || fail "$svc is not the sample"
for s in idemflow-server idemflow-dispatch idemflow-maintenance; do
	expect_line "$svc" "[$s]"
done
grep -q 'kill-who=main --signal=USR1 idemflow-fcgi.service' "$DEST$inst_sysconfdir/logrotate.d/idemflow" ||
	fail "logrotate does not send USR1 to idemflow-fcgi"
grep -q 'kill-who=main --signal=USR1 idemflow-dispatch-loop.service' \
	"$DEST$inst_sysconfdir/logrotate.d/idemflow" ||
	fail "logrotate does not send USR1 to the looping dispatcher's unit"
if left=$(grep -rl '@[a-z]*dir@' "$DEST"); then
	fail "unsubstituted @...dir@ in: $left"
fi
cmp -s "$top_srcdir/etc/idemflow.conf.example" "$DEST$conf" || fail "$conf is not the sample"

# logrotate parses its file when it is there to ask (as root's, on a host
# that has no idemflow user to name).
if command -v logrotate >/dev/null 2>&1; then
	sed 's/ idemflow idemflow$/ root root/' "$DEST$inst_sysconfdir/logrotate.d/idemflow" \
		>"$TMP/logrotate.conf"
	getent passwd idemflow >/dev/null && cp "$DEST$inst_sysconfdir/logrotate.d/idemflow" "$TMP/logrotate.conf"
	logrotate --debug --state "$TMP/logrotate.state" "$TMP/logrotate.conf" \
		>"$TMP/logrotate.out" 2>&1 || fail "logrotate rejects its file: $(cat "$TMP/logrotate.out")"
	if grep -qi 'error' "$TMP/logrotate.out"; then
		fail "logrotate: $(grep -i error "$TMP/logrotate.out")"
	fi
fi
# The alert rules load, and their unit tests pass, as installed. Not
# skipped: scripts/deps installs promtool (Debian's prometheus package).
if command -v promtool >/dev/null 2>&1; then
	(cd "$DEST$inst_pkgdatadir/prometheus" && promtool check rules idemflow-rules.yml &&
		promtool test rules idemflow-rules.test.yml) >"$TMP/promtool.out" 2>&1 ||
		fail "promtool: $(cat "$TMP/promtool.out")"
	grep -q 'SUCCESS: [1-9][0-9]* rules found' "$TMP/promtool.out" ||
		fail "promtool check rules found no rules: $(cat "$TMP/promtool.out")"
else
	fail "promtool is not installed: the alert rules were not checked (scripts/deps)"
fi

# --- Man pages -------------------------------------------------------------
if command -v man >/dev/null 2>&1; then
	for p in "${PAGES[@]}"; do
		f=$DEST$inst_mandir/$p
		out=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l "$f" 2>&1 >/dev/null) ||
			fail "man -l $p failed: $out"
		[[ -z $out ]] || fail "man -l $p warns: $out"
		name=${p#man*/}
		name=${name%.*}
		LC_ALL=C.UTF-8 MANWIDTH=80 man -E UTF-8 -l "$f" 2>/dev/null | grep -q "^NAME" ||
			fail "man -l $p has no NAME section"
		head -1 "$f" | grep -qi "^\.TH ${name//./\\.} ${p##*.} " ||
			fail "$p: .TH does not name $name in section ${p##*.}"
	done
else
	echo "man is not installed: the pages were not rendered (apt-get install man-db)" >&2
	FAILS=$((FAILS + 1))
fi

# Every configuration key has its entry in idemflow.conf(5) (but the
# fault-injection switches of --enable-test-hooks builds).
# Each program's --help lists its own keys: the three together list all.
keys=$(for p in idemflow-fcgi idemflow-dispatch idemflow; do
	"$top_builddir/app/$p" --help | sed -n '/^Configuration/,$ s/^  \([a-z_0-9]*\) .*/\1/p'
done | grep -vx config | grep -v '^test_' | sort -u)
[[ -n $keys ]] || fail "no keys in the programs' --help"
for k in $keys; do
	grep -qxF ".B $k" "$top_srcdir/doc/idemflow.conf.5" || fail "idemflow.conf(5) lacks the key $k"
done

# --- Uninstall ---------------------------------------------------------------
mk uninstall DESTDIR="$DEST" >"$TMP/uninstall.log" 2>&1 || fail "make uninstall: $(cat "$TMP/uninstall.log")"
left=$(cd "$DEST" && find . -type f)
[[ -z $left ]] || fail "left after uninstall: $left"

# An operator's changed configuration survives both.
mk install DESTDIR="$DEST" >"$TMP/install2.log" 2>&1 || fail "second make install"
echo "workers = 9" >>"$DEST$conf"
mk install DESTDIR="$DEST" >"$TMP/install3.log" 2>&1 || fail "third make install"
grep -qx 'workers = 9' "$DEST$conf" || fail "make install overwrote a changed $conf"
mk uninstall DESTDIR="$DEST" >"$TMP/uninstall2.log" 2>&1 || fail "second make uninstall"
[[ -f $DEST$conf ]] || fail "make uninstall removed a changed $conf"

if ((FAILS)); then
	echo "$FAILS failure(s)" >&2
	exit 1
fi
echo "install tree, man pages and uninstall: ok"
