#!/usr/bin/env bash
# t/shards/test_shards_move.sh - moving a tenant to another partition
# ("idemflow tenant move", doc/distribution.md, "Moving a tenant"): two
# partitions behind a PL/Proxy proxy, tenant a on partition 0 with keys,
# workflows, events, an endpoint and its deliveries, a job, a timer, a
# message and a delivery attempt; tenant b on partition 1.
#   - the fence: a frozen tenant's event is refused (IDFMV), its timers,
#     jobs and events skipped by reap and the dispatcher; an event
#     transaction open when the move starts commits before the copy and
#     moves with it;
#   - a move that fails (the target refuses a row) is undone: tenant a
#     stays on partition 0, served, nothing of it on partition 1;
#   - with clients creating keyed workflows for both tenants and a
#     dispatcher per partition running, tenant a moves 0 -> 1: every key
#     answered before replays byte for byte from partition 1, each retried
#     key has one workflow on one partition, the counts match, partition 0
#     keeps nothing of tenant a, tenant b never saw an error, every event
#     was delivered; the longest refusal is printed.
# Starts its own proxy and partitions as t/shards/test_shards.sh does.
set -euo pipefail

source "${top_srcdir:?run me from make check}/t/shards/lib.sh"
# How many keyed workflows tenant a has before the move.
N=${MOVE_WORKFLOWS:-200}
shards_start test_shards_move
# The clients and dispatchers this test starts in the background go first.
BG=()
trap 'for p in "${BG[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; shards_cleanup' EXIT
PROXY=$DATABASE_URL
"$CLI" --db "$P0" tenant create tc >/dev/null || exit 99
stack_shards_sync || exit 99
A=$(psql_at "$P0" "SELECT id FROM tenants WHERE name = 'ta'")
C=$(psql_at "$P0" "SELECT id FROM tenants WHERE name = 'tc'")
shards_serve "workers = 3" "replay_cache_ttl = 0" "retry_after = 1" "timeout = 10s"

# The operator's configuration: the proxy and the partitions.
cat >"$DIR/ops.conf" <<EOT
db = $PROXY
partitions = $P0; $P1
sink = exec
exec = echo "\$IDEMFLOW_EVENT_ID" >>$DIR/delivered
endpoints = false
lease = 5s
timeout = 2s
EOT

# post NAME TOKEN KEY BODY: POST /v1/workflows; status to stdout, the
# answer in $DIR/NAME.body and its headers in $DIR/NAME.head.
post() {
	curl -sS --max-time 20 -o "$DIR/$1.body" -D "$DIR/$1.head" -w '%{http_code}' \
		-X POST "$URL/v1/workflows" -H "Authorization: Bearer $2" \
		-H 'Content-Type: application/json' -H "Idempotency-Key: $3" -d "$4"
}
header() { tr -d '\r' <"$DIR/$1.head" | sed -n "s/^$2: //Ip"; }
counts() { psql_at "$1" "SELECT string_agg(tbl || '=' || n, ' ') FROM idemflow_tenant_counts($2)"; }

expect "partition ids: both partitions draw their ids from their own range" \
	"$(psql_at "$P0" "SELECT idemflow_partition_ids_in_range(0)")|$(psql_at "$P1" "SELECT idemflow_partition_ids_in_range(1)")|$(psql_at "$P1" "SELECT last_value >= 2^48 FROM outbox_id_seq")|$(psql_at "$P1" "SELECT last_value >= 2^48 FROM delivery_attempts_id_seq")" \
	"t|t|t|t"
psql_at "$P1" "SELECT idemflow_partition_ids(1)" >/dev/null
expect "partition ids: set again, still in range" "$(psql_at "$P1" "SELECT idemflow_partition_ids_in_range(1)")" t

