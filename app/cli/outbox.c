/*
 * outbox.c - "idemflow outbox": look at the transactional outbox (list,
 * show) and revive events (requeue) for the dispatcher to deliver again.
 * Delivering is the dispatcher's (app/dispatch); deleting delivered
 * events is prune's (prune.c).
 */
#include <stdio.h>
#include <string.h>
#include <sysexits.h>

#include "cli/cli.h"
#include "core/db.h"

/* An outbox event named by its numeric id or its event id. */
#define OUTBOX_WHERE "(CASE WHEN $1 ~ '^[0-9]+$' THEN id = $1::bigint ELSE event_id = $1 END)"

#define OUTBOX_STATE                                                                               \
	"CASE WHEN published_at IS NOT NULL THEN 'published'\n"                                    \
	"     WHEN dead_at IS NOT NULL THEN 'dead'\n"                                              \
	"     WHEN next_attempt_at = 'infinity' THEN 'held'\n"                                     \
	"     ELSE 'pending' END"

/* The events parked behind a dead one that requeueing it makes due: the
 * later ones of its workflow that no other dead event holds back
 * (sql/012_held_events.sql). d is the requeued event's row. */
#define OUTBOX_UNPARK                                                                              \
	"UPDATE outbox h\n"                                                                        \
	"   SET next_attempt_at = now()\n"                                                         \
	"  FROM outbox d\n"                                                                        \
	" WHERE d.id IN (SELECT id FROM up) AND h.tenant_id = d.tenant_id\n"                       \
	"   AND h.workflow_id = d.workflow_id AND h.seq > d.seq\n"                                 \
	"   AND h.next_attempt_at = 'infinity' AND h.published_at IS NULL AND h.dead_at IS NULL\n" \
	"   AND NOT EXISTS (SELECT 1\n"                                                            \
	"                     FROM outbox x\n"                                                     \
	"                    WHERE x.tenant_id = h.tenant_id AND x.workflow_id = h.workflow_id\n"  \
	"                      AND x.dead_at IS NOT NULL AND x.seq < h.seq\n"                      \
	"                      AND x.id NOT IN (SELECT id FROM up))\n"

/* outbox list: one statement per filter, whole at compile time. $1 limit. */
#define OUTBOX_LIST(filter)                                                                        \
	"SELECT id, event_id, type,\n"                                                             \
	"       " OUTBOX_STATE ",\n"                                                               \
	"       attempts,\n"                                                                       \
	"       to_char(next_attempt_at AT TIME ZONE 'UTC',\n"                                     \
	"               'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),\n"                                      \
	"       coalesce(left(last_error, 80), '')\n"                                              \
	"  FROM outbox\n"                                                                          \
	" WHERE " filter "\n"                                                                      \
	" ORDER BY id\n"                                                                           \
	" LIMIT $1::bigint\n"

static const struct {
	const char *option; /* NULL: the default */
	const char *sql;
} outbox_lists[] = {
	{ NULL, OUTBOX_LIST("published_at IS NULL") },
	{ "--pending", OUTBOX_LIST("published_at IS NULL AND dead_at IS NULL") },
	{ "--dead", OUTBOX_LIST("dead_at IS NOT NULL") },
	{ "--published", OUTBOX_LIST("published_at IS NOT NULL") },
};

/* The statement an option of outbox list names, or NULL. */
static const char *outbox_list_sql(const char *option)
{
	for (size_t k = 1; k < sizeof(outbox_lists) / sizeof(outbox_lists[0]); k++)
		if (strcmp(option, outbox_lists[k].option) == 0)
			return outbox_lists[k].sql;
	return NULL;
}

/* outbox list [--pending|--dead|--published] [--limit N]: the last
 * filter named counts. */
static int outbox_list(PGconn *conn, int argc, char **argv)
{
	const char *sql = outbox_lists[0].sql, *limit = "100", *filter;
	PGresult *res;
	struct err e;

	for (int i = 1; i < argc; i++) {
		if ((filter = outbox_list_sql(argv[i])) != NULL)
			sql = filter;
		else if (strcmp(argv[i], "--limit") == 0 && i + 1 < argc)
			limit = argv[++i];
		else
			return cli_usage_error();
	}
	const char *p[1] = { limit };
	res = db_exec(conn, sql, 1, p, &e);
	if (res == NULL) {
		if (strcmp(e.sqlstate, "22P02") == 0) {
			fprintf(stderr, "idemflow: invalid --limit \"%s\"\n", limit);
			return EX_USAGE;
		}
		return cli_db_fail(&e);
	}
	printf("id\tevent_id\ttype\tstate\tattempts\tnext_attempt_at\tlast_error\n");
	cli_print_rows(res);
	PQclear(res);
	return EX_OK;
}

/* outbox show ID: every column, one a line, NULL as "-". */
static int outbox_show(PGconn *conn, const char *id)
{
	const char *p[1] = { id };
	PGresult *res;
	struct err e;
	int rc = EX_OK;

	res = db_exec(conn,
	              "SELECT id, event_id, type, workflow_id, seq, tenant_id,\n"
	              "       " OUTBOX_STATE ",\n"
	              "       attempts, created_at, next_attempt_at, published_at, dead_at,\n"
	              "       lease_owner, lease_until, last_error, payload\n"
	              "  FROM outbox\n"
	              " WHERE " OUTBOX_WHERE "\n",
	              1, p, &e);
	if (res == NULL)
		return cli_db_fail(&e);
	if (PQntuples(res) == 0) {
		fprintf(stderr, "idemflow: no outbox event \"%s\"\n", id);
		rc = EX_DATAERR;
		goto out;
	}
	for (int f = 0; f < PQnfields(res); f++)
		printf("%-16s %s\n", PQfname(res, f),
		       PQgetisnull(res, 0, f) ? "-" : PQgetvalue(res, 0, f));
out:
	PQclear(res);
	return rc;
}

