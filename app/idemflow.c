/*
 * idemflow - the admin CLI: migrations, tenants, API tokens, the outbox.
 *
 * Results go to stdout (a new token is the only thing printed by
 * "token create", so scripts can capture it); diagnostics go to stderr.
 * Exit codes follow sysexits.h: 64 usage, 65 bad data (unknown tenant,
 * duplicate name), 75 database unreachable (try later), 78 configuration.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include "config.h"
#include "conf.h"
#include "db.h"
#include "fp.h"
#include "ids.h"
#include "migrate.h"

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: idemflow [--config FILE] [--db CONNINFO] COMMAND [ARGS]\n"
		"\n"
		"Commands:\n"
		"  migrate                        apply the SQL migrations (safe to repeat)\n"
		"  tenant create NAME             create a tenant\n"
		"  tenant list                    list tenants\n"
		"  token create --tenant NAME     issue a bearer token; prints it once\n"
		"  token revoke TOKEN | --id N    revoke a token\n"
		"  token list [--tenant NAME]     list tokens (ids, tenants, states; never the "
		"tokens)\n"
		"  outbox list [--pending|--dead|--published] [--limit N]\n"
		"                                 list outbox events (default: undelivered)\n"
		"  outbox show ID                 one event in full (numeric id or event id)\n"
		"  outbox requeue ID | --dead     revive a dead or pending event: attempts\n"
		"                                 start again from zero, due now\n"
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
				fprintf(stderr,
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
		res = db_exec(conn,
			      "SELECT id, name, created_at FROM tenants ORDER BY id", 0, NULL, &e);
		if (res == NULL)
			return fail(db_exit(&e), &e);
		for (int i = 0; i < PQntuples(res); i++)
			printf("%s\t%s\t%s\n", PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
			       PQgetvalue(res, i, 2));
		PQclear(res);
		return EX_OK;
	}
	usage(stderr);
	return EX_USAGE;
}

static int cmd_token(PGconn *conn, int argc, char **argv)
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
		res = db_exec(conn,
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
	if (argc == 2 && strcmp(argv[0], "requeue") == 0) {
		/* A requeued event gets a full set of attempts again. */
		const char *p[1] = {argv[1]};
		if (strcmp(argv[1], "--dead") == 0)
			res = db_exec(conn,
				      "UPDATE outbox SET dead_at = NULL, attempts = 0,"
				      "       next_attempt_at = now(), lease_owner = NULL,"
				      "       lease_until = NULL"
				      " WHERE dead_at IS NOT NULL",
				      0, NULL, &e);
		else
			res = db_exec(conn,
				      "UPDATE outbox SET dead_at = NULL, attempts = 0,"
				      "       next_attempt_at = now(), lease_owner = NULL,"
				      "       lease_until = NULL"
				      " WHERE " OUTBOX_WHERE " AND published_at IS NULL",
				      1, p, &e);
		if (res == NULL)
			return fail(db_exit(&e), &e);
		if (strcmp(argv[1], "--dead") != 0 && strcmp(PQcmdTuples(res), "0") == 0) {
			fprintf(stderr, "idemflow: no undelivered outbox event \"%s\"\n", argv[1]);
			PQclear(res);
			return EX_DATAERR;
		}
		printf("requeued %s event(s)\n", PQcmdTuples(res));
		PQclear(res);
		return EX_OK;
	}
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
	    strcmp(cmd, "token") != 0 && strcmp(cmd, "outbox") != 0) {
		fprintf(stderr, "idemflow: unknown command \"%s\"\n", cmd);
		usage(stderr);
		conf_free(c);
		return EX_USAGE;
	}
	conn = db_connect_simple(c->db, "idemflow-cli", &e);
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
		rc = cmd_token(conn, argc - next - 1, argv + next + 1);
	else
		rc = cmd_outbox(conn, argc - next - 1, argv + next + 1);
	PQfinish(conn);
	conf_free(c);
	return rc;
}
