#!/usr/bin/env bash
# t/install/test_conftest.sh - the configuration test, as nginx -t, of
# idemflow-fcgi, idemflow-dispatch and idemflow: -t exits 0 with
# "configuration file F test is successful", or 78 with the reason and
# "... test failed"; -T prints the effective configuration with every
# secret masked; -q says nothing on success nor when no database is named
# (the cron jobs' guard), yet still names a wrong value. A database named
# only by a libpq service (PGSERVICE defined in PGSERVICEFILE) counts.
# Exact output, byte for byte. Nothing is started: no database is reached.
set -euo pipefail

: "${top_builddir:?run me from make check}"
B=${IDEMFLOW_BUILDDIR:-$top_builddir}/app
FCGI=$B/idemflow-fcgi DISPATCH=$B/idemflow-dispatch CLI=$B/idemflow
TMP=$(mktemp -d /tmp/idemflow-conftest.XXXXXX)
trap 'rm -rf -- "$TMP"' EXIT
FAIL=0
unset DATABASE_URL IDEMFLOW_CONFIG PGSERVICE PGSERVICEFILE PGSYSCONFDIR PGDATABASE PGHOST
export HOME=$TMP

# expect NAME STATUS STDOUT-FILE STDERR-TEXT CMD...: the exact status and
# both streams.
expect() {
	local name=$1 want_rc=$2 want_out=$3 want_err=$4 rc=0
	shift 4
	"$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
	if [[ $rc != "$want_rc" ]]; then
		echo "FAIL: $name: exit $rc, expected $want_rc" >&2
		FAIL=1
	fi
	if ! diff -u "$want_out" "$TMP/out" >&2; then
		echo "FAIL: $name: stdout differs (-expected +got)" >&2
		FAIL=1
	fi
	if ! diff -u <(printf '%s' "$want_err") "$TMP/err" >&2; then
		echo "FAIL: $name: stderr differs (-expected +got)" >&2
		FAIL=1
	fi
	[[ $FAIL == 1 ]] || echo "ok: $name"
	return 0
}
: >"$TMP/empty"

cat >"$TMP/good.conf" <<'CONF'
db = host=/run/postgresql dbname=idemflow user=idemflow password='s3 cr\'et' sslmode=require
metrics_token = tok-very-secret
secret = whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0
secret_previous = old-secret-being-rotated-out
amqp_url = amqp://user:amqppass@broker:5672/vh
nats_url = nats://natstoken@n1:4222,nats://u:natspass@n2:4222,nats://n3:4222
workers = 3
idempotency_ttl = 36h
max_body = 512k
CONF

