/*
 * debug.c - "idemflow debug idempotency-check": which of a tenant's
 * recent idempotency keys were replayed, conflicted or are still in
 * flight, most replayed first, as a table or as JSON. It only reads:
 * the counts are kept by the server (idempotency_key_stats) as it
 * answers, and pruned with their keys (prune.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

#include <json-c/json.h>

#include "cli/cli.h"
#include "core/db.h"

#define TS_SECONDS(col) "to_char((" col ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"

/* The columns of the check: the key's first and last sight, and the
 * window's start, in UTC to the second. */
#define CHECK_FIRST_SEEN TS_SECONDS("k.created_at")
#define CHECK_LAST_SEEN  TS_SECONDS("s.last_seen")
#define CHECK_SINCE      TS_SECONDS("now() - $2::float8 * interval '1 hour'")

/* The keys of tenant $1 first seen in the last $2 hours, with their counts. */
#define CHECK_FROM                                                                                 \
	"  FROM idempotency_keys k\n"                                                              \
	"  LEFT JOIN idempotency_key_stats s ON s.tenant_id = k.tenant_id AND s.key = k.key\n"     \
	" WHERE k.tenant_id = $1::bigint\n"                                                        \
	"   AND k.created_at >= now() - $2::float8 * interval '1 hour'\n"

/* rows: key, method, route, first_seen, replays, conflicts, in_flight,
 * last_seen. sum: keys, replays, conflicts, in_flight, since. Both
 * borrowed. */
