#!/usr/bin/env bash
# t/install/test_journal.sh - the programs' log lines carry journald's
# priorities when stderr is the journal, as systemd says it is: with
# JOURNAL_STREAM set to their stderr's "dev:ino", every line of
# idemflow-fcgi (debug, info, warning) and idemflow-dispatch (error)
# starts with <7>, <6>, <4> or <3>, its level's; without the variable, with
# it naming another file, or with log_file set, no line does. Exact
# prefixes. Nothing of the harness: the server runs on a socket of its
# own, with a database that does not exist, for as long as its worker
# takes to start.
set -euo pipefail

: "${top_builddir:?run me from make check}"
B=${IDEMFLOW_BUILDDIR:-$top_builddir}/app
TMP=$(mktemp -d /tmp/idemflow-journal.XXXXXX)
SUP=
trap '[[ -z $SUP ]] || kill -KILL "$SUP" 2>/dev/null; rm -rf -- "$TMP"' EXIT
FAIL=0
unset DATABASE_URL IDEMFLOW_CONFIG JOURNAL_STREAM
NODB="host=$TMP dbname=none connect_timeout=1"

fail() {
	echo "FAIL: $*" >&2
	FAIL=1
}

# run_fcgi LOG [ENV...]: the server, stderr on LOG, until its worker has
# started (the warning and info lines written), then SIGTERM.
run_fcgi() {
	local log=$1 deadline=$((SECONDS + 20))
	shift
	: >"$log"
	env "$@" "$B/idemflow-fcgi" --db "$NODB" --listen "$TMP/s.sock" --workers 1 \
		--log-level debug --pid-file "" 2>>"$log" &
	SUP=$!
	until grep -q 'msg="worker started"' "$log"; do
		((SECONDS < deadline)) || { fail "the worker did not start: $(cat "$log")"; break; }
		sleep 0.1
	done
	kill -TERM "$SUP"
	wait "$SUP" || fail "idemflow-fcgi exited $?"
	SUP=
}

# run_dispatch LOG [ENV...]: one failed run (no database), one error line.
run_dispatch() {
	local log=$1 rc=0
	shift
	: >"$log"
	env "$@" "$B/idemflow-dispatch" --db "$NODB" --sink exec --exec true 2>>"$log" || rc=$?
	[[ $rc == 75 ]] || fail "idemflow-dispatch exited $rc, expected 75"
}

stream_of() {
	stat -c '%d:%i' "$1"
}

# expect_prefixes LOG JOURNAL: each line's start against its level=: with
# JOURNAL=1 "<N>" and the level's priority, else no "<" at all.
expect_prefixes() {
	local log=$1 journal=$2 line level want n=0
	declare -A prio=([debug]=7 [info]=6 [warning]=4 [error]=3)
	while IFS= read -r line; do
		n=$((n + 1))
		level=${line#* level=}
		level=${level%% *}
		want="ts="
		[[ $journal == 1 ]] && want="<${prio[$level]:-?}>ts="
		[[ ${line:0:${#want}} == "$want" ]] || fail "$log line $n: expected \"$want\": $line"
	done <"$log"
	((n > 0)) || fail "$log: no line"
}

# The journal: stderr is the file JOURNAL_STREAM names (made first, so
# that its inode is known before the program starts).
: >"$TMP/fcgi.log"
run_fcgi "$TMP/fcgi.log" JOURNAL_STREAM="$(stream_of "$TMP/fcgi.log")"
expect_prefixes "$TMP/fcgi.log" 1
for p in '<7>' '<6>' '<4>'; do
	grep -q "^$p" "$TMP/fcgi.log" || fail "idemflow-fcgi wrote no $p line: $(cat "$TMP/fcgi.log")"
done
: >"$TMP/dispatch.log"
run_dispatch "$TMP/dispatch.log" JOURNAL_STREAM="$(stream_of "$TMP/dispatch.log")"
expect_prefixes "$TMP/dispatch.log" 1
grep -q '^<3>ts=.* level=error component=dispatch .*msg="run failed"' "$TMP/dispatch.log" ||
	fail "no <3> run failed line: $(cat "$TMP/dispatch.log")"
# JSON lines too: the prefix before the object.
echo 'log_format = json' >"$TMP/json.conf"
: >"$TMP/json.log"
run_dispatch "$TMP/json.log" JOURNAL_STREAM="$(stream_of "$TMP/json.log")" \
	IDEMFLOW_CONFIG="$TMP/json.conf"
grep -qx '<3>{"ts":.*"level":"error".*}' "$TMP/json.log" ||
	fail "no <3> JSON line: $(cat "$TMP/json.log")"

# Not the journal: no variable; a variable naming another file.
run_fcgi "$TMP/bare.log"
expect_prefixes "$TMP/bare.log" 0
: >"$TMP/other"
run_fcgi "$TMP/other.log" JOURNAL_STREAM="$(stream_of "$TMP/other")"
expect_prefixes "$TMP/other.log" 0
run_dispatch "$TMP/bare-dispatch.log"
expect_prefixes "$TMP/bare-dispatch.log" 0
# log_file takes stderr over: its lines are bare though the variable names
# the stderr the program was given.
echo "log_file = $TMP/file.log" >"$TMP/file.conf"
: >"$TMP/given.log"
run_dispatch "$TMP/given.log" JOURNAL_STREAM="$(stream_of "$TMP/given.log")" \
	IDEMFLOW_CONFIG="$TMP/file.conf"
expect_prefixes "$TMP/file.log" 0

((FAIL)) || echo "journal priorities: ok"
exit $FAIL
