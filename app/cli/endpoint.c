/*
 * endpoint.c - "idemflow endpoint": a tenant's endpoints as the operator
 * sees them (list, show), with their health and pending deliveries.
 * Changing them is the API's (/v1/endpoints, app/server/endpoints.c);
 * delivering is the dispatcher's. Never prints a secret.
 */
#include <stdio.h>
#include <string.h>
#include <sysexits.h>

#include "cli/cli.h"
#include "core/db.h"

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

int cli_endpoint(PGconn *conn, struct conf *c, int argc, char **argv)
{
	(void)c;
	if (argc == 2 && strcmp(argv[0], "list") == 0)
		return endpoint_list(conn, argv[1]);
	if (argc == 3 && strcmp(argv[0], "show") == 0)
		return endpoint_show(conn, argv[1], argv[2]);
	return cli_usage_error();
}
