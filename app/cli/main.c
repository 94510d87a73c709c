/*
 * idemflow - the admin CLI: migrations, tenants, API tokens, the outbox,
 * retention (prune) and idempotency debugging.
 *
 * Results go to stdout (a new token is the only thing printed by
 * "token create", so scripts can capture it); diagnostics go to stderr.
 * Exit codes follow sysexits.h: 64 usage, 65 bad data (unknown tenant,
 * duplicate name), 75 try later (database unreachable, an outbox event
 * held by a dispatcher), 78 configuration.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <time.h>

#include <json-c/json.h>

#include "config.h"
#include "core/conf.h"
#include "core/db.h"
#include "core/fp.h"
#include "core/ids.h"
#include "core/migrate.h"

static void usage(FILE *out)
{
	fprintf(
	    out,
	    "Usage: idemflow [--config FILE] [--db CONNINFO] COMMAND [ARGS]\n"
	    "\n"
	    "Commands:\n"
	    "  migrate                        apply the SQL migrations (safe to repeat)\n"
	    "  tenant create NAME             create a tenant\n"
	    "  tenant list                    list tenants (id, name, created, key TTL)\n"
	    "  tenant set-ttl NAME DURATION|default\n"
	    "                                 how long the tenant's idempotency keys are\n"
	    "                                 remembered (default: idempotency_ttl)\n"
	    "  token create --tenant NAME     issue a bearer token; prints it once\n"
	    "  token revoke TOKEN | --id N    revoke a token; returns after replay_cache_ttl,\n"
	    "                                 when no worker answers it any more\n"
	    "  token list [--tenant NAME]     list tokens (ids, tenants, states; never the "
	    "tokens)\n"
	    "  outbox list [--pending|--dead|--published] [--limit N]\n"
	    "                                 list outbox events (default: undelivered)\n"
	    "  outbox show ID                 one event in full (numeric id or event id)\n"
	    "  outbox requeue ID [--force] | --dead\n"
	    "                                 revive a dead or pending event: attempts\n"
	    "                                 start again from zero, due now; an event a\n"
	    "                                 dispatcher holds is refused (exit 75) unless\n"
	    "                                 --force\n"
	    "  prune [--outbox-retention D] [--prune-batch N]\n"
	    "                                 delete expired idempotency keys and delivered\n"
	    "                                 events older than outbox_retention (for cron)\n"
	    "  reap [--prune-batch N]        make jobs whose lease ran out activatable again\n"
	    "                                 (for cron; activation also takes them lazily)\n"
	    "  debug idempotency-check --tenant NAME [--hours H] [--limit N] [--json]\n"
	    "                                 keys first seen in the last H hours (24) with\n"
	    "                                 their replays and conflicts, most replayed first\n"
	    "\n"
	    "The database is --db, else $DATABASE_URL, else the config file's db, else\n"
	    "libpq's PG* variables.\n\n");
	conf_usage(out);
}

/* Exit code for an error from the database layer. */
static int db_exit(const struct err *e)
{
	return e->code == ERR_DB_DOWN ? EX_TEMPFAIL : EX_SOFTWARE;
}

static int fail(int code, const struct err *e)
{
	fprintf(stderr, "idemflow: %s\n", e->msg);
	return code;
}

static void quiet_notices(void *arg, const char *msg)
{
	(void)arg;
	(void)msg;
}

static int cmd_migrate(PGconn *conn)
{
	struct err e;
	int applied;

	if (migrate_apply(conn, &applied, &e) < 0)
		return fail(db_exit(&e), &e);
	printf("migrate: applied %d migration(s); schema at version %d\n", applied,
	       migrate_latest());
	return EX_OK;
}

/* tenant set-ttl NAME DURATION|default: durations are read exactly as the
 * idempotency_ttl key is, and at least as long (1 s). */
