#!/usr/bin/env bash
# t/shards/test_shards.sh - idemflow on two partitions behind a PL/Proxy
# proxy (doc/distribution.md, "PL/Proxy as built"), through the real
# nginx and worker pool, the workers connected to the proxy
# (routing = proxy):
#   - two tenants, one on each partition: a keyed create, its replay byte
#     for byte, the same key with another body 409, the same key name in
#     the other tenant a workflow of its own; each row on its tenant's
#     partition only; GET /v1/workflows/{id} for its tenant only;
#   - a proxy-to-partition connection lost while the create is out (the
#     partition's backend terminated, then SIGKILLed): 503 outcome-unknown,
#     and the same key then creates once and replays;
#   - /readyz names each partition and whether it answers: one partition
#     stopped, its tenant's create 503, the other tenant's 201, /readyz 200
#     "degraded"; both stopped, /readyz 503.
# Starts its own proxy and partitions (scripts/lib/stack.sh, three
# throwaway clusters, about 10 s in all); t/run-test starts nothing for
# t/shards. Skips (77) without PL/Proxy (scripts/deps installs it).
set -euo pipefail

# shellcheck source=t/shards/lib.sh
source "${top_srcdir:?run me from make check}/t/shards/lib.sh"
shards_start test_shards
SCHEMA=$("$BINDIR/psql" -XAtq -d "$P0" -c "SELECT max(version) FROM schema_migrations")

# The replay cache off: every replay is read from the tenant's partition.
shards_serve "workers = 2" "replay_cache_ttl = 0" "retry_after = 1" "timeout = 10s"

# post NAME TOKEN KEY BODY: POST /v1/workflows; status to stdout, the
# answer in $DIR/NAME.body and its headers in $DIR/NAME.head.
post() {
	curl -sS --max-time 20 -o "$DIR/$1.body" -D "$DIR/$1.head" -w '%{http_code}' \
		-X POST "$URL/v1/workflows" -H "Authorization: Bearer $2" \
		-H 'Content-Type: application/json' -H "Idempotency-Key: $3" -d "$4"
}
get() {
	curl -sS --max-time 20 -o "$DIR/$1.body" -w '%{http_code}' "$URL$3" \
		-H "Authorization: Bearer $2"
}
problem_type() { sed -n 's/.*"type":"[^"]*problems\/\([a-z-]*\)".*/\1/p' "$DIR/$1.body"; }
header() { tr -d '\r' <"$DIR/$1.head" | sed -n "s/^$2: //Ip"; }
wf_id() { sed -n 's/^{"id":"\([0-9a-f-]*\)".*/\1/p' "$DIR/$1.body"; }

# ---- two tenants, two partitions
expect "tenant a: create 201" "$(post a1 "$TA" k1 '{"type":"t","input":{"n":1}}')" 201
expect "tenant a: replay 201" "$(post a2 "$TA" k1 '{"type":"t","input":{"n":1}}')" 201
if cmp -s "$DIR/a1.body" "$DIR/a2.body"; then ok "tenant a: replay byte for byte"; else
	not_ok "tenant a: replay byte for byte" "$(cat "$DIR/a1.body")" "$(cat "$DIR/a2.body")"; fi
expect "tenant a: replay marked" "$(header a2 Idempotent-Replayed)" true
expect "tenant a: other body 409" "$(post a3 "$TA" k1 '{"type":"t","input":{"n":2}}')" 409
expect "tenant a: 409 is idempotency-key-reused" "$(problem_type a3)" idempotency-key-reused
expect "tenant b: same key name 201" "$(post b1 "$TB" k1 '{"type":"t","input":{"n":1}}')" 201
A_ID=$(wf_id a1)
B_ID=$(wf_id b1)
if [[ -n $A_ID && -n $B_ID && $A_ID != "$B_ID" ]]; then ok "two workflows"; else
	not_ok "two workflows" "$A_ID $B_ID"; fi
expect "partition 0: tenant a's workflow, key, event" \
	"$(psql_at "$P0" "SELECT (SELECT count(*) FROM workflows), (SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM outbox WHERE workflow_id = '$A_ID')")" "1|1|1"
expect "partition 1: tenant b's only" \
	"$(psql_at "$P1" "SELECT (SELECT count(*) FROM workflows WHERE id = '$B_ID'), (SELECT count(*) FROM workflows), (SELECT count(*) FROM idempotency_keys)")" "1|1|1"
expect "GET as tenant a 200" "$(get g1 "$TA" "/v1/workflows/$A_ID")" 200
if cmp -s "$DIR/a1.body" "$DIR/g1.body"; then ok "GET answers the created workflow"; else
	not_ok "GET answers the created workflow" "$(cat "$DIR/g1.body")"; fi
expect "GET its events 200" "$(get ev1 "$TA" "/v1/workflows/$A_ID/events")" 200
expect "its one event, workflow.created" \
	"$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(len(d["events"]), d["events"][0]["type"], d["events"][0]["workflow_id"])' "$DIR/ev1.body" 2>&1)" \
	"1 workflow.created $A_ID"
