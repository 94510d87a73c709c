/* queries.c - the server's SQL, one table (see queries.h): each entry's name,
 * parameter count (the statement's parameter enum) and SQL. */
#include "server/queries.h"

#define TS_UTC(col) "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"

/* The keyed create, authenticating its own token: a plain keyed create is
 * one round trip. fail_clause is "" or, for the fault-injection variant, a
 * condition that fails only once the rows are written. The event's payload
 * comes in two parts around the tenant id, which only the token tells; the
 * actor of the key, the workflow and the event is the token the statement
 * found (sql/014_actor.sql). */
#define CREATE_KEYED(fail_clause)                                                                  \
	"WITH t AS ("                                                                              \
	"  SELECT tenant_id, id, 'token:' || id AS actor FROM api_tokens"                          \
	"   WHERE token_hash = $1 AND revoked_at IS NULL"                                          \
	"), k AS ("                                                                                \
	"  INSERT INTO idempotency_keys (tenant_id, key, method, path, fingerprint, status,"       \
	"                                headers, body, created_at, expires_at, request_bytes_fp," \
	"                                actor)"                                                   \
	"  SELECT tenant_id, $2, $3, $4, $5, 201, $6, $7, now(), now() + coalesce("                \
	"    (SELECT idempotency_ttl FROM tenants WHERE id = t.tenant_id), $9::interval), $15,"    \
	"    actor"                                                                                \
	"    FROM t"                                                                               \
	"  ON CONFLICT (tenant_id, key) DO NOTHING"                                                \
	"  RETURNING tenant_id, actor"                                                             \
	"), w AS ("                                                                                \
	"  INSERT INTO workflows (tenant_id, id, type, state, input, created_at, updated_at,"      \
	"                         traceparent, tracestate, actor)"                                 \
	"  SELECT tenant_id, $10, $11, 'pending', $12, $8, $8, $17, $18, actor FROM k"             \
	"  RETURNING tenant_id, id, actor"                                                         \
	"), o AS ("                                                                                \
	"  INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, payload,"              \
	"                      created_at, next_attempt_at, traceparent, tracestate, actor)"       \
	"  SELECT $13, tenant_id, id, 1, 'workflow.created', $14::text || tenant_id || $16::text," \
	"         $8, now(), $17, $18, actor FROM w"                                               \
	"  RETURNING 1"                                                                            \
	")"                                                                                        \
	" SELECT t.tenant_id, x.fingerprint, x.status, x.headers, x.body, x.expires_at <= now(),"  \
	"        x.request_bytes_fp,"                                                              \
	"        floor(extract(epoch FROM x.expires_at - now()) * 1000)::bigint, t.id,"            \
	"        CASE WHEN t.tenant_id IS NULL THEN 'unauthorized'"                                \
	"             WHEN EXISTS (SELECT 1 FROM o) THEN 'created'"                                \
	"             WHEN x.key IS NULL THEN 'taken' ELSE 'existing' END"                         \
	"   FROM (VALUES (1)) AS one (n)"                                                          \
	"   LEFT JOIN t ON true"                                                                   \
	"   LEFT JOIN idempotency_keys x ON x.tenant_id = t.tenant_id AND x.key = $2"              \
	"                               AND NOT EXISTS (SELECT 1 FROM k)" fail_clause

/* A workflow as the server renders it (wf.c, wf_write_row). */
#define WF_COLUMNS                                                                                 \
	"id, type, state, input::text, " TS_UTC("created_at") ", business_key, steps::text, step"

