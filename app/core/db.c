/* db.c - libpq connection, prepared statements, SQLSTATE classes (see db.h). */
#include "core/db.h"

#include "core/log.h"

#include <ctype.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define DB_CONNECT_TIMEOUT "3" /* seconds per host; a worker must not hang long on a dead host */

/*
 * TCP keepalives, unless the conninfo sets its own: a worker waiting for
 * a server that vanished (host down, network partition) learns it after
 * about idle + interval * count = 25 s instead of the kernel's two hours.
 * The server gets the same values (tcp_keepalives_*), so it drops the
 * session of a vanished worker as soon. Neither applies to unix sockets.
 */
#define DB_KEEPALIVES_IDLE     "10"
#define DB_KEEPALIVES_INTERVAL "5"
#define DB_KEEPALIVES_COUNT    "3"

/*
 * Every session setting the SQL depends on, pinned at connect so that a
 * database- or role-level default (ALTER DATABASE ... SET) cannot change
 * what a statement means:
 * - bytea_output: fingerprints are compared as hex text (idem.h);
 * - default_transaction_isolation: a same-key race is settled by waiting
 *   on the unique index, which needs read committed (repeatable read
 *   turns the loser into a serialization failure);
 * - DateStyle, IntervalStyle, TimeZone, extra_float_digits: times and
 *   intervals as text (the CLI prints them, the API formats in UTC);
 * - search_path: the schema is public (sql/roles.sql grants there);
 * - standard_conforming_strings, client_encoding: literals and text as
 *   the code writes them (UTF-8 JSON);
 * - transform_null_equals, array_nulls: the SQL's NULL semantics;
 * - client_min_messages: notices a worker logs;
 * - tcp_keepalives_*: see above;
 * - synchronous_commit: an answer is sent after its commit is durable, so
 *   every level that acknowledges a commit before the synchronous standby
 *   has flushed it ("off", "local", "remote_write") is raised to "on";
 *   "remote_apply", which is stronger, is kept.
 * default_transaction_read_only is deliberately not pinned: a read-only
 * database is unavailable for writing, and answered as such (db_classify).
 */
static const char DB_PIN_SQL[] = "SET bytea_output = 'hex';\n"
                                 "SET default_transaction_isolation = 'read committed';\n"
                                 "SET DateStyle = 'ISO, MDY';\n"
                                 "SET IntervalStyle = 'postgres';\n"
                                 "SET TimeZone = 'UTC';\n"
                                 "SET extra_float_digits = 1;\n"
                                 "SET search_path = public;\n"
                                 "SET standard_conforming_strings = on;\n"
                                 "SET client_encoding = 'UTF8';\n"
                                 "SET transform_null_equals = off;\n"
                                 "SET array_nulls = on;\n"
                                 "SET client_min_messages = notice;\n"
                                 "SET tcp_keepalives_idle = " DB_KEEPALIVES_IDLE ";\n"
                                 "SET tcp_keepalives_interval = " DB_KEEPALIVES_INTERVAL ";\n"
                                 "SET tcp_keepalives_count = " DB_KEEPALIVES_COUNT ";\n"
                                 "SELECT set_config('synchronous_commit', 'on', false)\n"
                                 " WHERE current_setting('synchronous_commit')\n"
                                 "       NOT IN ('on', 'remote_apply')\n";

/*
 * A handle's sessions (workers, dispatchers) are never idle inside a
 * transaction for longer than a round trip: a worker renders its answer
 * between two pipelines of one transaction. A worker frozen there (stopped,
 * swapped out, cut off) would hold its key's row and locks indefinitely;
 * the server ends such a session after this long and rolls it back.
 */
#define DB_IDLE_IN_TX_MS 10000

/*
 * A session whose client is gone (a worker killed by the supervisor's
 * request_terminate_timeout, or by anyone) must not finish its statement:
 * one waiting for a lock would otherwise take it once it is free, run to
 * the end and, outside an explicit transaction, commit. PostgreSQL (14 and
 * later) polls the client's socket this often while a statement runs, and
 * ends the session, rolling back, when it is closed.
 */
