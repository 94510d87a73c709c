/*
 * prune.c - the CLI's two cron jobs: "idemflow prune" deletes expired
 * idempotency keys (with their counts), delivered outbox events past
 * outbox_retention whose workflow ended more than history_retention ago,
 * messages published by business key that expired unclaimed, and
 * workflows that ended more than workflow_retention ago (a tenant's own,
 * or the CLI's) with all that is theirs; "idemflow reap" hands jobs whose
 * lease ran out back to activation and fires due timers (sleep steps, wait timeouts), once or, with
 * --loop, every --interval until signalled. Both work in batches of prune_batch rows, one short
 * transaction each, until a batch comes back short, and both print what they did even when a later
 * batch failed: every batch before it is committed. Not for the server, which never deletes and
 * only reaps lazily, as it activates a job.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <time.h>

#include "cli/cli.h"
#include "core/db.h"

/*
 * prune. Every statement deletes at most prune_batch rows and commits on
 * its own, so no lock is held longer than one small batch; rows are picked
 * FOR UPDATE SKIP LOCKED, so a key that a request is taking over at that
 * moment is left to it instead of waited for. Everything is measured
 * against one cutoff taken at the start: a run ends even while keys keep
 * expiring, and removes exactly what had expired when it began. A key's
 * counts (idempotency_key_stats) go in the same statement as the key.
 * Both statements take $1 cutoff (timestamptz), $2 batch size, and return
 * (rows deleted, counts rows deleted).
 */
#define PRUNE_KEYS                                                                                 \
	"WITH d AS (\n"                                                                            \
	"  DELETE FROM idempotency_keys\n"                                                         \
	"   WHERE ctid = ANY(ARRAY(SELECT ctid\n"                                                  \
	"                            FROM idempotency_keys\n"                                      \
	"                           WHERE expires_at <= $1::timestamptz\n"                         \
	"                           ORDER BY expires_at\n"                                         \
	"                           LIMIT $2::int\n"                                               \
	"                             FOR UPDATE SKIP LOCKED))\n"                                  \
	"  RETURNING tenant_id, key\n"                                                             \
	"), s AS (\n"                                                                              \
	"  DELETE FROM idempotency_key_stats st\n"                                                 \
	"   USING d\n"                                                                             \
	"   WHERE st.tenant_id = d.tenant_id AND st.key = d.key\n"                                 \
	"  RETURNING 1\n"                                                                          \
	")\n"                                                                                      \
	"SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM s)\n"

/*
 * An event row is two things: the dispatcher's record of a delivery, and
 * a step of its workflow's history (GET /v1/workflows/{id}/events). It
 * goes when neither needs it: delivered (a dead or pending event has no
 * published_at) before $1, the outbox_retention cutoff, and of a workflow
 * that ended (completed, failed, cancelled or compensated) before $3, the
 * history_retention cutoff. A live workflow's events stay however old, so
 * its history is whole. The workflow it announced stays.
 *
 * An event is also the payload of its deliveries to tenant endpoints
 * (sql/020_endpoints.sql): one still pending, or dead (a recover may send
 * it again; with ordering 'workflow' it holds its endpoint's later
 * deliveries of the workflow, which deleting it would silently release),
 * keeps the event, as a dead event of the operator's keeps itself. Its
 * delivered and skipped deliveries, and the attempt ledger's rows of it,
 * go with it. The operational events (endpoint.%, delivery.%) have no
 * workflow and no history: delivered and past $1, they go. Deliveries
 * are found through their primary key, one probe per endpoint of the
 * event's tenant.
 *
 * The delivered events are walked in (published_at, id) order from just
 * after ($4, $5), $2 at a time: an event kept is read once per run, not
 * once per batch. -> (events deleted, events read, the last one read's
 * published_at and id, NULL when none was read, events kept for a
 * delivery, deliveries deleted, attempts deleted).
 */
