/* migrate.c - numbered migrations, each once, safe to run concurrently. */
#include "core/migrate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/db.h"

/* "idemflow" in ASCII: the advisory lock key of migrations. */
#define MIGRATE_LOCK "7594306392197721975"

static int latest_of(const struct migration *set, int n)
{
	int v = 0;

	for (int i = 0; i < n; i++)
		if (set[i].version > v)
			v = set[i].version;
	return v;
}

int migrate_latest(void)
{
	return latest_of(migrations, migrations_count);
}

int migrate_latest_proxy(void)
{
	return latest_of(proxy_migrations, proxy_migrations_count);
}

static int run(PGconn *conn, const char *sql, struct err *e)
{
	PGresult *res = PQexec(conn, sql);
	ExecStatusType st = PQresultStatus(res);

	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
		db_classify(conn, res, e);
		PQclear(res);
		return -1;
	}
	PQclear(res);
	return 0;
}

static int apply_one(PGconn *conn, const struct migration *m, int *applied, struct err *e)
{
	char version[16];
	const char *p[2] = { version, m->name };
	PGresult *res;
	int done;

	snprintf(version, sizeof(version), "%d", m->version);
	if (run(conn,
	        "BEGIN;\n"
	        "SELECT pg_advisory_xact_lock(" MIGRATE_LOCK ");\n"
	        "CREATE TABLE IF NOT EXISTS schema_migrations (\n"
	        "  version integer PRIMARY KEY,\n"
	        "  name text NOT NULL,\n"
	        "  applied_at timestamptz NOT NULL DEFAULT now()\n"
	        ")\n",
	        e) < 0)
		goto fail;
	res = db_exec(conn,
	              "SELECT 1\n"
	              "  FROM schema_migrations\n"
	              " WHERE version = $1\n",
	              1, p, e);
	if (res == NULL)
		goto fail;
	done = PQntuples(res) > 0;
	PQclear(res);
	if (!done) {
		if (run(conn, m->sql, e) < 0) {
			err_prefix(e, "migration %s failed", m->name);
			goto fail;
		}
		res = db_exec(conn,
		              "INSERT INTO schema_migrations (version, name)\n"
		              "VALUES ($1, $2)\n",
		              2, p, e);
		if (res == NULL)
			goto fail;
		PQclear(res);
		(*applied)++;
	}
	return run(conn, "COMMIT", e);
fail:
	PQclear(PQexec(conn, "ROLLBACK"));
	return -1;
}

static int apply_set(PGconn *conn, const struct migration *set, int n, int *applied, struct err *e)
{
	*applied = 0;
	for (int i = 0; i < n; i++)
		if (apply_one(conn, &set[i], applied, e) < 0)
			return -1;
	return 0;
}

int migrate_apply(PGconn *conn, int *applied, struct err *e)
{
	return apply_set(conn, migrations, migrations_count, applied, e);
}

int migrate_apply_proxy(PGconn *conn, int *applied, struct err *e)
{
	return apply_set(conn, proxy_migrations, proxy_migrations_count, applied, e);
}

int migrate_current(PGconn *conn, struct err *e)
{
	PGresult *res =
	    db_exec(conn, "SELECT to_regclass('schema_migrations') IS NOT NULL\n", 0, NULL, e);
	int v = 0;

	if (res == NULL)
		return -1;
	if (strcmp(PQgetvalue(res, 0, 0), "t") == 0) {
		PQclear(res);
		res = db_exec(conn,
		              "SELECT coalesce(max(version), 0)\n"
		              "  FROM schema_migrations\n",
		              0, NULL, e);
		if (res == NULL)
			return -1;
		v = atoi(PQgetvalue(res, 0, 0));
	}
	PQclear(res);
	return v;
}
