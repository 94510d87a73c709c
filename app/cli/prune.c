/*
 * prune.c - the CLI's two cron jobs: "idemflow prune" deletes expired
 * idempotency keys (with their counts) and delivered outbox events past
 * outbox_retention; "idemflow reap" hands jobs whose lease ran out back
 * to activation. Both work in batches of prune_batch rows, one short
 * transaction each, until a batch comes back short, and both print what
 * they did even when a later batch failed: every batch before it is
 * committed. Not for the server, which never deletes and only reaps
 * lazily, as it activates a job.
 */
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
	"WITH d AS ("                                                                              \
	"  DELETE FROM idempotency_keys"                                                           \
	"   WHERE ctid = ANY(ARRAY("                                                               \
	"           SELECT ctid FROM idempotency_keys WHERE expires_at <= $1::timestamptz"         \
	"            ORDER BY expires_at LIMIT $2::int FOR UPDATE SKIP LOCKED))"                   \
	"  RETURNING tenant_id, key"                                                               \
	"), s AS ("                                                                                \
	"  DELETE FROM idempotency_key_stats st USING d"                                           \
	"   WHERE st.tenant_id = d.tenant_id AND st.key = d.key"                                   \
	"  RETURNING 1"                                                                            \
	")"                                                                                        \
	" SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM s)"

/* Delivered events only: a dead or pending event has no published_at.
 * Nothing references an event, and the workflow it announced stays. */
#define PRUNE_EVENTS                                                                               \
	"WITH d AS ("                                                                              \
	"  DELETE FROM outbox"                                                                     \
	"   WHERE ctid = ANY(ARRAY("                                                               \
	"           SELECT ctid FROM outbox WHERE published_at < $1::timestamptz"                  \
	"            ORDER BY published_at LIMIT $2::int FOR UPDATE SKIP LOCKED))"                 \
	"  RETURNING 1"                                                                            \
	")"                                                                                        \
	" SELECT count(*), 0 FROM d"

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
	static const char *const options[] = { "--outbox-retention", "--prune-batch", NULL };
	long keys = 0, key_stats = 0, events = 0;
	int statements = 0, rc;
	char ms[24], batch[16], key_cutoff[64], event_cutoff[64];
	struct timespec t0, t1;
	PGresult *res;
	struct err e;

	rc = prune_options(c, argc, argv, options, 1);
	if (rc != EX_OK)
		return rc;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	snprintf(ms, sizeof(ms), "%ld", c->outbox_retention);
	const char *p[1] = { ms };
	res =
	    db_exec(conn, "SELECT now(), now() - $1::bigint * interval '1 millisecond'", 1, p, &e);
	if (res == NULL)
		return cli_db_fail(&e);
	snprintf(key_cutoff, sizeof(key_cutoff), "%s", PQgetvalue(res, 0, 0));
	snprintf(event_cutoff, sizeof(event_cutoff), "%s", PQgetvalue(res, 0, 1));
	PQclear(res);

	snprintf(batch, sizeof(batch), "%d", c->prune_batch);
	const char *pk[2] = { key_cutoff, batch }, *pe[2] = { event_cutoff, batch };
	int failed = prune_batches(conn, PRUNE_KEYS, 2, pk, c->prune_batch, &keys, &key_stats,
	                           &statements, &e) < 0 ||
	             prune_batches(conn, PRUNE_EVENTS, 2, pe, c->prune_batch, &events, NULL,
	                           &statements, &e) < 0;
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("prune: keys=%ld key_stats=%ld events=%ld statements=%d duration_s=%.3f\n", keys,
	       key_stats, events, statements,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	return failed ? cli_db_fail(&e) : EX_OK;
}

/*
 * reap: expired job leases back to activatable, prune_batch jobs per
 * statement (each its own transaction, rows taken with SKIP LOCKED so a
 * concurrent activation is never waited on; sql/005_runs.sql's
 * idemflow_reap), until a batch comes back short.
 */
int cli_reap(PGconn *conn, struct conf *c, int argc, char **argv)
{
	static const char *const options[] = { "--prune-batch", NULL };
	char batch[24];
	long jobs = 0;
	struct err e;
	int rc, failed;

	rc = prune_options(c, argc, argv, options, 0);
	if (rc != EX_OK)
		return rc;
	snprintf(batch, sizeof(batch), "%d", c->prune_batch);
	const char *p[1] = { batch };
	failed = prune_batches(conn, "SELECT idemflow_reap($1)", 1, p, c->prune_batch, &jobs, NULL,
	                       NULL, &e) < 0;
	printf("reap: jobs=%ld\n", jobs);
	return failed ? cli_db_fail(&e) : EX_OK;
}