#define PRUNE_EVENTS                                                                               \
	"WITH c AS (\n"                                                                            \
	"  SELECT o.ctid AS tid, o.published_at, o.id,\n"                                          \
	"         EXISTS (SELECT 1\n"                                                              \
	"                   FROM workflows w\n"                                                    \
	"                  WHERE w.tenant_id = o.tenant_id AND w.id = o.workflow_id\n"             \
	"                    AND w.state IN ('completed', 'failed', 'cancelled', 'compensated')\n" \
	"                    AND coalesce(w.ended_at, w.updated_at) < $3::timestamptz)\n"          \
	"         OR o.type LIKE 'endpoint.%' OR o.type LIKE 'delivery.%' AS done,\n"              \
	"         EXISTS (SELECT 1\n"                                                              \
	"                   FROM endpoints e\n"                                                    \
	"                   JOIN deliveries dl\n"                                                  \
	"                     ON dl.tenant_id = e.tenant_id AND dl.endpoint_id = e.id\n"           \
	"                  WHERE e.tenant_id = o.tenant_id\n"                                      \
	"                    AND dl.workflow_id = o.workflow_id AND dl.seq = o.seq\n"              \
	"                    AND dl.state IN ('pending', 'dead')) AS held\n"                       \
	"    FROM outbox o\n"                                                                      \
	"   WHERE o.published_at < $1::timestamptz AND o.published_at >= $4::timestamptz\n"        \
	"     AND (o.published_at, o.id) > ($4::timestamptz, $5::bigint)\n"                        \
	"   ORDER BY o.published_at, o.id\n"                                                       \
	"   LIMIT $2::int\n"                                                                       \
	"     FOR UPDATE SKIP LOCKED\n"                                                            \
	"), d AS (\n"                                                                              \
	"  DELETE FROM outbox\n"                                                                   \
	"   WHERE ctid = ANY(ARRAY(SELECT tid FROM c WHERE done AND NOT held))\n"                  \
	"  RETURNING tenant_id, workflow_id, seq\n"                                                \
	"), dd AS (\n"                                                                             \
	"  DELETE FROM deliveries dl\n"                                                            \
	"   USING d, endpoints e\n"                                                                \
	"   WHERE e.tenant_id = d.tenant_id\n"                                                     \
	"     AND dl.tenant_id = d.tenant_id AND dl.endpoint_id = e.id\n"                          \
	"     AND dl.workflow_id = d.workflow_id AND dl.seq = d.seq\n"                             \
	"  RETURNING 1\n"                                                                          \
	"), da AS (\n"                                                                             \
	"  DELETE FROM delivery_attempts a\n"                                                      \
	"   USING d\n"                                                                             \
	"   WHERE a.tenant_id = d.tenant_id AND a.workflow_id = d.workflow_id AND a.seq = d.seq\n" \
	"  RETURNING 1\n"                                                                          \
	"), l AS (\n"                                                                              \
	"  SELECT published_at, id\n"                                                              \
	"    FROM c\n"                                                                             \
	"   ORDER BY published_at DESC, id DESC\n"                                                 \
	"   LIMIT 1\n"                                                                             \
	")\n"                                                                                      \
	"SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM c),\n"                             \
	"       (SELECT published_at FROM l), (SELECT id FROM l),\n"                               \
	"       (SELECT count(*) FROM c WHERE done AND held),\n"                                   \
	"       (SELECT count(*) FROM dd), (SELECT count(*) FROM da)\n"

/* Messages published by business key (sql/010_timers.sql) that no
 * workflow took before they expired; a taken one belongs to its workflow. */
#define PRUNE_MESSAGES                                                                             \
	"WITH d AS (\n"                                                                            \
	"  DELETE FROM messages\n"                                                                 \
	"   WHERE ctid = ANY(ARRAY(SELECT ctid\n"                                                  \
	"                            FROM messages\n"                                              \
	"                           WHERE workflow_id IS NULL AND expires_at <= $1::timestamptz\n" \
	"                           ORDER BY expires_at\n"                                         \
	"                           LIMIT $2::int\n"                                               \
	"                             FOR UPDATE SKIP LOCKED))\n"                                  \
	"  RETURNING 1\n"                                                                          \
	")\n"                                                                                      \
	"SELECT count(*), 0\n"                                                                     \
	"  FROM d\n"

/* Timers that fired (their step went on) before the retention: history,
 * like a delivered event. One that could not fire (error) holds its
 * workflow's incident until a resume, and stays. */
#define PRUNE_TIMERS                                                                               \
	"WITH d AS (\n"                                                                            \
	"  DELETE FROM timers\n"                                                                   \
	"   WHERE ctid = ANY(ARRAY(SELECT ctid\n"                                                  \
	"                            FROM timers\n"                                                \
	"                           WHERE fired_at < $1::timestamptz AND error IS NULL\n"          \
	"                           ORDER BY fired_at\n"                                           \
	"                           LIMIT $2::int\n"                                               \
	"                             FOR UPDATE SKIP LOCKED))\n"                                  \
	"  RETURNING 1\n"                                                                          \
	")\n"                                                                                      \
	"SELECT count(*), 0\n"                                                                     \
	"  FROM d\n"

