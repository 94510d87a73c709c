#!/usr/bin/env bash
# t/install/test_help.sh - each program's --help lists the configuration
# keys that program reads, and only those: idemflow-fcgi no sink's key,
# idemflow-dispatch no pool's, idemflow neither. The lists come from the
# one table of app/core/conf.c; here they are written out, exactly, so
# that a key given to the wrong program shows. Together the three lists
# name every key of the effective configuration (-T), so no key is left
# out of every --help. Nothing is started: no database is reached.
set -euo pipefail

: "${top_builddir:?run me from make check}"
B=${IDEMFLOW_BUILDDIR:-$top_builddir}/app
TMP=$(mktemp -d /tmp/idemflow-help.XXXXXX)
trap 'rm -rf -- "$TMP"' EXIT
FAIL=0
unset DATABASE_URL IDEMFLOW_CONFIG

# The keys of a --help, one a line, in the order it prints them; the
# fault-injection switches of --enable-test-hooks builds left out.
help_keys() {
	"$B/$1" --help | sed -n '/^Configuration/,$ s/^  \([a-z_0-9]*\) .*/\1/p' | grep -v '^test_'
}

expect_keys() {
	local prog=$1 want=$2
	if ! help_keys "$prog" >"$TMP/$prog.keys"; then
		echo "FAIL: $prog --help failed" >&2
		FAIL=1
		return 0
	fi
	if diff -u <(xargs -n1 <<<"$want") "$TMP/$prog.keys" >&2; then
		echo "ok: $prog --help lists exactly its keys"
	else
		echo "FAIL: $prog --help: keys differ (-expected +got)" >&2
		FAIL=1
	fi
}

expect_keys idemflow-fcgi "config db listen listen_mode routing workers max_requests pid_file
	idempotency_key idempotency_ttl replay_cache_ttl idempotency_mismatch_status
	problem_base_uri idempotency_wait statement_timeout max_body max_answer message_ttl_max
	max_depth retry_after shutdown_timeout request_slowlog_timeout request_terminate_timeout
	log_level application_name log_format log_file metrics_allow metrics_token"
expect_keys idemflow-dispatch "config db partitions partition statement_timeout log_level application_name
	log_format log_file textfile once loop batch max_runtime max_attempts backoff lease
	poll_interval sink url secret secret_previous timeout dead_on_4xx parallel endpoints endpoint_disable_failures endpoint_disable_after amqp_url exchange routing_key
	nats_url nats_subject_prefix nats_stream exec"
expect_keys idemflow "config db partitions partition idempotency_ttl replay_cache_ttl idempotency_wait
	statement_timeout outbox_retention history_retention workflow_retention prune_batch"

# The issue this guards, said plainly: the server names no sink's key.
if grep -E '^(amqp_|nats_|sink$|exchange$|routing_key$|exec$)' "$TMP/idemflow-fcgi.keys" >&2; then
	echo "FAIL: idemflow-fcgi --help names a sink's key" >&2
	FAIL=1
fi
for k in amqp_url nats_url nats_stream sink; do
	grep -qx "$k" "$TMP/idemflow-dispatch.keys" ||
		{ echo "FAIL: idemflow-dispatch --help lacks $k" >&2; FAIL=1; }
done

# Every key of the configuration is in some program's --help.
"$B/idemflow-fcgi" --db 'dbname=x' -T 2>/dev/null | sed -n 's/^\([a-z_0-9]*\) = .*/\1/p' |
	grep -v '^test_' | sort >"$TMP/all"
[[ -s $TMP/all ]] || { echo "FAIL: idemflow-fcgi -T printed no key" >&2; FAIL=1; }
cat "$TMP"/*.keys | grep -vx config | sort -u >"$TMP/union"
if diff -u "$TMP/all" "$TMP/union" >&2; then
	echo "ok: the three lists name every key of -T"
else
	echo "FAIL: keys of -T (-) not in any --help, or (+) in a --help and not in -T" >&2
	FAIL=1
fi

# The text before the keys is the program's own.
for p in idemflow-fcgi idemflow-dispatch idemflow; do
	"$B/$p" --help >"$TMP/help" || { echo "FAIL: $p --help failed" >&2; FAIL=1; }
	head -1 "$TMP/help" | grep -q "^Usage: $p " ||
		{ echo "FAIL: $p --help does not start with its usage" >&2; FAIL=1; }
done
exit $FAIL
