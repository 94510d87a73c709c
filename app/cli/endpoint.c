/*
 * endpoint.c - "idemflow endpoint" and "idemflow event": a tenant's
 * endpoints as the operator sees them (list, show), with their health and
 * pending deliveries, never a secret; and their dead and skipped
 * deliveries, or one event's delivery to one endpoint, pending again
 * (endpoint recover, event resend), as POST /v1/endpoints/{id}/recover and
 * POST /v1/events/{id}/resend do (the same database functions,
 * sql/022_recover.sql). Changing endpoints is the API's (/v1/endpoints,
 * app/server/endpoints.c); sending is the dispatcher's.
 *
 * Unlike the API, the CLI has no Idempotency-Key: running a recover twice
 * sends the recovered deliveries that died again once more.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include "cli/cli.h"
#include "core/db.h"

/* The most --type options, as an endpoint's filter_types. */
#define ENDPOINT_TYPES_MAX 64

/* One endpoint's line: id, url, ordering, state (enabled, or disabled and
 * why), filter (* for every type), failures in a row, pending deliveries. */
#define ENDPOINT_LINE                                                                              \
	"SELECT e.id, e.url, e.ordering,\n"                                                        \
	"       CASE WHEN e.disabled THEN 'disabled:' || e.disabled_reason\n"                      \
	"            ELSE 'enabled' END,\n"                                                        \
	"       coalesce(array_to_string(e.filter_types, ','), '*'), e.failures,\n"                \
	"       (SELECT count(*) FROM deliveries d\n"                                              \
	"         WHERE d.tenant_id = e.tenant_id AND d.endpoint_id = e.id\n"                      \
	"           AND d.state = 'pending')"

/* 0 when the tenant exists; else prints why and returns the exit code. */
static int tenant_known(PGconn *conn, const char *tenant)
{
	const char *p[1] = { tenant };
	PGresult *res;
	struct err e;
	int n;

	res = db_exec(conn, "SELECT 1 FROM tenants WHERE name = $1\n", 1, p, &e);
	if (res == NULL)
		return cli_db_fail(&e);
	n = PQntuples(res);
	PQclear(res);
	if (n == 0) {
		fprintf(stderr, "idemflow: no tenant \"%s\"\n", tenant);
		return EX_DATAERR;
	}
	return 0;
}

/* endpoint list TENANT: one line each, in id (creation) order. */
static int endpoint_list(PGconn *conn, const char *tenant)
{
	const char *p[1] = { tenant };
	PGresult *res;
	struct err e;
	int rc = tenant_known(conn, tenant);

	if (rc != 0)
		return rc;
	res = db_exec(conn,
	              ENDPOINT_LINE "\n"
	                            "  FROM endpoints e\n"
	                            "  JOIN tenants t ON t.id = e.tenant_id\n"
	                            " WHERE t.name = $1\n"
	                            " ORDER BY e.id\n",
	              1, p, &e);
	if (res == NULL)
		return cli_db_fail(&e);
	cli_print_rows(res);
	PQclear(res);
	return EX_OK;
}