/*
 * Ended workflows past their retention, with everything of theirs: the
 * workflow row, its jobs, timers, messages and the events left of its
 * history, in one statement (the foreign keys are checked at its end, when
 * all are gone). A workflow goes when it ended (completed, failed,
 * cancelled or compensated) before $1 minus its tenant's
 * workflow_retention, or minus $2 ms (the CLI's) when the tenant has
 * none, and every one of its events was delivered: one pending or dead
 * (no published_at) keeps it whole, so that nothing is deleted under the
 * dispatcher and a dead event can still be requeued; so does a delivery
 * of one of its events to a tenant endpoint still pending or dead (as
 * PRUNE_EVENTS). The deliveries of its events and their attempts go with
 * it. A live workflow has
 * no ended_at and is never read.
 *
 * The ended workflows are walked in (ended_at, tenant_id, id) order
 * (workflows_ended, sql/019_workflow_retention.sql) from just after ($4,
 * $5, $6), $3 at a time, up to $7, the earliest cutoff of any tenant:
 * one kept (its tenant keeps them longer, or an event is undelivered) is
 * read once per run. Each is taken FOR UPDATE SKIP LOCKED: one a command
 * holds (a late cancel, a message) is left for the next run. Commands
 * lock the workflow before its jobs, as this does. -> (workflows deleted,
 * workflows read, jobs, timers, messages, events deleted, workflows held
 * by an undelivered event, the last one read's ended_at, tenant_id and
 * id, NULL when none was read). Each DELETE finds its rows through the
 * index that leads with tenant_id (outbox: workflow_id) by arrays of the
 * batch's ids, and an undelivered event is probed for each workflow
 * (LATERAL ... LIMIT 1): joined to the batch, or as an EXISTS, the
 * planner hashes the batch against a scan of the whole table whenever the
 * table looks small to it.
 */
