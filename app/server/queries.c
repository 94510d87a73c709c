/* queries.c - the server's SQL, one table (see queries.h): each entry's name,
 * parameter count (the statement's parameter enum) and SQL, one clause per
 * line. */
#include "server/queries.h"

#include <stdio.h>
#include <string.h>

#define TS_UTC(col) "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

/* The keyed create, authenticating its own token: a plain keyed create is
 * one round trip. fail_clause is "" or, for the fault-injection variant, a
 * condition that fails only once the rows are written. The event's payload
 * comes in two parts around the tenant id, which only the token tells; the
 * actor of the key, the workflow and the event is the token the statement
 * found (sql/014_actor.sql). */
#define CREATE_KEYED_SQL(fail_clause)                                                              \
	"WITH t AS (\n"                                                                            \
	"  SELECT tenant_id, id, 'token:' || id AS actor\n"                                        \
	"    FROM api_tokens\n"                                                                    \
	"   WHERE token_hash = $1 AND revoked_at IS NULL\n"                                        \
	"), k AS (\n"                                                                              \
	"  INSERT INTO idempotency_keys (tenant_id, key, method, path, fingerprint, status,\n"     \
	"                                headers, body, created_at, expires_at,\n"                 \
	"                                request_bytes_fp, actor)\n"                               \
	"  SELECT tenant_id, $2, $3, $4, $5, 201, $6, $7, now(),\n"                                \
	"         now() + coalesce((SELECT idempotency_ttl\n"                                      \
	"                             FROM tenants\n"                                              \
	"                            WHERE id = t.tenant_id), $9::interval),\n"                    \
	"         $15, actor\n"                                                                    \
	"    FROM t\n"                                                                             \
	"      ON CONFLICT (tenant_id, key) DO NOTHING\n"                                          \
	"  RETURNING tenant_id, actor\n"                                                           \
	"), w AS (\n"                                                                              \
	"  INSERT INTO workflows (tenant_id, id, type, state, input, created_at, updated_at,\n"    \
	"                         traceparent, tracestate, actor)\n"                               \
	"  SELECT tenant_id, $10, $11, 'pending', $12, $8, $8, $17, $18, actor\n"                  \
	"    FROM k\n"                                                                             \
	"  RETURNING tenant_id, id, actor\n"                                                       \
	"), o AS (\n"                                                                              \
	"  INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload,\n"            \
	"                      created_at, next_attempt_at, traceparent, tracestate, actor)\n"     \
	"  SELECT $13, tenant_id, id, 1, 'workflow.created',\n"                                    \
	"         $14::text || tenant_id || $16::text, $8, now(), $17, $18, actor\n"               \
	"    FROM w\n"                                                                             \
	"  RETURNING 1\n"                                                                          \
	")\n"                                                                                      \
	"SELECT t.tenant_id, x.fingerprint, x.status, x.headers, x.body,\n"                        \
	"       x.expires_at <= now(), x.request_bytes_fp,\n"                                      \
	"       floor(extract(epoch FROM x.expires_at - now()) * 1000)::bigint, t.id,\n"           \
	"       CASE WHEN t.tenant_id IS NULL THEN 'unauthorized'\n"                               \
	"            WHEN EXISTS (SELECT 1 FROM o) THEN 'created'\n"                               \
	"            WHEN x.key IS NULL THEN 'taken'\n"                                            \
	"            ELSE 'existing' END\n"                                                        \
	"  FROM (VALUES (1)) AS one (n)\n"                                                         \
	"  LEFT JOIN t ON true\n"                                                                  \
	"  LEFT JOIN idempotency_keys x\n"                                                         \
	"         ON x.tenant_id = t.tenant_id AND x.key = $2\n"                                   \
	"        AND NOT EXISTS (SELECT 1 FROM k)\n" fail_clause

/* A workflow as the server renders it (wf.c, wf_write_row). */
#define WF_COLUMNS                                                                                 \
	"id, type, state, input::text, " TS_UTC("created_at") ", business_key, steps::text, step"

/* An endpoint as the server renders it (endpoints.c, ENDPOINTS_COL_*): the
 * secret is never among its columns. */
#define ENDPOINT_COLUMNS                                                                           \
	"e.id, e.url, to_json(e.filter_types)::text, e.ordering, e.disabled, e.disabled_reason,\n" \
	"       e.metadata::text, " TS_UTC("e.created_at") ", " TS_UTC("e.updated_at")

/* A command's first two columns for a row that may be missing: the
 * problem 'not-found' and its detail when it is. */
#define ENDPOINT_FOUND                                                                             \
	"CASE WHEN e.id IS NULL THEN 'not-found' END,\n"                                           \
	"       CASE WHEN e.id IS NULL THEN 'no such endpoint' END"