/* endpoint show TENANT ID: every field but the secrets, one a line. */
static int endpoint_show(PGconn *conn, const char *tenant, const char *id)
{
	const char *p[2] = { tenant, id };
	PGresult *res;
	struct err e;
	int rc = tenant_known(conn, tenant);

	if (rc != 0)
		return rc;
	res =
	    db_exec(conn,
	            "SELECT e.id, e.url, e.ordering, e.disabled, e.disabled_reason,\n"
	            "       e.disabled_at, coalesce(array_to_string(e.filter_types, ','), '*')\n"
	            "           AS filter_types,\n"
	            "       e.metadata, e.failures, e.failing_since,\n"
	            "       e.previous_secret_until AS previous_secret_until,\n"
	            "       (SELECT count(*) FROM deliveries d\n"
	            "         WHERE d.tenant_id = e.tenant_id AND d.endpoint_id = e.id\n"
	            "           AND d.state = 'pending') AS pending,\n"
	            "       (SELECT count(*) FROM deliveries d\n"
	            "         WHERE d.tenant_id = e.tenant_id AND d.endpoint_id = e.id\n"
	            "           AND d.state = 'dead') AS dead,\n"
	            "       e.created_at, e.updated_at, e.actor\n"
	            "  FROM endpoints e\n"
	            "  JOIN tenants t ON t.id = e.tenant_id\n"
	            " WHERE t.name = $1\n"
	            "   AND e.id = CASE WHEN $2 ~* '^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$'\n"
	            "                   THEN $2::uuid END\n",
	            2, p, &e);
	if (res == NULL)
		return cli_db_fail(&e);
	if (PQntuples(res) == 0) {
		fprintf(stderr, "idemflow: tenant \"%s\" has no endpoint \"%s\"\n", tenant, id);
		rc = EX_DATAERR;
	}
	for (int i = 0; i < PQntuples(res); i++)
		for (int f = 0; f < PQnfields(res); f++)
			printf("%-22s %s\n", PQfname(res, f),
			       PQgetisnull(res, i, f) ? "-" : PQgetvalue(res, i, f));
	PQclear(res);
	return rc;
}

/* Append s to the array literal in *buf (malloc'ed, *len bytes, *cap
 * allocated; "{" begins it) as one quoted element; the caller closes it
 * with "}". Returns 0, or -1 out of memory. */
static int array_add(char **buf, size_t *len, size_t *cap, const char *s)
{
	size_t need = *len + 2 * strlen(s) + 4;

	if (need > *cap) {
		char *n = realloc(*buf, need * 2);
		if (n == NULL)
			return -1;
		*buf = n;
		*cap = need * 2;
	}
	(*buf)[*len] = *len == 0 ? '{' : ',';
	(*len)++;
	(*buf)[(*len)++] = '"';
	for (; *s != '\0'; s++) {
		if (*s == '"' || *s == '\\')
			(*buf)[(*len)++] = '\\';
		(*buf)[(*len)++] = *s;
	}
	(*buf)[(*len)++] = '"';
	(*buf)[*len] = '\0';
	return 0;
}

/* The database's refusal of an argument (a time, a uuid) is a usage error. */
static int arg_fail(const struct err *e)
{
	if (strcmp(e->sqlstate, "22P02") == 0 || strcmp(e->sqlstate, "22007") == 0 ||
	    strcmp(e->sqlstate, "22008") == 0) {
		fprintf(stderr, "idemflow: %s\n", e->msg);
		return EX_USAGE;
	}
	return cli_db_fail(e);
}

/* A function's (problem, detail) row: 0 when it is no problem, else the
 * detail on stderr and EX_DATAERR. */
static int refused(const PGresult *res)
{
	if (PQgetisnull(res, 0, 0))
		return 0;
	fprintf(stderr, "idemflow: %s (%s)\n", PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 0));
	return EX_DATAERR;
}

/*
 * endpoint recover --tenant NAME ID --since TIME [--until TIME]
 * [--type T]... [--state dead|skipped]...: the number set pending on
 * stdout.
 */