#define PRUNE_WORKFLOWS                                                                              \
	"WITH c AS (\n"                                                                              \
	"  SELECT w.tenant_id, w.id, w.ended_at,\n"                                                  \
	"         w.state IN ('completed', 'failed', 'cancelled', 'compensated')\n"                  \
	"         AND w.ended_at < $1::timestamptz\n"                                                \
	"                          - coalesce((SELECT t.workflow_retention\n"                        \
	"                                        FROM tenants t\n"                                   \
	"                                       WHERE t.id = w.tenant_id),\n"                        \
	"                                     $2::bigint * interval '1 millisecond') AS due\n"       \
	"    FROM workflows w\n"                                                                     \
	"   WHERE w.ended_at < $7::timestamptz\n"                                                    \
	"     AND (w.ended_at, w.tenant_id, w.id) > ($4::timestamptz, $5::bigint, $6::uuid)\n"       \
	"   ORDER BY w.ended_at, w.tenant_id, w.id\n"                                                \
	"   LIMIT $3::int\n"                                                                         \
	"     FOR UPDATE OF w SKIP LOCKED\n"                                                         \
	"), u AS (\n"                                                                                \
	"  SELECT c.tenant_id, c.id, h.held IS NOT NULL AS held\n"                                   \
	"    FROM c\n"                                                                               \
	"    LEFT JOIN LATERAL (SELECT 1 AS held\n"                                                  \
	"                         FROM outbox o\n"                                                   \
	"                        WHERE o.workflow_id = c.id AND o.tenant_id = c.tenant_id\n"         \
	"                          AND o.published_at IS NULL\n"                                     \
	"                        UNION ALL\n"                                                        \
	"                       SELECT 1\n"                                                          \
	"                         FROM endpoints e\n"                                                \
	"                         JOIN deliveries dl\n"                                              \
	"                           ON dl.tenant_id = e.tenant_id AND dl.endpoint_id = e.id\n"       \
	"                        WHERE e.tenant_id = c.tenant_id AND dl.workflow_id = c.id\n"        \
	"                          AND dl.state IN ('pending', 'dead')\n"                            \
	"                        LIMIT 1) h ON true\n"                                               \
	"   WHERE c.due\n"                                                                           \
	"), k AS (\n"                                                                                \
	"  SELECT tenant_id, id\n"                                                                   \
	"    FROM u\n"                                                                               \
	"   WHERE NOT held\n"                                                                        \
	"), dj AS (\n"                                                                               \
	"  DELETE FROM jobs j\n"                                                                     \
	"   WHERE j.tenant_id = ANY(ARRAY(SELECT DISTINCT tenant_id FROM k))\n"                      \
	"     AND j.workflow_id = ANY(ARRAY(SELECT id FROM k))\n"                                    \
	"     AND EXISTS (SELECT 1\n"                                                                \
	"                   FROM k\n"                                                                \
	"                  WHERE k.tenant_id = j.tenant_id AND k.id = j.workflow_id)\n"              \
	"  RETURNING 1\n"                                                                            \
	"), dt AS (\n"                                                                               \
	"  DELETE FROM timers t\n"                                                                   \
	"   WHERE t.tenant_id = ANY(ARRAY(SELECT DISTINCT tenant_id FROM k))\n"                      \
	"     AND t.workflow_id = ANY(ARRAY(SELECT id FROM k))\n"                                    \
	"     AND EXISTS (SELECT 1\n"                                                                \
	"                   FROM k\n"                                                                \
	"                  WHERE k.tenant_id = t.tenant_id AND k.id = t.workflow_id)\n"              \
	"  RETURNING 1\n"                                                                            \
	"), dm AS (\n"                                                                               \
	"  DELETE FROM messages m\n"                                                                 \
	"   WHERE m.tenant_id = ANY(ARRAY(SELECT DISTINCT tenant_id FROM k))\n"                      \
	"     AND m.workflow_id = ANY(ARRAY(SELECT id FROM k))\n"                                    \
	"     AND EXISTS (SELECT 1\n"                                                                \
	"                   FROM k\n"                                                                \
	"                  WHERE k.tenant_id = m.tenant_id AND k.id = m.workflow_id)\n"              \
	"  RETURNING 1\n"                                                                            \
	"), de AS (\n"                                                                               \
	"  DELETE FROM outbox o\n"                                                                   \
	"   WHERE o.workflow_id = ANY(ARRAY(SELECT id FROM k))\n"                                    \
	"     AND EXISTS (SELECT 1\n"                                                                \
	"                   FROM k\n"                                                                \
	"                  WHERE k.tenant_id = o.tenant_id AND k.id = o.workflow_id)\n"              \
	"  RETURNING 1\n"                                                                            \
	"), dd AS (\n"                                                                               \
	"  DELETE FROM deliveries dl\n"                                                              \
	"   WHERE dl.tenant_id = ANY(ARRAY(SELECT DISTINCT tenant_id FROM k))\n"                     \
	"     AND dl.endpoint_id = ANY(ARRAY(SELECT e.id\n"                                          \
	"                                      FROM endpoints e\n"                                   \
	"                                     WHERE e.tenant_id = ANY(ARRAY(SELECT DISTINCT\n"       \
	"                                                                    tenant_id FROM k))))\n" \
	"     AND dl.workflow_id = ANY(ARRAY(SELECT id FROM k))\n"                                   \
	"     AND EXISTS (SELECT 1\n"                                                                \
	"                   FROM k\n"                                                                \
	"                  WHERE k.tenant_id = dl.tenant_id AND k.id = dl.workflow_id)\n"            \
	"  RETURNING 1\n"                                                                            \
	"), da AS (\n"                                                                               \
	"  DELETE FROM delivery_attempts a\n"                                                        \
	"   WHERE a.tenant_id = ANY(ARRAY(SELECT DISTINCT tenant_id FROM k))\n"                      \
	"     AND a.workflow_id = ANY(ARRAY(SELECT id FROM k))\n"                                    \
	"     AND EXISTS (SELECT 1\n"                                                                \
	"                   FROM k\n"                                                                \
	"                  WHERE k.tenant_id = a.tenant_id AND k.id = a.workflow_id)\n"              \
	"  RETURNING 1\n"                                                                            \
	"), dw AS (\n"                                                                               \
	"  DELETE FROM workflows w\n"                                                                \
	"   WHERE w.tenant_id = ANY(ARRAY(SELECT DISTINCT tenant_id FROM k))\n"                      \
	"     AND w.id = ANY(ARRAY(SELECT id FROM k))\n"                                             \
	"     AND EXISTS (SELECT 1\n"                                                                \
	"                   FROM k\n"                                                                \
	"                  WHERE k.tenant_id = w.tenant_id AND k.id = w.id)\n"                       \
	"  RETURNING 1\n"                                                                            \
	"), l AS (\n"                                                                                \
	"  SELECT ended_at, tenant_id, id\n"                                                         \
	"    FROM c\n"                                                                               \
	"   ORDER BY ended_at DESC, tenant_id DESC, id DESC\n"                                       \
	"   LIMIT 1\n"                                                                               \
	")\n"                                                                                        \
	"SELECT (SELECT count(*) FROM dw), (SELECT count(*) FROM c),\n"                              \
	"       (SELECT count(*) FROM dj), (SELECT count(*) FROM dt),\n"                             \
	"       (SELECT count(*) FROM dm), (SELECT count(*) FROM de),\n"                             \
	"       (SELECT count(*) FROM u WHERE held),\n"                                              \
	"       (SELECT ended_at FROM l), (SELECT tenant_id FROM l), (SELECT id FROM l),\n"          \
	"       (SELECT count(*) FROM dd), (SELECT count(*) FROM da)\n"