# ---- tenant a's rows: an endpoint (every event gets a delivery), keyed
# workflows, a job, a timer, a message, a delivery attempt
psql_at "$P0" "INSERT INTO endpoints (tenant_id, id, url, secret) VALUES ($A, gen_random_uuid(), 'http://127.0.0.1:9/hook', 'whsec_' || repeat('A', 32))" >/dev/null
bad=0
for ((i = 1; i <= N; i++)); do
	code=$(post "k$i" "$TA" "k$i" "{\"type\":\"t\",\"input\":{\"n\":$i}}")
	[[ $code == 201 ]] || bad=$((bad + 1))
done
expect "tenant a: $N keyed creates 201" "$bad" 0
WF1=$(psql_at "$P0" "SELECT id FROM workflows WHERE tenant_id = $A ORDER BY created_at LIMIT 1")
psql_at "$P0" "INSERT INTO jobs (tenant_id, workflow_id, step, name, job_type, state, due_at, worker, created_at, updated_at) VALUES ($A, '$WF1', 1, 'j', 'x', 'active', now() + interval '1 h', 'w', now(), now());
INSERT INTO timers (tenant_id, workflow_id, step, kind, due_at, created_at) VALUES ($A, '$WF1', 1, 'sleep', now() + interval '1 h', now());
INSERT INTO messages (tenant_id, message_id, workflow_id, name, payload, received_at) VALUES ($A, 'm1', '$WF1', 'paid', '{}', now());
INSERT INTO delivery_attempts (tenant_id, endpoint_id, workflow_id, seq, event_id, trigger, started_at, duration_ms, status, outcome) SELECT tenant_id, endpoint_id, workflow_id, seq, '$WF1.1', 'scheduled', now(), 1, 500, 'http' FROM deliveries WHERE tenant_id = $A LIMIT 1" >/dev/null

# ---- the fence, on tenant c of partition 0
psql_at "$P0" "INSERT INTO workflows (tenant_id, id, type, input, created_at, updated_at) VALUES ($C, gen_random_uuid(), 't', '{}', now(), now());
INSERT INTO timers (tenant_id, workflow_id, step, kind, due_at, created_at) SELECT $C, id, 1, 'sleep', now() - interval '1 s', now() FROM workflows WHERE tenant_id = $C;
INSERT INTO jobs (tenant_id, workflow_id, step, name, job_type, state, due_at, worker, created_at, updated_at) SELECT $C, id, 1, 'j', 'x', 'active', now() - interval '1 s', 'w', now(), now() FROM workflows WHERE tenant_id = $C" >/dev/null
psql_at "$P0" "SELECT idemflow_tenant_freeze($C, 'source', 1)" >/dev/null
out=$("$BINDIR/psql" -XAtq -v VERBOSITY=sqlstate -d "$P0" -c "INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload) SELECT id || '.1', tenant_id, id, 1, 'workflow.created', '{}' FROM workflows WHERE tenant_id = $C" 2>&1) || true
expect "fence: an event of a frozen tenant is refused (IDFMV)" "$out" "ERROR:  IDFMV"
out=$("$BINDIR/psql" -XAtq -v VERBOSITY=sqlstate -d "$P0" -c "SELECT idemflow_tenant_fence($C)" 2>&1) || true
expect "fence: idemflow_tenant_fence refuses a frozen tenant (IDFMV)" "$out" "ERROR:  IDFMV"
out=$("$CLI" --db "$P0" reap 2>&1) || true
expect "fence: reap leaves a frozen tenant's job and timer alone" \
	"$out|$(psql_at "$P0" "SELECT state FROM jobs WHERE tenant_id = $C")|$(psql_at "$P0" "SELECT count(*) FROM timers WHERE tenant_id = $C AND fired_at IS NULL")" \
	"reap: jobs=0|active|1"
expect "fence: the directory's sync does not see a frozen tenant's tokens" \
	"$(psql_at "$P0" "SELECT count(*) FROM idemflow_partition_tokens(0) WHERE tenant_id = $C")" 0
