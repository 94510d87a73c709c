/* db.c - libpq connection, prepared statements, SQLSTATE classes (see db.h). */
#include "db.h"

#include "log.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DB_RETRY_MS        100 /* pace of reconnect attempts while the database is down */
#define DB_CONNECT_TIMEOUT "3" /* seconds; a worker must not hang long on a dead host */

struct db {
	struct db_settings s;
	PGconn *conn;
	int ready; /* connected, configured and prepared */
	int connected_once;
	unsigned long reconnects;
	struct timespec last_attempt; /* of a failed connect; 0 after success */
};

int db_classify(PGconn *conn, const PGresult *res, struct err *e)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *msg = res ? PQresultErrorMessage(res) : NULL;
	enum err_code code = ERR_DB;
	char clean[200];
	size_t n;

	if (msg == NULL || *msg == '\0')
		msg = conn ? PQerrorMessage(conn) : "no connection";
	/* The first line is enough for logs and error bodies. */
	n = strcspn(msg, "\n");
	snprintf(clean, sizeof(clean), "%.*s", (int)(n < sizeof(clean) ? n : sizeof(clean) - 1),
	         msg);

	if (state == NULL) {
		/* libpq gives no SQLSTATE for client-side failures: a lost
		 * connection is the usual cause. */
		if (conn == NULL || PQstatus(conn) == CONNECTION_BAD)
			code = ERR_DB_DOWN;
	} else if (strncmp(state, "08", 2) == 0 || strcmp(state, "57P01") == 0 ||
	           strcmp(state, "57P02") == 0 || strcmp(state, "57P03") == 0) {
		code = ERR_DB_DOWN;
	} else if (strcmp(state, "55P03") == 0) {
		code = ERR_LOCK_TIMEOUT;
	} else if (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0 ||
	           strcmp(state, "57014") == 0) {
		code = ERR_SERIALIZE;
	}
	err_set(e, code, "%s", clean);
	if (e != NULL && state != NULL)
		snprintf(e->sqlstate, sizeof(e->sqlstate), "%s", state);
	return -1;
}

PGconn *db_connect_simple(const char *conninfo, const char *appname, struct err *e)
{
	const char *keys[] = {"dbname", "application_name", "connect_timeout", NULL};
	const char *vals[] = {conninfo, appname, DB_CONNECT_TIMEOUT, NULL};
	PGconn *conn;

	/* expand_dbname: conninfo may be a URI or a key=value list; empty
	 * values are ignored, so "" means libpq defaults and PG* variables. */
	conn = PQconnectdbParams(keys, vals, 1);
	if (conn == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		return NULL;
	}
	if (PQstatus(conn) != CONNECTION_OK) {
		char msg[200];
		snprintf(msg, sizeof(msg), "%s", PQerrorMessage(conn));
		msg[strcspn(msg, "\n")] = '\0';
		err_set(e, ERR_DB_DOWN, "could not connect to database: %s", msg);
		PQfinish(conn);
		return NULL;
	}
	return conn;
}

PGresult *db_exec(PGconn *conn, const char *sql, int nparams, const char *const *params,
                  struct err *e)
{
	PGresult *res = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(res);

	if (res != NULL && (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK))
		return res;
	db_classify(conn, res, e);
	PQclear(res);
	return NULL;
}

/* Server messages outside a query (a NOTICE, or the FATAL that comes before
 * the server closes a connection) go to the log as one logfmt line instead
 * of libpq's raw stderr text. */
static void log_notice(void *arg, const char *message)
{
	char line[512];
	size_t n = 0, len = strcspn(message, "\n");
	char msg[400];

	(void)arg;
	snprintf(msg, sizeof(msg), "%.*s", (int)(len < sizeof(msg) ? len : sizeof(msg) - 1),
	         message);
	log_kv(line, sizeof(line), &n, "message", msg);
	log_info("postgresql says", "%s", line);
}

