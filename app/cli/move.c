/*
 * move.c - "idemflow tenant move NAME --to N": move one tenant, every row
 * of it, to another partition of a partitioned deployment
 * (doc/distribution.md, "Moving a tenant"). The connection the CLI opens
 * is the proxy (db, with routing = proxy); the partitions are the
 * configuration's partitions, each reached with a connection of its own.
 *
 * The steps, each safe to run again (a move that stopped half-way is
 * finished by the same command, or undone by a move back to the
 * partition the directory names):
 *   1. the proxy's directory marks the tenant moving: its calls are
 *      refused (503, Retry-After) and reach no partition;
 *   2. the source freezes it (sql/030_tenant_move.sql): it waits for the
 *      tenant's event transactions under way, and refuses later ones;
 *      then the dispatcher's leases of its events run out or end;
 *   3. every row of the tenant is copied, in one transaction of the
 *      target (frozen there too), from one snapshot of the source, with
 *      the ids it has; the counts per table are compared before the
 *      commit;
 *   4. the directory names the target and clears the mark, in one row:
 *      the tenant is served again, by the target only;
 *   5. the target unfreezes it, the source deletes it.
 * A failure before 4 undoes 3, 2 and 1: the source serves the tenant as
 * before. Not for a single database: there is nowhere to move to.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <time.h>

#include "cli/cli.h"
#include "core/db.h"

/* The tenant's tables, parents first (their foreign keys), each with the
 * statement that reads its rows of the tenant named by idemflow.move_tenant
 * on the source and the one that writes them on the target. Binary COPY:
 * both ends run the same schema version (checked first). */
static const struct {
	const char *name;
	const char *out;
	const char *in;
} move_tables[] = {
	{ "tenants",
	  "COPY (SELECT * FROM tenants\n"
	  "       WHERE id = current_setting('idemflow.move_tenant')::bigint)\n"
	  "  TO STDOUT (FORMAT binary)\n",
	  "COPY tenants FROM STDIN (FORMAT binary)\n" },
	{ "api_tokens",
	  "COPY (SELECT * FROM api_tokens\n"
	  "       WHERE tenant_id = current_setting('idemflow.move_tenant')::bigint)\n"
	  "  TO STDOUT (FORMAT binary)\n",
	  "COPY api_tokens FROM STDIN (FORMAT binary)\n" },
	{ "endpoints",
	  "COPY (SELECT * FROM endpoints\n"
	  "       WHERE tenant_id = current_setting('idemflow.move_tenant')::bigint)\n"
	  "  TO STDOUT (FORMAT binary)\n",
	  "COPY endpoints FROM STDIN (FORMAT binary)\n" },
	{ "workflows",
	  "COPY (SELECT * FROM workflows\n"
	  "       WHERE tenant_id = current_setting('idemflow.move_tenant')::bigint)\n"
	  "  TO STDOUT (FORMAT binary)\n",
	  "COPY workflows FROM STDIN (FORMAT binary)\n" },
	{ "jobs",
	  "COPY (SELECT * FROM jobs\n"
	  "       WHERE tenant_id = current_setting('idemflow.move_tenant')::bigint)\n"
	  "  TO STDOUT (FORMAT binary)\n",
	  "COPY jobs FROM STDIN (FORMAT binary)\n" },
	{ "messages",
	  "COPY (SELECT * FROM messages\n"
	  "       WHERE tenant_id = current_setting('idemflow.move_tenant')::bigint)\n"
	  "  TO STDOUT (FORMAT binary)\n",
	  "COPY messages FROM STDIN (FORMAT binary)\n" },
	{ "timers",
	  "COPY (SELECT * FROM timers\n"
	  "       WHERE tenant_id = current_setting('idemflow.move_tenant')::bigint)\n"
	  "  TO STDOUT (FORMAT binary)\n",
	  "COPY timers FROM STDIN (FORMAT binary)\n" },
	{ "idempotency_keys",
	  "COPY (SELECT * FROM idempotency_keys\n"
	  "       WHERE tenant_id = current_setting('idemflow.move_tenant')::bigint)\n"
	  "  TO STDOUT (FORMAT binary)\n",
	  "COPY idempotency_keys FROM STDIN (FORMAT binary)\n" },
	{ "idempotency_key_stats",
	  "COPY (SELECT * FROM idempotency_key_stats\n"
	  "       WHERE tenant_id = current_setting('idemflow.move_tenant')::bigint)\n"
	  "  TO STDOUT (FORMAT binary)\n",
	  "COPY idempotency_key_stats FROM STDIN (FORMAT binary)\n" },
	{ "outbox",
	  "COPY (SELECT * FROM outbox\n"
	  "       WHERE tenant_id = current_setting('idemflow.move_tenant')::bigint)\n"
	  "  TO STDOUT (FORMAT binary)\n",
	  "COPY outbox FROM STDIN (FORMAT binary)\n" },
	{ "deliveries",
	  "COPY (SELECT * FROM deliveries\n"
	  "       WHERE tenant_id = current_setting('idemflow.move_tenant')::bigint)\n"
	  "  TO STDOUT (FORMAT binary)\n",
	  "COPY deliveries FROM STDIN (FORMAT binary)\n" },
	{ "delivery_attempts",
	  "COPY (SELECT * FROM delivery_attempts\n"
	  "       WHERE tenant_id = current_setting('idemflow.move_tenant')::bigint)\n"
	  "  TO STDOUT (FORMAT binary)\n",
	  "COPY delivery_attempts FROM STDIN (FORMAT binary)\n" },
};

