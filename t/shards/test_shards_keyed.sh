#!/usr/bin/env bash
# t/shards/test_shards_keyed.sh - the keyed commands of two round trips
# through a PL/Proxy proxy (doc/distribution.md, "Keyed commands through
# the proxy"), for tenants on two partitions, through the real nginx and
# worker pool (routing = proxy):
#   - a keyed create with a business key, with steps: 201 on the tenant's
#     partition, replayed byte for byte, 409 for another body; the same
#     business key again answers the existing workflow;
#   - a job's activation and completion, a message, a transition, keyed:
#     answered, stored, replayed byte for byte;
#   - a refusal a key keeps (409 invalid-transition) is stored and
#     replayed; one it does not keep (404) leaves no key;
#   - the same commands without a key;
#   - a command done whose answer was never stored (the server lost
#     between the two calls, played by calling the proxy's
#     idemflow_keyed_command by hand): the same request renders the
#     answer from the key's rows, stores it and replays it after;
#   - 12 concurrent copies of one keyed create with a business key: one
#     workflow, one answer, byte for byte in every copy;
#   - a keyed endpoint create: 201 with the row's Location, replayed;
#   - a command that writes no event (a heartbeat) refused while its
#     tenant is frozen for a move, nothing written;
#   - every write of a partition whose default is synchronous_commit =
#     off committed at "on" (the commit before the answer is durable).
# Starts its own proxy and partitions (scripts/lib/stack.sh, about 10 s).
# Skips (77) without PL/Proxy (scripts/deps installs it).
set -euo pipefail

source "${top_srcdir:?run me from make check}/t/shards/lib.sh"
shards_start test_shards_keyed
# Partition 1 commits weakly by default, before the server makes its
# sessions to it: what tenant b's requests write records the
# commit level its transaction had (checked at the end).
psql_at "$P1" "DO \$\$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = off', current_database()); END \$\$; CREATE TABLE t_levels (what text, level text); CREATE FUNCTION t_level() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN INSERT INTO t_levels VALUES (TG_TABLE_NAME || ' ' || TG_OP, current_setting('synchronous_commit')); RETURN NULL; END \$\$; CREATE TRIGGER t_level AFTER INSERT OR UPDATE ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION t_level(); CREATE TRIGGER t_level AFTER INSERT OR UPDATE ON workflows FOR EACH ROW EXECUTE FUNCTION t_level()" >/dev/null || exit 99
shards_serve "workers = 4" "idempotency_key = optional" "timeout = 10s"

# req NAME TOKEN METHOD PATH BODY [KEY]: status to stdout; the answer's
# headers in $DIR/NAME.head, its body in $DIR/NAME.body.
req() {
	local key=()
	[[ -n ${6:-} ]] && key=(-H "Idempotency-Key: $6")
	curl -sS --max-time 20 -D "$DIR/$1.head" -o "$DIR/$1.body" -w '%{http_code}' \
		-X "$3" "$URL$4" -H "Authorization: Bearer $2" \
		-H 'Content-Type: application/json' "${key[@]}" -d "$5"
}
body() { cat "$DIR/$1.body"; }
header() { sed -n "s/^$2: \\(.*\\)\\r\$/\\1/Ip" "$DIR/$1.head"; }
problem_type() { sed -n 's/.*"type":"[^"]*problems\/\([a-z-]*\)".*/\1/p' "$DIR/$1.body"; }
# py NAME EXPR: EXPR of the JSON body d of NAME.
py() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$DIR/$1.body" "$2" 2>&1; }
# same FIRST REPLAY WHAT: the replay is the first answer, byte for byte,
# flagged Idempotent-Replayed.
same() {
	if cmp -s "$DIR/$1.body" "$DIR/$2.body" && [[ $(header "$2" Idempotent-Replayed) == true ]]; then
		ok "$3"
	else
		not_ok "$3" "first: $(body "$1")" "replay: $(body "$2")" "replayed: $(header "$2" Idempotent-Replayed)"
	fi
}
key_row() { psql_at "$1" "SELECT status FROM idempotency_keys WHERE key = '$2'"; }

FLOW='{"type":"order","business_key":"O-1","input":{"n":1},"steps":[{"name":"s1","job_type":"pack"},{"name":"w","wait_for":"go"}]}'