static int tenant_set_ttl(PGconn *conn, const char *name, const char *value)
{
	char ms[24];
	struct err e;
	struct conf *tmp;
	PGresult *res;
	int dflt = strcmp(value, "default") == 0;

	if (!dflt) {
		tmp = conf_new();
		if (tmp == NULL) {
			fprintf(stderr, "idemflow: out of memory\n");
			return EX_OSERR;
		}
		if (conf_set(tmp, "idempotency_ttl", value, "tenant set-ttl", &e) < 0) {
			conf_free(tmp);
			fprintf(stderr, "idemflow: %s, or \"default\"\n", e.msg);
			return EX_USAGE;
		}
		snprintf(ms, sizeof(ms), "%ld", tmp->idempotency_ttl);
		conf_free(tmp);
	}
	const char *p[2] = {name, dflt ? NULL : ms};
	res = db_exec(conn,
	              "UPDATE tenants SET idempotency_ttl = $2::bigint * interval '1 millisecond'"
	              " WHERE name = $1 RETURNING id",
	              2, p, &e);
	if (res == NULL)
		return fail(db_exit(&e), &e);
	if (PQntuples(res) == 0) {
		fprintf(stderr, "idemflow: no tenant named \"%s\"\n", name);
		PQclear(res);
		return EX_DATAERR;
	}
	PQclear(res);
	if (dflt)
		printf("tenant %s: idempotency keys kept for the server's idempotency_ttl\n", name);
	else
		printf("tenant %s: idempotency keys kept for %s (from new keys on)\n", name, value);
	return EX_OK;
}

static int cmd_tenant(PGconn *conn, int argc, char **argv)
{
	struct err e;
	PGresult *res;

	if (argc == 2 && strcmp(argv[0], "create") == 0) {
		const char *p[1] = {argv[1]};
		res = db_exec(conn,
		              "INSERT INTO tenants (name) VALUES ($1)"
		              " ON CONFLICT (name) DO NOTHING RETURNING id",
		              1, p, &e);
		if (res == NULL) {
			if (strcmp(e.sqlstate, "23514") == 0) {
				fprintf(
				    stderr,
				    "idemflow: invalid tenant name \"%s\": use 1-63 letters, "
				    "digits, '.', '_' or '-', starting with a letter or digit\n",
				    argv[1]);
				return EX_DATAERR;
			}
			return fail(db_exit(&e), &e);
		}
		if (PQntuples(res) == 0) {
			fprintf(stderr, "idemflow: tenant \"%s\" already exists\n", argv[1]);
			PQclear(res);
			return EX_DATAERR;
		}
		printf("%s\n", PQgetvalue(res, 0, 0));
		PQclear(res);
		return EX_OK;
	}
	if (argc == 1 && strcmp(argv[0], "list") == 0) {
		res = db_exec(
		    conn,
		    "SELECT id, name, created_at, coalesce(idempotency_ttl::text, 'default')"
		    "  FROM tenants ORDER BY id",
		    0, NULL, &e);
		if (res == NULL)
			return fail(db_exit(&e), &e);
		for (int i = 0; i < PQntuples(res); i++)
			printf("%s\t%s\t%s\t%s\n", PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
			       PQgetvalue(res, i, 2), PQgetvalue(res, i, 3));
		PQclear(res);
		return EX_OK;
	}
	if (argc == 3 && strcmp(argv[0], "set-ttl") == 0)
		return tenant_set_ttl(conn, argv[1], argv[2]);
	usage(stderr);
	return EX_USAGE;
}