const struct db_stmt queries[Q__COUNT] = {
	[Q_AUTH] = { "auth", AUTH__N,
	             "SELECT tenant_id, id\n"
	             "  FROM api_tokens\n"
	             " WHERE token_hash = $1 AND revoked_at IS NULL\n" },

	[Q_AUTH_KEY] = { "auth_key", AUTH_KEY__N,
	                 "SELECT t.tenant_id, k.fingerprint, k.status, k.headers, k.body,\n"
	                 "       k.expires_at <= now(), k.request_bytes_fp,\n"
	                 "       floor(extract(epoch FROM k.expires_at - now()) * 1000)::bigint,\n"
	                 "       t.id\n"
	                 "  FROM api_tokens t\n"
	                 "  LEFT JOIN idempotency_keys k ON k.tenant_id = t.tenant_id AND k.key = $2\n"
	                 " WHERE t.token_hash = $1 AND t.revoked_at IS NULL\n" },

	[Q_CREATE_KEYED] = { "create_keyed", CREATE_KEYED__N, CREATE_KEYED_SQL("") },

	/* The event's payload as the keyed create's: around the tenant id. */
	[Q_CREATE_UNKEYED] = { "create_unkeyed", CREATE_UNKEYED__N,
	                       "WITH w AS (\n"
	                       "  INSERT INTO workflows (tenant_id, id, type, state, input,\n"
	                       "                         created_at, updated_at)\n"
	                       "  VALUES ($1, $3, $4, 'pending', $5, $2, $2)\n"
	                       "  RETURNING tenant_id, id\n"
	                       ")\n"
	                       "INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type,\n"
	                       "                    payload, created_at, next_attempt_at)\n"
	                       "SELECT $6, tenant_id, id, 1, 'workflow.created',\n"
	                       "       $7::text || tenant_id || $8::text, $2, now()\n"
	                       "  FROM w\n" },

	[Q_KEY_GET] = { "key_get", KEY_GET__N,
	                "SELECT 'existing', fingerprint, status, headers, body, expires_at <= now()\n"
	                "  FROM idempotency_keys\n"
	                " WHERE tenant_id = $1 AND key = $2\n" },

	/* The counts of the old key go with it: the key is new again. */
	[Q_KEY_DELETE_EXPIRED] = { "key_delete_expired", KEY_GET__N,
	                           "WITH d AS (\n"
	                           "  DELETE FROM idempotency_keys\n"
	                           "   WHERE tenant_id = $1 AND key = $2 AND expires_at <= now()\n"
	                           "  RETURNING tenant_id, key\n"
	                           ")\n"
	                           "DELETE FROM idempotency_key_stats s\n"
	                           " USING d\n"
	                           " WHERE s.tenant_id = d.tenant_id AND s.key = d.key\n" },

	[Q_KEY_REFRESH] = { "key_refresh", KEY_REFRESH__N,
	                    "UPDATE idempotency_keys\n"
	                    "   SET expires_at = greatest(expires_at, now() + coalesce(\n"
	                    "       (SELECT idempotency_ttl FROM tenants WHERE id = $1),\n"
	                    "       $3::interval))\n"
	                    " WHERE tenant_id = $1 AND key = $2\n" },

	[Q_CREATE_KEYED_FAIL] = { "create_keyed_fail", CREATE_KEYED__N,
	                          CREATE_KEYED_SQL(
	                              " WHERE 1 / (1 - (SELECT count(*) FROM o)) = 1\n") },

	/* Rows in (tenant_id, key) order, so two workers flushing the same
	 * keys lock them in the same order and cannot deadlock. */
	[Q_KEYSTATS_FLUSH] = { "keystats_flush", KEYSTATS_FLUSH__N,
	                       "INSERT INTO idempotency_key_stats AS s\n"
	                       "       (tenant_id, key, replays, conflicts, in_flight, last_seen)\n"
	                       "SELECT u.tenant_id, u.key, u.replays, u.conflicts, u.in_flight, now()\n"
	                       "  FROM unnest($1::bigint[], $2::text[], $3::int[], $4::int[], $5::int[])\n"
	                       "       AS u(tenant_id, key, replays, conflicts, in_flight)\n"
	                       "    ON CONFLICT (tenant_id, key) DO UPDATE\n"
	                       "   SET replays = s.replays + excluded.replays,\n"
	                       "       conflicts = s.conflicts + excluded.conflicts,\n"
	                       "       in_flight = s.in_flight + excluded.in_flight,\n"
	                       "       last_seen = excluded.last_seen\n" },

	[Q_SCHEMA_VERSION] = { "schema_version", 0,
	                       "SELECT coalesce(max(version), 0), pg_is_in_recovery(),\n"
	                       "       current_setting('transaction_read_only')\n"
	                       "  FROM schema_migrations\n" },

	/* Pending events are what the partial index outbox_due covers;
	 * dead ones are few (a dead event is an incident). Three aggregates
	 * of one row each: the jobs' reads only live jobs (the predicate of
	 * the jobs_rank index), never the finished ones; the workflows in
	 * incident are few too (the partial index workflows_incident). */
	[Q_METRICS_OUTBOX] = { "metrics_outbox", 0,
	                       "SELECT o.pending, o.oldest, o.dead,\n"
	                       "       j.activatable, j.leased, j.expired, i.incidents\n"
	                       "  FROM (SELECT count(*) AS pending,\n"
	                       "               coalesce(extract(epoch FROM now() - min(created_at)), 0)\n"
	                       "                   AS oldest,\n"
	                       "               (SELECT count(*) FROM outbox\n"
	                       "                 WHERE dead_at IS NOT NULL) AS dead\n"
	                       "          FROM outbox\n"
	                       "         WHERE published_at IS NULL AND dead_at IS NULL) o,\n"
	                       "       (SELECT count(*) FILTER (WHERE state = 'activatable')\n"
	                       "                   AS activatable,\n"
	                       "               count(*) FILTER (WHERE state = 'active'\n"
	                       "                   AND due_at > now()) AS leased,\n"
	                       "               count(*) FILTER (WHERE state = 'active'\n"
	                       "                   AND due_at <= now()) AS expired\n"
	                       "          FROM jobs\n"
	                       "         WHERE state IN ('activatable', 'active')) j,\n"
	                       "       (SELECT count(*) AS incidents FROM workflows\n"
	                       "         WHERE state = 'incident') i\n" },

	[Q_WF_GET] = { "wf_get", WF_GET__N,
	               "SELECT " WF_COLUMNS ",\n"
	               "       (SELECT j.progress FROM jobs j\n"
	               "         WHERE j.tenant_id = $1 AND j.workflow_id = w.id AND j.step = w.step)\n"
	               "  FROM workflows w\n"
	               " WHERE tenant_id = $1 AND id = $2\n" },
	[Q_NOTIFY] = { "notify", 0, "SELECT pg_notify('idemflow_outbox', '')\n" },

	[Q_BEGIN] = { "begin", 0, "BEGIN" },
	[Q_COMMIT] = { "commit", 0, "COMMIT" },
	[Q_ROLLBACK] = { "rollback", 0, "ROLLBACK" },
	[Q_KEY_CLAIM] = { "key_claim", KEY_CLAIM__N,
	                  "INSERT INTO idempotency_keys (tenant_id, key, method, path, fingerprint,\n"
	                  "                              status, headers, body, created_at, expires_at,\n"
	                  "                              request_bytes_fp, actor)\n"
	                  "VALUES ($1, $2, $3, $4, $5, 0, '', '', now(),\n"
	                  "        now() + coalesce((SELECT idempotency_ttl FROM tenants WHERE id = $1),\n"
	                  "                         $6::interval),\n"
	                  "        $7, $8)\n"
	                  "    ON CONFLICT (tenant_id, key) DO NOTHING\n"
	                  "RETURNING 1\n" },
	[Q_KEY_STORE] = { "key_store", KEY_STORE__N,
	                  "UPDATE idempotency_keys\n"
	                  "   SET status = $3, headers = $4, body = $5\n"
	                  " WHERE tenant_id = $1 AND key = $2\n" },
	/* The session's lock_timeout (idempotency_wait) goes with it: through
	 * a proxy the partition's session is the proxy's. */
	[Q_KEYED_COMMAND] = { "keyed_command", KEYED_COMMAND__N,
	                      "SELECT *\n"
	                      "  FROM idemflow_keyed_command($1, $2, $3, $4, $5, $6, $7, $8, $9,\n"
	                      "                              $10, $11, $12, $13,\n"
	                      "                              current_setting('lock_timeout'))\n" },
	[Q_KEY_STORE_ANSWER] = { "key_store_answer", KEY_STORE__N,
	                         "SELECT idemflow_key_store_answer($1, $2, $3, $4, $5)\n" },
	/* The event's payload as the keyed create's: around the tenant id. */
	[Q_WF_CREATE_RUN] = { "wf_create_run", WF_CREATE_RUN__N,
	                      "SELECT *\n"
	                      "  FROM idemflow_wf_create($1::bigint, $2, $3, $4, $5, $6, $7,\n"
	                      "                          $8::text || $1::bigint || $9::text,\n"
	                      "                          $10::smallint)\n" },
	[Q_WF_TRANSITION] = { "wf_transition", WF_TRANSITION__N,
	                      "SELECT *\n"
	                      "  FROM idemflow_wf_transition($1, $2, $3, $4)\n" },
	[Q_WF_MESSAGE] = { "wf_message", WF_MESSAGE__N,
	                   "SELECT *\n"
	                   "  FROM idemflow_wf_message($1, $2, $3, $4, $5)\n" },
	/* The jobs' trace context is read beside the function, not by it:
	 * the row before the activation has it as well (it never changes). */
	[Q_JOBS_ACTIVATE] = { "jobs_activate", JOBS_ACTIVATE__N,
	                      "SELECT a.*,\n"
	                      "       (SELECT j.traceparent FROM jobs j\n"
	                      "         WHERE j.tenant_id = $1 AND j.workflow_id = a.workflow_id\n"
	                      "           AND j.step = a.step) AS traceparent,\n"
	                      "       (SELECT j.tracestate FROM jobs j\n"
	                      "         WHERE j.tenant_id = $1 AND j.workflow_id = a.workflow_id\n"
	                      "           AND j.step = a.step) AS tracestate\n"
	                      "  FROM idemflow_jobs_activate($1, $2, $3, $4, $5::interval,\n"
	                      "                              $6::bigint) a\n" },
	[Q_JOB_COMPLETE] = { "job_complete", JOB_COMPLETE__N,
	                     "SELECT *\n"
	                     "  FROM idemflow_job_complete($1, $2, $3, $4, $5)\n" },
	[Q_JOB_FAIL] = { "job_fail", JOB_FAIL__N,
	                 "SELECT *\n"
	                 "  FROM idemflow_job_fail($1, $2, $3, $4, $5, $6::interval)\n" },
	/* Pages: at most $limit rows (the caller asks for one more than it
	 * shows), each with "within": it starts within the byte budget (the
	 * last parameter). Rows stop after the first one past the budget, so a
	 * worker never receives much more than it may answer, and a row beyond
	 * the ones shown says there is a next page (wf.c). The list walks the
	 * index one row at a time so that PostgreSQL sizes only those rows;
	 * an event's text is sized without reading it. */
	[Q_WF_EVENTS] = { "wf_events", WF_EVENTS__N,
	                  "SELECT e.seq, e.payload, e.within, e.actor\n"
	                  "  FROM workflows w\n"
	                  "  LEFT JOIN LATERAL (\n"
	                  "       SELECT seq, payload, start < $5::bigint AS within, actor\n"
	                  "         FROM (SELECT seq, payload, actor, start,\n"
	                  "                      lag(start, 1, 0::bigint) OVER (ORDER BY seq) AS prev\n"
	                  "                 FROM (SELECT seq, payload, actor,\n"
	                  "                              sum(octet_length(payload)::bigint)\n"
	                  "                                  OVER (ORDER BY seq)\n"
	                  "                              - octet_length(payload) AS start\n"
	                  "                         FROM (SELECT seq, payload, actor\n"
	                  "                                 FROM outbox o\n"
	                  "                                WHERE o.tenant_id = w.tenant_id\n"
	                  "                                  AND o.workflow_id = w.id\n"
	                  "                                  AND o.seq > $3\n"
	                  "                                ORDER BY seq\n"
	                  "                                LIMIT $4) l) s) t\n"
	                  "        WHERE prev < $5::bigint) e ON true\n"
	                  " WHERE w.tenant_id = $1 AND w.id = $2\n"
	                  " ORDER BY e.seq\n" },
	[Q_WF_LIST] = { "wf_list", WF_LIST__N,
	                "WITH RECURSIVE page AS (\n"
	                "  (SELECT w.*, 1 AS n, 0::bigint AS start,\n"
	                "          octet_length(w.input::text)::bigint + octet_length(w.steps::text)\n"
	                "              AS run\n"
	                "     FROM workflows w\n"
	                "    WHERE w.tenant_id = $1 AND ($2::text IS NULL OR w.state = $2)\n"
	                "      AND ($3::text IS NULL OR w.type = $3)\n"
	                "      AND ($4::uuid IS NULL OR w.id > $4)\n"
	                "    ORDER BY w.id\n"
	                "    LIMIT 1)\n"
	                "  UNION ALL\n"
	                "  SELECT w.*, p.n + 1, p.run,\n"
	                "         p.run + octet_length(w.input::text) + octet_length(w.steps::text)\n"
	                "    FROM page p\n"
	                "   CROSS JOIN LATERAL (\n"
	                "         SELECT *\n"
	                "           FROM workflows w\n"
	                "          WHERE w.tenant_id = $1 AND ($2::text IS NULL OR w.state = $2)\n"
	                "            AND ($3::text IS NULL OR w.type = $3) AND w.id > p.id\n"
	                "          ORDER BY w.id\n"
	                "          LIMIT 1) w\n"
	                "   WHERE p.n < $5 AND p.start < $6::bigint\n"
	                ")\n"
	                "SELECT " WF_COLUMNS ", start < $6::bigint\n"
	                "  FROM page\n"
	                " ORDER BY id\n" },
	/* Heartbeats and incidents (sql/009_incidents.sql). */
	[Q_JOB_HEARTBEAT] = { "job_heartbeat", JOB_HEARTBEAT__N,
	                      "SELECT *\n"
	                      "  FROM idemflow_job_heartbeat($1, $2, $3, $4, $5::interval, $6)\n" },
	[Q_WF_RESUME] = { "wf_resume", WF_RESUME__N,
	                  "SELECT *\n"
	                  "  FROM idemflow_wf_resume($1, $2, $3::integer)\n" },
	/* The request's trace context and actor for the rest of its
	 * transaction: the traceparent, tracestate and actor columns' default
	 * (sql/008_trace.sql, sql/014_actor.sql). */
	[Q_TRACE_SET] = { "trace_set", TRACE_SET__N,
	                  "SELECT set_config('idemflow.traceparent', coalesce($1, ''), true),\n"
	                  "       set_config('idemflow.tracestate', coalesce($2, ''), true),\n"
	                  "       set_config('idemflow.actor', coalesce($3, ''), true)\n" },

	/* POST /v1/messages: by business key (sql/010_timers.sql). */
	[Q_MESSAGE_PUBLISH] = { "message_publish", MESSAGE_PUBLISH__N,
	                        "SELECT *\n"
	                        "  FROM idemflow_message_publish(\n"
	                        "       $1, $2, $3, $4, $5::interval, $6,\n"
	                        "       $7::bigint * interval '1 millisecond')\n" },

	/* Tenant endpoints (sql/020_endpoints.sql, endpoints.c). */
	[Q_ENDPOINT_CREATE] = { "endpoint_create", ENDPOINT_CREATE__N,
	                        "WITH e AS (\n"
	                        "  INSERT INTO endpoints (tenant_id, id, url, filter_types, ordering,\n"
	                        "                         disabled, disabled_reason, disabled_at,\n"
	                        "                         metadata, secret, actor)\n"
	                        "  VALUES ($1, $2, $3, $4::text[], $5, $6::boolean,\n"
	                        "          CASE WHEN $6::boolean THEN 'manual' END,\n"
	                        "          CASE WHEN $6::boolean THEN now() END,\n"
	                        "          $7::jsonb, $8, $9)\n"
	                        "  RETURNING *\n"
	                        ")\n"
	                        "SELECT NULL::text, NULL::text, " ENDPOINT_COLUMNS "\n"
	                        "  FROM e\n" },
	[Q_ENDPOINT_GET] = { "endpoint_get", ENDPOINT_GET__N,
	                     "SELECT " ENDPOINT_COLUMNS "\n"
	                     "  FROM endpoints e\n"
	                     " WHERE e.tenant_id = $1 AND e.id = $2\n" },
	/* A page as Q_WF_EVENTS's: at most $3 rows, each with "within", and
	 * none after the first past the byte budget $4. */
	[Q_ENDPOINT_LIST] = { "endpoint_list", ENDPOINT_LIST__N,
	                      "SELECT " ENDPOINT_COLUMNS ", e.start < $4::bigint\n"
	                      "  FROM (SELECT s.*,\n"
	                      "               lag(s.start, 1, 0::bigint) OVER (ORDER BY s.id) AS prev\n"
	                      "          FROM (SELECT l.*,\n"
	                      "                       sum(l.size) OVER (ORDER BY l.id) - l.size AS start\n"
	                      "                  FROM (SELECT x.*,\n"
	                      "                               octet_length(x.url)::bigint\n"
	                      "                               + octet_length(x.metadata::text)\n"
	                      "                               + coalesce(octet_length(x.filter_types::text), 0)\n"
	                      "                               + 200 AS size\n"
	                      "                          FROM endpoints x\n"
	                      "                         WHERE x.tenant_id = $1\n"
	                      "                           AND ($2::uuid IS NULL OR x.id > $2::uuid)\n"
	                      "                         ORDER BY x.id\n"
	                      "                         LIMIT $3) l) s) e\n"
	                      " WHERE e.prev < $4::bigint\n"
	                      " ORDER BY e.id\n" },
	/* disabled = true keeps an endpoint that is already disabled as it
	 * is (its reason and since when); false enables it and forgets its
	 * failures. */
	[Q_ENDPOINT_UPDATE] = { "endpoint_update", ENDPOINT_UPDATE__N,
	                        "WITH e AS (\n"
	                        "  UPDATE endpoints\n"
	                        "     SET url = coalesce($3, url),\n"
	                        "         filter_types = CASE WHEN $4::boolean THEN $5::text[]\n"
	                        "                             ELSE filter_types END,\n"
	                        "         ordering = coalesce($6, ordering),\n"
	                        "         disabled = coalesce($7::boolean, disabled),\n"
	                        "         disabled_reason = CASE WHEN $7::boolean IS NULL OR\n"
	                        "                                     ($7::boolean AND disabled)\n"
	                        "                                THEN disabled_reason\n"
	                        "                                WHEN $7::boolean THEN 'manual' END,\n"
	                        "         disabled_at = CASE WHEN $7::boolean IS NULL OR\n"
	                        "                                 ($7::boolean AND disabled)\n"
	                        "                            THEN disabled_at\n"
	                        "                            WHEN $7::boolean THEN now() END,\n"
	                        "         failures = CASE WHEN NOT $7::boolean THEN 0 ELSE failures END,\n"
	                        "         failing_since = CASE WHEN NOT $7::boolean THEN NULL\n"
	                        "                              ELSE failing_since END,\n"
	                        "         metadata = coalesce($8::jsonb, metadata),\n"
	                        "         updated_at = now(),\n"
	                        "         actor = $9\n"
	                        "   WHERE tenant_id = $1 AND id = $2\n"
	                        "  RETURNING *\n"
	                        ")\n"
	                        "SELECT " ENDPOINT_FOUND ",\n"
	                        "       " ENDPOINT_COLUMNS "\n"
	                        "  FROM (VALUES (1)) AS one (n)\n"
	                        "  LEFT JOIN e ON true\n" },
	/* No foreign keys (sql/020_endpoints.sql): the endpoint's deliveries
	 * and attempts go in the same statement. */
	[Q_ENDPOINT_DELETE] = { "endpoint_delete", ENDPOINT_GET__N,
	                        "WITH e AS (\n"
	                        "  DELETE FROM endpoints\n"
	                        "   WHERE tenant_id = $1 AND id = $2\n"
	                        "  RETURNING id\n"
	                        "), d AS (\n"
	                        "  DELETE FROM deliveries\n"
	                        "   WHERE tenant_id = $1 AND endpoint_id = $2\n"
	                        "     AND EXISTS (SELECT 1 FROM e)\n"
	                        "  RETURNING 1\n"
	                        "), a AS (\n"
	                        "  DELETE FROM delivery_attempts\n"
	                        "   WHERE tenant_id = $1 AND endpoint_id = $2\n"
	                        "     AND EXISTS (SELECT 1 FROM e)\n"
	                        "  RETURNING 1\n"
	                        ")\n"
	                        "SELECT " ENDPOINT_FOUND ",\n"
	                        "       e.id, (SELECT count(*) FROM d), (SELECT count(*) FROM a)\n"
	                        "  FROM (VALUES (1)) AS one (n)\n"
	                        "  LEFT JOIN e ON true\n" },
	/* A previous secret past its end no longer signs: not shown. */
	[Q_ENDPOINT_SECRET] = { "endpoint_secret", ENDPOINT_GET__N,
	                        "SELECT secret,\n"
	                        "       CASE WHEN previous_secret_until > now() THEN previous_secret END,\n"
	                        "       CASE WHEN previous_secret_until > now()\n"
	                        "            THEN " TS_UTC(
	                            "previous_secret_until") " END\n"
	                                                     "  FROM endpoints\n"
	                                                     " WHERE tenant_id = $1 AND id = $2\n" },
	/* The current secret signs on, beside the new one, for the grace
	 * period; a zero grace drops it at once. Only two: a previous secret
	 * still in its grace is replaced. */
	[Q_ENDPOINT_ROTATE] = { "endpoint_rotate", ENDPOINT_ROTATE__N,
	                        "WITH e AS (\n"
	                        "  UPDATE endpoints\n"
	                        "     SET previous_secret = CASE WHEN $4::interval > interval '0'\n"
	                        "                                THEN secret END,\n"
	                        "         previous_secret_until = CASE WHEN $4::interval > interval '0'\n"
	                        "                                      THEN now() + $4::interval END,\n"
	                        "         secret = $3,\n"
	                        "         updated_at = now(),\n"
	                        "         actor = $5\n"
	                        "   WHERE tenant_id = $1 AND id = $2\n"
	                        "  RETURNING id, previous_secret_until, updated_at\n"
	                        ")\n"
	                        "SELECT " ENDPOINT_FOUND ",\n"
	                        "       e.id, " TS_UTC(
	                            "e.previous_secret_until") ",\n"
	                                                       "       " TS_UTC(
	                                                           "e.updated_at") "\n"
	                                                                           "  FROM (VALUES (1)) AS one (n)\n"
	                                                                           "  LEFT JOIN e ON true\n" },
	[Q_ENDPOINT_REVOKE] = { "endpoint_revoke", ENDPOINT_REVOKE__N,
	                        "WITH e AS (\n"
	                        "  UPDATE endpoints\n"
	                        "     SET previous_secret = NULL,\n"
	                        "         previous_secret_until = NULL,\n"
	                        "         updated_at = now(),\n"
	                        "         actor = $3\n"
	                        "   WHERE tenant_id = $1 AND id = $2\n"
	                        "  RETURNING id, previous_secret_until, updated_at\n"
	                        ")\n"
	                        "SELECT " ENDPOINT_FOUND ",\n"
	                        "       e.id, " TS_UTC(
	                            "e.previous_secret_until") ",\n"
	                                                       "       " TS_UTC(
	                                                           "e.updated_at") "\n"
	                                                                           "  FROM (VALUES (1)) AS one (n)\n"
	                                                                           "  LEFT JOIN e ON true\n" },
	/* The event feed (events.c): the outbox's ids in order, at most $5
	 * rows of every tenant read per page (only their ids and tenants:
	 * no index on (tenant_id, id) to keep up on every create); the
	 * tenant's rows among them paged as Q_WF_EVENTS. When the scan used
	 * up its $5 rows, a last row (the last id read, NULL) says where the
	 * next page starts, even when no event of the tenant was among them;
	 * its NULL payload sorts it after an event of the same id.
	 * The operational events (endpoint.*, delivery.*) are the
	 * operator's, as in the outbox_deliveries trigger. */
	[Q_EVENTS_FEED] = { "events_feed", EVENTS_FEED__N,
	                    "WITH s AS MATERIALIZED (\n"
	                    "  SELECT id, tenant_id\n"
	                    "    FROM outbox\n"
	                    "   WHERE id > $2\n"
	                    "   ORDER BY id\n"
	                    "   LIMIT $5\n"
	                    ")\n"
	                    "SELECT id, payload, within, actor\n"
	                    "  FROM (SELECT id, payload, actor, start < $4::bigint AS within,\n"
	                    "               lag(start, 1, 0::bigint) OVER (ORDER BY id) AS prev\n"
	                    "          FROM (SELECT id, payload, actor,\n"
	                    "                       sum(octet_length(payload)::bigint) OVER (ORDER BY id)\n"
	                    "                       - octet_length(payload) AS start\n"
	                    "                  FROM (SELECT o.id, o.payload, o.actor\n"
	                    "                          FROM s\n"
	                    "                          JOIN outbox o ON o.id = s.id\n"
	                    "                         WHERE s.tenant_id = $1\n"
	                    "                           AND o.type NOT LIKE 'endpoint.%'\n"
	                    "                           AND o.type NOT LIKE 'delivery.%'\n"
	                    "                         ORDER BY s.id\n"
	                    "                         LIMIT $3) l) t) f\n"
	                    " WHERE prev < $4::bigint\n"
	                    " UNION ALL\n"
	                    "SELECT max(id), NULL, true, NULL\n"
	                    "  FROM s\n"
	                    "HAVING count(*) = $5::bigint\n"
	                    " ORDER BY 1, 2\n" },
	/* One event's deliveries: one primary key probe per endpoint of the
	 * tenant, in endpoint id order (deliveries have no index by event). */
	[Q_EVENT_DELIVERIES] = { "event_deliveries", EVENT_DELIVERIES__N,
	                         "SELECT x.endpoint_id, o.event_id, x.state, x.attempts,\n"
	                         "       " TS_UTC(
	                             "x.next_attempt_at") ", x.last_error,\n"
	                                                  "       " TS_UTC(
	                                                      "x.updated_at") ", x.within\n"
	                                                                      "  FROM outbox o\n"
	                                                                      "  LEFT JOIN LATERAL (\n"
	                                                                      "       SELECT t.*, start < $5::bigint AS within\n"
	                                                                      "         FROM (SELECT l.*,\n"
	                                                                      "                      lag(start, 1, 0::bigint) OVER (ORDER BY endpoint_id)\n"
	                                                                      "                          AS prev\n"
	                                                                      "                 FROM (SELECT d.endpoint_id, d.state, d.attempts,\n"
	                                                                      "                              d.next_attempt_at, d.last_error, d.updated_at,\n"
	                                                                      "                              sum(200 + octet_length(coalesce(d.last_error, ''))::bigint)\n"
	                                                                      "                                  OVER (ORDER BY d.endpoint_id)\n"
	                                                                      "                              - 200 - octet_length(coalesce(d.last_error, ''))\n"
	                                                                      "                                  AS start\n"
	                                                                      "                         FROM (SELECT e.id\n"
	                                                                      "                                 FROM endpoints e\n"
	                                                                      "                                WHERE e.tenant_id = o.tenant_id\n"
	                                                                      "                                  AND ($3::uuid IS NULL OR e.id > $3)\n"
	                                                                      "                                ORDER BY e.id) e\n"
	                                                                      "                         JOIN deliveries d\n"
	                                                                      "                           ON d.tenant_id = o.tenant_id AND d.endpoint_id = e.id\n"
	                                                                      "                          AND d.workflow_id = o.workflow_id AND d.seq = o.seq\n"
	                                                                      "                        ORDER BY d.endpoint_id\n"
	                                                                      "                        LIMIT $4) l) t\n"
	                                                                      "        WHERE prev < $5::bigint) x ON true\n"
	                                                                      " WHERE o.event_id = $2 AND o.tenant_id = $1\n"
	                                                                      " ORDER BY x.endpoint_id\n" },
	/* One endpoint's attempts, newest first, backwards along the ledger's
	 * primary key; a filter is applied to the rows as they are read. */
	[Q_ENDPOINT_ATTEMPTS] = { "endpoint_attempts", ENDPOINT_ATTEMPTS__N,
	                          "SELECT x.id, x.event_id, x.trigger, " TS_UTC(
	                              "x.started_at") ",\n"
	                                              "       x.duration_ms, x.status, x.outcome, x.response, x.within\n"
	                                              "  FROM endpoints e\n"
	                                              "  LEFT JOIN LATERAL (\n"
	                                              "       SELECT t.*, start < $7::bigint AS within\n"
	                                              "         FROM (SELECT l.*,\n"
	                                              "                      lag(start, 1, 0::bigint) OVER (ORDER BY id DESC)\n"
	                                              "                          AS prev\n"
	                                              "                 FROM (SELECT a.id, a.event_id, a.trigger, a.started_at,\n"
	                                              "                              a.duration_ms, a.status, a.outcome, a.response,\n"
	                                              "                              sum(300 + octet_length(a.response)::bigint)\n"
	                                              "                                  OVER (ORDER BY a.id DESC)\n"
	                                              "                              - 300 - octet_length(a.response) AS start\n"
	                                              "                         FROM delivery_attempts a\n"
	                                              "                        WHERE a.tenant_id = e.tenant_id AND a.endpoint_id = e.id\n"
	                                              "                          AND ($3::bigint IS NULL OR a.id < $3)\n"
	                                              "                          AND ($4::text IS NULL\n"
	                                              "                               OR ($4 = 'succeeded') = (a.outcome = 'succeeded'))\n"
	                                              "                          AND ($5::integer IS NULL OR a.status = $5)\n"
	                                              "                        ORDER BY a.id DESC\n"
	                                              "                        LIMIT $6) l) t\n"
	                                              "        WHERE prev < $7::bigint) x ON true\n"
	                                              " WHERE e.tenant_id = $1 AND e.id = $2\n"
	                                              " ORDER BY x.id DESC\n" },
	/* One endpoint's deliveries in the given states, along the
	 * deliveries' primary key (the event's stream and seq). */
	[Q_ENDPOINT_UNDELIVERED] = { "endpoint_undelivered", ENDPOINT_UNDELIVERED__N,
	                             "SELECT x.event_id, x.endpoint_id, x.state, x.attempts,\n"
	                             "       " TS_UTC(
	                                 "x.next_attempt_at") ", x.last_error,\n"
	                                                      "       " TS_UTC(
	                                                          "x.updated_at") ", x.within\n"
	                                                                          "  FROM endpoints e\n"
	                                                                          "  LEFT JOIN LATERAL (\n"
	                                                                          "       SELECT t.*, start < $7::bigint AS within\n"
	                                                                          "         FROM (SELECT l.*,\n"
	                                                                          "                      lag(start, 1, 0::bigint)\n"
	                                                                          "                          OVER (ORDER BY workflow_id, seq) AS prev\n"
	                                                                          "                 FROM (SELECT d.workflow_id, d.seq,\n"
	                                                                          "                              d.workflow_id || '.' || d.seq AS event_id,\n"
	                                                                          "                              d.endpoint_id, d.state, d.attempts,\n"
	                                                                          "                              d.next_attempt_at, d.last_error, d.updated_at,\n"
	                                                                          "                              sum(200 + octet_length(coalesce(d.last_error, ''))::bigint)\n"
	                                                                          "                                  OVER (ORDER BY d.workflow_id, d.seq)\n"
	                                                                          "                              - 200 - octet_length(coalesce(d.last_error, ''))\n"
	                                                                          "                                  AS start\n"
	                                                                          "                         FROM deliveries d\n"
	                                                                          "                        WHERE d.tenant_id = e.tenant_id AND d.endpoint_id = e.id\n"
	                                                                          "                          AND d.state = ANY ($5::text[])\n"
	                                                                          "                          AND ($3::uuid IS NULL\n"
	                                                                          "                               OR (d.workflow_id, d.seq) > ($3::uuid, $4::integer))\n"
	                                                                          "                        ORDER BY d.workflow_id, d.seq\n"
	                                                                          "                        LIMIT $6) l) t\n"
	                                                                          "        WHERE prev < $7::bigint) x ON true\n"
	                                                                          " WHERE e.tenant_id = $1 AND e.id = $2\n"
	                                                                          " ORDER BY x.workflow_id, x.seq\n" },
	/* Recover and resend (sql/022_recover.sql). */
	[Q_ENDPOINT_RECOVER] = { "endpoint_recover", ENDPOINT_RECOVER__N,
	                         "SELECT *\n"
	                         "  FROM idemflow_endpoint_recover($1, $2, $3::timestamptz,\n"
	                         "                                 coalesce($4::timestamptz, now()),\n"
	                         "                                 $5::text[], $6::text[])\n" },
	[Q_EVENT_RESEND] = { "event_resend", EVENT_RESEND__N,
	                     "SELECT problem, detail, endpoint_id, event_id, state, attempts,\n"
	                     "       " TS_UTC("next_attempt_at") ", last_error, " TS_UTC(
	                         "updated_at") "\n"
	                                       "  FROM idemflow_event_resend($1, $2, $3)\n" },
	/* GET /metrics: the disabled endpoints (endpoints are few), and the
	 * pending deliveries (the rows of the partial index deliveries_due)
	 * in total and of the $1 endpoints with the most: a bounded number of
	 * label values however many endpoints there are. The first row has
	 * the totals, the others one endpoint each. */
	[Q_METRICS_DELIVERIES] = { "metrics_deliveries", METRICS_DELIVERIES__N,
	                           "SELECT 0 AS k, (SELECT count(*) FROM endpoints WHERE disabled),\n"
	                           "       count(*), NULL::bigint, NULL::uuid\n"
	                           "  FROM deliveries\n"
	                           " WHERE state = 'pending'\n"
	                           " UNION ALL\n"
	                           "SELECT 1, NULL, n, tenant_id, endpoint_id\n"
	                           "  FROM (SELECT tenant_id, endpoint_id, count(*) AS n\n"
	                           "          FROM deliveries\n"
	                           "         WHERE state = 'pending'\n"
	                           "         GROUP BY tenant_id, endpoint_id\n"
	                           "         ORDER BY n DESC, tenant_id, endpoint_id\n"
	                           "         LIMIT $1) t\n"
	                           " ORDER BY k, 3 DESC, 4, 5\n" },
};