# ---- a keyed create with a business key and steps, tenant a (partition 0)
expect "create: 201" "$(req c1 "$TA" POST /v1/workflows "$FLOW" kc1)" 201
W=$(py c1 'd["id"]')
expect "create: its Location" "$(header c1 Location)" "/v1/workflows/$W"
expect "create: replay 201" "$(req c1r "$TA" POST /v1/workflows "$FLOW" kc1)" 201
same c1 c1r "create: the replay is the first answer"
expect "create: the workflow, its event and its stored key on partition 0 only" \
	"$(psql_at "$P0" "SELECT (SELECT count(*) FROM workflows WHERE id = '$W'), (SELECT count(*) FROM outbox WHERE workflow_id = '$W'), (SELECT status FROM idempotency_keys WHERE key = 'kc1')")|$(psql_at "$P1" "SELECT count(*) FROM workflows")" \
	"1|1|201|0"
expect "create: another body under the key 409" \
	"$(req c1x "$TA" POST /v1/workflows '{"type":"order","business_key":"O-1"}' kc1)|$(problem_type c1x)" \
	"409|idempotency-key-reused"
expect "create: the same business key under another key answers the existing 200" \
	"$(req c2 "$TA" POST /v1/workflows "$FLOW" kc2)|$(py c2 'd["id"], d["existing"]')|$(header c2 Location)" \
	"200|('$W', True)|/v1/workflows/$W"

# ---- a job's activation and completion, a message
expect "activate: 200" "$(req a1 "$TA" POST /v1/jobs/activate '{"job_type":"pack","worker":"w1"}' ka1)" 200
expect "activate: the workflow's first job" "$(py a1 '[j["key"] for j in d["jobs"]]')" "['$W.s1']"
expect "activate: replay" "$(req a1r "$TA" POST /v1/jobs/activate '{"job_type":"pack","worker":"w1"}' ka1)" 200
same a1 a1r "activate: the replay is the first answer"
expect "activate: one activation" "$(psql_at "$P0" "SELECT state, activations FROM jobs WHERE workflow_id = '$W' AND step = 1")" "active|1"
expect "complete: 200" "$(req j1 "$TA" POST "/v1/jobs/$W.s1/complete" '{"worker":"w1","output":{"packed":true}}' kj1)" 200
expect "complete: replay" "$(req j1r "$TA" POST "/v1/jobs/$W.s1/complete" '{"worker":"w1","output":{"packed":true}}' kj1)" 200
same j1 j1r "complete: the replay is the first answer"
expect "message: 200 correlated" \
	"$(req m1 "$TA" POST "/v1/workflows/$W/messages" '{"message_id":"m1","name":"go","payload":{"p":1}}' km1)|$(body m1)" \
	'200|{"message_id":"m1","duplicate":false,"correlated":true,"step":2}'
expect "message: replay" "$(req m1r "$TA" POST "/v1/workflows/$W/messages" '{"message_id":"m1","name":"go","payload":{"p":1}}' km1)" 200
same m1 m1r "message: the replay is the first answer"
expect "the workflow completed, each command once: its events" \
	"$(psql_at "$P0" "SELECT string_agg(type, ',' ORDER BY seq) FROM outbox WHERE workflow_id = '$W'")" \
	"workflow.created,workflow.started,job.completed,job.completed,workflow.completed"

# ---- refusals: kept (422 invalid-transition) and not kept (404)
expect "transition of an ended workflow: 422 invalid-transition" \
	"$(req t1 "$TA" POST "/v1/workflows/$W/transitions" '{"to":"cancelled"}' kt1)|$(problem_type t1)" \
	"422|invalid-transition"
expect "kept under its key" "$(key_row "$P0" kt1)" 422
expect "replay" "$(req t1r "$TA" POST "/v1/workflows/$W/transitions" '{"to":"cancelled"}' kt1)" 422
same t1 t1r "the refusal's replay is the first answer"
NOWF=0190a0a0-0000-7000-8000-000000000001
expect "transition of no workflow: 404" \
	"$(req t2 "$TA" POST "/v1/workflows/$NOWF/transitions" '{"to":"cancelled"}' kt2)" 404
expect "and no key kept" "$(key_row "$P0" kt2)" ""

# ---- without a key, tenant b (partition 1)
expect "unkeyed create with a business key: 201" \
	"$(req u1 "$TB" POST /v1/workflows '{"type":"order","business_key":"B-1"}')" 201
