/* queries.c - the dispatcher's SQL, one table (see queries.h): each entry's
 * name, parameter count (the statement's parameter enum) and SQL. */
#include "dispatch/queries.h"

const struct db_stmt dispatch_queries[DQ__COUNT] = {
	[DQ_CLAIM] = { "d_claim", DQ_CLAIM__N,
	               "WITH due AS (\n"
	               "  SELECT o.id\n"
	               "    FROM outbox o\n"
	               "   WHERE o.published_at IS NULL AND o.dead_at IS NULL\n"
	               "     AND o.next_attempt_at <= now()\n"
	               "     AND (o.lease_until IS NULL OR o.lease_until < now())\n"
	               "     AND NOT EXISTS (SELECT 1\n"
	               "                       FROM frozen_tenants f\n"
	               "                      WHERE f.tenant_id = o.tenant_id)\n"
	               "     AND NOT EXISTS (SELECT 1\n"
	               "                       FROM outbox p\n"
	               "                      WHERE p.workflow_id = o.workflow_id\n"
	               "                        AND p.seq < o.seq\n"
	               "                        AND p.published_at IS NULL)\n"
	               "   ORDER BY o.next_attempt_at, o.id\n"
	               "   LIMIT $1\n"
	               "     FOR UPDATE SKIP LOCKED\n"
	               ")\n"
	               "UPDATE outbox o\n"
	               "   SET lease_owner = $2, lease_until = now() + $3::interval,\n"
	               "       attempts = o.attempts + 1\n"
	               "  FROM due\n"
	               " WHERE o.id = due.id\n"
	               "RETURNING o.id, o.event_id, o.type, o.workflow_id, o.attempts, o.payload,\n"
	               "          o.traceparent, o.tracestate\n" },

	[DQ_DONE] = { "d_done", DQ_DONE__N,
	              "UPDATE outbox\n"
	              "   SET published_at = now(), lease_owner = NULL, lease_until = NULL\n"
	              " WHERE id = ANY($1::bigint[]) AND lease_owner = $2\n" },

	[DQ_FAIL] = { "d_fail", DQ_FAIL__N,
	              "WITH failed AS (\n"
	              "  UPDATE outbox o\n"
	              "     SET last_error = f.err,\n"
	              "         next_attempt_at = now() + f.delay_ms * interval '1 millisecond',\n"
	              "         dead_at = CASE WHEN f.dead THEN now() END,\n"
	              "         lease_owner = NULL, lease_until = NULL\n"
	              "    FROM unnest($1::bigint[], $3::text[], $4::bigint[], $5::bool[])\n"
	              "         AS f(id, err, delay_ms, dead)\n"
	              "   WHERE o.id = f.id AND o.lease_owner = $2\n"
	              "  RETURNING o.tenant_id, o.workflow_id, o.seq, f.dead\n"
	              ")\n"
	              "UPDATE outbox h\n"
	              "   SET next_attempt_at = 'infinity'\n"
	              "  FROM failed\n"
	              " WHERE failed.dead AND h.tenant_id = failed.tenant_id\n"
	              "   AND h.workflow_id = failed.workflow_id AND h.seq > failed.seq\n"
	              "   AND h.published_at IS NULL AND h.dead_at IS NULL\n" },

	[DQ_RELEASE] = { "d_release", DQ_RELEASE__N,
	                 "UPDATE outbox\n"
	                 "   SET lease_owner = NULL, lease_until = NULL,\n"
	                 "       attempts = attempts - 1\n"
	                 " WHERE id = ANY($1::bigint[]) AND lease_owner = $2\n" },

	[DQ_STATS] = { "d_stats", DQ_STATS__N,
	               "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)\n"
	               "  FROM outbox\n"
	               " WHERE published_at IS NULL AND dead_at IS NULL\n" },

	[DQ_LISTEN] = { "d_listen", DQ_LISTEN__N, "LISTEN idemflow_outbox" },

	[DQ_FCLAIM] = { "d_fclaim", DQ_FCLAIM__N,
	                "WITH due AS (\n"
	                "  SELECT d.tenant_id, d.endpoint_id, d.workflow_id, d.seq\n"
	                "    FROM deliveries d\n"
	                "    JOIN endpoints e ON e.tenant_id = d.tenant_id AND e.id = d.endpoint_id\n"
	                "   WHERE d.state = 'pending' AND d.next_attempt_at <= now()\n"
	                "     AND (d.lease_until IS NULL OR d.lease_until < now())\n"
	                "     AND NOT e.disabled\n"
	                "     AND NOT EXISTS (SELECT 1\n"
	                "                       FROM frozen_tenants f\n"
	                "                      WHERE f.tenant_id = d.tenant_id)\n"
	                "     AND (e.ordering = 'none'\n"
	                "          OR NOT EXISTS (SELECT 1\n"
	                "                           FROM deliveries p\n"
	                "                          WHERE p.tenant_id = d.tenant_id\n"
	                "                            AND p.endpoint_id = d.endpoint_id\n"
	                "                            AND p.workflow_id = d.workflow_id\n"
	                "                            AND p.seq < d.seq\n"
	                "                            AND p.state IN ('pending', 'dead')))\n"
	                "   ORDER BY d.next_attempt_at, d.outbox_id\n"
	                "   LIMIT $1\n"
	                "     FOR UPDATE OF d SKIP LOCKED\n"
	                ")\n"
	                "UPDATE deliveries d\n"
	                "   SET lease_owner = $2, lease_until = now() + $3::interval,\n"
	                "       attempts = d.attempts + 1\n"
	                "  FROM due, outbox o, endpoints e\n"
	                " WHERE d.tenant_id = due.tenant_id AND d.endpoint_id = due.endpoint_id\n"
	                "   AND d.workflow_id = due.workflow_id AND d.seq = due.seq\n"
	                "   AND o.id = d.outbox_id\n"
	                "   AND e.tenant_id = d.tenant_id AND e.id = d.endpoint_id\n"
	                "RETURNING d.tenant_id, d.endpoint_id, d.workflow_id, d.seq, d.attempts,\n"
	                "          o.event_id, o.type, o.payload, o.traceparent, o.tracestate,\n"
	                "          e.url, e.secret,\n"
	                "          CASE WHEN e.previous_secret_until > now() THEN e.previous_secret END\n" },

	[DQ_FRECORD] = { "d_frecord", DQ_FRECORD__N,
	                 "SELECT recorded, disabled\n"
	                 "  FROM idemflow_deliveries_record(\n"
	                 "         $1, now(), $2::bigint[], $3::uuid[], $4::uuid[], $5::integer[],\n"
	                 "         $6::text[],\n"
	                 "         ARRAY(SELECT to_timestamp(t)\n"
	                 "                 FROM unnest($7::float8[]) WITH ORDINALITY AS s(t, n)\n"
	                 "                ORDER BY n),\n"
	                 "         $8::float8[], $9::integer[], $10::text[], $11::text[],\n"
	                 "         $12::text[], $13::bigint[], $14::boolean[],\n"
	                 "         $15::integer, $16::interval)\n" },

	[DQ_FRELEASE] = { "d_frelease", DQ_FRELEASE__N,
	                  "UPDATE deliveries d\n"
	                  "   SET lease_owner = NULL, lease_until = NULL, attempts = d.attempts - 1\n"
	                  "  FROM unnest($1::bigint[], $2::uuid[], $3::uuid[], $4::integer[])\n"
	                  "       AS r(tenant_id, endpoint_id, workflow_id, seq)\n"
	                  " WHERE d.tenant_id = r.tenant_id AND d.endpoint_id = r.endpoint_id\n"
	                  "   AND d.workflow_id = r.workflow_id AND d.seq = r.seq\n"
	                  "   AND d.lease_owner = $5\n" },
};

int dispatch_queries_check(struct err *e)
{
	for (int i = 0; i < DQ__COUNT; i++)
		if (db_stmt_check(&dispatch_queries[i], e) < 0)
			return -1;
	return 0;
}