static int db_setup(struct db *db, struct err *e)
{
	char sql[256];
	PGresult *res;

	PQsetNoticeProcessor(db->conn, log_notice, NULL);
	snprintf(
	    sql, sizeof(sql),
	    "SET TimeZone = 'UTC'; SET lock_timeout = '%ldms'; SET statement_timeout = '%ldms'",
	    db->s.lock_timeout_ms, db->s.statement_timeout_ms);
	res = PQexec(db->conn, sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		db_classify(db->conn, res, e);
		PQclear(res);
		return -1;
	}
	PQclear(res);
	for (int i = 0; i < db->s.nstmts; i++) {
		res = PQprepare(db->conn, db->s.stmts[i].name, db->s.stmts[i].sql, 0, NULL);
		if (PQresultStatus(res) != PGRES_COMMAND_OK) {
			db_classify(db->conn, res, e);
			/* A bad statement is a bug, not an outage: say which. */
			if (e != NULL && e->code != ERR_DB_DOWN)
				err_prefix(e, "could not prepare \"%s\"", db->s.stmts[i].name);
			PQclear(res);
			return -1;
		}
		PQclear(res);
	}
	return 0;
}

static int db_connect(struct db *db, struct err *e)
{
	PQfinish(db->conn);
	db->ready = 0;
	db->conn = db_connect_simple(db->s.conninfo, db->s.application_name, e);
	if (db->conn == NULL)
		return -1;
	if (db_setup(db, e) < 0) {
		PQfinish(db->conn);
		db->conn = NULL;
		return -1;
	}
	if (db->connected_once)
		db->reconnects++;
	db->connected_once = 1;
	db->ready = 1;
	return 0;
}

struct db *db_open(const struct db_settings *s, struct err *e)
{
	struct db *db = calloc(1, sizeof(*db));

	if (db == NULL) {
		err_set(e, ERR_INTERNAL, "out of memory");
		return NULL;
	}
	db->s = *s;
	err_clear(e);
	if (db_connect(db, e) < 0)
		clock_gettime(CLOCK_MONOTONIC, &db->last_attempt);
	return db;
}

void db_close(struct db *db)
{
	if (db == NULL)
		return;
	PQfinish(db->conn);
	free(db);
}

/* Notifications are not used by the server; free any that arrive. */
static void drain_notifies(PGconn *conn)
{
	PGnotify *n;

	while ((n = PQnotifies(conn)) != NULL)
		PQfreemem(n);
}

void db_check(struct db *db)
{
	struct pollfd pfd;

	if (!db->ready)
		return;
	if (PQstatus(db->conn) != CONNECTION_OK) {
		db->ready = 0;
		return;
	}
	/* A server that closed an idle connection has sent its goodbye (an
	 * error message, then EOF) already: read it now. libpq reports the
	 * EOF only on a read after the message, hence the loop. */
	pfd.fd = PQsocket(db->conn);
	pfd.events = POLLIN;
	for (int i = 0; i < 4; i++) {
		pfd.revents = 0;
		if (poll(&pfd, 1, 0) <= 0)
			break;
		if (!PQconsumeInput(db->conn) || PQstatus(db->conn) != CONNECTION_OK) {
			db->ready = 0;
			break;
		}
		drain_notifies(db->conn);
	}
}

void db_reset(struct db *db)
{
	db->ready = 0;
}

unsigned long db_reconnects(const struct db *db)
{
	return db->reconnects;
}

/* Connect when the connection is down, at most every DB_RETRY_MS. */
static int ensure_connected(struct db *db, struct err *e)
{
	struct timespec now;
	long since_ms;

	if (db->ready)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &now);
	since_ms = (now.tv_sec - db->last_attempt.tv_sec) * 1000 +
	           (now.tv_nsec - db->last_attempt.tv_nsec) / 1000000;
	/* While PostgreSQL is down, a worker under load tries to connect at
	 * most every DB_RETRY_MS, not on every request. */
	if (db->last_attempt.tv_sec != 0 && since_ms < DB_RETRY_MS)
		return err_set(e, ERR_DB_DOWN, "no connection to the database (retrying)");
	db->last_attempt = now;
	if (db_connect(db, e) < 0)
		return -1;
	db->last_attempt.tv_sec = 0;
	return 0;
}

