/* inbox.c - consumer-side deduplication on message ids (see inbox.h). */
#include "inbox/inbox.h"

#include <stdlib.h>

#include "core/db.h"

int inbox_setup(PGconn *conn, struct err *e)
{
	PGresult *res = db_exec(conn,
	                        "CREATE TABLE IF NOT EXISTS idemflow_inbox ("
	                        "  handler text NOT NULL,"
	                        "  message_id text NOT NULL,"
	                        "  received_at timestamptz NOT NULL DEFAULT now(),"
	                        "  PRIMARY KEY (handler, message_id))",
	                        0, NULL, e);

	if (res == NULL)
		return -1;
	PQclear(res);
	res = db_exec(conn,
	              "CREATE TABLE IF NOT EXISTS idemflow_inbox_stats ("
	              "  handler text PRIMARY KEY,"
	              "  duplicates bigint NOT NULL DEFAULT 0)",
	              0, NULL, e);
	if (res == NULL)
		return -1;
	PQclear(res);
	return 0;
}

int inbox_claim(PGconn *conn, const char *handler, const char *message_id, struct err *e)
{
	const char *p[2] = { handler, message_id };
	PGresult *res;
	int first;

	/* ON CONFLICT DO NOTHING, not a caught unique violation: that would
	 * abort the caller's transaction. */
	res = db_exec(conn,
	              "INSERT INTO idemflow_inbox (handler, message_id) VALUES ($1, $2)"
	              " ON CONFLICT DO NOTHING RETURNING 1",
	              2, p, e);
	if (res == NULL)
		return -1;
	first = PQntuples(res) == 1;
	PQclear(res);
	if (first)
		return 1;
	res = db_exec(conn,
	              "INSERT INTO idemflow_inbox_stats AS s (handler, duplicates) VALUES ($1, 1)"
	              " ON CONFLICT (handler) DO UPDATE SET duplicates = s.duplicates + 1",
	              1, p, e);
	if (res == NULL)
		return -1;
	PQclear(res);
	return 0;
}

long inbox_duplicates(PGconn *conn, const char *handler, struct err *e)
{
	const char *p[1] = { handler };
	PGresult *res = db_exec(
	    conn,
	    "SELECT coalesce(sum(duplicates), 0) FROM idemflow_inbox_stats WHERE handler = $1", 1,
	    p, e);
	long n;

	if (res == NULL)
		return -1;
	n = atol(PQgetvalue(res, 0, 0));
	PQclear(res);
	return n;
}
