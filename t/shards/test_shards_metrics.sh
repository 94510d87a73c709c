#!/usr/bin/env bash
# t/shards/test_shards_metrics.sh - /metrics of a partitioned deployment
# (doc/distribution.md, "PL/Proxy as built"; doc/operations.md, "Metrics"):
# two partitions behind a PL/Proxy proxy, a tenant on each with endpoints
# and pending deliveries, scraped through nginx's metrics listener and the
# real worker pool (routing = proxy):
#   - both partitions up: idemflow_partition_up 1 for each, the outbox
#     gauges and idemflow_endpoints_disabled summed over both, and
#     idemflow_endpoint_deliveries_pending's ten lines the ten endpoints
#     with the most pending deliveries across both partitions, the rest
#     in endpoint="other" (exact lines);
#   - nothing /metrics, /readyz or /healthz sends is refused by the proxy
#     (no "is not routed" in the proxy's log);
#   - a single database (routing = direct, partition 0 served alone):
#     no idemflow_partition_up, its own endpoint lines;
#   - partition 1 stopped: idemflow_partition_up{partition="1"} 0, every
#     gauge partition 0's alone;
#   - both stopped: idemflow_db_up 0, both partitions 0, no database gauge.
# Starts its own proxy and partitions as t/shards/test_shards.sh does
# (scripts/lib/stack.sh, about 15 s). Skips (77) without PL/Proxy.
set -euo pipefail

source "${top_srcdir:?run me from make check}/t/shards/lib.sh"
shards_start test_shards_metrics
# The pool of one database this test starts too goes with the rest.
trap 'stack_nginx_stop "$DIR/direct/nginx" || true; stack_fcgi_stop "$DIR/direct/fcgi.pid" || true; shards_cleanup' EXIT
PROXY_LOG=$DIR/proxy/pg.log
TA_ID=$(psql_at "$P0" "SELECT id FROM tenants WHERE name = 'ta'")
TB_ID=$(psql_at "$P1" "SELECT id FROM tenants WHERE name = 'tb'")
shards_serve "workers = 2" "retry_after = 1" "timeout = 10s"
# nginx's metrics listener passes the client's address: 127.0.0.1 is in
# the default metrics_allow.
METRICS=http://127.0.0.1:$STACK_NGINX_METRICS_PORT/metrics

post() {
	curl -sS --max-time 20 -o "$DIR/$1.body" -w '%{http_code}' \
		-X POST "$URL/v1/workflows" -H "Authorization: Bearer $2" \
		-H 'Content-Type: application/json' -H "Idempotency-Key: $3" -d "$4"
}
# scrape NAME [URL]: GET /metrics into $DIR/NAME.body; the status to stdout.
scrape() {
	curl -sS --max-time 20 -o "$DIR/$1.body" -w '%{http_code}' "${2:-$METRICS}"
}
# lines NAME REGEX: the lines of NAME's body that match, one per line.
lines() { grep -E "$2" "$DIR/$1.body" || true; }