PGresult *db_run(struct db *db, int id, int nparams, const char *const *params, struct err *e)
{
	PGresult *res;
	ExecStatusType st;

	if (ensure_connected(db, e) < 0)
		return NULL;
	res = PQexecPrepared(db->conn, db->s.stmts[id].name, nparams, params, NULL, NULL, 0);
	st = PQresultStatus(res);
	if (res != NULL && (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK))
		return res;
	db_classify(db->conn, res, e);
	PQclear(res);
	if (PQstatus(db->conn) != CONNECTION_OK)
		db->ready = 0; /* reconnect before the next statement */
	return NULL;
}

/* Read what is left of a pipeline up to its sync point and leave
 * pipeline mode. Returns -1 when the connection broke. */
static int pipeline_finish(PGconn *conn)
{
	PGresult *r;

	for (;;) {
		r = PQgetResult(conn);
		if (r == NULL) {
			if (PQstatus(conn) != CONNECTION_OK)
				return -1;
			continue; /* the end of one statement's results */
		}
		ExecStatusType st = PQresultStatus(r);
		PQclear(r);
		if (st == PGRES_PIPELINE_SYNC)
			break;
	}
	return PQexitPipelineMode(conn) ? 0 : -1;
}

int db_pipeline(struct db *db, int n, const struct db_call *calls, PGresult **res, int *failed,
                struct err *e)
{
	PGconn *conn;
	int first_bad = -1, i;

	for (i = 0; i < n; i++)
		res[i] = NULL;
	*failed = 0;
	if (ensure_connected(db, e) < 0)
		return -1;
	conn = db->conn;
	if (!PQenterPipelineMode(conn)) {
		db_classify(conn, NULL, e);
		return -1;
	}
	for (i = 0; i < n; i++)
		if (!PQsendQueryPrepared(conn, db->s.stmts[calls[i].id].name, calls[i].nparams,
		                         calls[i].params, NULL, NULL, 0))
			break;
	if (i < n || !PQpipelineSync(conn)) {
		db_classify(conn, NULL, e);
		goto broken;
	}
	for (i = 0; i < n; i++) {
		PGresult *r = PQgetResult(conn);
		ExecStatusType st = PQresultStatus(r);

		if (r == NULL) {
			db_classify(conn, NULL, e);
			goto broken;
		}
		if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
			res[i] = r;
		} else {
			if (first_bad < 0 && st != PGRES_PIPELINE_ABORTED) {
				first_bad = i;
				db_classify(conn, r, e);
			}
			PQclear(r);
		}
		/* Each statement's results end with a NULL. */
		r = PQgetResult(conn);
		if (r != NULL) {
			PQclear(r);
			db_classify(conn, NULL, e);
			goto broken;
		}
	}
	if (pipeline_finish(conn) < 0) {
		db_classify(conn, NULL, e);
		goto broken;
	}
	if (first_bad < 0)
		return 0;
	*failed = first_bad;
	if (PQtransactionStatus(conn) != PQTRANS_IDLE)
		PQclear(PQexec(conn, "ROLLBACK"));
	goto fail;
broken:
	if (first_bad < 0)
		*failed = i < n ? i : n - 1;
	else
		*failed = first_bad;
	db->ready = 0; /* reconnect before the next statement */
fail:
	for (i = 0; i < n; i++) {
		PQclear(res[i]);
		res[i] = NULL;
	}
	return -1;
}

PGconn *db_conn(struct db *db)
{
	return db->conn;
}
