#!/usr/bin/env bash
# t/shards/test_shards_ops.sh - the upkeep of a partitioned deployment
# (doc/distribution.md, "Per partition"): two partitions behind a
# PL/Proxy proxy, a tenant on each, and one configuration naming both
# (partitions = P0; P1):
#   - idemflow-dispatch --once delivers the events of both partitions in
#     one run, --partition N only N's, --loop over two is refused (78);
#   - idemflow reap, prune and audit act on, and report, each partition;
#   - idemflow migrate over the configuration: each partition's
#     migrations, then the proxy's; with a partition down it stops there;
#   - one partition stopped: reap still runs on the other (exit 75);
#     /metrics still answers, the stopped partition's outbox counts
#     missing and named (idemflow_partition_up 0).
# Starts its own proxy and partitions as t/shards/test_shards.sh does.
set -euo pipefail

# shellcheck source=t/shards/lib.sh
source "${top_srcdir:?run me from make check}/t/shards/lib.sh"
shards_start test_shards_ops
# The replay cache off: every replay is read from the tenant's partition.
shards_serve "workers = 1" "replay_cache_ttl = 0" "retry_after = 1" "timeout = 10s" \
	"metrics_token = m3tricsm3tricsm3tricsm3trics"

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


# ---- per partition: the dispatcher, reap, prune, audit
expect "tenant a: create 1" "$(post a1 "$TA" k1 '{"type":"t","input":{"n":1}}')" 201
expect "tenant a: create 2" "$(post a2 "$TA" k2 '{"type":"t","input":{"n":2}}')" 201
expect "tenant b: create 1" "$(post b1 "$TB" k1 '{"type":"t","input":{"n":1}}')" 201
A_ID=$(wf_id a1)
B_ID=$(wf_id b1)
expect "the events: two on partition 0, one on partition 1" \
	"$(psql_at "$P0" "SELECT count(*) FROM outbox WHERE published_at IS NULL")|$(psql_at "$P1" "SELECT count(*) FROM outbox WHERE published_at IS NULL")" "2|1"

cat >"$DIR/upkeep.conf" <<EOT
partitions = $P0; $P1
sink = exec
exec = echo "\$IDEMFLOW_EVENT_ID" >>$DIR/delivered
endpoints = false
EOT
rc=0
"$DISPATCH" --config "$DIR/upkeep.conf" --once >"$DIR/d1.out" 2>&1 || rc=$?
expect "dispatch --once over both partitions: exit 0" "$rc" 0
expect "every event of both partitions delivered, once" \
	"$(sort "$DIR/delivered" | tr '\n' ' ')" \
	"$({ psql_at "$P0" "SELECT event_id FROM outbox"; psql_at "$P1" "SELECT event_id FROM outbox"; } | sort | tr '\n' ' ')"
expect "both partitions' outboxes published" \
	"$(psql_at "$P0" "SELECT count(*) FILTER (WHERE published_at IS NOT NULL), count(*) FROM outbox")/$(psql_at "$P1" "SELECT count(*) FILTER (WHERE published_at IS NOT NULL), count(*) FROM outbox")" "2|2/1|1"
expect "tenant b: create 2" "$(post b2 "$TB" k2 '{"type":"t","input":{"n":2}}')" 201
expect "tenant a: create 3" "$(post a3 "$TA" k3 '{"type":"t","input":{"n":3}}')" 201
rc=0
"$DISPATCH" --config "$DIR/upkeep.conf" --once --partition 1 >"$DIR/d2.out" 2>&1 || rc=$?
expect "dispatch --partition 1: exit 0, partition 1's event only" \
	"$rc|$(wc -l <"$DIR/delivered")|$(psql_at "$P0" "SELECT count(*) FROM outbox WHERE published_at IS NULL")|$(psql_at "$P1" "SELECT count(*) FROM outbox WHERE published_at IS NULL")" "0|4|1|0"
rc=0
"$DISPATCH" --config "$DIR/upkeep.conf" --loop >"$DIR/d3.out" 2>&1 || rc=$?
expect "dispatch --loop over two partitions refused: 78" "$rc" 78
rc=0
"$DISPATCH" --config "$DIR/upkeep.conf" --once --partition 2 >"$DIR/d4.out" 2>&1 || rc=$?
expect "dispatch --partition 2 of two: 78" "$rc" 78

# reap: a job whose lease expired, on each partition.
for i in 0 1; do
	wf=$A_ID db=$P0
	((i == 0)) || wf=$B_ID db=$P1
	psql_at "$db" "INSERT INTO jobs (tenant_id, workflow_id, step, name, job_type, state, due_at, worker, created_at, updated_at) SELECT tenant_id, id, 1, 'j', 'x', 'active', now() - interval '1 s', 'w', now(), now() FROM workflows WHERE id = '$wf'" >/dev/null
done
rc=0
out=$("$CLI" --config "$DIR/upkeep.conf" reap 2>&1) || rc=$?
expect "reap: exit 0, each partition's job" "$rc|$(echo "$out" | tr '\n' ' ')" \
	"0|partition 0: reap: jobs=1 partition 1: reap: jobs=1 "
expect "reap: both jobs activatable" \
	"$(psql_at "$P0" "SELECT state FROM jobs")|$(psql_at "$P1" "SELECT state FROM jobs")" "activatable|activatable"
rc=0
"$CLI" --config "$DIR/upkeep.conf" reap --loop >/dev/null 2>&1 || rc=$?
expect "reap --loop over two partitions refused: 64" "$rc" 64