psql_at "$P0" "SELECT idemflow_tenant_delete($C)" >/dev/null
expect "fence: idemflow_tenant_delete leaves nothing of the tenant" \
	"$(counts "$P0" "$C")|$(psql_at "$P0" "SELECT count(*) FROM frozen_tenants")" \
	"tenants=0 api_tokens=0 endpoints=0 workflows=0 jobs=0 messages=0 timers=0 idempotency_keys=0 idempotency_key_stats=0 outbox=0 deliveries=0 delivery_attempts=0|0"

# ---- a tenant marked moving: 503 with Retry-After, from no partition
psql_at "$PROXY" "UPDATE idemflow_tenant_partitions SET moving_to = 1, moving_since = now() WHERE tenant_id = $A" >/dev/null
expect "marked moving: a create 503, Retry-After, says why" \
	"$(post mv1 "$TA" mv1 '{"type":"t","input":{}}')|$(header mv1 Retry-After)|$(grep -c 'being moved to another partition' "$DIR/mv1.body")" "503|1|1"
expect "marked moving: a replay 503 too; tenant b 201" \
	"$(post mv2 "$TA" k1 '{"type":"t","input":{"n":1}}')|$(post mv3 "$TB" mv3 '{"type":"t","input":{}}')" "503|201"
psql_at "$PROXY" "UPDATE idemflow_tenant_partitions SET moving_to = NULL, moving_since = NULL WHERE tenant_id = $A" >/dev/null
expect "marked moving: nothing stored on either partition" \
	"$(psql_at "$P0" "SELECT count(*) FROM idempotency_keys WHERE key = 'mv1'")|$(psql_at "$P1" "SELECT count(*) FROM idempotency_keys WHERE key = 'mv1'")" "0|0"

# ---- one move of a tenant at a time
"$BINDIR/psql" -XAtq -d "$PROXY" -c "SELECT pg_advisory_lock(hashtextextended('idemflow.tenant_move', $A::bigint)), pg_sleep(3)" >/dev/null 2>&1 &
HOLD=$!
sleep 1
rc=0
"$CLI" --config "$DIR/ops.conf" tenant move ta --to 1 >"$DIR/busy.out" 2>&1 || rc=$?
wait "$HOLD" || true
expect "a second move of the tenant at once: refused, 75, nothing marked" \
	"$rc|$(grep -c 'another move of tenant ta is running' "$DIR/busy.out")|$(psql_at "$PROXY" "SELECT partition, moving_to IS NULL FROM idemflow_tenant_partitions WHERE tenant_id = $A")" \
	"75|1|0|t"

# ---- a move that fails is undone: partition 1 refuses one workflow
psql_at "$P0" "INSERT INTO workflows (tenant_id, id, type, input, created_at, updated_at) VALUES ($A, gen_random_uuid(), 'poison', '{}', now(), now())" >/dev/null
psql_at "$P1" "ALTER TABLE workflows ADD CONSTRAINT no_poison CHECK (type <> 'poison') NOT VALID" >/dev/null
BEFORE_FAIL=$(counts "$P0" "$A")
rc=0
"$CLI" --config "$DIR/ops.conf" tenant move ta --to 1 >"$DIR/fail.out" 2>&1 || rc=$?
expect "failed move: exit 75, undone" "$rc|$(grep -c 'undone: tenant ta stays on partition 0' "$DIR/fail.out")" "75|1"
expect "failed move: the directory names partition 0, not moving" \
	"$(psql_at "$PROXY" "SELECT partition, moving_to IS NULL FROM idemflow_tenant_partitions WHERE tenant_id = $A")" "0|t"
expect "failed move: partition 0 unchanged and unfrozen, partition 1 has nothing of tenant a" \
	"$(counts "$P0" "$A")|$(psql_at "$P0" "SELECT count(*) FROM frozen_tenants")|$(psql_at "$P1" "SELECT count(*) FROM frozen_tenants")|$(psql_at "$P1" "SELECT count(*) FROM workflows WHERE tenant_id = $A")" \
	"$BEFORE_FAIL|0|0|0"