# ---- the data: an event per tenant (tenant b's second one dead); on
# partition 0 eight endpoints with 16, 14, ... 2 pending deliveries and
# one disabled; on partition 1 eight with 15, 13, ... 1 and two disabled.
# Delivered and dead deliveries are not pending and count nowhere.
expect "tenant a: create 201" "$(post a1 "$TA" k1 '{"type":"t"}')" 201
expect "tenant b: create 201" "$(post b1 "$TB" k1 '{"type":"t"}')" 201
expect "tenant b: another 201" "$(post b2 "$TB" k2 '{"type":"t"}')" 201
psql_at "$P1" "UPDATE outbox SET dead_at = now() WHERE id = (SELECT max(id) FROM outbox)" >/dev/null
# endpoints DB TENANT PREFIX ODD DISABLED: eight endpoints PREFIX...01 to
# ...08, endpoint i with 2 (9 - i) - ODD pending deliveries, and DISABLED
# more, disabled, with none.
endpoints() {
	psql_at "$1" "
INSERT INTO endpoints (tenant_id, id, url, secret)
SELECT $2, ('$3' || lpad(i::text, 12, '0'))::uuid, 'http://127.0.0.1:9/',
       'whsec_' || repeat('A', 32)
  FROM generate_series(1, 8) i;
INSERT INTO endpoints (tenant_id, id, url, secret, disabled, disabled_reason, disabled_at)
SELECT $2, ('$3' || lpad((100 + i)::text, 12, '0'))::uuid, 'http://127.0.0.1:9/',
       'whsec_' || repeat('A', 32), true, 'manual', now()
  FROM generate_series(1, $5) i;
INSERT INTO deliveries (tenant_id, endpoint_id, workflow_id, seq, outbox_id)
SELECT $2, ('$3' || lpad(i::text, 12, '0'))::uuid, gen_random_uuid(), 1, 0
  FROM generate_series(1, 8) i, generate_series(1, 2 * (9 - i) - $4) j;
INSERT INTO deliveries (tenant_id, endpoint_id, workflow_id, seq, outbox_id, state)
SELECT $2, ('$3' || lpad(i::text, 12, '0'))::uuid, gen_random_uuid(), 1, 0, s
  FROM generate_series(1, 8) i, unnest(ARRAY['delivered', 'dead', 'skipped']) s;" >/dev/null
}
E0=e0000000-0000-4000-8000-
E1=e1000000-0000-4000-8000-
endpoints "$P0" "$TA_ID" "$E0" 0 1
endpoints "$P1" "$TB_ID" "$E1" 1 2
# ep TENANT PREFIX I COUNT: endpoint I's line.
ep() { printf 'idemflow_endpoint_deliveries_pending{tenant="%s",endpoint="%s%012d"} %s\n' "$1" "$2" "$3" "$4"; }

# ---- both partitions up
start_bytes=$(stat -c %s "$PROXY_LOG")
expect "both up: /metrics 200" "$(scrape m1)" 200
expect "both up: idemflow_partition_up, both 1" "$(lines m1 '^idemflow_partition_up')" \
	'idemflow_partition_up{partition="0"} 1
idemflow_partition_up{partition="1"} 1'
expect "both up: the outbox gauges summed" \
	"$(lines m1 '^idemflow_(db_up|outbox_pending|outbox_dead|jobs_activatable|workflows_incident) ')" \
	'idemflow_db_up 1
idemflow_outbox_pending 2
idemflow_outbox_dead 1
idemflow_jobs_activatable 0
idemflow_workflows_incident 0'
expect "both up: 3 endpoints disabled" "$(lines m1 '^idemflow_endpoints_disabled ')" \
	'idemflow_endpoints_disabled 3'
expect "both up: the ten endpoints with the most pending, across partitions, and the rest" \
	"$(lines m1 '^idemflow_endpoint_deliveries_pending')" \
	"$(ep "$TA_ID" $E0 1 16; ep "$TB_ID" $E1 1 15; ep "$TA_ID" $E0 2 14; ep "$TB_ID" $E1 2 13
	ep "$TA_ID" $E0 3 12; ep "$TB_ID" $E1 3 11; ep "$TA_ID" $E0 4 10; ep "$TB_ID" $E1 4 9
	ep "$TA_ID" $E0 5 8; ep "$TB_ID" $E1 5 7)