# prune: every key expired, on each partition.
psql_at "$P0" "UPDATE idempotency_keys SET created_at = now() - interval '2 s', expires_at = now() - interval '1 s'" >/dev/null
psql_at "$P1" "UPDATE idempotency_keys SET created_at = now() - interval '2 s', expires_at = now() - interval '1 s'" >/dev/null
rc=0
out=$("$CLI" --config "$DIR/upkeep.conf" prune 2>&1) || rc=$?
expect "prune: exit 0, each partition's keys" \
	"$rc|$(echo "$out" | sed -n 's/^\(partition [0-9]:\)$/\1/p; s/^prune: \(keys=[0-9]*\).*/\1/p' | tr '\n' ' ')" \
	"0|partition 0: keys=3 partition 1: keys=2 "
expect "prune: no key left on either partition" \
	"$(psql_at "$P0" "SELECT count(*) FROM idempotency_keys")|$(psql_at "$P1" "SELECT count(*) FROM idempotency_keys")" "0|0"

# audit: each partition's report.
rc=0
"$CLI" --config "$DIR/upkeep.conf" audit >"$DIR/audit.out" 2>&1 || rc=$?
expect "audit: exit 0, a report per partition" \
	"$rc|$(grep -c '^partition [01]:$' "$DIR/audit.out")|$(grep -c '^audit: [0-9]* of [0-9]* invariants hold' "$DIR/audit.out")" "0|2|2"
rc=0
"$CLI" --config "$DIR/upkeep.conf" audit --json >/dev/null 2>&1 || rc=$?
expect "audit --json over two partitions refused: 64" "$rc" 64
rc=0
out=$("$CLI" --config "$DIR/upkeep.conf" --partition 1 audit 2>&1) || rc=$?
expect "audit --partition 1: partition 1 only, no header" "$rc|$(echo "$out" | grep -c '^partition')" "0|0"

# ---- migrate: each partition's migrations, then the proxy's
cat "$DIR/upkeep.conf" >"$DIR/migrate.conf"
printf 'db = %s\nrouting = proxy\n' "$DATABASE_URL" >>"$DIR/migrate.conf"
VERSION=$(psql_at "$P0" "SELECT max(version) FROM schema_migrations")
PROXY_VERSION=$(psql_at "$DATABASE_URL" "SELECT max(version) FROM schema_migrations")
rc=0
out=$("$CLI" --config "$DIR/migrate.conf" migrate 2>&1) || rc=$?
expect "migrate over the partitions and the proxy: exit 0, each in order" \
	"$rc|$(echo "$out" | tr '\n' ' ')" \
	"0|partition 0: migrate: applied 0 migration(s); schema at version $VERSION partition 1: migrate: applied 0 migration(s); schema at version $VERSION proxy: migrate: applied 0 proxy migration(s); schema at version $PROXY_VERSION "
rc=0
out=$("$CLI" --config "$DIR/migrate.conf" migrate --proxy 2>&1) || rc=$?
expect "migrate --proxy: the proxy alone" "$rc|$out" \
	"0|migrate: applied 0 proxy migration(s); schema at version $PROXY_VERSION"
expect "the proxy holds none of the partitions' tables" \
	"$(psql_at "$DATABASE_URL" "SELECT count(*) FROM pg_tables WHERE tablename IN ('workflows', 'outbox', 'idempotency_keys')")" 0

# ---- partition 1 stopped: partition 0's upkeep, /metrics and key counts go on
stack_pg_stop "${STACK_SHARD_DATA[1]}" || exit 99
rc=0
out=$("$CLI" --config "$DIR/migrate.conf" migrate 2>/dev/null) || rc=$?
expect "partition 1 down: migrate stops there (75), the proxy not reached" \
	"$rc|$(echo "$out" | tr '\n' ' ')" \
	"75|partition 0: migrate: applied 0 migration(s); schema at version $VERSION partition 1: "
rc=0
out=$("$CLI" --config "$DIR/upkeep.conf" reap 2>/dev/null) || rc=$?
expect "partition 1 down: reap runs on partition 0, exit 75" "$rc|$(echo "$out" | tr '\n' ' ')" \
	"75|partition 0: reap: jobs=0 partition 1: "
expect "partition 1 down: tenant a's create 201" "$(post m1 "$TA" km '{"type":"t","input":{"m":1}}')" 201
expect "partition 1 down: tenant a's replay 201" "$(post m2 "$TA" km '{"type":"t","input":{"m":1}}')" 201
expect "partition 1 down: tenant a's replay again 201" "$(post m3 "$TA" km '{"type":"t","input":{"m":1}}')" 201
curl -sS -o "$DIR/metrics.body" -w "%{http_code}" -H "Authorization: Bearer m3tricsm3tricsm3tricsm3trics" "$URL/metrics" >"$DIR/metrics.code"
expect "partition 1 down: /metrics 200 with partition 0's outbox (2 pending)" \
	"$(cat "$DIR/metrics.code")|$(grep -c '^idemflow_outbox_pending 2$' "$DIR/metrics.body")" "200|1"
# The worker flushes its key counts a second after the last one (keystats.h).
for ((i = 0; i < 40; i++)); do
	[[ -n $(psql_at "$P0" "SELECT 1 FROM idempotency_key_stats WHERE key = 'km'") ]] && break
	sleep 0.1
done
sleep 1.5
expect "partition 1 down: tenant a's key counts stored on partition 0, once" \
	"$(psql_at "$P0" "SELECT replays FROM idempotency_key_stats WHERE key = 'km'")" 2

shards_end