/*
 * outbox requeue ID [--force]: the event is due now with a full set of
 * attempts. An event whose lease has not run out may be on the network
 * right now: clearing the lease would let a second dispatcher claim it
 * while the first still delivers it, and the first's outcome would no
 * longer be recorded. So it is refused (EX_TEMPFAIL: the lease ends by
 * itself) unless force, which warns. Reading the lease and requeueing are
 * one statement on the locked row, so a claim cannot slip in between.
 */
static int outbox_requeue(PGconn *conn, const char *id, int force)
{
	const char *p[2] = { id, force ? "t" : "f" };
	PGresult *res;
	struct err e;
	int rc = EX_OK;

	res = db_exec(conn,
	              "WITH ev AS (\n"
	              "  SELECT id, lease_owner, lease_until > now() AS held,\n"
	              "         to_char(lease_until AT TIME ZONE 'UTC',\n"
	              "                 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS until\n"
	              "    FROM outbox\n"
	              "   WHERE " OUTBOX_WHERE " AND published_at IS NULL\n"
	              "     FOR UPDATE\n"
	              "), up AS (\n"
	              "  UPDATE outbox o\n"
	              "     SET dead_at = NULL, attempts = 0,\n"
	              "         next_attempt_at = now(), lease_owner = NULL, lease_until = NULL\n"
	              "    FROM ev\n"
	              "   WHERE o.id = ev.id AND ($2::bool OR NOT coalesce(ev.held, false))\n"
	              "  RETURNING o.id\n"
	              "), unpark AS (\n"
	              "" OUTBOX_UNPARK "\n"
	              ")\n"
	              "SELECT coalesce(ev.held, false), coalesce(ev.lease_owner, ''), ev.until,\n"
	              "       up.id IS NOT NULL\n"
	              "  FROM ev\n"
	              "  LEFT JOIN up ON up.id = ev.id\n",
	              2, p, &e);
	if (res == NULL)
		return cli_db_fail(&e);
	if (PQntuples(res) == 0) {
		fprintf(stderr, "idemflow: no undelivered outbox event \"%s\"\n", id);
		rc = EX_DATAERR;
	} else if (strcmp(PQgetvalue(res, 0, 3), "t") != 0) {
		fprintf(stderr,
		        "idemflow: outbox event \"%s\" is held by dispatcher \"%s\" until %s and "
		        "may be in delivery; requeue it after that, or with --force\n",
		        id, PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 2));
		rc = EX_TEMPFAIL;
	} else {
		if (strcmp(PQgetvalue(res, 0, 0), "t") == 0)
			fprintf(stderr,
			        "idemflow: warning: broke the lease of dispatcher \"%s\" on outbox "
			        "event \"%s\" (until %s): the event may be delivered twice, and "
			        "that dispatcher's outcome for it is not recorded\n",
			        PQgetvalue(res, 0, 1), id, PQgetvalue(res, 0, 2));
		printf("requeued 1 event(s)\n");
	}
	PQclear(res);
	return rc;
}

/* outbox requeue --dead: every dead event. A dead event is never held:
 * the statement that makes it dead clears its lease. Each gets a full
 * set of attempts again. */
static int outbox_requeue_dead(PGconn *conn)
{
	PGresult *res;
	struct err e;

	res = db_exec(conn,
	              "WITH up AS (\n"
	              "  UPDATE outbox\n"
	              "     SET dead_at = NULL, attempts = 0,\n"
	              "         next_attempt_at = now(), lease_owner = NULL,\n"
	              "         lease_until = NULL\n"
	              "   WHERE dead_at IS NOT NULL\n"
	              "  RETURNING id\n"
	              "), unpark AS (\n"
	              "" OUTBOX_UNPARK "\n"
	              ")\n"
	              "SELECT count(*)\n"
	              "  FROM up\n",
	              0, NULL, &e);
	if (res == NULL)
		return cli_db_fail(&e);
	printf("requeued %s event(s)\n", PQgetvalue(res, 0, 0));
	PQclear(res);
	return EX_OK;
}

int cli_outbox(PGconn *conn, struct conf *c, int argc, char **argv)
{
	if (argc >= 1 && argc <= 4 && strcmp(argv[0], "list") == 0)
		return outbox_list(conn, argc, argv);
	if (argc == 2 && strcmp(argv[0], "show") == 0)
		return outbox_show(conn, argv[1]);
	if (argc == 2 && strcmp(argv[0], "requeue") == 0 && strcmp(argv[1], "--dead") == 0)
		return outbox_requeue_dead(conn);
	if ((argc == 2 || (argc == 3 && strcmp(argv[2], "--force") == 0)) &&
	    strcmp(argv[0], "requeue") == 0 && argv[1][0] != '-')
		return outbox_requeue(conn, argv[1], argc == 3);
	return cli_usage_error();
}