#define DB_CLIENT_CHECK_MS 500

/* Reconnect back-off: 100 ms after the first failed connect, doubling,
 * at most DB_RETRY_MAX_MS apart while the database stays unreachable. */
#define DB_RETRY_FIRST_MS 100
#define DB_RETRY_MAX_MS   1600

struct db {
	struct db_settings s;
	PGconn *conn;
	int ready; /* connected, configured and prepared */
	int connected_once;
	int failures;                   /* failed connects in a row */
	int unconfirmed;                /* a WARNING came during the statements in flight */
	int unavailable;                /* sessions dropped as unavailable (read-only, out of a
	                                 * resource) in a row, no commit in between */
	struct timespec unavailable_at; /* of the last such drop */
	unsigned long reconnects;
	unsigned long attempts;
	struct timespec last_attempt; /* of a failed connect; 0 after success */
};

long db_backoff_ms(int failures)
{
	long ms = DB_RETRY_FIRST_MS;

	if (failures <= 0)
		return 0;
	for (int i = 1; i < failures && ms < DB_RETRY_MAX_MS; i++)
		ms *= 2;
	return ms < DB_RETRY_MAX_MS ? ms : DB_RETRY_MAX_MS;
}

/* SQLSTATEs after which the server has ended the session. */
static int session_ended(const char *state)
{
	return strncmp(state, "08", 2) == 0 || strcmp(state, "57P01") == 0 ||
	       strcmp(state, "57P02") == 0 || strcmp(state, "57P03") == 0 ||
	       strcmp(state, "25P03") == 0;
}

/*
 * A failure of a PL/Proxy call between the proxy and a partition (routing
 * = proxy, doc/distribution.md), told by its message: PL/Proxy reports
 * its own transport failures as XX000 "PL/Proxy function f(n): [cluster]
 * PQcall: ...", and a partition's session ended as that partition's
 * SQLSTATE with "[cluster] REMOTE FATAL". The worker's own session is
 * fine either way. PROXY_UNREACHED: the partition was not reached (the
 * connect failed), nothing was sent. PROXY_LOST: the partition's
 * connection broke while the call was out: it may have committed.
 */
enum proxy_failure { PROXY_NONE, PROXY_UNREACHED, PROXY_LOST };

static enum proxy_failure proxy_failure(const char *state, const char *msg)
{
	if (state == NULL || msg == NULL)
		return PROXY_NONE;
	if (strcmp(state, "XX000") == 0 && strstr(msg, "PL/Proxy function ") != NULL)
		return strstr(msg, "] PQconnect") != NULL ? PROXY_UNREACHED : PROXY_LOST;
	if (session_ended(state) && strstr(msg, "] REMOTE FATAL") != NULL)
		return PROXY_LOST;
	return PROXY_NONE;
}