/* What PRUNE_WORKFLOWS did over a run. */
struct prune_wf {
	long workflows; /* deleted */
	long jobs, timers, messages, events;
	long held;                 /* past their retention, kept for an undelivered event */
	long deliveries, attempts; /* of their events, to tenant endpoints */
};

/*
 * PRUNE_WORKFLOWS until a batch reads fewer than nbatch workflows: adds
 * what each did to n. now is the run's start, retention_ms the CLI's
 * workflow_retention, earliest the earliest cutoff of any tenant.
 * Returns 0, or -1 with e filled; n then holds what the statements before
 * it did.
 */
static int prune_workflows(PGconn *conn, const char *now, const char *retention_ms,
                           const char *earliest, const char *batch, int nbatch, struct prune_wf *n,
                           struct err *e)
{
	char after_at[64] = "-infinity", after_tenant[24] = "0",
	     after_id[40] = "00000000-0000-0000-0000-000000000000";

	for (;;) {
		const char *p[7] = { now,          retention_ms, batch,   after_at,
			             after_tenant, after_id,     earliest };
		PGresult *res = db_exec(conn, PRUNE_WORKFLOWS, 7, p, e);
		long read;

		if (res == NULL)
			return -1;
		n->workflows += atol(PQgetvalue(res, 0, 0));
		read = atol(PQgetvalue(res, 0, 1));
		n->jobs += atol(PQgetvalue(res, 0, 2));
		n->timers += atol(PQgetvalue(res, 0, 3));
		n->messages += atol(PQgetvalue(res, 0, 4));
		n->events += atol(PQgetvalue(res, 0, 5));
		n->held += atol(PQgetvalue(res, 0, 6));
		n->deliveries += atol(PQgetvalue(res, 0, 10));
		n->attempts += atol(PQgetvalue(res, 0, 11));
		if (read > 0) {
			snprintf(after_at, sizeof(after_at), "%s", PQgetvalue(res, 0, 7));
			snprintf(after_tenant, sizeof(after_tenant), "%s", PQgetvalue(res, 0, 8));
			snprintf(after_id, sizeof(after_id), "%s", PQgetvalue(res, 0, 9));
		}
		PQclear(res);
		if (read < nbatch)
			return 0;
	}
}

/*
 * Run sql with its nparams params p until a batch comes back short: the
 * first column of its one row (rows handled) below batch. That column is
 * added to *rows, the second (if more is not NULL) to *more, and
 * *statements (if not NULL) counts the statements. Returns 0, or -1 with
 * e filled; the sums then hold what the statements before it did.
 */
static int prune_batches(PGconn *conn, const char *sql, int nparams, const char *const *p,
                         int batch, long *rows, long *more, int *statements, struct err *e)
{
	for (;;) {
		PGresult *res = db_exec(conn, sql, nparams, p, e);
		long n;

		if (res == NULL)
			return -1;
		n = atol(PQgetvalue(res, 0, 0));
		*rows += n;
		if (more != NULL)
			*more += atol(PQgetvalue(res, 0, 1));
		if (statements != NULL)
			(*statements)++;
		PQclear(res);
		if (n < batch)
			return 0;
	}
}

/*
 * PRUNE_EVENTS until a batch reads fewer than batch events: adds the
 * events deleted to *deleted, those read and kept (their workflow is
 * live, or ended after the history cutoff) to *kept, and the statements
 * to *statements. Returns 0, or -1 with e filled; the sums then hold what
 * the statements before it did.
 */
/* What PRUNE_EVENTS did beside deleting events. */
struct prune_ev {
	long kept;       /* read, kept as history */
	long held;       /* read, kept for a delivery pending or dead */
	long deliveries; /* deleted with their events */
	long attempts;
};

