#!/usr/bin/env bash
# t/shards/test_shards_commands.sh - the statements routed through a
# PL/Proxy proxy beyond the keyed create (doc/distribution.md, "PL/Proxy
# as built"), for a tenant on each of two partitions, through the real
# nginx and worker pool (routing = proxy):
#   - the unkeyed create: 201, its workflow and event on the tenant's
#     partition only, with the request's actor and trace context;
#   - GET /v1/workflows: the tenant's own workflows only;
#   - GET /v1/endpoints and /v1/endpoints/{id}: the tenant's only;
#   - GET /v1/events: the tenant's events only;
#   - GET /v1/endpoints/{id}/secret, /v1/events/{id}/deliveries,
#     /v1/endpoints/{id}/attempts and /undelivered: the tenant's only.
# The keyed commands of two round trips: test_shards_keyed.sh.
# Starts its own proxy and partitions (scripts/lib/stack.sh, about 10 s).
# Skips (77) without PL/Proxy (scripts/deps installs it).
set -euo pipefail

# shellcheck source=t/shards/lib.sh
source "${top_srcdir:?run me from make check}/t/shards/lib.sh"
shards_start test_shards_commands
TA_ID=$(psql_at "$P0" "SELECT id FROM tenants WHERE name = 'ta'")
TB_ID=$(psql_at "$P1" "SELECT id FROM tenants WHERE name = 'tb'")
TA_TOKEN=$(psql_at "$P0" "SELECT id FROM api_tokens WHERE tenant_id = $TA_ID")
shards_serve "workers = 2" "idempotency_key = optional" "timeout = 10s"

TRACE=0af7651916cd43dd8448eb211c80319c
TP=00-$TRACE-b7ad6b7169203331-01
# post NAME TOKEN BODY [KEY]: POST /v1/workflows, with a traceparent;
# status to stdout, the answer in $DIR/NAME.body.
post() {
	local key=()
	[[ -n ${4:-} ]] && key=(-H "Idempotency-Key: $4")
	curl -sS --max-time 20 -o "$DIR/$1.body" -w '%{http_code}' \
		-X POST "$URL/v1/workflows" -H "Authorization: Bearer $2" \
		-H 'Content-Type: application/json' -H "traceparent: $TP" "${key[@]}" -d "$3"
}
get() {
	curl -sS --max-time 20 -o "$DIR/$1.body" -w '%{http_code}' "$URL$3" \
		-H "Authorization: Bearer $2"
}
problem_type() { sed -n 's/.*"type":"[^"]*problems\/\([a-z-]*\)".*/\1/p' "$DIR/$1.body"; }
wf_id() { sed -n 's/^{"id":"\([0-9a-f-]*\)".*/\1/p' "$DIR/$1.body"; }
# py NAME EXPR: EXPR of the JSON body d of NAME.
py() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$DIR/$1.body" "$2" 2>&1; }

# ---- the unkeyed create, a tenant on each partition
expect "tenant a: unkeyed create 201" "$(post a1 "$TA" '{"type":"t","input":{"n":1}}')" 201
expect "tenant a: another 201" "$(post a2 "$TA" '{"type":"u","input":{"n":2}}')" 201
expect "tenant b: unkeyed create 201" "$(post b1 "$TB" '{"type":"t","input":{"n":3}}')" 201
A1=$(wf_id a1) A2=$(wf_id a2) B1=$(wf_id b1)
expect "partition 0: tenant a's two workflows and events, no key" \
	"$(psql_at "$P0" "SELECT (SELECT count(*) FROM workflows WHERE tenant_id = $TA_ID AND id IN ('$A1', '$A2')), (SELECT count(*) FROM workflows), (SELECT count(*) FROM outbox), (SELECT count(*) FROM idempotency_keys)")" \
	"2|2|2|0"
expect "partition 1: tenant b's one" \
	"$(psql_at "$P1" "SELECT (SELECT count(*) FROM workflows WHERE tenant_id = $TB_ID AND id = '$B1'), (SELECT count(*) FROM workflows), (SELECT count(*) FROM outbox)")" \
	"1|1|1"
expect "the workflow and its event keep the actor and trace context" \
	"$(psql_at "$P0" "SELECT w.actor, split_part(w.traceparent, '-', 2), o.actor, split_part(o.traceparent, '-', 2) FROM workflows w JOIN outbox o ON o.workflow_id = w.id WHERE w.id = '$A1'")" \
	"token:$TA_TOKEN|$TRACE|token:$TA_TOKEN|$TRACE"
expect "GET the unkeyed create's workflow 200" "$(get g1 "$TA" "/v1/workflows/$A1")" 200
if cmp -s "$DIR/a1.body" "$DIR/g1.body"; then ok "GET answers the created workflow"; else
	not_ok "GET answers the created workflow" "$(cat "$DIR/a1.body")" "$(cat "$DIR/g1.body")"; fi

# ---- GET /v1/workflows
expect "tenant a: list 200" "$(get l1 "$TA" /v1/workflows)" 200
expect "tenant a: its two workflows, in id order" \
	"$(py l1 '" ".join(w["id"] for w in d["workflows"])')" \
	"$(printf '%s\n' "$A1" "$A2" | sort | tr '\n' ' ' | sed 's/ $//')"
expect "tenant a: list by type" "$(get l2 "$TA" '/v1/workflows?type=u')|$(py l2 '" ".join(w["id"] for w in d["workflows"])')" "200|$A2"
expect "tenant b: list 200, its one workflow" "$(get l3 "$TB" /v1/workflows)|$(py l3 '" ".join(w["id"] for w in d["workflows"])')" "200|$B1"