const struct db_stmt queries[Q__COUNT] = {
	[Q_AUTH] = { "auth", AU__N,
	             "SELECT tenant_id, id FROM api_tokens WHERE token_hash = $1 AND revoked_at "
	             "IS NULL" },

	[Q_AUTH_KEY] = { "auth_key", AK__N,
	                 "SELECT t.tenant_id, k.fingerprint, k.status, k.headers, k.body,"
	                 "       k.expires_at <= now(), k.request_bytes_fp,"
	                 "       floor(extract(epoch FROM k.expires_at - now()) * 1000)::bigint,"
	                 "       t.id"
	                 "  FROM api_tokens t"
	                 "  LEFT JOIN idempotency_keys k ON k.tenant_id = t.tenant_id AND k.key = "
	                 "$2"
	                 " WHERE t.token_hash = $1 AND t.revoked_at IS NULL" },

	[Q_CREATE_KEYED] = { "create_keyed", CK__N, CREATE_KEYED("") },

	[Q_CREATE_UNKEYED] = { "create_unkeyed", CU__N,
	                       "WITH w AS ("
	                       "  INSERT INTO workflows (tenant_id, id, type, state, input, "
	                       "created_at, updated_at)"
	                       "  VALUES ($1, $3, $4, 'pending', $5, $2, $2)"
	                       "  RETURNING tenant_id, id"
	                       ")"
	                       " INSERT INTO outbox (event_id, tenant_id, workflow_id, seq, type, "
	                       "payload, created_at,"
	                       "                     next_attempt_at)"
	                       " SELECT $6, tenant_id, id, 1, 'workflow.created', $7, $2, now() "
	                       "FROM w" },

	[Q_KEY_GET] = { "key_get", KG__N,
	                "SELECT 'existing', fingerprint, status, headers, body, expires_at <= now()"
	                "  FROM idempotency_keys WHERE tenant_id = $1 AND key = $2" },

	/* The counts of the old key go with it: the key is new again. */
	[Q_KEY_DELETE_EXPIRED] = { "key_delete_expired", KG__N,
	                           "WITH d AS ("
	                           "  DELETE FROM idempotency_keys"
	                           "   WHERE tenant_id = $1 AND key = $2 AND expires_at <= now()"
	                           "  RETURNING tenant_id, key"
	                           ")"
	                           " DELETE FROM idempotency_key_stats s USING d"
	                           "  WHERE s.tenant_id = d.tenant_id AND s.key = d.key" },

	[Q_KEY_REFRESH] = { "key_refresh", KR__N,
	                    "UPDATE idempotency_keys"
	                    "   SET expires_at = greatest(expires_at, now() + coalesce("
	                    "       (SELECT idempotency_ttl FROM tenants WHERE id = $1),"
	                    "       $3::interval))"
	                    " WHERE tenant_id = $1 AND key = $2" },

	[Q_CREATE_KEYED_FAIL] = { "create_keyed_fail", CK__N,
	                          CREATE_KEYED(" WHERE 1 / (1 - (SELECT count(*) FROM o)) = 1") },

	/* Rows in (tenant_id, key) order, so two workers flushing the same
	 * keys lock them in the same order and cannot deadlock. */
	[Q_KEYSTATS_FLUSH] = { "keystats_flush", KF__N,
	                       "INSERT INTO idempotency_key_stats AS s"
	                       "       (tenant_id, key, replays, conflicts, in_flight, last_seen)"
	                       " SELECT u.tenant_id, u.key, u.replays, u.conflicts, u.in_flight, "
	                       "now()"
	                       "   FROM unnest($1::bigint[], $2::text[], $3::int[], $4::int[], "
	                       "$5::int[])"
	                       "        AS u(tenant_id, key, replays, conflicts, in_flight)"
	                       " ON CONFLICT (tenant_id, key) DO UPDATE"
	                       "    SET replays = s.replays + excluded.replays,"
	                       "        conflicts = s.conflicts + excluded.conflicts,"
	                       "        in_flight = s.in_flight + excluded.in_flight,"
	                       "        last_seen = excluded.last_seen" },

	[Q_SCHEMA_VERSION] = { "schema_version", 0,
	                       "SELECT coalesce(max(version), 0), pg_is_in_recovery(),"
	                       "       current_setting('transaction_read_only')"
	                       "  FROM schema_migrations" },

	/* Pending events are what the partial index outbox_due covers;
	 * dead ones are few (a dead event is an incident). Three aggregates
	 * of one row each: the jobs' reads only live jobs (the predicate of
	 * the jobs_due index), never the finished ones; the workflows in
	 * incident are few too (the partial index workflows_incident). */
	[Q_METRICS_OUTBOX] = { "metrics_outbox", 0,
	                       "SELECT o.pending, o.oldest, o.dead,"
	                       "       j.activatable, j.leased, j.expired, i.incidents"
	                       "  FROM (SELECT count(*) AS pending,"
	                       "               coalesce(extract(epoch FROM now() - "
	                       "min(created_at)), 0) AS oldest,"
	                       "               (SELECT count(*) FROM outbox"
	                       "                 WHERE dead_at IS NOT NULL) AS dead"
	                       "          FROM outbox"
	                       "         WHERE published_at IS NULL AND dead_at IS NULL) o,"
	                       "       (SELECT count(*) FILTER (WHERE state = 'activatable')"
	                       "                   AS activatable,"
	                       "               count(*) FILTER (WHERE state = 'active'"
	                       "                   AND due_at > now()) AS leased,"
	                       "               count(*) FILTER (WHERE state = 'active'"
	                       "                   AND due_at <= now()) AS expired"
	                       "          FROM jobs"
	                       "         WHERE state IN ('activatable', 'active')) j,"
	                       "       (SELECT count(*) AS incidents FROM workflows"
	                       "         WHERE state = 'incident') i" },

	[Q_WF_GET] = { "wf_get", WG__N,
	               "SELECT " WF_COLUMNS ","
	               "       (SELECT j.progress FROM jobs j WHERE j.tenant_id = $1"
	               "           AND j.workflow_id = w.id AND j.step = w.step)"
	               "  FROM workflows w WHERE tenant_id = $1 AND id = $2" },
	[Q_NOTIFY] = { "notify", 0, "SELECT pg_notify('idemflow_outbox', '')" },

	[Q_BEGIN] = { "begin", 0, "BEGIN" },
	[Q_COMMIT] = { "commit", 0, "COMMIT" },
	[Q_ROLLBACK] = { "rollback", 0, "ROLLBACK" },
	[Q_KEY_CLAIM] = { "key_claim", KC__N,
	                  "INSERT INTO idempotency_keys (tenant_id, key, method, path, fingerprint,"
	                  "                              status, headers, body, created_at, "
	                  "expires_at,"
	                  "                              request_bytes_fp, actor)"
	                  " VALUES ($1, $2, $3, $4, $5, 0, '', '', now(), now() + coalesce("
	                  "   (SELECT idempotency_ttl FROM tenants WHERE id = $1), $6::interval), "
	                  "$7, $8)"
	                  " ON CONFLICT (tenant_id, key) DO NOTHING RETURNING 1" },
	[Q_KEY_STORE] = { "key_store", KS__N,
	                  "UPDATE idempotency_keys SET status = $3, headers = $4, body = $5"
	                  " WHERE tenant_id = $1 AND key = $2" },
	[Q_WF_CREATE_RUN] = { "wf_create_run", CR__N,
	                      "SELECT * FROM idemflow_wf_create($1, $2, $3, $4, $5, $6, $7, $8)" },
	[Q_WF_TRANSITION] = { "wf_transition", TR__N,
	                      "SELECT * FROM idemflow_wf_transition($1, $2, $3, $4)" },
	[Q_WF_MESSAGE] = { "wf_message", MS__N,
	                   "SELECT * FROM idemflow_wf_message($1, $2, $3, $4, $5)" },
	/* The jobs' trace context is read beside the function, not by it:
	 * the row before the activation has it as well (it never changes). */
	[Q_JOBS_ACTIVATE] = { "jobs_activate", JA__N,
	                      "SELECT a.*,"
	                      "       (SELECT j.traceparent FROM jobs j WHERE j.tenant_id = $1"
	                      "           AND j.workflow_id = a.workflow_id AND j.step = a.step) "
	                      "AS traceparent,"
	                      "       (SELECT j.tracestate FROM jobs j WHERE j.tenant_id = $1"
	                      "           AND j.workflow_id = a.workflow_id AND j.step = a.step) "
	                      "AS tracestate"
	                      "  FROM idemflow_jobs_activate($1, $2, $3, $4, $5::interval, "
	                      "$6::bigint) a" },
	[Q_JOB_COMPLETE] = { "job_complete", JC__N,
	                     "SELECT * FROM idemflow_job_complete($1, $2, $3, $4, $5)" },
	[Q_JOB_FAIL] = { "job_fail", JF__N,
	                 "SELECT * FROM idemflow_job_fail($1, $2, $3, $4, $5, $6::interval)" },
	/* Pages: at most $limit rows (the caller asks for one more than it
	 * shows), each with "within": it starts within the byte budget (the
	 * last parameter). Rows stop after the first one past the budget, so a
	 * worker never receives much more than it may answer, and a row beyond
	 * the ones shown says there is a next page (wf.c). The list walks the
	 * index one row at a time so that PostgreSQL sizes only those rows;
	 * an event's text is sized without reading it. */
	[Q_WF_EVENTS] = { "wf_events", WE__N,
	                  "SELECT e.seq, e.payload, e.within, e.actor FROM workflows w"
	                  "  LEFT JOIN LATERAL (SELECT seq, payload, start < $5::bigint AS within, "
	                  "actor FROM ("
	                  "    SELECT seq, payload, actor, start, lag(start, 1, 0::bigint) OVER "
	                  "(ORDER BY seq) AS prev"
	                  "      FROM (SELECT seq, payload, actor, "
	                  "sum(octet_length(payload)::bigint)"
	                  "                   OVER (ORDER BY seq) - octet_length(payload) AS start"
	                  "              FROM (SELECT seq, payload, actor FROM outbox o"
	                  "                     WHERE o.tenant_id = w.tenant_id AND o.workflow_id "
	                  "= w.id"
	                  "                       AND o.seq > $3 ORDER BY seq LIMIT $4) l) s) t"
	                  "    WHERE prev < $5::bigint) e ON true"
	                  " WHERE w.tenant_id = $1 AND w.id = $2 ORDER BY e.seq" },
	[Q_WF_LIST] = { "wf_list", WL__N,
	                "WITH RECURSIVE page AS ("
	                "  (SELECT w.*, 1 AS n, 0::bigint AS start,"
	                "          octet_length(w.input::text)::bigint + "
	                "octet_length(w.steps::text) AS run"
	                "     FROM workflows w"
	                "    WHERE w.tenant_id = $1 AND ($2::text IS NULL OR w.state = $2)"
	                "      AND ($3::text IS NULL OR w.type = $3) AND ($4::uuid IS NULL OR w.id "
	                "> $4)"
	                "    ORDER BY w.id LIMIT 1)"
	                "  UNION ALL"
	                "  SELECT w.*, p.n + 1, p.run,"
	                "         p.run + octet_length(w.input::text) + octet_length(w.steps::text)"
	                "    FROM page p CROSS JOIN LATERAL ("
	                "         SELECT * FROM workflows w"
	                "          WHERE w.tenant_id = $1 AND ($2::text IS NULL OR w.state = $2)"
	                "            AND ($3::text IS NULL OR w.type = $3) AND w.id > p.id"
	                "          ORDER BY w.id LIMIT 1) w"
	                "   WHERE p.n < $5 AND p.start < $6::bigint)"
	                "SELECT " WF_COLUMNS ", start < $6::bigint FROM page ORDER BY id" },
	/* Heartbeats and incidents (sql/009_incidents.sql). */
	[Q_JOB_HEARTBEAT] = { "job_heartbeat", JH__N,
	                      "SELECT * FROM idemflow_job_heartbeat($1, $2, $3, $4, $5::interval, "
	                      "$6)" },
	[Q_WF_RESUME] = { "wf_resume", RS__N,
	                  "SELECT * FROM idemflow_wf_resume($1, $2, $3::integer)" },
	/* The request's trace context and actor for the rest of its
	 * transaction: the traceparent, tracestate and actor columns' default
	 * (sql/008_trace.sql, sql/014_actor.sql). */
	[Q_TRACE_SET] = { "trace_set", TS__N,
	                  "SELECT set_config('idemflow.traceparent', coalesce($1, ''), true),"
	                  "       set_config('idemflow.tracestate', coalesce($2, ''), true),"
	                  "       set_config('idemflow.actor', coalesce($3, ''), true)" },

	/* POST /v1/messages: by business key (sql/010_timers.sql). */
	[Q_MESSAGE_PUBLISH] = { "message_publish", MP__N,
	                        "SELECT * FROM idemflow_message_publish($1, $2, $3, $4, "
	                        "$5::interval, $6, $7::bigint * interval '1 millisecond')" },
};

int queries_check(struct err *e)
{
	for (int i = 0; i < Q__COUNT; i++)
		if (db_stmt_check(&queries[i], e) < 0)
			return -1;
	return 0;
}