/* Sleep ms milliseconds, through interruptions. */
static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

	while (ms > 0 && nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static int cmd_token(PGconn *conn, const struct conf *c, int argc, char **argv)
{
	struct err e;
	PGresult *res;
	uint8_t hash[FP_LEN];
	char hex[2 + 2 * FP_LEN + 1] = "\\x";

	if (argc == 3 && strcmp(argv[0], "create") == 0 && strcmp(argv[1], "--tenant") == 0) {
		char token[IDS_TOKEN_LEN + 1];
		if (ids_token(token) < 0) {
			fprintf(stderr, "idemflow: could not read random bytes\n");
			return EX_OSERR;
		}
		fp_token(hash, token, strlen(token));
		fp_hex(hex + 2, hash, FP_LEN);
		const char *p[2] = {hex, argv[2]};
		res = db_exec(conn,
		              "INSERT INTO api_tokens (token_hash, tenant_id)"
		              " SELECT $1, id FROM tenants WHERE name = $2 RETURNING id",
		              2, p, &e);
		if (res == NULL)
			return fail(db_exit(&e), &e);
		if (PQntuples(res) == 0) {
			fprintf(stderr, "idemflow: no tenant named \"%s\"\n", argv[2]);
			PQclear(res);
			return EX_DATAERR;
		}
		fprintf(stderr, "idemflow: token id %s for tenant %s (shown once; keep it safe)\n",
		        PQgetvalue(res, 0, 0), argv[2]);
		printf("%s\n", token);
		PQclear(res);
		return EX_OK;
	}
	if ((argc == 2 || argc == 3) && strcmp(argv[0], "revoke") == 0) {
		const char *sql, *p[1];
		if (argc == 3 && strcmp(argv[1], "--id") == 0) {
			sql = "UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now())"
			      " WHERE id = $1::bigint RETURNING id";
			p[0] = argv[2];
		} else if (argc == 2) {
			fp_token(hash, argv[1], strlen(argv[1]));
			fp_hex(hex + 2, hash, FP_LEN);
			sql = "UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now())"
			      " WHERE token_hash = $1 RETURNING id";
			p[0] = hex;
		} else {
			usage(stderr);
			return EX_USAGE;
		}
		res = db_exec(conn, sql, 1, p, &e);
		if (res == NULL) {
			if (strcmp(e.sqlstate, "22P02") == 0) {
				fprintf(stderr, "idemflow: invalid token id \"%s\"\n", p[0]);
				return EX_DATAERR;
			}
			return fail(db_exit(&e), &e);
		}
		if (PQntuples(res) == 0) {
			fprintf(stderr, "idemflow: no such token\n");
			PQclear(res);
			return EX_DATAERR;
		}
		/* A worker may answer a replay from memory for replay_cache_ttl
		 * after it last asked the database (rcache.h): once that has
		 * passed, no worker answers this token. */
		sleep_ms(c->replay_cache_ttl);
		printf("revoked token %s\n", PQgetvalue(res, 0, 0));
		PQclear(res);
		return EX_OK;
	}
	if ((argc == 1 || argc == 3) && strcmp(argv[0], "list") == 0) {
		const char *p[1] = {argc == 3 ? argv[2] : NULL};
		if (argc == 3 && strcmp(argv[1], "--tenant") != 0) {
			usage(stderr);
			return EX_USAGE;
		}
		res =
		    db_exec(conn,
		            "SELECT t.id, n.name, t.created_at,"
		            "       CASE WHEN t.revoked_at IS NULL THEN 'active' ELSE 'revoked' END"
		            "  FROM api_tokens t JOIN tenants n ON n.id = t.tenant_id"
		            " WHERE $1::text IS NULL OR n.name = $1 ORDER BY t.id",
		            1, p, &e);
		if (res == NULL)
			return fail(db_exit(&e), &e);
		for (int i = 0; i < PQntuples(res); i++)
			printf("%s\t%s\t%s\t%s\n", PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
			       PQgetvalue(res, i, 2), PQgetvalue(res, i, 3));
		PQclear(res);
		return EX_OK;
	}
	usage(stderr);
	return EX_USAGE;
}

/* An outbox event named by its numeric id or its event id. */
#define OUTBOX_WHERE "(CASE WHEN $1 ~ '^[0-9]+$' THEN id = $1::bigint ELSE event_id = $1 END)"

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
	const char *p[2] = {id, force ? "t" : "f"};
	struct err e;
	PGresult *res;
	int rc = EX_OK;

	res = db_exec(conn,
	              "WITH ev AS ("
	              "  SELECT id, lease_owner, lease_until > now() AS held,"
	              "         to_char(lease_until AT TIME ZONE 'UTC',"
	              "                 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') AS until"
	              "    FROM outbox WHERE " OUTBOX_WHERE " AND published_at IS NULL"
	              "     FOR UPDATE),"
	              " up AS ("
	              "  UPDATE outbox o SET dead_at = NULL, attempts = 0,"
	              "         next_attempt_at = now(), lease_owner = NULL, lease_until = NULL"
	              "    FROM ev WHERE o.id = ev.id AND ($2::bool OR NOT coalesce(ev.held, false))"
	              "  RETURNING o.id)"
	              " SELECT coalesce(ev.held, false), coalesce(ev.lease_owner, ''), ev.until,"
	              "        up.id IS NOT NULL"
	              "   FROM ev LEFT JOIN up ON up.id = ev.id",
	              2, p, &e);
	if (res == NULL)
		return fail(db_exit(&e), &e);
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

static int cmd_outbox(PGconn *conn, int argc, char **argv)
{
	struct err e;
	PGresult *res;

	if (argc >= 1 && strcmp(argv[0], "list") == 0 && argc <= 4) {
		const char *filter = "published_at IS NULL";
		const char *limit = "100";
		for (int i = 1; i < argc; i++) {
			if (strcmp(argv[i], "--pending") == 0)
				filter = "published_at IS NULL AND dead_at IS NULL";
			else if (strcmp(argv[i], "--dead") == 0)
				filter = "dead_at IS NOT NULL";
			else if (strcmp(argv[i], "--published") == 0)
				filter = "published_at IS NOT NULL";
			else if (strcmp(argv[i], "--limit") == 0 && i + 1 < argc)
				limit = argv[++i];
			else {
				usage(stderr);
				return EX_USAGE;
			}
		}
		char sql[768];
		snprintf(sql, sizeof(sql),
		         "SELECT id, event_id, type,"
		         "       CASE WHEN published_at IS NOT NULL THEN 'published'"
		         "            WHEN dead_at IS NOT NULL THEN 'dead' ELSE 'pending' END,"
		         "       attempts, to_char(next_attempt_at AT TIME ZONE 'UTC',"
		         "                         'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),"
		         "       coalesce(left(last_error, 80), '')"
		         "  FROM outbox WHERE %s ORDER BY id LIMIT $1::bigint",
		         filter);
		const char *p[1] = {limit};
		res = db_exec(conn, sql, 1, p, &e);
		if (res == NULL) {
			if (strcmp(e.sqlstate, "22P02") == 0) {
				fprintf(stderr, "idemflow: invalid --limit \"%s\"\n", limit);
				return EX_USAGE;
			}
			return fail(db_exit(&e), &e);
		}
		printf("id\tevent_id\ttype\tstate\tattempts\tnext_attempt_at\tlast_error\n");
		for (int i = 0; i < PQntuples(res); i++)
			printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\n", PQgetvalue(res, i, 0),
			       PQgetvalue(res, i, 1), PQgetvalue(res, i, 2), PQgetvalue(res, i, 3),
			       PQgetvalue(res, i, 4), PQgetvalue(res, i, 5), PQgetvalue(res, i, 6));
		PQclear(res);
		return EX_OK;
	}
	if (argc == 2 && strcmp(argv[0], "show") == 0) {
		const char *p[1] = {argv[1]};
		res = db_exec(conn,
		              "SELECT id, event_id, type, workflow_id, seq, tenant_id,"
		              "       CASE WHEN published_at IS NOT NULL THEN 'published'"
		              "            WHEN dead_at IS NOT NULL THEN 'dead' ELSE 'pending' END,"
		              "       attempts, created_at, next_attempt_at, published_at, dead_at,"
		              "       lease_owner, lease_until, last_error, payload"
		              "  FROM outbox WHERE " OUTBOX_WHERE,
		              1, p, &e);
		if (res == NULL)
			return fail(db_exit(&e), &e);
		if (PQntuples(res) == 0) {
			fprintf(stderr, "idemflow: no outbox event \"%s\"\n", argv[1]);
			PQclear(res);
			return EX_DATAERR;
		}
		for (int f = 0; f < PQnfields(res); f++)
			printf("%-16s %s\n", PQfname(res, f),
			       PQgetisnull(res, 0, f) ? "-" : PQgetvalue(res, 0, f));
		PQclear(res);
		return EX_OK;
	}
	if (argc == 2 && strcmp(argv[0], "requeue") == 0 && strcmp(argv[1], "--dead") == 0) {
		/* A dead event is never held: the statement that makes it dead
		 * clears its lease. Each gets a full set of attempts again. */
		res = db_exec(conn,
		              "UPDATE outbox SET dead_at = NULL, attempts = 0,"
		              "       next_attempt_at = now(), lease_owner = NULL,"
		              "       lease_until = NULL"
		              " WHERE dead_at IS NOT NULL",
		              0, NULL, &e);
		if (res == NULL)
			return fail(db_exit(&e), &e);
		printf("requeued %s event(s)\n", PQcmdTuples(res));
		PQclear(res);
		return EX_OK;
	}
	if ((argc == 2 || (argc == 3 && strcmp(argv[2], "--force") == 0)) &&
	    strcmp(argv[0], "requeue") == 0 && argv[1][0] != '-')
		return outbox_requeue(conn, argv[1], argc == 3);
	usage(stderr);
	return EX_USAGE;
}

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

