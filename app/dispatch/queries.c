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
};

int dispatch_queries_check(struct err *e)
{
	for (int i = 0; i < DQ__COUNT; i++)
		if (db_stmt_check(&dispatch_queries[i], e) < 0)
			return -1;
	return 0;
}