int db_classify(PGconn *conn, const PGresult *res, struct err *e)
{
	const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *msg = res ? PQresultErrorMessage(res) : NULL;
	enum err_code code = ERR_DB;
	/* As long as an error's message may be: through a proxy the
	 * partition's comes after PL/Proxy's prefix. */
	char clean[sizeof(((struct err *)0)->msg)];
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
	} else if (strcmp(state, DB_TENANT_MOVING) == 0) {
		/* Refused by the proxy's directory or the partition's fence,
		 * before anything was stored: only this tenant waits. */
		code = ERR_DB_DOWN;
	} else if (proxy_failure(state, clean) != PROXY_NONE) {
		/* The tenant's partition is unavailable. */
		code = ERR_DB_DOWN;
	} else if (session_ended(state) || strncmp(state, "53", 2) == 0 ||
	           strcmp(state, "25006") == 0) {
		/* Unavailability, not a bug: the session ended (shutdown,
		 * terminated, idle-in-transaction timeout), the server is out
		 * of a resource, or it is read-only (a standby, a demoted
		 * primary, default_transaction_read_only). */
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

/* 1 when conninfo (or $PGHOST, when it names no host) lists several
 * hosts and nothing chooses a target_session_attrs. */
static int wants_read_write(const char *conninfo)
{
	PQconninfoOption *opts = PQconninfoParse(conninfo, NULL);
	const char *host = NULL, *hostaddr = NULL, *tsa = NULL;
	int multi;

	if (opts == NULL)
		return 0; /* the connect reports what is wrong with it */
	for (PQconninfoOption *o = opts; o->keyword != NULL; o++) {
		if (o->val == NULL || *o->val == '\0')
			continue;
		if (strcmp(o->keyword, "host") == 0)
			host = o->val;
		else if (strcmp(o->keyword, "hostaddr") == 0)
			hostaddr = o->val;
		else if (strcmp(o->keyword, "target_session_attrs") == 0)
			tsa = o->val;
	}
	if (host == NULL && hostaddr == NULL)
		host = getenv("PGHOST");
	multi = (host != NULL && strchr(host, ',') != NULL) ||
	        (hostaddr != NULL && strchr(hostaddr, ',') != NULL);
	if (tsa != NULL || getenv("PGTARGETSESSIONATTRS") != NULL)
		multi = 0;
	PQconninfoFree(opts);
	return multi;
}

PGconn *db_connect_simple(const char *conninfo, const char *appname, struct err *e)
{
	/* Defaults first: the keys that dbname expands to (conninfo) come
	 * after them and win. application_name comes last and always wins. */
	const char *keys[] = { "connect_timeout",
		               "keepalives",
		               "keepalives_idle",
		               "keepalives_interval",
		               "keepalives_count",
		               "target_session_attrs",
		               "dbname",
		               "application_name",
		               NULL };
	const char *vals[] = { DB_CONNECT_TIMEOUT, "1", DB_KEEPALIVES_IDLE, DB_KEEPALIVES_INTERVAL,
		               DB_KEEPALIVES_COUNT,
		               /* With several hosts, find the primary: a
		                * standby cannot take a single write. */
		               wants_read_write(conninfo) ? "read-write" : NULL, conninfo, appname,
		               NULL };
	PGconn *conn;

	/* NULL or empty values count as not given: "" for conninfo means
	 * libpq defaults and PG* variables. */
	for (int i = 0; keys[i] != NULL; i++)
		if (vals[i] == NULL)
			vals[i] = "";
	/* expand_dbname: conninfo may be a URI or a key=value list. */
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
	if (db_session_setup(conn, -1, -1, e) < 0) {
		PQfinish(conn);
		return NULL;
	}
	return conn;
}

int db_session_setup(PGconn *conn, long lock_timeout_ms, long statement_timeout_ms, struct err *e)
{
	char sql[sizeof(DB_PIN_SQL) + 128];
	PGresult *res;
	int n = 0;

	/* The timeouts first: the pin ends with its SELECT. */
	if (lock_timeout_ms >= 0)
		n += snprintf(sql + n, sizeof(sql) - (size_t)n, "SET lock_timeout = '%ldms';\n",
		              lock_timeout_ms);
	if (statement_timeout_ms >= 0)
		n += snprintf(sql + n, sizeof(sql) - (size_t)n,
		              "SET statement_timeout = '%ldms';\n", statement_timeout_ms);
	snprintf(sql + n, sizeof(sql) - (size_t)n, "%s", DB_PIN_SQL);
	res = PQexec(conn, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK) {
		db_classify(conn, res, e);
		err_prefix(e, "could not configure the session");
		PQclear(res);
		return -1;
	}
	PQclear(res);
	return 0;
}

PGconn *db_connect_retry(const char *conninfo, const char *appname, int attempts, struct err *e)
{
	PGconn *conn = NULL;

	for (int i = 0; i < attempts || i == 0; i++) {
		if (i > 0) {
			long ms = db_backoff_ms(i);
			struct timespec ts = { ms / 1000, ms % 1000 * 1000000L };
			nanosleep(&ts, NULL);
		}
		conn = db_connect_simple(conninfo, appname, e);
		if (conn != NULL || e == NULL || e->code != ERR_DB_DOWN)
			break;
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

/*
 * A COMMIT waiting for the synchronous standby (synchronous_commit = on or
 * remote_apply) whose wait is cancelled (pg_cancel_backend, a cancel
 * request) does not fail: PostgreSQL has committed it locally, ends the
 * wait with "WARNING: canceling wait for synchronous replication due to
 * user request" (the plain warning class, 01000; syncrep.c,
 * SyncRepWaitForLSN) and answers COMMIT. The standby may never get it, so
 * a failover can take it back: it is not an acknowledgement. The code,
 * unlike the text, is the same in every lc_messages. Terminated instead
 * (57P01, pg_terminate_backend, a shutdown), the session ends after the
 * warning: the commit is then a lost connection, unknown as well.
 */
#define DB_SYNCREP_CANCELLED "01000"

/* Server messages outside a query (a NOTICE, or the FATAL that comes before
 * the server closes a connection) go to the log as one logfmt line instead
 * of libpq's raw stderr text. A FATAL (or PANIC) means the server is ending
 * the session: the handle connects afresh at its next statement, even when
 * the connection's EOF has not arrived yet (a backend leaves
 * pg_stat_activity before its socket closes). A WARNING of class 01000
 * marks the statements in flight as unconfirmed (DB_SYNCREP_CANCELLED). */
static void log_notice(void *arg, const PGresult *res)
{
	struct db *db = arg;
	const char *message = PQresultErrorMessage(res);
	const char *severity = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
	const char *sqlstate = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	char line[512];
	size_t n = 0, len;
	char msg[400];

	if (message == NULL)
		message = "";
	len = strcspn(message, "\n");
	snprintf(msg, sizeof(msg), "%.*s", (int)(len < sizeof(msg) ? len : sizeof(msg) - 1),
	         message);
	log_kv(line, sizeof(line), &n, "message", msg);
	log_info("postgresql says", "%s", line);
	if (severity != NULL && (strcmp(severity, "FATAL") == 0 || strcmp(severity, "PANIC") == 0))
		db->ready = 0;
	if (severity != NULL && strcmp(severity, "WARNING") == 0 && sqlstate != NULL &&
	    strcmp(sqlstate, DB_SYNCREP_CANCELLED) == 0)
		db->unconfirmed = 1;
}

/* The most parameters db_stmt_check() can count. */
#define DB_PARAMS_MAX 64

/* The end of the quoted text that starts at p (a ' or "), or of the
 * string when it is not closed. A doubled quote stays inside; backslash
 * escapes count only in an E'...' string. */
static const char *skip_quoted(const char *sql, const char *p)
{
	const char q = *p;
	const int escapes = q == '\'' && p > sql && (p[-1] == 'E' || p[-1] == 'e');

	for (p++; *p != '\0'; p++) {
		if (escapes && *p == '\\' && p[1] != '\0')
			p++;
		else if (*p == q && p[1] == q)
			p++;
		else if (*p == q)
			return p + 1;
	}
	return p;
}

static int ident_char(char c)
{
	return isalnum((unsigned char)c) || c == '_' || c == '$';
}

/* p at a $tag$ or $$: past the dollar-quoted text it opens, or past p when
 * it is not one. */
static const char *skip_dollar_quoted(const char *p)
{
	size_t n = 1;
	char tag[64];
	const char *end;

	while (isalnum((unsigned char)p[n]) || p[n] == '_')
		n++;
	if (p[n] != '$' || n + 1 >= sizeof(tag))
		return p + 1;
	memcpy(tag, p, n + 1);
	tag[n + 1] = '\0';
	end = strstr(p + n + 1, tag);
	return end != NULL ? end + n + 1 : p + strlen(p);
}

int db_stmt_check(const struct db_stmt *stmt, struct err *e)
{
	unsigned long long used = 0;
	const char *sql = stmt->sql, *p = sql;
	int highest = 0;

	if (stmt->nparams < 0 || stmt->nparams > DB_PARAMS_MAX)
		return err_set(e, ERR_INTERNAL, "statement \"%s\" declares %d parameters (0 to %d)",
		               stmt->name, stmt->nparams, DB_PARAMS_MAX);
	while (*p != '\0') {
		if (*p == '\'' || *p == '"') {
			p = skip_quoted(sql, p);
		} else if (p[0] == '-' && p[1] == '-') {
			p += strcspn(p, "\n");
		} else if (*p == '$' && (p == sql || !ident_char(p[-1])) &&
		           (p[1] == '$' || isalpha((unsigned char)p[1]) || p[1] == '_')) {
			p = skip_dollar_quoted(p);
		} else if (p[0] == '/' && p[1] == '*') {
			const char *end = strstr(p + 2, "*/");
			p = end != NULL ? end + 2 : p + strlen(p);
		} else if (*p == '$' && (p == sql || !ident_char(p[-1])) &&
		           isdigit((unsigned char)p[1])) {
			char *end;
			long n = strtol(p + 1, &end, 10);
			p = end;
			if (n < 1 || n > DB_PARAMS_MAX)
				return err_set(e, ERR_INTERNAL,
				               "statement \"%s\" uses $%ld (1 to %d are possible)",
				               stmt->name, n, DB_PARAMS_MAX);
			used |= 1ULL << (n - 1);
			if (n > highest)
				highest = (int)n;
		} else {
			p++;
		}
	}
	if (highest != stmt->nparams && highest == 0)
		return err_set(e, ERR_INTERNAL,
		               "statement \"%s\" declares %d parameters but its SQL uses none",
		               stmt->name, stmt->nparams);
	if (highest != stmt->nparams)
		return err_set(e, ERR_INTERNAL,
		               "statement \"%s\" declares %d parameters but its SQL uses $%d",
		               stmt->name, stmt->nparams, highest);
	for (int i = 0; i < highest; i++)
		if (!(used & (1ULL << i)))
			return err_set(e, ERR_INTERNAL,
			               "statement \"%s\" declares %d parameters but its SQL never "
			               "uses $%d",
			               stmt->name, stmt->nparams, i + 1);
	return 0;
}

/* A call's parameter count against the table's: -1 with e when they
 * differ (a bug: nothing is sent). */
static int check_call(const struct db *db, int id, int nparams, struct err *e)
{
	const struct db_stmt *st = &db->s.stmts[id];

	if (nparams == st->nparams)
		return 0;
	return err_set(e, ERR_INTERNAL,
	               "statement \"%s\" called with %d parameters, its table says %d", st->name,
	               nparams, st->nparams);
}

static int db_setup(struct db *db, struct err *e)
{
	char sql[256];
	PGresult *res;

	PQsetNoticeReceiver(db->conn, log_notice, db);
	snprintf(sql, sizeof(sql),
	         "SET lock_timeout = '%ldms';\n"
	         "SET statement_timeout = '%ldms';\n"
	         "SET idle_in_transaction_session_timeout = '%dms';\n"
	         "SET client_connection_check_interval = '%dms'\n",
	         db->s.lock_timeout_ms, db->s.statement_timeout_ms, DB_IDLE_IN_TX_MS,
	         DB_CLIENT_CHECK_MS);
	res = PQexec(db->conn, sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		db_classify(db->conn, res, e);
		PQclear(res);
		return -1;
	}
	PQclear(res);
	for (int i = 0; i < db->s.nstmts; i++) {
		if (db_stmt_check(&db->s.stmts[i], e) < 0)
			return -1;
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
	db->attempts++;
	db->conn = db_connect_simple(db->s.conninfo, db->s.application_name, e);
	if (db->conn == NULL) {
		db->failures++;
		return -1;
	}
	if (db_setup(db, e) < 0) {
		PQfinish(db->conn);
		db->conn = NULL;
		db->failures++;
		return -1;
	}
	db->failures = 0;
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
		if (!db->ready) /* a FATAL came (log_notice): the EOF may not yet */
			break;
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

unsigned long db_connect_attempts(const struct db *db)
{
	return db->attempts;
}

/* Connect when the connection is down: at once after a working
 * connection broke, then paced by db_backoff_ms(). */
static int ensure_connected(struct db *db, struct err *e)
{
	struct timespec now;
	long since_ms;

	if (db->ready)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &now);
	since_ms = (now.tv_sec - db->last_attempt.tv_sec) * 1000 +
	           (now.tv_nsec - db->last_attempt.tv_nsec) / 1000000;
	/* While PostgreSQL is down, a worker under load tries to connect
	 * after a growing pause, not on every request: answering 503 at
	 * once costs nothing, a connect to a dead host up to
	 * connect_timeout. */
	if (db->last_attempt.tv_sec != 0 && since_ms < db_backoff_ms(db->failures))
		return err_set(e, ERR_DB_DOWN, "no connection to the database (retrying)");
	db->last_attempt = now;
	if (db_connect(db, e) < 0)
		return -1;
	db->last_attempt.tv_sec = 0;
	return 0;
}

/* The kind of transaction control a statement is, from its SQL. */
enum tx_verb { TX_OTHER, TX_BEGIN, TX_COMMIT, TX_ROLLBACK };

static enum tx_verb tx_verb(const char *sql)
{
	if (strncasecmp(sql, "BEGIN", 5) == 0 || strncasecmp(sql, "START TRANSACTION", 17) == 0)
		return TX_BEGIN;
	if (strncasecmp(sql, "COMMIT", 6) == 0 || strncasecmp(sql, "END", 3) == 0)
		return TX_COMMIT;
	if (strncasecmp(sql, "ROLLBACK", 8) == 0 || strncasecmp(sql, "ABORT", 5) == 0)
		return TX_ROLLBACK;
	return TX_OTHER;
}

/*
 * Whether statements ids[0..n-1], sent on a session whose transaction
 * status was before, could have committed something: a COMMIT, or a
 * statement outside an explicit transaction (an implicit transaction
 * commits with it, or at the pipeline's sync). Statements inside an
 * explicit transaction that has not been committed cannot: losing the
 * session rolls them back.
 */
static int could_commit(const struct db *db, PGTransactionStatusType before, int n, const int *ids)
{
	int intx = before == PQTRANS_INTRANS || before == PQTRANS_INERROR;

	for (int i = 0; i < n; i++) {
		switch (tx_verb(db->s.stmts[ids[i]].sql)) {
		case TX_BEGIN: intx = 1; break;
		case TX_COMMIT: return 1;
		case TX_ROLLBACK: intx = 0; break;
		case TX_OTHER:
			if (!intx)
				return 1;
			break;
		}
	}
	return 0;
}

/*
 * After a failed statement (e filled): reset the connection when the
 * database is unavailable on it (a read-only server may have been replaced
 * by a new primary, which a multi-host conninfo finds on reconnect), and
 * tell whether the outcome of what was sent is unknown.
 */
static void after_failure(struct db *db, PGTransactionStatusType before, int n, const int *ids,
                          struct err *e)
{
	const enum proxy_failure proxy = proxy_failure(e->sqlstate, e->msg);
	int lost = PQstatus(db->conn) != CONNECTION_OK ||
	           (e->sqlstate[0] != '\0' && session_ended(e->sqlstate));

	const int refused = e->code == ERR_DB_DOWN && !lost && PQstatus(db->conn) == CONNECTION_OK;
	struct timespec now;

	/* A tenant being moved: the session and the server are fine. */
	if (strcmp(e->sqlstate, DB_TENANT_MOVING) == 0)
		return;

	/* Only a partition failed: the session to the proxy stays. */
	if (proxy != PROXY_NONE && PQstatus(db->conn) == CONNECTION_OK) {
		if (proxy == PROXY_LOST && could_commit(db, before, n, ids))
			e->outcome_unknown = 1;
		return;
	}

	/* A server that answers but takes no writes (read-only, out of a
	 * resource): the first refusal drops the session at once, for a new
	 * primary (a multi-host conninfo finds it). A new session refused
	 * again is kept (reads work on it) for db_backoff_ms(refusals) before
	 * it is dropped again: each reconnect prepares every statement. */
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (refused && db->unavailable > 0 &&
	    (now.tv_sec - db->unavailable_at.tv_sec) * 1000 +
	            (now.tv_nsec - db->unavailable_at.tv_nsec) / 1000000 <
	        db_backoff_ms(db->unavailable))
		; /* keep it for now */
	else if (e->code == ERR_DB_DOWN || lost)
		db->ready = 0; /* reconnect before the next statement */
	if (refused && !db->ready) {
		db->unavailable++;
		db->unavailable_at = now;
	}
	/* An idle-in-transaction timeout rolled the transaction back. */
	if (lost && strcmp(e->sqlstate, "25P03") != 0 && could_commit(db, before, n, ids)) {
		e->code = ERR_DB_DOWN;
		e->outcome_unknown = 1;
	}
}

/*
 * After statements that succeeded: 1 with e filled (ERR_DB_DOWN, outcome
 * unknown) when a warning of DB_SYNCREP_CANCELLED's class came while they
 * ran and they could have committed: the commit stands locally, but its
 * wait for the synchronous standby was cancelled, so it is not known to
 * survive a failover. The connection is fine and stays.
 */
static int unconfirmed_commit(struct db *db, PGTransactionStatusType before, int n, const int *ids,
                              struct err *e)
{
	if (!db->unconfirmed || !could_commit(db, before, n, ids))
		return 0;
	err_set(e, ERR_DB_DOWN,
	        "the commit's wait for the synchronous standby was cancelled: committed "
	        "locally, not confirmed durable");
	snprintf(e->sqlstate, sizeof(e->sqlstate), "%s", DB_SYNCREP_CANCELLED);
	e->outcome_unknown = 1;
	return 1;
}

PGresult *db_run(struct db *db, int id, int nparams, const char *const *params, struct err *e)
{
	PGTransactionStatusType before;
	PGresult *res;
	ExecStatusType st;
	struct err local;

	if (e == NULL)
		e = &local;
	if (check_call(db, id, nparams, e) < 0 || ensure_connected(db, e) < 0)
		return NULL;
	before = PQtransactionStatus(db->conn);
	db->unconfirmed = 0;
	res = PQexecPrepared(db->conn, db->s.stmts[id].name, nparams, params, NULL, NULL, 0);
	st = PQresultStatus(res);
	if (res != NULL && (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)) {
		if (!unconfirmed_commit(db, before, 1, &id, e)) {
			if (could_commit(db, before, 1, &id))
				db->unavailable = 0; /* it takes writes */
			return res;
		}
		PQclear(res);
		return NULL;
	}
	db_classify(db->conn, res, e);
	PQclear(res);
	after_failure(db, before, 1, &id, e);
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
	PGTransactionStatusType before;
	PGconn *conn;
	int first_bad = -1, i, ids[DB_PIPELINE_MAX];
	struct err local;

	if (e == NULL)
		e = &local;
	for (i = 0; i < n; i++)
		res[i] = NULL;
	*failed = 0;
	if (n > DB_PIPELINE_MAX)
		return err_set(e, ERR_INTERNAL, "a pipeline of %d statements is too long", n);
	for (i = 0; i < n; i++)
		if (check_call(db, calls[i].id, calls[i].nparams, e) < 0) {
			*failed = i;
			return -1;
		}
	if (ensure_connected(db, e) < 0)
		return -1;
	conn = db->conn;
	before = PQtransactionStatus(conn);
	for (i = 0; i < n; i++)
		ids[i] = calls[i].id;
	if (!PQenterPipelineMode(conn)) {
		db_classify(conn, NULL, e);
		return -1;
	}
	db->unconfirmed = 0;
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
	if (first_bad < 0 && !unconfirmed_commit(db, before, n, ids, e)) {
		if (could_commit(db, before, n, ids))
			db->unavailable = 0; /* it takes writes */
		return 0;
	}
	if (first_bad < 0) {
		*failed = n - 1;
		goto fail;
	}
	*failed = first_bad;
	if (PQtransactionStatus(conn) != PQTRANS_IDLE)
		PQclear(PQexec(conn, "ROLLBACK"));
	after_failure(db, before, n, ids, e);
	goto fail;
broken:
	if (first_bad < 0)
		*failed = i < n ? i : n - 1;
	else
		*failed = first_bad;
	db->ready = 0; /* reconnect before the next statement */
	/* Every statement was queued, and may have been sent. */
	after_failure(db, before, n, ids, e);
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