struct prune_totals {
	long keys, key_stats, events;
	int statements;
};

/* Run one prune statement until a batch comes back short. */
static int prune_loop(PGconn *conn, const char *sql, const char *cutoff, int batch, long *rows,
                      long *extra, int *statements, struct err *e)
{
	char lim[16];
	const char *p[2] = {cutoff, lim};

	snprintf(lim, sizeof(lim), "%d", batch);
	for (;;) {
		PGresult *res = db_exec(conn, sql, 2, p, e);
		long n;

		if (res == NULL)
			return -1;
		n = atol(PQgetvalue(res, 0, 0));
		*rows += n;
		*extra += atol(PQgetvalue(res, 0, 1));
		(*statements)++;
		PQclear(res);
		if (n < batch)
			return 0;
	}
}

/*
 * reap: expired job leases back to activatable, prune_batch jobs per
 * statement (each its own transaction, rows taken with SKIP LOCKED so a
 * concurrent activation is never waited on), until a batch comes back
 * short.
 */
static int cmd_reap(PGconn *conn, struct conf *c, int argc, char **argv)
{
	char batch[24];
	long total = 0, n;
	struct err e;

	for (int i = 0; i < argc; i++) {
		const char *val = NULL;
		if (strncmp(argv[i], "--prune-batch=", 14) == 0)
			val = argv[i] + 14;
		else if (strcmp(argv[i], "--prune-batch") == 0 && i + 1 < argc)
			val = argv[++i];
		if (val == NULL) {
			usage(stderr);
			return EX_USAGE;
		}
		if (conf_set(c, "prune_batch", val, "--prune-batch", &e) < 0) {
			fprintf(stderr, "idemflow: %s\n", e.msg);
			return EX_USAGE;
		}
	}
	snprintf(batch, sizeof(batch), "%d", c->prune_batch);
	const char *p[1] = {batch};
	do {
		PGresult *res = db_exec(conn, "SELECT idemflow_reap($1)", 1, p, &e);
		if (res == NULL) {
			printf("reap: jobs=%ld\n", total);
			return fail(db_exit(&e), &e);
		}
		n = atol(PQgetvalue(res, 0, 0));
		PQclear(res);
		total += n;
	} while (n >= c->prune_batch);
	printf("reap: jobs=%ld\n", total);
	return EX_OK;
}