U=$(py u1 'd["id"]')
expect "unkeyed cancel: 200 cancelled" \
	"$(req u2 "$TB" POST "/v1/workflows/$U/transitions" '{"to":"cancelled"}')|$(py u2 'd["state"]')" \
	"200|cancelled"
expect "on partition 1, with no key" \
	"$(psql_at "$P1" "SELECT (SELECT state FROM workflows WHERE id = '$U'), (SELECT count(*) FROM idempotency_keys)")" \
	"cancelled|0"

# ---- a command done whose answer was not stored: the store fails on
# the partition (a trigger refuses it), then works again.
block_store() {
	psql_at "$1" "CREATE FUNCTION t_refuse() RETURNS trigger LANGUAGE plpgsql AS \$\$ BEGIN RAISE EXCEPTION 'store refused by the test'; END \$\$; CREATE TRIGGER t_refuse BEFORE UPDATE ON idempotency_keys FOR EACH ROW WHEN (OLD.status = 1) EXECUTE FUNCTION t_refuse()" >/dev/null
}
unblock_store() { psql_at "$1" "DROP TRIGGER t_refuse ON idempotency_keys; DROP FUNCTION t_refuse()" >/dev/null; }

expect "unkeyed create for the lost answer" \
	"$(req v0 "$TB" POST /v1/workflows '{"type":"order","business_key":"B-2"}')" 201
V=$(py v0 'd["id"]')
block_store "$P1"
expect "cancel, its answer not stored: 503 unavailable" \
	"$(req v1 "$TB" POST "/v1/workflows/$V/transitions" '{"to":"cancelled"}' kv1)|$(problem_type v1)|$(py v1 'd["detail"]')" \
	"503|unavailable|the request took effect, but its answer could not be stored; send the same request with the same Idempotency-Key to receive it"
expect "the cancel took effect; the key keeps its rows (status 1)" \
	"$(psql_at "$P1" "SELECT (SELECT state FROM workflows WHERE id = '$V'), (SELECT status FROM idempotency_keys WHERE key = 'kv1')")" \
	"cancelled|1"
unblock_store "$P1"
expect "the same request: 200, rendered from the key's rows" \
	"$(req v2 "$TB" POST "/v1/workflows/$V/transitions" '{"to":"cancelled"}' kv1)|$(py v2 'd["id"], d["state"]')|$(header v2 Idempotent-Replayed)" \
	"200|('$V', 'cancelled')|true"
expect "now stored" "$(key_row "$P1" kv1)" 200
expect "again" "$(req v3 "$TB" POST "/v1/workflows/$V/transitions" '{"to":"cancelled"}' kv1)" 200
same v2 v3 "the stored answer is the one rendered from the rows"
expect "one cancel: one workflow.cancelled" \
	"$(psql_at "$P1" "SELECT count(*) FROM outbox WHERE workflow_id = '$V' AND type = 'workflow.cancelled'")" 1

block_store "$P1"
expect "a keyed create with a business key, its answer not stored: 503" \
	"$(req x1 "$TB" POST /v1/workflows '{"type":"order","business_key":"B-3"}' kx1)" 503
unblock_store "$P1"
X=$(psql_at "$P1" "SELECT id FROM workflows WHERE business_key = 'B-3'")
expect "the same request: 201 naming the one workflow made" \
	"$(req x2 "$TB" POST /v1/workflows '{"type":"order","business_key":"B-3"}' kx1)|$(py x2 'd["id"]')|$(header x2 Location)" \
	"201|$X|/v1/workflows/$X"
expect "one workflow with the business key" \
	"$(psql_at "$P1" "SELECT count(*) FROM workflows WHERE business_key = 'B-3'")" 1

block_store "$P1"
expect "a keyed endpoint create, its answer not stored: 503" \
	"$(req e1 "$TB" POST /v1/endpoints '{"url":"https://b.example/hook"}' ke1)" 503
unblock_store "$P1"
EP=$(psql_at "$P1" "SELECT id FROM endpoints")
expect "the same request: 201 naming the one endpoint made" \
	"$(req e2 "$TB" POST /v1/endpoints '{"url":"https://b.example/hook"}' ke1)|$(py e2 'd["id"]')|$(header e2 Location)" \
	"201|$EP|/v1/endpoints/$EP"