idemflow_endpoint_deliveries_pending{tenant=\"other\",endpoint=\"other\"} 21"
expect "both up: /readyz 200" "$(curl -sS -o /dev/null -w '%{http_code}' "$URL/readyz")" 200
expect "both up: /healthz 204" "$(curl -sS -o /dev/null -w '%{http_code}' "$URL/healthz")" 204
expect "the proxy refused nothing of /metrics, /readyz, /healthz" \
	"$(tail -c +"$((start_bytes + 1))" "$PROXY_LOG" | grep -c 'is not routed' || true)" 0

# ---- a single database: partition 0 served alone, as before partitions
install -d -m 755 -- "$DIR/direct" || exit 99
sed -e 's/^routing = proxy$/routing = direct/' -e "s|$DIR/fcgi|$DIR/direct/fcgi|" \
	-e 's/^workers = 2$/workers = 1/' "$DIR/idemflow.conf" >"$DIR/direct/idemflow.conf"
PROXY_METRICS=$METRICS
# $DATABASE_URL (the proxy's) wins over the file's db.
DATABASE_URL=$P0 stack_fcgi_start "$DIR/direct/idemflow.conf" "$DIR/direct/fcgi.sock" \
	"$DIR/direct/fcgi.pid" "$DIR/direct/fcgi.log" || exit 99
stack_nginx_start "$DIR/direct" "" "$DIR/direct/fcgi.sock" \
	"$top_srcdir/nginx/idemflow-local.conf.in" || exit 99
DIRECT_METRICS=http://127.0.0.1:$STACK_NGINX_METRICS_PORT/metrics
expect "direct: /metrics 200" "$(scrape d1 "$DIRECT_METRICS")" 200
expect "direct: no idemflow_partition_up" "$(lines d1 'idemflow_partition_up' | wc -l)" 0
expect "direct: partition 0's gauges" \
	"$(lines d1 '^idemflow_(db_up|outbox_pending|outbox_dead|endpoints_disabled) ')" \
	'idemflow_db_up 1
idemflow_outbox_pending 1
idemflow_outbox_dead 0
idemflow_endpoints_disabled 1'
P0_ENDPOINTS="$(for i in 1 2 3 4 5 6 7 8; do ep "$TA_ID" $E0 $i $((2 * (9 - i))); done)
idemflow_endpoint_deliveries_pending{tenant=\"other\",endpoint=\"other\"} 0"
expect "direct: partition 0's endpoints" "$(lines d1 '^idemflow_endpoint_deliveries_pending')" \
	"$P0_ENDPOINTS"
stack_nginx_stop "$DIR/direct/nginx" || true
stack_fcgi_stop "$DIR/direct/fcgi.pid" || true

# ---- partition 1 stopped
stack_pg_stop "${STACK_SHARD_DATA[1]}" || exit 99
expect "partition 1 down: /metrics 200" "$(scrape m2 "$PROXY_METRICS")" 200
expect "partition 1 down: idemflow_partition_up names it" "$(lines m2 '^idemflow_partition_up')" \
	'idemflow_partition_up{partition="0"} 1
idemflow_partition_up{partition="1"} 0'
expect "partition 1 down: partition 0's outbox gauges" \
	"$(lines m2 '^idemflow_(db_up|outbox_pending|outbox_dead) ')" \
	'idemflow_db_up 1
idemflow_outbox_pending 1
idemflow_outbox_dead 0'
expect "partition 1 down: partition 0's disabled endpoint" \
	"$(lines m2 '^idemflow_endpoints_disabled ')" 'idemflow_endpoints_disabled 1'
expect "partition 1 down: partition 0's endpoints" \
	"$(lines m2 '^idemflow_endpoint_deliveries_pending')" "$P0_ENDPOINTS"

# ---- both stopped: the counters still served, no database gauge
stack_pg_stop "${STACK_SHARD_DATA[0]}" || exit 99
expect "both down: /metrics 200" "$(scrape m3 "$PROXY_METRICS")" 200
expect "both down: idemflow_db_up 0, both partitions 0" \
	"$(lines m3 '^idemflow_(db_up|partition_up)')" \
	'idemflow_db_up 0
idemflow_partition_up{partition="0"} 0
idemflow_partition_up{partition="1"} 0'
expect "both down: no outbox or endpoint gauge" \
	"$(lines m3 '^idemflow_(outbox|jobs|workflows|endpoint)' | wc -l)" 0
expect "both down: the counters still served" \
	"$(lines m3 '^idemflow_requests_total\{route="/metrics",status="200"\}' | wc -l)" 1

if ((fails)); then
	stack_tail "$PROXY_LOG" 20
	stack_tail "$DIR/direct/fcgi.log" 20
fi
shards_end