static int cmd_prune(PGconn *conn, struct conf *c, int argc, char **argv)
{
	struct prune_totals t = {0};
	struct timespec t0, t1;
	char ms[24], key_cutoff[64], event_cutoff[64];
	struct err e;
	PGresult *res;
	int rc = EX_OK;

	/* The two prune keys may also follow the command. */
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i], *eq = strchr(a, '='), *val;
		char name[32];
		size_t n = eq ? (size_t)(eq - a) : strlen(a);

		snprintf(name, sizeof(name), "%.*s", (int)n, a);
		if (strcmp(name, "--outbox-retention") != 0 && strcmp(name, "--prune-batch") != 0) {
			usage(stderr);
			return EX_USAGE;
		}
		if (eq == NULL && i + 1 >= argc) {
			fprintf(stderr, "idemflow: option \"%s\" needs a value\n", a);
			return EX_USAGE;
		}
		val = eq ? eq + 1 : argv[++i];
		if (conf_set(c, name + 2, val, name, &e) < 0) {
			fprintf(stderr, "idemflow: %s\n", e.msg);
			return EX_USAGE;
		}
	}

	clock_gettime(CLOCK_MONOTONIC, &t0);
	snprintf(ms, sizeof(ms), "%ld", c->outbox_retention);
	const char *p[1] = {ms};
	res =
	    db_exec(conn, "SELECT now(), now() - $1::bigint * interval '1 millisecond'", 1, p, &e);
	if (res == NULL)
		return fail(db_exit(&e), &e);
	snprintf(key_cutoff, sizeof(key_cutoff), "%s", PQgetvalue(res, 0, 0));
	snprintf(event_cutoff, sizeof(event_cutoff), "%s", PQgetvalue(res, 0, 1));
	PQclear(res);

	if (prune_loop(conn, PRUNE_KEYS, key_cutoff, c->prune_batch, &t.keys, &t.key_stats,
	               &t.statements, &e) < 0 ||
	    prune_loop(conn, PRUNE_EVENTS, event_cutoff, c->prune_batch, &t.events, &t.key_stats,
	               &t.statements, &e) < 0)
		rc = db_exit(&e);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	/* What was removed is reported even when a later batch failed:
	 * every batch before it is committed. */
	printf("prune: keys=%ld key_stats=%ld events=%ld statements=%d duration_s=%.3f\n", t.keys,
	       t.key_stats, t.events, t.statements,
	       (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	if (rc != EX_OK)
		return fail(rc, &e);
	return EX_OK;
}

#define TS_SECONDS(col) "to_char((" col ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"

/* The keys of tenant $1 first seen in the last $2 hours, with their counts. */
#define CHECK_FROM                                                                                 \
	"  FROM idempotency_keys k"                                                                \
	"  LEFT JOIN idempotency_key_stats s ON s.tenant_id = k.tenant_id AND s.key = k.key"       \
	" WHERE k.tenant_id = $1::bigint AND k.created_at >= now() - $2::float8 * interval '1 "    \
	"hour'"

static void print_check_json(const char *tenant, double hours, const PGresult *rows,
                             const PGresult *sum)
{
	struct json_object *doc = json_object_new_object(), *keys = json_object_new_array();
	struct json_object *summary = json_object_new_object();
	long nkeys = atol(PQgetvalue(sum, 0, 0)), replays = atol(PQgetvalue(sum, 0, 1));
	char ratio[32];

	json_object_object_add(doc, "tenant", json_object_new_string(tenant));
	json_object_object_add(doc, "hours", json_object_new_double(hours));
	json_object_object_add(doc, "since", json_object_new_string(PQgetvalue(sum, 0, 4)));
	for (int i = 0; i < PQntuples(rows); i++) {
		struct json_object *k = json_object_new_object();

		json_object_object_add(k, "key", json_object_new_string(PQgetvalue(rows, i, 0)));
		json_object_object_add(k, "method", json_object_new_string(PQgetvalue(rows, i, 1)));
		json_object_object_add(k, "route", json_object_new_string(PQgetvalue(rows, i, 2)));
		json_object_object_add(k, "first_seen",
		                       json_object_new_string(PQgetvalue(rows, i, 3)));
		json_object_object_add(k, "replays",
		                       json_object_new_int64(atoll(PQgetvalue(rows, i, 4))));
		json_object_object_add(k, "conflicts",
		                       json_object_new_int64(atoll(PQgetvalue(rows, i, 5))));
		json_object_object_add(k, "in_flight",
		                       json_object_new_int64(atoll(PQgetvalue(rows, i, 6))));
		json_object_object_add(k, "last_seen",
		                       PQgetisnull(rows, i, 7)
		                           ? NULL
		                           : json_object_new_string(PQgetvalue(rows, i, 7)));
		json_object_array_add(keys, k);
	}
	json_object_object_add(doc, "keys", keys);
	json_object_object_add(summary, "keys", json_object_new_int64(nkeys));
	json_object_object_add(summary, "listed", json_object_new_int(PQntuples(rows)));
	json_object_object_add(summary, "replays", json_object_new_int64(replays));
	json_object_object_add(summary, "conflicts",
	                       json_object_new_int64(atoll(PQgetvalue(sum, 0, 2))));
	json_object_object_add(summary, "in_flight",
	                       json_object_new_int64(atoll(PQgetvalue(sum, 0, 3))));
	/* Three decimals, written as such (not as the nearest double's digits). */
	snprintf(ratio, sizeof(ratio), "%.3f", nkeys > 0 ? (double)replays / (double)nkeys : 0.0);
	json_object_object_add(summary, "replay_ratio",
	                       json_object_new_double_s(atof(ratio), ratio));
	json_object_object_add(doc, "summary", summary);
	printf("%s\n", json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PLAIN |
	                                                       JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(doc);
}

static void print_check_text(const PGresult *rows, const PGresult *sum)
{
	long nkeys = atol(PQgetvalue(sum, 0, 0)), replays = atol(PQgetvalue(sum, 0, 1));

	printf("key\troute\tfirst_seen\treplays\tconflicts\tin_flight\n");
	for (int i = 0; i < PQntuples(rows); i++)
		printf("%s\t%s %s\t%s\t%s\t%s\t%s\n", PQgetvalue(rows, i, 0),
		       PQgetvalue(rows, i, 1), PQgetvalue(rows, i, 2), PQgetvalue(rows, i, 3),
		       PQgetvalue(rows, i, 4), PQgetvalue(rows, i, 5), PQgetvalue(rows, i, 6));
	printf("summary: keys=%ld listed=%d replays=%ld conflicts=%s in_flight=%s "
	       "replay_ratio=%.3f since=%s\n",
	       nkeys, PQntuples(rows), replays, PQgetvalue(sum, 0, 2), PQgetvalue(sum, 0, 3),
	       nkeys > 0 ? (double)replays / (double)nkeys : 0.0, PQgetvalue(sum, 0, 4));
}

/* debug idempotency-check --tenant NAME [--hours H] [--limit N] [--json] */
static int cmd_debug(PGconn *conn, int argc, char **argv)
{
	const char *tenant = NULL, *hours = "24", *limit = "100";
	PGresult *res, *rows = NULL, *sum = NULL;
	char tenant_id[24], hours_num[32], *end;
	struct err e;
	double h;
	long lim;
	int json = 0, rc = EX_OK;

	if (argc < 1 || strcmp(argv[0], "idempotency-check") != 0)
		goto usage;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			json = 1;
		else if (strcmp(argv[i], "--tenant") == 0 && i + 1 < argc)
			tenant = argv[++i];
		else if (strcmp(argv[i], "--hours") == 0 && i + 1 < argc)
			hours = argv[++i];
		else if (strcmp(argv[i], "--limit") == 0 && i + 1 < argc)
			limit = argv[++i];
		else
			goto usage;
	}
	if (tenant == NULL)
		goto usage;
	h = strtod(hours, &end);
	if (end == hours || *end != '\0' || !(h > 0 && h <= 24 * 366)) {
		fprintf(stderr, "idemflow: invalid --hours \"%s\": expected a number of hours\n",
		        hours);
		return EX_USAGE;
	}
	lim = strtol(limit, &end, 10);
	if (end == limit || *end != '\0' || lim < 1 || lim > 1000000) {
		fprintf(stderr, "idemflow: invalid --limit \"%s\": expected a positive integer\n",
		        limit);
		return EX_USAGE;
	}

	const char *pt[1] = {tenant};
	res = db_exec(conn, "SELECT id FROM tenants WHERE name = $1", 1, pt, &e);
	if (res == NULL)
		return fail(db_exit(&e), &e);
	if (PQntuples(res) == 0) {
		fprintf(stderr, "idemflow: no tenant named \"%s\"\n", tenant);
		PQclear(res);
		return EX_DATAERR;
	}
	snprintf(tenant_id, sizeof(tenant_id), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);

	/* The list and the summary read one snapshot, so they agree. The
	 * hours go as the number strtod read ("0x10" is not SQL). */
	snprintf(hours_num, sizeof(hours_num), "%.17g", h);
	const char *p[3] = {tenant_id, hours_num, limit};
	res = db_exec(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL, &e);
	if (res == NULL)
		return fail(db_exit(&e), &e);
	PQclear(res);
	rows =
	    db_exec(conn,
	            "SELECT k.key, k.method, k.path, " TS_SECONDS(
	                "k.created_at") ","
	                                "       coalesce(s.replays, 0) AS replays, "
	                                "coalesce(s.conflicts, 0) AS conflicts,"
	                                "       coalesce(s.in_flight, 0) AS in_flight, " TS_SECONDS(
	                                    "s.last_seen") CHECK_FROM
	            " ORDER BY replays DESC, conflicts DESC, in_flight DESC,"
	            "          k.created_at, k.key"
	            " LIMIT $3::bigint",
	            3, p, &e);
	if (rows != NULL)
		sum = db_exec(conn,
		              "SELECT count(*), coalesce(sum(s.replays), 0),"
		              "       coalesce(sum(s.conflicts), 0), coalesce(sum(s.in_flight), 0),"
		              "       " TS_SECONDS("now() - $2::float8 * interval '1 hour'")
		                  CHECK_FROM,
		              2, p, &e);
	PQclear(PQexec(conn, "COMMIT"));
	if (rows == NULL || sum == NULL) {
		rc = fail(db_exit(&e), &e);
		goto out;
	}
	if (json)
		print_check_json(tenant, h, rows, sum);
	else
		print_check_text(rows, sum);
out:
	PQclear(rows);
	PQclear(sum);
	return rc;
usage:
	usage(stderr);
	return EX_USAGE;
}

int main(int argc, char **argv)
{
	struct err e;
	int next, rc;
	struct conf *c;
	PGconn *conn;

	c = conf_from_args(argc, argv, &next, &e);
	if (c == NULL) {
		fprintf(stderr, "idemflow: %s\n", e.msg);
		return EX_CONFIG;
	}
	if (next >= argc) {
		usage(stderr);
		conf_free(c);
		return EX_USAGE;
	}
	if (strcmp(argv[next], "-h") == 0 || strcmp(argv[next], "--help") == 0 ||
	    strcmp(argv[next], "help") == 0) {
		usage(stdout);
		conf_free(c);
		return EX_OK;
	}
	if (strcmp(argv[next], "--version") == 0) {
		printf("idemflow %s\n", PACKAGE_VERSION);
		conf_free(c);
		return EX_OK;
	}
	const char *cmd = argv[next];
	if (strcmp(cmd, "migrate") != 0 && strcmp(cmd, "tenant") != 0 &&
	    strcmp(cmd, "token") != 0 && strcmp(cmd, "outbox") != 0 && strcmp(cmd, "prune") != 0 &&
	    strcmp(cmd, "reap") != 0 && strcmp(cmd, "debug") != 0) {
		fprintf(stderr, "idemflow: unknown command \"%s\"\n", cmd);
		usage(stderr);
		conf_free(c);
		return EX_USAGE;
	}
	/* Six tries over about 3 s: a failover in progress is waited out,
	 * a database that stays down is "try later" (75). */
	conn = db_connect_retry(c->db, "idemflow-cli", 6, &e);
	if (conn == NULL) {
		conf_free(c);
		return fail(EX_TEMPFAIL, &e);
	}
	PQsetNoticeProcessor(conn, quiet_notices, NULL);
	if (strcmp(cmd, "migrate") == 0)
		rc = next + 1 == argc ? cmd_migrate(conn) : (usage(stderr), EX_USAGE);
	else if (strcmp(cmd, "tenant") == 0)
		rc = cmd_tenant(conn, argc - next - 1, argv + next + 1);
	else if (strcmp(cmd, "token") == 0)
		rc = cmd_token(conn, c, argc - next - 1, argv + next + 1);
	else if (strcmp(cmd, "prune") == 0)
		rc = cmd_prune(conn, c, argc - next - 1, argv + next + 1);
	else if (strcmp(cmd, "reap") == 0)
		rc = cmd_reap(conn, c, argc - next - 1, argv + next + 1);
	else if (strcmp(cmd, "debug") == 0)
		rc = cmd_debug(conn, argc - next - 1, argv + next + 1);
	else
		rc = cmd_outbox(conn, argc - next - 1, argv + next + 1);
	PQfinish(conn);
	conf_free(c);
	return rc;
}