#define MOVE_TABLES ((int)(sizeof(move_tables) / sizeof(move_tables[0])))

/* How long the move waits for a dispatcher's lease of the tenant's events
 * to end: the dispatcher's default lease (idemflow.conf(5), lease). A
 * longer lease that is still held then fails the move, which is undone. */
#define MOVE_LEASE_WAIT_MS 120000L

/* One move: the tenant, both ends and their connections. */
struct move {
	const char *name;
	char id[24];  /* the tenant's id, as text */
	int from, to; /* partition numbers */
	char from_s[12], to_s[12];
	PGconn *proxy; /* borrowed */
	PGconn *src, *dst;
	long long rows;
};

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000.0 + t.tv_nsec / 1e6;
}

/* Run sql on conn; 0, or -1 with the failure printed (what says which
 * step). The result is dropped; *out, when given, gets the first field of
 * the first row (or "" when none), at most outsz bytes. */
static int move_exec(PGconn *conn, const char *what, const char *sql, int n, const char *const *p,
                     char *out, size_t outsz)
{
	struct err e;
	PGresult *res = db_exec(conn, sql, n, p, &e);

	if (res == NULL) {
		fprintf(stderr, "idemflow: tenant move: %s: %s\n", what, e.msg);
		return -1;
	}
	if (out != NULL)
		snprintf(out, outsz, "%s",
		         PQntuples(res) > 0 && PQnfields(res) > 0 ? PQgetvalue(res, 0, 0) : "");
	PQclear(res);
	return 0;
}

/* Connect to partition i: the session as the CLI's (cli_session), or NULL
 * with the failure printed. */
static PGconn *move_connect(const struct conf *c, int i)
{
	char *db = conf_partition_db(c, i);
	PGconn *conn = NULL;
	struct err e;

	if (db == NULL) {
		fprintf(stderr, "idemflow: out of memory\n");
		return NULL;
	}
	conn = db_connect_retry(db, "idemflow-cli", 6, &e);
	free(db);
	if (conn == NULL || cli_session(conn, c, &e) < 0) {
		fprintf(stderr, "idemflow: tenant move: partition %d: %s\n", i, e.msg);
		PQfinish(conn);
		return NULL;
	}
	return conn;
}

/* The tenant's row counts on conn, in the order of idemflow_tenant_counts,
 * as one line "tbl=n ..." in buf. 0 or -1 (printed). */