expect "replay" "$(req e3 "$TB" POST /v1/endpoints '{"url":"https://b.example/hook"}' ke1)" 201
same e2 e3 "the endpoint's replay is the stored answer"

# ---- 12 concurrent copies of one keyed create with a business key
BODY='{"type":"order","business_key":"B-9","input":{"copies":12}}'
for i in $(seq 1 12); do
	req "p$i" "$TB" POST /v1/workflows "$BODY" kp1 >"$DIR/p$i.status" &
done
wait
statuses=$(for i in $(seq 1 12); do cat "$DIR/p$i.status"; echo; done | sort | uniq -c | awk '{print $1 "x" $2}' | tr '\n' ' ')
expect "12 copies: all 201" "$statuses" "12x201 "
distinct=$(for i in $(seq 1 12); do md5sum <"$DIR/p$i.body"; done | sort -u | wc -l)
expect "one answer, byte for byte in every copy" "$distinct" 1
expect "one workflow, one key, stored" \
	"$(psql_at "$P1" "SELECT (SELECT count(*) FROM workflows WHERE business_key = 'B-9'), (SELECT status FROM idempotency_keys WHERE key = 'kp1')")" \
	"1|201"

# ---- a command that writes no event (a heartbeat) is fenced while its
# tenant moves (sql/031_keyed_commands_fenced.sql): tenant b frozen on
# partition 1.
TB_ID=$(psql_at "$P1" "SELECT id FROM tenants WHERE name = 'tb'")
expect "a create of one job step: 201" \
	"$(req f0 "$TB" POST /v1/workflows '{"type":"fenced","steps":[{"name":"s","job_type":"fence-job"}]}' kf0)" 201
F=$(py f0 'd["id"]')
expect "its job activated: 200" \
	"$(req f1 "$TB" POST /v1/jobs/activate '{"job_type":"fence-job","worker":"w"}')|$(py f1 '[j["key"] for j in d["jobs"]]')" \
	"200|['$F.s1']"
DEADLINE=$(psql_at "$P1" "SELECT due_at FROM jobs WHERE workflow_id = '$F'")
psql_at "$P1" "SELECT idemflow_tenant_freeze($TB_ID, 'source', 0)" >/dev/null
expect "frozen: a keyed heartbeat 503, the tenant is moving" \
	"$(req f2 "$TB" POST "/v1/jobs/$F.s1/heartbeat" '{"worker":"w","lease_seconds":600}' kf2)|$(problem_type f2)" \
	"503|unavailable"
expect "nothing written: no key, the lease as it was" \
	"$(psql_at "$P1" "SELECT (SELECT count(*) FROM idempotency_keys WHERE key = 'kf2'), (SELECT due_at = '$DEADLINE' FROM jobs WHERE workflow_id = '$F')")" \
	"0|t"
expect "frozen: an unkeyed heartbeat 503 too" \
	"$(req f3 "$TB" POST "/v1/jobs/$F.s1/heartbeat" '{"worker":"w","lease_seconds":600}')" 503
psql_at "$P1" "DELETE FROM frozen_tenants WHERE tenant_id = $TB_ID" >/dev/null
expect "thawed: the keyed heartbeat 200, stored" \
	"$(req f4 "$TB" POST "/v1/jobs/$F.s1/heartbeat" '{"worker":"w","lease_seconds":600}' kf2)|$(key_row "$P1" kf2)" \
	"200|200"

# ---- the commit level: every write of tenant b's requests committed at
# synchronous_commit on, whatever partition 1's default says.
expect "a plain keyed create: 201" "$(req pk1 "$TB" POST /v1/workflows '{"type":"plain"}' kpk1)" 201
expect "a plain unkeyed create: 201" "$(req pk2 "$TB" POST /v1/workflows '{"type":"plain"}')" 201
expect "a keyed cancel: 200" \
	"$(req pk3 "$TB" POST "/v1/workflows/$(py pk1 'd["id"]')/transitions" '{"to":"cancelled"}' kpk3)" 200
expect "every write at synchronous_commit on" \
	"$(psql_at "$P1" "SELECT string_agg(DISTINCT what || ' ' || level, ', ') FROM t_levels")" \
	"idempotency_keys INSERT on, idempotency_keys UPDATE on, workflows INSERT on, workflows UPDATE on"
expect "the partition's default is off" \
	"$(psql_at "$P1" "SELECT current_setting('synchronous_commit')")" off

shards_end