for p in "$FCGI" "$DISPATCH" "$CLI"; do
	n=${p##*/}
	expect "$n -t, a good file" 0 "$TMP/empty" \
		"$n: configuration file $TMP/good.conf test is successful
" "$p" --config "$TMP/good.conf" -t
	expect "$n -t -q, a good file" 0 "$TMP/empty" "" "$p" -t -q --config "$TMP/good.conf"
done

# -T: every key, secrets masked, the file's values and the defaults.
cat >"$TMP/dump" <<DUMP
# the effective configuration: $TMP/good.conf, \$DATABASE_URL and flags over the defaults; secrets masked
db = host=/run/postgresql dbname=idemflow user=idemflow password=******** sslmode=require
partitions = ""
partition = -1
listen = /run/idemflow/idemflow.sock
listen_mode = 0660
routing = direct
workers = 3
max_requests = 0
pid_file = ""
idempotency_key = required
idempotency_ttl = 36h
replay_cache_ttl = 1s
idempotency_mismatch_status = 409
problem_base_uri = https://idemflow.example/problems/
idempotency_wait = 5s
statement_timeout = 30s
max_body = 512k
max_answer = 4M
message_ttl_max = 30d
max_depth = 64
retry_after = 1
shutdown_timeout = 30s
request_slowlog_timeout = 0
request_terminate_timeout = 0
log_level = info
application_name = idemflow
log_format = logfmt
log_file = ""
metrics_allow = 127.0.0.1,::1
metrics_token = ********
textfile = ""
once = false
loop = false
batch = 100
max_runtime = 0
max_attempts = 8
backoff = 5s,5m,30m,2h,5h,10h,10h
lease = 2m
poll_interval = 5s
sink = http
url = ""
secret = ********
secret_previous = ********
timeout = 10s
dead_on_4xx = true
parallel = 4
endpoints = true
endpoint_disable_failures = 10
endpoint_disable_after = 5d
amqp_url = amqp://user:********@broker:5672/vh
exchange = idemflow
routing_key = {type}
nats_url = nats://********@n1:4222,nats://u:********@n2:4222,nats://n3:4222
nats_subject_prefix = idemflow
nats_stream = ""
exec = ""
outbox_retention = 7d
history_retention = 7d
workflow_retention = 30d
prune_batch = 1000
DUMP
# Builds with --enable-test-hooks have one key more.
if grep -q '^#define IDEMFLOW_TEST_HOOKS' "$top_builddir/config.h" 2>/dev/null; then
	echo "test_fail_after_write = false" >>"$TMP/dump"
fi
expect "idemflow-fcgi -T" 0 "$TMP/dump" \
	"idemflow-fcgi: configuration file $TMP/good.conf test is successful
" "$FCGI" --config "$TMP/good.conf" -T
for s in s3 tok-very-secret c2VjcmV0 rotated-out amqppass natstoken natspass; do
	if grep -q -- "$s" "$TMP/out"; then
		echo "FAIL: -T shows the secret $s" >&2
		FAIL=1
	fi
done
# A URI in db: its password and a password= in its query.
printf 'db = postgresql://web:uripass@db1/idemflow?password=qpass&sslmode=require\n' \
	>"$TMP/uri.conf"
"$FCGI" --config "$TMP/uri.conf" -T 2>/dev/null | grep '^db = ' >"$TMP/out" || :
printf 'db = postgresql://web:********@db1/idemflow?password=********&sslmode=require\n' \
	>"$TMP/want"
if diff -u "$TMP/want" "$TMP/out" >&2; then
	echo "ok: -T masks a URI's passwords"
else
	echo "FAIL: -T and a URI in db" >&2
	FAIL=1
fi

# A wrong value: 78, the file and line, "test failed"; -q does not hide it.
printf 'workers = 3\nidempotency_wait = soon\n' >"$TMP/bad.conf"
for q in "" -q; do
	expect "idemflow-dispatch -t $q, a wrong value" 78 "$TMP/empty" \
		"idemflow-dispatch: $TMP/bad.conf:2: invalid value \"soon\" for \"idempotency_wait\": expected a duration such as 500ms, 5s, 10m, 24h or 7d
idemflow-dispatch: configuration test failed
" "$DISPATCH" --config "$TMP/bad.conf" -t $q
done
# A value only the server reads, checked as at start.
printf 'db = dbname=x\nmetrics_allow = 10.0.0.0/99\n' >"$TMP/allow.conf"
"$FCGI" --config "$TMP/allow.conf" -t >/dev/null 2>"$TMP/err" && rc=0 || rc=$?
if [[ $rc == 78 ]] && tail -n 1 "$TMP/err" | grep -qxF "idemflow-fcgi: configuration file $TMP/allow.conf test failed"; then
	echo "ok: idemflow-fcgi -t checks metrics_allow"
else
	echo "FAIL: idemflow-fcgi -t with metrics_allow = 10.0.0.0/99: exit $rc" >&2
	cat "$TMP/err" >&2
	FAIL=1
fi
printf 'db = dbname=x\nsink = kafka\n' >"$TMP/sink.conf"
expect "idemflow-dispatch -t, an unknown sink" 78 "$TMP/empty" \
	"idemflow-dispatch: invalid value \"kafka\" for \"sink\": expected http, amqp, nats or exec
idemflow-dispatch: configuration file $TMP/sink.conf test failed
" "$DISPATCH" --config "$TMP/sink.conf" -t
# A webhook secret of 23 bytes: too short (Standard Webhooks asks for 24 to
# 64 random bytes), raw or decoded; a previous secret without a secret.
printf 'db = dbname=x\nsecret = abcdefghijklmnopqrstuvw\n' >"$TMP/short.conf"
expect "idemflow-dispatch -t, a secret of 23 bytes" 78 "$TMP/empty" \
	"idemflow-dispatch: secret is 23 bytes, shorter than 24: use 24 or more random bytes, e.g. whsec_ and the base64 of 32 (openssl rand -base64 32)
idemflow-dispatch: configuration file $TMP/short.conf test failed
" "$DISPATCH" --config "$TMP/short.conf" -t
printf 'db = dbname=x\nsecret = abcdefghijklmnopqrstuvwx\nsecret_previous = whsec_YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnc=\n' \
	>"$TMP/short.conf"
expect "idemflow-dispatch -t, a previous secret of 23 bytes" 78 "$TMP/empty" \
	"idemflow-dispatch: secret_previous: the decoded key is 23 bytes, shorter than 24: use 24 or more random bytes (openssl rand -base64 32)
idemflow-dispatch: configuration file $TMP/short.conf test failed
" "$DISPATCH" --config "$TMP/short.conf" -t
printf 'db = dbname=x\nsecret_previous = abcdefghijklmnopqrstuvwx\n' >"$TMP/short.conf"
expect "idemflow-dispatch -t, a previous secret alone" 78 "$TMP/empty" \
	"idemflow-dispatch: secret_previous is set without secret
idemflow-dispatch: configuration file $TMP/short.conf test failed
" "$DISPATCH" --config "$TMP/short.conf" -t
printf "db = host='unterminated\n" >"$TMP/conninfo.conf"
expect "idemflow -t, a db libpq cannot parse" 78 "$TMP/empty" \
	"idemflow: invalid value for \"db\": unterminated quoted string in connection info string
idemflow: configuration file $TMP/conninfo.conf test failed
" "$CLI" --config "$TMP/conninfo.conf" -t

# No database named: 78 and what to set; silent with -q.
printf 'workers = 3\n' >"$TMP/nodb.conf"
expect "idemflow-dispatch -t, no database" 78 "$TMP/empty" \
	"idemflow-dispatch: no database configured: \"db\" is not set in $TMP/nodb.conf
idemflow-dispatch: configuration file $TMP/nodb.conf test failed
" "$DISPATCH" --config "$TMP/nodb.conf" -t
expect "idemflow-dispatch -t -q, no database" 78 "$TMP/empty" "" \
	"$DISPATCH" --config "$TMP/nodb.conf" -t -q
# The service named by PGSERVICE: missing from the service file, or with
# a user alone (as shipped), names no database; with a dbname it does.
printf '[idemflow-server]\ndbname=idemflow\n[idemflow-dispatch]\nuser=idemflow_cron\n#dbname=idemflow\n' \
	>"$TMP/pg_service.conf"
expect "idemflow-dispatch -t, its service names no database" 78 "$TMP/empty" \
	"idemflow-dispatch: no database configured: \"db\" is not set in $TMP/nodb.conf and the service [idemflow-dispatch] names no dbname or host in $TMP/pg_service.conf
idemflow-dispatch: configuration file $TMP/nodb.conf test failed
" env PGSERVICEFILE="$TMP/pg_service.conf" PGSERVICE=idemflow-dispatch \
	"$DISPATCH" --config "$TMP/nodb.conf" -t
printf 'host = db1\n' >>"$TMP/pg_service.conf"
expect "idemflow-dispatch -t, its service in the service file" 0 "$TMP/empty" \
	"idemflow-dispatch: configuration file $TMP/nodb.conf test is successful
" env PGSERVICEFILE="$TMP/pg_service.conf" PGSERVICE=idemflow-dispatch \
	"$DISPATCH" --config "$TMP/nodb.conf" -t
# -t runs nothing else: a command after it is refused.
expect "idemflow -t migrate is refused" 64 "$TMP/empty" \
	"idemflow: -t and -T take no other argument (\"migrate\")
" "$CLI" --config "$TMP/good.conf" -t migrate
exit "$FAIL"