static int move_counts(PGconn *conn, const char *what, const char *id, char *buf, size_t sz,
                       long long *total)
{
	const char *p[1] = { id };
	struct err e;
	PGresult *res;
	size_t used = 0;

	res = db_exec(conn, "SELECT tbl, n FROM idemflow_tenant_counts($1::bigint)\n", 1, p, &e);
	if (res == NULL) {
		fprintf(stderr, "idemflow: tenant move: %s: %s\n", what, e.msg);
		return -1;
	}
	buf[0] = '\0';
	*total = 0;
	for (int i = 0; i < PQntuples(res) && used < sz; i++) {
		used += snprintf(buf + used, sz - used, "%s%s=%s", i ? " " : "",
		                 PQgetvalue(res, i, 0), PQgetvalue(res, i, 1));
		*total += atoll(PQgetvalue(res, i, 1));
	}
	PQclear(res);
	return 0;
}

/* Stream one table's rows of the tenant from src to dst (both inside
 * their transactions). 0 or -1 (printed). */
static int move_copy_table(struct move *m, int t)
{
	PGresult *res;
	char *row = NULL;
	int n, rc = -1;

	res = PQexec(m->src, move_tables[t].out);
	if (PQresultStatus(res) != PGRES_COPY_OUT) {
		fprintf(stderr, "idemflow: tenant move: reading %s on partition %d: %s",
		        move_tables[t].name, m->from, PQerrorMessage(m->src));
		PQclear(res);
		return -1;
	}
	PQclear(res);
	res = PQexec(m->dst, move_tables[t].in);
	if (PQresultStatus(res) != PGRES_COPY_IN) {
		fprintf(stderr, "idemflow: tenant move: writing %s on partition %d: %s",
		        move_tables[t].name, m->to, PQerrorMessage(m->dst));
		PQclear(res);
		/* Drain the source's copy so its session stays usable. */
		while (PQgetCopyData(m->src, &row, 0) > 0)
			PQfreemem(row);
		while ((res = PQgetResult(m->src)) != NULL)
			PQclear(res);
		return -1;
	}
	PQclear(res);
	while ((n = PQgetCopyData(m->src, &row, 0)) > 0) {
		if (PQputCopyData(m->dst, row, n) != 1) {
			PQfreemem(row);
			goto drain;
		}
		PQfreemem(row);
	}
	if (n == -2) {
		PQputCopyEnd(m->dst, "the source's copy failed");
		goto drain;
	}
	if (PQputCopyEnd(m->dst, NULL) != 1)
		goto drain;
	rc = 0;
drain:
	while (PQgetCopyData(m->src, &row, 0) > 0)
		PQfreemem(row);
	while ((res = PQgetResult(m->src)) != NULL) {
		if (PQresultStatus(res) != PGRES_COMMAND_OK) {
			fprintf(stderr, "idemflow: tenant move: reading %s on partition %d: %s",
			        move_tables[t].name, m->from, PQresultErrorMessage(res));
			rc = -1;
		}
		PQclear(res);
	}
	while ((res = PQgetResult(m->dst)) != NULL) {
		if (PQresultStatus(res) != PGRES_COMMAND_OK) {
			fprintf(stderr, "idemflow: tenant move: writing %s on partition %d: %s",
			        move_tables[t].name, m->to, PQresultErrorMessage(res));
			rc = -1;
		}
		PQclear(res);
	}
	return rc;
}

/* Step 3: copy every row of the tenant to the target, frozen there, in
 * one transaction, and check the counts. 0, or -1 (printed, the target's
 * transaction rolled back). */