static int endpoint_recover(PGconn *conn, int argc, char **argv)
{
	const char *tenant = NULL, *id = NULL, *since = NULL, *until = NULL;
	char *types = NULL, *states = NULL;
	size_t tlen = 0, tcap = 0, slen = 0, scap = 0;
	int ntypes = 0, rc = EX_USAGE;
	PGresult *res = NULL;
	struct err e;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--tenant") == 0 && v != NULL)
			tenant = v, i++;
		else if (strcmp(a, "--since") == 0 && v != NULL)
			since = v, i++;
		else if (strcmp(a, "--until") == 0 && v != NULL)
			until = v, i++;
		else if (strcmp(a, "--type") == 0 && v != NULL && ++ntypes <= ENDPOINT_TYPES_MAX) {
			if (array_add(&types, &tlen, &tcap, v) < 0)
				goto oom;
			i++;
		} else if (strcmp(a, "--state") == 0 && v != NULL &&
		           (strcmp(v, "dead") == 0 || strcmp(v, "skipped") == 0)) {
			if (array_add(&states, &slen, &scap, v) < 0)
				goto oom;
			i++;
		} else if (a[0] != '-' && id == NULL)
			id = a;
		else
			goto usage;
	}
	if (tenant == NULL || id == NULL || since == NULL)
		goto usage;
	if (types != NULL)
		strcat(types, "}");
	if (states != NULL)
		strcat(states, "}");
	const char *p[6] = { tenant, id, since, until, types, states };
	res = db_exec(
	    conn,
	    "SELECT r.problem, r.detail, r.recovered\n"
	    "  FROM tenants t,\n"
	    "       LATERAL idemflow_endpoint_recover(\n"
	    "           t.id, $2::uuid, $3::timestamptz, coalesce($4::timestamptz, now()),\n"
	    "           $5::text[], coalesce($6::text[], '{dead,skipped}')) r\n"
	    " WHERE t.name = $1\n",
	    6, p, &e);
	if (res == NULL) {
		rc = arg_fail(&e);
		goto out;
	}
	if (PQntuples(res) == 0) {
		fprintf(stderr, "idemflow: no tenant named \"%s\"\n", tenant);
		rc = EX_DATAERR;
		goto out;
	}
	rc = refused(res);
	if (rc == 0)
		printf("%s\n", PQgetvalue(res, 0, 2));
	goto out;
oom:
	fprintf(stderr, "idemflow: out of memory\n");
	rc = EX_OSERR;
	goto out;
usage:
	rc = cli_usage_error();
out:
	PQclear(res);
	free(types);
	free(states);
	return rc;
}

int cli_endpoint(PGconn *conn, struct conf *c, int argc, char **argv)
{
	(void)c;
	if (argc == 2 && strcmp(argv[0], "list") == 0)
		return endpoint_list(conn, argv[1]);
	if (argc == 3 && strcmp(argv[0], "show") == 0)
		return endpoint_show(conn, argv[1], argv[2]);
	if (argc >= 1 && strcmp(argv[0], "recover") == 0)
		return endpoint_recover(conn, argc, argv);
	return cli_usage_error();
}

/* event resend --tenant NAME EVENT_ID --endpoint ID: the delivery, pending
 * again, on stdout (endpoint, event, state, attempts, next attempt). */
static int event_resend(PGconn *conn, int argc, char **argv)
{
	const char *tenant = NULL, *id = NULL, *endpoint = NULL;
	PGresult *res;
	struct err e;
	int rc;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--tenant") == 0 && v != NULL)
			tenant = v, i++;
		else if (strcmp(a, "--endpoint") == 0 && v != NULL)
			endpoint = v, i++;
		else if (a[0] != '-' && id == NULL)
			id = a;
		else
			return cli_usage_error();
	}
	if (tenant == NULL || id == NULL || endpoint == NULL)
		return cli_usage_error();
	const char *p[3] = { tenant, id, endpoint };
	res =
	    db_exec(conn,
	            "SELECT r.problem, r.detail, r.endpoint_id, r.event_id, r.state, r.attempts,\n"
	            "       to_char(r.next_attempt_at AT TIME ZONE 'UTC',\n"
	            "               'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')\n"
	            "  FROM tenants t,\n"
	            "       LATERAL idemflow_event_resend(t.id, $2, $3::uuid) r\n"
	            " WHERE t.name = $1\n",
	            3, p, &e);
	if (res == NULL)
		return arg_fail(&e);
	if (PQntuples(res) == 0) {
		fprintf(stderr, "idemflow: no tenant named \"%s\"\n", tenant);
		PQclear(res);
		return EX_DATAERR;
	}
	rc = refused(res);
	if (rc == 0)
		printf("%s\t%s\t%s\t%s\t%s\n", PQgetvalue(res, 0, 2), PQgetvalue(res, 0, 3),
		       PQgetvalue(res, 0, 4), PQgetvalue(res, 0, 5), PQgetvalue(res, 0, 6));
	PQclear(res);
	return rc;
}

int cli_event(PGconn *conn, struct conf *c, int argc, char **argv)
{
	if (argc >= 1 && strcmp(argv[0], "resend") == 0)
		return event_resend(conn, argc, argv);
	return cli_usage_error();
}