/*
 * routing = proxy: the statements as calls of the proxy's functions of the
 * same names (sql/proxy/001_proxy.sql), each run on one partition (or, for
 * the flush, the schema version and the metrics, on all of them), where it
 * is the function of sql/024_partition_functions.sql. Statements that need
 * no table (transaction control, the trace context, a notification) run
 * on the proxy as they are; every other one is refused there
 * (idemflow_unrouted) rather than run against its empty database.
 */
static const struct {
	enum query_id id;
	const char *sql;
} proxied[] = {
	{ Q_AUTH, "SELECT * FROM idemflow_auth($1)\n" },
	{ Q_AUTH_KEY, "SELECT * FROM idemflow_auth_key($1, $2)\n" },
	/* With the session's lock_timeout (idempotency_wait), for the wait on
	 * a concurrent owner of the key in the partition's session. */
	{ Q_CREATE_KEYED, "SELECT *\n"
	                  "  FROM idemflow_create_keyed($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,\n"
	                  "                             $11, $12, $13, $14, $15, $16, $17, $18,\n"
	                  "                             current_setting('lock_timeout'))\n" },
	{ Q_KEY_GET, "SELECT * FROM idemflow_key_get($1, $2)\n" },
	{ Q_KEY_DELETE_EXPIRED, "SELECT idemflow_key_delete_expired($1, $2)\n" },
	{ Q_KEY_REFRESH, "SELECT idemflow_key_refresh($1, $2, $3)\n" },
	{ Q_WF_GET, "SELECT * FROM idemflow_wf_get($1, $2)\n" },
	{ Q_WF_EVENTS, "SELECT * FROM idemflow_wf_events($1, $2, $3, $4, $5)\n" },
	/* The trace context and actor that Q_TRACE_SET set for the proxy's
	 * transaction, passed on to the partition's. */
	{ Q_CREATE_UNKEYED,
	  "SELECT idemflow_create_unkeyed($1, $2, $3, $4, $5, $6, $7, $8,\n"
	  "                               current_setting('idemflow.traceparent', true),\n"
	  "                               current_setting('idemflow.tracestate', true),\n"
	  "                               current_setting('idemflow.actor', true))\n" },
	{ Q_WF_LIST, "SELECT * FROM idemflow_wf_list($1, $2, $3, $4, $5, $6)\n" },
	{ Q_ENDPOINT_GET, "SELECT * FROM idemflow_endpoint_get($1, $2)\n" },
	{ Q_ENDPOINT_LIST, "SELECT * FROM idemflow_endpoint_list($1, $2, $3, $4)\n" },
	{ Q_EVENTS_FEED, "SELECT * FROM idemflow_events_feed($1, $2, $3, $4, $5)\n" },
	{ Q_ENDPOINT_SECRET, "SELECT * FROM idemflow_endpoint_secret($1, $2)\n" },
	{ Q_EVENT_DELIVERIES, "SELECT * FROM idemflow_event_deliveries($1, $2, $3, $4, $5)\n" },
	{ Q_ENDPOINT_ATTEMPTS,
	  "SELECT * FROM idemflow_endpoint_attempts($1, $2, $3, $4, $5, $6, $7)\n" },
	{ Q_ENDPOINT_UNDELIVERED,
	  "SELECT * FROM idemflow_endpoint_undelivered($1, $2, $3, $4, $5, $6, $7)\n" },
	/* The keyed commands of two round trips: cmd.c. */
	{ Q_KEYED_COMMAND, NULL },
	{ Q_KEY_STORE_ANSWER, NULL },
	{ Q_KEYSTATS_FLUSH, "SELECT count(*)\n"
	                    "  FROM idemflow_keystats_flush($1, $2, $3, $4, $5)\n" },
	/* Ready when every partition is: the lowest version, any in
	 * recovery, any read-only; then each partition's state (JSON) and
	 * the numbers of those that did not answer ("" when all did), and
	 * how many did. */
	{ Q_SCHEMA_VERSION,
	  "SELECT coalesce(min(version), 0), coalesce(bool_or(in_recovery), false),\n"
	  "       coalesce(max(read_only), 'off'),\n"
	  "       coalesce(jsonb_agg(jsonb_build_object('partition', partition,\n"
	  "                                             'reachable', error IS NULL,\n"
	  "                                             'schema_version', version)\n"
	  "                          ORDER BY partition)::text, '[]'),\n"
	  "       coalesce(string_agg(partition::text, ',' ORDER BY partition)\n"
	  "                    FILTER (WHERE error IS NOT NULL), ''),\n"
	  "       count(*) FILTER (WHERE error IS NULL)\n"
	  "  FROM idemflow_partitions_status()\n" },
	/* The sums over the partitions that answered, then how many
	 * partitions there are and the numbers of those that did not answer
	 * ("" when all did): METRICS_COL_PARTITIONS, _UNREACHABLE. */
	{ Q_METRICS_OUTBOX, "SELECT coalesce(sum(pending), 0), coalesce(max(oldest), 0),\n"
	                    "       coalesce(sum(dead), 0), coalesce(sum(activatable), 0),\n"
	                    "       coalesce(sum(leased), 0), coalesce(sum(expired), 0),\n"
	                    "       coalesce(sum(incidents), 0), count(*),\n"
	                    "       coalesce(string_agg(partition::text, ',' ORDER BY partition)\n"
	                    "                    FILTER (WHERE error IS NOT NULL), '')\n"
	                    "  FROM idemflow_metrics_outbox_by_partition()\n" },
	/* The rows of the server's statement: the totals summed over the
	 * partitions that answered, with the partitions' columns as
	 * Q_METRICS_OUTBOX's (METRICS_DELIVERIES_COL_PARTITIONS,
	 * _UNREACHABLE), then the $1 endpoints with the most pending
	 * deliveries across the partitions' own tops of $1. */
	{ Q_METRICS_DELIVERIES,
	  "WITH d AS (SELECT * FROM idemflow_metrics_deliveries_by_partition($1::integer))\n"
	  "SELECT 0 AS k, coalesce(sum(d.disabled), 0)::bigint,\n"
	  "       coalesce(sum(d.pending) FILTER (WHERE d.k = 0), 0)::bigint,\n"
	  "       NULL::bigint, NULL::uuid, count(DISTINCT d.partition),\n"
	  "       coalesce(string_agg(d.partition::text, ',' ORDER BY d.partition)\n"
	  "                    FILTER (WHERE d.error IS NOT NULL), '')\n"
	  "  FROM d\n"
	  " UNION ALL\n"
	  "SELECT 1, NULL, t.n, t.tenant_id, t.endpoint_id, NULL, NULL\n"
	  "  FROM (SELECT d.tenant_id, d.endpoint_id, sum(d.pending)::bigint AS n\n"
	  "          FROM d\n"
	  "         WHERE d.k = 1\n"
	  "         GROUP BY d.tenant_id, d.endpoint_id\n"
	  "         ORDER BY n DESC, d.tenant_id, d.endpoint_id\n"
	  "         LIMIT $1::integer) t\n"
	  " ORDER BY k, 3 DESC, 4, 5\n" },
	{ Q_NOTIFY, NULL },
	{ Q_BEGIN, NULL },
	{ Q_COMMIT, NULL },
	{ Q_ROLLBACK, NULL },
	{ Q_TRACE_SET, NULL },
};

