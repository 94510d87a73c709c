/*
 * db.h - one libpq connection, its prepared statements, and the one place
 * where SQLSTATEs are classified.
 *
 * Connect after fork(), never in the supervisor. Statements come from a
 * table the program hands in (the server's is server/queries.h) and are
 * prepared on every (re)connect. Every session setting the SQL depends on
 * (bytea_output, the isolation level, TimeZone, DateStyle, search_path,
 * ...; db.c lists them and why) is pinned at connect time, so no database-
 * or role-level default changes what a statement means;
 * default_transaction_read_only is not pinned, a read-only server is
 * unavailable. A conninfo may name several hosts (libpq's host=a,b
 * port=...): without a target_session_attrs of its own it gets read-write,
 * so a reconnect finds the current primary. TCP keepalives are on unless
 * the conninfo says otherwise.
 */
#ifndef IDF_DB_H
#define IDF_DB_H

#include <libpq-fe.h>

#include "core/err.h"

struct db;

/* One prepared statement of a program's table: its name on the
 * connection, how many parameters it takes and its SQL. nparams is
 * checked twice: against the SQL when the statements are prepared
 * (db_stmt_check), and against every call (db_run, db_pipeline). */
struct db_stmt {
	const char *name;
	int nparams;
	const char *sql;
};

struct db_settings {
	const char *conninfo;         /* "" = libpq defaults and PG* variables */
	const char *application_name; /* borrowed */
	long lock_timeout_ms;         /* 0 = none */
	long statement_timeout_ms;    /* 0 = none */
	const struct db_stmt *stmts;  /* prepared on connect; may be NULL */
	int nstmts;
};

/*
 * Check that stmt's SQL uses exactly $1..$nparams, each at least once
 * ($n inside a quoted literal or identifier does not count). Returns 0, or
 * -1 with e (ERR_INTERNAL) naming the statement and what differs. Run for
 * every statement before it is prepared; a program may also run it over
 * its whole table at startup.
 */
int db_stmt_check(const struct db_stmt *stmt, struct err *e) MUSTCHECK;

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

/* How many times this handle tried to connect, successfully or not. */
unsigned long db_connect_attempts(const struct db *db);

/*
 * The pause before the next connect after failures failed connects in a
 * row: 0 for none, then 100 ms doubling up to 1.6 s. A handle whose
 * connection broke tries again at once, then at this pace (it never sleeps:
 * the statement fails with ERR_DB_DOWN until the pause is over). A server
 * that answers but refuses writes (read-only, out of a resource) is left
 * at once the first time (a new primary may be there); a new session
 * refused again is kept, and still serves reads, for this long after the
 * n-th such drop before it is left again, until a statement that could
 * commit succeeds: each reconnect prepares every statement.
 */
long db_backoff_ms(int failures);

/*
 * Run statement id (an index into the handle's statement table, e.g. an
 * enum query_id) with text parameters. Reconnects (and re-prepares) first
 * when the connection is down, paced by db_backoff_ms(). Returns a result
 * with PGRES_TUPLES_OK or PGRES_COMMAND_OK (caller PQclear()s it), or NULL
 * with e filled and classified (see db_classify); ERR_INTERNAL, sending
 * nothing, when nparams is not the table's count. When the database is
 * unavailable (ERR_DB_DOWN) the connection is dropped and the next
 * statement reconnects; e->outcome_unknown is set when the connection was
 * lost while the statement could have committed (it ran outside an
 * explicit transaction, or was a COMMIT). A statement that could commit
 * and succeeded with a WARNING of class 01000 (a COMMIT whose wait for the
 * synchronous standby was cancelled: committed locally, maybe never
 * replicated) is a failure too: NULL, ERR_DB_DOWN, outcome unknown, the
 * connection kept.
 */
PGresult *db_run(struct db *db, int id, int nparams, const char *const *params,
                 struct err *e) MUSTCHECK;

/* The most statements one db_pipeline() call sends. */
#define DB_PIPELINE_MAX 16

/*
 * The SQLSTATE of a call refused because its tenant is being moved to
 * another partition (sql/proxy/008_tenant_move.sql, and the fence of
 * sql/030_tenant_move.sql): classified ERR_DB_DOWN with this sqlstate,
 * nothing stored, the session kept. handler.c answers it 503 with
 * Retry-After.
 */
#define DB_TENANT_MOVING "IDFMV"

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
 * the next request; nothing is sent when a call's nparams is not the
 * table's count (ERR_INTERNAL). A transaction may span pipelines: BEGIN in one,
 * COMMIT in the next. At most DB_PIPELINE_MAX statements. A lost
 * connection sets e->outcome_unknown as for db_run(): when the pipeline
 * holds a COMMIT, or statements outside an explicit transaction; so does
 * an unconfirmed commit (as for db_run(); *failed is then n - 1).
 */
int db_pipeline(struct db *db, int n, const struct db_call *calls, PGresult **res, int *failed,
                struct err *e) MUSTCHECK;

/* Run a one-off SQL text with parameters (admin tools; not prepared). */
PGresult *db_exec(PGconn *conn, const char *sql, int nparams, const char *const *params,
                  struct err *e) MUSTCHECK;

/*
 * Fill e from a failed result (res may be NULL) on conn. Returns -1.
 * ERR_DB_DOWN: no connection, or the database is unavailable on it (the
 * session was ended: 08xxx, 57P01-57P03, 25P03; out of a resource: 53xxx;
 * read-only: 25006). ERR_LOCK_TIMEOUT: 55P03. ERR_SERIALIZE: 40001, 40P01,
 * 57014. ERR_DB: anything else.
 */
int db_classify(PGconn *conn, const PGresult *res, struct err *e);

/* The raw connection, for admin tools. Borrowed. */
PGconn *db_conn(struct db *db);

/* Connect once with conninfo, for the admin CLI (no prepared statements),
 * with the session settings pinned as for db_open(). Returns a connection
 * (caller PQfinish()es) or NULL with e filled. */
PGconn *db_connect_simple(const char *conninfo, const char *appname, struct err *e) MUSTCHECK;

/*
 * Pin the session settings on conn as db_connect_simple() does, and set
 * its lock_timeout and statement_timeout (milliseconds, 0 = none, -1 =
 * leave as they are): for a connection that PQreset() renewed (a new
 * session has none of it), or a CLI session that wants timeouts. Returns 0,
 * or -1 with e filled (the connection stays; the caller decides).
 */
int db_session_setup(PGconn *conn, long lock_timeout_ms, long statement_timeout_ms,
                     struct err *e) MUSTCHECK;

/* db_connect_simple(), tried up to attempts times while the database is
 * unreachable, pausing db_backoff_ms() between tries (a failover takes
 * seconds). */
PGconn *db_connect_retry(const char *conninfo, const char *appname, int attempts,
                         struct err *e) MUSTCHECK;

#endif