expect "failed move: tenant a is served (a replay 201, a create 201)" \
	"$(post r1 "$TA" k1 '{"type":"t","input":{"n":1}}')|$(header r1 Idempotent-Replayed)|$(post f1 "$TA" f1 '{"type":"t","input":{}}')" \
	"201|true|201"
psql_at "$P1" "ALTER TABLE workflows DROP CONSTRAINT no_poison" >/dev/null
psql_at "$P0" "DELETE FROM workflows WHERE tenant_id = $A AND type = 'poison'" >/dev/null

# ---- the move, under load
# The answers to replay afterwards: the N keys' first answers.
for ((i = 1; i <= N; i++)); do
	cp "$DIR/k$i.body" "$DIR/orig$i.body"
done
BEFORE=$(counts "$P0" "$A")

# clients NAME TOKEN: keyed creates, one key after another, each sent
# again until it is not 503; a line "key status t_ms" per answer.
client() {
	local name=$1 token=$2 i=0 code
	while [[ ! -e $DIR/stop ]]; do
		i=$((i + 1))
		while :; do
			code=$(curl -sS --max-time 20 -o /dev/null -w '%{http_code}' -X POST "$URL/v1/workflows" \
				-H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
				-H "Idempotency-Key: $name-$i" -d "{\"type\":\"t\",\"input\":{\"c\":$i}}") || code=000
			echo "$name-$i $code $(date +%s%3N)" >>"$DIR/$name.log"
			[[ $code == 503 || $code == 000 ]] || break
			sleep 0.05
		done
	done
}
client la "$TA" &
BG+=($!)
client lb "$TB" &
BG+=($!)
"$DISPATCH" --config "$DIR/ops.conf" --loop --partition 0 >"$DIR/d0.log" 2>&1 &
BG+=($!)
"$DISPATCH" --config "$DIR/ops.conf" --loop --partition 1 >"$DIR/d1.log" 2>&1 &
BG+=($!)
sleep 1

# An event transaction of tenant a open when the move starts: the freeze
# waits for it, and its workflow moves.
"$BINDIR/psql" -XAtq -v ON_ERROR_STOP=1 -d "$P0" >"$DIR/open.out" 2>&1 <<EOT &
BEGIN;
INSERT INTO workflows (tenant_id, id, type, input, created_at, updated_at)
VALUES ($A, 'f0f0f0f0-0000-4000-8000-000000000001', 'open', '{}', now(), now());
INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload)
VALUES ('f0f0f0f0-0000-4000-8000-000000000001.1', $A, 'f0f0f0f0-0000-4000-8000-000000000001', 1,
        'workflow.created', '{}');
SELECT pg_sleep(1.5);
COMMIT;
EOT
OPEN=$!
sleep 0.5
rc=0
"$CLI" --config "$DIR/ops.conf" tenant move ta --to 1 >"$DIR/move.out" 2>"$DIR/move.err" || rc=$?
wait "$OPEN" || true
expect "move: exit 0" "$rc|$(cat "$DIR/move.err")" "0|"
echo "# $(cat "$DIR/move.out")"
sleep 1
touch "$DIR/stop"
for p in "${BG[@]:0:2}"; do
	wait "$p" || true
done

expect "move: the directory names partition 1, not moving" \
	"$(psql_at "$PROXY" "SELECT partition, moving_to IS NULL FROM idemflow_tenant_partitions WHERE tenant_id = $A")" "1|t"
