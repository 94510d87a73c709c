/*
 * inbox.c - libidemflow-inbox (see inbox.h, installed as idemflow/inbox.h).
 *
 * Every statement calls a function of sql/consumer/inbox.sql, which setup
 * applies from the copy compiled in (inbox_sql.h): the SQL is the one
 * definition of the inbox, and this file only carries it over libpq.
 * Depends on libpq alone (no part of the service), so that it can be a
 * shared library of its own.
 */
#include "inbox/inbox.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "inbox/inbox_sql.h"

static void inbox_fail(struct idemflow_inbox_err *err, const char *sqlstate, const char *what,
                       const char *detail)
{
	size_t n;

	if (err == NULL)
		return;
	snprintf(err->sqlstate, sizeof(err->sqlstate), "%s", sqlstate ? sqlstate : "");
	if (detail == NULL || *detail == '\0')
		detail = "unknown error";
	snprintf(err->msg, sizeof(err->msg), "%s: %s", what, detail);
	/* libpq's messages end with a newline, and may span lines: one line. */
	n = strlen(err->msg);
	while (n > 0 && (err->msg[n - 1] == '\n' || err->msg[n - 1] == ' '))
		err->msg[--n] = '\0';
	for (char *p = err->msg; *p; p++)
		if (*p == '\n')
			*p = ' ';
}

static void inbox_clear(struct idemflow_inbox_err *err)
{
	if (err != NULL) {
		err->sqlstate[0] = '\0';
		err->msg[0] = '\0';
	}
}

/* Run sql with text parameters; the result (tuples or command) or NULL
 * with err filled. Caller PQclear()s. */
static PGresult *inbox_exec(PGconn *conn, const char *what, const char *sql, int n,
                            const char *const *params, struct idemflow_inbox_err *err)
{
	PGresult *res;
	ExecStatusType st;

	if (conn == NULL) {
		inbox_fail(err, "", what, "no connection");
		return NULL;
	}
	res = n < 0 ? PQexec(conn, sql) : PQexecParams(conn, sql, n, NULL, params, NULL, NULL, 0);
	st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
	if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK)
		return res;
	inbox_fail(err, res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL, what,
	           PQerrorMessage(conn));
	PQclear(res);
	return NULL;
}

static int inbox_args_ok(const char *what, const char *a, const char *b,
                         struct idemflow_inbox_err *err)
{
	if (a == NULL || *a == '\0' || b == NULL || *b == '\0') {
		inbox_fail(err, "", what, "consumer and event id must be non-empty");
		return 0;
	}
	return 1;
}

int idemflow_inbox_setup(PGconn *conn, struct idemflow_inbox_err *err)
{
	PGresult *res;

	inbox_clear(err);
	/* inbox.sql commits: inside the caller's transaction it would commit
	 * the caller's work too. */
	switch (conn ? PQtransactionStatus(conn) : PQTRANS_IDLE) {
	case PQTRANS_IDLE: break;
	case PQTRANS_INTRANS:
	case PQTRANS_INERROR:
		inbox_fail(err, "", "could not set up the inbox",
		           "the connection is inside a transaction (call it outside one)");
		return -1;
	default: inbox_fail(err, "", "could not set up the inbox", PQerrorMessage(conn)); return -1;
	}
	res = inbox_exec(conn, "could not set up the inbox", inbox_sql, -1, NULL, err);
	if (res == NULL) {
		/* A failed statement leaves the script's transaction open. */
		if (PQtransactionStatus(conn) == PQTRANS_INERROR)
			PQclear(PQexec(conn, "ROLLBACK"));
		return -1;
	}
	PQclear(res);
	return 0;
}

int idemflow_inbox_claim(PGconn *conn, const char *consumer, const char *event_id,
                         struct idemflow_inbox_err *err)
{
	const char *p[2] = { consumer, event_id };
	PGresult *res;
	int first;