# ---- GET /v1/endpoints, /v1/endpoints/{id}
EA=11111111-1111-4111-8111-111111111111
EB=22222222-2222-4222-8222-222222222222
SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
psql_at "$P0" "INSERT INTO endpoints (tenant_id, id, url, secret, created_at, updated_at) VALUES ($TA_ID, '$EA', 'https://a.example/hook', '$SECRET', '2026-01-02 03:04:05.123456+00', '2026-01-02 03:04:05.123456+00')" >/dev/null
psql_at "$P1" "INSERT INTO endpoints (tenant_id, id, url, secret, filter_types, created_at, updated_at) VALUES ($TB_ID, '$EB', 'https://b.example/hook', '$SECRET', '{workflow.*}', '2026-01-02 03:04:05.123456+00', '2026-01-02 03:04:05.123456+00')" >/dev/null
expect "tenant a: GET its endpoint 200" "$(get e1 "$TA" "/v1/endpoints/$EA")" 200
expect "tenant a: the endpoint, byte for byte" "$(cat "$DIR/e1.body")" \
	'{"id":"11111111-1111-4111-8111-111111111111","url":"https://a.example/hook","filter_types":null,"ordering":"workflow","disabled":false,"disabled_reason":null,"metadata":{},"created_at":"2026-01-02T03:04:05.123456Z","updated_at":"2026-01-02T03:04:05.123456Z"}'
expect "tenant b: GET tenant a's endpoint 404" "$(get e2 "$TB" "/v1/endpoints/$EA")" 404
expect "tenant b: list 200, its one endpoint" "$(get e3 "$TB" /v1/endpoints)|$(py e3 '" ".join(e["id"] for e in d["endpoints"])')" "200|$EB"
expect "tenant a: list, byte for byte" "$(get e4 "$TA" /v1/endpoints)|$(cat "$DIR/e4.body")" \
	'200|{"endpoints":[{"id":"11111111-1111-4111-8111-111111111111","url":"https://a.example/hook","filter_types":null,"ordering":"workflow","disabled":false,"disabled_reason":null,"metadata":{},"created_at":"2026-01-02T03:04:05.123456Z","updated_at":"2026-01-02T03:04:05.123456Z"}],"next_cursor":null}'

# ---- GET /v1/events
expect "tenant a: events 200" "$(get v1 "$TA" /v1/events)" 200
expect "tenant a: its two workflow.created" \
	"$(py v1 '" ".join(e["type"] + ":" + e["workflow_id"] for e in d["events"])')" \
	"workflow.created:$A1 workflow.created:$A2"
expect "tenant b: events 200, its one" \
	"$(get v2 "$TB" /v1/events)|$(py v2 '" ".join(e["type"] + ":" + e["workflow_id"] for e in d["events"])')" \
	"200|workflow.created:$B1"

# ---- GET an endpoint's secret, an event's deliveries, an endpoint's undelivered
expect "tenant a: its endpoint's secret" "$(get k1 "$TA" "/v1/endpoints/$EA/secret")|$(cat "$DIR/k1.body")" \
	'200|{"key":"'"$SECRET"'","previous_key":null,"previous_expires_at":null}'
expect "tenant b: tenant a's endpoint's secret 404" "$(get k2 "$TB" "/v1/endpoints/$EA/secret")" 404
expect "tenant a: a create with its endpoint 201" "$(post a3 "$TA" '{"type":"t","input":{"n":4}}')" 201
A3=$(wf_id a3)
TS_FMT="'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'"
NEXT=$(psql_at "$P0" "SELECT to_char(next_attempt_at AT TIME ZONE 'UTC', $TS_FMT) FROM deliveries WHERE workflow_id = '$A3'")
UPD=$(psql_at "$P0" "SELECT to_char(updated_at AT TIME ZONE 'UTC', $TS_FMT) FROM deliveries WHERE workflow_id = '$A3'")
DELIVERIES='{"deliveries":[{"endpoint_id":"'"$EA"'","event_id":"'"$A3"'.1","state":"pending","attempts":0,"next_attempt_at":"'"$NEXT"'","last_error":null,"updated_at":"'"$UPD"'"}],"next_cursor":null}'
expect "tenant a: the event's deliveries" "$(get d1 "$TA" "/v1/events/$A3.1/deliveries")|$(cat "$DIR/d1.body")" \
	"200|$DELIVERIES"
expect "tenant b: the event's deliveries 404" "$(get d2 "$TB" "/v1/events/$A3.1/deliveries")" 404
expect "tenant a: the endpoint's undelivered" "$(get d3 "$TA" "/v1/endpoints/$EA/undelivered")|$(cat "$DIR/d3.body")" \
	"200|$DELIVERIES"
psql_at "$P0" "INSERT INTO delivery_attempts (tenant_id, endpoint_id, workflow_id, seq, event_id, trigger, started_at, duration_ms, status, outcome, response) VALUES ($TA_ID, '$EA', '$A3', 1, '$A3.1', 'scheduled', '2026-01-02 03:04:05.5+00', 12.5, 502, 'http', 'bad gateway')" >/dev/null
expect "tenant a: the endpoint's attempts" "$(get t1 "$TA" "/v1/endpoints/$EA/attempts")|$(py t1 '[(a["event_id"], a["trigger"], a["started_at"], a["status"], a["outcome"], a["response"]) for a in d["attempts"]]')" \
	"200|[('$A3.1', 'scheduled', '2026-01-02T03:04:05.500000Z', 502, 'http', 'bad gateway')]"
expect "tenant b: tenant a's endpoint's attempts 404" "$(get t2 "$TB" "/v1/endpoints/$EA/attempts")" 404

shards_end