static struct db_stmt proxy_queries[Q__COUNT];
/* The refusals' SQL: "SELECT idemflow_unrouted('name', $1::text, ...)". */
static char unrouted_sql[Q__COUNT][64 + 48 + 12 * 24];

static void proxy_init(void)
{
	for (int i = 0; i < Q__COUNT; i++) {
		size_t off;
		int j, n;

		proxy_queries[i] = queries[i];
		for (j = 0; j < (int)(sizeof(proxied) / sizeof(proxied[0])); j++)
			if ((int)proxied[j].id == i)
				break;
		if (j < (int)(sizeof(proxied) / sizeof(proxied[0]))) {
			if (proxied[j].sql != NULL)
				proxy_queries[i].sql = proxied[j].sql;
			continue;
		}
		n = queries[i].nparams;
		off = (size_t)snprintf(unrouted_sql[i], sizeof(unrouted_sql[i]),
		                       "SELECT idemflow_unrouted('%s'", queries[i].name);
		for (int k = 1; k <= n && off < sizeof(unrouted_sql[i]); k++)
			off += (size_t)snprintf(unrouted_sql[i] + off,
			                        sizeof(unrouted_sql[i]) - off, ", $%d::text", k);
		if (off < sizeof(unrouted_sql[i]))
			snprintf(unrouted_sql[i] + off, sizeof(unrouted_sql[i]) - off, ")\n");
		proxy_queries[i].sql = unrouted_sql[i];
	}
}

const struct db_stmt *queries_for(const char *routing)
{
	static int proxy_ready;

	if (routing == NULL || strcmp(routing, "direct") == 0)
		return queries;
	if (strcmp(routing, "proxy") != 0)
		return NULL;
	if (!proxy_ready) {
		proxy_init();
		proxy_ready = 1;
	}
	return proxy_queries;
}

int queries_check(struct err *e)
{
	const struct db_stmt *proxy = queries_for("proxy");

	for (int i = 0; i < Q__COUNT; i++)
		if (db_stmt_check(&queries[i], e) < 0 || db_stmt_check(&proxy[i], e) < 0)
			return -1;
	return 0;
}