	inbox_clear(err);
	if (!inbox_args_ok("could not claim the event", consumer, event_id, err))
		return -1;
	switch (conn ? PQtransactionStatus(conn) : PQTRANS_INTRANS) {
	case PQTRANS_INTRANS: break;
	case PQTRANS_INERROR:
		inbox_fail(err, "", "could not claim the event",
		           "the transaction has failed (roll it back)");
		return -1;
	case PQTRANS_IDLE:
		inbox_fail(err, "", "could not claim the event",
		           "no open transaction (BEGIN first: the claim commits with the effect)");
		return -1;
	default: inbox_fail(err, "", "could not claim the event", PQerrorMessage(conn)); return -1;
	}
	res = inbox_exec(conn, "could not claim the event", "SELECT idemflow_inbox_claim($1, $2)\n",
	                 2, p, err);
	if (res == NULL)
		return -1;
	first = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	return first ? 1 : 0;
}

long long idemflow_inbox_duplicates(PGconn *conn, const char *consumer,
                                    struct idemflow_inbox_err *err)
{
	const char *p[1] = { consumer };
	PGresult *res;
	long long n = 0;

	inbox_clear(err);
	if (consumer == NULL || *consumer == '\0') {
		inbox_fail(err, "", "could not read the duplicates", "consumer must be non-empty");
		return -1;
	}
	res = inbox_exec(conn, "could not read the duplicates",
	                 "SELECT d.duplicates\n"
	                 "  FROM idemflow_inbox_duplicates() d\n"
	                 " WHERE d.consumer = $1\n",
	                 1, p, err);
	if (res == NULL)
		return -1;
	if (PQntuples(res) == 1)
		n = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
	PQclear(res);
	return n;
}

char *idemflow_inbox_metrics(PGconn *conn, struct idemflow_inbox_err *err)
{
	PGresult *res;
	char *text;

	inbox_clear(err);
	res = inbox_exec(conn, "could not read the inbox's metrics",
	                 "SELECT idemflow_inbox_metrics()\n", 0, NULL, err);
	if (res == NULL)
		return NULL;
	if (PQntuples(res) != 1 || PQgetisnull(res, 0, 0)) {
		inbox_fail(err, "", "could not read the inbox's metrics", "no row");
		PQclear(res);
		return NULL;
	}
	text = strdup(PQgetvalue(res, 0, 0));
	PQclear(res);
	if (text == NULL)
		inbox_fail(err, "", "could not read the inbox's metrics", strerror(ENOMEM));
	return text;
}

int idemflow_inbox_write_textfile(PGconn *conn, const char *path, struct idemflow_inbox_err *err)
{
	char *text = NULL, *tmp = NULL;
	FILE *f = NULL;
	size_t len;
	int rc = -1;

	inbox_clear(err);
	if (path == NULL || *path == '\0') {
		inbox_fail(err, "", "could not write the textfile", "no path");
		return -1;
	}
	text = idemflow_inbox_metrics(conn, err);
	if (text == NULL)
		goto out;
	len = strlen(path) + sizeof(".tmp");
	tmp = malloc(len);
	if (tmp == NULL) {
		inbox_fail(err, "", "could not write the textfile", strerror(ENOMEM));
		goto out;
	}
	snprintf(tmp, len, "%s.tmp", path);
	f = fopen(tmp, "w");
	if (f == NULL) {
		inbox_fail(err, "", tmp, strerror(errno));
		goto out;
	}
	if (fputs(text, f) == EOF || fflush(f) != 0 || ferror(f)) {
		inbox_fail(err, "", tmp, strerror(errno));
		goto out;
	}
	if (fclose(f) != 0) {
		f = NULL;
		inbox_fail(err, "", tmp, strerror(errno));
		goto out;
	}
	f = NULL;
	if (rename(tmp, path) != 0) {
		inbox_fail(err, "", path, strerror(errno));
		goto out;
	}
	rc = 0;
out:
	if (f != NULL)
		fclose(f);
	if (rc != 0 && tmp != NULL)
		unlink(tmp);
	free(tmp);
	free(text);
	return rc;
}