static int prune_events(PGconn *conn, const char *cutoff, const char *history_cutoff,
                        const char *batch, int nbatch, long *deleted, struct prune_ev *ev,
                        int *statements, struct err *e)
{
	char after_at[64] = "-infinity", after_id[24] = "0";

	for (;;) {
		const char *p[5] = { cutoff, batch, history_cutoff, after_at, after_id };
		PGresult *res = db_exec(conn, PRUNE_EVENTS, 5, p, e);
		long n, read;

		if (res == NULL)
			return -1;
		n = atol(PQgetvalue(res, 0, 0));
		read = atol(PQgetvalue(res, 0, 1));
		*deleted += n;
		ev->held += atol(PQgetvalue(res, 0, 4));
		ev->kept += read - n - atol(PQgetvalue(res, 0, 4));
		ev->deliveries += atol(PQgetvalue(res, 0, 5));
		ev->attempts += atol(PQgetvalue(res, 0, 6));
		(*statements)++;
		if (read > 0) {
			snprintf(after_at, sizeof(after_at), "%s", PQgetvalue(res, 0, 2));
			snprintf(after_id, sizeof(after_id), "%s", PQgetvalue(res, 0, 3));
		}
		PQclear(res);
		if (read < nbatch)
			return 0;
	}
}

/*
 * The configuration keys that may follow the command: "--KEY VALUE" or
 * "--KEY=VALUE", for each "--KEY" among options (NULL-terminated), set in
 * c. Returns EX_OK, or EX_USAGE after saying why on stderr: an unknown
 * option with the usage text, and an option without its value as such
 * when say_missing, else with the usage text (as reap always has).
 */
static int prune_options(struct conf *c, int argc, char **argv, const char *const *options,
                         int say_missing)
{
	struct err e;

	for (int i = 0; i < argc; i++) {
		const char *a = argv[i], *eq = strchr(a, '='), *val;
		const char *const *o;
		char name[32];
		size_t n = eq ? (size_t)(eq - a) : strlen(a);

		snprintf(name, sizeof(name), "%.*s", (int)n, a);
		for (o = options; *o != NULL && strcmp(name, *o) != 0; o++)
			;
		if (*o == NULL)
			return cli_usage_error();
		if (eq == NULL && i + 1 >= argc) {
			if (!say_missing)
				return cli_usage_error();
			fprintf(stderr, "idemflow: option \"%s\" needs a value\n", a);
			return EX_USAGE;
		}
		val = eq ? eq + 1 : argv[++i];
		if (conf_set(c, name + 2, val, name, &e) < 0) {
			fprintf(stderr, "idemflow: %s\n", e.msg);
			return EX_USAGE;
		}
	}
	return EX_OK;
}

