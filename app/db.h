/*
 * db.h - one libpq connection, its prepared statements, and the one place
 * where SQLSTATEs are classified.
 *
 * Connect after fork(), never in the supervisor. Statements come from a
 * table (queries.h) and are prepared on every (re)connect. Session settings
 * (lock_timeout, statement_timeout, TimeZone) are fixed at connect time.
 */
#ifndef IDF_DB_H
#define IDF_DB_H

#include <libpq-fe.h>

#include "err.h"
#include "queries.h"

struct db;

struct db_settings {
	const char *conninfo;         /* "" = libpq defaults and PG* variables */
	const char *application_name; /* borrowed */
	long lock_timeout_ms;         /* 0 = none */
	long statement_timeout_ms;    /* 0 = none */
	const struct db_stmt *stmts;  /* prepared on connect; may be NULL */
	int nstmts;
};

/*
 * Make a handle and try to connect. The handle is returned even when the
 * connection fails (e filled, ERR_DB_DOWN), so a worker can start, answer
 * 503 and reconnect later. NULL only when out of memory. The settings'
 * strings must outlive the handle. Caller frees with db_close().
 */
struct db *db_open(const struct db_settings *s, struct err *e) MUSTCHECK;
void db_close(struct db *db);

/* Notice a connection the server closed while we were idle (restart,
 * admin shutdown), so the next db_run() reconnects first instead of failing
 * with it. Costs one poll(2). */
void db_check(struct db *db);

/* Drop the connection at the next statement and connect afresh: for a
 * caller that drove the raw connection (pipeline mode, db_conn()) and saw
 * it break. */
void db_reset(struct db *db);

/* How many times this handle reconnected after its first connection. */
unsigned long db_reconnects(const struct db *db);

/*
 * Run statement id (an index into the handle's statement table, e.g. an
 * enum query_id) with text parameters. Reconnects (and
 * re-prepares) first when the connection is down, at most every 100 ms. Returns a result with
 * PGRES_TUPLES_OK or PGRES_COMMAND_OK (caller PQclear()s it), or NULL with
 * e filled and classified (see db_classify).
 */
PGresult *db_run(struct db *db, int id, int nparams, const char *const *params,
                 struct err *e) MUSTCHECK;

/* One statement of a pipeline: an index into the statement table and its
 * text parameters (borrowed). */
struct db_call {
	int id;
	int nparams;
	const char *const *params;
};

/*
 * Send n statements in one round trip (libpq pipeline mode) and collect
 * their results into res[0..n-1] (caller PQclear()s each; NULL for those
 * that did not run). Returns 0 when all succeeded. Otherwise -1 with e
 * filled from the first failing statement, whose index goes to *failed;
 * an open transaction is then rolled back, so the connection is ready for
 * the next request. A transaction may span pipelines: BEGIN in one,
 * COMMIT in the next.
 */
int db_pipeline(struct db *db, int n, const struct db_call *calls, PGresult **res, int *failed,
                struct err *e) MUSTCHECK;

/* Run a one-off SQL text with parameters (admin tools; not prepared). */
PGresult *db_exec(PGconn *conn, const char *sql, int nparams, const char *const *params,
                  struct err *e) MUSTCHECK;

/* Fill e from a failed result (res may be NULL) on conn. Returns -1. */
int db_classify(PGconn *conn, const PGresult *res, struct err *e);

/* The raw connection, for admin tools. Borrowed. */
PGconn *db_conn(struct db *db);

/* Connect once with conninfo, for the admin CLI (no prepared statements).
 * Returns a connection (caller PQfinish()es) or NULL with e filled. */
PGconn *db_connect_simple(const char *conninfo, const char *appname, struct err *e) MUSTCHECK;

#endif