static void print_check_json(const char *tenant, double hours, const PGresult *rows,
                             const PGresult *sum)
{
	struct json_object *doc = json_object_new_object(), *keys = json_object_new_array();
	struct json_object *summary = json_object_new_object();
	long nkeys = atol(PQgetvalue(sum, 0, 0)), replays = atol(PQgetvalue(sum, 0, 1));
	char ratio[32];

	/* json_object_object_add and json_object_array_add take ownership:
	 * doc owns everything, and json_object_put(doc) frees it all. */
	json_object_object_add(doc, "tenant", json_object_new_string(tenant));
	json_object_object_add(doc, "hours", json_object_new_double(hours));
	json_object_object_add(doc, "since", json_object_new_string(PQgetvalue(sum, 0, 4)));
	for (int i = 0; i < PQntuples(rows); i++) {
		struct json_object *k = json_object_new_object();

		json_object_object_add(k, "key", json_object_new_string(PQgetvalue(rows, i, 0)));
		json_object_object_add(k, "method", json_object_new_string(PQgetvalue(rows, i, 1)));
		json_object_object_add(k, "route", json_object_new_string(PQgetvalue(rows, i, 2)));
		json_object_object_add(k, "first_seen",
		                       json_object_new_string(PQgetvalue(rows, i, 3)));
		json_object_object_add(k, "replays",
		                       json_object_new_int64(atoll(PQgetvalue(rows, i, 4))));
		json_object_object_add(k, "conflicts",
		                       json_object_new_int64(atoll(PQgetvalue(rows, i, 5))));
		json_object_object_add(k, "in_flight",
		                       json_object_new_int64(atoll(PQgetvalue(rows, i, 6))));
		json_object_object_add(k, "last_seen",
		                       PQgetisnull(rows, i, 7)
		                           ? NULL
		                           : json_object_new_string(PQgetvalue(rows, i, 7)));
		json_object_array_add(keys, k);
	}
	json_object_object_add(doc, "keys", keys);
	json_object_object_add(summary, "keys", json_object_new_int64(nkeys));
	json_object_object_add(summary, "listed", json_object_new_int(PQntuples(rows)));
	json_object_object_add(summary, "replays", json_object_new_int64(replays));
	json_object_object_add(summary, "conflicts",
	                       json_object_new_int64(atoll(PQgetvalue(sum, 0, 2))));
	json_object_object_add(summary, "in_flight",
	                       json_object_new_int64(atoll(PQgetvalue(sum, 0, 3))));
	/* Three decimals, written as such (not as the nearest double's digits). */
	snprintf(ratio, sizeof(ratio), "%.3f", nkeys > 0 ? (double)replays / (double)nkeys : 0.0);
	json_object_object_add(summary, "replay_ratio",
	                       json_object_new_double_s(atof(ratio), ratio));
	json_object_object_add(doc, "summary", summary);
	printf("%s\n", json_object_to_json_string_ext(doc, JSON_C_TO_STRING_PLAIN |
	                                                       JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(doc);
}

/* The same as a table and a summary line. */
static void print_check_text(const PGresult *rows, const PGresult *sum)
{
	long nkeys = atol(PQgetvalue(sum, 0, 0)), replays = atol(PQgetvalue(sum, 0, 1));

	printf("key\troute\tfirst_seen\treplays\tconflicts\tin_flight\n");
	for (int i = 0; i < PQntuples(rows); i++)
		printf("%s\t%s %s\t%s\t%s\t%s\t%s\n", PQgetvalue(rows, i, 0),
		       PQgetvalue(rows, i, 1), PQgetvalue(rows, i, 2), PQgetvalue(rows, i, 3),
		       PQgetvalue(rows, i, 4), PQgetvalue(rows, i, 5), PQgetvalue(rows, i, 6));
	printf("summary: keys=%ld listed=%d replays=%ld conflicts=%s in_flight=%s "
	       "replay_ratio=%.3f since=%s\n",
	       nkeys, PQntuples(rows), replays, PQgetvalue(sum, 0, 2), PQgetvalue(sum, 0, 3),
	       nkeys > 0 ? (double)replays / (double)nkeys : 0.0, PQgetvalue(sum, 0, 4));
}

/* idempotency-check --tenant NAME [--hours H] [--limit N] [--json]; argv
 * starts after "idempotency-check". */
static int idempotency_check(PGconn *conn, int argc, char **argv)
{
	const char *tenant = NULL, *hours = "24", *limit = "100";
	PGresult *res = NULL, *rows = NULL, *sum = NULL;
	char tenant_id[24], hours_num[32], *end;
	struct err e;
	double h;
	long lim;
	int json = 0, rc = EX_OK;

	for (int i = 0; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			json = 1;
		else if (strcmp(argv[i], "--tenant") == 0 && i + 1 < argc)
			tenant = argv[++i];
		else if (strcmp(argv[i], "--hours") == 0 && i + 1 < argc)
			hours = argv[++i];
		else if (strcmp(argv[i], "--limit") == 0 && i + 1 < argc)
			limit = argv[++i];
		else
			return cli_usage_error();
	}
	if (tenant == NULL)
		return cli_usage_error();
	h = strtod(hours, &end);
	if (end == hours || *end != '\0' || !(h > 0 && h <= 24 * 366)) {
		fprintf(stderr, "idemflow: invalid --hours \"%s\": expected a number of hours\n",
		        hours);
		return EX_USAGE;
	}
	lim = strtol(limit, &end, 10);
	if (end == limit || *end != '\0' || lim < 1 || lim > 1000000) {
		fprintf(stderr, "idemflow: invalid --limit \"%s\": expected a positive integer\n",
		        limit);
		return EX_USAGE;
	}

	const char *pt[1] = { tenant };
	res = db_exec(conn,
	              "SELECT id\n"
	              "  FROM tenants\n"
	              " WHERE name = $1\n",
	              1, pt, &e);
	if (res == NULL) {
		rc = cli_db_fail(&e);
		goto out;
	}
	if (PQntuples(res) == 0) {
		fprintf(stderr, "idemflow: no tenant named \"%s\"\n", tenant);
		rc = EX_DATAERR;
		goto out;
	}
	snprintf(tenant_id, sizeof(tenant_id), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	res = NULL;

	/* The list and the summary read one snapshot, so they agree. The
	 * hours go as the number strtod read ("0x10" is not SQL). */
	snprintf(hours_num, sizeof(hours_num), "%.17g", h);
	const char *p[3] = { tenant_id, hours_num, limit };
	res = db_exec(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL, &e);
	if (res == NULL) {
		rc = cli_db_fail(&e);
		goto out;
	}
	/* One clause a line: the formatter would pack the macros onto them. */
	/* clang-format off */
	rows = db_exec(conn,
	               "SELECT k.key, k.method, k.path, " CHECK_FIRST_SEEN ",\n"
	               "       coalesce(s.replays, 0) AS replays,\n"
	               "       coalesce(s.conflicts, 0) AS conflicts,\n"
	               "       coalesce(s.in_flight, 0) AS in_flight, " CHECK_LAST_SEEN "\n"
	               CHECK_FROM
	               " ORDER BY replays DESC, conflicts DESC, in_flight DESC,\n"
	               "          k.created_at, k.key\n"
	               " LIMIT $3::bigint\n",
	               3, p, &e);
	if (rows != NULL)
		sum = db_exec(conn,
		              "SELECT count(*), coalesce(sum(s.replays), 0),\n"
		              "       coalesce(sum(s.conflicts), 0), coalesce(sum(s.in_flight), 0),\n"
		              "       " CHECK_SINCE "\n"
		              CHECK_FROM,
		              2, p, &e);
	/* clang-format on */
	PQclear(PQexec(conn, "COMMIT"));
	if (rows == NULL || sum == NULL) {
		rc = cli_db_fail(&e);
		goto out;
	}
	if (json)
		print_check_json(tenant, h, rows, sum);
	else
		print_check_text(rows, sum);
out:
	PQclear(res);
	PQclear(rows);
	PQclear(sum);
	return rc;
}

int cli_debug(PGconn *conn, struct conf *c, int argc, char **argv)
{
	if (argc < 1 || strcmp(argv[0], "idempotency-check") != 0)
		return cli_usage_error();
	return idempotency_check(conn, argc - 1, argv + 1);
}