int cli_prune(PGconn *conn, struct conf *c, int argc, char **argv)
{
	static const char *const options[] = { "--outbox-retention", "--history-retention",
		                               "--workflow-retention", "--prune-batch", NULL };
	long keys = 0, key_stats = 0, events = 0, messages = 0, timers = 0;
	struct prune_wf wf = { 0 };
	struct prune_ev ev = { 0 };
	int statements = 0, rc;
	char ms[24], hms[24], wms[24], batch[16], key_cutoff[64], event_cutoff[64],
	    history_cutoff[64], wf_earliest[64];
	struct timespec t0, t1;
	PGresult *res;
	struct err e;

	rc = prune_options(c, argc, argv, options, 1);
	if (rc != EX_OK)
		return rc;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	snprintf(ms, sizeof(ms), "%ld", c->outbox_retention);
	snprintf(hms, sizeof(hms), "%ld", c->history_retention);
	snprintf(wms, sizeof(wms), "%ld", c->workflow_retention);
	const char *p[3] = { ms, hms, wms };
	/* The last column: the earliest cutoff of ended workflows, that of
	 * the shortest retention, the CLI's or a tenant's. */
	res = db_exec(conn,
	              "SELECT now(), now() - $1::bigint * interval '1 millisecond',\n"
	              "       now() - $2::bigint * interval '1 millisecond',\n"
	              "       now() - least($3::bigint * interval '1 millisecond',\n"
	              "                     (SELECT min(workflow_retention) FROM tenants))\n",
	              3, p, &e);
	if (res == NULL)
		return cli_db_fail(&e);
	snprintf(key_cutoff, sizeof(key_cutoff), "%s", PQgetvalue(res, 0, 0));
	snprintf(event_cutoff, sizeof(event_cutoff), "%s", PQgetvalue(res, 0, 1));
	snprintf(history_cutoff, sizeof(history_cutoff), "%s", PQgetvalue(res, 0, 2));
	snprintf(wf_earliest, sizeof(wf_earliest), "%s", PQgetvalue(res, 0, 3));
	PQclear(res);

	snprintf(batch, sizeof(batch), "%d", c->prune_batch);
	const char *pk[2] = { key_cutoff, batch }, *pe[2] = { event_cutoff, batch };
	int failed =
	    prune_batches(conn, PRUNE_KEYS, 2, pk, c->prune_batch, &keys, &key_stats, &statements,
	                  &e) < 0 ||
	    prune_events(conn, event_cutoff, history_cutoff, batch, c->prune_batch, &events, &ev,
	                 &statements, &e) < 0 ||
	    prune_batches(conn, PRUNE_MESSAGES, 2, pk, c->prune_batch, &messages, NULL, NULL, &e) <
	        0 ||
	    prune_batches(conn, PRUNE_TIMERS, 2, pe, c->prune_batch, &timers, NULL, NULL, &e) < 0 ||
	    prune_workflows(conn, key_cutoff, wms, wf_earliest, batch, c->prune_batch, &wf, &e) < 0;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	/* messages=, timers= and history_kept= last, the first two's
	 * statements not in statements= (keys and events): readers of the line
	 * as it was keep their fields. history_kept: delivered events past
	 * outbox_retention kept as history (their workflow is live, or ended
	 * within history_retention). Then the workflows: workflows= deleted,
	 * with their workflow_jobs=, workflow_timers=, workflow_messages= and
	 * workflow_events=; workflows_held= past their retention but kept for
	 * an event not delivered yet (pending or dead). Then the tenant
	 * endpoints' (sql/020_endpoints.sql): deliveries= and
	 * delivery_attempts= deleted with their events (both passes);
	 * deliveries_held= events past retention kept for a delivery pending
	 * or dead. */
	printf("prune: keys=%ld key_stats=%ld events=%ld statements=%d duration_s=%.3f "
	       "messages=%ld timers=%ld history_kept=%ld workflows=%ld workflow_jobs=%ld "
	       "workflow_timers=%ld workflow_messages=%ld workflow_events=%ld "
	       "workflows_held=%ld deliveries=%ld delivery_attempts=%ld deliveries_held=%ld\n",
	       keys, key_stats, events, statements,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9, messages,
	       timers, ev.kept, wf.workflows, wf.jobs, wf.timers, wf.messages, wf.events, wf.held,
	       ev.deliveries + wf.deliveries, ev.attempts + wf.attempts, ev.held);
	return failed ? cli_db_fail(&e) : EX_OK;
}

/* --loop: set by SIGTERM and SIGINT, read between rounds. */
static volatile sig_atomic_t reap_stop;

static void reap_on_signal(int sig)
{
	reap_stop = 1;
}

/* What one reap round did. */
struct reap_counts {
	long jobs;      /* leases that ran out, made activatable */
	long timers;    /* sleeps fired */
	long timeouts;  /* waits timed out */
	long incidents; /* timers that could not fire: their workflows parked */
};

/*
 * Fire due timers, prune_batch per statement (idemflow_fire_timers: each
 * tenant in turn, timers and their workflows taken with SKIP LOCKED, so
 * reapers never fire one twice nor wait on each other; a timer that fails
 * parks its workflow and the rest go on), until a batch takes none (a
 * batch is shared fairly among tenants, so a short one need not be the
 * last; a busy workflow's timer is skipped and stays due, for the next
 * round). Adds to n.
 */
static int reap_timers(PGconn *conn, const char *batch, struct reap_counts *n, struct err *e)
{
	const char *p[1] = { batch };

	for (;;) {
		PGresult *res = db_exec(conn,
		                        "SELECT *\n"
		                        "  FROM idemflow_fire_timers($1)\n",
		                        1, p, e);
		long taken;

		if (res == NULL)
			return -1;
		taken = atol(PQgetvalue(res, 0, 0));
		n->timers += atol(PQgetvalue(res, 0, 1));
		n->timeouts += atol(PQgetvalue(res, 0, 2));
		n->incidents += atol(PQgetvalue(res, 0, 3));
		PQclear(res);
		if (taken == 0)
			return 0;
	}
}

