/*
 * SQL against the test database; see tsql.h.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf, pipe2, open_memstream */
#endif
#include "tsql.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "tapi.h"
#include "tstack.h"

#define TSTACK_MAX_PARAMS 16

static PGconn *tstack_conn;

/* --- Database ---------------------------------------------------------- */

static void tstack_db_close(void)
{
	PQfinish(tstack_conn);
	tstack_conn = NULL;
}

PGconn *tstack_db_connect(void)
{
	const char *keys[] = { "dbname", "application_name", NULL };
	const char *vals[] = { tstack_env("DATABASE_URL"), "idemflow-tests", NULL };
	PGconn *c = PQconnectdbParams(keys, vals, 1);

	cr_assert_not_null(c, "out of memory");
	cr_assert_eq(PQstatus(c), CONNECTION_OK, "connect to DATABASE_URL: %s", PQerrorMessage(c));
	return c;
}

PGconn *tstack_db(void)
{
	if (!tstack_conn) {
		tstack_conn = tstack_db_connect();
		atexit(tstack_db_close);
	}
	return tstack_conn;
}

static size_t params_collect(va_list ap, const char **params)
{
	size_t n = 0;

	for (const char *p = va_arg(ap, const char *); p; p = va_arg(ap, const char *)) {
		cr_assert(n < TSTACK_MAX_PARAMS, "too many query parameters");
		params[n++] = p;
	}
	return n;
}

static PGresult *query_run(PGconn *conn, const char *sql, va_list ap)
{
	const char *params[TSTACK_MAX_PARAMS];
	size_t n = params_collect(ap, params);
	PGresult *res = PQexecParams(conn, sql, (int)n, NULL, params, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(res);

	cr_assert(st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK, "query failed: %s\n  %s",
	          PQresultErrorMessage(res), sql);
	return res;
}

/* The single value of a one-row, one-column result, or NULL. */
static char *query_value(const char *sql, va_list ap)
{
	PGresult *res = query_run(tstack_db(), sql, ap);
	char *v = NULL;

	cr_assert(PQntuples(res) == 1 && PQnfields(res) == 1,
	          "expected one row and one column, got %d x %d: %s", PQntuples(res),
	          PQnfields(res), sql);
	if (!PQgetisnull(res, 0, 0)) {
		v = strdup(PQgetvalue(res, 0, 0));
		cr_assert_not_null(v, "out of memory");
	}
	PQclear(res);
	return v;
}

long tstack_count_(const char *sql, ...)
{
	va_list ap;
	char *v, *end;
	long n;

	va_start(ap, sql);
	v = query_value(sql, ap);
	va_end(ap);
	cr_assert_not_null(v, "NULL where a number was expected: %s", sql);
	n = strtol(v, &end, 10);
	cr_assert(*end == '\0', "not an integer: %s (%s)", v, sql);
	free(v);
	return n;
}

char *tstack_text_(const char *sql, ...)
{
	va_list ap;
	char *v;

	va_start(ap, sql);
	v = query_value(sql, ap);
	va_end(ap);
	return v;
}

void tstack_exec_(PGconn *conn, const char *sql, ...)
{
	va_list ap;

	va_start(ap, sql);
	PQclear(query_run(conn, sql, ap));
	va_end(ap);
}

void tstack_key_hold(PGconn *conn, const struct tstack_tenant *t, const char *key)
{
	tstack_exec(conn, "BEGIN");
	/* Values other than (tenant_id, key) are never read: the row is
	 * rolled back before anyone can see it. */
	tstack_exec(conn,
	            "INSERT INTO idempotency_keys (tenant_id, key, method, path,"
	            " fingerprint, status, headers, body, created_at,"
	            " expires_at)"
	            " VALUES ($1, $2, 'POST', '/v1/workflows',"
	            " decode('00', 'hex'), 201, '', '', now(),"
	            " now() + interval '1 day')",
	            t->id_text, key);
}

/* --- JSON -------------------------------------------------------------- */

static char *json_query(const char *sql, const char *json, const char *path)
{
	PGresult *res;
	const char *params[2] = { json, path };
	char *v = NULL;

	res = PQexecParams(tstack_db(), sql, 2, NULL, params, NULL, NULL, 0);
	cr_assert_eq(PQresultStatus(res), PGRES_TUPLES_OK, "body is not valid JSON (%s): %.300s",
	             PQresultErrorMessage(res), json);
	if (!PQgetisnull(res, 0, 0)) {
		v = strdup(PQgetvalue(res, 0, 0));
		cr_assert_not_null(v, "out of memory");
	}
	PQclear(res);
	return v;
}

char *tstack_json(const char *json, const char *path)
{
	return json_query("SELECT $1::jsonb #>> $2::text[]", json, path);
}

char *tstack_json_type(const char *json, const char *path)
{
	return json_query("SELECT jsonb_typeof($1::jsonb #> $2::text[])", json, path);
}

/* --- Rows of a tenant ---------------------------------------------------- */

void tstack_expect_counts(const struct tstack_tenant *t, long workflows, long events, long keys)
{
	long n;

	n = tstack_count("SELECT count(*) FROM workflows WHERE tenant_id = $1", t->id_text);
	cr_assert_eq(n, workflows, "workflow rows for %s: %ld, want %ld", t->name, n, workflows);
	n = tstack_count("SELECT count(*) FROM outbox WHERE tenant_id = $1"
	                 " AND type = 'workflow.created'",
	                 t->id_text);
	cr_assert_eq(n, events, "workflow.created events for %s: %ld, want %ld", t->name, n,
	             events);
	n = tstack_count("SELECT count(*) FROM outbox WHERE tenant_id = $1", t->id_text);
	cr_assert_eq(n, events, "outbox rows for %s: %ld, want %ld", t->name, n, events);
	n = tstack_count("SELECT count(*) FROM idempotency_keys"
	                 " WHERE tenant_id = $1",
	                 t->id_text);
	cr_assert_eq(n, keys, "idempotency keys for %s: %ld, want %ld", t->name, n, keys);
}
