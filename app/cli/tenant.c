/*
 * tenant.c - "idemflow tenant": create a tenant, list them, and set how
 * long one tenant's idempotency keys are remembered and how long its ended
 * workflows are kept. Tokens for a tenant are token.c's; what a tenant may
 * do is the server's business.
 */
#include <stdio.h>
#include <string.h>
#include <sysexits.h>

#include "cli/cli.h"
#include "core/db.h"

/* tenant create NAME: prints the new tenant's id. The name's shape is
 * checked by the table (23514), so the server and the CLI agree on it. */
static int tenant_create(PGconn *conn, const char *name)
{
	const char *p[1] = { name };
	PGresult *res;
	struct err e;
	int rc = EX_OK;

	res = db_exec(conn,
	              "INSERT INTO tenants (name)\n"
	              "VALUES ($1)\n"
	              "    ON CONFLICT (name) DO NOTHING\n"
	              "RETURNING id\n",
	              1, p, &e);
	if (res == NULL) {
		if (strcmp(e.sqlstate, "23514") == 0) {
			fprintf(stderr,
			        "idemflow: invalid tenant name \"%s\": use 1-63 letters, "
			        "digits, '.', '_' or '-', starting with a letter or digit\n",
			        name);
			rc = EX_DATAERR;
		} else
			rc = cli_db_fail(&e);
		goto out;
	}
	if (PQntuples(res) == 0) {
		fprintf(stderr, "idemflow: tenant \"%s\" already exists\n", name);
		rc = EX_DATAERR;
		goto out;
	}
	printf("%s\n", PQgetvalue(res, 0, 0));
out:
	PQclear(res);
	return rc;
}

static int tenant_list(PGconn *conn)
{
	PGresult *res;
	struct err e;

	res = db_exec(conn,
	              "SELECT id, name, created_at, coalesce(idempotency_ttl::text, 'default'),\n"
	              "       coalesce(workflow_retention::text, 'default')\n"
	              "  FROM tenants\n"
	              " ORDER BY id\n",
	              0, NULL, &e);
	if (res == NULL)
		return cli_db_fail(&e);
	cli_print_rows(res);
	PQclear(res);
	return EX_OK;
}

/* Run sql, an UPDATE of tenants taking $1 the tenant's name and $2 a
 * duration in milliseconds (ms; NULL for the default), RETURNING its id.
 * Returns EX_OK, or an exit status with the problem printed. */
static int tenant_update(PGconn *conn, const char *sql, const char *name, const char *ms)
{
	const char *p[2] = { name, ms };
	PGresult *res;
	struct err e;
	int rc = EX_OK;

	res = db_exec(conn, sql, 2, p, &e);
	if (res == NULL)
		return cli_db_fail(&e);
	if (PQntuples(res) == 0) {
		fprintf(stderr, "idemflow: no tenant named \"%s\"\n", name);
		rc = EX_DATAERR;
	}
	PQclear(res);
	return rc;
}

/* tenant set-ttl NAME DURATION|default: durations are read exactly as the
 * idempotency_ttl key is, and held to the floor the server holds its own
 * to (conf_check: a key outlives every request that may still hold or
 * wait for it), with the waits of the configuration the CLI reads. */
static int tenant_set_ttl(PGconn *conn, const struct conf *c, const char *name, const char *value)
{
	char ms[24];
	const char *set = NULL; /* NULL: the server's idempotency_ttl */
	struct conf chk;
	struct err e;
	int rc;

	if (strcmp(value, "default") != 0) {
		chk = *c; /* the waits of the configuration the CLI reads */
		if (conf_key_duration("idempotency_ttl", value, "tenant set-ttl",
		                      &chk.idempotency_ttl, &e) < 0) {
			fprintf(stderr, "idemflow: %s, or \"default\"\n", e.msg);
			return EX_USAGE;
		}
		if (conf_check(&chk, &e) < 0) {
			fprintf(stderr, "idemflow: %s\n", e.msg);
			return EX_USAGE;
		}
		snprintf(ms, sizeof(ms), "%ld", chk.idempotency_ttl);
		set = ms;
	}
	rc = tenant_update(conn,
	                   "UPDATE tenants\n"
	                   "   SET idempotency_ttl = $2::bigint * interval '1 millisecond'\n"
	                   " WHERE name = $1\n"
	                   "RETURNING id\n",
	                   name, set);
	if (rc != EX_OK)
		return rc;
	if (set == NULL)
		printf("tenant %s: idempotency keys kept for the server's idempotency_ttl\n", name);
	else
		printf("tenant %s: idempotency keys kept for %s (from new keys on)\n", name, value);
	return EX_OK;
}

/* tenant set-workflow-retention NAME DURATION|default: read exactly as
 * the workflow_retention key is (at least 1s). Prune reads it when it
 * runs: it applies at once, to workflows that ended before it too. */
static int tenant_set_retention(PGconn *conn, const char *name, const char *value)
{
	char ms[24];
	const char *set = NULL; /* NULL: the CLI's workflow_retention */
	long v;
	struct err e;
	int rc;

	if (strcmp(value, "default") != 0) {
		if (conf_key_duration("workflow_retention", value, "tenant set-workflow-retention",
		                      &v, &e) < 0) {
			fprintf(stderr, "idemflow: %s, or \"default\"\n", e.msg);
			return EX_USAGE;
		}
		snprintf(ms, sizeof(ms), "%ld", v);
		set = ms;
	}
	rc = tenant_update(conn,
	                   "UPDATE tenants\n"
	                   "   SET workflow_retention = $2::bigint * interval '1 millisecond'\n"
	                   " WHERE name = $1\n"
	                   "RETURNING id\n",
	                   name, set);
	if (rc != EX_OK)
		return rc;
	if (set == NULL)
		printf("tenant %s: ended workflows kept for prune's workflow_retention\n", name);
	else
		printf("tenant %s: ended workflows kept for %s after they ended\n", name, value);
	return EX_OK;
}

int cli_tenant(PGconn *conn, struct conf *c, int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[0], "create") == 0)
		return tenant_create(conn, argv[1]);
	if (argc == 1 && strcmp(argv[0], "list") == 0)
		return tenant_list(conn);
	if (argc == 3 && strcmp(argv[0], "set-ttl") == 0)
		return tenant_set_ttl(conn, c, argv[1], argv[2]);
	if (argc == 4 && strcmp(argv[0], "move") == 0 && strcmp(argv[2], "--to") == 0)
		return cli_tenant_move(conn, c, argv[1], argv[3]);
	if (argc == 3 && strcmp(argv[0], "set-workflow-retention") == 0)
		return tenant_set_retention(conn, argv[1], argv[2]);
	return cli_usage_error();
}