expect "GET tenant a's workflow as tenant b 404" "$(get g2 "$TB" "/v1/workflows/$A_ID")" 404
expect "/readyz 200, both partitions" "$(curl -sS "$URL/readyz")" \
	'{"status":"ready","schema_version":'"$SCHEMA"',"partitions":[{"partition": 0, "reachable": true, "schema_version": '"$SCHEMA"'}, {"partition": 1, "reachable": true, "schema_version": '"$SCHEMA"'}]}'
expect "an unknown token 401" "$(post u1 nosuchtoken k1 '{"type":"t"}')" 401

# ---- a proxy-to-partition connection lost during the create
# cut SIGNAL KEY: partition 1's workflows locked, tenant b's create sent
# and seen waiting there, its backend given SIGNAL (terminate: SIGTERM
# through pg_terminate_backend; kill: SIGKILL), the lock released.
cut() {
	local how=$1 key=$2 pid='' i
	"$BINDIR/psql" -XAtq -d "$P1" -c "BEGIN" -c "LOCK TABLE workflows" \
		-c "SELECT pg_sleep(30)" >/dev/null 2>&1 &
	local locker=$!
	for ((i = 0; i < 100; i++)); do
		[[ -n $(psql_at "$P1" "SELECT 1 FROM pg_locks WHERE relation = 'workflows'::regclass AND mode = 'AccessExclusiveLock' AND granted") ]] && break
		sleep 0.1
	done
	post "cut_$key" "$TB" "$key" '{"type":"t","input":{"cut":1}}' >"$DIR/cut_$key.code" &
	local poster=$!
	for ((i = 0; i < 100; i++)); do
		pid=$(psql_at "$P1" "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%idemflow_create_keyed%'")
		[[ -n $pid ]] && break
		sleep 0.1
	done
	if [[ -z $pid ]]; then
		not_ok "$how: the create waits on partition 1" "never seen waiting"
	elif [[ $how == terminate ]]; then
		psql_at "$P1" "SELECT pg_terminate_backend($pid)" >/dev/null
	else
		kill -KILL "$pid"
	fi
	wait "$poster" || true
	psql_at "$P1" "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)'" >/dev/null 2>&1 || true
	wait "$locker" 2>/dev/null || true
	# SIGKILL makes the partition restart: wait until it answers again.
	for ((i = 0; i < 100; i++)); do
		psql_at "$P1" "SELECT 1" >/dev/null 2>&1 && break
		sleep 0.1
	done
	expect "$how: the lost create is 503" "$(cat "$DIR/cut_$key.code")" 503
	expect "$how: outcome-unknown" "$(problem_type "cut_$key")" outcome-unknown
	expect "$how: the same key then creates" "$(post "cut_${key}_2" "$TB" "$key" '{"type":"t","input":{"cut":1}}')" 201
	expect "$how: and replays" "$(post "cut_${key}_3" "$TB" "$key" '{"type":"t","input":{"cut":1}}')" 201
	expect "$how: one workflow for the key" \
		"$(psql_at "$P1" "SELECT count(*) FROM idempotency_keys WHERE key = '$key'")|$(psql_at "$P1" "SELECT count(*) FROM workflows WHERE input = '{\"cut\": 1}' AND id = '$(wf_id "cut_${key}_2")'")" "1|1"
}
cut terminate k2
cut kill k3

# ---- one partition stopped
stack_pg_stop "${STACK_SHARD_DATA[1]}" || exit 99
code=$(post s1 "$TB" k4 '{"type":"t"}')
[[ $code == 503 ]] || code=$(post s1 "$TB" k4 '{"type":"t"}')
expect "partition 1 down: tenant b's create 503" "$code" 503
expect "partition 1 down: tenant b's again 503 unavailable" "$(post s2 "$TB" k5 '{"type":"t"}')|$(problem_type s2)" "503|unavailable"
expect "partition 1 down: tenant a's create 201" "$(post s3 "$TA" k4 '{"type":"t"}')" 201
expect "partition 1 down: tenant a's GET 200" "$(get s4 "$TA" "/v1/workflows/$A_ID")" 200
expect "partition 1 down: /readyz 200, degraded, partition 1 unreachable" \
	"$(curl -sS -w ' %{http_code}' "$URL/readyz")" \
	'{"status":"degraded","schema_version":'"$SCHEMA"',"partitions":[{"partition": 0, "reachable": true, "schema_version": '"$SCHEMA"'}, {"partition": 1, "reachable": false, "schema_version": null}]} 200'
stack_pg_stop "${STACK_SHARD_DATA[0]}" || exit 99
expect "both partitions down: /readyz 503" "$(curl -sS -o "$DIR/r3.body" -w '%{http_code}' "$URL/readyz")|$(sed -n 's/.*"detail":"\([^"]*\)".*/\1/p' "$DIR/r3.body")" \
	"503|no partition answers (unreachable: 0,1)"

# ---- a routing the server does not know is refused at start
sed 's/^routing = proxy$/routing = sideways/' "$DIR/idemflow.conf" >"$DIR/bad.conf"
rc=0
"$IDEMFLOW_FCGI" --config "$DIR/bad.conf" >"$DIR/bad.out" 2>&1 || rc=$?
expect "routing = sideways: exit 78" "$rc" 78

shards_end