expect "move: partition 0 keeps nothing of tenant a, nothing frozen" \
	"$(counts "$P0" "$A")|$(psql_at "$P0" "SELECT count(*) FROM frozen_tenants")|$(psql_at "$P1" "SELECT count(*) FROM frozen_tenants")" \
	"tenants=0 api_tokens=0 endpoints=0 workflows=0 jobs=0 messages=0 timers=0 idempotency_keys=0 idempotency_key_stats=0 outbox=0 deliveries=0 delivery_attempts=0|0|0"
expect "move: the transaction open at the start committed before the copy and moved" \
	"$(psql_at "$P1" "SELECT count(*) FROM workflows WHERE id = 'f0f0f0f0-0000-4000-8000-000000000001'")|$(psql_at "$P1" "SELECT count(*) FROM outbox WHERE event_id = 'f0f0f0f0-0000-4000-8000-000000000001.1'")|$(grep -c ERROR "$DIR/open.out" || true)" \
	"1|1|0"

# The loop's keys: each answered 201 in the end, one workflow each, on
# partition 1 only.
LA=$(awk '$2 == 201 {print $1}' "$DIR/la.log" | sort -u | wc -l)
LA_ALL=$(awk '{print $1}' "$DIR/la.log" | sort -u | wc -l)
expect "clients: every key of tenant a answered 201 in the end" "$LA" "$LA_ALL"
expect "clients: tenant a's keys answered 201 or 503, nothing else" \
	"$(awk '$2 != 201 && $2 != 503' "$DIR/la.log" | wc -l)" 0
expect "clients: one workflow per key of tenant a's clients, all on partition 1" \
	"$(psql_at "$P1" "SELECT count(*), count(DISTINCT k.key) FROM idempotency_keys k JOIN workflows w ON w.tenant_id = k.tenant_id AND w.input = jsonb_build_object('c', substr(k.key, 4)::int) WHERE k.tenant_id = $A AND k.key LIKE 'la-%'")" \
	"$LA|$LA"
expect "clients: tenant b's answers all 201" \
	"$(awk '$2 != 201' "$DIR/lb.log" | wc -l)|$(($(wc -l <"$DIR/lb.log") > 0))" "0|1"

# Counts: what was there, plus the open transaction's workflow and event
# and the clients' creates (each a workflow, an event, a key and a
# delivery to the endpoint).
want=$(echo "$BEFORE" | awk -v la="$LA" '{
	for (i = 1; i <= NF; i++) {
		split($i, kv, "=")
		v = kv[2]
		if (kv[1] == "workflows" || kv[1] == "outbox") v += la + 1
		if (kv[1] == "deliveries") v += la + 1
		if (kv[1] == "idempotency_keys") v += la
		if (kv[1] == "idempotency_key_stats") v = "S"
		printf "%s%s=%s", (i > 1 ? " " : ""), kv[1], v
	}
}')
got=$(counts "$P1" "$A" | sed 's/idempotency_key_stats=[0-9]*/idempotency_key_stats=S/')
expect "counts: workflows, events, keys, deliveries, jobs, timers, messages, attempts as before the move, plus the new ones" \
	"$got" "$want"
echo "# before: $BEFORE"
echo "# after:  $(counts "$P1" "$A")"

# Every key answered before the move replays byte for byte from partition 1.
bad=0
for ((i = 1; i <= N; i++)); do
	code=$(post "rp$i" "$TA" "k$i" "{\"type\":\"t\",\"input\":{\"n\":$i}}")
	if [[ $code != 201 || $(header "rp$i" Idempotent-Replayed) != true ]] ||
		! cmp -s "$DIR/orig$i.body" "$DIR/rp$i.body"; then
		bad=$((bad + 1))
	fi
done
expect "replays: the $N keys answered before the move, byte for byte, from partition 1" "$bad" 0
expect "after the move: tenant a's new create is on partition 1" \
	"$(post new1 "$TA" new1 '{"type":"t","input":{"new":1}}')|$(psql_at "$P1" "SELECT count(*) FROM idempotency_keys WHERE tenant_id = $A AND key = 'new1'")|$(psql_at "$P0" "SELECT count(*) FROM idempotency_keys WHERE key = 'new1'")" \
	"201|1|0"