static int move_copy(struct move *m)
{
	const char *p[3] = { m->id, "target", m->from_s };
	char want[512], got[512];
	long long total;
	struct err e;
	PGresult *res;

	/* One snapshot of the source: every table as of one moment, after
	 * the freeze, so nothing of the tenant changes under it anyway. */
	if (move_exec(m->src, "partition's snapshot",
	              "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL, NULL, 0) < 0 ||
	    move_exec(m->src, "partition's snapshot",
	              "SELECT set_config('idemflow.move_tenant', $1, true),\n"
	              "       set_config('statement_timeout', '0', true)\n",
	              1, p, NULL, 0) < 0 ||
	    move_counts(m->src, "counting the source's rows", m->id, want, sizeof(want), &total) <
	        0)
		goto fail;
	m->rows = total;
	if (move_exec(m->dst, "the copy", "BEGIN", 0, NULL, NULL, 0) < 0 ||
	    move_exec(m->dst, "the copy",
	              "SELECT set_config('idemflow.move_tenant', $1, true),\n"
	              "       set_config('statement_timeout', '0', true)\n",
	              1, p, NULL, 0) < 0 ||
	    move_exec(m->dst, "freezing the tenant on the target",
	              "SELECT idemflow_tenant_freeze($1::bigint, $2, $3::integer)\n", 3, p, NULL,
	              0) < 0)
		goto fail;
	for (int t = 0; t < MOVE_TABLES; t++)
		if (move_copy_table(m, t) < 0)
			goto fail;
	if (move_counts(m->dst, "counting the copy", m->id, got, sizeof(got), &total) < 0)
		goto fail;
	if (strcmp(want, got) != 0) {
		fprintf(stderr,
		        "idemflow: tenant move: the copy's counts differ: partition %d has %s, "
		        "the copy %s\n",
		        m->from, want, got);
		goto fail;
	}
	if (move_exec(m->dst, "committing the copy", "COMMIT", 0, NULL, NULL, 0) < 0)
		goto fail;
	res = db_exec(m->src, "COMMIT", 0, NULL, &e);
	PQclear(res);
	return 0;
fail:
	res = db_exec(m->dst, "ROLLBACK", 0, NULL, &e);
	PQclear(res);
	res = db_exec(m->src, "ROLLBACK", 0, NULL, &e);
	PQclear(res);
	return -1;
}

/* Wait until no event or delivery of the tenant is leased on the source
 * (the dispatcher's claims skip a frozen tenant; the ones it holds end,
 * or run out after the dispatcher's lease). 0 or -1 (printed). */
static int move_wait_leases(struct move *m, long wait_ms)
{
	const char *p[1] = { m->id };
	double until = now_ms() + wait_ms;
	char n[24];

	for (;;) {
		if (move_exec(m->src, "the dispatcher's leases",
		              "SELECT (SELECT count(*) FROM outbox\n"
		              "         WHERE tenant_id = $1::bigint AND lease_until > now()\n"
		              "           AND published_at IS NULL AND dead_at IS NULL)\n"
		              "     + (SELECT count(*) FROM deliveries\n"
		              "         WHERE tenant_id = $1::bigint AND lease_until > now()\n"
		              "           AND state = 'pending')\n",
		              1, p, n, sizeof(n)) < 0)
			return -1;
		if (strcmp(n, "0") == 0)
			return 0;
		if (now_ms() > until) {
			fprintf(
			    stderr,
			    "idemflow: tenant move: %s of the tenant's events still leased by a "
			    "dispatcher after %ld ms\n",
			    n, wait_ms);
			return -1;
		}
		nanosleep(&(struct timespec){ 0, 50 * 1000000L }, NULL);
	}
}

/* Undo a move that did not reach the directory's flip: the target's copy
 * deleted, the source unfrozen, the mark cleared. */
static void move_undo(struct move *m)
{
	const char *p[1] = { m->id };
	const char *del = "SELECT idemflow_tenant_delete($1::bigint)\n"
	                  "  FROM frozen_tenants\n"
	                  " WHERE tenant_id = $1::bigint AND role = 'target'\n";

	if (move_exec(m->dst, "undoing the copy", del, 1, p, NULL, 0) < 0 ||
	    move_exec(
	        m->src, "unfreezing the source",
	        "DELETE FROM frozen_tenants WHERE tenant_id = $1::bigint AND role = 'source'\n", 1,
	        p, NULL, 0) < 0 ||
	    move_exec(m->proxy, "clearing the directory's mark",
	              "UPDATE idemflow_tenant_partitions\n"
	              "   SET moving_to = NULL, moving_since = NULL\n"
	              " WHERE tenant_id = $1::bigint\n",
	              1, p, NULL, 0) < 0)
		fprintf(
		    stderr,
		    "idemflow: tenant move: not undone: run \"tenant move %s --to %d\" again to "
		    "undo it, or --to %d to finish it\n",
		    m->name, m->from, m->to);
	else
		fprintf(stderr, "idemflow: tenant move: undone: tenant %s stays on partition %d\n",
		        m->name, m->from);
}

/* The tenant's id and where it lives: found by name on the partitions
 * (the proxy knows no names), its place from the directory. Returns
 * EX_OK with m->id, m->from and *moving_to (-1: not moving) set. */
static int move_find(struct move *m, const struct conf *c, int *moving_to)
{
	const char *p[1] = { m->name };
	char id[24], part[12], to[12];
	PGconn *conn;

	m->id[0] = '\0';
	for (int i = 0; i < conf_partition_count(c); i++) {
		conn = move_connect(c, i);
		if (conn == NULL)
			return EX_TEMPFAIL;
		if (move_exec(conn, "finding the tenant",
		              "SELECT id FROM tenants WHERE name = $1\n", 1, p, id,
		              sizeof(id)) < 0) {
			PQfinish(conn);
			return EX_TEMPFAIL;
		}
		PQfinish(conn);
		if (id[0] == '\0')
			continue;
		if (m->id[0] != '\0' && strcmp(m->id, id) != 0) {
			fprintf(stderr,
			        "idemflow: tenant move: two tenants named \"%s\" (ids %s and %s): "
			        "names are unique per partition only\n",
			        m->name, m->id, id);
			return EX_DATAERR;
		}
		snprintf(m->id, sizeof(m->id), "%s", id);
	}
	if (m->id[0] == '\0') {
		fprintf(stderr, "idemflow: no tenant named \"%s\"\n", m->name);
		return EX_DATAERR;
	}
	p[0] = m->id;
	if (move_exec(
	        m->proxy, "reading the directory",
	        "SELECT partition FROM idemflow_tenant_partitions WHERE tenant_id = $1::bigint\n",
	        1, p, part, sizeof(part)) < 0 ||
	    move_exec(m->proxy, "reading the directory",
	              "SELECT coalesce(moving_to, -1)\n"
	              "  FROM idemflow_tenant_partitions\n"
	              " WHERE tenant_id = $1::bigint\n",
	              1, p, to, sizeof(to)) < 0)
		return EX_TEMPFAIL;
	if (part[0] == '\0') {
		fprintf(stderr,
		        "idemflow: tenant move: tenant %s is not in the proxy's directory: run "
		        "SELECT idemflow_directory_sync() on the proxy first\n",
		        m->name);
		return EX_DATAERR;
	}
	m->from = atoi(part);
	*moving_to = atoi(to);
	return EX_OK;
}

/* Both ends run the same schema, the target draws its ids from its own
 * range, and none of the tenant's ids is one the target will still draw:
 * the rows keep their ids there. EX_OK or the status (printed). */
static int move_check(struct move *m)
{
	char v1[12], v2[12], ok[4], fit[4];
	const char *p2[1] = { m->to_s };
	const char *fp[6] = { m->id, m->to_s };
	struct err e;
	PGresult *res;

	if (move_exec(m->src, "the source's schema", "SELECT max(version) FROM schema_migrations",
	              0, NULL, v1, sizeof(v1)) < 0 ||
	    move_exec(m->dst, "the target's schema", "SELECT max(version) FROM schema_migrations",
	              0, NULL, v2, sizeof(v2)) < 0)
		return EX_TEMPFAIL;
	if (strcmp(v1, v2) != 0) {
		fprintf(
		    stderr,
		    "idemflow: tenant move: partition %d is at schema version %s, partition %d at "
		    "%s: migrate both first\n",
		    m->from, v1, m->to, v2);
		return EX_DATAERR;
	}
	if (move_exec(m->dst, "the target's ids",
	              "SELECT idemflow_partition_ids_in_range($1::integer)", 1, p2, ok,
	              sizeof(ok)) < 0)
		return EX_TEMPFAIL;
	if (strcmp(ok, "t") != 0) {
		fprintf(stderr,
		        "idemflow: tenant move: partition %d draws ids outside its range: run "
		        "SELECT idemflow_partition_ids(%d) on it first\n",
		        m->to, m->to);
		return EX_DATAERR;
	}
	res = db_exec(m->dst, "SELECT * FROM idemflow_partition_ids_last()", 0, NULL, &e);
	if (res == NULL || PQntuples(res) != 1) {
		fprintf(stderr, "idemflow: tenant move: the target's ids: %s\n",
		        res == NULL ? e.msg : "no row");
		PQclear(res);
		return EX_TEMPFAIL;
	}
	for (int i = 0; i < 4; i++)
		fp[2 + i] = PQgetvalue(res, 0, i);
	if (move_exec(
	        m->src, "the tenant's ids",
	        "SELECT idemflow_tenant_ids_fit($1::bigint, $2::integer, $3::bigint, $4::bigint,\n"
	        "                               $5::bigint, $6::bigint)\n",
	        6, fp, fit, sizeof(fit)) < 0) {
		PQclear(res);
		return EX_TEMPFAIL;
	}
	PQclear(res);
	if (strcmp(fit, "t") != 0) {
		fprintf(
		    stderr,
		    "idemflow: tenant move: tenant %s has ids that partition %d will still draw: "
		    "they would collide there\n",
		    m->name, m->to);
		return EX_DATAERR;
	}
	return EX_OK;
}

int cli_tenant_move(PGconn *proxy, const struct conf *c, const char *name, const char *to_arg)
{
	struct move m = { .name = name, .proxy = proxy };
	const char *p[2];
	char *end;
	char flipped[4], rows[24], locked[4];
	long to;
	int moving_to, rc;
	double t_mark = 0, t_frozen = 0, t_leases = 0, t_copied = 0, t_flip;

	to = strtol(to_arg, &end, 10);
	if (*to_arg == '\0' || *end != '\0' || to < 0 || to >= conf_partition_count(c)) {
		fprintf(
		    stderr,
		    "idemflow: tenant move: --to %s: the configuration's partitions are 0 to %d\n",
		    to_arg, conf_partition_count(c) - 1);
		return EX_USAGE;
	}
	m.to = (int)to;
	rc = move_find(&m, c, &moving_to);
	if (rc != EX_OK)
		return rc;
	/* One move of a tenant at a time: an undo must never meet another
	 * run's copy. The lock is the proxy session's, released when the
	 * command ends, however it ends. */
	p[0] = m.id;
	if (move_exec(proxy, "taking the tenant's move lock",
	              "SELECT pg_try_advisory_lock(\n"
	              "           hashtextextended('idemflow.tenant_move', $1::bigint))\n",
	              1, p, locked, sizeof(locked)) < 0)
		return EX_TEMPFAIL;
	if (strcmp(locked, "t") != 0) {
		fprintf(stderr, "idemflow: tenant move: another move of tenant %s is running\n",
		        name);
		return EX_TEMPFAIL;
	}
	snprintf(m.from_s, sizeof(m.from_s), "%d", m.from);
	snprintf(m.to_s, sizeof(m.to_s), "%d", m.to);
	if (moving_to >= 0 && m.to == m.from) {
		/* A move back to where the directory has it: undo the move to
		 * moving_to that stopped half-way. */
		m.to = moving_to;
		snprintf(m.to_s, sizeof(m.to_s), "%d", m.to);
		m.src = move_connect(c, m.from);
		m.dst = move_connect(c, m.to);
		rc = EX_TEMPFAIL;
		if (m.src != NULL && m.dst != NULL) {
			move_undo(&m);
			rc = EX_OK;
		}
		goto out;
	}
	if (moving_to >= 0 && moving_to != m.to) {
		fprintf(
		    stderr,
		    "idemflow: tenant move: tenant %s is being moved to partition %d: finish with "
		    "--to %d, or undo with --to %d\n",
		    name, moving_to, moving_to, m.from);
		return EX_DATAERR;
	}
	if (m.from == m.to) {
		/* Already there: delete what a stopped move left on the other
		 * partitions (frozen as its source). */
		p[0] = m.id;
		for (int i = 0; i < conf_partition_count(c); i++) {
			PGconn *conn;
			if (i == m.to)
				continue;
			conn = move_connect(c, i);
			if (conn == NULL)
				return EX_TEMPFAIL;
			rc = move_exec(conn, "deleting the source's rows",
			               "SELECT idemflow_tenant_delete($1::bigint)\n"
			               "  FROM frozen_tenants\n"
			               " WHERE tenant_id = $1::bigint AND role = 'source'\n",
			               1, p, NULL, 0);
			PQfinish(conn);
			if (rc < 0)
				return EX_TEMPFAIL;
		}
		m.dst = move_connect(c, m.to);
		if (m.dst == NULL)
			return EX_TEMPFAIL;
		rc = move_exec(m.dst, "unfreezing the target",
		               "DELETE FROM frozen_tenants WHERE tenant_id = $1::bigint\n", 1, p,
		               NULL, 0);
		PQfinish(m.dst);
		if (rc < 0)
			return EX_TEMPFAIL;
		printf("tenant %s: on partition %d\n", name, m.to);
		return EX_OK;
	}

	m.src = move_connect(c, m.from);
	m.dst = move_connect(c, m.to);
	rc = EX_TEMPFAIL;
	if (m.src == NULL || m.dst == NULL)
		goto out;
	rc = move_check(&m);
	if (rc != EX_OK)
		goto out;
	rc = EX_TEMPFAIL;

	/* 1. The mark: from now on no call of the tenant reaches a partition. */
	p[0] = m.id;
	p[1] = m.to_s;
	t_mark = now_ms();
	if (move_exec(
	        proxy, "marking the tenant moving",
	        "UPDATE idemflow_tenant_partitions\n"
	        "   SET moving_to = $2::integer, moving_since = coalesce(moving_since, now())\n"
	        " WHERE tenant_id = $1::bigint\n",
	        2, p, NULL, 0) < 0)
		goto out;

	/* 2. The fence on the source, then the dispatcher's leases. */
	{
		const char *fp[3] = { m.id, "source", m.to_s };
		if (move_exec(m.src, "freezing the tenant on the source",
		              "SELECT idemflow_tenant_freeze($1::bigint, $2, $3::integer)\n", 3, fp,
		              NULL, 0) < 0)
			goto undo;
		t_frozen = now_ms();
		if (move_wait_leases(&m, MOVE_LEASE_WAIT_MS) < 0)
			goto undo;
		t_leases = now_ms();
	}

	/* 3. The copy, unless a stopped move committed it already (the
	 * source has been frozen since: it is complete). */
	if (move_exec(m.dst, "the target's copy",
	              "SELECT count(*) FROM frozen_tenants\n"
	              " WHERE tenant_id = $1::bigint AND role = 'target'\n",
	              1, p, rows, sizeof(rows)) < 0)
		goto undo;
	if (strcmp(rows, "0") == 0 && move_copy(&m) < 0)
		goto undo;
	t_copied = now_ms();

	/* 4. The flip: the target serves the tenant. */
	if (move_exec(proxy, "naming the target in the directory",
	              "UPDATE idemflow_tenant_partitions\n"
	              "   SET partition = $2::integer, moving_to = NULL, moving_since = NULL\n"
	              " WHERE tenant_id = $1::bigint AND moving_to = $2::integer\n"
	              "RETURNING 't'\n",
	              2, p, flipped, sizeof(flipped)) < 0 ||
	    strcmp(flipped, "t") != 0) {
		fprintf(
		    stderr,
		    "idemflow: tenant move: copied, but the directory does not name partition %d "
		    "yet: run the same command again\n",
		    m.to);
		goto out;
	}
	t_flip = now_ms();

	/* 5. The target unfrozen, the source's rows deleted. */
	rc = EX_TEMPFAIL;
	if (move_exec(m.dst, "unfreezing the target",
	              "DELETE FROM frozen_tenants WHERE tenant_id = $1::bigint\n", 1, p, NULL,
	              0) < 0 ||
	    move_exec(m.src, "deleting the source's rows",
	              "SELECT idemflow_tenant_delete($1::bigint)\n", 1, p, NULL, 0) < 0) {
		fprintf(stderr,
		        "idemflow: tenant move: tenant %s is served by partition %d; run the same "
		        "command again to finish the cleanup\n",
		        name, m.to);
		goto out;
	}
	printf("tenant %s: moved from partition %d to partition %d: %lld rows; refused for %.0f ms "
	       "(freeze %.0f, leases %.0f, copy %.0f, flip %.0f)\n",
	       name, m.from, m.to, m.rows, t_flip - t_mark, t_frozen - t_mark, t_leases - t_frozen,
	       t_copied - t_leases, t_flip - t_copied);
	rc = EX_OK;
	goto out;
undo:
	move_undo(&m);
out:
	PQfinish(m.src);
	PQfinish(m.dst);
	return rc;
}
