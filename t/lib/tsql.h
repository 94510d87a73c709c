/*
 * SQL against the test database ($DATABASE_URL): the process's own
 * connection, queries with text parameters, a held key row, JSON through
 * PostgreSQL's parser, and the rows a tenant has.
 */
#ifndef IDEMFLOW_T_TSQL_H
#define IDEMFLOW_T_TSQL_H

#include <libpq-fe.h>

struct tstack_tenant; /* tapi.h */

/* The process's own connection (created on first use, closed at exit). */
PGconn *tstack_db(void);
/* An extra connection, e.g. to hold locks; the caller PQfinish()es it. */
PGconn *tstack_db_connect(void);

/* Text parameters after sql, NULL-terminated by the macros. */
long tstack_count_(const char *sql, ...);
char *tstack_text_(const char *sql, ...);
void tstack_exec_(PGconn *conn, const char *sql, ...);
#define tstack_count(...) tstack_count_(__VA_ARGS__, (const char *)NULL)
#define tstack_text(...)  tstack_text_(__VA_ARGS__, (const char *)NULL)
#define tstack_exec(...)  tstack_exec_(__VA_ARGS__, (const char *)NULL)

/*
 * BEGIN on conn and insert an idempotency_keys row for (tenant, key)
 * without committing, so the server's own insert for that key waits on it
 * exactly as it would behind a concurrent request still in flight.
 * Release with tstack_exec(conn, "ROLLBACK").
 */
void tstack_key_hold(PGconn *conn, const struct tstack_tenant *t, const char *key);

/*
 * JSON inspection through PostgreSQL's own parser: the text at a path
 * ("{id}", "{input,a}") or its jsonb_typeof.  NULL when absent.  The test
 * fails when json is not valid JSON.  The result is malloc'ed.
 */
char *tstack_json(const char *json, const char *path);
char *tstack_json_type(const char *json, const char *path);

/* Rows for the tenant: workflows, workflow.created events, keys. */
void tstack_expect_counts(const struct tstack_tenant *t, long workflows, long events, long keys);

#endif