# Delivery: every event of both tenants, once at least, by the dispatchers.
for ((i = 0; i < 100; i++)); do
	[[ $(psql_at "$P0" "SELECT count(*) FROM outbox WHERE published_at IS NULL")$(psql_at "$P1" "SELECT count(*) FROM outbox WHERE published_at IS NULL") == 00 ]] && break
	sleep 0.2
done
missing=$(comm -23 <({ psql_at "$P0" "SELECT event_id FROM outbox"; psql_at "$P1" "SELECT event_id FROM outbox"; } | sort -u) <(sort -u "$DIR/delivered") | wc -l)
expect "delivery: every event of both partitions delivered" "$missing" 0
echo "# delivered $(wc -l <"$DIR/delivered") times for $(sort -u "$DIR/delivered" | wc -l) events"

# The outage: the longest time tenant a's clients got only 503s.
awk '$2 == 503 && !s {s = $3} $2 != 503 && s {d = $3 - s; if (d > m) m = d; s = 0} END {print "# outage: tenant a refused (503) for at most " m + 0 " ms in a row, seen by its clients"}' "$DIR/la.log"
echo "# tenant a: $(awk '$2 == 503' "$DIR/la.log" | wc -l) answers 503 of $(wc -l <"$DIR/la.log")"

# ---- a move stopped half-way: undone by a move to the old partition,
# finished by the same move again; then back to partition 0
psql_at "$PROXY" "UPDATE idemflow_tenant_partitions SET moving_to = 0, moving_since = now() WHERE tenant_id = $A" >/dev/null
psql_at "$P1" "SELECT idemflow_tenant_freeze($A, 'source', 0)" >/dev/null
rc=0
"$CLI" --config "$DIR/ops.conf" tenant move ta --to 1 >"$DIR/undo.out" 2>&1 || rc=$?
expect "stopped move: undone with --to the old partition, served there" \
	"$rc|$(psql_at "$PROXY" "SELECT partition, moving_to IS NULL FROM idemflow_tenant_partitions WHERE tenant_id = $A")|$(psql_at "$P1" "SELECT count(*) FROM frozen_tenants")|$(post u1 "$TA" k2 '{"type":"t","input":{"n":2}}')" \
	"0|1|t|0|201"
psql_at "$PROXY" "UPDATE idemflow_tenant_partitions SET moving_to = 0, moving_since = now() WHERE tenant_id = $A" >/dev/null
psql_at "$P1" "SELECT idemflow_tenant_freeze($A, 'source', 0)" >/dev/null
AFTER=$(counts "$P1" "$A")
rc=0
"$CLI" --config "$DIR/ops.conf" tenant move ta --to 0 >"$DIR/back.out" 2>&1 || rc=$?
expect "stopped move: finished by the same move, back to partition 0 with every row" \
	"$rc|$(psql_at "$PROXY" "SELECT partition, moving_to IS NULL FROM idemflow_tenant_partitions WHERE tenant_id = $A")|$(counts "$P0" "$A")|$(counts "$P1" "$A")" \
	"0|0|t|$AFTER|tenants=0 api_tokens=0 endpoints=0 workflows=0 jobs=0 messages=0 timers=0 idempotency_keys=0 idempotency_key_stats=0 outbox=0 deliveries=0 delivery_attempts=0"
expect "back on partition 0: a replay byte for byte, a create 201" \
	"$(post b1 "$TA" k3 '{"type":"t","input":{"n":3}}')|$(cmp -s "$DIR/orig3.body" "$DIR/b1.body" && echo same)|$(post b2 "$TA" b2 '{"type":"t","input":{}}')" \
	"201|same|201"

if ((fails)); then
	stack_tail "$DIR/d0.log" 10
	stack_tail "$DIR/d1.log" 10
fi
shards_end
