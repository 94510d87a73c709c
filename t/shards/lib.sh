# shellcheck shell=bash
# t/shards/lib.sh - what the t/shards tests share: two partitions behind a
# PL/Proxy proxy (scripts/lib/stack.sh, three throwaway clusters, about
# 10 s), a tenant on each, the server on the proxy behind nginx, and the
# TAP lines. Sourced by t/shards/test_shards*.sh, which t/run-test runs as
# they are (it starts nothing for t/shards):
#
#   source "$top_srcdir/t/shards/lib.sh"
#   shards_start NAME    # or exits 77 without PL/Proxy, 99 on a failure
#   shards_serve "workers = 2" "timeout = 10s" ...
#   expect "what" "$got" "$want"
#   shards_end
#
# shards_start sets DIR (removed at exit, with everything started in it),
# BINDIR, CLI, DISPATCH, P0 and P1 (the partitions' conninfo),
# DATABASE_URL (the proxy's), TA and TB (tokens of tenant ta on partition
# 0 and tb on partition 1, in the proxy's directory); shards_serve sets
# URL.

: "${top_srcdir:?run me from make check}" "${top_builddir:?}"
top_srcdir=$(cd "$top_srcdir" && pwd)
top_builddir=$(cd "$top_builddir" && pwd)
# shellcheck source=scripts/lib/stack.sh
source "$top_srcdir/scripts/lib/stack.sh"
CLI=$top_builddir/app/idemflow
# Read by the tests that run the dispatcher.
# shellcheck disable=SC2034
DISPATCH=$top_builddir/app/idemflow-dispatch
export IDEMFLOW_FCGI=$top_builddir/app/idemflow-fcgi
DIR=

shards_cleanup() {
	[[ -n $DIR ]] || return 0
	stack_nginx_stop "$DIR/nginx" || true
	stack_fcgi_stop "$DIR/fcgi.pid" || true
	stack_shards_stop "$DIR" || true
	stack_sweep "$DIR"
	rm -rf -- "$DIR"
}

# shards_start NAME: the partitions, the proxy, tenants ta and tb; NAME
# is the test's, for its log lines and its directory.
shards_start() {
	STACK_LOG_PREFIX=$1
	BINDIR=$(stack_pg_bindir) || exit 99
	if [[ ! -f $("$BINDIR/pg_config" --sharedir 2>/dev/null || echo /usr/share/postgresql/15)/extension/plproxy.control ]]; then
		echo "1..0 # SKIP PL/Proxy is not installed (scripts/deps)"
		exit 77
	fi
	DIR=$(mktemp -d "/tmp/idemflow-$1.XXXXXX") || exit 99
	chmod 755 "$DIR"
	trap shards_cleanup EXIT
	stack_shards_start "$DIR" 2 "$CLI" fast || exit 99
	P0=${STACK_SHARD_URL[0]}
	P1=${STACK_SHARD_URL[1]}
	"$CLI" --db "$P0" tenant create ta >/dev/null || exit 99
	"$CLI" --db "$P1" tenant create tb >/dev/null || exit 99
	# Read by the tests.
	# shellcheck disable=SC2034
	TA=$("$CLI" --db "$P0" token create --tenant ta 2>/dev/null) || exit 99
	# shellcheck disable=SC2034
	TB=$("$CLI" --db "$P1" token create --tenant tb 2>/dev/null) || exit 99
	stack_shards_sync || exit 99
}

# shards_serve LINE...: idemflow-fcgi on the proxy (routing = proxy) with
# the configuration's LINEs after its own, behind nginx at URL.
shards_serve() {
	stack_fcgi_dir "$DIR" || exit 99
	{
		cat <<EOT
db = $DATABASE_URL
routing = proxy
listen = $DIR/fcgi.sock
listen_mode = 0660
pid_file = $DIR/fcgi.pid
EOT
		printf '%s\n' "$@"
	} >"$DIR/idemflow.conf"
	stack_fcgi_start "$DIR/idemflow.conf" "$DIR/fcgi.sock" "$DIR/fcgi.pid" "$DIR/fcgi.log" || exit 99
	stack_nginx_start "$DIR" "" "$DIR/fcgi.sock" "$top_srcdir/nginx/idemflow-local.conf.in" || exit 99
	# shellcheck disable=SC2034
	URL=http://127.0.0.1:$STACK_NGINX_PORT
}

psql_at() { "$BINDIR/psql" -XAtq -v ON_ERROR_STOP=1 -d "$1" -c "$2"; }

n=0 fails=0
ok() {
	n=$((n + 1))
	echo "ok $n - $1"
}
not_ok() {
	n=$((n + 1)) fails=$((fails + 1))
	echo "not ok $n - $1"
	shift
	printf '# %s\n' "$@"
}
# expect WHAT GOT WANT
expect() {
	if [[ $2 == "$3" ]]; then ok "$1"; else not_ok "$1" "expected: $3" "got: $2"; fi
}

# shards_end: the plan line; on a failure the server's last lines, exit 1.
shards_end() {
	echo "1..$n"
	if ((fails)); then
		stack_tail "$DIR/fcgi.log" 20
		exit 1
	fi
}