/* One round: leases, then timers. Returns 0, or -1 with e. */
static int reap_round(PGconn *conn, const struct conf *c, struct reap_counts *n, struct err *e)
{
	char batch[24];
	const char *p[1] = { batch };

	snprintf(batch, sizeof(batch), "%d", c->prune_batch);
	if (prune_batches(conn, "SELECT idemflow_reap($1)\n", 1, p, c->prune_batch, &n->jobs, NULL,
	                  NULL, e) < 0)
		return -1;
	return reap_timers(conn, batch, n, e);
}

/*
 * --loop: a round every interval_ms until SIGTERM or SIGINT, a line for
 * each round that did something. A database error is said on stderr and
 * the connection is reset and configured again (cli_session): the loop
 * outlives a restart or a failover with its settings.
 */
static int reap_loop(PGconn *conn, const struct conf *c, long interval_ms)
{
	struct sigaction sa;
	struct timespec ts = { interval_ms / 1000, (interval_ms % 1000) * 1000000L };
	int pinned = 1; /* main.c configured the first session */

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = reap_on_signal; /* no SA_RESTART: the sleep ends at once */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	while (!reap_stop) {
		struct reap_counts n = { 0 };
		struct err e;

		if (reap_round(conn, c, &n, &e) < 0) {
			fprintf(stderr, "idemflow: reap: %s\n", e.msg);
			/* A new session has none of the settings: pin them
			 * again, or try again next round. */
			if (PQstatus(conn) != CONNECTION_OK || !pinned) {
				PQreset(conn);
				pinned = PQstatus(conn) == CONNECTION_OK &&
				         cli_session(conn, c, &e) == 0;
				if (!pinned && PQstatus(conn) == CONNECTION_OK)
					fprintf(stderr, "idemflow: reap: %s\n", e.msg);
			}
		}
		if (n.jobs + n.timers + n.timeouts + n.incidents > 0) {
			printf("reap: jobs=%ld timers=%ld timeouts=%ld incidents=%ld\n", n.jobs,
			       n.timers, n.timeouts, n.incidents);
			fflush(stdout);
		}
		if (!reap_stop)
			nanosleep(&ts, NULL);
	}
	return EX_OK;
}

/*
 * reap: expired job leases back to activatable, prune_batch jobs per
 * statement (each its own transaction, rows taken with SKIP LOCKED so a
 * concurrent activation is never waited on; sql/005_runs.sql's
 * idemflow_reap), until a batch comes back short; then the due timers.
 * Prints "reap: jobs=N", and "reap: timers=N timeouts=M incidents=K" when
 * any fired or failed.
 * --loop [--interval MS] does it again every MS (default 200) until
 * signalled.
 */
int cli_reap(PGconn *conn, struct conf *c, int argc, char **argv)
{
	static const char *const options[] = { "--prune-batch", NULL };
	struct reap_counts n = { 0 };
	long interval_ms = 200;
	char *rest[16], *end;
	int nrest = 0, loop = 0, rc, failed;
	struct err e;

	if (argc >= (int)(sizeof(rest) / sizeof(rest[0])))
		return cli_usage_error();
	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--loop") == 0) {
			loop = 1;
		} else if (strcmp(argv[i], "--interval") == 0 ||
		           strncmp(argv[i], "--interval=", 11) == 0) {
			const char *v = argv[i][10] == '=' ? argv[i] + 11 : NULL;
			if (v == NULL && i + 1 < argc)
				v = argv[++i];
			errno = 0;
			interval_ms = v != NULL ? strtol(v, &end, 10) : -1;
			if (v == NULL || *end != '\0' || end == v || errno != 0 ||
			    interval_ms < 10 || interval_ms > 3600000) {
				fprintf(stderr, "idemflow: --interval takes milliseconds, 10 to "
				                "3600000\n");
				return EX_USAGE;
			}
		} else {
			rest[nrest++] = argv[i];
		}
	}
	rest[nrest] = NULL;
	rc = prune_options(c, nrest, rest, options, 0);
	if (rc != EX_OK)
		return rc;
	if (loop)
		return reap_loop(conn, c, interval_ms);
	failed = reap_round(conn, c, &n, &e) < 0;
	printf("reap: jobs=%ld\n", n.jobs);
	if (n.timers + n.timeouts + n.incidents > 0)
		printf("reap: timers=%ld timeouts=%ld incidents=%ld\n", n.timers, n.timeouts,
		       n.incidents);
	return failed ? cli_db_fail(&e) : EX_OK;
}
